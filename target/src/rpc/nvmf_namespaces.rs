//! Namespaces: `nvmf_subsystem_add_ns` (with its identifiers given in hex or UUID form) and
//! `nvmf_subsystem_remove_ns`.

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nvmf::{refuse_if, true_};
use super::{check_tgt_name, einval, parse, Control};
use crate::bdev::util;
use crate::target::NamespaceOptions;

fn parse_hex<const N: usize>(field: &str, s: &str) -> Result<[u8; N], RpcError> {
    let bad = || {
        einval(format!(
            "{field}: {s:?} is not {} hexadecimal digits",
            N * 2
        ))
    };
    if s.len() != N * 2 || !s.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceParams {
    pub bdev_name: String,
    #[serde(default)]
    pub nsid: u32,
    #[serde(default)]
    pub nguid: Option<String>,
    #[serde(default)]
    pub eui64: Option<String>,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub ptpl_file: Option<String>,
    #[serde(default)]
    pub anagrpid: u32,
    #[serde(default)]
    pub no_auto_visible: bool,
    #[serde(default)]
    pub hide_metadata: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddNsParams {
    pub nqn: String,
    pub namespace: NamespaceParams,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

/// Answers the NSID, as SPDK does.
pub fn nvmf_subsystem_add_ns(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: AddNsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let ns = p.namespace;
    refuse_if(
        ns.ptpl_file.as_deref() == Some(""),
        "namespace.ptpl_file",
        "an empty path",
    )?;
    refuse_if(
        ns.hide_metadata,
        "namespace.hide_metadata",
        "bdev metadata is not supported",
    )?;
    let nguid = ns
        .nguid
        .as_deref()
        .map(|s| parse_hex::<16>("namespace.nguid", s))
        .transpose()?;
    let eui64 = ns
        .eui64
        .as_deref()
        .map(|s| parse_hex::<8>("namespace.eui64", s))
        .transpose()?;
    let uuid = ns
        .uuid
        .as_deref()
        .map(|s| {
            util::parse_uuid(s)
                .ok_or_else(|| einval(format!("namespace.uuid: {s:?} is not a UUID")))
        })
        .transpose()?;
    let nsid = c.target.add_namespace(
        &p.nqn,
        NamespaceOptions {
            bdev_name: ns.bdev_name,
            nsid: Some(ns.nsid),
            nguid,
            uuid,
            eui64,
            no_auto_visible: ns.no_auto_visible,
            anagrpid: Some(ns.anagrpid),
            ptpl_file: ns.ptpl_file.map(std::path::PathBuf::from),
        },
    )?;
    Ok(json!(nsid))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveNsParams {
    pub nqn: String,
    pub nsid: u32,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_subsystem_remove_ns(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: RemoveNsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target.remove_namespace(&p.nqn, p.nsid)?;
    Ok(true_())
}

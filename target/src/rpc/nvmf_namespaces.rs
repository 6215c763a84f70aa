//! Namespaces: `nvmf_subsystem_add_ns` (with its identifiers given in hex or UUID form) and
//! `nvmf_subsystem_remove_ns`.

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nvmf::{refuse_if, true_};
use super::{check_tgt_name, einval, parse, stats, Control};
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
    take_back_if_a_channel_failed(c, &p.nqn, nsid)?;
    Ok(json!(nsid))
}

/// Each reactor opens its own channel to the new namespace's bdev. One that failed (an AIO
/// context or ring refused there) would leave the namespace failing every I/O of the hosts
/// on that reactor: as SPDK fails the RPC when a poll group cannot get its channel, the
/// namespace is removed again and the call fails with the reactor's reason. A reactor that
/// does not answer in time cannot be told apart from a slow one: the namespace stays.
fn take_back_if_a_channel_failed(c: &mut Control, nqn: &str, nsid: u32) -> Result<(), RpcError> {
    let id = c.target.subsystem(nqn)?.id;
    let answers = match stats::ask_groups(c, move |pg| pg.core.namespace_open_error(id, nsid)) {
        Ok(answers) => answers,
        Err(e) => {
            tracing::warn!(
                nqn,
                nsid,
                "cannot confirm the namespace's channels: {}",
                e.message
            );
            return Ok(());
        }
    };
    let Some((group, (errno, reason))) = answers
        .into_iter()
        .enumerate()
        .find_map(|(group, a)| Some((group, a?)))
    else {
        return Ok(());
    };
    c.target.remove_namespace(nqn, nsid)?;
    Err(RpcError::errno(
        errno,
        format!("namespace {nsid}: poll group {group} cannot open its bdev channel: {reason}"),
    ))
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

//! Namespace masking (`nvmf_ns_add_host`, `nvmf_ns_remove_host`; SPDK's `nvmf_rpc.c` and
//! `nvmf_ns_visible` in `subsystem.c`).
//!
//! A namespace added with `no_auto_visible` is visible to no host until one is named here;
//! to every other host it is an inactive NSID (absent from the active list, a zeroed Identify
//! Namespace, Invalid Namespace or Format for I/O). Changes reach live controllers: each
//! controller whose view changed gets the NSID in its Changed Namespace List and a Namespace
//! Attribute Changed notice.
//!
//! Errors as SPDK answers them: an unknown subsystem is `-32602` "Subsystem with NQN '..' not
//! found"; an invalid host NQN, an NSID with no namespace, or a namespace visible to every
//! host (no per-host control) are `-32602` (SPDK says only "Invalid parameters"; the message
//! here names the reason). Adding a host twice, or removing one that does not see the
//! namespace, succeeds and changes nothing.

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::Value;

use super::{check_tgt_name, parse, Control};
use crate::target::TargetError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NsHostParams {
    pub nqn: String,
    pub nsid: u32,
    pub host: String,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

fn to_rpc(e: TargetError, nqn: &str, what: &str) -> RpcError {
    match e {
        TargetError::NoSubsystem(_) => {
            RpcError::invalid_params(format!("Subsystem with NQN '{nqn}' not found"))
        }
        e => RpcError::invalid_params(format!("Invalid parameters: {what}: {e}")),
    }
}

pub fn nvmf_ns_add_host(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: NsHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target.ns_add_host(&p.nqn, p.nsid, &p.host).map_err(|e| {
        let what = format!("unable to add {} to namespace ID {}", p.host, p.nsid);
        to_rpc(e, &p.nqn, &what)
    })?;
    Ok(Value::Bool(true))
}

pub fn nvmf_ns_remove_host(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: NsHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target
        .ns_remove_host(&p.nqn, p.nsid, &p.host)
        .map_err(|e| {
            let what = format!("unable to remove {} from namespace ID {}", p.host, p.nsid);
            to_rpc(e, &p.nqn, &what)
        })?;
    Ok(Value::Bool(true))
}

//! A subsystem's allowed hosts: `nvmf_subsystem_add_host`, `nvmf_subsystem_remove_host`
//! and `nvmf_subsystem_allow_any_host` (per-namespace masking is in `nvmf_ns_hosts`).

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::Value;

use super::nvmf::{refuse_if, true_};
use super::{check_tgt_name, parse, Control};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddHostParams {
    pub nqn: String,
    pub host: String,
    #[serde(default)]
    pub tgt_name: Option<String>,
    #[serde(default)]
    pub psk: Option<String>,
    #[serde(default)]
    pub dhchap_key: Option<String>,
    #[serde(default)]
    pub dhchap_ctrlr_key: Option<String>,
}

pub fn nvmf_subsystem_add_host(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: AddHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    refuse_if(
        p.psk.is_some(),
        "psk",
        "TLS pre-shared keys are not supported",
    )?;
    refuse_if(
        p.dhchap_key.is_some(),
        "dhchap_key",
        "DH-HMAC-CHAP authentication is not supported",
    )?;
    refuse_if(
        p.dhchap_ctrlr_key.is_some(),
        "dhchap_ctrlr_key",
        "DH-HMAC-CHAP authentication is not supported",
    )?;
    c.target.add_host(&p.nqn, &p.host)?;
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveHostParams {
    pub nqn: String,
    pub host: String,
    #[serde(default)]
    pub tgt_name: Option<String>,
    /// How long SPDK waits for the host's queues to disconnect; here they are failed at once.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Removes the host and disconnects its controllers, as SPDK does.
pub fn nvmf_subsystem_remove_host(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: RemoveHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let _ = p.timeout_ms;
    c.target.remove_host(&p.nqn, &p.host)?;
    let sub = c.target.subsystem(&p.nqn)?;
    for ctrl in sub.shared.controllers() {
        if ctrl.hostnqn == p.host {
            ctrl.fail();
        }
    }
    Ok(true_())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowAnyHostParams {
    pub nqn: String,
    pub allow_any_host: bool,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_subsystem_allow_any_host(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: AllowAnyHostParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target.allow_any_host(&p.nqn, p.allow_any_host)?;
    Ok(true_())
}

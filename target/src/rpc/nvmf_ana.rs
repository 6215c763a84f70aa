//! Asymmetric Namespace Access (`nvmf_subsystem_listener_set_ana_state`,
//! `nvmf_subsystem_set_ns_ana_group`; SPDK's `nvmf_rpc.c` and `spdk_nvmf_subsystem_set_ana_state`
//! in `subsystem.c`), and the ANA parts of the listener and namespace dumps and of the saved
//! config.
//!
//! States are named as SPDK names them (`optimized`, `non_optimized`, `inaccessible`, and, where
//! SPDK's decoder stops, `persistent_loss` and `change`, its own spelling in
//! `nvme_ana_state_str`). Errors: an unknown subsystem is `-32602` "Subsystem with NQN '..' not
//! found"; a subsystem without ANA reporting, an unknown listener or namespace, an ANA group
//! outside 1..=ANAGRPMAX are `-32602` naming the reason (SPDK says "Invalid parameters" or
//! "error setting ANA state: -22").

use nvmf_common::spec::log_page::AnaState;
use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nvmf::{address_json, ListenAddressParams};
use super::{check_tgt_name, parse, Control};
use crate::core::ana::{self, ListenerAna};
use crate::core::subsystem::{ListenAddress, SubsystemConfig};
use crate::target::TargetError;

/// Parses an `ana_state` parameter, naming the field when the value is not a state.
pub fn parse_state(field: &str, name: &str) -> Result<AnaState, RpcError> {
    ana::parse_state(name).ok_or_else(|| {
        let names: Vec<_> = ana::STATE_NAMES.iter().map(|(_, n)| *n).collect();
        RpcError::invalid_params(format!(
            "{field}: {name:?} is not an ANA state ({})",
            names.join(", ")
        ))
    })
}

fn to_rpc(e: TargetError, nqn: &str, what: &str) -> RpcError {
    match e {
        TargetError::NoSubsystem(_) => {
            RpcError::invalid_params(format!("Subsystem with NQN '{nqn}' not found"))
        }
        e => RpcError::invalid_params(format!("Invalid parameters: {what}: {e}")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetAnaStateParams {
    pub nqn: String,
    pub listen_address: ListenAddressParams,
    pub ana_state: String,
    /// Every group when absent (or 0, SPDK's "not given").
    #[serde(default)]
    pub anagrpid: Option<u32>,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_subsystem_listener_set_ana_state(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: SetAnaStateParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let state = parse_state("ana_state", &p.ana_state)?;
    let addr = p.listen_address.to_address()?;
    let grpid = p.anagrpid.filter(|&g| g != 0);
    c.target
        .set_ana_state(&p.nqn, &addr, state, grpid)
        .map_err(|e| to_rpc(e, &p.nqn, "unable to set the ANA state"))?;
    Ok(Value::Bool(true))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetNsAnaGroupParams {
    pub nqn: String,
    pub nsid: u32,
    pub anagrpid: u32,
    #[serde(default)]
    pub tgt_name: Option<String>,
}

pub fn nvmf_subsystem_set_ns_ana_group(
    c: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let p: SetNsAnaGroupParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    c.target
        .set_ns_ana_group(&p.nqn, p.nsid, p.anagrpid)
        .map_err(|e| {
            let what = format!("unable to change the ANA group of namespace ID {}", p.nsid);
            to_rpc(e, &p.nqn, &what)
        })?;
    Ok(Value::Bool(true))
}

/// Groups `nvmf_subsystem_get_listeners` lists one by one, whether in use or not; past it
/// only the groups in use are listed.
const LISTED_GROUPS: u32 = 1024;

/// SPDK's `ana_states` of a listener in `nvmf_subsystem_get_listeners`: one entry per possible
/// group, 1..=ANAGRPMAX. ANAGRPMAX follows `max_namespaces` and the highest NSID, which can
/// be billions: past [`LISTED_GROUPS`], only the groups a namespace uses or the listener
/// sets a state for are listed, so the answer stays the size of the configuration.
pub fn listener_states_json(s: &SubsystemConfig, addr: &ListenAddress) -> Value {
    let max = s.ana_group_max();
    let mut groups: std::collections::BTreeSet<u32> = (1..=max.min(LISTED_GROUPS)).collect();
    if max > LISTED_GROUPS {
        groups.extend(s.namespaces.keys().map(|&nsid| s.anagrpid(nsid)));
        if let Some(states) = s.ana.listeners.get(addr) {
            groups.extend(states.exceptions().map(|(g, _)| g));
        }
    }
    Value::Array(
        groups
            .into_iter()
            .map(|g| {
                json!({
                    "ana_group": g,
                    "ana_state": ana::state_name(s.ana_state(Some(addr), g)),
                })
            })
            .collect(),
    )
}

/// Saved-config entries that restore a listener's group states past its default (which its
/// `nvmf_subsystem_add_listener` entry carries as `ana_state`); they follow the namespaces, so
/// every group id they name is in range again.
pub fn listener_state_entries(s: &SubsystemConfig) -> Vec<Value> {
    let mut out = Vec::new();
    if !s.ana_reporting {
        return out;
    }
    for (addr, states) in &s.ana.listeners {
        for (grpid, state) in states.exceptions() {
            out.push(json!({
                "method": "nvmf_subsystem_listener_set_ana_state",
                "params": {
                    "nqn": s.nqn,
                    "listen_address": address_json(addr),
                    "ana_state": ana::state_name(state),
                    "anagrpid": grpid,
                },
            }));
        }
    }
    out
}

/// The `ana_state` a listener's saved `nvmf_subsystem_add_listener` entry carries, if it is not
/// SPDK's default (optimized).
pub fn listener_default_state(s: &SubsystemConfig, addr: &ListenAddress) -> Option<&'static str> {
    let state = s
        .ana
        .listeners
        .get(addr)
        .map_or(AnaState::OPTIMIZED, ListenerAna::default_state);
    (s.ana_reporting && state != AnaState::OPTIMIZED).then(|| ana::state_name(state))
}

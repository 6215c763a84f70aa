//! NVMe-oF methods (`lib/nvmf/nvmf_rpc.c`) and the nvmf part of `framework_get_config`
//! (`spdk_nvmf_tgt_write_config_json`).
//!
//! Parameters SPDK has for features this target lacks (TLS secure channels, DH-HMAC-CHAP
//! keys, NVMe passthrough, NSSR, DMRSL/WZSL limits,
//! `admin_label` of the extended discovery log page, bdev metadata) are accepted only at their
//! "off" value; anything else is `-EINVAL` naming the parameter.
//!
//! Parameters that configure machinery absent here are accepted with any value and logged at
//! debug: a listener's `sock_impl` (SPDK's socket layer: no listener here uses it) and
//! `numa_id` (used only by SPDK's vfio-user transport). Every parameter of SPDK's schema
//! (`tests/data/spdk-schema.yaml`) for these methods decodes; `rpc::schema_tests` walks it.
//!
//! The methods live in one module per concern: `nvmf_transports`, `nvmf_subsystems` (with
//! their controllers and queue pairs), `nvmf_listeners`, `nvmf_namespaces`, `nvmf_hosts` (the
//! subsystem's allowed hosts; per-namespace masking is `nvmf_ns_hosts`) and `nvmf_config` (the
//! saved config). This module keeps what they share, and re-exports them so every method and
//! params struct is still reachable as `rpc::nvmf::*`.

use nvmf_rpc::RpcError;
use serde_json::Value;

use super::{einval, Control};
use crate::target::SubsystemState;

pub(crate) use super::nvmf_listeners::address_json;

pub use super::nvmf_config::config;
pub use super::nvmf_hosts::{
    nvmf_subsystem_add_host, nvmf_subsystem_allow_any_host, nvmf_subsystem_remove_host,
    AddHostParams, AllowAnyHostParams, RemoveHostParams,
};
pub use super::nvmf_listeners::{
    nvmf_subsystem_add_listener, nvmf_subsystem_get_listeners, nvmf_subsystem_remove_listener,
    AddListenerParams, ListenAddressParams, RemoveListenerParams,
};
pub use super::nvmf_namespaces::{
    nvmf_subsystem_add_ns, nvmf_subsystem_remove_ns, AddNsParams, NamespaceParams, RemoveNsParams,
};
pub use super::nvmf_subsystems::{
    nvmf_create_subsystem, nvmf_delete_subsystem, nvmf_get_subsystems,
    nvmf_subsystem_get_controllers, nvmf_subsystem_get_qpairs, CreateSubsystemParams,
    GetSubsystemsParams, NqnParams,
};
pub use super::nvmf_transports::{nvmf_create_transport, nvmf_get_transports, GetTransportsParams};

pub(super) fn true_() -> Value {
    Value::Bool(true)
}

/// Subsystems in creation order (SPDK lists them by subsystem id).
pub(super) fn subsystems_in_order(c: &Control) -> Vec<&SubsystemState> {
    let mut subs: Vec<&SubsystemState> = c.target.subsystems().collect();
    subs.sort_by_key(|s| s.id);
    subs
}

pub(super) fn refuse_if(set: bool, field: &str, why: &str) -> Result<(), RpcError> {
    if set {
        Err(einval(format!("{field}: {why}")))
    } else {
        Ok(())
    }
}

pub(super) fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

//! SPDK's JSON-RPC methods over the control-plane [`Target`]: one params struct
//! (`deny_unknown_fields`, SPDK's names and defaults) and one handler per method, in
//! [`framework`] (`rpc_get_methods`, `framework_*` and the SPDK framework settings a saved config
//! carries), [`spdk_settings`] (more settings of SPDK modules absent here), [`bdev`] and
//! [`nvmf`]. [`config_loader`] replays SPDK saved configs (`nvmf-tgt -c FILE`).
//!
//! Errors follow SPDK: malformed params (missing, mistyped or unknown field) are `-32602` with a
//! message naming the field, unknown methods `-32601`, a method called in the wrong init state
//! `-1`, domain errors a negated errno with a readable message. A failed call leaves the target
//! as it was: handlers validate everything before the first change.
//!
//! Wire-up: [`call_fn`] turns a shared [`Control`] into the dispatch closure the `nvmf-rpc`
//! server forwards to, and [`METHODS`] names what to register.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvmf_rpc::RpcError;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::target::Target;
use crate::transport::options::TransportOptions;
use crate::transport::{Transport, TransportError};

pub mod app;
pub mod bdev;
pub mod config_loader;
pub mod framework;
pub mod log;
pub mod nvmf;
pub mod nvmf_ana;
pub mod nvmf_ns_hosts;
pub mod nvmf_referrals;
pub mod spdk_settings;
pub mod stats;

// The rest of the nvmf_* methods, one module per concern; `nvmf` re-exports their public
// items, so their paths stay `rpc::nvmf::*`.
mod nvmf_config;
mod nvmf_hosts;
mod nvmf_listeners;
mod nvmf_namespaces;
mod nvmf_subsystems;
mod nvmf_transports;

pub use config_loader::{load_config, load_config_with, LoadOptions, LoadReport};

#[cfg(test)]
mod config_loader_tests;
#[cfg(test)]
mod nvmf_ana_tests;
#[cfg(test)]
mod nvmf_masking_tests;
#[cfg(test)]
mod schema_tests;
#[cfg(test)]
mod stats_tests;
#[cfg(test)]
mod tests;

/// SPDK's code for "method not allowed in the current state" (`SPDK_JSONRPC_ERROR_INVALID_STATE`).
pub const INVALID_STATE: i32 = -1;

/// The name of the one NVMe-oF target (SPDK's `nvmf_tgt` default); `tgt_name` may name it or be
/// left out.
pub const DEFAULT_TGT_NAME: &str = "nvmf_tgt";

/// SPDK's default `max_subsystems` (discovery subsystem included).
pub const DEFAULT_MAX_SUBSYSTEMS: u32 = 1024;

/// Creates a transport for `nvmf_create_transport`. It gets the validated options and must
/// honour every one of them (the resource-tuning ones included) or return `Err` naming what it
/// cannot do.
pub type TransportFactory =
    Box<dyn Fn(&TransportOptions) -> Result<Arc<dyn Transport>, TransportError> + Send>;

/// Runs once when `framework_start_init` leaves [`InitState::WaitingForRpc`]; an `Err` keeps the
/// target waiting and is the RPC's error.
pub type StartInitHook = Box<dyn FnOnce(&mut Target) -> Result<(), String> + Send>;

/// SPDK's RPC states: `--wait-for-rpc` starts in `WaitingForRpc` (SPDK_RPC_STARTUP), where only
/// configuration methods run until `framework_start_init`; otherwise the target is `Running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitState {
    WaitingForRpc,
    Running,
}

/// Everything the RPC handlers act on.
pub struct Control {
    pub target: Target,
    pub transport_factory: TransportFactory,
    pub init_state: InitState,
    pub on_start_init: Option<StartInitHook>,
    /// `nvmf_set_max_subsystems`: enforced by `nvmf_create_subsystem`.
    pub max_subsystems: u32,
    /// How long `nvmf_get_stats` waits for each poll group's answer.
    pub stats_timeout: Duration,
    /// The reactors' busy/idle accounting, in poll group order (`thread_get_stats`,
    /// `framework_get_reactors`); empty when the poll groups run on no reactor.
    pub reactors: Vec<crate::metrics::ReactorCounters>,
    /// The `log_*` methods' settings.
    pub log: log::LogControl,
    /// What `spdk_kill_instance` calls; without one the method fails.
    pub on_kill: Option<app::KillHook>,
}

impl Control {
    /// A running control plane (no `--wait-for-rpc`).
    pub fn new(target: Target, transport_factory: TransportFactory) -> Self {
        Self {
            target,
            transport_factory,
            init_state: InitState::Running,
            on_start_init: None,
            max_subsystems: DEFAULT_MAX_SUBSYSTEMS,
            stats_timeout: Duration::from_secs(2),
            reactors: Vec::new(),
            log: log::LogControl::default(),
            on_kill: None,
        }
    }
}

type Handler = fn(&mut Control, Option<Value>) -> Result<Value, RpcError>;

/// When a method may run (SPDK's `SPDK_RPC_STARTUP` / `SPDK_RPC_RUNTIME` masks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    StartupOnly,
    RuntimeOnly,
    Always,
}

impl Allowed {
    fn permits(self, state: InitState) -> bool {
        matches!(
            (self, state),
            (Allowed::Always, _)
                | (Allowed::StartupOnly, InitState::WaitingForRpc)
                | (Allowed::RuntimeOnly, InitState::Running)
        )
    }
}

pub struct Method {
    pub name: &'static str,
    pub allowed: Allowed,
    handler: Handler,
}

const fn m(name: &'static str, allowed: Allowed, handler: Handler) -> Method {
    Method {
        name,
        allowed,
        handler,
    }
}

use Allowed::{Always, RuntimeOnly, StartupOnly};

/// The method table.
pub static METHODS: &[Method] = &[
    m("rpc_get_methods", Always, framework::rpc_get_methods),
    m("spdk_get_version", Always, framework::spdk_get_version),
    m(
        "framework_start_init",
        StartupOnly,
        framework::framework_start_init,
    ),
    m(
        "framework_wait_init",
        Always,
        framework::framework_wait_init,
    ),
    m(
        "framework_get_subsystems",
        Always,
        framework::framework_get_subsystems,
    ),
    m(
        "framework_get_config",
        Always,
        framework::framework_get_config,
    ),
    m(
        "framework_set_scheduler",
        Always,
        framework::framework_set_scheduler,
    ),
    // Framework settings SPDK saves (accepted where default or irrelevant, see framework.rs).
    m("bdev_set_options", Always, framework::bdev_set_options),
    m(
        "bdev_wait_for_examine",
        Always,
        framework::bdev_wait_for_examine,
    ),
    m(
        "bdev_nvme_set_options",
        Always,
        framework::bdev_nvme_set_options,
    ),
    m(
        "bdev_nvme_set_hotplug",
        Always,
        framework::bdev_nvme_set_hotplug,
    ),
    m("iobuf_set_options", Always, framework::iobuf_set_options),
    m("accel_set_options", Always, framework::accel_set_options),
    m(
        "sock_impl_set_options",
        Always,
        framework::sock_impl_set_options,
    ),
    m(
        "sock_set_default_impl",
        Always,
        framework::sock_set_default_impl,
    ),
    m("vmd_enable", Always, framework::vmd_enable),
    // More settings of SPDK modules absent here, inert (see spdk_settings.rs).
    m(
        "bdev_raid_set_options",
        Always,
        spdk_settings::bdev_raid_set_options,
    ),
    m(
        "bdev_iscsi_set_options",
        Always,
        spdk_settings::bdev_iscsi_set_options,
    ),
    m(
        "keyring_linux_set_options",
        Always,
        spdk_settings::keyring_linux_set_options,
    ),
    m(
        "nvmf_set_max_subsystems",
        Always,
        framework::nvmf_set_max_subsystems,
    ),
    m("nvmf_set_config", Always, framework::nvmf_set_config),
    m("nvmf_set_crdt", Always, framework::nvmf_set_crdt),
    // Bdevs.
    m("bdev_get_bdevs", RuntimeOnly, bdev::bdev_get_bdevs),
    m("bdev_malloc_create", RuntimeOnly, bdev::bdev_malloc_create),
    m("bdev_malloc_delete", RuntimeOnly, bdev::bdev_malloc_delete),
    m("bdev_null_create", RuntimeOnly, bdev::bdev_null_create),
    m("bdev_null_delete", RuntimeOnly, bdev::bdev_null_delete),
    m("bdev_aio_create", RuntimeOnly, bdev::bdev_aio_create),
    m("bdev_aio_delete", RuntimeOnly, bdev::bdev_aio_delete),
    m("bdev_uring_create", RuntimeOnly, bdev::bdev_uring_create),
    m("bdev_uring_delete", RuntimeOnly, bdev::bdev_uring_delete),
    m("bdev_delay_create", RuntimeOnly, bdev::bdev_delay_create),
    m("bdev_delay_delete", RuntimeOnly, bdev::bdev_delay_delete),
    m(
        "bdev_delay_update_latency",
        RuntimeOnly,
        bdev::bdev_delay_update_latency,
    ),
    m("bdev_null_resize", RuntimeOnly, bdev::bdev_null_resize),
    m("bdev_aio_rescan", RuntimeOnly, bdev::bdev_aio_rescan),
    m("bdev_uring_rescan", RuntimeOnly, bdev::bdev_uring_rescan),
    m("bdev_split_create", RuntimeOnly, bdev::bdev_split_create),
    m("bdev_split_delete", RuntimeOnly, bdev::bdev_split_delete),
    m("bdev_error_create", RuntimeOnly, bdev::bdev_error_create),
    m("bdev_error_delete", RuntimeOnly, bdev::bdev_error_delete),
    m(
        "bdev_error_inject_error",
        RuntimeOnly,
        bdev::bdev_error_inject_error,
    ),
    m(
        "bdev_error_resume_pending",
        RuntimeOnly,
        bdev::bdev_error_resume_pending,
    ),
    // NVMe-oF.
    m(
        "nvmf_create_transport",
        RuntimeOnly,
        nvmf::nvmf_create_transport,
    ),
    m(
        "nvmf_get_transports",
        RuntimeOnly,
        nvmf::nvmf_get_transports,
    ),
    m(
        "nvmf_create_subsystem",
        RuntimeOnly,
        nvmf::nvmf_create_subsystem,
    ),
    m(
        "nvmf_delete_subsystem",
        RuntimeOnly,
        nvmf::nvmf_delete_subsystem,
    ),
    m(
        "nvmf_get_subsystems",
        RuntimeOnly,
        nvmf::nvmf_get_subsystems,
    ),
    m(
        "nvmf_subsystem_add_listener",
        RuntimeOnly,
        nvmf::nvmf_subsystem_add_listener,
    ),
    m(
        "nvmf_subsystem_remove_listener",
        RuntimeOnly,
        nvmf::nvmf_subsystem_remove_listener,
    ),
    m(
        "nvmf_subsystem_get_listeners",
        RuntimeOnly,
        nvmf::nvmf_subsystem_get_listeners,
    ),
    m(
        "nvmf_subsystem_listener_set_ana_state",
        RuntimeOnly,
        nvmf_ana::nvmf_subsystem_listener_set_ana_state,
    ),
    m(
        "nvmf_subsystem_set_ns_ana_group",
        RuntimeOnly,
        nvmf_ana::nvmf_subsystem_set_ns_ana_group,
    ),
    m(
        "nvmf_subsystem_add_ns",
        RuntimeOnly,
        nvmf::nvmf_subsystem_add_ns,
    ),
    m(
        "nvmf_subsystem_remove_ns",
        RuntimeOnly,
        nvmf::nvmf_subsystem_remove_ns,
    ),
    m(
        "nvmf_subsystem_add_host",
        RuntimeOnly,
        nvmf::nvmf_subsystem_add_host,
    ),
    m(
        "nvmf_subsystem_remove_host",
        RuntimeOnly,
        nvmf::nvmf_subsystem_remove_host,
    ),
    m(
        "nvmf_subsystem_allow_any_host",
        RuntimeOnly,
        nvmf::nvmf_subsystem_allow_any_host,
    ),
    m(
        "nvmf_subsystem_get_controllers",
        RuntimeOnly,
        nvmf::nvmf_subsystem_get_controllers,
    ),
    m(
        "nvmf_subsystem_get_qpairs",
        RuntimeOnly,
        nvmf::nvmf_subsystem_get_qpairs,
    ),
    m("nvmf_get_stats", RuntimeOnly, stats::nvmf_get_stats),
    // Statistics, logging, the application (stats.rs, log.rs, app.rs).
    m("bdev_get_iostat", RuntimeOnly, stats::bdev_get_iostat),
    m("thread_get_stats", RuntimeOnly, stats::thread_get_stats),
    m(
        "framework_get_reactors",
        RuntimeOnly,
        stats::framework_get_reactors,
    ),
    m("log_set_level", Always, log::log_set_level),
    m("log_get_level", Always, log::log_get_level),
    m("log_set_print_level", Always, log::log_set_print_level),
    m("log_get_print_level", Always, log::log_get_print_level),
    m("log_set_flag", Always, log::log_set_flag),
    m("log_clear_flag", Always, log::log_clear_flag),
    m("log_get_flags", Always, log::log_get_flags),
    m("spdk_kill_instance", RuntimeOnly, app::spdk_kill_instance),
    m(
        "nvmf_ns_add_host",
        RuntimeOnly,
        nvmf_ns_hosts::nvmf_ns_add_host,
    ),
    m(
        "nvmf_ns_remove_host",
        RuntimeOnly,
        nvmf_ns_hosts::nvmf_ns_remove_host,
    ),
    m(
        "nvmf_discovery_add_referral",
        RuntimeOnly,
        nvmf_referrals::nvmf_discovery_add_referral,
    ),
    m(
        "nvmf_discovery_remove_referral",
        RuntimeOnly,
        nvmf_referrals::nvmf_discovery_remove_referral,
    ),
    m(
        "nvmf_discovery_get_referrals",
        RuntimeOnly,
        nvmf_referrals::nvmf_discovery_get_referrals,
    ),
];

/// Every method name, for registering with the server.
pub fn method_names() -> Vec<&'static str> {
    METHODS.iter().map(|m| m.name).collect()
}

pub fn find_method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// Runs one method.
pub fn dispatch(
    control: &mut Control,
    method: &str,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    let Some(m) = find_method(method) else {
        return Err(RpcError::new(
            RpcError::METHOD_NOT_FOUND,
            format!("Method not found: {method}"),
        ));
    };
    if !m.allowed.permits(control.init_state) {
        let message = match control.init_state {
            InitState::WaitingForRpc => {
                "Method may only be called after framework is initialized using framework_start_init RPC."
            }
            InitState::Running => {
                "Method may only be called before framework is initialized. Use --wait-for-rpc command line parameter and then issue this RPC before the framework_start_init RPC."
            }
        };
        return Err(RpcError::new(INVALID_STATE, message));
    }
    (m.handler)(control, params)
}

/// The dispatch closure for [`nvmf_rpc::build_module`]: each call takes the control lock.
pub fn call_fn(control: Arc<Mutex<Control>>) -> nvmf_rpc::CallFn {
    Arc::new(move |method: &str, params: Option<Value>| {
        let mut control = control.lock().unwrap_or_else(|e| e.into_inner());
        dispatch(&mut control, method, params)
    })
}

/// Decodes `params` into a method's struct. Absent params decode as `{}` (so a required field
/// is reported missing by name); positional (array) params are refused as SPDK does.
pub fn parse<T: DeserializeOwned>(params: Option<Value>) -> Result<T, RpcError> {
    let value = match params {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::Array(_)) => return Err(RpcError::invalid_params("params must be an object")),
        Some(v) => v,
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            RpcError::invalid_params(format!("Invalid parameters: {inner}"))
        } else {
            RpcError::invalid_params(format!("Invalid parameters: {path}: {inner}"))
        }
    })
}

/// `tgt_name` must be absent or name the one target.
pub fn check_tgt_name(tgt_name: Option<&str>) -> Result<(), RpcError> {
    match tgt_name {
        None | Some(DEFAULT_TGT_NAME) => Ok(()),
        Some(name) => Err(RpcError::internal(format!("Unable to find target {name}"))),
    }
}

/// `-EINVAL` with a message.
pub fn einval(message: impl Into<String>) -> RpcError {
    RpcError::errno(libc::EINVAL, message)
}

/// Why `load_config` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid config: {0}")]
    Format(String),
    #[error("subsystem {subsystem}, entry {index}{} ({method}): {error}", batch_item.map(|i| format!(", batch item {i}")).unwrap_or_default())]
    Entry {
        subsystem: String,
        index: usize,
        /// Position inside a batch entry (SPDK 26.x `save_config --with-batches`).
        batch_item: Option<usize>,
        method: String,
        error: RpcError,
    },
}

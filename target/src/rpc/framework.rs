//! Application-level methods (`lib/event/app_rpc.c`, `lib/init/rpc.c`, `lib/rpc/rpc.c`) and the
//! SPDK framework settings that appear in saved configs.
//!
//! Settings for SPDK machinery this target does not have are accepted only where their value
//! cannot change what this target does, each with the reason below; anything else is refused
//! with a message, never stored and ignored:
//! - `bdev_set_options`: sizes of SPDK's `bdev_io` pools and caches; bdev I/O here carries no
//!   pooled `bdev_io`, and `bdev_auto_examine` governs examine modules (GPT, lvol), none of which
//!   exist here. Any value is accepted.
//! - `bdev_wait_for_examine`: bdev creation is synchronous here, so examine is always done.
//! - `bdev_nvme_set_options`: options of the NVMe bdev module, which does not exist here
//!   (`bdev_nvme_attach_controller` is an unknown method), so they govern nothing. Any value.
//! - `bdev_nvme_set_hotplug`: `enable: false` only (hotplug would attach NVMe bdevs).
//! - `iobuf_set_options`: SPDK's shared I/O buffer pools; transports here own their buffer pools
//!   (sized by `nvmf_create_transport`). Any value.
//! - `accel_set_options`: the accel framework's task caches; nothing here offloads through
//!   accel. Any value. (`accel_assign_opc` and other accel methods stay unknown.)
//! - `sock_impl_set_options`: SPDK's socket layer; no transport here uses it (RDMA connects
//!   through rdma_cm). Any value. `sock_set_default_impl`: `posix` only.
//! - `vmd_enable`: refused (no VMD enumeration).
//! - `nvmf_set_max_subsystems`: enforced by `nvmf_create_subsystem`.
//! - `nvmf_set_config`: `discovery_filter` `match_any` (what discovery here does), every
//!   `admin_cmd_passthru` false (nothing is passed through), DH-HMAC-CHAP digest/group lists
//!   (they only restrict authentication, and no host can be given a key here); a
//!   `poll_groups_mask` is refused.
//! - `nvmf_set_crdt`: all zero (Identify reports no command retry delay).
//! - `framework_set_scheduler`: `static` only (reactors are never rebalanced here).

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{einval, parse, Control, InitState, METHODS};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

fn no_params(params: Option<Value>) -> Result<(), RpcError> {
    parse::<NoParams>(params).map(|_| ())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RpcGetMethodsParams {
    #[serde(default)]
    pub current: bool,
    #[serde(default)]
    pub include_aliases: bool,
}

/// Method names; with `current`, only those callable in the present state.
pub fn rpc_get_methods(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: RpcGetMethodsParams = parse(params)?;
    // No method here has an alias, so include_aliases changes nothing.
    let _ = p.include_aliases;
    let names: Vec<&str> = METHODS
        .iter()
        .filter(|m| !p.current || m.allowed.permits(c.init_state))
        .map(|m| m.name)
        .collect();
    Ok(json!(names))
}

pub fn spdk_get_version(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params(params)?;
    let field = |s: &str| s.parse::<u32>().unwrap_or(0);
    Ok(json!({
        "version": format!("nvmf-tgt v{}", env!("CARGO_PKG_VERSION")),
        "fields": {
            "major": field(env!("CARGO_PKG_VERSION_MAJOR")),
            "minor": field(env!("CARGO_PKG_VERSION_MINOR")),
            "patch": field(env!("CARGO_PKG_VERSION_PATCH")),
            "suffix": env!("CARGO_PKG_VERSION_PRE"),
        }
    }))
}

/// Leaves `--wait-for-rpc`: runs the start hook, then runtime methods become callable.
pub fn framework_start_init(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params(params)?;
    if let Some(hook) = c.on_start_init.take() {
        hook(&mut c.target)
            .map_err(|e| RpcError::internal(format!("framework_start_init failed: {e}")))?;
    }
    c.init_state = InitState::Running;
    Ok(Value::Bool(true))
}

/// SPDK holds the reply until initialization completes. A call here runs under the control
/// lock that `framework_start_init` needs, so it cannot wait: before init it fails instead.
pub fn framework_wait_init(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params(params)?;
    match c.init_state {
        InitState::Running => Ok(Value::Bool(true)),
        InitState::WaitingForRpc => Err(RpcError::new(
            super::INVALID_STATE,
            "framework is not initialized yet: call framework_start_init first",
        )),
    }
}

/// The subsystems `framework_get_config` knows, in dependency order.
pub const SUBSYSTEMS: &[(&str, &[&str])] = &[("bdev", &[]), ("nvmf", &["bdev"])];

pub fn framework_get_subsystems(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params(params)?;
    Ok(Value::Array(
        SUBSYSTEMS
            .iter()
            .map(|(name, deps)| json!({"subsystem": name, "depends_on": deps}))
            .collect(),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrameworkGetConfigParams {
    pub name: String,
}

/// The `{"method", "params"}` entries that recreate one subsystem's state, in replay order.
pub fn framework_get_config(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: FrameworkGetConfigParams = parse(params)?;
    match p.name.as_str() {
        "bdev" => Ok(Value::Array(super::bdev::config(c))),
        "nvmf" => Ok(Value::Array(super::nvmf::config(c))),
        other => Err(RpcError::invalid_params(format!(
            "Subsystem not found: {other}"
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerParams {
    pub name: String,
    /// How often the scheduler runs (µs); the static scheduler does nothing when it runs.
    #[serde(default)]
    pub period: Option<u64>,
}

pub fn framework_set_scheduler(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: SchedulerParams = parse(params)?;
    let _ = p.period;
    if p.name != "static" {
        return Err(einval(format!(
            "scheduler {}: only the static scheduler exists here (poll groups are never moved)",
            p.name
        )));
    }
    Ok(Value::Bool(true))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevSetOptionsParams {
    #[serde(default)]
    pub bdev_io_pool_size: Option<u32>,
    #[serde(default)]
    pub bdev_io_cache_size: Option<u32>,
    #[serde(default)]
    pub bdev_auto_examine: Option<bool>,
    #[serde(default)]
    pub iobuf_small_cache_size: Option<u32>,
    #[serde(default)]
    pub iobuf_large_cache_size: Option<u32>,
}

pub fn bdev_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    parse::<BdevSetOptionsParams>(params)?;
    Ok(Value::Bool(true))
}

pub fn bdev_wait_for_examine(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params(params)?;
    Ok(Value::Bool(true))
}

/// Accepts any object: every option of a module that does not exist is equally inert.
pub fn bdev_nvme_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    parse::<Map<String, Value>>(params)?;
    Ok(Value::Bool(true))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotplugParams {
    pub enable: bool,
    #[serde(default)]
    pub period_us: Option<u64>,
}

pub fn bdev_nvme_set_hotplug(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: HotplugParams = parse(params)?;
    if p.enable {
        return Err(einval(
            "enable: NVMe hotplug is not supported (there is no NVMe bdev module)",
        ));
    }
    Ok(Value::Bool(true))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IobufSetOptionsParams {
    #[serde(default)]
    pub small_pool_count: Option<u64>,
    #[serde(default)]
    pub large_pool_count: Option<u64>,
    #[serde(default)]
    pub small_bufsize: Option<u32>,
    #[serde(default)]
    pub large_bufsize: Option<u32>,
    #[serde(default)]
    pub enable_numa: Option<bool>,
}

pub fn iobuf_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    parse::<IobufSetOptionsParams>(params)?;
    Ok(Value::Bool(true))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccelSetOptionsParams {
    #[serde(default)]
    pub small_cache_size: Option<u32>,
    #[serde(default)]
    pub large_cache_size: Option<u32>,
    #[serde(default)]
    pub task_count: Option<u32>,
    #[serde(default)]
    pub sequence_count: Option<u32>,
    #[serde(default)]
    pub buf_count: Option<u32>,
}

pub fn accel_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    parse::<AccelSetOptionsParams>(params)?;
    Ok(Value::Bool(true))
}

/// Accepts any object for the one implementation name: the socket layer is unused here.
pub fn sock_impl_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p = parse::<Map<String, Value>>(params)?;
    if !p.get("impl_name").is_some_and(Value::is_string) {
        return Err(RpcError::invalid_params(
            "Invalid parameters: missing field `impl_name`",
        ));
    }
    Ok(Value::Bool(true))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SockSetDefaultImplParams {
    pub impl_name: String,
}

pub fn sock_set_default_impl(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: SockSetDefaultImplParams = parse(params)?;
    if p.impl_name != "posix" {
        return Err(einval(format!(
            "impl_name {}: only posix sockets exist here",
            p.impl_name
        )));
    }
    Ok(Value::Bool(true))
}

pub fn vmd_enable(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    parse::<Map<String, Value>>(params)?;
    Err(RpcError::errno(
        libc::EOPNOTSUPP,
        "VMD is not supported by this target",
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxSubsystemsParams {
    pub max_subsystems: u32,
}

pub fn nvmf_set_max_subsystems(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: MaxSubsystemsParams = parse(params)?;
    let existing = c.target.subsystems().count() as u32;
    if p.max_subsystems == 0 || p.max_subsystems < existing {
        return Err(einval(format!(
            "max_subsystems {} is below the {existing} subsystems that exist (the discovery subsystem counts)",
            p.max_subsystems
        )));
    }
    c.max_subsystems = p.max_subsystems;
    Ok(Value::Bool(true))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminCmdPassthru {
    #[serde(default)]
    pub identify_ctrlr: bool,
    #[serde(default)]
    pub get_log_page: bool,
    #[serde(default)]
    pub get_set_features: bool,
    #[serde(default)]
    pub sanitize: bool,
    #[serde(default)]
    pub vendor_specific: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmfSetConfigParams {
    #[serde(default)]
    pub discovery_filter: Option<String>,
    #[serde(default)]
    pub poll_groups_mask: Option<String>,
    #[serde(default)]
    pub admin_cmd_passthru: Option<AdminCmdPassthru>,
    #[serde(default)]
    pub dhchap_digests: Option<Vec<String>>,
    #[serde(default)]
    pub dhchap_dhgroups: Option<Vec<String>>,
}

pub fn nvmf_set_config(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: NvmfSetConfigParams = parse(params)?;
    if let Some(filter) = p.discovery_filter.as_deref() {
        if filter != "match_any" {
            return Err(einval(format!(
                "discovery_filter {filter}: only match_any is supported (the discovery log lists every listener)"
            )));
        }
    }
    if let Some(mask) = p.poll_groups_mask {
        return Err(einval(format!(
            "poll_groups_mask {mask}: poll group placement is set at start-up, not by RPC"
        )));
    }
    if let Some(a) = p.admin_cmd_passthru {
        if a.identify_ctrlr
            || a.get_log_page
            || a.get_set_features
            || a.sanitize
            || a.vendor_specific
        {
            return Err(einval(
                "admin_cmd_passthru: no admin command is passed through to a backing device here",
            ));
        }
    }
    Ok(Value::Bool(true))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrdtParams {
    #[serde(default)]
    pub crdt1: u16,
    #[serde(default)]
    pub crdt2: u16,
    #[serde(default)]
    pub crdt3: u16,
}

pub fn nvmf_set_crdt(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: CrdtParams = parse(params)?;
    if p.crdt1 != 0 || p.crdt2 != 0 || p.crdt3 != 0 {
        return Err(einval(
            "crdt1..3: command retry delay times are not supported (Identify reports none)",
        ));
    }
    Ok(Value::Bool(true))
}

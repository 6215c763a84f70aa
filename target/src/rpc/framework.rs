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
//! - `nvmf_set_config`: `discovery_filter` `match_any` and an empty `discovery_filters` (what
//!   discovery here does: every listener is listed to every host), every `admin_cmd_passthru`
//!   false (nothing is passed through), `dup_host_policy` `allow` (a host may connect through
//!   any listener, as here), DH-HMAC-CHAP digest/group lists (they only restrict
//!   authentication, and no host can be given a key here); a `poll_groups_mask` is refused.
//!   Our extensions `max_qpairs_per_host` and `max_qpairs` set the target's queue pair limits
//!   (`core::limits`), enforced at Connect.
//! - `nvmf_set_crdt`: all zero (Identify reports no command retry delay).
//! - `framework_set_scheduler`: `static` only (reactors are never rebalanced here). The dynamic
//!   scheduler's thresholds (`load_limit`, `core_limit`, `core_busy`) and `period` tune a
//!   scheduler that is not running: any value, logged at debug. The static scheduler's
//!   `mappings` (move threads to named cores) is refused: poll groups stay on their cores.
//! - `framework_get_config`: `with_batches` keeps SPDK's batched entries as arrays; no subsystem
//!   here writes batches, so the answer is the same either way (any value).

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

/// Logs, at debug, each parameter of `method` that was accepted and configures nothing here.
pub(super) fn debug_ignored<'a>(method: &str, names: impl IntoIterator<Item = &'a str>) {
    for name in names {
        tracing::debug!(
            method,
            parameter = name,
            "{method}: {name} accepted and ignored (it configures nothing here)"
        );
    }
}

/// The member names of an object `params` (for [`debug_ignored`]).
fn keys(params: &Option<Value>) -> Vec<&str> {
    match params {
        Some(Value::Object(m)) => m.keys().map(String::as_str).collect(),
        _ => Vec::new(),
    }
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
    /// Entries are never batched here, so flattening them changes nothing.
    #[serde(default)]
    pub with_batches: Option<bool>,
}

/// The `{"method", "params"}` entries that recreate one subsystem's state, in replay order.
pub fn framework_get_config(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: FrameworkGetConfigParams = parse(params)?;
    if p.with_batches.is_some() {
        debug_ignored("framework_get_config", ["with_batches"]);
    }
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
    /// Dynamic scheduler thresholds (percent).
    #[serde(default)]
    pub load_limit: Option<u8>,
    #[serde(default)]
    pub core_limit: Option<u8>,
    #[serde(default)]
    pub core_busy: Option<u8>,
    /// Static scheduler: `thread:core` pairs to move threads to.
    #[serde(default)]
    pub mappings: Option<String>,
}

pub fn framework_set_scheduler(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: SchedulerParams = parse(params)?;
    if p.name != "static" {
        return Err(einval(format!(
            "scheduler {}: only the static scheduler exists here (poll groups are never moved)",
            p.name
        )));
    }
    if let Some(m) = p.mappings {
        return Err(einval(format!(
            "mappings {m}: moving threads to other cores is not supported (each poll group stays on its core)"
        )));
    }
    debug_ignored(
        "framework_set_scheduler",
        [
            ("period", p.period.is_some()),
            ("load_limit", p.load_limit.is_some()),
            ("core_limit", p.core_limit.is_some()),
            ("core_busy", p.core_busy.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name)),
    );
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
    debug_ignored("bdev_set_options", keys(&params));
    parse::<BdevSetOptionsParams>(params)?;
    Ok(Value::Bool(true))
}

pub fn bdev_wait_for_examine(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params(params)?;
    Ok(Value::Bool(true))
}

/// Accepts any object: every option of a module that does not exist is equally inert.
pub fn bdev_nvme_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    debug_ignored("bdev_nvme_set_options", keys(&params));
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
    debug_ignored("iobuf_set_options", keys(&params));
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
    debug_ignored("accel_set_options", keys(&params));
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
    debug_ignored(
        "sock_impl_set_options",
        p.keys().map(String::as_str).filter(|k| *k != "impl_name"),
    );
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
    pub identify_uuid_list: bool,
    #[serde(default)]
    pub get_log_page: bool,
    #[serde(default)]
    pub get_set_features: bool,
    #[serde(default)]
    pub sanitize: bool,
    #[serde(default)]
    pub security_send_recv: bool,
    #[serde(default)]
    pub fw_update: bool,
    #[serde(default)]
    pub nvme_mi: bool,
    #[serde(default)]
    pub vendor_specific: bool,
}

impl AdminCmdPassthru {
    /// The commands asked to be passed through, by SPDK's names.
    pub fn requested(&self) -> Vec<&'static str> {
        [
            ("identify_ctrlr", self.identify_ctrlr),
            ("identify_uuid_list", self.identify_uuid_list),
            ("get_log_page", self.get_log_page),
            ("get_set_features", self.get_set_features),
            ("sanitize", self.sanitize),
            ("security_send_recv", self.security_send_recv),
            ("fw_update", self.fw_update),
            ("nvme_mi", self.nvme_mi),
            ("vendor_specific", self.vendor_specific),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvmfSetConfigParams {
    #[serde(default)]
    pub discovery_filter: Option<String>,
    /// SPDK's bitmask as a list of names (`transport`, `address`, `svcid`); empty is match-any.
    #[serde(default)]
    pub discovery_filters: Option<Vec<String>>,
    #[serde(default)]
    pub dup_host_policy: Option<String>,
    #[serde(default)]
    pub poll_groups_mask: Option<String>,
    #[serde(default)]
    pub admin_cmd_passthru: Option<AdminCmdPassthru>,
    #[serde(default)]
    pub dhchap_digests: Option<Vec<String>>,
    #[serde(default)]
    pub dhchap_dhgroups: Option<Vec<String>>,
    /// Our extension (SPDK has no per-host cap): queue pairs one host NQN may have connected
    /// across all subsystems and controllers.
    #[serde(default)]
    pub max_qpairs_per_host: Option<u32>,
    /// Our extension: queue pairs connected to the whole target.
    #[serde(default)]
    pub max_qpairs: Option<u32>,
    /// Our extension: a connection with no successful Connect this long is closed (10 s).
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Our extension: a queue whose host takes no response or transfer this long is closed
    /// and its buffers freed (30 s, Linux's `nvme_core.io_timeout`).
    #[serde(default)]
    pub transfer_timeout_ms: Option<u64>,
}

pub fn nvmf_set_config(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: NvmfSetConfigParams = parse(params)?;
    for (name, value) in [
        ("max_qpairs_per_host", p.max_qpairs_per_host),
        ("max_qpairs", p.max_qpairs),
    ] {
        if value == Some(0) {
            return Err(einval(format!("{name} must be at least 1")));
        }
    }
    for (name, value) in [
        ("connect_timeout_ms", p.connect_timeout_ms),
        ("transfer_timeout_ms", p.transfer_timeout_ms),
    ] {
        if value.is_some_and(|v| !(100..=3_600_000).contains(&v)) {
            return Err(einval(format!(
                "{name} must be between 100 and 3600000 (one hour)"
            )));
        }
    }
    if let Some(filter) = p.discovery_filter.as_deref() {
        if filter != "match_any" {
            return Err(einval(format!(
                "discovery_filter {filter}: only match_any is supported (the discovery log lists every listener)"
            )));
        }
    }
    if let Some(filters) = p.discovery_filters.filter(|f| !f.is_empty()) {
        return Err(einval(format!(
            "discovery_filters {}: filtering the discovery log is not supported (it lists every listener)",
            filters.join(",")
        )));
    }
    if let Some(policy) = p.dup_host_policy.as_deref() {
        if policy != "allow" {
            return Err(einval(format!(
                "dup_host_policy {policy}: only allow is supported (a host may connect through any listener)"
            )));
        }
    }
    if let Some(mask) = p.poll_groups_mask {
        return Err(einval(format!(
            "poll_groups_mask {mask}: poll group placement is set at start-up, not by RPC"
        )));
    }
    if let Some(a) = p.admin_cmd_passthru {
        let requested = a.requested();
        if !requested.is_empty() {
            return Err(einval(format!(
                "admin_cmd_passthru ({}): no admin command is passed through to a backing device here",
                requested.join(", ")
            )));
        }
    }
    // Applied last, once nothing else can refuse the call; queues already connected stay.
    let limits = &c.target.info.qpair_limits;
    if let Some(n) = p.max_qpairs_per_host {
        limits
            .max_per_host
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(n) = p.max_qpairs {
        limits
            .max_total
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(ms) = p.connect_timeout_ms {
        limits
            .connect_timeout_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(ms) = p.transfer_timeout_ms {
        limits
            .transfer_timeout_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }
    debug_ignored(
        "nvmf_set_config",
        [
            ("dhchap_digests", p.dhchap_digests.is_some()),
            ("dhchap_dhgroups", p.dhchap_dhgroups.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name)),
    );
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

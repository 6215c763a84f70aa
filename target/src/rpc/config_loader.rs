//! Replays an SPDK saved config (`nvmf-tgt -c FILE`, `rpc.py save_config`) through
//! [`dispatch`], following SPDK's own loader (`lib/init/json_config.c`).
//!
//! The file is `{"subsystems": [{"subsystem": NAME, "config": [ENTRY, ..] | null}, ..]}`; an
//! ENTRY is `{"method", "params"}` or, from SPDK 26.x `save_config --with-batches`, an array of
//! them (a batch: its items run in order as one unit, at the init state all of them allow).
//!
//! # Order
//! When the target waits for RPC (`--wait-for-rpc`), every unit allowed before init runs first
//! (file order), then `framework_start_init`, then the rest (file order); a method allowed in
//! both states runs only in the first pass, as in SPDK. A running target runs everything in file
//! order. A batch whose items need different states (one startup-only, one runtime-only) is an
//! error, as SPDK's "incompatible state requirements".
//!
//! # What each SPDK subsystem's section does here
//! SPDK's `nvmf_tgt` links `keyring`, `iobuf`, `sock`, `vmd`, `accel`, `bdev`, `nbd`,
//! `scheduler` and `nvmf`, and writes a section for each. Every entry is classified before
//! anything runs:
//! - **run**: the method is registered here ([`METHODS`](super::METHODS)); its handler applies
//!   the value, accepts it where it cannot change behaviour, or refuses it (see `framework.rs`
//!   and `spdk_settings.rs`). This covers `bdev` and `nvmf` (ours), `iobuf_set_options`,
//!   `sock_set_default_impl` / `sock_impl_set_options` (`posix` and `ssl`), `accel_set_options`,
//!   `keyring_linux_set_options`, `framework_set_scheduler`, `vmd_enable` (refused),
//!   `bdev_raid_set_options`, `bdev_iscsi_set_options`, the `bdev_nvme_set_*` settings.
//! - **skip with a notice** (a `tracing` warning naming section and method): settings of a
//!   subsystem that SPDK's `nvmf_tgt` does not even link, listed in [`SKIPPED_SETTINGS`]:
//!   `fsdev_set_opts`, `iscsi_set_options`, `iscsi_set_discovery_auth`, `vfu_tgt_set_base_path`,
//!   `ublk_create_target`, `virtio_blk_create_transport`. Whatever their values,
//!   they configure a service that has no object here to act on and cannot get one from the same
//!   file, because every method that would create one fails (next point). SPDK's loader skips
//!   these sections for the same reason ("subsystem not linked into this application").
//! - **fail, naming the method**: anything else not registered here. In a section of a
//!   subsystem `nvmf_tgt` has, that is a method that creates something this target cannot serve
//!   (`bdev_nvme_attach_controller`, `bdev_lvol_create_lvstore`, `bdev_raid_create`,
//!   `keyring_file_add_key` (no TLS PSK or DH-HMAC-CHAP here), `accel_crypto_key_create`,
//!   `accel_assign_opc`, `nbd_start_disk`, ...), and SPDK too
//!   fails on an unknown method of a linked subsystem. In a section of a subsystem it does not
//!   link (`iscsi_create_target_node`, `ublk_start_disk`, `vhost_create_blk_controller`,
//!   `fsdev_aio_create`, ...) it is likewise something that would be served, and dropping it
//!   would start a target missing what the file asks for. A section of a subsystem SPDK does not
//!   have at all fails at its first entry (nothing tells what it would do); empty or `null`
//!   sections of any name are fine.
//!
//! All failures of classification are reported before the first entry runs. Once running, the
//! first failing entry stops the load, naming subsystem, entry index (and batch item) and
//! method; entries before it stay applied (SPDK does not undo them either).
//!
//! [`LoadOptions::ignore_errors`] is SPDK's `--json-ignore-init-errors` (`stop_on_error` false):
//! unknown methods are skipped and failing entries logged, and the load goes on. A malformed file
//! and a failing `framework_start_init` still stop it.

use nvmf_rpc::RpcError;
use serde_json::Value;

use super::{dispatch, find_method, Allowed, ConfigError, Control, InitState};

/// How to load (the main binary's `--json-ignore-init-errors` sets `ignore_errors`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Log and skip entries that are unknown or fail, instead of stopping.
    pub ignore_errors: bool,
}

/// What a load did besides applying entries.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Calls made (batch items counted one by one, `framework_start_init` included).
    pub applied: usize,
    /// Entries skipped by [`SKIPPED_SETTINGS`]: `(subsystem, method)`.
    pub skipped: Vec<(String, String)>,
    /// With `ignore_errors`: the errors that were logged and passed over.
    pub ignored: Vec<ConfigError>,
}

/// Settings of SPDK subsystems that `nvmf_tgt` does not link, skipped with a notice: per
/// subsystem (SPDK's name), the methods its `write_config_json` emits that only set options.
pub const SKIPPED_SETTINGS: &[(&str, &[&str])] = &[
    ("fsdev", &["fsdev_set_opts"]),
    ("scsi", &[]),
    ("iscsi", &["iscsi_set_options", "iscsi_set_discovery_auth"]),
    ("vfio_user_target", &["vfu_tgt_set_base_path"]),
    ("ublk", &["ublk_create_target"]),
    ("vhost_blk", &["virtio_blk_create_transport"]),
    ("vhost_scsi", &[]),
];

/// SPDK subsystems `nvmf_tgt` links whose sections hold only methods registered here or
/// creators this target refuses; named so that their errors read as such.
const NVMF_TGT_SUBSYSTEMS: &[&str] = &[
    "keyring",
    "iobuf",
    "sock",
    "vmd",
    "accel",
    "bdev",
    "nbd",
    "scheduler",
    "nvmf",
];

/// One method call of a unit.
struct Item {
    method: String,
    params: Option<Value>,
    /// Position inside a batch entry.
    batch_item: Option<usize>,
}

/// One config entry: a single call or a batch.
struct Unit {
    subsystem: String,
    index: usize,
    items: Vec<Item>,
    allowed: Allowed,
}

fn entry_error(
    subsystem: &str,
    index: usize,
    batch_item: Option<usize>,
    method: &str,
    error: RpcError,
) -> ConfigError {
    ConfigError::Entry {
        subsystem: subsystem.to_string(),
        index,
        batch_item,
        method: method.to_string(),
        error,
    }
}

fn format_err(message: String) -> ConfigError {
    ConfigError::Format(message)
}

/// Why an unregistered method is not run.
fn not_found(subsystem: &str, method: &str) -> RpcError {
    let why = if NVMF_TGT_SUBSYSTEMS.contains(&subsystem) {
        "this target cannot serve what it creates or configures".to_string()
    } else if SKIPPED_SETTINGS.iter().any(|(s, _)| *s == subsystem) {
        format!(
            "subsystem {subsystem} does not exist here and this entry would create something in it"
        )
    } else {
        format!("subsystem {subsystem} is unknown to this target")
    };
    RpcError::new(
        RpcError::METHOD_NOT_FOUND,
        format!("Method not found: {method} ({why})"),
    )
}

fn is_skipped_setting(subsystem: &str, method: &str) -> bool {
    SKIPPED_SETTINGS
        .iter()
        .any(|(s, methods)| *s == subsystem && methods.contains(&method))
}

/// Decodes one `{"method", "params"}` object.
fn decode_call(
    subsystem: &str,
    index: usize,
    batch_item: Option<usize>,
    value: &Value,
) -> Result<Item, ConfigError> {
    let at = match batch_item {
        Some(i) => format!("subsystem {subsystem}, entry {index}, batch item {i}"),
        None => format!("subsystem {subsystem}, entry {index}"),
    };
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .ok_or_else(|| format_err(format!("{at}: no \"method\" string")))?;
    Ok(Item {
        method: method.to_string(),
        params: value.get("params").cloned(),
        batch_item,
    })
}

/// The state a batch may run in: the intersection of its items' states.
fn unit_allowed(items: &[Item]) -> Result<Allowed, String> {
    let mut startup = true;
    let mut runtime = true;
    for item in items {
        let allowed = find_method(&item.method).map_or(Allowed::Always, |m| m.allowed);
        startup &= allowed != Allowed::RuntimeOnly;
        runtime &= allowed != Allowed::StartupOnly;
    }
    match (startup, runtime) {
        (true, true) => Ok(Allowed::Always),
        (true, false) => Ok(Allowed::StartupOnly),
        (false, true) => Ok(Allowed::RuntimeOnly),
        (false, false) => Err(
            "batch mixes methods allowed only before init with methods allowed only after it"
                .into(),
        ),
    }
}

/// Loads `json` with default [`LoadOptions`] (stop at the first error).
pub fn load_config(control: &mut Control, json: &Value) -> Result<(), ConfigError> {
    load_config_with(control, json, LoadOptions::default()).map(|_| ())
}

/// Loads `json` as the module doc describes.
pub fn load_config_with(
    control: &mut Control,
    json: &Value,
    options: LoadOptions,
) -> Result<LoadReport, ConfigError> {
    let mut report = LoadReport::default();
    let units = classify(json, options, &mut report)?;

    if control.init_state == InitState::WaitingForRpc {
        let (early, late): (Vec<_>, Vec<_>) = units
            .into_iter()
            .partition(|u| u.allowed.permits(InitState::WaitingForRpc));
        run_units(control, &early, options, &mut report)?;
        dispatch(control, "framework_start_init", None)
            .map_err(|error| entry_error("framework", 0, None, "framework_start_init", error))?;
        report.applied += 1;
        run_units(control, &late, options, &mut report)?;
    } else {
        run_units(control, &units, options, &mut report)?;
    }
    Ok(report)
}

/// Reads the file into units of registered methods; skips and refuses the rest (before
/// anything runs).
fn classify(
    json: &Value,
    options: LoadOptions,
    report: &mut LoadReport,
) -> Result<Vec<Unit>, ConfigError> {
    let subsystems = json
        .get("subsystems")
        .and_then(Value::as_array)
        .ok_or_else(|| format_err("missing \"subsystems\" array".into()))?;
    let mut units = Vec::new();
    for (si, sub) in subsystems.iter().enumerate() {
        let name = sub
            .get("subsystem")
            .and_then(Value::as_str)
            .ok_or_else(|| format_err(format!("subsystems[{si}] has no \"subsystem\" name")))?;
        let config = match sub.get("config") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(c)) => c,
            Some(_) => {
                return Err(format_err(format!(
                    "subsystem {name}: \"config\" is not an array"
                )))
            }
        };
        for (index, entry) in config.iter().enumerate() {
            let items = match entry {
                Value::Array(batch) => batch
                    .iter()
                    .enumerate()
                    .map(|(i, v)| decode_call(name, index, Some(i), v))
                    .collect::<Result<Vec<_>, _>>()?,
                other => vec![decode_call(name, index, None, other)?],
            };
            let mut kept = Vec::with_capacity(items.len());
            for item in items {
                if find_method(&item.method).is_some() {
                    kept.push(item);
                } else if is_skipped_setting(name, &item.method) {
                    tracing::warn!(
                        subsystem = name,
                        entry = index,
                        method = item.method,
                        "skipping a setting of SPDK subsystem {name}, which this target does not have"
                    );
                    report.skipped.push((name.to_string(), item.method));
                } else {
                    let error = entry_error(
                        name,
                        index,
                        item.batch_item,
                        &item.method,
                        not_found(name, &item.method),
                    );
                    if !options.ignore_errors {
                        return Err(error);
                    }
                    tracing::warn!("config: ignoring {error}");
                    report.ignored.push(error);
                }
            }
            // An empty batch (or one whose items were all skipped) has nothing to run.
            if kept.is_empty() {
                continue;
            }
            let allowed = unit_allowed(&kept).map_err(|message| {
                entry_error(
                    name,
                    index,
                    None,
                    &kept[0].method,
                    RpcError::invalid_params(message),
                )
            })?;
            units.push(Unit {
                subsystem: name.to_string(),
                index,
                items: kept,
                allowed,
            });
        }
    }
    Ok(units)
}

fn run_units(
    control: &mut Control,
    units: &[Unit],
    options: LoadOptions,
    report: &mut LoadReport,
) -> Result<(), ConfigError> {
    for unit in units {
        for item in &unit.items {
            match dispatch(control, &item.method, item.params.clone()) {
                Ok(_) => report.applied += 1,
                Err(error) => {
                    let error = entry_error(
                        &unit.subsystem,
                        unit.index,
                        item.batch_item,
                        &item.method,
                        error,
                    );
                    if !options.ignore_errors {
                        return Err(error);
                    }
                    tracing::warn!("config: ignoring {error}");
                    report.ignored.push(error);
                }
            }
        }
    }
    Ok(())
}

/// The skip list never shadows a registered method (those run instead).
#[cfg(test)]
pub(super) fn skipped_settings_are_not_registered() -> bool {
    SKIPPED_SETTINGS
        .iter()
        .flat_map(|(_, methods)| methods.iter())
        .all(|m| super::find_method(m).is_none())
}

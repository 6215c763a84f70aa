//! Option methods of SPDK modules this target does not have, which SPDK's `nvmf_tgt` writes into
//! every saved config (`rpc.py save_config`) in sections this target also loads. Each is accepted
//! because, with its module absent, no value can change what this target does; the reason is on
//! each handler. Params are checked by name and type (`deny_unknown_fields`), so a misspelt
//! option is still an error. The methods that would create something of these modules
//! (`bdev_raid_create`, `bdev_iscsi_create`, `keyring_file_add_key`) stay unknown, so a config
//! using them fails naming them (see [`super::config_loader`]).

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::Value;

use super::{parse, Control};

/// `bdev_raid_set_options` (`module/bdev/raid/bdev_raid.c`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevRaidSetOptionsParams {
    /// Rebuild window (KiB); SPDK's default 1024.
    #[serde(default)]
    pub process_window_size_kb: Option<u32>,
    /// Rebuild bandwidth cap (MiB/s, 0 = none); SPDK's default 0.
    #[serde(default)]
    pub process_max_bandwidth_mb_sec: Option<u32>,
}

/// Tunes rebuilds of RAID bdevs; no RAID bdev can exist here (`bdev_raid_create` is unknown),
/// so any value is inert.
pub fn bdev_raid_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    parse::<BdevRaidSetOptionsParams>(params)?;
    Ok(Value::Bool(true))
}

/// `bdev_iscsi_set_options` (`module/bdev/iscsi/bdev_iscsi.c`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevIscsiSetOptionsParams {
    /// iSCSI initiator request timeout (s); SPDK's default 30.
    #[serde(default)]
    pub timeout_sec: Option<u64>,
}

/// The timeout of iSCSI-initiator bdevs; none can exist here (`bdev_iscsi_create` is unknown),
/// so any value is inert.
pub fn bdev_iscsi_set_options(_: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    parse::<BdevIscsiSetOptionsParams>(params)?;
    Ok(Value::Bool(true))
}

/// `keyring_linux_set_options` (`module/keyring/linux/keyring.c`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyringLinuxSetOptionsParams {
    #[serde(default)]
    pub enable: Option<bool>,
}

/// Lets SPDK resolve key names from the kernel keyring. Keys are only ever looked up for TLS
/// PSKs and DH-HMAC-CHAP, which this target refuses where they are asked for (a host with a key,
/// a secure listener), so nothing here looks a key up and either value is inert.
pub fn keyring_linux_set_options(
    _: &mut Control,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    parse::<KeyringLinuxSetOptionsParams>(params)?;
    Ok(Value::Bool(true))
}

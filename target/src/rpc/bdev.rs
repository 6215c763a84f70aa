//! Bdev methods (`lib/bdev/bdev_rpc.c` and the modules' `*_rpc.c`): the create/delete/inject
//! handlers live with each backend in `crate::bdev`; this file decodes their params and adds
//! `bdev_get_bdevs` and the bdev part of `framework_get_config`.
//!
//! SPDK parameters a backend's own params struct does not carry are taken out here first
//! ([`take_extra`]) and refused unless at their default, naming the parameter:
//! - `bdev_null_create`: `preferred_write_granularity`, `preferred_write_alignment`,
//!   `optimal_write_size`, `preferred_unmap_granularity`, `preferred_unmap_alignment` (I/O
//!   hints SPDK reports in Identify Namespace; none are reported here), 0 only.
//! - `bdev_aio_create`: `nowait` (submit with `RWF_NOWAIT`, failing creation on files that
//!   cannot): false only (rpc.py 26.01 and later always send it).

use std::collections::HashSet;

use nvmf_rpc::RpcError;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{einval, parse, Control};
use crate::bdev::{aio, delay, error_inject, malloc, null, split, uring, util, BdevRef, IoKind};

macro_rules! wire {
    ($name:ident, $module:ident :: $handler:ident) => {
        pub fn $name(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
            $module::$handler(&mut c.target.bdevs, parse(params)?)
        }
    };
}

wire!(bdev_malloc_create, malloc::rpc_bdev_malloc_create);
wire!(bdev_malloc_delete, malloc::rpc_bdev_malloc_delete);
wire!(bdev_null_delete, null::rpc_bdev_null_delete);
wire!(bdev_aio_delete, aio::rpc_bdev_aio_delete);
wire!(bdev_uring_create, uring::rpc_bdev_uring_create);
wire!(bdev_uring_delete, uring::rpc_bdev_uring_delete);
wire!(bdev_delay_create, delay::rpc_bdev_delay_create);
wire!(bdev_delay_delete, delay::rpc_bdev_delay_delete);
wire!(
    bdev_delay_update_latency,
    delay::rpc_bdev_delay_update_latency
);
/// A method that may change a bdev's size: once it succeeds, the hosts of the namespaces
/// whose size moved are told (Namespace Attribute Changed).
macro_rules! wire_resize {
    ($name:ident, $module:ident :: $handler:ident) => {
        pub fn $name(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
            let answer = $module::$handler(&mut c.target.bdevs, parse(params)?)?;
            c.target.announce_resized_namespaces();
            Ok(answer)
        }
    };
}

wire_resize!(bdev_null_resize, null::rpc_bdev_null_resize);
wire_resize!(bdev_aio_rescan, aio::rpc_bdev_aio_rescan);
wire_resize!(bdev_uring_rescan, uring::rpc_bdev_uring_rescan);
wire!(bdev_split_create, split::rpc_bdev_split_create);
wire!(bdev_split_delete, split::rpc_bdev_split_delete);
wire!(bdev_error_create, error_inject::rpc_bdev_error_create);
wire!(bdev_error_delete, error_inject::rpc_bdev_error_delete);
wire!(
    bdev_error_inject_error,
    error_inject::rpc_bdev_error_inject_error
);
wire!(
    bdev_error_resume_pending,
    error_inject::rpc_bdev_error_resume_pending
);

/// Removes the named members from object `params` and decodes each (a missing one is `None`);
/// the rest is left for the backend's struct. A mistyped member is `-32602` naming it.
fn take_extra<T: DeserializeOwned, const N: usize>(
    params: &mut Option<Value>,
    names: [&'static str; N],
) -> Result<[(&'static str, Option<T>); N], RpcError> {
    let mut out = names.map(|name| (name, None));
    if let Some(Value::Object(map)) = params {
        for (name, slot) in &mut out {
            if let Some(v) = map.remove(*name) {
                *slot = Some(serde_json::from_value(v).map_err(|e| {
                    RpcError::invalid_params(format!("Invalid parameters: {name}: {e}"))
                })?);
            }
        }
    }
    Ok(out)
}

/// `-EINVAL` naming the first extra parameter set to something other than `default`.
fn refuse_non_default<T: PartialEq>(
    extras: &[(&'static str, Option<T>)],
    default: &T,
    why: &str,
) -> Result<(), RpcError> {
    match extras
        .iter()
        .find(|(_, v)| v.as_ref().is_some_and(|v| v != default))
    {
        Some((name, _)) => Err(einval(format!("{name}: {why}"))),
        None => Ok(()),
    }
}

pub fn bdev_null_create(c: &mut Control, mut params: Option<Value>) -> Result<Value, RpcError> {
    let hints = take_extra::<u32, 5>(
        &mut params,
        [
            "preferred_write_granularity",
            "preferred_write_alignment",
            "optimal_write_size",
            "preferred_unmap_granularity",
            "preferred_unmap_alignment",
        ],
    )?;
    let p = parse(params)?;
    refuse_non_default(
        &hints,
        &0,
        "I/O size and alignment hints are not reported to hosts here",
    )?;
    null::rpc_bdev_null_create(&mut c.target.bdevs, p)
}

pub fn bdev_aio_create(c: &mut Control, mut params: Option<Value>) -> Result<Value, RpcError> {
    let nowait = take_extra::<bool, 1>(&mut params, ["nowait"])?;
    let p = parse(params)?;
    refuse_non_default(
        &nowait,
        &false,
        "RWF_NOWAIT submission is not supported by the aio bdev here",
    )?;
    aio::rpc_bdev_aio_create(&mut c.target.bdevs, p)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevGetBdevsParams {
    #[serde(default)]
    pub name: Option<String>,
    /// SPDK waits this long (ms) for a named bdev to appear through examine. Bdevs appear here
    /// only through RPCs, which cannot run while this one holds the control plane, so waiting
    /// could not change the answer.
    #[serde(default)]
    pub timeout: Option<u64>,
}

pub fn bdev_get_bdevs(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: BdevGetBdevsParams = parse(params)?;
    let _ = p.timeout;
    let bdevs = &c.target.bdevs;
    match p.name {
        Some(name) => {
            let bdev = bdevs.get(&name).ok_or_else(|| {
                RpcError::errno(libc::ENODEV, format!("No such device: bdev {name}"))
            })?;
            Ok(json!([describe(c, bdev)]))
        }
        None => Ok(Value::Array(bdevs.iter().map(|b| describe(c, b)).collect())),
    }
}

/// One bdev in SPDK's `bdev_get_bdevs` shape.
fn describe(c: &Control, bdev: &BdevRef) -> Value {
    let claimed = c.target.bdevs.claimed_by(bdev.name()).is_some();
    let mut io_types = Map::new();
    for (name, supported) in [
        ("read", bdev.supports(IoKind::Read)),
        ("write", bdev.supports(IoKind::Write) && !bdev.read_only()),
        ("unmap", bdev.supports(IoKind::Unmap) && !bdev.read_only()),
        ("flush", bdev.supports(IoKind::Flush)),
        ("reset", false),
        ("nvme_admin", false),
        ("nvme_io", false),
        (
            "write_zeroes",
            bdev.supports(IoKind::WriteZeroes) && !bdev.read_only(),
        ),
        ("compare", false),
        ("compare_and_write", false),
        ("abort", false),
        ("seek_hole", false),
        ("seek_data", false),
        ("copy", false),
        ("nvme_iov_md", false),
    ] {
        io_types.insert(name.into(), Value::Bool(supported));
    }
    let mut v = json!({
        "name": bdev.name(),
        "aliases": [],
        "product_name": bdev.product_name(),
        "block_size": bdev.block_size(),
        "num_blocks": bdev.num_blocks(),
        "uuid": util::format_uuid(&bdev.uuid()),
        "assigned_rate_limits": {
            "rw_ios_per_sec": 0,
            "rw_mbytes_per_sec": 0,
            "r_mbytes_per_sec": 0,
            "w_mbytes_per_sec": 0
        },
        "claimed": claimed,
        "zoned": false,
        "supported_io_types": io_types,
        "driver_specific": bdev.driver_specific(),
    });
    if claimed {
        v["claim_type"] = json!("exclusive_write");
    }
    v
}

/// Create entries for every bdev, each after the bdevs it is stacked on, then
/// `bdev_wait_for_examine` as SPDK ends its bdev config.
pub fn config(c: &Control) -> Vec<Value> {
    let all: Vec<&BdevRef> = c.target.bdevs.iter().collect();
    let mut emitted: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    // Creation order already puts bases first; the loop only guards against an order that does
    // not (each pass emits every bdev whose bases are out).
    while emitted.len() < all.len() {
        let before = emitted.len();
        for b in &all {
            if emitted.contains(b.name()) {
                continue;
            }
            if b.base_bdevs()
                .iter()
                .all(|base| emitted.contains(base) || c.target.bdevs.get(base).is_none())
            {
                // A split's parts share one entry, which the first carries.
                let entry = b.config_entry();
                if !entry.is_null() {
                    out.push(entry);
                }
                emitted.insert(b.name().to_string());
            }
        }
        if emitted.len() == before {
            break;
        }
    }
    out.push(json!({"method": "bdev_wait_for_examine"}));
    out
}

//! Statistics methods in SPDK's output layouts, so SPDK's tools (`rpc.py`, `spdk_top`,
//! `iostat.py`) parse them: `nvmf_get_stats`, `bdev_get_iostat`, `thread_get_stats` and
//! `framework_get_reactors`.
//!
//! Times are in nanoseconds: every `tick_rate` is 1 000 000 000 and `ticks` counts nanoseconds
//! since the target started. Counters a reactor keeps are read by sending its poll group a
//! message and summed here; a poll group that does not answer within
//! `Control::stats_timeout` fails the call with `-ETIMEDOUT`.
//!
//! What is counted and what is reported as 0 because nothing counts it yet:
//! - `nvmf_get_stats`: every poll group field is real (qpairs by kind, cumulative and current,
//!   queued bdev I/O, completed I/O commands). The RDMA `transports` entries list real device
//!   names but all their counters are 0 (see `RdmaPollGroup::dump_stats`).
//! - `bdev_get_iostat`: reads and writes (ops, bytes, latency sum, max, min) are real; unmap and
//!   copy are 0 (not counted); `io_error` holds the failed I/O count as `failed`. Per channel,
//!   bytes are 0 (kept per namespace, not per reactor) and ops come from the latency
//!   histograms.
//! - `thread_get_stats` / `framework_get_reactors`: busy and idle time, thread ids and
//!   `/proc/stat` CPU times are real; each reactor runs one thread (its poll group) polled as
//!   one poller; there is no interrupt mode.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::Instant;

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{check_tgt_name, parse, Control};
use crate::core::latency::{LatencyHistogram, NamespaceLatency};
use crate::core::{GroupStats, PollGroup};

/// Ticks per second of every `tick_rate`: our ticks are nanoseconds.
pub const TICK_RATE: u64 = 1_000_000_000;

/// Nanoseconds since the first call (made when the control plane starts).
pub fn ticks() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// SPDK's name of the thread running poll group `index`.
pub fn group_name(index: usize) -> String {
    format!("nvmf_tgt_poll_group_{index:03}")
}

/// The SPDK thread id of poll group `index` (SPDK numbers threads from 1).
fn thread_id(index: usize) -> u64 {
    index as u64 + 1
}

/// Asks every poll group for `f`'s answer, in poll group order.
pub fn ask_groups<T: Send + 'static>(
    c: &Control,
    f: impl Fn(&mut PollGroup) -> T + Clone + Send + 'static,
) -> Result<Vec<T>, RpcError> {
    let (tx, rx) = crossbeam::channel::unbounded::<(usize, T)>();
    let groups = c.target.poll_groups();
    for pg in groups {
        let tx = tx.clone();
        let f = f.clone();
        pg.send(move |pg| {
            let _ = tx.send((pg.core.group, f(pg)));
        });
    }
    drop(tx);
    let deadline = Instant::now() + c.stats_timeout;
    let mut answers: Vec<(usize, T)> = Vec::with_capacity(groups.len());
    while answers.len() < groups.len() {
        match rx.recv_deadline(deadline) {
            Ok(a) => answers.push(a),
            Err(_) => {
                let missing: Vec<usize> = groups
                    .iter()
                    .map(|g| g.index())
                    .filter(|i| !answers.iter().any(|(a, _)| a == i))
                    .collect();
                return Err(RpcError::errno(
                    libc::ETIMEDOUT,
                    format!(
                        "poll groups {missing:?} did not answer within {:?}",
                        c.stats_timeout
                    ),
                ));
            }
        }
    }
    answers.sort_by_key(|(i, _)| *i);
    Ok(answers.into_iter().map(|(_, v)| v).collect())
}

/// SPDK's methods that take no parameters refuse any; an empty object is let through.
fn no_params(method: &str, params: Option<Value>) -> Result<(), RpcError> {
    match params {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m)) if m.is_empty() => Ok(()),
        Some(_) => Err(RpcError::invalid_params(format!(
            "'{method}' requires no arguments"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// nvmf_get_stats

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetStatsParams {
    #[serde(default)]
    pub tgt_name: Option<String>,
}

struct GroupSample {
    stats: GroupStats,
    qpairs: usize,
    transports: Vec<Map<String, Value>>,
}

/// SPDK's layout: `{"tick_rate", "poll_groups": [{"name", "admin_qpairs", "io_qpairs",
/// "current_admin_qpairs", "current_io_qpairs", "current_unassociated_qpairs",
/// "pending_bdev_io", "completed_nvme_io", "transports": [{"trtype", ...}]}]}`.
pub fn nvmf_get_stats(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: GetStatsParams = parse(params)?;
    check_tgt_name(p.tgt_name.as_deref())?;
    let samples = ask_groups(c, |pg| GroupSample {
        stats: pg.core.stats,
        qpairs: pg.qpair_count(),
        transports: pg.transport_stats(),
    })?;
    let trtypes: Vec<&str> = c.target.transports().iter().map(|t| t.trtype()).collect();
    let groups: Vec<Value> = samples
        .into_iter()
        .enumerate()
        .map(|(index, s)| {
            let st = s.stats;
            // Queues whose Connect has not succeeded yet belong to no controller.
            let unassociated =
                (s.qpairs as u64).saturating_sub(st.current_admin_qpairs + st.current_io_qpairs);
            let transports: Vec<Value> = s
                .transports
                .into_iter()
                .enumerate()
                .map(|(i, fields)| {
                    let mut t = Map::new();
                    let trtype = trtypes.get(i).copied().unwrap_or("UNKNOWN");
                    t.insert("trtype".into(), trtype.into());
                    t.extend(fields);
                    Value::Object(t)
                })
                .collect();
            json!({
                "name": group_name(index),
                "admin_qpairs": st.admin_qpairs,
                "io_qpairs": st.io_qpairs,
                "current_admin_qpairs": st.current_admin_qpairs,
                "current_io_qpairs": st.current_io_qpairs,
                "current_unassociated_qpairs": unassociated,
                "pending_bdev_io": st.pending_bdev_io,
                "completed_nvme_io": st.completed_nvme_io,
                "transports": transports,
            })
        })
        .collect();
    Ok(json!({"tick_rate": TICK_RATE, "poll_groups": groups}))
}

// ---------------------------------------------------------------------------------------------
// bdev_get_iostat

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetIostatParams {
    /// One bdev (SPDK before 24.05).
    #[serde(default)]
    pub name: Option<String>,
    /// Several bdevs (SPDK 24.05 on).
    #[serde(default)]
    pub names: Option<Vec<String>>,
    #[serde(default)]
    pub per_channel: bool,
    #[serde(default)]
    pub reset_mode: Option<String>,
}

/// Reads and writes of one bdev, over the namespaces it backs.
#[derive(Default)]
struct BdevCounts {
    bytes_read: u64,
    num_read_ops: u64,
    bytes_written: u64,
    num_write_ops: u64,
    errors: u64,
    latency: NamespaceLatency,
}

fn latency_fields(out: &mut Map<String, Value>, kind: &str, h: &LatencyHistogram) {
    out.insert(format!("{kind}_latency_ticks"), h.sum_ns.into());
    out.insert(format!("max_{kind}_latency_ticks"), h.max_ns.into());
    // SPDK reports a minimum never set (no I/O yet) as 0.
    let min = if h.min_ns == u64::MAX { 0 } else { h.min_ns };
    out.insert(format!("min_{kind}_latency_ticks"), min.into());
}

/// `spdk_bdev_dump_io_stat_json`'s fields, in its order.
fn io_stat_json(out: &mut Map<String, Value>, n: &BdevCounts) {
    for (k, v) in [
        ("bytes_read", n.bytes_read),
        ("num_read_ops", n.num_read_ops),
        ("bytes_written", n.bytes_written),
        ("num_write_ops", n.num_write_ops),
        // Deallocate and copy commands are not counted yet.
        ("bytes_unmapped", 0),
        ("num_unmap_ops", 0),
        ("bytes_copied", 0),
        ("num_copy_ops", 0),
    ] {
        out.insert(k.into(), v.into());
    }
    let none = LatencyHistogram::default();
    latency_fields(out, "read", &n.latency.read);
    latency_fields(out, "write", &n.latency.write);
    latency_fields(out, "unmap", &none);
    latency_fields(out, "copy", &none);
    // SPDK lists only the error statuses that occurred, by bdev status name.
    let mut io_error = Map::new();
    if n.errors > 0 {
        io_error.insert("failed".into(), n.errors.into());
    }
    out.insert("io_error".into(), Value::Object(io_error));
}

/// SPDK's layout: `{"tick_rate", "ticks", "bdevs": [{"name", <io stat>}]}`, or with
/// `per_channel` (one bdev) `{"tick_rate", "ticks", "name", "channels": [{"thread_id",
/// <io stat>}]}`, one channel per reactor with a channel to the bdev.
pub fn bdev_get_iostat(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    let p: GetIostatParams = parse(params)?;
    match p.reset_mode.as_deref() {
        None | Some("none") => {}
        Some(mode @ ("all" | "maxmin" | "error")) => {
            return Err(RpcError::errno(
                libc::EOPNOTSUPP,
                format!("reset_mode {mode}: statistics cannot be reset"),
            ))
        }
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "Invalid parameters: reset_mode: unknown mode {other:?} (all, maxmin, error, none)"
            )))
        }
    }
    let wanted: Option<Vec<String>> = match (p.name, p.names) {
        (Some(_), Some(_)) => {
            return Err(RpcError::invalid_params(
                "Invalid parameters: give name or names, not both",
            ))
        }
        (Some(n), None) => Some(vec![n]),
        (None, names) => names,
    };
    if p.per_channel && wanted.as_ref().is_none_or(|w| w.len() != 1) {
        return Err(RpcError::errno(
            libc::EINVAL,
            "Can't use per_channel with multiple bdevs",
        ));
    }
    let names: Vec<String> = match wanted {
        Some(w) => {
            if let Some(missing) = w.iter().find(|n| c.target.bdevs.get(n).is_none()) {
                return Err(RpcError::errno(
                    libc::ENODEV,
                    format!("No such device: bdev {missing}"),
                ));
            }
            w
        }
        None => c
            .target
            .bdevs
            .iter()
            .map(|b| b.name().to_string())
            .collect(),
    };
    // (subsystem NQN, NSID) -> bdev, for the reactors' latency histograms.
    let mut backing: BTreeMap<(String, u32), String> = BTreeMap::new();
    let mut totals: BTreeMap<String, BdevCounts> = BTreeMap::new();
    for s in c.target.subsystems() {
        for ns in s.namespaces.values() {
            let name = ns.bdev.name().to_string();
            backing.insert((s.nqn.clone(), ns.nsid), name.clone());
            let st = ns.stats.snapshot();
            let t = totals.entry(name).or_default();
            t.bytes_read += st.bytes_read;
            t.num_read_ops += st.read_ops;
            t.bytes_written += st.bytes_written;
            t.num_write_ops += st.write_ops;
            t.errors += st.errors;
        }
    }
    let per_group = ask_groups(c, |pg| pg.core.namespace_latencies())?;
    // Per reactor, the latencies of each bdev it has a channel to.
    let mut channels: Vec<BTreeMap<String, NamespaceLatency>> = Vec::new();
    for group in per_group {
        let mut mine: BTreeMap<String, NamespaceLatency> = BTreeMap::new();
        for (nqn, nsid, lat) in group {
            if let Some(bdev) = backing.get(&(nqn, nsid)) {
                let l = mine.entry(bdev.clone()).or_default();
                l.read.merge(&lat.read);
                l.write.merge(&lat.write);
            }
        }
        for (bdev, lat) in &mine {
            let t = totals.entry(bdev.clone()).or_default();
            t.latency.read.merge(&lat.read);
            t.latency.write.merge(&lat.write);
        }
        channels.push(mine);
    }
    if p.per_channel {
        let name = &names[0];
        let list: Vec<Value> = channels
            .iter()
            .enumerate()
            .filter_map(|(index, mine)| {
                let lat = mine.get(name)?;
                let counts = BdevCounts {
                    num_read_ops: lat.read.count(),
                    num_write_ops: lat.write.count(),
                    latency: *lat,
                    ..Default::default()
                };
                let mut o = Map::new();
                o.insert("thread_id".into(), thread_id(index).into());
                io_stat_json(&mut o, &counts);
                Some(Value::Object(o))
            })
            .collect();
        return Ok(json!({
            "tick_rate": TICK_RATE,
            "ticks": ticks(),
            "name": name,
            "channels": list,
        }));
    }
    let bdevs: Vec<Value> = names
        .iter()
        .map(|name| {
            let mut o = Map::new();
            o.insert("name".into(), name.clone().into());
            io_stat_json(&mut o, totals.get(name).unwrap_or(&BdevCounts::default()));
            Value::Object(o)
        })
        .collect();
    Ok(json!({"tick_rate": TICK_RATE, "ticks": ticks(), "bdevs": bdevs}))
}

// ---------------------------------------------------------------------------------------------
// thread_get_stats, framework_get_reactors

/// SPDK's cpumask string (`spdk_cpuset_fmt`): hex, no `0x`.
fn cpumask(core: usize) -> String {
    format!("{:x}", 1u128 << (core % 128))
}

/// The NUMA node of `core` (SPDK's -1 when unknown).
fn numa_id(core: usize) -> i64 {
    std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{core}"))
        .ok()
        .and_then(|dir| {
            dir.flatten().find_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("node")?
                    .parse::<i64>()
                    .ok()
            })
        })
        .unwrap_or(-1)
}

/// `(usr, sys, irq)` of `core` from `/proc/stat`, in USER_HZ ticks as SPDK reports them;
/// zeros when unreadable.
fn proc_stat(core: usize) -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let label = format!("cpu{core}");
    text.lines()
        .find_map(|line| {
            let mut f = line.split_whitespace();
            if f.next()? != label {
                return None;
            }
            // user nice system idle iowait irq ...
            let v: Vec<u64> = f.take(6).map(|x| x.parse().unwrap_or(0)).collect();
            (v.len() == 6).then(|| (v[0], v[2], v[5]))
        })
        .unwrap_or((0, 0, 0))
}

/// One reactor as SPDK's lightweight thread on it.
fn thread_json(index: usize, core: usize) -> Map<String, Value> {
    let mut t = Map::new();
    t.insert("name".into(), group_name(index).into());
    t.insert("id".into(), thread_id(index).into());
    t.insert("cpumask".into(), cpumask(core).into());
    t
}

/// SPDK's layout: `{"tick_rate", "threads": [{"name", "id", "cpumask", "busy", "idle",
/// "active_pollers_count", "timed_pollers_count", "paused_pollers_count"}]}`, one thread per
/// reactor (its poll group).
pub fn thread_get_stats(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params("thread_get_stats", params)?;
    let threads: Vec<Value> = c
        .reactors
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let mut t = thread_json(index, r.core);
            t.insert(
                "busy".into(),
                r.stats.busy_ns.load(Ordering::Relaxed).into(),
            );
            t.insert(
                "idle".into(),
                r.stats.idle_ns.load(Ordering::Relaxed).into(),
            );
            // The poll group is one poller; its 10 ms housekeeping runs inside that poll.
            t.insert("active_pollers_count".into(), 1.into());
            t.insert("timed_pollers_count".into(), 0.into());
            t.insert("paused_pollers_count".into(), 0.into());
            Value::Object(t)
        })
        .collect();
    Ok(json!({"tick_rate": TICK_RATE, "threads": threads}))
}

/// SPDK's layout: `{"tick_rate", "pid", "reactors": [{"lcore", "numa_id", "tid", "busy",
/// "idle", "in_interrupt", "irq", "sys", "usr", "lw_threads": [{"name", "id", "cpumask",
/// "elapsed"}]}]}`.
pub fn framework_get_reactors(c: &mut Control, params: Option<Value>) -> Result<Value, RpcError> {
    no_params("framework_get_reactors", params)?;
    let reactors: Vec<Value> = c
        .reactors
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let (busy, idle) = (
                r.stats.busy_ns.load(Ordering::Relaxed),
                r.stats.idle_ns.load(Ordering::Relaxed),
            );
            let (usr, sys, irq) = proc_stat(r.core);
            let mut thread = thread_json(index, r.core);
            // The thread has lived on this reactor since it started.
            thread.insert("elapsed".into(), (busy + idle).into());
            json!({
                "lcore": r.core,
                "numa_id": numa_id(r.core),
                "tid": r.stats.tid.load(Ordering::Relaxed),
                "busy": busy,
                "idle": idle,
                // Asleep on its completion channels and waker right now (--poll-mode
                // adaptive); SPDK reports its interrupt mode here.
                "in_interrupt": r.stats.asleep.load(Ordering::Relaxed),
                "irq": irq,
                "sys": sys,
                "usr": usr,
                "lw_threads": [thread],
            })
        })
        .collect();
    Ok(json!({
        "tick_rate": TICK_RATE,
        "pid": std::process::id(),
        "reactors": reactors,
    }))
}

//! `nvmf-perf`: NVMe-oF I/O benchmark with `spdk_nvme_perf`'s flags.
//!
//! Workers are threads pinned to the cores of `-c`, each polling its own I/O qpairs. As in
//! spdk_nvme_perf, namespaces and workers are paired round robin (`max(namespaces, workers)`
//! associations); each association has `-P` qpairs sharing its queue depth `-q`. The main
//! thread polls the controllers' admin queues (keep-alive, events, reconnect) and prints the
//! progress line.
//!
//! A transport ID without `subnqn` names a discovery service: as spdk_nvme_perf does, every
//! NVM subsystem it lists is attached ([`attach_plan`]). The command line is in [`args`], the
//! polling threads in [`worker`], the final report in [`report`].
//!
//! Multipath (`--multipath`, on unless `disable`): transport IDs naming one subsystem at
//! several addresses become the paths of its namespaces. Each association's qpair is then a
//! [`MultipathQpair`] over one qpair per path; the main thread reads each path's ANA log at
//! start, on ANA change notices, after a reconnect and when an I/O saw an ANA status, and
//! publishes the states through [`PathHandle`]s. A path whose controller is lost is a
//! warning, not a failure, while another path serves the namespace.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use nvmf_common::buffer::BufferPool;
use nvmf_common::reactor::{check_cores, parse_core_mask};
use nvmf_initiator::path::{apply_ana_log, refresh_ana, refresh_requested};
use nvmf_initiator::{
    attach_plan, discover, multipath, Controller, ControllerEvent, ControllerOptions, IoQpair,
    MultipathQpair, MultipathStats, NamespaceInfo, NamespacePath, PathHandle, QpairStats,
    Reconnect, Timers, TransportId,
};

mod args;
mod report;
mod worker;
mod zipf;

use args::{Args, MultipathMode};
use report::{print_transport_stats, report, KeyUse};
use worker::{worker, Idle, Live, NsCtx, Pattern, Plan, Qp, Stats};
use zipf::Zipf;

fn options(args: &Args) -> anyhow::Result<ControllerOptions> {
    let reconnect = match (args.reconnect_delay, args.ctrl_loss_tmo) {
        (None, None) => None,
        (delay, tmo) => Some(Reconnect {
            delay: Duration::from_secs(delay.unwrap_or(10)),
            ctrl_loss_tmo: match tmo {
                None => Some(Duration::from_secs(600)),
                Some(t) if t < 0 => None,
                Some(t) => Some(Duration::from_secs(t as u64)),
            },
        }),
    };
    Ok(ControllerOptions {
        hostnqn: args.hostnqn.clone(),
        kato: args.keep_alive(),
        connect_timeout: Duration::from_secs(args.connect_timeout.max(1)),
        io_timeout: Duration::from_secs(args.io_timeout.max(1)),
        admin_timeout: Duration::from_secs(args.io_timeout.max(1) * 2),
        in_capsule_data: args.in_capsule != 0,
        memory_windows: args.memory_windows,
        reconnect,
        ..ControllerOptions::default()
    })
}

fn run(args: Args) -> anyhow::Result<bool> {
    let pattern = Pattern::parse(&args.pattern)?;
    if let Some(m) = args.rwmixread {
        if m > 100 {
            bail!("-M {m}: a percentage is 0-100");
        }
    }
    if args.queue_depth == 0 || args.io_size == 0 || args.qpairs == 0 || args.time == 0 {
        bail!("-q, -o, -P and -t must be above 0");
    }
    if let Some(refused) = args.unsupported().first() {
        bail!("{refused}");
    }
    for n in args.notices() {
        eprintln!("nvmf-perf: {n}");
    }
    if args.continue_on_error == Some(0) {
        bail!("-Q: the value must be above 0");
    }
    if args
        .io_queue_size
        .is_some_and(|n| n < 2 || n > u32::from(u16::MAX))
    {
        bail!("--io-queue-size: 2-65535 entries");
    }
    let zipf_theta = args.zipf.filter(|&t| t != 0.0);
    if let Some(t) = zipf_theta {
        if !pattern.random() {
            eprintln!("nvmf-perf: -F ignored: it applies to random patterns only");
        }
        Zipf::new(2, t).map_err(anyhow::Error::msg)?;
    }
    if args.rwmixread.is_some()
        && matches!(
            pattern,
            Pattern::Read | Pattern::Write | Pattern::RandRead | Pattern::RandWrite
        )
    {
        eprintln!("nvmf-perf: -M ignored: it applies to rw and randrw only");
    }
    let cores = parse_core_mask(&args.core_mask)?;
    check_cores(&cores)?;
    let given: Vec<TransportId> = args
        .transport
        .iter()
        .map(|s| {
            s.parse::<TransportId>()
                .with_context(|| format!("-r {s:?}"))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut opts = options(&args)?;
    let say = |s: String| {
        if !args.json {
            println!("{s}");
        } else {
            eprintln!("{s}");
        }
    };

    say("Initializing NVMe Controllers".into());
    // A transport ID without subnqn: the subsystems its discovery service lists.
    let mut tids: Vec<TransportId> = Vec::new();
    for tid in given {
        if !tid.is_discovery() {
            if !tids.contains(&tid) {
                tids.push(tid);
            }
            continue;
        }
        let log = discover(&tid, &opts)
            .with_context(|| format!("discovery at {}:{}", tid.traddr, tid.trsvcid))?;
        let plan = attach_plan(&tid, &log);
        for why in &plan.skipped {
            eprintln!("nvmf-perf: skipping {why}");
        }
        if plan.attach.is_empty() {
            eprintln!(
                "nvmf-perf: the discovery service at {}:{} lists no NVM subsystem to attach",
                tid.traddr, tid.trsvcid
            );
        }
        for t in plan.attach {
            if !tids.contains(&t) {
                tids.push(t);
            }
        }
    }
    let policy = match args.multipath {
        MultipathMode::Disable => None,
        MultipathMode::On(p) => Some(p),
    };
    let groups = path_groups(&tids, policy.is_some());
    let mut ctrls: Vec<Controller> = Vec::new();
    // Per controller: the multipath namespaces it is a path of (their ANA states).
    let mut ana_paths: Vec<Vec<NamespacePath>> = Vec::new();
    let mut unused: Vec<IoQpair> = Vec::new();
    let mut namespaces: Vec<Target> = Vec::new();
    for group in &groups {
        let first = ctrls.len();
        for (k, &t) in group.iter().enumerate() {
            let tid = &tids[t];
            // Ask for enough I/O queues for every association this controller could get.
            opts.io_queues = 0;
            opts.io_queues_requested = (cores.len() * args.qpairs as usize * 8
                + args.unused_qpairs as usize)
                .min(1024) as u16;
            let mut o = opts.clone();
            if group.len() > 1 && o.reconnect.is_none() {
                // A failed path comes back by reconnecting in the background.
                o.reconnect = Some(MULTIPATH_RECONNECT);
            }
            let mut ctrl = if k == 0 {
                Controller::connect(tid, o)
            } else {
                // One protection domain for all paths: one buffer registration serves them.
                Controller::connect_with_pd(tid, o, ctrls[first].pd())
            }
            .with_context(|| format!("connecting to {tid}"))?;
            say(format!(
                "Attached to NVMe over Fabrics controller at {}: {} (cntlid {}, {} I/O queues)",
                ctrl.peer(),
                tid.subnqn,
                ctrl.info().cntlid,
                ctrl.granted_io_queues()
            ));
            if args.io_size > ctrl.max_transfer() {
                bail!(
                    "-o {}: above the controller's maximum transfer of {} bytes",
                    args.io_size,
                    ctrl.max_transfer()
                );
            }
            for _ in 0..args.unused_qpairs {
                // -U: connected and never used, as spdk_nvme_perf's unused qpairs.
                let depth = args.io_queue_size.unwrap_or(2).min(u32::from(u16::MAX)) as u16;
                unused.push(
                    ctrl.create_io_qpair(depth)
                        .with_context(|| format!("connecting an unused I/O qpair on {tid}"))?,
                );
            }
            ctrls.push(ctrl);
            ana_paths.push(Vec::new());
        }
        let tid = &tids[group[0]];
        let ids = match tid.ns {
            Some(ns) => vec![ns],
            None => ctrls[first]
                .active_namespaces()
                .context("listing namespaces")?,
        };
        for nsid in ids {
            let Some(ns) = ctrls[first].namespace(nsid)? else {
                eprintln!(
                    "nvmf-perf: namespace {nsid} of {} is not active",
                    tid.subnqn
                );
                continue;
            };
            let label = if group.len() > 1 {
                format!(
                    "RDMA (subnqn:{} {} paths) NSID {nsid}",
                    tid.subnqn,
                    group.len()
                )
            } else {
                format!(
                    "RDMA (addr:{} subnqn:{}) NSID {nsid}",
                    tid.traddr, tid.subnqn
                )
            };
            // `is_multiple_of` is newer than the workspace's rust-version.
            #[allow(clippy::manual_is_multiple_of)]
            let misaligned = args.io_size % ns.block_size != 0;
            if misaligned {
                eprintln!(
                    "nvmf-perf: skipping {label}: -o {} is not a multiple of its block size {}",
                    args.io_size, ns.block_size
                );
                continue;
            }
            if u64::from(args.io_size) > ns.blocks * u64::from(ns.block_size) {
                eprintln!("nvmf-perf: skipping {label}: smaller than one I/O");
                continue;
            }
            let members: Vec<usize> = (first..first + group.len()).collect();
            let mut target = Target {
                ctrls: members.clone(),
                handles: Vec::new(),
                path_labels: Vec::new(),
                ns,
                label,
            };
            if group.len() > 1 {
                let mut seen: Option<(multipath::NamespaceIds, std::net::SocketAddr)> = None;
                for &ci in &members {
                    let c = &mut ctrls[ci];
                    let peer = c.peer();
                    let here = c.namespace(nsid)?.with_context(|| {
                        format!("namespace {nsid} is not active on the path at {peer}")
                    })?;
                    if here != ns {
                        bail!(
                            "{}: the path at {peer} reports {} blocks of {} bytes, the first \
                             {} of {}",
                            target.label,
                            here.blocks,
                            here.block_size,
                            ns.blocks,
                            ns.block_size
                        );
                    }
                    let (ids, anagrpid) = c
                        .namespace_ids(nsid)
                        .with_context(|| format!("identifying namespace {nsid} at {peer}"))?;
                    if let Some((first_ids, first_peer)) = &seen {
                        multipath::same_namespace(first_ids, &ids).map_err(|e| {
                            anyhow::anyhow!(
                                "NSID {nsid} at {first_peer} and at {peer} are not one \
                                 namespace: {e}"
                            )
                        })?;
                    } else {
                        seen = Some((ids, peer));
                    }
                    let state = c
                        .ana_state(nsid, anagrpid)
                        .with_context(|| format!("reading the ANA log at {peer}"))?;
                    say(format!("  path {peer}: NSID {nsid} {ids}, ANA {state}"));
                    let handle = PathHandle::new(state);
                    ana_paths[ci].push(NamespacePath {
                        nsid,
                        anagrpid,
                        handle: handle.clone(),
                    });
                    target.handles.push(handle);
                    target.path_labels.push(peer.to_string());
                }
            }
            namespaces.push(target);
        }
    }
    if namespaces.is_empty() {
        bail!("no namespace to run on");
    }

    let mut per_core: Vec<Vec<NsCtx>> = (0..cores.len()).map(|_| Vec::new()).collect();
    let mut zipfs: Vec<Option<Arc<Zipf>>> = vec![None; namespaces.len()];
    for (n, w) in associations(namespaces.len(), cores.len(), args.use_every_core) {
        let target = &namespaces[n];
        let (ns, label) = (target.ns, target.label.clone());
        let p = args.qpairs as usize;
        let per_qp = args.queue_depth.div_ceil(args.qpairs).max(1);
        let mut qpairs = Vec::with_capacity(p);
        for _ in 0..p {
            // One more entry than outstanding commands would be needed for a strict SQ
            // full check; Linux and SPDK size the queue at the depth, as here.
            let entries = args.io_queue_size.unwrap_or(per_qp);
            let entries = entries.max(2).min(u32::from(u16::MAX)) as u16;
            let mut legs = Vec::with_capacity(target.ctrls.len());
            for &ci in &target.ctrls {
                legs.push(
                    ctrls[ci]
                        .create_io_qpair(entries)
                        .with_context(|| format!("connecting an I/O qpair for {label}"))?,
                );
            }
            let mut qp = match policy {
                Some(policy) if legs.len() > 1 => {
                    let timers = Timers {
                        fast_io_fail: (args.fast_io_fail_timeout_sec > 0)
                            .then(|| Duration::from_secs(args.fast_io_fail_timeout_sec)),
                        anatt: ctrls[target.ctrls[0]].ana_transition_time(),
                        ..Timers::default()
                    };
                    let legs = legs
                        .into_iter()
                        .zip(target.handles.iter().cloned())
                        .collect();
                    Qp::Multi(Box::new(MultipathQpair::new(legs, policy, timers)))
                }
                _ => Qp::One(Box::new(legs.pop().expect("one path"))),
            };
            qp.set_max_completions(args.max_completions);
            qpairs.push(qp);
        }
        let ctrl = &ctrls[target.ctrls[0]];
        let path_labels = target.path_labels.clone();
        let depth = args
            .queue_depth
            .min(qpairs.iter().map(|q| u32::from(q.depth())).sum());
        let buf_size = (args.io_size as usize).next_multiple_of(4096);
        let pool = BufferPool::new(buf_size, depth).context("allocating data buffers")?;
        ctrl.register_pool(&pool)?;
        let mut bufs = Vec::with_capacity(depth as usize);
        for i in 0..depth {
            let mut b = pool.get().expect("the pool has depth buffers");
            b.set_len(args.io_size as usize);
            for (j, x) in b.iter_mut().enumerate() {
                *x = (j as u8).wrapping_add(i as u8);
            }
            bufs.push(Some(b));
        }
        let blocks_per_io = u64::from(args.io_size / ns.block_size);
        let slots = ns.blocks / blocks_per_io;
        let zipf = match (zipf_theta, &zipfs[n]) {
            (None, _) => None,
            (Some(_), Some(z)) => Some(Arc::clone(z)),
            (Some(t), None) => {
                let z = Arc::new(Zipf::new(slots, t).map_err(anyhow::Error::msg)?);
                zipfs[n] = Some(Arc::clone(&z));
                Some(z)
            }
        };
        say(format!("Associating {label} with lcore {}", cores[w]));
        per_core[w].push(NsCtx {
            label,
            ns,
            core: cores[w],
            qp_of: (0..depth as usize).map(|t| t % p).collect(),
            qpairs,
            path_labels,
            mp_stats: MultipathStats::default(),
            bufs,
            start: vec![Instant::now(); depth as usize],
            is_read: vec![false; depth as usize],
            depth,
            blocks_per_io,
            slots,
            seq: 0,
            zipf,
            retry: Vec::new(),
            stats: Stats::default(),
            failed: None,
        });
    }
    say("Initialization complete. Launching workers.".into());

    let plan = Arc::new(Plan {
        pattern,
        read_pct: pattern.read_percent(args.rwmixread),
        io_size: args.io_size,
        fua: args.fua,
        quiet: args.continue_on_error,
        errors_seen: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&interrupted));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&interrupted));
    let live = Arc::new(Live::default());
    // After the run, outstanding I/O must finish within the I/O timeout (plus the reconnect
    // window when one is configured and bounded).
    let mut drain = Duration::from_secs(args.io_timeout.max(1) + 5);
    if let Some(r) = opts.reconnect {
        drain += r
            .ctrl_loss_tmo
            .unwrap_or(Duration::ZERO)
            .min(Duration::from_secs(120));
    }
    let started = Instant::now();
    let mut handles = Vec::new();
    for (w, ctxs) in per_core.into_iter().enumerate() {
        let (plan, stop, live) = (Arc::clone(&plan), Arc::clone(&stop), Arc::clone(&live));
        let core = cores[w];
        let idle = Idle {
            spin: args.idle_spin,
            sleep: Duration::from_micros(args.idle_sleep_us),
        };
        handles.push(
            std::thread::Builder::new()
                .name(format!("perf-{core}"))
                .spawn(move || worker(core, ctxs, plan, stop, live, drain, idle))?,
        );
    }

    // Main thread: admin queues, progress, the clock.
    let tty = std::io::stdout().is_terminal() && !args.json;
    let run_for = Duration::from_secs(args.time);
    let mut last_print = Instant::now();
    let mut last_ios = 0u64;
    let mut ctrl_errors: Vec<String> = Vec::new();
    let mut lost = vec![false; ctrls.len()];
    while !handles.iter().all(|h| h.is_finished()) {
        if started.elapsed() >= run_for || interrupted.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
        }
        for (i, c) in ctrls.iter_mut().enumerate() {
            if lost[i] {
                continue;
            }
            match c.poll_admin() {
                Ok(events) => {
                    for ev in events {
                        match ev {
                            ControllerEvent::Disconnected { reason } => eprintln!(
                                "nvmf-perf: {}: disconnected: {reason}; reconnecting",
                                c.peer()
                            ),
                            ControllerEvent::Reconnected { cntlid } => {
                                eprintln!("nvmf-perf: {}: reconnected (cntlid {cntlid})", c.peer());
                                // Its ANA states may have changed while it was away; they
                                // are read before I/O fails back to it.
                                refresh_path_states(c, &ana_paths[i]);
                            }
                            ControllerEvent::AnaChanged { log } => {
                                eprintln!("nvmf-perf: {}: ANA change notice", c.peer());
                                match log {
                                    Some(log) => apply_ana_log(&log, &ana_paths[i]),
                                    None => refresh_path_states(c, &ana_paths[i]),
                                }
                            }
                            other => eprintln!("nvmf-perf: {}: {other:?}", c.peer()),
                        }
                    }
                    // An I/O saw an ANA status through this controller: read its log again.
                    if refresh_requested(&ana_paths[i]) && c.is_live() {
                        refresh_path_states(c, &ana_paths[i]);
                    }
                }
                Err(e) => {
                    lost[i] = true;
                    eprintln!("nvmf-perf: {}: {e}", c.peer());
                    if ana_paths[i].is_empty() {
                        ctrl_errors.push(format!("{}: {e}", c.peer()));
                        stop.store(true, Ordering::Relaxed);
                    } else {
                        // One path of multipath namespaces: the others carry on.
                        eprintln!(
                            "nvmf-perf: {}: path lost; I/O continues on the others",
                            c.peer()
                        );
                    }
                }
            }
        }
        if tty && last_print.elapsed() >= Duration::from_secs(1) {
            let ios = live.ios.load(Ordering::Relaxed);
            let dt = last_print.elapsed().as_secs_f64();
            let iops = (ios - last_ios) as f64 / dt;
            print!(
                "\r[{:>4}/{} s] {:>10.0} IOPS {:>9.2} MiB/s   ",
                started.elapsed().as_secs(),
                args.time,
                iops,
                iops * f64::from(args.io_size) / (1024.0 * 1024.0)
            );
            let _ = std::io::stdout().flush();
            last_print = Instant::now();
            last_ios = ios;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = started.elapsed().min(run_for.max(Duration::from_millis(1)));
    if tty {
        println!();
    }
    let mut results: Vec<NsCtx> = Vec::new();
    for h in handles {
        results.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))?,
        );
    }
    let mut keys = KeyUse {
        windows: ctrls.iter().any(Controller::uses_memory_windows),
        ..KeyUse::default()
    };
    let mut qp_stats: Vec<(String, u16, QpairStats)> = Vec::new();
    for c in results.iter_mut() {
        for qp in c.qpairs.drain(..) {
            match qp {
                Qp::One(qp) => {
                    let st = qp.stats();
                    keys.remote_invalidations += st.remote_invalidations;
                    keys.local_invalidations += st.local_invalidations;
                    qp_stats.push((format!("{} from core {}", c.label, c.core), qp.qid(), st));
                    qp.disconnect();
                }
                Qp::Multi(qp) => {
                    c.mp_stats.merge(qp.stats());
                    for (peer, qid, st) in qp.path_stats() {
                        keys.remote_invalidations += st.remote_invalidations;
                        keys.local_invalidations += st.local_invalidations;
                        qp_stats.push((
                            format!("{} via {peer} from core {}", c.label, c.core),
                            qid,
                            st,
                        ));
                    }
                    qp.disconnect();
                }
            }
        }
    }
    for qp in unused {
        qp.disconnect();
    }
    for c in ctrls {
        let _ = c.disconnect();
    }
    let ok = report(&args, &results, elapsed, &ctrl_errors, keys)?;
    if args.transport_stats {
        print_transport_stats(&args, &qp_stats);
    }
    Ok(ok)
}

/// Reconnect policy of multipath controllers when none is given: a failed path is tried
/// again every 2 s (failback comes soon after the path returns), for nvme-cli's 600 s.
const MULTIPATH_RECONNECT: Reconnect = Reconnect {
    delay: Duration::from_secs(2),
    ctrl_loss_tmo: Some(Duration::from_secs(600)),
};

/// A namespace to run on: through one controller, or one per path.
struct Target {
    /// Indices into the controllers, in path preference order.
    ctrls: Vec<usize>,
    /// Multipath: each path's ANA state (empty for a single path).
    handles: Vec<PathHandle>,
    path_labels: Vec<String>,
    ns: NamespaceInfo,
    label: String,
}

/// Groups the transport IDs into paths of one subsystem: same subsystem NQN and host NQN
/// (in first-seen order, each group in the order given). Without multipath each is alone.
fn path_groups(tids: &[TransportId], multipath: bool) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, t) in tids.iter().enumerate() {
        let same = |g: &Vec<usize>| {
            let f = &tids[g[0]];
            f.subnqn == t.subnqn && f.hostnqn == t.hostnqn && f.ns == t.ns
        };
        match groups.iter_mut().find(|g| multipath && same(g)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// Reads a controller's ANA log for its multipath namespaces; a failure leaves the states
/// as they were (the next notice, reconnect or ANA status asks again).
fn refresh_path_states(c: &mut Controller, paths: &[NamespacePath]) {
    if paths.is_empty() {
        return;
    }
    if let Err(e) = refresh_ana(c, paths) {
        eprintln!("nvmf-perf: {}: reading the ANA log: {e}", c.peer());
    }
}

/// (namespace index, worker index) pairs. As spdk_nvme_perf: max(namespaces, workers)
/// associations, round robin; with `--use-every-core` every namespace on every worker.
fn associations(namespaces: usize, workers: usize, every_core: bool) -> Vec<(usize, usize)> {
    if namespaces == 0 || workers == 0 {
        return Vec::new();
    }
    if every_core {
        return (0..namespaces)
            .flat_map(|n| (0..workers).map(move |w| (n, w)))
            .collect();
    }
    (0..namespaces.max(workers))
        .map(|i| (i % namespaces, i % workers))
        .collect()
}

fn main() -> ExitCode {
    nvmf_initiator::init_tool_logging();
    let args = Args::parse();
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("nvmf-perf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_ids_of_one_subsystem_are_paths() {
        let t = |port: u16, nqn: &str| -> TransportId {
            format!("trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:{port} subnqn:{nqn}")
                .parse()
                .unwrap()
        };
        let tids = [t(4420, "nqn.a"), t(4420, "nqn.b"), t(4421, "nqn.a")];
        assert_eq!(path_groups(&tids, true), [vec![0, 2], vec![1]]);
        assert_eq!(path_groups(&tids, false), [vec![0], vec![1], vec![2]]);
        let mut other_host = t(4422, "nqn.a");
        other_host.hostnqn = Some("nqn.h2".into());
        let tids = [t(4420, "nqn.a"), other_host];
        assert_eq!(path_groups(&tids, true), [vec![0], vec![1]]);
    }

    #[test]
    fn associations_round_robin_or_every_core() {
        assert_eq!(associations(1, 2, false), [(0, 0), (0, 1)]);
        assert_eq!(associations(3, 2, false), [(0, 0), (1, 1), (2, 0)]);
        assert_eq!(associations(2, 2, true), [(0, 0), (0, 1), (1, 0), (1, 1)]);
        assert!(associations(0, 2, false).is_empty());
    }
}

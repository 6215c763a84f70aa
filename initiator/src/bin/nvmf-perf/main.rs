//! `nvmf-perf`: NVMe-oF I/O benchmark with `spdk_nvme_perf`'s flags.
//!
//! Workers are threads pinned to the cores of `-c`, each polling its own I/O qpairs. As in
//! spdk_nvme_perf, namespaces and workers are paired round robin (`max(namespaces, workers)`
//! associations); each association has `-P` qpairs sharing its queue depth `-q`. The main
//! thread polls the controllers' admin queues (keep-alive, events, reconnect) and prints the
//! progress line.
//!
//! A transport ID without `subnqn` names a discovery service: as spdk_nvme_perf does, every
//! NVM subsystem it lists is attached ([`attach_plan`]). The command line is in [`args`].
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
use nvmf_common::buffer::{BufferPool, IoBuf};
use nvmf_common::reactor::{check_cores, parse_core_mask};
use nvmf_common::spec::command::RW_FUA;
use nvmf_common::spec::Command;
use nvmf_initiator::path::{apply_ana_log, refresh_ana, refresh_requested};
use nvmf_initiator::{
    attach_plan, discover, multipath, Controller, ControllerEvent, ControllerOptions, DataDir,
    Histogram, IoCompletion, IoQpair, IoStatus, MultipathQpair, MultipathStats, NamespaceInfo,
    NamespacePath, PathHandle, QpairState, QpairStats, Reconnect, SubmitError, Timers, TransportId,
};
use zerocopy::byteorder::little_endian::U32;

mod args;
mod zipf;

use args::{Args, MultipathMode};
use zipf::Zipf;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pattern {
    Read,
    Write,
    RandRead,
    RandWrite,
    Rw,
    RandRw,
}

impl Pattern {
    fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "rw" => Self::Rw,
            "randrw" => Self::RandRw,
            _ => bail!("-w {s:?}: expected read, write, randread, randwrite, rw or randrw"),
        })
    }
    fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }
    fn read_percent(self, mix: Option<u32>) -> u32 {
        match self {
            Self::Read | Self::RandRead => 100,
            Self::Write | Self::RandWrite => 0,
            Self::Rw | Self::RandRw => mix.unwrap_or(50),
        }
    }
}

/// xorshift64*: a fast PRNG, plenty for LBA choice.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Counters the main thread reads for the progress line.
#[derive(Default)]
struct Live {
    ios: AtomicU64,
}

#[derive(Clone, Default)]
struct Stats {
    ios: u64,
    reads: u64,
    writes: u64,
    bytes: u64,
    errors: u64,
    hist: Histogram,
    first_error: Option<String>,
}

impl Stats {
    fn merge(&mut self, o: &Stats) {
        self.ios += o.ios;
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.hist.merge(&o.hist);
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
    }
}

/// One I/O qpair, or one per path of a multipath namespace.
enum Qp {
    // Boxed: both are large and of different sizes.
    One(Box<IoQpair>),
    Multi(Box<MultipathQpair>),
}

impl Qp {
    fn submit(
        &mut self,
        cmd: Command,
        buf: Option<IoBuf>,
        dir: DataDir,
        tag: u64,
    ) -> Result<(), SubmitError> {
        match self {
            Self::One(q) => q.submit(cmd, buf, dir, tag),
            Self::Multi(q) => q.submit(cmd, buf, dir, tag),
        }
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        match self {
            Self::One(q) => q.poll(out),
            Self::Multi(q) => q.poll(out),
        }
    }

    fn state(&self) -> QpairState {
        match self {
            Self::One(q) => q.state(),
            Self::Multi(q) => q.state(),
        }
    }

    fn failure(&self) -> Option<&str> {
        match self {
            Self::One(q) => q.failure(),
            Self::Multi(q) => q.failure(),
        }
    }

    fn depth(&self) -> u16 {
        match self {
            Self::One(q) => q.depth(),
            Self::Multi(q) => q.depth(),
        }
    }

    fn set_max_completions(&mut self, n: u32) {
        match self {
            Self::One(q) => q.set_max_completions(n),
            Self::Multi(q) => q.set_max_completions(n),
        }
    }
}

/// One namespace on one worker: its qpairs, buffers and counters.
struct NsCtx {
    label: String,
    ns: NamespaceInfo,
    core: usize,
    qpairs: Vec<Qp>,
    /// Multipath: each path's address (empty for a single path).
    path_labels: Vec<String>,
    /// Multipath: the qpairs' counters, gathered after the run.
    mp_stats: MultipathStats,
    /// Buffers not in flight, by tag.
    bufs: Vec<Option<IoBuf>>,
    start: Vec<Instant>,
    /// Each tag's qpair.
    qp_of: Vec<usize>,
    is_read: Vec<bool>,
    depth: u32,
    blocks_per_io: u64,
    slots: u64,
    seq: u64,
    zipf: Option<Arc<Zipf>>,
    /// `-Q`: tags whose submission was refused, retried on the next pass.
    retry: Vec<usize>,
    stats: Stats,
    failed: Option<String>,
}

struct Plan {
    pattern: Pattern,
    read_pct: u32,
    io_size: u32,
    fua: bool,
    /// `-Q N`: print one I/O error in every N (errors do not fail the run).
    quiet: Option<u64>,
    /// I/O errors seen by all workers, for `-Q`'s rate limit.
    errors_seen: AtomicU64,
}

impl Plan {
    /// `-Q`: prints every Nth error, saying how many were left out before it.
    fn log_error(&self, what: &dyn std::fmt::Display) {
        let Some(every) = self.quiet else { return };
        let n = self.errors_seen.fetch_add(1, Ordering::Relaxed);
        // `is_multiple_of` is newer than the workspace's rust-version.
        #[allow(clippy::manual_is_multiple_of)]
        let due = n % every == 0;
        if due {
            if n > 0 && every > 1 {
                eprintln!("nvmf-perf: (suppressed {} errors) {what}", every - 1);
            } else {
                eprintln!("nvmf-perf: {what}");
            }
        }
    }
}

impl NsCtx {
    fn submit(&mut self, tag: usize, plan: &Plan, rng: &mut Rng) -> bool {
        let Some(buf) = self.bufs[tag].take() else {
            return false;
        };
        let slot = if plan.pattern.random() {
            match &self.zipf {
                Some(z) => z.slot(rng.next()),
                None => rng.next() % self.slots,
            }
        } else {
            let s = self.seq;
            self.seq = (self.seq + 1) % self.slots;
            s
        };
        let lba = slot * self.blocks_per_io;
        let read = plan.read_pct == 100
            || (plan.read_pct > 0 && (rng.next() % 100) < u64::from(plan.read_pct));
        let nlb = self.blocks_per_io as u32;
        let qp = &mut self.qpairs[self.qp_of[tag]];
        self.start[tag] = Instant::now();
        self.is_read[tag] = read;
        let (mut cmd, dir) = if read {
            (
                Command::read(0, self.ns.nsid, lba, nlb),
                DataDir::FromController,
            )
        } else {
            (
                Command::write(0, self.ns.nsid, lba, nlb),
                DataDir::ToController,
            )
        };
        if plan.fua {
            cmd.cdw12 = U32::new(cmd.cdw12.get() | RW_FUA);
        }
        match qp.submit(cmd, Some(buf), dir, tag as u64) {
            Ok(()) => true,
            Err(e) => {
                self.bufs[tag] = e.buf;
                if plan.quiet.is_some() && qp.state() != QpairState::Failed {
                    // -Q: as spdk_nvme_perf, a refused submission waits for the next pass.
                    plan.log_error(&format_args!("starting I/O failed: {:?}", e.kind));
                    self.retry.push(tag);
                    return false;
                }
                if self.failed.is_none() {
                    self.failed = Some(match qp.failure() {
                        Some(f) => f.to_string(),
                        None => format!("submit refused: {:?}", e.kind),
                    });
                }
                false
            }
        }
    }

    fn complete(&mut self, c: IoCompletion, plan: &Plan) -> usize {
        let tag = c.tag as usize;
        let now = Instant::now();
        self.bufs[tag] = c.buf;
        if c.status.is_success() {
            let lat = now.duration_since(self.start[tag]).as_nanos() as u64;
            self.stats.hist.record(lat);
            self.stats.ios += 1;
            self.stats.bytes += u64::from(plan.io_size);
            if self.is_read[tag] {
                self.stats.reads += 1;
            } else {
                self.stats.writes += 1;
            }
        } else {
            self.stats.errors += 1;
            plan.log_error(&format_args!(
                "{} completed with error: {}",
                if self.is_read[tag] { "Read" } else { "Write" },
                c.status
            ));
            if self.stats.first_error.is_none() {
                self.stats.first_error = Some(format!(
                    "{}: {}",
                    if self.is_read[tag] { "read" } else { "write" },
                    c.status
                ));
            }
            if matches!(
                c.status,
                IoStatus::ControllerLost | IoStatus::TransportError
            ) && self.failed.is_none()
            {
                self.failed = Some(c.status.to_string());
            }
        }
        tag
    }

    fn outstanding(&self) -> usize {
        self.bufs.iter().filter(|b| b.is_none()).count()
    }
}

struct Idle {
    spin: u32,
    sleep: Duration,
}

fn worker(
    core: usize,
    mut ctxs: Vec<NsCtx>,
    plan: Arc<Plan>,
    stop: Arc<AtomicBool>,
    live: Arc<Live>,
    drain_limit: Duration,
    idle: Idle,
) -> Vec<NsCtx> {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        eprintln!("nvmf-perf: warning: could not pin the worker to core {core}");
    }
    let mut rng =
        Rng(0x9E37_79B9_7F4A_7C15 ^ (core as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let max_depth = ctxs.iter().map(|c| c.depth as usize).max().unwrap_or(1);
    let mut out: Vec<IoCompletion> = Vec::with_capacity(max_depth.max(64));
    let mut tags: Vec<usize> = Vec::with_capacity(max_depth.max(64));
    for c in ctxs.iter_mut() {
        for tag in 0..c.depth as usize {
            c.submit(tag, &plan, &mut rng);
        }
    }
    let mut drain_deadline: Option<Instant> = None;
    let mut batch = 0u64;
    let mut idle_polls = 0u32;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping && drain_deadline.is_none() {
            drain_deadline = Some(Instant::now() + drain_limit);
        }
        let mut busy = false;
        for c in ctxs.iter_mut() {
            if !stopping && c.failed.is_none() && !c.retry.is_empty() {
                for tag in std::mem::take(&mut c.retry) {
                    c.submit(tag, &plan, &mut rng);
                }
            }
            for q in 0..c.qpairs.len() {
                c.qpairs[q].poll(&mut out);
                for comp in out.drain(..) {
                    tags.push(c.complete(comp, &plan));
                }
                busy |= !tags.is_empty();
                batch += tags.len() as u64;
                if !stopping && c.failed.is_none() {
                    for &tag in &tags {
                        c.submit(tag, &plan, &mut rng);
                    }
                }
                tags.clear();
            }
            if c.failed.is_none() && c.qpairs.iter().all(|q| q.state() == QpairState::Failed) {
                c.failed = c.qpairs[0]
                    .failure()
                    .map(str::to_string)
                    .or(Some("qpair failed".into()));
            }
        }
        if busy {
            idle_polls = 0;
        } else if idle.spin > 0 {
            idle_polls += 1;
            if idle_polls >= idle.spin {
                idle_polls = 0;
                if idle.sleep.is_zero() {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(idle.sleep);
                }
            }
        }
        if batch >= 64 || !busy {
            live.ios.fetch_add(batch, Ordering::Relaxed);
            batch = 0;
        }
        let all_idle = ctxs.iter().all(|c| {
            c.outstanding() == 0 || c.qpairs.iter().all(|q| q.state() == QpairState::Failed)
        });
        if (stopping || ctxs.iter().all(|c| c.failed.is_some())) && all_idle {
            break;
        }
        if drain_deadline.is_some_and(|d| Instant::now() >= d) {
            for c in ctxs.iter_mut() {
                let n = c.outstanding();
                if n > 0 && c.failed.is_none() {
                    c.failed = Some(format!(
                        "{n} I/Os still outstanding {drain_limit:?} after the run ended"
                    ));
                }
            }
            break;
        }
        if ctxs.iter().any(|c| c.failed.is_some()) && !stopping {
            // Keep polling the others until they finish; a failed context has nothing left.
            stop.store(true, Ordering::Relaxed);
        }
    }
    live.ios.fetch_add(batch, Ordering::Relaxed);
    ctxs
}

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

/// `--transport-stats`: each I/O qpair's counters (on stdout; on stderr with `--json`).
fn print_transport_stats(args: &Args, stats: &[(String, u16, QpairStats)]) {
    let mut out = String::from("RDMA transport statistics (per I/O qpair):\n");
    for (label, qid, s) in stats {
        out += &format!(
            "{label} qid {qid}:\n  submitted {}  completed {}  timeouts {}  reconnects {}  \
             requeued {}\n  remote invalidations {}  local invalidations {}\n",
            s.submitted,
            s.completed,
            s.timeouts,
            s.reconnects,
            s.requeued,
            s.remote_invalidations,
            s.local_invalidations
        );
    }
    if args.json {
        eprint!("{out}");
    } else {
        print!("{out}");
    }
}

/// spdk_nvme_perf's `-L` cut-offs: the latency below which each fraction of the I/Os
/// completed.
const LATENCY_CUTOFFS: [f64; 15] = [
    0.01, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 0.99999, 0.999999,
    0.9999999,
];

/// `-L`: the summary (percentiles at [`LATENCY_CUTOFFS`]); `-LL`: also every non-empty
/// bucket with the cumulative share.
fn latency_report(name: &str, h: &Histogram, level: u8) -> String {
    let mut out = format!("Summary latency data for {name}:\n{}\n", "=".repeat(81));
    for c in LATENCY_CUTOFFS {
        out += &format!(
            "{:9.5}% : {:9.3}us\n",
            c * 100.0,
            us(h.percentile(c * 100.0))
        );
    }
    out.push('\n');
    if level >= 2 {
        out += &format!(
            "Latency histogram for {name}:\n{}\n       Range in us     Cumulative    IO count\n",
            "=".repeat(78)
        );
        let mut so_far = 0u64;
        for (lo, hi, n) in h.buckets() {
            so_far += n;
            out += &format!(
                "{:9.3} - {:9.3}: {:9.4}%  ({n:9})\n",
                us(lo),
                us(hi),
                100.0 * so_far as f64 / h.count().max(1) as f64
            );
        }
        out.push('\n');
    }
    out
}

/// How the I/Os' data keys were handled (see `ControllerOptions::memory_windows`).
#[derive(Clone, Copy, Default)]
struct KeyUse {
    windows: bool,
    remote_invalidations: u64,
    local_invalidations: u64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn report(
    args: &Args,
    results: &[NsCtx],
    elapsed: Duration,
    ctrl_errors: &[String],
    keys: KeyUse,
) -> anyhow::Result<bool> {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut total = Stats::default();
    let mut failures: Vec<String> = ctrl_errors.to_vec();
    let mut mp_total = MultipathStats::default();
    for c in results {
        total.merge(&c.stats);
        mp_total.merge(&c.mp_stats);
        if let Some(f) = &c.failed {
            failures.push(format!("{} (core {}): {f}", c.label, c.core));
        }
    }
    let row = |s: &Stats| {
        let iops = s.ios as f64 / secs;
        (iops, s.bytes as f64 / secs / (1024.0 * 1024.0))
    };
    if args.json {
        let one = |label: &str, core: Option<usize>, s: &Stats| {
            let (iops, mibs) = row(s);
            serde_json::json!({
                "device": label,
                "core": core,
                "ios": s.ios,
                "reads": s.reads,
                "writes": s.writes,
                "errors": s.errors,
                "iops": iops,
                "mib_per_s": mibs,
                "latency_us": {
                    "avg": s.hist.mean() / 1000.0,
                    "min": us(s.hist.min()),
                    "max": us(s.hist.max()),
                    "p50": us(s.hist.percentile(50.0)),
                    "p99": us(s.hist.percentile(99.0)),
                    "p99_9": us(s.hist.percentile(99.9)),
                },
            })
        };
        let mut total_doc = one("Total", None, &total);
        total_doc["keys"] = serde_json::json!({
            "memory_windows": keys.windows,
            "remote_invalidations": keys.remote_invalidations,
            "local_invalidations": keys.local_invalidations,
        });
        let mut namespaces = Vec::new();
        for c in results {
            let mut doc = one(&c.label, Some(c.core), &c.stats);
            if !c.path_labels.is_empty() {
                doc["multipath"] = multipath_json(c);
            }
            namespaces.push(doc);
        }
        if results.iter().any(|c| !c.path_labels.is_empty()) {
            total_doc["multipath"] = serde_json::json!({
                "failovers": mp_total.failovers,
                "ana_errors": mp_total.ana_errors,
                "no_path_failures": mp_total.no_path_failures,
            });
        }
        let doc = serde_json::json!({
            "config": {
                "transport": args.transport,
                "queue_depth": args.queue_depth,
                "io_size": args.io_size,
                "pattern": args.pattern,
                "rwmixread": args.rwmixread,
                "time_s": args.time,
                "core_mask": args.core_mask,
                "qpairs_per_ns": args.qpairs,
                "multipath": multipath_mode_name(args.multipath),
                "fast_io_fail_timeout_sec": args.fast_io_fail_timeout_sec,
            },
            "elapsed_s": secs,
            "namespaces": namespaces,
            "total": total_doc,
            "errors": failures,
            "first_io_error": total.first_error,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let w = results
            .iter()
            .map(|c| c.label.len() + 14)
            .max()
            .unwrap_or(20)
            .max(20);
        println!("{}", "=".repeat(w + 58));
        println!("{:>width$}", "Latency(us)", width = w + 57);
        println!(
            "{:<w$}: {:>10} {:>10} {:>10} {:>10} {:>10}",
            "Device Information", "IOPS", "MiB/s", "Average", "min", "max"
        );
        let print_row = |name: &str, s: &Stats| {
            let (iops, mibs) = row(s);
            println!(
                "{:<w$}: {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                name,
                iops,
                mibs,
                s.hist.mean() / 1000.0,
                us(s.hist.min()),
                us(s.hist.max())
            );
        };
        for c in results {
            print_row(&format!("{} from core {:>2}", c.label, c.core), &c.stats);
        }
        println!("{}", "=".repeat(w + 58));
        print_row("Total", &total);
        println!();
        println!(
            "{:<w$}: {:>10} {:>10} {:>10}",
            "Latency percentiles (us)", "p50", "p99", "p99.9"
        );
        for c in results {
            let h = &c.stats.hist;
            println!(
                "{:<w$}: {:>10.2} {:>10.2} {:>10.2}",
                format!("{} from core {:>2}", c.label, c.core),
                us(h.percentile(50.0)),
                us(h.percentile(99.0)),
                us(h.percentile(99.9))
            );
        }
        let h = &total.hist;
        println!(
            "{:<w$}: {:>10.2} {:>10.2} {:>10.2}",
            "Total",
            us(h.percentile(50.0)),
            us(h.percentile(99.0)),
            us(h.percentile(99.9))
        );
        if total.reads > 0 && total.writes > 0 {
            println!(
                "reads {} writes {} ({:.1}% reads)",
                total.reads,
                total.writes,
                100.0 * total.reads as f64 / (total.ios.max(1)) as f64
            );
        }
        if args.latency > 0 && total.ios > 0 {
            println!();
            for c in results {
                let name = format!("{} from core {}", c.label, c.core);
                print!("{}", latency_report(&name, &c.stats.hist, args.latency));
            }
        }
        for c in results.iter().filter(|c| !c.path_labels.is_empty()) {
            print!("{}", multipath_text(c));
        }
        if keys.windows {
            println!(
                "data keys: per-I/O memory windows, {} invalidated by the target, {} locally",
                keys.remote_invalidations, keys.local_invalidations
            );
        } else {
            println!("data keys: the buffer pool's registration");
        }
    }
    if total.errors > 0 {
        eprintln!(
            "nvmf-perf: {} I/O errors (first: {})",
            total.errors,
            total.first_error.as_deref().unwrap_or("?")
        );
    }
    for f in &failures {
        eprintln!("nvmf-perf: error: {f}");
    }
    // -Q: I/O errors do not fail the run (they were reported); lost controllers still do.
    let errors_fail = args.continue_on_error.is_none() && total.errors > 0;
    Ok(!errors_fail && failures.is_empty())
}

fn multipath_mode_name(m: MultipathMode) -> &'static str {
    match m {
        MultipathMode::Disable => "disable",
        MultipathMode::On(nvmf_initiator::Policy::ActivePassive) => "active_passive",
        MultipathMode::On(nvmf_initiator::Policy::ActiveActive) => "active_active",
    }
}

/// A multipath namespace's paths (I/Os completed through each) and failovers, for `--json`.
fn multipath_json(c: &NsCtx) -> serde_json::Value {
    let s = &c.mp_stats;
    let paths: Vec<_> = c
        .path_labels
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            serde_json::json!({
                "address": addr,
                "ios": s.path_ios.get(i).copied().unwrap_or(0),
            })
        })
        .collect();
    serde_json::json!({
        "paths": paths,
        "failovers": s.failovers,
        "ana_errors": s.ana_errors,
        "no_path_failures": s.no_path_failures,
    })
}

/// The same as [`multipath_json`], as lines after the table.
fn multipath_text(c: &NsCtx) -> String {
    let s = &c.mp_stats;
    let mut out = format!("multipath {} from core {}:\n", c.label, c.core);
    for (i, addr) in c.path_labels.iter().enumerate() {
        out += &format!(
            "  path {addr}: {} I/Os\n",
            s.path_ios.get(i).copied().unwrap_or(0)
        );
    }
    out += &format!(
        "  failovers {}  ANA statuses {}  failed for want of a path {}\n",
        s.failovers, s.ana_errors, s.no_path_failures
    );
    out
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
    fn multipath_report_lists_paths_and_failovers() {
        let c = NsCtx {
            label: "ns".into(),
            ns: NamespaceInfo {
                nsid: 1,
                block_size: 512,
                blocks: 8,
            },
            core: 0,
            qpairs: Vec::new(),
            path_labels: vec!["10.0.0.1:4420".into(), "10.0.0.1:4421".into()],
            mp_stats: MultipathStats {
                path_ios: vec![10, 20],
                failovers: 3,
                ana_errors: 1,
                no_path_failures: 0,
            },
            bufs: Vec::new(),
            start: Vec::new(),
            qp_of: Vec::new(),
            is_read: Vec::new(),
            depth: 0,
            blocks_per_io: 1,
            slots: 8,
            seq: 0,
            zipf: None,
            retry: Vec::new(),
            stats: Stats::default(),
            failed: None,
        };
        let j = multipath_json(&c);
        assert_eq!(j["paths"][1]["address"], "10.0.0.1:4421");
        assert_eq!(j["paths"][1]["ios"], 20);
        assert_eq!(j["failovers"], 3);
        let t = multipath_text(&c);
        assert!(t.contains("path 10.0.0.1:4420: 10 I/Os"), "{t}");
        assert!(t.contains("failovers 3"), "{t}");
    }

    #[test]
    fn associations_round_robin_or_every_core() {
        assert_eq!(associations(1, 2, false), [(0, 0), (0, 1)]);
        assert_eq!(associations(3, 2, false), [(0, 0), (1, 1), (2, 0)]);
        assert_eq!(associations(2, 2, true), [(0, 0), (0, 1), (1, 0), (1, 1)]);
        assert!(associations(0, 2, false).is_empty());
    }

    #[test]
    fn latency_summary_and_histogram_levels() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let one = latency_report("ns", &h, 1);
        assert!(one.contains("Summary latency data for ns"));
        assert!(one.contains(" 50.00000% :"), "{one}");
        assert!(!one.contains("Latency histogram"));
        let two = latency_report("ns", &h, 2);
        assert!(two.starts_with(&one));
        assert!(two.contains("Latency histogram for ns"));
        assert!(two.contains("100.0000%"), "{two}");
    }
}

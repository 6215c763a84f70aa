//! `nvmf-perf`: NVMe-oF I/O benchmark with `spdk_nvme_perf`'s flags.
//!
//! Workers are threads pinned to the cores of `-c`, each polling its own I/O qpairs. As in
//! spdk_nvme_perf, namespaces and workers are paired round robin (`max(namespaces, workers)`
//! associations); each association has `-P` qpairs sharing its queue depth `-q`. The main
//! thread polls the controllers' admin queues (keep-alive, events, reconnect) and prints the
//! progress line.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use nvmf_common::buffer::{BufferPool, IoBuf};
use nvmf_common::reactor::{check_cores, parse_core_mask};
use nvmf_initiator::{
    Controller, ControllerEvent, ControllerOptions, Histogram, IoCompletion, IoQpair, IoStatus,
    MemoryWindows, NamespaceInfo, QpairState, Reconnect, TransportId,
};

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-perf",
    about = "NVMe-oF (RDMA) I/O benchmark, with spdk_nvme_perf's flags",
    after_help = "Example: 4 KiB random 70/30 mix at queue depth 32 for 10 s on two cores:\n  \
        nvmf-perf -r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 \
        subnqn:nqn.2016-06.io.spdk:cnode1' -q 32 -o 4096 -w randrw -M 70 -t 10 -c 0x3"
)]
struct Args {
    /// Transport ID: 'trtype:RDMA adrfam:IPv4 traddr:A trsvcid:4420 subnqn:NQN [hostnqn:NQN] [ns:N]'.
    /// Repeat for several controllers.
    #[arg(short = 'r', long = "transport", required = true)]
    transport: Vec<String>,
    /// Queue depth per namespace and core (shared by its -P qpairs).
    #[arg(short = 'q', long = "io-depth", default_value_t = 32)]
    queue_depth: u32,
    /// I/O size in bytes (a multiple of the block size).
    #[arg(short = 'o', long = "io-size", default_value_t = 4096)]
    io_size: u32,
    /// read, write, randread, randwrite, rw, randrw.
    #[arg(short = 'w', long = "io-pattern")]
    pattern: String,
    /// Read percentage of rw / randrw (0-100; default 50).
    #[arg(short = 'M', long = "rwmixread")]
    rwmixread: Option<u32>,
    /// Run time in seconds.
    #[arg(short = 't', long = "time", default_value_t = 10)]
    time: u64,
    /// Core mask (0x3, 3, or [0,2-3]): one pinned polling thread per core.
    #[arg(short = 'c', long = "core-mask", default_value = "0x1")]
    core_mask: String,
    /// I/O qpairs per namespace and core.
    #[arg(short = 'P', long = "num-qpairs", default_value_t = 1)]
    qpairs: u32,
    /// Print the results as one JSON document (and nothing else on stdout).
    #[arg(long)]
    json: bool,
    /// Host NQN (default: /etc/nvme/hostnqn or a generated one).
    #[arg(long)]
    hostnqn: Option<String>,
    /// Fail an I/O (and reset the controller) when it is older than this many seconds.
    #[arg(long, default_value_t = 10)]
    io_timeout: u64,
    /// Seconds allowed for each connection step (address, route, connect, Fabrics Connect).
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
    /// Keep Alive Timeout in seconds (0: off).
    #[arg(long, default_value_t = 5)]
    kato: u64,
    /// Reconnect after a failure every this many seconds (enables reconnect).
    #[arg(long)]
    reconnect_delay: Option<u64>,
    /// With reconnect: give up this many seconds after the loss (-1: never; default 600).
    #[arg(long, allow_negative_numbers = true)]
    ctrl_loss_tmo: Option<i64>,
    /// Send writes as in-capsule data when the controller allows (0 disables).
    #[arg(long, default_value_t = 1)]
    in_capsule: u8,
    /// Per-I/O memory-window keys, invalidated when each I/O completes, as the Linux host
    /// does: auto (where the device has them, except soft-RoCE), on, off (the buffer pool
    /// registration's key).
    #[arg(long, default_value = "auto")]
    memory_windows: MemoryWindows,
    /// Empty polls in a row before a worker yields its core to other threads (0: never
    /// yield, pure spinning). On soft-RoCE the NIC is kernel CPU time on the same cores.
    #[arg(long, default_value_t = 0)]
    idle_spin: u32,
    /// Sleep this many microseconds instead of yielding once idle (0: yield).
    #[arg(long, default_value_t = 0)]
    idle_sleep_us: u64,
}

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

/// One namespace on one worker: its qpairs, buffers and counters.
struct NsCtx {
    label: String,
    ns: NamespaceInfo,
    core: usize,
    qpairs: Vec<IoQpair>,
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
    stats: Stats,
    failed: Option<String>,
}

struct Plan {
    pattern: Pattern,
    read_pct: u32,
    io_size: u32,
}

impl NsCtx {
    fn submit(&mut self, tag: usize, plan: &Plan, rng: &mut Rng) -> bool {
        let Some(buf) = self.bufs[tag].take() else {
            return false;
        };
        let slot = if plan.pattern.random() {
            rng.next() % self.slots
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
        let r = if read {
            qp.read(self.ns.nsid, lba, nlb, buf, tag as u64)
        } else {
            qp.write(self.ns.nsid, lba, nlb, buf, tag as u64)
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                self.bufs[tag] = e.buf;
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
        kato: Duration::from_secs(args.kato),
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
    let cores = parse_core_mask(&args.core_mask)?;
    check_cores(&cores)?;
    let tids: Vec<TransportId> = args
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
    let mut ctrls = Vec::new();
    let mut namespaces: Vec<(usize, NamespaceInfo, String)> = Vec::new();
    for tid in &tids {
        if tid.is_discovery() {
            bail!("-r {tid}: give the subsystem's subnqn (this is the discovery subsystem)");
        }
        // Ask for enough I/O queues for every association this controller could get.
        opts.io_queues = 0;
        opts.io_queues_requested = (cores.len() * args.qpairs as usize * 8).min(1024) as u16;
        let mut ctrl = Controller::connect(tid, ControllerOptions { ..opts.clone() })
            .with_context(|| format!("connecting to {tid}"))?;
        let idx = ctrls.len();
        say(format!(
            "Attached to NVMe over Fabrics controller at {}: {} (cntlid {}, {} I/O queues)",
            ctrl.peer(),
            tid.subnqn,
            ctrl.info().cntlid,
            ctrl.granted_io_queues()
        ));
        let ids = match tid.ns {
            Some(ns) => vec![ns],
            None => ctrl.active_namespaces().context("listing namespaces")?,
        };
        for nsid in ids {
            match ctrl.namespace(nsid)? {
                Some(ns) => {
                    let label = format!(
                        "RDMA (addr:{} subnqn:{}) NSID {nsid}",
                        tid.traddr, tid.subnqn
                    );
                    // `is_multiple_of` is newer than the workspace's rust-version.
                    #[allow(clippy::manual_is_multiple_of)]
                    let misaligned = args.io_size % ns.block_size != 0;
                    if misaligned {
                        eprintln!("nvmf-perf: skipping {label}: -o {} is not a multiple of its block size {}", args.io_size, ns.block_size);
                        continue;
                    }
                    if u64::from(args.io_size) > ns.blocks * u64::from(ns.block_size) {
                        eprintln!("nvmf-perf: skipping {label}: smaller than one I/O");
                        continue;
                    }
                    namespaces.push((idx, ns, label));
                }
                None => eprintln!(
                    "nvmf-perf: namespace {nsid} of {} is not active",
                    tid.subnqn
                ),
            }
        }
        if args.io_size > ctrl.max_transfer() {
            bail!(
                "-o {}: above the controller's maximum transfer of {} bytes",
                args.io_size,
                ctrl.max_transfer()
            );
        }
        ctrls.push(ctrl);
    }
    if namespaces.is_empty() {
        bail!("no namespace to run on");
    }

    // Associations, as spdk_nvme_perf: max(namespaces, workers), round robin.
    let count = namespaces.len().max(cores.len());
    let mut per_core: Vec<Vec<NsCtx>> = (0..cores.len()).map(|_| Vec::new()).collect();
    for i in 0..count {
        let w = i % cores.len();
        let (ci, ns, label) = namespaces[i % namespaces.len()].clone();
        let ctrl = &mut ctrls[ci];
        let p = args.qpairs as usize;
        let per_qp = args.queue_depth.div_ceil(args.qpairs).max(1);
        let mut qpairs = Vec::with_capacity(p);
        for _ in 0..p {
            // One more entry than outstanding commands would be needed for a strict SQ
            // full check; Linux and SPDK size the queue at the depth, as here.
            let qp = ctrl
                .create_io_qpair(per_qp.max(2).min(u32::from(u16::MAX)) as u16)
                .with_context(|| format!("connecting an I/O qpair for {label}"))?;
            qpairs.push(qp);
        }
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
        say(format!("Associating {label} with lcore {}", cores[w]));
        per_core[w].push(NsCtx {
            label,
            ns,
            core: cores[w],
            qp_of: (0..depth as usize).map(|t| t % p).collect(),
            qpairs,
            bufs,
            start: vec![Instant::now(); depth as usize],
            is_read: vec![false; depth as usize],
            depth,
            blocks_per_io,
            slots: ns.blocks / blocks_per_io,
            seq: 0,
            stats: Stats::default(),
            failed: None,
        });
    }
    say("Initialization complete. Launching workers.".into());

    let plan = Arc::new(Plan {
        pattern,
        read_pct: pattern.read_percent(args.rwmixread),
        io_size: args.io_size,
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
                                eprintln!("nvmf-perf: {}: reconnected (cntlid {cntlid})", c.peer())
                            }
                            other => eprintln!("nvmf-perf: {}: {other:?}", c.peer()),
                        }
                    }
                }
                Err(e) => {
                    lost[i] = true;
                    ctrl_errors.push(format!("{}: {e}", c.peer()));
                    eprintln!("nvmf-perf: {}: {e}", c.peer());
                    stop.store(true, Ordering::Relaxed);
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
    for c in results.iter_mut() {
        for qp in c.qpairs.drain(..) {
            let st = qp.stats();
            keys.remote_invalidations += st.remote_invalidations;
            keys.local_invalidations += st.local_invalidations;
            qp.disconnect();
        }
    }
    for c in ctrls {
        let _ = c.disconnect();
    }
    report(&args, &results, elapsed, &ctrl_errors, keys)
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
    for c in results {
        total.merge(&c.stats);
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
            },
            "elapsed_s": secs,
            "namespaces": results.iter().map(|c| one(&c.label, Some(c.core), &c.stats)).collect::<Vec<_>>(),
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
    Ok(total.errors == 0 && failures.is_empty())
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

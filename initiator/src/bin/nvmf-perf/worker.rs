//! The workers: each a thread pinned to one core of `-c`, polling the I/O qpairs of its
//! associations. A context (`NsCtx`) is one association (namespace, worker, `-P` qpairs
//! sharing `-q`), with its access pattern, buffers, statistics and multipath state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use nvmf_common::buffer::IoBuf;
use nvmf_common::spec::command::RW_FUA;
use nvmf_common::spec::Command;
use nvmf_initiator::{
    DataDir, Histogram, IoCompletion, IoQpair, IoStatus, MultipathQpair, MultipathStats,
    NamespaceInfo, QpairState, SubmitError,
};
use zerocopy::byteorder::little_endian::U32;

use crate::zipf::Zipf;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pattern {
    Read,
    Write,
    RandRead,
    RandWrite,
    Rw,
    RandRw,
}

impl Pattern {
    pub(crate) fn parse(s: &str) -> anyhow::Result<Self> {
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
    pub(crate) fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }
    pub(crate) fn read_percent(self, mix: Option<u32>) -> u32 {
        match self {
            Self::Read | Self::RandRead => 100,
            Self::Write | Self::RandWrite => 0,
            Self::Rw | Self::RandRw => mix.unwrap_or(50),
        }
    }
}

/// xorshift64*: a fast PRNG, plenty for LBA choice.
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
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
pub(crate) struct Live {
    pub(crate) ios: AtomicU64,
}

#[derive(Clone, Default)]
pub(crate) struct Stats {
    pub(crate) ios: u64,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) bytes: u64,
    pub(crate) errors: u64,
    pub(crate) hist: Histogram,
    pub(crate) first_error: Option<String>,
}

impl Stats {
    pub(crate) fn merge(&mut self, o: &Stats) {
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
pub(crate) enum Qp {
    // Boxed: both are large and of different sizes.
    One(Box<IoQpair>),
    Multi(Box<MultipathQpair>),
}

impl Qp {
    pub(crate) fn submit(
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

    pub(crate) fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        match self {
            Self::One(q) => q.poll(out),
            Self::Multi(q) => q.poll(out),
        }
    }

    pub(crate) fn state(&self) -> QpairState {
        match self {
            Self::One(q) => q.state(),
            Self::Multi(q) => q.state(),
        }
    }

    pub(crate) fn failure(&self) -> Option<&str> {
        match self {
            Self::One(q) => q.failure(),
            Self::Multi(q) => q.failure(),
        }
    }

    pub(crate) fn depth(&self) -> u16 {
        match self {
            Self::One(q) => q.depth(),
            Self::Multi(q) => q.depth(),
        }
    }

    pub(crate) fn set_max_completions(&mut self, n: u32) {
        match self {
            Self::One(q) => q.set_max_completions(n),
            Self::Multi(q) => q.set_max_completions(n),
        }
    }
}

/// One namespace on one worker: its qpairs, buffers and counters.
pub(crate) struct NsCtx {
    pub(crate) label: String,
    pub(crate) ns: NamespaceInfo,
    pub(crate) core: usize,
    pub(crate) qpairs: Vec<Qp>,
    /// Multipath: each path's address (empty for a single path).
    pub(crate) path_labels: Vec<String>,
    /// Multipath: the qpairs' counters, gathered after the run.
    pub(crate) mp_stats: MultipathStats,
    /// Buffers not in flight, by tag.
    pub(crate) bufs: Vec<Option<IoBuf>>,
    pub(crate) start: Vec<Instant>,
    /// Each tag's qpair.
    pub(crate) qp_of: Vec<usize>,
    pub(crate) is_read: Vec<bool>,
    pub(crate) depth: u32,
    pub(crate) blocks_per_io: u64,
    pub(crate) slots: u64,
    pub(crate) seq: u64,
    pub(crate) zipf: Option<Arc<Zipf>>,
    /// `-Q`: tags whose submission was refused, retried on the next pass.
    pub(crate) retry: Vec<usize>,
    pub(crate) stats: Stats,
    pub(crate) failed: Option<String>,
}

pub(crate) struct Plan {
    pub(crate) pattern: Pattern,
    pub(crate) read_pct: u32,
    pub(crate) io_size: u32,
    pub(crate) fua: bool,
    /// `-Q N`: print one I/O error in every N (errors do not fail the run).
    pub(crate) quiet: Option<u64>,
    /// I/O errors seen by all workers, for `-Q`'s rate limit.
    pub(crate) errors_seen: AtomicU64,
}

impl Plan {
    /// `-Q`: prints every Nth error, saying how many were left out before it.
    pub(crate) fn log_error(&self, what: &dyn std::fmt::Display) {
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
    pub(crate) fn submit(&mut self, tag: usize, plan: &Plan, rng: &mut Rng) -> bool {
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

    pub(crate) fn complete(&mut self, c: IoCompletion, plan: &Plan) -> usize {
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

    pub(crate) fn outstanding(&self) -> usize {
        self.bufs.iter().filter(|b| b.is_none()).count()
    }
}

pub(crate) struct Idle {
    pub(crate) spin: u32,
    pub(crate) sleep: Duration,
}

pub(crate) fn worker(
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

//! One fio thread's engine state: its connections (one I/O qpair per controller), its open
//! files (namespaces), the I/Os in flight and the events for fio to reap. The I/O path
//! (`queue`, reaping) is in `engine/io.rs`; an `io_u` above the controller's maximum
//! transfer goes out as several commands ([`crate::split`]).
//!
//! Everything here runs on the fio thread that owns it (fio's `setup` runs on the main
//! thread before the job thread starts, never at the same time), so nothing is locked.
//!
//! # Data buffers
//!
//! fio's `io_u` buffers are plain memory; commands need buffers of a pool registered with
//! the controller. Two ways:
//! - **Zero copy.** The engine allocates fio's I/O memory itself (fio's `iomem_alloc`
//!   hook): a [`BufferPool`] whose buffers tile the `io_u` buffers fio carves from it (fio
//!   puts `io_u` *i* at `base + i * max_bs` when the engine sets `FIO_MEMALIGN` and the
//!   region is page aligned). A buffer is `max_bs`, or, when the controllers probed in setup
//!   take less per command, the largest divisor of `max_bs` they take
//!   ([`split::chunk_size`]): then an `io_u` spans several buffers and each part of its split
//!   sends one. The pool is registered with the first controller the thread opens; a command
//!   on that controller sends the `io_u`'s own pool buffers. Needs `max_bs` a multiple of
//!   4 KiB and no `mem_align`.
//! - **Copy** (every other case, or forced with `nvmf_copy=1`): each connection has a
//!   registered bounce pool of `iodepth` times the parts of a `max_bs` I/O, each of
//!   `max_bs` or the maximum transfer if smaller; writes are copied in before a part is
//!   sent, reads copied out when a part's completion is reaped.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::buffer::{BufferPool, BUFFER_ALIGN};
use nvmf_initiator::{
    ControllerOptions, IoCompletion, IoQpair, NamespaceInfo, Reconnect, TransportId,
};

use crate::error::{EngineError, Result};
use crate::registry::{self, SharedController};
use crate::split;

mod inflight;
mod io;
mod iomem;

use inflight::Slots;
use iomem::IoMem;

/// Failed commands reported on stderr per thread (fio reports each errno itself).
const MAX_ERROR_REPORTS: u32 = 10;

/// Engine options (fio's `nvmf_*` options); they apply when a controller is connected, so
/// the first job to reach an address decides for every job sharing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    pub kato: Duration,
    pub io_timeout: Duration,
    pub reconnect: Option<Reconnect>,
    pub in_capsule_data: bool,
    /// Always copy through bounce buffers, even when zero copy is possible.
    pub force_copy: bool,
    /// How `getevents` waits.
    pub idle: Idle,
    /// SPDK's `hostnqn` option: the host NQN where the file name gives none.
    pub hostnqn: Option<String>,
    /// SPDK's `print_qid_mappings`: say which qpair each file uses.
    pub print_qid_mappings: bool,
}

/// How `getevents` waits for completions. Pure polling (the default, as SPDK) gives the
/// lowest latency on a real NIC; on soft-RoCE the NIC is CPU time on the same cores, and
/// in a TCG guest a spinning vCPU also takes host CPU from the others, so giving the CPU
/// away after some empty polls can be faster there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Idle {
    /// Empty polls in a row before giving the CPU away; 0: never (pure polling).
    pub spin: u32,
    /// Then sleep this long (zero: `sched_yield`).
    pub sleep: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        let d = ControllerOptions::default();
        Self {
            kato: d.kato,
            io_timeout: d.io_timeout,
            reconnect: None,
            in_capsule_data: d.in_capsule_data,
            force_copy: false,
            idle: Idle::default(),
            hostnqn: None,
            print_qid_mappings: false,
        }
    }
}

impl EngineOptions {
    pub fn controller_options(&self) -> ControllerOptions {
        ControllerOptions {
            kato: self.kato,
            io_timeout: self.io_timeout,
            admin_timeout: self.io_timeout.max(Duration::from_secs(10)),
            in_capsule_data: self.in_capsule_data,
            reconnect: self.reconnect,
            ..ControllerOptions::default()
        }
    }
}

/// The subsystem a file name without `subnqn=` stands for: the first entry
/// [`attach_plan`](nvmf_initiator::attach_plan) keeps (one file is one namespace).
fn first_subsystem(
    name: &str,
    source: &TransportId,
    log: &nvmf_initiator::DiscoveryLog,
) -> Result<TransportId> {
    let plan = nvmf_initiator::attach_plan(source, log);
    for why in &plan.skipped {
        tracing::info!("{name}: skipping {why}");
    }
    let mut it = plan.attach.into_iter();
    let first = it.next().ok_or_else(|| {
        EngineError::new(
            libc::ENODEV,
            format!(
                "{name:?}: the discovery service at {}:{} lists no NVM subsystem",
                source.traddr, source.trsvcid
            ),
        )
    })?;
    let others = it.count();
    if others > 0 {
        say!(
            "{name}: the discovery service lists {} NVM subsystems; using {} (add subnqn= to choose)",
            others + 1,
            first.subnqn
        );
    }
    Ok(first)
}

/// What fio asks for, independent of fio's own `DDIR_*` numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Trim,
    Flush,
}

impl Op {
    /// The shim's `NVMF_FIO_OP_*` values.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::Trim,
            3 => Self::Flush,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Trim => "trim",
            Self::Flush => "flush",
        }
    }
}

/// What [`EngineThread::queue`] did with an I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Sent (all of it, or its first parts while the rest wait for room); it completes
    /// through `getevents`.
    Queued,
    /// No room now: fio reaps completions and queues it again.
    Busy,
}

/// A finished I/O for fio: its `io_u` tag and errno (0 on success).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub tag: u64,
    pub err: i32,
}

/// What the thread did, logged when it ends (`NVMF_FIO_LOG=nvmf_fio=info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    /// I/Os queued.
    ios: u64,
    /// Of those, split into several commands.
    split: u64,
    /// Commands sent.
    commands: u64,
    /// I/Os of which a part had to wait for room (qpair full, bounce buffers out).
    waited: u64,
}

/// One controller as this thread uses it: its own qpair and bounce buffers.
struct Conn {
    qp: IoQpair,
    bounce: BufferPool,
    // Declared last: dropped after the qpair.
    ctrl: Arc<SharedController>,
}

struct OpenFile {
    name: String,
    conn: usize,
    ns: NamespaceInfo,
}

/// The engine state of one fio thread (`td->io_ops_data`).
pub struct EngineThread {
    opts: EngineOptions,
    depth: u32,
    max_bs: usize,
    conns: Vec<Conn>,
    files: Vec<Option<OpenFile>>,
    iomem: Option<IoMem>,
    slots: Slots,
    /// I/Os whose next part found no room (qpair full, bounce buffers out), in order.
    stalled: VecDeque<u32>,
    ready: VecDeque<Event>,
    events: Vec<Event>,
    scratch: Vec<IoCompletion>,
    /// Namespace facts found by `probe` (fio's setup), by file name.
    geometry: HashMap<String, NamespaceInfo>,
    /// File names without `subnqn=`: the subsystem discovery chose, by file name.
    discovered: HashMap<String, TransportId>,
    /// The smallest command (bytes) the probed namespaces take whole, and their largest
    /// block size: what fio's I/O memory is cut to.
    probed_limit: Option<u64>,
    probed_block: u32,
    /// Controllers probed in setup, held until the thread ends so the job reuses them.
    pins: Vec<Arc<SharedController>>,
    errors_reported: u32,
    counters: Counters,
}

impl EngineThread {
    pub fn new(opts: EngineOptions) -> Self {
        Self {
            opts,
            depth: 0,
            max_bs: 0,
            conns: Vec::new(),
            files: Vec::new(),
            iomem: None,
            slots: Slots::default(),
            stalled: VecDeque::new(),
            ready: VecDeque::new(),
            events: Vec::new(),
            scratch: Vec::new(),
            geometry: HashMap::new(),
            discovered: HashMap::new(),
            probed_limit: None,
            probed_block: 0,
            pins: Vec::new(),
            errors_reported: 0,
            counters: Counters::default(),
        }
    }

    /// The file's subsystem and namespace. A name without `subnqn=` (SPDK's plugin form,
    /// `trtype=RDMA adrfam=IPv4 traddr=A trsvcid=4420 ns=1`) names a discovery service: the
    /// file is the first NVM subsystem it lists, as with SPDK's plugin.
    fn parse(&mut self, name: &str) -> Result<(TransportId, u32)> {
        let mut tid: TransportId = name.parse()?;
        if tid.hostnqn.is_none() {
            tid.hostnqn.clone_from(&self.opts.hostnqn);
        }
        if tid.is_discovery() {
            tid = match self.discovered.get(name) {
                Some(t) => t.clone(),
                None => {
                    let log = nvmf_initiator::discover(&tid, &self.opts.controller_options())
                        .map_err(|e| {
                            EngineError::from(e).context(format!(
                                "{name:?}: discovery at {}:{}",
                                tid.traddr, tid.trsvcid
                            ))
                        })?;
                    let chosen = first_subsystem(name, &tid, &log)?;
                    self.discovered.insert(name.to_string(), chosen.clone());
                    chosen
                }
            };
        }
        let ns = tid.ns.unwrap_or(1);
        if ns == 0 || ns == u32::MAX {
            return Err(EngineError::invalid(format!(
                "{name:?}: ns={ns} is not a namespace ID"
            )));
        }
        Ok((tid, ns))
    }

    fn controller(&mut self, tid: &TransportId) -> Result<Arc<SharedController>> {
        let ctrl = registry::get_or_connect(tid, &self.opts.controller_options())?;
        if !self.pins.iter().any(|p| Arc::ptr_eq(p, &ctrl)) {
            self.pins.push(Arc::clone(&ctrl));
        }
        Ok(ctrl)
    }

    /// fio's setup: connects (or reuses) the controller and reads the namespace's size.
    pub fn probe(&mut self, name: &str) -> Result<NamespaceInfo> {
        let (tid, nsid) = self.parse(name)?;
        let ctrl = self.controller(&tid)?;
        let (info, max_xfer) = {
            let mut guard = ctrl.lock()?;
            let c = guard.as_mut().expect("lock() checked");
            let info = c
                .namespace(nsid)
                .map_err(|e| EngineError::from(e).context(format!("Identify Namespace {nsid}")))?;
            (info, c.max_transfer())
        };
        let info = info.ok_or_else(|| {
            EngineError::new(
                libc::ENXIO,
                format!("namespace {nsid} of {} is not active", tid.subnqn),
            )
        })?;
        tracing::info!(
            "{name}: maximum transfer {max_xfer} bytes; larger I/O is split into commands of at most that"
        );
        self.note_limit(max_xfer, info.block_size);
        self.geometry.insert(name.to_string(), info);
        Ok(info)
    }

    /// Takes a probed namespace's limits into account for cutting fio's I/O memory.
    fn note_limit(&mut self, max_transfer: u32, block_size: u32) {
        if let Some(l) = split::part_limit(max_transfer.into(), block_size.into()) {
            self.probed_limit = Some(self.probed_limit.map_or(l, |p| p.min(l)));
        }
        self.probed_block = self.probed_block.max(block_size);
    }

    /// fio's init: the thread's queue depth and largest block size.
    pub fn init(&mut self, depth: u32, max_bs: u64) -> Result<()> {
        if depth == 0 || depth > u32::from(u16::MAX) {
            return Err(EngineError::invalid(format!(
                "iodepth={depth}: the engine takes 1-65535"
            )));
        }
        let max_bs =
            usize::try_from(max_bs).map_err(|_| EngineError::invalid("block size too large"))?;
        if max_bs == 0 {
            return Err(EngineError::invalid("block size 0"));
        }
        self.depth = depth;
        self.max_bs = max_bs;
        self.slots = Slots::new(depth);
        self.stalled = VecDeque::with_capacity(depth as usize);
        self.ready = VecDeque::with_capacity(depth as usize);
        self.events = Vec::with_capacity(depth as usize);
        // Completions are per command; `connect` grows this to the qpairs' depths.
        self.scratch = Vec::with_capacity(depth as usize);
        Ok(())
    }

    /// fio's open_file: the file's controller connection (made on first use) and namespace.
    /// Returns the handle for `queue`.
    pub fn open(&mut self, name: &str) -> Result<u32> {
        if self.depth == 0 {
            return Err(EngineError::invalid("open before init"));
        }
        let (tid, nsid) = self.parse(name)?;
        let ctrl = self.controller(&tid)?;
        let conn = match self.conns.iter().position(|c| Arc::ptr_eq(&c.ctrl, &ctrl)) {
            Some(i) => i,
            None => self.connect(ctrl)?,
        };
        let ns = match self.geometry.get(name) {
            Some(ns) => *ns,
            None => {
                let mut guard = self.conns[conn].ctrl.lock()?;
                let c = guard.as_mut().expect("lock() checked");
                c.namespace(nsid)
                    .map_err(|e| {
                        EngineError::from(e).context(format!("Identify Namespace {nsid}"))
                    })?
                    .ok_or_else(|| {
                        EngineError::new(
                            libc::ENXIO,
                            format!("namespace {nsid} of {} is not active", tid.subnqn),
                        )
                    })?
            }
        };
        let file = OpenFile {
            name: name.to_string(),
            conn,
            ns,
        };
        tracing::info!(
            "{name}: namespace {} ({} blocks of {} bytes) on qpair {} of depth {}, {}",
            ns.nsid,
            ns.blocks,
            ns.block_size,
            self.conns[conn].qp.qid(),
            self.conns[conn].qp.depth(),
            if self
                .iomem
                .as_ref()
                .is_some_and(|m| m.zero_copy_layout && m.registered == Some(conn))
            {
                "zero copy"
            } else {
                "copying through bounce buffers"
            }
        );
        if self.opts.print_qid_mappings {
            say!(
                "{name}: {} namespace {} on qid {}",
                tid.subnqn,
                ns.nsid,
                self.conns[conn].qp.qid()
            );
        }
        let handle = match self.files.iter().position(Option::is_none) {
            Some(i) => {
                self.files[i] = Some(file);
                i
            }
            None => {
                self.files.push(Some(file));
                self.files.len() - 1
            }
        };
        Ok(handle as u32)
    }

    /// A qpair of the thread's depth on `ctrl`, its bounce pool, and (first connection
    /// only) the registration of fio's I/O memory.
    fn connect(&mut self, ctrl: Arc<SharedController>) -> Result<usize> {
        let idx = self.conns.len();
        let (qp, bounce) = {
            let mut guard = ctrl.lock()?;
            let c = guard.as_mut().expect("lock() checked");
            let max_xfer = c.max_transfer() as usize;
            // Room for every part of `iodepth` I/Os of max_bs: bounce buffers of at most
            // one command each, and qpair slots (the controller may grant fewer; then parts
            // wait for room).
            let (buf_size, copy_parts) = split::bounce_layout(self.max_bs, max_xfer, BUFFER_ALIGN);
            let zc_parts = self
                .iomem
                .as_ref()
                .filter(|m| m.zero_copy_layout)
                .map_or(1, |m| self.max_bs.div_ceil(m.buf_size));
            let parts = copy_parts.max(zc_parts);
            if parts > 1 {
                tracing::info!(
                    "{}: maximum transfer {max_xfer} bytes: an I/O of up to {} bytes is up to {parts} commands",
                    ctrl.key(),
                    self.max_bs
                );
            }
            let depth =
                u16::try_from((self.depth as usize).saturating_mul(parts)).unwrap_or(u16::MAX);
            let count = u32::try_from((self.depth as usize).saturating_mul(copy_parts))
                .map_err(|_| EngineError::invalid("too many bounce buffers"))?;
            let qp = c.create_io_qpair(depth).map_err(|e| {
                EngineError::from(e).context(format!("{}: creating an I/O qpair", ctrl.key()))
            })?;
            let bounce = BufferPool::new(buf_size, count)
                .map_err(|e| EngineError::new(libc::ENOMEM, format!("bounce buffers: {e}")))?;
            c.register_pool(&bounce).map_err(EngineError::from)?;
            if let Some(m) = self
                .iomem
                .as_mut()
                .filter(|m| m.zero_copy_layout && m.registered.is_none())
            {
                match c.register_pool(&m.pool) {
                    Ok(()) => m.registered = Some(idx),
                    Err(e) => {
                        say!("registering fio's I/O memory failed ({e}); copying through bounce buffers");
                        m.zero_copy_layout = false;
                    }
                }
            }
            (qp, bounce)
        };
        tracing::debug!("{}: qpair {} of depth {}", ctrl.key(), qp.qid(), qp.depth());
        self.conns.push(Conn { qp, bounce, ctrl });
        // One poll may bring a completion for every command of every qpair.
        let all: usize = self.conns.iter().map(|c| usize::from(c.qp.depth())).sum();
        self.scratch.reserve(all.saturating_sub(self.scratch.len()));
        Ok(idx)
    }

    /// fio's close_file. The connection stays for the thread's later opens (fio reopens
    /// files between loops and for the verify phase).
    pub fn close(&mut self, handle: u32) -> Result<()> {
        match self.files.get_mut(handle as usize) {
            Some(f @ Some(_)) => {
                *f = None;
                Ok(())
            }
            _ => Err(EngineError::new(
                libc::EBADF,
                format!("close of unknown file handle {handle}"),
            )),
        }
    }

    /// fio's getevents: waits until at least `min` I/Os finished (or `timeout` passed;
    /// `None` waits as long as it takes, which the I/O timeout bounds), polling as
    /// [`Idle`] says. Returns how many events (at most `max`) `event` now hands out; the
    /// rest wait for the next call.
    pub fn getevents(&mut self, min: u32, max: u32, timeout: Option<Duration>) -> usize {
        self.events.clear();
        // Never wait for more than can come.
        let want = (min.min(max) as usize).min(self.ready.len() + self.slots.outstanding());
        let deadline = timeout.map(|t| Instant::now() + t);
        let idle = self.opts.idle;
        let mut empty = 0u32;
        loop {
            let got = self.reap();
            if self.ready.len() >= want || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            if got > 0 || idle.spin == 0 {
                empty = 0;
                std::hint::spin_loop();
                continue;
            }
            empty += 1;
            if empty >= idle.spin {
                empty = 0;
                if idle.sleep.is_zero() {
                    std::thread::yield_now();
                } else {
                    let left = deadline
                        .map_or(idle.sleep, |d| d.saturating_duration_since(Instant::now()));
                    std::thread::sleep(idle.sleep.min(left));
                }
            }
        }
        let n = self.ready.len().min(max as usize);
        self.events.extend(self.ready.drain(..n));
        n
    }

    /// fio's event(i), after `getevents`.
    pub fn event(&self, i: usize) -> Option<Event> {
        self.events.get(i).copied()
    }

    /// Commands in flight (sent, not yet reaped).
    pub fn outstanding(&self) -> usize {
        self.slots.outstanding()
    }

    /// Ends the thread's connections: qpairs first, then (when no other thread uses them)
    /// the controllers.
    pub fn shutdown(&mut self) {
        let n = std::mem::take(&mut self.counters);
        if n.ios > 0 {
            tracing::info!(
                "{} I/Os in {} commands; {} split above the maximum transfer; {} waited for room",
                n.ios,
                n.commands,
                n.split,
                n.waited
            );
        }
        for c in self.conns.drain(..) {
            let Conn { qp, bounce, ctrl } = c;
            qp.disconnect();
            drop(bounce);
            drop(ctrl);
        }
        self.files.clear();
        self.iomem = None;
        self.pins.clear();
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes() {
        assert_eq!(Op::from_raw(0), Some(Op::Read));
        assert_eq!(Op::from_raw(1), Some(Op::Write));
        assert_eq!(Op::from_raw(2), Some(Op::Trim));
        assert_eq!(Op::from_raw(3), Some(Op::Flush));
        assert_eq!(Op::from_raw(4), None);
    }

    #[test]
    fn events_beyond_max_wait_for_the_next_call() {
        let mut t = EngineThread::new(EngineOptions::default());
        t.init(8, 4096).unwrap();
        for tag in 0..5 {
            t.ready.push_back(Event { tag, err: 0 });
        }
        assert_eq!(t.getevents(1, 3, Some(Duration::ZERO)), 3);
        assert_eq!(t.event(0), Some(Event { tag: 0, err: 0 }));
        assert_eq!(t.event(2), Some(Event { tag: 2, err: 0 }));
        assert_eq!(t.event(3), None);
        // min above what can ever come does not wait forever.
        assert_eq!(t.getevents(8, 8, None), 2);
        assert_eq!(t.event(1), Some(Event { tag: 4, err: 0 }));
        assert_eq!(t.getevents(0, 8, None), 0);
    }

    #[test]
    fn bad_calls_are_errors_not_panics() {
        let mut t = EngineThread::new(EngineOptions::default());
        assert_eq!(
            t.open("traddr=10.0.0.1 subnqn=nqn.x").unwrap_err().errno,
            libc::EINVAL,
            "before init"
        );
        assert_eq!(t.init(0, 4096).unwrap_err().errno, libc::EINVAL);
        t.init(4, 4096).unwrap();
        assert_eq!(t.open("no-such-thing").unwrap_err().errno, libc::EINVAL);
        let e = t.open("trtype=RDMA traddr=10.0.0.1").unwrap_err();
        assert!(e.msg.contains("discovery"), "{}", e.msg);
        assert_eq!(
            t.open("traddr=10.0.0.1 subnqn=nqn.x ns=0")
                .unwrap_err()
                .errno,
            libc::EINVAL
        );
        assert_eq!(
            t.queue(0, Op::Read, 0, 4096, None, 1).unwrap_err().errno,
            libc::EBADF
        );
        assert_eq!(t.close(3).unwrap_err().errno, libc::EBADF);
        assert_eq!(t.getevents(1, 4, None), 0, "nothing outstanding: no wait");
    }
}

//! The transport-independent target: subsystems, controllers, queues, requests, and the
//! per-reactor context [`CoreCtx`] every transport poll group calls into.
//!
//! Each reactor owns one `CoreCtx`: its copy of the subsystem snapshots, its bdev channels (one
//! per namespace), the admin-side state of the controllers whose admin queue it serves, and the
//! wakeups it owes to pending requests. Nothing in it is shared with another reactor except
//! through the atomics of [`controller::ControllerShared`] and the connect-path tables of
//! [`subsystem::SubsystemShared`]. How the control plane's snapshots land on it is in
//! `snapshot.rs`; the namespace table in `namespaces.rs`; its bdev I/O (submitting,
//! polling channels, counting finished I/O) in `bdev_io.rs`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nvmf_common::spec::{Status, FABRICS_OPCODE};
use rustc_hash::FxHashMap;

use crate::cmd;
use crate::core::controller::ControllerLocal;
use crate::core::namespaces::{GroupNamespace, NamespaceTable, NsSlot};
use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Op, Prepared, ReqTag, Request, Wakeup};
use crate::core::reservation::{Notice, Ticket};
use crate::core::subsystem::{Namespace, Referral, SubsystemConfig, SubsystemId};

pub mod ana;
mod bdev_io;
pub(crate) mod compare_buffers;
pub mod controller;
pub mod driver;
pub mod latency;
pub mod limits;
pub(crate) mod namespaces;
pub mod poll_group;
pub mod queue;
pub mod request;
pub mod reservation;
mod snapshot;
pub mod status;
pub mod subsystem;
pub mod transport;

/// Default of [`CoreCtx::connect_timeout_ms`]: hosts send Connect right after the transport
/// connection is up (Linux within milliseconds); ten seconds is generous even under emulation.
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// Default of [`CoreCtx::transfer_timeout_ms`]: Linux's I/O timeout (`nvme_core.io_timeout`,
/// 30 s). A response or data transfer the host has not taken by then belongs to a command the
/// host has given up on; holding its buffer longer only starves other hosts.
pub const TRANSFER_TIMEOUT_MS: u64 = 30_000;

/// Period of the housekeeping tick ([`CoreCtx::is_tick`]): far below any timeout it serves
/// (keep-alive granularity is 100 ms, the connect timeout seconds).
pub const TICK_MS: u64 = 10;

/// The longest an idle reactor sleeps (when no keep-alive is due sooner): what a change
/// another reactor makes (a controller failed there, a reservation notice) may wait before
/// this one looks. Ten wake-ups a second cost nothing measurable.
pub const IDLE_SLEEP_MAX_MS: u64 = 100;

pub use poll_group::{GroupStats, PollGroup, PollGroupHandle, PollGroupMsg};

/// What a finished I/O command counts as in its namespace's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    Read,
    Write,
    Error,
}

/// What this reactor's housekeeping ticks looked at: tests check that idle connections are
/// not among them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Housekeeping {
    /// Controllers whose keep-alive deadline came up.
    pub controllers_checked: u64,
    /// Queue pairs a transport's tick examined (closing, unconnected, or with transfers in
    /// flight; or every one, on the rare tick after some controller failed).
    pub qpairs_checked: u64,
    /// Ticks on which some controller had failed since the previous one.
    pub failure_walks: u64,
}

/// Facts about the whole target that every reactor reads.
#[derive(Debug)]
pub struct TargetInfo {
    /// Discovery Log generation counter: bumped on every change a discovery host could see.
    pub discovery_genctr: AtomicU64,
    pub firmware_revision: String,
    /// Queue pairs per host and in all (checked at Connect).
    pub qpair_limits: limits::QpairLimits,
}

impl Default for TargetInfo {
    fn default() -> Self {
        Self {
            discovery_genctr: AtomicU64::new(0),
            firmware_revision: env!("CARGO_PKG_VERSION").to_string(),
            qpair_limits: limits::QpairLimits::default(),
        }
    }
}

impl TargetInfo {
    pub fn bump_discovery_generation(&self) {
        self.discovery_genctr.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) struct GroupSubsystem {
    pub config: Arc<SubsystemConfig>,
    /// NSID -> the namespace's entry in the reactor's [`NamespaceTable`]. Looked up once per
    /// command: integer keys the control plane inserts take a multiply, not SipHash (a
    /// host's NSID only looks up, so it cannot lengthen a probe).
    pub namespaces: FxHashMap<u32, NsSlot>,
}

/// A reservation command waiting for the PTPL writer thread (see
/// [`CoreCtx::await_persisted`]), with the notices its change raised: they go out only
/// once the change is written, so no host hears of one that a failed write undid.
pub(crate) struct PersistWait {
    pub tag: ReqTag,
    pub tickets: Vec<Arc<Ticket>>,
    pub notices: Vec<Notice>,
    /// The subsystem and namespace the notices are about (none for Set Features).
    pub notices_about: Option<(SubsystemId, Arc<Namespace>)>,
}

/// Superseded keep-alive heap entries a reactor tolerates beyond one per controller before
/// it drops them all (a few, so that a burst of Set Features does not rebuild the heap each
/// time).
const KEEP_ALIVE_HEAP_SLACK: usize = 64;

/// A core on its own reads the system clock after every turn that found work; on idle turns,
/// once per this many turns. Where the clock is not served from user space (the lab's TCG
/// guests run on HPET, where each read is a syscall and an emulated device access) a read per
/// turn made a spinning reactor a syscall loop. Timestamps of work are as fresh as before; an
/// idle turn's may be this many turns old (timers are in ms).
const CLOCK_EVERY_TURNS: u32 = 8;
/// A core whose reactor hands it the readings it makes anyway ([`CoreCtx::observe_clock`]:
/// after every turn that found work, and at the looks an idle streak takes) reads the clock
/// itself only after this many turns without one. The core reading beside the reactor made
/// two readings per burst of work, and some 19 per lull between bursts at queue depth 32.
const CLOCK_EVERY_TURNS_FED: u32 = 256;

/// Where a core's time comes from: the system's monotonic clock, or a simulation's.
enum Clock {
    System(Instant),
    Virtual(Arc<AtomicU64>),
}

impl Clock {
    fn now_ns(&self) -> u64 {
        match self {
            Clock::System(start) => start.elapsed().as_nanos() as u64,
            Clock::Virtual(ns) => ns.load(Ordering::Relaxed),
        }
    }
}

pub struct CoreCtx {
    pub group: usize,
    pub info: Arc<TargetInfo>,
    pub(crate) subsystems: FxHashMap<SubsystemId, GroupSubsystem>,
    by_nqn: HashMap<String, SubsystemId>,
    /// The target's discovery referrals, as the control plane last sent them.
    pub(crate) referrals: Arc<Vec<Referral>>,
    pub(crate) controllers: FxHashMap<(SubsystemId, u16), ControllerLocal>,
    /// The namespaces this reactor has channels to, found by a request's [`NsSlot`].
    ns_table: NamespaceTable,
    /// The namespaces with I/O out (`GroupNamespace::out` above zero): the only channels a
    /// turn polls, so namespaces without I/O cost a busy one nothing (polling every channel
    /// made one host's I/O cost grow with the volumes others had exported to them). Capacity
    /// for every namespace of the table, so pushing never allocates.
    busy_namespaces: Vec<NsSlot>,
    /// Namespaces removed while I/O was in flight: polled until drained, then dropped.
    draining: Vec<GroupNamespace>,
    /// I/O handed to a channel (or its retry queue) and not yet reported done. A turn with
    /// none skips the channels: polling every namespace's channel on every turn made a
    /// spinning reactor's empty turn cost grow with its namespaces. Exact by construction:
    /// every I/O enters through `submit_io` and leaves as one completion a channel hands to
    /// `poll_namespace` (counted there, not taken from what `poll` returns).
    bdev_io_outstanding: usize,
    wakeups: Vec<(ReqTag, Wakeup)>,
    /// Reservation commands whose new state the PTPL writer thread has yet to write: each
    /// completes when all its tickets settle (looked at every turn while there are any).
    persist_waits: Vec<PersistWait>,
    /// Reads and writes that finished before the clock moved past their start (completed in
    /// the step that submitted them): their latency is taken at the next reading, so a
    /// memory-backed bdev's I/O is not reported as taking no time at all. They all started at
    /// `now_ns`, so each entry is (namespace, kind, how many): a turn's I/Os on one namespace
    /// are one entry, recorded at once. Capacity fixed at creation; past it, an I/O counts
    /// with the clock it has.
    latency_waiting: Vec<(NsSlot, Counted, u32)>,
    pub(crate) compare_buffers: compare_buffers::CompareBuffers,
    clock: Clock,
    now_ms: u64,
    now_ns: u64,
    /// Turns since `now_ns` was read.
    turns_since_clock: u32,
    /// Readings of the clock this core made itself ([`Self::read_clock`]).
    clock_reads: u64,
    /// Idle turns between the core's own readings: fewer once a reactor hands it readings.
    clock_every: u32,
    /// A queue with no controller this long after the core first saw it is disconnected: a
    /// connection that never sends Connect (or only failed ones) holds no resources for good.
    pub connect_timeout_ms: u64,
    /// A queue whose host has not taken a response (or a data transfer) this long is
    /// disconnected, which frees the buffers its requests hold (transports check it).
    pub transfer_timeout_ms: u64,
    /// Whether this turn is a timer tick (see [`TICK_MS`]), and when the next one is due.
    tick: bool,
    next_tick_ms: u64,
    /// This reactor's `nvmf_get_stats` counters.
    pub stats: GroupStats,
    /// Keep-alive deadlines of the controllers whose admin queue this reactor serves,
    /// earliest first: a tick looks only at the controllers that are due.
    keep_alive_timers: BinaryHeap<Reverse<(u64, (SubsystemId, u16))>>,
    /// [`controller::failure_count`] and [`controller::notice_count`] at the last tick.
    seen_failures: u64,
    seen_notices: u64,
    /// Whether some controller failed between the last tick and this one.
    failures_moved: bool,
    pub housekeeping: Housekeeping,
}

impl CoreCtx {
    pub fn new(group: usize, info: Arc<TargetInfo>) -> Self {
        Self {
            group,
            info,
            subsystems: FxHashMap::default(),
            by_nqn: HashMap::new(),
            referrals: Arc::new(Vec::new()),
            controllers: FxHashMap::default(),
            ns_table: NamespaceTable::default(),
            busy_namespaces: Vec::new(),
            draining: Vec::new(),
            bdev_io_outstanding: 0,
            wakeups: Vec::with_capacity(256),
            persist_waits: Vec::new(),
            latency_waiting: Vec::with_capacity(bdev_io::LATENCY_WAITING_MAX),
            compare_buffers: Default::default(),
            clock: Clock::System(Instant::now()),
            now_ms: 0,
            now_ns: 0,
            turns_since_clock: CLOCK_EVERY_TURNS,
            clock_reads: 0,
            clock_every: CLOCK_EVERY_TURNS,
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
            transfer_timeout_ms: TRANSFER_TIMEOUT_MS,
            tick: true,
            next_tick_ms: 0,
            stats: GroupStats::default(),
            keep_alive_timers: BinaryHeap::new(),
            seen_failures: controller::failure_count(),
            seen_notices: controller::notice_count(),
            failures_moved: false,
            housekeeping: Housekeeping::default(),
        }
    }

    /// Starts (or restarts, after Set Features changed KATO) a controller's keep-alive timer:
    /// one entry in a deadline heap, looked at when due. A host's keep-alives only move the
    /// deadline the entry finds when it comes up, and so does a longer KATO: a new entry is
    /// pushed only when no live one comes up by the new deadline. An entry superseded by an
    /// earlier one is dropped when it comes up, or sooner when superseded entries pile up.
    pub(crate) fn arm_keep_alive(&mut self, key: (SubsystemId, u16)) {
        let Some(local) = self.controllers.get_mut(&key) else {
            return;
        };
        // KATO 0: the live entry, if any, finds no deadline when it comes up and goes then.
        let Some(due) = local.shared.keep_alive_deadline_ms() else {
            return;
        };
        if local.keep_alive_due != 0 && local.keep_alive_due <= due {
            return;
        }
        local.keep_alive_due = due;
        self.keep_alive_timers.push(Reverse((due, key)));
        // A host lowering its KATO again and again, or connecting and disconnecting
        // controllers with KATOs of weeks, must not grow the heap with entries that come up
        // only then: past twice the live ones, the superseded ones go now.
        if self.keep_alive_timers.len() > 2 * self.controllers.len() + KEEP_ALIVE_HEAP_SLACK {
            let controllers = &self.controllers;
            self.keep_alive_timers.retain(|Reverse((due, key))| {
                controllers
                    .get(key)
                    .is_some_and(|local| local.keep_alive_due == *due)
            });
        }
    }

    /// Entries in the keep-alive deadline heap, superseded ones included (tests bound it).
    pub fn keep_alive_timer_count(&self) -> usize {
        self.keep_alive_timers.len()
    }

    /// True on a tick when some controller (of any reactor) failed since the previous tick:
    /// transports then look at all their connections for queues of a failed controller. On
    /// every other tick they look only at the connections that have something pending.
    pub fn controllers_failed(&self) -> bool {
        self.tick && self.failures_moved
    }

    /// Whether the transport should disconnect `q`: its controller failed, was reset to a
    /// fatal state or torn down, it is an I/O queue of a controller reset since (CC.EN 1 to
    /// 0 deletes the I/O queues), or no Connect succeeded within `connect_timeout_ms`.
    pub fn should_disconnect(&self, q: &mut QueueState) -> bool {
        if let Some(ctrl) = &q.ctrl {
            return ctrl.is_failed() || (!q.is_admin() && ctrl.resets() != q.resets_at_connect);
        }
        let since = *q.unconnected_since_ms.get_or_insert(self.now_ms);
        self.now_ms.saturating_sub(since) >= self.connect_timeout_ms
    }

    /// Runs this core on virtual time: nanoseconds read from `ns` each turn (a simulated
    /// fabric's clock), so timers fire when the simulation says, the same on every run.
    pub fn use_virtual_clock(&mut self, ns: Arc<AtomicU64>) {
        self.clock = Clock::Virtual(ns);
        self.now_ns = self.clock.now_ns();
        self.now_ms = self.now_ns / 1_000_000;
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The clock at the start of this turn in nanoseconds (request latency counters).
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Reads the clock now (after a sleep the last reading is old); turns read it themselves
    /// as [`CLOCK_EVERY_TURNS`] says.
    pub fn read_clock(&mut self) {
        self.clock_reads += 1;
        self.set_now(self.clock.now_ns());
    }

    /// Takes a reading of the system clock made by the reactor (a simulation's virtual clock
    /// ignores it: that one is read every turn, at no cost).
    pub fn observe_clock(&mut self, now: Instant) {
        if let Clock::System(start) = &self.clock {
            let ns = now.saturating_duration_since(*start).as_nanos() as u64;
            // A reading taken before this core's last one must not move time back.
            self.set_now(ns.max(self.now_ns));
            self.clock_every = CLOCK_EVERY_TURNS_FED;
        }
    }

    fn set_now(&mut self, ns: u64) {
        if !self.latency_waiting.is_empty() {
            self.record_waiting_latencies(ns.saturating_sub(self.now_ns));
        }
        self.now_ns = ns;
        self.now_ms = ns / 1_000_000;
        self.turns_since_clock = 0;
    }

    /// How many times this core read the clock itself.
    pub fn clock_reads(&self) -> u64 {
        self.clock_reads
    }

    pub(crate) fn subsystem_by_nqn(&self, nqn: &str) -> Option<&GroupSubsystem> {
        self.by_nqn.get(nqn).and_then(|id| self.subsystems.get(id))
    }

    pub(crate) fn subsystem_configs(&self) -> impl Iterator<Item = &Arc<SubsystemConfig>> {
        self.subsystems.values().map(|s| &s.config)
    }

    /// Step 1 of every command: parse and validate, decide the data phase. What the command
    /// is gets decided here, once: `execute` and `resume` run the request's [`Op`].
    pub fn prepare(&mut self, q: &mut QueueState, req: &mut Request) -> Prepared {
        req.rsp.cid = req.cmd.cid;
        req.rsp.sq_id.set(q.qid);
        req.rsp.sq_head.set(q.advance_sq_head());
        let decided = if req.cmd.fuse() != 0 {
            // Fused operations (Compare and Write) are not supported, and Identify FUSES says
            // so: executing either half alone would break the atomicity the host asked for,
            // so both are refused, as nvmet does.
            Err(Status::INVALID_FIELD.with_dnr())
        } else if req.cmd.opcode == FABRICS_OPCODE {
            cmd::fabrics::prepare(self, q, req).map(|p| (Op::Fabrics, p))
        } else if !q.is_connected() {
            Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr())
        } else if q.is_admin() {
            cmd::admin::prepare(self, q, req).map(|p| (Op::Admin, p))
        } else {
            cmd::io::prepare(self, q, req)
        };
        match decided {
            Ok((op, prepared)) => {
                req.op = op;
                if let Prepared::Data { dir, len } = prepared {
                    req.dir = dir;
                    req.len = len;
                }
                prepared
            }
            Err(status) => {
                req.op = Op::Unprepared;
                self.note_error(q, req, status);
                req.complete(status);
                Prepared::Complete
            }
        }
    }

    /// Step 2: run the command. Host data, if any, is in `req.data`.
    pub fn execute(&mut self, q: &mut QueueState, req: &mut Request) -> Exec {
        // Pool buffers pass from host to host. Admin, fabrics and discovery handlers write
        // only what they know, so a controller-to-host buffer starts as zeroes: no byte a
        // handler did not write leaves the target. (I/O reads are filled whole by the bdev,
        // and a failed command transfers no data.)
        if req.dir == DataDirection::ControllerToHost && matches!(req.op, Op::Fabrics | Op::Admin) {
            req.data_mut().fill(0);
        }
        let exec = match req.op {
            Op::Fabrics => cmd::fabrics::execute(self, q, req),
            Op::Admin => cmd::admin::execute(self, q, req),
            Op::Io(io) => cmd::io::execute(self, q, req, io),
            Op::Reservation(resv) => cmd::reservation::execute(self, q, req, resv),
            Op::Unprepared => {
                tracing::error!(tag = ?req.tag, "execute of a request that was not prepared");
                req.fail(Status::INTERNAL_ERROR.with_dnr())
            }
        };
        self.after(q, req, exec)
    }

    /// Step 2 again, for a request that was pending.
    pub fn resume(&mut self, q: &mut QueueState, req: &mut Request, wakeup: Wakeup) -> Exec {
        let exec = match wakeup {
            Wakeup::Bdev(done) => match req.op {
                Op::Io(io) => cmd::io::on_bdev_complete(self, req, io, done),
                // Only the shutdown sequence's flushes are bdev I/O of a fabrics command.
                Op::Fabrics => cmd::fabrics::on_shutdown_flush(q, req, done),
                Op::Admin | Op::Reservation(_) | Op::Unprepared => {
                    tracing::error!(tag = ?req.tag, op = ?req.op,
                        "bdev completion for a request that submitted no bdev I/O");
                    req.fail(Status::INTERNAL_ERROR.with_dnr())
                }
            },
            Wakeup::Finished { status, dw0 } => {
                req.complete_with(status, dw0);
                Exec::Complete
            }
            Wakeup::Aborted(status) => req.fail(status),
            Wakeup::CompareBuffer => match req.op {
                // Run again from the start: the namespace and its reservation may have changed
                // while it waited.
                Op::Io(io) if q.ctrl.is_some() => {
                    self.compare_buffers.resuming(true);
                    let exec = cmd::io::execute(self, q, req, io);
                    self.compare_buffers.resumed();
                    exec
                }
                _ => {
                    self.compare_buffers.resuming(false);
                    req.fail(Status::ABORTED_SQ_DELETION)
                }
            },
        };
        self.after(q, req, exec)
    }

    #[inline]
    fn after(&mut self, q: &QueueState, req: &Request, exec: Exec) -> Exec {
        if exec == Exec::Complete {
            if req.op.is_nvme_io() {
                self.stats.completed_nvme_io += 1;
            }
            let status = req.status();
            if !status.is_success() {
                self.note_error(q, req, status);
            }
        }
        exec
    }

    #[cold]
    #[inline(never)]
    fn note_error(&mut self, q: &QueueState, req: &Request, status: Status) {
        let Some(ctrl) = &q.ctrl else { return };
        let key = (ctrl.subsystem_id, ctrl.cntlid);
        if let Some(local) = self.controllers.get_mut(&key) {
            cmd::admin::record_error(local, q.qid, req, status);
        }
    }

    /// A queue pair is gone (host disconnect, transport error, teardown). Releases its queue
    /// id; when it was an admin queue, the controller goes with it.
    pub fn queue_closed(&mut self, q: &mut QueueState) {
        let Some(ctrl) = q.ctrl.take() else { return };
        if std::mem::take(&mut q.admitted) {
            self.info.qpair_limits.release(&ctrl.hostnqn);
        }
        if q.is_admin() {
            self.stats.current_admin_qpairs = self.stats.current_admin_qpairs.saturating_sub(1);
            ctrl.fail();
            let key = (ctrl.subsystem_id, ctrl.cntlid);
            if let Some(mut local) = self.controllers.remove(&key) {
                for tag in local.outstanding_aers.drain(..) {
                    self.wake(tag, Wakeup::Aborted(Status::ABORTED_SQ_DELETION));
                }
            }
            if let Some(sub) = self.subsystems.get(&ctrl.subsystem_id) {
                sub.config.shared.remove_controller(ctrl.cntlid);
            }
            tracing::info!(cntlid = ctrl.cntlid, subnqn = %ctrl.subnqn, hostnqn = %ctrl.hostnqn, "controller destroyed");
        } else {
            self.stats.current_io_qpairs = self.stats.current_io_qpairs.saturating_sub(1);
            ctrl.release_qid(q.qid);
        }
    }

    pub(crate) fn wake(&mut self, tag: ReqTag, wakeup: Wakeup) {
        self.wakeups.push((tag, wakeup));
    }

    /// Holds a (pending) reservation command until every ticket of `wait` settles: success
    /// if every write reached the PTPL file, else Internal Error.
    pub(crate) fn await_persisted(&mut self, wait: PersistWait) {
        self.persist_waits.push(wait);
    }

    /// Wakes the commands whose PTPL writes are all done; returns how many.
    #[cold]
    #[inline(never)]
    fn settle_persisted(&mut self) -> usize {
        let mut settled = 0;
        let mut i = 0;
        while i < self.persist_waits.len() {
            let outcome = self.persist_waits[i]
                .tickets
                .iter()
                .try_fold(true, |all, t| t.outcome().map(|written| all && written));
            let Some(written) = outcome else {
                i += 1;
                continue;
            };
            let wait = self.persist_waits.swap_remove(i);
            let status = if written {
                // Only a change that happened is told to the hosts it concerns.
                if let Some((sid, ns)) = &wait.notices_about {
                    cmd::reservation::deliver(self, *sid, ns, &wait.notices);
                }
                Status::SUCCESS
            } else {
                Status::INTERNAL_ERROR
            };
            self.wake(wait.tag, Wakeup::Finished { status, dw0: 0 });
            settled += 1;
        }
        settled
    }

    /// Moves the wakeups owed so far into `out` (which the caller keeps for reuse).
    pub fn take_wakeups(&mut self, out: &mut Vec<(ReqTag, Wakeup)>) {
        std::mem::swap(&mut self.wakeups, out);
    }

    pub fn has_wakeups(&self) -> bool {
        !self.wakeups.is_empty()
    }

    /// Polls bdev channels, retries refused I/O and runs timers. Returns work done.
    /// `busy`: the turn found work before this (the clock is read after every such turn: here,
    /// or by the reactor when it feeds this core its readings).
    /// Inlined into the reactor's turn: most turns have no bdev I/O out and no timer due,
    /// and then this is a few compares (the work itself is in the functions it calls).
    #[inline]
    pub fn poll(&mut self, busy: bool) -> usize {
        self.turns_since_clock += 1;
        if (busy && self.clock_every != CLOCK_EVERY_TURNS_FED)
            || self.turns_since_clock >= self.clock_every
            || matches!(self.clock, Clock::Virtual(_))
        {
            self.read_clock();
        }
        let mut work = 0;
        if self.bdev_io_outstanding > 0 {
            work = self.poll_bdevs();
        }
        if !self.persist_waits.is_empty() {
            work += self.settle_persisted();
        }
        if self.compare_buffers.has_waiters() {
            work += self.compare_buffers.wake(&mut self.wakeups);
        }
        self.tick = self.now_ms >= self.next_tick_ms;
        if self.tick {
            work += self.on_tick();
        }
        work
    }

    /// The housekeeping timer ([`TICK_MS`]): timeouts set by RPC, failed controllers,
    /// keep-alive deadlines, reservation notices.
    #[cold]
    #[inline(never)]
    fn on_tick(&mut self) -> usize {
        self.next_tick_ms = self.now_ms + TICK_MS;
        // Timeouts set by RPC (0: never set, keep this core's own).
        let limits = &self.info.qpair_limits;
        for (set, mine) in [
            (&limits.connect_timeout_ms, &mut self.connect_timeout_ms),
            (&limits.transfer_timeout_ms, &mut self.transfer_timeout_ms),
        ] {
            let v = set.load(Ordering::Relaxed);
            if v != 0 {
                *mine = v;
            }
        }
        let failures = controller::failure_count();
        self.failures_moved = failures != self.seen_failures;
        self.seen_failures = failures;
        if self.failures_moved {
            self.housekeeping.failure_walks += 1;
        }
        self.check_keep_alive() + self.raise_reservation_notices()
    }

    /// Controllers whose Reservation Notification log got a notice (posted by whichever
    /// reactor ran the reservation command) get their Asynchronous Event here, on the reactor
    /// that owns their admin queue.
    fn raise_reservation_notices(&mut self) -> usize {
        let notices = controller::notice_count();
        if notices == self.seen_notices {
            return 0;
        }
        self.seen_notices = notices;
        let keys: Vec<_> = self
            .controllers
            .iter()
            .filter(|(_, c)| c.shared.take_reservation_event())
            .map(|(k, _)| *k)
            .collect();
        for &key in &keys {
            cmd::admin::raise_reservation_notice(self, key);
        }
        keys.len()
    }

    /// True on the turn of a timer tick: per-connection housekeeping (keep-alive expiry,
    /// connect timeouts, reaping closed connections) walks every connection only then, so
    /// idle connections cost a reactor nothing on the other turns.
    pub fn is_tick(&self) -> bool {
        self.tick
    }

    /// Fails the controllers whose keep-alive deadline passed; the others that came up are
    /// put back at their current deadline.
    fn check_keep_alive(&mut self) -> usize {
        let now = self.now_ms;
        let mut expired = 0;
        while let Some(&Reverse((due, key))) = self.keep_alive_timers.peek() {
            if due > now {
                break;
            }
            self.keep_alive_timers.pop();
            let Some(local) = self.controllers.get_mut(&key) else {
                continue;
            };
            if local.keep_alive_due != due {
                continue;
            }
            self.housekeeping.controllers_checked += 1;
            let ctrl = &local.shared;
            match ctrl.keep_alive_deadline_ms() {
                Some(next) if next > now && !ctrl.is_failed() => {
                    local.keep_alive_due = next;
                    self.keep_alive_timers.push(Reverse((next, key)));
                }
                Some(_) if !ctrl.is_failed() => {
                    tracing::warn!(cntlid = ctrl.cntlid, subnqn = %ctrl.subnqn, hostnqn = %ctrl.hostnqn,
                        kato_ms = ctrl.kato_ms(), "keep alive timeout: controller failed");
                    ctrl.fail();
                    local.keep_alive_due = 0;
                    expired += 1;
                }
                _ => local.keep_alive_due = 0,
            }
        }
        expired
    }

    /// The namespace `nsid` of subsystem `sid` if a controller of `hostnqn` sees it
    /// (namespace masking; a masked one is an inactive NSID to every other host): the one
    /// lookup of a command's namespace, in `prepare`.
    pub(crate) fn resolve_namespace(
        &self,
        sid: SubsystemId,
        nsid: u32,
        hostnqn: &str,
    ) -> Option<NsSlot> {
        let slot = *self.subsystems.get(&sid)?.namespaces.get(&nsid)?;
        let g = self.ns_table.get(slot)?;
        g.config.ns_visible(&g.ns, hostnqn).then_some(slot)
    }

    /// The namespace a request resolved, if this reactor still serves it.
    #[inline]
    pub(crate) fn namespace(&self, slot: NsSlot) -> Option<&GroupNamespace> {
        self.ns_table.get(slot)
    }

    pub(crate) fn namespace_mut(&mut self, slot: NsSlot) -> Option<&mut GroupNamespace> {
        self.ns_table.get_mut(slot)
    }

    /// The entry of namespace `nsid` of subsystem `sid`, whoever sees it.
    pub(crate) fn namespace_slot(&self, sid: SubsystemId, nsid: u32) -> Option<NsSlot> {
        self.subsystems.get(&sid)?.namespaces.get(&nsid).copied()
    }

    /// The namespace if a controller of `hostnqn` sees it (namespace masking); a masked one is
    /// an inactive NSID to every other host.
    pub(crate) fn visible_namespace(
        &self,
        subsystem: SubsystemId,
        nsid: u32,
        hostnqn: &str,
    ) -> Option<&Arc<Namespace>> {
        let slot = self.resolve_namespace(subsystem, nsid, hostnqn)?;
        self.ns_table.get(slot).map(|g| &g.ns)
    }

    pub(crate) fn subsystem(&self, id: SubsystemId) -> Option<&Arc<SubsystemConfig>> {
        self.subsystems.get(&id).map(|s| &s.config)
    }

    /// How long this reactor may sleep with nothing to poll: `None` while wakeups are owed
    /// or bdev I/O is in flight (backends are polled); else until the next keep-alive
    /// deadline, at most [`IDLE_SLEEP_MAX_MS`] (1 ms while a PTPL write is awaited).
    pub fn sleep_bound(&self) -> Option<std::time::Duration> {
        if self.has_wakeups() || self.io_in_flight() > 0 {
            return None;
        }
        let mut ms = IDLE_SLEEP_MAX_MS;
        if !self.persist_waits.is_empty() {
            // The writer thread does not wake reactors: look again soon.
            ms = 1;
        }
        if let Some(Reverse((due, _))) = self.keep_alive_timers.peek() {
            ms = ms.min(due.saturating_sub(self.now_ms));
        }
        Some(std::time::Duration::from_millis(ms))
    }
}

//! I/O queue pairs: what a polling thread submits to and polls.
//!
//! An [`IoQpair`] is `Send` and meant for exactly one thread. Submitting takes the caller's
//! registered [`IoBuf`] (from a pool registered with [`Controller::register_pool`]) and a
//! `u64` tag; the matching [`IoCompletion`] gives both back with the status. Per command
//! the qpair keeps a fixed slot (indexed by CID) with the tag, the buffer, the command and
//! its submission time; nothing is allocated or locked on the way.
//!
//! Timeouts: every [`TIMEOUT_SCAN`] the slots are scanned; a command older than the I/O
//! timeout resets the association (as Linux does) and fails with [`IoStatus::Timeout`];
//! with a reconnect policy it is retried on the new association instead, up to
//! [`MAX_RETRIES`] times.
//!
//! On a broken connection the outstanding commands either wait in the qpair's requeue for
//! the reconnect (when the controller has a [`Reconnect`](crate::Reconnect) policy) or fail
//! at once with [`IoStatus::TransportError`]. In failover mode
//! ([`IoQpair::set_failover`], for [`crate::path::MultipathQpair`]) they come back at once
//! with [`IoStatus::PathError`] so another path can serve them, while the qpair still
//! reconnects in the background.
//!
//! Time (submission stamps, the timeout scan) is the verbs provider's clock
//! ([`Verbs::now`]), so a simulated fabric can run it virtually.
//!
//! [`Controller::register_pool`]: crate::Controller::register_pool

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::buffer::IoBuf;
use nvmf_common::rdma::{AccessFlags, DmaBuf, RealVerbs, Sge, Verbs, VerbsMr, VerbsPd};
use nvmf_common::spec::{Command, Completion, ConnectCommand, ConnectData, Status};
use zerocopy::IntoBytes;

use crate::controller::{connect_error, Shared, STATE_LIVE, STATE_RESETTING};
use crate::error::{Error, QueueFault, Result};
use crate::transport::{Data, KeyStats, RdmaQueue, POLL_BATCH};

/// Times a command is resubmitted after timing out (with reconnect configured), as Linux's
/// `nvme_max_retries`.
pub const MAX_RETRIES: u8 = 5;

/// How often outstanding commands are checked against the timeout (and the CM channel for a
/// disconnect).
pub const TIMEOUT_SCAN: Duration = Duration::from_millis(100);

/// Data direction of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDir {
    None,
    /// Host to controller (Write, Compare, Dataset Management).
    ToController,
    /// Controller to host (Read).
    FromController,
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoStatus {
    /// The controller's completion status (success or an NVMe error).
    Nvme(Status),
    /// Older than the I/O timeout (and out of retries); the association was reset.
    Timeout,
    /// The connection broke and no reconnect is configured.
    TransportError,
    /// The controller is gone for good (reconnect gave up, or it was deleted).
    ControllerLost,
    /// The connection broke and the qpair is in failover mode: the command was not
    /// completed by the controller (it may or may not have executed) and is handed back for
    /// another path; the qpair reconnects meanwhile.
    PathError,
    /// Multipath: no path was usable within the fast-io-fail timeout, or every path's
    /// controller is lost.
    NoPath,
}

impl IoStatus {
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Nvme(s) if s.is_success())
    }
}

impl fmt::Display for IoStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nvme(s) => write!(f, "{s}"),
            Self::Timeout => f.write_str("command timed out"),
            Self::TransportError => f.write_str("transport error (connection lost)"),
            Self::ControllerLost => f.write_str("controller lost"),
            Self::PathError => f.write_str("path error (connection lost, handed back)"),
            Self::NoPath => f.write_str("no usable path"),
        }
    }
}

/// A finished command.
#[derive(Debug)]
pub struct IoCompletion {
    pub tag: u64,
    pub status: IoStatus,
    /// Completion dword 0 (command specific).
    pub dw0: u32,
    /// The buffer the command was submitted with.
    pub buf: Option<IoBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitErrorKind {
    /// As many commands are outstanding as the qpair's depth.
    QueueFull,
    /// The qpair failed for good (see [`IoQpair::failure`]).
    Failed,
    /// The buffer is longer than the controller's maximum transfer.
    TooLarge,
    /// Invalid arguments (e.g. zero blocks, a block count above 65536, a buffer from a pool
    /// not registered on this controller).
    Invalid,
}

/// A refused submission; the buffer comes back.
#[derive(Debug)]
pub struct SubmitError {
    pub kind: SubmitErrorKind,
    pub buf: Option<IoBuf>,
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "submission refused: {:?}", self.kind)
    }
}

impl std::error::Error for SubmitError {}

/// Counters of one qpair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpairStats {
    pub submitted: u64,
    pub completed: u64,
    pub timeouts: u64,
    pub reconnects: u64,
    pub requeued: u64,
    /// Commands whose memory-window key the target invalidated with its response.
    pub remote_invalidations: u64,
    /// Commands whose key we invalidated (the target answered with a plain SEND).
    pub local_invalidations: u64,
}

impl QpairStats {
    fn add_keys(&mut self, k: KeyStats) {
        self.remote_invalidations += k.remote_invalidations;
        self.local_invalidations += k.local_invalidations;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpairState {
    Live,
    /// Waiting for the controller to reconnect; submissions are queued.
    Reconnecting,
    Failed,
}

struct Io {
    tag: u64,
    buf: Option<IoBuf>,
    cmd: Command,
    dir: DataDir,
    submitted: Instant,
    retries: u8,
}

/// Finds the slot whose command is older than `timeout` (the oldest such one).
pub(crate) fn find_expired<I>(slots: I, now: Instant, timeout: Duration) -> Option<usize>
where
    I: IntoIterator<Item = Option<Instant>>,
{
    slots
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .filter(|&(_, t)| now.saturating_duration_since(t) > timeout)
        .min_by_key(|&(_, t)| t)
        .map(|(i, _)| i)
}

enum Teardown {
    Fault(QueueFault),
    Timeout(u16),
    ControllerReset,
}

/// One I/O queue pair of a controller, over the verbs provider `V`.
pub struct IoQpair<V: Verbs = RealVerbs> {
    shared: Arc<Shared<V>>,
    qid: u16,
    depth: u16,
    queue: Option<RdmaQueue<V>>,
    state: QpairState,
    gen: u64,
    in_capsule: u32,
    max_xfer: u32,
    ios: Vec<Option<Io>>,
    requeue: VecDeque<Io>,
    pending_fault: Option<QueueFault>,
    raw: [(u16, Completion); POLL_BATCH],
    /// Work completions taken from the CQ per poll (1..=POLL_BATCH).
    poll_limit: usize,
    next_scan: Instant,
    failure: Option<String>,
    stats: QpairStats,
    /// Hand outstanding commands back on a broken connection instead of keeping them.
    failover: bool,
}

/// Connects queue `qid` of the controller `shared` describes: RDMA CM, then the Fabrics
/// Connect with the controller's current CNTLID.
fn connect_queue<V: Verbs>(shared: &Shared<V>, qid: u16, depth: u16) -> Result<RdmaQueue<V>> {
    let opts = &shared.opts;
    let (mut q, _) = RdmaQueue::connect(
        &shared.verbs,
        shared.peer,
        Some(&shared.pd),
        qid,
        depth,
        shared.windows,
        opts.connect_timeout,
    )?;
    let cntlid = shared.cntlid.load(Ordering::Acquire);
    let cd = ConnectData::new(shared.host.id, cntlid, &shared.tid.subnqn, &shared.host.nqn);
    let in_capsule = cd.as_bytes().len() <= shared.in_capsule.load(Ordering::Relaxed) as usize;
    let access = if in_capsule {
        AccessFlags::LOCAL_WRITE
    } else {
        AccessFlags::ALL_DATA
    };
    let mut buf = DmaBuf::<V>::new(&shared.pd, cd.as_bytes().len(), access)
        .map_err(|e| Error::rdma("registering the Connect data", e))?;
    buf.write_at(0, cd.as_bytes());
    let sge = buf.sge(0, buf.len()).expect("whole buffer");
    // As the Linux host: an I/O queue's Connect data travels in the capsule when the
    // controller takes that much (the admin queue has no in-capsule data).
    let data = if in_capsule {
        Data::InCapsule(sge)
    } else {
        Data::Keyed {
            addr: sge.addr,
            len: sge.length,
            rkey: buf.mr().rkey(),
        }
    };
    let mut cmd = ConnectCommand::new(0, qid, depth - 1, 0).to_command();
    let rsp = q.run_sync(&mut cmd, data, opts.connect_timeout, "Connect")?;
    if !rsp.status().is_success() {
        return Err(connect_error(
            shared.peer,
            qid,
            &shared.tid.subnqn,
            &shared.host.nqn,
            &rsp,
        ));
    }
    Ok(q)
}

impl<V: Verbs> IoQpair<V> {
    pub(crate) fn connect(shared: Arc<Shared<V>>, qid: u16, depth: u16) -> Result<Self> {
        let gen = shared.generation.load(Ordering::Acquire);
        let queue = connect_queue(&shared, qid, depth)?;
        Ok(Self {
            in_capsule: shared.in_capsule.load(Ordering::Relaxed),
            max_xfer: shared.max_xfer.load(Ordering::Relaxed),
            qid,
            depth,
            queue: Some(queue),
            state: QpairState::Live,
            gen,
            ios: (0..depth).map(|_| None).collect(),
            requeue: VecDeque::with_capacity(usize::from(depth)),
            pending_fault: None,
            raw: [(0, Completion::default()); POLL_BATCH],
            poll_limit: POLL_BATCH,
            next_scan: shared.verbs.now() + TIMEOUT_SCAN,
            failure: None,
            stats: QpairStats::default(),
            failover: false,
            shared,
        })
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The verbs provider of this qpair's controller (its clock is the qpair's).
    pub fn verbs(&self) -> &V {
        &self.shared.verbs
    }

    /// Failover mode, for a multipath layer: when the connection breaks (a queue error, a
    /// timeout, a controller reset), every command the qpair holds completes at once with
    /// [`IoStatus::PathError`] instead of waiting for the reconnect, which still happens in
    /// the background. Without a reconnect policy nothing changes (they fail with
    /// [`IoStatus::TransportError`]).
    pub fn set_failover(&mut self, on: bool) {
        self.failover = on;
    }

    /// Whether commands submitted now go out at once: the qpair is live and its controller
    /// has not started a reset it has yet to notice.
    pub fn is_usable(&self) -> bool {
        self.state == QpairState::Live
            && self.pending_fault.is_none()
            && self.shared.state() == STATE_LIVE
            && self.shared.generation.load(Ordering::Acquire) == self.gen
    }

    /// The address of the controller this qpair belongs to.
    pub fn peer(&self) -> std::net::SocketAddr {
        self.shared.peer
    }

    /// Commands that may be outstanding at once (submitted and not yet completed).
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// Commands submitted and not yet completed (sent or waiting to be).
    pub fn outstanding(&self) -> usize {
        self.ios.iter().filter(|i| i.is_some()).count() + self.requeue.len()
    }

    pub fn state(&self) -> QpairState {
        self.state
    }

    /// Why the qpair failed, once it has.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    pub fn stats(&self) -> QpairStats {
        let mut s = self.stats;
        if let Some(q) = &self.queue {
            s.add_keys(q.key_stats());
        }
        s
    }

    /// In-capsule data limit in force (writes up to this size travel inside the command).
    pub fn in_capsule_size(&self) -> u32 {
        self.in_capsule
    }

    pub fn max_transfer(&self) -> u32 {
        self.max_xfer
    }

    /// Read `nlb` blocks at `slba` into `buf` (`buf.len()` bytes are transferred).
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        self.submit_blocks(
            Command::read,
            nsid,
            slba,
            nlb,
            buf,
            DataDir::FromController,
            tag,
        )
    }

    /// Write `nlb` blocks at `slba` from `buf`.
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        self.submit_blocks(
            Command::write,
            nsid,
            slba,
            nlb,
            buf,
            DataDir::ToController,
            tag,
        )
    }

    /// Compare `nlb` blocks at `slba` with `buf` (a mismatch completes with Compare Failure).
    pub fn compare(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        self.submit_blocks(
            Command::compare,
            nsid,
            slba,
            nlb,
            buf,
            DataDir::ToController,
            tag,
        )
    }

    /// A Read / Write / Compare built by `build` (e.g. [`Command::read`]) carrying `buf`,
    /// once NLB is known to fit the command.
    #[allow(clippy::too_many_arguments)]
    fn submit_blocks(
        &mut self,
        build: fn(u16, u32, u64, u32) -> Command,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        dir: DataDir,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let buf = check_nlb(nlb, Some(buf))?;
        self.submit(build(0, nsid, slba, nlb), buf, dir, tag)
    }

    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        deallocate: bool,
        tag: u64,
    ) -> Result<(), SubmitError> {
        check_nlb(nlb, None)?;
        self.submit(
            Command::write_zeroes(0, nsid, slba, nlb, deallocate),
            None,
            DataDir::None,
            tag,
        )
    }

    pub fn flush(&mut self, nsid: u32, tag: u64) -> Result<(), SubmitError> {
        self.submit(Command::flush(0, nsid), None, DataDir::None, tag)
    }

    /// Dataset Management over `nr` ranges (16-byte `DsmRange` entries at the start of `buf`,
    /// whose length must be `nr * 16`).
    pub fn dataset_management(
        &mut self,
        nsid: u32,
        nr: u32,
        deallocate: bool,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        if !(1..=256).contains(&nr) || buf.len() != nr as usize * 16 {
            return Err(SubmitError {
                kind: SubmitErrorKind::Invalid,
                buf: Some(buf),
            });
        }
        self.submit(
            Command::dsm(0, nsid, nr, deallocate),
            Some(buf),
            DataDir::ToController,
            tag,
        )
    }

    /// Submits any I/O command; its data is `buf` (all of `buf.len()`), moving in `dir`. The
    /// CID and the data pointer are filled in here.
    pub fn submit(
        &mut self,
        cmd: Command,
        buf: Option<IoBuf>,
        dir: DataDir,
        tag: u64,
    ) -> Result<(), SubmitError> {
        if self.state == QpairState::Failed {
            return Err(SubmitError {
                kind: SubmitErrorKind::Failed,
                buf,
            });
        }
        if let Some(b) = &buf {
            if b.len() > self.max_xfer as usize || b.is_empty() {
                return Err(SubmitError {
                    kind: if b.is_empty() {
                        SubmitErrorKind::Invalid
                    } else {
                        SubmitErrorKind::TooLarge
                    },
                    buf,
                });
            }
        }
        if let Some(b) = &buf {
            let keyed = dir == DataDir::FromController
                || (dir == DataDir::ToController && b.len() as u64 > u64::from(self.in_capsule));
            // A window can only be bound to a region of its own PD, the controller's.
            let bindable = || match window_over::<V>(b, dir) {
                Some(Data::Window { mr, .. }) => self.shared.pd.holds(mr),
                _ => false,
            };
            if keyed && self.shared.windows && !bindable() {
                // Not from a pool registered on this controller.
                return Err(SubmitError {
                    kind: SubmitErrorKind::Invalid,
                    buf,
                });
            }
        }
        let inflight = usize::from(self.queue.as_ref().map_or(0, |q| q.outstanding() as u16));
        if inflight + self.requeue.len() >= usize::from(self.depth) {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        }
        let io = Io {
            tag,
            buf,
            cmd,
            dir,
            submitted: self.shared.verbs.now(),
            retries: 0,
        };
        self.stats.submitted += 1;
        if self.state == QpairState::Live && self.requeue.is_empty() && self.pending_fault.is_none()
        {
            if let Err(io) = self.post(io) {
                self.requeue.push_back(io);
            }
        } else {
            self.requeue.push_back(io);
        }
        Ok(())
    }

    /// Sends `io` on the live queue; gives it back when no slot is free or the post failed
    /// (then the fault is handled by the next poll).
    fn post(&mut self, mut io: Io) -> Result<(), Io> {
        let Some(q) = self.queue.as_mut() else {
            return Err(io);
        };
        let data = match (&io.buf, io.dir) {
            (None, _) | (_, DataDir::None) => Data::None,
            (Some(b), DataDir::ToController) if b.len() as u64 <= u64::from(self.in_capsule) => {
                Data::InCapsule(Sge {
                    addr: b.addr(),
                    length: b.len() as u32,
                    lkey: b.lkey(),
                })
            }
            (Some(b), dir) if q.has_windows() => match window_over(b, dir) {
                Some(data) => data,
                None => {
                    self.pending_fault = Some(QueueFault::Verb(
                        "the buffer's pool is not registered for memory windows on this \
                         controller (Controller::register_pool)"
                            .into(),
                    ));
                    return Err(io);
                }
            },
            (Some(b), _) => Data::Keyed {
                addr: b.addr(),
                len: b.len() as u32,
                rkey: b.rkey(),
            },
        };
        match q.submit(&mut io.cmd, data) {
            Ok(Some(cid)) => {
                self.ios[usize::from(cid)] = Some(io);
                Ok(())
            }
            Ok(None) => Err(io),
            Err(f) => {
                self.pending_fault = Some(f);
                Err(io)
            }
        }
    }

    /// At most `max` commands complete per [`poll`](Self::poll) (spdk_nvme_perf's `-C`);
    /// 0 restores the default, as many as one CQ batch holds.
    pub fn set_max_completions(&mut self, max: u32) {
        self.poll_limit = match max {
            0 => POLL_BATCH,
            n => (n as usize).min(POLL_BATCH),
        };
    }

    /// Polls for completions and appends them to `out` (give it capacity for `depth`
    /// entries up front and reuse it, so no call allocates). Also drives timeouts, failure
    /// handling and the reconnect of this qpair. Returns how many completions were added.
    pub fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let before = out.len();
        match self.state {
            QpairState::Live => self.poll_live(out),
            QpairState::Reconnecting => self.poll_down(out),
            QpairState::Failed => {}
        }
        let added = out.len() - before;
        self.stats.completed += added as u64;
        added
    }

    /// [`poll`](Self::poll) with a callback; the callback cannot submit (use `poll` with a
    /// vector for that).
    pub fn poll_with(
        &mut self,
        out: &mut Vec<IoCompletion>,
        mut f: impl FnMut(IoCompletion),
    ) -> usize {
        let n = self.poll(out);
        for c in out.drain(..) {
            f(c);
        }
        n
    }

    fn poll_live(&mut self, out: &mut Vec<IoCompletion>) {
        if let Some(f) = self.pending_fault.take() {
            return self.teardown(Teardown::Fault(f), out);
        }
        let shared = &self.shared;
        if shared.generation.load(Ordering::Acquire) != self.gen || shared.state() != STATE_LIVE {
            return self.teardown(Teardown::ControllerReset, out);
        }
        let q = self.queue.as_mut().expect("a live qpair has a queue");
        let n = match q.poll(&mut self.raw, self.poll_limit) {
            Ok(n) => n,
            Err(f) => return self.teardown(Teardown::Fault(f), out),
        };
        for &(cid, cqe) in &self.raw[..n] {
            let io = self.ios[usize::from(cid)]
                .take()
                .expect("the queue only completes outstanding CIDs");
            out.push(IoCompletion {
                tag: io.tag,
                status: IoStatus::Nvme(cqe.status()),
                dw0: cqe.dw0.get(),
                buf: io.buf,
            });
        }
        // Commands that waited for a slot.
        while !self.requeue.is_empty() && self.queue.as_ref().is_some_and(RdmaQueue::has_free_slot)
        {
            let io = self.requeue.pop_front().expect("not empty");
            if let Err(io) = self.post(io) {
                self.requeue.push_front(io);
                break;
            }
        }
        // On the clock, busy or not: one stuck command among many moving ones must still
        // time out.
        let now = self.shared.verbs.now();
        if now >= self.next_scan {
            self.next_scan = now + TIMEOUT_SCAN;
            if let Some(f) = self.queue.as_ref().and_then(RdmaQueue::check_cm) {
                return self.teardown(Teardown::Fault(f), out);
            }
            let timeout = self.shared.opts.io_timeout;
            if let Some(cid) = find_expired(
                self.ios.iter().map(|i| i.as_ref().map(|io| io.submitted)),
                now,
                timeout,
            ) {
                self.teardown(Teardown::Timeout(cid as u16), out);
            }
        }
    }

    /// Ends the connection and settles every outstanding command.
    fn teardown(&mut self, why: Teardown, out: &mut Vec<IoCompletion>) {
        // Disconnecting moves the QP to the error state: from here on the target cannot reach
        // the buffers we are about to hand back. Dropping it destroys the QP.
        if let Some(mut q) = self.queue.take() {
            q.disconnect(Duration::ZERO);
            self.stats.add_keys(q.key_stats());
        }
        let reason = match &why {
            Teardown::Fault(f) => format!("queue {} to {}: {f}", self.qid, self.shared.peer),
            Teardown::Timeout(cid) => format!(
                "queue {} to {}: command {cid} timed out after {:?}",
                self.qid, self.shared.peer, self.shared.opts.io_timeout
            ),
            Teardown::ControllerReset => format!("queue {}: controller reset", self.qid),
        };
        if !matches!(why, Teardown::ControllerReset) {
            tracing::warn!("{reason}");
            self.shared.reset_requested.store(true, Ordering::Release);
        }
        let reconnect =
            self.shared.opts.reconnect.is_some() && self.shared.state() <= STATE_RESETTING;
        // In failover mode the commands go back to the multipath layer; the queue itself
        // still reconnects.
        let retry = reconnect && !self.failover;
        let timed_out = match why {
            Teardown::Timeout(cid) => Some(usize::from(cid)),
            _ => None,
        };
        // Outstanding commands go to the front of the requeue, oldest first, ahead of what
        // was waiting for a slot.
        let mut sent: Vec<(usize, Io)> = Vec::new();
        for (cid, slot) in self.ios.iter_mut().enumerate() {
            if let Some(io) = slot.take() {
                sent.push((cid, io));
            }
        }
        sent.sort_by_key(|(_, io)| std::cmp::Reverse(io.submitted));
        for (cid, mut io) in sent {
            if Some(cid) == timed_out {
                self.stats.timeouts += 1;
                if retry && io.retries < MAX_RETRIES {
                    // As Linux: the association is reset and the command retried on the
                    // new one, a bounded number of times.
                    io.retries += 1;
                    self.stats.requeued += 1;
                    self.requeue.push_front(io);
                } else {
                    out.push(complete(io, IoStatus::Timeout));
                }
            } else if retry {
                self.stats.requeued += 1;
                self.requeue.push_front(io);
            } else if reconnect {
                out.push(complete(io, IoStatus::PathError));
            } else {
                out.push(complete(io, IoStatus::TransportError));
            }
        }
        if reconnect && self.failover {
            for io in self.requeue.drain(..) {
                out.push(complete(io, IoStatus::PathError));
            }
            self.state = QpairState::Reconnecting;
        } else if retry {
            self.state = QpairState::Reconnecting;
        } else {
            for io in self.requeue.drain(..) {
                out.push(complete(io, IoStatus::TransportError));
            }
            self.failure = Some(reason);
            self.state = QpairState::Failed;
        }
    }

    fn poll_down(&mut self, out: &mut Vec<IoCompletion>) {
        let state = self.shared.state();
        if state > STATE_RESETTING {
            for io in self.requeue.drain(..) {
                out.push(complete(io, IoStatus::ControllerLost));
            }
            self.failure = Some(self.shared.failure());
            self.state = QpairState::Failed;
            return;
        }
        let gen = self.shared.generation.load(Ordering::Acquire);
        if state != STATE_LIVE || gen == self.gen {
            // The admin side has not reconnected yet (or not noticed our request).
            return;
        }
        self.gen = gen;
        match connect_queue(&self.shared, self.qid, self.depth) {
            Ok(q) => {
                tracing::info!(
                    qid = self.qid,
                    "I/O queue reconnected; resubmitting {} commands",
                    self.requeue.len()
                );
                self.queue = Some(q);
                self.in_capsule = self.shared.in_capsule.load(Ordering::Relaxed);
                self.max_xfer = self.shared.max_xfer.load(Ordering::Relaxed);
                self.state = QpairState::Live;
                self.stats.reconnects += 1;
                self.next_scan = self.shared.verbs.now() + TIMEOUT_SCAN;
                let now = self.shared.verbs.now();
                for io in self.requeue.iter_mut() {
                    // The timeout runs from the resubmission.
                    io.submitted = now;
                }
                while let Some(io) = self.requeue.pop_front() {
                    if let Err(io) = self.post(io) {
                        self.requeue.push_front(io);
                        break;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(qid = self.qid, "I/O queue reconnect failed: {e}");
                self.shared.reset_requested.store(true, Ordering::Release);
            }
        }
    }

    /// Disconnects (the target sees the queue go; waits up to a second for its answer).
    /// Commands still outstanding are dropped with their buffers.
    pub fn disconnect(mut self) {
        if let Some(mut q) = self.queue.take() {
            q.disconnect(Duration::from_secs(1));
        }
    }
}

/// The command's data as a window over `buf`'s pool registration: the target may only
/// read what it sends to the controller, and only write what it returns. `None` when the
/// pool is not registered with the provider `V` for windows.
fn window_over<V: Verbs>(buf: &IoBuf, dir: DataDir) -> Option<Data<'_, V>> {
    let mr = buf
        .registration()?
        .downcast_ref::<Arc<V::Mr>>()
        .filter(|mr| mr.access().contains(AccessFlags::MW_BIND))?;
    let offset = usize::try_from(buf.addr().checked_sub(mr.iova())?).ok()?;
    let access = match dir {
        DataDir::FromController => AccessFlags::REMOTE_WRITE,
        _ => AccessFlags::REMOTE_READ,
    };
    Some(Data::Window {
        mr,
        offset,
        len: buf.len() as u32,
        access,
    })
}

fn complete(io: Io, status: IoStatus) -> IoCompletion {
    IoCompletion {
        tag: io.tag,
        status,
        dw0: 0,
        buf: io.buf,
    }
}

/// NLB is a 16-bit zero-based field: 1..=65536 blocks. Out of range, the command is refused
/// before it is built and the caller gets its buffer back.
fn check_nlb(nlb: u32, buf: Option<IoBuf>) -> Result<Option<IoBuf>, SubmitError> {
    if (1..=0x1_0000).contains(&nlb) {
        Ok(buf)
    } else {
        Err(SubmitError {
            kind: SubmitErrorKind::Invalid,
            buf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_finds_the_oldest_overdue() {
        let now = Instant::now() + Duration::from_secs(100);
        let t = |secs_ago: u64| Some(now - Duration::from_secs(secs_ago));
        let slots = [t(1), None, t(40), t(31), t(29)];
        assert_eq!(find_expired(slots, now, Duration::from_secs(30)), Some(2));
        assert_eq!(find_expired(slots, now, Duration::from_secs(60)), None);
        assert_eq!(find_expired([None, None], now, Duration::ZERO), None);
        // Exactly at the limit is not yet expired.
        assert_eq!(find_expired([t(30)], now, Duration::from_secs(30)), None);
    }

    #[test]
    fn status_display_and_success() {
        assert!(IoStatus::Nvme(Status::SUCCESS).is_success());
        assert!(!IoStatus::Nvme(Status::LBA_OUT_OF_RANGE).is_success());
        assert!(!IoStatus::Timeout.is_success());
        assert_eq!(IoStatus::Timeout.to_string(), "command timed out");
    }
}

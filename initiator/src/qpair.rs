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
//! [`MAX_RETRIES`] times (commands outstanding at any break count their retries too).
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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::buffer::IoBuf;
use nvmf_common::rdma::{RealVerbs, Verbs};
use nvmf_common::spec::{Command, Completion};

use crate::controller::{Shared, STATE_LIVE};
use crate::error::{QueueFault, Result};
use crate::transport::{KeyStats, RdmaQueue, POLL_BATCH};

mod connect;
mod poll;
mod reconnect;
mod status;
mod submit;

use connect::connect_queue;
pub use status::{IoCompletion, IoStatus};
pub use submit::{SubmitError, SubmitErrorKind};

/// Times a command is resubmitted after timing out or being outstanding when its
/// connection broke (with reconnect configured), as Linux's `nvme_max_retries`; then it fails
/// with [`IoStatus::Timeout`] or [`IoStatus::PathError`].
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

    /// Disconnects (the target sees the queue go; waits up to a second for its answer).
    /// Commands still outstanding are dropped with their buffers.
    pub fn disconnect(mut self) {
        if let Some(mut q) = self.queue.take() {
            q.disconnect(Duration::from_secs(1));
        }
    }
}

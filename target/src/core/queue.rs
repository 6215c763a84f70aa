//! The NVMe side of one queue pair: which controller it belongs to, its queue id and depth, the
//! submission queue head it reports. The transport owns one per qpair and lends it to the core
//! with every request.

use std::sync::Arc;

use crate::core::controller::ControllerShared;
use crate::core::namespaces::NsSlot;
use crate::core::subsystem::{ListenAddress, SubsystemId};
use crate::core::transport::TransportLimits;

pub struct QueueState {
    /// Queue id the transport learned before Connect (RDMA CM private data), if any; Connect
    /// must name the same one.
    pub expected_qid: Option<u16>,
    pub qid: u16,
    /// Entries in the submission queue (Connect's SQSIZE + 1).
    pub depth: u16,
    pub ctrl: Option<Arc<ControllerShared>>,
    pub subsystem: Option<SubsystemId>,
    pub limits: TransportLimits,
    /// Transport-specific description of the peer, for `nvmf_subsystem_get_qpairs`.
    pub peer: String,
    /// The listen address the connection came through, when the transport knows it.
    pub listener: Option<ListenAddress>,
    sq_head: u16,
    /// Counted in the target's queue pair limits (released when the queue closes).
    pub(crate) admitted: bool,
    /// When the core first saw this queue without a controller (before Connect).
    pub(crate) unconnected_since_ms: Option<u64>,
    /// For an I/O queue, its controller's reset count when it connected: a reset since
    /// deleted it (see `ControllerShared::reset`).
    pub(crate) resets_at_connect: u32,
    /// The NSID this queue's last I/O command named and the namespace it resolved to:
    /// hosts send most commands of a queue to one namespace, and a hit saves the two hash
    /// lookups. Valid while the slot is live: a namespace detached or replaced leaves the
    /// table, and its slot's generation moves on.
    pub(crate) last_namespace: (u32, NsSlot),
}

impl QueueState {
    pub fn new(
        limits: TransportLimits,
        expected_qid: Option<u16>,
        peer: String,
        listener: Option<ListenAddress>,
    ) -> Self {
        Self {
            expected_qid,
            qid: expected_qid.unwrap_or(0),
            depth: 0,
            ctrl: None,
            subsystem: None,
            limits,
            peer,
            listener,
            sq_head: 0,
            admitted: false,
            unconnected_since_ms: None,
            resets_at_connect: 0,
            last_namespace: (0, NsSlot::default()),
        }
    }

    pub fn is_admin(&self) -> bool {
        self.qid == 0
    }

    pub fn is_connected(&self) -> bool {
        self.ctrl.is_some()
    }

    /// Consumes one submission queue entry and returns the new head for the completion
    /// (SQ flow control: the host may reuse the slot once it sees it).
    pub fn advance_sq_head(&mut self) -> u16 {
        let depth = self.depth.max(1);
        self.sq_head = (self.sq_head + 1) % depth;
        self.sq_head
    }
}

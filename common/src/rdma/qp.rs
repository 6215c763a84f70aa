//! Reliable-connected queue pairs created through RDMA CM.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::cm::CmIdInner;
use super::cq::CompletionQueue;
use super::error::{RdmaError, Result};
use super::pd::ProtectionDomain;
use super::srq::SharedReceiveQueue;
use super::sys;
use super::wr::{self, RecvWr, SendWr};

/// Queue sizes of a QP (`struct ibv_qp_cap`). Asked for at creation; the QP reports what it
/// actually got (never less).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    /// Ignored when the QP uses an SRQ.
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    /// Ignored when the QP uses an SRQ.
    pub max_recv_sge: u32,
    /// Largest inline payload ([`Payload::Inline`](super::wr::Payload::Inline)).
    pub max_inline_data: u32,
}

impl QpCaps {
    pub(crate) fn to_raw(self) -> sys::ibv_qp_cap {
        sys::ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
        }
    }

    pub(crate) fn from_raw(c: &sys::ibv_qp_cap) -> Self {
        Self {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// An RC `ibv_qp` owned by a CM id (made by [`CmId::create_qp`](super::cm::CmId::create_qp)).
///
/// Holds everything it uses: the CM id (`rdma_destroy_qp` must run before `rdma_destroy_id`),
/// both CQs, the SRQ and the PD. Dropping it destroys the QP first, then releases those.
pub struct QueuePair {
    raw: NonNull<sys::ibv_qp>,
    caps: QpCaps,
    cm_id: Arc<CmIdInner>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: posting verbs are thread-safe in libibverbs (providers lock their queues);
// destruction goes through the CM id, serialized by its channel lock.
unsafe impl Send for QueuePair {}
// SAFETY: see `Send`.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Wraps the QP that `rdma_create_qp` attached to `cm_id`.
    pub(crate) fn from_cm(
        raw: NonNull<sys::ibv_qp>,
        caps: QpCaps,
        cm_id: Arc<CmIdInner>,
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        srq: Option<Arc<SharedReceiveQueue>>,
    ) -> Self {
        Self {
            raw,
            caps,
            cm_id,
            send_cq,
            recv_cq,
            srq,
            pd,
        }
    }

    /// Posts a chain of send-queue requests in one `ibv_post_send` per
    /// [`MAX_CHAIN`](super::wr::MAX_CHAIN) requests, without allocating. On failure, the
    /// requests before the reported index were posted and the rest were not.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        // SAFETY: the QP is live while `self` is, and `caps` holds its real inline limit.
        unsafe { wr::post_send(self.raw.as_ptr(), self.caps.max_inline_data, wrs) }
    }

    /// Posts receive buffers on the QP's own receive queue (not allowed with an SRQ: post on
    /// the SRQ instead).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.srq.is_some() {
            return Err(RdmaError::InvalidArgument(
                "the QP uses an SRQ; post receives on the SRQ",
            ));
        }
        let qp = self.raw.as_ptr();
        wr::post_recv(wrs, |first, bad| {
            // SAFETY: the QP is live; `first` heads a valid NULL-terminated chain whose
            // scatter lists outlive the call.
            unsafe { sys::ibv_post_recv(qp, first, bad) }
        })
        .map_err(|(source, index)| RdmaError::PostRecv { source, index })
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; `qp_num` is immutable after creation.
        unsafe { self.raw.as_ref() }.qp_num
    }

    /// The queue sizes the QP actually has.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.raw.as_ptr()
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("caps", &self.caps)
            .field("srq", &self.srq.is_some())
            .finish()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // Destroys the QP (and only it: we always pass our own CQs, so librdmacm created
        // none); then the fields release the CM id, CQs, SRQ and PD.
        self.cm_id.destroy_qp();
    }
}

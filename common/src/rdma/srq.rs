//! Shared receive queues: one pool of receive buffers for many QPs.

use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::error::{errno_from_ret, last_errno, RdmaError, Result};
use super::pd::ProtectionDomain;
use super::sys;
use super::wr::{self, RecvWr};

/// An `ibv_srq`, created with the exported `ibv_create_srq` (rdma-sys's port of the inline
/// `ibv_create_srq_ex` is wrong). Holds its PD; QPs attached to it hold the SRQ.
pub struct SharedReceiveQueue {
    raw: NonNull<sys::ibv_srq>,
    max_wr: u32,
    max_sge: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: SRQ verbs (post_srq_recv, destroy) are thread-safe in libibverbs.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: see `Send`.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// Creates an SRQ for at least `max_wr` outstanding receives of up to `max_sge` entries.
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32, max_sge: u32) -> Result<Arc<Self>> {
        let mut attr = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                // No limit event.
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is live and `attr` is a valid init attribute; the provider writes
        // the actual sizes back into it.
        let raw = unsafe { sys::ibv_create_srq(pd.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::CreateSrq(last_errno()))?;
        Ok(Arc::new(Self {
            raw,
            max_wr: attr.attr.max_wr,
            max_sge: attr.attr.max_sge,
            pd: pd.clone(),
        }))
    }

    /// Posts receive buffers. On failure, requests before the reported index were posted.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let srq = self.raw.as_ptr();
        wr::post_recv(wrs, |first, bad| {
            // SAFETY: the SRQ is live; `first` heads a valid NULL-terminated chain whose
            // scatter lists outlive the call.
            unsafe { sys::ibv_post_srq_recv(srq, first, bad) }
        })
        .map_err(|(source, index)| RdmaError::PostSrqRecv { source, index })
    }

    /// Actual capacity (at least what was asked for).
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn as_raw(&self) -> *mut sys::ibv_srq {
        self.raw.as_ptr()
    }
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("raw", &self.raw)
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish()
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: QPs attached to the SRQ hold an `Arc` of it, so none is left; destroyed
        // once, before its PD.
        let ret = unsafe { sys::ibv_destroy_srq(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(err = %errno_from_ret(ret), "ibv_destroy_srq failed");
        }
    }
}

//! Protection domains: the scope that ties memory registrations to the QPs allowed to use them.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::device::Context;
use super::error::{errno_from_ret, last_errno, RdmaError, Result};
use super::sys;

/// An `ibv_pd`. Holds its [`Context`] open; memory regions, SRQs and QPs hold the PD.
pub struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread-safe; a PD is only passed to verbs.
unsafe impl Send for ProtectionDomain {}
// SAFETY: see `Send`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// `ibv_alloc_pd` on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: the context is open (we hold an `Arc` to it).
        let raw = unsafe { sys::ibv_alloc_pd(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::AllocPd(last_errno()))?;
        Ok(Arc::new(Self {
            raw,
            ctx: ctx.clone(),
        }))
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("raw", &self.raw)
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR, SRQ and QP on this PD holds an `Arc` of it, so none is left when
        // the last reference drops; the PD is freed once, before its context.
        let ret = unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(err = %errno_from_ret(ret), "ibv_dealloc_pd failed");
        }
    }
}

//! Type 2 memory windows: per-I/O remote keys over a long-lived registration.
//!
//! An initiator binds a window to the part of its registered buffer one I/O uses and hands
//! the window's rkey to the target; the target's SEND_WITH_INVALIDATE (or a local
//! invalidate) revokes it when the I/O completes, so a late or stray RDMA access fails
//! instead of landing in a reused buffer. Binding is a work request
//! ([`SendWr::bind_mw`](super::wr::SendWr::bind_mw)) on the QP the window is then used with.
//! A bound window holds a reference on that QP: deallocate windows before destroying their
//! QP (rxe's QP destruction otherwise waits on them, for long, and warns).

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::error::{errno_from_ret, last_errno, RdmaError, Result};
use super::mr::MemoryRegion;
use super::pd::ProtectionDomain;
use super::sys;

/// A type 2 `ibv_mw`.
///
/// A window belongs to one queue pair and so to one polling thread: it is `Send` but not
/// `Sync`, which lets a bind update the key without any lock on the I/O path.
pub struct MemoryWindow {
    raw: NonNull<sys::ibv_mw>,
    /// The rkey of the latest posted bind (the window's key before any bind).
    rkey: Cell<u32>,
    /// The region the window was last bound to. The device may reach that region through
    /// the window until it is invalidated, which we cannot observe, so the region is kept
    /// alive until the next bind or until the window is deallocated.
    bound: Cell<Option<Arc<MemoryRegion>>>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: MW verbs may be called from any thread; the window's mutable state (`Cell`s and
// the `rkey` field of the C struct) moves with it, and `!Sync` keeps it on one thread at a
// time.
unsafe impl Send for MemoryWindow {}

/// Next key for a type 2 bind: same index, next 8-bit tag (`ibv_inc_rkey`).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl MemoryWindow {
    /// `ibv_alloc_mw` of type 2 on `pd` (needs
    /// [`DeviceCapFlags::MEM_WINDOW_TYPE_2B`](super::device::DeviceCapFlags::MEM_WINDOW_TYPE_2B)
    /// or `_2A`).
    pub fn new(pd: &Arc<ProtectionDomain>) -> Result<Self> {
        // SAFETY: the PD is live. rdma-sys's port of the inline `ibv_alloc_mw` checks the
        // provider op for NULL (setting EOPNOTSUPP) exactly as verbs.h does.
        let raw = unsafe { sys::ibv_alloc_mw(pd.as_raw(), sys::ibv_mw_type::IBV_MW_TYPE_2) };
        let raw = raw
            .and_then(NonNull::new)
            .ok_or_else(|| RdmaError::AllocMw(last_errno()))?;
        // SAFETY: `raw` is a live window; `rkey` is a plain field.
        let rkey = unsafe { raw.as_ref() }.rkey;
        Ok(Self {
            raw,
            rkey: Cell::new(rkey),
            bound: Cell::new(None),
            pd: pd.clone(),
        })
    }

    /// The rkey to hand to the peer after the latest bind was posted.
    pub fn rkey(&self) -> u32 {
        self.rkey.get()
    }

    /// The key the next bind gives the window (what [`SendWr::bind_mw`](super::wr::SendWr::bind_mw)
    /// uses): same index, next tag.
    pub fn next_rkey(&self) -> u32 {
        inc_rkey(self.rkey())
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn as_raw(&self) -> *mut sys::ibv_mw {
        self.raw.as_ptr()
    }

    /// Records a posted bind: the new key, and the region it exposes.
    pub(crate) fn commit_bind(&self, rkey: u32, mr: &Arc<MemoryRegion>) {
        drop(self.bound.replace(Some(mr.clone())));
        // The provider names the window by `ibv_mw.rkey` in the next bind (rxe checks it
        // against the key the window has now), and type 2 binds do not update it.
        // SAFETY: the window is live; its `rkey` field is only read by providers while a
        // bind of it is posted, which happens on the thread that holds `&self` (the window
        // is not `Sync`), and not during this call.
        unsafe { (*self.raw.as_ptr()).rkey = rkey };
        self.rkey.set(rkey);
    }
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("raw", &self.raw)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: the window is live and deallocated once; rdma-sys's port of the inline
        // `ibv_dealloc_mw` calls the provider op like verbs.h.
        let ret = unsafe { sys::ibv_dealloc_mw(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(err = %errno_from_ret(ret), "ibv_dealloc_mw failed");
            // The window may still grant access to the region: keep the region (and so its
            // memory) alive for good rather than let the device reach freed memory.
            std::mem::forget(self.bound.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_only_changes_the_tag() {
        assert_eq!(inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(u32::MAX), 0xffff_ff00);
    }
}

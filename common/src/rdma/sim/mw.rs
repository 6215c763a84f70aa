//! Type 2 (2B) memory windows: the window handle, its entry in the key table, and the
//! window verbs as the send queue and the responder execute them.
//!
//! Rules (InfiniBand Architecture Specification vol. 1, 10.6.7, as rxe implements them):
//!
//! - A window is allocated Free, with a key `index << 8 | tag` from the same index space as
//!   regions (so a key names either a region or a window).
//! - BIND_MW runs in order in the send queue. A type 2 window can only be bound while Free
//!   (o10-36.2.2; so a rebind needs an invalidation first), by a QP of its PD (C10-72), to a
//!   region of that PD registered with MW_BIND, over a non-empty range inside the region; a
//!   window with remote write access needs a region with local write. The new key keeps the
//!   window's index. A failed bind completes with `MW_BIND_ERR` and the QP goes to Error.
//! - A bound (Valid) window is associated with the QP that bound it: remote READ / WRITE
//!   through its key are allowed only from that QP's peer, inside the bound range, with the
//!   bound access, in the window's PD; anything else is a remote access error.
//! - LOCAL_INV of a window key, and a received SEND_WITH_INVALIDATE naming one, return the
//!   window to Free: the key must be the window's current key, the window Valid, of the
//!   QP's PD and bound to that QP (the type 2B association; rxe does not check the QP here,
//!   the specification binds invalidation to it). A failed LOCAL_INV completes with
//!   `LOC_QP_OP_ERR` (as rxe); a SEND_WITH_INVALIDATE naming anything else (a region's key,
//!   an invalidated or unknown key) is a remote invalid request: the receive completes with
//!   `REM_INV_REQ_ERR`, the responder's QP goes to Error and the requester's SEND fails with
//!   `REM_INV_REQ_ERR` (as rxe's responder does for its class J errors).
//! - Dropping the handle deallocates the window (its key stops working); destroying the QP
//!   a window is bound to frees the window.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use super::super::cq::WcStatus;
use super::super::error::{RdmaError, Result};
use super::super::mr::AccessFlags;
use super::super::verbs::{VerbsMr, VerbsMw, VerbsPd};
use super::super::wr::{MwBind, SendOp, SendWr};
use super::fabric::{FabricState, MrEntry, ObjId};
use super::handles::{SimMr, SimPd};

/// A window in the key table (indexed by the key's index, `key >> 8`).
pub(crate) struct MwEntry {
    pub pd: ObjId,
    /// The current key: the allocation's, then each executed bind's.
    pub rkey: u32,
    pub bound: Option<Binding>,
}

/// What a Valid window exposes.
#[derive(Clone, Copy)]
pub(crate) struct Binding {
    /// The QP that bound it (type 2B association).
    pub qp: ObjId,
    /// The region's lkey.
    pub mr: u32,
    pub addr: u64,
    pub len: u64,
    pub access: AccessFlags,
}

/// A BIND_MW work request as the send queue keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BindWqe {
    /// The window's index in the key table.
    pub index: u32,
    pub rkey: u32,
    /// The region's lkey.
    pub mr: u32,
    pub addr: u64,
    pub len: u64,
    pub access: AccessFlags,
}

/// A type 2 memory window ([`Verbs::alloc_mw`](super::super::verbs::Verbs::alloc_mw) of
/// [`SimVerbs`](super::SimVerbs)). Like the real one, it records the key of its latest
/// posted bind and keeps that bind's region alive; it is `Send` but not `Sync`.
pub struct SimMw {
    pd: Arc<SimPd>,
    index: u32,
    rkey: Cell<u32>,
    /// The region of the latest posted bind: the fabric may reach it through the window
    /// until the window is invalidated or dropped.
    bound: Cell<Option<Arc<SimMr>>>,
}

impl SimMw {
    /// Allocates a Free window on `pd`; fails with `EOPNOTSUPP` on a device without type 2
    /// windows, as `ibv_alloc_mw` does.
    pub(crate) fn alloc(pd: &Arc<SimPd>) -> Result<Self> {
        let fabric = pd.context().fabric();
        let mut st = fabric.lock();
        if !st.hosts[pd.context().host()].attr.has_type2_windows() {
            return Err(RdmaError::AllocMw(std::io::Error::from_raw_os_error(
                libc::EOPNOTSUPP,
            )));
        }
        let rkey = st.alloc_key();
        st.mws.insert(
            rkey >> 8,
            MwEntry {
                pd: pd.id(),
                rkey,
                bound: None,
            },
        );
        st.trace(|| format!("mw rkey={rkey:#x} allocated"));
        Ok(Self {
            pd: pd.clone(),
            index: rkey >> 8,
            rkey: Cell::new(rkey),
            bound: Cell::new(None),
        })
    }

    pub fn pd(&self) -> &Arc<SimPd> {
        &self.pd
    }

    /// Records a posted bind (called without the fabric lock: the region it replaces may be
    /// the last reference, and dropping it deregisters).
    fn commit_bind(&self, rkey: u32, mr: &Arc<SimMr>) {
        drop(self.bound.replace(Some(mr.clone())));
        self.rkey.set(rkey);
    }
}

impl VerbsMw for SimMw {
    fn rkey(&self) -> u32 {
        self.rkey.get()
    }
}

impl fmt::Debug for SimMw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimMw")
            .field("rkey", &format_args!("{:#x}", self.rkey.get()))
            .finish()
    }
}

impl Drop for SimMw {
    fn drop(&mut self) {
        let fabric = self.pd.context().fabric();
        let mut st = fabric.lock();
        if let Some(e) = st.mws.remove(&self.index) {
            st.trace(|| format!("mw rkey={:#x} deallocated", e.rkey));
        }
        // The region (`bound`) is released after the lock, with the other fields.
    }
}

/// The post-time checks of a bind (its objects are the sim's, then [`MwBind::validate`]),
/// and what the send queue keeps of it.
pub(crate) fn check_bind(b: &MwBind<'_>) -> Result<BindWqe> {
    let (mw, mr) = b.downcast::<SimMw, SimMr>()?;
    b.validate(&**mr, Arc::ptr_eq(mw.pd(), mr.pd()))?;
    Ok(BindWqe {
        index: mw.index,
        rkey: b.rkey,
        mr: mr.lkey(),
        addr: mr.remote_addr(b.offset),
        len: b.len as u64,
        access: b.access,
    })
}

/// Records the binds among posted requests in their windows.
pub(crate) fn commit_binds(posted: &[SendWr<'_>]) {
    for wr in posted {
        if let SendOp::BindMw(b) = wr.op {
            if let Ok((mw, mr)) = b.downcast::<SimMw, SimMr>() {
                mw.commit_bind(b.rkey, mr);
            }
        }
    }
}

impl FabricState {
    /// Executes a BIND_MW at the head of `qp`'s send engine.
    pub(crate) fn exec_bind(&mut self, qp: ObjId, b: BindWqe) -> WcStatus {
        let qp_pd = self.qps[&qp].pd;
        let why = match (self.mws.get(&b.index), self.mrs.get(&b.mr)) {
            (None, _) => Some("window deallocated"),
            (_, None) => Some("region deregistered"),
            (Some(w), Some(mr)) => bind_error(w, mr, qp_pd, &b),
        };
        let num = self.qps[&qp].num;
        if let Some(why) = why {
            self.trace(|| format!("qp={num} BIND_MW rkey={:#x}: {why}", b.rkey));
            return WcStatus::MW_BIND_ERR;
        }
        let w = self.mws.get_mut(&b.index).expect("looked up above");
        w.rkey = b.rkey;
        w.bound = Some(Binding {
            qp,
            mr: b.mr,
            addr: b.addr,
            len: b.len,
            access: b.access,
        });
        self.trace(|| format!("qp={num} BIND_MW rkey={:#x} {} bytes", b.rkey, b.len));
        WcStatus::SUCCESS
    }

    /// The window `rkey` names, if `qp` may invalidate it (see the module docs).
    fn invalidatable(&self, qp: ObjId, rkey: u32) -> Option<u32> {
        let w = self.mws.get(&(rkey >> 8))?;
        let q = self.qps.get(&qp)?;
        let ok = w.rkey == rkey && w.pd == q.pd && w.bound.is_some_and(|b| b.qp == qp);
        ok.then_some(rkey >> 8)
    }

    /// Whether a SEND_WITH_INVALIDATE of `rkey` received on `qp` may invalidate it.
    pub(crate) fn can_invalidate(&self, qp: ObjId, rkey: u32) -> bool {
        self.invalidatable(qp, rkey).is_some()
    }

    /// Returns the window `rkey` names to Free; false (and nothing changes) if `qp` may not.
    pub(crate) fn invalidate_window(&mut self, qp: ObjId, rkey: u32) -> bool {
        let Some(index) = self.invalidatable(qp, rkey) else {
            return false;
        };
        self.mws.get_mut(&index).expect("looked up").bound = None;
        let num = self.qps[&qp].num;
        self.trace(|| format!("qp={num} mw rkey={rkey:#x} invalidated"));
        true
    }

    /// Executes a LOCAL_INV on `qp`'s send queue.
    pub(crate) fn exec_local_inv(&mut self, qp: ObjId, rkey: u32) -> WcStatus {
        if self.invalidate_window(qp, rkey) {
            WcStatus::SUCCESS
        } else {
            let num = self.qps[&qp].num;
            self.trace(|| format!("qp={num} LOCAL_INV rkey={rkey:#x}: not a valid window"));
            WcStatus::LOC_QP_OP_ERR
        }
    }

    /// A destroyed QP's windows go back to Free (their association is gone).
    pub(crate) fn free_windows_of(&mut self, qp: ObjId) {
        for w in self.mws.values_mut() {
            if w.bound.is_some_and(|b| b.qp == qp) {
                w.bound = None;
            }
        }
    }

    /// The region behind window key `rkey` and the offset of `addr` in it, if the window
    /// grants `need` over `addr..addr + len` to requests arriving on `qp` (in `pd`).
    pub(crate) fn resolve_window(
        &self,
        rkey: u32,
        pd: ObjId,
        qp: ObjId,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(&MrEntry, usize)> {
        let w = self.mws.get(&(rkey >> 8))?;
        let b = w.bound?;
        if w.rkey != rkey || w.pd != pd || b.qp != qp || !b.access.contains(need) {
            return None;
        }
        let in_window = addr.checked_sub(b.addr)?;
        if in_window.checked_add(len)? > b.len {
            return None;
        }
        let mr = self.mrs.get(&b.mr)?;
        let off = addr.checked_sub(mr.iova)?;
        if off.checked_add(len)? > mr.len {
            return None;
        }
        Some((mr, usize::try_from(off).ok()?))
    }

    /// The window key `rkey` and the offset of `addr` in its range, for the trace.
    pub(crate) fn describe_window(&self, rkey: u32, addr: u64) -> Option<String> {
        let w = self.mws.get(&(rkey >> 8)).filter(|w| w.rkey == rkey)?;
        let b = w.bound?;
        Some(format!(
            "mw rkey={rkey:#x}+{}",
            addr.wrapping_sub(b.addr) as i64
        ))
    }
}

/// Why a bind of window `w` to region `mr` by a QP of `qp_pd` fails, if it does.
fn bind_error(w: &MwEntry, mr: &MrEntry, qp_pd: ObjId, b: &BindWqe) -> Option<&'static str> {
    let remote_write = AccessFlags(AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0);
    let in_region = b
        .addr
        .checked_sub(mr.iova)
        .and_then(|off| off.checked_add(b.len))
        .is_some_and(|end| end <= mr.len);
    if w.bound.is_some() {
        Some("the window is bound (a type 2 window must be invalidated first)")
    } else if b.rkey >> 8 != w.rkey >> 8 {
        Some("the new key has another index")
    } else if w.pd != qp_pd || mr.pd != w.pd {
        Some("window, region and QP are not on one PD")
    } else if !mr.access.contains(AccessFlags::MW_BIND) {
        Some("the region has no MW_BIND access")
    } else if b.len == 0 || !in_region {
        Some("empty range or outside the region")
    } else if b.access.0 & remote_write.0 != 0 && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
        Some("remote write through a region without local write")
    } else {
        None
    }
}

//! Protection domains and registered memory regions.

use std::fmt;
use std::sync::Arc;

use super::SimContext;
use crate::rdma::mr::AccessFlags;
use crate::rdma::sim::fabric::ObjId;
use crate::rdma::sim::SimVerbs;
use crate::rdma::verbs::{VerbsMr, VerbsPd};

// ---- protection domain ----

pub struct SimPd {
    pub(super) ctx: Arc<SimContext>,
    pub(super) id: ObjId,
}

impl SimPd {
    pub(crate) fn id(&self) -> ObjId {
        self.id
    }
}

impl VerbsPd<SimVerbs> for SimPd {
    fn context(&self) -> &Arc<SimContext> {
        &self.ctx
    }

    fn holds(&self, mr: &SimMr) -> bool {
        std::ptr::eq(Arc::as_ptr(&mr.pd), self)
    }
}

impl fmt::Debug for SimPd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimPd").field("id", &self.id).finish()
    }
}

impl Drop for SimPd {
    fn drop(&mut self) {
        self.ctx.fabric.lock().pds.remove(&self.id);
    }
}

// ---- memory region ----

/// A registration. `lkey == rkey` when the region has remote access; otherwise the rkey is
/// 0 (as rxe does), so a peer can never name it.
pub struct SimMr {
    pub(super) pd: Arc<SimPd>,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) iova: u64,
    pub(super) len: usize,
    pub(super) access: AccessFlags,
}

impl SimMr {
    pub fn pd(&self) -> &Arc<SimPd> {
        &self.pd
    }
}

impl VerbsMr for SimMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        self.rkey
    }

    fn iova(&self) -> u64 {
        self.iova
    }

    fn len(&self) -> usize {
        self.len
    }

    fn access(&self) -> AccessFlags {
        self.access
    }
}

impl fmt::Debug for SimMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimMr")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl Drop for SimMr {
    fn drop(&mut self) {
        // Deregistered before the memory's owner can go; the owner is released after the
        // lock, since dropping it may run arbitrary code.
        let entry = self.pd.ctx.fabric.lock().mrs.remove(&self.lkey);
        drop(entry);
    }
}

//! Work queues: completion queues (with an optional completion channel), shared receive
//! queues and RC queue pairs.

use std::fmt;
use std::sync::Arc;

use super::cm::CmIdInner;
use super::{os, SimContext, SimPd};
use crate::rdma::cq::WorkCompletion;
use crate::rdma::error::{RdmaError, Result};
use crate::rdma::qp::QpCaps;
use crate::rdma::sim::fabric::{CqState, ObjId, QpSt};
use crate::rdma::sim::mw::commit_binds;
use crate::rdma::sim::SimFabric;
use crate::rdma::verbs::{VerbsCq, VerbsQp, VerbsSrq};
use crate::rdma::wr::{RecvWr, SendWr};

// ---- completion queue ----

pub(super) fn create_sim_cq(
    ctx: &Arc<SimContext>,
    cqe: u32,
    with_channel: bool,
) -> Result<Arc<SimCq>> {
    if cqe == 0 {
        return Err(RdmaError::CreateCq(os(libc::EINVAL)));
    }
    ctx.check_live(RdmaError::CreateCq)?;
    let channel = if with_channel {
        let (reader, writer) =
            std::os::unix::net::UnixStream::pair().map_err(RdmaError::CreateCompChannel)?;
        for end in [&reader, &writer] {
            end.set_nonblocking(true)
                .map_err(RdmaError::CreateCompChannel)?;
        }
        Some((reader, writer))
    } else {
        None
    };
    let (reader, writer) = channel.map_or((None, None), |(r, w)| (Some(r), Some(w)));
    let id = {
        let mut st = ctx.fabric.lock();
        let cap = cqe.min(st.hosts[ctx.host].attr.max_cqe);
        let id = st.alloc_id();
        st.cqs.insert(
            id,
            CqState {
                host: ctx.host,
                cap,
                entries: Default::default(),
                overrun: false,
                channel: writer,
                armed: false,
            },
        );
        id
    };
    Ok(Arc::new(SimCq {
        ctx: ctx.clone(),
        id,
        channel: reader,
    }))
}

pub struct SimCq {
    pub(super) ctx: Arc<SimContext>,
    pub(super) id: ObjId,
    /// The completion channel's reading end, if the CQ has one.
    channel: Option<std::os::unix::net::UnixStream>,
}

impl SimCq {
    /// Completions the CQ holds (what was asked, capped by the device's `max_cqe`; or what
    /// it was resized to).
    pub fn capacity(&self) -> u32 {
        self.ctx
            .fabric
            .lock()
            .cqs
            .get(&self.id)
            .map_or(0, |c| c.cap)
    }

    /// The id async CQ_ERR events carry.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn context(&self) -> &Arc<SimContext> {
        &self.ctx
    }
}

impl VerbsCq for SimCq {
    fn id(&self) -> u64 {
        self.id
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let mut st = self.ctx.fabric.lock();
        st.stats.cq_polls += 1;
        let Some(cq) = st.cqs.get_mut(&self.id) else {
            return Ok(0);
        };
        let n = out.len().min(cq.entries.len());
        for (slot, wc) in out.iter_mut().zip(cq.entries.drain(..n)) {
            *slot = wc;
        }
        if n == 0 && !out.is_empty() {
            let overrun = cq.overrun;
            st.stats.empty_polls += 1;
            if overrun {
                return Err(RdmaError::PollCq(os(libc::EIO)));
            }
        }
        Ok(n)
    }

    /// `ibv_resize_cq`: exactly `cqe` entries (no rounding up). Fails with EINVAL above the
    /// device's `max_cqe`, below what is queued, or on an overrun CQ.
    fn resize(&self, cqe: u32) -> Result<u32> {
        let mut st = self.ctx.fabric.lock();
        let max = st.hosts[self.ctx.host].attr.max_cqe;
        let cq = st
            .cqs
            .get_mut(&self.id)
            .ok_or(RdmaError::ResizeCq(os(libc::EINVAL)))?;
        if cqe == 0 || cqe > max || (cqe as usize) < cq.entries.len() || cq.overrun {
            return Err(RdmaError::ResizeCq(os(libc::EINVAL)));
        }
        cq.cap = cqe;
        let id = self.id;
        st.trace(|| format!("cq {id} resized to {cqe}"));
        Ok(cqe)
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd as _;
        self.channel.as_ref().map(|c| c.as_raw_fd())
    }

    fn arm(&self) -> Result<()> {
        let mut st = self.ctx.fabric.lock();
        if let Some(cq) = st.cqs.get_mut(&self.id) {
            cq.armed = self.channel.is_some();
            if cq.armed {
                st.stats.cq_arms += 1;
            }
        }
        Ok(())
    }

    fn take_event(&self) -> Result<bool> {
        use std::io::Read as _;
        let Some(channel) = &self.channel else {
            return Ok(false);
        };
        // One byte per event, as the kernel's channel hands out one event per read.
        let mut byte = [0u8; 1];
        Ok(matches!((&*channel).read(&mut byte), Ok(1)))
    }
}

impl fmt::Debug for SimCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimCq").field("id", &self.id).finish()
    }
}

impl Drop for SimCq {
    fn drop(&mut self) {
        self.ctx.fabric.lock().cqs.remove(&self.id);
    }
}

// ---- shared receive queue ----

pub struct SimSrq {
    pub(super) pd: Arc<SimPd>,
    pub(super) id: ObjId,
    pub(super) max_wr: u32,
}

impl SimSrq {
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Receives posted and not consumed yet.
    pub fn posted(&self) -> usize {
        self.pd
            .ctx
            .fabric
            .lock()
            .srqs
            .get(&self.id)
            .map_or(0, |s| s.wqes.len())
    }
}

impl VerbsSrq for SimSrq {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.pd.ctx.fabric.lock().post_recv_srq(self.id, wrs)
    }
}

impl fmt::Debug for SimSrq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSrq")
            .field("id", &self.id)
            .field("max_wr", &self.max_wr)
            .finish()
    }
}

impl Drop for SimSrq {
    fn drop(&mut self) {
        self.pd.ctx.fabric.lock().srqs.remove(&self.id);
    }
}

// ---- queue pair ----

/// An RC QP made by [`SimCmId`](super::SimCmId)'s `create_qp`. Holds the CM id, PD, CQs and
/// SRQ, as the real one does; dropping it destroys it at once (outstanding WQEs vanish without
/// completions).
pub struct SimQp {
    pub(super) id: ObjId,
    pub(super) num: u32,
    pub(super) caps: QpCaps,
    pub(super) fabric: SimFabric,
    pub(super) cm: Arc<CmIdInner>,
    pub(super) _pd: Arc<SimPd>,
    pub(super) _send_cq: Arc<SimCq>,
    pub(super) _recv_cq: Arc<SimCq>,
    pub(super) _srq: Option<Arc<SimSrq>>,
}

impl SimQp {
    /// Whether the QP is in the error state.
    pub fn is_error(&self) -> bool {
        self.fabric
            .lock()
            .qps
            .get(&self.id)
            .is_some_and(|q| q.state == QpSt::Error)
    }

    /// Send WQEs posted and not retired yet (plus retired unsignaled ones whose slots a
    /// signaled completion has not freed).
    pub fn send_queue_used(&self) -> u64 {
        self.fabric
            .lock()
            .qps
            .get(&self.id)
            .map_or(0, |q| q.outstanding())
    }
}

impl VerbsQp for SimQp {
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let res = self.fabric.lock().post_send(self.id, wrs);
        let posted = match &res {
            Ok(()) => wrs.len(),
            Err(RdmaError::PostSend { index, .. }) => *index,
            Err(_) => 0,
        };
        // The windows record their binds once the lock is released: a bind may drop the
        // last reference to the region the window was bound to before.
        commit_binds(&wrs[..posted.min(wrs.len())]);
        res
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.fabric.lock().post_recv_qp(self.id, wrs)
    }

    fn qp_num(&self) -> u32 {
        self.num
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }
}

impl fmt::Debug for SimQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimQp")
            .field("qp_num", &self.num)
            .field("caps", &self.caps)
            .finish()
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.fabric.lock().destroy_qp(self.id, self.cm.id);
    }
}

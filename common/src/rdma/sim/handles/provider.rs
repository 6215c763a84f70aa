//! The provider's entry points (`impl Verbs for SimVerbs`): each creates a handle and its
//! entry in the fabric's state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cm::{ChannelInner, HookRunning};
use super::queues::create_sim_cq;
use super::{os, SimChannel, SimCmId, SimContext, SimCq, SimMr, SimPd, SimQp, SimSrq};
use crate::rdma::error::{RdmaError, Result};
use crate::rdma::mr::{AccessFlags, DeviceMemory};
use crate::rdma::sim::fabric::{ChannelState, MrEntry, SrqState};
use crate::rdma::sim::mw::SimMw;
use crate::rdma::sim::SimVerbs;
use crate::rdma::verbs::Verbs;

impl Verbs for SimVerbs {
    type Context = SimContext;
    type Pd = SimPd;
    type Mr = SimMr;
    type Mw = SimMw;
    type Cq = SimCq;
    type Srq = SimSrq;
    type Qp = SimQp;
    type Channel = SimChannel;
    type CmId = SimCmId;

    fn event_channel(&self) -> Result<SimChannel> {
        let id = {
            let mut st = self.fabric.lock();
            let id = st.alloc_id();
            st.channels.insert(
                id,
                ChannelState {
                    queue: Default::default(),
                },
            );
            id
        };
        Ok(SimChannel {
            inner: Arc::new(ChannelInner {
                fabric: self.fabric.clone(),
                id,
                host: self.host,
            }),
        })
    }

    /// The host's own device, unless it is removed.
    fn sync_devices(&self) -> Option<Vec<Arc<SimContext>>> {
        let removed = self.fabric.lock().hosts[self.host].removed;
        Some(if removed {
            Vec::new()
        } else {
            vec![SimContext::new(self.fabric.clone(), self.host)]
        })
    }

    fn alloc_pd(ctx: &Arc<SimContext>) -> Result<Arc<SimPd>> {
        ctx.check_live(RdmaError::AllocPd)?;
        let id = {
            let mut st = ctx.fabric.lock();
            let id = st.alloc_id();
            st.pds.insert(id, ctx.host);
            id
        };
        Ok(Arc::new(SimPd {
            ctx: ctx.clone(),
            id,
        }))
    }

    fn create_cq(ctx: &Arc<SimContext>, cqe: u32) -> Result<Arc<SimCq>> {
        create_sim_cq(ctx, cqe, false)
    }

    /// A completion channel made of a socket pair: the CQ writes a byte for each event.
    fn create_cq_with_channel(ctx: &Arc<SimContext>, cqe: u32) -> Result<Arc<SimCq>> {
        create_sim_cq(ctx, cqe, true)
    }

    fn create_srq(pd: &Arc<SimPd>, max_wr: u32, max_sge: u32) -> Result<Arc<SimSrq>> {
        if max_wr == 0 {
            return Err(RdmaError::CreateSrq(os(libc::EINVAL)));
        }
        pd.ctx.check_live(RdmaError::CreateSrq)?;
        let (id, max_wr) = {
            let mut st = pd.ctx.fabric.lock();
            let attr = &st.hosts[pd.ctx.host].attr;
            let (max_wr, max_sge) = (max_wr.min(attr.max_srq_wr), max_sge.min(attr.max_srq_sge));
            let id = st.alloc_id();
            st.srqs.insert(
                id,
                SrqState {
                    pd: pd.id,
                    max_wr,
                    max_sge,
                    wqes: Default::default(),
                },
            );
            (id, max_wr)
        };
        Ok(Arc::new(SimSrq {
            pd: pd.clone(),
            id,
            max_wr,
        }))
    }

    /// The fabric's virtual time, as an offset from the instant the fabric was made.
    fn now(&self) -> Instant {
        self.fabric.instant()
    }

    /// Runs the idle hook (if any, and not already running), then the fabric for `d` of
    /// virtual time. Never sleeps for real.
    fn sleep(&self, d: Duration) {
        if let Some(hook) = self.fabric.take_idle_hook() {
            let running = HookRunning(&self.fabric);
            hook();
            drop(running);
        }
        self.fabric.advance(d);
    }

    fn register(pd: &Arc<SimPd>, mem: DeviceMemory, access: AccessFlags) -> Result<SimMr> {
        let remote =
            AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_ATOMIC.0;
        let needs_local = AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0;
        if access.0 & needs_local != 0 && !access.contains(AccessFlags::LOCAL_WRITE) {
            // Remote write access requires local write access (as ibv_reg_mr checks).
            return Err(RdmaError::RegMr(os(libc::EINVAL)));
        }
        pd.ctx.check_live(RdmaError::RegMr)?;
        let iova = mem.addr() as u64;
        let len = mem.len();
        let (lkey, rkey) = {
            let mut st = pd.ctx.fabric.lock();
            let lkey = st.alloc_key();
            let rkey = if access.0 & remote != 0 { lkey } else { 0 };
            st.mrs.insert(
                lkey,
                MrEntry {
                    pd: pd.id,
                    iova,
                    len: len as u64,
                    access,
                    rkey,
                    mem,
                },
            );
            (lkey, rkey)
        };
        Ok(SimMr {
            pd: pd.clone(),
            lkey,
            rkey,
            iova,
            len,
            access,
        })
    }

    fn alloc_mw(pd: &Arc<SimPd>) -> Result<SimMw> {
        SimMw::alloc(pd)
    }
}

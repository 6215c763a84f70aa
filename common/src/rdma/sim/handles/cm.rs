//! RDMA CM handles: event channels (whose `wait_event` drives the fabric in virtual time)
//! and CM ids (whose `create_qp` assembles a [`SimQp`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{SimContext, SimCq, SimPd, SimQp, SimSrq};
use crate::rdma::cm::{CmEvent, CmEventKind, CmIdToken, ConnParams};
use crate::rdma::error::{RdmaError, Result};
use crate::rdma::qp::QpCaps;
use crate::rdma::sim::cm::QpResources;
use crate::rdma::sim::fabric::{HostId, ObjId};
use crate::rdma::sim::{SimFabric, SimVerbs};
use crate::rdma::verbs::{VerbsChannel, VerbsCmId};

/// Steps a `wait_event` may take before giving up.
const WAIT_MAX_STEPS: usize = 10_000;

// ---- event channel ----

pub(super) struct ChannelInner {
    pub(super) fabric: SimFabric,
    pub(super) id: ObjId,
    pub(super) host: HostId,
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        self.fabric.lock().channel_destroy(self.id);
    }
}

/// A CM event channel. Never blocks on real time: [`VerbsChannel::next_event`] returns what
/// is queued, and [`VerbsChannel::wait_event`] runs the fabric's scheduler (and its idle
/// hook) until the event comes or the virtual timeout passes.
#[derive(Clone)]
pub struct SimChannel {
    pub(super) inner: Arc<ChannelInner>,
}

impl SimChannel {
    fn fabric(&self) -> &SimFabric {
        &self.inner.fabric
    }
}

impl fmt::Debug for SimChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimChannel")
            .field("id", &self.inner.id)
            .finish()
    }
}

impl VerbsChannel<SimVerbs> for SimChannel {
    fn create_id(&self) -> Result<SimCmId> {
        let id = self
            .fabric()
            .lock()
            .cm_create_id(self.inner.id, self.inner.host);
        Ok(SimCmId {
            inner: Arc::new(CmIdInner {
                channel: self.inner.clone(),
                id,
            }),
        })
    }

    fn get_event(&self) -> Result<Option<CmEvent<SimCmId>>> {
        let ev = {
            let mut st = self.fabric().lock();
            st.channels
                .get_mut(&self.inner.id)
                .and_then(|c| c.queue.pop_front())
        };
        Ok(ev.map(|e| CmEvent {
            kind: e.kind,
            status: e.status,
            id: CmIdToken::from_raw(e.id as usize),
            listen_id: e.listen_id.map(|l| CmIdToken::from_raw(l as usize)),
            id_context: e.id_context,
            new_id: e.new_id.then(|| SimCmId {
                inner: Arc::new(CmIdInner {
                    channel: self.inner.clone(),
                    id: e.id,
                }),
            }),
            private_data: e.private_data,
            conn: e.conn,
        }))
    }

    /// What is queued now; never waits (the driving thread advances the fabric).
    fn next_event(&self, _timeout: Duration) -> Result<Option<CmEvent<SimCmId>>> {
        self.get_event()
    }

    fn wait_event(&self, expected: CmEventKind, timeout: Duration) -> Result<CmEvent<SimCmId>> {
        let fabric = self.fabric();
        let deadline = fabric
            .now_ns()
            .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
        let mut steps = 0;
        let ev = loop {
            if let Some(ev) = self.get_event()? {
                break ev;
            }
            if steps >= WAIT_MAX_STEPS || fabric.now_ns() >= deadline {
                return Err(RdmaError::CmEventTimeout { expected, timeout });
            }
            steps += 1;
            let hook = fabric.take_idle_hook();
            if let Some(hook) = &hook {
                let running = HookRunning(fabric);
                hook();
                drop(running);
                if self.has_event() {
                    continue;
                }
            }
            if !fabric.step_until(deadline) {
                if hook.is_none() {
                    // Nothing is scheduled and nothing else runs: the event cannot come.
                    fabric.advance_to(deadline);
                    return Err(RdmaError::CmEventTimeout { expected, timeout });
                }
                let quantum = (deadline - fabric.now_ns()).min(1_000_000);
                fabric.advance(Duration::from_nanos(quantum));
            }
        };
        if ev.kind == expected && ev.status == 0 {
            Ok(ev)
        } else {
            Err(RdmaError::UnexpectedCmEvent {
                expected,
                got: ev.kind,
                status: ev.status,
                private_data: ev.private_data,
            })
        }
    }
}

/// Marks the idle hook as running until dropped (also on a panic inside it).
pub(super) struct HookRunning<'a>(pub(super) &'a SimFabric);

impl Drop for HookRunning<'_> {
    fn drop(&mut self) {
        self.0.lock().hook_running = false;
    }
}

impl SimChannel {
    fn has_event(&self) -> bool {
        self.fabric()
            .lock()
            .channels
            .get(&self.inner.id)
            .is_some_and(|c| !c.queue.is_empty())
    }
}

// ---- CM id ----

pub(super) struct CmIdInner {
    channel: Arc<ChannelInner>,
    pub(super) id: ObjId,
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        self.channel.fabric.lock().cm_destroy(self.id);
    }
}

/// A CM id. Dropping it (and its QP) destroys it: a connected id disconnects, an
/// unanswered connect request is rejected without private data.
pub struct SimCmId {
    inner: Arc<CmIdInner>,
}

impl SimCmId {
    fn fabric(&self) -> &SimFabric {
        &self.inner.channel.fabric
    }

    /// Sets the user value events for this id report in [`CmEvent::id_context`] (a new
    /// connection's id inherits its listener's).
    pub fn set_context(&self, value: u64) {
        if let Some(s) = self.fabric().lock().cm_ids.get_mut(&self.inner.id) {
            s.context = value;
        }
    }

    pub fn context_value(&self) -> u64 {
        self.fabric()
            .lock()
            .cm_ids
            .get(&self.inner.id)
            .map_or(0, |s| s.context)
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.fabric()
            .lock()
            .cm_ids
            .get(&self.inner.id)
            .and_then(|s| s.local)
    }
}

impl fmt::Debug for SimCmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimCmId")
            .field("id", &self.inner.id)
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl VerbsCmId<SimVerbs> for SimCmId {
    fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        self.fabric().lock().cm_bind(self.inner.id, addr)
    }

    fn listen(&self, _backlog: i32) -> Result<()> {
        self.fabric().lock().cm_listen(self.inner.id)
    }

    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, _t: Duration) -> Result<()> {
        self.fabric()
            .lock()
            .cm_resolve_addr(self.inner.id, src, dst)
    }

    fn resolve_route(&self, _timeout: Duration) -> Result<()> {
        self.fabric().lock().cm_resolve_route(self.inner.id)
    }

    fn context(&self) -> Result<Arc<SimContext>> {
        let host = self.fabric().lock().cm_device(self.inner.id)?;
        Ok(SimContext::new(self.fabric().clone(), host))
    }

    fn is_on(&self, ctx: &SimContext) -> bool {
        let st = self.fabric().lock();
        Arc::ptr_eq(&self.fabric().0, &ctx.fabric.0)
            && st
                .cm_ids
                .get(&self.inner.id)
                .is_some_and(|s| s.device == Some(ctx.host) && s.incarnation == ctx.incarnation)
    }

    fn create_qp(
        &self,
        pd: &Arc<SimPd>,
        send_cq: &Arc<SimCq>,
        recv_cq: &Arc<SimCq>,
        srq: Option<&Arc<SimSrq>>,
        caps: QpCaps,
    ) -> Result<SimQp> {
        let host = pd.ctx.host;
        if send_cq.ctx.host != host
            || recv_cq.ctx.host != host
            || srq.is_some_and(|s| s.pd.ctx.host != host)
            || !Arc::ptr_eq(&pd.ctx.fabric.0, &self.fabric().0)
        {
            return Err(RdmaError::InvalidArgument(
                "PD, CQs and SRQ must share one device context",
            ));
        }
        pd.ctx.check_live(RdmaError::CreateQp)?;
        let res = QpResources {
            host,
            pd: pd.id,
            send_cq: send_cq.id,
            recv_cq: recv_cq.id,
            srq: srq.map(|s| s.id),
        };
        let (id, num, caps) = self
            .fabric()
            .lock()
            .cm_create_qp(self.inner.id, res, caps)?;
        Ok(SimQp {
            id,
            num,
            caps,
            fabric: self.fabric().clone(),
            cm: self.inner.clone(),
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _srq: srq.cloned(),
        })
    }

    fn accept(&self, params: &ConnParams<'_>) -> Result<()> {
        self.fabric().lock().cm_accept(self.inner.id, params)
    }

    fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.fabric().lock().cm_reject(self.inner.id, private_data)
    }

    fn connect(&self, params: &ConnParams<'_>) -> Result<()> {
        self.fabric().lock().cm_connect(self.inner.id, params)
    }

    fn disconnect(&self) -> Result<()> {
        self.fabric().lock().cm_disconnect(self.inner.id)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.fabric()
            .lock()
            .cm_ids
            .get(&self.inner.id)
            .and_then(|s| s.peer)
    }

    fn token(&self) -> CmIdToken {
        CmIdToken::from_raw(self.inner.id as usize)
    }
}

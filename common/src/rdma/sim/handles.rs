//! The provider's object handles and their [`Verbs`] trait implementations.
//!
//! Every handle is an id into the fabric's state plus `Arc`s of its parents (as the real
//! types hold theirs), so destruction order falls out of reference counting. Each verb
//! takes the fabric lock, changes state, and returns; `Drop` destroys synchronously. The
//! lock is never held while anything outside the simulator runs (memory owners are dropped
//! after it is released).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::async_event::{AsyncEvent, AsyncEventKind};
use super::super::cm::{CmEvent, CmEventKind, CmIdToken, ConnParams};
use super::super::cq::WorkCompletion;
use super::super::device::DeviceAttr;
use super::super::error::{RdmaError, Result};
use super::super::mr::{AccessFlags, DeviceMemory};
use super::super::qp::QpCaps;
use super::super::verbs::{
    Verbs, VerbsChannel, VerbsCmId, VerbsContext, VerbsCq, VerbsMr, VerbsPd, VerbsQp, VerbsSrq,
};
use super::super::wr::{RecvWr, SendWr};
use super::cm::QpResources;
use super::fabric::{ChannelState, CqState, HostId, MrEntry, ObjId, SrqState};
use super::mw::{commit_binds, SimMw};
use super::{SimAsyncEvent, SimAsyncEventKind, SimFabric, SimVerbs};

/// `rxe`'s vendor id.
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// Steps a `wait_event` may take before giving up.
const WAIT_MAX_STEPS: usize = 10_000;

fn os(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

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

    fn alloc_pd(ctx: &Arc<SimContext>) -> Result<Arc<SimPd>> {
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

// ---- context ----

/// A host's device, opened. Every context of a host names the same device.
pub struct SimContext {
    fabric: SimFabric,
    host: HostId,
}

impl SimContext {
    pub(crate) fn new(fabric: SimFabric, host: HostId) -> Arc<Self> {
        Arc::new(Self { fabric, host })
    }

    pub(crate) fn fabric(&self) -> &SimFabric {
        &self.fabric
    }

    pub(crate) fn host(&self) -> HostId {
        self.host
    }

    /// The next asynchronous event the device raised (CQ_ERR, QP_FATAL, QP_ACCESS_ERR,
    /// LAST_WQE_REACHED, or an injected one), oldest first.
    pub fn take_async_event(&self) -> Option<SimAsyncEvent> {
        self.fabric.lock().hosts[self.host].async_events.pop_front()
    }

    /// The IP address of the device's host.
    pub fn ip(&self) -> IpAddr {
        self.fabric.lock().hosts[self.host].ip
    }
}

impl fmt::Debug for SimContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimContext")
            .field("host", &self.host)
            .finish()
    }
}

impl VerbsContext for SimContext {
    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(self.fabric.lock().hosts[self.host].attr.clone())
    }

    fn device_name(&self) -> String {
        self.fabric.lock().hosts[self.host].name.clone()
    }

    fn is_soft_roce(&self) -> bool {
        let st = self.fabric.lock();
        let h = &st.hosts[self.host];
        h.name.starts_with("rxe") || h.attr.vendor_id == RXE_VENDOR_ID
    }

    /// The simulated fabric is InfiniBand's RC service (RoCE).
    fn transport(&self) -> crate::rdma::Transport {
        crate::rdma::Transport::InfiniBand
    }

    fn same_device(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.fabric.0, &other.fabric.0) && self.host == other.host
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(self.take_async_event().map(|e| AsyncEvent {
            kind: match e.kind {
                SimAsyncEventKind::CqErr => AsyncEventKind::CqErr,
                SimAsyncEventKind::QpFatal => AsyncEventKind::QpFatal,
                SimAsyncEventKind::QpAccessErr => AsyncEventKind::QpAccessErr,
                SimAsyncEventKind::QpLastWqeReached => AsyncEventKind::QpLastWqeReached,
                SimAsyncEventKind::CommEst => AsyncEventKind::CommEst,
                SimAsyncEventKind::PortErr => AsyncEventKind::PortErr,
                SimAsyncEventKind::DeviceFatal => AsyncEventKind::DeviceFatal,
            },
            qp_num: e.qp_num,
            cq_id: e.cq_id,
        }))
    }
}

// ---- protection domain ----

pub struct SimPd {
    ctx: Arc<SimContext>,
    id: ObjId,
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
    pd: Arc<SimPd>,
    lkey: u32,
    rkey: u32,
    iova: u64,
    len: usize,
    access: AccessFlags,
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

// ---- completion queue ----

fn create_sim_cq(ctx: &Arc<SimContext>, cqe: u32, with_channel: bool) -> Result<Arc<SimCq>> {
    if cqe == 0 {
        return Err(RdmaError::CreateCq(os(libc::EINVAL)));
    }
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
    ctx: Arc<SimContext>,
    id: ObjId,
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
    pd: Arc<SimPd>,
    id: ObjId,
    max_wr: u32,
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

/// An RC QP made by [`SimCmId`]'s `create_qp`. Holds the CM id, PD, CQs and SRQ, as the real
/// one does; dropping it destroys it at once (outstanding WQEs vanish without completions).
pub struct SimQp {
    id: ObjId,
    num: u32,
    caps: QpCaps,
    fabric: SimFabric,
    cm: Arc<CmIdInner>,
    _pd: Arc<SimPd>,
    _send_cq: Arc<SimCq>,
    _recv_cq: Arc<SimCq>,
    _srq: Option<Arc<SimSrq>>,
}

impl SimQp {
    /// Whether the QP is in the error state.
    pub fn is_error(&self) -> bool {
        self.fabric
            .lock()
            .qps
            .get(&self.id)
            .is_some_and(|q| q.state == super::fabric::QpSt::Error)
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

// ---- event channel ----

struct ChannelInner {
    fabric: SimFabric,
    id: ObjId,
    host: HostId,
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
    inner: Arc<ChannelInner>,
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
struct HookRunning<'a>(&'a SimFabric);

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

struct CmIdInner {
    channel: Arc<ChannelInner>,
    id: ObjId,
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

//! The verbs interface the RDMA transports are written against, with two providers: the real
//! one over rdma-sys ([`RealVerbs`], whose object types are this module's siblings) and the
//! in-process simulated fabric (`sim`, behind the `sim` feature).
//!
//! Dispatch is static: product types are generic over `V: Verbs`, and the real provider's
//! associated types *are* [`Context`], [`ProtectionDomain`], [`MemoryRegion`], ... with each
//! trait method forwarding to the inherent one (`#[inline]`), so `RdmaPollGroup<RealVerbs>`
//! compiles to the same code it was before the trait existed.
//!
//! The provider is a value (a simulated fabric names its host), but only constructors without
//! a parent object need it ([`Verbs::event_channel`]); everything else is reached through the
//! parent handle, which the provider's types carry.
//!
//! Shared vocabulary stays concrete and common to both providers: [`Sge`], [`SendWr`],
//! [`RecvWr`], [`WorkCompletion`], [`QpCaps`], [`ConnParams`], [`CmEvent`], [`DeviceAttr`],
//! [`AccessFlags`] and [`RdmaError`]. Memory window binds ([`SendWr::bind_mw`]) carry the
//! provider's window and region as `dyn Any` ([`MwBind`](super::wr::MwBind)); each
//! provider's post downcasts them to its own types.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::async_event::AsyncEvent;
use super::cm::{CmEvent, CmEventKind, CmId, CmIdToken, ConnParams, EventChannel};
use super::cq::{CompletionQueue, WorkCompletion};
use super::device::{Context, DeviceAttr};
use super::error::{RdmaError, Result};
use super::mr::{AccessFlags, DeviceMemory, MemoryRegion};
use super::mw::MemoryWindow;
use super::pd::ProtectionDomain;
use super::qp::{QpCaps, QueuePair};
use super::srq::SharedReceiveQueue;
use super::wr::{RecvWr, SendWr, Sge};

/// A verbs provider: the object types it makes, and the constructors that take no parent.
pub trait Verbs: Clone + Send + Sync + 'static {
    type Context: VerbsContext;
    type Pd: VerbsPd<Self>;
    type Mr: VerbsMr;
    type Mw: VerbsMw;
    type Cq: VerbsCq;
    type Srq: VerbsSrq;
    type Qp: VerbsQp;
    type Channel: VerbsChannel<Self>;
    type CmId: VerbsCmId<Self>;

    /// A new RDMA CM event channel (`rdma_create_event_channel`).
    fn event_channel(&self) -> Result<Self::Channel>;
    /// `ibv_alloc_pd`.
    fn alloc_pd(ctx: &Arc<Self::Context>) -> Result<Arc<Self::Pd>>;
    /// `ibv_create_cq` with at least `cqe` entries and no completion channel.
    fn create_cq(ctx: &Arc<Self::Context>, cqe: u32) -> Result<Arc<Self::Cq>>;
    /// A CQ that can wake a sleeping reactor ([`VerbsCq::wake_fd`]): with a private,
    /// non-blocking completion channel. A provider without channels makes a plain one.
    fn create_cq_with_channel(ctx: &Arc<Self::Context>, cqe: u32) -> Result<Arc<Self::Cq>> {
        Self::create_cq(ctx, cqe)
    }
    /// `ibv_create_srq` for at least `max_wr` receives of up to `max_sge` entries.
    fn create_srq(pd: &Arc<Self::Pd>, max_wr: u32, max_sge: u32) -> Result<Arc<Self::Srq>>;
    /// Registers memory the caller made device-accessible ([`DeviceMemory::new`] carries the
    /// unsafe contract, so registering is safe).
    fn register(pd: &Arc<Self::Pd>, mem: DeviceMemory, access: AccessFlags) -> Result<Self::Mr>;
    /// `ibv_alloc_mw` of a type 2 window on `pd` (the device must have
    /// [`DeviceAttr::has_type2_windows`]); bound with [`SendWr::bind_mw`].
    fn alloc_mw(pd: &Arc<Self::Pd>) -> Result<Self::Mw>;

    /// The clock deadlines are measured on: the system's, or a simulation's virtual time
    /// (as an `Instant` offset from a fixed base, so types do not change).
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// The devices present now, the provider having noticed those removed since it last
    /// looked; `None` if they cannot be listed. librdmacm learns of a removal only when it
    /// lists the devices, and only then closes the removed device's context (at once if
    /// nothing uses it, else when its last user lets go): until it does, the kernel cannot
    /// finish the removal (with soft-RoCE, `rdma link delete` waits), even for a device this
    /// process never used. librdmacm stops before it looks when no device is left, so the
    /// real provider closes a removed device's context itself, at a look after the last of
    /// this process's references on it went, and keeps every device's context from one look
    /// to the next, so that one which goes in between, used or not, is let go too. For a
    /// process that looks at the list periodically (the target's acceptor); a question
    /// about one device is [`VerbsContext::still_present`].
    fn sync_devices(&self) -> Option<Vec<Arc<Self::Context>>>;

    /// Where a caller with nothing to do waits: the system sleeps, a simulation runs its
    /// scheduler instead.
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// An open device.
pub trait VerbsContext: Send + Sync + 'static {
    fn query_device(&self) -> Result<DeviceAttr>;
    fn device_name(&self) -> String;
    /// Linux's software RoCE (rxe), whose quirks both ends work around.
    fn is_soft_roce(&self) -> bool;
    /// The transport the device speaks (InfiniBand, RoCE included, or iWARP).
    fn transport(&self) -> super::Transport;
    /// Whether two handles name the same open device.
    fn same_device(&self, other: &Self) -> bool;
    /// Whether the device is still there (listed by the provider); `None` when the list
    /// cannot be read. Pins nothing, unlike [`Verbs::sync_devices`].
    fn still_present(&self) -> Option<bool>;
    /// The next asynchronous event of the device (a broken QP or CQ, a port down), without
    /// blocking.
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>>;
}

pub trait VerbsPd<V: Verbs>: Send + Sync + 'static {
    fn context(&self) -> &Arc<V::Context>;
    /// Whether `mr` was registered on this PD (what a window of this PD can be bound to).
    fn holds(&self, mr: &V::Mr) -> bool;
}

/// A registration: keys and the I/O virtual address range they cover.
pub trait VerbsMr: Send + Sync + 'static {
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
    /// I/O virtual address of the first byte (what SGEs and remote addresses are made of).
    fn iova(&self) -> u64;
    fn len(&self) -> usize;
    fn access(&self) -> AccessFlags;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `offset..offset + len` lies inside the region.
    fn contains(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// A scatter entry for `len` bytes at `offset`, or `None` when out of bounds or longer
    /// than a work request can carry.
    fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        if !self.contains(offset, len) {
            return None;
        }
        Some(Sge {
            addr: self.iova() + offset as u64,
            length: u32::try_from(len).ok()?,
            lkey: self.lkey(),
        })
    }

    /// The address a peer uses to reach `offset` (with [`Self::rkey`]).
    fn remote_addr(&self, offset: usize) -> u64 {
        self.iova() + offset as u64
    }
}

/// A type 2 memory window: a per-use remote key over part of a registration, bound with a
/// work request ([`SendWr::bind_mw`]) and revoked by (remote or local) invalidation.
///
/// A window belongs to the QP that binds it and so to one thread: `Send`, not `Sync`.
pub trait VerbsMw: Send + 'static {
    /// The rkey of the latest posted bind (the window's own key before any).
    fn rkey(&self) -> u32;
    /// The key the next bind gives the window: same index, next 8-bit tag.
    fn next_rkey(&self) -> u32 {
        super::mw::inc_rkey(self.rkey())
    }
}

pub trait VerbsCq: Send + Sync + 'static {
    /// Takes up to `out.len()` completions, oldest first.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize>;

    /// This CQ's identity in [`AsyncEvent::cq_id`].
    fn id(&self) -> u64;

    /// Grows the CQ to at least `cqe` entries, keeping what is queued; returns the new
    /// capacity. Only from the thread that polls it. A provider that cannot resize says so.
    fn resize(&self, cqe: u32) -> Result<u32> {
        let _ = cqe;
        Err(RdmaError::InvalidArgument(
            "this provider cannot resize a CQ",
        ))
    }

    /// The descriptor that becomes readable when the armed CQ gets a completion; `None` if
    /// the CQ has no completion channel (its owner must keep polling it).
    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Arms the CQ: its next completion makes [`wake_fd`](Self::wake_fd) readable. Poll it
    /// once more afterwards: a completion that came before the arming raises nothing.
    fn arm(&self) -> Result<()> {
        Ok(())
    }

    /// Takes and acknowledges one event from the channel, if it holds one: the CQ fired
    /// and must be armed again for the next. An armed CQ raises at most one event, so a
    /// caller that arms only after taking the last one never leaves one behind.
    fn take_event(&self) -> Result<bool> {
        Ok(false)
    }
}

pub trait VerbsSrq: Send + Sync + 'static {
    /// Posts receives; on failure the requests before the reported index were posted.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
}

pub trait VerbsQp: Send + Sync + 'static {
    /// Posts a chain; on failure (`RdmaError::PostSend { index }`) the requests before
    /// `index` were posted.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
    fn qp_num(&self) -> u32;
    fn caps(&self) -> QpCaps;
}

pub trait VerbsChannel<V: Verbs>: Send + Sync + 'static {
    fn create_id(&self) -> Result<V::CmId>;
    /// The next event if one is pending, without blocking.
    fn get_event(&self) -> Result<Option<CmEvent<V::CmId>>>;
    /// Waits up to `timeout` for the next event.
    fn next_event(&self, timeout: Duration) -> Result<Option<CmEvent<V::CmId>>>;
    /// Waits for the next event and requires it to be `expected` with status 0.
    fn wait_event(&self, expected: CmEventKind, timeout: Duration) -> Result<CmEvent<V::CmId>>;
}

pub trait VerbsCmId<V: Verbs>: Send + Sync + 'static {
    fn bind_addr(&self, addr: SocketAddr) -> Result<()>;
    fn listen(&self, backlog: i32) -> Result<()>;
    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, t: Duration) -> Result<()>;
    fn resolve_route(&self, timeout: Duration) -> Result<()>;
    /// The device the id is bound to.
    fn context(&self) -> Result<Arc<V::Context>>;
    /// Whether the id is bound to `ctx`'s device, removed or not.
    fn is_on(&self, ctx: &V::Context) -> bool;
    fn create_qp(
        &self,
        pd: &Arc<V::Pd>,
        send_cq: &Arc<V::Cq>,
        recv_cq: &Arc<V::Cq>,
        srq: Option<&Arc<V::Srq>>,
        caps: QpCaps,
    ) -> Result<V::Qp>;
    fn accept(&self, params: &ConnParams<'_>) -> Result<()>;
    fn reject(&self, private_data: &[u8]) -> Result<()>;
    fn connect(&self, params: &ConnParams<'_>) -> Result<()>;
    /// Moves the QP to the error state and tells the peer.
    fn disconnect(&self) -> Result<()>;
    fn peer_addr(&self) -> Option<SocketAddr>;
    /// This id's identity in events.
    fn token(&self) -> CmIdToken;
}

/// The real provider: libibverbs and librdmacm through rdma-sys.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealVerbs;

impl Verbs for RealVerbs {
    type Context = Context;
    type Pd = ProtectionDomain;
    type Mr = MemoryRegion;
    type Mw = MemoryWindow;
    type Cq = CompletionQueue;
    type Srq = SharedReceiveQueue;
    type Qp = QueuePair;
    type Channel = EventChannel;
    type CmId = CmId;

    #[inline]
    fn event_channel(&self) -> Result<EventChannel> {
        EventChannel::new()
    }

    fn sync_devices(&self) -> Option<Vec<Arc<Context>>> {
        /// The previous listing, let go only after the next: the last reference on a device
        /// gone meanwhile is then given back while it is unlisted, which closes its context
        /// (see `CmDevicePin`), though librdmacm, with no device left, would not.
        static PREVIOUS: Mutex<Vec<Arc<Context>>> = Mutex::new(Vec::new());
        let listed = match Context::cm_devices() {
            Ok(list) => Some(list),
            // librdmacm's answer when no device is left, and when libibverbs could not list
            // them: only an empty list from libibverbs itself says which.
            Err(RdmaError::GetCmDevices(e))
                if e.raw_os_error() == Some(libc::ENODEV) && super::device::no_device_listed() =>
            {
                Some(Vec::new())
            }
            Err(e) => {
                tracing::debug!("listing RDMA devices failed: {e}");
                None
            }
        };
        if let Some(list) = &listed {
            let previous = std::mem::replace(
                &mut *PREVIOUS.lock().unwrap_or_else(|e| e.into_inner()),
                list.clone(),
            );
            drop(previous);
        }
        listed
    }

    #[inline]
    fn alloc_pd(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        ProtectionDomain::new(ctx)
    }

    #[inline]
    fn create_cq(ctx: &Arc<Context>, cqe: u32) -> Result<Arc<CompletionQueue>> {
        CompletionQueue::new(ctx, cqe)
    }

    fn create_cq_with_channel(ctx: &Arc<Context>, cqe: u32) -> Result<Arc<CompletionQueue>> {
        CompletionQueue::with_channel(ctx, cqe, 0)
    }

    #[inline]
    fn create_srq(
        pd: &Arc<ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<SharedReceiveQueue>> {
        SharedReceiveQueue::new(pd, max_wr, max_sge)
    }

    #[inline]
    fn register(
        pd: &Arc<ProtectionDomain>,
        mem: DeviceMemory,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        MemoryRegion::register(pd, mem, access)
    }

    #[inline]
    fn alloc_mw(pd: &Arc<ProtectionDomain>) -> Result<MemoryWindow> {
        MemoryWindow::new(pd)
    }
}

impl VerbsContext for Context {
    #[inline]
    fn query_device(&self) -> Result<DeviceAttr> {
        Context::query_device(self)
    }

    fn device_name(&self) -> String {
        self.device().name
    }

    fn is_soft_roce(&self) -> bool {
        Context::is_soft_roce(self)
    }

    fn transport(&self) -> super::Transport {
        self.device().transport
    }

    fn same_device(&self, other: &Self) -> bool {
        self.as_raw() == other.as_raw()
    }

    fn still_present(&self) -> Option<bool> {
        Context::still_listed(self)
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Context::poll_async_event(self)
    }
}

impl VerbsPd<RealVerbs> for ProtectionDomain {
    #[inline]
    fn context(&self) -> &Arc<Context> {
        ProtectionDomain::context(self)
    }

    #[inline]
    fn holds(&self, mr: &MemoryRegion) -> bool {
        std::ptr::eq(Arc::as_ptr(mr.pd()), self)
    }
}

impl VerbsMw for MemoryWindow {
    #[inline]
    fn rkey(&self) -> u32 {
        MemoryWindow::rkey(self)
    }

    #[inline]
    fn next_rkey(&self) -> u32 {
        MemoryWindow::next_rkey(self)
    }
}

impl VerbsMr for MemoryRegion {
    #[inline]
    fn lkey(&self) -> u32 {
        MemoryRegion::lkey(self)
    }

    #[inline]
    fn rkey(&self) -> u32 {
        MemoryRegion::rkey(self)
    }

    #[inline]
    fn iova(&self) -> u64 {
        self.addr() as u64
    }

    #[inline]
    fn len(&self) -> usize {
        MemoryRegion::len(self)
    }

    #[inline]
    fn access(&self) -> AccessFlags {
        MemoryRegion::access(self)
    }
}

impl VerbsCq for CompletionQueue {
    #[inline]
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        CompletionQueue::poll(self, out)
    }

    fn id(&self) -> u64 {
        self.as_raw() as u64
    }

    fn resize(&self, cqe: u32) -> Result<u32> {
        CompletionQueue::resize(self, cqe)
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.channel_fd()
    }

    fn arm(&self) -> Result<()> {
        self.req_notify(false)
    }

    fn take_event(&self) -> Result<bool> {
        let took = self.get_event()?;
        if took {
            self.ack_events();
        }
        Ok(took)
    }
}

impl VerbsSrq for SharedReceiveQueue {
    #[inline]
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        SharedReceiveQueue::post_recv(self, wrs)
    }
}

impl VerbsQp for QueuePair {
    #[inline]
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        QueuePair::post_send(self, wrs)
    }

    #[inline]
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        QueuePair::post_recv(self, wrs)
    }

    #[inline]
    fn qp_num(&self) -> u32 {
        QueuePair::qp_num(self)
    }

    #[inline]
    fn caps(&self) -> QpCaps {
        QueuePair::caps(self)
    }
}

impl VerbsChannel<RealVerbs> for EventChannel {
    fn create_id(&self) -> Result<CmId> {
        EventChannel::create_id(self)
    }

    fn get_event(&self) -> Result<Option<CmEvent>> {
        EventChannel::get_event(self)
    }

    fn next_event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        EventChannel::next_event(self, timeout)
    }

    fn wait_event(&self, expected: CmEventKind, timeout: Duration) -> Result<CmEvent> {
        EventChannel::wait_event(self, expected, timeout)
    }
}

impl VerbsCmId<RealVerbs> for CmId {
    fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        CmId::bind_addr(self, addr)
    }

    fn listen(&self, backlog: i32) -> Result<()> {
        CmId::listen(self, backlog)
    }

    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, t: Duration) -> Result<()> {
        CmId::resolve_addr(self, src, dst, t)
    }

    fn resolve_route(&self, timeout: Duration) -> Result<()> {
        CmId::resolve_route(self, timeout)
    }

    fn context(&self) -> Result<Arc<Context>> {
        CmId::context(self)
    }

    fn is_on(&self, ctx: &Context) -> bool {
        CmId::is_on(self, ctx)
    }

    fn create_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        CmId::create_qp(self, pd, send_cq, recv_cq, srq, caps)
    }

    fn accept(&self, params: &ConnParams<'_>) -> Result<()> {
        CmId::accept(self, params)
    }

    fn reject(&self, private_data: &[u8]) -> Result<()> {
        CmId::reject(self, private_data)
    }

    fn connect(&self, params: &ConnParams<'_>) -> Result<()> {
        CmId::connect(self, params)
    }

    fn disconnect(&self) -> Result<()> {
        CmId::disconnect(self)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        CmId::peer_addr(self)
    }

    fn token(&self) -> CmIdToken {
        CmId::token(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real provider's types are the verbs layer's own: nothing is wrapped or boxed, so
    /// generic product code monomorphises to what it was before the trait.
    #[test]
    fn the_real_provider_is_the_concrete_verbs_layer() {
        fn same<A: 'static, B: 'static>() -> bool {
            std::any::TypeId::of::<A>() == std::any::TypeId::of::<B>()
        }
        type R = RealVerbs;
        assert!(same::<<R as Verbs>::Context, Context>());
        assert!(same::<<R as Verbs>::Pd, ProtectionDomain>());
        assert!(same::<<R as Verbs>::Mr, MemoryRegion>());
        assert!(same::<<R as Verbs>::Mw, MemoryWindow>());
        assert!(same::<<R as Verbs>::Cq, CompletionQueue>());
        assert!(same::<<R as Verbs>::Srq, SharedReceiveQueue>());
        assert!(same::<<R as Verbs>::Qp, QueuePair>());
        assert!(same::<<R as Verbs>::Channel, EventChannel>());
        assert!(same::<<R as Verbs>::CmId, CmId>());
        assert_eq!(std::mem::size_of::<RealVerbs>(), 0);
    }
}

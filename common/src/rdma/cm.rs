//! RDMA connection manager: event channels, CM ids, and connection setup.
//!
//! Model: an [`EventChannel`] is a non-blocking descriptor a reactor polls; every CM id is
//! created on a channel and all its events arrive there. A listener's connection requests
//! arrive as [`CmEvent`]s carrying a new [`CmId`] (on the listener's channel); later events
//! for that connection name it by [`CmIdToken`] and by the user value set with
//! [`CmId::set_context`]. Events are copied out (private data included) and acknowledged
//! inside [`EventChannel::get_event`], so nothing borrowed from librdmacm escapes and
//! `rdma_destroy_id` never waits for an unacknowledged event.
//!
//! librdmacm fills in an id's fields (addresses, device, QP state) while processing that
//! id's events, so every call on an id and every event fetch on its channel is serialized
//! by one lock per channel. CM calls are rare; the lock never touches the data path.

use std::fmt;
use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::cq::{set_nonblocking, wait_readable, CompletionQueue};
use super::device::Context;
use super::error::{last_errno, RdmaError, Result};
use super::pd::ProtectionDomain;
use super::qp::{QpCaps, QueuePair};
use super::srq::SharedReceiveQueue;
use super::sys;

/// Kind of a CM event (`enum rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
    /// A value this crate does not know.
    Other(u32),
}

impl CmEventKind {
    pub fn from_raw(raw: u32) -> Self {
        use sys::rdma_cm_event_type as t;
        match raw {
            t::RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            t::RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            t::RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            t::RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            t::RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            t::RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            t::RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            t::RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            t::RDMA_CM_EVENT_REJECTED => Self::Rejected,
            t::RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            t::RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            t::RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            t::RDMA_CM_EVENT_MULTICAST_JOIN => Self::MulticastJoin,
            t::RDMA_CM_EVENT_MULTICAST_ERROR => Self::MulticastError,
            t::RDMA_CM_EVENT_ADDR_CHANGE => Self::AddrChange,
            t::RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            other => Self::Other(other),
        }
    }
}

/// Identity of a CM id, as events report it: the address of its `rdma_cm_id`. Unique while
/// the id is alive (an address may be reused after the id is destroyed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmIdToken(usize);

impl CmIdToken {
    /// A token from a provider's own id numbering (the simulated fabric's).
    pub fn from_raw(raw: usize) -> Self {
        Self(raw)
    }
}

/// Connection parameters the peer sent, from the event's `rdma_conn_param`. For a connect
/// request they are from our point of view (the peer's initiator depth is our responder
/// resources and vice versa, already swapped by the kernel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnEventParams {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub qp_num: u32,
}

/// A CM event, copied out of librdmacm and already acknowledged.
#[derive(Debug)]
pub struct CmEvent<I = CmId> {
    pub kind: CmEventKind,
    /// 0, or a negative errno / transport-specific status (e.g. the reject reason).
    pub status: i32,
    /// The id the event is for (for a connect request: the new connection's id).
    pub id: CmIdToken,
    /// For a connect request: the listening id it arrived on.
    pub listen_id: Option<CmIdToken>,
    /// The user value of the id the event is for ([`CmId::set_context`]); a new
    /// connection's id inherits its listener's.
    pub id_context: u64,
    /// For a connect request: the new connection's id, to accept or reject (dropping it
    /// rejects the connection).
    pub new_id: Option<I>,
    /// Private data from the peer's connect, accept or reject message. On InfiniBand and
    /// RoCE the transport pads it to its fixed size, so it may be longer than what was
    /// sent.
    pub private_data: Vec<u8>,
    pub conn: ConnEventParams,
}

struct ChannelInner {
    raw: NonNull<sys::rdma_event_channel>,
    lock: Mutex<()>,
}

// SAFETY: the channel is a descriptor plus librdmacm state that we only touch under `lock`.
unsafe impl Send for ChannelInner {}
// SAFETY: see `Send`.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    fn lock(&self) -> MutexGuard<'_, ()> {
        // The guarded state lives in librdmacm, not in the mutex; a panic while holding it
        // leaves nothing half-updated on our side.
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is immutable.
        unsafe { self.raw.as_ref() }.fd
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CM id on this channel holds an `Arc` of it, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

/// An `rdma_event_channel` with a non-blocking descriptor. Cloning shares the channel.
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

impl EventChannel {
    pub fn new() -> Result<Self> {
        // SAFETY: no preconditions.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::CreateEventChannel(last_errno()))?;
        let inner = Arc::new(ChannelInner {
            raw,
            lock: Mutex::new(()),
        });
        set_nonblocking(inner.fd()).map_err(RdmaError::SetNonBlocking)?;
        Ok(Self { inner })
    }

    /// The descriptor to poll for readability; readable when an event is pending.
    pub fn fd(&self) -> RawFd {
        self.inner.fd()
    }

    pub fn as_raw(&self) -> *mut sys::rdma_event_channel {
        self.inner.raw.as_ptr()
    }

    /// Creates a CM id for reliable connections (`RDMA_PS_TCP`) on this channel.
    pub fn create_id(&self) -> Result<CmId> {
        CmId::new(self)
    }

    /// Takes the next event if one is pending, without blocking.
    pub fn get_event(&self) -> Result<Option<CmEvent>> {
        let _guard = self.inner.lock();
        let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; `ev` is a valid out-pointer.
        let ret = unsafe { sys::rdma_get_cm_event(self.inner.raw.as_ptr(), &mut ev) };
        if ret != 0 {
            let err = last_errno();
            if err.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(RdmaError::GetCmEvent(err));
        }
        // SAFETY: on success `ev` points to an event owned by librdmacm until it is
        // acknowledged below; its ids stay alive at least that long (`rdma_destroy_id` waits
        // for the acknowledgement, and we hold the channel lock).
        let event = unsafe { self.copy_event(&*ev) };
        // SAFETY: `ev` came from `rdma_get_cm_event` and is acknowledged exactly once; nothing
        // borrowed from it outlives this point.
        unsafe { sys::rdma_ack_cm_event(ev) };
        Ok(Some(event))
    }

    /// # Safety
    ///
    /// `ev` must be an unacknowledged event from this channel, with the channel lock held.
    unsafe fn copy_event(&self, ev: &sys::rdma_cm_event) -> CmEvent {
        let kind = CmEventKind::from_raw(ev.event);
        // SAFETY: librdmacm fills the `conn` member for every event of a connected
        // (RDMA_PS_TCP) id and zeroes the whole event otherwise; we create no UD ids.
        let conn = unsafe { &ev.param.conn };
        let private_data = if conn.private_data.is_null() || conn.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm points `private_data` at `private_data_len` bytes inside the
            // event, valid until the acknowledgement.
            unsafe {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    usize::from(conn.private_data_len),
                )
            }
            .to_vec()
        };
        let id_context = if ev.id.is_null() {
            0
        } else {
            // SAFETY: the event's id is alive until the acknowledgement.
            unsafe { (*ev.id).context as u64 }
        };
        let new_id = match (kind, NonNull::new(ev.id)) {
            (CmEventKind::ConnectRequest, Some(raw)) => Some(CmId {
                inner: Arc::new(CmIdInner {
                    raw,
                    channel: self.inner.clone(),
                }),
            }),
            _ => None,
        };
        CmEvent {
            kind,
            status: ev.status,
            id: CmIdToken(ev.id as usize),
            listen_id: (!ev.listen_id.is_null()).then_some(CmIdToken(ev.listen_id as usize)),
            id_context,
            new_id,
            private_data,
            conn: ConnEventParams {
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
                flow_control: conn.flow_control,
                retry_count: conn.retry_count,
                rnr_retry_count: conn.rnr_retry_count,
                srq: conn.srq != 0,
                qp_num: conn.qp_num,
            },
        }
    }

    /// Waits up to `timeout` for the next event.
    pub fn next_event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ev) = self.get_event()? {
                return Ok(Some(ev));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero()
                || !wait_readable(self.fd(), left).map_err(RdmaError::PollCmChannel)?
            {
                // One last look: the event may have arrived just at the deadline.
                return self.get_event();
            }
        }
    }

    /// Blocking helper for the initiator side: waits up to `timeout` for the next event and
    /// requires it to be `expected` with status 0. Meant for a channel that carries one
    /// connection's events.
    pub fn wait_event(&self, expected: CmEventKind, timeout: Duration) -> Result<CmEvent> {
        match self.next_event(timeout)? {
            None => Err(RdmaError::CmEventTimeout { expected, timeout }),
            Some(ev) if ev.kind == expected && ev.status == 0 => Ok(ev),
            Some(ev) => Err(RdmaError::UnexpectedCmEvent {
                expected,
                got: ev.kind,
                status: ev.status,
                private_data: ev.private_data,
            }),
        }
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// Owner of an `rdma_cm_id`, shared by the [`CmId`] handle and its [`QueuePair`].
pub(crate) struct CmIdInner {
    raw: NonNull<sys::rdma_cm_id>,
    channel: Arc<ChannelInner>,
}

// SAFETY: every librdmacm call on the id runs under the channel lock.
unsafe impl Send for CmIdInner {}
// SAFETY: see `Send`.
unsafe impl Sync for CmIdInner {}

impl CmIdInner {
    /// `rdma_destroy_qp`: called by the QP's drop, before this id can be destroyed.
    pub(crate) fn destroy_qp(&self) {
        let _guard = self.channel.lock();
        // SAFETY: the id is live (the QP holds this `Arc`), and its `qp` is the QP being
        // dropped: a second `rdma_create_qp` on an id fails while one exists.
        unsafe { sys::rdma_destroy_qp(self.raw.as_ptr()) };
    }
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        let _guard = self.channel.lock();
        // SAFETY: the last handle and the QP (which holds this `Arc`) are gone, so the QP
        // was destroyed first; events are acknowledged as soon as they are read, so
        // `rdma_destroy_id` does not wait. The channel outlives it (we hold its `Arc`).
        let ret = unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(err = %last_errno(), "rdma_destroy_id failed");
        }
    }
}

/// Parameters of [`CmId::connect`] and [`CmId::accept`].
#[derive(Clone, Copy, Debug)]
pub struct ConnParams<'a> {
    /// At most 56 bytes for a connect and 196 for an accept on InfiniBand / RoCE.
    pub private_data: &'a [u8],
    /// RDMA READs the peer may have outstanding against us. `0xff`: the device maximum.
    pub responder_resources: u8,
    /// RDMA READs we may have outstanding against the peer. `0xff`: the device maximum
    /// (bounded by what the peer offered, when accepting).
    pub initiator_depth: u8,
    pub flow_control: u8,
    /// Transport retries on timeout (3 bits; 7 is the maximum).
    pub retry_count: u8,
    /// Retries when the peer has no receive posted (3 bits; 7 means infinite).
    pub rnr_retry_count: u8,
}

impl Default for ConnParams<'_> {
    fn default() -> Self {
        Self {
            private_data: &[],
            responder_resources: 0xff,
            initiator_depth: 0xff,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl<'a> ConnParams<'a> {
    pub fn with_private_data(private_data: &'a [u8]) -> Self {
        Self {
            private_data,
            ..Self::default()
        }
    }

    fn to_raw(self) -> Result<sys::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len())
            .map_err(|_| RdmaError::InvalidArgument("private data longer than 255 bytes"))?;
        Ok(sys::rdma_conn_param {
            private_data: if len == 0 {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            // Only used without a QP; ours always has one, and librdmacm then takes both
            // from it.
            srq: 0,
            qp_num: 0,
        })
    }
}

/// An `rdma_cm_id`: one endpoint (listener or connection).
pub struct CmId {
    inner: Arc<CmIdInner>,
}

impl CmId {
    /// Creates an id for reliable connections (`RDMA_PS_TCP`) on `channel`.
    pub fn new(channel: &EventChannel) -> Result<Self> {
        let _guard = channel.inner.lock();
        let mut raw: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: the channel is live; `raw` is a valid out-pointer.
        let ret = unsafe {
            sys::rdma_create_id(
                channel.inner.raw.as_ptr(),
                &mut raw,
                ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            return Err(RdmaError::CreateId(last_errno()));
        }
        let raw = NonNull::new(raw).ok_or(RdmaError::CreateId(io::Error::from_raw_os_error(
            libc::ENOMEM,
        )))?;
        Ok(Self {
            inner: Arc::new(CmIdInner {
                raw,
                channel: channel.inner.clone(),
            }),
        })
    }

    /// Runs `f` on the raw id under the channel lock; `f` returns an `rdma_*` status.
    fn call(
        &self,
        err: fn(io::Error) -> RdmaError,
        f: impl FnOnce(*mut sys::rdma_cm_id) -> libc::c_int,
    ) -> Result<()> {
        let _guard = self.inner.channel.lock();
        if f(self.inner.raw.as_ptr()) != 0 {
            return Err(err(last_errno()));
        }
        Ok(())
    }

    /// `rdma_bind_addr`: binds to a local address (port 0 picks one). Binding to an address
    /// of an RDMA netdev also binds the id to that device.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut ss = to_sockaddr(&addr);
        self.call(RdmaError::BindAddr, |id| {
            // SAFETY: the id is live; `ss` holds a sockaddr of the family it names.
            unsafe { sys::rdma_bind_addr(id, ptr::addr_of_mut!(ss).cast()) }
        })
    }

    /// `rdma_listen`: connect requests arrive as [`CmEventKind::ConnectRequest`] events.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        self.call(RdmaError::Listen, |id| {
            // SAFETY: the id is live and bound.
            unsafe { sys::rdma_listen(id, backlog) }
        })
    }

    /// `rdma_resolve_addr`: starts resolving `dst` (and the local device); completes with an
    /// [`CmEventKind::AddrResolved`] or [`CmEventKind::AddrError`] event.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src = src.map(|a| to_sockaddr(&a));
        let mut dst = to_sockaddr(&dst);
        let ms = timeout_ms(timeout);
        self.call(RdmaError::ResolveAddr, |id| {
            let src_ptr = src
                .as_mut()
                .map_or(ptr::null_mut(), |s| ptr::addr_of_mut!(*s).cast());
            // SAFETY: the id is live; both addresses are valid sockaddrs (or NULL for src).
            unsafe { sys::rdma_resolve_addr(id, src_ptr, ptr::addr_of_mut!(dst).cast(), ms) }
        })
    }

    /// `rdma_resolve_route`: completes with [`CmEventKind::RouteResolved`] or
    /// [`CmEventKind::RouteError`].
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let ms = timeout_ms(timeout);
        self.call(RdmaError::ResolveRoute, |id| {
            // SAFETY: the id is live (its address resolved, or librdmacm reports EINVAL).
            unsafe { sys::rdma_resolve_route(id, ms) }
        })
    }

    /// `rdma_create_qp`: creates the id's RC QP on `pd` with the given CQs and optional SRQ,
    /// and moves it to INIT. The PD, CQs and SRQ must be on this id's device context
    /// ([`CmId::context`]). Completions of all send requests are signaled only when asked
    /// for ([`SendWr::signaled`](super::wr::SendWr::signaled)).
    pub fn create_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        let ctx = pd.context().as_raw();
        if send_cq.context().as_raw() != ctx
            || recv_cq.context().as_raw() != ctx
            || srq.is_some_and(|s| s.pd().context().as_raw() != ctx)
        {
            return Err(RdmaError::InvalidArgument(
                "PD, CQs and SRQ must share one device context",
            ));
        }
        // SAFETY: `ibv_qp_init_attr` is plain C data; all zeroes is valid.
        let mut attr: sys::ibv_qp_init_attr = unsafe { mem::zeroed() };
        attr.send_cq = send_cq.as_raw();
        attr.recv_cq = recv_cq.as_raw();
        attr.srq = srq.map_or(ptr::null_mut(), |s| s.as_raw());
        attr.cap = caps.to_raw();
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;

        let _guard = self.inner.channel.lock();
        let id = self.inner.raw.as_ptr();
        // SAFETY: the id is live; reading `verbs` under the channel lock.
        if unsafe { (*id).verbs } != ctx {
            return Err(RdmaError::InvalidArgument(
                "the PD is not on the CM id's device context",
            ));
        }
        // SAFETY: the id, PD, CQs and SRQ are live and on one context (checked above);
        // `attr` is a valid init attribute that librdmacm updates with the actual caps.
        let ret = unsafe { sys::rdma_create_qp(id, pd.as_raw(), &mut attr) };
        if ret != 0 {
            return Err(RdmaError::CreateQp(last_errno()));
        }
        // SAFETY: on success librdmacm stored the new QP in the id.
        let raw = NonNull::new(unsafe { (*id).qp })
            .ok_or(RdmaError::CreateQp(io::Error::from_raw_os_error(libc::EIO)))?;
        Ok(QueuePair::from_cm(
            raw,
            QpCaps::from_raw(&attr.cap),
            self.inner.clone(),
            pd.clone(),
            send_cq.clone(),
            recv_cq.clone(),
            srq.cloned(),
        ))
    }

    /// `rdma_accept` a connect request (on the id from [`CmEvent::new_id`]); moves the QP to
    /// RTS. The connection is usable after the [`CmEventKind::Established`] event.
    pub fn accept(&self, params: &ConnParams<'_>) -> Result<()> {
        let mut raw = params.to_raw()?;
        self.call(RdmaError::Accept, |id| {
            // SAFETY: the id is live; `raw` and the private data it points to outlive the call
            // (librdmacm copies them).
            unsafe { sys::rdma_accept(id, &mut raw) }
        })
    }

    /// `rdma_reject` a connect request with `private_data` (at most 148 bytes on IB/RoCE).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| RdmaError::InvalidArgument("private data longer than 255 bytes"))?;
        self.call(RdmaError::Reject, |id| {
            let p = if len == 0 {
                ptr::null()
            } else {
                private_data.as_ptr().cast()
            };
            // SAFETY: the id is live; `p` is NULL or `len` readable bytes (copied).
            unsafe { sys::rdma_reject(id, p, len) }
        })
    }

    /// `rdma_connect` after the route is resolved and the QP created; completes with
    /// [`CmEventKind::Established`] (or `Rejected`, `Unreachable`, `ConnectError`).
    pub fn connect(&self, params: &ConnParams<'_>) -> Result<()> {
        let mut raw = params.to_raw()?;
        self.call(RdmaError::Connect, |id| {
            // SAFETY: the id is live; `raw` and its private data outlive the call (copied).
            unsafe { sys::rdma_connect(id, &mut raw) }
        })
    }

    /// `rdma_disconnect`: moves the QP to the error state (outstanding requests complete
    /// with [`WcStatus::WR_FLUSH_ERR`](super::cq::WcStatus::WR_FLUSH_ERR)) and tells the
    /// peer, which gets [`CmEventKind::Disconnected`]. The peer answers by calling
    /// `disconnect` too (as the kernel's NVMe-oF target does on that event); only then does
    /// the side that started get its own `Disconnected` (otherwise after the request times
    /// out).
    pub fn disconnect(&self) -> Result<()> {
        self.call(RdmaError::Disconnect, |id| {
            // SAFETY: the id is live.
            unsafe { sys::rdma_disconnect(id) }
        })
    }

    /// The verbs context of the device the id is bound to (after binding to a device
    /// address, resolving an address, or for a connect request's id), for allocating the
    /// PD, CQs and SRQ the QP needs.
    pub fn context(&self) -> Result<Arc<Context>> {
        let _guard = self.inner.channel.lock();
        // SAFETY: the id is live; `verbs` is read under the channel lock.
        let verbs = unsafe { self.inner.raw.as_ref() }.verbs;
        Context::from_cm_verbs(verbs)
    }

    /// Whether the id is bound to the device `ctx` is open on. Unlike [`Self::context`],
    /// this still answers once that device is removed (its `DEVICE_REMOVAL` event names the
    /// id, not the device).
    pub fn is_on(&self, ctx: &Context) -> bool {
        let _guard = self.inner.channel.lock();
        // SAFETY: the id is live; `verbs` is read under the channel lock.
        std::ptr::eq(unsafe { self.inner.raw.as_ref() }.verbs, ctx.as_raw())
    }

    /// The device port the id is bound to (0 if none).
    pub fn port_num(&self) -> u8 {
        let _guard = self.inner.channel.lock();
        // SAFETY: the id is live; read under the channel lock.
        unsafe { self.inner.raw.as_ref() }.port_num
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        let _guard = self.inner.channel.lock();
        // SAFETY: the id is live; the route's address storage is plain data, read under the
        // channel lock. `src_storage` is the largest member of the union.
        let ss = unsafe {
            self.inner
                .raw
                .as_ref()
                .route
                .addr
                .src_addr_union
                .src_storage
        };
        from_sockaddr(&ss)
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        let _guard = self.inner.channel.lock();
        // SAFETY: as in `local_addr`.
        let ss = unsafe {
            self.inner
                .raw
                .as_ref()
                .route
                .addr
                .dst_addr_union
                .dst_storage
        };
        from_sockaddr(&ss)
    }

    /// Sets the user value events for this id report in [`CmEvent::id_context`].
    pub fn set_context(&self, value: u64) {
        let _guard = self.inner.channel.lock();
        // SAFETY: the id is live; librdmacm only reads `context` (copying it to ids of new
        // connections) while processing events, which runs under the same lock.
        unsafe { (*self.inner.raw.as_ptr()).context = value as usize as *mut libc::c_void };
    }

    pub fn context_value(&self) -> u64 {
        let _guard = self.inner.channel.lock();
        // SAFETY: the id is live; read under the channel lock.
        unsafe { self.inner.raw.as_ref() }.context as u64
    }

    /// The token events for this id carry.
    pub fn token(&self) -> CmIdToken {
        CmIdToken(self.inner.raw.as_ptr() as usize)
    }

    pub fn as_raw(&self) -> *mut sys::rdma_cm_id {
        self.inner.raw.as_ptr()
    }
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("raw", &self.inner.raw)
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

fn timeout_ms(t: Duration) -> libc::c_int {
    libc::c_int::try_from(t.as_millis()).unwrap_or(libc::c_int::MAX)
}

fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    let mut ss = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned for every sockaddr type.
            unsafe { ss.as_mut_ptr().cast::<libc::sockaddr_in>().write(sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { ss.as_mut_ptr().cast::<libc::sockaddr_in6>().write(sin6) };
        }
    }
    // SAFETY: zero-initialized plain C data with one member written.
    unsafe { ss.assume_init() }
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a `sockaddr_in`; storage is large
            // and aligned enough.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for `sockaddr_in6`.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip() {
        for a in [
            "10.0.0.1:4420".parse::<SocketAddr>().unwrap(),
            "[fe80::1]:4420".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap(),
        ] {
            assert_eq!(from_sockaddr(&to_sockaddr(&a)), Some(a));
        }
        // SAFETY: all-zero `sockaddr_storage` is valid (family AF_UNSPEC).
        let zero: libc::sockaddr_storage = unsafe { mem::zeroed() };
        assert_eq!(from_sockaddr(&zero), None);
    }

    #[test]
    fn event_kinds_map_both_ways() {
        assert_eq!(CmEventKind::from_raw(4), CmEventKind::ConnectRequest);
        assert_eq!(CmEventKind::from_raw(10), CmEventKind::Disconnected);
        assert_eq!(CmEventKind::from_raw(999), CmEventKind::Other(999));
    }

    #[test]
    fn conn_params_reject_long_private_data() {
        let long = [0u8; 256];
        let p = ConnParams::with_private_data(&long);
        assert!(matches!(p.to_raw(), Err(RdmaError::InvalidArgument(_))));
        let raw = ConnParams::with_private_data(&[1, 2, 3]).to_raw().unwrap();
        assert_eq!(raw.private_data_len, 3);
        assert_eq!(raw.rnr_retry_count, 7);
    }

    #[test]
    fn event_channel_without_hardware() {
        // Without the rdma_cm module the channel cannot be created; that must be an error,
        // not a crash. With it, an empty channel has no event.
        match EventChannel::new() {
            Ok(ch) => {
                assert!(ch.get_event().unwrap().is_none());
                let id = ch.create_id().unwrap();
                assert_eq!(id.local_addr(), None);
                assert!(matches!(id.context(), Err(RdmaError::NoDevice)));
            }
            Err(e) => assert!(matches!(e, RdmaError::CreateEventChannel(_))),
        }
    }
}

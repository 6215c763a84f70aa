//! NVMe-oF RDMA transport (NVMe-oF 1.1, 7.3): RC queue pairs set up through RDMA CM, command
//! capsules received through a shared receive queue per device and reactor, data moved with
//! RDMA READ/WRITE against the host's keyed SGLs.
//!
//! Threads: one acceptor thread owns the CM event channel (listeners and every connection's
//! events). A connect request is validated there (private data, queue sizes) and handed to a
//! reactor by message: admin queues round-robin, I/O queues to the least-loaded poll group.
//! The reactor creates the QP on its own CQ and SRQ and accepts. Later CM events for the
//! connection (disconnect) follow it by message.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::queue::SegQueue;

use nvmf_common::rdma::{
    CmEvent, CmEventKind, CmIdToken, RealVerbs, Verbs, VerbsChannel, VerbsCmId, VerbsContext,
};
use nvmf_common::spec::rdma_cm::{RdmaCmReject, RdmaCmRejectStatus, RdmaCmRequest, RDMA_CM_RECFMT};
use zerocopy::{FromBytes, IntoBytes};

use crate::core::subsystem::ListenAddress;
use crate::core::{CoreCtx, PollGroupHandle};
use crate::transport::options::TransportOptions;
use crate::transport::{Transport, TransportError, TransportLimits, TransportPollGroup};

mod backlog;
mod completion;
mod connection;
mod device;
mod poll_group;
mod qpair;
mod read_batch;
mod request;
mod send_batch;
mod steps;
mod wait_queue;

pub use poll_group::{PollGroupResources, RdmaPollGroup};

/// A connect request that passed validation, on its way to a reactor.
pub struct NewConnection<V: Verbs = RealVerbs> {
    pub id: V::CmId,
    pub qid: u16,
    /// Queue entries: the host's HSQSIZE + 1.
    pub depth: u16,
    pub peer: String,
    /// The listener the request arrived on.
    pub listener: Option<ListenAddress>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// RDMA queue pairs of this transport (every reactor, Connect or not) when the request
    /// came: checked against the target's `max_qpairs` before a QP is made.
    pub qpairs_now: usize,
    /// The acceptor's record of this connection: the qpair keeps it while it lives.
    pub ticket: AcceptorTicket,
}

struct GroupEntry {
    handle: PollGroupHandle,
    transport_index: u8,
    load: Arc<AtomicUsize>,
}

struct Shared<V: Verbs> {
    /// The provider, for its clock (a simulation's is virtual).
    verbs: V,
    opts: TransportOptions,
    limits: TransportLimits,
    channel: V::Channel,
    listeners: Mutex<HashMap<ListenAddress, V::CmId>>,
    /// Listeners whose device was removed: listened on again every [`DEVICE_CHECK_INTERVAL`]
    /// until a device has their address again (as nvmet repairs its ports), unless an RPC
    /// removes them first.
    lost: Mutex<Vec<ListenAddress>>,
    /// Devices a reactor saw removed (a connection's `DEVICE_REMOVAL`): the acceptor tells
    /// every reactor and forgets them.
    removed: Arc<SegQueue<Arc<V::Context>>>,
    /// Whether the acceptor looks at the device list (see [`DEVICE_CHECK_INTERVAL`]).
    device_list_checks: AtomicBool,
    /// Every device a listener or connection was seen on: the acceptor reads their
    /// asynchronous events and hands them to the poll groups.
    devices: Mutex<Vec<Arc<V::Context>>>,
    groups: Mutex<Vec<GroupEntry>>,
    /// Connections handed to a reactor that it has not yet taken or refused: counted with
    /// the reactors' loads against `max_qpairs`, so a burst of connect requests (all read
    /// before any reactor ran) cannot pass the limit together.
    accepting: Arc<AtomicUsize>,
    /// Connections whose CM id a reactor refused or destroyed (`(id, serial)`): events for
    /// them will never be read (destroying an id discards its unread events), so the
    /// acceptor forgets their owner when it reads this.
    gone: Arc<SegQueue<(CmIdToken, u64)>>,
    stop: AtomicBool,
}

/// How often the acceptor has librdmacm look for removed devices (see
/// [`Verbs::sync_devices`]) and listeners lost with their device try to listen again.
const DEVICE_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Who runs the CM acceptor loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcceptorMode {
    /// Its own thread (`nvmf-rdma-acceptor`), as in production.
    Thread,
    /// The caller, one turn at a time through [`RdmaTransport::acceptor_turn`]: a test driving
    /// a simulated fabric deterministically from one thread.
    Driven,
}

/// What the acceptor loop keeps between events: which reactor owns each connection, and
/// where the next admin queue goes.
#[derive(Default)]
struct AcceptorState {
    /// Each connection's reactor and transport index, and the serial that tells this
    /// connection from a later one whose id reuses the address (`gone`).
    owners: HashMap<CmIdToken, (PollGroupHandle, u8, u64)>,
    next_admin_group: usize,
    next_serial: u64,
    /// When the device list is next looked at and lost listeners try to listen again.
    next_device_check: Option<Instant>,
    /// The device list was seen with a device in it; and, last time, with none.
    devices_seen: bool,
    told_none_left: bool,
}

impl AcceptorState {
    /// Forgets the connections reactors refused or destroyed since the last turn.
    fn forget_gone<V: Verbs>(&mut self, shared: &Shared<V>) {
        while let Some((token, serial)) = shared.gone.pop() {
            if self.owners.get(&token).is_some_and(|o| o.2 == serial) {
                self.owners.remove(&token);
            }
        }
    }
}

pub struct RdmaTransport<V: Verbs = RealVerbs> {
    shared: Arc<Shared<V>>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
    /// The acceptor's state in [`AcceptorMode::Driven`].
    driven: Mutex<AcceptorState>,
}

impl RdmaTransport<RealVerbs> {
    pub fn new(opts: TransportOptions) -> Result<Self, TransportError> {
        Self::with_verbs(RealVerbs, opts, AcceptorMode::Thread)
    }
}

impl<V: Verbs> RdmaTransport<V> {
    /// The transport over the verbs provider `verbs`.
    pub fn with_verbs(
        verbs: V,
        opts: TransportOptions,
        mode: AcceptorMode,
    ) -> Result<Self, TransportError> {
        opts.validate().map_err(TransportError::invalid_option)?;
        refuse_unhonoured(&opts)?;
        let channel = verbs
            .event_channel()
            .map_err(|source| TransportError::Rdma {
                what: "cannot open an RDMA CM event channel".into(),
                source,
            })?;
        let shared = Arc::new(Shared {
            verbs,
            lost: Mutex::new(Vec::new()),
            removed: Arc::new(SegQueue::new()),
            device_list_checks: AtomicBool::new(true),
            limits: opts.limits(),
            opts,
            channel,
            listeners: Mutex::new(HashMap::new()),
            devices: Mutex::new(Vec::new()),
            groups: Mutex::new(Vec::new()),
            accepting: Arc::new(AtomicUsize::new(0)),
            gone: Arc::new(SegQueue::new()),
            stop: AtomicBool::new(false),
        });
        let thread = match mode {
            AcceptorMode::Thread => {
                let shared = Arc::clone(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("nvmf-rdma-acceptor".into())
                        .spawn(move || acceptor(&shared))
                        .map_err(|e| TransportError::Resources {
                            what: "cannot start the RDMA acceptor thread",
                            source: e.into(),
                        })?,
                )
            }
            AcceptorMode::Driven => None,
        };
        Ok(Self {
            shared,
            acceptor: Mutex::new(thread),
            driven: Mutex::new(AcceptorState::default()),
        })
    }

    /// One turn of the acceptor in [`AcceptorMode::Driven`]: handles the CM events pending
    /// now (waiting up to `timeout` for the first). Returns how many it handled.
    pub fn acceptor_turn(&self, timeout: Duration) -> usize {
        let mut state = self.driven.lock().unwrap_or_else(|e| e.into_inner());
        let mut handled = forward_async_events(&self.shared);
        let mut wait = timeout;
        while acceptor_turn(&self.shared, &mut state, wait) {
            handled += 1;
            wait = Duration::ZERO;
        }
        handled
    }

    /// Turns the acceptor's look at the device list off or on (on by default): for tests
    /// that show a removal is handled from its CM events alone.
    pub fn set_device_list_checks(&self, on: bool) {
        self.shared.device_list_checks.store(on, Ordering::Relaxed);
    }

    /// Connections the acceptor in [`AcceptorMode::Driven`] knows the reactor of (for
    /// tests: it forgets each once its id is gone).
    pub fn connections_tracked(&self) -> usize {
        let mut state = self.driven.lock().unwrap_or_else(|e| e.into_inner());
        state.forget_gone(&self.shared);
        state.owners.len()
    }
}

impl<V: Verbs> Drop for RdmaTransport<V> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self
            .acceptor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = t.join();
        }
    }
}

/// Options this transport cannot honour are refused by name rather than ignored: it always
/// uses a shared receive queue, sizes its CQ from the device, batches work requests and runs the
/// CM on its own thread.
fn refuse_unhonoured(opts: &TransportOptions) -> Result<(), TransportError> {
    let d = TransportOptions::new(&opts.trtype);
    let mut refused = Vec::new();
    if opts.no_srq {
        refused.push("no_srq");
    }
    if opts.num_cqe != d.num_cqe {
        refused.push("num_cqe");
    }
    if opts.no_wr_batching != d.no_wr_batching {
        refused.push("no_wr_batching");
    }
    if opts.acceptor_poll_rate != d.acceptor_poll_rate {
        refused.push("acceptor_poll_rate");
    }
    // abort_timeout_sec bounds how long SPDK's Abort waits for a request in a data transfer;
    // Abort here answers at once ("not aborted") and never waits, so every value is honoured.
    if opts.ack_timeout != d.ack_timeout {
        refused.push("ack_timeout");
    }
    if opts.data_wr_pool_size != d.data_wr_pool_size {
        refused.push("data_wr_pool_size");
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(TransportError::Unsupported {
            trtype: "RDMA",
            names: refused,
        })
    }
}

fn socket_addr(addr: &ListenAddress) -> Result<SocketAddr, TransportError> {
    let ip: IpAddr = addr.traddr.parse().map_err(|_| TransportError::Address {
        field: "traddr",
        value: addr.traddr.clone(),
        expected: "an IP address",
    })?;
    let port: u16 = addr.trsvcid.parse().map_err(|_| TransportError::Address {
        field: "trsvcid",
        value: addr.trsvcid.clone(),
        expected: "a port number",
    })?;
    Ok(SocketAddr::new(ip, port))
}

impl<V: Verbs> Transport for RdmaTransport<V> {
    fn trtype(&self) -> &'static str {
        "RDMA"
    }

    fn limits(&self) -> TransportLimits {
        self.shared.limits
    }

    fn listen(&self, addr: &ListenAddress) -> Result<(), TransportError> {
        let mut listeners = self
            .shared
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if listeners.contains_key(addr) {
            return Ok(());
        }
        let id = open_listener(&self.shared, addr)?;
        listeners.insert(addr.clone(), id);
        forget_lost(&self.shared, addr);
        Ok(())
    }

    fn stop_listen(&self, addr: &ListenAddress) {
        // Both under the listeners lock: the acceptor takes a lost address back only under
        // it, so it cannot listen again on one this call removed.
        let mut listeners = self
            .shared
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let removed = listeners.remove(addr);
        let was_lost = forget_lost(&self.shared, addr);
        drop(listeners);
        if removed.is_some() || was_lost {
            tracing::info!(%addr, "RDMA listener stopped");
        }
    }

    fn options(&self) -> serde_json::Value {
        self.shared.opts.to_value()
    }

    fn create_poll_group(
        &self,
        index: u8,
        group: &PollGroupHandle,
    ) -> Result<Box<dyn TransportPollGroup>, TransportError> {
        let load = Arc::new(AtomicUsize::new(0));
        self.shared
            .groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(GroupEntry {
                handle: group.clone(),
                transport_index: index,
                load: Arc::clone(&load),
            });
        Ok(Box::new(RdmaPollGroup::<V>::new(
            index,
            self.shared.opts.clone(),
            self.shared.limits,
            load,
            Arc::clone(&self.shared.removed),
        )))
    }
}

/// Binds and listens on `addr`, and has every reactor build its resources for the device.
fn open_listener<V: Verbs>(
    shared: &Shared<V>,
    addr: &ListenAddress,
) -> Result<V::CmId, TransportError> {
    let sockaddr = socket_addr(addr)?;
    let rdma = |what: String| move |source| TransportError::Rdma { what, source };
    let id = shared
        .channel
        .create_id()
        .map_err(rdma(format!("cannot create an RDMA CM id for {sockaddr}")))?;
    id.bind_addr(sockaddr)
        .map_err(rdma(format!("rdma_bind_addr({sockaddr})")))?;
    id.listen(shared.opts.acceptor_backlog)
        .map_err(rdma(format!("rdma_listen({sockaddr})")))?;
    tracing::info!(%sockaddr, "RDMA listener started");
    // Build each reactor's resources for this device now (SRQ, buffers, registrations): on
    // the first connect they would cost the host seconds under emulation, long enough for it
    // to give up. A wildcard address has no device yet; connects then build them.
    if let Ok(ctx) = id.context() {
        note_device(shared, &ctx);
        tell_groups(shared, move |rdma, _| rdma.prepare_device(Arc::clone(&ctx)));
    }
    Ok(id)
}

/// Runs `f` on every reactor's RDMA poll group, by message.
fn tell_groups<V: Verbs, F>(shared: &Shared<V>, f: F)
where
    F: Fn(&mut RdmaPollGroup<V>, &mut CoreCtx) + Clone + Send + 'static,
{
    let groups = shared.groups.lock().unwrap_or_else(|e| e.into_inner());
    for g in groups.iter() {
        let (f, tidx) = (f.clone(), g.transport_index);
        g.handle.send(move |pg| {
            pg.with_transport(usize::from(tidx), |t, core| {
                if let Some(rdma) = t.as_any_mut().downcast_mut::<RdmaPollGroup<V>>() {
                    f(rdma, core);
                }
            });
        });
    }
}

/// Drops `addr` from the lost listeners; whether it was one.
fn forget_lost<V: Verbs>(shared: &Shared<V>, addr: &ListenAddress) -> bool {
    let mut lost = shared.lost.lock().unwrap_or_else(|e| e.into_inner());
    let before = lost.len();
    lost.retain(|a| a != addr);
    lost.len() != before
}

/// A listener's device was removed: its CM id goes (librdmacm cannot let the device go
/// while one is bound to it), the address waits to be listened on again, and the device's
/// resources are given up on every reactor.
fn on_listener_device_removed<V: Verbs>(shared: &Shared<V>, token: CmIdToken) {
    let mut listeners = shared.listeners.lock().unwrap_or_else(|e| e.into_inner());
    let Some(addr) = listeners
        .iter()
        .find(|(_, id)| id.token() == token)
        .map(|(addr, _)| addr.clone())
    else {
        return;
    };
    let id = listeners.remove(&addr).expect("found above");
    shared
        .lost
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(addr.clone());
    drop(listeners);
    tracing::warn!(%addr, "the RDMA device under this listener was removed; listening again once a device has the address");
    let gone: Vec<_> = shared
        .devices
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|ctx| id.is_on(ctx))
        .cloned()
        .collect();
    drop(id);
    for ctx in gone {
        retire_device(shared, ctx);
    }
}

/// Forgets a removed device and has every reactor close its connections on it and free
/// its resources (each does so once; a repeat finds nothing).
fn retire_device<V: Verbs>(shared: &Shared<V>, ctx: Arc<V::Context>) {
    {
        let mut devices = shared.devices.lock().unwrap_or_else(|e| e.into_inner());
        let before = devices.len();
        devices.retain(|d| !d.same_device(&ctx));
        if devices.len() == before {
            return;
        }
    }
    tracing::warn!(device = %ctx.device_name(), "RDMA device removed: closing its connections and freeing its resources");
    tell_groups(shared, move |rdma, core| rdma.device_removed(&ctx, core));
}

/// Devices reactors saw removed; every [`DEVICE_CHECK_INTERVAL`], the device list
/// refreshed and lost listeners tried again.
fn housekeeping<V: Verbs>(shared: &Shared<V>, state: &mut AcceptorState) {
    while let Some(ctx) = shared.removed.pop() {
        retire_device(shared, ctx);
    }
    let now = shared.verbs.now();
    if state.next_device_check.is_some_and(|t| now < t) {
        return;
    }
    state.next_device_check = Some(now + DEVICE_CHECK_INTERVAL);
    // A device can go without a CM event reaching us: one served through a wildcard
    // listener with no connection left, or prepared by a listener since removed. Listed
    // under the devices lock: a device a listener notes meanwhile (one librdmacm had not
    // seen when it listed) would otherwise look gone.
    let listed = {
        let devices = shared.devices.lock().unwrap_or_else(|e| e.into_inner());
        let checks = shared.device_list_checks.load(Ordering::Relaxed);
        checks
            .then(|| shared.verbs.sync_devices())
            .flatten()
            .map(|live| {
                let gone: Vec<_> = devices
                    .iter()
                    .filter(|d| !live.iter().any(|l| l.same_device(d)))
                    .cloned()
                    .collect();
                (gone, live.is_empty())
            })
    };
    if let Some((gone, none_left)) = listed {
        // Said once, when it happens: nothing can connect until a device returns.
        if none_left && state.devices_seen && !state.told_none_left {
            tracing::warn!("no RDMA device is left: listeners wait for one to return");
        }
        state.told_none_left = none_left;
        state.devices_seen |= !none_left;
        for ctx in gone {
            retire_device(shared, ctx);
        }
    }
    let lost = shared
        .lost
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for addr in lost {
        let mut listeners = shared.listeners.lock().unwrap_or_else(|e| e.into_inner());
        // An RPC may have removed it (or listened again) since.
        if listeners.contains_key(&addr) || !forget_lost(shared, &addr) {
            continue;
        }
        match open_listener(shared, &addr) {
            Ok(id) => {
                tracing::info!(%addr, "RDMA listener back on a device");
                listeners.insert(addr, id);
            }
            Err(e) => {
                tracing::debug!(%addr, "listening again failed: {e}");
                shared
                    .lost
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(addr);
            }
        }
    }
}

/// The acceptor loop: CM events until the transport is dropped.
fn acceptor<V: Verbs>(shared: &Shared<V>) {
    let mut state = AcceptorState::default();
    while !shared.stop.load(Ordering::Acquire) {
        forward_async_events(shared);
        acceptor_turn(shared, &mut state, Duration::from_millis(100));
    }
}

/// Remembers a device whose asynchronous events the acceptor must read.
fn note_device<V: Verbs>(shared: &Shared<V>, ctx: &Arc<V::Context>) {
    let mut devices = shared.devices.lock().unwrap_or_else(|e| e.into_inner());
    if !devices.iter().any(|d| d.same_device(ctx)) {
        devices.push(Arc::clone(ctx));
    }
}

/// Reads every pending asynchronous event of the known devices and sends each to every poll
/// group (the one that owns the QP or CQ acts on it). Returns how many there were.
fn forward_async_events<V: Verbs>(shared: &Shared<V>) -> usize {
    let devices = shared
        .devices
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut n = 0;
    for ctx in devices {
        loop {
            let event = match ctx.poll_async_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(device = %ctx.device_name(), "reading asynchronous events failed: {e}");
                    break;
                }
            };
            n += 1;
            tracing::debug!(device = %ctx.device_name(), ?event, "RDMA asynchronous event");
            let ctx = Arc::clone(&ctx);
            tell_groups(shared, move |rdma, core| {
                rdma.on_async_event(&ctx, event, core)
            });
        }
    }
    n
}

/// Waits up to `timeout` for one CM event and handles it; false when none came.
fn acceptor_turn<V: Verbs>(
    shared: &Shared<V>,
    state: &mut AcceptorState,
    timeout: Duration,
) -> bool {
    state.forget_gone(shared);
    housekeeping(shared, state);
    let event = match shared.channel.next_event(timeout) {
        Ok(Some(e)) => e,
        Ok(None) => return false,
        Err(e) => {
            tracing::error!("RDMA CM event channel failed: {e}");
            std::thread::sleep(timeout.min(Duration::from_millis(100)));
            return false;
        }
    };
    match event.kind {
        CmEventKind::ConnectRequest => on_connect_request(shared, event, state),
        CmEventKind::DeviceRemoval if !state.owners.contains_key(&event.id) => {
            on_listener_device_removed(shared, event.id);
        }
        kind => {
            let Some((handle, tidx, _)) = state.owners.get(&event.id).cloned() else {
                return true;
            };
            if matches!(
                kind,
                CmEventKind::TimewaitExit | CmEventKind::Disconnected | CmEventKind::DeviceRemoval
            ) {
                state.owners.remove(&event.id);
            }
            let token = event.id;
            handle.send(move |pg| {
                pg.with_transport(usize::from(tidx), |t, core| {
                    if let Some(rdma) = t.as_any_mut().downcast_mut::<RdmaPollGroup<V>>() {
                        rdma.on_cm_event(token, kind, core);
                    }
                });
            });
        }
    }
    true
}

pub(super) fn reject<I: VerbsCmId<V>, V: Verbs>(id: &I, status: RdmaCmRejectStatus) {
    let rej = RdmaCmReject::new(status);
    if let Err(e) = id.reject(rej.as_bytes()) {
        tracing::warn!("rdma_reject failed: {e}");
    }
}

fn on_connect_request<V: Verbs>(
    shared: &Shared<V>,
    mut event: CmEvent<V::CmId>,
    state: &mut AcceptorState,
) {
    let Some(id) = event.new_id.take() else {
        return;
    };
    let peer = id
        .peer_addr()
        .map_or_else(|| "unknown".to_string(), |a| a.to_string());
    if let Ok(ctx) = id.context() {
        note_device(shared, &ctx);
    }
    let Ok((req, _)) = RdmaCmRequest::read_from_prefix(&event.private_data) else {
        tracing::warn!(%peer, len = event.private_data.len(), "connect without NVMe-oF private data");
        return reject::<_, V>(&id, RdmaCmRejectStatus::INVALID_PRIVATE_DATA_LENGTH);
    };
    if req.recfmt.get() != RDMA_CM_RECFMT {
        return reject::<_, V>(&id, RdmaCmRejectStatus::INVALID_RECFMT);
    }
    let qid = req.qid.get();
    let depth = u32::from(req.hsqsize.get()) + 1;
    let limit = if qid == 0 {
        shared.limits.max_aq_depth
    } else {
        shared.limits.max_queue_depth
    };
    if depth < 2 || depth > u32::from(limit) {
        tracing::warn!(%peer, qid, depth, limit, "connect with an unsupported queue size");
        return reject::<_, V>(&id, RdmaCmRejectStatus::INVALID_HSQSIZE);
    }
    if u32::from(req.hrqsize.get()) < depth {
        return reject::<_, V>(&id, RdmaCmRejectStatus::INVALID_HRQSIZE);
    }
    let listener = event.listen_id.and_then(|token| {
        let listeners = shared.listeners.lock().unwrap_or_else(|e| e.into_inner());
        listeners
            .iter()
            .find(|(_, id)| id.token() == token)
            .map(|(addr, _)| addr.clone())
    });
    let groups = shared.groups.lock().unwrap_or_else(|e| e.into_inner());
    if groups.is_empty() {
        return reject::<_, V>(&id, RdmaCmRejectStatus::NO_RESOURCES);
    }
    let chosen = if qid == 0 {
        state.next_admin_group = (state.next_admin_group + 1) % groups.len();
        state.next_admin_group
    } else {
        (0..groups.len())
            .min_by_key(|&i| groups[i].load.load(Ordering::Relaxed))
            .expect("non-empty")
    };
    // A reactor counts a connection in its load before it stops counting it as accepting
    // (a release). Reading `accepting` first (an acquire) and the loads after, a connection
    // missing from `accepting` is in a load: the sum may count one twice for a moment, never
    // zero times.
    let accepting = shared.accepting.fetch_add(1, Ordering::AcqRel);
    let loads: usize = groups.iter().map(|g| g.load.load(Ordering::Acquire)).sum();
    let qpairs_now = loads + accepting;
    let entry = &groups[chosen];
    let (handle, tidx) = (entry.handle.clone(), entry.transport_index);
    drop(groups);
    let (token, serial) = (id.token(), state.next_serial);
    state.next_serial += 1;
    state.owners.insert(token, (handle.clone(), tidx, serial));
    let ticket = AcceptorTicket {
        accepting: Some(Arc::clone(&shared.accepting)),
        gone: Arc::clone(&shared.gone),
        token,
        serial,
    };
    let conn = NewConnection {
        id,
        qid,
        depth: depth as u16,
        peer,
        listener,
        responder_resources: event.conn.responder_resources,
        initiator_depth: event.conn.initiator_depth,
        qpairs_now,
        ticket,
    };
    handle.send(move |pg| {
        pg.with_transport(usize::from(tidx), move |t, core| {
            let Some(rdma) = t.as_any_mut().downcast_mut::<RdmaPollGroup<V>>() else {
                return;
            };
            let (peer, qid) = (conn.peer.clone(), conn.qid);
            let max_total = core.info.qpair_limits.max_total.load(Ordering::Relaxed);
            if let Err(e) = rdma.add_connection(conn, max_total as usize) {
                tracing::warn!(%peer, qid, "cannot accept RDMA connection: {e}");
            }
        });
    });
}

/// The acceptor's record of a connection it handed to a reactor. Until the reactor takes
/// or refuses it, the connection counts as accepting (against `max_qpairs`); the qpair
/// keeps the ticket, and when it drops (the qpair and its CM id gone, or the connection
/// refused, or its message dropped with the reactor) the acceptor learns to forget it.
pub struct AcceptorTicket {
    accepting: Option<Arc<AtomicUsize>>,
    gone: Arc<SegQueue<(CmIdToken, u64)>>,
    token: CmIdToken,
    serial: u64,
}

impl AcceptorTicket {
    /// The reactor counts the connection in its load now: it no longer counts as accepting.
    pub(super) fn taken(&mut self) {
        if let Some(accepting) = self.accepting.take() {
            accepting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for AcceptorTicket {
    fn drop(&mut self) {
        self.taken();
        self.gone.push((self.token, self.serial));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_the_transport_cannot_honour_are_refused_by_name() {
        assert!(refuse_unhonoured(&TransportOptions::new("RDMA")).is_ok());
        let mut opts = TransportOptions::new("RDMA");
        opts.no_srq = true;
        opts.num_cqe += 1;
        let err = refuse_unhonoured(&opts).unwrap_err();
        assert!(
            matches!(&err, TransportError::Unsupported { trtype: "RDMA", names }
                if names == &["no_srq", "num_cqe"]),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "the RDMA transport supports only the default value of: no_srq, num_cqe"
        );
        // Abort never waits here, so any abort_timeout_sec holds.
        let mut opts = TransportOptions::new("RDMA");
        opts.abort_timeout_sec = 30;
        assert!(refuse_unhonoured(&opts).is_ok());
    }
}

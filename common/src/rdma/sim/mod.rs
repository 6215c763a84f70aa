//! An in-process simulated RDMA fabric: a [`Verbs`](super::verbs::Verbs) provider
//! ([`SimVerbs`]) whose hosts live in one process, with reliable-connected semantics and a
//! seeded, deterministic scheduler in virtual time.
//!
//! # Driving
//!
//! Driving is single-threaded: verb calls only validate and enqueue (a `post_send` queues
//! WQEs and schedules the QP's send engine; no byte moves inside it), and
//! [`SimFabric::step`] / [`SimFabric::advance`] run the scheduled events: send engines,
//! packet deliveries, acknowledgements, RNR and transport retries, CM messages and timers.
//! A test alternates product calls and steps. Only two calls step the fabric themselves,
//! bounded and in virtual time, after running the idle hook ([`SimFabric::set_idle_hook`]):
//! a channel's [`wait_event`](super::verbs::VerbsChannel::wait_event) and the provider's
//! [`sleep`](super::verbs::Verbs::sleep). `next_event` and `get_event` return what is
//! queued; [`Verbs::now`](super::verbs::Verbs::now) is the virtual clock.
//!
//! # What is simulated
//!
//! - RC send queues executing strictly in order; per-link FIFO delivery after a drawn delay
//!   (`max(previous delivery on the link, now + delay)`); READ responses and ACKs on the
//!   reverse link. Completions retire in order from the send-queue head.
//! - SEND into the responder's SRQ or own RQ, scattered across the receive SGEs (lkeys
//!   checked in the receiver's PD, LOCAL_WRITE needed); RNR NAK and retry after the RNR timer
//!   (7 = infinite), `RNR_RETRY_EXC_ERR` when the budget is spent; `LOC_LEN_ERR` at the
//!   responder and `REM_INV_REQ_ERR` at the requester for a message longer than the receive;
//!   SEND_WITH_INVALIDATE invalidates the named memory window and reports `IBV_WC_WITH_INV`
//!   and the key; naming anything but a valid window of the receiving QP is a remote invalid
//!   request (`REM_INV_REQ_ERR` at both ends, the responder to Error).
//! - RDMA WRITE and READ with rkey, PD, access and range checks at the responder
//!   (`REM_ACCESS_ERR`, both QPs to Error, async `QP_ACCESS_ERR` at the responder); lkeys of
//!   the local SGEs resolved when the WQE executes (`LOC_PROT_ERR`).
//! - Type 2B memory windows on devices that report them ([`windows_device_attr`]; see the
//!   `mw` module for the rules): allocation, BIND_MW and LOCAL_INV executed in order by the
//!   send queue (`MW_BIND_ERR` / `LOC_QP_OP_ERR` when refused), remote access through a
//!   window's key checked against its range, access, PD and QP, remote and local
//!   invalidation, rebinding with the next key.
//! - Unsignaled WQEs: no completion; their slots count against `max_send_wr` until a later
//!   signaled (or error) completion is generated.
//! - The error state: every outstanding send WQE (signaled or not) and every own-RQ WQE
//!   completes `WR_FLUSH_ERR` in order; posting to a QP in Error succeeds and flushes at the
//!   next step; SRQ WQEs stay (`LAST_WQE_REACHED` is raised).
//! - SQ / RQ / SRQ overflow (`ENOMEM` at the failing index, earlier requests posted), CQ
//!   overrun (`CQ_ERR`, QPs on it to Error with `QP_FATAL`, later completions lost, `poll`
//!   fails with `EIO` once drained).
//! - RDMA CM: resolution, listeners, connect / accept / reject with IB's private data
//!   padding, disconnect from either side (DREQ / DREP / timeout, time wait), id drop
//!   semantics, CM timeouts.
//! - Faults ([`SimFabric::faults`]): a failing `post_send` / `post_recv` at a chosen call and
//!   index, held RDMA WRITEs, late responses (a requester's completions lagging the
//!   peer's next requests), stray RDMA WRITEs a QP's owner never posted, host crash (peers end in `RETRY_EXC_ERR` after the transport
//!   timeout), injected async events.
//! - Device removal and return ([`SimFabric::remove_device`], the `removal` module):
//!   `DEVICE_REMOVAL` to every CM id bound to the device, which the kernel side closes; QPs to
//!   Error; nothing new made on it; [`SimFabric::device_objects`] counts what users still hold
//!   (the kernel's removal waits for none). A device that comes back is a new one.
//!
//! Not simulated: SEND with immediate (posting it fails with `InvalidArgument`), atomics,
//! type 1 windows and fast-registered regions (a LOCAL_INV or SEND_WITH_INVALIDATE of a
//! region's key fails as for an unknown key); RDMA READ initiator-depth limits; MTU segmentation
//! (a message is one packet); packet loss other than to a crashed host or a dead QP; UD.
//!
//! # Determinism
//!
//! Delays come from a counter-based hash per object (`splitmix64(seed ^ hash(object id) ^
//! hash(n))`), the event heap is ordered by (time, global sequence number), and all state is
//! kept in `BTreeMap`s. The same seed and the same calls give the same [`SimFabric::trace`].
#![forbid(unsafe_code)]

mod cm;
mod fabric;
mod handles;
mod mem;
mod mw;
mod qp;
mod removal;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::device::{DeviceAttr, DeviceCapFlags};
use fabric::{FabricState, Host, HostId, PostFault};

pub use handles::{SimChannel, SimCmId, SimContext, SimCq, SimMr, SimPd, SimQp, SimSrq};
pub use mw::SimMw;
pub use removal::DeviceObjects;

/// Parameters of a fabric. Times are virtual nanoseconds.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Bounds of a packet's (or CM message's) drawn one-way delay.
    pub min_delay_ns: u64,
    pub max_delay_ns: u64,
    /// Wait after an RNR NAK before the SEND is tried again.
    pub rnr_timer_ns: u64,
    /// Transport (ACK) timeout: a requester whose packet reached nobody fails with
    /// `RETRY_EXC_ERR` after `(retry_count + 1)` of these.
    pub transport_timeout_ns: u64,
    /// Time an unanswered REQ, REP or DREQ waits.
    pub cm_timeout_ns: u64,
    /// Time wait after a disconnect, before `TimewaitExit`.
    pub timewait_ns: u64,
    /// Take a requester's RNR and transport retry counts from the peer's connect / accept
    /// parameters (what IB CM does) instead of the QP's own side's.
    pub rnr_retry_from_peer: bool,
    /// Lines kept by the trace ring (0: no trace).
    pub trace_capacity: usize,
    /// Keep a copy of every SEND and RDMA WRITE payload delivered to each host
    /// ([`SimFabric::delivered`]).
    pub record_payloads: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            min_delay_ns: 1_000,
            max_delay_ns: 5_000,
            rnr_timer_ns: 100_000,
            // 4.096 us << 14, what RDMA CM asks for on IB.
            transport_timeout_ns: 67_108_864,
            cm_timeout_ns: 1_000_000_000,
            timewait_ns: 10_000_000,
            rnr_retry_from_peer: false,
            trace_capacity: 10_000,
            record_payloads: false,
        }
    }
}

/// Counters of the whole fabric. Doorbells are post calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub post_send_calls: u64,
    /// Post calls whose chain carried both RDMA READs and SENDs.
    pub read_and_send_posts: u64,
    pub send_wrs: u64,
    /// Own-RQ and SRQ post calls.
    pub post_recv_calls: u64,
    pub recv_wrs: u64,
    pub cq_polls: u64,
    pub empty_polls: u64,
    /// `ibv_req_notify_cq` calls on CQs with a completion channel.
    pub cq_arms: u64,
    /// Completions queued, and lost to CQ overruns.
    pub cqes: u64,
    pub cqes_lost: u64,
    pub packets: u64,
    pub rnr_naks: u64,
    /// Scheduler events run.
    pub events: u64,
}

/// What a host received: totals of delivered SEND and RDMA WRITE payloads, and bytes RDMA
/// READ from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostRx {
    pub sends: u64,
    pub send_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub read_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveredKind {
    Send,
    Write,
}

/// One payload delivered to a host (with [`SimConfig::record_payloads`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub kind: DeliveredKind,
    /// The receiving QP.
    pub qp_num: u32,
    /// The remote address of a WRITE (0 for a SEND).
    pub addr: u64,
    pub data: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimAsyncEventKind {
    CqErr,
    QpFatal,
    QpAccessErr,
    QpLastWqeReached,
    CommEst,
    PortErr,
    DeviceFatal,
}

/// An asynchronous device event ([`SimContext::take_async_event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimAsyncEvent {
    pub kind: SimAsyncEventKind,
    pub qp_num: Option<u32>,
    /// [`SimCq::id`] of the CQ, for `CqErr`.
    pub cq_id: Option<u64>,
}

/// The inline data a simulated device takes per send work request unless
/// [`SimVerbs::set_max_inline_data`] says otherwise: no limit (the raw hosts of the tests send
/// whole in-capsule writes inline).
pub const DEFAULT_MAX_INLINE_DATA: u32 = u32::MAX;

/// Device attributes of a simulated host: rxe-like limits, no capability flags.
pub fn default_device_attr() -> DeviceAttr {
    DeviceAttr {
        fw_ver: "sim-1".to_string(),
        node_guid: 0,
        vendor_id: 0,
        vendor_part_id: 0,
        max_mr_size: u64::MAX,
        max_qp: 1 << 20,
        max_qp_wr: 16_384,
        device_cap_flags: DeviceCapFlags(0),
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: 1 << 20,
        max_cqe: 65_536,
        max_mr: 1 << 24,
        max_pd: 1 << 20,
        max_qp_rd_atom: 128,
        max_qp_init_rd_atom: 128,
        max_srq: 1 << 20,
        max_srq_wr: 16_384,
        max_srq_sge: 32,
        phys_port_cnt: 1,
    }
}

/// [`default_device_attr`] plus type 2B memory windows and the memory management
/// extensions (local and remote invalidation), as a ConnectX reports them: a host made with
/// these ([`SimFabric::add_host_with`]) can allocate windows, and the target answers keyed
/// commands that ask for it with SEND_WITH_INVALIDATE.
pub fn windows_device_attr() -> DeviceAttr {
    let mut attr = default_device_attr();
    attr.device_cap_flags = DeviceCapFlags(
        DeviceCapFlags::MEM_WINDOW.0
            | DeviceCapFlags::MEM_MGT_EXTENSIONS.0
            | DeviceCapFlags::MEM_WINDOW_TYPE_2B.0,
    );
    attr
}

/// One simulated fabric: many hosts, one virtual clock, one scheduler. Cloning shares it.
#[derive(Clone)]
pub struct SimFabric(Arc<Mutex<FabricState>>);

impl std::fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("SimFabric")
            .field("now_ns", &st.now)
            .field("hosts", &st.hosts.len())
            .field("pending_events", &st.pending_events())
            .finish()
    }
}

impl SimFabric {
    pub fn new(cfg: SimConfig) -> Self {
        Self(Arc::new(Mutex::new(FabricState::new(cfg))))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, FabricState> {
        // State is only changed by the simulator's own code; a panic in a test thread
        // while holding the lock leaves nothing that later calls cannot read.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A host with one device (named `sim<n>`, default attributes) owning `ip`.
    ///
    /// # Panics
    ///
    /// If a host of the fabric already owns `ip`.
    pub fn add_host(&self, ip: IpAddr) -> SimVerbs {
        let n = self.lock().hosts.len();
        self.add_host_with(ip, default_device_attr(), &format!("sim{n}"))
    }

    /// A host whose device has `attr` (limits: `max_cqe`, `max_qp_wr`, `max_srq_wr`,
    /// `max_sge`, cap flags, vendor id) and `name` (a name starting with `rxe` makes it
    /// soft-RoCE).
    ///
    /// # Panics
    ///
    /// If a host of the fabric already owns `ip`.
    pub fn add_host_with(&self, ip: IpAddr, attr: DeviceAttr, name: &str) -> SimVerbs {
        let mut st = self.lock();
        assert!(st.host_of_ip(ip).is_none(), "{ip} is already on the fabric");
        let host = st.hosts.len();
        let mut attr = attr;
        if attr.node_guid == 0 {
            attr.node_guid = 0x5157_0000_0000_0000 | host as u64;
        }
        st.hosts.push(Host {
            ip,
            name: name.to_string(),
            attr,
            max_inline_data: DEFAULT_MAX_INLINE_DATA,
            inline_send_wrs: 0,
            crashed: false,
            removed: false,
            incarnation: 0,
            open_contexts: 0,
            async_events: Default::default(),
            rx: HostRx::default(),
            delivered: Vec::new(),
        });
        st.trace(|| format!("host {host} {name} {ip}"));
        SimVerbs {
            fabric: self.clone(),
            host,
        }
    }

    /// Runs the events due now; if none are, advances virtual time to the next event and
    /// runs those. Returns false when nothing is scheduled at all.
    pub fn step(&self) -> bool {
        self.lock().step()
    }

    /// Like [`step`](Self::step), but never past `limit` (false if the next event is later).
    pub(crate) fn step_until(&self, limit: u64) -> bool {
        let mut st = self.lock();
        match st.next_event_time() {
            Some(t) if t <= limit => st.step(),
            _ => false,
        }
    }

    /// Steps until nothing is scheduled or `max_steps` steps ran; returns the steps taken.
    pub fn run_until_idle(&self, max_steps: usize) -> usize {
        let mut n = 0;
        while n < max_steps && self.step() {
            n += 1;
        }
        n
    }

    /// Runs the events due up to `now + d`, advancing virtual time to it.
    pub fn advance(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.lock().advance(ns);
    }

    pub(crate) fn advance_to(&self, t: u64) {
        let mut st = self.lock();
        let d = t.saturating_sub(st.now);
        st.advance(d);
    }

    pub fn now_ns(&self) -> u64 {
        self.lock().now
    }

    /// Virtual time as an `Instant` (what [`Verbs::now`](super::verbs::Verbs::now) of the
    /// fabric's providers returns): a fixed base plus [`now_ns`](Self::now_ns).
    pub fn instant(&self) -> Instant {
        let st = self.lock();
        st.base + Duration::from_nanos(st.now)
    }

    /// Virtual milliseconds, kept current by the fabric.
    pub fn clock_ms(&self) -> Arc<AtomicU64> {
        self.lock().clock_ms()
    }

    /// Virtual nanoseconds, kept current by the fabric (for a core clock).
    pub fn clock_ns(&self) -> Arc<AtomicU64> {
        self.lock().clock_ns()
    }

    /// Events scheduled and not run yet.
    pub fn pending_events(&self) -> usize {
        self.lock().pending_events()
    }

    pub fn faults(&self) -> Faults<'_> {
        Faults { fabric: self }
    }

    /// [`Faults::fail_post_send`].
    pub fn fail_post_send(&self, qp_num: u32, nth_call: u32, at_index: usize, errno: i32) {
        self.faults()
            .fail_post_send(qp_num, nth_call, at_index, errno);
    }

    /// [`Faults::fail_post_recv`].
    pub fn fail_post_recv(&self, qp_num: u32, nth_call: u32, at_index: usize, errno: i32) {
        self.faults()
            .fail_post_recv(qp_num, nth_call, at_index, errno);
    }

    /// [`Faults::hold_writes`].
    pub fn hold_writes(&self, qp_num: u32) {
        self.faults().hold_writes(qp_num);
    }

    /// [`Faults::release_writes`].
    pub fn release_writes(&self, qp_num: u32) {
        self.faults().release_writes(qp_num);
    }

    /// [`Faults::late_responses`].
    pub fn late_responses(&self, qp_num: u32, extra: Duration) {
        self.faults().late_responses(qp_num, extra);
    }

    /// The device of the host owning `ip` is removed (see the `removal` module): its CM ids
    /// get `DEVICE_REMOVAL` and are closed, its QPs go to Error, nothing new is made on it.
    pub fn remove_device(&self, ip: IpAddr) {
        let mut st = self.lock();
        if let Some(h) = st.host_of_ip(ip) {
            st.remove_device(h);
        }
    }

    /// The removed device of the host owning `ip` comes back, as a new device: contexts
    /// opened before the removal stay dead.
    pub fn restore_device(&self, ip: IpAddr) {
        let mut st = self.lock();
        if let Some(h) = st.host_of_ip(ip) {
            st.restore_device(h);
        }
    }

    /// What users still hold on the device of the host owning `ip`: a removal completes
    /// only once this is empty.
    pub fn device_objects(&self, ip: IpAddr) -> DeviceObjects {
        let st = self.lock();
        st.host_of_ip(ip)
            .map(|h| st.device_objects(h))
            .unwrap_or_default()
    }

    /// [`Faults::crash_host`].
    pub fn crash_host(&self, ip: IpAddr) {
        self.faults().crash_host(ip);
    }

    /// [`Faults::inject_async_event`].
    pub fn inject_async_event(&self, ip: IpAddr, ev: SimAsyncEvent) {
        self.faults().inject_async_event(ip, ev);
    }

    /// Takes every async event queued on `host`'s device (as
    /// [`SimContext::take_async_event`] does one by one).
    pub fn take_async_events_of(&self, host: &SimVerbs) -> Vec<SimAsyncEvent> {
        self.lock().hosts[host.host]
            .async_events
            .drain(..)
            .collect()
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// The last [`SimConfig::trace_capacity`] trace lines (virtual ns, then what happened).
    pub fn trace(&self) -> Vec<String> {
        self.lock().trace_lines()
    }

    pub fn config(&self) -> SimConfig {
        self.lock().cfg.clone()
    }

    /// What the host owning `ip` received.
    pub fn host_rx(&self, ip: IpAddr) -> Option<HostRx> {
        let st = self.lock();
        st.host_of_ip(ip).map(|h| st.hosts[h].rx)
    }

    /// Every SEND and RDMA WRITE payload delivered to the host owning `ip`, oldest first
    /// (empty unless [`SimConfig::record_payloads`]).
    pub fn delivered(&self, ip: IpAddr) -> Vec<Delivered> {
        let st = self.lock();
        st.host_of_ip(ip)
            .map(|h| st.hosts[h].delivered.clone())
            .unwrap_or_default()
    }

    /// Something to run while [`VerbsChannel::wait_event`](super::verbs::VerbsChannel::wait_event)
    /// waits (between scheduler steps), such as the other side's actors; called without
    /// the fabric lock.
    pub fn set_idle_hook(&self, hook: Option<Arc<dyn Fn() + Send + Sync>>) {
        self.lock().idle_hook = hook;
    }

    /// The idle hook, marked running; `None` if there is none or it is already running
    /// (a `wait_event` inside the hook does not call it again).
    pub(crate) fn take_idle_hook(&self) -> Option<Arc<dyn Fn() + Send + Sync>> {
        let mut st = self.lock();
        if st.hook_running {
            return None;
        }
        let hook = st.idle_hook.clone();
        st.hook_running = hook.is_some();
        hook
    }
}

/// The work request id of a [`Faults::stray_write`]'s completion.
pub const STRAY_WR_ID: u64 = u64::MAX;

/// Fault injection on a fabric.
pub struct Faults<'a> {
    fabric: &'a SimFabric,
}

impl Faults<'_> {
    fn add(&self, recv: bool, qp_num: u32, nth_call: u32, at_index: usize, errno: i32) {
        let mut st = self.fabric.lock();
        let done = st.qp_by_num.get(&qp_num).map_or(0, |id| {
            let q = &st.qps[id];
            if recv {
                q.post_recv_calls
            } else {
                q.post_send_calls
            }
        });
        let fault = PostFault {
            call: done + u64::from(nth_call),
            index: at_index,
            errno,
        };
        let map = if recv {
            &mut st.faults.post_recv
        } else {
            &mut st.faults.post_send
        };
        map.entry(qp_num).or_default().push(fault);
        st.trace(|| {
            format!("fault: qp={qp_num} post #{nth_call} fails at {at_index} errno {errno}")
        });
    }

    /// The `nth_call`-th future `post_send` on QP `qp_num` (0: the next one) posts the work
    /// requests before `at_index` and fails with `PostSend { index: at_index }` and `errno`.
    /// `at_index` is clamped to the call's last request.
    pub fn fail_post_send(&self, qp_num: u32, nth_call: u32, at_index: usize, errno: i32) {
        self.add(false, qp_num, nth_call, at_index, errno);
    }

    /// The same for the QP's own receive queue (`PostRecv`).
    pub fn fail_post_recv(&self, qp_num: u32, nth_call: u32, at_index: usize, errno: i32) {
        self.add(true, qp_num, nth_call, at_index, errno);
    }

    /// RDMA WRITEs on QP `qp_num`, and every WQE after them, are not executed until
    /// [`release_writes`](Self::release_writes).
    pub fn hold_writes(&self, qp_num: u32) {
        let mut st = self.fabric.lock();
        st.faults.held_writes.insert(qp_num);
        st.trace(|| format!("fault: qp={qp_num} writes held"));
    }

    /// Every response QP `qp_num` sends from now on (ACK, READ response, NAK) reaches its
    /// requester `extra` later than the link would deliver it, and requests the QP sends
    /// after it may arrive first: as on soft-RoCE, where a requester's completions (its
    /// completer task) can lag the commands its peer sent since (its responder task), so a
    /// host's next command can come before our SEND's completion. `Duration::ZERO` ends it.
    pub fn late_responses(&self, qp_num: u32, extra: Duration) {
        let mut st = self.fabric.lock();
        let ns = u64::try_from(extra.as_nanos()).unwrap_or(u64::MAX);
        if ns == 0 {
            st.faults.late_responses.remove(&qp_num);
        } else {
            st.faults.late_responses.insert(qp_num, ns);
        }
        st.trace(|| format!("fault: qp={qp_num} responses {ns} ns late"));
    }

    pub fn release_writes(&self, qp_num: u32) {
        let mut st = self.fabric.lock();
        st.faults.held_writes.remove(&qp_num);
        st.trace(|| format!("fault: qp={qp_num} writes released"));
        if let Some(&qp) = st.qp_by_num.get(&qp_num) {
            st.kick(qp);
        }
    }

    /// The host owning `ip` vanishes: its QPs stop sending and responding, and it sends
    /// and receives no CM message. Peers' outstanding requests end in `RETRY_EXC_ERR` after
    /// their transport timeout.
    pub fn crash_host(&self, ip: IpAddr) {
        let mut st = self.fabric.lock();
        if let Some(h) = st.host_of_ip(ip) {
            st.hosts[h].crashed = true;
            st.trace(|| format!("fault: host {h} ({ip}) crashed"));
        }
    }

    /// QP `qp_num` RDMA WRITEs `data` to `remote_addr` under `rkey` at its peer, as if its
    /// owner had posted it behind what it has posted: what a buggy or hostile peer does
    /// with a key it should have forgotten. The completion (signaled, wr_id
    /// [`STRAY_WR_ID`]) goes to the QP's send CQ; an rkey that no longer grants the access
    /// fails there with `REM_ACCESS_ERR` and both QPs go to Error (the victim's device
    /// raises `QP_ACCESS_ERR`). False if there is no such QP.
    pub fn stray_write(&self, qp_num: u32, remote_addr: u64, rkey: u32, data: &[u8]) -> bool {
        let mut st = self.fabric.lock();
        let Some(&qp) = st.qp_by_num.get(&qp_num) else {
            return false;
        };
        st.trace(|| format!("fault: qp={qp_num} stray WRITE of {} bytes", data.len()));
        st.enqueue_stray_write(qp, remote_addr, rkey, data.to_vec());
        true
    }

    /// Queues `ev` on the device of the host owning `ip`.
    pub fn inject_async_event(&self, ip: IpAddr, ev: SimAsyncEvent) {
        let mut st = self.fabric.lock();
        if let Some(h) = st.host_of_ip(ip) {
            st.raise_async(h, ev);
        }
    }
}

/// The provider of one simulated host.
#[derive(Clone)]
pub struct SimVerbs {
    fabric: SimFabric,
    host: HostId,
}

impl std::fmt::Debug for SimVerbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimVerbs")
            .field("host", &self.host)
            .finish()
    }
}

impl SimVerbs {
    pub fn fabric(&self) -> &SimFabric {
        &self.fabric
    }

    pub fn ip(&self) -> IpAddr {
        self.fabric.lock().hosts[self.host].ip
    }

    /// The host's device (what a CM id bound to the host's address reports), e.g. for a
    /// listener on the wildcard address, which has none.
    pub fn context(&self) -> Arc<SimContext> {
        SimContext::new(self.fabric.clone(), self.host)
    }

    /// The most inline data this host's device lets a QP ask for (default
    /// [`DEFAULT_MAX_INLINE_DATA`]): a QP asking for more is refused with `EINVAL`, as
    /// providers do; 0 is a device without inline sends.
    pub fn set_max_inline_data(&self, bytes: u32) {
        self.fabric.lock().hosts[self.host].max_inline_data = bytes;
    }

    /// Send work requests this host's QPs posted with inline data, so far.
    pub fn inline_send_wrs(&self) -> u64 {
        self.fabric.lock().hosts[self.host].inline_send_wrs
    }
}

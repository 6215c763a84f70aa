//! The fabric's state: hosts, the objects of every host (slab maps indexed by object id),
//! the event heap and virtual clock, delay draws, completion queues, async events and the
//! trace ring.
//!
//! Everything here runs under the fabric's one mutex and never calls out of the simulator.
//! Iteration order is always that of `BTreeMap`s or `Vec`s, so the same seed and the same
//! verb calls give the same schedule.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::super::cm::{CmEventKind, ConnEventParams};
use super::super::cq::WorkCompletion;
use super::super::device::DeviceAttr;
use super::super::mr::{AccessFlags, DeviceMemory};
use super::super::qp::QpCaps;
use super::super::wr::Sge;
use super::cm::{CmIdState, CmMsg};
use super::mw::{BindWqe, MwEntry};
use super::{
    Delivered, DeliveredKind, HostRx, SimAsyncEvent, SimAsyncEventKind, SimConfig, SimStats,
};

/// Every simulated object (PD, CQ, SRQ, QP, channel, CM id) has an id from one monotonic
/// counter: never reused within a fabric, and the stream its delays are drawn from.
pub(crate) type ObjId = u64;
/// Index into [`FabricState::hosts`].
pub(crate) type HostId = usize;
/// A scheduled event: (time, sequence number).
pub(crate) type TimerKey = (u64, u64);

pub(crate) struct Host {
    pub ip: IpAddr,
    pub name: String,
    pub attr: DeviceAttr,
    /// The most inline data a QP of this device may ask for (`ibv_device_attr` does not
    /// say; a provider refuses a larger `max_inline_data` at QP creation).
    pub max_inline_data: u32,
    /// Send work requests its QPs posted with inline data.
    pub inline_send_wrs: u64,
    pub crashed: bool,
    /// The device is gone (`rdma link delete`, a driver unbound): nothing new is made on
    /// it until it comes back.
    pub removed: bool,
    /// Which coming of the device contexts opened now belong to: a device that is removed
    /// and comes back is another device to its users (librdmacm opens it anew).
    pub incarnation: u32,
    /// Contexts of this host's device open now, of any incarnation.
    pub open_contexts: usize,
    pub async_events: VecDeque<SimAsyncEvent>,
    pub rx: HostRx,
    pub delivered: Vec<Delivered>,
}

/// A registration in the key table.
pub(crate) struct MrEntry {
    pub pd: ObjId,
    pub iova: u64,
    pub len: u64,
    pub access: AccessFlags,
    /// 0 when the region has no remote access (as rxe reports it).
    pub rkey: u32,
    pub mem: DeviceMemory,
}

pub(crate) struct CqState {
    pub host: HostId,
    pub cap: u32,
    pub entries: VecDeque<WorkCompletion>,
    /// A completion did not fit: nothing more is queued and `poll` fails once drained.
    pub overrun: bool,
    /// The completion channel's writing end (CQs made with one), and whether the CQ is
    /// armed: its next completion writes one event and disarms it, as `ibv_req_notify_cq`.
    pub channel: Option<std::os::unix::net::UnixStream>,
    pub armed: bool,
}

pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
}

pub(crate) struct SrqState {
    pub pd: ObjId,
    pub max_wr: u32,
    pub max_sge: u32,
    pub wqes: VecDeque<RecvWqe>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpSt {
    /// Created; receives may be posted, sends may not.
    Init,
    /// Connected (RTR and RTS at once).
    Rts,
    Error,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeOp {
    Send {
        inv: Option<u32>,
    },
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    Read {
        remote_addr: u64,
        rkey: u32,
    },
    /// Executed by the send engine itself, in order; nothing goes on the wire.
    Bind(BindWqe),
    LocalInv {
        rkey: u32,
    },
}

impl WqeOp {
    pub fn name(self) -> &'static str {
        match self {
            WqeOp::Send { inv: None } => "SEND",
            WqeOp::Send { inv: Some(_) } => "SEND_INV",
            WqeOp::Write { .. } => "WRITE",
            WqeOp::Read { .. } => "READ",
            WqeOp::Bind(_) => "BIND_MW",
            WqeOp::LocalInv { .. } => "LOCAL_INV",
        }
    }

    /// A work request the local device executes (no packet, no response).
    pub fn is_local(self) -> bool {
        matches!(self, WqeOp::Bind(_) | WqeOp::LocalInv { .. })
    }
}

pub(crate) enum WqeData {
    Sges(Vec<Sge>),
    /// Copied at post time.
    Inline(Vec<u8>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeSt {
    /// Not transmitted yet (or to be transmitted again after an RNR NAK).
    Pending,
    InFlight,
    /// Finished with this status and byte count; retires once it reaches the head.
    Done(u32, u32),
}

pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: WqeOp,
    pub data: WqeData,
    pub signaled: bool,
    pub fence: bool,
    /// Sequence number on the QP's send queue; contiguous from the head.
    pub psn: u64,
    /// Sequence number of the packet on the wire (local work requests send none, so the
    /// responder's count skips them); unused for local ones.
    pub wire_psn: u64,
    pub state: WqeSt,
    /// RNR retries left for this message, set at its first RNR NAK.
    pub rnr_left: Option<u8>,
}

pub(crate) struct QpState {
    pub host: HostId,
    pub num: u32,
    pub pd: ObjId,
    pub send_cq: ObjId,
    pub recv_cq: ObjId,
    pub srq: Option<ObjId>,
    pub caps: QpCaps,
    pub state: QpSt,
    pub peer: Option<ObjId>,
    pub sq: VecDeque<SendWqe>,
    pub rq: VecDeque<RecvWqe>,
    /// Unsignaled WQEs that completed successfully: their slots are freed by the next
    /// signaled completion (or an error completion).
    pub unsignaled_held: u32,
    pub next_psn: u64,
    /// The wire sequence number of the next request posted.
    pub next_wire_psn: u64,
    /// The next WQE to transmit.
    pub tx_psn: u64,
    /// The next request expected from the peer (a wire sequence number).
    pub rx_psn: u64,
    /// 0-7, 7 meaning infinite.
    pub rnr_retry: u8,
    pub retry_count: u8,
    /// No transmission before this time (RNR timer).
    pub resume_at: u64,
    pub exec_pending: bool,
    /// The send engine's run after the RNR timer, if one is scheduled.
    pub rnr_timer: Option<TimerKey>,
    /// Transport timeouts of lost packets.
    pub lost_timers: Vec<TimerKey>,
    /// A WQE failed at the peer or timed out: nothing more is transmitted until it retires
    /// (and the QP goes to Error).
    pub stalled: bool,
    pub post_send_calls: u64,
    pub post_recv_calls: u64,
}

impl QpState {
    pub fn outstanding(&self) -> u64 {
        self.sq.len() as u64 + u64::from(self.unsignaled_held)
    }

    pub fn index_of(&self, psn: u64) -> Option<usize> {
        let head = self.sq.front()?.psn;
        let idx = usize::try_from(psn.checked_sub(head)?).ok()?;
        (idx < self.sq.len()).then_some(idx)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nak {
    Rnr,
    RemoteAccess,
    InvalidRequest,
    RemoteOp,
}

pub(crate) enum Body {
    Send {
        data: Vec<u8>,
        inv: Option<u32>,
    },
    Write {
        remote_addr: u64,
        rkey: u32,
        data: Vec<u8>,
    },
    ReadReq {
        remote_addr: u64,
        rkey: u32,
        len: u64,
    },
    Ack,
    ReadResp {
        data: Vec<u8>,
    },
    Nak(Nak),
}

pub(crate) struct Packet {
    pub src: ObjId,
    pub dst: ObjId,
    /// The requester's send-queue sequence number (responses carry the request's).
    pub psn: u64,
    /// The request's wire sequence number, checked by the responder (0 in responses).
    pub wire_psn: u64,
    pub body: Body,
}

pub(crate) enum Event {
    /// Run a QP's send engine.
    ExecSq(ObjId),
    /// Flush a QP in Error (WQEs posted after it went there).
    Flush(ObjId),
    Packet(Packet),
    /// A packet of this requester's message was lost: the transport gives up.
    Timeout {
        qp: ObjId,
        psn: u64,
    },
    Cm(CmMsg),
}

/// A queued CM event; the id handle of a connect request is made when it is taken.
pub(crate) struct PendingEvent {
    pub kind: CmEventKind,
    pub status: i32,
    pub id: ObjId,
    pub listen_id: Option<ObjId>,
    pub id_context: u64,
    pub new_id: bool,
    pub private_data: Vec<u8>,
    pub conn: ConnEventParams,
}

pub(crate) struct ChannelState {
    pub queue: VecDeque<PendingEvent>,
}

#[derive(Clone, Copy)]
pub(crate) struct PostFault {
    pub call: u64,
    pub index: usize,
    pub errno: i32,
}

#[derive(Default)]
pub(crate) struct FaultState {
    pub post_send: BTreeMap<u32, Vec<PostFault>>,
    pub post_recv: BTreeMap<u32, Vec<PostFault>>,
    pub held_writes: BTreeSet<u32>,
    /// QP number -> extra delay (ns) of every response it sends (`Faults::late_responses`).
    pub late_responses: BTreeMap<u32, u64>,
}

impl FaultState {
    fn take(map: &mut BTreeMap<u32, Vec<PostFault>>, qp_num: u32, call: u64) -> Option<PostFault> {
        let list = map.get_mut(&qp_num)?;
        let pos = list.iter().position(|f| f.call == call)?;
        let f = list.remove(pos);
        if list.is_empty() {
            map.remove(&qp_num);
        }
        Some(f)
    }

    pub fn take_post_send(&mut self, qp_num: u32, call: u64) -> Option<PostFault> {
        Self::take(&mut self.post_send, qp_num, call)
    }

    pub fn take_post_recv(&mut self, qp_num: u32, call: u64) -> Option<PostFault> {
        Self::take(&mut self.post_recv, qp_num, call)
    }
}

pub(crate) type IdleHook = Arc<dyn Fn() + Send + Sync>;

pub(crate) struct FabricState {
    pub cfg: SimConfig,
    pub now: u64,
    seq: u64,
    next_obj: u64,
    next_qp_num: u32,
    next_key_index: u32,
    next_port: u16,
    events: BTreeMap<(u64, u64), Event>,
    draws: BTreeMap<ObjId, u64>,
    pub hosts: Vec<Host>,
    /// PD id -> host.
    pub pds: BTreeMap<ObjId, HostId>,
    /// lkey -> registration.
    pub mrs: BTreeMap<u32, MrEntry>,
    /// Key index (`key >> 8`) -> memory window.
    pub mws: BTreeMap<u32, MwEntry>,
    pub cqs: BTreeMap<ObjId, CqState>,
    pub srqs: BTreeMap<ObjId, SrqState>,
    pub qps: BTreeMap<ObjId, QpState>,
    pub qp_by_num: BTreeMap<u32, ObjId>,
    /// Last delivery time per (source QP, destination QP).
    links: BTreeMap<(ObjId, ObjId), u64>,
    pub channels: BTreeMap<ObjId, ChannelState>,
    pub cm_ids: BTreeMap<ObjId, CmIdState>,
    /// (host, ip or unspecified, port) -> CM id.
    pub bound: BTreeMap<(HostId, IpAddr, u16), ObjId>,
    pub stats: SimStats,
    trace: VecDeque<String>,
    pub faults: FaultState,
    clock_ms: Arc<AtomicU64>,
    clock_ns: Arc<AtomicU64>,
    pub idle_hook: Option<IdleHook>,
    /// What virtual time 0 is as an `Instant`.
    pub base: Instant,
    /// The idle hook is running (it is not called again from inside itself).
    pub hook_running: bool,
}

pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl FabricState {
    pub fn new(cfg: SimConfig) -> Self {
        Self {
            cfg,
            now: 0,
            seq: 0,
            next_obj: 1,
            next_qp_num: 0x11,
            next_key_index: 1,
            next_port: 49152,
            events: BTreeMap::new(),
            draws: BTreeMap::new(),
            hosts: Vec::new(),
            pds: BTreeMap::new(),
            mrs: BTreeMap::new(),
            mws: BTreeMap::new(),
            cqs: BTreeMap::new(),
            srqs: BTreeMap::new(),
            qps: BTreeMap::new(),
            qp_by_num: BTreeMap::new(),
            links: BTreeMap::new(),
            channels: BTreeMap::new(),
            cm_ids: BTreeMap::new(),
            bound: BTreeMap::new(),
            stats: SimStats::default(),
            trace: VecDeque::new(),
            faults: FaultState::default(),
            clock_ms: Arc::new(AtomicU64::new(0)),
            clock_ns: Arc::new(AtomicU64::new(0)),
            idle_hook: None,
            base: Instant::now(),
            hook_running: false,
        }
    }

    // ---- ids, keys, ports ----

    pub fn alloc_id(&mut self) -> ObjId {
        let id = self.next_obj;
        self.next_obj += 1;
        id
    }

    pub fn alloc_qp_num(&mut self) -> u32 {
        let n = self.next_qp_num;
        // 24-bit QP numbers; a fabric never gets near the wrap in a test.
        self.next_qp_num = (self.next_qp_num + 1) & 0x00ff_ffff;
        n
    }

    /// `index << 8 | tag`, as rxe and most providers build keys.
    pub fn alloc_key(&mut self) -> u32 {
        let index = self.next_key_index;
        self.next_key_index += 1;
        let tag = (splitmix64(u64::from(index)) & 0xff) as u32;
        (index << 8) | tag
    }

    pub fn alloc_port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p == u16::MAX { 49152 } else { p + 1 };
        p
    }

    pub fn host_of_ip(&self, ip: IpAddr) -> Option<HostId> {
        self.hosts.iter().position(|h| h.ip == ip)
    }

    // ---- time and scheduling ----

    pub fn clock_ns(&self) -> Arc<AtomicU64> {
        self.clock_ns.clone()
    }

    pub fn clock_ms(&self) -> Arc<AtomicU64> {
        self.clock_ms.clone()
    }

    fn set_now(&mut self, t: u64) {
        if t > self.now {
            self.now = t;
            self.clock_ms.store(t / 1_000_000, Ordering::Relaxed);
            self.clock_ns.store(t, Ordering::Relaxed);
        }
    }

    /// Schedules `ev` at `at` (never in the past); the key cancels it.
    pub fn schedule(&mut self, at: u64, ev: Event) -> TimerKey {
        let seq = self.seq;
        self.seq += 1;
        let key = (at.max(self.now), seq);
        self.events.insert(key, ev);
        key
    }

    /// Removes a scheduled event (a timer that became moot), so it neither runs nor moves
    /// the clock when the fabric idles.
    pub fn cancel(&mut self, key: Option<TimerKey>) {
        if let Some(key) = key {
            self.events.remove(&key);
        }
    }

    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    pub fn next_event_time(&self) -> Option<u64> {
        self.events.first_key_value().map(|(&(t, _), _)| t)
    }

    /// A delay from `obj`'s own counter-based stream.
    pub fn draw_delay(&mut self, obj: ObjId) -> u64 {
        let n = self.draws.entry(obj).or_insert(0);
        let draw = *n;
        *n += 1;
        let r =
            splitmix64(self.cfg.seed ^ splitmix64(obj) ^ draw.wrapping_mul(0xD134_2543_DE82_EF95));
        let (lo, hi) = (
            self.cfg.min_delay_ns,
            self.cfg.max_delay_ns.max(self.cfg.min_delay_ns),
        );
        lo + r % (hi - lo + 1)
    }

    /// Delivery time of the next packet from `src` to `dst`: a drawn delay, never before
    /// the previous packet on that link.
    pub fn link_time(&mut self, src: ObjId, dst: ObjId) -> u64 {
        let t = self.now + self.draw_delay(src);
        let last = self.links.entry((src, dst)).or_insert(0);
        let at = t.max(*last);
        *last = at;
        at
    }

    /// Drops the links from `qp` and the one from its peer to it.
    pub fn forget_links(&mut self, qp: ObjId, peer: Option<ObjId>) {
        let from: Vec<_> = self
            .links
            .range((qp, 0)..=(qp, ObjId::MAX))
            .map(|(&k, _)| k)
            .collect();
        for k in from {
            self.links.remove(&k);
        }
        if let Some(peer) = peer {
            self.links.remove(&(peer, qp));
        }
    }

    /// Runs every event due now (and those they schedule for now).
    fn run_due(&mut self) {
        while let Some(entry) = self.events.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let ev = entry.remove();
            self.dispatch(ev);
        }
    }

    /// See [`SimFabric::step`](super::SimFabric::step).
    pub fn step(&mut self) -> bool {
        let Some((&(t, _), _)) = self.events.first_key_value() else {
            return false;
        };
        self.set_now(t);
        self.run_due();
        true
    }

    /// Runs events due up to `now + d` in order, then sets the clock to it.
    pub fn advance(&mut self, d: u64) {
        let target = self.now.saturating_add(d);
        while let Some(entry) = self.events.first_entry() {
            let t = entry.key().0;
            if t > target {
                break;
            }
            let ev = entry.remove();
            self.set_now(t);
            self.dispatch(ev);
        }
        self.set_now(target);
    }

    fn dispatch(&mut self, ev: Event) {
        self.stats.events += 1;
        match ev {
            Event::ExecSq(qp) => self.run_sq(qp),
            Event::Flush(qp) => {
                if self.qps.get(&qp).is_some_and(|q| q.state == QpSt::Error) {
                    self.flush_qp(qp);
                }
            }
            Event::Packet(p) => self.deliver(p),
            Event::Timeout { qp, psn } => self.on_timeout(qp, psn),
            Event::Cm(msg) => self.on_cm(msg),
        }
    }

    // ---- trace ----

    pub fn trace(&mut self, line: impl FnOnce() -> String) {
        let cap = self.cfg.trace_capacity;
        if cap == 0 {
            return;
        }
        while self.trace.len() >= cap {
            self.trace.pop_front();
        }
        let s = format!("{:>12} {}", self.now, line());
        self.trace.push_back(s);
    }

    pub fn trace_lines(&self) -> Vec<String> {
        self.trace.iter().cloned().collect()
    }

    // ---- async events, receive accounting ----

    pub fn raise_async(&mut self, host: HostId, ev: SimAsyncEvent) {
        self.trace(|| format!("async host={host} {ev:?}"));
        self.hosts[host].async_events.push_back(ev);
    }

    pub fn record_rx(
        &mut self,
        host: HostId,
        kind: DeliveredKind,
        qp_num: u32,
        addr: u64,
        data: &[u8],
    ) {
        let h = &mut self.hosts[host];
        match kind {
            DeliveredKind::Send => {
                h.rx.sends += 1;
                h.rx.send_bytes += data.len() as u64;
            }
            DeliveredKind::Write => {
                h.rx.writes += 1;
                h.rx.write_bytes += data.len() as u64;
            }
        }
        if self.cfg.record_payloads {
            h.delivered.push(Delivered {
                kind,
                qp_num,
                addr,
                data: data.to_vec(),
            });
        }
    }

    // ---- completion queues ----

    /// Queues a completion; an overrun (no room) loses it, raises CQ_ERR and moves every QP
    /// on the CQ to Error (QP_FATAL).
    pub fn push_cqe(&mut self, cq: ObjId, wc: WorkCompletion) {
        let Some(c) = self.cqs.get_mut(&cq) else {
            return;
        };
        if c.overrun {
            self.stats.cqes_lost += 1;
            return;
        }
        if c.entries.len() >= c.cap as usize {
            c.overrun = true;
            let host = c.host;
            self.stats.cqes_lost += 1;
            self.trace(|| {
                format!(
                    "cq {cq} overrun, lost wr_id={} qp={}",
                    wc.wr_id(),
                    wc.qp_num()
                )
            });
            self.raise_async(
                host,
                SimAsyncEvent {
                    kind: SimAsyncEventKind::CqErr,
                    qp_num: None,
                    cq_id: Some(cq),
                },
            );
            let users: Vec<ObjId> = self
                .qps
                .iter()
                .filter(|(_, q)| q.send_cq == cq || q.recv_cq == cq)
                .map(|(&id, _)| id)
                .collect();
            for qp in users {
                self.qp_to_error(qp, Some(SimAsyncEventKind::QpFatal));
            }
            return;
        }
        self.stats.cqes += 1;
        c.entries.push_back(wc);
        if c.armed {
            c.armed = false;
            if let Some(channel) = &c.channel {
                use std::io::Write as _;
                // Non-blocking; a full socket already holds unread events.
                let _ = (&*channel).write(&[1]);
            }
        }
    }

    // ---- channels ----

    /// A CM event that carries no private data and no connection parameters.
    pub fn push_plain_event(&mut self, id: ObjId, kind: CmEventKind, status: i32) {
        self.push_cm_event(id, kind, status, Vec::new(), ConnEventParams::default());
    }

    pub fn push_cm_event(
        &mut self,
        id: ObjId,
        kind: CmEventKind,
        status: i32,
        private_data: Vec<u8>,
        conn: ConnEventParams,
    ) {
        let Some(st) = self.cm_ids.get(&id) else {
            return;
        };
        let (channel, id_context) = (st.channel, st.context);
        self.trace(|| format!("cm id={id} event {kind:?} status={status}"));
        if let Some(ch) = self.channels.get_mut(&channel) {
            ch.queue.push_back(PendingEvent {
                kind,
                status,
                id,
                listen_id: None,
                id_context,
                new_id: false,
                private_data,
                conn,
            });
        }
    }
}

/// `data` zero-padded to `len` bytes (as IB CM messages carry private data).
pub(crate) fn padded(data: &[u8], len: usize) -> Vec<u8> {
    let mut v = data.to_vec();
    if v.len() < len {
        v.resize(len, 0);
    }
    v
}

pub(crate) fn socket(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

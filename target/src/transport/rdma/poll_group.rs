//! One reactor's share of the RDMA transport: its devices' CQs and SRQs, its qpairs, and the
//! FIFOs of requests waiting for a resource. Everything here runs on the reactor thread.

use nvmf_common::buffer::BufClass;
use nvmf_common::rdma::{
    AccessFlags, AsyncEvent, AsyncEventKind, CmEventKind, CmIdToken, ConnParams, DmaBuf, QpCaps,
    RealVerbs, SendWr, Verbs, VerbsCmId, VerbsContext, VerbsCq, VerbsQp, WcStatus, WorkCompletion,
    MAX_CHAIN,
};
use nvmf_common::reactor::WaitSet;
use nvmf_common::spec::rdma_cm::{RdmaCmAccept, RdmaCmRejectStatus};
use nvmf_common::spec::sgl::SglKind;
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zerocopy::IntoBytes;

use super::device::DeviceResources;
use super::qpair::{
    claim_index, flush_batch, release, transfer_stuck, wrs_of, Qpair, SlotAccounts, CQE_LEN,
};
use super::read_batch::{drop_queued_reads, flush_reads};
use super::request::{
    parse_tag_slot, parse_wr_id, slots_for, tag_slot, wr_id, HostData, RdmaRequest, State, WrKind,
    DRAIN_SLOT, MAX_QPAIRS,
};
use super::wait_queue::{WaitQueue, Waiter};
use super::NewConnection;
use crate::core::driver;
use crate::core::queue::QueueState;
use crate::core::request::{ReqTag, Request, Wakeup};
use crate::core::{CoreCtx, TICK_MS};
use crate::transport::options::TransportOptions;
use crate::transport::{TransportLimits, TransportPollGroup};

const POLL_BATCH: usize = 32;

/// Fibonacci hashing of a QP number: one multiply, good high bits for the table's control
/// bytes.
#[derive(Default)]
struct QpNumHasher(u64);

impl Hasher for QpNumHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(super) fn class_index(class: BufClass) -> usize {
    match class {
        BufClass::Small => 0,
        BufClass::Large => 1,
    }
}
/// How long (ms) a closing qpair waits for its flushed work requests before it is destroyed
/// anyway.
const DRAIN_TIMEOUT_MS: u64 = 2_000;

pub struct RdmaPollGroup<V: Verbs = RealVerbs> {
    index: u8,
    opts: TransportOptions,
    limits: TransportLimits,
    load: Arc<AtomicUsize>,
    pub(super) devices: Vec<DeviceResources<V>>,
    pub(super) qpairs: Vec<Option<Qpair<V>>>,
    gens: Vec<u8>,
    /// Receive completions name their QP by number: one lookup per command, so a
    /// multiplicative hash, not SipHash (QP numbers come from the device, not from hosts).
    by_qp_num: HashMap<u32, usize, BuildHasherDefault<QpNumHasher>>,
    by_token: HashMap<CmIdToken, usize>,
    /// Requests waiting for a data buffer, one FIFO per class (small, large): a class that
    /// ran out never makes the other's waiters wait, nor costs a scan.
    pub(super) need_buffer: [WaitQueue; 2],
    pub(super) need_send: WaitQueue,
    wcs: [WorkCompletion; POLL_BATCH],
    /// Qpairs with READs or responses queued this turn (see `flush_sends`).
    pub(super) dirty: Vec<usize>,
    /// Qpairs (index, generation) the housekeeping tick looks at: unconnected (connect
    /// timeout), closing (reaped when drained), broken, or with RDMA READs or SENDs posted
    /// (transfer timeout). A connected qpair with nothing posted leaves the list at the tick
    /// that finds it so and comes back with its next posted transfer: idle connections cost
    /// a tick nothing.
    pub(super) watch: Vec<(usize, u8)>,
    /// The core's clock at the start of this turn (stamps posted transfers).
    pub(super) now_ms: u64,
    now_ns: u64,
}

impl<V: Verbs> RdmaPollGroup<V> {
    pub fn new(
        index: u8,
        opts: TransportOptions,
        limits: TransportLimits,
        load: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            index,
            opts,
            limits,
            load,
            devices: Vec::new(),
            qpairs: Vec::new(),
            gens: Vec::new(),
            by_qp_num: HashMap::default(),
            by_token: HashMap::new(),
            need_buffer: [
                WaitQueue::new(State::NeedBuffer),
                WaitQueue::new(State::NeedBuffer),
            ],
            need_send: WaitQueue::new(State::NeedSend),
            wcs: [WorkCompletion::default(); POLL_BATCH],
            dirty: Vec::new(),
            watch: Vec::new(),
            now_ms: 0,
            now_ns: 0,
        }
    }

    fn device_for(&mut self, ctx: Arc<V::Context>) -> Result<usize, String> {
        if let Some(i) = self.devices.iter().position(|d| d.same_device(&ctx)) {
            if self.devices[i].failed {
                return Err(
                    "the device's completion queue failed; its resources are being rebuilt".into(),
                );
            }
            return Ok(i);
        }
        self.devices.push(DeviceResources::new(ctx, &self.opts)?);
        Ok(self.devices.len() - 1)
    }

    /// Builds this reactor's resources for a device ahead of its first connection.
    pub fn prepare_device(&mut self, ctx: Arc<V::Context>) {
        if let Err(e) = self.device_for(ctx) {
            tracing::warn!(
                "cannot prepare RDMA device resources (the first connect will retry): {e}; run `nvmf-doctor` to diagnose"
            );
        }
    }

    /// Creates the QP for a new connection on this reactor and accepts it. On failure the
    /// dropped CM id rejects the connection.
    pub fn add_connection(
        &mut self,
        conn: NewConnection<V>,
        max_total: usize,
    ) -> Result<(), String> {
        let refuse = |e: String, conn: &NewConnection<V>| {
            super::reject::<_, V>(&conn.id, RdmaCmRejectStatus::NO_RESOURCES);
            e
        };
        // The target's `max_qpairs` bounds queue pairs before they Connect too: each costs a
        // QP, request slots and response buffers from the moment it is accepted.
        if conn.qpairs_now >= max_total {
            let e = format!(
                "the target already has {} RDMA queue pairs (max_qpairs {max_total})",
                conn.qpairs_now
            );
            return Err(refuse(e, &conn));
        }
        // First, so a full group wastes no QP on a connection it refuses. An index claimed
        // here and not filled (a later refusal) stays free for the next connection.
        let Some(qi) = claim_index(&mut self.qpairs, &mut self.gens) else {
            let e =
                format!("this reactor already has {MAX_QPAIRS} qpairs, the most it can tell apart");
            return Err(refuse(e, &conn));
        };
        let ctx = conn
            .id
            .context()
            .map_err(|e| refuse(e.to_string(), &conn))?;
        let dev_index = self.device_for(ctx).map_err(|e| refuse(e, &conn))?;
        let dev = &self.devices[dev_index];
        let depth = u32::from(conn.depth);
        let slots = slots_for(conn.depth);
        let caps = QpCaps {
            max_send_wr: (slots * 2 + 1).min(dev.max_qp_wr),
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            // Responses go inline (a CQE is 16 bytes): the device copies them at the post and
            // never reads them from memory, one DMA read (on soft-RoCE, one region lookup and
            // page mapping) less per response. A device without inline sends refuses the QP;
            // then the responses go from the qpair's registered response buffer.
            max_inline_data: CQE_LEN as u32,
        };
        // Every send WR may complete (flushes complete unsignaled ones too): reserve room for
        // all of them on the shared CQ, or refuse the connection rather than risk an overrun.
        if !self.devices[dev_index].reserve_cq(caps.max_send_wr) {
            let dev = &self.devices[dev_index];
            let e = format!(
                "the completion queue ({} entries, {} reserved, device maximum {}) has no room for another {} send work requests",
                dev.cq_capacity, dev.cq_reserved, dev.max_cqe, caps.max_send_wr
            );
            return Err(refuse(e, &conn));
        }
        let dev = &self.devices[dev_index];
        let built = conn
            .id
            .create_qp(&dev.pd, &dev.cq, &dev.cq, Some(&dev.srq), caps)
            .or_else(|_| {
                let caps = QpCaps {
                    max_inline_data: 0,
                    ..caps
                };
                conn.id
                    .create_qp(&dev.pd, &dev.cq, &dev.cq, Some(&dev.srq), caps)
            })
            .and_then(|qp| {
                // A registered response buffer only for a QP that cannot send responses
                // inline: no memory region per qpair otherwise.
                if qp.caps().max_inline_data as usize >= CQE_LEN {
                    return Ok((qp, None));
                }
                DmaBuf::<V>::new(&dev.pd, slots as usize * CQE_LEN, AccessFlags::LOCAL_WRITE)
                    .map(|responses| (qp, Some(responses)))
            });
        let (qp, responses) = match built {
            Ok(built) => built,
            Err(e) => {
                self.devices[dev_index].cq_reserved -= caps.max_send_wr;
                return Err(refuse(e.to_string(), &conn));
            }
        };
        let dev = &self.devices[dev_index];
        let gen = self.gens[qi];
        let requests = (0..slots)
            .map(|s| {
                let mut r =
                    RdmaRequest::new(Request::new(ReqTag::new(self.index, tag_slot(gen, qi, s))));
                r.slot = s;
                r
            })
            .collect();
        let accept = RdmaCmAccept::new(conn.depth);
        let params = ConnParams {
            responder_resources: conn.responder_resources.min(dev.max_rd_atom),
            initiator_depth: conn.initiator_depth.min(dev.max_init_rd_atom),
            rnr_retry_count: 7,
            ..ConnParams::with_private_data(accept.as_bytes())
        };
        let max_reads = u32::from(params.initiator_depth.max(1));
        if let Err(e) = conn.id.accept(&params) {
            self.devices[dev_index].cq_reserved -= caps.max_send_wr;
            return Err(e.to_string());
        }
        let dev = &self.devices[dev_index];
        // No more than the CQ has room for, whatever the provider rounded up to.
        let sq_capacity = qp.caps().max_send_wr.min(caps.max_send_wr);
        let cq_share = caps.max_send_wr;
        let send_with_invalidate = dev.send_with_invalidate;
        let token = conn.id.token();
        self.by_qp_num.insert(qp.qp_num(), qi);
        self.by_token.insert(token, qi);
        tracing::debug!(qid = conn.qid, depth, peer = %conn.peer, qp_num = qp.qp_num(), "RDMA qpair accepted");
        self.qpairs[qi] = Some(Qpair {
            gen,
            dev: dev_index,
            qp,
            cm_id: conn.id,
            token,
            state: QueueState::new(self.limits, Some(conn.qid), conn.peer, conn.listener),
            requests,
            responses,
            sq_capacity,
            cq_share,
            acct: SlotAccounts::new(slots),
            batch: Vec::with_capacity(slots as usize),
            reads: Vec::with_capacity(slots as usize),
            awaiting_read: VecDeque::with_capacity(slots as usize),
            unsignaled: VecDeque::with_capacity(slots as usize),
            sq_used: 0,
            reads_in_flight: 0,
            max_reads,
            signaled: 0,
            closing: None,
            drained: false,
            send_with_invalidate,
            broken: false,
            watched: true,
        });
        self.watch.push((qi, gen));
        // A qpair is on the list at most once: with room for every one, `watch` never
        // allocates on the I/O path.
        self.watch
            .reserve(self.qpairs.len().saturating_sub(self.watch.len()));
        self.load.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The device's CQ is broken (an overrun or a device error): every qpair on it is closed
    /// and the device's resources are rebuilt once the last one is gone.
    fn fail_device(&mut self, d: usize, why: &str, core: &mut CoreCtx) {
        if self.devices[d].failed {
            return;
        }
        tracing::error!(device = %self.devices[d].ctx.device_name(),
            "{why}; closing every qpair on the device and rebuilding its resources");
        self.devices[d].failed = true;
        for qi in 0..self.qpairs.len() {
            if self.qpairs[qi].as_ref().is_some_and(|q| q.dev == d) {
                self.start_close(qi, core);
            }
        }
    }

    /// An asynchronous event of a device, forwarded by the acceptor to every poll group: the
    /// one owning the QP or CQ it names acts on it.
    pub fn on_async_event(&mut self, ctx: &V::Context, ev: AsyncEvent, core: &mut CoreCtx) {
        let Some(d) = self.devices.iter().position(|dev| dev.same_device(ctx)) else {
            return;
        };
        match ev.kind {
            AsyncEventKind::QpFatal | AsyncEventKind::QpReqErr | AsyncEventKind::QpAccessErr => {
                let qi = ev.qp_num.and_then(|n| self.by_qp_num.get(&n).copied());
                if let Some(qi) = qi {
                    if let Some(qp) = self.qpairs[qi].as_ref() {
                        tracing::warn!(peer = %qp.state.peer, kind = ?ev.kind, "the device broke a queue pair; closing it");
                    }
                    self.start_close(qi, core);
                }
            }
            AsyncEventKind::CqErr if ev.cq_id == Some(self.devices[d].cq.id()) => {
                self.fail_device(d, "the device reported a completion queue error", core);
            }
            AsyncEventKind::DeviceFatal => {
                self.fail_device(d, "the device reported a fatal error", core);
            }
            AsyncEventKind::PortErr => {
                tracing::warn!(device = %self.devices[d].ctx.device_name(), "an RDMA port went down");
            }
            _ => {}
        }
    }

    /// A CM event for one of this group's connections, forwarded by the acceptor.
    pub fn on_cm_event(&mut self, token: CmIdToken, kind: CmEventKind, core: &mut CoreCtx) {
        let Some(&qi) = self.by_token.get(&token) else {
            return;
        };
        match kind {
            CmEventKind::Disconnected
            | CmEventKind::DeviceRemoval
            | CmEventKind::TimewaitExit
            | CmEventKind::ConnectError
            | CmEventKind::Unreachable
            | CmEventKind::Rejected => {
                self.start_close(qi, core);
            }
            _ => {}
        }
    }

    fn poll_device(&mut self, d: usize, core: &mut CoreCtx) -> usize {
        let mut total = 0;
        loop {
            self.devices[d].stats.polls += 1;
            let n = match self.devices[d].cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.fail_device(
                        d,
                        &format!("polling the completion queue failed: {e}"),
                        core,
                    );
                    return total;
                }
            };
            let stats = &mut self.devices[d].stats;
            stats.completions += n as u64;
            if n == 0 && total == 0 {
                stats.idle_polls += 1;
            }
            for i in 0..n {
                let wc = self.wcs[i];
                self.on_completion(d, &wc, core);
            }
            total += n;
            if n < POLL_BATCH {
                return total;
            }
        }
    }

    fn on_completion(&mut self, d: usize, wc: &WorkCompletion, core: &mut CoreCtx) {
        let (kind, gen, qi, slot) = parse_wr_id(wc.wr_id());
        if kind == WrKind::Recv {
            return self.on_recv(d, slot, wc, core);
        }
        let Some(qp) = self.qpairs.get_mut(qi).and_then(Option::as_mut) else {
            return;
        };
        if qp.gen != gen {
            return;
        }
        let ok = wc.status().is_success();
        if !ok && wc.status() != WcStatus::WR_FLUSH_ERR && qp.closing.is_none() {
            tracing::warn!(status = wc.status().as_str(), ?kind, peer = %qp.state.peer, "work request failed; closing qpair");
        }
        // A READ gives back its credit, a SEND its send queue room: requests of this qpair
        // waiting for them go after it.
        let freed = match kind {
            // Unsignaled: only errors complete, and the SEND behind reports them too.
            WrKind::Write | WrKind::Recv => false,
            WrKind::Send => {
                qp.signaled = qp.signaled.saturating_sub(1);
                if slot == DRAIN_SLOT {
                    qp.sq_used = qp.sq_used.saturating_sub(1);
                    qp.drained = true;
                } else if let Some(r) = qp.requests.get_mut(slot as usize) {
                    if r.state == State::Sending {
                        // This SEND ends its chain: the unsignaled ones before it are done.
                        let covers = std::mem::take(&mut r.covers);
                        let now = self.now_ns;
                        let (mut wrs, mut latency) = sent(r, &mut qp.acct, now);
                        for _ in 0..covers {
                            let Some(s) = qp.unsignaled.pop_front() else {
                                break;
                            };
                            let r = &mut qp.requests[s as usize];
                            if r.state == State::Sending {
                                let (w, l) = sent(r, &mut qp.acct, now);
                                wrs += w;
                                latency += l;
                            }
                        }
                        qp.sq_used = qp.sq_used.saturating_sub(wrs);
                        self.devices[d].stats.request_latency += latency;
                        let share = &self.devices[d].share;
                        qp.acct.unpark(share, qi, qp.gen, &mut self.need_buffer);
                    }
                }
                !qp.awaiting_read.is_empty()
            }
            WrKind::Read => {
                qp.signaled = qp.signaled.saturating_sub(1);
                qp.sq_used = qp.sq_used.saturating_sub(1);
                qp.reads_in_flight = qp.reads_in_flight.saturating_sub(1);
                let id = Waiter {
                    qpair: qi,
                    gen,
                    slot,
                };
                let waiting = !qp.awaiting_read.is_empty();
                driver::data_arrived(self, core, id, ok);
                waiting
            }
        };
        if !ok {
            self.start_close(qi, core);
        } else if freed {
            self.serve_reads(qi, core);
        }
    }

    fn on_recv(&mut self, d: usize, recv: u32, wc: &WorkCompletion, core: &mut CoreCtx) {
        let dev = &mut self.devices[d];
        dev.received();
        // The slot goes back on the SRQ at the end of this turn: with this capsule buffer if
        // the command leaves it (`return_capsule`), else with a fresh one.
        dev.repost(recv);
        let capsule = dev.take_capsule(recv);
        let qi = self.by_qp_num.get(&wc.qp_num()).copied();
        let usable = wc.status().is_success()
            && qi.is_some_and(|qi| {
                self.qpairs[qi]
                    .as_ref()
                    .is_some_and(|q| q.closing.is_none())
            });
        let Some(qi) = qi.filter(|_| usable) else {
            self.devices[d].return_capsule(recv, capsule);
            return;
        };
        let len = wc.byte_len() as usize;
        let qp = self.qpairs[qi].as_mut().expect("checked above");
        let free = if len >= 64 { qp.acct.free.pop() } else { None };
        let Some(si) = free else {
            // A capsule shorter than an SQE, or more commands than the queue depth the host
            // asked for: the host broke the protocol; drop the connection, not the target.
            tracing::warn!(peer = %qp.state.peer, len, "malformed capsule or queue overrun; closing qpair");
            self.devices[d].return_capsule(recv, capsule);
            return self.start_close(qi, core);
        };
        let dev = &mut self.devices[d];
        let cmd = dev.command(recv);
        dev.stats.requests += 1;
        let r = &mut qp.requests[si as usize];
        debug_assert_eq!(r.state, State::Free);
        r.received_ns = self.now_ns;
        r.req.reset(cmd);
        r.received_data = (len - 64) as u32;
        r.host = match cmd.dptr.classify() {
            SglKind::Keyed {
                addr,
                key,
                invalidate,
                ..
            } => HostData::Keyed {
                addr,
                key,
                invalidate,
            },
            SglKind::InCapsule { offset, len } => HostData::InCapsule {
                offset: offset as u32,
                len,
            },
            _ => HostData::None,
        };
        // In-capsule data stays in its capsule buffer until the request has a data buffer
        // (or executes from the capsule buffer itself); any other capsule goes back to its
        // receive slot now.
        if matches!(r.host, HostData::InCapsule { .. }) {
            r.capsule = capsule;
        } else {
            dev.return_capsule(recv, capsule);
        }
        let id = Waiter {
            qpair: qi,
            gen: qp.gen,
            slot: si,
        };
        driver::start(self, core, id);
        // Only a request still waiting for a data buffer needs its capsule's data. One that
        // was refused, needs no data, or has its data copied gives the capsule back to its
        // receive slot now, not when its response completes: a host that takes no responses
        // must not hold the device's capsule buffers (every host's receives) with commands
        // it sent in-capsule data for.
        if let Some(qp) = self.qpairs[qi].as_mut() {
            let r = &mut qp.requests[si as usize];
            if r.state != State::NeedBuffer {
                if let Some(capsule) = r.capsule.take() {
                    self.devices[d].return_capsule(recv, Some(capsule));
                }
            }
        }
    }

    /// Posts every qpair's queued RDMA READs and batched responses at the end of a turn:
    /// one chain (one doorbell) per qpair, the READs leading the responses, unless they
    /// are more than a chain holds.
    #[inline]
    fn flush_sends(&mut self) {
        // Checked here, inlined: most turns of a spinning reactor have nothing to flush, and
        // the call alone cost more than the check.
        if !self.dirty.is_empty() {
            self.flush_dirty();
        }
    }

    #[inline(never)]
    fn flush_dirty(&mut self) {
        for k in 0..self.dirty.len() {
            let qi = self.dirty[k];
            let Some(qp) = self.qpairs.get_mut(qi).and_then(Option::as_mut) else {
                continue;
            };
            let (mut doorbells, mut wrs) = (0, 0);
            if !qp.batch.is_empty() {
                // READs and responses together: the READs lead the responses' first chain
                // (one doorbell) when they leave it room for a response.
                if qp.reads.is_empty() {
                    (doorbells, wrs) = flush_batch::<V, false>(qi, qp, self.now_ms);
                } else if qp.reads.len() + 2 <= MAX_CHAIN {
                    (doorbells, wrs) = flush_batch::<V, true>(qi, qp, self.now_ms);
                } else {
                    (doorbells, wrs) = flush_reads(qi, qp);
                    let (d, w) = flush_batch::<V, false>(qi, qp, self.now_ms);
                    doorbells += d;
                    wrs += w;
                }
            } else if !qp.reads.is_empty() {
                (doorbells, wrs) = flush_reads(qi, qp);
            }
            if doorbells == 0 {
                continue;
            }
            let dev = qp.dev;
            watch(&mut self.watch, qi, qp);
            let stats = &mut self.devices[dev].stats;
            stats.send_doorbell_updates += u64::from(doorbells);
            stats.total_send_wrs += u64::from(wrs);
        }
        self.dirty.clear();
    }

    /// Starts tearing a qpair down: tells the peer, detaches it from its controller, frees
    /// what waits for nothing, and marks the send queue so its end is seen.
    pub(super) fn start_close(&mut self, qi: usize, core: &mut CoreCtx) {
        let Some(qp) = self.qpairs.get_mut(qi).and_then(Option::as_mut) else {
            return;
        };
        if qp.closing.is_some() {
            return;
        }
        qp.closing = Some(core.now_ms());
        watch(&mut self.watch, qi, qp);
        let _ = qp.cm_id.disconnect();
        core.queue_closed(&mut qp.state);
        drop_queued_reads(qp);
        // Not `Abandoned`: their buffers stay until the QP is destroyed (see `Qpair`).
        for r in &mut qp.requests {
            if matches!(
                r.state,
                State::NeedBuffer | State::NeedRead | State::NeedSend | State::Batched
            ) {
                release(&mut qp.acct, r);
            }
        }
        // Batched responses were released above; none is posted any more. Parked requests
        // were `NeedBuffer`: released too.
        qp.batch.clear();
        qp.awaiting_read.clear();
        qp.acct.parked.iter_mut().for_each(VecDeque::clear);
        let marker = SendWr::send(wr_id(WrKind::Send, qp.gen, qi, DRAIN_SLOT), &[]);
        if qp.qp.post_send(&[marker]).is_ok() {
            qp.sq_used += 1;
            qp.signaled += 1;
        } else {
            qp.drained = true;
        }
    }

    /// The housekeeping tick: closes qpairs that must go (a failed controller, no Connect
    /// in time, a failed post, a host that takes no transfer) and destroys closed ones whose
    /// work requests have all come back (or timed out) and whose requests the core has
    /// finished with. Looks only at the watch list, and at every qpair on the rare tick after
    /// some controller failed.
    fn reap(&mut self, core: &mut CoreCtx) {
        if core.controllers_failed() {
            for qi in 0..self.qpairs.len() {
                let Some(qp) = self.qpairs[qi].as_mut() else {
                    continue;
                };
                core.housekeeping.qpairs_checked += 1;
                if qp.closing.is_none() && core.should_disconnect(&mut qp.state) {
                    self.start_close(qi, core);
                }
            }
        }
        let mut k = 0;
        while k < self.watch.len() {
            let (qi, gen) = self.watch[k];
            if self.still_watched(qi, gen, core) {
                k += 1;
            } else {
                self.watch.swap_remove(k);
            }
        }
    }

    /// One watched qpair at a tick; false when it leaves the watch list (idle or destroyed).
    fn still_watched(&mut self, qi: usize, gen: u8, core: &mut CoreCtx) -> bool {
        let Some(qp) = self.qpairs[qi].as_mut().filter(|q| q.gen == gen) else {
            return false;
        };
        core.housekeeping.qpairs_checked += 1;
        if qp.closing.is_none() {
            if qp.broken || core.should_disconnect(&mut qp.state) {
                self.start_close(qi, core);
            } else if transfer_stuck(&qp.requests, core.now_ms(), core.transfer_timeout_ms) {
                tracing::warn!(peer = %qp.state.peer,
                    "host completed no transfer within the transfer timeout; closing qpair");
                self.start_close(qi, core);
            } else if qp.state.ctrl.is_some() && qp.signaled == 0 {
                qp.watched = false;
                return false;
            }
            return true;
        }
        let since = qp.closing.expect("checked above");
        let timed_out = core.now_ms().saturating_sub(since) > DRAIN_TIMEOUT_MS;
        let wire_done = (qp.drained && qp.signaled == 0) || timed_out;
        let executing = qp.requests.iter().any(|r| r.state == State::Executing);
        if !wire_done || executing {
            return true;
        }
        // Dropping the qpair destroys its QP first, then frees its requests' buffers
        // (`Abandoned` ones included): see the field order of `Qpair`.
        let qp = self.qpairs[qi].take().expect("checked above");
        let dev = &mut self.devices[qp.dev];
        dev.cq_reserved -= qp.cq_share;
        self.by_qp_num.remove(&qp.qp.qp_num());
        self.by_token.remove(&qp.token);
        self.gens[qi] = self.gens[qi].wrapping_add(1);
        self.load.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(peer = %qp.state.peer, "RDMA qpair destroyed");
        let d = qp.dev;
        drop(qp);
        self.rebuild_if_failed(d);
        false
    }

    /// Replaces a failed device's CQ, SRQ, receive buffers and pools once no qpair uses them.
    fn rebuild_if_failed(&mut self, d: usize) {
        if !self.devices[d].failed || self.qpairs.iter().flatten().any(|q| q.dev == d) {
            return;
        }
        let ctx = Arc::clone(&self.devices[d].ctx);
        match DeviceResources::new(ctx, &self.opts) {
            Ok(fresh) => {
                tracing::info!("RDMA device resources rebuilt after a completion queue failure");
                self.devices[d] = fresh;
            }
            Err(e) => tracing::error!("rebuilding RDMA device resources failed: {e}"),
        }
    }
}

/// A `Sending` request whose SEND is known complete: released. Returns the send queue slots
/// its work requests held and its latency (capsule to now, ns).
#[inline]
fn sent(r: &mut RdmaRequest, acct: &mut SlotAccounts, now_ns: u64) -> (u32, u64) {
    let wrs = wrs_of(r);
    let latency = now_ns.saturating_sub(r.received_ns);
    release(acct, r);
    (wrs, latency)
}

/// Puts a qpair on the watch list unless it is on it already (one flag test per post).
pub(super) fn watch<V: Verbs>(list: &mut Vec<(usize, u8)>, qi: usize, qp: &mut Qpair<V>) {
    if !qp.watched {
        qp.watched = true;
        list.push((qi, qp.gen));
    }
}

/// What a poll group holds right now, for checks that nothing leaks once it is idle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollGroupResources {
    pub qpairs: usize,
    /// Request slots not free, over all qpairs.
    pub requests_in_use: usize,
    /// Data buffers out of their pools, over all devices.
    pub buffers_out: usize,
    /// SRQ receive slots held by requests, over all devices.
    pub recv_slots_held: u32,
    /// Consumed receive slots waiting to be posted again with a batch, over all devices.
    pub recv_slots_waiting: usize,
    /// Entries in the poll group's wait queues (stale ones included until they are dropped)
    /// and requests waiting on their qpair for a read credit.
    pub waiting: usize,
    /// Requests parked on their qpair, which holds its whole share of their buffer class.
    pub parked: usize,
}

impl<V: Verbs> RdmaPollGroup<V> {
    pub fn resources(&self) -> PollGroupResources {
        let live = self.qpairs.iter().flatten();
        let live_parked = live.clone().map(|q| q.acct.parked()).sum();
        PollGroupResources {
            qpairs: live.clone().count(),
            requests_in_use: live
                .flat_map(|q| &q.requests)
                .filter(|r| r.state != State::Free)
                .count(),
            buffers_out: self
                .devices
                .iter()
                .map(|d| {
                    let (s, l) = (&d.pools.small, &d.pools.large);
                    (s.count() as usize - s.available())
                        + (l.count() as usize - l.available())
                        + d.capsules_held()
                })
                .sum(),
            recv_slots_held: self.devices.iter().map(|d| d.recv_slots_held()).sum(),
            recv_slots_waiting: self.devices.iter().map(|d| d.reposts_waiting()).sum(),
            parked: live_parked,
            waiting: self.need_buffer[0].len()
                + self.need_buffer[1].len()
                + self.need_send.len()
                + self
                    .qpairs
                    .iter()
                    .flatten()
                    .map(|q| q.awaiting_read.len())
                    .sum::<usize>(),
        }
    }
}

impl<V: Verbs> TransportPollGroup for RdmaPollGroup<V> {
    fn poll(&mut self, core: &mut CoreCtx) -> usize {
        self.now_ms = core.now_ms();
        self.now_ns = core.now_ns();
        let mut work = 0;
        for d in 0..self.devices.len() {
            work += self.poll_device(d, core);
        }
        // Each serve loop only when its queue has waiters: an idle turn stays a CQ poll.
        if !self.need_buffer.iter().all(WaitQueue::is_empty) {
            work += self.serve_buffers(core);
        }
        if !self.need_send.is_empty() {
            work += self.serve_sends(core);
        }
        let tick = core.is_tick();
        if tick {
            self.reap(core);
        }
        for dev in &mut self.devices {
            let posted = if tick {
                dev.flush_all_reposts()
            } else {
                dev.flush_reposts()
            };
            if let Err(e) = posted {
                tracing::error!("reposting receive buffers failed: {e}");
            }
        }
        work
    }

    fn resume(&mut self, tag: ReqTag, wakeup: Wakeup, core: &mut CoreCtx) {
        let (gen, qpair, slot) = parse_tag_slot(tag.slot());
        driver::resume(self, core, Waiter { qpair, gen, slot }, wakeup);
    }

    /// Posts what the turn queued: READs of host data and responses, including those the
    /// bdevs' completions made after this group's poll.
    #[inline]
    fn flush(&mut self) {
        self.flush_sends();
    }

    fn qpair_count(&self) -> usize {
        self.qpairs.iter().flatten().count()
    }

    fn shutdown(&mut self, core: &mut CoreCtx) {
        for qi in 0..self.qpairs.len() {
            self.start_close(qi, core);
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    /// Arms each device's CQ (registering its completion channel on first use). Watched
    /// qpairs and failed devices need the housekeeping tick, so they bound the sleep to it;
    /// new connections, CM and async events come as poll group messages, which wake the
    /// reactor themselves.
    fn prepare_sleep(&mut self, _core: &CoreCtx, wait: &WaitSet<'_>) -> Option<Duration> {
        let mut bound = Duration::MAX;
        for dev in &mut self.devices {
            if dev.failed {
                bound = bound.min(Duration::from_millis(TICK_MS));
                continue;
            }
            let fd = dev.cq.wake_fd()?;
            if !dev.wake_registered {
                if let Err(e) = wait.watch(fd) {
                    tracing::warn!("cannot sleep on a completion channel, polling instead: {e}");
                    return None;
                }
                dev.wake_registered = true;
            }
            // Idle: the SRQ gets back every slot held for a batch.
            if let Err(e) = dev.flush_all_reposts() {
                tracing::error!("reposting receive buffers failed: {e}");
            }
            if let Err(e) = dev.cq.arm() {
                tracing::warn!("cannot arm a completion queue, polling instead: {e}");
                return None;
            }
        }
        if !self.watch.is_empty() {
            bound = bound.min(Duration::from_millis(TICK_MS));
        }
        Some(bound)
    }

    fn woken(&mut self) {
        for dev in &self.devices {
            if let Err(e) = dev.cq.take_events() {
                tracing::warn!("reading completion events failed: {e}");
            }
        }
    }

    /// SPDK's RDMA layout (`nvmf_rdma_poll_group_dump_stat`): pending_data_buffer, then per
    /// device polls, idle_polls, completions, requests, request_latency (ns; thread stats
    /// report tick_rate 1e9), the wait queues, and the doorbell counters.
    fn dump_stats(&self) -> serde_json::Map<String, serde_json::Value> {
        let devices: Vec<serde_json::Value> = self
            .devices
            .iter()
            .enumerate()
            .map(|(d, dev)| {
                let st = dev.stats;
                let waiting = |q: &WaitQueue| {
                    q.count_where(|w| {
                        self.qpairs
                            .get(w.qpair)
                            .and_then(Option::as_ref)
                            .is_some_and(|qp| qp.dev == d)
                    })
                };
                serde_json::json!({
                    "name": dev.ctx.device_name(),
                    "polls": st.polls,
                    "idle_polls": st.idle_polls,
                    "completions": st.completions,
                    "requests": st.requests,
                    "request_latency": st.request_latency,
                    "pending_free_request": 0,
                    "pending_rdma_read": self
                        .qpairs
                        .iter()
                        .flatten()
                        .filter(|qp| qp.dev == d)
                        .map(|qp| qp.awaiting_read.len())
                        .sum::<usize>(),
                    "pending_rdma_write": 0,
                    "pending_rdma_send": waiting(&self.need_send),
                    "total_send_wrs": st.total_send_wrs,
                    "send_doorbell_updates": st.send_doorbell_updates,
                    "total_recv_wrs": st.total_recv_wrs,
                    "recv_doorbell_updates": st.recv_doorbell_updates,
                })
            })
            .collect();
        let mut out = serde_json::Map::new();
        out.insert(
            "pending_data_buffer".into(),
            ((self.need_buffer[0].len() + self.need_buffer[1].len()) as u64
                + self
                    .qpairs
                    .iter()
                    .flatten()
                    .map(|q| q.acct.parked() as u64)
                    .sum::<u64>())
            .into(),
        );
        out.insert("devices".into(), devices.into());
        out
    }
}

//! An in-process transport, the counterpart of Linux's `nvme-loop`: the core runs with no
//! fabric, so tests and benchmarks exercise exactly the code a network host reaches.
//!
//! A host queue ([`LoopbackHostQueue`]) and the target's qpair share a [`Wire`]: two lock-free
//! queues of capsules and responses. The capsule's `host_buffer` plays the host memory a keyed
//! SGL points at: the target "RDMA READs" write data from it and "RDMA WRITEs" read data into
//! it, and an in-capsule SGL takes its bytes from it as if they trailed the SQE.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam::queue::SegQueue;
use nvmf_common::buffer::{BufClass, BufferPool, SizedPools, SMALL_BUFSIZE};
use nvmf_common::spec::sgl::SglKind;
use nvmf_common::spec::{Command, Completion, Status};

use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Prepared, ReqTag, Request, Wakeup};
use crate::core::subsystem::ListenAddress;
use crate::core::CoreCtx;
use crate::transport::{Transport, TransportError, TransportLimits, TransportPollGroup};

/// The in-process transport's fixed limits: RDMA's, with keep-alive at 100 ms granularity and a
/// 100 ms minimum KATO so keep-alive expiry tests take milliseconds. (`nvmf_create_transport
/// LOOPBACK` takes SPDK's `kas`/`min_kato` defaults, as every type does.)
pub const LOOPBACK_LIMITS: TransportLimits = TransportLimits {
    trtype: 254,
    kas: 1,
    min_kato_ms: 100,
    ..TransportLimits::DEFAULT_RDMA
};

/// A command capsule as the host sends it.
#[derive(Debug, Clone, Default)]
pub struct Capsule {
    pub cmd: Command,
    /// Host memory behind the data SGL (or in-capsule data).
    pub host_buffer: Vec<u8>,
}

/// A response capsule, with the host buffer handed back (holding read data).
#[derive(Debug, Clone)]
pub struct Response {
    pub cqe: Completion,
    pub host_buffer: Vec<u8>,
}

#[derive(Default)]
struct Wire {
    to_target: SegQueue<Capsule>,
    to_host: SegQueue<Response>,
    host_closed: AtomicBool,
    target_closed: AtomicBool,
    /// The host stopped taking responses (models an RDMA host that posts no receives).
    host_stalled: AtomicBool,
}

/// The host end of one loopback queue pair.
pub struct LoopbackHostQueue {
    wire: Arc<Wire>,
}

impl LoopbackHostQueue {
    pub fn submit(&self, capsule: Capsule) {
        self.wire.to_target.push(capsule);
    }

    pub fn poll(&self) -> Option<Response> {
        self.wire.to_host.pop()
    }

    /// Stops (or resumes) taking responses: the target holds them, with their buffers, as an
    /// RDMA target holds SENDs a host does not post receives for.
    pub fn set_receiving(&self, receiving: bool) {
        self.wire.host_stalled.store(!receiving, Ordering::Release);
    }

    /// The target tore the queue down (controller failed, shutdown).
    pub fn is_disconnected(&self) -> bool {
        self.wire.target_closed.load(Ordering::Acquire)
    }
}

impl Drop for LoopbackHostQueue {
    fn drop(&mut self) {
        self.wire.host_closed.store(true, Ordering::Release);
    }
}

/// How a loopback poll group sizes its data buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackPools {
    /// Buffers of [`SMALL_BUFSIZE`] (transfers up to that size).
    pub small: u32,
    /// Buffers of the largest transfer.
    pub large: u32,
    /// Buffers one qpair may hold at once (both classes); its requests beyond that wait in
    /// the qpair's own queue, so one host cannot hold the pools.
    pub per_qpair: u32,
}

impl LoopbackPools {
    /// Twice the queue depth of each class; a qpair may hold half of the large pool (one full
    /// queue), so two busy qpairs of a group always make progress.
    pub fn for_limits(limits: &TransportLimits) -> Self {
        let depth = u32::from(limits.max_queue_depth);
        Self {
            small: depth * 2,
            large: depth * 2,
            per_qpair: depth,
        }
    }
}

/// The transport: hands out host queues, and poll groups that serve them.
#[derive(Clone)]
pub struct LoopbackTransport {
    inbox: Arc<SegQueue<(Arc<Wire>, Option<ListenAddress>)>>,
    limits: TransportLimits,
    sizes: LoopbackPools,
    /// Each poll group's data pool (clones share it), for [`LoopbackTransport::pools`].
    pools: Arc<Mutex<Vec<BufferPool>>>,
}

impl LoopbackTransport {
    pub fn new(limits: TransportLimits) -> Self {
        Self::with_pools(limits, LoopbackPools::for_limits(&limits))
    }

    pub fn with_pools(limits: TransportLimits, sizes: LoopbackPools) -> Self {
        Self {
            inbox: Arc::new(SegQueue::new()),
            limits,
            sizes,
            pools: Arc::default(),
        }
    }

    /// The data pools (small and large) of the poll groups made so far: tests check that an
    /// idle target has every buffer back, and prime buffers with a pattern that must never
    /// reach a host.
    pub fn pools(&self) -> Vec<BufferPool> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Opens a new queue pair through no particular listener; the next poll of a poll
    /// group adopts it.
    pub fn connect(&self) -> LoopbackHostQueue {
        self.open(None)
    }

    /// Opens a new queue pair as if it came through the listener at `addr`.
    pub fn connect_via(&self, addr: ListenAddress) -> LoopbackHostQueue {
        self.open(Some(addr))
    }

    fn open(&self, listener: Option<ListenAddress>) -> LoopbackHostQueue {
        let wire = Arc::new(Wire::default());
        self.inbox.push((Arc::clone(&wire), listener));
        LoopbackHostQueue { wire }
    }

    /// A poll group serving this transport's queue pairs; panics if its buffer pools cannot
    /// be made (tests: see [`try_poll_group`](Self::try_poll_group)).
    pub fn poll_group(&self, index: u8) -> Box<dyn TransportPollGroup> {
        self.try_poll_group(index)
            .unwrap_or_else(|e| panic!("loopback poll group: {e}"))
    }

    /// A poll group serving this transport's queue pairs, or why its buffer pools could not be
    /// made.
    pub fn try_poll_group(&self, index: u8) -> Result<Box<dyn TransportPollGroup>, TransportError> {
        let large_size = (self.limits.max_transfer() as usize).max(4096);
        let pools = SizedPools::new(
            SMALL_BUFSIZE,
            self.sizes.small,
            large_size,
            self.sizes.large,
        )
        .map_err(|e| TransportError::Resources {
            what: "cannot make the loopback buffer pools",
            source: e.into(),
        })?;
        let mut all = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        all.push(pools.small.clone());
        all.push(pools.large.clone());
        Ok(Box::new(LoopbackPollGroup {
            index,
            inbox: Arc::clone(&self.inbox),
            limits: self.limits,
            pools,
            per_qpair: self.sizes.per_qpair.max(1) as usize,
            qpairs: Vec::new(),
            waiting_for_buffer: [VecDeque::new(), VecDeque::new()],
        }))
    }
}

struct Slot {
    req: Request,
    host_buffer: Vec<u8>,
    busy: bool,
    /// Counts toward its qpair's `held` (it has, or waits in the shared FIFO for, a buffer).
    claimed: bool,
}

struct Qpair {
    wire: Arc<Wire>,
    state: QueueState,
    slots: Vec<Slot>,
    closing: bool,
    /// Slots that have a buffer or wait for one in the group's FIFO (at most `per_qpair`).
    held: usize,
    /// Slots that need a buffer while the qpair holds its share: they wait here, in the
    /// qpair's own queue, not in the group's FIFO.
    over_cap: VecDeque<usize>,
    /// Responses the host has not taken (it stopped receiving), with when each was ready.
    unsent: VecDeque<(usize, u64)>,
}

impl Qpair {
    fn outstanding(&self) -> usize {
        self.slots.iter().filter(|s| s.busy).count()
    }
}

struct LoopbackPollGroup {
    index: u8,
    inbox: Arc<SegQueue<(Arc<Wire>, Option<ListenAddress>)>>,
    limits: TransportLimits,
    pools: SizedPools,
    per_qpair: usize,
    qpairs: Vec<Option<Qpair>>,
    /// Requests that asked for a data buffer when none of their class was free, oldest first;
    /// one FIFO per class ([`BufClass`] order), so a waiting large transfer never holds up
    /// small ones.
    waiting_for_buffer: [VecDeque<(usize, usize)>; 2],
}

fn class_index(class: BufClass) -> usize {
    match class {
        BufClass::Small => 0,
        BufClass::Large => 1,
    }
}

fn slot_tag(group: u8, qp: usize, slot: usize) -> ReqTag {
    ReqTag::new(group, ((qp as u64) << 24) | slot as u64)
}

impl LoopbackPollGroup {
    fn adopt(&mut self) -> usize {
        let mut n = 0;
        while let Some((wire, listener)) = self.inbox.pop() {
            let qp = Qpair {
                wire,
                state: QueueState::new(self.limits, None, "loopback".into(), listener),
                slots: Vec::new(),
                closing: false,
                held: 0,
                over_cap: VecDeque::new(),
                unsent: VecDeque::new(),
            };
            match self.qpairs.iter().position(Option::is_none) {
                Some(i) => self.qpairs[i] = Some(qp),
                None => self.qpairs.push(Some(qp)),
            }
            n += 1;
        }
        n
    }

    fn receive(&mut self, core: &mut CoreCtx, qi: usize) -> usize {
        let mut n = 0;
        loop {
            let Some(qp) = self.qpairs[qi].as_mut() else {
                return n;
            };
            if qp.closing {
                return n;
            }
            let Some(capsule) = qp.wire.to_target.pop() else {
                return n;
            };
            n += 1;
            let si = match qp.slots.iter().position(|s| !s.busy) {
                Some(i) => i,
                None => {
                    let tag = slot_tag(self.index, qi, qp.slots.len());
                    qp.slots.push(Slot {
                        req: Request::new(tag),
                        host_buffer: Vec::new(),
                        busy: false,
                        claimed: false,
                    });
                    qp.slots.len() - 1
                }
            };
            let slot = &mut qp.slots[si];
            slot.busy = true;
            slot.req.reset(capsule.cmd);
            slot.host_buffer = capsule.host_buffer;
            match core.prepare(&mut qp.state, &mut slot.req) {
                Prepared::Complete => self.respond(qi, si, core.now_ms()),
                Prepared::NoData => self.execute(core, qi, si),
                Prepared::Data { .. } => self.claim_buffer(core, qi, si),
            }
        }
    }

    /// A request needs a data buffer: within its qpair's share it goes for one, beyond it
    /// waits in the qpair's own queue until one of the qpair's buffers comes back.
    fn claim_buffer(&mut self, core: &mut CoreCtx, qi: usize, si: usize) {
        let qp = self.qpairs[qi].as_mut().expect("live qpair");
        if qp.held >= self.per_qpair {
            qp.over_cap.push_back(si);
            return;
        }
        qp.held += 1;
        qp.slots[si].claimed = true;
        self.attach_buffer(core, qi, si);
    }

    /// Gets a data buffer of the request's class and pulls host data in, or queues the
    /// request in the group's FIFO for that class until a buffer frees.
    fn attach_buffer(&mut self, core: &mut CoreCtx, qi: usize, si: usize) {
        let qp = self.qpairs[qi].as_mut().expect("live qpair");
        let len = qp.slots[si].req.len as usize;
        let class = self.pools.class_of(len);
        let Some(mut buf) = self.pools.get(class) else {
            self.waiting_for_buffer[class_index(class)].push_back((qi, si));
            return;
        };
        let slot = &mut qp.slots[si];
        buf.set_len(len);
        if slot.req.dir == DataDirection::HostToController {
            let src_offset = match slot.req.cmd.dptr.classify() {
                SglKind::InCapsule { offset, .. } => offset as usize,
                _ => 0,
            };
            let Some(src) = slot.host_buffer.get(src_offset..src_offset + len) else {
                // The host memory the SGL describes is not there: a transport-level failure.
                slot.req.complete(Status::DATA_TRANSFER_ERROR.with_dnr());
                return self.respond(qi, si, core.now_ms());
            };
            buf.copy_from_slice(src);
        }
        slot.req.data = Some(buf);
        self.execute(core, qi, si);
    }

    fn execute(&mut self, core: &mut CoreCtx, qi: usize, si: usize) {
        let qp = self.qpairs[qi].as_mut().expect("live qpair");
        let slot = &mut qp.slots[si];
        if core.execute(&mut qp.state, &mut slot.req) == Exec::Complete {
            self.respond(qi, si, core.now_ms());
        }
    }

    /// The response is ready: delivered now, or held (with its buffer) while the host does
    /// not receive.
    fn respond(&mut self, qi: usize, si: usize, now_ms: u64) {
        let qp = self.qpairs[qi].as_mut().expect("live qpair");
        if !qp.closing && (!qp.unsent.is_empty() || qp.wire.host_stalled.load(Ordering::Acquire)) {
            qp.unsent.push_back((si, now_ms));
            return;
        }
        self.deliver(qi, si);
    }

    fn deliver(&mut self, qi: usize, si: usize) {
        let qp = self.qpairs[qi].as_mut().expect("live qpair");
        let slot = &mut qp.slots[si];
        slot.busy = false;
        if std::mem::take(&mut slot.claimed) {
            qp.held -= 1;
        }
        let mut host_buffer = std::mem::take(&mut slot.host_buffer);
        let req = &mut slot.req;
        if req.dir == DataDirection::ControllerToHost && req.status().is_success() {
            let data = req.data();
            if host_buffer.len() < data.len() {
                host_buffer.resize(data.len(), 0);
            }
            host_buffer[..data.len()].copy_from_slice(data);
        }
        req.data = None;
        if !qp.closing {
            qp.wire.to_host.push(Response {
                cqe: req.rsp,
                host_buffer,
            });
        }
    }

    fn retry_waiting(&mut self, core: &mut CoreCtx) -> usize {
        let mut n = 0;
        // Responses held for a host that receives again go out first: they free buffers.
        for qi in 0..self.qpairs.len() {
            while let Some(qp) = self.qpairs[qi].as_mut() {
                if qp.wire.host_stalled.load(Ordering::Acquire) {
                    break;
                }
                let Some((si, _)) = qp.unsent.pop_front() else {
                    break;
                };
                self.deliver(qi, si);
                n += 1;
            }
        }
        // Qpairs below their share take requests from their own queue.
        for qi in 0..self.qpairs.len() {
            while let Some(qp) = self.qpairs[qi].as_mut() {
                if qp.closing || qp.held >= self.per_qpair {
                    break;
                }
                let Some(si) = qp.over_cap.pop_front() else {
                    break;
                };
                self.claim_buffer(core, qi, si);
                n += 1;
            }
        }
        for class in [BufClass::Small, BufClass::Large] {
            let fifo = class_index(class);
            while self.pools.pool(class).available() > 0 {
                let Some((qi, si)) = self.waiting_for_buffer[fifo].pop_front() else {
                    break;
                };
                if self.qpairs[qi].as_ref().is_some_and(|qp| qp.slots[si].busy) {
                    self.attach_buffer(core, qi, si);
                    n += 1;
                }
            }
        }
        n
    }

    fn reap_closed(&mut self, core: &mut CoreCtx) {
        for qi in 0..self.qpairs.len() {
            let Some(qp) = self.qpairs[qi].as_mut() else {
                continue;
            };
            let host_gone = qp.wire.host_closed.load(Ordering::Acquire);
            // A response the host has not taken within the transfer timeout: the host stopped
            // receiving; the queue goes, and with it the buffers its requests hold.
            let stuck = qp.unsent.front().is_some_and(|&(_, since)| {
                core.now_ms().saturating_sub(since) >= core.transfer_timeout_ms
            });
            if stuck && !qp.closing {
                tracing::warn!(peer = %qp.state.peer, held = qp.unsent.len(),
                    "host took no response within the transfer timeout; closing the queue");
            }
            if !qp.closing && (host_gone || stuck || core.should_disconnect(&mut qp.state)) {
                qp.closing = true;
                qp.wire.target_closed.store(true, Ordering::Release);
                core.queue_closed(&mut qp.state);
                // Requests still waiting for a buffer never started, and responses nobody
                // will take: free them now. Those waiting on a bdev or an event keep their
                // slot until the wakeup comes.
                for fifo in &mut self.waiting_for_buffer {
                    for &(_, si) in fifo.iter().filter(|&&(q, _)| q == qi) {
                        qp.slots[si].busy = false;
                    }
                    fifo.retain(|&(q, _)| q != qi);
                }
                let unsent = qp.unsent.drain(..).map(|(si, _)| si);
                for si in qp.over_cap.drain(..).chain(unsent) {
                    let slot = &mut qp.slots[si];
                    slot.busy = false;
                    slot.req.data = None;
                    slot.host_buffer = Vec::new();
                }
                for slot in qp.slots.iter_mut().filter(|s| !s.busy) {
                    slot.claimed = false;
                }
                qp.held = qp.slots.iter().filter(|s| s.claimed).count();
            }
            if qp.closing && qp.outstanding() == 0 {
                self.qpairs[qi] = None;
            }
        }
    }

    fn close_all(&mut self, core: &mut CoreCtx) {
        for qp in self.qpairs.iter_mut().flatten() {
            if !qp.closing {
                qp.closing = true;
                qp.wire.target_closed.store(true, Ordering::Release);
                core.queue_closed(&mut qp.state);
            }
        }
    }
}

impl TransportPollGroup for LoopbackPollGroup {
    fn poll(&mut self, core: &mut CoreCtx) -> usize {
        let mut work = self.adopt();
        for qi in 0..self.qpairs.len() {
            work += self.receive(core, qi);
        }
        work += self.retry_waiting(core);
        self.reap_closed(core);
        work
    }

    fn resume(&mut self, tag: ReqTag, wakeup: Wakeup, core: &mut CoreCtx) {
        let qi = (tag.slot() >> 24) as usize;
        let si = (tag.slot() & 0xFF_FFFF) as usize;
        let Some(Some(qp)) = self.qpairs.get_mut(qi) else {
            return;
        };
        let Some(slot) = qp.slots.get_mut(si) else {
            return;
        };
        if !slot.busy {
            return;
        }
        if core.resume(&mut qp.state, &mut slot.req, wakeup) == Exec::Complete {
            self.respond(qi, si, core.now_ms());
        }
    }

    fn qpair_count(&self) -> usize {
        self.qpairs.iter().flatten().count()
    }

    fn shutdown(&mut self, core: &mut CoreCtx) {
        self.close_all(core);
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Transport for LoopbackTransport {
    fn trtype(&self) -> &'static str {
        "LOOPBACK"
    }

    fn limits(&self) -> TransportLimits {
        self.limits
    }

    fn listen(&self, _addr: &ListenAddress) -> Result<(), TransportError> {
        Ok(())
    }

    fn stop_listen(&self, _addr: &ListenAddress) {}

    fn create_poll_group(
        &self,
        index: u8,
        _group: &crate::core::PollGroupHandle,
    ) -> Result<Box<dyn TransportPollGroup>, TransportError> {
        self.try_poll_group(index)
    }

    fn options(&self) -> serde_json::Value {
        serde_json::json!({
            "trtype": "LOOPBACK",
            "max_queue_depth": self.limits.max_queue_depth,
            "max_io_qpairs_per_ctrlr": self.limits.max_qpairs_per_ctrl - 1,
            "in_capsule_data_size": self.limits.in_capsule_data_size,
            "max_io_size": self.limits.max_io_size,
        })
    }
}

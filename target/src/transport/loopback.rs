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
use nvmf_common::buffer::BufferPool;
use nvmf_common::spec::sgl::SglKind;
use nvmf_common::spec::{Command, Completion, Status};

use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Prepared, ReqTag, Request, Wakeup};
use crate::core::subsystem::ListenAddress;
use crate::core::CoreCtx;
use crate::transport::{TransportLimits, TransportPollGroup};

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

/// The transport: hands out host queues, and poll groups that serve them.
#[derive(Clone)]
pub struct LoopbackTransport {
    inbox: Arc<SegQueue<(Arc<Wire>, Option<ListenAddress>)>>,
    limits: TransportLimits,
    /// Each poll group's data pool (clones share it), for [`LoopbackTransport::pools`].
    pools: Arc<Mutex<Vec<BufferPool>>>,
}

impl LoopbackTransport {
    pub fn new(limits: TransportLimits) -> Self {
        Self {
            inbox: Arc::new(SegQueue::new()),
            limits,
            pools: Arc::default(),
        }
    }

    /// The data pools of the poll groups made so far: tests check that an idle target has
    /// every buffer back, and prime buffers with a pattern that must never reach a host.
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

    pub fn poll_group(&self, index: u8) -> Box<dyn TransportPollGroup> {
        let buf_size = (self.limits.max_transfer() as usize).max(4096);
        let count = u32::from(self.limits.max_queue_depth) * 2;
        let pool = BufferPool::new(buf_size, count).expect("loopback buffer pool");
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.push(pool.clone());
        Box::new(LoopbackPollGroup {
            index,
            inbox: Arc::clone(&self.inbox),
            limits: self.limits,
            pool,
            qpairs: Vec::new(),
            waiting_for_buffer: VecDeque::new(),
        })
    }
}

struct Slot {
    req: Request,
    host_buffer: Vec<u8>,
    busy: bool,
}

struct Qpair {
    wire: Arc<Wire>,
    state: QueueState,
    slots: Vec<Slot>,
    closing: bool,
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
    pool: BufferPool,
    qpairs: Vec<Option<Qpair>>,
    /// Requests that asked for a data buffer when none was free, oldest first.
    waiting_for_buffer: VecDeque<(usize, usize)>,
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
                    });
                    qp.slots.len() - 1
                }
            };
            let slot = &mut qp.slots[si];
            slot.busy = true;
            slot.req.reset(capsule.cmd);
            slot.host_buffer = capsule.host_buffer;
            match core.prepare(&mut qp.state, &mut slot.req) {
                Prepared::Complete => self.respond(qi, si),
                Prepared::NoData => self.execute(core, qi, si),
                Prepared::Data { .. } => self.attach_buffer(core, qi, si),
            }
        }
    }

    /// Gets a data buffer and pulls host data in, or queues the request until a buffer frees.
    fn attach_buffer(&mut self, core: &mut CoreCtx, qi: usize, si: usize) {
        let Some(mut buf) = self.pool.get() else {
            self.waiting_for_buffer.push_back((qi, si));
            return;
        };
        let qp = self.qpairs[qi].as_mut().expect("live qpair");
        let slot = &mut qp.slots[si];
        let len = slot.req.len as usize;
        buf.set_len(len);
        if slot.req.dir == DataDirection::HostToController {
            let src_offset = match slot.req.cmd.dptr.classify() {
                SglKind::InCapsule { offset, .. } => offset as usize,
                _ => 0,
            };
            let Some(src) = slot.host_buffer.get(src_offset..src_offset + len) else {
                // The host memory the SGL describes is not there: a transport-level failure.
                slot.req.complete(Status::DATA_TRANSFER_ERROR.with_dnr());
                return self.respond(qi, si);
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
            self.respond(qi, si);
        }
    }

    fn respond(&mut self, qi: usize, si: usize) {
        let qp = self.qpairs[qi].as_mut().expect("live qpair");
        let slot = &mut qp.slots[si];
        slot.busy = false;
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
        while self.pool.available() > 0 {
            let Some((qi, si)) = self.waiting_for_buffer.pop_front() else {
                break;
            };
            if self.qpairs[qi].as_ref().is_some_and(|qp| qp.slots[si].busy) {
                self.attach_buffer(core, qi, si);
                n += 1;
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
            if !qp.closing && (host_gone || core.should_disconnect(&mut qp.state)) {
                qp.closing = true;
                qp.wire.target_closed.store(true, Ordering::Release);
                core.queue_closed(&mut qp.state);
                // Requests still waiting for a buffer never started: free them now. Those
                // waiting on a bdev or an event keep their slot until the wakeup comes.
                for &(_, si) in self.waiting_for_buffer.iter().filter(|&&(q, _)| q == qi) {
                    qp.slots[si].busy = false;
                }
                self.waiting_for_buffer.retain(|&(q, _)| q != qi);
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
            self.respond(qi, si);
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

impl crate::transport::Transport for LoopbackTransport {
    fn trtype(&self) -> &'static str {
        "LOOPBACK"
    }

    fn limits(&self) -> TransportLimits {
        self.limits
    }

    fn listen(&self, _addr: &crate::core::subsystem::ListenAddress) -> Result<(), String> {
        Ok(())
    }

    fn stop_listen(&self, _addr: &crate::core::subsystem::ListenAddress) {}

    fn create_poll_group(
        &self,
        index: u8,
        _group: &crate::core::PollGroupHandle,
    ) -> Result<Box<dyn TransportPollGroup>, String> {
        Ok(self.poll_group(index))
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

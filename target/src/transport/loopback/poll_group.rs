//! One poll group of the in-process transport: its queue pairs, their request slots, and the
//! loopback's part of the request driver (`core::driver`): a data buffer within the qpair's
//! share, host data copied from the capsule's host buffer, a response delivered to the wire
//! or held while the host does not receive.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam::queue::SegQueue;
use nvmf_common::buffer::{BufClass, SizedPools};
use nvmf_common::spec::sgl::SglKind;
use nvmf_common::spec::Status;

use super::{Response, Wire};
use crate::core::driver::{self, Attempt, BufferStep, FetchStep, ReqState, RequestTransport};
use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, ReqTag, Request, Wakeup};
use crate::core::subsystem::ListenAddress;
use crate::core::CoreCtx;
use crate::transport::{TransportLimits, TransportPollGroup};

struct Slot {
    state: ReqState,
    req: Request,
    host_buffer: Vec<u8>,
    /// Counts toward its qpair's `held` (it has, or waits in the group's FIFO for, a buffer).
    claimed: bool,
}

struct Qpair {
    wire: Arc<Wire>,
    state: QueueState,
    /// Made as commands need them, up to twice the largest queue depth (as RDMA's).
    slots: Vec<Slot>,
    /// Free slots, most recently freed last.
    free: Vec<usize>,
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
        self.slots.len() - self.free.len()
    }
}

/// A request of a loopback poll group: qpair index and slot. A qpair index is reused only
/// once every slot of the old qpair is free, so no wakeup can name a slot of its successor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SlotId {
    qpair: usize,
    slot: usize,
}

pub(super) struct LoopbackPollGroup {
    index: u8,
    inbox: Arc<SegQueue<(Arc<Wire>, Option<ListenAddress>)>>,
    limits: TransportLimits,
    pools: SizedPools,
    per_qpair: usize,
    qpairs: Vec<Option<Qpair>>,
    /// Requests that asked for a data buffer when none of their class was free, oldest first;
    /// one FIFO per class ([`BufClass`] order), so a waiting large transfer never holds up
    /// small ones.
    waiting_for_buffer: [VecDeque<SlotId>; 2],
    /// The core's clock at the start of this turn (stamps held responses).
    now_ms: u64,
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
    pub(super) fn new(
        index: u8,
        inbox: Arc<SegQueue<(Arc<Wire>, Option<ListenAddress>)>>,
        limits: TransportLimits,
        pools: SizedPools,
        per_qpair: usize,
    ) -> Self {
        Self {
            index,
            inbox,
            limits,
            pools,
            per_qpair,
            qpairs: Vec::new(),
            waiting_for_buffer: [VecDeque::new(), VecDeque::new()],
            now_ms: 0,
        }
    }

    fn adopt(&mut self) -> usize {
        let mut n = 0;
        while let Some((wire, listener)) = self.inbox.pop() {
            let qp = Qpair {
                wire,
                state: QueueState::new(self.limits, None, "loopback".into(), listener),
                slots: Vec::new(),
                free: Vec::new(),
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

    /// Request slots a qpair may have: twice the largest queue depth, as RDMA's
    /// (`slots_for`). A host with more commands outstanding overran its queue.
    fn max_slots(&self) -> usize {
        usize::from(self.limits.max_queue_depth) * 2
    }

    fn receive(&mut self, core: &mut CoreCtx, qi: usize) -> usize {
        let mut n = 0;
        let max_slots = self.max_slots();
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
            let si = match qp.free.pop() {
                Some(si) => si,
                None if qp.slots.len() < max_slots => {
                    let tag = slot_tag(self.index, qi, qp.slots.len());
                    qp.slots.push(Slot {
                        state: ReqState::Free,
                        req: Request::new(tag),
                        host_buffer: Vec::new(),
                        claimed: false,
                    });
                    qp.slots.len() - 1
                }
                None => {
                    // More commands outstanding than any queue may hold: the host broke the
                    // protocol; the queue goes, as an RDMA queue does.
                    tracing::warn!(peer = %qp.state.peer, "queue overrun; closing the queue");
                    self.close(core, qi);
                    return n;
                }
            };
            let slot = &mut qp.slots[si];
            slot.req.reset(capsule.cmd);
            slot.host_buffer = capsule.host_buffer;
            driver::start(
                self,
                core,
                SlotId {
                    qpair: qi,
                    slot: si,
                },
            );
        }
    }

    fn deliver(&mut self, id: SlotId) {
        let qp = self.qpairs[id.qpair].as_mut().expect("live qpair");
        let slot = &mut qp.slots[id.slot];
        let mut host_buffer = std::mem::take(&mut slot.host_buffer);
        let req = &mut slot.req;
        if req.dir == DataDirection::ControllerToHost && req.status().is_success() {
            let data = req.data();
            if host_buffer.len() < data.len() {
                host_buffer.resize(data.len(), 0);
            }
            host_buffer[..data.len()].copy_from_slice(data);
        }
        if !qp.closing {
            qp.wire.to_host.push(Response {
                cqe: req.rsp,
                host_buffer,
            });
        }
        self.release(id);
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
                self.retry(
                    core,
                    SlotId {
                        qpair: qi,
                        slot: si,
                    },
                    ReqState::NeedSend,
                    Attempt::Retry,
                );
                n += 1;
            }
        }
        // Qpairs below their share take requests from their own queue; for the pool they are
        // new arrivals (behind the group's FIFO).
        for qi in 0..self.qpairs.len() {
            while let Some(qp) = self.qpairs[qi].as_mut() {
                if qp.closing || qp.held >= self.per_qpair {
                    break;
                }
                let Some(si) = qp.over_cap.pop_front() else {
                    break;
                };
                self.retry(
                    core,
                    SlotId {
                        qpair: qi,
                        slot: si,
                    },
                    ReqState::NeedBuffer,
                    Attempt::Fresh,
                );
                n += 1;
            }
        }
        for class in [BufClass::Small, BufClass::Large] {
            let fifo = class_index(class);
            while self.pools.pool(class).has_available() {
                let Some(id) = self.waiting_for_buffer[fifo].pop_front() else {
                    break;
                };
                self.retry(core, id, ReqState::NeedBuffer, Attempt::Retry);
                n += 1;
            }
        }
        n
    }

    /// Runs a request a wait queue gave back, if it still waits in `want`.
    fn retry(&mut self, core: &mut CoreCtx, id: SlotId, want: ReqState, attempt: Attempt) {
        if self.parts(id).is_some_and(|(_, state, _)| *state == want) {
            driver::process(self, core, id, attempt);
        }
    }

    /// Closes a queue: the host sees it disconnected, the controller loses it, and requests
    /// that wait for a buffer or for the host to take their response are freed. Those
    /// waiting on a bdev or an event keep their slot until the wakeup comes.
    fn close(&mut self, core: &mut CoreCtx, qi: usize) {
        let Some(qp) = self.qpairs[qi].as_mut().filter(|q| !q.closing) else {
            return;
        };
        qp.closing = true;
        qp.wire.target_closed.store(true, Ordering::Release);
        core.queue_closed(&mut qp.state);
        let mut waiting: Vec<usize> = qp.over_cap.drain(..).collect();
        waiting.extend(qp.unsent.drain(..).map(|(si, _)| si));
        for fifo in &mut self.waiting_for_buffer {
            waiting.extend(fifo.iter().filter(|id| id.qpair == qi).map(|id| id.slot));
            fifo.retain(|id| id.qpair != qi);
        }
        for slot in waiting {
            self.release(SlotId { qpair: qi, slot });
        }
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
                self.close(core, qi);
            }
            let qp = self.qpairs[qi].as_mut().expect("checked above");
            if qp.closing && qp.outstanding() == 0 {
                self.qpairs[qi] = None;
            }
        }
    }
}

impl RequestTransport for LoopbackPollGroup {
    type Id = SlotId;

    fn parts(&mut self, id: SlotId) -> Option<(&mut QueueState, &mut ReqState, &mut Request)> {
        let qp = self.qpairs.get_mut(id.qpair)?.as_mut()?;
        let slot = qp.slots.get_mut(id.slot)?;
        Some((&mut qp.state, &mut slot.state, &mut slot.req))
    }

    fn closing(&mut self, id: SlotId) -> bool {
        self.qpairs
            .get(id.qpair)
            .and_then(Option::as_ref)
            .is_none_or(|q| q.closing)
    }

    /// Within its qpair's share a request goes for a buffer of its class (behind the class's
    /// FIFO); beyond the share it waits in the qpair's own queue until one of the qpair's
    /// buffers comes back.
    fn get_buffer(&mut self, id: SlotId, attempt: Attempt) -> BufferStep {
        let Some(qp) = self.qpairs[id.qpair].as_mut() else {
            return BufferStep::Wait;
        };
        if !qp.slots[id.slot].claimed {
            if qp.held >= self.per_qpair {
                qp.over_cap.push_back(id.slot);
                return BufferStep::Wait;
            }
            qp.held += 1;
            qp.slots[id.slot].claimed = true;
        }
        let slot = &mut qp.slots[id.slot];
        let len = slot.req.len as usize;
        let class = self.pools.class_of(len);
        let fifo = &mut self.waiting_for_buffer[class_index(class)];
        if attempt == Attempt::Fresh && !fifo.is_empty() {
            fifo.push_back(id);
            return BufferStep::Wait;
        }
        let Some(mut buf) = self.pools.get(class) else {
            match attempt {
                Attempt::Fresh => fifo.push_back(id),
                Attempt::Retry => fifo.push_front(id),
            }
            return BufferStep::Wait;
        };
        buf.set_len(len);
        slot.req.data = Some(buf);
        BufferStep::Attached
    }

    /// The capsule's host buffer plays the host memory the SGL names: the data is copied at
    /// once (from its offset for in-capsule data).
    fn fetch_data(&mut self, id: SlotId, _attempt: Attempt) -> FetchStep {
        let Some(qp) = self.qpairs[id.qpair].as_mut() else {
            return FetchStep::Wait;
        };
        let slot = &mut qp.slots[id.slot];
        let len = slot.req.len as usize;
        let from = match slot.req.cmd.dptr.classify() {
            SglKind::InCapsule { offset, .. } => offset as usize,
            _ => 0,
        };
        // The host memory the SGL describes is not there: a transport-level failure.
        let (Some(src), Some(buf)) = (
            slot.host_buffer.get(from..from + len),
            slot.req.data.as_mut(),
        ) else {
            return FetchStep::Fail(Status::DATA_TRANSFER_ERROR.with_dnr());
        };
        buf.copy_from_slice(src);
        FetchStep::Done
    }

    /// Delivered now, or held (with its buffer) while the host does not receive or older
    /// responses are held.
    fn send_response(&mut self, id: SlotId, attempt: Attempt) {
        let now_ms = self.now_ms;
        let Some(qp) = self.qpairs[id.qpair].as_mut() else {
            return;
        };
        let stalled = qp.wire.host_stalled.load(Ordering::Acquire);
        match attempt {
            Attempt::Fresh if stalled || !qp.unsent.is_empty() => {
                qp.unsent.push_back((id.slot, now_ms))
            }
            Attempt::Retry if stalled => qp.unsent.push_front((id.slot, now_ms)),
            _ => self.deliver(id),
        }
    }

    fn release(&mut self, id: SlotId) {
        let Some(qp) = self.qpairs[id.qpair].as_mut() else {
            return;
        };
        let slot = &mut qp.slots[id.slot];
        if slot.state == ReqState::Free {
            return;
        }
        slot.state = ReqState::Free;
        slot.req.data = None;
        slot.host_buffer = Vec::new();
        if std::mem::take(&mut slot.claimed) {
            qp.held -= 1;
        }
        qp.free.push(id.slot);
    }
}

impl TransportPollGroup for LoopbackPollGroup {
    fn poll(&mut self, core: &mut CoreCtx) -> usize {
        self.now_ms = core.now_ms();
        let mut work = self.adopt();
        for qi in 0..self.qpairs.len() {
            work += self.receive(core, qi);
        }
        work += self.retry_waiting(core);
        self.reap_closed(core);
        work
    }

    fn resume(&mut self, tag: ReqTag, wakeup: Wakeup, core: &mut CoreCtx) {
        let id = SlotId {
            qpair: (tag.slot() >> 24) as usize,
            slot: (tag.slot() & 0xFF_FFFF) as usize,
        };
        driver::resume(self, core, id, wakeup);
    }

    fn qpair_count(&self) -> usize {
        self.qpairs.iter().flatten().count()
    }

    fn shutdown(&mut self, core: &mut CoreCtx) {
        for qi in 0..self.qpairs.len() {
            self.close(core, qi);
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

//! The RDMA transport's part of the request driver (`core::driver`): where a request gets a
//! data buffer, how the host's data comes in (copied from the capsule, or by RDMA READ), and
//! how a response joins its qpair's batch; and the serve loops that retry requests waiting
//! for those resources: in the poll group's FIFOs for data buffers and send queue room, in
//! their qpair's for a read credit.

use nvmf_common::rdma::Verbs;
use nvmf_common::spec::Status;

use super::poll_group::{class_index, RdmaPollGroup};
use super::qpair::{drop_unsent_data, release, try_queue, Qpair, SendOutcome};
use super::read_batch::queue_read;
use super::request::{HostData, State};
use super::wait_queue::{WaitQueue, Waiter};
use crate::core::driver::{self, Attempt, BufferStep, FetchStep, RequestTransport};
use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Request};
use crate::core::CoreCtx;

/// Capsule buffers' class in a qpair's `held` counts (after small and large).
const CAPSULE_CLASS: usize = 2;

/// Puts a request in a wait FIFO: behind the others if it just arrived, back at the front if
/// a serve loop took it from there.
fn enqueue(queue: &mut WaitQueue, id: Waiter, attempt: Attempt) {
    match attempt {
        Attempt::Fresh => queue.push(id),
        Attempt::Retry => queue.push_front(id),
    }
}

impl<V: Verbs> RequestTransport for RdmaPollGroup<V> {
    type Id = Waiter;

    fn parts(&mut self, id: Waiter) -> Option<(&mut QueueState, &mut State, &mut Request)> {
        let qp = self
            .qpairs
            .get_mut(id.qpair)?
            .as_mut()
            .filter(|q| q.gen == id.gen)?;
        let r = qp.requests.get_mut(id.slot as usize)?;
        Some((&mut qp.state, &mut r.state, &mut r.req))
    }

    fn closing(&mut self, id: Waiter) -> bool {
        self.qpairs
            .get(id.qpair)
            .and_then(Option::as_ref)
            .is_none_or(|q| q.gen != id.gen || q.closing.is_some())
    }

    /// In-capsule data executes from its capsule buffer when it starts at the capsule's data
    /// and the qpair has capsule buffers to spare (zero copy); otherwise a pool buffer of the
    /// request's class, within the qpair's share of it (over the share, the request parks on
    /// its qpair and blocks nobody in the FIFO).
    fn get_buffer(&mut self, id: Waiter, attempt: Attempt) -> BufferStep {
        let Some(qp) = self.qpairs[id.qpair].as_mut() else {
            return BufferStep::Wait;
        };
        let r = &mut qp.requests[id.slot as usize];
        let dev = &mut self.devices[qp.dev];
        let len = r.req.len;
        if let (DataDirection::HostToController, HostData::InCapsule { offset, len: sgl }) =
            (r.req.dir, r.host)
        {
            if offset
                .checked_add(sgl)
                .is_none_or(|end| end > r.received_data)
                || sgl < len
            {
                return BufferStep::Fail(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
            }
            if offset == 0 && qp.acct.held[CAPSULE_CLASS] < dev.share[CAPSULE_CLASS] {
                if let Some(mut buf) = r.capsule.take() {
                    buf.set_len(len as usize);
                    r.req.data = Some(buf);
                    r.buf_class = Some(CAPSULE_CLASS as u8);
                    qp.acct.held[CAPSULE_CLASS] += 1;
                    return BufferStep::Attached;
                }
            }
        }
        let class = dev.pools.class_of(len as usize);
        let ci = class_index(class);
        if attempt == Attempt::Fresh && !self.need_buffer[ci].is_empty() {
            self.need_buffer[ci].push(id);
            return BufferStep::Wait;
        }
        if qp.acct.held[ci] >= dev.share[ci] {
            qp.acct.parked[ci].push_back(id.slot);
            return BufferStep::Wait;
        }
        let Some(mut buf) = dev.pools.get(class) else {
            enqueue(&mut self.need_buffer[ci], id, attempt);
            return BufferStep::Wait;
        };
        qp.acct.held[ci] += 1;
        r.buf_class = Some(ci as u8);
        buf.set_len(len as usize);
        r.req.data = Some(buf);
        BufferStep::Attached
    }

    /// In-capsule data is copied from the capsule buffer (or is there already, zero copy);
    /// keyed data comes by RDMA READ while the host's read credits and the send queue allow,
    /// in FIFO order.
    fn fetch_data(&mut self, id: Waiter, attempt: Attempt) -> FetchStep {
        let Some(qp) = self.qpairs[id.qpair].as_mut() else {
            return FetchStep::Wait;
        };
        let r = &mut qp.requests[id.slot as usize];
        match r.host {
            HostData::InCapsule { offset, .. } => {
                if r.buf_class == Some(CAPSULE_CLASS as u8) {
                    return FetchStep::Done;
                }
                // `get_buffer` checked the bounds against what arrived. No capsule: the
                // command waited for a slot when too many capsule buffers were held by
                // waiting commands, and its data was dropped; the host sends it again.
                let (Some(mut whole), Some(buf)) = (r.capsule.take(), r.req.data.as_mut()) else {
                    return FetchStep::Fail(Status::COMMAND_INTERRUPTED);
                };
                let (from, n) = (offset as usize, buf.len());
                // The capsule buffer holds the whole receive (its length is the pool's).
                whole.set_len(from + n);
                buf.as_mut_slice()
                    .copy_from_slice(&whole.as_slice()[from..from + n]);
                FetchStep::Done
            }
            HostData::Keyed { .. } => {
                let behind = attempt == Attempt::Fresh && !qp.awaiting_read.is_empty();
                if !read_room(qp) || behind {
                    match attempt {
                        Attempt::Fresh => qp.awaiting_read.push_back(id.slot),
                        Attempt::Retry => qp.awaiting_read.push_front(id.slot),
                    }
                    return FetchStep::Wait;
                }
                // Posted with the qpair's other READs of this turn (one doorbell).
                if queue_read(qp, id.slot, self.now_ms) {
                    self.dirty.push(id.qpair);
                }
                FetchStep::Posted
            }
            HostData::None => FetchStep::Fail(Status::DATA_SGL_LENGTH_INVALID.with_dnr()),
        }
    }

    /// Joins the qpair's batch (posted once per turn) when the send queue has room and no
    /// older response waits for it; else waits in the FIFO.
    fn send_response(&mut self, id: Waiter, attempt: Attempt) {
        let Some(qp) = self.qpairs[id.qpair].as_mut() else {
            return;
        };
        let Some(r) = qp.requests.get_mut(id.slot as usize) else {
            return;
        };
        let wrs = drop_unsent_data(&mut qp.acct, r);
        if attempt == Attempt::Fresh && !self.need_send.is_empty() {
            return self.need_send.push(id);
        }
        match try_queue(qp, id.slot, wrs) {
            (SendOutcome::NoRoom, _) => enqueue(&mut self.need_send, id, attempt),
            (SendOutcome::Queued, true) => self.dirty.push(id.qpair),
            (SendOutcome::Queued, false) => {}
            // The qpair's close deals with the request.
            (SendOutcome::Failed, _) => {}
        }
    }

    fn release(&mut self, id: Waiter) {
        if let Some(qp) = self.qpairs[id.qpair].as_mut() {
            if let Some(r) = qp.requests.get_mut(id.slot as usize) {
                release(&mut qp.acct, r);
            }
        }
    }
}

/// Whether the qpair may queue another RDMA READ: a read credit left and send queue room.
fn read_room<V: Verbs>(qp: &Qpair<V>) -> bool {
    qp.reads_in_flight < qp.max_reads && qp.sq_used < qp.sq_capacity
}

impl<V: Verbs> RdmaPollGroup<V> {
    /// Gives waiting requests data buffers, oldest first per class. A class whose pool is
    /// empty is left at once (its front request went back to the front).
    pub(super) fn serve_buffers(&mut self, core: &mut CoreCtx) -> usize {
        let mut n = 0;
        for ci in 0..2 {
            while let Some((w, _)) = self.need_buffer[ci].current_at(0, &mut self.qpairs) {
                self.need_buffer[ci].remove(0);
                driver::process(self, core, w, Attempt::Retry);
                if self.need_buffer[ci].front() == Some(&w) {
                    break;
                }
                n += 1;
            }
        }
        n
    }

    /// Queues the READs of qpair `qi`'s waiting requests, oldest first, while its read
    /// credits and send queue room last. Called when a completion gave some back.
    pub(super) fn serve_reads(&mut self, qi: usize, core: &mut CoreCtx) {
        loop {
            let Some(qp) = self.qpairs[qi].as_mut().filter(|q| q.closing.is_none()) else {
                return;
            };
            if !read_room(qp) {
                return;
            }
            let Some(slot) = qp.awaiting_read.pop_front() else {
                return;
            };
            let gen = qp.gen;
            driver::process(
                self,
                core,
                Waiter {
                    qpair: qi,
                    gen,
                    slot,
                },
                Attempt::Retry,
            );
        }
    }

    /// Batches waiting responses, oldest first, until a send queue is full.
    pub(super) fn serve_sends(&mut self, core: &mut CoreCtx) -> usize {
        let mut n = 0;
        while let Some((w, _)) = self.need_send.current_at(0, &mut self.qpairs) {
            self.need_send.remove(0);
            driver::process(self, core, w, Attempt::Retry);
            if self.need_send.front() == Some(&w) {
                break;
            }
            n += 1;
        }
        n
    }
}

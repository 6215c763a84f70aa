//! The one request driver every transport runs: a request's life as an explicit state
//! machine with a single step function, [`process`] (the shape of SPDK's
//! `nvmf_rdma_request_process`, with our types). A transport implements
//! [`RequestTransport`]: it names its requests, and provides the three things that differ
//! between fabrics (a data buffer, moving the host's data in, sending the response). The
//! order of the steps, when the core prepares, executes and resumes, and what happens on a
//! closing queue are decided here, once.
//!
//! ```text
//!  Free ──capsule──► New ──prepare─┬─ Complete ─────────────────────────────► NeedSend
//!                                  ├─ NoData ───────────────────────────────► ReadyToExecute
//!                                  └─ Data ──► NeedBuffer ─┬─ to host ─────────► ReadyToExecute
//!                                                          └─ from host ─► NeedRead ─┬─ in place ─► ReadyToExecute
//!                                                                                    └─ posted ──► Reading ─► ReadyToExecute
//!  ReadyToExecute ──execute──► Executing ──Complete (now or by wakeup)──► NeedSend
//!  NeedSend ──► Batched ─┬─► Sending ──send completion──► Free      (or straight to Free)
//!                        └─► Sent ──a later SEND's completion──► Free   (unsignaled)
//! ```
//!
//! Each wait for a resource is a state plus a FIFO the transport keeps, never a failure:
//! `NeedBuffer` (the data buffer pool, or the queue's share of it), `NeedRead` (room to
//! fetch host data), `NeedSend` (room to send, or a host that takes no response). A request
//! the transport queued is retried by the transport's serve loop with
//! [`process`]`(.., Attempt::Retry)`; a fresh request goes behind those already waiting.
//!
//! A step that fails completes the command with the step's status and goes on to
//! `NeedSend`, so every path ends in one response. A request whose queue is closing is
//! released instead of answered.

use nvmf_common::spec::Status;

use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Prepared, Request, Wakeup};
use crate::core::CoreCtx;

/// Where a request is in its life; the same for every transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqState {
    /// Slot unused.
    Free,
    /// A command capsule arrived: the core prepares it next.
    New,
    /// Parsed; waiting for a data buffer.
    NeedBuffer,
    /// Has a buffer; waiting for room to fetch the host's data (an RDMA READ slot and send
    /// queue room), or about to copy in-capsule data.
    NeedRead,
    /// The host's data is on its way (an RDMA READ is posted).
    Reading,
    /// Data in place, or none needed: the core executes it next.
    ReadyToExecute,
    /// Handed to the core; waiting for `Exec::Complete` or a wakeup.
    Executing,
    /// Response ready; waiting for room to send it.
    NeedSend,
    /// Room reserved; in its queue's batch, posted at the end of the turn.
    Batched,
    /// Response (and data for the host) posted; waiting for the transport's completion.
    Sending,
    /// Response posted without a completion of its own (an unsignaled SEND): the
    /// completion of a later response on its queue frees it. The later one carries the
    /// transfer timeout, as completions come in order.
    Sent,
    /// Posting the response failed after data may have left from its buffer: the request
    /// keeps the buffer until the queue is destroyed. Nothing moves a request out of it.
    Abandoned,
}

/// Whether [`process`] runs a request that just entered its state or one a transport's
/// serve loop takes from a wait FIFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The request just reached this state: if others wait for the same resource, it
    /// queues behind them.
    Fresh,
    /// The transport's serve loop took the request from the front of its FIFO: it goes
    /// now if the resource is there, or goes back to the front.
    Retry,
}

/// How getting a data buffer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferStep {
    /// `req.data` holds a buffer of exactly `req.len` bytes.
    Attached,
    /// Queued (or parked) by the transport; it retries the request when a buffer frees.
    Wait,
    /// The data the command describes cannot be placed (an in-capsule SGL longer than what
    /// arrived): the command completes with this status.
    Fail(Status),
}

/// How moving the host's data in went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchStep {
    /// The data is in the buffer now (in-capsule data, an in-process host).
    Done,
    /// A transfer is posted; the transport calls [`data_arrived`] when it completes.
    Posted,
    /// No room to post it: queued, retried by the transport.
    Wait,
    /// The data cannot be had: the command completes with this status.
    Fail(Status),
}

/// What one transport provides to the driver. `Id` names a request (queue, incarnation and
/// slot); every method takes the request by its id and may find it gone.
pub trait RequestTransport {
    type Id: Copy;

    /// The request and its queue's state, or `None` if the queue (or that incarnation of
    /// it) is gone.
    fn parts(&mut self, id: Self::Id) -> Option<(&mut QueueState, &mut ReqState, &mut Request)>;

    /// Whether the request's queue is closing: finished requests are released, not
    /// answered.
    fn closing(&mut self, id: Self::Id) -> bool;

    /// Attaches a data buffer of `req.len` bytes, or queues the request for one.
    fn get_buffer(&mut self, id: Self::Id, attempt: Attempt) -> BufferStep;

    /// Moves the host's data into the attached buffer, or queues the request for room.
    fn fetch_data(&mut self, id: Self::Id, attempt: Attempt) -> FetchStep;

    /// Sends (or batches) the response, with data for the host if the command produced
    /// some, or queues the request for room. The transport sets the state the request ends
    /// in: `Batched`, `Sending`, `Free`, or `NeedSend` while queued.
    fn send_response(&mut self, id: Self::Id, attempt: Attempt);

    /// Returns the request's slot and buffer: a request whose queue is closing.
    fn release(&mut self, id: Self::Id);
}

/// Runs a request from its current state for as long as it can move without waiting.
pub fn process<T: RequestTransport>(t: &mut T, core: &mut CoreCtx, id: T::Id, attempt: Attempt) {
    let mut attempt = attempt;
    loop {
        let Some((queue, state, req)) = t.parts(id) else {
            return;
        };
        match *state {
            ReqState::New => {
                *state = match core.prepare(queue, req) {
                    Prepared::Complete => ReqState::NeedSend,
                    Prepared::NoData => ReqState::ReadyToExecute,
                    Prepared::Data { .. } => ReqState::NeedBuffer,
                };
            }
            ReqState::NeedBuffer => match t.get_buffer(id, attempt) {
                BufferStep::Attached => {
                    let Some((_, state, req)) = t.parts(id) else {
                        return;
                    };
                    *state = if req.dir == DataDirection::HostToController {
                        ReqState::NeedRead
                    } else {
                        ReqState::ReadyToExecute
                    };
                }
                BufferStep::Wait => return,
                BufferStep::Fail(status) => fail(t, id, status),
            },
            ReqState::NeedRead => match t.fetch_data(id, attempt) {
                FetchStep::Done => set_state(t, id, ReqState::ReadyToExecute),
                FetchStep::Posted => return set_state(t, id, ReqState::Reading),
                FetchStep::Wait => return,
                FetchStep::Fail(status) => fail(t, id, status),
            },
            ReqState::ReadyToExecute => {
                *state = ReqState::Executing;
                if core.execute(queue, req) == Exec::Pending {
                    return;
                }
                set_state(t, id, ReqState::NeedSend);
            }
            ReqState::NeedSend => {
                if t.closing(id) {
                    return t.release(id);
                }
                return t.send_response(id, attempt);
            }
            ReqState::Free
            | ReqState::Reading
            | ReqState::Executing
            | ReqState::Batched
            | ReqState::Sending
            | ReqState::Sent
            | ReqState::Abandoned => return,
        }
        // Only the first step of a retried request was taken from a FIFO.
        attempt = Attempt::Fresh;
    }
}

/// A step failed: the command completes with `status` and its response goes out.
fn fail<T: RequestTransport>(t: &mut T, id: T::Id, status: Status) {
    if let Some((_, state, req)) = t.parts(id) {
        req.complete(status);
        *state = ReqState::NeedSend;
    }
}

fn set_state<T: RequestTransport>(t: &mut T, id: T::Id, to: ReqState) {
    if let Some((_, state, _)) = t.parts(id) {
        *state = to;
    }
}

/// A command capsule arrived in a `Free` slot whose `req` the transport has reset: runs it
/// as far as it goes.
pub fn start<T: RequestTransport>(t: &mut T, core: &mut CoreCtx, id: T::Id) {
    set_state(t, id, ReqState::New);
    process(t, core, id, Attempt::Fresh);
}

/// The host's data arrived for a `Reading` request (`ok`), or its transfer failed: executes
/// it, or, on a failure or a closing queue, releases it (the transport closes the queue).
pub fn data_arrived<T: RequestTransport>(t: &mut T, core: &mut CoreCtx, id: T::Id, ok: bool) {
    match t.parts(id) {
        Some((_, state, _)) if *state == ReqState::Reading => {}
        _ => return,
    }
    if !ok || t.closing(id) {
        return t.release(id);
    }
    set_state(t, id, ReqState::ReadyToExecute);
    process(t, core, id, Attempt::Fresh);
}

/// The core's wakeup for an `Executing` request: resumes it and, once complete, answers it
/// (or releases it on a closing queue). A wakeup for a request in any other state, or whose
/// queue is gone, is dropped.
pub fn resume<T: RequestTransport>(t: &mut T, core: &mut CoreCtx, id: T::Id, wakeup: Wakeup) {
    let Some((queue, state, req)) = t.parts(id) else {
        return;
    };
    if *state != ReqState::Executing {
        return;
    }
    if core.resume(queue, req, wakeup) == Exec::Complete {
        *state = ReqState::NeedSend;
        process(t, core, id, Attempt::Fresh);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nvmf_common::buffer::BufferPool;
    use nvmf_common::spec::fabrics::ConnectCommand;
    use nvmf_common::spec::sgl::SglDescriptor;
    use nvmf_common::spec::Command;

    use super::*;
    use crate::core::request::ReqTag;
    use crate::core::TargetInfo;
    use crate::transport::TransportLimits;

    /// One request, its queue, scripted answers for the transport steps, and what the driver
    /// asked of it.
    struct Fake {
        queue: QueueState,
        state: ReqState,
        req: Request,
        closing: bool,
        buffer: BufferStep,
        fetch: FetchStep,
        pool: BufferPool,
        calls: Vec<(&'static str, Attempt)>,
    }

    impl Fake {
        fn new(cmd: Command) -> Self {
            let mut req = Request::new(ReqTag::new(0, 0));
            req.reset(cmd);
            Self {
                queue: QueueState::new(TransportLimits::DEFAULT_RDMA, None, "fake".into(), None),
                state: ReqState::Free,
                req,
                closing: false,
                buffer: BufferStep::Attached,
                fetch: FetchStep::Done,
                pool: BufferPool::new(4096, 4).expect("pool"),
                calls: Vec::new(),
            }
        }

        fn names(&self) -> Vec<&'static str> {
            self.calls.iter().map(|c| c.0).collect()
        }
    }

    impl RequestTransport for Fake {
        type Id = ();

        fn parts(&mut self, _: ()) -> Option<(&mut QueueState, &mut ReqState, &mut Request)> {
            Some((&mut self.queue, &mut self.state, &mut self.req))
        }

        fn closing(&mut self, _: ()) -> bool {
            self.closing
        }

        fn get_buffer(&mut self, _: (), attempt: Attempt) -> BufferStep {
            self.calls.push(("get_buffer", attempt));
            if self.buffer == BufferStep::Attached {
                let mut buf = self.pool.get().expect("buffer");
                buf.set_len(self.req.len as usize);
                buf.fill(0);
                self.req.data = Some(buf);
            }
            self.buffer
        }

        fn fetch_data(&mut self, _: (), attempt: Attempt) -> FetchStep {
            self.calls.push(("fetch_data", attempt));
            self.fetch
        }

        fn send_response(&mut self, _: (), attempt: Attempt) {
            self.calls.push(("send_response", attempt));
            assert_eq!(self.state, ReqState::NeedSend);
            self.state = ReqState::Sending;
        }

        fn release(&mut self, _: ()) {
            self.calls.push(("release", Attempt::Fresh));
            self.state = ReqState::Free;
        }
    }

    fn core() -> CoreCtx {
        CoreCtx::new(0, Arc::new(TargetInfo::default()))
    }

    /// A Connect: 1,024 bytes of host data (all zeroes here: no such subsystem).
    fn connect() -> Command {
        let mut cmd = ConnectCommand::new(1, 0, 31, 0).to_command();
        cmd.flags |= Command::FLAG_SGL;
        cmd.dptr = SglDescriptor::keyed(0x1000, 1024, 0x1234, false);
        cmd
    }

    #[test]
    fn a_command_refused_in_prepare_is_answered_without_a_data_phase() {
        let mut t = Fake::new(Command::read(7, 1, 0, 1));
        start(&mut t, &mut core(), ());
        assert_eq!(t.names(), ["send_response"]);
        assert_eq!(t.req.status(), Status::COMMAND_SEQUENCE_ERROR.with_dnr());
        assert_eq!(t.req.rsp.cid, 7);
    }

    #[test]
    fn a_command_with_host_data_gets_a_buffer_then_the_data_then_executes_and_answers() {
        let mut t = Fake::new(connect());
        start(&mut t, &mut core(), ());
        assert_eq!(t.names(), ["get_buffer", "fetch_data", "send_response"]);
        assert!(t.calls.iter().all(|c| c.1 == Attempt::Fresh));
        // Executed: the zeroed Connect data names no subsystem the core knows (a refusal in
        // prepare would have skipped the buffer and the data).
        assert!(!t.req.status().is_success());
    }

    #[test]
    fn a_request_waiting_for_a_buffer_stops_and_its_retry_goes_on_from_there() {
        let mut t = Fake::new(connect());
        let mut core = core();
        t.buffer = BufferStep::Wait;
        start(&mut t, &mut core, ());
        assert_eq!(t.state, ReqState::NeedBuffer);
        assert_eq!(t.names(), ["get_buffer"]);
        t.buffer = BufferStep::Attached;
        process(&mut t, &mut core, (), Attempt::Retry);
        assert_eq!(
            t.calls[1..],
            [
                ("get_buffer", Attempt::Retry),
                ("fetch_data", Attempt::Fresh),
                ("send_response", Attempt::Fresh)
            ],
            "only the step taken from the FIFO is a retry"
        );
    }

    #[test]
    fn a_failed_step_answers_with_its_status() {
        let mut t = Fake::new(connect());
        t.buffer = BufferStep::Fail(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
        start(&mut t, &mut core(), ());
        assert_eq!(t.names(), ["get_buffer", "send_response"]);
        assert_eq!(t.req.status(), Status::DATA_SGL_LENGTH_INVALID.with_dnr());

        let mut t = Fake::new(connect());
        t.fetch = FetchStep::Fail(Status::DATA_TRANSFER_ERROR);
        start(&mut t, &mut core(), ());
        assert_eq!(t.names(), ["get_buffer", "fetch_data", "send_response"]);
        assert_eq!(t.req.status(), Status::DATA_TRANSFER_ERROR);
    }

    #[test]
    fn a_posted_transfer_executes_when_the_data_arrives_and_is_released_if_it_failed() {
        let mut core = core();
        let mut t = Fake::new(connect());
        t.fetch = FetchStep::Posted;
        start(&mut t, &mut core, ());
        assert_eq!(t.state, ReqState::Reading);
        data_arrived(&mut t, &mut core, (), true);
        assert_eq!(t.names(), ["get_buffer", "fetch_data", "send_response"]);

        let mut t = Fake::new(connect());
        t.fetch = FetchStep::Posted;
        start(&mut t, &mut core, ());
        data_arrived(&mut t, &mut core, (), false);
        assert_eq!(t.names(), ["get_buffer", "fetch_data", "release"]);
        assert_eq!(t.state, ReqState::Free);
    }

    #[test]
    fn a_finished_request_on_a_closing_queue_is_released_not_answered() {
        let mut core = core();
        let mut t = Fake::new(connect());
        t.fetch = FetchStep::Posted;
        start(&mut t, &mut core, ());
        t.closing = true;
        data_arrived(&mut t, &mut core, (), true);
        assert_eq!(t.names(), ["get_buffer", "fetch_data", "release"]);

        let mut t = Fake::new(Command::read(7, 1, 0, 1));
        t.closing = true;
        start(&mut t, &mut core, ());
        assert_eq!(t.names(), ["release"]);
    }

    #[test]
    fn a_wakeup_for_a_request_that_is_not_executing_is_dropped() {
        let mut core = core();
        let mut t = Fake::new(connect());
        t.fetch = FetchStep::Posted;
        start(&mut t, &mut core, ());
        resume(
            &mut t,
            &mut core,
            (),
            Wakeup::Aborted(Status::ABORTED_SQ_DELETION),
        );
        assert_eq!(t.state, ReqState::Reading);
        assert_eq!(t.names(), ["get_buffer", "fetch_data"]);
    }
}

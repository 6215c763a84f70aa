//! One RDMA connection on a reactor: its QP, its request slots and response buffers, and the
//! send queue accounting; plus how a poll group hands out qpair indexes. How its batched
//! responses are posted (chains, deferral, covers) is in `send_batch.rs`.

use std::collections::VecDeque;

use nvmf_common::rdma::{CmIdToken, DmaBuf, RdmaError, Verbs};

use super::backlog::Backlog;
use super::request::{HostData, RdmaRequest, State, MAX_QPAIRS};
use super::send_batch::Cover;
use super::wait_queue::{RequestSlots, WaitQueue, Waiter};
use crate::core::queue::QueueState;
use crate::core::request::DataDirection;

pub(super) const CQE_LEN: usize = 16;

pub(super) struct Qpair<V: Verbs> {
    pub gen: u8,
    pub dev: usize,
    // Field order is drop order. The QP is destroyed before its CM id, and before `requests`:
    // an `Abandoned` request's buffer may be the source of an RDMA WRITE still on the send
    // queue, and only destroying the QP guarantees the NIC no longer reads it. Likewise
    // `responses`, which posted SENDs read. Keep `qp` first.
    pub qp: V::Qp,
    pub cm_id: V::CmId,
    pub token: CmIdToken,
    pub state: QueueState,
    pub requests: Vec<RdmaRequest>,
    /// Where responses are sent from when the QP cannot take them inline; `None`: each
    /// SEND carries its CQE in the work request.
    pub responses: Option<DmaBuf<V>>,
    pub sq_capacity: u32,
    /// CQ entries reserved for this QP's sends on its device.
    pub cq_share: u32,
    /// Data buffers its requests hold and its free request slots.
    pub acct: SlotAccounts,
    /// Commands that arrived before a slot freed for them, and the count that tells a
    /// queue overrun apart from them.
    pub backlog: Backlog,
    /// Requests whose responses wait, send queue room reserved, for this turn's post (one
    /// doorbell per qpair and turn, not one per response). Capacity for every slot, so
    /// pushing never allocates.
    pub batch: Vec<u32>,
    /// Requests whose RDMA READ waits, credit and send queue room reserved, for this
    /// turn's post (`read_batch`). Capacity for every slot.
    pub reads: Vec<u32>,
    /// Requests waiting for a read credit (the host's responder resources bound the READs in
    /// flight) or send queue room, oldest first. Per qpair, as both limits are: a completion
    /// that frees either serves this qpair's front at once, and a turn never looks at a
    /// queue that cannot move (SPDK's `pending_rdma_read_queue`). Capacity for every slot.
    pub awaiting_read: VecDeque<u32>,
    /// Requests whose SENDs went unsignaled, in posting order: all but the last of a chain
    /// (`Sending`), and the whole of a deferred chain (`Sent`). A signaled SEND or a cover
    /// frees the `covers` oldest of them when it completes: those posted since the previous
    /// one. Capacity for every slot, so pushing never allocates.
    pub unsignaled: VecDeque<u32>,
    /// Deferred responses posted since this qpair's last signaled SEND (at most
    /// `max_deferred`): the next signaled SEND, or a cover, covers them.
    pub uncovered: u32,
    /// Responses the qpair may defer: [`DEFERRED_SENDS`](super::request::DEFERRED_SENDS),
    /// or 0 on an admin queue and where a cover cannot be posted (iWARP; see [`post_cover`]).
    pub max_deferred: u32,
    /// The zero-length RDMA WRITE posted to cover deferred responses of an idle qpair, while
    /// it has not completed.
    pub cover: Option<Cover>,
    pub sq_used: u32,
    pub reads_in_flight: u32,
    pub max_reads: u32,
    /// SENDs and READs posted signaled and not completed yet.
    pub signaled: u32,
    /// The core's clock (ms) when the close started.
    pub closing: Option<u64>,
    pub drained: bool,
    pub send_with_invalidate: bool,
    /// A post on this QP failed. `try_send` has no core context to close the qpair with, so
    /// the poll group's next reap does.
    pub broken: bool,
    /// On the poll group's watch list: the housekeeping tick looks at this qpair (it is
    /// unconnected, closing, broken, or has transfers in flight). Idle qpairs are not on it.
    pub watched: bool,
    /// Tells the acceptor, when the qpair (and its CM id) is gone, to forget it.
    pub _ticket: super::AcceptorTicket,
}

impl<V: Verbs> RequestSlots for Qpair<V> {
    fn generation(&self) -> u8 {
        self.gen
    }

    fn requests(&self) -> &[RdmaRequest] {
        &self.requests
    }
}

/// The index for a new qpair: the lowest free one, or the next one while fewer than
/// [`MAX_QPAIRS`] exist (past it, work request ids and core tags would alias an older index).
/// A new index starts at generation 0; `None` means the group is full.
pub(super) fn claim_index<T>(qpairs: &mut Vec<Option<T>>, gens: &mut Vec<u8>) -> Option<usize> {
    if let Some(i) = qpairs.iter().position(Option::is_none) {
        return Some(i);
    }
    if qpairs.len() >= MAX_QPAIRS {
        return None;
    }
    qpairs.push(None);
    gens.push(0);
    Some(qpairs.len() - 1)
}

/// Whether a request has waited for the host's side of a transfer (RDMA READ or the response
/// SEND) `timeout_ms` or longer. Runs on timer ticks only.
pub(super) fn transfer_stuck(requests: &[RdmaRequest], now_ms: u64, timeout_ms: u64) -> bool {
    requests.iter().any(|r| {
        matches!(r.state, State::Reading | State::Sending)
            && now_ms.saturating_sub(r.posted_ms) >= timeout_ms
    })
}

/// Work requests a request's response takes: RDMA WRITE + SEND with data for the host.
pub(super) fn wrs_of(r: &RdmaRequest) -> u32 {
    if r.req.dir == DataDirection::ControllerToHost
        && r.req.status().is_success()
        && r.req.data.is_some()
        && matches!(r.host, HostData::Keyed { .. })
    {
        2
    } else {
        1
    }
}

/// What a qpair's requests hold, kept as counts so nothing is scanned per I/O.
pub(super) struct SlotAccounts {
    /// Data buffers held per class (small, large, capsule): at most the device's per-qpair
    /// share each.
    pub held: [u32; 3],
    /// Free request slots, most recently freed last (reused first: its cache lines are warm).
    /// Capacity for every slot, so pushing never allocates.
    pub free: Vec<u32>,
    /// Requests waiting for a data buffer of a class (small, large) while this qpair holds
    /// its whole share of it, oldest first. They wait here, not in the poll group's FIFO,
    /// so a turn never looks at them; each buffer of the class this qpair gives back moves
    /// one to the front of the FIFO ([`SlotAccounts::unpark`]). Capacity for every slot.
    pub parked: [VecDeque<u32>; 2],
}

impl SlotAccounts {
    pub fn new(slots: u32) -> Self {
        let parked = || VecDeque::with_capacity(slots as usize);
        Self {
            held: [0; 3],
            free: (0..slots).rev().collect(),
            parked: [parked(), parked()],
        }
    }

    /// Moves parked requests the qpair now has room for (below `share` per class) to the
    /// front of their class's FIFO, oldest first.
    #[inline]
    pub fn unpark(
        &mut self,
        share: &[u32; 3],
        qpair: usize,
        gen: u8,
        need_buffer: &mut [WaitQueue; 2],
    ) {
        // Called at every SEND completion, where nearly always nothing is parked: checked
        // inline, before a call and an empty drain's set-up.
        if self.parked() > 0 {
            self.unpark_some(share, qpair, gen, need_buffer);
        }
    }

    #[inline(never)]
    fn unpark_some(
        &mut self,
        share: &[u32; 3],
        qpair: usize,
        gen: u8,
        need_buffer: &mut [WaitQueue; 2],
    ) {
        for ci in 0..2 {
            let room = share[ci].saturating_sub(self.held[ci]) as usize;
            let n = room.min(self.parked[ci].len());
            // Pushed to the front youngest first, so the oldest ends up first.
            for slot in self.parked[ci].drain(..n).rev() {
                need_buffer[ci].push_front(Waiter { qpair, gen, slot });
            }
        }
    }

    /// Parked requests of both classes.
    #[inline]
    pub fn parked(&self) -> usize {
        self.parked[0].len() + self.parked[1].len()
    }
}

/// Returns a request slot to the free state; its data buffer goes back to the pool. Takes
/// the buffer off its qpair's `held` count.
pub(super) fn release(acct: &mut SlotAccounts, r: &mut RdmaRequest) {
    if r.state == State::Free {
        return;
    }
    r.req.data = None;
    r.capsule = None;
    r.state = State::Free;
    acct.free.push(r.slot);
    if let Some(c) = r.buf_class.take() {
        acct.held[usize::from(c)] -= 1;
    }
}

/// A response without data for the host (a write's, a failed command's) reads nothing from
/// its request's data buffer (or the capsule buffer a write executed from): the buffer goes
/// back as the response heads for the wire, not at the SEND's completion, so a write's
/// response holds no buffer while it waits for room, is in flight or is deferred. Waiters
/// for the class are served by the next turn's buffer loop; requests parked on this qpair
/// wait for its next SEND's completion, as before. Returns the work requests the response
/// takes ([`wrs_of`]), for [`try_queue`].
pub(super) fn drop_unsent_data(acct: &mut SlotAccounts, r: &mut RdmaRequest) -> u32 {
    let wrs = wrs_of(r);
    if wrs == 1 {
        r.req.data = None;
        r.capsule = None;
        if let Some(c) = r.buf_class.take() {
            acct.held[usize::from(c)] -= 1;
        }
    }
    wrs
}

/// What becomes of a response's data buffer when posting its work requests failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterFailedPost {
    /// No posted work request reads the buffer: it may go back to the pool now.
    Release,
    /// An RDMA WRITE from the buffer may be on the send queue: the request keeps it
    /// (`State::Abandoned`) until the QP is destroyed.
    Hold,
}

/// Decides [`AfterFailedPost`] for a failed `post_send` of a response; `writes_data` says
/// whether the chain was `[RDMA WRITE from the buffer, SEND]` rather than a lone SEND.
///
/// `ibv_post_send` may fail on the SEND after posting the WRITE. `QueuePair::post_send`
/// reports `InvalidArgument` only when it refused the chain before calling the verb, and
/// `PostSend { index }` otherwise; an index of 0 means either "the WRITE was not posted" or
/// "the provider did not say" (`wr::chain_index`), so it proves nothing. Only an error that
/// proves nothing was posted releases a buffer the chain reads.
pub(super) fn after_failed_post(writes_data: bool, err: &RdmaError) -> AfterFailedPost {
    if !writes_data {
        return AfterFailedPost::Release;
    }
    match err {
        RdmaError::InvalidArgument(_) => AfterFailedPost::Release,
        _ => AfterFailedPost::Hold,
    }
}

/// How an attempt to queue a response went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendOutcome {
    /// In the qpair's batch with its send queue room reserved; the request is `Batched`
    /// until [`flush_batch`] posts it.
    Queued,
    /// No send queue room; the request stays `NeedSend`, queued.
    NoRoom,
    /// Not queued: the qpair is broken. The request is left to the qpair's close.
    Failed,
}

/// Reserves send queue room for the response of `si` (`wrs` work requests: the read data
/// before it, if any, and the SEND) and adds it to the qpair's batch, posted once per poll
/// turn by [`flush_batch`]. Returns
/// whether the qpair had nothing waiting to be posted before (it must be flushed).
pub(super) fn try_queue<V: Verbs>(qp: &mut Qpair<V>, si: u32, wrs: u32) -> (SendOutcome, bool) {
    if qp.broken {
        return (SendOutcome::Failed, false);
    }
    if qp.sq_used + wrs > qp.sq_capacity {
        return (SendOutcome::NoRoom, false);
    }
    qp.sq_used += wrs;
    qp.requests[si as usize].state = State::Batched;
    let first = qp.batch.is_empty() && qp.reads.is_empty();
    qp.batch.push(si);
    (SendOutcome::Queued, first)
}

/// What became of one request of a chain whose post failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// All its work requests were posted: it completes (flushed) like any other.
    Posted,
    /// A work request on its buffer (a response's RDMA WRITE, an RDMA READ) may be on the
    /// send queue: it keeps the buffer (`Abandoned`) until the QP is destroyed.
    Hold,
    /// Nothing of it was posted, or nothing that reads its buffer: released now.
    Release,
}

/// The fate of request `j` of a failed chain, given each request's work request count
/// (`[WRITE, SEND]` = 2, a lone SEND = 1) in chain order. `PostSend { index }` says the
/// work requests before `index` were posted; an index of 0 is also what a provider that
/// names no failing request reports, so it proves nothing: every request whose chain reads
/// its buffer is held then. Only `InvalidArgument` (refused before the verb) proves that
/// nothing was posted.
pub(super) fn fate_after_failed_post(wrs: &[u32], j: usize, err: &RdmaError) -> Fate {
    fate_in_failed_chain(wrs, j, err, wrs[j] == 2)
}

/// [`fate_after_failed_post`] for any chain: `on_buffer` says whether request `j`'s work
/// requests touch its data buffer (a response's RDMA WRITE reads it, an RDMA READ writes
/// it), so that a post which may have gone must hold the buffer.
pub(super) fn fate_in_failed_chain(
    wrs: &[u32],
    j: usize,
    err: &RdmaError,
    on_buffer: bool,
) -> Fate {
    let mine = wrs[j];
    let ambiguous = || {
        if after_failed_post(on_buffer, err) == AfterFailedPost::Hold {
            Fate::Hold
        } else {
            Fate::Release
        }
    };
    match err {
        RdmaError::InvalidArgument(_) => Fate::Release,
        RdmaError::PostSend { index, .. } if *index > 0 => {
            let start: u32 = wrs[..j].iter().sum();
            let index = *index as u32;
            if start + mine <= index {
                Fate::Posted
            } else if start < index {
                // Its WRITE went, its SEND did not.
                Fate::Hold
            } else {
                Fate::Release
            }
        }
        _ => ambiguous(),
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;
    use crate::core::request::{ReqTag, Request};

    #[test]
    fn only_transfers_waiting_on_the_host_past_the_timeout_count_as_stuck() {
        let mut requests: Vec<RdmaRequest> = (0..3)
            .map(|i| RdmaRequest::new(Request::new(ReqTag::new(0, i))))
            .collect();
        requests[0].state = State::Executing;
        requests[0].posted_ms = 0;
        requests[1].state = State::Sending;
        requests[1].posted_ms = 1_000;
        assert!(!transfer_stuck(&requests, 30_999, 30_000));
        assert!(transfer_stuck(&requests, 31_000, 30_000));
        requests[1].state = State::Free;
        requests[2].state = State::Reading;
        requests[2].posted_ms = 5_000;
        assert!(!transfer_stuck(&requests, 34_999, 30_000));
        assert!(transfer_stuck(&requests, 35_000, 30_000));
        requests[2].state = State::Abandoned;
        assert!(!transfer_stuck(&requests, 99_000, 30_000));
    }

    fn post_failed(index: usize) -> RdmaError {
        RdmaError::PostSend {
            source: io::Error::from_raw_os_error(libc::ENOMEM),
            index,
        }
    }

    #[test]
    fn a_buffer_an_rdma_write_may_read_is_held_after_a_failed_post() {
        // The SEND failed after the WRITE was posted.
        assert_eq!(
            after_failed_post(true, &post_failed(1)),
            AfterFailedPost::Hold
        );
        // Index 0 is also what a provider that names no failing request gets.
        assert_eq!(
            after_failed_post(true, &post_failed(0)),
            AfterFailedPost::Hold
        );
        let other = RdmaError::PostRecv {
            source: io::Error::from_raw_os_error(libc::EINVAL),
            index: 0,
        };
        assert_eq!(after_failed_post(true, &other), AfterFailedPost::Hold);
    }

    #[test]
    fn a_buffer_no_posted_request_reads_is_released_after_a_failed_post() {
        let refused = RdmaError::InvalidArgument("too many scatter entries");
        assert_eq!(after_failed_post(true, &refused), AfterFailedPost::Release);
        // A lone SEND reads the response region only, never the data buffer.
        assert_eq!(
            after_failed_post(false, &post_failed(0)),
            AfterFailedPost::Release
        );
    }

    #[test]
    fn a_failed_chain_of_several_responses_holds_exactly_what_may_be_read() {
        // [W0 S0] [S1] [W2 S2] [S3]: the post failed at work request 3 (S1 and W0 S0 went,
        // W2 went, S2 did not).
        let wrs = [2, 1, 2, 1];
        let err = post_failed(4);
        let fates: Vec<_> = (0..4)
            .map(|j| fate_after_failed_post(&wrs, j, &err))
            .collect();
        assert_eq!(
            fates,
            [Fate::Posted, Fate::Posted, Fate::Hold, Fate::Release],
            "index 4 is S2"
        );
        let err = post_failed(3);
        let fates: Vec<_> = (0..4)
            .map(|j| fate_after_failed_post(&wrs, j, &err))
            .collect();
        assert_eq!(
            fates,
            [Fate::Posted, Fate::Posted, Fate::Release, Fate::Release],
            "index 3 is W2: nothing of request 2 went"
        );
        // Index 0 proves nothing: every chain that reads a buffer is held.
        let err = post_failed(0);
        let fates: Vec<_> = (0..4)
            .map(|j| fate_after_failed_post(&wrs, j, &err))
            .collect();
        assert_eq!(
            fates,
            [Fate::Hold, Fate::Release, Fate::Hold, Fate::Release]
        );
        // Refused before the verb: nothing went.
        let err = RdmaError::InvalidArgument("too long");
        assert!((0..4).all(|j| fate_after_failed_post(&wrs, j, &err) == Fate::Release));
    }

    #[test]
    fn qpair_indexes_are_reused_and_end_at_the_maximum() {
        let mut qpairs: Vec<Option<()>> = Vec::new();
        let mut gens = Vec::new();
        assert_eq!(claim_index(&mut qpairs, &mut gens), Some(0));
        qpairs[0] = Some(());
        qpairs.resize(MAX_QPAIRS - 1, Some(()));
        gens.resize(MAX_QPAIRS - 1, 0);
        assert_eq!(claim_index(&mut qpairs, &mut gens), Some(MAX_QPAIRS - 1));
        qpairs[MAX_QPAIRS - 1] = Some(());
        assert_eq!((qpairs.len(), gens.len()), (MAX_QPAIRS, MAX_QPAIRS));
        assert_eq!(
            claim_index(&mut qpairs, &mut gens),
            None,
            "one past the maximum"
        );
        assert_eq!(qpairs.len(), MAX_QPAIRS);
        qpairs[5] = None;
        assert_eq!(
            claim_index(&mut qpairs, &mut gens),
            Some(5),
            "a freed index is reused"
        );
    }
}

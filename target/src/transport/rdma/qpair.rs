//! One RDMA connection on a reactor: its QP, its request slots and response buffers, and the
//! send queue accounting; plus how a poll group hands out qpair indexes.

use std::collections::VecDeque;

use arrayvec::ArrayVec;
use nvmf_common::rdma::{
    CmIdToken, DmaBuf, Payload, RdmaError, SendOp, SendWr, Sge, Verbs, VerbsQp, MAX_CHAIN,
};
use zerocopy::IntoBytes;

use super::read_batch::{read_wr, settle_read};
use super::request::{wr_id, HostData, RdmaRequest, State, WrKind, COVER_SLOT, MAX_QPAIRS};
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

/// Posts the qpair's batched responses, at most [`MAX_CHAIN`] work requests per post (one
/// doorbell each). With `LEAD_READS`, the qpair's queued READs (`read_batch`, fewer than
/// `MAX_CHAIN - 1`) lead the first chain: a turn with both READs and responses on a qpair
/// rings once. (A constant, so the responses-only version, the common one, carries no READ
/// code.) On a failed post the qpair is marked broken, and each request of that chain and
/// every later one meets its [`Fate`]. Returns (doorbells, work requests posted).
///
/// With `DEFER`, a chain's last SEND is signaled only if the chain cannot be deferred (see
/// [`Deferral`]); a deferred chain goes unsignaled whole, and a later chain's signaled SEND
/// frees it. At queue depth 1 that halves the completions a response costs: the reactor's
/// turn for a lone SEND completion goes, and most I/Os take one turn instead of two.
pub(super) fn flush_batch<V: Verbs, const LEAD_READS: bool, const DEFER: bool>(
    qi: usize,
    qp: &mut Qpair<V>,
    now_ms: u64,
    defer: &mut Deferral<'_>,
) -> (u32, u32) {
    let lead = if LEAD_READS { qp.reads.len() } else { 0 };
    debug_assert!(lead + 2 <= MAX_CHAIN);
    let (mut doorbells, mut posted) = (0u32, 0u32);
    let mut next = 0;
    // READs leading the chain being built: `lead` in the first, none after.
    let mut reads = lead;
    while next < qp.batch.len() {
        // One chain: whole responses while they fit after the READs.
        let mut slots = [0u32; MAX_CHAIN];
        let mut counts = [0u32; MAX_CHAIN];
        let (mut n_req, mut n_wr) = (0usize, reads as u32);
        while next < qp.batch.len() {
            let si = qp.batch[next];
            let w = wrs_of(&qp.requests[si as usize]);
            if n_wr + w > MAX_CHAIN as u32 {
                break;
            }
            slots[n_req] = si;
            counts[n_req] = w;
            n_req += 1;
            n_wr += w;
            next += 1;
        }
        // Only the entries this chain uses are built: at one or two requests a chain, filling
        // and zeroing all MAX_CHAIN of each array cost more than the requests themselves.
        // `ArrayVec`s: a push is a bound check and a store (a `SmallVec` asks each time
        // whether it spilled). The chain fits by construction: at most `MAX_CHAIN` WRs.
        let mut rsp_sges: ArrayVec<[Sge; 1], MAX_CHAIN> = ArrayVec::new();
        let mut data_sges: ArrayVec<[Sge; 1], MAX_CHAIN> = ArrayVec::new();
        for &si in &slots[..n_req] {
            let r = &qp.requests[si as usize];
            if let Some(responses) = &mut qp.responses {
                let offset = si as usize * CQE_LEN;
                responses.write_at(offset, r.req.rsp.as_bytes());
                rsp_sges.push([responses
                    .sge(offset, CQE_LEN)
                    .expect("slot inside the region")]);
            }
            data_sges.push([r.data_source_sge().unwrap_or_default()]);
        }
        let mut read_sges: ArrayVec<[Sge; 1], MAX_CHAIN> = ArrayVec::new();
        for &si in &qp.reads[..reads] {
            read_sges.push([qp.requests[si as usize].data_sge().unwrap_or_default()]);
        }
        let (gen, send_with_invalidate) = (qp.gen, qp.send_with_invalidate);
        let small = if DEFER {
            defer.small_buffers(qp, &slots[..n_req])
        } else {
            None
        };
        let deferred = small.is_some();
        let mut chain: ArrayVec<SendWr<'_>, MAX_CHAIN> = ArrayVec::new();
        for (j, &si) in qp.reads[..reads].iter().enumerate() {
            chain.extend(read_wr(qp, qi, si, &read_sges[j]));
        }
        for (j, &count) in counts[..n_req].iter().enumerate() {
            let si = slots[j];
            let host = qp.requests[si as usize].host;
            if let (2, HostData::Keyed { addr, key, .. }) = (count, host) {
                chain.push(
                    SendWr::rdma_write(wr_id(WrKind::Write, gen, qi, si), &data_sges[j], addr, key)
                        .signaled(false),
                );
            }
            // Only the chain's last SEND is signaled, unless deferred. The others carry the
            // unsignaled kind: they complete only with an error (or flushed), which closes
            // the qpair.
            let last = j + 1 == n_req && !deferred;
            let kind = if last { WrKind::Send } else { WrKind::Write };
            let id = wr_id(kind, gen, qi, si);
            // Inline: the post copies the CQE out of the request.
            let payload = if qp.responses.is_none() {
                Payload::Inline(qp.requests[si as usize].req.rsp.as_bytes())
            } else {
                Payload::Sges(&rsp_sges[j])
            };
            let op = match host {
                HostData::Keyed {
                    key,
                    invalidate: true,
                    ..
                } if send_with_invalidate => SendOp::SendWithInvalidate { rkey: key },
                _ => SendOp::Send,
            };
            chain.push(SendWr::new(id, op, payload).signaled(last));
        }
        debug_assert_eq!(chain.len(), n_wr as usize);
        let result = qp.qp.post_send(&chain);
        // The chain borrows the requests (inline responses); they change below.
        drop(chain);
        doorbells += 1;
        match result {
            Ok(()) => {
                // The READs were `Reading` already, their credit and room reserved.
                posted += n_wr;
                for (j, &si) in slots[..n_req].iter().enumerate() {
                    let r = &mut qp.requests[si as usize];
                    r.posted_ms = now_ms;
                    if deferred {
                        // The completion that frees it may be far off: its latency ends here.
                        r.state = State::Sent;
                        defer.latency_ns += defer.now_ns.saturating_sub(r.received_ns);
                        qp.unsignaled.push_back(si);
                    } else if j + 1 < n_req {
                        // Its chain's last SEND, signaled, frees it.
                        r.state = State::Sending;
                        qp.unsignaled.push_back(si);
                    } else {
                        // The signaled one: it frees the uncovered ones before it.
                        r.state = State::Sending;
                        r.covers = (qp.uncovered + j as u32) as u8;
                        qp.signaled += 1;
                    }
                }
                match small {
                    Some(small) => {
                        qp.uncovered += n_req as u32;
                        *defer.budget -= small;
                    }
                    None => qp.uncovered = 0,
                }
            }
            Err(e) => {
                let responses = Responses {
                    slots: &slots[..n_req],
                    counts: &counts[..n_req],
                    deferred,
                };
                settle_failed_chain(qp, reads, &responses, next, &e, now_ms);
                break;
            }
        }
        reads = 0;
    }
    qp.batch.clear();
    if lead > 0 {
        qp.reads.clear();
    }
    (doorbells, posted)
}

/// The responses of a chain: their slots and work request counts, in chain order, and
/// whether its last SEND went unsignaled.
struct Responses<'a> {
    slots: &'a [u32],
    counts: &'a [u32],
    deferred: bool,
}

/// Whether a flush may leave a chain's last SEND unsignaled (defer it), and what the ones
/// it did cost. Deferring holds a response's slot and buffer until a later SEND of its
/// qpair completes, which an idle host may put off for ever. So only a few are deferred per
/// qpair (`Qpair::max_deferred`), holding no buffer but small ones within the device's budget
/// (a large buffer or a capsule buffer, shared by every host's receives, is never held that
/// way), and none while one of the qpair's requests waits for a READ or its share of
/// buffers: they need the resources back now. (The poll group defers nothing in a turn
/// where requests wait for buffers or send room, or many qpairs post.)
pub(super) struct Deferral<'a> {
    /// Small buffers deferred responses may still take on the qpair's device: each `Sent`
    /// request holding one counts until it is released ([`deferred_released`]).
    pub budget: &'a mut u32,
    /// The core's clock (ns).
    pub now_ns: u64,
    /// Latency (capsule to post, ns) of the responses this flush posted unsignaled.
    pub latency_ns: u64,
}

impl Deferral<'_> {
    /// Whether the chain of responses in `slots` may end unsignaled: `Some(small buffers
    /// they hold)` if so.
    #[inline]
    fn small_buffers<V: Verbs>(&self, qp: &Qpair<V>, slots: &[u32]) -> Option<u32> {
        // Slots are twice the host's queue depth (`slots_for`): one depth for the commands it
        // may have out, the other for responses it has seen before we freed them. Deferred
        // ones are of the second kind, so they and every other response posted and not
        // freed yet (`unsignaled`, and the signaled chains and READs in flight) stay within
        // half a depth, leaving the rest to completions not reaped yet; and the host's own
        // depth must be free when they are deferred.
        let depth = qp.requests.len() / 2;
        if qp.uncovered + slots.len() as u32 > qp.max_deferred
            || qp.unsignaled.len() + qp.signaled as usize + slots.len() > depth / 2
            || qp.acct.free.len() <= depth
            || !qp.awaiting_read.is_empty()
            || qp.acct.parked() > 0
        {
            return None;
        }
        let mut small = 0;
        for &si in slots {
            match qp.requests[si as usize].buf_class {
                None => {}
                Some(0) => small += 1,
                Some(_) => return None,
            }
        }
        (small <= *self.budget).then_some(small)
    }
}

/// A cover in flight: when it was posted (the core's ms; the transfer timeout runs from
/// there) and how many deferred responses, the oldest of `unsignaled`, it frees.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cover {
    pub posted_ms: u64,
    pub covers: u32,
}

/// Covers the deferred responses of a qpair that went idle: a signaled RDMA WRITE of zero
/// bytes, whose completion (send queue completions come in order) frees them, and which
/// the transfer timeout watches like any SEND, so a host that stopped receiving behind
/// them is still cut off. Zero bytes touch no host memory, and a zero-length RDMA
/// operation's R_Key is not checked (InfiniBand C9-88, RoCE included; iWARP promises no
/// such thing, so its qpairs defer nothing). False if the send queue has no room (a post
/// waiting for room will be signaled anyway) or the post failed (the qpair is broken).
pub(super) fn post_cover<V: Verbs>(qi: usize, qp: &mut Qpair<V>, now_ms: u64) -> bool {
    if qp.sq_used >= qp.sq_capacity || qp.broken {
        return false;
    }
    let wr = SendWr::rdma_write(wr_id(WrKind::Send, qp.gen, qi, COVER_SLOT), &[], 0, 0);
    if let Err(e) = qp.qp.post_send(&[wr]) {
        tracing::warn!(peer = %qp.state.peer, "posting a cover failed: {e}; closing qpair");
        qp.broken = true;
        return false;
    }
    qp.sq_used += 1;
    qp.signaled += 1;
    qp.cover = Some(Cover {
        posted_ms: now_ms,
        covers: qp.uncovered,
    });
    qp.uncovered = 0;
    true
}

/// Whether the qpair's deferred responses wait for a cover: some are uncovered, none is in
/// flight, and the newest went out at least `idle_ms` ago (a qpair still busy covers them
/// with its next signaled SEND).
pub(super) fn needs_cover<V: Verbs>(qp: &Qpair<V>, now_ms: u64, idle_ms: u64) -> bool {
    qp.uncovered > 0
        && qp.cover.is_none()
        && qp
            .unsignaled
            .back()
            .is_some_and(|&s| now_ms.saturating_sub(qp.requests[s as usize].posted_ms) >= idle_ms)
}

/// What a deferred (`Sent`) request gives back to its device's deferral budget when it is
/// released: 1 if it holds a small buffer.
#[inline]
pub(super) fn deferred_released(r: &RdmaRequest) -> u32 {
    u32::from(r.state == State::Sent && r.buf_class == Some(0))
}

/// The qpair is broken: the chain of the qpair's first `reads` queued READs and then
/// `responses` failed to post with `err`. Each of its requests meets its [`Fate`], and every
/// response batched after it (from `next` on) is released unposted.
#[cold]
#[inline(never)]
fn settle_failed_chain<V: Verbs>(
    qp: &mut Qpair<V>,
    reads: usize,
    responses: &Responses<'_>,
    next: usize,
    err: &RdmaError,
    now_ms: u64,
) {
    tracing::warn!(peer = %qp.state.peer, "posting responses failed: {err}; closing qpair");
    qp.broken = true;
    // Work requests per request of the whole chain: one per READ, then the responses'.
    let mut counts = [1u32; MAX_CHAIN];
    let n = reads + responses.slots.len();
    counts[reads..n].copy_from_slice(responses.counts);
    let counts = &counts[..n];
    for j in 0..reads {
        let fate = fate_in_failed_chain(counts, j, err, true);
        settle_read(qp, qp.reads[j], fate);
    }
    for (k, &si) in responses.slots.iter().enumerate() {
        let j = reads + k;
        let r = &mut qp.requests[si as usize];
        match fate_after_failed_post(counts, j, err) {
            // The chain's signaled SEND did not go (or it had none): no completion will come
            // for the unsignaled ones that did, so they keep what the NIC may read until the
            // QP is destroyed.
            Fate::Posted if j + 1 < n || responses.deferred => r.state = State::Abandoned,
            Fate::Posted => {
                r.state = State::Sending;
                r.posted_ms = now_ms;
                r.covers = 0;
                qp.signaled += 1;
            }
            Fate::Hold => r.state = State::Abandoned,
            Fate::Release => {
                qp.sq_used -= counts[j];
                release(&mut qp.acct, r);
            }
        }
    }
    // Nothing after the failed chain is posted.
    for &si in &qp.batch[next..] {
        let r = &mut qp.requests[si as usize];
        qp.sq_used -= wrs_of(r);
        release(&mut qp.acct, r);
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

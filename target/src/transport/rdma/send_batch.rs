//! Posting a qpair's batched responses at the end of a turn: chains of at most `MAX_CHAIN`
//! work requests (one doorbell each), the turn's RDMA READs leading the first; deferred
//! (unsignaled) chains and the covers that free them when the qpair goes idle; and what a
//! chain whose post failed leaves behind.

use arrayvec::ArrayVec;
use nvmf_common::rdma::{Payload, RdmaError, SendOp, SendWr, Sge, Verbs, VerbsQp, MAX_CHAIN};
use zerocopy::IntoBytes;

use super::qpair::{
    fate_after_failed_post, fate_in_failed_chain, release, wrs_of, Fate, Qpair, CQE_LEN,
};
use super::read_batch::{read_wr, settle_read};
use super::request::{wr_id, HostData, RdmaRequest, State, WrKind, COVER_SLOT};

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
                // The host may send a command for each response it will see.
                qp.backlog.answered(n_req as u32);
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

//! RDMA READs of host data, batched per qpair and turn as responses are: a request whose
//! keyed data must be fetched reserves its read credit and send queue room at once and joins
//! its qpair's read list; the poll group posts the list when it flushes the turn's work, at
//! the head of the qpair's response chain (`qpair::flush_batch`), or as a chain of its own
//! when there are no responses or too many READs. A host writing at queue depth then costs
//! one doorbell per qpair and turn, not one per command (on soft-RoCE every doorbell is a
//! system call that builds the packets).

use arrayvec::ArrayVec;
use nvmf_common::rdma::{RdmaError, SendWr, Sge, Verbs, VerbsQp, MAX_CHAIN};

use super::qpair::{fate_in_failed_chain, release, Fate, Qpair};
use super::request::{wr_id, HostData, State, WrKind};

/// Reserves request `si`'s read credit and send queue room and queues its RDMA READ for
/// this turn's post (the caller checked both are available). Returns whether the qpair had
/// nothing waiting to be posted before (it must join the poll group's flush list).
pub(super) fn queue_read<V: Verbs>(qp: &mut Qpair<V>, si: u32, now_ms: u64) -> bool {
    debug_assert!(matches!(
        qp.requests[si as usize].host,
        HostData::Keyed { .. }
    ));
    let first = qp.reads.is_empty() && qp.batch.is_empty();
    qp.sq_used += 1;
    qp.signaled += 1;
    qp.reads_in_flight += 1;
    qp.requests[si as usize].posted_ms = now_ms;
    qp.reads.push(si);
    first
}

/// Posts the qpair's queued READs, at most [`MAX_CHAIN`] per post (one doorbell each),
/// every one signaled (its completion starts its command). On a failed post the qpair is
/// marked broken (the poll group closes it) and each READ of that chain and every later one
/// meets its [`Fate`]. Returns (doorbells, work requests posted).
pub(super) fn flush_reads<V: Verbs>(qi: usize, qp: &mut Qpair<V>) -> (u32, u32) {
    let (mut doorbells, mut posted) = (0u32, 0u32);
    let mut next = 0;
    while next < qp.reads.len() {
        let end = (next + MAX_CHAIN).min(qp.reads.len());
        let result = if end - next == 1 {
            // One READ (a queue at depth 1, or one command per turn): no chain to build.
            let si = qp.reads[next];
            let sge = [qp.requests[si as usize].data_sge().unwrap_or_default()];
            match read_wr(qp, qi, si, &sge) {
                Some(wr) => qp.qp.post_send(&[wr]),
                None => Ok(()),
            }
        } else {
            let slots = &qp.reads[next..end];
            // A plain array: cheaper to fill than a vector to extend, at a handful of READs.
            let mut sges = [[Sge::default(); 1]; MAX_CHAIN];
            for (sge, &si) in sges.iter_mut().zip(slots) {
                *sge = [qp.requests[si as usize].data_sge().unwrap_or_default()];
            }
            let mut chain: ArrayVec<SendWr<'_>, MAX_CHAIN> = ArrayVec::new();
            for (j, &si) in slots.iter().enumerate() {
                chain.extend(read_wr(qp, qi, si, &sges[j]));
            }
            qp.qp.post_send(&chain)
        };
        doorbells += 1;
        match result {
            Ok(()) => {
                posted += (end - next) as u32;
                next = end;
            }
            Err(e) => {
                tracing::warn!(peer = %qp.state.peer, "posting RDMA READs failed: {e}; closing qpair");
                qp.broken = true;
                settle_failed(qp, next, end, &e);
                break;
            }
        }
    }
    qp.reads.clear();
    (doorbells, posted)
}

/// The RDMA READ of request `si`'s keyed data into `sge` (only keyed requests are queued).
#[inline]
pub(super) fn read_wr<'a, V: Verbs>(
    qp: &Qpair<V>,
    qi: usize,
    si: u32,
    sge: &'a [Sge; 1],
) -> Option<SendWr<'a>> {
    match qp.requests[si as usize].host {
        HostData::Keyed { addr, key, .. } => Some(SendWr::rdma_read(
            wr_id(WrKind::Read, qp.gen, qi, si),
            sge,
            addr,
            key,
        )),
        _ => None,
    }
}

/// The queued READs from `next` on, after the chain `next..end` failed to post with `err`:
/// each of the chain meets its [`Fate`] (a READ is one work request, writing into its
/// buffer), every later one is released.
fn settle_failed<V: Verbs>(qp: &mut Qpair<V>, next: usize, end: usize, err: &RdmaError) {
    let ones = [1u32; MAX_CHAIN];
    for k in next..qp.reads.len() {
        let fate = if k < end {
            read_fate(&ones[..end - next], k - next, err)
        } else {
            Fate::Release
        };
        settle_read(qp, qp.reads[k], fate);
    }
}

/// What a queued READ of request `si` becomes after a failed post: posted, it completes
/// (flushed) as any other; perhaps posted, its buffer is held until the QP is destroyed;
/// not posted, it gives back its credit and room and is released.
pub(super) fn settle_read<V: Verbs>(qp: &mut Qpair<V>, si: u32, fate: Fate) {
    let si = si as usize;
    match fate {
        Fate::Posted => {}
        Fate::Hold => qp.requests[si].state = State::Abandoned,
        Fate::Release => {
            unreserve(qp);
            release(&mut qp.acct, &mut qp.requests[si]);
        }
    }
}

/// The qpair is closing before its queued READs were posted: they give back what they
/// reserved and their requests are released.
pub(super) fn drop_queued_reads<V: Verbs>(qp: &mut Qpair<V>) {
    while let Some(si) = qp.reads.pop() {
        unreserve(qp);
        release(&mut qp.acct, &mut qp.requests[si as usize]);
    }
}

/// READ `j` of a failed chain of `chain.len()` READs: one work request each, on its buffer.
fn read_fate(chain: &[u32], j: usize, err: &RdmaError) -> Fate {
    fate_in_failed_chain(chain, j, err, true)
}

fn unreserve<V: Verbs>(qp: &mut Qpair<V>) {
    qp.sq_used -= 1;
    qp.signaled -= 1;
    qp.reads_in_flight -= 1;
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn post_send(index: usize) -> RdmaError {
        RdmaError::PostSend {
            index,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        }
    }

    #[test]
    fn a_failed_read_chain_releases_only_what_was_proven_unposted() {
        // The provider says the first two went.
        let e = post_send(2);
        let chain = [1u32; 4];
        let fates: Vec<_> = (0..4).map(|j| read_fate(&chain, j, &e)).collect();
        assert_eq!(
            fates,
            [Fate::Posted, Fate::Posted, Fate::Release, Fate::Release]
        );
        // Index 0 proves nothing: every READ may be writing into its buffer.
        let e = post_send(0);
        assert!((0..4).all(|j| read_fate(&chain, j, &e) == Fate::Hold));
        // Refused before the verb: nothing went.
        let e = RdmaError::InvalidArgument("too many SGEs");
        assert!((0..4).all(|j| read_fate(&chain, j, &e) == Fate::Release));
    }
}

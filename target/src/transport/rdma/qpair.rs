//! One RDMA connection on a reactor: its QP, its request slots and response buffers, and the
//! send queue accounting; plus how a poll group hands out qpair indexes.

use nvmf_common::rdma::{CmIdToken, DmaBuf, RdmaError, SendWr, Sge, Verbs, VerbsQp};
use zerocopy::IntoBytes;

use super::request::{wr_id, HostData, RdmaRequest, State, WrKind, MAX_QPAIRS};
use super::wait_queue::RequestSlots;
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
    pub responses: DmaBuf<V>,
    pub sq_capacity: u32,
    /// CQ entries reserved for this QP's sends on its device.
    pub cq_share: u32,
    /// Data buffers its requests hold, per class (small, large): at most the device's
    /// per-qpair share each.
    pub held: [u32; 2],
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
    {
        2
    } else {
        1
    }
}

/// Returns a request slot to the free state; its data buffer goes back to the pool. Takes
/// the buffer off its qpair's `held` count.
pub(super) fn release(held: &mut [u32; 2], r: &mut RdmaRequest) {
    r.req.data = None;
    r.state = State::Free;
    if let Some(c) = r.buf_class.take() {
        held[usize::from(c)] -= 1;
    }
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

/// How an attempt to post a response went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendOutcome {
    /// Posted; the request is `Sending`.
    Posted,
    /// No send queue room; the request stays `NeedSend`, queued.
    NoRoom,
    /// Not posted: the qpair is broken (now, or by an earlier post). The request is left to
    /// the qpair's close: `Abandoned` or `Free` after this post failed, `NeedSend` if the
    /// qpair was already broken (start_close releases those).
    Failed,
}

/// Posts the response (and the read data before it) if the send queue has room.
pub(super) fn try_send<V: Verbs>(
    qi: usize,
    qp: &mut Qpair<V>,
    si: u32,
    now_ms: u64,
) -> SendOutcome {
    if qp.broken {
        return SendOutcome::Failed;
    }
    let r = &mut qp.requests[si as usize];
    let wrs = wrs_of(r);
    if qp.sq_used + wrs > qp.sq_capacity {
        return SendOutcome::NoRoom;
    }
    let cqe_offset = si as usize * CQE_LEN;
    qp.responses.write_at(cqe_offset, r.req.rsp.as_bytes());
    let rsp_sge = [qp
        .responses
        .sge(cqe_offset, CQE_LEN)
        .expect("slot inside the region")];
    let send_id = wr_id(WrKind::Send, qp.gen, qi, si);
    let send = match r.host {
        HostData::Keyed {
            key,
            invalidate: true,
            ..
        } if qp.send_with_invalidate => SendWr::send_with_invalidate(send_id, &rsp_sge, key),
        _ => SendWr::send(send_id, &rsp_sge),
    };
    let data_sge: [Sge; 1] = [r.data_sge().unwrap_or_default()];
    let (writes_data, result) = match (wrs, r.host) {
        (2, HostData::Keyed { addr, key, .. }) => {
            let write =
                SendWr::rdma_write(wr_id(WrKind::Write, qp.gen, qi, si), &data_sge, addr, key)
                    .signaled(false);
            (true, qp.qp.post_send(&[write, send]))
        }
        _ => (false, qp.qp.post_send(&[send])),
    };
    match result {
        Ok(()) => {
            qp.sq_used += wrs;
            qp.signaled += 1;
            r.state = State::Sending;
            r.posted_ms = now_ms;
            SendOutcome::Posted
        }
        Err(e) => {
            tracing::warn!(peer = %qp.state.peer, "posting the response failed: {e}; closing qpair");
            qp.broken = true;
            match after_failed_post(writes_data, &e) {
                AfterFailedPost::Release => release(&mut qp.held, r),
                AfterFailedPost::Hold => r.state = State::Abandoned,
            }
            SendOutcome::Failed
        }
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

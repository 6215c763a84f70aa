//! An RDMA request: the core's request, the shared driver's state (`core::driver`, where the
//! state machine and its diagram live), and what only RDMA needs: where the host's data is
//! (keyed SGL or in-capsule), the capsule buffer, timestamps and the buffer class it holds;
//! plus the work request ids and core tags that name it.
//!
//! The RDMA transport's steps (`steps.rs`) wait in FIFOs: `NeedBuffer` in the poll group's for
//! the data buffer pool (per class, within the qpair's share), `NeedRead` in its qpair's for a
//! free RDMA READ slot (the initiator depth the host granted) and send queue room, `NeedSend`
//! in the poll group's for send queue room. A response with data to the host goes out as RDMA WRITE + SEND; the WRITE is
//! unsignaled, its slot is reclaimed with the SEND's completion. `Batched` responses of a
//! qpair go out in one chain per turn (SPDK's per-qpair send batching), one doorbell for many,
//! and only the chain's last SEND is signaled: send queue completions come in order, so its
//! completion proves the whole chain done and frees every request of it (one completion per
//! chain, not per response). In a turn that posts to few qpairs even that SEND may go
//! unsignaled (`Sent`, deferred: `qpair::Deferral`), so a host at queue depth 1 costs one
//! completion per command, its receive; a later signaled SEND of the qpair frees the deferred
//! ones, or, if the qpair goes idle, a zero-length RDMA WRITE posted at the next tick
//! (`qpair::post_cover`). No response is ever left without a completion to come.
//!
//! A response whose post fails is `Abandoned` if an RDMA WRITE from its buffer may have been
//! posted (see `qpair::after_failed_post`), and its qpair is closed.
//!
//! `Reading` and `Sending` wait for the host's side of the wire. A host that stops posting
//! receives leaves a SEND retrying for ever (RNR retry count 7); a request in either state
//! longer than the core's transfer timeout closes its qpair, which flushes the work requests
//! and frees their buffers.

use nvmf_common::buffer::IoBuf;
use nvmf_common::rdma::Sge;

use crate::core::request::Request;

/// The request states are the core driver's ([`ReqState`](crate::core::driver::ReqState)).
pub use crate::core::driver::ReqState as State;

/// Where the host's data for this command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostData {
    None,
    /// Host memory behind a keyed SGL.
    Keyed {
        addr: u64,
        key: u32,
        invalidate: bool,
    },
    /// In the receive buffer that carried the capsule, `offset` bytes after the SQE.
    InCapsule {
        offset: u32,
        len: u32,
    },
}

pub struct RdmaRequest {
    pub state: State,
    pub req: Request,
    pub host: HostData,
    /// The capsule buffer that carried in-capsule data the request could not execute from
    /// directly (an offset, or its qpair's share of capsule buffers used up): copied to a
    /// pool buffer, then dropped.
    pub capsule: Option<IoBuf>,
    /// This request's index in its qpair's slots.
    pub slot: u32,
    /// Bytes the receive actually carried after the SQE (bounds in-capsule SGLs).
    pub received_data: u32,
    /// When the RDMA READ or the response (`Reading`, `Sending`) was posted, in the core's
    /// milliseconds: a transfer the host does not complete within the core's transfer
    /// timeout closes the qpair.
    pub posted_ms: u64,
    /// The class (0 small, 1 large, 2 capsule) of the data buffer this request holds, counted
    /// in its qpair's `held` until the request is released.
    pub buf_class: Option<u8>,
    /// The requests posted before this one in its chain, unsignaled: this request's SEND is
    /// the chain's only signaled work request, and its completion frees them too.
    pub covers: u8,
    /// When its capsule arrived (the core's clock, ns): `request_latency` runs from here to
    /// the response's completion.
    pub received_ns: u64,
}

impl RdmaRequest {
    pub fn new(req: Request) -> Self {
        Self {
            state: State::Free,
            req,
            host: HostData::None,
            capsule: None,
            slot: 0,
            received_data: 0,
            posted_ms: 0,
            buf_class: None,
            covers: 0,
            received_ns: 0,
        }
    }

    /// The data buffer as a scatter entry the NIC may write (an RDMA READ's destination).
    pub fn data_sge(&self) -> Option<Sge> {
        self.req.data.as_ref().map(|b| Sge {
            addr: b.addr(),
            length: b.len() as u32,
            lkey: b.lkey(),
        })
    }

    /// The data buffer as a scatter entry the NIC only reads (an RDMA WRITE's source): keeps
    /// what the buffer knows of its zeroes (`IoBuf::zero_fill`).
    pub fn data_source_sge(&self) -> Option<Sge> {
        self.req.data.as_ref().map(|b| Sge {
            addr: b.source_addr(),
            length: b.len() as u32,
            lkey: b.lkey(),
        })
    }
}

/// Work request ids: what completed, on which qpair incarnation, for which slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrKind {
    Recv = 0,
    Send = 1,
    Read = 2,
    Write = 3,
}

/// Bits of the qpair index in a work request id ([`wr_id`]).
pub const WR_QPAIR_BITS: u32 = 22;
/// Bits of the qpair index in a core tag ([`tag_slot`]).
pub const TAG_QPAIR_BITS: u32 = 16;

/// Qpair indexes one poll group may hand out: every index below it has its own work request
/// ids and core tags. One past it, both encodings would wrap to index 0 and a completion or a
/// wakeup would land on another connection's request.
pub const MAX_QPAIRS: usize = 1 << min(WR_QPAIR_BITS, TAG_QPAIR_BITS);
const _: () = assert!(MAX_QPAIRS <= 1 << WR_QPAIR_BITS && MAX_QPAIRS <= 1 << TAG_QPAIR_BITS);

const fn min(a: u32, b: u32) -> u32 {
    if a < b {
        a
    } else {
        b
    }
}

/// Responses a qpair may leave unsignaled past the end of their chain (`Sent`, waiting for a
/// later SEND's completion to free them): a lone response per turn (a host at queue depth 1)
/// then costs no completion of its own. Bounded, so the slots they keep are few and a later
/// signaled SEND always comes before the send queue fills; see `qpair::flush_batch`. A
/// qpair that goes idle with some is covered at the next tick (`qpair::post_cover`).
pub const DEFERRED_SENDS: u32 = 16;

/// Request slots a qpair can have: twice the largest queue depth a host can ask for (a `u16`),
/// see [`slots_for`].
pub const MAX_SLOTS: u32 = 2 * (u16::MAX as u32 + 1);

/// Slot id of the marker SEND posted after a qpair enters the error state: its flush
/// completion arrives after every earlier send-queue completion. It must never name a real
/// slot, or the marker's completion would release a request still on the wire.
pub const DRAIN_SLOT: u32 = u32::MAX;
/// Slot id of the signaled zero-length RDMA WRITE that covers an idle qpair's deferred
/// responses (`qpair::post_cover`). Never a real slot either.
pub const COVER_SLOT: u32 = u32::MAX - 1;
const _: () = assert!(MAX_SLOTS < COVER_SLOT && COVER_SLOT < DRAIN_SLOT);

/// Request slots for a queue of `depth` entries: twice the depth, because a host may reuse a
/// slot as soon as it sees our response, before we reaped the SEND's completion (or while
/// it is deferred: a qpair defers only while more than half its slots are free). A command
/// that still finds none waits for one (`backlog`). Always below [`MAX_SLOTS`], so never
/// [`DRAIN_SLOT`].
pub fn slots_for(depth: u16) -> u32 {
    u32::from(depth) * 2
}

const WR_QPAIR_MASK: u64 = (1 << WR_QPAIR_BITS) - 1;
const TAG_QPAIR_MASK: u64 = (1 << TAG_QPAIR_BITS) - 1;

/// `kind` (2 bits) | qpair generation (8) | qpair index ([`WR_QPAIR_BITS`]) | slot (32).
/// Receives carry only the receive buffer index.
pub fn wr_id(kind: WrKind, gen: u8, qpair: usize, slot: u32) -> u64 {
    debug_assert!(
        qpair < MAX_QPAIRS,
        "qpair index {qpair} has no id of its own"
    );
    ((kind as u64) << 62)
        | (u64::from(gen) << 54)
        | (((qpair as u64) & WR_QPAIR_MASK) << 32)
        | u64::from(slot)
}

pub fn parse_wr_id(id: u64) -> (WrKind, u8, usize, u32) {
    let kind = match id >> 62 {
        0 => WrKind::Recv,
        1 => WrKind::Send,
        2 => WrKind::Read,
        _ => WrKind::Write,
    };
    (
        kind,
        (id >> 54) as u8,
        ((id >> 32) & WR_QPAIR_MASK) as usize,
        id as u32,
    )
}

/// The slot id a request's core tag carries: qpair generation (8 bits), index
/// ([`TAG_QPAIR_BITS`]) and slot (32), so a wakeup for a request of a qpair that is gone (or
/// whose index was reused) is recognised.
pub fn tag_slot(gen: u8, qpair: usize, slot: u32) -> u64 {
    debug_assert!(
        qpair < MAX_QPAIRS,
        "qpair index {qpair} has no tag of its own"
    );
    (u64::from(gen) << 48) | (((qpair as u64) & TAG_QPAIR_MASK) << 32) | u64::from(slot)
}

pub fn parse_tag_slot(s: u64) -> (u8, usize, u32) {
    (
        (s >> 48) as u8,
        ((s >> 32) & TAG_QPAIR_MASK) as usize,
        s as u32,
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn ids_round_trip() {
        for kind in [WrKind::Recv, WrKind::Send, WrKind::Read, WrKind::Write] {
            let id = wr_id(kind, 200, 12345, 0xDEAD_BEEF);
            assert_eq!(parse_wr_id(id), (kind, 200, 12345, 0xDEAD_BEEF));
        }
        assert_eq!(parse_tag_slot(tag_slot(7, 513, 99)), (7, 513, 99));
    }

    #[test]
    fn every_qpair_index_up_to_the_maximum_has_its_own_ids() {
        let last = MAX_QPAIRS - 1;
        assert_eq!(parse_tag_slot(tag_slot(255, last, 7)), (255, last, 7));
        assert_eq!(
            parse_wr_id(wr_id(WrKind::Read, 255, last, 7)),
            (WrKind::Read, 255, last, 7)
        );
        let tags: HashSet<u64> = (0..MAX_QPAIRS).map(|qi| tag_slot(3, qi, 9)).collect();
        let wrs: HashSet<u64> = (0..MAX_QPAIRS)
            .map(|qi| wr_id(WrKind::Send, 3, qi, 9))
            .collect();
        assert_eq!(tags.len(), MAX_QPAIRS);
        assert_eq!(wrs.len(), MAX_QPAIRS);
    }

    #[test]
    fn no_queue_depth_gives_a_slot_that_is_the_drain_marker() {
        // Slots are numbered below `slots_for(depth)`, so below MAX_SLOTS and DRAIN_SLOT.
        assert_eq!(slots_for(u16::MAX), 131_070);
        assert!(slots_for(u16::MAX) <= MAX_SLOTS);
    }
}

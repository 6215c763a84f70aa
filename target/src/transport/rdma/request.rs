//! The RDMA request path as an explicit state machine (NVMe-oF 1.1, 7.3 RDMA transport).
//!
//! ```text
//!  Free ──capsule──► prepare ─┬─ Complete ──────────────────────────────► NeedSend
//!                             ├─ NoData ───────────────────────────────► Executing
//!                             └─ Data ──► NeedBuffer ─┬─ in-capsule copy ─► Executing
//!                                                     ├─ to host ─────────► Executing
//!                                                     └─ keyed write ──► NeedRead ─► Reading ─► Executing
//!  Executing ──Complete (now or by wakeup)──► NeedSend ──► Sending ──SEND completion──► Free
//! ```
//!
//! Each wait for a resource is a state plus a FIFO in the poll group, never a failure:
//! `NeedBuffer` waits for the data buffer pool, `NeedRead` for a free RDMA READ slot (the
//! initiator depth the host granted) and send queue room, `NeedSend` for send queue room.
//! A response with data to the host goes out as RDMA WRITE + SEND in one post; the WRITE is
//! unsignaled, its slot is reclaimed with the SEND's completion.
//!
//! `Reading` and `Sending` wait for the host's side of the wire. A host that stops posting
//! receives leaves a SEND retrying for ever (RNR retry count 7); a request in either state
//! longer than the core's transfer timeout closes its qpair, which flushes the work requests
//! and frees their buffers.

use nvmf_common::rdma::Sge;

use crate::core::request::Request;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Slot unused.
    Free,
    /// Parsed; waiting for a data buffer from the pool.
    NeedBuffer,
    /// Has a buffer; waiting for an RDMA READ slot and send queue room to fetch host data.
    NeedRead,
    /// RDMA READ of the host's data posted; waiting for its completion.
    Reading,
    /// Handed to the core; waiting for `Exec::Complete` or a wakeup.
    Executing,
    /// Response ready; waiting for send queue room.
    NeedSend,
    /// RDMA WRITE (if any) and SEND posted; waiting for the SEND's completion.
    Sending,
}

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
    /// The receive buffer the capsule arrived in, held until its in-capsule data is copied.
    pub recv: Option<u32>,
    /// Bytes the receive actually carried after the SQE (bounds in-capsule SGLs).
    pub received_data: u32,
    /// When the RDMA READ or the response (`Reading`, `Sending`) was posted, in the core's
    /// milliseconds: a transfer the host does not complete within the core's transfer
    /// timeout closes the qpair.
    pub posted_ms: u64,
}

impl RdmaRequest {
    pub fn new(req: Request) -> Self {
        Self {
            state: State::Free,
            req,
            host: HostData::None,
            recv: None,
            received_data: 0,
            posted_ms: 0,
        }
    }

    pub fn data_sge(&self) -> Option<Sge> {
        self.req.data.as_ref().map(|b| Sge {
            addr: b.addr(),
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

/// `kind` (2 bits) | qpair generation (8) | qpair index (22) | slot (32). Receives carry only
/// the receive buffer index.
pub fn wr_id(kind: WrKind, gen: u8, qpair: usize, slot: u32) -> u64 {
    ((kind as u64) << 62)
        | (u64::from(gen) << 54)
        | (((qpair as u64) & 0x3F_FFFF) << 32)
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
        ((id >> 32) & 0x3F_FFFF) as usize,
        id as u32,
    )
}

/// The slot id a request's core tag carries: qpair generation, index and slot, so a wakeup
/// for a request of a qpair that is gone (or whose index was reused) is recognised.
pub fn tag_slot(gen: u8, qpair: usize, slot: u32) -> u64 {
    (u64::from(gen) << 48) | (((qpair as u64) & 0xFFFF) << 32) | u64::from(slot)
}

pub fn parse_tag_slot(s: u64) -> (u8, usize, u32) {
    ((s >> 48) as u8, ((s >> 32) & 0xFFFF) as usize, s as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for kind in [WrKind::Recv, WrKind::Send, WrKind::Read, WrKind::Write] {
            let id = wr_id(kind, 200, 12345, 0xDEAD_BEEF);
            assert_eq!(parse_wr_id(id), (kind, 200, 12345, 0xDEAD_BEEF));
        }
        assert_eq!(parse_tag_slot(tag_slot(7, 513, 99)), (7, 513, 99));
    }
}

//! RDMA_CM private data of the NVMe-oF RDMA transport binding (NVMe-oF 1.1, 7.3.1 "RDMA
//! Connection Management"): what a host puts in its connect request, and what the target puts
//! in the accept or reject.

use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The only record format defined.
pub const RDMA_CM_RECFMT: u16 = 0;

/// RDMA_CM_REQUEST private data (NVMe-oF 1.1, Figure 50).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Default,
    Debug,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
pub struct RdmaCmRequest {
    pub recfmt: U16,
    pub qid: U16,
    /// Host receive queue size: how many responses the host can take at once (one-based).
    pub hrqsize: U16,
    /// Host send queue size: the SQ size the Connect command will ask for, one-based here
    /// while the Connect SQSIZE is zero-based.
    pub hsqsize: U16,
    /// Controller id for I/O queues; FFFFh when unused. Linux hosts leave it zero (reserved).
    pub cntlid: U16,
    pub rsvd10: [u8; 22],
}
const _: () = assert!(core::mem::size_of::<RdmaCmRequest>() == 32);

/// RDMA_CM_ACCEPT private data (NVMe-oF 1.1, Figure 51).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Default,
    Debug,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
pub struct RdmaCmAccept {
    pub recfmt: U16,
    /// Controller receive queue size: how many commands the target can take at once.
    pub crqsize: U16,
    pub rsvd4: [u8; 28],
}
const _: () = assert!(core::mem::size_of::<RdmaCmAccept>() == 32);

/// RDMA_CM_REJECT private data (NVMe-oF 1.1, Figure 52).
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Default,
    Debug,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
pub struct RdmaCmReject {
    pub recfmt: U16,
    pub sts: U16,
}
const _: () = assert!(core::mem::size_of::<RdmaCmReject>() == 4);

open_enum! {
    /// RDMA_CM_REJECT status (NVMe-oF 1.1, Figure 53).
    pub struct RdmaCmRejectStatus(u16) {
        INVALID_PRIVATE_DATA_LENGTH = 0x01,
        INVALID_RECFMT = 0x02,
        INVALID_QID = 0x03,
        INVALID_HSQSIZE = 0x04,
        INVALID_HRQSIZE = 0x05,
        NO_RESOURCES = 0x06,
        INVALID_IRD = 0x07,
        INVALID_ORD = 0x08,
        INVALID_CNTLID = 0x09,
    }
}

impl RdmaCmRequest {
    pub fn new(qid: u16, hrqsize: u16, hsqsize: u16) -> Self {
        Self {
            recfmt: U16::new(RDMA_CM_RECFMT),
            qid: U16::new(qid),
            hrqsize: U16::new(hrqsize),
            hsqsize: U16::new(hsqsize),
            ..Self::default()
        }
    }
}

impl RdmaCmAccept {
    pub fn new(crqsize: u16) -> Self {
        Self {
            recfmt: U16::new(RDMA_CM_RECFMT),
            crqsize: U16::new(crqsize),
            ..Self::default()
        }
    }
}

impl RdmaCmReject {
    pub fn new(sts: RdmaCmRejectStatus) -> Self {
        Self {
            recfmt: U16::new(RDMA_CM_RECFMT),
            sts: U16::new(sts.0),
        }
    }

    pub fn status(&self) -> RdmaCmRejectStatus {
        RdmaCmRejectStatus(self.sts.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layouts() {
        assert_eq!(offset_of!(RdmaCmRequest, qid), 2);
        assert_eq!(offset_of!(RdmaCmRequest, hrqsize), 4);
        assert_eq!(offset_of!(RdmaCmRequest, hsqsize), 6);
        assert_eq!(offset_of!(RdmaCmRequest, cntlid), 8);
        assert_eq!(offset_of!(RdmaCmAccept, crqsize), 2);
        assert_eq!(offset_of!(RdmaCmReject, sts), 2);
        let r = RdmaCmRequest::new(1, 128, 128);
        assert_eq!(&r.as_bytes()[..8], &[0, 0, 1, 0, 128, 0, 128, 0]);
        let parsed = RdmaCmRequest::read_from_prefix(r.as_bytes()).unwrap().0;
        assert_eq!(parsed, r);
        let rej = RdmaCmReject::new(RdmaCmRejectStatus::NO_RESOURCES);
        assert_eq!(rej.as_bytes(), &[0, 0, 6, 0]);
        assert_eq!(format!("{:?}", rej.status()), "NO_RESOURCES");
        assert_eq!(RdmaCmAccept::new(64).as_bytes()[2], 64);
    }
}

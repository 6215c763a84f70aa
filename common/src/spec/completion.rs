//! Completion Queue Entry (NVMe 2.0 base, 4.6 "Completion Queue Entry"). Over fabrics the same
//! 16 bytes travel in the response capsule (NVMe-oF 1.1, 2.2).

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::status::Status;

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
pub struct Completion {
    /// Command specific result (e.g. Connect's CNTLID, a Get Features value, AER info).
    pub dw0: U32,
    /// Command specific; Property Get returns the upper half of an 8-byte value here.
    pub dw1: U32,
    /// Fabrics: the SQ head the controller has consumed up to (for SQ flow control).
    pub sq_head: U16,
    /// Reserved over fabrics (NVMe-oF 1.1, Figure 5).
    pub sq_id: U16,
    pub cid: U16,
    /// Phase tag in bit 0 and the status field above it; see [`Status::to_field`].
    pub status: U16,
}
const _: () = assert!(core::mem::size_of::<Completion>() == 16);

impl Completion {
    pub fn new(cid: u16, status: Status) -> Self {
        let mut c = Self {
            cid: U16::new(cid),
            ..Self::default()
        };
        c.set_status(status);
        c
    }

    pub fn status(&self) -> Status {
        Status::from_field(self.status.get())
    }

    /// Replaces the status and keeps the phase tag.
    pub fn set_status(&mut self, status: Status) {
        self.status = U16::new(status.to_field(self.phase()));
    }

    pub fn phase(&self) -> bool {
        Status::phase_of(self.status.get())
    }

    pub fn set_phase(&mut self, phase: bool) {
        self.status = U16::new((self.status.get() & !1) | phase as u16);
    }

    /// dw0 and dw1 as one 64-bit result (Property Get of an 8-byte property).
    pub fn result64(&self) -> u64 {
        u64::from(self.dw0.get()) | (u64::from(self.dw1.get()) << 32)
    }

    pub fn set_result64(&mut self, v: u64) {
        self.dw0 = U32::new(v as u32);
        self.dw1 = U32::new((v >> 32) as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layout() {
        assert_eq!(offset_of!(Completion, dw0), 0);
        assert_eq!(offset_of!(Completion, dw1), 4);
        assert_eq!(offset_of!(Completion, sq_head), 8);
        assert_eq!(offset_of!(Completion, sq_id), 10);
        assert_eq!(offset_of!(Completion, cid), 12);
        assert_eq!(offset_of!(Completion, status), 14);
    }

    #[test]
    fn status_keeps_phase() {
        let mut c = Completion::new(7, Status::SUCCESS);
        c.set_phase(true);
        c.set_status(Status::INVALID_FIELD.with_dnr());
        assert!(c.phase());
        assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr());
        assert_eq!(
            c.as_bytes()[14..16],
            ((0x02u16 << 1) | (1 << 15) | 1).to_le_bytes()
        );
        c.set_result64(0x1234_5678_9ABC_DEF0);
        assert_eq!(c.dw0.get(), 0x9ABC_DEF0);
        assert_eq!(c.result64(), 0x1234_5678_9ABC_DEF0);
    }
}

//! Reservations (NVMe 2.0 base, 8.19; NVM command set 4.7 Reservation Acquire, Register,
//! Release and Report; base 5.16.1.25 Reservation Notification log page; 5.27.1.21 and
//! 5.27.1.22 the Reservation Notification Mask and Reservation Persistence features).
//!
//! The command dwords are parsed into typed views here; the data structures are zerocopy wire
//! types with their sizes asserted.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::command::Command;

open_enum! {
    /// Reservation Type (RTYPE; NVMe 2.0 base, Figure 395 / NVM command set Figure 64).
    pub struct ReservationType(u8) {
        WRITE_EXCLUSIVE = 1,
        EXCLUSIVE_ACCESS = 2,
        WRITE_EXCLUSIVE_REGISTRANTS_ONLY = 3,
        EXCLUSIVE_ACCESS_REGISTRANTS_ONLY = 4,
        WRITE_EXCLUSIVE_ALL_REGISTRANTS = 5,
        EXCLUSIVE_ACCESS_ALL_REGISTRANTS = 6,
    }
}

open_enum! {
    /// Reservation Register Action (RREGA, CDW10 bits 2:0).
    pub struct RegisterAction(u8) {
        REGISTER = 0,
        UNREGISTER = 1,
        REPLACE = 2,
    }
}

open_enum! {
    /// Reservation Acquire Action (RACQA, CDW10 bits 2:0).
    pub struct AcquireAction(u8) {
        ACQUIRE = 0,
        PREEMPT = 1,
        PREEMPT_AND_ABORT = 2,
    }
}

open_enum! {
    /// Reservation Release Action (RRELA, CDW10 bits 2:0).
    pub struct ReleaseAction(u8) {
        RELEASE = 0,
        CLEAR = 1,
    }
}

open_enum! {
    /// Change Persist Through Power Loss State (CPTPL, Reservation Register CDW10 bits 31:30).
    pub struct Cptpl(u8) {
        NO_CHANGE = 0,
        /// 01b is reserved.
        RESERVED = 1,
        CLEAR = 2,
        SET = 3,
    }
}

open_enum! {
    /// Reservation Notification Log Page Type (NVMe 2.0 base, Figure 263).
    pub struct NotificationType(u8) {
        EMPTY = 0,
        REGISTRATION_PREEMPTED = 1,
        RESERVATION_RELEASED = 2,
        RESERVATION_PREEMPTED = 3,
    }
}

impl NotificationType {
    /// Its bit in the Reservation Notification Mask feature (REGPRE bit 1, RESREL bit 2,
    /// RESPRE bit 3): the bit number is the log page type.
    pub const fn mask_bit(self) -> u32 {
        1 << self.0
    }
}

/// Every bit the Reservation Notification Mask feature defines (CDW11 bits 3:1).
pub const NOTIFICATION_MASK_ALL: u32 = 0b1110;

/// Reservation Persistence feature (FID 83h) CDW11 / dword 0 bit 0: PTPL.
pub const PTPL_ENABLE: u32 = 1 << 0;

/// Asynchronous Event Information for type I/O Command Specific (NVMe 2.0 base, Figure 150):
/// Reservation Log Page Available.
pub const AEN_RESERVATION_LOG_PAGE_AVAILABLE: u8 = 0x00;

/// Identify Namespace RESCAP bits (NVMe 2.0 NVM command set, Figure 97).
pub const RESCAP_PTPL: u8 = 1 << 0;
pub const RESCAP_WRITE_EXCLUSIVE: u8 = 1 << 1;
pub const RESCAP_EXCLUSIVE_ACCESS: u8 = 1 << 2;
pub const RESCAP_WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 1 << 3;
pub const RESCAP_EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: u8 = 1 << 4;
pub const RESCAP_WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 1 << 5;
pub const RESCAP_EXCLUSIVE_ACCESS_ALL_REGISTRANTS: u8 = 1 << 6;
/// Ignore Existing Key: the IEKEY semantics of NVMe 1.3 and later.
pub const RESCAP_IEKEY: u8 = 1 << 7;
/// All six types and IEKEY, without PTPL.
pub const RESCAP_ALL_TYPES: u8 = 0b1111_1110;

/// Reservation Register (opcode 0Dh) CDW10.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservationRegister {
    pub action: RegisterAction,
    /// Ignore Existing Key (bit 3).
    pub iekey: bool,
    pub cptpl: Cptpl,
}

impl ReservationRegister {
    pub fn parse(cmd: &Command) -> Self {
        let cdw10 = cmd.cdw10.get();
        Self {
            action: RegisterAction((cdw10 & 0x7) as u8),
            iekey: cdw10 & (1 << 3) != 0,
            cptpl: Cptpl((cdw10 >> 30) as u8),
        }
    }
}

/// Reservation Acquire (opcode 11h) CDW10.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservationAcquire {
    pub action: AcquireAction,
    pub iekey: bool,
    pub rtype: ReservationType,
}

impl ReservationAcquire {
    pub fn parse(cmd: &Command) -> Self {
        let cdw10 = cmd.cdw10.get();
        Self {
            action: AcquireAction((cdw10 & 0x7) as u8),
            iekey: cdw10 & (1 << 3) != 0,
            rtype: ReservationType((cdw10 >> 8) as u8),
        }
    }
}

/// Reservation Release (opcode 15h) CDW10.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservationRelease {
    pub action: ReleaseAction,
    pub iekey: bool,
    pub rtype: ReservationType,
}

impl ReservationRelease {
    pub fn parse(cmd: &Command) -> Self {
        let cdw10 = cmd.cdw10.get();
        Self {
            action: ReleaseAction((cdw10 & 0x7) as u8),
            iekey: cdw10 & (1 << 3) != 0,
            rtype: ReservationType((cdw10 >> 8) as u8),
        }
    }
}

/// Reservation Report (opcode 0Eh): NUMD in CDW10 (zero-based), EDS in CDW11 bit 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservationReport {
    /// Bytes to return (NUMD + 1 dwords).
    pub len: u64,
    /// Extended Data Structure: 128-bit host identifiers.
    pub eds: bool,
}

impl ReservationReport {
    pub fn parse(cmd: &Command) -> Self {
        Self {
            len: (u64::from(cmd.cdw10.get()) + 1) * 4,
            eds: cmd.cdw11.get() & 1 != 0,
        }
    }
}

/// Reservation Register data (NVM command set, Figure 56): current and new keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
pub struct RegisterData {
    pub crkey: U64,
    pub nrkey: U64,
}
const _: () = assert!(core::mem::size_of::<RegisterData>() == 16);

/// Reservation Acquire data (NVM command set, Figure 52): current and preempt keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
pub struct AcquireData {
    pub crkey: U64,
    pub prkey: U64,
}
const _: () = assert!(core::mem::size_of::<AcquireData>() == 16);

/// Reservation Release data (NVM command set, Figure 60): the current key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
pub struct ReleaseData {
    pub crkey: U64,
}
const _: () = assert!(core::mem::size_of::<ReleaseData>() == 8);

/// Reservation Status header (NVM command set, Figure 66); the extended one (Figure 68) is
/// this plus 40 reserved bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
pub struct ReservationStatusHeader {
    /// Generation: bumped by every Register, Preempt and Clear.
    pub gen: U32,
    pub rtype: u8,
    /// Number of registrants (registered controllers) that follow.
    pub regctl: U16,
    pub rsvd7: [u8; 2],
    /// Persist Through Power Loss State.
    pub ptpls: u8,
    pub rsvd10: [u8; 14],
}
const _: () = assert!(core::mem::size_of::<ReservationStatusHeader>() == 24);

/// Bytes of the extended Reservation Status header (EDS = 1).
pub const RESERVATION_STATUS_EXT_HEADER_LEN: usize = 64;

/// Registered Controller data structure (NVM command set, Figure 67): 64-bit host ID.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
pub struct RegisteredController {
    pub cntlid: U16,
    /// Reservation Status: bit 0 set when this host holds the reservation.
    pub rcsts: u8,
    pub rsvd3: [u8; 5],
    pub hostid: [u8; 8],
    pub rkey: U64,
}
const _: () = assert!(core::mem::size_of::<RegisteredController>() == 24);

/// Registered Controller Extended data structure (NVM command set, Figure 69): 128-bit host
/// ID.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
pub struct RegisteredControllerExt {
    pub cntlid: U16,
    pub rcsts: u8,
    pub rsvd3: [u8; 5],
    pub rkey: U64,
    pub hostid: [u8; 16],
    pub rsvd32: [u8; 32],
}
const _: () = assert!(core::mem::size_of::<RegisteredControllerExt>() == 64);

/// Reservation Notification log page (LID 80h; NVMe 2.0 base, Figure 262).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
pub struct ReservationNotificationLog {
    /// Log Page Count: counts every notice the controller created (lost ones too), never 0
    /// for a real one.
    pub count: U64,
    pub log_type: u8,
    /// Number of Available Log Pages still queued after this one (at most 255).
    pub available: u8,
    pub rsvd10: [u8; 2],
    pub nsid: U32,
    pub rsvd16: [u8; 48],
}
const _: () = assert!(core::mem::size_of::<ReservationNotificationLog>() == 64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::command::Command;

    #[test]
    fn dwords_parse() {
        let mut cmd = Command::default();
        cmd.cdw10.set(0xC000_000A);
        let r = ReservationRegister::parse(&cmd);
        assert_eq!(r.action, RegisterAction::REPLACE);
        assert!(r.iekey);
        assert_eq!(r.cptpl, Cptpl::SET);
        cmd.cdw10.set(0x0000_0602);
        let a = ReservationAcquire::parse(&cmd);
        assert_eq!(a.action, AcquireAction::PREEMPT_AND_ABORT);
        assert_eq!(a.rtype, ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS);
        assert!(!a.iekey);
        cmd.cdw10.set(15);
        cmd.cdw11.set(1);
        let rep = ReservationReport::parse(&cmd);
        assert_eq!(rep.len, 64);
        assert!(rep.eds);
        assert_eq!(NotificationType::RESERVATION_PREEMPTED.mask_bit(), 1 << 3);
    }
}

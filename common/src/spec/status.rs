//! Completion status: the 15-bit Status Field of a CQE (NVMe 2.0 base, 4.6.1 "Status Field
//! Definition") and the status code values of NVMe 2.0 base 4.6.1.2 and NVMe-oF 1.1 / NVMe 2.0
//! base 3.3.1 (Fabrics command status values).

use core::fmt;

open_enum! {
    /// Status Code Type (NVMe 2.0 base, Figure 93).
    pub struct StatusCodeType(u8) {
        GENERIC = 0x0,
        COMMAND_SPECIFIC = 0x1,
        MEDIA = 0x2,
        PATH = 0x3,
        VENDOR = 0x7,
    }
}

/// A completion status without the phase tag.
///
/// CRD (Command Retry Delay) is not carried: this target never asks hosts to delay retries, and
/// hosts only need it if ACRE was enabled through Host Behavior Support, which we do not offer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Status {
    pub sct: StatusCodeType,
    pub sc: u8,
    /// More status information is available in the Error Information log page.
    pub more: bool,
    /// Do Not Retry: the host shall not resubmit the same command expecting success.
    pub dnr: bool,
}

const fn generic(sc: u8) -> Status {
    Status {
        sct: StatusCodeType::GENERIC,
        sc,
        more: false,
        dnr: false,
    }
}
const fn cmd_specific(sc: u8) -> Status {
    Status {
        sct: StatusCodeType::COMMAND_SPECIFIC,
        sc,
        more: false,
        dnr: false,
    }
}
const fn media(sc: u8) -> Status {
    Status {
        sct: StatusCodeType::MEDIA,
        sc,
        more: false,
        dnr: false,
    }
}
const fn path(sc: u8) -> Status {
    Status {
        sct: StatusCodeType::PATH,
        sc,
        more: false,
        dnr: false,
    }
}

// Bit positions inside the 16-bit CQE Status Field (dword 3 bits 31:16), phase tag included.
const PHASE_BIT: u16 = 1 << 0;
const SC_SHIFT: u16 = 1;
const SCT_SHIFT: u16 = 9;
const MORE_BIT: u16 = 1 << 14;
const DNR_BIT: u16 = 1 << 15;

impl Status {
    pub const SUCCESS: Self = generic(0x00);

    // Generic Command Status (NVMe 2.0 base, Figure 94).
    pub const INVALID_OPCODE: Self = generic(0x01);
    pub const INVALID_FIELD: Self = generic(0x02);
    pub const CID_CONFLICT: Self = generic(0x03);
    pub const DATA_TRANSFER_ERROR: Self = generic(0x04);
    pub const ABORTED_POWER_LOSS: Self = generic(0x05);
    pub const INTERNAL_ERROR: Self = generic(0x06);
    pub const ABORT_REQUESTED: Self = generic(0x07);
    pub const ABORTED_SQ_DELETION: Self = generic(0x08);
    pub const ABORTED_FAILED_FUSED: Self = generic(0x09);
    pub const ABORTED_MISSING_FUSED: Self = generic(0x0A);
    pub const INVALID_NAMESPACE: Self = generic(0x0B);
    pub const COMMAND_SEQUENCE_ERROR: Self = generic(0x0C);
    pub const INVALID_SGL_SEGMENT_DESCRIPTOR: Self = generic(0x0D);
    pub const INVALID_SGL_DESCRIPTOR_COUNT: Self = generic(0x0E);
    pub const DATA_SGL_LENGTH_INVALID: Self = generic(0x0F);
    pub const METADATA_SGL_LENGTH_INVALID: Self = generic(0x10);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Self = generic(0x11);
    pub const INVALID_CONTROLLER_MEMORY_BUFFER: Self = generic(0x12);
    pub const INVALID_PRP_OFFSET: Self = generic(0x13);
    pub const ATOMIC_WRITE_UNIT_EXCEEDED: Self = generic(0x14);
    pub const OPERATION_DENIED: Self = generic(0x15);
    pub const INVALID_SGL_OFFSET: Self = generic(0x16);
    pub const HOST_ID_INCONSISTENT_FORMAT: Self = generic(0x18);
    pub const KEEP_ALIVE_EXPIRED: Self = generic(0x19);
    pub const KEEP_ALIVE_INVALID: Self = generic(0x1A);
    pub const ABORTED_PREEMPT: Self = generic(0x1B);
    pub const SANITIZE_FAILED: Self = generic(0x1C);
    pub const SANITIZE_IN_PROGRESS: Self = generic(0x1D);
    pub const SGL_DATA_BLOCK_GRANULARITY_INVALID: Self = generic(0x1E);
    pub const COMMAND_INVALID_IN_CMB: Self = generic(0x1F);
    pub const NAMESPACE_WRITE_PROTECTED: Self = generic(0x20);
    pub const COMMAND_INTERRUPTED: Self = generic(0x21);
    pub const TRANSIENT_TRANSPORT_ERROR: Self = generic(0x22);
    // Generic status values specific to the NVM command set (NVMe 2.0 base, Figure 94, 80h..).
    pub const LBA_OUT_OF_RANGE: Self = generic(0x80);
    pub const CAPACITY_EXCEEDED: Self = generic(0x81);
    pub const NAMESPACE_NOT_READY: Self = generic(0x82);
    pub const RESERVATION_CONFLICT: Self = generic(0x83);
    pub const FORMAT_IN_PROGRESS: Self = generic(0x84);

    // Command Specific Status (NVMe 2.0 base, Figure 95).
    pub const COMPLETION_QUEUE_INVALID: Self = cmd_specific(0x00);
    pub const INVALID_QUEUE_IDENTIFIER: Self = cmd_specific(0x01);
    pub const INVALID_QUEUE_SIZE: Self = cmd_specific(0x02);
    pub const ABORT_COMMAND_LIMIT_EXCEEDED: Self = cmd_specific(0x03);
    pub const ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED: Self = cmd_specific(0x05);
    pub const INVALID_FIRMWARE_SLOT: Self = cmd_specific(0x06);
    pub const INVALID_FIRMWARE_IMAGE: Self = cmd_specific(0x07);
    pub const INVALID_INTERRUPT_VECTOR: Self = cmd_specific(0x08);
    pub const INVALID_LOG_PAGE: Self = cmd_specific(0x09);
    pub const INVALID_FORMAT: Self = cmd_specific(0x0A);
    pub const INVALID_QUEUE_DELETION: Self = cmd_specific(0x0C);
    pub const FEATURE_ID_NOT_SAVEABLE: Self = cmd_specific(0x0D);
    pub const FEATURE_NOT_CHANGEABLE: Self = cmd_specific(0x0E);
    pub const FEATURE_NOT_NAMESPACE_SPECIFIC: Self = cmd_specific(0x0F);
    pub const NAMESPACE_INSUFFICIENT_CAPACITY: Self = cmd_specific(0x15);
    pub const NAMESPACE_ID_UNAVAILABLE: Self = cmd_specific(0x16);
    pub const NAMESPACE_ALREADY_ATTACHED: Self = cmd_specific(0x18);
    pub const NAMESPACE_IS_PRIVATE: Self = cmd_specific(0x19);
    pub const NAMESPACE_NOT_ATTACHED: Self = cmd_specific(0x1A);
    pub const CONTROLLER_LIST_INVALID: Self = cmd_specific(0x1C);
    // NVM command set specific (NVMe 2.0 NVM command set, Figure 29).
    pub const CONFLICTING_ATTRIBUTES: Self = cmd_specific(0x80);
    pub const INVALID_PROTECTION_INFORMATION: Self = cmd_specific(0x81);
    pub const ATTEMPTED_WRITE_TO_READ_ONLY_RANGE: Self = cmd_specific(0x82);

    // Fabrics command specific (NVMe 2.0 base, Figure 96; NVMe-oF 1.1, Figure 22). These share
    // the command-specific space with the values above; the opcode tells them apart.
    pub const INCOMPATIBLE_FORMAT: Self = cmd_specific(0x80);
    pub const CONTROLLER_BUSY: Self = cmd_specific(0x81);
    pub const CONNECT_INVALID_PARAMETERS: Self = cmd_specific(0x82);
    pub const CONNECT_RESTART_DISCOVERY: Self = cmd_specific(0x83);
    pub const CONNECT_INVALID_HOST: Self = cmd_specific(0x84);
    pub const INVALID_QUEUE_TYPE: Self = cmd_specific(0x85);
    pub const DISCOVER_RESTART: Self = cmd_specific(0x90);
    pub const AUTH_REQUIRED: Self = cmd_specific(0x91);

    // Media and Data Integrity Errors (NVMe 2.0 base, Figure 97).
    pub const WRITE_FAULT: Self = media(0x80);
    pub const UNRECOVERED_READ_ERROR: Self = media(0x81);
    pub const END_TO_END_GUARD_CHECK: Self = media(0x82);
    pub const END_TO_END_APPLICATION_TAG_CHECK: Self = media(0x83);
    pub const END_TO_END_REFERENCE_TAG_CHECK: Self = media(0x84);
    pub const COMPARE_FAILURE: Self = media(0x85);
    pub const ACCESS_DENIED: Self = media(0x86);
    pub const DEALLOCATED_OR_UNWRITTEN_BLOCK: Self = media(0x87);

    // Path Related Status (NVMe 2.0 base, Figure 98).
    pub const INTERNAL_PATH_ERROR: Self = path(0x00);
    pub const ANA_PERSISTENT_LOSS: Self = path(0x01);
    pub const ANA_INACCESSIBLE: Self = path(0x02);
    pub const ANA_TRANSITION: Self = path(0x03);
    pub const CONTROLLER_PATHING_ERROR: Self = path(0x60);
    pub const HOST_PATHING_ERROR: Self = path(0x70);
    pub const COMMAND_ABORTED_BY_HOST: Self = path(0x71);

    pub const fn new(sct: StatusCodeType, sc: u8) -> Self {
        Self {
            sct,
            sc,
            more: false,
            dnr: false,
        }
    }

    #[must_use]
    pub const fn with_dnr(self) -> Self {
        Self { dnr: true, ..self }
    }

    #[must_use]
    pub const fn with_more(self) -> Self {
        Self { more: true, ..self }
    }

    pub const fn is_success(self) -> bool {
        self.sct.0 == StatusCodeType::GENERIC.0 && self.sc == 0
    }

    /// Same status code, ignoring the DNR and MORE flags.
    pub const fn same_code(self, other: Status) -> bool {
        self.sct.0 == other.sct.0 && self.sc == other.sc
    }

    /// Encodes the CQE status field (dword 3 bits 31:16) with the given phase tag.
    pub const fn to_field(self, phase: bool) -> u16 {
        (phase as u16)
            | ((self.sc as u16) << SC_SHIFT)
            | (((self.sct.0 & 0x7) as u16) << SCT_SHIFT)
            | if self.more { MORE_BIT } else { 0 }
            | if self.dnr { DNR_BIT } else { 0 }
    }

    /// Decodes a CQE status field; the phase tag and CRD are dropped.
    pub const fn from_field(field: u16) -> Self {
        Self {
            sct: StatusCodeType(((field >> SCT_SHIFT) & 0x7) as u8),
            sc: (field >> SC_SHIFT) as u8,
            more: field & MORE_BIT != 0,
            dnr: field & DNR_BIT != 0,
        }
    }

    /// The phase tag bit of a raw status field.
    pub const fn phase_of(field: u16) -> bool {
        field & PHASE_BIT != 0
    }

    /// Human name of the status code, where the status code type makes it unambiguous; for
    /// command-specific values shared between admin/NVM and Fabrics commands both are given.
    pub fn name(self) -> Option<&'static str> {
        let name = match (self.sct, self.sc) {
            (StatusCodeType::GENERIC, sc) => match sc {
                0x00 => "SUCCESS",
                0x01 => "INVALID_OPCODE",
                0x02 => "INVALID_FIELD",
                0x03 => "CID_CONFLICT",
                0x04 => "DATA_TRANSFER_ERROR",
                0x05 => "ABORTED_POWER_LOSS",
                0x06 => "INTERNAL_ERROR",
                0x07 => "ABORT_REQUESTED",
                0x08 => "ABORTED_SQ_DELETION",
                0x09 => "ABORTED_FAILED_FUSED",
                0x0A => "ABORTED_MISSING_FUSED",
                0x0B => "INVALID_NAMESPACE",
                0x0C => "COMMAND_SEQUENCE_ERROR",
                0x0D => "INVALID_SGL_SEGMENT_DESCRIPTOR",
                0x0E => "INVALID_SGL_DESCRIPTOR_COUNT",
                0x0F => "DATA_SGL_LENGTH_INVALID",
                0x10 => "METADATA_SGL_LENGTH_INVALID",
                0x11 => "SGL_DESCRIPTOR_TYPE_INVALID",
                0x12 => "INVALID_CONTROLLER_MEMORY_BUFFER",
                0x13 => "INVALID_PRP_OFFSET",
                0x14 => "ATOMIC_WRITE_UNIT_EXCEEDED",
                0x15 => "OPERATION_DENIED",
                0x16 => "INVALID_SGL_OFFSET",
                0x18 => "HOST_ID_INCONSISTENT_FORMAT",
                0x19 => "KEEP_ALIVE_EXPIRED",
                0x1A => "KEEP_ALIVE_INVALID",
                0x1B => "ABORTED_PREEMPT",
                0x1C => "SANITIZE_FAILED",
                0x1D => "SANITIZE_IN_PROGRESS",
                0x1E => "SGL_DATA_BLOCK_GRANULARITY_INVALID",
                0x1F => "COMMAND_INVALID_IN_CMB",
                0x20 => "NAMESPACE_WRITE_PROTECTED",
                0x21 => "COMMAND_INTERRUPTED",
                0x22 => "TRANSIENT_TRANSPORT_ERROR",
                0x80 => "LBA_OUT_OF_RANGE",
                0x81 => "CAPACITY_EXCEEDED",
                0x82 => "NAMESPACE_NOT_READY",
                0x83 => "RESERVATION_CONFLICT",
                0x84 => "FORMAT_IN_PROGRESS",
                _ => return None,
            },
            (StatusCodeType::COMMAND_SPECIFIC, sc) => match sc {
                0x00 => "COMPLETION_QUEUE_INVALID",
                0x01 => "INVALID_QUEUE_IDENTIFIER",
                0x02 => "INVALID_QUEUE_SIZE",
                0x03 => "ABORT_COMMAND_LIMIT_EXCEEDED",
                0x05 => "ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED",
                0x06 => "INVALID_FIRMWARE_SLOT",
                0x07 => "INVALID_FIRMWARE_IMAGE",
                0x08 => "INVALID_INTERRUPT_VECTOR",
                0x09 => "INVALID_LOG_PAGE",
                0x0A => "INVALID_FORMAT",
                0x0C => "INVALID_QUEUE_DELETION",
                0x0D => "FEATURE_ID_NOT_SAVEABLE",
                0x0E => "FEATURE_NOT_CHANGEABLE",
                0x0F => "FEATURE_NOT_NAMESPACE_SPECIFIC",
                0x15 => "NAMESPACE_INSUFFICIENT_CAPACITY",
                0x16 => "NAMESPACE_ID_UNAVAILABLE",
                0x18 => "NAMESPACE_ALREADY_ATTACHED",
                0x19 => "NAMESPACE_IS_PRIVATE",
                0x1A => "NAMESPACE_NOT_ATTACHED",
                0x1C => "CONTROLLER_LIST_INVALID",
                0x80 => "CONFLICTING_ATTRIBUTES or INCOMPATIBLE_FORMAT",
                0x81 => "INVALID_PROTECTION_INFORMATION or CONTROLLER_BUSY",
                0x82 => "ATTEMPTED_WRITE_TO_READ_ONLY_RANGE or CONNECT_INVALID_PARAMETERS",
                0x83 => "CONNECT_RESTART_DISCOVERY",
                0x84 => "CONNECT_INVALID_HOST",
                0x85 => "INVALID_QUEUE_TYPE",
                0x90 => "DISCOVER_RESTART",
                0x91 => "AUTH_REQUIRED",
                _ => return None,
            },
            (StatusCodeType::MEDIA, sc) => match sc {
                0x80 => "WRITE_FAULT",
                0x81 => "UNRECOVERED_READ_ERROR",
                0x82 => "END_TO_END_GUARD_CHECK",
                0x83 => "END_TO_END_APPLICATION_TAG_CHECK",
                0x84 => "END_TO_END_REFERENCE_TAG_CHECK",
                0x85 => "COMPARE_FAILURE",
                0x86 => "ACCESS_DENIED",
                0x87 => "DEALLOCATED_OR_UNWRITTEN_BLOCK",
                _ => return None,
            },
            (StatusCodeType::PATH, sc) => match sc {
                0x00 => "INTERNAL_PATH_ERROR",
                0x01 => "ANA_PERSISTENT_LOSS",
                0x02 => "ANA_INACCESSIBLE",
                0x03 => "ANA_TRANSITION",
                0x60 => "CONTROLLER_PATHING_ERROR",
                0x70 => "HOST_PATHING_ERROR",
                0x71 => "COMMAND_ABORTED_BY_HOST",
                _ => return None,
            },
            _ => return None,
        };
        Some(name)
    }
}

impl Default for Status {
    fn default() -> Self {
        Self::SUCCESS
    }
}

impl Status {
    /// The status as a Fabrics Connect command's (NVMe-oF 1.1, 3.3.1): command specific codes
    /// 80h-84h have their Connect meaning rather than the I/O command set's.
    pub fn in_connect(self) -> impl fmt::Display {
        struct InConnect(Status);
        impl fmt::Display for InConnect {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let s = self.0;
                let name = match (s.sct, s.sc) {
                    (StatusCodeType::COMMAND_SPECIFIC, 0x80) => Some("INCOMPATIBLE_FORMAT"),
                    (StatusCodeType::COMMAND_SPECIFIC, 0x81) => Some("CONTROLLER_BUSY"),
                    (StatusCodeType::COMMAND_SPECIFIC, 0x82) => Some("CONNECT_INVALID_PARAMETERS"),
                    _ => s.name(),
                };
                s.fmt_named(name, f)
            }
        }
        InConnect(self)
    }

    fn fmt_named(self, name: Option<&str>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(name.unwrap_or("unknown"))?;
        write!(f, " (sct {:#x}, sc {:#04x}", self.sct.0, self.sc)?;
        if self.more {
            f.write_str(", MORE")?;
        }
        if self.dnr {
            f.write_str(", DNR")?;
        }
        f.write_str(")")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_named(self.name(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_statuses_have_their_fabrics_names() {
        let s = Status::CONNECT_INVALID_PARAMETERS.with_dnr();
        assert_eq!(
            s.in_connect().to_string(),
            "CONNECT_INVALID_PARAMETERS (sct 0x1, sc 0x82, DNR)"
        );
        assert!(s
            .to_string()
            .starts_with("ATTEMPTED_WRITE_TO_READ_ONLY_RANGE or "));
        assert_eq!(
            Status::CONNECT_INVALID_HOST.in_connect().to_string(),
            Status::CONNECT_INVALID_HOST.to_string()
        );
    }

    #[test]
    fn field_layout() {
        // SCT 1, SC 0x82, DNR, phase 1: linux encodes this as (0x182 | NVME_SC_DNR) << 1 | phase.
        let s = Status::CONNECT_INVALID_PARAMETERS.with_dnr();
        assert_eq!(s.to_field(true), ((0x182u16 | 0x4000) << 1) | 1);
        assert_eq!(Status::from_field(s.to_field(true)), s);
        assert!(Status::phase_of(s.to_field(true)));
        assert_eq!(Status::SUCCESS.to_field(false), 0);
        assert_eq!(Status::INVALID_FIELD.to_field(false), 0x02 << 1);
        assert_eq!(Status::WRITE_FAULT.to_field(false), 0x280 << 1);
        let m = Status::INTERNAL_ERROR.with_more();
        assert_eq!(m.to_field(false), (0x06 << 1) | (1 << 14));
    }

    #[test]
    fn crd_is_ignored_on_decode() {
        let f = Status::INVALID_OPCODE.to_field(false) | (0b11 << 12);
        assert_eq!(Status::from_field(f), Status::INVALID_OPCODE);
    }

    #[test]
    fn display() {
        assert!(Status::SUCCESS.is_success());
        assert!(!Status::INVALID_FIELD.is_success());
        assert_eq!(
            Status::INVALID_NAMESPACE.with_dnr().to_string(),
            "INVALID_NAMESPACE (sct 0x0, sc 0x0b, DNR)"
        );
        assert_eq!(
            Status::new(StatusCodeType(5), 1).to_string(),
            "unknown (sct 0x5, sc 0x01)"
        );
        assert_eq!(format!("{:?}", StatusCodeType::MEDIA), "MEDIA");
        assert_eq!(format!("{:?}", StatusCodeType(5)), "StatusCodeType(0x5)");
    }
}

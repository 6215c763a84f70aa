//! Log pages (NVMe 2.0 base, 5.16.1) and the Discovery log page (NVMe-oF 1.1, 5.3; NVMe 2.0
//! base, 5.16.1.23).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

open_enum! {
    /// Log Page Identifiers (NVMe 2.0 base, Figure 202).
    pub struct LogPageId(u8) {
        SUPPORTED_LOG_PAGES = 0x00,
        ERROR_INFORMATION = 0x01,
        SMART_HEALTH = 0x02,
        FIRMWARE_SLOT = 0x03,
        CHANGED_NAMESPACE_LIST = 0x04,
        COMMANDS_SUPPORTED_EFFECTS = 0x05,
        DEVICE_SELF_TEST = 0x06,
        TELEMETRY_HOST = 0x07,
        TELEMETRY_CONTROLLER = 0x08,
        ENDURANCE_GROUP_INFORMATION = 0x09,
        PREDICTABLE_LATENCY_PER_NVM_SET = 0x0A,
        PREDICTABLE_LATENCY_EVENT_AGGREGATE = 0x0B,
        ASYMMETRIC_NAMESPACE_ACCESS = 0x0C,
        PERSISTENT_EVENT = 0x0D,
        ENDURANCE_GROUP_EVENT_AGGREGATE = 0x0F,
        MEDIA_UNIT_STATUS = 0x10,
        SUPPORTED_CAPACITY_CONFIGURATION_LIST = 0x11,
        FEATURE_IDENTIFIERS_SUPPORTED_EFFECTS = 0x12,
        NVME_MI_COMMANDS_SUPPORTED_EFFECTS = 0x13,
        COMMAND_AND_FEATURE_LOCKDOWN = 0x14,
        BOOT_PARTITION = 0x15,
        ROTATIONAL_MEDIA_INFORMATION = 0x16,
        DISCOVERY = 0x70,
        RESERVATION_NOTIFICATION = 0x80,
        SANITIZE_STATUS = 0x81,
    }
}

/// Error Information log entry (NVMe 2.0 base, Figure 205).
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
pub struct ErrorLogEntry {
    /// Unique, incrementing; 0 marks an invalid entry.
    pub error_count: U64,
    pub sqid: U16,
    pub cid: U16,
    /// Status field as in the CQE: bit 0 is the phase tag, the status starts at bit 1
    /// (use [`super::Status::to_field`]).
    pub status: U16,
    /// Byte in bits 7:0 and bit in 10:8 of the command field that caused the error.
    pub param_error_location: U16,
    pub lba: U64,
    pub nsid: U32,
    /// Log page id with vendor specific details, 0 if none.
    pub vs: u8,
    pub trtype: u8,
    /// Command Set Identifier of the failed command.
    pub csi: u8,
    /// Opcode of the failed command (NVMe 2.1; reserved in 2.0).
    pub opcode: u8,
    pub command_specific: U64,
    pub trtype_specific: U16,
    pub rsvd42: [u8; 22],
}
const _: () = assert!(core::mem::size_of::<ErrorLogEntry>() == 64);

/// SMART / Health Information (NVMe 2.0 base, Figure 207). Counters are 128-bit little endian;
/// the composite temperature sits at an odd offset, hence byte arrays.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct SmartHealthLog {
    pub critical_warning: u8,
    /// Kelvin.
    pub composite_temperature: [u8; 2],
    /// Percent.
    pub available_spare: u8,
    pub available_spare_threshold: u8,
    pub percentage_used: u8,
    pub endurance_group_critical_warning: u8,
    pub rsvd7: [u8; 25],
    /// In thousands of 512-byte units, rounded up.
    pub data_units_read: [u8; 16],
    pub data_units_written: [u8; 16],
    pub host_read_commands: [u8; 16],
    pub host_write_commands: [u8; 16],
    /// Minutes.
    pub controller_busy_time: [u8; 16],
    pub power_cycles: [u8; 16],
    pub power_on_hours: [u8; 16],
    pub unsafe_shutdowns: [u8; 16],
    pub media_errors: [u8; 16],
    pub num_error_log_entries: [u8; 16],
    pub warning_temp_time: U32,
    pub critical_temp_time: U32,
    pub temp_sensor: [U16; 8],
    pub thermal_mgmt_temp1_transitions: U32,
    pub thermal_mgmt_temp2_transitions: U32,
    pub thermal_mgmt_temp1_time: U32,
    pub thermal_mgmt_temp2_time: U32,
    pub rsvd232: [u8; 280],
}
const _: () = assert!(core::mem::size_of::<SmartHealthLog>() == 512);

/// Critical warning bits.
pub const SMART_WARN_SPARE: u8 = 1 << 0;
pub const SMART_WARN_TEMPERATURE: u8 = 1 << 1;
pub const SMART_WARN_RELIABILITY: u8 = 1 << 2;
pub const SMART_WARN_READ_ONLY: u8 = 1 << 3;
pub const SMART_WARN_VOLATILE_BACKUP: u8 = 1 << 4;

/// Writes a 128-bit little-endian counter.
pub fn set_u128(field: &mut [u8; 16], v: u128) {
    *field = v.to_le_bytes();
}

pub fn get_u128(field: &[u8; 16]) -> u128 {
    u128::from_le_bytes(*field)
}

impl SmartHealthLog {
    pub fn set_composite_temperature(&mut self, kelvin: u16) {
        self.composite_temperature = kelvin.to_le_bytes();
    }

    pub fn composite_temperature(&self) -> u16 {
        u16::from_le_bytes(self.composite_temperature)
    }
}

/// Firmware Slot Information (NVMe 2.0 base, Figure 208).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct FirmwareSlotLog {
    /// Active slot in bits 2:0, slot for next reset in bits 6:4.
    pub afi: u8,
    pub rsvd1: [u8; 7],
    /// Firmware revision per slot, ASCII space padded.
    pub frs: [[u8; 8]; 7],
    pub rsvd64: [u8; 448],
}
const _: () = assert!(core::mem::size_of::<FirmwareSlotLog>() == 512);

/// The Changed Namespace List: 1024 NSIDs; a first entry of FFFFFFFFh means "more than 1024
/// changed" (NVMe 2.0 base, 5.16.1.5).
pub type ChangedNamespaceList = [U32; 1024];
const _: () = assert!(core::mem::size_of::<ChangedNamespaceList>() == 4096);

open_enum! {
    /// TRTYPE (NVMe-oF 1.1, Figure 38).
    pub struct TransportType(u8) {
        RDMA = 1,
        FC = 2,
        TCP = 3,
        INTRA_HOST = 254,
    }
}

open_enum! {
    /// ADRFAM (NVMe-oF 1.1, Figure 38).
    pub struct AddressFamily(u8) {
        IPV4 = 1,
        IPV6 = 2,
        IB = 3,
        FC = 4,
        INTRA_HOST = 254,
    }
}

open_enum! {
    /// SUBTYPE (NVMe 2.0 base, Figure 262).
    pub struct SubsystemType(u8) {
        /// A referral to another discovery subsystem.
        REFERRAL = 1,
        NVME = 2,
        /// The discovery subsystem being queried.
        CURRENT_DISCOVERY = 3,
    }
}

/// TREQ bits 1:0: secure channel requirement.
pub const TREQ_SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0;
pub const TREQ_SECURE_CHANNEL_REQUIRED: u8 = 1;
pub const TREQ_SECURE_CHANNEL_NOT_REQUIRED: u8 = 2;
/// TREQ bit 2: the controller can run with SQ flow control disabled.
pub const TREQ_SQ_FLOW_CONTROL_DISABLE: u8 = 1 << 2;

/// EFLAGS (NVMe 2.0 base, Figure 262).
pub const EFLAGS_EXPLICIT_PERSISTENT_CONNECTION: u16 = 1 << 0;
pub const EFLAGS_DUPLICATE_RETURNED_INFO: u16 = 1 << 1;
pub const EFLAGS_NO_CDC_CONNECTIVITY: u16 = 1 << 2;

/// RDMA_QPTYPE.
pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
pub const RDMA_QPTYPE_DATAGRAM: u8 = 2;
/// RDMA_PRTYPE.
pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
pub const RDMA_PRTYPE_IB: u8 = 2;
pub const RDMA_PRTYPE_ROCE: u8 = 3;
pub const RDMA_PRTYPE_ROCEV2: u8 = 4;
pub const RDMA_PRTYPE_IWARP: u8 = 5;
/// RDMA_CMS.
pub const RDMA_CMS_RDMA_CM: u8 = 1;

/// Discovery log page header (NVMe-oF 1.1, Figure 37); entries follow at 1024-byte strides.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct DiscoveryLogHeader {
    /// Changes whenever the entries change; hosts re-read if it moved while they read.
    pub genctr: U64,
    pub numrec: U64,
    pub recfmt: U16,
    pub rsvd18: [u8; 1006],
}
const _: () = assert!(core::mem::size_of::<DiscoveryLogHeader>() == 1024);

/// Discovery log page entry (NVMe-oF 1.1, Figure 38).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct DiscoveryLogEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: U16,
    /// FFFFh: dynamic controller model.
    pub cntlid: U16,
    /// Admin max SQ size, one-based.
    pub asqsz: U16,
    pub eflags: U16,
    pub rsvd12: [u8; 20],
    /// ASCII, space padded (e.g. "4420").
    pub trsvcid: [u8; 32],
    pub rsvd64: [u8; 192],
    pub subnqn: [u8; 256],
    /// ASCII, space padded (e.g. "192.168.0.1").
    pub traddr: [u8; 256],
    pub tsas: [u8; 256],
}
const _: () = assert!(core::mem::size_of::<DiscoveryLogEntry>() == 1024);

/// Transport specific address subtype for RDMA (NVMe-oF 1.1, Figure 39).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct RdmaTsas {
    pub rdma_qptype: u8,
    pub rdma_prtype: u8,
    pub rdma_cms: u8,
    pub rsvd3: [u8; 5],
    pub rdma_pkey: U16,
    pub rsvd10: [u8; 246],
}
const _: () = assert!(core::mem::size_of::<RdmaTsas>() == 256);

impl DiscoveryLogEntry {
    pub fn rdma_tsas(&self) -> &RdmaTsas {
        zerocopy::transmute_ref!(&self.tsas)
    }

    pub fn rdma_tsas_mut(&mut self) -> &mut RdmaTsas {
        zerocopy::transmute_mut!(&mut self.tsas)
    }

    pub fn transport(&self) -> TransportType {
        TransportType(self.trtype)
    }

    pub fn address_family(&self) -> AddressFamily {
        AddressFamily(self.adrfam)
    }

    pub fn subsystem_type(&self) -> SubsystemType {
        SubsystemType(self.subtype)
    }
}

/// Asymmetric Namespace Access log page header (NVMe 2.0 base, Figure 224): 16 bytes, then
/// [`AnaGroupDescriptor`]s, each followed by its NSIDs (4 bytes each, ascending).
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
pub struct AnaLogHeader {
    /// Incremented each time the log page's contents change (wraps to 0).
    pub chgcnt: U64,
    /// Number of ANA Group Descriptors that follow.
    pub ngrps: U16,
    pub rsvd10: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<AnaLogHeader>() == 16);

/// One ANA group in the ANA log page (NVMe 2.0 base, Figure 225); `nnsids` NSIDs follow it.
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
pub struct AnaGroupDescriptor {
    pub grpid: U32,
    /// NSIDs listed after the descriptor (0 when the host asked for groups only).
    pub nnsids: U32,
    pub chgcnt: U64,
    /// ANA state in bits 3:0 ([`AnaState`]).
    pub state: u8,
    pub rsvd17: [u8; 15],
}
const _: () = assert!(core::mem::size_of::<AnaGroupDescriptor>() == 32);

open_enum! {
    /// Asymmetric Namespace Access states (NVMe 2.0 base, 8.1.1 and Figure 225).
    pub struct AnaState(u8) {
        OPTIMIZED = 0x1,
        NON_OPTIMIZED = 0x2,
        INACCESSIBLE = 0x3,
        PERSISTENT_LOSS = 0x4,
        CHANGE = 0xF,
    }
}

impl AnaState {
    /// Commands to a namespace in this state execute (optimized or non-optimized path);
    /// otherwise I/O is answered with a path-related ANA status.
    pub fn is_accessible(self) -> bool {
        self == Self::OPTIMIZED || self == Self::NON_OPTIMIZED
    }
}

/// Get Log Page LSP bit 0 for the ANA log: Return Groups Only (no NSID lists).
pub const ANA_LSP_RGO: u8 = 1 << 0;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;
    use zerocopy::FromZeros;

    #[test]
    fn error_log_offsets() {
        assert_eq!(offset_of!(ErrorLogEntry, sqid), 8);
        assert_eq!(offset_of!(ErrorLogEntry, cid), 10);
        assert_eq!(offset_of!(ErrorLogEntry, status), 12);
        assert_eq!(offset_of!(ErrorLogEntry, param_error_location), 14);
        assert_eq!(offset_of!(ErrorLogEntry, lba), 16);
        assert_eq!(offset_of!(ErrorLogEntry, nsid), 24);
        assert_eq!(offset_of!(ErrorLogEntry, vs), 28);
        assert_eq!(offset_of!(ErrorLogEntry, trtype), 29);
        assert_eq!(offset_of!(ErrorLogEntry, csi), 30);
        assert_eq!(offset_of!(ErrorLogEntry, opcode), 31);
        assert_eq!(offset_of!(ErrorLogEntry, command_specific), 32);
        assert_eq!(offset_of!(ErrorLogEntry, trtype_specific), 40);
    }

    #[test]
    fn smart_offsets() {
        type S = SmartHealthLog;
        assert_eq!(offset_of!(S, composite_temperature), 1);
        assert_eq!(offset_of!(S, available_spare), 3);
        assert_eq!(offset_of!(S, endurance_group_critical_warning), 6);
        assert_eq!(offset_of!(S, data_units_read), 32);
        assert_eq!(offset_of!(S, data_units_written), 48);
        assert_eq!(offset_of!(S, host_read_commands), 64);
        assert_eq!(offset_of!(S, host_write_commands), 80);
        assert_eq!(offset_of!(S, controller_busy_time), 96);
        assert_eq!(offset_of!(S, power_cycles), 112);
        assert_eq!(offset_of!(S, power_on_hours), 128);
        assert_eq!(offset_of!(S, unsafe_shutdowns), 144);
        assert_eq!(offset_of!(S, media_errors), 160);
        assert_eq!(offset_of!(S, num_error_log_entries), 176);
        assert_eq!(offset_of!(S, warning_temp_time), 192);
        assert_eq!(offset_of!(S, critical_temp_time), 196);
        assert_eq!(offset_of!(S, temp_sensor), 200);
        assert_eq!(offset_of!(S, thermal_mgmt_temp1_transitions), 216);
        assert_eq!(offset_of!(FirmwareSlotLog, frs), 8);

        let mut s = S::new_zeroed();
        s.set_composite_temperature(300);
        set_u128(&mut s.data_units_read, (1u128 << 64) | 5);
        assert_eq!(&s.as_bytes()[1..3], &300u16.to_le_bytes());
        assert_eq!(s.as_bytes()[32], 5);
        assert_eq!(s.as_bytes()[40], 1);
        assert_eq!(get_u128(&s.data_units_read), (1u128 << 64) | 5);
        assert_eq!(s.composite_temperature(), 300);
    }

    #[test]
    fn discovery_offsets() {
        assert_eq!(offset_of!(DiscoveryLogHeader, numrec), 8);
        assert_eq!(offset_of!(DiscoveryLogHeader, recfmt), 16);
        type E = DiscoveryLogEntry;
        assert_eq!(offset_of!(E, treq), 3);
        assert_eq!(offset_of!(E, portid), 4);
        assert_eq!(offset_of!(E, cntlid), 6);
        assert_eq!(offset_of!(E, asqsz), 8);
        assert_eq!(offset_of!(E, eflags), 10);
        assert_eq!(offset_of!(E, trsvcid), 32);
        assert_eq!(offset_of!(E, subnqn), 256);
        assert_eq!(offset_of!(E, traddr), 512);
        assert_eq!(offset_of!(E, tsas), 768);
        assert_eq!(offset_of!(RdmaTsas, rdma_pkey), 8);

        let mut e = E::new_zeroed();
        let t = e.rdma_tsas_mut();
        t.rdma_qptype = RDMA_QPTYPE_CONNECTED;
        t.rdma_prtype = RDMA_PRTYPE_ROCEV2;
        t.rdma_cms = RDMA_CMS_RDMA_CM;
        t.rdma_pkey = U16::new(0xFFFF);
        assert_eq!(&e.as_bytes()[768..771], &[1, 4, 1]);
        assert_eq!(&e.as_bytes()[776..778], &[0xFF, 0xFF]);
        assert_eq!(e.rdma_tsas().rdma_prtype, RDMA_PRTYPE_ROCEV2);
        assert_eq!(format!("{:?}", TransportType(254)), "INTRA_HOST");
    }
}

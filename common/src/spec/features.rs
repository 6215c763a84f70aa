//! Feature identifiers and values (NVMe 2.0 base, 5.27.1 "Feature Specific Information") and
//! Asynchronous Event Request completions (NVMe 2.0 base, 5.2).

use super::log_page::LogPageId;

open_enum! {
    /// Feature Identifiers (NVMe 2.0 base, Figure 317).
    pub struct FeatureId(u8) {
        ARBITRATION = 0x01,
        POWER_MANAGEMENT = 0x02,
        LBA_RANGE_TYPE = 0x03,
        TEMPERATURE_THRESHOLD = 0x04,
        ERROR_RECOVERY = 0x05,
        VOLATILE_WRITE_CACHE = 0x06,
        NUMBER_OF_QUEUES = 0x07,
        INTERRUPT_COALESCING = 0x08,
        INTERRUPT_VECTOR_CONFIGURATION = 0x09,
        WRITE_ATOMICITY = 0x0A,
        ASYNC_EVENT_CONFIGURATION = 0x0B,
        AUTONOMOUS_POWER_STATE_TRANSITION = 0x0C,
        HOST_MEMORY_BUFFER = 0x0D,
        TIMESTAMP = 0x0E,
        KEEP_ALIVE_TIMER = 0x0F,
        HOST_CONTROLLED_THERMAL_MGMT = 0x10,
        NON_OPERATIONAL_POWER_STATE = 0x11,
        READ_RECOVERY_LEVEL = 0x12,
        PREDICTABLE_LATENCY_MODE_CONFIG = 0x13,
        PREDICTABLE_LATENCY_MODE_WINDOW = 0x14,
        HOST_BEHAVIOR_SUPPORT = 0x16,
        SANITIZE_CONFIG = 0x17,
        ENDURANCE_GROUP_EVENT_CONFIG = 0x18,
        IO_COMMAND_SET_PROFILE = 0x19,
        SOFTWARE_PROGRESS_MARKER = 0x80,
        HOST_IDENTIFIER = 0x81,
        RESERVATION_NOTIFICATION_MASK = 0x82,
        RESERVATION_PERSISTENCE = 0x83,
        NAMESPACE_WRITE_PROTECTION = 0x84,
    }
}

open_enum! {
    /// Get Features SEL field (NVMe 2.0 base, Figure 283).
    pub struct FeatureSelect(u8) {
        CURRENT = 0,
        DEFAULT = 1,
        SAVED = 2,
        /// Returns capability bits in dword 0 instead of a value (Figure 284).
        SUPPORTED_CAPABILITIES = 3,
    }
}

/// Supported-capabilities bits returned for SEL = 3 (NVMe 2.0 base, Figure 284).
pub const FEATURE_CAP_SAVEABLE: u32 = 1 << 0;
pub const FEATURE_CAP_NAMESPACE_SPECIFIC: u32 = 1 << 1;
pub const FEATURE_CAP_CHANGEABLE: u32 = 1 << 2;

/// Volatile Write Cache (FID 06h) CDW11 bit 0: Volatile Write Cache Enable.
pub const VWC_ENABLE: u32 = 1 << 0;

/// Number of Queues (FID 07h): requested / allocated I/O queue counts, both zero-based on the
/// wire (NSQR in bits 15:0, NCQR in bits 31:16). The fields here are one-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumberOfQueues {
    pub nsq: u32,
    pub ncq: u32,
}

impl NumberOfQueues {
    pub const fn from_dword(dw: u32) -> Self {
        Self {
            nsq: (dw & 0xFFFF) + 1,
            ncq: (dw >> 16) + 1,
        }
    }

    /// Counts above 65536 are clamped; 0 is encoded as 1 (the spec forbids 0FFFFh requests
    /// and a controller always allocates at least one).
    pub fn to_dword(self) -> u32 {
        let enc = |n: u32| n.clamp(1, 0x1_0000) - 1;
        enc(self.nsq) | (enc(self.ncq) << 16)
    }
}

open_enum! {
    /// Asynchronous Event Type, completion dword 0 bits 2:0 (NVMe 2.0 base, Figure 146).
    pub struct AsyncEventType(u8) {
        ERROR = 0,
        SMART = 1,
        NOTICE = 2,
        IMMEDIATE = 3,
        IO_COMMAND_SET = 6,
        VENDOR = 7,
    }
}

open_enum! {
    /// Asynchronous Event Information for type NOTICE (NVMe 2.0 base, Figure 149).
    pub struct AsyncNotice(u8) {
        NAMESPACE_ATTRIBUTE_CHANGED = 0x00,
        FIRMWARE_ACTIVATION_STARTING = 0x01,
        TELEMETRY_LOG_CHANGED = 0x02,
        ANA_CHANGE = 0x03,
        PREDICTABLE_LATENCY_EVENT_AGGREGATE_LOG_CHANGE = 0x04,
        LBA_STATUS_INFORMATION_ALERT = 0x05,
        ENDURANCE_GROUP_EVENT_AGGREGATE_LOG_CHANGE = 0x06,
        DISCOVERY_LOG_CHANGE = 0xF0,
    }
}

/// Completion dword 0 of an Asynchronous Event Request: type in bits 2:0, information in 15:8,
/// the log page to read (and so clear the event) in 23:16.
pub const fn async_event_dw0(ty: AsyncEventType, info: u8, lid: LogPageId) -> u32 {
    (ty.0 as u32 & 0x7) | ((info as u32) << 8) | ((lid.0 as u32) << 16)
}

/// Splits an AER completion dword 0 into (type, info, log page).
pub const fn parse_async_event_dw0(dw0: u32) -> (AsyncEventType, u8, LogPageId) {
    (
        AsyncEventType((dw0 & 0x7) as u8),
        (dw0 >> 8) as u8,
        LogPageId((dw0 >> 16) as u8),
    )
}

/// Asynchronous Event Configuration (FID 0Bh) bits (NVMe 2.0 base, Figure 295).
/// Bits 7:0 mirror the SMART critical warning bits.
pub const AEC_SMART_CRITICAL_WARNINGS: u32 = 0xFF;
pub const AEC_NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
pub const AEC_FIRMWARE_ACTIVATION: u32 = 1 << 9;
pub const AEC_TELEMETRY_LOG: u32 = 1 << 10;
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
pub const AEC_DISCOVERY_LOG_CHANGE: u32 = 1 << 31;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aen_dw0() {
        let dw = async_event_dw0(
            AsyncEventType::NOTICE,
            AsyncNotice::NAMESPACE_ATTRIBUTE_CHANGED.0,
            LogPageId::CHANGED_NAMESPACE_LIST,
        );
        // Linux nvmet: NVME_AER_NOTICE_NS_CHANGED -> 0x00040002.
        assert_eq!(dw, 0x0004_0002);
        let dw = async_event_dw0(
            AsyncEventType::NOTICE,
            AsyncNotice::DISCOVERY_LOG_CHANGE.0,
            LogPageId::DISCOVERY,
        );
        assert_eq!(dw, 0x0070_F002);
        assert_eq!(
            parse_async_event_dw0(dw),
            (AsyncEventType::NOTICE, 0xF0, LogPageId::DISCOVERY)
        );
    }

    #[test]
    fn number_of_queues() {
        let n = NumberOfQueues::from_dword(0x0003_0007);
        assert_eq!(n, NumberOfQueues { nsq: 8, ncq: 4 });
        assert_eq!(n.to_dword(), 0x0003_0007);
        assert_eq!(
            NumberOfQueues {
                nsq: 0,
                ncq: 1 << 20
            }
            .to_dword(),
            0xFFFF_0000
        );
    }

    #[test]
    fn debug_names() {
        assert_eq!(
            format!("{:?}", FeatureId::HOST_IDENTIFIER),
            "HOST_IDENTIFIER"
        );
        assert_eq!(format!("{:?}", FeatureId(0xC5)), "FeatureId(0xc5)");
    }
}

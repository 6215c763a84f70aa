//! Identify data structures (NVMe 2.0 base, 5.17.2) and the string conventions of their fields.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

open_enum! {
    /// Controller or Namespace Structure (NVMe 2.0 base, Figure 273).
    pub struct Cns(u8) {
        NAMESPACE = 0x00,
        CONTROLLER = 0x01,
        ACTIVE_NAMESPACE_LIST = 0x02,
        NAMESPACE_ID_DESCRIPTOR_LIST = 0x03,
        NVM_SET_LIST = 0x04,
        IO_COMMAND_SET_NAMESPACE = 0x05,
        IO_COMMAND_SET_CONTROLLER = 0x06,
        IO_COMMAND_SET_ACTIVE_NAMESPACE_LIST = 0x07,
        IO_COMMAND_SET_INDEPENDENT_NAMESPACE = 0x08,
        ALLOCATED_NAMESPACE_LIST = 0x10,
        ALLOCATED_NAMESPACE = 0x11,
        NAMESPACE_ATTACHED_CONTROLLER_LIST = 0x12,
        CONTROLLER_LIST = 0x13,
        PRIMARY_CONTROLLER_CAPABILITIES = 0x14,
        SECONDARY_CONTROLLER_LIST = 0x15,
        NAMESPACE_GRANULARITY_LIST = 0x16,
        UUID_LIST = 0x17,
        DOMAIN_LIST = 0x18,
        ENDURANCE_GROUP_LIST = 0x19,
        IO_COMMAND_SET_ALLOCATED_NAMESPACE_LIST = 0x1A,
        IO_COMMAND_SET_ALLOCATED_NAMESPACE = 0x1B,
        IO_COMMAND_SET = 0x1C,
    }
}

/// Power State Descriptor (NVMe 2.0 base, Figure 276).
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
pub struct PowerStateDescriptor {
    /// Maximum power in centiwatts (or 0.0001 W with MXPS).
    pub mp: U16,
    pub rsvd2: u8,
    /// Bit 0 MXPS, bit 1 NOPS (non-operational state).
    pub flags: u8,
    pub enlat: U32,
    pub exlat: U32,
    pub rrt: u8,
    pub rrl: u8,
    pub rwt: u8,
    pub rwl: u8,
    pub idlp: U16,
    pub ips: u8,
    pub rsvd19: u8,
    pub actp: U16,
    pub apw_aps: u8,
    pub rsvd23: [u8; 9],
}
const _: () = assert!(core::mem::size_of::<PowerStateDescriptor>() == 32);

/// Identify Controller data structure (NVMe 2.0 base, Figure 275), including the fabrics
/// fields at 1792 (NVMe-oF 1.1, Figure 28).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct IdentifyController {
    pub vid: U16,
    pub ssvid: U16,
    /// Serial number, ASCII, space padded.
    pub sn: [u8; 20],
    pub mn: [u8; 40],
    pub fr: [u8; 8],
    pub rab: u8,
    pub ieee: [u8; 3],
    pub cmic: u8,
    /// Maximum data transfer size as a power of two in units of CAP.MPSMIN; 0 = no limit.
    pub mdts: u8,
    pub cntlid: U16,
    pub ver: U32,
    pub rtd3r: U32,
    pub rtd3e: U32,
    pub oaes: U32,
    pub ctratt: U32,
    pub rrls: U16,
    pub rsvd102: [u8; 9],
    pub cntrltype: u8,
    pub fguid: [u8; 16],
    pub crdt1: U16,
    pub crdt2: U16,
    pub crdt3: U16,
    pub rsvd134: [u8; 119],
    pub nvmsr: u8,
    pub vwci: u8,
    pub mec: u8,
    pub oacs: U16,
    pub acl: u8,
    pub aerl: u8,
    pub frmw: u8,
    pub lpa: u8,
    pub elpe: u8,
    pub npss: u8,
    pub avscc: u8,
    pub apsta: u8,
    pub wctemp: U16,
    pub cctemp: U16,
    pub mtfa: U16,
    pub hmpre: U32,
    pub hmmin: U32,
    pub tnvmcap: [u8; 16],
    pub unvmcap: [u8; 16],
    pub rpmbs: U32,
    pub edstt: U16,
    pub dsto: u8,
    pub fwug: u8,
    /// Keep Alive granularity in 100 ms units.
    pub kas: U16,
    pub hctma: U16,
    pub mntmt: U16,
    pub mxtmt: U16,
    pub sanicap: U32,
    pub hmminds: U32,
    pub hmmaxd: U16,
    pub nsetidmax: U16,
    pub endgidmax: U16,
    pub anatt: u8,
    pub anacap: u8,
    pub anagrpmax: U32,
    pub nanagrpid: U32,
    pub pels: U32,
    pub domainid: U16,
    pub rsvd358: [u8; 10],
    pub megcap: [u8; 16],
    pub rsvd384: [u8; 128],
    /// Required (bits 3:0) and maximum (7:4) SQ entry size, powers of two.
    pub sqes: u8,
    pub cqes: u8,
    pub maxcmd: U16,
    pub nn: U32,
    pub oncs: U16,
    pub fuses: U16,
    pub fna: u8,
    pub vwc: u8,
    pub awun: U16,
    pub awupf: U16,
    pub icsvscc: u8,
    pub nwpc: u8,
    pub acwu: U16,
    pub ocfs: U16,
    pub sgls: U32,
    pub mnan: U32,
    pub maxdna: [u8; 16],
    pub maxcna: U32,
    pub rsvd564: [u8; 204],
    pub subnqn: [u8; 256],
    pub rsvd1024: [u8; 768],
    /// I/O Queue Command Capsule Supported Size, in 16-byte units (64-byte SQE included).
    pub ioccsz: U32,
    /// I/O Queue Response Capsule Supported Size, in 16-byte units.
    pub iorcsz: U32,
    /// In Capsule Data Offset, in 16-byte units past the SQE.
    pub icdoff: U16,
    pub fcatt: u8,
    /// Maximum SGL Data Block Descriptors per command.
    pub msdbd: u8,
    pub ofcs: U16,
    pub dctype: u8,
    pub rsvd1807: [u8; 241],
    pub psd: [PowerStateDescriptor; 32],
    pub vs: [u8; 1024],
}
const _: () = assert!(core::mem::size_of::<IdentifyController>() == 4096);

/// CNTRLTYPE values (NVMe 2.0 base, Figure 275).
pub const CNTRLTYPE_IO: u8 = 1;
pub const CNTRLTYPE_DISCOVERY: u8 = 2;
pub const CNTRLTYPE_ADMINISTRATIVE: u8 = 3;

/// CMIC bits.
pub const CMIC_MULTI_PORT: u8 = 1 << 0;
pub const CMIC_MULTI_CONTROLLER: u8 = 1 << 1;
pub const CMIC_ANA: u8 = 1 << 3;

/// ANACAP bits (NVMe 2.0 base, Figure 275): the ANA states the controller can report (bits
/// 4:0); bit 6 promises an ANAGRPID never changes while the namespace is attached, bit 7 that
/// Namespace Management takes a non-zero ANAGRPID.
pub const ANACAP_OPTIMIZED: u8 = 1 << 0;
pub const ANACAP_NON_OPTIMIZED: u8 = 1 << 1;
pub const ANACAP_INACCESSIBLE: u8 = 1 << 2;
pub const ANACAP_PERSISTENT_LOSS: u8 = 1 << 3;
pub const ANACAP_CHANGE: u8 = 1 << 4;
pub const ANACAP_GRPID_STATIC: u8 = 1 << 6;
pub const ANACAP_GRPID_NS_MGMT: u8 = 1 << 7;

/// OAES bits matching the AEC feature bits in [`super::features`].
pub const OAES_NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
pub const OAES_FIRMWARE_ACTIVATION: u32 = 1 << 9;
pub const OAES_ANA_CHANGE: u32 = 1 << 11;
pub const OAES_DISCOVERY_LOG_CHANGE: u32 = 1 << 31;

/// CTRATT bit 0: 128-bit host identifier supported (required over fabrics).
pub const CTRATT_HOST_ID_128: u32 = 1 << 0;

/// LPA bits.
pub const LPA_SMART_PER_NAMESPACE: u8 = 1 << 0;
pub const LPA_COMMANDS_EFFECTS: u8 = 1 << 1;
pub const LPA_EXTENDED_DATA: u8 = 1 << 2;

/// ONCS bits (NVMe 2.0 base, Figure 275, bytes 521:520).
pub const ONCS_COMPARE: u16 = 1 << 0;
pub const ONCS_WRITE_UNCORRECTABLE: u16 = 1 << 1;
pub const ONCS_DSM: u16 = 1 << 2;
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
pub const ONCS_SAVE_SELECT: u16 = 1 << 4;
pub const ONCS_RESERVATIONS: u16 = 1 << 5;
pub const ONCS_TIMESTAMP: u16 = 1 << 6;
pub const ONCS_VERIFY: u16 = 1 << 7;
pub const ONCS_COPY: u16 = 1 << 8;

/// FUSES bit 0: Compare and Write fused operation.
pub const FUSES_COMPARE_AND_WRITE: u16 = 1 << 0;
/// VWC bit 0: a volatile write cache is present; bits 2:1 = 11b: flush with NSID FFFFFFFFh
/// is supported.
pub const VWC_PRESENT: u8 = 1 << 0;
pub const VWC_FLUSH_BROADCAST: u8 = 0b11 << 1;

/// SGLS bits: bits 1:0 = 01b SGLs supported without alignment constraint, bit 2 keyed SGL data
/// blocks, bit 16 bit buckets, bit 18 a data SGL may describe more than the command transfers
/// ("oversized SGL"), bit 20 offset-based addresses (in-capsule data).
pub const SGLS_SUPPORTED: u32 = 0b01;
pub const SGLS_KEYED: u32 = 1 << 2;
pub const SGLS_BIT_BUCKET: u32 = 1 << 16;
pub const SGLS_OVERSIZED: u32 = 1 << 18;
pub const SGLS_OFFSET: u32 = 1 << 20;

/// SQES / CQES for 64-byte SQEs and 16-byte CQEs (required = maximum).
pub const SQES_64: u8 = 0x66;
pub const CQES_16: u8 = 0x44;

/// LBA Format (NVMe 2.0 NVM command set, Figure 98).
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
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub ms: U16,
    /// Block size as a power of two (9 = 512 bytes).
    pub lbads: u8,
    /// Relative performance in bits 1:0.
    pub rp: u8,
}
const _: () = assert!(core::mem::size_of::<LbaFormat>() == 4);

impl LbaFormat {
    pub fn new(lbads: u8, ms: u16) -> Self {
        Self {
            ms: U16::new(ms),
            lbads,
            rp: 0,
        }
    }

    pub fn block_size(&self) -> u64 {
        1u64.checked_shl(u32::from(self.lbads)).unwrap_or(0)
    }
}

/// Identify Namespace data structure for the NVM command set (NVMe 2.0 NVM command set,
/// Figure 97).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct IdentifyNamespace {
    pub nsze: U64,
    pub ncap: U64,
    pub nuse: U64,
    pub nsfeat: u8,
    /// Number of LBA formats, zero-based.
    pub nlbaf: u8,
    /// Formatted LBA size: format index in bits 3:0 (and 6:5 for >16 formats).
    pub flbas: u8,
    pub mc: u8,
    pub dpc: u8,
    pub dps: u8,
    pub nmic: u8,
    pub rescap: u8,
    pub fpi: u8,
    pub dlfeat: u8,
    pub nawun: U16,
    pub nawupf: U16,
    pub nacwu: U16,
    pub nabsn: U16,
    pub nabo: U16,
    pub nabspf: U16,
    pub noiob: U16,
    pub nvmcap: [u8; 16],
    pub npwg: U16,
    pub npwa: U16,
    pub npdg: U16,
    pub npda: U16,
    pub nows: U16,
    pub mssrl: U16,
    pub mcl: U32,
    pub msrc: u8,
    pub rsvd81: [u8; 11],
    pub anagrpid: U32,
    pub rsvd96: [u8; 3],
    pub nsattr: u8,
    pub nvmsetid: U16,
    pub endgid: U16,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub lbaf: [LbaFormat; 64],
    pub vs: [u8; 3712],
}
const _: () = assert!(core::mem::size_of::<IdentifyNamespace>() == 4096);

/// NSFEAT bit 0: thin provisioning; bit 2: DEALLOCATED / UNWRITTEN errors; bit 3: NGUID and
/// EUI64 are never reused; bit 4: NPWG..NOWS are valid.
pub const NSFEAT_THIN_PROVISIONING: u8 = 1 << 0;
pub const NSFEAT_OPTIMAL_IO: u8 = 1 << 4;
/// DLFEAT bits 2:0 = 001b: deallocated blocks read as zeroes; bit 3: Write Zeroes DEAC works.
pub const DLFEAT_READS_ZEROES: u8 = 0b001;
pub const DLFEAT_WRITE_ZEROES_DEALLOCATE: u8 = 1 << 3;
/// NMIC bit 0: the namespace may be attached to more than one controller.
pub const NMIC_SHARED: u8 = 1 << 0;

impl IdentifyNamespace {
    /// The LBA format selected by FLBAS.
    pub fn current_lbaf(&self) -> &LbaFormat {
        let idx = (self.flbas & 0xF) | ((self.flbas >> 1) & 0x30);
        &self.lbaf[usize::from(idx) % self.lbaf.len()]
    }
}

open_enum! {
    /// Namespace Identifier Type (NVMe 2.0 base, Figure 279).
    pub struct NsIdType(u8) {
        EUI64 = 1,
        NGUID = 2,
        UUID = 3,
        CSI = 4,
    }
}

impl NsIdType {
    /// NIDL (identifier length) for each type.
    pub const fn nidl(self) -> Option<u8> {
        match self.0 {
            1 => Some(8),
            2 | 3 => Some(16),
            4 => Some(1),
            _ => None,
        }
    }
}

fn put_desc(out: &mut [u8], pos: usize, ty: NsIdType, id: &[u8]) -> usize {
    let end = pos + 4 + id.len();
    out[pos] = ty.0;
    out[pos + 1] = id.len() as u8;
    out[pos + 2..pos + 4].fill(0);
    out[pos + 4..end].copy_from_slice(id);
    end
}

/// Fills a Namespace Identification Descriptor list (CNS 03h, NVMe 2.0 base, 5.17.2.3): a
/// 4-byte header (NIDT, NIDL, 2 reserved) then the identifier, for each present id; the rest is
/// zeroed, which terminates the list. Returns the bytes used.
pub fn write_ns_id_descriptors(
    out: &mut [u8; 4096],
    nguid: Option<[u8; 16]>,
    uuid: Option<[u8; 16]>,
    eui64: Option<[u8; 8]>,
) -> usize {
    out.fill(0);
    let mut pos = 0;
    if let Some(id) = eui64 {
        pos = put_desc(out, pos, NsIdType::EUI64, &id);
    }
    if let Some(id) = nguid {
        pos = put_desc(out, pos, NsIdType::NGUID, &id);
    }
    if let Some(id) = uuid {
        pos = put_desc(out, pos, NsIdType::UUID, &id);
    }
    pos
}

/// Appends a Command Set Identifier descriptor at `pos` (as returned by
/// [`write_ns_id_descriptors`]); hosts that enabled CC.CSS = 110b require one.
pub fn append_csi_descriptor(out: &mut [u8; 4096], pos: usize, csi: u8) -> usize {
    put_desc(out, pos, NsIdType::CSI, &[csi])
}

/// Entries in a namespace / changed-namespace list page.
pub const NS_LIST_ENTRIES: usize = 1024;

/// Fills an Active Namespace ID list (CNS 02h): up to 1024 NSIDs greater than
/// `ids_greater_than`, zero padded. `ids` must be ascending, as the list is. Returns the count.
pub fn write_ns_list(
    out: &mut [u8; 4096],
    ids_greater_than: u32,
    ids: impl IntoIterator<Item = u32>,
) -> usize {
    out.fill(0);
    let mut n = 0;
    for id in ids.into_iter().filter(|&id| id > ids_greater_than) {
        if n == NS_LIST_ENTRIES {
            break;
        }
        out[n * 4..n * 4 + 4].copy_from_slice(&id.to_le_bytes());
        n += 1;
    }
    n
}

/// Writes an ASCII field (SN, MN, FR) space padded; longer strings are cut.
pub fn set_ascii(field: &mut [u8], s: &str) {
    let n = s.len().min(field.len());
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
    field[n..].fill(b' ');
}

/// Writes a NUL-padded string (NQNs); at least one NUL is kept so readers can find the end.
pub fn set_nqn(field: &mut [u8], s: &str) {
    let n = s.len().min(field.len().saturating_sub(1));
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
    field[n..].fill(0);
}

fn utf8_prefix(b: &[u8]) -> &str {
    match core::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or_default(),
    }
}

/// Reads a space (or NUL) padded ASCII field; invalid UTF-8 ends the string.
pub fn ascii_str(field: &[u8]) -> &str {
    utf8_prefix(field).trim_end_matches([' ', '\0'])
}

/// Reads a NUL terminated (or filling) string; invalid UTF-8 ends the string.
pub fn nul_str(field: &[u8]) -> &str {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    utf8_prefix(&field[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;
    use zerocopy::FromZeros;

    #[test]
    fn controller_offsets() {
        type C = IdentifyController;
        let pins = [
            (offset_of!(C, sn), 4),
            (offset_of!(C, mn), 24),
            (offset_of!(C, fr), 64),
            (offset_of!(C, rab), 72),
            (offset_of!(C, ieee), 73),
            (offset_of!(C, cmic), 76),
            (offset_of!(C, mdts), 77),
            (offset_of!(C, cntlid), 78),
            (offset_of!(C, ver), 80),
            (offset_of!(C, oaes), 92),
            (offset_of!(C, ctratt), 96),
            (offset_of!(C, rrls), 100),
            (offset_of!(C, cntrltype), 111),
            (offset_of!(C, fguid), 112),
            (offset_of!(C, crdt1), 128),
            (offset_of!(C, nvmsr), 253),
            (offset_of!(C, oacs), 256),
            (offset_of!(C, acl), 258),
            (offset_of!(C, aerl), 259),
            (offset_of!(C, frmw), 260),
            (offset_of!(C, lpa), 261),
            (offset_of!(C, elpe), 262),
            (offset_of!(C, npss), 263),
            (offset_of!(C, wctemp), 266),
            (offset_of!(C, cctemp), 268),
            (offset_of!(C, tnvmcap), 280),
            (offset_of!(C, rpmbs), 312),
            (offset_of!(C, kas), 320),
            (offset_of!(C, sanicap), 328),
            (offset_of!(C, anatt), 342),
            (offset_of!(C, anagrpmax), 344),
            (offset_of!(C, pels), 352),
            (offset_of!(C, megcap), 368),
            (offset_of!(C, sqes), 512),
            (offset_of!(C, cqes), 513),
            (offset_of!(C, maxcmd), 514),
            (offset_of!(C, nn), 516),
            (offset_of!(C, oncs), 520),
            (offset_of!(C, fuses), 522),
            (offset_of!(C, fna), 524),
            (offset_of!(C, vwc), 525),
            (offset_of!(C, awun), 526),
            (offset_of!(C, awupf), 528),
            (offset_of!(C, icsvscc), 530),
            (offset_of!(C, nwpc), 531),
            (offset_of!(C, acwu), 532),
            (offset_of!(C, ocfs), 534),
            (offset_of!(C, sgls), 536),
            (offset_of!(C, mnan), 540),
            (offset_of!(C, maxdna), 544),
            (offset_of!(C, maxcna), 560),
            (offset_of!(C, subnqn), 768),
            (offset_of!(C, ioccsz), 1792),
            (offset_of!(C, iorcsz), 1796),
            (offset_of!(C, icdoff), 1800),
            (offset_of!(C, fcatt), 1802),
            (offset_of!(C, msdbd), 1803),
            (offset_of!(C, ofcs), 1804),
            (offset_of!(C, dctype), 1806),
            (offset_of!(C, psd), 2048),
            (offset_of!(C, vs), 3072),
        ];
        for (i, (got, want)) in pins.iter().enumerate() {
            assert_eq!(got, want, "pin #{i}");
        }
        assert_eq!(offset_of!(PowerStateDescriptor, enlat), 4);
        assert_eq!(offset_of!(PowerStateDescriptor, idlp), 16);
        assert_eq!(offset_of!(PowerStateDescriptor, actp), 20);
    }

    #[test]
    fn namespace_offsets() {
        type N = IdentifyNamespace;
        assert_eq!(offset_of!(N, nsfeat), 24);
        assert_eq!(offset_of!(N, nlbaf), 25);
        assert_eq!(offset_of!(N, flbas), 26);
        assert_eq!(offset_of!(N, dlfeat), 33);
        assert_eq!(offset_of!(N, nawun), 34);
        assert_eq!(offset_of!(N, noiob), 46);
        assert_eq!(offset_of!(N, nvmcap), 48);
        assert_eq!(offset_of!(N, npwg), 64);
        assert_eq!(offset_of!(N, nows), 72);
        assert_eq!(offset_of!(N, mcl), 76);
        assert_eq!(offset_of!(N, anagrpid), 92);
        assert_eq!(offset_of!(N, nsattr), 99);
        assert_eq!(offset_of!(N, nvmsetid), 100);
        assert_eq!(offset_of!(N, endgid), 102);
        assert_eq!(offset_of!(N, nguid), 104);
        assert_eq!(offset_of!(N, eui64), 120);
        assert_eq!(offset_of!(N, lbaf), 128);
        assert_eq!(offset_of!(N, vs), 384);
        let mut ns = N::new_zeroed();
        ns.lbaf[1] = LbaFormat::new(12, 0);
        ns.flbas = 1;
        assert_eq!(ns.current_lbaf().block_size(), 4096);
        assert_eq!(ns.as_bytes()[128 + 4 + 2], 12);
    }

    #[test]
    fn strings() {
        let mut sn = [0u8; 20];
        set_ascii(&mut sn, "SPDK001");
        assert_eq!(&sn[..9], b"SPDK001  ");
        assert_eq!(ascii_str(&sn), "SPDK001");
        let mut nqn = [0xAAu8; 16];
        set_nqn(&mut nqn, "nqn.a-very-long-name");
        assert_eq!(nqn[15], 0);
        assert_eq!(nul_str(&nqn), "nqn.a-very-long");
        assert_eq!(nul_str(&[b'a', 0xFF, b'b']), "a");
    }

    #[test]
    fn ns_id_descriptors() {
        let mut out = [0xEEu8; 4096];
        let n = write_ns_id_descriptors(&mut out, Some([2; 16]), Some([3; 16]), Some([1; 8]));
        assert_eq!(n, 12 + 20 + 20);
        assert_eq!(&out[0..4], &[1, 8, 0, 0]);
        assert_eq!(&out[12..16], &[2, 16, 0, 0]);
        assert_eq!(&out[32..36], &[3, 16, 0, 0]);
        assert_eq!(out[36], 3);
        let n = append_csi_descriptor(&mut out, n, 0);
        assert_eq!(&out[52..57], &[4, 1, 0, 0, 0]);
        assert_eq!(n, 57);
        assert!(out[57..].iter().all(|&b| b == 0));
        assert_eq!(NsIdType::UUID.nidl(), Some(16));
    }

    #[test]
    fn ns_list() {
        let mut out = [0xEEu8; 4096];
        assert_eq!(write_ns_list(&mut out, 1, [1, 2, 5]), 2);
        assert_eq!(&out[0..12], &[2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(write_ns_list(&mut out, 0, 1..=5000), 1024);
        assert_eq!(&out[4092..4096], &1024u32.to_le_bytes());
    }
}

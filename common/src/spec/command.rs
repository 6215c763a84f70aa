//! Submission Queue Entry (NVMe 2.0 base, 4.2 "Submission Queue Entry"), the admin and NVM
//! opcodes, and typed views of the command dwords the target parses.
//!
//! Counts on the wire are zero-based almost everywhere (NLB, NR, NUMD); the views here add one
//! so callers never see a zero-based count.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::features::{FeatureId, FeatureSelect};
use super::identify::Cns;
use super::log_page::LogPageId;
use super::sgl::SglDescriptor;

/// Opcode of every Fabrics command; the command type is in `fctype` (NVMe-oF 1.1, 3.1).
pub const FABRICS_OPCODE: u8 = 0x7F;

open_enum! {
    /// Admin command opcodes (NVMe 2.0 base, Figure 138).
    pub struct AdminOpcode(u8) {
        DELETE_IO_SQ = 0x00,
        CREATE_IO_SQ = 0x01,
        GET_LOG_PAGE = 0x02,
        DELETE_IO_CQ = 0x04,
        CREATE_IO_CQ = 0x05,
        IDENTIFY = 0x06,
        ABORT = 0x08,
        SET_FEATURES = 0x09,
        GET_FEATURES = 0x0A,
        ASYNC_EVENT_REQUEST = 0x0C,
        NS_MANAGEMENT = 0x0D,
        FIRMWARE_COMMIT = 0x10,
        FIRMWARE_DOWNLOAD = 0x11,
        DEVICE_SELF_TEST = 0x14,
        NS_ATTACHMENT = 0x15,
        KEEP_ALIVE = 0x18,
        DIRECTIVE_SEND = 0x19,
        DIRECTIVE_RECV = 0x1A,
        VIRT_MGMT = 0x1C,
        NVME_MI_SEND = 0x1D,
        NVME_MI_RECV = 0x1E,
        CAPACITY_MANAGEMENT = 0x20,
        LOCKDOWN = 0x24,
        DOORBELL_BUFFER_CONFIG = 0x7C,
        FABRICS = 0x7F,
        FORMAT_NVM = 0x80,
        SECURITY_SEND = 0x81,
        SECURITY_RECV = 0x82,
        SANITIZE = 0x84,
        GET_LBA_STATUS = 0x86,
    }
}

open_enum! {
    /// NVM command set I/O opcodes (NVMe 2.0 NVM command set, Figure 18).
    pub struct IoOpcode(u8) {
        FLUSH = 0x00,
        WRITE = 0x01,
        READ = 0x02,
        WRITE_UNCORRECTABLE = 0x04,
        COMPARE = 0x05,
        WRITE_ZEROES = 0x08,
        DATASET_MANAGEMENT = 0x09,
        VERIFY = 0x0C,
        RESERVATION_REGISTER = 0x0D,
        RESERVATION_REPORT = 0x0E,
        RESERVATION_ACQUIRE = 0x11,
        RESERVATION_RELEASE = 0x15,
        COPY = 0x19,
        FABRICS = 0x7F,
    }
}

/// The 64-byte submission queue entry. Fabrics commands reuse the same bytes with their own
/// layout; see [`super::fabrics`].
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
pub struct Command {
    pub opcode: u8,
    /// FUSE in bits 1:0, PSDT in bits 7:6.
    pub flags: u8,
    pub cid: U16,
    pub nsid: U32,
    pub cdw2: U32,
    pub cdw3: U32,
    pub mptr: U64,
    pub dptr: SglDescriptor,
    pub cdw10: U32,
    pub cdw11: U32,
    pub cdw12: U32,
    pub cdw13: U32,
    pub cdw14: U32,
    pub cdw15: U32,
}
const _: () = assert!(core::mem::size_of::<Command>() == 64);

/// The broadcast NSID: all namespaces (NVMe 2.0 base, 3.2.1.2).
pub const NSID_ALL: u32 = 0xFFFF_FFFF;

impl Command {
    /// PSDT = 01b: SGLs for data, MPTR is a single contiguous buffer. Fabrics requires SGLs.
    pub const FLAG_SGL: u8 = 0x40;
    pub const FUSE_MASK: u8 = 0x03;
    pub const PSDT_MASK: u8 = 0xC0;

    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Self {
        Self {
            opcode,
            cid: U16::new(cid),
            nsid: U32::new(nsid),
            ..Self::default()
        }
    }

    /// 0 = normal, 1 = first of a fused pair, 2 = second.
    pub const fn fuse(&self) -> u8 {
        self.flags & Self::FUSE_MASK
    }

    pub const fn psdt(&self) -> u8 {
        (self.flags & Self::PSDT_MASK) >> 6
    }

    /// Points the data pointer at `sgl` and marks the command as using SGLs.
    pub fn set_sgl(&mut self, sgl: SglDescriptor) {
        self.dptr = sgl;
        self.flags = (self.flags & !Self::PSDT_MASK) | Self::FLAG_SGL;
    }

    #[must_use]
    pub fn with_sgl(mut self, sgl: SglDescriptor) -> Self {
        self.set_sgl(sgl);
        self
    }

    fn rw(opcode: IoOpcode, cid: u16, nsid: u32, slba: u64, nlb: u32) -> Self {
        debug_assert!(
            (1..=0x1_0000).contains(&nlb),
            "NLB is a 16-bit zero-based count"
        );
        let mut c = Self::new(opcode.0, cid, nsid);
        c.cdw10 = U32::new(slba as u32);
        c.cdw11 = U32::new((slba >> 32) as u32);
        c.cdw12 = U32::new(nlb.wrapping_sub(1) & 0xFFFF);
        c
    }

    /// Read `nlb` (1..=65536) blocks at `slba` (NVMe 2.0 NVM command set, 3.2.4).
    pub fn read(cid: u16, nsid: u32, slba: u64, nlb: u32) -> Self {
        Self::rw(IoOpcode::READ, cid, nsid, slba, nlb)
    }

    pub fn write(cid: u16, nsid: u32, slba: u64, nlb: u32) -> Self {
        Self::rw(IoOpcode::WRITE, cid, nsid, slba, nlb)
    }

    pub fn compare(cid: u16, nsid: u32, slba: u64, nlb: u32) -> Self {
        Self::rw(IoOpcode::COMPARE, cid, nsid, slba, nlb)
    }

    pub fn write_zeroes(cid: u16, nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Self {
        let mut c = Self::rw(IoOpcode::WRITE_ZEROES, cid, nsid, slba, nlb);
        if deallocate {
            c.cdw12 = U32::new(c.cdw12.get() | WRITE_ZEROES_DEAC);
        }
        c
    }

    pub fn flush(cid: u16, nsid: u32) -> Self {
        Self::new(IoOpcode::FLUSH.0, cid, nsid)
    }

    /// Dataset Management over `nr` (1..=256) ranges carried as data.
    pub fn dsm(cid: u16, nsid: u32, nr: u32, deallocate: bool) -> Self {
        debug_assert!((1..=256).contains(&nr));
        let mut c = Self::new(IoOpcode::DATASET_MANAGEMENT.0, cid, nsid);
        c.cdw10 = U32::new(nr.wrapping_sub(1) & 0xFF);
        c.cdw11 = U32::new(if deallocate { DSM_ATTR_DEALLOCATE } else { 0 });
        c
    }

    pub fn identify(cid: u16, cns: Cns, nsid: u32, cntid: u16) -> Self {
        let mut c = Self::new(AdminOpcode::IDENTIFY.0, cid, nsid);
        c.cdw10 = U32::new(u32::from(cns.0) | (u32::from(cntid) << 16));
        c
    }

    /// Get Log Page for `len_bytes` (a multiple of 4, at least 4) starting at byte `offset`.
    pub fn get_log_page(cid: u16, nsid: u32, lid: LogPageId, len_bytes: u32, offset: u64) -> Self {
        debug_assert!(len_bytes >= 4 && len_bytes & 3 == 0);
        let numd = (len_bytes / 4).wrapping_sub(1);
        let mut c = Self::new(AdminOpcode::GET_LOG_PAGE.0, cid, nsid);
        c.cdw10 = U32::new(u32::from(lid.0) | ((numd & 0xFFFF) << 16));
        c.cdw11 = U32::new(numd >> 16);
        c.cdw12 = U32::new(offset as u32);
        c.cdw13 = U32::new((offset >> 32) as u32);
        c
    }

    pub fn get_features(cid: u16, fid: FeatureId, sel: FeatureSelect) -> Self {
        let mut c = Self::new(AdminOpcode::GET_FEATURES.0, cid, 0);
        c.cdw10 = U32::new(u32::from(fid.0) | (u32::from(sel.0 & 0x7) << 8));
        c
    }

    pub fn set_features(cid: u16, fid: FeatureId, cdw11: u32, save: bool) -> Self {
        let mut c = Self::new(AdminOpcode::SET_FEATURES.0, cid, 0);
        c.cdw10 = U32::new(u32::from(fid.0) | if save { 1 << 31 } else { 0 });
        c.cdw11 = U32::new(cdw11);
        c
    }

    pub fn keep_alive(cid: u16) -> Self {
        Self::new(AdminOpcode::KEEP_ALIVE.0, cid, 0)
    }

    pub fn async_event_request(cid: u16) -> Self {
        Self::new(AdminOpcode::ASYNC_EVENT_REQUEST.0, cid, 0)
    }

    pub fn abort(cid: u16, sqid: u16, abort_cid: u16) -> Self {
        let mut c = Self::new(AdminOpcode::ABORT.0, cid, 0);
        c.cdw10 = U32::new(u32::from(sqid) | (u32::from(abort_cid) << 16));
        c
    }
}

/// Read/Write/Compare CDW12 flags (NVMe 2.0 NVM command set, Figure 41).
pub const RW_LIMITED_RETRY: u32 = 1 << 31;
pub const RW_FUA: u32 = 1 << 30;
/// Write Zeroes CDW12 Deallocate (NVMe 2.0 NVM command set, Figure 66).
pub const WRITE_ZEROES_DEAC: u32 = 1 << 25;
/// Dataset Management CDW11 attributes (NVMe 2.0 NVM command set, Figure 38).
pub const DSM_ATTR_INTEGRAL_READ: u32 = 1 << 0;
pub const DSM_ATTR_INTEGRAL_WRITE: u32 = 1 << 1;
pub const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;

/// Read, Write, Compare, Verify, Write Zeroes and Write Uncorrectable share this dword layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadWrite {
    pub slba: u64,
    /// Number of logical blocks, already one-based (1..=65536).
    pub nlb: u32,
    pub fua: bool,
    pub limited_retry: bool,
}

impl ReadWrite {
    pub fn parse(cmd: &Command) -> Self {
        let cdw12 = cmd.cdw12.get();
        Self {
            slba: u64::from(cmd.cdw10.get()) | (u64::from(cmd.cdw11.get()) << 32),
            nlb: (cdw12 & 0xFFFF) + 1,
            fua: cdw12 & RW_FUA != 0,
            limited_retry: cdw12 & RW_LIMITED_RETRY != 0,
        }
    }
}

/// Write Zeroes asks to deallocate the range instead of writing zeroes.
pub fn write_zeroes_deallocate(cmd: &Command) -> bool {
    cmd.cdw12.get() & WRITE_ZEROES_DEAC != 0
}

/// Dataset Management (NVMe 2.0 NVM command set, 3.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dsm {
    /// Number of ranges in the data buffer, already one-based (1..=256).
    pub nr: u32,
    pub attr_deallocate: bool,
}

impl Dsm {
    pub fn parse(cmd: &Command) -> Self {
        Self {
            nr: (cmd.cdw10.get() & 0xFF) + 1,
            attr_deallocate: cmd.cdw11.get() & DSM_ATTR_DEALLOCATE != 0,
        }
    }

    /// Bytes of range data the host sends.
    pub fn data_len(&self) -> usize {
        self.nr as usize * core::mem::size_of::<DsmRange>()
    }
}

/// One Dataset Management range (NVMe 2.0 NVM command set, Figure 39).
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
pub struct DsmRange {
    pub cattr: U32,
    /// Length in logical blocks; one-based here, unlike the command's NLB.
    pub nlb: U32,
    pub slba: U64,
}
const _: () = assert!(core::mem::size_of::<DsmRange>() == 16);

/// Get Log Page (NVMe 2.0 base, 5.16): CDW10..CDW14.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetLogPage {
    pub lid: LogPageId,
    /// Log Specific Field, 7 bits in NVMe 2.0 (CDW10 bits 14:8).
    pub lsp: u8,
    /// Retain Asynchronous Event: reading the log does not clear a pending AEN.
    pub rae: bool,
    /// Dwords to return, already one-based. Saturates at `u32::MAX` for the single value
    /// (NUMDU:NUMDL = FFFF_FFFFh) that would overflow; no log page is that big.
    pub numd: u32,
    /// Byte offset into the log page (LPOL/LPOU).
    pub offset: u64,
    /// Log Specific Identifier (CDW11 bits 31:16).
    pub lsi: u16,
    /// Command Set Identifier (CDW14 bits 31:24).
    pub csi: u8,
}

impl GetLogPage {
    pub fn parse(cmd: &Command) -> Self {
        let (cdw10, cdw11) = (cmd.cdw10.get(), cmd.cdw11.get());
        let numd0 = (cdw10 >> 16) | ((cdw11 & 0xFFFF) << 16);
        Self {
            lid: LogPageId(cdw10 as u8),
            lsp: ((cdw10 >> 8) & 0x7F) as u8,
            rae: cdw10 & (1 << 15) != 0,
            numd: numd0.saturating_add(1),
            offset: u64::from(cmd.cdw12.get()) | (u64::from(cmd.cdw13.get()) << 32),
            lsi: (cdw11 >> 16) as u16,
            csi: (cmd.cdw14.get() >> 24) as u8,
        }
    }

    /// Bytes to return.
    pub fn len_bytes(&self) -> u64 {
        u64::from(self.numd) * 4
    }
}

/// Identify (NVMe 2.0 base, 5.17): CDW10 and CDW11.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identify {
    pub cns: Cns,
    /// Controller Identifier (CDW10 bits 31:16), for controller-list CNS values.
    pub cntid: u16,
    /// CNS Specific Identifier (CDW11 bits 15:0): NVM Set / Endurance Group / Domain id.
    pub nvmsetid: u16,
    /// Command Set Identifier (CDW11 bits 31:24).
    pub csi: u8,
}

impl Identify {
    pub fn parse(cmd: &Command) -> Self {
        let (cdw10, cdw11) = (cmd.cdw10.get(), cmd.cdw11.get());
        Self {
            cns: Cns(cdw10 as u8),
            cntid: (cdw10 >> 16) as u16,
            nvmsetid: cdw11 as u16,
            csi: (cdw11 >> 24) as u8,
        }
    }
}

/// Get Features (NVMe 2.0 base, 5.15): FID in CDW10 bits 7:0, SEL in bits 10:8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetFeatures {
    pub fid: FeatureId,
    pub sel: FeatureSelect,
}

impl GetFeatures {
    pub fn parse(cmd: &Command) -> Self {
        let cdw10 = cmd.cdw10.get();
        Self {
            fid: FeatureId(cdw10 as u8),
            sel: FeatureSelect(((cdw10 >> 8) & 0x7) as u8),
        }
    }
}

/// Set Features (NVMe 2.0 base, 5.27): FID in CDW10 bits 7:0, SV (save) in bit 31. The value
/// itself is feature specific, mostly CDW11.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetFeatures {
    pub fid: FeatureId,
    pub save: bool,
    pub cdw11: u32,
}

impl SetFeatures {
    pub fn parse(cmd: &Command) -> Self {
        let cdw10 = cmd.cdw10.get();
        Self {
            fid: FeatureId(cdw10 as u8),
            save: cdw10 & (1 << 31) != 0,
            cdw11: cmd.cdw11.get(),
        }
    }
}

/// Abort (NVMe 2.0 base, 5.1): SQID in CDW10 bits 15:0, CID in bits 31:16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abort {
    pub sqid: u16,
    pub cid: u16,
}

impl Abort {
    pub fn parse(cmd: &Command) -> Self {
        let cdw10 = cmd.cdw10.get();
        Self {
            sqid: cdw10 as u16,
            cid: (cdw10 >> 16) as u16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn sqe_layout() {
        assert_eq!(offset_of!(Command, opcode), 0);
        assert_eq!(offset_of!(Command, flags), 1);
        assert_eq!(offset_of!(Command, cid), 2);
        assert_eq!(offset_of!(Command, nsid), 4);
        assert_eq!(offset_of!(Command, cdw2), 8);
        assert_eq!(offset_of!(Command, cdw3), 12);
        assert_eq!(offset_of!(Command, mptr), 16);
        assert_eq!(offset_of!(Command, dptr), 24);
        assert_eq!(offset_of!(Command, cdw10), 40);
        assert_eq!(offset_of!(Command, cdw11), 44);
        assert_eq!(offset_of!(Command, cdw12), 48);
        assert_eq!(offset_of!(Command, cdw13), 52);
        assert_eq!(offset_of!(Command, cdw14), 56);
        assert_eq!(offset_of!(Command, cdw15), 60);
        assert_eq!(offset_of!(DsmRange, nlb), 4);
        assert_eq!(offset_of!(DsmRange, slba), 8);
    }

    #[test]
    fn read_write_round_trip() {
        let c =
            Command::read(9, 1, 0x1_2345_6789, 8).with_sgl(SglDescriptor::keyed(0, 4096, 5, false));
        assert_eq!(c.opcode, 0x02);
        assert_eq!(c.psdt(), 1);
        assert_eq!(c.cdw12.get(), 7);
        let b = c.as_bytes();
        assert_eq!(&b[40..48], &0x1_2345_6789u64.to_le_bytes());
        let rw = ReadWrite::parse(&c);
        assert_eq!(
            rw,
            ReadWrite {
                slba: 0x1_2345_6789,
                nlb: 8,
                fua: false,
                limited_retry: false
            }
        );
        let mut w = Command::write(1, 1, 0, 0x1_0000);
        w.cdw12 = U32::new(w.cdw12.get() | RW_FUA | RW_LIMITED_RETRY);
        let rw = ReadWrite::parse(&w);
        assert_eq!((rw.nlb, rw.fua, rw.limited_retry), (0x1_0000, true, true));
        let wz = Command::write_zeroes(1, 1, 0, 1, true);
        assert!(write_zeroes_deallocate(&wz));
        assert_eq!(wz.cdw12.get(), 1 << 25);
    }

    #[test]
    fn dsm_round_trip() {
        let c = Command::dsm(1, 1, 256, true);
        assert_eq!(c.cdw10.get(), 255);
        assert_eq!(c.cdw11.get(), 4);
        assert_eq!(
            Dsm::parse(&c),
            Dsm {
                nr: 256,
                attr_deallocate: true
            }
        );
        assert_eq!(Dsm::parse(&c).data_len(), 4096);
    }

    #[test]
    fn admin_views() {
        let c = Command::get_log_page(
            1,
            NSID_ALL,
            LogPageId::DISCOVERY,
            0x4_0000 * 4,
            0x1_0000_0010,
        );
        let g = GetLogPage::parse(&c);
        assert_eq!(g.lid, LogPageId::DISCOVERY);
        assert_eq!(g.numd, 0x4_0000);
        assert_eq!(g.len_bytes(), 0x4_0000 * 4);
        assert_eq!(g.offset, 0x1_0000_0010);
        assert_eq!(c.cdw10.get(), 0xFFFF_0070);
        assert_eq!(c.cdw11.get(), 0x3);
        let all = Command {
            cdw10: U32::new(0xFFFF_8000 | (0x7F << 8)),
            cdw11: U32::new(0xFFFF),
            ..Command::default()
        };
        let g = GetLogPage::parse(&all);
        assert_eq!((g.numd, g.rae, g.lsp), (u32::MAX, true, 0x7F));

        let i = Identify::parse(&Command::identify(1, Cns::CONTROLLER, 0, 0xABCD));
        assert_eq!((i.cns, i.cntid), (Cns::CONTROLLER, 0xABCD));

        let gf = GetFeatures::parse(&Command::get_features(
            1,
            FeatureId::KEEP_ALIVE_TIMER,
            FeatureSelect::SAVED,
        ));
        assert_eq!(
            (gf.fid, gf.sel),
            (FeatureId::KEEP_ALIVE_TIMER, FeatureSelect::SAVED)
        );
        let sf = SetFeatures::parse(&Command::set_features(
            1,
            FeatureId::NUMBER_OF_QUEUES,
            0x3_0003,
            true,
        ));
        assert_eq!(
            sf,
            SetFeatures {
                fid: FeatureId::NUMBER_OF_QUEUES,
                save: true,
                cdw11: 0x3_0003
            }
        );
        assert_eq!(
            Command::set_features(1, FeatureId(0x0F), 0, true)
                .cdw10
                .get(),
            0x8000_000F
        );

        let a = Abort::parse(&Command::abort(1, 2, 3));
        assert_eq!(a, Abort { sqid: 2, cid: 3 });
    }

    #[test]
    fn opcode_debug() {
        assert_eq!(format!("{:?}", AdminOpcode::KEEP_ALIVE), "KEEP_ALIVE");
        assert_eq!(format!("{:?}", IoOpcode(0x99)), "IoOpcode(0x99)");
    }
}

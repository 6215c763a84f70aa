//! Controller registers (NVMe 2.0 base, 3.1.3 "Controller Properties"). Over fabrics they are
//! properties read and written with Property Get/Set; only CAP, VS, CC, CSTS and NSSR are
//! defined for fabrics controllers (the queue registers are PCIe-only).

use core::fmt;

open_enum! {
    /// Property offsets (NVMe 2.0 base, Figure 33).
    pub struct Property(u32) {
        CAP = 0x00,
        VS = 0x08,
        INTMS = 0x0C,
        INTMC = 0x10,
        CC = 0x14,
        CSTS = 0x1C,
        NSSR = 0x20,
        AQA = 0x24,
        ASQ = 0x28,
        ACQ = 0x30,
    }
}

impl Property {
    /// Property size in bytes; Property Get/Set must use exactly this size.
    pub const fn size(self) -> u8 {
        match self {
            Self::CAP | Self::ASQ | Self::ACQ => 8,
            _ => 4,
        }
    }
}

/// NSSR value that triggers an NVM Subsystem Reset: "NVMe" in ASCII.
pub const NSSR_RESET_VALUE: u32 = 0x4E56_4D65;

const fn bits64(v: u64, shift: u32, width: u32) -> u64 {
    (v >> shift) & ((1 << width) - 1)
}
const fn set64(v: u64, shift: u32, width: u32, x: u64) -> u64 {
    let mask = ((1u64 << width) - 1) << shift;
    (v & !mask) | ((x << shift) & mask)
}
const fn bits32(v: u32, shift: u32, width: u32) -> u32 {
    (v >> shift) & ((1 << width) - 1)
}
const fn set32(v: u32, shift: u32, width: u32, x: u32) -> u32 {
    let mask = ((1u32 << width) - 1) << shift;
    (v & !mask) | ((x << shift) & mask)
}

/// Controller Capabilities (NVMe 2.0 base, Figure 36).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cap(pub u64);

impl Cap {
    /// CSS bit for the NVM command set.
    pub const CSS_NVM: u8 = 1 << 0;
    /// CSS bit: one or more I/O command sets supported (CC.CSS = 110b allowed).
    pub const CSS_IO_COMMAND_SETS: u8 = 1 << 6;
    /// CSS bit: only the admin command set (no I/O queues) — discovery controllers.
    pub const CSS_NO_IO: u8 = 1 << 7;

    /// Maximum Queue Entries Supported, zero-based.
    pub const fn mqes(self) -> u16 {
        bits64(self.0, 0, 16) as u16
    }
    pub const fn cqr(self) -> bool {
        bits64(self.0, 16, 1) != 0
    }
    pub const fn ams(self) -> u8 {
        bits64(self.0, 17, 2) as u8
    }
    /// Timeout in 500 ms units: worst case time to wait for CSTS.RDY to follow CC.EN.
    pub const fn to(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }
    pub const fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }
    pub const fn nssrs(self) -> bool {
        bits64(self.0, 36, 1) != 0
    }
    pub const fn css(self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }
    pub const fn css_nvm(self) -> bool {
        self.css() & Self::CSS_NVM != 0
    }
    pub const fn bps(self) -> bool {
        bits64(self.0, 45, 1) != 0
    }
    /// Minimum memory page size as a power of two minus 12 (0 = 4 KiB).
    pub const fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }
    pub const fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }
    pub const fn with_mqes(self, zero_based: u16) -> Self {
        Self(set64(self.0, 0, 16, zero_based as u64))
    }
    pub const fn with_cqr(self, v: bool) -> Self {
        Self(set64(self.0, 16, 1, v as u64))
    }
    pub const fn with_ams(self, v: u8) -> Self {
        Self(set64(self.0, 17, 2, v as u64))
    }
    pub const fn with_to(self, units_500ms: u8) -> Self {
        Self(set64(self.0, 24, 8, units_500ms as u64))
    }
    pub const fn with_dstrd(self, v: u8) -> Self {
        Self(set64(self.0, 32, 4, v as u64))
    }
    pub const fn with_nssrs(self, v: bool) -> Self {
        Self(set64(self.0, 36, 1, v as u64))
    }
    pub const fn with_css(self, v: u8) -> Self {
        Self(set64(self.0, 37, 8, v as u64))
    }
    pub const fn with_bps(self, v: bool) -> Self {
        Self(set64(self.0, 45, 1, v as u64))
    }
    pub const fn with_mpsmin(self, v: u8) -> Self {
        Self(set64(self.0, 48, 4, v as u64))
    }
    pub const fn with_mpsmax(self, v: u8) -> Self {
        Self(set64(self.0, 52, 4, v as u64))
    }
}

impl fmt::Debug for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cap")
            .field("mqes", &self.mqes())
            .field("cqr", &self.cqr())
            .field("ams", &self.ams())
            .field("to", &self.to())
            .field("dstrd", &self.dstrd())
            .field("nssrs", &self.nssrs())
            .field("css", &format_args!("{:#x}", self.css()))
            .field("mpsmin", &self.mpsmin())
            .field("mpsmax", &self.mpsmax())
            .finish()
    }
}

/// Controller Configuration (NVMe 2.0 base, Figure 41).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Cc(pub u32);

impl Cc {
    pub const SHN_NONE: u8 = 0;
    pub const SHN_NORMAL: u8 = 1;
    pub const SHN_ABRUPT: u8 = 2;
    /// CSS: NVM command set.
    pub const CSS_NVM: u8 = 0;
    /// CSS: all supported I/O command sets.
    pub const CSS_ALL: u8 = 6;
    /// CSS: admin command set only.
    pub const CSS_ADMIN_ONLY: u8 = 7;

    pub const fn en(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }
    pub const fn css(self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }
    /// Host memory page size is 2^(12 + MPS).
    pub const fn mps(self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }
    pub const fn ams(self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }
    pub const fn shn(self) -> u8 {
        bits32(self.0, 14, 2) as u8
    }
    /// I/O SQ entry size as a power of two (6 = 64 bytes).
    pub const fn iosqes(self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }
    /// I/O CQ entry size as a power of two (4 = 16 bytes).
    pub const fn iocqes(self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }
    pub const fn with_en(self, v: bool) -> Self {
        Self(set32(self.0, 0, 1, v as u32))
    }
    pub const fn with_css(self, v: u8) -> Self {
        Self(set32(self.0, 4, 3, v as u32))
    }
    pub const fn with_mps(self, v: u8) -> Self {
        Self(set32(self.0, 7, 4, v as u32))
    }
    pub const fn with_ams(self, v: u8) -> Self {
        Self(set32(self.0, 11, 3, v as u32))
    }
    pub const fn with_shn(self, v: u8) -> Self {
        Self(set32(self.0, 14, 2, v as u32))
    }
    pub const fn with_iosqes(self, v: u8) -> Self {
        Self(set32(self.0, 16, 4, v as u32))
    }
    pub const fn with_iocqes(self, v: u8) -> Self {
        Self(set32(self.0, 20, 4, v as u32))
    }
}

impl fmt::Debug for Cc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cc")
            .field("en", &self.en())
            .field("css", &self.css())
            .field("mps", &self.mps())
            .field("ams", &self.ams())
            .field("shn", &self.shn())
            .field("iosqes", &self.iosqes())
            .field("iocqes", &self.iocqes())
            .finish()
    }
}

/// Controller Status (NVMe 2.0 base, Figure 42).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Csts(pub u32);

impl Csts {
    pub const SHST_NORMAL: u8 = 0;
    pub const SHST_OCCURRING: u8 = 1;
    pub const SHST_COMPLETE: u8 = 2;

    pub const fn rdy(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }
    /// Controller Fatal Status.
    pub const fn cfs(self) -> bool {
        bits32(self.0, 1, 1) != 0
    }
    pub const fn shst(self) -> u8 {
        bits32(self.0, 2, 2) as u8
    }
    pub const fn nssro(self) -> bool {
        bits32(self.0, 4, 1) != 0
    }
    pub const fn pp(self) -> bool {
        bits32(self.0, 5, 1) != 0
    }
    pub const fn with_rdy(self, v: bool) -> Self {
        Self(set32(self.0, 0, 1, v as u32))
    }
    pub const fn with_cfs(self, v: bool) -> Self {
        Self(set32(self.0, 1, 1, v as u32))
    }
    pub const fn with_shst(self, v: u8) -> Self {
        Self(set32(self.0, 2, 2, v as u32))
    }
    pub const fn with_nssro(self, v: bool) -> Self {
        Self(set32(self.0, 4, 1, v as u32))
    }
    pub const fn with_pp(self, v: bool) -> Self {
        Self(set32(self.0, 5, 1, v as u32))
    }
}

impl fmt::Debug for Csts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Csts")
            .field("rdy", &self.rdy())
            .field("cfs", &self.cfs())
            .field("shst", &self.shst())
            .field("nssro", &self.nssro())
            .field("pp", &self.pp())
            .finish()
    }
}

/// Version (NVMe 2.0 base, Figure 37); also the Identify Controller VER field.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version(pub u32);

impl Version {
    pub const V1_2: Self = Self::new(1, 2, 0);
    pub const V1_3: Self = Self::new(1, 3, 0);
    pub const V1_4: Self = Self::new(1, 4, 0);
    pub const V2_0: Self = Self::new(2, 0, 0);

    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Self {
        Self(((major as u32) << 16) | ((minor as u32) << 8) | tertiary as u32)
    }
    pub const fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub const fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    pub const fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())?;
        if self.tertiary() != 0 {
            write!(f, ".{}", self.tertiary())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_fields() {
        let cap = Cap::default()
            .with_mqes(127)
            .with_cqr(true)
            .with_to(30)
            .with_css(Cap::CSS_NVM)
            .with_mpsmin(0)
            .with_mpsmax(4);
        // MQES 0x7F, CQR bit 16, TO 0x1E << 24, CSS bit 37, MPSMAX 4 << 52.
        assert_eq!(cap.0, 0x7F | 1 << 16 | 0x1E << 24 | 1 << 37 | 4 << 52);
        assert_eq!(cap.mqes(), 127);
        assert!(cap.cqr() && cap.css_nvm() && !cap.nssrs());
        assert_eq!((cap.to(), cap.mpsmax()), (30, 4));
        assert_eq!(Cap(1 << 36).with_dstrd(0xF).dstrd(), 0xF);
    }

    #[test]
    fn cc_csts() {
        // Linux host: EN | CSS_NVM | MPS(4K) | AMS_RR | SHN_NONE | IOSQES 6 | IOCQES 4.
        let cc = Cc(0x0046_0001);
        assert!(cc.en());
        assert_eq!((cc.iosqes(), cc.iocqes(), cc.mps(), cc.shn()), (6, 4, 0, 0));
        assert_eq!(
            Cc::default().with_en(true).with_iosqes(6).with_iocqes(4),
            cc
        );
        assert_eq!(cc.with_shn(Cc::SHN_NORMAL).0, 0x0046_4001);
        let csts = Csts::default()
            .with_rdy(true)
            .with_shst(Csts::SHST_COMPLETE);
        assert_eq!(csts.0, 0b1001);
        assert_eq!(csts.shst(), Csts::SHST_COMPLETE);
        assert!(Csts(1 << 5).pp() && Csts(1 << 4).nssro() && Csts(2).cfs());
    }

    #[test]
    fn version_and_properties() {
        assert_eq!(Version::V1_3.0, 0x0001_0300);
        assert_eq!(Version::V2_0.0, 0x0002_0000);
        assert_eq!(Version::new(1, 4, 1).to_string(), "1.4.1");
        assert!(Version::V1_4 < Version::V2_0);
        assert_eq!(Property::CAP.size(), 8);
        assert_eq!(Property::CSTS.size(), 4);
        assert_eq!(Property::ACQ.0, 0x30);
        assert_eq!(format!("{:?}", Property(0x14)), "CC");
    }
}

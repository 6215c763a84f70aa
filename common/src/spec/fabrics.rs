//! Fabrics commands (NVMe-oF 1.1, 3 "Fabrics Command Set"; NVMe 2.0 base, 6): their SQE
//! layouts as views over the same 64 bytes as [`Command`], and the Connect data and response.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::command::{Command, FABRICS_OPCODE};
use super::identify::{nul_str, set_nqn};
use super::sgl::SglDescriptor;

open_enum! {
    /// Fabrics Command Type, byte 4 of a fabrics SQE (NVMe-oF 1.1, Figure 8).
    pub struct FabricsCommandType(u8) {
        PROPERTY_SET = 0x00,
        CONNECT = 0x01,
        PROPERTY_GET = 0x04,
        AUTHENTICATION_SEND = 0x05,
        AUTHENTICATION_RECEIVE = 0x06,
        DISCONNECT = 0x08,
    }
}

/// Record format of Connect / Disconnect; 0 is the only one defined.
pub const RECFMT_0: u16 = 0;

/// Any fabrics command: the common header (NVMe-oF 1.1, Figure 9).
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
pub struct FabricsCommand {
    pub opcode: u8,
    pub rsvd1: u8,
    pub cid: U16,
    pub fctype: u8,
    pub rsvd5: [u8; 19],
    pub sgl: SglDescriptor,
    pub specific: [u8; 24],
}

/// Connect (NVMe-oF 1.1, 3.3): creates the admin queue (QID 0) and with it a controller, or
/// binds an I/O queue to an existing one. The data is a [`ConnectData`].
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
pub struct ConnectCommand {
    pub opcode: u8,
    pub rsvd1: u8,
    pub cid: U16,
    pub fctype: u8,
    pub rsvd5: [u8; 19],
    pub sgl: SglDescriptor,
    pub recfmt: U16,
    pub qid: U16,
    /// Submission queue size, zero-based.
    pub sqsize: U16,
    /// Connect attributes; see [`CATTR_DISABLE_SQ_FLOW`].
    pub cattr: u8,
    pub rsvd47: u8,
    /// Keep Alive Timeout in milliseconds (admin queue only; 0 disables).
    pub kato: U32,
    pub rsvd52: [u8; 12],
}

/// CATTR bit 2: the host asks for SQ flow control to be disabled, so SQHD in responses is
/// meaningless (NVMe-oF 1.1, Figure 20).
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

/// Property Get (NVMe-oF 1.1, 3.5). The value comes back in CQE dw0 (and dw1 for 8 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct PropertyGetCommand {
    pub opcode: u8,
    pub rsvd1: u8,
    pub cid: U16,
    pub fctype: u8,
    pub rsvd5: [u8; 35],
    /// Bits 2:0 size: 0 = 4 bytes, 1 = 8 bytes.
    pub attrib: u8,
    pub rsvd41: [u8; 3],
    pub offset: U32,
    pub rsvd48: [u8; 16],
}

/// Property Set (NVMe-oF 1.1, 3.6).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct PropertySetCommand {
    pub opcode: u8,
    pub rsvd1: u8,
    pub cid: U16,
    pub fctype: u8,
    pub rsvd5: [u8; 35],
    pub attrib: u8,
    pub rsvd41: [u8; 3],
    pub offset: U32,
    /// A 4-byte property uses the low half only.
    pub value: U64,
    pub rsvd56: [u8; 8],
}

/// Disconnect (NVMe 2.0 base, 6.4): tears down the I/O queue it is sent on.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct DisconnectCommand {
    pub opcode: u8,
    pub rsvd1: u8,
    pub cid: U16,
    pub fctype: u8,
    pub rsvd5: [u8; 35],
    pub recfmt: U16,
    pub rsvd42: [u8; 22],
}

const _: () = assert!(core::mem::size_of::<FabricsCommand>() == 64);
const _: () = assert!(core::mem::size_of::<ConnectCommand>() == 64);
const _: () = assert!(core::mem::size_of::<PropertyGetCommand>() == 64);
const _: () = assert!(core::mem::size_of::<PropertySetCommand>() == 64);
const _: () = assert!(core::mem::size_of::<DisconnectCommand>() == 64);

/// ATTRIB size encodings.
pub const PROPERTY_SIZE_4: u8 = 0;
pub const PROPERTY_SIZE_8: u8 = 1;

macro_rules! fabrics_view {
    ($ty:ident, $fctype:expr) => {
        impl $ty {
            pub const FCTYPE: FabricsCommandType = $fctype;

            /// Reinterprets a command; checks nothing (the caller dispatched on `fctype`).
            pub fn from_command(cmd: &Command) -> &Self {
                zerocopy::transmute_ref!(cmd)
            }

            pub fn from_command_mut(cmd: &mut Command) -> &mut Self {
                zerocopy::transmute_mut!(cmd)
            }

            pub fn to_command(&self) -> Command {
                zerocopy::transmute!(*self)
            }

            fn header(cid: u16) -> Self {
                let mut c = Self::new_zeroed();
                c.opcode = FABRICS_OPCODE;
                c.cid = U16::new(cid);
                c.fctype = $fctype.0;
                c
            }
        }
    };
}

fabrics_view!(ConnectCommand, FabricsCommandType::CONNECT);
fabrics_view!(PropertyGetCommand, FabricsCommandType::PROPERTY_GET);
fabrics_view!(PropertySetCommand, FabricsCommandType::PROPERTY_SET);
fabrics_view!(DisconnectCommand, FabricsCommandType::DISCONNECT);

impl FabricsCommand {
    pub fn from_command(cmd: &Command) -> &Self {
        zerocopy::transmute_ref!(cmd)
    }

    pub fn fctype(&self) -> FabricsCommandType {
        FabricsCommandType(self.fctype)
    }
}

impl ConnectCommand {
    /// `sqsize` is zero-based, as on the wire; the data pointer still has to be set.
    pub fn new(cid: u16, qid: u16, sqsize: u16, kato_ms: u32) -> Self {
        let mut c = Self::header(cid);
        c.recfmt = U16::new(RECFMT_0);
        c.qid = U16::new(qid);
        c.sqsize = U16::new(sqsize);
        c.kato = U32::new(kato_ms);
        c
    }
}

impl PropertyGetCommand {
    pub fn new(cid: u16, offset: u32, size8: bool) -> Self {
        let mut c = Self::header(cid);
        c.attrib = if size8 {
            PROPERTY_SIZE_8
        } else {
            PROPERTY_SIZE_4
        };
        c.offset = U32::new(offset);
        c
    }

    /// Requested size in bytes, `None` for reserved encodings.
    pub fn size(&self) -> Option<u8> {
        property_size(self.attrib)
    }
}

impl PropertySetCommand {
    pub fn new(cid: u16, offset: u32, value: u64, size8: bool) -> Self {
        let mut c = Self::header(cid);
        c.attrib = if size8 {
            PROPERTY_SIZE_8
        } else {
            PROPERTY_SIZE_4
        };
        c.offset = U32::new(offset);
        c.value = U64::new(value);
        c
    }

    pub fn size(&self) -> Option<u8> {
        property_size(self.attrib)
    }
}

impl DisconnectCommand {
    pub fn new(cid: u16) -> Self {
        let mut c = Self::header(cid);
        c.recfmt = U16::new(RECFMT_0);
        c
    }
}

fn property_size(attrib: u8) -> Option<u8> {
    match attrib & 0x7 {
        PROPERTY_SIZE_4 => Some(4),
        PROPERTY_SIZE_8 => Some(8),
        _ => None,
    }
}

/// Connect command data (NVMe-oF 1.1, Figure 21).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    /// FFFFh on the admin queue asks for a dynamic controller; I/O queues name theirs.
    pub cntlid: U16,
    pub rsvd18: [u8; 238],
    pub subnqn: [u8; 256],
    pub hostnqn: [u8; 256],
    pub rsvd768: [u8; 256],
}
const _: () = assert!(core::mem::size_of::<ConnectData>() == 1024);

/// CNTLID a host sends on the admin queue to accept any controller (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

impl ConnectData {
    pub fn new(hostid: [u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> Self {
        let mut d = Self::new_zeroed();
        d.hostid = hostid;
        d.cntlid = U16::new(cntlid);
        set_nqn(&mut d.subnqn, subnqn);
        set_nqn(&mut d.hostnqn, hostnqn);
        d
    }

    pub fn subnqn(&self) -> &str {
        nul_str(&self.subnqn)
    }

    pub fn hostnqn(&self) -> &str {
        nul_str(&self.hostnqn)
    }
}

/// Byte offsets of Connect fields, for Invalid Parameter responses (IPO).
pub mod connect_offsets {
    use super::{ConnectCommand, ConnectData};
    use core::mem::offset_of;

    pub const SQE_RECFMT: u16 = offset_of!(ConnectCommand, recfmt) as u16;
    pub const SQE_QID: u16 = offset_of!(ConnectCommand, qid) as u16;
    pub const SQE_SQSIZE: u16 = offset_of!(ConnectCommand, sqsize) as u16;
    pub const SQE_CATTR: u16 = offset_of!(ConnectCommand, cattr) as u16;
    pub const SQE_KATO: u16 = offset_of!(ConnectCommand, kato) as u16;
    pub const SQE_SGL: u16 = offset_of!(ConnectCommand, sgl) as u16;
    pub const DATA_HOSTID: u16 = offset_of!(ConnectData, hostid) as u16;
    pub const DATA_CNTLID: u16 = offset_of!(ConnectData, cntlid) as u16;
    pub const DATA_SUBNQN: u16 = offset_of!(ConnectData, subnqn) as u16;
    pub const DATA_HOSTNQN: u16 = offset_of!(ConnectData, hostnqn) as u16;
}

/// Successful Connect response dword 0: CNTLID in bits 15:0, AUTHREQ in 31:16
/// (NVMe-oF 1.1, Figure 23; AUTHREQ from NVMe 2.0 base, Figure 551).
pub const fn connect_success_dw0(cntlid: u16, authreq: u16) -> u32 {
    cntlid as u32 | ((authreq as u32) << 16)
}

/// Connect response dword 0 for CONNECT_INVALID_PARAMETERS: IPO (the byte offset of the bad
/// field) in bits 15:0, IATTR in 23:16 with bit 0 set when the offset is into the Connect data
/// rather than the SQE (NVMe-oF 1.1, Figure 24; Linux `IPO_IATTR_CONNECT_DATA`).
pub const fn connect_invalid_param_dw0(in_data: bool, offset: u16) -> u32 {
    offset as u32 | ((in_data as u32) << 16)
}

/// Inverse of [`connect_invalid_param_dw0`]: (in_data, offset).
pub const fn parse_connect_invalid_param_dw0(dw0: u32) -> (bool, u16) {
    ((dw0 >> 16) & 1 != 0, dw0 as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layouts() {
        assert_eq!(offset_of!(FabricsCommand, cid), 2);
        assert_eq!(offset_of!(FabricsCommand, fctype), 4);
        assert_eq!(offset_of!(FabricsCommand, sgl), 24);
        assert_eq!(offset_of!(FabricsCommand, specific), 40);
        assert_eq!(offset_of!(ConnectCommand, recfmt), 40);
        assert_eq!(offset_of!(ConnectCommand, qid), 42);
        assert_eq!(offset_of!(ConnectCommand, sqsize), 44);
        assert_eq!(offset_of!(ConnectCommand, cattr), 46);
        assert_eq!(offset_of!(ConnectCommand, kato), 48);
        assert_eq!(offset_of!(PropertyGetCommand, attrib), 40);
        assert_eq!(offset_of!(PropertyGetCommand, offset), 44);
        assert_eq!(offset_of!(PropertySetCommand, attrib), 40);
        assert_eq!(offset_of!(PropertySetCommand, offset), 44);
        assert_eq!(offset_of!(PropertySetCommand, value), 48);
        assert_eq!(offset_of!(DisconnectCommand, recfmt), 40);
        assert_eq!(offset_of!(ConnectData, cntlid), 16);
        assert_eq!(offset_of!(ConnectData, subnqn), 256);
        assert_eq!(offset_of!(ConnectData, hostnqn), 512);
    }

    #[test]
    fn connect_round_trip() {
        let mut cmd = ConnectCommand::new(3, 1, 127, 0).to_command();
        cmd.set_sgl(SglDescriptor::in_capsule(0, 1024));
        assert_eq!(cmd.opcode, FABRICS_OPCODE);
        assert_eq!(cmd.cid.get(), 3);
        let b = cmd.as_bytes();
        assert_eq!(b[4], 0x01);
        assert_eq!(&b[42..46], &[1, 0, 127, 0]);
        let view = ConnectCommand::from_command(&cmd);
        assert_eq!((view.qid.get(), view.sqsize.get()), (1, 127));
        assert_eq!(view.sgl, SglDescriptor::in_capsule(0, 1024));
        assert_eq!(
            FabricsCommand::from_command(&cmd).fctype(),
            FabricsCommandType::CONNECT
        );
        ConnectCommand::from_command_mut(&mut cmd).kato = U32::new(15_000);
        assert_eq!(cmd.cdw12.get(), 15_000);

        let d = ConnectData::new(
            [7; 16],
            CNTLID_DYNAMIC,
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.h",
        );
        assert_eq!(d.as_bytes()[16..18], [0xFF, 0xFF]);
        assert_eq!(d.subnqn(), "nqn.2016-06.io.spdk:cnode1");
        assert_eq!(d.hostnqn(), "nqn.h");
    }

    #[test]
    fn property_commands() {
        let g = PropertyGetCommand::new(1, 0x0, true).to_command();
        assert_eq!(g.as_bytes()[4], 0x04);
        assert_eq!(g.as_bytes()[40], 1);
        assert_eq!(PropertyGetCommand::from_command(&g).size(), Some(8));
        let s = PropertySetCommand::new(2, 0x14, 0x0046_0001, false).to_command();
        assert_eq!(s.cdw11.get(), 0x14);
        assert_eq!(s.cdw12.get(), 0x0046_0001);
        assert_eq!(PropertySetCommand::from_command(&s).size(), Some(4));
        let mut bad = PropertySetCommand::new(2, 0, 0, false);
        bad.attrib = 2;
        assert_eq!(bad.size(), None);
        assert_eq!(DisconnectCommand::new(9).to_command().as_bytes()[4], 0x08);
    }

    #[test]
    fn connect_response_dw0() {
        assert_eq!(connect_success_dw0(0x12, 0), 0x12);
        // Linux: IPO_IATTR_CONNECT_DATA(subsysnqn) = (1 << 16) | 256.
        let dw = connect_invalid_param_dw0(true, connect_offsets::DATA_SUBNQN);
        assert_eq!(dw, (1 << 16) | 256);
        assert_eq!(parse_connect_invalid_param_dw0(dw), (true, 256));
        assert_eq!(
            connect_invalid_param_dw0(false, connect_offsets::SQE_QID),
            42
        );
    }
}

//! Scatter Gather List descriptors (NVMe 2.0 base, 4.1.4 "Scatter Gather List (SGL)") as used by
//! NVMe over Fabrics: keyed data blocks name host memory for RDMA READ/WRITE, offset-subtype
//! data blocks point into the command capsule (NVMe-oF 1.1, 2.3 and 7.3.2 for RDMA).

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

open_enum! {
    /// SGL Descriptor Type, the upper nibble of byte 15 (NVMe 2.0 base, Figure 116).
    pub struct SglType(u8) {
        DATA_BLOCK = 0x0,
        BIT_BUCKET = 0x1,
        SEGMENT = 0x2,
        LAST_SEGMENT = 0x3,
        KEYED_DATA_BLOCK = 0x4,
        TRANSPORT_DATA_BLOCK = 0x5,
        VENDOR = 0xF,
    }
}

open_enum! {
    /// SGL Descriptor Sub Type, the lower nibble of byte 15 (NVMe 2.0 base, Figure 117).
    pub struct SglSubtype(u8) {
        ADDRESS = 0x0,
        OFFSET = 0x1,
        TRANSPORT = 0xA,
        /// RDMA transport: the target invalidates `key` when it sends the response
        /// (NVMe-oF 1.1 RDMA binding, Send with Invalidate).
        INVALIDATE_KEY = 0xF,
    }
}

/// A 16-byte SGL descriptor (NVMe 2.0 base, Figure 115). Bytes 8..15 depend on the type:
/// unkeyed descriptors carry a 32-bit length at byte 8; keyed ones a 24-bit length at bytes
/// 8..11 and a 32-bit key at bytes 11..15.
#[repr(C)]
#[derive(
    Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct SglDescriptor {
    pub address: U64,
    pub params: [u8; 7],
    /// SGL Identifier: type in bits 7:4, subtype in bits 3:0.
    pub sgl_id: u8,
}
const _: () = assert!(core::mem::size_of::<SglDescriptor>() == 16);

/// Largest length a keyed descriptor can express: 24 bits.
pub const KEYED_MAX_LENGTH: u32 = (1 << 24) - 1;

/// The descriptor shapes a fabrics target meets, with everything else left to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SglKind {
    /// Host memory reachable with RDMA READ/WRITE through `key`.
    Keyed {
        addr: u64,
        len: u32,
        key: u32,
        invalidate: bool,
    },
    /// Data inside the command capsule, `offset` bytes after the end of the SQE.
    InCapsule {
        offset: u64,
        len: u32,
    },
    /// A list of descriptors inside the capsule (`len` bytes, a multiple of 16).
    LastSegment {
        offset: u64,
        len: u32,
    },
    Other {
        ty: SglType,
        subtype: SglSubtype,
    },
}

impl SglDescriptor {
    pub const fn sgl_type(&self) -> SglType {
        SglType(self.sgl_id >> 4)
    }

    pub const fn subtype(&self) -> SglSubtype {
        SglSubtype(self.sgl_id & 0xF)
    }

    pub fn set_id(&mut self, ty: SglType, subtype: SglSubtype) {
        self.sgl_id = (ty.0 << 4) | (subtype.0 & 0xF);
    }

    /// Length of an unkeyed descriptor (data block, segment, bit bucket).
    pub fn length(&self) -> u32 {
        u32::from_le_bytes([
            self.params[0],
            self.params[1],
            self.params[2],
            self.params[3],
        ])
    }

    pub fn set_length(&mut self, len: u32) {
        self.params[..4].copy_from_slice(&len.to_le_bytes());
    }

    /// Length of a keyed data block descriptor.
    pub fn keyed_length(&self) -> u32 {
        u32::from_le_bytes([self.params[0], self.params[1], self.params[2], 0])
    }

    pub fn key(&self) -> u32 {
        u32::from_le_bytes([
            self.params[3],
            self.params[4],
            self.params[5],
            self.params[6],
        ])
    }

    /// A keyed data block: `len` must fit in 24 bits (larger values are truncated, which a
    /// target would see as a short transfer; callers split first).
    pub fn keyed(addr: u64, len: u32, key: u32, invalidate: bool) -> Self {
        debug_assert!(len <= KEYED_MAX_LENGTH);
        let mut d = Self {
            address: U64::new(addr),
            ..Self::default()
        };
        d.params[..3].copy_from_slice(&len.to_le_bytes()[..3]);
        d.params[3..7].copy_from_slice(&key.to_le_bytes());
        let sub = if invalidate {
            SglSubtype::INVALIDATE_KEY
        } else {
            SglSubtype::ADDRESS
        };
        d.set_id(SglType::KEYED_DATA_BLOCK, sub);
        d
    }

    fn unkeyed(ty: SglType, subtype: SglSubtype, address: u64, len: u32) -> Self {
        let mut d = Self {
            address: U64::new(address),
            ..Self::default()
        };
        d.set_length(len);
        d.set_id(ty, subtype);
        d
    }

    /// In-capsule data at `offset` bytes past the SQE (NVMe-oF 1.1, 2.3.1).
    pub fn in_capsule(offset: u64, len: u32) -> Self {
        Self::unkeyed(SglType::DATA_BLOCK, SglSubtype::OFFSET, offset, len)
    }

    /// A data block at an absolute address (PCIe-style; also the subtype hosts use for
    /// descriptors inside an in-capsule segment when the transport defines addressing).
    pub fn data_block(addr: u64, len: u32) -> Self {
        Self::unkeyed(SglType::DATA_BLOCK, SglSubtype::ADDRESS, addr, len)
    }

    /// Last Segment of `len` bytes of descriptors, in the capsule at `offset`.
    pub fn last_segment(offset: u64, len: u32) -> Self {
        Self::unkeyed(SglType::LAST_SEGMENT, SglSubtype::OFFSET, offset, len)
    }

    /// A zero-length transfer: keyed, no key, nothing to move. Hosts send this for commands
    /// without data (Linux uses this shape, and targets must accept it).
    pub fn null() -> Self {
        Self::keyed(0, 0, 0, false)
    }

    pub fn classify(&self) -> SglKind {
        let (ty, subtype) = (self.sgl_type(), self.subtype());
        match (ty, subtype) {
            (SglType::KEYED_DATA_BLOCK, SglSubtype::ADDRESS | SglSubtype::INVALIDATE_KEY) => {
                SglKind::Keyed {
                    addr: self.address.get(),
                    len: self.keyed_length(),
                    key: self.key(),
                    invalidate: subtype == SglSubtype::INVALIDATE_KEY,
                }
            }
            (SglType::DATA_BLOCK, SglSubtype::OFFSET) => SglKind::InCapsule {
                offset: self.address.get(),
                len: self.length(),
            },
            (SglType::LAST_SEGMENT, SglSubtype::OFFSET) => SglKind::LastSegment {
                offset: self.address.get(),
                len: self.length(),
            },
            _ => SglKind::Other { ty, subtype },
        }
    }
}

impl core::fmt::Debug for SglDescriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.classify() {
            SglKind::Other { ty, subtype } => f
                .debug_struct("SglDescriptor")
                .field("type", &ty)
                .field("subtype", &subtype)
                .field("address", &format_args!("{:#x}", self.address.get()))
                .field("params", &self.params)
                .finish(),
            kind => write!(f, "{kind:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_layout() {
        let d = SglDescriptor::keyed(0x1122_3344_5566_7788, 0x00AB_CDEF, 0xDEAD_BEEF, true);
        let b = d.as_bytes();
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[8..11], &[0xEF, 0xCD, 0xAB]);
        assert_eq!(&b[11..15], &0xDEAD_BEEFu32.to_le_bytes());
        assert_eq!(b[15], 0x4F);
        assert_eq!(
            d.classify(),
            SglKind::Keyed {
                addr: 0x1122_3344_5566_7788,
                len: 0x00AB_CDEF,
                key: 0xDEAD_BEEF,
                invalidate: true
            }
        );
        assert_eq!(SglDescriptor::keyed(1, 2, 3, false).as_bytes()[15], 0x40);
    }

    #[test]
    fn unkeyed_layout() {
        let d = SglDescriptor::in_capsule(0, 4096);
        let b = d.as_bytes();
        assert_eq!(&b[8..12], &4096u32.to_le_bytes());
        assert_eq!(b[15], 0x01);
        assert_eq!(
            d.classify(),
            SglKind::InCapsule {
                offset: 0,
                len: 4096
            }
        );
        let s = SglDescriptor::last_segment(16, 32);
        assert_eq!(s.as_bytes()[15], 0x31);
        assert_eq!(
            s.classify(),
            SglKind::LastSegment {
                offset: 16,
                len: 32
            }
        );
        let bb = SglDescriptor {
            sgl_id: 0x10,
            ..Default::default()
        };
        assert_eq!(
            bb.classify(),
            SglKind::Other {
                ty: SglType::BIT_BUCKET,
                subtype: SglSubtype::ADDRESS
            }
        );
        assert_eq!(format!("{:?}", SglType(0x9)), "SglType(0x9)");
    }
}

//! NVMe 2.0 base and NVMe-oF 1.1 wire formats: one module per spec area.
//!
//! Every wire structure is a `#[repr(C)]` zerocopy type built from bytes and little-endian
//! integers, so it has alignment 1, can be read in place from any offset of a received buffer
//! (`ref_from_bytes`, `read_from_bytes`) and written with `as_bytes()`; its size is asserted at
//! compile time. Identifiers read from the wire (opcodes, status codes, log page ids, ...) are
//! open enums: a newtype with named constants, so a value this crate does not know is still
//! representable and can be answered with the right error instead of failing to parse.

/// Declares an open enum: `pub struct Name(pub repr)` with associated constants, a `name()`
/// lookup and a `Debug` that prints the constant name or `Name(0x..)`.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($repr:ty) {
            $( $(#[$cmeta:meta])* $variant:ident = $value:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        #[repr(transparent)]
        $vis struct $name(pub $repr);

        impl $name {
            $( $(#[$cmeta])* pub const $variant: Self = Self($value); )*

            /// The constant's name, or `None` for a value this crate does not define.
            pub const fn name(self) -> Option<&'static str> {
                $( if self.0 == $value { return Some(stringify!($variant)); } )*
                None
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, concat!(stringify!($name), "({:#x})"), self.0),
                }
            }
        }

        impl From<$repr> for $name {
            fn from(v: $repr) -> Self {
                Self(v)
            }
        }

        impl From<$name> for $repr {
            fn from(v: $name) -> Self {
                v.0
            }
        }
    };
}

pub mod command;
pub mod completion;
pub mod fabrics;
pub mod features;
pub mod identify;
pub mod log_page;
pub mod nqn;
pub mod rdma_cm;
pub mod registers;
pub mod reservation;
pub mod sgl;
pub mod status;

pub use command::{
    Abort, AdminOpcode, Command, Dsm, DsmRange, GetFeatures, GetLogPage, Identify, IoOpcode,
    ReadWrite, SetFeatures, FABRICS_OPCODE, NSID_ALL,
};
pub use completion::Completion;
pub use fabrics::{
    ConnectCommand, ConnectData, DisconnectCommand, FabricsCommand, FabricsCommandType,
    PropertyGetCommand, PropertySetCommand,
};
pub use features::{AsyncEventType, AsyncNotice, FeatureId, FeatureSelect};
pub use identify::{Cns, IdentifyController, IdentifyNamespace, LbaFormat, NsIdType};
pub use log_page::{
    AddressFamily, DiscoveryLogEntry, DiscoveryLogHeader, ErrorLogEntry, LogPageId, SmartHealthLog,
    SubsystemType, TransportType,
};
pub use nqn::{validate_nqn, NqnError, DISCOVERY_NQN};
pub use registers::{Cap, Cc, Csts, Property, Version};
pub use sgl::{SglDescriptor, SglKind, SglSubtype, SglType};
pub use status::{Status, StatusCodeType};

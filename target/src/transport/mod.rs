//! Transports: how capsules and data reach the core. The interface they implement
//! ([`Transport`], [`TransportPollGroup`], [`TransportLimits`], [`TransportError`]) belongs to
//! the core and lives in [`crate::core::transport`]; it is re-exported here so the transports'
//! paths keep working.

pub mod loopback;
pub mod options;
pub mod rdma;

pub use crate::core::transport::{
    IdleTransportGroup, Transport, TransportError, TransportLimits, TransportPollGroup,
    DEFAULT_KAS, DEFAULT_MIN_KATO_MS, KAS_UNIT_MS,
};

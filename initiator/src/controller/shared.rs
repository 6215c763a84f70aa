//! The block of atomics a controller shares with its I/O qpairs: no lock is taken on the
//! I/O path (see "Threads" in the [`controller`](super) docs).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use nvmf_common::rdma::Verbs;

use crate::address::TransportId;
use crate::host::HostIdentity;

use super::options::ControllerOptions;

pub(crate) const STATE_LIVE: u8 = 0;
pub(crate) const STATE_RESETTING: u8 = 1;
pub(crate) const STATE_FAILED: u8 = 2;
pub(crate) const STATE_DELETED: u8 = 3;

/// What the controller and its I/O qpairs share.
pub(crate) struct Shared<V: Verbs> {
    /// The provider: I/O threads create channels with it when they reconnect, and read its
    /// clock.
    pub verbs: V,
    pub peer: SocketAddr,
    pub tid: TransportId,
    pub host: HostIdentity,
    pub opts: ControllerOptions,
    pub pd: Arc<V::Pd>,
    pub state: AtomicU8,
    /// Bumped on every teardown of the association.
    pub generation: AtomicU64,
    pub cntlid: AtomicU16,
    pub reset_requested: AtomicBool,
    /// In-capsule data bytes the controller takes on I/O queues (0: none).
    pub in_capsule: AtomicU32,
    /// Largest data transfer of one command.
    pub max_xfer: AtomicU32,
    /// Largest I/O queue (CAP.MQES + 1).
    pub max_io_depth: AtomicU32,
    /// I/O queues give each command its own key (see [`ControllerOptions::memory_windows`]).
    pub windows: bool,
    pub failure: Mutex<Option<String>>,
}

impl<V: Verbs> Shared<V> {
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub fn failure(&self) -> String {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "controller deleted".into())
    }
}

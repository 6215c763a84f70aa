//! Errors of the host library: one variant per way a connection or a command can fail, each
//! with enough context (address, queue, status) for a one-line message.

use std::net::SocketAddr;
use std::time::Duration;

use nvmf_common::rdma::{RdmaError, WcStatus};
use nvmf_common::spec::Status;

use crate::address::AddressError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid transport ID: {0}")]
    Address(#[from] AddressError),
    /// Address or route resolution failed: nothing answers at that address, or no RDMA
    /// device can reach it.
    #[error("{addr}: unreachable: {detail}")]
    Unreachable { addr: SocketAddr, detail: String },
    /// The peer's RDMA CM refused the connection without NVMe-oF reject data: nothing listens
    /// on that port.
    #[error("{addr}: connection refused (no NVMe-oF RDMA listener on that port; CM reject reason {reason})")]
    Refused { addr: SocketAddr, reason: i32 },
    /// The target rejected the RDMA connection with an NVMe-oF RDMA_CM_REJECT status.
    #[error("{addr}: target rejected the RDMA connection of queue {qid}: {reason}")]
    Rejected {
        addr: SocketAddr,
        qid: u16,
        reason: String,
    },
    /// The Fabrics Connect command failed (unknown subsystem, host not allowed, ...).
    #[error("{addr}: Connect (queue {qid}) to {subnqn} failed: {detail}")]
    ConnectFailed {
        addr: SocketAddr,
        qid: u16,
        subnqn: String,
        status: Status,
        detail: String,
    },
    #[error("{what} timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    /// An admin command completed with an error status.
    #[error("{what} failed: {status}")]
    Command { what: String, status: Status },
    /// The connection broke (work completion error, disconnect event, protocol violation).
    #[error("{addr}: connection lost on queue {qid}: {detail}")]
    Transport {
        addr: SocketAddr,
        qid: u16,
        detail: String,
    },
    /// The controller is gone for good: no reconnect configured, or `ctrl_loss_tmo` expired.
    #[error("controller lost: {0}")]
    ControllerLost(String),
    #[error("{what}: {source}")]
    Rdma {
        what: String,
        #[source]
        source: RdmaError,
    },
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn rdma(what: impl Into<String>, source: RdmaError) -> Self {
        Self::Rdma {
            what: what.into(),
            source,
        }
    }

    /// Whether a later attempt may succeed (the reconnect loop retries these): transport
    /// trouble and timeouts, not a refusal by the target's configuration.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unreachable { .. }
            | Self::Refused { .. }
            | Self::Timeout { .. }
            | Self::Transport { .. }
            | Self::Rdma { .. } => true,
            Self::Rejected { reason, .. } => reason.contains("NO_RESOURCES"),
            Self::ConnectFailed { status, .. } => !status.dnr,
            _ => false,
        }
    }
}

/// Why a queue stopped working; turned into [`Error::Transport`] with the queue's address.
#[derive(Debug, Clone)]
pub(crate) enum QueueFault {
    Wc {
        status: WcStatus,
        /// Which work request: "receive", "command send", "window bind", "local invalidate".
        what: &'static str,
        vendor: u32,
    },
    CmEvent(String),
    Protocol(String),
    Verb(String),
}

impl std::fmt::Display for QueueFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Wc {
                status,
                what,
                vendor,
            } => write!(
                f,
                "{what} work completion failed: {status} (status {}, vendor error {vendor:#x})",
                status.0
            ),
            Self::CmEvent(e) => write!(f, "RDMA CM event {e}"),
            Self::Protocol(e) => write!(f, "protocol error: {e}"),
            Self::Verb(e) => f.write_str(e),
        }
    }
}

//! How a command ends: [`IoStatus`] and the [`IoCompletion`] that hands the tag and the
//! buffer back.

use std::fmt;

use nvmf_common::buffer::IoBuf;
use nvmf_common::spec::Status;

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoStatus {
    /// The controller's completion status (success or an NVMe error).
    Nvme(Status),
    /// Older than the I/O timeout (and out of retries); the association was reset.
    Timeout,
    /// The connection broke and no reconnect is configured.
    TransportError,
    /// The controller is gone for good (reconnect gave up, or it was deleted).
    ControllerLost,
    /// The connection broke and the qpair is in failover mode: the command was not
    /// completed by the controller (it may or may not have executed) and is handed back for
    /// another path; the qpair reconnects meanwhile.
    PathError,
    /// Multipath: no path was usable within the fast-io-fail timeout, or every path's
    /// controller is lost.
    NoPath,
}

impl IoStatus {
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Nvme(s) if s.is_success())
    }
}

impl fmt::Display for IoStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nvme(s) => write!(f, "{s}"),
            Self::Timeout => f.write_str("command timed out"),
            Self::TransportError => f.write_str("transport error (connection lost)"),
            Self::ControllerLost => f.write_str("controller lost"),
            Self::PathError => f.write_str("path error (connection lost, handed back)"),
            Self::NoPath => f.write_str("no usable path"),
        }
    }
}

/// A finished command.
#[derive(Debug)]
pub struct IoCompletion {
    pub tag: u64,
    pub status: IoStatus,
    /// Completion dword 0 (command specific).
    pub dw0: u32,
    /// The buffer the command was submitted with.
    pub buf: Option<IoBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_display_and_success() {
        assert!(IoStatus::Nvme(Status::SUCCESS).is_success());
        assert!(!IoStatus::Nvme(Status::LBA_OUT_OF_RANGE).is_success());
        assert!(!IoStatus::Timeout.is_success());
        assert_eq!(IoStatus::Timeout.to_string(), "command timed out");
    }
}

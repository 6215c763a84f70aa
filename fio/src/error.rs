//! Errors as fio sees them: an errno for `td->error` / `io_u->error` and a one-line message
//! the shim passes to `log_err`.

use std::io;

use nvmf_initiator::address::AddressError;
use nvmf_initiator::{Error as HostError, IoStatus, SubmitErrorKind};

/// A failed engine call: the errno handed to C (negated) and the message behind it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct EngineError {
    pub errno: i32,
    pub msg: String,
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    pub fn new(errno: i32, msg: impl Into<String>) -> Self {
        Self {
            errno,
            msg: msg.into(),
        }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(libc::EINVAL, msg)
    }

    /// Prefixes the message with what was being done.
    pub fn context(mut self, what: impl std::fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }
}

impl From<AddressError> for EngineError {
    fn from(e: AddressError) -> Self {
        Self::invalid(format!("invalid file name (want 'trtype=RDMA adrfam=IPv4 traddr=A trsvcid=4420 subnqn=NQN ns=1'): {e}"))
    }
}

impl From<HostError> for EngineError {
    fn from(e: HostError) -> Self {
        Self::new(host_errno(&e), e.to_string())
    }
}

/// The errno closest to a host library error. A verb failure keeps its OS error when the
/// error chain carries one.
pub fn host_errno(e: &HostError) -> i32 {
    match e {
        HostError::Address(_) | HostError::Invalid(_) => libc::EINVAL,
        HostError::Unreachable { .. } => libc::EHOSTUNREACH,
        HostError::Refused { .. }
        | HostError::Rejected { .. }
        | HostError::ConnectFailed { .. } => libc::ECONNREFUSED,
        HostError::Timeout { .. } => libc::ETIMEDOUT,
        HostError::Transport { .. } => libc::ECONNRESET,
        HostError::ControllerLost(_) => libc::ENOTCONN,
        HostError::Command { .. } => libc::EIO,
        e => os_errno(e).unwrap_or(libc::EIO),
    }
}

/// The first OS error in `e`'s source chain.
fn os_errno(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(code) = err
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(code);
        }
        cur = err.source();
    }
    None
}

/// The errno fio gets for a finished command (0 on success).
pub fn status_errno(s: &IoStatus) -> i32 {
    match s {
        s if s.is_success() => 0,
        IoStatus::Nvme(_) => libc::EIO,
        IoStatus::Timeout => libc::ETIMEDOUT,
        IoStatus::TransportError => libc::ECONNRESET,
        IoStatus::ControllerLost | IoStatus::NoPath => libc::ENOTCONN,
        IoStatus::PathError => libc::ECONNRESET,
    }
}

/// The errno for a refused submission (`QueueFull` is not an error: fio retries it).
pub fn submit_errno(kind: SubmitErrorKind) -> i32 {
    match kind {
        SubmitErrorKind::QueueFull => libc::EBUSY,
        SubmitErrorKind::Failed => libc::ENOTCONN,
        SubmitErrorKind::TooLarge | SubmitErrorKind::Invalid => libc::EINVAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_common::spec::Status;

    #[test]
    fn statuses_map_to_errnos() {
        assert_eq!(status_errno(&IoStatus::Nvme(Status::SUCCESS)), 0);
        assert_eq!(
            status_errno(&IoStatus::Nvme(Status::LBA_OUT_OF_RANGE)),
            libc::EIO
        );
        assert_eq!(status_errno(&IoStatus::Timeout), libc::ETIMEDOUT);
        assert_eq!(status_errno(&IoStatus::TransportError), libc::ECONNRESET);
        assert_eq!(status_errno(&IoStatus::ControllerLost), libc::ENOTCONN);
        assert_eq!(submit_errno(SubmitErrorKind::QueueFull), libc::EBUSY);
        assert_eq!(submit_errno(SubmitErrorKind::TooLarge), libc::EINVAL);
    }

    #[test]
    fn host_errors_keep_their_meaning() {
        let e: EngineError = HostError::ControllerLost("gone".into()).into();
        assert_eq!(e.errno, libc::ENOTCONN);
        assert!(e.msg.contains("gone"));
        let e: EngineError = "traddr=1.2.3.4 bogus=1"
            .parse::<nvmf_initiator::TransportId>()
            .unwrap_err()
            .into();
        assert_eq!(e.errno, libc::EINVAL);
        assert!(e.msg.contains("bogus"), "{}", e.msg);
        let e = EngineError::invalid("x").context("open");
        assert_eq!(e.msg, "open: x");
    }
}

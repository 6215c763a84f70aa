//! Typed errors of the verbs layer: one variant per failing verb, each carrying the OS error.

use std::io;
use std::time::Duration;

use super::cm::CmEventKind;

/// Result of a verbs-layer call.
pub type Result<T> = std::result::Result<T, RdmaError>;

/// An RDMA verb or RDMA CM call failed.
///
/// Every variant names the C function that failed so a log line is enough to find the call
/// site; the `io::Error` carries the errno the library reported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    #[error("ibv_get_device_list failed: {0}")]
    GetDeviceList(io::Error),
    #[error("RDMA device {0:?} not found")]
    DeviceNotFound(String),
    #[error("ibv_open_device failed: {0}")]
    OpenDevice(io::Error),
    #[error("rdma_get_devices failed: {0}")]
    GetCmDevices(io::Error),
    #[error("ibv_query_device failed: {0}")]
    QueryDevice(io::Error),
    #[error("ibv_query_port failed: {0}")]
    QueryPort(io::Error),
    #[error("ibv_query_gid failed: {0}")]
    QueryGid(io::Error),
    #[error("ibv_alloc_pd failed: {0}")]
    AllocPd(io::Error),
    #[error("ibv_reg_mr failed: {0}")]
    RegMr(io::Error),
    #[error("ibv_alloc_mw failed: {0}")]
    AllocMw(io::Error),
    #[error("ibv_create_comp_channel failed: {0}")]
    CreateCompChannel(io::Error),
    #[error("ibv_create_cq failed: {0}")]
    CreateCq(io::Error),
    #[error("ibv_resize_cq failed: {0}")]
    ResizeCq(io::Error),
    #[error("ibv_poll_cq failed: {0}")]
    PollCq(io::Error),
    #[error("ibv_get_async_event failed: {0}")]
    GetAsyncEvent(io::Error),
    #[error("ibv_req_notify_cq failed: {0}")]
    ReqNotifyCq(io::Error),
    #[error("ibv_get_cq_event failed: {0}")]
    GetCqEvent(io::Error),
    #[error("ibv_create_srq failed: {0}")]
    CreateSrq(io::Error),
    #[error("ibv_post_srq_recv failed at work request {index}: {source}")]
    PostSrqRecv { source: io::Error, index: usize },
    #[error("ibv_post_recv failed at work request {index}: {source}")]
    PostRecv { source: io::Error, index: usize },
    #[error("ibv_post_send failed at work request {index}: {source}")]
    PostSend { source: io::Error, index: usize },
    #[error("rdma_create_event_channel failed: {0}")]
    CreateEventChannel(io::Error),
    #[error("setting the event channel non-blocking failed: {0}")]
    SetNonBlocking(io::Error),
    #[error("rdma_get_cm_event failed: {0}")]
    GetCmEvent(io::Error),
    #[error("poll on the RDMA CM event channel failed: {0}")]
    PollCmChannel(io::Error),
    #[error("rdma_create_id failed: {0}")]
    CreateId(io::Error),
    #[error("rdma_bind_addr failed: {0}")]
    BindAddr(io::Error),
    #[error("rdma_listen failed: {0}")]
    Listen(io::Error),
    #[error("rdma_resolve_addr failed: {0}")]
    ResolveAddr(io::Error),
    #[error("rdma_resolve_route failed: {0}")]
    ResolveRoute(io::Error),
    #[error("rdma_create_qp failed: {0}")]
    CreateQp(io::Error),
    #[error("rdma_accept failed: {0}")]
    Accept(io::Error),
    #[error("rdma_reject failed: {0}")]
    Reject(io::Error),
    #[error("rdma_connect failed: {0}")]
    Connect(io::Error),
    #[error("rdma_disconnect failed: {0}")]
    Disconnect(io::Error),
    /// The CM id is not bound to an RDMA device yet (bind to a device address or resolve an
    /// address first).
    #[error("the RDMA CM id is not bound to a device")]
    NoDevice,
    /// A CM event arrived that is not the one the caller waited for. A `REJECTED` event's
    /// private data (an NVMe-oF reject record) is kept.
    #[error("expected RDMA CM event {expected:?}, got {got:?} (status {status})")]
    UnexpectedCmEvent {
        expected: CmEventKind,
        got: CmEventKind,
        status: i32,
        private_data: Vec<u8>,
    },
    #[error("timed out after {timeout:?} waiting for RDMA CM event {expected:?}")]
    CmEventTimeout {
        expected: CmEventKind,
        timeout: Duration,
    },
    /// A caller's argument was rejected before reaching the library.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

impl RdmaError {
    /// The OS error behind this error, if it came from a verb.
    pub fn os_error(&self) -> Option<&io::Error> {
        use RdmaError::*;
        match self {
            GetDeviceList(e)
            | OpenDevice(e)
            | GetCmDevices(e)
            | QueryDevice(e)
            | QueryPort(e)
            | QueryGid(e)
            | AllocPd(e)
            | RegMr(e)
            | AllocMw(e)
            | CreateCompChannel(e)
            | CreateCq(e)
            | ResizeCq(e)
            | PollCq(e)
            | GetAsyncEvent(e)
            | ReqNotifyCq(e)
            | GetCqEvent(e)
            | CreateSrq(e)
            | CreateEventChannel(e)
            | SetNonBlocking(e)
            | GetCmEvent(e)
            | PollCmChannel(e)
            | CreateId(e)
            | BindAddr(e)
            | Listen(e)
            | ResolveAddr(e)
            | ResolveRoute(e)
            | CreateQp(e)
            | Accept(e)
            | Reject(e)
            | Connect(e)
            | Disconnect(e) => Some(e),
            PostSrqRecv { source, .. } | PostRecv { source, .. } | PostSend { source, .. } => {
                Some(source)
            }
            DeviceNotFound(_)
            | NoDevice
            | UnexpectedCmEvent { .. }
            | CmEventTimeout { .. }
            | InvalidArgument(_) => None,
        }
    }
}

/// The calling thread's `errno`, for calls that return NULL or -1 and set `errno`
/// (`ibv_create_*`, `ibv_reg_mr`, all `rdma_*`).
pub(crate) fn last_errno() -> io::Error {
    io::Error::last_os_error()
}

/// Error from a verb that returns the error number itself (`ibv_post_send`,
/// `ibv_query_device`, `ibv_req_notify_cq`, ...). Some providers return `-errno`, and a few
/// return -1 with `errno` set, so every sign is accepted; 0 would not be an error and maps to
/// `EIO` so a broken provider cannot produce a "success" error.
pub(crate) fn errno_from_ret(ret: i32) -> io::Error {
    match ret {
        0 => io::Error::from_raw_os_error(libc::EIO),
        -1 => {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(0) | None => io::Error::from_raw_os_error(libc::EIO),
                _ => e,
            }
        }
        r => io::Error::from_raw_os_error(r.abs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_and_negative_errno_map_to_the_same_error() {
        let pos = errno_from_ret(libc::EINVAL);
        let neg = errno_from_ret(-libc::EINVAL);
        assert_eq!(pos.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(neg.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(pos.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn zero_is_never_success() {
        assert_eq!(errno_from_ret(0).raw_os_error(), Some(libc::EIO));
    }

    #[test]
    fn display_names_the_verb_and_errno() {
        let e = RdmaError::RegMr(io::Error::from_raw_os_error(libc::ENOMEM));
        let s = e.to_string();
        assert!(s.starts_with("ibv_reg_mr failed: "), "{s}");
        assert_eq!(
            e.os_error().and_then(|e| e.raw_os_error()),
            Some(libc::ENOMEM)
        );
        let e = RdmaError::PostSend {
            source: io::Error::from_raw_os_error(libc::ENOMEM),
            index: 3,
        };
        assert!(e.to_string().contains("work request 3"));
    }

    #[test]
    fn errors_are_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<RdmaError>();
    }
}

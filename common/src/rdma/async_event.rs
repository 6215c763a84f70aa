//! Asynchronous device events (`ibv_get_async_event`): a QP or CQ broken by the device, the
//! last receive of an SRQ QP, a port going down. Read without blocking, copied, acknowledged.

use std::io;
use std::mem::MaybeUninit;

use super::cq::set_nonblocking;
use super::device::Context;
use super::error::{RdmaError, Result};
use super::sys;

/// What happened (`enum ibv_event_type`, the values a transport acts on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEventKind {
    /// The CQ overran or failed: every QP on it is in error and later completions are lost.
    CqErr,
    QpFatal,
    QpReqErr,
    QpAccessErr,
    CommEst,
    QpLastWqeReached,
    SrqErr,
    PortActive,
    PortErr,
    DeviceFatal,
    Other(u32),
}

/// One event, with the identity of the object it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventKind,
    /// The QP's number, for QP events.
    pub qp_num: Option<u32>,
    /// The CQ's identity ([`VerbsCq::id`](super::verbs::VerbsCq::id)), for `CqErr`.
    pub cq_id: Option<u64>,
}

impl AsyncEventKind {
    fn from_raw(raw: u32) -> Self {
        use sys::ibv_event_type as t;
        match raw {
            x if x == t::IBV_EVENT_CQ_ERR as u32 => Self::CqErr,
            x if x == t::IBV_EVENT_QP_FATAL as u32 => Self::QpFatal,
            x if x == t::IBV_EVENT_QP_REQ_ERR as u32 => Self::QpReqErr,
            x if x == t::IBV_EVENT_QP_ACCESS_ERR as u32 => Self::QpAccessErr,
            x if x == t::IBV_EVENT_COMM_EST as u32 => Self::CommEst,
            x if x == t::IBV_EVENT_QP_LAST_WQE_REACHED as u32 => Self::QpLastWqeReached,
            x if x == t::IBV_EVENT_SRQ_ERR as u32 => Self::SrqErr,
            x if x == t::IBV_EVENT_PORT_ACTIVE as u32 => Self::PortActive,
            x if x == t::IBV_EVENT_PORT_ERR as u32 => Self::PortErr,
            x if x == t::IBV_EVENT_DEVICE_FATAL as u32 => Self::DeviceFatal,
            other => Self::Other(other),
        }
    }

    fn names_qp(self) -> bool {
        matches!(
            self,
            Self::QpFatal
                | Self::QpReqErr
                | Self::QpAccessErr
                | Self::CommEst
                | Self::QpLastWqeReached
        )
    }
}

/// Takes the next pending event of `ctx` without blocking.
pub(crate) fn poll(ctx: &Context) -> Result<Option<AsyncEvent>> {
    // SAFETY: the context is open; `async_fd` is its descriptor for the events.
    let fd = unsafe { (*ctx.as_raw()).async_fd };
    if !ctx.async_fd_nonblocking() {
        set_nonblocking(fd).map_err(RdmaError::GetAsyncEvent)?;
        ctx.set_async_fd_nonblocking();
    }
    let mut ev = MaybeUninit::<sys::ibv_async_event>::zeroed();
    // SAFETY: the context is open and its descriptor non-blocking; `ev` is writable.
    let ret = unsafe { sys::ibv_get_async_event(ctx.as_raw(), ev.as_mut_ptr()) };
    if ret != 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(RdmaError::GetAsyncEvent(err));
    }
    // SAFETY: filled by the successful call.
    let mut ev = unsafe { ev.assume_init() };
    let kind = AsyncEventKind::from_raw(ev.event_type as u32);
    let (mut qp_num, mut cq_id) = (None, None);
    if kind.names_qp() {
        // SAFETY: for QP events the element is the QP, alive until the acknowledgement
        // (`ibv_destroy_qp` waits for it).
        let qp = unsafe { ev.element.qp };
        if !qp.is_null() {
            // SAFETY: as above.
            qp_num = Some(unsafe { (*qp).qp_num });
        }
    } else if kind == AsyncEventKind::CqErr {
        // SAFETY: for CQ events the element is the CQ; only its address is kept.
        cq_id = Some(unsafe { ev.element.cq } as u64);
    }
    // SAFETY: an event from `ibv_get_async_event`, acknowledged once, nothing kept from it
    // but copies.
    unsafe { sys::ibv_ack_async_event(&mut ev) };
    Ok(Some(AsyncEvent {
        kind,
        qp_num,
        cq_id,
    }))
}

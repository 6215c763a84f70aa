//! Completion queues, their optional completion channel, and work completions.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::Context;
use super::error::{errno_from_ret, last_errno, RdmaError, Result};
use super::sys;

/// Status of a work completion (`enum ibv_wc_status`); an open set of values.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WcStatus(pub u32);

impl WcStatus {
    pub const SUCCESS: Self = Self(0);
    pub const LOC_LEN_ERR: Self = Self(1);
    pub const LOC_QP_OP_ERR: Self = Self(2);
    pub const LOC_PROT_ERR: Self = Self(4);
    /// The request was flushed because the QP went to the error state (disconnect).
    pub const WR_FLUSH_ERR: Self = Self(5);
    /// A memory window bind failed (the window was not free, the region lacked MW_BIND, ...).
    pub const MW_BIND_ERR: Self = Self(6);
    pub const LOC_ACCESS_ERR: Self = Self(8);
    pub const REM_INV_REQ_ERR: Self = Self(9);
    pub const REM_ACCESS_ERR: Self = Self(10);
    pub const REM_OP_ERR: Self = Self(11);
    pub const RETRY_EXC_ERR: Self = Self(12);
    pub const RNR_RETRY_EXC_ERR: Self = Self(13);
    pub const FATAL_ERR: Self = Self(19);
    pub const GENERAL_ERR: Self = Self(21);

    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// libibverbs' description of the status.
    pub fn as_str(self) -> &'static str {
        // SAFETY: `ibv_wc_status_str` accepts any value and returns a pointer to a static
        // NUL-terminated string ("unknown" for values it does not know).
        let s = unsafe { CStr::from_ptr(sys::ibv_wc_status_str(self.0)) };
        s.to_str().unwrap_or("unknown")
    }
}

impl fmt::Debug for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WcStatus({}: {})", self.0, self.as_str())
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Opcode of a work completion (`enum ibv_wc_opcode`); an open set of values. Only
/// meaningful when the status is success.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WcOpcode(pub u32);

impl WcOpcode {
    pub const SEND: Self = Self(0);
    pub const RDMA_WRITE: Self = Self(1);
    pub const RDMA_READ: Self = Self(2);
    pub const COMP_SWAP: Self = Self(3);
    pub const FETCH_ADD: Self = Self(4);
    pub const BIND_MW: Self = Self(5);
    pub const LOCAL_INV: Self = Self(6);
    /// Receive-queue completions have bit 7 set.
    pub const RECV: Self = Self(128);
    pub const RECV_RDMA_WITH_IMM: Self = Self(129);

    /// Whether this completion came from a receive queue.
    pub fn is_recv(self) -> bool {
        self.0 & 128 != 0
    }
}

impl fmt::Debug for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            Self::SEND => "SEND",
            Self::RDMA_WRITE => "RDMA_WRITE",
            Self::RDMA_READ => "RDMA_READ",
            Self::COMP_SWAP => "COMP_SWAP",
            Self::FETCH_ADD => "FETCH_ADD",
            Self::BIND_MW => "BIND_MW",
            Self::LOCAL_INV => "LOCAL_INV",
            Self::RECV => "RECV",
            Self::RECV_RDMA_WITH_IMM => "RECV_RDMA_WITH_IMM",
            Self(v) => return write!(f, "WcOpcode({v})"),
        };
        f.write_str(name)
    }
}

/// A work completion. Same layout as `struct ibv_wc`, so [`CompletionQueue::poll`] has the
/// provider write straight into the caller's array.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct WorkCompletion {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    /// Immediate data (big-endian) with `IBV_WC_WITH_IMM`, invalidated rkey with
    /// `IBV_WC_WITH_INV`.
    imm_or_rkey: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

const _: () = {
    use std::mem::offset_of;
    type W = WorkCompletion;
    type C = sys::ibv_wc;
    assert!(mem::size_of::<W>() == 48 && mem::size_of::<C>() == 48);
    assert!(mem::align_of::<W>() == mem::align_of::<C>());
    assert!(offset_of!(W, wr_id) == offset_of!(C, wr_id));
    assert!(offset_of!(W, status) == offset_of!(C, status));
    assert!(offset_of!(W, opcode) == offset_of!(C, opcode));
    assert!(offset_of!(W, vendor_err) == offset_of!(C, vendor_err));
    assert!(offset_of!(W, byte_len) == offset_of!(C, byte_len));
    assert!(offset_of!(W, imm_or_rkey) == offset_of!(C, imm_data_invalidated_rkey_union));
    assert!(offset_of!(W, qp_num) == offset_of!(C, qp_num));
    assert!(offset_of!(W, src_qp) == offset_of!(C, src_qp));
    assert!(offset_of!(W, wc_flags) == offset_of!(C, wc_flags));
    assert!(offset_of!(W, pkey_index) == offset_of!(C, pkey_index));
    assert!(offset_of!(W, slid) == offset_of!(C, slid));
    assert!(offset_of!(W, sl) == offset_of!(C, sl));
    assert!(offset_of!(W, dlid_path_bits) == offset_of!(C, dlid_path_bits));
    // The C layout, as compiled against this system's verbs.h.
    assert!(offset_of!(C, imm_data_invalidated_rkey_union) == 24);
    assert!(offset_of!(C, wc_flags) == 36);
    assert!(offset_of!(C, sl) == 44);
};

impl WorkCompletion {
    const WITH_IMM: u32 = 1 << 1;
    const WITH_INV: u32 = 1 << 3;

    /// A completion made by the simulated fabric. `invalidated_rkey` sets `IBV_WC_WITH_INV`
    /// and the key, as a receive completion of SEND_WITH_INVALIDATE reports them.
    #[cfg(feature = "sim")]
    pub(crate) fn sim(
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        qp_num: u32,
        invalidated_rkey: Option<u32>,
    ) -> Self {
        Self {
            wr_id,
            status: status.0,
            opcode: opcode.0,
            byte_len,
            qp_num,
            wc_flags: if invalidated_rkey.is_some() {
                Self::WITH_INV
            } else {
                0
            },
            imm_or_rkey: invalidated_rkey.unwrap_or(0),
            ..Self::default()
        }
    }

    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    pub fn status(&self) -> WcStatus {
        WcStatus(self.status)
    }

    pub fn is_success(&self) -> bool {
        self.status().is_success()
    }

    /// Only meaningful for successful completions.
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode(self.opcode)
    }

    /// Bytes received (receive completions) or transferred (RDMA READ).
    pub fn byte_len(&self) -> u32 {
        self.byte_len
    }

    pub fn vendor_err(&self) -> u32 {
        self.vendor_err
    }

    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    pub fn wc_flags(&self) -> u32 {
        self.wc_flags
    }

    /// Immediate data in host byte order, if the peer sent any.
    pub fn imm_data(&self) -> Option<u32> {
        (self.wc_flags & Self::WITH_IMM != 0).then(|| u32::from_be(self.imm_or_rkey))
    }

    /// The local rkey the peer invalidated with SEND_WITH_INVALIDATE (`IBV_WC_WITH_INV`).
    ///
    /// Soft-RoCE (rxe, at least through Linux 6.1) reports the invalidation with the kernel's
    /// flag value (`IB_WC_WITH_INVALIDATE`, bit 2, which user space reads as
    /// `IBV_WC_IP_CSUM_OK`), so this returns `None` there; the key is still in
    /// [`Self::ex_data`].
    pub fn invalidated_rkey(&self) -> Option<u32> {
        (self.wc_flags & Self::WITH_INV != 0).then_some(self.imm_or_rkey)
    }

    /// The raw immediate-data / invalidated-rkey word, whatever the flags say.
    pub fn ex_data(&self) -> u32 {
        self.imm_or_rkey
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id)
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len)
            .field("qp_num", &self.qp_num)
            .field("wc_flags", &self.wc_flags)
            .field("vendor_err", &self.vendor_err)
            .finish()
    }
}

/// An `ibv_comp_channel`, non-blocking, owned by one CQ.
struct CompChannel {
    raw: NonNull<sys::ibv_comp_channel>,
}

impl CompChannel {
    fn new(ctx: &Context) -> Result<Self> {
        // SAFETY: the context is open.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::CreateCompChannel(last_errno()))?;
        let chan = Self { raw };
        set_nonblocking(chan.fd()).map_err(RdmaError::CreateCompChannel)?;
        Ok(chan)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is an immutable field.
        unsafe { self.raw.as_ref() }.fd
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: the CQ using this channel was destroyed first (see `CompletionQueue::drop`).
        let ret = unsafe { sys::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(err = %errno_from_ret(ret), "ibv_destroy_comp_channel failed");
        }
    }
}

/// Waits up to `timeout` for `fd` to become readable; `Ok(false)` on timeout. Retries on
/// `EINTR` with the remaining time.
pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up so a sub-millisecond remainder still waits.
        let ms = libc::c_int::try_from(left.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX);
        // SAFETY: `pfd` is one valid pollfd.
        let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ret > 0 {
            return Ok(true);
        }
        if ret == 0 {
            return Ok(false);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fcntl` on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An `ibv_cq`. Holds its context open; QPs hold the CQ.
///
/// With a completion channel ([`CompletionQueue::with_channel`]) a reactor can stop spinning:
/// [`req_notify`](Self::req_notify), poll once more, then wait for
/// [`channel_fd`](Self::channel_fd) to become readable and consume the event with
/// [`get_event`](Self::get_event). Events are acknowledged in batches with
/// [`ack_events`](Self::ack_events) (and on drop, which `ibv_destroy_cq` requires).
pub struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    /// Events taken from the channel but not yet acknowledged.
    unacked: AtomicU32,
    // Dropped after the CQ (see `Drop`), then the context.
    channel: Option<CompChannel>,
    ctx: Arc<Context>,
}

// SAFETY: CQ verbs (poll, notify, ack) are thread-safe in libibverbs; the unacked counter is
// atomic.
unsafe impl Send for CompletionQueue {}
// SAFETY: see `Send`.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// `ibv_create_cq` with room for at least `cqe` completions, without a channel.
    pub fn new(ctx: &Arc<Context>, cqe: u32) -> Result<Arc<Self>> {
        Self::create(ctx, cqe, None, 0)
    }

    /// Like [`new`](Self::new), with a private non-blocking completion channel whose
    /// interrupts go to completion vector `comp_vector`.
    pub fn with_channel(ctx: &Arc<Context>, cqe: u32, comp_vector: u32) -> Result<Arc<Self>> {
        let channel = CompChannel::new(ctx)?;
        Self::create(ctx, cqe, Some(channel), comp_vector)
    }

    fn create(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<CompChannel>,
        comp_vector: u32,
    ) -> Result<Arc<Self>> {
        let cqe = libc::c_int::try_from(cqe)
            .map_err(|_| RdmaError::InvalidArgument("CQ size out of range"))?;
        let vector = libc::c_int::try_from(comp_vector)
            .map_err(|_| RdmaError::InvalidArgument("completion vector out of range"))?;
        let chan = channel.as_ref().map_or(ptr::null_mut(), |c| c.raw.as_ptr());
        // SAFETY: the context is open; `chan` is NULL or a live channel on that context.
        let raw = unsafe { sys::ibv_create_cq(ctx.as_raw(), cqe, ptr::null_mut(), chan, vector) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::CreateCq(last_errno()))?;
        Ok(Arc::new(Self {
            raw,
            unacked: AtomicU32::new(0),
            channel,
            ctx: ctx.clone(),
        }))
    }

    /// Takes up to `out.len()` completions; returns how many were written to the front of
    /// `out`. Never allocates.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let n = libc::c_int::try_from(out.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: the CQ is live; `out` has room for `n` entries laid out exactly like
        // `ibv_wc` (asserted above), and any bit pattern the provider writes is valid for
        // the integer fields.
        let ret = unsafe { sys::ibv_poll_cq(self.raw.as_ptr(), n, out.as_mut_ptr().cast()) };
        if ret < 0 {
            return Err(RdmaError::PollCq(errno_from_ret(ret)));
        }
        Ok(ret as usize)
    }

    /// Arms the CQ: the next completion (only solicited ones if `solicited_only`) raises an
    /// event on the channel. Poll again after arming, or a completion that arrived in
    /// between goes unnoticed until the next one.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: the CQ is live.
        let ret = unsafe { sys::ibv_req_notify_cq(self.raw.as_ptr(), solicited_only as i32) };
        if ret != 0 {
            return Err(RdmaError::ReqNotifyCq(errno_from_ret(ret)));
        }
        Ok(())
    }

    /// The completion channel's descriptor (non-blocking), if the CQ has one.
    pub fn channel_fd(&self) -> Option<RawFd> {
        self.channel.as_ref().map(CompChannel::fd)
    }

    /// Consumes one completion event from the channel if one is pending; `Ok(false)` when
    /// none is (or the CQ has no channel). The CQ must be re-armed with
    /// [`req_notify`](Self::req_notify) to get another.
    pub fn get_event(&self) -> Result<bool> {
        let Some(channel) = &self.channel else {
            return Ok(false);
        };
        let mut cq: *mut sys::ibv_cq = ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = ptr::null_mut();
        // SAFETY: the channel is live and non-blocking, the out-pointers are valid.
        let ret = unsafe { sys::ibv_get_cq_event(channel.raw.as_ptr(), &mut cq, &mut cq_ctx) };
        if ret != 0 {
            let err = last_errno();
            if err.kind() == io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(RdmaError::GetCqEvent(err));
        }
        // The channel is private to this CQ, so the event is ours.
        debug_assert_eq!(cq, self.raw.as_ptr());
        self.unacked.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Blocks up to `timeout` for a completion event and consumes it; `Ok(false)` on timeout
    /// or without a channel. For tools and tests: a reactor polls
    /// [`channel_fd`](Self::channel_fd) itself.
    pub fn wait_event(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let Some(fd) = self.channel_fd() else {
            return Ok(false);
        };
        loop {
            if self.get_event()? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !wait_readable(fd, left).map_err(RdmaError::GetCqEvent)? {
                return Ok(false);
            }
        }
    }

    /// Acknowledges the events taken so far (acknowledging takes a lock, so batch it).
    pub fn ack_events(&self) {
        let n = self.unacked.swap(0, Ordering::Relaxed);
        if n > 0 {
            // SAFETY: the CQ is live and `n` events were taken and not yet acknowledged.
            unsafe { sys::ibv_ack_cq_events(self.raw.as_ptr(), n) };
        }
    }

    /// Number of entries the CQ actually has (at least the requested size).
    pub fn capacity(&self) -> u32 {
        // SAFETY: the CQ is live; `cqe` is only changed by `ibv_resize_cq`, which runs on the
        // thread that owns and polls the CQ (see `resize`), the same one that asks this.
        u32::try_from(unsafe { self.raw.as_ref() }.cqe).unwrap_or(0)
    }

    /// `ibv_resize_cq` to at least `cqe` entries; returns the new capacity. Completions
    /// already queued are kept. Call it only from the thread that polls this CQ.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        let want = libc::c_int::try_from(cqe)
            .map_err(|_| RdmaError::InvalidArgument("CQ size out of range"))?;
        // SAFETY: the CQ is live; the provider serialises resize against its own polling,
        // and the caller polls from this thread only.
        let ret = unsafe { sys::ibv_resize_cq(self.raw.as_ptr(), want) };
        if ret != 0 {
            return Err(RdmaError::ResizeCq(errno_from_ret(ret)));
        }
        Ok(self.capacity())
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }
}

impl AsRawFd for CompletionQueue {
    /// The completion channel's descriptor, or -1 without a channel.
    fn as_raw_fd(&self) -> RawFd {
        self.channel_fd().unwrap_or(-1)
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("raw", &self.raw)
            .field("capacity", &self.capacity())
            .field("channel_fd", &self.channel_fd())
            .finish()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // `ibv_destroy_cq` waits until every event taken from the channel is acknowledged.
        self.ack_events();
        // SAFETY: every QP using this CQ holds an `Arc` of it, so none is left; the CQ is
        // destroyed once, before its channel (dropped with the fields) and context.
        let ret = unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(err = %errno_from_ret(ret), "ibv_destroy_cq failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_completion_accessors() {
        let mut wc = WorkCompletion::default();
        assert!(wc.is_success());
        assert_eq!(wc.imm_data(), None);
        assert_eq!(wc.invalidated_rkey(), None);
        wc.wc_flags = WorkCompletion::WITH_INV;
        wc.imm_or_rkey = 0x1234;
        assert_eq!(wc.invalidated_rkey(), Some(0x1234));
        wc.wc_flags = WorkCompletion::WITH_IMM;
        wc.imm_or_rkey = 7u32.to_be();
        assert_eq!(wc.imm_data(), Some(7));
        wc.status = WcStatus::WR_FLUSH_ERR.0;
        assert!(!wc.is_success());
        assert!(WcOpcode::RECV.is_recv() && !WcOpcode::RDMA_READ.is_recv());
    }

    #[test]
    fn status_strings_come_from_libibverbs() {
        assert_eq!(WcStatus::SUCCESS.as_str(), "success");
        assert!(WcStatus::WR_FLUSH_ERR
            .as_str()
            .to_lowercase()
            .contains("flush"));
        assert_eq!(WcStatus(0xdead).as_str(), "unknown");
    }
}

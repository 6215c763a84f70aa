//! Work requests: scatter entries, send-queue and receive-queue requests, and the
//! allocation-free posting of chains of them.
//!
//! Posting is safe because the device can only touch memory through the keys of live
//! registrations ([`MemoryRegion`] keeps its memory alive and
//! deregistration revokes the keys); what each buffer may be used for while a request is
//! outstanding is the registered memory's owner's business (see
//! [`MemoryRegion::register_raw`](super::mr::MemoryRegion::register_raw)). The one place the
//! CPU reads caller memory during a post is inline data, which therefore comes from a
//! borrowed slice, never from a raw scatter entry.

use std::any::Any;
use std::mem::{self, MaybeUninit};
use std::ptr;
use std::sync::Arc;

use super::error::{errno_from_ret, RdmaError, Result};
use super::mr::{AccessFlags, MemoryRegion};
use super::mw::MemoryWindow;
use super::sys;
use super::verbs::{VerbsMr, VerbsMw};

/// One scatter/gather entry: `length` bytes at `addr` inside the registration named by
/// `lkey`. Same layout as `struct ibv_sge`, so slices of it are handed to the provider as is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

const _: () = {
    assert!(mem::size_of::<Sge>() == mem::size_of::<sys::ibv_sge>());
    assert!(mem::align_of::<Sge>() == mem::align_of::<sys::ibv_sge>());
    assert!(mem::offset_of!(Sge, addr) == mem::offset_of!(sys::ibv_sge, addr));
    assert!(mem::offset_of!(Sge, length) == mem::offset_of!(sys::ibv_sge, length));
    assert!(mem::offset_of!(Sge, lkey) == mem::offset_of!(sys::ibv_sge, lkey));
};

/// What a send-queue work request does.
#[derive(Clone, Copy, Debug)]
pub enum SendOp<'a> {
    /// SEND: consumes a receive buffer at the peer.
    Send,
    /// SEND with 32-bit immediate data (host byte order here; sent big-endian).
    SendWithImm { imm: u32 },
    /// SEND that also invalidates `rkey` at the peer (NVMe-oF's remote invalidation of the
    /// host's data buffer key). Needs [`DeviceCapFlags::MEM_MGT_EXTENSIONS`](super::device::DeviceCapFlags::MEM_MGT_EXTENSIONS).
    SendWithInvalidate { rkey: u32 },
    /// RDMA WRITE of the local scatter list to `remote_addr` under the peer's `rkey`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// RDMA READ from `remote_addr` under the peer's `rkey` into the local scatter list.
    RdmaRead { remote_addr: u64, rkey: u32 },
    /// Invalidates a local window's or fast-registered key (`IBV_WR_LOCAL_INV`).
    LocalInvalidate { rkey: u32 },
    /// Binds a type 2 memory window (see [`SendWr::bind_mw`]).
    BindMw(MwBind<'a>),
}

/// A type 2 memory window bind: exposes `len` bytes at `offset` of `mr` through `mw` under
/// the new key `rkey` with `access`.
///
/// The window and the region are the provider's own types behind `dyn Any` (its
/// [`Verbs::Mw`](super::verbs::Verbs::Mw) and an `Arc` of its
/// [`Verbs::Mr`](super::verbs::Verbs::Mr)), so the work request vocabulary stays common to
/// every provider; each provider's post downcasts them ([`MwBind::downcast`]) and refuses
/// another provider's objects with `InvalidArgument`.
#[derive(Clone, Copy)]
pub struct MwBind<'a> {
    pub mw: &'a dyn Any,
    pub mr: &'a dyn Any,
    pub offset: usize,
    pub len: usize,
    pub access: AccessFlags,
    /// The key the window has once bound; [`VerbsMw::rkey`] reports it after the post.
    pub rkey: u32,
}

impl<'a> MwBind<'a> {
    /// The window as `W` and the region as `Arc<M>`: what a provider's post works with.
    #[inline]
    pub fn downcast<W: 'static, M: 'static>(&self) -> Result<(&'a W, &'a Arc<M>)> {
        match (
            self.mw.downcast_ref::<W>(),
            self.mr.downcast_ref::<Arc<M>>(),
        ) {
            (Some(mw), Some(mr)) => Ok((mw, mr)),
            _ => Err(RdmaError::InvalidArgument(
                "memory window bind of another provider's window or region",
            )),
        }
    }

    /// The checks every provider makes before a bind is posted, given the downcast region
    /// and whether the window and the region are on the same PD.
    pub(crate) fn validate<M: VerbsMr>(&self, mr: &M, same_pd: bool) -> Result<()> {
        if !mr.contains(self.offset, self.len) {
            return Err(RdmaError::InvalidArgument(
                "memory window bind outside the region",
            ));
        }
        if !same_pd {
            return Err(RdmaError::InvalidArgument(
                "memory window and region are on different PDs",
            ));
        }
        if !mr.access().contains(AccessFlags::MW_BIND) {
            return Err(RdmaError::InvalidArgument(
                "region was not registered with MW_BIND",
            ));
        }
        Ok(())
    }

    /// Identity of the window, for "bound twice in one post".
    fn window_addr(&self) -> *const () {
        (self.mw as *const dyn Any).cast()
    }
}

impl std::fmt::Debug for MwBind<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MwBind")
            .field("mw", &self.window_addr())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("access", &self.access)
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

/// The local data of a send-queue work request.
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// Registered memory, accessed by the device after the post returns.
    Sges(&'a [Sge]),
    /// Bytes copied into the work queue during the post (`IBV_SEND_INLINE`); no registration
    /// needed and the slice is free again when the post returns. Not valid for RDMA READ;
    /// at most the QP's `max_inline_data` bytes.
    Inline(&'a [u8]),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Sges(s) => s.len(),
            Payload::Inline(_) => 1,
        }
    }
}

/// A send-queue work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Returned in the work completion.
    pub wr_id: u64,
    pub op: SendOp<'a>,
    pub payload: Payload<'a>,
    /// Generate a completion (`IBV_SEND_SIGNALED`). Unsignaled requests complete silently,
    /// but the send queue slot is only reclaimed by a later signaled completion.
    pub signaled: bool,
    /// Wait for earlier RDMA READs to finish first (`IBV_SEND_FENCE`).
    pub fence: bool,
    /// Ask the peer to raise a solicited event (`IBV_SEND_SOLICITED`).
    pub solicited: bool,
}

impl<'a> SendWr<'a> {
    pub fn new(wr_id: u64, op: SendOp<'a>, payload: Payload<'a>) -> Self {
        Self {
            wr_id,
            op,
            payload,
            signaled: true,
            fence: false,
            solicited: false,
        }
    }

    pub fn send(wr_id: u64, sges: &'a [Sge]) -> Self {
        Self::new(wr_id, SendOp::Send, Payload::Sges(sges))
    }

    pub fn send_inline(wr_id: u64, data: &'a [u8]) -> Self {
        Self::new(wr_id, SendOp::Send, Payload::Inline(data))
    }

    pub fn send_with_invalidate(wr_id: u64, sges: &'a [Sge], rkey: u32) -> Self {
        Self::new(
            wr_id,
            SendOp::SendWithInvalidate { rkey },
            Payload::Sges(sges),
        )
    }

    pub fn rdma_write(wr_id: u64, sges: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        Self::new(
            wr_id,
            SendOp::RdmaWrite { remote_addr, rkey },
            Payload::Sges(sges),
        )
    }

    pub fn rdma_read(wr_id: u64, sges: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        Self::new(
            wr_id,
            SendOp::RdmaRead { remote_addr, rkey },
            Payload::Sges(sges),
        )
    }

    /// Local invalidation of `rkey` (a memory window's key).
    pub fn local_invalidate(wr_id: u64, rkey: u32) -> Self {
        Self::new(wr_id, SendOp::LocalInvalidate { rkey }, Payload::Sges(&[]))
    }

    /// Binds `mw` to `len` bytes at `offset` of `mr` (registered with
    /// [`AccessFlags::MW_BIND`]) with `access` (remote read and/or write). The window gets
    /// the next key of its sequence; read it with [`VerbsMw::rkey`] after posting.
    /// Post one bind per window at a time, and use the window only on this QP afterwards
    /// (type 2B windows belong to the QP that bound them). `mw` and `mr` are one provider's
    /// window and region (checked when posted).
    pub fn bind_mw<W: VerbsMw, M: VerbsMr>(
        wr_id: u64,
        mw: &'a W,
        mr: &'a Arc<M>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Self {
        let rkey = mw.next_rkey();
        Self::new(
            wr_id,
            SendOp::BindMw(MwBind {
                mw,
                mr,
                offset,
                len,
                access,
                rkey,
            }),
            Payload::Sges(&[]),
        )
    }

    /// Sets whether this request generates a completion.
    pub fn signaled(mut self, signaled: bool) -> Self {
        self.signaled = signaled;
        self
    }

    pub fn fence(mut self, fence: bool) -> Self {
        self.fence = fence;
        self
    }

    pub fn solicited(mut self, solicited: bool) -> Self {
        self.solicited = solicited;
        self
    }
}

/// A receive-queue work request (for a QP's own receive queue or an SRQ).
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sges: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    pub fn new(wr_id: u64, sges: &'a [Sge]) -> Self {
        Self { wr_id, sges }
    }
}

/// Work requests per `ibv_post_*` call: chains are built in fixed arrays on the stack, and
/// longer slices are posted in several calls.
pub const MAX_CHAIN: usize = 16;

fn num_sge(n: usize) -> Result<libc::c_int> {
    libc::c_int::try_from(n).map_err(|_| RdmaError::InvalidArgument("too many scatter entries"))
}

/// Checks what the provider would otherwise find out halfway through a chain (or, for inline
/// data, what it might not check at all). Each bind also goes through the provider's
/// `check_bind` (its objects' types, then [`MwBind::validate`]).
pub(crate) fn validate_send(
    max_inline: u32,
    wrs: &[SendWr<'_>],
    check_bind: impl Fn(&MwBind<'_>) -> Result<()>,
) -> Result<()> {
    for (i, wr) in wrs.iter().enumerate() {
        if let Payload::Inline(data) = wr.payload {
            if matches!(wr.op, SendOp::RdmaRead { .. }) {
                return Err(RdmaError::InvalidArgument("RDMA READ cannot be inline"));
            }
            if data.len() > max_inline as usize {
                return Err(RdmaError::InvalidArgument(
                    "inline data longer than the QP's max_inline_data",
                ));
            }
        }
        num_sge(wr.payload.len())?;
        if let SendOp::BindMw(b) = wr.op {
            check_bind(&b)?;
            let twice = wrs[..i].iter().any(
                |w| matches!(w.op, SendOp::BindMw(p) if ptr::eq(p.window_addr(), b.window_addr())),
            );
            if twice {
                return Err(RdmaError::InvalidArgument(
                    "a memory window is bound twice in one post",
                ));
            }
        }
    }
    Ok(())
}

/// Posts `wrs` on `qp` with `ibv_post_send`, `MAX_CHAIN` at a time. On failure, the
/// requests before the reported index were posted and the rest were not.
///
/// # Safety
///
/// `qp` must be a live QP whose inline limit is `max_inline`.
pub(crate) unsafe fn post_send(
    qp: *mut sys::ibv_qp,
    max_inline: u32,
    wrs: &[SendWr<'_>],
) -> Result<()> {
    validate_send(max_inline, wrs, |b| {
        let (mw, mr) = b.downcast::<MemoryWindow, MemoryRegion>()?;
        b.validate(&**mr, Arc::ptr_eq(mw.pd(), mr.pd()))
    })?;
    for (chunk_no, chunk) in wrs.chunks(MAX_CHAIN).enumerate() {
        let base = chunk_no * MAX_CHAIN;
        // SAFETY: forwarded from the caller; the chunk was validated.
        let result = unsafe { post_send_chunk(qp, chunk) };
        let posted = match &result {
            Ok(()) => chunk.len(),
            Err((_, i)) => *i,
        };
        // Validation rejected a window bound twice in one post, so each window's key is
        // read by the provider before it is updated here.
        for wr in &chunk[..posted] {
            if let SendOp::BindMw(b) = wr.op {
                let (mw, mr) = b
                    .downcast::<MemoryWindow, MemoryRegion>()
                    .expect("checked before posting");
                mw.commit_bind(b.rkey, mr);
            }
        }
        result.map_err(|(source, i)| RdmaError::PostSend {
            source,
            index: base + i,
        })?;
    }
    Ok(())
}

/// # Safety
///
/// `qp` must be a live QP.
unsafe fn post_send_chunk(
    qp: *mut sys::ibv_qp,
    chunk: &[SendWr<'_>],
) -> std::result::Result<(), (std::io::Error, usize)> {
    debug_assert!(!chunk.is_empty() && chunk.len() <= MAX_CHAIN);
    // Inline payloads need an `ibv_sge` to point at; they live here, beside the chain.
    let mut inline_sges = [sys::ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    }; MAX_CHAIN];
    let mut chain: [MaybeUninit<sys::ibv_send_wr>; MAX_CHAIN] =
        [const { MaybeUninit::uninit() }; MAX_CHAIN];

    for (i, wr) in chunk.iter().enumerate() {
        // SAFETY: `ibv_send_wr` is plain C data (integers, pointers, unions of them); all
        // zeroes is a valid value, and the fields we do not set must be zero.
        let mut raw: sys::ibv_send_wr = unsafe { mem::zeroed() };
        raw.wr_id = wr.wr_id;
        let mut flags = 0u32;
        if wr.signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if wr.fence {
            flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        }
        if wr.solicited {
            flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        match wr.payload {
            Payload::Sges(sges) => {
                // The provider only reads the list; the cast to `*mut` is what the C
                // prototype wants. Layouts are asserted equal above.
                raw.sg_list = sges.as_ptr().cast_mut().cast();
                raw.num_sge = sges.len() as libc::c_int;
            }
            Payload::Inline(data) => {
                inline_sges[i] = sys::ibv_sge {
                    addr: data.as_ptr() as u64,
                    length: data.len() as u32,
                    lkey: 0,
                };
                raw.sg_list = &mut inline_sges[i];
                raw.num_sge = 1;
                flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
            }
        }
        raw.send_flags = flags;
        match wr.op {
            SendOp::Send => raw.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
            SendOp::SendWithImm { imm } => {
                raw.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            SendOp::SendWithInvalidate { rkey } => {
                raw.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                raw.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                raw.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                raw.wr.rdma = sys::rdma_t { remote_addr, rkey };
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                raw.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
                raw.wr.rdma = sys::rdma_t { remote_addr, rkey };
            }
            SendOp::LocalInvalidate { rkey } => {
                raw.opcode = sys::ibv_wr_opcode::IBV_WR_LOCAL_INV;
                raw.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            SendOp::BindMw(b) => {
                let (mw, mr) = b
                    .downcast::<MemoryWindow, MemoryRegion>()
                    .expect("checked before posting");
                raw.opcode = sys::ibv_wr_opcode::IBV_WR_BIND_MW;
                // Both handles are borrowed for the call and stay alive after it: the caller
                // holds them, and the window keeps the region once the bind is recorded.
                raw.bind_mw_tso_union.bind_mw = sys::bind_mw_t {
                    mw: mw.as_raw(),
                    rkey: b.rkey,
                    bind_info: sys::ibv_mw_bind_info {
                        mr: mr.as_raw(),
                        addr: mr.remote_addr(b.offset),
                        length: b.len as u64,
                        mw_access_flags: b.access.0,
                    },
                };
            }
        }
        chain[i].write(raw);
    }
    let n = chunk.len();
    let first: *mut sys::ibv_send_wr = chain[0].as_mut_ptr();
    for i in 0..n {
        let next = if i + 1 < n {
            chain[i + 1].as_mut_ptr()
        } else {
            ptr::null_mut()
        };
        // SAFETY: elements `0..n` were initialized above.
        unsafe { (*chain[i].as_mut_ptr()).next = next };
    }

    let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
    // SAFETY: `qp` is a live QP (caller's contract); `first` heads a NULL-terminated chain
    // of `n` initialized requests in `chain`, whose scatter lists point either at caller
    // slices that outlive this call or at `inline_sges`, which is not moved during it. The
    // provider copies what it needs before returning.
    let ret = unsafe { sys::ibv_post_send(qp, first, &mut bad) };
    if ret != 0 {
        return Err((errno_from_ret(ret), chain_index(first, bad, n)));
    }
    Ok(())
}

/// Posts `wrs` with `post` (a QP's or an SRQ's `post_recv`), `MAX_CHAIN` at a time. Returns
/// the OS error and the index of the first request not posted.
pub(crate) fn post_recv(
    wrs: &[RecvWr<'_>],
    mut post: impl FnMut(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> libc::c_int,
) -> std::result::Result<(), (std::io::Error, usize)> {
    if let Some(i) = wrs.iter().position(|wr| num_sge(wr.sges.len()).is_err()) {
        return Err((std::io::Error::from_raw_os_error(libc::EINVAL), i));
    }
    for (chunk_no, chunk) in wrs.chunks(MAX_CHAIN).enumerate() {
        let base = chunk_no * MAX_CHAIN;
        let mut chain = [sys::ibv_recv_wr {
            wr_id: 0,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        }; MAX_CHAIN];
        let n = chunk.len();
        for (i, wr) in chunk.iter().enumerate() {
            chain[i].wr_id = wr.wr_id;
            // The provider only reads the list; layouts are asserted equal above.
            chain[i].sg_list = wr.sges.as_ptr().cast_mut().cast();
            chain[i].num_sge = wr.sges.len() as libc::c_int;
        }
        let first: *mut sys::ibv_recv_wr = chain.as_mut_ptr();
        for (i, wr) in chain.iter_mut().enumerate().take(n.saturating_sub(1)) {
            // SAFETY: `i + 1 < n <= MAX_CHAIN`, inside `chain`.
            wr.next = unsafe { first.add(i + 1) };
        }
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        let ret = post(first, &mut bad);
        if ret != 0 {
            return Err((errno_from_ret(ret), base + chain_index(first, bad, n)));
        }
    }
    Ok(())
}

/// Index of `bad` in the chain starting at `first`, or 0 if the provider did not report a
/// request inside it.
fn chain_index<T>(first: *mut T, bad: *mut T, n: usize) -> usize {
    let (f, b) = (first as usize, bad as usize);
    if b < f {
        return 0;
    }
    let i = (b - f) / mem::size_of::<T>();
    if i < n {
        i
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_index_finds_the_bad_request() {
        let mut a = [0u64; 4];
        let first = a.as_mut_ptr();
        assert_eq!(chain_index(first, first.wrapping_add(2), 4), 2);
        assert_eq!(chain_index(first, ptr::null_mut(), 4), 0);
        assert_eq!(chain_index(first, first.wrapping_add(9), 4), 0);
    }

    #[test]
    fn builders_default_to_signaled() {
        let sge = [Sge::default()];
        let wr = SendWr::rdma_read(7, &sge, 0x1000, 0x42).signaled(false);
        assert!(!wr.signaled);
        assert!(matches!(
            wr.op,
            SendOp::RdmaRead {
                remote_addr: 0x1000,
                rkey: 0x42
            }
        ));
        assert!(SendWr::send(1, &sge).signaled);
    }

    #[test]
    fn a_bind_names_its_providers_objects() {
        let (mw, mr) = (7u8, Arc::new(9u16));
        let b = MwBind {
            mw: &mw,
            mr: &mr,
            offset: 0,
            len: 1,
            access: AccessFlags::REMOTE_READ,
            rkey: 1,
        };
        let (w, r) = b.downcast::<u8, u16>().unwrap();
        assert_eq!((*w, **r), (7, 9));
        // Another provider's window or region type is refused, not misread.
        assert!(matches!(
            b.downcast::<MemoryWindow, u16>(),
            Err(RdmaError::InvalidArgument(_))
        ));
        assert!(matches!(
            b.downcast::<u8, MemoryRegion>(),
            Err(RdmaError::InvalidArgument(_))
        ));
        // The same window twice in one post is refused before any provider sees it.
        let wr = SendWr::new(1, SendOp::BindMw(b), Payload::Sges(&[]));
        assert!(matches!(
            validate_send(0, &[wr, wr], |_| Ok(())),
            Err(RdmaError::InvalidArgument(_))
        ));
        validate_send(0, &[wr], |_| Ok(())).unwrap();
    }

    #[test]
    fn inline_read_is_rejected_before_any_verb() {
        let wr = SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            Payload::Inline(b"x"),
        );
        let err = validate_send(64, &[wr], |_| Ok(())).unwrap_err();
        assert!(matches!(err, RdmaError::InvalidArgument(_)));
        let wr = SendWr::send_inline(1, &[0u8; 65]);
        let err = validate_send(64, &[wr], |_| Ok(())).unwrap_err();
        assert!(matches!(err, RdmaError::InvalidArgument(_)));
        let wr = SendWr::send_inline(1, &[0u8; 64]);
        validate_send(64, &[wr], |_| Ok(())).unwrap();
    }
}

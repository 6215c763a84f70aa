//! Memory registration: byte regions the device may access, and the keys that name them.
//!
//! A [`MemoryRegion`] never owns the memory it registers directly; it holds an `Arc` of the
//! memory's owner (a buffer pool's mapping, a [`DmaBuf`]'s allocation), so the memory
//! outlives the registration by construction: `ibv_dereg_mr` runs before the owner can be
//! dropped.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ops::BitOr;
use std::ptr::NonNull;
use std::sync::Arc;

use super::error::{errno_from_ret, last_errno, RdmaError, Result};
use super::pd::ProtectionDomain;
use super::sys;
use super::verbs::{RealVerbs, Verbs, VerbsMr};
use super::wr::Sge;

/// Access rights of a registration (`enum ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// The device may write the memory (needed by RECV and RDMA READ targets).
    pub const LOCAL_WRITE: Self = Self(1);
    /// Peers may RDMA WRITE into the memory.
    pub const REMOTE_WRITE: Self = Self(1 << 1);
    /// Peers may RDMA READ from the memory.
    pub const REMOTE_READ: Self = Self(1 << 2);
    pub const REMOTE_ATOMIC: Self = Self(1 << 3);
    pub const MW_BIND: Self = Self(1 << 4);
    /// Optional: the device may reorder writes to this memory (`IBV_ACCESS_RELAXED_ORDERING`);
    /// ignored by devices without support.
    pub const RELAXED_ORDERING: Self = Self(1 << 20);

    /// Local write plus remote read and write: what an NVMe-oF data buffer needs.
    pub const ALL_DATA: Self = Self(1 | (1 << 1) | (1 << 2));

    /// Bits from `IBV_ACCESS_OPTIONAL_FIRST` up need `ibv_reg_mr_iova2`.
    const OPTIONAL_RANGE: u32 = 0x3ff << 20;

    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AccessFlags({:#x})", self.0)
    }
}

/// Memory the caller declared device-accessible: `len` bytes at `addr`, kept alive by
/// `owner`. Building one is the unsafe step (see [`DeviceMemory::new`]); registering it with a
/// provider ([`Verbs::register`](super::verbs::Verbs::register)) is then safe. The copies
/// are crate-internal: only the verbs layer (the simulated NIC, [`DmaBuf`]) moves bytes
/// through it, never safe code outside this crate.
#[derive(Clone)]
pub struct DeviceMemory {
    addr: NonNull<u8>,
    len: usize,
    owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: a pointer plus an `Arc` of thread-safe ownership; the bytes are only touched through
// raw copies whose callers uphold the sharing discipline of `DeviceMemory::new`.
unsafe impl Send for DeviceMemory {}
// SAFETY: as for `Send`.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// # Safety
    ///
    /// - `addr..addr + len` must be valid, readable and writable memory for as long as
    ///   `owner` is alive (every clone and registration keeps `owner` alive).
    /// - While a registration of it exists the device may read or write those bytes
    ///   whenever a work request that names them is outstanding. The owner must treat the
    ///   memory as shared with the device: it must not hold Rust references to bytes a posted
    ///   work request may access, and hands each buffer to one user at a time (this is what a
    ///   buffer pool's ownership of its `IoBuf`s provides).
    pub unsafe fn new(
        addr: *mut u8,
        len: usize,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<Self> {
        let addr = NonNull::new(addr).ok_or(RdmaError::InvalidArgument("null memory region"))?;
        if len == 0 {
            return Err(RdmaError::InvalidArgument("empty memory region"));
        }
        Ok(Self { addr, len, owner })
    }

    pub fn addr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn owner(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.owner
    }

    fn in_bounds(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `src` into the memory at `offset`; `false` (nothing copied) when out of bounds.
    #[allow(dead_code)] // used by the simulated fabric
    pub(crate) fn copy_in(&self, offset: usize, src: &[u8]) -> bool {
        if !self.in_bounds(offset, src.len()) {
            return false;
        }
        // SAFETY: in bounds, and the memory is alive (`owner`). `ptr::copy` tolerates overlap;
        // no Rust reference to these bytes exists per the contract of `new` (the caller is
        // the device side, moving bytes a work request names).
        unsafe { std::ptr::copy(src.as_ptr(), self.addr.as_ptr().add(offset), src.len()) };
        true
    }

    /// Copies `out.len()` bytes at `offset` out; `false` (nothing copied) when out of bounds.
    pub(crate) fn copy_out(&self, offset: usize, out: &mut [u8]) -> bool {
        if !self.in_bounds(offset, out.len()) {
            return false;
        }
        // SAFETY: as in `copy_in`, reading.
        unsafe { std::ptr::copy(self.addr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        true
    }
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .finish()
    }
}

/// A registered memory region (`ibv_mr`).
pub struct MemoryRegion {
    raw: NonNull<sys::ibv_mr>,
    addr: *mut u8,
    len: usize,
    access: AccessFlags,
    // Field order is drop order, but `Drop::drop` deregisters before any field drops, so the
    // owner and the PD outlive the registration either way.
    pd: Arc<ProtectionDomain>,
    owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: an MR is an immutable handle (keys, address) plus `Arc`s of thread-safe objects;
// deregistration is a thread-safe verb.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access only reads the immutable fields.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `len` bytes at `addr`, owned by `owner`, with `ibv_reg_mr`.
    ///
    /// # Safety
    ///
    /// - `addr..addr + len` must be valid, readable and writable memory for as long as
    ///   `owner` is alive (the region keeps `owner` alive until it is deregistered).
    /// - While the region exists the device may read or write those bytes whenever a work
    ///   request that names them is outstanding. The owner must treat the memory as shared
    ///   with the device: it must not hold Rust references to bytes a posted work request may
    ///   access, and hands each buffer to one user at a time (this is what a buffer pool's
    ///   ownership of its `IoBuf`s provides).
    pub unsafe fn register_raw(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<Self> {
        if addr.is_null() || len == 0 {
            return Err(RdmaError::InvalidArgument("empty memory region"));
        }
        let raw = if access.0 & AccessFlags::OPTIONAL_RANGE != 0 {
            // SAFETY: the PD is alive; the caller guarantees the memory range is valid.
            // Optional access bits are only understood by the iova2 entry point.
            unsafe { sys::ibv_reg_mr_iova2(pd.as_raw(), addr.cast(), len, addr as u64, access.0) }
        } else {
            // SAFETY: as above.
            unsafe { sys::ibv_reg_mr(pd.as_raw(), addr.cast(), len, access.0 as libc::c_int) }
        };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::RegMr(last_errno()))?;
        Ok(Self {
            raw,
            addr,
            len,
            access,
            pd: pd.clone(),
            owner,
        })
    }

    /// Registers `mem` with `ibv_reg_mr` (its unsafe contract was discharged when it was
    /// built).
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        mem: DeviceMemory,
        access: AccessFlags,
    ) -> Result<Self> {
        // SAFETY: `DeviceMemory::new`'s contract is this function's.
        unsafe { Self::register_raw(pd, mem.addr(), mem.len, access, mem.owner) }
    }

    /// Local key: goes into scatter entries of local work requests.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `raw` is a live registration; the key is immutable after registration.
        unsafe { self.raw.as_ref() }.lkey
    }

    /// Remote key: what a peer needs (with an address) to RDMA READ or WRITE this memory.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as in `lkey`.
        unsafe { self.raw.as_ref() }.rkey
    }

    /// Start of the registered memory (also its I/O virtual address: we register with
    /// iova == addr).
    pub fn addr(&self) -> *mut u8 {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn access(&self) -> AccessFlags {
        self.access
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn owner(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.owner
    }

    pub fn as_raw(&self) -> *mut sys::ibv_mr {
        self.raw.as_ptr()
    }

    /// Whether `offset..offset + len` lies inside the region.
    pub fn contains(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// A scatter entry for `len` bytes at `offset` into the region, or `None` when out of
    /// bounds or longer than a work request can carry (`u32`).
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        if !self.contains(offset, len) {
            return None;
        }
        Some(Sge {
            addr: self.addr as u64 + offset as u64,
            length: u32::try_from(len).ok()?,
            lkey: self.lkey(),
        })
    }

    /// The address a peer uses to reach `offset` with RDMA READ / WRITE (with [`Self::rkey`]).
    pub fn remote_addr(&self, offset: usize) -> u64 {
        self.addr as u64 + offset as u64
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live registration, deregistered exactly once. After this the
        // device rejects the keys, so outstanding work requests fail instead of touching the
        // memory, which `owner` keeps alive until after this call.
        let ret = unsafe { sys::ibv_dereg_mr(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(err = %errno_from_ret(ret), "ibv_dereg_mr failed");
            // The device may still reach the memory: keep it allocated for good rather than
            // let it be freed under a live registration.
            std::mem::forget(self.owner.clone());
        }
    }
}

/// Registers the whole region of `pool` on `pd` and stores the registration in the pool, so
/// every buffer it hands out carries the region's keys. A pool is registered once (with one
/// PD); a second call fails.
pub fn register_pool<V: Verbs>(
    pd: &Arc<V::Pd>,
    pool: &crate::buffer::BufferPool,
    access: AccessFlags,
) -> Result<()> {
    let (addr, len) = pool.region();
    // SAFETY: the region is the pool's mapping. The registration is stored inside the pool
    // (below), whose shared state drops it before the mapping, so the memory outlives it;
    // the `owner` here is only a placeholder because an `Arc` of the pool would be a cycle.
    // The pool lends each buffer to exactly one `IoBuf` at a time, which is the sharing
    // discipline the contract asks for.
    let mem = unsafe { DeviceMemory::new(addr, len, Arc::new(()))? };
    let mr = V::register(pd, mem, access)?;
    if access.contains(AccessFlags::REMOTE_WRITE)
        || access.contains(AccessFlags::REMOTE_ATOMIC)
        || access.contains(AccessFlags::MW_BIND)
    {
        pool.set_remote_writable();
    }
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    // Stored as an `Arc` so users can find the region again from a buffer
    // (`IoBuf::registration`), e.g. to bind memory windows over it.
    pool.set_registration(lkey, rkey, Box::new(Arc::new(mr)))
        .map_err(|_| RdmaError::InvalidArgument("buffer pool is already registered"))
}

/// A page-aligned, zeroed heap allocation, freed on drop.
struct AlignedAlloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain memory with no thread affinity; only accessed through raw pointers.
unsafe impl Send for AlignedAlloc {}
// SAFETY: `AlignedAlloc` itself never reads or writes the memory.
unsafe impl Sync for AlignedAlloc {}

impl Drop for AlignedAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `DmaBuf::new` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A small registered buffer that owns its memory: control messages, tests, tools.
///
/// The device may write it at any time a work request naming it is outstanding, so it never
/// hands out references to its bytes; [`DmaBuf::read_at`] and [`DmaBuf::write_at`] copy.
/// The data path uses the registered buffer pool instead.
pub struct DmaBuf<V: Verbs = RealVerbs> {
    /// Shared only to keep the memory alive (a memory window bound to it holds a clone);
    /// `DmaBuf` stays the only CPU accessor.
    mr: Arc<V::Mr>,
    mem: DeviceMemory,
}

impl<V: Verbs> DmaBuf<V> {
    const ALIGN: usize = 4096;

    /// Allocates `len` zeroed bytes (page aligned) and registers them on `pd`.
    pub fn new(pd: &Arc<V::Pd>, len: usize, access: AccessFlags) -> Result<Self> {
        if len == 0 {
            return Err(RdmaError::InvalidArgument("empty DMA buffer"));
        }
        let layout = Layout::from_size_align(len, Self::ALIGN)
            .map_err(|_| RdmaError::InvalidArgument("DMA buffer too large"))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        let owner = Arc::new(AlignedAlloc { ptr, layout });
        // SAFETY: the allocation is `len` valid bytes, freed only when `owner` (held by the
        // memory and its registration) drops. Nothing else knows the pointer: `DmaBuf` only
        // copies in and out through raw pointers, so no Rust reference aliases the device's
        // accesses.
        let mem = unsafe { DeviceMemory::new(ptr.as_ptr(), len, owner)? };
        let mr = V::register(pd, mem.clone(), access)?;
        Ok(Self {
            mr: Arc::new(mr),
            mem,
        })
    }

    pub fn mr(&self) -> &Arc<V::Mr> {
        &self.mr
    }

    pub fn len(&self) -> usize {
        self.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// Scatter entry covering `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        self.mr.sge(offset, len)
    }

    /// Copies `data` into the buffer at `offset`. Panics when out of bounds.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        // `&mut self` excludes concurrent CPU access.
        assert!(self.mem.copy_in(offset, data), "DmaBuf write out of bounds");
    }

    /// Copies `out.len()` bytes at `offset` out of the buffer. Panics when out of bounds.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(self.mem.copy_out(offset, out), "DmaBuf read out of bounds");
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&mut self, byte: u8) {
        let chunk = [byte; 256];
        let mut off = 0;
        while off < self.len() {
            let n = chunk.len().min(self.len() - off);
            self.mem.copy_in(off, &chunk[..n]);
            off += n;
        }
    }
}

impl<V: Verbs> fmt::Debug for DmaBuf<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf").field("mem", &self.mem).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_compose() {
        let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        assert_eq!(a, AccessFlags::ALL_DATA);
        assert!(a.contains(AccessFlags::REMOTE_READ));
        assert!(!a.contains(AccessFlags::REMOTE_ATOMIC));
        assert_eq!(a.0 & AccessFlags::OPTIONAL_RANGE, 0);
        assert_ne!(
            AccessFlags::RELAXED_ORDERING.0 & AccessFlags::OPTIONAL_RANGE,
            0
        );
    }
}

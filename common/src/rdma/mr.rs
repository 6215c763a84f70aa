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
pub fn register_pool(
    pd: &Arc<ProtectionDomain>,
    pool: &crate::buffer::BufferPool,
    access: AccessFlags,
) -> Result<()> {
    let (addr, len) = pool.region();
    // SAFETY: the region is the pool's mapping. The registration is stored inside the pool
    // (below), whose shared state drops it before the mapping, so the memory outlives it;
    // the `owner` here is only a placeholder because an `Arc` of the pool would be a cycle.
    // The pool lends each buffer to exactly one `IoBuf` at a time, which is the sharing
    // discipline the contract asks for.
    let mr = unsafe { MemoryRegion::register_raw(pd, addr, len, access, Arc::new(()))? };
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
pub struct DmaBuf {
    /// Shared only to keep the memory alive (a memory window bound to it holds a clone);
    /// `DmaBuf` stays the only CPU accessor.
    mr: Arc<MemoryRegion>,
}

impl DmaBuf {
    const ALIGN: usize = 4096;

    /// Allocates `len` zeroed bytes (page aligned) and registers them on `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: AccessFlags) -> Result<Self> {
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
        // region) drops. Nothing else knows the pointer: `DmaBuf` only copies in and out
        // through raw pointers, so no Rust reference aliases the device's accesses.
        let mr = unsafe { MemoryRegion::register_raw(pd, ptr.as_ptr(), len, access, owner)? };
        Ok(Self { mr: Arc::new(mr) })
    }

    pub fn mr(&self) -> &Arc<MemoryRegion> {
        &self.mr
    }

    pub fn len(&self) -> usize {
        self.mr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// Scatter entry covering `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        self.mr.sge(offset, len)
    }

    /// Copies `data` into the buffer at `offset`. Panics when out of bounds.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        assert!(
            self.mr.contains(offset, data.len()),
            "DmaBuf write out of bounds"
        );
        // SAFETY: in bounds (checked); `&mut self` excludes concurrent CPU access, and the
        // source is a distinct Rust slice, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.mr.addr().add(offset), data.len())
        };
    }

    /// Copies `out.len()` bytes at `offset` out of the buffer. Panics when out of bounds.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(
            self.mr.contains(offset, out.len()),
            "DmaBuf read out of bounds"
        );
        // SAFETY: in bounds (checked); CPU writers need `&mut self`, so none runs now; the
        // destination is a distinct Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(self.mr.addr().add(offset), out.as_mut_ptr(), out.len())
        };
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: the allocation is `len` bytes; `&mut self` excludes other CPU access.
        unsafe { std::ptr::write_bytes(self.mr.addr(), byte, self.mr.len()) };
    }
}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf").field("mr", &self.mr).finish()
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

//! Data buffer pools: one memory region split into fixed-size buffers, handed out as owned
//! [`IoBuf`] handles.
//!
//! Ownership is the safety argument: a buffer index is in the free list or inside exactly one
//! `IoBuf`, never both, so no two handles alias. Posting to a QP or submitting to a bdev moves the
//! `IoBuf` into the operation, and the completion gives it back; dropping the handle returns the
//! buffer to the pool. The free list is a lock-free stack (`free_stack`): taking and returning a
//! buffer neither locks nor allocates, and the buffer given back last is taken first.
//!
//! The region comes from an anonymous mapping, huge pages when the system has them (fewer TLB
//! misses, fewer MR translation entries), ordinary pages otherwise. The RDMA layer registers the
//! whole region once and stores the keys here, so every buffer carries a valid `lkey`.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use memmap2::{MmapMut, MmapOptions};

use crate::free_stack::FreeStack;

/// Buffers start on page boundaries so O_DIRECT backends can use them as they are.
pub const BUFFER_ALIGN: usize = 4096;

const HUGE_PAGE_SHIFT: u8 = 21;

#[derive(Debug, thiserror::Error)]
pub enum BufferPoolError {
    #[error("buffer size {0} must be a non-zero multiple of {BUFFER_ALIGN}")]
    BadBufferSize(usize),
    #[error("buffer count must be non-zero")]
    Empty,
    #[error("mapping {bytes} bytes for a buffer pool failed: {source}")]
    Map {
        bytes: usize,
        source: std::io::Error,
    },
}

struct PoolShared {
    base: NonNull<u8>,
    buf_size: usize,
    count: u32,
    free: FreeStack,
    lkey: AtomicU32,
    rkey: AtomicU32,
    /// Keeps the memory registration (owned by the RDMA layer) alive as long as any buffer.
    registration: OnceLock<Box<dyn Any + Send + Sync>>,
    huge_pages: bool,
    /// Per buffer: how many bytes from its start are known to be zero (see
    /// [`IoBuf::zero_fill`]). Every way to write a buffer (`as_mut_slice`, `addr`) resets it
    /// first; only `zero_fill` sets it. Relaxed: a buffer moves between threads only through
    /// the free list, whose operations order everything done to it before.
    zeroed: Box<[AtomicU32]>,
    /// The registration lets peers write the pool (remote write or memory windows): what a
    /// buffer holds can change without any call here, so nothing is known to be zero.
    remote_writable: AtomicBool,
    // Declared last: dropped after the registration that refers to it.
    _map: MmapMut,
}

// SAFETY: `base` points into `_map`, which lives as long as this struct. The pointer itself is
// shared read-only; byte access goes only through `IoBuf`, and the free list hands each index to
// one `IoBuf` at a time, so no two threads ever touch the same buffer.
#[allow(unsafe_code)]
unsafe impl Send for PoolShared {}
// SAFETY: as for Send: all shared state is atomics or the lock-free stack.
#[allow(unsafe_code)]
unsafe impl Sync for PoolShared {}

/// A pool of `count` buffers of `buf_size` bytes each. Cloning shares the pool.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<PoolShared>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("buf_size", &self.shared.buf_size)
            .field("count", &self.shared.count)
            .field("available", &self.available())
            .field("huge_pages", &self.shared.huge_pages)
            .finish()
    }
}

impl BufferPool {
    pub fn new(buf_size: usize, count: u32) -> Result<Self, BufferPoolError> {
        if buf_size == 0 || !buf_size.is_multiple_of(BUFFER_ALIGN) {
            return Err(BufferPoolError::BadBufferSize(buf_size));
        }
        if count == 0 {
            return Err(BufferPoolError::Empty);
        }
        let bytes = buf_size * count as usize;
        let (mut map, huge_pages) = map_region(bytes)?;
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns null");
        let free = FreeStack::full(count);
        Ok(Self {
            shared: Arc::new(PoolShared {
                base,
                buf_size,
                count,
                free,
                lkey: AtomicU32::new(0),
                rkey: AtomicU32::new(0),
                registration: OnceLock::new(),
                huge_pages,
                // A fresh anonymous mapping is zero-filled by the kernel: every buffer starts
                // known zero, so the first null read of each does not write it either.
                zeroed: (0..count)
                    .map(|_| AtomicU32::new(buf_size.min(u32::MAX as usize) as u32))
                    .collect(),
                remote_writable: AtomicBool::new(false),
                _map: map,
            }),
        })
    }

    /// Takes a free buffer, with its length set to the full buffer size. `None` when all are
    /// in use: callers queue and retry when one comes back, they never fail the I/O.
    pub fn get(&self) -> Option<IoBuf> {
        let index = self.shared.free.pop()?;
        Some(IoBuf {
            shared: Arc::clone(&self.shared),
            index,
            len: self.shared.buf_size,
        })
    }

    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    pub fn count(&self) -> u32 {
        self.shared.count
    }

    /// Free buffers: exact while no thread takes or gives back one (leak checks, statistics),
    /// a snapshot otherwise. Walks the free list; [`has_available`](Self::has_available) is
    /// the cheap question.
    pub fn available(&self) -> usize {
        self.shared.free.len()
    }

    /// Whether a buffer is free now (one load).
    pub fn has_available(&self) -> bool {
        self.shared.free.has_free()
    }

    pub fn uses_huge_pages(&self) -> bool {
        self.shared.huge_pages
    }

    /// Start address and length of the whole region, for memory registration.
    pub fn region(&self) -> (*mut u8, usize) {
        (
            self.shared.base.as_ptr(),
            self.shared.buf_size * self.shared.count as usize,
        )
    }

    /// Records the region's registration: the keys every buffer reports, and the object (a
    /// memory region handle) that must stay alive while any buffer may be in flight. A pool is
    /// registered once; a second call is refused and returns the registration back.
    #[allow(clippy::result_large_err)]
    pub fn set_registration(
        &self,
        lkey: u32,
        rkey: u32,
        keepalive: Box<dyn Any + Send + Sync>,
    ) -> Result<(), Box<dyn Any + Send + Sync>> {
        self.shared.registration.set(keepalive)?;
        self.shared.lkey.store(lkey, Ordering::Release);
        self.shared.rkey.store(rkey, Ordering::Release);
        Ok(())
    }

    /// Says that the registration lets peers write into the pool (remote write access, or
    /// memory windows bound over it): [`IoBuf::zero_fill`] then always writes.
    pub fn set_remote_writable(&self) {
        self.shared.remote_writable.store(true, Ordering::Release);
    }

    pub fn is_registered(&self) -> bool {
        self.shared.registration.get().is_some()
    }
}

/// SPDK's iobuf `small_bufsize` default: commands up to this size (Identify, Connect data,
/// small I/O, in-capsule data) take a small buffer and never compete with large transfers.
pub const SMALL_BUFSIZE: usize = 8192;

/// Which of [`SizedPools`]' pools a transfer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufClass {
    Small,
    Large,
}

/// Data buffers in two size classes, as SPDK's iobuf: transfers up to the small pool's buffer
/// size take a small buffer, longer ones a large one, so many small commands cannot exhaust
/// the large pool (nor large ones the small pool). Cloning shares the pools.
#[derive(Debug, Clone)]
pub struct SizedPools {
    pub small: BufferPool,
    pub large: BufferPool,
}

impl SizedPools {
    pub fn new(
        small_size: usize,
        small_count: u32,
        large_size: usize,
        large_count: u32,
    ) -> Result<Self, BufferPoolError> {
        Ok(Self {
            small: BufferPool::new(small_size, small_count)?,
            large: BufferPool::new(large_size.max(small_size), large_count)?,
        })
    }

    pub fn class_of(&self, len: usize) -> BufClass {
        if len <= self.small.buf_size() {
            BufClass::Small
        } else {
            BufClass::Large
        }
    }

    pub fn pool(&self, class: BufClass) -> &BufferPool {
        match class {
            BufClass::Small => &self.small,
            BufClass::Large => &self.large,
        }
    }

    /// A buffer of `class`, or `None` when that pool is empty (queue and retry).
    pub fn get(&self, class: BufClass) -> Option<IoBuf> {
        self.pool(class).get()
    }
}

fn map_region(bytes: usize) -> Result<(MmapMut, bool), BufferPoolError> {
    let huge_len = bytes.next_multiple_of(1 << HUGE_PAGE_SHIFT);
    if let Ok(map) = MmapOptions::new()
        .len(huge_len)
        .huge(Some(HUGE_PAGE_SHIFT))
        .map_anon()
    {
        return Ok((map, true));
    }
    MmapOptions::new()
        .len(bytes)
        .map_anon()
        .map(|map| (map, false))
        .map_err(|source| BufferPoolError::Map { bytes, source })
}

/// One buffer of a pool, owned. `len` is the part in use (a transfer may be shorter than the
/// buffer); `capacity` is the buffer size.
pub struct IoBuf {
    shared: Arc<PoolShared>,
    index: u32,
    len: usize,
}

impl IoBuf {
    fn start(&self) -> *mut u8 {
        // In bounds: index < count, so the offset lies inside the mapping.
        self.shared
            .base
            .as_ptr()
            .wrapping_add(self.index as usize * self.shared.buf_size)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.shared.buf_size
    }

    /// Sets the length in use; clamped to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.shared.buf_size);
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range [start, start + len) lies inside the mapping (len <= buf_size), the
        // mapping outlives `self` through the Arc, and this handle is the only owner of the
        // buffer (see the module doc), so no mutable alias exists while `&self` is borrowed.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.start(), self.len)
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.forget_zeroes();
        // SAFETY: as in `as_slice`; `&mut self` makes this the only live reference.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.start(), self.len)
        }
    }

    /// Address of the buffer's first byte as the RDMA layer and the kernel see it. Whoever
    /// asks may have the buffer written (an RDMA READ or receive into it, a read from a
    /// file): the buffer is no longer known to be zero. For a device that only reads from
    /// the buffer, see [`source_addr`](Self::source_addr).
    pub fn addr(&self) -> u64 {
        self.forget_zeroes();
        self.start() as u64
    }

    /// The address for a device that only reads the buffer (the source of an RDMA WRITE or
    /// SEND): unlike [`addr`](Self::addr) it keeps what is known about zeroes.
    pub fn source_addr(&self) -> u64 {
        self.start() as u64
    }

    /// Makes the first `len` bytes zero, writing them only if they are not known to be zero
    /// already: a buffer a null read zeroed goes back to the pool and comes out for the next
    /// null read without a write (4 KiB of `memset` per read otherwise). Known zeroes are
    /// forgotten by every way to write the buffer, and never trusted in a pool peers may
    /// write.
    pub fn zero_fill(&mut self) {
        let len = self.len;
        let known = &self.shared.zeroed[self.index as usize];
        let trusted = !self.shared.remote_writable.load(Ordering::Acquire);
        if trusted && known.load(Ordering::Relaxed) as usize >= len {
            return;
        }
        self.as_mut_slice().fill(0);
        if trusted {
            self.shared.zeroed[self.index as usize].store(len as u32, Ordering::Relaxed);
        }
    }

    /// Bytes from the start known to be zero (for tests of the rules above).
    pub fn known_zeroes(&self) -> usize {
        if self.shared.remote_writable.load(Ordering::Acquire) {
            return 0;
        }
        self.shared.zeroed[self.index as usize].load(Ordering::Relaxed) as usize
    }

    fn forget_zeroes(&self) {
        let known = &self.shared.zeroed[self.index as usize];
        if known.load(Ordering::Relaxed) != 0 {
            known.store(0, Ordering::Relaxed);
        }
    }

    /// Local key of the pool's registration (0 when the pool is not registered).
    pub fn lkey(&self) -> u32 {
        self.shared.lkey.load(Ordering::Acquire)
    }

    /// Remote key of the pool's registration (0 when not registered or not remotely accessible).
    pub fn rkey(&self) -> u32 {
        self.shared.rkey.load(Ordering::Acquire)
    }

    /// What the pool's registration stored ([`BufferPool::set_registration`]'s `keepalive`;
    /// the RDMA layer stores an `Arc<MemoryRegion>`), for users that need the region itself.
    pub fn registration(&self) -> Option<&(dyn Any + Send + Sync)> {
        self.shared.registration.get().map(|b| &**b)
    }

    /// Index of this buffer in its pool: stable, usable as a slot number.
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        // This handle owned the index: it goes back once.
        self.shared.free.push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zeroed_buffer_is_not_written_again_until_something_may_have_written_it() {
        let pool = BufferPool::new(8192, 1).unwrap();
        let mut b = pool.get().unwrap();
        b.as_mut_slice().fill(0xEE);
        b.set_len(4096);
        b.zero_fill();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(b.known_zeroes(), 4096);
        drop(b);
        // Back from the pool: still known zero, for any length up to what was zeroed.
        let mut b = pool.get().unwrap();
        b.set_len(4096);
        assert_eq!(b.known_zeroes(), 4096);
        b.set_len(8192);
        b.zero_fill();
        assert_eq!(
            b.known_zeroes(),
            8192,
            "a longer fill writes and grows the known part"
        );
        // Every way to write the buffer forgets its zeroes, so the next fill writes.
        b.as_mut_slice()[100] = 7;
        assert_eq!(b.known_zeroes(), 0);
        b.zero_fill();
        assert!(b.iter().all(|&x| x == 0), "the stale byte is gone");
        let _ = b.addr();
        assert_eq!(
            b.known_zeroes(),
            0,
            "a device given the address may write it"
        );
        b.zero_fill();
        let _ = b.source_addr();
        let _ = b.as_slice();
        assert_eq!(b.known_zeroes(), 8192, "readers keep the knowledge");
    }

    #[test]
    fn a_fresh_pool_is_known_zero_and_its_first_fill_writes_nothing() {
        let pool = BufferPool::new(8192, 2).unwrap();
        let mut b = pool.get().unwrap();
        assert_eq!(b.known_zeroes(), 8192, "an anonymous mapping starts zeroed");
        assert!(b.iter().all(|&x| x == 0));
        b.zero_fill();
        assert_eq!(b.known_zeroes(), 8192);
        b.as_mut_slice()[0] = 1;
        drop(b);
        // Last given back, first taken.
        let b = pool.get().unwrap();
        assert_eq!(b.known_zeroes(), 0, "the written one is forgotten");
        let c = pool.get().unwrap();
        assert_eq!(c.known_zeroes(), 8192, "the other buffer, untouched");
    }

    #[test]
    fn a_pool_peers_may_write_never_trusts_its_zeroes() {
        let pool = BufferPool::new(4096, 1).unwrap();
        pool.set_remote_writable();
        let mut b = pool.get().unwrap();
        b.zero_fill();
        assert_eq!(b.known_zeroes(), 0);
    }

    #[test]
    fn buffers_are_distinct_aligned_and_return_on_drop() {
        let pool = BufferPool::new(8192, 4).unwrap();
        let mut bufs: Vec<IoBuf> = (0..4).map(|_| pool.get().unwrap()).collect();
        assert!(pool.get().is_none(), "pool of 4 must be exhausted");
        for (i, b) in bufs.iter_mut().enumerate() {
            assert_eq!(b.addr() as usize % BUFFER_ALIGN, 0);
            b.as_mut_slice().fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8), "buffers overlap");
        }
        bufs.pop();
        assert_eq!(pool.available(), 1);
        assert!(pool.get().is_some());
    }

    #[test]
    fn set_len_clamps_and_registration_is_once() {
        let pool = BufferPool::new(4096, 1).unwrap();
        let mut b = pool.get().unwrap();
        b.set_len(100);
        assert_eq!(b.len(), 100);
        b.set_len(1 << 20);
        assert_eq!(b.len(), 4096);
        assert_eq!(b.lkey(), 0);
        pool.set_registration(7, 9, Box::new(())).unwrap();
        assert!(pool.set_registration(1, 1, Box::new(())).is_err());
        assert_eq!((b.lkey(), b.rkey()), (7, 9));
    }

    #[test]
    fn sized_pools_pick_the_class_by_length() {
        let pools = SizedPools::new(SMALL_BUFSIZE, 2, 131_072, 1).unwrap();
        assert_eq!(pools.class_of(1024), BufClass::Small);
        assert_eq!(pools.class_of(SMALL_BUFSIZE), BufClass::Small);
        assert_eq!(pools.class_of(SMALL_BUFSIZE + 1), BufClass::Large);
        let _a = pools.get(BufClass::Small).unwrap();
        let _b = pools.get(BufClass::Small).unwrap();
        assert!(pools.get(BufClass::Small).is_none());
        assert_eq!(pools.get(BufClass::Large).unwrap().capacity(), 131_072);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(matches!(
            BufferPool::new(1000, 1),
            Err(BufferPoolError::BadBufferSize(1000))
        ));
        assert!(matches!(
            BufferPool::new(4096, 0),
            Err(BufferPoolError::Empty)
        ));
    }
}

//! fio's I/O memory, allocated by the engine (fio's `iomem_alloc` hook) so that `io_u`
//! buffers are registered pool buffers and commands can send them without a copy (see the
//! parent module's doc).

use nvmf_common::buffer::{BufferPool, IoBuf, BUFFER_ALIGN};

use super::EngineThread;
use crate::error::{EngineError, Result};
use crate::split;

/// fio's I/O memory, allocated here (see the module doc).
pub(super) struct IoMem {
    pub(super) pool: BufferPool,
    pub(super) base: usize,
    pub(super) buf_size: usize,
    /// The pool's buffers by index; `None` while one is in flight.
    pub(super) bufs: Vec<Option<IoBuf>>,
    /// Whether fio's io_u buffers are made of whole pool buffers.
    pub(super) zero_copy_layout: bool,
    /// The connection whose controller the pool is registered with.
    pub(super) registered: Option<usize>,
}

impl IoMem {
    /// Zero copy for `len` bytes of fio's buffer at `addr`, in `bs`-byte blocks, with
    /// commands of at most `limit` bytes: the pool buffer it starts at and the part size.
    /// It must start on a pool buffer, and either fit one (one command, if within `limit`)
    /// or be split into whole buffers (which must be whole blocks within `limit`); and
    /// every buffer it covers must be free.
    pub(super) fn zero_copy(
        &self,
        addr: usize,
        len: u64,
        bs: u64,
        limit: u64,
    ) -> Option<(usize, u64)> {
        if !self.zero_copy_layout || addr < self.base || len == 0 {
            return None;
        }
        let off = addr - self.base;
        if !off.is_multiple_of(self.buf_size) {
            return None;
        }
        let size = self.buf_size as u64;
        let part = if len <= size { len } else { size };
        if part > limit || (len > size && !size.is_multiple_of(bs)) {
            return None;
        }
        let first = off / self.buf_size;
        let n = usize::try_from(len.div_ceil(part)).ok()?;
        let bufs = self.bufs.get(first..first.checked_add(n)?)?;
        bufs.iter().all(Option::is_some).then_some((first, part))
    }
}

impl EngineThread {
    /// fio's iomem_alloc: allocates `total` bytes of I/O memory for `units` io_u buffers of
    /// `max_bs` each (fio adds slack for alignment). Returns the base address.
    pub fn iomem_alloc(
        &mut self,
        total: usize,
        max_bs: u64,
        units: u32,
        mem_align: u32,
    ) -> Result<*mut u8> {
        let max_bs = usize::try_from(max_bs).unwrap_or(0);
        let units = units as usize;
        // fio puts io_u i at the (page-aligned) base + i * max_bs; the slack it adds at the
        // end becomes spare pool buffers.
        let layout = max_bs > 0
            && max_bs.is_multiple_of(BUFFER_ALIGN)
            && mem_align == 0
            && max_bs.checked_mul(units).is_some_and(|n| n <= total);
        // Buffers no larger than one command of the probed controllers (a divisor of
        // max_bs, so each io_u is whole buffers); unknown limits: one buffer per io_u.
        let chunk = match self.probed_limit {
            Some(limit) if layout && !self.opts.force_copy => {
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                let align = BUFFER_ALIGN.max(self.probed_block as usize);
                split::chunk_size(max_bs, limit, align).unwrap_or(max_bs)
            }
            _ => max_bs,
        };
        if layout && chunk < max_bs && !self.opts.force_copy {
            tracing::info!(
                "I/O memory in buffers of {chunk} bytes: an I/O of up to {max_bs} bytes is up to {} commands, zero copy",
                max_bs / chunk
            );
        }
        let (buf_size, count) = if layout {
            (chunk, total.div_ceil(chunk))
        } else {
            (total.max(1).next_multiple_of(BUFFER_ALIGN), 1)
        };
        let count = u32::try_from(count).map_err(|_| EngineError::invalid("too many I/O units"))?;
        let pool = BufferPool::new(buf_size, count)
            .map_err(|e| EngineError::new(libc::ENOMEM, format!("I/O memory: {e}")))?;
        let mut bufs: Vec<Option<IoBuf>> = (0..count).map(|_| None).collect();
        while let Some(b) = pool.get() {
            let i = b.index() as usize;
            bufs[i] = Some(b);
        }
        let (base, _) = pool.region();
        self.iomem = Some(IoMem {
            base: base as usize,
            buf_size,
            bufs,
            zero_copy_layout: layout && !self.opts.force_copy,
            registered: None,
            pool,
        });
        Ok(base)
    }

    /// fio's iomem_free. Buffers still in flight keep the memory mapped until they complete.
    pub fn iomem_free(&mut self) {
        self.iomem = None;
    }

    /// Whether I/O on `handle` uses fio's buffers directly.
    pub fn is_zero_copy(&self, handle: u32) -> bool {
        let Some(Some(f)) = self.files.get(handle as usize) else {
            return false;
        };
        self.iomem
            .as_ref()
            .is_some_and(|m| m.zero_copy_layout && m.registered == Some(f.conn))
    }
}

#[cfg(test)]
mod tests {
    use super::super::EngineOptions;
    use super::*;

    #[test]
    fn iomem_layout_matches_fio() {
        let mut t = EngineThread::new(EngineOptions::default());
        t.init(4, 8192).unwrap();
        // fio 3.33: max_bs * iodepth + page_mask (FIO_RAWIO), + page_mask again (FIO_MEMALIGN).
        let total = 8192 * 4 + 2 * 4095;
        let base = t.iomem_alloc(total, 8192, 4, 0).unwrap() as usize;
        assert_eq!(base % 4096, 0);
        let m = t.iomem.as_ref().unwrap();
        assert!(m.zero_copy_layout);
        assert_eq!(m.buf_size, 8192, "no probed limit: one buffer per io_u");
        assert!(m.buf_size * m.bufs.len() >= total);
        let big = 1 << 20;
        for i in 0..4 {
            assert_eq!(
                m.zero_copy(base + i * 8192, 8192, 512, big),
                Some((i, 8192))
            );
            assert_eq!(
                m.zero_copy(base + i * 8192, 4096, 512, big),
                Some((i, 4096)),
                "shorter transfers too"
            );
        }
        assert_eq!(
            m.zero_copy(base + 4096, 4096, 512, big),
            None,
            "not a buffer start"
        );
        assert_eq!(m.zero_copy(base - 8192, 8192, 512, big), None);
        assert_eq!(
            m.zero_copy(base, 8192, 512, 4096),
            None,
            "a buffer above the limit is copied"
        );
        // Odd block sizes or mem_align: plain memory, copied.
        let base = t.iomem_alloc(4 * 4096 + 2 * 4095, 4096, 4, 0).unwrap() as usize;
        let m = t.iomem.as_ref().unwrap();
        assert!(m.zero_copy_layout, "4 KiB blocks");
        assert!(m.buf_size * m.bufs.len() >= 4 * 4096 + 2 * 4095);
        assert_eq!(
            m.zero_copy(base + 3 * 4096, 4096, 4096, big),
            Some((3, 4096))
        );
        t.iomem_alloc(3 * 6000 + 4095, 6000, 3, 0).unwrap();
        assert!(!t.iomem.as_ref().unwrap().zero_copy_layout);
        t.iomem_alloc(total + 512, 8192, 4, 512).unwrap();
        assert!(!t.iomem.as_ref().unwrap().zero_copy_layout);
        t.iomem_free();
        assert!(t.iomem.is_none());
    }

    #[test]
    fn iomem_is_cut_to_the_probed_maximum_transfer() {
        let mut t = EngineThread::new(EngineOptions::default());
        t.note_limit(256 << 10, 512);
        t.note_limit(128 << 10, 4096);
        t.note_limit(1 << 20, 512);
        assert_eq!(t.probed_limit, Some(128 << 10), "the smallest limit wins");
        assert_eq!(t.probed_block, 4096);
        let mb = 1 << 20;
        t.init(4, mb as u64).unwrap();
        let total = mb * 4 + 2 * 4095;
        let base = t.iomem_alloc(total, mb as u64, 4, 0).unwrap() as usize;
        let m = t.iomem.as_ref().unwrap();
        assert!(m.zero_copy_layout);
        assert_eq!(m.buf_size, 128 << 10, "one command per buffer");
        let limit = 128 << 10;
        for i in 0..4 {
            // io_u i starts at buffer 8 i and spans 8 of them: 8 commands of 128 KiB.
            assert_eq!(
                m.zero_copy(base + i * mb, mb as u64, 4096, limit),
                Some((8 * i, limit))
            );
            assert_eq!(
                m.zero_copy(base + i * mb, 4096, 4096, limit),
                Some((8 * i, 4096)),
                "a small I/O is one command"
            );
        }
        assert_eq!(
            m.zero_copy(base + 3 * mb, 2 * mb as u64, 4096, limit),
            None,
            "past the end of the memory"
        );
        assert_eq!(
            m.zero_copy(base, mb as u64, 4096, 64 << 10),
            None,
            "buffers above a smaller controller's limit: copied"
        );
        assert_eq!(
            m.zero_copy(base, mb as u64, 256 << 10, limit),
            None,
            "buffers that are not whole blocks: copied"
        );
        // nvmf_copy=1 keeps one buffer per io_u (it is not used for I/O).
        let mut t = EngineThread::new(EngineOptions {
            force_copy: true,
            ..EngineOptions::default()
        });
        t.note_limit(128 << 10, 4096);
        t.init(4, mb as u64).unwrap();
        t.iomem_alloc(total, mb as u64, 4, 0).unwrap();
        let m = t.iomem.as_ref().unwrap();
        assert!(!m.zero_copy_layout);
    }
}

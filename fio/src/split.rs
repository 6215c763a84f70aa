//! Cutting one fio I/O into commands the controller takes.
//!
//! A Read or Write carries at most the controller's maximum transfer (MDTS,
//! `IoQpair::max_transfer`) and at most [`MAX_NLB`] blocks. An `io_u` longer than that goes
//! out as several commands ("parts") of `part` bytes each, the last one possibly shorter,
//! every one a whole number of blocks; the `io_u` completes when all its parts have, with the
//! first error any part reported.
//!
//! Everything here is plain arithmetic, so the engine's I/O path only calls it.

/// Largest block count of one Read or Write (NLB is a zero-based 16-bit field).
pub const MAX_NLB: u64 = 0x1_0000;

/// The largest part one command may carry: at most `max_transfer` bytes and [`MAX_NLB`]
/// blocks, a whole number of blocks of `block_size`. `None` when not even one block fits.
pub fn part_limit(max_transfer: u64, block_size: u64) -> Option<u64> {
    if block_size == 0 {
        return None;
    }
    let blocks = (max_transfer / block_size).min(MAX_NLB);
    (blocks > 0).then_some(blocks * block_size)
}

/// How an I/O of `len` bytes is cut: parts of `part` bytes (the last one shorter when `len`
/// is not a multiple of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    len: u64,
    part: u64,
}

impl Split {
    /// `len` bytes in parts of at most `part`. `None` for an empty I/O, a zero part size, or
    /// more parts than a `u32` counts.
    pub fn new(len: u64, part: u64) -> Option<Self> {
        if len == 0 || part == 0 {
            return None;
        }
        let part = part.min(len);
        u32::try_from(len.div_ceil(part)).ok()?;
        Some(Self { len, part })
    }

    /// The whole I/O as one command.
    pub fn whole(len: u64) -> Self {
        Self {
            len,
            part: len.max(1),
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size of every part but possibly the last.
    pub fn part_size(&self) -> u64 {
        self.part
    }

    /// How many commands (at least 1).
    pub fn count(&self) -> u32 {
        // `new` checked that this fits.
        self.len.div_ceil(self.part).max(1) as u32
    }

    /// Part `i` (< `count()`): its byte offset inside the I/O and its length.
    pub fn part(&self, i: u32) -> (u64, u64) {
        let off = u64::from(i) * self.part;
        (off, self.part.min(self.len.saturating_sub(off)))
    }
}

/// The buffer size of fio's I/O memory when the engine allocates it for zero copy: the
/// largest multiple of `align` that divides `max_bs` and is at most `limit`. fio puts `io_u`
/// *i* at `base + i * max_bs`, so with such buffers every `io_u` starts on a buffer and each
/// part of a split `io_u` is exactly one buffer. `None` when `max_bs` is not a multiple of
/// `align` or `limit` is below it.
pub fn chunk_size(max_bs: usize, limit: usize, align: usize) -> Option<usize> {
    if max_bs == 0 || align == 0 || !max_bs.is_multiple_of(align) || limit < align {
        return None;
    }
    let units = max_bs / align;
    let most = (limit / align).min(units);
    (1..=most)
        .rev()
        .find(|d| units.is_multiple_of(*d))
        .map(|d| d * align)
}

/// Bounce buffers for I/O of up to `max_bs` bytes with commands of at most `max_transfer`
/// bytes: the buffer size (a multiple of `align`, at most one command unless that is below
/// `align`) and how many parts an I/O of `max_bs` takes at most.
pub fn bounce_layout(max_bs: usize, max_transfer: usize, align: usize) -> (usize, usize) {
    let whole = max_bs.max(1).next_multiple_of(align);
    let command = (max_transfer / align * align).max(align);
    let size = whole.min(command);
    (size, max_bs.max(1).div_ceil(size))
}

/// The qpair tag of part `part` of the I/O in slot `slot`.
pub fn tag(slot: u32, part: u32) -> u64 {
    (u64::from(part) << 32) | u64::from(slot)
}

/// `(slot, part)` back from a [`tag`].
pub fn untag(tag: u64) -> (u32, u32) {
    (tag as u32, (tag >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    /// Every part of `s`, checked to tile the I/O exactly.
    fn parts(s: Split) -> Vec<(u64, u64)> {
        let v: Vec<_> = (0..s.count()).map(|i| s.part(i)).collect();
        let mut next = 0;
        for &(off, len) in &v {
            assert_eq!(off, next, "parts are contiguous");
            assert!(len > 0 && len <= s.part_size());
            next += len;
        }
        assert_eq!(next, s.len(), "parts cover the I/O");
        v
    }

    #[test]
    fn one_megabyte_at_128k_is_eight_commands() {
        let limit = part_limit(128 * K, 4096).unwrap();
        assert_eq!(limit, 128 * K);
        let s = Split::new(1024 * K, limit).unwrap();
        assert_eq!(s.count(), 8);
        assert_eq!(s.part(0), (0, 128 * K));
        assert_eq!(s.part(7), (896 * K, 128 * K));
        assert_eq!(parts(s).len(), 8);
    }

    #[test]
    fn the_last_part_takes_the_rest() {
        let s = Split::new(100 * K, 64 * K).unwrap();
        assert_eq!(parts(s), [(0, 64 * K), (64 * K, 36 * K)]);
        // 512-byte blocks: 4 KiB + 3 blocks at a 4 KiB limit.
        let s = Split::new(4096 + 1536, part_limit(4096, 512).unwrap()).unwrap();
        assert_eq!(parts(s), [(0, 4096), (4096, 1536)]);
    }

    #[test]
    fn small_io_is_one_command() {
        for len in [512, 4096, 128 * K] {
            let s = Split::new(len, 128 * K).unwrap();
            assert_eq!(s.count(), 1);
            assert_eq!(s.part(0), (0, len));
        }
        assert_eq!(Split::whole(8 * K).count(), 1);
        assert_eq!(Split::whole(8 * K).part(0), (0, 8 * K));
    }

    #[test]
    fn parts_are_whole_blocks_within_every_limit() {
        for bs in [512u64, 4096, 8192] {
            for max_transfer in [4096u64, 6000, 8192, 12_288, 131_072, 1 << 20, (1 << 24) - 1] {
                let Some(limit) = part_limit(max_transfer, bs) else {
                    assert!(max_transfer < bs);
                    continue;
                };
                assert!(limit <= max_transfer, "{limit} > {max_transfer}");
                assert!(
                    limit.is_multiple_of(bs),
                    "{limit} not whole {bs}-byte blocks"
                );
                assert!(limit / bs <= MAX_NLB);
                for blocks in [1u64, 7, 255, 256, 257, 1000] {
                    let len = blocks * bs;
                    let s = Split::new(len, limit).unwrap();
                    assert_eq!(u64::from(s.count()), len.div_ceil(limit));
                    for (off, l) in parts(s) {
                        assert!(off.is_multiple_of(bs) && l.is_multiple_of(bs));
                        assert!(l <= max_transfer);
                    }
                }
            }
        }
    }

    #[test]
    fn limit_rounds_down_to_blocks_and_caps_nlb() {
        assert_eq!(part_limit(6000, 4096), Some(4096));
        assert_eq!(part_limit(6000, 512), Some(5632));
        assert_eq!(part_limit(2048, 4096), None, "not one block");
        assert_eq!(part_limit(4096, 0), None);
        // 65536 blocks of 512 bytes is 32 MiB: the NLB field, not MDTS, limits.
        assert_eq!(part_limit(u64::MAX, 512), Some(MAX_NLB * 512));
        assert_eq!(part_limit(1 << 30, 4096), Some(MAX_NLB * 4096));
    }

    #[test]
    fn bad_splits_are_refused() {
        assert_eq!(Split::new(0, 4096), None);
        assert_eq!(Split::new(4096, 0), None);
        assert_eq!(Split::new(u64::MAX, 1), None, "more parts than u32");
    }

    #[test]
    fn chunks_divide_the_block_size_and_fit_the_limit() {
        const A: usize = 4096;
        // At or below the limit: one buffer per io_u, as without splitting.
        assert_eq!(chunk_size(128 << 10, 128 << 10, A), Some(128 << 10));
        assert_eq!(chunk_size(64 << 10, 1 << 20, A), Some(64 << 10));
        // Above: the largest divisor that fits.
        assert_eq!(chunk_size(1 << 20, 128 << 10, A), Some(128 << 10));
        assert_eq!(chunk_size(1 << 20, 100 << 10, A), Some(64 << 10));
        assert_eq!(
            chunk_size(12 << 10, 8 << 10, A),
            Some(4 << 10),
            "8 KiB does not divide 12"
        );
        assert_eq!(chunk_size(384 << 10, 128 << 10, A), Some(128 << 10));
        assert_eq!(chunk_size(6000, 1 << 20, A), None, "not page sized");
        assert_eq!(chunk_size(1 << 20, 2048, A), None, "limit below a page");
        for max_bs in (1..=64).map(|n| n * A) {
            for limit in [A, 3 * A, 8 * A, 32 * A] {
                let c = chunk_size(max_bs, limit, A).unwrap();
                assert!(c <= limit && max_bs.is_multiple_of(c) && c.is_multiple_of(A));
            }
        }
    }

    #[test]
    fn bounce_buffers_hold_one_command() {
        const A: usize = 4096;
        assert_eq!(bounce_layout(4096, 128 << 10, A), (4096, 1));
        assert_eq!(
            bounce_layout(6000, 128 << 10, A),
            (8192, 1),
            "rounded up to pages"
        );
        assert_eq!(bounce_layout(128 << 10, 128 << 10, A), (128 << 10, 1));
        assert_eq!(bounce_layout(1 << 20, 128 << 10, A), (128 << 10, 8));
        assert_eq!(bounce_layout(1 << 20, 100_000, A), (98_304, 11));
        assert_eq!(bounce_layout(4 << 20, 1 << 20, A), (1 << 20, 4));
        assert_eq!(bounce_layout(1 << 20, (1 << 24) - 1, A), (1 << 20, 1));
        for max_bs in [512, 4096, 70_000, 1 << 20, 3 << 20] {
            for max_transfer in [4096, 8192, 131_072, 1 << 20] {
                let (size, parts) = bounce_layout(max_bs, max_transfer, A);
                assert!(size <= max_transfer && size.is_multiple_of(A));
                assert!(size * parts >= max_bs, "an I/O of max_bs fits its parts");
                // The engine's copy parts (whole blocks within the buffer) fit as well.
                let part = part_limit(size as u64, 512).unwrap();
                assert_eq!(
                    Split::new(max_bs as u64, part).unwrap().count() as usize,
                    parts
                );
            }
        }
    }

    #[test]
    fn tags_round_trip() {
        for (slot, part) in [(0, 0), (5, 0), (0, 7), (u32::MAX, u32::MAX), (31, 255)] {
            assert_eq!(untag(tag(slot, part)), (slot, part));
        }
        assert_eq!(tag(3, 0), 3, "part 0 is the bare slot");
    }
}

//! Test helpers shared by the backends' tests: drive a channel to completion and run the
//! contract every backend keeps (data round trip, zeroing, range checks, no panics).

use std::time::{Duration, Instant};

use nvmf_common::buffer::{BufferPool, IoBuf};

use super::{Bdev, BdevChannel, BdevCompletion, BdevIo, IoKind};

/// Generous bound for a test I/O to finish; only guards against a hang, never timed.
const HANG: Duration = Duration::from_secs(20);

pub fn io(
    tag: u64,
    kind: IoKind,
    offset_blocks: u64,
    num_blocks: u64,
    buf: Option<IoBuf>,
) -> BdevIo {
    BdevIo {
        tag,
        kind,
        offset_blocks,
        num_blocks,
        buf,
        fua: false,
    }
}

/// A pool whose buffers hold `blocks` blocks of `block_size` (rounded up to the pool's page).
pub fn pool(block_size: u32, blocks: u64) -> BufferPool {
    let bytes = (u64::from(block_size) * blocks)
        .max(4096)
        .next_multiple_of(4096);
    BufferPool::new(bytes as usize, 8).unwrap()
}

pub fn buf(pool: &BufferPool, len: usize) -> IoBuf {
    let mut b = pool.get().expect("test pool exhausted");
    b.set_len(len);
    b
}

/// Submits (retrying while the channel hands the I/O back) and polls until it completes.
pub fn run(ch: &mut dyn BdevChannel, mut io: BdevIo) -> BdevCompletion {
    let tag = io.tag;
    let start = Instant::now();
    loop {
        match ch.submit(io) {
            Ok(()) => break,
            Err(back) => {
                io = back;
                ch.poll(&mut |c| panic!("unexpected completion {c:?}"));
                assert!(start.elapsed() < HANG, "channel never accepted the I/O");
                std::thread::yield_now();
            }
        }
    }
    wait(ch, tag)
}

/// Polls until the completion tagged `tag` arrives; any other completion is a test failure.
pub fn wait(ch: &mut dyn BdevChannel, tag: u64) -> BdevCompletion {
    let start = Instant::now();
    let mut got = None;
    while got.is_none() {
        ch.poll(&mut |c| {
            assert_eq!(c.tag, tag, "completion for an I/O not waited for");
            got = Some(c);
        });
        assert!(start.elapsed() < HANG, "I/O {tag} never completed");
        if got.is_none() {
            std::thread::yield_now();
        }
    }
    got.unwrap()
}

/// Polls until `n` completions arrived, returning them in arrival order.
pub fn wait_n(ch: &mut dyn BdevChannel, n: usize) -> Vec<BdevCompletion> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        ch.poll(&mut |c| got.push(c));
        assert!(
            start.elapsed() < HANG,
            "only {} of {n} I/Os completed",
            got.len()
        );
        std::thread::yield_now();
    }
    got
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8 | 1)
        .collect()
}

pub fn write(ch: &mut dyn BdevChannel, pool: &BufferPool, bs: u32, off: u64, n: u64, seed: u64) {
    let data = pattern(seed, (u64::from(bs) * n) as usize);
    let mut b = buf(pool, data.len());
    b.copy_from_slice(&data);
    let c = run(ch, io(seed, IoKind::Write, off, n, Some(b)));
    assert_eq!(c.result, Ok(()), "write at {off}");
    assert_eq!(c.kind, IoKind::Write);
    assert_eq!(
        &c.buf.expect("write buffer returned")[..],
        &data[..],
        "write buffer altered"
    );
}

pub fn read(ch: &mut dyn BdevChannel, pool: &BufferPool, bs: u32, off: u64, n: u64) -> Vec<u8> {
    let mut b = buf(pool, (u64::from(bs) * n) as usize);
    b.fill(0xEE);
    let c = run(ch, io(7777, IoKind::Read, off, n, Some(b)));
    assert_eq!(c.result, Ok(()), "read at {off}");
    c.buf.expect("read buffer returned").to_vec()
}

pub fn expect_pattern(
    ch: &mut dyn BdevChannel,
    pool: &BufferPool,
    bs: u32,
    off: u64,
    n: u64,
    seed: u64,
) {
    let got = read(ch, pool, bs, off, n);
    assert!(
        got == pattern(seed, got.len()),
        "read back differs from the pattern written"
    );
}

pub fn expect_zeroes(ch: &mut dyn BdevChannel, pool: &BufferPool, bs: u32, off: u64, n: u64) {
    let got = read(ch, pool, bs, off, n);
    assert!(
        got.iter().all(|&b| b == 0),
        "range at {off} does not read back as zeroes"
    );
}

/// The contract every backend that stores data keeps, through one channel: a pattern reads
/// back, Flush succeeds, WriteZeroes and Unmap read back as zeroes (and leave their neighbours
/// alone), bad ranges and lengths complete with EINVAL. Needs at least 16 blocks.
pub fn data_contract(bdev: &dyn Bdev) {
    let bs = bdev.block_size();
    let blocks = bdev.num_blocks();
    assert!(blocks >= 16);
    let pool = pool(bs, 4);
    let mut ch = bdev.open_channel().unwrap();
    let ch = ch.as_mut();

    write(ch, &pool, bs, 0, 4, 1);
    write(ch, &pool, bs, blocks - 4, 4, 2);
    expect_pattern(ch, &pool, bs, 0, 4, 1);
    expect_pattern(ch, &pool, bs, blocks - 4, 4, 2);

    let c = run(ch, io(1, IoKind::Flush, 0, blocks, None));
    assert_eq!(c.result, Ok(()), "flush");

    // Zero the middle two blocks of the first four, then unmap the middle of the last four.
    let c = run(ch, io(2, IoKind::WriteZeroes, 1, 2, None));
    assert_eq!(c.result, Ok(()), "write zeroes");
    expect_zeroes(ch, &pool, bs, 1, 2);
    let first = read(ch, &pool, bs, 0, 1);
    assert!(
        first == pattern(1, bs as usize),
        "write zeroes touched the block before"
    );
    let c = run(ch, io(3, IoKind::Unmap, blocks - 3, 2, None));
    assert_eq!(c.result, Ok(()), "unmap");
    expect_zeroes(ch, &pool, bs, blocks - 3, 2);
    let last = read(ch, &pool, bs, blocks - 1, 1);
    assert!(
        last == pattern(2, 4 * bs as usize)[3 * bs as usize..],
        "unmap touched the block after"
    );

    range_contract(bdev, ch, &pool);
    assert_eq!(ch.in_flight(), 0);
}

/// Out-of-range and wrong-length I/O complete with EINVAL, never panic.
pub fn range_contract(bdev: &dyn Bdev, ch: &mut dyn BdevChannel, pool: &BufferPool) {
    let bs = bdev.block_size();
    let blocks = bdev.num_blocks();
    let bad: [(IoKind, u64, u64, Option<usize>); 9] = [
        (IoKind::Read, blocks, 1, Some(bs as usize)),
        (IoKind::Write, blocks - 1, 2, Some(2 * bs as usize)),
        (IoKind::Read, u64::MAX, 1, Some(bs as usize)),
        (IoKind::Write, u64::MAX - 1, 2, Some(2 * bs as usize)),
        (IoKind::Read, 0, u64::MAX, Some(bs as usize)),
        (IoKind::Read, 0, 2, Some(bs as usize)),
        (IoKind::Write, 0, 1, Some(2 * bs as usize)),
        (IoKind::WriteZeroes, u64::MAX, 1, None),
        (IoKind::Unmap, blocks - 1, 2, None),
    ];
    for (i, (kind, off, n, len)) in bad.into_iter().enumerate() {
        let b = len.map(|l| buf(pool, l));
        let c = run(ch, io(100 + i as u64, kind, off, n, b));
        assert_eq!(
            c.result,
            Err(libc::EINVAL),
            "case {i}: {kind:?} at {off}+{n}"
        );
        assert_eq!(c.kind, kind);
        assert_eq!(c.buf.is_some(), len.is_some(), "buffer handed back");
    }
}

/// Fills the channel until it hands an I/O back, then checks that polling lets the same I/O in
/// and that everything completes. Returns false if the channel never refused one (within
/// `limit` submissions), for backends whose depth is larger than the test wants to fill.
pub fn resubmit_after_full(bdev: &dyn Bdev, limit: usize) -> bool {
    let mut ch = bdev.open_channel().unwrap();
    let ch = ch.as_mut();
    let mut submitted = 0usize;
    let mut refused = None;
    for tag in 0..limit as u64 {
        match ch.submit(io(tag, IoKind::Flush, 0, 0, None)) {
            Ok(()) => submitted += 1,
            Err(back) => {
                refused = Some(back);
                break;
            }
        }
    }
    let Some(back) = refused else {
        wait_n(ch, submitted);
        return false;
    };
    assert_eq!(
        back.tag, submitted as u64,
        "the refused I/O is handed back intact"
    );
    assert_eq!(ch.in_flight(), submitted);
    let mut done = wait_n(ch, submitted);
    ch.submit(back).expect("room after poll");
    done.extend(wait_n(ch, 1));
    assert_eq!(done.len(), submitted + 1);
    assert!(done.iter().all(|c| c.result == Ok(())));
    assert_eq!(ch.in_flight(), 0);
    true
}

/// The full-channel contract of the kernel-backed engines: with `depth` reads in flight the
/// next I/O is handed back unstarted, every in-flight one completes, the refused one is
/// accepted afterwards, and dropping the channel with an I/O still in the kernel waits for it
/// and returns every buffer to the pool. `bdev` must hold at least 16 blocks of 4 KiB.
pub fn full_channel_hands_io_back_and_drop_waits(bdev: &dyn crate::bdev::Bdev, depth: usize) {
    let pool = BufferPool::new(4096, depth as u32 + 1).unwrap();
    let mut ch = bdev.open_channel().unwrap();
    for tag in 0..depth as u64 {
        ch.submit(io(
            tag,
            IoKind::Read,
            tag % 16,
            1,
            Some(pool.get().unwrap()),
        ))
        .unwrap();
    }
    let back = ch
        .submit(io(999, IoKind::Read, 0, 1, Some(pool.get().unwrap())))
        .expect_err("channel is full");
    assert_eq!(back.tag, 999);
    assert_eq!(ch.in_flight(), depth);
    let done = wait_n(ch.as_mut(), depth);
    assert!(done.iter().all(|c| c.result == Ok(())));
    ch.submit(back).unwrap();
    // Dropped with an I/O in the kernel: waits, then the buffers go back to the pool.
    ch.poll(&mut |_| {});
    drop(done);
    drop(ch);
    assert_eq!(pool.available(), depth + 1);
}

/// What a file channel's zeroing accounting shows a test: slots zeroing, zeroings waiting
/// for one, free slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroingView {
    pub zeroing: usize,
    pub waiting: usize,
    pub free: usize,
}

/// The bounded-zeroing contract of a file channel with `depth` slots of which at most `max`
/// may zero: `max + 8` zeroings (some with FUA) of 4 blocks each on `file` (of 4 KiB
/// blocks, filled with 0xAB, with 4 blocks to spare) leave `depth - max` slots to a read,
/// which gets one at once; all complete, the count stays within `max` throughout and ends
/// at 0, and exactly the zeroed ranges are zero.
pub fn zeroing_holds_a_bounded_share<C: BdevChannel>(
    ch: &mut C,
    file: &str,
    depth: usize,
    max: usize,
    view: impl Fn(&C) -> ZeroingView,
) {
    let zeroings = max as u64 + 8;
    for i in 0..zeroings {
        let kind = if i % 2 == 0 {
            IoKind::Unmap
        } else {
            IoKind::WriteZeroes
        };
        // Some with FUA: their final sync is still part of the zeroing.
        let mut z = io(i, kind, i * 4, 4, None);
        z.fua = i % 3 == 0;
        ch.submit(z).unwrap();
    }
    let want = |zeroing, waiting, free| ZeroingView {
        zeroing,
        waiting,
        free,
    };
    assert_eq!(view(ch), want(max, 8, depth - max));
    let pool = pool(4096, 1);
    let read = io(1000, IoKind::Read, zeroings * 4, 1, Some(buf(&pool, 4096)));
    ch.submit(read).unwrap();
    assert_eq!(
        view(ch).free,
        depth - max - 1,
        "the read got a slot at once"
    );
    let mut seen = 0;
    let start = Instant::now();
    while seen < zeroings + 1 {
        ch.poll(&mut |c| {
            assert_eq!(c.result, Ok(()), "I/O {}", c.tag);
            seen += 1;
        });
        assert!(view(ch).zeroing <= max);
        assert!(start.elapsed() < HANG, "{seen} done");
    }
    assert_eq!(view(ch), want(0, 0, depth));
    assert_eq!(ch.in_flight(), 0);
    let data = std::fs::read(file).unwrap();
    let zeroed = (zeroings * 4 * 4096) as usize;
    assert!(data[..zeroed].iter().all(|&b| b == 0));
    assert!(data[zeroed..].iter().all(|&b| b == 0xAB));
}

/// A file of `blocks` 4 KiB blocks of 0xAB, for [`zeroing_holds_a_bounded_share`] with at
/// most `max` zeroing slots.
pub fn zeroing_file(name: &str, max: usize) -> super::file::TempFile {
    let blocks = (max as u64 + 8) * 4 + 4;
    let f = super::file::TempFile::new(name, blocks * 4096);
    std::fs::write(f.path(), vec![0xABu8; (blocks * 4096) as usize]).unwrap();
    f
}

/// A registry holding `Malloc0`: 64 blocks of 512 bytes, the base the stacking tests use.
pub fn registry_with_malloc0() -> super::BdevRegistry {
    let mut reg = super::BdevRegistry::new();
    reg.register(std::sync::Arc::new(
        super::MallocBdev::new("Malloc0", 64, 512, None).unwrap(),
    ))
    .unwrap();
    reg
}

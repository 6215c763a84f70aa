//! RAM bdev ("Malloc disk"): the device lives in an anonymous mapping shared by every channel.
//!
//! Channels on different reactors read and write the same memory at the same time, as hosts may
//! do to any disk. The storage is therefore only ever accessed as `[AtomicU64]` with relaxed
//! loads and stores: racing I/O to one range gives some interleaving of 8-byte words (as a real
//! disk gives some interleaving of sectors), never undefined behaviour. The copy happens in
//! `submit`; the completion waits in a preallocated queue for the next `poll`.
//!
//! Write Zeroes and deallocation are the exception: a channel zeroes at most
//! [`ZEROING_SLICE`] bytes between two `poll`s. What does not fit waits and is done a slice
//! per `poll`, oldest first, so a host zeroing a 16 GiB disk (in one range or in 256) does not
//! hold its reactor, and every other host on it, for seconds; reads and writes go on between
//! the slices. Zeroing stores only over words that are not zero already, so deallocating a
//! disk that was never written maps no memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::json;

use super::util::{self, delete_typed, reject_metadata, CompletionQueue, CHANNEL_DEPTH};
use super::{
    check_range, Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, BdevRegistry, IoKind,
    Submitted,
};

/// The shared memory of one malloc bdev.
struct Storage {
    /// A raw mapping: its pointer comes with no `&[u8]` or `&mut [u8]` over the disk (which
    /// would forbid the atomic stores other reactors make), and is used only through
    /// `words`, so every access is atomic.
    map: MmapRaw,
    words: usize,
}

impl Storage {
    fn new(bytes: usize) -> Result<Self, BdevError> {
        let map = MmapOptions::new()
            .len(bytes)
            .map_anon()
            .map_err(|source| BdevError::Io {
                what: format!("mapping {bytes} bytes for a malloc bdev"),
                source,
            })?;
        Ok(Self {
            map: MmapRaw::from(map),
            words: bytes / 8,
        })
    }

    fn words(&self) -> &[AtomicU64] {
        let ptr = self.map.as_mut_ptr().cast::<AtomicU64>();
        // SAFETY: the mapping is page-aligned (so 8-byte aligned) and `words * 8` bytes long,
        // and lives as long as `self`. Anonymous mappings start zeroed, a valid `AtomicU64`.
        // The pointer is the mapping's own (`MmapRaw` makes no reference to the bytes), so it
        // carries write permission, and no `&[u8]` or `&mut [u8]` over the mapping exists.
        // `AtomicU64` permits shared mutation, so channels on several threads may hold this
        // slice at once: all their accesses are atomic, hence data-race free.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(ptr, self.words)
        }
    }
}

pub struct MallocBdev {
    name: String,
    uuid: [u8; 16],
    block_size: u32,
    num_blocks: u64,
    physical_block_size: u32,
    optimal_io_boundary: u32,
    storage: Arc<Storage>,
}

impl MallocBdev {
    /// A zero-filled RAM disk. `uuid` None draws a random one. The block size must be a
    /// non-zero multiple of 512 (as in SPDK), the size non-zero and addressable.
    pub fn new(
        name: impl Into<String>,
        num_blocks: u64,
        block_size: u32,
        uuid: Option<[u8; 16]>,
    ) -> Result<Self, BdevError> {
        if block_size == 0 || !block_size.is_multiple_of(512) {
            return Err(BdevError::InvalidParams(format!(
                "Data block size {block_size} is not a multiple of 512"
            )));
        }
        if num_blocks == 0 {
            return Err(BdevError::InvalidParams(
                "Disk num_blocks must be greater than 0".into(),
            ));
        }
        let bytes = num_blocks
            .checked_mul(u64::from(block_size))
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                BdevError::InvalidParams(format!(
                    "{num_blocks} blocks of {block_size} bytes do not fit in memory"
                ))
            })?;
        Ok(Self {
            name: name.into(),
            uuid: uuid.unwrap_or_else(util::random_uuid),
            block_size,
            num_blocks,
            physical_block_size: block_size,
            optimal_io_boundary: 0,
            storage: Arc::new(Storage::new(bytes)?),
        })
    }

    pub fn physical_block_size(&self) -> u32 {
        self.physical_block_size
    }

    pub fn optimal_io_boundary(&self) -> u32 {
        self.optimal_io_boundary
    }
}

impl Bdev for MallocBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn product_name(&self) -> &'static str {
        "Malloc disk"
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    fn uuid(&self) -> [u8; 16] {
        self.uuid
    }
    fn supports(&self, _kind: IoKind) -> bool {
        true
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(MallocChannel {
            storage: Arc::clone(&self.storage),
            block_size: self.block_size,
            num_blocks: self.num_blocks,
            done: CompletionQueue::new(CHANNEL_DEPTH),
            zeroing: VecDeque::with_capacity(CHANNEL_DEPTH),
            budget: SLICE_WORDS,
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        json!({
            "method": "bdev_malloc_create",
            "params": {
                "name": self.name,
                "num_blocks": self.num_blocks,
                "block_size": self.block_size,
                "physical_block_size": self.physical_block_size,
                "uuid": util::format_uuid(&self.uuid),
                "optimal_io_boundary": self.optimal_io_boundary,
            }
        })
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Bytes a channel zeroes between two polls.
pub const ZEROING_SLICE: u64 = 1 << 20;
const SLICE_WORDS: usize = (ZEROING_SLICE / 8) as usize;

/// A Write Zeroes or deallocation waiting for, or part way through, its slices.
struct Zeroing {
    io: BdevIo,
    /// Words still to clear.
    next: usize,
    end: usize,
}

struct MallocChannel {
    storage: Arc<Storage>,
    block_size: u32,
    num_blocks: u64,
    done: CompletionQueue,
    /// Zeroings that did not fit in the budget, oldest first.
    zeroing: VecDeque<Zeroing>,
    /// Words this channel may still zero before its next poll.
    budget: usize,
}

/// Clears `words`, storing only over those not zero already (a load maps no page).
fn clear(words: &[AtomicU64]) {
    for word in words {
        if word.load(Ordering::Relaxed) != 0 {
            word.store(0, Ordering::Relaxed);
        }
    }
}

impl MallocChannel {
    /// The words of `io`'s range, checked against the device.
    fn range(&self, io: &BdevIo) -> Result<(usize, usize), i32> {
        check_range(self.num_blocks, io, self.block_size)?;
        // In range, so these products fit: the storage of `num_blocks` blocks was mapped.
        let start = (io.offset_blocks * u64::from(self.block_size) / 8) as usize;
        let len = (io.num_blocks * u64::from(self.block_size) / 8) as usize;
        Ok((start, start + len))
    }

    /// A zeroing that cannot be done now: others wait before it, or it is larger than
    /// what the channel may still zero before its next poll.
    fn must_wait(&self, io: &BdevIo) -> bool {
        if !matches!(io.kind, IoKind::WriteZeroes | IoKind::Unmap) {
            return false;
        }
        let words = io.num_blocks.saturating_mul(u64::from(self.block_size)) / 8;
        !self.zeroing.is_empty() || words > self.budget as u64
    }

    /// Room for one more I/O: every one in `zeroing` or `done` completes through `done`.
    fn has_room(&self) -> bool {
        self.done.len() + self.zeroing.len() < CHANNEL_DEPTH
    }

    /// Queues a zeroing (or completes it at once if its range is bad).
    fn queue_zeroing(&mut self, io: BdevIo) {
        match self.range(&io) {
            Ok((next, end)) => self.zeroing.push_back(Zeroing { io, next, end }),
            Err(e) => self.done.complete(io, Err(e)),
        }
    }

    /// A new poll's budget, spent on the waiting zeroings, oldest first; each completes
    /// when its last word is clear.
    fn advance_zeroing(&mut self) {
        self.budget = SLICE_WORDS;
        while let Some(z) = self.zeroing.front_mut() {
            let until = z.end.min(z.next + self.budget);
            clear(&self.storage.words()[z.next..until]);
            self.budget -= until - z.next;
            z.next = until;
            if until < z.end {
                return;
            }
            let z = self.zeroing.pop_front().expect("the front");
            self.done.complete(z.io, Ok(()));
        }
    }

    fn execute(&mut self, io: &mut BdevIo) -> super::IoResult {
        let (start, end) = self.range(io)?;
        let words = &self.storage.words()[start..end];
        match io.kind {
            IoKind::Read => {
                let buf = io.buf.as_mut().ok_or(libc::EINVAL)?;
                for (chunk, word) in buf.chunks_exact_mut(8).zip(words) {
                    chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
                }
            }
            IoKind::Write => {
                let buf = io.buf.as_ref().ok_or(libc::EINVAL)?;
                for (chunk, word) in buf.chunks_exact(8).zip(words) {
                    let v = u64::from_ne_bytes(chunk.try_into().expect("chunks of 8"));
                    word.store(v, Ordering::Relaxed);
                }
            }
            IoKind::WriteZeroes | IoKind::Unmap => {
                // Within the budget (`must_wait` said so).
                clear(words);
                self.budget -= words.len();
            }
            // RAM has no cache to drain.
            IoKind::Flush => {}
        }
        Ok(())
    }
}

impl BdevChannel for MallocChannel {
    fn submit(&mut self, mut io: BdevIo) -> Result<(), BdevIo> {
        if !self.has_room() {
            return Err(io);
        }
        if self.must_wait(&io) {
            self.queue_zeroing(io);
            return Ok(());
        }
        let result = self.execute(&mut io);
        self.done.complete(io, result);
        Ok(())
    }

    fn submit_now(&mut self, mut io: BdevIo) -> Submitted {
        if self.must_wait(&io) {
            if !self.has_room() {
                return Submitted::Refused(io);
            }
            self.queue_zeroing(io);
            return Submitted::Started;
        }
        let result = self.execute(&mut io);
        Submitted::Done(util::completion(io, result))
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        self.advance_zeroing();
        self.done.drain(done)
    }

    fn in_flight(&self) -> usize {
        self.done.len() + self.zeroing.len()
    }
}

/// `bdev_malloc_create`. Metadata and protection information are refused, not ignored: this
/// target does not carry them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MallocCreateParams {
    #[serde(default)]
    pub name: Option<String>,
    pub num_blocks: u64,
    pub block_size: u32,
    #[serde(default)]
    pub physical_block_size: u32,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub optimal_io_boundary: u32,
    #[serde(default)]
    pub md_size: u32,
    #[serde(default)]
    pub md_interleave: bool,
    #[serde(default)]
    pub dif_type: i32,
    #[serde(default)]
    pub dif_is_head_of_md: bool,
    #[serde(default)]
    pub dif_pi_format: u32,
    /// SPDK's NUMA placement hint (-1: any); memory here comes from the calling thread's node.
    #[serde(default)]
    pub numa_id: Option<i32>,
}

pub fn rpc_bdev_malloc_create(
    bdevs: &mut BdevRegistry,
    params: MallocCreateParams,
) -> Result<serde_json::Value, RpcError> {
    reject_metadata(
        params.md_size,
        params.md_interleave,
        params.dif_type,
        params.dif_is_head_of_md,
        params.dif_pi_format,
    )?;
    let pbs = params.physical_block_size;
    if pbs != 0
        && (!pbs.is_power_of_two()
            || pbs < params.block_size
            || !pbs.is_multiple_of(params.block_size))
    {
        return Err(util::invalid(format!(
            "physical_block_size {pbs} must be a power of two multiple of block_size {}",
            params.block_size
        )));
    }
    let uuid = util::uuid_param(params.uuid.as_deref())?;
    let name = match params.name {
        Some(name) => name,
        None => bdevs.next_free_name("Malloc"),
    };
    if bdevs.contains(&name) {
        return Err(BdevError::Exists(name).into());
    }
    let mut bdev = MallocBdev::new(
        name.clone(),
        params.num_blocks,
        params.block_size,
        Some(uuid),
    )?;
    if pbs != 0 {
        bdev.physical_block_size = pbs;
    }
    bdev.optimal_io_boundary = params.optimal_io_boundary;
    bdevs.register(Arc::new(bdev))?;
    Ok(serde_json::Value::String(name))
}

/// `bdev_malloc_delete`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MallocDeleteParams {
    pub name: String,
}

pub fn rpc_bdev_malloc_delete(
    bdevs: &mut BdevRegistry,
    params: MallocDeleteParams,
) -> Result<serde_json::Value, RpcError> {
    delete_typed::<MallocBdev>(bdevs, &params.name)
}

#[cfg(test)]
mod tests {
    use super::super::testutil;
    use super::super::util::parse_params;
    use super::*;

    #[test]
    fn data_round_trip_zeroing_and_ranges() {
        let bdev = MallocBdev::new("m", 64, 512, None).unwrap();
        testutil::data_contract(&bdev);
        let bdev = MallocBdev::new("m4k", 16, 4096, None).unwrap();
        testutil::data_contract(&bdev);
    }

    /// A zeroing larger than a slice goes a slice per poll; reads and writes submitted
    /// meanwhile complete at once, and the range ends up zero.
    #[test]
    fn a_large_zeroing_goes_a_slice_per_poll_and_lets_io_through() {
        let blocks = 4 * ZEROING_SLICE / 512;
        let bdev = MallocBdev::new("m", 2 * blocks, 512, None).unwrap();
        let pool = testutil::pool(4096, 4);
        let mut ch = bdev.open_channel().unwrap();
        testutil::write(ch.as_mut(), &pool, 512, 0, 8, 7);
        testutil::write(ch.as_mut(), &pool, 512, blocks - 8, 8, 8);
        testutil::write(ch.as_mut(), &pool, 512, blocks, 8, 9);
        let zero = testutil::io(1, IoKind::Unmap, 0, blocks, None);
        assert!(matches!(ch.submit_now(zero), Submitted::Started));
        // Beyond the range: untouched, and served at once while the zeroing is under way.
        let buf = testutil::buf(&pool, 4096);
        let read = testutil::io(2, IoKind::Read, blocks, 8, Some(buf));
        let Submitted::Done(c) = ch.submit_now(read) else {
            panic!("a read waited behind the zeroing");
        };
        assert_eq!(c.result, Ok(()));
        assert_eq!(c.buf.unwrap().as_slice(), testutil::pattern(9, 4096));
        let mut finished = None;
        for polls in 1..=8 {
            ch.poll(&mut |c| {
                assert_eq!((c.tag, c.result), (1, Ok(())));
                finished = Some(polls);
            });
            if finished.is_some() {
                break;
            }
            assert_eq!(ch.in_flight(), 1);
        }
        assert_eq!(finished, Some(4), "a 4 MiB zeroing takes four 1 MiB slices");
        assert_eq!(ch.in_flight(), 0);
        testutil::expect_pattern(ch.as_mut(), &pool, 512, blocks, 8, 9);
        for at in [0, blocks - 8] {
            let buf = testutil::buf(&pool, 4096);
            let c = testutil::run(ch.as_mut(), testutil::io(2, IoKind::Read, at, 8, Some(buf)));
            assert_eq!(c.result, Ok(()));
            assert!(
                c.buf.unwrap().as_slice().iter().all(|&b| b == 0),
                "block {at}"
            );
        }
        // A bad range fails through poll like any other.
        let bad = testutil::io(3, IoKind::WriteZeroes, 2 * blocks - 1, blocks, None);
        assert!(matches!(ch.submit_now(bad), Submitted::Started));
        let mut results = Vec::new();
        ch.poll(&mut |c| results.push((c.tag, c.result)));
        assert_eq!(results, [(3, Err(libc::EINVAL))]);
    }

    #[test]
    fn channels_share_storage_across_threads() {
        let bdev: Arc<dyn Bdev> = Arc::new(MallocBdev::new("m", 64, 512, None).unwrap());
        let pool = testutil::pool(512, 4);
        let writer = {
            let bdev = Arc::clone(&bdev);
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut ch = bdev.open_channel().unwrap();
                testutil::write(ch.as_mut(), &pool, 512, 8, 4, 42);
            })
        };
        writer.join().unwrap();
        let mut ch = bdev.open_channel().unwrap();
        testutil::expect_pattern(ch.as_mut(), &pool, 512, 8, 4, 42);
    }

    #[test]
    fn completion_waits_for_poll_and_full_channel_hands_io_back() {
        let bdev = MallocBdev::new("m", 16, 512, None).unwrap();
        let mut ch = bdev.open_channel().unwrap();
        ch.submit(testutil::io(1, IoKind::Flush, 0, 1, None))
            .unwrap();
        assert_eq!(ch.in_flight(), 1, "completion must not be inline");
        assert!(testutil::resubmit_after_full(&bdev, CHANNEL_DEPTH + 10));
        let mut n = 0;
        ch.poll(&mut |c| {
            assert_eq!(c.tag, 1);
            n += 1
        });
        assert_eq!(n, 1);
    }

    #[test]
    fn constructor_rejects_bad_geometry() {
        assert!(MallocBdev::new("m", 0, 512, None).is_err());
        assert!(MallocBdev::new("m", 8, 520, None).is_err());
        assert!(MallocBdev::new("m", u64::MAX, 4096, None).is_err());
    }

    #[test]
    fn rpc_create_delete_and_errors() {
        let mut reg = BdevRegistry::new();
        let p: MallocCreateParams =
            parse_params(json!({"num_blocks": 32, "block_size": 512})).unwrap();
        assert_eq!(
            rpc_bdev_malloc_create(&mut reg, p.clone()).unwrap(),
            json!("Malloc0")
        );
        assert_eq!(
            rpc_bdev_malloc_create(&mut reg, p).unwrap(),
            json!("Malloc1")
        );

        let uuid = "0123abcd-4567-89ab-cdef-0123456789ab";
        let p: MallocCreateParams = parse_params(
            json!({"name": "M", "num_blocks": 32, "block_size": 4096, "uuid": uuid.to_uppercase()}),
        )
        .unwrap();
        assert_eq!(
            rpc_bdev_malloc_create(&mut reg, p.clone()).unwrap(),
            json!("M")
        );
        let m = reg.get("M").unwrap();
        assert_eq!(m.product_name(), "Malloc disk");
        assert_eq!(util::format_uuid(&m.uuid()), uuid);
        let entry = m.config_entry();
        assert_eq!(entry["method"], "bdev_malloc_create");
        assert_eq!(entry["params"]["uuid"], uuid);
        // The saved entry recreates an identical bdev.
        let again: MallocCreateParams = parse_params(entry["params"].clone()).unwrap();
        assert_eq!(again.num_blocks, 32);
        assert_eq!(again.block_size, 4096);

        // Duplicate name: EEXIST, registry unchanged.
        let err = rpc_bdev_malloc_create(&mut reg, p).unwrap_err();
        assert_eq!(err.code, -libc::EEXIST);
        assert_eq!(reg.len(), 3);

        // Missing and unknown fields, bad values.
        assert!(parse_params::<MallocCreateParams>(json!({"num_blocks": 8})).is_err());
        let err = parse_params::<MallocCreateParams>(
            json!({"num_blocks": 8, "block_size": 512, "bogus": 1}),
        )
        .unwrap_err();
        assert_eq!(err.code, RpcError::INVALID_PARAMS);
        assert!(err.message.contains("bogus"));
        for bad in [
            json!({"num_blocks": 8, "block_size": 512, "md_size": 8}),
            json!({"num_blocks": 8, "block_size": 512, "dif_type": 1}),
            json!({"num_blocks": 8, "block_size": 512, "md_interleave": true}),
            json!({"num_blocks": 8, "block_size": 512, "uuid": "nope"}),
            json!({"num_blocks": 0, "block_size": 512}),
            json!({"num_blocks": 8, "block_size": 100}),
            json!({"num_blocks": 8, "block_size": 4096, "physical_block_size": 512}),
        ] {
            let p: MallocCreateParams = parse_params(bad.clone()).unwrap();
            let err = rpc_bdev_malloc_create(&mut reg, p).unwrap_err();
            assert_eq!(err.code, -libc::EINVAL, "{bad}");
        }
        let p: MallocCreateParams =
            parse_params(json!({"num_blocks": 8, "block_size": 512, "md_size": 8})).unwrap();
        assert!(rpc_bdev_malloc_create(&mut reg, p)
            .unwrap_err()
            .message
            .contains("md_size"));
        assert_eq!(reg.len(), 3);

        // Claimed: delete fails, nothing changes; released: delete succeeds.
        let claimed = reg.claim("M", "nqn.test:ns1").unwrap();
        let del = |name: &str| MallocDeleteParams { name: name.into() };
        assert_eq!(
            rpc_bdev_malloc_delete(&mut reg, del("M")).unwrap_err().code,
            -libc::EBUSY
        );
        assert!(reg.contains("M"));
        drop(claimed);
        assert_eq!(
            rpc_bdev_malloc_delete(&mut reg, del("M")).unwrap(),
            json!(true)
        );
        assert_eq!(
            rpc_bdev_malloc_delete(&mut reg, del("M")).unwrap_err().code,
            -libc::ENODEV
        );
        assert!(parse_params::<MallocDeleteParams>(json!({})).is_err());
        assert!(parse_params::<MallocDeleteParams>(json!({"name": "a", "x": 1})).is_err());
    }
}

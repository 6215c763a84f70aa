//! io_uring bdev ("URING bdev"): a file or block device, one ring per channel (per reactor).
//!
//! `submit` pushes one SQE and returns; `poll` makes the single `io_uring_enter` that hands the
//! batch to the kernel, then reaps CQEs from the shared ring without a system call. When the
//! submission queue is full, `submit` enters the kernel once to make room, and hands the I/O back
//! if that does not help. Buffers stay in the channel's slots until their CQE is reaped; dropping
//! a channel waits for everything still in the kernel.
//!
//! Flush is `IORING_OP_FSYNC` with DATASYNC; a FUA write carries RWF_DSYNC. WriteZeroes is
//! `fallocate(ZERO_RANGE | KEEP_SIZE)` and Unmap `fallocate(PUNCH_HOLE | KEEP_SIZE)`; where the
//! file system refuses either, the channel switches to writing zeroes from a shared zero buffer.
//! Where io_uring itself is refused (ENOSYS, EPERM under seccomp or `io_uring_disabled`), the
//! bdev runs on the AIO engine instead and says so in the log.

use std::collections::VecDeque;
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};
use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::json;

use super::aio::{AioChannel, AioShared};
use super::file::BackingFile;
use super::util::{self, delete_typed, CompletionQueue};
use super::{
    check_range, Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, BdevRegistry, IoKind,
};

/// Submission queue entries and I/O slots per channel; the completion queue is twice as large,
/// so with one operation per slot it can never overflow.
pub const URING_DEPTH: usize = 256;

/// Slots that Write Zeroes and deallocation may hold at once (as AIO's
/// [`MAX_ZEROING_SLOTS`](super::aio::MAX_ZEROING_SLOTS)): a fallocate of a huge range, or
/// the zero writes where the file system refuses it, take long; reads and writes keep the
/// other slots.
const MAX_ZEROING_SLOTS: usize = URING_DEPTH / 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    IoUring,
    /// io_uring was refused by the kernel; native AIO instead.
    Aio,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Read, write or fsync.
    Single,
    /// fallocate; on EOPNOTSUPP the slot turns into `Zeroing`.
    Fallocate { punch: bool },
    /// Writing zeroes chunk by chunk, the current chunk ending at `at`, the range at `end`.
    Zeroing { at: u64, end: u64 },
}

#[derive(Debug)]
struct Slot {
    io: Option<BdevIo>,
    op: Op,
    /// Bytes the current operation must transfer (0 for fsync / fallocate).
    expect: u64,
    /// Byte offset of the range (for fallocate's fallback).
    offset: u64,
    len: u64,
    /// Counted in the channel's `zeroing` (a Write Zeroes or deallocation, through its
    /// fallocate, zero writes and final fdatasync alike).
    zeroing: bool,
}

pub(crate) struct UringChannel {
    shared: Arc<AioShared>,
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    reaped: Vec<(u32, i32)>,
    done: CompletionQueue,
    zero_range_refused: bool,
    punch_hole_refused: bool,
    /// Slots deallocating or writing zeroes now (at most [`MAX_ZEROING_SLOTS`]).
    zeroing: usize,
    /// Zeroings waiting for one of those, oldest first (not in front of reads and writes).
    zero_waiting: VecDeque<BdevIo>,
}

fn is_refused(err: i32) -> bool {
    // EINVAL: a kernel without IORING_OP_FALLOCATE, or a file system rejecting the mode.
    err == libc::EOPNOTSUPP || err == libc::EINVAL
}

impl UringChannel {
    pub fn new(shared: Arc<AioShared>) -> std::io::Result<Self> {
        let ring = IoUring::builder()
            .setup_cqsize(2 * URING_DEPTH as u32)
            .build(URING_DEPTH as u32)?;
        Ok(Self {
            shared,
            ring,
            slots: (0..URING_DEPTH)
                .map(|_| Slot {
                    io: None,
                    op: Op::Single,
                    expect: 0,
                    offset: 0,
                    len: 0,
                    zeroing: false,
                })
                .collect(),
            free: (0..URING_DEPTH as u32).rev().collect(),
            reaped: Vec::with_capacity(2 * URING_DEPTH),
            done: CompletionQueue::new(2 * URING_DEPTH),
            zero_range_refused: false,
            punch_hole_refused: false,
            zeroing: 0,
            zero_waiting: VecDeque::with_capacity(URING_DEPTH),
        })
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.shared.file.fd())
    }

    /// Queues one SQE, entering the kernel once if the queue is full. False: no room.
    fn push(&mut self, sqe: &squeue::Entry) -> bool {
        for attempt in 0..2 {
            // SAFETY: every SQE names either the buffer of an `IoBuf` held in `self.slots` until
            // its CQE is reaped, or the zero buffer kept alive by `self.shared`; the fd is kept
            // open by `self.shared`. Drop reaps every outstanding CQE before freeing either.
            #[allow(unsafe_code)]
            let pushed = unsafe { self.ring.submission().push(sqe) }.is_ok();
            if pushed {
                return true;
            }
            if attempt == 0 {
                let _ = self.ring.submit();
            }
        }
        false
    }

    fn zero_chunk_sqe(&self, s: u32, at: u64, end: u64) -> (squeue::Entry, u64) {
        let len = self
            .shared
            .zero
            .chunk(self.shared.file.block_size)
            .min(end - at);
        let sqe = opcode::Write::new(self.fd(), self.shared.zero.as_ptr(), len as u32)
            .offset(at)
            .build()
            .user_data(u64::from(s));
        (sqe, len)
    }

    /// Starts (or continues) the zeroing fallback of slot `s` at byte `at`. False: no room in
    /// the submission queue, which cannot happen while each slot has one entry at most.
    fn push_zero_chunk(&mut self, s: u32, at: u64, end: u64) -> bool {
        let (sqe, len) = self.zero_chunk_sqe(s, at, end);
        let slot = &mut self.slots[s as usize];
        slot.op = Op::Zeroing { at: at + len, end };
        slot.expect = len;
        self.push(&sqe)
    }

    fn finish(&mut self, s: u32, result: super::IoResult) {
        let slot = &mut self.slots[s as usize];
        let io = slot.io.take().expect("finished slot holds an I/O");
        if std::mem::take(&mut slot.zeroing) {
            self.zeroing -= 1;
        }
        self.free.push(s);
        self.done.complete(io, result);
    }

    /// Waiting zeroings take the zeroing slots free now (from `poll`, once the completions
    /// are handed over, so `done` has room).
    fn start_waiting_zeroing(&mut self) {
        while self.zeroing < MAX_ZEROING_SLOTS {
            let Some(io) = self.zero_waiting.pop_front() else {
                return;
            };
            if let Err(io) = self.submit(io) {
                self.zero_waiting.push_front(io);
                return;
            }
        }
    }

    fn on_cqe(&mut self, s: u32, res: i32) {
        let Some(slot) = self.slots.get(s as usize).filter(|sl| sl.io.is_some()) else {
            return;
        };
        let (op, expect, offset, len) = (slot.op, slot.expect, slot.offset, slot.len);
        if let Op::Fallocate { punch } = op {
            if res < 0 && is_refused(-res) {
                if punch {
                    self.punch_hole_refused = true;
                } else {
                    self.zero_range_refused = true;
                }
                tracing::info!(
                    path = self.shared.file.path,
                    op = if punch { "PUNCH_HOLE" } else { "ZERO_RANGE" },
                    "fallocate refused, writing zeroes instead"
                );
                if !self.push_zero_chunk(s, offset, offset + len) {
                    self.finish(s, Err(libc::EIO));
                }
                return;
            }
        }
        let result = if res < 0 {
            Err(-res)
        } else if res as u64 != expect {
            // Short transfer: the file shrank under us.
            Err(libc::EIO)
        } else {
            Ok(())
        };
        let durable = self.slots[s as usize].io.as_ref().is_some_and(|io| io.fua);
        match (op, result) {
            (Op::Zeroing { at, end }, Ok(())) if at < end => {
                if !self.push_zero_chunk(s, at, end) {
                    self.finish(s, Err(libc::EIO));
                }
            }
            // Zeroes or a hole with FUA: on stable media before the command completes, so
            // the fallocate (or the zero writes) is followed by an fdatasync of the file.
            (Op::Fallocate { .. } | Op::Zeroing { .. }, Ok(())) if durable => {
                let sqe = opcode::Fsync::new(self.fd())
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(u64::from(s));
                let slot = &mut self.slots[s as usize];
                slot.op = Op::Single;
                slot.expect = 0;
                if !self.push(&sqe) {
                    self.finish(s, Err(libc::EIO));
                }
            }
            (_, result) => self.finish(s, result),
        }
    }

    fn reap(&mut self) {
        self.reaped.clear();
        for cqe in self.ring.completion() {
            // At most one CQE per slot is outstanding, so this never grows past its capacity.
            self.reaped.push((cqe.user_data() as u32, cqe.result()));
        }
        for i in 0..self.reaped.len() {
            let (s, res) = self.reaped[i];
            self.on_cqe(s, res);
        }
    }
}

impl BdevChannel for UringChannel {
    fn submit(&mut self, mut io: BdevIo) -> Result<(), BdevIo> {
        let Some(&s) = self.free.last() else {
            return Err(io);
        };
        // `done` holds up to URING_DEPTH immediate completions plus one per slot.
        if self.done.len() >= URING_DEPTH {
            return Err(io);
        }
        let file = &self.shared.file;
        let bs = u64::from(file.block_size);
        if let Err(e) = check_range(file.num_blocks(), &io, file.block_size) {
            self.done.complete(io, Err(e));
            return Ok(());
        }
        let offset = io.offset_blocks * bs;
        let len = io.num_blocks * bs;
        let user_data = u64::from(s);
        let (sqe, op, expect) = match io.kind {
            IoKind::Read | IoKind::Write => {
                // The kernel writes through a read's pointer: take it from a unique borrow.
                let ptr = match io.kind {
                    IoKind::Read => io.buf.as_mut().map(|b| b.as_mut_ptr()),
                    _ => io.buf.as_ref().map(|b| b.as_ptr().cast_mut()),
                };
                let (Some(ptr), Ok(n)) = (ptr, u32::try_from(len)) else {
                    self.done.complete(io, Err(libc::EINVAL));
                    return Ok(());
                };
                let sqe = if io.kind == IoKind::Read {
                    // The IoBuf behind `ptr` stays in the slot, untouched, until the CQE.
                    opcode::Read::new(self.fd(), ptr, n).offset(offset).build()
                } else {
                    let flags = if io.fua { libc::RWF_DSYNC } else { 0 };
                    opcode::Write::new(self.fd(), ptr, n)
                        .offset(offset)
                        .rw_flags(flags)
                        .build()
                };
                (sqe, Op::Single, len)
            }
            IoKind::Flush => (
                opcode::Fsync::new(self.fd())
                    .flags(types::FsyncFlags::DATASYNC)
                    .build(),
                Op::Single,
                0,
            ),
            IoKind::WriteZeroes | IoKind::Unmap if len == 0 => {
                self.done.complete(io, Ok(()));
                return Ok(());
            }
            IoKind::WriteZeroes | IoKind::Unmap if self.zeroing >= MAX_ZEROING_SLOTS => {
                if self.zero_waiting.len() >= URING_DEPTH {
                    return Err(io);
                }
                self.zero_waiting.push_back(io);
                return Ok(());
            }
            IoKind::WriteZeroes | IoKind::Unmap => {
                let punch = io.kind == IoKind::Unmap;
                let refused = if punch {
                    self.punch_hole_refused
                } else {
                    self.zero_range_refused
                };
                if refused {
                    let (sqe, chunk) = self.zero_chunk_sqe(s, offset, offset + len);
                    (
                        sqe,
                        Op::Zeroing {
                            at: offset + chunk,
                            end: offset + len,
                        },
                        chunk,
                    )
                } else {
                    let mode = libc::FALLOC_FL_KEEP_SIZE
                        | if punch {
                            libc::FALLOC_FL_PUNCH_HOLE
                        } else {
                            libc::FALLOC_FL_ZERO_RANGE
                        };
                    let sqe = opcode::Fallocate::new(self.fd(), len)
                        .offset(offset)
                        .mode(mode)
                        .build();
                    (sqe, Op::Fallocate { punch }, 0)
                }
            }
        };
        if !self.push(&sqe.user_data(user_data)) {
            return Err(io);
        }
        let zeroing = !matches!(op, Op::Single);
        self.zeroing += usize::from(zeroing);
        self.free.pop();
        let slot = &mut self.slots[s as usize];
        *slot = Slot {
            io: Some(io),
            op,
            expect,
            offset,
            len,
            zeroing,
        };
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        if !self.ring.submission().is_empty() {
            // EAGAIN / EBUSY / EINTR: the entries stay queued and go in on the next poll.
            let _ = self.ring.submit();
        }
        self.reap();
        if !self.ring.submission().is_empty() {
            // Continuations of the zeroing fallback.
            let _ = self.ring.submit();
        }
        let n = self.done.drain(done);
        if !self.zero_waiting.is_empty() {
            self.start_waiting_zeroing();
        }
        n
    }

    fn in_flight(&self) -> usize {
        URING_DEPTH - self.free.len() + self.done.len() + self.zero_waiting.len()
    }
}

impl Drop for UringChannel {
    fn drop(&mut self) {
        // The kernel may still write into buffers this channel owns: wait for each operation.
        let mut outstanding = self.slots.iter().filter(|s| s.io.is_some()).count();
        while outstanding > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    // Cannot wait: leak the buffers rather than hand memory the kernel may still
                    // write back to the pool.
                    tracing::error!(error = %e, outstanding, "io_uring wait failed on channel drop");
                    for slot in &mut self.slots {
                        if let Some(io) = slot.io.take() {
                            std::mem::forget(io);
                        }
                    }
                    return;
                }
            }
            for cqe in self.ring.completion() {
                if let Some(slot) = self.slots.get_mut(cqe.user_data() as usize) {
                    if slot.io.take().is_some() {
                        outstanding -= 1;
                    }
                }
            }
        }
    }
}

pub struct UringBdev {
    name: String,
    uuid: [u8; 16],
    engine: Engine,
    shared: Arc<AioShared>,
}

impl UringBdev {
    /// Opens `filename` (O_DIRECT when possible). `block_size` None detects it.
    pub fn new(
        name: impl Into<String>,
        filename: &str,
        block_size: Option<u32>,
        uuid: Option<[u8; 16]>,
    ) -> Result<Self, BdevError> {
        let engine = match IoUring::new(4) {
            Ok(_) => Engine::IoUring,
            Err(e) => {
                tracing::warn!(error = %e, "io_uring refused by the kernel, falling back to AIO");
                Engine::Aio
            }
        };
        Self::with_engine(name, filename, block_size, uuid, engine)
    }

    pub(crate) fn with_engine(
        name: impl Into<String>,
        filename: &str,
        block_size: Option<u32>,
        uuid: Option<[u8; 16]>,
        engine: Engine,
    ) -> Result<Self, BdevError> {
        let file = BackingFile::open(filename, block_size, false)?;
        let name = name.into();
        tracing::info!(
            bdev = name,
            path = filename,
            direct = file.direct,
            ?engine,
            "uring bdev opened"
        );
        Ok(Self {
            name,
            uuid: uuid.unwrap_or_else(util::random_uuid),
            engine,
            shared: Arc::new(AioShared::new(file, engine == Engine::Aio)?),
        })
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    pub fn filename(&self) -> &str {
        &self.shared.file.path
    }

    pub fn is_direct(&self) -> bool {
        self.shared.file.direct
    }
}

impl Bdev for UringBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn product_name(&self) -> &'static str {
        "URING bdev"
    }
    fn block_size(&self) -> u32 {
        self.shared.file.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.shared.file.num_blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.uuid
    }
    fn supports(&self, _kind: IoKind) -> bool {
        true
    }
    fn has_write_cache(&self) -> bool {
        self.shared.file.write_cache && !self.shared.dsync_writes
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        if self.engine == Engine::IoUring {
            match UringChannel::new(Arc::clone(&self.shared)) {
                Ok(ch) => return Ok(Box::new(ch)),
                Err(e) => tracing::warn!(
                    bdev = self.name,
                    error = %e,
                    "io_uring setup failed for this channel, using AIO"
                ),
            }
        }
        Ok(Box::new(AioChannel::new(Arc::clone(&self.shared))?))
    }
    fn config_entry(&self) -> serde_json::Value {
        json!({
            "method": "bdev_uring_create",
            "params": {
                "name": self.name,
                "filename": self.shared.file.path,
                "block_size": self.shared.file.block_size,
                "uuid": util::format_uuid(&self.uuid),
            }
        })
    }
    fn driver_specific(&self) -> serde_json::Value {
        json!({
            "uring": {
                "filename": self.shared.file.path,
                "engine": match self.engine { Engine::IoUring => "io_uring", Engine::Aio => "aio" },
                "direct": self.shared.file.direct,
                "block_device": self.shared.file.is_block_device,
            }
        })
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `bdev_uring_create`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UringCreateParams {
    pub name: String,
    pub filename: String,
    #[serde(default)]
    pub block_size: u32,
    #[serde(default)]
    pub uuid: Option<String>,
}

pub fn rpc_bdev_uring_create(
    bdevs: &mut BdevRegistry,
    params: UringCreateParams,
) -> Result<serde_json::Value, RpcError> {
    let uuid = util::uuid_param(params.uuid.as_deref())?;
    if bdevs.contains(&params.name) {
        return Err(BdevError::Exists(params.name).into());
    }
    let block_size = (params.block_size != 0).then_some(params.block_size);
    let bdev = UringBdev::new(
        params.name.clone(),
        &params.filename,
        block_size,
        Some(uuid),
    )?;
    bdevs.register(Arc::new(bdev))?;
    Ok(serde_json::Value::String(params.name))
}

/// `bdev_uring_delete`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UringDeleteParams {
    pub name: String,
}

pub fn rpc_bdev_uring_delete(
    bdevs: &mut BdevRegistry,
    params: UringDeleteParams,
) -> Result<serde_json::Value, RpcError> {
    delete_typed::<UringBdev>(bdevs, &params.name)
}

/// `bdev_uring_rescan`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UringRescanParams {
    pub name: String,
}

/// As `bdev_aio_rescan` (see [`super::aio::rescan`]).
pub fn rpc_bdev_uring_rescan(
    bdevs: &mut BdevRegistry,
    params: UringRescanParams,
) -> Result<serde_json::Value, RpcError> {
    super::aio::rescan::<UringBdev>(bdevs, &params.name, |b| &b.shared)
}

#[cfg(test)]
mod tests {
    use super::super::file::TempFile;
    use super::super::testutil::{self, io};
    use super::super::util::parse_params;
    use super::*;

    fn bdev(f: &TempFile, bs: u32) -> UringBdev {
        let b = UringBdev::new("u", f.path(), Some(bs), None).unwrap();
        assert_eq!(b.product_name(), "URING bdev");
        b
    }

    #[test]
    fn data_round_trip_zeroing_and_ranges() {
        let f = TempFile::new("uring", 64 * 4096);
        let b = bdev(&f, 4096);
        assert_eq!(b.num_blocks(), 64);
        if IoUring::new(4).is_ok() {
            assert_eq!(b.engine(), Engine::IoUring);
        }
        assert!(
            b.has_write_cache(),
            "a file sits behind the page cache or a device cache"
        );
        testutil::data_contract(&b);
        let pool = testutil::pool(4096, 1);
        let mut ch = b.open_channel().unwrap();
        let mut w = io(1, IoKind::Write, 3, 1, Some(testutil::buf(&pool, 4096)));
        w.buf.as_mut().unwrap().fill(0x42);
        w.fua = true;
        assert_eq!(testutil::run(ch.as_mut(), w).result, Ok(()));
        let on_disk = std::fs::read(f.path()).unwrap();
        assert!(on_disk[3 * 4096..4 * 4096].iter().all(|&x| x == 0x42));
    }

    #[test]
    fn zeroes_and_holes_with_fua_are_synced_and_complete_once() {
        let f = TempFile::new("uring-fua", 64 * 4096);
        std::fs::write(f.path(), vec![0x5Au8; 64 * 4096]).unwrap();
        let b = bdev(&f, 4096);
        let mut ch = UringChannel::new(Arc::clone(&b.shared)).unwrap();
        for fallback in [false, true] {
            // Both paths: fallocate, and zero writes where the file system refuses it.
            ch.zero_range_refused = fallback;
            ch.punch_hole_refused = fallback;
            for (tag, kind, at) in [(1, IoKind::WriteZeroes, 2), (2, IoKind::Unmap, 10)] {
                let at = at + if fallback { 20 } else { 0 };
                let mut z = io(tag, kind, at, 3, None);
                z.fua = true;
                let c = testutil::run(&mut ch, z);
                assert_eq!((c.tag, c.result), (tag, Ok(())));
                let on_disk = std::fs::read(f.path()).unwrap();
                let range = at as usize * 4096..(at as usize + 3) * 4096;
                assert!(on_disk[range].iter().all(|&x| x == 0), "{kind:?} at {at}");
            }
        }
        assert_eq!(ch.in_flight(), 0, "the fdatasync step left nothing behind");
    }

    /// Zeroings past MAX_ZEROING_SLOTS wait in the channel without a slot (fallocate and
    /// the zero-write fallback alike); reads still get one; every range ends up zero.
    #[test]
    fn zeroing_holds_a_bounded_share_of_the_slots() {
        for fallback in [false, true] {
            let f = testutil::zeroing_file("uring-zslots", MAX_ZEROING_SLOTS);
            let b = bdev(&f, 4096);
            let mut ch = UringChannel::new(Arc::clone(&b.shared)).unwrap();
            ch.zero_range_refused = fallback;
            ch.punch_hole_refused = fallback;
            testutil::zeroing_holds_a_bounded_share(
                &mut ch,
                f.path(),
                URING_DEPTH,
                MAX_ZEROING_SLOTS,
                |ch| testutil::ZeroingView {
                    zeroing: ch.zeroing,
                    waiting: ch.zero_waiting.len(),
                    free: ch.free.len(),
                },
            );
        }
    }

    #[test]
    fn aio_engine_fallback_keeps_the_contract() {
        let f = TempFile::new("uring-aio", 32 * 4096);
        let b = UringBdev::with_engine("u", f.path(), Some(4096), None, Engine::Aio).unwrap();
        assert_eq!(b.engine(), Engine::Aio);
        assert_eq!(b.driver_specific()["uring"]["engine"], "aio");
        testutil::data_contract(&b);
    }

    #[test]
    fn zeroing_fallback_spans_chunks() {
        let blocks = 3 * 2048 + 8;
        let f = TempFile::new("uring-wz", blocks * 512);
        std::fs::write(f.path(), vec![0xABu8; (blocks * 512) as usize]).unwrap();
        let b = bdev(&f, 512);
        let mut ch = UringChannel::new(Arc::clone(&b.shared)).unwrap();
        // Force the fallback path as if the file system refused fallocate.
        ch.zero_range_refused = true;
        ch.punch_hole_refused = true;
        let c = testutil::run(&mut ch, io(1, IoKind::WriteZeroes, 4, 2048 + 1, None));
        assert_eq!(c.result, Ok(()));
        let c = testutil::run(
            &mut ch,
            io(2, IoKind::Unmap, 2048 + 5, blocks - 2048 - 9, None),
        );
        assert_eq!(c.result, Ok(()));
        let data = std::fs::read(f.path()).unwrap();
        let end = ((blocks - 4) * 512) as usize;
        assert!(data[..4 * 512].iter().all(|&x| x == 0xAB));
        assert!(data[4 * 512..end].iter().all(|&x| x == 0));
        assert!(data[end..].iter().all(|&x| x == 0xAB));
    }

    #[test]
    fn truncated_file_gives_error_completion() {
        let f = TempFile::new("uring-trunc", 16 * 4096);
        let b = bdev(&f, 4096);
        let pool = testutil::pool(4096, 1);
        let mut ch = b.open_channel().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(f.path())
            .unwrap()
            .set_len(4096)
            .unwrap();
        let c = testutil::run(
            ch.as_mut(),
            io(1, IoKind::Read, 8, 1, Some(testutil::buf(&pool, 4096))),
        );
        assert_eq!(c.result, Err(libc::EIO));
        drop(f);
        let c = testutil::run(
            ch.as_mut(),
            io(2, IoKind::Read, 15, 1, Some(testutil::buf(&pool, 4096))),
        );
        assert!(c.result.is_err());
    }

    #[test]
    fn full_channel_hands_io_back_and_drop_waits() {
        let f = TempFile::new("uring-full", 16 * 4096);
        let b = bdev(&f, 4096);
        testutil::full_channel_hands_io_back_and_drop_waits(&b, URING_DEPTH);
    }

    #[test]
    fn rpc_create_delete_and_errors() {
        let f = TempFile::new("uring-rpc", 32 * 4096);
        let mut reg = BdevRegistry::new();
        let p: UringCreateParams =
            parse_params(json!({"name": "u0", "filename": f.path()})).unwrap();
        assert_eq!(
            rpc_bdev_uring_create(&mut reg, p.clone()).unwrap(),
            json!("u0")
        );
        let u = reg.get("u0").unwrap();
        assert!(u.block_size() >= 512);
        let entry = u.config_entry();
        assert_eq!(entry["method"], "bdev_uring_create");
        parse_params::<UringCreateParams>(entry["params"].clone()).unwrap();
        assert_eq!(
            rpc_bdev_uring_create(&mut reg, p).unwrap_err().code,
            -libc::EEXIST
        );
        let p: UringCreateParams =
            parse_params(json!({"name": "u1", "filename": "/nonexistent/x"})).unwrap();
        assert_eq!(
            rpc_bdev_uring_create(&mut reg, p).unwrap_err().code,
            -libc::ENOENT
        );
        let p: UringCreateParams =
            parse_params(json!({"name": "u1", "filename": f.path(), "block_size": 520})).unwrap();
        assert_eq!(
            rpc_bdev_uring_create(&mut reg, p).unwrap_err().code,
            -libc::EINVAL
        );
        assert!(parse_params::<UringCreateParams>(json!({"filename": "x"})).is_err());
        assert!(parse_params::<UringCreateParams>(
            json!({"name": "x", "filename": "y", "readonly": true})
        )
        .is_err());
        assert_eq!(reg.len(), 1);

        let claimed = reg.claim("u0", "nqn:ns1").unwrap();
        let del = UringDeleteParams { name: "u0".into() };
        assert_eq!(
            rpc_bdev_uring_delete(&mut reg, del.clone())
                .unwrap_err()
                .code,
            -libc::EBUSY
        );
        assert_eq!(reg.len(), 1);
        drop(claimed);
        assert_eq!(
            rpc_bdev_uring_delete(&mut reg, del.clone()).unwrap(),
            json!(true)
        );
        assert_eq!(
            rpc_bdev_uring_delete(&mut reg, del).unwrap_err().code,
            -libc::ENODEV
        );
    }
}

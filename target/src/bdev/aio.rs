//! Linux native AIO bdev ("AIO disk"), through the raw `io_setup` / `io_submit` /
//! `io_getevents` / `io_destroy` system calls. One AIO context per channel.
//!
//! `submit` fills a preallocated iocb and queues it; `poll` hands the queued iocbs to the kernel
//! in one `io_submit`, then reaps finished ones with `io_getevents` and a zero timeout (only when
//! something is in the kernel). An iocb the kernel refuses at submission completes with that
//! errno. The iocbs and buffers stay owned by the channel until their event is reaped, and
//! dropping the channel waits for every one still in the kernel.
//!
//! Flush is `IOCB_CMD_FDSYNC`. Kernels or file systems that refuse it are detected when the bdev
//! is created; such a bdev then writes everything with `RWF_DSYNC` (each write durable when it
//! completes, no volatile cache to flush), reports no write cache, and completes Flush at once.
//! WriteZeroes and Unmap write zeroes from a shared zero buffer in 1 MiB chunks: AIO has no
//! fallocate, and a blocking `fallocate` has no place on a reactor. At most
//! [`MAX_ZEROING_SLOTS`] of them hold a slot at once; the others wait in the channel, so a
//! host deallocating the whole device leaves other hosts' reads and writes their slots.
//! Note: on a file opened without O_DIRECT, Linux performs AIO synchronously inside `io_submit`.

use std::collections::VecDeque;
use std::sync::Arc;

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::json;

use super::file::{BackingFile, ZeroBuf};
use super::util::{self, delete_typed, CompletionQueue};
use super::{
    check_range, Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, BdevRegistry, IoKind,
};

/// Slots (iocbs in flight or queued) per channel.
pub const AIO_DEPTH: usize = 256;

/// Slots that Write Zeroes and deallocation may hold at once. Each streams zeroes through its
/// slot until its whole range is written, which for a range covering the device is the time
/// to rewrite the device: more would leave hosts' reads and writes no slot. Further ones wait
/// in the channel (not in front of reads and writes).
pub const MAX_ZEROING_SLOTS: usize = AIO_DEPTH / 8;

const IOCB_CMD_PREAD: u16 = 0;
const IOCB_CMD_PWRITE: u16 = 1;
const IOCB_CMD_FDSYNC: u16 = 3;

/// The kernel's `struct iocb` (include/uapi/linux/aio_abi.h). `aio_key` and `aio_rw_flags`
/// share a 64-bit word whose order follows the byte order.
#[allow(dead_code)] // Fields the kernel reads but we leave zero.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Iocb {
    aio_data: u64,
    #[cfg(target_endian = "little")]
    aio_key: u32,
    aio_rw_flags: i32,
    #[cfg(target_endian = "big")]
    aio_key: u32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

/// The kernel's `struct io_event`.
#[allow(dead_code)] // `obj` and `res2` are written by the kernel, never needed here.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);

/// The raw system calls; each returns the kernel's result or `-errno`.
#[allow(unsafe_code)]
mod sys {
    use super::{IoEvent, Iocb};

    pub fn io_setup(nr: u32, ctx: &mut u64) -> i64 {
        // SAFETY: io_setup writes the new context id to the u64 `ctx` points at.
        let rc = unsafe { libc::syscall(libc::SYS_io_setup, nr as libc::c_long, ctx as *mut u64) };
        ret(rc)
    }

    /// # Safety
    /// Every iocb pointed to, and the buffer each names, must stay valid and untouched until
    /// its event is reaped (or the context destroyed).
    pub unsafe fn io_submit(ctx: u64, iocbs: &mut [*mut Iocb]) -> i64 {
        // SAFETY: the pointer array is valid for its length; the caller vouches for the iocbs.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_submit,
                ctx as libc::c_ulong,
                iocbs.len() as libc::c_long,
                iocbs.as_mut_ptr(),
            )
        };
        ret(rc)
    }

    /// Reaps up to `events.len()` events, at least `min`; `timeout` None blocks.
    pub fn io_getevents(
        ctx: u64,
        min: usize,
        events: &mut [IoEvent],
        timeout: Option<&libc::timespec>,
    ) -> i64 {
        let ts = timeout.map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: the kernel writes at most `events.len()` events into the slice and only reads
        // the timespec.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                ctx as libc::c_ulong,
                min as libc::c_long,
                events.len() as libc::c_long,
                events.as_mut_ptr(),
                ts,
            )
        };
        ret(rc)
    }

    pub fn io_destroy(ctx: u64) -> i64 {
        // SAFETY: destroys a context this process created; the kernel waits for its I/O.
        let rc = unsafe { libc::syscall(libc::SYS_io_destroy, ctx as libc::c_ulong) };
        ret(rc)
    }

    // `c_long` is only i64 on 64-bit targets.
    #[allow(clippy::useless_conversion)]
    fn ret(rc: libc::c_long) -> i64 {
        if rc < 0 {
            -i64::from(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            )
        } else {
            i64::from(rc)
        }
    }
}

/// Whether the kernel accepts `IOCB_CMD_FDSYNC` on this file. Control path: may block briefly.
fn probe_fdsync(fd: i32) -> bool {
    let mut ctx = 0u64;
    if sys::io_setup(1, &mut ctx) < 0 {
        return false;
    }
    let mut iocb = Iocb {
        aio_lio_opcode: IOCB_CMD_FDSYNC,
        aio_fildes: fd as u32,
        ..Default::default()
    };
    let mut ptrs = [&mut iocb as *mut Iocb];
    // SAFETY: `iocb` outlives the context: we reap its event (or destroy the context, which
    // waits) before returning.
    #[allow(unsafe_code)]
    let submitted = unsafe { sys::io_submit(ctx, &mut ptrs) };
    let mut ok = false;
    if submitted == 1 {
        let mut ev = [IoEvent::default()];
        let timeout = libc::timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        ok = sys::io_getevents(ctx, 1, &mut ev, Some(&timeout)) == 1 && ev[0].res == 0;
    }
    sys::io_destroy(ctx);
    ok
}

/// The file side shared by the bdev and its channels.
#[derive(Debug)]
pub(crate) struct AioShared {
    pub file: BackingFile,
    pub zero: ZeroBuf,
    /// IOCB_CMD_FDSYNC was refused: every write carries RWF_DSYNC instead.
    pub dsync_writes: bool,
}

impl AioShared {
    /// `probe`: check whether the kernel takes IOCB_CMD_FDSYNC on this file (an AIO bdev);
    /// without it, flushes are assumed to work (an io_uring bdev that may fall back to AIO).
    pub fn new(file: BackingFile, probe: bool) -> Result<Self, BdevError> {
        let dsync_writes = probe && !file.readonly && !probe_fdsync(file.fd());
        if dsync_writes {
            tracing::warn!(
                path = file.path,
                "IOCB_CMD_FDSYNC refused: writing with RWF_DSYNC, flush completes at once"
            );
        }
        Ok(Self {
            file,
            zero: ZeroBuf::new()?,
            dsync_writes,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Read, write or flush: one iocb, then complete.
    Single,
    /// Writing zeroes chunk by chunk up to `end` (bytes).
    Zeroing { end: u64 },
}

#[derive(Debug)]
struct Slot {
    io: Option<BdevIo>,
    op: Op,
    /// Bytes the current iocb must transfer; fewer is a short transfer (EIO).
    expect: u64,
}

/// One reactor's AIO context.
pub(crate) struct AioChannel {
    shared: Arc<AioShared>,
    ctx: u64,
    /// Boxed so iocb addresses stay put when the channel moves.
    iocbs: Box<[Iocb]>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots whose iocb is filled but not yet given to the kernel, oldest first.
    queued: Vec<u32>,
    ptrs: Vec<*mut Iocb>,
    events: Vec<IoEvent>,
    /// Iocbs in the kernel.
    in_kernel: usize,
    done: CompletionQueue,
    /// Slots zeroing now (at most [`MAX_ZEROING_SLOTS`]).
    zeroing: usize,
    /// Checked zeroings waiting for one of those, oldest first.
    zero_waiting: VecDeque<BdevIo>,
}

impl AioChannel {
    pub fn new(shared: Arc<AioShared>) -> Result<Self, BdevError> {
        let mut ctx = 0u64;
        let rc = sys::io_setup(AIO_DEPTH as u32, &mut ctx);
        if rc < 0 {
            return Err(BdevError::Io {
                what: format!("io_setup for {}", shared.file.path),
                source: std::io::Error::from_raw_os_error(-rc as i32),
            });
        }
        Ok(Self {
            shared,
            ctx,
            iocbs: vec![Iocb::default(); AIO_DEPTH].into_boxed_slice(),
            slots: (0..AIO_DEPTH)
                .map(|_| Slot {
                    io: None,
                    op: Op::Single,
                    expect: 0,
                })
                .collect(),
            free: (0..AIO_DEPTH as u32).rev().collect(),
            queued: Vec::with_capacity(AIO_DEPTH),
            ptrs: Vec::with_capacity(AIO_DEPTH),
            events: vec![IoEvent::default(); AIO_DEPTH],
            in_kernel: 0,
            done: CompletionQueue::new(2 * AIO_DEPTH),
            zeroing: 0,
            zero_waiting: VecDeque::with_capacity(AIO_DEPTH),
        })
    }

    /// Fills slot `s`'s iocb for a transfer of `len` bytes at byte `offset` from `buf`.
    fn prep_rw(&mut self, s: u32, opcode: u16, buf: u64, len: u64, offset: u64, dsync: bool) {
        self.iocbs[s as usize] = Iocb {
            aio_data: u64::from(s),
            aio_rw_flags: if dsync { libc::RWF_DSYNC } else { 0 },
            aio_lio_opcode: opcode,
            aio_fildes: self.shared.file.fd() as u32,
            aio_buf: buf,
            aio_nbytes: len,
            aio_offset: offset as i64,
            ..Default::default()
        };
        self.slots[s as usize].expect = len;
        self.queued.push(s);
    }

    /// Queues the next zeroing chunk of slot `s`, starting at byte `at`.
    /// Queues the zero write of slot `s` at byte `at`; `fua` makes it durable (RWF_DSYNC), so
    /// a Write Zeroes or deallocate with FUA is on stable media when it completes.
    fn prep_zero_chunk(&mut self, s: u32, at: u64, end: u64, fua: bool) {
        let len = self
            .shared
            .zero
            .chunk(self.shared.file.block_size)
            .min(end - at);
        let dsync = fua || self.shared.dsync_writes;
        let zero = self.shared.zero.as_ptr() as u64;
        self.prep_rw(s, IOCB_CMD_PWRITE, zero, len, at, dsync);
    }

    fn finish(&mut self, s: u32, result: super::IoResult) {
        let slot = &mut self.slots[s as usize];
        let io = slot.io.take().expect("finished slot holds an I/O");
        let was_zeroing = matches!(slot.op, Op::Zeroing { .. });
        self.free.push(s);
        self.done.complete(io, result);
        if was_zeroing {
            self.zeroing -= 1;
        }
    }

    /// Starts the zeroing of checked, non-empty `io` in free slot `s`.
    fn start_zeroing(&mut self, s: u32, io: BdevIo) {
        let bs = u64::from(self.shared.file.block_size);
        let (offset, len) = (io.offset_blocks * bs, io.num_blocks * bs);
        self.zeroing += 1;
        self.slots[s as usize].op = Op::Zeroing { end: offset + len };
        self.prep_zero_chunk(s, offset, offset + len, io.fua);
        self.slots[s as usize].io = Some(io);
    }

    /// Waiting zeroings take the zeroing slots free now (from `poll`, once the completions
    /// are handed over: a start that fails at once completes into `done`).
    fn start_waiting_zeroing(&mut self) {
        while self.zeroing < MAX_ZEROING_SLOTS && !self.zero_waiting.is_empty() {
            let Some(s) = self.free.pop() else {
                return;
            };
            let io = self.zero_waiting.pop_front().expect("not empty");
            self.start_zeroing(s, io);
        }
    }

    /// An iocb of slot `s` ended with `res` (bytes or -errno).
    fn on_event(&mut self, s: u32, res: i64) {
        let slot = &self.slots[s as usize];
        let result = if res < 0 {
            Err((-res) as i32)
        } else if res as u64 != slot.expect {
            // A file that shrank under us reads short; a device that vanished fails outright.
            Err(libc::EIO)
        } else {
            Ok(())
        };
        match (slot.op, result) {
            (Op::Zeroing { end }, Ok(())) => {
                let at = self.iocbs[s as usize].aio_offset as u64 + slot.expect;
                if at < end {
                    let fua = slot.io.as_ref().is_some_and(|io| io.fua);
                    self.prep_zero_chunk(s, at, end, fua);
                } else {
                    self.finish(s, Ok(()));
                }
            }
            (_, result) => self.finish(s, result),
        }
    }

    fn submit_queued(&mut self) {
        while !self.queued.is_empty() {
            self.ptrs.clear();
            for &s in &self.queued {
                self.ptrs.push(&mut self.iocbs[s as usize] as *mut Iocb);
            }
            // SAFETY: each iocb lives in `self.iocbs` (boxed, never reallocated) and each buffer
            // is either the slot's own IoBuf, held in `self.slots` until the event is reaped, or
            // the shared zero buffer, kept alive by `self.shared`. Drop reaps every iocb in the
            // kernel before any of these is freed.
            #[allow(unsafe_code)]
            let rc = unsafe { sys::io_submit(self.ctx, &mut self.ptrs) };
            if rc > 0 {
                let n = rc as usize;
                self.in_kernel += n;
                self.queued.drain(..n);
                continue;
            }
            let err = if rc == 0 { libc::EAGAIN } else { (-rc) as i32 };
            if err == libc::EAGAIN || err == libc::EINTR {
                // Out of kernel resources: try again on the next poll.
                break;
            }
            // The first queued iocb was refused; fail it alone and go on with the rest.
            let s = self.queued.remove(0);
            self.finish(s, Err(err));
        }
    }
}

impl BdevChannel for AioChannel {
    fn submit(&mut self, mut io: BdevIo) -> Result<(), BdevIo> {
        // `done` holds up to AIO_DEPTH immediate completions plus one per slot.
        let Some(&s) = self.free.last() else {
            return Err(io);
        };
        if self.done.len() >= AIO_DEPTH {
            return Err(io);
        }
        let file = &self.shared.file;
        let bs = u64::from(file.block_size);
        let mut result = check_range(file.num_blocks(), &io, file.block_size);
        if result.is_ok() && file.readonly && io.kind != IoKind::Read && io.kind != IoKind::Flush {
            result = Err(libc::EROFS);
        }
        if result.is_ok() && io.kind == IoKind::Flush && (self.shared.dsync_writes || file.readonly)
        {
            // Every write was already durable (or none is possible): nothing to flush.
            self.done.complete(io, Ok(()));
            return Ok(());
        }
        if let Err(e) = result {
            self.done.complete(io, Err(e));
            return Ok(());
        }
        self.free.pop();
        let offset = io.offset_blocks * bs;
        let len = io.num_blocks * bs;
        let dsync = io.fua || self.shared.dsync_writes;
        self.slots[s as usize].op = Op::Single;
        match io.kind {
            IoKind::Read | IoKind::Write => {
                let (opcode, buf) = match io.kind {
                    IoKind::Read => (
                        IOCB_CMD_PREAD,
                        io.buf.as_mut().map(|b| b.as_mut_ptr() as u64),
                    ),
                    _ => (IOCB_CMD_PWRITE, io.buf.as_ref().map(|b| b.as_ptr() as u64)),
                };
                let Some(buf) = buf else {
                    self.free.push(s);
                    self.done.complete(io, Err(libc::EINVAL));
                    return Ok(());
                };
                self.prep_rw(
                    s,
                    opcode,
                    buf,
                    len,
                    offset,
                    dsync && io.kind == IoKind::Write,
                );
            }
            IoKind::Flush => {
                self.iocbs[s as usize] = Iocb {
                    aio_data: u64::from(s),
                    aio_lio_opcode: IOCB_CMD_FDSYNC,
                    aio_fildes: file.fd() as u32,
                    ..Default::default()
                };
                self.slots[s as usize].expect = 0;
                self.queued.push(s);
            }
            IoKind::WriteZeroes | IoKind::Unmap => {
                if len == 0 {
                    self.free.push(s);
                    self.done.complete(io, Ok(()));
                    return Ok(());
                }
                if self.zeroing >= MAX_ZEROING_SLOTS {
                    self.free.push(s);
                    if self.zero_waiting.len() >= AIO_DEPTH {
                        return Err(io);
                    }
                    self.zero_waiting.push_back(io);
                    return Ok(());
                }
                self.start_zeroing(s, io);
                return Ok(());
            }
        }
        self.slots[s as usize].io = Some(io);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        self.submit_queued();
        if self.in_kernel > 0 {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            let mut events = std::mem::take(&mut self.events);
            let rc = sys::io_getevents(self.ctx, 0, &mut events, Some(&zero));
            if rc > 0 {
                self.in_kernel -= rc as usize;
                for ev in &events[..rc as usize] {
                    self.on_event(ev.data as u32, ev.res);
                }
            }
            self.events = events;
            // Zeroing continues with its next chunk without waiting for another poll.
            if !self.queued.is_empty() {
                self.submit_queued();
            }
        }
        let n = self.done.drain(done);
        if !self.zero_waiting.is_empty() {
            self.start_waiting_zeroing();
            self.submit_queued();
        }
        n
    }

    fn in_flight(&self) -> usize {
        AIO_DEPTH - self.free.len() + self.done.len() + self.zero_waiting.len()
    }
}

impl Drop for AioChannel {
    fn drop(&mut self) {
        // The kernel may still write into buffers this channel owns: wait for every iocb.
        let mut events = std::mem::take(&mut self.events);
        while self.in_kernel > 0 {
            let rc = sys::io_getevents(self.ctx, 1, &mut events, None);
            if rc > 0 {
                self.in_kernel -= rc as usize;
            } else if rc != -i64::from(libc::EINTR) {
                break;
            }
        }
        // Destroying the context also waits for anything the loop above could not reap.
        sys::io_destroy(self.ctx);
    }
}

pub struct AioBdev {
    name: String,
    uuid: [u8; 16],
    fallocate: bool,
    shared: Arc<AioShared>,
}

impl AioBdev {
    /// Opens `filename` (O_DIRECT when possible). `block_size` None detects it.
    pub fn new(
        name: impl Into<String>,
        filename: &str,
        block_size: Option<u32>,
        readonly: bool,
        uuid: Option<[u8; 16]>,
    ) -> Result<Self, BdevError> {
        let file = BackingFile::open(filename, block_size, readonly)?;
        let name = name.into();
        tracing::info!(
            bdev = name,
            path = filename,
            direct = file.direct,
            "AIO bdev opened"
        );
        Ok(Self {
            name,
            uuid: uuid.unwrap_or_else(util::random_uuid),
            fallocate: false,
            shared: Arc::new(AioShared::new(file, true)?),
        })
    }

    pub fn filename(&self) -> &str {
        &self.shared.file.path
    }

    pub fn is_direct(&self) -> bool {
        self.shared.file.direct
    }
}

impl Bdev for AioBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn product_name(&self) -> &'static str {
        "AIO disk"
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
    fn supports(&self, kind: IoKind) -> bool {
        kind == IoKind::Read || kind == IoKind::Flush || !self.shared.file.readonly
    }
    fn has_write_cache(&self) -> bool {
        self.shared.file.write_cache && !self.shared.dsync_writes
    }
    fn read_only(&self) -> bool {
        self.shared.file.readonly
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(AioChannel::new(Arc::clone(&self.shared))?))
    }
    fn config_entry(&self) -> serde_json::Value {
        json!({
            "method": "bdev_aio_create",
            "params": {
                "name": self.name,
                "filename": self.shared.file.path,
                "block_size": self.shared.file.block_size,
                "readonly": self.shared.file.readonly,
                "fallocate": self.fallocate,
                "uuid": util::format_uuid(&self.uuid),
            }
        })
    }
    fn driver_specific(&self) -> serde_json::Value {
        json!({
            "aio": {
                "filename": self.shared.file.path,
                "block_device": self.shared.file.is_block_device,
                "direct": self.shared.file.direct,
                "readonly": self.shared.file.readonly,
                "fallocate": self.fallocate,
            }
        })
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `bdev_aio_create`. `fallocate` is recorded for `save_config`; WriteZeroes and Unmap are
/// always served, by writing zeroes (never a blocking fallocate on a reactor).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioCreateParams {
    pub name: String,
    pub filename: String,
    #[serde(default)]
    pub block_size: u32,
    #[serde(default)]
    pub readonly: bool,
    #[serde(default)]
    pub fallocate: bool,
    #[serde(default)]
    pub uuid: Option<String>,
}

pub fn rpc_bdev_aio_create(
    bdevs: &mut BdevRegistry,
    params: AioCreateParams,
) -> Result<serde_json::Value, RpcError> {
    let uuid = util::uuid_param(params.uuid.as_deref())?;
    if bdevs.contains(&params.name) {
        return Err(BdevError::Exists(params.name).into());
    }
    let block_size = (params.block_size != 0).then_some(params.block_size);
    let mut bdev = AioBdev::new(
        params.name.clone(),
        &params.filename,
        block_size,
        params.readonly,
        Some(uuid),
    )?;
    bdev.fallocate = params.fallocate;
    bdevs.register(Arc::new(bdev))?;
    Ok(serde_json::Value::String(params.name))
}

/// `bdev_aio_delete`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioDeleteParams {
    pub name: String,
}

pub fn rpc_bdev_aio_delete(
    bdevs: &mut BdevRegistry,
    params: AioDeleteParams,
) -> Result<serde_json::Value, RpcError> {
    delete_typed::<AioBdev>(bdevs, &params.name)
}

/// `bdev_aio_rescan`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioRescanParams {
    pub name: String,
}

pub fn rpc_bdev_aio_rescan(
    bdevs: &mut BdevRegistry,
    params: AioRescanParams,
) -> Result<serde_json::Value, RpcError> {
    rescan::<AioBdev>(bdevs, &params.name, |b| &b.shared)
}

/// Takes the file's or device's size now for bdev `name` of type `T` (grown, or shrunk while
/// nothing uses the bdev: see [`util::resize`]). The caller tells the hosts of its namespaces.
pub(super) fn rescan<T: 'static>(
    bdevs: &BdevRegistry,
    name: &str,
    shared_of: fn(&T) -> &AioShared,
) -> Result<serde_json::Value, RpcError> {
    let bdev = bdevs
        .get(name)
        .ok_or_else(|| BdevError::NotFound(name.to_string()))?;
    let this = bdev
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| BdevError::NotFound(name.to_string()))?;
    let file = &shared_of(this).file;
    let new = file.current_blocks()?;
    util::resize(bdevs, name, file.num_blocks(), new, |b| {
        file.set_num_blocks(b)
    })?;
    Ok(serde_json::Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::super::file::TempFile;
    use super::super::testutil::{self, io};
    use super::super::util::parse_params;
    use super::*;

    #[test]
    fn data_round_trip_zeroing_and_ranges() {
        let f = TempFile::new("aio", 64 * 4096);
        let bdev = AioBdev::new("a", f.path(), Some(4096), false, None).unwrap();
        assert_eq!(bdev.num_blocks(), 64);
        assert_eq!(bdev.product_name(), "AIO disk");
        testutil::data_contract(&bdev);
        // Data reached the file itself.
        let pool = testutil::pool(4096, 1);
        let mut ch = bdev.open_channel().unwrap();
        testutil::write(ch.as_mut(), &pool, 4096, 5, 1, 77);
        let c = testutil::run(ch.as_mut(), io(1, IoKind::Flush, 0, 0, None));
        assert_eq!(c.result, Ok(()));
        let on_disk = std::fs::read(f.path()).unwrap();
        let via_bdev = testutil::read(ch.as_mut(), &pool, 4096, 5, 1);
        assert_eq!(&on_disk[5 * 4096..6 * 4096], &via_bdev[..]);
    }

    /// A rescan takes the file's new size: the grown blocks serve I/O on channels already
    /// open; a shrunk file is taken only while nothing uses the bdev.
    #[test]
    fn rescan_follows_the_file() {
        let f = TempFile::new("aio-rescan", 16 * 4096);
        let mut reg = BdevRegistry::new();
        let bdev = AioBdev::new("a", f.path(), Some(4096), false, None).unwrap();
        reg.register(Arc::new(bdev)).unwrap();
        let bdev = Arc::clone(reg.get("a").unwrap());
        let pool = testutil::pool(4096, 4);
        let mut ch = bdev.open_channel().unwrap();
        let rescan = |reg: &mut BdevRegistry| {
            rpc_bdev_aio_rescan(reg, parse_params(json!({"name": "a"})).unwrap())
        };
        let file = || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(f.path())
                .unwrap()
        };
        file().set_len(32 * 4096).unwrap();
        assert_eq!(bdev.num_blocks(), 16);
        rescan(&mut reg).unwrap();
        assert_eq!(bdev.num_blocks(), 32);
        testutil::write(ch.as_mut(), &pool, 4096, 28, 4, 3);
        testutil::expect_pattern(ch.as_mut(), &pool, 4096, 28, 4, 3);

        let (_, hold) = reg.claim("a", "nqn.a nsid 1").unwrap();
        file().set_len(8 * 4096).unwrap();
        let e = rescan(&mut reg).unwrap_err();
        assert_eq!(e.code, -libc::EBUSY, "{e:?}");
        assert_eq!(bdev.num_blocks(), 32);
        drop(hold);
        rescan(&mut reg).unwrap();
        assert_eq!(bdev.num_blocks(), 8);
        let c = testutil::run(ch.as_mut(), io(9, IoKind::WriteZeroes, 8, 1, None));
        assert_eq!(c.result, Err(libc::EINVAL));
    }

    #[test]
    fn without_fdsync_writes_are_dsync_and_flush_is_immediate() {
        let f = TempFile::new("aio-dsync", 32 * 4096);
        let file = BackingFile::open(f.path(), Some(4096), false).unwrap();
        let bdev = AioBdev {
            name: "a".into(),
            uuid: util::random_uuid(),
            fallocate: false,
            shared: Arc::new(AioShared {
                file,
                zero: ZeroBuf::new().unwrap(),
                dsync_writes: true,
            }),
        };
        assert!(
            !bdev.has_write_cache(),
            "every write is durable: no cache to report"
        );
        testutil::data_contract(&bdev);
        let mut ch = bdev.open_channel().unwrap();
        ch.submit(io(1, IoKind::Flush, 0, 1, None)).unwrap();
        assert_eq!(ch.in_flight(), 1, "queued, not completed inline");
        assert_eq!(testutil::wait(ch.as_mut(), 1).result, Ok(()));
    }

    #[test]
    fn large_write_zeroes_spans_chunks() {
        // 3 MiB of 512-byte blocks: the zeroing fallback needs several chunks.
        let blocks = 3 * 2048 + 8;
        let f = TempFile::new("aio-wz", blocks * 512);
        std::fs::write(f.path(), vec![0xABu8; (blocks * 512) as usize]).unwrap();
        let bdev = AioBdev::new("a", f.path(), Some(512), false, None).unwrap();
        let mut ch = bdev.open_channel().unwrap();
        let c = testutil::run(ch.as_mut(), io(1, IoKind::WriteZeroes, 4, blocks - 8, None));
        assert_eq!(c.result, Ok(()));
        let data = std::fs::read(f.path()).unwrap();
        assert!(data[..4 * 512].iter().all(|&b| b == 0xAB));
        assert!(data[4 * 512..((blocks - 4) * 512) as usize]
            .iter()
            .all(|&b| b == 0));
        assert!(data[((blocks - 4) * 512) as usize..]
            .iter()
            .all(|&b| b == 0xAB));
    }

    /// Zeroings past MAX_ZEROING_SLOTS wait in the channel without a slot, so reads and
    /// writes still get one; every zeroing completes and leaves its range zero.
    #[test]
    fn zeroing_holds_a_bounded_share_of_the_slots() {
        let f = testutil::zeroing_file("aio-zslots", MAX_ZEROING_SLOTS);
        let bdev = AioBdev::new("a", f.path(), Some(4096), false, None).unwrap();
        let mut ch = AioChannel::new(Arc::clone(&bdev.shared)).unwrap();
        testutil::zeroing_holds_a_bounded_share(
            &mut ch,
            f.path(),
            AIO_DEPTH,
            MAX_ZEROING_SLOTS,
            |ch| testutil::ZeroingView {
                zeroing: ch.zeroing,
                waiting: ch.zero_waiting.len(),
                free: ch.free.len(),
            },
        );
    }

    #[test]
    fn readonly_rejects_writes() {
        let f = TempFile::new("aio-ro", 16 * 4096);
        let bdev = AioBdev::new("a", f.path(), Some(4096), true, None).unwrap();
        assert!(bdev.read_only());
        assert!(!bdev.supports(IoKind::Write));
        let pool = testutil::pool(4096, 1);
        let mut ch = bdev.open_channel().unwrap();
        let ch = ch.as_mut();
        let c = testutil::run(
            ch,
            io(1, IoKind::Write, 0, 1, Some(testutil::buf(&pool, 4096))),
        );
        assert_eq!(c.result, Err(libc::EROFS));
        for kind in [IoKind::WriteZeroes, IoKind::Unmap] {
            assert_eq!(
                testutil::run(ch, io(2, kind, 0, 1, None)).result,
                Err(libc::EROFS)
            );
        }
        testutil::expect_zeroes(ch, &pool, 4096, 0, 1);
        assert_eq!(
            testutil::run(ch, io(3, IoKind::Flush, 0, 1, None)).result,
            Ok(())
        );
    }

    #[test]
    fn truncated_file_gives_error_completion() {
        let f = TempFile::new("aio-trunc", 16 * 4096);
        let bdev = AioBdev::new("a", f.path(), Some(4096), false, None).unwrap();
        let pool = testutil::pool(4096, 1);
        let mut ch = bdev.open_channel().unwrap();
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
            io(2, IoKind::Read, 12, 1, Some(testutil::buf(&pool, 4096))),
        );
        assert!(c.result.is_err());
    }

    #[test]
    fn full_channel_hands_io_back_and_drop_waits() {
        let f = TempFile::new("aio-full", 16 * 4096);
        let b = AioBdev::new("a", f.path(), Some(4096), false, None).unwrap();
        testutil::full_channel_hands_io_back_and_drop_waits(&b, AIO_DEPTH);
    }

    #[test]
    fn rpc_create_delete_and_errors() {
        let f = TempFile::new("aio-rpc", 32 * 4096);
        let mut reg = BdevRegistry::new();
        let p: AioCreateParams =
            parse_params(json!({"name": "aio0", "filename": f.path(), "block_size": 4096}))
                .unwrap();
        assert_eq!(
            rpc_bdev_aio_create(&mut reg, p.clone()).unwrap(),
            json!("aio0")
        );
        assert_eq!(
            rpc_bdev_aio_create(&mut reg, p).unwrap_err().code,
            -libc::EEXIST
        );
        let p: AioCreateParams =
            parse_params(json!({"name": "aio1", "filename": "/nonexistent/x"})).unwrap();
        assert_eq!(
            rpc_bdev_aio_create(&mut reg, p).unwrap_err().code,
            -libc::ENOENT
        );
        let p: AioCreateParams =
            parse_params(json!({"name": "aio1", "filename": f.path(), "block_size": 1000}))
                .unwrap();
        assert_eq!(
            rpc_bdev_aio_create(&mut reg, p).unwrap_err().code,
            -libc::EINVAL
        );
        assert!(parse_params::<AioCreateParams>(json!({"name": "x"})).is_err());
        assert!(
            parse_params::<AioCreateParams>(json!({"name": "x", "filename": "y", "z": 1})).is_err()
        );
        assert_eq!(reg.len(), 1);

        let entry = reg.get("aio0").unwrap().config_entry();
        assert_eq!(entry["method"], "bdev_aio_create");
        assert_eq!(entry["params"]["filename"], f.path());
        parse_params::<AioCreateParams>(entry["params"].clone()).unwrap();

        let claimed = reg.claim("aio0", "nqn:ns1").unwrap();
        let del = AioDeleteParams {
            name: "aio0".into(),
        };
        assert_eq!(
            rpc_bdev_aio_delete(&mut reg, del.clone()).unwrap_err().code,
            -libc::EBUSY
        );
        assert_eq!(reg.len(), 1);
        drop(claimed);
        assert_eq!(
            rpc_bdev_aio_delete(&mut reg, del.clone()).unwrap(),
            json!(true)
        );
        assert_eq!(
            rpc_bdev_aio_delete(&mut reg, del).unwrap_err().code,
            -libc::ENODEV
        );
    }
}

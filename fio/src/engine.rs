//! One fio thread's engine state: its connections (one I/O qpair per controller), its open
//! files (namespaces), the commands in flight and the events for fio to reap.
//!
//! Everything here runs on the fio thread that owns it (fio's `setup` runs on the main
//! thread before the job thread starts, never at the same time), so nothing is locked.
//!
//! # Data buffers
//!
//! fio's `io_u` buffers are plain memory; commands need buffers of a pool registered with
//! the controller. Two ways:
//! - **Zero copy.** The engine allocates fio's I/O memory itself (fio's `iomem_alloc`
//!   hook): a [`BufferPool`] whose buffers are exactly the `io_u` buffers fio carves from it
//!   (fio puts `io_u` *i* at `base + i * max_bs` when the engine sets `FIO_MEMALIGN` and the
//!   region is page aligned). The pool is registered with the first controller the thread
//!   opens; a command on that controller sends the `io_u`'s own [`IoBuf`]. Needs `max_bs` a
//!   multiple of 4 KiB and no `mem_align`.
//! - **Copy** (every other case, or forced with `nvmf_copy=1`): each connection has a
//!   registered bounce pool of `iodepth` buffers of `max_bs`; writes are copied in before the
//!   command is sent, reads copied out when the completion is reaped.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::buffer::{BufferPool, IoBuf, BUFFER_ALIGN};
use nvmf_common::spec::DsmRange;
use nvmf_initiator::{
    ControllerOptions, IoCompletion, IoQpair, NamespaceInfo, Reconnect, SubmitError,
    SubmitErrorKind, TransportId,
};
use zerocopy::IntoBytes;

use crate::error::{status_errno, submit_errno, EngineError, Result};
use crate::ffi::FioBuf;
use crate::registry::{self, SharedController};

/// Largest block count of one Read or Write (NLB is a zero-based 16-bit field).
const MAX_NLB: u64 = 0x1_0000;
/// Failed commands reported on stderr per thread (fio reports each errno itself).
const MAX_ERROR_REPORTS: u32 = 10;

/// Engine options (fio's `nvmf_*` options); they apply when a controller is connected, so
/// the first job to reach an address decides for every job sharing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    pub kato: Duration,
    pub io_timeout: Duration,
    pub reconnect: Option<Reconnect>,
    pub in_capsule_data: bool,
    /// Always copy through bounce buffers, even when zero copy is possible.
    pub force_copy: bool,
    /// How `getevents` waits.
    pub idle: Idle,
}

/// How `getevents` waits for completions. Pure polling (the default, as SPDK) gives the
/// lowest latency on a real NIC; on soft-RoCE the NIC is CPU time on the same cores, and
/// in a TCG guest a spinning vCPU also takes host CPU from the others, so giving the CPU
/// away after some empty polls can be faster there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Idle {
    /// Empty polls in a row before giving the CPU away; 0: never (pure polling).
    pub spin: u32,
    /// Then sleep this long (zero: `sched_yield`).
    pub sleep: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        let d = ControllerOptions::default();
        Self {
            kato: d.kato,
            io_timeout: d.io_timeout,
            reconnect: None,
            in_capsule_data: d.in_capsule_data,
            force_copy: false,
            idle: Idle::default(),
        }
    }
}

impl EngineOptions {
    pub fn controller_options(&self) -> ControllerOptions {
        ControllerOptions {
            kato: self.kato,
            io_timeout: self.io_timeout,
            admin_timeout: self.io_timeout.max(Duration::from_secs(10)),
            in_capsule_data: self.in_capsule_data,
            reconnect: self.reconnect,
            ..ControllerOptions::default()
        }
    }
}

/// What fio asks for, independent of fio's own `DDIR_*` numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Trim,
    Flush,
}

impl Op {
    /// The shim's `NVMF_FIO_OP_*` values.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::Trim,
            3 => Self::Flush,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Trim => "trim",
            Self::Flush => "flush",
        }
    }
}

/// What [`EngineThread::queue`] did with an I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Sent (or waiting in the qpair for a slot); it completes through `getevents`.
    Queued,
    /// No room now: fio reaps completions and queues it again.
    Busy,
}

/// A finished I/O for fio: its `io_u` tag and errno (0 on success).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub tag: u64,
    pub err: i32,
}

/// Where an in-flight command's data lives.
#[derive(Debug)]
pub(crate) enum Data {
    /// No fio data to move back (writes through a bounce buffer, trim, flush).
    Nothing,
    /// A read through a bounce buffer: copied into fio's buffer on completion.
    CopyOut(FioBuf),
    /// fio's own buffer `i` of the I/O memory pool.
    ZeroCopy(usize),
}

#[derive(Debug)]
pub(crate) struct Inflight {
    pub tag: u64,
    pub file: u32,
    pub op: Op,
    pub offset: u64,
    pub data: Data,
}

/// In-flight commands, indexed by the tag given to the qpair. Fixed capacity (fio's
/// iodepth): inserting and taking neither allocates nor searches.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    slots: Vec<Option<Inflight>>,
    free: Vec<u32>,
}

impl Slots {
    pub fn new(capacity: u32) -> Self {
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
        }
    }

    /// Stores `io`; `Err(io)` back when every slot is taken.
    pub fn insert(&mut self, io: Inflight) -> Result<u32, Inflight> {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(io);
                Ok(i)
            }
            None => Err(io),
        }
    }

    pub fn take(&mut self, i: u32) -> Option<Inflight> {
        let io = self.slots.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(io)
    }

    pub fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// fio's I/O memory, allocated here (see the module doc).
struct IoMem {
    pool: BufferPool,
    base: usize,
    buf_size: usize,
    /// The pool's buffers by index; `None` while one is in flight.
    bufs: Vec<Option<IoBuf>>,
    /// Whether fio's io_u buffers coincide with the pool's buffers.
    zero_copy_layout: bool,
    /// The connection whose controller the pool is registered with.
    registered: Option<usize>,
}

impl IoMem {
    /// The pool buffer that is exactly fio's buffer at `addr` (`len` bytes), if free.
    fn buffer_at(&self, addr: usize, len: usize) -> Option<usize> {
        if !self.zero_copy_layout || addr < self.base || len > self.buf_size {
            return None;
        }
        let off = addr - self.base;
        let i = off / self.buf_size;
        (off.is_multiple_of(self.buf_size) && self.bufs.get(i).is_some_and(Option::is_some))
            .then_some(i)
    }
}

/// One controller as this thread uses it: its own qpair and bounce buffers.
struct Conn {
    qp: IoQpair,
    bounce: BufferPool,
    // Declared last: dropped after the qpair.
    ctrl: Arc<SharedController>,
}

struct OpenFile {
    name: String,
    conn: usize,
    ns: NamespaceInfo,
}

/// The engine state of one fio thread (`td->io_ops_data`).
pub struct EngineThread {
    opts: EngineOptions,
    depth: u32,
    max_bs: usize,
    conns: Vec<Conn>,
    files: Vec<Option<OpenFile>>,
    iomem: Option<IoMem>,
    slots: Slots,
    ready: VecDeque<Event>,
    events: Vec<Event>,
    scratch: Vec<IoCompletion>,
    /// Namespace facts found by `probe` (fio's setup), by file name.
    geometry: HashMap<String, NamespaceInfo>,
    /// Controllers probed in setup, held until the thread ends so the job reuses them.
    pins: Vec<Arc<SharedController>>,
    errors_reported: u32,
}

impl EngineThread {
    pub fn new(opts: EngineOptions) -> Self {
        Self {
            opts,
            depth: 0,
            max_bs: 0,
            conns: Vec::new(),
            files: Vec::new(),
            iomem: None,
            slots: Slots::default(),
            ready: VecDeque::new(),
            events: Vec::new(),
            scratch: Vec::new(),
            geometry: HashMap::new(),
            pins: Vec::new(),
            errors_reported: 0,
        }
    }

    fn parse(name: &str) -> Result<(TransportId, u32)> {
        let tid: TransportId = name.parse()?;
        if tid.is_discovery() {
            return Err(EngineError::invalid(format!(
                "{name:?}: no subnqn= (that is the discovery subsystem)"
            )));
        }
        let ns = tid.ns.unwrap_or(1);
        if ns == 0 || ns == u32::MAX {
            return Err(EngineError::invalid(format!(
                "{name:?}: ns={ns} is not a namespace ID"
            )));
        }
        Ok((tid, ns))
    }

    fn controller(&mut self, tid: &TransportId) -> Result<Arc<SharedController>> {
        let ctrl = registry::get_or_connect(tid, &self.opts.controller_options())?;
        if !self.pins.iter().any(|p| Arc::ptr_eq(p, &ctrl)) {
            self.pins.push(Arc::clone(&ctrl));
        }
        Ok(ctrl)
    }

    /// fio's setup: connects (or reuses) the controller and reads the namespace's size.
    pub fn probe(&mut self, name: &str) -> Result<NamespaceInfo> {
        let (tid, nsid) = Self::parse(name)?;
        let ctrl = self.controller(&tid)?;
        let info = {
            let mut guard = ctrl.lock()?;
            let c = guard.as_mut().expect("lock() checked");
            c.namespace(nsid)
                .map_err(|e| EngineError::from(e).context(format!("Identify Namespace {nsid}")))?
        };
        let info = info.ok_or_else(|| {
            EngineError::new(
                libc::ENXIO,
                format!("namespace {nsid} of {} is not active", tid.subnqn),
            )
        })?;
        self.geometry.insert(name.to_string(), info);
        Ok(info)
    }

    /// fio's init: the thread's queue depth and largest block size.
    pub fn init(&mut self, depth: u32, max_bs: u64) -> Result<()> {
        if depth == 0 || depth > u32::from(u16::MAX) {
            return Err(EngineError::invalid(format!(
                "iodepth={depth}: the engine takes 1-65535"
            )));
        }
        let max_bs =
            usize::try_from(max_bs).map_err(|_| EngineError::invalid("block size too large"))?;
        if max_bs == 0 {
            return Err(EngineError::invalid("block size 0"));
        }
        self.depth = depth;
        self.max_bs = max_bs;
        self.slots = Slots::new(depth);
        self.ready = VecDeque::with_capacity(depth as usize);
        self.events = Vec::with_capacity(depth as usize);
        self.scratch = Vec::with_capacity(depth as usize);
        Ok(())
    }

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
        let (buf_size, count) = if layout {
            (max_bs, total.div_ceil(max_bs))
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

    /// fio's open_file: the file's controller connection (made on first use) and namespace.
    /// Returns the handle for `queue`.
    pub fn open(&mut self, name: &str) -> Result<u32> {
        if self.depth == 0 {
            return Err(EngineError::invalid("open before init"));
        }
        let (tid, nsid) = Self::parse(name)?;
        let ctrl = self.controller(&tid)?;
        let conn = match self.conns.iter().position(|c| Arc::ptr_eq(&c.ctrl, &ctrl)) {
            Some(i) => i,
            None => self.connect(ctrl)?,
        };
        let ns = match self.geometry.get(name) {
            Some(ns) => *ns,
            None => {
                let mut guard = self.conns[conn].ctrl.lock()?;
                let c = guard.as_mut().expect("lock() checked");
                c.namespace(nsid)
                    .map_err(|e| {
                        EngineError::from(e).context(format!("Identify Namespace {nsid}"))
                    })?
                    .ok_or_else(|| {
                        EngineError::new(
                            libc::ENXIO,
                            format!("namespace {nsid} of {} is not active", tid.subnqn),
                        )
                    })?
            }
        };
        let file = OpenFile {
            name: name.to_string(),
            conn,
            ns,
        };
        tracing::info!(
            "{name}: namespace {} ({} blocks of {} bytes) on qpair {} of depth {}, {}",
            ns.nsid,
            ns.blocks,
            ns.block_size,
            self.conns[conn].qp.qid(),
            self.conns[conn].qp.depth(),
            if self
                .iomem
                .as_ref()
                .is_some_and(|m| m.zero_copy_layout && m.registered == Some(conn))
            {
                "zero copy"
            } else {
                "copying through bounce buffers"
            }
        );
        let handle = match self.files.iter().position(Option::is_none) {
            Some(i) => {
                self.files[i] = Some(file);
                i
            }
            None => {
                self.files.push(Some(file));
                self.files.len() - 1
            }
        };
        Ok(handle as u32)
    }

    /// A qpair of the thread's depth on `ctrl`, its bounce pool, and (first connection
    /// only) the registration of fio's I/O memory.
    fn connect(&mut self, ctrl: Arc<SharedController>) -> Result<usize> {
        let idx = self.conns.len();
        let depth = u16::try_from(self.depth).unwrap_or(u16::MAX);
        let buf_size = self.max_bs.next_multiple_of(BUFFER_ALIGN);
        let (qp, bounce) = {
            let mut guard = ctrl.lock()?;
            let c = guard.as_mut().expect("lock() checked");
            if self.max_bs > c.max_transfer() as usize {
                say!(
                    "{}: block size {} is above the controller's maximum transfer of {} bytes; such I/O fails",
                    ctrl.key(),
                    self.max_bs,
                    c.max_transfer()
                );
            }
            let qp = c.create_io_qpair(depth).map_err(|e| {
                EngineError::from(e).context(format!("{}: creating an I/O qpair", ctrl.key()))
            })?;
            let bounce = BufferPool::new(buf_size, self.depth)
                .map_err(|e| EngineError::new(libc::ENOMEM, format!("bounce buffers: {e}")))?;
            c.register_pool(&bounce).map_err(EngineError::from)?;
            if let Some(m) = self
                .iomem
                .as_mut()
                .filter(|m| m.zero_copy_layout && m.registered.is_none())
            {
                match c.register_pool(&m.pool) {
                    Ok(()) => m.registered = Some(idx),
                    Err(e) => {
                        say!("registering fio's I/O memory failed ({e}); copying through bounce buffers");
                        m.zero_copy_layout = false;
                    }
                }
            }
            (qp, bounce)
        };
        tracing::debug!("{}: qpair {} of depth {}", ctrl.key(), qp.qid(), qp.depth());
        self.conns.push(Conn { qp, bounce, ctrl });
        Ok(idx)
    }

    /// fio's close_file. The connection stays for the thread's later opens (fio reopens
    /// files between loops and for the verify phase).
    pub fn close(&mut self, handle: u32) -> Result<()> {
        match self.files.get_mut(handle as usize) {
            Some(f @ Some(_)) => {
                *f = None;
                Ok(())
            }
            _ => Err(EngineError::new(
                libc::EBADF,
                format!("close of unknown file handle {handle}"),
            )),
        }
    }

    /// fio's queue. `data` is fio's buffer (`xfer_buf`, `xfer_buflen`) for reads and writes;
    /// `len` is the byte count (for a trim, its length).
    pub fn queue(
        &mut self,
        handle: u32,
        op: Op,
        offset: u64,
        len: u64,
        data: Option<FioBuf>,
        tag: u64,
    ) -> Result<Queued> {
        let Some(Some(file)) = self.files.get(handle as usize) else {
            return Err(EngineError::new(
                libc::EBADF,
                format!("I/O on unknown file handle {handle}"),
            ));
        };
        let (conn, ns) = (file.conn, file.ns);
        let bs = u64::from(ns.block_size);
        let check_range = || -> Result<u64> {
            let size = ns.blocks * bs;
            if len == 0 || !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
                return Err(EngineError::invalid(format!(
                    "{} of {len} bytes at offset {offset}: not a multiple of the {bs}-byte block size",
                    op.name()
                )));
            }
            if offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(EngineError::invalid(format!("{} at offset {offset} of {len} bytes is past the namespace's end ({size} bytes)", op.name())));
            }
            Ok(len / bs)
        };
        let slba = offset / bs;
        let nsid = ns.nsid;
        match op {
            Op::Read | Op::Write => {
                let nlb = check_range()?;
                if nlb > MAX_NLB {
                    return Err(EngineError::invalid(format!(
                        "{} of {nlb} blocks: above {MAX_NLB} per command",
                        op.name()
                    )));
                }
                let Some(fio) = data else {
                    return Err(EngineError::invalid(format!(
                        "{} without a buffer",
                        op.name()
                    )));
                };
                let len = len as usize;
                if fio.len() < len {
                    return Err(EngineError::invalid(format!(
                        "{} buffer of {} bytes for {len} bytes",
                        op.name(),
                        fio.len()
                    )));
                }
                // Zero copy when fio's buffer is one of ours, registered on this connection.
                let zc = self
                    .iomem
                    .as_mut()
                    .filter(|m| m.registered == Some(conn))
                    .and_then(|m| m.buffer_at(fio.addr(), len).map(|i| (i, m.bufs[i].take())));
                let (buf, data) = match zc {
                    Some((i, Some(mut b))) => {
                        b.set_len(len);
                        (b, Data::ZeroCopy(i))
                    }
                    _ => {
                        let Some(mut b) = self.conns[conn].bounce.get() else {
                            return Ok(Queued::Busy);
                        };
                        if b.capacity() < len {
                            return Err(EngineError::invalid(format!(
                                "{} of {len} bytes: above the engine's buffers of {} bytes",
                                op.name(),
                                b.capacity()
                            )));
                        }
                        b.set_len(len);
                        if op == Op::Write {
                            fio.copy_to(&mut b);
                            (b, Data::Nothing)
                        } else {
                            (b, Data::CopyOut(fio))
                        }
                    }
                };
                let inflight = Inflight {
                    tag,
                    file: handle,
                    op,
                    offset,
                    data,
                };
                let slot = match self.slots.insert(inflight) {
                    Ok(s) => s,
                    Err(io) => {
                        self.give_back(&io.data, Some(buf));
                        return Ok(Queued::Busy);
                    }
                };
                let qp = &mut self.conns[conn].qp;
                let r = if op == Op::Read {
                    qp.read(nsid, slba, nlb as u32, buf, u64::from(slot))
                } else {
                    qp.write(nsid, slba, nlb as u32, buf, u64::from(slot))
                };
                self.submitted(slot, r)
            }
            Op::Trim => {
                let nlb = check_range()?;
                let nlb = u32::try_from(nlb).map_err(|_| {
                    EngineError::invalid(format!("trim of {nlb} blocks: above 2^32-1"))
                })?;
                let Some(mut b) = self.conns[conn].bounce.get() else {
                    return Ok(Queued::Busy);
                };
                let range = DsmRange {
                    cattr: 0.into(),
                    nlb: nlb.into(),
                    slba: slba.into(),
                };
                b.set_len(range.as_bytes().len());
                b.copy_from_slice(range.as_bytes());
                let inflight = Inflight {
                    tag,
                    file: handle,
                    op,
                    offset,
                    data: Data::Nothing,
                };
                let Ok(slot) = self.slots.insert(inflight) else {
                    return Ok(Queued::Busy);
                };
                let r = self.conns[conn]
                    .qp
                    .dataset_management(nsid, 1, true, b, u64::from(slot));
                self.submitted(slot, r)
            }
            Op::Flush => {
                let inflight = Inflight {
                    tag,
                    file: handle,
                    op,
                    offset,
                    data: Data::Nothing,
                };
                let Ok(slot) = self.slots.insert(inflight) else {
                    return Ok(Queued::Busy);
                };
                let r = self.conns[conn].qp.flush(nsid, u64::from(slot));
                self.submitted(slot, r)
            }
        }
    }

    /// Settles a submission: on refusal the slot and buffer are released.
    fn submitted(&mut self, slot: u32, r: Result<(), SubmitError>) -> Result<Queued> {
        let Err(e) = r else { return Ok(Queued::Queued) };
        let io = self.slots.take(slot).expect("just inserted");
        self.give_back(&io.data, e.buf);
        match e.kind {
            SubmitErrorKind::QueueFull => Ok(Queued::Busy),
            kind => {
                let why = match self.files.get(io.file as usize) {
                    Some(Some(f)) => match self.conns[f.conn].qp.failure() {
                        Some(f) => f.to_string(),
                        None => format!("{kind:?}"),
                    },
                    _ => format!("{kind:?}"),
                };
                Err(EngineError::new(
                    submit_errno(kind),
                    format!("{} at offset {} refused: {why}", io.op.name(), io.offset),
                ))
            }
        }
    }

    /// Returns a zero-copy buffer to its place (other buffers go back to their pool on drop).
    fn give_back(&mut self, data: &Data, buf: Option<IoBuf>) {
        if let (Data::ZeroCopy(i), Some(mut b)) = (data, buf) {
            if let Some(m) = self.iomem.as_mut() {
                let cap = b.capacity();
                b.set_len(cap);
                m.bufs[*i] = Some(b);
            }
        }
    }

    /// Polls every connection once; finished commands become events. Returns how many.
    fn reap(&mut self) -> usize {
        let mut done = std::mem::take(&mut self.scratch);
        for conn in &mut self.conns {
            conn.qp.poll(&mut done);
        }
        let n = done.len();
        for c in done.drain(..) {
            let Ok(slot) = u32::try_from(c.tag) else {
                continue;
            };
            let Some(io) = self.slots.take(slot) else {
                tracing::error!("completion for unknown slot {slot}");
                continue;
            };
            let err = status_errno(&c.status);
            if err != 0 && self.errors_reported < MAX_ERROR_REPORTS {
                self.errors_reported += 1;
                let name = match self.files.get(io.file as usize) {
                    Some(Some(f)) => f.name.as_str(),
                    _ => "?",
                };
                say!(
                    "{name}: {} at offset {} failed: {}",
                    io.op.name(),
                    io.offset,
                    c.status
                );
            }
            match &io.data {
                Data::CopyOut(fio) if err == 0 => {
                    if let Some(b) = &c.buf {
                        fio.copy_from(b);
                    }
                }
                Data::ZeroCopy(_) => self.give_back(&io.data, c.buf),
                _ => {}
            }
            self.ready.push_back(Event { tag: io.tag, err });
        }
        self.scratch = done;
        n
    }

    /// fio's getevents: waits until at least `min` I/Os finished (or `timeout` passed;
    /// `None` waits as long as it takes, which the I/O timeout bounds), polling as
    /// [`Idle`] says. Returns how many events (at most `max`) `event` now hands out; the
    /// rest wait for the next call.
    pub fn getevents(&mut self, min: u32, max: u32, timeout: Option<Duration>) -> usize {
        self.events.clear();
        // Never wait for more than can come.
        let want = (min.min(max) as usize).min(self.ready.len() + self.slots.outstanding());
        let deadline = timeout.map(|t| Instant::now() + t);
        let idle = self.opts.idle;
        let mut empty = 0u32;
        loop {
            let got = self.reap();
            if self.ready.len() >= want || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            if got > 0 || idle.spin == 0 {
                empty = 0;
                std::hint::spin_loop();
                continue;
            }
            empty += 1;
            if empty >= idle.spin {
                empty = 0;
                if idle.sleep.is_zero() {
                    std::thread::yield_now();
                } else {
                    let left = deadline
                        .map_or(idle.sleep, |d| d.saturating_duration_since(Instant::now()));
                    std::thread::sleep(idle.sleep.min(left));
                }
            }
        }
        let n = self.ready.len().min(max as usize);
        self.events.extend(self.ready.drain(..n));
        n
    }

    /// fio's event(i), after `getevents`.
    pub fn event(&self, i: usize) -> Option<Event> {
        self.events.get(i).copied()
    }

    /// Commands in flight (sent, not yet reaped).
    pub fn outstanding(&self) -> usize {
        self.slots.outstanding()
    }

    /// Ends the thread's connections: qpairs first, then (when no other thread uses them)
    /// the controllers.
    pub fn shutdown(&mut self) {
        for c in self.conns.drain(..) {
            let Conn { qp, bounce, ctrl } = c;
            qp.disconnect();
            drop(bounce);
            drop(ctrl);
        }
        self.files.clear();
        self.iomem = None;
        self.pins.clear();
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inflight(tag: u64) -> Inflight {
        Inflight {
            tag,
            file: 0,
            op: Op::Read,
            offset: 0,
            data: Data::Nothing,
        }
    }

    #[test]
    fn slots_hand_out_each_index_once() {
        let mut s = Slots::new(3);
        let a = s.insert(inflight(10)).unwrap();
        let b = s.insert(inflight(11)).unwrap();
        let c = s.insert(inflight(12)).unwrap();
        assert_eq!(s.outstanding(), 3);
        let mut all = [a, b, c];
        all.sort();
        assert_eq!(all, [0, 1, 2]);
        assert_eq!(s.insert(inflight(13)).unwrap_err().tag, 13, "full");
        assert_eq!(s.take(b).unwrap().tag, 11);
        assert!(s.take(b).is_none(), "taken twice");
        assert!(s.take(99).is_none(), "out of range");
        assert_eq!(
            s.insert(inflight(14)).unwrap(),
            b,
            "the freed slot is reused"
        );
        assert_eq!(s.outstanding(), 3);
    }

    #[test]
    fn op_codes() {
        assert_eq!(Op::from_raw(0), Some(Op::Read));
        assert_eq!(Op::from_raw(1), Some(Op::Write));
        assert_eq!(Op::from_raw(2), Some(Op::Trim));
        assert_eq!(Op::from_raw(3), Some(Op::Flush));
        assert_eq!(Op::from_raw(4), None);
    }

    #[test]
    fn events_beyond_max_wait_for_the_next_call() {
        let mut t = EngineThread::new(EngineOptions::default());
        t.init(8, 4096).unwrap();
        for tag in 0..5 {
            t.ready.push_back(Event { tag, err: 0 });
        }
        assert_eq!(t.getevents(1, 3, Some(Duration::ZERO)), 3);
        assert_eq!(t.event(0), Some(Event { tag: 0, err: 0 }));
        assert_eq!(t.event(2), Some(Event { tag: 2, err: 0 }));
        assert_eq!(t.event(3), None);
        // min above what can ever come does not wait forever.
        assert_eq!(t.getevents(8, 8, None), 2);
        assert_eq!(t.event(1), Some(Event { tag: 4, err: 0 }));
        assert_eq!(t.getevents(0, 8, None), 0);
    }

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
        assert!(m.buf_size * m.bufs.len() >= total);
        for i in 0..4 {
            assert_eq!(m.buffer_at(base + i * 8192, 8192), Some(i));
            assert_eq!(
                m.buffer_at(base + i * 8192, 4096),
                Some(i),
                "shorter transfers too"
            );
        }
        assert_eq!(m.buffer_at(base + 4096, 4096), None, "not a buffer start");
        assert_eq!(m.buffer_at(base, 8193), None, "longer than a buffer");
        assert_eq!(m.buffer_at(base - 8192, 8192), None);
        // Odd block sizes or mem_align: plain memory, copied.
        let base = t.iomem_alloc(4 * 4096 + 2 * 4095, 4096, 4, 0).unwrap() as usize;
        let m = t.iomem.as_ref().unwrap();
        assert!(m.zero_copy_layout, "4 KiB blocks");
        assert!(m.buf_size * m.bufs.len() >= 4 * 4096 + 2 * 4095);
        assert_eq!(m.buffer_at(base + 3 * 4096, 4096), Some(3));
        t.iomem_alloc(3 * 6000 + 4095, 6000, 3, 0).unwrap();
        assert!(!t.iomem.as_ref().unwrap().zero_copy_layout);
        t.iomem_alloc(total + 512, 8192, 4, 512).unwrap();
        assert!(!t.iomem.as_ref().unwrap().zero_copy_layout);
        t.iomem_free();
        assert!(t.iomem.is_none());
    }

    #[test]
    fn bad_calls_are_errors_not_panics() {
        let mut t = EngineThread::new(EngineOptions::default());
        assert_eq!(
            t.open("traddr=10.0.0.1 subnqn=nqn.x").unwrap_err().errno,
            libc::EINVAL,
            "before init"
        );
        assert_eq!(t.init(0, 4096).unwrap_err().errno, libc::EINVAL);
        t.init(4, 4096).unwrap();
        assert_eq!(t.open("no-such-thing").unwrap_err().errno, libc::EINVAL);
        let e = t.open("trtype=RDMA traddr=10.0.0.1").unwrap_err();
        assert!(e.msg.contains("discovery"), "{}", e.msg);
        assert_eq!(
            t.open("traddr=10.0.0.1 subnqn=nqn.x ns=0")
                .unwrap_err()
                .errno,
            libc::EINVAL
        );
        assert_eq!(
            t.queue(0, Op::Read, 0, 4096, None, 1).unwrap_err().errno,
            libc::EBADF
        );
        assert_eq!(t.close(3).unwrap_err().errno, libc::EBADF);
        assert_eq!(t.getevents(1, 4, None), 0, "nothing outstanding: no wait");
    }
}

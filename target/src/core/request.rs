//! A request's life in the core: `prepare` (parse and validate once, decide what the command
//! is and what data moves), the transport moves host data in, `execute` runs what `prepare`
//! decided, and every path ends in one completion status written into the response capsule.
//!
//! The transport owns the [`Request`] (it lives in the transport's request slot with its
//! RDMA state); the core borrows it at each step. A request that has to wait for a bdev or an
//! event returns [`Exec::Pending`]; the core later hands the transport a [`Wakeup`] under the
//! request's [`ReqTag`], and the transport calls `resume` with the request.

use nvmf_common::buffer::IoBuf;
use nvmf_common::spec::{Command, Completion, Status};

use crate::bdev::BdevCompletion;
use crate::cmd::io::IoCmd;
use crate::cmd::reservation::ResvCmd;
use crate::core::namespaces::NsSlot;

/// Names a request across the core/transport boundary: the transport poll group's index in the
/// reactor's poll group (top 8 bits) and the transport's own slot id (low 56 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqTag(pub u64);

impl ReqTag {
    pub fn new(transport_group: u8, slot: u64) -> Self {
        Self((u64::from(transport_group) << 56) | (slot & ((1 << 56) - 1)))
    }

    pub fn transport_group(self) -> usize {
        (self.0 >> 56) as usize
    }

    pub fn slot(self) -> u64 {
        self.0 & ((1 << 56) - 1)
    }
}

/// Direction of the data phase, from the host's point of view of the NVMe command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    None,
    /// Write-like: host memory to the controller (RDMA READ, or in-capsule data).
    HostToController,
    /// Read-like: the controller fills the buffer, the transport writes it to the host.
    ControllerToHost,
}

/// What `prepare` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// Move `len` bytes in `dir`: the transport attaches a buffer of exactly `len` bytes
    /// (filled from the host for `HostToController`), then calls `execute`.
    Data { dir: DataDirection, len: u32 },
    /// No data phase: call `execute` straight away.
    NoData,
    /// Finished already (an error, usually): the response is filled, send it.
    Complete,
}

/// What `execute`/`resume` left the request in.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// The response is filled; for `ControllerToHost` the buffer holds the data to send.
    Complete,
    /// Waiting for a bdev or an event; a [`Wakeup`] for this tag will follow.
    Pending,
}

/// Why the core wakes a pending request.
#[derive(Debug)]
pub enum Wakeup {
    Bdev(BdevCompletion),
    /// An admin command held by the core (an AER) finished with this status and dword 0.
    Finished {
        status: Status,
        dw0: u32,
    },
    /// The controller or queue went away: complete with this status (usually aborted).
    Aborted(Status),
    /// A Compare waiting for a buffer to read the media into may take one now.
    CompareBuffer,
}

/// What `prepare` decided a command is: the command set that runs it and, for the I/O
/// command set, the command as it decoded and checked it. `execute` and `resume` dispatch on
/// it and never decode the SQE again (nvmet's `req->execute`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Op {
    /// Not prepared yet, or refused by `prepare`.
    #[default]
    Unprepared,
    /// A fabrics command (Connect, Property Get/Set), on any queue.
    Fabrics,
    /// An admin command (or a discovery controller's).
    Admin,
    /// A command on a namespace's blocks.
    Io(IoCmd),
    /// A reservation command.
    Reservation(ResvCmd),
}

impl Op {
    /// The I/O command set's commands (reservations too): what `completed_nvme_io` counts.
    pub(crate) fn is_nvme_io(self) -> bool {
        matches!(self, Op::Io(_) | Op::Reservation(_))
    }
}

/// Progress of a command that needs more than one bdev I/O (Dataset Management).
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub outstanding: u32,
    pub status: Option<Status>,
}

pub struct Request {
    pub tag: ReqTag,
    pub cmd: Command,
    pub rsp: Completion,
    /// The data buffer, attached by the transport once `prepare` asked for one.
    pub data: Option<IoBuf>,
    pub dir: DataDirection,
    pub len: u32,
    /// What `prepare` decided the command is.
    pub(crate) op: Op,
    pub(crate) progress: Progress,
    /// The namespace id this request runs against, resolved in `prepare`.
    pub(crate) nsid: u32,
    /// Its namespace's entry on this reactor, resolved in `prepare` (no lookup after).
    pub(crate) ns: NsSlot,
    /// The core's clock (ns) when a read or write was prepared, for its namespace's latency
    /// histogram: the turn's timestamp, so timing an I/O reads no clock.
    pub(crate) started_ns: Option<u64>,
}

impl Request {
    pub fn new(tag: ReqTag) -> Self {
        Self {
            tag,
            cmd: Command::default(),
            rsp: Completion::default(),
            data: None,
            dir: DataDirection::None,
            len: 0,
            op: Op::Unprepared,
            progress: Progress::default(),
            nsid: 0,
            ns: NsSlot::default(),
            started_ns: None,
        }
    }

    /// Resets the request for a new command capsule; the transport then copies the SQE in.
    pub fn reset(&mut self, cmd: Command) {
        self.cmd = cmd;
        self.rsp = Completion::default();
        self.rsp.cid = cmd.cid;
        self.data = None;
        self.dir = DataDirection::None;
        self.len = 0;
        self.op = Op::Unprepared;
        self.progress = Progress::default();
        self.nsid = 0;
        self.ns = NsSlot::default();
        self.started_ns = None;
    }

    /// Fills the response status. Every outcome of a command passes through here.
    pub fn complete(&mut self, status: Status) {
        self.rsp.set_status(status);
    }

    pub fn complete_with(&mut self, status: Status, dw0: u32) {
        self.rsp.dw0.set(dw0);
        self.rsp.set_status(status);
    }

    pub fn status(&self) -> Status {
        self.rsp.status()
    }

    /// Fails the request and reports it complete: the one-line exit of parsers and executors.
    pub fn fail(&mut self, status: Status) -> Exec {
        self.complete(status);
        Exec::Complete
    }

    /// The data buffer as a byte slice (empty when none is attached).
    pub fn data(&self) -> &[u8] {
        self.data.as_deref().unwrap_or(&[])
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        self.data.as_deref_mut().unwrap_or(&mut [])
    }

    /// Copies `src` to the start of the data buffer and zero-fills the rest of the transfer, so
    /// a host asking for more than a structure's size never reads stale bytes.
    pub fn fill_data(&mut self, src: &[u8]) {
        let buf = self.data_mut();
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        buf[n..].fill(0);
    }
}

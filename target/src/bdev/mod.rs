//! Block devices: the storage a namespace exports.
//!
//! A [`Bdev`] describes a device and is shared by every reactor; each reactor opens its own
//! [`BdevChannel`] on it, so the I/O path needs no locks. I/O is asynchronous: `submit` hands a
//! [`BdevIo`] (with the data buffer it owns) to the channel, and `poll` later gives back a
//! [`BdevCompletion`] carrying the same tag and buffer.
//!
//! The contract every backend keeps:
//! - It never panics, whatever the offset, length or backend result: a range outside the device
//!   completes with `EINVAL`, a backend failure with its errno.
//! - Out of resources is not an error: `submit` returns the I/O back (`Err(io)`) and the caller
//!   queues it and retries after the next `poll`. Only a completion reports failure.
//! - A completion reports an errno; the one place that turns it into an NVMe status is
//!   `crate::core::status::from_bdev`.
//! - The buffer comes back untouched except for the data a read put in it.

use std::sync::Arc;

use nvmf_common::buffer::IoBuf;

pub mod aio;
pub mod delay;
pub mod error_inject;
mod file;
pub mod malloc;
pub mod null;
pub mod registry;
pub mod split;
mod unavailable;
pub mod uring;
pub mod util;

#[cfg(test)]
mod testutil;

pub use aio::AioBdev;
pub use delay::DelayBdev;
pub use error_inject::ErrorBdev;
pub use malloc::MallocBdev;
pub use null::NullBdev;
pub use registry::BdevRegistry;
pub use split::SplitBdev;
pub use unavailable::UnavailableChannel;
pub use uring::UringBdev;

/// What an I/O asks of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// Device to buffer, `num_blocks * block_size` bytes.
    Read,
    /// Buffer to device.
    Write,
    /// Everything written before is durable once this completes.
    Flush,
    /// The range reads back as zeroes; no buffer.
    WriteZeroes,
    /// Deallocate the range (NVMe Dataset Management, deallocate); no buffer. Reads of an
    /// unmapped range return zeroes on every backend here.
    Unmap,
}

impl IoKind {
    /// SPDK's names, as `bdev_get_bdevs` reports `supported_io_types` and as
    /// `bdev_error_inject_error` takes `io_type`.
    pub fn spdk_name(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
            IoKind::WriteZeroes => "write_zeroes",
            IoKind::Unmap => "unmap",
        }
    }

    pub const ALL: [IoKind; 5] = [
        IoKind::Read,
        IoKind::Write,
        IoKind::Flush,
        IoKind::WriteZeroes,
        IoKind::Unmap,
    ];
}

/// One I/O handed to a channel.
#[derive(Debug)]
pub struct BdevIo {
    /// Opaque to the bdev; returned in the completion so the caller finds its request.
    pub tag: u64,
    pub kind: IoKind,
    pub offset_blocks: u64,
    pub num_blocks: u64,
    /// Data for Read and Write; its length is `num_blocks * block_size`. `None` otherwise.
    pub buf: Option<IoBuf>,
    /// Force Unit Access: the write is durable before it completes.
    pub fua: bool,
}

/// The result of one I/O: `Ok` or the errno the backend reported.
pub type IoResult = Result<(), i32>;

#[derive(Debug)]
pub struct BdevCompletion {
    pub tag: u64,
    pub kind: IoKind,
    pub result: IoResult,
    pub buf: Option<IoBuf>,
}

/// What [`BdevChannel::submit_now`] did with an I/O.
#[derive(Debug)]
pub enum Submitted {
    /// Finished already: its completion, which `poll` will not report.
    Done(BdevCompletion),
    /// Started: `poll` reports it.
    Started,
    /// Not started, out of resources: queue it and retry after a `poll` (as `submit`'s
    /// `Err`).
    Refused(BdevIo),
}

/// A device description, shared by all reactors.
pub trait Bdev: Send + Sync + 'static {
    fn name(&self) -> &str;
    /// SPDK's `product_name` ("Malloc disk", "Null disk", "URING bdev", ...).
    fn product_name(&self) -> &'static str;
    fn block_size(&self) -> u32;
    fn num_blocks(&self) -> u64;
    fn uuid(&self) -> [u8; 16];
    fn supports(&self, kind: IoKind) -> bool;
    /// A volatile write cache sits in front of the media: hosts must Flush for durability.
    fn has_write_cache(&self) -> bool {
        false
    }
    fn read_only(&self) -> bool {
        false
    }
    /// Opens the calling reactor's channel. Called once per reactor, off the I/O path.
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError>;
    /// The `{"method": ..., "params": ...}` entry that recreates this bdev, for `save_config`.
    fn config_entry(&self) -> serde_json::Value;
    /// Backend-specific detail for `bdev_get_bdevs`' `driver_specific`.
    fn driver_specific(&self) -> serde_json::Value {
        serde_json::Value::Object(Default::default())
    }
    /// Names of the bdevs this one is stacked on (claimed while it exists).
    fn base_bdevs(&self) -> Vec<String> {
        Vec::new()
    }
    /// Whether this bdev depends on its bases keeping their size (a split's parts would
    /// move): a bdev anywhere under it is then not resized.
    fn keeps_base_size(&self) -> bool {
        false
    }
    /// Tears down backend resources when the bdev is deleted (files closed by `Drop` too).
    fn on_delete(&self) {}
    /// Downcast hook for RPCs that act on one bdev type (e.g. error injection).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A reactor's private path to a bdev. Not `Send`: it lives and dies on its reactor.
pub trait BdevChannel {
    /// Starts an I/O. `Err(io)` gives it back unstarted when the channel is out of resources
    /// (ring full, too many in flight): queue it and retry after a `poll`.
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo>;

    /// Starts an I/O, and hands its completion straight back when the backend finished it
    /// on the spot (memory-backed bdevs: null, malloc), so the command completes in the step
    /// that submitted it, with no poll and no wakeup (the kernel target completes such a
    /// bio inline too). The default starts it like `submit` and reports it from `poll`.
    fn submit_now(&mut self, io: BdevIo) -> Submitted {
        match self.submit(io) {
            Ok(()) => Submitted::Started,
            Err(io) => Submitted::Refused(io),
        }
    }

    /// Reports finished I/O through `done`, returns how many. Never blocks.
    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize;

    /// I/O submitted and not yet reported.
    fn in_flight(&self) -> usize;
}

/// Errors of the control path: creating, opening, deleting bdevs.
#[derive(Debug, thiserror::Error)]
pub enum BdevError {
    #[error("bdev {0} already exists")]
    Exists(String),
    #[error("no bdev named {0}")]
    NotFound(String),
    #[error("bdev {name} is in use by {user}")]
    Claimed { name: String, user: String },
    #[error("invalid bdev parameters: {0}")]
    InvalidParams(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl BdevError {
    /// The errno SPDK answers an RPC with for this error.
    pub fn errno(&self) -> i32 {
        match self {
            BdevError::Exists(_) => libc::EEXIST,
            BdevError::NotFound(_) => libc::ENODEV,
            BdevError::Claimed { .. } => libc::EBUSY,
            BdevError::InvalidParams(_) => libc::EINVAL,
            BdevError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl From<BdevError> for nvmf_rpc::RpcError {
    fn from(e: BdevError) -> Self {
        nvmf_rpc::RpcError::errno(e.errno(), e.to_string())
    }
}

/// Checks an I/O against the device's size. Backends call this first so that no LBA, however
/// large, can index outside the device.
pub fn check_range(bdev_blocks: u64, io: &BdevIo, block_size: u32) -> IoResult {
    let end = io
        .offset_blocks
        .checked_add(io.num_blocks)
        .ok_or(libc::EINVAL)?;
    if end > bdev_blocks {
        return Err(libc::EINVAL);
    }
    if let Some(buf) = &io.buf {
        let bytes = io
            .num_blocks
            .checked_mul(u64::from(block_size))
            .ok_or(libc::EINVAL)?;
        if buf.len() as u64 != bytes {
            return Err(libc::EINVAL);
        }
    }
    Ok(())
}

pub type BdevRef = Arc<dyn Bdev>;

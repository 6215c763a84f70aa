//! Submission: the Read / Write / Compare / Write Zeroes / Flush / Dataset Management
//! helpers, the checks that refuse a command up front ([`SubmitError`]), and posting a
//! command with its data (in the capsule, under a per-command window, or keyed by the pool).

use std::fmt;
use std::sync::Arc;

use nvmf_common::buffer::IoBuf;
use nvmf_common::rdma::{AccessFlags, Sge, Verbs, VerbsMr, VerbsPd};
use nvmf_common::spec::Command;

use crate::error::QueueFault;
use crate::transport::Data;

use super::{DataDir, Io, IoQpair, QpairState};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitErrorKind {
    /// As many commands are outstanding as the qpair's depth.
    QueueFull,
    /// The qpair failed for good (see [`IoQpair::failure`]).
    Failed,
    /// The buffer is longer than the controller's maximum transfer.
    TooLarge,
    /// Invalid arguments (e.g. zero blocks, a block count above 65536, a buffer from a pool
    /// not registered on this controller).
    Invalid,
}

/// A refused submission; the buffer comes back.
#[derive(Debug)]
pub struct SubmitError {
    pub kind: SubmitErrorKind,
    pub buf: Option<IoBuf>,
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "submission refused: {:?}", self.kind)
    }
}

impl std::error::Error for SubmitError {}

impl<V: Verbs> IoQpair<V> {
    /// Read `nlb` blocks at `slba` into `buf` (`buf.len()` bytes are transferred).
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        self.submit_blocks(
            Command::read,
            nsid,
            slba,
            nlb,
            buf,
            DataDir::FromController,
            tag,
        )
    }

    /// Write `nlb` blocks at `slba` from `buf`.
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        self.submit_blocks(
            Command::write,
            nsid,
            slba,
            nlb,
            buf,
            DataDir::ToController,
            tag,
        )
    }

    /// Compare `nlb` blocks at `slba` with `buf` (a mismatch completes with Compare Failure).
    pub fn compare(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        self.submit_blocks(
            Command::compare,
            nsid,
            slba,
            nlb,
            buf,
            DataDir::ToController,
            tag,
        )
    }

    /// A Read / Write / Compare built by `build` (e.g. [`Command::read`]) carrying `buf`,
    /// once NLB is known to fit the command.
    #[allow(clippy::too_many_arguments)]
    fn submit_blocks(
        &mut self,
        build: fn(u16, u32, u64, u32) -> Command,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: IoBuf,
        dir: DataDir,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let buf = check_nlb(nlb, Some(buf))?;
        self.submit(build(0, nsid, slba, nlb), buf, dir, tag)
    }

    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        deallocate: bool,
        tag: u64,
    ) -> Result<(), SubmitError> {
        check_nlb(nlb, None)?;
        self.submit(
            Command::write_zeroes(0, nsid, slba, nlb, deallocate),
            None,
            DataDir::None,
            tag,
        )
    }

    pub fn flush(&mut self, nsid: u32, tag: u64) -> Result<(), SubmitError> {
        self.submit(Command::flush(0, nsid), None, DataDir::None, tag)
    }

    /// Dataset Management over `nr` ranges (16-byte `DsmRange` entries at the start of `buf`,
    /// whose length must be `nr * 16`).
    pub fn dataset_management(
        &mut self,
        nsid: u32,
        nr: u32,
        deallocate: bool,
        buf: IoBuf,
        tag: u64,
    ) -> Result<(), SubmitError> {
        if !(1..=256).contains(&nr) || buf.len() != nr as usize * 16 {
            return Err(SubmitError {
                kind: SubmitErrorKind::Invalid,
                buf: Some(buf),
            });
        }
        self.submit(
            Command::dsm(0, nsid, nr, deallocate),
            Some(buf),
            DataDir::ToController,
            tag,
        )
    }

    /// Submits any I/O command; its data is `buf` (all of `buf.len()`), moving in `dir`. The
    /// CID and the data pointer are filled in here.
    pub fn submit(
        &mut self,
        cmd: Command,
        buf: Option<IoBuf>,
        dir: DataDir,
        tag: u64,
    ) -> Result<(), SubmitError> {
        if self.state == QpairState::Failed {
            return Err(SubmitError {
                kind: SubmitErrorKind::Failed,
                buf,
            });
        }
        if let Some(b) = &buf {
            if b.len() > self.max_xfer as usize || b.is_empty() {
                return Err(SubmitError {
                    kind: if b.is_empty() {
                        SubmitErrorKind::Invalid
                    } else {
                        SubmitErrorKind::TooLarge
                    },
                    buf,
                });
            }
        }
        if let Some(b) = &buf {
            let keyed = dir == DataDir::FromController
                || (dir == DataDir::ToController && b.len() as u64 > u64::from(self.in_capsule));
            // A window can only be bound to a region of its own PD, the controller's.
            let bindable = || match window_over::<V>(b, dir) {
                Some(Data::Window { mr, .. }) => self.shared.pd.holds(mr),
                _ => false,
            };
            if keyed && self.shared.windows && !bindable() {
                // Not from a pool registered on this controller.
                return Err(SubmitError {
                    kind: SubmitErrorKind::Invalid,
                    buf,
                });
            }
        }
        let inflight = usize::from(self.queue.as_ref().map_or(0, |q| q.outstanding() as u16));
        if inflight + self.requeue.len() >= usize::from(self.depth) {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        }
        let io = Io {
            tag,
            buf,
            cmd,
            dir,
            submitted: self.shared.verbs.now(),
            retries: 0,
        };
        self.stats.submitted += 1;
        if self.state == QpairState::Live && self.requeue.is_empty() && self.pending_fault.is_none()
        {
            if let Err(io) = self.post(io) {
                self.requeue.push_back(io);
            }
        } else {
            self.requeue.push_back(io);
        }
        Ok(())
    }

    /// Sends `io` on the live queue; gives it back when no slot is free or the post failed
    /// (then the fault is handled by the next poll).
    pub(super) fn post(&mut self, mut io: Io) -> Result<(), Io> {
        let Some(q) = self.queue.as_mut() else {
            return Err(io);
        };
        let data = match (&io.buf, io.dir) {
            (None, _) | (_, DataDir::None) => Data::None,
            (Some(b), DataDir::ToController) if b.len() as u64 <= u64::from(self.in_capsule) => {
                Data::InCapsule(Sge {
                    addr: b.addr(),
                    length: b.len() as u32,
                    lkey: b.lkey(),
                })
            }
            (Some(b), dir) if q.has_windows() => match window_over(b, dir) {
                Some(data) => data,
                None => {
                    self.pending_fault = Some(QueueFault::Verb(
                        "the buffer's pool is not registered for memory windows on this \
                         controller (Controller::register_pool)"
                            .into(),
                    ));
                    return Err(io);
                }
            },
            (Some(b), _) => Data::Keyed {
                addr: b.addr(),
                len: b.len() as u32,
                rkey: b.rkey(),
            },
        };
        match q.submit(&mut io.cmd, data) {
            Ok(Some(cid)) => {
                self.ios[usize::from(cid)] = Some(io);
                Ok(())
            }
            Ok(None) => Err(io),
            Err(f) => {
                self.pending_fault = Some(f);
                Err(io)
            }
        }
    }
}

/// The command's data as a window over `buf`'s pool registration: the target may only
/// read what it sends to the controller, and only write what it returns. `None` when the
/// pool is not registered with the provider `V` for windows.
fn window_over<V: Verbs>(buf: &IoBuf, dir: DataDir) -> Option<Data<'_, V>> {
    let mr = buf
        .registration()?
        .downcast_ref::<Arc<V::Mr>>()
        .filter(|mr| mr.access().contains(AccessFlags::MW_BIND))?;
    let offset = usize::try_from(buf.addr().checked_sub(mr.iova())?).ok()?;
    let access = match dir {
        DataDir::FromController => AccessFlags::REMOTE_WRITE,
        _ => AccessFlags::REMOTE_READ,
    };
    Some(Data::Window {
        mr,
        offset,
        len: buf.len() as u32,
        access,
    })
}

/// NLB is a 16-bit zero-based field: 1..=65536 blocks. Out of range, the command is refused
/// before it is built and the caller gets its buffer back.
fn check_nlb(nlb: u32, buf: Option<IoBuf>) -> Result<Option<IoBuf>, SubmitError> {
    if (1..=0x1_0000).contains(&nlb) {
        Ok(buf)
    } else {
        Err(SubmitError {
            kind: SubmitErrorKind::Invalid,
            buf,
        })
    }
}

//! A fio thread's I/O path: `queue` cuts an `io_u` into commands no larger than the
//! controller takes ([`crate::split`]) and sends as many as fit; parts that find no room
//! (qpair full, bounce buffers out) wait in `stalled` and go out as completions free room;
//! `reap` turns completions back into fio events, one per `io_u`, once all its parts are
//! back. Nothing here allocates.

use std::fmt::Display;

use nvmf_common::buffer::IoBuf;
use nvmf_common::spec::DsmRange;
use nvmf_initiator::SubmitErrorKind;
use zerocopy::IntoBytes;

use super::inflight::{Data, Inflight};
use super::{EngineThread, Event, Op, Queued, MAX_ERROR_REPORTS};
use crate::error::{status_errno, submit_errno, EngineError, Result};
use crate::ffi::FioBuf;
use crate::split::{self, Split};

/// What became of sending an I/O's remaining parts.
enum Sent {
    /// Every part is out (after a failed part: every one that will be).
    All,
    /// The next part found no room; it goes out when completions free some.
    Stalled,
    /// The next part was refused for good.
    Refused(SubmitErrorKind),
}

/// One part's submission.
enum Part {
    Sent,
    NoRoom,
    Refused(SubmitErrorKind),
}

impl EngineThread {
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
        // I/Os cut short by a full queue go first: they hold slots and room is theirs.
        if !self.stalled.is_empty() {
            self.resume();
            if !self.stalled.is_empty() {
                return Ok(Queued::Busy);
            }
        }
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
        let (split, data) = match op {
            Op::Read | Op::Write => {
                check_range()?;
                let Some(fio) = data else {
                    return Err(EngineError::invalid(format!(
                        "{} without a buffer",
                        op.name()
                    )));
                };
                if (fio.len() as u64) < len {
                    return Err(EngineError::invalid(format!(
                        "{} buffer of {} bytes for {len} bytes",
                        op.name(),
                        fio.len()
                    )));
                }
                self.plan(conn, bs, len, fio)?
            }
            Op::Trim => {
                let nlb = check_range()?;
                if u32::try_from(nlb).is_err() {
                    return Err(EngineError::invalid(format!(
                        "trim of {nlb} blocks: above 2^32-1"
                    )));
                }
                (Split::whole(len), Data::Nothing)
            }
            Op::Flush => (Split::whole(0), Data::Nothing),
        };
        let io = Inflight {
            tag,
            file: handle,
            conn,
            nsid: ns.nsid,
            block_size: ns.block_size,
            op,
            offset,
            split,
            data,
            sent: 0,
            done: 0,
            err: 0,
        };
        let Ok(slot) = self.slots.insert(io) else {
            return Ok(Queued::Busy);
        };
        let sent = self.send(slot);
        let started = self.slots.get(slot).is_some_and(|io| io.sent > 0);
        match sent {
            // Nothing went out: fio retries it after reaping, or fails it.
            Sent::Stalled if !started => {
                self.slots.take(slot);
                Ok(Queued::Busy)
            }
            Sent::Refused(kind) if !started => {
                let why = self.refusal(conn, kind);
                self.slots.take(slot);
                Err(EngineError::new(
                    submit_errno(kind),
                    format!("{} at offset {offset} refused: {why}", op.name()),
                ))
            }
            Sent::All => {
                self.count_io(split);
                Ok(Queued::Queued)
            }
            Sent::Stalled => {
                self.count_io(split);
                self.counters.waited += 1;
                self.stalled.push_back(slot);
                Ok(Queued::Queued)
            }
            // Part of it is out: the I/O fails once those parts are back.
            Sent::Refused(kind) => {
                self.count_io(split);
                self.refuse_rest(slot, kind);
                Ok(Queued::Queued)
            }
        }
    }

    fn count_io(&mut self, split: Split) {
        self.counters.ios += 1;
        if split.count() > 1 {
            self.counters.split += 1;
        }
    }

    /// How a read or write of `len` bytes from fio's buffer `fio` goes out on `conn`: in
    /// fio's own buffers when they are registered there and cut to the controller's limits,
    /// else through bounce buffers; in parts of at most the maximum transfer either way.
    fn plan(&self, conn: usize, bs: u64, len: u64, fio: FioBuf) -> Result<(Split, Data)> {
        let max_xfer = u64::from(self.conns[conn].qp.max_transfer());
        let too_many = || EngineError::invalid(format!("I/O of {len} bytes: too many commands"));
        let limit = split::part_limit(max_xfer, bs);
        let zc = limit.and_then(|limit| {
            self.iomem
                .as_ref()
                .filter(|m| m.registered == Some(conn))
                .and_then(|m| m.zero_copy(fio.addr(), len, bs, limit))
        });
        if let Some((first, part)) = zc {
            let split = Split::new(len, part).ok_or_else(too_many)?;
            return Ok((split, Data::ZeroCopy(first)));
        }
        let cap = self.conns[conn].bounce.buf_size() as u64;
        let part = split::part_limit(max_xfer.min(cap), bs).ok_or_else(|| {
            EngineError::invalid(format!(
                "{bs}-byte blocks: above the maximum transfer of {} bytes",
                max_xfer.min(cap)
            ))
        })?;
        let split = Split::new(len, part).ok_or_else(too_many)?;
        Ok((split, Data::Copy(fio)))
    }

    /// Sends the I/O's parts from the next unsent one on, while they fit.
    fn send(&mut self, slot: u32) -> Sent {
        while self.slots.get(slot).is_some_and(Inflight::unsent) {
            match self.send_part(slot) {
                Part::Sent => {}
                Part::NoRoom => return Sent::Stalled,
                Part::Refused(kind) => return Sent::Refused(kind),
            }
        }
        Sent::All
    }

    /// Sends the next part of the I/O in `slot` (which has one).
    fn send_part(&mut self, slot: u32) -> Part {
        let Some(io) = self.slots.get(slot) else {
            return Part::Refused(SubmitErrorKind::Invalid);
        };
        let i = io.sent;
        let (off, plen) = io.split.part(i);
        let bs = u64::from(io.block_size);
        let slba = (io.offset + off) / bs;
        // At most MAX_NLB for reads and writes (split), checked below 2^32 for trims.
        let nlb = u32::try_from(plen / bs).unwrap_or(u32::MAX);
        let (conn, nsid, op) = (io.conn, io.nsid, io.op);
        let tag = split::tag(slot, i);
        let mut zc_index = None;
        let r = match op {
            Op::Read | Op::Write => {
                let mut buf = match &io.data {
                    Data::ZeroCopy(first) => {
                        let index = first + i as usize;
                        let b = self
                            .iomem
                            .as_mut()
                            .and_then(|m| m.bufs.get_mut(index))
                            .and_then(Option::take);
                        // fio's buffer already in flight: cannot happen while fio keeps its
                        // side of the contract.
                        let Some(b) = b else {
                            return Part::Refused(SubmitErrorKind::Invalid);
                        };
                        zc_index = Some(index);
                        b
                    }
                    Data::Copy(fio) => {
                        let Some(mut b) = self.conns[conn].bounce.get() else {
                            return Part::NoRoom;
                        };
                        b.set_len(plen as usize);
                        if op == Op::Write {
                            fio.copy_to(off as usize, &mut b);
                        }
                        b
                    }
                    Data::Nothing => return Part::Refused(SubmitErrorKind::Invalid),
                };
                buf.set_len(plen as usize);
                let qp = &mut self.conns[conn].qp;
                if op == Op::Read {
                    qp.read(nsid, slba, nlb, buf, tag)
                } else {
                    qp.write(nsid, slba, nlb, buf, tag)
                }
            }
            Op::Trim => {
                let Some(mut b) = self.conns[conn].bounce.get() else {
                    return Part::NoRoom;
                };
                let range = DsmRange {
                    cattr: 0.into(),
                    nlb: nlb.into(),
                    slba: slba.into(),
                };
                b.set_len(range.as_bytes().len());
                b.copy_from_slice(range.as_bytes());
                self.conns[conn]
                    .qp
                    .dataset_management(nsid, 1, true, b, tag)
            }
            Op::Flush => self.conns[conn].qp.flush(nsid, tag),
        };
        match r {
            Ok(()) => {
                if let Some(io) = self.slots.get_mut(slot) {
                    io.sent += 1;
                }
                self.counters.commands += 1;
                Part::Sent
            }
            Err(e) => {
                if let (Some(index), Some(b)) = (zc_index, e.buf) {
                    self.put_back(index, b);
                }
                match e.kind {
                    SubmitErrorKind::QueueFull => Part::NoRoom,
                    kind => Part::Refused(kind),
                }
            }
        }
    }

    /// Returns fio's buffer `index` to the I/O memory (bounce buffers return to their pool
    /// when dropped, and so does a buffer of I/O memory fio freed while it was in flight).
    fn put_back(&mut self, index: usize, mut b: IoBuf) {
        let Some(m) = self.iomem.as_mut() else {
            return;
        };
        let here = m.base as u64 + (index as u64) * (m.buf_size as u64);
        if let Some(slot) = m.bufs.get_mut(index).filter(|_| b.addr() == here) {
            let cap = b.capacity();
            b.set_len(cap);
            *slot = Some(b);
        }
    }

    /// Why a submission on `conn` was refused, for messages.
    fn refusal(&self, conn: usize, kind: SubmitErrorKind) -> String {
        match self.conns.get(conn).and_then(|c| c.qp.failure()) {
            Some(f) => f.to_string(),
            None => format!("{kind:?}"),
        }
    }

    /// A part of a started I/O was refused: the rest is not sent, and the I/O fails with
    /// that error (unless a part failed before) once its parts in flight are back.
    fn refuse_rest(&mut self, slot: u32, kind: SubmitErrorKind) {
        let Some(io) = self.slots.get_mut(slot) else {
            return;
        };
        let part = io.sent;
        let first = io.err == 0;
        if first {
            io.err = submit_errno(kind);
        }
        let conn = io.conn;
        if first {
            let why = self.refusal(conn, kind);
            self.report(slot, part, format_args!("refused: {why}"));
        }
        self.complete_if_finished(slot);
    }

    /// Hands the I/O in `slot` to fio if every part it will send is back.
    fn complete_if_finished(&mut self, slot: u32) {
        if self.slots.get(slot).is_some_and(Inflight::finished) {
            if let Some(io) = self.slots.take(slot) {
                self.ready.push_back(Event {
                    tag: io.tag,
                    err: io.err,
                });
            }
        }
    }

    /// Sends what waits in `stalled`, in order, as far as room allows.
    fn resume(&mut self) {
        for _ in 0..self.stalled.len() {
            let Some(slot) = self.stalled.pop_front() else {
                break;
            };
            match self.send(slot) {
                Sent::Stalled => self.stalled.push_back(slot),
                Sent::All => self.complete_if_finished(slot),
                Sent::Refused(kind) => self.refuse_rest(slot, kind),
            }
        }
    }

    /// Reports a failed part on stderr (the first [`MAX_ERROR_REPORTS`] of the thread).
    fn report(&mut self, slot: u32, part: u32, why: impl Display) {
        if self.errors_reported >= MAX_ERROR_REPORTS {
            return;
        }
        let Some(io) = self.slots.get(slot) else {
            return;
        };
        self.errors_reported += 1;
        let name = match self.files.get(io.file as usize) {
            Some(Some(f)) => f.name.as_str(),
            _ => "?",
        };
        let (op, offset, count) = (io.op.name(), io.offset, io.split.count());
        if count > 1 {
            let (off, len) = io.split.part(part);
            say!(
                "{name}: {op} of {} bytes at offset {offset}: part {} of {count} ({len} bytes at offset {}) failed: {why}",
                io.split.len(),
                part + 1,
                offset + off
            );
        } else {
            say!("{name}: {op} at offset {offset} failed: {why}");
        }
    }

    /// Polls every connection once; an I/O whose parts are all back becomes an event.
    /// Then sends stalled parts into the room freed. Returns how many commands completed.
    pub(super) fn reap(&mut self) -> usize {
        let mut done = std::mem::take(&mut self.scratch);
        for conn in &mut self.conns {
            conn.qp.poll(&mut done);
        }
        let n = done.len();
        for c in done.drain(..) {
            let (slot, part) = split::untag(c.tag);
            let Some(io) = self.slots.get_mut(slot) else {
                tracing::error!("completion for unknown slot {slot} (part {part})");
                continue;
            };
            let err = status_errno(&c.status);
            let first_error = io.record(err);
            let (off, _) = io.split.part(part);
            let mut zc_index = None;
            match &io.data {
                Data::Copy(fio) if io.op == Op::Read && err == 0 => {
                    if let Some(b) = &c.buf {
                        fio.copy_from(off as usize, b);
                    }
                }
                Data::ZeroCopy(first) => zc_index = Some(first + part as usize),
                _ => {}
            }
            if let (Some(index), Some(b)) = (zc_index, c.buf) {
                self.put_back(index, b);
            }
            if first_error {
                self.report(slot, part, c.status);
            }
            self.complete_if_finished(slot);
        }
        self.scratch = done;
        if !self.stalled.is_empty() {
            self.resume();
        }
        n
    }
}

//! NVM command set I/O commands: Read, Write, Compare, Flush, Write Zeroes, Dataset
//! Management. Every LBA range is checked against the namespace before a bdev sees it, and
//! every transfer against MDTS and the SGL, so backends only ever get valid requests.

use nvmf_common::spec::command::{Dsm, DsmRange, ReadWrite};
use nvmf_common::spec::{IoOpcode, Status};
use zerocopy::FromBytes;

use crate::bdev::{BdevCompletion, BdevIo, IoKind};
use crate::cmd::{data_phase, reservation};
use crate::core::ana;
use crate::core::compare_buffers::Take;
use crate::core::namespaces::NsSlot;
use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Exec, Op, Prepared, Request};
use crate::core::reservation::Access;
use crate::core::status::from_bdev;
use crate::core::subsystem::Namespace;
use crate::core::{CoreCtx, Counted};

const DSM_RANGE_LEN: u32 = core::mem::size_of::<DsmRange>() as u32;

/// A command on a namespace's blocks, as `prepare` decoded and checked it: the LBA range is
/// inside the namespace and the transfer within MDTS, so `execute` only has to run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoCmd {
    Read(ReadWrite),
    Write(ReadWrite),
    Compare(ReadWrite),
    Flush,
    WriteZeroes(ReadWrite),
    DatasetManagement(Dsm),
}

impl IoCmd {
    /// The command group it belongs to for the reservation check.
    #[inline]
    fn access(self) -> Access {
        match self {
            IoCmd::Read(_) | IoCmd::Compare(_) => Access::Read,
            IoCmd::Write(_)
            | IoCmd::WriteZeroes(_)
            | IoCmd::DatasetManagement(_)
            | IoCmd::Flush => Access::Write,
        }
    }
}

fn check_range(num_blocks: u64, slba: u64, nlb: u64) -> Result<(), Status> {
    match slba.checked_add(nlb) {
        Some(end) if end <= num_blocks => Ok(()),
        _ => Err(Status::LBA_OUT_OF_RANGE.with_dnr()),
    }
}

/// Decodes and checks an I/O queue's command once: what it is (the [`Op`] `execute` and
/// `resume` run) and its data phase.
pub(crate) fn prepare(
    core: &mut CoreCtx,
    q: &mut QueueState,
    req: &mut Request,
) -> Result<(Op, Prepared), Status> {
    let ctrl = q.ctrl.as_ref().expect("checked by the caller");
    if !ctrl.is_ready() {
        return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    }
    let nsid = req.cmd.nsid.get();
    let sid = q.subsystem.expect("connected queues have a subsystem");
    // A namespace masked from this host is an inactive NSID to it: Invalid Namespace or
    // Format, as SPDK answers (`nvmf_ctrlr_get_ns` finds nothing for an invisible NSID).
    // The command's one namespace lookup: execute and completion use the slot. The queue's
    // last one serves again if it is still live and visible (see `QueueState`).
    let (last_nsid, last_slot) = q.last_namespace;
    let reusable = last_nsid == nsid
        && core
            .namespace(last_slot)
            .is_some_and(|g| g.config.ns_visible(&g.ns, &ctrl.hostnqn));
    let slot = if reusable {
        last_slot
    } else {
        let slot = core
            .resolve_namespace(sid, nsid, &ctrl.hostnqn)
            .ok_or(Status::INVALID_NAMESPACE.with_dnr())?;
        q.last_namespace = (nsid, slot);
        slot
    };
    let group_ns = core.namespace(slot).expect("just resolved");
    let ns = &group_ns.ns;
    // Through a path whose ANA group is inaccessible, lost or in transition no I/O command
    // runs (NVMe 2.0 base, 8.1.3); the status sends a multipath host to another path.
    if group_ns.config.ana_reporting {
        let state = group_ns.config.ns_ana_state(ctrl.listener.as_ref(), nsid);
        if let Some(status) = ana::io_status(state) {
            return Err(status);
        }
    }
    req.nsid = nsid;
    req.ns = slot;
    let now_ns = core.now_ns();
    let read_only = ns.bdev.read_only();
    let (cmd, prepared) = match IoOpcode(req.cmd.opcode) {
        op @ (IoOpcode::READ | IoOpcode::WRITE | IoOpcode::COMPARE) => {
            let rw = ReadWrite::parse(&req.cmd);
            check_range(ns.num_blocks(), rw.slba, u64::from(rw.nlb))?;
            let bytes = u64::from(rw.nlb) * u64::from(ns.block_size());
            if bytes > u64::from(q.limits.max_transfer()) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let (cmd, dir) = match op {
                IoOpcode::READ => (IoCmd::Read(rw), DataDirection::ControllerToHost),
                IoOpcode::WRITE if read_only => {
                    return Err(Status::NAMESPACE_WRITE_PROTECTED.with_dnr())
                }
                IoOpcode::WRITE => (IoCmd::Write(rw), DataDirection::HostToController),
                _ => (IoCmd::Compare(rw), DataDirection::HostToController),
            };
            if !matches!(cmd, IoCmd::Compare(_)) {
                req.started_ns = Some(now_ns);
            }
            (cmd, data_phase(q, &req.cmd, dir, bytes as u32)?)
        }
        IoOpcode::FLUSH => (
            IoCmd::Flush,
            data_phase(q, &req.cmd, DataDirection::None, 0)?,
        ),
        IoOpcode::WRITE_ZEROES => {
            let rw = ReadWrite::parse(&req.cmd);
            check_range(ns.num_blocks(), rw.slba, u64::from(rw.nlb))?;
            if read_only {
                return Err(Status::NAMESPACE_WRITE_PROTECTED.with_dnr());
            }
            (
                IoCmd::WriteZeroes(rw),
                data_phase(q, &req.cmd, DataDirection::None, 0)?,
            )
        }
        IoOpcode::DATASET_MANAGEMENT => {
            let dsm = Dsm::parse(&req.cmd);
            // What hosts really send here (Linux: a 4 KiB SGL whatever NR says) is easy to
            // get wrong; the lab reads this line to show it.
            tracing::trace!(
                nr = dsm.nr,
                deallocate = dsm.attr_deallocate,
                sgl = ?req.cmd.dptr.classify(),
                "dataset management capsule"
            );
            if dsm.attr_deallocate && read_only {
                return Err(Status::NAMESPACE_WRITE_PROTECTED.with_dnr());
            }
            let prepared = data_phase(
                q,
                &req.cmd,
                DataDirection::HostToController,
                dsm.nr * DSM_RANGE_LEN,
            )?;
            (IoCmd::DatasetManagement(dsm), prepared)
        }
        op => {
            let resv =
                reservation::decode(op, &req.cmd).ok_or(Status::INVALID_OPCODE.with_dnr())?;
            return Ok((Op::Reservation(resv), reservation::prepare(q, req, resv)?));
        }
    };
    Ok((Op::Io(cmd), prepared))
}

/// With the host's write cache switched off (Set Features VWC) every change to the media must
/// be durable when its command completes: writes, Write Zeroes and deallocations alike.
fn write_through(q: &QueueState, ns: &Namespace) -> bool {
    let ctrl = q.ctrl.as_ref().expect("connected");
    ns.bdev.has_write_cache() && !ctrl.write_cache_enabled()
}

/// What a Dataset Management needs of its namespace, copied out before the core is borrowed
/// to submit.
struct DsmTarget {
    slot: NsSlot,
    num_blocks: u64,
    unmap: bool,
    fua: bool,
}

/// Runs the command `prepare` decoded.
pub(crate) fn execute(
    core: &mut CoreCtx,
    q: &mut QueueState,
    req: &mut Request,
    cmd: IoCmd,
) -> Exec {
    let slot = req.ns;
    // Borrowed, not cloned: a clone is an atomic read-modify-write on memory every reactor
    // touches, per command. Visibility is checked again (no lookup: the slot): the namespace
    // may have been masked from this host, or detached, while the command's data was in
    // flight.
    let ctrl = q.ctrl.as_ref().expect("I/O queues are connected");
    let Some(gns) = core
        .namespace_mut(slot)
        .filter(|g| g.config.ns_visible(&g.ns, &ctrl.hostnqn))
    else {
        return req.fail(Status::INVALID_NAMESPACE.with_dnr());
    };
    // Reservations are checked here, where the command is handed to the bdev, so a
    // reservation change that completed before this point always applies. This reactor's
    // copy of the state, refreshed when the namespace's change counter moved.
    if let Err(status) = gns.resv.check(&gns.ns.resv, &ctrl.hostid, cmd.access()) {
        return req.fail(status);
    }
    let ns = &gns.ns;
    let io = |kind, offset_blocks, num_blocks, buf, fua| BdevIo {
        tag: req.tag.0,
        kind,
        offset_blocks,
        num_blocks,
        buf,
        fua,
    };
    let bdev_io = match cmd {
        IoCmd::Read(rw) => io(
            IoKind::Read,
            rw.slba,
            u64::from(rw.nlb),
            req.data.take(),
            false,
        ),
        IoCmd::Write(rw) => {
            let fua = rw.fua || write_through(q, ns);
            io(
                IoKind::Write,
                rw.slba,
                u64::from(rw.nlb),
                req.data.take(),
                fua,
            )
        }
        IoCmd::Compare(rw) => {
            let max_transfer = q.limits.max_transfer();
            let mut media = match core.compare_buffers.take(req.tag, req.len, max_transfer) {
                Take::Buffer(buf) => buf,
                Take::Queued => return Exec::Pending,
                // Not DNR: another queue's larger transfers sized the pool, or memory ran out.
                Take::Unavailable => return req.fail(Status::COMMAND_INTERRUPTED),
            };
            media.set_len(req.len as usize);
            io(IoKind::Read, rw.slba, u64::from(rw.nlb), Some(media), false)
        }
        IoCmd::Flush => {
            if !ns.bdev.supports(IoKind::Flush) {
                return req.fail(Status::SUCCESS);
            }
            io(IoKind::Flush, 0, 0, None, false)
        }
        IoCmd::WriteZeroes(rw) => {
            if !ns.bdev.supports(IoKind::WriteZeroes) {
                return req.fail(Status::INVALID_OPCODE.with_dnr());
            }
            let fua = rw.fua || write_through(q, ns);
            io(IoKind::WriteZeroes, rw.slba, u64::from(rw.nlb), None, fua)
        }
        IoCmd::DatasetManagement(dsm) => {
            let target = DsmTarget {
                slot,
                num_blocks: ns.num_blocks(),
                unmap: ns.bdev.supports(IoKind::Unmap),
                fua: write_through(q, ns),
            };
            return dataset_management(core, target, dsm, req);
        }
    };
    match core.submit_io_now(slot, bdev_io) {
        // Finished on the spot (a memory-backed bdev): completed here, in this turn's step.
        Ok(Some(done)) => on_bdev_complete(core, req, cmd, done),
        Ok(None) => Exec::Pending,
        Err(status) => req.fail(status),
    }
}

/// Deallocates each range; attributes other than Deallocate are hints and need no action.
/// With the host's write cache switched off the deallocations are durable at completion.
fn dataset_management(core: &mut CoreCtx, ns: DsmTarget, dsm: Dsm, req: &mut Request) -> Exec {
    if !dsm.attr_deallocate {
        return req.fail(Status::SUCCESS);
    }
    // No allocation: every range is checked first, so a bad one fails the command before
    // anything is deallocated, then the merged ranges are submitted.
    let ranges = req
        .data()
        .chunks_exact(DSM_RANGE_LEN as usize)
        .take(dsm.nr as usize)
        .map(|chunk| DsmRange::read_from_bytes(chunk).expect("chunk is exactly one range"))
        .map(|r| (r.slba.get(), u64::from(r.nlb.get())));
    // The ranges are merged where they overlap or touch, on the stack (a command carries at
    // most 256): deallocating is work the backend does per block (AIO and the RAM disk
    // write or clear every one), and 256 copies of the whole namespace in one 4 KiB command
    // would make a host's one command cost 256 times the device.
    let mut spans = [(0u64, 0u64); MAX_DSM_RANGES];
    let mut count = 0;
    for (slba, nlb) in ranges {
        if let Err(status) = check_range(ns.num_blocks, slba, nlb) {
            return req.fail(status);
        }
        if nlb > 0 && count < MAX_DSM_RANGES {
            // Within the namespace (checked): the end does not overflow.
            spans[count] = (slba, slba + nlb);
            count += 1;
        }
    }
    let spans = merge_spans(&mut spans[..count]);
    if spans.is_empty() || !ns.unmap {
        return req.fail(Status::SUCCESS);
    }
    let tag = req.tag.0;
    let mut outstanding = spans.len() as u32;
    let mut first_error = None;
    for &(start, end) in spans.iter() {
        let io = BdevIo {
            tag,
            kind: IoKind::Unmap,
            offset_blocks: start,
            num_blocks: end - start,
            buf: None,
            fua: ns.fua,
        };
        if let Err(status) = core.submit_io(ns.slot, io) {
            outstanding -= 1;
            first_error.get_or_insert(status);
        }
    }
    req.progress.outstanding = outstanding;
    req.progress.status = first_error;
    if req.progress.outstanding == 0 {
        let status = req.progress.status.unwrap_or(Status::SUCCESS);
        return req.fail(status);
    }
    Exec::Pending
}

/// The most ranges a Dataset Management command carries (NR is 0-based, 8 bits).
const MAX_DSM_RANGES: usize = 256;

/// Sorts `[start, end)` spans and merges those that overlap or touch, in place; returns the
/// merged ones, in order.
fn merge_spans(spans: &mut [(u64, u64)]) -> &[(u64, u64)] {
    spans.sort_unstable();
    let mut merged = 0;
    for i in 0..spans.len() {
        let (start, end) = spans[i];
        if merged > 0 && start <= spans[merged - 1].1 {
            let last = &mut spans[merged - 1];
            last.1 = last.1.max(end);
        } else {
            spans[merged] = (start, end);
            merged += 1;
        }
    }
    &spans[..merged]
}

pub(crate) fn on_bdev_complete(
    core: &mut CoreCtx,
    req: &mut Request,
    cmd: IoCmd,
    done: BdevCompletion,
) -> Exec {
    let status = from_bdev(done.kind, done.result);
    let kind = match cmd {
        _ if !status.is_success() => Some(Counted::Error),
        IoCmd::Read(_) => Some(Counted::Read),
        IoCmd::Write(_) => Some(Counted::Write),
        _ => None,
    };
    if let Some(kind) = kind {
        core.count_io(req.ns, kind, req.len, req.started_ns);
    }
    match cmd {
        IoCmd::Compare(_) => {
            let device_copy = done.buf;
            if !status.is_success() {
                return req.fail(status);
            }
            let same = device_copy.as_deref() == Some(req.data());
            req.fail(if same {
                Status::SUCCESS
            } else {
                Status::COMPARE_FAILURE.with_dnr()
            })
        }
        IoCmd::DatasetManagement(_) => {
            req.progress.outstanding = req.progress.outstanding.saturating_sub(1);
            if !status.is_success() {
                req.progress.status.get_or_insert(status);
            }
            if req.progress.outstanding > 0 {
                return Exec::Pending;
            }
            let status = req.progress.status.unwrap_or(Status::SUCCESS);
            req.fail(status)
        }
        _ => {
            if done.buf.is_some() {
                req.data = done.buf;
            }
            req.fail(status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::merge_spans;

    #[test]
    fn dsm_spans_merge_where_they_overlap_or_touch() {
        let mut spans = [
            (100, 104),
            (0, 10),
            (5, 15),
            (100, 101),
            (15, 16),
            (200, 201),
        ];
        assert_eq!(merge_spans(&mut spans), [(0, 16), (100, 104), (200, 201)]);
        let mut same = [(0, 1024); 256];
        assert_eq!(merge_spans(&mut same), [(0, 1024)]);
        assert!(merge_spans(&mut []).is_empty());
    }
}

//! Command semantics, one file per command set: fabrics (Connect, Property Get/Set), admin,
//! discovery (the Discovery Log) and I/O. Each has `prepare` (parse, validate, decide the data
//! phase) and `execute`; every outcome ends in `Request::complete`.

use nvmf_common::spec::sgl::SglKind;
use nvmf_common::spec::{Command, Status};

use crate::core::queue::QueueState;
use crate::core::request::{DataDirection, Prepared};

pub mod admin;
pub mod discovery;
pub mod fabrics;
pub mod io;
pub mod reservation;

/// PSDT: data pointer is an SGL (01b, or 10b with a metadata SGL). Fabrics commands must use
/// SGLs; a PRP command is malformed on a fabric.
const PSDT_MASK: u8 = 0xC0;
const PSDT_PRP: u8 = 0x00;

/// Checks the command's data SGL against the transfer the command implies and returns the
/// data phase, which moves exactly `expected` bytes.
///
/// The SGL may describe more than that (Identify SGLS bit 18, "oversized SGL", as SPDK's
/// target accepts): the Linux host sends every block-layer discard with a 4 KiB SGL, room for
/// the 256 ranges a Dataset Management command can carry, whatever its NR says (host
/// `nvme_setup_discard`, since Linux 5.5). Only a shorter SGL is Data SGL Length Invalid.
pub(crate) fn data_phase(
    q: &QueueState,
    cmd: &Command,
    dir: DataDirection,
    expected: u32,
) -> Result<Prepared, Status> {
    if cmd.flags & PSDT_MASK == PSDT_PRP {
        return Err(Status::INVALID_FIELD.with_dnr());
    }
    let sgl_len = match cmd.dptr.classify() {
        SglKind::Keyed { len, .. } => len,
        SglKind::InCapsule { offset, len } => {
            if dir == DataDirection::ControllerToHost {
                return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr());
            }
            let capsule = u64::from(q.limits.in_capsule_data_size);
            if offset > capsule {
                return Err(Status::INVALID_SGL_OFFSET.with_dnr());
            }
            if offset + u64::from(len) > capsule {
                return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
            }
            len
        }
        SglKind::LastSegment { .. } => return Err(Status::INVALID_SGL_DESCRIPTOR_COUNT.with_dnr()),
        SglKind::Other { .. } => return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
    };
    if sgl_len < expected {
        tracing::debug!(
            opcode = cmd.opcode,
            sgl_len,
            expected,
            "data SGL shorter than the transfer"
        );
        return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    }
    if expected == 0 || dir == DataDirection::None {
        return Ok(Prepared::NoData);
    }
    Ok(Prepared::Data { dir, len: expected })
}

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

/// PSDT: data pointer is an SGL (01b, or 10b with a metadata SGL). Fabrics commands must use
/// SGLs; a PRP command is malformed on a fabric.
const PSDT_MASK: u8 = 0xC0;
const PSDT_PRP: u8 = 0x00;

/// Checks the command's data SGL against the transfer the command implies and returns the
/// data phase. The length must match exactly (a longer SGL would leave host memory
/// unwritten or unread without telling anyone).
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
            if dir != DataDirection::HostToController {
                return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr());
            }
            if offset != 0 || u64::from(len) > u64::from(q.limits.in_capsule_data_size) {
                return Err(Status::INVALID_SGL_OFFSET.with_dnr());
            }
            len
        }
        SglKind::LastSegment { .. } => return Err(Status::INVALID_SGL_DESCRIPTOR_COUNT.with_dnr()),
        SglKind::Other { .. } => return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
    };
    if sgl_len != expected {
        return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    }
    if expected == 0 || dir == DataDirection::None {
        return Ok(Prepared::NoData);
    }
    Ok(Prepared::Data { dir, len: expected })
}

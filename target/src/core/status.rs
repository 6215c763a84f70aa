//! The one place a backend's errno becomes an NVMe status (NVMe 2.0 base, 4.2.3).

use nvmf_common::spec::Status;

use crate::bdev::{IoKind, IoResult};

/// Maps a bdev completion to the status the host sees. Media errors name the direction
/// (a failed read is an Unrecovered Read Error, a failed write a Write Fault); anything the
/// backend reports that has no closer NVMe meaning is an Internal Error with DNR, so the host
/// does not retry what will fail again.
pub fn from_bdev(kind: IoKind, result: IoResult) -> Status {
    let Err(errno) = result else {
        return Status::SUCCESS;
    };
    match errno {
        libc::EIO | libc::ENODATA | libc::EBADMSG => match kind {
            IoKind::Read => Status::UNRECOVERED_READ_ERROR,
            _ => Status::WRITE_FAULT,
        },
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Status::CAPACITY_EXCEEDED.with_dnr(),
        libc::EROFS | libc::EBADF | libc::EPERM | libc::EACCES => match kind {
            IoKind::Read => Status::ACCESS_DENIED.with_dnr(),
            _ => Status::NAMESPACE_WRITE_PROTECTED.with_dnr(),
        },
        // The command layer checks every range against the namespace before a backend sees
        // it: a backend's EINVAL is its own complaint (an O_DIRECT misalignment, an
        // operation the kernel refuses), not the host's range.
        libc::ERANGE => Status::LBA_OUT_OF_RANGE.with_dnr(),
        libc::EOPNOTSUPP => Status::INVALID_OPCODE.with_dnr(),
        // Transient: the host may retry (no DNR). Channels normally absorb these by returning
        // the I/O for a retry; reaching here means the backend gave up on it.
        libc::EAGAIN | libc::ENOMEM | libc::EBUSY | libc::EINTR => Status::NAMESPACE_NOT_READY,
        libc::ECANCELED => Status::ABORT_REQUESTED,
        libc::ENODEV | libc::ENXIO | libc::ENOENT | libc::ESTALE => Status::NAMESPACE_NOT_READY,
        _ => Status::INTERNAL_ERROR.with_dnr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping_follows_the_direction_and_dnr_rules() {
        assert_eq!(from_bdev(IoKind::Read, Ok(())), Status::SUCCESS);
        assert_eq!(
            from_bdev(IoKind::Read, Err(libc::EIO)),
            Status::UNRECOVERED_READ_ERROR
        );
        assert_eq!(
            from_bdev(IoKind::Write, Err(libc::EIO)),
            Status::WRITE_FAULT
        );
        let nospc = from_bdev(IoKind::Write, Err(libc::ENOSPC));
        assert_eq!(nospc, Status::CAPACITY_EXCEEDED.with_dnr());
        assert!(nospc.dnr);
        assert!(!from_bdev(IoKind::Write, Err(libc::EAGAIN)).dnr);
        let other = from_bdev(IoKind::Flush, Err(libc::E2BIG));
        assert_eq!(other, Status::INTERNAL_ERROR.with_dnr());
        assert_eq!(
            from_bdev(IoKind::Write, Err(libc::EINVAL)),
            Status::INTERNAL_ERROR.with_dnr(),
            "not the host's range: the command layer checked it"
        );
        assert_eq!(
            from_bdev(IoKind::Write, Err(libc::EROFS)),
            Status::NAMESPACE_WRITE_PROTECTED.with_dnr()
        );
    }
}

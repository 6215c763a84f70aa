//! The key table: resolving `(key, address, length)` to registered memory, with the access
//! and protection-domain checks a NIC makes, and the byte moves through [`DeviceMemory`]'s
//! copies (the only way the simulator touches memory).

use super::super::mr::AccessFlags;
use super::super::wr::Sge;
use super::fabric::{FabricState, MrEntry, ObjId};

/// Why scattering into local memory failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScatterError {
    /// The data is longer than the scatter list.
    Length,
    /// A key is unknown, in another PD, lacks LOCAL_WRITE, or the range is outside it.
    Protection,
}

impl FabricState {
    /// The registration `key` names in `pd`, if `addr..addr + len` lies inside it and it has
    /// `need`; with the offset of `addr` in it. `remote` looks the key up as an rkey.
    fn resolve(
        &self,
        key: u32,
        pd: ObjId,
        addr: u64,
        len: u64,
        need: AccessFlags,
        remote: bool,
    ) -> Option<(&MrEntry, usize)> {
        let mr = self.mrs.get(&key)?;
        if mr.pd != pd || !mr.access.contains(need) || (remote && mr.rkey != key) {
            return None;
        }
        let off = addr.checked_sub(mr.iova)?;
        if off.checked_add(len)? > mr.len {
            return None;
        }
        Some((mr, usize::try_from(off).ok()?))
    }

    /// Reads the bytes a local scatter list names (any registration of `pd` may be read).
    pub(crate) fn gather(&self, pd: ObjId, sges: &[Sge]) -> Option<Vec<u8>> {
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        let mut out = vec![0u8; usize::try_from(total).ok()?];
        let mut pos = 0usize;
        for s in sges {
            let n = s.length as usize;
            if n == 0 {
                continue;
            }
            let (mr, off) = self.resolve(s.lkey, pd, s.addr, n as u64, AccessFlags(0), false)?;
            if !mr.mem.copy_out(off, &mut out[pos..pos + n]) {
                return None;
            }
            pos += n;
        }
        Some(out)
    }

    /// Writes `data` across a local scatter list in order (needs LOCAL_WRITE).
    pub(crate) fn scatter(&self, pd: ObjId, sges: &[Sge], data: &[u8]) -> Result<(), ScatterError> {
        let room: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        if data.len() as u64 > room {
            return Err(ScatterError::Length);
        }
        let mut pos = 0usize;
        for s in sges {
            if pos == data.len() {
                break;
            }
            let n = (s.length as usize).min(data.len() - pos);
            if n == 0 {
                continue;
            }
            let (mr, off) = self
                .resolve(
                    s.lkey,
                    pd,
                    s.addr,
                    n as u64,
                    AccessFlags::LOCAL_WRITE,
                    false,
                )
                .ok_or(ScatterError::Protection)?;
            if !mr.mem.copy_in(off, &data[pos..pos + n]) {
                return Err(ScatterError::Protection);
            }
            pos += n;
        }
        Ok(())
    }

    /// What an rkey reaches for a request arriving on `qp` (in `pd`): a region's own key,
    /// or a window's (a key that names no region is looked up as a window).
    fn resolve_remote(
        &self,
        rkey: u32,
        pd: ObjId,
        qp: ObjId,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(&MrEntry, usize)> {
        if self.mrs.contains_key(&rkey) {
            self.resolve(rkey, pd, addr, len, need, true)
        } else {
            self.resolve_window(rkey, pd, qp, addr, len, need)
        }
    }

    /// An RDMA WRITE's target: copies `data` in if `rkey` grants REMOTE_WRITE over the range
    /// to requests arriving on `qp` in `pd`. A zero-length write checks nothing.
    pub(crate) fn remote_write(
        &self,
        pd: ObjId,
        qp: ObjId,
        rkey: u32,
        addr: u64,
        data: &[u8],
    ) -> bool {
        if data.is_empty() {
            return true;
        }
        let len = data.len() as u64;
        match self.resolve_remote(rkey, pd, qp, addr, len, AccessFlags::REMOTE_WRITE) {
            Some((mr, off)) => mr.mem.copy_in(off, data),
            None => false,
        }
    }

    /// An RDMA READ's source: the bytes, if `rkey` grants REMOTE_READ over the range to
    /// requests arriving on `qp` in `pd`.
    pub(crate) fn remote_read(
        &self,
        pd: ObjId,
        qp: ObjId,
        rkey: u32,
        addr: u64,
        len: u64,
    ) -> Option<Vec<u8>> {
        let mut out = vec![0u8; usize::try_from(len).ok()?];
        if len == 0 {
            return Some(out);
        }
        let (mr, off) = self.resolve_remote(rkey, pd, qp, addr, len, AccessFlags::REMOTE_READ)?;
        mr.mem.copy_out(off, &mut out).then_some(out)
    }
}

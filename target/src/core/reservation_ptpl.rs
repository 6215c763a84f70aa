//! Persist Through Power Loss: a namespace's reservation state in SPDK's `ptpl_file` format
//! (`nvmf_ns_reservation_store_json` / `_load_json`), read when the namespace is added and
//! written, then synced, before a reservation command that changed it completes.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use nvmf_common::spec::reservation::ReservationType;

use super::{is_all_registrants, valid_type, Registrant, ResvState, MAX_REGISTRANTS};
use crate::bdev::util::{format_uuid, parse_uuid};

/// Why a PTPL file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PtplError {
    #[error("ptpl_file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ptpl_file {path}: not a valid reservation state file: {reason}")]
    Format { path: PathBuf, reason: String },
}

/// SPDK's PTPL file (`nvmf_ns_reservation_store_json` / `_load_json`): UUIDs as lowercase
/// strings, the holder's key as `crkey`, no holder for All Registrants types.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PtplFile {
    #[serde(default)]
    ptpl: bool,
    #[serde(default)]
    rtype: u32,
    #[serde(default)]
    crkey: u64,
    bdev_uuid: String,
    #[serde(default)]
    holder_uuid: String,
    registrants: Vec<PtplRegistrant>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PtplRegistrant {
    rkey: u64,
    host_uuid: String,
}

pub(super) fn load_ptpl(path: &Path, bdev_uuid: &[u8; 16]) -> Result<ResvState, PtplError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ResvState::default()),
        Err(source) => {
            return Err(PtplError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let bad = |reason: String| PtplError::Format {
        path: path.to_path_buf(),
        reason,
    };
    let file: PtplFile = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let file_bdev = parse_uuid(&file.bdev_uuid)
        .ok_or_else(|| bad(format!("bdev_uuid {:?} is not a UUID", file.bdev_uuid)))?;
    if file_bdev != *bdev_uuid {
        return Err(bad(format!(
            "bdev_uuid {} is not this namespace's bdev ({})",
            file.bdev_uuid,
            format_uuid(bdev_uuid)
        )));
    }
    // PTPL off: the file records nothing to restore (SPDK's `nvmf_ns_reservation_restore`).
    if !file.ptpl {
        return Ok(ResvState::default());
    }
    if file.registrants.len() > MAX_REGISTRANTS {
        return Err(bad(format!(
            "{} registrants, at most {MAX_REGISTRANTS}",
            file.registrants.len()
        )));
    }
    let mut state = ResvState {
        ptpl: true,
        ..Default::default()
    };
    for r in &file.registrants {
        let hostid = parse_uuid(&r.host_uuid)
            .ok_or_else(|| bad(format!("host_uuid {:?} is not a UUID", r.host_uuid)))?;
        if state.registrant(&hostid).is_some() {
            return Err(bad(format!("host {} registered twice", r.host_uuid)));
        }
        state.registrants.push(Registrant {
            hostid,
            rkey: r.rkey,
        });
    }
    if file.rtype != 0 {
        let rtype = u8::try_from(file.rtype)
            .ok()
            .map(ReservationType)
            .filter(|&t| valid_type(t))
            .ok_or_else(|| bad(format!("rtype {} is not a reservation type", file.rtype)))?;
        let holder = if is_all_registrants(rtype) {
            state.registrants.first().map(|r| r.hostid)
        } else {
            parse_uuid(&file.holder_uuid)
                .filter(|h| state.registrant(h).is_some_and(|r| r.rkey == file.crkey))
        };
        let holder = holder.ok_or_else(|| {
            bad(format!(
                "reservation type {} without a registered holder with crkey {:#x}",
                file.rtype, file.crkey
            ))
        })?;
        state.rtype = Some(rtype);
        state.holder = Some(holder);
    }
    Ok(state)
}

/// Writes the state to a temporary file next to `path`, syncs it and renames it over `path`
/// (then syncs the directory): a crash leaves either the old file or the new one, never a
/// torn one.
pub(super) fn store_ptpl(
    path: &Path,
    bdev_uuid: &[u8; 16],
    state: &ResvState,
) -> Result<(), PtplError> {
    let crkey = state
        .holder
        .and_then(|h| state.registrant(&h))
        .map_or(0, |r| r.rkey);
    let all_regs = state.rtype.is_some_and(is_all_registrants);
    let file = PtplFile {
        ptpl: state.ptpl,
        rtype: state.rtype.map_or(0, |t| u32::from(t.0)),
        crkey,
        bdev_uuid: format_uuid(bdev_uuid),
        holder_uuid: match state.holder {
            Some(h) if !all_regs => format_uuid(&h),
            _ => String::new(),
        },
        registrants: state
            .registrants
            .iter()
            .map(|r| PtplRegistrant {
                rkey: r.rkey,
                host_uuid: format_uuid(&r.hostid),
            })
            .collect(),
    };
    let io = |source| PtplError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(&file).expect("plain data serialises");
    text.push(b'\n');
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

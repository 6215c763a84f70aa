//! The Unix socket file: what may be replaced at its path, and how it is created so that no
//! other user can reach it, even for a moment, with a mode the umask chose.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::ServerOptions;
use crate::ServeError;

/// A group given as a number or a name from `/etc/group` (for `--rpc-socket-group`).
pub fn group_id(group: &str) -> Result<u32, ServeError> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group")?;
    groups
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 3 && f[0] == group)
        .and_then(|f| f[2].parse().ok())
        .ok_or_else(|| ServeError::NoSuchGroup(group.into()))
}

/// Our effective uid, without libc: `/proc/self` belongs to it.
fn effective_uid() -> io::Result<u32> {
    Ok(std::fs::metadata("/proc/self")?.uid())
}

/// What may be done with an existing entry at the socket path. Split out so the ownership
/// rule is testable with any metadata (tests run as root, which owns everything it creates).
#[derive(Debug, PartialEq, Eq)]
pub enum Existing {
    /// A socket of ours: replace it if nobody answers on it.
    OurSocket,
    NotASocket,
    NotOurs {
        owner: u32,
    },
}

pub fn judge_existing(file_type: std::fs::FileType, owner: u32, us: u32) -> Existing {
    if !file_type.is_socket() {
        Existing::NotASocket
    } else if owner != us {
        Existing::NotOurs { owner }
    } else {
        Existing::OurSocket
    }
}

/// Checks what is at `path` now: nothing, or a stale socket of ours (removed here). Never
/// follows a symlink (`symlink_metadata`), never removes what is not a socket of ours or a
/// socket somebody answers on.
pub(super) fn clear_stale(path: &Path) -> Result<(), ServeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServeError::Path {
                path: path.into(),
                source,
            })
        }
    };
    let us = effective_uid()?;
    match judge_existing(meta.file_type(), meta.uid(), us) {
        Existing::NotASocket => Err(ServeError::NotASocket(path.into())),
        Existing::NotOurs { owner } => Err(ServeError::NotOurs {
            path: path.into(),
            owner,
            us,
        }),
        Existing::OurSocket => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => Err(ServeError::InUse(path.into())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                // Stale: nobody listening. rename() below replaces it atomically anyway;
                // removing it here keeps a failed start from leaving it behind.
                match std::fs::remove_file(path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(source) => Err(ServeError::Path {
                        path: path.into(),
                        source,
                    }),
                }
            }
            Err(source) => Err(ServeError::Path {
                path: path.into(),
                source,
            }),
        },
    }
}

/// Binds the socket in a fresh private directory (mode 0700) beside `path`, sets its mode
/// and group there, and renames it into place: the socket is never reachable with the
/// umask's mode, and rename() replaces a directory entry without following a symlink.
pub(super) fn bind_private(
    path: &Path,
    opts: &ServerOptions,
) -> Result<(std::os::unix::net::UnixListener, u64, u64), ServeError> {
    use std::os::unix::ffi::OsStrExt;
    let at = |source: io::Error| ServeError::Path {
        path: path.into(),
        source,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| at(io::ErrorKind::InvalidInput.into()))?;
    if path.as_os_str().as_bytes().len() > 107 {
        return Err(ServeError::PathTooLong(path.into()));
    }
    // A name nobody else chose: mkdir never follows or reuses an existing entry (a directory
    // or symlink planted under a guessable name makes it fail, and the next name is tried).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut made = None;
    for attempt in 0..16u32 {
        let candidate = dir.join(format!(
            ".{}.{}.{:x}.tmp",
            name.to_string_lossy(),
            std::process::id(),
            nanos.wrapping_add(attempt.wrapping_mul(0x9e37_79b9))
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => {
                made = Some(candidate);
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(at(e)),
        }
    }
    let tmp_dir = made.ok_or_else(|| at(io::ErrorKind::AlreadyExists.into()))?;
    let tmp = tmp_dir.join("s");
    if tmp.as_os_str().as_bytes().len() > 107 {
        let _ = std::fs::remove_dir(&tmp_dir);
        return Err(ServeError::PathTooLong(path.into()));
    }
    let result = (|| {
        let listener = std::os::unix::net::UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(opts.socket_mode))?;
        if let Some(gid) = opts.socket_group {
            std::os::unix::fs::chown(&tmp, None, Some(gid))?;
        }
        let meta = std::fs::symlink_metadata(&tmp)?;
        std::fs::rename(&tmp, path)?;
        Ok((listener, meta.dev(), meta.ino()))
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&tmp_dir);
    result.map_err(at)
}

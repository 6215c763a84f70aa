//! The file or block device under the uring and AIO bdevs: opening it (O_DIRECT when the file
//! system allows), finding its geometry and whether a volatile write cache sits in front of it,
//! and the shared buffer of zeroes that WriteZeroes / Unmap write when the file system cannot
//! zero a range itself. Control path only, except `ZeroBuf::as_ptr`.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{Mmap, MmapOptions};

use super::BdevError;

/// `_IOR(0x12, 114, size_t)`: the device size in bytes. Not exported by `libc`.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// Bytes of zeroes one write of the zeroing fallback covers.
pub const ZERO_CHUNK: usize = 1 << 20;

/// The largest block a file-backed bdev takes (64 KiB, the most any host's block layer
/// uses; Linux takes no more than its page size). Well under [`ZERO_CHUNK`].
pub const MAX_FILE_BLOCK_SIZE: u32 = 64 * 1024;
const _: () = assert!(MAX_FILE_BLOCK_SIZE as usize <= ZERO_CHUNK);

/// An open backing file with its geometry.
#[derive(Debug)]
pub struct BackingFile {
    pub file: File,
    pub path: String,
    /// Opened with O_DIRECT: the page cache is bypassed.
    pub direct: bool,
    pub is_block_device: bool,
    pub readonly: bool,
    pub block_size: u32,
    /// Blocks, as last sized (opened, or `rescan`): read on the I/O path, written only by
    /// the control plane.
    blocks: AtomicU64,
    /// A volatile cache (page cache or device cache) holds written data until a flush.
    pub write_cache: bool,
}

impl BackingFile {
    /// Opens `path` (O_DIRECT unless the file system refuses it) and sizes it. `block_size`
    /// None takes the device's logical block size (block devices) or `st_blksize` (files); a
    /// given one must be a multiple of what O_DIRECT needs.
    pub fn open(path: &str, block_size: Option<u32>, readonly: bool) -> Result<Self, BdevError> {
        let io_err = |what: &str, source| BdevError::Io {
            what: format!("{what} {path}"),
            source,
        };
        // Looked at before the open too: opening a FIFO for reading waits for a writer, and
        // the control plane (every RPC client) with it.
        let kind = std::fs::metadata(path)
            .map_err(|e| io_err("stat of", e))?
            .file_type();
        if !kind.is_block_device() && !kind.is_file() {
            return Err(BdevError::InvalidParams(format!(
                "{path} is neither a regular file nor a block device"
            )));
        }
        let open = |direct: bool| {
            let mut opts = OpenOptions::new();
            opts.read(true).write(!readonly);
            if direct {
                opts.custom_flags(libc::O_DIRECT);
            }
            opts.open(path)
        };
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(path, "file system refuses O_DIRECT, using buffered I/O");
                (open(false).map_err(|e| io_err("opening", e))?, false)
            }
            Err(e) => return Err(io_err("opening", e)),
        };
        let meta = file.metadata().map_err(|e| io_err("stat of", e))?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.file_type().is_file() {
            return Err(BdevError::InvalidParams(format!(
                "{path} is neither a regular file nor a block device"
            )));
        }
        let (bytes, logical, detected) = if is_block_device {
            let logical = blk_ssz(&file).map_err(|e| io_err("BLKSSZGET on", e))?;
            let bytes = blk_size64(&file).map_err(|e| io_err("BLKGETSIZE64 on", e))?;
            (bytes, logical, logical)
        } else {
            let logical = if direct {
                dio_align(&file).unwrap_or(512)
            } else {
                512
            };
            let st = meta.blksize() as u32;
            // st_blksize is the file system's preferred I/O size; some report megabytes.
            let detected = if st.is_power_of_two() && (512..=65536).contains(&st) {
                st.max(logical)
            } else {
                4096u32.max(logical)
            };
            (meta.len(), logical, detected)
        };
        let block_size = match block_size {
            None | Some(0) => detected,
            Some(bs) if bs >= 512 && bs % logical.max(512) == 0 => bs,
            Some(bs) => {
                return Err(BdevError::InvalidParams(format!(
                    "block_size {bs} is not a multiple of the logical block size {} of {path}",
                    logical.max(512)
                )))
            }
        };
        // The zeroing fallback writes whole blocks from the 1 MiB zero buffer: a larger
        // block would have the kernel read past it (and write what lies there to the media).
        if block_size > MAX_FILE_BLOCK_SIZE {
            return Err(BdevError::InvalidParams(format!(
                "block_size {block_size} of {path} is above the largest supported, {MAX_FILE_BLOCK_SIZE}"
            )));
        }
        let num_blocks = bytes / u64::from(block_size);
        if num_blocks == 0 {
            return Err(BdevError::InvalidParams(format!(
                "{path} ({bytes} bytes) holds no block of {block_size} bytes"
            )));
        }
        let write_cache = if is_block_device && direct {
            device_write_cache(meta.rdev())
        } else {
            // Buffered I/O or a file: the page cache (and whatever is under the file system).
            true
        };
        Ok(Self {
            file,
            path: path.to_string(),
            direct,
            is_block_device,
            readonly,
            block_size,
            blocks: AtomicU64::new(num_blocks),
            write_cache,
        })
    }

    pub fn num_blocks(&self) -> u64 {
        self.blocks.load(Ordering::Relaxed)
    }

    /// The file's or device's size now, in blocks (a file grown or shrunk, a device
    /// resized), without taking it: see [`Self::set_num_blocks`].
    pub fn current_blocks(&self) -> Result<u64, BdevError> {
        let io_err = |what: &str, source| BdevError::Io {
            what: format!("{what} {}", self.path),
            source,
        };
        let bytes = if self.is_block_device {
            blk_size64(&self.file).map_err(|e| io_err("BLKGETSIZE64 on", e))?
        } else {
            self.file
                .metadata()
                .map_err(|e| io_err("stat of", e))?
                .len()
        };
        Ok(bytes / u64::from(self.block_size))
    }

    pub fn set_num_blocks(&self, blocks: u64) {
        self.blocks.store(blocks, Ordering::Relaxed);
    }

    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

fn blk_ssz(file: &File) -> std::io::Result<u32> {
    let mut ssz: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points at `ssz`.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET,
            &mut ssz as *mut libc::c_int,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ssz.max(512) as u32)
}

fn blk_size64(file: &File) -> std::io::Result<u64> {
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at `bytes`.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut bytes as *mut u64) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(bytes)
}

/// The file offset alignment O_DIRECT needs (statx STATX_DIOALIGN, Linux 6.1+).
fn dio_align(file: &File) -> Option<u32> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    #[allow(unsafe_code)]
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the empty path with AT_EMPTY_PATH names the fd itself; statx writes only `stx`.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    (rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align != 0)
        .then_some(stx.stx_dio_offset_align)
}

/// Whether the device reports a volatile write cache (`queue/write_cache` is "write back").
/// Unknown counts as cached: claiming a cache only costs the host a flush.
fn device_write_cache(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let base = format!("/sys/dev/block/{major}:{minor}");
    // A partition has no queue of its own; its parent's is one level up.
    for path in [
        format!("{base}/queue/write_cache"),
        format!("{base}/../queue/write_cache"),
    ] {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s.trim() != "write through";
        }
    }
    true
}

/// A read-only mapping of zeroes, the source of the zeroing fallback's writes. Page-aligned, so
/// O_DIRECT accepts it; shared by every channel (the kernel only reads it).
#[derive(Debug)]
pub struct ZeroBuf {
    map: Mmap,
}

impl ZeroBuf {
    pub fn new() -> Result<Self, BdevError> {
        let map = MmapOptions::new()
            .len(ZERO_CHUNK)
            .map_anon()
            .and_then(|m| m.make_read_only())
            .map_err(|source| BdevError::Io {
                what: "mapping the zero buffer".into(),
                source,
            })?;
        Ok(Self { map })
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }

    /// Bytes of one zeroing write: a whole number of blocks, never more than the buffer
    /// (a file bdev's block is at most [`MAX_FILE_BLOCK_SIZE`]).
    pub fn chunk(&self, block_size: u32) -> u64 {
        let bs = u64::from(block_size.clamp(1, MAX_FILE_BLOCK_SIZE));
        (ZERO_CHUNK as u64) / bs * bs
    }
}

/// A directory for tests' backing files, preferring one where O_DIRECT works so the direct
/// path is exercised; falls back to the system temp dir (where bdevs run buffered).
#[cfg(test)]
pub fn test_dir() -> std::path::PathBuf {
    let candidates = [
        std::env::temp_dir(),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/bdev-tests"),
    ];
    for dir in &candidates {
        if std::fs::create_dir_all(dir).is_err() {
            continue;
        }
        let probe = dir.join(format!("odirect-probe-{}", std::process::id()));
        let ok = OpenOptions::new()
            .create(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&probe)
            .is_ok();
        let _ = std::fs::remove_file(&probe);
        if ok {
            return dir.clone();
        }
    }
    std::env::temp_dir()
}

/// A fresh file of `bytes` zero bytes in the test directory, removed when dropped.
#[cfg(test)]
pub struct TempFile(pub std::path::PathBuf);

#[cfg(test)]
impl TempFile {
    pub fn new(tag: &str, bytes: u64) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "bdev-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = test_dir().join(name);
        let f = File::create(&path).unwrap();
        f.set_len(bytes).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

#[cfg(test)]
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO (or a socket, a character device) is refused by its type before it is
    /// opened: opening a FIFO for reading would wait for a writer, with the control plane.
    #[test]
    fn a_fifo_is_refused_without_opening_it() {
        let dir = std::env::temp_dir().join(format!("nvmf-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        for readonly in [true, false] {
            match BackingFile::open(fifo.to_str().unwrap(), None, readonly) {
                Err(BdevError::InvalidParams(m)) => assert!(m.contains("neither"), "{m}"),
                other => panic!("a FIFO was accepted or failed otherwise: {:?}", other.err()),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn geometry_of_a_file() {
        let f = TempFile::new("geom", 1 << 20);
        let b = BackingFile::open(f.path(), Some(4096), false).unwrap();
        assert_eq!(b.block_size, 4096);
        assert_eq!(b.num_blocks(), 256);
        assert!(b.write_cache);
        let direct_ok = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(f.path())
            .is_ok();
        assert_eq!(
            b.direct, direct_ok,
            "O_DIRECT used exactly when the file system allows"
        );
        let b = BackingFile::open(f.path(), None, true).unwrap();
        assert!(b.block_size >= 512 && b.block_size.is_power_of_two());
        assert!(b.readonly);
        assert!(BackingFile::open(f.path(), Some(1000), false).is_err());
        assert!(BackingFile::open(f.path(), Some(2 << 20), false).is_err());
        assert!(BackingFile::open("/nonexistent/file", None, false).is_err());
        let z = ZeroBuf::new().unwrap();
        assert_eq!(z.chunk(4096), ZERO_CHUNK as u64);
        assert_eq!(z.chunk(1536) % 1536, 0);
        for bs in [512, 65536, 2 << 20, u32::MAX] {
            assert!(z.chunk(bs) <= ZERO_CHUNK as u64 && z.chunk(bs) > 0, "{bs}");
        }
    }

    /// Blocks above 64 KiB are refused: the zeroing writes whole blocks from the 1 MiB
    /// zero buffer, and a 2 MiB block would have the kernel read (and store) what lies past it.
    #[test]
    fn blocks_larger_than_the_zero_buffer_can_serve_are_refused() {
        let f = TempFile::new("bigblock", 8 << 20);
        assert!(BackingFile::open(f.path(), Some(65536), false).is_ok());
        for bs in [128 << 10, 2 << 20] {
            let e = BackingFile::open(f.path(), Some(bs), false).unwrap_err();
            assert!(e.to_string().contains("largest supported"), "{e}");
        }
    }
}

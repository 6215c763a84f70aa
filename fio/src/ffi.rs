//! The C functions the shim (`fio/engine/nvmf_fio.c`) calls; `fio/engine/nvmf_fio.h`
//! declares them. Every function catches panics and reports failures as a negative errno,
//! with the message readable through [`nvmf_fio_last_error`].
//!
//! Pointer contract (the shim keeps it): a `struct nvmf_fio_thread *` comes from
//! [`nvmf_fio_thread_new`], belongs to one fio thread (`td->io_ops_data`) and is used by one
//! OS thread at a time until [`nvmf_fio_thread_free`]; strings are NUL-terminated; out
//! pointers are valid for one write; an I/O's buffer stays valid and untouched by fio until
//! its event is reaped.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::time::Duration;

use nvmf_initiator::Reconnect;

use crate::engine::{EngineOptions, EngineThread, Idle, Op, Queued};
use crate::spdk_options::{SpdkOptions, INT_OPTIONS, STR_OPTIONS, ZONE_OPTIONS};

// Every `unsafe extern "C" fn` below has the same `# Safety` requirement: the pointer
// contract in the module documentation.
use crate::error::{EngineError, Result};

/// `nvmf_fio_queue`'s answer when the I/O must be retried after reaping (FIO_Q_BUSY).
pub const NVMF_FIO_BUSY: c_int = 1;

/// Engine options as the shim passes them (`struct nvmf_fio_opts`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NvmfFioOpts {
    /// Keep Alive Timeout in seconds (0: no keep-alive).
    pub kato_s: u32,
    /// Seconds before an I/O command times out (and the association is reset).
    pub io_timeout_s: u32,
    /// Seconds between reconnect attempts; 0: no reconnect, the first failure is final.
    pub reconnect_delay_s: u32,
    /// Give up reconnecting after this many seconds; 0: never.
    pub ctrl_loss_tmo_s: u32,
    /// Send small writes in the command capsule when the controller takes them.
    pub in_capsule: u32,
    /// Copy through bounce buffers even when fio's buffers could be used directly.
    pub copy: u32,
    /// Empty polls in a row before `getevents` gives the CPU away; 0: pure polling.
    pub idle_spin: u32,
    /// Then sleep this many microseconds (0: yield).
    pub idle_sleep_us: u32,
    /// SPDK's `hostnqn` option: null, or used when the file name has none.
    pub hostnqn: *const c_char,
    /// SPDK's `print_qid_mappings`.
    pub print_qid_mappings: u32,
    /// SPDK's integer options without effect here, in the order of
    /// [`INT_OPTIONS`](crate::spdk_options::INT_OPTIONS) then `ZONE_OPTIONS`.
    pub spdk_int: [i32; 21],
    /// `pi_chk`, `digest_enable`, `log_flags` (null: not set).
    pub spdk_str: [*const c_char; 3],
}

impl NvmfFioOpts {
    /// SPDK's plugin options as given.
    ///
    /// # Safety
    /// Each pointer is null or a NUL-terminated string that lives through the call.
    unsafe fn spdk(&self) -> SpdkOptions {
        // SAFETY: the caller's contract.
        let text = |p: *const c_char| {
            unsafe { p.as_ref() }
                .map(|_| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        SpdkOptions {
            hostnqn: text(self.hostnqn).filter(|h| !h.is_empty()),
            print_qid_mappings: self.print_qid_mappings != 0,
            ints: INT_OPTIONS
                .iter()
                .map(|o| (o.0, o.1))
                .chain(ZONE_OPTIONS.iter().map(|&z| (z, 0)))
                .zip(self.spdk_int)
                .map(|((name, default), v)| (name, i64::from(v), default))
                .collect(),
            strs: STR_OPTIONS
                .iter()
                .zip(self.spdk_str)
                .map(|(o, p)| (o.0, text(p)))
                .collect(),
        }
    }
}

impl From<NvmfFioOpts> for EngineOptions {
    fn from(o: NvmfFioOpts) -> Self {
        // SAFETY: the header's contract: strings are NUL-terminated or null, and live
        // through nvmf_fio_thread_new.
        let spdk = unsafe { o.spdk() };
        for n in spdk.notices() {
            say!("{n}");
        }
        Self {
            hostnqn: spdk.hostnqn,
            print_qid_mappings: spdk.print_qid_mappings,
            kato: Duration::from_secs(o.kato_s.into()),
            io_timeout: Duration::from_secs(o.io_timeout_s.max(1).into()),
            reconnect: (o.reconnect_delay_s > 0).then(|| Reconnect {
                delay: Duration::from_secs(o.reconnect_delay_s.into()),
                ctrl_loss_tmo: (o.ctrl_loss_tmo_s > 0)
                    .then(|| Duration::from_secs(o.ctrl_loss_tmo_s.into())),
            }),
            in_capsule_data: o.in_capsule != 0,
            force_copy: o.copy != 0,
            idle: Idle {
                spin: o.idle_spin,
                sleep: Duration::from_micros(o.idle_sleep_us.into()),
            },
        }
    }
}

/// fio's memory for one I/O (`io_u->xfer_buf`, `xfer_buflen`), held while it is in flight.
#[derive(Debug)]
pub struct FioBuf {
    ptr: NonNull<u8>,
    len: usize,
}

impl FioBuf {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, and nothing else may access
    /// them, from now until this value is dropped (fio does not touch an `io_u`'s buffer
    /// while the `io_u` is queued, and the engine drops its `FioBuf` when it reaps it).
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> Option<Self> {
        Some(Self {
            ptr: NonNull::new(ptr)?,
            len,
        })
    }

    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies fio's bytes from `off` on into `dst` (as many as both hold).
    pub fn copy_to(&self, off: usize, dst: &mut [u8]) {
        let n = self.len.saturating_sub(off).min(dst.len());
        if n == 0 {
            return;
        }
        // SAFETY: `new`'s contract makes [ptr, ptr + len) readable and ours; n > 0 makes
        // off < len, and off + n <= len.
        // `dst` is a Rust slice, so it cannot overlap memory nobody else may access.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), n) }
    }

    /// Copies `src` into fio's buffer from `off` on (as many bytes as both hold).
    pub fn copy_from(&self, off: usize, src: &[u8]) {
        let n = self.len.saturating_sub(off).min(src.len());
        if n == 0 {
            return;
        }
        // SAFETY: as in `copy_to`, with the buffer writable.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), n) }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f`, turning an error into `-errno` (message kept for `nvmf_fio_last_error`) and a
/// panic into `-EIO`.
fn guard(what: &str, f: impl FnOnce() -> Result<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&e.msg);
            -e.errno.max(1)
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(&format!("internal error in {what}: {msg}"));
            -libc::EIO
        }
    }
}

/// # Safety
/// `t` is null or a live pointer from `nvmf_fio_thread_new`, used by this OS thread only.
unsafe fn thread<'a>(t: *mut EngineThread) -> Result<&'a mut EngineThread> {
    // SAFETY: the caller's contract.
    unsafe { t.as_mut() }.ok_or_else(|| EngineError::invalid("no engine state (init failed?)"))
}

/// # Safety
/// `s` is null or a NUL-terminated string that lives through the call.
unsafe fn string<'a>(s: *const c_char) -> Result<&'a str> {
    if s.is_null() {
        return Err(EngineError::invalid("no file name"));
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| EngineError::invalid("file name is not UTF-8"))
}

/// # Safety
/// `p` is null or valid for one write of `T`.
unsafe fn put<T>(p: *mut T, v: T) {
    if let Some(p) = NonNull::new(p) {
        // SAFETY: the caller's contract.
        unsafe { p.as_ptr().write(v) }
    }
}

fn log_init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use tracing_subscriber::EnvFilter;
        let filter =
            EnvFilter::try_from_env("NVMF_FIO_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// Engine state for one fio thread; `opts` may be null (defaults). Null on failure.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_thread_new(opts: *const NvmfFioOpts) -> *mut EngineThread {
    let r = catch_unwind(|| {
        log_init();
        // SAFETY: `opts` is null or points to an initialized struct (header contract).
        let opts = unsafe { opts.as_ref() }
            .map_or_else(EngineOptions::default, |o| EngineOptions::from(*o));
        Box::into_raw(Box::new(EngineThread::new(opts)))
    });
    r.unwrap_or_else(|_| {
        set_last_error("internal error creating the engine state");
        std::ptr::null_mut()
    })
}

/// Disconnects the thread's qpairs (and controllers no other thread uses) and frees `t`.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_thread_free(t: *mut EngineThread) {
    if t.is_null() {
        return;
    }
    // SAFETY: `t` came from `nvmf_fio_thread_new` and is not used after this call (header
    // contract), so the Box may take it back.
    let b = unsafe { Box::from_raw(t) };
    if catch_unwind(AssertUnwindSafe(move || drop(b))).is_err() {
        set_last_error("internal error freeing the engine state");
    }
}

/// fio's setup for one file: connects (or reuses) its controller; namespace size in bytes
/// and block size.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_probe(
    t: *mut EngineThread,
    filename: *const c_char,
    size: *mut u64,
    block_size: *mut u32,
) -> c_int {
    guard("probe", || {
        // SAFETY: pointer contract of this module.
        let (t, name) = unsafe { (thread(t)?, string(filename)?) };
        let ns = t.probe(name)?;
        // SAFETY: out pointers are null or writable (header contract).
        unsafe {
            put(size, ns.blocks.saturating_mul(u64::from(ns.block_size)));
            put(block_size, ns.block_size);
        }
        Ok(0)
    })
}

/// fio's init: queue depth and the largest block size of the job.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_init(t: *mut EngineThread, iodepth: u32, max_bs: u64) -> c_int {
    guard("init", || {
        // SAFETY: pointer contract of this module.
        unsafe { thread(t)? }.init(iodepth, max_bs)?;
        Ok(0)
    })
}

/// fio's iomem_alloc: `total` bytes for `units` buffers of `max_bs` (fio's layout); the
/// address goes to `*out`.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_iomem_alloc(
    t: *mut EngineThread,
    total: usize,
    max_bs: u64,
    units: u32,
    mem_align: u32,
    out: *mut *mut c_void,
) -> c_int {
    guard("iomem_alloc", || {
        // SAFETY: pointer contract of this module.
        let base = unsafe { thread(t)? }.iomem_alloc(total, max_bs, units, mem_align)?;
        // SAFETY: `out` is null or writable (header contract).
        unsafe { put(out, base.cast::<c_void>()) };
        Ok(0)
    })
}

/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_iomem_free(t: *mut EngineThread) {
    guard("iomem_free", || {
        // SAFETY: pointer contract of this module.
        unsafe { thread(t)? }.iomem_free();
        Ok(0)
    });
}

/// fio's open_file; the handle for `nvmf_fio_queue` goes to `*handle`, and whether its I/O
/// uses fio's buffers without copying to `*zero_copy`.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_open(
    t: *mut EngineThread,
    filename: *const c_char,
    handle: *mut u32,
    zero_copy: *mut c_int,
) -> c_int {
    guard("open", || {
        // SAFETY: pointer contract of this module.
        let (t, name) = unsafe { (thread(t)?, string(filename)?) };
        let h = t.open(name)?;
        // SAFETY: out pointers are null or writable (header contract).
        unsafe {
            put(handle, h);
            put(zero_copy, c_int::from(t.is_zero_copy(h)));
        }
        Ok(0)
    })
}

/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_close(t: *mut EngineThread, handle: u32) -> c_int {
    guard("close", || {
        // SAFETY: pointer contract of this module.
        unsafe { thread(t)? }.close(handle)?;
        Ok(0)
    })
}

/// fio's queue: `op` is an `NVMF_FIO_OP_*`; `buf`/`len` are `io_u->xfer_buf` and
/// `xfer_buflen`; `tag` comes back from `nvmf_fio_event`. 0: queued; `NVMF_FIO_BUSY`: retry
/// after reaping; negative: failed at once.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_queue(
    t: *mut EngineThread,
    handle: u32,
    op: u32,
    offset: u64,
    buf: *mut c_void,
    len: u64,
    tag: u64,
) -> c_int {
    guard("queue", || {
        // SAFETY: pointer contract of this module.
        let t = unsafe { thread(t)? };
        let op = Op::from_raw(op)
            .ok_or_else(|| EngineError::invalid(format!("unknown operation {op}")))?;
        let data = match op {
            Op::Read | Op::Write => {
                let n =
                    usize::try_from(len).map_err(|_| EngineError::invalid("length too large"))?;
                // SAFETY: fio's io_u buffer is valid for `len` bytes and left alone until the
                // io_u is reaped (header contract); the engine keeps the FioBuf no longer.
                unsafe { FioBuf::new(buf.cast::<u8>(), n) }
            }
            Op::Trim | Op::Flush => None,
        };
        Ok(match t.queue(handle, op, offset, len, data, tag)? {
            Queued::Queued => 0,
            Queued::Busy => NVMF_FIO_BUSY,
        })
    })
}

/// fio's getevents: at least `min` (at most `max`) events, waiting up to `timeout_ns`
/// (negative: no limit). Returns the count.
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_getevents(
    t: *mut EngineThread,
    min: u32,
    max: u32,
    timeout_ns: i64,
) -> c_int {
    guard("getevents", || {
        // SAFETY: pointer contract of this module.
        let t = unsafe { thread(t)? };
        let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
        let n = t.getevents(min, max, timeout);
        Ok(c_int::try_from(n).unwrap_or(c_int::MAX))
    })
}

/// Event `i` of the last getevents: the I/O's tag and errno (0: success).
///
/// # Safety
/// The pointer contract of this module.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_event(
    t: *mut EngineThread,
    i: u32,
    tag: *mut u64,
    err: *mut c_int,
) -> c_int {
    guard("event", || {
        // SAFETY: pointer contract of this module.
        let t = unsafe { thread(t)? };
        let ev = t
            .event(i as usize)
            .ok_or_else(|| EngineError::invalid(format!("no event {i}")))?;
        // SAFETY: out pointers are null or writable (header contract).
        unsafe {
            put(tag, ev.tag);
            put(err, ev.err);
        }
        Ok(0)
    })
}

/// The message of this OS thread's last failed call ("" if none); valid until the next
/// failing call on this thread.
#[no_mangle]
pub extern "C" fn nvmf_fio_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

#[cfg(test)]
impl NvmfFioOpts {
    /// SPDK's defaults for its options (what the shim passes when a job sets none).
    fn spdk_defaults() -> Self {
        let mut spdk_int = [0i32; 21];
        for (slot, o) in spdk_int.iter_mut().zip(INT_OPTIONS) {
            *slot = o.1 as i32;
        }
        Self {
            kato_s: 5,
            io_timeout_s: 30,
            reconnect_delay_s: 0,
            ctrl_loss_tmo_s: 600,
            in_capsule: 1,
            copy: 0,
            idle_spin: 0,
            idle_sleep_us: 0,
            hostnqn: std::ptr::null(),
            print_qid_mappings: 0,
            spdk_int,
            spdk_str: [std::ptr::null(); 3],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::{null, null_mut};

    fn last_error() -> String {
        // SAFETY: the pointer is this thread's current message, NUL-terminated.
        unsafe { CStr::from_ptr(nvmf_fio_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn lifecycle_and_bad_arguments() {
        // SAFETY: every pointer passed below is null, a live local, or the engine state
        // from nvmf_fio_thread_new, used on this thread only, as the module contract asks.
        unsafe {
            let opts = NvmfFioOpts {
                kato_s: 5,
                io_timeout_s: 30,
                reconnect_delay_s: 0,
                ctrl_loss_tmo_s: 600,
                in_capsule: 1,
                copy: 0,
                idle_spin: 0,
                idle_sleep_us: 0,
                ..NvmfFioOpts::spdk_defaults()
            };
            let t = nvmf_fio_thread_new(&opts);
            assert!(!t.is_null());
            assert_eq!(nvmf_fio_init(t, 0, 4096), -libc::EINVAL);
            assert!(last_error().contains("iodepth"), "{}", last_error());
            assert_eq!(nvmf_fio_init(t, 4, 4096), 0);

            let mut size = 7u64;
            assert_eq!(
                nvmf_fio_probe(
                    t,
                    c"traddr=10.0.0.1 nonsense=1".as_ptr(),
                    &mut size,
                    null_mut()
                ),
                -libc::EINVAL
            );
            assert!(last_error().contains("nonsense"), "{}", last_error());
            assert_eq!(size, 7, "untouched on failure");
            assert_eq!(
                nvmf_fio_probe(t, null(), &mut size, null_mut()),
                -libc::EINVAL
            );
            assert_eq!(
                nvmf_fio_probe(null_mut(), c"x".as_ptr(), null_mut(), null_mut()),
                -libc::EINVAL
            );

            // No subnqn=: SPDK's plugin form, which goes to the discovery service first
            // (there is no RDMA device here, so that fails, and says so).
            let mut h = 99u32;
            assert!(
                nvmf_fio_open(
                    t,
                    c"trtype=RDMA traddr=10.0.0.1".as_ptr(),
                    &mut h,
                    null_mut()
                ) < 0
            );
            assert!(
                last_error().contains("discovery at 10.0.0.1:4420"),
                "{}",
                last_error()
            );
            assert_eq!(h, 99);

            let mut buf = [0u8; 4096];
            let p = buf.as_mut_ptr().cast();
            assert_eq!(nvmf_fio_queue(t, 0, 0, 0, p, 4096, 1), -libc::EBADF);
            assert_eq!(nvmf_fio_queue(t, 0, 9, 0, p, 4096, 1), -libc::EINVAL);
            assert_eq!(nvmf_fio_close(t, 0), -libc::EBADF);
            assert_eq!(nvmf_fio_getevents(t, 0, 4, 0), 0);
            assert_eq!(
                nvmf_fio_getevents(t, 1, 4, -1),
                0,
                "nothing in flight: returns at once"
            );
            assert_eq!(nvmf_fio_event(t, 0, null_mut(), null_mut()), -libc::EINVAL);

            let mut mem = null_mut();
            assert_eq!(
                nvmf_fio_iomem_alloc(t, 4 * 4096 + 4095, 4096, 4, 0, &mut mem),
                0
            );
            assert!(!mem.is_null());
            assert_eq!(mem as usize % 4096, 0);
            // The memory is fio's to use.
            // SAFETY: the engine just allocated at least this many bytes at `mem`.
            std::ptr::write_bytes(mem.cast::<u8>(), 0xA5, 4 * 4096 + 4095);
            nvmf_fio_iomem_free(t);

            nvmf_fio_thread_free(t);
            nvmf_fio_thread_free(null_mut());
            let t = nvmf_fio_thread_new(null());
            assert!(!t.is_null());
            nvmf_fio_thread_free(t);
        }
    }

    #[test]
    fn fio_buffers_copy_both_ways() {
        let mut mem = vec![1u8, 2, 3, 4];
        {
            // SAFETY: `mem` outlives `b` and is not touched while `b` is used.
            let b = unsafe { FioBuf::new(mem.as_mut_ptr(), 3) }.unwrap();
            let mut out = [0u8; 8];
            b.copy_to(0, &mut out);
            assert_eq!(out, [1, 2, 3, 0, 0, 0, 0, 0]);
            let mut out = [0u8; 8];
            b.copy_to(1, &mut out);
            assert_eq!(out, [2, 3, 0, 0, 0, 0, 0, 0], "from an offset");
            b.copy_to(3, &mut out);
            b.copy_to(7, &mut out);
            assert_eq!(out, [2, 3, 0, 0, 0, 0, 0, 0], "nothing past the end");
            b.copy_from(0, &[9, 9, 9, 9, 9]);
            b.copy_from(2, &[7, 7]);
            b.copy_from(5, &[6]);
        }
        assert_eq!(mem, [9, 9, 7, 4], "only len bytes are written");
        // SAFETY: null is refused before any access.
        assert!(unsafe { FioBuf::new(null_mut(), 8) }.is_none());
    }

    #[test]
    fn options_from_c() {
        let o = EngineOptions::from(NvmfFioOpts {
            kato_s: 0,
            io_timeout_s: 0,
            reconnect_delay_s: 2,
            ctrl_loss_tmo_s: 0,
            in_capsule: 0,
            copy: 1,
            idle_spin: 100,
            idle_sleep_us: 20,
            ..NvmfFioOpts::spdk_defaults()
        });
        assert!(o.kato.is_zero());
        assert_eq!(o.io_timeout, Duration::from_secs(1));
        let r = o.reconnect.unwrap();
        assert_eq!(r.delay, Duration::from_secs(2));
        assert_eq!(r.ctrl_loss_tmo, None, "0: retry forever");
        assert!(!o.in_capsule_data && o.force_copy);
        assert_eq!(
            o.idle,
            Idle {
                spin: 100,
                sleep: Duration::from_micros(20)
            }
        );
    }

    #[test]
    fn spdk_options_from_c() {
        let host = CString::new("nqn.2014-08.org.nvmexpress:uuid:h").unwrap();
        let digest = CString::new("HEADER").unwrap();
        let mut c = NvmfFioOpts::spdk_defaults();
        c.hostnqn = host.as_ptr();
        c.print_qid_mappings = 1;
        c.spdk_int[9] = 1; // enable_sgl
        c.spdk_str[1] = digest.as_ptr();
        // SAFETY: the strings live through the call.
        let s = unsafe { c.spdk() };
        assert_eq!(
            s.hostnqn.as_deref(),
            Some("nqn.2014-08.org.nvmexpress:uuid:h")
        );
        assert!(s.print_qid_mappings);
        let n = s.notices();
        assert_eq!(n.len(), 2, "{n:#?}");
        assert!(n[0].starts_with("enable_sgl=1"));
        assert!(n[1].starts_with("digest_enable=HEADER"));
        let o = EngineOptions::from(c);
        assert_eq!(
            o.hostnqn.as_deref(),
            Some("nqn.2014-08.org.nvmexpress:uuid:h")
        );
        assert!(o.print_qid_mappings);
        // SAFETY: as above.
        assert!(unsafe { NvmfFioOpts::spdk_defaults().spdk() }
            .notices()
            .is_empty());
    }
}

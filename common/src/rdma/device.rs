//! RDMA devices and their verbs contexts: listing, opening, and the `query_*` verbs.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::error::{errno_from_ret, last_errno, RdmaError, Result};
use super::sys;

/// The transport a device speaks (`enum ibv_transport_type`). Soft-RoCE (rxe) reports
/// `InfiniBand`: RoCE is the InfiniBand transport over Ethernet link layer (see
/// [`PortAttr::link_layer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Unknown,
    InfiniBand,
    Iwarp,
    Usnic,
    UsnicUdp,
    Unspecified,
    /// A value this crate does not know.
    Other(i32),
}

impl Transport {
    fn from_raw(raw: i32) -> Self {
        use sys::ibv_transport_type as t;
        match raw {
            t::IBV_TRANSPORT_UNKNOWN => Self::Unknown,
            t::IBV_TRANSPORT_IB => Self::InfiniBand,
            t::IBV_TRANSPORT_IWARP => Self::Iwarp,
            t::IBV_TRANSPORT_USNIC => Self::Usnic,
            t::IBV_TRANSPORT_USNIC_UDP => Self::UsnicUdp,
            t::IBV_TRANSPORT_UNSPECIFIED => Self::Unspecified,
            other => Self::Other(other),
        }
    }
}

/// A device as `ibv_get_device_list` reports it, without opening it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `rxe0` or `mlx5_0`.
    pub name: String,
    /// Node GUID in host byte order.
    pub node_guid: u64,
    pub transport: Transport,
}

/// Entry point for device discovery.
pub struct Device;

impl Device {
    /// Lists the RDMA devices of this host. A host without RDMA support (no `ib_uverbs`
    /// module, no devices) yields an empty list rather than an error.
    pub fn list() -> Result<Vec<DeviceInfo>> {
        let list = DeviceList::get()?;
        Ok(list.iter().map(device_info).collect())
    }
}

/// Whether libibverbs lists no device at all: a list came back, empty (a failed listing is
/// not that).
pub(crate) fn no_device_listed() -> bool {
    DeviceList::get().is_ok_and(|l| !l.raw.is_null() && l.len == 0)
}

/// Owned result of `ibv_get_device_list`, freed on drop.
struct DeviceList {
    raw: *mut *mut sys::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the call has no other preconditions.
        let raw = unsafe { sys::ibv_get_device_list(&mut n) };
        if raw.is_null() {
            let err = last_errno();
            // No kernel support (ENOSYS) or no devices (ENODEV) is the ordinary state of a
            // host without RDMA, not a failure.
            return match err.raw_os_error() {
                Some(libc::ENOSYS) | Some(libc::ENODEV) | Some(libc::ENOENT) => {
                    Ok(Self { raw, len: 0 })
                }
                _ => Err(RdmaError::GetDeviceList(err)),
            };
        }
        Ok(Self {
            raw,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn iter(&self) -> impl Iterator<Item = *mut sys::ibv_device> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: `raw` holds `len` device pointers (plus a NULL terminator) and lives as
            // long as `self`.
            unsafe { *self.raw.add(i) }
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: `raw` came from `ibv_get_device_list` and is freed exactly once. Contexts
            // opened from its devices stay valid after the list is freed (libibverbs keeps
            // device structs referenced while a context is open).
            unsafe { sys::ibv_free_device_list(self.raw) };
        }
    }
}

fn device_info(dev: *mut sys::ibv_device) -> DeviceInfo {
    // SAFETY: `dev` is a live element of a device list; `ibv_get_device_name` returns a
    // NUL-terminated string inside the device struct, which outlives this call.
    let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above; the GUID is read from sysfs-backed data of the device.
    let guid = unsafe { sys::ibv_get_device_guid(dev) };
    // SAFETY: `dev` points to a valid `ibv_device`; `transport_type` is a plain field.
    let transport = unsafe { (*dev).transport_type };
    DeviceInfo {
        name,
        node_guid: u64::from_be(guid),
        transport: Transport::from_raw(transport),
    }
}

/// Formats a GUID the way `ibv_devices` does (`0002:c903:0031:7e32`).
pub fn format_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// How a [`Context`] is released.
enum ContextOwner {
    /// Opened by us with `ibv_open_device`; closed on drop.
    Opened,
    /// One of librdmacm's shared contexts, pinned by a reference of its own.
    Cm(#[allow(dead_code)] CmDevicePin),
}

/// One reference on librdmacm's context of one device. librdmacm opens one context per
/// device and uses it for every CM id and QP on that device; it closes the context of a
/// removed device once nothing references it, and only then can the kernel finish the
/// removal (with rxe, `rdma link delete` waits for it). This reference keeps the context
/// open while we hold PDs or CQs on it, and pins that device alone: a context that pinned
/// every device would keep a removed one open for as long as any other is in use.
///
/// librdmacm counts references through `rdma_get_devices`, which takes one on every
/// device, and `rdma_free_devices`, which gives back one for each context in the array it
/// is passed and frees that array. So the list is split: each pin owns an array of its one
/// context (allocated with `malloc`, as librdmacm's own), the list's array is freed alone.
///
/// librdmacm notices a removal only when it lists the devices, and it stops before it
/// compares when none is left: the machine's last device would stay open until the process
/// exits. So the last of our pins on a context closes the context's descriptors itself once
/// the device is gone (see [`PinBook`]).
pub(crate) struct CmDevicePin {
    ctx: NonNull<sys::ibv_context>,
    /// `[ctx, NULL]`, from `malloc`.
    array: NonNull<*mut sys::ibv_context>,
}

// SAFETY: the pin is an immutable two-entry array; librdmacm guards its reference counts
// with its own mutex, so dropping a pin from any thread is fine.
unsafe impl Send for CmDevicePin {}
// SAFETY: shared access reads nothing.
unsafe impl Sync for CmDevicePin {}

impl CmDevicePin {
    /// A pin on each device librdmacm knows now.
    fn all() -> Result<Vec<Self>> {
        // Held until the pins are counted: a context whose last pin is being given back is
        // not handed out again halfway.
        let mut book = PINS.lock().unwrap_or_else(|e| e.into_inner());
        book.settle_parked();
        let counts = &mut book.counts;
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| RdmaError::GetCmDevices(last_errno()))?;
        let len = usize::try_from(n).unwrap_or(0);
        let mut arrays = Vec::with_capacity(len);
        for _ in 0..len {
            // SAFETY: a plain allocation of two pointers, checked for NULL below.
            let a = unsafe { libc::malloc(2 * std::mem::size_of::<*mut sys::ibv_context>()) };
            match NonNull::new(a.cast::<*mut sys::ibv_context>()) {
                Some(a) => arrays.push(a),
                None => {
                    for a in arrays {
                        // SAFETY: allocated above with malloc, never handed out.
                        unsafe { libc::free(a.as_ptr().cast()) };
                    }
                    // SAFETY: the list came from `rdma_get_devices`; released once.
                    unsafe { sys::rdma_free_devices(list.as_ptr()) };
                    return Err(RdmaError::GetCmDevices(std::io::Error::from_raw_os_error(
                        libc::ENOMEM,
                    )));
                }
            }
        }
        let mut pins = Vec::with_capacity(len);
        for (i, array) in arrays.into_iter().enumerate() {
            // SAFETY: the list holds `len` context pointers (then NULL); `array` has room
            // for two.
            let ctx = unsafe {
                let ctx = *list.as_ptr().add(i);
                array.as_ptr().write(ctx);
                array.as_ptr().add(1).write(std::ptr::null_mut());
                ctx
            };
            match NonNull::new(ctx) {
                Some(ctx) => {
                    *counts.entry(ctx.as_ptr() as usize).or_default() += 1;
                    pins.push(Self { ctx, array })
                }
                // SAFETY: allocated above with malloc; a NULL entry holds no reference.
                None => unsafe { libc::free(array.as_ptr().cast()) },
            }
        }
        // SAFETY: every reference the list took now belongs to one pin; its array alone is
        // freed (`rdma_free_devices` would give the references back).
        unsafe { libc::free(list.as_ptr().cast()) };
        Ok(pins)
    }
}

impl Drop for CmDevicePin {
    fn drop(&mut self) {
        let mut book = PINS.lock().unwrap_or_else(|e| e.into_inner());
        let key = self.ctx.as_ptr() as usize;
        match book.counts.get_mut(&key) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                book.counts.remove(&key);
                // SAFETY: this pin's reference keeps the context open.
                let device = unsafe { self.ctx.as_ref() }.device;
                // Its verbs node gone and the device unlisted: it is going, and the kernel
                // waits for us. Nothing else may look at the list for a while (an initiator
                // whose controller just failed), so it is let go now. (The list is read only
                // when the node is gone: a pin given back on a live device costs a `stat`.)
                let gone = uverbs_node(device) == Some(false)
                    && DeviceList::get().is_ok_and(|list| !is_listed(&list, device));
                if gone {
                    let parked = Parked {
                        ctx: self.ctx,
                        array: self.array,
                    };
                    // SAFETY: as in `PinBook::settle_parked`: our last pin on the context.
                    unsafe { parked.sever_and_give_back() };
                    return;
                }
                // The last: kept until the device list is next looked at (see `PinBook`).
                book.parked.push(Parked {
                    ctx: self.ctx,
                    array: self.array,
                });
                return;
            }
        }
        // SAFETY: `array` is a malloc'd, NULL-terminated array holding one context that
        // `rdma_get_devices` took a reference on; librdmacm gives it back and frees the
        // array, exactly once.
        unsafe { sys::rdma_free_devices(self.array.as_ptr()) };
    }
}

/// This process's pins on librdmacm's contexts.
///
/// The last pin on a context of a device already going (unlisted, its verbs node gone) severs
/// it at once. Any other last pin is not given back at once but parked until the device list
/// is next looked at ([`CmDevicePin::all`], which the device checks call), and then:
/// - a device still listed: given back;
/// - a device no longer listed whose verbs node is gone: its context severed ([`sever`]),
///   then given back. librdmacm would close it itself only if some device were left to
///   list, so the machine's last device would stay open until the process exits;
/// - a device no longer listed whose verbs node is still there (and no listed device has
///   taken its number): kept. The kernel takes a device out of the list first and its verbs
///   node only later, when its verbs client's turn comes; the context is looked at again next
///   time, so a removal in that window still ends.
///
/// Devices are matched by name and verbs node, not by pointer: libibverbs makes a new struct
/// for a device one listing missed.
///
/// Listing once per look, not once per pin, also keeps connection set-up (which pins every
/// device and drops all but one) from scanning the devices once per device.
struct PinBook {
    /// Pins held, by context address.
    counts: BTreeMap<usize, usize>,
    parked: Vec<Parked>,
}

/// A last pin given back, holding its reference until the list is looked at.
struct Parked {
    ctx: NonNull<sys::ibv_context>,
    array: NonNull<*mut sys::ibv_context>,
}

// SAFETY: a parked pin is the same two pointers as a `CmDevicePin`, which is `Send`; it is
// only touched under the `PINS` lock.
unsafe impl Send for Parked {}

static PINS: Mutex<PinBook> = Mutex::new(PinBook {
    counts: BTreeMap::new(),
    parked: Vec::new(),
});

impl PinBook {
    /// Decides each parked pin (see [`PinBook`]) with one look at the device list.
    fn settle_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        // A failed listing decides nothing: every parked pin waits for the next look.
        let Ok(list) = DeviceList::get() else {
            return;
        };
        let parked = std::mem::take(&mut self.parked);
        for p in parked {
            // SAFETY: the parked pin's reference keeps the context open.
            let device = unsafe { p.ctx.as_ref() }.device;
            let pinned_again = self.counts.contains_key(&(p.ctx.as_ptr() as usize));
            if pinned_again || is_listed(&list, device) {
                // SAFETY: as in `CmDevicePin::drop`: the array is given back exactly once.
                unsafe { sys::rdma_free_devices(p.array.as_ptr()) };
                continue;
            }
            // A node another listed device now has (the kernel frees the number before it
            // waits for us) is not this device's.
            let node_taken = list.iter().any(|d| verbs_path(d) == verbs_path(device));
            if uverbs_node(device) == Some(true) && !node_taken {
                self.parked.push(p);
                continue;
            }
            // SAFETY: the parked pin still holds librdmacm's reference, so the context and
            // its descriptors are open; no pin of this process is on it, so nothing of ours
            // has objects on it (each holds its context's pin).
            unsafe { p.sever_and_give_back() };
        }
    }
}

impl Parked {
    /// Severs the context ([`sever`]) and gives the reference back.
    ///
    /// # Safety
    ///
    /// The device is going and this is the process's last pin on the context: nothing of
    /// ours has objects on it.
    unsafe fn sever_and_give_back(self) {
        // SAFETY: the reference keeps the context open.
        let device = unsafe { self.ctx.as_ref() }.device;
        tracing::info!(device = %device_info(device).name, "RDMA device removed: closing librdmacm's context of it");
        // SAFETY: the caller's promise; the context is open.
        unsafe { sever(self.ctx) };
        // SAFETY: as in `CmDevicePin::drop`: the array is given back exactly once.
        unsafe { sys::rdma_free_devices(self.array.as_ptr()) };
    }
}

/// The device's verbs node path (`/sys/class/infiniband_verbs/uverbsN`), empty if unknown.
fn verbs_path<'a>(device: *mut sys::ibv_device) -> &'a CStr {
    // SAFETY: `device` is a live device struct (a list or an open context references it);
    // `dev_path` is a NUL-terminated array inside it.
    unsafe { CStr::from_ptr((*device).dev_path.as_ptr()) }
}

/// Whether `list` holds `device`: by name and verbs node, not by pointer (libibverbs makes a
/// new struct for a device one listing missed).
fn is_listed(list: &DeviceList, device: *mut sys::ibv_device) -> bool {
    let name = device_info(device).name;
    list.iter()
        .any(|d| verbs_path(d) == verbs_path(device) && device_info(d).name == name)
}

/// Whether the device's verbs node (`/sys/class/infiniband_verbs/uverbsN`) is still there
/// (`None`: its path is unknown): the kernel takes it away when the device goes, just before
/// it waits for the device's users. A second witness beside the listing, so a device a
/// listing merely missed is never cut off.
fn uverbs_node(device: *mut sys::ibv_device) -> Option<bool> {
    let path = verbs_path(device);
    (!path.is_empty()).then(|| std::path::Path::new(&*path.to_string_lossy()).exists())
}

/// Closes what keeps a removed device's verbs context open in the kernel: its command and
/// event descriptors. Each is replaced by a pipe's read end with no writer, so the numbers
/// stay librdmacm's to close later (no other file can take them meanwhile), and a verb
/// still sent on it fails (EBADF or ENOTTY) instead of reaching anything. The kernel then
/// destroys what the context held and lets the removal finish (rxe waits for it: it cannot
/// take resources back from a process).
///
/// # Safety
///
/// `ctx` is an open context whose objects are all destroyed: a mapping of one (a queue)
/// would still hold the device, and using one afterwards fails.
unsafe fn sever(ctx: NonNull<sys::ibv_context>) {
    let mut ends = [-1; 2];
    // SAFETY: `ends` has room for the two descriptors.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        tracing::warn!(err = %last_errno(), "pipe2 failed: the removed device's context stays open");
        return;
    }
    let [read_end, write_end] = ends;
    // SAFETY: our own descriptors, each closed once.
    unsafe { libc::close(write_end) };
    // SAFETY: the caller guarantees `ctx` is open; the fields are plain descriptors.
    let (cmd_fd, async_fd) = unsafe { ((*ctx.as_ptr()).cmd_fd, (*ctx.as_ptr()).async_fd) };
    for fd in [cmd_fd, async_fd] {
        // SAFETY: `fd` is the context's own open descriptor: `dup3` closes it and puts the
        // pipe's end in its place atomically.
        if fd >= 0 && unsafe { libc::dup3(read_end, fd, libc::O_CLOEXEC) } < 0 {
            tracing::warn!(fd, err = %last_errno(), "dup3 failed: the removed device's context stays open");
        }
    }
    // SAFETY: our own descriptor; the copies made above stay open.
    unsafe { libc::close(read_end) };
}

/// An open verbs context (`struct ibv_context`): the root every other verbs object hangs off.
///
/// Connections made through RDMA CM live on librdmacm's own context for the device, and a
/// QP's PD and CQs must come from that same context. Get it with
/// [`CmId::context`](super::cm::CmId::context) or [`Context::cm_devices`]; use
/// [`Context::open`] only for verbs work without RDMA CM.
pub struct Context {
    raw: NonNull<sys::ibv_context>,
    owner: ContextOwner,
    /// Whether the async event descriptor was made non-blocking (see `async_event::poll`).
    async_nonblocking: std::sync::atomic::AtomicBool,
}

// SAFETY: libibverbs contexts are thread-safe: all verbs on a context may be called from any
// thread concurrently.
unsafe impl Send for Context {}
// SAFETY: see `Send`.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name` (e.g. `rxe0`) with `ibv_open_device`.
    pub fn open(name: &str) -> Result<Arc<Self>> {
        let list = DeviceList::get()?;
        let dev = list
            .iter()
            .find(|&d| device_info(d).name == name)
            .ok_or_else(|| RdmaError::DeviceNotFound(name.to_owned()))?;
        // SAFETY: `dev` is an element of a live device list.
        let raw = unsafe { sys::ibv_open_device(dev) };
        let raw = NonNull::new(raw).ok_or_else(|| RdmaError::OpenDevice(last_errno()))?;
        Ok(Arc::new(Self {
            raw,
            owner: ContextOwner::Opened,
            async_nonblocking: Default::default(),
        }))
    }

    /// The contexts librdmacm uses for every RDMA device, so a listener can allocate PDs,
    /// CQs and SRQs before the first connection arrives.
    pub fn cm_devices() -> Result<Vec<Arc<Self>>> {
        Ok(CmDevicePin::all()?
            .into_iter()
            .map(|pin| {
                Arc::new(Self {
                    raw: pin.ctx,
                    owner: ContextOwner::Cm(pin),
                    async_nonblocking: Default::default(),
                })
            })
            .collect())
    }

    /// Wraps the librdmacm context `raw` (a CM id's `verbs`), pinning it.
    pub(crate) fn from_cm_verbs(raw: *mut sys::ibv_context) -> Result<Arc<Self>> {
        let raw = NonNull::new(raw).ok_or(RdmaError::NoDevice)?;
        // The other devices' pins are given back as they drop.
        let pin = CmDevicePin::all()?
            .into_iter()
            .find(|p| p.ctx == raw)
            .ok_or(RdmaError::NoDevice)?;
        Ok(Arc::new(Self {
            raw,
            owner: ContextOwner::Cm(pin),
            async_nonblocking: Default::default(),
        }))
    }

    /// Whether libibverbs still lists this context's device; `None` if it cannot list.
    pub fn still_listed(&self) -> Option<bool> {
        // SAFETY: an open context always points at its device.
        let device = unsafe { self.raw.as_ref() }.device;
        // No list at all (libibverbs could not look) says nothing either way.
        let list = DeviceList::get().ok().filter(|l| !l.raw.is_null())?;
        Some(is_listed(&list, device))
    }

    pub(crate) fn async_fd_nonblocking(&self) -> bool {
        self.async_nonblocking
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn set_async_fd_nonblocking(&self) {
        self.async_nonblocking
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The next asynchronous event of the device, without blocking.
    pub fn poll_async_event(&self) -> Result<Option<super::async_event::AsyncEvent>> {
        super::async_event::poll(self)
    }

    /// The raw context, for verbs this crate does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }

    /// Name and GUID of the device this context is open on.
    pub fn device(&self) -> DeviceInfo {
        // SAFETY: an open context always points at its device.
        device_info(unsafe { self.raw.as_ref() }.device)
    }

    /// Whether this is Linux's software RoCE (rxe): by its vendor id, or by the name
    /// `rdma link add` gives it by convention. Both ends of the product work around its
    /// quirks (see the callers).
    pub fn is_soft_roce(&self) -> bool {
        self.device().name.starts_with("rxe")
            || self
                .query_device()
                .is_ok_and(|a| a.vendor_id == RXE_VENDOR_ID)
    }

    /// `ibv_query_device`: the device's limits and capabilities.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: the context is open and `attr` is a writable `ibv_device_attr`.
        let ret = unsafe { sys::ibv_query_device(self.as_raw(), attr.as_mut_ptr()) };
        if ret != 0 {
            return Err(RdmaError::QueryDevice(errno_from_ret(ret)));
        }
        // SAFETY: zero-initialized plain C data, filled by the successful call.
        Ok(DeviceAttr::from_raw(unsafe { &attr.assume_init() }))
    }

    /// `ibv_query_port` for `port` (ports count from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: the context is open; `attr` is a zeroed `ibv_port_attr` (the inline
        // `ibv_query_port` of verbs.h, which this port of it mirrors, expects the caller's
        // full-size struct and passes its size to the provider).
        let ret = unsafe { sys::___ibv_query_port(self.as_raw(), port, attr.as_mut_ptr()) };
        if ret != 0 {
            return Err(RdmaError::QueryPort(errno_from_ret(ret)));
        }
        // SAFETY: zero-initialized plain C data, filled by the successful call.
        Ok(PortAttr::from_raw(unsafe { &attr.assume_init() }))
    }

    /// `ibv_query_gid`: entry `index` of `port`'s GID table.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let index = libc::c_int::try_from(index)
            .map_err(|_| RdmaError::InvalidArgument("GID index out of range"))?;
        let mut gid = sys::ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open and `gid` is a writable 16-byte `ibv_gid`.
        let ret = unsafe { sys::ibv_query_gid(self.as_raw(), port, index, &mut gid) };
        if ret != 0 {
            return Err(RdmaError::QueryGid(errno_from_ret(ret)));
        }
        // SAFETY: every bit pattern is a valid `[u8; 16]`.
        Ok(Gid(unsafe { gid.raw }))
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device().name)
            .field("raw", &self.raw)
            .field("cm_owned", &matches!(self.owner, ContextOwner::Cm(_)))
            .finish()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let ContextOwner::Opened = self.owner {
            // SAFETY: we opened this context and every child object holds an `Arc` of it, so
            // none is left; it is closed exactly once.
            let ret = unsafe { sys::ibv_close_device(self.raw.as_ptr()) };
            if ret != 0 {
                tracing::warn!(ret, "ibv_close_device failed");
            }
        }
    }
}

/// Device capability bits (`enum ibv_device_cap_flags`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DeviceCapFlags(pub u32);

impl DeviceCapFlags {
    pub const RC_RNR_NAK_GEN: Self = Self(1 << 12);
    pub const SRQ_RESIZE: Self = Self(1 << 13);
    pub const MEM_WINDOW: Self = Self(1 << 17);
    /// Send with invalidate, local invalidate and fast registration work requests.
    pub const MEM_MGT_EXTENSIONS: Self = Self(1 << 21);
    pub const MEM_WINDOW_TYPE_2A: Self = Self(1 << 23);
    pub const MEM_WINDOW_TYPE_2B: Self = Self(1 << 24);

    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl fmt::Debug for DeviceCapFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceCapFlags({:#x})", self.0)
    }
}

/// The vendor id rxe reports (`RXE_VENDOR_ID` in the kernel's rxe_param.h).
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// The fields of `ibv_device_attr` the target and initiator size their queues by.
#[derive(Clone, Debug)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub max_mr_size: u64,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: DeviceCapFlags,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    /// Incoming RDMA READs a QP can serve at once (responder resources).
    pub max_qp_rd_atom: u32,
    /// Outgoing RDMA READs a QP can have in flight (initiator depth).
    pub max_qp_init_rd_atom: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub phys_port_cnt: u8,
}

fn count(v: libc::c_int) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

impl DeviceAttr {
    /// Type 2 memory windows ([`Verbs::alloc_mw`](super::verbs::Verbs::alloc_mw)) and the
    /// invalidation verbs that revoke their keys (local invalidate, SEND_WITH_INVALIDATE):
    /// what per-command keys need.
    pub fn has_type2_windows(&self) -> bool {
        let caps = self.device_cap_flags;
        caps.contains(DeviceCapFlags::MEM_MGT_EXTENSIONS)
            && (caps.contains(DeviceCapFlags::MEM_WINDOW_TYPE_2B)
                || caps.contains(DeviceCapFlags::MEM_WINDOW_TYPE_2A))
    }

    fn from_raw(a: &sys::ibv_device_attr) -> Self {
        let fw: Vec<u8> = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Self {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            max_mr_size: a.max_mr_size,
            max_qp: count(a.max_qp),
            max_qp_wr: count(a.max_qp_wr),
            device_cap_flags: DeviceCapFlags(a.device_cap_flags),
            max_sge: count(a.max_sge),
            max_sge_rd: count(a.max_sge_rd),
            max_cq: count(a.max_cq),
            max_cqe: count(a.max_cqe),
            max_mr: count(a.max_mr),
            max_pd: count(a.max_pd),
            max_qp_rd_atom: count(a.max_qp_rd_atom),
            max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
            max_srq: count(a.max_srq),
            max_srq_wr: count(a.max_srq_wr),
            max_srq_sge: count(a.max_srq_sge),
            phys_port_cnt: a.phys_port_cnt,
        }
    }
}

/// Logical port state (`enum ibv_port_state`); an open set of values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PortState(pub u32);

impl PortState {
    pub const NOP: Self = Self(0);
    pub const DOWN: Self = Self(1);
    pub const INIT: Self = Self(2);
    pub const ARMED: Self = Self(3);
    pub const ACTIVE: Self = Self(4);
    pub const ACTIVE_DEFER: Self = Self(5);
}

impl fmt::Debug for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            Self::NOP => "NOP",
            Self::DOWN => "DOWN",
            Self::INIT => "INIT",
            Self::ARMED => "ARMED",
            Self::ACTIVE => "ACTIVE",
            Self::ACTIVE_DEFER => "ACTIVE_DEFER",
            Self(v) => return write!(f, "PortState({v})"),
        };
        f.write_str(name)
    }
}

/// Path MTU (`enum ibv_mtu`: 1 = 256 bytes ... 5 = 4096 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mtu(pub u32);

impl Mtu {
    /// The MTU in bytes, or `None` for a value outside 1..=5.
    pub fn bytes(self) -> Option<u32> {
        (1..=5).contains(&self.0).then(|| 128 << self.0)
    }
}

/// Link layer of a port: RoCE and iWARP run over Ethernet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    Unspecified,
    InfiniBand,
    Ethernet,
    Other(u8),
}

impl LinkLayer {
    fn from_raw(raw: u8) -> Self {
        // Values of the anonymous `IBV_LINK_LAYER_*` enum in verbs.h.
        match raw {
            0 => Self::Unspecified,
            1 => Self::InfiniBand,
            2 => Self::Ethernet,
            v => Self::Other(v),
        }
    }
}

/// The fields of `ibv_port_attr` we use.
#[derive(Clone, Debug)]
pub struct PortAttr {
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub max_msg_sz: u32,
    pub lid: u16,
    pub link_layer: LinkLayer,
}

impl PortAttr {
    fn from_raw(a: &sys::ibv_port_attr) -> Self {
        Self {
            state: PortState(a.state),
            max_mtu: Mtu(a.max_mtu),
            active_mtu: Mtu(a.active_mtu),
            gid_tbl_len: count(a.gid_tbl_len),
            max_msg_sz: a.max_msg_sz,
            lid: a.lid,
            link_layer: LinkLayer::from_raw(a.link_layer),
        }
    }
}

/// A 128-bit GID as stored on the wire (network byte order). On RoCE v2 this is an IPv6 or
/// IPv4-mapped address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"))
    }

    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::net::Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_works_without_hardware() {
        // Possibly empty; it must not fail just because the host has no RDMA device.
        let devices = Device::list().expect("device list");
        for d in &devices {
            assert!(!d.name.is_empty());
        }
    }

    #[test]
    fn open_unknown_device_is_not_found() {
        match Context::open("no-such-device-xyz") {
            Err(RdmaError::DeviceNotFound(name)) => assert_eq!(name, "no-such-device-xyz"),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("opened a device that does not exist"),
        }
    }

    #[test]
    fn guid_and_mtu_formatting() {
        assert_eq!(format_guid(0x0002_c903_0031_7e32), "0002:c903:0031:7e32");
        assert_eq!(Mtu(3).bytes(), Some(1024));
        assert_eq!(Mtu(5).bytes(), Some(4096));
        assert_eq!(Mtu(0).bytes(), None);
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = 1;
        assert_eq!(Gid(g).to_string(), "fe80::1");
        assert_eq!(Gid(g).subnet_prefix(), 0xfe80_0000_0000_0000);
    }
}

//! A controller association: the admin queue with its bring-up (in the Linux host's order),
//! keep-alive, asynchronous events, reconnect, and the I/O queue pairs it hands out.
//!
//! # Threads
//!
//! The [`Controller`] lives on one thread, which calls [`Controller::poll_admin`] every few
//! milliseconds (keep-alive, AER completions, reconnect). Each [`IoQpair`] moves to its own
//! polling thread. They share a small block of atomics (state, generation, CNTLID): an I/O
//! qpair that sees the generation change tears its connection down and, once the admin side
//! is live again, reconnects on its own thread. A broken I/O qpair asks the admin side for a
//! controller reset through the same block. No lock is taken on the I/O path.
//!
//! # Reconnect
//!
//! As the Linux host's `--reconnect-delay` / `--ctrl-loss-tmo`: after a failure (a queue
//! error, a disconnect, a command or keep-alive timeout) every queue is torn down; the admin
//! queue is re-established every `delay` until `ctrl_loss_tmo` has passed since the loss, then
//! the controller fails for good. Outstanding I/O is kept and resubmitted after the reconnect
//! (a command that timed out is retried too, at most [`MAX_RETRIES`] times, then fails with
//! [`IoStatus::Timeout`]). Without [`Reconnect`] the first failure is final and outstanding
//! I/O fails at once.
//!
//! # Verbs provider
//!
//! A controller and its qpairs are generic over the verbs provider `V` ([`Verbs`]), with the
//! real verbs ([`RealVerbs`]) as the default: [`Controller::connect`] and
//! [`Controller::connect_with_pd`] connect over them, [`Controller::connect_with`] and
//! [`Controller::connect_with_pd_using`] over any provider. Every deadline, timeout,
//! keep-alive, reconnect delay and idle wait is on the provider's clock ([`Verbs::now`],
//! [`Verbs::sleep`]), so a simulated fabric can run them in virtual time. Memory windows
//! are the provider's too ([`Verbs::alloc_mw`]): used wherever the device reports type 2
//! windows (see [`MemoryWindows`]).
//!
//! [`MAX_RETRIES`]: crate::qpair::MAX_RETRIES

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_common::buffer::BufferPool;
use nvmf_common::rdma::{
    register_pool, AccessFlags, ProtectionDomain, RealVerbs, Verbs, VerbsContext, VerbsPd,
};
use nvmf_common::spec::features::{
    parse_async_event_dw0, NumberOfQueues, AEC_ANA_CHANGE, AEC_NAMESPACE_ATTRIBUTE,
};
use nvmf_common::spec::identify::{CMIC_ANA, SGLS_OFFSET};
use nvmf_common::spec::sgl::KEYED_MAX_LENGTH;
use nvmf_common::spec::{
    AsyncEventType, AsyncNotice, Cap, Cns, Command, Completion, FeatureId, IdentifyController,
    IdentifyNamespace, LogPageId, Version,
};
use zerocopy::FromBytes;

use crate::address::TransportId;
use crate::error::{Error, Result};
use crate::host::HostIdentity;
use crate::multipath::{AnaLog, AnaState, NamespaceIds, ANA_GROUP_DESC_LEN, ANA_LOG_HEADER_LEN};
use crate::qpair::{IoQpair, IoStatus};
use crate::transport::device_has_windows;

mod admin;

pub(crate) use admin::connect_error;
use admin::{bring_up, shutdown, Admin, AdminData};

/// Admin queue entries, as Linux (`NVME_AQ_DEPTH`).
pub const ADMIN_QUEUE_DEPTH: u16 = 32;
/// Bytes of the admin queue's registered data buffer; longer transfers are split.
const ADMIN_DATA_LEN: usize = 64 * 1024;

/// Reconnect policy (nvme-cli's `--reconnect-delay` and `--ctrl-loss-tmo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconnect {
    /// Time between attempts (the first one comes `delay` after the loss).
    pub delay: Duration,
    /// Give up this long after the loss; `None` retries forever (`--ctrl-loss-tmo -1`).
    pub ctrl_loss_tmo: Option<Duration>,
}

impl Default for Reconnect {
    /// Linux's defaults: every 10 s, for 600 s.
    fn default() -> Self {
        Self {
            delay: Duration::from_secs(10),
            ctrl_loss_tmo: Some(Duration::from_secs(600)),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Host NQN; else the transport ID's, else `/etc/nvme/hostnqn`, else generated.
    pub hostnqn: Option<String>,
    pub hostid: Option<[u8; 16]>,
    /// Keep Alive Timeout sent in the admin Connect; a Keep Alive goes out every half of it.
    /// Zero disables keep-alive. Discovery controllers always use zero (as Linux).
    pub kato: Duration,
    /// I/O queue pairs created by [`Controller::connect`] (take them with
    /// [`Controller::take_io_qpairs`]); at least this many are requested from the controller.
    pub io_queues: u16,
    /// I/O queues to ask the controller for (Set Features Number of Queues), for qpairs
    /// created later with [`Controller::create_io_qpair`]; at least `io_queues` and 1.
    pub io_queues_requested: u16,
    /// Entries of each I/O queue (capped by the controller's CAP.MQES).
    pub io_queue_depth: u16,
    /// Limit for each RDMA CM step and for the Fabrics Connect.
    pub connect_timeout: Duration,
    /// Admin commands older than this fail and reset the controller.
    pub admin_timeout: Duration,
    /// I/O commands older than this reset the controller and fail with
    /// [`IoStatus::Timeout`] (with [`Reconnect`]: are retried after the reconnect).
    pub io_timeout: Duration,
    /// Send writes that fit in the controller's in-capsule data size inside the command.
    pub in_capsule_data: bool,
    /// Whether each command's data gets its own memory-window key (see
    /// [`MemoryWindows`]).
    pub memory_windows: MemoryWindows,
    pub reconnect: Option<Reconnect>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            hostnqn: None,
            hostid: None,
            kato: Duration::from_secs(5),
            io_queues: 0,
            io_queues_requested: 0,
            io_queue_depth: 128,
            connect_timeout: Duration::from_secs(10),
            admin_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(30),
            in_capsule_data: true,
            memory_windows: MemoryWindows::Auto,
            reconnect: None,
        }
    }
}

/// Per-command keys: each command's data gets its own memory-window key, which the target
/// invalidates with its response (Keyed SGL subtype Invalidate, 0x0F) or the queue
/// invalidates locally, as the Linux host does with fast registration; data pools are then
/// registered without remote access. Otherwise commands carry the pool registration's key
/// (ADDRESS subtype), as SPDK's host does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryWindows {
    /// Per-command keys where the device has type 2 memory windows, except on soft-RoCE
    /// (rxe). rxe (Linux 6.1) runs a bind or local invalidation a second time when a
    /// retransmission rewinds its send queue before that work request was retired: the
    /// second bind of the window fails (EINVAL; a kretprobe on `rxe_bind_mw` shows the
    /// same work request bound twice within a millisecond) and the queue breaks or loses
    /// the command. Any retransmission can trigger it, and rxe retransmits whenever its
    /// packets arrive out of order or are lost: on a veth pair shared by two CPUs, about
    /// one 4 MiB write in two failed. The pool's key is immune.
    #[default]
    Auto,
    /// Per-command keys whenever the device has type 2 memory windows.
    On,
    /// The pool registration's key.
    Off,
}

impl std::str::FromStr for MemoryWindows {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" | "1" => Ok(Self::On),
            "off" | "0" => Ok(Self::Off),
            _ => Err(format!("{s:?}: expected auto, on or off")),
        }
    }
}

impl MemoryWindows {
    /// Whether commands get their own keys on `pd`'s device.
    fn enabled<V: Verbs>(self, pd: &Arc<V::Pd>) -> bool {
        match self {
            Self::Off => false,
            Self::On => device_has_windows::<V>(pd),
            Self::Auto => device_has_windows::<V>(pd) && !pd.context().is_soft_roce(),
        }
    }
}

/// What the application hears from [`Controller::poll_admin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerEvent {
    /// A Namespace Attribute Changed notice, with the Changed Namespace List (an entry of
    /// 0xFFFFFFFF means more than 1024 changed).
    NamespaceChanged { nsids: Vec<u32> },
    /// An Asymmetric Namespace Access Change notice, with the ANA log page read for it
    /// (reading it re-arms the event). `None` when the log could not be read or parsed.
    AnaChanged { log: Option<AnaLog> },
    /// Any other asynchronous event (its log page was read to re-arm it).
    AsyncEvent {
        ty: AsyncEventType,
        info: u8,
        lid: LogPageId,
    },
    /// The association broke; reconnect attempts follow.
    Disconnected { reason: String },
    /// A new association is live (new CNTLID); I/O qpairs reconnect on their threads.
    Reconnected { cntlid: u16 },
}

pub(crate) const STATE_LIVE: u8 = 0;
pub(crate) const STATE_RESETTING: u8 = 1;
pub(crate) const STATE_FAILED: u8 = 2;
pub(crate) const STATE_DELETED: u8 = 3;

/// What the controller and its I/O qpairs share.
pub(crate) struct Shared<V: Verbs> {
    /// The provider: I/O threads create channels with it when they reconnect, and read its
    /// clock.
    pub verbs: V,
    pub peer: SocketAddr,
    pub tid: TransportId,
    pub host: HostIdentity,
    pub opts: ControllerOptions,
    pub pd: Arc<V::Pd>,
    pub state: AtomicU8,
    /// Bumped on every teardown of the association.
    pub generation: AtomicU64,
    pub cntlid: AtomicU16,
    pub reset_requested: AtomicBool,
    /// In-capsule data bytes the controller takes on I/O queues (0: none).
    pub in_capsule: AtomicU32,
    /// Largest data transfer of one command.
    pub max_xfer: AtomicU32,
    /// Largest I/O queue (CAP.MQES + 1).
    pub max_io_depth: AtomicU32,
    /// I/O queues give each command its own key (see [`ControllerOptions::memory_windows`]).
    pub windows: bool,
    pub failure: Mutex<Option<String>>,
}

impl<V: Verbs> Shared<V> {
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub fn failure(&self) -> String {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "controller deleted".into())
    }
}

/// What the bring-up learned about the controller.
#[derive(Clone)]
pub struct ControllerInfo {
    pub cntlid: u16,
    pub cap: Cap,
    pub vs: Version,
    pub identify: Box<IdentifyController>,
}

impl ControllerInfo {
    /// In-capsule data bytes on I/O queues: (IOCCSZ * 16) - 64 when SGLS advertises offset
    /// data blocks (and ICDOFF is 0, the only offset we send).
    pub fn in_capsule_size(&self) -> u32 {
        let id = &self.identify;
        if id.sgls.get() & SGLS_OFFSET == 0 || id.icdoff.get() != 0 {
            return 0;
        }
        (id.ioccsz.get().saturating_mul(16)).saturating_sub(64)
    }

    /// MDTS in bytes (units of the minimum memory page size), capped by what one keyed SGL
    /// can describe.
    pub fn max_transfer(&self) -> u32 {
        let mdts = self.identify.mdts;
        if mdts == 0 {
            return KEYED_MAX_LENGTH;
        }
        let page = 1u64 << (12 + u32::from(self.cap.mpsmin()));
        (page << mdts).min(u64::from(KEYED_MAX_LENGTH)) as u32
    }
}

/// Namespace facts an I/O application needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub block_size: u32,
    pub blocks: u64,
}

/// A connected NVMe-oF controller, over the verbs provider `V` (the real verbs by default).
pub struct Controller<V: Verbs = RealVerbs> {
    shared: Arc<Shared<V>>,
    admin: Option<Admin<V>>,
    info: ControllerInfo,
    granted_io_queues: u16,
    next_qid: u16,
    io_qpairs: Vec<IoQpair<V>>,
    lost_at: Option<Instant>,
    next_attempt: Instant,
    events: Vec<ControllerEvent>,
}

impl Controller<RealVerbs> {
    /// Connects to the subsystem `tid` names: RDMA CM, admin bring-up, Set Features Number of
    /// Queues, `opts.io_queues` I/O queue pairs, then Set Features Async Event Configuration
    /// and one AER, in the Linux host's order. A discovery NQN gives a discovery controller
    /// (no I/O queues, no keep-alive, no AER).
    pub fn connect(tid: &TransportId, opts: ControllerOptions) -> Result<Self> {
        Self::connect_with(RealVerbs, tid, opts)
    }

    /// [`connect`](Self::connect) on the protection domain of another controller, so one
    /// buffer pool registration serves both (the paths of a multipath namespace). Fails
    /// when the route to `tid` goes through another RDMA device.
    pub fn connect_with_pd(
        tid: &TransportId,
        opts: ControllerOptions,
        pd: &Arc<ProtectionDomain>,
    ) -> Result<Self> {
        Self::connect_with_pd_using(RealVerbs, tid, opts, pd)
    }
}

impl<V: Verbs> Controller<V> {
    /// [`connect`](Controller::connect) over the verbs provider `verbs`.
    pub fn connect_with(verbs: V, tid: &TransportId, opts: ControllerOptions) -> Result<Self> {
        Self::connect_on(verbs, tid, opts, None)
    }

    /// [`connect_with_pd`](Controller::connect_with_pd) over the verbs provider `verbs`:
    /// on `pd`, the protection domain of another controller of the same provider.
    pub fn connect_with_pd_using(
        verbs: V,
        tid: &TransportId,
        opts: ControllerOptions,
        pd: &Arc<V::Pd>,
    ) -> Result<Self> {
        Self::connect_on(verbs, tid, opts, Some(pd))
    }

    fn connect_on(
        verbs: V,
        tid: &TransportId,
        opts: ControllerOptions,
        pd: Option<&Arc<V::Pd>>,
    ) -> Result<Self> {
        let peer = tid.socket_addr()?;
        let host = HostIdentity::resolve(
            tid.hostnqn.as_deref().or(opts.hostnqn.as_deref()),
            opts.hostid,
        );
        let (admin, pd, info) = bring_up(&verbs, peer, tid, &host, &opts, pd)?;
        let next_attempt = verbs.now();
        let shared = Arc::new(Shared {
            peer,
            tid: tid.clone(),
            host,
            pd: pd.clone(),
            state: AtomicU8::new(STATE_LIVE),
            generation: AtomicU64::new(0),
            cntlid: AtomicU16::new(info.cntlid),
            reset_requested: AtomicBool::new(false),
            in_capsule: AtomicU32::new(if opts.in_capsule_data {
                info.in_capsule_size()
            } else {
                0
            }),
            max_xfer: AtomicU32::new(info.max_transfer()),
            max_io_depth: AtomicU32::new(u32::from(info.cap.mqes()) + 1),
            windows: opts.memory_windows.enabled::<V>(&pd),
            failure: Mutex::new(None),
            opts,
            verbs,
        });
        let mut ctrl = Self {
            shared,
            admin: Some(admin),
            info,
            granted_io_queues: 0,
            next_qid: 1,
            io_qpairs: Vec::new(),
            lost_at: None,
            next_attempt,
            events: Vec::new(),
        };
        if !ctrl.is_discovery() {
            let o = &ctrl.shared.opts;
            let want = o.io_queues.max(o.io_queues_requested).max(1);
            ctrl.granted_io_queues = ctrl.set_queue_count(want)?;
            for _ in 0..ctrl.shared.opts.io_queues {
                let depth = ctrl.shared.opts.io_queue_depth;
                let qp = ctrl.create_io_qpair(depth)?;
                ctrl.io_qpairs.push(qp);
            }
            ctrl.enable_async_events()?;
        }
        Ok(ctrl)
    }

    fn admin(&mut self) -> Result<&mut Admin<V>> {
        let failure =
            || Error::ControllerLost("the admin queue is not connected (reconnecting)".into());
        self.admin.as_mut().ok_or_else(failure)
    }

    fn set_queue_count(&mut self, want: u16) -> Result<u16> {
        let nq = NumberOfQueues {
            nsq: u32::from(want),
            ncq: u32::from(want),
        };
        let cmd = Command::set_features(0, FeatureId::NUMBER_OF_QUEUES, nq.to_dword(), false);
        let rsp = self
            .admin()?
            .ok(cmd, AdminData::None, "Set Features Number of Queues")?;
        let got = NumberOfQueues::from_dword(rsp.dw0.get());
        let granted = got.nsq.min(got.ncq).min(u32::from(u16::MAX)) as u16;
        if granted < want {
            tracing::warn!(
                want,
                granted,
                "the controller grants fewer I/O queues than asked for"
            );
        }
        Ok(granted)
    }

    /// Set Features Async Event Configuration (namespace attribute and ANA change notices,
    /// those the controller has) and one outstanding AER.
    fn enable_async_events(&mut self) -> Result<()> {
        let aec = self.info.identify.oaes.get() & (AEC_NAMESPACE_ATTRIBUTE | AEC_ANA_CHANGE);
        if aec != 0 {
            let cmd = Command::set_features(0, FeatureId::ASYNC_EVENT_CONFIGURATION, aec, false);
            self.admin()?.ok(
                cmd,
                AdminData::None,
                "Set Features Async Event Configuration",
            )?;
        }
        self.admin()?.submit_aer();
        Ok(())
    }

    pub fn is_discovery(&self) -> bool {
        self.shared.tid.is_discovery()
    }

    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    pub fn identify(&self) -> &IdentifyController {
        &self.info.identify
    }

    pub fn transport_id(&self) -> &TransportId {
        &self.shared.tid
    }

    pub fn host(&self) -> &HostIdentity {
        &self.shared.host
    }

    pub fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    /// The verbs provider this controller runs over (its clock is the controller's).
    pub fn verbs(&self) -> &V {
        &self.shared.verbs
    }

    /// The protection domain every queue of this controller uses: register data buffer pools
    /// on it ([`register_pool`](Self::register_pool)).
    pub fn pd(&self) -> &Arc<V::Pd> {
        &self.shared.pd
    }

    /// Registers `pool` on this controller's PD, so its buffers can carry I/O data: for
    /// memory windows only (no remote access through the pool's own key) when commands get
    /// their own keys, else for remote read and write.
    pub fn register_pool(&self, pool: &BufferPool) -> Result<()> {
        let access = if self.shared.windows {
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
        } else {
            AccessFlags::ALL_DATA
        };
        register_pool::<V>(&self.shared.pd, pool, access)
            .map_err(|e| Error::rdma("registering the buffer pool (raise `ulimit -l`?)", e))
    }

    /// Whether I/O commands carry per-command memory-window keys
    /// ([`ControllerOptions::memory_windows`] and the device).
    pub fn uses_memory_windows(&self) -> bool {
        self.shared.windows
    }

    /// In-capsule data bytes I/O queues use for writes (0: keyed SGLs only).
    pub fn in_capsule_size(&self) -> u32 {
        self.shared.in_capsule.load(Ordering::Relaxed)
    }

    pub fn max_transfer(&self) -> u32 {
        self.shared.max_xfer.load(Ordering::Relaxed)
    }

    /// I/O queues the controller granted.
    pub fn granted_io_queues(&self) -> u16 {
        self.granted_io_queues
    }

    /// The I/O queue pairs [`connect`](Self::connect) created.
    pub fn take_io_qpairs(&mut self) -> Vec<IoQpair<V>> {
        std::mem::take(&mut self.io_qpairs)
    }

    /// Connects one more I/O queue pair (the next QID) of `depth` entries (capped by
    /// CAP.MQES + 1).
    pub fn create_io_qpair(&mut self, depth: u16) -> Result<IoQpair<V>> {
        if self.is_discovery() {
            return Err(Error::Invalid(
                "a discovery controller has no I/O queues".into(),
            ));
        }
        if self.next_qid > self.granted_io_queues {
            return Err(Error::Invalid(format!(
                "the controller granted {} I/O queues, all in use",
                self.granted_io_queues
            )));
        }
        let max = self
            .shared
            .max_io_depth
            .load(Ordering::Relaxed)
            .min(u32::from(u16::MAX)) as u16;
        let depth = depth.clamp(2, max.max(2));
        // Connecting a queue takes a while (seconds under emulation); applications often
        // create hundreds before their first poll_admin, so keep the association alive
        // here too.
        if self.is_live() {
            self.pump_live()?;
        }
        let qid = self.next_qid;
        let qp = IoQpair::connect(Arc::clone(&self.shared), qid, depth)?;
        self.next_qid += 1;
        Ok(qp)
    }

    /// Runs an admin command with data from the controller (`data_len` bytes, returned).
    pub fn admin_read(
        &mut self,
        cmd: Command,
        data_len: usize,
        what: &str,
    ) -> Result<(Completion, Vec<u8>)> {
        if data_len > ADMIN_DATA_LEN {
            return Err(Error::Invalid(format!(
                "{what}: {data_len} bytes is above {ADMIN_DATA_LEN}"
            )));
        }
        let admin = self.admin()?;
        let rsp = admin.ok(cmd, AdminData::In(data_len), what)?;
        let mut out = vec![0u8; data_len];
        admin.read_data(&mut out);
        Ok((rsp, out))
    }

    /// Runs an admin command without data, or with data to the controller.
    pub fn admin_write(
        &mut self,
        cmd: Command,
        data: Option<&[u8]>,
        what: &str,
    ) -> Result<Completion> {
        let d = data.map_or(AdminData::None, AdminData::Out);
        self.admin()?.ok(cmd, d, what)
    }

    pub fn identify_namespace(&mut self, nsid: u32) -> Result<Box<IdentifyNamespace>> {
        let (_, raw) = self.admin_read(
            Command::identify(0, Cns::NAMESPACE, nsid, 0),
            4096,
            "Identify Namespace",
        )?;
        Ok(Box::new(
            IdentifyNamespace::read_from_bytes(&raw).expect("4096 bytes"),
        ))
    }

    /// Active namespace IDs (Identify CNS 02h, all pages).
    pub fn active_namespaces(&mut self) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut after = 0u32;
        loop {
            let (_, raw) = self.admin_read(
                Command::identify(0, Cns::ACTIVE_NAMESPACE_LIST, after, 0),
                4096,
                "Identify Active Namespace List",
            )?;
            let page: Vec<u32> = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .take_while(|&id| id != 0)
                .collect();
            let full = page.len() == 1024;
            after = page.last().copied().unwrap_or(0);
            ids.extend(page);
            if !full {
                return Ok(ids);
            }
        }
    }

    /// Block size and capacity of a namespace (None if it is not active).
    pub fn namespace(&mut self, nsid: u32) -> Result<Option<NamespaceInfo>> {
        let ns = self.identify_namespace(nsid)?;
        if ns.nsze.get() == 0 {
            return Ok(None);
        }
        Ok(Some(NamespaceInfo {
            nsid,
            block_size: ns.current_lbaf().block_size() as u32,
            blocks: ns.nsze.get(),
        }))
    }

    /// Reads `len` bytes of log page `lid` (split into pieces the controller takes).
    pub fn get_log_page(&mut self, nsid: u32, lid: LogPageId, len: usize) -> Result<Vec<u8>> {
        let max = self.max_transfer();
        self.admin()?.get_log(nsid, lid, len, max, "Get Log Page")
    }

    /// Whether the controller reports Asymmetric Namespace Access (Identify CMIC bit 3).
    pub fn reports_ana(&self) -> bool {
        self.info.identify.cmic & CMIC_ANA != 0
    }

    /// ANA Transition Time (Identify ANATT, seconds): the longest a namespace stays in the
    /// Change state; 10 s when the controller reports 0.
    pub fn ana_transition_time(&self) -> Duration {
        match self.info.identify.anatt {
            0 => Duration::from_secs(10),
            s => Duration::from_secs(u64::from(s)),
        }
    }

    /// Reads the Asymmetric Namespace Access log page (LID 0Ch) with its NSID lists, sized
    /// as the Linux host sizes it: the header, NANAGRPID group descriptors and one NSID per
    /// possible namespace (Identify NN).
    pub fn ana_log(&mut self) -> Result<AnaLog> {
        let id = &self.info.identify;
        let groups = id.nanagrpid.get().max(1) as usize;
        let nsids = id.nn.get().clamp(1, 64 * 1024) as usize;
        let len = (ANA_LOG_HEADER_LEN + groups * ANA_GROUP_DESC_LEN + nsids * 4).min(1 << 20);
        let raw = self.get_log_page(0, LogPageId::ASYMMETRIC_NAMESPACE_ACCESS, len)?;
        AnaLog::parse(&raw).map_err(|e| Error::Invalid(e.to_string()))
    }

    /// The ANA state of namespace `nsid` (with its ANAGRPID) through this controller:
    /// Optimized when the controller does not report ANA.
    pub fn ana_state(&mut self, nsid: u32, anagrpid: u32) -> Result<AnaState> {
        if !self.reports_ana() {
            return Ok(AnaState::Optimized);
        }
        let log = self.ana_log()?;
        log.state_of(nsid, anagrpid).ok_or_else(|| {
            Error::Invalid(format!(
                "namespace {nsid} (ANA group {anagrpid}) is in no group of the ANA log"
            ))
        })
    }

    /// What identifies namespace `nsid` across controllers (Identify Namespace NGUID and
    /// EUI64, completed by the Namespace Identification Descriptor list where the controller
    /// has one) and its ANAGRPID.
    pub fn namespace_ids(&mut self, nsid: u32) -> Result<(NamespaceIds, u32)> {
        let ns = self.identify_namespace(nsid)?;
        let mut ids = NamespaceIds::from_identify(ns.nguid, ns.eui64);
        match self.admin_read(
            Command::identify(0, Cns::NAMESPACE_ID_DESCRIPTOR_LIST, nsid, 0),
            4096,
            "Identify Namespace Identification Descriptor list",
        ) {
            Ok((_, raw)) => ids.merge_descriptors(&raw),
            // Before NVMe 1.3 there is no such list: Identify Namespace's fields stand.
            Err(Error::Command { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok((ids, ns.anagrpid.get()))
    }

    /// Keeps the association alive: keep-alive, AER completions, failure detection, and the
    /// reconnect attempts. Call it every few milliseconds (well under KATO / 2) from the
    /// thread that owns the controller. Returns the events since the last call; an error once
    /// the controller is lost for good.
    pub fn poll_admin(&mut self) -> Result<Vec<ControllerEvent>> {
        match self.shared.state() {
            STATE_LIVE => {
                let result = self.pump_live();
                let reset = self.shared.reset_requested.swap(false, Ordering::AcqRel);
                if let Err(e) = result {
                    self.start_reset(e.to_string());
                } else if reset {
                    self.start_reset("an I/O queue failed".into());
                }
            }
            STATE_RESETTING => {
                self.shared.reset_requested.store(false, Ordering::Relaxed);
                if self.shared.verbs.now() >= self.next_attempt {
                    self.try_reconnect();
                }
            }
            _ => {}
        }
        let events = std::mem::take(&mut self.events);
        match self.shared.state() {
            STATE_FAILED | STATE_DELETED if events.is_empty() => {
                Err(Error::ControllerLost(self.shared.failure()))
            }
            _ => Ok(events),
        }
    }

    /// Whether the association is live (not reconnecting, not lost).
    pub fn is_live(&self) -> bool {
        self.shared.state() == STATE_LIVE
    }

    fn pump_live(&mut self) -> Result<()> {
        let admin = self.admin()?;
        admin.pump()?;
        let done = std::mem::take(&mut admin.aer_done);
        for cqe in done {
            self.on_async_event(cqe.dw0.get())?;
        }
        Ok(())
    }

    fn on_async_event(&mut self, dw0: u32) -> Result<()> {
        let (ty, info, lid) = parse_async_event_dw0(dw0);
        let max = self.max_transfer();
        let admin = self.admin()?;
        if ty == AsyncEventType::NOTICE && info == AsyncNotice::NAMESPACE_ATTRIBUTE_CHANGED.0 {
            // Reading the Changed Namespace List clears the event, so it can fire again.
            let raw = admin.get_log(
                0xFFFF_FFFF,
                LogPageId::CHANGED_NAMESPACE_LIST,
                4096,
                max,
                "Get Log Page Changed Namespace List",
            )?;
            let nsids = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .take_while(|&id| id != 0)
                .collect();
            tracing::info!(?nsids, "namespace attributes changed");
            self.events
                .push(ControllerEvent::NamespaceChanged { nsids });
        } else if ty == AsyncEventType::NOTICE && info == AsyncNotice::ANA_CHANGE.0 {
            let log = match self.ana_log() {
                Ok(log) => Some(log),
                Err(e) => {
                    tracing::warn!("reading the ANA log page for an ANA change notice: {e}");
                    None
                }
            };
            self.events.push(ControllerEvent::AnaChanged { log });
        } else {
            if lid.0 != 0 {
                if let Err(e) =
                    admin.get_log(0xFFFF_FFFF, lid, 512, max, "Get Log Page (async event)")
                {
                    tracing::warn!("reading log page {lid:?} for an async event failed: {e}");
                }
            }
            self.events
                .push(ControllerEvent::AsyncEvent { ty, info, lid });
        }
        self.admin()?.submit_aer();
        Ok(())
    }

    fn fail(&mut self, reason: String) {
        tracing::error!("controller {} lost: {reason}", self.shared.peer);
        *self
            .shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.state.store(STATE_FAILED, Ordering::Release);
    }

    /// Tears the association down after a failure; schedules a reconnect or fails.
    fn start_reset(&mut self, reason: String) {
        if let Some(mut admin) = self.admin.take() {
            admin.disconnect(Duration::ZERO);
        }
        if self.shared.opts.reconnect.is_none() {
            self.fail(reason);
            return;
        }
        let delay = self
            .shared
            .opts
            .reconnect
            .map_or(Duration::ZERO, |r| r.delay);
        tracing::warn!(
            "controller {}: {reason}; reconnecting every {delay:?}",
            self.shared.peer
        );
        let now = self.shared.verbs.now();
        self.lost_at.get_or_insert(now);
        self.next_attempt = now + delay;
        self.shared.state.store(STATE_RESETTING, Ordering::Release);
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.events.push(ControllerEvent::Disconnected { reason });
    }

    fn try_reconnect(&mut self) {
        let Some(policy) = self.shared.opts.reconnect else {
            return;
        };
        let now = self.shared.verbs.now();
        let lost = self
            .lost_at
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        if policy.ctrl_loss_tmo.is_some_and(|tmo| lost >= tmo) {
            self.fail(format!(
                "not reconnected within ctrl_loss_tmo ({:?})",
                policy.ctrl_loss_tmo.unwrap_or_default()
            ));
            return;
        }
        let s = Arc::clone(&self.shared);
        match bring_up(&s.verbs, s.peer, &s.tid, &s.host, &s.opts, Some(&s.pd)) {
            Ok((admin, _, info)) => {
                self.admin = Some(admin);
                let cntlid = info.cntlid;
                let used = self.next_qid - 1;
                let result = self.set_queue_count(used.max(1)).and_then(|granted| {
                    if granted < used {
                        return Err(Error::Invalid(format!(
                            "the controller now grants {granted} I/O queues, {used} are in use"
                        )));
                    }
                    Ok(granted)
                });
                self.info = info;
                self.shared.in_capsule.store(
                    if s.opts.in_capsule_data {
                        self.info.in_capsule_size()
                    } else {
                        0
                    },
                    Ordering::Relaxed,
                );
                self.shared
                    .max_xfer
                    .store(self.info.max_transfer(), Ordering::Relaxed);
                let result = result.and_then(|_| self.enable_async_events());
                if let Err(e) = result {
                    tracing::warn!("reconnect to {}: {e}", s.peer);
                    if let Some(mut a) = self.admin.take() {
                        a.disconnect(Duration::ZERO);
                    }
                    self.next_attempt = s.verbs.now() + policy.delay;
                    return;
                }
                s.cntlid.store(cntlid, Ordering::Release);
                self.lost_at = None;
                s.state.store(STATE_LIVE, Ordering::Release);
                tracing::info!(
                    "controller {} reconnected after {lost:?}, cntlid {cntlid}",
                    s.peer
                );
                self.events.push(ControllerEvent::Reconnected { cntlid });
            }
            Err(e) => {
                tracing::warn!(
                    "reconnect to {} failed: {e}; next attempt in {:?}",
                    s.peer,
                    policy.delay
                );
                self.next_attempt = s.verbs.now() + policy.delay;
            }
        }
    }

    /// Orderly shutdown: the I/O qpairs still held here are disconnected, then CC.SHN =
    /// normal (waiting for CSTS.SHST complete, bounded), then the admin queue is
    /// disconnected. I/O qpairs owned elsewhere should be disconnected first, as the Linux
    /// host tears I/O queues down before the admin queue.
    pub fn disconnect(mut self) -> Result<()> {
        for qp in self.io_qpairs.drain(..) {
            qp.disconnect();
        }
        let was_live = self.shared.state() == STATE_LIVE;
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.state.store(STATE_DELETED, Ordering::Release);
        let mut result = Ok(());
        if let Some(mut admin) = self.admin.take() {
            if was_live {
                result = shutdown(&mut admin);
            }
            admin.disconnect(Duration::from_secs(1));
        }
        result
    }
}

impl<V: Verbs> Drop for Controller<V> {
    fn drop(&mut self) {
        if self.shared.state() != STATE_FAILED {
            self.shared.generation.fetch_add(1, Ordering::AcqRel);
            self.shared.state.store(STATE_DELETED, Ordering::Release);
        }
        if let Some(mut admin) = self.admin.take() {
            admin.disconnect(Duration::ZERO);
        }
    }
}

#[allow(dead_code)]
fn _assert_send<V: Verbs>() {
    fn is_send<T: Send>() {}
    is_send::<Controller>();
    is_send::<IoQpair>();
    // Under any provider: I/O qpairs move to their polling threads.
    is_send::<Controller<V>>();
    is_send::<IoQpair<V>>();
    is_send::<crate::path::MultipathQpair<V>>();
    let _ = IoStatus::Timeout;
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    fn info(mdts: u8, sgls: u32, ioccsz: u32) -> ControllerInfo {
        let mut id = IdentifyController::new_zeroed();
        id.mdts = mdts;
        id.sgls.set(sgls);
        id.ioccsz.set(ioccsz);
        ControllerInfo {
            cntlid: 1,
            cap: Cap(0),
            vs: Version::V1_3,
            identify: Box::new(id),
        }
    }

    #[test]
    fn in_capsule_size_needs_offset_sgls() {
        assert_eq!(info(0, SGLS_OFFSET | 0b101, 260).in_capsule_size(), 4096);
        assert_eq!(info(0, 0b101, 260).in_capsule_size(), 0);
        assert_eq!(info(0, SGLS_OFFSET, 4).in_capsule_size(), 0);
    }

    #[test]
    fn max_transfer_from_mdts() {
        assert_eq!(info(0, 0, 0).max_transfer(), KEYED_MAX_LENGTH);
        assert_eq!(info(5, 0, 0).max_transfer(), 128 * 1024);
        assert_eq!(info(20, 0, 0).max_transfer(), KEYED_MAX_LENGTH);
    }
}

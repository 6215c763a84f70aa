//! Controllers (NVMe-oF dynamic controller model: one per host association).
//!
//! A controller's queues may sit on different reactors: the admin queue on one, I/O queues
//! wherever the acceptor put them. What all of them read is in [`ControllerShared`], as atomics
//! (CC, CSTS, the failed flag), so the I/O path never locks. What only admin commands touch
//! (features, outstanding AERs, the error log, the changed-namespace list) is
//! [`ControllerLocal`], owned by the admin queue's reactor.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nvmf_common::spec::log_page::ErrorLogEntry;
use nvmf_common::spec::registers::{Cc, Csts};
use nvmf_common::spec::reservation::NotificationType;

use crate::core::request::ReqTag;
use crate::core::reservation::NoticeLog;
use crate::core::subsystem::{ListenAddress, SubsystemId, SubsystemKind};

/// Asynchronous Event Request Limit (AERL, zero-based): four outstanding AERs, as Linux sends.
pub const AER_LIMIT: usize = 4;
/// Error log entries kept per controller (ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 16;
/// The Changed Namespace List holds 1024 NSIDs; past that it reports 0xFFFFFFFF alone.
pub const CHANGED_NS_LIST_MAX: usize = 1024;

pub struct ControllerShared {
    pub cntlid: u16,
    pub subsystem_id: SubsystemId,
    pub subnqn: String,
    pub kind: SubsystemKind,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// The poll group that owns the admin queue and the controller's local state.
    pub admin_group: usize,
    /// The listen address the admin queue came through (None: the transport does not say).
    pub listener: Option<ListenAddress>,
    /// Largest I/O queue id the host may connect (after Set Features Number of Queues).
    pub max_io_qid: AtomicU16,
    cc: AtomicU32,
    csts: AtomicU32,
    kato_ms: AtomicU32,
    last_keep_alive_ms: AtomicU64,
    failed: AtomicBool,
    /// Controller Resets (CC.EN 1 to 0) so far: an I/O queue connected before the last one
    /// is torn down.
    resets: AtomicU32,
    /// Volatile Write Cache feature: when the host disables it, writes become FUA.
    write_cache_enabled: AtomicBool,
    connected_qids: Mutex<BTreeSet<u16>>,
    /// Reservation Notification log and masks: written by the reactor that runs a
    /// reservation command of another host, read by Get Log Page / Get Features.
    pub resv_log: Mutex<NoticeLog>,
    /// A notice was posted since the admin reactor last looked (it raises the AEN).
    resv_event: AtomicBool,
}

impl ControllerShared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cntlid: u16,
        subsystem_id: SubsystemId,
        subnqn: String,
        kind: SubsystemKind,
        hostnqn: String,
        hostid: [u8; 16],
        admin_group: usize,
        listener: Option<ListenAddress>,
        max_io_qid: u16,
        kato_ms: u32,
        now_ms: u64,
    ) -> Self {
        Self {
            cntlid,
            subsystem_id,
            subnqn,
            kind,
            hostnqn,
            hostid,
            admin_group,
            listener,
            max_io_qid: AtomicU16::new(max_io_qid),
            cc: AtomicU32::new(0),
            csts: AtomicU32::new(0),
            kato_ms: AtomicU32::new(kato_ms),
            last_keep_alive_ms: AtomicU64::new(now_ms),
            failed: AtomicBool::new(false),
            resets: AtomicU32::new(0),
            write_cache_enabled: AtomicBool::new(true),
            connected_qids: Mutex::new(BTreeSet::from([0])),
            resv_log: Mutex::new(NoticeLog::default()),
            resv_event: AtomicBool::new(false),
        }
    }

    /// Queues a reservation notice for namespace `nsid` unless the host masked its type.
    pub fn post_reservation_notice(&self, nsid: u32, kind: NotificationType) {
        let posted = self
            .resv_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .post(nsid, kind);
        if posted {
            self.resv_event.store(true, Ordering::Release);
            NOTICES.fetch_add(1, Ordering::Release);
        }
    }

    /// Whether a notice was posted since the last call.
    pub fn take_reservation_event(&self) -> bool {
        self.resv_event.load(Ordering::Relaxed) && self.resv_event.swap(false, Ordering::Acquire)
    }

    pub fn cc(&self) -> Cc {
        Cc(self.cc.load(Ordering::Acquire))
    }

    pub fn csts(&self) -> Csts {
        Csts(self.csts.load(Ordering::Acquire))
    }

    pub fn set_cc(&self, cc: Cc) {
        self.cc.store(cc.0, Ordering::Release);
    }

    pub fn set_csts(&self, csts: Csts) {
        self.csts.store(csts.0, Ordering::Release);
    }

    /// Enabled and ready: I/O may run.
    pub fn is_ready(&self) -> bool {
        self.cc().en() && self.csts().rdy() && !self.is_failed()
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Marks the controller fatal (CSTS.CFS): every queue of it disconnects on its reactor's
    /// next poll.
    pub fn fail(&self) {
        let csts = self.csts();
        self.set_csts(csts.with_cfs(true));
        self.failed.store(true, Ordering::Release);
        FAILURES.fetch_add(1, Ordering::Release);
    }

    /// A Controller Reset: the I/O queues connected so far are to go. Counted with the
    /// failures, so that the next tick walks every connection and finds them.
    pub fn reset(&self) {
        self.resets.fetch_add(1, Ordering::Release);
        FAILURES.fetch_add(1, Ordering::Release);
    }

    pub fn resets(&self) -> u32 {
        self.resets.load(Ordering::Acquire)
    }

    pub fn write_cache_enabled(&self) -> bool {
        self.write_cache_enabled.load(Ordering::Relaxed)
    }

    pub fn set_write_cache_enabled(&self, on: bool) {
        self.write_cache_enabled.store(on, Ordering::Relaxed);
    }

    pub fn kato_ms(&self) -> u32 {
        self.kato_ms.load(Ordering::Relaxed)
    }

    pub fn set_kato_ms(&self, kato: u32) {
        self.kato_ms.store(kato, Ordering::Relaxed);
    }

    pub fn keep_alive(&self, now_ms: u64) {
        self.last_keep_alive_ms.store(now_ms, Ordering::Relaxed);
    }

    /// True once the host has been silent for longer than KATO (never when KATO is 0).
    pub fn keep_alive_expired(&self, now_ms: u64) -> bool {
        self.keep_alive_deadline_ms()
            .is_some_and(|deadline| now_ms >= deadline)
    }

    /// The first instant (ms) at which [`keep_alive_expired`](Self::keep_alive_expired) holds
    /// unless the host speaks again; None when KATO is 0.
    pub fn keep_alive_deadline_ms(&self) -> Option<u64> {
        let kato = u64::from(self.kato_ms());
        let last = self.last_keep_alive_ms.load(Ordering::Relaxed);
        (kato != 0).then_some(last + kato + 1)
    }

    /// Records an I/O queue; false if that qid is already connected.
    pub fn claim_qid(&self, qid: u16) -> bool {
        self.connected_qids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(qid)
    }

    pub fn release_qid(&self, qid: u16) {
        self.connected_qids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qid);
    }

    pub fn connected_qids(&self) -> Vec<u16> {
        self.connected_qids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

impl std::fmt::Debug for ControllerShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerShared")
            .field("cntlid", &self.cntlid)
            .field("subnqn", &self.subnqn)
            .field("hostnqn", &self.hostnqn)
            .finish()
    }
}

/// How many times a controller of this process failed. A reactor's tick compares it with
/// the count it saw last and looks at its connections for a failed controller only when it
/// moved, so idle connections cost a tick nothing. Process-wide: another target in the same
/// process (tests) only costs a needless look.
static FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many reservation notices were posted in this process (see [`FAILURES`]): a tick looks
/// for controllers with a notice to raise only when it moved.
static NOTICES: AtomicU64 = AtomicU64::new(0);

/// See [`FAILURES`].
pub fn failure_count() -> u64 {
    FAILURES.load(Ordering::Acquire)
}

/// See [`NOTICES`].
pub fn notice_count() -> u64 {
    NOTICES.load(Ordering::Acquire)
}

/// The admin side of a controller, owned by the admin queue's reactor.
pub struct ControllerLocal {
    pub shared: Arc<ControllerShared>,
    /// Asynchronous Event Configuration (feature 0Bh).
    pub async_event_config: u32,
    /// Features the target only stores and reports back (arbitration, power management,
    /// temperature threshold, error recovery, interrupt coalescing, ...), by feature id.
    pub stored_features: std::collections::BTreeMap<u8, u32>,
    /// AERs the host has outstanding, oldest first.
    pub outstanding_aers: VecDeque<ReqTag>,
    /// Events waiting for an AER, as completion dword 0.
    pub pending_events: VecDeque<u32>,
    /// A Namespace Attribute Changed event was sent and its log page not read yet: per spec, no
    /// further event of that type until the host reads the Changed Namespace List.
    pub ns_change_masked: bool,
    pub changed_namespaces: BTreeSet<u32>,
    pub changed_ns_overflow: bool,
    /// ANA log page change count: bumped each time this controller's ANA view changes.
    pub ana_change_count: u64,
    /// An ANA Change notice was sent and the ANA log not read yet (without RAE): no further
    /// one until it is.
    pub ana_change_masked: bool,
    /// A Reservation Log Page Available event was sent and the log not read since (with RAE
    /// clear): no further one until it is.
    pub resv_aen_masked: bool,
    /// A Discovery Log Page Change notice was sent and the discovery log not read since (with
    /// RAE clear): no further one until it is (nvmet masks it the same way), so a host that
    /// enables the event and sends no AERs queues one notice, not one per change.
    pub discovery_change_masked: bool,
    /// The keep-alive deadline this controller's live timer entry carries (0: none); an entry
    /// with another deadline is stale (see `CoreCtx::arm_keep_alive`).
    pub keep_alive_due: u64,
    pub error_log: VecDeque<ErrorLogEntry>,
    pub error_count: u64,
}

impl ControllerLocal {
    pub fn new(shared: Arc<ControllerShared>) -> Self {
        Self {
            shared,
            async_event_config: 0,
            stored_features: Default::default(),
            outstanding_aers: VecDeque::with_capacity(AER_LIMIT),
            pending_events: VecDeque::new(),
            ns_change_masked: false,
            changed_namespaces: BTreeSet::new(),
            changed_ns_overflow: false,
            ana_change_count: 0,
            ana_change_masked: false,
            resv_aen_masked: false,
            discovery_change_masked: false,
            keep_alive_due: 0,
            error_log: VecDeque::with_capacity(ERROR_LOG_ENTRIES),
            error_count: 0,
        }
    }

    pub fn note_changed_namespace(&mut self, nsid: u32) {
        if self.changed_namespaces.len() >= CHANGED_NS_LIST_MAX {
            self.changed_ns_overflow = true;
        } else {
            self.changed_namespaces.insert(nsid);
        }
    }

    pub fn record_error(&mut self, mut entry: ErrorLogEntry) {
        self.error_count += 1;
        entry.error_count.set(self.error_count);
        if self.error_log.len() == ERROR_LOG_ENTRIES {
            self.error_log.pop_back();
        }
        self.error_log.push_front(entry);
    }
}

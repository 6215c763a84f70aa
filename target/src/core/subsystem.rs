//! Subsystems and namespaces as the reactors see them: immutable snapshots.
//!
//! The control plane owns the mutable configuration. Each change produces a new
//! [`SubsystemConfig`] that is sent to every reactor as a message, so the I/O path reads its
//! configuration without locks. What must be shared across snapshots and reactors (cntlid
//! allocation, the live controllers an I/O queue connect looks up) lives in [`SubsystemShared`],
//! touched only on the connect and teardown paths.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam::utils::CachePadded;
use nvmf_common::spec::nqn::DISCOVERY_NQN;

use crate::bdev::registry::BdevClaim;
use crate::bdev::BdevRef;
use crate::core::ana::AnaConfig;
use crate::core::controller::ControllerShared;
use crate::core::reservation::NsReservation;

/// NN reported by subsystems created without a namespace limit.
pub const DEFAULT_NN: u32 = 32;

/// A subsystem's identity inside one target, stable for its lifetime (NQNs can be reused after
/// a delete; ids are not).
pub type SubsystemId = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    Nvm,
    Discovery,
}

/// Where a transport listens, in SPDK's terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenAddress {
    /// "RDMA", "TCP", "LOOPBACK" (SPDK's trtype spelling, upper case).
    pub trtype: String,
    /// "IPv4", "IPv6", "IB", "FC", "INTRA_HOST".
    pub adrfam: String,
    pub traddr: String,
    pub trsvcid: String,
}

impl std::fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "trtype:{} adrfam:{} traddr:{} trsvcid:{}",
            self.trtype, self.adrfam, self.traddr, self.trsvcid
        )
    }
}

/// A discovery referral (`nvmf_discovery_add_referral`): another discovery service, or an NVM
/// subsystem, that every discovery controller of this target lists in its log page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Referral {
    pub address: ListenAddress,
    /// The discovery NQN for a referral to a discovery service (SPDK's default).
    pub subnqn: String,
    /// TREQ says a secure channel is required to reach it.
    pub secure_channel: bool,
}

impl Referral {
    /// SPDK identifies a referral by its transport id (address and subsystem NQN).
    pub fn same_target(&self, other: &Referral) -> bool {
        self.address == other.address && self.subnqn == other.subnqn
    }
}

/// A namespace: a bdev exported under an NSID with its identifiers.
pub struct Namespace {
    pub nsid: u32,
    pub bdev: BdevRef,
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
    pub eui64: [u8; 8],
    /// Visible to every host (SPDK's default). When false (`no_auto_visible`), only hosts in
    /// the subsystem's [`SubsystemConfig::ns_hosts`] for this NSID see it.
    pub auto_visible: bool,
    pub stats: NsStats,
    /// Registrants and reservation, shared by every reactor (see [`crate::core::reservation`]).
    pub resv: NsReservation,
    /// The claim on `bdev`: released when the last copy of this namespace goes, on the
    /// reactor that drains its last I/O, never before.
    pub claim: Arc<BdevClaim>,
    /// The size hosts were last told of: a bdev resized since (or one it is stacked on)
    /// gets its hosts a Namespace Attribute Changed notice (see
    /// `Target::announce_resized_namespaces`). Written by the control plane only.
    pub announced_blocks: AtomicU64,
}

/// Per-namespace I/O counters, kept per reactor and summed only when read: each reactor
/// writes its own cache line, so counting an I/O writes nothing another core writes.
#[derive(Debug)]
pub struct NsStats {
    per_reactor: Box<[CachePadded<ReactorNsCounts>]>,
}

/// Reactors with a slot of their own in [`NsStats`]; a reactor past it shares a slot (and
/// then adds with a locked instruction).
pub const NS_STATS_REACTORS: usize = 64;

#[derive(Debug, Default)]
struct ReactorNsCounts {
    read_ops: AtomicU64,
    write_ops: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
}

impl Default for NsStats {
    fn default() -> Self {
        Self {
            per_reactor: (0..NS_STATS_REACTORS)
                .map(|_| CachePadded::default())
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NsStatsSnapshot {
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
}

impl NsStats {
    /// Reactor `group`'s counters, and whether it is their only writer.
    fn slot(&self, group: usize) -> (&ReactorNsCounts, bool) {
        let slot = &self.per_reactor[group % NS_STATS_REACTORS];
        (slot, group < NS_STATS_REACTORS)
    }

    pub fn record_read(&self, group: usize, bytes: u64) {
        let (c, only) = self.slot(group);
        add(&c.read_ops, 1, only);
        add(&c.bytes_read, bytes, only);
    }

    pub fn record_write(&self, group: usize, bytes: u64) {
        let (c, only) = self.slot(group);
        add(&c.write_ops, 1, only);
        add(&c.bytes_written, bytes, only);
    }

    pub fn record_error(&self, group: usize) {
        let (c, only) = self.slot(group);
        add(&c.errors, 1, only);
    }

    /// The totals over every reactor (not a consistent cut: readers want totals).
    pub fn snapshot(&self) -> NsStatsSnapshot {
        let mut s = NsStatsSnapshot::default();
        for c in self.per_reactor.iter() {
            s.read_ops += c.read_ops.load(Ordering::Relaxed);
            s.write_ops += c.write_ops.load(Ordering::Relaxed);
            s.bytes_read += c.bytes_read.load(Ordering::Relaxed);
            s.bytes_written += c.bytes_written.load(Ordering::Relaxed);
            s.errors += c.errors.load(Ordering::Relaxed);
        }
        s
    }
}

/// Adds `n` to a counter: a plain load and store when the caller is its only writer (no
/// locked read-modify-write on the I/O path), an atomic add otherwise.
fn add(counter: &AtomicU64, n: u64, only_writer: bool) {
    if only_writer {
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    } else {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl Namespace {
    pub fn block_size(&self) -> u32 {
        self.bdev.block_size()
    }

    pub fn num_blocks(&self) -> u64 {
        self.bdev.num_blocks()
    }
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("nsid", &self.nsid)
            .field("bdev", &self.bdev.name())
            .finish()
    }
}

/// State shared by every snapshot of one subsystem and by all reactors.
pub struct SubsystemShared {
    /// Live controllers by cntlid: an I/O queue Connect finds its controller here.
    controllers: Mutex<HashMap<u16, Arc<ControllerShared>>>,
    next_cntlid: Mutex<u16>,
}

impl SubsystemShared {
    pub fn new(min_cntlid: u16) -> Self {
        Self {
            controllers: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(min_cntlid),
        }
    }

    /// Allocates a cntlid in `[min, max]` not used by a live controller and registers the
    /// controller built for it. `None` when every cntlid is taken.
    pub fn add_controller(
        &self,
        min: u16,
        max: u16,
        build: impl FnOnce(u16) -> Arc<ControllerShared>,
    ) -> Option<Arc<ControllerShared>> {
        let mut controllers = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = self.next_cntlid.lock().unwrap_or_else(|e| e.into_inner());
        let span = u32::from(max - min) + 1;
        for _ in 0..span {
            let candidate = if (min..=max).contains(&*next) {
                *next
            } else {
                min
            };
            *next = if candidate >= max { min } else { candidate + 1 };
            if let std::collections::hash_map::Entry::Vacant(slot) = controllers.entry(candidate) {
                let ctrl = build(candidate);
                slot.insert(Arc::clone(&ctrl));
                return Some(ctrl);
            }
        }
        None
    }

    pub fn controller(&self, cntlid: u16) -> Option<Arc<ControllerShared>> {
        self.controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&cntlid)
            .cloned()
    }

    pub fn remove_controller(&self, cntlid: u16) {
        self.controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&cntlid);
    }

    pub fn controllers(&self) -> Vec<Arc<ControllerShared>> {
        let map = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = map.values().cloned().collect();
        all.sort_by_key(|c| c.cntlid);
        all
    }
}

/// A subsystem's configuration. The control plane owns one per subsystem and mutates it;
/// reactors get immutable snapshots (`Arc` of a clone).
#[derive(Clone)]
pub struct SubsystemConfig {
    pub id: SubsystemId,
    pub nqn: String,
    pub kind: SubsystemKind,
    pub serial_number: String,
    pub model_number: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub listeners: Vec<ListenAddress>,
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    /// Namespace masking: the host NQNs each `no_auto_visible` namespace is visible to
    /// (`nvmf_ns_add_host`). Part of the snapshot, so a change reaches every reactor, and live
    /// controllers, with the next update.
    pub ns_hosts: BTreeMap<u32, BTreeSet<String>>,
    pub max_namespaces: u32,
    pub min_cntlid: u16,
    pub max_cntlid: u16,
    pub ana_reporting: bool,
    /// ANA groups of the namespaces and the state of each group through each listener.
    pub ana: AnaConfig,
    pub shared: Arc<SubsystemShared>,
}

impl SubsystemConfig {
    /// The well-known discovery subsystem every target has.
    pub fn discovery(id: SubsystemId) -> Self {
        Self {
            id,
            nqn: DISCOVERY_NQN.to_string(),
            kind: SubsystemKind::Discovery,
            serial_number: String::new(),
            model_number: String::new(),
            allow_any_host: true,
            hosts: Vec::new(),
            listeners: Vec::new(),
            namespaces: BTreeMap::new(),
            ns_hosts: BTreeMap::new(),
            max_namespaces: 0,
            min_cntlid: 1,
            max_cntlid: 0xFFEF,
            ana_reporting: false,
            ana: AnaConfig::default(),
            shared: Arc::new(SubsystemShared::new(1)),
        }
    }

    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    /// Whether a host that came through the listener `via` may connect: an NVM subsystem only
    /// through its own listeners (as nvmet exports a subsystem on the ports it is linked to,
    /// and SPDK checks the subsystem's listeners), the discovery subsystem through any. A
    /// transport that does not say which listener a queue came through is not refused.
    pub fn listener_allowed(&self, via: Option<&ListenAddress>) -> bool {
        self.kind == SubsystemKind::Discovery
            || via.is_none_or(|addr| self.listeners.contains(addr))
    }

    pub fn namespace(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        self.namespaces.get(&nsid)
    }

    /// Whether a controller of `hostnqn` sees namespace `nsid` (SPDK's per-controller
    /// visible-namespace set, `nvmf_ctrlr_ns_is_visible`, which is a function of the host NQN).
    pub fn ns_visible_to(&self, nsid: u32, hostnqn: &str) -> bool {
        self.namespaces
            .get(&nsid)
            .is_some_and(|ns| self.ns_visible(ns, hostnqn))
    }

    /// [`Self::ns_visible_to`] for a namespace already looked up.
    pub fn ns_visible(&self, ns: &Namespace, hostnqn: &str) -> bool {
        ns.auto_visible
            || self
                .ns_hosts
                .get(&ns.nsid)
                .is_some_and(|hosts| hosts.contains(hostnqn))
    }

    /// The namespace `nsid` if a controller of `hostnqn` sees it: to that host a masked
    /// namespace is an inactive NSID.
    pub fn visible_namespace(&self, nsid: u32, hostnqn: &str) -> Option<&Arc<Namespace>> {
        self.namespaces
            .get(&nsid)
            .filter(|ns| self.ns_visible(ns, hostnqn))
    }

    /// Highest NSID the subsystem may hold: Identify Controller's NN. An unlimited subsystem
    /// (max_namespaces 0, SPDK's default) reports at least 32 or its highest NSID.
    /// The highest NSID the subsystem may hold: `max_namespaces`, or 0xFFFFFFFE without a
    /// limit. ANA group ids are bounded by it too (SPDK's rule), so a group named before
    /// the namespace whose NSID it matches is added (a saved config's order) is in range.
    pub fn nsid_limit(&self) -> u32 {
        if self.max_namespaces == 0 {
            u32::MAX - 1
        } else {
            self.max_namespaces
        }
    }

    pub fn max_nsid(&self) -> u32 {
        let highest = self.namespaces.keys().next_back().copied().unwrap_or(0);
        if self.max_namespaces == 0 {
            highest.max(DEFAULT_NN)
        } else {
            self.max_namespaces.max(highest)
        }
    }

    /// An immutable copy for the reactors.
    pub fn snapshot(&self) -> Arc<SubsystemConfig> {
        Arc::new(self.clone())
    }
}

impl std::fmt::Debug for SubsystemConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubsystemConfig")
            .field("id", &self.id)
            .field("nqn", &self.nqn)
            .field("namespaces", &self.namespaces.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_counters_are_kept_per_reactor_and_summed_when_read() {
        let stats = NsStats::default();
        stats.record_read(0, 4096);
        stats.record_read(1, 512);
        stats.record_write(1, 8192);
        // Past the reactors with a slot of their own: shares reactor 6's slot, adds atomically.
        stats.record_write(NS_STATS_REACTORS + 6, 100);
        stats.record_write(6, 28);
        stats.record_error(3);
        let (own, only) = stats.slot(1);
        assert!(only);
        assert_eq!(own.read_ops.load(Ordering::Relaxed), 1);
        assert!(!stats.slot(NS_STATS_REACTORS + 6).1);
        assert_eq!(
            stats.snapshot(),
            NsStatsSnapshot {
                read_ops: 2,
                write_ops: 3,
                bytes_read: 4608,
                bytes_written: 8320,
                errors: 1,
            }
        );
    }
}

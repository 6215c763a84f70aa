//! The control plane's view of the target: bdevs, transports and subsystems, mutable, owned by
//! one control thread. Every change builds a new subsystem snapshot and sends it to each poll
//! group as a message, so reactors never share a lock with the control plane.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvmf_common::spec::log_page::AnaState;
use nvmf_common::spec::nqn::{validate_nqn, DISCOVERY_NQN};

use crate::bdev::{BdevError, BdevRegistry};
use crate::core::ana::{AnaConfig, ListenerAna};
use crate::core::reservation::{NsReservation, PtplError};
use crate::core::subsystem::{
    ListenAddress, Namespace, NsStats, Referral, SubsystemConfig, SubsystemId, SubsystemKind,
    SubsystemShared,
};
use crate::core::transport::{IdleTransportGroup, Transport, TransportError};
use crate::core::{PollGroupHandle, TargetInfo};

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("invalid NQN {nqn:?}: {reason}")]
    InvalidNqn { nqn: String, reason: String },
    #[error("subsystem {0} already exists")]
    SubsystemExists(String),
    #[error("no subsystem with NQN {0}")]
    NoSubsystem(String),
    #[error("the discovery subsystem cannot be changed this way")]
    DiscoverySubsystem,
    #[error("invalid parameter: {0}")]
    Invalid(String),
    #[error("NSID {0} is already in use")]
    NsidInUse(u32),
    #[error("no namespace with NSID {0}")]
    NoNamespace(u32),
    #[error("namespace {0} is visible to every host (added without no_auto_visible)")]
    NsAutoVisible(u32),
    #[error("referral {0} not found")]
    NoReferral(String),
    #[error("subsystem {0} has no free NSID")]
    NoFreeNsid(String),
    #[error("host {0} already allowed")]
    HostExists(String),
    #[error("host {0} not found")]
    NoHost(String),
    #[error("listener {0} already exists")]
    ListenerExists(String),
    #[error("listener {0} not found")]
    NoListener(String),
    #[error("transport {0} already exists")]
    TransportExists(String),
    #[error("transport {0} does not exist; create it with nvmf_create_transport")]
    NoTransport(String),
    /// The transport refused the listen address; the doctor (`nvmf-doctor -a traddr`) explains
    /// why a fabric address cannot be used.
    #[error("cannot listen on {addr}: {source}; run `nvmf-doctor -a {traddr}` to diagnose")]
    Listen {
        addr: String,
        traddr: String,
        #[source]
        source: TransportError,
    },
    #[error(transparent)]
    Bdev(#[from] BdevError),
    #[error(transparent)]
    Ptpl(#[from] PtplError),
}

impl TargetError {
    pub fn errno(&self) -> i32 {
        match self {
            TargetError::SubsystemExists(_)
            | TargetError::NsidInUse(_)
            | TargetError::HostExists(_)
            | TargetError::ListenerExists(_)
            | TargetError::TransportExists(_) => libc::EEXIST,
            TargetError::NoSubsystem(_)
            | TargetError::NoNamespace(_)
            | TargetError::NoHost(_)
            | TargetError::NoListener(_) => libc::ENOENT,
            TargetError::NoReferral(_) => libc::ENOENT,
            TargetError::NsAutoVisible(_) => libc::EPERM,
            TargetError::NoFreeNsid(_) => libc::ENOSPC,
            TargetError::Listen { .. } => libc::EADDRNOTAVAIL,
            TargetError::Bdev(e) => e.errno(),
            _ => libc::EINVAL,
        }
    }
}

impl From<TargetError> for nvmf_rpc::RpcError {
    fn from(e: TargetError) -> Self {
        nvmf_rpc::RpcError::errno(e.errno(), e.to_string())
    }
}

/// The control plane's copy of a subsystem: the same type the reactors get snapshots of.
pub type SubsystemState = SubsystemConfig;

/// What `create_subsystem` takes, with SPDK's defaults.
#[derive(Debug, Clone)]
pub struct SubsystemOptions {
    pub serial_number: String,
    pub model_number: String,
    pub allow_any_host: bool,
    pub max_namespaces: u32,
    pub min_cntlid: u16,
    pub max_cntlid: u16,
    pub ana_reporting: bool,
}

impl Default for SubsystemOptions {
    fn default() -> Self {
        Self {
            serial_number: "00000000000000000000".into(),
            model_number: "SPDK bdev Controller".into(),
            allow_any_host: false,
            max_namespaces: 0,
            min_cntlid: 1,
            max_cntlid: 0xFFEF,
            ana_reporting: false,
        }
    }
}

/// What `add_namespace` takes; zero identifiers mean "derive from the bdev" as SPDK does.
#[derive(Debug, Clone, Default)]
pub struct NamespaceOptions {
    pub bdev_name: String,
    pub nsid: Option<u32>,
    pub nguid: Option<[u8; 16]>,
    pub uuid: Option<[u8; 16]>,
    pub eui64: Option<[u8; 8]>,
    /// Visible to no host until [`Target::ns_add_host`] names one (SPDK's `no_auto_visible`).
    pub no_auto_visible: bool,
    /// ANA group; the NSID when absent or 0, as in SPDK.
    pub anagrpid: Option<u32>,
    /// SPDK's `ptpl_file`: where the namespace's reservations persist through power loss
    /// (read here when it exists, written whenever PTPL is on and they change).
    pub ptpl_file: Option<std::path::PathBuf>,
}

pub struct Target {
    pub info: Arc<TargetInfo>,
    pub bdevs: BdevRegistry,
    subsystems: BTreeMap<String, SubsystemState>,
    transports: Vec<Arc<dyn Transport>>,
    /// Discovery referrals, oldest first; every discovery controller lists them.
    referrals: Vec<Referral>,
    poll_groups: Vec<PollGroupHandle>,
    next_id: SubsystemId,
}

impl Target {
    pub fn new(info: Arc<TargetInfo>) -> Self {
        let mut target = Self {
            info,
            bdevs: BdevRegistry::new(),
            subsystems: BTreeMap::new(),
            transports: Vec::new(),
            referrals: Vec::new(),
            poll_groups: Vec::new(),
            next_id: 1,
        };
        target
            .subsystems
            .insert(DISCOVERY_NQN.to_string(), SubsystemConfig::discovery(0));
        target
    }

    /// Registers a poll group and sends it the current configuration and transports.
    pub fn add_poll_group(&mut self, handle: PollGroupHandle) {
        for sub in self.subsystems.values() {
            let snapshot = sub.snapshot();
            handle.send(move |pg| pg.core.update_subsystem(snapshot));
        }
        for transport in &self.transports {
            attach_transport(&handle, Arc::clone(transport));
        }
        let referrals = Arc::new(self.referrals.clone());
        handle.send(move |pg| pg.core.set_referrals(referrals));
        self.poll_groups.push(handle);
    }

    pub fn poll_groups(&self) -> &[PollGroupHandle] {
        &self.poll_groups
    }

    fn publish(&self, nqn: &str) {
        let Some(sub) = self.subsystems.get(nqn) else {
            return;
        };
        self.info.bump_discovery_generation();
        for pg in &self.poll_groups {
            let snapshot = sub.snapshot();
            pg.send(move |pg| pg.core.update_subsystem(snapshot));
        }
    }

    pub fn subsystems(&self) -> impl Iterator<Item = &SubsystemState> {
        self.subsystems.values()
    }

    pub fn subsystem(&self, nqn: &str) -> Result<&SubsystemState, TargetError> {
        self.subsystems
            .get(nqn)
            .ok_or_else(|| TargetError::NoSubsystem(nqn.to_string()))
    }

    fn subsystem_mut(&mut self, nqn: &str) -> Result<&mut SubsystemState, TargetError> {
        match self.subsystems.get_mut(nqn) {
            Some(s) if s.kind == SubsystemKind::Discovery => Err(TargetError::DiscoverySubsystem),
            Some(s) => Ok(s),
            None => Err(TargetError::NoSubsystem(nqn.to_string())),
        }
    }

    pub fn create_subsystem(
        &mut self,
        nqn: &str,
        opts: SubsystemOptions,
    ) -> Result<(), TargetError> {
        validate_nqn(nqn).map_err(|e| TargetError::InvalidNqn {
            nqn: nqn.to_string(),
            reason: e.to_string(),
        })?;
        if self.subsystems.contains_key(nqn) {
            return Err(TargetError::SubsystemExists(nqn.to_string()));
        }
        check_ascii_field("serial_number", &opts.serial_number, 20)?;
        check_ascii_field("model_number", &opts.model_number, 40)?;
        if opts.min_cntlid == 0 || opts.min_cntlid > opts.max_cntlid || opts.max_cntlid > 0xFFEF {
            return Err(TargetError::Invalid(format!(
                "cntlid range {}..={} must lie within 1..=65519",
                opts.min_cntlid, opts.max_cntlid
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.subsystems.insert(
            nqn.to_string(),
            SubsystemConfig {
                id,
                nqn: nqn.to_string(),
                kind: SubsystemKind::Nvm,
                serial_number: opts.serial_number,
                model_number: opts.model_number,
                allow_any_host: opts.allow_any_host,
                hosts: Vec::new(),
                listeners: Vec::new(),
                namespaces: BTreeMap::new(),
                ns_hosts: BTreeMap::new(),
                max_namespaces: opts.max_namespaces,
                min_cntlid: opts.min_cntlid,
                max_cntlid: opts.max_cntlid,
                ana_reporting: opts.ana_reporting,
                ana: AnaConfig::default(),
                shared: Arc::new(SubsystemShared::new(opts.min_cntlid)),
            },
        );
        self.publish(nqn);
        Ok(())
    }

    /// Deletes a subsystem: its controllers fail (hosts see the queues close), its bdevs are
    /// released once every reactor has drained their I/O, its listeners stop if no other
    /// subsystem uses them.
    pub fn delete_subsystem(&mut self, nqn: &str) -> Result<(), TargetError> {
        self.subsystem_mut(nqn)?;
        let sub = self.subsystems.remove(nqn).expect("checked above");
        for addr in &sub.listeners {
            self.stop_listen_if_unused(addr);
        }
        self.info.bump_discovery_generation();
        let id = sub.id;
        for pg in &self.poll_groups {
            pg.send(move |pg| pg.core.remove_subsystem(id));
        }
        Ok(())
    }

    pub fn add_namespace(&mut self, nqn: &str, opts: NamespaceOptions) -> Result<u32, TargetError> {
        let sub = self.subsystem_mut(nqn)?;
        let limit = sub.nsid_limit();
        let nsid = match opts.nsid {
            Some(0) | None => (1..=limit)
                .find(|n| !sub.namespaces.contains_key(n))
                .ok_or_else(|| TargetError::NoFreeNsid(nqn.to_string()))?,
            Some(n) if n > limit || n == u32::MAX => {
                return Err(TargetError::Invalid(format!(
                    "NSID {n} exceeds max_namespaces {limit}"
                )))
            }
            Some(n) if sub.namespaces.contains_key(&n) => return Err(TargetError::NsidInUse(n)),
            Some(n) => n,
        };
        let anagrpid = match opts.anagrpid {
            Some(0) | None => nsid,
            Some(g) => g,
        };
        // SPDK's bound: no group id above the highest NSID the subsystem may hold.
        if anagrpid > limit {
            return Err(TargetError::Invalid(format!(
                "anagrpid {anagrpid} exceeds the maximum NSID {limit}"
            )));
        }
        // Two namespaces persisting to one file would overwrite each other's reservations,
        // and the loser's would fail to load at the next start.
        if let Some(path) = &opts.ptpl_file {
            let taken = self
                .subsystems
                .values()
                .flat_map(|s| s.namespaces.values())
                .any(|ns| ns.resv.ptpl_file() == Some(path.as_path()));
            if taken {
                return Err(TargetError::Invalid(format!(
                    "ptpl_file {} is another namespace's",
                    path.display()
                )));
            }
        }
        let user = format!("{nqn} nsid {nsid}");
        // Dropped on every error below, the hold releases the claim.
        let (bdev, claim) = self.bdevs.claim(&opts.bdev_name, &user)?;
        // A bdev may have any multiple of 512 as its block size (as in SPDK), but a namespace
        // states its LBA size as a power of two (Identify Namespace LBADS): any other would
        // reach hosts as the wrong geometry.
        if !bdev.block_size().is_power_of_two() {
            return Err(TargetError::Invalid(format!(
                "bdev {} has {}-byte blocks: a namespace's block size must be a power of two",
                bdev.name(),
                bdev.block_size()
            )));
        }
        // All zeroes is "not given", as SPDK reads it (and as `save_config` leaves it out):
        // taken literally, a restart would derive other identifiers, and Linux hosts drop a
        // namespace whose identifiers changed.
        let given = |id: Option<[u8; 16]>| id.filter(|id| *id != [0; 16]);
        let uuid = given(opts.uuid).unwrap_or_else(|| bdev.uuid());
        let resv = NsReservation::new(bdev.uuid(), opts.ptpl_file)?;
        let bdev_blocks = bdev.num_blocks();
        let ns = Arc::new(Namespace {
            nsid,
            nguid: given(opts.nguid).unwrap_or(uuid),
            uuid,
            eui64: opts.eui64.unwrap_or_default(),
            auto_visible: !opts.no_auto_visible,
            bdev,
            stats: NsStats::default(),
            resv,
            claim,
            announced_blocks: AtomicU64::new(bdev_blocks),
        });
        let sub = self.subsystem_mut(nqn)?;
        sub.namespaces.insert(nsid, ns);
        sub.ana.ns_groups.insert(nsid, anagrpid);
        self.publish(nqn);
        Ok(nsid)
    }

    /// Sends a Namespace Attribute Changed notice to the hosts of every namespace whose size
    /// moved since they were last told (its bdev resized or rescanned, or one it is stacked
    /// on), as SPDK does on a bdev's resize event: Linux then reads the namespace again and
    /// takes the new capacity. Returns how many namespaces changed.
    pub fn announce_resized_namespaces(&self) -> usize {
        let mut changed = 0;
        for sub in self.subsystems.values() {
            let nsids: Vec<u32> = sub
                .namespaces
                .values()
                .filter(|ns| {
                    let now = ns.num_blocks();
                    ns.announced_blocks.swap(now, Ordering::Relaxed) != now
                })
                .map(|ns| ns.nsid)
                .collect();
            if nsids.is_empty() {
                continue;
            }
            changed += nsids.len();
            tracing::info!(nqn = %sub.nqn, ?nsids, "namespace size changed: telling its hosts");
            let nsids: Arc<[u32]> = nsids.into();
            for pg in &self.poll_groups {
                let (id, nsids) = (sub.id, Arc::clone(&nsids));
                pg.send(move |pg| pg.core.namespaces_resized(id, &nsids));
            }
        }
        changed
    }

    pub fn remove_namespace(&mut self, nqn: &str, nsid: u32) -> Result<(), TargetError> {
        let sub = self.subsystem_mut(nqn)?;
        let ns = sub
            .namespaces
            .remove(&nsid)
            .ok_or(TargetError::NoNamespace(nsid))?;
        sub.ns_hosts.remove(&nsid);
        sub.ana.ns_groups.remove(&nsid);
        // A listener's state for a group now past ANAGRPMAX would outlive it: saved, it
        // could not be loaded, and a namespace added later with that NSID would inherit it.
        let max = sub.ana_group_max();
        for states in sub.ana.listeners.values_mut() {
            states.forget_groups_above(max);
        }
        // Its bdev stays claimed until every reactor has drained the namespace's I/O and
        // dropped it (the namespace holds the claim).
        drop(ns);
        self.publish(nqn);
        Ok(())
    }

    /// Makes the `no_auto_visible` namespace `nsid` visible to controllers of `host`, live
    /// ones included (they get a Namespace Attribute Changed notice). Adding a host that
    /// already sees it changes nothing, as in SPDK's `nvmf_ns_visible`.
    pub fn ns_add_host(&mut self, nqn: &str, nsid: u32, host: &str) -> Result<(), TargetError> {
        self.set_ns_visible(nqn, nsid, host, true)
    }

    /// Hides the namespace from `host` again; a host it was not visible to is no error.
    pub fn ns_remove_host(&mut self, nqn: &str, nsid: u32, host: &str) -> Result<(), TargetError> {
        self.set_ns_visible(nqn, nsid, host, false)
    }

    fn set_ns_visible(
        &mut self,
        nqn: &str,
        nsid: u32,
        host: &str,
        visible: bool,
    ) -> Result<(), TargetError> {
        validate_nqn(host).map_err(|e| TargetError::InvalidNqn {
            nqn: host.to_string(),
            reason: e.to_string(),
        })?;
        let sub = self.subsystem_mut(nqn)?;
        let ns = sub.namespace(nsid).ok_or(TargetError::NoNamespace(nsid))?;
        if ns.auto_visible {
            return Err(TargetError::NsAutoVisible(nsid));
        }
        let changed = if visible {
            sub.ns_hosts
                .entry(nsid)
                .or_default()
                .insert(host.to_string())
        } else {
            let hosts = sub.ns_hosts.get_mut(&nsid);
            let removed = hosts.as_ref().is_some_and(|h| h.contains(host));
            if let Some(hosts) = hosts {
                hosts.remove(host);
                if hosts.is_empty() {
                    sub.ns_hosts.remove(&nsid);
                }
            }
            removed
        };
        if changed {
            self.publish(nqn);
        }
        Ok(())
    }

    pub fn referrals(&self) -> &[Referral] {
        &self.referrals
    }

    /// Adds a discovery referral. One with the same address and subsystem NQN already there
    /// is kept as it is (`Ok(false)`), as SPDK ignores a duplicate.
    pub fn add_referral(&mut self, referral: Referral) -> Result<bool, TargetError> {
        validate_nqn(&referral.subnqn).map_err(|e| TargetError::InvalidNqn {
            nqn: referral.subnqn.clone(),
            reason: e.to_string(),
        })?;
        if self.referrals.iter().any(|r| r.same_target(&referral)) {
            return Ok(false);
        }
        self.referrals.push(referral);
        self.publish_referrals();
        Ok(true)
    }

    pub fn remove_referral(
        &mut self,
        address: &ListenAddress,
        subnqn: &str,
    ) -> Result<(), TargetError> {
        let at = self
            .referrals
            .iter()
            .position(|r| r.address == *address && r.subnqn == subnqn)
            .ok_or_else(|| TargetError::NoReferral(format!("{address} subnqn:{subnqn}")))?;
        self.referrals.remove(at);
        self.publish_referrals();
        Ok(())
    }

    fn publish_referrals(&self) {
        self.info.bump_discovery_generation();
        let referrals = Arc::new(self.referrals.clone());
        for pg in &self.poll_groups {
            let referrals = Arc::clone(&referrals);
            pg.send(move |pg| pg.core.set_referrals(referrals));
        }
    }

    pub fn add_host(&mut self, nqn: &str, host: &str) -> Result<(), TargetError> {
        validate_nqn(host).map_err(|e| TargetError::InvalidNqn {
            nqn: host.to_string(),
            reason: e.to_string(),
        })?;
        let sub = self.subsystem_mut(nqn)?;
        if sub.hosts.iter().any(|h| h == host) {
            return Err(TargetError::HostExists(host.to_string()));
        }
        sub.hosts.push(host.to_string());
        self.publish(nqn);
        Ok(())
    }

    pub fn remove_host(&mut self, nqn: &str, host: &str) -> Result<(), TargetError> {
        let sub = self.subsystem_mut(nqn)?;
        let before = sub.hosts.len();
        sub.hosts.retain(|h| h != host);
        if sub.hosts.len() == before {
            return Err(TargetError::NoHost(host.to_string()));
        }
        self.publish(nqn);
        Ok(())
    }

    pub fn allow_any_host(&mut self, nqn: &str, allow: bool) -> Result<(), TargetError> {
        self.subsystem_mut(nqn)?.allow_any_host = allow;
        self.publish(nqn);
        Ok(())
    }

    pub fn add_transport(&mut self, transport: Arc<dyn Transport>) -> Result<(), TargetError> {
        if self.transport(transport.trtype()).is_some() {
            return Err(TargetError::TransportExists(transport.trtype().to_string()));
        }
        for pg in &self.poll_groups {
            attach_transport(pg, Arc::clone(&transport));
        }
        self.transports.push(transport);
        Ok(())
    }

    pub fn transport(&self, trtype: &str) -> Option<&Arc<dyn Transport>> {
        self.transports
            .iter()
            .find(|t| t.trtype().eq_ignore_ascii_case(trtype))
    }

    pub fn transports(&self) -> &[Arc<dyn Transport>] {
        &self.transports
    }

    pub fn add_listener(&mut self, nqn: &str, addr: ListenAddress) -> Result<(), TargetError> {
        self.add_listener_with_ana(nqn, addr, AnaState::OPTIMIZED)
    }

    /// Adds a listener whose ANA groups all start in `ana_state` (SPDK's listener option; it
    /// matters once the subsystem reports ANA).
    pub fn add_listener_with_ana(
        &mut self,
        nqn: &str,
        addr: ListenAddress,
        ana_state: AnaState,
    ) -> Result<(), TargetError> {
        if self.subsystem(nqn)?.listeners.contains(&addr) {
            return Err(TargetError::ListenerExists(addr.to_string()));
        }
        let transport = self
            .transport(&addr.trtype)
            .ok_or_else(|| TargetError::NoTransport(addr.trtype.clone()))?;
        transport
            .listen(&addr)
            .map_err(|source| TargetError::Listen {
                addr: addr.to_string(),
                traddr: addr.traddr.clone(),
                source,
            })?;
        let sub = self
            .subsystems
            .get_mut(nqn)
            .ok_or_else(|| TargetError::NoSubsystem(nqn.to_string()))?;
        sub.ana
            .listeners
            .insert(addr.clone(), ListenerAna::new(ana_state));
        sub.listeners.push(addr);
        self.publish(nqn);
        Ok(())
    }

    /// Sets the state of ANA group `anagrpid` (every group when `None`) through the listener
    /// `addr`; controllers that came through it and see a namespace of a changed group get an
    /// ANA Change notice. Setting the state a group already has changes nothing.
    pub fn set_ana_state(
        &mut self,
        nqn: &str,
        addr: &ListenAddress,
        state: AnaState,
        anagrpid: Option<u32>,
    ) -> Result<(), TargetError> {
        let sub = self.subsystem_mut(nqn)?;
        if !sub.ana_reporting {
            return Err(TargetError::Invalid(format!(
                "ANA reporting is disabled for {nqn} (create it with ana_reporting)"
            )));
        }
        if let Some(g) = anagrpid {
            let max = sub.ana_group_max();
            if g == 0 || g > max {
                return Err(TargetError::Invalid(format!(
                    "anagrpid {g} is outside 1..={max}"
                )));
            }
        }
        let listener = sub
            .ana
            .listeners
            .get_mut(addr)
            .ok_or_else(|| TargetError::NoListener(addr.to_string()))?;
        if listener.set(anagrpid, state) {
            self.publish(nqn);
        }
        Ok(())
    }

    /// Moves namespace `nsid` to ANA group `anagrpid` (SPDK's `nvmf_subsystem_set_ns_ana_group`);
    /// controllers that see it get an ANA Change notice if its state through their listener
    /// changes with it, and a new change count in any case.
    pub fn set_ns_ana_group(
        &mut self,
        nqn: &str,
        nsid: u32,
        anagrpid: u32,
    ) -> Result<(), TargetError> {
        let sub = self.subsystem_mut(nqn)?;
        if !sub.namespaces.contains_key(&nsid) {
            return Err(TargetError::NoNamespace(nsid));
        }
        let max = sub.nsid_limit();
        if anagrpid == 0 || anagrpid > max {
            return Err(TargetError::Invalid(format!(
                "anagrpid {anagrpid} is outside 1..={max}"
            )));
        }
        if sub.ana.ns_groups.insert(nsid, anagrpid) != Some(anagrpid) {
            self.publish(nqn);
        }
        Ok(())
    }

    /// Removes a listener; the subsystem's controllers that came through it (or through a
    /// transport that does not say) fail, so their hosts reconnect through a listener that
    /// still exists or learn the path is gone. Hosts on other listeners keep their queues.
    pub fn remove_listener(&mut self, nqn: &str, addr: &ListenAddress) -> Result<(), TargetError> {
        let sub = self
            .subsystems
            .get_mut(nqn)
            .ok_or_else(|| TargetError::NoSubsystem(nqn.to_string()))?;
        let before = sub.listeners.len();
        sub.listeners.retain(|l| l != addr);
        if sub.listeners.len() == before {
            return Err(TargetError::NoListener(addr.to_string()));
        }
        sub.ana.listeners.remove(addr);
        for ctrl in sub.shared.controllers() {
            if ctrl.listener.as_ref().is_none_or(|l| l == addr) {
                ctrl.fail();
            }
        }
        self.stop_listen_if_unused(addr);
        self.publish(nqn);
        Ok(())
    }

    fn stop_listen_if_unused(&self, addr: &ListenAddress) {
        let used = self.subsystems.values().any(|s| s.listeners.contains(addr));
        if !used {
            if let Some(t) = self.transport(&addr.trtype) {
                t.stop_listen(addr);
            }
        }
    }
}

/// Gives a poll group its share of a transport, on the poll group's own thread.
fn attach_transport(pg: &PollGroupHandle, transport: Arc<dyn Transport>) {
    let handle = pg.clone();
    pg.send(move |group| {
        let mut failure = None;
        group.add_transport(|index| match transport.create_poll_group(index, &handle) {
            Ok(t) => t,
            Err(e) => {
                failure = Some(e);
                Box::new(IdleTransportGroup)
            }
        });
        if let Some(e) = failure {
            tracing::error!(
                trtype = transport.trtype(),
                group = handle.index(),
                "cannot create transport poll group: {e}"
            );
        }
    });
}

fn check_ascii_field(name: &str, value: &str, max: usize) -> Result<(), TargetError> {
    if value.len() > max || !value.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        return Err(TargetError::Invalid(format!(
            "{name} must be at most {max} printable ASCII characters"
        )));
    }
    Ok(())
}

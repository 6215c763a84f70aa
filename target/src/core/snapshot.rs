//! The control plane's changes arriving on a reactor: a subsystem's new snapshot (namespaces
//! added, removed, replaced, masked; ANA states), a subsystem removed, the discovery
//! referrals. Each opens or drains bdev channels as needed and tells this reactor's
//! controllers what their hosts can see changed (Asynchronous Events).

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::bdev::{BdevChannel, UnavailableChannel};
use crate::cmd;
use crate::core::latency::NamespaceLatency;
use crate::core::namespaces::{GroupNamespace, NsSlot};
use crate::core::subsystem::{Referral, SubsystemConfig, SubsystemId, SubsystemKind};
use crate::core::{CoreCtx, GroupSubsystem};

impl CoreCtx {
    /// Installs a new snapshot of a subsystem on this reactor: opens channels for namespaces
    /// that appeared, drains the ones that went, and tells this reactor's controllers of the
    /// subsystem which namespaces changed (Asynchronous Event, Changed Namespace List).
    pub fn update_subsystem(&mut self, config: Arc<SubsystemConfig>) {
        let id = config.id;
        let mut old = self.subsystems.remove(&id);
        let mut namespaces = FxHashMap::default();
        let mut changed = Vec::new();
        for (&nsid, ns) in &config.namespaces {
            let table = &mut self.ns_table;
            let kept = old.as_mut().and_then(|o| {
                let slot = *o.namespaces.get(&nsid)?;
                let same = table.get(slot).is_some_and(|g| Arc::ptr_eq(&g.ns, ns));
                same.then(|| o.namespaces.remove(&nsid)).flatten()
            });
            let slot = match kept {
                Some(slot) => {
                    if let Some(g) = table.get_mut(slot) {
                        g.config = Arc::clone(&config);
                    }
                    slot
                }
                None => {
                    changed.push(nsid);
                    // A channel that fails to open still installs the namespace, failing
                    // its I/O: hosts were told of it, and the RPC that added it asks each
                    // reactor (`namespace_open_error`) and takes it back out.
                    let (channel, open_error) = match ns.bdev.open_channel() {
                        Ok(channel) => (channel, None),
                        Err(e) => {
                            tracing::error!(
                                nsid,
                                bdev = ns.bdev.name(),
                                "cannot open bdev channel: {e}"
                            );
                            let failed: Box<dyn BdevChannel> = Box::new(UnavailableChannel::new());
                            (failed, Some((e.errno(), e.to_string())))
                        }
                    };
                    table.insert(GroupNamespace {
                        ns: Arc::clone(ns),
                        config: Arc::clone(&config),
                        channel,
                        retry: VecDeque::new(),
                        latency: NamespaceLatency::default(),
                        out: 0,
                        resv: ns.resv.view(),
                        open_error,
                    })
                }
            };
            namespaces.insert(nsid, slot);
        }
        // A slot per index, and a stale one per index of a namespace retired with I/O out
        // (dropped at the next poll): room enough that submitting I/O does not grow the list.
        let room = 2 * self.ns_table.indexes();
        self.busy_namespaces
            .reserve(room.saturating_sub(self.busy_namespaces.len()));
        let mut old_config = None;
        if let Some(old) = old {
            if old.config.nqn != config.nqn {
                self.by_nqn.remove(&old.config.nqn);
            }
            for (nsid, gone) in old.namespaces {
                changed.push(nsid);
                self.retire_namespace(gone);
            }
            old_config = Some(old.config);
        }
        self.by_nqn.insert(config.nqn.clone(), id);
        self.subsystems.insert(
            id,
            GroupSubsystem {
                config: Arc::clone(&config),
                namespaces,
            },
        );
        self.notify_namespace_change(id, &changed, old_config.as_deref(), &config);
        if let Some(old) = old_config.as_deref() {
            self.fail_revoked_controllers(old, &config);
            self.notify_ana_change(old, &config);
        }
        self.notify_discovery_change();
    }

    /// Namespaces of subsystem `id` whose size changed: each controller they are visible to
    /// gets a Namespace Attribute Changed notice.
    pub fn namespaces_resized(&mut self, id: SubsystemId, nsids: &[u32]) {
        let Some(config) = self.subsystems.get(&id).map(|s| Arc::clone(&s.config)) else {
            return;
        };
        self.notify_namespace_change(id, nsids, Some(&config), &config);
    }

    /// Why namespace `nsid` of subsystem `id` has no working bdev channel on this reactor,
    /// if it has none (its channel failed to open): the errno and the message.
    pub fn namespace_open_error(&self, id: SubsystemId, nsid: u32) -> Option<(i32, String)> {
        let slot = *self.subsystems.get(&id)?.namespaces.get(&nsid)?;
        self.ns_table.get(slot)?.open_error.clone()
    }

    /// Fails this reactor's controllers of the subsystem whose host was removed from its
    /// hosts, or whose listener was removed, by this change. The control plane fails the
    /// controllers it sees when it makes the change; one a Connect made here meanwhile,
    /// against the snapshot this reactor still had, is found here. (A host that was let in by
    /// `allow_any_host` keeps its controllers when that is switched off, as in SPDK.)
    fn fail_revoked_controllers(&mut self, old: &SubsystemConfig, new: &SubsystemConfig) {
        for ((sid, _), local) in &self.controllers {
            if *sid != new.id {
                continue;
            }
            let ctrl = &local.shared;
            let host_removed =
                old.hosts.contains(&ctrl.hostnqn) && !new.host_allowed(&ctrl.hostnqn);
            let listener_removed = ctrl
                .listener
                .as_ref()
                .is_some_and(|l| old.listeners.contains(l) && !new.listeners.contains(l));
            if (host_removed || listener_removed) && !ctrl.is_failed() {
                tracing::warn!(cntlid = ctrl.cntlid, subnqn = %ctrl.subnqn, hostnqn = %ctrl.hostnqn,
                    host_removed, listener_removed, "access revoked: controller failed");
                ctrl.fail();
            }
        }
    }

    /// Installs the target's discovery referrals; discovery controllers learn the log changed.
    pub fn set_referrals(&mut self, referrals: Arc<Vec<Referral>>) {
        self.referrals = referrals;
        self.notify_discovery_change();
    }

    /// Discovery controllers that asked for it learn that the log may have changed.
    fn notify_discovery_change(&mut self) {
        let keys: Vec<_> = self
            .controllers
            .iter()
            .filter(|(_, c)| c.shared.kind == SubsystemKind::Discovery)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            cmd::admin::raise_discovery_notice(self, key);
        }
    }

    /// Drops a subsystem from this reactor: its controllers fail (their queues disconnect),
    /// its namespaces drain.
    pub fn remove_subsystem(&mut self, id: SubsystemId) {
        let Some(old) = self.subsystems.remove(&id) else {
            return;
        };
        self.by_nqn.remove(&old.config.nqn);
        for ctrl in old.config.shared.controllers() {
            ctrl.fail();
        }
        for (_, gone) in old.namespaces {
            self.retire_namespace(gone);
        }
        self.notify_discovery_change();
    }

    fn retire_namespace(&mut self, slot: NsSlot) {
        let Some(gone) = self.ns_table.remove(slot) else {
            return;
        };
        if gone.channel.in_flight() > 0 || !gone.retry.is_empty() {
            self.draining.push(gone);
        }
    }

    /// Tells each of this reactor's controllers of the subsystem about the namespaces that
    /// changed for its host: those added, removed or replaced that it sees before or after,
    /// and those whose visibility to its host changed (namespace masking). A controller
    /// that sees no difference hears nothing, as SPDK notifies only controllers a change is
    /// visible to.
    fn notify_namespace_change(
        &mut self,
        id: SubsystemId,
        replaced: &[u32],
        old: Option<&SubsystemConfig>,
        new: &SubsystemConfig,
    ) {
        let masking_changed = old.is_some_and(|o| o.ns_hosts != new.ns_hosts);
        if replaced.is_empty() && !masking_changed {
            return;
        }
        let keys: Vec<_> = self
            .controllers
            .keys()
            .filter(|(sid, _)| *sid == id)
            .copied()
            .collect();
        for key in keys {
            let Some(ctrl) = self.controllers.get_mut(&key) else {
                continue;
            };
            let host = ctrl.shared.hostnqn.clone();
            let saw = |nsid: u32| old.is_some_and(|o| o.ns_visible_to(nsid, &host));
            let mut nsids: Vec<u32> = replaced
                .iter()
                .copied()
                .filter(|&nsid| saw(nsid) || new.ns_visible_to(nsid, &host))
                .collect();
            if masking_changed {
                nsids.extend(new.namespaces.keys().copied().filter(|&nsid| {
                    !replaced.contains(&nsid) && saw(nsid) != new.ns_visible_to(nsid, &host)
                }));
            }
            if nsids.is_empty() {
                continue;
            }
            for nsid in nsids {
                ctrl.note_changed_namespace(nsid);
            }
            cmd::admin::raise_namespace_notice(self, key);
        }
    }

    /// Tells each of this reactor's controllers of the subsystem whose ANA view changed (a
    /// group's state through its listener, a namespace's group, a namespace it sees come or
    /// go): its ANA log change count moves, and when a namespace it already saw changed group
    /// or state, it gets an ANA Change notice (SPDK notifies the controllers of the listener
    /// whose state was set; added namespaces are announced by the namespace notice, and Linux
    /// reads the ANA log for a namespace whose group it does not know).
    fn notify_ana_change(&mut self, old: &SubsystemConfig, new: &SubsystemConfig) {
        if !new.ana_reporting {
            return;
        }
        let keys: Vec<_> = self
            .controllers
            .keys()
            .filter(|(sid, _)| *sid == new.id)
            .copied()
            .collect();
        for key in keys {
            let Some(ctrl) = self.controllers.get_mut(&key) else {
                continue;
            };
            let (listener, host) = (ctrl.shared.listener.as_ref(), &ctrl.shared.hostnqn);
            let before = old.ana_view(listener, host);
            let after = new.ana_view(listener, host);
            if before == after {
                continue;
            }
            ctrl.ana_change_count = ctrl.ana_change_count.wrapping_add(1);
            let moved = before
                .iter()
                .any(|(nsid, was)| after.get(nsid).is_some_and(|now| now != was));
            if moved {
                cmd::admin::raise_ana_notice(self, key);
            }
        }
    }
}

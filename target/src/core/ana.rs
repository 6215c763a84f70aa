//! Asymmetric Namespace Access (NVMe 2.0 base, 8.1.1): ANA groups and their state per
//! listener, the way SPDK models them.
//!
//! Every namespace belongs to one ANA group (`anagrpid`, its NSID unless configured). Each
//! listener of the subsystem holds a state per group, so the same namespace can be optimized
//! through one port and inaccessible through another: a host with a controller behind each
//! port picks its path by the ANA log page. A controller sees the states of the listener its
//! admin queue came through. All of it is part of the subsystem snapshot, so reactors read it
//! without locks and a change reaches them with the next update.

use std::collections::BTreeMap;

use nvmf_common::spec::log_page::{AnaGroupDescriptor, AnaLogHeader, AnaState};
use nvmf_common::spec::Status;
use zerocopy::{FromZeros, IntoBytes};

use crate::core::subsystem::{ListenAddress, SubsystemConfig};

/// Identify ANATT: seconds a group may stay in the change state before the host gives up on
/// the path (Linux waits twice this, then resets the controller). SPDK and nvmet report 10.
pub const ANA_TRANSITION_TIME_S: u8 = 10;

/// The states in SPDK's spelling (`nvme_ana_state_str`), which its RPCs take and show.
pub const STATE_NAMES: [(AnaState, &str); 5] = [
    (AnaState::OPTIMIZED, "optimized"),
    (AnaState::NON_OPTIMIZED, "non_optimized"),
    (AnaState::INACCESSIBLE, "inaccessible"),
    (AnaState::PERSISTENT_LOSS, "persistent_loss"),
    (AnaState::CHANGE, "change"),
];

pub fn state_name(state: AnaState) -> &'static str {
    STATE_NAMES
        .iter()
        .find(|(s, _)| *s == state)
        .map_or("unknown", |(_, n)| n)
}

pub fn parse_state(name: &str) -> Option<AnaState> {
    STATE_NAMES
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(s, _)| *s)
}

/// The status an I/O command to a namespace in `state` completes with (NVMe 2.0 base, 8.1.3):
/// path-related, and never DNR, so a multipath host retries it on another path.
pub fn io_status(state: AnaState) -> Option<Status> {
    match state {
        AnaState::INACCESSIBLE => Some(Status::ANA_INACCESSIBLE),
        AnaState::PERSISTENT_LOSS => Some(Status::ANA_PERSISTENT_LOSS),
        AnaState::CHANGE => Some(Status::ANA_TRANSITION),
        _ => None,
    }
}

/// One listener's ANA states: one for every group, with per-group exceptions. (SPDK keeps an
/// array over every possible group; a default plus exceptions says the same and covers groups
/// created later.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerAna {
    all: AnaState,
    groups: BTreeMap<u32, AnaState>,
}

impl ListenerAna {
    pub fn new(state: AnaState) -> Self {
        Self {
            all: state,
            groups: BTreeMap::new(),
        }
    }

    pub fn state(&self, grpid: u32) -> AnaState {
        self.groups.get(&grpid).copied().unwrap_or(self.all)
    }

    /// Sets one group's state, or every group's when `grpid` is `None`. True if a state
    /// changed.
    pub fn set(&mut self, grpid: Option<u32>, state: AnaState) -> bool {
        match grpid {
            None => {
                let changed = self.all != state || !self.groups.is_empty();
                self.all = state;
                self.groups.clear();
                changed
            }
            Some(g) => {
                let changed = self.state(g) != state;
                if state == self.all {
                    self.groups.remove(&g);
                } else {
                    self.groups.insert(g, state);
                }
                changed
            }
        }
    }

    /// The state of every group without an exception.
    pub fn default_state(&self) -> AnaState {
        self.all
    }

    /// Groups whose state differs from [`Self::default_state`], ascending.
    /// Drops the states of groups above `max`, which no namespace can be in any more.
    pub fn forget_groups_above(&mut self, max: u32) {
        self.groups.retain(|&g, _| g <= max);
    }

    pub fn exceptions(&self) -> impl Iterator<Item = (u32, AnaState)> + '_ {
        self.groups.iter().map(|(&g, &s)| (g, s))
    }
}

/// A subsystem's ANA configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnaConfig {
    /// ANA group of each namespace, by NSID.
    pub ns_groups: BTreeMap<u32, u32>,
    /// Per listener, the state of each group through it.
    pub listeners: BTreeMap<ListenAddress, ListenerAna>,
}

/// What one controller sees: for each namespace its host sees, the namespace's group and that
/// group's state through the controller's listener. The ANA log page is a function of it.
pub type AnaView = BTreeMap<u32, (u32, AnaState)>;

impl SubsystemConfig {
    /// The namespace's ANA group; SPDK's default is the NSID.
    pub fn anagrpid(&self, nsid: u32) -> u32 {
        self.ana.ns_groups.get(&nsid).copied().unwrap_or(nsid)
    }

    /// The state of group `grpid` for a controller that came through `listener`. Without ANA
    /// reporting, or through a transport that does not say, every path is optimized; through
    /// a listener the subsystem no longer has, nothing is accessible (SPDK's rule for an
    /// inactive listener).
    pub fn ana_state(&self, listener: Option<&ListenAddress>, grpid: u32) -> AnaState {
        if !self.ana_reporting {
            return AnaState::OPTIMIZED;
        }
        match listener {
            None => AnaState::OPTIMIZED,
            Some(addr) => self
                .ana
                .listeners
                .get(addr)
                .map_or(AnaState::INACCESSIBLE, |l| l.state(grpid)),
        }
    }

    /// The state of the namespace `nsid` through `listener`.
    pub fn ns_ana_state(&self, listener: Option<&ListenAddress>, nsid: u32) -> AnaState {
        self.ana_state(listener, self.anagrpid(nsid))
    }

    /// Identify ANAGRPMAX: the largest group id in use or possible. Group ids are limited to
    /// the highest NSID when assigned, as in SPDK; a group whose namespace with the highest
    /// NSID went away keeps the bound up, so no descriptor ever exceeds it (Linux refuses a
    /// log page whose group id is above ANAGRPMAX).
    pub fn ana_group_max(&self) -> u32 {
        let highest = self.ana.ns_groups.values().copied().max().unwrap_or(0);
        self.max_nsid().max(highest)
    }

    /// The ANA view of a controller of `hostnqn` that came through `listener`.
    pub fn ana_view(&self, listener: Option<&ListenAddress>, hostnqn: &str) -> AnaView {
        self.namespaces
            .values()
            .filter(|ns| self.ns_visible(ns, hostnqn))
            .map(|ns| {
                let grpid = self.anagrpid(ns.nsid);
                (ns.nsid, (grpid, self.ana_state(listener, grpid)))
            })
            .collect()
    }
}

/// The ANA log page for `view` (NVMe 2.0 base, 5.16.1.13): one descriptor per group that holds
/// a namespace the controller sees, ascending, each followed by its NSIDs ascending (Linux
/// walks them in step with its own sorted namespace list) unless the host asked for groups
/// only (RGO).
pub fn log_page(view: &AnaView, chgcnt: u64, groups_only: bool) -> Vec<u8> {
    let mut groups: BTreeMap<u32, (AnaState, Vec<u32>)> = BTreeMap::new();
    for (&nsid, &(grpid, state)) in view {
        groups
            .entry(grpid)
            .or_insert_with(|| (state, Vec::new()))
            .1
            .push(nsid);
    }
    let mut header = AnaLogHeader::new_zeroed();
    header.chgcnt.set(chgcnt);
    header.ngrps.set(groups.len() as u16);
    let mut page = header.as_bytes().to_vec();
    for (grpid, (state, nsids)) in groups {
        let mut desc = AnaGroupDescriptor::new_zeroed();
        desc.grpid.set(grpid);
        desc.chgcnt.set(chgcnt);
        desc.state = state.0;
        if !groups_only {
            desc.nnsids.set(nsids.len() as u32);
        }
        page.extend_from_slice(desc.as_bytes());
        if !groups_only {
            for nsid in nsids {
                page.extend_from_slice(&nsid.to_le_bytes());
            }
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    #[test]
    fn names_round_trip_in_spdks_spelling() {
        for (state, name) in STATE_NAMES {
            assert_eq!(parse_state(name), Some(state));
            assert_eq!(state_name(state), name);
        }
        assert_eq!(parse_state("Optimized"), None);
        assert_eq!(parse_state("transition"), None);
    }

    #[test]
    fn listener_states_default_and_exceptions() {
        let mut l = ListenerAna::new(AnaState::OPTIMIZED);
        assert!(!l.set(Some(3), AnaState::OPTIMIZED), "no change");
        assert!(l.set(Some(3), AnaState::INACCESSIBLE));
        assert_eq!(l.state(3), AnaState::INACCESSIBLE);
        assert_eq!(l.state(4), AnaState::OPTIMIZED);
        assert_eq!(
            l.exceptions().collect::<Vec<_>>(),
            [(3, AnaState::INACCESSIBLE)]
        );
        assert!(l.set(None, AnaState::NON_OPTIMIZED));
        assert_eq!(l.state(3), AnaState::NON_OPTIMIZED);
        assert_eq!(l.exceptions().count(), 0);
        assert!(!l.set(None, AnaState::NON_OPTIMIZED));
        assert!(l.set(Some(7), AnaState::CHANGE));
        assert!(
            l.set(Some(7), AnaState::NON_OPTIMIZED),
            "back to the default"
        );
        assert_eq!(l.exceptions().count(), 0);
    }

    #[test]
    fn io_statuses_are_path_errors_without_dnr() {
        assert_eq!(io_status(AnaState::OPTIMIZED), None);
        assert_eq!(io_status(AnaState::NON_OPTIMIZED), None);
        for (state, sc) in [
            (AnaState::PERSISTENT_LOSS, 0x01),
            (AnaState::INACCESSIBLE, 0x02),
            (AnaState::CHANGE, 0x03),
        ] {
            let status = io_status(state).unwrap();
            assert_eq!((status.sct.0, status.sc, status.dnr), (3, sc, false));
        }
    }

    #[test]
    fn log_page_layout() {
        let view: AnaView = [
            (1, (1, AnaState::OPTIMIZED)),
            (2, (5, AnaState::INACCESSIBLE)),
            (3, (1, AnaState::OPTIMIZED)),
        ]
        .into_iter()
        .collect();
        let page = log_page(&view, 9, false);
        assert_eq!(page.len(), 16 + 32 + 8 + 32 + 4);
        let header = AnaLogHeader::read_from_bytes(&page[..16]).unwrap();
        assert_eq!((header.chgcnt.get(), header.ngrps.get()), (9, 2));
        let d1 = AnaGroupDescriptor::read_from_bytes(&page[16..48]).unwrap();
        assert_eq!((d1.grpid.get(), d1.nnsids.get(), d1.state), (1, 2, 1));
        assert_eq!(&page[48..56], &[1, 0, 0, 0, 3, 0, 0, 0]);
        let d5 = AnaGroupDescriptor::read_from_bytes(&page[56..88]).unwrap();
        assert_eq!((d5.grpid.get(), d5.nnsids.get(), d5.state), (5, 1, 3));
        assert_eq!(&page[88..92], &[2, 0, 0, 0]);

        let rgo = log_page(&view, 9, true);
        assert_eq!(rgo.len(), 16 + 2 * 32);
        let d5 = AnaGroupDescriptor::read_from_bytes(&rgo[48..80]).unwrap();
        assert_eq!((d5.grpid.get(), d5.nnsids.get(), d5.state), (5, 0, 3));
    }
}

//! Removing a host's device (`rdma link delete`, a driver unbound) and bringing it back.
//!
//! What the kernel does, and so the simulation: every CM id bound to the device gets
//! `DEVICE_REMOVAL`; the kernel side of each id is closed at once (a connected one sends its
//! peer a DREQ, a listener stops listening); QPs go to Error. Nothing new can be made on the
//! device. The removal itself then waits until its users have closed everything they hold
//! on it (a provider without `disassociate_ucontext`, rxe among them, blocks `rdma link
//! delete` until then): [`DeviceObjects`] counts what they still hold.

use super::cm::{CmMsg, CmSt};
use super::fabric::{FabricState, HostId};
use crate::rdma::cm::CmEventKind;

/// What users still hold on a host's device: contexts, PDs, CQs, SRQs, QPs, registrations
/// and CM ids bound to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceObjects {
    pub contexts: usize,
    pub pds: usize,
    pub cqs: usize,
    pub srqs: usize,
    pub qps: usize,
    pub mrs: usize,
    pub cm_ids: usize,
}

impl DeviceObjects {
    pub fn total(&self) -> usize {
        self.contexts + self.pds + self.cqs + self.srqs + self.qps + self.mrs + self.cm_ids
    }
}

impl FabricState {
    pub(crate) fn remove_device(&mut self, h: HostId) {
        if self.hosts[h].removed {
            return;
        }
        self.hosts[h].removed = true;
        self.hosts[h].incarnation += 1;
        self.trace(|| format!("host {h}: device removed"));
        let ids: Vec<_> = self
            .cm_ids
            .iter()
            .filter(|(_, s)| s.device == Some(h))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            let (st, qp, peer, bound) = {
                let s = &self.cm_ids[&id];
                (s.st, s.qp, s.peer_id, s.bound)
            };
            if let Some(qp) = qp {
                self.qp_to_error(qp, None);
            }
            if let (Some(to), CmSt::Connected | CmSt::Accepted | CmSt::DreqRcvd) = (peer, st) {
                let msg = if st == CmSt::DreqRcvd {
                    CmMsg::Drep { to }
                } else {
                    CmMsg::Dreq { to }
                };
                self.cm_send(id, Some(to), msg);
            }
            if let Some(key) = bound {
                if self.bound.get(&key) == Some(&id) {
                    self.bound.remove(&key);
                }
            }
            self.clear_timer(id);
            let s = self.cm_ids.get_mut(&id).expect("listed above");
            s.st = CmSt::Closed;
            s.bound = None;
            self.push_plain_event(id, CmEventKind::DeviceRemoval, 0);
        }
    }

    pub(crate) fn restore_device(&mut self, h: HostId) {
        if std::mem::take(&mut self.hosts[h].removed) {
            self.trace(|| format!("host {h}: device back"));
        }
    }

    pub(crate) fn device_objects(&self, h: HostId) -> DeviceObjects {
        let pd_on = |pd| self.pds.get(pd) == Some(&h);
        DeviceObjects {
            contexts: self.hosts[h].open_contexts,
            pds: self.pds.values().filter(|&&host| host == h).count(),
            cqs: self.cqs.values().filter(|c| c.host == h).count(),
            srqs: self.srqs.values().filter(|s| pd_on(&s.pd)).count(),
            qps: self.qps.values().filter(|q| q.host == h).count(),
            mrs: self.mrs.values().filter(|m| pd_on(&m.pd)).count(),
            cm_ids: self.cm_ids.values().filter(|s| s.device == Some(h)).count(),
        }
    }

    /// Whether a context of incarnation `incarnation` of host `h`'s device may make objects.
    pub(crate) fn device_live(&self, h: HostId, incarnation: u32) -> bool {
        let host = &self.hosts[h];
        !host.removed && host.incarnation == incarnation
    }
}

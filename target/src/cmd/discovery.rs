//! The Discovery Log (NVMe-oF 1.1, 5.3; NVMe 2.0 base, 5.16.1.23): one entry per (subsystem,
//! listener) the connecting host may use.

use std::collections::BTreeSet;

use nvmf_common::spec::identify::set_nqn;
use nvmf_common::spec::log_page::{
    AddressFamily, DiscoveryLogEntry, DiscoveryLogHeader, SubsystemType, TransportType,
    RDMA_CMS_RDMA_CM, RDMA_PRTYPE_NOT_SPECIFIED, RDMA_QPTYPE_CONNECTED,
    TREQ_SECURE_CHANNEL_NOT_REQUIRED, TREQ_SECURE_CHANNEL_REQUIRED,
};
use nvmf_common::spec::nqn::DISCOVERY_NQN;
use std::sync::atomic::Ordering;
use zerocopy::{FromZeros, IntoBytes};

use crate::core::subsystem::{ListenAddress, SubsystemKind};
use crate::core::CoreCtx;

/// Admin submission queue size advertised in entries (ASQSZ): what Linux hosts use.
const ASQSZ: u16 = 32;
/// Controller id "dynamic" in discovery entries.
const CNTLID_DYNAMIC: u16 = 0xFFFF;

pub fn trtype_code(trtype: &str) -> TransportType {
    match trtype.to_ascii_uppercase().as_str() {
        "RDMA" => TransportType::RDMA,
        "TCP" => TransportType::TCP,
        "FC" => TransportType::FC,
        _ => TransportType::INTRA_HOST,
    }
}

pub fn adrfam_code(adrfam: &str) -> AddressFamily {
    match adrfam.to_ascii_uppercase().as_str() {
        "IPV4" => AddressFamily::IPV4,
        "IPV6" => AddressFamily::IPV6,
        "IB" => AddressFamily::IB,
        "FC" => AddressFamily::FC,
        _ => AddressFamily::INTRA_HOST,
    }
}

/// The whole log page for `hostnqn`, asked through the listener `via`: header, then one entry
/// per listener of each subsystem the host may use, subsystems in NQN order, then the current
/// discovery subsystem's own entry, then the target's referrals.
///
/// As nvmet does, a discovery controller that came through a known listener sees only the
/// subsystems exported on that listener (other ports, other tenants); where the transport does
/// not say (`None`), every listener is listed, as SPDK's default discovery filter does.
/// Referrals are listed to every host through every port, newest first, as SPDK lists them
/// (`nvmf_generate_discovery_log`).
pub fn log_page(core: &CoreCtx, hostnqn: &str, via: Option<&ListenAddress>) -> Vec<u8> {
    let mut subsystems: Vec<_> = core
        .subsystem_configs()
        .filter(|s| s.kind == SubsystemKind::Nvm && s.host_allowed(hostnqn))
        .collect();
    subsystems.sort_by(|a, b| a.nqn.cmp(&b.nqn));
    // Port ids: a listener's position among all listen addresses, stable while they are.
    let ports: BTreeSet<&ListenAddress> = core
        .subsystem_configs()
        .flat_map(|s| s.listeners.iter())
        .chain(via)
        .collect();
    let port_id = |addr: &ListenAddress| ports.iter().position(|p| *p == addr).unwrap_or(0) as u16;

    let mut entries = Vec::new();
    for sub in subsystems {
        for addr in sub
            .listeners
            .iter()
            .filter(|addr| via.is_none_or(|v| v == *addr))
        {
            entries.push(entry(addr, port_id(addr), SubsystemType::NVME, &sub.nqn));
        }
    }
    // NVMe-oF 1.1: the discovery subsystem answering, at the address it was reached through
    // (hosts use it to learn the port's own parameters; nvme-cli does not connect to it).
    if let Some(addr) = via {
        entries.push(entry(
            addr,
            port_id(addr),
            SubsystemType::CURRENT_DISCOVERY,
            DISCOVERY_NQN,
        ));
    }
    for r in core.referrals.iter().rev() {
        // SPDK's referral entry: subtype 1 for another discovery service, 2 for an NVM
        // subsystem, cntlid FFFFh, port id 0 (the port is the referred target's, unknown here).
        let subtype = if r.subnqn == DISCOVERY_NQN {
            SubsystemType::REFERRAL
        } else {
            SubsystemType::NVME
        };
        let mut e = entry(&r.address, 0, subtype, &r.subnqn);
        if r.secure_channel {
            e.treq = TREQ_SECURE_CHANNEL_REQUIRED;
        }
        entries.push(e);
    }
    let mut header = DiscoveryLogHeader::new_zeroed();
    header
        .genctr
        .set(core.info.discovery_genctr.load(Ordering::Relaxed));
    header.numrec.set(entries.len() as u64);
    let mut page = Vec::with_capacity(1024 * (entries.len() + 1));
    page.extend_from_slice(header.as_bytes());
    for e in &entries {
        page.extend_from_slice(e.as_bytes());
    }
    page
}

fn entry(
    addr: &ListenAddress,
    portid: u16,
    subtype: SubsystemType,
    subnqn: &str,
) -> DiscoveryLogEntry {
    let mut e = DiscoveryLogEntry::new_zeroed();
    let trtype = trtype_code(&addr.trtype);
    e.trtype = trtype.0;
    e.adrfam = adrfam_code(&addr.adrfam).0;
    e.subtype = subtype.0;
    e.treq = TREQ_SECURE_CHANNEL_NOT_REQUIRED;
    e.portid.set(portid);
    e.cntlid.set(CNTLID_DYNAMIC);
    e.asqsz.set(ASQSZ);
    set_nqn(&mut e.trsvcid, &addr.trsvcid);
    set_nqn(&mut e.subnqn, subnqn);
    set_nqn(&mut e.traddr, &addr.traddr);
    if trtype == TransportType::RDMA {
        let tsas = e.rdma_tsas_mut();
        tsas.rdma_qptype = RDMA_QPTYPE_CONNECTED;
        tsas.rdma_prtype = RDMA_PRTYPE_NOT_SPECIFIED;
        tsas.rdma_cms = RDMA_CMS_RDMA_CM;
    }
    e
}

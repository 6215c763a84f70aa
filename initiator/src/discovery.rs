//! Discovery (NVMe-oF 1.1, 5.3): connect to the discovery subsystem and read its log page the
//! way nvme-cli does: the header for the record count, the whole page, then the header again
//! to be sure the generation counter did not move meanwhile (else start over).

use std::time::Duration;

use nvmf_common::rdma::{RealVerbs, Verbs};
use nvmf_common::spec::identify::nul_str;
use nvmf_common::spec::log_page::{AddressFamily as WireAdrfam, RdmaTsas, SubsystemType};
use nvmf_common::spec::{DiscoveryLogEntry, DiscoveryLogHeader, LogPageId, DISCOVERY_NQN};
use zerocopy::FromBytes;

use crate::address::{AddressFamily, TransportId};
use crate::controller::{Controller, ControllerOptions};
use crate::error::{Error, Result};

const HEADER_LEN: usize = 1024;
const ENTRY_LEN: usize = 1024;
const MAX_RETRIES: usize = 10;

/// One discovery log entry, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub eflags: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    pub rdma_qptype: u8,
    pub rdma_prtype: u8,
    pub rdma_cms: u8,
    pub rdma_pkey: u16,
}

impl DiscoveryEntry {
    pub fn parse(e: &DiscoveryLogEntry) -> Self {
        let tsas = RdmaTsas::read_from_bytes(&e.tsas).expect("256 bytes");
        Self {
            trtype: e.trtype,
            adrfam: e.adrfam,
            subtype: e.subtype,
            treq: e.treq,
            portid: e.portid.get(),
            cntlid: e.cntlid.get(),
            asqsz: e.asqsz.get(),
            eflags: e.eflags.get(),
            trsvcid: nul_str(&e.trsvcid).trim().to_string(),
            subnqn: nul_str(&e.subnqn).to_string(),
            traddr: nul_str(&e.traddr).trim().to_string(),
            rdma_qptype: tsas.rdma_qptype,
            rdma_prtype: tsas.rdma_prtype,
            rdma_cms: tsas.rdma_cms,
            rdma_pkey: tsas.rdma_pkey.get(),
        }
    }

    /// A transport ID for this entry's subsystem (RDMA entries with a numeric address only).
    pub fn transport_id(&self) -> Option<TransportId> {
        if self.trtype != 1 || self.traddr.parse::<std::net::IpAddr>().is_err() {
            return None;
        }
        let port = self.trsvcid.parse().ok()?;
        Some(TransportId::rdma(&self.traddr, port, &self.subnqn))
    }
}

/// Whether `traddr` is a numeric address of family `adrfam`.
fn numeric_address_of(traddr: &str, adrfam: AddressFamily) -> bool {
    match traddr.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_ipv6() == (adrfam == AddressFamily::IPv6),
        Err(_) => false,
    }
}

/// The discovery log: generation counter and entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryLog {
    pub genctr: u64,
    pub entries: Vec<DiscoveryEntry>,
}

/// Parses a whole discovery log page (header and `numrec` entries).
pub fn parse_log(raw: &[u8]) -> Result<DiscoveryLog> {
    let (hdr, _) = DiscoveryLogHeader::read_from_prefix(raw)
        .map_err(|_| Error::Invalid("discovery log shorter than its header".into()))?;
    let numrec = hdr.numrec.get() as usize;
    let mut entries = Vec::with_capacity(numrec.min(1024));
    for i in 0..numrec {
        let off = HEADER_LEN + i * ENTRY_LEN;
        let Some(bytes) = raw.get(off..off + ENTRY_LEN) else {
            return Err(Error::Invalid(format!(
                "discovery log has {numrec} records but only {} bytes",
                raw.len()
            )));
        };
        entries.push(DiscoveryEntry::parse(
            &DiscoveryLogEntry::read_from_bytes(bytes).expect("1024 bytes"),
        ));
    }
    Ok(DiscoveryLog {
        genctr: hdr.genctr.get(),
        entries,
    })
}

/// What to attach when a transport ID names no subsystem, as `spdk_nvme_perf -r` and SPDK's
/// fio plugin do: every NVM subsystem entry of the discovery log, at the entry's own
/// address and port. Referrals and discovery entries are skipped (SPDK does not follow
/// referrals either), as are entries of another transport and entries listed twice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttachPlan {
    /// The subsystems to connect, in log order; each keeps the source's `hostnqn` and `ns`.
    pub attach: Vec<TransportId>,
    /// One line per entry left out, and why.
    pub skipped: Vec<String>,
}

/// Plans the attachments for `log`, read from the discovery service at `source`.
pub fn attach_plan(source: &TransportId, log: &DiscoveryLog) -> AttachPlan {
    let mut plan = AttachPlan::default();
    for (i, e) in log.entries.iter().enumerate() {
        let what = format!(
            "discovery log entry {i} ({} at {}:{})",
            e.subnqn, e.traddr, e.trsvcid
        );
        match SubsystemType(e.subtype) {
            SubsystemType::NVME => {}
            SubsystemType::REFERRAL => {
                plan.skipped
                    .push(format!("{what}: a referral to another discovery service"));
                continue;
            }
            SubsystemType::CURRENT_DISCOVERY => {
                plan.skipped
                    .push(format!("{what}: the discovery subsystem itself"));
                continue;
            }
            t => {
                plan.skipped
                    .push(format!("{what}: unknown subsystem type {}", t.0));
                continue;
            }
        }
        if e.subnqn == DISCOVERY_NQN {
            plan.skipped
                .push(format!("{what}: the discovery subsystem itself"));
            continue;
        }
        if e.trtype != 1 {
            plan.skipped
                .push(format!("{what}: transport type {} (only RDMA)", e.trtype));
            continue;
        }
        let adrfam = match WireAdrfam(e.adrfam) {
            WireAdrfam::IPV4 => AddressFamily::IPv4,
            WireAdrfam::IPV6 => AddressFamily::IPv6,
            f => {
                plan.skipped
                    .push(format!("{what}: address family {} (only IPv4, IPv6)", f.0));
                continue;
            }
        };
        let Ok(trsvcid) = e.trsvcid.parse() else {
            plan.skipped
                .push(format!("{what}: trsvcid {:?} is not a port", e.trsvcid));
            continue;
        };
        if e.traddr.is_empty() || e.subnqn.is_empty() {
            plan.skipped.push(format!("{what}: no address or no NQN"));
            continue;
        }
        // An IPv4 or IPv6 entry's TRADDR is an address (NVMe-oF, Discovery Log Page Entry).
        // A name would be looked up in DNS, blocking, at a name the target chose.
        if !numeric_address_of(&e.traddr, adrfam) {
            plan.skipped.push(format!(
                "{what}: traddr {:?} is not an {adrfam:?} address",
                e.traddr
            ));
            continue;
        }
        let tid = TransportId {
            adrfam,
            traddr: e.traddr.clone(),
            trsvcid,
            subnqn: e.subnqn.clone(),
            hostnqn: source.hostnqn.clone(),
            ns: source.ns,
        };
        if plan.attach.contains(&tid) {
            plan.skipped.push(format!("{what}: listed twice"));
            continue;
        }
        plan.attach.push(tid);
    }
    plan
}

/// Reads the discovery log of a connected discovery controller.
pub fn read_discovery_log<V: Verbs>(ctrl: &mut Controller<V>) -> Result<DiscoveryLog> {
    for _ in 0..MAX_RETRIES {
        let hdr = ctrl.get_log_page(0, LogPageId::DISCOVERY, HEADER_LEN)?;
        let (h, _) = DiscoveryLogHeader::read_from_prefix(&hdr).expect("1024 bytes");
        let (genctr, numrec) = (h.genctr.get(), h.numrec.get() as usize);
        if numrec > 4096 {
            return Err(Error::Invalid(format!(
                "discovery log claims {numrec} records"
            )));
        }
        let raw = ctrl.get_log_page(0, LogPageId::DISCOVERY, HEADER_LEN + numrec * ENTRY_LEN)?;
        let again = ctrl.get_log_page(0, LogPageId::DISCOVERY, HEADER_LEN)?;
        let (h2, _) = DiscoveryLogHeader::read_from_prefix(&again).expect("1024 bytes");
        if h2.genctr.get() == genctr {
            let mut log = parse_log(&raw)?;
            log.entries.truncate(numrec);
            return Ok(log);
        }
    }
    Err(Error::Invalid(format!(
        "the discovery log kept changing ({MAX_RETRIES} tries)"
    )))
}

/// Connects to the discovery subsystem at `tid`'s address, reads the log, disconnects.
pub fn discover(tid: &TransportId, opts: &ControllerOptions) -> Result<DiscoveryLog> {
    discover_with(RealVerbs, tid, opts)
}

/// [`discover`] over the verbs provider `verbs`.
pub fn discover_with<V: Verbs>(
    verbs: V,
    tid: &TransportId,
    opts: &ControllerOptions,
) -> Result<DiscoveryLog> {
    let opts = ControllerOptions {
        kato: Duration::ZERO,
        io_queues: 0,
        reconnect: None,
        ..opts.clone()
    };
    let mut ctrl = Controller::connect_with(verbs, &tid.discovery(), opts)?;
    let log = read_discovery_log(&mut ctrl);
    let _ = ctrl.disconnect();
    log
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_common::spec::identify::set_nqn;
    use zerocopy::{FromZeros, IntoBytes};

    #[test]
    fn parse_header_and_entries() {
        let mut hdr = DiscoveryLogHeader::new_zeroed();
        hdr.genctr.set(7);
        hdr.numrec.set(2);
        let mut raw = hdr.as_bytes().to_vec();
        for (i, nqn) in [
            "nqn.2014-08.org.nvmexpress.discovery",
            "nqn.2016-06.io.spdk:cnode1",
        ]
        .iter()
        .enumerate()
        {
            let mut e = DiscoveryLogEntry::new_zeroed();
            e.trtype = 1;
            e.adrfam = 1;
            e.subtype = if i == 0 { 3 } else { 2 };
            e.portid.set(1);
            e.cntlid.set(0xFFFF);
            set_nqn(&mut e.trsvcid, "4420");
            set_nqn(&mut e.traddr, "10.0.0.1");
            set_nqn(&mut e.subnqn, nqn);
            e.rdma_tsas_mut().rdma_qptype = 1;
            e.rdma_tsas_mut().rdma_cms = 1;
            raw.extend_from_slice(e.as_bytes());
        }
        let log = parse_log(&raw).unwrap();
        assert_eq!(log.genctr, 7);
        assert_eq!(log.entries.len(), 2);
        let e = &log.entries[1];
        assert_eq!(e.subnqn, "nqn.2016-06.io.spdk:cnode1");
        assert_eq!(e.traddr, "10.0.0.1");
        assert_eq!(e.rdma_qptype, 1);
        let tid = e.transport_id().unwrap();
        assert_eq!(tid.trsvcid, 4420);
        assert_eq!(tid.subnqn, e.subnqn);
        assert!(parse_log(&raw[..HEADER_LEN + 100]).is_err());
    }

    fn entry(
        subtype: u8,
        trtype: u8,
        adrfam: u8,
        traddr: &str,
        trsvcid: &str,
        nqn: &str,
    ) -> DiscoveryEntry {
        DiscoveryEntry {
            trtype,
            adrfam,
            subtype,
            treq: 0,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: trsvcid.into(),
            subnqn: nqn.into(),
            traddr: traddr.into(),
            rdma_qptype: 1,
            rdma_prtype: 0,
            rdma_cms: 1,
            rdma_pkey: 0,
        }
    }

    #[test]
    fn plan_attaches_every_nvm_subsystem_at_its_own_address() {
        let source: TransportId =
            "trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 hostnqn:nqn.h:1 ns:2"
                .parse()
                .unwrap();
        assert!(source.is_discovery());
        let log = DiscoveryLog {
            genctr: 3,
            entries: vec![
                entry(3, 1, 1, "10.0.0.1", "4420", DISCOVERY_NQN),
                entry(2, 1, 1, "10.0.0.1", "4420", "nqn.2016-06.io.spdk:cnode1"),
                entry(1, 1, 1, "10.0.0.9", "8009", "nqn.referral"),
                entry(2, 1, 1, "10.0.0.2", "4421", "nqn.2016-06.io.spdk:cnode2"),
                entry(2, 3, 1, "10.0.0.1", "4420", "nqn.tcp-only"),
                entry(2, 1, 2, "fe80::2", "4420", "nqn.v6"),
                entry(2, 1, 3, "ib-gid", "4420", "nqn.ib"),
                entry(2, 1, 1, "10.0.0.1", "x", "nqn.bad-port"),
                entry(2, 1, 1, "10.0.0.1", "4420", "nqn.2016-06.io.spdk:cnode1"),
                entry(7, 1, 1, "10.0.0.1", "4420", "nqn.future"),
                entry(2, 1, 1, "target.example", "4420", "nqn.by-name"),
                entry(2, 1, 1, "fe80::3", "4420", "nqn.v6-as-v4"),
            ],
        };
        let plan = attach_plan(&source, &log);
        let got: Vec<String> = plan.attach.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 subnqn:nqn.2016-06.io.spdk:cnode1 hostnqn:nqn.h:1 ns:2",
                "trtype:RDMA adrfam:IPv4 traddr:10.0.0.2 trsvcid:4421 subnqn:nqn.2016-06.io.spdk:cnode2 hostnqn:nqn.h:1 ns:2",
                "trtype:RDMA adrfam:IPv6 traddr:fe80::2 trsvcid:4420 subnqn:nqn.v6 hostnqn:nqn.h:1 ns:2",
            ]
        );
        assert_eq!(plan.skipped.len(), 9, "{:#?}", plan.skipped);
        for (needle, why) in [
            ("entry 0 ", "discovery subsystem itself"),
            ("entry 2 ", "referral"),
            ("entry 4 ", "transport type 3"),
            ("entry 6 ", "address family 3"),
            ("entry 7 ", "not a port"),
            ("entry 8 ", "listed twice"),
            ("entry 9 ", "unknown subsystem type 7"),
            ("entry 10 ", "not an IPv4 address"),
            ("entry 11 ", "not an IPv4 address"),
        ] {
            assert!(
                plan.skipped
                    .iter()
                    .any(|s| s.contains(needle) && s.contains(why)),
                "{needle}{why}: {:#?}",
                plan.skipped
            );
        }
    }

    #[test]
    fn plan_of_an_empty_log_attaches_nothing() {
        let source: TransportId = "traddr:10.0.0.1".parse().unwrap();
        let plan = attach_plan(
            &source,
            &DiscoveryLog {
                genctr: 0,
                entries: vec![],
            },
        );
        assert!(plan.attach.is_empty() && plan.skipped.is_empty());
    }
}

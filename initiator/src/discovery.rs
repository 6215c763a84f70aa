//! Discovery (NVMe-oF 1.1, 5.3): connect to the discovery subsystem and read its log page the
//! way nvme-cli does: the header for the record count, the whole page, then the header again
//! to be sure the generation counter did not move meanwhile (else start over).

use std::time::Duration;

use nvmf_common::spec::identify::nul_str;
use nvmf_common::spec::log_page::RdmaTsas;
use nvmf_common::spec::{DiscoveryLogEntry, DiscoveryLogHeader, LogPageId};
use zerocopy::FromBytes;

use crate::address::TransportId;
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

    /// A transport ID for this entry's subsystem (RDMA entries only).
    pub fn transport_id(&self) -> Option<TransportId> {
        if self.trtype != 1 {
            return None;
        }
        let port = self.trsvcid.parse().ok()?;
        Some(TransportId::rdma(&self.traddr, port, &self.subnqn))
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

/// Reads the discovery log of a connected discovery controller.
pub fn read_discovery_log(ctrl: &mut Controller) -> Result<DiscoveryLog> {
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
    let opts = ControllerOptions {
        kato: Duration::ZERO,
        io_queues: 0,
        reconnect: None,
        ..opts.clone()
    };
    let mut ctrl = Controller::connect(&tid.discovery(), opts)?;
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
}

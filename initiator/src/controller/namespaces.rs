//! Namespaces through a controller: Identify Namespace, the active namespace list, and
//! what multipath needs (the ANA log and state, and the identifiers that name a namespace
//! across controllers).

use std::time::Duration;

use nvmf_common::rdma::Verbs;
use nvmf_common::spec::identify::CMIC_ANA;
use nvmf_common::spec::{Cns, Command, IdentifyNamespace, LogPageId};
use zerocopy::FromBytes;

use crate::error::{Error, Result};
use crate::multipath::{AnaLog, AnaState, NamespaceIds, ANA_GROUP_DESC_LEN, ANA_LOG_HEADER_LEN};

use super::Controller;

/// Namespace facts an I/O application needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    pub block_size: u32,
    pub blocks: u64,
}

/// The most active namespaces an active namespace list may give (a million: 4 MiB of IDs).
pub const MAX_ACTIVE_NAMESPACES: usize = 1 << 20;

/// The block sizes an application can use: 512 B to 64 KiB (LBADS 9 to 16). Linux takes
/// no more than its page size; a target stating 0-byte or 2 GiB blocks is refused here,
/// before an application divides by it or sizes buffers from it.
const LBADS_RANGE: std::ops::RangeInclusive<u8> = 9..=16;

impl NamespaceInfo {
    /// The facts of namespace `nsid` from its Identify data; None if it is not active.
    pub fn from_identify(nsid: u32, ns: &IdentifyNamespace) -> Result<Option<Self>> {
        let blocks = ns.nsze.get();
        if blocks == 0 {
            return Ok(None);
        }
        let lbads = ns.current_lbaf().lbads;
        if !LBADS_RANGE.contains(&lbads) {
            return Err(Error::Invalid(format!(
                "namespace {nsid}: LBA data size 2^{lbads} bytes is not a block size this host supports"
            )));
        }
        let block_size = 1u32 << lbads;
        if blocks.checked_mul(u64::from(block_size)).is_none() {
            return Err(Error::Invalid(format!(
                "namespace {nsid}: {blocks} blocks of {block_size} bytes overflow a byte count"
            )));
        }
        Ok(Some(Self {
            nsid,
            block_size,
            blocks,
        }))
    }
}

/// The NSIDs of one page of the active namespace list (up to the first 0), asked for after
/// `after`, of a controller of `nn` namespaces. The list is in increasing order, each ID
/// above `after` and at most `nn`: a target answering
/// anything else (the same page again, say) would keep the caller asking for ever, the list
/// growing.
fn active_list_page(raw: &[u8], after: u32, nn: u32) -> Result<Vec<u32>> {
    let page: Vec<u32> = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&id| id != 0)
        .collect();
    let mut last = after;
    for &id in &page {
        if id <= last || id == u32::MAX {
            return Err(Error::Invalid(format!(
                "active namespace list: NSID {id} after {last} is out of order"
            )));
        }
        if id > nn {
            return Err(Error::Invalid(format!(
                "active namespace list: NSID {id} is above the controller's NN ({nn})"
            )));
        }
        last = id;
    }
    Ok(page)
}

impl<V: Verbs> Controller<V> {
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

    /// Active namespace IDs (Identify CNS 02h, all pages): at most Identify NN of them
    /// (and at most [`MAX_ACTIVE_NAMESPACES`]), each at most NN.
    pub fn active_namespaces(&mut self) -> Result<Vec<u32>> {
        let nn = self.info.identify.nn.get();
        let mut ids = Vec::new();
        let mut after = 0u32;
        loop {
            if ids.len() >= MAX_ACTIVE_NAMESPACES {
                return Err(Error::Invalid(format!(
                    "the active namespace list goes on past {MAX_ACTIVE_NAMESPACES} entries"
                )));
            }
            let (_, raw) = self.admin_read(
                Command::identify(0, Cns::ACTIVE_NAMESPACE_LIST, after, 0),
                4096,
                "Identify Active Namespace List",
            )?;
            let page = active_list_page(&raw, after, nn)?;
            let full = page.len() == 1024;
            after = page.last().copied().unwrap_or(after);
            ids.extend(page);
            if !full {
                return Ok(ids);
            }
        }
    }

    /// Block size and capacity of a namespace (None if it is not active).
    pub fn namespace(&mut self, nsid: u32) -> Result<Option<NamespaceInfo>> {
        let ns = self.identify_namespace(nsid)?;
        NamespaceInfo::from_identify(nsid, &ns)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    fn identify(nsze: u64, lbads: u8) -> IdentifyNamespace {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.nsze.set(nsze);
        ns.lbaf[0].lbads = lbads;
        ns
    }

    #[test]
    fn block_sizes_a_target_states_are_checked() {
        let info = NamespaceInfo::from_identify(1, &identify(1000, 12)).unwrap();
        assert_eq!(
            info,
            Some(NamespaceInfo {
                nsid: 1,
                block_size: 4096,
                blocks: 1000
            })
        );
        assert_eq!(
            NamespaceInfo::from_identify(1, &identify(0, 12)).unwrap(),
            None
        );
        for lbads in [0, 8, 17, 31, 32, 63, 255] {
            assert!(
                NamespaceInfo::from_identify(1, &identify(1000, lbads)).is_err(),
                "LBADS {lbads}"
            );
        }
        assert!(NamespaceInfo::from_identify(1, &identify(u64::MAX, 12)).is_err());
    }

    fn list(ids: &[u32]) -> Vec<u8> {
        let mut raw = vec![0u8; 4096];
        for (i, id) in ids.iter().enumerate() {
            raw[i * 4..i * 4 + 4].copy_from_slice(&id.to_le_bytes());
        }
        raw
    }

    #[test]
    fn an_active_namespace_list_out_of_order_is_refused() {
        assert_eq!(
            active_list_page(&list(&[1, 2, 7]), 0, 8).unwrap(),
            [1, 2, 7]
        );
        assert_eq!(
            active_list_page(&list(&[2000]), 1024, 4096).unwrap(),
            [2000]
        );
        // A target that ignores the starting NSID and sends the same page again.
        let full: Vec<u32> = (1..=1024).collect();
        assert_eq!(active_list_page(&list(&full), 0, 4096).unwrap().len(), 1024);
        assert!(active_list_page(&list(&full), 1024, 4096).is_err());
        assert!(active_list_page(&list(&[3, 3]), 0, 8).is_err());
        assert!(active_list_page(&list(&[5, 4]), 0, 8).is_err());
        assert!(active_list_page(&list(&[u32::MAX]), 0, u32::MAX).is_err());
        // Beyond the controller's NN: a target counting on past its namespaces.
        assert!(active_list_page(&list(&[1, 9]), 0, 8).is_err());
    }
}

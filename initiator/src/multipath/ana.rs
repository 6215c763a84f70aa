//! The Asymmetric Namespace Access log page (LID 0Ch): each ANA group's state and
//! namespaces, parsed from and built into its wire form.

use std::fmt;

/// ANA state of a namespace through one controller (NVMe 2.0 base, Figure 227, byte 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    /// ANA state change in progress (0Fh).
    Change,
    /// A reserved value from the wire: treated as not usable.
    Reserved(u8),
}

impl AnaState {
    pub fn from_raw(v: u8) -> Self {
        match v & 0x0F {
            0x01 => Self::Optimized,
            0x02 => Self::NonOptimized,
            0x03 => Self::Inaccessible,
            0x04 => Self::PersistentLoss,
            0x0F => Self::Change,
            v => Self::Reserved(v),
        }
    }

    pub fn to_raw(self) -> u8 {
        match self {
            Self::Optimized => 0x01,
            Self::NonOptimized => 0x02,
            Self::Inaccessible => 0x03,
            Self::PersistentLoss => 0x04,
            Self::Change => 0x0F,
            Self::Reserved(v) => v,
        }
    }

    /// Whether I/O may be sent through a path in this state.
    pub fn is_usable(self) -> bool {
        matches!(self, Self::Optimized | Self::NonOptimized)
    }
}

impl fmt::Display for AnaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Optimized => f.write_str("optimized"),
            Self::NonOptimized => f.write_str("non-optimized"),
            Self::Inaccessible => f.write_str("inaccessible"),
            Self::PersistentLoss => f.write_str("persistent-loss"),
            Self::Change => f.write_str("change"),
            Self::Reserved(v) => write!(f, "reserved ({v:#x})"),
        }
    }
}

/// One ANA Group Descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaGroup {
    pub grpid: u32,
    pub change_count: u64,
    pub state: AnaState,
    /// The group's namespaces (empty when the log was read with Return Groups Only).
    pub nsids: Vec<u32>,
}

/// The Asymmetric Namespace Access log page (LID 0Ch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnaLog {
    pub change_count: u64,
    pub groups: Vec<AnaGroup>,
}

/// Bytes of the ANA log header and of a group descriptor without its NSID list.
pub const ANA_LOG_HEADER_LEN: usize = 16;
pub const ANA_GROUP_DESC_LEN: usize = 32;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnaLogError {
    #[error("ANA log page truncated: {need} bytes needed at offset {at}, {len} read")]
    Truncated { at: usize, need: usize, len: usize },
}

impl AnaLog {
    /// Parses the page; `raw` may be longer than the page (zero padding).
    pub fn parse(raw: &[u8]) -> Result<Self, AnaLogError> {
        let need = |at: usize, n: usize| -> Result<&[u8], AnaLogError> {
            raw.get(at..at + n).ok_or(AnaLogError::Truncated {
                at,
                need: n,
                len: raw.len(),
            })
        };
        let h = need(0, ANA_LOG_HEADER_LEN)?;
        let change_count = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
        let ngroups = u16::from_le_bytes([h[8], h[9]]);
        let mut at = ANA_LOG_HEADER_LEN;
        let mut groups = Vec::with_capacity(usize::from(ngroups));
        for _ in 0..ngroups {
            let d = need(at, ANA_GROUP_DESC_LEN)?;
            let grpid = u32::from_le_bytes(d[0..4].try_into().expect("4 bytes"));
            let nnsid = u32::from_le_bytes(d[4..8].try_into().expect("4 bytes")) as usize;
            let change_count = u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"));
            let state = AnaState::from_raw(d[16]);
            at += ANA_GROUP_DESC_LEN;
            let list = need(at, nnsid.saturating_mul(4))?;
            let nsids = list
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            at += nnsid * 4;
            groups.push(AnaGroup {
                grpid,
                change_count,
                state,
                nsids,
            });
        }
        Ok(Self {
            change_count,
            groups,
        })
    }

    /// The state of namespace `nsid`: from the group listing it, else from group
    /// `anagrpid` (the namespace's ANAGRPID from Identify Namespace).
    pub fn state_of(&self, nsid: u32, anagrpid: u32) -> Option<AnaState> {
        self.groups
            .iter()
            .find(|g| g.nsids.contains(&nsid))
            .or_else(|| {
                self.groups
                    .iter()
                    .find(|g| anagrpid != 0 && g.grpid == anagrpid)
            })
            .map(|g| g.state)
    }

    /// Builds the wire form (for tests and tools).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.change_count.to_le_bytes());
        out.extend_from_slice(&(self.groups.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0; 6]);
        for g in &self.groups {
            out.extend_from_slice(&g.grpid.to_le_bytes());
            out.extend_from_slice(&(g.nsids.len() as u32).to_le_bytes());
            out.extend_from_slice(&g.change_count.to_le_bytes());
            out.push(g.state.to_raw());
            out.extend_from_slice(&[0; 15]);
            for n in &g.nsids {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multipath::Policy;

    #[test]
    fn ana_log_round_trip_and_lookup() {
        let log = AnaLog {
            change_count: 7,
            groups: vec![
                AnaGroup {
                    grpid: 1,
                    change_count: 3,
                    state: AnaState::Inaccessible,
                    nsids: vec![1, 2],
                },
                AnaGroup {
                    grpid: 2,
                    change_count: 4,
                    state: AnaState::Optimized,
                    nsids: vec![],
                },
            ],
        };
        let mut raw = log.to_bytes();
        assert_eq!(raw.len(), 16 + 32 + 8 + 32);
        assert_eq!(raw[16 + 16], 0x03);
        raw.extend_from_slice(&[0; 100]);
        let back = AnaLog::parse(&raw).unwrap();
        assert_eq!(back, log);
        assert_eq!(back.state_of(2, 0), Some(AnaState::Inaccessible));
        assert_eq!(
            back.state_of(5, 2),
            Some(AnaState::Optimized),
            "by ANAGRPID"
        );
        assert_eq!(back.state_of(5, 0), None);
        assert!(matches!(
            AnaLog::parse(&log.to_bytes()[..60]),
            Err(AnaLogError::Truncated { .. })
        ));
        assert_eq!(AnaState::from_raw(0x0F), AnaState::Change);
        assert_eq!("active_active".parse::<Policy>(), Ok(Policy::ActiveActive));
        assert!("both".parse::<Policy>().is_err());
    }
}

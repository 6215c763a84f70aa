//! Transport IDs: where a controller is, in SPDK's string form.
//!
//! `trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 subnqn:NQN [hostnqn:NQN]` (what
//! `spdk_nvme_perf -r` takes) and fio's `=` form (`trtype=RDMA ... ns=1`, what SPDK's fio
//! plugin takes as a file name) both parse. Keys are case-insensitive; a value may contain `:`
//! (NQNs do), so each pair splits at its first `:` or `=`. fio needs `:` escaped in file names
//! (`\:`); the backslashes are dropped here. Without `subnqn` the ID names the discovery
//! service at that address; the tools then attach every NVM subsystem it lists
//! ([`attach_plan`](crate::discovery::attach_plan)), as SPDK's do.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use nvmf_common::spec::DISCOVERY_NQN;

/// The NVMe-oF port used when `trsvcid` is not given.
pub const DEFAULT_TRSVCID: u16 = 4420;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressFamily {
    IPv4,
    IPv6,
}

/// A parsed transport ID. Only RDMA is supported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportId {
    pub adrfam: AddressFamily,
    pub traddr: String,
    pub trsvcid: u16,
    /// The subsystem to connect to; the discovery NQN when none was given.
    pub subnqn: String,
    pub hostnqn: Option<String>,
    /// fio's `ns=N`: the namespace the caller wants (the transport ignores it).
    pub ns: Option<u32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    #[error("{0:?} is not KEY:VALUE (or KEY=VALUE)")]
    Syntax(String),
    #[error("unknown key {0:?} (known: trtype adrfam traddr trsvcid subnqn hostnqn ns)")]
    UnknownKey(String),
    #[error("trtype {0:?} is not supported (only RDMA)")]
    Trtype(String),
    #[error("adrfam {0:?} is neither IPv4 nor IPv6")]
    Adrfam(String),
    #[error("trsvcid {0:?} is not a port number")]
    Trsvcid(String),
    #[error("ns {0:?} is not a namespace ID")]
    Ns(String),
    #[error("traddr is missing")]
    NoTraddr,
    #[error("cannot resolve traddr {0:?}")]
    Resolve(String),
}

impl TransportId {
    pub fn rdma(traddr: &str, trsvcid: u16, subnqn: &str) -> Self {
        Self {
            adrfam: if traddr.contains(':') {
                AddressFamily::IPv6
            } else {
                AddressFamily::IPv4
            },
            traddr: traddr.to_string(),
            trsvcid,
            subnqn: subnqn.to_string(),
            hostnqn: None,
            ns: None,
        }
    }

    /// The same port, for the discovery subsystem.
    pub fn discovery(&self) -> Self {
        Self {
            subnqn: DISCOVERY_NQN.to_string(),
            ns: None,
            ..self.clone()
        }
    }

    pub fn is_discovery(&self) -> bool {
        self.subnqn == DISCOVERY_NQN
    }

    /// The socket address to connect to: `traddr` as an IP address, or a host name resolved
    /// to an address of `adrfam`.
    pub fn socket_addr(&self) -> Result<SocketAddr, AddressError> {
        if let Ok(ip) = self.traddr.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, self.trsvcid));
        }
        let want_v6 = self.adrfam == AddressFamily::IPv6;
        (self.traddr.as_str(), self.trsvcid)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.find(|a| a.is_ipv6() == want_v6))
            .ok_or_else(|| AddressError::Resolve(self.traddr.clone()))
    }
}

impl FromStr for TransportId {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut adrfam = None;
        let mut traddr = None;
        let mut trsvcid = DEFAULT_TRSVCID;
        let mut subnqn = None;
        let mut hostnqn = None;
        let mut ns = None;
        for token in s.split_whitespace() {
            let split = token
                .find([':', '='])
                .ok_or_else(|| AddressError::Syntax(token.to_string()))?;
            let key = token[..split].to_ascii_lowercase();
            let value = token[split + 1..].replace("\\:", ":");
            if value.is_empty() {
                return Err(AddressError::Syntax(token.to_string()));
            }
            match key.as_str() {
                "trtype" => {
                    if !value.eq_ignore_ascii_case("rdma") {
                        return Err(AddressError::Trtype(value));
                    }
                }
                "adrfam" => {
                    adrfam = Some(match value.to_ascii_lowercase().as_str() {
                        "ipv4" => AddressFamily::IPv4,
                        "ipv6" => AddressFamily::IPv6,
                        _ => return Err(AddressError::Adrfam(value)),
                    })
                }
                "traddr" => traddr = Some(value),
                "trsvcid" => {
                    trsvcid = value
                        .parse()
                        .map_err(|_| AddressError::Trsvcid(value.clone()))?
                }
                "subnqn" => subnqn = Some(value),
                "hostnqn" => hostnqn = Some(value),
                "ns" => ns = Some(value.parse().map_err(|_| AddressError::Ns(value.clone()))?),
                _ => return Err(AddressError::UnknownKey(key)),
            }
        }
        let traddr = traddr.ok_or(AddressError::NoTraddr)?;
        let adrfam = adrfam.unwrap_or(if traddr.contains(':') {
            AddressFamily::IPv6
        } else {
            AddressFamily::IPv4
        });
        Ok(Self {
            adrfam,
            traddr,
            trsvcid,
            subnqn: subnqn.unwrap_or_else(|| DISCOVERY_NQN.to_string()),
            hostnqn,
            ns,
        })
    }
}

impl fmt::Display for TransportId {
    /// SPDK's form, which [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let adrfam = match self.adrfam {
            AddressFamily::IPv4 => "IPv4",
            AddressFamily::IPv6 => "IPv6",
        };
        write!(
            f,
            "trtype:RDMA adrfam:{adrfam} traddr:{} trsvcid:{} subnqn:{}",
            self.traddr, self.trsvcid, self.subnqn
        )?;
        if let Some(h) = &self.hostnqn {
            write!(f, " hostnqn:{h}")?;
        }
        if let Some(ns) = self.ns {
            write!(f, " ns:{ns}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdk_form() {
        let t: TransportId =
            "trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 subnqn:nqn.2016-06.io.spdk:cnode1"
                .parse()
                .unwrap();
        assert_eq!(t.adrfam, AddressFamily::IPv4);
        assert_eq!(t.traddr, "10.0.0.1");
        assert_eq!(t.trsvcid, 4420);
        assert_eq!(t.subnqn, "nqn.2016-06.io.spdk:cnode1");
        assert_eq!(t.hostnqn, None);
        assert_eq!(t.socket_addr().unwrap(), "10.0.0.1:4420".parse().unwrap());
        assert_eq!(t.to_string().parse::<TransportId>().unwrap(), t);
    }

    #[test]
    fn fio_form_with_escapes_and_ns() {
        let t: TransportId =
            r"trtype=RDMA adrfam=IPv4 traddr=10.0.0.1 trsvcid=4421 subnqn=nqn.x\:y hostnqn=nqn.h:1 ns=2"
                .parse()
                .unwrap();
        assert_eq!(t.subnqn, "nqn.x:y");
        assert_eq!(t.hostnqn.as_deref(), Some("nqn.h:1"));
        assert_eq!(t.trsvcid, 4421);
        assert_eq!(t.ns, Some(2));
    }

    #[test]
    fn defaults_and_ipv6() {
        let t: TransportId = "TRTYPE:rdma traddr:fe80::1".parse().unwrap();
        assert_eq!(t.adrfam, AddressFamily::IPv6);
        assert_eq!(t.trsvcid, DEFAULT_TRSVCID);
        assert!(t.is_discovery());
        assert_eq!(t.socket_addr().unwrap(), "[fe80::1]:4420".parse().unwrap());
    }

    #[test]
    fn errors() {
        let e = |s: &str| s.parse::<TransportId>().unwrap_err();
        assert_eq!(
            e("trtype:TCP traddr:1.2.3.4"),
            AddressError::Trtype("TCP".into())
        );
        assert_eq!(e("trtype:RDMA"), AddressError::NoTraddr);
        assert_eq!(
            e("traddr:1.2.3.4 trsvcid:x"),
            AddressError::Trsvcid("x".into())
        );
        assert_eq!(
            e("traddr:1.2.3.4 foo:1"),
            AddressError::UnknownKey("foo".into())
        );
        assert_eq!(e("traddr"), AddressError::Syntax("traddr".into()));
        assert_eq!(
            e("traddr:1.2.3.4 adrfam:IB"),
            AddressError::Adrfam("IB".into())
        );
        assert_eq!(e("traddr:1.2.3.4 ns:x"), AddressError::Ns("x".into()));
    }

    #[test]
    fn spdk_forms_without_subnqn_name_the_discovery_service() {
        // spdk_nvme_perf's documented -r form and SPDK's fio plugin file name.
        for s in [
            "trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420",
            "trtype=RDMA adrfam=IPv4 traddr=10.0.0.1 trsvcid=4420 ns=1",
            "trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 subnqn:nqn.2014-08.org.nvmexpress.discovery",
        ] {
            let t: TransportId = s.parse().unwrap();
            assert!(t.is_discovery(), "{s}");
            assert_eq!(t.socket_addr().unwrap(), "10.0.0.1:4420".parse().unwrap());
        }
        let t: TransportId =
            "trtype=RDMA adrfam=IPv4 traddr=192.168.0.1 trsvcid=4420 ns=1 hostnqn=nqn.h:x"
                .parse()
                .unwrap();
        assert_eq!(t.ns, Some(1));
        assert_eq!(t.hostnqn.as_deref(), Some("nqn.h:x"));
        assert_eq!(
            t.discovery(),
            TransportId {
                ns: None,
                ..t.clone()
            }
        );
    }
}

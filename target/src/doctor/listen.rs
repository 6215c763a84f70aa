//! Whether each listen address sits on a netdev with an RDMA device: `rdma_bind_addr` finds
//! the device through the address (its RoCE GID, or the IPoIB netdev's HCA) and fails with
//! ENODEV when the address belongs to a plain Ethernet interface, and with EADDRNOTAVAIL when
//! no interface has it.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::snapshot::{Port, PortState, RdmaDevice, Snapshot};
use super::{Finding, Plan};

/// Where an address leads.
pub struct Resolved<'a> {
    /// The netdev that owns the address (`None` for a wildcard or a foreign address).
    pub netdev: Option<&'a str>,
    /// The RDMA ports that carry it.
    pub ports: Vec<(&'a RdmaDevice, &'a Port)>,
}

/// The GID a RoCE device lists for an IP address (IPv4 as IPv4-mapped IPv6).
pub fn gid_of(addr: IpAddr) -> std::net::Ipv6Addr {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

pub fn resolve(snap: &Snapshot, addr: IpAddr) -> Resolved<'_> {
    if addr.is_unspecified() {
        let ports = snap
            .devices
            .iter()
            .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
            .collect();
        return Resolved {
            netdev: None,
            ports,
        };
    }
    let netdev = snap.netdev_of(addr);
    let gid = gid_of(addr);
    let mut ports: Vec<(&RdmaDevice, &Port)> = snap
        .devices
        .iter()
        .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
        .filter(|(_, p)| p.gids.iter().any(|g| g.gid == gid))
        .collect();
    if let Some(n) = netdev {
        for (d, p) in snap.ports_on_netdev(n) {
            if !ports
                .iter()
                .any(|(d2, p2)| d2.name == d.name && p2.num == p.num)
            {
                ports.push((d, p));
            }
        }
    }
    Resolved { netdev, ports }
}

/// The (device, port) pairs the plan's listen addresses use.
pub fn used_ports(snap: &Snapshot, plan: &Plan) -> BTreeSet<(String, u8)> {
    plan.listen
        .iter()
        .flat_map(|a| resolve(snap, *a).ports)
        .map(|(d, p)| (d.name.clone(), p.num))
        .collect()
}

pub fn check(snap: &Snapshot, plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    if plan.listen.is_empty() {
        out.push(Finding::ok(
            "listen",
            "-",
            "no listen address given (-a ADDR or -c config.json): address checks skipped",
        ));
        return out;
    }
    let rdma_netdevs = snap.rdma_netdevs();
    let elsewhere = if rdma_netdevs.is_empty() {
        String::new()
    } else {
        format!(
            ", or listen on an address of an RDMA netdev ({})",
            rdma_netdevs.join(", ")
        )
    };
    for &addr in &plan.listen {
        let r = resolve(snap, addr);
        let subject = addr.to_string();
        if addr.is_unspecified() {
            let active = r
                .ports
                .iter()
                .filter(|(_, p)| p.state == PortState::Active)
                .count();
            out.push(if active > 0 {
                Finding::ok(
                    "listen",
                    subject,
                    format!("wildcard: listens on every RDMA device ({active} ACTIVE port(s))"),
                )
            } else {
                Finding::fail(
                    "listen",
                    subject,
                    "wildcard, but no RDMA port is ACTIVE",
                    "bring up an RDMA port (see the port checks above)",
                )
            });
            continue;
        }
        let Some(netdev) = r.netdev else {
            out.push(Finding::fail(
                "listen",
                subject,
                "no local interface has this address: rdma_bind_addr fails (Cannot assign requested address)",
                format!(
                    "ip addr add {addr}/PREFIX dev NETDEV on an RDMA netdev{}",
                    if rdma_netdevs.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", rdma_netdevs.join(", "))
                    }
                ),
            ));
            continue;
        };
        if r.ports.is_empty() {
            out.push(Finding::fail(
                "listen",
                subject,
                format!(
                    "on {netdev}, which has no RDMA device: rdma_bind_addr fails (No such device)"
                ),
                format!(
                    "use the RDMA NIC's netdev; for a test, soft-RoCE on it: modprobe rdma_rxe && rdma link add rxe_{netdev} type rxe netdev {netdev}{elsewhere}"
                ),
            ));
            continue;
        }
        let names: Vec<String> = r
            .ports
            .iter()
            .map(|(d, p)| format!("{}/{}", d.name, p.num))
            .collect();
        if r.ports.iter().any(|(_, p)| p.state == PortState::Active) {
            out.push(Finding::ok(
                "listen",
                subject,
                format!("on {netdev}, RDMA port {}", names.join(", ")),
            ));
        } else {
            out.push(Finding::fail(
                "listen",
                subject,
                format!(
                    "on {netdev}, RDMA port {} not ACTIVE: connections cannot arrive",
                    names.join(", ")
                ),
                "bring the port up (see its port check)",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testfs::FakeRoot;
    use super::super::Status;
    use super::*;

    fn plan(addrs: &[&str]) -> Plan {
        Plan {
            listen: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            ..Plan::default()
        }
    }

    #[test]
    fn address_on_the_rxe_netdev_is_ok() {
        let snap = FakeRoot::good_rxe().snapshot();
        let f = check(&snap, &plan(&["10.0.0.1", "0.0.0.0"]));
        assert_eq!(f[0].status, Status::Ok, "{f:?}");
        assert_eq!(f[0].message, "on veth0, RDMA port rxe0/1");
        assert_eq!(f[1].status, Status::Ok, "{f:?}");
    }

    #[test]
    fn address_on_a_plain_netdev_fails_naming_rdma_link_add() {
        let snap = FakeRoot::good_rxe().snapshot();
        let f = check(&snap, &plan(&["192.168.1.10"]));
        assert_eq!(f[0].status, Status::Fail);
        assert!(
            f[0].message.contains("on eth0, which has no RDMA device"),
            "{f:?}"
        );
        let fix = f[0].fix.as_ref().unwrap();
        assert!(
            fix.contains("rdma link add rxe_eth0 type rxe netdev eth0"),
            "{fix}"
        );
        assert!(fix.contains("RDMA netdev (veth0)"), "{fix}");
    }

    #[test]
    fn foreign_address_fails() {
        let snap = FakeRoot::good_rxe().snapshot();
        let f = check(&snap, &plan(&["10.9.9.9"]));
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0].message.contains("no local interface"), "{f:?}");
        assert!(f[0].fix.as_ref().unwrap().contains("(veth0)"));
    }

    #[test]
    fn address_whose_port_is_down_fails() {
        let root = FakeRoot::good_rxe();
        root.file("sys/class/infiniband/rxe0/ports/1/state", "1: DOWN\n");
        let f = check(&root.snapshot(), &plan(&["10.0.0.1", "0.0.0.0"]));
        assert_eq!(f[0].status, Status::Fail, "{f:?}");
        assert_eq!(f[1].status, Status::Fail, "{f:?}");
    }

    #[test]
    fn ipoib_address_leads_to_its_hca_port() {
        let mut root = FakeRoot::empty();
        root.ib_hca("mlx5_0", "4: ACTIVE", "5: LinkUp", "0x3", "0x1");
        root.file("sys/class/infiniband/mlx5_0/ports/2/state", "2: INIT\n")
            .file(
                "sys/class/infiniband/mlx5_0/ports/2/link_layer",
                "InfiniBand\n",
            );
        root.ipoib("ib0", "mlx5_0", 1, "192.168.100.1");
        root.ipoib("ib1", "mlx5_0", 2, "192.168.101.1");
        let f = check(&root.snapshot(), &plan(&["192.168.100.1", "192.168.101.1"]));
        assert_eq!(f[0].status, Status::Ok, "{f:#?}");
        assert_eq!(f[0].message, "on ib0, RDMA port mlx5_0/1");
        assert_eq!(f[1].status, Status::Fail, "{f:#?}");
        assert!(f[1]
            .message
            .contains("on ib1, RDMA port mlx5_0/2 not ACTIVE"));
        // The port check names the missing subnet manager for the used port 2.
        let ports = super::super::ports::check(&root.snapshot(), &plan(&["192.168.101.1"]));
        let p2 = ports.iter().find(|f| f.subject == "mlx5_0/2").unwrap();
        assert_eq!(p2.status, Status::Fail, "{ports:#?}");
        assert!(p2.fix.as_ref().unwrap().contains("opensm"));
    }

    #[test]
    fn no_listen_address_skips() {
        let snap = FakeRoot::good_rxe().snapshot();
        let f = check(&snap, &Plan::default());
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Ok);
        assert!(used_ports(&snap, &Plan::default()).is_empty());
        assert_eq!(
            used_ports(&snap, &plan(&["10.0.0.1"])),
            [("rxe0".to_string(), 1)].into_iter().collect()
        );
    }
}

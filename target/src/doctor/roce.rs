//! RoCE: the GID a listen address needs, and MTUs.
//!
//! RoCE addresses a port by GID; the kernel fills the table from the netdev's IP addresses
//! (IPv4 as `::ffff:a.b.c.d`), one entry per RoCE version. rdma_cm uses RoCE v2 (routable,
//! UDP) where the device has it.
//!
//! MTU: RoCE payloads are InfiniBand MTUs (256 ... 4096 bytes). rdma_cm derives a connection's
//! path MTU from the connecting side's netdev MTU less 96 bytes of headers (GRH, UDP, BTH, the
//! largest extended header, ICRC; the kernel's `iboe_get_mtu`) and sends it in the connect
//! request; the listening side takes it. So netdev 1500 gives 1024-byte payloads and 9000
//! gives 4096. When the two ends' netdev MTUs differ, the packets of the side with the larger
//! MTU do not fit the other's link and are dropped: every host, this target and the switches
//! between them need the same MTU.

use std::net::IpAddr;

use super::listen::{gid_of, resolve};
use super::snapshot::{LinkLayer, Port, RdmaDevice, Snapshot};
use super::{Finding, Plan};

/// Header bytes rdma_cm subtracts from the netdev MTU for RoCE (`iboe_get_mtu`).
const ROCE_HEADERS: u32 = 96;

/// The RoCE payload MTU a netdev MTU allows.
pub fn roce_mtu(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(ROCE_HEADERS)?;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&m| room >= m)
}

pub fn check(snap: &Snapshot, plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut ports: Vec<(&RdmaDevice, &Port)> = Vec::new();
    for &addr in &plan.listen {
        let r = resolve(snap, addr);
        for &(dev, port) in &r.ports {
            if port.link_layer != LinkLayer::Ethernet {
                continue;
            }
            if !addr.is_unspecified() {
                out.push(check_gid(snap, addr, dev, port));
            }
            if !ports
                .iter()
                .any(|(d, p)| d.name == dev.name && p.num == port.num)
            {
                ports.push((dev, port));
            }
        }
    }
    if plan.listen.is_empty() {
        ports = snap
            .devices
            .iter()
            .flat_map(|d| d.ports.iter().map(move |p| (d, p)))
            .filter(|(_, p)| p.link_layer == LinkLayer::Ethernet)
            .collect();
    }
    for (dev, port) in ports {
        out.extend(check_mtu(snap, plan, dev, port));
    }
    out
}

fn check_gid(snap: &Snapshot, addr: IpAddr, dev: &RdmaDevice, port: &Port) -> Finding {
    let gid = gid_of(addr);
    let entries: Vec<_> = port.gids.iter().filter(|g| g.gid == gid).collect();
    let subject = format!("{addr} on {}/{}", dev.name, port.num);
    if let Some(v2) = entries.iter().find(|g| g.is_roce_v2()) {
        return Finding::ok(
            "gid",
            subject,
            format!(
                "RoCE v2 GID index {} ({}) on netdev {}",
                v2.index,
                v2.gid,
                v2.ndev.as_deref().unwrap_or("?")
            ),
        );
    }
    if let Some(v1) = entries.first() {
        return Finding::warn(
            "gid",
            subject,
            format!(
                "only a {} GID (index {}): no RoCE v2 (routable) GID for this address",
                v1.kind.as_deref().unwrap_or("untyped"),
                v1.index
            ),
            format!(
                "enable RoCE v2 in the NIC's firmware/driver; or make both ends use RoCE v1: echo 'IB/RoCE v1' > /sys/kernel/config/rdma_cm/{}/ports/{}/default_roce_mode (mkdir /sys/kernel/config/rdma_cm/{} first)",
                dev.name, port.num, dev.name
            ),
        );
    }
    let netdev = snap
        .port_netdev(dev, port)
        .unwrap_or_else(|| "NETDEV".into());
    let readd = match dev.soft {
        Some(_) => format!(
            "rdma link delete {} && rdma link add {} type rxe netdev {netdev}",
            dev.name, dev.name
        ),
        None => format!("ip link set dev {netdev} down && ip link set dev {netdev} up"),
    };
    Finding::fail(
        "gid",
        subject,
        format!("no GID for {gid} in the port's GID table: RoCE cannot reach this address"),
        format!(
            "check that {netdev} has the address (ip addr show dev {netdev}) and is not enslaved to a bond or bridge (use the master's address); to refill the table: {readd}"
        ),
    )
}

fn check_mtu(snap: &Snapshot, plan: &Plan, dev: &RdmaDevice, port: &Port) -> Vec<Finding> {
    let mut out = Vec::new();
    let Some(name) = snap.port_netdev(dev, port) else {
        return out;
    };
    let Some(mtu) = snap.netdevs.get(&name).and_then(|n| n.mtu) else {
        return out;
    };
    let subject = format!("{name} ({}/{})", dev.name, port.num);
    let Some(roce) = roce_mtu(mtu) else {
        out.push(Finding::fail(
            "mtu",
            subject,
            format!("netdev MTU {mtu} leaves no room for a 256-byte RoCE payload"),
            format!("ip link set dev {name} mtu 1500"),
        ));
        return out;
    };
    let active = port
        .active_mtu
        .map_or_else(String::new, |a| format!(", port active_mtu {a}"));
    if let Some(a) = port.active_mtu.filter(|&a| a < roce) {
        out.push(Finding::warn(
            "mtu",
            subject.clone(),
            format!(
                "netdev MTU {mtu} allows {roce}-byte RoCE payloads but the port's active_mtu is {a}: hosts with this netdev MTU ask for {roce}"
            ),
            format!(
                "make the netdev match the port: ip link set dev {name} mtu {} (and the same on the hosts)",
                a + ROCE_HEADERS
            ),
        ));
    }
    if mtu > 1500 && roce < 4096 {
        out.push(Finding::warn(
            "mtu",
            subject.clone(),
            format!(
                "jumbo MTU {mtu} gives only {roce}-byte RoCE payloads ({} bytes of headers); {} or more gives 4096",
                ROCE_HEADERS,
                4096 + ROCE_HEADERS
            ),
            format!("ip link set dev {name} mtu 9000 (on every host and switch port too)"),
        ));
    }
    if plan.peers.is_empty() {
        out.push(Finding::ok(
            "mtu",
            subject,
            format!(
                "netdev MTU {mtu}: RoCE payload {roce} bytes{active}; hosts need the same netdev MTU (check one with --peer HOST)"
            ),
        ));
        return out;
    }
    for &peer in &plan.peers {
        let Some(pname) = snap.netdev_of(peer) else {
            out.push(Finding::ok(
                "mtu",
                format!("{subject} peer {peer}"),
                format!(
                    "netdev MTU {mtu}: RoCE payload {roce} bytes{active}; {peer} is not on this machine: give it MTU {mtu} too (nvmf-doctor there shows its own)"
                ),
            ));
            continue;
        };
        let pmtu = snap.netdevs.get(pname).and_then(|n| n.mtu).unwrap_or(0);
        let proce = roce_mtu(pmtu).unwrap_or(0);
        if proce == roce {
            out.push(Finding::ok(
                "mtu",
                format!("{subject} peer {peer}"),
                format!(
                    "both ends at RoCE payload {roce} (netdev MTU {mtu} here, {pmtu} on {pname}){active}"
                ),
            ));
        } else {
            out.push(Finding::warn(
                "mtu",
                format!("{subject} peer {peer}"),
                format!(
                    "MTU mismatch: {name} has MTU {mtu} (RoCE payload {roce}{active}), the peer's {pname} has MTU {pmtu} (RoCE payload {proce}); {}",
                    if proce > roce {
                        format!("the connecting host sets the path MTU, so it asks for {proce}-byte payloads that this side's link drops: large transfers stall")
                    } else {
                        format!("the connecting host sets the path MTU, so its connections run at {proce}-byte payloads and MTU {mtu} here buys them nothing")
                    }
                ),
                format!(
                    "use one MTU on both ends and the switches between them: ip link set dev {pname} mtu {mtu} on the host, or ip link set dev {name} mtu {pmtu} here"
                ),
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

    fn plan(addrs: &[&str], peers: &[&str]) -> Plan {
        Plan {
            listen: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            peers: peers.iter().map(|a| a.parse().unwrap()).collect(),
            ..Plan::default()
        }
    }

    #[test]
    fn roce_mtu_follows_the_kernel() {
        assert_eq!(roce_mtu(1500), Some(1024));
        assert_eq!(roce_mtu(9000), Some(4096));
        assert_eq!(roce_mtu(4192), Some(4096));
        assert_eq!(roce_mtu(4191), Some(2048));
        assert_eq!(roce_mtu(300), None);
    }

    #[test]
    fn good_rxe_has_a_v2_gid_and_a_sane_mtu() {
        let snap = FakeRoot::good_rxe().snapshot();
        let f = check(&snap, &plan(&["10.0.0.1"], &[]));
        assert_eq!(f.len(), 2, "{f:#?}");
        assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
        assert!(f[0]
            .message
            .contains("RoCE v2 GID index 3 (::ffff:10.0.0.1) on netdev veth0"));
        assert!(f[1]
            .message
            .contains("netdev MTU 1500: RoCE payload 1024 bytes"));
    }

    #[test]
    fn no_gid_fails_and_v1_only_warns() {
        let root = FakeRoot::good_rxe();
        let p = "sys/class/infiniband/rxe0/ports/1";
        root.remove(&format!("{p}/gid_attrs/types/3"));
        let f = check(&root.snapshot(), &plan(&["10.0.0.1"], &[]));
        assert_eq!(f[0].status, Status::Warn, "{f:#?}");
        assert!(f[0].message.contains("only a IB/RoCE v1 GID"));
        root.file(
            &format!("{p}/gids/2"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n",
        )
        .file(
            &format!("{p}/gids/3"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n",
        );
        let f = check(&root.snapshot(), &plan(&["10.0.0.1"], &[]));
        assert_eq!(f[0].status, Status::Fail, "{f:#?}");
        assert!(f[0].fix.as_ref().unwrap().contains("rdma link delete rxe0"));
    }

    #[test]
    fn mtu_mismatch_with_a_local_peer_warns() {
        let mut root = FakeRoot::good_rxe();
        root.file("sys/class/net/veth0/mtu", "9000\n");
        root.netdev("veth1", 1500, "10.0.0.2");
        let f = check(&root.snapshot(), &plan(&["10.0.0.1"], &["10.0.0.2"]));
        let mtu = f.iter().find(|f| f.check == "mtu").unwrap();
        assert_eq!(mtu.status, Status::Warn, "{f:#?}");
        assert!(mtu
            .message
            .contains("MTU mismatch: veth0 has MTU 9000 (RoCE payload 4096"));
        assert!(mtu
            .message
            .contains("veth1 has MTU 1500 (RoCE payload 1024)"));
        assert!(mtu
            .fix
            .as_ref()
            .unwrap()
            .contains("ip link set dev veth1 mtu 9000"));
        assert!(mtu.message.contains("run at 1024-byte payloads"), "{mtu:?}");
        // The host's MTU the larger: its path MTU does not fit this side's link.
        root.file("sys/class/net/veth0/mtu", "1500\n")
            .file("sys/class/net/veth1/mtu", "9000\n");
        let f = check(&root.snapshot(), &plan(&["10.0.0.1"], &["10.0.0.2"]));
        let mtu = f.iter().find(|f| f.check == "mtu").unwrap();
        assert_eq!(mtu.status, Status::Warn, "{f:#?}");
        assert!(
            mtu.message
                .contains("asks for 4096-byte payloads that this side's link drops"),
            "{mtu:?}"
        );
        // Same MTU: OK; a remote peer: OK with a note.
        root.file("sys/class/net/veth0/mtu", "9000\n");
        let f = check(
            &root.snapshot(),
            &plan(&["10.0.0.1"], &["10.0.0.2", "10.7.7.7"]),
        );
        assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
        assert!(f
            .iter()
            .any(|f| f.message.contains("10.7.7.7 is not on this machine")));
    }

    #[test]
    fn active_mtu_below_the_netdev_and_odd_jumbo_warn() {
        let root = FakeRoot::good_rxe();
        root.file("sys/class/net/veth0/mtu", "4000\n");
        let mut snap = root.snapshot();
        snap.devices[0].ports[0].active_mtu = Some(1024);
        let f = check(&snap, &plan(&["10.0.0.1"], &[]));
        let warns: Vec<_> = f.iter().filter(|f| f.status == Status::Warn).collect();
        assert_eq!(warns.len(), 2, "{f:#?}");
        assert!(warns[0].message.contains("active_mtu is 1024"));
        assert!(warns[1].message.contains("jumbo MTU 4000 gives only 2048"));
    }
}

//! RDMA devices and their ports: logical state (ACTIVE / INIT / DOWN), physical state, link
//! layer, rate; on InfiniBand the subnet manager and the LID it assigned.
//!
//! A port in INIT on InfiniBand has a physical link but no subnet manager configured it: no
//! LID, no traffic. RoCE ports follow their netdev (DOWN when it is down or has no carrier).

use super::listen::used_ports;
use super::snapshot::{LinkLayer, Port, PortState, RdmaDevice, Snapshot};
use super::{Finding, Plan, Status};

/// The fix when there is no RDMA device at all, naming the netdev a soft-RoCE device would
/// go on: the first listen address's, else the default route's.
pub fn create_rxe_fix(snap: &Snapshot, plan: &Plan) -> String {
    let netdev = plan
        .listen
        .iter()
        .find_map(|a| snap.netdev_of(*a))
        .map(str::to_string)
        .or_else(|| snap.default_route_dev.clone())
        .unwrap_or_else(|| "eth0".into());
    format!("modprobe rdma_rxe && rdma link add rxe_{netdev} type rxe netdev {netdev}")
}

pub fn check(snap: &Snapshot, plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    if snap.devices.is_empty() {
        out.push(Finding::fail(
            "device",
            "/sys/class/infiniband",
            "no RDMA device: the target has nothing to listen on",
            format!(
                "load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re, ...); for a test without an RDMA NIC create soft-RoCE: {}",
                create_rxe_fix(snap, plan)
            ),
        ));
        return out;
    }
    let used = used_ports(snap, plan);
    let any_active = snap
        .devices
        .iter()
        .flat_map(|d| &d.ports)
        .any(|p| p.state == PortState::Active);
    for dev in &snap.devices {
        if dev.ports.is_empty() {
            out.push(Finding::warn(
                "port",
                &dev.name,
                "device has no ports in sysfs",
                "check dmesg for the driver's errors",
            ));
        }
        for port in &dev.ports {
            let is_used = used.contains(&(dev.name.clone(), port.num));
            out.push(check_port(snap, dev, port, plan, is_used, any_active));
        }
    }
    out
}

fn describe(snap: &Snapshot, dev: &RdmaDevice, port: &Port) -> String {
    let mut s = format!(
        "{} ({}), {}",
        port.state_text,
        port.phys_state,
        port.link_layer.name()
    );
    if !port.rate.is_empty() {
        s += &format!(", {}", port.rate);
    }
    match port.link_layer {
        LinkLayer::InfiniBand => {
            s += &format!(", LID 0x{:x}, SM LID 0x{:x}", port.lid, port.sm_lid)
        }
        _ => {
            if let Some(n) = snap.port_netdev(dev, port) {
                s += &format!(", netdev {n}");
            }
        }
    }
    match (dev.soft, &dev.driver) {
        (Some(super::snapshot::SoftKind::Rxe), _) => s += ", soft-RoCE",
        (Some(super::snapshot::SoftKind::Siw), _) => s += ", soft-iWARP",
        (None, Some(d)) => s += &format!(", driver {d}"),
        (None, None) => {}
    }
    s
}

fn check_port(
    snap: &Snapshot,
    dev: &RdmaDevice,
    port: &Port,
    plan: &Plan,
    is_used: bool,
    any_active: bool,
) -> Finding {
    let subject = format!("{}/{}", dev.name, port.num);
    let desc = describe(snap, dev, port);
    if port.state == PortState::Active {
        if port.link_layer == LinkLayer::InfiniBand && port.lid == 0 {
            return Finding::fail(
                "port",
                subject,
                format!("{desc}: ACTIVE without a LID"),
                "the subnet manager did not assign a LID: check its log (/var/log/opensm.log) and restart it (systemctl restart opensm)",
            );
        }
        return Finding::ok("port", subject, desc);
    }
    // Not active: how bad depends on whether a listen address needs this port.
    let severity = if !plan.listen.is_empty() {
        if is_used {
            Status::Fail
        } else {
            Status::Ok
        }
    } else if any_active {
        Status::Warn
    } else {
        Status::Fail
    };
    let (why, fix) = not_active(snap, dev, port);
    if severity == Status::Ok {
        return Finding::ok(
            "port",
            subject,
            format!("{desc}: {why} (no listen address uses this port)"),
        );
    }
    let mut f = Finding::fail("port", subject, format!("{desc}: {why}"), fix);
    f.status = severity;
    f
}

/// Why a port is not ACTIVE and what to do about it.
fn not_active(snap: &Snapshot, dev: &RdmaDevice, port: &Port) -> (String, String) {
    let phys = port.phys_state.to_ascii_lowercase();
    match (port.link_layer, port.state) {
        (LinkLayer::InfiniBand, PortState::Init) => (
            "port stuck in INIT: the link is up but no subnet manager configured it (no LID)".into(),
            "start a subnet manager on a node of this InfiniBand subnet: apt install opensm && systemctl enable --now opensm; for redundancy run opensm on two nodes with different priorities (sm_priority 15 on the master, 14 on the standby in /etc/opensm/opensm.conf, or opensm -p 15 / -p 14), or enable the managed switch's SM".into(),
        ),
        (LinkLayer::InfiniBand, PortState::Armed) => (
            "port ARMED: the subnet manager has not finished bringing it up".into(),
            "wait a few seconds; if it stays ARMED, check the subnet manager's log (/var/log/opensm.log)".into(),
        ),
        (LinkLayer::InfiniBand, _) if phys.contains("disabled") => (
            "port disabled".into(),
            format!("enable it: ibportstate -C {} -P {} -D 0 1 enable (or on the switch port)", dev.name, port.num),
        ),
        (LinkLayer::InfiniBand, _) => (
            "no physical link".into(),
            "check the cable and the switch port (ibstat shows the physical state)".into(),
        ),
        _ => {
            let netdev = snap.port_netdev(dev, port);
            match netdev.as_deref().and_then(|n| snap.netdevs.get(n)) {
                Some(n) if n.operstate != "up" && n.operstate != "unknown" => (
                    format!("its netdev {} is {}", n.name, n.operstate),
                    format!("ip link set dev {} up (and check its cable: ethtool {})", n.name, n.name),
                ),
                Some(n) => (
                    format!("not ACTIVE although its netdev {} is up", n.name),
                    format!("check the link with ethtool {} and dmesg for {}", n.name, dev.name),
                ),
                None => (
                    "not ACTIVE and no netdev found for it".into(),
                    format!("check dmesg for {}; rdma link show", dev.name),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testfs::FakeRoot;
    use super::*;

    #[test]
    fn active_rxe_port_is_ok_and_described() {
        let snap = FakeRoot::good_rxe().snapshot();
        let f = check(&snap, &Plan::default());
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Ok);
        assert_eq!(f[0].subject, "rxe0/1");
        assert!(
            f[0].message.contains("4: ACTIVE (5: LinkUp), Ethernet"),
            "{f:?}"
        );
        assert!(f[0].message.contains("netdev veth0"), "{f:?}");
        assert!(f[0].message.contains("soft-RoCE"), "{f:?}");
    }

    #[test]
    fn no_device_fails_naming_rdma_link_add_on_the_listen_netdev() {
        let mut root = FakeRoot::empty();
        root.netdev("veth0", 1500, "10.0.0.1");
        let plan = Plan {
            listen: vec!["10.0.0.1".parse().unwrap()],
            ..Plan::default()
        };
        let f = check(&root.snapshot(), &plan);
        assert_eq!(f[0].status, Status::Fail);
        let fix = f[0].fix.as_ref().unwrap();
        assert!(
            fix.contains("rdma link add rxe_veth0 type rxe netdev veth0"),
            "{fix}"
        );
    }

    #[test]
    fn infiniband_port_in_init_means_no_subnet_manager() {
        let root = FakeRoot::good_rxe();
        root.remove("sys/class/infiniband/rxe0");
        root.ib_hca("mlx5_0", "2: INIT", "5: LinkUp", "0x0", "0x0");
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[0].status, Status::Fail, "{f:?}");
        assert!(f[0].message.contains("no subnet manager"), "{f:?}");
        let fix = f[0].fix.as_ref().unwrap();
        assert!(fix.contains("opensm") && fix.contains("priorit"), "{fix}");
        assert!(f[0].message.contains("driver mlx5_core"), "{f:?}");
    }

    #[test]
    fn infiniband_active_needs_a_lid() {
        let root = FakeRoot::empty();
        root.ib_hca("mlx5_0", "4: ACTIVE", "5: LinkUp", "0x0", "0x1");
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0].message.contains("without a LID"));
        let root = FakeRoot::empty();
        root.ib_hca("mlx5_0", "4: ACTIVE", "5: LinkUp", "0x7", "0x1");
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[0].status, Status::Ok);
        assert!(f[0].message.contains("LID 0x7, SM LID 0x1"), "{f:?}");
    }

    #[test]
    fn roce_port_down_with_its_netdev_down_says_ip_link_set_up() {
        let root = FakeRoot::good_rxe();
        root.file("sys/class/infiniband/rxe0/ports/1/state", "1: DOWN\n")
            .file(
                "sys/class/infiniband/rxe0/ports/1/phys_state",
                "3: Disabled\n",
            )
            .file("sys/class/net/veth0/operstate", "down\n");
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0]
            .fix
            .as_ref()
            .unwrap()
            .contains("ip link set dev veth0 up"));
    }

    #[test]
    fn unused_down_port_is_not_a_failure_when_listeners_are_elsewhere() {
        let mut root = FakeRoot::good_rxe();
        root.netdev("veth2", 1500, "10.0.2.1");
        root.rxe("rxe2", "veth2", "10.0.2.1");
        root.file("sys/class/infiniband/rxe2/ports/1/state", "1: DOWN\n");
        let plan = Plan {
            listen: vec!["10.0.0.1".parse().unwrap()],
            ..Plan::default()
        };
        let f = check(&root.snapshot(), &plan);
        assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
        // Without listen addresses a down port next to an active one is a warning.
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f.iter().map(|f| f.status).max(), Some(Status::Warn));
    }
}

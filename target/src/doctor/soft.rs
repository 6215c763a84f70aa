//! Software RDMA devices: soft-RoCE (`rdma_rxe`) and soft-iWARP (`siw`). They make any
//! netdev an RDMA device, which is how one tests without an RDMA NIC; their throughput is CPU
//! time, so production wants the NIC's own driver.

use super::ports::create_rxe_fix;
use super::snapshot::{Snapshot, SoftKind};
use super::{Finding, Plan};

pub fn check(snap: &Snapshot, plan: &Plan) -> Vec<Finding> {
    let soft: Vec<String> = snap
        .devices
        .iter()
        .filter_map(|d| {
            let kind = match d.soft? {
                SoftKind::Rxe => "soft-RoCE",
                SoftKind::Siw => "soft-iWARP",
            };
            let on = d
                .parent
                .clone()
                .or_else(|| d.ports.first().and_then(|p| snap.port_netdev(d, p)));
            Some(match on {
                Some(n) => format!("{} ({kind} on {n})", d.name),
                None => format!("{} ({kind})", d.name),
            })
        })
        .collect();
    let hardware = snap.devices.iter().filter(|d| d.soft.is_none()).count();
    let rxe_available =
        snap.available_modules.is_empty() || snap.available_modules.contains("rdma_rxe");
    let finding = if !soft.is_empty() {
        Finding::ok(
            "soft-rdma",
            "rxe/siw",
            format!(
                "{}: for tests (a NIC made of CPU time; remove with rdma link delete NAME)",
                soft.join(", ")
            ),
        )
    } else if hardware > 0 {
        Finding::ok(
            "soft-rdma",
            "rxe/siw",
            format!("none; {hardware} hardware RDMA device(s)"),
        )
    } else if rxe_available {
        Finding::fail(
            "soft-rdma",
            "rxe/siw",
            "no soft-RoCE or soft-iWARP device (and no hardware one)",
            format!("for a test, create one: {}", create_rxe_fix(snap, plan)),
        )
    } else {
        Finding::fail(
            "soft-rdma",
            "rxe/siw",
            "no RDMA device, and this kernel has no rdma_rxe module",
            "install a kernel built with CONFIG_RDMA_RXE (Debian's linux-image-amd64 has it), then modprobe rdma_rxe && rdma link add rxe0 type rxe netdev NETDEV",
        )
    };
    vec![finding]
}

#[cfg(test)]
mod tests {
    use super::super::testfs::FakeRoot;
    use super::super::Status;
    use super::*;

    #[test]
    fn rxe_is_named_with_its_netdev() {
        let f = check(&FakeRoot::good_rxe().snapshot(), &Plan::default());
        assert_eq!(f[0].status, Status::Ok);
        assert!(
            f[0].message.starts_with("rxe0 (soft-RoCE on veth0)"),
            "{f:?}"
        );
    }

    #[test]
    fn hardware_only_is_ok_and_nothing_fails_with_the_create_command() {
        let root = FakeRoot::empty();
        root.ib_hca("mlx5_0", "4: ACTIVE", "5: LinkUp", "0x1", "0x1");
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[0].status, Status::Ok, "{f:?}");

        let root = FakeRoot::good_rxe();
        root.remove("sys/class/infiniband/rxe0");
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[0].status, Status::Fail);
        // No listen address: the default route's netdev.
        assert!(f[0]
            .fix
            .as_ref()
            .unwrap()
            .contains("rdma link add rxe_eth0 type rxe netdev eth0"));
    }

    #[test]
    fn siw_is_recognised_by_its_node_type() {
        let root = FakeRoot::good_rxe();
        root.file("sys/class/infiniband/rxe0/node_type", "4: RNIC\n");
        let f = check(&root.snapshot(), &Plan::default());
        assert!(f[0].message.contains("soft-iWARP"), "{f:?}");
    }
}

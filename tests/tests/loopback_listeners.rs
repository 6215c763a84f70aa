//! Tenants behind different listeners: a subsystem is reachable only through its own
//! listeners (admin and I/O Connect alike), and a discovery controller lists what its own
//! listener exports, as nvmet does, plus the current discovery subsystem's entry.

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{
    connect_offsets, parse_connect_invalid_param_dw0, CNTLID_DYNAMIC,
};
use nvmf_common::spec::identify::nul_str;
use nvmf_common::spec::log_page::{
    DiscoveryLogEntry, DiscoveryLogHeader, LogPageId, SubsystemType,
};
use nvmf_common::spec::nqn::DISCOVERY_NQN;
use nvmf_common::spec::Status;
use nvmf_target::core::subsystem::ListenAddress;
use nvmf_target::target::{NamespaceOptions, SubsystemOptions};
use nvmf_tests::*;
use zerocopy::FromBytes;

const TENANT_A: &str = "nqn.2016-06.io.spdk:tenant-a";
const TENANT_B: &str = "nqn.2016-06.io.spdk:tenant-b";

fn port(svc: &str) -> ListenAddress {
    ListenAddress {
        trtype: "LOOPBACK".into(),
        adrfam: "INTRA_HOST".into(),
        traddr: "local".into(),
        trsvcid: svc.into(),
    }
}

/// Tenant A listens on port 4420 only, tenant B on 4421 only.
fn lab() -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    for (nqn, bdev, svc) in [(TENANT_A, "MallocA", "4420"), (TENANT_B, "MallocB", "4421")] {
        lab.malloc(bdev, 64, 512);
        let opts = SubsystemOptions {
            allow_any_host: true,
            serial_number: "SN-LISTENERS".into(),
            ..Default::default()
        };
        lab.target.create_subsystem(nqn, opts).unwrap();
        let ns = NamespaceOptions {
            bdev_name: bdev.into(),
            ..Default::default()
        };
        lab.target.add_namespace(nqn, ns).unwrap();
        lab.target.add_listener(nqn, port(svc)).unwrap();
    }
    lab.pg.poll();
    lab
}

fn assert_no_such_subsystem(r: &Response) {
    assert_eq!(
        r.cqe.status(),
        Status::CONNECT_INVALID_PARAMETERS.with_dnr()
    );
    assert_eq!(
        parse_connect_invalid_param_dw0(r.cqe.dw0.get()),
        (true, connect_offsets::DATA_SUBNQN),
        "the subsystem NQN is the parameter at fault"
    );
}

#[test]
fn connect_through_another_tenants_port_is_refused() {
    let mut lab = lab();
    for (nqn, wrong) in [(TENANT_A, "4421"), (TENANT_B, "4420")] {
        let q = lab.open_queue_via(port(wrong));
        let r = lab.run(
            &q,
            connect_capsule(1, 0, 31, 5000, CNTLID_DYNAMIC, nqn, HOSTNQN),
        );
        assert_no_such_subsystem(&r);
    }
    // Through its own port each works, and I/O runs.
    let mut a = linux_bring_up_via(&mut lab, TENANT_A, 1, &port("4420"));
    let cid = a.cid();
    expect_ok(&a.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 1), vec![7; 512]),
    ));
    // An I/O queue for A's controller through B's port is refused too, and A's controller
    // keeps serving.
    let q = lab.open_queue_via(port("4421"));
    let r = lab.run(
        &q,
        connect_capsule(1, 2, 31, 0, a.cntlid, TENANT_A, HOSTNQN),
    );
    assert_no_such_subsystem(&r);
    let cid = a.cid();
    let r = a.io(&mut lab, 0, reading(Command::read(cid, 1, 0, 1), 512));
    assert_eq!(expect_ok(&r).status(), Status::SUCCESS);
    assert!(r.host_buffer.iter().all(|&b| b == 7));
}

#[test]
fn the_discovery_subsystem_answers_on_every_port() {
    let mut lab = lab();
    for svc in ["4420", "4421"] {
        let q = lab.open_queue_via(port(svc));
        let r = lab.run(
            &q,
            connect_capsule(1, 0, 31, 5000, CNTLID_DYNAMIC, DISCOVERY_NQN, HOSTNQN),
        );
        expect_ok(&r);
    }
}

fn discovery_entries(lab: &mut LoopbackLab, via: Option<ListenAddress>) -> Vec<DiscoveryLogEntry> {
    let mut disc = match via {
        Some(addr) => linux_bring_up_via(lab, DISCOVERY_NQN, 0, &addr),
        None => linux_bring_up(lab, DISCOVERY_NQN, 0),
    };
    let cid = disc.cid();
    let r = disc.admin(
        lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::DISCOVERY, 1024, 0),
            1024,
        ),
    );
    let numrec = DiscoveryLogHeader::read_from_bytes(&expect_ok_buf(&r)[..1024])
        .unwrap()
        .numrec
        .get() as usize;
    let len = 1024 * (numrec + 1);
    let cid = disc.cid();
    let r = disc.admin(
        lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::DISCOVERY, len as u32, 0),
            len,
        ),
    );
    expect_ok_buf(&r)[1024..]
        .chunks(1024)
        .map(|c| DiscoveryLogEntry::read_from_bytes(c).unwrap())
        .collect()
}

fn expect_ok_buf(r: &Response) -> &[u8] {
    expect_ok(r);
    &r.host_buffer
}

fn summary(entries: &[DiscoveryLogEntry]) -> Vec<(SubsystemType, String, String)> {
    entries
        .iter()
        .map(|e| {
            (
                e.subsystem_type(),
                nul_str(&e.subnqn).to_string(),
                nul_str(&e.trsvcid).trim_end().to_string(),
            )
        })
        .collect()
}

#[test]
fn each_port_discovers_only_what_it_exports() {
    let mut lab = lab();
    let nvme = SubsystemType::NVME;
    let current = SubsystemType::CURRENT_DISCOVERY;
    assert_eq!(
        summary(&discovery_entries(&mut lab, Some(port("4420")))),
        [
            (nvme, TENANT_A.to_string(), "4420".to_string()),
            (current, DISCOVERY_NQN.to_string(), "4420".to_string()),
        ]
    );
    assert_eq!(
        summary(&discovery_entries(&mut lab, Some(port("4421")))),
        [
            (nvme, TENANT_B.to_string(), "4421".to_string()),
            (current, DISCOVERY_NQN.to_string(), "4421".to_string()),
        ]
    );
    // A transport that does not say where a queue came in sees every listener.
    assert_eq!(
        summary(&discovery_entries(&mut lab, None)),
        [
            (nvme, TENANT_A.to_string(), "4420".to_string()),
            (nvme, TENANT_B.to_string(), "4421".to_string()),
        ]
    );
    // A subsystem on both ports, for one other host only: our host does not see it.
    lab.malloc("MallocC", 64, 512);
    let opts = SubsystemOptions {
        serial_number: "SN-C".into(),
        ..Default::default()
    };
    let private = "nqn.2016-06.io.spdk:private";
    lab.target.create_subsystem(private, opts).unwrap();
    lab.target
        .add_host(private, "nqn.2016-06.io.spdk:other-host")
        .unwrap();
    lab.target.add_listener(private, port("4420")).unwrap();
    lab.pg.poll();
    let seen = summary(&discovery_entries(&mut lab, Some(port("4420"))));
    assert!(seen.iter().all(|(_, nqn, _)| nqn != private), "{seen:?}");
}

/// The control plane fails the controllers of a removed host that it sees; a Connect that a
/// reactor ran meanwhile, against the snapshot it still had, makes one it did not see. The
/// reactor fails that one itself when the new snapshot arrives. Here the host is removed
/// without the RPC's own sweep, so only the reactor's check can end the controller; another
/// host's controller is untouched.
#[test]
fn a_reactor_fails_the_controllers_of_a_host_removed_behind_its_back() {
    const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555";
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    let opts = SubsystemOptions {
        serial_number: "SN-REVOKE".into(),
        ..Default::default()
    };
    lab.target.create_subsystem(TENANT_A, opts).unwrap();
    let ns = NamespaceOptions {
        bdev_name: "Malloc0".into(),
        ..Default::default()
    };
    lab.target.add_namespace(TENANT_A, ns).unwrap();
    lab.target
        .add_listener(TENANT_A, loopback_address())
        .unwrap();
    lab.target.add_host(TENANT_A, HOSTNQN).unwrap();
    lab.target.add_host(TENANT_A, OTHER).unwrap();
    lab.pg.poll();
    let revoked = linux_bring_up(&mut lab, TENANT_A, 1);
    let stays = linux_bring_up_as(&mut lab, TENANT_A, 1, OTHER);
    lab.target.remove_host(TENANT_A, HOSTNQN).unwrap();
    for _ in 0..1000 {
        if revoked.admin.is_disconnected() && revoked.io[0].is_disconnected() {
            break;
        }
        lab.pg.poll();
    }
    assert!(
        revoked.admin.is_disconnected(),
        "the removed host kept its controller"
    );
    assert!(revoked.io[0].is_disconnected());
    assert!(!stays.admin.is_disconnected() && !stays.io[0].is_disconnected());
}

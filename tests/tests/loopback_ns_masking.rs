//! Namespace masking (`no_auto_visible` + `nvmf_ns_add_host`) as hosts see it, and discovery
//! referrals in the discovery log.
//!
//! Two hosts share a subsystem; namespace 1 is masked and visible to host A only, namespace 2
//! is visible to both. To host B, namespace 1 is an inactive NSID: absent from the active
//! list, a zeroed Identify Namespace, every I/O refused with Invalid Namespace or Format, and
//! none of its bytes ever reach B. Visibility changes on live controllers, with a Namespace
//! Attribute Changed notice to exactly the controllers whose view changed.

use nvmf_common::spec::command::{Command, DsmRange};
use nvmf_common::spec::features::{
    parse_async_event_dw0, AsyncEventType, AsyncNotice, FeatureId, AEC_DISCOVERY_LOG_CHANGE,
};
use nvmf_common::spec::identify::{nul_str, Cns, IdentifyNamespace};
use nvmf_common::spec::log_page::{
    AddressFamily, DiscoveryLogEntry, DiscoveryLogHeader, LogPageId, SubsystemType, TransportType,
    TREQ_SECURE_CHANNEL_NOT_REQUIRED, TREQ_SECURE_CHANNEL_REQUIRED,
};
use nvmf_common::spec::nqn::DISCOVERY_NQN;
use nvmf_common::spec::Status;
use nvmf_target::core::subsystem::{ListenAddress, Referral};
use nvmf_target::target::{NamespaceOptions, SubsystemOptions};
use nvmf_tests::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const NQN: &str = "nqn.2016-06.io.spdk:masking";
const HOST_A: &str = HOSTNQN;
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-2222-3333-4444-555555555555";
const SECRET: u8 = 0xA5;
const BLOCK: usize = 512;

/// Namespace 1 (masked, visible to host A), namespace 2 (visible to every host).
fn lab() -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    lab.malloc("Secret", 64, BLOCK as u32);
    lab.malloc("Shared", 64, BLOCK as u32);
    let opts = SubsystemOptions {
        allow_any_host: true,
        serial_number: "SN-MASKING".into(),
        ..Default::default()
    };
    lab.target.create_subsystem(NQN, opts).unwrap();
    for (bdev, masked) in [("Secret", true), ("Shared", false)] {
        let ns = NamespaceOptions {
            bdev_name: bdev.into(),
            no_auto_visible: masked,
            ..Default::default()
        };
        lab.target.add_namespace(NQN, ns).unwrap();
    }
    lab.target.ns_add_host(NQN, 1, HOST_A).unwrap();
    lab.target.add_listener(NQN, loopback_address()).unwrap();
    lab.pg.poll();
    lab
}

fn active_list(lab: &mut LoopbackLab, ctrl: &mut HostController) -> Vec<u32> {
    let cid = ctrl.cid();
    let r = ctrl.admin(
        lab,
        reading(
            Command::identify(cid, Cns::ACTIVE_NAMESPACE_LIST, 0, 0),
            4096,
        ),
    );
    expect_ok(&r);
    r.host_buffer
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

fn identify_ns(lab: &mut LoopbackLab, ctrl: &mut HostController, nsid: u32) -> Vec<u8> {
    let cid = ctrl.cid();
    let r = ctrl.admin(
        lab,
        reading(Command::identify(cid, Cns::NAMESPACE, nsid, 0), 4096),
    );
    expect_ok(&r);
    r.host_buffer
}

fn read(lab: &mut LoopbackLab, ctrl: &mut HostController, nsid: u32) -> Response {
    let cid = ctrl.cid();
    // The host buffer starts with a marker: a refused read must leave it as it was.
    ctrl.io(
        lab,
        0,
        with_buffer(Command::read(cid, nsid, 0, 8), vec![0x5A; 8 * BLOCK]),
    )
}

fn assert_invalid_namespace(r: &Response, what: &str) {
    assert_eq!(
        r.cqe.status(),
        Status::INVALID_NAMESPACE.with_dnr(),
        "{what}: a masked namespace must be refused as an inactive NSID"
    );
}

/// Host A writes the secret; host B never sees, reads or changes it.
#[test]
fn a_masked_namespace_is_an_inactive_nsid_to_other_hosts() {
    let mut lab = lab();
    let mut a = linux_bring_up_as(&mut lab, NQN, 1, HOST_A);
    let mut b = linux_bring_up_as(&mut lab, NQN, 1, HOST_B);
    let cid = a.cid();
    expect_ok(&a.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 8), vec![SECRET; 8 * BLOCK]),
    ));

    assert_eq!(active_list(&mut lab, &mut a), [1, 2]);
    assert_eq!(
        active_list(&mut lab, &mut b),
        [2],
        "NSID 1 is masked from B"
    );
    let id = identify_ns(&mut lab, &mut a, 1);
    assert_eq!(
        IdentifyNamespace::read_from_bytes(&id).unwrap().nsze.get(),
        64
    );
    assert!(
        identify_ns(&mut lab, &mut b, 1).iter().all(|&x| x == 0),
        "Identify Namespace of a masked NSID is zero-filled (inactive)"
    );
    assert_ne!(identify_ns(&mut lab, &mut b, 2)[..8], [0; 8]);
    let cid = b.cid();
    let r = b.admin(
        &mut lab,
        reading(
            Command::identify(cid, Cns::NAMESPACE_ID_DESCRIPTOR_LIST, 1, 0),
            4096,
        ),
    );
    assert_invalid_namespace(&r, "namespace identification descriptors");

    // Every I/O command of B on namespace 1 is refused.
    let r = read(&mut lab, &mut b, 1);
    assert_invalid_namespace(&r, "read");
    assert!(
        r.host_buffer.iter().all(|&x| x == 0x5A),
        "no byte of the masked namespace reaches B"
    );
    let cid = b.cid();
    let r = b.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 8), vec![0xEE; 8 * BLOCK]),
    );
    assert_invalid_namespace(&r, "write");
    let cid = b.cid();
    let r = b.io(
        &mut lab,
        0,
        in_capsule(Command::write(cid, 1, 0, 1), vec![0xEE; BLOCK]),
    );
    assert_invalid_namespace(&r, "write with in-capsule data");
    let cid = b.cid();
    let r = b.io(
        &mut lab,
        0,
        with_buffer(Command::compare(cid, 1, 0, 8), vec![SECRET; 8 * BLOCK]),
    );
    assert_invalid_namespace(&r, "compare (would leak the data bit by bit)");
    let cid = b.cid();
    let r = b.io(&mut lab, 0, no_data(Command::flush(cid, 1)));
    assert_invalid_namespace(&r, "flush");
    let cid = b.cid();
    let r = b.io(
        &mut lab,
        0,
        no_data(Command::write_zeroes(cid, 1, 0, 8, false)),
    );
    assert_invalid_namespace(&r, "write zeroes");
    let cid = b.cid();
    let r = b.io(
        &mut lab,
        0,
        no_data(Command::write_zeroes(cid, 1, 0, 8, true)),
    );
    assert_invalid_namespace(&r, "write zeroes with deallocate");
    let mut range = DsmRange::new_zeroed();
    range.nlb.set(8);
    let cid = b.cid();
    let r = b.io(
        &mut lab,
        0,
        with_buffer(Command::dsm(cid, 1, 1, true), range.as_bytes().to_vec()),
    );
    assert_invalid_namespace(&r, "dataset management deallocate");

    // B's own namespace works, and A's data is intact.
    let r = read(&mut lab, &mut b, 2);
    expect_ok(&r);
    let r = read(&mut lab, &mut a, 1);
    expect_ok(&r);
    assert!(
        r.host_buffer.iter().all(|&x| x == SECRET),
        "A's data unchanged"
    );
}

/// `nvmf_ns_add_host` / `nvmf_ns_remove_host` on a live controller: the notice goes to the
/// controllers whose view changed, and the namespace appears and disappears at once.
#[test]
fn visibility_changes_reach_live_controllers_with_a_notice() {
    let mut lab = lab();
    lab.malloc("Later", 64, BLOCK as u32);
    let mut a = linux_bring_up_as(&mut lab, NQN, 1, HOST_A);
    let mut b = linux_bring_up_as(&mut lab, NQN, 1, HOST_B);
    let cid = a.cid();
    expect_ok(&a.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 8), vec![SECRET; 8 * BLOCK]),
    ));
    enable_namespace_notices(&mut lab, &mut a);
    enable_namespace_notices(&mut lab, &mut b);
    let a_aer = submit_aer(&mut a);
    let b_aer = submit_aer(&mut b);
    assert!(lab.try_wait(&a.admin, 50).is_none());
    assert!(lab.try_wait(&b.admin, 50).is_none());

    // Show namespace 1 to B: B hears of it, A (whose view is unchanged) does not.
    lab.target.ns_add_host(NQN, 1, HOST_B).unwrap();
    expect_namespace_notice(&mut lab, &mut b, b_aer, &[1]);
    assert!(
        lab.try_wait(&a.admin, 50).is_none(),
        "A's view did not change: no notice"
    );
    assert_eq!(active_list(&mut lab, &mut b), [1, 2]);
    let r = read(&mut lab, &mut b, 1);
    expect_ok(&r);
    assert!(r.host_buffer.iter().all(|&x| x == SECRET));

    // Hide it again: refused at once, with a notice.
    let b_aer = submit_aer(&mut b);
    lab.target.ns_remove_host(NQN, 1, HOST_B).unwrap();
    expect_namespace_notice(&mut lab, &mut b, b_aer, &[1]);
    assert!(lab.try_wait(&a.admin, 50).is_none());
    assert_eq!(active_list(&mut lab, &mut b), [2]);
    let r = read(&mut lab, &mut b, 1);
    assert_invalid_namespace(&r, "read after nvmf_ns_remove_host");
    assert!(r.host_buffer.iter().all(|&x| x == 0x5A));

    // A new masked namespace concerns nobody yet; an auto-visible one everybody.
    let b_aer = submit_aer(&mut b);
    let masked = NamespaceOptions {
        bdev_name: "Later".into(),
        nsid: Some(3),
        no_auto_visible: true,
        ..Default::default()
    };
    lab.target.add_namespace(NQN, masked).unwrap();
    assert!(
        lab.try_wait(&a.admin, 50).is_none(),
        "A does not see NSID 3"
    );
    assert!(
        lab.try_wait(&b.admin, 50).is_none(),
        "B does not see NSID 3"
    );
    lab.target.ns_add_host(NQN, 3, HOST_A).unwrap();
    expect_namespace_notice(&mut lab, &mut a, a_aer, &[3]);
    assert!(lab.try_wait(&b.admin, 50).is_none());
    assert_eq!(active_list(&mut lab, &mut a), [1, 2, 3]);
    // Removing a namespace B cannot see tells B nothing.
    let a_aer = submit_aer(&mut a);
    lab.target.remove_namespace(NQN, 3).unwrap();
    expect_namespace_notice(&mut lab, &mut a, a_aer, &[3]);
    assert!(lab.try_wait(&b.admin, 50).is_none());
    let _ = b_aer;
}

/// The host that sees a masked namespace counts its traffic in SMART; the other does not.
#[test]
fn smart_counts_only_visible_namespaces() {
    let mut lab = lab();
    let mut a = linux_bring_up_as(&mut lab, NQN, 1, HOST_A);
    let mut b = linux_bring_up_as(&mut lab, NQN, 1, HOST_B);
    for _ in 0..3 {
        expect_ok(&read(&mut lab, &mut a, 1));
    }
    let smart = |lab: &mut LoopbackLab, ctrl: &mut HostController| {
        let cid = ctrl.cid();
        let r = ctrl.admin(
            lab,
            reading(
                Command::get_log_page(cid, NSID_ALL, LogPageId::SMART_HEALTH, 512, 0),
                512,
            ),
        );
        expect_ok(&r);
        // Host Read Commands, bytes 64..80.
        u128::from_le_bytes(r.host_buffer[64..80].try_into().unwrap())
    };
    assert_eq!(smart(&mut lab, &mut a), 3);
    assert_eq!(
        smart(&mut lab, &mut b),
        0,
        "B learns nothing of A's namespace"
    );
}

const NSID_ALL: u32 = 0xFFFF_FFFF;

fn discovery_log(lab: &mut LoopbackLab, hostnqn: &str) -> (u64, Vec<DiscoveryLogEntry>) {
    let mut disc = linux_bring_up_as(lab, DISCOVERY_NQN, 0, hostnqn);
    let cid = disc.cid();
    let len = 1024 * 8;
    let r = disc.admin(
        lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::DISCOVERY, len as u32, 0),
            len,
        ),
    );
    expect_ok(&r);
    let header = DiscoveryLogHeader::read_from_bytes(&r.host_buffer[..1024]).unwrap();
    let numrec = header.numrec.get() as usize;
    let entries = r.host_buffer[1024..1024 * (numrec + 1)]
        .chunks(1024)
        .map(|c| DiscoveryLogEntry::read_from_bytes(c).unwrap())
        .collect();
    (header.genctr.get(), entries)
}

/// A discovery controller asks for Discovery Log Page Change notices.
fn watch_discovery_changes(lab: &mut LoopbackLab, watcher: &mut HostController) {
    let cid = watcher.cid();
    expect_ok(&watcher.admin(
        lab,
        no_data(Command::set_features(
            cid,
            FeatureId::ASYNC_EVENT_CONFIGURATION,
            AEC_DISCOVERY_LOG_CHANGE,
            false,
        )),
    ));
}

/// The AER `aer` of `watcher` completes with a Discovery Log Page Change notice.
fn expect_discovery_notice(lab: &mut LoopbackLab, watcher: &HostController, aer: u16) {
    let r = lab
        .try_wait(&watcher.admin, 200)
        .expect("a Discovery Log Page Change notice");
    assert_eq!(r.cqe.cid.get(), aer);
    assert_eq!(
        parse_async_event_dw0(expect_ok(&r).dw0.get()),
        (
            AsyncEventType::NOTICE,
            AsyncNotice::DISCOVERY_LOG_CHANGE.0,
            LogPageId::DISCOVERY
        )
    );
}

fn rdma(traddr: &str, trsvcid: &str) -> ListenAddress {
    ListenAddress {
        trtype: "RDMA".into(),
        adrfam: "IPv4".into(),
        traddr: traddr.into(),
        trsvcid: trsvcid.into(),
    }
}

/// Referrals appear in every host's discovery log, newest first, after the subsystems, with
/// SPDK's entry fields; a discovery controller that asked for it hears of each change.
#[test]
fn referrals_are_discovery_log_entries_for_every_host() {
    let mut lab = lab();
    let (genctr0, before) = discovery_log(&mut lab, HOST_A);
    assert_eq!(before.len(), 1, "the subsystem's loopback listener");

    let mut watcher = linux_bring_up_as(&mut lab, DISCOVERY_NQN, 0, HOST_B);
    watch_discovery_changes(&mut lab, &mut watcher);
    let aer = submit_aer(&mut watcher);
    assert!(lab.try_wait(&watcher.admin, 50).is_none());

    let to_discovery = Referral {
        address: rdma("10.0.0.2", "8009"),
        subnqn: DISCOVERY_NQN.into(),
        secure_channel: false,
    };
    assert!(lab.target.add_referral(to_discovery.clone()).unwrap());
    expect_discovery_notice(&mut lab, &watcher, aer);
    let to_subsystem = Referral {
        address: rdma("10.0.0.3", "4420"),
        subnqn: "nqn.2016-06.io.spdk:elsewhere".into(),
        secure_channel: true,
    };
    assert!(lab.target.add_referral(to_subsystem).unwrap());
    assert!(
        !lab.target.add_referral(to_discovery).unwrap(),
        "a duplicate is ignored"
    );

    // Any host, even one no subsystem lets in, sees the referrals.
    for host in [
        HOST_A,
        "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000000",
    ] {
        let (genctr, entries) = discovery_log(&mut lab, host);
        assert!(genctr > genctr0, "the generation counter moved");
        assert_eq!(entries.len(), 3, "subsystem entry plus two referrals");
        let (newest, oldest) = (&entries[1], &entries[2]);
        assert_eq!(newest.subsystem_type(), SubsystemType::NVME);
        assert_eq!(nul_str(&newest.subnqn), "nqn.2016-06.io.spdk:elsewhere");
        assert_eq!(newest.treq, TREQ_SECURE_CHANNEL_REQUIRED);
        assert_eq!(nul_str(&newest.traddr).trim_end(), "10.0.0.3");
        assert_eq!(nul_str(&newest.trsvcid).trim_end(), "4420");

        assert_eq!(oldest.subsystem_type(), SubsystemType::REFERRAL);
        assert_eq!(nul_str(&oldest.subnqn), DISCOVERY_NQN);
        assert_eq!(oldest.treq, TREQ_SECURE_CHANNEL_NOT_REQUIRED);
        assert_eq!(oldest.trtype, TransportType::RDMA.0);
        assert_eq!(oldest.adrfam, AddressFamily::IPV4.0);
        assert_eq!(nul_str(&oldest.traddr).trim_end(), "10.0.0.2");
        assert_eq!(nul_str(&oldest.trsvcid).trim_end(), "8009");
        assert_eq!(oldest.portid.get(), 0);
        assert_eq!(oldest.cntlid.get(), 0xFFFF);
    }

    lab.target
        .remove_referral(&rdma("10.0.0.2", "8009"), DISCOVERY_NQN)
        .unwrap();
    assert!(lab
        .target
        .remove_referral(&rdma("10.0.0.2", "8009"), DISCOVERY_NQN)
        .is_err());
    let (_, entries) = discovery_log(&mut lab, HOST_A);
    assert_eq!(entries.len(), 2);
    assert_eq!(nul_str(&entries[1].subnqn), "nqn.2016-06.io.spdk:elsewhere");
}

/// A discovery controller that enables Discovery Log Page Change notices and sends no AERs
/// queues one notice however often the log changes: the next is masked until the host reads
/// the log (as nvmet does), so a host cannot grow the target's event queue without bound.
#[test]
fn discovery_change_notices_are_masked_until_the_log_is_read() {
    let mut lab = lab();
    let mut watcher = linux_bring_up_as(&mut lab, DISCOVERY_NQN, 0, HOST_B);
    watch_discovery_changes(&mut lab, &mut watcher);
    let referral = Referral {
        address: rdma("10.0.0.2", "8009"),
        subnqn: DISCOVERY_NQN.into(),
        secure_channel: false,
    };
    for _ in 0..100 {
        assert!(lab.target.add_referral(referral.clone()).unwrap());
        lab.target
            .remove_referral(&referral.address, DISCOVERY_NQN)
            .unwrap();
    }
    lab.pg.poll();
    let first = submit_aer(&mut watcher);
    let r = lab.try_wait(&watcher.admin, 200).expect("one notice");
    assert_eq!(r.cqe.cid.get(), first);
    let second = submit_aer(&mut watcher);
    assert!(
        lab.try_wait(&watcher.admin, 50).is_none(),
        "200 changes queued more than one notice"
    );
    // Reading the log unmasks the event: the next change is heard.
    let cid = watcher.cid();
    expect_ok(&watcher.admin(
        &mut lab,
        reading(
            Command::get_log_page(cid, 0, LogPageId::DISCOVERY, 1024, 0),
            1024,
        ),
    ));
    assert!(lab.target.add_referral(referral).unwrap());
    expect_discovery_notice(&mut lab, &watcher, second);
}

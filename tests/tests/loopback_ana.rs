//! Asymmetric Namespace Access as hosts see it: one subsystem behind two listeners, a host
//! controller through each (the two paths of a multipath host).
//!
//! Identify announces ANA (CMIC, OAES, ANACAP, ANATT, ANAGRPMAX, NANAGRPID, MNAN, per-namespace
//! ANAGRPID); the ANA log page shows each controller the states of its own listener, with and
//! without Return Groups Only; a state change reaches only the controllers of that listener as
//! an ANA Change notice (masked until the log is read without RAE) and moves their log's change
//! count; I/O through a path whose group is inaccessible, lost or in transition is answered
//! with the path-related status Linux fails over on, never DNR.

use nvmf_common::spec::command::{Command, DsmRange};
use nvmf_common::spec::fabrics::{connect_offsets, parse_connect_invalid_param_dw0};
use nvmf_common::spec::features::{
    parse_async_event_dw0, AsyncEventType, AsyncNotice, FeatureId, AEC_ANA_CHANGE,
    AEC_NAMESPACE_ATTRIBUTE,
};
use nvmf_common::spec::identify::*;
use nvmf_common::spec::log_page::{AnaGroupDescriptor, AnaLogHeader, AnaState, LogPageId};
use nvmf_common::spec::Status;
use nvmf_target::core::subsystem::ListenAddress;
use nvmf_target::target::{NamespaceOptions, SubsystemOptions};
use nvmf_tests::*;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const NQN: &str = "nqn.2016-06.io.spdk:ana";
const PLAIN: &str = "nqn.2016-06.io.spdk:no-ana";
const BLOCK: usize = 512;

fn port(svc: &str) -> ListenAddress {
    ListenAddress {
        trtype: "LOOPBACK".into(),
        adrfam: "INTRA_HOST".into(),
        traddr: "local".into(),
        trsvcid: svc.into(),
    }
}

fn path_a() -> ListenAddress {
    port("4420")
}

fn path_b() -> ListenAddress {
    port("4421")
}

/// ANA subsystem of at most 4 namespaces: NSIDs 1 and 2 in group 1, NSID 3 in group 3 (its
/// default); path A optimized, path B non-optimized. A subsystem without ANA on path A.
fn lab() -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    for name in ["M1", "M2", "M3", "P1"] {
        lab.malloc(name, 64, BLOCK as u32);
    }
    let opts = SubsystemOptions {
        allow_any_host: true,
        serial_number: "SN-ANA".into(),
        max_namespaces: 4,
        ana_reporting: true,
        ..Default::default()
    };
    lab.target.create_subsystem(NQN, opts).unwrap();
    for (bdev, group) in [("M1", None), ("M2", Some(1)), ("M3", None)] {
        let ns = NamespaceOptions {
            bdev_name: bdev.into(),
            anagrpid: group,
            ..Default::default()
        };
        lab.target.add_namespace(NQN, ns).unwrap();
    }
    lab.target
        .add_listener_with_ana(NQN, path_a(), AnaState::OPTIMIZED)
        .unwrap();
    lab.target
        .add_listener_with_ana(NQN, path_b(), AnaState::NON_OPTIMIZED)
        .unwrap();
    let opts = SubsystemOptions {
        allow_any_host: true,
        ..Default::default()
    };
    lab.target.create_subsystem(PLAIN, opts).unwrap();
    let ns = NamespaceOptions {
        bdev_name: "P1".into(),
        ..Default::default()
    };
    lab.target.add_namespace(PLAIN, ns).unwrap();
    lab.target.add_listener(PLAIN, path_a()).unwrap();
    lab.pg.poll();
    lab
}

fn set_state(lab: &mut LoopbackLab, path: &ListenAddress, state: AnaState, group: Option<u32>) {
    lab.target.set_ana_state(NQN, path, state, group).unwrap();
    lab.pg.poll();
}

/// Get Log Page for the ANA log: `rgo` in LSP bit 0 (CDW10 bit 8), `rae` in CDW10 bit 15.
fn ana_log_cmd(cid: u16, len: u32, offset: u64, rgo: bool, rae: bool) -> Command {
    let mut cmd =
        Command::get_log_page(cid, 0, LogPageId::ASYMMETRIC_NAMESPACE_ACCESS, len, offset);
    let cdw10 = cmd.cdw10.get() | (u32::from(rgo) << 8) | (u32::from(rae) << 15);
    cmd.cdw10.set(cdw10);
    cmd
}

/// A parsed ANA log page: change count, then (group, state, NSIDs) per descriptor.
#[derive(Debug, PartialEq, Eq)]
struct AnaLog {
    chgcnt: u64,
    groups: Vec<(u32, AnaState, Vec<u32>)>,
}

fn parse_log(page: &[u8]) -> AnaLog {
    let header = AnaLogHeader::read_from_bytes(&page[..16]).unwrap();
    let mut at = 16;
    let mut groups = Vec::new();
    for _ in 0..header.ngrps.get() {
        let d = AnaGroupDescriptor::read_from_bytes(&page[at..at + 32]).unwrap();
        assert_eq!(
            d.chgcnt.get(),
            header.chgcnt.get(),
            "group change count follows the log's"
        );
        at += 32;
        let nsids = (0..d.nnsids.get() as usize)
            .map(|i| u32::from_le_bytes(page[at + 4 * i..at + 4 * i + 4].try_into().unwrap()))
            .collect::<Vec<_>>();
        at += 4 * nsids.len();
        groups.push((d.grpid.get(), AnaState(d.state), nsids));
    }
    assert!(
        page[at..].iter().all(|&b| b == 0),
        "nothing past the last descriptor"
    );
    AnaLog {
        chgcnt: header.chgcnt.get(),
        groups,
    }
}

fn read_log(lab: &mut LoopbackLab, ctrl: &mut HostController, rgo: bool, rae: bool) -> AnaLog {
    let cid = ctrl.cid();
    let r = ctrl.admin(lab, reading(ana_log_cmd(cid, 4096, 0, rgo, rae), 4096));
    expect_ok(&r);
    parse_log(&r.host_buffer)
}

fn enable_aen(lab: &mut LoopbackLab, ctrl: &mut HostController, aec: u32) -> Response {
    let cid = ctrl.cid();
    ctrl.admin(
        lab,
        no_data(Command::set_features(
            cid,
            FeatureId::ASYNC_EVENT_CONFIGURATION,
            aec,
            false,
        )),
    )
}

fn submit_aer(ctrl: &mut HostController) -> u16 {
    let cid = ctrl.cid();
    ctrl.admin
        .submit(no_data(Command::async_event_request(cid)));
    cid
}

#[track_caller]
fn expect_ana_notice(lab: &mut LoopbackLab, ctrl: &mut HostController, aer: u16) {
    let r = lab
        .try_wait(&ctrl.admin, 200)
        .expect("an ANA Change notice");
    assert_eq!(r.cqe.cid.get(), aer);
    assert_eq!(
        parse_async_event_dw0(expect_ok(&r).dw0.get()),
        (
            AsyncEventType::NOTICE,
            AsyncNotice::ANA_CHANGE.0,
            LogPageId::ASYMMETRIC_NAMESPACE_ACCESS
        )
    );
}

#[track_caller]
fn expect_no_notice(lab: &mut LoopbackLab, ctrl: &HostController, what: &str) {
    assert!(lab.try_wait(&ctrl.admin, 200).is_none(), "{what}");
}

fn identify_ns(lab: &mut LoopbackLab, ctrl: &mut HostController, nsid: u32) -> IdentifyNamespace {
    let cid = ctrl.cid();
    let r = ctrl.admin(
        lab,
        reading(Command::identify(cid, Cns::NAMESPACE, nsid, 0), 4096),
    );
    expect_ok(&r);
    IdentifyNamespace::read_from_bytes(&r.host_buffer).unwrap()
}

fn opt() -> AnaState {
    AnaState::OPTIMIZED
}

fn non() -> AnaState {
    AnaState::NON_OPTIMIZED
}

#[test]
fn identify_announces_ana_only_with_ana_reporting() {
    let mut lab = lab();
    let mut a = linux_bring_up_via(&mut lab, NQN, 1, &path_a());
    let id = &a.identify;
    assert_eq!(id.cmic, CMIC_MULTI_CONTROLLER | CMIC_ANA);
    assert_eq!(
        id.oaes.get(),
        OAES_NAMESPACE_ATTRIBUTE | OAES_ANA_CHANGE,
        "ANA change notices are announced"
    );
    assert_eq!(id.anatt, 10, "SPDK's and nvmet's transition time");
    assert_eq!(
        id.anacap,
        ANACAP_OPTIMIZED
            | ANACAP_NON_OPTIMIZED
            | ANACAP_INACCESSIBLE
            | ANACAP_PERSISTENT_LOSS
            | ANACAP_CHANGE,
        "every state is reportable; no static-ANAGRPID promise (groups can move)"
    );
    assert_eq!(id.anagrpmax.get(), 4);
    assert_eq!(id.nanagrpid.get(), 4);
    // Linux requires 0 < MNAN <= NN before it reads the ANA log.
    assert_eq!((id.mnan.get(), id.nn.get()), (4, 4));

    for (nsid, group) in [(1, 1), (2, 1), (3, 3)] {
        let ns = identify_ns(&mut lab, &mut a, nsid);
        assert_eq!(ns.anagrpid.get(), group, "NSID {nsid}");
        assert_eq!(ns.nuse.get(), 64);
    }
    // Through an inaccessible (or lost) path nothing is in use, as SPDK reports.
    set_state(&mut lab, &path_a(), AnaState::INACCESSIBLE, Some(3));
    assert_eq!(identify_ns(&mut lab, &mut a, 3).nuse.get(), 0);
    assert_eq!(identify_ns(&mut lab, &mut a, 1).nuse.get(), 64);
    set_state(&mut lab, &path_a(), AnaState::PERSISTENT_LOSS, Some(3));
    assert_eq!(identify_ns(&mut lab, &mut a, 3).nuse.get(), 0);

    let mut plain = linux_bring_up_via(&mut lab, PLAIN, 0, &path_a());
    let id = &plain.identify;
    assert_eq!(id.cmic, CMIC_MULTI_CONTROLLER);
    assert_eq!(id.oaes.get() & OAES_ANA_CHANGE, 0);
    assert_eq!(
        (id.anacap, id.anatt, id.anagrpmax.get(), id.mnan.get()),
        (0, 0, 0, 0)
    );
    assert_eq!(identify_ns(&mut lab, &mut plain, 1).anagrpid.get(), 0);
    // No ANA log, and no ANA notices to ask for.
    let cid = plain.cid();
    let r = plain.admin(
        &mut lab,
        reading(ana_log_cmd(cid, 4096, 0, false, false), 4096),
    );
    assert_eq!(r.cqe.status(), Status::INVALID_LOG_PAGE.with_dnr());
    let r = enable_aen(
        &mut lab,
        &mut plain,
        AEC_NAMESPACE_ATTRIBUTE | AEC_ANA_CHANGE,
    );
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());
    expect_ok(&enable_aen(
        &mut lab,
        &mut a,
        AEC_NAMESPACE_ATTRIBUTE | AEC_ANA_CHANGE,
    ));
}

#[test]
fn each_path_reads_its_own_states_with_and_without_rgo() {
    let mut lab = lab();
    let mut a = linux_bring_up_via(&mut lab, NQN, 0, &path_a());
    let mut b = linux_bring_up_via(&mut lab, NQN, 0, &path_b());
    assert_eq!(
        read_log(&mut lab, &mut a, false, false),
        AnaLog {
            chgcnt: 0,
            groups: vec![(1, opt(), vec![1, 2]), (3, opt(), vec![3])],
        }
    );
    assert_eq!(
        read_log(&mut lab, &mut b, false, false),
        AnaLog {
            chgcnt: 0,
            groups: vec![(1, non(), vec![1, 2]), (3, non(), vec![3])],
        }
    );
    // Return Groups Only: the same descriptors, no NSID lists.
    let cid = b.cid();
    let r = b.admin(
        &mut lab,
        reading(ana_log_cmd(cid, 4096, 0, true, false), 4096),
    );
    expect_ok(&r);
    assert!(r.host_buffer[16 + 64..].iter().all(|&x| x == 0));
    assert_eq!(
        parse_log(&r.host_buffer).groups,
        vec![(1, non(), vec![]), (3, non(), vec![])]
    );

    // Group 3 through path B only.
    set_state(&mut lab, &path_b(), AnaState::INACCESSIBLE, Some(3));
    assert_eq!(
        read_log(&mut lab, &mut b, false, false),
        AnaLog {
            chgcnt: 1,
            groups: vec![(1, non(), vec![1, 2]), (3, AnaState::INACCESSIBLE, vec![3])],
        }
    );
    assert_eq!(
        read_log(&mut lab, &mut a, false, false),
        AnaLog {
            chgcnt: 0,
            groups: vec![(1, opt(), vec![1, 2]), (3, opt(), vec![3])],
        },
        "path A saw no change"
    );

    // A read from an offset: the second descriptor onwards (16 + 32 + 8 bytes in).
    let cid = b.cid();
    let r = b.admin(
        &mut lab,
        reading(ana_log_cmd(cid, 36, 56, false, false), 36),
    );
    expect_ok(&r);
    let d = AnaGroupDescriptor::read_from_bytes(&r.host_buffer[..32]).unwrap();
    assert_eq!(
        (d.grpid.get(), d.nnsids.get(), d.state),
        (3, 1, AnaState::INACCESSIBLE.0)
    );
    assert_eq!(&r.host_buffer[32..], 3u32.to_le_bytes().as_bytes());

    // A namespace moved to another group shows there on both paths.
    lab.target.set_ns_ana_group(NQN, 2, 3).unwrap();
    lab.pg.poll();
    assert_eq!(
        read_log(&mut lab, &mut b, false, false).groups,
        vec![(1, non(), vec![1]), (3, AnaState::INACCESSIBLE, vec![2, 3])]
    );
    assert_eq!(identify_ns(&mut lab, &mut a, 2).anagrpid.get(), 3);
}

#[test]
fn a_state_change_notifies_only_the_controllers_of_that_path() {
    let mut lab = lab();
    let mut a = linux_bring_up_via(&mut lab, NQN, 0, &path_a());
    let mut b = linux_bring_up_via(&mut lab, NQN, 0, &path_b());
    for ctrl in [&mut a, &mut b] {
        expect_ok(&enable_aen(
            &mut lab,
            ctrl,
            AEC_NAMESPACE_ATTRIBUTE | AEC_ANA_CHANGE,
        ));
    }
    let aer_a = submit_aer(&mut a);
    let aer_b = submit_aer(&mut b);
    lab.pg.poll();

    set_state(&mut lab, &path_a(), AnaState::INACCESSIBLE, Some(1));
    expect_ana_notice(&mut lab, &mut a, aer_a);
    expect_no_notice(&mut lab, &b, "path B's states did not change");
    // A group no namespace is in changes nobody's view: no notice, no new count.
    set_state(&mut lab, &path_b(), AnaState::INACCESSIBLE, Some(2));
    expect_no_notice(&mut lab, &b, "group 2 holds no namespace");
    assert_eq!(read_log(&mut lab, &mut b, false, false).chgcnt, 0);

    // Until A reads the log without RAE, further changes raise no notice, but the count moves.
    let aer_a = submit_aer(&mut a);
    set_state(&mut lab, &path_a(), AnaState::CHANGE, Some(3));
    expect_no_notice(&mut lab, &a, "masked until the ANA log is read");
    let log = read_log(&mut lab, &mut a, false, true);
    assert_eq!(log.chgcnt, 2);
    assert_eq!(
        log.groups,
        vec![
            (1, AnaState::INACCESSIBLE, vec![1, 2]),
            (3, AnaState::CHANGE, vec![3])
        ]
    );
    set_state(&mut lab, &path_a(), opt(), Some(3));
    expect_no_notice(&mut lab, &a, "a read with RAE keeps the notice masked");
    assert_eq!(read_log(&mut lab, &mut a, true, false).chgcnt, 3);
    set_state(&mut lab, &path_a(), opt(), None);
    expect_ana_notice(&mut lab, &mut a, aer_a);
    assert_eq!(
        read_log(&mut lab, &mut a, false, false),
        AnaLog {
            chgcnt: 4,
            groups: vec![(1, opt(), vec![1, 2]), (3, opt(), vec![3])],
        }
    );

    // Moving a namespace between groups changes every path's view.
    let aer_a = submit_aer(&mut a);
    lab.target.set_ns_ana_group(NQN, 3, 1).unwrap();
    lab.pg.poll();
    expect_ana_notice(&mut lab, &mut a, aer_a);
    expect_ana_notice(&mut lab, &mut b, aer_b);
    assert_eq!(read_log(&mut lab, &mut b, false, false).chgcnt, 1);

    // A host that did not enable ANA notices (AEC bit 11) gets none; its count still moves.
    let mut c = linux_bring_up_via(&mut lab, NQN, 0, &path_a());
    expect_ok(&enable_aen(&mut lab, &mut c, AEC_NAMESPACE_ATTRIBUTE));
    let _aer_c = submit_aer(&mut c);
    set_state(&mut lab, &path_a(), non(), Some(1));
    expect_no_notice(&mut lab, &c, "AEC bit 11 is off");
    assert_eq!(read_log(&mut lab, &mut c, false, false).chgcnt, 1);
}

fn io_commands(cid: u16) -> Vec<(&'static str, Capsule)> {
    let mut range = DsmRange::new_zeroed();
    range.nlb.set(8);
    let range = range.as_bytes().to_vec();
    vec![
        (
            "read",
            with_buffer(Command::read(cid, 3, 0, 8), vec![0x5A; 8 * BLOCK]),
        ),
        (
            "write",
            in_capsule(Command::write(cid, 3, 0, 1), vec![0xC3; BLOCK]),
        ),
        ("flush", no_data(Command::flush(cid, 3))),
        (
            "write zeroes",
            no_data(Command::write_zeroes(cid, 3, 0, 8, false)),
        ),
        (
            "compare",
            in_capsule(Command::compare(cid, 3, 0, 1), vec![0; BLOCK]),
        ),
        ("dsm", in_capsule(Command::dsm(cid, 3, 1, true), range)),
    ]
}

#[test]
fn io_through_a_path_without_access_gets_the_ana_status() {
    let mut lab = lab();
    let mut a = linux_bring_up_via(&mut lab, NQN, 1, &path_a());
    let mut b = linux_bring_up_via(&mut lab, NQN, 1, &path_b());
    // Optimized and non-optimized paths both serve I/O.
    for ctrl in [&mut a, &mut b] {
        let cid = ctrl.cid();
        expect_ok(&ctrl.io(
            &mut lab,
            0,
            in_capsule(Command::write(cid, 3, 0, 1), vec![0xC3; BLOCK]),
        ));
    }
    for (state, status) in [
        (AnaState::INACCESSIBLE, Status::ANA_INACCESSIBLE),
        (AnaState::PERSISTENT_LOSS, Status::ANA_PERSISTENT_LOSS),
        (AnaState::CHANGE, Status::ANA_TRANSITION),
    ] {
        set_state(&mut lab, &path_a(), state, Some(3));
        let cid = a.cid();
        for (what, capsule) in io_commands(cid) {
            let r = a.io(&mut lab, 0, capsule);
            assert_eq!(
                r.cqe.status(),
                status,
                "{what} through path A in {state:?}: path-related, no DNR"
            );
            assert!(!r.cqe.status().dnr);
            if what == "read" {
                assert!(
                    r.host_buffer.iter().all(|&x| x == 0x5A),
                    "a refused read moves no data"
                );
            }
        }
        // Group 1 through the same path, and group 3 through path B, still work.
        let cid = a.cid();
        expect_ok(&a.io(
            &mut lab,
            0,
            with_buffer(Command::read(cid, 1, 0, 1), vec![0; BLOCK]),
        ));
        let cid = b.cid();
        let r = b.io(
            &mut lab,
            0,
            with_buffer(Command::read(cid, 3, 0, 1), vec![0; BLOCK]),
        );
        expect_ok(&r);
        assert!(r.host_buffer.iter().all(|&x| x == 0xC3));
        // Admin commands about the namespace still run through the inaccessible path.
        identify_ns(&mut lab, &mut a, 3);
        read_log(&mut lab, &mut a, false, false);
    }
    // Back to optimized: I/O runs again.
    set_state(&mut lab, &path_a(), opt(), Some(3));
    let cid = a.cid();
    let r = a.io(
        &mut lab,
        0,
        with_buffer(Command::read(cid, 3, 0, 1), vec![0; BLOCK]),
    );
    expect_ok(&r);
    assert!(r.host_buffer.iter().all(|&x| x == 0xC3));
}

#[test]
fn a_removed_listener_leaves_its_controllers_no_access() {
    let mut lab = lab();
    let mut a = linux_bring_up_via(&mut lab, NQN, 1, &path_a());
    lab.target.remove_listener(NQN, &path_a()).unwrap();
    lab.pg.poll();
    // The controller fails (its queues disconnect); until then nothing runs through it.
    let sub = lab.target.subsystem(NQN).unwrap();
    assert_eq!(sub.ns_ana_state(Some(&path_a()), 1), AnaState::INACCESSIBLE);
    let cid = a.cid();
    a.io[0].submit(with_buffer(Command::read(cid, 1, 0, 1), vec![0; BLOCK]));
    if let Some(r) = lab.try_wait(&a.io[0], 50) {
        assert_ne!(r.cqe.status(), Status::SUCCESS);
    }
}

/// SPDK's rule: with ANA reporting, an I/O queue comes through the listener of its
/// controller's admin queue (whose ANA states it sees); through the other listener its
/// Connect gets Connect Invalid Parameters at the QID. The controller keeps serving.
#[test]
fn an_io_queue_through_another_listener_than_its_admin_queue_is_refused() {
    let mut lab = lab();
    // No I/O queue yet: QID 1 is free and within the controller's maximum.
    let a = linux_bring_up_via(&mut lab, NQN, 0, &path_a());
    let q = lab.open_queue_via(path_b());
    let r = lab.run(&q, connect_capsule(1, 1, 31, 0, a.cntlid, NQN, HOSTNQN));
    assert_eq!(
        r.cqe.status(),
        Status::CONNECT_INVALID_PARAMETERS.with_dnr()
    );
    assert_eq!(
        parse_connect_invalid_param_dw0(r.cqe.dw0.get()),
        (false, connect_offsets::SQE_QID),
        "the QID is the parameter at fault"
    );
    // The same queue through the admin queue's own listener is accepted and serves I/O.
    let q = lab.open_queue_via(path_a());
    let r = lab.run(&q, connect_capsule(1, 1, 31, 0, a.cntlid, NQN, HOSTNQN));
    assert_eq!(r.cqe.status(), Status::SUCCESS);
    expect_ok(&lab.run(&q, reading(Command::read(2, 1, 0, 1), BLOCK)));
}

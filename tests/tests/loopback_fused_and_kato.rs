//! Fused operations are refused whole (Identify FUSES is zero), so a failing Compare can never
//! let its Write land; a discovery controller that asked for no keep-alive still expires; KATO
//! follows the transport's `kas`/`min_kato` as SPDK's does.

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::PropertySetCommand;
use nvmf_common::spec::features::{FeatureId, FeatureSelect};
use nvmf_common::spec::nqn::DISCOVERY_NQN;
use nvmf_common::spec::registers::{Cc, Property};
use nvmf_common::spec::Status;
use nvmf_target::cmd::fabrics::DISCOVERY_DEFAULT_KATO_MS;
use nvmf_target::transport::TransportLimits;
use nvmf_tests::*;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const FUSE_FIRST: u8 = 0b01;
const FUSE_SECOND: u8 = 0b10;

fn read_block(lab: &mut LoopbackLab, ctrl: &mut HostController) -> Vec<u8> {
    let cid = ctrl.cid();
    let r = ctrl.io(lab, 0, reading(Command::read(cid, 1, 5, 1), 512));
    expect_ok(&r);
    r.host_buffer
}

#[test]
fn fused_compare_and_write_is_refused_and_writes_nothing() {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    assert_eq!(ctrl.identify.fuses.get(), 0, "FUSES: no fused operation");
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 5, 1), vec![0x11; 512]),
    ));
    // A Compare that fails (the block holds 0x11) fused with a Write of 0x22.
    let mut compare = Command::compare(ctrl.cid(), 1, 5, 1);
    compare.flags |= FUSE_FIRST;
    let mut write = Command::write(ctrl.cid(), 1, 5, 1);
    write.flags |= FUSE_SECOND;
    let first = ctrl.io(&mut lab, 0, with_buffer(compare, vec![0x33; 512]));
    let second = ctrl.io(&mut lab, 0, with_buffer(write, vec![0x22; 512]));
    assert_eq!(first.cqe.status(), Status::INVALID_FIELD.with_dnr());
    assert_eq!(second.cqe.status(), Status::INVALID_FIELD.with_dnr());
    assert!(read_block(&mut lab, &mut ctrl).iter().all(|&b| b == 0x11));
    // Fused bits on an admin command too.
    let mut identify =
        Command::get_features(ctrl.cid(), FeatureId::ARBITRATION, FeatureSelect::CURRENT);
    identify.flags |= FUSE_FIRST;
    let r = ctrl.admin(&mut lab, no_data(identify));
    assert_eq!(r.cqe.status(), Status::INVALID_FIELD.with_dnr());
    // The queues still serve.
    assert!(read_block(&mut lab, &mut ctrl).iter().all(|&b| b == 0x11));
}

#[test]
fn discovery_controller_without_keep_alive_gets_nvmets_120_seconds() {
    let mut lab = LoopbackLab::default();
    let admin = lab.open_queue();
    let r = lab.run(
        &admin,
        connect_capsule(1, 0, 31, 0, 0xFFFF, DISCOVERY_NQN, HOSTNQN),
    );
    let cntlid = expect_ok(&r).dw0.get() as u16;
    let discovery = lab.target.subsystem(DISCOVERY_NQN).unwrap().shared.clone();
    let ctrl = discovery.controller(cntlid).expect("controller exists");
    assert_eq!(ctrl.kato_ms(), DISCOVERY_DEFAULT_KATO_MS);
    assert_eq!(DISCOVERY_DEFAULT_KATO_MS, 120_000);
}

/// The KATO the controller connected by `kato` runs with.
fn granted_kato(lab: &mut LoopbackLab, subnqn: &str, kato: u32) -> u32 {
    let admin = lab.open_queue();
    let r = lab.run(
        &admin,
        connect_capsule(1, 0, 31, kato, 0xFFFF, subnqn, HOSTNQN),
    );
    let cntlid = expect_ok(&r).dw0.get() as u16;
    let sub = lab.target.subsystem(subnqn).unwrap().shared.clone();
    sub.controller(cntlid).expect("controller exists").kato_ms()
}

/// SPDK's defaults (`kas` 100, `min_kato` 10000, as `nvmf_create_transport` takes them):
/// Identify KAS says 10 s granularity, a smaller KATO is raised to 10 s, a larger one rounded
/// up to 10 s steps, 0 stays "no keep-alive" (discovery: 120 s), in Connect and Set Features.
#[test]
fn kato_is_raised_to_min_kato_and_rounded_up_to_the_kas_granularity() {
    let spdk = TransportLimits {
        trtype: 254,
        ..TransportLimits::DEFAULT_RDMA
    };
    assert_eq!((spdk.kas, spdk.min_kato_ms), (100, 10_000));
    let mut lab = LoopbackLab::new(spdk);
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);

    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    assert_eq!(ctrl.identify.kas.get(), 100);
    let get_kato = |lab: &mut LoopbackLab, ctrl: &mut HostController| {
        let cid = ctrl.cid();
        let get = Command::get_features(cid, FeatureId::KEEP_ALIVE_TIMER, FeatureSelect::CURRENT);
        expect_ok(&ctrl.admin(lab, no_data(get))).dw0.get()
    };
    assert_eq!(LINUX_KATO_MS, 5000);
    assert_eq!(get_kato(&mut lab, &mut ctrl), 10_000, "Linux's 5 s raised");
    for (asked, granted) in [(12_000, 20_000), (30_000, 30_000), (1, 10_000)] {
        let cid = ctrl.cid();
        let set = Command::set_features(cid, FeatureId::KEEP_ALIVE_TIMER, asked, false);
        expect_ok(&ctrl.admin(&mut lab, no_data(set)));
        assert_eq!(
            get_kato(&mut lab, &mut ctrl),
            granted,
            "Set Features {asked}"
        );
    }

    for (asked, granted) in [(0, 0), (10_000, 10_000), (10_001, 20_000), (25_000, 30_000)] {
        assert_eq!(
            granted_kato(&mut lab, NQN, asked),
            granted,
            "Connect {asked}"
        );
    }
    assert_eq!(
        granted_kato(&mut lab, DISCOVERY_NQN, 0),
        DISCOVERY_DEFAULT_KATO_MS
    );
    assert_eq!(granted_kato(&mut lab, DISCOVERY_NQN, 3000), 10_000);
}

/// The loopback transport's own limits keep keep-alive fine-grained for the expiry tests.
#[test]
fn loopback_limits_report_their_kas() {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    assert_eq!(ctrl.identify.kas.get(), LOOPBACK_LIMITS.kas);
    assert_eq!(granted_kato(&mut lab, NQN, 150), 200);
}

fn set_kato(lab: &mut LoopbackLab, ctrl: &mut HostController, kato_ms: u32) {
    let cid = ctrl.cid();
    let set = Command::set_features(cid, FeatureId::KEEP_ALIVE_TIMER, kato_ms, false);
    expect_ok(&ctrl.admin(lab, no_data(set)));
}

/// An admin queue connected with `kato_ms` and enabled (CC.EN), as a host brings one up.
fn enabled_admin(lab: &mut LoopbackLab, kato_ms: u32) -> LoopbackHostQueue {
    let admin = lab.open_queue();
    let r = lab.run(
        &admin,
        connect_capsule(1, 0, 31, kato_ms, 0xFFFF, NQN, HOSTNQN),
    );
    expect_ok(&r);
    let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
    let set = PropertySetCommand::new(2, Property::CC.0, u64::from(cc.0), false);
    expect_ok(&lab.run(&admin, no_data(set.to_command())));
    admin
}

/// Polls the target for up to `for_ms` of real time; true if `admin` was disconnected.
fn disconnected_within(lab: &mut LoopbackLab, admin: &LoopbackHostQueue, for_ms: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(for_ms);
    while !admin.is_disconnected() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        lab.pg.poll();
    }
    admin.is_disconnected()
}

/// A host that lowers its KATO on every Set Features (each one an earlier deadline), or that
/// connects controllers with KATOs of weeks and drops them, leaves the reactor a bounded
/// keep-alive heap: superseded entries go once they outnumber the live ones, not weeks later.
#[test]
fn keep_alive_timers_stay_bounded_under_kato_floods() {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let week_ms = 7 * 24 * 3600 * 1000;
    // Limit: twice the live controllers plus the slack, plus the entry just pushed.
    let bound = |live: usize| 2 * live + 64 + 1;
    for i in 0..2_000 {
        set_kato(&mut lab, &mut ctrl, week_ms - i * 1000);
    }
    let heap = lab.pg.core.keep_alive_timer_count();
    assert!(
        heap <= bound(1),
        "{heap} keep-alive entries for one controller"
    );

    let queues: Vec<_> = (0..200)
        .map(|_| {
            let admin = lab.open_queue();
            let r = lab.run(
                &admin,
                connect_capsule(1, 0, 31, week_ms, 0xFFFF, NQN, HOSTNQN),
            );
            expect_ok(&r);
            admin
        })
        .collect();
    drop(queues);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while lab.pg.qpair_count() > 2 && std::time::Instant::now() < deadline {
        lab.pg.poll();
    }
    assert_eq!(
        lab.pg.qpair_count(),
        2,
        "the dropped admin queues were reaped"
    );
    // The next arming finds the dead controllers' entries and drops them.
    let _next = granted_kato(&mut lab, NQN, week_ms);
    let heap = lab.pg.core.keep_alive_timer_count();
    assert!(
        heap <= bound(2),
        "{heap} keep-alive entries for two controllers"
    );
    // The controller that flooded is still served, at the KATO it set last.
    assert_eq!(read_block(&mut lab, &mut ctrl).len(), 512);
}

/// A Set Features that lowers KATO brings the deadline forward: the controller fails at the
/// new KATO, not at the hour it connected with.
#[test]
fn a_lowered_kato_fails_a_silent_controller_at_the_new_deadline() {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let admin = enabled_admin(&mut lab, 3_600_000);
    let set = Command::set_features(3, FeatureId::KEEP_ALIVE_TIMER, 100, false);
    expect_ok(&lab.run(&admin, no_data(set)));
    assert!(
        disconnected_within(&mut lab, &admin, 5_000),
        "a silent controller outlived its 100 ms KATO"
    );
}

/// A Set Features that raises KATO moves the deadline back: the controller outlives the
/// KATO it connected with.
#[test]
fn a_raised_kato_keeps_a_silent_controller_past_the_old_deadline() {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let admin = enabled_admin(&mut lab, 100);
    let set = Command::set_features(3, FeatureId::KEEP_ALIVE_TIMER, 3_600_000, false);
    expect_ok(&lab.run(&admin, no_data(set)));
    assert!(
        !disconnected_within(&mut lab, &admin, 600),
        "the controller failed at the KATO it connected with"
    );
}

/// Keep Alive to a controller that runs no keep-alive timer (KATO 0) is Keep Alive Timeout
/// Invalid, as nvmet answers: a host that believes otherwise learns it at once.
#[test]
fn keep_alive_without_a_keep_alive_timer_is_refused() {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let admin = enabled_admin(&mut lab, 0);
    let r = lab.run(&admin, no_data(Command::keep_alive(3)));
    assert_eq!(r.cqe.status(), Status::KEEP_ALIVE_INVALID.with_dnr());
    // With a timer set, the same command is accepted.
    let set = Command::set_features(4, FeatureId::KEEP_ALIVE_TIMER, 60_000, false);
    expect_ok(&lab.run(&admin, no_data(set)));
    expect_ok(&lab.run(&admin, no_data(Command::keep_alive(5))));
}

//! Limits a host cannot talk its way around: a connection that never sends a successful
//! Connect is dropped after the core's connect timeout, while connected queues stay; I/O
//! queues per controller, controllers per subsystem, and queue pairs per host and per target
//! are capped at Connect; data buffers come in two size classes, one qpair holds at most its
//! share of them, and a host that stops taking responses loses its queue (and the buffers)
//! after the transfer timeout.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{
    connect_offsets, parse_connect_invalid_param_dw0, CNTLID_DYNAMIC,
};
use nvmf_common::spec::Status;
use nvmf_target::core::limits::{DEFAULT_MAX_QPAIRS, DEFAULT_MAX_QPAIRS_PER_HOST};
use nvmf_target::core::{CONNECT_TIMEOUT_MS, TRANSFER_TIMEOUT_MS};
use nvmf_target::target::SubsystemOptions;
use nvmf_target::transport::TransportLimits;
use nvmf_tests::*;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

fn poll_until(lab: &mut LoopbackLab, limit: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        lab.pg.poll();
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn connections_without_a_controller_are_dropped_after_the_connect_timeout() {
    assert_eq!(CONNECT_TIMEOUT_MS, 10_000, "the documented default");
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    lab.pg.core.connect_timeout_ms = 200;
    // One host never says anything; one fails its Connect and stays; one connects properly.
    let silent = lab.open_queue();
    let refused = lab.open_queue();
    let r = lab.run(
        &refused,
        connect_capsule(
            1,
            0,
            31,
            0,
            CNTLID_DYNAMIC,
            "nqn.2016-06.io.spdk:nope",
            HOSTNQN,
        ),
    );
    assert_eq!(
        r.cqe.status(),
        Status::CONNECT_INVALID_PARAMETERS.with_dnr()
    );
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    assert!(
        poll_until(&mut lab, Duration::from_secs(5), || {
            silent.is_disconnected() && refused.is_disconnected()
        }),
        "queues without a controller outlived the connect timeout"
    );
    // Long past the timeout, the connected controller's queues are still there.
    std::thread::sleep(Duration::from_millis(300));
    lab.pg.poll();
    assert!(!ctrl.admin.is_disconnected());
    assert!(!ctrl.io[0].is_disconnected());
}

const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555";
const THIRD_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:77777777-2222-3333-4444-555555555555";

/// Opens a queue and sends it an I/O Connect for `qid` of controller `cntlid`.
fn connect_io(
    lab: &mut LoopbackLab,
    cntlid: u16,
    qid: u16,
    host: &str,
) -> (LoopbackHostQueue, Response) {
    let q = lab.open_queue();
    let r = lab.run(&q, connect_capsule(1, qid, 31, 0, cntlid, NQN, host));
    (q, r)
}

fn connect_admin(lab: &mut LoopbackLab, subnqn: &str, host: &str) -> (LoopbackHostQueue, Response) {
    let q = lab.open_queue();
    let r = lab.run(
        &q,
        connect_capsule(1, 0, 31, 0, CNTLID_DYNAMIC, subnqn, host),
    );
    (q, r)
}

#[test]
fn io_queues_beyond_max_io_qpairs_per_ctrlr_get_invalid_queue_identifier() {
    // max_io_qpairs_per_ctrlr 2 (the admin queue comes on top).
    let mut lab = LoopbackLab::new(TransportLimits {
        max_qpairs_per_ctrl: 3,
        ..LOOPBACK_LIMITS
    });
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let ctrl = linux_bring_up(&mut lab, NQN, 2);
    let (_q, r) = connect_io(&mut lab, ctrl.cntlid, 3, HOSTNQN);
    assert_eq!(r.cqe.status(), Status::INVALID_QUEUE_IDENTIFIER.with_dnr());
    assert_eq!(
        parse_connect_invalid_param_dw0(r.cqe.dw0.get()),
        (false, connect_offsets::SQE_QID)
    );
}

#[test]
fn controllers_beyond_the_cntlid_range_get_controller_busy() {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    let opts = SubsystemOptions {
        allow_any_host: true,
        min_cntlid: 5,
        max_cntlid: 6,
        ..Default::default()
    };
    lab.target.create_subsystem(NQN, opts).unwrap();
    lab.target.add_listener(NQN, loopback_address()).unwrap();
    lab.pg.poll();
    let (first, r) = connect_admin(&mut lab, NQN, HOSTNQN);
    assert_eq!(r.cqe.dw0.get() as u16, 5);
    let (_second, r) = connect_admin(&mut lab, NQN, HOSTNQN);
    assert_eq!(r.cqe.dw0.get() as u16, 6);
    let (_third, r) = connect_admin(&mut lab, NQN, OTHER_HOST);
    assert_eq!(r.cqe.status(), Status::CONTROLLER_BUSY);
    // A controller going away frees its cntlid for the next host.
    drop(first);
    lab.pg.poll();
    let (_fourth, r) = connect_admin(&mut lab, NQN, OTHER_HOST);
    expect_ok(&r);
    assert_eq!(r.cqe.dw0.get() as u16, 5);
}

#[test]
fn queue_pairs_per_host_and_per_target_are_capped_at_connect() {
    assert_eq!(DEFAULT_MAX_QPAIRS_PER_HOST, 1024, "the documented default");
    assert_eq!(DEFAULT_MAX_QPAIRS, 16_384, "the documented default");
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let ctrl = linux_bring_up(&mut lab, NQN, 2);
    let mut io = ctrl.io.into_iter();
    let (_io1, io2) = (io.next().unwrap(), io.next().unwrap());
    // Lowered below what the host has: its queues stay, but a queue it closes cannot be
    // reopened while it is at the cap; Controller Busy without DNR (it may come back once a
    // queue is gone).
    lab.target
        .info
        .qpair_limits
        .max_per_host
        .store(2, Ordering::Relaxed);
    drop(io2);
    lab.pg.poll();
    assert_eq!(lab.target.info.qpair_limits.connected(HOSTNQN), (2, 2));
    let (_q, r) = connect_io(&mut lab, ctrl.cntlid, 2, HOSTNQN);
    assert_eq!(r.cqe.status(), Status::CONTROLLER_BUSY);
    let (_q, r) = connect_admin(&mut lab, NQN, HOSTNQN);
    assert_eq!(r.cqe.status(), Status::CONTROLLER_BUSY);
    let limits = &lab.target.info.qpair_limits;
    limits.max_per_host.store(3, Ordering::Relaxed);
    limits.max_total.store(5, Ordering::Relaxed);
    let (_io2, r) = connect_io(&mut lab, ctrl.cntlid, 2, HOSTNQN);
    expect_ok(&r);

    // Another host still gets in, up to the target's total of 5.
    let other = linux_bring_up_as(&mut lab, NQN, 1, OTHER_HOST);
    let (_q, r) = connect_admin(&mut lab, NQN, THIRD_HOST);
    assert_eq!(r.cqe.status(), Status::CONTROLLER_BUSY);
    // Queues that go away give their place back.
    drop(other);
    lab.pg.poll();
    let (_q, r) = connect_admin(&mut lab, NQN, THIRD_HOST);
    expect_ok(&r);
}

const BIG: usize = 131_072;

/// A lab with small pools: `small` 8 KiB buffers, `large` 128 KiB ones, `per_qpair` held at
/// most by one qpair; a 1 MiB namespace.
fn pooled_lab(small: u32, large: u32, per_qpair: u32) -> LoopbackLab {
    let transport = LoopbackTransport::with_pools(
        LOOPBACK_LIMITS,
        LoopbackPools {
            small,
            large,
            per_qpair,
        },
    );
    let mut lab = LoopbackLab::with_transport(transport);
    lab.malloc("Malloc0", 2048, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    lab
}

fn read_capsule(cid: u16, len: usize) -> Capsule {
    reading(Command::read(cid, 1, 0, (len / 512) as u32), len)
}

/// Available buffers of the (small, large) pools.
fn available(lab: &LoopbackLab) -> (usize, usize) {
    let pools = lab.transport.pools();
    (pools[0].available(), pools[1].available())
}

#[test]
fn small_commands_cannot_exhaust_the_large_pool() {
    let mut lab = pooled_lab(4, 1, 64);
    let stalled = linux_bring_up(&mut lab, NQN, 1);
    let mut other = linux_bring_up_as(&mut lab, NQN, 1, OTHER_HOST);
    // One host fills every small buffer with 4 KiB reads whose responses it never takes.
    stalled.io[0].set_receiving(false);
    for cid in 0..6 {
        stalled.io[0].submit(read_capsule(cid, 4096));
    }
    for _ in 0..10 {
        lab.pg.poll();
    }
    assert_eq!(available(&lab), (0, 1));
    // A large read of another host still gets the large buffer.
    let r = other.io(&mut lab, 0, read_capsule(1, BIG));
    expect_ok(&r);
    assert_eq!(r.host_buffer.len(), BIG);
}

#[test]
fn one_qpair_holds_at_most_its_share_of_buffers_and_a_stalled_host_loses_them() {
    assert_eq!(TRANSFER_TIMEOUT_MS, 30_000, "the documented default");
    let mut lab = pooled_lab(8, 4, 2);
    let stalled = linux_bring_up(&mut lab, NQN, 1);
    let mut other = linux_bring_up_as(&mut lab, NQN, 1, OTHER_HOST);
    stalled.io[0].set_receiving(false);
    for cid in 0..6 {
        stalled.io[0].submit(read_capsule(cid, BIG));
    }
    for _ in 0..10 {
        lab.pg.poll();
    }
    // Two large buffers held by the stalled queue; its other reads wait in its own queue,
    // not in the group's FIFO, so another host's reads go through.
    assert_eq!(available(&lab).1, 2);
    for cid in 1..4 {
        expect_ok(&other.io(&mut lab, 0, read_capsule(cid, BIG)));
    }
    assert!(stalled.io[0].poll().is_none());
    // After the transfer timeout the stalled queue goes and its buffers come back; the
    // controller's admin queue and the other host stay.
    lab.pg.core.transfer_timeout_ms = 100;
    let queue = &stalled.io[0];
    assert!(
        poll_until(&mut lab, Duration::from_secs(5), || queue.is_disconnected()),
        "a queue whose host takes no response outlived the transfer timeout"
    );
    lab.pg.poll();
    assert_eq!(available(&lab), (8, 4));
    assert!(!stalled.admin.is_disconnected());
    expect_ok(&other.io(&mut lab, 0, read_capsule(9, BIG)));
}

#[test]
fn a_host_that_receives_again_gets_its_held_responses() {
    let mut lab = pooled_lab(8, 4, 2);
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    ctrl.io[0].set_receiving(false);
    for cid in 0..5 {
        ctrl.io[0].submit(read_capsule(cid, BIG));
    }
    for _ in 0..10 {
        lab.pg.poll();
    }
    assert!(ctrl.io[0].poll().is_none());
    ctrl.io[0].set_receiving(true);
    let mut cids = Vec::new();
    while cids.len() < 5 {
        lab.pg.poll();
        while let Some(r) = ctrl.io[0].poll() {
            expect_ok(&r);
            cids.push(r.cqe.cid);
        }
    }
    cids.sort_unstable();
    assert_eq!(cids, [0, 1, 2, 3, 4]);
    assert_eq!(available(&lab), (8, 4));
}

//! NVM I/O through the loopback transport: data integrity, in-capsule writes, Flush, Write
//! Zeroes, Dataset Management, Compare, keep-alive expiry and hosts vanishing mid-I/O.

use std::time::Duration;

use nvmf_common::spec::command::{Command, DsmRange};
use nvmf_common::spec::Status;
use nvmf_tests::*;
use zerocopy::IntoBytes;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

fn lab() -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 4096, 512);
    lab.malloc("Malloc1", 1024, 4096);
    lab.subsystem(NQN, &["Malloc0", "Malloc1"]);
    lab
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read(
    lab: &mut LoopbackLab,
    ctrl: &mut HostController,
    q: usize,
    nsid: u32,
    slba: u64,
    nlb: u32,
    bs: usize,
) -> Vec<u8> {
    let cid = ctrl.cid();
    let r = ctrl.io(
        lab,
        q,
        reading(Command::read(cid, nsid, slba, nlb), nlb as usize * bs),
    );
    expect_ok(&r);
    r.host_buffer
}

#[test]
fn data_written_reads_back_on_both_block_sizes_and_queues() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 2);
    for (nsid, bs) in [(1u32, 512usize), (2, 4096)] {
        for (i, blocks) in [1u32, 8, 32].into_iter().enumerate() {
            let data = pattern(blocks as usize * bs, i as u8 + nsid as u8);
            let slba = u64::from(i as u32 * 40);
            let cid = ctrl.cid();
            expect_ok(&ctrl.io(
                &mut lab,
                0,
                with_buffer(Command::write(cid, nsid, slba, blocks), data.clone()),
            ));
            // Read through the other queue: both see the same media.
            assert_eq!(read(&mut lab, &mut ctrl, 1, nsid, slba, blocks, bs), data);
        }
    }
    // Largest transfer MDTS allows: 128 KiB.
    let data = pattern(128 * 1024, 9);
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 2, 100, 32), data.clone()),
    ));
    assert_eq!(read(&mut lab, &mut ctrl, 0, 2, 100, 32, 4096), data);
}

/// A memory-backed bdev finishes an I/O on the spot, so the command completes in the step
/// that received it: the response is out after the transport's own poll, before the core's
/// part of the turn (bdev polls, wakeups) has run, and nothing is left in flight.
#[test]
fn a_memory_bdev_answers_in_the_step_that_received_the_command() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let data = pattern(4096, 41);
    let transport_poll_only = |lab: &mut LoopbackLab| {
        lab.pg
            .with_transport(0, |t, core| t.poll(core))
            .expect("the loopback transport")
    };
    let cid = ctrl.cid();
    ctrl.io[0].submit(with_buffer(Command::write(cid, 2, 5, 1), data.clone()));
    assert!(transport_poll_only(&mut lab) > 0);
    let written = ctrl.io[0].poll().expect("answered by the transport's poll");
    expect_ok(&written);
    assert_eq!(lab.pg.core.io_in_flight(), 0);

    let cid = ctrl.cid();
    ctrl.io[0].submit(reading(Command::read(cid, 2, 5, 1), 4096));
    assert!(transport_poll_only(&mut lab) > 0);
    let read = ctrl.io[0].poll().expect("answered by the transport's poll");
    expect_ok(&read);
    assert_eq!(read.host_buffer, data);
    assert_eq!(lab.pg.core.io_in_flight(), 0);
}

/// A queue remembers the namespace its last command resolved; a namespace detached and
/// another attached under the same NSID in between is the new one to that queue's next
/// command, never the old one's bytes, and a detached NSID is refused.
#[test]
fn a_namespace_replaced_under_a_queues_last_nsid_is_the_new_one_to_it() {
    let mut lab = lab();
    lab.malloc("Replacement", 4096, 512);
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let old = pattern(4096, 3);
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 8), old.clone()),
    ));
    assert_eq!(read(&mut lab, &mut ctrl, 0, 1, 0, 8, 512), old);

    lab.target.remove_namespace(NQN, 1).unwrap();
    lab.pg.poll();
    // Another tenant's namespace appears (on the table index the detached one freed).
    let other_nqn = "nqn.2016-06.io.spdk:other";
    lab.malloc("Other", 4096, 512);
    lab.subsystem(other_nqn, &["Other"]);
    let mut other = linux_bring_up(&mut lab, other_nqn, 1);
    let secret = pattern(4096, 200);
    let cid = other.cid();
    expect_ok(&other.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 8), secret.clone()),
    ));
    let cid = ctrl.cid();
    let r = ctrl.io(&mut lab, 0, reading(Command::read(cid, 1, 0, 8), 4096));
    assert_eq!(r.cqe.status(), Status::INVALID_NAMESPACE.with_dnr());
    assert_ne!(
        r.host_buffer, secret,
        "no byte of the other tenant's namespace"
    );

    let replacement = nvmf_target::target::NamespaceOptions {
        bdev_name: "Replacement".into(),
        nsid: Some(1),
        ..Default::default()
    };
    lab.target.add_namespace(NQN, replacement).unwrap();
    lab.pg.poll();
    assert_eq!(
        read(&mut lab, &mut ctrl, 0, 1, 0, 8, 512),
        vec![0; 4096],
        "the new namespace, not the old one's data"
    );
}

#[test]
fn in_capsule_write_executes_without_a_data_fetch() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let data = pattern(4096, 3);
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        in_capsule(Command::write(cid, 1, 10, 8), data.clone()),
    ));
    assert_eq!(read(&mut lab, &mut ctrl, 0, 1, 10, 8, 512), data);
    // Larger than the in-capsule size the controller advertised (SPDK's status; an offset
    // past the capsule is Invalid SGL Offset).
    let cid = ctrl.cid();
    let r = ctrl.io(
        &mut lab,
        0,
        in_capsule(Command::write(cid, 1, 10, 16), pattern(8192, 1)),
    );
    assert_eq!(r.cqe.status(), Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    let cid = ctrl.cid();
    let mut capsule = in_capsule(Command::write(cid, 1, 10, 1), pattern(512, 1));
    capsule.cmd.dptr = nvmf_common::spec::sgl::SglDescriptor::in_capsule(4100, 512);
    let r = ctrl.io(&mut lab, 0, capsule);
    assert_eq!(r.cqe.status(), Status::INVALID_SGL_OFFSET.with_dnr());
    // In-capsule data cannot carry a read.
    let cid = ctrl.cid();
    let r = ctrl.io(
        &mut lab,
        0,
        in_capsule(Command::read(cid, 1, 10, 1), vec![0; 512]),
    );
    assert_eq!(
        r.cqe.status(),
        Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()
    );
}

#[test]
fn flush_write_zeroes_deallocate_and_compare() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let data = pattern(16 * 512, 5);
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 16), data.clone()),
    ));
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(&mut lab, 0, no_data(Command::flush(cid, 1))));

    // Compare: equal, then different.
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::compare(cid, 1, 0, 16), data.clone()),
    ));
    let mut other = data.clone();
    other[700] ^= 0xFF;
    let cid = ctrl.cid();
    let r = ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::compare(cid, 1, 0, 16), other),
    );
    assert_eq!(r.cqe.status(), Status::COMPARE_FAILURE.with_dnr());

    // Write Zeroes over blocks 2..4.
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        no_data(Command::write_zeroes(cid, 1, 2, 2, false)),
    ));
    let back = read(&mut lab, &mut ctrl, 0, 1, 0, 16, 512);
    assert!(back[1024..2048].iter().all(|&b| b == 0));
    assert_eq!(&back[..1024], &data[..1024]);
    assert_eq!(&back[2048..], &data[2048..]);

    // Deallocate two ranges; deallocated blocks read as zeroes (DLFEAT).
    let ranges = [(8u64, 2u32), (12, 4)];
    let mut payload = Vec::new();
    for (slba, nlb) in ranges {
        let mut r = DsmRange::default();
        r.slba.set(slba);
        r.nlb.set(nlb);
        payload.extend_from_slice(r.as_bytes());
    }
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::dsm(cid, 1, 2, true), payload),
    ));
    let back = read(&mut lab, &mut ctrl, 0, 1, 0, 16, 512);
    assert!(back[8 * 512..10 * 512].iter().all(|&b| b == 0));
    assert_eq!(&back[10 * 512..12 * 512], &data[10 * 512..12 * 512]);
    assert!(back[12 * 512..].iter().all(|&b| b == 0));

    // A range past the end fails the whole command, touching nothing.
    let mut bad = DsmRange::default();
    bad.slba.set(4095);
    bad.nlb.set(2);
    let cid = ctrl.cid();
    let r = ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::dsm(cid, 1, 1, true), bad.as_bytes().to_vec()),
    );
    assert_eq!(r.cqe.status(), Status::LBA_OUT_OF_RANGE.with_dnr());
}

#[test]
fn keep_alive_timeout_fails_the_controller_and_closes_its_queues() {
    let mut lab = lab();
    let admin = lab.open_queue();
    let r = lab.run(&admin, connect_capsule(1, 0, 31, 100, 0xFFFF, NQN, HOSTNQN));
    let cntlid = expect_ok(&r).dw0.get() as u16;
    let subsystem = lab.target.subsystem(NQN).unwrap().shared.clone();
    assert!(subsystem.controller(cntlid).is_some());
    // No keep-alive for longer than KATO.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !admin.is_disconnected() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        lab.pg.poll();
    }
    assert!(
        admin.is_disconnected(),
        "keep-alive expiry must tear the admin queue down"
    );
    assert!(subsystem.controller(cntlid).is_none(), "controller removed");
    assert_eq!(lab.pg.qpair_count(), 0);
    // The next host is served.
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    assert!(ctrl.cntlid > 0);
}

#[test]
fn host_vanishing_mid_io_leaks_nothing_and_harms_no_one() {
    let mut lab = lab();
    let mut victim = linux_bring_up(&mut lab, NQN, 2);
    for i in 0..16 {
        let cid = victim.cid();
        victim.io[i % 2].submit(with_buffer(
            Command::write(cid, 1, i as u64 * 8, 8),
            pattern(4096, i as u8),
        ));
    }
    let aer = victim.cid();
    victim
        .admin
        .submit(no_data(Command::async_event_request(aer)));
    drop(victim);
    for _ in 0..100 {
        lab.pg.poll();
    }
    assert_eq!(
        lab.pg.qpair_count(),
        0,
        "all queues of the vanished host are reaped"
    );
    assert_eq!(lab.pg.core.io_in_flight(), 0);
    assert!(lab
        .target
        .subsystem(NQN)
        .unwrap()
        .shared
        .controllers()
        .is_empty());

    let mut next = linux_bring_up(&mut lab, NQN, 1);
    let data = pattern(4096, 77);
    let cid = next.cid();
    expect_ok(&next.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 0, 8), data.clone()),
    ));
    assert_eq!(read(&mut lab, &mut next, 0, 1, 0, 8, 512), data);
}

#[test]
fn many_commands_in_flight_on_one_queue_all_complete() {
    // Pools far smaller than the queue: most of a full queue waits for buffers, none fails.
    let pools = LoopbackPools {
        small: 8,
        large: 8,
        per_qpair: 4,
    };
    let mut lab =
        LoopbackLab::with_transport(LoopbackTransport::with_pools(LOOPBACK_LIMITS, pools));
    lab.malloc("Malloc0", 4096, 512);
    lab.malloc("Malloc1", 1024, 4096);
    lab.subsystem(NQN, &["Malloc0", "Malloc1"]);
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let n = usize::from(LOOPBACK_LIMITS.max_queue_depth) - 1;
    for i in 0..n {
        let cid = ctrl.cid();
        ctrl.io[0].submit(with_buffer(
            Command::write(cid, 2, (i % 1000) as u64, 1),
            pattern(4096, i as u8),
        ));
    }
    let mut done = 0;
    while done < n {
        let r = lab.wait(&ctrl.io[0]);
        expect_ok(&r);
        done += 1;
    }
}

/// A host with more commands outstanding than any queue may hold (twice the largest depth,
/// the slots an RDMA queue has) broke the protocol: its queue is closed, as an RDMA queue is,
/// instead of growing without bound; another host's queue keeps working. The flooder takes
/// no responses, so its commands stay outstanding even on a bdev that finishes them at once.
#[test]
fn a_host_that_overruns_its_queue_loses_it_and_others_do_not_notice() {
    let mut lab = lab();
    let mut victim = linux_bring_up(&mut lab, NQN, 1);
    let mut flooder = linux_bring_up(&mut lab, NQN, 1);
    flooder.io[0].set_receiving(false);
    let slots = 2 * usize::from(LOOPBACK_LIMITS.max_queue_depth);
    for i in 0..slots + 50 {
        let cid = flooder.cid();
        flooder.io[0].submit(with_buffer(
            Command::write(cid, 2, (i % 1000) as u64, 1),
            pattern(4096, i as u8),
        ));
    }
    for _ in 0..50 {
        lab.pg.poll();
    }
    assert!(
        flooder.io[0].is_disconnected(),
        "the overrun queue is closed"
    );
    let cid = victim.cid();
    let r = victim.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 2, 7, 1), pattern(4096, 9)),
    );
    expect_ok(&r);
}

/// The responses on `q` until both `cids` have answered, by CID.
fn responses_for(lab: &mut LoopbackLab, q: &LoopbackHostQueue, cids: [u16; 2]) -> [Response; 2] {
    let mut got: Vec<Response> = Vec::new();
    while got.len() < 2 {
        got.push(lab.wait(q));
    }
    got.sort_by_key(|r| usize::from(r.cqe.cid.get() != cids[0]));
    assert_eq!(got[1].cqe.cid.get(), cids[1]);
    [got.remove(0), got.remove(0)]
}

/// CC.EN 1 to 0 is a Controller Reset: the controller's outstanding AER is aborted and its
/// I/O queues are disconnected; the admin queue stays,
/// and once enabled again the host connects a new I/O queue with the same QID and is served.
#[test]
fn a_controller_reset_deletes_the_io_queues_and_keeps_the_admin_queue() {
    use nvmf_common::spec::fabrics::{PropertyGetCommand, PropertySetCommand};
    use nvmf_common::spec::registers::{Cc, Csts, Property};
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let aer = ctrl.cid();
    ctrl.admin
        .submit(no_data(Command::async_event_request(aer)));
    let reset = ctrl.cid();
    ctrl.admin.submit(no_data(
        PropertySetCommand::new(reset, Property::CC.0, 0, false).to_command(),
    ));
    let [aborted, done] = responses_for(&mut lab, &ctrl.admin, [aer, reset]);
    assert_eq!(aborted.cqe.status(), Status::ABORTED_SQ_DELETION);
    expect_ok(&done);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !ctrl.io[0].is_disconnected() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        lab.pg.poll();
    }
    assert!(ctrl.io[0].is_disconnected(), "the reset kept the I/O queue");
    assert!(
        !ctrl.admin.is_disconnected(),
        "the reset took the admin queue"
    );

    // Enabled again: ready, and a new I/O queue 1 serves.
    let cid = ctrl.cid();
    let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
    let set = PropertySetCommand::new(cid, Property::CC.0, u64::from(cc.0), false);
    expect_ok(&ctrl.admin(&mut lab, no_data(set.to_command())));
    let cid = ctrl.cid();
    let get = PropertyGetCommand::new(cid, Property::CSTS.0, false);
    let r = ctrl.admin(&mut lab, no_data(get.to_command()));
    assert!(Csts(expect_ok(&r).dw0.get()).rdy());
    let q = lab.open_queue();
    let connect = connect_capsule_as(1, 1, 31, 0, ctrl.cntlid, NQN, HOSTNQN, HOSTID);
    expect_ok(&lab.run(&q, connect));
    ctrl.io[0] = q;
    let cid = ctrl.cid();
    let r = ctrl.io(&mut lab, 0, reading(Command::read(cid, 1, 0, 1), 512));
    expect_ok(&r);
}

/// A namespace removed while its host's I/O is still with the bdev keeps the bdev claimed
/// until that I/O has drained: no other subsystem can export the bdev meanwhile, so the
/// old tenant's late writes never land on the new tenant's device, nor its late reads
/// return the new tenant's data.
#[test]
fn a_removed_namespace_keeps_its_bdev_until_its_io_has_drained() {
    use nvmf_target::bdev::{BdevError, DelayBdev};
    use nvmf_target::target::{NamespaceOptions, TargetError};
    let mut lab = LoopbackLab::default();
    let base = lab.malloc("Base", 64, 512);
    let slow = DelayBdev::new("Slow", base, None, 0, 0, 300_000, 300_000);
    lab.target
        .bdevs
        .register(std::sync::Arc::new(slow))
        .unwrap();
    lab.subsystem(NQN, &["Slow"]);
    lab.subsystem("nqn.2016-06.io.spdk:other", &[]);
    let mut old = linux_bring_up(&mut lab, NQN, 1);
    let cid = old.cid();
    old.io[0].submit(in_capsule(Command::write(cid, 1, 0, 1), vec![0xAB; 512]));
    lab.pg.poll();
    lab.target.remove_namespace(NQN, 1).unwrap();
    lab.pg.poll();
    let again = |lab: &mut LoopbackLab| {
        let opts = NamespaceOptions {
            bdev_name: "Slow".into(),
            ..Default::default()
        };
        lab.target.add_namespace("nqn.2016-06.io.spdk:other", opts)
    };
    match again(&mut lab) {
        Err(TargetError::Bdev(BdevError::Claimed { name, .. })) => assert_eq!(name, "Slow"),
        other => panic!("the bdev was given away with a write in flight: {other:?}"),
    }
    // The write completes (its namespace is gone, its bdev is not); then the bdev is free.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let r = loop {
        if let Some(r) = lab.try_wait(&old.io[0], 100) {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the write never completed"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(r.cqe.cid.get(), cid);
    for _ in 0..10 {
        lab.pg.poll();
    }
    assert_eq!(again(&mut lab).unwrap(), 1);
}

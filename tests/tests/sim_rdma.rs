//! The real RDMA transport of the target over the simulated fabric: data moves with keyed
//! SGLs and in-capsule data, and hosts that stop receiving, vanish, reuse what was freed or
//! send garbage cannot crash the target, leak its resources or reach another host's bytes.

use std::time::Duration;

use nvmf_common::rdma::sim::{SimAsyncEvent, SimAsyncEventKind, DEFAULT_MAX_INLINE_DATA};
use nvmf_common::reactor::Sleeper;
use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{ConnectCommand, ConnectData, CNTLID_DYNAMIC};
use nvmf_common::spec::rdma_cm::RdmaCmRejectStatus;
use nvmf_common::spec::Status;
use nvmf_target::core::{IDLE_SLEEP_MAX_MS, TICK_MS};
use nvmf_tests::sim::*;
use zerocopy::IntoBytes;

const BLOCK: usize = 512;

#[test]
fn keyed_and_in_capsule_writes_read_back_over_rdma() {
    let mut lab = SimLab::new(1);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 64 * 1024);

    // Keyed write of 8 blocks, then a keyed read into another part of the buffer.
    let data = pattern(7, 8 * BLOCK);
    io.data.write_at(0, &data);
    let c = io.run(&mut lab, write_cmd(1, 16, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    let c = io.run(&mut lab, read_cmd(2, 16, 8), keyed(32 * 1024, 4096));
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(data_bytes(&io, 32 * 1024, 4096), data);

    // In-capsule write of 2 blocks, read back.
    let small = pattern(99, 2 * BLOCK);
    io.data.write_at(8192, &small);
    let c = io.run(
        &mut lab,
        write_cmd(3, 100, 2),
        Data::InCapsule {
            offset: 8192,
            len: 1024,
        },
    );
    assert!(c.status().is_success(), "{c:?}");
    let c = io.run(&mut lab, read_cmd(4, 100, 2), keyed(16384, 1024));
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(data_bytes(&io, 16384, 1024), small);

    // A read whose SGL is shorter than the data is refused, not truncated or overrun.
    let c = io.run(&mut lab, read_cmd(5, 0, 8), keyed(0, 512));
    assert_eq!(
        c.status(),
        Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
        "{c:?}"
    );

    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

#[test]
fn a_connect_with_bad_private_data_is_rejected_with_its_status() {
    let mut lab = SimLab::new(2);
    let host = lab.fabric.add_host(host_ip(1));
    // Three bytes arrive padded to RoCE's 56: long enough, but not an NVMe-oF record.
    let r = HostQueue::connect_with(&mut lab, &host, 0, 32, 4096, 32, |_| vec![1, 2, 3]);
    match r {
        Err(Refused::Rejected { nvmf_status, .. }) => {
            assert_eq!(nvmf_status, RdmaCmRejectStatus::INVALID_RECFMT.0)
        }
        other => panic!("expected a reject, got {:?}", other.map(|_| ())),
    }
    let r = HostQueue::connect_with(&mut lab, &host, 0, 4000, 4096, 32, |req| {
        zerocopy::IntoBytes::as_bytes(req).to_vec()
    });
    match r {
        Err(Refused::Rejected { nvmf_status, .. }) => {
            assert_eq!(nvmf_status, RdmaCmRejectStatus::INVALID_HSQSIZE.0)
        }
        other => panic!("expected a reject, got {:?}", other.map(|_| ())),
    }
    lab.assert_drained();
}

/// Two Connects pipelined on one new queue, their Connect data both fetched by RDMA READ:
/// both pass the target's first look before either runs. One controller comes of them; the
/// other Connect fails with Command Sequence Error. When the queue goes, neither leaves a
/// controller or a counted connection behind (enough of those once locked every host out).
#[test]
fn pipelined_connects_on_one_queue_make_one_controller() {
    let mut lab = SimLab::new(21);
    let host = lab.fabric.add_host(host_ip(1));
    let mut q = HostQueue::connect(&mut lab, &host, 0, 32).expect("admin queue accepted");
    let data = ConnectData::new([0x11; 16], CNTLID_DYNAMIC, SUBNQN, HOSTNQN);
    let len = data.as_bytes().len();
    q.data.write_at(0, data.as_bytes());
    q.data.write_at(len, data.as_bytes());
    let connect = |cid| ConnectCommand::new(cid, 0, 31, 30_000).to_command();
    q.submit(connect(1), keyed(0, len as u32));
    q.submit(connect(2), keyed(len, len as u32));
    let mut done = Vec::new();
    lab.until(20_000, |_| {
        done.extend(q.poll());
        done.len() >= 2
    });
    done.sort_by_key(|c| c.status().is_success());
    let [lost, won] = [done[0], done[1]];
    assert!(won.status().is_success(), "{won:?}");
    assert_eq!(
        lost.status(),
        Status::COMMAND_SEQUENCE_ERROR.with_dnr(),
        "{lost:?}"
    );
    let controllers = lab.target.subsystem(SUBNQN).unwrap().shared.controllers();
    assert_eq!(controllers.len(), 1, "one queue, one controller");
    assert_eq!(controllers[0].cntlid, won.dw0.get() as u16);
    assert_eq!(lab.target.info.qpair_limits.connected(HOSTNQN), (1, 1));

    q.disconnect();
    lab.assert_drained();
}

/// A Controller Reset (CC.EN 1 to 0) over RDMA: the controller's I/O queue is disconnected
/// at the next housekeeping tick, its admin queue stays and answers.
#[test]
fn a_controller_reset_disconnects_the_io_queues_over_rdma() {
    use nvmf_common::spec::fabrics::{PropertyGetCommand, PropertySetCommand};
    use nvmf_common::spec::registers::{Csts, Property};
    let mut lab = SimLab::new(22);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 8192);
    let c = io.run(&mut lab, read_cmd(1, 0, 1), keyed(0, 512));
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(lab.total_resources().qpairs, 2);
    let reset = PropertySetCommand::new(3, Property::CC.0, 0, false).to_command();
    let c = admin.run(&mut lab, reset, Data::None);
    assert!(c.status().is_success(), "{c:?}");
    // A housekeeping tick (TICK_MS) closes it; the QP drains and goes.
    for _ in 0..1000 {
        if lab.total_resources().qpairs == 1 {
            break;
        }
        lab.run_for(Duration::from_millis(1), Duration::from_millis(1));
    }
    assert_eq!(
        lab.total_resources().qpairs,
        1,
        "the I/O queue outlived the reset"
    );
    let get = PropertyGetCommand::new(4, Property::CSTS.0, false).to_command();
    let c = admin.run(&mut lab, get, Data::None);
    assert!(c.status().is_success(), "{c:?}");
    assert!(!Csts(c.dw0.get()).rdy());
    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

/// Eight hosts that never Connect and post no receives flood a queue each with commands
/// made by `command`: each refused command's response waits in RNR and holds its request
/// slot, so once every slot is taken the next commands wait for one. Then a host that
/// behaves must be served at once: the waiting commands have not taken the capsule pool,
/// and with it the SRQ's receives.
fn a_flood_of_waiting_commands_leaves_the_receives_alone(
    seed: u64,
    command: impl Fn(u16) -> (Command, Data),
) {
    let mut lab = SimLab::new(seed);
    let hostile = lab.fabric.add_host(host_ip(2));
    let good = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &good);
    let mut io = io_queue(&mut lab, &good, cntlid, 32, 8192);
    let depth = 64u16;
    let mut flooders = Vec::new();
    for _ in 0..8 {
        let mut q = HostQueue::connect_with(&mut lab, &hostile, 1, depth, 8192, 0, |req| {
            zerocopy::IntoBytes::as_bytes(req).to_vec()
        })
        .expect("accepted");
        // Twice the depth fills the request slots with responses stuck in RNR; one depth
        // more waits for a slot.
        for cid in 0..3 * depth {
            let (cmd, data) = command(cid);
            // With the SRQ empty the host's sends wait in RNR and its send queue fills.
            if !q.try_submit(cmd, data) {
                break;
            }
            lab.turns(2);
        }
        flooders.push(q);
    }
    lab.run_for(Duration::from_millis(20), Duration::from_millis(1));
    let r = lab.resources(0);
    assert!(
        r.backlog >= 8 * usize::from(depth) / 2,
        "the flood did not wait: {r:?}"
    );
    assert!(
        r.recv_slots_waiting < 64,
        "receive slots wait for capsule buffers: {r:?}"
    );
    // The host that behaves is served at once, in-capsule data included.
    io.data.write_at(4096, &[0x5A; 512]);
    let write = Data::InCapsule {
        offset: 4096,
        len: 512,
    };
    io.submit(write_cmd(6, 0, 1), write);
    io.submit(read_cmd(7, 0, 1), keyed(0, 512));
    let mut done = Vec::new();
    for _ in 0..100 {
        lab.run_for(Duration::from_millis(1), Duration::from_millis(1));
        done.extend(io.poll());
        if done.len() == 2 {
            break;
        }
    }
    assert_eq!(
        done.len(),
        2,
        "the good host waited behind the flood: {done:?}"
    );
    assert!(done.iter().all(|c| c.status().is_success()), "{done:?}");
    assert_eq!(data_bytes(&io, 0, 512), vec![0x5A; 512]);
    for mut q in flooders {
        q.disconnect();
    }
    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

/// Commands without in-capsule data give their capsule buffer back as they start waiting.
#[test]
fn waiting_commands_without_data_hold_no_capsule_buffer() {
    a_flood_of_waiting_commands_leaves_the_receives_alone(23, |cid| {
        (Command::flush(cid, 1), Data::None)
    });
}

/// Commands with in-capsule data keep their capsule buffers only up to a device-wide cap;
/// past it their data is dropped and they are answered Command Interrupted (retried).
#[test]
fn waiting_in_capsule_commands_hold_a_bounded_share_of_capsule_buffers() {
    a_flood_of_waiting_commands_leaves_the_receives_alone(24, |cid| {
        let data = Data::InCapsule {
            offset: 0,
            len: 512,
        };
        (write_cmd(cid, 0, 1), data)
    });
}

/// Defect 1 of issue 11, end to end: hosts that post no receives pin the large data pool
/// (their responses wait in RNR, which they asked to retry for ever), so queue A's commands
/// wait for buffers behind them; A disconnects and is reaped while its entries stay queued,
/// and a shallow queue B takes A's qpair index. When the pool frees up, A's stale entries
/// must be dropped, not served against B's shorter request array (that panicked the reactor).
#[test]
fn stale_waiters_of_a_reaped_qpair_are_not_served_to_the_next_one() {
    let mut lab = SimLab::new(3);
    let host = lab.fabric.add_host(host_ip(1));
    let hostile = lab.fabric.add_host(host_ip(2));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let (mut hostile_admin, hostile_cntlid) = admin_queue(&mut lab, &hostile);
    let large = |i: u16| keyed(usize::from(i) * 16 * 1024, 16 * 1024);
    let small = |i: u16| keyed(usize::from(i) * 16 * 1024, 4096);
    // Eight pinning queues: four pin the whole large pool (64 buffers, at most 16 per qpair)
    // with 16 reads each, four the small one (256, at most 64 per qpair) with 64 (a read's
    // response holds its buffer until the SEND completes; a write's gives it back when it is
    // queued). A ninth queues one small and one large read, which head the buffer FIFOs
    // while both pools are empty.
    let mut pinning = Vec::new();
    for qid in 1..=9u16 {
        let q = stalled_io_queue(&mut lab, &hostile, hostile_cntlid, qid, 64, 64 * 16 * 1024);
        pinning.push(q);
    }
    let mut a = io_queue(&mut lab, &host, cntlid, 128, 100 * 16 * 1024);
    for (n, q) in pinning.iter_mut().enumerate() {
        if n == 8 {
            q.submit(read_cmd(1, 0, 8), small(0));
            q.submit(read_cmd(2, 0, 32), large(1));
        } else {
            let count = if n < 4 { 16 } else { 64 };
            for i in 0..count {
                let data = if n < 4 { large(i) } else { small(i) };
                let blocks = if n < 4 { 32 } else { 8 };
                q.submit(read_cmd(i + 1, u64::from(i) * 32, blocks), data);
            }
        }
        lab.run_for(Duration::from_millis(2), Duration::from_millis(1));
    }
    assert_eq!(
        lab.resources(0).buffers_out,
        64 + 256,
        "both pools are pinned"
    );

    // Queue A (connected before the pools were pinned): 100 large writes, all waiting.
    for i in 0..100u16 {
        a.submit(write_cmd(i + 1, u64::from(i) * 32, 32), large(i));
    }
    lab.run_for(Duration::from_millis(2), Duration::from_millis(1));
    assert!(lab.resources(0).waiting >= 102, "{:?}", lab.resources(0));
    let before = lab.resources(0).qpairs;
    a.disconnect();
    drop(a);
    lab.until(20_000, |lab| lab.resources(0).qpairs == before - 1);
    assert!(
        lab.resources(0).waiting >= 102,
        "A's entries are still queued behind the pinned pools"
    );

    // Queue B, depth 2, takes A's index (at the RDMA connect; its Fabrics Connect needs a
    // buffer and comes after); then the pinning host starts receiving again.
    let mut b = HostQueue::connect_with(&mut lab, &host, 1, 2, 8192, 2, |r| {
        zerocopy::IntoBytes::as_bytes(r).to_vec()
    })
    .expect("queue B");
    lab.turns(10);
    for q in &mut pinning {
        q.repost = true;
        q.post_missing_receives();
    }
    lab.run_for(Duration::from_millis(20), Duration::from_millis(1));
    for q in &mut pinning {
        q.poll();
    }
    let c = b.fabric_connect(&mut lab, 1, cntlid);
    assert!(c.status().is_success(), "{c:?}");
    let data = pattern(3, 4096);
    b.data.write_at(0, &data);
    let c = b.run(&mut lab, write_cmd(1, 0, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    let c = b.run(&mut lab, read_cmd(2, 0, 8), keyed(4096, 4096));
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(data_bytes(&b, 4096, 4096), data);
    b.disconnect();
    for q in &mut pinning {
        q.disconnect();
    }
    admin.disconnect();
    hostile_admin.disconnect();
    lab.assert_drained();
}

/// Defect 3 of issue 11: the SEND of a `[RDMA WRITE, SEND]` response fails to post after the
/// WRITE was posted. The buffer the WRITE reads must stay out of the pool until the QP is
/// destroyed: another host's data written meanwhile must never reach this host.
#[test]
fn a_buffer_behind_a_posted_write_is_not_reused_before_the_qp_is_gone() {
    let mut lab = SimLab::new(4);
    let host_a = lab.fabric.add_host(host_ip(1));
    let host_b = lab.fabric.add_host(host_ip(2));
    let (mut admin_a, cntlid_a) = admin_queue(&mut lab, &host_a);
    let (mut admin_b, cntlid_b) = admin_queue(&mut lab, &host_b);
    let mut a = io_queue(&mut lab, &host_a, cntlid_a, 8, 64 * 1024);
    let mut b = io_queue(&mut lab, &host_b, cntlid_b, 8, 64 * 1024);

    // A reads zeroes from blocks 0..8 (never written); its WRITE is held on the wire and the
    // SEND behind it fails to post.
    a.data.write_at(0, &[0xAA; 4096]);
    lab.fabric.hold_writes(a.target_qp_num);
    lab.fabric
        .fail_post_send(a.target_qp_num, 0, 1, 12 /* ENOMEM */);
    a.submit(read_cmd(1, 0, 8), keyed(0, 4096));
    lab.turns(20);

    // Before the next tick closes A's qpair, B writes a marker through every buffer of the
    // small pool (256), so a buffer given back too early now holds B's data; then A's WRITE
    // goes out.
    let start = lab.fabric.now_ns();
    let marker = vec![0x5Au8; 4096];
    b.data.write_at(0, &marker);
    for i in 0..272u16 {
        let keyed = keyed(0, 4096);
        let c = b.run(&mut lab, write_cmd(i + 1, 1000, 8), keyed);
        assert!(c.status().is_success(), "{c:?}");
    }
    lab.fabric.release_writes(a.target_qp_num);
    lab.turns(50);
    assert!(
        lab.fabric.now_ns() - start < 10_000_000,
        "the scenario must fit between two ticks"
    );
    lab.run_for(Duration::from_millis(3000), Duration::from_millis(10));
    let got = data_bytes(&a, 0, 4096);
    assert!(
        got.iter().all(|&x| x == 0) || got.iter().all(|&x| x == 0xAA),
        "host A received bytes it never asked for: {:?}",
        &got[..16]
    );
    assert!(!got.contains(&0x5A), "host B's data reached host A");
    drop(a);
    b.disconnect();
    admin_a.disconnect();
    admin_b.disconnect();
    lab.assert_drained();
}

/// Issue 12's hostile host on RDMA: it sends commands and never takes a response. The
/// transfer timeout closes its queue and frees every buffer; another host's I/O goes on.
#[test]
fn a_host_that_never_takes_its_responses_is_cut_off_and_others_go_on() {
    let mut lab = SimLab::new(5);
    let bad = lab.fabric.add_host(host_ip(1));
    let good = lab.fabric.add_host(host_ip(2));
    let (mut admin_bad, cntlid_bad) = admin_queue(&mut lab, &bad);
    let (mut admin_good, cntlid_good) = admin_queue(&mut lab, &good);
    let mut hostile = stalled_io_queue(&mut lab, &bad, cntlid_bad, 1, 64, 64 * 16 * 1024);
    for i in 0..63u16 {
        hostile.submit(
            read_cmd(i + 1, 0, 32),
            keyed(usize::from(i) * 16 * 1024, 16 * 1024),
        );
    }
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));
    let r = lab.resources(0);
    assert!(r.buffers_out > 0);
    // Past its share of buffers, the hostile queue's requests are parked on it: no turn
    // looks at them again until it gives a buffer back, which it never does.
    assert!(r.parked > 0, "{r:?}");
    assert_eq!(r.waiting, 0, "over-share requests left in the FIFO: {r:?}");

    let mut io = io_queue(&mut lab, &good, cntlid_good, 16, 64 * 1024);
    for i in 0..20u16 {
        let c = io.run(&mut lab, read_cmd(i + 1, 8, 8), keyed(0, 4096));
        assert!(c.status().is_success(), "the good host starved: {c:?}");
    }
    // 35 s of virtual time, both hosts keeping their controllers alive: the transfer timeout
    // (30 s) closes the hostile queue and its buffers come back.
    for n in 0..7u16 {
        lab.run_for(Duration::from_secs(5), Duration::from_millis(100));
        for q in [&mut admin_bad, &mut admin_good] {
            let c = q.run(&mut lab, Command::keep_alive(500 + n), Data::None);
            assert!(c.status().is_success(), "{c:?}");
        }
    }
    let r = lab.resources(0);
    assert_eq!(r.qpairs, 3, "hostile queue still open: {r:?}");
    let c = io.run(&mut lab, read_cmd(99, 8, 8), keyed(0, 4096));
    assert!(c.status().is_success());
    drop(hostile);
    io.disconnect();
    admin_bad.disconnect();
    admin_good.disconnect();
    lab.assert_drained();
}

/// A slow host, not a hostile one: its requests past its buffer share are parked while it
/// does not receive, and every one of them completes, in order of arrival per class, once it
/// takes responses again.
#[test]
fn parked_requests_of_a_slow_host_all_complete_when_it_receives_again() {
    let mut lab = SimLab::new(6);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut slow = stalled_io_queue(&mut lab, &host, cntlid, 1, 64, 64 * 16 * 1024);
    for i in 0..63u16 {
        slow.submit(
            read_cmd(i + 1, 0, 32),
            keyed(usize::from(i) * 16 * 1024, 16 * 1024),
        );
    }
    lab.run_for(Duration::from_millis(20), Duration::from_millis(1));
    let parked = lab.resources(0).parked;
    assert!(parked > 0, "nothing parked: {:?}", lab.resources(0));
    slow.repost = true;
    slow.post_missing_receives();
    let mut done = std::collections::BTreeSet::new();
    lab.until(50_000, |_| {
        for c in slow.poll() {
            assert!(c.status().is_success(), "{c:?}");
            done.insert(c.cid.get());
        }
        done.len() == 63
    });
    assert_eq!(done.len(), 63, "parked requests never served");
    let r = lab.resources(0);
    assert_eq!((r.parked, r.waiting), (0, 0), "{r:?}");
    slow.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

/// A host disconnects at every point of a burst of mixed commands, so each request state
/// (waiting for a buffer, reading, executing, waiting to send, sending) meets a disconnect.
#[test]
fn a_disconnect_in_every_request_state_leaks_nothing() {
    for cut in 0..40usize {
        let mut lab = SimLab::new(100 + cut as u64);
        let host = lab.fabric.add_host(host_ip(1));
        let (mut admin, cntlid) = admin_queue(&mut lab, &host);
        let mut io = io_queue(&mut lab, &host, cntlid, 32, 32 * 16 * 1024);
        for i in 0..31u16 {
            let off = usize::from(i) * 16 * 1024;
            let cmd = match i % 3 {
                0 => write_cmd(i + 1, u64::from(i) * 32, 32),
                1 => read_cmd(i + 1, u64::from(i) * 32, 32),
                _ => write_cmd(i + 1, u64::from(i), 1),
            };
            let data = if i % 3 == 2 {
                Data::InCapsule {
                    offset: off,
                    len: 512,
                }
            } else {
                keyed(off, 16 * 1024)
            };
            io.submit(cmd, data);
        }
        lab.turns(cut);
        io.disconnect();
        drop(io);
        admin.disconnect();
        lab.assert_drained();
    }
}

/// Capsules shorter than an SQE, SQEs of random bytes and commands with lying SGLs: the
/// target answers or closes the queue, never panics, and leaks nothing.
#[test]
fn garbage_and_truncated_capsules_close_the_queue_or_fail_the_command() {
    let mut lab = SimLab::new(6);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);

    // A lying key and an address outside the host's memory: the RDMA READ fails at the host,
    // the qpair goes to error and is reaped.
    let mut io = io_queue(&mut lab, &host, cntlid, 8, 8192);
    io.submit(
        write_cmd(1, 0, 8),
        Data::RawKeyed {
            addr: 0xdead_0000,
            len: 4096,
            key: 0x1234,
        },
    );
    lab.run_for(Duration::from_millis(100), Duration::from_millis(1));
    drop(io);

    // Truncated capsule: 10 bytes.
    let mut io = io_queue(&mut lab, &host, cntlid, 8, 8192);
    io.write_capsule(0, &[0xFF; 10]);
    io.send_raw(0, 10);
    lab.run_for(Duration::from_millis(100), Duration::from_millis(1));
    drop(io);

    // Random SQEs.
    let mut io = io_queue(&mut lab, &host, cntlid, 8, 8192);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for n in 0..6 {
        let mut bytes = [0u8; 64];
        for b in bytes.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let base = n * (64 + 8192);
        io.write_capsule(base, &bytes);
        io.send_raw(base, 64);
    }
    lab.run_for(Duration::from_millis(100), Duration::from_millis(1));
    let _ = io.poll();
    drop(io);

    // The admin queue still works.
    let c = admin.run(&mut lab, Command::keep_alive(77), Data::None);
    assert!(c.status().is_success(), "{c:?}");
    admin.disconnect();
    lab.assert_drained();
}

/// Defect 5 of issue 11: a device whose CQ is small (512 entries, the device maximum).
/// A host that stops receiving piles up send work requests on 20 queues, then disconnects
/// them all while the reactor is busy, so every one of them is flushed into the CQ at once. Connections whose send queues the CQ could not absorb are refused up
/// front; the CQ never overruns (an overrun breaks every QP of the device).
#[test]
fn the_shared_cq_never_overruns_and_refuses_what_it_cannot_hold() {
    let mut attr = nvmf_common::rdma::sim::default_device_attr();
    attr.max_cqe = 512;
    let mut lab = SimLab::with_target_attr(7, small_options(), attr);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut queues = Vec::new();
    let mut refused = 0;
    for qid in 1..=20 {
        match HostQueue::connect_with(&mut lab, &host, qid, 16, 4096, 1, |r| {
            zerocopy::IntoBytes::as_bytes(r).to_vec()
        }) {
            Ok(mut q) => {
                q.repost = false;
                let c = q.fabric_connect(&mut lab, qid, cntlid);
                assert!(c.status().is_success());
                queues.push(q);
            }
            Err(Refused::Rejected { nvmf_status, .. }) => {
                assert_eq!(nvmf_status, RdmaCmRejectStatus::NO_RESOURCES.0);
                refused += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(!queues.is_empty());
    // 32 Flushes on each (twice the depth: the most request slots a queue has; no data, so
    // no buffer pool limits them), whose response SENDs wait in RNR; then the host
    // disconnects everything.
    for q in &mut queues {
        for i in 0..32u16 {
            q.submit(Command::flush(i + 1, 1), Data::None);
        }
    }
    lab.run_for(Duration::from_millis(5), Duration::from_millis(1));
    for q in &mut queues {
        q.disconnect();
    }
    // The reactor is busy elsewhere while every disconnect arrives: all the flushes land in
    // the CQ before it is polled again.
    lab.fabric.advance(Duration::from_millis(50));
    queues.clear();
    admin.disconnect();
    lab.assert_drained();
    let lost = lab.fabric.stats().cqes_lost;
    assert_eq!(
        lost, 0,
        "the target's CQ overran and lost {lost} completions"
    );
    assert!(refused > 0, "a 512-entry CQ took every connection");
}

/// Issue 11's fifth defect, the events side: the device reports one QP broken. That qpair
/// (and only it) is closed; the other host's I/O goes on.
#[test]
fn a_fatal_qp_event_closes_that_qpair_only() {
    let mut lab = SimLab::new(8);
    let host_a = lab.fabric.add_host(host_ip(1));
    let host_b = lab.fabric.add_host(host_ip(2));
    let (mut admin_a, cntlid_a) = admin_queue(&mut lab, &host_a);
    let (mut admin_b, cntlid_b) = admin_queue(&mut lab, &host_b);
    let mut a = io_queue(&mut lab, &host_a, cntlid_a, 8, 8192);
    let mut b = io_queue(&mut lab, &host_b, cntlid_b, 8, 8192);
    assert_eq!(lab.resources(0).qpairs, 4);
    lab.fabric.inject_async_event(
        target_ip(),
        SimAsyncEvent {
            kind: SimAsyncEventKind::QpFatal,
            qp_num: Some(a.target_qp_num),
            cq_id: None,
        },
    );
    lab.until(20_000, |lab| lab.resources(0).qpairs == 3);
    let ev = next_event(&mut lab, &a.channel);
    assert_eq!(ev.kind, nvmf_common::rdma::CmEventKind::Disconnected);
    let c = b.run(&mut lab, read_cmd(1, 0, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    a.disconnect();
    b.disconnect();
    admin_a.disconnect();
    admin_b.disconnect();
    lab.assert_drained();
}

/// A fatal device event closes every qpair on the device; once they are gone the reactor
/// rebuilds the device's CQ, SRQ and buffers, and new connections work.
#[test]
fn a_fatal_device_event_closes_everything_and_the_device_is_rebuilt() {
    let mut lab = SimLab::new(9);
    let host = lab.fabric.add_host(host_ip(1));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let _io = io_queue(&mut lab, &host, cntlid, 8, 8192);
    lab.fabric.inject_async_event(
        target_ip(),
        SimAsyncEvent {
            kind: SimAsyncEventKind::DeviceFatal,
            qp_num: None,
            cq_id: None,
        },
    );
    lab.until(50_000, |lab| lab.resources(0).qpairs == 0);
    // A new controller on the rebuilt device.
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 8, 8192);
    let data = pattern(11, 4096);
    io.data.write_at(0, &data);
    let c = io.run(&mut lab, write_cmd(1, 40, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    let c = io.run(&mut lab, read_cmd(2, 40, 8), keyed(4096, 4096));
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(data_bytes(&io, 4096, 4096), data);
    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

/// Issue 12: the target's `max_qpairs` holds at the RDMA connect, before any Connect
/// command: a host opening connections and never sending Connect gets NO_RESOURCES past the
/// limit, and the connections it left idle are dropped after the no-Connect timeout, which
/// frees room again.
#[test]
fn max_qpairs_holds_at_the_rdma_connect_and_idle_connections_expire() {
    let mut lab = SimLab::new(10);
    lab.set_max_qpairs(3);
    let host = lab.fabric.add_host(host_ip(1));
    let mut idle = Vec::new();
    for qid in 0..3 {
        idle.push(HostQueue::connect(&mut lab, &host, qid, 8).expect("under the limit"));
    }
    match HostQueue::connect(&mut lab, &host, 0, 8) {
        Err(Refused::Rejected { nvmf_status, .. }) => {
            assert_eq!(nvmf_status, RdmaCmRejectStatus::NO_RESOURCES.0)
        }
        other => panic!("expected NO_RESOURCES, got {:?}", other.map(|_| ())),
    }
    // None of the three sends Connect: after the no-Connect timeout (10 s) they are gone.
    lab.run_for(Duration::from_secs(12), Duration::from_millis(100));
    assert_eq!(lab.resources(0).qpairs, 0);
    let (mut admin, _) = admin_queue(&mut lab, &host);
    admin.disconnect();
    drop(idle);
    lab.assert_drained();
}

/// Issue 14: a host sending one command at a time does not cost a receive doorbell per
/// command: consumed SRQ slots go back in batches, and the few held for a batch go back when
/// the reactor's timer ticks (or it goes idle), so the SRQ is whole again.
#[test]
fn receives_go_back_to_the_srq_in_batches_and_all_of_them_by_the_next_tick() {
    let mut lab = SimLab::new(12);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 4096);
    let (doorbells0, wrs0) = (
        device_stat(&mut lab, "recv_doorbell_updates"),
        device_stat(&mut lab, "total_recv_wrs"),
    );
    let commands = 64u16;
    let mut most_waiting = 0;
    for cid in 1..=commands {
        io.submit(read_cmd(cid, u64::from(cid) * 8, 8), keyed(0, 4096));
        let mut got = 0;
        lab.until(20_000, |lab| {
            got += io.poll().len();
            most_waiting = most_waiting.max(lab.resources(0).recv_slots_waiting);
            got == 1
        });
    }
    let doorbells = device_stat(&mut lab, "recv_doorbell_updates") - doorbells0;
    let wrs = device_stat(&mut lab, "total_recv_wrs") - wrs0;
    assert!(
        doorbells <= u64::from(commands) / 8,
        "{commands} commands one at a time took {doorbells} receive doorbells"
    );
    assert!(most_waiting < 32, "{most_waiting} slots held back");
    assert!(
        wrs + most_waiting as u64 >= u64::from(commands),
        "every consumed slot is posted again or waiting: {wrs} posted"
    );
    // The next tick posts the slots held back: nothing is missing from the SRQ.
    lab.run_for(Duration::from_millis(30), Duration::from_millis(1));
    let r = lab.resources(0);
    assert_eq!((r.recv_slots_waiting, r.recv_slots_held), (0, 0), "{r:?}");
    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

/// Issue 14: responses completed in one turn go out in one chain per qpair (one send
/// doorbell for many), and the counters SPDK's `nvmf_get_stats` shows count it.
#[test]
fn responses_of_a_turn_share_a_doorbell_and_the_counters_say_so() {
    let mut lab = SimLab::new(11);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 32 * 4096);
    // Settled: the Connect's SEND completion is in.
    lab.run_for(Duration::from_millis(1), Duration::from_micros(100));
    let (doorbells0, requests0, completions0) = (
        device_stat(&mut lab, "send_doorbell_updates"),
        device_stat(&mut lab, "requests"),
        device_stat(&mut lab, "completions"),
    );
    let rounds = 8u16;
    for round in 0..rounds {
        for i in 0..16u16 {
            let cid = round * 16 + i + 1;
            io.submit(
                read_cmd(cid, u64::from(i) * 8, 8),
                keyed(usize::from(i) * 4096, 4096),
            );
        }
        let mut got = 0;
        lab.until(20_000, |_| {
            got += io.poll().len();
            got == 16
        });
    }
    let doorbells = device_stat(&mut lab, "send_doorbell_updates") - doorbells0;
    let requests = device_stat(&mut lab, "requests") - requests0;
    assert_eq!(requests, u64::from(rounds) * 16);
    let per_doorbell = requests as f64 / doorbells as f64;
    assert!(
        per_doorbell >= 2.0,
        "{requests} responses took {doorbells} send doorbells"
    );
    // Only a chain's last SEND is signaled, if that: the target's completions are one
    // receive per command and at most one SEND per chain (a chain per doorbell; a deferred
    // chain has none), not one per response. Every request came back all the same (above)
    // and its slot is free (`assert_drained`). (The host saw the last response before the
    // target reaped that chain's completion.)
    lab.run_for(Duration::from_millis(1), Duration::from_micros(100));
    let completions = device_stat(&mut lab, "completions") - completions0;
    assert!(
        completions > requests && completions <= requests + doorbells,
        "{completions} completions for {requests} commands in {doorbells} chains"
    );
    assert!(
        device_stat(&mut lab, "total_send_wrs") >= 2 * requests,
        "RDMA WRITE + SEND each"
    );
    assert!(device_stat(&mut lab, "polls") >= device_stat(&mut lab, "idle_polls"));
    assert!(device_stat(&mut lab, "request_latency") > 0);
    assert!(device_stat(&mut lab, "recv_doorbell_updates") > 0);
    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

/// Issue 14: a response (a 16-byte CQE) goes inline in its SEND where the device takes inline
/// data, so the device never reads it from memory, and from the qpair's registered response
/// buffer where the device refuses inline data (the QP is made again without it). The host
/// gets the same completions, successes and errors, either way.
#[test]
fn responses_go_inline_where_the_device_allows_it_and_from_memory_where_not() {
    for device_inline in [DEFAULT_MAX_INLINE_DATA, 0] {
        let mut lab = SimLab::new(13);
        lab.verbs.set_max_inline_data(device_inline);
        let host = lab.fabric.add_host(host_ip(1));
        let (mut admin, cntlid) = admin_queue(&mut lab, &host);
        let mut io = io_queue(&mut lab, &host, cntlid, 32, 64 * 1024);
        let inline0 = lab.verbs.inline_send_wrs();

        let data = pattern(5, 8 * BLOCK);
        io.data.write_at(0, &data);
        let c = io.run(&mut lab, write_cmd(1, 16, 8), keyed(0, 4096));
        assert!(c.status().is_success(), "{c:?}");
        let c = io.run(&mut lab, read_cmd(2, 16, 8), keyed(8192, 4096));
        assert!(c.status().is_success(), "{c:?}");
        assert_eq!(data_bytes(&io, 8192, 4096), data);
        let c = io.run(&mut lab, read_cmd(3, u64::MAX - 1, 1), keyed(0, 512));
        assert_eq!(c.status(), Status::LBA_OUT_OF_RANGE.with_dnr(), "{c:?}");
        assert_eq!(c.cid.get(), 3);

        let inline = lab.verbs.inline_send_wrs() - inline0;
        let expected = if device_inline == 0 { 0 } else { 3 };
        assert_eq!(
            inline, expected,
            "inline SENDs of the target, device limit {device_inline}"
        );
        io.disconnect();
        admin.disconnect();
        lab.assert_drained();
    }
}

/// A post of a chain of several batched responses fails in the middle: the responses before
/// the failure complete, the one whose WRITE went holds its buffer, the rest are released,
/// the qpair closes, and nothing leaks.
#[test]
fn a_batched_chain_that_fails_half_way_leaks_nothing() {
    let mut lab = SimLab::new(12);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 32 * 4096);
    // Make the reads' responses complete in one turn, then fail the chain at its fourth WR.
    lab.fabric
        .fail_post_send(io.target_qp_num, 0, 3, 12 /* ENOMEM */);
    for i in 0..8u16 {
        io.submit(
            read_cmd(i + 1, u64::from(i) * 8, 8),
            keyed(usize::from(i) * 4096, 4096),
        );
    }
    lab.run_for(Duration::from_millis(100), Duration::from_millis(1));
    let _ = io.poll();
    drop(io);
    admin.disconnect();
    lab.assert_drained();
}

/// Issues 12 and 14: in-capsule writes execute from the buffer they arrived in (no copy, no
/// pool buffer), and the receive slot is posted again at once, so they neither wait behind a
/// pool another host pinned nor hold SRQ slots. An SGL offset inside the capsule takes the
/// copy path and lands the same bytes.
#[test]
fn in_capsule_writes_need_no_pool_buffer_and_hold_no_receive_slot() {
    let mut lab = SimLab::new(13);
    let host = lab.fabric.add_host(host_ip(1));
    let hostile = lab.fabric.add_host(host_ip(2));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let (mut hostile_admin, hostile_cntlid) = admin_queue(&mut lab, &hostile);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 32 * 4096);
    // The hostile host pins the whole small pool (256): 4 queues x 64 reads whose
    // responses wait in RNR.
    let mut pinning = Vec::new();
    for qid in 1..=4u16 {
        let q = stalled_io_queue(&mut lab, &hostile, hostile_cntlid, qid, 64, 64 * 4096);
        pinning.push(q);
    }
    for q in &mut pinning {
        for i in 0..64u16 {
            q.submit(read_cmd(i + 1, 0, 8), keyed(usize::from(i) * 4096, 4096));
        }
    }
    lab.run_for(Duration::from_millis(5), Duration::from_millis(1));
    assert!(
        lab.resources(0).buffers_out >= 256,
        "{:?}",
        lab.resources(0)
    );

    // In-capsule writes go through at once.
    for i in 0..8u16 {
        let data = pattern(i as u8, 4096);
        io.data.write_at(usize::from(i) * 4096, &data);
        let c = io.run(
            &mut lab,
            write_cmd(i + 1, 200 + u64::from(i) * 8, 8),
            Data::InCapsule {
                offset: usize::from(i) * 4096,
                len: 4096,
            },
        );
        assert!(
            c.status().is_success(),
            "in-capsule write {i} waited: {c:?}"
        );
        assert_eq!(lab.resources(0).recv_slots_held, 0);
    }
    // The pinning host lets go; everything reads back.
    for q in &mut pinning {
        q.repost = true;
        for slot in 0..usize::from(q.depth) {
            q.post_recv(slot);
        }
    }
    lab.run_for(Duration::from_millis(20), Duration::from_millis(1));
    for i in 0..8u16 {
        let c = io.run(
            &mut lab,
            read_cmd(100 + i, 200 + u64::from(i) * 8, 8),
            keyed(16 * 4096, 4096),
        );
        assert!(c.status().is_success());
        assert_eq!(data_bytes(&io, 16 * 4096, 4096), pattern(i as u8, 4096));
    }
    // An in-capsule SGL with an offset: the copy path.
    let mut cmd = write_cmd(200, 400, 1);
    let data = pattern(77, 512);
    io.data.write_at(0, &[0u8; 64]);
    io.data.write_at(64, &data);
    cmd.flags |= Command::FLAG_SGL;
    cmd.dptr = nvmf_common::spec::sgl::SglDescriptor::in_capsule(64, 512);
    // Build the capsule by hand: SQE, then 64 bytes of padding and the data.
    let mut capsule = zerocopy::IntoBytes::as_bytes(&cmd).to_vec();
    capsule.extend_from_slice(&[0u8; 64]);
    capsule.extend_from_slice(&data);
    io.write_capsule(0, &capsule);
    io.send_raw(0, capsule.len());
    let c = io.wait(&mut lab, 200);
    assert!(c.status().is_success(), "{c:?}");
    let c = io.run(&mut lab, read_cmd(201, 400, 1), keyed(0, 512));
    assert!(c.status().is_success());
    assert_eq!(data_bytes(&io, 0, 512), data);
    for q in &mut pinning {
        q.disconnect();
    }
    io.disconnect();
    admin.disconnect();
    hostile_admin.disconnect();
    lab.assert_drained();
}

/// Issue 12: the transfer timeout is set by `nvmf_set_config` (our extension
/// `transfer_timeout_ms`), reaches every reactor at its next tick, and cuts off a host that
/// never takes its responses after that time instead of the 30 s default.
#[test]
fn the_transfer_timeout_set_by_rpc_reaches_the_reactors() {
    use std::sync::atomic::Ordering;
    let mut lab = SimLab::new(14);
    lab.pgs[0]
        .core
        .info
        .qpair_limits
        .transfer_timeout_ms
        .store(2_000, Ordering::Relaxed);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut q = stalled_io_queue(&mut lab, &host, cntlid, 1, 8, 8 * 4096);
    q.submit(read_cmd(1, 0, 8), keyed(0, 4096));
    lab.run_for(Duration::from_millis(1_500), Duration::from_millis(50));
    assert_eq!(lab.resources(0).qpairs, 2, "closed before the timeout");
    lab.run_for(Duration::from_millis(1_000), Duration::from_millis(50));
    assert_eq!(lab.resources(0).qpairs, 1, "not closed after the timeout");
    drop(q);
    admin.disconnect();
    lab.assert_drained();
}

/// Idle connections cost a reactor's housekeeping tick nothing: 32 connected I/O queues that
/// carry no I/O are not looked at, tick after tick; a controller's keep-alive timer comes up
/// once per KATO, not once per tick. And the tick still does its work: the controller whose
/// host goes silent fails at its deadline and every one of its queues is closed and freed.
#[test]
fn idle_connections_cost_the_housekeeping_tick_nothing() {
    let mut lab = SimLab::new(8);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut queues: Vec<HostQueue> = (1..=32)
        .map(|qid| io_queue_qid(&mut lab, &host, cntlid, qid, 16, 8192))
        .collect();
    for q in &mut queues {
        let c = q.run(&mut lab, read_cmd(1, 0, 8), keyed(0, 4096));
        assert!(c.status().is_success(), "{c:?}");
    }
    // The ticks after the I/O find the queues idle and drop them from the watch list.
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));
    let before = lab.housekeeping(0);
    // Two seconds: two hundred ticks, over 33 idle qpairs and one controller (KATO 30 s).
    lab.run_for(Duration::from_secs(2), Duration::from_millis(1));
    let idle = lab.housekeeping(0);
    assert_eq!(
        idle.qpairs_checked, before.qpairs_checked,
        "idle qpairs looked at: {before:?} -> {idle:?}"
    );
    assert_eq!(idle.controllers_checked, before.controllers_checked);
    assert_eq!(lab.resources(0).qpairs, 33);

    // Keep-alives every 10 s for 60 s: the controller lives, and its timer came up about
    // once per KATO (30 s), not on each of the 6,000 ticks.
    for n in 0..6u16 {
        lab.run_for(Duration::from_secs(10), Duration::from_millis(10));
        let c = admin.run(&mut lab, Command::keep_alive(100 + n), Data::None);
        assert!(c.status().is_success(), "{c:?}");
    }
    let alive = lab.housekeeping(0);
    let timer_checks = alive.controllers_checked - idle.controllers_checked;
    assert!((1..=3).contains(&timer_checks), "{idle:?} -> {alive:?}");
    // Only the admin queue (its keep-alive responses) was looked at, once per command.
    assert!(
        alive.qpairs_checked - idle.qpairs_checked <= 6,
        "{idle:?} -> {alive:?}"
    );
    assert_eq!(lab.resources(0).qpairs, 33);

    // Silence: the deadline passes, the controller fails, and every one of its queues goes.
    let failure_walks = alive.failure_walks;
    lab.until(20_000, |lab| {
        lab.fabric.advance(Duration::from_millis(10));
        lab.turn();
        lab.resources(0).qpairs == 0
    });
    assert!(lab.housekeeping(0).failure_walks > failure_walks);
    drop(queues);
    admin.disconnect();
    lab.assert_drained();
}

/// An idle reactor arms its shared CQ before it sleeps: the next capsule signals the
/// completion channel (what wakes a sleeping reactor), a completion while not armed does
/// not, and a qpair with a transfer in flight bounds the sleep to the housekeeping tick.
/// Waking costs one read of the channel, and only when the CQ signalled: a CQ that did not
/// fire (the reactor woke for a message or its timer) stays armed, and the next sleep does
/// not arm it again.
#[test]
fn an_idle_reactor_arms_its_cq_and_the_next_capsule_signals_it() {
    let mut lab = SimLab::new(21);
    let host = lab.fabric.add_host(host_ip(1));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let mut q = io_queue(&mut lab, &host, cntlid, 16, 8192);
    let c = q.run(&mut lab, read_cmd(1, 0, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));

    let mut sleeper = Sleeper::new().unwrap();
    let arms = lab.fabric.stats().cq_arms;
    let bound = lab.pgs[0].prepare_sleep(&sleeper.wait_set());
    assert_eq!(bound, Some(Duration::from_millis(IDLE_SLEEP_MAX_MS)));
    assert_eq!(lab.fabric.stats().cq_arms, arms + 1);
    assert!(
        !sleeper.wait(Duration::ZERO).unwrap(),
        "nothing happened yet"
    );
    // Woken without the CQ (a timer): it stays armed, and the next sleep does not arm it.
    assert_eq!(sleeper.ready().len(), 0);
    lab.pgs[0].woken(sleeper.ready());
    assert!(lab.pgs[0].prepare_sleep(&sleeper.wait_set()).is_some());
    assert_eq!(lab.fabric.stats().cq_arms, arms + 1, "armed twice");

    // The host sends a command; the fabric delivers it into the target's CQ.
    q.submit(read_cmd(2, 0, 8), keyed(0, 4096));
    lab.fabric.advance(Duration::from_millis(1));
    assert!(
        sleeper.wait(Duration::from_secs(5)).unwrap(),
        "the capsule must signal the armed CQ's channel"
    );
    assert_eq!(sleeper.ready().len(), 1, "the CQ's channel signalled");
    lab.pgs[0].woken(sleeper.ready());
    let c = q.wait(&mut lab, 2);
    assert!(c.status().is_success(), "{c:?}");

    // Not armed: completions raise nothing (the reactor is polling, it needs no event).
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));
    q.submit(read_cmd(3, 0, 8), keyed(0, 4096));
    lab.fabric.advance(Duration::from_millis(1));
    assert!(!sleeper.wait(Duration::ZERO).unwrap());
    let c = q.wait(&mut lab, 3);
    assert!(c.status().is_success(), "{c:?}");

    // The event was taken: the next sleep arms the CQ again, and the next capsule wakes it.
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));
    assert!(lab.pgs[0].prepare_sleep(&sleeper.wait_set()).is_some());
    assert_eq!(lab.fabric.stats().cq_arms, arms + 2);
    q.submit(read_cmd(5, 0, 8), keyed(0, 4096));
    lab.fabric.advance(Duration::from_millis(1));
    assert!(sleeper.wait(Duration::from_secs(5)).unwrap());
    assert_eq!(sleeper.ready().len(), 1);
    lab.pgs[0].woken(sleeper.ready());
    let c = q.wait(&mut lab, 5);
    assert!(c.status().is_success(), "{c:?}");

    // A host that takes no responses: its qpair is watched, and the sleep ends at the tick
    // that would cut it off.
    let mut stalled = stalled_io_queue(&mut lab, &host, cntlid, 2, 16, 8192);
    stalled.submit(read_cmd(4, 0, 8), keyed(0, 4096));
    lab.turns(50);
    assert_eq!(
        lab.pgs[0].prepare_sleep(&sleeper.wait_set()),
        Some(Duration::from_millis(TICK_MS))
    );
    lab.pgs[0].woken(sleeper.ready());
}

/// A host that takes no responses and sends in-capsule data with commands the target refuses
/// (LBA out of range) must not hold the device's capsule buffers, the receives every host's
/// commands arrive in: a refused command gives its capsule back at once, not when its
/// response (stuck in RNR) completes. Another host's in-capsule writes go on.
#[test]
fn refused_in_capsule_commands_of_a_host_that_takes_no_responses_hold_no_capsule() {
    let mut lab = SimLab::new(17);
    let host = lab.fabric.add_host(host_ip(1));
    let hostile = lab.fabric.add_host(host_ip(2));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let (mut hostile_admin, hostile_cntlid) = admin_queue(&mut lab, &hostile);
    let mut stalled = stalled_io_queue(&mut lab, &hostile, hostile_cntlid, 1, 64, 64 * 4096);
    for i in 0..63u16 {
        stalled.submit(
            write_cmd(i + 1, u64::MAX / 2, 8),
            Data::InCapsule {
                offset: usize::from(i) * 4096,
                len: 4096,
            },
        );
    }
    lab.run_for(Duration::from_millis(20), Duration::from_millis(1));
    let r = lab.resources(0);
    assert!(r.requests_in_use > 0, "the refusals wait in RNR: {r:?}");
    // (The Connect's data buffer, its response deferred, waits behind the refusals.)
    assert_eq!(
        r.buffers_out - r.deferred_buffers,
        0,
        "capsules held by refused commands: {r:?}"
    );
    assert_eq!(r.recv_slots_held, 0, "{r:?}");

    let mut io = io_queue(&mut lab, &host, cntlid, 16, 16 * 4096);
    for i in 0..8u16 {
        io.data
            .write_at(usize::from(i) * 4096, &pattern(i as u8, 4096));
        let c = io.run(
            &mut lab,
            write_cmd(i + 1, u64::from(i) * 8, 8),
            Data::InCapsule {
                offset: usize::from(i) * 4096,
                len: 4096,
            },
        );
        assert!(c.status().is_success(), "{c:?}");
    }
    drop(stalled);
    io.disconnect();
    admin.disconnect();
    hostile_admin.disconnect();
    lab.assert_drained();
}

/// A write's response carries no data: its buffer (a pool buffer filled by an RDMA READ, or
/// the capsule buffer it executed from) goes back when the response is queued. A host that
/// writes and then takes no responses holds its request slots, stuck in RNR, but no data
/// buffer and no receive slot, so it cannot drain the pools every host shares.
#[test]
fn writes_of_a_host_that_takes_no_responses_hold_no_data_buffer() {
    let mut lab = SimLab::new(23);
    let host = lab.fabric.add_host(host_ip(1));
    let hostile = lab.fabric.add_host(host_ip(2));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let (mut hostile_admin, hostile_cntlid) = admin_queue(&mut lab, &hostile);
    let mut stalled = stalled_io_queue(&mut lab, &hostile, hostile_cntlid, 1, 64, 64 * 4096);
    // Keyed writes first: their READs complete before the first response is stuck in RNR
    // (which stalls everything posted after it on that queue). Then in-capsule ones.
    for i in 0..8u16 {
        stalled.submit(
            write_cmd(i + 1, u64::from(i) * 8, 8),
            keyed(usize::from(i) * 4096, 4096),
        );
    }
    lab.run_for(Duration::from_millis(5), Duration::from_millis(1));
    for i in 8..56u16 {
        stalled.submit(
            write_cmd(i + 1, u64::from(i) * 8, 8),
            Data::InCapsule {
                offset: usize::from(i) * 4096,
                len: 4096,
            },
        );
    }
    lab.run_for(Duration::from_millis(20), Duration::from_millis(1));
    let r = lab.resources(0);
    assert!(
        r.requests_in_use + r.requests_deferred >= 56,
        "the responses wait in RNR: {r:?}"
    );
    assert_eq!(
        r.buffers_out, 0,
        "data buffers held by answered writes: {r:?}"
    );
    assert_eq!(r.recv_slots_held, 0, "{r:?}");

    let mut io = io_queue(&mut lab, &host, cntlid, 16, 16 * 4096);
    let data = pattern(9, 4096);
    io.data.write_at(0, &data);
    let c = io.run(&mut lab, write_cmd(1, 4000, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    let c = io.run(&mut lab, read_cmd(2, 4000, 8), keyed(4096, 4096));
    assert!(c.status().is_success(), "{c:?}");
    let mut back = vec![0; 4096];
    io.data.read_at(4096, &mut back);
    assert_eq!(back, data);
    drop(stalled);
    io.disconnect();
    admin.disconnect();
    hostile_admin.disconnect();
    lab.assert_drained();
}

/// A burst of connect requests, all read by the acceptor before any reactor ran, cannot
/// pass `max_qpairs` together: each counts against the limit from the moment it is handed
/// to a reactor. The refused ones leave nothing behind in the acceptor either.
#[test]
fn a_burst_of_connects_cannot_pass_max_qpairs_together() {
    let mut lab = SimLab::new(13);
    lab.set_max_qpairs(3);
    let host = lab.fabric.add_host(host_ip(1));
    let pending: Vec<PendingConnect> = (0..6)
        .map(|_| HostQueue::prepare_connect(&mut lab, &host, 0, 8))
        .collect();
    for p in &pending {
        p.send(&lab);
    }
    // The reactor is busy while the acceptor reads all six requests.
    let mut read = 0;
    for _ in 0..1000 {
        lab.fabric.step();
        read += lab.transport.acceptor_turn(Duration::ZERO);
        if read == 6 {
            break;
        }
    }
    assert_eq!(read, 6, "the acceptor did not get the burst");
    let mut accepted = Vec::new();
    let mut refused = 0;
    for p in pending {
        match p.established(&mut lab) {
            Ok(q) => accepted.push(q),
            Err(Refused::Rejected { nvmf_status, .. }) => {
                assert_eq!(nvmf_status, RdmaCmRejectStatus::NO_RESOURCES.0);
                refused += 1;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!((accepted.len(), refused), (3, 3));
    assert_eq!(lab.resources(0).qpairs, 3);
    lab.turns(10);
    assert_eq!(
        lab.transport.connections_tracked(),
        3,
        "the acceptor remembers refused connections"
    );
    for mut q in accepted {
        q.disconnect();
    }
    lab.assert_drained();
}

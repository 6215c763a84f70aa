//! Commands that arrive before the completions that free their slots, on the simulated RDMA
//! fabric. A host may send its next command as soon as it has seen our response, and the
//! completion of our SEND (which frees the response's request slot) may come later: on
//! soft-RoCE a requester's completions and its peer's new requests are handled by separate
//! tasks. The lab found it (`nvmf-perf -P 2 -q 8` lost a queue to "queue overrun"). Such a
//! command waits for a slot; only a host with more commands unanswered than its queue holds
//! loses the queue.

use std::time::Duration;

use nvmf_common::rdma::VerbsQp;
use nvmf_common::spec::Status;
use nvmf_tests::sim::*;

const BLOCK: usize = 4096;

/// A host that keeps its whole queue busy while every response it sends (the ACKs of our
/// SENDs and RDMA WRITEs) reaches us late: its commands outrun the completions that free
/// their slots, wait, and every one of them completes with the right data.
#[test]
fn commands_that_outrun_the_completions_freeing_their_slots_wait_and_all_complete() {
    let mut lab = SimLab::new(71);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let depth = 8u16;
    let mut io = io_queue(&mut lab, &host, cntlid, depth, 512 * BLOCK);
    // Blocks 0..64 with known data, written in place at queue depth 1.
    for b in 0..64u16 {
        let off = usize::from(b) * BLOCK;
        io.data.write_at(off, &pattern(b as u8, BLOCK));
        let c = io.run(
            &mut lab,
            write_cmd(b + 1, u64::from(b) * 8, 8),
            keyed(off, 4096),
        );
        assert!(c.status().is_success(), "{c:?}");
    }
    // From here on the host's ACKs take 300 us; a round trip takes a few.
    lab.fabric
        .faults()
        .late_responses(io.qp.qp_num(), Duration::from_micros(300));

    // Reads of those blocks, the whole queue busy: a new one as each response comes in.
    let total = 600u16;
    let block_of = |cid: u16| cid % 64;
    let offset_of = |cid: u16| (64 + usize::from(cid % 448)) * BLOCK;
    let submit = |io: &mut HostQueue, cid: u16| {
        io.submit(
            read_cmd(cid, u64::from(block_of(cid)) * 8, 8),
            keyed(offset_of(cid), 4096),
        );
    };
    let mut next = 1000u16;
    for _ in 0..depth {
        submit(&mut io, next);
        next += 1;
    }
    let (mut done, mut most_waiting) = (0u16, 0usize);
    lab.until(400_000, |lab| {
        for c in io.poll() {
            let cid = c.cid.get();
            assert!(c.status().is_success(), "command {cid}: {c:?}");
            assert_eq!(
                data_bytes(&io, offset_of(cid), BLOCK),
                pattern(block_of(cid) as u8, BLOCK),
                "command {cid} read the wrong bytes"
            );
            done += 1;
            if next < 1000 + total {
                submit(&mut io, next);
                next += 1;
            }
        }
        let r = lab.resources(0);
        assert_eq!(r.qpairs, 2, "the queue was closed after {done} commands");
        most_waiting = most_waiting.max(r.backlog);
        done == total
    });
    // Proof that the test makes commands wait at all: without it it would prove nothing.
    assert!(
        most_waiting > 0,
        "no command ever found its qpair without a free slot"
    );
    assert!(
        most_waiting <= usize::from(depth),
        "{most_waiting} commands waited, more than the host's queue holds"
    );
    // `nvmf_get_stats` counts them, in SPDK's name.
    let waited = device_stat(&mut lab, "pending_free_request");
    assert!(
        waited >= most_waiting as u64,
        "{waited} counted, {most_waiting} seen waiting at once"
    );
    assert!(io.send_errors.is_empty(), "{:?}", io.send_errors);
    lab.fabric
        .faults()
        .late_responses(io.qp.qp_num(), Duration::ZERO);
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));
    assert_eq!(lab.resources(0).backlog, 0);
    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

/// A host that takes no responses (they wait in RNR) and keeps sending in-capsule writes:
/// its first two queues' worth fill every request slot, a third waits holding its capsule
/// buffers, and one more command is past its queue: the queue is closed and every capsule
/// comes back. Another host's in-capsule writes go on throughout.
#[test]
fn a_host_past_its_queue_loses_it_and_the_capsules_of_its_waiting_commands_come_back() {
    let mut lab = SimLab::new(72);
    let good_host = lab.fabric.add_host(host_ip(1));
    let bad_host = lab.fabric.add_host(host_ip(2));
    let (mut admin, cntlid) = admin_queue(&mut lab, &good_host);
    let (mut bad_admin, bad_cntlid) = admin_queue(&mut lab, &bad_host);
    let depth = 8u16;
    let mut bad = stalled_io_queue(&mut lab, &bad_host, bad_cntlid, 1, depth, 64 * BLOCK);
    let mut good = io_queue(&mut lab, &good_host, cntlid, 16, 16 * BLOCK);
    let good_write = |lab: &mut SimLab, good: &mut HostQueue, i: u16| {
        let off = usize::from(i % 16) * BLOCK;
        good.data.write_at(off, &pattern(i as u8, BLOCK));
        let c = good.run(
            lab,
            write_cmd(i + 1, 512 + u64::from(i) * 8, 8),
            Data::InCapsule {
                offset: off,
                len: 4096,
            },
        );
        assert!(c.status().is_success(), "the good host's write {i}: {c:?}");
    };
    let mut cid = 1u16;
    let mut send_queue = |lab: &mut SimLab, bad: &mut HostQueue, n: u16| {
        for _ in 0..n {
            bad.submit(
                write_cmd(cid, u64::from(cid) * 8, 8),
                Data::InCapsule {
                    offset: usize::from(cid % 64) * BLOCK,
                    len: 4096,
                },
            );
            cid += 1;
        }
        lab.run_for(Duration::from_millis(5), Duration::from_micros(100));
    };
    // Two queues' worth: each answered (stuck in RNR), so the host is within its queue,
    // and every slot (twice the depth) is taken by a response on the wire, the Connect's
    // deferred one among them: the last command waits.
    send_queue(&mut lab, &mut bad, depth);
    send_queue(&mut lab, &mut bad, depth);
    let before = lab.resources(0);
    assert!(before.backlog <= 1, "{before:?}");
    // Up to a whole queue unanswered: they wait for slots that free only when the host
    // receives, holding their capsule buffers.
    send_queue(&mut lab, &mut bad, depth - before.backlog as u16);
    let r = lab.resources(0);
    assert_eq!(r.qpairs, 4, "a host within its queue lost it: {r:?}");
    assert_eq!(r.backlog, usize::from(depth), "{r:?}");
    assert_eq!(
        r.buffers_out - before.buffers_out,
        r.backlog - before.backlog,
        "the waiting commands' capsules: {r:?}"
    );
    for i in 0..4 {
        good_write(&mut lab, &mut good, i);
    }
    // One more is past the host's queue: its queue goes, the capsules with it.
    send_queue(&mut lab, &mut bad, 1);
    assert!(lab.run_until_qpairs(3, 200), "{:?}", lab.resources(0));
    let r = lab.resources(0);
    assert_eq!(r.backlog, 0, "{r:?}");
    for i in 4..8 {
        good_write(&mut lab, &mut good, i);
    }
    drop(bad);
    good.disconnect();
    admin.disconnect();
    bad_admin.disconnect();
    lab.assert_drained();
}

/// Hosts that take no responses fill their request slots, then send a queue's worth more
/// in-capsule writes each, which wait for a slot. Only a quarter of the SRQ's capsule buffers
/// may wait so (the device's cap): the writes past it lose their data and, once the hosts
/// receive again, are answered Command Interrupted, which the host retries; they wrote
/// nothing. Every other write completes with its data in place.
#[test]
fn waiting_in_capsule_writes_past_the_capsule_cap_are_answered_command_interrupted() {
    let mut lab = SimLab::new(73);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let depth = 32u16;
    let queues = 4u16;
    let mut stalled: Vec<HostQueue> = (1..=queues)
        .map(|qid| {
            stalled_io_queue(
                &mut lab,
                &host,
                cntlid,
                qid,
                depth,
                usize::from(depth) * BLOCK,
            )
        })
        .collect();
    // Queue q's command i writes 4 KiB at slot q * 3 * depth + i (of 512 in the 2 MiB
    // namespace) with its own pattern.
    let lba = |q: usize, cid: u16| (q as u64 * 3 * u64::from(depth) + u64::from(cid)) * 8;
    let seed = |q: usize, cid: u16| (q * 131 + usize::from(cid)) as u8;
    let mut sent = vec![0u16; stalled.len()];
    let mut send = |lab: &mut SimLab, q: usize, io: &mut HostQueue, n: u16| {
        for _ in 0..n {
            let cid = sent[q];
            let off = usize::from(cid % depth) * BLOCK;
            io.data.write_at(off, &pattern(seed(q, cid), BLOCK));
            let data = Data::InCapsule {
                offset: off,
                len: 4096,
            };
            io.submit(write_cmd(cid, lba(q, cid), 8), data);
            sent[q] += 1;
            lab.run_for(Duration::from_micros(200), Duration::from_micros(100));
        }
        lab.run_for(Duration::from_millis(5), Duration::from_micros(100));
    };
    for (q, io) in stalled.iter_mut().enumerate() {
        send(&mut lab, q, io, 2 * depth);
    }
    for (q, io) in stalled.iter_mut().enumerate() {
        send(&mut lab, q, io, depth - 1);
    }
    // Nothing else holds a buffer: the waiting writes' capsules are all that is out.
    let r = lab.resources(0);
    let (waiting, holding) = (r.backlog, r.buffers_out);
    assert_eq!(
        r.qpairs,
        1 + usize::from(queues),
        "a host within its queue lost it: {r:?}"
    );
    assert!(waiting > 64, "the writes did not wait past the cap: {r:?}");
    assert_eq!(holding, 64, "a quarter of the 256-deep SRQ may wait: {r:?}");

    // The hosts receive again: every command is answered.
    let mut done: Vec<Vec<_>> = vec![Vec::new(); stalled.len()];
    for io in &mut stalled {
        io.repost = true;
        io.post_missing_receives();
    }
    lab.until(200_000, |_| {
        for (q, io) in stalled.iter_mut().enumerate() {
            done[q].extend(io.poll());
        }
        done.iter()
            .zip(&sent)
            .all(|(d, &n)| d.len() == usize::from(n))
    });
    let mut interrupted = Vec::new();
    for (q, completions) in done.iter().enumerate() {
        for c in completions {
            let cid = c.cid.get();
            if c.status() == Status::COMMAND_INTERRUPTED {
                interrupted.push((q, cid));
            } else {
                assert!(c.status().is_success(), "queue {q}: {c:?}");
            }
        }
    }
    assert_eq!(interrupted.len(), waiting - holding, "{interrupted:?}");
    // What each write left on the namespace: its pattern, or nothing if it was interrupted.
    let mut reader = io_queue_qid(&mut lab, &host, cntlid, queues + 1, 8, BLOCK);
    for (q, &n) in sent.iter().enumerate() {
        for cid in 0..n {
            let c = reader.run(&mut lab, read_cmd(0x100, lba(q, cid), 8), keyed(0, 4096));
            assert!(c.status().is_success(), "{c:?}");
            let want = if interrupted.contains(&(q, cid)) {
                vec![0; BLOCK]
            } else {
                pattern(seed(q, cid), BLOCK)
            };
            assert!(data_bytes(&reader, 0, BLOCK) == want, "queue {q} cid {cid}");
        }
    }
    reader.disconnect();
    for mut io in stalled {
        io.disconnect();
    }
    admin.disconnect();
    lab.assert_drained();
}

//! Deferred responses on the simulated RDMA fabric: a turn that posts to few qpairs leaves a
//! chain's last SEND unsignaled, and a later SEND's completion frees it. These tests hold
//! the gain (at queue depth 1 a response costs no completion of its own), the bounds (per
//! qpair, and the device's budget of small buffers), and the hostile host that stops
//! receiving behind deferred responses.

use std::time::Duration;

use nvmf_common::spec::command::Command;
use nvmf_tests::sim::*;

/// At queue depth 1 almost every response is deferred: the device sees one completion per
/// command (its receive), not two, and the data is what was written.
#[test]
fn at_queue_depth_one_responses_take_no_completion_of_their_own() {
    let (mut lab, mut admin, mut io, budget) = one_host(61, 64 * 4096);
    for i in 0..32u16 {
        let off = usize::from(i) * 4096;
        io.data.write_at(off, &pattern(i as u8, 4096));
        let c = io.run(
            &mut lab,
            write_cmd(i + 1, u64::from(i) * 8, 8),
            keyed(off, 4096),
        );
        assert!(c.status().is_success(), "{c:?}");
    }
    let completions = device_stat(&mut lab, "completions");
    let requests = device_stat(&mut lab, "requests");
    for i in 0..64u16 {
        let block = i % 32;
        let off = 32 * 4096 + usize::from(block) * 4096;
        let c = io.run(
            &mut lab,
            read_cmd(100 + i, u64::from(block) * 8, 8),
            keyed(off, 4096),
        );
        assert!(c.status().is_success(), "{c:?}");
        assert_eq!(
            data_bytes(&io, off, 4096),
            pattern(block as u8, 4096),
            "read {i}"
        );
    }
    let completions = device_stat(&mut lab, "completions") - completions;
    let requests = device_stat(&mut lab, "requests") - requests;
    assert_eq!(requests, 64);
    // 64 receives, and a signaled SEND for every 16 deferred ones: not 64 SEND completions.
    assert!(
        (64..=72).contains(&completions),
        "{completions} completions for {requests} reads at queue depth 1"
    );
    let r = lab.resources(0);
    assert!(
        (1..=16).contains(&r.requests_deferred),
        "deferred responses past the per-qpair bound: {r:?}"
    );
    assert_eq!(r.requests_in_use, 0, "{r:?}");
    // The deferred reads hold their small buffers, within the budget.
    assert_eq!(r.buffers_out as u32, budget - r.deferral_budget, "{r:?}");
    io.disconnect();
    admin.disconnect();
    assert_drained_with_budget(&mut lab, budget);
}

/// A lab with one host: its admin queue, an I/O queue of depth 32 with `data_len` bytes of
/// data buffer, and the device's whole deferral budget (read before the I/O queue exists).
fn one_host(seed: u64, data_len: usize) -> (SimLab, HostQueue, HostQueue, u32) {
    one_host_of_depth(seed, 32, data_len)
}

/// [`one_host`] with an I/O queue of `depth`.
fn one_host_of_depth(
    seed: u64,
    depth: u16,
    data_len: usize,
) -> (SimLab, HostQueue, HostQueue, u32) {
    let mut lab = SimLab::new(seed);
    let host = lab.fabric.add_host(host_ip(1));
    let (admin, cntlid) = admin_queue(&mut lab, &host);
    let budget = device_budget(&mut lab);
    let io = io_queue(&mut lab, &host, cntlid, depth, data_len);
    (lab, admin, io, budget)
}

/// Every qpair gone, nothing held, and the whole deferral budget back.
fn assert_drained_with_budget(lab: &mut SimLab, budget: u32) {
    lab.assert_drained();
    assert_eq!(
        lab.resources(0).deferral_budget,
        budget,
        "budget not given back"
    );
}

/// The deferral budget of reactor 0's device, whole (the device exists once a host
/// connected). At rest every buffer out is a deferred response's, taken from the budget.
fn device_budget(lab: &mut SimLab) -> u32 {
    lab.run_for(Duration::from_millis(1), Duration::from_micros(100));
    let r = lab.resources(0);
    assert_eq!(r.requests_in_use, 0, "{r:?}");
    assert!(r.deferral_budget > 0, "{r:?}");
    r.deferral_budget + r.buffers_out as u32
}

/// Hosts that read at queue depth 1 and then go idle leave deferred responses behind: the
/// small buffers those hold never exceed the device's budget, whatever the number of
/// qpairs, and a host that comes later is served. Every buffer and the whole budget come
/// back when the hosts go.
#[test]
fn idle_hosts_hold_no_more_small_buffers_than_the_deferral_budget() {
    let mut lab = SimLab::new(62);
    let first = lab.fabric.add_host(host_ip(9));
    let (mut first_admin, _) = admin_queue(&mut lab, &first);
    let budget = device_budget(&mut lab) as usize;
    let mut hosts = Vec::new();
    // Enough qpairs that 15 deferred reads each would be far past the budget.
    let n = budget / 15 + 3;
    for h in 0..n {
        let host = lab.fabric.add_host(host_ip(10 + h as u8));
        let (admin, cntlid) = admin_queue(&mut lab, &host);
        let mut io = io_queue(&mut lab, &host, cntlid, 32, 16 * 4096);
        for i in 0..15u16 {
            let c = io.run(
                &mut lab,
                read_cmd(i + 1, u64::from(i) * 8, 8),
                keyed(0, 4096),
            );
            assert!(c.status().is_success(), "{c:?}");
        }
        let r = lab.resources(0);
        assert!(r.deferred_buffers <= budget, "host {h}: {r:?}");
        hosts.push((admin, io));
    }
    lab.turns(100);
    let r = lab.resources(0);
    // At rest every buffer out is a deferred response's, taken from the budget; hosts
    // enough to take it all over and again took nearly all of it.
    assert_eq!(r.buffers_out + r.deferral_budget as usize, budget, "{r:?}");
    assert!(r.buffers_out >= budget - 2, "{r:?}");
    assert!(r.requests_deferred >= r.buffers_out, "{r:?}");

    // A later host's reads are answered, buffers or not.
    let late = lab.fabric.add_host(host_ip(200));
    let (mut admin, cntlid) = admin_queue(&mut lab, &late);
    let mut io = io_queue(&mut lab, &late, cntlid, 32, 32 * 128 * 1024);
    for i in 0..32u16 {
        io.submit(
            read_cmd(i + 1, 0, 256),
            keyed(usize::from(i) * 128 * 1024, 128 * 1024),
        );
    }
    let mut answered = 0;
    lab.until(20_000, |_| {
        answered += io.poll().iter().filter(|c| c.status().is_success()).count();
        answered == 32
    });
    assert_eq!(answered, 32);
    io.disconnect();
    admin.disconnect();
    for (mut admin, mut io) in hosts {
        io.disconnect();
        admin.disconnect();
    }
    first_admin.disconnect();
    assert_drained_with_budget(&mut lab, budget as u32);
}

/// A host that takes no more responses after Connect, and sends reads one at a time: each
/// response waits in RNR, unsignaled, with no completion to time it. The cover posted
/// at the next tick waits behind them, signaled, and so do the responses past the per-qpair
/// bound: the transfer timeout cuts the queue. Another host's reads go on, and nothing
/// leaks.
#[test]
fn a_host_that_stops_receiving_behind_deferred_responses_is_cut_off() {
    let mut lab = SimLab::new(63);
    let bad = lab.fabric.add_host(host_ip(1));
    let good = lab.fabric.add_host(host_ip(2));
    let (mut admin_bad, cntlid_bad) = admin_queue(&mut lab, &bad);
    let (mut admin_good, cntlid_good) = admin_queue(&mut lab, &good);
    let mut stalled = stalled_io_queue(&mut lab, &bad, cntlid_bad, 1, 32, 32 * 4096);
    let mut io = io_queue(&mut lab, &good, cntlid_good, 16, 4096);
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));
    // The other queues' deferred responses (the good queue's Connect), counted apart.
    let others = lab.resources(0).requests_deferred;
    for i in 0..40u16 {
        stalled.submit(
            read_cmd(i + 1, 0, 8),
            keyed(usize::from(i % 32) * 4096, 4096),
        );
        lab.run_for(Duration::from_millis(2), Duration::from_millis(1));
        // At most the deferred ones a stuck cover covers, and as many again uncovered.
        let r = lab.resources(0);
        assert!(r.requests_deferred - others <= 32, "after read {i}: {r:?}");
    }
    let r = lab.resources(0);
    assert!(r.requests_in_use > 0, "signaled responses wait: {r:?}");
    // 35 s of virtual time, both controllers kept alive: the transfer timeout (30 s)
    // closes the stalled queue at its signaled response.
    for n in 0..7u16 {
        lab.run_for(Duration::from_secs(5), Duration::from_millis(100));
        for q in [&mut admin_bad, &mut admin_good] {
            let c = q.run(&mut lab, Command::keep_alive(500 + n), Data::None);
            assert!(c.status().is_success(), "{c:?}");
        }
        let c = io.run(&mut lab, read_cmd(600 + n, 8, 8), keyed(0, 4096));
        assert!(c.status().is_success(), "the good host starved: {c:?}");
    }
    let r = lab.resources(0);
    assert_eq!(r.qpairs, 3, "stalled queue still open: {r:?}");
    drop(stalled);
    io.disconnect();
    admin_bad.disconnect();
    admin_good.disconnect();
    lab.assert_drained();
}

/// Deferred responses on a qpair whose next post fails (its RDMA WRITE went, its SEND did
/// not): the qpair closes, the deferred ones end with it, and no request, buffer or budget
/// is lost; the host's earlier reads got their data.
#[test]
fn deferred_responses_of_a_qpair_whose_post_fails_leak_nothing() {
    let (mut lab, mut admin, mut io, budget) = one_host(64, 32 * 4096);
    let before = lab.resources(0).requests_deferred;
    for i in 0..5u16 {
        let c = io.run(
            &mut lab,
            read_cmd(i + 1, 0, 8),
            keyed(usize::from(i) * 4096, 4096),
        );
        assert!(c.status().is_success(), "{c:?}");
    }
    let r = lab.resources(0);
    assert!(r.requests_deferred >= before + 5, "{r:?}");
    lab.fabric
        .fail_post_send(io.target_qp_num, 0, 1, 12 /* ENOMEM */);
    io.submit(read_cmd(6, 0, 8), keyed(5 * 4096, 4096));
    lab.run_for(Duration::from_millis(100), Duration::from_millis(1));
    let _ = io.poll();
    assert!(io.send_errors.is_empty(), "{:?}", io.send_errors);
    for i in 0..5 {
        assert!(
            data_bytes(&io, i * 4096, 4096).iter().all(|&x| x == 0),
            "read {i}"
        );
    }
    drop(io);
    admin.disconnect();
    assert_drained_with_budget(&mut lab, budget);
}

/// A host that reads once and goes idle: its deferred response is covered at the next
/// ticks (a zero-length RDMA WRITE, signaled), so its slot, buffer and budget come back
/// while the host stays connected, and the qpair leaves the watch list.
#[test]
fn an_idle_qpair_s_deferred_responses_are_covered_within_ticks() {
    let (mut lab, mut admin, mut io, budget) = one_host(65, 4096);
    lab.run_for(Duration::from_millis(50), Duration::from_millis(1));
    assert_eq!(lab.resources(0).requests_deferred, 0, "Connect not covered");
    let wrs = device_stat(&mut lab, "total_send_wrs");
    let c = io.run(&mut lab, read_cmd(1, 0, 8), keyed(0, 4096));
    assert!(c.status().is_success(), "{c:?}");
    let r = lab.resources(0);
    assert_eq!((r.requests_deferred, r.deferred_buffers), (1, 1), "{r:?}");
    assert_eq!(r.deferral_budget, budget - 1, "{r:?}");
    let checked = lab.housekeeping(0).qpairs_checked;
    lab.run_for(Duration::from_millis(30), Duration::from_millis(1));
    let r = lab.resources(0);
    assert_eq!(
        r.requests_deferred + r.buffers_out + r.requests_in_use,
        0,
        "{r:?}"
    );
    assert_eq!(r.deferral_budget, budget, "{r:?}");
    // RDMA WRITE + SEND, then the cover.
    assert_eq!(device_stat(&mut lab, "total_send_wrs") - wrs, 3);
    // Then idle: no tick looks at the qpair again.
    let covered = lab.housekeeping(0).qpairs_checked;
    assert!(covered > checked);
    lab.run_for(Duration::from_millis(100), Duration::from_millis(1));
    assert_eq!(lab.housekeeping(0).qpairs_checked, covered);
    assert!(io.send_errors.is_empty(), "{:?}", io.send_errors);
    io.disconnect();
    admin.disconnect();
    assert_drained_with_budget(&mut lab, budget);
}

/// A host that alternates queue depth 1 with bursts that fill its whole queue, as soon as
/// it has seen the responses before: deferred responses still hold their slots then, and
/// must never leave the burst without one (the target would take it for a queue overrun
/// and close the queue). Found in the lab: `nvmf-perf -P 2` against our target.
#[test]
fn bursts_that_fill_the_queue_after_deferred_responses_never_overrun_it() {
    let (mut lab, mut admin, mut io, budget) = one_host_of_depth(66, 8, 8 * 4096);
    let depth = io.depth;
    let mut cid = 1u16;
    for round in 0..40 {
        for _ in 0..12 {
            let c = io.run(&mut lab, read_cmd(cid, 0, 8), keyed(0, 4096));
            assert!(c.status().is_success(), "round {round}: {c:?}");
            cid += 1;
        }
        // Half the spare slots at most: the other half is for completions not reaped yet.
        let r = lab.resources(0);
        assert!(
            (1..=usize::from(depth) / 2).contains(&r.requests_deferred),
            "round {round}: {r:?}"
        );
        // The whole queue at once: as many commands as it has entries, as a host that
        // counts its queue's size in commands may send.
        for k in 0..depth {
            io.submit(read_cmd(cid + k, 0, 8), keyed(usize::from(k) * 4096, 4096));
        }
        cid += depth;
        let mut answered = 0;
        lab.until(20_000, |_| {
            for c in io.poll() {
                assert!(c.status().is_success(), "round {round}: {c:?}");
                answered += 1;
            }
            answered == depth
        });
        assert_eq!(answered, depth, "round {round}");
        assert_eq!(
            lab.resources(0).qpairs,
            2,
            "round {round}: a queue was closed"
        );
    }
    io.disconnect();
    admin.disconnect();
    assert_drained_with_budget(&mut lab, budget);
}

//! 4 KiB reads or writes through the real RDMA transport over the simulated fabric, from many
//! connections at once, for verbs calls and instructions per I/O (issue 11, deliverable 6):
//!
//!     cargo build --release -p nvmf-benches --examples
//!     build/release/examples/sim_ops OP CONNS_PER_REACTOR REACTORS IOS [shared|separate]
//!
//! OP: `read`, `write` (keyed SGL: the target fetches the data with an RDMA READ) or
//! `write-inline` (the data in the command capsule, as Linux and SPDK hosts send writes up
//! to the target's in-capsule data size, 4 KiB by default).
//!
//! `benches/sim-scaling.sh` runs the matrix under callgrind and makes the table.
//!
//! # Set-up
//!
//! A [`SimLab`] with REACTORS poll groups (the real RDMA transport, driven from this thread on
//! the fabric's virtual clock) and one simulated host. CONNS_PER_REACTOR * REACTORS I/O queues
//! of depth 4 (`SIM_DEPTH`) are connected, `SIM_QUEUES_PER_CTRL` (default 16, a 16-CPU Linux
//! host) per controller, each controller with its own admin queue (depth 32); the target
//! places admin queues round-robin and I/O queues on the least-loaded reactor. Limits raised
//! through the options: the transport's `max_io_qpairs_per_ctrlr` (to the group size), the
//! target's queue pairs per host NQN and in all (every controller here is the same host NQN),
//! and the target device's `max_cqe` (4 Mi, a ConnectX-class limit: each I/O queue reserves 17
//! CQ entries and each admin queue 129, past the simulator's default 64 Ki at 4,000). Every
//! other transport option is the default: SRQ 4,096 deep, and data buffers from
//! `num_shared_buffers` (4,095 x 8 KiB io units, which this target turns into 255 small and 255
//! large buffers per reactor; `SIM_SHARED_BUFFERS` overrides it, up to 1,024 of each).
//!
//! Namespaces: `shared` puts every connection on one null bdev (NSID 1); `separate` gives
//! each controller (each group of `SIM_QUEUES_PER_CTRL` I/O queues, i.e. each host) its own
//! null bdev and namespace, all in the one subsystem, so a reactor holds one bdev channel per
//! controller. With a single controller (up to 16 I/O queues) the two modes are the same.
//! `SIM_IDLE_NAMESPACES` adds that many null namespaces no connection uses (a target
//! exporting many volumes to hosts that are quiet).
//!
//! # Measured phase
//!
//! Rounds: one command on every connection (QD1 per connection, all connections outstanding
//! together; `SIM_OUTSTANDING` commands per connection instead, below `SIM_DEPTH`, for a
//! connection at queue depth; 4 KiB, one block, keyed SGL into the host's registered buffer, or
//! in the capsule for `write-inline`), then turns until
//! the fabric and the reactors are idle, then the host reaps every response; repeated until
//! IOS commands completed (the last round may cover part of the connections). Warm-up rounds
//! come first, enough for 2,048 I/Os per reactor (at least 2; `SIM_WARMUP_ROUNDS`), so every
//! data buffer has served once (a buffer that carried Connect data is zeroed by its first null
//! read: a one-time cost, counted in the measured phase at 256 connections before), then a
//! Keep Alive on every admin queue.
//!
//! One turn models one reactor loop iteration taking `SIM_QUANTUM_NS` (default 1,000 ns) of
//! virtual time: the fabric runs the events due in that quantum (if none is due, it jumps to
//! the next event instead of spinning through idle quanta), then the acceptor turns and each
//! reactor polls once. Completions that land within one quantum are reaped by one CQ poll,
//! so batching grows with load as on a real NIC; at a few connections most turns find
//! nothing (the empty polls).
//!
//! # Idle phase
//!
//! After the measured phase, `SIM_IDLE_TURNS` (default 10,000) quanta in which every reactor
//! polls once with every connection open and nothing in flight (`idle_phase`): what an
//! empty turn costs. `benches/sim-scaling.sh` counts it in a second callgrind run and takes
//! the measured phase's empty reactor turns (printed as `empty_reactor_turns`) times that
//! cost off the I/O's, for the instructions that serve the I/O rather than spin between them.
//!
//! # What is printed
//!
//! Verbs calls per I/O from `SimFabric::stats()` deltas over the measured phase. The host's
//! own calls (one post_send per command, one post_recv per response, its CQ polls) are counted
//! here and subtracted, so the `target` line is the target's alone; the `fabric` line is both.
//! Doorbells are post calls. Also wall time of the measured phase.
//!
//! Instructions come from callgrind (`--collect-atstart=no --toggle-collect=*measured_phase*`)
//! and `benches/callgrind_attrib.py`, which separates the target's own cost from the
//! simulator's and the host's.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvmf_common::rdma::sim::{default_device_attr, SimStats};
use nvmf_common::rdma::{VerbsCq, WorkCompletion};
use nvmf_common::spec::command::Command;
use nvmf_target::bdev::NullBdev;
use nvmf_target::target::NamespaceOptions;
use nvmf_target::transport::options::TransportOptions;
use nvmf_tests::sim::{admin_queue, host_ip, Data, HostQueue, SimLab, SUBNQN};

const IO_LEN: u32 = 4096;
const NULL_BLOCKS: u64 = 65_536;
/// CQE offsets of the CID and the status field (phase tag in bit 0).
const CQE_CID: usize = 12;
const CQE_STATUS: usize = 14;
const CQE_LEN: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Read,
    /// Keyed SGL: the target fetches the data with an RDMA READ.
    Write,
    /// In-capsule data: how Linux's nvme-rdma and SPDK's initiator send a write no larger
    /// than the target's in-capsule data size (4 KiB by default).
    WriteInCapsule,
}

/// One I/O queue of the host.
struct Conn {
    q: HostQueue,
    nsid: u32,
    slba: u64,
    /// The first command id of the current round (its commands are `cid..cid + per_conn`).
    cid: u16,
    /// Commands of the round not answered yet.
    pending: u16,
}

/// Verbs calls the host made itself (subtracted from the fabric's counters).
#[derive(Clone, Copy, Default, Debug)]
struct HostCalls {
    post_send_calls: u64,
    send_wrs: u64,
    post_recv_calls: u64,
    recv_wrs: u64,
    cq_polls: u64,
    empty_polls: u64,
}

#[derive(Default, Debug)]
struct Phase {
    ios: u64,
    rounds: u64,
    turns: u64,
    /// Reactor turns (one per reactor per turn) that found no work.
    empty_reactor_turns: u64,
    virtual_ns: u64,
}

/// I/Os each reactor serves before the measured phase, by default.
const WARMUP_IOS_PER_REACTOR: u64 = 2_048;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn usage() -> ! {
    eprintln!(
        "usage: sim_ops read|write|write-inline CONNS_PER_REACTOR REACTORS IOS [shared|separate]"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        usage();
    }
    let op = match args[0].as_str() {
        "read" => Op::Read,
        "write" => Op::Write,
        "write-inline" => Op::WriteInCapsule,
        _ => usage(),
    };
    let per_reactor: usize = args[1].parse().unwrap_or_else(|_| usage());
    let reactors: usize = args[2].parse().unwrap_or_else(|_| usage());
    let ios: u64 = args[3].parse().unwrap_or_else(|_| usage());
    let separate = match args.get(4).map(String::as_str) {
        None | Some("shared") => false,
        Some("separate") => true,
        _ => usage(),
    };
    if per_reactor == 0 || reactors == 0 {
        usage();
    }
    let group: usize = env_or("SIM_QUEUES_PER_CTRL", 16usize).max(1);
    let depth: u16 = env_or("SIM_DEPTH", 4u16).max(2);
    // Commands each connection has outstanding at once (default 1: QD1 per connection).
    let per_conn: u16 = env_or("SIM_OUTSTANDING", 1u16).max(1);
    assert!(
        per_conn < depth,
        "SIM_OUTSTANDING ({per_conn}) must be below SIM_DEPTH ({depth})"
    );
    let quantum = Duration::from_nanos(env_or("SIM_QUANTUM_NS", 1_000u64));
    // Enough rounds that each reactor has used every data buffer of its pools (up to 1,024
    // of each class): a buffer that carried Connect data is zeroed by the first null read it
    // serves, once, and the measured phase is the steady state, not that.
    let warmup: u64 = env_or(
        "SIM_WARMUP_ROUNDS",
        WARMUP_IOS_PER_REACTOR.div_ceil(per_reactor as u64).max(2),
    );
    let seed: u64 = env_or("SIM_SEED", 1u64);

    let total = per_reactor * reactors;
    let ctrls = total.div_ceil(group);
    let mut opts = TransportOptions::new("RDMA");
    opts.max_io_qpairs_per_ctrlr = u16::try_from(group).expect("SIM_QUEUES_PER_CTRL < 65535");
    opts.num_shared_buffers = env_or("SIM_SHARED_BUFFERS", opts.num_shared_buffers);
    let mut attr = default_device_attr();
    attr.max_cqe = 1 << 22;
    let mut lab = SimLab::with_device(seed, opts, reactors, attr);
    let limits = &lab.target.info.qpair_limits;
    limits.max_per_host.store(u32::MAX, Ordering::Relaxed);
    limits.max_total.store(u32::MAX, Ordering::Relaxed);

    // The lab's subsystem comes with Malloc0 as NSID 1: null bdevs instead.
    lab.target
        .remove_namespace(SUBNQN, 1)
        .expect("Malloc0 namespace");
    // SIM_IDLE_NAMESPACES more that no connection uses: what namespaces without I/O cost
    // the ones with it.
    let idle_namespaces: usize = env_or("SIM_IDLE_NAMESPACES", 0usize);
    let namespaces = if separate { ctrls } else { 1 } + idle_namespaces;
    for i in 0..namespaces {
        let name = format!("Null{i}");
        let bdev = NullBdev::new(name.clone(), NULL_BLOCKS, IO_LEN, None).expect("null bdev");
        lab.target
            .bdevs
            .register(std::sync::Arc::new(bdev))
            .expect("register");
        let nsid = lab
            .target
            .add_namespace(
                SUBNQN,
                NamespaceOptions {
                    bdev_name: name,
                    nsid: Some(i as u32 + 1),
                    ..Default::default()
                },
            )
            .expect("namespace");
        assert_eq!(nsid, i as u32 + 1);
    }
    lab.turns(4);

    let host = lab.fabric.add_host(host_ip(1));
    let setup = Instant::now();
    let mut admins = Vec::with_capacity(ctrls);
    let mut conns = Vec::with_capacity(total);
    for c in 0..ctrls {
        let (aq, cntlid) = admin_queue(&mut lab, &host);
        for k in 0..group.min(total - c * group) {
            let qid = k as u16 + 1;
            let mut q =
                HostQueue::connect(&mut lab, &host, qid, depth).expect("I/O queue accepted");
            let r = q.fabric_connect(&mut lab, qid, cntlid);
            assert!(r.status().is_success(), "I/O Connect failed: {r:?}");
            let n = conns.len() as u64;
            conns.push(Conn {
                q,
                nsid: if separate { c as u32 + 1 } else { 1 },
                slba: (n * 97) % NULL_BLOCKS,
                cid: 0,
                pending: 0,
            });
        }
        admins.push(aq);
    }
    assert_eq!(conns.len(), total);
    let placed: Vec<usize> = (0..reactors).map(|i| lab.resources(i).qpairs).collect();
    eprintln!(
        "set up {total} I/O queues ({ctrls} controllers, {namespaces} namespaces) in {:.1} s; qpairs per reactor (admin included): {placed:?}",
        setup.elapsed().as_secs_f64()
    );

    let mut spare = HostCalls::default();
    for _ in 0..warmup {
        round(
            &mut lab, &mut conns, per_conn, op, quantum, &mut spare, &mut 0,
        );
    }
    keep_alive(&mut lab, &mut admins);

    let mut host_calls = HostCalls::default();
    let before = lab.fabric.stats();
    let start = Instant::now();
    let phase = measured_phase(
        &mut lab,
        &mut conns,
        per_conn,
        op,
        ios,
        quantum,
        &mut host_calls,
    );
    let wall = start.elapsed();
    let after = lab.fabric.stats();
    let idle_turns: u64 = env_or("SIM_IDLE_TURNS", 10_000u64);
    idle_phase(&mut lab, idle_turns, quantum);
    keep_alive(&mut lab, &mut admins);

    report(
        op,
        per_reactor,
        reactors,
        separate,
        &phase,
        wall,
        &before,
        &after,
        &host_calls,
    );
    println!(
        "IDLE turns={idle_turns} reactor_turns={}",
        idle_turns * reactors as u64
    );
}

/// A Keep Alive on every admin queue (KATO is 30 s of virtual time; setup takes far less,
/// but a long run should not depend on it).
fn keep_alive(lab: &mut SimLab, admins: &mut [HostQueue]) {
    for (i, aq) in admins.iter_mut().enumerate() {
        let cid = 1 + (i as u16 % 1000);
        let r = aq.run(lab, Command::keep_alive(cid), Data::None);
        assert!(r.status().is_success(), "Keep Alive failed: {r:?}");
    }
}

/// The measured phase: `ios` commands in rounds over every connection (`per_conn` each).
#[inline(never)]
fn measured_phase(
    lab: &mut SimLab,
    conns: &mut [Conn],
    per_conn: u16,
    op: Op,
    ios: u64,
    quantum: Duration,
    host: &mut HostCalls,
) -> Phase {
    let t0 = lab.fabric.now_ns();
    let mut phase = Phase::default();
    while phase.ios < ios {
        let k = u64::from(per_conn);
        let n = (ios - phase.ios).div_ceil(k).min(conns.len() as u64) as usize;
        phase.turns += round(
            lab,
            &mut conns[..n],
            per_conn,
            op,
            quantum,
            host,
            &mut phase.empty_reactor_turns,
        );
        phase.ios += n as u64 * k;
        phase.rounds += 1;
    }
    phase.virtual_ns = lab.fabric.now_ns() - t0;
    phase
}

/// What an empty reactor turn costs with every connection open and nothing in flight:
/// `turns` quanta in which each reactor polls once (callgrind counts it apart, with
/// `--toggle-collect=*idle_phase*`). A polled reactor turns many times per I/O at low load,
/// so this is what each of those turns adds to an I/O.
#[inline(never)]
fn idle_phase(lab: &mut SimLab, turns: u64, quantum: Duration) {
    for _ in 0..turns {
        lab.fabric.advance(quantum);
        for pg in &mut lab.pgs {
            pg.poll();
        }
    }
}

/// One command on every connection of `conns`, then turns until all are answered. Returns
/// the turns taken; adds the reactor turns that found no work to `empty`.
#[allow(clippy::too_many_arguments)]
fn round(
    lab: &mut SimLab,
    conns: &mut [Conn],
    per_conn: u16,
    op: Op,
    quantum: Duration,
    host: &mut HostCalls,
    empty: &mut u64,
) -> u64 {
    let keyed = Data::Keyed {
        offset: 0,
        len: IO_LEN,
    };
    let in_capsule = Data::InCapsule {
        offset: 0,
        len: IO_LEN,
    };
    for c in conns.iter_mut() {
        c.cid = (c.cid + per_conn) & 0x0fff;
        for k in 0..per_conn {
            c.slba = (c.slba + 1) % NULL_BLOCKS;
            let cid = (c.cid + k) & 0x0fff;
            let (cmd, data) = match op {
                Op::Read => (Command::read(cid, c.nsid, c.slba, 1), keyed),
                Op::Write => (Command::write(cid, c.nsid, c.slba, 1), keyed),
                Op::WriteInCapsule => (Command::write(cid, c.nsid, c.slba, 1), in_capsule),
            };
            c.q.submit(cmd, data);
            host.post_send_calls += 1;
            host.send_wrs += 1;
        }
        c.pending = per_conn;
    }
    let mut pending = conns.len() * usize::from(per_conn);
    let mut turns = 0u64;
    while pending > 0 {
        let work = turn(lab, quantum, empty);
        turns += 1;
        if work > 0 || lab.fabric.pending_events() > 0 {
            continue;
        }
        // Quiet: every response that will come has come.
        for c in conns.iter_mut().filter(|c| c.pending > 0) {
            let answered = host_poll(c, per_conn, host);
            c.pending -= answered;
            pending -= usize::from(answered);
        }
        assert!(
            pending == 0 || turns < 1_000_000,
            "{pending} commands unanswered with the fabric idle"
        );
    }
    turns
}

/// One reactor-loop iteration of `quantum` virtual time (or up to the next event, if none is
/// due within it): fabric events, the acceptor, every reactor. Returns the reactors' work and
/// counts the reactors that found none in `empty`.
fn turn(lab: &mut SimLab, quantum: Duration, empty: &mut u64) -> usize {
    let events = lab.fabric.stats().events;
    lab.fabric.advance(quantum);
    if lab.fabric.stats().events == events && lab.fabric.pending_events() > 0 {
        lab.fabric.step();
    }
    let mut work = lab.transport.acceptor_turn(Duration::ZERO);
    for pg in &mut lab.pgs {
        let w = pg.poll();
        if w == 0 {
            *empty += 1;
        }
        work += w;
    }
    work
}

/// Reaps `c`'s CQ; returns the responses to its round's `per_conn` commands that arrived
/// (each checked: one of them, successful).
fn host_poll(c: &mut Conn, per_conn: u16, host: &mut HostCalls) -> u16 {
    let mut wcs = [WorkCompletion::default(); 32];
    let mut answered = 0;
    loop {
        let n = c.q.cq.poll(&mut wcs).expect("host CQ");
        host.cq_polls += 1;
        if n == 0 {
            host.empty_polls += 1;
        }
        for wc in &wcs[..n] {
            assert!(wc.is_success(), "host work request failed: {wc:?}");
            if !wc.opcode().is_recv() {
                continue;
            }
            let slot = wc.wr_id() as usize;
            let mut cqe = [0u8; CQE_LEN];
            c.q.rsps.read_at(slot * CQE_LEN, &mut cqe);
            let cid = u16::from_le_bytes([cqe[CQE_CID], cqe[CQE_CID + 1]]);
            let status = u16::from_le_bytes([cqe[CQE_STATUS], cqe[CQE_STATUS + 1]]) >> 1;
            assert!(
                cid.wrapping_sub(c.cid) & 0x0fff < per_conn,
                "response to another command: cid {cid}, round from {}",
                c.cid
            );
            assert_eq!(status, 0, "command failed: status {status:#x}");
            c.q.receive_done(slot);
            c.q.post_recv(slot);
            host.post_recv_calls += 1;
            host.recv_wrs += 1;
            answered += 1;
        }
        if n < wcs.len() {
            return answered;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn report(
    op: Op,
    per_reactor: usize,
    reactors: usize,
    separate: bool,
    phase: &Phase,
    wall: Duration,
    before: &SimStats,
    after: &SimStats,
    host: &HostCalls,
) {
    let ios = phase.ios.max(1) as f64;
    let d = |a: u64, b: u64| a - b;
    let fabric = HostCalls {
        post_send_calls: d(after.post_send_calls, before.post_send_calls),
        send_wrs: d(after.send_wrs, before.send_wrs),
        post_recv_calls: d(after.post_recv_calls, before.post_recv_calls),
        recv_wrs: d(after.recv_wrs, before.recv_wrs),
        cq_polls: d(after.cq_polls, before.cq_polls),
        empty_polls: d(after.empty_polls, before.empty_polls),
    };
    let target = HostCalls {
        post_send_calls: fabric.post_send_calls - host.post_send_calls,
        send_wrs: fabric.send_wrs - host.send_wrs,
        post_recv_calls: fabric.post_recv_calls - host.post_recv_calls,
        recv_wrs: fabric.recv_wrs - host.recv_wrs,
        cq_polls: fabric.cq_polls - host.cq_polls,
        empty_polls: fabric.empty_polls - host.empty_polls,
    };
    let per = |x: u64| x as f64 / ios;
    let line = |who: &str, c: &HostCalls| {
        println!(
            "{who:>7} per I/O: post_send {:.3} (send WRs {:.3}), post_recv {:.3} (recv WRs {:.3}), CQ polls {:.3} (empty {:.3})",
            per(c.post_send_calls),
            per(c.send_wrs),
            per(c.post_recv_calls),
            per(c.recv_wrs),
            per(c.cq_polls),
            per(c.empty_polls),
        );
    };
    let mode = if separate { "separate" } else { "shared" };
    let op_name = match op {
        Op::Read => "read",
        Op::Write => "write",
        Op::WriteInCapsule => "write-inline",
    };
    println!(
        "{op_name} 4 KiB, {per_reactor} connections/reactor x {reactors} reactors, {mode} namespace: {} I/Os in {} rounds, {} turns ({:.2} per round), {:.1} us virtual, {:.3} s wall ({:.2} us/I/O)",
        phase.ios,
        phase.rounds,
        phase.turns,
        phase.turns as f64 / phase.rounds.max(1) as f64,
        phase.virtual_ns as f64 / 1e3,
        wall.as_secs_f64(),
        wall.as_secs_f64() * 1e6 / ios,
    );
    line("target", &target);
    line("host", host);
    line("fabric", &fabric);
    println!(
        "  fabric: {:.3} CQEs/I/O, {:.3} packets/I/O, {} RNR NAKs, {} CQEs lost",
        per(after.cqes - before.cqes),
        per(after.packets - before.packets),
        after.rnr_naks - before.rnr_naks,
        after.cqes_lost - before.cqes_lost,
    );
    println!(
        "RESULT op={op_name} conns={per_reactor} reactors={reactors} mode={mode} ios={} rounds={} turns={} empty_reactor_turns={} wall_s={:.6} \
         t_post_send={} t_send_wrs={} t_post_recv={} t_recv_wrs={} t_cq_polls={} t_empty_polls={} \
         f_post_send={} f_send_wrs={} f_post_recv={} f_recv_wrs={} f_cq_polls={} f_empty_polls={} rnr_naks={}",
        phase.ios,
        phase.rounds,
        phase.turns,
        phase.empty_reactor_turns,
        wall.as_secs_f64(),
        target.post_send_calls,
        target.send_wrs,
        target.post_recv_calls,
        target.recv_wrs,
        target.cq_polls,
        target.empty_polls,
        fabric.post_send_calls,
        fabric.send_wrs,
        fabric.post_recv_calls,
        fabric.recv_wrs,
        fabric.cq_polls,
        fabric.empty_polls,
        after.rnr_naks - before.rnr_naks,
    );
}

//! The `nvmf-hostile-host` tool's code (`nvmf_tests::hostile`) against the real target over
//! the simulated fabric: each mode does to the target what the lab's `hostile-rdma`
//! scenario relies on, and the target gets through it.
//!
//! The tool blocks and waits through its verbs provider, as the initiator does in
//! `sim_initiator.rs`, whose module docs explain the set-up used here: the target lives in a
//! thread-local, and the fabric's idle hook runs one target turn each time the tool waits.
//! The hook also drives a well-behaved host (a [`HostQueue`] reading 4 KiB at a time) and
//! samples the target's resources, so a test sees what happened while the tool ran.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::sync::Arc;

use nvmf_common::rdma::sim::{SimFabric, SimVerbs};
use nvmf_common::spec::command::Command;
use nvmf_tests::hostile::{self, field, Mode, Options, Report};
use nvmf_tests::sim::{
    admin_queue, host_ip, io_queue, keyed, read_cmd, target_ip, Data, HostQueue, SimLab, PORT,
    SUBNQN,
};

thread_local! {
    /// The target of this thread's test, for the idle hook.
    static LAB: RefCell<Option<SimLab>> = const { RefCell::new(None) };
    /// The well-behaved host the idle hook drives, if any.
    static GOOD: RefCell<Option<Good>> = const { RefCell::new(None) };
    /// Largest (parked requests, data buffers out) the hook saw on reactor 0.
    static PEAK: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// A host that behaves: one 4 KiB READ outstanding at a time, Keep Alive every 5 s.
struct Good {
    admin: HostQueue,
    io: HostQueue,
    outstanding: Option<u16>,
    next_cid: u16,
    ok: u32,
    failed: u32,
    next_keep_alive_ms: u64,
}

impl Good {
    fn turn(&mut self, now_ms: u64) {
        for c in self.io.poll() {
            if Some(c.cid.get()) == self.outstanding {
                self.outstanding = None;
                if c.status().is_success() {
                    self.ok += 1;
                } else {
                    self.failed += 1;
                }
            }
        }
        self.admin.poll();
        if self.outstanding.is_none() && !self.io.disconnected {
            self.next_cid = self.next_cid.wrapping_add(1).max(1);
            self.io
                .submit(read_cmd(self.next_cid, 8, 8), keyed(0, 4096));
            self.outstanding = Some(self.next_cid);
        }
        if now_ms >= self.next_keep_alive_ms {
            self.next_keep_alive_ms = now_ms + 5000;
            let cid = 0x4000 | (self.next_cid & 0xFFF);
            self.admin.submit(Command::keep_alive(cid), Data::None);
        }
    }
}

/// The fabric's idle hook: one target turn, a sample of its resources, the good host's turn.
fn idle_hook() {
    LAB.with(|cell| {
        let Ok(mut lab) = cell.try_borrow_mut() else {
            return;
        };
        let Some(lab) = lab.as_mut() else {
            return;
        };
        lab.target_turn();
        let r = lab.resources(0);
        let (parked, out) = PEAK.get();
        PEAK.set((parked.max(r.parked), out.max(r.buffers_out)));
        let now_ms = lab.fabric.now_ns() / 1_000_000;
        GOOD.with(|g| {
            if let Some(g) = g.borrow_mut().as_mut() {
                g.turn(now_ms);
            }
        });
    });
}

/// The target (in [`LAB`]) on a fabric with the hook installed; removed on drop.
struct Rig {
    fabric: SimFabric,
}

impl Rig {
    fn new(seed: u64) -> Self {
        let lab = SimLab::new(seed);
        let fabric = lab.fabric.clone();
        LAB.with(|cell| *cell.borrow_mut() = Some(lab));
        PEAK.set((0, 0));
        fabric.set_idle_hook(Some(Arc::new(idle_hook)));
        Self { fabric }
    }

    fn lab<R>(&self, f: impl FnOnce(&mut SimLab) -> R) -> R {
        LAB.with(|cell| f(cell.borrow_mut().as_mut().expect("the target is running")))
    }

    /// Connects the well-behaved host (from host address 2); the hook drives it from now on.
    fn start_good_host(&self) {
        let good = self.lab(|lab| {
            let verbs = lab.fabric.add_host(host_ip(2));
            let (admin, cntlid) = admin_queue(lab, &verbs);
            let io = io_queue(lab, &verbs, cntlid, 16, 64 * 1024);
            Good {
                admin,
                io,
                outstanding: None,
                next_cid: 0,
                ok: 0,
                failed: 0,
                next_keep_alive_ms: 0,
            }
        });
        GOOD.with(|g| *g.borrow_mut() = Some(good));
    }

    /// Disconnects the good host; returns its (successful, failed) READs.
    fn stop_good_host(&self) -> (u32, u32) {
        let mut g = GOOD.with(|g| g.borrow_mut().take()).expect("a good host");
        g.io.disconnect();
        g.admin.disconnect();
        (g.ok, g.failed)
    }

    /// The tool, on host address 1, against the lab's subsystem.
    fn run(&self, mode: Mode, configure: impl FnOnce(&mut Options)) -> (Report<SimVerbs>, bool) {
        let verbs = self.fabric.add_host(host_ip(1));
        let mut opts = Options::new(mode, SocketAddr::new(target_ip(), PORT), SUBNQN);
        configure(&mut opts);
        let mut report = Report::new(&verbs, false);
        let ok = match hostile::run(&verbs, &opts, &mut report) {
            Ok(()) => true,
            Err(e) => {
                report.lines.push(format!("error: {e:#}"));
                false
            }
        };
        for l in &report.lines {
            eprintln!("{l}");
        }
        (report, ok)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.fabric.set_idle_hook(None);
        GOOD.with(|g| g.borrow_mut().take());
        let lab = LAB.with(|cell| cell.try_borrow_mut().ok().and_then(|mut l| l.take()));
        drop(lab);
    }
}

fn seconds(v: &str) -> f64 {
    v.trim_end_matches('s').parse().expect("seconds")
}

/// `stall`: the READs' buffers are pinned and the requests past the queue's share parked;
/// another host reads meanwhile; the transfer timeout (30 s) cuts the I/O queue, the
/// controller lives on (Keep Alive answered throughout), and nothing leaks.
#[test]
fn stall_pins_buffers_until_the_transfer_timeout_cuts_the_queue() {
    let rig = Rig::new(21);
    rig.start_good_host();
    let (report, ok) = rig.run(Mode::Stall, |o| o.seconds = Some(60));
    assert!(ok, "the tool failed to set up");
    let (parked, buffers) = PEAK.get();
    assert!(
        parked > 0 && buffers > 0,
        "nothing pinned: {parked} parked, {buffers} buffers"
    );
    let done = report.last("done").expect("a done line");
    assert_eq!(field(done, "io_responses"), Some("0"), "{done}");
    assert_eq!(field(done, "admin_queue_cut"), Some("false"), "{done}");
    let cut = seconds(field(done, "io_queue_cut_after").expect("cut"));
    assert!(
        (30.0..32.0).contains(&cut),
        "cut after {cut} s, not the transfer timeout"
    );
    let (answered, sent) = field(done, "keep_alives")
        .and_then(|k| k.split_once('/'))
        .expect("keep_alives=OK/SENT");
    assert_eq!(answered, sent, "{done}");
    assert!(report.last("io-queue-disconnected").is_some());
    let (good, failed) = rig.stop_good_host();
    assert_eq!(failed, 0);
    assert!(good > 1000, "the good host starved: {good} READs");
    rig.lab(|lab| lab.assert_drained());
}

/// `no-connect`: every connection is accepted and closed by the target after its connect
/// timeout (10 s).
#[test]
fn connections_that_never_connect_are_closed_after_the_connect_timeout() {
    let rig = Rig::new(22);
    let (report, ok) = rig.run(Mode::NoConnect, |o| {
        o.count = Some(8);
        o.seconds = Some(30);
    });
    assert!(ok, "the tool failed to set up");
    let done = report.last("done").expect("a done line");
    assert_eq!(field(done, "accepted"), Some("8"), "{done}");
    assert_eq!(field(done, "disconnected"), Some("8"), "{done}");
    assert_eq!(field(done, "open"), Some("0"), "{done}");
    let first = seconds(field(done, "first").unwrap());
    let last = seconds(field(done, "last").unwrap());
    assert!(first >= 9.9 && last < 11.0, "{done}");
    rig.lab(|lab| lab.assert_drained());
}

/// `garbage`: random capsules and random opcodes get answers or cost the host its
/// connection, never the target; a good host is served throughout and after.
#[test]
fn garbage_costs_the_sender_its_connection_not_the_target() {
    let rig = Rig::new(23);
    rig.start_good_host();
    let (report, ok) = rig.run(Mode::Garbage, |o| {
        o.count = Some(200);
        o.seed = 23;
    });
    assert!(ok, "the tool failed to set up");
    let done = report.last("done").expect("a done line");
    assert_eq!(field(done, "sent"), Some("200"), "{done}");
    assert_eq!(field(done, "refused"), Some("0"), "{done}");
    assert_eq!(field(done, "stopped_by_time"), Some("false"), "{done}");
    let responses: u32 = field(done, "responses").unwrap().parse().unwrap();
    let cuts: u32 = field(done, "target_disconnects").unwrap().parse().unwrap();
    assert!(responses > 0 && cuts > 0, "{done}");
    let (good, failed) = rig.stop_good_host();
    assert_eq!(failed, 0);
    assert!(good > 100, "the good host starved: {good} READs");
    rig.lab(|lab| lab.assert_drained());
}

/// Nothing listens at the address: the tool's setup error says so.
#[test]
fn an_unreachable_target_is_a_setup_error() {
    let rig = Rig::new(24);
    let verbs = rig.fabric.add_host(host_ip(1));
    let peer = SocketAddr::new(target_ip(), PORT + 1);
    let opts = Options::new(Mode::Stall, peer, SUBNQN);
    let mut report = Report::new(&verbs, false);
    let err = hostile::run(&verbs, &opts, &mut report).expect_err("nothing listens there");
    let msg = format!("{err:#}");
    eprintln!("{msg}");
    assert!(msg.contains(&peer.to_string()), "{msg}");
}

//! The randomized driver of the RDMA transport over the simulated fabric: a schedule of
//! connects of random depth, valid and garbage capsules, hosts that stop receiving, disconnect
//! or vanish, hosts whose ACKs come late while they keep their queue full (commands then wait
//! for request slots: about 2 seeds in 5 make some), the target's device removed and back
//! (at once, or once the target has let it go), and time jumps past every timeout, with the
//! target's invariants checked after every step. A schedule comes from a seed
//! ([`run_seed`]) or from fuzzer bytes ([`run_bytes`]); the same input replays exactly.
//!
//! Invariants:
//! - nothing panics (a panic fails the test or the fuzz run);
//! - every response a host receives answers a command that queue sent and has not yet seen
//!   answered (its CID is outstanding on that queue), at most once;
//! - a queue the host closed receives nothing after the close;
//! - once every host is gone and time has passed, the target holds no qpair, request, data
//!   buffer or receive slot;
//! - a removed device is let go (nothing of the target's left on it) within 5 s.

use std::collections::HashMap;
use std::time::Duration;

use nvmf_common::rdma::VerbsQp;
use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::CNTLID_DYNAMIC;
use zerocopy::IntoBytes;

use crate::sim::{host_ip, read_cmd, small_options, write_cmd, Data, HostQueue, SimLab};

/// Where a schedule's choices come from: a seeded generator or the fuzzer's bytes.
pub trait Choices {
    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize;
    /// Whether choices are left (a byte script ends; a seed never does).
    fn more(&self) -> bool;
}

/// splitmix64: a reproducible stream from a seed.
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl Choices for Seeded {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if n == 0 {
            0
        } else {
            (z % n as u64) as usize
        }
    }

    fn more(&self) -> bool {
        true
    }
}

/// Fuzzer bytes, one or two per choice.
pub struct Script<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Script<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }
}

impl Choices for Script<'_> {
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let mut v = 0usize;
        let width = if n > 256 { 2 } else { 1 };
        for _ in 0..width {
            v = (v << 8) | usize::from(self.bytes.get(self.at).copied().unwrap_or(0));
            self.at += 1;
        }
        v % n
    }

    fn more(&self) -> bool {
        self.at < self.bytes.len()
    }
}

/// A host queue as the driver sees it: what it sent and not yet heard back about.
struct Tracked {
    q: HostQueue,
    /// CID -> times sent and not yet answered.
    outstanding: HashMap<u16, u32>,
    next_cid: u16,
    closed: bool,
}

impl Tracked {
    fn in_flight(&self) -> u32 {
        self.outstanding.values().sum()
    }

    /// The next command identifier, below the Connect's (0x7000).
    fn take_cid(&mut self) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1) % 0x7000;
        cid
    }

    /// Sends `cmd` if the host's send queue has room (a real host waits for its earlier
    /// sends), and tracks it as outstanding.
    fn try_submit(&mut self, cmd: Command, data: Data) {
        let cid = cmd.cid.get();
        if self.q.try_submit(cmd, data) {
            *self.outstanding.entry(cid).or_default() += 1;
        }
    }
}

struct Driver {
    lab: SimLab,
    hosts: Vec<nvmf_common::rdma::sim::SimVerbs>,
    queues: Vec<Tracked>,
    /// Admin controllers that connected: (host index, cntlid).
    controllers: Vec<(usize, u16)>,
    responses: u64,
}

const MAX_QUEUES: usize = 12;
const DATA_LEN: usize = 16 * 32 * 1024;

impl Driver {
    fn new(seed: u64) -> Self {
        let lab = SimLab::with(seed, small_options(), 1);
        let hosts = (1..=3).map(|n| lab.fabric.add_host(host_ip(n))).collect();
        Self {
            lab,
            hosts,
            queues: Vec::new(),
            controllers: Vec::new(),
            responses: 0,
        }
    }

    fn step(&mut self, c: &mut impl Choices) {
        match c.below(17) {
            0 | 1 => self.connect(c),
            2..=6 => self.command(c),
            7 => self.garbage(c),
            8 => self.toggle_receives(c),
            9 => self.close(c, true),
            10 => self.close(c, false),
            11 => {
                let ms = [1u64, 10, 100, 2_000, 12_000, 31_000][c.below(6)];
                self.lab.run_for(
                    Duration::from_millis(ms),
                    Duration::from_millis(ms.div_ceil(20)),
                );
            }
            15 => self.device_flap(c),
            16 => self.late_responses(c),
            _ => self.lab.turns(1 + c.below(20)),
        }
        self.collect();
    }

    fn connect(&mut self, c: &mut impl Choices) {
        if self.queues.iter().filter(|t| !t.closed).count() >= MAX_QUEUES {
            return;
        }
        let h = c.below(self.hosts.len());
        let verbs = self.hosts[h].clone();
        let admin = self.controllers.is_empty() || c.below(3) == 0;
        let depth = [2u16, 3, 8, 32, 64, 128][c.below(6)];
        let recvs = if c.below(4) == 0 {
            c.below(usize::from(depth))
        } else {
            usize::from(depth)
        };
        let qid = if admin { 0 } else { 1 };
        let Ok(q) =
            HostQueue::connect_with(&mut self.lab, &verbs, qid, depth, DATA_LEN, recvs, |r| {
                r.as_bytes().to_vec()
            })
        else {
            return;
        };
        let mut t = Tracked {
            q,
            outstanding: HashMap::new(),
            next_cid: 1,
            closed: false,
        };
        // The Fabrics Connect (it may never be answered if the host posted no receive).
        let cntlid = if admin {
            CNTLID_DYNAMIC
        } else {
            let (_, cntlid) = self.controllers[c.below(self.controllers.len())];
            cntlid
        };
        let cid = 0x7000;
        *t.outstanding.entry(cid).or_default() += 1;
        let connect = nvmf_common::spec::fabrics::ConnectCommand::new(cid, qid, depth - 1, 30_000)
            .to_command();
        let cd = nvmf_common::spec::fabrics::ConnectData::new(
            [h as u8 + 1; 16],
            cntlid,
            crate::sim::SUBNQN,
            crate::sim::HOSTNQN,
        );
        t.q.data.write_at(0, cd.as_bytes());
        t.q.submit(
            connect,
            Data::Keyed {
                offset: 0,
                len: cd.as_bytes().len() as u32,
            },
        );
        if admin {
            // Learn the CNTLID if the answer comes quickly; the queue is tracked either way.
            for _ in 0..200 {
                self.lab.turn();
                let got = t.q.poll();
                let mut done = false;
                for r in got {
                    check_response(&mut t, &r);
                    self.responses += 1;
                    if r.cid.get() == cid {
                        if r.status().is_success() {
                            self.controllers.push((h, r.dw0.get() as u16));
                        }
                        done = true;
                    }
                }
                if done {
                    break;
                }
            }
        }
        self.queues.push(t);
    }

    fn open_queue(&mut self, c: &mut impl Choices) -> Option<usize> {
        let open: Vec<usize> = (0..self.queues.len())
            .filter(|&i| !self.queues[i].closed)
            .collect();
        (!open.is_empty()).then(|| open[c.below(open.len())])
    }

    fn command(&mut self, c: &mut impl Choices) {
        let Some(i) = self.open_queue(c) else { return };
        let t = &mut self.queues[i];
        // A well-behaved host never exceeds its depth; a hostile one sometimes does.
        if t.in_flight() + 1 >= u32::from(t.q.depth) && c.below(8) != 0 {
            return;
        }
        let cid = t.take_cid();
        let blocks = [1u32, 8, 32, 64, 256][c.below(5)];
        let slba = c.below(4096) as u64;
        let len = blocks * 512;
        let cmd = match c.below(5) {
            0 | 1 => read_cmd(cid, slba, blocks),
            2 | 3 => write_cmd(cid, slba, blocks),
            _ => Command::flush(cid, 1),
        };
        let offset = c.below(DATA_LEN / 4096) * 4096;
        let sgl_len = match c.below(6) {
            0 => len / 2,
            1 => len + 512,
            _ => len,
        };
        let data = match c.below(6) {
            0 if len <= 8192 => {
                let len = sgl_len.min(8192);
                Data::InCapsule {
                    offset: offset.min(DATA_LEN - len as usize),
                    len,
                }
            }
            1 => Data::RawKeyed {
                addr: c.below(1 << 20) as u64,
                len: sgl_len,
                key: c.below(1 << 16) as u32,
            },
            _ => Data::Keyed {
                offset: offset.min(DATA_LEN - sgl_len.min(DATA_LEN as u32) as usize),
                len: sgl_len.min(DATA_LEN as u32),
            },
        };
        t.try_submit(cmd, data);
    }

    fn garbage(&mut self, c: &mut impl Choices) {
        let Some(i) = self.open_queue(c) else { return };
        let t = &mut self.queues[i];
        let len = [0usize, 1, 10, 63, 64, 65, 100, 200][c.below(8)];
        let slot = c.below(usize::from(t.q.depth));
        let base = slot * (64 + t.q.in_capsule as usize);
        let bytes: Vec<u8> = (0..len).map(|_| c.below(256) as u8).collect();
        if len > 0 {
            t.q.write_capsule(base, &bytes);
        }
        // Garbage is not bound by the queue depth, but it is by the host's send queue.
        if t.q.try_send_raw(base, len.max(1)) && len >= 4 {
            let cid = u16::from_le_bytes([bytes[2], bytes[3]]);
            *t.outstanding.entry(cid).or_default() += 1;
        }
    }

    fn toggle_receives(&mut self, c: &mut impl Choices) {
        let Some(i) = self.open_queue(c) else { return };
        let t = &mut self.queues[i];
        t.q.repost = !t.q.repost;
        if t.q.repost {
            // Give back what was withheld (into the slots that have none: reposting a
            // slot still posted made two responses share a buffer).
            t.q.post_missing_receives();
        }
    }

    /// The host's responses (its ACKs of our SENDs among them) start or stop coming late,
    /// so its next commands can outrun the completions that free their slots.
    fn late_responses(&mut self, c: &mut impl Choices) {
        let Some(i) = self.open_queue(c) else { return };
        let extra = [0u64, 300, 5_000, 50_000][c.below(4)];
        let qp = self.queues[i].q.qp.qp_num();
        self.lab
            .fabric
            .faults()
            .late_responses(qp, Duration::from_micros(extra));
        if extra > 0 && c.below(2) == 0 {
            self.keep_queue_full(i, c.below(200));
        }
    }

    /// The target's device is removed (`rdma link delete`) and comes back: at once, or once
    /// the target has let go of everything it held on it, which it must within 5 s.
    fn device_flap(&mut self, c: &mut impl Choices) {
        let ip = crate::sim::target_ip();
        self.lab.fabric.remove_device(ip);
        if c.below(2) == 0 {
            self.lab.turns(c.below(30));
        } else {
            for _ in 0..100 {
                if self.lab.fabric.device_objects(ip).total() == 0 {
                    break;
                }
                self.lab
                    .run_for(Duration::from_millis(50), Duration::from_millis(5));
                self.collect();
            }
            let held = self.lab.fabric.device_objects(ip);
            assert_eq!(
                held.total(),
                0,
                "the target still holds the removed device: {held:?}"
            );
        }
        self.lab.fabric.restore_device(ip);
    }

    /// Queue `i`'s host keeps its whole queue busy for `turns` turns: a new command (a
    /// flush) as each response comes in, as a fast host does.
    fn keep_queue_full(&mut self, i: usize, turns: usize) {
        for _ in 0..turns {
            let t = &mut self.queues[i];
            if t.closed {
                return;
            }
            if t.in_flight() < u32::from(t.q.depth) {
                let cid = t.take_cid();
                t.try_submit(Command::flush(cid, 1), Data::None);
            }
            self.lab.turn();
            self.collect();
        }
    }

    /// The host closes a queue: with a disconnect, or by dropping everything (a crash).
    fn close(&mut self, c: &mut impl Choices, polite: bool) {
        let Some(i) = self.open_queue(c) else { return };
        let t = &mut self.queues[i];
        // What arrived before the close counts; nothing may arrive after it.
        for r in t.q.poll() {
            check_response(t, &r);
            self.responses += 1;
        }
        t.closed = true;
        if polite {
            t.q.disconnect();
        }
        if !polite {
            let t = self.queues.swap_remove(i);
            drop(t);
        }
    }

    fn collect(&mut self) {
        for t in &mut self.queues {
            let got = t.q.poll();
            if t.closed {
                assert!(
                    got.is_empty(),
                    "a queue the host closed received {} responses",
                    got.len()
                );
                continue;
            }
            for r in got {
                check_response(t, &r);
                self.responses += 1;
            }
        }
        self.queues.retain(|t| !t.closed || !t.q.disconnected);
    }

    fn finish(mut self) -> u64 {
        for t in &mut self.queues {
            if !t.closed {
                t.q.disconnect();
            }
        }
        self.queues.clear();
        self.lab.assert_drained();
        self.responses
    }
}

fn check_response(t: &mut Tracked, r: &nvmf_common::spec::Completion) {
    let cid = r.cid.get();
    let n = t.outstanding.get_mut(&cid).unwrap_or_else(|| {
        panic!(
            "a response for CID {cid:#x}, which this queue has no command outstanding for: {r:?}"
        )
    });
    *n -= 1;
    if *n == 0 {
        t.outstanding.remove(&cid);
    }
}

/// Runs `steps` steps of the schedule of `seed`, then closes everything and checks that
/// nothing is held. Returns the responses the hosts received.
pub fn run_seed(seed: u64, steps: usize) -> u64 {
    let mut d = Driver::new(seed);
    let mut c = Seeded::new(seed);
    for _ in 0..steps {
        d.step(&mut c);
    }
    d.finish()
}

/// The fuzz target: the bytes choose the schedule (the fabric's seed is their first byte).
pub fn run_bytes(bytes: &[u8]) {
    let seed = u64::from(bytes.first().copied().unwrap_or(1));
    let mut d = Driver::new(seed);
    let mut c = Script::new(bytes.get(1..).unwrap_or(&[]));
    let mut steps = 0;
    while c.more() && steps < 200 {
        d.step(&mut c);
        steps += 1;
    }
    d.finish();
}

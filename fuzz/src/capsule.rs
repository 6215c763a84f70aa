//! Capsules through the loopback transport: the SQE (every opcode, flag and SGL descriptor),
//! the host memory a keyed SGL names, in-capsule data and Connect data, on a queue the input
//! must Connect itself and on an admin and an I/O queue a Linux-like host already brought up.
//!
//! Input: records of `[op][64-byte SQE][u16 length][length bytes of host data]`. `op` bits
//! 0-1 pick the queue (0 and 3: fresh queues, 1: the connected admin queue, 2: the connected
//! I/O queue), bit 2 polls the target right after the submission, bit 3 hangs up the picked
//! fresh queue (the next record on it opens a new one).
//!
//! Invariants, after every input:
//! - no panic anywhere in the target;
//! - every response answers a command submitted on that queue and not yet answered (CID);
//! - no response carries the marker the pool buffers were filled with before the input
//!   (no byte a handler did not write leaves the target);
//! - once every queue is gone, every pool buffer is back (`available() == count`).

use std::collections::HashMap;

use nvmf_common::spec::command::Command;
use nvmf_target::transport::TransportLimits;
use nvmf_tests::{
    linux_bring_up, Capsule, HostController, LoopbackHostQueue, LoopbackLab, LOOPBACK_LIMITS,
};
use zerocopy::FromBytes;

pub const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
/// Written over every free pool buffer before the input runs.
pub const MARKER: [u8; 8] = [0xDE, 0xAD, 0xBE, 0xEF, 0x5A, 0xC3, 0x96, 0x69];
/// Host memory per capsule, at most (larger than the in-capsule size and one pool buffer's
/// worth of admin data; I/O beyond it is refused by the SGL checks anyway).
pub const MAX_HOST_BUFFER: usize = 16 << 10;
/// Largest input the drivers generate.
pub const MAX_INPUT: usize = 64 << 10;
/// Queue depth 8: a pool of 16 buffers, so the starvation paths are reached too.
const LIMITS: TransportLimits = TransportLimits {
    max_queue_depth: 8,
    ..LOOPBACK_LIMITS
};
/// Reactor turns the target gets to answer everything once the input is in.
const SETTLE_POLLS: usize = 2_000;

struct Queue {
    host: Option<LoopbackHostQueue>,
    /// CIDs submitted and not yet answered (a host may reuse a CID; count them).
    outstanding: HashMap<u16, usize>,
    responses: usize,
    successes: usize,
}

impl Queue {
    fn new(host: Option<LoopbackHostQueue>) -> Self {
        Self {
            host,
            outstanding: HashMap::new(),
            responses: 0,
            successes: 0,
        }
    }

    fn submit(&mut self, capsule: Capsule) {
        let cid = capsule.cmd.cid.get();
        *self.outstanding.entry(cid).or_default() += 1;
        self.host.as_ref().expect("open queue").submit(capsule);
    }

    /// Takes every response that arrived and checks each against what was submitted.
    fn drain(&mut self, which: usize, check_marker: bool) {
        let Some(host) = &self.host else { return };
        while let Some(r) = host.poll() {
            let cid = r.cqe.cid.get();
            match self.outstanding.get_mut(&cid) {
                Some(n) if *n > 0 => *n -= 1,
                _ => panic!(
                    "queue {which}: response for CID {cid} that was never submitted \
                     (or answered twice): {:?}",
                    r.cqe
                ),
            }
            if check_marker {
                if let Some(at) = find(&r.host_buffer, &MARKER) {
                    panic!(
                        "queue {which}: CID {cid} returned pool bytes no handler wrote \
                         (marker at offset {at} of {})",
                        r.host_buffer.len()
                    );
                }
            }
            self.responses += 1;
            self.successes += usize::from(r.cqe.status().is_success());
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Fills every free buffer of every pool with the marker.
fn dirty_pools(lab: &LoopbackLab) {
    for pool in lab.transport.pools() {
        let mut held = Vec::new();
        while let Some(mut buf) = pool.get() {
            let len = buf.len();
            for (i, b) in buf[..len].iter_mut().enumerate() {
                *b = MARKER[i % MARKER.len()];
            }
            held.push(buf);
        }
    }
}

fn pools_full(lab: &LoopbackLab) -> Option<(usize, u32)> {
    lab.transport
        .pools()
        .iter()
        .map(|p| (p.available(), p.count()))
        .find(|&(a, c)| a != c as usize)
}

/// A target with one subsystem (one 32 KiB RAM namespace) and a controller a Linux-like
/// host brought up (admin queue, one I/O queue).
pub fn lab() -> (LoopbackLab, HostController) {
    let mut lab = LoopbackLab::new(LIMITS);
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    (lab, ctrl)
}

/// One record of the input, or `None` at the end.
fn next_record(data: &mut &[u8]) -> Option<(u8, Capsule)> {
    if data.len() < 1 + 64 {
        return None;
    }
    let op = data[0];
    let cmd = Command::read_from_bytes(&data[1..65]).expect("64 bytes");
    *data = &data[65..];
    let len = match data {
        [a, b, ..] => usize::from(u16::from_le_bytes([*a, *b])).min(MAX_HOST_BUFFER),
        _ => 0,
    };
    *data = &data[data.len().min(2)..];
    let take = len.min(data.len());
    let mut host_buffer = data[..take].to_vec();
    // Host memory the SGL names exists even where the input ran out (zeros).
    host_buffer.resize(len, 0);
    *data = &data[take..];
    Some((op, Capsule { cmd, host_buffer }))
}

/// What an input got back, per queue (fresh A, admin, I/O, fresh B): responses and
/// successful ones. Lets tests see that the seeds reach the commands they name.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub responses: [usize; 4],
    pub successes: [usize; 4],
}

pub fn fuzz_one(data: &[u8]) {
    run(data);
}

/// Runs one input and checks every invariant (panics when one breaks).
pub fn run(data: &[u8]) -> Report {
    let (mut lab, ctrl) = lab();
    let check_marker = find(data, &MARKER).is_none();
    let HostController { admin, io, .. } = ctrl;
    let mut queues = [
        Queue::new(None),
        Queue::new(Some(admin)),
        Queue::new(io.into_iter().next()),
        Queue::new(None),
    ];
    dirty_pools(&lab);
    let mut rest = data;
    while let Some((op, capsule)) = next_record(&mut rest) {
        let which = usize::from(op & 3);
        if queues[which].host.is_none() {
            queues[which] = Queue::new(Some(lab.open_queue()));
        }
        queues[which].submit(capsule);
        if op & 4 != 0 {
            for _ in 0..8 {
                lab.pg.poll();
            }
        }
        for (i, q) in queues.iter_mut().enumerate() {
            q.drain(i, check_marker);
        }
        if op & 8 != 0 && (which == 0 || which == 3) {
            queues[which] = Queue::new(None);
        }
    }
    for _ in 0..SETTLE_POLLS {
        if lab.pg.poll() == 0 {
            break;
        }
        for (i, q) in queues.iter_mut().enumerate() {
            q.drain(i, check_marker);
        }
    }
    for (i, q) in queues.iter_mut().enumerate() {
        q.drain(i, check_marker);
    }
    let mut report = Report::default();
    for (i, q) in queues.iter().enumerate() {
        report.responses[i] = q.responses;
        report.successes[i] = q.successes;
    }
    // Every queue hangs up: whatever the commands did, every buffer must come back.
    drop(queues);
    let mut leak = pools_full(&lab);
    for _ in 0..SETTLE_POLLS {
        if leak.is_none() {
            break;
        }
        lab.pg.poll();
        leak = pools_full(&lab);
    }
    if let Some((available, count)) = leak {
        panic!("pool buffers leaked: {available} of {count} free with every queue closed");
    }
    report
}

/// Where each record's header starts (the op byte; the SQE follows, then the length).
fn record_offsets(data: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while data.len() >= at + 65 {
        offsets.push(at);
        let len_at = at + 65;
        let len = match data.get(len_at..len_at + 2) {
            Some(b) => usize::from(u16::from_le_bytes([b[0], b[1]])).min(MAX_HOST_BUFFER),
            None => 0,
        };
        at = (len_at + 2 + len).min(data.len());
    }
    offsets
}

/// Opcodes worth landing on: admin, fabrics (0x7f) and NVM I/O, plus unassigned ones.
const OPCODES: &[u8] = &[
    0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0a, 0x0c, 0x0d, 0x10, 0x11, 0x18, 0x19, 0x7c,
    0x7f, 0x80, 0x81, 0xc0, 0xff,
];
/// SGL descriptor identifiers (type << 4 | subtype): data block, bit bucket, segment, last
/// segment, keyed data block with and without invalidate, and reserved ones.
const SGL_IDS: &[u8] = &[
    0x00, 0x01, 0x10, 0x20, 0x30, 0x40, 0x4f, 0x4e, 0x50, 0x5a, 0xf0, 0xff,
];
/// Fabrics command types: Property Set/Get, Connect, Authentication, Disconnect, reserved.
const FCTYPES: &[u8] = &[0x00, 0x01, 0x04, 0x05, 0x06, 0x08, 0x0c, 0x7f, 0xff];

/// Mutates one capsule's header where parsing decides things: op byte, opcode, flags
/// (FUSE, PSDT), CID, NSID, SGL address/length/key/identifier, fabrics type, CDW10-15,
/// and the host memory length.
// The signature is the driver's StructureMutator, whose mutators may resize the input.
#[allow(clippy::ptr_arg)]
pub fn mutate(rng: &mut crate::driver::Rng, data: &mut Vec<u8>) {
    let offsets = record_offsets(data);
    if offsets.is_empty() {
        return;
    }
    let r = offsets[rng.below(offsets.len())];
    let sqe = r + 1;
    let word = |rng: &mut crate::driver::Rng| -> u32 {
        match rng.below(4) {
            0 => 0,
            1 => u32::MAX,
            2 => 1 << rng.below(32),
            _ => rng.next_u64() as u32,
        }
    };
    match rng.below(11) {
        0 => data[r] = rng.next_u64() as u8 & 0x0f,
        1 => data[sqe] = OPCODES[rng.below(OPCODES.len())],
        2 => data[sqe + 1] = [0x00, 0x40, 0x41, 0x42, 0x43, 0x80, 0xc0][rng.below(7)],
        3 => {
            let cid = [0u16, 1, 2, 0xffff, rng.next_u64() as u16][rng.below(5)];
            data[sqe + 2..sqe + 4].copy_from_slice(&cid.to_le_bytes());
        }
        4 => {
            let nsid = [0u32, 1, 2, 0xffff_ffff, 0xffff_fffe][rng.below(5)];
            data[sqe + 4..sqe + 8].copy_from_slice(&nsid.to_le_bytes());
        }
        // SGL: address (bytes 24..32), length (32..35 keyed, 32..36 unkeyed), key, identifier.
        5 => data[sqe + 39] = SGL_IDS[rng.below(SGL_IDS.len())],
        6 => {
            let v = word(rng);
            data[sqe + 32..sqe + 36].copy_from_slice(&v.to_le_bytes());
        }
        7 => {
            let v = [0u64, 1, 4096, u64::MAX, rng.next_u64()][rng.below(5)];
            data[sqe + 24..sqe + 32].copy_from_slice(&v.to_le_bytes());
        }
        8 => data[sqe + 4] = FCTYPES[rng.below(FCTYPES.len())],
        9 => {
            let dw = 10 + rng.below(6);
            let v = word(rng);
            data[sqe + dw * 4..sqe + dw * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        _ => {
            // The host memory length; the bytes of the records after it stay where they are,
            // so a longer length swallows them (as host data) and a shorter one exposes data
            // as the next record.
            let len = [0u16, 1, 15, 16, 512, 1024, 4096, 8192, 0xffff][rng.below(9)];
            if data.len() >= sqe + 66 {
                data[sqe + 64..sqe + 66].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
}

/// Encodes capsules as one input (see the module doc for the format).
pub fn encode(records: &[(u8, Capsule)]) -> Vec<u8> {
    use zerocopy::IntoBytes;
    let mut out = Vec::new();
    for (op, c) in records {
        out.push(*op);
        out.extend_from_slice(c.cmd.as_bytes());
        let len = c.host_buffer.len().min(MAX_HOST_BUFFER);
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&c.host_buffer[..len]);
    }
    out
}

/// The seed corpus: what Linux sends (Connect of an admin and an I/O queue to a fresh queue,
/// property get/set, Identify, Get Log Page, features, reads and writes with keyed and
/// in-capsule SGLs, DSM, write zeroes, flush, AER, keep-alive) and some garbage.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use nvmf_common::spec::fabrics::{
        ConnectCommand, ConnectData, PropertyGetCommand, PropertySetCommand, CNTLID_DYNAMIC,
    };
    use nvmf_common::spec::features::{FeatureId, FeatureSelect};
    use nvmf_common::spec::identify::Cns;
    use nvmf_common::spec::log_page::LogPageId;
    use nvmf_common::spec::nqn::DISCOVERY_NQN;
    use nvmf_tests::{connect_capsule, in_capsule, no_data, reading, with_buffer, HOSTNQN};
    use zerocopy::IntoBytes;
    const POLL: u8 = 4;
    const ADMIN: u8 = 1 | POLL;
    const IO: u8 = 2 | POLL;
    const FRESH: u8 = POLL;
    let admin_connect = |cid, subnqn: &str| {
        (
            FRESH,
            connect_capsule(cid, 0, 31, 5000, CNTLID_DYNAMIC, subnqn, HOSTNQN),
        )
    };
    let mut seeds = vec![
        ("connect-admin", encode(&[admin_connect(1, NQN)])),
        (
            "connect-admin-then-enable",
            encode(&[
                admin_connect(1, NQN),
                (
                    FRESH,
                    no_data(PropertyGetCommand::new(2, 0x0, true).to_command()),
                ),
                (
                    FRESH,
                    no_data(PropertySetCommand::new(3, 0x14, 0x0046_0001, false).to_command()),
                ),
                (
                    FRESH,
                    no_data(PropertyGetCommand::new(4, 0x1c, false).to_command()),
                ),
                (
                    FRESH,
                    reading(Command::identify(5, Cns::CONTROLLER, 0, 0), 4096),
                ),
            ]),
        ),
        (
            "connect-io-queue-to-controller-1",
            encode(&[(3 | POLL, connect_capsule(1, 1, 127, 0, 1, NQN, HOSTNQN))]),
        ),
        (
            "connect-discovery",
            encode(&[
                admin_connect(1, DISCOVERY_NQN),
                (
                    FRESH,
                    reading(
                        Command::get_log_page(2, 0, LogPageId::DISCOVERY, 4096, 0),
                        4096,
                    ),
                ),
            ]),
        ),
        (
            "connect-short-data",
            encode(&[(
                FRESH,
                with_buffer(
                    ConnectCommand::new(1, 0, 31, 0).to_command(),
                    ConnectData::new([1; 16], CNTLID_DYNAMIC, NQN, HOSTNQN).as_bytes()[..512]
                        .to_vec(),
                ),
            )]),
        ),
        (
            "identify-all",
            encode(&[
                (
                    ADMIN,
                    reading(Command::identify(200, Cns::CONTROLLER, 0, 0), 4096),
                ),
                (
                    ADMIN,
                    reading(Command::identify(201, Cns::NAMESPACE, 1, 0), 4096),
                ),
                (
                    ADMIN,
                    reading(
                        Command::identify(202, Cns::ACTIVE_NAMESPACE_LIST, 0, 0),
                        4096,
                    ),
                ),
                (
                    ADMIN,
                    reading(
                        Command::identify(203, Cns::NAMESPACE_ID_DESCRIPTOR_LIST, 1, 0),
                        4096,
                    ),
                ),
                (
                    ADMIN,
                    reading(Command::identify(204, Cns::CONTROLLER, 0, 0), 100),
                ),
            ]),
        ),
        (
            "logs-and-features",
            encode(&[
                (
                    ADMIN,
                    reading(
                        Command::get_log_page(210, 0xffff_ffff, LogPageId::SMART_HEALTH, 512, 0),
                        512,
                    ),
                ),
                (
                    ADMIN,
                    reading(
                        Command::get_log_page(211, 0, LogPageId::ERROR_INFORMATION, 64, 0),
                        64,
                    ),
                ),
                (
                    ADMIN,
                    no_data(Command::get_features(
                        212,
                        FeatureId::NUMBER_OF_QUEUES,
                        FeatureSelect::CURRENT,
                    )),
                ),
                (
                    ADMIN,
                    reading(
                        Command::get_features(
                            213,
                            FeatureId::HOST_IDENTIFIER,
                            FeatureSelect::SUPPORTED_CAPABILITIES,
                        ),
                        16,
                    ),
                ),
                (ADMIN, no_data(Command::async_event_request(214))),
                (ADMIN, no_data(Command::keep_alive(215))),
            ]),
        ),
        (
            "io-keyed",
            encode(&[
                (
                    IO,
                    with_buffer(Command::write(300, 1, 0, 8), vec![0x42; 4096]),
                ),
                (IO, reading(Command::read(301, 1, 0, 8), 4096)),
                (IO, reading(Command::read(302, 1, 60, 8), 4096)),
                (IO, no_data(Command::flush(303, 1))),
            ]),
        ),
        (
            "io-in-capsule",
            encode(&[
                (
                    IO,
                    in_capsule(Command::write(310, 1, 2, 1), vec![0x17; 512]),
                ),
                (
                    IO,
                    in_capsule(Command::write(311, 1, 3, 8), vec![0x18; 4096]),
                ),
                (IO, reading(Command::compare(312, 1, 2, 1), 512)),
                (IO, no_data(Command::write_zeroes(313, 1, 0, 16, true))),
                (
                    IO,
                    in_capsule(Command::dsm(314, 1, 1, true), {
                        let mut r = vec![0u8; 16];
                        r[4..8].copy_from_slice(&16u32.to_le_bytes());
                        r
                    }),
                ),
            ]),
        ),
        (
            "io-burst-no-poll",
            encode(
                &(0..12)
                    .map(|i| (2, reading(Command::read(400 + i, 1, 0, 8), 4096)))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "hang-up-mid-connect",
            encode(&[(
                FRESH | 8,
                connect_capsule(1, 0, 31, 0, CNTLID_DYNAMIC, NQN, HOSTNQN),
            )]),
        ),
    ];
    let mut garbage = vec![0xffu8; 65 + 2 + 64];
    garbage[0] = ADMIN;
    seeds.push(("garbage-ff", garbage));
    seeds.push(("garbage-zero", vec![0u8; 3 * 67]));
    seeds
}

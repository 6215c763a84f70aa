//! No byte a handler did not write ever leaves the target.
//!
//! Data buffers come from one pool per reactor and pass from host to host. Before every probe
//! the test pushes a marker pattern through every buffer of the pool with writes, then sends an
//! admin command (every opcode; Identify with every CNS; Get Log Page with every LID; Get
//! Features with every FID and SEL; odd and oversized lengths) to an NVM and to a discovery
//! controller, and searches the returned host memory for the marker. The Host Identifier with
//! SEL = 011b once returned 16 bytes of another host's I/O this way.

use nvmf_common::spec::command::Command;
use nvmf_common::spec::features::FeatureId;
use nvmf_common::spec::nqn::DISCOVERY_NQN;
use nvmf_common::spec::sgl::SglDescriptor;
use nvmf_common::spec::Status;
use nvmf_target::transport::TransportLimits;
use nvmf_tests::*;
use zerocopy::byteorder::little_endian::U32;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const MARKER: [u8; 8] = [0xDE, 0xAD, 0xBE, 0xEF, 0x5A, 0xC3, 0x96, 0x69];
/// Bytes of each pool buffer the pattern covers: more than any admin probe asks for.
const DIRTY_LEN: usize = 16 * 1024;
/// A small pool (queue depth 8: 16 buffers), so refilling it before every probe is cheap.
const LIMITS: TransportLimits = TransportLimits {
    max_queue_depth: 8,
    ..LOOPBACK_LIMITS
};
const POOL_BUFFERS: usize = 16;
/// What the host's buffer holds before the command: the target may leave it alone (oversized
/// SGL, failed command) but must never put the marker there.
const HOST_FILL: u8 = 0x00;

struct Rig {
    lab: LoopbackLab,
    nvm: HostController,
    disc: HostController,
    dirty: Vec<u8>,
    probes: usize,
}

impl Rig {
    fn new() -> Self {
        let mut lab = LoopbackLab::new(LIMITS);
        lab.malloc("Malloc0", 1024, 512);
        lab.subsystem(NQN, &["Malloc0"]);
        let nvm = linux_bring_up(&mut lab, NQN, 1);
        let disc = linux_bring_up(&mut lab, DISCOVERY_NQN, 0);
        let dirty = MARKER.iter().copied().cycle().take(DIRTY_LEN).collect();
        Self {
            lab,
            nvm,
            disc,
            dirty,
            probes: 0,
        }
    }

    /// Every buffer of the pool now starts with the marker. (Keep-alives first: the sweeps
    /// outlast the controllers' 5 s KATO.)
    fn dirty_the_pool(&mut self) {
        for ctrl in [&mut self.nvm, &mut self.disc] {
            let cid = ctrl.cid();
            expect_ok(&ctrl.admin(&mut self.lab, no_data(admin(0x18, 0, 0, 0).with_cid(cid))));
        }
        for _ in 0..POOL_BUFFERS {
            let cid = self.nvm.cid();
            let write = Command::write(cid, 1, 0, (DIRTY_LEN / 512) as u32);
            expect_ok(
                &self
                    .nvm
                    .io(&mut self.lab, 0, with_buffer(write, self.dirty.clone())),
            );
        }
    }

    /// Sends `cmd` to the admin queue of the NVM (or discovery) controller with `sgl_len`
    /// bytes of host memory and checks that none of the returned bytes is the marker.
    fn probe(&mut self, discovery: bool, mut cmd: Command, sgl_len: u32, what: &str) -> Status {
        self.dirty_the_pool();
        let ctrl = if discovery {
            &mut self.disc
        } else {
            &mut self.nvm
        };
        cmd.cid = ctrl.cid().into();
        let mut capsule = with_buffer(cmd, vec![HOST_FILL; sgl_len as usize]);
        capsule.cmd.dptr = SglDescriptor::keyed(0x1000, sgl_len, 0x1234, false);
        let r = ctrl.admin(&mut self.lab, capsule);
        self.probes += 1;
        if let Some(at) = find_marker(&r.host_buffer) {
            panic!(
                "{what} (discovery: {discovery}, SGL {sgl_len} bytes, status {:?}) returned \
                 another command's bytes at offset {at}",
                r.cqe.status()
            );
        }
        r.cqe.status()
    }
}

/// The offset of any 4 consecutive bytes of the marker stream, at any phase.
fn find_marker(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| {
        (0..MARKER.len()).any(|phase| (0..4).all(|i| w[i] == MARKER[(phase + i) % MARKER.len()]))
    })
}

trait WithCid {
    fn with_cid(self, cid: u16) -> Self;
}

impl WithCid for Command {
    fn with_cid(mut self, cid: u16) -> Self {
        self.cid = cid.into();
        self
    }
}

fn admin(opcode: u8, nsid: u32, cdw10: u32, cdw11: u32) -> Command {
    let mut c = Command::new(opcode, 0, nsid);
    c.cdw10 = U32::new(cdw10);
    c.cdw11 = U32::new(cdw11);
    c
}

/// A null bdev's reads are zeroes it need not write again while the buffer stays zero
/// (`IoBuf::zero_fill`); a buffer another host's write went through must be zeroed again.
/// Writes to the null namespace leave the marker in the pool buffers; every read after them,
/// and after reads that reused zeroed buffers, must come back all zero.
#[test]
fn null_reads_never_return_bytes_a_write_left_in_the_pool() {
    let mut rig = Rig::new();
    rig.lab.null("Null0", 1024, 512);
    rig.lab
        .target
        .add_namespace(
            NQN,
            nvmf_target::target::NamespaceOptions {
                bdev_name: "Null0".into(),
                ..Default::default()
            },
        )
        .unwrap();
    rig.lab.pg.poll();
    for round in 0..3 {
        rig.dirty_the_pool();
        // Twice the pool: the second pass reuses buffers the first pass zeroed.
        for i in 0..2 * POOL_BUFFERS {
            let cid = rig.nvm.cid();
            let read = Command::read(cid, 2, 0, (DIRTY_LEN / 512) as u32);
            let r = rig.nvm.io(&mut rig.lab, 0, reading(read, DIRTY_LEN));
            expect_ok(&r);
            assert!(
                r.host_buffer.iter().all(|&b| b == 0),
                "round {round}, read {i}: a null read returned non-zero bytes"
            );
        }
    }
}

#[test]
fn the_probe_sees_a_leak_when_there_is_one() {
    // The detector itself: the pattern in a buffer is found at any phase.
    let mut buf = vec![0u8; 64];
    buf[21..25].copy_from_slice(&[0x5A, 0xC3, 0x96, 0x69]);
    assert_eq!(find_marker(&buf), Some(21));
    assert_eq!(find_marker(&[0u8; 64]), None);
    // And the pool really is dirty: a read of what the writes left shows the marker.
    let mut rig = Rig::new();
    rig.dirty_the_pool();
    let cid = rig.nvm.cid();
    let r = rig
        .nvm
        .io(&mut rig.lab, 0, reading(Command::read(cid, 1, 0, 8), 4096));
    assert_eq!(find_marker(&r.host_buffer), Some(0));
}

#[test]
fn host_identifier_with_every_select_returns_no_stale_bytes() {
    let mut rig = Rig::new();
    for discovery in [false, true] {
        for sel in 0..4u32 {
            for len in [0u32, 16, 17, 4096] {
                let cmd = admin(
                    0x0A,
                    0,
                    u32::from(FeatureId::HOST_IDENTIFIER.0) | sel << 8,
                    0,
                );
                rig.probe(discovery, cmd, len, "Get Features Host Identifier");
            }
        }
    }
}

#[test]
fn every_identify_cns_returns_no_stale_bytes() {
    let mut rig = Rig::new();
    for discovery in [false, true] {
        for cns in 0..=0x20u32 {
            for nsid in [0u32, 1, 2, 0xFFFF_FFFF] {
                for len in [4096u32, 4096 + 12] {
                    rig.probe(discovery, admin(0x06, nsid, cns, 0), len, "Identify");
                }
            }
        }
    }
}

#[test]
fn every_log_page_and_length_returns_no_stale_bytes() {
    let mut rig = Rig::new();
    for discovery in [false, true] {
        for lid in 0..=0xFFu32 {
            for (len, offset) in [(4u32, 0u32), (12, 4), (516, 0), (4096, 0), (64, 4000)] {
                let numd = len / 4 - 1;
                let mut cmd = admin(0x02, 0xFFFF_FFFF, lid | (numd & 0xFFFF) << 16, numd >> 16);
                cmd.cdw12 = U32::new(offset);
                // Every length twice: as asked, and with a longer SGL than the transfer.
                rig.probe(discovery, cmd, len, "Get Log Page");
                rig.probe(discovery, cmd, len + 100, "Get Log Page");
            }
        }
    }
}

#[test]
fn every_feature_and_select_returns_no_stale_bytes() {
    let mut rig = Rig::new();
    for discovery in [false, true] {
        for fid in 0..=0xFFu32 {
            for sel in 0..8u32 {
                for len in [0u32, 16, 4096] {
                    let cmd = admin(0x0A, 1, fid | sel << 8, 0);
                    rig.probe(discovery, cmd, len, "Get Features");
                }
            }
        }
    }
}

#[test]
fn every_other_admin_opcode_returns_no_stale_bytes() {
    let mut rig = Rig::new();
    // Left out: Set Features (0x09) and Fabrics (0x7F) change the controller under the test
    // (KATO, CC); Asynchronous Event Request (0x0C) completes only on an event.
    for opcode in (0..=0xFFu8).filter(|op| ![0x09, 0x0C, 0x7F].contains(op)) {
        for discovery in [false, true] {
            for len in [0u32, 8, 4096] {
                rig.probe(discovery, admin(opcode, 1, 0x12, 0x34), len, "admin opcode");
            }
        }
    }
    assert!(rig.probes > 1000);
}

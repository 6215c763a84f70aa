//! Block-layer discard as the Linux host sends it, and SGLs that describe more host memory
//! than the command moves (Identify SGLS bit 18).
//!
//! Linux's `nvme_setup_discard` (drivers/nvme/host/core.c, since 5.5) always hands the
//! transport a 4 KiB range buffer, room for the 256 ranges a Dataset Management command can
//! carry, however few ranges NR names. nvme-rdma puts that whole buffer in the capsule when
//! the queue's in-capsule size allows (4 KiB here, as with SPDK's default), otherwise behind a
//! keyed SGL with the Invalidate subtype. Either way the SGL says 4096 bytes while the command
//! needs (NR + 1) * 16.

use std::sync::Arc;

use nvmf_common::spec::command::{Command, DsmRange};
use nvmf_common::spec::identify::SGLS_OVERSIZED;
use nvmf_common::spec::sgl::SglDescriptor;
use nvmf_common::spec::Status;
use nvmf_tests::watched_bdev::WatchedMalloc;
use nvmf_tests::*;
use zerocopy::IntoBytes;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
/// Linux's range buffer: sizeof(struct nvme_dsm_range) * NVME_DSM_MAX_RANGES.
const LINUX_DSM_BUFFER: usize = 16 * 256;
const BS: usize = 4096;
const BLOCKS: u64 = 1024;

fn lab() -> LoopbackLab {
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", BLOCKS, BS as u32);
    lab.subsystem(NQN, &["Malloc0"]);
    lab
}

/// The range buffer Linux builds: `ranges` first, zeroes up to 4 KiB.
fn linux_range_buffer(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut buf = vec![0u8; LINUX_DSM_BUFFER];
    for (i, &(slba, nlb)) in ranges.iter().enumerate() {
        let mut r = DsmRange::default();
        r.slba.set(slba);
        r.nlb.set(nlb);
        buf[i * 16..(i + 1) * 16].copy_from_slice(r.as_bytes());
    }
    buf
}

/// A Dataset Management (Deallocate) capsule byte for byte as nvme-rdma sends a block-layer
/// discard: SGL flag, NR = ranges - 1, AD, and either in-capsule data (SGL data block, offset
/// subtype, offset 0 = ICDOFF, length 4096) or a keyed SGL of 4096 bytes with the Invalidate
/// subtype (0x4F).
fn linux_discard(cid: u16, ranges: &[(u64, u32)], keyed: bool) -> Capsule {
    let mut cmd = Command::dsm(cid, 1, ranges.len() as u32, true);
    cmd.flags |= Command::FLAG_SGL;
    let host_buffer = linux_range_buffer(ranges);
    cmd.dptr = if keyed {
        SglDescriptor::keyed(0x7f00_0000, LINUX_DSM_BUFFER as u32, 0x5a5a, true)
    } else {
        SglDescriptor::in_capsule(0, LINUX_DSM_BUFFER as u32)
    };
    Capsule { cmd, host_buffer }
}

fn fill(lab: &mut LoopbackLab, ctrl: &mut HostController, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..BLOCKS as usize * BS)
        .map(|i| ((i / BS) as u8 ^ seed) | 1)
        .collect();
    for chunk in 0..(BLOCKS / 32) {
        let cid = ctrl.cid();
        let part = data[chunk as usize * 32 * BS..(chunk as usize + 1) * 32 * BS].to_vec();
        expect_ok(&ctrl.io(
            lab,
            0,
            with_buffer(Command::write(cid, 1, chunk * 32, 32), part),
        ));
    }
    data
}

fn read_all(lab: &mut LoopbackLab, ctrl: &mut HostController) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCKS as usize * BS);
    for chunk in 0..(BLOCKS / 32) {
        let cid = ctrl.cid();
        let r = ctrl.io(
            lab,
            0,
            reading(Command::read(cid, 1, chunk * 32, 32), 32 * BS),
        );
        out.extend_from_slice(&expect_ok_data(&r));
    }
    out
}

fn expect_ok_data(r: &Response) -> Vec<u8> {
    expect_ok(r);
    r.host_buffer.clone()
}

/// Deallocated blocks read as zeroes (DLFEAT); every other block keeps its data.
fn assert_only_deallocated(after: &[u8], before: &[u8], ranges: &[(u64, u32)]) {
    for block in 0..BLOCKS {
        let gone = ranges
            .iter()
            .any(|&(slba, nlb)| block >= slba && block < slba + u64::from(nlb));
        let at = block as usize * BS..(block as usize + 1) * BS;
        if gone {
            assert!(
                after[at].iter().all(|&b| b == 0),
                "block {block} was discarded"
            );
        } else {
            assert_eq!(
                after[at.clone()],
                before[at],
                "block {block} was not discarded"
            );
        }
    }
}

#[test]
fn linux_block_layer_discard_in_capsule_and_keyed() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    // blkdiscard -o 0 -l 1 MiB: one range of 256 blocks; then a single 4 KiB block; then
    // the multi-range form (max_discard_segments > 1) with ranges out of order.
    let cases: [&[(u64, u32)]; 3] = [&[(0, 256)], &[(300, 1)], &[(900, 8), (512, 16), (700, 3)]];
    for keyed in [false, true] {
        for ranges in cases {
            let before = fill(&mut lab, &mut ctrl, keyed as u8 + 7);
            let cid = ctrl.cid();
            let r = ctrl.io(&mut lab, 0, linux_discard(cid, ranges, keyed));
            assert_eq!(
                r.cqe.status(),
                Status::SUCCESS,
                "discard {ranges:?} (keyed: {keyed}) as Linux sends it"
            );
            let after = read_all(&mut lab, &mut ctrl);
            assert_only_deallocated(&after, &before, ranges);
        }
    }
}

#[test]
fn dsm_sgl_shorter_than_its_ranges_is_still_refused() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    let before = fill(&mut lab, &mut ctrl, 3);
    // NR says two ranges (32 bytes) but the SGL carries only one.
    let mut capsule = linux_discard(ctrl.cid(), &[(0, 8), (16, 8)], false);
    capsule.host_buffer.truncate(16);
    capsule.cmd.dptr = SglDescriptor::in_capsule(0, 16);
    let r = ctrl.io(&mut lab, 0, capsule);
    assert_eq!(r.cqe.status(), Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    assert_eq!(
        read_all(&mut lab, &mut ctrl),
        before,
        "nothing was deallocated"
    );
    // More in-capsule data than the capsule can hold.
    let mut capsule = linux_discard(ctrl.cid(), &[(0, 8)], false);
    capsule.cmd.dptr = SglDescriptor::in_capsule(0, LINUX_DSM_BUFFER as u32 + 16);
    capsule.host_buffer.resize(LINUX_DSM_BUFFER + 16, 0);
    let r = ctrl.io(&mut lab, 0, capsule);
    assert_eq!(r.cqe.status(), Status::DATA_SGL_LENGTH_INVALID.with_dnr());
}

#[test]
fn oversized_sgls_move_exactly_the_transfer() {
    let mut lab = lab();
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);
    assert_ne!(
        ctrl.identify.sgls.get() & SGLS_OVERSIZED,
        0,
        "Identify SGLS bit 18 tells hosts a longer SGL is fine"
    );
    // A write whose keyed SGL describes two blocks of host memory but NLB is one: only the
    // first block lands.
    let mut host = vec![0xAB; BS];
    host.extend(vec![0xCD; BS]);
    let cid = ctrl.cid();
    expect_ok(&ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 10, 1), host),
    ));
    // A read into a buffer three blocks long: the target writes one block, the rest of the
    // host's memory stays as the host left it.
    let cid = ctrl.cid();
    let mut capsule = with_buffer(Command::read(cid, 1, 10, 2), vec![0xEE; 3 * BS]);
    capsule.cmd.dptr = SglDescriptor::keyed(0x1000, 3 * BS as u32, 0x1234, false);
    let r = ctrl.io(&mut lab, 0, capsule);
    let back = expect_ok_data(&r);
    assert!(back[..BS].iter().all(|&b| b == 0xAB));
    assert!(back[2 * BS..].iter().all(|&b| b == 0xEE));
    // Shorter than the transfer is refused.
    let cid = ctrl.cid();
    let r = ctrl.io(
        &mut lab,
        0,
        with_buffer(Command::write(cid, 1, 12, 2), vec![0; BS]),
    );
    assert_eq!(r.cqe.status(), Status::DATA_SGL_LENGTH_INVALID.with_dnr());
}

/// A host that repeats one range, or overlaps its ranges, in a Deallocate gets each block
/// deallocated once: 256 copies of the whole namespace in one 4 KiB command must not cost
/// the backend 256 passes over the device (AIO writes zeroes for each).
#[test]
fn overlapping_and_repeated_ranges_deallocate_each_block_once() {
    let mut lab = LoopbackLab::default();
    let disk = Arc::new(WatchedMalloc::new(
        "Counted0",
        BLOCKS,
        BS as u32,
        usize::MAX,
    ));
    let watch = Arc::clone(&disk.watch);
    lab.target.bdevs.register(disk).unwrap();
    lab.subsystem(NQN, &["Counted0"]);
    let mut ctrl = linux_bring_up(&mut lab, NQN, 1);

    let whole = [(0, BLOCKS as u32); 256];
    let cid = ctrl.cid();
    let r = ctrl.io(&mut lab, 0, linux_discard(cid, &whole, false));
    assert_eq!(r.cqe.status(), Status::SUCCESS);
    assert_eq!(watch.unmaps(), (1, BLOCKS), "256 copies of the namespace");

    let overlapping: &[(u64, u32)] = &[(100, 4), (0, 10), (5, 10), (100, 1), (15, 1), (900, 2)];
    let before = fill(&mut lab, &mut ctrl, 3);
    let (unmaps0, blocks0) = watch.unmaps();
    let cid = ctrl.cid();
    let r = ctrl.io(&mut lab, 0, linux_discard(cid, overlapping, true));
    assert_eq!(r.cqe.status(), Status::SUCCESS);
    let (unmaps1, blocks1) = watch.unmaps();
    assert_eq!(
        (unmaps1 - unmaps0, blocks1 - blocks0),
        (3, 16 + 4 + 2),
        "blocks 0..16, 100..104 and 900..902"
    );
    let after = read_all(&mut lab, &mut ctrl);
    assert_only_deallocated(&after, &before, overlapping);
}

/// A host deallocating most of a RAM disk in one command (256 disjoint ranges of 252 KiB,
/// 63 MiB) does not hold the reactor: another host's read, sent right after it, is answered
/// while the deallocation is still under way, and the deallocation completes after.
#[test]
fn deallocating_a_whole_disk_does_not_hold_up_another_hosts_read() {
    const BIG_BLOCKS: u64 = 16 * 1024;
    let mut lab = LoopbackLab::default();
    lab.malloc("Big0", BIG_BLOCKS, BS as u32);
    lab.subsystem(NQN, &["Big0"]);
    let mut a = linux_bring_up(&mut lab, NQN, 1);
    let mut b = linux_bring_up(&mut lab, NQN, 1);
    // Block 64 (in a range) and the last block (in a gap) hold data.
    for block in [64, BIG_BLOCKS - 1] {
        let cid = a.cid();
        expect_ok(&a.io(
            &mut lab,
            0,
            with_buffer(Command::write(cid, 1, block, 1), vec![7; BS]),
        ));
    }
    let ranges: Vec<(u64, u32)> = (0..256).map(|i| (i * 64, 63)).collect();
    let cid = a.cid();
    a.io[0].submit(linux_discard(cid, &ranges, false));
    let cid = b.cid();
    b.io[0].submit(reading(Command::read(cid, 1, BIG_BLOCKS - 1, 1), BS));
    let (mut read, mut discard) = (None, None);
    let mut polls = 0;
    while discard.is_none() {
        lab.pg.poll();
        polls += 1;
        assert!(polls < 100_000, "the deallocation never completed");
        if let Some(r) = b.io[0].poll() {
            assert!(
                discard.is_none(),
                "the read waited for the whole deallocation"
            );
            read = Some((r, polls));
        }
        if let Some(r) = a.io[0].poll() {
            discard = Some(r);
        }
    }
    let (read, read_at) = read.expect("the read was answered first");
    assert_eq!(
        expect_ok_data(&read),
        vec![7; BS],
        "beyond the ranges: untouched"
    );
    assert!(read_at <= 2, "answered at poll {read_at}");
    assert!(polls >= 63, "63 MiB in 1 MiB slices: {polls} polls");
    assert_eq!(discard.unwrap().cqe.status(), Status::SUCCESS);
    // The ranges are clear, the gaps between them not.
    let cid = b.cid();
    let r = b.io(&mut lab, 0, reading(Command::read(cid, 1, 63, 2), 2 * BS));
    let data = expect_ok_data(&r);
    assert_eq!(data[..BS], [0; BS], "block 63: a gap, never written");
    assert_eq!(data[BS..], [0; BS], "block 64: deallocated");
    let cid = b.cid();
    let r = b.io(
        &mut lab,
        0,
        reading(Command::read(cid, 1, BIG_BLOCKS - 1, 1), BS),
    );
    assert_eq!(
        expect_ok_data(&r),
        vec![7; BS],
        "the last block is in a gap"
    );
}

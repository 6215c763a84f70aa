//! Latency histograms of I/O a memory bdev completes in the step that received it, over the
//! real RDMA transport on the simulated fabric: the turn's clock cannot time such an I/O, so
//! its latency is taken at the reactor's next clock reading, and every I/O of a turn counts.

use std::time::Duration;

use nvmf_target::core::latency::NamespaceLatency;
use nvmf_tests::sim::*;

const BLOCK: usize = 512;

/// Issue 14: a turn's inline completions wait for the next clock reading as one entry per
/// namespace and kind, with a count. Each I/O still counts once in `bdev_get_iostat`'s
/// histograms, and each is timed from the turn that received it, never as zero.
#[test]
fn every_io_completed_inline_in_a_turn_counts_once_with_a_non_zero_latency() {
    let mut lab = SimLab::new(21);
    let host = lab.fabric.add_host(host_ip(1));
    let (mut admin, cntlid) = admin_queue(&mut lab, &host);
    let mut io = io_queue(&mut lab, &host, cntlid, 32, 32 * 4096);
    lab.run_for(Duration::from_millis(1), Duration::from_micros(100));

    // Reads and in-capsule writes mixed, all sent before the target's next turn: the kinds
    // alternate, so the turn holds several entries, and runs of one kind merge.
    let (reads, writes) = (12u16, 6u16);
    for i in 0..reads + writes {
        let cid = i + 1;
        let lba = u64::from(i) * 8;
        if i % 3 == 2 {
            io.submit(
                write_cmd(cid, lba, 2),
                Data::InCapsule {
                    offset: usize::from(i) * 4096,
                    len: 2 * BLOCK as u32,
                },
            );
        } else {
            io.submit(read_cmd(cid, lba, 8), keyed(usize::from(i) * 4096, 4096));
        }
    }
    let mut done = Vec::new();
    lab.until(20_000, |_| {
        done.extend(io.poll());
        done.len() == usize::from(reads + writes)
    });
    assert!(done.iter().all(|c| c.status().is_success()), "{done:?}");
    // One more clock reading records what the last turn left waiting.
    lab.run_for(Duration::from_micros(10), Duration::from_micros(1));

    // Summed over the reactors, as `bdev_get_iostat` does.
    let mut h = NamespaceLatency::default();
    for pg in &lab.pgs {
        for (nqn, nsid, l) in pg.core.namespace_latencies() {
            assert_eq!((nqn.as_str(), nsid), (SUBNQN, 1));
            h.read.merge(&l.read);
            h.write.merge(&l.write);
        }
    }
    for (kind, hist, n) in [("read", &h.read, reads), ("write", &h.write, writes)] {
        assert_eq!(hist.count(), u64::from(n), "{kind}s counted: {hist:?}");
        assert!(
            hist.min_ns > 0,
            "a {kind} timed as taking no time: {hist:?}"
        );
        assert!(
            hist.sum_ns >= u64::from(n) * hist.min_ns && hist.sum_ns <= u64::from(n) * hist.max_ns,
            "{kind} latency sum outside count x [min, max]: {hist:?}"
        );
    }

    io.disconnect();
    admin.disconnect();
    lab.assert_drained();
}

//! Compare reads the media into a buffer of a per-reactor pool and holds it until the read
//! completes. A host keeping more Compares in flight than the pool has buffers, on slow
//! media, must delay another host's Compares, never fail them: Command Interrupted (what
//! the target answered when the pool was empty) is retried by Linux five times at once and
//! then fails the I/O.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::spec::command::Command;
use nvmf_common::spec::Status;
use nvmf_target::bdev::DelayBdev;
use nvmf_tests::*;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
/// More than the reactor's 32 Compare buffers.
const NOISY_COMPARES: usize = 48;

/// Polls the target until `want` responses have come on `q`, in real time (the bdev's
/// latency is real).
fn responses(lab: &mut LoopbackLab, q: &LoopbackHostQueue, want: usize) -> Vec<Status> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} responses after 20 s",
            got.len()
        );
        lab.pg.poll();
        while let Some(r) = q.poll() {
            got.push(r.cqe.status());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    got
}

/// A namespace on a disk that takes 20 ms per read (the Compares hold every buffer for a
/// while), a noisy and a quiet host, and the noisy host's Compares sent (they match: the
/// media is zeroes).
fn noisy_compares() -> (LoopbackLab, HostController, HostController) {
    let mut lab = LoopbackLab::default();
    let base = lab.malloc("Base", 64, 512);
    let slow = DelayBdev::new("Slow", base, None, 20_000, 20_000, 0, 0);
    lab.target.bdevs.register(Arc::new(slow)).unwrap();
    lab.subsystem(NQN, &["Slow"]);
    let mut noisy = linux_bring_up_as(&mut lab, NQN, 1, "nqn.2014-08.org.example:noisy");
    let quiet = linux_bring_up_as(&mut lab, NQN, 1, "nqn.2014-08.org.example:quiet");
    for _ in 0..NOISY_COMPARES {
        let cid = noisy.cid();
        noisy.io[0].submit(in_capsule(Command::compare(cid, 1, 0, 1), vec![0; 512]));
    }
    lab.pg.poll();
    (lab, noisy, quiet)
}

#[test]
fn one_hosts_compares_on_slow_media_delay_but_never_fail_anothers() {
    let (mut lab, noisy, mut quiet) = noisy_compares();
    let cid = quiet.cid();
    quiet.io[0].submit(in_capsule(Command::compare(cid, 1, 0, 1), vec![0; 512]));

    let quiet_status = responses(&mut lab, &quiet.io[0], 1);
    assert_eq!(quiet_status, [Status::SUCCESS], "the quiet host's Compare");
    let noisy_statuses = responses(&mut lab, &noisy.io[0], NOISY_COMPARES);
    assert!(
        noisy_statuses.iter().all(|s| *s == Status::SUCCESS),
        "the noisy host's own Compares: {noisy_statuses:?}"
    );
    // A Compare that differs still fails as it should after waiting.
    let cid = quiet.cid();
    let r = quiet.io(
        &mut lab,
        0,
        in_capsule(Command::compare(cid, 1, 0, 1), vec![1; 512]),
    );
    assert_eq!(r.cqe.status(), Status::COMPARE_FAILURE.with_dnr());
}

/// A host that goes away with Compares waiting for a buffer: they end with its queue (no
/// slot is held for ever, the queue is reaped), and the other host is served.
#[test]
fn compares_waiting_for_a_buffer_end_with_their_queue() {
    let (mut lab, noisy, mut quiet) = noisy_compares();
    drop(noisy);
    let cid = quiet.cid();
    quiet.io[0].submit(in_capsule(Command::compare(cid, 1, 0, 1), vec![0; 512]));
    assert_eq!(responses(&mut lab, &quiet.io[0], 1), [Status::SUCCESS]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while lab.pg.qpair_count() > 2 {
        assert!(
            Instant::now() < deadline,
            "the gone host's queues were never reaped: {} qpairs",
            lab.pg.qpair_count()
        );
        lab.pg.poll();
        std::thread::sleep(Duration::from_micros(200));
    }
}

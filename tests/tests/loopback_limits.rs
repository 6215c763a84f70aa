//! Limits a host cannot talk its way around: a connection that never sends a successful
//! Connect is dropped after the core's connect timeout, while connected queues stay.

use std::time::{Duration, Instant};

use nvmf_common::spec::fabrics::CNTLID_DYNAMIC;
use nvmf_common::spec::Status;
use nvmf_target::core::CONNECT_TIMEOUT_MS;
use nvmf_tests::*;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

fn poll_until(lab: &mut LoopbackLab, limit: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        lab.pg.poll();
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn connections_without_a_controller_are_dropped_after_the_connect_timeout() {
    assert_eq!(CONNECT_TIMEOUT_MS, 10_000, "the documented default");
    let mut lab = LoopbackLab::default();
    lab.malloc("Malloc0", 64, 512);
    lab.subsystem(NQN, &["Malloc0"]);
    lab.pg.core.connect_timeout_ms = 200;
    // One host never says anything; one fails its Connect and stays; one connects properly.
    let silent = lab.open_queue();
    let refused = lab.open_queue();
    let r = lab.run(
        &refused,
        connect_capsule(
            1,
            0,
            31,
            0,
            CNTLID_DYNAMIC,
            "nqn.2016-06.io.spdk:nope",
            HOSTNQN,
        ),
    );
    assert_eq!(
        r.cqe.status(),
        Status::CONNECT_INVALID_PARAMETERS.with_dnr()
    );
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    assert!(
        poll_until(&mut lab, Duration::from_secs(5), || {
            silent.is_disconnected() && refused.is_disconnected()
        }),
        "queues without a controller outlived the connect timeout"
    );
    // Long past the timeout, the connected controller's queues are still there.
    std::thread::sleep(Duration::from_millis(300));
    lab.pg.poll();
    assert!(!ctrl.admin.is_disconnected());
    assert!(!ctrl.io[0].is_disconnected());
}

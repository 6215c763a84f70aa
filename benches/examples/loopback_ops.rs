//! Runs a fixed number of 4 KiB commands through the loopback transport (null bdev), for
//! instruction counts per command under callgrind:
//!
//!     cargo build --release -p nvmf-benches --examples
//!     valgrind --tool=callgrind build/release/examples/loopback_ops read 20000
//!
//! Subtract a run with 0 commands (set-up only) and divide by the command count.

use nvmf_common::spec::command::Command;
use nvmf_tests::{linux_bring_up, no_data, reading, with_buffer, LoopbackLab};

fn main() {
    let mut args = std::env::args().skip(1);
    let op = args.next().unwrap_or_else(|| "read".into());
    let count: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let mut lab = LoopbackLab::default();
    let bdev = std::sync::Arc::new(
        nvmf_target::bdev::NullBdev::new("Null0", 65_536, 4096, None).expect("null bdev"),
    );
    lab.target.bdevs.register(bdev).expect("register");
    lab.subsystem("nqn.2016-06.io.spdk:ops", &["Null0"]);
    let mut ctrl = linux_bring_up(&mut lab, "nqn.2016-06.io.spdk:ops", 1);
    let payload = vec![0x5A; 4096];
    for i in 0..count {
        // A real host sends Keep Alive within KATO; under callgrind the run is slow enough to
        // need it.
        if i % 1000 == 0 {
            let cid = ctrl.cid();
            let r = ctrl.admin(&mut lab, no_data(Command::keep_alive(cid)));
            assert!(r.cqe.status().is_success());
        }
        let cid = ctrl.cid();
        let lba = i % 65_536;
        let capsule = match op.as_str() {
            "write" => with_buffer(Command::write(cid, 1, lba, 1), payload.clone()),
            _ => reading(Command::read(cid, 1, lba, 1), 4096),
        };
        let r = ctrl.io(&mut lab, 0, capsule);
        assert!(r.cqe.status().is_success());
    }
    println!("{count} {op} commands completed");
}

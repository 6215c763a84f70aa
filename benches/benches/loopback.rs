//! Commands per second through the whole target core on the loopback transport: prepare,
//! data phase, execute on a bdev channel, completion. The fabric is out of the picture, so
//! this is the core's own cost per command.
//!
//! `cargo bench -p nvmf-benches` for timings; for instruction counts per command run the
//! bench binary under `valgrind --tool=callgrind` with `--bench loopback_qd1 --profile-time 2`
//! and divide by the command count criterion prints.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nvmf_common::spec::command::Command;
use nvmf_tests::{linux_bring_up, reading, with_buffer, HostController, LoopbackLab};

const NQN: &str = "nqn.2016-06.io.spdk:bench";

fn setup(backend: &str) -> (LoopbackLab, HostController) {
    let mut lab = LoopbackLab::default();
    match backend {
        "malloc" => {
            lab.malloc("Bench0", 65_536, 4096);
        }
        _ => {
            let bdev = std::sync::Arc::new(
                nvmf_target::bdev::NullBdev::new("Bench0", 65_536, 4096, None).unwrap(),
            );
            lab.target.bdevs.register(bdev).unwrap();
        }
    }
    lab.subsystem(NQN, &["Bench0"]);
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    (lab, ctrl)
}

fn qd1(c: &mut Criterion) {
    let mut group = c.benchmark_group("loopback_qd1");
    group.throughput(Throughput::Elements(1));
    for backend in ["null", "malloc"] {
        let (mut lab, mut ctrl) = setup(backend);
        let mut lba = 0u64;
        group.bench_function(BenchmarkId::new("read_4k", backend), |b| {
            b.iter(|| {
                let cid = ctrl.cid();
                lba = (lba + 1) % 65_536;
                ctrl.io(&mut lab, 0, reading(Command::read(cid, 1, lba, 1), 4096))
            })
        });
        group.bench_function(BenchmarkId::new("write_4k", backend), |b| {
            b.iter(|| {
                let cid = ctrl.cid();
                lba = (lba + 1) % 65_536;
                ctrl.io(
                    &mut lab,
                    0,
                    with_buffer(Command::write(cid, 1, lba, 1), vec![0x5A; 4096]),
                )
            })
        });
    }
    group.finish();
}

fn qd32(c: &mut Criterion) {
    let mut group = c.benchmark_group("loopback_qd32");
    const DEPTH: u64 = 32;
    group.throughput(Throughput::Elements(DEPTH));
    let (mut lab, mut ctrl) = setup("null");
    group.bench_function("read_4k_null", |b| {
        b.iter(|| {
            for i in 0..DEPTH {
                let cid = ctrl.cid();
                ctrl.io[0].submit(reading(Command::read(cid, 1, i, 1), 4096));
            }
            for _ in 0..DEPTH {
                lab.wait(&ctrl.io[0]);
            }
        })
    });
    group.finish();
}

criterion_group!(benches, qd1, qd32);
criterion_main!(benches);

//! Runs the fuzz targets.
//!
//!     nvmf-fuzz run TARGET SECONDS [SEED]   the seeded mutator over the seed corpus (CI)
//!     nvmf-fuzz one TARGET [FILE]           one input from FILE or stdin (afl-fuzz, replay)
//!     nvmf-fuzz seeds DIR                   writes the generated capsule seeds to DIR
//!
//! TARGET is capsule, rpc-stream, rpc-dispatch or rdma-chaos.

use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nvmf_fuzz::driver::{self, Budget};

fn usage() -> ExitCode {
    print_usage();
    ExitCode::from(64)
}

fn print_usage() {
    eprintln!(
        "usage: nvmf-fuzz run TARGET SECONDS [SEED] | nvmf-fuzz one TARGET [FILE] | nvmf-fuzz seeds DIR\n\
         targets: {}\n\
         \n\
         run: seeded structure-aware mutation for SECONDS, invariants checked after every input;\n\
         one: a single input from FILE (or stdin), as AFL++ feeds it (fuzz/afl.sh);\n\
         seeds: write the capsule seed corpus into DIR.\n\
         \n\
         Examples:\n\
         \x20 nvmf-fuzz run capsule 60           # a minute of capsule + SGL + Connect inputs\n\
         \x20 nvmf-fuzz run rpc-stream 30 42     # replay the run with seed 42\n\
         \x20 nvmf-fuzz one rpc-dispatch crash.bin\n\
         \n\
         A broken invariant panics (exit 101) after saving the input as\n\
         $TMPDIR/nvmf-fuzz-crashes/crash-SEED-N; bad arguments exit 64.",
        nvmf_fuzz::TARGETS.join(", ")
    );
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.first().map(String::as_str), Some("-h" | "--help")) {
        print_usage();
        return ExitCode::SUCCESS;
    }
    if let (Some("seeds"), Some(dir)) = (args.first().map(String::as_str), args.get(1)) {
        for (name, bytes) in nvmf_fuzz::capsule::seeds() {
            if let Err(e) = std::fs::write(std::path::Path::new(dir).join(name), bytes) {
                eprintln!("nvmf-fuzz: {dir}/{name}: {e}");
                return ExitCode::from(73);
            }
        }
        return ExitCode::SUCCESS;
    }
    let (Some(mode), Some(name)) = (args.first(), args.get(1)) else {
        return usage();
    };
    let Some(target) = nvmf_fuzz::target(name) else {
        return usage();
    };
    match mode.as_str() {
        "run" => {
            let Some(secs) = args.get(2).and_then(|s| s.parse::<u64>().ok()) else {
                return usage();
            };
            let seed = args.get(3).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_secs())
            });
            let seeds: Vec<Vec<u8>> = driver::load_corpus(&nvmf_fuzz::corpus_dir(name))
                .into_iter()
                .map(|(_, b)| b)
                .collect();
            let out = std::env::temp_dir().join("nvmf-fuzz-crashes");
            let started = Instant::now();
            let budget = Budget {
                iterations: u64::MAX,
                time: Duration::from_secs(secs),
            };
            let max_len = match name.as_str() {
                "capsule" => nvmf_fuzz::capsule::MAX_INPUT,
                // A schedule: one or two bytes a choice, at most 200 steps.
                "rdma-chaos" => 1024,
                _ => nvmf_fuzz::rpc::MAX_INPUT,
            };
            let structure = nvmf_fuzz::structure(name);
            let execs = driver::run(target, structure, &seeds, seed, budget, max_len, Some(&out));
            let secs = started.elapsed().as_secs_f64();
            println!(
                "{name}: {execs} inputs in {secs:.1} s ({:.0}/s), {} seeds, seed {seed}: no invariant broken",
                execs as f64 / secs,
                seeds.len()
            );
            ExitCode::SUCCESS
        }
        "one" => {
            let data = match args.get(2) {
                Some(path) => std::fs::read(path),
                None => {
                    let mut v = Vec::new();
                    std::io::stdin().read_to_end(&mut v).map(|_| v)
                }
            };
            match data {
                Ok(data) => {
                    target(&data);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("nvmf-fuzz: {e}");
                    ExitCode::from(66)
                }
            }
        }
        _ => usage(),
    }
}

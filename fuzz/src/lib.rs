//! Fuzz targets for the places the target reads bytes a stranger chose: command capsules
//! (SQE, SGL, in-capsule and host data, Connect data) through the loopback transport, the
//! JSON-RPC byte stream with the method handlers behind it, and whole schedules of hostile
//! RDMA hosts against the real RDMA transport over the simulated fabric (`rdma-chaos`: the
//! bytes choose connects, capsules, garbage, stalls, disconnects and time jumps).
//!
//! Each target is one `fn fuzz_one(data: &[u8])` that panics when an invariant breaks. Two
//! engines run them: the built-in seeded mutator ([`driver`], a bounded `cargo test` and
//! `fuzz/run.sh` in CI; stable Rust, no instrumentation) and, later, AFL++ through the
//! `nvmf-fuzz` binary, which runs one input from a file or stdin the way `afl-fuzz` calls it.
#![forbid(unsafe_code)]

pub mod capsule;
pub mod driver;
pub mod rpc;

/// A fuzz target by name (`capsule`, `rpc-stream`, `rpc-dispatch`).
pub fn target(name: &str) -> Option<fn(&[u8])> {
    match name {
        "capsule" => Some(capsule::fuzz_one),
        "rpc-stream" => Some(rpc::fuzz_stream),
        "rpc-dispatch" => Some(rpc::fuzz_dispatch),
        "rdma-chaos" => Some(nvmf_tests::chaos::run_bytes),
        _ => None,
    }
}

/// The structure-aware mutation of a target, if it has one.
pub fn structure(name: &str) -> Option<driver::StructureMutator> {
    (name == "capsule").then_some(capsule::mutate as driver::StructureMutator)
}

pub const TARGETS: &[&str] = &["capsule", "rpc-stream", "rpc-dispatch", "rdma-chaos"];

/// The seed corpus of a target, from `fuzz/corpus/<dir>`.
pub fn corpus_dir(name: &str) -> std::path::PathBuf {
    let dir = match name {
        "capsule" => "capsule",
        "rdma-chaos" => "rdma-chaos",
        _ => "rpc",
    };
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(dir)
}

//! Fuzz targets for the two places the target reads bytes a stranger chose: command capsules
//! (SQE, SGL, in-capsule and host data, Connect data) through the loopback transport, and the
//! JSON-RPC byte stream with the method handlers behind it.
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
        _ => None,
    }
}

/// The structure-aware mutation of a target, if it has one.
pub fn structure(name: &str) -> Option<driver::StructureMutator> {
    (name == "capsule").then_some(capsule::mutate as driver::StructureMutator)
}

pub const TARGETS: &[&str] = &["capsule", "rpc-stream", "rpc-dispatch"];

/// The seed corpus of a target, from `fuzz/corpus/<dir>`.
pub fn corpus_dir(name: &str) -> std::path::PathBuf {
    let dir = if name == "capsule" { "capsule" } else { "rpc" };
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(dir)
}

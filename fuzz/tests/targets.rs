//! Every fuzz target over its seed corpus and a bounded number of mutated inputs, with a
//! fixed seed (the same inputs every run). `fuzz/run.sh` runs them longer with fresh seeds.

use std::time::Duration;

use nvmf_fuzz::driver::{self, Budget};

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let seeds: Vec<Vec<u8>> = driver::load_corpus(&nvmf_fuzz::corpus_dir(target))
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert!(seeds.len() >= 5, "{target}: the seed corpus is missing");
    seeds
}

fn fuzz(target: &str, max_len: usize, iterations: u64) {
    let f = nvmf_fuzz::target(target).unwrap();
    let budget = Budget {
        iterations,
        time: Duration::from_secs(20),
    };
    let seeds = seeds(target);
    let structure = nvmf_fuzz::structure(target);
    let ran = driver::run(f, structure, &seeds, 0x5eed, budget, max_len, None);
    assert!(ran >= seeds.len() as u64);
}

#[test]
fn capsule_corpus_is_what_the_generator_writes() {
    let dir = nvmf_fuzz::corpus_dir("capsule");
    for (name, bytes) in nvmf_fuzz::capsule::seeds() {
        let stored = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}: run nvmf-fuzz seeds fuzz/corpus/capsule"));
        assert_eq!(stored, bytes, "{name} differs from capsule::seeds()");
    }
}

#[test]
fn capsule_seeds_reach_their_commands() {
    let seeds: std::collections::HashMap<_, _> = nvmf_fuzz::capsule::seeds().into_iter().collect();
    let run = |name: &str| nvmf_fuzz::capsule::run(&seeds[name]);
    // Connect, property get/set and Identify on a queue the input connected itself.
    assert_eq!(run("connect-admin-then-enable").successes[0], 5);
    // Get Log Page before CC.EN: answered, refused.
    let disc = run("connect-discovery");
    assert_eq!((disc.responses[0], disc.successes[0]), (2, 1));
    // Admin and I/O commands on the queues the Linux-like host brought up.
    assert!(run("identify-all").successes[1] >= 4);
    // The read past the end of the 64-block namespace is refused.
    let io = run("io-keyed");
    assert_eq!((io.responses[2], io.successes[2]), (4, 3));
    let io = run("io-in-capsule");
    assert_eq!(io.responses[2], 5);
    assert!(io.successes[2] >= 4, "{io:?}");
    assert_eq!(run("io-burst-no-poll").successes[2], 12);
    // Short Connect data fails, and still answers exactly once.
    let short = run("connect-short-data");
    assert_eq!((short.responses[0], short.successes[0]), (1, 0));
}

#[test]
fn rpc_stream_seeds_reach_the_handlers() {
    let dir = nvmf_fuzz::corpus_dir("rpc-stream");
    // The first byte is the write size; a space keeps the request intact.
    let mut input = b" ".to_vec();
    input.extend(std::fs::read(dir.join("03-malloc-subsystem-ns-listener")).unwrap());
    let replies = nvmf_fuzz::rpc::stream_replies(&input);
    assert_eq!(replies.len(), 5, "{replies:?}");
    assert!(
        replies.iter().all(|r| r.get("result").is_some()),
        "{replies:?}"
    );
    assert_eq!(replies[4]["result"][1]["nqn"], "nqn.2016-06.io.spdk:cnode1");
}

#[test]
fn capsule_target() {
    fuzz("capsule", nvmf_fuzz::capsule::MAX_INPUT, 150);
}

#[test]
fn rpc_stream_target() {
    fuzz("rpc-stream", nvmf_fuzz::rpc::MAX_INPUT, 300);
}

#[test]
fn rpc_dispatch_target() {
    fuzz("rpc-dispatch", nvmf_fuzz::rpc::MAX_INPUT, 300);
}

#[test]
fn rdma_chaos_target() {
    fuzz("rdma-chaos", 1024, 60);
}

#[test]
fn mutations_are_reproducible() {
    let mut a = driver::Rng::new(7);
    let mut b = driver::Rng::new(7);
    let (mut x, mut y) = (
        b"{\"jsonrpc\":\"2.0\"}".to_vec(),
        b"{\"jsonrpc\":\"2.0\"}".to_vec(),
    );
    for _ in 0..100 {
        driver::mutate(&mut a, &mut x, b"other", 256);
        driver::mutate(&mut b, &mut y, b"other", 256);
    }
    assert_eq!(x, y);
    assert!(x.len() <= 256);
}

/// The dispatch checker catches a handler that fails after changing something.
#[test]
#[should_panic(expected = "failed (half-done")]
fn dispatch_checker_catches_a_half_done_failure() {
    let real = nvmf_target::rpc::call_fn(nvmf_fuzz::rpc::control());
    let broken: nvmf_rpc::CallFn = std::sync::Arc::new(move |method: &str, params| {
        let r = real(method, params);
        if method == "nvmf_create_subsystem" {
            return Err(nvmf_rpc::RpcError::internal("half-done"));
        }
        r
    });
    let req = br#"{"jsonrpc":"2.0","method":"nvmf_create_subsystem","id":1,"params":{"nqn":"nqn.2016-06.io.spdk:x"}}"#;
    nvmf_fuzz::rpc::check_dispatch(&broken, req);
}

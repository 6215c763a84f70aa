//! End to end: the `nvmf-rpc` binary against the real method table served on a Unix socket,
//! as an operator (or a script written for SPDK's rpc.py) would drive it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nvmf_rpc::{build_module, serve_unix, ServerHandle, ServerOptions};
use nvmf_target::core::TargetInfo;
use nvmf_target::rpc::{call_fn, method_names, Control, TransportFactory};
use nvmf_target::target::Target;
use nvmf_target::transport::loopback::LoopbackTransport;
use nvmf_target::transport::options::TransportOptions;
use nvmf_target::transport::Transport;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

fn temp(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "nvmf-rpc-e2e-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn factory() -> TransportFactory {
    Box::new(|opts: &TransportOptions| {
        Ok(Arc::new(LoopbackTransport::new(opts.limits())) as Arc<dyn Transport>)
    })
}

fn target_server() -> (ServerHandle, PathBuf) {
    let control = Control::new(Target::new(Arc::new(TargetInfo::default())), factory());
    let control = Arc::new(Mutex::new(control));
    let module = build_module(&method_names(), call_fn(control));
    let path = temp("sock");
    (
        serve_unix(&path, module, ServerOptions::default()).unwrap(),
        path,
    )
}

fn rpc(sock: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nvmf-rpc"))
        .arg("-s")
        .arg(sock)
        .args(args)
        .output()
        .unwrap()
}

#[track_caller]
fn rpc_ok(sock: &Path, args: &[&str]) -> String {
    let out = rpc(sock, args);
    assert!(
        out.status.success(),
        "nvmf-rpc {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn rpc_json(sock: &Path, args: &[&str]) -> Value {
    serde_json::from_str(&rpc_ok(sock, args)).unwrap()
}

#[test]
fn cli_builds_a_target_reports_errors_and_round_trips_its_config() {
    let (_server, sock) = target_server();

    assert!(rpc_json(&sock, &["spdk_get_version"])["version"].is_string());
    assert_eq!(
        rpc_ok(
            &sock,
            &[
                "nvmf_create_transport",
                "-t",
                "LOOPBACK",
                "-q",
                "64",
                "-c",
                "8192"
            ]
        ),
        ""
    );
    assert_eq!(
        rpc_ok(&sock, &["bdev_malloc_create", "-b", "Malloc0", "1", "512"]),
        "Malloc0\n"
    );
    assert_eq!(
        rpc_ok(&sock, &["bdev_malloc_create", "2", "4096"]),
        "Malloc1\n"
    );
    assert_eq!(
        rpc_ok(&sock, &["bdev_null_create", "Null0", "8", "512"]),
        "Null0\n"
    );
    rpc_ok(&sock, &["bdev_error_create", "Malloc1"]);
    assert_eq!(
        rpc_ok(
            &sock,
            &[
                "nvmf_create_subsystem",
                NQN,
                "-a",
                "-s",
                "SPDK00000000000001",
                "-d",
                "SPDK_Controller1",
                "-m",
                "8"
            ]
        ),
        ""
    );
    assert_eq!(
        rpc_ok(&sock, &["nvmf_subsystem_add_ns", NQN, "Malloc0", "-n", "5"]),
        "5\n"
    );
    assert_eq!(
        rpc_ok(&sock, &["nvmf_subsystem_add_ns", NQN, "EE_Malloc1"]),
        "1\n"
    );
    rpc_ok(
        &sock,
        &[
            "nvmf_subsystem_add_listener",
            NQN,
            "-t",
            "loopback",
            "-a",
            "local",
            "-f",
            "intra_host",
        ],
    );
    rpc_ok(
        &sock,
        &[
            "nvmf_subsystem_add_listener",
            "discovery",
            "-t",
            "loopback",
            "-a",
            "local2",
        ],
    );
    rpc_ok(
        &sock,
        &[
            "nvmf_subsystem_add_host",
            NQN,
            "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-2222-3333-4444-555555555555",
        ],
    );
    rpc_ok(&sock, &["nvmf_subsystem_allow_any_host", NQN, "-d"]);

    let subs = rpc_json(&sock, &["nvmf_get_subsystems"]);
    assert_eq!(subs[0]["subtype"], "Discovery");
    assert_eq!(subs[0]["listen_addresses"][0]["traddr"], "local2");
    let s = &subs[1];
    assert_eq!(s["nqn"], NQN);
    assert_eq!(s["serial_number"], "SPDK00000000000001");
    assert_eq!(s["model_number"], "SPDK_Controller1");
    assert_eq!(s["allow_any_host"], false);
    assert_eq!(s["max_namespaces"], 8);
    assert_eq!(s["namespaces"][1]["nsid"], 5);
    assert_eq!(
        s["listen_addresses"][0],
        json!({"trtype": "LOOPBACK", "adrfam": "INTRA_HOST", "traddr": "local", "trsvcid": ""})
    );
    // rpc.py prints results indented by two spaces.
    let transports = rpc_ok(&sock, &["nvmf_get_transports"]);
    assert!(
        transports.starts_with("[\n  {\n    \"")
            && transports.contains("    \"trtype\": \"LOOPBACK\""),
        "{transports}"
    );
    assert_eq!(
        rpc_json(&sock, &["bdev_get_bdevs", "-b", "Malloc0"])[0]["num_blocks"],
        2048
    );
    let methods = rpc_json(&sock, &["rpc_get_methods"]);
    assert!(methods
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m == "nvmf_subsystem_add_ns"));

    // A domain error: rpc.py's report, exit status 1, nothing changed.
    let out = rpc(&sock, &["nvmf_create_subsystem", NQN]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("request:")
            && err.contains("Got JSON-RPC error response")
            && err.contains("response:"),
        "{err}"
    );
    assert!(
        err.contains("\"code\": -17") && err.contains("\"method\": \"nvmf_create_subsystem\""),
        "{err}"
    );
    // Params the target refuses.
    let out = rpc(&sock, &["nvmf_create_transport", "-t", "RDMA", "-z"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("zcopy"));
    // A command the CLI does not know.
    assert!(!rpc(&sock, &["bdev_lvol_create_lvstore", "Malloc0", "lvs"])
        .status
        .success());

    // Our timeouts by flag: out of range refused with the reason, in range saved.
    let out = rpc(&sock, &["nvmf_set_config", "--transfer-timeout-ms", "5"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("transfer_timeout_ms must be between"));
    rpc_ok(
        &sock,
        &[
            "nvmf_set_config",
            "--connect-timeout-ms",
            "2500",
            "--transfer-timeout-ms",
            "7000",
        ],
    );
    let saved_nvmf = rpc_json(&sock, &["save_config"]);
    let set_config = saved_nvmf["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["config"].as_array().unwrap())
        .find(|c| c["method"] == "nvmf_set_config")
        .expect("nvmf_set_config saved")
        .clone();
    assert_eq!(set_config["params"]["connect_timeout_ms"], 2500);
    assert_eq!(set_config["params"]["transfer_timeout_ms"], 7000);

    // save_config -> fresh target -> load_config -> same config.
    let saved = temp("config.json");
    rpc_ok(&sock, &["save_config", "-o", saved.to_str().unwrap()]);
    let config: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let names: Vec<&str> = config["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["subsystem"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bdev", "nvmf"]);
    assert_eq!(
        rpc_ok(&sock, &["save_config"]),
        std::fs::read_to_string(&saved).unwrap()
    );

    let (_server2, sock2) = target_server();
    rpc_ok(&sock2, &["load_config", "-j", saved.to_str().unwrap()]);
    assert_eq!(rpc_json(&sock2, &["save_config"]), config);
    assert_eq!(rpc_json(&sock2, &["nvmf_get_subsystems"]), subs);
    // Loading it again clashes with what exists: the failing entry is reported.
    let out = rpc(&sock2, &["load_config", "-j", saved.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Got JSON-RPC error response"));
    let _ = std::fs::remove_file(saved);
}

#[test]
fn cli_without_a_server_fails_cleanly() {
    let out = rpc(&temp("absent"), &["spdk_get_version"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

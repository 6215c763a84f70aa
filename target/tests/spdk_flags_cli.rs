//! `nvmf-tgt` started as SPDK's scripts and systemd units start `nvmf_tgt`: SPDK's app flags
//! accepted (the meaningless ones with a notice each), the RPC server up, `spdk_kill_instance`
//! stopping it cleanly with exit status 0, and a log file without colour codes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvmf_rpc::client::{Client, Endpoint};
use serde_json::{json, Value};

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("nvmf-tgt-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts nvmf-tgt with `args`, its output in `log`.
fn start(args: &[&str], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_nvmf-tgt"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// Connects once the socket answers, or fails with the target's log.
fn client(sock: &Path, child: &mut Child, log: &Path) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "nvmf-tgt exited ({status}) during start-up:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if sock.exists() {
            if let Ok(c) = Client::connect(
                &Endpoint::Unix(sock.to_path_buf()),
                Some(Duration::from_secs(10)),
            ) {
                return c;
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "nvmf-tgt did not serve {}:\n{}",
                sock.display(),
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_exit(child: &mut Child, log: &Path) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "nvmf-tgt did not stop:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn spdk_command_line_starts_serves_and_spdk_kill_instance_stops_it() {
    let dir = Dir::new("spdk");
    let sock = dir.0.join("spdk.sock");
    let log = dir.0.join("nvmf-tgt.log");
    let sock_arg = sock.to_str().unwrap();
    let mut child = start(
        &[
            "-i",
            "0",
            "-e",
            "0xFFFF",
            "-m",
            "0x3",
            "-s",
            "1024",
            "-L",
            "nvmf",
            "-L",
            "nvmf_rdma",
            "-n",
            "4",
            "-p",
            "0",
            "--no-huge",
            "-R",
            "-u",
            "-A",
            "0000:01:00.0",
            "-B",
            "0000:02:00.0",
            "-g",
            "-d",
            "--num-trace-entries",
            "4096",
            "--interrupt-mode",
            "--disable-cpumask-locks",
            "--iova-mode",
            "va",
            "--huge-dir",
            "/dev/hugepages",
            "--base-virtaddr",
            "0x200000000000",
            "-r",
            sock_arg,
        ],
        &log,
    );
    let mut c = client(&sock, &mut child, &log);
    let methods: Vec<String> =
        serde_json::from_value(c.call("rpc_get_methods", None).unwrap()).unwrap();
    for m in [
        "nvmf_get_stats",
        "bdev_get_iostat",
        "thread_get_stats",
        "framework_get_reactors",
        "log_set_flag",
        "spdk_kill_instance",
    ] {
        assert!(methods.iter().any(|x| x == m), "{m} missing");
    }
    // -L nvmf and -L nvmf_rdma are on, the rest off.
    let flags = c.call("log_get_flags", None).unwrap();
    assert_eq!(flags["nvmf"], true, "{flags}");
    assert_eq!(flags["nvmf_rdma"], true, "{flags}");
    assert_eq!(flags["bdev"], false, "{flags}");
    // -m 0x3: two reactors, on cores 0 and 1.
    let reactors = c.call("framework_get_reactors", None).unwrap();
    let lcores: Vec<u64> = reactors["reactors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["lcore"].as_u64().unwrap())
        .collect();
    assert_eq!(lcores, [0, 1], "{reactors}");
    assert_eq!(reactors["pid"], child.id());
    let stats = c.call("nvmf_get_stats", None).unwrap();
    assert_eq!(stats["poll_groups"].as_array().unwrap().len(), 2);

    assert_eq!(
        c.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})))
            .unwrap(),
        Value::Bool(true)
    );
    let status = wait_exit(&mut child, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit {status}:\n{text}");
    assert!(!sock.exists(), "the socket is removed on a clean stop");
    assert!(text.contains("nvmf-tgt stopped"), "{text}");
    for notice in [
        "ignoring -i 0:",
        "ignoring -e 0xFFFF:",
        "ignoring -s 1024: DPDK memory size has no meaning here",
        "ignoring -A 0000:01:00.0:",
        "ignoring --no-huge:",
        "ignoring --interrupt-mode:",
    ] {
        assert!(text.contains(notice), "no notice {notice:?} in\n{text}");
    }
    assert!(
        !text.contains('\u{1b}'),
        "a log file must have no ANSI escape codes:\n{text}"
    );
}

#[test]
fn unknown_log_flag_and_rpcs_allowed() {
    let dir = Dir::new("flags");
    let sock = dir.0.join("spdk.sock");
    let log = dir.0.join("nvmf-tgt.log");
    let sock_arg = sock.to_str().unwrap();

    let mut child = start(&["-L", "nosuch", "-r", sock_arg], &log);
    let status = wait_exit(&mut child, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success());
    assert!(
        text.contains("-L nosuch") && text.contains("unknown log flag"),
        "{text}"
    );

    let mut child = start(
        &[
            "--rpcs-allowed",
            "rpc_get_methods,spdk_kill_instance",
            "-r",
            sock_arg,
        ],
        &log,
    );
    let mut c = client(&sock, &mut child, &log);
    let e = c.call("nvmf_get_stats", None).unwrap_err().to_string();
    assert!(e.contains("not found"), "{e}");
    c.call("spdk_kill_instance", Some(json!({"sig_name": "SIGINT"})))
        .unwrap();
    let status = wait_exit(&mut child, &log);
    assert!(status.success(), "exit {status}");
}

#[test]
fn json_ignore_init_errors_keeps_loading_past_a_failed_entry() {
    let dir = Dir::new("ignore");
    let sock = dir.0.join("spdk.sock");
    let log = dir.0.join("nvmf-tgt.log");
    let config = dir.0.join("config.json");
    std::fs::write(
        &config,
        json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_delete", "params": {"name": "Nope"}},
            {"method": "bdev_malloc_create",
             "params": {"name": "Malloc0", "num_blocks": 64, "block_size": 512}}
        ]}]})
        .to_string(),
    )
    .unwrap();
    let (sock_arg, config_arg) = (sock.to_str().unwrap(), config.to_str().unwrap());

    // Without the flag the failed entry stops the start.
    let mut child = start(&["-c", config_arg, "-r", sock_arg], &log);
    let status = wait_exit(&mut child, &log);
    assert!(!status.success(), "{status}");

    let mut child = start(
        &[
            "-c",
            config_arg,
            "--json-ignore-init-errors",
            "-r",
            sock_arg,
        ],
        &log,
    );
    let mut c = client(&sock, &mut child, &log);
    let bdevs = c
        .call("bdev_get_bdevs", Some(json!({"name": "Malloc0"})))
        .unwrap();
    assert_eq!(bdevs[0]["name"], "Malloc0");
    c.call("spdk_kill_instance", Some(json!({"sig_name": "SIGTERM"})))
        .unwrap();
    let status = wait_exit(&mut child, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit {status}:\n{text}");
    assert!(text.contains("Nope"), "the failed entry is logged:\n{text}");
}

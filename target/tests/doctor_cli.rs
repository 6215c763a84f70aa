//! `nvmf-doctor` as a script sees it: exit status, text and `--json`, on fake sysfs/procfs
//! trees (`--sysfs-root`), so no RDMA hardware is needed.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Tree(PathBuf);

impl Tree {
    /// Modules, device nodes and an ACTIVE soft-RoCE port on veth0, unlimited memlock.
    fn good(tag: &str) -> Self {
        let t = Tree(
            std::env::temp_dir().join(format!("nvmf-doctor-cli-{tag}-{}", std::process::id())),
        );
        let _ = std::fs::remove_dir_all(&t.0);
        for m in ["ib_core", "ib_uverbs", "rdma_cm", "rdma_ucm", "rdma_rxe"] {
            std::fs::create_dir_all(t.0.join("sys/module").join(m)).unwrap();
        }
        t.write("dev/infiniband/rdma_cm", "");
        t.write("dev/infiniband/uverbs0", "");
        t.write("sys/class/net/veth0/mtu", "1500\n");
        t.write("sys/class/net/veth0/operstate", "up\n");
        let p = "sys/class/infiniband/rxe0/ports/1";
        t.write("sys/class/infiniband/rxe0/node_type", "1: CA\n");
        t.write("sys/class/infiniband/rxe0/parent", "veth0\n");
        t.write(&format!("{p}/state"), "4: ACTIVE\n");
        t.write(&format!("{p}/phys_state"), "5: LinkUp\n");
        t.write(&format!("{p}/link_layer"), "Ethernet\n");
        t.write(&format!("{p}/rate"), "10 Gb/sec (1X QDR)\n");
        t.write(
            &format!("{p}/gids/0"),
            "0000:0000:0000:0000:0000:ffff:0a00:0001\n",
        );
        t.write(&format!("{p}/gid_attrs/types/0"), "RoCE v2\n");
        t.write(&format!("{p}/gid_attrs/ndevs/0"), "veth0\n");
        t.limits("unlimited");
        t.write("proc/self/status", "CapEff:\t0000000000000000\n");
        t
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn limits(&self, memlock: &str) {
        self.write(
            "proc/self/limits",
            &format!("Max locked memory         {memlock}  {memlock}  bytes\n"),
        );
    }

    fn doctor(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_nvmf-doctor"))
            .arg("--sysfs-root")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("run nvmf-doctor");
        (
            out.status.code().expect("exit status"),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn good_tree_exits_0_and_memlock_too_low_exits_1_with_the_fix() {
    let t = Tree::good("memlock");
    let (code, out) = t.doctor(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("OK   port      rxe0/1: 4: ACTIVE"), "{out}");
    assert!(out.ends_with("0 WARN, 0 FAIL\n"), "{out}");

    t.limits("65536");
    let (code, out) = t.doctor(&["-m", "0x3"]);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL memlock"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("2 reactor(s)"), "{line}");
    assert!(line.contains("fix: raise the limit"), "{line}");

    let (code, out) = t.doctor(&["--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["exit_status"], 1);
    assert_eq!(v["summary"]["fail"], 1);
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["check"] == "memlock" && c["status"] == "FAIL" && c["fix"].is_string()));
}

#[test]
fn warnings_only_exit_2_and_bad_arguments_exit_64() {
    let t = Tree::good("warn");
    // A second rxe port that is down next to the active one: a warning, no failure.
    let p = "sys/class/infiniband/rxe1/ports/1";
    t.write("sys/class/infiniband/rxe1/node_type", "1: CA\n");
    t.write(&format!("{p}/state"), "1: DOWN\n");
    t.write(&format!("{p}/link_layer"), "Ethernet\n");
    let (code, out) = t.doctor(&[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("WARN port      rxe1/1"), "{out}");

    assert_eq!(t.doctor(&["-a", "not-an-address"]).0, 64);
    assert_eq!(t.doctor(&["-m", "0xzz"]).0, 64);
    assert_eq!(t.doctor(&["--no-such-flag"]).0, 64);
    let (code, out) = t.doctor(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Exit status: 0 every check OK"), "{out}");
}

#[test]
fn config_listeners_are_checked_and_a_bad_config_fails() {
    let t = Tree::good("config");
    let cfg = t.0.join("config.json");
    std::fs::write(
        &cfg,
        r#"{"subsystems": [{"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "RDMA", "max_srq_depth": 128}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.x",
              "listen_address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.0.0.1", "trsvcid": "4420"}}}]}]}"#,
    )
    .unwrap();
    // The fake tree has no interface addresses (those come from the live system), so the
    // listener is reported as not local: what matters here is that the config was read.
    let (code, out) = t.doctor(&["-c", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("read: 1 RDMA listener address(es), its RDMA transport options"),
        "{out}"
    );
    assert!(out.contains("SRQ of 128 slots"), "{out}");
    assert!(
        out.contains("FAIL listen    10.0.0.1: no local interface"),
        "{out}"
    );

    let (code, out) = t.doctor(&["-c", Path::new("/nonexistent.json").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("FAIL config    /nonexistent.json: cannot read"),
        "{out}"
    );
}

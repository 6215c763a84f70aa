//! The fabric doctor behind `nvmf-doctor`: checks what an RDMA target needs from the machine
//! and says, for each finding, the command that fixes it.
//!
//! Everything is read from sysfs and procfs ([`snapshot`]) under a root directory, so tests
//! build fake trees and every finding is reproducible without RDMA hardware. Checks come in
//! families, one file each: kernel modules and device nodes ([`modules`]), devices and ports
//! with the InfiniBand subnet manager and LID ([`ports`]), software RDMA devices ([`soft`]),
//! RoCE GIDs and MTUs ([`roce`]), locked-memory limits against what the buffer pools register
//! and huge pages ([`memlock`]), and whether each listen address sits on an RDMA netdev
//! ([`listen`]). [`config`] reads listen addresses and transport options from a saved config.
//!
//! Exit status of the binary ([`Report::exit_code`]): 0 when every check is OK, 1 when any
//! check FAILs, 2 when there are warnings but no failure.

use std::fmt::Write as _;
use std::net::IpAddr;

use serde::Serialize;

use crate::transport::options::TransportOptions;

pub mod config;
pub mod listen;
pub mod memlock;
pub mod modules;
pub mod ports;
pub mod roce;
pub mod snapshot;
pub mod soft;
#[cfg(test)]
mod testfs;

pub use snapshot::{FsRoot, IfAddr, Snapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub status: Status,
    /// The check family: `module`, `device`, `port`, `soft-rdma`, `gid`, `mtu`, `memlock`,
    /// `hugepages`, `listen`, `config`.
    pub check: &'static str,
    /// What was checked (`rxe0/1`, `10.0.0.1`, `rdma_ucm`).
    pub subject: String,
    pub message: String,
    /// The command or change that fixes it (for WARN and FAIL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(check: &'static str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: Status::Ok,
            check,
            subject: subject.into(),
            message: message.into(),
            fix: None,
        }
    }

    pub fn warn(
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Self::ok(check, subject, message)
        }
    }

    pub fn fail(
        check: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            status: Status::Fail,
            fix: Some(fix.into()),
            ..Self::ok(check, subject, message)
        }
    }
}

/// What the target will be asked to do: where it listens, on how many reactors, with which
/// transport options, and who connects.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Listen addresses (`-a`, and the RDMA listeners of `-c`).
    pub listen: Vec<IpAddr>,
    /// Hosts that will connect (`--peer`): their MTU is compared with ours.
    pub peers: Vec<IpAddr>,
    /// Also check what a Linux NVMe-oF host needs (nvme-rdma).
    pub host: bool,
    /// Reactors (cores of `-m`): each registers its own pools on each device.
    pub reactors: usize,
    /// The RDMA transport's options (SPDK's defaults unless the config sets them).
    pub transport: TransportOptions,
}

impl Default for Plan {
    fn default() -> Self {
        Self {
            listen: Vec::new(),
            peers: Vec::new(),
            host: false,
            reactors: 1,
            transport: TransportOptions::new("RDMA"),
        }
    }
}

/// All findings, in check order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn worst(&self) -> Status {
        self.findings
            .iter()
            .map(|f| f.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    /// 0: all OK; 1: something FAILs; 2: warnings only.
    pub fn exit_code(&self) -> i32 {
        match self.worst() {
            Status::Ok => 0,
            Status::Fail => 1,
            Status::Warn => 2,
        }
    }

    pub fn count(&self, status: Status) -> usize {
        self.findings.iter().filter(|f| f.status == status).count()
    }

    /// One line per check: `STATUS check subject: message; fix: ...`, then a summary line.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let _ = write!(
                out,
                "{:<4} {:<9} {}: {}",
                f.status.label(),
                f.check,
                f.subject,
                f.message
            );
            if let Some(fix) = &f.fix {
                let _ = write!(out, "; fix: {fix}");
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "summary: {} OK, {} WARN, {} FAIL",
            self.count(Status::Ok),
            self.count(Status::Warn),
            self.count(Status::Fail)
        );
        out
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "checks": self.findings,
            "summary": {
                "ok": self.count(Status::Ok),
                "warn": self.count(Status::Warn),
                "fail": self.count(Status::Fail),
            },
            "exit_status": self.exit_code(),
        })
    }
}

/// Runs every check family over `snap` for `plan`.
pub fn diagnose(snap: &Snapshot, plan: &Plan) -> Report {
    let mut findings = Vec::new();
    findings.extend(modules::check(snap, plan));
    findings.extend(ports::check(snap, plan));
    findings.extend(soft::check(snap, plan));
    findings.extend(listen::check(snap, plan));
    findings.extend(roce::check(snap, plan));
    findings.extend(memlock::check(snap, plan));
    Report { findings }
}

/// Bytes as `64 KiB`, `48.3 MiB`.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const KIB: u64 = 1024;
    if bytes < KIB * KIB {
        format!("{} KiB", bytes.div_ceil(KIB))
    } else if bytes < KIB * KIB * KIB {
        format!("{:.1} MiB", bytes as f64 / (KIB * KIB) as f64)
    } else {
        format!("{:.1} GiB", bytes as f64 / (KIB * KIB * KIB) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::testfs::FakeRoot;
    use super::*;

    fn listen_on(addr: &str) -> Plan {
        Plan {
            listen: vec![addr.parse().unwrap()],
            ..Plan::default()
        }
    }

    #[test]
    fn a_good_soft_roce_machine_is_all_ok() {
        let r = diagnose(&FakeRoot::good_rxe().snapshot(), &listen_on("10.0.0.1"));
        assert_eq!(r.exit_code(), 0, "{}", r.to_text());
        let checks: Vec<&str> = r.findings.iter().map(|f| f.check).collect();
        for family in [
            "module",
            "port",
            "soft-rdma",
            "listen",
            "gid",
            "mtu",
            "memlock",
            "hugepages",
        ] {
            assert!(
                checks.contains(&family),
                "{family} missing: {}",
                r.to_text()
            );
        }
    }

    #[test]
    fn each_broken_set_up_fails_or_warns_with_its_fix() {
        // No RDMA device at all (no rxe link).
        let root = FakeRoot::good_rxe();
        root.remove("sys/class/infiniband/rxe0");
        let r = diagnose(&root.snapshot(), &listen_on("10.0.0.1"));
        assert_eq!(r.exit_code(), 1);
        assert!(
            r.to_text()
                .contains("rdma link add rxe_veth0 type rxe netdev veth0"),
            "{}",
            r.to_text()
        );
        // Listen address on a netdev without RDMA.
        let r = diagnose(&FakeRoot::good_rxe().snapshot(), &listen_on("192.168.1.10"));
        assert_eq!(r.exit_code(), 1);
        assert!(
            r.to_text()
                .contains("FAIL listen    192.168.1.10: on eth0, which has no RDMA device"),
            "{}",
            r.to_text()
        );
        // Memlock too low.
        let root = FakeRoot::good_rxe();
        root.limits("65536");
        let r = diagnose(&root.snapshot(), &listen_on("10.0.0.1"));
        assert_eq!(r.exit_code(), 1);
        assert!(
            r.to_text()
                .contains("FAIL memlock   RLIMIT_MEMLOCK: memlock limit 64 KiB"),
            "{}",
            r.to_text()
        );
        // MTU mismatch with a host on this machine: a warning only.
        let mut root = FakeRoot::good_rxe();
        root.file("sys/class/net/veth0/mtu", "9000\n");
        root.netdev("veth1", 1500, "10.0.0.2");
        let plan = Plan {
            peers: vec!["10.0.0.2".parse().unwrap()],
            ..listen_on("10.0.0.1")
        };
        let r = diagnose(&root.snapshot(), &plan);
        assert_eq!(r.exit_code(), 2, "{}", r.to_text());
        assert!(r.to_text().contains("WARN mtu"), "{}", r.to_text());
        // No modules.
        let root = FakeRoot::good_rxe();
        for m in ["ib_uverbs", "rdma_cm", "rdma_ucm"] {
            root.remove(&format!("sys/module/{m}"));
        }
        let r = diagnose(&root.snapshot(), &listen_on("10.0.0.1"));
        assert_eq!(r.exit_code(), 1);
        assert_eq!(
            r.findings
                .iter()
                .filter(|f| f.check == "module" && f.status == Status::Fail)
                .count(),
            3
        );
    }

    #[test]
    fn exit_code_and_text_follow_the_worst_finding() {
        let mut r = Report::default();
        assert_eq!(r.exit_code(), 0);
        r.findings
            .push(Finding::ok("module", "ib_uverbs", "loaded"));
        assert_eq!(r.exit_code(), 0);
        r.findings
            .push(Finding::warn("mtu", "veth0", "differs", "ip link set"));
        assert_eq!(r.exit_code(), 2);
        r.findings.push(Finding::fail(
            "memlock",
            "RLIMIT_MEMLOCK",
            "low",
            "ulimit -l",
        ));
        assert_eq!(r.exit_code(), 1);
        let text = r.to_text();
        assert!(
            text.contains("OK   module    ib_uverbs: loaded\n"),
            "{text}"
        );
        assert!(
            text.contains("FAIL memlock   RLIMIT_MEMLOCK: low; fix: ulimit -l\n"),
            "{text}"
        );
        assert!(text.ends_with("summary: 1 OK, 1 WARN, 1 FAIL\n"), "{text}");
        let json = r.to_json();
        assert_eq!(json["exit_status"], 1);
        assert_eq!(json["checks"][2]["status"], "FAIL");
        assert_eq!(json["checks"][0].get("fix"), None);
        assert_eq!(human_bytes(65536), "64 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}

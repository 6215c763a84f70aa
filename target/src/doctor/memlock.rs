//! Locked memory: every reactor registers, on every RDMA device it serves, a shared receive
//! queue's command and in-capsule buffers and a data buffer pool. Registration pins the pages
//! and counts them against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK (the kernel's
//! `ib_umem_get`). The sizes follow `transport/rdma/device.rs`.
//!
//! Huge pages: the data pools map 2 MiB pages when the system has them reserved and fall back
//! to 4 KiB pages otherwise (`nvmf_common::buffer`).

use std::collections::BTreeSet;

use super::listen::resolve;
use super::snapshot::{Limit, PortState, Snapshot};
use super::{human_bytes, Finding, Plan};
use crate::transport::options::TransportOptions;

const PAGE: u64 = 4096;
const HUGE_PAGE: u64 = 2 << 20;
/// `transport/rdma/device.rs`: bytes of one receive slot's command, and the bounds of the
/// data buffer count per device and reactor.
const SQE_LEN: u64 = 64;
const MIN_DATA_BUFFERS: u64 = 64;
const MAX_DATA_BUFFERS: u64 = 1024;
const MIN_SRQ_DEPTH: u64 = 16;

/// What one reactor registers on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRegistration {
    pub srq_depth: u64,
    /// SQEs of every receive slot.
    pub commands: u64,
    /// In-capsule data of every receive slot.
    pub in_capsule: u64,
    pub data_buffers: u64,
    pub buffer_size: u64,
    /// The data pool: `data_buffers` x `buffer_size`.
    pub pool: u64,
}

impl DeviceRegistration {
    /// The sizes `DeviceResources::new` uses (the device's own SRQ limit can only lower them).
    pub fn for_options(opts: &TransportOptions) -> Self {
        let srq_depth = u64::from(opts.max_srq_depth).max(MIN_SRQ_DEPTH);
        let buffer_size = u64::from(opts.max_io_size).next_multiple_of(PAGE);
        let wanted =
            u64::from(opts.num_shared_buffers) * u64::from(opts.io_unit_size) / buffer_size;
        let data_buffers = wanted.clamp(MIN_DATA_BUFFERS, MAX_DATA_BUFFERS);
        Self {
            srq_depth,
            commands: (srq_depth * SQE_LEN).next_multiple_of(PAGE),
            in_capsule: (srq_depth * u64::from(opts.in_capsule_data_size)).next_multiple_of(PAGE),
            data_buffers,
            buffer_size,
            pool: data_buffers * buffer_size,
        }
    }

    pub fn total(&self) -> u64 {
        self.commands + self.in_capsule + self.pool.next_multiple_of(PAGE)
    }
}

/// Devices the target will register on: those of the listen addresses, or every device with
/// an ACTIVE port (a wildcard listener, connections on any device); at least one.
fn device_count(snap: &Snapshot, plan: &Plan) -> usize {
    let names: BTreeSet<&str> = if plan.listen.is_empty() {
        snap.devices
            .iter()
            .filter(|d| d.ports.iter().any(|p| p.state == PortState::Active))
            .map(|d| d.name.as_str())
            .collect()
    } else {
        plan.listen
            .iter()
            .flat_map(|a| resolve(snap, *a).ports)
            .map(|(d, _)| d.name.as_str())
            .collect()
    };
    names.len().max(1)
}

pub fn check(snap: &Snapshot, plan: &Plan) -> Vec<Finding> {
    let reg = DeviceRegistration::for_options(&plan.transport);
    let devices = device_count(snap, plan) as u64;
    let reactors = plan.reactors.max(1) as u64;
    let need = reg.total() * devices * reactors;
    let how = format!(
        "{} = {reactors} reactor(s) x {devices} device(s) x ({} SRQ of {} slots with {} B in-capsule + {} pool of {} x {} KiB buffers)",
        human_bytes(need),
        human_bytes(reg.commands + reg.in_capsule),
        reg.srq_depth,
        plan.transport.in_capsule_data_size,
        human_bytes(reg.pool),
        reg.data_buffers,
        reg.buffer_size / 1024
    );
    let mut out = Vec::new();
    let fix = "raise the limit where nvmf-tgt starts: ulimit -l unlimited (shell), LimitMEMLOCK=infinity (systemd unit), or '* - memlock unlimited' in /etc/security/limits.conf; or register less: fewer cores (-m), smaller num_shared_buffers / max_srq_depth in nvmf_create_transport";
    match snap.memlock {
        None => out.push(Finding::warn(
            "memlock",
            "RLIMIT_MEMLOCK",
            format!("cannot read /proc/self/limits; the target registers {how}"),
            "check ulimit -l in the shell that starts nvmf-tgt",
        )),
        Some(Limit::Unlimited) => out.push(Finding::ok(
            "memlock",
            "RLIMIT_MEMLOCK",
            format!("unlimited; the target registers {how}"),
        )),
        Some(Limit::Bytes(limit)) if limit >= need => out.push(Finding::ok(
            "memlock",
            "RLIMIT_MEMLOCK",
            format!("{} covers {how}", human_bytes(limit)),
        )),
        Some(Limit::Bytes(limit)) if snap.cap_ipc_lock => out.push(Finding::warn(
            "memlock",
            "RLIMIT_MEMLOCK",
            format!(
                "memlock limit {} is below the {how}; this process has CAP_IPC_LOCK (root), which lets registrations ignore the limit, but nvmf-tgt run without it (a service user) fails",
                human_bytes(limit)
            ),
            fix,
        )),
        Some(Limit::Bytes(limit)) => out.push(Finding::fail(
            "memlock",
            "RLIMIT_MEMLOCK",
            format!(
                "memlock limit {} is below the {how}: registering the receive queues and the buffer pool fails (ibv_reg_mr: Cannot allocate memory)",
                human_bytes(limit)
            ),
            fix,
        )),
    }
    out.push(check_hugepages(snap, reg.pool, devices * reactors));
    out
}

fn check_hugepages(snap: &Snapshot, pool: u64, pools: u64) -> Finding {
    let hp = snap.hugepages;
    let per_pool = pool.div_ceil(HUGE_PAGE);
    let need = per_pool * pools;
    if hp.total == 0 {
        return Finding::ok(
            "hugepages",
            "2 MiB pages",
            format!(
                "none reserved: buffer pools use 4 KiB pages (optional, fewer TLB misses: echo {need} > /proc/sys/vm/nr_hugepages)"
            ),
        );
    }
    if hp.size_kib * 1024 != HUGE_PAGE {
        return Finding::ok(
            "hugepages",
            "2 MiB pages",
            format!(
                "default huge page size is {} KiB; the pools ask for 2 MiB pages (echo {need} > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)",
                hp.size_kib
            ),
        );
    }
    if hp.free < need {
        return Finding::warn(
            "hugepages",
            "2 MiB pages",
            format!(
                "{} of {} free; the pools need {need} ({per_pool} per reactor and device): the rest fall back to 4 KiB pages",
                hp.free, hp.total
            ),
            format!(
                "echo {} > /proc/sys/vm/nr_hugepages",
                hp.total + (need - hp.free)
            ),
        );
    }
    Finding::ok(
        "hugepages",
        "2 MiB pages",
        format!("{} of {} free cover the pools' {need}", hp.free, hp.total),
    )
}

#[cfg(test)]
mod tests {
    use super::super::testfs::FakeRoot;
    use super::super::Status;
    use super::*;

    #[test]
    fn default_options_register_about_48_mib_per_reactor_and_device() {
        let reg = DeviceRegistration::for_options(&TransportOptions::new("RDMA"));
        assert_eq!(reg.srq_depth, 4096);
        assert_eq!(reg.commands, 256 << 10);
        assert_eq!(reg.in_capsule, 16 << 20);
        // 4095 x 8 KiB of shared buffers in 128 KiB buffers: 255.
        assert_eq!(reg.data_buffers, 255);
        assert_eq!(reg.buffer_size, 128 << 10);
        assert_eq!(reg.total(), (256 << 10) + (16 << 20) + 255 * (128 << 10));
    }

    #[test]
    fn memlock_64k_fails_and_scales_with_reactors() {
        let root = FakeRoot::good_rxe();
        root.limits("65536");
        let plan = Plan {
            listen: vec!["10.0.0.1".parse().unwrap()],
            reactors: 2,
            ..Plan::default()
        };
        let f = check(&root.snapshot(), &plan);
        assert_eq!(f[0].status, Status::Fail, "{f:#?}");
        let msg = &f[0].message;
        assert!(
            msg.contains("memlock limit 64 KiB is below the 96."),
            "{msg}"
        );
        assert!(msg.contains(" MiB = 2 reactor(s) x 1 device(s)"), "{msg}");
        assert!(f[0].fix.as_ref().unwrap().contains("ulimit -l unlimited"));
        // A limit that covers it.
        root.limits(&(200u64 << 20).to_string());
        let f = check(&root.snapshot(), &plan);
        assert_eq!(f[0].status, Status::Ok, "{f:#?}");
        // Too low, but with CAP_IPC_LOCK: a warning.
        root.limits("65536")
            .file("proc/self/status", "CapEff:\t000001ffffffffff\n");
        let f = check(&root.snapshot(), &plan);
        assert_eq!(f[0].status, Status::Warn, "{f:#?}");
        assert!(f[0].message.contains("CAP_IPC_LOCK"));
    }

    #[test]
    fn config_options_change_the_need() {
        let root = FakeRoot::good_rxe();
        root.limits(&(20u64 << 20).to_string());
        let mut plan = Plan::default();
        assert_eq!(check(&root.snapshot(), &plan)[0].status, Status::Fail);
        plan.transport.max_srq_depth = 256;
        plan.transport.num_shared_buffers = 512;
        // 256 x 4 KiB + 16 KiB + 64 x 128 KiB (the minimum pool) = 9 MiB.
        let f = check(&root.snapshot(), &plan);
        assert_eq!(f[0].status, Status::Ok, "{f:#?}");
    }

    #[test]
    fn hugepages_reserved_but_too_few_warn() {
        let root = FakeRoot::good_rxe();
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[1].status, Status::Ok);
        assert!(f[1].message.contains("none reserved"));
        root.file(
            "proc/meminfo",
            "HugePages_Total:       8\nHugePages_Free:        8\nHugepagesize:       2048 kB\n",
        );
        let f = check(&root.snapshot(), &Plan::default());
        assert_eq!(f[1].status, Status::Warn, "{f:#?}");
        assert!(f[1]
            .fix
            .as_ref()
            .unwrap()
            .contains("echo 16 > /proc/sys/vm/nr_hugepages"));
        root.file(
            "proc/meminfo",
            "HugePages_Total:       64\nHugePages_Free:        64\nHugepagesize:       2048 kB\n",
        );
        assert_eq!(
            check(&root.snapshot(), &Plan::default())[1].status,
            Status::Ok
        );
    }
}

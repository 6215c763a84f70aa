//! Kernel modules and the device nodes userspace RDMA opens.
//!
//! A userspace target needs `ib_uverbs` (verbs from userspace: `/dev/infiniband/uverbsN`),
//! `rdma_cm` (connection manager) and `rdma_ucm` (its userspace interface:
//! `/dev/infiniband/rdma_cm`, which librdmacm opens). A Linux NVMe-oF host needs `nvme_rdma`
//! (which loads `nvme_fabrics`: `/dev/nvme-fabrics`).

use super::snapshot::Snapshot;
use super::{Finding, Plan};

const TARGET_MODULES: [(&str, &str); 3] = [
    (
        "ib_uverbs",
        "verbs from userspace (/dev/infiniband/uverbsN)",
    ),
    ("rdma_cm", "RDMA connection manager"),
    (
        "rdma_ucm",
        "the connection manager from userspace (/dev/infiniband/rdma_cm)",
    ),
];
const HOST_MODULES: [(&str, &str); 2] = [
    (
        "nvme_fabrics",
        "NVMe over Fabrics host core (/dev/nvme-fabrics)",
    ),
    ("nvme_rdma", "NVMe over RDMA host transport"),
];

pub fn check(snap: &Snapshot, plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut wanted: Vec<(&str, &str)> = TARGET_MODULES.to_vec();
    if plan.host {
        wanted.extend(HOST_MODULES);
    }
    for (name, what) in wanted {
        if snap.modules.contains(name) {
            out.push(Finding::ok("module", name, format!("loaded: {what}")));
            continue;
        }
        // nvme-cli's documentation spells the NVMe modules with dashes, rdma-core the others
        // with underscores; modprobe takes either.
        let dashed = if name.starts_with("nvme") {
            name.replace('_', "-")
        } else {
            name.to_string()
        };
        let unavailable =
            !snap.available_modules.is_empty() && !snap.available_modules.contains(name);
        let fix = if unavailable {
            format!(
                "this kernel has no {name} module: install a kernel with CONFIG_{}",
                config_symbol(name)
            )
        } else {
            format!(
                "modprobe {dashed}; to load it at boot: echo {dashed} > /etc/modules-load.d/{dashed}.conf"
            )
        };
        out.push(Finding::fail(
            "module",
            name,
            format!("not loaded: {what}"),
            fix,
        ));
    }
    // The device nodes, once the modules are there (udev creates them).
    if snap.modules.contains("rdma_ucm") {
        if snap.dev_nodes.iter().any(|n| n == "rdma_cm") {
            out.push(Finding::ok("module", "/dev/infiniband/rdma_cm", "present"));
        } else {
            out.push(Finding::fail(
                "module",
                "/dev/infiniband/rdma_cm",
                "missing although rdma_ucm is loaded: librdmacm cannot open the connection manager",
                "udevadm trigger --subsystem-match=infiniband; or by hand: mkdir -p /dev/infiniband && mknod /dev/infiniband/rdma_cm c 10 $(awk '$2==\"rdma_cm\"{print $1}' /proc/misc)",
            ));
        }
    }
    if snap.modules.contains("ib_uverbs") && !snap.devices.is_empty() {
        if snap.dev_nodes.iter().any(|n| n.starts_with("uverbs")) {
            out.push(Finding::ok("module", "/dev/infiniband/uverbs*", "present"));
        } else {
            out.push(Finding::fail(
                "module",
                "/dev/infiniband/uverbs*",
                "no uverbs device node although RDMA devices exist: libibverbs sees no device",
                "udevadm trigger --subsystem-match=infiniband_verbs (the rdma-core udev rules create them)",
            ));
        }
    }
    out
}

fn config_symbol(module: &str) -> &'static str {
    match module {
        "ib_uverbs" => "INFINIBAND_USER_ACCESS",
        "rdma_cm" => "INFINIBAND_ADDR_TRANS",
        "rdma_ucm" => "INFINIBAND_ADDR_TRANS and INFINIBAND_USER_ACCESS",
        "nvme_fabrics" => "NVME_FABRICS",
        "nvme_rdma" => "NVME_RDMA",
        _ => "the module's option",
    }
}

#[cfg(test)]
mod tests {
    use super::super::testfs::FakeRoot;
    use super::super::Status;
    use super::*;

    #[test]
    fn all_modules_and_nodes_present_is_ok() {
        let snap = FakeRoot::good_rxe().snapshot();
        let f = check(&snap, &Plan::default());
        assert!(f.iter().all(|f| f.status == Status::Ok), "{f:#?}");
        assert_eq!(f.len(), 5);
    }

    #[test]
    fn missing_modules_fail_with_modprobe() {
        let root = FakeRoot::good_rxe();
        root.remove("sys/module/rdma_ucm")
            .remove("sys/module/ib_uverbs");
        let f = check(&root.snapshot(), &Plan::default());
        let ucm = f.iter().find(|f| f.subject == "rdma_ucm").unwrap();
        assert_eq!(ucm.status, Status::Fail);
        assert!(
            ucm.fix.as_ref().unwrap().starts_with("modprobe rdma_ucm"),
            "{ucm:?}"
        );
        assert!(f
            .iter()
            .any(|f| f.subject == "ib_uverbs" && f.status == Status::Fail));
        // Without the modules their device nodes are not judged.
        assert!(!f.iter().any(|f| f.subject.starts_with("/dev/")));
    }

    #[test]
    fn no_modules_at_all_and_host_modules() {
        let root = FakeRoot::empty();
        let plan = Plan {
            host: true,
            ..Plan::default()
        };
        let f = check(&root.snapshot(), &plan);
        assert_eq!(f.len(), 5);
        assert!(f.iter().all(|f| f.status == Status::Fail));
        let nvme = f.iter().find(|f| f.subject == "nvme_rdma").unwrap();
        assert!(nvme.fix.as_ref().unwrap().contains("modprobe nvme-rdma"));
    }

    #[test]
    fn a_kernel_without_the_module_is_named() {
        let root = FakeRoot::empty();
        root.file("proc/sys/kernel/osrelease", "6.1.0-test\n").file(
            "lib/modules/6.1.0-test/modules.dep",
            "kernel/drivers/infiniband/core/ib_core.ko:\n",
        );
        let f = check(&root.snapshot(), &Plan::default());
        let cm = f.iter().find(|f| f.subject == "rdma_cm").unwrap();
        assert!(
            cm.fix
                .as_ref()
                .unwrap()
                .contains("CONFIG_INFINIBAND_ADDR_TRANS"),
            "{cm:?}"
        );
    }

    #[test]
    fn builtin_modules_count_as_loaded_and_missing_nodes_fail() {
        let root = FakeRoot::good_rxe();
        root.remove("sys/module/rdma_cm")
            .remove("dev/infiniband/rdma_cm")
            .file("proc/sys/kernel/osrelease", "6.1.0-test\n")
            .file(
                "lib/modules/6.1.0-test/modules.builtin",
                "kernel/drivers/infiniband/core/rdma_cm.ko\n",
            );
        let f = check(&root.snapshot(), &Plan::default());
        assert!(f
            .iter()
            .any(|f| f.subject == "rdma_cm" && f.status == Status::Ok));
        let node = f
            .iter()
            .find(|f| f.subject == "/dev/infiniband/rdma_cm")
            .unwrap();
        assert_eq!(node.status, Status::Fail);
    }
}

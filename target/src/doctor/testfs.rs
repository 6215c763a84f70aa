//! Fake sysfs/procfs trees for the doctor's tests, laid out as the kernel writes them.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::snapshot::{FsRoot, IfAddr, Snapshot};

pub struct FakeRoot {
    dir: PathBuf,
    pub addresses: Vec<IfAddr>,
}

impl FakeRoot {
    /// An empty tree: no modules, no devices, nothing in /proc.
    pub fn empty() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nvmf-doctor-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self {
            dir,
            addresses: Vec::new(),
        }
    }

    /// A working soft-RoCE machine: the verbs and CM modules, their device nodes, rxe0 on
    /// veth0 (10.0.0.1, MTU 1500) ACTIVE with RoCE v1 and v2 GIDs, eth0 (192.168.1.10) without
    /// RDMA as the default route, unlimited memlock, no huge pages.
    pub fn good_rxe() -> Self {
        let mut f = Self::empty();
        for m in ["ib_core", "ib_uverbs", "rdma_cm", "rdma_ucm", "rdma_rxe"] {
            f.dir_at(&format!("sys/module/{m}"));
        }
        f.file("dev/infiniband/rdma_cm", "");
        f.file("dev/infiniband/uverbs0", "");
        f.netdev("eth0", 1500, "192.168.1.10");
        f.netdev("veth0", 1500, "10.0.0.1");
        f.rxe("rxe0", "veth0", "10.0.0.1");
        f.limits("unlimited");
        f.file(
            "proc/self/status",
            "Name:\tnvmf-doctor\nCapEff:\t0000000000000000\n",
        );
        f.file(
            "proc/meminfo",
            "HugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n",
        );
        f.file(
            "proc/net/route",
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
             eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n",
        );
        f
    }

    pub fn file(&self, rel: &str, content: &str) -> &Self {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("relative path has a parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
        self
    }

    pub fn dir_at(&self, rel: &str) -> &Self {
        std::fs::create_dir_all(self.dir.join(rel)).expect("mkdir");
        self
    }

    pub fn remove(&self, rel: &str) -> &Self {
        let p = self.dir.join(rel);
        if p.is_dir() {
            std::fs::remove_dir_all(p).expect("rm -r");
        } else {
            std::fs::remove_file(p).expect("rm");
        }
        self
    }

    pub fn limits(&self, memlock: &str) -> &Self {
        self.file(
            "proc/self/limits",
            &format!(
                "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max locked memory         {memlock:<20} {memlock:<20} bytes     \n"
            ),
        )
    }

    /// A netdev with an MTU and one IPv4 address.
    pub fn netdev(&mut self, name: &str, mtu: u32, addr: &str) -> &mut Self {
        self.file(&format!("sys/class/net/{name}/mtu"), &format!("{mtu}\n"));
        self.file(&format!("sys/class/net/{name}/operstate"), "up\n");
        self.addresses.push(IfAddr {
            ifname: name.to_string(),
            addr: addr.parse::<IpAddr>().expect("test address"),
        });
        self
    }

    /// An rxe device on `netdev`, port 1 ACTIVE, with the default link-local GID and a RoCE
    /// v1 and v2 GID for `addr`, as rxe fills its table.
    pub fn rxe(&self, name: &str, netdev: &str, addr: &str) -> &Self {
        let base = format!("sys/class/infiniband/{name}");
        self.file(&format!("{base}/node_type"), "1: CA\n");
        self.file(&format!("{base}/parent"), &format!("{netdev}\n"));
        let p = format!("{base}/ports/1");
        self.file(&format!("{p}/state"), "4: ACTIVE\n");
        self.file(&format!("{p}/phys_state"), "5: LinkUp\n");
        self.file(&format!("{p}/link_layer"), "Ethernet\n");
        self.file(&format!("{p}/rate"), "10 Gb/sec (1X QDR)\n");
        self.file(&format!("{p}/lid"), "0x0\n");
        self.file(&format!("{p}/sm_lid"), "0x0\n");
        let v4: std::net::Ipv4Addr = addr.parse().expect("IPv4 test address");
        let mapped = v4.to_ipv6_mapped().segments();
        let full = mapped
            .iter()
            .map(|s| format!("{s:04x}"))
            .collect::<Vec<_>>()
            .join(":");
        let gids = [
            (
                "fe80:0000:0000:0000:0000:00ff:fe00:0001",
                Some("IB/RoCE v1"),
            ),
            ("fe80:0000:0000:0000:0000:00ff:fe00:0001", Some("RoCE v2")),
            (full.as_str(), Some("IB/RoCE v1")),
            (full.as_str(), Some("RoCE v2")),
            ("0000:0000:0000:0000:0000:0000:0000:0000", None),
        ];
        for (i, (gid, kind)) in gids.iter().enumerate() {
            self.file(&format!("{p}/gids/{i}"), &format!("{gid}\n"));
            if let Some(kind) = kind {
                self.file(&format!("{p}/gid_attrs/types/{i}"), &format!("{kind}\n"));
                self.file(&format!("{p}/gid_attrs/ndevs/{i}"), &format!("{netdev}\n"));
            }
        }
        self
    }

    /// An InfiniBand HCA port (mlx5-like: a PCI device with a driver link).
    pub fn ib_hca(&self, name: &str, state: &str, phys: &str, lid: &str, sm_lid: &str) -> &Self {
        let base = format!("sys/class/infiniband/{name}");
        self.file(&format!("{base}/node_type"), "1: CA\n");
        self.dir_at("sys/bus/pci/drivers/mlx5_core");
        self.dir_at(&format!("{base}/device"));
        std::os::unix::fs::symlink(
            self.dir.join("sys/bus/pci/drivers/mlx5_core"),
            self.dir.join(format!("{base}/device/driver")),
        )
        .expect("symlink");
        let p = format!("{base}/ports/1");
        self.file(&format!("{p}/state"), &format!("{state}\n"));
        self.file(&format!("{p}/phys_state"), &format!("{phys}\n"));
        self.file(&format!("{p}/link_layer"), "InfiniBand\n");
        self.file(&format!("{p}/rate"), "100 Gb/sec (4X EDR)\n");
        self.file(&format!("{p}/lid"), &format!("{lid}\n"));
        self.file(&format!("{p}/sm_lid"), &format!("{sm_lid}\n"));
        self.file(
            &format!("{p}/gids/0"),
            "fe80:0000:0000:0000:0002:c903:0001:0001\n",
        );
        self
    }

    /// An IPoIB netdev of HCA `dev`'s port `port` with one address.
    pub fn ipoib(&mut self, netdev: &str, dev: &str, port: u8, addr: &str) -> &mut Self {
        self.netdev(netdev, 2044, addr);
        self.file(
            &format!("sys/class/net/{netdev}/dev_port"),
            &format!("{}\n", port - 1),
        );
        self.dir_at(&format!("sys/class/net/{netdev}/device/infiniband/{dev}"));
        self
    }

    pub fn root(&self) -> FsRoot {
        FsRoot::new(&self.dir)
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot::read(&self.root(), self.addresses.clone())
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

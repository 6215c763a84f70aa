//! What the doctor looks at, read once from sysfs and procfs under a root directory (`/` on a
//! real system, a fake tree in tests), plus the interface addresses and the verbs-reported
//! active MTUs that the binary adds from the live system.
//!
//! Files read (Documentation/ABI/stable/sysfs-class-infiniband, sysfs-class-net, proc(5)):
//! - `sys/class/infiniband/DEV/{node_type,parent,device/driver}`, and per port
//!   `ports/N/{state,phys_state,link_layer,rate,lid,sm_lid}`, `ports/N/gids/I`,
//!   `ports/N/gid_attrs/{types,ndevs}/I` (the attributes fail to read for an empty entry);
//! - `sys/class/net/NETDEV/{mtu,operstate,device/infiniband/}`;
//! - `sys/module/NAME` (loaded or built-in with parameters), `proc/sys/kernel/osrelease`,
//!   `lib/modules/RELEASE/{modules.builtin,modules.dep}`;
//! - `dev/infiniband/` (the device nodes libibverbs and librdmacm open);
//! - `proc/self/limits` (RLIMIT_MEMLOCK), `proc/self/status` (CapEff), `proc/meminfo`
//!   (huge pages), `proc/net/route` (the default route's netdev).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// The directory sysfs, procfs and /dev are read under.
#[derive(Debug, Clone)]
pub struct FsRoot(PathBuf);

impl FsRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self(root.into())
    }

    pub fn is_live_system(&self) -> bool {
        self.0 == Path::new("/")
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }

    /// An attribute's text without the trailing newline; `None` if it cannot be read (sysfs
    /// answers EINVAL for empty GID attribute entries).
    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.path(rel))
            .ok()
            .map(|s| s.trim_end().to_string())
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Names in a directory, sorted; empty if it does not exist.
    pub fn list(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(rel))
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort_by_key(|n| natural_key(n));
        names
    }

    /// The last component of a symlink's target (`device/driver` -> `mlx5_core`).
    fn link_name(&self, rel: &str) -> Option<String> {
        std::fs::read_link(self.path(rel))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }
}

/// Sorts `gids/10` after `gids/9`.
fn natural_key(s: &str) -> (u64, String) {
    (s.parse().unwrap_or(u64::MAX), s.to_string())
}

/// Logical port state (the number before the colon of `ports/N/state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Down,
    Init,
    Armed,
    Active,
    Other(u32),
}

impl PortState {
    /// Parses `4: ACTIVE`.
    pub fn parse(text: &str) -> Self {
        match text.split(':').next().and_then(|n| n.trim().parse().ok()) {
            Some(1) => Self::Down,
            Some(2) => Self::Init,
            Some(3) => Self::Armed,
            Some(4) => Self::Active,
            Some(n) => Self::Other(n),
            None => Self::Other(0),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Unknown,
}

impl LinkLayer {
    fn parse(text: &str) -> Self {
        match text {
            "InfiniBand" => Self::InfiniBand,
            "Ethernet" => Self::Ethernet,
            _ => Self::Unknown,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::InfiniBand => "InfiniBand",
            Self::Ethernet => "Ethernet",
            Self::Unknown => "unknown link layer",
        }
    }
}

/// One non-empty GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Ipv6Addr,
    /// `RoCE v2`, `IB/RoCE v1`, or `None` when the attribute cannot be read.
    pub kind: Option<String>,
    /// The netdev a RoCE GID belongs to.
    pub ndev: Option<String>,
}

impl GidEntry {
    pub fn is_roce_v2(&self) -> bool {
        self.kind.as_deref() == Some("RoCE v2")
    }
}

#[derive(Debug, Clone)]
pub struct Port {
    pub num: u8,
    pub state: PortState,
    /// `4: ACTIVE` as sysfs wrote it.
    pub state_text: String,
    /// `5: LinkUp`.
    pub phys_state: String,
    pub link_layer: LinkLayer,
    /// `10 Gb/sec (1X QDR)`.
    pub rate: String,
    pub lid: u32,
    pub sm_lid: u32,
    pub gids: Vec<GidEntry>,
    /// Active MTU in bytes from `ibv_query_port` (sysfs has no such attribute); `None` when
    /// the doctor did not open the device.
    pub active_mtu: Option<u32>,
}

/// A software RDMA device: a NIC made of CPU time, for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftKind {
    /// Soft-RoCE (`rdma_rxe`).
    Rxe,
    /// Soft-iWARP (`siw`).
    Siw,
}

#[derive(Debug, Clone)]
pub struct RdmaDevice {
    pub name: String,
    /// `1: CA`, `4: RNIC` (iWARP).
    pub node_type: String,
    /// The kernel driver of the PCI function (`mlx5_core`); `None` for software devices.
    pub driver: Option<String>,
    /// rxe's `parent` attribute: the netdev it runs on.
    pub parent: Option<String>,
    pub soft: Option<SoftKind>,
    pub ports: Vec<Port>,
}

#[derive(Debug, Clone)]
pub struct NetDev {
    pub name: String,
    pub mtu: Option<u32>,
    pub operstate: String,
    /// RDMA devices of the same PCI function (`device/infiniband/`): mlx5 RoCE and IPoIB.
    pub rdma_devices: Vec<String>,
    /// Zero-based port of the device (`dev_port`): IPoIB's `ib1` is port 2.
    pub dev_port: Option<u32>,
}

/// One address of one interface (getifaddrs on a live system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub ifname: String,
    pub addr: IpAddr,
}

/// RLIMIT_MEMLOCK's soft limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    Bytes(u64),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HugePages {
    pub total: u64,
    pub free: u64,
    pub size_kib: u64,
}

/// Everything the checks look at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub devices: Vec<RdmaDevice>,
    pub netdevs: BTreeMap<String, NetDev>,
    pub addresses: Vec<IfAddr>,
    /// Modules present in `/sys/module` or listed in `modules.builtin` (dashes as underscores).
    pub modules: BTreeSet<String>,
    /// Modules this kernel could load (`modules.dep`); empty when unknown.
    pub available_modules: BTreeSet<String>,
    /// Entries of `/dev/infiniband`.
    pub dev_nodes: Vec<String>,
    pub memlock: Option<Limit>,
    pub cap_ipc_lock: bool,
    pub hugepages: HugePages,
    /// The netdev of the default IPv4 route.
    pub default_route_dev: Option<String>,
}

impl Snapshot {
    /// Reads everything under `root`; `addresses` come from the caller (getifaddrs).
    pub fn read(root: &FsRoot, addresses: Vec<IfAddr>) -> Self {
        let devices = root
            .list("sys/class/infiniband")
            .into_iter()
            .map(|name| read_device(root, &name))
            .collect();
        let netdevs = root
            .list("sys/class/net")
            .into_iter()
            .map(|name| {
                let base = format!("sys/class/net/{name}");
                let dev = NetDev {
                    mtu: root
                        .read(&format!("{base}/mtu"))
                        .and_then(|m| m.parse().ok()),
                    operstate: root
                        .read(&format!("{base}/operstate"))
                        .unwrap_or_else(|| "unknown".into()),
                    rdma_devices: root.list(&format!("{base}/device/infiniband")),
                    dev_port: root
                        .read(&format!("{base}/dev_port"))
                        .and_then(|p| p.parse().ok()),
                    name: name.clone(),
                };
                (name, dev)
            })
            .collect();
        let norm = |m: &str| m.replace('-', "_");
        let mut modules: BTreeSet<String> =
            root.list("sys/module").iter().map(|m| norm(m)).collect();
        let mut available_modules = BTreeSet::new();
        if let Some(release) = root.read("proc/sys/kernel/osrelease") {
            let dir = format!("lib/modules/{release}");
            let module_names = |text: String| -> Vec<String> {
                text.lines()
                    .filter_map(|l| l.split(':').next())
                    .filter_map(|p| p.rsplit('/').next())
                    .filter_map(|f| f.split(".ko").next())
                    .map(norm)
                    .collect()
            };
            if let Some(text) = root.read(&format!("{dir}/modules.builtin")) {
                let builtin = module_names(text);
                available_modules.extend(builtin.iter().cloned());
                modules.extend(builtin);
            }
            if let Some(text) = root.read(&format!("{dir}/modules.dep")) {
                available_modules.extend(module_names(text));
            }
        }
        Self {
            devices,
            netdevs,
            addresses,
            modules,
            available_modules,
            dev_nodes: root.list("dev/infiniband"),
            memlock: root
                .read("proc/self/limits")
                .and_then(|t| parse_memlock(&t)),
            cap_ipc_lock: root
                .read("proc/self/status")
                .is_some_and(|t| parse_cap_ipc_lock(&t)),
            hugepages: root
                .read("proc/meminfo")
                .map(|t| parse_hugepages(&t))
                .unwrap_or_default(),
            default_route_dev: root
                .read("proc/net/route")
                .and_then(|t| parse_default_route(&t)),
        }
    }

    /// Which netdev carries `addr`, if any.
    pub fn netdev_of(&self, addr: IpAddr) -> Option<&str> {
        self.addresses
            .iter()
            .find(|a| a.addr == addr)
            .map(|a| a.ifname.as_str())
    }

    /// The netdev a RoCE port runs on: rxe's parent, else the netdev of its GIDs.
    pub fn port_netdev(&self, dev: &RdmaDevice, port: &Port) -> Option<String> {
        if let Some(p) = &dev.parent {
            return Some(p.clone());
        }
        if let Some(n) = port.gids.iter().find_map(|g| g.ndev.clone()) {
            return Some(n);
        }
        // IPoIB: the netdevs of the HCA's PCI function, one per port.
        let of_device = || {
            self.netdevs
                .values()
                .filter(|n| n.rdma_devices.contains(&dev.name))
        };
        of_device()
            .find(|n| n.dev_port.map(|p| p + 1) == Some(u32::from(port.num)))
            .or_else(|| of_device().next())
            .map(|n| n.name.clone())
    }

    /// The (device, port) pairs that carry traffic of `netdev`.
    pub fn ports_on_netdev(&self, netdev: &str) -> Vec<(&RdmaDevice, &Port)> {
        let mut out = Vec::new();
        for dev in &self.devices {
            for port in &dev.ports {
                if self.port_netdev(dev, port).as_deref() == Some(netdev) {
                    out.push((dev, port));
                }
            }
        }
        out
    }

    /// Netdevs that have an RDMA device, for fixes that say where an address could go.
    pub fn rdma_netdevs(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .devices
            .iter()
            .flat_map(|d| d.ports.iter().filter_map(|p| self.port_netdev(d, p)))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

fn read_device(root: &FsRoot, name: &str) -> RdmaDevice {
    let base = format!("sys/class/infiniband/{name}");
    let node_type = root.read(&format!("{base}/node_type")).unwrap_or_default();
    let driver = root.link_name(&format!("{base}/device/driver"));
    let parent = root.read(&format!("{base}/parent"));
    // Software devices have no parent bus device; siw is the iWARP one (an RNIC).
    let soft = if root.exists(&format!("{base}/device")) {
        None
    } else if node_type.contains("RNIC") || name.starts_with("siw") {
        Some(SoftKind::Siw)
    } else {
        Some(SoftKind::Rxe)
    };
    let ports = root
        .list(&format!("{base}/ports"))
        .into_iter()
        .filter_map(|p| p.parse::<u8>().ok())
        .map(|num| read_port(root, &format!("{base}/ports/{num}"), num))
        .collect();
    RdmaDevice {
        name: name.to_string(),
        node_type,
        driver,
        parent,
        soft,
        ports,
    }
}

fn read_port(root: &FsRoot, base: &str, num: u8) -> Port {
    let attr = |a: &str| root.read(&format!("{base}/{a}")).unwrap_or_default();
    let hex = |a: &str| {
        let t = attr(a);
        u32::from_str_radix(t.trim_start_matches("0x"), 16).unwrap_or(0)
    };
    let state_text = attr("state");
    let gids = root
        .list(&format!("{base}/gids"))
        .into_iter()
        .filter_map(|i| i.parse::<u32>().ok())
        .filter_map(|index| {
            let gid: Ipv6Addr = root.read(&format!("{base}/gids/{index}"))?.parse().ok()?;
            if gid.is_unspecified() {
                return None;
            }
            Some(GidEntry {
                index,
                gid,
                kind: root.read(&format!("{base}/gid_attrs/types/{index}")),
                ndev: root.read(&format!("{base}/gid_attrs/ndevs/{index}")),
            })
        })
        .collect();
    Port {
        num,
        state: PortState::parse(&state_text),
        state_text,
        phys_state: attr("phys_state"),
        link_layer: LinkLayer::parse(&attr("link_layer")),
        rate: attr("rate"),
        lid: hex("lid"),
        sm_lid: hex("sm_lid"),
        gids,
        active_mtu: None,
    }
}

/// `Max locked memory  65536  65536  bytes` from /proc/self/limits: the soft limit.
fn parse_memlock(limits: &str) -> Option<Limit> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        Some(Limit::Unlimited)
    } else {
        soft.parse().ok().map(Limit::Bytes)
    }
}

/// CAP_IPC_LOCK (bit 14) in the effective set: registrations then ignore RLIMIT_MEMLOCK.
fn parse_cap_ipc_lock(status: &str) -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

fn parse_hugepages(meminfo: &str) -> HugePages {
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    HugePages {
        total: field("HugePages_Total:"),
        free: field("HugePages_Free:"),
        size_kib: field("Hugepagesize:"),
    }
}

/// The interface of the `0.0.0.0/0` route in /proc/net/route.
fn parse_default_route(route: &str) -> Option<String> {
    route.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_parsers_read_the_kernel_formats() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max locked memory         65536                65536                bytes     \n";
        assert_eq!(parse_memlock(limits), Some(Limit::Bytes(65536)));
        let unl = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(parse_memlock(unl), Some(Limit::Unlimited));
        assert!(parse_cap_ipc_lock("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!parse_cap_ipc_lock("CapEff:\t0000000000000000\n"));
        let mi = "MemTotal: 1 kB\nHugePages_Total:      16\nHugePages_Free:        4\nHugepagesize:       2048 kB\n";
        assert_eq!(
            parse_hugepages(mi),
            HugePages {
                total: 16,
                free: 4,
                size_kib: 2048
            }
        );
        let route =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(parse_default_route(route).as_deref(), Some("eth0"));
        assert_eq!(PortState::parse("2: INIT"), PortState::Init);
        assert_eq!(PortState::parse("4: ACTIVE"), PortState::Active);
    }
}

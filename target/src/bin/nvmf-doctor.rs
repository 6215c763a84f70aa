//! `nvmf-doctor`: checks that this machine can run an RDMA NVMe-oF target (or host) and says
//! how to fix what it finds. See `nvmf_target::doctor` for the checks.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::Parser;
use nvmf_common::reactor::parse_core_mask;
use nvmf_target::doctor::{self, config, FsRoot, IfAddr, Plan, Snapshot};

const EXAMPLES: &str = "\
Examples:
  nvmf-doctor -a 10.0.0.1                       # can nvmf-tgt listen on RDMA at 10.0.0.1?
  nvmf-doctor -c config.json -m 0x3             # the listeners and transport of a saved config, 2 reactors
  nvmf-doctor -a 10.0.0.1 --peer 10.0.0.2       # also compare MTUs with a host on this machine
  nvmf-doctor --host                            # what a Linux NVMe-oF host (nvme-rdma) needs
  nvmf-doctor -a 10.0.0.1 --json | jq '.checks[] | select(.status != \"OK\")'

Output: one line per check, `OK`, `WARN` or `FAIL`, then `; fix:` and the command that fixes it.
Exit status: 0 every check OK, 1 at least one FAIL, 2 warnings but no FAIL, 64 bad arguments.";

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-doctor",
    version,
    about = "Checks the RDMA fabric set-up for nvmf-tgt: kernel modules, devices and ports, \
             subnet manager, RoCE GIDs and MTUs, soft-RoCE, locked-memory limits, and the \
             listen addresses; explains each finding with the command that fixes it",
    after_help = EXAMPLES
)]
struct Args {
    /// An address nvmf-tgt will listen on (IP, or IP:PORT); repeat for several.
    #[arg(short = 'a', long = "listen", value_name = "ADDR")]
    listen: Vec<String>,
    /// nvmf-tgt's JSON config (SPDK's saved-config format): its RDMA listeners and transport
    /// options are checked.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    config: Option<PathBuf>,
    /// nvmf-tgt's core mask: one reactor per core registers its own buffers.
    #[arg(short = 'm', long = "cpumask", default_value = "0x1")]
    cpumask: String,
    /// A host that will connect, to compare its netdev MTU with ours (when it is an address
    /// of this machine); repeat for several.
    #[arg(long = "peer", value_name = "ADDR")]
    peers: Vec<IpAddr>,
    /// Also check what a Linux NVMe-oF host needs (nvme-rdma, nvme-fabrics).
    #[arg(long)]
    host: bool,
    /// Print the findings as JSON.
    #[arg(long)]
    json: bool,
    /// Read sysfs, procfs and /dev under this directory instead of / (for tests).
    #[arg(long = "sysfs-root", hide = true)]
    sysfs_root: Option<PathBuf>,
}

fn parse_addr(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

/// Every address of every interface (getifaddrs).
fn interface_addresses() -> Vec<IfAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| {
            let sa = a.address?;
            let ip = if let Some(v4) = sa.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else {
                IpAddr::V6(sa.as_sockaddr_in6()?.ip())
            };
            Some(IfAddr {
                ifname: a.interface_name,
                addr: ip,
            })
        })
        .collect()
}

/// Active MTUs from `ibv_query_port` (sysfs does not show them).
fn fill_active_mtus(snap: &mut Snapshot) {
    for dev in &mut snap.devices {
        let Ok(ctx) = nvmf_common::rdma::device::Context::open(&dev.name) else {
            continue;
        };
        for port in &mut dev.ports {
            port.active_mtu = ctx
                .query_port(port.num)
                .ok()
                .and_then(|a| a.active_mtu.bytes());
        }
    }
}

fn main() {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            std::process::exit(if usage { 64 } else { 0 });
        }
    };
    let mut plan = Plan {
        peers: args.peers.clone(),
        host: args.host,
        ..Plan::default()
    };
    for a in &args.listen {
        match parse_addr(a) {
            Some(ip) if !plan.listen.contains(&ip) => plan.listen.push(ip),
            Some(_) => {}
            None => {
                eprintln!("nvmf-doctor: -a {a:?} is not an IP address (or IP:PORT)");
                std::process::exit(64);
            }
        }
    }
    match parse_core_mask(&args.cpumask) {
        Ok(cores) => plan.reactors = cores.len(),
        Err(e) => {
            eprintln!("nvmf-doctor: -m: {e}");
            std::process::exit(64);
        }
    }
    let mut config_finding = None;
    if let Some(path) = &args.config {
        match config::load(path) {
            Ok(cfg) => {
                for ip in cfg.listen {
                    if !plan.listen.contains(&ip) {
                        plan.listen.push(ip);
                    }
                }
                let what = if cfg.transport.is_some() {
                    "its RDMA transport options"
                } else {
                    "no RDMA transport in it, so SPDK's defaults"
                };
                if let Some(t) = cfg.transport {
                    plan.transport = t;
                }
                config_finding = Some(doctor::Finding::ok(
                    "config",
                    path.display().to_string(),
                    format!(
                        "read: {} RDMA listener address(es), {what}",
                        plan.listen.len()
                    ),
                ));
            }
            Err(e) => {
                config_finding = Some(doctor::Finding::fail(
                    "config",
                    path.display().to_string(),
                    e.to_string(),
                    "fix the config: nvmf-tgt refuses it too",
                ));
            }
        }
    }

    let root = FsRoot::new(args.sysfs_root.clone().unwrap_or_else(|| "/".into()));
    let live = root.is_live_system();
    let addresses = if live {
        interface_addresses()
    } else {
        Vec::new()
    };
    let mut snap = Snapshot::read(&root, addresses);
    if live {
        fill_active_mtus(&mut snap);
    }
    let mut report = doctor::diagnose(&snap, &plan);
    if let Some(f) = config_finding {
        report.findings.insert(0, f);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).expect("JSON of plain values")
        );
    } else {
        print!("{}", report.to_text());
    }
    std::process::exit(report.exit_code());
}

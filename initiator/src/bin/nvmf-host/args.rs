//! The command line: nvme-cli's subcommands and flags where they exist.

use clap::{Parser, Subcommand, ValueEnum};
use nvmf_initiator::{MemoryWindows, Policy};

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-host",
    about = "NVMe-oF (RDMA) host tool: discover, identify, logs, block read/write",
    after_help = "Examples:\n  \
        nvmf-host discover -r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420'\n  \
        nvmf-host identify -r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 \
        subnqn:nqn.2016-06.io.spdk:cnode1' ctrl\n  \
        nvmf-host write -r ADDRESS-AS-FOR-IDENTIFY -s 0 -c 256 -f data.bin   (read: the same, into the file)"
)]
pub struct Cli {
    /// Host NQN (default: /etc/nvme/hostnqn or a generated one).
    #[arg(long, global = true)]
    pub hostnqn: Option<String>,
    /// Seconds allowed for each connection step.
    #[arg(long, global = true, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Per-I/O memory-window keys, invalidated when each I/O completes, as the Linux host
    /// does: auto (where the device has them, except soft-RoCE), on, off (the buffer pool
    /// registration's key).
    #[arg(long, global = true, default_value = "auto")]
    pub memory_windows: MemoryWindows,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Read the discovery log (as `nvme discover`). subnqn in -r is ignored.
    Discover {
        #[arg(short = 'r', long = "transport")]
        r: String,
    },
    /// Identify Controller or Namespace (as `nvme id-ctrl` / `nvme id-ns`).
    Identify {
        #[arg(short = 'r', long = "transport")]
        r: String,
        what: What,
        #[arg(short = 'n', long = "namespace-id", default_value_t = 1)]
        nsid: u32,
    },
    /// Read COUNT blocks from SLBA into FILE.
    Read(Rw),
    /// Write COUNT blocks at SLBA from FILE.
    Write(Rw),
    /// SMART / Health Information log (as `nvme smart-log`).
    SmartLog {
        #[arg(short = 'r', long = "transport")]
        r: String,
        #[arg(short = 'n', long = "namespace-id", default_value_t = 0xFFFF_FFFF)]
        nsid: u32,
    },
    /// Any log page (as `nvme get-log`): a hex dump, or the raw bytes with -b.
    GetLog {
        #[arg(short = 'r', long = "transport")]
        r: String,
        /// Log page identifier.
        #[arg(short = 'i', long = "log-id", value_parser = parse_num)]
        lid: u64,
        /// Bytes to read.
        #[arg(short = 'l', long = "log-len", value_parser = parse_num)]
        len: u64,
        #[arg(short = 'n', long = "namespace-id", default_value_t = 0xFFFF_FFFF)]
        nsid: u32,
        /// Write the raw bytes to stdout.
        #[arg(short = 'b', long = "raw-binary")]
        raw: bool,
    },
}

#[derive(clap::Args, Debug)]
pub struct Rw {
    /// The subsystem's address; given more than once (same subnqn, other addresses), the
    /// paths of a multipath namespace: I/O follows ANA state and fails over.
    #[arg(short = 'r', long = "transport", required = true)]
    pub r: Vec<String>,
    /// With several -r: active_passive (the first ANA-optimized path) or active_active
    /// (round robin over the optimized paths).
    #[arg(long, default_value = "active_passive", value_name = "POLICY")]
    pub multipath: Policy,
    /// With several -r: fail I/O once no path has been usable this many seconds (0: wait
    /// until every path's controller is lost, 600 s after its loss).
    #[arg(
        long,
        alias = "fast-io-fail-timeout",
        default_value_t = 0,
        value_name = "S"
    )]
    pub fast_io_fail_timeout_sec: u64,
    #[arg(short = 'n', long = "namespace-id", default_value_t = 1)]
    pub nsid: u32,
    /// Starting LBA.
    #[arg(short = 's', long = "start-block", value_parser = parse_num)]
    pub slba: u64,
    /// Number of blocks (one-based; nvme-cli's -c is zero-based).
    #[arg(short = 'c', long = "block-count", value_parser = parse_num)]
    pub count: u64,
    /// The file to write the data to (read) or take it from (write).
    #[arg(short = 'f', long = "data")]
    pub file: String,
    /// Commands in flight.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 8)]
    pub depth: u16,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum What {
    Ctrl,
    Ns,
}

fn parse_num(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_take_several_paths() {
        let r1 = "trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 subnqn:nqn.x";
        let r2 = "trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4421 subnqn:nqn.x";
        let cli = Cli::try_parse_from([
            "nvmf-host",
            "write",
            "-r",
            r1,
            "-r",
            r2,
            "-s",
            "0",
            "-c",
            "8",
            "-f",
            "d",
            "--multipath",
            "active_active",
            "--fast-io-fail-timeout-sec",
            "5",
        ])
        .unwrap();
        let Cmd::Write(a) = cli.cmd else {
            panic!("write")
        };
        assert_eq!(a.r, [r1, r2]);
        assert_eq!(a.multipath, Policy::ActiveActive);
        assert_eq!(a.fast_io_fail_timeout_sec, 5);
        let cli = Cli::try_parse_from([
            "nvmf-host",
            "read",
            "-r",
            r1,
            "-s",
            "0",
            "-c",
            "1",
            "-f",
            "d",
        ])
        .unwrap();
        let Cmd::Read(a) = cli.cmd else {
            panic!("read")
        };
        assert_eq!(a.multipath, Policy::ActivePassive);
        assert_eq!(a.fast_io_fail_timeout_sec, 0);
        assert!(
            Cli::try_parse_from(["nvmf-host", "read", "-s", "0", "-c", "1", "-f", "d"]).is_err()
        );
        assert!(Cli::try_parse_from([
            "nvmf-host",
            "read",
            "-r",
            r1,
            "-s",
            "0",
            "-c",
            "1",
            "-f",
            "d",
            "--multipath",
            "x"
        ])
        .is_err());
    }
}

//! The command line: spdk_nvme_perf's flags (`app/spdk_nvme_perf/perf.c`, `usage`), with
//! SPDK's size syntax (`-o 4k`), plus ours (reconnect, memory windows, idling, JSON).
//!
//! Every flag spdk_nvme_perf has is accepted, so its command lines run unchanged. A flag
//! whose effect exists here is applied; one that only means something to SPDK's
//! environment (DPDK memory, PCIe, TCP, TLS, tracing) is accepted with a one-line notice
//! ([`Args::notices`]); one whose effect would change the measurement and is not
//! implemented (`-a`, `-d`, `-e`, DH-HMAC-CHAP keys) is refused ([`Args::unsupported`]).

use clap::{ArgAction, Parser};
use nvmf_initiator::size::parse_size_u32;
use nvmf_initiator::{MemoryWindows, Policy};

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-perf",
    about = "NVMe-oF (RDMA) I/O benchmark, with spdk_nvme_perf's flags",
    after_help = "Examples:\n  \
        4 KiB random 70/30 mix at queue depth 32 for 10 s on two cores:\n    \
        nvmf-perf -r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 \
        subnqn:nqn.2016-06.io.spdk:cnode1' -q 32 -o 4k -w randrw -M 70 -t 10 -c 0x3\n  \
        Every subsystem the discovery service at 10.0.0.1:4420 lists (no subnqn), with a \
        latency histogram and the qpairs' counters:\n    \
        nvmf-perf -r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420' -q 128 -o 128k \
        -w read -t 10 -LL --transport-stats\n\n\
        Sizes take SPDK's units: 4096, 4k, 128K, 1m (KiB, MiB; an optional B)."
)]
pub struct Args {
    /// Transport ID: 'trtype:RDMA adrfam:IPv4 traddr:A trsvcid:4420 [subnqn:NQN] [hostnqn:NQN]
    /// [ns:N]'. Without subnqn: every NVM subsystem the discovery service there lists.
    /// Repeat for several controllers.
    #[arg(short = 'r', long = "transport", required = true)]
    pub transport: Vec<String>,
    /// Queue depth per namespace and core (shared by its -P qpairs).
    #[arg(short = 'q', long = "io-depth", default_value = "32", value_parser = parse_size_u32)]
    pub queue_depth: u32,
    /// I/O size in bytes, a multiple of the block size (4096, 4k, 128K, 1m).
    #[arg(short = 'o', long = "io-size", default_value = "4096", value_parser = parse_size_u32)]
    pub io_size: u32,
    /// read, write, randread, randwrite, rw, randrw.
    #[arg(short = 'w', long = "io-pattern")]
    pub pattern: String,
    /// Read percentage of rw / randrw (0-100; default 50).
    #[arg(short = 'M', long = "rwmixread")]
    pub rwmixread: Option<u32>,
    /// Run time in seconds.
    #[arg(short = 't', long = "time", default_value_t = 10)]
    pub time: u64,
    /// Core mask (0x3, 3, or [0,2-3]): one pinned polling thread per core.
    #[arg(short = 'c', long = "core-mask", default_value = "0x1")]
    pub core_mask: String,
    /// I/O qpairs per namespace and core.
    #[arg(short = 'P', long = "num-qpairs", default_value_t = 1)]
    pub qpairs: u32,
    /// Entries of each I/O queue (default: enough for its share of -q; capped by the
    /// controller's MQES).
    #[arg(long = "io-queue-size", value_parser = parse_size_u32)]
    pub io_queue_size: Option<u32>,
    /// Extra I/O qpairs connected per controller and never used.
    #[arg(short = 'U', long = "num-unused-qpairs", default_value_t = 0)]
    pub unused_qpairs: u32,
    /// Each namespace is driven from every core (instead of round robin).
    #[arg(long = "use-every-core")]
    pub use_every_core: bool,
    /// At most this many completions taken per poll of a qpair (0: as many as are ready).
    #[arg(short = 'C', long = "max-completion-per-poll", default_value_t = 0)]
    pub max_completions: u32,
    /// Zipf distribution of random I/O with this theta (0: uniform).
    #[arg(short = 'F', long = "zipf")]
    pub zipf: Option<f64>,
    /// Set Force Unit Access on reads and writes.
    #[arg(long)]
    pub fua: bool,
    /// Latency tracking: -L prints a percentile summary per namespace, -LL also the histogram.
    #[arg(short = 'L', long = "enable-sw-latency-tracking", action = ArgAction::Count)]
    pub latency: u8,
    /// Print each I/O qpair's transport counters at the end.
    #[arg(long = "transport-stats")]
    pub transport_stats: bool,
    /// Continue on I/O errors (they do not fail the run); print one error in every N.
    #[arg(short = 'Q', long = "continue-on-error")]
    pub continue_on_error: Option<u64>,
    /// Keep Alive Timeout in milliseconds (spdk_nvme_perf's form of --kato).
    #[arg(short = 'k', long = "keepalive", conflicts_with = "kato")]
    pub keepalive_ms: Option<u64>,
    /// Print the results as one JSON document (and nothing else on stdout).
    #[arg(long)]
    pub json: bool,
    /// Host NQN (default: /etc/nvme/hostnqn or a generated one).
    #[arg(long)]
    pub hostnqn: Option<String>,
    /// Fail an I/O (and reset the controller) when it is older than this many seconds.
    #[arg(long, default_value_t = 10)]
    pub io_timeout: u64,
    /// Seconds allowed for each connection step (address, route, connect, Fabrics Connect).
    #[arg(long, default_value_t = 10)]
    pub connect_timeout: u64,
    /// Keep Alive Timeout in seconds (0: off).
    #[arg(long, default_value_t = 5)]
    pub kato: u64,
    /// Reconnect after a failure every this many seconds (enables reconnect).
    #[arg(long)]
    pub reconnect_delay: Option<u64>,
    /// With reconnect: give up this many seconds after the loss (-1: never; default 600).
    #[arg(long, allow_negative_numbers = true)]
    pub ctrl_loss_tmo: Option<i64>,
    /// Several -r naming one subsystem at different addresses are paths to its namespaces
    /// (same NGUID / EUI64 / UUID): active_passive (the first ANA-optimized path, failing
    /// over and back), active_active (round robin over the optimized paths; SPDK's
    /// multipath policy), or disable (each address is a controller of its own).
    #[arg(long, default_value = "active_passive", value_name = "MODE")]
    pub multipath: MultipathMode,
    /// Multipath: fail I/O once no path has been usable this many seconds (SPDK's
    /// fast_io_fail_timeout_sec; 0: wait until every path's controller is lost).
    #[arg(
        long,
        alias = "fast-io-fail-timeout",
        default_value_t = 0,
        value_name = "S"
    )]
    pub fast_io_fail_timeout_sec: u64,
    /// Send writes as in-capsule data when the controller allows (0 disables).
    #[arg(long, default_value_t = 1)]
    pub in_capsule: u8,
    /// Per-I/O memory-window keys, invalidated when each I/O completes, as the Linux host
    /// does: auto (where the device has them, except soft-RoCE), on, off (the buffer pool
    /// registration's key).
    #[arg(long, default_value = "auto")]
    pub memory_windows: MemoryWindows,
    /// Empty polls in a row before a worker yields its core to other threads (0: never
    /// yield, pure spinning). On soft-RoCE the NIC is kernel CPU time on the same cores.
    #[arg(long, default_value_t = 0)]
    pub idle_spin: u32,
    /// Sleep this many microseconds instead of yielding once idle (0: yield).
    #[arg(long, default_value_t = 0)]
    pub idle_sleep_us: u64,
    #[command(flatten)]
    pub spdk: SpdkOnly,
}

/// spdk_nvme_perf flags that are accepted but have no effect here, or are refused.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "spdk_nvme_perf flags accepted for compatibility")]
pub struct SpdkOnly {
    /// Refused: a warm-up period is not implemented.
    #[arg(short = 'a', long = "warmup-time")]
    warmup_time: Option<u64>,
    /// Refused: a count of I/Os as exit criterion is not implemented.
    #[arg(short = 'd', long = "number-ios")]
    number_ios: Option<String>,
    /// Refused: end-to-end protection (metadata) is not supported.
    #[arg(short = 'e', long = "metadata")]
    metadata: Option<String>,
    /// Refused: DH-HMAC-CHAP authentication is not supported.
    #[arg(long = "dhchap-key")]
    dhchap_key: Option<String>,
    /// Refused: DH-HMAC-CHAP authentication is not supported.
    #[arg(long = "dhchap-ctrlr-key")]
    dhchap_ctrlr_key: Option<String>,
    /// Ignored (I/O unit size of SPDK's PCIe driver).
    #[arg(short = 'O', long = "io-unit-size")]
    io_unit_size: Option<String>,
    /// Ignored: buffers are page aligned (4096), which satisfies any smaller alignment.
    #[arg(short = 'A', long = "buffer-alignment", value_parser = parse_size_u32)]
    buffer_alignment: Option<u32>,
    /// Ignored (DPDK huge memory size).
    #[arg(short = 's', long = "hugemem-size")]
    hugemem_size: Option<String>,
    /// Ignored (DPDK memory segments).
    #[arg(short = 'g', long = "mem-single-seg")]
    mem_single_seg: bool,
    /// Ignored (DPDK shared memory group).
    #[arg(short = 'i', long = "shmem-grp-id")]
    shmem_grp_id: Option<String>,
    /// Ignored (DPDK IOVA mode).
    #[arg(long = "iova-mode")]
    iova_mode: Option<String>,
    /// Ignored (DPDK huge pages).
    #[arg(long = "no-huge")]
    no_huge: bool,
    /// Ignored (DPDK NUMA).
    #[arg(long = "enforce-numa")]
    enforce_numa: bool,
    /// Ignored (DPDK environment).
    #[arg(long = "env-context")]
    env_context: Option<String>,
    /// Ignored (vfio-pci).
    #[arg(long = "vfio-vf-token")]
    vfio_vf_token: Option<String>,
    /// Ignored (PCIe device allow list).
    #[arg(short = 'b', long = "allowed-pci-addr")]
    allowed_pci_addr: Vec<String>,
    /// Ignored (PCIe VMD).
    #[arg(short = 'V', long = "enable-vmd")]
    enable_vmd: bool,
    /// Ignored (PCIe controller memory buffer).
    #[arg(short = 'D', long = "disable-sq-cmb")]
    disable_sq_cmb: bool,
    /// Ignored (PCIe interrupts): completions are polled.
    #[arg(short = 'E', long = "enable-interrupt")]
    enable_interrupt: bool,
    /// Ignored (kernel devices through io_uring).
    #[arg(short = 'R', long = "enable-uring")]
    enable_uring: bool,
    /// Ignored (TCP socket implementation).
    #[arg(short = 'S', long = "default-sock-impl")]
    default_sock_impl: Option<String>,
    /// Ignored (TCP/TLS).
    #[arg(long = "disable-ktls")]
    disable_ktls: bool,
    /// Ignored (TCP/TLS).
    #[arg(long = "enable-ktls")]
    enable_ktls: bool,
    /// Ignored (TCP/TLS).
    #[arg(long = "tls-version")]
    tls_version: Option<String>,
    /// Ignored (TCP/TLS).
    #[arg(long = "psk-path")]
    psk_path: Option<String>,
    /// Ignored (TCP/TLS).
    #[arg(long = "psk-identity")]
    psk_identity: Option<String>,
    /// Ignored (TCP zero copy).
    #[arg(long = "zerocopy-threshold")]
    zerocopy_threshold: Option<String>,
    /// Ignored (TCP zero copy).
    #[arg(long = "zerocopy-threshold-sock-impl")]
    zerocopy_threshold_sock_impl: Option<String>,
    /// Ignored (TCP zero copy).
    #[arg(short = 'z', long = "disable-zcopy")]
    disable_zcopy: Option<String>,
    /// Ignored (TCP zero copy).
    #[arg(short = 'Z', long = "enable-zcopy")]
    enable_zcopy: Option<String>,
    /// Ignored (TCP header digest).
    #[arg(short = 'H', long = "enable-tcp-hdgst")]
    tcp_hdgst: bool,
    /// Ignored (TCP data digest).
    #[arg(short = 'I', long = "enable-tcp-ddgst")]
    tcp_ddgst: bool,
    /// Ignored: the RDMA type of service is the system's default.
    #[arg(long = "transport-tos")]
    transport_tos: Option<String>,
    /// Ignored: each qpair has its own receive queue.
    #[arg(long = "rdma-srq-size")]
    rdma_srq_size: Option<String>,
    /// Ignored: SQ flow control is always on.
    #[arg(long = "disable-sq-flow-control")]
    disable_sq_flow_control: bool,
    /// Ignored: controllers are always shut down on exit (CC.SHN), as nvme-cli does.
    #[arg(short = 'N', long = "no-shst-notification")]
    no_shst_notification: bool,
    /// Ignored (Intel vendor latency log pages).
    #[arg(short = 'l', long = "enable-ssd-latency-tracking")]
    ssd_latency: bool,
    /// Ignored (CPU usage display).
    #[arg(short = 'm', long = "cpu-usage")]
    cpu_usage: bool,
    /// Ignored: use RUST_LOG.
    #[arg(short = 'T', long = "logflag")]
    logflag: Vec<String>,
    /// Ignored: use RUST_LOG.
    #[arg(long = "log-level")]
    log_level: Option<String>,
    /// Ignored (SPDK trace points).
    #[arg(short = 'y', long = "tpoint-group-mask")]
    tpoint_group_mask: Option<String>,
}

/// `--multipath`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultipathMode {
    Disable,
    On(Policy),
}

impl std::str::FromStr for MultipathMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "disable" | "disabled" | "off" => Ok(Self::Disable),
            p => p
                .parse::<Policy>()
                .map(Self::On)
                .map_err(|_| format!("{s:?}: expected active_passive, active_active or disable")),
        }
    }
}

impl Args {
    /// Flags of spdk_nvme_perf that would change what is measured and are not implemented.
    pub fn unsupported(&self) -> Vec<&'static str> {
        let s = &self.spdk;
        let mut out = Vec::new();
        if s.warmup_time.is_some_and(|t| t > 0) {
            out.push("-a/--warmup-time: a warm-up period is not implemented");
        }
        if s.number_ios.is_some() {
            out.push("-d/--number-ios: an I/O count as exit criterion is not implemented");
        }
        if s.metadata.is_some() {
            out.push("-e/--metadata: end-to-end protection (metadata) is not supported");
        }
        if s.dhchap_key.is_some() || s.dhchap_ctrlr_key.is_some() {
            out.push("--dhchap-key/--dhchap-ctrlr-key: DH-HMAC-CHAP is not supported");
        }
        out
    }

    /// One line per given flag that has no effect here.
    pub fn notices(&self) -> Vec<String> {
        let s = &self.spdk;
        let mut out = Vec::new();
        let mut ignored = |given: bool, flag: &str, why: &str| {
            if given {
                out.push(format!("{flag} ignored: {why}"));
            }
        };
        const DPDK: &str = "no DPDK environment here";
        const PCIE: &str = "no PCIe transport here";
        const TCP: &str = "only the RDMA transport here";
        ignored(s.io_unit_size.is_some(), "-O/--io-unit-size", PCIE);
        ignored(
            s.buffer_alignment.is_some_and(|a| a <= 4096),
            "-A/--buffer-alignment",
            "buffers are page aligned (4096)",
        );
        ignored(s.hugemem_size.is_some(), "-s/--hugemem-size", DPDK);
        ignored(s.mem_single_seg, "-g/--mem-single-seg", DPDK);
        ignored(s.shmem_grp_id.is_some(), "-i/--shmem-grp-id", DPDK);
        ignored(s.iova_mode.is_some(), "--iova-mode", DPDK);
        ignored(s.no_huge, "--no-huge", DPDK);
        ignored(s.enforce_numa, "--enforce-numa", DPDK);
        ignored(s.env_context.is_some(), "--env-context", DPDK);
        ignored(s.vfio_vf_token.is_some(), "--vfio-vf-token", PCIE);
        ignored(
            !s.allowed_pci_addr.is_empty(),
            "-b/--allowed-pci-addr",
            PCIE,
        );
        ignored(s.enable_vmd, "-V/--enable-vmd", PCIE);
        ignored(s.disable_sq_cmb, "-D/--disable-sq-cmb", PCIE);
        ignored(
            s.enable_interrupt,
            "-E/--enable-interrupt",
            "completions are polled",
        );
        ignored(
            s.enable_uring,
            "-R/--enable-uring",
            "no kernel devices here",
        );
        ignored(s.default_sock_impl.is_some(), "-S/--default-sock-impl", TCP);
        ignored(
            s.disable_ktls
                || s.enable_ktls
                || s.tls_version.is_some()
                || s.psk_path.is_some()
                || s.psk_identity.is_some(),
            "TLS options",
            TCP,
        );
        ignored(
            s.zerocopy_threshold.is_some()
                || s.zerocopy_threshold_sock_impl.is_some()
                || s.disable_zcopy.is_some()
                || s.enable_zcopy.is_some(),
            "socket zero-copy options",
            TCP,
        );
        ignored(s.tcp_hdgst || s.tcp_ddgst, "-H/-I (TCP digests)", TCP);
        ignored(
            s.transport_tos.is_some(),
            "--transport-tos",
            "the RDMA type of service is the system's default",
        );
        ignored(
            s.rdma_srq_size.is_some(),
            "--rdma-srq-size",
            "each qpair has its own receive queue",
        );
        ignored(
            s.disable_sq_flow_control,
            "--disable-sq-flow-control",
            "SQ flow control is always on",
        );
        ignored(
            s.no_shst_notification,
            "-N/--no-shst-notification",
            "controllers are always shut down on exit",
        );
        ignored(
            s.ssd_latency,
            "-l/--enable-ssd-latency-tracking",
            "Intel vendor log pages are not read (use -L)",
        );
        ignored(s.cpu_usage, "-m/--cpu-usage", "not implemented");
        ignored(!s.logflag.is_empty(), "-T/--logflag", "use RUST_LOG");
        ignored(s.log_level.is_some(), "--log-level", "use RUST_LOG");
        ignored(
            s.tpoint_group_mask.is_some(),
            "-y/--tpoint-group-mask",
            "no SPDK trace points here",
        );
        if s.buffer_alignment.is_some_and(|a| a > 4096) {
            out.push(format!(
                "-A/--buffer-alignment {}: buffers are aligned to 4096 only",
                s.buffer_alignment.unwrap_or_default()
            ));
        }
        out
    }

    /// The Keep Alive Timeout: `-k` (ms) when given, else `--kato` (s).
    pub fn keep_alive(&self) -> std::time::Duration {
        match self.keepalive_ms {
            Some(ms) => std::time::Duration::from_millis(ms),
            None => std::time::Duration::from_secs(self.kato),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(line: &str) -> Args {
        let mut argv = vec!["nvmf-perf".to_string()];
        // A tiny shell: single quotes group words.
        let mut rest = line;
        while let Some(start) = rest.find(|c: char| !c.is_whitespace()) {
            rest = &rest[start..];
            if let Some(r) = rest.strip_prefix('\'') {
                let end = r.find('\'').expect("closing quote");
                argv.push(r[..end].to_string());
                rest = &r[end + 1..];
            } else {
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                argv.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
        Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn spdk_documented_command_line() {
        let a = parse(
            "-q 128 -o 4096 -w randrw -M 50 -t 10 -r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420'",
        );
        assert_eq!(a.queue_depth, 128);
        assert_eq!(a.io_size, 4096);
        assert_eq!(a.pattern, "randrw");
        assert_eq!(a.rwmixread, Some(50));
        assert_eq!(a.time, 10);
        assert_eq!(
            a.transport,
            ["trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420"]
        );
        let tid: nvmf_initiator::TransportId = a.transport[0].parse().unwrap();
        assert!(tid.is_discovery());
        assert!(a.notices().is_empty() && a.unsupported().is_empty());
        assert_eq!(a.latency, 0);
        assert!(!a.transport_stats);
        assert_eq!(a.keep_alive(), Duration::from_secs(5));
    }

    #[test]
    fn sizes_latency_levels_and_stats() {
        let a = parse("-r 'traddr:10.0.0.1' -w read -o 4k -LL --transport-stats");
        assert_eq!(a.io_size, 4096);
        assert_eq!(a.latency, 2);
        assert!(a.transport_stats);
        let a = parse("-r 'traddr:10.0.0.1' -w read -o 128K -L -q 1k --io-queue-size 256");
        assert_eq!((a.io_size, a.latency, a.queue_depth), (128 * 1024, 1, 1024));
        assert_eq!(a.io_queue_size, Some(256));
        let a = parse("-r 'traddr:10.0.0.1' -w read --io-size 1m --enable-sw-latency-tracking");
        assert_eq!((a.io_size, a.latency), (1 << 20, 1));
        assert!(Args::try_parse_from([
            "nvmf-perf",
            "-r",
            "traddr:1.2.3.4",
            "-w",
            "read",
            "-o",
            "4x"
        ])
        .is_err());
    }

    #[test]
    fn applied_spdk_flags() {
        let a = parse(
            "-r 'traddr:10.0.0.1 subnqn:nqn.a' -r 'traddr:10.0.0.2' -w randread -k 3000 -C 16 -Q 100 -F 1.2 --fua -U 2 -P 4 --use-every-core",
        );
        assert_eq!(a.transport.len(), 2);
        assert_eq!(a.keep_alive(), Duration::from_millis(3000));
        assert_eq!(a.max_completions, 16);
        assert_eq!(a.continue_on_error, Some(100));
        assert_eq!(a.zipf, Some(1.2));
        assert!(a.fua && a.use_every_core);
        assert_eq!((a.unused_qpairs, a.qpairs), (2, 4));
        // -k and --kato are the same setting in two units.
        assert!(Args::try_parse_from([
            "nvmf-perf",
            "-r",
            "traddr:1.2.3.4",
            "-w",
            "read",
            "-k",
            "1000",
            "--kato",
            "2"
        ])
        .is_err());
    }

    #[test]
    fn environment_flags_are_accepted_with_a_notice() {
        let a = parse(
            "-r 'traddr:10.0.0.1' -w read -s 4096 -g -i 1 --no-huge -N -H -I -m -T nvme -b 0000:d8:00.0 -A 64 --transport-tos 8 -l",
        );
        let n = a.notices();
        for flag in [
            "-s/",
            "-g/",
            "-i/",
            "--no-huge",
            "-N/",
            "-H/-I",
            "-m/",
            "-T/",
            "-b/",
            "-A/",
            "--transport-tos",
            "-l/",
        ] {
            assert!(n.iter().any(|l| l.starts_with(flag)), "{flag}: {n:#?}");
        }
        assert_eq!(n.len(), 12, "{n:#?}");
        assert!(a.unsupported().is_empty());
    }

    #[test]
    fn flags_that_would_change_the_measurement_are_refused() {
        let a = parse("-r 'traddr:10.0.0.1' -w read -a 5 -d 1000 -e PRACT=1 --dhchap-key k");
        assert_eq!(a.unsupported().len(), 4, "{:?}", a.unsupported());
        let a = parse("-r 'traddr:10.0.0.1' -w read -a 0");
        assert!(a.unsupported().is_empty());
    }

    #[test]
    fn multipath_options() {
        let two = "-r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4420 subnqn:nqn.x' \
                   -r 'trtype:RDMA adrfam:IPv4 traddr:10.0.0.1 trsvcid:4421 subnqn:nqn.x' \
                   -w randrw";
        let a = parse(two);
        assert_eq!(a.transport.len(), 2);
        assert_eq!(a.multipath, MultipathMode::On(Policy::ActivePassive));
        assert_eq!(a.fast_io_fail_timeout_sec, 0);
        let a = parse(&format!(
            "{two} --multipath active_active --fast-io-fail-timeout-sec 7"
        ));
        assert_eq!(a.multipath, MultipathMode::On(Policy::ActiveActive));
        assert_eq!(a.fast_io_fail_timeout_sec, 7);
        let a = parse(&format!(
            "{two} --multipath disable --fast-io-fail-timeout 3"
        ));
        assert_eq!(a.multipath, MultipathMode::Disable);
        assert_eq!(a.fast_io_fail_timeout_sec, 3);
        assert_eq!(
            parse("--multipath failover -r x -w read").multipath,
            MultipathMode::On(Policy::ActivePassive)
        );
        let e = Args::try_parse_from(["nvmf-perf", "-r", "x", "-w", "read", "--multipath", "both"]);
        assert!(e.unwrap_err().to_string().contains("active_passive"));
    }
}

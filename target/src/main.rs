//! `nvmf-tgt`: the NVMe-oF target daemon. Flags follow SPDK's `nvmf_tgt` (`lib/event/app.c`):
//! the ones with a meaning here are applied (`-m`, `-c`, `-r`, `--wait-for-rpc`,
//! `--json-ignore-init-errors`, `-L`, `--silence-noticelog`, `--rpcs-allowed`,
//! `--no-rpc-server`, `-v`); ours: `--poll-mode` (what an idle reactor does); the DPDK,
//! hugepage, PCI, trace and interrupt-mode ones are accepted and ignored with a one-line notice each, so SPDK's systemd units and scripts start
//! it unchanged.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{ArgAction, Parser};
use nvmf_common::reactor::{check_cores, parse_core_mask};
use nvmf_common::reactor::{IdleMode, IdlePolicy};
use nvmf_target::core::TargetInfo;
use nvmf_target::reactor::{start_reactors, stop_reactors};
use nvmf_target::rpc::app::KillSignal;
use nvmf_target::rpc::log::{Level, LogControl};
use nvmf_target::rpc::{
    call_fn, load_config_with, method_names, Control, InitState, LoadOptions, TransportFactory,
};
use nvmf_target::target::Target;
use nvmf_target::transport::options::{TransportKind, TransportOptions};
use nvmf_target::transport::rdma::RdmaTransport;
use nvmf_target::transport::{Transport, TransportError};

const EXAMPLES: &str = "\
Examples:
  nvmf-tgt -m 0x3 -c config.json                  two reactors, SPDK saved config
  nvmf-tgt -m [0,2] -r /run/nvmf.sock --wait-for-rpc
  nvmf-tgt -i 0 -e 0xFFFF -m 0x3 -s 1024 -L nvmf  an SPDK nvmf_tgt command line: -i, -e and
                                                  -s are accepted and ignored, -L nvmf turns
                                                  on the nvmf debug log
  nvmf-tgt -c config.json --json-ignore-init-errors --metrics-listen 9464

SPDK flags accepted and ignored (no DPDK, hugepages, PCI devices or trace buffers here):
  -i/--shm-id, -e/--tpoint-group, -s/--mem-size, -n/--mem-channels, -p/--main-core,
  --no-huge, -R/--huge-unlink, --huge-dir, --iova-mode, --base-virtaddr, -u/--no-pci,
  -A/--pci-allowed, -B/--pci-blocked, -W, --num-trace-entries, --lcores, --interrupt-mode,
  --disable-cpumask-locks, -g/--single-file-segments, -d/--limit-coredump, --env-context,
  --vfio-vf-token, --msg-mempool-size, --enforce-numa";

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-tgt",
    version,
    about = "NVMe over Fabrics target (RDMA)",
    disable_version_flag = true,
    after_help = EXAMPLES
)]
struct Args {
    /// Print the version (SPDK's -v).
    #[arg(short = 'v', short_alias = 'V', long = "version", action = ArgAction::Version)]
    version: Option<bool>,
    /// Core mask of the reactors: hex (0x3), decimal, or a list ([0,2-3]).
    #[arg(short = 'm', long = "cpumask", default_value = "0x1")]
    cpumask: String,
    /// JSON configuration in SPDK's saved-config format, applied at start.
    #[arg(short = 'c', long = "json", visible_alias = "config")]
    json: Option<PathBuf>,
    /// Keep loading the -c config after an entry fails (the failure is logged).
    #[arg(long = "json-ignore-init-errors")]
    json_ignore_init_errors: bool,
    /// Unix socket of the JSON-RPC server.
    #[arg(short = 'r', long = "rpc-socket", default_value = nvmf_rpc::DEFAULT_SOCKET_PATH)]
    rpc_socket: PathBuf,
    /// Also serve JSON-RPC on this TCP address (ADDR:PORT). Loopback only, unless
    /// --rpc-token-file is given: then any address, and every request needs the token.
    #[arg(long = "rpc-listen")]
    rpc_listen: Option<String>,
    /// File holding the shared secret TCP clients send as "auth_token" (mode 0600, at least
    /// 16 bytes). The Unix socket never asks for it.
    #[arg(long = "rpc-token-file", value_name = "PATH")]
    rpc_token_file: Option<PathBuf>,
    /// Group (name or number) allowed to use the Unix socket: mode 0660 instead of 0600.
    #[arg(long = "rpc-socket-group", value_name = "GROUP")]
    rpc_socket_group: Option<String>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (off by default; a bare PORT
    /// binds 127.0.0.1). Example: --metrics-listen 9464
    #[arg(long = "metrics-listen", value_name = "[ADDR:]PORT")]
    metrics_listen: Option<String>,
    /// Hold initialization until the framework_start_init RPC.
    #[arg(long = "wait-for-rpc")]
    wait_for_rpc: bool,
    /// error, warn, info, debug or trace (RUST_LOG overrides it).
    #[arg(long = "log-level", default_value = "info")]
    log_level: String,
    /// Turn on debug logs of an SPDK log flag (nvmf, nvmf_rdma, rdma, bdev, ... or all;
    /// as log_set_flag). Repeatable.
    #[arg(short = 'L', long = "logflag", value_name = "FLAG")]
    logflag: Vec<String>,
    /// Log warnings and errors only (no notices).
    #[arg(long = "silence-noticelog")]
    silence_noticelog: bool,
    /// Serve only these RPC methods (comma-separated).
    #[arg(long = "rpcs-allowed", value_name = "METHODS", value_delimiter = ',')]
    rpcs_allowed: Option<Vec<String>>,
    /// Serve no JSON-RPC at all (a -c config sets the target up).
    #[arg(long = "no-rpc-server")]
    no_rpc_server: bool,
    /// What an idle reactor does: adaptive (spin a while, then sleep until a completion, a
    /// message or a timer), pure (spin always, as SPDK's default), backoff (spin, yield, nap).
    #[arg(long = "poll-mode", value_name = "MODE", default_value = "adaptive")]
    poll_mode: IdleMode,
    /// Adaptive mode: the longest a reactor spins (yielding) before it sleeps; it spins for
    /// twice the typical gap between bursts of work, up to this. 0: sleep after 20 µs.
    #[arg(
        long = "max-spin-us",
        value_name = "MICROSECONDS",
        default_value_t = 2000
    )]
    max_spin_us: u64,
    /// Adaptive and back-off modes: idle turns a reactor spins before it first looks at the
    /// clock (and so before it may sleep). A turn takes ~0.1 µs on hardware, some µs under
    /// emulation.
    #[arg(
        long = "min-spin-turns",
        value_name = "TURNS",
        default_value_t = nvmf_common::reactor::DEFAULT_MIN_SPIN_TURNS
    )]
    min_spin_turns: u32,
    #[command(flatten)]
    ignored: IgnoredSpdkFlags,
}

/// SPDK `app.c` flags that configure DPDK, hugepages, PCI devices, tracing or the reactor
/// model SPDK has and this target does not: accepted so SPDK's command lines start nvmf-tgt,
/// each ignored with a notice saying why.
#[derive(clap::Args, Debug, Default)]
struct IgnoredSpdkFlags {
    #[arg(short = 'i', long = "shm-id", hide = true, allow_hyphen_values = true)]
    shm_id: Option<String>,
    #[arg(short = 'e', long = "tpoint-group", hide = true)]
    tpoint_group: Option<String>,
    #[arg(short = 's', long = "mem-size", hide = true)]
    mem_size: Option<String>,
    #[arg(short = 'n', long = "mem-channels", hide = true)]
    mem_channels: Option<String>,
    #[arg(short = 'p', long = "main-core", hide = true)]
    main_core: Option<String>,
    #[arg(long = "no-huge", hide = true)]
    no_huge: bool,
    #[arg(short = 'R', long = "huge-unlink", hide = true)]
    huge_unlink: bool,
    #[arg(long = "huge-dir", hide = true)]
    huge_dir: Option<String>,
    #[arg(long = "iova-mode", hide = true)]
    iova_mode: Option<String>,
    #[arg(long = "base-virtaddr", hide = true)]
    base_virtaddr: Option<String>,
    #[arg(short = 'u', long = "no-pci", hide = true)]
    no_pci: bool,
    #[arg(short = 'A', long = "pci-allowed", hide = true)]
    pci_allowed: Vec<String>,
    #[arg(short = 'B', long = "pci-blocked", hide = true)]
    pci_blocked: Vec<String>,
    #[arg(short = 'W', hide = true)]
    pci_whitelist: Vec<String>,
    #[arg(long = "num-trace-entries", hide = true)]
    num_trace_entries: Option<String>,
    #[arg(long = "lcores", hide = true)]
    lcores: Option<String>,
    #[arg(long = "interrupt-mode", hide = true)]
    interrupt_mode: bool,
    #[arg(long = "disable-cpumask-locks", hide = true)]
    disable_cpumask_locks: bool,
    #[arg(short = 'g', long = "single-file-segments", hide = true)]
    single_file_segments: bool,
    #[arg(short = 'd', long = "limit-coredump", hide = true)]
    limit_coredump: bool,
    #[arg(long = "env-context", hide = true, allow_hyphen_values = true)]
    env_context: Option<String>,
    #[arg(long = "vfio-vf-token", hide = true)]
    vfio_vf_token: Option<String>,
    #[arg(long = "msg-mempool-size", hide = true)]
    msg_mempool_size: Option<String>,
    #[arg(long = "enforce-numa", hide = true)]
    enforce_numa: bool,
}

impl IgnoredSpdkFlags {
    /// One notice per flag given: "ignoring -s 1024: DPDK memory size has no meaning here".
    fn notices(&self) -> Vec<String> {
        const DPDK: &str = "no DPDK environment here";
        let mut out = Vec::new();
        let mut value = |flag: &str, v: &Option<String>, why: &str| {
            if let Some(v) = v {
                out.push(format!("ignoring {flag} {v}: {why}"));
            }
        };
        value(
            "-i",
            &self.shm_id,
            "no shared-memory trace or multi-process group here",
        );
        value(
            "-e",
            &self.tpoint_group,
            "SPDK trace points have no meaning here",
        );
        value("-s", &self.mem_size, "DPDK memory size has no meaning here");
        value("-n", &self.mem_channels, DPDK);
        value(
            "-p",
            &self.main_core,
            "there is no main reactor here; -m picks the cores",
        );
        value("--huge-dir", &self.huge_dir, "no hugepages are used");
        value("--iova-mode", &self.iova_mode, DPDK);
        value("--base-virtaddr", &self.base_virtaddr, DPDK);
        value(
            "--num-trace-entries",
            &self.num_trace_entries,
            "SPDK trace points have no meaning here",
        );
        value(
            "--lcores",
            &self.lcores,
            "use -m to pick the reactors' cores",
        );
        value("--env-context", &self.env_context, DPDK);
        value(
            "--vfio-vf-token",
            &self.vfio_vf_token,
            "no PCI devices are used",
        );
        value(
            "--msg-mempool-size",
            &self.msg_mempool_size,
            "poll groups take messages on unbounded queues",
        );
        for (flag, list) in [
            ("-A", &self.pci_allowed),
            ("-B", &self.pci_blocked),
            ("-W", &self.pci_whitelist),
        ] {
            for v in list {
                out.push(format!("ignoring {flag} {v}: no PCI devices are used"));
            }
        }
        for (flag, set, why) in [
            ("--no-huge", self.no_huge, "no hugepages are used"),
            ("-R", self.huge_unlink, "no hugepages are used"),
            (
                "-u",
                self.no_pci,
                "no PCI devices are used (already the case)",
            ),
            (
                "--interrupt-mode",
                self.interrupt_mode,
                "idle reactors already sleep on their completion channels (--poll-mode adaptive)",
            ),
            (
                "--disable-cpumask-locks",
                self.disable_cpumask_locks,
                "no per-core lock files are taken",
            ),
            ("-g", self.single_file_segments, "no hugepages are used"),
            (
                "-d",
                self.limit_coredump,
                "nvmf-tgt never raises the core-dump limit",
            ),
            ("--enforce-numa", self.enforce_numa, DPDK),
        ] {
            if set {
                out.push(format!("ignoring {flag}: {why}"));
            }
        }
        out
    }
}

/// The JSON-RPC server's access options from --rpc-socket-group and --rpc-token-file.
fn rpc_options(args: &Args) -> anyhow::Result<nvmf_rpc::ServerOptions> {
    let mut opts = nvmf_rpc::ServerOptions::default();
    if let Some(group) = &args.rpc_socket_group {
        opts.socket_group = Some(nvmf_rpc::group_id(group)?);
        opts.socket_mode = 0o660;
    }
    if let Some(path) = &args.rpc_token_file {
        opts.tcp_token = Some(nvmf_rpc::AuthToken::from_file(path)?);
    }
    Ok(opts)
}

fn transport_factory() -> TransportFactory {
    Box::new(
        |opts: &TransportOptions| -> Result<Arc<dyn Transport>, TransportError> {
            match opts.kind().map_err(TransportError::invalid_option)? {
                TransportKind::Rdma => Ok(Arc::new(RdmaTransport::new(opts.clone())?)),
                other => Err(TransportError::UnsupportedType(other.name().to_string())),
            }
        },
    )
}

/// Installs the subscriber: `--log-level` (or `RUST_LOG`), `-L` flags and
/// `--silence-noticelog`, behind a reload layer the `log_*` methods change at run time.
/// Colours only when the log goes to a terminal.
fn init_logging(args: &Args) -> anyhow::Result<LogControl> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let level = if args.silence_noticelog {
        Level::Warning
    } else {
        Level::from_tracing(&args.log_level)
            .with_context(|| format!("bad --log-level {:?}", args.log_level))?
    };
    let initial = match std::env::var("RUST_LOG") {
        Ok(spec) => Some(spec),
        Err(_) if args.silence_noticelog => None,
        Err(_) => Some(args.log_level.clone()),
    };
    let mut log = LogControl::new(level, initial);
    for flag in &args.logflag {
        log.set_flag(flag, true)
            .map_err(|e| anyhow::anyhow!("-L {flag}: {e}"))?;
    }
    let (filter, apply) =
        nvmf_target::rpc::log::reload_filter(&log.directives()).map_err(anyhow::Error::msg)?;
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_target(false)
                .with_ansi(std::io::stdout().is_terminal()),
        )
        .init();
    log.set_apply(apply);
    Ok(log)
}

fn main() {
    // First: a panic on any thread from here on ends the process (status 70), so that no
    // reactor can die and leave its hosts served by nobody.
    nvmf_target::exit_on_panic::install();
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("nvmf-tgt: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let log = init_logging(&args)?;
    for notice in args.ignored.notices() {
        tracing::info!("{notice}");
    }
    let cores = parse_core_mask(&args.cpumask)?;
    check_cores(&cores)?;
    // Read and parse the config before anything starts, so a bad file never half-starts.
    let config = match &args.json {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("config {} is not valid JSON", path.display()))?;
            Some(json)
        }
        None => None,
    };

    let info = Arc::new(TargetInfo::default());
    let (reactors, handles) = start_reactors(
        &cores,
        &info,
        IdlePolicy {
            mode: args.poll_mode,
            max_spin: Duration::from_micros(args.max_spin_us),
            min_spin_turns: args.min_spin_turns,
        },
    )
    .context("cannot start reactors")?;
    let mut target = Target::new(Arc::clone(&info));
    for h in handles {
        target.add_poll_group(h);
    }
    let mut control = Control::new(target, transport_factory());
    control.log = log;
    control.reactors = reactors
        .iter()
        .map(|r| nvmf_target::metrics::ReactorCounters {
            core: r.core,
            stats: Arc::clone(&r.stats),
        })
        .collect();
    // spdk_kill_instance: SIGKILL as asked, every other signal as SIGTERM (a clean stop).
    let stop = Arc::new(AtomicBool::new(false));
    let stop_by_rpc = Arc::clone(&stop);
    control.on_kill = Some(Box::new(move |signal| {
        if signal == KillSignal::Kill {
            let _ = signal_hook::low_level::raise(signal.number());
        }
        tracing::info!(signal = signal.name(), "spdk_kill_instance: shutting down");
        stop_by_rpc.store(true, Ordering::Relaxed);
    }));
    if args.wait_for_rpc {
        control.init_state = InitState::WaitingForRpc;
    }
    if let Some(json) = &config {
        let options = LoadOptions {
            ignore_errors: args.json_ignore_init_errors,
        };
        if let Err(e) = load_config_with(&mut control, json, options) {
            drop(control);
            stop_reactors(reactors);
            bail!(
                "config {}: {e}",
                args.json
                    .as_ref()
                    .expect("config came from a file")
                    .display()
            );
        }
    }
    let control = Arc::new(Mutex::new(control));
    if let Some(spec) = &args.metrics_listen {
        let counters = reactors
            .iter()
            .map(|r| nvmf_target::metrics::ReactorCounters {
                core: r.core,
                stats: Arc::clone(&r.stats),
            })
            .collect();
        let served = nvmf_target::metrics::parse_listen(spec)
            .map_err(anyhow::Error::msg)
            .and_then(|addr| {
                nvmf_target::metrics::serve(addr, Arc::clone(&control), counters)
                    .with_context(|| format!("cannot serve metrics on {addr}"))
            });
        if let Err(e) = served {
            drop(control);
            stop_reactors(reactors);
            return Err(e);
        }
    }
    let mut names = method_names();
    if let Some(allowed) = &args.rpcs_allowed {
        if let Some(unknown) = allowed.iter().find(|a| !names.contains(&a.as_str())) {
            drop(control);
            stop_reactors(reactors);
            bail!("--rpcs-allowed: no method {unknown:?}");
        }
        names.retain(|n| allowed.iter().any(|a| a == n));
    }
    let module = nvmf_rpc::build_module(&names, call_fn(Arc::clone(&control)));
    let rpc_opts = match rpc_options(&args) {
        Ok(o) => o,
        Err(e) => {
            drop(control);
            stop_reactors(reactors);
            return Err(e);
        }
    };
    let unix = if args.no_rpc_server {
        None
    } else {
        match nvmf_rpc::serve_unix(&args.rpc_socket, module.clone(), rpc_opts.clone()) {
            Ok(s) => Some(s),
            Err(e) => {
                drop(control);
                stop_reactors(reactors);
                bail!(
                    "cannot serve JSON-RPC on {}: {e}",
                    args.rpc_socket.display()
                );
            }
        }
    };
    let tcp = match &args.rpc_listen {
        Some(addr) if !args.no_rpc_server => Some(
            nvmf_rpc::serve_tcp(addr, module, rpc_opts)
                .with_context(|| format!("cannot serve JSON-RPC on {addr}"))?,
        ),
        _ => None,
    };
    tracing::info!(socket = %args.rpc_socket.display(), cores = ?cores, "nvmf-tgt running");

    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("cannot install signal handlers")?;
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        // A reactor that died (a panic) leaves its hosts served by nobody: exit non-zero at
        // once, so systemd or another supervisor restarts the target and hosts reconnect.
        // The panic hook (`exit_on_panic`) normally exits first, from the panicking thread;
        // this check stays in case a library replaces the hook.
        if let Some(dead) = reactors.iter().find(|r| r.died()) {
            tracing::error!(
                core = dead.core,
                "reactor died: exiting with status 70 so a supervisor restarts nvmf-tgt"
            );
            std::process::exit(nvmf_target::exit_on_panic::EXIT_STATUS);
        }
    }
    tracing::info!("shutting down: disconnecting hosts");
    if let Some(u) = unix {
        u.shutdown();
    }
    if let Some(t) = tcp {
        t.shutdown();
    }
    stop_reactors(reactors);
    // Transports (and their acceptor threads) go last, after every qpair is gone.
    drop(control);
    tracing::info!("nvmf-tgt stopped");
    Ok(())
}

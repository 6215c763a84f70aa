//! `nvmf-tgt`: the NVMe-oF target daemon. Flags follow SPDK's `nvmf_tgt` where SPDK has the
//! same thing (`-m` core mask, `-c` JSON config, `-r` RPC socket, `--wait-for-rpc`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Parser;
use nvmf_common::reactor::{check_cores, parse_core_mask};
use nvmf_target::core::TargetInfo;
use nvmf_target::reactor::{start_reactors, stop_reactors};
use nvmf_target::rpc::{call_fn, load_config, method_names, Control, InitState, TransportFactory};
use nvmf_target::target::Target;
use nvmf_target::transport::options::{TransportKind, TransportOptions};
use nvmf_target::transport::rdma::RdmaTransport;
use nvmf_target::transport::Transport;

#[derive(Parser, Debug)]
#[command(name = "nvmf-tgt", version, about = "NVMe over Fabrics target (RDMA)")]
struct Args {
    /// Core mask of the reactors: hex (0x3), decimal, or a list ([0,2-3]).
    #[arg(short = 'm', long = "cpumask", default_value = "0x1")]
    cpumask: String,
    /// JSON configuration in SPDK's saved-config format, applied at start.
    #[arg(short = 'c', long = "json")]
    json: Option<PathBuf>,
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
        |opts: &TransportOptions| -> Result<Arc<dyn Transport>, String> {
            match opts.kind()? {
                TransportKind::Rdma => Ok(Arc::new(RdmaTransport::new(opts.clone())?)),
                other => Err(format!(
                    "transport {} is not supported by this target yet",
                    other.name()
                )),
            }
        },
    )
}

fn init_logging(level: &str) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) => tracing_subscriber::EnvFilter::new(spec),
        Err(_) => tracing_subscriber::EnvFilter::try_new(level)
            .with_context(|| format!("bad --log-level {level:?}"))?,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("nvmf-tgt: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    init_logging(&args.log_level)?;
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
    let (reactors, handles) = start_reactors(&cores, &info).context("cannot start reactors")?;
    let mut target = Target::new(Arc::clone(&info));
    for h in handles {
        target.add_poll_group(h);
    }
    let mut control = Control::new(target, transport_factory());
    if args.wait_for_rpc {
        control.init_state = InitState::WaitingForRpc;
    }
    if let Some(json) = &config {
        if let Err(e) = load_config(&mut control, json) {
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
    let module = nvmf_rpc::build_module(&method_names(), call_fn(Arc::clone(&control)));
    let rpc_opts = match rpc_options(&args) {
        Ok(o) => o,
        Err(e) => {
            drop(control);
            stop_reactors(reactors);
            return Err(e);
        }
    };
    let unix = match nvmf_rpc::serve_unix(&args.rpc_socket, module.clone(), rpc_opts.clone()) {
        Ok(s) => s,
        Err(e) => {
            drop(control);
            stop_reactors(reactors);
            bail!(
                "cannot serve JSON-RPC on {}: {e}",
                args.rpc_socket.display()
            );
        }
    };
    let tcp = match &args.rpc_listen {
        Some(addr) => Some(
            nvmf_rpc::serve_tcp(addr, module, rpc_opts)
                .with_context(|| format!("cannot serve JSON-RPC on {addr}"))?,
        ),
        None => None,
    };
    tracing::info!(socket = %args.rpc_socket.display(), cores = ?cores, "nvmf-tgt running");

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("cannot install signal handlers")?;
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        // A reactor that died (a panic) leaves its hosts served by nobody: exit non-zero at
        // once, so systemd or another supervisor restarts the target and hosts reconnect.
        if let Some(dead) = reactors.iter().find(|r| r.died()) {
            tracing::error!(
                core = dead.core,
                "reactor died: exiting with status 70 so a supervisor restarts nvmf-tgt"
            );
            std::process::exit(70);
        }
    }
    tracing::info!("shutting down: disconnecting hosts");
    unix.shutdown();
    if let Some(t) = tcp {
        t.shutdown();
    }
    stop_reactors(reactors);
    // Transports (and their acceptor threads) go last, after every qpair is gone.
    drop(control);
    tracing::info!("nvmf-tgt stopped");
    Ok(())
}

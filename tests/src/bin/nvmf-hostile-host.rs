//! `nvmf-hostile-host`: an NVMe-oF RDMA host that misbehaves on purpose, against a real
//! target over the real verbs (soft-RoCE in the lab's `hostile-rdma` scenario). The modes
//! are in `nvmf_tests::hostile`; this is their command line.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::SystemTime;

use clap::{Parser, ValueEnum};
use nvmf_common::rdma::RealVerbs;
use nvmf_tests::hostile::{self, Options, Report, DEFAULT_HOSTNQN};

const EXAMPLES: &str = "\
Examples:
  nvmf-hostile-host stall --addr 10.0.0.1 --port 4420 --nqn nqn.2016-06.io.spdk:a --seconds 40
  nvmf-hostile-host no-connect --addr 10.0.0.1 --nqn nqn.2016-06.io.spdk:a --count 32 --seconds 20
  nvmf-hostile-host garbage --addr 10.0.0.1 --nqn nqn.2016-06.io.spdk:a --count 200 --seed 7

Output: one line per phase on stdout, `[SECONDS] EVENT: details`; the last one is
`done: key=value ...`:
  stall       connected, submitted, holding, io-queue-disconnected (when the target cuts the
              I/O queue), admin-queue-disconnected (if it does), done: io_responses=N
              keep_alives=OK/SENT io_queue_cut_after=SECONDSs|none admin_queue_cut=BOOL
  no-connect  connected, holding, disconnected (one per connection the target closes), done:
              accepted=N refused=N disconnected=N open=N first=SECONDSs last=SECONDSs
  garbage     garbage (the seed), session (one per connection), disconnected (each time the
              target closes one), done: sent=N ... responses=N unanswered=N
              target_disconnects=N ... statuses=NAME:N,...
Exit status: 0 when the mode ran (whatever the target did), 1 when the tool could not set
itself up (no RDMA device, target unreachable, Connect refused), 2 on bad arguments.";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// An I/O queue whose responses are never received: depth-1 READs of 128 KiB, no receive
    /// posted after the Connect response; the admin queue is kept alive meanwhile. Ends after
    /// --seconds, or 2 s after the target cut the I/O queue.
    Stall,
    /// --count RDMA connections (valid NVMe-oF private data) that never send a Fabrics
    /// Connect; held until the target has closed them all, or --seconds.
    NoConnect,
    /// --count capsules of random bytes (0..=200 long) and 64-byte SQEs with random opcodes
    /// on admin queues (every other one without a Fabrics Connect first), reconnecting
    /// whenever the target closes the queue; stops early after --seconds.
    Garbage,
}

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-hostile-host",
    version,
    about = "An NVMe-oF RDMA host that misbehaves on purpose (stalls its responses, never \
             connects, sends garbage), to show a target survives it and serves other hosts",
    after_help = EXAMPLES
)]
struct Args {
    mode: Mode,
    /// The target's address.
    #[arg(long)]
    addr: IpAddr,
    /// The target's RDMA CM port.
    #[arg(long, default_value_t = 4420)]
    port: u16,
    /// The subsystem NQN to connect to.
    #[arg(long)]
    nqn: String,
    /// Host NQN (the UUID of a `...:uuid:` NQN is also the host ID).
    #[arg(long, default_value = DEFAULT_HOSTNQN)]
    hostnqn: String,
    /// Longest run in seconds (default: stall 40, no-connect 20, garbage 120).
    #[arg(long)]
    seconds: Option<u64>,
    /// stall: entries of the I/O queue (depth-1 READs are submitted).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(2..))]
    depth: u16,
    /// no-connect: connections to open (default 32); garbage: capsules to send (default 200).
    #[arg(long)]
    count: Option<u32>,
    /// garbage: seed of the random capsules (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mode = match args.mode {
        Mode::Stall => hostile::Mode::Stall,
        Mode::NoConnect => hostile::Mode::NoConnect,
        Mode::Garbage => hostile::Mode::Garbage,
    };
    let mut opts = Options::new(mode, SocketAddr::new(args.addr, args.port), &args.nqn);
    opts.hostnqn = args.hostnqn;
    opts.seconds = args.seconds;
    opts.depth = args.depth;
    opts.count = args.count;
    opts.seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let verbs = RealVerbs;
    let mut report = Report::new(&verbs, true);
    match hostile::run(&verbs, &opts, &mut report) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvmf-hostile-host: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

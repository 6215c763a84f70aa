//! `nvmf-host`: administer and probe NVMe-oF subsystems over RDMA from user space, with output
//! close to nvme-cli's (`nvme discover`, `id-ctrl`, `id-ns`, `smart-log`, `get-log`), plus
//! block-range read / write to and from a file.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use nvmf_common::buffer::BufferPool;
use nvmf_common::buffer::IoBuf;
use nvmf_common::spec::identify::{ascii_str, nul_str};
use nvmf_common::spec::log_page::get_u128;
use nvmf_common::spec::Command;
use nvmf_common::spec::{IdentifyController, IdentifyNamespace, LogPageId, SmartHealthLog};
use nvmf_initiator::path::{apply_ana_log, refresh_ana, refresh_requested};
use nvmf_initiator::{
    discover, multipath, Controller, ControllerEvent, ControllerOptions, DataDir, IoCompletion,
    IoQpair, MemoryWindows, MultipathQpair, NamespacePath, PathHandle, Policy, Reconnect,
    SubmitError, Timers, TransportId,
};
use zerocopy::FromBytes;

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
struct Cli {
    /// Host NQN (default: /etc/nvme/hostnqn or a generated one).
    #[arg(long, global = true)]
    hostnqn: Option<String>,
    /// Seconds allowed for each connection step.
    #[arg(long, global = true, default_value_t = 10)]
    connect_timeout: u64,
    /// Per-I/O memory-window keys, invalidated when each I/O completes, as the Linux host
    /// does: auto (where the device has them, except soft-RoCE), on, off (the buffer pool
    /// registration's key).
    #[arg(long, global = true, default_value = "auto")]
    memory_windows: MemoryWindows,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
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
struct Rw {
    /// The subsystem's address; given more than once (same subnqn, other addresses), the
    /// paths of a multipath namespace: I/O follows ANA state and fails over.
    #[arg(short = 'r', long = "transport", required = true)]
    r: Vec<String>,
    /// With several -r: active_passive (the first ANA-optimized path) or active_active
    /// (round robin over the optimized paths).
    #[arg(long, default_value = "active_passive", value_name = "POLICY")]
    multipath: Policy,
    /// With several -r: fail I/O once no path has been usable this many seconds (0: wait
    /// until every path's controller is lost, 600 s after its loss).
    #[arg(
        long,
        alias = "fast-io-fail-timeout",
        default_value_t = 0,
        value_name = "S"
    )]
    fast_io_fail_timeout_sec: u64,
    #[arg(short = 'n', long = "namespace-id", default_value_t = 1)]
    nsid: u32,
    /// Starting LBA.
    #[arg(short = 's', long = "start-block", value_parser = parse_num)]
    slba: u64,
    /// Number of blocks (one-based; nvme-cli's -c is zero-based).
    #[arg(short = 'c', long = "block-count", value_parser = parse_num)]
    count: u64,
    /// The file to write the data to (read) or take it from (write).
    #[arg(short = 'f', long = "data")]
    file: String,
    /// Commands in flight.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 8)]
    depth: u16,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum What {
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

fn tid(s: &str, cli: &Cli) -> anyhow::Result<TransportId> {
    let mut t: TransportId = s.parse().with_context(|| format!("-r {s:?}"))?;
    if t.hostnqn.is_none() {
        t.hostnqn.clone_from(&cli.hostnqn);
    }
    Ok(t)
}

fn opts(cli: &Cli, io_queues: u16) -> ControllerOptions {
    ControllerOptions {
        hostnqn: cli.hostnqn.clone(),
        io_queues,
        connect_timeout: Duration::from_secs(cli.connect_timeout.max(1)),
        admin_timeout: Duration::from_secs(30),
        io_timeout: Duration::from_secs(30),
        memory_windows: cli.memory_windows,
        ..ControllerOptions::default()
    }
}

fn connect(s: &str, cli: &Cli, io_queues: u16) -> anyhow::Result<Controller> {
    let t = tid(s, cli)?;
    if t.is_discovery() {
        bail!("-r {s:?}: no subnqn given (that is the discovery subsystem; use `discover`)");
    }
    Controller::connect(&t, opts(cli, io_queues)).with_context(|| format!("connecting to {t}"))
}

fn trtype_str(v: u8) -> String {
    match v {
        1 => "rdma".into(),
        2 => "fc".into(),
        3 => "tcp".into(),
        254 => "loop".into(),
        v => format!("unknown ({v})"),
    }
}

fn adrfam_str(v: u8) -> String {
    match v {
        1 => "ipv4".into(),
        2 => "ipv6".into(),
        3 => "infiniband".into(),
        4 => "fibre-channel".into(),
        254 => "intra-host".into(),
        v => format!("unknown ({v})"),
    }
}

fn subtype_str(v: u8) -> String {
    match v {
        1 => "discovery subsystem referral".into(),
        2 => "nvme subsystem".into(),
        3 => "current discovery subsystem".into(),
        v => format!("unknown ({v})"),
    }
}

fn treq_str(v: u8) -> String {
    let sec = match v & 3 {
        0 => "not specified",
        1 => "required",
        2 => "not required",
        _ => "reserved",
    };
    if v & 4 != 0 {
        format!("{sec}, sq flow control disable supported")
    } else {
        sec.to_string()
    }
}

/// Orderly shutdown; a failure there does not undo what the command did.
fn disconnect(ctrl: Controller) {
    if let Err(e) = ctrl.disconnect() {
        eprintln!("nvmf-host: warning: controller shutdown: {e}");
    }
}

fn cmd_discover(cli: &Cli, r: &str) -> anyhow::Result<()> {
    let t = tid(r, cli)?;
    let log = discover(&t, &opts(cli, 0))
        .with_context(|| format!("discovery at {}:{}", t.traddr, t.trsvcid))?;
    println!(
        "\nDiscovery Log Number of Records {}, Generation counter {}",
        log.entries.len(),
        log.genctr
    );
    for (i, e) in log.entries.iter().enumerate() {
        println!("=====Discovery Log Entry {i}======");
        println!("trtype:  {}", trtype_str(e.trtype));
        println!("adrfam:  {}", adrfam_str(e.adrfam));
        println!("subtype: {}", subtype_str(e.subtype));
        println!("treq:    {}", treq_str(e.treq));
        println!("portid:  {}", e.portid);
        println!("trsvcid: {}", e.trsvcid);
        println!("subnqn:  {}", e.subnqn);
        println!("traddr:  {}", e.traddr);
        println!(
            "eflags:  {}",
            if e.eflags == 0 {
                "none".to_string()
            } else {
                format!("{:#x}", e.eflags)
            }
        );
        if e.trtype == 1 {
            let prtype = match e.rdma_prtype {
                1 => "not specified",
                2 => "infiniband",
                3 => "roce",
                4 => "roce-v2",
                5 => "iwarp",
                _ => "unrecognized",
            };
            let qptype = match e.rdma_qptype {
                1 => "connected",
                2 => "datagram",
                _ => "unrecognized",
            };
            let cms = if e.rdma_cms == 1 {
                "rdma-cm"
            } else {
                "unrecognized"
            };
            println!("rdma_prtype: {prtype}");
            println!("rdma_qptype: {qptype}");
            println!("rdma_cms:    {cms}");
            println!("rdma_pkey: {:#06x}", e.rdma_pkey);
        }
    }
    Ok(())
}

fn print_id_ctrl(id: &IdentifyController) {
    macro_rules! f {
        ($name:literal, $v:expr) => {
            println!("{:<10}: {}", $name, $v)
        };
    }
    println!("NVME Identify Controller:");
    f!("vid", format!("{:#x}", id.vid.get()));
    f!("ssvid", format!("{:#x}", id.ssvid.get()));
    f!("sn", format!("{:<20}", ascii_str(&id.sn)));
    f!("mn", format!("{:<40}", ascii_str(&id.mn)));
    f!("fr", format!("{:<8}", ascii_str(&id.fr)));
    f!("rab", id.rab);
    f!(
        "ieee",
        format!("{:02x}{:02x}{:02x}", id.ieee[2], id.ieee[1], id.ieee[0])
    );
    f!("cmic", id.cmic);
    f!("mdts", id.mdts);
    f!("cntlid", format!("{:#x}", id.cntlid.get()));
    f!("ver", format!("{:#x}", id.ver.get()));
    f!("rtd3r", id.rtd3r.get());
    f!("rtd3e", id.rtd3e.get());
    f!("oaes", format!("{:#x}", id.oaes.get()));
    f!("ctratt", format!("{:#x}", id.ctratt.get()));
    f!("cntrltype", id.cntrltype);
    f!("oacs", format!("{:#x}", id.oacs.get()));
    f!("acl", id.acl);
    f!("aerl", id.aerl);
    f!("frmw", format!("{:#x}", id.frmw));
    f!("lpa", format!("{:#x}", id.lpa));
    f!("elpe", id.elpe);
    f!("npss", id.npss);
    f!("kas", id.kas.get());
    f!("sqes", format!("{:#x}", id.sqes));
    f!("cqes", format!("{:#x}", id.cqes));
    f!("maxcmd", id.maxcmd.get());
    f!("nn", id.nn.get());
    f!("oncs", format!("{:#x}", id.oncs.get()));
    f!("fuses", format!("{:#x}", id.fuses.get()));
    f!("fna", format!("{:#x}", id.fna));
    f!("vwc", format!("{:#x}", id.vwc));
    f!("awun", id.awun.get());
    f!("awupf", id.awupf.get());
    f!("sgls", format!("{:#x}", id.sgls.get()));
    f!("mnan", id.mnan.get());
    f!("subnqn", nul_str(&id.subnqn));
    f!("ioccsz", id.ioccsz.get());
    f!("iorcsz", id.iorcsz.get());
    f!("icdoff", id.icdoff.get());
    f!("fcatt", format!("{:#x}", id.fcatt));
    f!("msdbd", id.msdbd);
    f!("ofcs", id.ofcs.get());
}

fn print_id_ns(nsid: u32, ns: &IdentifyNamespace) {
    macro_rules! f {
        ($name:literal, $v:expr) => {
            println!("{:<8}: {}", $name, $v)
        };
    }
    println!("NVME Identify Namespace {nsid}:");
    f!("nsze", format!("{:#x}", ns.nsze.get()));
    f!("ncap", format!("{:#x}", ns.ncap.get()));
    f!("nuse", format!("{:#x}", ns.nuse.get()));
    f!("nsfeat", format!("{:#x}", ns.nsfeat));
    f!("nlbaf", ns.nlbaf);
    f!("flbas", format!("{:#x}", ns.flbas));
    f!("mc", format!("{:#x}", ns.mc));
    f!("dpc", format!("{:#x}", ns.dpc));
    f!("dps", format!("{:#x}", ns.dps));
    f!("nmic", ns.nmic);
    f!("rescap", ns.rescap);
    f!("fpi", ns.fpi);
    f!("dlfeat", ns.dlfeat);
    f!("nawun", ns.nawun.get());
    f!("nawupf", ns.nawupf.get());
    f!("nacwu", ns.nacwu.get());
    f!("noiob", ns.noiob.get());
    f!("nvmcap", get_u128(&ns.nvmcap));
    f!("anagrpid", ns.anagrpid.get());
    f!("nsattr", ns.nsattr);
    f!("nvmsetid", ns.nvmsetid.get());
    f!("endgid", ns.endgid.get());
    f!(
        "nguid",
        ns.nguid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    f!(
        "eui64",
        ns.eui64
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let cur = (ns.flbas & 0xF) | ((ns.flbas >> 1) & 0x30);
    for (i, l) in ns.lbaf.iter().enumerate().take(usize::from(ns.nlbaf) + 1) {
        println!(
            "lbaf {i:>2} : ms:{:<3} lbads:{:<2} rp:{:#x} {}",
            l.ms.get(),
            l.lbads,
            l.rp & 3,
            if i == usize::from(cur) {
                "(in use)"
            } else {
                ""
            }
        );
    }
}

fn cmd_identify(cli: &Cli, r: &str, what: What, nsid: u32) -> anyhow::Result<()> {
    let mut ctrl = connect(r, cli, 0)?;
    match what {
        What::Ctrl => print_id_ctrl(ctrl.identify()),
        What::Ns => {
            let ns = ctrl.identify_namespace(nsid)?;
            print_id_ns(nsid, &ns);
        }
    }
    disconnect(ctrl);
    Ok(())
}

/// The I/O qpair of `read` / `write`: one controller's, or one over every path.
enum HostQp {
    // Boxed: both are large and of different sizes.
    One(Box<IoQpair>),
    Multi(Box<MultipathQpair>),
}

impl HostQp {
    fn depth(&self) -> u16 {
        match self {
            Self::One(q) => q.depth(),
            Self::Multi(q) => q.depth(),
        }
    }

    fn outstanding(&self) -> usize {
        match self {
            Self::One(q) => q.outstanding(),
            Self::Multi(q) => q.outstanding(),
        }
    }

    fn failure(&self) -> Option<&str> {
        match self {
            Self::One(q) => q.failure(),
            Self::Multi(q) => q.failure(),
        }
    }

    fn submit(
        &mut self,
        cmd: Command,
        buf: IoBuf,
        dir: DataDir,
        tag: u64,
    ) -> Result<(), SubmitError> {
        match self {
            Self::One(q) => q.submit(cmd, Some(buf), dir, tag),
            Self::Multi(q) => q.submit(cmd, Some(buf), dir, tag),
        }
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        match self {
            Self::One(q) => q.poll(out),
            Self::Multi(q) => q.poll(out),
        }
    }

    fn disconnect(self) {
        match self {
            Self::One(q) => q.disconnect(),
            Self::Multi(q) => q.disconnect(),
        }
    }
}

/// The controllers of `-r` (one per path) and, with several, each path's ANA state of the
/// namespace.
struct Paths {
    ctrls: Vec<Controller>,
    ana: Vec<NamespacePath>,
    lost: Vec<bool>,
}

/// Connects every `-r` of `a`; several must name one subsystem and reach one namespace
/// (same NGUID / EUI64 / UUID), through one RDMA device.
fn connect_paths(cli: &Cli, a: &Rw) -> anyhow::Result<Paths> {
    if a.r.len() == 1 {
        let ctrl = connect(&a.r[0], cli, 1)?;
        return Ok(Paths {
            ctrls: vec![ctrl],
            ana: Vec::new(),
            lost: vec![false],
        });
    }
    let mut ctrls: Vec<Controller> = Vec::new();
    let mut ana = Vec::new();
    let mut first_ids: Option<multipath::NamespaceIds> = None;
    for r in &a.r {
        let t = tid(r, cli)?;
        if t.is_discovery() {
            bail!("-r {r:?}: no subnqn given");
        }
        if let Some(c) = ctrls.first() {
            if c.transport_id().subnqn != t.subnqn {
                bail!("-r {r:?}: the paths of a namespace name one subsystem");
            }
        }
        let mut o = opts(cli, 1);
        // A failed path comes back in the background.
        o.reconnect = Some(Reconnect {
            delay: Duration::from_secs(2),
            ctrl_loss_tmo: Some(Duration::from_secs(600)),
        });
        let mut c = match ctrls.first() {
            None => Controller::connect(&t, o),
            Some(first) => Controller::connect_with_pd(&t, o, first.pd()),
        }
        .with_context(|| format!("connecting to {t}"))?;
        let (ids, anagrpid) = c
            .namespace_ids(a.nsid)
            .with_context(|| format!("identifying namespace {} at {}", a.nsid, c.peer()))?;
        match &first_ids {
            None => first_ids = Some(ids),
            Some(f) => multipath::same_namespace(f, &ids).map_err(|e| {
                anyhow::anyhow!("namespace {} at {} is another one: {e}", a.nsid, c.peer())
            })?,
        }
        let state = c.ana_state(a.nsid, anagrpid)?;
        eprintln!("path {}: ANA {state}", c.peer());
        ana.push(NamespacePath {
            nsid: a.nsid,
            anagrpid,
            handle: PathHandle::new(state),
        });
        ctrls.push(c);
    }
    let lost = vec![false; ctrls.len()];
    Ok(Paths { ctrls, ana, lost })
}

impl Paths {
    fn qpair(&mut self, a: &Rw) -> anyhow::Result<HostQp> {
        if self.ana.is_empty() {
            let qp = self.ctrls[0]
                .take_io_qpairs()
                .pop()
                .context("no I/O qpair")?;
            return Ok(HostQp::One(Box::new(qp)));
        }
        let mut legs = Vec::new();
        for (c, p) in self.ctrls.iter_mut().zip(&self.ana) {
            let qp = c.take_io_qpairs().pop().context("no I/O qpair")?;
            legs.push((qp, p.handle.clone()));
        }
        let timers = Timers {
            fast_io_fail: (a.fast_io_fail_timeout_sec > 0)
                .then(|| Duration::from_secs(a.fast_io_fail_timeout_sec)),
            anatt: self.ctrls[0].ana_transition_time(),
            ..Timers::default()
        };
        let qp = MultipathQpair::new(legs, a.multipath, timers);
        Ok(HostQp::Multi(Box::new(qp)))
    }

    /// Keep-alive and reconnects of every path; ANA logs read again when they change. A
    /// lost controller is an error only without other paths.
    fn poll_admin(&mut self) -> anyhow::Result<()> {
        for (i, c) in self.ctrls.iter_mut().enumerate() {
            if self.lost[i] {
                continue;
            }
            let mine = self.ana.get(i..=i).unwrap_or(&[]);
            match c.poll_admin() {
                Ok(events) => {
                    for ev in events {
                        match ev {
                            ControllerEvent::AnaChanged { log: Some(log) } => {
                                apply_ana_log(&log, mine)
                            }
                            ControllerEvent::AnaChanged { log: None }
                            | ControllerEvent::Reconnected { .. } => {
                                if let Err(e) = refresh_ana(c, mine) {
                                    eprintln!("nvmf-host: {}: ANA log: {e}", c.peer());
                                }
                            }
                            ControllerEvent::Disconnected { reason } => {
                                eprintln!("nvmf-host: {}: {reason}", c.peer())
                            }
                            _ => {}
                        }
                    }
                    if refresh_requested(mine) && c.is_live() {
                        if let Err(e) = refresh_ana(c, mine) {
                            eprintln!("nvmf-host: {}: ANA log: {e}", c.peer());
                        }
                    }
                }
                Err(e) if self.ana.is_empty() => return Err(e.into()),
                Err(e) => {
                    eprintln!("nvmf-host: {}: path lost: {e}", c.peer());
                    self.lost[i] = true;
                }
            }
        }
        Ok(())
    }
}

fn cmd_rw(cli: &Cli, a: &Rw, write: bool) -> anyhow::Result<()> {
    if a.count == 0 {
        bail!("-c 0: nothing to transfer");
    }
    let mut paths = connect_paths(cli, a)?;
    let ctrl = &mut paths.ctrls[0];
    let ns = ctrl
        .namespace(a.nsid)?
        .with_context(|| format!("namespace {} is not active", a.nsid))?;
    let end = a.slba.checked_add(a.count).filter(|&e| e <= ns.blocks);
    if end.is_none() {
        bail!(
            "LBAs {}..{} are outside namespace {} ({} blocks)",
            a.slba,
            a.slba.saturating_add(a.count),
            a.nsid,
            ns.blocks
        );
    }
    let bs = u64::from(ns.block_size);
    let total = (a.count * bs) as usize;
    let chunk_blocks = (u64::from(ctrl.max_transfer()).min(128 * 1024) / bs).clamp(1, 0x1_0000);
    let chunk = (chunk_blocks * bs) as usize;
    let mut data = if write {
        let d = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file))?;
        if d.len() < total {
            bail!(
                "{} has {} bytes, {} blocks of {bs} need {total}",
                a.file,
                d.len(),
                a.count
            );
        }
        d
    } else {
        vec![0u8; total]
    };
    let mut qp = paths.qpair(a)?;
    let depth = usize::from(a.depth.clamp(1, qp.depth()));
    let pool = BufferPool::new(chunk.next_multiple_of(4096), depth as u32)?;
    // Every path shares the first one's protection domain.
    paths.ctrls[0].register_pool(&pool)?;
    let chunks = total.div_ceil(chunk);
    let (mut next, mut done) = (0usize, 0usize);
    let mut out: Vec<IoCompletion> = Vec::with_capacity(depth);
    let deadline = Instant::now() + Duration::from_secs(60 + chunks as u64 / 10);
    let mut next_admin = Instant::now();
    while done < chunks {
        // Keep-alive (and failure detection) while the data moves: a long transfer must not
        // outlive the controller's KATO.
        if Instant::now() >= next_admin {
            paths.poll_admin()?;
            next_admin = Instant::now() + Duration::from_millis(50);
        }
        while next < chunks && qp.outstanding() < depth {
            let Some(mut buf) = pool.get() else { break };
            let off = next * chunk;
            let len = chunk.min(total - off);
            buf.set_len(len);
            let lba = a.slba + (off as u64) / bs;
            let nlb = (len as u64 / bs) as u32;
            let r = if write {
                buf.copy_from_slice(&data[off..off + len]);
                let cmd = Command::write(0, a.nsid, lba, nlb);
                qp.submit(cmd, buf, DataDir::ToController, next as u64)
            } else {
                let cmd = Command::read(0, a.nsid, lba, nlb);
                qp.submit(cmd, buf, DataDir::FromController, next as u64)
            };
            r.map_err(|e| {
                anyhow::anyhow!(
                    "submitting at LBA {lba}: {:?}{}",
                    e.kind,
                    qp.failure().map(|f| format!(": {f}")).unwrap_or_default()
                )
            })?;
            next += 1;
        }
        if qp.poll(&mut out) == 0 {
            std::thread::yield_now();
        }
        for c in out.drain(..) {
            let idx = c.tag as usize;
            let lba = a.slba + (idx * chunk) as u64 / bs;
            if !c.status.is_success() {
                bail!(
                    "{} at LBA {lba} failed: {}",
                    if write { "write" } else { "read" },
                    c.status
                );
            }
            if !write {
                let buf = c.buf.expect("reads carry their buffer");
                let off = idx * chunk;
                data[off..off + buf.len()].copy_from_slice(&buf);
            }
            done += 1;
        }
        if Instant::now() > deadline {
            bail!("transfer did not finish in time ({done}/{chunks} commands done)");
        }
    }
    if !write {
        std::fs::write(&a.file, &data).with_context(|| format!("writing {}", a.file))?;
    }
    if let HostQp::Multi(m) = &qp {
        let s = m.stats();
        for (i, c) in paths.ctrls.iter().enumerate() {
            eprintln!(
                "path {}: {} commands",
                c.peer(),
                s.path_ios.get(i).copied().unwrap_or(0)
            );
        }
        eprintln!("failovers {}, ANA statuses {}", s.failovers, s.ana_errors);
    }
    qp.disconnect();
    for c in paths.ctrls {
        disconnect(c);
    }
    eprintln!(
        "{}: {} blocks of {bs} bytes at LBA {} ({} bytes)",
        if write { "write" } else { "read" },
        a.count,
        a.slba,
        total
    );
    Ok(())
}

fn cmd_smart(cli: &Cli, r: &str, nsid: u32) -> anyhow::Result<()> {
    let mut ctrl = connect(r, cli, 0)?;
    let raw = ctrl.get_log_page(nsid, LogPageId::SMART_HEALTH, 512)?;
    disconnect(ctrl);
    let s = SmartHealthLog::read_from_bytes(&raw).expect("512 bytes");
    let k = s.composite_temperature();
    println!(
        "Smart Log for NVME device:{} namespace-id:{nsid:x}",
        tid(r, cli)?.subnqn
    );
    println!("critical_warning\t\t\t: {:#x}", s.critical_warning);
    println!(
        "temperature\t\t\t\t: {} °C ({k} Kelvin)",
        i32::from(k) - 273
    );
    println!("available_spare\t\t\t\t: {}%", s.available_spare);
    println!(
        "available_spare_threshold\t\t: {}%",
        s.available_spare_threshold
    );
    println!("percentage_used\t\t\t\t: {}%", s.percentage_used);
    println!(
        "endurance group critical warning summary: {:#x}",
        s.endurance_group_critical_warning
    );
    println!("data_units_read\t\t\t\t: {}", get_u128(&s.data_units_read));
    println!(
        "data_units_written\t\t\t: {}",
        get_u128(&s.data_units_written)
    );
    println!(
        "host_read_commands\t\t\t: {}",
        get_u128(&s.host_read_commands)
    );
    println!(
        "host_write_commands\t\t\t: {}",
        get_u128(&s.host_write_commands)
    );
    println!(
        "controller_busy_time\t\t\t: {}",
        get_u128(&s.controller_busy_time)
    );
    println!("power_cycles\t\t\t\t: {}", get_u128(&s.power_cycles));
    println!("power_on_hours\t\t\t\t: {}", get_u128(&s.power_on_hours));
    println!("unsafe_shutdowns\t\t\t: {}", get_u128(&s.unsafe_shutdowns));
    println!("media_errors\t\t\t\t: {}", get_u128(&s.media_errors));
    println!(
        "num_err_log_entries\t\t\t: {}",
        get_u128(&s.num_error_log_entries)
    );
    println!(
        "Warning Temperature Time\t\t: {}",
        s.warning_temp_time.get()
    );
    println!(
        "Critical Composite Temperature Time\t: {}",
        s.critical_temp_time.get()
    );
    Ok(())
}

fn cmd_get_log(cli: &Cli, r: &str, lid: u64, len: u64, nsid: u32, raw: bool) -> anyhow::Result<()> {
    let lid = u8::try_from(lid).map_err(|_| anyhow::anyhow!("-i {lid}: a log page ID is 0-255"))?;
    if len == 0 || len > 16 << 20 {
        bail!("-l {len}: give 1 to 16 MiB");
    }
    let mut ctrl = connect(r, cli, 0)?;
    let data = ctrl.get_log_page(nsid, LogPageId(lid), len as usize)?;
    disconnect(ctrl);
    if raw {
        std::io::stdout().write_all(&data)?;
        return Ok(());
    }
    println!(
        "Device:{} log-id:{lid} namespace-id:{nsid:#x}",
        tid(r, cli)?.subnqn
    );
    println!("       0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f");
    for (i, row) in data.chunks(16).enumerate() {
        let hex: String = row.iter().map(|b| format!(" {b:02x}")).collect();
        let txt: String = row
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        println!("{:04x}:{hex:<48} \"{txt}\"", i * 16);
    }
    Ok(())
}

fn main() -> ExitCode {
    nvmf_initiator::init_tool_logging();
    let cli = Cli::parse();
    let r = match &cli.cmd {
        Cmd::Discover { r } => cmd_discover(&cli, r),
        Cmd::Identify { r, what, nsid } => cmd_identify(&cli, r, *what, *nsid),
        Cmd::Read(a) => cmd_rw(&cli, a, false),
        Cmd::Write(a) => cmd_rw(&cli, a, true),
        Cmd::SmartLog { r, nsid } => cmd_smart(&cli, r, *nsid),
        Cmd::GetLog {
            r,
            lid,
            len,
            nsid,
            raw,
        } => cmd_get_log(&cli, r, *lid, *len, *nsid, *raw),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvmf-host: error: {e:#}");
            ExitCode::FAILURE
        }
    }
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

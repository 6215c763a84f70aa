//! A hostile NVMe-oF RDMA host: the logic of the `nvmf-hostile-host` tool (the lab's
//! `hostile-rdma` scenario runs it against nvmf-tgt over soft-RoCE), generic over the verbs
//! provider so `tests/sim_hostile_host.rs` runs the same code against the real target over
//! the simulated fabric.
//!
//! It speaks the wire protocol itself, as [`crate::sim::HostQueue`] does: RDMA CM private
//! data, Fabrics Connect with keyed Connect data, SQEs sent with SEND, responses received
//! into receive buffers it posts (or, on purpose, does not post). Modes:
//! - [`Mode::Stall`]: a controller with an admin queue kept alive, and one I/O queue on which
//!   it submits depth-1 READs of 128 KiB and never posts a receive for their responses; the
//!   target's response SENDs wait in RNR (retried for ever, as every host asks) and their data
//!   buffers stay pinned until the target gives up on the queue.
//! - [`Mode::NoConnect`]: many RDMA connections that never send a Fabrics Connect.
//! - [`Mode::Garbage`]: capsules of random bytes and lengths, and SQEs with random opcodes.
//!
//! Every phase reports one line, `[SECONDS] EVENT: details` (seconds since the start on the
//! provider's clock); the last one is `done: key=value ...`. Errors are `anyhow` errors: this
//! is a tool's code, and a setup failure only needs a clear message.
//!
//! All time is the provider's ([`Verbs::now`], [`Verbs::sleep`]): wall-clock time over the
//! real verbs, virtual time over the simulated fabric (whose `sleep` runs the target).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nvmf_common::rdma::{
    AccessFlags, CmEventKind, ConnParams, DmaBuf, QpCaps, RdmaError, RecvWr, SendWr, Verbs,
    VerbsChannel, VerbsCmId, VerbsCq, VerbsMr, VerbsQp, WcStatus, WorkCompletion,
};
use nvmf_common::spec::fabrics::CNTLID_DYNAMIC;
use nvmf_common::spec::rdma_cm::{RdmaCmAccept, RdmaCmReject, RdmaCmRequest};
use nvmf_common::spec::{
    Cc, Cns, Command, Completion, ConnectCommand, ConnectData, Csts, IdentifyNamespace, Property,
    PropertyGetCommand, PropertySetCommand, SglDescriptor, Status,
};
use zerocopy::{FromBytes, IntoBytes};

const SQE_LEN: usize = 64;
const CQE_LEN: usize = 16;
/// Bytes per command slot: room for the longest garbage capsule.
const SLOT_LEN: usize = 256;
/// Longest garbage capsule.
pub const GARBAGE_MAX_LEN: usize = 200;
/// Receive work requests carry this bit; SENDs carry their command slot.
const RECV_BIT: u64 = 1 << 63;
/// Each READ of the `stall` mode moves this much (the target's default max_io_size).
pub const STALL_IO_BYTES: u32 = 128 * 1024;
/// Limit of every set-up step (address and route resolution, accept, a command's answer):
/// generous, as soft-RoCE under emulation is slow.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `garbage` waits for an answer to one capsule before sending the next.
const GARBAGE_WAIT: Duration = Duration::from_millis(300);
/// Admin queue depth (all modes).
const ADMIN_DEPTH: u16 = 32;
/// Keep Alive Timeout `stall` asks for; it sends Keep Alive every second.
pub const KATO_MS: u32 = 15_000;
/// How long `stall` goes on once the target has cut its I/O queue.
const AFTER_CUT: Duration = Duration::from_secs(2);
/// What an idle polling loop gives away between two looks.
const POLL_PAUSE: Duration = Duration::from_millis(1);
pub const DEFAULT_HOSTNQN: &str =
    "nqn.2014-08.org.nvmexpress:uuid:badbad00-0000-4000-8000-00000000b0de";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Stall,
    NoConnect,
    Garbage,
}

/// What a run is told (the tool's command line).
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    /// The target's RDMA CM address.
    pub peer: SocketAddr,
    pub subnqn: String,
    pub hostnqn: String,
    /// Longest run (default: stall 40 s, no-connect 20 s, garbage 120 s).
    pub seconds: Option<u64>,
    /// stall: entries of the I/O queue.
    pub depth: u16,
    /// no-connect: connections (default 32); garbage: capsules (default 200).
    pub count: Option<u32>,
    /// garbage: seed of the random capsules.
    pub seed: u64,
}

impl Options {
    pub fn new(mode: Mode, peer: SocketAddr, subnqn: &str) -> Self {
        Self {
            mode,
            peer,
            subnqn: subnqn.into(),
            hostnqn: DEFAULT_HOSTNQN.into(),
            seconds: None,
            depth: 128,
            count: None,
            seed: 1,
        }
    }

    /// The UUID of a `nqn.2014-08.org.nvmexpress:uuid:` host NQN as the host ID (as
    /// nvme-cli does), else a fixed ID.
    pub fn hostid(&self) -> [u8; 16] {
        host_id(&self.hostnqn)
    }
}

fn host_id(hostnqn: &str) -> [u8; 16] {
    let hex: String = hostnqn
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut id = [0xB0; 16];
    if hex.len() == 32 && hex.is_ascii() {
        for (i, b) in id.iter_mut().enumerate() {
            match u8::from_str_radix(&hex[2 * i..2 * i + 2], 16) {
                Ok(v) => *b = v,
                Err(_) => return [0xB0; 16],
            }
        }
    }
    id
}

/// Where the lines of a run go: kept in [`Report::lines`], and printed on stdout with
/// `echo` (stdout is line buffered: each line goes out at once).
pub struct Report<V: Verbs> {
    verbs: V,
    start: Instant,
    echo: bool,
    pub lines: Vec<String>,
}

impl<V: Verbs> Report<V> {
    pub fn new(verbs: &V, echo: bool) -> Self {
        Self {
            verbs: verbs.clone(),
            start: verbs.now(),
            echo,
            lines: Vec::new(),
        }
    }

    /// Reports `[SECONDS] EVENT: details`.
    pub fn say(&mut self, event: &str, details: impl fmt::Display) {
        let t = self.verbs.now().saturating_duration_since(self.start);
        let line = format!("[{:8.3}] {event}: {details}", t.as_secs_f64());
        if self.echo {
            println!("{line}");
        }
        self.lines.push(line);
    }

    /// The details of the last line of `event`.
    pub fn last(&self, event: &str) -> Option<&str> {
        let tag = format!("] {event}: ");
        self.lines
            .iter()
            .rev()
            .find_map(|l| l.split_once(&tag).map(|(_, d)| d))
    }
}

/// `key=value` out of a `done` line.
pub fn field<'a>(details: &'a str, key: &str) -> Option<&'a str> {
    details
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// Runs `opts.mode` over `verbs`. An error means the tool could not set itself up (no RDMA
/// device, target unreachable, Connect refused); whatever the target does after that is
/// reported, not an error.
pub fn run<V: Verbs>(verbs: &V, opts: &Options, out: &mut Report<V>) -> Result<()> {
    match opts.mode {
        Mode::Stall => stall(verbs, opts, out),
        Mode::NoConnect => no_connect(verbs, opts, out),
        Mode::Garbage => garbage(verbs, opts, out),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

fn status_name(s: Status) -> String {
    match s.name() {
        Some(n) => n.to_string(),
        None => format!("sct{:#x}/sc{:#04x}", s.sct.0, s.sc),
    }
}

// ---------------------------------------------------------------------------------------
// One raw queue

/// Where a command's data is.
enum Data {
    None,
    /// `len` bytes of the queue's data buffer at `offset`, named by a keyed SGL.
    Keyed {
        offset: usize,
        len: u32,
    },
}

/// One NVMe-oF RDMA queue as a raw host drives it: an RC QP with its own receive queue, a
/// registered command slot per entry, response slots and a data buffer the target reaches
/// through its key. Unlike the initiator's queue it posts only the receives it is told to.
struct Queue<V: Verbs> {
    // Field order is drop order: the QP before the memory it names and its CM id.
    qp: V::Qp,
    cq: Arc<V::Cq>,
    id: V::CmId,
    ch: V::Channel,
    cmds: DmaBuf<V>,
    rsps: DmaBuf<V>,
    data: DmaBuf<V>,
    verbs: V,
    qid: u16,
    /// Entries the target grants (its CRQSIZE when smaller than what was asked).
    depth: u16,
    /// Command slots whose SEND has not completed: the device may still read them.
    sending: Vec<bool>,
    next_slot: usize,
    /// Whether a receive is posted again once its response arrived.
    repost: bool,
    /// Responses received and not taken yet.
    responses: VecDeque<Completion>,
    /// Receive completions (responses) seen, all told.
    received: u64,
    /// Why and when the queue stopped working (the target disconnected, a work request
    /// failed); the first reason only.
    broken: Option<(Instant, String)>,
    established: Instant,
}

impl<V: Verbs> Queue<V> {
    /// Resolves the target, creates the QP, posts `recvs` receives, connects with the
    /// NVMe-oF private data for queue `qid` of `depth` entries and waits for the accept.
    fn connect(
        verbs: &V,
        peer: SocketAddr,
        qid: u16,
        depth: u16,
        recvs: u16,
        data_len: usize,
    ) -> Result<Self> {
        let ch = verbs.event_channel().context(
            "cannot open the RDMA connection manager (no RDMA device? load rdma_ucm and \
             bring up an RDMA link, e.g. `rdma link add rxe0 type rxe netdev eth0`)",
        )?;
        let id = ch.create_id().context("rdma_create_id")?;
        id.resolve_addr(None, peer, STEP_TIMEOUT)
            .with_context(|| format!("resolving {peer}"))?;
        wait_cm::<V>(&ch, CmEventKind::AddrResolved, peer, "address resolution")?;
        id.resolve_route(STEP_TIMEOUT)
            .with_context(|| format!("resolving the route to {peer}"))?;
        wait_cm::<V>(&ch, CmEventKind::RouteResolved, peer, "route resolution")?;
        let ctx = id
            .context()
            .with_context(|| format!("no RDMA device on the route to {peer}"))?;
        let pd = V::alloc_pd(&ctx).context("ibv_alloc_pd")?;
        let n = u32::from(depth);
        let cq = V::create_cq(&ctx, 3 * n + 8).context("ibv_create_cq")?;
        let qp = id
            .create_qp(
                &pd,
                &cq,
                &cq,
                None,
                QpCaps {
                    max_send_wr: 2 * n + 4,
                    max_recv_wr: n,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
            )
            .context("rdma_create_qp")?;
        let cmds = new_buf::<V>(&pd, usize::from(depth) * SLOT_LEN, AccessFlags::LOCAL_WRITE)?;
        let rsps = new_buf::<V>(&pd, usize::from(depth) * CQE_LEN, AccessFlags::LOCAL_WRITE)?;
        // The target RDMA READs the Connect data from it and RDMA WRITEs READ data into it.
        let data = new_buf::<V>(&pd, data_len.max(4096), AccessFlags::ALL_DATA)?;
        let mut q = Self {
            qp,
            cq,
            id,
            ch,
            cmds,
            rsps,
            data,
            verbs: verbs.clone(),
            qid,
            depth,
            sending: vec![false; usize::from(depth)],
            next_slot: 0,
            repost: true,
            responses: VecDeque::new(),
            received: 0,
            broken: None,
            established: verbs.now(),
        };
        for slot in 0..recvs.min(depth) {
            q.post_recv(usize::from(slot))?;
        }
        let req = RdmaCmRequest::new(qid, depth, depth - 1);
        q.id.connect(&ConnParams {
            private_data: req.as_bytes(),
            // The target RDMA READs our buffers; we never read from it.
            initiator_depth: 0,
            // The target's SENDs retry for ever while we post no receive, as every host asks
            // (Linux's nvme-rdma too): that is what lets a host that never receives pin them.
            rnr_retry_count: 7,
            ..ConnParams::default()
        })
        .with_context(|| format!("rdma_connect to {peer}"))?;
        let deadline = verbs.now() + STEP_TIMEOUT;
        let ev = loop {
            if let Some(ev) = q.ch.get_event().context("waiting for the accept")? {
                break ev;
            }
            if verbs.now() > deadline {
                bail!("{peer} did not answer the connection request within {STEP_TIMEOUT:?}");
            }
            verbs.sleep(POLL_PAUSE);
        };
        match ev.kind {
            CmEventKind::Established => {}
            CmEventKind::Rejected => {
                let why = match RdmaCmReject::read_from_prefix(&ev.private_data) {
                    Ok((rej, _)) if rej.recfmt.get() == 0 && rej.status().0 != 0 => {
                        format!("NVMe-oF reject status {:?}", rej.status())
                    }
                    // IB CM reason 8, "invalid service ID": nothing listens on the port.
                    _ if ev.status == 8 => "nothing listens on that port".to_string(),
                    _ => format!("CM reject reason {}", ev.status),
                };
                bail!("{peer} rejected the connection of queue {qid}: {why}");
            }
            other => bail!(
                "connecting queue {qid} to {peer}: RDMA CM event {other:?} (status {})",
                ev.status
            ),
        }
        if let Ok((acc, _)) = RdmaCmAccept::read_from_prefix(&ev.private_data) {
            let crqsize = acc.crqsize.get();
            if crqsize != 0 && crqsize < q.depth {
                q.depth = crqsize;
            }
        }
        q.established = verbs.now();
        Ok(q)
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let sge = [self
            .rsps
            .sge(slot * CQE_LEN, CQE_LEN)
            .expect("response slot inside its buffer")];
        self.qp
            .post_recv(&[RecvWr::new(RECV_BIT | slot as u64, &sge)])
            .context("ibv_post_recv")
    }

    fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    fn mark_broken(&mut self, why: String) {
        if self.broken.is_none() {
            self.broken = Some((self.verbs.now(), why));
            // Answer the target's disconnect (as the kernel's hosts do), or tell it ours;
            // the QP goes to the error state either way.
            let _ = self.id.disconnect();
        }
    }

    /// Sends `bytes` as one capsule, whatever they hold, from a free command slot.
    fn send_capsule(&mut self, bytes: &[u8]) -> Result<()> {
        if let Some((_, why)) = &self.broken {
            bail!("queue {} is down ({why})", self.qid);
        }
        let deadline = self.verbs.now() + STEP_TIMEOUT;
        let slot = loop {
            let n = self.sending.len();
            if let Some(s) = (0..n)
                .map(|i| (self.next_slot + i) % n)
                .find(|&s| !self.sending[s])
            {
                break s;
            }
            self.poll();
            if self.is_broken() || self.verbs.now() > deadline {
                bail!("queue {}: no command slot came free", self.qid);
            }
            self.verbs.sleep(POLL_PAUSE);
        };
        self.next_slot = (slot + 1) % self.sending.len();
        let base = slot * SLOT_LEN;
        self.cmds.write_at(base, bytes);
        let sge = [self
            .cmds
            .sge(base, bytes.len())
            .expect("capsule inside its slot")];
        let sges = if bytes.is_empty() { &[][..] } else { &sge[..] };
        if let Err(e) = self.qp.post_send(&[SendWr::send(slot as u64, sges)]) {
            self.mark_broken(format!("ibv_post_send failed: {e}"));
            bail!("queue {}: ibv_post_send: {e}", self.qid);
        }
        self.sending[slot] = true;
        Ok(())
    }

    /// Sends `cmd` (its CID is the caller's) with `data`; the SGL is set here.
    fn submit(&mut self, mut cmd: Command, data: Data) -> Result<()> {
        let sgl = match data {
            Data::None => SglDescriptor::null(),
            Data::Keyed { offset, len } => SglDescriptor::keyed(
                self.data.mr().remote_addr(offset),
                len,
                self.data.mr().rkey(),
                false,
            ),
        };
        cmd.set_sgl(sgl);
        self.send_capsule(cmd.as_bytes())
    }

    /// Takes what the CQ and the CM channel have: responses go to `responses` (their
    /// receive posted again when `repost`), SEND completions free their slot, a failed work
    /// request or a CM disconnect marks the queue broken.
    fn poll(&mut self) {
        let mut wcs = [WorkCompletion::default(); 32];
        loop {
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.mark_broken(format!("ibv_poll_cq failed: {e}"));
                    0
                }
            };
            for wc in &wcs[..n] {
                let recv = wc.wr_id() & RECV_BIT != 0;
                let slot = (wc.wr_id() & !RECV_BIT) as usize;
                if !recv && slot < self.sending.len() {
                    self.sending[slot] = false;
                }
                if !wc.is_success() {
                    let what = if recv { "receive" } else { "send" };
                    let kind = if wc.status() == WcStatus::WR_FLUSH_ERR {
                        "flush error"
                    } else {
                        "error"
                    };
                    self.mark_broken(format!("{what} {kind}: {}", wc.status()));
                    continue;
                }
                if !recv {
                    continue;
                }
                self.received += 1;
                let mut raw = [0u8; CQE_LEN];
                self.rsps.read_at(slot * CQE_LEN, &mut raw);
                if wc.byte_len() as usize == CQE_LEN {
                    self.responses
                        .push_back(Completion::read_from_bytes(&raw).expect("16 bytes"));
                }
                if self.repost && !self.is_broken() {
                    if let Err(e) = self.post_recv(slot) {
                        self.mark_broken(format!("reposting a receive: {e:#}"));
                    }
                }
            }
            if n < wcs.len() {
                break;
            }
        }
        loop {
            match self.ch.get_event() {
                Ok(Some(ev)) => {
                    if matches!(
                        ev.kind,
                        CmEventKind::Disconnected | CmEventKind::DeviceRemoval
                    ) {
                        self.mark_broken(format!("CM {:?}", ev.kind).to_uppercase());
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.mark_broken(format!("rdma_get_cm_event failed: {e}"));
                    break;
                }
            }
        }
    }

    /// Waits for the response to `cid`, up to [`STEP_TIMEOUT`].
    fn wait_response(&mut self, cid: u16, what: &str) -> Result<Completion> {
        let deadline = self.verbs.now() + STEP_TIMEOUT;
        loop {
            self.poll();
            if let Some(i) = self.responses.iter().position(|c| c.cid.get() == cid) {
                return Ok(self.responses.remove(i).expect("found"));
            }
            if let Some((_, why)) = &self.broken {
                bail!("{what} on queue {}: the queue went down ({why})", self.qid);
            }
            if self.verbs.now() > deadline {
                bail!(
                    "{what} on queue {}: no response within {STEP_TIMEOUT:?}",
                    self.qid
                );
            }
            self.verbs.sleep(POLL_PAUSE);
        }
    }

    fn run(&mut self, cmd: Command, data: Data, what: &str) -> Result<Completion> {
        let cid = cmd.cid.get();
        self.submit(cmd, data)?;
        self.wait_response(cid, what)
    }

    /// Fabrics Connect of this queue to controller `cntlid` (CNTLID_DYNAMIC: a new one),
    /// with the Connect data keyed at offset 0 of the data buffer. Returns the CNTLID.
    fn fabrics_connect(&mut self, opts: &Options, cntlid: u16, kato_ms: u32) -> Result<u16> {
        let cd = ConnectData::new(opts.hostid(), cntlid, &opts.subnqn, &opts.hostnqn);
        self.data.write_at(0, cd.as_bytes());
        let cmd = ConnectCommand::new(0x7000, self.qid, self.depth - 1, kato_ms).to_command();
        let len = cd.as_bytes().len() as u32;
        let c = self.run(cmd, Data::Keyed { offset: 0, len }, "Fabrics Connect")?;
        if !c.status().is_success() {
            bail!(
                "Fabrics Connect of queue {} to {} refused: {}",
                self.qid,
                opts.subnqn,
                c.status().in_connect()
            );
        }
        Ok(c.dw0.get() as u16)
    }

    /// Sets CC.EN and waits for CSTS.RDY.
    fn enable_controller(&mut self) -> Result<()> {
        let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
        let set = PropertySetCommand::new(0x7001, Property::CC.0, u64::from(cc.0), false);
        let c = self.run(set.to_command(), Data::None, "Property Set CC")?;
        if !c.status().is_success() {
            bail!("Property Set CC.EN failed: {}", c.status());
        }
        let deadline = self.verbs.now() + STEP_TIMEOUT;
        loop {
            let get = PropertyGetCommand::new(0x7002, Property::CSTS.0, false);
            let c = self.run(get.to_command(), Data::None, "Property Get CSTS")?;
            if c.status().is_success() && Csts(c.dw0.get()).rdy() {
                return Ok(());
            }
            if self.verbs.now() > deadline {
                bail!(
                    "the controller did not become ready (CSTS {:#x})",
                    c.dw0.get()
                );
            }
            self.verbs.sleep(Duration::from_millis(50));
        }
    }

    /// Tells the target we are going and drops the queue.
    fn close(self) {
        if self.broken.is_none() {
            let _ = self.id.disconnect();
            // Give the target's answer a moment, so both sides see the connection end.
            let deadline = self.verbs.now() + Duration::from_millis(500);
            while self.verbs.now() < deadline {
                if let Ok(Some(ev)) = self.ch.get_event() {
                    if ev.kind == CmEventKind::Disconnected {
                        break;
                    }
                }
                self.verbs.sleep(Duration::from_millis(5));
            }
        }
    }
}

fn new_buf<V: Verbs>(pd: &Arc<V::Pd>, len: usize, access: AccessFlags) -> Result<DmaBuf<V>> {
    DmaBuf::new(pd, len, access).with_context(|| {
        format!("registering {len} bytes of memory (raise `ulimit -l` if this is EPERM/ENOMEM)")
    })
}

fn wait_cm<V: Verbs>(
    ch: &V::Channel,
    kind: CmEventKind,
    peer: SocketAddr,
    step: &str,
) -> Result<()> {
    match ch.wait_event(kind, STEP_TIMEOUT + Duration::from_secs(1)) {
        Ok(_) => Ok(()),
        Err(RdmaError::CmEventTimeout { timeout, .. }) => {
            bail!("{step} for {peer}: no answer within {timeout:?}")
        }
        Err(RdmaError::UnexpectedCmEvent { got, status, .. }) => {
            let errno = std::io::Error::from_raw_os_error(status.saturating_abs());
            bail!(
                "{step} for {peer} failed: {got:?} ({errno}); is {} reachable through an RDMA \
                 device?",
                peer.ip()
            )
        }
        Err(e) => Err(e).with_context(|| format!("{step} for {peer}")),
    }
}

/// An admin queue with a live, enabled controller: CM connect, Fabrics Connect for a new
/// controller, CC.EN.
fn admin_queue<V: Verbs>(verbs: &V, opts: &Options, kato_ms: u32) -> Result<(Queue<V>, u16)> {
    let mut q = Queue::connect(verbs, opts.peer, 0, ADMIN_DEPTH, ADMIN_DEPTH, 4096)?;
    let cntlid = q.fabrics_connect(opts, CNTLID_DYNAMIC, kato_ms)?;
    q.enable_controller()?;
    Ok((q, cntlid))
}

// ---------------------------------------------------------------------------------------
// stall

fn stall<V: Verbs>(verbs: &V, opts: &Options, out: &mut Report<V>) -> Result<()> {
    let hold = Duration::from_secs(opts.seconds.unwrap_or(40));
    let (mut admin, cntlid) = admin_queue(verbs, opts, KATO_MS)?;
    // Namespace 1's block size and capacity, to build the READs.
    let c = admin.run(
        Command::identify(0x7003, Cns::NAMESPACE, 1, 0),
        Data::Keyed {
            offset: 0,
            len: 4096,
        },
        "Identify Namespace 1",
    )?;
    if !c.status().is_success() {
        bail!(
            "Identify Namespace 1 of {} failed: {}",
            opts.subnqn,
            c.status()
        );
    }
    let mut raw = [0u8; 4096];
    admin.data.read_at(0, &mut raw);
    let ns = IdentifyNamespace::read_from_bytes(&raw).expect("4096 bytes");
    let bs = ns.current_lbaf().block_size();
    let nsze = ns.nsze.get();
    let nlb = u64::from(STALL_IO_BYTES) / bs.max(1);
    if bs == 0 || !(1..=0x1_0000).contains(&nlb) || nsze < nlb {
        bail!("namespace 1 ({nsze} blocks of {bs} B) cannot take READs of {STALL_IO_BYTES} B");
    }

    // The I/O queue: one receive, for the Connect response; none after. Every READ lands in
    // the same 128 KiB (the data is never looked at).
    let mut io = Queue::connect(verbs, opts.peer, 1, opts.depth, 1, STALL_IO_BYTES as usize)?;
    io.repost = false;
    io.fabrics_connect(opts, cntlid, 0)?;
    // From here on, every response is one the target managed to deliver without a receive.
    io.received = 0;
    out.say(
        "connected",
        format!(
            "admin queue cntlid={cntlid} kato={KATO_MS}ms, I/O queue qid=1 depth={} \
             (namespace 1: {nsze} blocks of {bs} B) to {} at {}",
            io.depth, opts.subnqn, opts.peer
        ),
    );

    let n = io.depth - 1;
    for i in 0..n {
        let slba = (u64::from(i) * nlb) % (nsze - nlb + 1);
        let cmd = Command::read(i + 1, 1, slba, nlb as u32);
        let data = Data::Keyed {
            offset: 0,
            len: STALL_IO_BYTES,
        };
        io.submit(cmd, data).context("submitting the READs")?;
    }
    let submitted = verbs.now();
    out.say(
        "submitted",
        format!(
            "{n} READ commands of {STALL_IO_BYTES} bytes on the I/O queue, no receive posted \
             for their responses"
        ),
    );
    out.say(
        "holding",
        format!(
            "up to {} s (until {} s after the target cuts the I/O queue), Keep Alive every \
             second on the admin queue",
            hold.as_secs(),
            AFTER_CUT.as_secs()
        ),
    );

    let end = verbs.now() + hold;
    let mut next_ka = verbs.now() + Duration::from_secs(1);
    let mut ka_cid: u16 = 0x100;
    let mut ka_sent = 0u32;
    let mut ka_ok = 0u32;
    let mut ka_pending: HashMap<u16, Instant> = HashMap::new();
    let mut io_cut: Option<Instant> = None;
    let mut admin_cut = false;
    loop {
        admin.poll();
        io.poll();
        ka_ok += keep_alive_answers(&mut admin, &mut ka_pending, out);
        if let (None, Some((at, why))) = (io_cut, &io.broken) {
            io_cut = Some(*at);
            out.say(
                "io-queue-disconnected",
                format!(
                    "the target closed the I/O queue {} s after the READs were submitted \
                     ({why}); responses received on it: {}",
                    secs(at.saturating_duration_since(submitted)),
                    io.received
                ),
            );
        }
        if let (false, Some((at, why))) = (admin_cut, &admin.broken) {
            admin_cut = true;
            out.say(
                "admin-queue-disconnected",
                format!(
                    "{} s after the READs were submitted ({why})",
                    secs(at.saturating_duration_since(submitted))
                ),
            );
        }
        let now = verbs.now();
        let overdue = ka_pending
            .iter()
            .find(|(_, &sent)| now.saturating_duration_since(sent) > STEP_TIMEOUT)
            .map(|(&cid, _)| cid);
        if let Some(cid) = overdue {
            ka_pending.remove(&cid);
            out.say(
                "keep-alive-unanswered",
                format!("Keep Alive {cid:#x} unanswered for {STEP_TIMEOUT:?}"),
            );
        }
        if now >= next_ka && !admin.is_broken() {
            next_ka += Duration::from_secs(1);
            ka_cid = ka_cid.wrapping_add(1).max(0x100);
            if admin
                .submit(Command::keep_alive(ka_cid), Data::None)
                .is_ok()
            {
                ka_sent += 1;
                ka_pending.insert(ka_cid, now);
            }
        }
        if now >= end || io_cut.is_some_and(|at| now >= at + AFTER_CUT) {
            break;
        }
        if admin.is_broken() && io.is_broken() {
            break;
        }
        verbs.sleep(Duration::from_millis(5));
    }
    // The last Keep Alive may have just gone out: its answer counts too.
    let deadline = verbs.now() + Duration::from_secs(2);
    while !ka_pending.is_empty() && !admin.is_broken() && verbs.now() < deadline {
        verbs.sleep(POLL_PAUSE);
        admin.poll();
        ka_ok += keep_alive_answers(&mut admin, &mut ka_pending, out);
    }
    let cut = match io_cut {
        Some(at) => format!("{}s", secs(at.saturating_duration_since(submitted))),
        None => "none".into(),
    };
    out.say(
        "done",
        format!(
            "io_responses={} keep_alives={ka_ok}/{ka_sent} io_queue_cut_after={cut} \
             admin_queue_cut={admin_cut}",
            io.received
        ),
    );
    io.close();
    admin.close();
    Ok(())
}

/// Takes the admin queue's responses; returns how many were successful answers to the
/// Keep Alives in `pending` (and reports the others).
fn keep_alive_answers<V: Verbs>(
    admin: &mut Queue<V>,
    pending: &mut HashMap<u16, Instant>,
    out: &mut Report<V>,
) -> u32 {
    let mut ok = 0;
    for c in admin.responses.drain(..) {
        if pending.remove(&c.cid.get()).is_some() {
            if c.status().is_success() {
                ok += 1;
            } else {
                out.say(
                    "keep-alive-failed",
                    format!("Keep Alive answered {}", c.status()),
                );
            }
        }
    }
    ok
}

// ---------------------------------------------------------------------------------------
// no-connect

/// Polls every open connection; reports and drops those the target closed.
fn reap<V: Verbs>(
    conns: &mut Vec<(usize, Queue<V>)>,
    cut_after: &mut Vec<Duration>,
    out: &mut Report<V>,
) {
    conns.retain_mut(|(i, q)| {
        q.poll();
        match &q.broken {
            Some((at, why)) => {
                let after = at.saturating_duration_since(q.established);
                out.say(
                    "disconnected",
                    format!(
                        "connection {i} by the target after {} s ({why})",
                        secs(after)
                    ),
                );
                cut_after.push(after);
                false
            }
            None => true,
        }
    });
}

fn no_connect<V: Verbs>(verbs: &V, opts: &Options, out: &mut Report<V>) -> Result<()> {
    let count = opts.count.unwrap_or(32);
    let hold = Duration::from_secs(opts.seconds.unwrap_or(20));
    let end = verbs.now() + hold;
    let mut conns: Vec<(usize, Queue<V>)> = Vec::new();
    let mut refused = 0u32;
    let mut cut_after: Vec<Duration> = Vec::new();
    for i in 0..count as usize {
        // Eight entries: nothing is ever sent on them.
        match Queue::connect(verbs, opts.peer, 0, 8, 0, 4096) {
            Ok(q) => conns.push((i, q)),
            Err(e) if i == 0 => return Err(e),
            Err(e) => {
                refused += 1;
                out.say("refused", format!("connection {i}: {e:#}"));
            }
        }
        // The ones the target closes meanwhile are timed from their own accept.
        reap(&mut conns, &mut cut_after, out);
    }
    let accepted = count - refused;
    out.say(
        "connected",
        format!(
            "{accepted} of {count} connections accepted by {} (no Fabrics Connect will be sent)",
            opts.peer
        ),
    );
    out.say(
        "holding",
        format!(
            "up to {} s, until the target has closed them all",
            hold.as_secs()
        ),
    );
    while !conns.is_empty() && verbs.now() < end {
        reap(&mut conns, &mut cut_after, out);
        verbs.sleep(Duration::from_millis(10));
    }
    let first = cut_after.iter().min().map_or("none".into(), |d| secs(*d));
    let last = cut_after.iter().max().map_or("none".into(), |d| secs(*d));
    out.say(
        "done",
        format!(
            "accepted={accepted} refused={refused} disconnected={} open={} first={first}s \
             last={last}s",
            cut_after.len(),
            conns.len()
        ),
    );
    for (_, q) in conns {
        q.close();
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// garbage

/// splitmix64: enough randomness for garbage, reproducible from a printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Capsule {
    /// Random bytes, shorter than an SQE.
    Short,
    /// A well-formed 64-byte SQE with a random opcode and random command dwords.
    Sqe,
    /// Random bytes, 64 to 200 of them.
    Random,
}

impl Capsule {
    fn name(self) -> &'static str {
        match self {
            Self::Short => "short",
            Self::Sqe => "sqe-random-opcode",
            Self::Random => "random",
        }
    }
}

/// Half the capsules are random bytes of a random length (0..=200), half SQEs with a random
/// opcode, CID, command dwords and one of four NSIDs, and a null SGL: those get past the
/// transport and reach the command parsers.
fn make_capsule(rng: &mut Rng) -> (Capsule, Vec<u8>) {
    if rng.below(2) == 0 {
        let len = rng.below(GARBAGE_MAX_LEN as u64 + 1) as usize;
        let mut bytes = vec![0u8; len];
        rng.fill(&mut bytes);
        let kind = if len < SQE_LEN {
            Capsule::Short
        } else {
            Capsule::Random
        };
        return (kind, bytes);
    }
    let nsid = match rng.below(4) {
        0 => 0,
        1 => 1,
        2 => 0xFFFF_FFFF,
        _ => rng.next() as u32,
    };
    let mut cmd = Command::new(rng.next() as u8, rng.next() as u16, nsid);
    for dw in [
        &mut cmd.cdw10,
        &mut cmd.cdw11,
        &mut cmd.cdw12,
        &mut cmd.cdw13,
        &mut cmd.cdw14,
        &mut cmd.cdw15,
    ] {
        dw.set(rng.next() as u32);
    }
    cmd.set_sgl(SglDescriptor::null());
    (Capsule::Sqe, cmd.as_bytes().to_vec())
}

fn garbage<V: Verbs>(verbs: &V, opts: &Options, out: &mut Report<V>) -> Result<()> {
    let count = opts.count.unwrap_or(200);
    let end = verbs.now() + Duration::from_secs(opts.seconds.unwrap_or(120));
    let mut rng = Rng(opts.seed);
    out.say(
        "garbage",
        format!(
            "{count} capsules to {} at {}, seed {}",
            opts.subnqn, opts.peer, opts.seed
        ),
    );
    let mut sent = 0u32;
    let mut kinds: BTreeMap<Capsule, u32> = BTreeMap::new();
    let mut statuses: BTreeMap<String, u32> = BTreeMap::new();
    let mut responses = 0u32;
    let mut unanswered = 0u32;
    let mut cuts = 0u32;
    let mut cut_by: BTreeMap<Capsule, u32> = BTreeMap::new();
    let mut sessions = 0u32;
    let mut refused = 0u32;
    let mut refused_in_a_row = 0u32;
    let mut timed_out = false;
    while sent < count {
        if verbs.now() >= end {
            timed_out = true;
            break;
        }
        sessions += 1;
        // Every other session sends its garbage before any Fabrics Connect (the target
        // takes nothing but a Connect then), the others to a live, enabled controller.
        let with_controller = sessions % 2 == 1;
        let setup = if with_controller {
            admin_queue(verbs, opts, 0).map(|(q, cntlid)| (q, format!("controller {cntlid}")))
        } else {
            Queue::connect(verbs, opts.peer, 0, ADMIN_DEPTH, ADMIN_DEPTH, 4096)
                .map(|q| (q, "no Fabrics Connect".to_string()))
        };
        let mut q = match setup {
            Ok((q, what)) => {
                refused_in_a_row = 0;
                out.say("session", format!("{sessions}: admin queue up, {what}"));
                q
            }
            Err(e) if sessions == 1 => return Err(e),
            Err(e) => {
                refused += 1;
                refused_in_a_row += 1;
                out.say("refused", format!("session {sessions}: {e:#}"));
                if refused_in_a_row >= 5 {
                    out.say("giving-up", "five connections in a row failed");
                    break;
                }
                verbs.sleep(Duration::from_millis(500));
                continue;
            }
        };
        while sent < count && verbs.now() < end {
            let (kind, bytes) = make_capsule(&mut rng);
            sent += 1;
            *kinds.entry(kind).or_default() += 1;
            // A failed post marks the queue broken: reported below.
            let _ = q.send_capsule(&bytes);
            let deadline = verbs.now() + GARBAGE_WAIT;
            loop {
                q.poll();
                if !q.responses.is_empty() || q.is_broken() || verbs.now() >= deadline {
                    break;
                }
                verbs.sleep(POLL_PAUSE);
            }
            if q.responses.is_empty() && !q.is_broken() {
                unanswered += 1;
            }
            for c in q.responses.drain(..) {
                responses += 1;
                *statuses.entry(status_name(c.status())).or_default() += 1;
            }
            if let Some((_, why)) = &q.broken {
                cuts += 1;
                *cut_by.entry(kind).or_default() += 1;
                out.say(
                    "disconnected",
                    format!(
                        "session {sessions} after capsule {sent} ({} bytes, {}): {why}",
                        bytes.len(),
                        kind.name()
                    ),
                );
                break;
            }
        }
        q.close();
    }
    if sent < count && verbs.now() >= end {
        timed_out = true;
    }
    let mut by_count: Vec<(&String, &u32)> = statuses.iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let statuses = by_count
        .iter()
        .map(|(k, n)| format!("{k}:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    let n = |m: &BTreeMap<Capsule, u32>, k| m.get(&k).copied().unwrap_or(0);
    out.say(
        "done",
        format!(
            "sent={sent} short={} sqe={} random={} sessions={sessions} refused={refused} \
             responses={responses} unanswered={unanswered} target_disconnects={cuts} \
             cut_after_short={} cut_after_sqe={} cut_after_random={} stopped_by_time={timed_out} \
             statuses={statuses}",
            n(&kinds, Capsule::Short),
            n(&kinds, Capsule::Sqe),
            n(&kinds, Capsule::Random),
            n(&cut_by, Capsule::Short),
            n(&cut_by, Capsule::Sqe),
            n(&cut_by, Capsule::Random),
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_id_is_the_uuid_of_the_host_nqn() {
        let id = host_id("nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555");
        assert_eq!(id[..4], [0x11; 4]);
        assert_eq!(id[15], 0x55);
        assert_eq!(host_id("nqn.2016-06.io.example:host"), [0xB0; 16]);
    }

    #[test]
    fn garbage_capsules_have_the_promised_shapes() {
        let mut rng = Rng(1);
        let mut seen = BTreeMap::new();
        for _ in 0..1000 {
            let (kind, bytes) = make_capsule(&mut rng);
            *seen.entry(kind).or_insert(0) += 1;
            assert!(bytes.len() <= GARBAGE_MAX_LEN);
            match kind {
                Capsule::Short => assert!(bytes.len() < SQE_LEN),
                Capsule::Random => assert!(bytes.len() >= SQE_LEN),
                Capsule::Sqe => {
                    assert_eq!(bytes.len(), SQE_LEN);
                    let cmd = Command::read_from_bytes(&bytes).unwrap();
                    assert_eq!(cmd.psdt(), 1, "SGL data pointer");
                }
            }
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        // The same seed gives the same capsules.
        assert_eq!(make_capsule(&mut Rng(7)), make_capsule(&mut Rng(7)));
    }

    #[test]
    fn done_fields() {
        let d = "accepted=32 refused=0 disconnected=32 open=0 first=3.01s";
        assert_eq!(field(d, "disconnected"), Some("32"));
        assert_eq!(field(d, "open"), Some("0"));
        assert_eq!(field(d, "first"), Some("3.01s"));
        assert_eq!(field(d, "none"), None);
    }
}

//! A target serving the real RDMA transport over the simulated fabric, driven from the test
//! thread, and raw NVMe-oF RDMA hosts that do exactly what a test tells them (including what
//! no well-behaved host does: stop posting receives, vanish, send garbage).
//!
//! Everything runs on one thread in a fixed order (fabric step, acceptor turn, each reactor's
//! poll), on the fabric's virtual clock: the same seed gives the same run.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use nvmf_common::rdma::sim::{default_device_attr, SimConfig, SimFabric, SimVerbs};
use nvmf_common::rdma::{
    AccessFlags, CmEvent, CmEventKind, ConnParams, DeviceAttr, DmaBuf, QpCaps, RdmaError, RecvWr,
    SendWr, Verbs, VerbsChannel, VerbsCmId, VerbsCq, VerbsMr, VerbsQp, WcOpcode, WcStatus,
    WorkCompletion,
};
use nvmf_common::spec::command::Command;
use nvmf_common::spec::fabrics::{ConnectCommand, ConnectData, CNTLID_DYNAMIC};
use nvmf_common::spec::rdma_cm::RdmaCmRequest;
use nvmf_common::spec::sgl::SglDescriptor;
use nvmf_common::spec::Completion;
use nvmf_target::bdev::{BdevRef, MallocBdev};
use nvmf_target::core::subsystem::ListenAddress;
use nvmf_target::core::{Housekeeping, PollGroup, TargetInfo};
use nvmf_target::target::{NamespaceOptions, SubsystemOptions, Target};
use nvmf_target::transport::options::TransportOptions;
use nvmf_target::transport::rdma::{
    AcceptorMode, PollGroupResources, RdmaPollGroup, RdmaTransport,
};
use zerocopy::{FromBytes, IntoBytes};

pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub const SUBNQN: &str = "nqn.2016-06.io.spdk:sim1";
pub const PORT: u16 = 4420;
const SQE_LEN: usize = 64;
const CQE_LEN: usize = 16;

pub fn target_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1))
}

pub fn host_ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 2, n))
}

/// Transport options small enough that tests reach the limits: tiny SRQ, the fewest buffers.
pub fn small_options() -> TransportOptions {
    let mut o = TransportOptions::new("RDMA");
    o.max_srq_depth = 256;
    o.num_shared_buffers = 32;
    o
}

/// The target: one `Target`, `reactors` poll groups and the RDMA transport over a simulated
/// host, all on the fabric's clock.
pub struct SimLab {
    pub fabric: SimFabric,
    pub verbs: SimVerbs,
    pub target: Target,
    pub pgs: Vec<PollGroup>,
    pub transport: Arc<RdmaTransport<SimVerbs>>,
    pub bdev: BdevRef,
    /// The RDMA READs a host's queue connected from now on lets the target have in flight
    /// on it (its responder resources; Linux hosts offer what their NIC serves, 16 on
    /// many).
    pub host_read_credits: u8,
}

impl SimLab {
    pub fn new(seed: u64) -> Self {
        Self::with(seed, small_options(), 1)
    }

    pub fn with(seed: u64, opts: TransportOptions, reactors: usize) -> Self {
        Self::with_device(seed, opts, reactors, default_device_attr())
    }

    /// A lab whose target device has the limits `attr` (a small CQ, say).
    pub fn with_target_attr(seed: u64, opts: TransportOptions, attr: DeviceAttr) -> Self {
        Self::with_device(seed, opts, 1, attr)
    }

    pub fn with_device(
        seed: u64,
        opts: TransportOptions,
        reactors: usize,
        attr: DeviceAttr,
    ) -> Self {
        Self::with_fabric(Self::fabric_config(seed), opts, reactors, attr)
    }

    /// The fabric every lab runs on, before a test changes it (to record payloads, say).
    pub fn fabric_config(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            // An RNR NAK timer of a few milliseconds, as RoCE NICs use: a host that never
            // posts receives then costs the simulation hundreds, not hundreds of thousands,
            // of retries per simulated second.
            rnr_timer_ns: 2_000_000,
            ..SimConfig::default()
        }
    }

    /// A lab on a fabric made with `cfg`, its target device with `attr`.
    pub fn with_fabric(
        cfg: SimConfig,
        opts: TransportOptions,
        reactors: usize,
        attr: DeviceAttr,
    ) -> Self {
        let fabric = SimFabric::new(cfg);
        let verbs = fabric.add_host_with(target_ip(), attr, "sim-target");
        let bdev: BdevRef = Arc::new(MallocBdev::new("Malloc0", 4096, 512, None).unwrap());
        Self::on_host(fabric, verbs, bdev, opts, reactors)
    }

    /// A target on the existing host `verbs` of `fabric`, serving `bdev` (named "Malloc0") as
    /// namespace 1 of [`SUBNQN`]: with the parts [`stop`](Self::stop) leaves, a restarted
    /// target at the same address with the same data.
    pub fn on_host(
        fabric: SimFabric,
        verbs: SimVerbs,
        bdev: BdevRef,
        opts: TransportOptions,
        reactors: usize,
    ) -> Self {
        let info = Arc::new(TargetInfo::default());
        let mut target = Target::new(Arc::clone(&info));
        let mut pgs = Vec::new();
        for i in 0..reactors {
            let mut pg = PollGroup::new(i, Arc::clone(&info));
            pg.core.use_virtual_clock(fabric.clock_ns());
            target.add_poll_group(pg.handle());
            pgs.push(pg);
        }
        let transport = Arc::new(
            RdmaTransport::with_verbs(verbs.clone(), opts, AcceptorMode::Driven)
                .expect("RDMA transport over the simulated fabric"),
        );
        target
            .add_transport(transport.clone())
            .expect("first transport");
        target.bdevs.register(Arc::clone(&bdev)).unwrap();
        let mut lab = Self {
            fabric,
            verbs,
            target,
            pgs,
            transport,
            bdev,
            host_read_credits: 16,
        };
        lab.subsystem(SUBNQN);
        lab
    }

    /// Tears the target down at once, as a killed target process: the poll groups (their
    /// connections' QPs and CM ids: hosts get a DREQ), the target and the transport (its
    /// listeners) are dropped, with no orderly shutdown. Returns what outlives the process:
    /// the fabric, the target's host and the bdev (see [`on_host`](Self::on_host)).
    pub fn stop(self) -> (SimFabric, SimVerbs, BdevRef) {
        let Self {
            fabric,
            verbs,
            target,
            pgs,
            transport,
            bdev,
            ..
        } = self;
        drop(pgs);
        drop(target);
        drop(transport);
        (fabric, verbs, bdev)
    }

    /// An NVM subsystem open to any host with Malloc0 as namespace 1 and a listener on the
    /// target's address.
    pub fn subsystem(&mut self, nqn: &str) {
        let opts = SubsystemOptions {
            allow_any_host: true,
            serial_number: "SIM0001".into(),
            model_number: "rust nvmf sim".into(),
            ..Default::default()
        };
        self.target.create_subsystem(nqn, opts).unwrap();
        self.target
            .add_namespace(
                nqn,
                NamespaceOptions {
                    bdev_name: "Malloc0".into(),
                    ..Default::default()
                },
            )
            .unwrap();
        self.target.add_listener(nqn, listen_address()).unwrap();
        self.turns(4);
    }

    /// One turn of everything: the acceptor, each reactor, then the fabric. While the target
    /// has work in hand only the fabric events due now run; when it is idle the fabric moves
    /// virtual time on to its next event. So time never leaps past work the target could
    /// have done at once (its timers would fire early).
    pub fn turn(&mut self) {
        let mut work = self.transport.acceptor_turn(Duration::ZERO);
        for pg in &mut self.pgs {
            work += pg.poll();
        }
        if work > 0 {
            self.fabric.advance(Duration::ZERO);
        } else {
            self.fabric.step();
        }
    }

    /// The target's side of a turn, without stepping the fabric: the acceptor, then each
    /// reactor. For a fabric idle hook ([`SimFabric::set_idle_hook`]), which runs while an
    /// initiator on the same fabric waits (the waiting call steps the fabric itself).
    pub fn target_turn(&mut self) {
        self.transport.acceptor_turn(Duration::ZERO);
        for pg in &mut self.pgs {
            pg.poll();
        }
    }

    pub fn turns(&mut self, n: usize) {
        for _ in 0..n {
            self.turn();
        }
    }

    /// Advances virtual time by `d` in steps of `step`, turning everything at each.
    pub fn run_for(&mut self, d: Duration, step: Duration) {
        let end = self.fabric.now_ns() + d.as_nanos() as u64;
        while self.fabric.now_ns() < end {
            self.fabric.advance(step);
            self.turn();
        }
    }

    /// Turns until `done` holds; panics (naming the seed's trace) after `max` turns.
    pub fn until(&mut self, max: usize, mut done: impl FnMut(&mut Self) -> bool) {
        for _ in 0..max {
            if done(self) {
                return;
            }
            self.turn();
        }
        let trace = self.fabric.trace();
        let tail = &trace[trace.len().saturating_sub(30)..];
        panic!(
            "condition not reached after {max} turns; last trace lines:\n{}",
            tail.join("\n")
        );
    }

    /// What reactor `i`'s RDMA poll group holds now.
    pub fn resources(&mut self, i: usize) -> PollGroupResources {
        self.rdma_group(i, |g| g.resources())
    }

    /// `f` on reactor `i`'s RDMA poll group.
    fn rdma_group<R>(&mut self, i: usize, f: impl FnOnce(&mut RdmaPollGroup<SimVerbs>) -> R) -> R {
        self.pgs[i]
            .with_transport(0, |t, _| {
                f(t.as_any_mut()
                    .downcast_mut::<RdmaPollGroup<SimVerbs>>()
                    .expect("the RDMA poll group"))
            })
            .expect("transport 0")
    }

    /// Sets the target's `max_qpairs` (as `nvmf_set_config` does).
    pub fn set_max_qpairs(&mut self, n: u32) {
        self.target
            .info
            .qpair_limits
            .max_total
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Reactor `i`'s qpairs: (queue ID, QP number) each.
    pub fn queue_qp_numbers(&mut self, i: usize) -> Vec<(Option<u16>, u32)> {
        self.rdma_group(i, |g| g.queue_qp_numbers())
    }

    /// Runs the fabric in 50 ms steps (virtual), at most `steps` of them, until reactor 0
    /// holds `qpairs` qpairs (a closing queue is reaped at a housekeeping tick once its work
    /// requests are back, or after the drain timeout). Returns whether it got there.
    pub fn run_until_qpairs(&mut self, qpairs: usize, steps: usize) -> bool {
        for _ in 0..steps {
            if self.resources(0).qpairs == qpairs {
                return true;
            }
            self.run_for(Duration::from_millis(50), Duration::from_millis(5));
        }
        self.resources(0).qpairs == qpairs
    }

    /// What reactor `i`'s housekeeping ticks have looked at so far.
    pub fn housekeeping(&self, i: usize) -> Housekeeping {
        self.pgs[i].core.housekeeping
    }

    pub fn total_resources(&mut self) -> PollGroupResources {
        let mut sum = PollGroupResources::default();
        for i in 0..self.pgs.len() {
            let r = self.resources(i);
            sum.qpairs += r.qpairs;
            sum.requests_in_use += r.requests_in_use;
            sum.requests_deferred += r.requests_deferred;
            sum.buffers_out += r.buffers_out;
            sum.recv_slots_held += r.recv_slots_held;
            sum.waiting += r.waiting;
            sum.backlog += r.backlog;
        }
        sum
    }

    /// Runs virtual time until every qpair is gone, then checks nothing is held.
    pub fn assert_drained(&mut self) {
        for _ in 0..200 {
            if self.total_resources().qpairs == 0 {
                break;
            }
            self.run_for(Duration::from_millis(50), Duration::from_millis(5));
        }
        let r = self.total_resources();
        assert_eq!(r.qpairs, 0, "qpairs left: {r:?}");
        assert_eq!(r.requests_in_use, 0, "requests leaked: {r:?}");
        assert_eq!(r.requests_deferred, 0, "deferred requests leaked: {r:?}");
        assert_eq!(r.buffers_out, 0, "data buffers leaked: {r:?}");
        assert_eq!(r.recv_slots_held, 0, "SRQ slots leaked: {r:?}");
        // With its queues gone, no controller is left in a subsystem, and no queue pair in
        // the target-wide connection count (that count refuses Connects when full).
        for sub in self.target.subsystems() {
            let left: Vec<u16> = sub.shared.controllers().iter().map(|c| c.cntlid).collect();
            assert!(left.is_empty(), "controllers left in {}: {left:?}", sub.nqn);
        }
        let (connected, _) = self.target.info.qpair_limits.connected(HOSTNQN);
        assert_eq!(connected, 0, "queue pairs still counted as connected");
        // Nor does the acceptor remember a connection's reactor.
        assert_eq!(
            self.transport.connections_tracked(),
            0,
            "the acceptor still tracks connections"
        );
    }
}

pub fn listen_address() -> ListenAddress {
    ListenAddress {
        trtype: "RDMA".into(),
        adrfam: "IPv4".into(),
        traddr: target_ip().to_string(),
        trsvcid: PORT.to_string(),
    }
}

/// Where a command's data is.
#[derive(Clone, Copy, Debug)]
pub enum Data {
    None,
    /// `len` bytes of the queue's data buffer at `offset`, named by a keyed SGL.
    Keyed {
        offset: usize,
        len: u32,
    },
    /// Keyed, with a key and address the test chose (lies included).
    RawKeyed {
        addr: u64,
        len: u32,
        key: u32,
    },
    /// `len` bytes after the SQE in the capsule, taken from the data buffer at `offset`.
    InCapsule {
        offset: usize,
        len: u32,
    },
}

/// Why a connect did not give a queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// RDMA CM reject with this NVMe-oF status (0 when the private data carried none).
    Rejected {
        status: i32,
        nvmf_status: u16,
    },
    Other(CmEventKind),
}

/// One raw host queue: an RC QP with its own receive queue, command and response slots, and a
/// data buffer the target may read and write through its key.
pub struct HostQueue {
    pub verbs: SimVerbs,
    pub channel: <SimVerbs as Verbs>::Channel,
    pub depth: u16,
    pub in_capsule: u32,
    // Field order is drop order: the QP before the memory it names.
    pub qp: <SimVerbs as Verbs>::Qp,
    pub id: <SimVerbs as Verbs>::CmId,
    pub cq: Arc<<SimVerbs as Verbs>::Cq>,
    pub cmds: DmaBuf<SimVerbs>,
    pub rsps: DmaBuf<SimVerbs>,
    pub data: DmaBuf<SimVerbs>,
    /// Whether completed receives are posted again (a hostile host stops).
    pub repost: bool,
    /// Receives on the QP now.
    pub recvs_posted: usize,
    /// Which response slots have a receive on the QP (two receives on one slot would make
    /// two responses share a buffer).
    slot_posted: Vec<bool>,
    pub next_cmd_slot: usize,
    pub disconnected: bool,
    /// The target's QP number for this connection (fault injection names it).
    pub target_qp_num: u32,
    /// Send completions with an error status (other than flushes).
    pub send_errors: Vec<WcStatus>,
}

/// A queue set up to connect ([`HostQueue::prepare_connect`]).
pub struct PendingConnect {
    queue: HostQueue,
    private_data: Vec<u8>,
}

impl PendingConnect {
    /// Sends the connect request, without turning the lab.
    pub fn send(&self, lab: &SimLab) {
        self.queue
            .id
            .connect(&ConnParams {
                initiator_depth: 16,
                responder_resources: lab.host_read_credits,
                ..ConnParams::with_private_data(&self.private_data)
            })
            .expect("connect");
    }

    /// Turns the lab until the target answers: the connected queue, or why it was refused.
    pub fn established(self, lab: &mut SimLab) -> Result<HostQueue, Refused> {
        self.queue.established(lab)
    }
}

impl HostQueue {
    /// Connects queue `qid` of `depth` entries to the lab's target from host `verbs`, and
    /// posts `depth` receives. Turns the lab while waiting.
    pub fn connect(
        lab: &mut SimLab,
        verbs: &SimVerbs,
        qid: u16,
        depth: u16,
    ) -> Result<Self, Refused> {
        Self::connect_with(lab, verbs, qid, depth, 8192, usize::from(depth), |req| {
            req.as_bytes().to_vec()
        })
    }

    /// [`connect`](Self::connect) with a data buffer of `data_len` bytes, `recvs` receives
    /// posted before connecting, and private data made by `private` from the well-formed
    /// request.
    pub fn connect_with(
        lab: &mut SimLab,
        verbs: &SimVerbs,
        qid: u16,
        depth: u16,
        data_len: usize,
        recvs: usize,
        private: impl FnOnce(&RdmaCmRequest) -> Vec<u8>,
    ) -> Result<Self, Refused> {
        let pending = Self::prepare(lab, verbs, qid, depth, data_len, recvs, private);
        pending.send(lab);
        pending.established(lab)
    }

    /// Sets the queue up (address and route resolved, receives posted) to send its connect
    /// request when told.
    fn prepare(
        lab: &mut SimLab,
        verbs: &SimVerbs,
        qid: u16,
        depth: u16,
        data_len: usize,
        recvs: usize,
        private: impl FnOnce(&RdmaCmRequest) -> Vec<u8>,
    ) -> PendingConnect {
        let channel = verbs.event_channel().expect("event channel");
        let id = channel.create_id().expect("cm id");
        let dst = SocketAddr::new(target_ip(), PORT);
        id.resolve_addr(None, dst, Duration::from_secs(1))
            .expect("resolve_addr");
        expect_event(lab, &channel, CmEventKind::AddrResolved);
        id.resolve_route(Duration::from_secs(1))
            .expect("resolve_route");
        expect_event(lab, &channel, CmEventKind::RouteResolved);
        let ctx = id.context().expect("device");
        let pd = SimVerbs::alloc_pd(&ctx).expect("pd");
        let cq = SimVerbs::create_cq(&ctx, u32::from(depth) * 4 + 8).expect("cq");
        let caps = QpCaps {
            max_send_wr: u32::from(depth) * 2 + 1,
            max_recv_wr: u32::from(depth),
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: SQE_LEN as u32 + 8192,
        };
        let qp = id.create_qp(&pd, &cq, &cq, None, caps).expect("qp");
        let in_capsule = 8192;
        let cmds = DmaBuf::<SimVerbs>::new(
            &pd,
            usize::from(depth) * (SQE_LEN + in_capsule as usize),
            AccessFlags::LOCAL_WRITE,
        )
        .expect("command slots");
        let rsps =
            DmaBuf::<SimVerbs>::new(&pd, usize::from(depth) * CQE_LEN, AccessFlags::LOCAL_WRITE)
                .expect("response slots");
        let data = DmaBuf::<SimVerbs>::new(&pd, data_len, AccessFlags::ALL_DATA).expect("data");
        let mut q = Self {
            verbs: verbs.clone(),
            channel,
            depth,
            in_capsule,
            qp,
            id,
            cq,
            cmds,
            rsps,
            data,
            repost: true,
            recvs_posted: 0,
            slot_posted: vec![false; usize::from(depth)],
            next_cmd_slot: 0,
            disconnected: false,
            target_qp_num: 0,
            send_errors: Vec::new(),
        };
        for slot in 0..recvs.min(usize::from(depth)) {
            q.post_recv(slot);
        }
        let req = RdmaCmRequest::new(qid, depth, depth - 1);
        let private_data = private(&req);
        PendingConnect {
            queue: q,
            private_data,
        }
    }

    /// [`connect`](Self::connect) up to the connect request, which
    /// [`PendingConnect::send`] sends; the lab does not turn in between, so several sent
    /// one after another reach the target together.
    pub fn prepare_connect(
        lab: &mut SimLab,
        verbs: &SimVerbs,
        qid: u16,
        depth: u16,
    ) -> PendingConnect {
        Self::prepare(lab, verbs, qid, depth, 8192, usize::from(depth), |req| {
            req.as_bytes().to_vec()
        })
    }

    /// Turns the lab until the target answers the connect request.
    fn established(mut self, lab: &mut SimLab) -> Result<Self, Refused> {
        let q = &mut self;
        let ev = next_event(lab, &q.channel);
        match ev.kind {
            CmEventKind::Established => {
                q.target_qp_num = ev.conn.qp_num;
                Ok(self)
            }
            CmEventKind::Rejected => {
                let nvmf_status = if ev.private_data.len() >= 4 {
                    u16::from_le_bytes([ev.private_data[2], ev.private_data[3]])
                } else {
                    0
                };
                Err(Refused::Rejected {
                    status: ev.status,
                    nvmf_status,
                })
            }
            other => Err(Refused::Other(other)),
        }
    }

    /// Posts a receive into response slot `slot`, which must have none.
    pub fn post_recv(&mut self, slot: usize) {
        assert!(
            !self.slot_posted[slot],
            "response slot {slot} already has a receive posted"
        );
        self.slot_posted[slot] = true;
        let sge = [self.rsps.sge(slot * CQE_LEN, CQE_LEN).expect("slot")];
        self.qp
            .post_recv(&[RecvWr::new(slot as u64, &sge)])
            .expect("post_recv");
        self.recvs_posted += 1;
    }

    /// A receive into `slot` completed and was consumed by a caller polling the CQ itself
    /// (the benchmark): the slot may be posted again.
    pub fn receive_done(&mut self, slot: usize) {
        self.recvs_posted -= 1;
        self.slot_posted[slot] = false;
    }

    /// Posts a receive into every response slot that has none.
    pub fn post_missing_receives(&mut self) {
        for slot in 0..self.slot_posted.len() {
            if !self.slot_posted[slot] {
                self.post_recv(slot);
            }
        }
    }

    /// Sends `cmd` (its CID is the caller's) with `data`; the SGL is filled in here. Panics
    /// if the host's send queue is full (see [`Self::try_submit`]).
    pub fn submit(&mut self, cmd: Command, data: Data) {
        assert!(self.try_submit(cmd, data), "the host's send queue is full");
    }

    /// [`Self::submit`], or false when the host's send queue has no room left: sends the
    /// target has not yet acknowledged hold it, and a host must wait for them, as a real one
    /// does (the NIC refuses the post). Nothing was sent then.
    pub fn try_submit(&mut self, mut cmd: Command, data: Data) -> bool {
        let slot = self.next_cmd_slot;
        self.next_cmd_slot = (slot + 1) % usize::from(self.depth);
        let base = slot * (SQE_LEN + self.in_capsule as usize);
        cmd.flags |= Command::FLAG_SGL;
        let mut extra = 0usize;
        cmd.dptr = match data {
            Data::None => SglDescriptor::keyed(0, 0, 0, false),
            Data::Keyed { offset, len } => SglDescriptor::keyed(
                self.data.mr().remote_addr(offset),
                len,
                self.data.mr().rkey(),
                false,
            ),
            Data::RawKeyed { addr, len, key } => SglDescriptor::keyed(addr, len, key, false),
            Data::InCapsule { offset, len } => {
                let mut bytes = vec![0u8; len as usize];
                self.data.read_at(offset, &mut bytes);
                self.cmds.write_at(base + SQE_LEN, &bytes);
                extra = len as usize;
                SglDescriptor::in_capsule(0, len)
            }
        };
        self.cmds.write_at(base, cmd.as_bytes());
        self.try_send_raw(base, SQE_LEN + extra)
    }

    /// Sends `len` bytes of the command region at `base` as one capsule, whatever they hold.
    /// The bytes go inline (copied at the post), so the slot may be reused at once. Panics if
    /// the host's send queue is full (see [`Self::try_send_raw`]).
    pub fn send_raw(&mut self, base: usize, len: usize) {
        assert!(
            self.try_send_raw(base, len),
            "the host's send queue is full"
        );
    }

    /// [`Self::send_raw`], or false when the host's send queue has no room left (see
    /// [`Self::try_submit`]).
    pub fn try_send_raw(&mut self, base: usize, len: usize) -> bool {
        let mut bytes = vec![0u8; len];
        self.cmds.read_at(base, &mut bytes);
        match self.qp.post_send(&[SendWr::send_inline(u64::MAX, &bytes)]) {
            Ok(()) => true,
            Err(RdmaError::PostSend { source, .. })
                if source.kind() == std::io::ErrorKind::OutOfMemory =>
            {
                false
            }
            Err(e) => panic!("post_send: {e}"),
        }
    }

    /// Writes `bytes` at `base` of the command region (a garbage capsule).
    pub fn write_capsule(&mut self, base: usize, bytes: &[u8]) {
        self.cmds.write_at(base, bytes);
    }

    /// Completions that arrived: responses (their receive is posted again if `repost`).
    pub fn poll(&mut self) -> Vec<Completion> {
        let mut wcs = [WorkCompletion::default(); 32];
        let mut out = Vec::new();
        loop {
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(_) => return out,
            };
            for wc in &wcs[..n] {
                if wc.opcode().is_recv() || wc.wr_id() < u64::from(self.depth) {
                    self.recvs_posted -= 1;
                    let slot = wc.wr_id() as usize;
                    self.slot_posted[slot] = false;
                    if !wc.is_success() {
                        continue;
                    }
                    let mut raw = [0u8; CQE_LEN];
                    self.rsps.read_at(slot * CQE_LEN, &mut raw);
                    out.push(Completion::read_from_bytes(&raw).expect("16 bytes"));
                    if self.repost && !self.disconnected {
                        self.post_recv(slot);
                    }
                } else if !wc.is_success() && wc.status() != WcStatus::WR_FLUSH_ERR {
                    self.send_errors.push(wc.status());
                }
                let _ = WcOpcode::SEND;
            }
            if n < wcs.len() {
                return out;
            }
        }
    }

    /// Sends `cmd` and turns the lab until its response arrives.
    pub fn run(&mut self, lab: &mut SimLab, cmd: Command, data: Data) -> Completion {
        let cid = cmd.cid.get();
        self.submit(cmd, data);
        self.wait(lab, cid)
    }

    pub fn wait(&mut self, lab: &mut SimLab, cid: u16) -> Completion {
        let mut got = None;
        lab.until(20_000, |lab| {
            let _ = lab;
            if got.is_none() {
                got = self.poll().into_iter().find(|c| c.cid.get() == cid);
            }
            got.is_some()
        });
        got.expect("checked")
    }

    /// Fabric Connect on this queue (keyed Connect data in the data buffer at offset 0).
    pub fn fabric_connect(&mut self, lab: &mut SimLab, qid: u16, cntlid: u16) -> Completion {
        let cmd = ConnectCommand::new(0x7000, qid, self.depth - 1, 30_000).to_command();
        let cd = ConnectData::new([0x11; 16], cntlid, SUBNQN, HOSTNQN);
        self.data.write_at(0, cd.as_bytes());
        self.run(
            lab,
            cmd,
            Data::Keyed {
                offset: 0,
                len: cd.as_bytes().len() as u32,
            },
        )
    }

    pub fn disconnect(&mut self) {
        self.disconnected = true;
        let _ = self.id.disconnect();
    }
}

/// The next CM event on `channel`, turning the lab while there is none.
pub fn next_event(
    lab: &mut SimLab,
    channel: &<SimVerbs as Verbs>::Channel,
) -> CmEvent<<SimVerbs as Verbs>::CmId> {
    let mut got = None;
    lab.until(20_000, |_| {
        if got.is_none() {
            got = channel.get_event().expect("get_event");
        }
        got.is_some()
    });
    got.expect("checked")
}

fn expect_event(lab: &mut SimLab, channel: &<SimVerbs as Verbs>::Channel, kind: CmEventKind) {
    let ev = next_event(lab, channel);
    assert_eq!(ev.kind, kind, "unexpected CM event {ev:?}");
}

/// Brings up an admin queue and enables the controller; returns the queue and CNTLID.
pub fn admin_queue(lab: &mut SimLab, verbs: &SimVerbs) -> (HostQueue, u16) {
    use nvmf_common::spec::fabrics::PropertySetCommand;
    use nvmf_common::spec::registers::{Cc, Property};
    let mut q = HostQueue::connect(lab, verbs, 0, 32).expect("admin queue accepted");
    let c = q.fabric_connect(lab, 0, CNTLID_DYNAMIC);
    assert!(c.status().is_success(), "Connect failed: {c:?}");
    let cntlid = c.dw0.get() as u16;
    let cc = Cc(0).with_iosqes(6).with_iocqes(4).with_en(true);
    let c = q.run(
        lab,
        PropertySetCommand::new(2, Property::CC.0, u64::from(cc.0), false).to_command(),
        Data::None,
    );
    assert!(c.status().is_success(), "CC.EN failed: {c:?}");
    (q, cntlid)
}

/// An I/O queue of `depth` connected to controller `cntlid`.
pub fn io_queue(
    lab: &mut SimLab,
    verbs: &SimVerbs,
    cntlid: u16,
    depth: u16,
    data_len: usize,
) -> HostQueue {
    io_queue_qid(lab, verbs, cntlid, 1, depth, data_len)
}

/// [`io_queue`] with queue id `qid`.
pub fn io_queue_qid(
    lab: &mut SimLab,
    verbs: &SimVerbs,
    cntlid: u16,
    qid: u16,
    depth: u16,
    data_len: usize,
) -> HostQueue {
    connected_io_queue(
        lab,
        verbs,
        cntlid,
        qid,
        depth,
        data_len,
        usize::from(depth),
        true,
    )
}

/// An I/O queue `qid` of controller `cntlid` with `recvs` receives posted (reposted after
/// each response if `repost`), Fabrics Connect done.
#[allow(clippy::too_many_arguments)]
fn connected_io_queue(
    lab: &mut SimLab,
    verbs: &SimVerbs,
    cntlid: u16,
    qid: u16,
    depth: u16,
    data_len: usize,
    recvs: usize,
    repost: bool,
) -> HostQueue {
    let mut q = HostQueue::connect_with(lab, verbs, qid, depth, data_len, recvs, |r| {
        r.as_bytes().to_vec()
    })
    .expect("I/O queue accepted");
    q.repost = repost;
    let c = q.fabric_connect(lab, qid, cntlid);
    assert!(c.status().is_success(), "I/O Connect failed: {c:?}");
    q
}

/// An I/O queue of a host that stops receiving once connected: one receive for its Connect
/// response, none after (its responses then wait in RNR, which it asked to retry for ever).
pub fn stalled_io_queue(
    lab: &mut SimLab,
    verbs: &SimVerbs,
    cntlid: u16,
    qid: u16,
    depth: u16,
    data_len: usize,
) -> HostQueue {
    connected_io_queue(lab, verbs, cntlid, qid, depth, data_len, 1, false)
}

/// Reactor 0's first RDMA device counter `key`, as `nvmf_get_stats` shows it.
pub fn device_stat(lab: &mut SimLab, key: &str) -> u64 {
    let stats = lab.pgs[0].transport_stats();
    stats[0]["devices"][0][key].as_u64().expect(key)
}

/// `len` bytes of the queue's data buffer at `offset`, by keyed SGL.
pub fn keyed(offset: usize, len: u32) -> Data {
    Data::Keyed { offset, len }
}

/// Reads back `len` bytes the test wrote with [`Data::Keyed`] through the data buffer.
pub fn data_bytes(q: &HostQueue, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    q.data.read_at(offset, &mut out);
    out
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn write_cmd(cid: u16, slba: u64, blocks: u32) -> Command {
    Command::write(cid, 1, slba, blocks)
}

pub fn read_cmd(cid: u16, slba: u64, blocks: u32) -> Command {
    Command::read(cid, 1, slba, blocks)
}

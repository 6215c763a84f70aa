//! The queue against a scripted target on the simulated fabric that answers as told: a
//! target repeating an old response must break the queue, never complete another command.

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr};

use nvmf_common::rdma::sim::{SimConfig, SimFabric, SimVerbs};
use nvmf_common::rdma::{
    AccessFlags, CmEventKind, ConnParams, DmaBuf, QpCaps, RecvWr, SendWr, VerbsChannel, VerbsCmId,
    VerbsCq, VerbsQp,
};
use nvmf_common::spec::Status;

use super::*;

type Channel = <SimVerbs as Verbs>::Channel;
type CmId = <SimVerbs as Verbs>::CmId;
type Qp = <SimVerbs as Verbs>::Qp;
type Cq = <SimVerbs as Verbs>::Cq;

const TARGET: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1));
const HOST: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 2, 1));
const PORT: u16 = 4420;
const DEPTH: u16 = 2;

/// One accepted queue of the scripted target.
struct Accepted {
    // Drop order: the QP before its CQ and the id.
    qp: Qp,
    cq: Arc<Cq>,
    _id: CmId,
    commands: DmaBuf<SimVerbs>,
    responses: DmaBuf<SimVerbs>,
}

/// A target that answers every command with success, dw0 = the command's CDW10, and can be
/// told to send, before its next answer, one of its earlier responses once more.
struct ScriptedTarget {
    channel: Channel,
    _listener: CmId,
    queue: Option<Accepted>,
    /// Every response sent, oldest first.
    sent_responses: Vec<Completion>,
    /// Before its next answer, the response this many answers back is sent again.
    replay_before_next: Option<usize>,
    /// After its next answer, a response for a CID never sent.
    stray_after_next: bool,
    /// CRQSIZE in the accept.
    crqsize: u16,
    sent: u64,
}

thread_local! {
    static TARGET_SIDE: RefCell<Option<ScriptedTarget>> = const { RefCell::new(None) };
}

impl ScriptedTarget {
    fn listen(verbs: &SimVerbs) -> Self {
        let channel = verbs.event_channel().unwrap();
        let listener = channel.create_id().unwrap();
        listener.bind_addr(SocketAddr::new(TARGET, PORT)).unwrap();
        listener.listen(8).unwrap();
        Self {
            channel,
            _listener: listener,
            queue: None,
            sent_responses: Vec::new(),
            replay_before_next: None,
            stray_after_next: false,
            crqsize: DEPTH,
            sent: 0,
        }
    }

    fn turn(&mut self) {
        while let Ok(Some(mut ev)) = self.channel.get_event() {
            if ev.kind == CmEventKind::ConnectRequest {
                let id = ev.new_id.take().expect("a connect request names its id");
                self.accept(id);
            }
        }
        let Some(q) = self.queue.as_mut() else {
            return;
        };
        let mut wcs = [WorkCompletion::default(); 8];
        let n = q.cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            if !wc.opcode().is_recv() {
                continue;
            }
            assert!(wc.is_success(), "{wc:?}");
            let slot = wc.wr_id() as usize;
            let mut raw = [0u8; SQE_LEN];
            q.commands.read_at(slot * SQE_LEN, &mut raw);
            let cmd = Command::read_from_bytes(&raw).unwrap();
            let mut rsp = Completion::new(cmd.cid.get(), Status::SUCCESS);
            rsp.dw0.set(cmd.cdw10.get());
            if let Some(back) = self.replay_before_next.take() {
                let old = self.sent_responses[self.sent_responses.len() - back];
                Self::send(q, &mut self.sent, old);
            }
            Self::send(q, &mut self.sent, rsp);
            self.sent_responses.push(rsp);
            if std::mem::take(&mut self.stray_after_next) {
                Self::send(q, &mut self.sent, Completion::new(0x0FFF, Status::SUCCESS));
            }
            let sge = [q.commands.sge(slot * SQE_LEN, SQE_LEN).unwrap()];
            q.qp.post_recv(&[RecvWr::new(slot as u64, &sge)]).unwrap();
        }
    }

    fn accept(&mut self, id: CmId) {
        let ctx = id.context().unwrap();
        let pd = SimVerbs::alloc_pd(&ctx).unwrap();
        let cq = SimVerbs::create_cq(&ctx, 64).unwrap();
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: u32::from(DEPTH),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = id.create_qp(&pd, &cq, &cq, None, caps).unwrap();
        let access = AccessFlags::LOCAL_WRITE;
        let commands = DmaBuf::new(&pd, usize::from(DEPTH) * SQE_LEN, access).unwrap();
        let responses = DmaBuf::new(&pd, 16 * CQE_LEN, access).unwrap();
        for slot in 0..usize::from(DEPTH) {
            let sge = [commands.sge(slot * SQE_LEN, SQE_LEN).unwrap()];
            qp.post_recv(&[RecvWr::new(slot as u64, &sge)]).unwrap();
        }
        let accept = RdmaCmAccept::new(self.crqsize);
        id.accept(&ConnParams::with_private_data(accept.as_bytes()))
            .unwrap();
        self.queue = Some(Accepted {
            qp,
            cq,
            _id: id,
            commands,
            responses,
        });
    }

    fn send(q: &mut Accepted, sent: &mut u64, rsp: Completion) {
        let at = (*sent % 16) as usize * CQE_LEN;
        *sent += 1;
        q.responses.write_at(at, rsp.as_bytes());
        let sge = [q.responses.sge(at, CQE_LEN).unwrap()];
        q.qp.post_send(&[SendWr::send(*sent, &sge).signaled(false)])
            .unwrap();
    }
}

fn target_turn() {
    TARGET_SIDE.with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            if let Some(t) = t.as_mut() {
                t.turn();
            }
        }
    });
}

/// A fabric with the scripted target listening, and the host's I/O queue 1 connected to it.
fn connect() -> (SimFabric, RdmaQueue<SimVerbs>) {
    let (fabric, q) = try_connect(1, |_| {});
    (fabric, q.unwrap())
}

/// Connects queue `qid` to a scripted target set up by `script`.
fn try_connect(
    qid: u16,
    script: impl FnOnce(&mut ScriptedTarget),
) -> (SimFabric, Result<RdmaQueue<SimVerbs>>) {
    let fabric = SimFabric::new(SimConfig {
        seed: 1,
        ..SimConfig::default()
    });
    let target = fabric.add_host(TARGET);
    let host = fabric.add_host(HOST);
    let mut scripted = ScriptedTarget::listen(&target);
    script(&mut scripted);
    TARGET_SIDE.with(|t| *t.borrow_mut() = Some(scripted));
    fabric.set_idle_hook(Some(Arc::new(target_turn)));
    let peer = SocketAddr::new(TARGET, PORT);
    let q = RdmaQueue::connect(&host, peer, None, qid, DEPTH, false, Duration::from_secs(1));
    (fabric, q.map(|(q, _pd)| q))
}

/// Submits a command whose CDW10 is `marker` and polls until the queue answers or fails.
fn run(
    fabric: &SimFabric,
    q: &mut RdmaQueue<SimVerbs>,
    marker: u32,
) -> std::result::Result<(u16, Completion), QueueFault> {
    // A Flush (opcode 0) carrying a marker the target echoes.
    let mut cmd = Command::default();
    cmd.cdw10.set(marker);
    let slot = q.submit(&mut cmd, Data::None)?.expect("a free slot");
    let mut out = [(0, Completion::default()); POLL_BATCH];
    for _ in 0..10_000 {
        target_turn();
        let n = q.poll(&mut out, POLL_BATCH)?;
        if n > 0 {
            assert_eq!(n, 1);
            assert_eq!(
                out[0].0, slot,
                "completed another slot than the one in flight"
            );
            return Ok(out[0]);
        }
        fabric.step();
    }
    panic!("no answer to command {marker}");
}

#[test]
fn a_replayed_response_breaks_the_queue_and_completes_no_command() {
    let (fabric, mut q) = connect();
    // Two commands, one at a time: each slot of the 2-deep queue used once.
    for marker in [0xA, 0xB] {
        let (_, cqe) = run(&fabric, &mut q, marker).unwrap();
        assert_eq!(cqe.dw0.get(), marker);
    }
    // The third command reuses the first one's slot (slot 0, generation 2). The target
    // first sends the first command's response again (slot 0, generation 1): the slot is
    // busy, only its generation tells the two apart. Then (had the queue survived) the
    // third's own.
    TARGET_SIDE.with(|t| t.borrow_mut().as_mut().unwrap().replay_before_next = Some(2));
    match run(&fabric, &mut q, 0xC) {
        Err(QueueFault::Protocol(why)) => assert!(why.contains("not outstanding"), "{why}"),
        Ok((slot, cqe)) => panic!(
            "slot {slot} completed with the response of command {:#x}",
            cqe.dw0.get()
        ),
        Err(other) => panic!("{other:?}"),
    }
    drop(q);
    TARGET_SIDE.with(|t| t.borrow_mut().take());
}

#[test]
fn slots_are_reused_oldest_first_with_a_new_generation_in_the_cid() {
    let (fabric, mut q) = connect();
    let mut cids = Vec::new();
    for marker in 0..4u32 {
        let (_, cqe) = run(&fabric, &mut q, marker).unwrap();
        cids.push(cqe.cid.get());
    }
    // Slots 0, 1, 0, 1; generations 1, 1, 2, 2.
    assert_eq!(cids, [0x1000, 0x1001, 0x2000, 0x2001]);
    drop(q);
    TARGET_SIDE.with(|t| t.borrow_mut().take());
}

/// A response for a CID never sent, in the same batch as a real one: the real one is handed
/// back as done (its write landed; failing and resending it would run it twice), the fault
/// comes at the next poll.
#[test]
fn a_stray_response_after_a_good_one_fails_the_queue_after_handing_the_good_one_back() {
    let (fabric, mut q) = connect();
    TARGET_SIDE.with(|t| t.borrow_mut().as_mut().unwrap().stray_after_next = true);
    let mut cmd = Command::default();
    cmd.cdw10.set(0x5);
    let slot = q
        .submit(&mut cmd, Data::None)
        .unwrap()
        .expect("a free slot");
    // Both responses (and the send's completion) arrive before the host looks.
    for _ in 0..1000 {
        target_turn();
        fabric.step();
    }
    let mut out = [(0, Completion::default()); POLL_BATCH];
    let n = q
        .poll(&mut out, POLL_BATCH)
        .expect("the good response first");
    assert_eq!(n, 1);
    assert_eq!((out[0].0, out[0].1.dw0.get()), (slot, 0x5));
    match q.poll(&mut out, POLL_BATCH) {
        Err(QueueFault::Protocol(why)) => assert!(why.contains("not outstanding"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        q.submit(&mut Command::default(), Data::None).is_err(),
        "nothing more goes out on a broken queue"
    );
    drop(q);
    TARGET_SIDE.with(|t| t.borrow_mut().take());
}

/// A target whose receive queue holds a single command: the admin queue could not carry an
/// AER and anything else; the connection is refused with the reason.
#[test]
fn a_receive_queue_too_small_to_work_with_is_refused() {
    for (qid, crqsize) in [(0, 3), (1, 1)] {
        let (_fabric, q) = try_connect(qid, |t| t.crqsize = crqsize);
        let e = q.err().expect("refused");
        assert!(e.to_string().contains("fewer than"), "{e}");
        TARGET_SIDE.with(|t| t.borrow_mut().take());
    }
    let (_fabric, q) = try_connect(1, |t| t.crqsize = 2);
    drop(q.expect("two entries are enough for an I/O queue"));
    TARGET_SIDE.with(|t| t.borrow_mut().take());
}

//! Behaviour of the simulated fabric, through the `Verbs` traits only (as product code
//! sees it).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::slice::from_ref;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::rdma::cm::{CmEvent, CmEventKind, ConnParams};
use crate::rdma::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::rdma::error::RdmaError;
use crate::rdma::mr::{register_pool, AccessFlags, DmaBuf};
use crate::rdma::qp::QpCaps;
use crate::rdma::verbs::{
    Verbs, VerbsChannel, VerbsCmId, VerbsContext, VerbsCq, VerbsMr, VerbsPd, VerbsQp, VerbsSrq,
};
use crate::rdma::wr::{RecvWr, SendWr, Sge};

mod mw;

const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const PORT: u16 = 4420;
const T: Duration = Duration::from_secs(5);
/// Receive slots: the first half of each side's buffer, `RECV_SLOT` bytes each.
const RECV_SLOT: usize = 256;
/// Where each side stages what it sends (second half of its buffer).
const SEND_AREA: usize = 2048;
const BUF_LEN: usize = 4096;

fn server_addr() -> SocketAddr {
    SocketAddr::new(SERVER, PORT)
}

fn caps(n: u32) -> QpCaps {
    QpCaps {
        max_send_wr: n,
        max_recv_wr: n,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// One side of a connection. Field order is drop order: the QP goes before its CQ and PD.
struct End {
    qp: SimQp,
    id: SimCmId,
    buf: DmaBuf<SimVerbs>,
    srq: Option<Arc<SimSrq>>,
    cq: Arc<SimCq>,
    pd: Arc<SimPd>,
    ctx: Arc<SimContext>,
    ch: SimChannel,
}

struct Pair {
    client: End,
    server: End,
    _listener: SimCmId,
    fabric: SimFabric,
    /// The client host, for more connections.
    vc: SimVerbs,
}

struct Opts {
    cfg: SimConfig,
    client_rnr: u8,
    client_cq: u32,
    client_caps: QpCaps,
    client_recvs: usize,
    server_recvs: usize,
    /// Hosts whose devices have type 2 memory windows ([`windows_device_attr`]).
    windows: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            cfg: SimConfig::default(),
            client_rnr: 7,
            client_cq: 64,
            client_caps: caps(16),
            client_recvs: 4,
            server_recvs: 4,
            windows: false,
        }
    }
}

/// The next event on `ch`, stepping the fabric until one comes.
fn next_event(f: &SimFabric, ch: &SimChannel) -> CmEvent<SimCmId> {
    for _ in 0..100_000 {
        if let Some(ev) = ch.get_event().unwrap() {
            return ev;
        }
        assert!(f.step(), "no CM event and nothing scheduled");
    }
    panic!("no CM event");
}

fn poll(cq: &SimCq) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::default(); 8];
    let mut all = Vec::new();
    loop {
        let n = cq.poll(&mut out).unwrap();
        all.extend_from_slice(&out[..n]);
        if n < out.len() {
            return all;
        }
    }
}

/// Steps until `cq` yielded `n` completions (or nothing is left to run).
fn wait_cqes(f: &SimFabric, cq: &SimCq, n: usize) -> Vec<WorkCompletion> {
    let mut all = Vec::new();
    for _ in 0..100_000 {
        all.extend(poll(cq));
        if all.len() >= n || !f.step() {
            all.extend(poll(cq));
            return all;
        }
    }
    all
}

fn recv_sge(buf: &DmaBuf<SimVerbs>, slot: usize) -> Sge {
    buf.sge(slot * RECV_SLOT, RECV_SLOT).unwrap()
}

fn listen(vs: &SimVerbs) -> (SimChannel, SimCmId) {
    let ch = vs.event_channel().unwrap();
    let id = ch.create_id().unwrap();
    id.bind_addr(server_addr()).unwrap();
    id.listen(16).unwrap();
    (ch, id)
}

/// Resolves, creates the QP (own RQ), posts receives and connects.
fn client_connect(vc: &SimVerbs, o: &Opts, private: &[u8]) -> End {
    client_connect_on(vc, o, private, None)
}

/// [`client_connect`] with the QP on `pd` (else on a new PD).
fn client_connect_on(vc: &SimVerbs, o: &Opts, private: &[u8], pd: Option<&Arc<SimPd>>) -> End {
    let ch = vc.event_channel().unwrap();
    let id = ch.create_id().unwrap();
    id.resolve_addr(None, server_addr(), T).unwrap();
    ch.wait_event(CmEventKind::AddrResolved, T).unwrap();
    id.resolve_route(T).unwrap();
    ch.wait_event(CmEventKind::RouteResolved, T).unwrap();
    let ctx = id.context().unwrap();
    let pd = match pd {
        Some(pd) => pd.clone(),
        None => SimVerbs::alloc_pd(&ctx).unwrap(),
    };
    let cq = SimVerbs::create_cq(&ctx, o.client_cq).unwrap();
    let qp = id.create_qp(&pd, &cq, &cq, None, o.client_caps).unwrap();
    let buf = DmaBuf::<SimVerbs>::new(&pd, BUF_LEN, AccessFlags::ALL_DATA).unwrap();
    let sges: Vec<Sge> = (0..o.client_recvs).map(|i| recv_sge(&buf, i)).collect();
    let wrs: Vec<RecvWr> = (0..o.client_recvs)
        .map(|i| RecvWr::new(100 + i as u64, from_ref(&sges[i])))
        .collect();
    qp.post_recv(&wrs).unwrap();
    let params = ConnParams {
        private_data: private,
        rnr_retry_count: o.client_rnr,
        initiator_depth: 4,
        responder_resources: 8,
        ..ConnParams::default()
    };
    id.connect(&params).unwrap();
    End {
        qp,
        id,
        buf,
        srq: None,
        cq,
        pd,
        ctx,
        ch,
    }
}

/// Takes the connect request, builds the QP on an SRQ, posts receives and accepts.
fn server_accept(fabric: &SimFabric, lch: &SimChannel, o: &Opts, private: &[u8]) -> End {
    let ev = next_event(fabric, lch);
    assert_eq!(ev.kind, CmEventKind::ConnectRequest);
    let id = ev.new_id.expect("a connect request carries the new id");
    let ctx = id.context().unwrap();
    let pd = SimVerbs::alloc_pd(&ctx).unwrap();
    let cq = SimVerbs::create_cq(&ctx, 64).unwrap();
    let srq = SimVerbs::create_srq(&pd, 16, 2).unwrap();
    let qp = id.create_qp(&pd, &cq, &cq, Some(&srq), caps(16)).unwrap();
    let buf = DmaBuf::<SimVerbs>::new(&pd, BUF_LEN, AccessFlags::ALL_DATA).unwrap();
    let sges: Vec<Sge> = (0..o.server_recvs).map(|i| recv_sge(&buf, i)).collect();
    let wrs: Vec<RecvWr> = (0..o.server_recvs)
        .map(|i| RecvWr::new(200 + i as u64, from_ref(&sges[i])))
        .collect();
    srq.post_recv(&wrs).unwrap();
    id.accept(&ConnParams {
        private_data: private,
        ..ConnParams::default()
    })
    .unwrap();
    End {
        qp,
        id,
        buf,
        srq: Some(srq),
        cq,
        pd,
        ctx,
        ch: lch.clone(),
    }
}

fn connect_pair(o: Opts) -> Pair {
    let fabric = SimFabric::new(o.cfg.clone());
    let attr = if o.windows {
        windows_device_attr()
    } else {
        default_device_attr()
    };
    let vc = fabric.add_host_with(CLIENT, attr.clone(), "sim0");
    let vs = fabric.add_host_with(SERVER, attr, "sim1");
    let (lch, listener) = listen(&vs);
    let client = client_connect(&vc, &o, b"hello");
    let server = server_accept(&fabric, &lch, &o, b"welcome");
    client.ch.wait_event(CmEventKind::Established, T).unwrap();
    let ev = next_event(&fabric, &server.ch);
    assert_eq!(ev.kind, CmEventKind::Established);
    assert_eq!(ev.id, server.id.token());
    Pair {
        client,
        server,
        _listener: listener,
        fabric,
        vc,
    }
}

/// Stages `data` in `end`'s send area and returns its SGE.
fn stage(end: &mut End, data: &[u8]) -> Sge {
    end.buf.write_at(SEND_AREA, data);
    end.buf.sge(SEND_AREA, data.len()).unwrap()
}

fn read(end: &End, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    end.buf.read_at(off, &mut v);
    v
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id(), w.status())).collect()
}

#[test]
fn cm_connect_and_sends_both_ways() {
    let o = Opts::default();
    let fabric = SimFabric::new(o.cfg.clone());
    let vc = fabric.add_host(CLIENT);
    let vs = fabric.add_host(SERVER);
    assert_eq!(vs.ip(), SERVER);
    let (lch, listener) = listen(&vs);
    let mut client = client_connect(&vc, &o, b"hello");

    let ev = next_event(&fabric, &lch);
    assert_eq!(ev.kind, CmEventKind::ConnectRequest);
    assert_eq!(ev.listen_id, Some(listener.token()));
    assert_eq!(ev.private_data.len(), 56);
    assert_eq!(&ev.private_data[..5], b"hello");
    assert!(ev.private_data[5..].iter().all(|&b| b == 0));
    assert_eq!(ev.conn.qp_num, client.qp.qp_num());
    // Swapped to the passive side's view.
    assert_eq!(ev.conn.responder_resources, 4);
    assert_eq!(ev.conn.initiator_depth, 8);
    assert_eq!(ev.conn.rnr_retry_count, 7);
    let new_id = ev.new_id.unwrap();
    assert_eq!(ev.id, new_id.token());
    assert_ne!(new_id.token(), listener.token());
    assert_eq!(new_id.peer_addr().unwrap().ip(), CLIENT);
    assert_eq!(client.id.peer_addr(), Some(server_addr()));
    // Put the request back through the helper's path by accepting it by hand.
    let ctx = new_id.context().unwrap();
    assert!(ctx.same_device(&vs.context()));
    assert!(!ctx.same_device(&client.ctx));
    let pd = SimVerbs::alloc_pd(&ctx).unwrap();
    let cq = SimVerbs::create_cq(&ctx, 64).unwrap();
    let srq = SimVerbs::create_srq(&pd, 16, 2).unwrap();
    let qp = new_id
        .create_qp(&pd, &cq, &cq, Some(&srq), caps(16))
        .unwrap();
    let mut sbuf = DmaBuf::<SimVerbs>::new(&pd, BUF_LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let rs = [sbuf.sge(0, 256).unwrap()];
    srq.post_recv(&[RecvWr::new(200, &rs)]).unwrap();
    new_id
        .accept(&ConnParams::with_private_data(b"welcome"))
        .unwrap();

    let est = client.ch.wait_event(CmEventKind::Established, T).unwrap();
    assert_eq!(est.private_data.len(), 196);
    assert_eq!(&est.private_data[..7], b"welcome");
    assert_eq!(est.conn.qp_num, qp.qp_num());
    let ev = next_event(&fabric, &lch);
    assert_eq!(ev.kind, CmEventKind::Established);
    assert_eq!(ev.id, new_id.token());

    // Client -> server, into the SRQ.
    let sge = stage(&mut client, b"ping!");
    client
        .qp
        .post_send(&[SendWr::send(1, from_ref(&sge))])
        .unwrap();
    let wcs = wait_cqes(&fabric, &cq, 1);
    assert_eq!(wcs.len(), 1);
    let wc = wcs[0];
    assert!(wc.is_success());
    assert_eq!(wc.opcode(), WcOpcode::RECV);
    assert_eq!(wc.wr_id(), 200);
    assert_eq!(wc.byte_len(), 5);
    assert_eq!(
        wc.qp_num(),
        qp.qp_num(),
        "SRQ receives name the QP they arrived on"
    );
    let mut got = [0u8; 5];
    sbuf.read_at(0, &mut got);
    assert_eq!(&got, b"ping!");
    let wcs = wait_cqes(&fabric, &client.cq, 1);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::SUCCESS)]);
    assert_eq!(wcs[0].opcode(), WcOpcode::SEND);
    assert_eq!(wcs[0].qp_num(), client.qp.qp_num());

    // Server -> client, inline, into the client's own RQ.
    sbuf.fill(0);
    qp.post_send(&[SendWr::send_inline(7, b"pong")]).unwrap();
    let wcs = wait_cqes(&fabric, &client.cq, 1);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].wr_id(), 100);
    assert_eq!(wcs[0].byte_len(), 4);
    assert_eq!(wcs[0].qp_num(), client.qp.qp_num());
    assert_eq!(read(&client, 0, 4), b"pong");
    assert_eq!(
        statuses(&wait_cqes(&fabric, &cq, 1)),
        vec![(7, WcStatus::SUCCESS)]
    );

    let stats = fabric.stats();
    assert_eq!(stats.post_send_calls, 2);
    assert_eq!(stats.send_wrs, 2);
    assert!(stats.cq_polls > 0);
    assert_eq!(fabric.host_rx(SERVER).unwrap().send_bytes, 5);
    assert_eq!(fabric.host_rx(CLIENT).unwrap().send_bytes, 4);
}

#[test]
fn connect_pair_helper_and_contexts() {
    let p = connect_pair(Opts::default());
    let attr = p.client.ctx.query_device().unwrap();
    assert_eq!(attr.max_qp_wr, 16_384);
    assert_eq!(attr.max_cqe, 65_536);
    assert!(!p.client.ctx.is_soft_roce());
    assert_eq!(p.client.ctx.device_name(), "sim0");
    assert_eq!(p.server.ctx.device_name(), "sim1");
    assert!(Arc::ptr_eq(p.server.pd.context(), &p.server.ctx));
    assert_eq!(p.client.qp.caps(), caps(16));
    assert_eq!(p.client.cq.capacity(), 64);
}

#[test]
fn rdma_write_and_read_move_bytes() {
    let mut p = connect_pair(Opts::default());
    // The client exposes a region; the server writes into it and reads from it.
    let target = DmaBuf::<SimVerbs>::new(&p.client.pd, 1024, AccessFlags::ALL_DATA).unwrap();
    let mut source = DmaBuf::<SimVerbs>::new(&p.client.pd, 1024, AccessFlags::ALL_DATA).unwrap();
    let pattern: Vec<u8> = (0..300u32).map(|i| (i * 7 % 251) as u8).collect();
    source.write_at(100, &pattern);

    let data: Vec<u8> = (0..200u32).map(|i| (255 - i % 256) as u8).collect();
    let sge = stage(&mut p.server, &data);
    let wr = SendWr::rdma_write(
        1,
        from_ref(&sge),
        target.mr().remote_addr(50),
        target.mr().rkey(),
    );
    // Read into the server's buffer at 0 (two SGEs: 100 + 200 bytes).
    let rd = [
        p.server.buf.sge(0, 100).unwrap(),
        p.server.buf.sge(1000, 200).unwrap(),
    ];
    let rr = SendWr::rdma_read(2, &rd, source.mr().remote_addr(100), source.mr().rkey());
    p.server.qp.post_send(&[wr, rr]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 2);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]
    );
    assert_eq!(wcs[0].opcode(), WcOpcode::RDMA_WRITE);
    assert_eq!(wcs[1].opcode(), WcOpcode::RDMA_READ);
    assert_eq!(wcs[1].byte_len(), 300);

    let mut got = vec![0u8; 200];
    target.read_at(50, &mut got);
    assert_eq!(got, data);
    let mut before = [1u8; 50];
    target.read_at(0, &mut before);
    assert_eq!(
        before, [0u8; 50],
        "nothing outside the written range changed"
    );
    assert_eq!(read(&p.server, 0, 100), pattern[..100]);
    assert_eq!(read(&p.server, 1000, 200), pattern[100..]);
    // The passive side of a WRITE sees no completion.
    assert!(poll(&p.client.cq).is_empty());
    let rx = p.fabric.host_rx(CLIENT).unwrap();
    assert_eq!((rx.writes, rx.write_bytes, rx.read_bytes), (1, 200, 300));
}

#[test]
fn register_pool_buffers_carry_sim_keys() {
    let p = connect_pair(Opts::default());
    let pool = crate::buffer::BufferPool::new(4096, 4).unwrap();
    register_pool::<SimVerbs>(&p.server.pd, &pool, AccessFlags::LOCAL_WRITE).unwrap();
    let buf = pool.get().unwrap();
    assert_ne!(buf.lkey(), 0);
    assert_eq!(buf.rkey(), 0, "a local-only registration has no rkey");
    // The server reads client memory into a pool buffer.
    let mut src = DmaBuf::<SimVerbs>::new(&p.client.pd, 64, AccessFlags::ALL_DATA).unwrap();
    src.write_at(0, b"from the pool's point of view");
    let sge = [Sge {
        addr: buf.addr(),
        length: 29,
        lkey: buf.lkey(),
    }];
    let wr = SendWr::rdma_read(9, &sge, src.mr().remote_addr(0), src.mr().rkey());
    p.server.qp.post_send(&[wr]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(statuses(&wcs), vec![(9, WcStatus::SUCCESS)]);
    assert_eq!(&buf.as_slice()[..29], b"from the pool's point of view");
}

#[test]
fn rkey_outside_the_region_is_a_remote_access_error() {
    let mut p = connect_pair(Opts::default());
    let target = DmaBuf::<SimVerbs>::new(&p.client.pd, 1024, AccessFlags::ALL_DATA).unwrap();
    let sge = stage(&mut p.server, &[0xab; 64]);
    // 64 bytes at offset 1000 of a 1024-byte region: 40 bytes past its end.
    let bad = SendWr::rdma_write(
        1,
        from_ref(&sge),
        target.mr().remote_addr(1000),
        target.mr().rkey(),
    );
    let next = SendWr::send(2, from_ref(&sge)).signaled(false);
    p.server.qp.post_send(&[bad, next]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 2);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::REM_ACCESS_ERR), (2, WcStatus::WR_FLUSH_ERR)],
        "the error, then the unsignaled WQE behind it flushed"
    );
    assert!(p.server.qp.is_error());
    assert!(p.client.qp.is_error());
    let mut tail = [0u8; 24];
    target.read_at(1000, &mut tail);
    assert_eq!(tail, [0u8; 24], "nothing was written");

    // The responder went to Error with an access error and flushed its own RQ.
    let ev = p.client.ctx.take_async_event().unwrap();
    assert_eq!(ev.kind, SimAsyncEventKind::QpAccessErr);
    assert_eq!(ev.qp_num, Some(p.client.qp.qp_num()));
    let flushed = poll(&p.client.cq);
    assert_eq!(flushed.len(), 4);
    assert!(flushed.iter().all(|w| w.status() == WcStatus::WR_FLUSH_ERR));
    assert_eq!(
        flushed.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        vec![100, 101, 102, 103]
    );

    // Posting to a QP in Error succeeds and flushes at the next step.
    p.server
        .qp
        .post_send(&[SendWr::send_inline(3, b"late")])
        .unwrap();
    assert!(poll(&p.server.cq).is_empty());
    assert!(p.fabric.step());
    assert_eq!(
        statuses(&poll(&p.server.cq)),
        vec![(3, WcStatus::WR_FLUSH_ERR)]
    );
}

#[test]
fn rkey_without_remote_write_is_refused() {
    let mut p = connect_pair(Opts::default());
    let read_only = DmaBuf::<SimVerbs>::new(
        &p.client.pd,
        256,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    )
    .unwrap();
    let sge = stage(&mut p.server, &[1; 16]);
    let wr = SendWr::rdma_write(
        1,
        from_ref(&sge),
        read_only.mr().remote_addr(0),
        read_only.mr().rkey(),
    );
    p.server.qp.post_send(&[wr]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::REM_ACCESS_ERR)]);
}

#[test]
fn local_key_errors_are_local_protection_errors() {
    let mut p = connect_pair(Opts::default());
    let mut sge = stage(&mut p.client, b"abc");
    sge.lkey ^= 0x100;
    p.client
        .qp
        .post_send(&[SendWr::send(5, from_ref(&sge))])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 5);
    assert_eq!(wcs[0].wr_id(), 5);
    assert_eq!(wcs[0].status(), WcStatus::LOC_PROT_ERR);
    assert!(p.client.qp.is_error());
    assert!(wcs[1..]
        .iter()
        .all(|w| w.status() == WcStatus::WR_FLUSH_ERR));
}

#[test]
fn rnr_with_infinite_retry_waits_for_a_receive() {
    let o = Opts {
        server_recvs: 0,
        ..Opts::default()
    };
    let mut p = connect_pair(o);
    let sge = stage(&mut p.client, b"patience");
    p.client
        .qp
        .post_send(&[SendWr::send(1, from_ref(&sge))])
        .unwrap();
    // A second of virtual time: ten thousand RNR timers.
    p.fabric.advance(Duration::from_secs(1));
    assert!(poll(&p.client.cq).is_empty());
    assert!(!p.client.qp.is_error());
    assert!(p.fabric.stats().rnr_naks > 1000);

    let srq = p.server.srq.as_ref().unwrap();
    let rs = [recv_sge(&p.server.buf, 0)];
    srq.post_recv(&[RecvWr::new(77, &rs)]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(statuses(&wcs), vec![(77, WcStatus::SUCCESS)]);
    assert_eq!(read(&p.server, 0, 8), b"patience");
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 1);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::SUCCESS)]);
}

#[test]
fn rnr_retries_run_out() {
    let o = Opts {
        server_recvs: 0,
        client_rnr: 2,
        ..Opts::default()
    };
    let mut p = connect_pair(o);
    let sge = stage(&mut p.client, b"nobody home");
    let later = SendWr::send(2, from_ref(&sge));
    p.client
        .qp
        .post_send(&[SendWr::send(1, from_ref(&sge)), later])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 6);
    assert_eq!(wcs[0].wr_id(), 1);
    assert_eq!(wcs[0].status(), WcStatus::RNR_RETRY_EXC_ERR);
    assert_eq!(wcs[1].wr_id(), 2);
    assert_eq!(wcs[1].status(), WcStatus::WR_FLUSH_ERR);
    assert!(p.client.qp.is_error());
    // The first try plus two retries.
    assert_eq!(p.fabric.stats().rnr_naks, 3);
    // The client's own receives were flushed after the send queue.
    assert_eq!(
        wcs[2..].iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        vec![100, 101, 102, 103]
    );
}

#[test]
fn send_longer_than_the_receive_is_a_length_error() {
    let mut p = connect_pair(Opts::default());
    let sge = stage(&mut p.client, &[9; RECV_SLOT + 1]);
    p.client
        .qp
        .post_send(&[SendWr::send(1, from_ref(&sge))])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 1);
    assert_eq!(wcs[0].status(), WcStatus::REM_INV_REQ_ERR);
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(statuses(&wcs), vec![(200, WcStatus::LOC_LEN_ERR)]);
    assert!(p.server.qp.is_error());
    // SRQ WQEs stay in the SRQ; the QP raised LAST_WQE_REACHED.
    assert_eq!(p.server.srq.as_ref().unwrap().posted(), 3);
    assert_eq!(
        p.server.ctx.take_async_event().map(|e| e.kind),
        Some(SimAsyncEventKind::QpLastWqeReached)
    );
}

#[test]
fn send_queue_overflow_fails_at_the_index() {
    let o = Opts {
        client_caps: caps(4),
        server_recvs: 16,
        ..Opts::default()
    };
    let mut p = connect_pair(o);
    let sge = stage(&mut p.client, b"x");
    let wrs: Vec<SendWr> = (0..6).map(|i| SendWr::send(i, from_ref(&sge))).collect();
    match p.client.qp.post_send(&wrs) {
        Err(RdmaError::PostSend { source, index }) => {
            assert_eq!(index, 4);
            assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
        }
        other => panic!("expected an overflow, got {other:?}"),
    }
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 4);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        vec![0, 1, 2, 3],
        "the four before the failing index were posted"
    );

    // Unsignaled successes keep their slots until a signaled completion.
    let unsig: Vec<SendWr> = (10..13)
        .map(|i| SendWr::send(i, from_ref(&sge)).signaled(false))
        .collect();
    p.client.qp.post_send(&unsig).unwrap();
    p.fabric.run_until_idle(1000);
    assert!(poll(&p.client.cq).is_empty());
    assert_eq!(p.client.qp.send_queue_used(), 3);
    let two = [
        SendWr::send(20, from_ref(&sge)),
        SendWr::send(21, from_ref(&sge)),
    ];
    match p.client.qp.post_send(&two) {
        Err(RdmaError::PostSend { index: 1, .. }) => {}
        other => panic!("expected an overflow at 1, got {other:?}"),
    }
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 1);
    assert_eq!(statuses(&wcs), vec![(20, WcStatus::SUCCESS)]);
    assert_eq!(p.client.qp.send_queue_used(), 0);
    // Receive queues overflow the same way.
    let rs = [recv_sge(&p.client.buf, 4)];
    let recvs: Vec<RecvWr> = (0..2).map(|i| RecvWr::new(300 + i, &rs)).collect();
    match p.client.qp.post_recv(&recvs) {
        Err(RdmaError::PostRecv { index: 0, source }) => {
            assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
        }
        other => panic!("expected an RQ overflow, got {other:?}"),
    }
}

#[test]
fn srq_overflow_fails_at_the_index() {
    let p = connect_pair(Opts::default());
    let srq = p.server.srq.as_ref().unwrap();
    let rs = [recv_sge(&p.server.buf, 0)];
    let recvs: Vec<RecvWr> = (0..16).map(|i| RecvWr::new(i, &rs)).collect();
    match srq.post_recv(&recvs) {
        Err(RdmaError::PostSrqRecv { index, .. }) => assert_eq!(index, 12),
        other => panic!("expected an SRQ overflow, got {other:?}"),
    }
    assert_eq!(srq.posted(), 16);
}

#[test]
fn cq_overrun_errors_the_cq_and_its_qps() {
    let o = Opts {
        client_cq: 4,
        client_recvs: 8,
        ..Opts::default()
    };
    let p = connect_pair(o);
    for i in 0..6 {
        p.server
            .qp
            .post_send(&[SendWr::send_inline(i, b"flood")])
            .unwrap();
    }
    p.fabric.run_until_idle(10_000);
    let mut out = [WorkCompletion::default(); 3];
    assert_eq!(p.client.cq.poll(&mut out).unwrap(), 3);
    assert_eq!(p.client.cq.poll(&mut out).unwrap(), 1);
    match p.client.cq.poll(&mut out) {
        Err(RdmaError::PollCq(e)) => assert_eq!(e.raw_os_error(), Some(libc::EIO)),
        other => panic!("expected a poll failure, got {other:?}"),
    }
    assert!(p.client.qp.is_error());
    let ev = p.client.ctx.take_async_event().unwrap();
    assert_eq!(ev.kind, SimAsyncEventKind::CqErr);
    assert_eq!(ev.cq_id, Some(p.client.cq.id()));
    let ev = p.client.ctx.take_async_event().unwrap();
    assert_eq!(ev.kind, SimAsyncEventKind::QpFatal);
    assert_eq!(ev.qp_num, Some(p.client.qp.qp_num()));
    assert!(p.fabric.stats().cqes_lost > 0);
}

/// `first` disconnects, the other side answers on its Disconnected event.
fn disconnect_from(client_first: bool) {
    let mut p = connect_pair(Opts::default());
    // Something outstanding on the side that starts: a held WRITE and a SEND behind it.
    let target = DmaBuf::<SimVerbs>::new(&p.client.pd, 64, AccessFlags::ALL_DATA).unwrap();
    let (first, second) = if client_first {
        (&mut p.client, &mut p.server)
    } else {
        (&mut p.server, &mut p.client)
    };
    let sge = stage(first, b"in flight");
    p.fabric.faults().hold_writes(first.qp.qp_num());
    let wr = SendWr::rdma_write(
        1,
        from_ref(&sge),
        target.mr().remote_addr(0),
        target.mr().rkey(),
    );
    first
        .qp
        .post_send(&[wr, SendWr::send(2, from_ref(&sge)).signaled(false)])
        .unwrap();
    p.fabric.run_until_idle(100);

    first.id.disconnect().unwrap();
    assert!(first.qp.is_error(), "the local QP goes to Error at once");
    let flushed = poll(&first.cq);
    assert_eq!(
        statuses(&flushed[..2]),
        vec![(1, WcStatus::WR_FLUSH_ERR), (2, WcStatus::WR_FLUSH_ERR)]
    );

    let ev = next_event(&p.fabric, &second.ch);
    assert_eq!(ev.kind, CmEventKind::Disconnected);
    assert_eq!(ev.id, second.id.token());
    assert!(second.qp.is_error());
    second.id.disconnect().unwrap();
    let ev = next_event(&p.fabric, &first.ch);
    assert_eq!(ev.kind, CmEventKind::Disconnected);
    assert_eq!(ev.id, first.id.token());
    let ev = next_event(&p.fabric, &first.ch);
    assert_eq!(ev.kind, CmEventKind::TimewaitExit);
    let ev = next_event(&p.fabric, &second.ch);
    assert_eq!(ev.kind, CmEventKind::TimewaitExit);

    // A drain marker posted after the disconnect completes with a flush.
    for end in [&*first, &*second] {
        poll(&end.cq);
        end.qp.post_send(&[SendWr::send(99, &[])]).unwrap();
        p.fabric.step();
        assert_eq!(statuses(&poll(&end.cq)), vec![(99, WcStatus::WR_FLUSH_ERR)]);
    }
    let mut zero = [1u8; 9];
    target.read_at(0, &mut zero);
    assert_eq!(zero, [0u8; 9], "the held WRITE never ran");
}

#[test]
fn disconnect_from_the_active_side() {
    disconnect_from(true);
}

#[test]
fn disconnect_from_the_passive_side() {
    disconnect_from(false);
}

#[test]
fn dropping_a_connected_id_disconnects() {
    let p = connect_pair(Opts::default());
    let Pair {
        client,
        server,
        fabric,
        _listener,
        ..
    } = p;
    let End { qp, id, .. } = client;
    drop(qp);
    drop(id);
    let ev = next_event(&fabric, &server.ch);
    assert_eq!(ev.kind, CmEventKind::Disconnected);
    assert!(server.qp.is_error());
}

#[test]
fn connect_to_a_port_nobody_listens_on_is_rejected() {
    let fabric = SimFabric::new(SimConfig::default());
    let vc = fabric.add_host(CLIENT);
    let _vs = fabric.add_host(SERVER);
    let c = client_connect(&vc, &Opts::default(), b"anyone?");
    match c.ch.wait_event(CmEventKind::Established, T) {
        Err(RdmaError::UnexpectedCmEvent {
            got: CmEventKind::Rejected,
            status: 8,
            private_data,
            ..
        }) => assert!(private_data.is_empty()),
        other => panic!("expected a reject, got {other:?}"),
    }
}

#[test]
fn reject_carries_padded_private_data() {
    let fabric = SimFabric::new(SimConfig::default());
    let vc = fabric.add_host(CLIENT);
    let vs = fabric.add_host(SERVER);
    let (lch, _l) = listen(&vs);
    let c = client_connect(&vc, &Opts::default(), b"let me in");
    let ev = next_event(&fabric, &lch);
    ev.new_id.unwrap().reject(&[1, 2, 3]).unwrap();
    match c.ch.wait_event(CmEventKind::Established, T) {
        Err(RdmaError::UnexpectedCmEvent {
            got: CmEventKind::Rejected,
            status: 28,
            private_data,
            ..
        }) => {
            assert_eq!(private_data.len(), 148);
            assert_eq!(&private_data[..3], &[1, 2, 3]);
        }
        other => panic!("expected a reject, got {other:?}"),
    }
}

#[test]
fn dropping_an_unanswered_request_rejects_it() {
    let fabric = SimFabric::new(SimConfig::default());
    let vc = fabric.add_host(CLIENT);
    let vs = fabric.add_host(SERVER);
    let (lch, _l) = listen(&vs);
    let c = client_connect(&vc, &Opts::default(), b"");
    drop(next_event(&fabric, &lch));
    match c.ch.wait_event(CmEventKind::Established, T) {
        Err(RdmaError::UnexpectedCmEvent {
            got: CmEventKind::Rejected,
            status: 28,
            private_data,
            ..
        }) => assert!(private_data.is_empty()),
        other => panic!("expected a reject, got {other:?}"),
    }
}

#[test]
fn addresses_and_devices() {
    let fabric = SimFabric::new(SimConfig::default());
    let vs = fabric.add_host(SERVER);
    let ch = vs.event_channel().unwrap();
    let wild = ch.create_id().unwrap();
    wild.bind_addr("0.0.0.0:4420".parse().unwrap()).unwrap();
    wild.listen(8).unwrap();
    assert!(matches!(wild.context(), Err(RdmaError::NoDevice)));
    let clash = ch.create_id().unwrap();
    match clash.bind_addr(server_addr()) {
        Err(RdmaError::BindAddr(e)) => assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE)),
        other => panic!("expected EADDRINUSE, got {other:?}"),
    }
    let foreign = ch.create_id().unwrap();
    match foreign.bind_addr("10.9.9.9:4420".parse().unwrap()) {
        Err(RdmaError::BindAddr(e)) => assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL)),
        other => panic!("expected EADDRNOTAVAIL, got {other:?}"),
    }
    let specific = ch.create_id().unwrap();
    specific
        .bind_addr("10.0.0.2:4421".parse().unwrap())
        .unwrap();
    assert!(specific.context().unwrap().same_device(&vs.context()));

    // Resolving an address nobody owns fails with an event.
    let id = ch.create_id().unwrap();
    id.resolve_addr(None, "10.7.7.7:4420".parse().unwrap(), T)
        .unwrap();
    match ch.wait_event(CmEventKind::AddrResolved, T) {
        Err(RdmaError::UnexpectedCmEvent {
            got: CmEventKind::AddrError,
            ..
        }) => {}
        other => panic!("expected an address error, got {other:?}"),
    }
    // Waiting for an event that cannot come times out in virtual time.
    let t0 = fabric.now_ns();
    match ch.wait_event(CmEventKind::Established, Duration::from_millis(5)) {
        Err(RdmaError::CmEventTimeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(fabric.now_ns() >= t0 + 5_000_000);
}

#[test]
fn a_wildcard_listener_accepts() {
    let fabric = SimFabric::new(SimConfig::default());
    let vc = fabric.add_host(CLIENT);
    let vs = fabric.add_host(SERVER);
    let lch = vs.event_channel().unwrap();
    let l = lch.create_id().unwrap();
    l.set_context(42);
    l.bind_addr("0.0.0.0:4420".parse().unwrap()).unwrap();
    l.listen(8).unwrap();
    let o = Opts::default();
    let c = client_connect(&vc, &o, b"");
    let ev = next_event(&fabric, &lch);
    assert_eq!(ev.kind, CmEventKind::ConnectRequest);
    assert_eq!(ev.id_context, 42);
    let id = ev.new_id.unwrap();
    assert_eq!(id.context_value(), 42);
    assert!(id.context().unwrap().same_device(&vs.context()));
    assert_eq!(id.local_addr(), Some(server_addr()));
    drop(id);
    drop(c);
}

#[test]
fn unsupported_operations_are_refused_at_post_time() {
    let p = connect_pair(Opts::default());
    let imm = SendWr::new(
        1,
        crate::rdma::wr::SendOp::SendWithImm { imm: 7 },
        crate::rdma::wr::Payload::Sges(&[]),
    );
    match p.client.qp.post_send(&[imm]) {
        Err(RdmaError::InvalidArgument(msg)) => assert!(msg.contains("not simulated")),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(p.client.qp.send_queue_used(), 0);
    match p.server.qp.post_recv(&[RecvWr::new(1, &[])]) {
        Err(RdmaError::InvalidArgument(_)) => {}
        other => panic!("an SRQ QP has no own receive queue, got {other:?}"),
    }
}

#[test]
fn fail_post_send_at_index_one_posts_index_zero() {
    let mut p = connect_pair(Opts::default());
    let num = p.client.qp.qp_num();
    // The call after the next one fails.
    p.fabric.faults().fail_post_send(num, 1, 1, libc::ENOMEM);
    let sge = stage(&mut p.client, b"ok");
    p.client
        .qp
        .post_send(&[SendWr::send(1, from_ref(&sge))])
        .unwrap();
    match p.client.qp.post_send(&[
        SendWr::send(2, from_ref(&sge)),
        SendWr::send(3, from_ref(&sge)),
    ]) {
        Err(RdmaError::PostSend { source, index }) => {
            assert_eq!(index, 1);
            assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
            assert_eq!(
                source.kind(),
                io::Error::from_raw_os_error(libc::ENOMEM).kind()
            );
        }
        other => panic!("expected the injected failure, got {other:?}"),
    }
    p.client
        .qp
        .post_send(&[SendWr::send(4, from_ref(&sge))])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 3);
    assert_eq!(
        statuses(&wcs),
        vec![
            (1, WcStatus::SUCCESS),
            (2, WcStatus::SUCCESS),
            (4, WcStatus::SUCCESS)
        ]
    );
    let recvs = wait_cqes(&p.fabric, &p.server.cq, 3);
    assert_eq!(recvs.len(), 3, "wr 3 was never posted");
}

#[test]
fn held_writes_hold_everything_behind_them() {
    let mut p = connect_pair(Opts {
        cfg: SimConfig {
            record_payloads: true,
            ..SimConfig::default()
        },
        ..Opts::default()
    });
    let target = DmaBuf::<SimVerbs>::new(&p.client.pd, 64, AccessFlags::ALL_DATA).unwrap();
    let num = p.server.qp.qp_num();
    p.fabric.faults().hold_writes(num);
    let sge = stage(&mut p.server, b"payload!");
    let wrs = [
        SendWr::send_inline(1, b"before"),
        SendWr::rdma_write(
            2,
            from_ref(&sge),
            target.mr().remote_addr(8),
            target.mr().rkey(),
        ),
        SendWr::send_inline(3, b"after"),
    ];
    p.server.qp.post_send(&wrs).unwrap();
    p.fabric.run_until_idle(10_000);
    p.fabric.advance(Duration::from_secs(1));
    let wcs = poll(&p.client.cq);
    assert_eq!(statuses(&wcs), vec![(100, WcStatus::SUCCESS)]);
    assert_eq!(read(&p.client, 0, 6), b"before");
    assert_eq!(statuses(&poll(&p.server.cq)), vec![(1, WcStatus::SUCCESS)]);
    let mut got = [0u8; 8];
    target.read_at(8, &mut got);
    assert_eq!(got, [0u8; 8]);

    p.fabric.faults().release_writes(num);
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 1);
    assert_eq!(statuses(&wcs), vec![(101, WcStatus::SUCCESS)]);
    // The WRITE landed before the SEND behind it was received.
    target.read_at(8, &mut got);
    assert_eq!(&got, b"payload!");
    assert_eq!(read(&p.client, RECV_SLOT, 5), b"after");
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 2);
    assert_eq!(
        statuses(&wcs),
        vec![(2, WcStatus::SUCCESS), (3, WcStatus::SUCCESS)]
    );
    // What the client received, in order.
    let got: Vec<(DeliveredKind, Vec<u8>)> = p
        .fabric
        .delivered(CLIENT)
        .into_iter()
        .map(|d| (d.kind, d.data))
        .collect();
    assert_eq!(
        got,
        vec![
            (DeliveredKind::Send, b"before".to_vec()),
            (DeliveredKind::Write, b"payload!".to_vec()),
            (DeliveredKind::Send, b"after".to_vec()),
        ]
    );
}

#[test]
fn a_crashed_host_ends_peers_in_retry_exceeded() {
    let mut p = connect_pair(Opts::default());
    p.fabric.faults().crash_host(SERVER);
    let sge = stage(&mut p.client, b"hello?");
    let t0 = p.fabric.now_ns();
    p.client
        .qp
        .post_send(&[SendWr::send(1, from_ref(&sge))])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 1);
    assert_eq!(wcs[0].wr_id(), 1);
    assert_eq!(wcs[0].status(), WcStatus::RETRY_EXC_ERR);
    let cfg = p.fabric.config();
    assert!(p.fabric.now_ns() - t0 >= 8 * cfg.transport_timeout_ns);
    assert!(p.client.qp.is_error());
    // No CM message from the vanished host.
    assert!(p.client.ch.get_event().unwrap().is_none());
    // A disconnect gets no answer: the DREQ times out.
    p.client.id.disconnect().unwrap();
    let ev = next_event(&p.fabric, &p.client.ch);
    assert_eq!(ev.kind, CmEventKind::Disconnected);
    assert!(p.server.ch.get_event().unwrap().is_none());
}

#[test]
fn dropping_a_qp_discards_its_work_requests() {
    let o = Opts {
        server_recvs: 0,
        ..Opts::default()
    };
    let mut p = connect_pair(o);
    let sge = stage(&mut p.client, b"lost");
    p.client
        .qp
        .post_send(&[SendWr::send(1, from_ref(&sge))])
        .unwrap();
    p.fabric.advance(Duration::from_millis(1));
    let Pair { client, fabric, .. } = p;
    let cq = client.cq.clone();
    drop(client);
    fabric.advance(Duration::from_secs(10));
    assert!(
        poll(&cq).is_empty(),
        "no completion for a destroyed QP's WQEs"
    );
}

/// A scenario with a bit of everything; its trace.
fn scenario(seed: u64) -> Vec<String> {
    let o = Opts {
        cfg: SimConfig {
            seed,
            ..SimConfig::default()
        },
        ..Opts::default()
    };
    let mut p = connect_pair(o);
    let target = DmaBuf::<SimVerbs>::new(&p.client.pd, 256, AccessFlags::ALL_DATA).unwrap();
    for i in 0..3 {
        let sge = stage(&mut p.server, &[i as u8; 32]);
        let w = SendWr::rdma_write(
            i,
            from_ref(&sge),
            target.mr().remote_addr(0),
            target.mr().rkey(),
        );
        p.server
            .qp
            .post_send(&[w, SendWr::send(10 + i, from_ref(&sge))])
            .unwrap();
        let sge = stage(&mut p.client, b"cmd");
        p.client
            .qp
            .post_send(&[SendWr::send(20 + i, from_ref(&sge))])
            .unwrap();
        p.fabric.step();
    }
    p.fabric.run_until_idle(10_000);
    p.client.id.disconnect().unwrap();
    next_event(&p.fabric, &p.server.ch);
    p.server.id.disconnect().unwrap();
    p.fabric.run_until_idle(10_000);
    p.fabric.trace()
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let a = scenario(1);
    let b = scenario(1);
    assert!(a.len() > 40, "{}", a.join("\n"));
    assert_eq!(a, b);
    let c = scenario(2);
    assert_ne!(a, c, "another seed draws other delays");
    // Same events happened, at other times.
    let strip = |t: &[String]| -> Vec<String> {
        t.iter()
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
            .filter(|l| !l.contains("arrives"))
            .collect()
    };
    assert_eq!(strip(&a).len(), strip(&c).len());
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<SimVerbs>();
    check::<SimContext>();
    check::<SimPd>();
    check::<SimMr>();
    check::<SimCq>();
    check::<SimSrq>();
    check::<SimQp>();
    check::<SimChannel>();
    check::<SimCmId>();
    check::<SimFabric>();
}

#[test]
fn cq_resize_keeps_what_is_queued() {
    let o = Opts {
        client_cq: 2,
        ..Opts::default()
    };
    let p = connect_pair(o);
    for i in 0..2 {
        p.server
            .qp
            .post_send(&[SendWr::send_inline(i, b"x")])
            .unwrap();
    }
    p.fabric.run_until_idle(1000);
    assert_eq!(p.client.cq.resize(8).unwrap(), 8);
    assert_eq!(p.client.cq.capacity(), 8);
    assert!(matches!(p.client.cq.resize(1), Err(RdmaError::ResizeCq(_))));
    assert!(matches!(
        p.client.cq.resize(70_000),
        Err(RdmaError::ResizeCq(_))
    ));
    for i in 2..4 {
        p.server
            .qp
            .post_send(&[SendWr::send_inline(i, b"y")])
            .unwrap();
    }
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 4);
    assert_eq!(wcs.len(), 4);
    assert!(wcs.iter().all(|w| w.is_success()));
    assert!(!p.client.qp.is_error());
}

#[test]
fn virtual_clock_and_sleep() {
    let fabric = SimFabric::new(SimConfig::default());
    let v = fabric.add_host(CLIENT);
    let ms = fabric.clock_ms();
    let t0 = v.now();
    v.sleep(Duration::from_millis(3));
    assert_eq!(v.now() - t0, Duration::from_millis(3));
    assert_eq!(fabric.now_ns(), 3_000_000);
    assert_eq!(ms.load(std::sync::atomic::Ordering::Relaxed), 3);
    // The idle hook runs while a provider sleeps.
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = calls.clone();
    fabric.set_idle_hook(Some(Arc::new(move || {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    })));
    v.sleep(Duration::from_micros(50));
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    fabric.set_idle_hook(None);
    fabric.inject_async_event(
        CLIENT,
        SimAsyncEvent {
            kind: SimAsyncEventKind::PortErr,
            qp_num: None,
            cq_id: None,
        },
    );
    let evs = fabric.take_async_events_of(&v);
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].kind, SimAsyncEventKind::PortErr);
    assert!(v.context().take_async_event().is_none());
}

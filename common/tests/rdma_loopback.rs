//! End-to-end check of the verbs layer on a real (soft-RoCE) device, in one process: RDMA CM
//! connect / accept with private data both ways, SEND / RECV (through an SRQ on the passive
//! side and a plain receive queue on the active side), inline SEND, RDMA WRITE then RDMA READ
//! through registered memory, a batched chain, registration of a buffer pool, SEND with
//! invalidate when the device can, and disconnect seen by both sides.
//!
//! Runs only when `NVMF_RDMA_TEST_ADDR` names an IP address bound to an RDMA netdev (e.g.
//! `10.0.0.1` on rxe0's veth); otherwise it prints why and passes. Needs
//! `ulimit -l unlimited` for the buffer pool registration.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_common::buffer::BufferPool;
use nvmf_common::rdma::{
    register_pool, AccessFlags, CmEventKind, CmId, CompletionQueue, ConnParams, DeviceCapFlags,
    DmaBuf, EventChannel, MemoryWindow, ProtectionDomain, QpCaps, QueuePair, RdmaError, RealVerbs,
    RecvWr, SendOp, SendWr, SharedReceiveQueue, WcOpcode, WcStatus, WorkCompletion,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const MSG: usize = 256;

fn test_addr() -> Option<IpAddr> {
    match std::env::var("NVMF_RDMA_TEST_ADDR") {
        Ok(s) => Some(
            s.parse()
                .expect("NVMF_RDMA_TEST_ADDR must be an IP address"),
        ),
        Err(_) => {
            eprintln!("skipping: set NVMF_RDMA_TEST_ADDR to an address on an RDMA netdev");
            None
        }
    }
}

/// Polls `cq` until `n` completions arrived (or the timeout).
fn wait_completions(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    let mut wcs = [WorkCompletion::default(); 8];
    while got.len() < n {
        let k = cq.poll(&mut wcs).expect("poll");
        got.extend_from_slice(&wcs[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {n} completions, got {got:?}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    got
}

fn wait_one(cq: &CompletionQueue, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    let wc = wait_completions(cq, 1)[0];
    assert!(wc.is_success(), "completion failed: {wc:?}");
    assert_eq!(wc.wr_id(), wr_id, "{wc:?}");
    assert_eq!(wc.opcode(), opcode, "{wc:?}");
    wc
}

struct Side {
    id: CmId,
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    qp: QueuePair,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

#[test]
fn loopback() {
    let Some(ip) = test_addr() else { return };

    // Passive side: listen on an ephemeral port.
    let lch = EventChannel::new().expect("listener channel");
    let listener = lch.create_id().expect("listener id");
    listener.set_context(0x11);
    listener
        .bind_addr(SocketAddr::new(ip, 0))
        .expect("bind listener");
    listener.listen(8).expect("listen");
    let port = listener.local_addr().expect("listener address").port();
    assert_ne!(port, 0);
    let lctx = listener.context().expect("listener bound to a device");
    let dev = lctx.device();
    let attr = lctx.query_device().expect("query_device");
    let port_attr = lctx
        .query_port(listener.port_num().max(1))
        .expect("query_port");
    let gid = lctx
        .query_gid(listener.port_num().max(1), 0)
        .expect("query_gid");
    eprintln!(
        "device {} guid {} transport {:?}: max_qp {} max_qp_wr {} max_sge {} max_srq_wr {} \
         max_cqe {} max_mr_size {:#x} caps {:?}; port {:?} mtu {:?} link {:?} gid0 {gid}",
        dev.name,
        nvmf_common::rdma::device::format_guid(dev.node_guid),
        dev.transport,
        attr.max_qp,
        attr.max_qp_wr,
        attr.max_sge,
        attr.max_srq_wr,
        attr.max_cqe,
        attr.max_mr_size,
        attr.device_cap_flags,
        port_attr.state,
        port_attr.active_mtu.bytes(),
        port_attr.link_layer,
    );

    // Active side: resolve address and route, build the QP, connect with private data.
    let cch = EventChannel::new().expect("client channel");
    let cid = cch.create_id().expect("client id");
    cid.set_context(0x22);
    let dst = SocketAddr::new(ip, port);
    cid.resolve_addr(None, dst, Duration::from_secs(2))
        .expect("resolve_addr");
    let ev = cch
        .wait_event(CmEventKind::AddrResolved, TIMEOUT)
        .expect("ADDR_RESOLVED");
    assert_eq!(ev.id, cid.token());
    assert_eq!(ev.id_context, 0x22);
    cid.resolve_route(Duration::from_secs(2))
        .expect("resolve_route");
    cch.wait_event(CmEventKind::RouteResolved, TIMEOUT)
        .expect("ROUTE_RESOLVED");
    let cctx = cid.context().expect("client context");
    let cpd = ProtectionDomain::new(&cctx).expect("client pd");
    let ccq = CompletionQueue::with_channel(&cctx, 64, 0).expect("client cq");
    let cqp = cid
        .create_qp(&cpd, &ccq, &ccq, None, caps())
        .expect("client qp");
    assert!(cqp.caps().max_inline_data >= 64);
    let client = Side {
        id: cid,
        pd: cpd,
        cq: ccq,
        qp: cqp,
    };

    // Client receive buffers (its own receive queue): two slots.
    let mut crecv =
        DmaBuf::<RealVerbs>::new(&client.pd, 2 * MSG, AccessFlags::LOCAL_WRITE).expect("crecv");
    crecv.fill(0);
    let slots = [crecv.sge(0, MSG).unwrap(), crecv.sge(MSG, MSG).unwrap()];
    client
        .qp
        .post_recv(&[
            RecvWr::new(100, &slots[0..1]),
            RecvWr::new(101, &slots[1..2]),
        ])
        .expect("client post_recv");

    let host_pd = b"host private data";
    client
        .id
        .connect(&ConnParams::with_private_data(host_pd))
        .expect("connect");

    // Passive side gets the request with the host's private data.
    let ev = lch
        .wait_event(CmEventKind::ConnectRequest, TIMEOUT)
        .expect("CONNECT_REQUEST");
    assert!(
        ev.private_data.starts_with(host_pd),
        "request private data {:?}",
        ev.private_data
    );
    assert_eq!(ev.listen_id, Some(listener.token()));
    assert_eq!(
        ev.id_context, 0x11,
        "new ids inherit the listener's context"
    );
    let sid = ev.new_id.expect("new id on CONNECT_REQUEST");
    sid.set_context(0x33);
    // The host's address: 10.0.0.2 when the lab routes the connection over the veth pair
    // (two devices), the listener's own address when rxe loops back.
    let host_addr = client.id.local_addr().expect("client address");
    eprintln!(
        "connection {} -> {}",
        host_addr,
        sid.local_addr().expect("server address")
    );
    assert_eq!(sid.peer_addr(), Some(host_addr));
    assert_eq!(sid.local_addr(), Some(dst));
    let sctx = sid.context().expect("server context");
    let spd = ProtectionDomain::new(&sctx).expect("server pd");
    let scq = CompletionQueue::new(&sctx, 64).expect("server cq");
    let srq = SharedReceiveQueue::new(&spd, 16, 1).expect("srq");
    let sqp = sid
        .create_qp(&spd, &scq, &scq, Some(&srq), caps())
        .expect("server qp");
    assert!(
        sqp.post_recv(&[]).is_err(),
        "receives on an SRQ QP go to the SRQ"
    );
    let server = Side {
        id: sid,
        pd: spd,
        cq: scq,
        qp: sqp,
    };
    let srecv =
        DmaBuf::<RealVerbs>::new(&server.pd, 4 * MSG, AccessFlags::LOCAL_WRITE).expect("srecv");
    let sslots: Vec<_> = (0..4).map(|i| srecv.sge(i * MSG, MSG).unwrap()).collect();
    let rwrs: Vec<_> = (0..4)
        .map(|i| RecvWr::new(200 + i as u64, &sslots[i..i + 1]))
        .collect();
    srq.post_recv(&rwrs).expect("srq post_recv");

    let target_pd = b"target private data";
    server
        .id
        .accept(&ConnParams {
            private_data: target_pd,
            responder_resources: 1,
            initiator_depth: 1,
            ..ConnParams::default()
        })
        .expect("accept");
    let ev = cch
        .wait_event(CmEventKind::Established, TIMEOUT)
        .expect("client ESTABLISHED");
    assert!(
        ev.private_data.starts_with(target_pd),
        "accept private data {:?}",
        ev.private_data
    );
    let ev = lch
        .wait_event(CmEventKind::Established, TIMEOUT)
        .expect("server ESTABLISHED");
    assert_eq!(ev.id, server.id.token());
    assert_eq!(ev.id_context, 0x33);

    // SEND client -> server (registered), then an inline SEND.
    let mut csend =
        DmaBuf::<RealVerbs>::new(&client.pd, MSG, AccessFlags::LOCAL_WRITE).expect("csend");
    csend.write_at(0, b"capsule from the host");
    let sge = [csend.sge(0, 21).unwrap()];
    client
        .qp
        .post_send(&[SendWr::send(1, &sge)])
        .expect("post send");
    wait_one(&client.cq, 1, WcOpcode::SEND);
    let wc = wait_one(&server.cq, 200, WcOpcode::RECV);
    assert_eq!(wc.byte_len(), 21);
    assert_eq!(wc.qp_num(), server.qp.qp_num());
    let mut got = [0u8; 21];
    srecv.read_at(0, &mut got);
    assert_eq!(&got, b"capsule from the host");

    let inline_msg = b"inline capsule";
    client
        .qp
        .post_send(&[SendWr::send_inline(2, inline_msg)])
        .expect("post inline send");
    wait_one(&client.cq, 2, WcOpcode::SEND);
    let wc = wait_one(&server.cq, 201, WcOpcode::RECV);
    assert_eq!(wc.byte_len() as usize, inline_msg.len());
    let mut got = [0u8; 14];
    srecv.read_at(MSG, &mut got);
    assert_eq!(&got, inline_msg);

    // RDMA WRITE server -> client memory, then RDMA READ it back, in one batched post: an
    // unsignaled WRITE followed by a signaled READ (same QP, so ordered).
    let mut cdata = DmaBuf::<RealVerbs>::new(&client.pd, 8192, AccessFlags::ALL_DATA)
        .expect("client data buffer");
    cdata.fill(0);
    let (raddr, rkey) = (cdata.mr().remote_addr(0), cdata.mr().rkey());
    let mut sdata =
        DmaBuf::<RealVerbs>::new(&server.pd, 8192, AccessFlags::ALL_DATA).expect("server data");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    sdata.write_at(0, &pattern);
    let wsge = [sdata.sge(0, 4096).unwrap()];
    let rsge = [sdata.sge(4096, 4096).unwrap()];
    server
        .qp
        .post_send(&[
            SendWr::rdma_write(10, &wsge, raddr, rkey).signaled(false),
            SendWr::rdma_read(11, &rsge, raddr, rkey),
        ])
        .expect("post write+read chain");
    let wc = wait_one(&server.cq, 11, WcOpcode::RDMA_READ);
    assert_eq!(wc.byte_len(), 4096);
    let mut readback = vec![0u8; 4096];
    sdata.read_at(4096, &mut readback);
    assert_eq!(
        readback, pattern,
        "RDMA READ returned what RDMA WRITE wrote"
    );
    let mut in_client = vec![0u8; 4096];
    cdata.read_at(0, &mut in_client);
    assert_eq!(in_client, pattern);

    // A registered buffer pool: RDMA WRITE from a pool buffer, SEND the response.
    let pool = BufferPool::new(4096, 8).expect("pool");
    register_pool::<RealVerbs>(&server.pd, &pool, AccessFlags::ALL_DATA).expect("register pool");
    assert!(register_pool::<RealVerbs>(&server.pd, &pool, AccessFlags::ALL_DATA).is_err());
    let mut buf = pool.get().expect("pool buffer");
    buf.as_mut_slice().fill(0x5a);
    let psge = [nvmf_common::rdma::Sge {
        addr: buf.addr(),
        length: 4096,
        lkey: buf.lkey(),
    }];
    server
        .qp
        .post_send(&[SendWr::rdma_write(12, &psge, raddr + 4096, rkey)])
        .expect("post pool write");
    wait_one(&server.cq, 12, WcOpcode::RDMA_WRITE);
    drop(buf);
    let mut in_client = vec![0u8; 4096];
    cdata.read_at(4096, &mut in_client);
    assert!(in_client.iter().all(|&b| b == 0x5a));

    // SEND server -> client (client's own receive queue) with immediate data.
    let mut ssend =
        DmaBuf::<RealVerbs>::new(&server.pd, MSG, AccessFlags::LOCAL_WRITE).expect("ssend");
    ssend.write_at(0, b"response capsule");
    let sge = [ssend.sge(0, 16).unwrap()];
    server
        .qp
        .post_send(&[SendWr::new(
            13,
            SendOp::SendWithImm { imm: 0xfeed },
            nvmf_common::rdma::Payload::Sges(&sge),
        )])
        .expect("post send imm");
    wait_one(&server.cq, 13, WcOpcode::SEND);
    let wc = wait_one(&client.cq, 100, WcOpcode::RECV);
    assert_eq!(wc.byte_len(), 16);
    assert_eq!(wc.imm_data(), Some(0xfeed));
    let mut got = [0u8; 16];
    crecv.read_at(0, &mut got);
    assert_eq!(&got, b"response capsule");

    // Completion channel: arm, send, and see the event on the client CQ's descriptor.
    client.cq.req_notify(false).expect("req_notify");
    server
        .qp
        .post_send(&[SendWr::send_inline(14, b"wake up")])
        .expect("post wake-up send");
    wait_one(&server.cq, 14, WcOpcode::SEND);
    assert!(client.cq.channel_fd().is_some());
    assert!(
        client
            .cq
            .wait_event(TIMEOUT)
            .expect("wait for completion event"),
        "completion channel signalled"
    );
    client.cq.ack_events();
    wait_one(&client.cq, 101, WcOpcode::RECV);

    // SEND_WITH_INVALIDATE: the peer can only invalidate a memory window's (or a fast
    // registration's) key, not a plain registration's. The host binds a type 2 window over
    // its buffer, the target RDMA WRITEs through it, then answers with SEND_WITH_INVALIDATE
    // naming the window's key, and the host's receive completion reports the invalidation.
    let dev_caps = attr.device_cap_flags;
    if dev_caps.contains(DeviceCapFlags::MEM_MGT_EXTENSIONS)
        && (dev_caps.contains(DeviceCapFlags::MEM_WINDOW_TYPE_2B)
            || dev_caps.contains(DeviceCapFlags::MEM_WINDOW_TYPE_2A))
    {
        let mw = MemoryWindow::new(&client.pd).expect("alloc memory window");
        let mut mwbuf = DmaBuf::<RealVerbs>::new(
            &client.pd,
            4096,
            AccessFlags::ALL_DATA | AccessFlags::MW_BIND,
        )
        .expect("window buffer");
        mwbuf.fill(0);
        let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        client
            .qp
            .post_send(&[SendWr::bind_mw(20, &mw, mwbuf.mr(), 0, 4096, remote)])
            .expect("post bind");
        wait_one(&client.cq, 20, WcOpcode::BIND_MW);
        let mw_rkey = mw.rkey();
        assert_ne!(mw_rkey, mwbuf.mr().rkey());
        // A plain region cannot be bound.
        assert!(client
            .qp
            .post_send(&[SendWr::bind_mw(21, &mw, cdata.mr(), 0, 4096, remote)])
            .is_err());

        server
            .qp
            .post_send(&[SendWr::rdma_write(
                15,
                &wsge,
                mwbuf.mr().remote_addr(0),
                mw_rkey,
            )])
            .expect("post write through the window");
        wait_one(&server.cq, 15, WcOpcode::RDMA_WRITE);
        let mut in_window = vec![0u8; 4096];
        mwbuf.read_at(0, &mut in_window);
        assert_eq!(in_window, pattern);

        let slot = [crecv.sge(0, MSG).unwrap()];
        client
            .qp
            .post_recv(&[RecvWr::new(103, &slot)])
            .expect("post receive for the response");
        let sge = [ssend.sge(0, 16).unwrap()];
        server
            .qp
            .post_send(&[SendWr::send_with_invalidate(16, &sge, mw_rkey)])
            .expect("post send with invalidate");
        wait_one(&server.cq, 16, WcOpcode::SEND);
        let wc = wait_one(&client.cq, 103, WcOpcode::RECV);
        // rxe sets the kernel's IB_WC_WITH_INVALIDATE bit (1 << 2) instead of
        // IBV_WC_WITH_INV; either way the key is reported.
        let reported = wc.invalidated_rkey().is_some() || wc.wc_flags() & (1 << 2) != 0;
        assert!(reported, "invalidation not reported: {wc:?}");
        assert_eq!(wc.ex_data(), mw_rkey, "{wc:?}");

        // Binding a type 2 window requires it to be free again, so this bind succeeding shows
        // the remote invalidation took effect.
        client
            .qp
            .post_send(&[SendWr::bind_mw(22, &mw, mwbuf.mr(), 0, 2048, remote)])
            .expect("post rebind");
        wait_one(&client.cq, 22, WcOpcode::BIND_MW);
        assert_ne!(mw.rkey(), mw_rkey);
        client
            .qp
            .post_send(&[SendWr::local_invalidate(23, mw.rkey())])
            .expect("post local invalidate");
        wait_one(&client.cq, 23, WcOpcode::LOCAL_INV);
        eprintln!("SEND_WITH_INVALIDATE and memory windows work");
    } else {
        eprintln!(
            "skipping SEND_WITH_INVALIDATE: device has no type 2 memory windows ({dev_caps:?})"
        );
    }

    // A second host is rejected with private data (an NVMe-oF reject record in real use),
    // which the blocking helper hands back in its error.
    let rch = EventChannel::new().expect("second client channel");
    let rid = rch.create_id().expect("second client id");
    rid.resolve_addr(None, dst, Duration::from_secs(2))
        .expect("resolve_addr");
    rch.wait_event(CmEventKind::AddrResolved, TIMEOUT)
        .expect("ADDR_RESOLVED");
    rid.resolve_route(Duration::from_secs(2))
        .expect("resolve_route");
    rch.wait_event(CmEventKind::RouteResolved, TIMEOUT)
        .expect("ROUTE_RESOLVED");
    let rctx = rid.context().expect("second client context");
    let rpd = ProtectionDomain::new(&rctx).expect("pd");
    let rcq = CompletionQueue::new(&rctx, 16).expect("cq");
    let rqp = rid
        .create_qp(&rpd, &rcq, &rcq, None, caps())
        .expect("second client qp");
    rid.connect(&ConnParams::with_private_data(b"second host"))
        .expect("connect");
    let ev = lch
        .wait_event(CmEventKind::ConnectRequest, TIMEOUT)
        .expect("second CONNECT_REQUEST");
    assert!(ev.private_data.starts_with(b"second host"));
    let rejected = ev.new_id.expect("new id");
    rejected.reject(b"go away").expect("reject");
    match rch.wait_event(CmEventKind::Established, TIMEOUT) {
        Err(RdmaError::UnexpectedCmEvent {
            got: CmEventKind::Rejected,
            private_data,
            status,
            ..
        }) => {
            assert!(private_data.starts_with(b"go away"), "{private_data:?}");
            eprintln!("rejected with status {status}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    drop(rejected);
    drop(rqp);
    drop(rid);

    // Disconnect from the host side: both sides see DISCONNECTED, and the receive still
    // posted on the host's QP is flushed (the SRQ's receives are not: the SRQ outlives QPs).
    let extra = [crecv.sge(0, MSG).unwrap()];
    client
        .qp
        .post_recv(&[RecvWr::new(102, &extra)])
        .expect("post receive to be flushed");
    client.id.disconnect().expect("disconnect");
    let wc = wait_completions(&client.cq, 1)[0];
    assert_eq!(wc.wr_id(), 102);
    assert_eq!(wc.status(), WcStatus::WR_FLUSH_ERR, "{wc:?}");
    // The target sees the host's disconnect request and answers it, as the kernel target
    // does; only then does the host's side complete (otherwise it waits for the DREQ to
    // time out).
    let ev = lch
        .wait_event(CmEventKind::Disconnected, TIMEOUT)
        .expect("server DISCONNECTED");
    assert_eq!(ev.id, server.id.token());
    assert_eq!(ev.id_context, 0x33);
    server.id.disconnect().expect("server disconnect");
    let ev = cch
        .wait_event(CmEventKind::Disconnected, TIMEOUT)
        .expect("client DISCONNECTED");
    assert_eq!(ev.id, client.id.token());

    // Tear down in an order the types must make safe: ids first (the QPs keep them alive).
    drop(server.id);
    drop(client.id);
    drop(server.qp);
    drop(client.qp);
    drop(srq);
    drop(listener);
}

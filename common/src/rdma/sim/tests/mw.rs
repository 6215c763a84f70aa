//! Type 2 memory windows on the simulated fabric: the client (as an NVMe-oF host does)
//! exposes part of a region that has no remote access of its own through a window, and the
//! server reaches it with the window's key.

use super::*;
use crate::rdma::verbs::VerbsMw;

/// Where the window starts in the client's bindable region, and how long it is.
const WIN_OFF: usize = 512;
const WIN_LEN: usize = 1024;
const RW: AccessFlags = AccessFlags(AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0);

fn mw_pair() -> Pair {
    connect_pair(Opts {
        windows: true,
        ..Opts::default()
    })
}

/// A client region for windows only: no rkey of its own.
fn bindable(p: &Pair) -> DmaBuf<SimVerbs> {
    let access = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::MW_BIND.0);
    let buf = DmaBuf::<SimVerbs>::new(&p.client.pd, 4096, access).unwrap();
    assert_eq!(buf.mr().rkey(), 0);
    buf
}

/// Posts a bind on the client's QP and waits for its completion; returns the status.
fn bind_status(p: &Pair, mw: &SimMw, buf: &DmaBuf<SimVerbs>, access: AccessFlags) -> WcStatus {
    let wr = SendWr::bind_mw(77, mw, buf.mr(), WIN_OFF, WIN_LEN, access);
    p.client.qp.post_send(&[wr]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 1);
    assert_eq!(wcs[0].wr_id(), 77);
    // A failed bind puts the QP in Error: its receives are flushed behind it.
    assert!(
        wcs[1..]
            .iter()
            .all(|w| w.status() == WcStatus::WR_FLUSH_ERR),
        "{wcs:?}"
    );
    if wcs[0].is_success() {
        assert_eq!(wcs[0].opcode(), WcOpcode::BIND_MW);
    }
    wcs[0].status()
}

/// Binds `mw` over the window range with `access`; returns its new key.
fn bind(p: &Pair, mw: &SimMw, buf: &DmaBuf<SimVerbs>, access: AccessFlags) -> u32 {
    let before = mw.rkey();
    assert_eq!(bind_status(p, mw, buf, access), WcStatus::SUCCESS);
    assert_eq!(
        mw.rkey(),
        crate::rdma::mw::inc_rkey(before),
        "the next key of its sequence"
    );
    assert_ne!(mw.rkey(), before, "a bind gives the window a new key");
    mw.rkey()
}

/// The server RDMA WRITEs `data` at `off` of the client's region under `rkey`.
fn server_write(
    p: &mut Pair,
    buf: &DmaBuf<SimVerbs>,
    off: usize,
    rkey: u32,
    data: &[u8],
) -> WcStatus {
    let sge = stage(&mut p.server, data);
    let wr = SendWr::rdma_write(5, from_ref(&sge), buf.mr().remote_addr(off), rkey);
    p.server.qp.post_send(&[wr]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(wcs[0].wr_id(), 5);
    wcs[0].status()
}

/// The server RDMA READs `len` bytes at `off` of the client's region under `rkey`.
fn server_read(
    p: &Pair,
    buf: &DmaBuf<SimVerbs>,
    off: usize,
    len: usize,
    rkey: u32,
) -> (WcStatus, Vec<u8>) {
    let sge = p.server.buf.sge(0, len).unwrap();
    let wr = SendWr::rdma_read(6, from_ref(&sge), buf.mr().remote_addr(off), rkey);
    p.server.qp.post_send(&[wr]).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(wcs[0].wr_id(), 6);
    (wcs[0].status(), read(&p.server, 0, len))
}

/// Posts a LOCAL_INV of `key` (wr_id 9) on the client and returns its completion.
fn local_invalidate(p: &Pair, key: u32) -> WorkCompletion {
    p.client
        .qp
        .post_send(&[SendWr::local_invalidate(9, key)])
        .unwrap();
    wait_cqes(&p.fabric, &p.client.cq, 1)[0]
}

fn client_bytes(buf: &DmaBuf<SimVerbs>, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    buf.read_at(off, &mut v);
    v
}

#[test]
fn alloc_mw_needs_a_device_with_windows() {
    let p = connect_pair(Opts::default());
    match SimVerbs::alloc_mw(&p.client.pd) {
        Err(RdmaError::AllocMw(e)) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP)),
        other => panic!("expected EOPNOTSUPP, got {other:?}"),
    }
    let p = mw_pair();
    assert!(p.client.ctx.query_device().unwrap().has_type2_windows());
    let a = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let b = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    assert_ne!(
        a.rkey() >> 8,
        b.rkey() >> 8,
        "every window has its own index"
    );
}

#[test]
fn a_bound_window_serves_reads_and_writes_in_its_range() {
    let mut p = mw_pair();
    let mut buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    // Before any bind the window's key reaches nothing.
    let fresh = mw.rkey();
    let key = bind(&p, &mw, &buf, RW);
    assert_ne!(key, fresh);

    let data: Vec<u8> = (0..100u8).collect();
    assert_eq!(
        server_write(&mut p, &buf, WIN_OFF + 10, key, &data),
        WcStatus::SUCCESS
    );
    assert_eq!(client_bytes(&buf, WIN_OFF + 10, 100), data);

    buf.write_at(WIN_OFF + WIN_LEN - 50, &[0x5a; 50]);
    let (st, got) = server_read(&p, &buf, WIN_OFF + WIN_LEN - 50, 50, key);
    assert_eq!(st, WcStatus::SUCCESS);
    assert_eq!(got, vec![0x5a; 50], "the window's last bytes");
    assert!(!p.client.qp.is_error() && !p.server.qp.is_error());
}

#[test]
fn the_key_before_the_first_bind_reaches_nothing() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let (st, _) = server_read(&p, &buf, WIN_OFF, 16, mw.rkey());
    assert_eq!(st, WcStatus::REM_ACCESS_ERR);
}

#[test]
fn access_outside_the_window_or_its_rights_fails() {
    // (offset, length, write?): each outside what a read-only window over
    // WIN_OFF..WIN_OFF + WIN_LEN grants, though inside the region.
    let cases = [
        (WIN_OFF + WIN_LEN - 10, 20, false),
        (WIN_OFF - 1, 8, false),
        (0, 16, false),
        (WIN_OFF, 16, true),
    ];
    for (off, len, write) in cases {
        let mut p = mw_pair();
        let buf = bindable(&p);
        let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
        let key = bind(&p, &mw, &buf, AccessFlags::REMOTE_READ);
        // Inside the window, a read works.
        assert_eq!(server_read(&p, &buf, WIN_OFF, 16, key).0, WcStatus::SUCCESS);
        let st = if write {
            server_write(&mut p, &buf, off, key, &vec![0xee; len])
        } else {
            server_read(&p, &buf, off, len, key).0
        };
        assert_eq!(
            st,
            WcStatus::REM_ACCESS_ERR,
            "offset {off}, {len} bytes, write {write}"
        );
        assert!(p.client.qp.is_error() && p.server.qp.is_error());
        assert_eq!(
            client_bytes(&buf, 0, 4096),
            vec![0; 4096],
            "nothing was written"
        );
    }
}

#[test]
fn send_with_invalidate_revokes_the_window_key() {
    let mut p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let key = bind(&p, &mw, &buf, RW);
    let sge = stage(&mut p.server, b"done");
    p.server
        .qp
        .post_send(&[SendWr::send_with_invalidate(1, from_ref(&sge), key)])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 1);
    assert!(wcs[0].is_success(), "{wcs:?}");
    assert_eq!(wcs[0].invalidated_rkey(), Some(key));
    assert_eq!(read(&p.client, 0, 4), b"done");
    assert_eq!(
        statuses(&wait_cqes(&p.fabric, &p.server.cq, 1)),
        vec![(1, WcStatus::SUCCESS)]
    );
    // A late WRITE with the old key lands nowhere.
    let st = server_write(&mut p, &buf, WIN_OFF, key, &[0xee; 64]);
    assert_eq!(st, WcStatus::REM_ACCESS_ERR);
    assert_eq!(client_bytes(&buf, WIN_OFF, 64), vec![0; 64]);
}

#[test]
fn local_invalidate_revokes_the_window_key() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let key = bind(&p, &mw, &buf, RW);
    assert_eq!(server_read(&p, &buf, WIN_OFF, 8, key).0, WcStatus::SUCCESS);
    let wc = local_invalidate(&p, key);
    assert_eq!(statuses(&[wc]), vec![(9, WcStatus::SUCCESS)]);
    assert_eq!(wc.opcode(), WcOpcode::LOCAL_INV);
    assert_eq!(
        server_read(&p, &buf, WIN_OFF, 8, key).0,
        WcStatus::REM_ACCESS_ERR
    );
}

#[test]
fn local_invalidate_of_no_valid_window_fails() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    // A Free window (never bound) cannot be invalidated.
    let wc = local_invalidate(&p, mw.rkey());
    assert_eq!(statuses(&[wc]), vec![(9, WcStatus::LOC_QP_OP_ERR)]);
    assert!(p.client.qp.is_error());
    drop(buf);
}

#[test]
fn rebinding_needs_an_invalidation_and_gives_a_new_key() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let first = bind(&p, &mw, &buf, RW);
    assert_eq!(
        statuses(&[local_invalidate(&p, first)]),
        vec![(9, WcStatus::SUCCESS)]
    );
    let second = bind(&p, &mw, &buf, RW);
    assert_ne!(second, first);
    assert_eq!(
        server_read(&p, &buf, WIN_OFF, 8, second).0,
        WcStatus::SUCCESS
    );
    assert_eq!(
        server_read(&p, &buf, WIN_OFF, 8, first).0,
        WcStatus::REM_ACCESS_ERR
    );
}

#[test]
fn binding_a_valid_window_fails() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    bind(&p, &mw, &buf, RW);
    // Type 2: the window must be invalidated (Free) before it is bound again.
    assert_eq!(bind_status(&p, &mw, &buf, RW), WcStatus::MW_BIND_ERR);
    assert!(p.client.qp.is_error());
}

#[test]
fn binding_needs_mw_bind_on_the_region() {
    let p = mw_pair();
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    // The client's ALL_DATA buffer was registered without MW_BIND: refused at post time,
    // as the real provider does.
    let wr = SendWr::bind_mw(1, &mw, p.client.buf.mr(), 0, 64, RW);
    match p.client.qp.post_send(&[wr]) {
        Err(RdmaError::InvalidArgument(msg)) => assert!(msg.contains("MW_BIND"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(p.client.qp.send_queue_used(), 0);
    // Outside the region, and twice in one post: refused too.
    let buf = bindable(&p);
    let wr = SendWr::bind_mw(1, &mw, buf.mr(), 4000, 200, RW);
    assert!(matches!(
        p.client.qp.post_send(&[wr]),
        Err(RdmaError::InvalidArgument(_))
    ));
    let wr = SendWr::bind_mw(1, &mw, buf.mr(), 0, 64, RW);
    assert!(matches!(
        p.client.qp.post_send(&[wr, wr]),
        Err(RdmaError::InvalidArgument(_))
    ));
    assert_eq!(p.client.qp.send_queue_used(), 0);
    // A writable window over a region without local write fails when it executes.
    let bind_only = DmaBuf::<SimVerbs>::new(&p.client.pd, 4096, AccessFlags::MW_BIND).unwrap();
    assert_eq!(bind_status(&p, &mw, &bind_only, RW), WcStatus::MW_BIND_ERR);
}

#[test]
fn a_bind_of_another_pds_window_is_refused() {
    let p = mw_pair();
    let other = SimVerbs::alloc_pd(&p.client.ctx).unwrap();
    let mw = SimVerbs::alloc_mw(&other).unwrap();
    let buf = bindable(&p);
    let wr = SendWr::bind_mw(1, &mw, buf.mr(), 0, 64, RW);
    match p.client.qp.post_send(&[wr]) {
        Err(RdmaError::InvalidArgument(msg)) => assert!(msg.contains("PD"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn invalidating_a_key_that_is_no_window_is_a_remote_invalid_request() {
    let mut p = mw_pair();
    // The client's own ALL_DATA region: a real key, but no window.
    let key = p.client.buf.mr().rkey();
    let sge = stage(&mut p.server, b"done");
    p.server
        .qp
        .post_send(&[SendWr::send_with_invalidate(1, from_ref(&sge), key)])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::REM_INV_REQ_ERR)]);
    let wcs = poll(&p.client.cq);
    assert_eq!(wcs[0].status(), WcStatus::REM_INV_REQ_ERR);
    assert!(p.client.qp.is_error() && p.server.qp.is_error());
    assert_ne!(read(&p.client, 0, 4), b"done", "nothing was delivered");
}

#[test]
fn a_window_serves_only_the_qp_that_bound_it() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let key = bind(&p, &mw, &buf, RW);
    // A second connection from a QP of the same PD.
    let o = Opts::default();
    let c2 = client_connect_on(&p.vc, &o, b"", Some(&p.client.pd));
    let s2 = server_accept(&p.fabric, &p.server.ch, &o, b"");
    c2.ch.wait_event(CmEventKind::Established, T).unwrap();
    let sge = s2.buf.sge(0, 16).unwrap();
    let wr = SendWr::rdma_read(3, from_ref(&sge), buf.mr().remote_addr(WIN_OFF), key);
    s2.qp.post_send(&[wr]).unwrap();
    let wcs = wait_cqes(&p.fabric, &s2.cq, 1);
    assert_eq!(wcs[0].status(), WcStatus::REM_ACCESS_ERR);
    // Through its own QP the window still works.
    assert_eq!(server_read(&p, &buf, WIN_OFF, 8, key).0, WcStatus::SUCCESS);
    drop((c2, s2));
}

#[test]
fn only_the_qp_that_bound_a_window_may_invalidate_it() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let key = bind(&p, &mw, &buf, RW);
    let o = Opts::default();
    let c2 = client_connect_on(&p.vc, &o, b"", Some(&p.client.pd));
    let s2 = server_accept(&p.fabric, &p.server.ch, &o, b"");
    c2.ch.wait_event(CmEventKind::Established, T).unwrap();
    // A SEND_WITH_INVALIDATE arriving on the other QP is a remote invalid request ...
    let sge = s2.buf.sge(SEND_AREA, 1).unwrap();
    s2.qp
        .post_send(&[SendWr::send_with_invalidate(1, from_ref(&sge), key)])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &s2.cq, 1);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::REM_INV_REQ_ERR)]);
    assert!(c2.qp.is_error());
    // ... and the window stayed valid for its own QP.
    assert_eq!(server_read(&p, &buf, WIN_OFF, 8, key).0, WcStatus::SUCCESS);
}

#[test]
fn dropping_a_window_revokes_its_key() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let key = bind(&p, &mw, &buf, RW);
    drop(mw);
    assert_eq!(
        server_read(&p, &buf, WIN_OFF, 8, key).0,
        WcStatus::REM_ACCESS_ERR
    );
}

#[test]
fn a_window_keeps_its_region_registered() {
    let p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let mut b2 = DmaBuf::<SimVerbs>::new(&p.client.pd, 4096, buf.mr().access()).unwrap();
    b2.write_at(WIN_OFF, b"kept alive");
    let key = bind(&p, &mw, &b2, RW);
    let addr = b2.mr().remote_addr(WIN_OFF);
    // The window holds the region: the buffer's owner letting go does not deregister it.
    drop(b2);
    let sge = p.server.buf.sge(0, 10).unwrap();
    p.server
        .qp
        .post_send(&[SendWr::rdma_read(4, from_ref(&sge), addr, key)])
        .unwrap();
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(statuses(&wcs), vec![(4, WcStatus::SUCCESS)]);
    assert_eq!(read(&p.server, 0, 10), b"kept alive");
    drop(buf);
}

#[test]
fn a_bind_runs_once_in_order_across_an_rnr_retry() {
    // The server posts no receive at first: the first SEND is RNR NAK'd and the queue
    // rewinds to it, behind which the bind has already run. It must not run again (a
    // second bind of the now-valid window would fail).
    let mut p = connect_pair(Opts {
        windows: true,
        server_recvs: 0,
        ..Opts::default()
    });
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let sge = stage(&mut p.client, b"cmd");
    let wrs = [
        SendWr::send(1, from_ref(&sge)),
        SendWr::bind_mw(2, &mw, buf.mr(), WIN_OFF, WIN_LEN, RW),
        SendWr::send(3, from_ref(&sge)),
    ];
    p.client.qp.post_send(&wrs).unwrap();
    let key = mw.rkey();
    // Let the RNR NAK come back, then give the server receives.
    p.fabric.advance(Duration::from_micros(50));
    assert!(p.fabric.stats().rnr_naks >= 1);
    let sges: Vec<Sge> = (0..2).map(|i| recv_sge(&p.server.buf, i)).collect();
    let rwrs: Vec<RecvWr> = (0..2)
        .map(|i| RecvWr::new(200 + i as u64, from_ref(&sges[i])))
        .collect();
    p.server.srq.as_ref().unwrap().post_recv(&rwrs).unwrap();
    let wcs = wait_cqes(&p.fabric, &p.client.cq, 3);
    assert_eq!(
        statuses(&wcs),
        vec![
            (1, WcStatus::SUCCESS),
            (2, WcStatus::SUCCESS),
            (3, WcStatus::SUCCESS)
        ]
    );
    let recvs = wait_cqes(&p.fabric, &p.server.cq, 2);
    assert_eq!(
        statuses(&recvs),
        vec![(200, WcStatus::SUCCESS), (201, WcStatus::SUCCESS)]
    );
    assert_eq!(server_read(&p, &buf, WIN_OFF, 8, key).0, WcStatus::SUCCESS);
}

#[test]
fn a_stray_write_lands_with_a_live_key_and_not_with_an_invalidated_one() {
    let mut p = mw_pair();
    let buf = bindable(&p);
    let mw = SimVerbs::alloc_mw(&p.client.pd).unwrap();
    let key = bind(&p, &mw, &buf, RW);
    let addr = buf.mr().remote_addr(WIN_OFF);
    let server = p.server.qp.qp_num();
    // While the key is valid, a write the server's owner never posted lands (the window
    // cannot tell) ...
    assert!(p.fabric.faults().stray_write(server, addr, key, b"early"));
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(statuses(&wcs), vec![(STRAY_WR_ID, WcStatus::SUCCESS)]);
    assert_eq!(client_bytes(&buf, WIN_OFF, 5), b"early");
    // ... and once the server invalidated it with its response, it does not.
    let sge = stage(&mut p.server, b"done");
    p.server
        .qp
        .post_send(&[SendWr::send_with_invalidate(1, from_ref(&sge), key)])
        .unwrap();
    assert_eq!(
        statuses(&wait_cqes(&p.fabric, &p.server.cq, 1)),
        vec![(1, WcStatus::SUCCESS)]
    );
    assert!(p.fabric.faults().stray_write(server, addr, key, b"late!"));
    let wcs = wait_cqes(&p.fabric, &p.server.cq, 1);
    assert_eq!(
        statuses(&wcs),
        vec![(STRAY_WR_ID, WcStatus::REM_ACCESS_ERR)]
    );
    assert_eq!(client_bytes(&buf, WIN_OFF, 5), b"early");
    assert_eq!(
        p.client.ctx.take_async_event().map(|e| e.kind),
        Some(SimAsyncEventKind::QpAccessErr)
    );
    assert!(!p.fabric.faults().stray_write(0xdead, addr, key, b"x"));
}

#[test]
fn a_bind_of_objects_that_are_not_the_sims_is_refused() {
    let p = mw_pair();
    let buf = bindable(&p);
    let not_a_window = 0u32;
    let wr = SendWr::new(
        1,
        crate::rdma::wr::SendOp::BindMw(crate::rdma::wr::MwBind {
            mw: &not_a_window,
            mr: buf.mr(),
            offset: 0,
            len: 64,
            access: RW,
            rkey: 0x100,
        }),
        crate::rdma::wr::Payload::Sges(&[]),
    );
    assert!(matches!(
        p.client.qp.post_send(&[wr]),
        Err(RdmaError::InvalidArgument(_))
    ));
    assert_eq!(p.client.qp.send_queue_used(), 0);
}

#[test]
fn windows_are_send() {
    fn send<T: Send + 'static>() {}
    send::<SimMw>();
}

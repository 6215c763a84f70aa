//! The host library against a live NVMe-oF RDMA target: connect and bring-up, every I/O
//! command (Write in-capsule and keyed, Read, Compare, Write Zeroes, Dataset Management,
//! Flush, as the controller's ONCS allows), two qpairs on two threads, keep-alive across
//! more than a KATO of idle time, clean disconnect.
//!
//! Data keys: `NVMF_RDMA_TEST_MEMORY_WINDOWS` (auto, on, off; default auto) picks
//! [`MemoryWindows`]. With windows every keyed command's key must be invalidated, by the
//! target's SEND_WITH_INVALIDATE or by our LOCAL_INV; `NVMF_RDMA_TEST_INVALIDATION=remote|local`
//! says which one this target must have caused (our target does not invalidate remotely on
//! soft-RoCE). A second test runs the same data path with the pool registration's key.
//!
//! Runs only when `NVMF_RDMA_TEST_ADDR` names the target's address (a target must listen
//! there; the lab scenarios `initiator-*` set one up). `NVMF_RDMA_TEST_PORT` (4420) and
//! `NVMF_RDMA_TEST_SUBNQN` (nqn.2016-06.io.spdk:cnode1) pick the subsystem; namespace 1 is
//! written to. Needs `ulimit -l unlimited`.

use std::time::{Duration, Instant};

use nvmf_common::buffer::BufferPool;
use nvmf_common::spec::identify::{ONCS_COMPARE, ONCS_DSM, ONCS_WRITE_ZEROES};
use nvmf_common::spec::{DsmRange, Status};
use nvmf_initiator::{
    Controller, ControllerOptions, IoCompletion, IoQpair, IoStatus, MemoryWindows, TransportId,
};
use zerocopy::IntoBytes;

fn target() -> Option<TransportId> {
    let addr = match std::env::var("NVMF_RDMA_TEST_ADDR") {
        Ok(a) => a,
        Err(_) => {
            eprintln!("skipping: set NVMF_RDMA_TEST_ADDR to an NVMe-oF RDMA target's address");
            return None;
        }
    };
    let port = std::env::var("NVMF_RDMA_TEST_PORT").map_or(4420, |p| p.parse().expect("port"));
    let nqn = std::env::var("NVMF_RDMA_TEST_SUBNQN")
        .unwrap_or_else(|_| "nqn.2016-06.io.spdk:cnode1".into());
    Some(TransportId::rdma(&addr, port, &nqn))
}

/// Polls `qp` until `n` completions arrived; fails after 30 s.
fn wait(qp: &mut IoQpair, n: usize) -> Vec<IoCompletion> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::with_capacity(64);
    let mut got = Vec::new();
    while got.len() < n {
        qp.poll(&mut out);
        got.append(&mut out);
        assert!(
            Instant::now() < deadline,
            "timed out: {} of {n} completions",
            got.len()
        );
    }
    got
}

fn one(qp: &mut IoQpair) -> IoCompletion {
    wait(qp, 1).pop().unwrap()
}

/// Writes one block (in-capsule when the controller takes it) and 64 KiB (keyed), reads
/// both back and compares them (as ONCS allows). Returns how many commands carried a key.
fn write_read_compare(
    qp: &mut IoQpair,
    pool: &BufferPool,
    bs: usize,
    in_capsule: u32,
    oncs: u16,
) -> u64 {
    let mut keyed = 0;
    for (lba, len) in [(8u64, bs), (64u64, 64 * 1024)] {
        if len > in_capsule as usize {
            keyed += 1;
        }
        let mut b = pool.get().unwrap();
        b.set_len(len);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i as u64 ^ lba) as u8;
        }
        let nlb = (len / bs) as u32;
        qp.write(1, lba, nlb, b, lba).unwrap();
        let c = one(qp);
        assert!(c.status.is_success(), "write {len} at {lba}: {}", c.status);
        assert_eq!(c.tag, lba);
        let b = c.buf.expect("buffer back");
        qp.read(
            1,
            lba,
            nlb,
            {
                let mut r = b;
                r.iter_mut().for_each(|x| *x = 0);
                r
            },
            1000 + lba,
        )
        .unwrap();
        let c = one(qp);
        keyed += 1;
        assert!(c.status.is_success(), "read: {}", c.status);
        let r = c.buf.unwrap();
        assert!(
            r.iter()
                .enumerate()
                .all(|(i, &x)| x == (i as u64 ^ lba) as u8),
            "data at {lba} differs"
        );
        if oncs & ONCS_COMPARE != 0 {
            qp.compare(1, lba, nlb, r, 0).unwrap();
            let c = one(qp);
            assert!(c.status.is_success(), "compare equal: {}", c.status);
            if len > in_capsule as usize {
                keyed += 2;
            }
            let mut r = c.buf.unwrap();
            r[0] ^= 0xFF;
            qp.compare(1, lba, nlb, r, 0).unwrap();
            let c = one(qp);
            assert!(
                matches!(c.status, IoStatus::Nvme(s) if s.same_code(Status::COMPARE_FAILURE)),
                "compare different: {}",
                c.status
            );
        }
    }
    keyed
}

/// With windows, every keyed command's key was invalidated, the way the target is expected
/// to cause (`NVMF_RDMA_TEST_INVALIDATION`); without, nothing was.
fn check_invalidations(qp: &IoQpair, windows: bool, keyed: u64) {
    let st = qp.stats();
    eprintln!(
        "keys: {keyed} keyed commands, {} invalidated by the target, {} locally",
        st.remote_invalidations, st.local_invalidations
    );
    if !windows {
        assert_eq!(st.remote_invalidations + st.local_invalidations, 0);
        return;
    }
    assert_eq!(st.remote_invalidations + st.local_invalidations, keyed);
    match std::env::var("NVMF_RDMA_TEST_INVALIDATION").as_deref() {
        Ok("remote") => assert_eq!(st.local_invalidations, 0, "{st:?}"),
        Ok("local") => assert_eq!(st.remote_invalidations, 0, "{st:?}"),
        _ => {}
    }
}

#[test]
fn io_commands_keep_alive_and_threads() {
    let Some(tid) = target() else { return };
    let opts = ControllerOptions {
        io_queues: 2,
        io_queue_depth: 16,
        kato: Duration::from_secs(2),
        memory_windows: std::env::var("NVMF_RDMA_TEST_MEMORY_WINDOWS")
            .map_or(MemoryWindows::Auto, |v| v.parse().expect("auto, on or off")),
        ..ControllerOptions::default()
    };
    let mut ctrl = Controller::connect(&tid, opts).expect("connect");
    let oncs = ctrl.identify().oncs.get();
    eprintln!(
        "cntlid {} vs {:#x} in-capsule {} max transfer {} oncs {oncs:#x}",
        ctrl.info().cntlid,
        ctrl.info().vs.0,
        ctrl.in_capsule_size(),
        ctrl.max_transfer()
    );
    let ns = ctrl
        .namespace(1)
        .expect("identify ns")
        .expect("namespace 1 active");
    let bs = ns.block_size as usize;
    let pool = BufferPool::new(64 * 1024, 16).unwrap();
    ctrl.register_pool(&pool).expect("register pool");
    let mut qps = ctrl.take_io_qpairs();
    assert_eq!(qps.len(), 2);
    let mut qp = qps.remove(0);

    let windows = ctrl.uses_memory_windows();
    eprintln!("memory windows: {windows}");
    let keyed = write_read_compare(&mut qp, &pool, bs, ctrl.in_capsule_size(), oncs);
    check_invalidations(&qp, windows, keyed);

    if oncs & ONCS_WRITE_ZEROES != 0 {
        qp.write_zeroes(1, 64, 4, false, 7).unwrap();
        assert!(one(&mut qp).status.is_success());
        let mut b = pool.get().unwrap();
        b.set_len(4 * bs);
        b.iter_mut().for_each(|x| *x = 0xAA);
        qp.read(1, 64, 4, b, 8).unwrap();
        let c = one(&mut qp);
        assert!(
            c.buf.unwrap().iter().all(|&x| x == 0),
            "write zeroes left data"
        );
    }
    if oncs & ONCS_DSM != 0 {
        let mut b = pool.get().unwrap();
        let range = DsmRange {
            cattr: 0.into(),
            nlb: 8u32.into(),
            slba: 128u64.into(),
        };
        b.set_len(16);
        b.copy_from_slice(range.as_bytes());
        qp.dataset_management(1, 1, true, b, 9).unwrap();
        let c = one(&mut qp);
        assert!(c.status.is_success(), "dsm: {}", c.status);
    }
    qp.flush(1, 10).unwrap();
    assert!(one(&mut qp).status.is_success(), "flush");
    // An out-of-range read fails with an NVMe status, and the qpair stays usable.
    let b = pool.get().unwrap();
    let mut b = b;
    b.set_len(bs);
    qp.read(1, ns.blocks, 1, b, 11).unwrap();
    let c = one(&mut qp);
    assert!(
        matches!(c.status, IoStatus::Nvme(s) if !s.is_success()),
        "out of range: {}",
        c.status
    );

    // Both qpairs on their own threads, full depth, while this thread keeps the admin
    // queue alive for longer than KATO.
    qps.insert(0, qp);
    let handles: Vec<_> = qps
        .into_iter()
        .enumerate()
        .map(|(t, mut qp)| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut done = 0;
                let mut out = Vec::with_capacity(16);
                let deadline = Instant::now() + Duration::from_secs(3);
                let mut next = 0u64;
                for _ in 0..4 {
                    let mut b = pool.get().unwrap();
                    b.set_len(bs);
                    qp.read(1, (t as u64 * 1000 + next) % ns.blocks, 1, b, next)
                        .unwrap();
                    next += 1;
                }
                while Instant::now() < deadline || qp.outstanding() > 0 {
                    qp.poll(&mut out);
                    for c in out.drain(..) {
                        assert!(c.status.is_success(), "thread {t}: {}", c.status);
                        done += 1;
                        if Instant::now() < deadline {
                            qp.read(
                                1,
                                (t as u64 * 1000 + next) % ns.blocks,
                                1,
                                c.buf.unwrap(),
                                next,
                            )
                            .unwrap();
                            next += 1;
                        }
                    }
                }
                (qp, done)
            })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let events = ctrl.poll_admin().expect("controller stays live");
        assert!(events.is_empty(), "unexpected events {events:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    for h in handles {
        let (qp, done) = h.join().unwrap();
        eprintln!("qpair {}: {done} reads", qp.qid());
        assert!(done > 0);
        assert_eq!(qp.stats().timeouts, 0);
        qp.disconnect();
    }
    assert!(ctrl.is_live());
    ctrl.disconnect().expect("clean shutdown");
}

#[test]
fn pool_keys_without_memory_windows() {
    let Some(tid) = target() else { return };
    let opts = ControllerOptions {
        io_queues: 1,
        io_queue_depth: 8,
        memory_windows: MemoryWindows::Off,
        ..ControllerOptions::default()
    };
    let mut ctrl = Controller::connect(&tid, opts).expect("connect");
    assert!(!ctrl.uses_memory_windows());
    let oncs = ctrl.identify().oncs.get();
    let bs = ctrl
        .namespace(1)
        .expect("identify ns")
        .expect("namespace 1 active")
        .block_size as usize;
    let pool = BufferPool::new(64 * 1024, 4).unwrap();
    ctrl.register_pool(&pool).expect("register pool");
    let mut qp = ctrl.take_io_qpairs().pop().unwrap();
    let keyed = write_read_compare(&mut qp, &pool, bs, ctrl.in_capsule_size(), oncs);
    assert!(keyed > 0);
    check_invalidations(&qp, false, keyed);
    qp.disconnect();
    ctrl.disconnect().expect("clean shutdown");
}

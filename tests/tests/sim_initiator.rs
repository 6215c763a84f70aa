//! The initiator (`nvmf-initiator`) over the simulated RDMA fabric against the real target,
//! with no VM and no RDMA device: reads and writes verified through keyed SGLs and in-capsule
//! data, per-command keys through memory windows, a reconnect after the target restarts, and
//! keep-alive expiry (issue 11).
//!
//! # Driving both sides from one thread
//!
//! The initiator blocks: its connect waits for CM events and for admin completions, and every
//! idle wait goes through its verbs provider (`Verbs::sleep`, `VerbsChannel::wait_event`).
//! Over the sim both run the fabric's idle hook, then step the fabric in virtual time. The
//! hook here runs the target's side of one turn ([`SimLab::target_turn`]: the acceptor, then
//! each reactor), so the target answers while the initiator waits.
//!
//! The hook must be `Fn() + Send + Sync`, and the target is not `Send` (a `PollGroup` holds
//! `Box<dyn TransportPollGroup>`, which has no `Send` bound; reactors build theirs on their
//! own thread). So the [`SimLab`] lives in a `thread_local!` `RefCell` of the test's thread,
//! and the hook is a plain function that captures nothing and reaches the lab through the
//! thread-local. Every test is single-threaded, so the hook runs on that thread. Why it is
//! sound, without `unsafe`:
//!
//! - Re-entry: the sim marks the hook running while it runs, so a `sleep` or `wait_event`
//!   inside it (the target has none today) does not call it again.
//! - Borrows: the test reaches the lab only through [`Rig::lab`], whose closures never call
//!   the initiator, so nothing inside them waits through the provider and runs the hook. The
//!   hook takes the lab with `try_borrow_mut`: were the target itself ever to idle through
//!   the provider inside a turn the test drives, the hook would find the lab busy and skip
//!   the turn (the target is then already running on this stack) instead of panicking.
//! - Another thread running the hook would find its own, empty, thread-local and do nothing.
//! - A stopped target (see [`Rig::stop_target`]) is simply absent: the hook does nothing,
//!   as a dead target process answers nothing.
//!
//! All time is the fabric's: the target's core clock is its `clock_ms`, the initiator's
//! deadlines, keep-alive and reconnect delays are `SimVerbs::now`, and the polling loops here
//! advance it with `SimVerbs::sleep`. Seconds of virtual time take milliseconds of wall time.
//!
//! Memory windows: the sim's default device has none, so most tests' keyed SGLs carry the
//! buffer pool registration's key. Devices made with `windows_device_attr` have type 2B
//! windows and the invalidation verbs; there the initiator gives each keyed command its own
//! window key, the target invalidates it with SEND_WITH_INVALIDATE (or, on a target device
//! without remote invalidation, the initiator with LOCAL_INV), and a stale key reaches
//! nothing (`Faults::stray_write`).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use nvmf_common::buffer::{BufferPool, IoBuf};
use nvmf_common::rdma::sim::{
    default_device_attr, windows_device_attr, DeliveredKind, HostRx, SimAsyncEventKind, SimConfig,
    SimFabric, SimStats, SimVerbs,
};
use nvmf_common::rdma::{DeviceAttr, Verbs};
use nvmf_common::spec::{Command, SglKind, Status};
use nvmf_initiator::{
    Controller, ControllerEvent, ControllerOptions, Error, IoCompletion, IoQpair, IoStatus,
    MemoryWindows, QpairState, Reconnect, SubmitErrorKind, TransportId, MAX_RETRIES,
};
use nvmf_target::bdev::BdevRef;
use nvmf_target::core::controller::ControllerShared;
use nvmf_target::transport::options::TransportOptions;
use nvmf_tests::sim::{host_ip, pattern, small_options, target_ip, SimLab, HOSTNQN, PORT, SUBNQN};

const BLOCK: usize = 512;
/// Blocks of the lab's Malloc0 (2 MiB).
const NS_BLOCKS: u64 = 4096;
const KIB: usize = 1024;
/// Virtual time a polling loop gives the fabric between two polls.
const TICK: Duration = Duration::from_micros(20);
/// The fabric's one-way delay is at most 5 us; a command's round trip with its data takes
/// a few turns. Any single I/O wait beyond this is a hang.
const IO_LIMIT: Duration = Duration::from_secs(1);
/// Bytes of a command capsule without in-capsule data.
const SQE: u64 = 64;

thread_local! {
    /// The target of this thread's test, for the idle hook (see the module docs).
    static LAB: RefCell<Option<SimLab>> = const { RefCell::new(None) };
}

/// The fabric's idle hook: one target turn, if there is a target and nobody holds it.
fn idle_hook() {
    LAB.with(|cell| {
        if let Ok(mut lab) = cell.try_borrow_mut() {
            if let Some(lab) = lab.as_mut() {
                lab.target_turn();
            }
        }
    });
}

/// The lab's small transport, with a keep-alive granularity of 100 ms and a smallest KATO of
/// 1 s (SPDK's defaults are 10 s for both), so a host may ask for a 1 s KATO.
fn target_options() -> TransportOptions {
    let mut o = small_options();
    o.kas = 1;
    o.min_kato = 1000;
    o
}

/// A fabric with the target (in [`LAB`]) and one initiator host; the idle hook installed.
struct Rig {
    fabric: SimFabric,
    host: SimVerbs,
    opts: TransportOptions,
    /// The target's host and bdev while the target is stopped.
    down: Option<(SimVerbs, BdevRef)>,
}

/// The devices of a rig's target and initiator host, and its fabric.
struct Devices {
    cfg: SimConfig,
    target: DeviceAttr,
    host: DeviceAttr,
    host_name: &'static str,
}

impl Devices {
    fn plain(seed: u64) -> Self {
        Self {
            cfg: SimLab::fabric_config(seed),
            target: default_device_attr(),
            host: default_device_attr(),
            host_name: "sim-host",
        }
    }

    /// Both ends with type 2B memory windows and remote invalidation.
    fn windows(seed: u64) -> Self {
        Self {
            target: windows_device_attr(),
            host: windows_device_attr(),
            ..Self::plain(seed)
        }
    }
}

impl Rig {
    fn new(seed: u64, opts: TransportOptions) -> Self {
        Self::with_devices(Devices::plain(seed), opts)
    }

    fn with_devices(dev: Devices, opts: TransportOptions) -> Self {
        let lab = SimLab::with_fabric(dev.cfg, opts.clone(), 1, dev.target);
        let fabric = lab.fabric.clone();
        let host = fabric.add_host_with(host_ip(1), dev.host, dev.host_name);
        LAB.with(|cell| {
            let mut slot = cell.borrow_mut();
            assert!(slot.is_none(), "one rig per thread at a time");
            *slot = Some(lab);
        });
        fabric.set_idle_hook(Some(Arc::new(idle_hook)));
        Self {
            fabric,
            host,
            opts,
            down: None,
        }
    }

    /// The target, for the test to drive or inspect. `f` must not call the initiator.
    fn lab<R>(&self, f: impl FnOnce(&mut SimLab) -> R) -> R {
        LAB.with(|cell| f(cell.borrow_mut().as_mut().expect("the target is running")))
    }

    /// Kills the target (see [`SimLab::stop`]); the hook then has nothing to run.
    fn stop_target(&mut self) {
        let lab = LAB
            .with(|cell| cell.borrow_mut().take())
            .expect("the target is running");
        let (_, verbs, bdev) = lab.stop();
        self.down = Some((verbs, bdev));
    }

    /// A new target process on the same host and address, serving the same bdev.
    fn start_target(&mut self) {
        let (verbs, bdev) = self.down.take().expect("the target is stopped");
        let lab = SimLab::on_host(self.fabric.clone(), verbs, bdev, self.opts.clone(), 1);
        LAB.with(|cell| *cell.borrow_mut() = Some(lab));
    }

    /// The target's controllers of [`SUBNQN`].
    fn target_controllers(&self) -> Vec<Arc<ControllerShared>> {
        self.lab(|lab| lab.target.subsystem(SUBNQN).unwrap().shared.controllers())
    }

    fn target_qpairs(&self) -> usize {
        self.lab(|lab| lab.total_resources().qpairs)
    }

    fn target_rx(&self) -> HostRx {
        self.fabric.host_rx(target_ip()).expect("the target's host")
    }

    fn host_rx(&self) -> HostRx {
        self.fabric
            .host_rx(host_ip(1))
            .expect("the initiator's host")
    }

    fn now_ms(&self) -> u64 {
        self.fabric.now_ns() / 1_000_000
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.fabric.set_idle_hook(None);
        let lab = LAB.with(|cell| cell.try_borrow_mut().ok().and_then(|mut l| l.take()));
        drop(lab);
    }
}

fn tid() -> TransportId {
    TransportId::rdma(&target_ip().to_string(), PORT, SUBNQN)
}

/// What every test's host asks for; fixed host identity, short timeouts, one I/O queue.
fn host_options() -> ControllerOptions {
    ControllerOptions {
        hostnqn: Some(HOSTNQN.into()),
        hostid: Some([0x11; 16]),
        io_queues_requested: 1,
        io_queue_depth: 32,
        connect_timeout: Duration::from_secs(2),
        admin_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

/// The initiator: a controller, one I/O qpair and a registered pool of 128 KiB buffers.
struct Host {
    // Field order is drop order: the qpair before its controller.
    qp: IoQpair<SimVerbs>,
    ctrl: Controller<SimVerbs>,
    pool: BufferPool,
    verbs: SimVerbs,
    events: Vec<ControllerEvent>,
    done: Vec<IoCompletion>,
}

impl Host {
    /// Connects (the target runs from the idle hook while the initiator waits).
    fn connect(rig: &Rig, opts: ControllerOptions) -> Self {
        let mut ctrl = Controller::connect_with(rig.host.clone(), &tid(), opts)
            .expect("the initiator connects over the simulated fabric");
        let qp = ctrl.create_io_qpair(32).expect("an I/O qpair");
        let pool = BufferPool::new(128 * KIB, 16).expect("buffer pool");
        ctrl.register_pool(&pool).expect("pool registered");
        Self {
            qp,
            ctrl,
            pool,
            verbs: rig.host.clone(),
            events: Vec::new(),
            done: Vec::with_capacity(64),
        }
    }

    /// What a host application's loop does: the admin side (keep-alive, reconnect), then the
    /// I/O qpair.
    fn pump(&mut self) {
        match self.ctrl.poll_admin() {
            Ok(ev) => self.events.extend(ev),
            Err(e) => panic!("controller lost: {e}"),
        }
        self.qp.poll(&mut self.done);
    }

    /// Pumps and idles for `d` of virtual time, `step` at a time.
    fn run_for(&mut self, d: Duration, step: Duration) {
        let end = self.verbs.now() + d;
        while self.verbs.now() < end {
            self.pump();
            self.verbs.sleep(step);
        }
    }

    /// Pumps until `n` completions have come (at most `limit` of virtual time).
    fn wait(&mut self, n: usize, limit: Duration) -> Vec<IoCompletion> {
        let deadline = self.verbs.now() + limit;
        loop {
            self.pump();
            if self.done.len() >= n {
                return std::mem::take(&mut self.done);
            }
            assert!(
                self.verbs.now() < deadline,
                "{} of {n} completions after {limit:?}: {:?}",
                self.done.len(),
                self.done
            );
            self.verbs.sleep(TICK);
        }
    }

    fn buf(&self, len: usize) -> IoBuf {
        let mut b = self.pool.get().expect("a free buffer");
        b.set_len(len);
        b
    }

    fn submit_write(&mut self, slba: u64, data: &[u8], tag: u64) {
        let mut b = self.buf(data.len());
        b.as_mut_slice().copy_from_slice(data);
        let nlb = (data.len() / BLOCK) as u32;
        self.qp
            .write(1, slba, nlb, b, tag)
            .expect("write submitted");
    }

    fn submit_read(&mut self, slba: u64, len: usize, tag: u64) {
        let b = self.buf(len);
        let nlb = (len / BLOCK) as u32;
        self.qp.read(1, slba, nlb, b, tag).expect("read submitted");
    }

    fn write(&mut self, slba: u64, data: &[u8]) {
        self.submit_write(slba, data, 0);
        let c = self.wait(1, IO_LIMIT);
        assert!(c[0].status.is_success(), "write at {slba}: {}", c[0].status);
    }

    fn read(&mut self, slba: u64, len: usize) -> Vec<u8> {
        self.submit_read(slba, len, 0);
        let c = self.wait(1, IO_LIMIT);
        assert!(c[0].status.is_success(), "read at {slba}: {}", c[0].status);
        c[0].buf
            .as_ref()
            .expect("the read's buffer")
            .as_slice()
            .to_vec()
    }
}

/// Writes of 4 KiB, 64 KiB and 128 KiB spread over the namespace, to its first and last
/// blocks: (start LBA, bytes).
const SPREAD: [(u64, usize); 7] = [
    (0, 4 * KIB),
    (8, 64 * KIB),
    (136, 128 * KIB),
    (1000, 4 * KIB),
    (2048, 64 * KIB),
    (3000, 512),
    (NS_BLOCKS - 256, 128 * KIB),
];

/// Test 1's I/O: every extent of [`SPREAD`] written with keyed SGLs at once, then read back
/// at once, then an overwrite inside the last extent and a read past the end. Returns what
/// the fabric saw, for the determinism check.
fn keyed_io(seed: u64) -> (SimStats, u64, HostRx, HostRx, Vec<String>) {
    let rig = Rig::new(seed, target_options());
    let mut h = Host::connect(
        &rig,
        ControllerOptions {
            in_capsule_data: false,
            ..host_options()
        },
    );
    assert_eq!(h.ctrl.in_capsule_size(), 0, "in-capsule data is off");
    assert!(
        !h.ctrl.uses_memory_windows(),
        "no windows on the sim's default device"
    );
    assert_eq!(
        h.ctrl.max_transfer(),
        128 * 1024,
        "the target's max_io_size"
    );
    let ns = h.ctrl.namespace(1).unwrap().expect("namespace 1 is active");
    assert_eq!((ns.block_size, ns.blocks), (BLOCK as u32, NS_BLOCKS));

    let (host0, target0) = (rig.host_rx(), rig.target_rx());
    let mut total = 0;
    for (i, &(slba, len)) in SPREAD.iter().enumerate() {
        h.submit_write(slba, &pattern(i as u8 + 1, len), i as u64);
        total += len as u64;
    }
    let done = h.wait(SPREAD.len(), IO_LIMIT);
    for c in &done {
        assert!(c.status.is_success(), "write {}: {}", c.tag, c.status);
    }
    let host1 = rig.host_rx();
    // Keyed writes: the target RDMA READs every byte from the host's buffers, and the
    // capsules carry none.
    assert_eq!(host1.read_bytes - host0.read_bytes, total);
    assert_eq!(
        rig.target_rx().send_bytes - target0.send_bytes,
        SQE * SPREAD.len() as u64
    );

    for (i, &(slba, len)) in SPREAD.iter().enumerate() {
        h.submit_read(slba, len, i as u64);
    }
    let done = h.wait(SPREAD.len(), IO_LIMIT);
    assert_eq!(done.len(), SPREAD.len());
    for c in &done {
        assert!(c.status.is_success(), "read {}: {}", c.tag, c.status);
        let (slba, len) = SPREAD[c.tag as usize];
        let got = c.buf.as_ref().unwrap().as_slice();
        assert!(
            got == pattern(c.tag as u8 + 1, len).as_slice(),
            "read back at LBA {slba} ({len} bytes) differs"
        );
    }
    // Keyed reads: the target RDMA WROTE every byte into the host's buffers.
    assert_eq!(rig.host_rx().write_bytes - host1.write_bytes, total);

    // An overwrite of the namespace's last 4 KiB shows in the 128 KiB extent around it.
    let tail = pattern(200, 4 * KIB);
    h.write(NS_BLOCKS - 8, &tail);
    let mut want = pattern(SPREAD.len() as u8, 128 * KIB);
    want[124 * KIB..].copy_from_slice(&tail);
    assert!(h.read(NS_BLOCKS - 256, 128 * KIB) == want);

    // Past the end: the controller's status comes back.
    h.submit_read(NS_BLOCKS - 4, 4 * KIB, 99);
    let c = h.wait(1, IO_LIMIT);
    match c[0].status {
        IoStatus::Nvme(s) => assert!(s.same_code(Status::LBA_OUT_OF_RANGE), "{s}"),
        other => panic!("read past the end: {other}"),
    }
    // Above the maximum transfer: refused before anything is sent.
    let big = BufferPool::new(256 * KIB, 1).unwrap();
    h.ctrl.register_pool(&big).unwrap();
    let err = h.qp.read(1, 0, 512, big.get().unwrap(), 7).unwrap_err();
    assert_eq!(err.kind, SubmitErrorKind::TooLarge);

    // An orderly disconnect leaves nothing behind on the target.
    let Host { qp, ctrl, .. } = h;
    qp.disconnect();
    ctrl.disconnect().expect("orderly shutdown (CC.SHN)");
    rig.lab(|lab| lab.assert_drained());
    (
        rig.fabric.stats(),
        rig.fabric.now_ns(),
        rig.host_rx(),
        rig.target_rx(),
        rig.fabric.trace(),
    )
}

#[test]
fn keyed_sgl_writes_read_back_across_the_namespace() {
    let (stats, _, host, _, _) = keyed_io(1);
    assert!(stats.packets > 0 && host.read_bytes > 0);
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let a = keyed_io(7);
    let b = keyed_io(7);
    assert_eq!(a, b, "two runs of seed 7 differ");
    let c = keyed_io(8);
    assert_ne!(a.1, c.1, "another seed draws other delays");
}

#[test]
fn small_writes_travel_in_the_capsule() {
    let rig = Rig::new(3, target_options());
    let mut h = Host::connect(
        &rig,
        ControllerOptions {
            // The default, spelled out: writes that fit IOCCSZ go in the capsule.
            in_capsule_data: true,
            ..host_options()
        },
    );
    // The target's default in_capsule_data_size (IOCCSZ 260: 4 KiB after the SQE).
    assert_eq!(h.ctrl.in_capsule_size(), 4096);
    assert_eq!(h.qp.in_capsule_size(), 4096);

    let sizes = [512usize, 1024, 4096];
    let (host0, target0) = (rig.host_rx(), rig.target_rx());
    let mut lba = 100;
    for (i, &len) in sizes.iter().enumerate() {
        h.write(lba, &pattern(50 + i as u8, len));
        lba += (len / BLOCK) as u64;
    }
    // In-capsule: no RDMA READ of the host, the data came in the command SENDs.
    assert_eq!(rig.host_rx().read_bytes, host0.read_bytes, "no RDMA READ");
    let capsules: u64 = sizes.iter().map(|&l| SQE + l as u64).sum();
    assert_eq!(rig.target_rx().send_bytes - target0.send_bytes, capsules);
    assert_eq!(rig.target_rx().sends - target0.sends, sizes.len() as u64);

    // One block over the limit goes keyed.
    let over = pattern(60, 4096 + BLOCK);
    let (host1, target1) = (rig.host_rx(), rig.target_rx());
    h.write(200, &over);
    assert_eq!(
        rig.host_rx().read_bytes - host1.read_bytes,
        over.len() as u64
    );
    assert_eq!(rig.target_rx().send_bytes - target1.send_bytes, SQE);

    // Everything reads back.
    let mut lba = 100;
    for (i, &len) in sizes.iter().enumerate() {
        assert!(h.read(lba, len) == pattern(50 + i as u8, len), "LBA {lba}");
        lba += (len / BLOCK) as u64;
    }
    assert!(h.read(200, over.len()) == over);
    // The three in-capsule writes as one read: nothing between or around them was touched.
    let all = h.read(100, 1024 + 2048 + 4096);
    assert!(all[..512] == pattern(50, 512)[..]);
    assert!(all[512..1536] == pattern(51, 1024)[..]);
    assert!(all[1536..5632] == pattern(52, 4096)[..]);
    assert!(all[5632..].iter().all(|&b| b == 0), "beyond the writes");
}

#[test]
fn in_capsule_size_follows_the_targets_ioccsz() {
    let mut opts = target_options();
    opts.in_capsule_data_size = 8192;
    let rig = Rig::new(4, opts);
    let mut h = Host::connect(&rig, host_options());
    assert_eq!(h.ctrl.in_capsule_size(), 8192);
    let data = pattern(9, 8192);
    let (host0, target0) = (rig.host_rx(), rig.target_rx());
    h.write(64, &data);
    assert_eq!(rig.host_rx().read_bytes, host0.read_bytes, "no RDMA READ");
    assert_eq!(
        rig.target_rx().send_bytes - target0.send_bytes,
        SQE + data.len() as u64
    );
    assert!(h.read(64, data.len()) == data);
}

/// Host options asking for per-command keys, every transfer keyed (no in-capsule data).
fn window_options() -> ControllerOptions {
    ControllerOptions {
        in_capsule_data: false,
        memory_windows: MemoryWindows::On,
        ..host_options()
    }
}

/// Writes every extent of [`SPREAD`] and reads them back, verifying the bytes; returns the
/// number of keyed commands.
fn spread_write_read(h: &mut Host) -> u64 {
    for (i, &(slba, len)) in SPREAD.iter().enumerate() {
        h.submit_write(slba, &pattern(i as u8 + 1, len), i as u64);
    }
    for c in h.wait(SPREAD.len(), IO_LIMIT) {
        assert!(c.status.is_success(), "write {}: {}", c.tag, c.status);
    }
    for (i, &(slba, len)) in SPREAD.iter().enumerate() {
        h.submit_read(slba, len, i as u64);
    }
    for c in h.wait(SPREAD.len(), IO_LIMIT) {
        assert!(c.status.is_success(), "read {}: {}", c.tag, c.status);
        let (slba, len) = SPREAD[c.tag as usize];
        assert!(
            c.buf.as_ref().unwrap().as_slice() == pattern(c.tag as u8 + 1, len).as_slice(),
            "read back at LBA {slba} ({len} bytes) differs"
        );
    }
    2 * SPREAD.len() as u64
}

#[test]
fn memory_windows_key_every_command_and_the_target_invalidates_each_key() {
    let rig = Rig::with_devices(Devices::windows(3), target_options());
    let mut h = Host::connect(&rig, window_options());
    assert!(h.ctrl.uses_memory_windows());
    // The pool is registered for windows only: its own registration has no remote key.
    assert_eq!(h.buf(BLOCK).rkey(), 0);
    let (host0, target0) = (rig.host_rx(), rig.target_rx());
    let keyed = spread_write_read(&mut h);
    // Every byte moved by RDMA through the windows (the capsules carry none).
    let total: u64 = SPREAD.iter().map(|&(_, len)| len as u64).sum();
    let host1 = rig.host_rx();
    assert_eq!(host1.read_bytes - host0.read_bytes, total);
    assert_eq!(host1.write_bytes - host0.write_bytes, total);
    assert_eq!(rig.target_rx().send_bytes - target0.send_bytes, SQE * keyed);
    // The target answered each keyed command with SEND_WITH_INVALIDATE of its key.
    let st = h.qp.stats();
    assert_eq!(
        (st.remote_invalidations, st.local_invalidations),
        (keyed, 0),
        "{st:?}"
    );
    let Host { qp, ctrl, .. } = h;
    qp.disconnect();
    ctrl.disconnect().expect("orderly shutdown (CC.SHN)");
    rig.lab(|lab| lab.assert_drained());
}

#[test]
fn without_remote_invalidation_the_initiator_invalidates_each_key_itself() {
    // The target's device has no memory management extensions: it answers with plain
    // SENDs, and the initiator posts a LOCAL_INV of the command's key before completing it.
    let dev = Devices {
        target: default_device_attr(),
        ..Devices::windows(4)
    };
    let rig = Rig::with_devices(dev, target_options());
    let mut h = Host::connect(&rig, window_options());
    assert!(h.ctrl.uses_memory_windows());
    let keyed = spread_write_read(&mut h);
    let st = h.qp.stats();
    assert_eq!(
        (st.remote_invalidations, st.local_invalidations),
        (0, keyed),
        "{st:?}"
    );
}

#[test]
fn auto_uses_windows_except_on_soft_roce() {
    let auto = || ControllerOptions {
        memory_windows: MemoryWindows::Auto,
        ..host_options()
    };
    {
        let rig = Rig::with_devices(Devices::windows(5), target_options());
        let h = Host::connect(&rig, auto());
        assert!(h.ctrl.uses_memory_windows(), "a device with windows");
    }
    {
        let dev = Devices {
            host_name: "rxe0",
            ..Devices::windows(5)
        };
        let rig = Rig::with_devices(dev, target_options());
        let h = Host::connect(&rig, auto());
        assert!(!h.ctrl.uses_memory_windows(), "soft-RoCE is left out");
        let mut h2 = Host::connect(
            &rig,
            ControllerOptions {
                memory_windows: MemoryWindows::On,
                ..host_options()
            },
        );
        assert!(h2.ctrl.uses_memory_windows(), "unless asked for");
        h2.write(0, &pattern(9, 4 * KIB));
        assert!(h2.read(0, 4 * KIB) == pattern(9, 4 * KIB));
    }
    {
        let rig = Rig::new(5, target_options());
        let h = Host::connect(
            &rig,
            ControllerOptions {
                memory_windows: MemoryWindows::On,
                ..host_options()
            },
        );
        assert!(!h.ctrl.uses_memory_windows(), "a device without windows");
    }
}

#[test]
fn a_late_write_with_a_completed_commands_key_reaches_nothing() {
    let mut dev = Devices::windows(6);
    dev.cfg.record_payloads = true;
    let rig = Rig::with_devices(dev, target_options());
    let mut h = Host::connect(&rig, window_options());
    h.write(0, &pattern(7, 4 * KIB));
    // A keyed read: the target RDMA WRITEs into the buffer through the command's window.
    h.submit_read(0, 4 * KIB, 1);
    let c = h.wait(1, IO_LIMIT).remove(0);
    assert!(c.status.is_success(), "{}", c.status);
    let buf = c.buf.expect("the read's buffer");
    assert!(buf.as_slice() == pattern(7, 4 * KIB).as_slice());

    // The read's capsule, as the target received it: the window's key and the buffer.
    let capsule = rig
        .fabric
        .delivered(target_ip())
        .into_iter()
        .rev()
        .find(|d| d.kind == DeliveredKind::Send && d.data.len() == SQE as usize)
        .expect("the read's capsule");
    let (cmd, _) = <Command as zerocopy::FromBytes>::read_from_prefix(&capsule.data).unwrap();
    let SglKind::Keyed {
        addr,
        len,
        key,
        invalidate,
    } = cmd.dptr.classify()
    else {
        panic!("a keyed SGL: {:?}", cmd.dptr);
    };
    assert_eq!((addr, len as usize), (buf.addr(), 4 * KIB));
    assert!(
        invalidate,
        "the initiator asks the target to invalidate the key"
    );
    assert_eq!(h.qp.stats().remote_invalidations, 2, "write and read");

    // The target's QP writes there again with that key, after the command completed (a
    // buggy or hostile target): the write fails at the initiator's device and the buffer
    // keeps what the read returned.
    let writes = rig.host_rx().writes;
    rig.fabric.take_async_events_of(&rig.host);
    assert!(rig
        .fabric
        .faults()
        .stray_write(capsule.qp_num, addr, key, &[0xee; 512]));
    rig.fabric.advance(Duration::from_millis(1));
    assert!(
        buf.as_slice() == pattern(7, 4 * KIB).as_slice(),
        "nothing landed"
    );
    assert_eq!(rig.host_rx().writes, writes);
    let events = rig.fabric.take_async_events_of(&rig.host);
    assert!(
        events
            .iter()
            .any(|e| e.kind == SimAsyncEventKind::QpAccessErr),
        "the initiator's device refused the access: {events:?}"
    );
}

#[test]
fn the_initiator_reconnects_to_a_restarted_target_and_resubmits() {
    let mut rig = Rig::new(5, target_options());
    let mut h = Host::connect(
        &rig,
        ControllerOptions {
            reconnect: Some(Reconnect {
                delay: Duration::from_millis(100),
                ctrl_loss_tmo: Some(Duration::from_secs(10)),
            }),
            ..host_options()
        },
    );
    let before = pattern(11, 128 * KIB);
    h.write(2000, &before);
    h.write(0, &pattern(12, 64 * KIB));
    assert!(h.read(2000, before.len()) == before);

    // A write and a read are outstanding when the target dies.
    let during = pattern(13, 64 * KIB);
    h.submit_write(3000, &during, 1);
    h.submit_read(2000, before.len(), 2);
    rig.stop_target();

    // A second of virtual time with the target gone: the initiator notices (the DREQs of the
    // target's CM ids put its QPs in the error state), keeps both commands and retries the
    // connection every 100 ms, refused each time (nothing listens).
    let refused = |rig: &Rig| {
        rig.fabric
            .trace()
            .iter()
            .filter(|l| l.contains("nobody listens"))
            .count()
    };
    let refused0 = refused(&rig);
    h.run_for(Duration::from_secs(1), Duration::from_millis(1));
    let attempts = refused(&rig) - refused0;
    assert!(
        (8..=10).contains(&attempts),
        "{attempts} reconnect attempts in 1 s"
    );
    assert!(
        matches!(h.events.first(), Some(ControllerEvent::Disconnected { .. })),
        "{:?}",
        h.events
    );
    assert_eq!(h.events.len(), 1, "{:?}", h.events);
    assert!(!h.ctrl.is_live());
    assert_eq!(h.qp.state(), QpairState::Reconnecting);
    assert_eq!(h.qp.outstanding(), 2);
    assert!(h.done.is_empty(), "{:?}", h.done);

    // The target comes back with the same bdev; the initiator finds it on its own.
    rig.start_target();
    let done = h.wait(2, Duration::from_secs(5));
    assert!(
        matches!(h.events.last(), Some(ControllerEvent::Reconnected { .. })),
        "{:?}",
        h.events
    );
    assert!(h.ctrl.is_live());
    assert_eq!(h.qp.state(), QpairState::Live);
    let s = h.qp.stats();
    assert_eq!(s.reconnects, 1, "{s:?}");
    assert_eq!(s.requeued, 2, "{s:?}");
    for c in &done {
        assert!(c.status.is_success(), "command {}: {}", c.tag, c.status);
    }
    let read = done.iter().find(|c| c.tag == 2).expect("the read");
    assert!(read.buf.as_ref().unwrap().as_slice() == before.as_slice());

    // The data from before the restart is intact, the resubmitted write landed, and new I/O
    // works.
    assert!(h.read(0, 64 * KIB) == pattern(12, 64 * KIB));
    assert!(h.read(3000, during.len()) == during);
    let after = pattern(14, 4 * KIB);
    h.write(500, &after);
    assert!(h.read(500, after.len()) == after);
    let ctrls = rig.target_controllers();
    assert_eq!(ctrls.len(), 1, "one controller on the new target");
    assert_eq!(ctrls[0].connected_qids(), vec![0, 1]);
}

/// A host with a 1 s KATO and no reconnect, its target-side controller, and the virtual
/// time (ms) just before and just after it connected.
fn kato_host(seed: u64, kato: Duration) -> (Rig, Host, Arc<ControllerShared>, u64, u64) {
    let rig = Rig::new(seed, target_options());
    let t0 = rig.now_ms();
    let h = Host::connect(
        &rig,
        ControllerOptions {
            kato,
            ..host_options()
        },
    );
    let t1 = rig.now_ms();
    let ctrls = rig.target_controllers();
    assert_eq!(ctrls.len(), 1);
    let ctrl = Arc::clone(&ctrls[0]);
    assert_eq!(u128::from(ctrl.kato_ms()), kato.as_millis(), "granted KATO");
    assert!(!ctrl.is_failed());
    assert_eq!(ctrl.connected_qids(), vec![0, 1]);
    drop(ctrls);
    (rig, h, ctrl, t0, t1)
}

#[test]
fn a_host_that_stops_sending_keep_alives_is_failed_by_the_target() {
    let (rig, mut h, target_ctrl, t0, t1) = kato_host(6, Duration::from_secs(1));
    // The application's I/O thread goes on polling its qpair; nobody polls the admin side,
    // so no Keep Alive goes out.
    let sends0 = rig.target_rx().sends;
    let mut failed_at = None;
    let end = h.verbs.now() + Duration::from_secs(3);
    while h.verbs.now() < end {
        h.qp.poll(&mut h.done);
        if failed_at.is_none() && target_ctrl.is_failed() {
            failed_at = Some(rig.now_ms());
        }
        h.verbs.sleep(Duration::from_millis(1));
    }
    assert_eq!(rig.target_rx().sends, sends0, "the host sent nothing");
    let failed_at = failed_at.expect("the target failed the controller");
    // Its last keep-alive was the admin Connect, between t0 and t1; KATO is checked every
    // 10 ms tick.
    assert!(
        failed_at > t0 + 1000 && failed_at <= t1 + 1000 + 25,
        "failed at {failed_at} ms, connected between {t0} and {t1} ms"
    );
    // Every queue of the controller is gone on the target, and the controller with them.
    assert_eq!(rig.target_qpairs(), 0);
    assert!(rig.target_controllers().is_empty());
    // The host saw its queues go: the qpair failed, the controller is lost.
    assert_eq!(h.qp.state(), QpairState::Failed, "{:?}", h.qp.failure());
    assert!(h.done.is_empty());
    match h.ctrl.poll_admin() {
        Err(Error::ControllerLost(why)) => assert!(!why.is_empty()),
        other => panic!("expected the controller lost, got {other:?}"),
    }
    let b = h.buf(4096);
    let err = h.qp.write(1, 0, 8, b, 0).unwrap_err();
    assert_eq!(err.kind, SubmitErrorKind::Failed);
}

#[test]
fn a_polling_host_keeps_its_controller_alive_across_katos() {
    let (rig, mut h, target_ctrl, _, _) = kato_host(7, Duration::from_secs(1));
    let rx0 = rig.target_rx();
    h.run_for(Duration::from_secs(5), Duration::from_millis(1));
    let rx = rig.target_rx();
    // A Keep Alive every KATO / 2: ten in five seconds, each a bare 64-byte capsule.
    let kas = rx.sends - rx0.sends;
    assert!((9..=11).contains(&kas), "{kas} keep-alives in 5 s");
    assert_eq!(rx.send_bytes - rx0.send_bytes, SQE * kas);
    assert!(!target_ctrl.is_failed());
    assert_eq!(target_ctrl.connected_qids(), vec![0, 1]);
    assert_eq!(rig.target_qpairs(), 2);
    assert!(h.events.is_empty(), "{:?}", h.events);
    assert!(h.ctrl.is_live());
    let data = pattern(77, 64 * KIB);
    h.write(10, &data);
    assert!(h.read(10, data.len()) == data);
}

#[test]
fn without_keep_alive_an_idle_host_is_not_expired() {
    let (rig, mut h, target_ctrl, _, _) = kato_host(8, Duration::ZERO);
    let rx0 = rig.target_rx();
    // Five seconds of nobody polling anything: only the target runs.
    rig.lab(|lab| lab.run_for(Duration::from_secs(5), Duration::from_millis(1)));
    assert_eq!(
        rig.target_rx().sends,
        rx0.sends,
        "no Keep Alive with KATO 0"
    );
    assert!(!target_ctrl.is_failed());
    assert_eq!(rig.target_qpairs(), 2);
    h.pump();
    assert!(h.ctrl.is_live());
    let data = pattern(78, 4 * KIB);
    h.write(10, &data);
    assert!(h.read(10, data.len()) == data);
}

/// A command outstanding each time the association breaks (the target dies every time after
/// the initiator reconnected and resent it) is retried MAX_RETRIES times, then fails: it
/// does not go round the reconnects for ever.
#[test]
fn a_command_outstanding_at_every_break_fails_after_its_retries() {
    let mut rig = Rig::new(6, target_options());
    let mut h = Host::connect(
        &rig,
        ControllerOptions {
            reconnect: Some(Reconnect {
                delay: Duration::from_millis(100),
                ctrl_loss_tmo: None,
            }),
            ..host_options()
        },
    );
    h.submit_write(3000, &pattern(21, 4 * KIB), 1);
    rig.stop_target();
    let mut cycles = 0;
    while h.done.is_empty() {
        cycles += 1;
        assert!(
            cycles <= 20,
            "the write is still retried after {cycles} breaks"
        );
        // The broken connection is noticed; the write waits for the next association.
        h.run_for(Duration::from_millis(300), Duration::from_millis(1));
        if !h.done.is_empty() {
            break;
        }
        assert_eq!(h.qp.state(), QpairState::Reconnecting);
        // The target comes back; once the queue is live again (the write resent on it), the
        // target dies before answering.
        rig.start_target();
        let deadline = h.verbs.now() + Duration::from_secs(2);
        while h.qp.state() != QpairState::Live && h.done.is_empty() {
            assert!(h.verbs.now() < deadline, "the queue did not reconnect");
            h.pump();
            h.verbs.sleep(TICK);
        }
        rig.stop_target();
    }
    let done = std::mem::take(&mut h.done);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, 1);
    assert_eq!(done[0].status, IoStatus::PathError, "{}", done[0].status);
    assert_eq!(cycles, usize::from(MAX_RETRIES) + 1);
    assert_eq!(h.qp.stats().requeued, u64::from(MAX_RETRIES));
}

/// A target that takes the admin queue back but refuses every I/O queue (here: a restarted
/// target with a smaller queue depth): each reconnect makes the association live for a
/// moment and the I/O queue's failure resets it. The loss must still end at ctrl_loss_tmo,
/// counted from the first break, not restart with each brief association.
#[test]
fn ctrl_loss_tmo_holds_when_only_the_admin_queue_reconnects() {
    let mut rig = Rig::new(7, target_options());
    let mut h = Host::connect(
        &rig,
        ControllerOptions {
            reconnect: Some(Reconnect {
                delay: Duration::from_millis(100),
                ctrl_loss_tmo: Some(Duration::from_secs(2)),
            }),
            ..host_options()
        },
    );
    rig.stop_target();
    rig.opts.max_queue_depth = 16;
    rig.start_target();
    let start = h.verbs.now();
    let mut reconnects = 0;
    let lost = loop {
        let elapsed = h.verbs.now() - start;
        assert!(
            elapsed < Duration::from_secs(10),
            "still reconnecting after {elapsed:?} ({reconnects} brief associations)"
        );
        match h.ctrl.poll_admin() {
            Ok(events) => {
                reconnects += events
                    .iter()
                    .filter(|e| matches!(e, ControllerEvent::Reconnected { .. }))
                    .count();
            }
            Err(e) => break e,
        }
        h.qp.poll(&mut h.done);
        h.verbs.sleep(Duration::from_millis(1));
    };
    assert!(lost.to_string().contains("ctrl_loss_tmo"), "{lost}");
    assert!(reconnects >= 2, "{reconnects} brief associations");
    let elapsed = h.verbs.now() - start;
    assert!(elapsed < Duration::from_secs(3), "lost after {elapsed:?}");
}

/// An admin command the target never finishes (its ACKs to our SENDs come later than the
/// admin timeout): the call times out, and the association is reset at the next
/// `poll_admin`, as Linux resets on an admin timeout. Left live, the late command's data
/// could land in the admin buffer under the next command's result.
#[test]
fn an_admin_command_that_times_out_resets_the_association() {
    let rig = Rig::new(8, target_options());
    let mut h = Host::connect(
        &rig,
        ControllerOptions {
            admin_timeout: Duration::from_millis(500),
            ..host_options()
        },
    );
    let admin_qp = rig.lab(|lab| {
        lab.queue_qp_numbers(0)
            .into_iter()
            .find(|&(qid, _)| qid == Some(0))
            .map(|(_, n)| n)
            .expect("the admin queue")
    });
    rig.fabric.late_responses(admin_qp, Duration::from_secs(2));
    let e = h
        .ctrl
        .namespace(1)
        .expect_err("the target never finishes it in time");
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(h.ctrl.is_live(), "nothing polled yet");
    rig.fabric.late_responses(admin_qp, Duration::ZERO);
    // The next admin call, before any poll, does not run on the queue the late command may
    // still write into.
    let e = h
        .ctrl
        .namespace(1)
        .expect_err("the admin queue is unusable");
    assert!(e.to_string().contains("unusable"), "{e}");
    match h.ctrl.poll_admin() {
        Err(Error::ControllerLost(why)) => assert!(why.contains("unusable"), "{why}"),
        other => panic!("the association stayed: {other:?}"),
    }
    assert!(!h.ctrl.is_live());
}

/// The initiator's own RDMA device is removed and comes back, as a new device. The
/// controller's PD and every registration on it stay on the old one, so no reconnect can
/// succeed: the controller fails at its first attempt rather than hold the device (whose
/// removal waits for it) until ctrl_loss_tmo, and once the application drops it nothing is
/// left on the device.
#[test]
fn the_initiators_device_removed_fails_the_controller_and_lets_the_device_go() {
    let rig = Rig::new(9, target_options());
    let mut h = Host::connect(
        &rig,
        ControllerOptions {
            reconnect: Some(Reconnect {
                delay: Duration::from_millis(100),
                ctrl_loss_tmo: Some(Duration::from_secs(60)),
            }),
            ..host_options()
        },
    );
    h.write(0, &pattern(21, 4 * KIB));
    rig.fabric.remove_device(host_ip(1));
    rig.fabric.restore_device(host_ip(1));
    let deadline = h.verbs.now() + Duration::from_secs(2);
    let err = loop {
        match h.ctrl.poll_admin() {
            Ok(ev) => h.events.extend(ev),
            Err(e) => break e,
        }
        h.qp.poll(&mut h.done);
        assert!(
            h.verbs.now() < deadline,
            "the controller still tries to reconnect 2 s after its device went: {:?}",
            h.events
        );
        h.verbs.sleep(TICK);
    };
    assert!(err.to_string().contains("was removed"), "{err}");
    assert!(
        matches!(h.events.first(), Some(ControllerEvent::Disconnected { .. })),
        "{:?}",
        h.events
    );
    assert!(rig.fabric.device_objects(host_ip(1)).total() > 0);
    drop(h);
    let left = rig.fabric.device_objects(host_ip(1));
    assert_eq!(
        left.total(),
        0,
        "still held on the removed device: {left:?}"
    );
}

//! Durability as a host sees it, with a bdev that records what the target asks of it: a
//! shutdown notification (CC.SHN) flushes every namespace before CSTS.SHST says complete, Write
//! Zeroes keeps its FUA bit, and with the host's write cache off Write Zeroes and deallocate
//! are durable too.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nvmf_common::spec::command::{Command, DsmRange};
use nvmf_common::spec::fabrics::{PropertyGetCommand, PropertySetCommand};
use nvmf_common::spec::features::FeatureId;
use nvmf_common::spec::registers::{Cc, Csts, Property};
use nvmf_common::spec::Status;
use nvmf_target::bdev::{Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, IoKind};
use nvmf_tests::*;
use zerocopy::IntoBytes;

const NQN: &str = "nqn.2016-06.io.spdk:durable";
const FUA: u32 = 1 << 30;

/// What the target asked of the device.
#[derive(Default)]
struct Journal {
    flushes: AtomicUsize,
    /// (kind, fua) of every Write Zeroes and Unmap.
    zeroing: Mutex<Vec<(IoKind, bool)>>,
    /// While false, flushes are held (a slow device cache).
    release_flushes: AtomicBool,
}

struct RecordingBdev {
    journal: Arc<Journal>,
}

struct RecordingChannel {
    journal: Arc<Journal>,
    ready: Vec<BdevIo>,
    held: Vec<BdevIo>,
}

impl Bdev for RecordingBdev {
    fn name(&self) -> &str {
        "Cached0"
    }
    fn product_name(&self) -> &'static str {
        "recording test disk"
    }
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        1024
    }
    fn uuid(&self) -> [u8; 16] {
        [7; 16]
    }
    fn supports(&self, _kind: IoKind) -> bool {
        true
    }
    fn has_write_cache(&self) -> bool {
        true
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(RecordingChannel {
            journal: Arc::clone(&self.journal),
            ready: Vec::new(),
            held: Vec::new(),
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl BdevChannel for RecordingChannel {
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo> {
        match io.kind {
            IoKind::Flush => {
                self.journal.flushes.fetch_add(1, Ordering::SeqCst);
                self.held.push(io);
            }
            IoKind::WriteZeroes | IoKind::Unmap => {
                self.journal.zeroing.lock().unwrap().push((io.kind, io.fua));
                self.ready.push(io);
            }
            _ => self.ready.push(io),
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        if self.journal.release_flushes.load(Ordering::SeqCst) {
            self.ready.append(&mut self.held);
        }
        let n = self.ready.len();
        for io in self.ready.drain(..) {
            done(BdevCompletion {
                tag: io.tag,
                kind: io.kind,
                result: Ok(()),
                buf: io.buf,
            });
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.ready.len() + self.held.len()
    }
}

fn lab() -> (LoopbackLab, Arc<Journal>, HostController) {
    let mut lab = LoopbackLab::default();
    let journal = Arc::new(Journal::default());
    let bdev = Arc::new(RecordingBdev {
        journal: Arc::clone(&journal),
    });
    lab.target.bdevs.register(bdev).unwrap();
    lab.subsystem(NQN, &["Cached0"]);
    let ctrl = linux_bring_up(&mut lab, NQN, 1);
    (lab, journal, ctrl)
}

fn csts(lab: &mut LoopbackLab, ctrl: &mut HostController) -> Csts {
    let cid = ctrl.cid();
    let r = ctrl.admin(
        lab,
        no_data(PropertyGetCommand::new(cid, Property::CSTS.0, false).to_command()),
    );
    Csts(expect_ok(&r).dw0.get())
}

#[test]
fn shutdown_completes_only_after_every_namespace_is_flushed() {
    let (mut lab, journal, mut ctrl) = lab();
    let cc = Cc(0)
        .with_iosqes(6)
        .with_iocqes(4)
        .with_en(true)
        .with_shn(1);
    let cid = ctrl.cid();
    ctrl.admin.submit(no_data(
        PropertySetCommand::new(cid, Property::CC.0, u64::from(cc.0), false).to_command(),
    ));
    assert!(
        lab.try_wait(&ctrl.admin, 200).is_none(),
        "the shutdown notification must wait for the device's cache"
    );
    assert_eq!(journal.flushes.load(Ordering::SeqCst), 1);
    // Meanwhile the host polls CSTS, as Linux does: processing, not complete.
    assert_eq!(csts(&mut lab, &mut ctrl).shst(), 1);
    journal.release_flushes.store(true, Ordering::SeqCst);
    let r = lab.wait(&ctrl.admin);
    assert_eq!(r.cqe.cid.get(), cid);
    assert_eq!(r.cqe.status(), Status::SUCCESS);
    assert_eq!(csts(&mut lab, &mut ctrl).shst(), 2, "shutdown complete");
}

#[test]
fn write_zeroes_fua_and_write_through_reach_the_device() {
    let (mut lab, journal, mut ctrl) = lab();
    let wz = |cid, fua: bool| {
        let mut c = Command::write_zeroes(cid, 1, 0, 8, false);
        if fua {
            c.cdw12.set(c.cdw12.get() | FUA);
        }
        no_data(c)
    };
    let dsm = |cid| {
        let mut r = DsmRange::default();
        r.slba.set(16);
        r.nlb.set(8);
        with_buffer(Command::dsm(cid, 1, 1, true), r.as_bytes().to_vec())
    };
    // Write cache on (the default): FUA only when asked.
    for (fua, capsule) in [(true, wz(ctrl.cid(), true)), (false, wz(ctrl.cid(), false))] {
        expect_ok(&ctrl.io(&mut lab, 0, capsule));
        assert_eq!(
            journal.zeroing.lock().unwrap().pop(),
            Some((IoKind::WriteZeroes, fua))
        );
    }
    let c = dsm(ctrl.cid());
    expect_ok(&ctrl.io(&mut lab, 0, c));
    assert_eq!(
        journal.zeroing.lock().unwrap().pop(),
        Some((IoKind::Unmap, false))
    );
    // The host turns the volatile write cache off: every change is durable at completion.
    let cid = ctrl.cid();
    expect_ok(&ctrl.admin(
        &mut lab,
        no_data(Command::set_features(
            cid,
            FeatureId::VOLATILE_WRITE_CACHE,
            0,
            false,
        )),
    ));
    let c = wz(ctrl.cid(), false);
    expect_ok(&ctrl.io(&mut lab, 0, c));
    assert_eq!(
        journal.zeroing.lock().unwrap().pop(),
        Some((IoKind::WriteZeroes, true))
    );
    let c = dsm(ctrl.cid());
    expect_ok(&ctrl.io(&mut lab, 0, c));
    assert_eq!(
        journal.zeroing.lock().unwrap().pop(),
        Some((IoKind::Unmap, true))
    );
}

//! What an idle reactor turn costs: it polls no bdev channel while none has I/O outstanding
//! (a spinning reactor's empty turn grew with its namespaces), and a turn with I/O outstanding
//! polls at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nvmf_common::spec::command::Command;
use nvmf_target::bdev::{Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, IoKind, NullBdev};
use nvmf_target::target::NamespaceOptions;
use nvmf_tests::sim::*;

/// A null bdev whose channels count their polls.
struct CountingBdev {
    inner: NullBdev,
    polls: Arc<AtomicUsize>,
}

struct CountingChannel {
    inner: Box<dyn BdevChannel>,
    polls: Arc<AtomicUsize>,
}

impl Bdev for CountingBdev {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn product_name(&self) -> &'static str {
        "Counting null disk"
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.inner.uuid()
    }
    fn supports(&self, kind: IoKind) -> bool {
        self.inner.supports(kind)
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(CountingChannel {
            inner: self.inner.open_channel()?,
            polls: Arc::clone(&self.polls),
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        self.inner.config_entry()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl BdevChannel for CountingChannel {
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo> {
        self.inner.submit(io)
    }
    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

#[test]
fn idle_turns_poll_no_bdev_channel_and_io_is_answered_at_once() {
    let mut lab = SimLab::new(41);
    let polls = Arc::new(AtomicUsize::new(0));
    let bdev = CountingBdev {
        inner: NullBdev::new("Count0", 4096, 512, None).unwrap(),
        polls: Arc::clone(&polls),
    };
    lab.target.bdevs.register(Arc::new(bdev)).unwrap();
    let nsid = lab
        .target
        .add_namespace(
            SUBNQN,
            NamespaceOptions {
                bdev_name: "Count0".into(),
                nsid: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(nsid, 2);
    let host = lab.fabric.add_host(host_ip(1));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let mut q = io_queue_qid(&mut lab, &host, cntlid, 1, 16, 8192);

    // Idle, a host connected: no turn polls the channel.
    let before = polls.load(Ordering::Relaxed);
    lab.turns(640);
    let idle = polls.load(Ordering::Relaxed) - before;
    assert_eq!(idle, 0, "channel polls in 640 idle turns");

    // With a read outstanding the next turn polls the channel: each read is answered within
    // a few turns.
    for i in 0..16u16 {
        q.submit(Command::read(100 + i, 2, u64::from(i), 1), keyed(0, 512));
        let mut turns = 0;
        let c = loop {
            if let Some(c) = q.poll().into_iter().next() {
                break c;
            }
            lab.turn();
            turns += 1;
            assert!(turns < 1_000, "read {i} never answered");
        };
        assert!(c.status().is_success(), "{c:?}");
        assert_eq!(c.cid.get(), 100 + i);
        assert!(turns <= 12, "read {i} answered after {turns} turns");
    }
    // And idle again: the count of outstanding I/O came back to zero.
    let before = polls.load(Ordering::Relaxed);
    lab.turns(640);
    assert_eq!(
        polls.load(Ordering::Relaxed),
        before,
        "polled after the reads"
    );
}

//! What an idle reactor turn costs: it polls no bdev channel while none has I/O outstanding
//! (a spinning reactor's empty turn grew with its namespaces), and a turn with I/O outstanding
//! polls at once, and only the channels with I/O out (a busy namespace's I/O does not pay for
//! the quiet ones next to it).

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

/// Adds a counting null bdev `name` as namespace `nsid`; returns its channels' poll count.
fn counting_namespace(lab: &mut SimLab, name: &str, nsid: u32) -> Arc<AtomicUsize> {
    let polls = Arc::new(AtomicUsize::new(0));
    let bdev = CountingBdev {
        inner: NullBdev::new(name, 4096, 512, None).unwrap(),
        polls: Arc::clone(&polls),
    };
    lab.target.bdevs.register(Arc::new(bdev)).unwrap();
    let added = lab
        .target
        .add_namespace(
            SUBNQN,
            NamespaceOptions {
                bdev_name: name.into(),
                nsid: Some(nsid),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(added, nsid);
    polls
}

/// One read on namespace `nsid`, answered successfully; returns the turns it took.
fn read_one(lab: &mut SimLab, q: &mut HostQueue, cid: u16, nsid: u32) -> u32 {
    q.submit(
        Command::read(cid, nsid, u64::from(cid % 64), 1),
        keyed(0, 512),
    );
    let mut turns = 0;
    let c = loop {
        if let Some(c) = q.poll().into_iter().next() {
            break c;
        }
        lab.turn();
        turns += 1;
        assert!(turns < 1_000, "read {cid} never answered");
    };
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(c.cid.get(), cid);
    turns
}

#[test]
fn io_on_one_namespace_polls_no_other_namespaces_channel() {
    let mut lab = SimLab::new(42);
    let busy = counting_namespace(&mut lab, "Busy", 2);
    let quiet: Vec<_> = (3..11)
        .map(|nsid| counting_namespace(&mut lab, &format!("Quiet{nsid}"), nsid))
        .collect();
    let host = lab.fabric.add_host(host_ip(1));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let mut q = io_queue_qid(&mut lab, &host, cntlid, 1, 16, 8192);
    for cid in 1..=50u16 {
        read_one(&mut lab, &mut q, cid, 2);
    }
    assert!(
        busy.load(Ordering::Relaxed) >= 50,
        "the busy channel polled"
    );
    for (i, polls) in quiet.iter().enumerate() {
        assert_eq!(
            polls.load(Ordering::Relaxed),
            0,
            "quiet namespace {} polled for another's I/O",
            i + 3
        );
    }
    // A quiet one that gets I/O is polled for it, and answered, like any other.
    read_one(&mut lab, &mut q, 60, 7);
    assert!(quiet[4].load(Ordering::Relaxed) > 0);
    assert_eq!(quiet[3].load(Ordering::Relaxed), 0);
}

#[test]
fn idle_turns_poll_no_bdev_channel_and_io_is_answered_at_once() {
    let mut lab = SimLab::new(41);
    let polls = counting_namespace(&mut lab, "Count0", 2);
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
        let turns = read_one(&mut lab, &mut q, 100 + i, 2);
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

/// A namespace removed while its I/O is out is still polled until that I/O is answered (its
/// channel drains), and the namespace that takes its NSID next is served as any other.
#[test]
fn a_namespace_removed_with_io_out_drains_and_its_successor_is_served() {
    use nvmf_target::bdev::DelayBdev;
    let mut lab = SimLab::new(43);
    let base: nvmf_target::bdev::BdevRef =
        Arc::new(NullBdev::new("Base", 4096, 512, None).unwrap());
    lab.target.bdevs.register(Arc::clone(&base)).unwrap();
    // 30 ms (real time) per read: the reads are still out when the namespace goes.
    let slow = DelayBdev::new("Slow", base, None, 30_000, 30_000, 0, 0);
    lab.target.bdevs.register(Arc::new(slow)).unwrap();
    lab.target
        .add_namespace(
            SUBNQN,
            NamespaceOptions {
                bdev_name: "Slow".into(),
                nsid: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    let host = lab.fabric.add_host(host_ip(1));
    let (_admin, cntlid) = admin_queue(&mut lab, &host);
    let mut q = io_queue_qid(&mut lab, &host, cntlid, 1, 16, 8192);
    let in_use = lab.resources(0).requests_in_use;
    for cid in 1..=4u16 {
        q.submit(Command::read(cid, 2, u64::from(cid), 1), keyed(0, 512));
    }
    lab.turns(20);
    assert!(q.poll().is_empty(), "answered before the delay");
    lab.target.remove_namespace(SUBNQN, 2).unwrap();
    let start = std::time::Instant::now();
    let mut answered = 0;
    while answered < 4 {
        for c in q.poll() {
            assert!(c.status().is_success(), "{c:?}");
            answered += 1;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "{answered} of 4 reads answered after their namespace was removed"
        );
        lab.turn();
    }
    let polls = counting_namespace(&mut lab, "Next", 2);
    lab.turns(4);
    read_one(&mut lab, &mut q, 20, 2);
    assert!(polls.load(Ordering::Relaxed) > 0);
    // No request of the drained reads is left holding a slot.
    assert!(lab.resources(0).requests_in_use <= in_use);
}

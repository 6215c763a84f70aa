//! A reactor's unit of work: the core context plus one poll group per transport. One `poll`
//! is one turn of the reactor loop: transports take in capsules and reap work completions,
//! bdev channels report finished I/O, and the wakeups those produced go back to the
//! transports that own the waiting requests.

use std::sync::Arc;
use std::time::Duration;

use crossbeam::queue::SegQueue;
use nvmf_common::reactor::{ReactorWaker, Ready, WaitSet};

use crate::core::request::{ReqTag, Wakeup};
use crate::core::transport::TransportPollGroup;
use crate::core::{CoreCtx, TargetInfo};

const SHUTDOWN_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Work sent to a poll group from another thread (configuration changes, new qpairs). It runs
/// on the poll group's reactor between two turns, with exclusive access.
pub type PollGroupMsg = Box<dyn FnOnce(&mut PollGroup) + Send>;

/// The sending side of a poll group's message queue: lock-free, cloneable, `Send`.
#[derive(Clone)]
pub struct PollGroupHandle {
    index: usize,
    inbox: Arc<SegQueue<PollGroupMsg>>,
    /// The reactor's, when the group runs on one that may sleep.
    waker: Option<Arc<ReactorWaker>>,
}

impl PollGroupHandle {
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn send(&self, msg: impl FnOnce(&mut PollGroup) + Send + 'static) {
        self.inbox.push(Box::new(msg));
        if let Some(waker) = &self.waker {
            waker.wake();
        }
    }
}

/// A reactor's queue pair and command counters, as SPDK's `spdk_nvmf_poll_group_stat`
/// reports them in `nvmf_get_stats`. Plain integers: only the reactor writes them, readers get
/// a copy through a poll group message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Admin queues connected on this reactor since it started.
    pub admin_qpairs: u64,
    /// I/O queues connected on this reactor since it started.
    pub io_qpairs: u64,
    pub current_admin_qpairs: u64,
    pub current_io_qpairs: u64,
    /// Bdev I/Os the backend refused for lack of resources and that waited for a retry.
    pub pending_bdev_io: u64,
    /// Commands completed on I/O queues (Fabrics commands excluded).
    pub completed_nvme_io: u64,
}

impl GroupStats {
    /// A queue's Connect succeeded.
    pub fn queue_connected(&mut self, admin: bool) {
        if admin {
            self.admin_qpairs += 1;
            self.current_admin_qpairs += 1;
        } else {
            self.io_qpairs += 1;
            self.current_io_qpairs += 1;
        }
    }
}

pub struct PollGroup {
    pub core: CoreCtx,
    inbox: Arc<SegQueue<PollGroupMsg>>,
    waker: Option<Arc<ReactorWaker>>,
    transports: Vec<Box<dyn TransportPollGroup>>,
    /// Swapped with the core's wakeup list each turn, so dispatch allocates nothing.
    spare_wakeups: Vec<(ReqTag, Wakeup)>,
}

impl PollGroup {
    /// A poll group driven by hand (tests, the simulated fabric): it never sleeps.
    pub fn new(index: usize, info: Arc<TargetInfo>) -> Self {
        Self::with_waker(index, info, None)
    }

    /// A poll group on a reactor that may sleep: its messages wake `waker`.
    pub fn with_waker(
        index: usize,
        info: Arc<TargetInfo>,
        waker: Option<Arc<ReactorWaker>>,
    ) -> Self {
        Self {
            core: CoreCtx::new(index, info),
            inbox: Arc::new(SegQueue::new()),
            waker,
            transports: Vec::new(),
            spare_wakeups: Vec::with_capacity(256),
        }
    }

    pub fn handle(&self) -> PollGroupHandle {
        PollGroupHandle {
            index: self.core.group,
            inbox: Arc::clone(&self.inbox),
            waker: self.waker.clone(),
        }
    }

    /// Runs the messages that arrived since the last turn.
    #[inline]
    pub fn drain_messages(&mut self) -> usize {
        // Two index loads, where an empty `pop` pays for a full attempt: most turns have none.
        if self.inbox.is_empty() {
            return 0;
        }
        self.run_messages()
    }

    #[inline(never)]
    fn run_messages(&mut self) -> usize {
        let mut n = 0;
        while let Some(msg) = self.inbox.pop() {
            msg(self);
            n += 1;
        }
        n
    }

    /// Adds a transport's poll group; its index is what it must put in its request tags.
    pub fn add_transport(&mut self, make: impl FnOnce(u8) -> Box<dyn TransportPollGroup>) -> usize {
        let index = self.transports.len();
        assert!(index < 256, "a reactor polls at most 256 transports");
        self.transports.push(make(index as u8));
        index
    }

    pub fn transport_mut(
        &mut self,
        index: usize,
    ) -> Option<&mut (dyn TransportPollGroup + 'static)> {
        self.transports.get_mut(index).map(|t| t.as_mut())
    }

    /// Runs `f` on one transport poll group together with the core context it needs.
    pub fn with_transport<R>(
        &mut self,
        index: usize,
        f: impl FnOnce(&mut dyn TransportPollGroup, &mut CoreCtx) -> R,
    ) -> Option<R> {
        let t = self.transports.get_mut(index)?;
        Some(f(t.as_mut(), &mut self.core))
    }

    pub fn qpair_count(&self) -> usize {
        self.transports.iter().map(|t| t.qpair_count()).sum()
    }

    /// Each transport group's `nvmf_get_stats` fields, in transport order.
    pub fn transport_stats(&self) -> Vec<serde_json::Map<String, serde_json::Value>> {
        self.transports.iter().map(|t| t.dump_stats()).collect()
    }

    /// One turn of the reactor loop; returns how much work was done (0 = idle).
    pub fn poll(&mut self) -> usize {
        let mut work = self.drain_messages();
        for t in &mut self.transports {
            work += t.poll(&mut self.core);
        }
        work += self.core.poll(work > 0);
        while self.core.has_wakeups() {
            work += self.dispatch_wakeups();
        }
        for t in &mut self.transports {
            t.flush();
        }
        work
    }

    /// The reactor is idle and wants to sleep: `None` if a message or a wakeup is waiting,
    /// bdev I/O is in flight (backends are polled) or a transport has work only polling sees;
    /// else every transport has armed its completion sources in `wait`, and the result is
    /// how long the reactor may sleep before its next timer.
    pub fn prepare_sleep(&mut self, wait: &WaitSet<'_>) -> Option<Duration> {
        if !self.inbox.is_empty() {
            return None;
        }
        let mut bound = self.core.sleep_bound()?;
        for t in &mut self.transports {
            bound = bound.min(t.prepare_sleep(&self.core, wait)?);
        }
        Some(bound)
    }

    /// After a sleep: transports take the events of the completion sources that signalled
    /// (`ready`), so those can be armed again; the others stay armed. (The reactor reads the
    /// clock right after and hands the reading over.)
    pub fn woken(&mut self, ready: Ready<'_>) {
        for t in &mut self.transports {
            t.woken(ready);
        }
    }

    /// A reading of the system clock the reactor made: the core's time for its next turns.
    pub fn observe_clock(&mut self, now: std::time::Instant) {
        self.core.observe_clock(now);
    }

    /// Hands the core's wakeups to their transports, newest first (popped: no drain to tear
    /// down; the requests of one batch are independent, and their responses leave together
    /// at the turn's end). Those the transports' `resume` makes go to the core's fresh list,
    /// for the caller's next round.
    fn dispatch_wakeups(&mut self) -> usize {
        self.core.take_wakeups(&mut self.spare_wakeups);
        let n = self.spare_wakeups.len();
        while let Some((tag, wakeup)) = self.spare_wakeups.pop() {
            match self.transports.get_mut(tag.transport_group()) {
                Some(t) => t.resume(tag, wakeup, &mut self.core),
                None => tracing::error!(?tag, "wakeup for an unknown transport poll group"),
            }
        }
        n
    }

    /// Disconnects every queue pair (target shutdown), then polls until their work requests
    /// and outstanding bdev I/O have drained.
    pub fn shutdown(&mut self) {
        for t in &mut self.transports {
            t.shutdown(&mut self.core);
        }
        // Bounded: a backend that never completes (an injected "pending" error) must not
        // hold the target hostage.
        let deadline = std::time::Instant::now() + SHUTDOWN_DRAIN_TIMEOUT;
        while self.core.io_in_flight() > 0 || self.core.has_wakeups() || self.qpair_count() > 0 {
            self.poll();
            if std::time::Instant::now() > deadline {
                tracing::warn!(
                    in_flight = self.core.io_in_flight(),
                    "shutdown: abandoning bdev I/O that did not complete"
                );
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use nvmf_common::reactor::{IdleMode, Reactor, Sleeper};

    use super::*;
    use crate::core::IDLE_SLEEP_MAX_MS;

    /// A transport group with the default `prepare_sleep`: work only polling sees.
    struct PolledOnly;

    impl TransportPollGroup for PolledOnly {
        fn poll(&mut self, _core: &mut CoreCtx) -> usize {
            0
        }
        fn resume(&mut self, _tag: ReqTag, _wakeup: Wakeup, _core: &mut CoreCtx) {}
        fn qpair_count(&self) -> usize {
            0
        }
        fn shutdown(&mut self, _core: &mut CoreCtx) {}
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    #[test]
    fn a_poll_group_sleeps_only_with_nothing_pending() {
        let sleeper = Sleeper::new().unwrap();
        let wait = sleeper.wait_set();
        let mut pg = PollGroup::new(0, Arc::new(TargetInfo::default()));
        pg.poll();
        let idle = Duration::from_millis(IDLE_SLEEP_MAX_MS);
        assert_eq!(pg.prepare_sleep(&wait), Some(idle));
        pg.handle().send(|_| {});
        assert_eq!(pg.prepare_sleep(&wait), None, "a message is waiting");
        assert_eq!(pg.poll(), 1);
        assert_eq!(pg.prepare_sleep(&wait), Some(idle));
        pg.add_transport(|_| Box::new(PolledOnly));
        assert_eq!(pg.prepare_sleep(&wait), None, "a transport polls");
    }

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(20), "never: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn messages_wake_an_asleep_reactor_and_a_polled_transport_keeps_it_up() {
        let info = Arc::new(TargetInfo::default());
        let (reactors, handles) =
            crate::reactor::start_reactors(&[0], &info, IdleMode::Adaptive).unwrap();
        let r = &reactors[0];
        wait_for("the reactor sleeps", || {
            r.stats.asleep.load(Ordering::Relaxed)
        });
        let (tx, rx) = crossbeam::channel::bounded(1);
        handles[0].send(move |pg| {
            pg.add_transport(|_| Box::new(PolledOnly));
            let _ = tx.send(pg.core.group);
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(0));
        assert!(r.waker.wakes() >= 1, "the message had to wake it");
        // A transport that only polling serves: the reactor stops sleeping.
        std::thread::sleep(Duration::from_millis(50));
        let sleeps = r.stats.sleeps.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(r.stats.sleeps.load(Ordering::Relaxed), sleeps);
        crate::reactor::stop_reactors(reactors);
    }

    /// A reactor hands its clock readings to the core (after each turn that did work, and at
    /// its idle looks), which keeps time (timers, latencies) from them without reading the
    /// clock itself: where the clock is a syscall (the lab's TCG guests), each reading counts.
    #[test]
    fn an_idle_reactor_keeps_the_core_on_time_without_the_core_reading_the_clock() {
        let info = Arc::new(TargetInfo::default());
        let (reactors, handles) =
            crate::reactor::start_reactors(&[0], &info, IdleMode::Pure).unwrap();
        let ask = |handle: &PollGroupHandle| {
            let (tx, rx) = crossbeam::channel::bounded(1);
            handle.send(move |pg| {
                let _ = tx.send((pg.core.now_ms(), pg.core.clock_reads()));
            });
            rx.recv_timeout(Duration::from_secs(20)).unwrap()
        };
        let turns = |r: &Reactor| {
            r.stats.busy_turns.load(Ordering::Relaxed) + r.stats.idle_turns.load(Ordering::Relaxed)
        };
        // Until the reactor hands it a first reading, a core keeps time on its own: measure
        // from after that (the counters are published every 1,024 turns, readings come at
        // least every 128).
        let waiting = Instant::now();
        while turns(&reactors[0]) < 2048 {
            assert!(
                waiting.elapsed() < Duration::from_secs(20),
                "the reactor never turned"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let (first_ms, first_reads) = ask(&handles[0]);
        let turns_before = turns(&reactors[0]);
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(400));
        let (last_ms, last_reads) = ask(&handles[0]);
        let spun = turns(&reactors[0]) - turns_before;
        let elapsed_ms = start.elapsed().as_millis() as u64;
        crate::reactor::stop_reactors(reactors);
        assert!(spun > 4096, "the reactor spun only {spun} turns");
        assert!(
            last_ms - first_ms + 50 >= elapsed_ms.min(400),
            "the core's time moved {} ms in {elapsed_ms} ms",
            last_ms - first_ms
        );
        // The second message was a busy turn: the reactor read the clock after it and handed
        // the reading over, as it does at the idle turns' looks. The core read nothing.
        assert_eq!(
            last_reads - first_reads,
            0,
            "the core read the clock itself in {spun} turns"
        );
    }
}

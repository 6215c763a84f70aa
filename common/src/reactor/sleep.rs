//! How an idle reactor sleeps without missing work.
//!
//! A reactor that spins while idle burns a core, and on soft-RoCE that core is also the NIC.
//! A reactor that naps on a timer wakes late when work comes back. The adaptive mode does
//! neither: after a short idle spin it asks its state to arm every source of work that can
//! signal a descriptor (RDMA completion channels), polls once more (a completion that landed
//! before the arming raises no event), and sleeps in one `epoll_wait` over those descriptors
//! plus an eventfd that other threads write after queueing a message. Any completion or
//! message wakes it at once; a timeout bounds the sleep for the timers the state keeps.
//! Woken, it polls as before, so completions that arrive together are still taken in one
//! batch (SPDK's interrupt mode processes one event per wake-up instead).
//!
//! The message side costs nothing while the reactor is awake: a sender writes the eventfd
//! only when the reactor has said it is about to sleep (a flag, checked after the message is
//! queued, with a full fence on both sides so one of the two always sees the other).

use std::io;
use std::os::fd::RawFd;
use std::str::FromStr;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};

/// Events one sleep takes at most (more stay queued for the next).
const EVENTS: usize = 16;

/// What a reactor does with its core when it has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleMode {
    /// Spin briefly, then sleep until a completion, a message or a timer (falls back to
    /// `Backoff` while the state has work only polling can see, such as bdev I/O in flight).
    #[default]
    Adaptive,
    /// Spin, then yield the core between turns, then nap 100 µs per turn.
    Backoff,
    /// Never give the core up (SPDK's default): the lowest latency, a whole core per reactor.
    Pure,
}

impl IdleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Adaptive => "adaptive",
            Self::Backoff => "backoff",
            Self::Pure => "pure",
        }
    }
}

impl FromStr for IdleMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "adaptive" | "interrupt" => Ok(Self::Adaptive),
            "backoff" => Ok(Self::Backoff),
            "pure" | "poll" => Ok(Self::Pure),
            _ => Err(format!(
                "unknown poll mode {s:?} (adaptive, backoff or pure)"
            )),
        }
    }
}

/// The waker's token; a watched descriptor's is its number plus one.
const WAKER: Token = Token(0);

/// Wakes a reactor that sleeps (or is about to): `Send + Sync`, shared with every thread that
/// queues work for it.
#[derive(Debug)]
pub struct ReactorWaker {
    waker: mio::Waker,
    sleeping: AtomicBool,
    /// Times a sender had to write the eventfd.
    wakes: AtomicU64,
}

impl ReactorWaker {
    /// Call after queueing work for the reactor. A syscall only if the reactor is asleep or
    /// going to sleep; otherwise one fence and one load.
    pub fn wake(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.waker.wake() {
                tracing::error!("cannot wake a reactor: {e}");
            }
        }
    }

    /// Times a sender found the reactor asleep and woke it.
    pub fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Relaxed)
    }

    /// The reactor announces it will sleep; it must look at its queues after this.
    fn begin_sleep(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    fn end_sleep(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

/// Where a state registers the descriptors that signal its work, while it prepares to sleep.
pub struct WaitSet<'a> {
    registry: &'a Registry,
}

impl WaitSet<'_> {
    /// Watches `fd` for readability for as long as its file stays open (closing it removes
    /// it). Register each open file once. The watch is edge-triggered: every new event on
    /// the file wakes the reactor once, whether or not older ones were read, and the reactor
    /// tells the state which descriptors signalled ([`Ready`]) so it reads only those.
    pub fn watch(&self, fd: RawFd) -> io::Result<()> {
        let token =
            Token(usize::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))? + 1);
        match self
            .registry
            .register(&mut SourceFd(&fd), token, Interest::READABLE)
        {
            // Watched already (the same open file under a number seen before): fine.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }
}

/// The watched descriptors that signalled during the reactor's last sleep (none when it did
/// not sleep: the poll after arming found work).
#[derive(Debug, Clone, Copy)]
pub struct Ready<'a>(&'a [RawFd]);

impl Ready<'_> {
    pub fn contains(&self, fd: RawFd) -> bool {
        self.0.contains(&fd)
    }

    /// How many descriptors signalled.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The reactor thread's side: the epoll instance, its event buffer and the waker.
pub struct Sleeper {
    poll: Poll,
    events: Events,
    /// The watched descriptors the last wait returned (room for every event: no allocation
    /// after the first sleep).
    ready: Vec<RawFd>,
    waker: Arc<ReactorWaker>,
}

impl Sleeper {
    pub fn new() -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(ReactorWaker {
            waker: mio::Waker::new(poll.registry(), WAKER)?,
            sleeping: AtomicBool::new(false),
            wakes: AtomicU64::new(0),
        });
        Ok(Self {
            poll,
            events: Events::with_capacity(EVENTS),
            ready: Vec::with_capacity(EVENTS),
            waker,
        })
    }

    pub fn waker(&self) -> &Arc<ReactorWaker> {
        &self.waker
    }

    /// Where states register descriptors (for driving `prepare_sleep` by hand in tests).
    pub fn wait_set(&self) -> WaitSet<'_> {
        WaitSet {
            registry: self.poll.registry(),
        }
    }

    /// Blocks until a watched descriptor or the waker signals (true) or `timeout` passes
    /// (false; also when a signal interrupted the wait). The descriptors that signalled are
    /// then [`ready`](Self::ready).
    pub fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        self.ready.clear();
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {
                for event in &self.events {
                    if let Some(fd) = event.token().0.checked_sub(1) {
                        self.ready.push(fd as RawFd);
                    }
                }
                Ok(!self.events.is_empty())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The watched descriptors that signalled in the last [`wait`](Self::wait).
    pub fn ready(&self) -> Ready<'_> {
        Ready(&self.ready)
    }

    /// One attempt to sleep: the state arms its sources and bounds the sleep
    /// ([`super::Pollable::prepare_sleep`]), is polled once more, and only if that found
    /// nothing does the thread block. Returns `None` if the state cannot sleep now, else the
    /// work the extra poll did (0 if the reactor slept).
    pub fn try_sleep<S: super::Pollable + ?Sized>(
        &mut self,
        state: &mut S,
        stats: &super::ReactorStats,
    ) -> Option<usize> {
        self.waker.begin_sleep();
        let Some(bound) = state.prepare_sleep(&self.wait_set()) else {
            self.waker.end_sleep();
            return None;
        };
        // Work that arrived between the last poll and the arming raised no event.
        let work = state.poll();
        if work == 0 {
            // The reactor thread is these counters' only writer: a load and a store.
            bump(&stats.sleeps);
            stats.asleep.store(true, Ordering::Relaxed);
            let slept = self.wait(bound);
            stats.asleep.store(false, Ordering::Relaxed);
            match slept {
                Ok(true) => bump(&stats.woken_early),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!("reactor sleep failed: {e}");
                    std::thread::sleep(bound.min(Duration::from_millis(1)));
                }
            }
        }
        self.waker.end_sleep();
        if work == 0 {
            state.woken(Ready(&self.ready));
        }
        Some(work)
    }
}

fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    use crossbeam::queue::SegQueue;

    use super::super::{Pollable, Reactor, ReactorStats};
    use super::*;

    /// A reactor's state with the two kinds of work source: a message queue (woken through
    /// the reactor's waker) and a socket (a descriptor it registers, like a completion
    /// channel). It records what it handled and how often the reactor asked it to sleep.
    struct Sources {
        inbox: Arc<SegQueue<u32>>,
        socket: UnixStream,
        registered: bool,
        /// `None`: it cannot sleep (as with I/O only polling sees).
        bound: Option<Duration>,
        handled: Arc<AtomicU64>,
        turns: Arc<AtomicU64>,
        prepared: Arc<AtomicU64>,
    }

    impl Pollable for Sources {
        fn poll(&mut self) -> usize {
            self.turns.fetch_add(1, Ordering::Relaxed);
            let mut work = 0;
            while self.inbox.pop().is_some() {
                work += 1;
            }
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = self.socket.read(&mut buf) {
                work += n;
            }
            self.handled.fetch_add(work as u64, Ordering::Relaxed);
            work
        }

        fn prepare_sleep(&mut self, wait: &WaitSet<'_>) -> Option<Duration> {
            self.prepared.fetch_add(1, Ordering::Relaxed);
            if !self.inbox.is_empty() {
                return None;
            }
            if !self.registered {
                wait.watch(self.socket.as_raw_fd()).unwrap();
                self.registered = true;
            }
            self.bound
        }
    }

    struct Running {
        reactor: Reactor,
        inbox: Arc<SegQueue<u32>>,
        peer: UnixStream,
        handled: Arc<AtomicU64>,
        turns: Arc<AtomicU64>,
        prepared: Arc<AtomicU64>,
    }

    impl Running {
        fn start(mode: IdleMode, bound: Option<Duration>) -> Self {
            let (ours, peer) = UnixStream::pair().unwrap();
            ours.set_nonblocking(true).unwrap();
            let inbox = Arc::new(SegQueue::new());
            let [handled, turns, prepared] = [(); 3].map(|()| Arc::new(AtomicU64::new(0)));
            let state = Sources {
                inbox: Arc::clone(&inbox),
                socket: ours,
                registered: false,
                bound,
                handled: Arc::clone(&handled),
                turns: Arc::clone(&turns),
                prepared: Arc::clone(&prepared),
            };
            let (reactor, ()) =
                Reactor::spawn(0, "sleep-test".into(), mode, move |_| (state, ())).unwrap();
            Self {
                reactor,
                inbox,
                peer,
                handled,
                turns,
                prepared,
            }
        }

        fn stats(&self) -> &ReactorStats {
            &self.reactor.stats
        }

        /// Turns taken over `window`, after letting the reactor settle into its idle state.
        fn idle_turns_over(&self, window: Duration) -> u64 {
            std::thread::sleep(Duration::from_millis(200));
            let before = self.turns.load(Ordering::Relaxed);
            std::thread::sleep(window);
            self.turns.load(Ordering::Relaxed) - before
        }

        /// How long until the reactor has handled `count` units in all.
        fn time_to_handle(&self, count: u64) -> Duration {
            let start = Instant::now();
            while self.handled.load(Ordering::Relaxed) < count {
                assert!(start.elapsed() < Duration::from_secs(30), "never handled");
                std::thread::sleep(Duration::from_millis(1));
            }
            start.elapsed()
        }
    }

    #[test]
    fn an_idle_adaptive_reactor_sleeps_and_a_message_wakes_it_at_once() {
        // A 20 s timer: only the waker can end the sleep within the test's patience.
        let r = Running::start(IdleMode::Adaptive, Some(Duration::from_secs(20)));
        let turns = r.idle_turns_over(Duration::from_millis(300));
        assert!(
            turns <= 5,
            "an asleep reactor turns no more: {turns} turns in 300 ms"
        );
        assert!(r.stats().sleeps.load(Ordering::Relaxed) >= 1);
        assert!(r.stats().asleep.load(Ordering::Relaxed));
        r.inbox.push(7);
        r.reactor.waker.wake();
        let took = r.time_to_handle(1);
        assert!(took < Duration::from_secs(5), "the message waited {took:?}");
        assert_eq!(r.reactor.waker.wakes(), 1, "the sender had to wake it once");
        // Awake and idle again, it goes back to sleep.
        let turns = r.idle_turns_over(Duration::from_millis(300));
        assert!(turns <= 5, "{turns} turns in 300 ms after the message");
        r.reactor.join();
    }

    #[test]
    fn a_readable_descriptor_wakes_a_sleeping_reactor() {
        let mut r = Running::start(IdleMode::Adaptive, Some(Duration::from_secs(20)));
        assert!(r.idle_turns_over(Duration::from_millis(100)) <= 5);
        for round in 1..=3u64 {
            r.peer.write_all(b"x").unwrap();
            let took = r.time_to_handle(round);
            assert!(
                took < Duration::from_secs(5),
                "round {round} waited {took:?}"
            );
            // Edge-triggered: it drained the socket, so the next byte signals again.
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(r.stats().woken_early.load(Ordering::Relaxed) >= 3);
        assert_eq!(r.reactor.waker.wakes(), 0, "no message was sent");
        let mut buf = [0u8; 1];
        r.peer.set_nonblocking(true).unwrap();
        assert!(r.peer.read(&mut buf).is_err(), "nothing came back");
        r.reactor.join();
    }

    #[test]
    fn a_sleep_ends_at_the_state_s_timer() {
        let r = Running::start(IdleMode::Adaptive, Some(Duration::from_millis(20)));
        let start = r.stats().sleeps.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(500));
        let sleeps = r.stats().sleeps.load(Ordering::Relaxed) - start;
        // About 25 timers of 20 ms; a timer ignored (an endless sleep) gives 0 or 1.
        assert!((5..=200).contains(&sleeps), "{sleeps} sleeps in 500 ms");
        r.reactor.join();
    }

    #[test]
    fn a_state_that_cannot_sleep_is_polled_with_back_off() {
        let r = Running::start(IdleMode::Adaptive, None);
        let turns = r.idle_turns_over(Duration::from_millis(300));
        assert!(
            turns >= 100,
            "it must keep polling: {turns} turns in 300 ms"
        );
        assert!(r.prepared.load(Ordering::Relaxed) > 0);
        assert_eq!(r.stats().sleeps.load(Ordering::Relaxed), 0);
        r.inbox.push(1);
        assert!(r.time_to_handle(1) < Duration::from_secs(5));
        r.reactor.join();
    }

    #[test]
    fn pure_and_back_off_modes_never_sleep() {
        for mode in [IdleMode::Pure, IdleMode::Backoff] {
            let r = Running::start(mode, Some(Duration::from_secs(20)));
            let turns = r.idle_turns_over(Duration::from_millis(200));
            assert!(turns >= 100, "{mode:?}: {turns} turns in 200 ms");
            assert_eq!(r.prepared.load(Ordering::Relaxed), 0, "{mode:?}");
            assert_eq!(r.stats().sleeps.load(Ordering::Relaxed), 0, "{mode:?}");
            r.reactor.join();
        }
    }

    #[test]
    fn watching_a_descriptor_twice_is_harmless() {
        let mut sleeper = Sleeper::new().unwrap();
        let (ours, mut peer) = UnixStream::pair().unwrap();
        sleeper.wait_set().watch(ours.as_raw_fd()).unwrap();
        sleeper.wait_set().watch(ours.as_raw_fd()).unwrap();
        peer.write_all(b"x").unwrap();
        assert!(sleeper.wait(Duration::from_secs(5)).unwrap());
    }

    #[test]
    fn a_wait_reports_which_descriptors_signalled() {
        let mut sleeper = Sleeper::new().unwrap();
        let (a, mut a_peer) = UnixStream::pair().unwrap();
        let (b, mut b_peer) = UnixStream::pair().unwrap();
        for s in [&a, &b] {
            sleeper.wait_set().watch(s.as_raw_fd()).unwrap();
        }
        b_peer.write_all(b"x").unwrap();
        assert!(sleeper.wait(Duration::from_secs(5)).unwrap());
        let ready = sleeper.ready();
        assert!(ready.contains(b.as_raw_fd()) && !ready.contains(a.as_raw_fd()));
        assert_eq!(ready.len(), 1);
        // The waker alone: no descriptor signalled.
        sleeper.waker().begin_sleep();
        sleeper.waker().wake();
        assert!(sleeper.wait(Duration::from_secs(5)).unwrap());
        assert!(sleeper.ready().is_empty());
        // Edge-triggered: a new byte signals again though the first was never read, and a
        // timeout reports nothing.
        a_peer.write_all(b"y").unwrap();
        b_peer.write_all(b"z").unwrap();
        assert!(sleeper.wait(Duration::from_secs(5)).unwrap());
        let ready = sleeper.ready();
        assert!(ready.contains(a.as_raw_fd()) && ready.contains(b.as_raw_fd()));
        assert!(!sleeper.wait(Duration::from_millis(10)).unwrap());
        assert!(sleeper.ready().is_empty());
    }

    #[test]
    fn poll_modes_parse_by_name() {
        assert_eq!("adaptive".parse(), Ok(IdleMode::Adaptive));
        assert_eq!("interrupt".parse(), Ok(IdleMode::Adaptive));
        assert_eq!("pure".parse(), Ok(IdleMode::Pure));
        assert_eq!("backoff".parse(), Ok(IdleMode::Backoff));
        assert!("fast".parse::<IdleMode>().unwrap_err().contains("adaptive"));
        assert_eq!(IdleMode::default(), IdleMode::Adaptive);
    }
}

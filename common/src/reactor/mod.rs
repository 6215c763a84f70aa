//! Per-core reactors: one pinned thread per core of a core mask, each running a poll loop over
//! state it alone owns.
//!
//! The model, as in SPDK: a reactor never blocks and never shares mutable state. Work arrives by
//! polling (completion queues, bdev channels) or as messages on lock-free queues owned by the
//! polled state itself. A turn that found no work counts as idle. While work flows the reactor
//! spins. What it does once idle is its [`IdleMode`]: by default it sleeps until a completion,
//! a message or its next timer ([`sleep`]); the back-off mode yields its core between turns
//! after 100 µs and naps 100 µs per turn after 50 ms; pure polling never lets go. The syscalls
//! happen only when there is nothing to do, and they matter: on soft-RoCE the NIC is made of
//! the same CPUs, and a reactor spinning at 100% starves it.

mod idle;
pub mod sleep;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idle::{turns_to_next_look, SpinWindow, TurnClock};
pub use sleep::{IdleMode, ReactorWaker, Ready, Sleeper, WaitSet};

/// What a reactor polls.
pub trait Pollable {
    /// One turn: returns how much work was done (0 = idle).
    fn poll(&mut self) -> usize;
    /// Called once when the reactor stops, on the reactor thread.
    fn shutdown(&mut self) {}
    /// The reactor is idle and wants to sleep: arm every source of work that signals a
    /// descriptor (registering new ones in `wait`) and return the longest the reactor may
    /// sleep (the next timer). `None` when some work can only be seen by polling (the
    /// reactor then backs off instead). The reactor polls once more before it sleeps.
    fn prepare_sleep(&mut self, wait: &WaitSet<'_>) -> Option<Duration> {
        let _ = wait;
        None
    }
    /// After a sleep: take and acknowledge the events of the sources that signalled
    /// (`ready`), so they can be armed again. Sources that did not signal stay armed.
    fn woken(&mut self, ready: Ready<'_>) {
        let _ = ready;
    }
    /// A running count of the commands (host requests) this state has completed; the
    /// adaptive idle mode looks at how many each burst of work carried. 0 for states that
    /// serve no commands.
    fn commands_done(&self) -> u64 {
        0
    }
    /// The reactor just read the system clock (`now`), as it does after every turn that did
    /// work and at an idle streak's looks: a state that keeps time may take this reading
    /// instead of making its own. Where the clock is not served from user space (the
    /// lab's TCG guests run on HPET: every read is a syscall and an emulated device access)
    /// two readers reading apart doubled the syscalls of an idle spin.
    fn observe_clock(&mut self, now: Instant) {
        let _ = now;
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CoreMaskError {
    #[error("core mask {0:?} is neither hex (0x3), decimal, nor a list ([0,1] or 0-3)")]
    Syntax(String),
    #[error("core mask selects no core")]
    Empty,
    #[error("core {core} is not available (this machine has {available})")]
    Unavailable { core: usize, available: usize },
}

/// Parses SPDK's `-m` forms: a hex mask (`0x3`), a decimal mask, or a core list (`[0,2-3]`).
pub fn parse_core_mask(mask: &str) -> Result<Vec<usize>, CoreMaskError> {
    let mask = mask.trim();
    let syntax = || CoreMaskError::Syntax(mask.to_string());
    let mut cores = Vec::new();
    if let Some(list) = mask.strip_prefix('[').and_then(|m| m.strip_suffix(']')) {
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (usize, usize) = (
                        a.trim().parse().map_err(|_| syntax())?,
                        b.trim().parse().map_err(|_| syntax())?,
                    );
                    if a > b {
                        return Err(syntax());
                    }
                    cores.extend(a..=b);
                }
                None => cores.push(part.parse().map_err(|_| syntax())?),
            }
        }
    } else {
        let bits = match mask.strip_prefix("0x").or_else(|| mask.strip_prefix("0X")) {
            Some(hex) => u128::from_str_radix(hex, 16).map_err(|_| syntax())?,
            None => mask.parse::<u128>().map_err(|_| syntax())?,
        };
        cores.extend((0..128).filter(|i| bits & (1 << i) != 0));
    }
    cores.sort_unstable();
    cores.dedup();
    if cores.is_empty() {
        return Err(CoreMaskError::Empty);
    }
    Ok(cores)
}

/// Checks the cores exist on this machine.
pub fn check_cores(cores: &[usize]) -> Result<(), CoreMaskError> {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    match cores.iter().find(|&&c| c >= available) {
        Some(&core) => Err(CoreMaskError::Unavailable { core, available }),
        None => Ok(()),
    }
}

/// Busy/idle accounting of one reactor, readable from any thread.
///
/// Time is split at the moments the reactor reads the clock anyway (after each turn that did
/// work, for its state's timestamps; an idle streak reaching [`IdlePolicy::min_spin_turns`]
/// turns and its later looks) plus once per 1024 turns: a short gap between completions
/// counts as busy time.
#[derive(Debug, Default)]
pub struct ReactorStats {
    pub busy_turns: AtomicU64,
    pub idle_turns: AtomicU64,
    /// Nanoseconds spent working (and in idle streaks too short to look at the clock).
    pub busy_ns: AtomicU64,
    /// Nanoseconds spent idle: spinning, yielding or napping with nothing to do.
    pub idle_ns: AtomicU64,
    /// The reactor thread's OS thread id (0 until it started).
    pub tid: AtomicU64,
    /// Times it slept waiting for work ([`IdleMode::Adaptive`]) and the times a completion
    /// or message (not a timer) ended the sleep.
    pub sleeps: AtomicU64,
    pub woken_early: AtomicU64,
    /// Whether it is asleep now (SPDK's `in_interrupt`).
    pub asleep: AtomicBool,
}

/// The calling thread's OS thread id, read from `/proc/thread-self` (0 where there is none).
fn current_tid() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

/// Idle turns spun before the reactor starts looking at the clock, by default
/// ([`IdlePolicy::min_spin_turns`]): a short gap between two completions costs nothing but
/// these turns.
pub const DEFAULT_MIN_SPIN_TURNS: u32 = 64;
/// An idle streak this long (or one that ends in a sleep attempt) ends a burst of work, for
/// counting the commands bursts carry ([`SpinWindow::burst_ended`]).
const BURST_GAP_TURNS: u32 = 64;
/// Past every mark of its idle mode (sleep, yield, nap), an idle reactor reads the clock once
/// per this many idle turns; before, it looks when its pace says the next mark is reached
/// ([`idle::turns_to_next_look`]).
const IDLE_CLOCK_EVERY: u32 = 8;
/// A pure-polling reactor decides nothing by the clock: it reads it only to split busy from
/// idle time and to hand its state the time for timers ([`Pollable::observe_clock`]), both at
/// millisecond grain.
const IDLE_CLOCK_EVERY_PURE: u32 = 64;
/// Idle this long, the reactor yields its core between turns.
const YIELD_AFTER: Duration = Duration::from_micros(100);
/// Idle this long, it naps between turns: an idle target costs (almost) no CPU.
const NAP_AFTER: Duration = Duration::from_millis(50);
const NAP: Duration = Duration::from_micros(100);
/// The shortest an adaptive reactor spins before it sleeps: a sleep costs two syscalls and a
/// wake-up, a spin costs the core (and, on soft-RoCE, the NIC's CPU).
const SLEEP_AFTER: Duration = Duration::from_micros(20);
/// The longest it spins (yielding) before it sleeps, by default: see [`SpinWindow`].
pub const DEFAULT_MAX_SPIN: Duration = Duration::from_millis(4);

/// What a reactor does when idle: its mode and, when adaptive, the longest it spins first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdlePolicy {
    pub mode: IdleMode,
    pub max_spin: Duration,
    /// Idle turns spun before the reactor first reads the clock (and so before it may sleep,
    /// yield or nap): a short gap between completions costs only these turns. A turn takes
    /// ~0.1 µs on hardware and some µs under emulation, where fewer turns reach the same
    /// spin time.
    pub min_spin_turns: u32,
}

impl From<IdleMode> for IdlePolicy {
    fn from(mode: IdleMode) -> Self {
        Self {
            mode,
            max_spin: DEFAULT_MAX_SPIN,
            min_spin_turns: DEFAULT_MIN_SPIN_TURNS,
        }
    }
}

/// A running reactor thread.
pub struct Reactor {
    pub core: usize,
    pub stats: Arc<ReactorStats>,
    /// Queue work for the reactor, then call `wake` on this.
    pub waker: Arc<ReactorWaker>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reactor {
    /// Starts a reactor pinned to `core`. `make` runs on the new thread (the polled state is
    /// usually not `Send`) with the reactor's waker (for the state's message handles); it
    /// returns the state and a value handed back to the caller, such as such a handle.
    pub fn spawn<S, H, F>(
        core: usize,
        name: String,
        idle: impl Into<IdlePolicy>,
        make: F,
    ) -> std::io::Result<(Self, H)>
    where
        S: Pollable + 'static,
        H: Send + 'static,
        F: FnOnce(&Arc<ReactorWaker>) -> (S, H) + Send + 'static,
    {
        let idle = idle.into();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ReactorStats::default());
        let mut sleeper = Sleeper::new()?;
        let waker = Arc::clone(sleeper.waker());
        let (tx, rx) = crossbeam::channel::bounded(1);
        let thread = {
            let stop = Arc::clone(&stop);
            let stats = Arc::clone(&stats);
            std::thread::Builder::new().name(name).spawn(move || {
                if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                    tracing::warn!(core, "could not pin reactor to its core");
                }
                stats.tid.store(current_tid(), Ordering::Relaxed);
                let (mut state, handle) = make(sleeper.waker());
                let _ = tx.send(handle);
                run(&mut state, &stop, &stats, idle, &mut sleeper);
                state.shutdown();
            })?
        };
        let handle = rx
            .recv()
            .map_err(|_| std::io::Error::other("reactor thread died during start-up"))?;
        Ok((
            Self {
                core,
                stats,
                waker,
                stop,
                thread: Some(thread),
            },
            handle,
        ))
    }

    /// The reactor's thread ended without being asked to (a panic in a poll): its queues are
    /// served by nobody. The owner must not carry on as if it were alive.
    pub fn died(&self) -> bool {
        !self.stop.load(Ordering::Acquire) && self.thread.as_ref().is_some_and(|t| t.is_finished())
    }

    /// Asks the reactor to stop after its current turn; `join` waits for it.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn join(mut self) {
        self.request_stop();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!(core = self.core, "reactor thread panicked");
            }
        }
    }
}

fn run<S: Pollable>(
    state: &mut S,
    stop: &AtomicBool,
    stats: &ReactorStats,
    policy: IdlePolicy,
    sleeper: &mut Sleeper,
) {
    let mode = policy.mode;
    let settled_every = match mode {
        IdleMode::Pure => IDLE_CLOCK_EVERY_PURE,
        _ => IDLE_CLOCK_EVERY,
    };
    let mut spin = SpinWindow::new(policy.max_spin);
    let mut idle: u32 = 0;
    let mut clock = TurnClock::new();
    // How long the idle streak has lasted, as last read, and the idle turns until the next
    // reading.
    let mut waited = Duration::ZERO;
    let mut until_clock: u32 = 0;
    let first_look = policy.min_spin_turns.max(1);
    // Whether the current idle streak was counted as the end of a burst.
    let mut burst_noted = false;
    while !stop.load(Ordering::Relaxed) {
        let mut published = false;
        if state.poll() > 0 {
            let gap = clock.busy_turn();
            if idle > 0 && mode == IdleMode::Adaptive {
                spin.learn(gap);
            }
            idle = 0;
            until_clock = 0;
            burst_noted = false;
        } else {
            idle = idle.saturating_add(1);
            clock.idle_turns += 1;
            if mode == IdleMode::Adaptive && !burst_noted && idle >= BURST_GAP_TURNS {
                spin.burst_ended(state.commands_done());
                burst_noted = true;
            }
            if idle >= first_look {
                if until_clock == 0 {
                    waited = clock.idle_for();
                    let adaptive_marks = [spin.window(), YIELD_AFTER, NAP_AFTER];
                    let marks: &[Duration] = match mode {
                        IdleMode::Adaptive => &adaptive_marks,
                        IdleMode::Backoff => &adaptive_marks[1..],
                        IdleMode::Pure => &[],
                    };
                    let pace = clock.streak_pace(idle);
                    until_clock = turns_to_next_look(waited, pace, marks, settled_every);
                }
                until_clock -= 1;
                let slept = if mode == IdleMode::Adaptive && waited >= spin.window() {
                    if !burst_noted {
                        spin.burst_ended(state.commands_done());
                        burst_noted = true;
                    }
                    sleeper.try_sleep(state, stats)
                } else {
                    None
                };
                match slept {
                    // The poll after arming found work: the idle streak is over.
                    Some(work) if work > 0 => {
                        spin.learn(clock.busy_turn());
                        idle = 0;
                        until_clock = 0;
                        burst_noted = false;
                    }
                    // A sleep is long next to a turn: publish now, not 1024 sleeps later.
                    Some(_) => {
                        clock.publish(stats);
                        published = true;
                        until_clock = 0;
                    }
                    None if mode == IdleMode::Pure => {}
                    None if waited >= NAP_AFTER => std::thread::sleep(NAP),
                    None if waited >= YIELD_AFTER => std::thread::yield_now(),
                    None => {}
                }
            }
        }
        // Publish counters in batches: one relaxed store per 1024 turns, not per turn.
        if !published && (clock.busy_turns + clock.idle_turns) & 1023 == 0 {
            clock.publish(stats);
        }
        if let Some(now) = clock.reading.take() {
            state.observe_clock(now);
        }
    }
    clock.publish(stats);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_masks_in_spdk_forms() {
        assert_eq!(parse_core_mask("0x3"), Ok(vec![0, 1]));
        assert_eq!(parse_core_mask("0X5"), Ok(vec![0, 2]));
        assert_eq!(parse_core_mask("6"), Ok(vec![1, 2]));
        assert_eq!(parse_core_mask("[0,2-3]"), Ok(vec![0, 2, 3]));
        assert_eq!(parse_core_mask("0x0"), Err(CoreMaskError::Empty));
        assert!(matches!(
            parse_core_mask("0xZ"),
            Err(CoreMaskError::Syntax(_))
        ));
        assert!(matches!(
            parse_core_mask("[3-1]"),
            Err(CoreMaskError::Syntax(_))
        ));
        assert!(matches!(
            check_cores(&[4096]),
            Err(CoreMaskError::Unavailable { core: 4096, .. })
        ));
    }

    struct Counter {
        turns: Arc<AtomicU64>,
        work_left: u32,
        shut: Arc<AtomicBool>,
    }

    impl Pollable for Counter {
        fn poll(&mut self) -> usize {
            self.turns.fetch_add(1, Ordering::Relaxed);
            if self.work_left > 0 {
                self.work_left -= 1;
                1
            } else {
                0
            }
        }
        fn shutdown(&mut self) {
            self.shut.store(true, Ordering::Release);
        }
    }

    /// Counts its turns and the clock readings the reactor hands it.
    struct Timekeeper {
        turns: Arc<AtomicU64>,
        readings: Arc<AtomicU64>,
        last: Option<Instant>,
    }

    impl Pollable for Timekeeper {
        fn poll(&mut self) -> usize {
            self.turns.fetch_add(1, Ordering::Relaxed);
            0
        }
        fn observe_clock(&mut self, now: Instant) {
            assert!(self.last.is_none_or(|last| now >= last), "time went back");
            self.last = Some(now);
            self.readings.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An idle reactor reads the clock once per few turns (each read can be a syscall) and
    /// hands every reading to its state, so the state need not read it again.
    #[test]
    fn an_idle_reactor_reads_the_clock_sparingly_and_hands_each_reading_over() {
        // Pure polling decides nothing by the clock; back-off times its yields and naps.
        for (mode, every) in [(IdleMode::Pure, 64u64), (IdleMode::Backoff, 8)] {
            let turns = Arc::new(AtomicU64::new(0));
            let readings = Arc::new(AtomicU64::new(0));
            let (r, ()) = Reactor::spawn(0, "clock".into(), mode, {
                let (turns, readings) = (Arc::clone(&turns), Arc::clone(&readings));
                move |_| {
                    let state = Timekeeper {
                        turns,
                        readings,
                        last: None,
                    };
                    (state, ())
                }
            })
            .unwrap();
            std::thread::sleep(Duration::from_millis(200));
            r.join();
            let (turns, readings) = (
                turns.load(Ordering::Relaxed),
                readings.load(Ordering::Relaxed),
            );
            assert!(readings >= 2, "{mode:?}: no reading handed over");
            // One per `every` idle turns past the first 64, one per 1,024 turns to publish.
            let most = turns / every + turns / 1024 + 2;
            assert!(
                readings <= most,
                "{mode:?}: {readings} readings in {turns} turns (at most {most})"
            );
        }
    }

    struct Panics;

    impl Pollable for Panics {
        fn poll(&mut self) -> usize {
            panic!("a poll that panics (test)");
        }
        fn shutdown(&mut self) {}
    }

    #[test]
    fn a_reactor_that_panics_is_seen_dead_and_a_stopped_one_is_not() {
        let (dead, ()) =
            Reactor::spawn(0, "dies".into(), IdleMode::Adaptive, |_| (Panics, ())).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dead.died() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(dead.died(), "a panicked reactor must be reported dead");
        let turns = Arc::new(AtomicU64::new(0));
        let shut = Arc::new(AtomicBool::new(false));
        let (t, s) = (Arc::clone(&turns), Arc::clone(&shut));
        let (alive, ()) = Reactor::spawn(0, "lives".into(), IdleMode::Adaptive, move |_| {
            let state = Counter {
                turns: t,
                work_left: 0,
                shut: s,
            };
            (state, ())
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!alive.died());
        alive.request_stop();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!alive.died(), "stopping on request is not dying");
        alive.join();
        dead.join();
        assert!(shut.load(Ordering::Acquire));
    }

    #[test]
    fn reactor_polls_until_stopped_and_shuts_its_state_down() {
        let turns = Arc::new(AtomicU64::new(0));
        let shut = Arc::new(AtomicBool::new(false));
        let (t, s) = (Arc::clone(&turns), Arc::clone(&shut));
        let (reactor, handle) =
            Reactor::spawn(0, "test-reactor".into(), IdleMode::Adaptive, move |_| {
                (
                    Counter {
                        turns: t,
                        work_left: 5,
                        shut: s,
                    },
                    42u32,
                )
            })
            .unwrap();
        assert_eq!(handle, 42);
        while turns.load(Ordering::Relaxed) < 100 {
            std::thread::yield_now();
        }
        let stats = Arc::clone(&reactor.stats);
        reactor.join();
        assert!(shut.load(Ordering::Acquire));
        assert_eq!(stats.busy_turns.load(Ordering::Relaxed), 5);
        assert!(stats.idle_turns.load(Ordering::Relaxed) >= 95);
        assert!(stats.busy_ns.load(Ordering::Relaxed) > 0);
        assert_ne!(stats.tid.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_idle_reactor_accounts_its_time_as_idle() {
        let turns = Arc::new(AtomicU64::new(0));
        let shut = Arc::new(AtomicBool::new(false));
        let (t, s) = (Arc::clone(&turns), Arc::clone(&shut));
        let (reactor, ()) =
            Reactor::spawn(0, "idle-reactor".into(), IdleMode::Backoff, move |_| {
                let state = Counter {
                    turns: t,
                    work_left: 0,
                    shut: s,
                };
                (state, ())
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let stats = Arc::clone(&reactor.stats);
        reactor.join();
        let (busy, idle) = (
            stats.busy_ns.load(Ordering::Relaxed),
            stats.idle_ns.load(Ordering::Relaxed),
        );
        // 200 ms with nothing to do: idle time dominates; only the first idle streak's 64
        // turns before the clock count as busy.
        assert!(idle >= 100_000_000, "idle {idle} ns");
        assert!(busy < idle / 4, "busy {busy} ns, idle {idle} ns");
    }
}

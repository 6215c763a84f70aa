//! How an idle reactor times itself: the spin window it learns from the gaps between work
//! ([`SpinWindow`]), and the few clock readings it splits busy from idle time with
//! ([`TurnClock`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{ReactorStats, SLEEP_AFTER};

/// How long an adaptive reactor spins before it sleeps: three times the typical gap between the
/// end of its work and the next work (a moving average), between [`SLEEP_AFTER`] and a cap,
/// as long as commands come one per burst; [`SLEEP_AFTER`] once bursts carry several.
///
/// A host at queue depth 1 sends its next command one round trip after our response: gaps
/// all alike, so the reactor spins through them and answers as fast as pure polling (a
/// wake-up costs tens of microseconds on hardware, far more under emulation). Under load the
/// gaps are mostly zero-length and the window shrinks, so a lull soon ends in sleep and the
/// core goes to whatever else needs it (on soft-RoCE, the NIC). Idle, one window is spun once,
/// then the reactor sleeps until work or its timer.
///
/// Hosts that keep several commands in flight (queue depth, or many hosts at once) make bursts
/// of several commands each, and then spinning through a gap buys nothing: the next burst
/// brings several commands whenever it comes, a wake-up is paid once for all of them, and the
/// time spun is CPU taken from the NIC and the hosts (on soft-RoCE, measured in the lab's
/// `cpu-breakdown`: at queue depth 32 spinning cost a third more CPU per I/O than sleeping,
/// for fewer I/Os). So the window is learnt only while bursts carry one command each.
pub(super) struct SpinWindow {
    typical_gap_ns: u64,
    max: Duration,
    /// Moving average of the commands a burst of work carried, in sixteenths (bursts
    /// without a command, such as timers or send completions alone, are not counted).
    commands_per_burst_x16: u64,
    /// The reactor's command count at the end of the last burst.
    commands_seen: u64,
}

/// Bursts carrying this many commands (in sixteenths: 1.5) on average mean hosts keep
/// several commands in flight.
const CONCURRENT_BURST_X16: u64 = 24;

impl SpinWindow {
    pub(super) fn new(max: Duration) -> Self {
        Self {
            typical_gap_ns: 0,
            max,
            commands_per_burst_x16: 16,
            commands_seen: 0,
        }
    }

    /// Work came back `gap` after the reactor ran out of it (zero for a gap too short to
    /// time). Gaps longer than the cap count as twice the cap: a night of idleness must not
    /// pin the window at its cap for the next hour of load.
    pub(super) fn learn(&mut self, gap: Duration) {
        let cap = 2 * self.max.as_nanos() as u64;
        let gap = (gap.as_nanos() as u64).min(cap) as i64;
        let avg = self.typical_gap_ns as i64;
        self.typical_gap_ns = (avg + (gap - avg) / 8) as u64;
    }

    /// A burst of work ended; `commands` is the reactor's running count of commands done.
    pub(super) fn burst_ended(&mut self, commands: u64) {
        let carried = commands.wrapping_sub(self.commands_seen).min(64);
        self.commands_seen = commands;
        if carried == 0 {
            return;
        }
        let avg = self.commands_per_burst_x16 as i64;
        self.commands_per_burst_x16 = (avg + (16 * carried as i64 - avg) / 8) as u64;
    }

    pub(super) fn window(&self) -> Duration {
        if self.commands_per_burst_x16 >= CONCURRENT_BURST_X16 {
            return SLEEP_AFTER;
        }
        Duration::from_nanos(3 * self.typical_gap_ns).clamp(SLEEP_AFTER, self.max.max(SLEEP_AFTER))
    }
}

/// Busy/idle turns and time of one reactor, kept on its thread and published in batches.
///
/// The clock is read after every turn that did work (the state takes that reading as its
/// time, [`super::Pollable::observe_clock`], instead of reading it again), at the looks an
/// idle streak takes at it ([`turns_to_next_look`]), and to publish. Time is split at those
/// readings: an idle streak counts as idle from its first look at the clock; the turns spun
/// before that look, and shorter streaks, count as busy.
pub(super) struct TurnClock {
    pub(super) busy_turns: u64,
    pub(super) idle_turns: u64,
    busy_ns: u64,
    idle_ns: u64,
    /// The start of the period not yet added to busy_ns or idle_ns. The period is idle from
    /// `idle_since` on, busy before it.
    period_start: Instant,
    idle_since: Option<Instant>,
    /// The reading taken after the last turn that did work: where the current idle streak
    /// began.
    streak_start: Instant,
    /// The last clock reading not yet handed to the state ([`super::Pollable::observe_clock`]).
    pub(super) reading: Option<Instant>,
}

impl TurnClock {
    pub(super) fn new() -> Self {
        let now = Instant::now();
        Self {
            busy_turns: 0,
            idle_turns: 0,
            busy_ns: 0,
            idle_ns: 0,
            period_start: now,
            idle_since: None,
            streak_start: now,
            reading: None,
        }
    }

    /// Reads the system clock: the one place the loop does.
    fn read(&mut self) -> Instant {
        let now = Instant::now();
        self.reading = Some(now);
        now
    }

    /// A turn did work: reads the clock (the state's time for its next turns, and the start
    /// of the next idle streak). Returns how long the idle streak this work ended lasted,
    /// zero if it was too short to look at the clock.
    pub(super) fn busy_turn(&mut self) -> Duration {
        self.busy_turns += 1;
        let now = self.read();
        self.streak_start = now;
        let Some(since) = self.idle_since.take() else {
            return Duration::ZERO;
        };
        // A publish during the streak already counted its start.
        self.idle_ns += nanos(since.max(self.period_start), now);
        self.period_start = now;
        now.saturating_duration_since(since)
    }

    /// How long the current idle streak has lasted since it first looked at the clock (it
    /// starts now if it had not: zero). The spin before that first look is the reactor's
    /// `min_spin_turns`, counted as busy time.
    pub(super) fn idle_for(&mut self) -> Duration {
        let now = self.read();
        match self.idle_since {
            Some(since) => now.saturating_duration_since(since),
            None => {
                self.busy_ns += nanos(self.period_start, now);
                self.period_start = now;
                self.idle_since = Some(now);
                Duration::ZERO
            }
        }
    }

    /// How long an idle turn of the current streak takes, on average over its `turns` turns
    /// up to the reading just made (not yet handed over): the streak began at the reading
    /// after the last work.
    pub(super) fn streak_pace(&self, turns: u32) -> Duration {
        let last = self.reading.unwrap_or(self.streak_start);
        last.saturating_duration_since(self.streak_start) / turns.max(1)
    }

    /// Adds the time since the period's start to busy or idle and stores every counter.
    pub(super) fn publish(&mut self, stats: &ReactorStats) {
        let now = self.read();
        match self.idle_since {
            Some(since) if since > self.period_start => {
                self.busy_ns += nanos(self.period_start, since);
                self.idle_ns += nanos(since, now);
            }
            Some(_) => self.idle_ns += nanos(self.period_start, now),
            None => self.busy_ns += nanos(self.period_start, now),
        }
        self.period_start = now;
        stats.busy_turns.store(self.busy_turns, Ordering::Relaxed);
        stats.idle_turns.store(self.idle_turns, Ordering::Relaxed);
        stats.busy_ns.store(self.busy_ns, Ordering::Relaxed);
        stats.idle_ns.store(self.idle_ns, Ordering::Relaxed);
    }
}

fn nanos(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_nanos() as u64
}

/// Idle turns beyond this are not spun without a look at the clock.
const MAX_LOOK_TURNS: u32 = 64;

/// When an idle streak should look at the clock next, in turns: it has lasted `waited`, a
/// turn takes `per_turn`, and what the reactor does changes at each of `marks` (sleep, yield,
/// nap). At that pace, the turns that reach the next mark (1 to [`MAX_LOOK_TURNS`]);
/// `settled` once every mark has passed.
///
/// A fixed step looked several times before each mark: where the clock is not served from
/// user space (the lab's TCG guests run on HPET, every read a syscall and an emulated device
/// access), that was 3 readings per I/O at queue depth 32. A turn's length varies (an
/// interrupt lands in one), so a look may come a few turns past its mark; the cost is those
/// turns, never a missed mark.
pub(super) fn turns_to_next_look(
    waited: Duration,
    per_turn: Duration,
    marks: &[Duration],
    settled: u32,
) -> u32 {
    let Some(next) = marks.iter().copied().filter(|&m| m > waited).min() else {
        return settled;
    };
    let per_turn = per_turn.as_nanos();
    if per_turn == 0 {
        return MAX_LOOK_TURNS;
    }
    let left = (next - waited).as_nanos();
    left.div_ceil(per_turn).clamp(1, u128::from(MAX_LOOK_TURNS)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_window_follows_the_gaps_between_work() {
        let mut spin = SpinWindow::new(Duration::from_millis(2));
        assert_eq!(spin.window(), SLEEP_AFTER, "nothing learned: sleep soon");
        // A host at queue depth 1: work comes back 600 µs after each response.
        for _ in 0..64 {
            spin.learn(Duration::from_micros(600));
        }
        let w = spin.window();
        assert!(
            w > Duration::from_micros(1650) && w <= Duration::from_micros(1800),
            "{w:?}"
        );
        // Longer gaps: the window stops at its cap.
        for _ in 0..64 {
            spin.learn(Duration::from_millis(5));
        }
        assert_eq!(spin.window(), Duration::from_millis(2));
        // Under load the gaps are too short to time: the window shrinks back.
        for _ in 0..128 {
            spin.learn(Duration::ZERO);
        }
        assert_eq!(spin.window(), SLEEP_AFTER);
        // One night of idleness weighs as twice the cap, not as the night.
        spin.learn(Duration::from_secs(36_000));
        assert!(
            spin.window() <= Duration::from_micros(1600),
            "{:?}",
            spin.window()
        );
        // A cap of zero: sleep after the shortest spin, whatever the gaps.
        let mut eager = SpinWindow::new(Duration::ZERO);
        eager.learn(Duration::from_millis(1));
        assert_eq!(eager.window(), SLEEP_AFTER);
    }

    #[test]
    fn bursts_of_several_commands_end_in_sleep_whatever_the_gaps() {
        let mut spin = SpinWindow::new(Duration::from_millis(2));
        let mut done = 0;
        let mut burst = |spin: &mut SpinWindow, commands: u64| {
            done += commands;
            spin.burst_ended(done);
            spin.learn(Duration::from_micros(600));
        };
        // Queue depth 1: one command per burst (and bursts of send completions alone).
        for _ in 0..64 {
            burst(&mut spin, 1);
            burst(&mut spin, 0);
        }
        let qd1 = spin.window();
        assert!(qd1 > Duration::from_micros(1600), "{qd1:?}");
        // Queue depth 32: bursts of a few commands, the same gaps between them.
        for _ in 0..8 {
            burst(&mut spin, 3);
        }
        assert_eq!(spin.window(), SLEEP_AFTER);
        // Back to one at a time: the learnt window returns.
        for _ in 0..16 {
            burst(&mut spin, 1);
        }
        assert_eq!(spin.window(), qd1);
        // A count that starts high (a reactor restarted its state) is one burst, capped.
        spin.burst_ended(u64::MAX);
        assert_eq!(spin.window(), SLEEP_AFTER);
    }

    #[test]
    fn an_idle_streak_looks_at_the_clock_when_its_pace_reaches_the_next_mark() {
        let us = Duration::from_micros;
        let ns = Duration::from_nanos;
        let marks = [us(20), us(100), Duration::from_millis(50)];
        // The first look (nothing waited yet), 250 ns a turn: 80 turns to the 20 µs mark,
        // more than the longest step.
        assert_eq!(
            turns_to_next_look(Duration::ZERO, ns(250), &marks, 8),
            MAX_LOOK_TURNS
        );
        // 16 µs waited: the 4 µs left take 16 turns.
        assert_eq!(turns_to_next_look(us(16), ns(250), &marks, 8), 16);
        // Past the sleep mark, the yield mark is next.
        assert_eq!(turns_to_next_look(us(90), ns(500), &marks, 8), 20);
        // A mark a fraction of a turn away: the very next turn.
        assert_eq!(turns_to_next_look(us(99) + ns(900), ns(250), &marks, 8), 1);
        // Every mark passed: the settled step.
        assert_eq!(
            turns_to_next_look(Duration::from_secs(1), ns(250), &marks, 8),
            8
        );
        // No marks at all (pure polling): the settled step too.
        assert_eq!(turns_to_next_look(us(16), ns(250), &[], 64), 64);
        // A clock too coarse to see a turn: the longest step, not a division by zero.
        assert_eq!(
            turns_to_next_look(us(16), Duration::ZERO, &marks, 8),
            MAX_LOOK_TURNS
        );
    }

    #[test]
    fn a_streak_paces_its_turns_from_the_end_of_the_work_before_it() {
        let mut clock = TurnClock::new();
        assert_eq!(clock.busy_turn(), Duration::ZERO, "no idle streak before");
        assert!(
            clock.reading.take().is_some(),
            "a busy turn reads the clock for the state"
        );
        // 10 idle turns that did not look at the clock, then the streak's first look.
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            clock.idle_for(),
            Duration::ZERO,
            "the first look starts the idle time"
        );
        assert!(clock.streak_pace(10) >= Duration::from_micros(500));
        std::thread::sleep(Duration::from_millis(1));
        assert!(clock.idle_for() >= Duration::from_millis(1));
        // Work ends the streak: idle from its first look.
        let gap = clock.busy_turn();
        assert!(gap >= Duration::from_millis(1), "{gap:?}");
        let stats = ReactorStats::default();
        clock.publish(&stats);
        assert!(stats.idle_ns.load(Ordering::Relaxed) >= 1_000_000);
        assert!(stats.busy_ns.load(Ordering::Relaxed) >= 5_000_000);
        assert_eq!(stats.busy_turns.load(Ordering::Relaxed), 2);
        // The next streak is paced from this work's end.
        assert!(clock.streak_pace(1) < Duration::from_millis(5));
    }
}

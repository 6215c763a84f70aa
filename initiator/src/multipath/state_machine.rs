//! [`MultipathCore`]: the multipath state machine of one namespace on one polling thread,
//! which picks a path for each I/O and decides what becomes of a completion.

use std::collections::VecDeque;
use std::time::Instant;

use crate::qpair::IoStatus;

use super::ana::AnaState;
use super::classify::{classify, Class};
use super::policy::{Link, PathView, Policy, Timers};
use super::stats::MultipathStats;

/// What became of a completion, for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the completion to the application (success or a final error).
    Done,
    /// Kept for a retry: it comes back from [`MultipathCore::ready`].
    Retry,
    /// Hand it to the application with this status instead.
    Fail(IoStatus),
}

/// Where a new or waiting I/O goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Path(usize),
    /// Kept until a path is usable (it comes back from [`MultipathCore::ready`]).
    Queued,
    Fail(IoStatus),
}

/// An I/O that left its waiting list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    Submit { id: usize, path: usize },
    Fail { id: usize, status: IoStatus },
}

/// How many times one I/O is sent again after a path error or an ANA state that bars its
/// path (Inaccessible, Persistent Loss), before it fails with the last status. Real
/// failovers take one or two; a target that keeps answering with a path error, or whose ANA
/// log keeps contradicting its statuses, would otherwise have the I/O go round for ever.
/// Retries in ANA Change are bounded by ANATT instead.
pub const MAX_PATH_RETRIES: u8 = 16;

struct Waiter {
    id: usize,
    not_before: Instant,
}

/// The multipath state machine of one namespace on one polling thread: path views,
/// selection, and the I/Os waiting for a path or a delay. I/Os are named by an `id` below
/// the capacity given to [`new`](Self::new).
pub struct MultipathCore {
    policy: Policy,
    timers: Timers,
    paths: Vec<PathView>,
    ana_refresh: Vec<bool>,
    rr: usize,
    no_path_since: Option<Instant>,
    waiting: VecDeque<Waiter>,
    /// Per I/O: when it first got ANA Transition (for the ANATT bound).
    transition_since: Vec<Option<Instant>>,
    /// Per I/O: its retries other than in ANA Change (bounded by [`MAX_PATH_RETRIES`]).
    retries: Vec<u8>,
    stats: MultipathStats,
}

impl MultipathCore {
    /// `paths` views in preference order; I/O ids are `0..capacity`.
    pub fn new(policy: Policy, timers: Timers, paths: Vec<PathView>, capacity: usize) -> Self {
        let n = paths.len();
        Self {
            policy,
            timers,
            paths,
            ana_refresh: vec![false; n],
            rr: 0,
            no_path_since: None,
            waiting: VecDeque::with_capacity(capacity),
            transition_since: vec![None; capacity],
            retries: vec![0; capacity],
            stats: MultipathStats {
                path_ios: vec![0; n],
                ..MultipathStats::default()
            },
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn paths(&self) -> &[PathView] {
        &self.paths
    }

    pub fn set_link(&mut self, path: usize, link: Link) {
        self.paths[path].link = link;
    }

    /// The path's ANA state as last read from its controller.
    pub fn set_ana(&mut self, path: usize, ana: AnaState) {
        self.paths[path].ana = ana;
    }

    /// Whether the path's ANA log should be read again (an ANA status came back through
    /// it); clears the request.
    pub fn take_ana_refresh(&mut self, path: usize) -> bool {
        std::mem::take(&mut self.ana_refresh[path])
    }

    pub fn stats(&self) -> &MultipathStats {
        &self.stats
    }

    /// I/Os waiting for a path or a retry delay.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The path for the next I/O, if any is usable (see the module docs for the policy).
    pub fn select(&mut self, now: Instant) -> Option<usize> {
        let pick = self.pick();
        match pick {
            Some(_) => self.no_path_since = None,
            None => {
                self.no_path_since.get_or_insert(now);
            }
        }
        pick
    }

    fn pick(&mut self) -> Option<usize> {
        let best = |want: AnaState| {
            self.paths
                .iter()
                .enumerate()
                .filter(move |(_, p)| p.link == Link::Up && p.ana == want)
                .map(|(i, _)| i)
        };
        let tier: Vec<usize> = {
            let opt: Vec<usize> = best(AnaState::Optimized).collect();
            if opt.is_empty() {
                best(AnaState::NonOptimized).collect()
            } else {
                opt
            }
        };
        if tier.is_empty() {
            return None;
        }
        match self.policy {
            Policy::ActivePassive => Some(tier[0]),
            Policy::ActiveActive => {
                // The first path of the tier after the last one used.
                let n = self.paths.len();
                let next = tier
                    .iter()
                    .copied()
                    .find(|&i| i >= self.rr)
                    .unwrap_or(tier[0]);
                self.rr = (next + 1) % n;
                Some(next)
            }
        }
    }

    fn all_lost(&self) -> bool {
        self.paths.iter().all(|p| p.link == Link::Lost)
    }

    /// Whether waiting for a path has lasted past fast-io-fail (or can never end).
    fn give_up(&self, now: Instant) -> bool {
        if self.all_lost() {
            return true;
        }
        match (self.timers.fast_io_fail, self.no_path_since) {
            (Some(limit), Some(since)) => now.saturating_duration_since(since) >= limit,
            _ => false,
        }
    }

    /// Routes a new I/O.
    pub fn submit(&mut self, id: usize, now: Instant) -> Route {
        self.transition_since[id] = None;
        self.retries[id] = 0;
        match self.select(now) {
            Some(p) => Route::Path(p),
            None if self.give_up(now) => {
                self.stats.no_path_failures += 1;
                Route::Fail(IoStatus::NoPath)
            }
            None => {
                self.waiting.push_back(Waiter {
                    id,
                    not_before: now,
                });
                Route::Queued
            }
        }
    }

    /// An I/O the caller could not hand to `path` after all (its queue refused it because
    /// the path broke meanwhile): it waits for another path.
    pub fn requeue(&mut self, id: usize, path: usize, now: Instant) {
        self.paths[path].link = Link::Down;
        self.stats.failovers += 1;
        self.waiting.push_back(Waiter {
            id,
            not_before: now,
        });
    }

    /// An I/O the chosen path had no room for: it waits for the next [`ready`](Self::ready).
    pub fn defer(&mut self, id: usize, now: Instant) {
        self.waiting.push_back(Waiter {
            id,
            not_before: now,
        });
    }

    /// The completion of I/O `id` sent through `path`.
    pub fn on_completion(
        &mut self,
        id: usize,
        path: usize,
        status: IoStatus,
        now: Instant,
    ) -> Verdict {
        match classify(status) {
            Class::Final => {
                if status.is_success() {
                    self.stats.path_ios[path] += 1;
                }
                self.transition_since[id] = None;
                Verdict::Done
            }
            Class::Ana(state) => {
                self.stats.ana_errors += 1;
                self.paths[path].ana = state;
                self.ana_refresh[path] = true;
                if state != AnaState::Change && self.out_of_retries(id) {
                    return Verdict::Fail(status);
                }
                let mut not_before = now;
                if state == AnaState::Change {
                    let since = *self.transition_since[id].get_or_insert(now);
                    if now.saturating_duration_since(since) > self.timers.anatt {
                        self.transition_since[id] = None;
                        return Verdict::Fail(status);
                    }
                    not_before = now + self.timers.transition_retry;
                }
                self.stats.failovers += 1;
                self.waiting.push_back(Waiter { id, not_before });
                Verdict::Retry
            }
            Class::PathDown => {
                if matches!(status, IoStatus::ControllerLost) {
                    self.paths[path].link = Link::Lost;
                } else if self.paths[path].link == Link::Up && !matches!(status, IoStatus::Nvme(_))
                {
                    self.paths[path].link = Link::Down;
                }
                // After the path's state is updated: other I/Os must not be routed to it.
                if self.out_of_retries(id) {
                    return Verdict::Fail(status);
                }
                self.stats.failovers += 1;
                self.waiting.push_back(Waiter {
                    id,
                    not_before: now,
                });
                Verdict::Retry
            }
        }
    }

    /// Counts a retry of I/O `id`; true when it has had [`MAX_PATH_RETRIES`] already.
    fn out_of_retries(&mut self, id: usize) -> bool {
        if self.retries[id] >= MAX_PATH_RETRIES {
            self.stats.retries_exhausted += 1;
            self.transition_since[id] = None;
            return true;
        }
        self.retries[id] += 1;
        false
    }

    /// Waiting I/Os whose time has come: each is given a path, or fails (no path past
    /// fast-io-fail, or every path lost). The others keep waiting.
    pub fn ready(&mut self, now: Instant, out: &mut Vec<Ready>) {
        let mut keep = VecDeque::new();
        while let Some(w) = self.waiting.pop_front() {
            if w.not_before > now {
                keep.push_back(w);
                continue;
            }
            match self.select(now) {
                Some(path) => out.push(Ready::Submit { id: w.id, path }),
                None if self.give_up(now) => {
                    self.stats.no_path_failures += 1;
                    self.transition_since[w.id] = None;
                    out.push(Ready::Fail {
                        id: w.id,
                        status: IoStatus::NoPath,
                    });
                }
                None => keep.push_back(w),
            }
        }
        self.waiting = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use nvmf_common::spec::Status;

    const OPT: PathView = PathView::UP_OPTIMIZED;
    const NONOPT: PathView = PathView {
        link: Link::Up,
        ana: AnaState::NonOptimized,
    };

    fn core(policy: Policy, paths: Vec<PathView>) -> MultipathCore {
        MultipathCore::new(
            policy,
            Timers {
                fast_io_fail: Some(Duration::from_secs(5)),
                transition_retry: Duration::from_millis(100),
                anatt: Duration::from_secs(2),
            },
            paths,
            64,
        )
    }

    #[test]
    fn ana_states_decide_the_path() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![NONOPT, OPT]);
        assert_eq!(
            c.select(t),
            Some(1),
            "optimized beats an earlier non-optimized"
        );
        c.set_ana(1, AnaState::Inaccessible);
        assert_eq!(
            c.select(t),
            Some(0),
            "non-optimized when nothing is optimized"
        );
        for never in [
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
            AnaState::Reserved(7),
        ] {
            c.set_ana(0, never);
            assert_eq!(c.select(t), None, "{never} is never chosen");
        }
        c.set_ana(0, AnaState::Optimized);
        c.set_ana(1, AnaState::Optimized);
        assert_eq!(c.select(t), Some(0), "active-passive: the first optimized");
        assert_eq!(c.select(t), Some(0));
        c.set_link(0, Link::Down);
        assert_eq!(c.select(t), Some(1), "a down path is skipped");
    }

    #[test]
    fn inaccessible_status_retries_on_the_other_path() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        assert_eq!(c.submit(3, t), Route::Path(0));
        let v = c.on_completion(3, 0, IoStatus::Nvme(Status::ANA_INACCESSIBLE), t);
        assert_eq!(v, Verdict::Retry);
        assert_eq!(c.paths()[0].ana, AnaState::Inaccessible);
        assert!(c.take_ana_refresh(0), "the ANA log is read again");
        assert!(!c.take_ana_refresh(0));
        let mut out = Vec::new();
        c.ready(t, &mut out);
        assert_eq!(out, [Ready::Submit { id: 3, path: 1 }]);
        assert_eq!(c.stats().failovers, 1);
        assert_eq!(c.stats().ana_errors, 1);
        // Persistent loss likewise; and with DNR the error is final.
        let v = c.on_completion(3, 1, IoStatus::Nvme(Status::ANA_PERSISTENT_LOSS), t);
        assert_eq!(v, Verdict::Retry);
        assert_eq!(c.paths()[1].ana, AnaState::PersistentLoss);
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        let dnr = Status::ANA_INACCESSIBLE.with_dnr();
        assert_eq!(c.on_completion(1, 0, IoStatus::Nvme(dnr), t), Verdict::Done);
        assert_eq!(c.paths()[0].ana, AnaState::Optimized);
        // Other NVMe errors are the application's.
        let v = c.on_completion(1, 0, IoStatus::Nvme(Status::LBA_OUT_OF_RANGE), t);
        assert_eq!(v, Verdict::Done);
        assert_eq!(c.waiting(), 0);
    }

    /// A target that answers every attempt with a path error, or keeps saying Inaccessible
    /// while its ANA log says Optimized: the I/O fails after its retries, with the status.
    #[test]
    fn an_io_a_target_keeps_bouncing_fails_after_its_retries() {
        let t = Instant::now();
        let path_error = IoStatus::Nvme(Status::INTERNAL_PATH_ERROR);
        let inaccessible = IoStatus::Nvme(Status::ANA_INACCESSIBLE);
        for status in [path_error, inaccessible] {
            let mut c = core(Policy::ActivePassive, vec![OPT]);
            assert_eq!(c.submit(5, t), Route::Path(0));
            let mut attempts = 1;
            let verdict = loop {
                let v = c.on_completion(5, 0, status, t);
                if v != Verdict::Retry {
                    break v;
                }
                // The log read that follows says the path is fine.
                c.set_ana(0, AnaState::Optimized);
                let mut out = Vec::new();
                c.ready(t, &mut out);
                assert_eq!(out, [Ready::Submit { id: 5, path: 0 }], "{status:?}");
                attempts += 1;
                assert!(attempts <= 100, "{status:?}: retried for ever");
            };
            assert_eq!(verdict, Verdict::Fail(status));
            assert_eq!(attempts, 1 + u32::from(MAX_PATH_RETRIES));
            assert_eq!(
                c.paths()[0].link,
                Link::Up,
                "an NVMe path error leaves the link"
            );
            assert_eq!(c.stats().retries_exhausted, 1);
            assert_eq!(c.waiting(), 0);
            // A new I/O in the same slot starts with its full budget.
            c.set_ana(0, AnaState::Optimized);
            assert_eq!(c.submit(5, t), Route::Path(0));
            assert_eq!(c.on_completion(5, 0, status, t), Verdict::Retry);
        }
    }

    /// The failure that uses up an I/O's last retry still marks its path: a lost
    /// controller is not routed to again.
    #[test]
    fn the_last_retry_still_marks_a_lost_path() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        assert_eq!(c.submit(2, t), Route::Path(0));
        for _ in 0..MAX_PATH_RETRIES {
            assert_eq!(
                c.on_completion(2, 0, IoStatus::PathError, t),
                Verdict::Retry
            );
            c.set_link(0, Link::Up);
            let mut out = Vec::new();
            c.ready(t, &mut out);
        }
        let v = c.on_completion(2, 0, IoStatus::ControllerLost, t);
        assert_eq!(v, Verdict::Fail(IoStatus::ControllerLost));
        assert_eq!(c.paths()[0].link, Link::Lost);
        assert_eq!(c.select(t), Some(1));
    }

    #[test]
    fn transition_retries_after_a_delay_within_anatt() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT]);
        assert_eq!(c.submit(0, t), Route::Path(0));
        let st = IoStatus::Nvme(Status::ANA_TRANSITION);
        assert_eq!(c.on_completion(0, 0, st, t), Verdict::Retry);
        assert_eq!(c.paths()[0].ana, AnaState::Change);
        let mut out = Vec::new();
        c.ready(t + Duration::from_millis(50), &mut out);
        assert!(out.is_empty(), "not before the retry delay");
        // The ANA log says the transition ended: the same path serves the retry.
        c.set_ana(0, AnaState::Optimized);
        c.ready(t + Duration::from_millis(100), &mut out);
        assert_eq!(out, [Ready::Submit { id: 0, path: 0 }]);
        // Transitions for longer than ANATT fail the I/O with the path's status.
        let t1 = t + Duration::from_millis(100);
        assert_eq!(c.on_completion(0, 0, st, t1), Verdict::Retry);
        let late = t + Duration::from_millis(2101);
        assert_eq!(c.on_completion(0, 0, st, late), Verdict::Fail(st));
        // A new I/O in the same slot starts its own ANATT clock.
        c.set_ana(0, AnaState::Optimized);
        assert_eq!(c.submit(0, late), Route::Path(0));
        assert_eq!(c.on_completion(0, 0, st, late), Verdict::Retry);
    }

    #[test]
    fn both_paths_down_queue_then_fail_after_fast_io_fail() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        assert_eq!(c.submit(0, t), Route::Path(0));
        assert_eq!(c.submit(1, t), Route::Path(0));
        assert_eq!(
            c.on_completion(0, 0, IoStatus::PathError, t),
            Verdict::Retry
        );
        assert_eq!(c.paths()[0].link, Link::Down);
        c.set_link(1, Link::Down);
        assert_eq!(
            c.on_completion(1, 0, IoStatus::TransportError, t),
            Verdict::Retry
        );
        assert_eq!(c.submit(2, t), Route::Queued);
        let mut out = Vec::new();
        c.ready(t + Duration::from_secs(4), &mut out);
        assert!(out.is_empty(), "queued within fast-io-fail");
        assert_eq!(c.waiting(), 3);
        c.ready(t + Duration::from_secs(5), &mut out);
        assert_eq!(
            out,
            [0, 1, 2].map(|id| Ready::Fail {
                id,
                status: IoStatus::NoPath
            })
        );
        assert_eq!(c.stats().no_path_failures, 3);
        assert_eq!(
            c.submit(4, t + Duration::from_secs(6)),
            Route::Fail(IoStatus::NoPath)
        );
        // A path back before the limit takes the queued I/O.
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        c.set_link(0, Link::Down);
        c.set_link(1, Link::Down);
        assert_eq!(c.submit(7, t), Route::Queued);
        c.set_link(1, Link::Up);
        out.clear();
        c.ready(t + Duration::from_secs(4), &mut out);
        assert_eq!(out, [Ready::Submit { id: 7, path: 1 }]);
    }

    #[test]
    fn without_fast_io_fail_io_waits_until_every_path_is_lost() {
        let t = Instant::now();
        let mut c = MultipathCore::new(Policy::ActivePassive, Timers::default(), vec![OPT, OPT], 8);
        c.set_link(0, Link::Down);
        c.set_link(1, Link::Down);
        assert_eq!(c.submit(0, t), Route::Queued);
        let mut out = Vec::new();
        c.ready(t + Duration::from_secs(3600), &mut out);
        assert!(out.is_empty());
        c.set_link(0, Link::Lost);
        assert_eq!(
            c.on_completion(1, 1, IoStatus::ControllerLost, t),
            Verdict::Retry
        );
        assert_eq!(c.paths()[1].link, Link::Lost);
        c.ready(t + Duration::from_secs(3600), &mut out);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|r| matches!(
            r,
            Ready::Fail {
                status: IoStatus::NoPath,
                ..
            }
        )));
    }

    #[test]
    fn failback_to_the_optimized_path() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT, NONOPT]);
        assert_eq!(c.submit(0, t), Route::Path(0));
        assert_eq!(
            c.on_completion(0, 0, IoStatus::PathError, t),
            Verdict::Retry
        );
        let mut out = Vec::new();
        c.ready(t, &mut out);
        assert_eq!(out, [Ready::Submit { id: 0, path: 1 }]);
        assert_eq!(
            c.on_completion(0, 1, IoStatus::Nvme(Status::SUCCESS), t),
            Verdict::Done
        );
        assert_eq!(c.submit(1, t), Route::Path(1));
        // Path 0 reconnects, but its ANA state is read again first: still inaccessible.
        c.set_link(0, Link::Up);
        c.set_ana(0, AnaState::Inaccessible);
        assert_eq!(c.submit(2, t), Route::Path(1));
        c.set_ana(0, AnaState::Optimized);
        assert_eq!(c.submit(3, t), Route::Path(0), "fails back once optimized");
        assert_eq!(
            c.on_completion(3, 0, IoStatus::Nvme(Status::SUCCESS), t),
            Verdict::Done
        );
        assert_eq!(c.stats().path_ios, [1, 1]);
    }

    #[test]
    fn round_robin_spreads_over_optimized_paths() {
        let t = Instant::now();
        let mut c = core(Policy::ActiveActive, vec![OPT, OPT, NONOPT]);
        let picks: Vec<_> = (0..6).map(|_| c.select(t).unwrap()).collect();
        assert_eq!(
            picks,
            [0, 1, 0, 1, 0, 1],
            "non-optimized unused while any is"
        );
        c.set_link(0, Link::Down);
        let picks: Vec<_> = (0..3).map(|_| c.select(t).unwrap()).collect();
        assert_eq!(picks, [1, 1, 1]);
        c.set_ana(1, AnaState::Inaccessible);
        let mut c2 = core(Policy::ActiveActive, vec![NONOPT, NONOPT]);
        let picks: Vec<_> = (0..4).map(|_| c2.select(t).unwrap()).collect();
        assert_eq!(
            picks,
            [0, 1, 0, 1],
            "over non-optimized when none is optimized"
        );
        assert_eq!(c.select(t), Some(2));
    }
}

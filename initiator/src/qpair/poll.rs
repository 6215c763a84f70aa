//! Polling: completions off the CQ, the resubmission of commands that waited for a slot,
//! and the timeout scan.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvmf_common::rdma::Verbs;

use crate::controller::STATE_LIVE;
use crate::transport::{RdmaQueue, POLL_BATCH};

use super::reconnect::Teardown;
use super::{IoCompletion, IoQpair, IoStatus, QpairState, TIMEOUT_SCAN};

/// Finds the slot whose command is older than `timeout` (the oldest such one).
pub(crate) fn find_expired<I>(slots: I, now: Instant, timeout: Duration) -> Option<usize>
where
    I: IntoIterator<Item = Option<Instant>>,
{
    slots
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .filter(|&(_, t)| now.saturating_duration_since(t) > timeout)
        .min_by_key(|&(_, t)| t)
        .map(|(i, _)| i)
}

impl<V: Verbs> IoQpair<V> {
    /// At most `max` commands complete per [`poll`](Self::poll) (spdk_nvme_perf's `-C`);
    /// 0 restores the default, as many as one CQ batch holds.
    pub fn set_max_completions(&mut self, max: u32) {
        self.poll_limit = match max {
            0 => POLL_BATCH,
            n => (n as usize).min(POLL_BATCH),
        };
    }

    /// Polls for completions and appends them to `out` (give it capacity for `depth`
    /// entries up front and reuse it, so no call allocates). Also drives timeouts, failure
    /// handling and the reconnect of this qpair. Returns how many completions were added.
    pub fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let before = out.len();
        match self.state {
            QpairState::Live => self.poll_live(out),
            QpairState::Reconnecting => self.poll_down(out),
            QpairState::Failed => {}
        }
        let added = out.len() - before;
        self.stats.completed += added as u64;
        added
    }

    /// [`poll`](Self::poll) with a callback; the callback cannot submit (use `poll` with a
    /// vector for that).
    pub fn poll_with(
        &mut self,
        out: &mut Vec<IoCompletion>,
        mut f: impl FnMut(IoCompletion),
    ) -> usize {
        let n = self.poll(out);
        for c in out.drain(..) {
            f(c);
        }
        n
    }

    fn poll_live(&mut self, out: &mut Vec<IoCompletion>) {
        if let Some(f) = self.pending_fault.take() {
            return self.teardown(Teardown::Fault(f), out);
        }
        let shared = &self.shared;
        if shared.generation.load(Ordering::Acquire) != self.gen || shared.state() != STATE_LIVE {
            return self.teardown(Teardown::ControllerReset, out);
        }
        let q = self.queue.as_mut().expect("a live qpair has a queue");
        let n = match q.poll(&mut self.raw, self.poll_limit) {
            Ok(n) => n,
            Err(f) => return self.teardown(Teardown::Fault(f), out),
        };
        for &(cid, cqe) in &self.raw[..n] {
            let io = self.ios[usize::from(cid)]
                .take()
                .expect("the queue only completes outstanding CIDs");
            out.push(IoCompletion {
                tag: io.tag,
                status: IoStatus::Nvme(cqe.status()),
                dw0: cqe.dw0.get(),
                buf: io.buf,
            });
        }
        // Commands that waited for a slot.
        while !self.requeue.is_empty() && self.queue.as_ref().is_some_and(RdmaQueue::has_free_slot)
        {
            let io = self.requeue.pop_front().expect("not empty");
            if let Err(io) = self.post(io) {
                self.requeue.push_front(io);
                break;
            }
        }
        // On the clock, busy or not: one stuck command among many moving ones must still
        // time out.
        let now = self.shared.verbs.now();
        if now >= self.next_scan {
            self.next_scan = now + TIMEOUT_SCAN;
            if let Some(f) = self.queue.as_ref().and_then(RdmaQueue::check_cm) {
                return self.teardown(Teardown::Fault(f), out);
            }
            let timeout = self.shared.opts.io_timeout;
            if let Some(cid) = find_expired(
                self.ios.iter().map(|i| i.as_ref().map(|io| io.submitted)),
                now,
                timeout,
            ) {
                self.teardown(Teardown::Timeout(cid as u16), out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_finds_the_oldest_overdue() {
        let now = Instant::now() + Duration::from_secs(100);
        let t = |secs_ago: u64| Some(now - Duration::from_secs(secs_ago));
        let slots = [t(1), None, t(40), t(31), t(29)];
        assert_eq!(find_expired(slots, now, Duration::from_secs(30)), Some(2));
        assert_eq!(find_expired(slots, now, Duration::from_secs(60)), None);
        assert_eq!(find_expired([None, None], now, Duration::ZERO), None);
        // Exactly at the limit is not yet expired.
        assert_eq!(find_expired([t(30)], now, Duration::from_secs(30)), None);
    }
}

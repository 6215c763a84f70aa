//! The buffers Compare reads the media into, one pool per reactor, and the FIFO of Compares
//! waiting for one.
//!
//! A Compare holds its buffer while its read is with the bdev, which on slow media is long:
//! one host keeping the pool busy must delay, not fail, another host's Compares (answered
//! Command Interrupted, Linux retries five times at once and then fails the I/O). So a
//! Compare that finds no buffer, or finds others already waiting, waits its turn: each
//! turn of the reactor wakes as many waiters, oldest first, as there are free buffers, and
//! until they have run, no newcomer takes a buffer. Every buffer out of the pool belongs to
//! a read in flight, which completes, so a waiter always gets one.

use std::collections::VecDeque;

use nvmf_common::buffer::{BufferPool, IoBuf};

use crate::core::request::{ReqTag, Wakeup};

/// Buffers per reactor, each of the largest transfer.
const COMPARE_BUFFERS: u32 = 32;

/// What a Compare gets.
pub(crate) enum Take {
    Buffer(IoBuf),
    /// Wait for [`Wakeup::CompareBuffer`] (the command has been queued).
    Queued,
    /// No pool could be made, or its buffers are smaller than this transfer.
    Unavailable,
}

#[derive(Default)]
pub(crate) struct CompareBuffers {
    pool: Option<BufferPool>,
    waiters: VecDeque<ReqTag>,
    /// Waiters woken whose turn has not run yet: each will take a free buffer.
    woken: usize,
    /// The command now executing was woken: it takes a buffer ahead of the queue.
    granted: bool,
}

impl CompareBuffers {
    /// A buffer of at least `len` bytes for the Compare `tag`, or its place in the queue.
    /// The pool is made on first use with buffers of `max_transfer` bytes.
    pub(crate) fn take(&mut self, tag: ReqTag, len: u32, max_transfer: u32) -> Take {
        let granted = std::mem::take(&mut self.granted);
        if self.pool.is_none() {
            let size = (max_transfer as usize).next_multiple_of(4096);
            self.pool = BufferPool::new(size, COMPARE_BUFFERS).ok();
        }
        let Some(pool) = &self.pool else {
            return Take::Unavailable;
        };
        if pool.buf_size() < len as usize {
            return Take::Unavailable;
        }
        let first = granted || (self.waiters.is_empty() && self.woken == 0);
        if first {
            if let Some(buf) = pool.get() {
                return Take::Buffer(buf);
            }
        }
        // A woken waiter that lost its buffer keeps its place at the head.
        if granted {
            self.waiters.push_front(tag);
        } else {
            self.waiters.push_back(tag);
        }
        Take::Queued
    }

    /// A woken Compare's turn: the next [`take`](Self::take) is its own.
    pub(crate) fn resuming(&mut self, granted: bool) {
        self.woken = self.woken.saturating_sub(1);
        self.granted = granted;
    }

    /// Ends a woken Compare's turn (it may not have reached `take`).
    pub(crate) fn resumed(&mut self) {
        self.granted = false;
    }

    pub(crate) fn has_waiters(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// Wakes the oldest waiters, one per free buffer; returns how many. The reactor
    /// dispatches a turn's wakeups before its next turn, so the waiters woken last turn have
    /// had theirs (a wakeup a transport drops, for a queue gone, promises nothing past it).
    pub(crate) fn wake(&mut self, wakeups: &mut Vec<(ReqTag, Wakeup)>) -> usize {
        self.woken = 0;
        let free = self.pool.as_ref().map_or(0, BufferPool::available);
        let n = free.min(self.waiters.len());
        for tag in self.waiters.drain(..n) {
            wakeups.push((tag, Wakeup::CompareBuffer));
        }
        self.woken += n;
        n
    }

    /// Compares waiting, woken ones included.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiters.len() + self.woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(wakeups: &[(ReqTag, Wakeup)]) -> Vec<ReqTag> {
        wakeups.iter().map(|(t, _)| *t).collect()
    }

    /// The pool's buffers go first come, first served: a Compare arriving while others wait
    /// queues behind them even when a buffer is free, and a woken waiter takes the buffer
    /// it was woken for.
    #[test]
    fn compares_wait_their_turn_for_a_buffer() {
        let mut cb = CompareBuffers::default();
        let tag = |n: u32| ReqTag::new(0, u64::from(n));
        let mut held: Vec<IoBuf> = (0..COMPARE_BUFFERS)
            .map(|n| match cb.take(tag(n), 4096, 4096) {
                Take::Buffer(b) => b,
                _ => panic!("the pool has {COMPARE_BUFFERS} buffers"),
            })
            .collect();
        assert!(matches!(cb.take(tag(100), 512, 4096), Take::Queued));
        assert!(matches!(cb.take(tag(101), 512, 4096), Take::Queued));
        let mut wakeups = Vec::new();
        assert_eq!(cb.wake(&mut wakeups), 0, "no buffer is free");
        held.pop();
        // A newcomer does not pass the queue, and one buffer wakes one waiter, the oldest.
        assert!(matches!(cb.take(tag(102), 512, 4096), Take::Queued));
        assert_eq!(cb.wake(&mut wakeups), 1);
        assert_eq!(woken(&wakeups), [tag(100)]);
        cb.resuming(true);
        let Take::Buffer(buf) = cb.take(tag(100), 512, 4096) else {
            panic!("the woken waiter found no buffer");
        };
        held.push(buf);
        cb.resumed();
        assert_eq!(cb.waiting(), 2);
        // A woken waiter that finds no buffer keeps its place at the head.
        held.pop();
        wakeups.clear();
        assert_eq!(cb.wake(&mut wakeups), 1);
        assert_eq!(woken(&wakeups), [tag(101)]);
        let stolen = match cb.take(tag(103), 512, 4096) {
            Take::Queued => None,
            Take::Buffer(b) => Some(b),
            Take::Unavailable => panic!(),
        };
        assert!(stolen.is_none(), "a newcomer took a promised buffer");
        cb.resuming(true);
        let _taken_elsewhere = cb.pool.as_ref().unwrap().get();
        assert!(matches!(cb.take(tag(101), 512, 4096), Take::Queued));
        cb.resumed();
        assert_eq!(cb.waiters.front(), Some(&tag(101)));
        // Larger than the pool's buffers: refused, not queued.
        assert!(matches!(cb.take(tag(104), 8192, 4096), Take::Unavailable));
    }
}

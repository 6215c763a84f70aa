//! The poll group's FIFOs of requests waiting for a resource shared by its qpairs (data buffer,
//! send queue room). A wait for a READ credit is its qpair's alone (`Qpair::awaiting_read`).
//!
//! An entry can outlive what it names: closing a qpair frees its requests but leaves their
//! entries queued, and once the qpair is reaped its index may go to a new connection with fewer
//! slots. So an entry carries the qpair generation it was queued under, and it is served only
//! while that generation is live and its slot exists and is still in the queue's state; any
//! other entry is stale and dropped without touching the slot.

use std::collections::VecDeque;

use super::request::{RdmaRequest, State};

/// What a wait-queue entry is checked against: a live qpair's generation and request slots.
pub trait RequestSlots {
    fn generation(&self) -> u8;
    fn requests(&self) -> &[RdmaRequest];
}

/// One waiting request: qpair index, the generation of the qpair that held the index when the
/// request was queued, and the request's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub qpair: usize,
    pub gen: u8,
    pub slot: u32,
}

impl Waiter {
    /// Whether this entry still names a request in state `want` of the qpair it was queued
    /// for. Looks the qpair and the slot up without indexing, so a stale entry never panics.
    pub fn is_current<Q: RequestSlots>(&self, qpairs: &[Option<Q>], want: State) -> bool {
        qpairs
            .get(self.qpair)
            .and_then(Option::as_ref)
            .is_some_and(|qp| {
                qp.generation() == self.gen
                    && qp
                        .requests()
                        .get(self.slot as usize)
                        .is_some_and(|r| r.state == want)
            })
    }
}

/// A FIFO of requests waiting in one state.
pub struct WaitQueue {
    want: State,
    entries: VecDeque<Waiter>,
}

impl WaitQueue {
    pub fn new(want: State) -> Self {
        Self {
            want,
            entries: VecDeque::new(),
        }
    }

    pub fn push(&mut self, w: Waiter) {
        self.entries.push_back(w);
    }

    /// Queues `w` ahead of every other entry (a request that waited elsewhere first).
    pub fn push_front(&mut self, w: Waiter) {
        self.entries.push_front(w);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries for which `f` holds (stale ones included): for statistics, off the I/O path.
    pub fn count_where(&self, f: impl Fn(&Waiter) -> bool) -> usize {
        self.entries.iter().filter(|w| f(w)).count()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first current entry at position `i` or later, with its qpair, dropping the stale
    /// entries before it. The caller may index the qpair's requests with `slot`: it exists.
    pub fn current_at<'q, Q: RequestSlots>(
        &mut self,
        i: usize,
        qpairs: &'q mut [Option<Q>],
    ) -> Option<(Waiter, &'q mut Q)> {
        while let Some(&w) = self.entries.get(i) {
            if w.is_current(qpairs, self.want) {
                let qp = qpairs.get_mut(w.qpair).and_then(Option::as_mut)?;
                return Some((w, qp));
            }
            self.entries.remove(i);
        }
        None
    }

    /// Removes the entry at position `i` (one [`current_at`](Self::current_at) returned).
    pub fn remove(&mut self, i: usize) {
        self.entries.remove(i);
    }

    /// The entry at the front, current or not: a serve loop that put a request back at the
    /// front sees it here and stops.
    pub fn front(&self) -> Option<&Waiter> {
        self.entries.front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::request::{ReqTag, Request};

    struct FakeQpair {
        gen: u8,
        requests: Vec<RdmaRequest>,
    }

    impl RequestSlots for FakeQpair {
        fn generation(&self) -> u8 {
            self.gen
        }
        fn requests(&self) -> &[RdmaRequest] {
            &self.requests
        }
    }

    fn qpair(gen: u8, slots: u32, state: State) -> Option<FakeQpair> {
        let requests = (0..slots)
            .map(|s| {
                let mut r = RdmaRequest::new(Request::new(ReqTag::new(0, u64::from(s))));
                r.state = state;
                r
            })
            .collect();
        Some(FakeQpair { gen, requests })
    }

    #[test]
    fn a_stale_entry_for_a_reused_shorter_qpair_is_dropped_not_indexed() {
        let mut q = WaitQueue::new(State::NeedSend);
        // Queued by a 128-slot qpair at index 0 (generation 4), which was then closed and
        // reaped; index 0 now holds generation 5 with 4 slots, all waiting to send.
        q.push(Waiter {
            qpair: 0,
            gen: 4,
            slot: 100,
        });
        // Same generation, slot past the end: cannot happen today, must not panic either.
        q.push(Waiter {
            qpair: 0,
            gen: 5,
            slot: 100,
        });
        q.push(Waiter {
            qpair: 0,
            gen: 5,
            slot: 2,
        });
        let mut qpairs = vec![qpair(5, 4, State::NeedSend)];
        let (w, qp) = q.current_at(0, &mut qpairs).expect("the live entry");
        assert_eq!((w.gen, w.slot), (5, 2));
        assert_eq!(qp.requests.len(), 4);
        assert_eq!(q.entries.len(), 1, "both stale entries dropped");
    }

    #[test]
    fn entries_of_a_gone_qpair_or_a_moved_on_request_are_dropped() {
        let mut q = WaitQueue::new(State::NeedRead);
        for (qpair, slot) in [(7, 0), (1, 0), (0, 1), (0, 0)] {
            q.push(Waiter {
                qpair,
                gen: 0,
                slot,
            });
        }
        // Index 7 was never allocated, index 1 is free, slot 1 of qpair 0 moved on.
        let mut qpairs = vec![qpair(0, 2, State::NeedRead), None];
        qpairs[0].as_mut().unwrap().requests[1].state = State::Free;
        let (w, _) = q.current_at(0, &mut qpairs).expect("slot 0 still waits");
        assert_eq!((w.qpair, w.slot), (0, 0));
        assert_eq!(q.entries.len(), 1);
        q.remove(0);
        assert!(q.is_empty());
        assert!(q.current_at(0, &mut qpairs).is_none());
    }

    #[test]
    fn entries_before_the_position_asked_for_are_kept() {
        let mut q = WaitQueue::new(State::NeedRead);
        for slot in [0, 9, 1] {
            q.push(Waiter {
                qpair: 0,
                gen: 0,
                slot,
            });
        }
        let mut qpairs = vec![qpair(0, 2, State::NeedRead)];
        let (w, _) = q.current_at(1, &mut qpairs).expect("slot 1 waits");
        assert_eq!(w.slot, 1);
        assert_eq!(
            q.entries.len(),
            2,
            "only the stale entry at position 1 went"
        );
    }
}

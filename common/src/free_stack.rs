//! The free list of a buffer pool: a lock-free stack of the indices `0..count`, each on it at
//! most once.
//!
//! A pool's buffers are taken and given back by their reactor nearly always, so what matters
//! is the uncontended cost: one load and one compare-and-swap each way (a bounded MPMC queue
//! pays about three times that in stamps and slots). Last in, first out: the buffer given
//! back last, warm in cache, is the next one taken.
//!
//! The head packs a tag with the top index. Every successful change bumps the tag, so a
//! taker that read `next[i]` of a head since popped and pushed again (ABA) fails its swap
//! and retries, instead of installing a stale link. Links live in an array of atomics that
//! outlives every index: a stale read is a wrong value, never a dangling one.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// No index: the end of the list (indices are stored plus one, so 0 can be it).
const NIL: u32 = 0;

pub(crate) struct FreeStack {
    /// `tag << 32 | (top index + 1)`, or `tag << 32 | NIL` when empty.
    head: AtomicU64,
    /// `next[i]`: the index below `i` on the stack, plus one (`NIL` at the bottom). Only
    /// meaningful while `i` is on the stack.
    next: Box<[AtomicU32]>,
}

fn pack(tag: u32, link: u32) -> u64 {
    u64::from(tag) << 32 | u64::from(link)
}

fn unpack(head: u64) -> (u32, u32) {
    ((head >> 32) as u32, head as u32)
}

impl FreeStack {
    /// Every index of `0..count` free, 0 on top.
    pub(crate) fn full(count: u32) -> Self {
        assert!(count < u32::MAX, "indices are stored plus one");
        let next = (0..count)
            .map(|i| AtomicU32::new(if i + 1 < count { i + 2 } else { NIL }))
            .collect();
        Self {
            head: AtomicU64::new(pack(0, if count > 0 { 1 } else { NIL })),
            next,
        }
    }

    /// Takes the top index, `None` if every index is out.
    #[inline]
    pub(crate) fn pop(&self) -> Option<u32> {
        // Acquire: what the giver did to the buffer, and its link, happened before.
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (tag, top) = unpack(head);
            if top == NIL {
                return None;
            }
            let below = self.next[(top - 1) as usize].load(Ordering::Relaxed);
            match self.head.compare_exchange_weak(
                head,
                pack(tag.wrapping_add(1), below),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(top - 1),
                Err(now) => head = now,
            }
        }
    }

    /// Gives `index` back. It must be out (taken by `pop` and not given back since): the
    /// pool's handles own their index, so each gives it back once.
    #[inline]
    pub(crate) fn push(&self, index: u32) {
        let link = &self.next[index as usize];
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let (tag, top) = unpack(head);
            link.store(top, Ordering::Relaxed);
            // Release: the link and everything done to the buffer reach the next taker.
            match self.head.compare_exchange_weak(
                head,
                pack(tag.wrapping_add(1), index + 1),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Whether an index is free now.
    #[inline]
    pub(crate) fn has_free(&self) -> bool {
        unpack(self.head.load(Ordering::Relaxed)).1 != NIL
    }

    /// How many indices are free: exact while nobody takes or gives back (leak checks,
    /// statistics), a snapshot otherwise. Walks the list, at most `count` links.
    pub(crate) fn len(&self) -> usize {
        let mut link = unpack(self.head.load(Ordering::Acquire)).1;
        let mut n = 0;
        while link != NIL && n < self.next.len() {
            n += 1;
            link = self.next[(link - 1) as usize].load(Ordering::Relaxed);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn every_index_comes_out_once_last_given_back_first() {
        let s = FreeStack::full(4);
        assert_eq!(s.len(), 4);
        let taken: Vec<u32> = std::iter::from_fn(|| s.pop()).collect();
        assert_eq!(taken, [0, 1, 2, 3]);
        assert!(!s.has_free());
        assert_eq!((s.pop(), s.len()), (None, 0));
        s.push(2);
        s.push(0);
        assert!(s.has_free());
        assert_eq!(s.len(), 2);
        assert_eq!((s.pop(), s.pop(), s.pop()), (Some(0), Some(2), None));
        assert_eq!(FreeStack::full(0).pop(), None);
    }

    /// Threads take and give back at once, as a reactor and the threads bdevs complete on
    /// do: no index is ever held twice, and all come back.
    #[test]
    fn concurrent_takers_and_givers_never_share_an_index() {
        const COUNT: u32 = 64;
        let s = Arc::new(FreeStack::full(COUNT));
        let held: Arc<Vec<AtomicU32>> = Arc::new((0..COUNT).map(|_| AtomicU32::new(0)).collect());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (s, held) = (Arc::clone(&s), Arc::clone(&held));
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for round in 0..20_000u32 {
                        if round % 3 != 2 {
                            if let Some(i) = s.pop() {
                                let was = held[i as usize].fetch_add(1, Ordering::SeqCst);
                                assert_eq!(was, 0, "index {i} taken twice");
                                mine.push(i);
                            }
                        } else if let Some(i) = mine.pop() {
                            held[i as usize].fetch_sub(1, Ordering::SeqCst);
                            s.push(i);
                        }
                    }
                    for i in mine {
                        held[i as usize].fetch_sub(1, Ordering::SeqCst);
                        s.push(i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.len(), COUNT as usize);
        let all: HashSet<u32> = std::iter::from_fn(|| s.pop()).collect();
        assert_eq!(all.len(), COUNT as usize);
    }
}

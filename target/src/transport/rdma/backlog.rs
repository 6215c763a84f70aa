//! Commands that arrive while every request slot of their qpair is taken, and how a queue
//! overrun is told apart from them.
//!
//! A host may send a command as soon as it has seen the response to an earlier one. RDMA
//! does not order the completion of our SEND, which frees that response's slot, before the
//! receive of the host's next command: on soft-RoCE a SEND completes in the requester's
//! completer task and a command arrives through the responder, separate tasks, so the next
//! command can be in our CQ first. Twice the queue depth in slots (`request::slots_for`)
//! absorbs most of that, but a lagging completer can hold the spare depth too.
//!
//! Such a command is not the host's fault. It waits here, its SQE copied out of the receive
//! slot (which goes back to the SRQ) and its capsule buffer kept, and takes the next slot
//! that frees, oldest first (SPDK's `incoming_queue`, "RDMA does not appear to order
//! completions"). The host is at fault only when more of its commands are unanswered than its
//! queue has entries: commands received minus responses posted above the depth. A host sends
//! a command only after it saw a response we posted, so a host within its queue never gets
//! there, however late our completions come.

use std::collections::VecDeque;

use nvmf_common::buffer::IoBuf;
use nvmf_common::spec::Command;

/// A command that arrived while its qpair had no free request slot.
pub(super) struct Waiting {
    pub cmd: Command,
    /// Bytes the receive carried, the SQE included.
    pub len: u32,
    /// The capsule buffer its in-capsule data landed in, if it carried any.
    pub capsule: Option<IoBuf>,
    /// When it arrived (the core's clock, ns): its latency runs from here.
    pub received_ns: u64,
}

/// Why a capsule is refused at its arrival; either closes its qpair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overrun {
    /// A capsule shorter than an SQE (its length).
    Short(u32),
    /// More of the host's commands are unanswered than its queue has entries (their count,
    /// this one included).
    Unanswered(u32),
}

/// A qpair's commands waiting for a slot, and its count of unanswered commands.
pub(super) struct Backlog {
    waiting: VecDeque<Waiting>,
    /// Commands received whose responses are not posted yet.
    unanswered: u32,
    /// The host's queue size: the most commands it may have unanswered.
    depth: u32,
}

impl Backlog {
    /// Room for a whole queue of waiting commands (the most a host within its queue can
    /// make wait), so a push never allocates.
    pub fn new(depth: u32) -> Self {
        Self {
            waiting: VecDeque::with_capacity(depth as usize),
            unanswered: 0,
            depth,
        }
    }

    /// A command arrived: counts it, or refuses it if the host has its whole queue
    /// unanswered already.
    #[inline]
    pub fn arrived(&mut self) -> Result<(), Overrun> {
        if self.unanswered >= self.depth {
            return Err(Overrun::Unanswered(self.unanswered + 1));
        }
        self.unanswered += 1;
        Ok(())
    }

    /// `n` responses were posted: the host may send as many new commands.
    #[inline]
    pub fn answered(&mut self, n: u32) {
        self.unanswered = self.unanswered.saturating_sub(n);
    }

    /// Commands waiting for a slot.
    #[inline]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Queues a command that found no free slot (or found older ones waiting). Never past
    /// the capacity: each waiting command is unanswered, and `arrived` keeps those within
    /// the depth.
    pub fn wait(&mut self, w: Waiting) {
        debug_assert!(self.waiting.len() < self.depth as usize);
        self.waiting.push_back(w);
    }

    /// The oldest waiting command.
    pub fn next(&mut self) -> Option<Waiting> {
        self.waiting.pop_front()
    }

    /// The qpair is closing: waiting commands go unanswered, their capsule buffers back to
    /// the pool. Returns how many capsule buffers went back.
    pub fn clear(&mut self) -> u32 {
        let held = self.waiting.iter().filter(|w| w.capsule.is_some()).count();
        self.waiting.clear();
        held as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(cid: u16) -> Waiting {
        let mut cmd = Command::default();
        cmd.cid.set(cid);
        Waiting {
            cmd,
            len: 64,
            capsule: None,
            received_ns: 0,
        }
    }

    #[test]
    fn a_host_may_have_its_whole_queue_unanswered_and_not_one_more() {
        let mut b = Backlog::new(4);
        for _ in 0..4 {
            assert_eq!(b.arrived(), Ok(()));
        }
        assert_eq!(b.arrived(), Err(Overrun::Unanswered(5)));
        // A posted response lets one more in, however many slots its completion still holds.
        b.answered(1);
        assert_eq!(b.arrived(), Ok(()));
        assert_eq!(b.arrived(), Err(Overrun::Unanswered(5)));
        b.answered(4);
        for _ in 0..4 {
            assert_eq!(b.arrived(), Ok(()));
        }
    }

    #[test]
    fn waiting_commands_leave_oldest_first_and_never_allocate() {
        let mut b = Backlog::new(8);
        let capacity = b.waiting.capacity();
        for cid in 0..8 {
            b.wait(waiting(cid));
        }
        assert_eq!(b.waiting.capacity(), capacity, "a wait allocated");
        assert_eq!(b.len(), 8);
        let order: Vec<u16> = std::iter::from_fn(|| b.next().map(|w| w.cmd.cid.get())).collect();
        assert_eq!(order, (0..8).collect::<Vec<_>>());
        assert!(b.is_empty());
    }
}

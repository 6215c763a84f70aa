//! The channel a reactor holds for a namespace whose bdev channel failed to open there (an
//! AIO context refused for `aio-max-nr`, a ring refused for locked memory): every I/O fails
//! with `ENODEV` (Namespace Not Ready), so the host gets an answer instead of the namespace
//! it was told about behaving as if it did not exist. The RPC that added the namespace sees
//! the failure and takes the namespace back out (`nvmf_subsystem_add_ns`).

use super::util::{completion, CompletionQueue, CHANNEL_DEPTH};
use super::{BdevChannel, BdevIo, Submitted};

pub struct UnavailableChannel {
    done: CompletionQueue,
}

impl UnavailableChannel {
    pub fn new() -> Self {
        Self {
            done: CompletionQueue::new(CHANNEL_DEPTH),
        }
    }
}

impl Default for UnavailableChannel {
    fn default() -> Self {
        Self::new()
    }
}

impl BdevChannel for UnavailableChannel {
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo> {
        if self.done.is_full() {
            return Err(io);
        }
        self.done.complete(io, Err(libc::ENODEV));
        Ok(())
    }

    fn submit_now(&mut self, io: BdevIo) -> Submitted {
        Submitted::Done(completion(io, Err(libc::ENODEV)))
    }

    fn poll(&mut self, done: &mut dyn FnMut(super::BdevCompletion)) -> usize {
        self.done.drain(done)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bdev::IoKind;

    fn io(tag: u64) -> BdevIo {
        BdevIo {
            tag,
            kind: IoKind::Write,
            offset_blocks: 0,
            num_blocks: 1,
            buf: None,
            fua: false,
        }
    }

    #[test]
    fn every_io_fails_with_enodev_either_way_it_is_submitted() {
        let mut ch = UnavailableChannel::new();
        match ch.submit_now(io(1)) {
            Submitted::Done(c) => assert_eq!((c.tag, c.result), (1, Err(libc::ENODEV))),
            other => panic!("{other:?}"),
        }
        ch.submit(io(2)).unwrap();
        assert_eq!(ch.in_flight(), 1);
        let mut seen = Vec::new();
        assert_eq!(ch.poll(&mut |c| seen.push((c.tag, c.result))), 1);
        assert_eq!(seen, [(2, Err(libc::ENODEV))]);
        assert_eq!(ch.in_flight(), 0);
    }
}

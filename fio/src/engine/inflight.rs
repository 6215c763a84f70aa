//! The I/Os a fio thread has in flight: one [`Inflight`] per `io_u`, however many commands
//! (parts) it took, in a fixed table of `iodepth` [`Slots`].

use super::Op;
use crate::ffi::FioBuf;
use crate::split::Split;

/// Where an I/O's data lives.
#[derive(Debug)]
pub(crate) enum Data {
    /// No fio data (trim: its range goes in a bounce buffer; flush).
    Nothing,
    /// Through bounce buffers: fio's buffer, copied into each part's bounce buffer before a
    /// write part is sent, and out of it when a read part completes.
    Copy(FioBuf),
    /// fio's own buffers: part *i* is buffer `first + i` of the I/O memory pool.
    ZeroCopy(usize),
}

/// One `io_u` in flight.
#[derive(Debug)]
pub(crate) struct Inflight {
    /// fio's tag (the `io_u`), handed back in its event.
    pub tag: u64,
    pub file: u32,
    pub conn: usize,
    pub nsid: u32,
    pub block_size: u32,
    pub op: Op,
    /// Byte offset in the namespace.
    pub offset: u64,
    pub split: Split,
    pub data: Data,
    /// Parts sent (parts `0..sent`), and how many of those came back.
    pub sent: u32,
    pub done: u32,
    /// The first error (errno) of any part; 0 while all went well.
    pub err: i32,
}

impl Inflight {
    /// Records a part's result; true when it is the I/O's first error.
    pub fn record(&mut self, err: i32) -> bool {
        self.done += 1;
        let first = err != 0 && self.err == 0;
        if first {
            self.err = err;
        }
        first
    }

    /// Parts still to send (none once a part failed: the rest are not sent).
    pub fn unsent(&self) -> bool {
        self.err == 0 && self.sent < self.split.count()
    }

    /// Every part sent came back and no more will be sent: the `io_u` is complete.
    pub fn finished(&self) -> bool {
        self.done >= self.sent && !self.unsent()
    }
}

/// In-flight I/Os, indexed by the slot number in their commands' tags. Fixed capacity
/// (fio's iodepth): inserting, finding and taking neither allocate nor search.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    slots: Vec<Option<Inflight>>,
    free: Vec<u32>,
}

impl Slots {
    pub fn new(capacity: u32) -> Self {
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
        }
    }

    /// Stores `io`; `Err(io)` back when every slot is taken.
    pub fn insert(&mut self, io: Inflight) -> Result<u32, Inflight> {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(io);
                Ok(i)
            }
            None => Err(io),
        }
    }

    pub fn get(&self, i: u32) -> Option<&Inflight> {
        self.slots.get(i as usize)?.as_ref()
    }

    pub fn get_mut(&mut self, i: u32) -> Option<&mut Inflight> {
        self.slots.get_mut(i as usize)?.as_mut()
    }

    pub fn take(&mut self, i: u32) -> Option<Inflight> {
        let io = self.slots.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(io)
    }

    pub fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn inflight(tag: u64, split: Split) -> Inflight {
        Inflight {
            tag,
            file: 0,
            conn: 0,
            nsid: 1,
            block_size: 4096,
            op: Op::Read,
            offset: 0,
            split,
            data: Data::Nothing,
            sent: 0,
            done: 0,
            err: 0,
        }
    }

    #[test]
    fn slots_hand_out_each_index_once() {
        let one = || Split::whole(4096);
        let mut s = Slots::new(3);
        let a = s.insert(inflight(10, one())).unwrap();
        let b = s.insert(inflight(11, one())).unwrap();
        let c = s.insert(inflight(12, one())).unwrap();
        assert_eq!(s.outstanding(), 3);
        let mut all = [a, b, c];
        all.sort();
        assert_eq!(all, [0, 1, 2]);
        assert_eq!(s.insert(inflight(13, one())).unwrap_err().tag, 13, "full");
        assert_eq!(s.get(b).unwrap().tag, 11);
        s.get_mut(b).unwrap().sent = 1;
        assert_eq!(s.take(b).unwrap().sent, 1);
        assert!(s.take(b).is_none(), "taken twice");
        assert!(s.get(b).is_none());
        assert!(s.take(99).is_none(), "out of range");
        assert_eq!(
            s.insert(inflight(14, one())).unwrap(),
            b,
            "the freed slot is reused"
        );
        assert_eq!(s.outstanding(), 3);
    }

    #[test]
    fn an_io_completes_when_all_its_parts_did() {
        let mut io = inflight(1, Split::new(1 << 20, 128 << 10).unwrap());
        assert_eq!(io.split.count(), 8);
        io.sent = 8;
        for _ in 0..7 {
            assert!(!io.record(0));
            assert!(!io.finished());
        }
        assert!(!io.record(0));
        assert!(io.finished());
        assert_eq!(io.err, 0);
    }

    #[test]
    fn the_first_error_of_any_part_sticks() {
        let mut io = inflight(1, Split::new(4 * 4096, 4096).unwrap());
        io.sent = 4;
        assert!(!io.record(0));
        assert!(io.record(libc::EIO), "first error");
        assert!(
            !io.record(libc::ETIMEDOUT),
            "a later error does not replace it"
        );
        assert!(!io.finished(), "a part is still out");
        assert!(!io.record(0));
        assert!(io.finished());
        assert_eq!(io.err, libc::EIO);
    }

    #[test]
    fn a_failed_io_sends_no_more_parts() {
        let mut io = inflight(1, Split::new(4 * 4096, 4096).unwrap());
        io.sent = 2;
        assert!(io.unsent());
        assert!(!io.record(0));
        assert!(!io.finished(), "parts 2 and 3 are still to send");
        assert!(io.record(libc::EIO));
        assert!(!io.unsent(), "after an error the rest is not sent");
        assert!(io.finished(), "everything sent came back");
        assert_eq!(io.err, libc::EIO);
    }
}

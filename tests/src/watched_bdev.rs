//! A RAM disk a test can watch and ration: how many channels may open, and what each
//! channel is given.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use nvmf_target::bdev::{
    Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, IoKind, MallocBdev, Submitted,
};

/// Counters a [`WatchedMalloc`] and its channels share with the test.
#[derive(Debug, Default)]
pub struct Watch {
    /// Channels that may still open; past it, opens fail with `EAGAIN` (as `io_setup` does
    /// past `aio-max-nr`).
    pub opens_left: AtomicUsize,
    /// Deallocations the channels were given, and their blocks.
    pub unmaps: AtomicU64,
    pub unmapped_blocks: AtomicU64,
}

impl Watch {
    pub fn unmaps(&self) -> (u64, u64) {
        (
            self.unmaps.load(Ordering::Relaxed),
            self.unmapped_blocks.load(Ordering::Relaxed),
        )
    }
}

pub struct WatchedMalloc {
    base: MallocBdev,
    pub watch: Arc<Watch>,
}

impl WatchedMalloc {
    /// A RAM disk of `num_blocks` blocks of `block_size` whose first `opens` channels open.
    pub fn new(name: &str, num_blocks: u64, block_size: u32, opens: usize) -> Self {
        let watch = Watch {
            opens_left: AtomicUsize::new(opens),
            ..Watch::default()
        };
        Self {
            base: MallocBdev::new(name, num_blocks, block_size, None).expect("a RAM disk"),
            watch: Arc::new(watch),
        }
    }
}

struct WatchedChannel {
    base: Box<dyn BdevChannel>,
    watch: Arc<Watch>,
}

impl WatchedChannel {
    fn count(&self, io: &BdevIo) {
        if io.kind == IoKind::Unmap {
            self.watch.unmaps.fetch_add(1, Ordering::Relaxed);
            let blocks = &self.watch.unmapped_blocks;
            blocks.fetch_add(io.num_blocks, Ordering::Relaxed);
        }
    }
}

impl BdevChannel for WatchedChannel {
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo> {
        self.count(&io);
        self.base.submit(io)
    }
    fn submit_now(&mut self, io: BdevIo) -> Submitted {
        self.count(&io);
        self.base.submit_now(io)
    }
    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        self.base.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.base.in_flight()
    }
}

impl Bdev for WatchedMalloc {
    fn name(&self) -> &str {
        self.base.name()
    }
    fn product_name(&self) -> &'static str {
        "Watched disk"
    }
    fn block_size(&self) -> u32 {
        self.base.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.base.num_blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.base.uuid()
    }
    fn supports(&self, kind: IoKind) -> bool {
        self.base.supports(kind)
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        let left = &self.watch.opens_left;
        if left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return Err(BdevError::Io {
                what: "io_setup".into(),
                source: std::io::Error::from_raw_os_error(libc::EAGAIN),
            });
        }
        Ok(Box::new(WatchedChannel {
            base: self.base.open_channel()?,
            watch: Arc::clone(&self.watch),
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        self.base.config_entry()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

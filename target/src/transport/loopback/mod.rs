//! An in-process transport, the counterpart of Linux's `nvme-loop`: the core runs with no
//! fabric, so tests and benchmarks exercise exactly the code a network host reaches.
//!
//! A host queue ([`LoopbackHostQueue`]) and the target's qpair share a [`Wire`]: two lock-free
//! queues of capsules and responses. The capsule's `host_buffer` plays the host memory a keyed
//! SGL points at: the target "RDMA READs" write data from it and "RDMA WRITEs" read data into
//! it, and an in-capsule SGL takes its bytes from it as if they trailed the SQE.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam::queue::SegQueue;
use nvmf_common::buffer::{BufferPool, SizedPools, SMALL_BUFSIZE};
use nvmf_common::spec::{Command, Completion};

use crate::core::subsystem::ListenAddress;
use poll_group::LoopbackPollGroup;

mod poll_group;

use crate::transport::{Transport, TransportError, TransportLimits, TransportPollGroup};

/// The in-process transport's fixed limits: RDMA's, with keep-alive at 100 ms granularity and a
/// 100 ms minimum KATO so keep-alive expiry tests take milliseconds. (`nvmf_create_transport
/// LOOPBACK` takes SPDK's `kas`/`min_kato` defaults, as every type does.)
pub const LOOPBACK_LIMITS: TransportLimits = TransportLimits {
    trtype: 254,
    kas: 1,
    min_kato_ms: 100,
    ..TransportLimits::DEFAULT_RDMA
};

/// A command capsule as the host sends it.
#[derive(Debug, Clone, Default)]
pub struct Capsule {
    pub cmd: Command,
    /// Host memory behind the data SGL (or in-capsule data).
    pub host_buffer: Vec<u8>,
}

/// A response capsule, with the host buffer handed back (holding read data).
#[derive(Debug, Clone)]
pub struct Response {
    pub cqe: Completion,
    pub host_buffer: Vec<u8>,
}

#[derive(Default)]
struct Wire {
    to_target: SegQueue<Capsule>,
    to_host: SegQueue<Response>,
    host_closed: AtomicBool,
    target_closed: AtomicBool,
    /// The host stopped taking responses (models an RDMA host that posts no receives).
    host_stalled: AtomicBool,
}

/// The host end of one loopback queue pair.
pub struct LoopbackHostQueue {
    wire: Arc<Wire>,
}

impl LoopbackHostQueue {
    pub fn submit(&self, capsule: Capsule) {
        self.wire.to_target.push(capsule);
    }

    pub fn poll(&self) -> Option<Response> {
        self.wire.to_host.pop()
    }

    /// Stops (or resumes) taking responses: the target holds them, with their buffers, as an
    /// RDMA target holds SENDs a host does not post receives for.
    pub fn set_receiving(&self, receiving: bool) {
        self.wire.host_stalled.store(!receiving, Ordering::Release);
    }

    /// The target tore the queue down (controller failed, shutdown).
    pub fn is_disconnected(&self) -> bool {
        self.wire.target_closed.load(Ordering::Acquire)
    }
}

impl Drop for LoopbackHostQueue {
    fn drop(&mut self) {
        self.wire.host_closed.store(true, Ordering::Release);
    }
}

/// How a loopback poll group sizes its data buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackPools {
    /// Buffers of [`SMALL_BUFSIZE`] (transfers up to that size).
    pub small: u32,
    /// Buffers of the largest transfer.
    pub large: u32,
    /// Buffers one qpair may hold at once (both classes); its requests beyond that wait in
    /// the qpair's own queue, so one host cannot hold the pools.
    pub per_qpair: u32,
}

impl LoopbackPools {
    /// Twice the queue depth of each class; a qpair may hold half of the large pool (one full
    /// queue), so two busy qpairs of a group always make progress.
    pub fn for_limits(limits: &TransportLimits) -> Self {
        let depth = u32::from(limits.max_queue_depth);
        Self {
            small: depth * 2,
            large: depth * 2,
            per_qpair: depth,
        }
    }
}

/// The transport: hands out host queues, and poll groups that serve them.
#[derive(Clone)]
pub struct LoopbackTransport {
    inbox: Arc<SegQueue<(Arc<Wire>, Option<ListenAddress>)>>,
    limits: TransportLimits,
    sizes: LoopbackPools,
    /// Each poll group's data pool (clones share it), for [`LoopbackTransport::pools`].
    pools: Arc<Mutex<Vec<BufferPool>>>,
}

impl LoopbackTransport {
    pub fn new(limits: TransportLimits) -> Self {
        Self::with_pools(limits, LoopbackPools::for_limits(&limits))
    }

    pub fn with_pools(limits: TransportLimits, sizes: LoopbackPools) -> Self {
        Self {
            inbox: Arc::new(SegQueue::new()),
            limits,
            sizes,
            pools: Arc::default(),
        }
    }

    /// The data pools (small and large) of the poll groups made so far: tests check that an
    /// idle target has every buffer back, and prime buffers with a pattern that must never
    /// reach a host.
    pub fn pools(&self) -> Vec<BufferPool> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Opens a new queue pair through no particular listener; the next poll of a poll
    /// group adopts it.
    pub fn connect(&self) -> LoopbackHostQueue {
        self.open(None)
    }

    /// Opens a new queue pair as if it came through the listener at `addr`.
    pub fn connect_via(&self, addr: ListenAddress) -> LoopbackHostQueue {
        self.open(Some(addr))
    }

    fn open(&self, listener: Option<ListenAddress>) -> LoopbackHostQueue {
        let wire = Arc::new(Wire::default());
        self.inbox.push((Arc::clone(&wire), listener));
        LoopbackHostQueue { wire }
    }

    /// A poll group serving this transport's queue pairs; panics if its buffer pools cannot
    /// be made (tests: see [`try_poll_group`](Self::try_poll_group)).
    pub fn poll_group(&self, index: u8) -> Box<dyn TransportPollGroup> {
        self.try_poll_group(index)
            .unwrap_or_else(|e| panic!("loopback poll group: {e}"))
    }

    /// A poll group serving this transport's queue pairs, or why its buffer pools could not be
    /// made.
    pub fn try_poll_group(&self, index: u8) -> Result<Box<dyn TransportPollGroup>, TransportError> {
        let large_size = (self.limits.max_transfer() as usize).max(4096);
        let pools = SizedPools::new(
            SMALL_BUFSIZE,
            self.sizes.small,
            large_size,
            self.sizes.large,
        )
        .map_err(|e| TransportError::Resources {
            what: "cannot make the loopback buffer pools",
            source: e.into(),
        })?;
        let mut all = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        all.push(pools.small.clone());
        all.push(pools.large.clone());
        Ok(Box::new(LoopbackPollGroup::new(
            index,
            Arc::clone(&self.inbox),
            self.limits,
            pools,
            self.sizes.per_qpair.max(1) as usize,
        )))
    }
}

impl Transport for LoopbackTransport {
    fn trtype(&self) -> &'static str {
        "LOOPBACK"
    }

    fn limits(&self) -> TransportLimits {
        self.limits
    }

    fn listen(&self, _addr: &ListenAddress) -> Result<(), TransportError> {
        Ok(())
    }

    fn stop_listen(&self, _addr: &ListenAddress) {}

    fn create_poll_group(
        &self,
        index: u8,
        _group: &crate::core::PollGroupHandle,
    ) -> Result<Box<dyn TransportPollGroup>, TransportError> {
        self.try_poll_group(index)
    }

    fn options(&self) -> serde_json::Value {
        serde_json::json!({
            "trtype": "LOOPBACK",
            "max_queue_depth": self.limits.max_queue_depth,
            "max_io_qpairs_per_ctrlr": self.limits.max_qpairs_per_ctrl - 1,
            "in_capsule_data_size": self.limits.in_capsule_data_size,
            "max_io_size": self.limits.max_io_size,
        })
    }
}

//! What one poll group needs on one RDMA device: a protection domain, one completion queue for
//! sends and receives, a shared receive queue with its registered capsule buffers, and the
//! registered data buffer pools (small and large).
//!
//! Receive buffers are two scatter entries per SRQ slot: the 64-byte SQE, then room for the
//! in-capsule data. Keeping SQEs in their own dense region means a capsule without data
//! touches one cache line of it.

use std::sync::Arc;

use arrayvec::ArrayVec;
use nvmf_common::buffer::{BufferPool, IoBuf, SizedPools, BUFFER_ALIGN, SMALL_BUFSIZE};
use nvmf_common::rdma::{
    register_pool, AccessFlags, DeviceCapFlags, DmaBuf, RecvWr, Sge, Transport, Verbs,
    VerbsContext, VerbsCq, VerbsSrq, MAX_CHAIN,
};
use nvmf_common::spec::Command;
use zerocopy::FromBytes;

use super::request::{wr_id, WrKind};
use crate::transport::options::TransportOptions;

const SQE_LEN: usize = 64;
/// Completion queue entries per device and poll group; bounded by what the device allows.
const CQ_ENTRIES: u32 = 16_384;
/// Data buffers per device and poll group: enough for deep queues on many qpairs, bounded so
/// a 2-core machine does not pin gigabytes.
const MIN_DATA_BUFFERS: u32 = 64;
const MAX_DATA_BUFFERS: u32 = 1024;
const MAX_SMALL_BUFFERS: u32 = 4096;

/// SPDK's per-device RDMA poll group counters (`nvmf_get_stats`, `nvmf_rdma_device_stat`),
/// kept by the reactor that owns them and read only through a message to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub polls: u64,
    pub idle_polls: u64,
    pub completions: u64,
    pub requests: u64,
    /// Nanoseconds from capsule arrival to response completion, summed over requests.
    pub request_latency: u64,
    /// Commands that arrived while their qpair had no free request slot and waited for one
    /// (`backlog`), counted as SPDK counts its `pending_free_request`: as they happen.
    pub pending_free_request: u64,
    pub total_send_wrs: u64,
    pub send_doorbell_updates: u64,
    pub total_recv_wrs: u64,
    pub recv_doorbell_updates: u64,
}

pub struct DeviceResources<V: Verbs> {
    pub ctx: Arc<V::Context>,
    pub pd: Arc<V::Pd>,
    pub cq: Arc<V::Cq>,
    pub srq: Arc<V::Srq>,
    /// Data buffers in two classes (small: up to 8 KiB, large: up to max_io_size).
    pub pools: SizedPools,
    /// The device may complete SEND with remote invalidation of the host's key.
    pub send_with_invalidate: bool,
    pub max_qp_wr: u32,
    pub max_rd_atom: u8,
    pub max_init_rd_atom: u8,
    recv_cmds: DmaBuf<V>,
    /// In-capsule data lands in buffers of this pool, one lent to each receive on the SRQ.
    /// A capsule's buffer goes with its request to the bdev (no copy) and the slot is posted
    /// again at once with a fresh one, so requests never hold SRQ slots. `srq_depth` plus a
    /// half more, for the requests executing from them.
    capsules: Option<BufferPool>,
    /// The capsule buffer lent to each SRQ slot.
    lent: Vec<Option<IoBuf>>,
    in_capsule: u32,
    /// Receive slots consumed and ready to be posted again, posted in batches.
    repost: Vec<u32>,
    /// How many consumed slots make a batch worth a doorbell: a sixteenth of the SRQ, at
    /// most one chain.
    repost_batch: u32,
    srq_depth: u32,
    /// Receive slots on the SRQ now.
    recv_posted: u32,
    /// Entries of the CQ, and how many of them the SRQ and the QPs on it may fill at once
    /// (the SRQ's depth plus each QP's send queue). A connection that would push the sum past
    /// the capacity is refused: an overrun CQ breaks every QP on the device.
    pub cq_capacity: u32,
    pub cq_reserved: u32,
    /// The device's largest CQ: the shared CQ grows up to it as connections come.
    pub max_cqe: u32,
    /// Polling the CQ failed (an overrun or a device error): every qpair on it is closed and
    /// the device's resources are rebuilt once the last one is gone.
    pub failed: bool,
    /// The device itself is gone: once its last qpair is, its resources are dropped, not
    /// rebuilt.
    pub removed: bool,
    /// The CQ's completion channel is registered with the reactor's sleep (once per CQ: a
    /// rebuilt device starts unregistered).
    pub wake_registered: bool,
    /// The CQ is armed and has not fired yet (no event taken since): a sleep need not arm it
    /// again. Cleared when its event is taken.
    pub cq_armed: bool,
    /// Data buffers one qpair may hold per class (small, large): a quarter of the pool, at
    /// least 16, so a host that stops taking its data cannot pin a whole pool and at least
    /// four qpairs always make progress. Third: capsule buffers it may execute from (an
    /// eighth of the SRQ's depth, the spare half of the capsule pool shared by four); past
    /// that its in-capsule data is copied to a small buffer.
    pub share: [u32; 3],
    /// Capsule buffers that commands waiting for a request slot hold for their in-capsule
    /// data, over every qpair of the device, and the most they may (a quarter of the SRQ's
    /// depth, half the pool's spare): past it a waiting command's data is dropped and the
    /// command answered Command Interrupted, which the host retries, so stalled hosts
    /// cannot take the receives of all.
    pub backlog_capsules: u32,
    pub backlog_capsule_cap: u32,
    /// Small buffers that deferred responses (`qpair::Deferral`) may still hold: an eighth
    /// of the small pool, at most [`DEFER_BUFFERS`]. Hosts that go idle right after reads
    /// cannot keep more than that from the others.
    pub defer_budget: u32,
    /// Whether its qpairs defer responses: not on iWARP, where the zero-length RDMA WRITE
    /// that covers an idle qpair's is not promised to pass (`qpair::post_cover`).
    pub defers: bool,
    pub stats: DeviceStats,
}

/// The most small buffers a device's deferred responses may hold.
pub const DEFER_BUFFERS: u32 = 64;

impl<V: Verbs> DeviceResources<V> {
    pub fn new(ctx: Arc<V::Context>, opts: &TransportOptions) -> Result<Self, String> {
        let attr = ctx.query_device().map_err(|e| e.to_string())?;
        let pd = V::alloc_pd(&ctx).map_err(|e| e.to_string())?;
        let cq_capacity = CQ_ENTRIES.min(attr.max_cqe);
        // Half the CQ at most for receives, so connections have room for their sends.
        let srq_depth = opts
            .max_srq_depth
            .min(attr.max_srq_wr)
            .min(cq_capacity / 2)
            .max(16);
        if cq_capacity < srq_depth * 2 {
            return Err(format!(
                "the device's completion queues hold {cq_capacity} entries, too few for a receive queue of {srq_depth}"
            ));
        }
        let cq = V::create_cq_with_channel(&ctx, cq_capacity).map_err(|e| e.to_string())?;
        let srq = V::create_srq(&pd, srq_depth, 2).map_err(|e| e.to_string())?;
        let in_capsule = opts.in_capsule_data_size;
        let recv_cmds = DmaBuf::new(&pd, srq_depth as usize * SQE_LEN, AccessFlags::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let capsules = if in_capsule > 0 {
            let size = (in_capsule as usize).next_multiple_of(BUFFER_ALIGN);
            let pool =
                BufferPool::new(size, srq_depth + srq_depth / 2).map_err(|e| e.to_string())?;
            register_pool::<V>(&pd, &pool, AccessFlags::LOCAL_WRITE).map_err(|e| e.to_string())?;
            Some(pool)
        } else {
            None
        };
        let buf_size = (opts.max_io_size as usize).next_multiple_of(4096);
        let wanted = (u64::from(opts.num_shared_buffers) * u64::from(opts.io_unit_size)
            / buf_size as u64) as u32;
        let count = wanted.clamp(MIN_DATA_BUFFERS, MAX_DATA_BUFFERS);
        // Four small buffers per large one (at most 4096, 32 MiB): commands up to 8 KiB
        // (admin, Connect, small I/O) are the many, and never wait behind large transfers, for
        // a quarter more memory. (SPDK's iobuf keeps 8192 small and 1024 large per thread.)
        let small_count = (count * 4).min(MAX_SMALL_BUFFERS);
        let pools = SizedPools::new(SMALL_BUFSIZE, small_count, buf_size, count)
            .map_err(|e| e.to_string())?;
        for pool in [&pools.small, &pools.large] {
            register_pool::<V>(&pd, pool, AccessFlags::LOCAL_WRITE).map_err(|e| {
                format!(
                    "{e} (registering {} MiB of data buffers; raise `ulimit -l`)",
                    (pool.buf_size() * pool.count() as usize) >> 20
                )
            })?;
        }
        // SEND WITH INVALIDATE answers where the host asked for it (its key's SGL subtype), so
        // the host need not post a LOCAL_INV and wait for it on every I/O; not on soft-RoCE,
        // as SPDK decides too. Measured in the lab (`cpu-breakdown`, `side-by-side`): on
        // Linux 6.1 it took a third off the whole VM's CPU per 4 KiB read, but on 6.12 the
        // guest kernel double-faulted in rxe's work queue (slab allocation, corrupted flags) in
        // both runs that used it and in none without: a host's kernel is not ours to crash.
        let send_with_invalidate = attr
            .device_cap_flags
            .contains(DeviceCapFlags::MEM_MGT_EXTENSIONS)
            && !ctx.is_soft_roce();
        let defers = ctx.transport() != Transport::Iwarp;
        let mut dev = Self {
            ctx,
            pd,
            cq,
            srq,
            pools,
            send_with_invalidate,
            max_qp_wr: attr.max_qp_wr,
            max_rd_atom: attr.max_qp_rd_atom.clamp(1, 255) as u8,
            max_init_rd_atom: attr.max_qp_init_rd_atom.clamp(1, 255) as u8,
            recv_cmds,
            capsules,
            lent: (0..srq_depth).map(|_| None).collect(),
            in_capsule,
            repost: (0..srq_depth).collect(),
            repost_batch: (srq_depth / 16).clamp(1, MAX_CHAIN as u32),
            srq_depth,
            recv_posted: 0,
            cq_capacity,
            cq_reserved: srq_depth,
            max_cqe: attr.max_cqe,
            failed: false,
            removed: false,
            wake_registered: false,
            cq_armed: false,
            share: [
                (small_count / 4).max(16).min(small_count),
                (count / 4).max(16).min(count),
                (srq_depth / 8).max(16),
            ],
            backlog_capsules: 0,
            backlog_capsule_cap: srq_depth / 4,
            defer_budget: (small_count / 8).min(DEFER_BUFFERS),
            defers,
            stats: DeviceStats::default(),
        };
        dev.flush_all_reposts()?;
        tracing::info!(device = %dev.ctx.device_name(), srq_depth, data_buffers = count,
            buffer_size = buf_size, huge_pages = dev.pools.large.uses_huge_pages(),
            send_with_invalidate, "RDMA device ready");
        Ok(dev)
    }

    /// Reserves room on the shared CQ for `wrs` more send work requests, growing the CQ (as
    /// SPDK does per QP) up to the device's maximum; false when it cannot hold them.
    pub fn reserve_cq(&mut self, wrs: u32) -> bool {
        let need = self.cq_reserved + wrs;
        if need > self.cq_capacity {
            let want = need
                .max(self.cq_capacity.saturating_mul(2))
                .min(self.max_cqe);
            if want < need {
                return false;
            }
            // Whether a provider keeps the CQ armed across a resize is its own affair: arm it
            // again before the next sleep.
            self.cq_armed = false;
            match self.cq.resize(want) {
                Ok(got) if got >= need => self.cq_capacity = got,
                Ok(_) => return false,
                Err(e) => {
                    tracing::debug!("growing the completion queue to {want} entries failed: {e}");
                    return false;
                }
            }
        }
        self.cq_reserved = need;
        true
    }

    pub fn same_device(&self, ctx: &V::Context) -> bool {
        self.ctx.same_device(ctx)
    }

    /// The SQE that arrived in receive slot `slot`.
    pub fn command(&self, slot: u32) -> Command {
        let mut raw = [0u8; SQE_LEN];
        self.recv_cmds.read_at(slot as usize * SQE_LEN, &mut raw);
        Command::read_from_bytes(&raw).expect("64 bytes make one SQE")
    }

    /// The buffer that received slot `slot`'s in-capsule data (its receive completed).
    pub fn take_capsule(&mut self, slot: u32) -> Option<IoBuf> {
        self.lent.get_mut(slot as usize).and_then(Option::take)
    }

    /// Gives a capsule buffer whose data nobody needs back to slot `slot`, to be posted again.
    pub fn return_capsule(&mut self, slot: u32, buf: Option<IoBuf>) {
        if let Some(lent) = self.lent.get_mut(slot as usize) {
            *lent = buf;
        }
    }

    /// Capsule buffers out of the pool and not lent to the SRQ: held by requests. For leak
    /// checks (walks the slots).
    pub fn capsules_held(&self) -> usize {
        let out = self
            .capsules
            .as_ref()
            .map_or(0, |p| p.count() as usize - p.available());
        out - self.lent.iter().flatten().count()
    }

    /// A receive completed (successfully or flushed): its slot left the SRQ.
    pub fn received(&mut self) {
        self.recv_posted = self.recv_posted.saturating_sub(1);
    }

    /// Receive slots neither on the SRQ nor waiting to be reposted: held by requests
    /// (in-capsule data not consumed yet).
    pub fn recv_slots_held(&self) -> u32 {
        self.srq_depth - self.recv_posted - self.repost.len() as u32
    }

    pub fn repost(&mut self, slot: u32) {
        self.repost.push(slot);
    }

    /// Posts consumed receive slots back to the SRQ once a batch of them is waiting (or the
    /// SRQ is half empty), a chain at a time, each with a capsule buffer (the one it had, or a
    /// fresh one). Slots for which the capsule pool has no buffer left wait for a later turn.
    ///
    /// Why wait for a batch: a reactor serving a few connections otherwise rang the receive
    /// doorbell for every command (one post per turn, each with one receive), while the SRQ,
    /// thousands deep, misses a handful of slots for nobody. The few slots held back are
    /// posted when the reactor goes idle or at its next tick ([`Self::flush_all_reposts`]).
    #[inline]
    pub fn flush_reposts(&mut self) -> Result<(), String> {
        // Checked here, inlined: most turns have nothing to repost (see `flush_sends`).
        let waiting = self.repost.len() as u32;
        if waiting < self.repost_batch && (waiting == 0 || self.recv_posted >= self.srq_depth / 2) {
            return Ok(());
        }
        self.post_reposts()
    }

    /// Posts every consumed receive slot, batch or not (idle, or a timer tick).
    pub fn flush_all_reposts(&mut self) -> Result<(), String> {
        if self.repost.is_empty() {
            return Ok(());
        }
        self.post_reposts()
    }

    /// Receive slots waiting to be posted again.
    pub fn reposts_waiting(&self) -> usize {
        self.repost.len()
    }

    #[inline(never)]
    fn post_reposts(&mut self) -> Result<(), String> {
        while !self.repost.is_empty() {
            let want = self.repost.len().min(MAX_CHAIN);
            let start = self.repost.len() - want;
            let mut starved = false;
            // Only the entries this chain uses are built (see `flush_batch`).
            let mut sges: ArrayVec<[Sge; 2], MAX_CHAIN> = ArrayVec::new();
            for &slot in &self.repost[start..] {
                let cmd = self
                    .recv_cmds
                    .sge(slot as usize * SQE_LEN, SQE_LEN)
                    .expect("slot inside the command region");
                let mut data = Sge::default();
                if let Some(pool) = &self.capsules {
                    let lent = &mut self.lent[slot as usize];
                    if lent.is_none() {
                        *lent = pool.get();
                    }
                    let Some(buf) = lent.as_ref() else {
                        starved = true;
                        break;
                    };
                    data = Sge {
                        addr: buf.addr(),
                        length: self.in_capsule,
                        lkey: buf.lkey(),
                    };
                }
                sges.push([cmd, data]);
            }
            let n = sges.len();
            if n > 0 {
                let sge_count = if self.capsules.is_some() { 2 } else { 1 };
                let slots = &self.repost[start..start + n];
                let chain: ArrayVec<RecvWr<'_>, MAX_CHAIN> = slots
                    .iter()
                    .zip(&sges)
                    .map(|(&slot, sge)| {
                        RecvWr::new(wr_id(WrKind::Recv, 0, 0, slot), &sge[..sge_count])
                    })
                    .collect();
                self.srq.post_recv(&chain).map_err(|e| e.to_string())?;
                self.recv_posted += n as u32;
                self.stats.recv_doorbell_updates += 1;
                self.stats.total_recv_wrs += n as u64;
                self.repost.drain(start..start + n);
            }
            if starved {
                break;
            }
        }
        Ok(())
    }
}

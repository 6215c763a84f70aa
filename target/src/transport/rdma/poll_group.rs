//! One reactor's share of the RDMA transport: its devices' CQs and SRQs, its qpairs, and the
//! FIFOs of requests waiting for a resource. Everything here runs on the reactor thread.
//! This file has the turn (poll, end-of-turn flush, sleep) and the counters; what a work
//! completion does is in `completion.rs`, a connection's life from accept to reaping in
//! `connection.rs`, a request's steps in `steps.rs`.

use crossbeam::queue::SegQueue;
use nvmf_common::buffer::BufClass;
use nvmf_common::rdma::{
    CmIdToken, RealVerbs, Verbs, VerbsContext, VerbsCq, VerbsQp, WorkCompletion, MAX_CHAIN,
};
use nvmf_common::reactor::{Ready, WaitSet};
use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use super::device::DeviceResources;
use super::qpair::Qpair;
use super::read_batch::flush_reads;
use super::request::{parse_tag_slot, State};
use super::send_batch::{flush_batch, Deferral};
use super::wait_queue::{WaitQueue, Waiter};
use crate::core::driver;
use crate::core::request::{ReqTag, Wakeup};
use crate::core::{CoreCtx, TICK_MS};
use crate::transport::options::TransportOptions;
use crate::transport::{TransportLimits, TransportPollGroup};

pub(super) const POLL_BATCH: usize = 32;

/// The most qpairs a turn may post to and still defer responses (`qpair::Deferral`).
const DEFER_MAX_QPAIRS: usize = 4;

/// Fibonacci hashing of a QP number: one multiply, good high bits for the table's control
/// bytes.
#[derive(Default)]
pub(super) struct QpNumHasher(u64);

impl Hasher for QpNumHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A QP's key in [`RdmaPollGroup::by_qp_num`]: its device's index and its number. QP numbers
/// are unique within one device only: two NICs (two soft-RoCE devices, two functions of one
/// card) hand out the same ones, and a reactor serving both must not take one host's
/// capsules for another's.
pub(super) fn qp_key(dev: usize, qp_num: u32) -> u64 {
    (dev as u64) << 32 | u64::from(qp_num)
}

pub(super) fn class_index(class: BufClass) -> usize {
    match class {
        BufClass::Small => 0,
        BufClass::Large => 1,
    }
}

pub struct RdmaPollGroup<V: Verbs = RealVerbs> {
    pub(super) index: u8,
    pub(super) opts: TransportOptions,
    pub(super) limits: TransportLimits,
    pub(super) load: Arc<AtomicUsize>,
    /// Where this group reports a device it saw removed, for the acceptor to tell the others.
    pub(super) removed: Arc<SegQueue<Arc<V::Context>>>,
    pub(super) devices: Vec<DeviceResources<V>>,
    pub(super) qpairs: Vec<Option<Qpair<V>>>,
    pub(super) gens: Vec<u8>,
    /// Receive completions name their QP by number: one lookup per command, so a
    /// multiplicative hash, not SipHash (QP numbers come from the device, not from hosts).
    /// Qpair index by [`qp_key`] (device, QP number).
    pub(super) by_qp_num: HashMap<u64, usize, BuildHasherDefault<QpNumHasher>>,
    pub(super) by_token: HashMap<CmIdToken, usize>,
    /// Requests waiting for a data buffer, one FIFO per class (small, large): a class that
    /// ran out never makes the other's waiters wait, nor costs a scan.
    pub(super) need_buffer: [WaitQueue; 2],
    pub(super) need_send: WaitQueue,
    pub(super) wcs: [WorkCompletion; POLL_BATCH],
    /// Qpairs with READs or responses queued this turn (see `flush_sends`).
    pub(super) dirty: Vec<usize>,
    /// Qpairs (index, generation) the housekeeping tick looks at: unconnected (connect
    /// timeout), closing (reaped when drained), broken, or with RDMA READs or SENDs posted
    /// (transfer timeout). A connected qpair with nothing posted leaves the list at the tick
    /// that finds it so and comes back with its next posted transfer: idle connections cost
    /// a tick nothing.
    pub(super) watch: Vec<(usize, u8)>,
    /// The core's clock at the start of this turn (stamps posted transfers).
    pub(super) now_ms: u64,
    pub(super) now_ns: u64,
}

impl<V: Verbs> RdmaPollGroup<V> {
    pub fn new(
        index: u8,
        opts: TransportOptions,
        limits: TransportLimits,
        load: Arc<AtomicUsize>,
        removed: Arc<SegQueue<Arc<V::Context>>>,
    ) -> Self {
        Self {
            index,
            opts,
            limits,
            load,
            removed,
            devices: Vec::new(),
            qpairs: Vec::new(),
            gens: Vec::new(),
            by_qp_num: HashMap::default(),
            by_token: HashMap::new(),
            need_buffer: [
                WaitQueue::new(State::NeedBuffer),
                WaitQueue::new(State::NeedBuffer),
            ],
            need_send: WaitQueue::new(State::NeedSend),
            wcs: [WorkCompletion::default(); POLL_BATCH],
            dirty: Vec::new(),
            watch: Vec::new(),
            now_ms: 0,
            now_ns: 0,
        }
    }

    /// Posts every qpair's queued RDMA READs and batched responses at the end of a turn:
    /// one chain (one doorbell) per qpair, the READs leading the responses, unless they
    /// are more than a chain holds.
    #[inline]
    fn flush_sends(&mut self) {
        // Checked here, inlined: most turns of a spinning reactor have nothing to flush, and
        // the call alone cost more than the check.
        if !self.dirty.is_empty() {
            self.flush_dirty();
        }
    }

    #[inline(never)]
    fn flush_dirty(&mut self) {
        // Deferred responses hold resources until a later completion: not while requests
        // wait for buffers or send room. And they save a turn only when few qpairs post in
        // it: with many, their completions come in a few polls of the turns that follow.
        let may_defer = self.dirty.len() <= DEFER_MAX_QPAIRS
            && self.need_buffer.iter().all(WaitQueue::is_empty)
            && self.need_send.is_empty();
        if may_defer {
            self.flush_qpairs::<true>();
        } else {
            self.flush_qpairs::<false>();
        }
        self.dirty.clear();
    }

    /// Posts the dirty qpairs' READs and responses; with `DEFER`, chains may be deferred
    /// (`qpair::Deferral`). A constant, so a busy turn's flush carries none of it.
    #[inline(always)]
    fn flush_qpairs<const DEFER: bool>(&mut self) {
        // Without `DEFER` the flush never looks at it.
        let mut no_budget = 0;
        for k in 0..self.dirty.len() {
            let qi = self.dirty[k];
            let Some(qp) = self.qpairs.get_mut(qi).and_then(Option::as_mut) else {
                continue;
            };
            let (mut doorbells, mut wrs) = (0, 0);
            let mut defer = Deferral {
                budget: if DEFER {
                    &mut self.devices[qp.dev].defer_budget
                } else {
                    &mut no_budget
                },
                now_ns: self.now_ns,
                latency_ns: 0,
            };
            if !qp.batch.is_empty() {
                // READs and responses together: the READs lead the responses' first chain
                // (one doorbell) when they leave it room for a response.
                let now = self.now_ms;
                if qp.reads.is_empty() {
                    (doorbells, wrs) = flush_batch::<V, false, DEFER>(qi, qp, now, &mut defer);
                } else if qp.reads.len() + 2 <= MAX_CHAIN {
                    (doorbells, wrs) = flush_batch::<V, true, DEFER>(qi, qp, now, &mut defer);
                } else {
                    (doorbells, wrs) = flush_reads(qi, qp);
                    let (d, w) = flush_batch::<V, false, DEFER>(qi, qp, now, &mut defer);
                    doorbells += d;
                    wrs += w;
                }
            } else if !qp.reads.is_empty() {
                (doorbells, wrs) = flush_reads(qi, qp);
            }
            let latency = defer.latency_ns;
            if doorbells == 0 {
                continue;
            }
            let dev = qp.dev;
            watch(&mut self.watch, qi, qp);
            let stats = &mut self.devices[dev].stats;
            if DEFER {
                stats.request_latency += latency;
            }
            stats.send_doorbell_updates += u64::from(doorbells);
            stats.total_send_wrs += u64::from(wrs);
        }
    }
}

/// Puts a qpair on the watch list unless it is on it already (one flag test per post).
pub(super) fn watch<V: Verbs>(list: &mut Vec<(usize, u8)>, qi: usize, qp: &mut Qpair<V>) {
    if !qp.watched {
        qp.watched = true;
        list.push((qi, qp.gen));
    }
}

/// What a poll group holds right now, for checks that nothing leaks once it is idle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollGroupResources {
    pub qpairs: usize,
    /// Request slots not free, over all qpairs, deferred ones aside.
    pub requests_in_use: usize,
    /// Requests whose response went out deferred (`Sent`): done on the wire as far as we
    /// know, freed by a later SEND's completion or with their qpair.
    pub requests_deferred: usize,
    /// Data buffers deferred requests hold (counted in `buffers_out` too).
    pub deferred_buffers: usize,
    /// Small buffers deferred responses may still take, over all devices.
    pub deferral_budget: u32,
    /// Data buffers out of their pools, over all devices.
    pub buffers_out: usize,
    /// SRQ receive slots held by requests, over all devices.
    pub recv_slots_held: u32,
    /// Consumed receive slots waiting to be posted again with a batch, over all devices.
    pub recv_slots_waiting: usize,
    /// Entries in the poll group's wait queues (stale ones included until they are dropped)
    /// and requests waiting on their qpair for a read credit.
    pub waiting: usize,
    /// Requests parked on their qpair, which holds its whole share of their buffer class.
    pub parked: usize,
    /// Commands that arrived while their qpair had no free request slot, waiting for one.
    pub backlog: usize,
}

impl<V: Verbs> RdmaPollGroup<V> {
    /// Each live qpair's queue ID (the one its connect request named) and QP number: for
    /// tests that aim a fabric fault at one queue.
    pub fn queue_qp_numbers(&self) -> Vec<(Option<u16>, u32)> {
        self.qpairs
            .iter()
            .flatten()
            .map(|q| (q.state.expected_qid, q.qp.qp_num()))
            .collect()
    }

    pub fn resources(&self) -> PollGroupResources {
        let live = self.qpairs.iter().flatten();
        let live_parked = live.clone().map(|q| q.acct.parked()).sum();
        let backlog = live.clone().map(|q| q.backlog.len()).sum();
        PollGroupResources {
            qpairs: live.clone().count(),
            requests_in_use: live
                .clone()
                .flat_map(|q| &q.requests)
                .filter(|r| !matches!(r.state, State::Free | State::Sent))
                .count(),
            requests_deferred: live
                .clone()
                .flat_map(|q| &q.requests)
                .filter(|r| r.state == State::Sent)
                .count(),
            deferred_buffers: live
                .flat_map(|q| &q.requests)
                .filter(|r| r.state == State::Sent && r.buf_class.is_some())
                .count(),
            deferral_budget: self.devices.iter().map(|d| d.defer_budget).sum(),
            buffers_out: self
                .devices
                .iter()
                .map(|d| {
                    let (s, l) = (&d.pools.small, &d.pools.large);
                    (s.count() as usize - s.available())
                        + (l.count() as usize - l.available())
                        + d.capsules_held()
                })
                .sum(),
            recv_slots_held: self.devices.iter().map(|d| d.recv_slots_held()).sum(),
            recv_slots_waiting: self.devices.iter().map(|d| d.reposts_waiting()).sum(),
            parked: live_parked,
            backlog,
            waiting: self.need_buffer[0].len()
                + self.need_buffer[1].len()
                + self.need_send.len()
                + self
                    .qpairs
                    .iter()
                    .flatten()
                    .map(|q| q.awaiting_read.len())
                    .sum::<usize>(),
        }
    }
}

impl<V: Verbs> TransportPollGroup for RdmaPollGroup<V> {
    fn poll(&mut self, core: &mut CoreCtx) -> usize {
        self.now_ms = core.now_ms();
        self.now_ns = core.now_ns();
        let mut work = 0;
        for d in 0..self.devices.len() {
            work += self.poll_device(d, core);
        }
        // Each serve loop only when its queue has waiters: an idle turn stays a CQ poll.
        if !self.need_buffer.iter().all(WaitQueue::is_empty) {
            work += self.serve_buffers(core);
        }
        if !self.need_send.is_empty() {
            work += self.serve_sends(core);
        }
        let tick = core.is_tick();
        if tick {
            self.reap(core);
        }
        for dev in &mut self.devices {
            let posted = if tick {
                dev.flush_all_reposts()
            } else {
                dev.flush_reposts()
            };
            if let Err(e) = posted {
                tracing::error!("reposting receive buffers failed: {e}");
            }
        }
        work
    }

    fn resume(&mut self, tag: ReqTag, wakeup: Wakeup, core: &mut CoreCtx) {
        let (gen, qpair, slot) = parse_tag_slot(tag.slot());
        driver::resume(self, core, Waiter { qpair, gen, slot }, wakeup);
    }

    /// Posts what the turn queued: READs of host data and responses, including those the
    /// bdevs' completions made after this group's poll.
    #[inline]
    fn flush(&mut self) {
        self.flush_sends();
    }

    fn qpair_count(&self) -> usize {
        self.qpairs.iter().flatten().count()
    }

    fn shutdown(&mut self, core: &mut CoreCtx) {
        for qi in 0..self.qpairs.len() {
            self.start_close(qi, core);
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    /// Arms each device's CQ (registering its completion channel on first use) unless it is
    /// still armed from an earlier sleep it did not end. Watched
    /// qpairs and failed devices need the housekeeping tick, so they bound the sleep to it;
    /// new connections, CM and async events come as poll group messages, which wake the
    /// reactor themselves.
    fn prepare_sleep(&mut self, _core: &CoreCtx, wait: &WaitSet<'_>) -> Option<Duration> {
        let mut bound = Duration::MAX;
        for dev in &mut self.devices {
            if dev.failed {
                bound = bound.min(Duration::from_millis(TICK_MS));
                continue;
            }
            let fd = dev.cq.wake_fd()?;
            if !dev.wake_registered {
                if let Err(e) = wait.watch(fd) {
                    tracing::warn!("cannot sleep on a completion channel, polling instead: {e}");
                    return None;
                }
                dev.wake_registered = true;
            }
            // Idle: the SRQ gets back every slot held for a batch.
            if let Err(e) = dev.flush_all_reposts() {
                tracing::error!("reposting receive buffers failed: {e}");
            }
            if !dev.cq_armed {
                if let Err(e) = dev.cq.arm() {
                    tracing::warn!("cannot arm a completion queue, polling instead: {e}");
                    return None;
                }
                dev.cq_armed = true;
            }
        }
        if !self.watch.is_empty() {
            bound = bound.min(Duration::from_millis(TICK_MS));
        }
        Some(bound)
    }

    /// Takes the event of each CQ whose channel signalled: one read, where draining the
    /// channel took two (the second to see it empty), and none for a CQ that did not fire.
    fn woken(&mut self, ready: Ready<'_>) {
        for dev in &mut self.devices {
            let Some(fd) = dev.cq.wake_fd() else { continue };
            if !dev.wake_registered || !ready.contains(fd) {
                continue;
            }
            match dev.cq.take_event() {
                Ok(true) => dev.cq_armed = false,
                Ok(false) => {}
                Err(e) => {
                    // Arm again: a CQ left unarmed would never wake the reactor.
                    dev.cq_armed = false;
                    tracing::warn!("reading completion events failed: {e}");
                }
            }
        }
    }

    /// SPDK's RDMA layout (`nvmf_rdma_poll_group_dump_stat`): pending_data_buffer, then per
    /// device polls, idle_polls, completions, requests, request_latency (ns; thread stats
    /// report tick_rate 1e9), the wait queues, and the doorbell counters.
    fn dump_stats(&self) -> serde_json::Map<String, serde_json::Value> {
        let devices: Vec<serde_json::Value> = self
            .devices
            .iter()
            .enumerate()
            .map(|(d, dev)| {
                let st = dev.stats;
                let waiting = |q: &WaitQueue| {
                    q.count_where(|w| {
                        self.qpairs
                            .get(w.qpair)
                            .and_then(Option::as_ref)
                            .is_some_and(|qp| qp.dev == d)
                    })
                };
                serde_json::json!({
                    "name": dev.ctx.device_name(),
                    "polls": st.polls,
                    "idle_polls": st.idle_polls,
                    "completions": st.completions,
                    "requests": st.requests,
                    "request_latency": st.request_latency,
                    "pending_free_request": st.pending_free_request,
                    "pending_rdma_read": self
                        .qpairs
                        .iter()
                        .flatten()
                        .filter(|qp| qp.dev == d)
                        .map(|qp| qp.awaiting_read.len())
                        .sum::<usize>(),
                    "pending_rdma_write": 0,
                    "pending_rdma_send": waiting(&self.need_send),
                    "total_send_wrs": st.total_send_wrs,
                    "send_doorbell_updates": st.send_doorbell_updates,
                    "total_recv_wrs": st.total_recv_wrs,
                    "recv_doorbell_updates": st.recv_doorbell_updates,
                })
            })
            .collect();
        let mut out = serde_json::Map::new();
        out.insert(
            "pending_data_buffer".into(),
            ((self.need_buffer[0].len() + self.need_buffer[1].len()) as u64
                + self
                    .qpairs
                    .iter()
                    .flatten()
                    .map(|q| q.acct.parked() as u64)
                    .sum::<u64>())
            .into(),
        );
        out.insert("devices".into(), devices.into());
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::hash::BuildHasherDefault;

    use super::{qp_key, QpNumHasher};

    /// Two devices numbering their QPs alike (two soft-RoCE devices both start at 0x11): a
    /// reactor serving both keeps their qpairs apart, and forgetting one keeps the other.
    #[test]
    fn equal_qp_numbers_of_two_devices_are_two_qpairs() {
        let mut by_qp: HashMap<u64, usize, BuildHasherDefault<QpNumHasher>> = HashMap::default();
        by_qp.insert(qp_key(0, 0x11), 7);
        by_qp.insert(qp_key(1, 0x11), 9);
        assert_eq!(by_qp.get(&qp_key(0, 0x11)), Some(&7));
        assert_eq!(by_qp.get(&qp_key(1, 0x11)), Some(&9));
        by_qp.remove(&qp_key(0, 0x11));
        assert_eq!(by_qp.get(&qp_key(1, 0x11)), Some(&9));
        assert_eq!(by_qp.get(&qp_key(0, 0x11)), None);
        assert_ne!(qp_key(1, 0), qp_key(0, 1 << 24));
    }
}

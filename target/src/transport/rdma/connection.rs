//! A poll group's connections: building a device's resources, accepting a qpair, the CM
//! and async events that end one, a failed device's teardown and rebuild, and closing and
//! reaping qpairs (on the housekeeping tick, only those on the watch list).

use nvmf_common::rdma::{
    AccessFlags, AsyncEvent, AsyncEventKind, CmEventKind, CmIdToken, ConnParams, DmaBuf, QpCaps,
    SendWr, Verbs, VerbsCmId, VerbsContext, VerbsCq, VerbsQp,
};
use nvmf_common::spec::rdma_cm::{RdmaCmAccept, RdmaCmRejectStatus};
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use zerocopy::IntoBytes;

use super::backlog::Backlog;
use super::device::DeviceResources;
use super::poll_group::{qp_key, watch, RdmaPollGroup};
use super::qpair::{claim_index, release, transfer_stuck, Qpair, SlotAccounts, CQE_LEN};
use super::read_batch::drop_queued_reads;
use super::request::{
    slots_for, tag_slot, wr_id, RdmaRequest, State, WrKind, DEFERRED_SENDS, DRAIN_SLOT, MAX_QPAIRS,
};
use super::send_batch::{deferred_released, needs_cover, post_cover};
use super::NewConnection;
use crate::core::queue::QueueState;
use crate::core::request::{ReqTag, Request};
use crate::core::{CoreCtx, TICK_MS};

/// How long (ms) a closing qpair waits for its flushed work requests before it is destroyed
/// anyway.
const DRAIN_TIMEOUT_MS: u64 = 2_000;

impl<V: Verbs> RdmaPollGroup<V> {
    pub(super) fn device_for(&mut self, ctx: Arc<V::Context>) -> Result<usize, String> {
        if let Some(i) = self.devices.iter().position(|d| d.same_device(&ctx)) {
            if self.devices[i].removed {
                return Err("the device was removed".into());
            }
            if self.devices[i].failed {
                return Err(
                    "the device's completion queue failed; its resources are being rebuilt".into(),
                );
            }
            return Ok(i);
        }
        self.devices.push(DeviceResources::new(ctx, &self.opts)?);
        Ok(self.devices.len() - 1)
    }

    /// Builds this reactor's resources for a device ahead of its first connection.
    pub fn prepare_device(&mut self, ctx: Arc<V::Context>) {
        if let Err(e) = self.device_for(ctx) {
            tracing::warn!(
                "cannot prepare RDMA device resources (the first connect will retry): {e}; run `nvmf-doctor` to diagnose"
            );
        }
    }

    /// Creates the QP for a new connection on this reactor and accepts it. On failure the
    /// dropped CM id rejects the connection.
    pub fn add_connection(
        &mut self,
        conn: NewConnection<V>,
        max_total: usize,
    ) -> Result<(), String> {
        let refuse = |e: String, conn: &NewConnection<V>| {
            super::reject::<_, V>(&conn.id, RdmaCmRejectStatus::NO_RESOURCES);
            e
        };
        // The target's `max_qpairs` bounds queue pairs before they Connect too: each costs a
        // QP, request slots and response buffers from the moment it is accepted.
        if conn.qpairs_now >= max_total {
            let e = format!(
                "the target already has {} RDMA queue pairs (max_qpairs {max_total})",
                conn.qpairs_now
            );
            return Err(refuse(e, &conn));
        }
        // First, so a full group wastes no QP on a connection it refuses. An index claimed
        // here and not filled (a later refusal) stays free for the next connection.
        let Some(qi) = claim_index(&mut self.qpairs, &mut self.gens) else {
            let e =
                format!("this reactor already has {MAX_QPAIRS} qpairs, the most it can tell apart");
            return Err(refuse(e, &conn));
        };
        let ctx = conn
            .id
            .context()
            .map_err(|e| refuse(e.to_string(), &conn))?;
        let dev_index = self.device_for(ctx).map_err(|e| refuse(e, &conn))?;
        let dev = &self.devices[dev_index];
        let depth = u32::from(conn.depth);
        let slots = slots_for(conn.depth);
        let caps = QpCaps {
            max_send_wr: (slots * 2 + 1).min(dev.max_qp_wr),
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            // Responses go inline (a CQE is 16 bytes): the device copies them at the post and
            // never reads them from memory, one DMA read (on soft-RoCE, one region lookup and
            // page mapping) less per response. A device without inline sends refuses the QP;
            // then the responses go from the qpair's registered response buffer.
            max_inline_data: CQE_LEN as u32,
        };
        // Every send WR may complete (flushes complete unsignaled ones too): reserve room for
        // all of them on the shared CQ, or refuse the connection rather than risk an overrun.
        if !self.devices[dev_index].reserve_cq(caps.max_send_wr) {
            let dev = &self.devices[dev_index];
            let e = format!(
                "the completion queue ({} entries, {} reserved, device maximum {}) has no room for another {} send work requests",
                dev.cq_capacity, dev.cq_reserved, dev.max_cqe, caps.max_send_wr
            );
            return Err(refuse(e, &conn));
        }
        let dev = &self.devices[dev_index];
        let built = conn
            .id
            .create_qp(&dev.pd, &dev.cq, &dev.cq, Some(&dev.srq), caps)
            .or_else(|_| {
                let caps = QpCaps {
                    max_inline_data: 0,
                    ..caps
                };
                conn.id
                    .create_qp(&dev.pd, &dev.cq, &dev.cq, Some(&dev.srq), caps)
            })
            .and_then(|qp| {
                // A registered response buffer only for a QP that cannot send responses
                // inline: no memory region per qpair otherwise.
                if qp.caps().max_inline_data as usize >= CQE_LEN {
                    return Ok((qp, None));
                }
                DmaBuf::<V>::new(&dev.pd, slots as usize * CQE_LEN, AccessFlags::LOCAL_WRITE)
                    .map(|responses| (qp, Some(responses)))
            });
        let (qp, responses) = match built {
            Ok(built) => built,
            Err(e) => {
                self.devices[dev_index].cq_reserved -= caps.max_send_wr;
                return Err(refuse(e.to_string(), &conn));
            }
        };
        let dev = &self.devices[dev_index];
        let gen = self.gens[qi];
        let requests = (0..slots)
            .map(|s| {
                let mut r =
                    RdmaRequest::new(Request::new(ReqTag::new(self.index, tag_slot(gen, qi, s))));
                r.slot = s;
                r
            })
            .collect();
        let accept = RdmaCmAccept::new(conn.depth);
        let params = ConnParams {
            responder_resources: conn.responder_resources.min(dev.max_rd_atom),
            initiator_depth: conn.initiator_depth.min(dev.max_init_rd_atom),
            rnr_retry_count: 7,
            ..ConnParams::with_private_data(accept.as_bytes())
        };
        let max_reads = u32::from(params.initiator_depth.max(1));
        if let Err(e) = conn.id.accept(&params) {
            self.devices[dev_index].cq_reserved -= caps.max_send_wr;
            return Err(e.to_string());
        }
        let dev = &self.devices[dev_index];
        // No more than the CQ has room for, whatever the provider rounded up to.
        let sq_capacity = qp.caps().max_send_wr.min(caps.max_send_wr);
        let cq_share = caps.max_send_wr;
        let send_with_invalidate = dev.send_with_invalidate;
        let token = conn.id.token();
        self.by_qp_num.insert(qp_key(dev_index, qp.qp_num()), qi);
        self.by_token.insert(token, qi);
        tracing::debug!(qid = conn.qid, depth, peer = %conn.peer, qp_num = qp.qp_num(), "RDMA qpair accepted");
        // Counted in this reactor's load before it stops counting as accepting.
        self.load.fetch_add(1, Ordering::Relaxed);
        let mut ticket = conn.ticket;
        ticket.taken();
        self.qpairs[qi] = Some(Qpair {
            gen,
            dev: dev_index,
            qp,
            cm_id: conn.id,
            token,
            state: QueueState::new(self.limits, Some(conn.qid), conn.peer, conn.listener),
            requests,
            responses,
            sq_capacity,
            cq_share,
            acct: SlotAccounts::new(slots),
            backlog: Backlog::new(depth),
            batch: Vec::with_capacity(slots as usize),
            reads: Vec::with_capacity(slots as usize),
            awaiting_read: VecDeque::with_capacity(slots as usize),
            unsignaled: VecDeque::with_capacity(slots as usize),
            uncovered: 0,
            // An admin queue's few responses gain nothing from deferring: they are sent
            // signaled, and hold nothing past their completion.
            max_deferred: if dev.defers && conn.qid != 0 {
                DEFERRED_SENDS
            } else {
                0
            },
            cover: None,
            sq_used: 0,
            reads_in_flight: 0,
            max_reads,
            signaled: 0,
            closing: None,
            drained: false,
            send_with_invalidate,
            broken: false,
            watched: true,
            _ticket: ticket,
        });
        self.watch.push((qi, gen));
        // A qpair is on the list at most once: with room for every one, `watch` never
        // allocates on the I/O path.
        self.watch
            .reserve(self.qpairs.len().saturating_sub(self.watch.len()));
        Ok(())
    }

    /// The device's CQ is broken (an overrun or a device error): every qpair on it is closed
    /// and the device's resources are rebuilt once the last one is gone.
    pub(super) fn fail_device(&mut self, d: usize, why: &str, core: &mut CoreCtx) {
        if self.devices[d].failed {
            return;
        }
        tracing::error!(device = %self.devices[d].ctx.device_name(),
            "{why}; closing every qpair on the device and rebuilding its resources");
        self.devices[d].failed = true;
        for qi in 0..self.qpairs.len() {
            if self.qpairs[qi].as_ref().is_some_and(|q| q.dev == d) {
                self.start_close(qi, core);
            }
        }
    }

    /// The acceptor learnt that the device `ctx` is open on was removed.
    pub fn device_removed(&mut self, ctx: &V::Context, core: &mut CoreCtx) {
        if let Some(d) = self.devices.iter().position(|dev| dev.same_device(ctx)) {
            self.retire_device(d, core);
        }
    }

    /// A device is gone: every qpair on it is closed, and its CQ, SRQ, buffers and
    /// registrations are dropped with the last of them, which lets the kernel finish the
    /// removal (it waits until nothing holds the device).
    fn retire_device(&mut self, d: usize, core: &mut CoreCtx) {
        if self.devices[d].removed {
            return;
        }
        tracing::warn!(device = %self.devices[d].ctx.device_name(),
            "RDMA device removed; closing its qpairs and freeing its resources");
        self.devices[d].removed = true;
        self.devices[d].failed = true;
        for qi in 0..self.qpairs.len() {
            if self.qpairs[qi].as_ref().is_some_and(|q| q.dev == d) {
                self.start_close(qi, core);
            }
        }
        self.rebuild_if_failed(d);
    }

    /// An asynchronous event of a device, forwarded by the acceptor to every poll group: the
    /// one owning the QP or CQ it names acts on it.
    pub fn on_async_event(&mut self, ctx: &V::Context, ev: AsyncEvent, core: &mut CoreCtx) {
        let Some(d) = self.devices.iter().position(|dev| dev.same_device(ctx)) else {
            return;
        };
        match ev.kind {
            AsyncEventKind::QpFatal | AsyncEventKind::QpReqErr | AsyncEventKind::QpAccessErr => {
                let qi = ev
                    .qp_num
                    .and_then(|n| self.by_qp_num.get(&qp_key(d, n)).copied());
                if let Some(qi) = qi {
                    if let Some(qp) = self.qpairs[qi].as_ref() {
                        tracing::warn!(peer = %qp.state.peer, kind = ?ev.kind, "the device broke a queue pair; closing it");
                    }
                    self.start_close(qi, core);
                }
            }
            AsyncEventKind::CqErr if ev.cq_id == Some(self.devices[d].cq.id()) => {
                self.fail_device(d, "the device reported a completion queue error", core);
            }
            AsyncEventKind::DeviceFatal => {
                self.fail_device(d, "the device reported a fatal error", core);
            }
            AsyncEventKind::PortErr => {
                tracing::warn!(device = %self.devices[d].ctx.device_name(), "an RDMA port went down");
            }
            _ => {}
        }
    }

    /// A CM event for one of this group's connections, forwarded by the acceptor.
    pub fn on_cm_event(&mut self, token: CmIdToken, kind: CmEventKind, core: &mut CoreCtx) {
        let Some(&qi) = self.by_token.get(&token) else {
            return;
        };
        match kind {
            CmEventKind::DeviceRemoval => {
                let d = self.qpairs[qi].as_ref().map(|q| q.dev);
                if let Some(d) = d {
                    // The acceptor tells the other reactors, which may hold the device with
                    // no connection on it.
                    self.removed.push(Arc::clone(&self.devices[d].ctx));
                    self.retire_device(d, core);
                }
            }
            CmEventKind::Disconnected
            | CmEventKind::TimewaitExit
            | CmEventKind::ConnectError
            | CmEventKind::Unreachable
            | CmEventKind::Rejected => {
                self.start_close(qi, core);
            }
            _ => {}
        }
    }

    /// Starts tearing a qpair down: tells the peer, detaches it from its controller, frees
    /// what waits for nothing, and marks the send queue so its end is seen.
    pub(super) fn start_close(&mut self, qi: usize, core: &mut CoreCtx) {
        let Some(qp) = self.qpairs.get_mut(qi).and_then(Option::as_mut) else {
            return;
        };
        if qp.closing.is_some() {
            return;
        }
        qp.closing = Some(core.now_ms());
        watch(&mut self.watch, qi, qp);
        let _ = qp.cm_id.disconnect();
        core.queue_closed(&mut qp.state);
        drop_queued_reads(qp);
        // Not `Abandoned`: their buffers stay until the QP is destroyed (see `Qpair`).
        for r in &mut qp.requests {
            if matches!(
                r.state,
                State::NeedBuffer | State::NeedRead | State::NeedSend | State::Batched
            ) {
                release(&mut qp.acct, r);
            }
        }
        // Batched responses were released above; none is posted any more. Parked requests
        // were `NeedBuffer`: released too.
        qp.batch.clear();
        qp.awaiting_read.clear();
        qp.acct.parked.iter_mut().for_each(VecDeque::clear);
        // Commands waiting for a slot go unanswered; their capsule buffers go back now.
        let held = qp.backlog.clear();
        self.devices[qp.dev].backlog_capsules -= held;
        let marker = SendWr::send(wr_id(WrKind::Send, qp.gen, qi, DRAIN_SLOT), &[]);
        if qp.qp.post_send(&[marker]).is_ok() {
            qp.sq_used += 1;
            qp.signaled += 1;
        } else {
            qp.drained = true;
        }
    }

    /// The housekeeping tick: closes qpairs that must go (a failed controller, no Connect
    /// in time, a failed post, a host that takes no transfer) and destroys closed ones whose
    /// work requests have all come back (or timed out) and whose requests the core has
    /// finished with. Looks only at the watch list, and at every qpair on the rare tick after
    /// some controller failed.
    pub(super) fn reap(&mut self, core: &mut CoreCtx) {
        if core.controllers_failed() {
            for qi in 0..self.qpairs.len() {
                let Some(qp) = self.qpairs[qi].as_mut() else {
                    continue;
                };
                core.housekeeping.qpairs_checked += 1;
                if qp.closing.is_none() && core.should_disconnect(&mut qp.state) {
                    self.start_close(qi, core);
                }
            }
        }
        let mut k = 0;
        while k < self.watch.len() {
            let (qi, gen) = self.watch[k];
            if self.still_watched(qi, gen, core) {
                k += 1;
            } else {
                self.watch.swap_remove(k);
            }
        }
    }

    /// One watched qpair at a tick; false when it leaves the watch list (idle or destroyed).
    pub(super) fn still_watched(&mut self, qi: usize, gen: u8, core: &mut CoreCtx) -> bool {
        let Some(qp) = self.qpairs[qi].as_mut().filter(|q| q.gen == gen) else {
            return false;
        };
        core.housekeeping.qpairs_checked += 1;
        if qp.closing.is_none() {
            if qp.broken || core.should_disconnect(&mut qp.state) {
                self.start_close(qi, core);
            } else if transfer_stuck(&qp.requests, core.now_ms(), core.transfer_timeout_ms)
                || qp.cover.is_some_and(|c| {
                    core.now_ms().saturating_sub(c.posted_ms) >= core.transfer_timeout_ms
                })
            {
                tracing::warn!(peer = %qp.state.peer,
                    "host completed no transfer within the transfer timeout; closing qpair");
                self.start_close(qi, core);
            } else if needs_cover(qp, core.now_ms(), TICK_MS) && post_cover(qi, qp, core.now_ms()) {
                let stats = &mut self.devices[qp.dev].stats;
                stats.send_doorbell_updates += 1;
                stats.total_send_wrs += 1;
            } else if qp.state.ctrl.is_some() && qp.signaled == 0 && qp.uncovered == 0 {
                qp.watched = false;
                return false;
            }
            return true;
        }
        let since = qp.closing.expect("checked above");
        let timed_out = core.now_ms().saturating_sub(since) > DRAIN_TIMEOUT_MS;
        let wire_done = (qp.drained && qp.signaled == 0) || timed_out;
        let executing = qp.requests.iter().any(|r| r.state == State::Executing);
        if !wire_done || executing {
            return true;
        }
        // Dropping the qpair destroys its QP first, then frees its requests' buffers
        // (`Abandoned` ones included): see the field order of `Qpair`.
        let qp = self.qpairs[qi].take().expect("checked above");
        let dev = &mut self.devices[qp.dev];
        dev.cq_reserved -= qp.cq_share;
        // Deferred responses no later SEND covered end with their QP.
        dev.defer_budget += qp.requests.iter().map(deferred_released).sum::<u32>();
        self.by_qp_num.remove(&qp_key(qp.dev, qp.qp.qp_num()));
        self.by_token.remove(&qp.token);
        self.gens[qi] = self.gens[qi].wrapping_add(1);
        self.load.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(peer = %qp.state.peer, "RDMA qpair destroyed");
        let d = qp.dev;
        drop(qp);
        self.rebuild_if_failed(d);
        false
    }

    /// Replaces a failed device's CQ, SRQ, receive buffers and pools once no qpair uses them;
    /// a removed device's are dropped instead.
    pub(super) fn rebuild_if_failed(&mut self, d: usize) {
        if !self.devices[d].failed || self.qpairs.iter().flatten().any(|q| q.dev == d) {
            return;
        }
        if self.devices[d].removed {
            self.drop_device(d);
            return;
        }
        let ctx = Arc::clone(&self.devices[d].ctx);
        match DeviceResources::new(ctx, &self.opts) {
            Ok(fresh) => {
                tracing::info!("RDMA device resources rebuilt after a completion queue failure");
                self.devices[d] = fresh;
            }
            Err(e) => tracing::error!("rebuilding RDMA device resources failed: {e}"),
        }
    }

    /// Drops device `d`'s resources (no qpair uses it). The devices after it move down one
    /// place: their qpairs' device index and QP-number keys follow.
    fn drop_device(&mut self, d: usize) {
        let dev = self.devices.remove(d);
        tracing::info!(device = %dev.ctx.device_name(), "RDMA device resources freed");
        drop(dev);
        let qps = self
            .qpairs
            .iter_mut()
            .flatten()
            .map(|qp| (&mut qp.dev, qp.qp.qp_num()));
        shift_keys_down(&mut self.by_qp_num, qps, d);
    }
}

/// Device `d` is gone (no qpair is on it): the qpairs on the devices after it move down one
/// place, their keys with them. Every key that moves is taken out before any is put back:
/// devices number their QPs alike, so a key moving down may be one still to move, which an
/// insertion would overwrite (one host's capsules then reaching another's qpair).
fn shift_keys_down<'a, S: BuildHasher>(
    by_qp_num: &mut HashMap<u64, usize, S>,
    qps: impl Iterator<Item = (&'a mut usize, u32)>,
    d: usize,
) {
    let mut moved = Vec::new();
    for (dev, qp_num) in qps.filter(|(dev, _)| **dev > d) {
        if let Some(qi) = by_qp_num.remove(&qp_key(*dev, qp_num)) {
            moved.push((qp_key(*dev - 1, qp_num), qi));
        }
        *dev -= 1;
    }
    by_qp_num.extend(moved);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{qp_key, shift_keys_down};

    /// Three devices numbering their QPs alike, the first removed: each qpair keeps its own
    /// key, whatever order the qpairs come in.
    #[test]
    fn keys_of_devices_after_a_removed_one_move_down_without_overwriting() {
        for order in [[0usize, 1, 2, 3], [3, 2, 1, 0], [2, 3, 0, 1]] {
            // Qpair i: (device, QP number). Device 0 (removed) has none left.
            let mut qps = [(1usize, 0x11u32), (2, 0x11), (2, 0x12), (1, 0x12)];
            let mut by_qp_num: HashMap<u64, usize> = qps
                .iter()
                .enumerate()
                .map(|(qi, &(dev, num))| (qp_key(dev, num), qi))
                .collect();
            let mut slots: Vec<Option<&mut (usize, u32)>> = qps.iter_mut().map(Some).collect();
            let in_order = order
                .iter()
                .map(|&i| slots[i].take().expect("each once"))
                .map(|q| (&mut q.0, q.1));
            shift_keys_down(&mut by_qp_num, in_order, 0);
            assert_eq!(qps, [(0, 0x11), (1, 0x11), (1, 0x12), (0, 0x12)]);
            assert_eq!(by_qp_num.len(), 4, "{order:?}");
            for (qi, &(dev, num)) in qps.iter().enumerate() {
                assert_eq!(by_qp_num.get(&qp_key(dev, num)), Some(&qi), "{order:?}");
            }
        }
    }
}

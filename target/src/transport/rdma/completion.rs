//! Work completions: what a RECV, SEND, READ or WRITE completion does to its request and
//! qpair. Everything here runs inside a reactor turn, on the hot path.

use nvmf_common::buffer::IoBuf;
use nvmf_common::rdma::{Verbs, VerbsCq, WcStatus, WorkCompletion};
use nvmf_common::spec::sgl::SglKind;
use nvmf_common::spec::Command;

use super::backlog::{Overrun, Waiting};
use super::device::DeviceResources;
use super::poll_group::{qp_key, RdmaPollGroup, POLL_BATCH};
use super::qpair::{release, wrs_of, Qpair, SlotAccounts};
use super::request::{parse_wr_id, HostData, RdmaRequest, State, WrKind, COVER_SLOT, DRAIN_SLOT};
use super::send_batch::deferred_released;
use super::wait_queue::Waiter;
use crate::core::driver;
use crate::core::CoreCtx;

impl<V: Verbs> RdmaPollGroup<V> {
    pub(super) fn poll_device(&mut self, d: usize, core: &mut CoreCtx) -> usize {
        let mut total = 0;
        loop {
            self.devices[d].stats.polls += 1;
            let n = match self.devices[d].cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.fail_device(
                        d,
                        &format!("polling the completion queue failed: {e}"),
                        core,
                    );
                    return total;
                }
            };
            let stats = &mut self.devices[d].stats;
            stats.completions += n as u64;
            if n == 0 && total == 0 {
                stats.idle_polls += 1;
            }
            for i in 0..n {
                let wc = self.wcs[i];
                self.on_completion(d, &wc, core);
            }
            total += n;
            if n < POLL_BATCH {
                return total;
            }
        }
    }

    fn on_completion(&mut self, d: usize, wc: &WorkCompletion, core: &mut CoreCtx) {
        let (kind, gen, qi, slot) = parse_wr_id(wc.wr_id());
        if kind == WrKind::Recv {
            return self.on_recv(d, slot, wc, core);
        }
        let Some(qp) = self.qpairs.get_mut(qi).and_then(Option::as_mut) else {
            return;
        };
        if qp.gen != gen {
            return;
        }
        let ok = wc.status().is_success();
        if !ok && wc.status() != WcStatus::WR_FLUSH_ERR && qp.closing.is_none() {
            tracing::warn!(status = wc.status().as_str(), ?kind, peer = %qp.state.peer, "work request failed; closing qpair");
        }
        // A READ gives back its credit, a SEND its send queue room: requests of this qpair
        // waiting for them go after it.
        let freed = match kind {
            // Unsignaled: only errors complete, and the SEND behind reports them too.
            WrKind::Write | WrKind::Recv => false,
            WrKind::Send => {
                qp.signaled = qp.signaled.saturating_sub(1);
                if slot == DRAIN_SLOT {
                    qp.sq_used = qp.sq_used.saturating_sub(1);
                    qp.drained = true;
                } else if let Some((covers, mut wrs, mut latency)) =
                    signaled_done(qp, slot, self.now_ns)
                {
                    // Completions come in order: the unsignaled ones before it are done.
                    let mut refund = 0;
                    for _ in 0..covers {
                        let Some(s) = qp.unsignaled.pop_front() else {
                            break;
                        };
                        let r = &mut qp.requests[s as usize];
                        if r.state == State::Sending {
                            let (w, l) = sent(r, &mut qp.acct, self.now_ns);
                            wrs += w;
                            latency += l;
                        } else if r.state == State::Sent {
                            // Deferred: its latency was counted when it was posted.
                            refund += deferred_released(r);
                            let (w, _) = sent(r, &mut qp.acct, self.now_ns);
                            wrs += w;
                        }
                    }
                    qp.sq_used = qp.sq_used.saturating_sub(wrs);
                    let dev = &mut self.devices[d];
                    dev.stats.request_latency += latency;
                    dev.defer_budget += refund;
                    let share = &self.devices[d].share;
                    qp.acct.unpark(share, qi, qp.gen, &mut self.need_buffer);
                }
                !qp.awaiting_read.is_empty()
            }
            WrKind::Read => {
                qp.signaled = qp.signaled.saturating_sub(1);
                qp.sq_used = qp.sq_used.saturating_sub(1);
                qp.reads_in_flight = qp.reads_in_flight.saturating_sub(1);
                let id = Waiter {
                    qpair: qi,
                    gen,
                    slot,
                };
                let waiting = !qp.awaiting_read.is_empty();
                driver::data_arrived(self, core, id, ok);
                waiting
            }
        };
        if !ok {
            return self.start_close(qi, core);
        }
        if freed {
            self.serve_reads(qi, core);
        }
        // A SEND's completion frees slots: commands that came before it wait for them.
        if kind == WrKind::Send
            && self.qpairs[qi]
                .as_ref()
                .is_some_and(|q| !q.backlog.is_empty())
        {
            self.serve_backlog(qi, core);
        }
    }

    fn on_recv(&mut self, d: usize, recv: u32, wc: &WorkCompletion, core: &mut CoreCtx) {
        let dev = &mut self.devices[d];
        dev.received();
        // The slot goes back on the SRQ at the end of this turn: with this capsule buffer if
        // the command leaves it (`return_capsule`), else with a fresh one.
        dev.repost(recv);
        let capsule = dev.take_capsule(recv);
        let qi = self.by_qp_num.get(&qp_key(d, wc.qp_num())).copied();
        let usable = wc.status().is_success()
            && qi.is_some_and(|qi| {
                self.qpairs[qi]
                    .as_ref()
                    .is_some_and(|q| q.closing.is_none())
            });
        let Some(qi) = qi.filter(|_| usable) else {
            self.devices[d].return_capsule(recv, capsule);
            return;
        };
        let len = wc.byte_len();
        let qp = self.qpairs[qi].as_mut().expect("checked above");
        let admitted = if len >= 64 {
            qp.backlog.arrived()
        } else {
            Err(Overrun::Short(len))
        };
        if let Err(why) = admitted {
            // A capsule shorter than an SQE, or more commands unanswered than the queue
            // depth the host asked for: the host broke the protocol; drop the connection,
            // not the target.
            tracing::warn!(peer = %qp.state.peer, ?why, "malformed capsule or queue overrun; closing qpair");
            self.devices[d].return_capsule(recv, capsule);
            return self.start_close(qi, core);
        }
        let free = if qp.backlog.is_empty() {
            qp.acct.free.pop()
        } else {
            None
        };
        let cmd = self.devices[d].command(recv);
        let now = self.now_ns;
        match free {
            Some(si) => self.begin(d, qi, si, &cmd, len, capsule, now, Some(recv), core),
            // Every slot is taken, though the host is within its queue: our completions
            // for responses it has seen are late. The command waits for the next free slot
            // (`backlog`), behind any older one.
            None => {
                // The SQE is copied out: only in-capsule data keeps the capsule buffer. Any
                // other command gives it back to its receive slot now, or a host could take
                // every capsule buffer (and so every host's receives) with commands its
                // stalled responses leave waiting.
                let dev = &mut self.devices[d];
                let in_capsule = matches!(cmd.dptr.classify(), SglKind::InCapsule { .. });
                let room = dev.backlog_capsules < dev.backlog_capsule_cap;
                let capsule = if in_capsule && capsule.is_some() && room {
                    dev.backlog_capsules += 1;
                    capsule
                } else {
                    // Without its capsule an in-capsule command fails Command Interrupted
                    // when it starts (`fetch_data`).
                    dev.return_capsule(recv, capsule);
                    None
                };
                let qp = self.qpairs[qi].as_mut().expect("checked above");
                qp.backlog.wait(Waiting {
                    cmd,
                    len,
                    capsule,
                    received_ns: now,
                });
                self.devices[d].stats.pending_free_request += 1;
            }
        }
    }

    /// Slots of qpair `qi` freed: commands waiting for one take them, oldest first.
    #[cold]
    #[inline(never)]
    pub(super) fn serve_backlog(&mut self, qi: usize, core: &mut CoreCtx) {
        loop {
            let Some(qp) = self.qpairs[qi].as_mut().filter(|q| q.closing.is_none()) else {
                return;
            };
            if qp.backlog.is_empty() {
                return;
            }
            let Some(si) = qp.acct.free.pop() else {
                return;
            };
            let w = qp.backlog.next().expect("not empty");
            let d = qp.dev;
            if w.capsule.is_some() {
                self.devices[d].backlog_capsules -= 1;
            }
            self.begin(
                d,
                qi,
                si,
                &w.cmd,
                w.len,
                w.capsule,
                w.received_ns,
                None,
                core,
            );
        }
    }

    /// Starts command `cmd` of qpair `qi` in free slot `si`: it carried `len` bytes (the SQE
    /// included) and arrived at `received_ns`, its in-capsule data (if any) in `capsule`.
    /// `recv`: the receive slot it arrived in, if that slot is not posted again yet, where a
    /// capsule buffer it does not need goes back; a command that waited gives it back to the
    /// pool instead. Inlined, with the command's parts apart: on the receive path, building
    /// and moving a `Waiting` cost 35 instructions per command (callgrind).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn begin(
        &mut self,
        d: usize,
        qi: usize,
        si: u32,
        cmd: &Command,
        len: u32,
        capsule: Option<IoBuf>,
        received_ns: u64,
        recv: Option<u32>,
        core: &mut CoreCtx,
    ) {
        let give_back = |dev: &mut DeviceResources<V>, capsule: Option<IoBuf>| {
            if let Some(recv) = recv {
                dev.return_capsule(recv, capsule);
            }
        };
        let dev = &mut self.devices[d];
        dev.stats.requests += 1;
        let qp = self.qpairs[qi].as_mut().expect("a live qpair");
        let r = &mut qp.requests[si as usize];
        debug_assert_eq!(r.state, State::Free);
        r.received_ns = received_ns;
        r.req.reset(*cmd);
        r.received_data = len - 64;
        r.host = match cmd.dptr.classify() {
            SglKind::Keyed {
                addr,
                key,
                invalidate,
                ..
            } => HostData::Keyed {
                addr,
                key,
                invalidate,
            },
            SglKind::InCapsule { offset, len } => HostData::InCapsule {
                offset: offset as u32,
                len,
            },
            _ => HostData::None,
        };
        // In-capsule data stays in its capsule buffer until the request has a data buffer
        // (or executes from the capsule buffer itself); any other capsule goes back to its
        // receive slot now.
        if matches!(r.host, HostData::InCapsule { .. }) {
            r.capsule = capsule;
        } else {
            give_back(dev, capsule);
        }
        let id = Waiter {
            qpair: qi,
            gen: qp.gen,
            slot: si,
        };
        driver::start(self, core, id);
        // Only a request still waiting for a data buffer needs its capsule's data. One that
        // was refused, needs no data, or has its data copied gives the capsule back to its
        // receive slot now, not when its response completes: a host that takes no responses
        // must not hold the device's capsule buffers (every host's receives) with commands
        // it sent in-capsule data for.
        if let Some(qp) = self.qpairs[qi].as_mut() {
            let r = &mut qp.requests[si as usize];
            if r.state != State::NeedBuffer {
                if let Some(capsule) = r.capsule.take() {
                    give_back(&mut self.devices[d], Some(capsule));
                }
            }
        }
    }
}

/// A signaled SEND (or a cover) of the qpair completed: what it frees itself, as (the
/// unsignaled ones before it that it covers, send queue slots, latency ns). `None` for a
/// completion that frees nothing (a request already released).
#[inline]
fn signaled_done<V: Verbs>(qp: &mut Qpair<V>, slot: u32, now_ns: u64) -> Option<(u32, u32, u64)> {
    if slot == COVER_SLOT {
        return qp.cover.take().map(|c| (c.covers, 1, 0));
    }
    let r = qp.requests.get_mut(slot as usize)?;
    if r.state != State::Sending {
        return None;
    }
    let covers = u32::from(std::mem::take(&mut r.covers));
    let (wrs, latency) = sent(r, &mut qp.acct, now_ns);
    Some((covers, wrs, latency))
}

/// A `Sending` request whose SEND is known complete: released. Returns the send queue slots
/// its work requests held and its latency (capsule to now, ns).
#[inline]
fn sent(r: &mut RdmaRequest, acct: &mut SlotAccounts, now_ns: u64) -> (u32, u64) {
    let wrs = wrs_of(r);
    let latency = now_ns.saturating_sub(r.received_ns);
    release(acct, r);
    (wrs, latency)
}

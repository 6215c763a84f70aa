//! A broken connection: the teardown that settles every outstanding command (kept for the
//! reconnect, handed back in failover mode, or failed), and the reconnect of the queue once
//! its controller is live again.

use std::sync::atomic::Ordering;
use std::time::Duration;

use nvmf_common::rdma::Verbs;

use crate::controller::{STATE_LIVE, STATE_RESETTING};
use crate::error::QueueFault;

use super::connect::connect_queue;
use super::{Io, IoCompletion, IoQpair, IoStatus, QpairState, MAX_RETRIES, TIMEOUT_SCAN};

pub(super) enum Teardown {
    Fault(QueueFault),
    Timeout(u16),
    ControllerReset,
}

impl<V: Verbs> IoQpair<V> {
    /// Ends the connection and settles every outstanding command.
    pub(super) fn teardown(&mut self, why: Teardown, out: &mut Vec<IoCompletion>) {
        // Disconnecting moves the QP to the error state: from here on the target cannot reach
        // the buffers we are about to hand back. Dropping it destroys the QP.
        if let Some(mut q) = self.queue.take() {
            q.disconnect(Duration::ZERO);
            self.stats.add_keys(q.key_stats());
        }
        let reason = match &why {
            Teardown::Fault(f) => format!("queue {} to {}: {f}", self.qid, self.shared.peer),
            Teardown::Timeout(cid) => format!(
                "queue {} to {}: command {cid} timed out after {:?}",
                self.qid, self.shared.peer, self.shared.opts.io_timeout
            ),
            Teardown::ControllerReset => format!("queue {}: controller reset", self.qid),
        };
        if !matches!(why, Teardown::ControllerReset) {
            tracing::warn!("{reason}");
            self.shared.reset_requested.store(true, Ordering::Release);
        }
        let reconnect =
            self.shared.opts.reconnect.is_some() && self.shared.state() <= STATE_RESETTING;
        // In failover mode the commands go back to the multipath layer; the queue itself
        // still reconnects.
        let retry = reconnect && !self.failover;
        let timed_out = match why {
            Teardown::Timeout(cid) => Some(usize::from(cid)),
            _ => None,
        };
        // Outstanding commands go to the front of the requeue, oldest first, ahead of what
        // was waiting for a slot.
        let mut sent: Vec<(usize, Io)> = Vec::new();
        for (cid, slot) in self.ios.iter_mut().enumerate() {
            if let Some(io) = slot.take() {
                sent.push((cid, io));
            }
        }
        sent.sort_by_key(|(_, io)| std::cmp::Reverse(io.submitted));
        for (cid, mut io) in sent {
            if Some(cid) == timed_out {
                self.stats.timeouts += 1;
                if retry && io.retries < MAX_RETRIES {
                    // As Linux: the association is reset and the command retried on the
                    // new one, a bounded number of times.
                    io.retries += 1;
                    self.stats.requeued += 1;
                    self.requeue.push_front(io);
                } else {
                    out.push(complete(io, IoStatus::Timeout));
                }
            } else if retry && io.retries < MAX_RETRIES {
                // Every command outstanding at a break counts a retry (as Linux's
                // host-aborted commands do): one that breaks the queue each time it is sent
                // would otherwise go round the reconnects for ever.
                io.retries += 1;
                self.stats.requeued += 1;
                self.requeue.push_front(io);
            } else if reconnect {
                out.push(complete(io, IoStatus::PathError));
            } else {
                out.push(complete(io, IoStatus::TransportError));
            }
        }
        if reconnect && self.failover {
            for io in self.requeue.drain(..) {
                out.push(complete(io, IoStatus::PathError));
            }
            self.state = QpairState::Reconnecting;
        } else if retry {
            self.state = QpairState::Reconnecting;
        } else {
            for io in self.requeue.drain(..) {
                out.push(complete(io, IoStatus::TransportError));
            }
            self.failure = Some(reason);
            self.state = QpairState::Failed;
        }
    }

    pub(super) fn poll_down(&mut self, out: &mut Vec<IoCompletion>) {
        let state = self.shared.state();
        if state > STATE_RESETTING {
            for io in self.requeue.drain(..) {
                out.push(complete(io, IoStatus::ControllerLost));
            }
            self.failure = Some(self.shared.failure());
            self.state = QpairState::Failed;
            return;
        }
        let gen = self.shared.generation.load(Ordering::Acquire);
        if state != STATE_LIVE || gen == self.gen {
            // The admin side has not reconnected yet (or not noticed our request).
            return;
        }
        self.gen = gen;
        match connect_queue(&self.shared, self.qid, self.depth) {
            Ok(q) => {
                tracing::info!(
                    qid = self.qid,
                    "I/O queue reconnected; resubmitting {} commands",
                    self.requeue.len()
                );
                self.queue = Some(q);
                self.in_capsule = self.shared.in_capsule.load(Ordering::Relaxed);
                self.max_xfer = self.shared.max_xfer.load(Ordering::Relaxed);
                self.state = QpairState::Live;
                self.stats.reconnects += 1;
                self.next_scan = self.shared.verbs.now() + TIMEOUT_SCAN;
                let now = self.shared.verbs.now();
                for io in self.requeue.iter_mut() {
                    // The timeout runs from the resubmission.
                    io.submitted = now;
                }
                while let Some(io) = self.requeue.pop_front() {
                    if let Err(io) = self.post(io) {
                        self.requeue.push_front(io);
                        break;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(qid = self.qid, "I/O queue reconnect failed: {e}");
                self.shared.reset_requested.store(true, Ordering::Release);
            }
        }
    }
}

fn complete(io: Io, status: IoStatus) -> IoCompletion {
    IoCompletion {
        tag: io.tag,
        status,
        dw0: 0,
        buf: io.buf,
    }
}

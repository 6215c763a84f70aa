//! Failure and reconnect: tearing the association down, re-establishing the admin queue
//! every `delay` until `ctrl_loss_tmo` (see "Reconnect" in the [`controller`](super) docs).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use nvmf_common::rdma::{Verbs, VerbsContext, VerbsPd};

use crate::error::Error;

use super::admin::bring_up;
use super::poll_admin::ControllerEvent;
use super::shared::{STATE_FAILED, STATE_LIVE, STATE_RESETTING};
use super::Controller;

impl<V: Verbs> Controller<V> {
    fn fail(&mut self, reason: String) {
        tracing::error!("controller {} lost: {reason}", self.shared.peer);
        *self
            .shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.state.store(STATE_FAILED, Ordering::Release);
    }

    /// Tears the association down after a failure; schedules a reconnect or fails.
    pub(super) fn start_reset(&mut self, reason: String) {
        if let Some(mut admin) = self.admin.take() {
            admin.disconnect(Duration::ZERO);
        }
        if self.shared.opts.reconnect.is_none() {
            self.fail(reason);
            return;
        }
        let delay = self
            .shared
            .opts
            .reconnect
            .map_or(Duration::ZERO, |r| r.delay);
        tracing::warn!(
            "controller {}: {reason}; reconnecting every {delay:?}",
            self.shared.peer
        );
        let now = self.shared.verbs.now();
        self.live_since = None;
        self.lost_at.get_or_insert(now);
        self.next_attempt = now + delay;
        self.shared.state.store(STATE_RESETTING, Ordering::Release);
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.events.push(ControllerEvent::Disconnected { reason });
    }

    /// After a reconnect, once the association has stayed live without an I/O queue asking
    /// for a reset for long enough that every I/O queue has had its chance to reconnect (a
    /// reconnect delay, at least a second, plus four connect timeouts: the address, route,
    /// connection and Connect command each wait up to one): the loss is over, and the next
    /// one gets a full ctrl_loss_tmo.
    pub(super) fn settle_reconnect(&mut self) {
        let (Some(since), Some(policy)) = (self.live_since, self.shared.opts.reconnect) else {
            return;
        };
        let settle =
            policy.delay.max(Duration::from_secs(1)) + 4 * self.shared.opts.connect_timeout;
        if self.shared.verbs.now().saturating_duration_since(since) >= settle {
            self.live_since = None;
            self.lost_at = None;
        }
    }

    pub(super) fn try_reconnect(&mut self) {
        let Some(policy) = self.shared.opts.reconnect else {
            return;
        };
        let now = self.shared.verbs.now();
        let lost = self
            .lost_at
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        if policy.ctrl_loss_tmo.is_some_and(|tmo| lost >= tmo) {
            self.fail(format!(
                "not reconnected within ctrl_loss_tmo ({:?})",
                policy.ctrl_loss_tmo.unwrap_or_default()
            ));
            return;
        }
        let s = Arc::clone(&self.shared);
        if let Some(name) = device_gone::<V>(&s.pd) {
            self.fail(format!(
                "its RDMA device {name} was removed: the buffers registered on it cannot move \
                 to another, so the controller is given up at once (its resources go with it, \
                 which the device's removal waits for)"
            ));
            return;
        }
        match bring_up(&s.verbs, s.peer, &s.tid, &s.host, &s.opts, Some(&s.pd)) {
            Ok((admin, _, info)) => {
                self.admin = Some(admin);
                let cntlid = info.cntlid;
                let used = self.next_qid - 1;
                let result = self.set_queue_count(used.max(1)).and_then(|granted| {
                    if granted < used {
                        return Err(Error::Invalid(format!(
                            "the controller now grants {granted} I/O queues, {used} are in use"
                        )));
                    }
                    Ok(granted)
                });
                self.info = info;
                self.shared.in_capsule.store(
                    if s.opts.in_capsule_data {
                        self.info.in_capsule_size()
                    } else {
                        0
                    },
                    Ordering::Relaxed,
                );
                self.shared
                    .max_xfer
                    .store(self.info.max_transfer(), Ordering::Relaxed);
                let result = result.and_then(|_| self.enable_async_events());
                if let Err(e) = result {
                    tracing::warn!("reconnect to {}: {e}", s.peer);
                    if let Some(mut a) = self.admin.take() {
                        a.disconnect(Duration::ZERO);
                    }
                    self.next_attempt = s.verbs.now() + policy.delay;
                    return;
                }
                s.cntlid.store(cntlid, Ordering::Release);
                // `lost_at` stays until the association has held (`settle_reconnect`): one
                // whose I/O queues fail to reconnect, and reset it, must not restart the
                // ctrl_loss_tmo clock each time.
                self.live_since = Some(s.verbs.now());
                s.state.store(STATE_LIVE, Ordering::Release);
                tracing::info!(
                    "controller {} reconnected after {lost:?}, cntlid {cntlid}",
                    s.peer
                );
                self.events.push(ControllerEvent::Reconnected { cntlid });
            }
            Err(e) => {
                tracing::warn!(
                    "reconnect to {} failed: {e}; next attempt in {:?}",
                    s.peer,
                    policy.delay
                );
                self.next_attempt = s.verbs.now() + policy.delay;
            }
        }
    }
}

/// The name of `pd`'s device if the provider lists it no more (a device that comes back is
/// a new one: the PD, and every registration on it, stay dead).
fn device_gone<V: Verbs>(pd: &Arc<V::Pd>) -> Option<String> {
    let ctx = pd.context();
    (ctx.still_present() == Some(false)).then(|| ctx.device_name())
}

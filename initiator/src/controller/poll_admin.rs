//! [`Controller::poll_admin`]: keep-alive, asynchronous event completions and failure
//! detection on a live association, and the [`ControllerEvent`]s they produce.

use std::sync::atomic::Ordering;

use nvmf_common::rdma::Verbs;
use nvmf_common::spec::features::parse_async_event_dw0;
use nvmf_common::spec::{AsyncEventType, AsyncNotice, LogPageId};

use crate::error::{Error, Result};
use crate::multipath::AnaLog;

use super::shared::{STATE_DELETED, STATE_FAILED, STATE_LIVE, STATE_RESETTING};
use super::Controller;

/// What the application hears from [`Controller::poll_admin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerEvent {
    /// A Namespace Attribute Changed notice, with the Changed Namespace List (an entry of
    /// 0xFFFFFFFF means more than 1024 changed).
    NamespaceChanged { nsids: Vec<u32> },
    /// An Asymmetric Namespace Access Change notice, with the ANA log page read for it
    /// (reading it re-arms the event). `None` when the log could not be read or parsed.
    AnaChanged { log: Option<AnaLog> },
    /// Any other asynchronous event (its log page was read to re-arm it).
    AsyncEvent {
        ty: AsyncEventType,
        info: u8,
        lid: LogPageId,
    },
    /// The association broke; reconnect attempts follow.
    Disconnected { reason: String },
    /// A new association is live (new CNTLID); I/O qpairs reconnect on their threads.
    Reconnected { cntlid: u16 },
}

impl<V: Verbs> Controller<V> {
    /// Keeps the association alive: keep-alive, AER completions, failure detection, and the
    /// reconnect attempts. Call it every few milliseconds (well under KATO / 2) from the
    /// thread that owns the controller. Returns the events since the last call; an error once
    /// the controller is lost for good.
    pub fn poll_admin(&mut self) -> Result<Vec<ControllerEvent>> {
        match self.shared.state() {
            STATE_LIVE => {
                let result = self.pump_live();
                let reset = self.shared.reset_requested.swap(false, Ordering::AcqRel);
                if let Err(e) = result {
                    self.start_reset(e.to_string());
                } else if reset {
                    self.start_reset("an I/O queue failed".into());
                } else {
                    self.settle_reconnect();
                }
            }
            STATE_RESETTING => {
                self.shared.reset_requested.store(false, Ordering::Relaxed);
                if self.shared.verbs.now() >= self.next_attempt {
                    self.try_reconnect();
                }
            }
            _ => {}
        }
        let events = std::mem::take(&mut self.events);
        match self.shared.state() {
            STATE_FAILED | STATE_DELETED if events.is_empty() => {
                Err(Error::ControllerLost(self.shared.failure()))
            }
            _ => Ok(events),
        }
    }

    /// Whether the association is live (not reconnecting, not lost).
    pub fn is_live(&self) -> bool {
        self.shared.state() == STATE_LIVE
    }

    pub(super) fn pump_live(&mut self) -> Result<()> {
        let admin = self.admin()?;
        admin.pump()?;
        let done = std::mem::take(&mut admin.aer_done);
        for cqe in done {
            self.on_async_event(cqe.dw0.get())?;
        }
        Ok(())
    }

    fn on_async_event(&mut self, dw0: u32) -> Result<()> {
        let (ty, info, lid) = parse_async_event_dw0(dw0);
        let max = self.max_transfer();
        let admin = self.admin()?;
        if ty == AsyncEventType::NOTICE && info == AsyncNotice::NAMESPACE_ATTRIBUTE_CHANGED.0 {
            // Reading the Changed Namespace List clears the event, so it can fire again.
            let read = admin.get_log(
                0xFFFF_FFFF,
                LogPageId::CHANGED_NAMESPACE_LIST,
                4096,
                max,
                "Get Log Page Changed Namespace List",
            );
            let nsids = match read {
                Ok(raw) => raw
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .take_while(|&id| id != 0)
                    .collect(),
                // The target refused the page: every namespace may have changed (as the
                // list's own overflow entry says), which is no reason to drop the
                // association. A timeout or fault still resets it.
                Err(Error::Command { status, .. }) => {
                    tracing::warn!(%status, "reading the Changed Namespace List failed; rescan all");
                    vec![0xFFFF_FFFF]
                }
                Err(e) => return Err(e),
            };
            tracing::info!(?nsids, "namespace attributes changed");
            self.events
                .push(ControllerEvent::NamespaceChanged { nsids });
        } else if ty == AsyncEventType::NOTICE && info == AsyncNotice::ANA_CHANGE.0 {
            let log = match self.ana_log() {
                Ok(log) => Some(log),
                Err(e) => {
                    tracing::warn!("reading the ANA log page for an ANA change notice: {e}");
                    None
                }
            };
            self.events.push(ControllerEvent::AnaChanged { log });
        } else {
            if lid.0 != 0 {
                if let Err(e) =
                    admin.get_log(0xFFFF_FFFF, lid, 512, max, "Get Log Page (async event)")
                {
                    tracing::warn!("reading log page {lid:?} for an async event failed: {e}");
                }
            }
            self.events
                .push(ControllerEvent::AsyncEvent { ty, info, lid });
        }
        self.admin()?.submit_aer();
        Ok(())
    }
}

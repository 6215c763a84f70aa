//! A controller association: the admin queue with its bring-up (in the Linux host's order),
//! keep-alive, asynchronous events, reconnect, and the I/O queue pairs it hands out.
//!
//! # Threads
//!
//! The [`Controller`] lives on one thread, which calls [`Controller::poll_admin`] every few
//! milliseconds (keep-alive, AER completions, reconnect). Each [`IoQpair`] moves to its own
//! polling thread. They share a small block of atomics (state, generation, CNTLID): an I/O
//! qpair that sees the generation change tears its connection down and, once the admin side
//! is live again, reconnects on its own thread. A broken I/O qpair asks the admin side for a
//! controller reset through the same block. No lock is taken on the I/O path.
//!
//! # Reconnect
//!
//! As the Linux host's `--reconnect-delay` / `--ctrl-loss-tmo`: after a failure (a queue
//! error, a disconnect, a command or keep-alive timeout) every queue is torn down; the admin
//! queue is re-established every `delay` until `ctrl_loss_tmo` has passed since the loss, then
//! the controller fails for good. Outstanding I/O is kept and resubmitted after the reconnect
//! (a command that timed out is retried too, at most [`MAX_RETRIES`] times, then fails with
//! [`IoStatus::Timeout`]). Without [`Reconnect`] the first failure is final and outstanding
//! I/O fails at once. A controller whose own RDMA device was removed fails at its first
//! attempt: its PD and every buffer registered on it belong to that device, which comes back,
//! if at all, as a new one, and the removal waits until they are freed.
//!
//! # Verbs provider
//!
//! A controller and its qpairs are generic over the verbs provider `V` ([`Verbs`]), with the
//! real verbs ([`RealVerbs`]) as the default: [`Controller::connect`] and
//! [`Controller::connect_with_pd`] connect over them, [`Controller::connect_with`] and
//! [`Controller::connect_with_pd_using`] over any provider. Every deadline, timeout,
//! keep-alive, reconnect delay and idle wait is on the provider's clock ([`Verbs::now`],
//! [`Verbs::sleep`]), so a simulated fabric can run them in virtual time. Memory windows
//! are the provider's too ([`Verbs::alloc_mw`]): used wherever the device reports type 2
//! windows (see [`MemoryWindows`]).
//!
//! [`MAX_RETRIES`]: crate::qpair::MAX_RETRIES

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_common::buffer::BufferPool;
use nvmf_common::rdma::{register_pool, AccessFlags, ProtectionDomain, RealVerbs, Verbs};
use nvmf_common::spec::features::{NumberOfQueues, AEC_ANA_CHANGE, AEC_NAMESPACE_ATTRIBUTE};
use nvmf_common::spec::{Command, Completion, FeatureId, IdentifyController, LogPageId};

use crate::address::TransportId;
use crate::error::{Error, Result};
use crate::host::HostIdentity;
use crate::qpair::{IoQpair, IoStatus};

mod admin;
mod info;
mod namespaces;
mod options;
mod poll_admin;
mod reconnect;
mod shared;

pub(crate) use admin::connect_error;
use admin::{bring_up, shutdown, Admin, AdminData};
pub use info::ControllerInfo;
pub use namespaces::NamespaceInfo;
pub use options::{ControllerOptions, MemoryWindows, Reconnect};
pub use poll_admin::ControllerEvent;
pub(crate) use shared::{Shared, STATE_DELETED, STATE_FAILED, STATE_LIVE, STATE_RESETTING};

/// Admin queue entries, as Linux (`NVME_AQ_DEPTH`).
pub const ADMIN_QUEUE_DEPTH: u16 = 32;
/// Bytes of the admin queue's registered data buffer; longer transfers are split.
const ADMIN_DATA_LEN: usize = 64 * 1024;

/// A connected NVMe-oF controller, over the verbs provider `V` (the real verbs by default).
pub struct Controller<V: Verbs = RealVerbs> {
    shared: Arc<Shared<V>>,
    admin: Option<Admin<V>>,
    info: ControllerInfo,
    granted_io_queues: u16,
    next_qid: u16,
    io_qpairs: Vec<IoQpair<V>>,
    lost_at: Option<Instant>,
    /// When the last reconnect made the association live, until it has held.
    live_since: Option<Instant>,
    next_attempt: Instant,
    events: Vec<ControllerEvent>,
}

impl Controller<RealVerbs> {
    /// Connects to the subsystem `tid` names: RDMA CM, admin bring-up, Set Features Number of
    /// Queues, `opts.io_queues` I/O queue pairs, then Set Features Async Event Configuration
    /// and one AER, in the Linux host's order. A discovery NQN gives a discovery controller
    /// (no I/O queues, no keep-alive, no AER).
    pub fn connect(tid: &TransportId, opts: ControllerOptions) -> Result<Self> {
        Self::connect_with(RealVerbs, tid, opts)
    }

    /// [`connect`](Self::connect) on the protection domain of another controller, so one
    /// buffer pool registration serves both (the paths of a multipath namespace). Fails
    /// when the route to `tid` goes through another RDMA device.
    pub fn connect_with_pd(
        tid: &TransportId,
        opts: ControllerOptions,
        pd: &Arc<ProtectionDomain>,
    ) -> Result<Self> {
        Self::connect_with_pd_using(RealVerbs, tid, opts, pd)
    }
}

impl<V: Verbs> Controller<V> {
    /// [`connect`](Controller::connect) over the verbs provider `verbs`.
    pub fn connect_with(verbs: V, tid: &TransportId, opts: ControllerOptions) -> Result<Self> {
        Self::connect_on(verbs, tid, opts, None)
    }

    /// [`connect_with_pd`](Controller::connect_with_pd) over the verbs provider `verbs`:
    /// on `pd`, the protection domain of another controller of the same provider.
    pub fn connect_with_pd_using(
        verbs: V,
        tid: &TransportId,
        opts: ControllerOptions,
        pd: &Arc<V::Pd>,
    ) -> Result<Self> {
        Self::connect_on(verbs, tid, opts, Some(pd))
    }

    fn connect_on(
        verbs: V,
        tid: &TransportId,
        opts: ControllerOptions,
        pd: Option<&Arc<V::Pd>>,
    ) -> Result<Self> {
        let peer = tid.socket_addr()?;
        let host = HostIdentity::resolve(
            tid.hostnqn.as_deref().or(opts.hostnqn.as_deref()),
            opts.hostid,
        );
        let (admin, pd, info) = bring_up(&verbs, peer, tid, &host, &opts, pd)?;
        let next_attempt = verbs.now();
        let shared = Arc::new(Shared {
            peer,
            tid: tid.clone(),
            host,
            pd: pd.clone(),
            state: AtomicU8::new(STATE_LIVE),
            generation: AtomicU64::new(0),
            cntlid: AtomicU16::new(info.cntlid),
            reset_requested: AtomicBool::new(false),
            in_capsule: AtomicU32::new(if opts.in_capsule_data {
                info.in_capsule_size()
            } else {
                0
            }),
            max_xfer: AtomicU32::new(info.max_transfer()),
            max_io_depth: AtomicU32::new(u32::from(info.cap.mqes()) + 1),
            windows: opts.memory_windows.enabled::<V>(&pd),
            failure: Mutex::new(None),
            opts,
            verbs,
        });
        let mut ctrl = Self {
            shared,
            admin: Some(admin),
            info,
            granted_io_queues: 0,
            next_qid: 1,
            io_qpairs: Vec::new(),
            lost_at: None,
            live_since: None,
            next_attempt,
            events: Vec::new(),
        };
        if !ctrl.is_discovery() {
            let o = &ctrl.shared.opts;
            let want = o.io_queues.max(o.io_queues_requested).max(1);
            ctrl.granted_io_queues = ctrl.set_queue_count(want)?;
            for _ in 0..ctrl.shared.opts.io_queues {
                let depth = ctrl.shared.opts.io_queue_depth;
                let qp = ctrl.create_io_qpair(depth)?;
                ctrl.io_qpairs.push(qp);
            }
            ctrl.enable_async_events()?;
        }
        Ok(ctrl)
    }

    fn admin(&mut self) -> Result<&mut Admin<V>> {
        let failure =
            || Error::ControllerLost("the admin queue is not connected (reconnecting)".into());
        self.admin.as_mut().ok_or_else(failure)
    }

    fn set_queue_count(&mut self, want: u16) -> Result<u16> {
        let nq = NumberOfQueues {
            nsq: u32::from(want),
            ncq: u32::from(want),
        };
        let cmd = Command::set_features(0, FeatureId::NUMBER_OF_QUEUES, nq.to_dword(), false);
        let rsp = self
            .admin()?
            .ok(cmd, AdminData::None, "Set Features Number of Queues")?;
        let got = NumberOfQueues::from_dword(rsp.dw0.get());
        let granted = got.nsq.min(got.ncq).min(u32::from(u16::MAX)) as u16;
        if granted < want {
            tracing::warn!(
                want,
                granted,
                "the controller grants fewer I/O queues than asked for"
            );
        }
        Ok(granted)
    }

    /// Set Features Async Event Configuration (namespace attribute and ANA change notices,
    /// those the controller has) and one outstanding AER.
    fn enable_async_events(&mut self) -> Result<()> {
        let aec = self.info.identify.oaes.get() & (AEC_NAMESPACE_ATTRIBUTE | AEC_ANA_CHANGE);
        if aec != 0 {
            let cmd = Command::set_features(0, FeatureId::ASYNC_EVENT_CONFIGURATION, aec, false);
            self.admin()?.ok(
                cmd,
                AdminData::None,
                "Set Features Async Event Configuration",
            )?;
        }
        self.admin()?.submit_aer();
        Ok(())
    }

    pub fn is_discovery(&self) -> bool {
        self.shared.tid.is_discovery()
    }

    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    pub fn identify(&self) -> &IdentifyController {
        &self.info.identify
    }

    pub fn transport_id(&self) -> &TransportId {
        &self.shared.tid
    }

    pub fn host(&self) -> &HostIdentity {
        &self.shared.host
    }

    pub fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    /// The verbs provider this controller runs over (its clock is the controller's).
    pub fn verbs(&self) -> &V {
        &self.shared.verbs
    }

    /// The protection domain every queue of this controller uses: register data buffer pools
    /// on it ([`register_pool`](Self::register_pool)).
    pub fn pd(&self) -> &Arc<V::Pd> {
        &self.shared.pd
    }

    /// Registers `pool` on this controller's PD, so its buffers can carry I/O data: for
    /// memory windows only (no remote access through the pool's own key) when commands get
    /// their own keys, else for remote read and write.
    pub fn register_pool(&self, pool: &BufferPool) -> Result<()> {
        let access = if self.shared.windows {
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
        } else {
            AccessFlags::ALL_DATA
        };
        register_pool::<V>(&self.shared.pd, pool, access)
            .map_err(|e| Error::rdma("registering the buffer pool (raise `ulimit -l`?)", e))
    }

    /// Whether I/O commands carry per-command memory-window keys
    /// ([`ControllerOptions::memory_windows`] and the device).
    pub fn uses_memory_windows(&self) -> bool {
        self.shared.windows
    }

    /// In-capsule data bytes I/O queues use for writes (0: keyed SGLs only).
    pub fn in_capsule_size(&self) -> u32 {
        self.shared.in_capsule.load(Ordering::Relaxed)
    }

    pub fn max_transfer(&self) -> u32 {
        self.shared.max_xfer.load(Ordering::Relaxed)
    }

    /// I/O queues the controller granted.
    pub fn granted_io_queues(&self) -> u16 {
        self.granted_io_queues
    }

    /// The I/O queue pairs [`connect`](Self::connect) created.
    pub fn take_io_qpairs(&mut self) -> Vec<IoQpair<V>> {
        std::mem::take(&mut self.io_qpairs)
    }

    /// Connects one more I/O queue pair (the next QID) of `depth` entries (capped by
    /// CAP.MQES + 1).
    pub fn create_io_qpair(&mut self, depth: u16) -> Result<IoQpair<V>> {
        if self.is_discovery() {
            return Err(Error::Invalid(
                "a discovery controller has no I/O queues".into(),
            ));
        }
        if self.next_qid > self.granted_io_queues {
            return Err(Error::Invalid(format!(
                "the controller granted {} I/O queues, all in use",
                self.granted_io_queues
            )));
        }
        let max = self
            .shared
            .max_io_depth
            .load(Ordering::Relaxed)
            .min(u32::from(u16::MAX)) as u16;
        let depth = depth.clamp(2, max.max(2));
        // Connecting a queue takes a while (seconds under emulation); applications often
        // create hundreds before their first poll_admin, so keep the association alive
        // here too.
        if self.is_live() {
            self.pump_live()?;
        }
        let qid = self.next_qid;
        let qp = IoQpair::connect(Arc::clone(&self.shared), qid, depth)?;
        self.next_qid += 1;
        Ok(qp)
    }

    /// Runs an admin command with data from the controller (`data_len` bytes, returned).
    pub fn admin_read(
        &mut self,
        cmd: Command,
        data_len: usize,
        what: &str,
    ) -> Result<(Completion, Vec<u8>)> {
        if data_len > ADMIN_DATA_LEN {
            return Err(Error::Invalid(format!(
                "{what}: {data_len} bytes is above {ADMIN_DATA_LEN}"
            )));
        }
        let admin = self.admin()?;
        let rsp = admin.ok(cmd, AdminData::In(data_len), what)?;
        let mut out = vec![0u8; data_len];
        admin.read_data(&mut out);
        Ok((rsp, out))
    }

    /// Runs an admin command without data, or with data to the controller.
    pub fn admin_write(
        &mut self,
        cmd: Command,
        data: Option<&[u8]>,
        what: &str,
    ) -> Result<Completion> {
        let d = data.map_or(AdminData::None, AdminData::Out);
        self.admin()?.ok(cmd, d, what)
    }

    /// Reads `len` bytes of log page `lid` (split into pieces the controller takes).
    pub fn get_log_page(&mut self, nsid: u32, lid: LogPageId, len: usize) -> Result<Vec<u8>> {
        let max = self.max_transfer();
        self.admin()?.get_log(nsid, lid, len, max, "Get Log Page")
    }

    /// Orderly shutdown: the I/O qpairs still held here are disconnected, then CC.SHN =
    /// normal (waiting for CSTS.SHST complete, bounded), then the admin queue is
    /// disconnected. I/O qpairs owned elsewhere should be disconnected first, as the Linux
    /// host tears I/O queues down before the admin queue.
    pub fn disconnect(mut self) -> Result<()> {
        for qp in self.io_qpairs.drain(..) {
            qp.disconnect();
        }
        let was_live = self.shared.state() == STATE_LIVE;
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.state.store(STATE_DELETED, Ordering::Release);
        let mut result = Ok(());
        if let Some(mut admin) = self.admin.take() {
            if was_live {
                result = shutdown(&mut admin);
            }
            admin.disconnect(Duration::from_secs(1));
        }
        result
    }
}

impl<V: Verbs> Drop for Controller<V> {
    fn drop(&mut self) {
        if self.shared.state() != STATE_FAILED {
            self.shared.generation.fetch_add(1, Ordering::AcqRel);
            self.shared.state.store(STATE_DELETED, Ordering::Release);
        }
        if let Some(mut admin) = self.admin.take() {
            admin.disconnect(Duration::ZERO);
        }
    }
}

#[allow(dead_code)]
fn _assert_send<V: Verbs>() {
    fn is_send<T: Send>() {}
    is_send::<Controller>();
    is_send::<IoQpair>();
    // Under any provider: I/O qpairs move to their polling threads.
    is_send::<Controller<V>>();
    is_send::<IoQpair<V>>();
    is_send::<crate::path::MultipathQpair<V>>();
    let _ = IoStatus::Timeout;
}

//! Multipath wiring: [`MultipathQpair`] runs a [`MultipathCore`] over one [`IoQpair`] per
//! path on a polling thread; [`PathHandle`] carries each path's ANA state from the thread
//! that owns the controllers (and reads the ANA log) to the I/O threads.
//!
//! ```text
//! admin thread: Controller::poll_admin ── AnaChanged / Reconnected / refresh asked ──►
//!               Controller::ana_log ──► PathHandle::set_ana ───┐ (atomics)
//! I/O thread:   MultipathQpair::poll ◄─────────────────────────┘
//!                 ├─ IoQpair (path 0, failover mode) ─┐ completions: MultipathCore decides
//!                 └─ IoQpair (path 1, failover mode) ─┘ done / retry elsewhere / wait / fail
//! ```
//!
//! The paths' qpairs are in failover mode ([`IoQpair::set_failover`]): a broken connection
//! hands its commands back with [`IoStatus::PathError`] at once, and the qpair reconnects
//! in the background with its controller. A retried I/O is resubmitted with the command it
//! was first submitted with and the same buffer (see [`crate::multipath`] on why that is
//! safe for writes). Buffers must come from a pool registered on the protection domain all
//! the paths share ([`Controller::connect_with_pd`]).
//!
//! The multipath timers (retry delays, fast-io-fail, ANA transition) run on the verbs
//! provider's clock ([`Verbs::now`]), the clock of the paths' qpairs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nvmf_common::buffer::IoBuf;
use nvmf_common::rdma::{RealVerbs, Verbs};
use nvmf_common::spec::{Command, Status};

use crate::controller::Controller;
use crate::error::Result;
use crate::multipath::{
    AnaLog, AnaState, Link, MultipathCore, MultipathStats, PathView, Policy, Ready, Route, Timers,
    Verdict,
};
use crate::qpair::{
    DataDir, IoCompletion, IoQpair, IoStatus, QpairState, QpairStats, SubmitError, SubmitErrorKind,
};

#[derive(Debug)]
struct PathShared {
    ana: AtomicU8,
    /// Bumped on every [`PathHandle::set_ana`], so readers see a re-read even of the same
    /// state (it overrides what an ANA status made them assume meanwhile).
    version: AtomicU64,
    refresh: AtomicBool,
}

/// One path's ANA state for one namespace, shared between the controller's thread and the
/// I/O threads.
#[derive(Clone, Debug)]
pub struct PathHandle(Arc<PathShared>);

impl PathHandle {
    pub fn new(ana: AnaState) -> Self {
        Self(Arc::new(PathShared {
            ana: AtomicU8::new(ana.to_raw()),
            version: AtomicU64::new(0),
            refresh: AtomicBool::new(false),
        }))
    }

    pub fn ana(&self) -> AnaState {
        AnaState::from_raw(self.0.ana.load(Ordering::Acquire))
    }

    /// Publishes the state read from the controller's ANA log.
    pub fn set_ana(&self, ana: AnaState) {
        self.0.ana.store(ana.to_raw(), Ordering::Release);
        self.0.version.fetch_add(1, Ordering::AcqRel);
    }

    fn version(&self) -> u64 {
        self.0.version.load(Ordering::Acquire)
    }

    /// An I/O thread saw an ANA status through this path: the log should be read again.
    pub fn request_refresh(&self) {
        self.0.refresh.store(true, Ordering::Release);
    }

    /// Whether a re-read was asked for since the last call.
    pub fn take_refresh(&self) -> bool {
        self.0.refresh.swap(false, Ordering::AcqRel)
    }
}

/// A namespace as reached through one controller, for the thread owning that controller.
#[derive(Clone, Debug)]
pub struct NamespacePath {
    pub nsid: u32,
    pub anagrpid: u32,
    pub handle: PathHandle,
}

/// Publishes the states `log` gives the namespaces of `paths` (a namespace the log does not
/// list becomes Inaccessible, so it is not used on a guess).
pub fn apply_ana_log(log: &AnaLog, paths: &[NamespacePath]) {
    for p in paths {
        let state = log
            .state_of(p.nsid, p.anagrpid)
            .unwrap_or(AnaState::Inaccessible);
        if state != p.handle.ana() {
            tracing::info!(nsid = p.nsid, %state, "ANA state");
        }
        p.handle.set_ana(state);
    }
}

/// Reads `ctrl`'s ANA log (as SPDK's `nvme_ctrlr_read_ana_log_page`) and publishes the
/// states of `paths`; a controller without ANA reporting makes them Optimized.
pub fn refresh_ana<V: Verbs>(ctrl: &mut Controller<V>, paths: &[NamespacePath]) -> Result<()> {
    if !ctrl.reports_ana() {
        for p in paths {
            p.handle.set_ana(AnaState::Optimized);
        }
        return Ok(());
    }
    let log = ctrl.ana_log()?;
    apply_ana_log(&log, paths);
    Ok(())
}

/// Whether any of `paths` asked for its ANA log to be read again (clears the requests).
pub fn refresh_requested(paths: &[NamespacePath]) -> bool {
    paths
        .iter()
        .fold(false, |any, p| p.handle.take_refresh() | any)
}

struct PathQp<V: Verbs> {
    qp: IoQpair<V>,
    handle: PathHandle,
    seen: u64,
}

struct MpIo {
    tag: u64,
    cmd: Command,
    dir: DataDir,
    path: usize,
}

/// One namespace's I/O over several paths, for one polling thread: the same calls as an
/// [`IoQpair`] (`submit`, `poll`), with the path chosen per I/O and path failures retried
/// on other paths.
pub struct MultipathQpair<V: Verbs = RealVerbs> {
    paths: Vec<PathQp<V>>,
    /// The paths' verbs provider, whose clock the timers run on.
    verbs: V,
    core: MultipathCore,
    ios: Vec<Option<MpIo>>,
    /// Buffers of I/Os waiting in the core, by id.
    held: Vec<Option<IoBuf>>,
    free: Vec<usize>,
    /// Completions decided outside `poll` (submissions that failed for want of a path).
    done: Vec<IoCompletion>,
    inner: Vec<IoCompletion>,
    ready: Vec<Ready>,
}

impl<V: Verbs> MultipathQpair<V> {
    /// `paths`: one qpair per path (put into failover mode here) with its [`PathHandle`],
    /// in preference order.
    pub fn new(paths: Vec<(IoQpair<V>, PathHandle)>, policy: Policy, timers: Timers) -> Self {
        assert!(!paths.is_empty(), "a multipath qpair needs a path");
        let verbs = paths[0].0.verbs().clone();
        let depths = paths.iter().map(|(q, _)| usize::from(q.depth()));
        let capacity = match policy {
            Policy::ActivePassive => depths.max().unwrap_or(1),
            Policy::ActiveActive => depths.sum(),
        };
        let views = paths
            .iter()
            .map(|(_, h)| PathView {
                link: Link::Up,
                ana: h.ana(),
            })
            .collect();
        let paths = paths
            .into_iter()
            .map(|(mut qp, handle)| {
                qp.set_failover(true);
                PathQp {
                    seen: handle.version(),
                    qp,
                    handle,
                }
            })
            .collect();
        Self {
            paths,
            verbs,
            core: MultipathCore::new(policy, timers, views, capacity),
            ios: (0..capacity).map(|_| None).collect(),
            held: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
            done: Vec::new(),
            inner: Vec::with_capacity(capacity),
            ready: Vec::with_capacity(capacity),
        }
    }

    /// I/Os that may be outstanding at once.
    pub fn depth(&self) -> u16 {
        self.ios.len().min(usize::from(u16::MAX)) as u16
    }

    pub fn outstanding(&self) -> usize {
        self.ios.iter().filter(|i| i.is_some()).count()
    }

    /// Failed when every path failed for good; Live when one is live.
    pub fn state(&self) -> QpairState {
        let states = self.paths.iter().map(|p| p.qp.state());
        if states.clone().all(|s| s == QpairState::Failed) {
            QpairState::Failed
        } else if states.clone().any(|s| s == QpairState::Live) {
            QpairState::Live
        } else {
            QpairState::Reconnecting
        }
    }

    pub fn failure(&self) -> Option<&str> {
        if self.state() != QpairState::Failed {
            return None;
        }
        self.paths.iter().find_map(|p| p.qp.failure())
    }

    pub fn set_max_completions(&mut self, max: u32) {
        for p in &mut self.paths {
            p.qp.set_max_completions(max);
        }
    }

    pub fn stats(&self) -> &MultipathStats {
        self.core.stats()
    }

    /// Each path's qpair: its controller's address, QID and counters.
    pub fn path_stats(&self) -> Vec<(std::net::SocketAddr, u16, QpairStats)> {
        self.paths
            .iter()
            .map(|p| (p.qp.peer(), p.qp.qid(), p.qp.stats()))
            .collect()
    }

    /// What the core sees of each path, from the qpairs and the handles.
    fn refresh(&mut self) {
        for (i, p) in self.paths.iter_mut().enumerate() {
            let link = match p.qp.state() {
                QpairState::Failed => Link::Lost,
                _ if p.qp.is_usable() => Link::Up,
                _ => Link::Down,
            };
            self.core.set_link(i, link);
            let v = p.handle.version();
            if v != p.seen {
                p.seen = v;
                self.core.set_ana(i, p.handle.ana());
            }
            if self.core.take_ana_refresh(i) {
                p.handle.request_refresh();
            }
        }
    }

    /// Submits `cmd` with `buf` on the path the policy picks (or keeps it until one is
    /// usable). `tag` comes back with the completion.
    pub fn submit(
        &mut self,
        cmd: Command,
        buf: Option<IoBuf>,
        dir: DataDir,
        tag: u64,
    ) -> std::result::Result<(), SubmitError> {
        let Some(id) = self.free.pop() else {
            return Err(SubmitError {
                kind: SubmitErrorKind::QueueFull,
                buf,
            });
        };
        self.refresh();
        let now = self.verbs.now();
        let mut io = MpIo {
            tag,
            cmd,
            dir,
            path: 0,
        };
        match self.core.submit(id, now) {
            Route::Path(p) => {
                io.path = p;
                match self.paths[p].qp.submit(cmd, buf, dir, id as u64) {
                    Ok(()) => {}
                    Err(e) if e.kind == SubmitErrorKind::Failed => {
                        self.held[id] = e.buf;
                        self.core.requeue(id, p, now);
                    }
                    Err(e) => {
                        self.free.push(id);
                        return Err(e);
                    }
                }
            }
            Route::Queued => self.held[id] = buf,
            Route::Fail(status) => {
                self.free.push(id);
                self.done.push(IoCompletion {
                    tag,
                    status,
                    dw0: 0,
                    buf,
                });
                return Ok(());
            }
        }
        self.ios[id] = Some(io);
        Ok(())
    }

    /// Polls every path (their reconnects included), settles completions, resubmits the
    /// I/Os whose retry is due, and appends finished I/Os to `out`. Returns how many.
    pub fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let before = out.len();
        out.append(&mut self.done);
        let now = self.verbs.now();
        for i in 0..self.paths.len() {
            self.paths[i].qp.poll(&mut self.inner);
            for c in self.inner.drain(..) {
                let id = c.tag as usize;
                let Some(io) = self.ios[id].as_ref() else {
                    continue;
                };
                match self.core.on_completion(id, io.path, c.status, now) {
                    Verdict::Done => {
                        let io = self.ios[id].take().expect("checked above");
                        self.free.push(id);
                        out.push(IoCompletion { tag: io.tag, ..c });
                    }
                    Verdict::Retry => self.held[id] = c.buf,
                    Verdict::Fail(status) => {
                        let io = self.ios[id].take().expect("checked above");
                        self.free.push(id);
                        out.push(IoCompletion {
                            tag: io.tag,
                            status,
                            dw0: c.dw0,
                            buf: c.buf,
                        });
                    }
                }
            }
        }
        self.refresh();
        self.core.ready(now, &mut self.ready);
        for r in std::mem::take(&mut self.ready) {
            match r {
                Ready::Submit { id, path } => self.resubmit(id, path, now, out),
                Ready::Fail { id, status } => {
                    let io = self.ios[id].take().expect("a waiting I/O");
                    self.free.push(id);
                    out.push(IoCompletion {
                        tag: io.tag,
                        status,
                        dw0: 0,
                        buf: self.held[id].take(),
                    });
                }
            }
        }
        out.len() - before
    }

    /// Sends a waiting I/O again: the same command and buffer, on `path`.
    fn resubmit(&mut self, id: usize, path: usize, now: Instant, out: &mut Vec<IoCompletion>) {
        let io = self.ios[id].as_mut().expect("a waiting I/O");
        io.path = path;
        let (cmd, dir) = (io.cmd, io.dir);
        let buf = self.held[id].take();
        match self.paths[path].qp.submit(cmd, buf, dir, id as u64) {
            Ok(()) => {}
            Err(e) => match e.kind {
                // No room on that path yet: try again on the next poll.
                SubmitErrorKind::QueueFull => {
                    self.held[id] = e.buf;
                    self.core.defer(id, now);
                }
                SubmitErrorKind::Failed => {
                    self.held[id] = e.buf;
                    self.core.requeue(id, path, now);
                }
                // The paths disagree on what the command may carry (maximum transfer):
                // the command cannot be sent on the path left.
                SubmitErrorKind::TooLarge | SubmitErrorKind::Invalid => {
                    let io = self.ios[id].take().expect("a waiting I/O");
                    self.free.push(id);
                    out.push(IoCompletion {
                        tag: io.tag,
                        status: IoStatus::Nvme(Status::INVALID_FIELD.with_dnr()),
                        dw0: 0,
                        buf: e.buf,
                    });
                }
            },
        }
    }

    /// Disconnects every path's qpair.
    pub fn disconnect(self) {
        for p in self.paths {
            p.qp.disconnect();
        }
    }
}

//! The paths of `read` / `write`: one controller per `-r`, checked to reach one namespace,
//! their ANA states kept current, and the I/O qpair over them.

use std::time::Duration;

use anyhow::{bail, Context};
use nvmf_common::buffer::IoBuf;
use nvmf_common::spec::Command;
use nvmf_initiator::path::{apply_ana_log, refresh_ana, refresh_requested};
use nvmf_initiator::{
    multipath, Controller, ControllerEvent, DataDir, IoCompletion, IoQpair, MultipathQpair,
    NamespacePath, PathHandle, Reconnect, SubmitError, Timers,
};

use crate::args::{Cli, Rw};
use crate::{connect, opts, tid};

/// The I/O qpair of `read` / `write`: one controller's, or one over every path.
pub(crate) enum HostQp {
    // Boxed: both are large and of different sizes.
    One(Box<IoQpair>),
    Multi(Box<MultipathQpair>),
}

impl HostQp {
    pub(crate) fn depth(&self) -> u16 {
        match self {
            Self::One(q) => q.depth(),
            Self::Multi(q) => q.depth(),
        }
    }

    pub(crate) fn outstanding(&self) -> usize {
        match self {
            Self::One(q) => q.outstanding(),
            Self::Multi(q) => q.outstanding(),
        }
    }

    pub(crate) fn failure(&self) -> Option<&str> {
        match self {
            Self::One(q) => q.failure(),
            Self::Multi(q) => q.failure(),
        }
    }

    pub(crate) fn submit(
        &mut self,
        cmd: Command,
        buf: IoBuf,
        dir: DataDir,
        tag: u64,
    ) -> Result<(), SubmitError> {
        match self {
            Self::One(q) => q.submit(cmd, Some(buf), dir, tag),
            Self::Multi(q) => q.submit(cmd, Some(buf), dir, tag),
        }
    }

    pub(crate) fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        match self {
            Self::One(q) => q.poll(out),
            Self::Multi(q) => q.poll(out),
        }
    }

    pub(crate) fn disconnect(self) {
        match self {
            Self::One(q) => q.disconnect(),
            Self::Multi(q) => q.disconnect(),
        }
    }
}

/// The controllers of `-r` (one per path) and, with several, each path's ANA state of the
/// namespace.
pub(crate) struct Paths {
    pub(crate) ctrls: Vec<Controller>,
    ana: Vec<NamespacePath>,
    lost: Vec<bool>,
}

/// Connects every `-r` of `a`; several must name one subsystem and reach one namespace
/// (same NGUID / EUI64 / UUID), through one RDMA device.
pub(crate) fn connect_paths(cli: &Cli, a: &Rw) -> anyhow::Result<Paths> {
    if a.r.len() == 1 {
        let ctrl = connect(&a.r[0], cli, 1)?;
        return Ok(Paths {
            ctrls: vec![ctrl],
            ana: Vec::new(),
            lost: vec![false],
        });
    }
    let mut ctrls: Vec<Controller> = Vec::new();
    let mut ana = Vec::new();
    let mut first_ids: Option<multipath::NamespaceIds> = None;
    for r in &a.r {
        let t = tid(r, cli)?;
        if t.is_discovery() {
            bail!("-r {r:?}: no subnqn given");
        }
        if let Some(c) = ctrls.first() {
            if c.transport_id().subnqn != t.subnqn {
                bail!("-r {r:?}: the paths of a namespace name one subsystem");
            }
        }
        let mut o = opts(cli, 1);
        // A failed path comes back in the background.
        o.reconnect = Some(Reconnect {
            delay: Duration::from_secs(2),
            ctrl_loss_tmo: Some(Duration::from_secs(600)),
        });
        let mut c = match ctrls.first() {
            None => Controller::connect(&t, o),
            Some(first) => Controller::connect_with_pd(&t, o, first.pd()),
        }
        .with_context(|| format!("connecting to {t}"))?;
        let (ids, anagrpid) = c
            .namespace_ids(a.nsid)
            .with_context(|| format!("identifying namespace {} at {}", a.nsid, c.peer()))?;
        match &first_ids {
            None => first_ids = Some(ids),
            Some(f) => multipath::same_namespace(f, &ids).map_err(|e| {
                anyhow::anyhow!("namespace {} at {} is another one: {e}", a.nsid, c.peer())
            })?,
        }
        let state = c.ana_state(a.nsid, anagrpid)?;
        eprintln!("path {}: ANA {state}", c.peer());
        ana.push(NamespacePath {
            nsid: a.nsid,
            anagrpid,
            handle: PathHandle::new(state),
        });
        ctrls.push(c);
    }
    let lost = vec![false; ctrls.len()];
    Ok(Paths { ctrls, ana, lost })
}

impl Paths {
    pub(crate) fn qpair(&mut self, a: &Rw) -> anyhow::Result<HostQp> {
        if self.ana.is_empty() {
            let qp = self.ctrls[0]
                .take_io_qpairs()
                .pop()
                .context("no I/O qpair")?;
            return Ok(HostQp::One(Box::new(qp)));
        }
        let mut legs = Vec::new();
        for (c, p) in self.ctrls.iter_mut().zip(&self.ana) {
            let qp = c.take_io_qpairs().pop().context("no I/O qpair")?;
            legs.push((qp, p.handle.clone()));
        }
        let timers = Timers {
            fast_io_fail: (a.fast_io_fail_timeout_sec > 0)
                .then(|| Duration::from_secs(a.fast_io_fail_timeout_sec)),
            anatt: self.ctrls[0].ana_transition_time(),
            ..Timers::default()
        };
        let qp = MultipathQpair::new(legs, a.multipath, timers);
        Ok(HostQp::Multi(Box::new(qp)))
    }

    /// Keep-alive and reconnects of every path; ANA logs read again when they change. A
    /// lost controller is an error only without other paths.
    pub(crate) fn poll_admin(&mut self) -> anyhow::Result<()> {
        for (i, c) in self.ctrls.iter_mut().enumerate() {
            if self.lost[i] {
                continue;
            }
            let mine = self.ana.get(i..=i).unwrap_or(&[]);
            match c.poll_admin() {
                Ok(events) => {
                    for ev in events {
                        match ev {
                            ControllerEvent::AnaChanged { log: Some(log) } => {
                                apply_ana_log(&log, mine)
                            }
                            ControllerEvent::AnaChanged { log: None }
                            | ControllerEvent::Reconnected { .. } => {
                                if let Err(e) = refresh_ana(c, mine) {
                                    eprintln!("nvmf-host: {}: ANA log: {e}", c.peer());
                                }
                            }
                            ControllerEvent::Disconnected { reason } => {
                                eprintln!("nvmf-host: {}: {reason}", c.peer())
                            }
                            _ => {}
                        }
                    }
                    if refresh_requested(mine) && c.is_live() {
                        if let Err(e) = refresh_ana(c, mine) {
                            eprintln!("nvmf-host: {}: ANA log: {e}", c.peer());
                        }
                    }
                }
                Err(e) if self.ana.is_empty() => return Err(e.into()),
                Err(e) => {
                    eprintln!("nvmf-host: {}: path lost: {e}", c.peer());
                    self.lost[i] = true;
                }
            }
        }
        Ok(())
    }
}

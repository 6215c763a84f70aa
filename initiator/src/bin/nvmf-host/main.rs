//! `nvmf-host`: administer and probe NVMe-oF subsystems over RDMA from user space, with output
//! close to nvme-cli's (`nvme discover`, `id-ctrl`, `id-ns`, `smart-log`, `get-log`), plus
//! block-range read / write to and from a file.
//!
//! The command line is in [`args`]; each command in its own module: [`discover`],
//! [`identify`], [`logs`] (`smart-log`, `get-log`) and [`rw`] (`read` / `write`, over one
//! path or several, set up in [`paths`]).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use nvmf_initiator::{Controller, ControllerOptions, TransportId};

mod args;
mod discover;
mod identify;
mod logs;
mod paths;
mod rw;

use args::{Cli, Cmd};
use discover::cmd_discover;
use identify::cmd_identify;
use logs::{cmd_get_log, cmd_smart};
use rw::cmd_rw;

fn tid(s: &str, cli: &Cli) -> anyhow::Result<TransportId> {
    let mut t: TransportId = s.parse().with_context(|| format!("-r {s:?}"))?;
    if t.hostnqn.is_none() {
        t.hostnqn.clone_from(&cli.hostnqn);
    }
    Ok(t)
}

fn opts(cli: &Cli, io_queues: u16) -> ControllerOptions {
    ControllerOptions {
        hostnqn: cli.hostnqn.clone(),
        io_queues,
        connect_timeout: Duration::from_secs(cli.connect_timeout.max(1)),
        admin_timeout: Duration::from_secs(30),
        io_timeout: Duration::from_secs(30),
        memory_windows: cli.memory_windows,
        ..ControllerOptions::default()
    }
}

fn connect(s: &str, cli: &Cli, io_queues: u16) -> anyhow::Result<Controller> {
    let t = tid(s, cli)?;
    if t.is_discovery() {
        bail!("-r {s:?}: no subnqn given (that is the discovery subsystem; use `discover`)");
    }
    Controller::connect(&t, opts(cli, io_queues)).with_context(|| format!("connecting to {t}"))
}

/// Orderly shutdown; a failure there does not undo what the command did.
fn disconnect(ctrl: Controller) {
    if let Err(e) = ctrl.disconnect() {
        eprintln!("nvmf-host: warning: controller shutdown: {e}");
    }
}

fn main() -> ExitCode {
    nvmf_initiator::init_tool_logging();
    let cli = Cli::parse();
    let r = match &cli.cmd {
        Cmd::Discover { r } => cmd_discover(&cli, r),
        Cmd::Identify { r, what, nsid } => cmd_identify(&cli, r, *what, *nsid),
        Cmd::Read(a) => cmd_rw(&cli, a, false),
        Cmd::Write(a) => cmd_rw(&cli, a, true),
        Cmd::SmartLog { r, nsid } => cmd_smart(&cli, r, *nsid),
        Cmd::GetLog {
            r,
            lid,
            len,
            nsid,
            raw,
        } => cmd_get_log(&cli, r, *lid, *len, *nsid, *raw),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvmf-host: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! Runs poll groups on the per-core reactors of `nvmf_common::reactor`.

use std::sync::Arc;

use std::time::Duration;

use nvmf_common::reactor::{IdlePolicy, Pollable, Reactor, Ready, WaitSet};

use crate::core::{PollGroup, PollGroupHandle, TargetInfo};

struct ReactorState(PollGroup);

impl Pollable for ReactorState {
    fn poll(&mut self) -> usize {
        self.0.poll()
    }

    fn shutdown(&mut self) {
        self.0.shutdown();
    }

    fn prepare_sleep(&mut self, wait: &WaitSet<'_>) -> Option<Duration> {
        self.0.prepare_sleep(wait)
    }

    fn woken(&mut self, ready: Ready<'_>) {
        self.0.woken(ready);
    }

    fn commands_done(&self) -> u64 {
        self.0.core.stats.completed_nvme_io
    }

    fn observe_clock(&mut self, now: std::time::Instant) {
        self.0.observe_clock(now);
    }
}

/// Starts one pinned reactor per core, each with its poll group, idling as `idle` says;
/// returns the reactors and the poll groups' message handles, in core order.
pub fn start_reactors(
    cores: &[usize],
    info: &Arc<TargetInfo>,
    idle: impl Into<IdlePolicy>,
) -> std::io::Result<(Vec<Reactor>, Vec<PollGroupHandle>)> {
    let idle = idle.into();
    let mut reactors = Vec::with_capacity(cores.len());
    let mut handles = Vec::with_capacity(cores.len());
    for (index, &core) in cores.iter().enumerate() {
        let info = Arc::clone(info);
        let name = format!("reactor_{core}");
        let (reactor, handle) = Reactor::spawn(core, name, idle, move |waker| {
            let pg = PollGroup::with_waker(index, info, Some(std::sync::Arc::clone(waker)));
            let handle = pg.handle();
            (ReactorState(pg), handle)
        })?;
        tracing::info!(
            core,
            mode = idle.mode.as_str(),
            max_spin_us = idle.max_spin.as_micros() as u64,
            min_spin_turns = idle.min_spin_turns,
            "reactor started"
        );
        reactors.push(reactor);
        handles.push(handle);
    }
    Ok((reactors, handles))
}

/// Stops reactors: each disconnects its qpairs and drains its I/O before its thread ends.
pub fn stop_reactors(reactors: Vec<Reactor>) {
    for r in &reactors {
        r.request_stop();
    }
    for r in reactors {
        r.join();
    }
}

//! A reactor's bdev I/O: submitting to its namespaces' channels (a memory bdev's completion
//! comes straight back), polling the channels with I/O out, and counting finished I/O in
//! the namespaces' statistics and latency histograms. Part of [`CoreCtx`]; the command
//! side (parse, execute, complete) is in `cmd/io.rs`.

use nvmf_common::spec::Status;

use super::latency::NamespaceLatency;
use super::namespaces::{GroupNamespace, NsSlot};
use super::request::{ReqTag, Wakeup};
use super::{CoreCtx, Counted};
use crate::bdev::{BdevChannel, BdevCompletion, BdevIo, Submitted};

/// Entries (namespace and kind, with a count) waiting for the next clock reading, at most:
/// more than a turn's namespaces ever alternate. Past it, an I/O counts with the turn's
/// clock.
pub(super) const LATENCY_WAITING_MAX: usize = 1024;

impl CoreCtx {
    /// The I/Os that finished in the clock's last reading took until this one: `took_ns`.
    #[inline(never)]
    pub(super) fn record_waiting_latencies(&mut self, took_ns: u64) {
        // Walked then cleared (a `drain` costs more than one entry's record).
        for &(slot, kind, count) in &self.latency_waiting {
            if let Some(gns) = self.ns_table.get_mut(slot) {
                gns.latency.record_many(kind, took_ns, count);
            }
        }
        self.latency_waiting.clear();
    }

    /// Polls the channels of the namespaces with I/O out (and those draining).
    #[inline(never)]
    pub(super) fn poll_bdevs(&mut self) -> usize {
        let mut work = 0;
        let wakeups = &mut self.wakeups;
        let mut i = 0;
        while i < self.busy_namespaces.len() {
            // A namespace retired since its I/O went out is polled from `draining`.
            let Some(gns) = self.ns_table.get_mut(self.busy_namespaces[i]) else {
                self.busy_namespaces.swap_remove(i);
                continue;
            };
            let done = poll_namespace(gns, wakeups);
            work += done;
            gns.out = gns.out.saturating_sub(done as u32);
            if gns.out == 0 {
                self.busy_namespaces.swap_remove(i);
            } else {
                i += 1;
            }
        }
        for gns in &mut self.draining {
            work += poll_namespace(gns, wakeups);
        }
        self.bdev_io_outstanding = self.bdev_io_outstanding.saturating_sub(work);
        if !self.draining.is_empty() {
            self.draining
                .retain(|g| g.channel.in_flight() > 0 || !g.retry.is_empty());
        }
        work
    }

    /// Submits an I/O to a namespace's channel, queueing it if the channel is busy. Its
    /// completion comes as a wakeup.
    pub(crate) fn submit_io(&mut self, slot: NsSlot, io: BdevIo) -> Result<(), Status> {
        self.submit_with(slot, io, |channel, io| match channel.submit(io) {
            Ok(()) => Submitted::Started,
            Err(io) => Submitted::Refused(io),
        })
        .map(|_| ())
    }

    /// Submits an I/O like [`submit_io`](Self::submit_io), but a completion the channel
    /// has at once ([`BdevChannel::submit_now`]) comes back here, for the caller to complete
    /// its command in the same step: no poll, no wakeup, no dispatch.
    pub(crate) fn submit_io_now(
        &mut self,
        slot: NsSlot,
        io: BdevIo,
    ) -> Result<Option<BdevCompletion>, Status> {
        self.submit_with(slot, io, |channel, io| channel.submit_now(io))
    }

    #[inline(always)]
    fn submit_with(
        &mut self,
        slot: NsSlot,
        io: BdevIo,
        submit: impl FnOnce(&mut dyn BdevChannel, BdevIo) -> Submitted,
    ) -> Result<Option<BdevCompletion>, Status> {
        let gns = self
            .ns_table
            .get_mut(slot)
            .ok_or(Status::INVALID_NAMESPACE.with_dnr())?;
        // Behind I/O the channel refused earlier, in order.
        let refused = if gns.retry.is_empty() {
            match submit(gns.channel.as_mut(), io) {
                Submitted::Done(done) => return Ok(Some(done)),
                Submitted::Started => None,
                Submitted::Refused(io) => Some(io),
            }
        } else {
            Some(io)
        };
        if let Some(io) = refused {
            gns.retry.push_back(io);
            self.stats.pending_bdev_io += 1;
        }
        self.bdev_io_outstanding += 1;
        if gns.out == 0 {
            self.busy_namespaces.push(slot);
        }
        gns.out += 1;
        Ok(None)
    }

    /// Counts a finished I/O command of `bytes` in the namespace's statistics and, for a read
    /// or write that started at `started_ns`, its latency in this reactor's histogram: no
    /// lookup.
    pub(crate) fn count_io(
        &mut self,
        slot: NsSlot,
        kind: Counted,
        bytes: u32,
        started_ns: Option<u64>,
    ) {
        let group = self.group;
        let Some(gns) = self.ns_table.get_mut(slot) else {
            return;
        };
        let stats = &gns.ns.stats;
        match kind {
            Counted::Error => return stats.record_error(group),
            Counted::Read => stats.record_read(group, u64::from(bytes)),
            Counted::Write => stats.record_write(group, u64::from(bytes)),
        }
        let Some(started) = started_ns else {
            return;
        };
        if started == self.now_ns {
            // Most turns' I/Os are of one namespace and kind: one entry counts them all.
            let waiting = &mut self.latency_waiting;
            if let Some((s, k, count)) = waiting.last_mut() {
                if *s == slot && *k == kind {
                    *count += 1;
                    return;
                }
            }
            if waiting.len() < LATENCY_WAITING_MAX {
                waiting.push((slot, kind, 1));
                return;
            }
        }
        gns.latency
            .record_many(kind, self.now_ns.saturating_sub(started), 1);
    }

    /// This reactor's latency histograms: (subsystem NQN, NSID, histograms) of every namespace
    /// it has a channel to.
    pub fn namespace_latencies(&self) -> Vec<(String, u32, NamespaceLatency)> {
        let table = &self.ns_table;
        self.subsystems
            .values()
            .flat_map(|s| {
                s.namespaces.iter().filter_map(|(&nsid, &slot)| {
                    let g = table.get(slot)?;
                    Some((s.config.nqn.clone(), nsid, g.latency))
                })
            })
            .collect()
    }

    /// I/O still in flight on this reactor's channels (for orderly shutdown).
    pub fn io_in_flight(&self) -> usize {
        let live: usize = self
            .ns_table
            .iter()
            .map(|g| g.channel.in_flight() + g.retry.len())
            .sum();
        live + self
            .draining
            .iter()
            .map(|g| g.channel.in_flight() + g.retry.len())
            .sum::<usize>()
    }
}

/// Polls a namespace's channel and retries what it refused; returns the completions it
/// handed over.
fn poll_namespace(gns: &mut GroupNamespace, wakeups: &mut Vec<(ReqTag, Wakeup)>) -> usize {
    let mut done = 0;
    gns.channel.poll(&mut |c| {
        done += 1;
        wakeups.push((ReqTag(c.tag), Wakeup::Bdev(c)));
    });
    while let Some(io) = gns.retry.pop_front() {
        if let Err(io) = gns.channel.submit(io) {
            gns.retry.push_front(io);
            break;
        }
    }
    done
}

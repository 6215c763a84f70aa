//! Target-wide connection limits: how many queue pairs one host NQN, and all hosts together,
//! may have connected. Checked at Connect, once the Connect data names the host and the
//! subsystem's allow-list and listener checks have passed, before a controller or a queue
//! is set up. (SPDK has no such cap; its per-controller and per-subsystem limits are the
//! transport's `max_io_qpairs_per_ctrlr` and the subsystem's cntlid range, enforced next to
//! this in `cmd::fabrics`.)
//!
//! The counters are shared by every reactor; only Connect and queue teardown touch them, never
//! the I/O path, so one mutex for the per-host table is enough.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Default of `max_qpairs_per_host`: Linux opens one I/O queue per CPU plus the admin queue per
/// controller (`nr_io_queues` defaults to the CPU count, at most 128 per controller with our
/// `max_io_qpairs_per_ctrlr`), so 1024 lets one host run eight full-size controllers (or
/// paths) to this target.
pub const DEFAULT_MAX_QPAIRS_PER_HOST: u32 = 1024;
/// Default of `max_qpairs`: sixteen such hosts at their cap. Every RDMA queue pair costs a QP,
/// its response buffers and request slots, so the bound keeps a target from being talked into
/// unbounded memory while staying far above any real deployment's fan-in.
pub const DEFAULT_MAX_QPAIRS: u32 = 16_384;

/// Which limit a Connect would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpairLimit {
    PerHost,
    Total,
}

#[derive(Debug)]
pub struct QpairLimits {
    /// `nvmf_set_config`'s `max_qpairs_per_host` (our extension).
    pub max_per_host: AtomicU32,
    /// `nvmf_set_config`'s `max_qpairs` (our extension).
    pub max_total: AtomicU32,
    total: AtomicU32,
    per_host: Mutex<HashMap<String, u32>>,
    /// `nvmf_set_config`'s `connect_timeout_ms` and `transfer_timeout_ms` (our extensions):
    /// 0 until set, then every reactor takes them on its next timer tick.
    pub connect_timeout_ms: AtomicU64,
    pub transfer_timeout_ms: AtomicU64,
}

impl Default for QpairLimits {
    fn default() -> Self {
        Self {
            max_per_host: AtomicU32::new(DEFAULT_MAX_QPAIRS_PER_HOST),
            max_total: AtomicU32::new(DEFAULT_MAX_QPAIRS),
            total: AtomicU32::new(0),
            per_host: Mutex::new(HashMap::new()),
            connect_timeout_ms: AtomicU64::new(0),
            transfer_timeout_ms: AtomicU64::new(0),
        }
    }
}

impl QpairLimits {
    /// Counts one more connected queue pair of `host`, or says which limit refuses it.
    pub fn admit(&self, host: &str) -> Result<(), QpairLimit> {
        let mut per_host = self.per_host.lock().unwrap_or_else(|e| e.into_inner());
        let mine = per_host.get(host).copied().unwrap_or(0);
        if mine >= self.max_per_host.load(Ordering::Relaxed) {
            return Err(QpairLimit::PerHost);
        }
        // Under the table's lock, so two reactors cannot both take the last slot.
        if self.total.load(Ordering::Relaxed) >= self.max_total.load(Ordering::Relaxed) {
            return Err(QpairLimit::Total);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        per_host.insert(host.to_string(), mine + 1);
        Ok(())
    }

    /// A queue pair `admit` counted went away.
    pub fn release(&self, host: &str) {
        let mut per_host = self.per_host.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per_host.get_mut(host) {
            *n -= 1;
            if *n == 0 {
                per_host.remove(host);
            }
            self.total.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Connected queue pairs: in all, and of `host`.
    pub fn connected(&self, host: &str) -> (u32, u32) {
        let per_host = self.per_host.lock().unwrap_or_else(|e| e.into_inner());
        (
            self.total.load(Ordering::Relaxed),
            per_host.get(host).copied().unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_host_and_total_caps_hold_and_release_frees() {
        let l = QpairLimits::default();
        l.max_per_host.store(2, Ordering::Relaxed);
        l.max_total.store(3, Ordering::Relaxed);
        assert_eq!(l.admit("a"), Ok(()));
        assert_eq!(l.admit("a"), Ok(()));
        assert_eq!(l.admit("a"), Err(QpairLimit::PerHost));
        assert_eq!(l.admit("b"), Ok(()));
        assert_eq!(l.admit("c"), Err(QpairLimit::Total));
        l.release("a");
        assert_eq!(l.admit("c"), Ok(()));
        l.release("nobody");
        assert_eq!(l.connected("a"), (3, 1));
    }
}

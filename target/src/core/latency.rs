//! Per-reactor I/O latency histograms: each reactor counts its own commands in its own
//! buckets (no shared writes on the I/O path) and the control plane sums them when it reads.

/// Bucket upper bounds are powers of two microseconds: 1 µs, 2 µs, ... 2^(BUCKETS-2) µs
/// (about 8.4 s), then everything slower.
pub const BUCKETS: usize = 25;

/// Latencies of one kind of command on one namespace, as seen by one reactor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// `counts[i]`: commands that took at most `bound_us(i)` but more than `bound_us(i - 1)`.
    pub counts: [u64; BUCKETS],
    pub sum_ns: u64,
    /// Slowest command (0 before the first).
    pub max_ns: u64,
    /// Fastest command (`u64::MAX` before the first, as SPDK keeps it).
    pub min_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
            sum_ns: 0,
            max_ns: 0,
            min_ns: u64::MAX,
        }
    }
}

impl LatencyHistogram {
    /// Upper bound of bucket `i` in microseconds; `None` for the last, unbounded one.
    pub fn bound_us(i: usize) -> Option<u64> {
        (i + 1 < BUCKETS).then(|| 1u64 << i)
    }

    /// `count` commands that each took `ns` nanoseconds (a count, not a `Duration`: the I/O
    /// path has nanoseconds, and the round trip through seconds cost more than the record).
    #[inline]
    pub fn record_many(&mut self, ns: u64, count: u32) {
        // Smallest i with ns <= 1000 * 2^i: bit length of ceil(ns / 1000) - 1.
        let us = ns.div_ceil(1000).max(1);
        let i = (u64::BITS - (us - 1).leading_zeros()) as usize;
        self.counts[i.min(BUCKETS - 1)] += u64::from(count);
        self.sum_ns = self
            .sum_ns
            .saturating_add(ns.saturating_mul(u64::from(count)));
        self.max_ns = self.max_ns.max(ns);
        self.min_ns = self.min_ns.min(ns);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        self.min_ns = self.min_ns.min(other.min_ns);
    }
}

/// Read and write latencies of one namespace on one reactor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NamespaceLatency {
    pub read: LatencyHistogram,
    pub write: LatencyHistogram,
}

impl NamespaceLatency {
    /// A finished read or write; errors have no latency of their own.
    /// `count` reads or writes that each took `ns` nanoseconds.
    #[inline]
    pub(crate) fn record_many(&mut self, kind: super::Counted, ns: u64, count: u32) {
        match kind {
            super::Counted::Read => self.read.record_many(ns, count),
            super::Counted::Write => self.write.record_many(ns, count),
            super::Counted::Error => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_microseconds() {
        let mut h = LatencyHistogram::default();
        for (took_ns, bucket) in [
            (1, 0),
            (1000, 0),
            (1001, 1),
            (2000, 1),
            (2001, 2),
            (1_000_000, 10),
            (1_024_000, 10),
            (1_024_001, 11),
            (u64::MAX, BUCKETS - 1),
        ] {
            let before = h.counts[bucket];
            h.record_many(took_ns, 1);
            assert_eq!(
                h.counts[bucket],
                before + 1,
                "{took_ns} ns -> bucket {bucket}"
            );
        }
        assert_eq!(h.count(), 9);
        assert_eq!((h.min_ns, h.max_ns), (1, u64::MAX));
        assert_eq!(LatencyHistogram::default().min_ns, u64::MAX);
        assert_eq!(LatencyHistogram::bound_us(0), Some(1));
        assert_eq!(LatencyHistogram::bound_us(10), Some(1024));
        assert_eq!(LatencyHistogram::bound_us(BUCKETS - 1), None);
        let mut sum = LatencyHistogram::default();
        sum.merge(&h);
        sum.merge(&h);
        assert_eq!(sum.count(), 18);
        assert_eq!((sum.min_ns, sum.max_ns), (1, u64::MAX));
    }

    /// Commands recorded together (a turn's inline completions) count as that many, each
    /// with the one latency.
    #[test]
    fn many_commands_of_one_latency_count_each() {
        let mut h = LatencyHistogram::default();
        h.record_many(1500, 3);
        h.record_many(900, 1);
        assert_eq!((h.counts[0], h.counts[1], h.count()), (1, 3, 4));
        assert_eq!(h.sum_ns, 3 * 1500 + 900);
        assert_eq!((h.min_ns, h.max_ns), (900, 1500));
        let mut ns = NamespaceLatency::default();
        ns.record_many(super::super::Counted::Write, 2500, 2);
        ns.record_many(super::super::Counted::Error, 2500, 5);
        assert_eq!((ns.read.count(), ns.write.count()), (0, 2));
        assert_eq!(ns.write.counts[2], 2);
    }
}

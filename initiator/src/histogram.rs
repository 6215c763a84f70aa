//! A fixed-bucket latency histogram: log-linear buckets (128 per power of two, so any value is
//! off by less than 1%) over the whole `u64` range, allocated once. Recording is an index
//! computation and an increment: no allocation, no branches on the data beyond a compare.

const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: values below 128 exactly, then 128 per power of two up to 2^64.
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("min", &self.min())
            .field("max", &self.max)
            .finish()
    }
}

fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = (v >> shift) as usize;
    (shift as usize + 1) * SUB + (sub - SUB)
}

/// Smallest value that lands in bucket `i`.
fn lower(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let shift = (i / SUB - 1) as u32;
    ((i % SUB + SUB) as u64) << shift
}

/// Largest value that lands in bucket `i`.
fn upper(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let shift = (i / SUB - 1) as u32;
    lower(i).saturating_add((1u64 << shift) - 1)
}

impl Histogram {
    pub fn new() -> Self {
        let counts: Box<[u64; BUCKETS]> = vec![0u64; BUCKETS]
            .into_boxed_slice()
            .try_into()
            .expect("exact length");
        Self {
            counts,
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.count += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn min(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The non-empty buckets in order: (smallest value, largest value, samples).
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (lower(i), upper(i), c))
    }

    /// The value at or below which `p` percent of the samples are (the upper end of that
    /// bucket, never above the largest sample).
    pub fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(i).min(self.max).max(self.min());
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut prev = None;
        for i in 0..BUCKETS - 1 {
            assert_eq!(upper(i) + 1, lower(i + 1), "bucket {i}");
            assert_eq!(index(lower(i)), i);
            assert_eq!(index(upper(i)), i);
            if let Some(p) = prev {
                assert!(lower(i) > p);
            }
            prev = Some(lower(i));
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
        for v in [129u64, 1000, 123_456, 9_999_999_999] {
            let i = index(v);
            let width = upper(i) - lower(i) + 1;
            assert!(width as f64 / v as f64 <= 1.0 / 128.0 + 1e-9, "{v}");
        }
    }

    #[test]
    fn percentiles_of_a_uniform_run() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 10_000);
        assert_eq!(h.min(), 1000);
        assert_eq!(h.max(), 10_000_000);
        assert!((h.mean() - 5_000_500.0).abs() < 1.0);
        let close = |got: u64, want: f64| (got as f64 - want).abs() / want < 0.01;
        assert!(
            close(h.percentile(50.0), 5_000_000.0),
            "{}",
            h.percentile(50.0)
        );
        assert!(
            close(h.percentile(99.0), 9_900_000.0),
            "{}",
            h.percentile(99.0)
        );
        assert!(
            close(h.percentile(99.9), 9_990_000.0),
            "{}",
            h.percentile(99.9)
        );
        assert_eq!(h.percentile(100.0), 10_000_000);
        assert_eq!(Histogram::new().percentile(50.0), 0);
    }

    #[test]
    fn merge_adds_up() {
        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        a.record(5);
        b.record(500);
        b.record(50_000);
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert_eq!(a.min(), 5);
        assert_eq!(a.max(), 50_000);
        assert!((500..=503).contains(&a.percentile(50.0)), "bucket of 500");
    }

    #[test]
    fn buckets_list_every_sample_once() {
        let mut h = Histogram::new();
        for v in [5u64, 5, 1000, 1_000_000] {
            h.record(v);
        }
        let b: Vec<_> = h.buckets().collect();
        assert_eq!(b.len(), 3);
        assert_eq!(b[0], (5, 5, 2));
        assert!(b[1].0 <= 1000 && 1000 <= b[1].1 && b[1].2 == 1);
        assert!(b[2].0 <= 1_000_000 && 1_000_000 <= b[2].1);
        assert_eq!(b.iter().map(|x| x.2).sum::<u64>(), h.count());
    }
}

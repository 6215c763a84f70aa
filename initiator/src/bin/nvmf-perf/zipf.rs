//! Zipf-distributed slot numbers for `-F THETA`, by the method of Gray et al., "Quickly
//! generating billion-record synthetic databases" (SIGMOD 1994), which SPDK's `spdk_zipf`
//! also uses: slot 0 is the most popular, slot `i` is chosen with weight `1 / (i+1)^theta`.

/// zeta(n, theta) = sum over i in 1..=n of 1 / i^theta. Summed exactly for the first ten
/// million terms; past that the terms change slowly, so each million is estimated by the
/// trapezoid rule (a namespace of billions of slots would otherwise take seconds).
fn zeta(n: u64, theta: f64) -> f64 {
    const EXACT: u64 = 10_000_000;
    const STEP: u64 = 1_000_000;
    let term = |i: u64| (i as f64).powf(-theta);
    let mut sum: f64 = (1..=n.min(EXACT)).map(term).sum();
    let mut i = EXACT;
    while i < n {
        let count = STEP.min(n - i);
        sum += (term(i + 1) + term(i + count)) * count as f64 / 2.0;
        i += count;
    }
    sum
}

pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    /// `n` slots (at least 1); `theta` positive and not 1 (where the method's exponent
    /// 1/(1-theta) is undefined).
    pub fn new(n: u64, theta: f64) -> Result<Self, String> {
        if !(theta > 0.0 && theta.is_finite()) || (theta - 1.0).abs() < 1e-9 {
            return Err(format!("-F {theta}: theta must be above 0 and not 1"));
        }
        let n = n.max(1);
        let zetan = zeta(n, theta);
        let zeta2 = zeta(2, theta);
        Ok(Self {
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        })
    }

    /// The slot for a uniform random 64-bit value.
    pub fn slot(&self, random: u64) -> u64 {
        // 53 random bits as a double in [0, 1).
        let u = (random >> 11) as f64 / (1u64 << 53) as f64;
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        let v = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        v.min(self.n - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(z: &Zipf, n: usize, draws: u64) -> Vec<u64> {
        let mut h = vec![0u64; n];
        let mut x = 0x1234_5678_9ABC_DEF1u64;
        for _ in 0..draws {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            h[z.slot(x) as usize] += 1;
        }
        h
    }

    #[test]
    fn popular_slots_first_and_all_in_range() {
        let n = 1000;
        let z = Zipf::new(n as u64, 1.2).unwrap();
        let h = histogram(&z, n, 200_000);
        // Weight of slot i is 1/(i+1)^1.2: slot 0 takes about 1/zeta(1000, 1.2) of all.
        let p0 = h[0] as f64 / 200_000.0;
        let expect0 = 1.0 / zeta(1000, 1.2);
        assert!((p0 - expect0).abs() < 0.02, "slot 0: {p0} vs {expect0}");
        assert!(h[0] > h[1] && h[1] > h[10] && h[10] > h[500]);
        let top10: u64 = h[..10].iter().sum();
        assert!(top10 > 200_000 / 2, "top 10 of 1000 slots: {top10}");
        let z = Zipf::new(n as u64, 0.5).unwrap();
        let h = histogram(&z, n, 200_000);
        assert!(
            h[0] > h[999] && h[999] > 0,
            "theta 0.5 still reaches the tail"
        );
    }

    #[test]
    fn bad_theta_and_tiny_ranges() {
        assert!(Zipf::new(10, 1.0).is_err());
        assert!(Zipf::new(10, 0.0).is_err());
        assert!(Zipf::new(10, -1.0).is_err());
        assert!(Zipf::new(10, f64::NAN).is_err());
        let z = Zipf::new(1, 1.2).unwrap();
        assert!((0..100u64).all(|r| z.slot(r.wrapping_mul(0x9E37_79B9_7F4A_7C15)) == 0));
    }

    #[test]
    fn zeta_estimate_is_close_past_the_exact_part() {
        // Summing 12 million terms exactly vs the estimate of the last 2 million.
        let exact: f64 = (1..=12_000_000u64).map(|i| (i as f64).powf(-0.8)).sum();
        let est = zeta(12_000_000, 0.8);
        // The trapezoid rule overestimates a convex sum slightly: well under 0.01%.
        assert!((exact - est).abs() / exact < 1e-4, "{exact} vs {est}");
    }
}

//! The counters a multipath namespace keeps on one queue set.

/// Counters of a multipath namespace on one queue set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MultipathStats {
    /// I/Os completed successfully through each path.
    pub path_ios: Vec<u64>,
    /// I/Os sent again (to another path, or after a transition delay) after a path error,
    /// an ANA status or a broken connection.
    pub failovers: u64,
    /// Completions with an ANA status (SCT 3h, SC 01h-03h).
    pub ana_errors: u64,
    /// I/Os failed because no path was usable within the fast-io-fail timeout (or all were
    /// lost).
    pub no_path_failures: u64,
    /// I/Os failed after [`MAX_PATH_RETRIES`](super::MAX_PATH_RETRIES) path retries.
    pub retries_exhausted: u64,
}

impl MultipathStats {
    pub fn merge(&mut self, o: &Self) {
        if self.path_ios.len() < o.path_ios.len() {
            self.path_ios.resize(o.path_ios.len(), 0);
        }
        for (a, b) in self.path_ios.iter_mut().zip(&o.path_ios) {
            *a += b;
        }
        self.failovers += o.failovers;
        self.ana_errors += o.ana_errors;
        self.no_path_failures += o.no_path_failures;
        self.retries_exhausted += o.retries_exhausted;
    }
}

//! What path selection is given: the policy, each path's view (link and ANA state) and
//! the retry clocks.

use std::time::Duration;

use super::ana::AnaState;

/// How I/O is spread over usable paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// The first Optimized path (in the order given), else the first Non-Optimized one.
    #[default]
    ActivePassive,
    /// Round robin over the Optimized paths (else over the Non-Optimized ones).
    ActiveActive,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "active_passive" | "active-passive" | "failover" => Ok(Self::ActivePassive),
            "active_active" | "active-active" | "round_robin" | "round-robin" => {
                Ok(Self::ActiveActive)
            }
            _ => Err(format!("{s:?}: expected active_passive or active_active")),
        }
    }
}

/// A path's connection as the I/O side sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Up,
    /// Broken; its controller is reconnecting.
    Down,
    /// Its controller gave up (ctrl_loss_tmo) or was deleted.
    Lost,
}

/// What selection needs to know of one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathView {
    pub link: Link,
    pub ana: AnaState,
}

impl PathView {
    pub const UP_OPTIMIZED: Self = Self {
        link: Link::Up,
        ana: AnaState::Optimized,
    };

    pub fn is_usable(&self) -> bool {
        self.link == Link::Up && self.ana.is_usable()
    }
}

/// Retry clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// Fail I/O once no path has been usable this long; `None` waits until every path is
    /// lost for good (SPDK's `fast_io_fail_timeout_sec` 0).
    pub fast_io_fail: Option<Duration>,
    /// Wait before retrying an I/O that got ANA Transition.
    pub transition_retry: Duration,
    /// ANA Transition Time (Identify Controller ANATT): an I/O that keeps getting ANA
    /// Transition for longer fails with that status.
    pub anatt: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            fast_io_fail: None,
            transition_retry: Duration::from_millis(100),
            anatt: Duration::from_secs(10),
        }
    }
}

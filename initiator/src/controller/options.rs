//! How to connect: [`ControllerOptions`], the [`Reconnect`] policy and whether commands get
//! their own memory-window keys ([`MemoryWindows`]).

use std::sync::Arc;
use std::time::Duration;

use nvmf_common::rdma::{Verbs, VerbsContext, VerbsPd};

use crate::transport::device_has_windows;

/// Reconnect policy (nvme-cli's `--reconnect-delay` and `--ctrl-loss-tmo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconnect {
    /// Time between attempts (the first one comes `delay` after the loss).
    pub delay: Duration,
    /// Give up this long after the loss; `None` retries forever (`--ctrl-loss-tmo -1`).
    pub ctrl_loss_tmo: Option<Duration>,
}

impl Default for Reconnect {
    /// Linux's defaults: every 10 s, for 600 s.
    fn default() -> Self {
        Self {
            delay: Duration::from_secs(10),
            ctrl_loss_tmo: Some(Duration::from_secs(600)),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Host NQN; else the transport ID's, else `/etc/nvme/hostnqn`, else generated.
    pub hostnqn: Option<String>,
    pub hostid: Option<[u8; 16]>,
    /// Keep Alive Timeout sent in the admin Connect; a Keep Alive goes out every half of it.
    /// Zero disables keep-alive. Discovery controllers always use zero (as Linux).
    pub kato: Duration,
    /// I/O queue pairs created by [`Controller::connect`](super::Controller::connect) (take
    /// them with [`Controller::take_io_qpairs`](super::Controller::take_io_qpairs)); at least
    /// this many are requested from the controller.
    pub io_queues: u16,
    /// I/O queues to ask the controller for (Set Features Number of Queues), for qpairs
    /// created later with [`Controller::create_io_qpair`](super::Controller::create_io_qpair);
    /// at least `io_queues` and 1.
    pub io_queues_requested: u16,
    /// Entries of each I/O queue (capped by the controller's CAP.MQES).
    pub io_queue_depth: u16,
    /// Limit for each RDMA CM step and for the Fabrics Connect.
    pub connect_timeout: Duration,
    /// Admin commands older than this fail and reset the controller.
    pub admin_timeout: Duration,
    /// I/O commands older than this reset the controller and fail with
    /// [`IoStatus::Timeout`](crate::qpair::IoStatus::Timeout) (with [`Reconnect`]: are
    /// retried after the reconnect).
    pub io_timeout: Duration,
    /// Send writes that fit in the controller's in-capsule data size inside the command.
    pub in_capsule_data: bool,
    /// Whether each command's data gets its own memory-window key (see
    /// [`MemoryWindows`]).
    pub memory_windows: MemoryWindows,
    pub reconnect: Option<Reconnect>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            hostnqn: None,
            hostid: None,
            kato: Duration::from_secs(5),
            io_queues: 0,
            io_queues_requested: 0,
            io_queue_depth: 128,
            connect_timeout: Duration::from_secs(10),
            admin_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(30),
            in_capsule_data: true,
            memory_windows: MemoryWindows::Auto,
            reconnect: None,
        }
    }
}

/// Per-command keys: each command's data gets its own memory-window key, which the target
/// invalidates with its response (Keyed SGL subtype Invalidate, 0x0F) or the queue
/// invalidates locally, as the Linux host does with fast registration; data pools are then
/// registered without remote access. Otherwise commands carry the pool registration's key
/// (ADDRESS subtype), as SPDK's host does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryWindows {
    /// Per-command keys where the device has type 2 memory windows, except on soft-RoCE
    /// (rxe). rxe (Linux 6.1) runs a bind or local invalidation a second time when a
    /// retransmission rewinds its send queue before that work request was retired: the
    /// second bind of the window fails (EINVAL; a kretprobe on `rxe_bind_mw` shows the
    /// same work request bound twice within a millisecond) and the queue breaks or loses
    /// the command. Any retransmission can trigger it, and rxe retransmits whenever its
    /// packets arrive out of order or are lost: on a veth pair shared by two CPUs, about
    /// one 4 MiB write in two failed. The pool's key is immune.
    #[default]
    Auto,
    /// Per-command keys whenever the device has type 2 memory windows.
    On,
    /// The pool registration's key.
    Off,
}

impl std::str::FromStr for MemoryWindows {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" | "1" => Ok(Self::On),
            "off" | "0" => Ok(Self::Off),
            _ => Err(format!("{s:?}: expected auto, on or off")),
        }
    }
}

impl MemoryWindows {
    /// Whether commands get their own keys on `pd`'s device.
    pub(super) fn enabled<V: Verbs>(self, pd: &Arc<V::Pd>) -> bool {
        match self {
            Self::Off => false,
            Self::On => device_has_windows::<V>(pd),
            Self::Auto => device_has_windows::<V>(pd) && !pd.context().is_soft_roce(),
        }
    }
}

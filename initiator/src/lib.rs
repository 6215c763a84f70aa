//! Userspace NVMe-oF host over RDMA.
//!
//! ```text
//! TransportId ──► Controller::connect ──► admin queue (bring-up, keep-alive, AER, reconnect)
//!   (address)          │                        polled by Controller::poll_admin
//!                      └──► IoQpair × N  (one per polling thread: submit with a tag and a
//!                                          registered IoBuf, poll completions)
//! discover(tid) ──► discovery controller ──► DiscoveryLog
//! ```
//!
//! - [`address`]: SPDK's transport ID strings (`trtype:RDMA adrfam:IPv4 traddr:... subnqn:...`,
//!   and fio's `key=value` form).
//! - [`transport`] (private): one RDMA queue: RDMA CM with the NVMe-oF private data, command
//!   slots, response receives, allocation-free polling.
//! - [`controller`]: the admin side, in the Linux host's bring-up order.
//! - [`multipath`] (the pure path-selection and ANA state machine) and [`path`]
//!   ([`MultipathQpair`]: one namespace over several controllers of a subsystem, with
//!   failover and failback as SPDK's bdev_nvme multipath).
//! - [`qpair`]: I/O queue pairs: Read / Write / Compare / Flush / Write Zeroes / Dataset
//!   Management over keyed SGLs (per-command keys), or in-capsule data for writes that fit.
//! - [`discovery`] (with [`attach_plan`]: the subsystems a transport ID without `subnqn`
//!   reaches), [`histogram`] (for `nvmf-perf`), [`host`] (host NQN and ID), [`size`]
//!   (SPDK's `4k` / `1m` sizes).
//!
//! # Data buffers and remote invalidation
//!
//! Data lives in [`BufferPool`](nvmf_common::buffer::BufferPool)s registered once on the
//! controller's protection domain ([`Controller::register_pool`]). Where the device has type 2
//! memory windows (see [`MemoryWindows`] for when they are used), each command gets its own key, as the Linux host
//! gets one from fast registration: the CID's window is bound over exactly the command's
//! buffer, with remote write for reads and remote read for writes, and the keyed SGL uses the
//! Invalidate-Key subtype (0x4F). The target answers with SEND_WITH_INVALIDATE of that key
//! (the kernel's nvmet-rdma does) or with a plain SEND, and then the queue posts a
//! LOCAL_INV; the command completes, and its buffer comes back, only once the key is
//! invalid. The pool itself is then registered without remote access, so a target can never
//! reach a buffer outside a command's window and lifetime. An invalidation of any other key
//! is a protocol violation and breaks the queue. Without windows commands carry the pool
//! registration's key with the ADDRESS subtype.
//!
//! # A C-callable wrapper (fio)
//!
//! One [`IoQpair`] per fio thread: `submit(cmd, buf, dir, tag)` (or `read`/`write` with the
//! fio `io_u` index as the tag), then `poll(&mut completions)` and hand each tag and status
//! back; buffers come from a pool registered with the controller.
#![forbid(unsafe_code)]

pub mod address;
pub mod controller;
pub mod discovery;
pub mod error;
pub mod histogram;
pub mod host;
pub mod multipath;
pub mod path;
pub mod qpair;
pub mod size;
mod transport;

pub use address::TransportId;
pub use controller::{
    Controller, ControllerEvent, ControllerInfo, ControllerOptions, MemoryWindows, NamespaceInfo,
    Reconnect, ADMIN_QUEUE_DEPTH,
};
pub use discovery::{
    attach_plan, discover, discover_with, read_discovery_log, AttachPlan, DiscoveryEntry,
    DiscoveryLog,
};
pub use error::{Error, Result};
pub use histogram::Histogram;
pub use host::HostIdentity;
pub use multipath::{AnaLog, AnaState, MultipathStats, NamespaceIds, Policy, Timers};
pub use path::{MultipathQpair, NamespacePath, PathHandle};
pub use qpair::{
    DataDir, IoCompletion, IoQpair, IoStatus, QpairState, QpairStats, SubmitError, SubmitErrorKind,
    MAX_RETRIES,
};

/// Logging for the command-line tools: `RUST_LOG` (default `warn`) to stderr, coloured when
/// stderr is a terminal, so stdout stays the tool's output (`--json`, hex dumps).
pub fn init_tool_logging() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

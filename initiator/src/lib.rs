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
//! - [`qpair`]: I/O queue pairs: Read / Write / Compare / Flush / Write Zeroes / Dataset
//!   Management over keyed SGLs, or in-capsule data for writes that fit.
//! - [`discovery`], [`histogram`] (for `nvmf-perf`), [`host`] (host NQN and ID).
//!
//! # Data buffers and remote invalidation
//!
//! Data lives in [`BufferPool`](nvmf_common::buffer::BufferPool)s registered once on the
//! controller's protection domain ([`Controller::register_pool`]); each command names its
//! buffer with the pool's rkey. Because that key covers the whole pool and outlives every
//! command, keyed SGLs always use the ADDRESS subtype, never the Invalidate-Key subtype (0x4F):
//! a target honouring 0x4F would revoke the pool's key. A target that invalidates anyway (a
//! receive completion flagged with an invalidated rkey, including rxe's kernel-valued flag) is
//! a protocol violation and breaks the queue. Per-command keys (memory windows bound per I/O,
//! 0x4F, and a local invalidate when the target did not send with invalidate) would be needed
//! to offer remote invalidation; the verbs layer has memory windows, this crate does not use
//! them yet.
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
pub mod qpair;
mod transport;

pub use address::TransportId;
pub use controller::{
    Controller, ControllerEvent, ControllerInfo, ControllerOptions, NamespaceInfo, Reconnect,
    ADMIN_QUEUE_DEPTH,
};
pub use discovery::{discover, read_discovery_log, DiscoveryEntry, DiscoveryLog};
pub use error::{Error, Result};
pub use histogram::Histogram;
pub use host::HostIdentity;
pub use qpair::{
    DataDir, IoCompletion, IoQpair, IoStatus, QpairState, QpairStats, SubmitError, SubmitErrorKind,
};

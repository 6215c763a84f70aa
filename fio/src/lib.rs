//! Rust side of the fio external ioengine `nvmf`: fio drives the userspace initiator
//! directly, as SPDK's `ioengine=spdk` does.
//!
//! ```text
//! fio ──► fio/engine/nvmf_fio.c (GPL shim: struct ioengine_ops, built against fio 3.33's headers)
//!            │  a handful of C calls (fio/engine/nvmf_fio.h)
//!            ▼
//!         ffi ──► engine::EngineThread (one per fio thread: qpairs, in-flight slots, events)
//!                    └──► registry (one Controller per address, shared by the threads;
//!                                   an admin thread each for keep-alive / AER / reconnect)
//! ```
//!
//! Usage (built by `fio/build-engine.sh`):
//! `fio --ioengine=external:build/release/libnvmf_fio_engine.so --thread=1
//!  --filename='trtype=RDMA adrfam=IPv4 traddr=10.0.0.1 trsvcid=4420 subnqn=NQN ns=1' ...`
//! (fio splits file names at `:`; write `\:` inside an NQN).
//!
//! - Each fio thread gets one I/O qpair of its `iodepth` per controller it uses; several
//!   namespaces of one controller share it. Submissions go out at once (no `commit`);
//!   `getevents` polls (without sleeping unless told to: [`engine::Idle`]).
//! - An `io_u` above the controller's maximum transfer (MDTS) goes out as several commands
//!   and completes when all did ([`split`]).
//! - Data moves without copying when fio's buffers come from the engine (see [`engine`]),
//!   else through registered bounce buffers with one copy.
//! - Read, Write, Trim (Dataset Management, deallocate) and fsync (Flush).
//!
//! `unsafe` lives in [`ffi`] only: raw pointers from C and fio's buffers.
#![deny(unsafe_code)]

/// Writes `nvmf: <message>` to stderr, where fio's own messages go; never panics.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "nvmf: {}", format_args!($($arg)*));
    }};
}

pub mod engine;
pub mod error;
pub mod ffi;
pub mod registry;
pub mod spdk_options;
pub mod split;

pub use engine::{EngineOptions, EngineThread, Event, Idle, Op, Queued};
pub use error::EngineError;

//! JSON-RPC control plane speaking SPDK's method names and parameters.
//!
//! This crate knows the wire, not the target: [`server`] frames JSON-RPC 2.0 over a Unix socket
//! (or TCP) exactly as SPDK's `rpc.py` speaks it and forwards each call to a dispatch closure the
//! target supplies; [`client`] is the other end, used by the `nvmf-rpc` command-line tool and
//! by tests. The method table itself lives in the target crate (`nvmf_target::rpc`).
#![forbid(unsafe_code)]

pub mod client;
mod error;
pub mod server;

pub use error::{RpcError, ServeError};
pub use server::{
    build_module, group_id, serve_tcp, serve_unix, AuthToken, CallFn, ServerHandle, ServerOptions,
};

/// Where SPDK applications listen by default, and so where `rpc.py` (and `nvmf-rpc`) connect
/// when given no `-s`.
pub const DEFAULT_SOCKET_PATH: &str = "/var/tmp/spdk.sock";

//! JSON-RPC control plane speaking SPDK's method names and parameters.
#![forbid(unsafe_code)]

mod error;

pub use error::RpcError;

//! JSON-RPC control plane speaking SPDK's method names and parameters.
#![forbid(unsafe_code)]

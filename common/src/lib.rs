//! Shared ground for the target and the initiator: the NVMe / NVMe-oF wire formats (`spec`),
//! the safe RDMA verbs layer (`rdma`) and registered buffer pools, and per-core reactors.
#![deny(unsafe_code)]

pub mod buffer;
mod free_stack;
#[allow(unsafe_code)]
pub mod rdma;
pub mod reactor;
pub mod spec;

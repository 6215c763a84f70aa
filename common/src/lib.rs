//! Shared ground for the target and the initiator: the NVMe / NVMe-oF wire formats (`spec`),
//! the safe RDMA verbs layer (`rdma`) and registered buffer pools, and per-core reactors.
#![deny(unsafe_code)]

pub mod buffer;
pub mod spec;

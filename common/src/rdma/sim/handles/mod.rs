//! The provider's object handles and their [`Verbs`](crate::rdma::verbs::Verbs) trait
//! implementations.
//!
//! Every handle is an id into the fabric's state plus `Arc`s of its parents (as the real
//! types hold theirs), so destruction order falls out of reference counting. Each verb
//! takes the fabric lock, changes state, and returns; `Drop` destroys synchronously. The
//! lock is never held while anything outside the simulator runs (memory owners are dropped
//! after it is released).
//!
//! One file per kind of handle: `provider` (the `Verbs` entry points that create them),
//! `context`, `memory` (protection domains and registered regions), `queues` (CQs, SRQs,
//! QPs) and `cm` (event channels and CM ids). Their fields are
//! visible across these files (the provider and `create_qp` assemble handles), nowhere else.

mod cm;
mod context;
mod memory;
mod provider;
mod queues;

pub use cm::{SimChannel, SimCmId};
pub use context::SimContext;
pub use memory::{SimMr, SimPd};
pub use queues::{SimCq, SimQp, SimSrq};

fn os(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

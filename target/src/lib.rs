//! The NVMe-oF target: subsystems, controllers and the command sets (`core`, `cmd`), block
//! device backends (`bdev`) and transports behind one interface (`transport`).
#![deny(unsafe_code)]

pub mod bdev;
pub mod cmd;
pub mod core;
pub mod doctor;
pub mod exit_on_panic;
pub mod metrics;
pub mod reactor;
pub mod rpc;
pub mod target;
pub mod transport;

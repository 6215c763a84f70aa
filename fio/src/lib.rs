//! Rust side of the fio external ioengine.
#![forbid(unsafe_code)]

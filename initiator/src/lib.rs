//! Userspace NVMe-oF host.
#![forbid(unsafe_code)]

//! Helpers shared by the end-to-end tests.
#![forbid(unsafe_code)]

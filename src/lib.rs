//! cutover: an HTTP and L4 gateway whose configuration changes in generations.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod config;
pub mod ids;
pub mod plan;
pub mod generation;
pub mod telemetry;

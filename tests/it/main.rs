//! Integration tests: the real `cutover` binary on ephemeral loopback ports.

mod admin;
mod fixtures;
mod harness;
mod proxy;
mod reload;

//! Integration tests: the real `cutover` binary on ephemeral loopback ports.

mod harness;
mod proxy;
mod reload;
mod fixtures;

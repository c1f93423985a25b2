//! Integration tests: the real `cutover` binary on ephemeral loopback ports.

mod admin;
mod auth;
mod compress;
mod cors;
mod docs;
mod edge;
pub mod examples;
mod filters;
mod fixtures;
mod fleet;
mod grpc;
mod guarded;
mod harness;
mod http3;
mod impact;
mod keys;
mod l4;
mod layers;
mod lifecycle;
pub mod observability;
mod pki;
mod proxy;
mod reload;
mod resilience;
mod shadow;
mod tls;
mod watch;

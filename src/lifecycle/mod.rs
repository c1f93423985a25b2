//! Lifecycle: start-up, signals, drain, and drain-aware restarts.
//!
//! `run` chooses what to start from (a handed-over state, the persisted
//! active generation, or the configuration file), builds the tokio runtime
//! (its thread count is startup-owned), binds or adopts every socket, and
//! then reacts to signals: SIGHUP reloads the file, SIGUSR2 upgrades,
//! SIGTERM drains, SIGINT stops at once. `handover` is the only place that
//! may use `unsafe` (adopting inherited descriptors).

mod control_server;
mod handover;
mod startup;
mod systemd;
mod upgrade;

pub use startup::{run, Options, StartError};

//! Lifecycle: start-up, signals, drain, and drain-aware restarts.
//!
//! `run` chooses what to start from (a handed-over state, the persisted
//! active generation, or the configuration file), builds the tokio runtime
//! (its thread count is startup-owned), binds or adopts every socket, and
//! then reacts to signals: SIGHUP reloads the file, SIGUSR2 upgrades,
//! SIGTERM drains, SIGINT stops at once. The only `unsafe` of cutover is
//! here: adopting inherited descriptors (`handover`) and asking the
//! allocator to return free pages (`memory`).

mod control_server;
mod handover;
mod memory;
mod running;
mod startup;
mod stop;
mod systemd;
mod upgrade;
mod watch;

pub use memory::{hold_huge_pages, release_memory};
pub use startup::{run, Options, StartError};

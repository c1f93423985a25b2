//! Lifecycle: start-up, signals, drain and shutdown.
//!
//! `run` reads and validates the configuration, builds the tokio runtime
//! (its thread count is startup-owned), resumes history from the state dir,
//! builds generation 1 (or resumes the persisted active one), binds every
//! socket, and then reacts to signals: SIGHUP reloads the configuration
//! file, SIGTERM drains, SIGINT stops at once.

mod startup;

pub use startup::{run, Options, StartError};

//! The runtime: the active generation, its history, and persistence.

pub mod events;
mod history;
pub mod proposals;
pub mod shadow;
mod store;
pub mod webhooks;

pub use history::*;
pub use store::{Active, Canary, Conflict, GenerationLoad, GenerationStore};

mod phase;
pub use phase::{Phase, PhaseCell};

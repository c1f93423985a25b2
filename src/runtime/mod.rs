//! The runtime: the active generation, its history, and persistence.

mod history;
mod store;

pub use history::*;
pub use store::{Canary, Conflict, GenerationLoad, GenerationStore};

mod phase;
pub use phase::{Phase, PhaseCell};

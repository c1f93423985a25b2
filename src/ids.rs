//! Identifiers that cross module boundaries, as newtypes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A runtime generation's id: strictly increasing from 1, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GenerationId(pub u64);

impl GenerationId {
    /// The id the configuration a process starts with gets.
    pub const FIRST: GenerationId = GenerationId(1);

    /// The id after this one.
    pub fn next(self) -> GenerationId {
        GenerationId(self.0.saturating_add(1))
    }
}

impl fmt::Display for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

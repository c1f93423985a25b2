//! Identifiers that cross module boundaries, as newtypes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A runtime generation's id: strictly increasing from 1, never reused.
/// The default, 0, names none (a fleet before its first generation).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct GenerationId(pub u64);

impl GenerationId {
    /// The id the configuration a process starts with gets.
    pub const FIRST: GenerationId = GenerationId(1);

    /// No generation (a fleet before its first).
    pub const NONE: GenerationId = GenerationId(0);

    /// The id after this one.
    pub fn next(self) -> GenerationId {
        GenerationId(self.0.saturating_add(1))
    }
}

impl std::str::FromStr for GenerationId {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(GenerationId)
    }
}

impl fmt::Display for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

//! The shadow stage's slot on the control plane (DESIGN §22): the stage
//! running, for `abort` and a drain to stop it, and the report of the
//! last one that ended. `shadow.rs` is what the control plane does with
//! it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::ids::GenerationId;
use crate::runtime::shadow::ShadowReport;

/// The shadow stage running (for `abort`, DESIGN §22), and the report of
/// the last one that ended.
#[derive(Default)]
pub(super) struct ShadowSlot {
    running: Mutex<Option<ShadowRun>>,
    last: Mutex<Option<ShadowReport>>,
}

impl ShadowSlot {
    pub(super) fn running(&self) -> MutexGuard<'_, Option<ShadowRun>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn last(&self) -> MutexGuard<'_, Option<ShadowReport>> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A shadow stage in progress, for `abort`.
pub(super) struct ShadowRun {
    pub(super) candidate: GenerationId,
    pub(super) stop: Arc<tokio::sync::Notify>,
}

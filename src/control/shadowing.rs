//! The shadow stage's slot on the control plane (DESIGN §22): the stage
//! running, for `abort` and a drain to stop it, and the report of the
//! last one that ended. `shadow.rs` is what the control plane does with
//! it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::ids::GenerationId;
use crate::runtime::shadow::ShadowReport;
use crate::runtime::GenerationStore;

/// The shadow stage running (for `abort`, DESIGN §22), and the report of
/// the last one that ended.
#[derive(Default)]
pub(super) struct ShadowSlot {
    running: Mutex<Option<ShadowRun>>,
    last: Mutex<Option<ShadowReport>>,
}

impl ShadowSlot {
    fn running(&self) -> MutexGuard<'_, Option<ShadowRun>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn last(&self) -> MutexGuard<'_, Option<ShadowReport>> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes the stage of `candidate` as running; returns what stops it.
    pub(super) fn begin(&self, candidate: GenerationId) -> Arc<tokio::sync::Notify> {
        let stop = Arc::new(tokio::sync::Notify::new());
        *self.running() = Some(ShadowRun {
            candidate,
            stop: Arc::clone(&stop),
        });
        stop
    }

    /// Notes the running stage as ended with `report`.
    pub(super) fn end(&self, report: ShadowReport) {
        *self.running() = None;
        *self.last() = Some(report);
    }

    /// Stops the stage of `candidate`, if one runs (its activation is
    /// refused: 409 `shadow_aborted`); `false` when none does.
    pub(super) fn abort(&self, candidate: GenerationId) -> bool {
        let running = self.running();
        match running.as_ref().filter(|run| run.candidate == candidate) {
            Some(run) => {
                run.stop.notify_one();
                true
            }
            None => false,
        }
    }

    /// Waits (at most 2 s) until the stage of `candidate` has ended and
    /// recorded its refusal.
    pub(super) async fn ended(&self, candidate: GenerationId) {
        for _ in 0..200 {
            let running = self
                .running()
                .as_ref()
                .is_some_and(|run| run.candidate == candidate);
            if !running {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// The stage now running in `store` (its report so far), or else the
    /// last one that ended.
    pub(super) fn report(&self, store: &GenerationStore) -> Option<ShadowReport> {
        match store.shadow() {
            Some(shadow) => Some(shadow.report()),
            None => self.last().clone(),
        }
    }
}

/// A shadow stage in progress, for `abort`.
struct ShadowRun {
    candidate: GenerationId,
    stop: Arc<tokio::sync::Notify>,
}

//! The one-writer rule: one mutating operation at a time (409
//! `operation_in_progress` while another runs), and no change while the
//! process drains (503). An upgrade holds the lock until the new process
//! has taken over or failed.

use std::sync::Arc;

use super::error::ControlError;
use crate::runtime::{Phase, PhaseCell};

/// The operation lock and the lifecycle phase it checks.
pub(super) struct OperationLock {
    held: Arc<tokio::sync::Mutex<()>>,
    phase: Arc<PhaseCell>,
}

impl OperationLock {
    pub(super) fn new(phase: Arc<PhaseCell>) -> Self {
        Self {
            held: Arc::new(tokio::sync::Mutex::new(())),
            phase,
        }
    }

    /// The lock, unless another operation holds it (409).
    pub(super) fn take(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, ControlError> {
        self.held.try_lock().map_err(|_| ControlError::InProgress)
    }

    /// The lock for a configuration change: also refused while draining.
    pub(super) fn take_for_change(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, ControlError> {
        let guard = self.take()?;
        self.check_running()?;
        Ok(guard)
    }

    /// The lock for as long as its holder needs (a shadow stage, an
    /// upgrade): `None` while another operation holds it.
    pub(super) fn take_owned(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        Arc::clone(&self.held).try_lock_owned().ok()
    }

    /// Waits until no operation holds the lock (at most `within`);
    /// whether it got there.
    pub(super) async fn wait_idle(&self, within: std::time::Duration) -> bool {
        tokio::time::timeout(within, self.held.lock()).await.is_ok()
    }

    /// 503 while draining or stopped.
    pub(super) fn check_running(&self) -> Result<(), ControlError> {
        running(&self.phase)
    }

    pub(super) fn phase(&self) -> &Arc<PhaseCell> {
        &self.phase
    }
}

/// 503 while draining or stopped: no change is made then.
pub(super) fn running(phase: &PhaseCell) -> Result<(), ControlError> {
    match phase.get() {
        Phase::Draining | Phase::Stopped => Err(ControlError::Draining),
        Phase::Starting | Phase::Running => Ok(()),
    }
}

//! What process-level operations (drain, drain-aware restart) take and
//! answer, as the control plane sees them. `lifecycle` implements
//! `ProcessControl` (`local.rs`); the admin API reaches it through
//! `Control` so that it talks to one thing only.

use crate::plan::Plan;

/// A drain-aware restart request.
#[derive(Debug, Clone, Default)]
pub struct UpgradeRequest {
    /// A candidate to start the new process with (restart-required changes
    /// allowed); `None` restarts on the active configuration.
    pub config: Option<String>,
    /// The executable to start instead of the one this process was
    /// started from (`ctl upgrade --binary`); absolute, checked before use.
    pub binary: Option<std::path::PathBuf>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    pub caller: Option<String>,
    /// How the active configuration's freeze windows apply to it.
    pub freeze: super::candidate::FreezeRule,
    /// The window it goes through by `override` (set by
    /// `Control::upgrade`), for its record.
    pub overrode_freeze: Option<crate::plan::Frozen>,
    /// The callers that approved it (a proposal carried out).
    pub approved_by: Vec<String>,
}

/// The executable a process runs, as status reports it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BinaryView {
    /// The path the process was started from, resolved at start-up; an
    /// upgrade starts whatever file is at this path then.
    pub path: std::path::PathBuf,
    /// `sha256:<hex>` of the image this process runs (`null` for the
    /// moment it takes to compute, once, after the first status call).
    pub sha256: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("the gateway is already draining")]
    AlreadyDraining,
    #[error("the gateway is draining")]
    Draining,
    #[error("another upgrade or configuration change is in progress")]
    UpgradeRunning,
    #[error("the upgrade candidate is invalid ({} errors)", .0.errors.len())]
    Invalid(Box<Plan>),
    #[error("this process cannot be drained or upgraded from here")]
    Unavailable,
    #[error("cannot start the new process: {0}")]
    Failed(String),
    #[error("{0}")]
    Binary(String),
    /// A freeze window of the active configuration holds (DESIGN §23).
    #[error("{0}")]
    Frozen(Box<crate::plan::Frozen>),
}

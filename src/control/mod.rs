//! The control plane: the single local writer of the active generation.
//!
//! Every change on this instance goes through here, from the writer
//! (`writer.rs`: admin API, SIGHUP), the fleet or start-up: read the
//! candidate, plan it against the active generation, build the next
//! generation, bind the listeners it adds, compare-and-swap, record
//! history, persist. Everything fallible happens before the swap; one
//! mutating operation runs at a time. By concern: `operations.rs` (what a
//! writer calls), `commit.rs` (the one commit path and the rules before
//! it), `guarded.rs` (the pending generation), `views.rs` (what status and
//! history show), `certs.rs`, `candidate.rs`, `process.rs`, `error.rs`.
//! It knows nothing of fleets: the fleet sits above it.

mod candidate;
mod certs;
mod commit;
mod error;
mod guarded;
mod keeper;
mod operations;
mod process;
mod shadow;
mod timeline;
mod views;

#[cfg(test)]
pub(crate) mod tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

pub use candidate::read as read_candidate;
pub use candidate::{
    CanarySpec, Candidate, CandidateError, CandidateSource, GuardSpec, ShadowSpec,
};
pub use certs::{CertReload, CertView, ListenerCerts};
use commit::plan_summary;
pub use commit::{admit_change, operation_kind_name, Expectation};
pub use error::ControlError;
#[cfg(feature = "fleet")]
pub(crate) use guarded::{judge, Verdict};
pub use keeper::{AcmeStatus, CertificateStatus, OcspStatus};
pub use process::{BinaryView, LifecycleError, ProcessControl, UpgradeRequest};
#[cfg(feature = "fleet")]
pub(crate) use shadow::judge as judge_shadow;
pub use shadow::ShadowHandle;
pub use timeline::TimelineView;
pub use views::*;

use crate::config::ConfigText;
use crate::generation::{self, Generation, SharedState};
use crate::ids::GenerationId;
use crate::plan::{self, Diff, Plan};
use crate::proxy::{BindError, ListenerInfo, ListenerSet};
use crate::runtime::{
    rfc3339, GenerationRecord, GenerationStore, History, OperationKind, OperationRecord, Outcome,
    Phase, PhaseCell, RetainedText, Source,
};
use crate::telemetry::metrics as m;
use crate::telemetry::LogLevel;

/// The result of activate, reload and rollback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Activation {
    pub outcome: Cow<'static, str>,
    pub generation: GenerationId,
    pub previous_generation: GenerationId,
    pub config_version: String,
    pub rolled_back_to: Option<GenerationId>,
    pub duration_ms: u64,
    pub listeners: Vec<ListenerInfo>,
    pub diff: Diff,
    pub operation_id: String,
    /// Set when the activation must be confirmed (`confirm_within`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingView>,
    /// What its shadow stage showed, when it had one (DESIGN §22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<crate::runtime::shadow::ShadowReport>,
}

/// A generation on probation (DESIGN §14): active, and rolled back to
/// `rollback_to` unless confirmed by `deadline`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingView {
    pub generation: GenerationId,
    /// The last final generation: what a missed deadline or an abort
    /// brings back.
    pub rollback_to: GenerationId,
    /// `null` for a guard without `confirm_within`: its window decides.
    pub deadline: Option<String>,
    pub seconds_left: Option<f64>,
    /// During canary steps: the share of new requests it takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary_percent: Option<u8>,
}

/// The pending generation, while there is one: what settles it, and
/// (persisted as a `PendingRecord`) what a restart needs to resume it.
#[derive(Debug, Clone)]
struct Pending {
    generation: GenerationId,
    rollback_to: GenerationId,
    /// `confirm_within`; none when a guard or a canary alone settles it.
    deadline: Option<Deadline>,
    guard: Option<GuardSpec>,
    canary: Option<CanarySpec>,
    /// The canary step it is on: an index into `canary.steps`.
    step: usize,
}

/// A confirm deadline, on the timer's clock and on the wall clock (which
/// is what survives a restart).
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: tokio::time::Instant,
    wall: SystemTime,
}

/// Answers of one generation over a guard's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Answers {
    pub(crate) requests: u64,
    pub(crate) errors: u64,
}

/// The previous generation's answers since a guard started: what the
/// pending generation is compared with over the same window.
pub(crate) struct Baseline {
    ledger: Option<Arc<crate::generation::Ledger>>,
    start: Answers,
}

/// How a pending generation is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Confirm,
    Abort,
    /// The deadline passed (the gateway's own timer).
    Expired,
}

/// A request to confirm or abort the pending generation.
#[derive(Debug, Clone)]
pub struct SettleRequest {
    pub generation: GenerationId,
    pub expected_active_generation: Option<GenerationId>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
}

/// What confirm and abort answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settled {
    pub outcome: Cow<'static, str>,
    /// The active generation after it: the confirmed one, or the one the
    /// rollback minted.
    pub generation: GenerationId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<GenerationId>,
    pub operation_id: String,
}

/// A plan with the operation it was recorded as (preview).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordedPlan {
    #[serde(flatten)]
    pub plan: Plan,
    pub operation_id: String,
}

/// Metadata of a commit, for history.
struct CommitMeta {
    kind: OperationKind,
    source: Source,
    rolled_back_to: Option<GenerationId>,
    requester: Requester,
    text: ConfigText,
    /// The canary the new generation starts with, published with it in
    /// one swap (whatever canary ran before ends in the same swap).
    canary: Option<crate::runtime::Canary>,
}

/// What the control plane is built from.
pub struct ControlParts {
    pub store: Arc<GenerationStore>,
    pub shared: Arc<SharedState>,
    pub listeners: Arc<ListenerSet>,
    pub certificates: Arc<crate::tls::CertStore>,
    pub history: History,
    /// The configuration file the process was started with.
    pub config_file: PathBuf,
    pub log_level: LogLevel,
    pub phase: Arc<PhaseCell>,
    /// See `Options::release_memory`.
    pub release_memory: fn(),
}

/// How the configuration file's text becomes the text it activates.
pub type FileComposer = Box<dyn Fn(String) -> String + Send + Sync>;

/// The control plane of one process.
pub struct Control {
    store: Arc<GenerationStore>,
    shared: Arc<SharedState>,
    listeners: Arc<ListenerSet>,
    certificates: Arc<crate::tls::CertStore>,
    history: Mutex<History>,
    /// Held by every mutating operation; an upgrade holds it until the new
    /// process has taken over (or failed).
    operation: Arc<tokio::sync::Mutex<()>>,
    config_file: PathBuf,
    log_level: LogLevel,
    phase: Arc<PhaseCell>,
    process: std::sync::OnceLock<Arc<dyn ProcessControl>>,
    release_memory: fn(),
    /// Each retained generation's `rollback_candidate`, computed against
    /// the active generation named here: once per activation, not once
    /// per history request (planning a large configuration takes
    /// milliseconds: `docs/performance.md`).
    candidacy: Mutex<(GenerationId, HashMap<GenerationId, bool>)>,
    /// The generation awaiting confirmation, if any (changed only under
    /// the operation lock).
    pending: Mutex<Option<Pending>>,
    /// What the configuration file makes when activated, when that is
    /// not the file itself (a fleet instance's file is composed with the
    /// shared document it serves): set once, by whoever composes it.
    file_composer: std::sync::OnceLock<FileComposer>,
    /// See `file_matches_active`.
    #[allow(clippy::type_complexity)]
    file_match: Mutex<Option<(GenerationId, Option<(u64, Option<SystemTime>)>, bool)>>,
    /// The shadow stage running, for `abort` (DESIGN §22).
    shadowing: Mutex<Option<shadow::ShadowRun>>,
    /// The report of the last shadow stage that ended.
    last_shadow: Mutex<Option<crate::runtime::shadow::ShadowReport>>,
    /// The console's last 15 minutes (`timeline.rs`).
    timeline: Mutex<timeline::Timeline>,
    /// In a fleet: where ACME orders, certificates and challenge answers
    /// are shared (set once by the fleet, which outlives nothing here:
    /// weak, as the fleet holds this control plane).
    certificate_share: std::sync::OnceLock<std::sync::Weak<dyn crate::acme::Shared>>,
}

impl Control {
    pub fn new(parts: ControlParts) -> Self {
        Self {
            store: parts.store,
            shared: parts.shared,
            listeners: parts.listeners,
            certificates: parts.certificates,
            history: Mutex::new(parts.history),
            operation: Arc::new(tokio::sync::Mutex::new(())),
            config_file: parts.config_file,
            log_level: parts.log_level,
            phase: parts.phase,
            process: std::sync::OnceLock::new(),
            release_memory: parts.release_memory,
            candidacy: Mutex::new((GenerationId(0), HashMap::new())),
            pending: Mutex::new(None),
            file_match: Mutex::new(None),
            file_composer: std::sync::OnceLock::new(),
            shadowing: Mutex::new(None),
            last_shadow: Mutex::new(None),
            timeline: Mutex::default(),
            certificate_share: std::sync::OnceLock::new(),
        }
    }

    /// Orders ACME certificates with the fleet's instances through
    /// `shared` (once, when the fleet starts).
    pub fn share_certificates(&self, shared: std::sync::Weak<dyn crate::acme::Shared>) {
        let _ = self.certificate_share.set(shared);
    }

    fn certificate_share(&self) -> Option<Arc<dyn crate::acme::Shared>> {
        self.certificate_share.get()?.upgrade()
    }

    /// Says how the configuration file's text becomes the text it
    /// activates (once, at start-up; see `file_composer`).
    pub fn compose_file_with(&self, composer: FileComposer) {
        if self.file_composer.set(composer).is_err() {
            tracing::error!(
                "the configuration file's composer was set twice; the second is ignored"
            );
        }
    }

    pub fn store(&self) -> &Arc<GenerationStore> {
        &self.store
    }

    pub fn listeners(&self) -> &Arc<ListenerSet> {
        &self.listeners
    }

    pub fn phase(&self) -> &Arc<PhaseCell> {
        &self.phase
    }

    pub fn config_file(&self) -> &std::path::Path {
        &self.config_file
    }

    fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the operation lock for a long operation (an upgrade); `None`
    /// while another mutating operation runs.
    pub fn try_exclusive(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        Arc::clone(&self.operation).try_lock_owned().ok()
    }

    /// Runs `f` on the history (upgrade bookkeeping) and persists it.
    pub fn with_history<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        let mut history = self.history();
        let out = f(&mut history);
        if let Err(error) = history.persist() {
            tracing::error!(%error, "cannot persist history");
        }
        out
    }

    /// The configuration text of the active generation, as retained.
    pub fn active_config(&self) -> Option<ConfigText> {
        self.config_of(self.store.active_id())
    }

    /// The configuration text generation `id` was activated with, once
    /// history has recorded it (an activation publishes first, then
    /// records).
    pub(crate) fn config_of(&self, id: GenerationId) -> Option<ConfigText> {
        let history = self.history();
        let record = history.generation(id)?;
        match record.config_text() {
            Ok(text) => Some(text),
            Err(error) => {
                tracing::error!(%error, "cannot read the active configuration");
                None
            }
        }
    }

    /// Records the start of a long operation; returns its id.
    pub fn record_started(
        &self,
        kind: OperationKind,
        requested_by: Option<String>,
        reason: Option<String>,
        summary: String,
    ) -> String {
        self.record(
            kind,
            Instant::now(),
            Outcome::Running,
            (Some(self.store.active_id()), None),
            &Requester {
                requested_by,
                reason,
            },
            summary,
            None,
        )
    }
}

/// Who asked for an operation and why, as the operation log keeps it.
#[derive(Debug, Clone, Default)]
pub struct Requester {
    pub requested_by: Option<String>,
    pub reason: Option<String>,
}

impl Requester {
    pub fn of(candidate: &Candidate) -> Self {
        Self {
            requested_by: candidate.requested_by.clone(),
            reason: candidate.reason.clone(),
        }
    }
}

/// A rollback request.
#[derive(Debug, Clone)]
pub struct RollbackRequest {
    pub target_generation: GenerationId,
    pub expected_active_generation: Option<GenerationId>,
    pub reason: Option<String>,
    pub requested_by: Option<String>,
}

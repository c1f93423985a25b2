//! The control plane: the single writer of the active generation.
//!
//! Every change goes through here, from the admin API, SIGHUP or start-up:
//! read the candidate, plan it against the active generation, build the
//! next generation, bind the listeners it adds, compare-and-swap, record
//! history, persist. Everything fallible happens before the swap; one
//! mutating operation runs at a time.

mod candidate;
mod certs;
mod process;
mod views;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

pub use candidate::read as read_candidate;
pub use candidate::{CanarySpec, Candidate, CandidateError, CandidateSource, GuardSpec};
pub use certs::{CertReload, CertView, ListenerCerts};
pub use process::{BinaryView, LifecycleError, ProcessControl, UpgradeRequest};
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

/// Why an operation did not succeed. The admin API maps each variant to
/// its status code in one place.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Candidate(#[from] CandidateError),
    #[error("the candidate configuration is invalid ({} errors)", .0.errors.len())]
    Invalid(Box<Plan>),
    #[error("the candidate needs a drain-aware restart ({} restart-required changes)", .0.rejected.len())]
    RestartRequired(Box<Plan>),
    #[error("expected generation {expected} but generation {active} is active")]
    Conflict {
        expected: GenerationId,
        active: GenerationId,
    },
    #[error("another operation is in progress")]
    InProgress,
    #[error("this gateway requires expected_generation on every activation")]
    ExpectedGenerationRequired,
    #[error("the gateway is draining and accepts no configuration changes")]
    Draining,
    #[error("{source}")]
    Bind { source: BindError, plan: Box<Plan> },
    #[error("building the generation failed: {source}")]
    Build {
        source: generation::BuildError,
        plan: Box<Plan>,
    },
    #[error("generation {0} is not retained")]
    NotRetained(GenerationId),
    #[error("generation {0} is already active")]
    TargetActive(GenerationId),
    #[error("listener '{0}' is not a TLS listener of the active configuration")]
    NotTlsListener(String),
    #[error("listener '{listener}': {source}")]
    Certificate {
        listener: String,
        source: crate::tls::TlsError,
    },
    #[error("internal error: {0}")]
    Internal(String),
    #[error("generation {target} can no longer be activated")]
    NotActivatable {
        target: GenerationId,
        plan: Box<Plan>,
    },
    #[error("generation {pending} is pending confirmation: confirm or abort it, or name it as expected_generation to supersede it")]
    PendingActivation { pending: GenerationId },
    #[error("generation {0} is not pending")]
    NotPending(GenerationId),
    /// Fleet mode: etcd did not answer, so nothing was changed.
    #[error("the fleet's etcd cannot be reached: {0}")]
    FleetUnavailable(String),
    /// Fleet mode: an operation that works on one instance only.
    #[error("{0}")]
    FleetUnsupported(&'static str),
}

/// The result of activate, reload and rollback.
#[derive(Debug, Clone, Serialize)]
pub struct Activation {
    pub outcome: &'static str,
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
}

/// A generation on probation (DESIGN §14): active, and rolled back to
/// `rollback_to` unless confirmed by `deadline`.
#[derive(Debug, Clone, Serialize)]
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

impl Deadline {
    fn after(within: Duration) -> Self {
        Self {
            at: tokio::time::Instant::now() + within,
            wall: SystemTime::now() + within,
        }
    }

    /// A persisted deadline, with what is left of it (nothing, once past).
    fn from_unix_ms(ms: u64) -> Self {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let left = wall
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Self {
            at: tokio::time::Instant::now() + left,
            wall,
        }
    }

    fn unix_ms(self) -> u64 {
        self.wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// What a guard concluded from the pending generation's answers so far.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Not enough answers yet, or the window is still open.
    Wait,
    Pass(String),
    Breach(String),
    /// The window closed with fewer than `min_requests` answers.
    NoData(String),
}

/// Answers of one generation over a guard's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Answers {
    pub(crate) requests: u64,
    pub(crate) errors: u64,
}

impl Answers {
    pub(crate) fn of(ledger: &crate::generation::Ledger) -> Self {
        Self {
            requests: ledger.requests.get(),
            errors: ledger.errors.get(),
        }
    }

    pub(crate) fn since(self, start: Answers) -> Self {
        Self {
            requests: self.requests.saturating_sub(start.requests),
            errors: self.errors.saturating_sub(start.errors),
        }
    }

    fn ratio(self) -> f64 {
        self.errors as f64 / self.requests.max(1) as f64
    }
}

/// The previous generation's answers since a guard started: what the
/// pending generation is compared with over the same window.
pub(crate) struct Baseline {
    ledger: Option<Arc<crate::generation::Ledger>>,
    start: Answers,
}

impl Baseline {
    pub(crate) fn start(store: &GenerationStore, generation: Option<GenerationId>) -> Self {
        let ledger = generation.and_then(|id| store.ledger(id));
        let start = ledger.as_deref().map(Answers::of).unwrap_or_default();
        Self { ledger, start }
    }

    pub(crate) fn answers(&self) -> Option<Answers> {
        self.ledger
            .as_deref()
            .map(|l| Answers::of(l).since(self.start))
    }
}

/// Judges the pending generation's answers (`p99`: the bound of their
/// 99th percentile, seconds), `elapsed` into the window, against the
/// previous generation's over the same window: a breach, as soon as
/// `min_requests` answers show one, is an error ratio more than
/// `max_error_ratio` above the previous generation's (above zero when
/// that one has fewer than `min_requests` answers in the window, as
/// without a canary), or a p99 over `max_p99`; a pass when the window
/// closes.
pub(crate) fn judge(
    spec: &GuardSpec,
    pending: Answers,
    p99: Option<f64>,
    previous: Option<Answers>,
    elapsed: Duration,
) -> Verdict {
    let closed = elapsed >= spec.window;
    let enough = spec.min_requests.max(1);
    if pending.requests < enough {
        return if closed {
            Verdict::NoData(format!(
                "guard: {} requests in {:?}, fewer than min_requests {}",
                pending.requests, spec.window, spec.min_requests
            ))
        } else {
            Verdict::Wait
        };
    }
    let baseline = previous.filter(|p| p.requests >= enough);
    let p99_text = p99.map_or("-".to_owned(), |s| format!("{:.1}ms", s * 1000.0));
    let previous_text = match baseline {
        Some(p) => format!(
            "previous generation {:.4} ({} of {})",
            p.ratio(),
            p.errors,
            p.requests
        ),
        None => "previous generation: too few requests to compare".to_owned(),
    };
    let measured = format!(
        "error ratio {:.4} ({} of {}), p99 <= {p99_text}; {previous_text}; thresholds max_error_ratio {}, max_p99 {}",
        pending.ratio(),
        pending.errors,
        pending.requests,
        spec.max_error_ratio,
        spec.max_p99
            .map_or("-".to_owned(), |d| format!("{:.1}ms", d.as_secs_f64() * 1000.0))
    );
    let allowed = baseline.map_or(0.0, Answers::ratio) + spec.max_error_ratio;
    let slow = matches!((p99, spec.max_p99), (Some(p99), Some(max)) if p99 > max.as_secs_f64());
    if pending.ratio() > allowed || slow {
        return Verdict::Breach(format!("guard breached: {measured}"));
    }
    if closed {
        Verdict::Pass(format!("guard passed: {measured}"))
    } else {
        Verdict::Wait
    }
}

impl Pending {
    fn view(&self) -> PendingView {
        PendingView {
            generation: self.generation,
            rollback_to: self.rollback_to,
            deadline: self.deadline.map(|d| rfc3339(d.wall)),
            seconds_left: self.deadline.map(|d| {
                d.at.saturating_duration_since(tokio::time::Instant::now())
                    .as_secs_f64()
            }),
            canary_percent: None,
        }
    }

    fn record(&self) -> crate::runtime::PendingRecord {
        crate::runtime::PendingRecord {
            generation: self.generation,
            rollback_to: self.rollback_to,
            deadline_unix_ms: self.deadline.map(Deadline::unix_ms),
            guard: self.guard.as_ref().map(GuardSpec::record),
            canary: self.canary.as_ref().map(|c| c.record(self.step)),
        }
    }

    /// A persisted pending generation; `None` when its canary's
    /// `hash_key` no longer reads (it did when it was written).
    fn resume(record: &crate::runtime::PendingRecord) -> Option<Self> {
        let canary = match &record.canary {
            Some(c) => Some(CanarySpec::from_record(c)?),
            None => None,
        };
        let step = record.canary.as_ref().map_or(0, |c| c.step);
        Some(Self {
            generation: record.generation,
            rollback_to: record.rollback_to,
            deadline: record.deadline_unix_ms.map(Deadline::from_unix_ms),
            guard: record.guard.as_ref().map(GuardSpec::from_record),
            canary,
            step,
        })
    }
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
#[derive(Debug, Clone, Serialize)]
pub struct Settled {
    pub outcome: &'static str,
    /// The active generation after it: the confirmed one, or the one the
    /// rollback minted.
    pub generation: GenerationId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<GenerationId>,
    pub operation_id: String,
}

/// A plan with the operation it was recorded as (preview).
#[derive(Debug, Clone, Serialize)]
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
    /// per history request (about 25 ms a 10 000-route configuration).
    candidacy: Mutex<(GenerationId, HashMap<GenerationId, bool>)>,
    /// The generation awaiting confirmation, if any (changed only under
    /// the operation lock).
    pending: Mutex<Option<Pending>>,
    /// The fleet this instance is in (`[fleet]`). The fleet holds this
    /// control plane too: both live as long as the process.
    #[cfg(feature = "fleet")]
    fleet: std::sync::OnceLock<Arc<crate::fleet::Fleet>>,
    /// See `file_matches_active`.
    #[allow(clippy::type_complexity)]
    file_match: Mutex<Option<(GenerationId, Option<(u64, Option<SystemTime>)>, bool)>>,
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
            #[cfg(feature = "fleet")]
            fleet: std::sync::OnceLock::new(),
        }
    }

    /// The fleet this instance is in, if any.
    #[cfg(feature = "fleet")]
    pub fn fleet(&self) -> Option<&Arc<crate::fleet::Fleet>> {
        self.fleet.get()
    }

    /// Joins the fleet `[fleet]` names (once, at start-up).
    #[cfg(feature = "fleet")]
    pub fn join_fleet(self: &Arc<Self>, spec: crate::plan::FleetSpec) {
        let fleet = crate::fleet::Fleet::start(Arc::clone(self), spec);
        if self.fleet.set(fleet).is_err() {
            tracing::error!("the fleet was joined twice; the second is ignored");
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
        let active = self.store.active_id();
        let history = self.history();
        let record = history.generation(active)?;
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

    /// Plans a candidate against the active generation. Pure: binds,
    /// writes and records nothing.
    fn plan_candidate(&self, candidate: &Candidate) -> Result<Plan, ControlError> {
        let text = candidate::read(&candidate.source, &self.config_file)?;
        let active = self.store.load_full();
        Ok(plan::plan(&text, Some((active.id, &active.spec))))
    }

    /// Plans like `validate` and records the preview in the operation log.
    fn preview_now(&self, candidate: &Candidate) -> Result<RecordedPlan, ControlError> {
        let started = Instant::now();
        let plan = self.plan_candidate(candidate)?;
        let outcome = if plan.activatable {
            Outcome::Succeeded
        } else {
            Outcome::Rejected
        };
        let summary = plan_summary(&plan);
        let operation_id = self.record(
            OperationKind::Preview,
            started,
            outcome,
            (Some(self.store.active_id()), None),
            &Requester::of(candidate),
            summary,
            None,
        );
        Ok(RecordedPlan { plan, operation_id })
    }

    /// Runs control-plane work (parsing, hashing files, building, fsync)
    /// on the blocking pool, so that an activation never stalls a worker
    /// thread that is serving requests; then returns what its transient
    /// allocations left free to the system.
    async fn off_the_data_plane<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Control) -> Result<T, ControlError> + Send + 'static,
    ) -> Result<T, ControlError> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let done = work(&this);
            (this.release_memory)();
            done
        })
        .await
        .map_err(|e| ControlError::Internal(e.to_string()))?
    }

    /// Plans a candidate against the active generation. Pure: binds,
    /// writes and records nothing. Runs off the data plane's threads.
    pub async fn validate(self: &Arc<Self>, candidate: Candidate) -> Result<Plan, ControlError> {
        self.off_the_data_plane(move |c| c.plan_candidate(&candidate))
            .await
    }

    /// Plans like `validate` and records the preview in the operation log.
    pub async fn preview(
        self: &Arc<Self>,
        candidate: Candidate,
    ) -> Result<RecordedPlan, ControlError> {
        self.off_the_data_plane(move |c| c.preview_now(&candidate))
            .await
    }

    /// Re-reads listener certificate material; see `reload_certs_now`.
    /// Re-reads certificate material (see `certs`); `requested_by` goes
    /// into the operation log.
    pub async fn reload_certs(
        self: &Arc<Self>,
        only: Option<Vec<String>>,
        requested_by: Option<String>,
    ) -> Result<CertReload, ControlError> {
        let requester = Requester {
            requested_by,
            reason: None,
        };
        self.off_the_data_plane(move |c| c.reload_certs_now(only, &requester))
            .await
    }

    /// Plans, builds and commits a candidate (`activate` and `reload`).
    /// With `confirm_within`, the new generation is pending: a timer rolls
    /// it back unless it is confirmed in time.
    pub async fn activate(
        self: &Arc<Self>,
        candidate: Candidate,
        kind: OperationKind,
    ) -> Result<Activation, ControlError> {
        let activation = self
            .off_the_data_plane(move |c| {
                let started = Instant::now();
                let result = c.try_activate(&candidate, kind, started);
                if let Err(error) = &result {
                    c.record_failure(kind, started, &Requester::of(&candidate), error);
                }
                result
            })
            .await?;
        if let Some(view) = &activation.pending {
            // Superseded or settled since, its successor's own call (or
            // nothing) supervises.
            let pending = self
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .filter(|p| p.generation == view.generation);
            if let Some(pending) = pending {
                self.supervise(&pending);
            }
        }
        Ok(activation)
    }

    /// Reloads the configuration file (SIGHUP, `reload`); in a fleet,
    /// composed with the shared document the instance serves.
    pub async fn reload(
        self: &Arc<Self>,
        candidate: Candidate,
    ) -> Result<Activation, ControlError> {
        #[cfg(feature = "fleet")]
        if let Some(fleet) = self.fleet() {
            return fleet.reload(candidate).await;
        }
        self.activate(candidate, OperationKind::Reload).await
    }

    /// Starts what settles a pending generation: the deadline's timer, and
    /// its canary's steps (which judge each step by the guard) or its
    /// guard's watch.
    fn supervise(self: &Arc<Self>, pending: &Pending) {
        let generation = pending.generation;
        if let Some(deadline) = pending.deadline {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.expire(generation, deadline.at).await });
        }
        match (&pending.canary, &pending.guard) {
            (Some(canary), guard) => {
                let this = Arc::clone(self);
                let (canary, guard, step) = (canary.clone(), guard.clone(), pending.step);
                tokio::spawn(async move { this.advance(generation, canary, guard, step).await });
            }
            (None, Some(spec)) => {
                let this = Arc::clone(self);
                let spec = spec.clone();
                tokio::spawn(async move { this.watch(generation, spec).await });
            }
            (None, None) => {}
        }
    }

    /// Walks a canary through its steps: each step's share for
    /// `step_interval`, then (with a guard) a verdict on the pending
    /// generation's answers so far; a breach, or no data with
    /// `on_no_data = "fail"`, rolls back; no data with "hold" repeats the
    /// step. The last step, 100 %, confirms it. Starts at step `first`
    /// (a resumed canary); each step reached is persisted.
    async fn advance(
        self: Arc<Self>,
        generation: GenerationId,
        canary: CanarySpec,
        guard: Option<GuardSpec>,
        first: usize,
    ) {
        let started = tokio::time::Instant::now();
        let baseline = Baseline::start(&self.store, self.pending().map(|p| p.rollback_to));
        let mut step = first;
        loop {
            let Some(percent) = canary.steps.get(step).copied() else {
                return;
            };
            let Some(current) = self.store.canary() else {
                return;
            };
            if self.pending().map(|p| p.generation) != Some(generation) {
                return;
            }
            current
                .percent
                .store(percent, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(%generation, percent, "canary step");
            let outcome = if percent >= 100 {
                Some((
                    Settle::Confirm,
                    format!("canary steps {:?} completed", canary.steps),
                ))
            } else {
                tokio::time::sleep(canary.step_interval).await;
                let verdict = match &guard {
                    None => Verdict::Wait,
                    Some(spec) => {
                        let ledger = self.store.ledger(generation);
                        match ledger {
                            None => return,
                            // The window is the time so far: every step
                            // ends with a verdict.
                            Some(l) => judge(
                                spec,
                                Answers::of(&l),
                                l.duration.quantile_bound(0.99),
                                baseline.answers(),
                                started.elapsed().max(spec.window),
                            ),
                        }
                    }
                };
                match verdict {
                    Verdict::Breach(reason) => {
                        Some((Settle::Expired, format!("canary at {percent} %: {reason}")))
                    }
                    Verdict::NoData(reason)
                        if guard.as_ref().is_some_and(|g| g.fail_on_no_data) =>
                    {
                        Some((Settle::Expired, format!("canary at {percent} %: {reason}")))
                    }
                    // Hold: the same step again.
                    Verdict::NoData(_) => continue,
                    Verdict::Pass(_) | Verdict::Wait => {
                        step += 1;
                        if !self.record_step(generation, step) {
                            return;
                        }
                        None
                    }
                }
            };
            if let Some((how, reason)) = outcome {
                self.settle_by_gateway(generation, how, "cutover-canary", reason)
                    .await;
                return;
            }
        }
    }

    /// Judges a pending generation by its own answers (see `judge`) every
    /// tenth of its window (between 100 ms and 1 s) from its activation
    /// on: rolls it back on a breach, confirms it on a pass with
    /// `confirm_on_pass`, rolls it back when the window closes without
    /// enough answers and `on_no_data = "fail"`.
    async fn watch(self: Arc<Self>, generation: GenerationId, spec: GuardSpec) {
        let started = tokio::time::Instant::now();
        let baseline = Baseline::start(&self.store, self.pending().map(|p| p.rollback_to));
        let every = (spec.window / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            tokio::time::sleep(every).await;
            if self.pending().map(|p| p.generation) != Some(generation) {
                return;
            }
            let Some(ledger) = self.store.ledger(generation) else {
                return;
            };
            let verdict = judge(
                &spec,
                Answers::of(&ledger),
                ledger.duration.quantile_bound(0.99),
                baseline.answers(),
                started.elapsed(),
            );
            drop(ledger);
            let (how, reason) = match verdict {
                Verdict::Wait => continue,
                Verdict::Breach(reason) => (Settle::Expired, reason),
                Verdict::NoData(reason) if spec.fail_on_no_data => (Settle::Expired, reason),
                Verdict::Pass(reason) if spec.confirm_on_pass => (Settle::Confirm, reason),
                // Passed without confirm_on_pass, or no data and "hold":
                // the operator or the deadline decides.
                Verdict::Pass(reason) | Verdict::NoData(reason) => {
                    tracing::info!(%generation, "{reason}; left pending");
                    return;
                }
            };
            self.settle_by_gateway(generation, how, "cutover-guard", reason)
                .await;
            return;
        }
    }

    /// The pending generation, if there is one.
    pub fn pending(&self) -> Option<PendingView> {
        let mut view = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Pending::view)?;
        view.canary_percent = self
            .store
            .canary()
            .map(|c| c.percent.load(std::sync::atomic::Ordering::Relaxed));
        Some(view)
    }

    /// Sets or clears the pending generation, in memory and (with a
    /// state dir) on disk: a restart or an upgrade during its window
    /// resumes it.
    fn set_pending(&self, pending: Option<Pending>) {
        let record = pending.as_ref().map(Pending::record);
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = pending;
        if self.history().pending() != record.as_ref() {
            self.with_history(|history| history.set_pending(record));
        }
    }

    /// Moves the pending canary to `step`, in memory and on disk; `false`
    /// when `generation` is not pending any more or the process hands
    /// over (the new process owns the record then).
    fn record_step(&self, generation: GenerationId, step: usize) -> bool {
        if self.check_running().is_err() {
            return false;
        }
        // Held until the record is written: a settle clears the record
        // after this, never before.
        let mut slot = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(pending) = slot.as_mut().filter(|p| p.generation == generation) else {
            return false;
        };
        pending.step = step;
        let record = pending.record();
        self.with_history(|history| history.set_pending(Some(record)));
        true
    }

    /// After a restart or an upgrade: takes up the pending generation the
    /// history kept, with what its deadline leaves (a deadline already
    /// passed rolls back at once), its canary on the step it had reached
    /// (the previous generation rebuilt to take the rest of new requests)
    /// and its guard with a new window (the answers it had counted were
    /// the old process's). Nothing when the active generation is not the
    /// pending one any more.
    pub fn resume_pending(self: &Arc<Self>) {
        let Some(record) = self.history().pending().cloned() else {
            return;
        };
        if record.generation != self.store.active_id() {
            self.set_pending(None);
            return;
        }
        let resumed = Pending::resume(&record)
            .ok_or_else(|| "its canary's hash_key no longer reads".to_owned());
        let resumed = resumed.and_then(|mut pending| {
            if let Some(canary) = &pending.canary {
                let previous = self.rebuild(pending.rollback_to)?;
                let step = pending.step.min(canary.steps.len().saturating_sub(1));
                pending.step = step;
                self.store.set_canary(Some(Arc::new(crate::runtime::Canary {
                    previous,
                    percent: std::sync::atomic::AtomicU8::new(
                        canary.steps.get(step).copied().unwrap_or(100),
                    ),
                    key: canary.key.clone(),
                })));
            }
            Ok(pending)
        });
        let pending = match resumed {
            Ok(pending) => pending,
            Err(why) => {
                // When in doubt, the last final generation wins.
                tracing::error!(generation = %record.generation, "a pending generation cannot resume ({why}): rolling back");
                let pending = Pending {
                    generation: record.generation,
                    rollback_to: record.rollback_to,
                    deadline: Some(Deadline::after(Duration::ZERO)),
                    guard: None,
                    canary: None,
                    step: 0,
                };
                *self.pending.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(pending.clone());
                self.supervise(&pending);
                return;
            }
        };
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(pending.clone());
        let view = pending.view();
        tracing::info!(
            generation = %pending.generation,
            rollback_to = %pending.rollback_to,
            seconds_left = ?view.seconds_left,
            canary_step = ?pending.canary.as_ref().map(|c| c.steps.get(pending.step)),
            guard = pending.guard.is_some(),
            "resuming a pending generation"
        );
        self.supervise(&pending);
    }

    /// Builds retained generation `id` again, under its own id, as a live
    /// generation beside the active one (a resumed canary's other side).
    fn rebuild(&self, id: GenerationId) -> Result<Arc<Generation>, String> {
        let text = self
            .history()
            .generation(id)
            .ok_or_else(|| format!("generation {id} is not retained"))?
            .config_text()
            .map_err(|e| e.to_string())?;
        let spec = plan::validate(&text).map_err(|errors| {
            format!(
                "generation {id} no longer validates ({} errors)",
                errors.len()
            )
        })?;
        let generation = generation::build(Arc::new(spec), id, &self.shared)
            .map_err(|e| format!("generation {id} cannot be built: {e}"))?;
        Ok(self.store.publish_previous(generation))
    }

    /// Rolls `generation` back once `deadline` passes, unless it was
    /// settled before: the same compare-and-swap as confirm and abort, so
    /// exactly one of them wins.
    async fn expire(self: Arc<Self>, generation: GenerationId, deadline: tokio::time::Instant) {
        tokio::time::sleep_until(deadline).await;
        self.settle_by_gateway(
            generation,
            Settle::Expired,
            "cutover",
            "confirm deadline passed".into(),
        )
        .await;
    }

    /// Settles `generation` on the gateway's own behalf (`who`: the
    /// deadline, a guard or a canary), waiting its turn while another
    /// operation holds the lock; a generation settled meanwhile is left
    /// as it is.
    async fn settle_by_gateway(
        self: &Arc<Self>,
        generation: GenerationId,
        how: Settle,
        who: &str,
        reason: String,
    ) {
        loop {
            let request = SettleRequest {
                generation,
                expected_active_generation: None,
                requested_by: Some(who.to_owned()),
                reason: Some(reason.clone()),
            };
            match self.settle(request, how).await {
                Err(ControlError::InProgress) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(ControlError::Draining | ControlError::NotPending(_)) | Ok(_) => return,
                Err(error) => {
                    tracing::error!(%generation, %error, who, "settling a pending generation failed");
                    return;
                }
            }
        }
    }

    /// Confirms or rolls back the pending generation (DESIGN §14).
    pub async fn settle(
        self: &Arc<Self>,
        request: SettleRequest,
        how: Settle,
    ) -> Result<Settled, ControlError> {
        self.off_the_data_plane(move |c| {
            let started = Instant::now();
            let kind = match how {
                Settle::Confirm => OperationKind::Confirm,
                Settle::Abort => OperationKind::Abort,
                Settle::Expired => OperationKind::AutoRollback,
            };
            let requester = Requester {
                requested_by: request.requested_by.clone(),
                reason: request.reason.clone(),
            };
            let result = c.try_settle(&request, how, kind, &requester, started);
            if let Err(error) = &result {
                if !matches!(error, ControlError::InProgress) || how != Settle::Expired {
                    c.record_failure(kind, started, &requester, error);
                }
            }
            result
        })
        .await
    }

    fn try_settle(
        &self,
        request: &SettleRequest,
        how: Settle,
        kind: OperationKind,
        requester: &Requester,
        started: Instant,
    ) -> Result<Settled, ControlError> {
        let (_operation, active) = self.begin_change()?;
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|p| p.generation == request.generation && p.generation == active.id)
            .ok_or(ControlError::NotPending(request.generation))?;
        check_expected(request.expected_active_generation, active.id)?;
        if how == Settle::Confirm {
            self.store.set_canary(None);
            self.set_pending(None);
            let operation_id = self.record(
                kind,
                started,
                Outcome::Succeeded,
                (Some(active.id), Some(pending.rollback_to)),
                requester,
                format!("generation {} confirmed", active.id),
                None,
            );
            tracing::info!(generation = %active.id, "pending generation confirmed");
            self.write_back();
            return Ok(Settled {
                outcome: "confirmed",
                generation: active.id,
                rolled_back_to: None,
                operation_id,
            });
        }
        let source = if how == Settle::Expired {
            Source::AutoRollback
        } else {
            Source::Rollback
        };
        let activation = self.rollback_locked(
            &active,
            pending.rollback_to,
            kind,
            source,
            requester,
            started,
        )?;
        self.set_pending(None);
        self.write_back();
        tracing::warn!(
            pending = %pending.generation,
            generation = %activation.generation,
            rolled_back_to = %pending.rollback_to,
            reason = requester.reason.as_deref().unwrap_or("-"),
            "pending generation rolled back"
        );
        Ok(Settled {
            outcome: "rolled_back",
            generation: activation.generation,
            rolled_back_to: Some(pending.rollback_to),
            operation_id: activation.operation_id,
        })
    }

    fn try_activate(
        &self,
        candidate: &Candidate,
        kind: OperationKind,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        let (_operation, active) = self.begin_change()?;
        if candidate.expected_generation.is_none()
            && active.spec.admin.require_expected_generation
            && kind == OperationKind::Activate
        {
            return Err(ControlError::ExpectedGenerationRequired);
        }
        check_expected(candidate.expected_generation, active.id)?;
        // One pending change at a time: a new one must name the pending
        // generation to supersede it; the rollback target stays the last
        // final generation.
        let superseded = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(pending) = &superseded {
            if candidate.expected_generation != Some(pending.generation) {
                return Err(ControlError::PendingActivation {
                    pending: pending.generation,
                });
            }
        }
        // A canary's other side is the last final generation.
        let previous = self
            .store
            .canary()
            .map_or_else(|| Arc::clone(&active), |c| Arc::clone(&c.previous));
        let text = candidate::read(&candidate.source, &self.config_file)?;
        let plan = plan::plan(&text, Some((active.id, &active.spec)));
        let meta = CommitMeta {
            kind,
            source: if kind == OperationKind::Reload {
                Source::Reload
            } else {
                Source::Activate
            },
            rolled_back_to: None,
            requester: Requester::of(candidate),
            text,
        };
        let mut activation = self.commit(&active, plan, meta, started)?;
        if activation.outcome == "unchanged" {
            return Ok(activation);
        }
        // Without a confirm window, a guard's window or the canary's
        // steps decide (see `watch` and `advance`).
        let guarded = candidate.confirm_within.is_some()
            || candidate.guard.is_some()
            || candidate.canary.is_some();
        let pending = guarded.then(|| Pending {
            generation: activation.generation,
            rollback_to: superseded.as_ref().map_or(active.id, |p| p.rollback_to),
            deadline: candidate.confirm_within.map(Deadline::after),
            guard: candidate.guard.clone(),
            canary: candidate.canary.clone(),
            step: 0,
        });
        if let (Some(spec), Some(_)) = (&candidate.canary, &pending) {
            self.store.set_canary(Some(Arc::new(crate::runtime::Canary {
                previous,
                percent: std::sync::atomic::AtomicU8::new(
                    spec.steps.first().copied().unwrap_or(100),
                ),
                key: spec.key.clone(),
            })));
        }
        let final_now = pending.is_none();
        self.set_pending(pending);
        activation.pending = self.pending();
        if final_now && kind == OperationKind::Activate {
            self.write_back();
        }
        Ok(activation)
    }

    /// With the active generation's `runtime.write_back`, rewrites the
    /// configuration file with its text, the previous file kept as
    /// `FILE.bak`, so that a restart without a state dir comes up on what
    /// runs. Called once a change through the API is final (not while it
    /// pends); a failure is logged, and status then says the file does
    /// not match.
    fn write_back(&self) {
        if !self.store.load_full().spec.runtime.write_back {
            return;
        }
        let Some(text) = self.active_config() else {
            return;
        };
        if std::fs::read_to_string(&self.config_file).is_ok_and(|file| file == text.text) {
            return;
        }
        let (Some(dir), Some(name)) = (
            self.config_file.parent(),
            self.config_file.file_name().and_then(|n| n.to_str()),
        ) else {
            return;
        };
        let dir = if dir.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            dir
        };
        let written = std::fs::copy(&self.config_file, dir.join(format!("{name}.bak")))
            .map(|_| ())
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| {
                crate::runtime::write_atomically(dir, name, |out| {
                    std::io::Write::write_all(out, text.text.as_bytes())
                })
            });
        match written {
            Ok(()) => {
                tracing::info!(file = %self.config_file.display(), "write_back: the configuration file now holds the active generation")
            }
            Err(error) => {
                tracing::error!(file = %self.config_file.display(), %error, "write_back failed: the configuration file does not match the active generation")
            }
        }
    }

    /// Activates the content of a retained generation as a new generation.
    pub async fn rollback(
        self: &Arc<Self>,
        request: RollbackRequest,
    ) -> Result<Activation, ControlError> {
        self.off_the_data_plane(move |c| c.rollback_now(request))
            .await
    }

    fn rollback_now(&self, request: RollbackRequest) -> Result<Activation, ControlError> {
        let started = Instant::now();
        let result = self.try_rollback(&request, started);
        if let Err(error) = &result {
            let requester = Requester {
                requested_by: request.requested_by.clone(),
                reason: request.reason.clone(),
            };
            self.record_failure(OperationKind::Rollback, started, &requester, error);
        }
        result
    }

    fn try_rollback(
        &self,
        request: &RollbackRequest,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        let (_operation, active) = self.begin_change()?;
        let target = request.target_generation;
        if self.history().generation(target).is_none() {
            return Err(ControlError::NotRetained(target));
        }
        check_expected(request.expected_active_generation, active.id)?;
        let requester = Requester {
            requested_by: request.requested_by.clone(),
            reason: request.reason.clone(),
        };
        let activation = self.rollback_locked(
            &active,
            target,
            OperationKind::Rollback,
            Source::Rollback,
            &requester,
            started,
        )?;
        // An operator's rollback settles a pending generation too.
        self.set_pending(None);
        self.write_back();
        Ok(activation)
    }

    /// Activates retained generation `target`'s configuration as a new
    /// generation; the operation lock is held by the caller.
    fn rollback_locked(
        &self,
        active: &Arc<Generation>,
        target: GenerationId,
        kind: OperationKind,
        source: Source,
        requester: &Requester,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        let record = self
            .history()
            .generation(target)
            .cloned()
            .ok_or(ControlError::NotRetained(target))?;
        if target == active.id {
            return Err(ControlError::TargetActive(target));
        }
        let text = record
            .config_text()
            .map_err(|e| ControlError::Internal(e.to_string()))?;
        let plan = plan::plan(&text, Some((active.id, &active.spec)));
        if !plan.errors.is_empty() || !plan.rejected.is_empty() {
            return Err(ControlError::NotActivatable {
                target,
                plan: Box::new(plan),
            });
        }
        let meta = CommitMeta {
            kind,
            source,
            rolled_back_to: Some(target),
            requester: requester.clone(),
            text,
        };
        self.commit(active, plan, meta, started)
    }

    /// Starts a mutating operation: the one-writer lock (409 while another
    /// runs), a running process (503 while draining), the active generation.
    fn begin_change(
        &self,
    ) -> Result<(tokio::sync::MutexGuard<'_, ()>, Arc<Generation>), ControlError> {
        let guard = self
            .operation
            .try_lock()
            .map_err(|_| ControlError::InProgress)?;
        self.check_running()?;
        Ok((guard, self.store.load_full()))
    }

    fn check_running(&self) -> Result<(), ControlError> {
        match self.phase.get() {
            Phase::Draining | Phase::Stopped => Err(ControlError::Draining),
            Phase::Starting | Phase::Running => Ok(()),
        }
    }

    /// plan → build → bind → compare-and-swap → history → persist.
    fn commit(
        &self,
        active: &Arc<Generation>,
        plan: Plan,
        meta: CommitMeta,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        if !plan.errors.is_empty() {
            return Err(ControlError::Invalid(Box::new(plan)));
        }
        if !plan.rejected.is_empty() {
            return Err(ControlError::RestartRequired(Box::new(plan)));
        }
        let Some(spec) = plan.spec.clone() else {
            return Err(ControlError::Invalid(Box::new(plan)));
        };
        if plan.is_unchanged(Some(&active.spec)) {
            let operation_id = self.record(
                meta.kind,
                started,
                Outcome::Unchanged,
                (Some(active.id), Some(active.id)),
                &meta.requester,
                "configuration unchanged".into(),
                None,
            );
            self.count_activation(meta.kind, "unchanged", started);
            return Ok(Activation {
                outcome: "unchanged",
                generation: active.id,
                previous_generation: active.id,
                config_version: spec.config_version.clone(),
                rolled_back_to: None,
                duration_ms: elapsed_ms(started),
                listeners: self.listeners.info(),
                diff: plan.diff,
                operation_id,
                pending: None,
            });
        }
        let next_id = active.id.next();
        let next = match generation::build(Arc::clone(&spec), next_id, &self.shared) {
            Ok(next) => next,
            Err(source) => {
                return Err(ControlError::Build {
                    source,
                    plan: Box::new(plan),
                })
            }
        };
        let certificates = generation::certificate_material(&spec, next_id);
        let bound = match self.listeners.bind_new(&spec.listeners) {
            Ok(bound) => bound,
            Err(source) => {
                return Err(ControlError::Bind {
                    source,
                    plan: Box::new(plan),
                })
            }
        };
        // INVARIANT: we hold the operation lock, so the active generation
        // cannot have moved since `active` was loaded; the CAS still
        // guards against a writer outside this type.
        let committed = self
            .store
            .commit(active.id, next)
            .map_err(|c| ControlError::Conflict {
                expected: c.expected,
                active: c.active,
            })?;
        // Whatever canary ran is over: new requests go to the new
        // generation (the caller starts the next canary, if any).
        self.store.set_canary(None);
        // Handshakes already get the new generation's certificates (the
        // store follows the active generation); installing them makes
        // them the stored material that reload-certs starts from.
        self.install_certificates(certificates);
        self.listeners.start(bound);
        self.log_level.apply(&spec.log.level);
        crate::telemetry::access::set_enabled(spec.log.access);
        crate::telemetry::otlp::set_sample_ratio(spec.tracing.sample_ratio);
        metrics::gauge!(m::ACTIVE_GENERATION).set(committed.id.0 as f64);
        let summary = format!(
            "+{} -{} ~{}",
            plan.diff.summary.added, plan.diff.summary.removed, plan.diff.summary.modified
        );
        {
            // Compressed before the history lock is taken.
            let config = RetainedText::new(&meta.text.text);
            let mut history = self.history();
            history.set_limit(spec.runtime.history_limit);
            history.record_generation(GenerationRecord {
                generation: committed.id,
                config_version: spec.config_version.clone(),
                activated_at: rfc3339(SystemTime::now()),
                source: meta.source,
                rolled_back_to: meta.rolled_back_to,
                requested_by: meta.requester.requested_by.clone(),
                reason: meta.requester.reason.clone(),
                config,
                base_dir: meta.text.base_dir.clone(),
                origin: meta.text.origin.clone(),
            });
        }
        let operation_id = self.record(
            meta.kind,
            started,
            Outcome::Succeeded,
            (Some(committed.id), Some(active.id)),
            &meta.requester,
            summary,
            None,
        );
        self.count_activation(meta.kind, "succeeded", started);
        tracing::info!(
            generation = %committed.id,
            previous = %active.id,
            config_version = %spec.config_version,
            kind = ?meta.kind,
            requested_by = meta.requester.requested_by.as_deref().unwrap_or("-"),
            "generation activated"
        );
        Ok(Activation {
            outcome: "activated",
            generation: committed.id,
            previous_generation: active.id,
            config_version: spec.config_version.clone(),
            rolled_back_to: meta.rolled_back_to,
            duration_ms: elapsed_ms(started),
            listeners: self.listeners.info(),
            diff: plan.diff,
            operation_id,
            pending: None,
        })
    }

    fn count_activation(&self, kind: OperationKind, outcome: &'static str, started: Instant) {
        let kind = operation_kind_name(kind);
        metrics::counter!(m::ACTIVATIONS, m::LABEL_KIND => kind, m::LABEL_OUTCOME => outcome)
            .increment(1);
        metrics::histogram!(m::ACTIVATION_DURATION).record(started.elapsed().as_secs_f64());
    }

    fn record_failure(
        &self,
        kind: OperationKind,
        started: Instant,
        requester: &Requester,
        error: &ControlError,
    ) {
        let outcome = match error {
            ControlError::Conflict { .. }
            | ControlError::InProgress
            | ControlError::TargetActive(_) => Outcome::Conflict,
            ControlError::Build { .. } | ControlError::Bind { .. } => Outcome::Failed,
            _ => Outcome::Rejected,
        };
        let label = match outcome {
            Outcome::Conflict => "conflict",
            Outcome::Failed => "failed",
            _ => "rejected",
        };
        self.count_activation(kind, label, started);
        tracing::warn!(kind = ?kind, %error, "configuration change refused");
        self.record(
            kind,
            started,
            outcome,
            (None, Some(self.store.active_id())),
            requester,
            error.to_string(),
            Some(error.to_string()),
        );
    }

    /// Appends to the operation log and persists; returns the operation id.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        kind: OperationKind,
        started: Instant,
        outcome: Outcome,
        (generation, previous_generation): (Option<GenerationId>, Option<GenerationId>),
        requester: &Requester,
        summary: String,
        error: Option<String>,
    ) -> String {
        let mut history = self.history();
        let id = history.next_operation_id();
        history.record_operation(OperationRecord {
            id: id.clone(),
            kind,
            at: rfc3339(SystemTime::now()),
            duration_ms: elapsed_ms(started),
            outcome,
            generation,
            previous_generation,
            requested_by: requester.requested_by.clone(),
            reason: requester.reason.clone(),
            summary,
            error,
            pid: std::process::id(),
            previous_pid: None,
        });
        // A preview is kept in memory only: validate and preview never
        // write (DESIGN §10); the next change persists it with the rest.
        if kind == OperationKind::Preview {
            return id;
        }
        if let Err(error) = history.persist() {
            tracing::error!(%error, "cannot persist history; the change is live but will not survive a restart");
        }
        id
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

/// Fails with a conflict unless `expected` (when given) is the active id.
fn check_expected(
    expected: Option<GenerationId>,
    active: GenerationId,
) -> Result<(), ControlError> {
    match expected {
        Some(expected) if expected != active => Err(ControlError::Conflict { expected, active }),
        _ => Ok(()),
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

fn plan_summary(plan: &Plan) -> String {
    if !plan.errors.is_empty() {
        return format!("{} errors", plan.errors.len());
    }
    let s = &plan.diff.summary;
    format!(
        "+{} -{} ~{}, {} restart-required",
        s.added, s.removed, s.modified, s.restart_required
    )
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

pub fn operation_kind_name(kind: OperationKind) -> &'static str {
    match kind {
        OperationKind::Preview => "preview",
        OperationKind::Activate => "activate",
        OperationKind::Reload => "reload",
        OperationKind::Rollback => "rollback",
        OperationKind::ReloadCerts => "reload_certs",
        OperationKind::Drain => "drain",
        OperationKind::Upgrade => "upgrade",
        OperationKind::Confirm => "confirm",
        OperationKind::Abort => "abort",
        OperationKind::AutoRollback => "auto_rollback",
    }
}

#[cfg(test)]
mod guard_tests {
    use super::*;

    fn spec() -> GuardSpec {
        GuardSpec {
            window: Duration::from_secs(10),
            min_requests: 100,
            max_error_ratio: 0.01,
            max_p99: Some(Duration::from_millis(500)),
            fail_on_no_data: false,
            confirm_on_pass: true,
        }
    }

    fn answers(requests: u64, errors: u64) -> Answers {
        Answers { requests, errors }
    }

    #[test]
    fn a_pending_record_keeps_the_deadline_guard_canary_and_step() {
        let pending = Pending {
            generation: GenerationId(7),
            rollback_to: GenerationId(5),
            deadline: Some(Deadline::after(Duration::from_secs(60))),
            guard: Some(spec()),
            canary: Some(CanarySpec {
                steps: vec![1, 10, 50, 100],
                step_interval: Duration::from_secs(30),
                key: crate::plan::parse_hash_key("header:x-user"),
            }),
            step: 2,
        };
        let json = serde_json::to_string(&pending.record()).unwrap();
        let record: crate::runtime::PendingRecord = serde_json::from_str(&json).unwrap();
        let resumed = Pending::resume(&record).unwrap();
        assert_eq!(resumed.record(), pending.record(), "{json}");
        assert_eq!(resumed.guard, pending.guard);
        assert_eq!(resumed.canary, pending.canary);
        assert_eq!(resumed.step, 2);
        let left = resumed.view().seconds_left.unwrap();
        assert!((58.0..=60.0).contains(&left), "{left}");
        // A generation without a confirm window has no deadline at all.
        let open = Pending {
            deadline: None,
            ..pending
        };
        let json = serde_json::to_string(&open.record()).unwrap();
        assert!(!json.contains("deadline"), "{json}");
        assert!(open.view().seconds_left.is_none());
    }

    #[test]
    fn a_guard_waits_for_its_data_then_breaches_at_once_or_passes_at_the_end() {
        let early = Duration::from_secs(1);
        let late = Duration::from_secs(10);
        let judge = |a, p99, e| judge(&spec(), a, p99, None, e);
        assert_eq!(judge(answers(99, 99), Some(0.1), early), Verdict::Wait);
        assert!(matches!(
            judge(answers(99, 0), Some(0.1), late),
            Verdict::NoData(_)
        ));
        // Enough answers and a breach: no need to wait for the window.
        let Verdict::Breach(reason) = judge(answers(100, 2), Some(0.1), early) else {
            panic!("2 % errors breach 1 %");
        };
        assert!(reason.contains("error ratio 0.0200 (2 of 100)"), "{reason}");
        assert!(reason.contains("max_error_ratio 0.01"), "{reason}");
        assert!(matches!(
            judge(answers(100, 0), Some(1.0), early),
            Verdict::Breach(_)
        ));
        assert!(matches!(
            judge(answers(100, 0), Some(f64::INFINITY), early),
            Verdict::Breach(_)
        ));
        // Within the thresholds: a pass once the window is over.
        assert_eq!(judge(answers(100, 1), Some(0.25), early), Verdict::Wait);
        assert!(matches!(
            judge(answers(100, 1), Some(0.25), late),
            Verdict::Pass(_)
        ));
    }

    #[test]
    fn a_guard_compares_with_the_previous_generation_over_the_same_window() {
        let early = Duration::from_secs(1);
        // Both fail alike (a backend outage, not the new configuration):
        // no breach.
        let same = judge(
            &spec(),
            answers(100, 5),
            None,
            Some(answers(900, 45)),
            early,
        );
        assert_eq!(same, Verdict::Wait);
        // 8 % against 5 %: more than 1 % worse.
        let Verdict::Breach(reason) = judge(
            &spec(),
            answers(100, 8),
            None,
            Some(answers(900, 45)),
            early,
        ) else {
            panic!("8 % against 5 % breaches");
        };
        assert!(
            reason.contains("previous generation 0.0500 (45 of 900)"),
            "{reason}"
        );
        // Too little to compare with: measured against zero.
        assert!(matches!(
            judge(&spec(), answers(100, 5), None, Some(answers(10, 1)), early),
            Verdict::Breach(_)
        ));
    }
}

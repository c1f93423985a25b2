//! [`Control`]: the control plane of one process, built around
//! `Changes` (`changes.rs`: what configuration changes write and the one
//! path they take) with the rollback candidacies, the timeline, the
//! process lifecycle and the certificate keeper (its own module, beside
//! `acme`). Here: how it is made, the handles other layers reach through
//! it, what status, history and the timeline read, drain and upgrade.
//! The writer's verbs are `operations.rs`.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Instant, SystemTime};

use super::changes::{Changes, ControlParts};
use super::error::ControlError;
use super::file::FileComposer;
use super::pending::PendingView;
use super::process::{BinaryView, LifecycleError, UpgradeRequest};
use super::records::{Candidacy, Requester};
use super::timeline::{self, Timeline, TimelineView};
use super::views::{GenerationDetail, HistoryView, OperationBrief, Reader, StatusView};
use crate::config::ConfigText;
use crate::ids::GenerationId;
use crate::keeper::Keeper;
use crate::proxy::ListenerSet;
use crate::runtime::{
    rfc3339, GenerationStore, History, OperationKind, OperationRecord, Outcome, Phase, PhaseCell,
};

/// The control plane of one process.
pub struct Control {
    /// What configuration changes write, and the path they take.
    pub(super) changes: Arc<Changes>,
    /// Each retained generation's `rollback_candidate`.
    candidacy: Candidacy,
    /// The console's last 15 minutes.
    timeline: Mutex<Timeline>,
    process: OnceLock<Arc<dyn ProcessControl>>,
    /// The certificate keeper (ACME, OCSP), recording into the records.
    keeper: Arc<Keeper>,
}

impl Control {
    pub fn new(parts: ControlParts) -> Self {
        let changes = Changes::new(parts);
        let keeper = Arc::new(Keeper::new(
            Arc::clone(&changes.store),
            Arc::clone(&changes.certificates),
            Arc::clone(&changes.records) as Arc<dyn crate::keeper::Journal>,
        ));
        Self {
            changes: Arc::new(changes),
            candidacy: Candidacy::default(),
            timeline: Mutex::default(),
            process: OnceLock::new(),
            keeper,
        }
    }

    /// The change events of this process (`GET /admin/events`, webhooks).
    pub fn events(&self) -> &Arc<crate::runtime::events::Events> {
        self.changes.events()
    }

    /// Starts sending change events to `admin.webhooks` (once, at
    /// start-up: webhooks are startup-owned).
    pub fn start_webhooks(&self, specs: &[crate::plan::WebhookSpec]) {
        let _ = self
            .changes
            .records
            .webhooks()
            .set(crate::runtime::webhooks::Webhooks::start(
                specs,
                self.events(),
            ));
    }

    /// Each webhook with what it has been sent.
    pub fn webhook_views(&self) -> Vec<crate::runtime::webhooks::WebhookView> {
        self.changes
            .records
            .webhooks()
            .get()
            .map(|w| w.views(self.events()))
            .unwrap_or_default()
    }

    /// Says when a freeze window of the active configuration begins and
    /// ends (events `freeze_entered`, `freeze_left`), looking once a
    /// second; stops with the control plane.
    pub fn watch_freeze(self: &Arc<Self>) {
        let control = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut current: Option<crate::plan::Frozen> = None;
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(control) = control.upgrade() else {
                    return;
                };
                let now = crate::plan::frozen_at(
                    &control.changes.store.load_full().spec.admin.freeze,
                    std::time::SystemTime::now(),
                );
                if now == current {
                    continue;
                }
                let events = control.events();
                if let Some(left) = current.take() {
                    tracing::info!(window = %left.reason, "freeze window left");
                    events.emit("freeze_left", serde_json::json!({ "freeze": left }));
                }
                if let Some(entered) = &now {
                    tracing::info!(window = %entered.reason, until = %entered.until, "freeze window entered");
                    events.emit("freeze_entered", serde_json::json!({ "freeze": entered }));
                }
                current = now;
            }
        });
    }

    /// The certificate keeper: started once at start-up, shared with the
    /// fleet's instances by the fleet.
    pub fn keeper(&self) -> &Arc<Keeper> {
        &self.keeper
    }

    /// Says how the configuration file's text becomes the text it
    /// activates (once, at start-up; see `ConfigFile`).
    pub fn compose_file_with(&self, composer: FileComposer) {
        self.changes.file.compose_with(composer);
    }

    /// The pending generation, if there is one.
    pub fn pending(&self) -> Option<PendingView> {
        self.changes.pending_view()
    }

    pub fn store(&self) -> &Arc<GenerationStore> {
        &self.changes.store
    }

    pub fn listeners(&self) -> &Arc<ListenerSet> {
        &self.changes.listeners
    }

    pub fn phase(&self) -> &Arc<PhaseCell> {
        self.changes.lock.phase()
    }

    pub fn config_file(&self) -> &std::path::Path {
        self.changes.file.path()
    }

    /// Takes the operation lock for a long operation (an upgrade); `None`
    /// while another mutating operation runs.
    pub fn try_exclusive(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.changes.lock.take_owned()
    }

    /// Reads the history (nothing is written).
    pub fn read_history<T>(&self, f: impl FnOnce(&History) -> T) -> T {
        f(&self.changes.records.lock())
    }

    /// Runs `f` on the history (upgrade bookkeeping) and persists it.
    pub fn with_history<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        self.changes.records.with(f)
    }

    /// The configuration text of the active generation, as retained.
    pub fn active_config(&self) -> Option<ConfigText> {
        self.changes.active_config()
    }

    /// Records the start of a long operation; returns its id.
    pub fn record_started(
        &self,
        kind: OperationKind,
        requester: Requester,
        summary: String,
    ) -> String {
        self.changes.records.record(
            kind,
            Instant::now(),
            Outcome::Running,
            (Some(self.changes.store.active_id()), None),
            &requester,
            summary,
            None,
        )
    }
}

/// What status, history and the console read.
impl Control {
    pub fn status_view(&self) -> StatusView {
        // Pending before active: a settle swaps the generation first and
        // clears the pending record after, so a pending record read first
        // and naming another generation than the active one is already
        // settled.
        let pending = self.pending();
        let active = self.changes.store.load_full();
        let pending = pending.filter(|p| p.generation == active.id);
        let history = self.changes.records.lock();
        let activated_at = history
            .generation(active.id)
            .map_or_else(|| rfc3339(active.built_at), |g| g.activated_at.clone());
        let last_operation = history.operations().next().map(|o| OperationBrief {
            id: o.id.clone(),
            kind: o.kind,
            outcome: o.outcome,
            at: o.at.clone(),
        });
        drop(history);
        let (requests_total, errors_total) = crate::generation::answered_totals();
        StatusView {
            pid: std::process::id(),
            binary: self.binary(),
            phase: self.changes.lock.phase().get(),
            active_generation: active.id,
            config_version: active.spec.config_version.clone(),
            activated_at,
            generations: self.changes.store.loads(),
            listeners: self.changes.listeners.info(),
            last_operation,
            requests_total,
            errors_total,
            pending,
            config_file_matches_active: self
                .changes
                .file
                .matches(active.id, || self.changes.records.config_of(active.id)),
            shadow: self.changes.shadowing.report(&self.changes.store),
            certificates: self.keeper().status(),
        }
    }

    fn reader(&self) -> Reader<'_> {
        Reader {
            pending: self.pending(),
            records: &self.changes.records,
            store: &self.changes.store,
            candidacy: &self.candidacy,
            shared: &self.changes.shared,
        }
    }

    /// Retained generations and the operation log, off the data plane's
    /// threads (see `Reader::history`).
    pub async fn history_view(self: &Arc<Self>) -> Result<HistoryView, ControlError> {
        let this = Arc::clone(self);
        self.changes
            .off_the_data_plane(move |_| Ok(this.reader().history()))
            .await
    }

    /// One retained generation with its text and the diff against its
    /// predecessor, off the data plane's threads.
    pub async fn generation_detail(
        self: &Arc<Self>,
        id: GenerationId,
    ) -> Result<Option<GenerationDetail>, ControlError> {
        let this = Arc::clone(self);
        self.changes
            .off_the_data_plane(move |_| Ok(this.reader().generation(id)))
            .await
    }

    pub fn operation(&self, id: &str) -> Option<OperationRecord> {
        self.changes.records.lock().operation(id).cloned()
    }

    /// The active generation the cached candidacies were planned against,
    /// and how many there are.
    #[cfg(test)]
    pub(crate) fn cached_candidacy(&self) -> (GenerationId, usize) {
        self.candidacy.summary()
    }

    /// Takes this second's point (called once a second by start-up's
    /// gauge task).
    pub fn sample_timeline(&self) {
        let pending = self.pending().map(|p| (p.generation, p.rollback_to));
        let roles = self.changes.store.roles(pending);
        let changes = crate::backends::state_changes();
        let active = self.changes.store.load_full();
        self.timeline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sample(SystemTime::now(), &roles, changes, &active);
    }

    /// The last 15 minutes (see `timeline.rs`).
    pub fn timeline_view(&self) -> TimelineView {
        // One lock at a time: the window is copied out before the
        // operation log is read.
        let (points, backends) = self
            .timeline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .window(SystemTime::now());
        let records = self.changes.records.lock();
        timeline::view(points, backends, SystemTime::now(), records.operations())
    }
}

/// How long a drain waits for a change in flight before it answers.
const DRAIN_WAITS_FOR_CHANGE: std::time::Duration = std::time::Duration::from_secs(10);

/// Drain and upgrade, implemented by the process lifecycle.
pub trait ProcessControl: Send + Sync {
    /// Starts draining (as SIGTERM); returns at once. `Control::drain`
    /// has set the phase to draining before it calls this.
    fn drain(&self, control: &Arc<Control>, requester: Requester)
        -> Result<String, LifecycleError>;
    /// Starts a drain-aware restart; returns the operation id to follow.
    fn upgrade(
        &self,
        control: &Arc<Control>,
        request: UpgradeRequest,
    ) -> Result<String, LifecycleError>;
    /// The executable this process runs.
    fn binary(&self) -> Option<BinaryView>;
}

impl Control {
    /// Installs the process lifecycle (once, at start-up).
    pub fn set_process(&self, process: Arc<dyn ProcessControl>) {
        let _ = self.process.set(process);
    }

    /// Starts draining. Exclusive with every configuration change: the
    /// phase says draining before this returns (set under the history
    /// lock, under which a commit checks it just before its swap), so a
    /// change that starts later, or reaches its swap later, gets 503;
    /// and a change already holding the operation lock is waited for
    /// (at most `DRAIN_WAITS_FOR_CHANGE`), so that what it committed is
    /// in before the drain is acknowledged.
    pub async fn drain(self: &Arc<Self>, requester: Requester) -> Result<String, LifecycleError> {
        let process = self.process.get().ok_or(LifecycleError::Unavailable)?;
        {
            let _history = self.changes.records.lock();
            if self.phase().get() != Phase::Running {
                return Err(LifecycleError::AlreadyDraining);
            }
            self.phase().advance(Phase::Draining);
        }
        let id = process.drain(self, requester)?;
        if !self.changes.lock.wait_idle(DRAIN_WAITS_FOR_CHANGE).await {
            tracing::warn!(
                "draining: an operation still holds the lock after {:?} (an upgrade or a shadow stage ending); it can make no change now",
                DRAIN_WAITS_FOR_CHANGE
            );
        }
        Ok(id)
    }

    pub fn binary(&self) -> Option<BinaryView> {
        self.process.get()?.binary()
    }

    /// Starts a drain-aware restart, unless a freeze window holds.
    pub fn upgrade(
        self: &Arc<Self>,
        mut request: UpgradeRequest,
    ) -> Result<String, LifecycleError> {
        let process = self.process.get().ok_or(LifecycleError::Unavailable)?;
        let active = self.changes.store.load_full();
        request.overrode_freeze = super::expectation::admit_in_freeze(&active.spec, request.freeze)
            .map_err(LifecycleError::Frozen)?;
        drop(active);
        process.upgrade(self, request)
    }
}

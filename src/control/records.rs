//! What this instance records of its changes: the history (retained
//! generations with their texts, the operation log, the pending record),
//! persisted with `state_dir` after every change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime};

use super::candidate::Candidate;
use crate::config::ConfigText;
use crate::generation::Generation;
use crate::ids::GenerationId;
use crate::runtime::events::Events;
use crate::runtime::shadow::ShadowReport;
use crate::runtime::{
    rfc3339, GenerationRecord, History, OperationKind, OperationRecord, Outcome, Source,
};

/// The history, behind its lock.
pub(super) struct Records {
    history: Mutex<History>,
    /// Every change, as it is recorded (and what else changes state: a
    /// pending generation, a canary step, a freeze window).
    events: Arc<Events>,
    /// Where the events are sent (`admin.webhooks`), once started.
    webhooks: std::sync::OnceLock<crate::runtime::webhooks::Webhooks>,
}

impl Records {
    pub(super) fn new(mut history: History) -> Self {
        let events = Arc::new(Events::new());
        history.observe(Arc::clone(&events));
        Self {
            history: Mutex::new(history),
            events,
            webhooks: std::sync::OnceLock::new(),
        }
    }

    pub(super) fn events(&self) -> &Arc<Events> {
        &self.events
    }

    pub(super) fn webhooks(&self) -> &std::sync::OnceLock<crate::runtime::webhooks::Webhooks> {
        &self.webhooks
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the history and persists it.
    pub(super) fn with<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        let mut history = self.lock();
        let out = f(&mut history);
        if let Err(error) = history.persist() {
            tracing::error!(%error, "cannot persist history");
        }
        out
    }

    /// The configuration text generation `id` was activated with, once
    /// history has recorded it (an activation publishes first, then
    /// records).
    pub(super) fn config_of(&self, id: GenerationId) -> Option<ConfigText> {
        let history = self.lock();
        let record = history.generation(id)?;
        match record.config_text() {
            Ok(text) => Some(text),
            Err(error) => {
                tracing::error!(%error, "cannot read the active configuration");
                None
            }
        }
    }

    /// Appends to the operation log and persists; returns the operation id.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &self,
        kind: OperationKind,
        started: Instant,
        outcome: Outcome,
        (generation, previous_generation): (Option<GenerationId>, Option<GenerationId>),
        requester: &Requester,
        summary: String,
        error: Option<String>,
    ) -> String {
        let mut history = self.lock();
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
            caller: requester.caller.clone(),
            overrode_freeze: requester.overrode_freeze.clone(),
            approved_by: requester.approved_by.clone(),
            summary,
            error,
            pid: std::process::id(),
            previous_pid: None,
            shadow: None,
            certificate: None,
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

    /// Keeps a shadow stage's report with `operation` (the last one
    /// recorded when `None`).
    pub(super) fn attach_shadow(&self, operation: Option<&str>, report: ShadowReport) {
        let id = match operation {
            Some(id) => Some(id.to_owned()),
            None => self.lock().operations().next().map(|o| o.id.clone()),
        };
        if let Some(id) = id {
            self.with(|history| {
                history.update_operation(&id, |record| record.shadow = Some(report));
            });
        }
    }

    /// The id of the operation recorded last.
    pub(super) fn last_operation_id(&self) -> Option<String> {
        self.lock().operations().next().map(|o| o.id.clone())
    }
}

pub(super) fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Who asked for an operation and why, as the operation log keeps it.
#[derive(Debug, Clone, Default)]
pub struct Requester {
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    /// The authenticated admin caller (`admin.callers`), beside the free
    /// text of `requested_by`.
    pub caller: Option<String>,
    /// The freeze window the operation went through, by `override`.
    pub overrode_freeze: Option<crate::plan::Frozen>,
    /// The callers that approved it (a proposal carried out).
    pub approved_by: Vec<String>,
}

impl Requester {
    pub fn of(candidate: &Candidate) -> Self {
        Self {
            requested_by: candidate.requested_by.clone(),
            reason: candidate.reason.clone(),
            caller: candidate.caller.clone(),
            overrode_freeze: None,
            approved_by: candidate.approved_by.clone(),
        }
    }
}

/// Metadata of a commit, for history.
pub(super) struct CommitMeta {
    pub(super) kind: OperationKind,
    pub(super) source: Source,
    pub(super) rolled_back_to: Option<GenerationId>,
    pub(super) requester: Requester,
    pub(super) text: ConfigText,
    /// The canary the new generation starts with, published with it in
    /// one swap (whatever canary ran before ends in the same swap).
    pub(super) canary: Option<crate::runtime::Canary>,
}

/// Each retained generation's `rollback_candidate`, computed against the
/// active generation named here: once per activation, not once per
/// history request (planning a large configuration takes milliseconds:
/// `docs/performance.md`).
#[derive(Default)]
pub(super) struct Candidacy(Mutex<(GenerationId, HashMap<GenerationId, bool>)>);

impl Candidacy {
    /// Whether `generation` could be activated against `active`, if known.
    fn known(&self, active: GenerationId, generation: GenerationId) -> Option<bool> {
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.0 != active {
            *cache = (active, HashMap::new());
        }
        cache.1.get(&generation).copied()
    }

    /// Remembers it, unless the active generation moved meanwhile.
    fn remember(&self, active: GenerationId, generation: GenerationId, activatable: bool) {
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.0 == active {
            cache.1.insert(generation, activatable);
        }
    }

    /// Whether retained `record` could be activated now, against
    /// `active`: it validates (its files are still there), needs no
    /// restart and changes something. Planned once per retained and
    /// active generation.
    pub(super) fn activatable(&self, active: &Generation, record: &GenerationRecord) -> bool {
        if record.config_version == active.spec.config_version {
            // Activating it would change nothing.
            return false;
        }
        if let Some(known) = self.known(active.id, record.generation) {
            return known;
        }
        // Planned without the lock: two requests at once may both plan.
        let activatable = record.config_text().is_ok_and(|text| {
            crate::plan::plan(&text, Some((active.id, &active.spec))).activatable
        });
        self.remember(active.id, record.generation, activatable);
        activatable
    }

    #[cfg(test)]
    pub(super) fn summary(&self) -> (GenerationId, usize) {
        let cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (cache.0, cache.1.len())
    }
}

impl crate::keeper::Journal for Records {
    fn certificate(
        &self,
        generation: GenerationId,
        started: Instant,
        outcome: Outcome,
        summary: String,
        error: Option<String>,
        certificate: crate::runtime::CertificateRecord,
    ) {
        let mut history = self.lock();
        let id = history.next_operation_id();
        history.record_operation(OperationRecord {
            id,
            kind: OperationKind::Certificate,
            at: rfc3339(SystemTime::now()),
            duration_ms: elapsed_ms(started),
            outcome,
            generation: Some(generation),
            previous_generation: Some(generation),
            requested_by: Some("cutover".to_owned()),
            reason: Some("acme".to_owned()),
            caller: None,
            overrode_freeze: None,
            approved_by: Vec::new(),
            summary,
            error,
            pid: std::process::id(),
            previous_pid: None,
            shadow: None,
            certificate: Some(certificate),
        });
        if let Err(error) = history.persist() {
            tracing::error!(%error, "cannot persist history");
        }
    }
}

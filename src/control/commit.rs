//! The commit path every change takes, on [`Changes`]: the
//! lock-and-check of `begin_change`, the expected-generation rule
//! (`expectation.rs`), build, bind, compare-and-swap, history and
//! persistence (`records.rs`); activation and rollback through it, and
//! the record of a refused change.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::answers::Activation;
use super::candidate::{self, Candidate, RollbackRequest};
use super::changes::Changes;
use super::error::ControlError;
use super::expectation::{admit_change, admit_in_freeze, Expectation};
use super::pending::{Deadline, Pending};
use super::records::{elapsed_ms, CommitMeta, Requester};
use crate::generation::{self, Generation};
use crate::ids::GenerationId;
use crate::plan::{self, Plan};
use crate::runtime::{rfc3339, GenerationRecord, OperationKind, Outcome, RetainedText, Source};
use crate::telemetry::metrics as m;

pub(super) fn plan_summary(plan: &Plan) -> String {
    if !plan.errors.is_empty() {
        return format!("{} errors", plan.errors.len());
    }
    let s = &plan.diff.summary;
    format!(
        "+{} -{} ~{}, {} restart-required",
        s.added, s.removed, s.modified, s.restart_required
    )
}

/// The plan with its spec when it can be activated; refused with it
/// otherwise (its errors, or its restart-required changes).
pub(super) fn activatable(plan: Plan) -> Result<(Plan, Arc<plan::Spec>), ControlError> {
    if !plan.errors.is_empty() {
        return Err(ControlError::Invalid(Box::new(plan)));
    }
    if !plan.rejected.is_empty() {
        return Err(ControlError::RestartRequired(Box::new(plan)));
    }
    match plan.spec.clone() {
        Some(spec) => Ok((plan, spec)),
        None => Err(ControlError::Invalid(Box::new(plan))),
    }
}

pub fn operation_kind_name(kind: OperationKind) -> &'static str {
    match kind {
        OperationKind::Preview => "preview",
        OperationKind::Activate => "activate",
        OperationKind::Reload => "reload",
        OperationKind::Rollback => "rollback",
        OperationKind::ReloadCerts => "reload_certs",
        OperationKind::Certificate => "certificate",
        OperationKind::Drain => "drain",
        OperationKind::Upgrade => "upgrade",
        OperationKind::Confirm => "confirm",
        OperationKind::Abort => "abort",
        OperationKind::AutoRollback => "auto_rollback",
        OperationKind::CachePurge => "cache_purge",
        OperationKind::Other => "other",
    }
}

impl Changes {
    pub(super) fn try_activate(
        &self,
        candidate: &Candidate,
        kind: OperationKind,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        let (_operation, active) = self.begin_change()?;
        self.activate_locked(candidate, kind, started, active)
    }

    /// `try_activate` once the operation lock is held (by the caller).
    pub(super) fn activate_locked(
        &self,
        candidate: &Candidate,
        kind: OperationKind,
        started: Instant,
        active: Arc<Generation>,
    ) -> Result<Activation, ControlError> {
        // One pending change at a time: a new one must name the pending
        // generation to supersede it; the rollback target stays the last
        // final generation.
        let superseded = self.pending.get();
        let expected = if kind == OperationKind::Activate {
            Expectation::activation(candidate.expected_generation, &active.spec)
        } else {
            Expectation::optional(candidate.expected_generation)
        };
        admit_change(
            expected,
            active.id,
            superseded.as_ref().map(|p| p.generation),
        )?;
        let overrode_freeze = match kind {
            OperationKind::Activate | OperationKind::Reload => {
                admit_in_freeze(&active.spec, candidate.freeze).map_err(ControlError::Frozen)?
            }
            _ => None,
        };
        // A canary's other side is the last final generation: the
        // canary's previous side while one runs.
        let canary = candidate
            .canary
            .as_ref()
            .map(|spec| crate::runtime::Canary {
                previous: self
                    .store
                    .canary()
                    .map_or_else(|| Arc::clone(&active), |c| c.previous),
                percent: spec.steps.first().copied().unwrap_or(100),
                key: spec.key.clone(),
            });
        let text = candidate::read(&candidate.source, self.file.path())?;
        let plan = plan::plan(&text, Some((active.id, &active.spec)));
        let meta = CommitMeta {
            kind,
            source: if kind == OperationKind::Reload {
                Source::Reload
            } else {
                Source::Activate
            },
            rolled_back_to: None,
            requester: Requester {
                overrode_freeze,
                ..Requester::of(candidate)
            },
            text,
            canary,
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
            step_ends: candidate
                .canary
                .as_ref()
                .map(|c| tokio::time::Instant::now() + c.step_interval),
        });
        let final_now = pending.is_none();
        self.pending.set(&self.records, pending);
        activation.pending = self.pending_view();
        if let Some(pending) = &activation.pending {
            self.events().emit(
                "pending",
                serde_json::json!({ "generation": pending.generation, "pending": pending }),
            );
        }
        if final_now && kind == OperationKind::Activate {
            self.write_back();
        }
        Ok(activation)
    }

    /// Starts a mutating operation: the one-writer lock (409 while another
    /// runs), a running process (503 while draining), the active generation.
    pub(super) fn begin_change(
        &self,
    ) -> Result<(tokio::sync::MutexGuard<'_, ()>, Arc<Generation>), ControlError> {
        let guard = self.lock.take_for_change()?;
        Ok((guard, self.store.load_full()))
    }

    /// plan → build → bind → compare-and-swap → history → persist.
    pub(super) fn commit(
        &self,
        active: &Arc<Generation>,
        plan: Plan,
        meta: CommitMeta,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        let (plan, spec) = activatable(plan)?;
        if plan.is_unchanged(Some(&active.spec)) {
            let operation_id = self.records.record(
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
                outcome: "unchanged".into(),
                generation: active.id,
                previous_generation: active.id,
                config_version: spec.config_version.clone(),
                rolled_back_to: None,
                duration_ms: elapsed_ms(started),
                listeners: self.listeners.info(),
                diff: plan.diff,
                operation_id,
                pending: None,
                shadow: None,
            });
        }
        let next_id = active.id.next();
        // A new discovery source's first answer is in before the swap.
        let _primed = self.shared.discovery.prime_blocking(&spec);
        let next =
            match generation::build_from(Arc::clone(&spec), next_id, &self.shared, Some(active)) {
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
        // The history lock is held from before the swap until the new
        // generation is recorded: a reader that saw it active and then
        // takes the lock (the status view, a history request after it)
        // finds its record. Compressed before the lock is taken.
        let config = RetainedText::new(&meta.text.text);
        let mut history = self.records.lock();
        // A drain sets its phase under this lock: a commit that gets here
        // after a drain was acknowledged swaps nothing (503).
        self.lock.check_running()?;
        // INVARIANT: we hold the operation lock, so the active generation
        // cannot have moved since `active` was loaded; the CAS still
        // guards against a writer outside this type.
        let committed = self
            .store
            .commit(active.id, next, meta.canary)
            .map_err(|c| ControlError::Conflict {
                expected: c.expected,
                active: c.active,
            })?;
        history.set_limit(spec.runtime.history_limit);
        history.record_generation(GenerationRecord {
            generation: committed.id,
            config_version: spec.config_version.clone(),
            activated_at: rfc3339(SystemTime::now()),
            source: meta.source,
            rolled_back_to: meta.rolled_back_to,
            requested_by: meta.requester.requested_by.clone(),
            reason: meta.requester.reason.clone(),
            caller: meta.requester.caller.clone(),
            config,
            base_dir: meta.text.base_dir.clone(),
            origin: meta.text.origin.clone(),
        });
        drop(history);
        // Handshakes already get the new generation's certificates (the
        // store follows the active generation); installing them makes
        // them the stored material that reload-certs starts from.
        super::certs::install(&self.certificates, certificates);
        self.listeners.start(bound);
        self.log_level.apply(&spec.log.level);
        crate::telemetry::access::set_enabled(spec.log.access);
        crate::telemetry::trace::set_sample_ratio(spec.tracing.sample_ratio);
        metrics::gauge!(m::ACTIVE_GENERATION).set(committed.id.0 as f64);
        let summary = format!(
            "+{} -{} ~{}",
            plan.diff.summary.added, plan.diff.summary.removed, plan.diff.summary.modified
        );
        let operation_id = self.records.record(
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
            outcome: "activated".into(),
            generation: committed.id,
            previous_generation: active.id,
            config_version: spec.config_version.clone(),
            rolled_back_to: meta.rolled_back_to,
            duration_ms: elapsed_ms(started),
            listeners: self.listeners.info(),
            diff: plan.diff,
            operation_id,
            pending: None,
            shadow: None,
        })
    }

    pub(super) fn rollback_now(
        &self,
        request: RollbackRequest,
    ) -> Result<Activation, ControlError> {
        let started = Instant::now();
        let requester = Requester {
            requested_by: request.requested_by.clone(),
            reason: request.reason.clone(),
            caller: request.caller.clone(),
            overrode_freeze: None,
            approved_by: request.approved_by.clone(),
        };
        let result = self.try_rollback(&request, &requester, started);
        if let Err(error) = &result {
            self.record_failure(OperationKind::Rollback, started, &requester, error);
        }
        result
    }

    pub(super) fn try_rollback(
        &self,
        request: &RollbackRequest,
        requester: &Requester,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        let (_operation, active) = self.begin_change()?;
        let target = request.target_generation;
        if self.records.lock().generation(target).is_none() {
            return Err(ControlError::NotRetained(target));
        }
        admit_change(
            Expectation::optional(request.expected_active_generation),
            active.id,
            None,
        )?;
        let activation = self.rollback_locked(
            &active,
            target,
            OperationKind::Rollback,
            Source::Rollback,
            requester,
            started,
        )?;
        // An operator's rollback settles a pending generation too.
        self.pending.set(&self.records, None);
        self.write_back();
        Ok(activation)
    }

    /// Activates retained generation `target`'s configuration as a new
    /// generation; the operation lock is held by the caller.
    pub(super) fn rollback_locked(
        &self,
        active: &Arc<Generation>,
        target: GenerationId,
        kind: OperationKind,
        source: Source,
        requester: &Requester,
        started: Instant,
    ) -> Result<Activation, ControlError> {
        let record = self
            .records
            .lock()
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
            // A rollback ends whatever canary ran, in its own swap.
            canary: None,
        };
        self.commit(active, plan, meta, started)
    }

    pub(super) fn count_activation(
        &self,
        kind: OperationKind,
        outcome: &'static str,
        started: Instant,
    ) {
        let kind = operation_kind_name(kind);
        metrics::counter!(m::ACTIVATIONS, m::LABEL_KIND => kind, m::LABEL_OUTCOME => outcome)
            .increment(1);
        metrics::histogram!(m::ACTIVATION_DURATION).record(started.elapsed().as_secs_f64());
    }

    pub(super) fn record_failure(
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
        self.records.record(
            kind,
            started,
            outcome,
            (None, Some(self.store.active_id())),
            requester,
            error.to_string(),
            Some(error.to_string()),
        );
    }
}

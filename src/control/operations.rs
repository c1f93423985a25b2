//! The operations a writer offers on this instance: validate, preview,
//! activate, reload, rollback and certificate reload, each planned off the
//! data plane.

use std::sync::Arc;
use std::time::Instant;

use super::answers::{Activation, RecordedPlan};
use super::cache::Purged;
use super::candidate::{self, Candidate, RollbackRequest};
use super::certs::CertReload;
use super::commit::plan_summary;
use super::error::ControlError;
use super::expectation::{admit_change, Expectation};
use super::local::Control;
use super::records::{CommitMeta, Requester};
use crate::cache::Selector;
use crate::config::ConfigText;
use crate::generation::Generation;
use crate::ids::GenerationId;
use crate::plan::{self, Plan};
use crate::runtime::{OperationKind, Outcome, Source};
use crate::telemetry::metrics as m;

impl Control {
    /// Plans a candidate against the active generation. Pure: binds,
    /// writes and records nothing. Returns the text it read, for the
    /// discovery notes (`discovery_notes`).
    pub(super) fn plan_candidate(
        &self,
        candidate: &Candidate,
    ) -> Result<(Plan, ConfigText), ControlError> {
        let text = candidate::read(&candidate.source, self.file.path())?;
        let active = self.store.load_full();
        let mut plan = plan::plan(&text, Some((active.id, &active.spec)));
        // What it would do to the traffic sampled now (DESIGN §22).
        if let Some(spec) = &plan.spec {
            plan.impact = crate::impact::of_sampled(
                &self.shared,
                crate::impact::Before::Active,
                spec,
                &active,
            );
        }
        Ok((plan, text))
    }

    /// What the discovery sources of the candidate's new and changed
    /// upstreams give now (the live set of a source the process follows,
    /// else one resolution, all at once and bounded), and a warning, with
    /// its line and column, for each that gives none: a name may resolve
    /// later, so it does not refuse the candidate (DESIGN §20).
    pub(super) async fn discovery_notes(&self, plan: &mut Plan, text: &ConfigText) {
        let Some(spec) = plan.spec.clone() else {
            return;
        };
        let active = self.store.load_full();
        let discovery = &self.shared.discovery;
        let patience = discovery.patience();
        let mut asked = Vec::new();
        for u in spec.upstreams.iter().filter(|u| !u.sources.is_empty()) {
            if active.spec.file.upstreams.get(&u.name) == spec.file.upstreams.get(&u.name) {
                continue;
            }
            // The entries the sources came from, in order.
            let entries: Vec<usize> = spec
                .file
                .upstreams
                .get(&u.name)
                .map(|f| {
                    f.backends
                        .iter()
                        .enumerate()
                        .filter(|(_, b)| b.addr.is_none())
                        .map(|(i, _)| i)
                        .collect()
                })
                .unwrap_or_default();
            for (source, entry) in u.sources.iter().zip(entries) {
                let key = crate::discovery::SourceKey {
                    upstream: u.name.clone(),
                    spec: source.clone(),
                };
                asked.push((u.name.clone(), entry, key));
            }
        }
        if asked.is_empty() {
            return;
        }
        let peeks = futures_util::future::join_all(
            asked
                .iter()
                .map(|(_, _, key)| discovery.peek(key, patience)),
        )
        .await;
        let mut warnings = Vec::new();
        for ((upstream, entry, key), peek) in asked.into_iter().zip(peeks) {
            if peek.endpoints.is_empty() {
                let field = match key.spec {
                    crate::plan::SourceSpec::Dns { .. } => "dns",
                    crate::plan::SourceSpec::Srv { .. } => "srv",
                    crate::plan::SourceSpec::File { .. } => "endpoints_file",
                };
                warnings.push(crate::config::Diagnostic::new(
                    crate::config::Code::UnresolvedName,
                    format!(
                        "upstreams.{}.backends[{entry}].{field}",
                        crate::config::quote_key(&upstream)
                    ),
                    format!(
                        "{} gives no member now ({}); upstream '{upstream}' answers 503 until it does",
                        key.spec.label(),
                        peek.error.as_deref().unwrap_or("no records"),
                    ),
                ));
            }
            let source = crate::plan::SourceMembers {
                source: key.spec.label(),
                members: crate::discovery::addresses(&peek.endpoints),
                error: peek.error,
                followed: peek.followed,
            };
            match plan.members.iter_mut().find(|m| m.upstream == upstream) {
                Some(members) => members.sources.push(source),
                None => plan.members.push(crate::plan::UpstreamMembers {
                    upstream,
                    sources: vec![source],
                }),
            }
        }
        plan.warnings = crate::config::locate(text, warnings);
    }

    /// Records a preview's plan in the operation log.
    fn record_preview(
        &self,
        candidate: &Candidate,
        plan: Plan,
        started: Instant,
    ) -> Result<RecordedPlan, ControlError> {
        let outcome = if plan.activatable {
            Outcome::Succeeded
        } else {
            Outcome::Rejected
        };
        let summary = plan_summary(&plan);
        let operation_id = self.records.record(
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
    pub(super) async fn off_the_data_plane<T: Send + 'static>(
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
        let (mut plan, text) = self
            .off_the_data_plane(move |c| c.plan_candidate(&candidate))
            .await?;
        self.discovery_notes(&mut plan, &text).await;
        Ok(plan)
    }

    /// Plans like `validate` and records the preview in the operation log.
    pub async fn preview(
        self: &Arc<Self>,
        candidate: Candidate,
    ) -> Result<RecordedPlan, ControlError> {
        let started = Instant::now();
        let (mut plan, text) = {
            let candidate = candidate.clone();
            self.off_the_data_plane(move |c| c.plan_candidate(&candidate))
                .await?
        };
        self.discovery_notes(&mut plan, &text).await;
        self.off_the_data_plane(move |c| c.record_preview(&candidate, plan, started))
            .await
    }

    /// Re-reads the certificate material of the active configuration's
    /// TLS listeners (all, or those named) and swaps it in one step (see
    /// `certs::reload`); on any failure nothing changes. Recorded either
    /// way, `requested_by` with it.
    pub async fn reload_certs(
        self: &Arc<Self>,
        only: Option<Vec<String>>,
        requested_by: Option<String>,
        caller: Option<String>,
    ) -> Result<CertReload, ControlError> {
        let requester = Requester {
            requested_by,
            reason: None,
            caller,
            overrode_freeze: None,
            approved_by: Vec::new(),
        };
        self.off_the_data_plane(move |c| {
            let started = Instant::now();
            // The operation lock is held until the reload is recorded.
            let result = c.lock.take().and_then(|operation| {
                let active = c.store.load_full();
                let reloaded = super::certs::reload(&c.certificates, &active, only.as_deref())?;
                Ok((operation, active.id, reloaded))
            });
            let outcome = if result.is_ok() {
                "succeeded"
            } else {
                "failed"
            };
            metrics::counter!(m::CERT_RELOADS, m::LABEL_OUTCOME => outcome).increment(1);
            let (_operation, generation, reloaded) = match result {
                Ok(done) => done,
                Err(error) => {
                    tracing::warn!(%error, "certificate reload refused; the previous certificates stay");
                    c.records.record(
                        OperationKind::ReloadCerts,
                        started,
                        match error {
                            ControlError::InProgress => Outcome::Conflict,
                            _ => Outcome::Rejected,
                        },
                        (None, Some(c.store.active_id())),
                        &requester,
                        error.to_string(),
                        Some(error.to_string()),
                    );
                    return Err(error);
                }
            };
            let operation_id = c.records.record(
                OperationKind::ReloadCerts,
                started,
                Outcome::Succeeded,
                (Some(generation), Some(generation)),
                &requester,
                reloaded.summary,
                None,
            );
            Ok(CertReload {
                outcome: "reloaded".into(),
                generation,
                listeners: reloaded.listeners,
                warnings: reloaded.warnings,
                secrets: reloaded.secrets,
                auth_answers_forgotten: reloaded.auth_answers_forgotten,
                operation_id,
            })
        })
        .await
    }

    /// Forgets what `selector` names in `zone` (every zone of the active
    /// generation when `None`), and records it. A purge changes no
    /// generation: it takes no operation lock and runs beside an
    /// activation, off the data plane's threads (a prefix or tag looks at
    /// every key, and the record is written to disk).
    pub async fn purge_cache(
        self: &Arc<Self>,
        zone: Option<String>,
        selector: Selector,
        requester: Requester,
    ) -> Result<Purged, ControlError> {
        self.off_the_data_plane(move |c| {
            let started = Instant::now();
            let active = c.store.load_full();
            let (zones, summary) = super::cache::purge(&active, zone.as_deref(), &selector)?;
            let operation_id = c.records.record(
                OperationKind::CachePurge,
                started,
                Outcome::Succeeded,
                (Some(active.id), Some(active.id)),
                &requester,
                summary,
                None,
            );
            Ok(Purged {
                purged: zones.iter().map(|z| z.purged).sum(),
                zones,
                operation_id,
            })
        })
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
        if let Some(spec) = candidate.shadow.clone() {
            return self.activate_shadowed(candidate, kind, spec).await;
        }
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
        self.supervise_new(&activation);
        Ok(activation)
    }

    /// Starts supervising the generation an activation left pending.
    pub(super) fn supervise_new(self: &Arc<Self>, activation: &Activation) {
        if let Some(view) = &activation.pending {
            // Superseded or settled since, its successor's own call (or
            // nothing) supervises.
            let pending = self
                .pending
                .get()
                .filter(|p| p.generation == view.generation);
            if let Some(pending) = pending {
                self.supervise(&pending);
            }
        }
    }

    /// With the active generation's `runtime.write_back`, rewrites the
    /// configuration file with its text, so that a restart without a state
    /// dir comes up on what runs. Called once a change through the API is
    /// final (not while it pends).
    pub(super) fn write_back(&self) {
        if !self.store.load_full().spec.runtime.write_back {
            return;
        }
        if let Some(text) = self.active_config() {
            self.file.write(&text);
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

    pub(super) fn rollback_now(
        &self,
        request: RollbackRequest,
    ) -> Result<Activation, ControlError> {
        let started = Instant::now();
        let result = self.try_rollback(&request, started);
        if let Err(error) = &result {
            let requester = Requester {
                requested_by: request.requested_by.clone(),
                reason: request.reason.clone(),
                caller: request.caller.clone(),
                overrode_freeze: None,
                approved_by: request.approved_by.clone(),
            };
            self.record_failure(OperationKind::Rollback, started, &requester, error);
        }
        result
    }

    pub(super) fn try_rollback(
        &self,
        request: &RollbackRequest,
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
        let requester = Requester {
            requested_by: request.requested_by.clone(),
            reason: request.reason.clone(),
            caller: request.caller.clone(),
            overrode_freeze: None,
            approved_by: request.approved_by.clone(),
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
}

//! The operations a writer offers on this instance: validate, preview,
//! activate, reload, rollback, settle, certificate reload and cache
//! purge, each run off the data plane by the owner of what it changes
//! (`changes.rs` and the commit path's files, `certs.rs`, `cache.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::answers::{Activation, RecordedPlan, Settled};
use super::cache::Purged;
use super::candidate::{self, Candidate, RollbackRequest, Settle, SettleRequest};
use super::certs::CertReload;
use super::changes::Changes;
use super::commit::plan_summary;
use super::error::ControlError;
use super::local::Control;
use super::records::Requester;
use super::shadow::ShadowHandle;
use crate::cache::Selector;
use crate::config::ConfigText;
use crate::plan::{self, Plan};
use crate::runtime::{OperationKind, Outcome};
use crate::telemetry::metrics as m;

impl Control {
    /// Plans a candidate against the active generation. Pure: binds,
    /// writes and records nothing. Runs off the data plane's threads.
    pub async fn validate(self: &Arc<Self>, candidate: Candidate) -> Result<Plan, ControlError> {
        let (mut plan, text) = self
            .changes
            .off_the_data_plane(move |c| plan_candidate(c, &candidate))
            .await?;
        discovery_notes(&self.changes, &mut plan, &text).await;
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
            self.changes
                .off_the_data_plane(move |c| plan_candidate(c, &candidate))
                .await?
        };
        discovery_notes(&self.changes, &mut plan, &text).await;
        self.changes
            .off_the_data_plane(move |c| record_preview(c, &candidate, plan, started))
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
        self.changes.off_the_data_plane(move |c| {
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
        self.changes
            .off_the_data_plane(move |c| {
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
            return self.changes.activate_shadowed(candidate, kind, spec).await;
        }
        let activation = self
            .changes
            .off_the_data_plane(move |c| {
                let started = Instant::now();
                let result = c.try_activate(&candidate, kind, started);
                if let Err(error) = &result {
                    c.record_failure(kind, started, &Requester::of(&candidate), error);
                }
                result
            })
            .await?;
        self.changes.supervise_new(&activation);
        Ok(activation)
    }

    /// Activates the content of a retained generation as a new generation.
    pub async fn rollback(
        self: &Arc<Self>,
        request: RollbackRequest,
    ) -> Result<Activation, ControlError> {
        self.changes
            .off_the_data_plane(move |c| c.rollback_now(request))
            .await
    }

    /// Confirms or rolls back the pending generation (DESIGN §14); an
    /// abort naming the candidate of a running shadow stage stops the
    /// stage instead.
    pub async fn settle(
        self: &Arc<Self>,
        request: SettleRequest,
        how: Settle,
    ) -> Result<Settled, ControlError> {
        if how == Settle::Abort && self.changes.shadowing.abort(request.generation) {
            return self.changes.shadow_aborted(request.generation).await;
        }
        self.changes.settle(request, how).await
    }

    /// After a restart or an upgrade: takes up the pending generation the
    /// history kept (see `Changes::resume_pending`).
    pub fn resume_pending(self: &Arc<Self>) {
        self.changes.resume_pending();
    }

    /// Starts shadowing `candidate` for another writer that judges it (a
    /// fleet's stage; see `Changes::start_shadow`): `None` when the
    /// candidate changes nothing here. `stage`: its percent, copies in
    /// flight, and whether it is a WAF shadow.
    pub async fn start_shadow(
        self: &Arc<Self>,
        candidate: Candidate,
        stage: (f64, u32, bool),
    ) -> Result<Option<ShadowHandle>, ControlError> {
        self.changes.start_shadow(candidate, stage).await
    }
}

/// Plans a candidate against the active generation. Pure: binds,
/// writes and records nothing. Returns the text it read, for the
/// discovery notes (`discovery_notes`).
fn plan_candidate(c: &Changes, candidate: &Candidate) -> Result<(Plan, ConfigText), ControlError> {
    let text = candidate::read(&candidate.source, c.file.path())?;
    let active = c.store.load_full();
    let mut plan = plan::plan(&text, Some((active.id, &active.spec)));
    // What it would do to the traffic sampled now (DESIGN §22).
    if let Some(spec) = &plan.spec {
        plan.impact =
            crate::impact::of_sampled(&c.shared, crate::impact::Before::Active, spec, &active);
    }
    Ok((plan, text))
}

/// What the discovery sources of the candidate's new and changed
/// upstreams give now (the live set of a source the process follows,
/// else one resolution, all at once and bounded), and a warning, with
/// its line and column, for each that gives none: a name may resolve
/// later, so it does not refuse the candidate (DESIGN §20).
async fn discovery_notes(c: &Changes, plan: &mut Plan, text: &ConfigText) {
    let Some(spec) = plan.spec.clone() else {
        return;
    };
    let active = c.store.load_full();
    let discovery = &c.shared.discovery;
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
    c: &Changes,
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
    let operation_id = c.records.record(
        OperationKind::Preview,
        started,
        outcome,
        (Some(c.store.active_id()), None),
        &Requester::of(candidate),
        summary,
        None,
    );
    Ok(RecordedPlan { plan, operation_id })
}

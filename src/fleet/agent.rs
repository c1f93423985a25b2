//! The per-instance agent: one session with etcd at a time, re-opened with
//! back-off when it fails. A session checks the prefix's format, takes a
//! lease for the instance's status key, reads `active` (applying it when
//! newer than what the instance serves) and watches it from the revision
//! read. A cancelled or compacted watch lists again; a failed one ends the
//! session. Nothing here can stop traffic: the data plane serves whatever
//! generation was applied last.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use super::etcd::wire::{EventType, Response, TxnRequest};
use super::etcd::{self, Client};
use super::records::{
    self, ActiveRecord, BoundListener, GenerationDoc, InstanceRecord, Meta, Report,
};
use super::{within, Applied, Fleet, FleetError};
use crate::control::{Activation, Candidate, CandidateSource, ControlError};
use crate::ids::GenerationId;
use crate::runtime::{rfc3339, OperationKind, Phase};
use crate::telemetry::metrics as m;

/// The first retry after a failed session, doubled up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(3);
/// A prefix of another format is looked at again this often (someone may
/// fix it), without filling the log.
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// Runs sessions for as long as the process lives.
pub(super) async fn run(fleet: Arc<Fleet>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let error = session(&fleet).await;
        if leaving(&fleet) {
            tracing::info!("fleet: draining; this instance left the fleet");
            return;
        }
        metrics::gauge!(m::FLEET_CONNECTED).set(0.0);
        *fleet.lease.lock().unwrap_or_else(PoisonError::into_inner) = None;
        // A session that was up starts the back-off over.
        let was_up = fleet
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_ok();
        if was_up {
            backoff = FIRST_BACKOFF;
        }
        let wait = match &error {
            FleetError::Refused(message) => {
                tracing::error!(prefix = %fleet.spec.prefix, "fleet: {message}");
                REFUSED_RETRY
            }
            other => {
                tracing::warn!(prefix = %fleet.spec.prefix, error = %other, retry_in = ?backoff, "fleet: etcd session lost; serving the applied generation");
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        *fleet.session.lock().unwrap_or_else(PoisonError::into_inner) = Err(error.to_string());
        tokio::time::sleep(wait).await;
    }
}

/// Whether the process is draining (or stopped): it applies nothing more
/// and its status key goes with its lease.
fn leaving(fleet: &Fleet) -> bool {
    matches!(
        fleet.control.phase().get(),
        Phase::Draining | Phase::Stopped
    )
}

/// One session; returns why it ended.
async fn session(fleet: &Arc<Fleet>) -> FleetError {
    let client = match fleet.client().await {
        Ok(client) => client,
        Err(error) => return error,
    };
    if let Err(error) = check_format(fleet, &client).await {
        return error;
    }
    // etcd expires leases in a sweep every half second, after their TTL
    // in whole seconds: a second less than `lease_ttl` ends within it.
    let ttl = i64::try_from(fleet.spec.lease_ttl.as_secs().saturating_sub(1)).unwrap_or(9);
    let lease = match within(client.lease_grant(ttl)).await {
        Ok(lease) => lease,
        Err(error) => return error,
    };
    let mut keeper = match within(client.lease_keep_alive(lease)).await {
        Ok(keeper) => keeper,
        Err(error) => return error,
    };
    *fleet.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease);
    let member = serde_json::json!({ "instance": fleet.spec.instance, "joined_at": rfc3339(SystemTime::now()) });
    if let Err(error) = within(client.put(
        fleet.keys.member(&fleet.spec.instance),
        member.to_string(),
        0,
    ))
    .await
    {
        return error;
    }
    if let Err(error) = fleet.report_now(&client).await {
        return error;
    }
    *fleet.session.lock().unwrap_or_else(PoisonError::into_inner) = Ok(());
    metrics::gauge!(m::FLEET_CONNECTED).set(1.0);
    tracing::info!(prefix = %fleet.spec.prefix, instance = %fleet.spec.instance, "fleet: joined");
    let mut renew = tokio::time::interval(Duration::from_secs(ttl.unsigned_abs()) / 3);
    let mut phase = fleet.control.phase().subscribe();
    loop {
        // List: what is active now, and from which revision to watch.
        let revision = match within(client.get(fleet.keys.active())).await {
            Ok(answer) => {
                let revision = answer.header.map_or(0, |h| h.revision);
                if let Some(kv) = answer.kvs.first() {
                    fleet.on_active(&kv.value).await;
                }
                revision
            }
            Err(error) => return error,
        };
        let mut watch = match within(client.watch(fleet.keys.active(), revision + 1)).await {
            Ok(watch) => watch,
            Err(error) => return error,
        };
        loop {
            tokio::select! {
                message = watch.message() => match message {
                    Ok(Some(answer)) if answer.canceled || answer.compact_revision > 0 => {
                        tracing::warn!(
                            compact_revision = answer.compact_revision,
                            reason = answer.cancel_reason,
                            "fleet: watch cancelled; listing again"
                        );
                        break;
                    }
                    Ok(Some(answer)) => {
                        for event in &answer.events {
                            match (EventType::try_from(event.r#type), &event.kv) {
                                (Ok(EventType::Put), Some(kv)) => fleet.on_active(&kv.value).await,
                                _ => tracing::warn!("fleet: the active key was deleted; serving the applied generation"),
                            }
                        }
                    }
                    Ok(None) => return FleetError::Lost("etcd closed the watch"),
                    Err(error) => return error.into(),
                },
                _ = phase.changed() => {
                    // The drain revokes the lease (`Fleet::leave`).
                    if leaving(fleet) {
                        return FleetError::Lost("draining");
                    }
                }
                _ = renew.tick() => {
                    match within(keeper.keep_alive()).await {
                        Ok(Some(answer)) if answer.ttl > 0 => {}
                        Ok(_) => return FleetError::Lost("the lease expired"),
                        Err(error) => return error,
                    }
                    // A status write that failed (an ack left saying
                    // "applying") is not left until the next session.
                    if fleet.unsaid.load(Ordering::Relaxed) {
                        fleet.say().await;
                    }
                }
            }
        }
    }
}

/// Writes `meta` when the prefix is new; refuses a prefix of another
/// format.
async fn check_format(fleet: &Fleet, client: &Client) -> Result<(), FleetError> {
    let key = fleet.keys.meta();
    let ours =
        serde_json::to_vec(&Meta::current()).map_err(|e| FleetError::Refused(e.to_string()))?;
    let txn = TxnRequest {
        compare: vec![etcd::created_at(key.clone(), 0)],
        success: vec![etcd::put_op(key.clone(), ours)],
        failure: vec![etcd::get_op(key.clone())],
    };
    let answer = within(client.txn(txn)).await?;
    if answer.succeeded {
        return Ok(());
    }
    let existing = answer
        .responses
        .into_iter()
        .find_map(|op| match op.response {
            Some(Response::Range(get)) => get.kvs.into_iter().next().map(|kv| kv.value),
            _ => None,
        });
    let meta: Option<Meta> = existing.and_then(|bytes| serde_json::from_slice(&bytes).ok());
    match meta {
        Some(meta) if meta.format == records::FORMAT => Ok(()),
        Some(meta) => Err(FleetError::Refused(format!(
            "the fleet prefix {} holds layout format {} (created by {}); this {} reads format {}: use another prefix, or run the same version on every instance",
            fleet.keys.prefix(),
            meta.format,
            meta.created_by,
            Meta::current().created_by,
            records::FORMAT
        ))),
        None => Err(FleetError::Refused(format!(
            "{key} is not a cutover fleet's meta record: the prefix {} is used by something else",
            fleet.keys.prefix()
        ))),
    }
}

impl Fleet {
    /// A value of `active` seen by the watch or a list.
    async fn on_active(self: &Arc<Self>, value: &[u8]) {
        match serde_json::from_slice::<ActiveRecord>(value) {
            Ok(record) => {
                *self
                    .last_active
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(record.clone());
                self.apply(&record, None).await.ok();
                self.supervise(&record);
                self.follow_stage(&record);
            }
            Err(error) => {
                tracing::error!(%error, "fleet: the active record is unreadable; ignored");
            }
        }
    }

    /// Applies the fleet's `active` generation here when it is newer than
    /// what this instance serves: composes its document with the instance
    /// file, plans and commits it (the same code as any activation), and
    /// acks; or nacks with why, and keeps serving what it has. `doc` is
    /// the document when the caller has it already.
    pub(super) async fn apply(
        self: &Arc<Self>,
        active: &ActiveRecord,
        doc: Option<GenerationDoc>,
    ) -> Result<Option<Activation>, String> {
        let _one = self.applying.lock().await;
        let applied = self.applied();
        if active.generation <= applied.generation {
            // Stale or replayed: never go back.
            tracing::debug!(
                generation = %active.generation,
                applied = %applied.generation,
                "fleet: not newer than what is applied; ignored"
            );
            return Ok(None);
        }
        let target = active.generation;
        self.report(Report::Applying, Some(target), None, Vec::new())
            .await;
        let outcome = match doc {
            Some(doc) => Ok(doc),
            None => self.fetch(target).await,
        };
        let previous_local = self.control.store().active_id();
        let result = match outcome {
            Ok(doc) => self.commit(&doc, active).await,
            Err(error) => Err((error, Vec::new())),
        };
        match result {
            Ok((activation, shared)) => {
                self.record_applied(Applied {
                    generation: target,
                    config_version: Some(active.config_version.clone()),
                    shared: Some(shared),
                    local_generation: activation.generation,
                    previous_local,
                });
                metrics::gauge!(m::FLEET_GENERATION).set(target.0 as f64);
                metrics::counter!(m::FLEET_APPLIES, "outcome" => "ack").increment(1);
                self.control.events().emit(
                    "fleet_ack",
                    serde_json::json!({
                        "generation": activation.generation,
                        "fleet_generation": target,
                        "instance": self.spec.instance,
                    }),
                );
                self.report(Report::Ack, None, None, Vec::new()).await;
                tracing::info!(generation = %target, local = %activation.generation, "fleet: generation applied");
                Ok(Some(activation))
            }
            Err((error, diagnostics)) => {
                metrics::counter!(m::FLEET_APPLIES, "outcome" => "nack").increment(1);
                tracing::error!(generation = %target, %error, "fleet: generation refused; serving the applied one");
                self.control.events().emit(
                    "fleet_nack",
                    serde_json::json!({
                        "generation": previous_local,
                        "fleet_generation": target,
                        "instance": self.spec.instance,
                        "error": error,
                        "diagnostics": diagnostics,
                    }),
                );
                self.report(Report::Nack, Some(target), Some(error.clone()), diagnostics)
                    .await;
                Err(error)
            }
        }
    }

    /// The document of generation `id`, checked against its version.
    async fn fetch(&self, id: GenerationId) -> Result<GenerationDoc, String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let answer = within(client.get(self.keys.generation(id)))
            .await
            .map_err(|e| format!("cannot read generation {id}: {e}"))?;
        let kv = answer.kvs.first().ok_or_else(|| {
            format!(
                "generation {id} is active but its document {} is missing",
                self.keys.generation(id)
            )
        })?;
        let doc: GenerationDoc = serde_json::from_slice(&kv.value)
            .map_err(|e| format!("the document of generation {id} is unreadable: {e}"))?;
        let version = records::config_version(&doc.config);
        if doc.generation != id || doc.config_version != version {
            return Err(format!(
                "the document of generation {id} does not match its record (generation {}, {} but the text hashes to {version})",
                doc.generation, doc.config_version
            ));
        }
        Ok(doc)
    }

    /// Composes, plans and commits `doc` here; on refusal, why, with the
    /// plan's findings.
    async fn commit(
        &self,
        doc: &GenerationDoc,
        active: &ActiveRecord,
    ) -> Result<(Activation, String), (String, Vec<String>)> {
        let origin = format!(
            "{} (fleet generation {})",
            self.keys.generation(doc.generation),
            doc.generation
        );
        let text = self
            .composed(&doc.config, &origin)
            .map_err(|e| findings(&e))?;
        let candidate = Candidate {
            source: CandidateSource::Composed { text, origin },
            expected_generation: Some(self.control.store().active_id()),
            reason: Some(match &doc.reason {
                Some(reason) => format!("fleet generation {}: {reason}", doc.generation),
                None => format!("fleet generation {}", doc.generation),
            }),
            requested_by: Some(doc.requested_by.clone().unwrap_or_else(|| "fleet".into())),
            // Who wrote it, on the instance that did: each instance's
            // history names the same caller.
            caller: doc.caller.clone(),
            confirm_within: None,
            guard: None,
            // A fleet canary: each instance walks the steps on its own
            // traffic; the fleet's probation (not the instance) decides.
            canary: active
                .pending
                .as_ref()
                .and_then(|p| p.canary.as_ref())
                .map(|c| crate::control::CanarySpec {
                    steps: c.steps.clone(),
                    step_interval: Duration::from_millis(c.step_interval_ms),
                    key: c.hash_key.as_deref().and_then(crate::plan::parse_hash_key),
                }),
            // A fleet's shadow ran before the document was written.
            shadow: None,
            // The instance that wrote it met the freeze windows.
            freeze: crate::control::FreezeRule::Exempt,
            approved_by: doc.approved_by.clone(),
        };
        match self
            .control
            .activate(candidate, OperationKind::Activate)
            .await
        {
            Ok(activation) => Ok((activation, doc.config.clone())),
            Err(error) => Err(findings(&error)),
        }
    }

    /// Says `report` about generation `target` (with why, for a nack) in
    /// this instance's status key: best effort, a failed write is logged
    /// and the next session writes it again.
    pub(super) async fn report(
        &self,
        report: Report,
        target: Option<GenerationId>,
        error: Option<String>,
        diagnostics: Vec<String>,
    ) {
        {
            let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
            said.report = report;
            said.target = target;
            said.error = error;
            said.diagnostics = diagnostics;
        }
        self.say().await;
    }

    /// Writes the status key again with what was last said.
    pub(super) async fn say(&self) {
        let written = match self.client().await {
            Ok(client) => self.report_now(&client).await,
            Err(error) => Err(error),
        };
        if let Err(e) = &written {
            tracing::warn!(error = %e, "fleet: cannot write this instance's status; writing it again at the next lease renewal");
        }
        self.unsaid.store(written.is_err(), Ordering::Relaxed);
    }

    async fn report_now(&self, client: &Client) -> Result<(), FleetError> {
        let Some(lease) = *self.lease.lock().unwrap_or_else(PoisonError::into_inner) else {
            return Ok(());
        };
        let applied = self.applied();
        let said = self
            .said
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let record = InstanceRecord {
            instance: self.spec.instance.clone(),
            report: said.report,
            generation: (applied.generation > GenerationId::NONE).then_some(applied.generation),
            config_version: applied.config_version,
            target: said.target,
            error: said.error,
            diagnostics: said.diagnostics,
            local_generation: self.control.store().active_id(),
            listeners: self
                .control
                .listeners()
                .info()
                .into_iter()
                .map(|l| BoundListener {
                    name: l.name,
                    address: l.address.to_string(),
                    state: l.state.into_owned(),
                })
                .collect(),
            updated_at: rfc3339(SystemTime::now()),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            answers: said.answers,
            shadow: said.shadow,
        };
        let value = serde_json::to_vec(&record).map_err(|e| FleetError::Refused(e.to_string()))?;
        within(client.put(self.keys.instance(&self.spec.instance), value, lease)).await?;
        Ok(())
    }
}

/// A refusal as the nack carries it: the message, and each finding of a
/// refused plan as `code at path (line L): message`.
fn findings(error: &ControlError) -> (String, Vec<String>) {
    let plan = match error {
        ControlError::Invalid(plan) | ControlError::RestartRequired(plan) => Some(plan),
        ControlError::Bind { plan, .. } | ControlError::Build { plan, .. } => Some(plan),
        _ => None,
    };
    let mut out = Vec::new();
    if let Some(plan) = plan {
        for d in &plan.errors {
            out.push(match d.line {
                Some(line) => format!("{} at {} (line {line}): {}", d.code, d.path, d.message),
                None => format!("{} at {}: {}", d.code, d.path, d.message),
            });
        }
        for r in &plan.rejected {
            out.push(format!("{} at {}: {}", r.reason, r.path, r.action));
        }
    }
    let message = match (error, out.first()) {
        (ControlError::Invalid(_), Some(first)) => format!("{error}: {first}"),
        _ => error.to_string(),
    };
    (message, out)
}

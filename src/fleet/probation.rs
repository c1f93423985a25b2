//! Guarded activation across a fleet (DESIGN §14 and §15): a generation
//! activated with `confirm_within`, a guard or canary steps is pending in
//! `active` until it is confirmed or rolled back, and every instance
//! watches it, so that no single instance's death leaves it undecided:
//!
//! - each instance with the pending generation applied walks a canary's
//!   steps on its own traffic, and writes its answers (and its previous
//!   generation's, the baseline) into its status key while a guard judges;
//! - each instance judges the guard on the sum of every instance's
//!   answers (the worst p99), and enforces the confirm deadline and the
//!   canary's end;
//! - a verdict is a transaction on `active`'s revision, so that of all the
//!   instances that reach it, exactly one settles the generation. The
//!   others see it settled and stop.
//!
//! An operator confirms or aborts through any instance's admin API.

use std::borrow::Cow;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::records::{
    ActiveRecord, CanaryPlan, FleetPending, GenerationDoc, InstanceRecord, PendingAnswers,
    Settlement,
};
use super::{etcd, within, Fleet};
use crate::control::{
    admit_change, evaluation_interval, judge, Answers, Baseline, Candidate, ControlError,
    Expectation, GuardSpec, Settle, SettleRequest, Verdict,
};
use crate::ids::GenerationId;
use crate::runtime::{rfc3339, GuardRecord};

/// What an activation asked for besides the document.
#[derive(Debug, Clone)]
pub(super) struct Probation {
    confirm_within: Option<Duration>,
    guard: Option<GuardRecord>,
    canary: Option<CanaryPlan>,
}

impl Probation {
    /// `None` for a plain activation.
    pub(super) fn of(candidate: &Candidate) -> Option<Self> {
        let probation = Probation {
            confirm_within: candidate.confirm_within,
            guard: candidate.guard.as_ref().map(GuardSpec::record),
            canary: candidate.canary.as_ref().map(|c| CanaryPlan {
                steps: c.steps.clone(),
                step_interval_ms: millis(c.step_interval),
                hash_key: c.key.as_ref().map(ToString::to_string),
            }),
        };
        let any = probation.confirm_within.is_some()
            || probation.guard.is_some()
            || probation.canary.is_some();
        any.then_some(probation)
    }

    /// As `active` keeps it, from now on.
    pub(super) fn record(self, rollback_to: GenerationId) -> FleetPending {
        let now = unix_ms(SystemTime::now());
        FleetPending {
            rollback_to,
            started_unix_ms: now,
            deadline_unix_ms: self.confirm_within.map(|d| now.saturating_add(millis(d))),
            guard: self.guard,
            canary: self.canary,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, millis)
}

/// What confirm and abort answer in a fleet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetSettled {
    /// `confirmed` or `rolled_back`.
    pub outcome: Cow<'static, str>,
    /// The fleet's active generation after it.
    pub generation: GenerationId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<GenerationId>,
}

impl Fleet {
    /// Starts watching `record`'s pending generation, unless a task
    /// already does.
    pub(super) fn supervise(self: &Arc<Self>, record: &ActiveRecord) {
        let Some(pending) = record.pending.clone() else {
            return;
        };
        {
            let mut watching = self
                .supervising
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *watching == Some(record.generation) {
                return;
            }
            *watching = Some(record.generation);
        }
        let this = Arc::clone(self);
        let generation = record.generation;
        tokio::spawn(async move {
            this.watch_pending(generation, pending).await;
            let mut watching = this
                .supervising
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *watching == Some(generation) {
                *watching = None;
            }
        });
    }

    fn still_pending(&self, generation: GenerationId) -> bool {
        self.last_active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|a| a.generation == generation && a.pending.is_some())
    }

    /// Watches pending `generation` until it is settled: the deadline, the
    /// guard over every instance's answers, the canary's end.
    async fn watch_pending(self: &Arc<Self>, generation: GenerationId, pending: FleetPending) {
        let mut guard = pending.guard.as_ref().map(GuardSpec::from_record);
        let every = guard
            .as_ref()
            .map_or(Duration::from_millis(250), evaluation_interval);
        let started = SystemTime::UNIX_EPOCH + Duration::from_millis(pending.started_unix_ms);
        let canary_ends = pending.canary.as_ref().map(|c| {
            Duration::from_millis(c.step_interval_ms)
                .saturating_mul(u32::try_from(c.steps.len().saturating_sub(1)).unwrap_or(u32::MAX))
        });
        // This instance's answers count from here (what it applied).
        let applied = self.applied();
        let own = (applied.generation == generation).then(|| {
            let store = self.control.store();
            (
                applied.local_generation,
                Baseline::start(store, Some(applied.previous_local)),
            )
        });
        loop {
            tokio::time::sleep(every).await;
            if !self.still_pending(generation) {
                break;
            }
            let elapsed = started.elapsed().unwrap_or(Duration::ZERO);
            if let Some(deadline) = pending.deadline_unix_ms {
                if unix_ms(SystemTime::now()) >= deadline {
                    let reason = "the confirm deadline passed".to_owned();
                    self.settle_by_gateway(generation, Settle::Expired, "cutover-deadline", reason)
                        .await;
                    break;
                }
            }
            let mut verdict = Verdict::Wait;
            if let Some(spec) = &guard {
                if let Some((local, baseline)) = &own {
                    self.publish_answers(generation, *local, baseline).await;
                }
                let canary_over = canary_ends.is_some_and(|end| elapsed >= end);
                // With a canary, its end closes the guard's window.
                let window = if canary_over {
                    elapsed.max(spec.window)
                } else {
                    elapsed
                };
                verdict = match self.fleet_answers(generation).await {
                    Some((answers, p99, previous, before)) => {
                        judge(spec, answers, p99, (Some(previous), before), window)
                    }
                    None => Verdict::Wait,
                };
            }
            let canary_over = canary_ends.is_some_and(|end| elapsed >= end);
            let fail_on_no_data = guard.as_ref().is_some_and(|g| g.fail_on_no_data);
            let confirm_on_pass = guard.as_ref().is_some_and(|g| g.confirm_on_pass);
            let settle = match verdict {
                Verdict::Breach(reason) => Some((Settle::Expired, "cutover-guard", reason)),
                Verdict::NoData(reason) if fail_on_no_data => {
                    Some((Settle::Expired, "cutover-guard", reason))
                }
                Verdict::Pass(reason) if canary_over || confirm_on_pass => {
                    let by = if canary_over {
                        "cutover-canary"
                    } else {
                        "cutover-guard"
                    };
                    Some((Settle::Confirm, by, reason))
                }
                // Passed, with neither a canary nor confirm_on_pass: the
                // operator or the deadline decides.
                Verdict::Pass(reason) => {
                    tracing::info!(%generation, "fleet: {reason}; left pending");
                    guard = None;
                    None
                }
                // No data and "hold": the canary waits for data.
                Verdict::NoData(_) => None,
                Verdict::Wait if canary_over && guard.is_none() => Some((
                    Settle::Confirm,
                    "cutover-canary",
                    format!(
                        "canary steps {:?} completed",
                        pending
                            .canary
                            .as_ref()
                            .map(|c| c.steps.clone())
                            .unwrap_or_default()
                    ),
                )),
                Verdict::Wait => None,
            };
            if let Some((how, by, reason)) = settle {
                self.settle_by_gateway(generation, how, by, reason).await;
                break;
            }
        }
        let had_answers = {
            let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
            said.answers.take().is_some()
        };
        if had_answers {
            self.say().await;
        }
    }

    /// Writes this instance's answers for `generation` into its status.
    async fn publish_answers(
        &self,
        generation: GenerationId,
        local: GenerationId,
        baseline: &Baseline,
    ) {
        let Some(ledger) = self.control.store().ledger(local) else {
            return;
        };
        let answers = Answers::of(&ledger);
        let previous = baseline.answers().unwrap_or_default();
        let before = baseline.before();
        let now = PendingAnswers {
            generation,
            requests: answers.requests,
            errors: answers.errors,
            p99: ledger.duration.quantile_bound(0.99),
            previous_requests: previous.requests,
            previous_errors: previous.errors,
            blocked: answers.blocked,
            previous_blocked: previous.blocked,
            before_requests: before.requests,
            before_blocked: before.blocked,
        };
        drop(ledger);
        let changed = {
            let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
            let changed = said.answers != Some(now);
            said.answers = Some(now);
            changed
        };
        if changed {
            self.say().await;
        }
    }

    /// The sum of every live instance's answers for `generation`, the
    /// worst p99 among them, and the sums of their baselines (in the
    /// window, and before the guard started).
    async fn fleet_answers(
        &self,
        generation: GenerationId,
    ) -> Option<(Answers, Option<f64>, Answers, Answers)> {
        let client = self.client().await.ok()?;
        let live = within(client.get_prefix(self.keys.instances(), false))
            .await
            .ok()?;
        let mut answers = Answers::default();
        let mut previous = Answers::default();
        let mut before = Answers::default();
        let mut p99: Option<f64> = None;
        for record in live
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<InstanceRecord>(&kv.value).ok())
        {
            let Some(a) = record.answers.filter(|a| a.generation == generation) else {
                continue;
            };
            answers.requests += a.requests;
            answers.errors += a.errors;
            previous.requests += a.previous_requests;
            previous.errors += a.previous_errors;
            answers.blocked += a.blocked;
            previous.blocked += a.previous_blocked;
            before.requests += a.before_requests;
            before.blocked += a.before_blocked;
            p99 = match (p99, a.p99) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, y) => x.or(y),
            };
        }
        Some((answers, p99, previous, before))
    }

    /// Settles `generation` as the gateway (deadline, guard, canary):
    /// retried while etcd is away; done when anyone settled it.
    async fn settle_by_gateway(
        self: &Arc<Self>,
        generation: GenerationId,
        how: Settle,
        by: &str,
        reason: String,
    ) {
        tracing::info!(%generation, ?how, by, %reason, "fleet: settling the pending generation");
        loop {
            match self
                .settle(
                    SettleRequest {
                        generation,
                        expected_active_generation: None,
                        requested_by: Some(by.to_owned()),
                        reason: Some(reason.clone()),
                        caller: None,
                    },
                    how,
                )
                .await
            {
                Ok(_) | Err(ControlError::NotPending(_) | ControlError::Conflict { .. }) => return,
                Err(error) => {
                    tracing::warn!(%generation, %error, "fleet: cannot settle yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if !self.still_pending(generation) {
                        return;
                    }
                }
            }
        }
    }

    /// Confirms pending `generation` (clears `pending`), or rolls it back
    /// (a new generation with `rollback_to`'s document), in a transaction
    /// on `active`'s revision.
    pub async fn settle(
        self: &Arc<Self>,
        request: SettleRequest,
        how: Settle,
    ) -> Result<FleetSettled, ControlError> {
        let SettleRequest {
            generation,
            expected_active_generation: expected_active,
            requested_by: by,
            reason,
            caller,
        } = request;
        if how == Settle::Abort {
            if let Some(active) = self.abort_stage(generation).await? {
                return Ok(FleetSettled {
                    outcome: "shadow_aborted".into(),
                    generation: active,
                    rolled_back_to: None,
                });
            }
        }
        let client = self.client().await?;
        let (active, revision) = self.read_active(&client).await?;
        let Some(active) = active.filter(|a| a.generation == generation && a.pending.is_some())
        else {
            return Err(ControlError::NotPending(generation));
        };
        admit_change(
            Expectation::optional(expected_active),
            active.generation,
            None,
        )?;
        let Some(pending) = active.pending.clone() else {
            return Err(ControlError::NotPending(generation));
        };
        let settlement = |outcome: &str| Settlement {
            generation,
            outcome: outcome.to_owned(),
            at: rfc3339(SystemTime::now()),
            by: by.clone(),
            caller: caller.clone(),
            reason: reason.clone(),
        };
        if how == Settle::Confirm {
            let record = ActiveRecord {
                pending: None,
                settlement: Some(settlement("confirmed")),
                ..active
            };
            let value =
                serde_json::to_vec(&record).map_err(|e| ControlError::Internal(e.to_string()))?;
            let txn = etcd::wire::TxnRequest {
                compare: vec![etcd::modified_at(self.keys.active(), revision)],
                success: vec![etcd::put_op(self.keys.active(), value)],
                failure: Vec::new(),
            };
            if !within(client.txn(txn)).await?.succeeded {
                return Err(self.lost_race(&client, generation).await);
            }
            tracing::info!(%generation, "fleet: pending generation confirmed");
            *self
                .last_active
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(record);
            return Ok(FleetSettled {
                outcome: "confirmed".into(),
                generation,
                rolled_back_to: None,
            });
        }
        let target = pending.rollback_to;
        let found = within(client.get(self.keys.generation(target))).await?;
        let doc: GenerationDoc = found
            .kvs
            .first()
            .and_then(|kv| serde_json::from_slice(&kv.value).ok())
            .ok_or_else(|| ControlError::NotRetained(target))?;
        let id = self
            .highest_generation(&client)
            .await?
            .max(generation)
            .next();
        let now = rfc3339(SystemTime::now());
        let outcome = if how == Settle::Abort {
            "aborted"
        } else {
            "auto_rolled_back"
        };
        let doc = GenerationDoc {
            generation: id,
            created_at: now.clone(),
            created_on: self.spec.instance.clone(),
            requested_by: by.clone(),
            caller: caller.clone(),
            reason: reason.clone(),
            rolled_back_to: Some(target),
            ..doc
        };
        let record = ActiveRecord {
            generation: id,
            config_version: doc.config_version.clone(),
            previous: Some(generation),
            activated_at: now,
            requested_by: by.clone(),
            caller: caller.clone(),
            pending: None,
            settlement: Some(settlement(outcome)),
            shadow: None,
        };
        if !self
            .commit_generation(&client, revision, &doc, &record)
            .await?
        {
            return Err(self.lost_race(&client, generation).await);
        }
        tracing::info!(
            %generation,
            rolled_back_to = %target,
            new = %id,
            outcome,
            "fleet: pending generation rolled back"
        );
        *self
            .last_active
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(record.clone());
        if let Err(error) = self.apply(&record, Some(doc)).await {
            tracing::error!(%error, "fleet: the rollback generation was refused here");
        }
        Ok(FleetSettled {
            outcome: "rolled_back".into(),
            generation: id,
            rolled_back_to: Some(target),
        })
    }

    /// Why a settling transaction lost: the generation was settled or
    /// replaced meanwhile.
    async fn lost_race(&self, client: &etcd::Client, generation: GenerationId) -> ControlError {
        match self.read_active(client).await {
            Ok((Some(now), _)) if now.generation == generation && now.pending.is_some() => {
                ControlError::InProgress
            }
            Ok((Some(now), _)) if now.generation != generation => ControlError::Conflict {
                expected: generation,
                active: now.generation,
            },
            Ok(_) => ControlError::NotPending(generation),
            Err(error) => error.into(),
        }
    }
}

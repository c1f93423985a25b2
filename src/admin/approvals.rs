//! Approvals (DESIGN §23): the two-person rule. A change that
//! `[admin.approval]` (or its caller's `requires_approval`) makes wait is
//! kept as a proposal — the request as asked, the generation it was
//! planned against, the plan's diff and live impact — until other
//! callers with `approve` approve it (then it is carried out as the
//! proposer asked, through the writer, under the same expected-generation
//! rule: 409 when another change came first), reject it, or it expires.
//! Proposals are kept with the history, so a restart or an upgrade keeps
//! them; in a fleet they are kept in etcd (`proposal_book.rs`), so a
//! change proposed through one instance is approved through any other.
//! There the approving instance carries an activation or a rollback out
//! (both are the fleet's), while an upgrade is carried out by the instance
//! it was proposed on, which picks it up within a second.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::{ApiError, ProposalError};
use super::proposal_book::Book;
use crate::control::{
    CanarySpec, Candidate, CandidateSource, Control, ControlError, FreezeRule, GuardSpec,
    RollbackRequest, ShadowSpec, UpgradeRequest,
};
use crate::ids::GenerationId;
use crate::plan::{Approvable, ApprovalPolicy};
use crate::runtime::proposals::{ProposalRecord, ProposalState, Verdict};
use crate::runtime::{rfc3339, CanaryRecord, GuardRecord};
use crate::writer::Writer;

/// The request a proposal carries out once approved.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub enum Change {
    /// An activation of this text (a reload's file, read when proposed).
    Activate {
        config: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confirm_within_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        guard: Option<GuardRecord>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        canary: Option<CanaryRecord>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shadow: Option<ShadowSpec>,
        #[serde(default)]
        override_freeze: bool,
    },
    Rollback {
        target_generation: GenerationId,
    },
    Upgrade {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        binary: Option<PathBuf>,
        #[serde(default)]
        override_freeze: bool,
    },
}

impl Change {
    fn operation(&self) -> Approvable {
        match self {
            Change::Activate { .. } => Approvable::Activate,
            Change::Rollback { .. } => Approvable::Rollback,
            Change::Upgrade { .. } => Approvable::Upgrade,
        }
    }
}

/// Who asked, and why, as the proposal keeps it.
pub struct Asked {
    pub caller: Option<String>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    pub expected_generation: Option<GenerationId>,
}

/// The proposals of this process (or its fleet) and the rule that makes
/// changes wait.
pub struct Approvals {
    writer: Writer,
    book: Book,
    policy: Option<ApprovalPolicy>,
    /// The callers, for their `requires_approval`.
    callers: Vec<crate::plan::CallerSpec>,
    /// One decision at a time in this process (two approvals that arrive
    /// together carry a change out once; across a fleet, each write
    /// compares the revision it read).
    deciding: tokio::sync::Mutex<()>,
    /// Approved proposals this process carries out now: the tending loop
    /// leaves them to whoever started them.
    carrying: std::sync::Mutex<HashSet<String>>,
    /// In a fleet: whether the proposals a process of this instance left
    /// approved but unfinished were marked failed (once etcd answered).
    recovered: AtomicBool,
    /// When this process started (RFC 3339, as approvals are stamped):
    /// what was approved after it is this process's to carry out.
    started_at: String,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Approvals {
    /// The approvals of `writer`'s process, under the active
    /// configuration's `[admin]` (startup-owned). With a policy, a task
    /// expires proposals as their time runs out.
    pub fn new(writer: Writer) -> Arc<Self> {
        let active = writer.control().store().load_full();
        let admin = &active.spec.admin;
        let approvals = Arc::new(Self {
            book: Book::of(&writer),
            policy: admin.approval.clone(),
            callers: admin.callers.clone(),
            writer,
            deciding: tokio::sync::Mutex::new(()),
            carrying: std::sync::Mutex::new(HashSet::new()),
            recovered: AtomicBool::new(false),
            started_at: rfc3339(SystemTime::now()),
        });
        drop(active);
        // One that was being carried out when the last process stopped
        // is not carried out again: its operation log says how far it got.
        // (In a fleet the tending loop does this once etcd answers.)
        if approvals.book.instance().is_none() {
            approvals.control().with_history(|h| {
                h.update_proposals(|proposals| {
                    proposals
                        .iter_mut()
                        .filter(|p| p.state == ProposalState::Approved)
                        .for_each(fail_unfinished);
                })
            });
            approvals.recovered.store(true, Ordering::Relaxed);
        }
        if approvals.policy.is_some() && tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(tend(Arc::downgrade(&approvals)));
        }
        approvals
    }

    fn control(&self) -> &Arc<Control> {
        self.writer.control()
    }

    /// Whether `operation` asked by `caller` waits for approval.
    pub fn required(&self, operation: Approvable, caller: Option<&str>) -> bool {
        let caller = caller.and_then(|name| self.callers.iter().find(|c| c.name == name));
        self.policy
            .as_ref()
            .is_some_and(|policy| policy.required(operation, caller))
    }

    /// Every proposal kept, newest first (expired ones marked so), in
    /// brief (a page polls this; `get` has the whole proposal).
    pub async fn list(&self) -> Result<Vec<ProposalRecord>, ProposalError> {
        self.expire_due().await?;
        Ok(self.book.all().await?.iter().rev().map(brief).collect())
    }

    pub async fn get(&self, id: &str) -> Result<ProposalRecord, ProposalError> {
        self.expire_due().await?;
        self.find(id).await
    }

    async fn find(&self, id: &str) -> Result<ProposalRecord, ProposalError> {
        self.book
            .all()
            .await?
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| ProposalError::NotFound(id.to_owned()))
    }

    /// Whether this process carries `record` out once it is approved:
    /// the carrier the approval named (alone: always).
    fn mine(&self, record: &ProposalRecord) -> bool {
        record.carrier.as_deref() == self.book.instance()
    }

    /// Makes `change` a proposal: planned first (an activation that would
    /// be refused is refused now, with its plan), against the generation
    /// it names or the active one.
    pub async fn propose(&self, change: Change, asked: Asked) -> Result<Response, ApiError> {
        let policy = self.policy.clone().ok_or(ProposalError::NotConfigured)?;
        let proposer = asked.caller.clone().ok_or(ProposalError::Anonymous)?;
        let control = self.control();
        // An upgrade is this process's; an activation or a rollback is
        // planned against the generation they would replace (in a fleet,
        // the fleet's).
        let expected = match (asked.expected_generation, &change) {
            (Some(named), _) => named,
            (None, Change::Upgrade { .. }) => control.store().active_id(),
            (None, _) => self.book.active_generation().await?,
        };
        let plan = match &change {
            Change::Activate { config, .. } => {
                let candidate = self.writer.as_planned(Candidate::text(config.clone()))?;
                let plan = control.validate(candidate).await?;
                if !plan.errors.is_empty() {
                    return Err(ControlError::Invalid(Box::new(plan)).into());
                }
                if !plan.rejected.is_empty() {
                    return Err(ControlError::RestartRequired(Box::new(plan)).into());
                }
                Some(serde_json::to_value(&plan).unwrap_or(Value::Null))
            }
            _ => None,
        };
        let created = SystemTime::now();
        let expires = created + policy.expire;
        let expires_unix_ms =
            now_ms().saturating_add(u64::try_from(policy.expire.as_millis()).unwrap_or(u64::MAX));
        let operation = change.operation();
        let change = serde_json::to_value(&change).unwrap_or(Value::Null);
        let instance = self.book.instance().map(str::to_owned);
        let record = self
            .book
            .add(|id| ProposalRecord {
                id,
                state: ProposalState::Open,
                operation,
                proposer: proposer.clone(),
                requested_by: asked.requested_by.clone(),
                reason: asked.reason.clone(),
                created_at: rfc3339(created),
                expires_at: rfc3339(expires),
                expires_unix_ms,
                expected_generation: expected,
                approvers: policy.approvers,
                plan: plan.clone(),
                change: change.clone(),
                approvals: Vec::new(),
                rejection: None,
                operation_id: None,
                error: None,
                instance: instance.clone(),
                carrier: None,
            })
            .await?;
        tracing::info!(proposal = %record.id, proposer = %record.proposer, operation = operation.name(), "change proposed; it waits for approval");
        self.event("proposal_made", &record);
        Ok((StatusCode::ACCEPTED, Json(json!({ "proposal": record }))).into_response())
    }

    /// Approves proposal `id` as `caller`; the last approval needed
    /// carries the change out and answers as the change does (with the
    /// proposal beside it).
    pub async fn approve(
        &self,
        id: &str,
        caller: Option<String>,
        reason: Option<String>,
    ) -> Result<Response, ApiError> {
        let caller = caller.ok_or(ProposalError::Anonymous)?;
        let me = self.book.instance();
        let (record, ready) = self
            .decide(id, |p| {
                if p.proposer == caller {
                    return Err(ProposalError::SelfApproval(id.to_owned()));
                }
                if p.approvals.iter().any(|a| a.caller == caller) {
                    return Err(ProposalError::AlreadyApproved {
                        id: id.to_owned(),
                        caller: caller.clone(),
                    });
                }
                p.approvals.push(Verdict {
                    caller: caller.clone(),
                    at: rfc3339(SystemTime::now()),
                    reason: reason.clone(),
                });
                let ready = p.approvals.len() >= p.approvers as usize;
                if ready {
                    p.state = ProposalState::Approved;
                    p.carrier = me.map(|me| match (p.operation, &p.instance) {
                        // An upgrade replaces the process it was asked of.
                        (Approvable::Upgrade, Some(home)) => home.clone(),
                        _ => me.to_owned(),
                    });
                }
                Ok(ready)
            })
            .await?;
        tracing::info!(proposal = %record.id, approver = %caller, ready, "proposal approved");
        self.event("proposal_approved", &record);
        if !ready {
            return Ok(Json(json!({ "proposal": record })).into_response());
        }
        if !self.mine(&record) {
            // Another instance's upgrade: it picks the proposal up.
            return Ok((StatusCode::ACCEPTED, Json(json!({ "proposal": record }))).into_response());
        }
        let (record, result) = self.finish(&record).await;
        match result {
            Ok(answer) => Ok(Json(json!({ "proposal": record, "result": answer })).into_response()),
            Err(error) => {
                // The change's own refusal (409, 423, 422 …), with the
                // proposal beside it.
                let response = error.into_response();
                let status = response.status();
                let bytes = axum::body::to_bytes(response.into_body(), 64 << 20)
                    .await
                    .unwrap_or_default();
                let mut body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({}));
                if let Some(object) = body.as_object_mut() {
                    object.insert("proposal".into(), json!(record));
                }
                Ok((status, Json(body)).into_response())
            }
        }
    }

    /// Rejects proposal `id` as `caller` (the proposer may withdraw its
    /// own), with a reason.
    pub async fn reject(
        &self,
        id: &str,
        caller: Option<String>,
        reason: Option<String>,
    ) -> Result<Response, ApiError> {
        let caller = caller.ok_or(ProposalError::Anonymous)?;
        let reason = reason
            .filter(|r| !r.trim().is_empty())
            .ok_or(ProposalError::NoReason)?;
        let (record, ()) = self
            .decide(id, |p| {
                p.state = ProposalState::Rejected;
                p.rejection = Some(Verdict {
                    caller: caller.clone(),
                    at: rfc3339(SystemTime::now()),
                    reason: Some(reason.clone()),
                });
                Ok(())
            })
            .await?;
        tracing::info!(proposal = %record.id, "proposal rejected");
        self.event("proposal_rejected", &record);
        Ok(Json(json!({ "proposal": record })).into_response())
    }

    /// Runs `decision` on open proposal `id`, one decision at a time
    /// (expired ones first marked so), and keeps what it changed. One it
    /// approved for this process to carry out is claimed before the
    /// tending loop could see it.
    async fn decide<T>(
        &self,
        id: &str,
        mut decision: impl FnMut(&mut ProposalRecord) -> Result<T, ProposalError>,
    ) -> Result<(ProposalRecord, T), ProposalError> {
        let _one = self.deciding.lock().await;
        self.expire_due().await?;
        let (record, out) = self
            .book
            .change(id, |p| {
                if p.state != ProposalState::Open {
                    return Err(ProposalError::Closed {
                        id: id.to_owned(),
                        state: p.state,
                    });
                }
                decision(p)
            })
            .await?;
        if record.state == ProposalState::Approved && self.mine(&record) {
            self.claim(&record.id);
        }
        Ok((record, out))
    }

    /// Whether this process took `id` to carry out (not when it carries
    /// it out already).
    fn claim(&self, id: &str) -> bool {
        self.carrying
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned())
    }

    fn release(&self, id: &str) {
        self.carrying
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// Carries approved `record` out and keeps how it went; returns the
    /// proposal as kept and the change's own answer.
    async fn finish(&self, record: &ProposalRecord) -> (ProposalRecord, Result<Value, ApiError>) {
        let result = self.carry_out(record).await;
        let (state, operation_id, error) = match &result {
            Ok(answer) => (
                ProposalState::Executed,
                // A fleet's answer: the operation of this instance's
                // activation of it.
                answer["operation_id"]
                    .as_str()
                    .or_else(|| answer["instance"]["activation"]["operation_id"].as_str())
                    .map(str::to_owned),
                None,
            ),
            Err(error) => (ProposalState::Failed, None, Some(error.to_string())),
        };
        let kept = self
            .book
            .change(&record.id, |p| {
                p.state = state;
                p.operation_id.clone_from(&operation_id);
                p.error.clone_from(&error);
                Ok(())
            })
            .await;
        let kept = match kept {
            Ok((kept, ())) => {
                self.release(&record.id);
                kept
            }
            // Unrecorded (etcd away), it stays claimed, so it is never
            // carried out twice; the next process of this instance marks
            // it failed and points at the operation log. The caller still
            // hears what the change did.
            Err(unrecorded) => {
                tracing::warn!(proposal = %record.id, error = %unrecorded, "the approved change was carried out, but the proposal could not record how; the operation log has it");
                let mut told = record.clone();
                told.state = state;
                told.operation_id = operation_id;
                told.error = error;
                told
            }
        };
        (kept, result)
    }

    /// Marks open proposals whose time ran out as expired (an event for
    /// each this process marked).
    async fn expire_due(&self) -> Result<(), ProposalError> {
        let now = now_ms();
        let due = |p: &ProposalRecord| p.state == ProposalState::Open && p.expires_unix_ms <= now;
        let ids: Vec<String> = self
            .book
            .all()
            .await?
            .into_iter()
            .filter(due)
            .map(|p| p.id)
            .collect();
        for id in ids {
            let (record, expired) = self
                .book
                .change(&id, |p| {
                    let expired = due(p);
                    if expired {
                        p.state = ProposalState::Expired;
                    }
                    Ok(expired)
                })
                .await?;
            if expired {
                tracing::info!(proposal = %record.id, "proposal expired");
                self.event("proposal_expired", &record);
            }
        }
        Ok(())
    }

    /// In a fleet: marks failed what a process of this instance left
    /// approved but unfinished, and carries out what another instance
    /// approved for this one (an upgrade proposed here).
    async fn tend_fleet(&self) -> Result<(), ProposalError> {
        let Some(me) = self.book.instance() else {
            return Ok(());
        };
        let mine: Vec<ProposalRecord> = self
            .book
            .all()
            .await?
            .into_iter()
            .filter(|p| p.state == ProposalState::Approved && p.carrier.as_deref() == Some(me))
            .collect();
        if !self.recovered.load(Ordering::Relaxed) {
            // Only what was approved before this process started: one
            // handed over since (while etcd was still out of reach) is
            // carried out below, on a later pass.
            let left = mine.iter().filter(|p| {
                p.approvals
                    .last()
                    .is_some_and(|a| a.at.as_str() < self.started_at.as_str())
            });
            for p in left {
                self.book
                    .change(&p.id, |p| {
                        if p.state == ProposalState::Approved {
                            fail_unfinished(p);
                        }
                        Ok(())
                    })
                    .await?;
            }
            self.recovered.store(true, Ordering::Relaxed);
            return Ok(());
        }
        for p in mine {
            {
                let _one = self.deciding.lock().await;
                if !self.claim(&p.id) {
                    continue;
                }
            }
            // Read again now that it is claimed: one this process finished
            // since the list was read is not carried out twice.
            let fresh = match self.find(&p.id).await {
                Ok(fresh) if fresh.state == ProposalState::Approved => fresh,
                other => {
                    self.release(&p.id);
                    other?;
                    continue;
                }
            };
            tracing::info!(proposal = %fresh.id, "carrying out a proposal approved through another instance");
            let (record, result) = self.finish(&fresh).await;
            if let Err(error) = result {
                tracing::warn!(proposal = %record.id, %error, "the approved change was refused");
            }
        }
        Ok(())
    }

    /// An event of `record`, in brief: the candidate's text and the diff's
    /// lines stay out of events (and so out of webhooks' receivers).
    fn event(&self, kind: &'static str, record: &ProposalRecord) {
        self.control().events().emit(
            kind,
            json!({ "generation": record.expected_generation, "proposal": brief(record) }),
        );
    }

    /// The change as the proposer asked it, through the writer.
    async fn carry_out(&self, record: &ProposalRecord) -> Result<Value, ApiError> {
        let change: Change = serde_json::from_value(record.change.clone()).map_err(|e| {
            ControlError::Internal(format!("proposal {} does not read: {e}", record.id))
        })?;
        let approved_by: Vec<String> = record.approvals.iter().map(|a| a.caller.clone()).collect();
        let caller = Some(record.proposer.clone());
        let freeze = |asked: bool| {
            if asked {
                FreezeRule::Override
            } else {
                FreezeRule::Honour
            }
        };
        let answer = match change {
            Change::Activate {
                config,
                confirm_within_ms,
                guard,
                canary,
                shadow,
                override_freeze,
            } => {
                let candidate = Candidate {
                    source: CandidateSource::Text(config),
                    expected_generation: Some(record.expected_generation),
                    reason: record.reason.clone(),
                    requested_by: record.requested_by.clone(),
                    caller,
                    confirm_within: confirm_within_ms.map(Duration::from_millis),
                    guard: guard.as_ref().map(GuardSpec::from_record),
                    canary: canary.as_ref().and_then(CanarySpec::from_record),
                    shadow,
                    freeze: freeze(override_freeze),
                    approved_by,
                };
                serde_json::to_value(self.writer.activate(candidate).await?)
            }
            Change::Rollback { target_generation } => serde_json::to_value(
                self.writer
                    .rollback(RollbackRequest {
                        target_generation,
                        expected_active_generation: Some(record.expected_generation),
                        reason: record.reason.clone(),
                        requested_by: record.requested_by.clone(),
                        caller,
                        approved_by,
                    })
                    .await?,
            ),
            Change::Upgrade {
                config,
                binary,
                override_freeze,
            } => {
                let active = self.control().store().active_id();
                if active != record.expected_generation {
                    return Err(ControlError::Conflict {
                        expected: record.expected_generation,
                        active,
                    }
                    .into());
                }
                let operation_id = self.control().upgrade(UpgradeRequest {
                    config,
                    binary,
                    requested_by: record.requested_by.clone(),
                    reason: record.reason.clone(),
                    caller,
                    freeze: freeze(override_freeze),
                    overrode_freeze: None,
                    approved_by,
                })?;
                Ok(json!({ "operation_id": operation_id }))
            }
        };
        answer.map_err(|e| ControlError::Internal(e.to_string()).into())
    }
}

/// A proposal without the candidate's text and the diff's lines (never
/// copied): the diff's counts and the share of sampled requests that
/// would move say how much it changes.
fn brief(p: &ProposalRecord) -> ProposalRecord {
    let change = match p.change.as_object() {
        Some(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| *key != "config")
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
        ),
        None => Value::Null,
    };
    let plan = p.plan.as_ref().map(|plan| {
        json!({
            "activatable": plan["activatable"],
            "diff": { "summary": plan["diff"]["summary"] },
            "impact": {
                "moved": { "percent": plan["impact"]["moved"]["percent"] },
                "sample_size": plan["impact"]["sample_size"],
            },
        })
    });
    ProposalRecord {
        id: p.id.clone(),
        state: p.state,
        operation: p.operation,
        proposer: p.proposer.clone(),
        requested_by: p.requested_by.clone(),
        reason: p.reason.clone(),
        created_at: p.created_at.clone(),
        expires_at: p.expires_at.clone(),
        expires_unix_ms: p.expires_unix_ms,
        expected_generation: p.expected_generation,
        approvers: p.approvers,
        plan,
        change,
        approvals: p.approvals.clone(),
        rejection: p.rejection.clone(),
        operation_id: p.operation_id.clone(),
        error: p.error.clone(),
        instance: p.instance.clone(),
        carrier: p.carrier.clone(),
    }
}

/// A proposal a process stopped while carrying out is not carried out
/// again: its operation log says how far it got.
fn fail_unfinished(p: &mut ProposalRecord) {
    p.state = ProposalState::Failed;
    p.error = Some(
        "the process stopped before it was carried out or while it was: see the operation log"
            .into(),
    );
}

/// Once a second, while the approvals live: expires proposals as their
/// time runs out (an event each) and, in a fleet, tends this instance's.
async fn tend(approvals: Weak<Approvals>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(approvals) = approvals.upgrade() else {
            return;
        };
        let tended = match approvals.expire_due().await {
            Ok(()) => approvals.tend_fleet().await,
            Err(error) => Err(error),
        };
        if let Err(error) = tended {
            tracing::debug!(%error, "proposals not tended this second");
        }
    }
}

/// The change an activate (or reload) request asks for, with its text
/// read now: what is approved is what was planned.
pub fn activation_change(candidate: &Candidate, control: &Control) -> Result<Change, ApiError> {
    let text = crate::control::read_candidate(&candidate.source, control.config_file())
        .map_err(ControlError::from)?;
    Ok(Change::Activate {
        config: text.text,
        confirm_within_ms: candidate
            .confirm_within
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        guard: candidate.guard.as_ref().map(GuardSpec::record),
        canary: candidate.canary.as_ref().map(|c| c.record(0)),
        shadow: candidate.shadow.clone(),
        override_freeze: candidate.freeze == FreezeRule::Override,
    })
}

impl Asked {
    pub fn of(candidate: &Candidate) -> Self {
        Self {
            caller: candidate.caller.clone(),
            requested_by: candidate.requested_by.clone(),
            reason: candidate.reason.clone(),
            expected_generation: candidate.expected_generation,
        }
    }
}

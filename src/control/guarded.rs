//! Guarded activation (DESIGN §14): the pending generation, its deadline,
//! guard and canary steps, and how it is settled (confirm, abort, breach,
//! missed deadline) through the one commit path. A [`Watch`] walks the
//! canary and judges the guard from the generation store and the pending
//! slot alone, and answers a [`Decision`]; only [`Changes`] settles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::answers::{Activation, Settled};
use super::candidate::{CanarySpec, GuardSpec, Settle, SettleRequest};
use super::changes::Changes;
use super::error::ControlError;
use super::expectation::{admit_change, Expectation};
use super::lock::running;
use super::pending::{Answers, Baseline, Deadline, Pending, PendingSlot};
use super::records::{Records, Requester};
use crate::generation::{self, Generation};
use crate::ids::GenerationId;
use crate::plan::{self};
use crate::runtime::{GenerationStore, OperationKind, Outcome, PhaseCell, Source};

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

/// Judges the pending generation's answers (`p99`: the bound of their
/// 99th percentile, seconds), `elapsed` into the window, against the
/// previous generation's over the same window: a breach, as soon as
/// `min_requests` answers show one, is an error ratio more than
/// `max_error_ratio` above the previous generation's (above zero when
/// that one has fewer than `min_requests` answers in the window, as
/// without a canary), a p99 over `max_p99`, or a share of requests the
/// web application firewall refused more than `max_block_ratio` above
/// the previous generation's (in the window, else `before` the guard
/// started: without a canary the previous generation takes no new
/// requests, and a rule set that blocks attacks blocks some all along);
/// a pass when the window closes.
pub(crate) fn judge(
    spec: &GuardSpec,
    pending: Answers,
    p99: Option<f64>,
    (previous, before): (Option<Answers>, Answers),
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
    let mut measured = format!(
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
    let mut blocking = false;
    if let Some(max) = spec.max_block_ratio {
        let (compared, when) = match baseline {
            Some(window) => (Some(window), "in the window"),
            None => (Some(before).filter(|b| b.requests >= enough), "before"),
        };
        let previous_ratio = compared.map_or(0.0, Answers::block_ratio);
        blocking = pending.block_ratio() > previous_ratio + max;
        measured.push_str(&format!(
            "; waf block ratio {:.4} ({} of {}), previous generation {}; max_block_ratio {max}",
            pending.block_ratio(),
            pending.blocked,
            pending.requests,
            compared.map_or("none to compare".to_owned(), |c| format!(
                "{:.4} ({} of {} {when})",
                c.block_ratio(),
                c.blocked,
                c.requests
            )),
        ));
    }
    if pending.ratio() > allowed || slow || blocking {
        return Verdict::Breach(format!("guard breached: {measured}"));
    }
    if closed {
        Verdict::Pass(format!("guard passed: {measured}"))
    } else {
        Verdict::Wait
    }
}

/// How often a guard judges: a tenth of its window, between 100 ms and
/// 1 s.
pub(crate) fn evaluation_interval(spec: &GuardSpec) -> Duration {
    (spec.window / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// How a watch ends: the pending generation is to be settled so, on
/// behalf of `who`.
pub(super) struct Decision {
    how: Settle,
    who: &'static str,
    reason: String,
}

/// What watches a pending generation for the control plane: it walks a
/// canary through its steps and judges the generation by its guard,
/// moving the canary's share and recording the step reached. It never
/// settles: it answers how the generation is to be settled, and the
/// control plane settles it through the one commit path (`supervise`).
/// Every loop ends as soon as the generation is not pending any more.
pub(super) struct Watch {
    pub(super) store: Arc<GenerationStore>,
    pub(super) pending: Arc<PendingSlot>,
    pub(super) records: Arc<Records>,
    pub(super) phase: Arc<PhaseCell>,
}

impl Watch {
    fn is_pending(&self, generation: GenerationId) -> bool {
        self.pending.lock().as_ref().map(|p| p.generation) == Some(generation)
    }

    fn rollback_to(&self) -> Option<GenerationId> {
        self.pending.lock().as_ref().map(|p| p.rollback_to)
    }

    /// Walks a canary through its steps: each step's share for
    /// `step_interval`, judged (with a guard) on the pending generation's
    /// answers so far all through the step and at its end; a breach, at
    /// any time, or no data at the step's end with
    /// `on_no_data = "fail"`, rolls back; no data with "hold" repeats the
    /// step. The last step, 100 %, confirms it. Starts at step `first`
    /// (a resumed canary); each step reached is persisted, unless the
    /// process hands over (the new process owns the record then).
    pub(super) async fn advance(
        &self,
        generation: GenerationId,
        canary: CanarySpec,
        guard: Option<GuardSpec>,
        first: usize,
    ) -> Option<Decision> {
        let started = tokio::time::Instant::now();
        let baseline = Baseline::start(&self.store, self.rollback_to());
        let mut step = first;
        loop {
            let percent = canary.steps.get(step).copied()?;
            if !self.is_pending(generation) || !self.store.step_canary(generation, percent) {
                return None;
            }
            tracing::info!(%generation, percent, "canary step");
            self.records.events().emit(
                "canary_step",
                serde_json::json!({
                    "generation": generation,
                    "percent": percent,
                    "step": step + 1,
                    "steps": canary.steps,
                }),
            );
            if percent >= 100 {
                return Some(Decision {
                    how: Settle::Confirm,
                    who: "cutover-canary",
                    reason: format!("canary steps {:?} completed", canary.steps),
                });
            }
            let ends = tokio::time::Instant::now() + canary.step_interval;
            self.pending.step_ends(generation, ends);
            let verdict = match &guard {
                None => {
                    tokio::time::sleep_until(ends).await;
                    Verdict::Wait
                }
                Some(spec) => {
                    self.judge_step(generation, spec, &baseline, started, ends)
                        .await?
                }
            };
            let failed = |reason: String| {
                Some(Decision {
                    how: Settle::Expired,
                    who: "cutover-canary",
                    reason: format!("canary at {percent} %: {reason}"),
                })
            };
            match verdict {
                Verdict::Breach(reason) => return failed(reason),
                Verdict::NoData(reason) if guard.as_ref().is_some_and(|g| g.fail_on_no_data) => {
                    return failed(reason)
                }
                // Hold: the same step again.
                Verdict::NoData(_) => continue,
                Verdict::Pass(_) | Verdict::Wait => {
                    step += 1;
                    if running(&self.phase).is_err()
                        || !self.pending.record_step(&self.records, generation, step)
                    {
                        return None;
                    }
                }
            }
        }
    }

    /// Judges one canary step by its guard: every evaluation interval
    /// while the step runs, so that a breach ends the canary as soon as
    /// `min_requests` answers show one (not at the step's end); and when
    /// the step `ends`, with the window taken as the time so far, so that
    /// every step ends in a verdict (pass, no data or breach). `None`: the
    /// generation is no longer pending.
    async fn judge_step(
        &self,
        generation: GenerationId,
        spec: &GuardSpec,
        baseline: &Baseline,
        started: tokio::time::Instant,
        ends: tokio::time::Instant,
    ) -> Option<Verdict> {
        let every = evaluation_interval(spec);
        loop {
            let next = tokio::time::Instant::now() + every;
            let closing = next >= ends;
            tokio::time::sleep_until(if closing { ends } else { next }).await;
            if !self.is_pending(generation) {
                return None;
            }
            let ledger = self.store.ledger(generation)?;
            let elapsed = if closing {
                started.elapsed().max(spec.window)
            } else {
                started.elapsed()
            };
            let verdict = judge(
                spec,
                Answers::of(&ledger),
                ledger.duration.quantile_bound(0.99),
                (baseline.answers(), baseline.before()),
                elapsed,
            );
            if closing || matches!(verdict, Verdict::Breach(_)) {
                return Some(verdict);
            }
        }
    }

    /// Judges a pending generation by its own answers (see `judge`) every
    /// tenth of its window (between 100 ms and 1 s) from its activation
    /// on: rolls it back on a breach, confirms it on a pass with
    /// `confirm_on_pass`, rolls it back when the window closes without
    /// enough answers and `on_no_data = "fail"`.
    pub(super) async fn guard(
        &self,
        generation: GenerationId,
        spec: GuardSpec,
    ) -> Option<Decision> {
        let started = tokio::time::Instant::now();
        let baseline = Baseline::start(&self.store, self.rollback_to());
        let every = evaluation_interval(&spec);
        loop {
            tokio::time::sleep(every).await;
            if !self.is_pending(generation) {
                return None;
            }
            let ledger = self.store.ledger(generation)?;
            let verdict = judge(
                &spec,
                Answers::of(&ledger),
                ledger.duration.quantile_bound(0.99),
                (baseline.answers(), baseline.before()),
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
                    return None;
                }
            };
            return Some(Decision {
                how,
                who: "cutover-guard",
                reason,
            });
        }
    }
}

impl Changes {
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

    /// Starts what settles a pending generation: the deadline's timer,
    /// and its canary's steps (which judge each step by the guard) or its
    /// guard's watch. A missed deadline rolls it back unless it was
    /// settled before: the same compare-and-swap as confirm and abort, so
    /// exactly one of them wins.
    pub(super) fn supervise(self: &Arc<Self>, pending: &Pending) {
        let generation = pending.generation;
        if let Some(deadline) = pending.deadline {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep_until(deadline.at).await;
                let expired = Decision {
                    how: Settle::Expired,
                    who: "cutover",
                    reason: "confirm deadline passed".into(),
                };
                this.settle_by_gateway(generation, expired).await;
            });
        }
        let watch = Watch {
            store: Arc::clone(&self.store),
            pending: Arc::clone(&self.pending),
            records: Arc::clone(&self.records),
            phase: Arc::clone(self.lock.phase()),
        };
        let this = Arc::clone(self);
        match (pending.canary.clone(), pending.guard.clone()) {
            (Some(canary), guard) => {
                let step = pending.step;
                tokio::spawn(async move {
                    if let Some(decision) = watch.advance(generation, canary, guard, step).await {
                        this.settle_by_gateway(generation, decision).await;
                    }
                });
            }
            (None, Some(spec)) => {
                tokio::spawn(async move {
                    if let Some(decision) = watch.guard(generation, spec).await {
                        this.settle_by_gateway(generation, decision).await;
                    }
                });
            }
            (None, None) => {}
        }
    }

    /// After a restart or an upgrade: takes up the pending generation the
    /// history kept, with what its deadline leaves (a deadline already
    /// passed rolls back at once), its canary on the step it had reached
    /// (the previous generation rebuilt to take the rest of new requests)
    /// and its guard with a new window (the answers it had counted were
    /// the old process's). Nothing when the active generation is not the
    /// pending one any more.
    pub(super) fn resume_pending(self: &Arc<Self>) {
        let Some(record) = self.records.lock().pending().cloned() else {
            return;
        };
        if record.generation != self.store.active_id() {
            self.pending.set(&self.records, None);
            return;
        }
        let resumed = Pending::resume(&record)
            .ok_or_else(|| "its canary's hash_key no longer reads".to_owned());
        let resumed = resumed.and_then(|mut pending| {
            if let Some(canary) = &pending.canary {
                let previous = self.rebuild(pending.rollback_to)?;
                let step = pending.step.min(canary.steps.len().saturating_sub(1));
                pending.step = step;
                let started = self.store.start_canary(
                    record.generation,
                    crate::runtime::Canary {
                        previous,
                        percent: canary.steps.get(step).copied().unwrap_or(100),
                        key: canary.key.clone(),
                    },
                );
                if !started {
                    return Err(format!(
                        "generation {} is no longer active",
                        record.generation
                    ));
                }
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
                    step_ends: None,
                };
                *self.pending.lock() = Some(pending.clone());
                self.supervise(&pending);
                return;
            }
        };
        *self.pending.lock() = Some(pending.clone());
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
    pub(super) fn rebuild(&self, id: GenerationId) -> Result<Arc<Generation>, String> {
        let text = self
            .records
            .lock()
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

    /// Settles `generation` on the gateway's own behalf (`who`: the
    /// deadline, a guard or a canary), waiting its turn while another
    /// operation holds the lock; a generation settled meanwhile is left
    /// as it is.
    async fn settle_by_gateway(self: &Arc<Self>, generation: GenerationId, decision: Decision) {
        let Decision { how, who, reason } = decision;
        loop {
            let request = SettleRequest {
                generation,
                expected_active_generation: None,
                requested_by: Some(who.to_owned()),
                reason: Some(reason.clone()),
                caller: None,
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
    pub(super) async fn settle(
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
                caller: request.caller.clone(),
                overrode_freeze: None,
                approved_by: Vec::new(),
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

    pub(super) fn try_settle(
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
            .get()
            .filter(|p| p.generation == request.generation && p.generation == active.id)
            .ok_or(ControlError::NotPending(request.generation))?;
        admit_change(
            Expectation::optional(request.expected_active_generation),
            active.id,
            None,
        )?;
        if how == Settle::Confirm {
            self.store.end_canary(active.id);
            self.pending.set(&self.records, None);
            let operation_id = self.records.record(
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
                outcome: "confirmed".into(),
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
        self.pending.set(&self.records, None);
        self.write_back();
        tracing::warn!(
            pending = %pending.generation,
            generation = %activation.generation,
            rolled_back_to = %pending.rollback_to,
            reason = requester.reason.as_deref().unwrap_or("-"),
            "pending generation rolled back"
        );
        Ok(Settled {
            outcome: "rolled_back".into(),
            generation: activation.generation,
            rolled_back_to: Some(pending.rollback_to),
            operation_id: activation.operation_id,
        })
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
            max_block_ratio: None,
            fail_on_no_data: false,
            confirm_on_pass: true,
        }
    }

    fn answers(requests: u64, errors: u64) -> Answers {
        Answers {
            requests,
            errors,
            blocked: 0,
        }
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
            step_ends: Some(tokio::time::Instant::now() + Duration::from_secs(20)),
        };
        // Status shows where the canary is, and when it moves on.
        let canary = pending.view().canary.unwrap();
        assert_eq!(
            (canary.percent, canary.step, canary.next_percent),
            (50, 3, Some(100))
        );
        let next = canary.seconds_to_next_step.unwrap();
        assert!((19.0..=20.0).contains(&next), "{next}");
        assert_eq!(canary.hash_key.as_deref(), Some("header:x-user"));
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
        let judge = |a, p99, e| judge(&spec(), a, p99, (None, Answers::default()), e);
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
            (Some(answers(900, 45)), Answers::default()),
            early,
        );
        assert_eq!(same, Verdict::Wait);
        // 8 % against 5 %: more than 1 % worse.
        let Verdict::Breach(reason) = judge(
            &spec(),
            answers(100, 8),
            None,
            (Some(answers(900, 45)), Answers::default()),
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
            judge(
                &spec(),
                answers(100, 5),
                None,
                (Some(answers(10, 1)), Answers::default()),
                early
            ),
            Verdict::Breach(_)
        ));
    }

    /// `max_block_ratio` (DESIGN §24): a rule change that starts refusing
    /// real traffic breaches; one that refuses what the previous rules
    /// refused too does not, compared in the window or, without enough
    /// requests there (no canary), with the previous generation's life.
    #[test]
    fn a_guard_compares_the_block_ratio_with_the_previous_generation() {
        let early = Duration::from_secs(1);
        let guard = GuardSpec {
            max_block_ratio: Some(0.02),
            ..spec()
        };
        let blocked = |requests, blocked| Answers {
            requests,
            errors: 0,
            blocked,
        };
        // Without a baseline: 3 % refused against none.
        let Verdict::Breach(reason) = judge(
            &guard,
            blocked(100, 3),
            None,
            (None, Answers::default()),
            early,
        ) else {
            panic!("3 % blocked against none breaches 2 %");
        };
        assert!(
            reason.contains("waf block ratio 0.0300 (3 of 100)"),
            "{reason}"
        );
        assert!(reason.contains("none to compare"), "{reason}");
        // The previous rules refused 2 % over their life: 3 % is within.
        let before = blocked(5_000, 100);
        assert_eq!(
            judge(&guard, blocked(100, 3), None, (None, before), early),
            Verdict::Wait
        );
        // 40 % is not.
        let Verdict::Breach(reason) = judge(&guard, blocked(100, 40), None, (None, before), early)
        else {
            panic!("40 % against 2 % breaches");
        };
        assert!(
            reason.contains("previous generation 0.0200 (100 of 5000 before)"),
            "{reason}"
        );
        // A window with enough of the previous generation's requests (a
        // canary) is what it is compared with.
        let window = blocked(900, 360);
        assert_eq!(
            judge(
                &guard,
                blocked(100, 40),
                None,
                (Some(window), before),
                early
            ),
            Verdict::Wait
        );
        // Without max_block_ratio, blocks are not judged.
        assert_eq!(
            judge(&spec(), blocked(100, 100), None, (None, before), early),
            Verdict::Wait
        );
    }
}

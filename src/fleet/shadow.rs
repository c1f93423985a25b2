//! A shadow stage across a fleet (DESIGN §22, §15): each instance
//! shadows its own traffic, and the sums decide.
//!
//! The writer (the instance whose admin API got the activation) checks
//! the document as any activation, puts it under `shadows/<id>` (on a
//! lease that outlives the stage by a minute), and names the stage in
//! `active` (a transaction on its revision, as every change of it). Every
//! instance serving the active generation sees it through its watch,
//! composes the document with its own file, shadows it on its own traffic
//! (`Control::start_shadow`) and writes its report into its status key
//! every second until the stage's end. The writer sums the reports of
//! every instance (counts added, the worst quantiles), judges them as one
//! instance's stage is judged, clears the stage from `active`, and only
//! then, on a pass, publishes the generation as any activation does. An
//! operator's abort (any instance) clears the stage from `active`: the
//! writer sees it gone and refuses; a writer that dies leaves a stage
//! that every instance ends on its own at its `until`.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use super::etcd::{self, Client};
use super::probation::Probation;
use super::records::{ActiveRecord, InstanceRecord, InstanceShadow, ShadowDoc, ShadowRef};
use super::{within, Fleet, FleetActivation};
use crate::control::{Candidate, CandidateSource, ControlError, ShadowSpec};
use crate::ids::GenerationId;
use crate::runtime::shadow::{ShadowReport, ShadowVerdict};

/// After its end, how long the writer waits for the instances' last
/// reports.
const LAST_REPORTS: Duration = Duration::from_millis(1500);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a fleet's stage ended for its writer.
enum Ended {
    Judged(ShadowVerdict, String),
    /// Another activation moved `active` meanwhile.
    Superseded(GenerationId),
}

impl Fleet {
    /// An activation with a shadow stage, fleet-wide (see the module).
    /// `shared` is the document, already checked on this instance.
    pub(super) async fn activate_shadowed(
        self: &Arc<Self>,
        candidate: Candidate,
        expected: crate::control::Expectation,
        spec: ShadowSpec,
        shared: String,
        probation: Option<Probation>,
    ) -> Result<FleetActivation, ControlError> {
        let client = self.client().await?;
        let (active, revision) = self.read_active(&client).await?;
        crate::control::admit_change(
            expected,
            active.as_ref().map_or(GenerationId::NONE, |a| a.generation),
            None,
        )?;
        let Some(active) = active else {
            return Err(ControlError::FleetUnsupported(
                "the fleet's first generation has nothing to shadow against: activate it without shadow",
            ));
        };
        if active.pending.is_some() {
            return Err(ControlError::ShadowWhilePending(active.generation));
        }
        if active
            .shadow
            .as_ref()
            .is_some_and(|s| s.until_unix_ms > now_ms())
        {
            return Err(ControlError::InProgress);
        }
        let base = active.generation;
        let publish = |shared: String| {
            self.publish(
                shared,
                crate::control::Expectation::optional(Some(base)),
                super::Asked {
                    requested_by: candidate.requested_by.clone(),
                    reason: candidate.reason.clone(),
                    caller: candidate.caller.clone(),
                    approved_by: candidate.approved_by.clone(),
                },
                None,
                probation.clone(),
            )
        };
        // Nothing changes: nothing to shadow.
        if super::records::config_version(&shared) == active.config_version {
            return publish(shared).await;
        }
        let id = format!("{}-{}", self.spec.instance, now_ms());
        let stage = ShadowRef {
            id: id.clone(),
            candidate: self.highest_generation(&client).await?.max(base).next(),
            percent: spec.percent,
            max_inflight: spec.max_inflight,
            waf: spec.max_block_increase.is_some(),
            until_unix_ms: now_ms()
                .saturating_add(u64::try_from(spec.duration.as_millis()).unwrap_or(u64::MAX)),
        };
        let ttl = i64::try_from(spec.duration.as_secs() + 60).unwrap_or(i64::MAX);
        let lease = within(client.lease_grant(ttl)).await?;
        let doc = ShadowDoc {
            id: id.clone(),
            config: shared.clone(),
        };
        let named = ActiveRecord {
            shadow: Some(stage.clone()),
            ..active
        };
        let (Ok(doc), Ok(named)) = (serde_json::to_vec(&doc), serde_json::to_vec(&named)) else {
            return Err(ControlError::Internal(
                "a shadow record did not serialise".into(),
            ));
        };
        within(client.put(self.keys.shadow(&id), doc, lease)).await?;
        let txn = etcd::wire::TxnRequest {
            compare: vec![etcd::modified_at(self.keys.active(), revision)],
            success: vec![etcd::put_op(self.keys.active(), named)],
            failure: Vec::new(),
        };
        if !within(client.txn(txn)).await?.succeeded {
            let _ = within(client.lease_revoke(lease)).await;
            let (now, _) = self.read_active(&client).await?;
            return Err(ControlError::Conflict {
                expected: base,
                active: now.map_or(GenerationId::NONE, |a| a.generation),
            });
        }
        tracing::info!(%id, candidate = %stage.candidate, %base, percent = spec.percent, duration = ?spec.duration, "fleet: shadow stage started");
        let (ended, report) = self.judge_stage(&client, &spec, &stage, base).await;
        self.clear_stage(&client, &id).await;
        let _ = within(client.lease_revoke(lease)).await;
        let (verdict, reason) = match ended {
            Ended::Judged(verdict, reason) => (verdict, reason),
            Ended::Superseded(now) => {
                return Err(ControlError::Conflict {
                    expected: base,
                    active: now,
                })
            }
        };
        let report = ShadowReport {
            verdict,
            reason,
            ..report
        };
        tracing::info!(%id, verdict = ?report.verdict, reason = %report.reason, "fleet: shadow stage ended");
        let goes_on = match verdict {
            ShadowVerdict::Passed => true,
            ShadowVerdict::NoData => !spec.fail_on_no_data,
            _ => false,
        };
        if !goes_on {
            return Err(ControlError::ShadowRefused(Box::new(report)));
        }
        let mut activation = publish(shared).await?;
        activation.shadow = Some(report);
        Ok(activation)
    }

    /// Sums the instances' reports every twentieth of the stage (between
    /// 250 ms and 1 s) until it breaches, ends, or leaves `active`.
    async fn judge_stage(
        &self,
        client: &Client,
        spec: &ShadowSpec,
        stage: &ShadowRef,
        base: GenerationId,
    ) -> (Ended, ShadowReport) {
        let every = (spec.duration / 20).clamp(Duration::from_millis(250), Duration::from_secs(1));
        let end = tokio::time::Instant::now() + spec.duration;
        let empty = || ShadowReport::empty(stage.candidate, base, stage.percent);
        let mut last = empty();
        loop {
            tokio::time::sleep(every).await;
            let now = tokio::time::Instant::now();
            match self.read_active(client).await {
                Ok((Some(active), _)) if active.shadow.as_ref() != Some(stage) => {
                    let ended = if active.generation == base {
                        Ended::Judged(
                            ShadowVerdict::Aborted,
                            "shadow aborted by an operator".into(),
                        )
                    } else {
                        Ended::Superseded(active.generation)
                    };
                    return (ended, last);
                }
                // etcd unreachable for a moment: judge what was read.
                _ => {}
            }
            if let Some(summed) = self.stage_reports(client, &stage.id).await {
                last = summed;
            }
            let ended = now >= end + LAST_REPORTS;
            if let Some((verdict, reason)) = crate::control::judge_shadow(spec, &last, ended) {
                return (Ended::Judged(verdict, reason), last);
            }
        }
    }

    /// The sum of every live instance's report of stage `id`.
    async fn stage_reports(&self, client: &Client, id: &str) -> Option<ShadowReport> {
        let live = within(client.get_prefix(self.keys.instances(), false))
            .await
            .ok()?;
        let reports: Vec<ShadowReport> = live
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<InstanceRecord>(&kv.value).ok())
            .filter_map(|record| record.shadow.filter(|s| s.id == id).map(|s| s.report))
            .collect();
        ShadowReport::sum(&reports)
    }

    /// Takes stage `id` out of `active`, if it is still there.
    async fn clear_stage(&self, client: &Client, id: &str) {
        for _ in 0..5 {
            let Ok((Some(active), revision)) = self.read_active(client).await else {
                return;
            };
            if active.shadow.as_ref().is_none_or(|s| s.id != id) {
                return;
            }
            let cleared = ActiveRecord {
                shadow: None,
                ..active
            };
            let Ok(value) = serde_json::to_vec(&cleared) else {
                return;
            };
            let txn = etcd::wire::TxnRequest {
                compare: vec![etcd::modified_at(self.keys.active(), revision)],
                success: vec![etcd::put_op(self.keys.active(), value)],
                failure: Vec::new(),
            };
            if within(client.txn(txn)).await.is_ok_and(|t| t.succeeded) {
                return;
            }
        }
        tracing::warn!(%id, "fleet: could not take the shadow stage out of active; instances end it at its end");
    }

    /// `abort` naming a fleet-wide stage's candidate: takes the stage out
    /// of `active` (its writer then refuses the activation); the active
    /// generation, or `None` when no stage of that candidate runs.
    pub(super) async fn abort_stage(
        &self,
        candidate: GenerationId,
    ) -> Result<Option<GenerationId>, ControlError> {
        let client = self.client().await?;
        let (active, _) = self.read_active(&client).await?;
        let Some((base, stage)) = active
            .and_then(|a| Some((a.generation, a.shadow?)))
            .filter(|(_, s)| s.candidate == candidate)
        else {
            return Ok(None);
        };
        self.clear_stage(&client, &stage.id).await;
        Ok(Some(base))
    }

    /// Follows the stage `active` names: starts shadowing a new one (when
    /// this instance serves the generation it is compared with), stops
    /// one that is no longer named.
    pub(super) fn follow_stage(self: &Arc<Self>, record: &ActiveRecord) {
        let mut running = self
            .shadowing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match (&record.shadow, running.as_ref()) {
            (Some(stage), Some((id, _))) if *id == stage.id => return,
            (_, Some((_, stop))) => {
                stop.notify_one();
                *running = None;
            }
            _ => {}
        }
        let Some(stage) = record.shadow.clone() else {
            return;
        };
        if stage.until_unix_ms <= now_ms() || self.applied().generation != record.generation {
            return;
        }
        let stop = Arc::new(tokio::sync::Notify::new());
        *running = Some((stage.id.clone(), Arc::clone(&stop)));
        let this = Arc::clone(self);
        tokio::spawn(async move {
            this.shadow_here(&stage, &stop).await;
            let mut running = this
                .shadowing
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if running.as_ref().is_some_and(|(id, _)| *id == stage.id) {
                *running = None;
            }
        });
    }

    /// Shadows `stage` on this instance's traffic until its end (or until
    /// stopped), reporting every second.
    async fn shadow_here(&self, stage: &ShadowRef, stop: &tokio::sync::Notify) {
        let handle = match self.start_stage(stage).await {
            Ok(Some(handle)) => handle,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(id = %stage.id, %error, "fleet: cannot shadow the stage's document here");
                return;
            }
        };
        let left = Duration::from_millis(stage.until_unix_ms.saturating_sub(now_ms()));
        let end = tokio::time::Instant::now() + left;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let ended = tokio::select! {
                _ = tick.tick() => false,
                () = tokio::time::sleep_until(end) => true,
                () = stop.notified() => true,
            };
            self.say_stage(stage, handle.report()).await;
            if ended {
                return;
            }
        }
    }

    /// The stage's document, composed with this instance's file, built and
    /// installed.
    async fn start_stage(
        &self,
        stage: &ShadowRef,
    ) -> Result<Option<crate::control::ShadowHandle>, ControlError> {
        let client = self.client().await?;
        let found = within(client.get(self.keys.shadow(&stage.id))).await?;
        let doc: ShadowDoc = found
            .kvs
            .first()
            .and_then(|kv| serde_json::from_slice(&kv.value).ok())
            .ok_or_else(|| {
                ControlError::Internal(format!("{} is gone", self.keys.shadow(&stage.id)))
            })?;
        let origin = format!(
            "{} with shadow stage {}",
            self.control.config_file().display(),
            stage.id
        );
        let text = self.composed(&doc.config, &origin)?;
        let candidate = Candidate {
            source: CandidateSource::Composed { text, origin },
            freeze: crate::control::FreezeRule::Exempt,
            ..Candidate::config_file()
        };
        self.control
            .start_shadow(candidate, (stage.percent, stage.max_inflight, stage.waf))
            .await
    }

    async fn say_stage(&self, stage: &ShadowRef, report: ShadowReport) {
        self.said
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shadow = Some(InstanceShadow {
            id: stage.id.clone(),
            report,
        });
        self.say().await;
    }
}

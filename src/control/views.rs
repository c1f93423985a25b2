//! Read-only views of the control plane: status, history, operations.

use std::borrow::Cow;
use std::sync::{Arc, PoisonError};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::error::ControlError;
use super::local::Control;
use super::timeline::{self, TimelineView};
use crate::ids::GenerationId;
use crate::plan::{self, Diff};
use crate::runtime::{rfc3339, GenerationLoad, GenerationRecord, OperationRecord, Source};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerationView {
    pub generation: GenerationId,
    pub status: Cow<'static, str>,
    pub config_version: String,
    pub activated_at: String,
    pub source: Source,
    pub rolled_back_to: Option<GenerationId>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    /// The authenticated admin caller that made it (`admin.callers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    pub rollback_candidate: bool,
    pub inflight_requests: u64,
    pub open_connections: u64,
    /// For a guarded activation (DESIGN §14): pending, or how it was
    /// settled and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settlement: Option<Settlement>,
}

/// How a pending generation ended, or that it still pends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settlement {
    /// `pending`, `confirmed`, `aborted` or `auto_rolled_back`.
    pub state: Cow<'static, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The settlements the operation log records, by the generation they
/// settled (a confirm names it as `generation`; an abort or an automatic
/// rollback as `previous_generation`, the generation it replaced).
fn settlements<'a>(
    operations: impl Iterator<Item = &'a OperationRecord>,
) -> std::collections::HashMap<GenerationId, Settlement> {
    use crate::runtime::{OperationKind, Outcome};
    let mut settled = std::collections::HashMap::new();
    for op in operations.filter(|op| op.outcome == Outcome::Succeeded) {
        let (state, generation) = match op.kind {
            OperationKind::Confirm => ("confirmed", op.generation),
            OperationKind::Abort => ("aborted", op.previous_generation),
            OperationKind::AutoRollback => ("auto_rolled_back", op.previous_generation),
            _ => continue,
        };
        if let Some(generation) = generation {
            settled.entry(generation).or_insert_with(|| Settlement {
                state: state.into(),
                operation_id: Some(op.id.clone()),
                at: Some(op.at.clone()),
                requested_by: op.requested_by.clone(),
                reason: op.reason.clone(),
            });
        }
    }
    settled
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryView {
    pub active_generation: GenerationId,
    pub history_limit: usize,
    pub generations: Vec<GenerationView>,
    pub operations: Vec<OperationRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerationDetail {
    #[serde(flatten)]
    pub summary: GenerationView,
    pub origin: String,
    pub config: String,
    /// Diff against the retained generation before it, when there is one.
    pub predecessor: Option<GenerationId>,
    pub diff: Option<Diff>,
    /// What going from the predecessor to it does to the requests the
    /// listeners sampled now (DESIGN §22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<crate::plan::impact::Impact>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperationBrief {
    pub id: String,
    pub kind: crate::runtime::OperationKind,
    pub outcome: crate::runtime::Outcome,
    pub at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusView {
    pub pid: u32,
    /// The executable this process runs.
    pub binary: Option<super::process::BinaryView>,
    pub phase: crate::runtime::Phase,
    pub active_generation: GenerationId,
    pub config_version: String,
    pub activated_at: String,
    pub generations: Vec<GenerationLoad>,
    pub listeners: Vec<crate::proxy::ListenerInfo>,
    pub last_operation: Option<OperationBrief>,
    /// Requests answered since the process started, and how many 5xx.
    pub requests_total: u64,
    pub errors_total: u64,
    /// The generation awaiting confirmation, if any.
    pub pending: Option<super::pending::PendingView>,
    /// Whether the configuration file's text is the active generation's
    /// (`false` after an API activation, until the file is updated; a
    /// rotated certificate behind the same text is not looked at).
    pub config_file_matches_active: bool,
    /// The shadow stage running (its report so far), or else the last one
    /// that ended (DESIGN §22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<crate::runtime::shadow::ShadowReport>,
    /// Every certificate the TLS listeners serve: ACME state and OCSP
    /// staples with it (DESIGN §21).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<crate::keeper::CertificateStatus>,
}

impl Control {
    pub fn status_view(&self) -> StatusView {
        // Pending before active: a settle swaps the generation first and
        // clears the pending record after, so a pending record read first
        // and naming another generation than the active one is already
        // settled.
        let pending = self.pending();
        let active = self.store.load_full();
        let pending = pending.filter(|p| p.generation == active.id);
        let history = self.records.lock();
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
            phase: self.lock.phase().get(),
            active_generation: active.id,
            config_version: active.spec.config_version.clone(),
            activated_at,
            generations: self.store.loads(),
            listeners: self.listeners.info(),
            last_operation,
            requests_total,
            errors_total,
            pending,
            config_file_matches_active: self
                .file
                .matches(active.id, || self.records.config_of(active.id)),
            shadow: self.shadow_report(),
            certificates: self.keeper().status(),
        }
    }

    /// Retained generations and the operation log. Runs off the data
    /// plane's threads: `rollback_candidate` plans every retained
    /// configuration against the active one (milliseconds each for a
    /// large configuration: `docs/performance.md`).
    pub async fn history_view(self: &Arc<Self>) -> Result<HistoryView, ControlError> {
        self.off_the_data_plane(|c| Ok(c.build_history_view()))
            .await
    }

    /// One retained generation with its text and the diff against its
    /// predecessor (two plans), off the data plane's threads.
    pub async fn generation_detail(
        self: &Arc<Self>,
        id: GenerationId,
    ) -> Result<Option<GenerationDetail>, ControlError> {
        self.off_the_data_plane(move |c| Ok(c.build_generation_detail(id)))
            .await
    }

    fn build_history_view(&self) -> HistoryView {
        let records: Vec<GenerationRecord>;
        let operations: Vec<OperationRecord>;
        let limit;
        {
            let history = self.records.lock();
            records = history.generations().cloned().collect();
            operations = history.operations().cloned().collect();
            limit = history.limit();
        }
        let active = self.store.load_full();
        let loads = self.store.loads();
        let mut settled = settlements(operations.iter());
        let generations = records
            .iter()
            .map(|r| self.view(r, active.id, &loads, settled.remove(&r.generation)))
            .collect();
        HistoryView {
            active_generation: active.id,
            history_limit: limit,
            generations,
            operations,
        }
    }

    fn build_generation_detail(&self, id: GenerationId) -> Option<GenerationDetail> {
        let (record, predecessor, settlement) = {
            let history = self.records.lock();
            (
                history.generation(id).cloned()?,
                history.predecessor(id).cloned(),
                settlements(history.operations()).remove(&id),
            )
        };
        let active = self.store.active_id();
        let summary = self.view(&record, active, &self.store.loads(), settlement);
        let config = record.config_text().ok()?;
        let compared = predecessor.as_ref().and_then(|p| {
            let before = plan::validate(&p.config_text().ok()?).ok()?;
            let after = plan::validate(&config).ok()?;
            let diff = plan::diff(
                &before.file,
                &before.canonical,
                &format!("generation {}", p.generation),
                &after.file,
                &after.canonical,
            );
            let impact = self.impact(
                crate::impact::Before::Spec(&before),
                &after,
                &self.store.load_full(),
            );
            Some((diff, impact))
        });
        let (diff, impact) = match compared {
            Some((diff, impact)) => (Some(diff), impact),
            None => (None, None),
        };
        Some(GenerationDetail {
            summary,
            origin: record.origin,
            config: config.text,
            predecessor: predecessor.map(|p| p.generation),
            diff,
            impact,
        })
    }

    pub fn operation(&self, id: &str) -> Option<OperationRecord> {
        self.records.lock().operation(id).cloned()
    }

    fn view(
        &self,
        record: &GenerationRecord,
        active: GenerationId,
        loads: &[GenerationLoad],
        settlement: Option<Settlement>,
    ) -> GenerationView {
        let load = loads.iter().find(|l| l.generation == record.generation);
        let is_active = record.generation == active;
        let pending = self.pending();
        // A canary's previous generation still takes the rest of new
        // requests: serving, not draining.
        let serving = pending
            .as_ref()
            .is_some_and(|p| p.canary.is_some() && p.rollback_to == record.generation);
        let settlement = settlement.or_else(|| {
            pending
                .filter(|p| p.generation == record.generation)
                .map(|_| Settlement {
                    state: "pending".into(),
                    operation_id: None,
                    at: None,
                    requested_by: None,
                    reason: None,
                })
        });
        GenerationView {
            generation: record.generation,
            status: if is_active {
                "active".into()
            } else if serving && load.is_some() {
                "serving".into()
            } else if load.is_some() {
                "draining".into()
            } else {
                "retained".into()
            },
            config_version: record.config_version.clone(),
            activated_at: record.activated_at.clone(),
            source: record.source,
            rolled_back_to: record.rolled_back_to,
            requested_by: record.requested_by.clone(),
            reason: record.reason.clone(),
            caller: record.caller.clone(),
            rollback_candidate: !is_active && self.activatable(record),
            inflight_requests: load.map_or(0, |l| l.inflight_requests),
            open_connections: load.map_or(0, |l| l.open_connections),
            settlement,
        }
    }

    /// Whether a retained generation could be activated now: it validates
    /// (its files are still there) and needs no restart.
    /// The active generation the cached candidacies were planned against,
    /// and how many there are.
    #[cfg(test)]
    pub(crate) fn cached_candidacy(&self) -> (GenerationId, usize) {
        self.candidacy.summary()
    }

    /// Planned once per retained generation and active generation.
    fn activatable(&self, record: &GenerationRecord) -> bool {
        let active = self.store.load_full();
        if record.config_version == active.spec.config_version {
            // Activating it would change nothing.
            return false;
        }
        if let Some(known) = self.candidacy.known(active.id, record.generation) {
            return known;
        }
        // Planned without the lock: two requests at once may both plan.
        let activatable = record
            .config_text()
            .is_ok_and(|text| plan::plan(&text, Some((active.id, &active.spec))).activatable);
        self.candidacy
            .remember(active.id, record.generation, activatable);
        activatable
    }
}

impl Control {
    /// Takes this second's point (called once a second by start-up's
    /// gauge task).
    pub fn sample_timeline(&self) {
        let pending = self.pending().map(|p| (p.generation, p.rollback_to));
        let roles = self.store.roles(pending);
        let changes = crate::backends::state_changes();
        let active = self.store.load_full();
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
        let records = self.records.lock();
        timeline::view(points, backends, SystemTime::now(), records.operations())
    }
}

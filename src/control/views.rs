//! Read-only views of the control plane: status, history, operations.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::pending::PendingView;
use super::records::{Candidacy, Records};
use crate::generation::{Generation, SharedState};
use crate::ids::GenerationId;
use crate::plan::{self, Diff};
use crate::runtime::{GenerationLoad, GenerationRecord, GenerationStore, OperationRecord, Source};

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

/// What the history views read: the records, the generation store, the
/// pending generation (read before the active one: a settle swaps the
/// generation first and clears the pending record after), the rollback
/// candidacies and, for a generation's impact, the listeners' samples.
pub(super) struct Reader<'a> {
    pub(super) records: &'a Records,
    pub(super) store: &'a GenerationStore,
    pub(super) pending: Option<PendingView>,
    pub(super) candidacy: &'a Candidacy,
    pub(super) shared: &'a SharedState,
}

impl Reader<'_> {
    /// Retained generations and the operation log. `rollback_candidate`
    /// plans every retained configuration against the active one
    /// (milliseconds each for a large configuration:
    /// `docs/performance.md`): run off the data plane's threads.
    pub(super) fn history(&self) -> HistoryView {
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
            .map(|r| self.view(r, &active, &loads, settled.remove(&r.generation)))
            .collect();
        HistoryView {
            active_generation: active.id,
            history_limit: limit,
            generations,
            operations,
        }
    }

    /// One retained generation with its text and the diff against its
    /// predecessor (two plans): run off the data plane's threads.
    pub(super) fn generation(&self, id: GenerationId) -> Option<GenerationDetail> {
        let (record, predecessor, settlement) = {
            let history = self.records.lock();
            (
                history.generation(id).cloned()?,
                history.predecessor(id).cloned(),
                settlements(history.operations()).remove(&id),
            )
        };
        let active = self.store.load_full();
        let summary = self.view(&record, &active, &self.store.loads(), settlement);
        let config = record.config_text().ok()?;
        let compared = predecessor.as_ref().and_then(|p| {
            // Shared with the active configuration where unchanged: a
            // rule set is not compiled again for a view.
            let before = plan::validate_sharing(&p.config_text().ok()?, &active.spec).ok()?;
            let after = plan::validate_sharing(&config, &active.spec).ok()?;
            let diff = plan::diff(
                &before.file,
                &before.canonical,
                &format!("generation {}", p.generation),
                &after.file,
                &after.canonical,
            );
            let impact = crate::impact::of_sampled(
                self.shared,
                crate::impact::Before::Spec(&before),
                &after,
                &active,
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

    fn view(
        &self,
        record: &GenerationRecord,
        active: &Generation,
        loads: &[GenerationLoad],
        settlement: Option<Settlement>,
    ) -> GenerationView {
        let load = loads.iter().find(|l| l.generation == record.generation);
        let is_active = record.generation == active.id;
        let pending = self.pending.as_ref();
        // A canary's previous generation still takes the rest of new
        // requests: serving, not draining.
        let serving =
            pending.is_some_and(|p| p.canary.is_some() && p.rollback_to == record.generation);
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
            rollback_candidate: !is_active && self.candidacy.activatable(active, record),
            inflight_requests: load.map_or(0, |l| l.inflight_requests),
            open_connections: load.map_or(0, |l| l.open_connections),
            settlement,
        }
    }
}

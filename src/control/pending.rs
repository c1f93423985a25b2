//! The pending generation of a guarded activation (DESIGN §14) as state:
//! what settles it (deadline, guard, canary step), how it is recorded to
//! survive a restart and shown in status, its slot on the control plane,
//! and the answers a guard compares it by. `guarded.rs` is what the
//! control plane does with it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::candidate::{CanarySpec, GuardSpec};
use super::records::Records;
use crate::ids::GenerationId;
use crate::runtime::{rfc3339, GenerationStore};

/// A generation on probation (DESIGN §14): active, and rolled back to
/// `rollback_to` unless confirmed by `deadline`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingView {
    pub generation: GenerationId,
    /// The last final generation: what a missed deadline or an abort
    /// brings back.
    pub rollback_to: GenerationId,
    /// `null` for a guard without `confirm_within`: its window decides.
    pub deadline: Option<String>,
    pub seconds_left: Option<f64>,
    /// During canary steps: the share of new requests it takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary_percent: Option<u8>,
    /// During canary steps: where it is in them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryView>,
    /// Whether a guard judges it (a breach rolls it back).
    #[serde(default)]
    pub guarded: bool,
}

/// A canary's place in its steps, as status shows it: the share of new
/// requests the pending generation takes now (the previous generation
/// takes the rest), the step (from 1) of `steps`, and when the next
/// begins unless the guard ends it first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryView {
    pub percent: u8,
    pub step: usize,
    pub steps: Vec<u8>,
    pub step_interval_seconds: f64,
    /// `null` on the last step, or before the step's timer started.
    pub next_percent: Option<u8>,
    pub seconds_to_next_step: Option<f64>,
    /// What keeps a client on one side (`header:x-user`), if anything.
    pub hash_key: Option<String>,
}

/// The pending generation, while there is one: what settles it, and
/// (persisted as a `PendingRecord`) what a restart needs to resume it.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) generation: GenerationId,
    pub(super) rollback_to: GenerationId,
    /// `confirm_within`; none when a guard or a canary alone settles it.
    pub(super) deadline: Option<Deadline>,
    pub(super) guard: Option<GuardSpec>,
    pub(super) canary: Option<CanarySpec>,
    /// The canary step it is on: an index into `canary.steps`.
    pub(super) step: usize,
    /// When the canary's current step ends (its verdict is due).
    pub(super) step_ends: Option<tokio::time::Instant>,
}

/// A confirm deadline, on the timer's clock and on the wall clock (which
/// is what survives a restart).
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    pub(super) at: tokio::time::Instant,
    pub(super) wall: SystemTime,
}

/// Answers of one generation over a guard's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Answers {
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    /// Refused by the web application firewall (DESIGN §24).
    pub(crate) blocked: u64,
}

/// The previous generation's answers since a guard started: what the
/// pending generation is compared with over the same window.
pub(crate) struct Baseline {
    pub(super) ledger: Option<Arc<crate::generation::Ledger>>,
    pub(super) start: Answers,
}

/// The pending generation's slot (DESIGN §14): set and cleared under the
/// operation lock, read by status, the timeline and the supervisors.
#[derive(Default)]
pub(super) struct PendingSlot(Mutex<Option<Pending>>);

impl PendingSlot {
    pub(super) fn lock(&self) -> MutexGuard<'_, Option<Pending>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pending generation, if any, as it is now.
    pub(super) fn get(&self) -> Option<Pending> {
        self.lock().clone()
    }

    /// The pending generation as status shows it, with the share
    /// admission gives it now in `store` (the step's own may be a moment
    /// ahead of it while a step changes).
    pub(super) fn view(&self, store: &GenerationStore) -> Option<PendingView> {
        let mut view = self.lock().as_ref().map(Pending::view)?;
        view.canary_percent = store.canary().map(|c| c.percent);
        if let (Some(canary), Some(percent)) = (view.canary.as_mut(), view.canary_percent) {
            canary.percent = percent;
        }
        Some(view)
    }

    /// Sets or clears the pending generation, in memory and in `records`
    /// (on disk with a state dir): a restart or an upgrade during its
    /// window resumes it.
    pub(super) fn set(&self, records: &Records, pending: Option<Pending>) {
        let record = pending.as_ref().map(Pending::record);
        *self.lock() = pending;
        if records.lock().pending() != record.as_ref() {
            records.with(|history| history.set_pending(record));
        }
    }

    /// Notes when the pending canary's current step ends (shown in
    /// status as the time to its next step).
    pub(super) fn step_ends(&self, generation: GenerationId, ends: tokio::time::Instant) {
        if let Some(pending) = self.lock().as_mut().filter(|p| p.generation == generation) {
            pending.step_ends = Some(ends);
        }
    }

    /// Moves the pending canary to `step`, in memory and in `records`;
    /// `false` when `generation` is not pending any more.
    pub(super) fn record_step(
        &self,
        records: &Records,
        generation: GenerationId,
        step: usize,
    ) -> bool {
        // Held until the record is written: a settle clears the record
        // after this, never before.
        let mut slot = self.lock();
        let Some(pending) = slot.as_mut().filter(|p| p.generation == generation) else {
            return false;
        };
        pending.step = step;
        let record = pending.record();
        records.with(|history| history.set_pending(Some(record)));
        true
    }
}

impl Deadline {
    pub(super) fn after(within: Duration) -> Self {
        Self {
            at: tokio::time::Instant::now() + within,
            wall: SystemTime::now() + within,
        }
    }

    /// A persisted deadline, with what is left of it (nothing, once past).
    pub(super) fn from_unix_ms(ms: u64) -> Self {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let left = wall
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Self {
            at: tokio::time::Instant::now() + left,
            wall,
        }
    }

    pub(super) fn unix_ms(self) -> u64 {
        self.wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl Answers {
    pub(crate) fn of(ledger: &crate::generation::Ledger) -> Self {
        Self {
            requests: ledger.requests.get(),
            errors: ledger.errors.get(),
            blocked: ledger.waf_blocked.get(),
        }
    }

    pub(crate) fn since(self, start: Answers) -> Self {
        Self {
            requests: self.requests.saturating_sub(start.requests),
            errors: self.errors.saturating_sub(start.errors),
            blocked: self.blocked.saturating_sub(start.blocked),
        }
    }

    pub(super) fn ratio(self) -> f64 {
        self.errors as f64 / self.requests.max(1) as f64
    }

    pub(super) fn block_ratio(self) -> f64 {
        self.blocked as f64 / self.requests.max(1) as f64
    }
}

impl Baseline {
    pub(crate) fn start(store: &GenerationStore, generation: Option<GenerationId>) -> Self {
        let ledger = generation.and_then(|id| store.ledger(id));
        let start = ledger.as_deref().map(Answers::of).unwrap_or_default();
        Self { ledger, start }
    }

    pub(crate) fn answers(&self) -> Option<Answers> {
        self.ledger
            .as_deref()
            .map(|l| Answers::of(l).since(self.start))
    }

    /// The previous generation's answers before the guard started, over
    /// its life: what a block ratio is compared with when the previous
    /// generation answers too few requests in the window (without a
    /// canary it takes no new ones).
    pub(crate) fn before(&self) -> Answers {
        self.start
    }
}

impl Pending {
    pub(super) fn view(&self) -> PendingView {
        PendingView {
            generation: self.generation,
            rollback_to: self.rollback_to,
            deadline: self.deadline.map(|d| rfc3339(d.wall)),
            seconds_left: self.deadline.map(|d| {
                d.at.saturating_duration_since(tokio::time::Instant::now())
                    .as_secs_f64()
            }),
            canary_percent: None,
            guarded: self.guard.is_some(),
            canary: self.canary.as_ref().map(|c| {
                let last = self.step + 1 >= c.steps.len();
                CanaryView {
                    percent: c.steps.get(self.step).copied().unwrap_or(100),
                    step: self.step + 1,
                    steps: c.steps.clone(),
                    step_interval_seconds: c.step_interval.as_secs_f64(),
                    next_percent: c.steps.get(self.step + 1).copied(),
                    seconds_to_next_step: self.step_ends.filter(|_| !last).map(|at| {
                        at.saturating_duration_since(tokio::time::Instant::now())
                            .as_secs_f64()
                    }),
                    hash_key: c.key.as_ref().map(ToString::to_string),
                }
            }),
        }
    }

    pub(super) fn record(&self) -> crate::runtime::PendingRecord {
        crate::runtime::PendingRecord {
            generation: self.generation,
            rollback_to: self.rollback_to,
            deadline_unix_ms: self.deadline.map(Deadline::unix_ms),
            guard: self.guard.as_ref().map(GuardSpec::record),
            canary: self.canary.as_ref().map(|c| c.record(self.step)),
        }
    }

    /// A persisted pending generation; `None` when its canary's
    /// `hash_key` no longer reads (it did when it was written).
    pub(super) fn resume(record: &crate::runtime::PendingRecord) -> Option<Self> {
        let canary = match &record.canary {
            Some(c) => Some(CanarySpec::from_record(c)?),
            None => None,
        };
        let step = record.canary.as_ref().map_or(0, |c| c.step);
        Some(Self {
            generation: record.generation,
            rollback_to: record.rollback_to,
            deadline: record.deadline_unix_ms.map(Deadline::from_unix_ms),
            guard: record.guard.as_ref().map(GuardSpec::from_record),
            canary,
            step,
            step_ends: None,
        })
    }
}

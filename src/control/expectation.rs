//! The one expected-generation rule every writer applies before a change:
//! local, shadowed and fleet activations, rollbacks and settlements.

use super::candidate::FreezeRule;
use super::error::ControlError;
use crate::ids::GenerationId;
use crate::plan;

/// What a change says of the generation it was planned against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expectation {
    /// The generation it names (`expected_generation`,
    /// `expected_active_generation`), if any.
    pub named: Option<GenerationId>,
    /// Whether it must name one: an activation under
    /// `admin.require_expected_generation` (428 otherwise).
    pub required: bool,
}

impl Expectation {
    /// An activation's expectation, under the active configuration's
    /// `admin.require_expected_generation`.
    pub fn activation(named: Option<GenerationId>, active: &plan::Spec) -> Self {
        Self {
            named,
            required: active.admin.require_expected_generation,
        }
    }

    /// 428 when one is required and none is named: the first of the
    /// rules, which a writer that reads the active generation remotely
    /// (the fleet) checks before it asks.
    pub fn given(&self) -> Result<(), ControlError> {
        if self.required && self.named.is_none() {
            return Err(ControlError::ExpectedGenerationRequired);
        }
        Ok(())
    }

    /// Any other change's (rollback, confirm, abort, legacy reload): the
    /// generation it names is checked, none is required.
    pub fn optional(named: Option<GenerationId>) -> Self {
        Self {
            named,
            required: false,
        }
    }
}

/// The rules every writer (this instance, or the fleet; with or without a
/// shadow stage) applies before a change, in this order: an expectation
/// that is required must be given (428 `expected_generation_required`);
/// an expected generation must be the active one (409
/// `generation_conflict`); and while generation `pending` awaits
/// confirmation a new change must name it, superseding it (409
/// `pending_activation`).
pub fn admit_change(
    expected: Expectation,
    active: GenerationId,
    pending: Option<GenerationId>,
) -> Result<(), ControlError> {
    expected.given()?;
    if let Some(named) = expected.named.filter(|named| *named != active) {
        return Err(ControlError::Conflict {
            expected: named,
            active,
        });
    }
    match pending {
        Some(pending) if expected.named != Some(pending) => {
            Err(ControlError::PendingActivation { pending })
        }
        _ => Ok(()),
    }
}

/// The freeze rule (DESIGN §23), applied by every writer to activations,
/// reloads and upgrades (never to rollbacks, aborts or reload-certs: they
/// are how an operator gets out of trouble): a window of the active
/// configuration that holds now refuses the change (423 `frozen`) unless
/// it overrides it; then the window is returned, for its record.
pub fn admit_in_freeze(
    active: &plan::Spec,
    rule: FreezeRule,
) -> Result<Option<plan::Frozen>, Box<plan::Frozen>> {
    if rule == FreezeRule::Exempt {
        return Ok(None);
    }
    match plan::frozen_at(&active.admin.freeze, std::time::SystemTime::now()) {
        None => Ok(None),
        Some(frozen) if rule == FreezeRule::Override => {
            tracing::warn!(window = %frozen.reason, until = %frozen.until, "a change goes through a freeze window by override");
            Ok(Some(frozen))
        }
        Some(frozen) => Err(Box::new(frozen)),
    }
}

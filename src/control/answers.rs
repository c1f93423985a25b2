//! What the writer's operations answer: an activation (also a reload or
//! a rollback), a recorded preview, a settled pending generation.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::pending::PendingView;
use crate::ids::GenerationId;
use crate::plan::{Diff, Plan};
use crate::proxy::ListenerInfo;

/// The result of activate, reload and rollback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Activation {
    pub outcome: Cow<'static, str>,
    pub generation: GenerationId,
    pub previous_generation: GenerationId,
    pub config_version: String,
    pub rolled_back_to: Option<GenerationId>,
    pub duration_ms: u64,
    pub listeners: Vec<ListenerInfo>,
    pub diff: Diff,
    pub operation_id: String,
    /// Set when the activation must be confirmed (`confirm_within`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingView>,
    /// What its shadow stage showed, when it had one (DESIGN §22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<crate::runtime::shadow::ShadowReport>,
}

/// A plan with the operation it was recorded as (preview).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordedPlan {
    #[serde(flatten)]
    pub plan: Plan,
    pub operation_id: String,
}

/// What confirm and abort answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settled {
    pub outcome: Cow<'static, str>,
    /// The active generation after it: the confirmed one, or the one the
    /// rollback minted.
    pub generation: GenerationId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<GenerationId>,
    pub operation_id: String,
}

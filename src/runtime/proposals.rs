//! Proposals (DESIGN §23): changes waiting for other callers' approval,
//! kept with the history (or, in a fleet, in etcd) so that a restart or
//! an upgrade keeps them. What they hold; `admin/approvals.rs` decides
//! what happens to them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::GenerationId;
use crate::plan::Approvable;

/// Open proposals kept at once; more are refused (429).
pub const OPEN_LIMIT: usize = 32;
/// Closed proposals kept for the record (the oldest go first).
pub const CLOSED_LIMIT: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProposalState {
    /// Waiting for approvals.
    Open,
    /// Approved: being carried out now.
    Approved,
    /// Approved and carried out (`operation_id`).
    Executed,
    /// Approved, but the change was refused when carried out (`error`:
    /// a stale expected generation, a freeze, …).
    Failed,
    Rejected,
    Expired,
}

/// A caller's approval or rejection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub caller: String,
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProposalRecord {
    /// `p-000001`.
    pub id: String,
    pub state: ProposalState,
    pub operation: Approvable,
    /// The authenticated caller that asked for the change.
    pub proposer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub expires_unix_ms: u64,
    /// The generation it was planned against: carried out only while it
    /// is still the active one (409 otherwise).
    pub expected_generation: GenerationId,
    /// Approvals needed.
    pub approvers: u32,
    /// What the change does, as planned when it was proposed (the diff
    /// and the live impact of an activation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Value>,
    /// The request, carried out as asked once approved.
    pub change: Value,
    #[serde(default)]
    pub approvals: Vec<Verdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Verdict>,
    /// Once carried out: its operation, or why it could not be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// In a fleet: the instance it was proposed on (an upgrade is that
    /// instance's, and only it carries one out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// In a fleet, once approved: the instance that carries it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carrier: Option<String>,
}

/// Why a proposal call was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProposalError {
    #[error("approvals are not configured ([admin.approval] or a caller's requires_approval)")]
    NotConfigured,
    #[error("proposals and approvals need an authenticated caller")]
    Anonymous,
    #[error("no proposal '{0}'")]
    NotFound(String),
    #[error("proposal {id} is {state:?}, not open")]
    Closed { id: String, state: ProposalState },
    #[error("the proposer of {0} cannot approve it: another caller must")]
    SelfApproval(String),
    #[error("{caller} already approved {id}")]
    AlreadyApproved { id: String, caller: String },
    #[error("{0} proposals are open: approve, reject or let some expire first")]
    TooMany(usize),
    #[error("rejecting a proposal takes a reason")]
    NoReason,
    /// The fleet's store could not be read or written: nothing changed.
    #[error("the fleet's proposals are out of reach: {0}")]
    Unavailable(String),
}

//! Fleet-scoped quotas (issue 58): `quota = { …, scope = "fleet" }`
//! counts in a shared Redis (`[limits] store`), so that N instances admit
//! the limit once, not N times.
//!
//! - `store.rs`: the connection, its health (up, down and probed back),
//!   the instances it counts, and the Lua scripts (one round trip each);
//! - `fleet.rs`: a route's leases: tokens taken from the store in
//!   batches (the pre-allowance) and spent here without a round trip,
//!   and what a decision falls back to while the store fails;
//! - `local.rs`: a local quota's token buckets (`scope = "local"`),
//!   which are also what a fleet quota falls back to, with this
//!   instance's share.

pub mod fleet;
mod local;
mod store;

pub use fleet::FleetQuota;
pub use local::QuotaTable;
pub use store::{Miss, Store};

/// How one request's quota decided (`outcome` of
/// `cutover_ratelimit_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted by the count (the store's for a fleet quota, this
    /// process's for a local one).
    Allowed,
    /// Refused by the count: 429.
    Limited,
    /// The store failed; this instance's share of the limit admitted it.
    FallbackAllowed,
    /// The store failed; this instance's share of the limit refused it.
    FallbackLimited,
    /// The store failed and `on_store_error = "allow"`.
    FailedOpen,
    /// The store failed and `on_store_error = "deny"`: 503.
    FailedClosed,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::FallbackAllowed,
        Outcome::FallbackLimited,
        Outcome::FailedOpen,
        Outcome::FailedClosed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::FallbackAllowed => "fallback_allowed",
            Outcome::FallbackLimited => "fallback_limited",
            Outcome::FailedOpen => "failed_open",
            Outcome::FailedClosed => "failed_closed",
        }
    }

    pub fn admitted(self) -> bool {
        matches!(
            self,
            Outcome::Allowed | Outcome::FallbackAllowed | Outcome::FailedOpen
        )
    }
}

/// Where a quota counts (`scope` of `cutover_ratelimit_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Local,
    Fleet,
}

impl Scope {
    pub const ALL: [Scope; 2] = [Scope::Local, Scope::Fleet];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Local => "local",
            Scope::Fleet => "fleet",
        }
    }
}

/// One decision: how it went, for a refusal the time until a token, and
/// for an admission by a count what is left of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub wait: std::time::Duration,
    pub left: Option<Left>,
}

/// What a key may still send (the `RateLimit` header's `r` and `t`):
/// requests now, and the time until its quota is whole again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub remaining: u32,
    pub reset: std::time::Duration,
}

impl Decision {
    /// Admitted without a count (the store failed open).
    pub fn allowed(outcome: Outcome) -> Self {
        Decision {
            outcome,
            wait: std::time::Duration::ZERO,
            left: None,
        }
    }

    /// Admitted by a count, `left` of it.
    pub fn counted(outcome: Outcome, left: Left) -> Self {
        Decision {
            outcome,
            wait: std::time::Duration::ZERO,
            left: Some(left),
        }
    }

    /// Refused for `wait`.
    pub fn refused(outcome: Outcome, wait: std::time::Duration) -> Self {
        Decision {
            outcome,
            wait,
            left: None,
        }
    }
}

/// The bytes of a quota's key, joined from its sources: each value is
/// preceded by its length, so that `("ab", "c")` and `("a", "bc")` are
/// two keys.
pub fn push_part(out: &mut Vec<u8>, part: &[u8]) {
    let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(part);
}

//! What a fleet keeps in etcd (DESIGN §15), as JSON values under the
//! prefix:
//!
//! - `meta`: the layout's format, written once by the first instance.
//! - `generations/<id>`: one shared document, immutable (put only if absent).
//! - `active`: the fleet's active generation, changed only in a
//!   transaction that compares its revision.
//! - `members/<name>`: every instance that ever joined (no lease), so that
//!   one whose status key expired shows as `gone`.
//! - `instances/<name>`: each live instance's status, under its lease.
//! - `proposals/<id>`: a change waiting for approval (DESIGN §23),
//!   changed only in a transaction that compares its revision;
//!   `proposal-next` numbers them.

use crate::ids::GenerationId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The layout this build reads and writes. An instance that finds another
/// format under its prefix refuses to join.
pub const FORMAT: u32 = 1;

/// Key names under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn meta(&self) -> String {
        format!("{}/meta", self.prefix)
    }

    pub fn active(&self) -> String {
        format!("{}/active", self.prefix)
    }

    /// Zero-padded, so that keys sort by id.
    pub fn generation(&self, id: GenerationId) -> String {
        format!("{}/generations/{id:020}", self.prefix)
    }

    pub fn generations(&self) -> String {
        format!("{}/generations/", self.prefix)
    }

    pub fn member(&self, name: &str) -> String {
        format!("{}/members/{name}", self.prefix)
    }

    pub fn members(&self) -> String {
        format!("{}/members/", self.prefix)
    }

    pub fn instance(&self, name: &str) -> String {
        format!("{}/instances/{name}", self.prefix)
    }

    pub fn instances(&self) -> String {
        format!("{}/instances/", self.prefix)
    }

    /// A proposal (`p-000007`: ids sort as keys).
    pub fn proposal(&self, id: &str) -> String {
        format!("{}/proposals/{id}", self.prefix)
    }

    pub fn proposals(&self) -> String {
        format!("{}/proposals/", self.prefix)
    }

    /// The last proposal number given.
    pub fn proposal_counter(&self) -> String {
        format!("{}/proposal-next", self.prefix)
    }

    /// An ACME certificate the fleet shares (DESIGN §21): its chain and
    /// key, readable by every instance.
    pub fn acme_certificate(&self, id: &str) -> String {
        format!("{}/acme/certificates/{id}", self.prefix)
    }

    /// Held, under its holder's lease, while one instance orders `id`.
    pub fn acme_lock(&self, id: &str) -> String {
        format!("{}/acme/locks/{id}", self.prefix)
    }

    pub fn acme_answer(&self, challenge: &str, name: &str) -> String {
        format!("{}/acme/answers/{challenge}/{name}", self.prefix)
    }

    pub fn acme_answers(&self) -> String {
        format!("{}/acme/answers/", self.prefix)
    }

    /// A fleet-wide shadow stage's document, under its writer's lease.
    pub fn shadow(&self, id: &str) -> String {
        format!("{}/shadows/{id}", self.prefix)
    }
}

/// `meta`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub format: u32,
    /// The cutover version that created the prefix, for the refusal message.
    pub created_by: String,
}

impl Meta {
    pub fn current() -> Self {
        Self {
            format: FORMAT,
            created_by: format!("cutover {}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// `generations/<id>`: a shared document, as activated.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerationDoc {
    pub generation: GenerationId,
    /// `sha256:<hex>` of `config`.
    pub config_version: String,
    /// The shared document's text: routes, upstreams, `log.level`.
    pub config: String,
    pub created_at: String,
    /// The instance whose admin API wrote it.
    pub created_on: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// The authenticated admin caller that wrote it (on `created_on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Set when the document is a rollback to an earlier generation's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<GenerationId>,
    /// The callers that approved it (DESIGN §23: a proposal carried out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_by: Vec<String>,
}

/// `active`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActiveRecord {
    pub generation: GenerationId,
    pub config_version: String,
    pub previous: Option<GenerationId>,
    pub activated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// The authenticated admin caller that made it active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// Set while the generation is on probation (DESIGN §14, fleet-wide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<FleetPending>,
    /// How the last pending generation ended (kept until the next one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settlement: Option<Settlement>,
    /// While a fleet-wide shadow stage runs against this generation
    /// (DESIGN §22): every instance shadows the document of `shadows/<id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowRef>,
}

/// A fleet-wide shadow stage, as `active` names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowRef {
    pub id: String,
    /// What the candidate would become: what `abort` names.
    pub candidate: GenerationId,
    pub percent: f64,
    pub max_inflight: u32,
    /// A WAF shadow stage: the candidate's firewall judges the requests.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waf: bool,
    /// Instances stop shadowing then, whatever happens to the writer.
    pub until_unix_ms: u64,
}

/// `shadows/<id>`: the shared document a shadow stage runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShadowDoc {
    pub id: String,
    pub config: String,
}

/// An instance's report of a fleet-wide shadow stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceShadow {
    pub id: String,
    pub report: crate::runtime::shadow::ShadowReport,
}

/// A fleet generation on probation: confirmed by an operator, by its
/// guard (over every instance's answers) or by its canary's last step;
/// or rolled back to `rollback_to`'s document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetPending {
    /// The last final generation: what a rollback brings back.
    pub rollback_to: GenerationId,
    pub started_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<crate::runtime::GuardRecord>,
    /// Each instance walks the steps on its own traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryPlan>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryPlan {
    pub steps: Vec<u8>,
    pub step_interval_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<String>,
}

/// How a pending generation ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settlement {
    pub generation: GenerationId,
    /// `confirmed`, `aborted` or `auto_rolled_back`.
    pub outcome: String,
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The authenticated admin caller that settled it (none: the gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One instance's answers for a pending generation with a guard, since
/// it applied it, and its previous generation's over the same time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PendingAnswers {
    pub generation: GenerationId,
    pub requests: u64,
    pub errors: u64,
    /// Bound of the 99th percentile, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    pub previous_requests: u64,
    pub previous_errors: u64,
    /// Refused by the web application firewall: this generation's, the
    /// previous one's in the window, and the previous one's before the
    /// guard started (with its requests then).
    #[serde(default)]
    pub blocked: u64,
    #[serde(default)]
    pub previous_blocked: u64,
    #[serde(default)]
    pub before_requests: u64,
    #[serde(default)]
    pub before_blocked: u64,
}

/// What an instance says about the last generation it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    /// It serves `generation`.
    Ack,
    /// It refused `target` and serves `generation`.
    Nack,
    /// It is planning `target`.
    Applying,
}

/// A listener as an instance has it bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoundListener {
    pub name: String,
    pub address: String,
    pub state: String,
}

/// `instances/<name>`, under the instance's lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub instance: String,
    pub report: Report,
    /// The fleet generation it serves (`None`: its own file's, before it
    /// applied any).
    pub generation: Option<GenerationId>,
    pub config_version: Option<String>,
    /// The generation it is applying or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<GenerationId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The refused plan's findings, each `code at path: message`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diagnostics: Vec<String>,
    /// The instance's own generation id for what it serves.
    pub local_generation: GenerationId,
    pub listeners: Vec<BoundListener>,
    pub updated_at: String,
    pub version: String,
    /// While a guarded generation is pending: this instance's answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<PendingAnswers>,
    /// While a fleet-wide shadow stage runs: this instance's report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<InstanceShadow>,
}

/// `sha256:<hex>` of a shared document.
pub fn config_version(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_keys_sort_by_id() {
        let keys = Keys::new("/cutover/prod");
        assert!(keys.generation(GenerationId(9)) < keys.generation(GenerationId(10)));
        assert_eq!(
            keys.generation(GenerationId(7)),
            "/cutover/prod/generations/00000000000000000007"
        );
        assert!(keys
            .generation(GenerationId(7))
            .starts_with(&keys.generations()));
    }

    #[test]
    fn the_version_is_the_text_hash() {
        assert_eq!(
            config_version(""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}

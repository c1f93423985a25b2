//! Planning: validation, the typed diff, and restart-required rejection.
//!
//! Takes candidate configuration text and (when there is one) the active
//! generation's validated [`Spec`]; returns a [`Plan`]: every error, every
//! change with its disposition, the changes that would need a restart, and
//! whether the candidate can be activated live. Pure: no bind, no write.

mod diff;
mod ownership;
mod pattern;
mod spec;
mod validate;

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

pub use diff::{diff, Change, ChangeKind, Diff, Disposition, FieldChange, Summary};
pub use ownership::{needs_restart, ownership, Ownership};
pub use pattern::PathRegex;
pub use spec::*;
pub use validate::validate;

use crate::config::{ConfigText, Diagnostic};
use crate::ids::GenerationId;

/// A change planning refused because the running process cannot honour it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejection {
    pub domain: &'static str,
    pub path: String,
    pub from: Value,
    pub to: Value,
    pub reason: &'static str,
    pub action: &'static str,
}

/// What activating a candidate would do, and whether it may.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub activatable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_version: Option<String>,
    pub active_generation: Option<GenerationId>,
    pub errors: Vec<Diagnostic>,
    pub rejected: Vec<Rejection>,
    pub diff: Diff,
    /// The validated candidate, when it validated.
    #[serde(skip)]
    pub spec: Option<Arc<Spec>>,
}

impl Plan {
    /// Whether the candidate equals the active configuration (same
    /// `config_version`, files included): activating it changes nothing.
    pub fn is_unchanged(&self, active: Option<&Spec>) -> bool {
        match (active, &self.config_version) {
            (Some(active), Some(version)) => &active.config_version == version,
            _ => false,
        }
    }
}

const RESTART_ACTION: &str = "apply with a drain-aware restart (POST /admin/lifecycle/upgrade)";

/// Plans `candidate` against the active generation (`None` at start-up).
pub fn plan(candidate: &ConfigText, active: Option<(GenerationId, &Spec)>) -> Plan {
    let spec = match validate(candidate) {
        Ok(spec) => spec,
        Err(errors) => {
            return Plan {
                activatable: false,
                config_version: None,
                active_generation: active.map(|(id, _)| id),
                errors,
                rejected: Vec::new(),
                diff: Diff::default(),
                spec: None,
            }
        }
    };
    let diff = match active {
        Some((id, active)) => diff::diff(
            &active.file,
            &active.canonical,
            &format!("generation {id}"),
            &spec.file,
            &spec.canonical,
        ),
        None => Diff::default(),
    };
    let rejected: Vec<Rejection> = diff
        .changes
        .iter()
        .filter(|c| c.disposition == Disposition::RestartRequired)
        .flat_map(|c| {
            let restart_fields: Vec<&FieldChange> = match c.change {
                ChangeKind::Modified => c
                    .fields
                    .iter()
                    .filter(|f| needs_restart(&f.path, &f.from, &f.to))
                    .collect(),
                _ => c.fields.iter().collect(),
            };
            restart_fields.into_iter().map(move |f| Rejection {
                domain: c.domain,
                path: f.path.clone(),
                from: f.from.clone(),
                to: f.to.clone(),
                reason: "restart_required",
                action: RESTART_ACTION,
            })
        })
        .collect();
    Plan {
        activatable: rejected.is_empty(),
        config_version: Some(spec.config_version.clone()),
        active_generation: active.map(|(id, _)| id),
        errors: Vec::new(),
        rejected,
        diff,
        spec: Some(Arc::new(spec)),
    }
}

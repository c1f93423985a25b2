//! What `GET /admin/runtime/backends` shows (DESIGN §12): every upstream
//! of the active generation and the live state of each of its backends;
//! the console's timeline reads it too.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::ids::GenerationId;

/// `GET /admin/runtime/backends`: every upstream of the active generation
/// and the live state of each of its backends (DESIGN §12).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackendsView {
    pub active_generation: GenerationId,
    pub upstreams: Vec<UpstreamView>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpstreamView {
    pub name: String,
    pub policy: Cow<'static, str>,
    pub backends: Vec<crate::backends::BackendView>,
    /// Its discovery sources: what each gives, when it last resolved,
    /// when it resolves next, and its last error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<crate::discovery::SourceView>,
}

/// Each member's view, with where it came from, its weight and priority.
pub fn member_views(
    members: &crate::generation::Members,
    live: &[u64],
) -> Vec<crate::backends::BackendView> {
    members
        .backends
        .iter()
        .zip(&members.origins)
        .zip(members.weights().zip(members.priorities()))
        .map(|((backend, origin), (weight, priority))| {
            let mut view = backend.view(live);
            view.source = origin.as_deref().map(str::to_owned);
            view.weight = (weight != 1).then_some(weight);
            view.priority = (priority != 0).then_some(priority);
            view
        })
        .collect()
}

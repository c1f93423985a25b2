//! What `GET /admin/runtime/backends` shows (DESIGN §12): every upstream
//! of the active generation and the live state of each of its backends;
//! the console's timeline reads it too.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::ids::GenerationId;
use crate::runtime::GenerationStore;

/// `GET /admin/runtime/backends`: every upstream of the active generation
/// and the live state of each of its backends (DESIGN §12).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackendsView {
    pub active_generation: GenerationId,
    pub upstreams: Vec<UpstreamView>,
}

impl BackendsView {
    /// What `store`'s active generation routes to now.
    pub fn of(store: &GenerationStore) -> Self {
        let active = store.load_full();
        let live: Vec<u64> = store.loads().iter().map(|l| l.generation.0).collect();
        let mut upstreams: Vec<UpstreamView> = active
            .upstreams()
            .map(|u| UpstreamView {
                name: u.name.clone(),
                policy: u.policy.as_str().into(),
                backends: member_views(&u.members(), &live),
                sources: u
                    .membership()
                    .map(|m| m.sources.iter().map(|s| s.view()).collect())
                    .unwrap_or_default(),
            })
            .collect();
        upstreams.sort_by(|a, b| a.name.cmp(&b.name));
        BackendsView {
            active_generation: active.id,
            upstreams,
        }
    }
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

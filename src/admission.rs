//! Admission: pin the active generation for one request.
//!
//! `Admission::pin` loads the active generation once (`load_full`) and
//! takes an in-flight guard on its ledger. The request then runs entirely
//! on that `Arc<Generation>`: its route, its upstream, its retries. A
//! response body that outlives the handler keeps only the guard.

use std::sync::Arc;

use crate::generation::{Generation, InflightGuard};
use crate::runtime::GenerationStore;

/// One request's hold on its generation.
pub struct Pinned {
    pub generation: Arc<Generation>,
    pub guard: InflightGuard,
}

/// Pins requests to the active generation.
#[derive(Clone)]
pub struct Admission {
    store: Arc<GenerationStore>,
}

impl Admission {
    pub fn new(store: Arc<GenerationStore>) -> Self {
        Self { store }
    }

    /// Pins the active generation and counts the request on it.
    pub fn pin(&self) -> Pinned {
        let generation = self.store.load_full();
        let guard = generation.ledger.request();
        Pinned { generation, guard }
    }

    pub fn store(&self) -> &Arc<GenerationStore> {
        &self.store
    }
}

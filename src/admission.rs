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

    /// Pins a request arriving on `listener`: the active generation, or
    /// during a canary the previous one for the share of requests the
    /// canary does not take. `sticky` hashes the canary's key for this
    /// request (`None`: the request lacks it, and is placed at random).
    pub fn pin_request(
        &self,
        listener: &str,
        sticky: impl FnOnce(&crate::plan::HashKey) -> Option<u64>,
    ) -> Pinned {
        // One load: the generation and its canary as they were published
        // together, never the one of a commit with the other of before.
        let active = self.store.admitting();
        let generation = match &active.canary {
            None => Arc::clone(&active.generation),
            Some(canary) => {
                let bucket = canary
                    .key
                    .as_ref()
                    .and_then(sticky)
                    .map_or_else(|| fastrand::u8(0..100), |hash| (hash % 100) as u8);
                // A listener the previous generation does not serve stays
                // with the new one.
                if bucket >= canary.percent && canary.previous.router(listener).is_some() {
                    Arc::clone(&canary.previous)
                } else {
                    Arc::clone(&active.generation)
                }
            }
        };
        drop(active);
        let guard = generation.ledger.request();
        Pinned { generation, guard }
    }

    pub fn store(&self) -> &Arc<GenerationStore> {
        &self.store
    }
}

/// Lets go of a generation held on a thread that serves requests (a
/// request's pin, a new connection's look at its limits or backend).
/// Whoever holds a superseded generation last frees it, which for a large
/// configuration takes milliseconds (`docs/performance.md`): when
/// that is this holder, the freeing goes to the blocking pool instead of
/// stalling the thread. Every such holder lets go through here.
pub fn release<T: Send + Sync + 'static>(pinned: Arc<T>) {
    if Arc::strong_count(&pinned) == 1 {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || drop(pinned));
            return;
        }
    }
    drop(pinned);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::thread::ThreadId;

    /// Records the thread that frees it.
    struct Freed(Arc<Mutex<Option<ThreadId>>>);

    impl Drop for Freed {
        fn drop(&mut self) {
            if let Ok(mut at) = self.0.lock() {
                *at = Some(std::thread::current().id());
            }
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_last_holder_frees_off_the_serving_thread() {
        let here = std::thread::current().id();
        let at = Arc::new(Mutex::new(None));
        let last = Arc::new(Freed(Arc::clone(&at)));
        let other = Arc::clone(&last);
        release(other);
        assert_eq!(
            *at.lock().unwrap(),
            None,
            "not the last holder: nothing freed"
        );
        release(last);
        for _ in 0..200 {
            if at.lock().unwrap().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let freed_on = (*at.lock().unwrap()).expect("freed");
        assert_ne!(freed_on, here);
    }
}

//! The GenerationStore: the one `ArcSwap<Generation>` and its one writer.
//!
//! Readers pin the active generation with `load_full`; `commit` is the only
//! way to change it and is a compare-and-swap on the generation the caller
//! planned against, so two activations from the same expected generation
//! can never both succeed. The store also keeps weak references to every
//! generation it ever published, to report the ones that still have work.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::generation::{Generation, Ledger};
use crate::ids::GenerationId;

/// The active generation was not the one the caller planned against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("expected generation {expected} but generation {active} is active")]
pub struct Conflict {
    pub expected: GenerationId,
    pub active: GenerationId,
}

impl crate::tls::ActiveMaterial for GenerationStore {
    fn active_material(
        &self,
        listener: &str,
    ) -> (GenerationId, Option<Arc<crate::tls::ListenerMaterial>>) {
        let active = &self.active.load().generation;
        let material = active
            .spec
            .listeners
            .iter()
            .find(|l| l.name == listener)
            .and_then(|l| l.tls_material.clone());
        (active.id, material)
    }
}

/// Work still pinned to one generation.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GenerationLoad {
    pub generation: GenerationId,
    pub inflight_requests: u64,
    pub open_connections: u64,
    /// Requests answered on it so far, and how many of them 5xx.
    pub requests: u64,
    pub errors: u64,
    /// Seconds since a newer generation replaced it; `None` while active.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_secs: Option<f64>,
}

impl GenerationLoad {
    /// What the pinned-work gauges read of it (telemetry knows no store).
    pub fn pinned(&self) -> crate::telemetry::PinnedLoad {
        crate::telemetry::PinnedLoad {
            inflight_requests: self.inflight_requests,
            open_connections: self.open_connections,
            superseded_secs: self.superseded_secs,
        }
    }
}

/// A generation the store made active once.
struct Published {
    id: GenerationId,
    ledger: Weak<Ledger>,
    superseded_at: Option<Instant>,
}

/// Holds the active generation.
pub struct GenerationStore {
    /// The active generation and its canary, published together: a
    /// request is admitted by one of these values, never by the
    /// generation of one and the canary of another (DESIGN §14).
    active: ArcSwap<Active>,
    /// While an activation shadows its candidate (DESIGN §22).
    shadow: arc_swap::ArcSwapOption<super::shadow::Shadow>,
    published: Mutex<Vec<Published>>,
    /// The active id, for long-lived connections that watch for supersession.
    notify: watch::Sender<GenerationId>,
}

/// What admission reads in one load: the active generation and, while it
/// is canaried, the generation that keeps the rest of new requests.
#[derive(Debug)]
pub struct Active {
    pub generation: Arc<Generation>,
    pub canary: Option<Canary>,
}

/// A canary: the active generation takes `percent` of new requests, the
/// previous one the rest.
#[derive(Debug, Clone)]
pub struct Canary {
    pub previous: Arc<Generation>,
    pub percent: u8,
    /// Sticky by this key (the same value, the same generation); per
    /// request without it.
    pub key: Option<crate::plan::HashKey>,
}

impl GenerationStore {
    pub fn new(first: Generation) -> Self {
        first.take_effect();
        let first = Arc::new(first);
        let published = vec![Published {
            id: first.id,
            ledger: Arc::downgrade(&first.ledger),
            superseded_at: None,
        }];
        Self {
            notify: watch::channel(first.id).0,
            active: ArcSwap::from_pointee(Active {
                generation: first,
                canary: None,
            }),
            shadow: arc_swap::ArcSwapOption::empty(),
            published: Mutex::new(published),
        }
    }

    /// Pins the active generation: the caller holds it as long as it needs.
    pub fn load_full(&self) -> Arc<Generation> {
        Arc::clone(&self.active.load().generation)
    }

    /// The active generation and its canary as one value, for admission:
    /// held only while a request chooses between them.
    pub fn admitting(&self) -> arc_swap::Guard<Arc<Active>> {
        self.active.load()
    }

    /// The canary, while one runs.
    pub fn canary(&self) -> Option<Canary> {
        self.active.load().canary.clone()
    }

    /// Starts a canary of generation `generation` (a resumed one, after a
    /// restart); `false` when it is not the active generation.
    pub fn start_canary(&self, generation: GenerationId, canary: Canary) -> bool {
        self.republish(generation, |_| Some(Some(canary.clone())))
    }

    /// Moves the canary of `generation` to `percent`; `false` when it is
    /// not the active generation or no canary runs.
    pub fn step_canary(&self, generation: GenerationId, percent: u8) -> bool {
        self.republish(generation, |canary| {
            canary.map(|c| {
                Some(Canary {
                    percent,
                    ..c.clone()
                })
            })
        })
    }

    /// Ends the canary of `generation`: all new requests go to it; `false`
    /// when it is not the active generation.
    pub fn end_canary(&self, generation: GenerationId) -> bool {
        self.republish(generation, |_| Some(None))
    }

    /// Publishes the active generation again with the canary `change`
    /// makes of its current one (`None`: leave it), as long as
    /// `generation` is the active one: a compare-and-swap, so that a
    /// commit in between is never undone.
    fn republish(
        &self,
        generation: GenerationId,
        change: impl Fn(Option<&Canary>) -> Option<Option<Canary>>,
    ) -> bool {
        loop {
            let current = self.active.load_full();
            if current.generation.id != generation {
                return false;
            }
            let Some(canary) = change(current.canary.as_ref()) else {
                return false;
            };
            let next = Arc::new(Active {
                generation: Arc::clone(&current.generation),
                canary,
            });
            let previous = self.active.compare_and_swap(&current, next);
            if Arc::ptr_eq(&previous, &current) {
                return true;
            }
        }
    }

    /// The shadow stage, while one runs: `None` costs the request path
    /// one atomic load.
    pub fn shadow(&self) -> Option<Arc<super::shadow::Shadow>> {
        if self.shadow.load().is_none() {
            return None;
        }
        self.shadow.load_full()
    }

    /// Starts or (with `None`) ends a shadow stage.
    pub fn set_shadow(&self, shadow: Option<Arc<super::shadow::Shadow>>) {
        self.shadow.store(shadow);
    }

    /// The active generation's id, without pinning it.
    pub fn active_id(&self) -> GenerationId {
        self.active.load().generation.id
    }

    /// Makes `next` active if `expected` still is, with `canary` (or
    /// none) in the same swap: whatever canary ran ends in it. Cannot
    /// fail otherwise: everything fallible happened while building `next`.
    pub fn commit(
        &self,
        expected: GenerationId,
        next: Generation,
        canary: Option<Canary>,
    ) -> Result<Arc<Generation>, Conflict> {
        debug_assert!(
            canary.as_ref().is_none_or(|c| c.previous.id < next.id),
            "INVARIANT: a canary's other side is an older generation"
        );
        let next = Arc::new(next);
        let ledger = Arc::downgrade(&next.ledger);
        let id = next.id;
        // A canary's step (its timer's compare-and-swap) publishes the
        // same generation with another share: the commit is about the
        // generation, so it tries again on the state that step left (and
        // ends that canary or replaces it, as it would have). Only another
        // generation is a conflict.
        loop {
            let current = self.active.load_full();
            if current.generation.id != expected {
                return Err(Conflict {
                    expected,
                    active: current.generation.id,
                });
            }
            debug_assert!(
                next.id > current.generation.id,
                "INVARIANT: generation ids strictly increase"
            );
            let published = Arc::new(Active {
                generation: Arc::clone(&next),
                canary: canary.clone(),
            });
            let previous = self.active.compare_and_swap(&current, published);
            if Arc::ptr_eq(&previous, &current) {
                break;
            }
        }
        // Published: what it sizes in process-shared state is its size now.
        next.take_effect();
        let now = Instant::now();
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        published.retain(|p| p.ledger.strong_count() > 0);
        for p in published.iter_mut().filter(|p| p.superseded_at.is_none()) {
            p.superseded_at = Some(now);
        }
        published.push(Published {
            id,
            ledger,
            superseded_at: None,
        });
        drop(published);
        self.notify.send_replace(id);
        Ok(next)
    }

    /// Publishes `previous`, built again after a restart under the id it
    /// had, beside the active generation (a resumed canary's other side):
    /// superseded, and listed while anything uses it.
    pub fn publish_previous(&self, previous: Generation) -> Arc<Generation> {
        let previous = Arc::new(previous);
        debug_assert!(
            previous.id < self.active_id(),
            "INVARIANT: only an older generation is published beside the active one"
        );
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                0,
                Published {
                    id: previous.id,
                    ledger: Arc::downgrade(&previous.ledger),
                    superseded_at: Some(Instant::now()),
                },
            );
        previous
    }

    /// When generation `id` stopped being the active one: `None` while it
    /// is active, or once nothing of it is left.
    pub fn superseded_at(&self, id: GenerationId) -> Option<Instant> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| p.superseded_at)
    }

    /// Follows the active generation id.
    pub fn subscribe(&self) -> watch::Receiver<GenerationId> {
        self.notify.subscribe()
    }

    /// The ledgers of every live generation, oldest first.
    pub fn ledgers(&self) -> Vec<Arc<Ledger>> {
        let published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        published
            .iter()
            .filter_map(|p| p.ledger.upgrade())
            .collect()
    }

    /// The live generations that name a role in the metrics: while a
    /// generation is pending (guarded activation; `pending` names it and
    /// the generation it would roll back to) it is `pending` and that one
    /// is `previous`; otherwise the active generation is `active` and the
    /// newest older one still alive is `previous`.
    pub fn roles(
        &self,
        pending: Option<(GenerationId, GenerationId)>,
    ) -> Vec<(&'static str, Arc<Ledger>)> {
        let active = self.active_id();
        let ledgers = self.ledgers();
        let find = |id| ledgers.iter().find(|l| l.generation() == id).cloned();
        let roles = match pending.filter(|(generation, _)| *generation == active) {
            Some((generation, rollback_to)) => [
                ("pending", find(generation)),
                ("previous", find(rollback_to)),
            ],
            None => [
                ("active", find(active)),
                (
                    "previous",
                    ledgers
                        .iter()
                        .filter(|l| l.generation() < active)
                        .max_by_key(|l| l.generation())
                        .cloned(),
                ),
            ],
        };
        roles
            .into_iter()
            .filter_map(|(role, ledger)| Some((role, ledger?)))
            .collect()
    }

    /// The ledger of generation `id`, while it is alive.
    pub fn ledger(&self, id: GenerationId) -> Option<Arc<Ledger>> {
        let published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        published
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| p.ledger.upgrade())
    }

    /// In-flight work per live generation, oldest first. A superseded
    /// generation is listed while anything is still pinned to it.
    pub fn loads(&self) -> Vec<GenerationLoad> {
        let active = self.active_id();
        // A canary's previous generation takes new requests too: listed
        // even in a moment when none is in flight.
        let canary = self.active.load().canary.as_ref().map(|c| c.previous.id);
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        published.retain(|p| p.ledger.strong_count() > 0);
        published
            .iter()
            .filter_map(|p| p.ledger.upgrade().map(|ledger| (p, ledger)))
            .filter(|(p, ledger)| {
                p.id == active
                    || Some(p.id) == canary
                    || ledger.inflight_requests() > 0
                    || ledger.open_connections() > 0
            })
            .map(|(p, ledger)| GenerationLoad {
                generation: p.id,
                inflight_requests: ledger.inflight_requests(),
                open_connections: ledger.open_connections(),
                requests: ledger.requests.get(),
                errors: ledger.errors.get(),
                superseded_secs: p.superseded_at.map(|at| at.elapsed().as_secs_f64()),
            })
            .collect()
    }
}

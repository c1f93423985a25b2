//! A compiled route: its spec, its action, and the state it keeps across
//! generations (admission counter, metric handles).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderMap, Method};
use metrics::{Counter, Histogram};

use super::upstream::Upstream;
use crate::plan::{DirectResponse, RouteSpec};
use crate::telemetry::metrics as m;

/// What a route does with a matched request.
#[derive(Debug)]
pub enum Action {
    Proxy(Arc<Upstream>),
    Respond(DirectResponse),
}

/// Route state that outlives generations: the admission counter behind
/// `max_inflight` (so a limit holds across an activation) and the route's
/// metric handles. Those are registered on first use, then kept: nothing
/// is looked up per request, and a configuration with 10 000 routes of
/// which a hundred see traffic exports (and holds) series for a hundred,
/// not 70 000 (7 per route; 25 MiB of registry at 10 000 routes).
#[derive(Debug)]
pub struct RouteShared {
    name: Arc<str>,
    inflight: AtomicU64,
    responses: [OnceLock<Counter>; 5],
    duration: OnceLock<Histogram>,
    rejections: OnceLock<Counter>,
    limited: OnceLock<Counter>,
}

impl RouteShared {
    pub fn new(route: &str) -> Self {
        Self {
            name: Arc::from(route),
            inflight: AtomicU64::new(0),
            responses: Default::default(),
            duration: OnceLock::new(),
            rejections: OnceLock::new(),
            limited: OnceLock::new(),
        }
    }

    /// The route's name, shared with access-log lines.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Counts a response by status class and records its duration.
    pub fn record(&self, status: u16, duration: Duration) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        if let (Some(counter), Some(label)) = (self.responses.get(class), m::CLASSES.get(class)) {
            counter
                .get_or_init(|| {
                    metrics::counter!(m::REQUESTS, m::LABEL_ROUTE => self.name.to_string(), m::LABEL_CLASS => *label)
                })
                .increment(1);
        }
        self.duration
            .get_or_init(
                || metrics::histogram!(m::REQUEST_DURATION, m::LABEL_ROUTE => self.name.to_string()),
            )
            .record(duration.as_secs_f64());
    }

    /// Counts a request its quota turned away.
    pub fn rate_limited(&self) {
        self.limited
            .get_or_init(
                || metrics::counter!(m::QUOTA_REJECTIONS, m::LABEL_ROUTE => self.name.to_string()),
            )
            .increment(1);
    }

    fn reject(&self) {
        self.rejections
            .get_or_init(
                || metrics::counter!(m::ADMISSION_REJECTIONS, m::LABEL_ROUTE => self.name.to_string()),
            )
            .increment(1);
    }
}

/// A route in one generation: its validated definition (shared with the
/// spec, not copied), what it does, and its cross-generation state.
#[derive(Debug)]
pub struct Route {
    pub spec: Arc<RouteSpec>,
    pub action: Action,
    pub shared: Arc<RouteShared>,
    pub quota: Option<Arc<super::QuotaTable>>,
}

impl Route {
    /// Whether the request's path, method and headers match (the host was
    /// matched by the router).
    pub fn matches(&self, path: &str, method: &Method, headers: &HeaderMap) -> bool {
        self.spec.path.matches(path) && self.matches_request(method, headers)
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Upstream response deadline.
    pub fn timeout(&self) -> Duration {
        self.spec.timeout
    }

    /// Whether the method and header matchers accept the request.
    pub fn matches_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        let spec = &self.spec;
        (spec.methods.is_empty() || spec.methods.contains(method))
            && spec
                .headers
                .iter()
                .all(|(name, value)| headers.get(name) == Some(value))
    }

    /// Takes an admission slot: `Ok(None)` when the route has no limit
    /// (nothing to count), `Err(Saturated)` when `max_inflight` is reached.
    pub fn admit(&self) -> Result<Option<RouteSlot>, Saturated> {
        let Some(max) = self.spec.max_inflight else {
            return Ok(None);
        };
        if !take_place(&self.shared.inflight, max) {
            self.shared.reject();
            return Err(Saturated);
        }
        Ok(Some(RouteSlot {
            shared: Arc::clone(&self.shared),
        }))
    }
}

/// Counts one more in `inflight` if that stays within `max`.
fn take_place(inflight: &AtomicU64, max: u64) -> bool {
    if inflight.fetch_add(1, Ordering::AcqRel) >= max {
        inflight.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    true
}

/// The route's `max_inflight` is reached.
#[derive(Debug, Clone, Copy)]
pub struct Saturated;

/// One admitted request on a route; frees its slot on drop.
#[derive(Debug)]
pub struct RouteSlot {
    shared: Arc<RouteShared>,
}

impl Drop for RouteSlot {
    fn drop(&mut self) {
        self.shared.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Listener state that outlives generations: the counter behind the
/// listener's `max_inflight`, over every route and generation.
#[derive(Debug)]
pub struct ListenerShared {
    name: String,
    inflight: AtomicU64,
    rejections: OnceLock<Counter>,
}

impl ListenerShared {
    pub fn new(listener: &str) -> Self {
        Self {
            name: listener.to_owned(),
            inflight: AtomicU64::new(0),
            rejections: OnceLock::new(),
        }
    }

    /// Takes a place under `max` (`Ok(None)`: no limit to count).
    pub fn admit(self: &Arc<Self>, max: Option<u64>) -> Result<Option<ListenerSlot>, Saturated> {
        let Some(max) = max else {
            return Ok(None);
        };
        if !take_place(&self.inflight, max) {
            self.rejections
                .get_or_init(|| {
                    metrics::counter!(m::LISTENER_ADMISSION_REJECTIONS, m::LABEL_LISTENER => self.name.clone())
                })
                .increment(1);
            return Err(Saturated);
        }
        Ok(Some(ListenerSlot {
            shared: Arc::clone(self),
        }))
    }
}

/// One admitted request on a listener; frees its place on drop.
#[derive(Debug)]
pub struct ListenerSlot {
    shared: Arc<ListenerShared>,
}

impl Drop for ListenerSlot {
    fn drop(&mut self) {
        self.shared.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

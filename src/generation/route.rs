//! A compiled route: matchers, action, and its pre-registered counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use metrics::{Counter, Histogram};

use super::upstream::Upstream;
use crate::plan::{DirectResponse, HostMatch, PathMatch};
use crate::telemetry::metrics as m;

/// What a route does with a matched request.
#[derive(Debug)]
pub enum Action {
    Proxy(Arc<Upstream>),
    Respond(DirectResponse),
}

/// Route state that outlives generations: the admission counter behind
/// `max_inflight` (so a limit holds across an activation) and metric
/// handles registered once, not looked up per request.
#[derive(Debug)]
pub struct RouteShared {
    inflight: AtomicU64,
    responses: [Counter; 5],
    pub duration: Histogram,
    pub rejections: Counter,
}

impl RouteShared {
    pub fn new(route: &str) -> Self {
        let route = route.to_owned();
        Self {
            inflight: AtomicU64::new(0),
            responses: m::CLASSES.map(|class| {
                metrics::counter!(m::REQUESTS, m::LABEL_ROUTE => route.clone(), m::LABEL_CLASS => class)
            }),
            duration: metrics::histogram!(m::REQUEST_DURATION, m::LABEL_ROUTE => route.clone()),
            rejections: metrics::counter!(m::ADMISSION_REJECTIONS, m::LABEL_ROUTE => route),
        }
    }

    /// Counts a response by status class.
    pub fn record(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        if let Some(counter) = self.responses.get(class) {
            counter.increment(1);
        }
    }
}

/// A route in one generation.
#[derive(Debug)]
pub struct Route {
    pub name: String,
    pub hosts: Vec<HostMatch>,
    pub path: PathMatch,
    pub methods: Vec<Method>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub action: Action,
    pub timeout: Duration,
    pub max_inflight: Option<u64>,
    pub shared: Arc<RouteShared>,
}

impl Route {
    /// Whether the request's path, method and headers match (the host was
    /// matched by the router).
    pub fn matches(&self, path: &str, method: &Method, headers: &HeaderMap) -> bool {
        self.path.matches(path) && self.matches_request(method, headers)
    }

    /// Whether the method and header matchers accept the request.
    pub fn matches_request(&self, method: &Method, headers: &HeaderMap) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && self
                .headers
                .iter()
                .all(|(name, value)| headers.get(name) == Some(value))
    }

    /// Takes an admission slot: `Ok(None)` when the route has no limit
    /// (nothing to count), `Err(Saturated)` when `max_inflight` is reached.
    pub fn admit(&self) -> Result<Option<RouteSlot>, Saturated> {
        let Some(max) = self.max_inflight else {
            return Ok(None);
        };
        let previous = self.shared.inflight.fetch_add(1, Ordering::AcqRel);
        if previous >= max {
            self.shared.inflight.fetch_sub(1, Ordering::AcqRel);
            self.shared.rejections.increment(1);
            return Err(Saturated);
        }
        Ok(Some(RouteSlot {
            shared: Arc::clone(&self.shared),
        }))
    }
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

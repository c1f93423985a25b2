//! A compiled route: its spec, its action, and the state it keeps across
//! generations (admission counter, metric handles).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderMap, Method};
use metrics::Counter;

use super::upstream::Upstream;
use crate::auth::{Method as AuthMethod, Outcome};
use crate::cache::Outcome as CacheOutcome;
use crate::grpc::Code;
use crate::limits::{Outcome as LimitOutcome, Scope as LimitScope};
use crate::plan::{DirectResponse, RouteSpec};
use crate::telemetry::metrics as m;
use crate::telemetry::series::{self, Count, Exported, Histogram, Sample};

/// What a route does with a matched request.
#[derive(Debug)]
pub enum Action {
    Proxy(Arc<Upstream>),
    Respond(DirectResponse),
    Redirect(crate::plan::Redirect),
}

impl Action {
    /// Whether a route built from the same spec with `other` would act
    /// alike: the same upstream (the same allocation) for a proxy; a
    /// response or redirect comes from the spec alone.
    pub fn same_as(&self, other: &Action) -> bool {
        match (self, other) {
            (Action::Proxy(a), Action::Proxy(b)) => Arc::ptr_eq(a, b),
            (Action::Respond(_), Action::Respond(_))
            | (Action::Redirect(_), Action::Redirect(_)) => true,
            _ => false,
        }
    }
}

/// Route state that outlives generations: the admission counter behind
/// `max_inflight` (so a limit holds across an activation) and the route's
/// metric series (see `telemetry::series`), which go when no live
/// generation names the route. A route exports its series from its first
/// request on: a configuration with 10 000 routes of which a hundred see
/// traffic exports a hundred routes' series, not 300 000 zeros.
#[derive(Debug)]
pub struct RouteShared {
    name: Arc<str>,
    inflight: AtomicU64,
    responses: [Count; 5],
    duration: Histogram,
    rejections: Count,
    limited: Count,
    /// Requests its filters refused, by [`Refusal`].
    refusals: [Count; Refusal::ALL.len()],
    /// Templated header values dropped as invalid.
    dropped: Count,
    /// Whether the series budget took this route's series (decided at
    /// its first request).
    exported: OnceLock<bool>,
    /// gRPC calls by status code; their series are admitted apart, at the
    /// route's first call, so that routes without gRPC reserve none.
    grpc: [Count; Code::ALL.len()],
    grpc_exported: OnceLock<bool>,
    /// Authentication checks by method and outcome; admitted apart, at
    /// the route's first check.
    auth: [[Count; Outcome::ALL.len()]; AuthMethod::ALL.len()],
    /// Forward auth's cache lookups, by `CacheLookup` (exported with
    /// `auth`).
    auth_cache: [Count; CacheLookup::ALL.len()],
    auth_exported: OnceLock<bool>,
    /// What its cache did, by `cache::Outcome`; admitted apart, at the
    /// route's first cached request.
    cache: [Count; CacheOutcome::ALL.len()],
    cache_exported: OnceLock<bool>,
    /// Its quota's decisions, by scope and outcome; admitted apart, at
    /// the route's first decision.
    limits: [[Count; LimitOutcome::ALL.len()]; LimitScope::ALL.len()],
    limits_exported: OnceLock<bool>,
    /// Its web application firewall's decisions, by `WAF_OUTCOMES`;
    /// admitted apart, at the route's first decision.
    waf: [Count; WAF_OUTCOMES.len()],
    waf_exported: OnceLock<bool>,
    /// Copies of its requests in flight to its `mirror` (every
    /// generation's), bounded by the mirror's `max_inflight`.
    pub mirror_inflight: Arc<AtomicU64>,
    /// `cutover_shadow_requests_total{route,kind,outcome}`, by kind and
    /// outcome index; admitted apart, at the route's first copy.
    copies: [[Count; COPY_OUTCOMES.len()]; 2],
    copies_exported: OnceLock<bool>,
}

/// What made a copy of a route's request (the `kind` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// The route's `mirror` (DESIGN §17).
    Mirror = 0,
    /// An activation's shadow stage (DESIGN §22): the copy went through
    /// the candidate generation's route of this name.
    Shadow = 1,
}

impl CopyKind {
    fn name(self) -> &'static str {
        match self {
            CopyKind::Mirror => "mirror",
            CopyKind::Shadow => "shadow",
        }
    }
}

/// The `outcome` label of a copy, by index: its upstream answered, it
/// failed (no backend, refused, reset), timed out, was dropped (too many
/// in flight) or skipped (a body too long, or never finished).
pub const COPY_OUTCOMES: [&str; 5] = ["answered", "failed", "timeout", "dropped", "skipped"];

/// The `outcome` label of `cutover_waf_decisions_total`, by index.
pub const WAF_OUTCOMES: [&str; 6] = [
    "pass",
    "blocked",
    "would_block",
    "body_too_large",
    "answer_blocked",
    "answer_would_block",
];

/// Why a route's filters refused a request (`reason` of
/// `cutover_filter_refusals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `allow_from` / `deny_from`.
    Forbidden,
    /// `max_request_body`.
    BodyTooLarge,
    /// A `rewrite` whose result the listener would not forward.
    Rewrite,
}

impl Refusal {
    const ALL: [Refusal; 3] = [Refusal::Forbidden, Refusal::BodyTooLarge, Refusal::Rewrite];

    fn name(self) -> &'static str {
        match self {
            Refusal::Forbidden => "forbidden",
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::Rewrite => "rewrite",
        }
    }
}

/// Series of one route: 5 classes, the histogram (its buckets, `+Inf`,
/// sum and count), two rejection counters, the filters' refusals and
/// dropped values.
const ROUTE_SERIES: usize = 5 + m::REQUEST_DURATION_BUCKETS.len() + 3 + 2 + Refusal::ALL.len() + 1;
/// Series of one route's gRPC calls: one per status code.
const GRPC_SERIES: usize = Code::ALL.len();
/// Series of one route's authentication checks and cache lookups.
const AUTH_SERIES: usize = Outcome::ALL.len() * AuthMethod::ALL.len() + CacheLookup::ALL.len();
/// Series of `cutover_cache_requests_total` per route.
const CACHE_SERIES: usize = CacheOutcome::ALL.len();
/// Series of `cutover_ratelimit_decisions_total` per route.
const LIMIT_SERIES: usize = LimitOutcome::ALL.len() * LimitScope::ALL.len();
/// Series of `cutover_waf_decisions_total` per route.
const WAF_SERIES: usize = WAF_OUTCOMES.len();

/// What a forward auth's cache did for one request
/// (`cutover_auth_cache_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLookup {
    /// A kept answer decided.
    Hit,
    /// The auth service was asked and its answer kept.
    Stored,
    /// The auth service was asked and its answer not kept (a 5xx, no
    /// answer, or its `Cache-Control` said not to).
    Miss,
}

impl CacheLookup {
    pub const ALL: [CacheLookup; 3] = [CacheLookup::Hit, CacheLookup::Stored, CacheLookup::Miss];

    pub fn name(self) -> &'static str {
        match self {
            CacheLookup::Hit => "hit",
            CacheLookup::Stored => "stored",
            CacheLookup::Miss => "miss",
        }
    }
}
/// Series a route's copies may take.
const COPY_SERIES: usize = 2 * COPY_OUTCOMES.len();

impl RouteShared {
    /// Counts a copy of one of its requests that ended as
    /// `COPY_OUTCOMES[i]`.
    pub fn copied(&self, kind: CopyKind, i: usize) {
        self.copies_exported
            .get_or_init(|| series::admit(COPY_SERIES));
        if let Some(count) = self.copies.get(kind as usize).and_then(|k| k.get(i)) {
            count.add(1);
        }
    }

    pub fn new(route: &str) -> Arc<Self> {
        let shared = Arc::new(Self {
            name: Arc::from(route),
            inflight: AtomicU64::new(0),
            responses: Default::default(),
            duration: Histogram::new(m::REQUEST_DURATION_BUCKETS),
            rejections: Count::default(),
            limited: Count::default(),
            refusals: Default::default(),
            dropped: Count::default(),
            exported: OnceLock::new(),
            grpc: Default::default(),
            grpc_exported: OnceLock::new(),
            auth: Default::default(),
            auth_cache: Default::default(),
            auth_exported: OnceLock::new(),
            cache: Default::default(),
            cache_exported: OnceLock::new(),
            limits: Default::default(),
            limits_exported: OnceLock::new(),
            waf: Default::default(),
            waf_exported: OnceLock::new(),
            mirror_inflight: Arc::default(),
            copies: Default::default(),
            copies_exported: OnceLock::new(),
        });
        series::register(&shared);
        shared
    }

    /// The route's name, shared with access-log lines.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    #[inline]
    fn touch(&self) {
        self.exported.get_or_init(|| series::admit(ROUTE_SERIES));
    }

    /// Counts a response by status class and records its duration.
    pub fn record(&self, status: u16, duration: Duration) {
        self.touch();
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        if let Some(counter) = self.responses.get(class) {
            counter.add(1);
        }
        self.duration.record(duration);
    }

    /// Counts a request its quota turned away.
    pub fn rate_limited(&self) {
        self.touch();
        self.limited.add(1);
    }

    /// Counts a request one of its filters refused.
    pub fn refused(&self, why: Refusal) {
        self.touch();
        if let Some(count) = self.refusals.get(why as usize) {
            count.add(1);
        }
    }

    /// Counts a templated header value dropped as invalid.
    pub fn value_dropped(&self) {
        self.touch();
        self.dropped.add(1);
    }

    /// Counts a gRPC call's status.
    pub fn grpc(&self, code: Code) {
        self.grpc_exported
            .get_or_init(|| series::admit(GRPC_SERIES));
        if let Some(count) = self.grpc.get(code as usize) {
            count.add(1);
        }
    }

    /// Counts an authentication check.
    pub fn authenticated(&self, method: AuthMethod, outcome: Outcome) {
        self.auth_exported
            .get_or_init(|| series::admit(AUTH_SERIES));
        if let Some(count) = self
            .auth
            .get(method as usize)
            .and_then(|m| m.get(outcome as usize))
        {
            count.add(1);
        }
    }

    /// Counts one lookup in its forward auth's cache.
    pub fn auth_cache(&self, lookup: CacheLookup) {
        self.auth_exported
            .get_or_init(|| series::admit(AUTH_SERIES));
        self.auth_cache[lookup as usize].add(1);
    }

    /// Counts what the route's cache did for one request.
    pub fn cached(&self, outcome: CacheOutcome) {
        self.cache_exported
            .get_or_init(|| series::admit(CACHE_SERIES));
        self.cache[outcome as usize].add(1);
    }

    /// Counts one decision of its web application firewall (an outcome
    /// of `WAF_OUTCOMES`).
    pub fn waf_decided(&self, outcome: &str) {
        self.waf_exported.get_or_init(|| series::admit(WAF_SERIES));
        if let Some(i) = WAF_OUTCOMES.iter().position(|o| *o == outcome) {
            self.waf[i].add(1);
        }
    }

    /// Counts one decision of its quota.
    #[inline]
    pub fn decided(&self, scope: LimitScope, outcome: LimitOutcome) {
        self.limits_exported
            .get_or_init(|| series::admit(LIMIT_SERIES));
        self.limits[scope as usize][outcome as usize].add(1);
    }

    /// Where gRPC calls no route took are counted (`route="-"`).
    pub fn unrouted() -> &'static RouteShared {
        static UNROUTED: OnceLock<Arc<RouteShared>> = OnceLock::new();
        UNROUTED.get_or_init(|| RouteShared::new("-"))
    }

    fn reject(&self) {
        self.touch();
        self.rejections.add(1);
    }
}

impl Exported for RouteShared {
    fn samples(&self, out: &mut Vec<Sample>) {
        let labels = series::named(m::LABEL_ROUTE, &self.name);
        if self.grpc_exported.get() == Some(&true) {
            for (count, code) in self.grpc.iter().zip(Code::ALL) {
                if count.get() > 0 {
                    let mut labels = labels.clone();
                    labels.push((m::LABEL_CODE, code.name().into()));
                    out.push(series::sample(
                        &series::ROUTE_GRPC,
                        labels,
                        count.get() as f64,
                    ));
                }
            }
        }
        if self.auth_exported.get() == Some(&true) {
            for (counts, method) in self.auth.iter().zip(AuthMethod::ALL) {
                for (count, outcome) in counts.iter().zip(Outcome::ALL) {
                    if count.get() > 0 {
                        let mut labels = labels.clone();
                        labels.push((m::LABEL_METHOD, method.name().into()));
                        labels.push((m::LABEL_OUTCOME, outcome.name().into()));
                        out.push(series::sample(
                            &series::ROUTE_AUTH,
                            labels,
                            count.get() as f64,
                        ));
                    }
                }
            }
            for (count, lookup) in self.auth_cache.iter().zip(CacheLookup::ALL) {
                if count.get() > 0 {
                    let mut labels = labels.clone();
                    labels.push((m::LABEL_RESULT, lookup.name().into()));
                    out.push(series::sample(
                        &series::ROUTE_AUTH_CACHE,
                        labels,
                        count.get() as f64,
                    ));
                }
            }
        }
        if self.cache_exported.get() == Some(&true) {
            for (count, outcome) in self.cache.iter().zip(CacheOutcome::ALL) {
                if count.get() > 0 {
                    let mut labels = labels.clone();
                    labels.push((m::LABEL_STATUS, outcome.name().into()));
                    out.push(series::sample(
                        &series::ROUTE_CACHE,
                        labels,
                        count.get() as f64,
                    ));
                }
            }
        }
        if self.limits_exported.get() == Some(&true) {
            for (counts, scope) in self.limits.iter().zip(LimitScope::ALL) {
                for (count, outcome) in counts.iter().zip(LimitOutcome::ALL) {
                    if count.get() > 0 {
                        let mut labels = labels.clone();
                        labels.push((m::LABEL_OUTCOME, outcome.name().into()));
                        labels.push((m::LABEL_SCOPE, scope.name().into()));
                        out.push(series::sample(
                            &series::ROUTE_RATELIMIT,
                            labels,
                            count.get() as f64,
                        ));
                    }
                }
            }
        }
        if self.waf_exported.get() == Some(&true) {
            for (count, outcome) in self.waf.iter().zip(WAF_OUTCOMES) {
                if count.get() > 0 {
                    let mut labels = labels.clone();
                    labels.push((m::LABEL_OUTCOME, outcome.into()));
                    out.push(series::sample(
                        &series::ROUTE_WAF,
                        labels,
                        count.get() as f64,
                    ));
                }
            }
        }
        if self.copies_exported.get() == Some(&true) {
            for (counts, kind) in self.copies.iter().zip([CopyKind::Mirror, CopyKind::Shadow]) {
                for (count, outcome) in counts.iter().zip(COPY_OUTCOMES) {
                    if count.get() > 0 {
                        let mut labels = labels.clone();
                        labels.push((m::LABEL_KIND, kind.name().into()));
                        labels.push((m::LABEL_OUTCOME, outcome.into()));
                        out.push(series::sample(
                            &series::ROUTE_COPIES,
                            labels,
                            count.get() as f64,
                        ));
                    }
                }
            }
        }
        if self.exported.get() != Some(&true) {
            return;
        }
        for (count, class) in self.responses.iter().zip(m::CLASSES) {
            // A class appears with its first response.
            if count.get() > 0 {
                let mut labels = labels.clone();
                labels.push((m::LABEL_CLASS, class.into()));
                out.push(series::sample(
                    &series::ROUTE_REQUESTS,
                    labels,
                    count.get() as f64,
                ));
            }
        }
        if self.duration.count() > 0 {
            self.duration.samples(&series::ROUTE_DURATION, &labels, out);
        }
        for (family, count) in [
            (&series::ROUTE_QUOTA, &self.limited),
            (&series::ROUTE_ADMISSION, &self.rejections),
            (&series::ROUTE_VALUES_DROPPED, &self.dropped),
        ] {
            if count.get() > 0 {
                out.push(series::sample(family, labels.clone(), count.get() as f64));
            }
        }
        for (count, why) in self.refusals.iter().zip(Refusal::ALL) {
            if count.get() > 0 {
                let mut labels = labels.clone();
                labels.push((m::LABEL_REASON, why.name().into()));
                out.push(series::sample(
                    &series::ROUTE_REFUSALS,
                    labels,
                    count.get() as f64,
                ));
            }
        }
    }
}

impl Drop for RouteShared {
    fn drop(&mut self) {
        let route = self.exported.get() == Some(&true);
        let grpc = self.grpc_exported.get() == Some(&true);
        let auth = self.auth_exported.get() == Some(&true);
        let copies = self.copies_exported.get() == Some(&true);
        let cache = self.cache_exported.get() == Some(&true);
        let limits = self.limits_exported.get() == Some(&true);
        let waf = self.waf_exported.get() == Some(&true);
        if route || grpc || auth || copies || cache || limits || waf {
            series::retire(self);
        }
        if waf {
            series::release(WAF_SERIES);
        }
        if limits {
            series::release(LIMIT_SERIES);
        }
        if copies {
            series::release(COPY_SERIES);
        }
        if cache {
            series::release(CACHE_SERIES);
        }
        if route {
            series::release(ROUTE_SERIES);
        }
        if grpc {
            series::release(GRPC_SERIES);
        }
        if auth {
            series::release(AUTH_SERIES);
        }
    }
}

/// A route's quota: counted here, or in the fleet's store.
#[derive(Debug, Clone)]
pub enum Quota {
    Local(Arc<super::QuotaTable>),
    Fleet(Arc<crate::limits::FleetQuota>),
}

impl Quota {
    pub fn spec(&self) -> &crate::plan::QuotaSpec {
        match self {
            Quota::Local(table) => table.spec(),
            Quota::Fleet(fleet) => fleet.spec(),
        }
    }
}

/// What routing looks at besides the host and the path.
pub struct RequestHead<'a> {
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    /// The raw query string (after `?`), if any.
    pub query: Option<&'a str>,
}

/// Whether `spec`'s method, header and query matchers accept the request
/// (the host and the path were matched by the router).
pub fn matches_request(spec: &RouteSpec, head: &RequestHead<'_>) -> bool {
    (spec.methods.is_empty() || spec.methods.contains(head.method))
        && spec.headers.iter().all(|(name, matcher)| {
            head.headers
                .get_all(name)
                .iter()
                .any(|v| matcher.matches(v.as_bytes()))
        })
        && (spec.query.is_empty() || query_matches(&spec.query, head.query))
}

/// Whether every `(name, matcher)` finds a parameter of that name whose
/// value it accepts (names and values percent-decoded, `+` a space).
fn query_matches(wanted: &[(String, crate::plan::ValueMatch)], query: Option<&str>) -> bool {
    let Some(query) = query else {
        return false;
    };
    let pairs: Vec<(std::borrow::Cow<'_, str>, std::borrow::Cow<'_, str>)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(name), form_decode(value))
        })
        .collect();
    wanted.iter().all(|(name, matcher)| {
        pairs
            .iter()
            .any(|(n, v)| n == name && matcher.matches(v.as_bytes()))
    })
}

/// `application/x-www-form-urlencoded` decoding of one name or value;
/// an invalid escape is kept as written.
fn form_decode(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.bytes().any(|b| b == b'%' || b == b'+') {
        return std::borrow::Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(decoded) => {
                        out.push(decoded);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// A route in one generation: its validated definition (shared with the
/// spec, not copied), what it does, and its cross-generation state.
#[derive(Debug)]
pub struct Route {
    pub spec: Arc<RouteSpec>,
    pub action: Action,
    pub shared: Arc<RouteShared>,
    pub quota: Option<Quota>,
    /// The zone its `cache` keeps answers in (process-shared).
    pub cache: Option<Arc<crate::cache::Zone>>,
}

impl Route {
    /// Whether the request's path, method, headers and query match (the
    /// host was matched by the router).
    pub fn matches(&self, path: &str, head: &RequestHead<'_>) -> bool {
        self.spec.path.matches(path) && self.matches_request(head)
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Upstream response deadline.
    pub fn timeout(&self) -> Duration {
        self.spec.timeout
    }

    /// Whether the method, header and query matchers accept the request.
    pub fn matches_request(&self, head: &RequestHead<'_>) -> bool {
        matches_request(&self.spec, head)
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

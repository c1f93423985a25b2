//! Metric series labelled by configured names: routes, backends,
//! upstreams, and generations by role (DESIGN §16).
//!
//! The `metrics` recorder keeps every series it was ever given, so a
//! pipeline that renames a route on each activation would grow `/metrics`
//! without bound (2 000 activations left 40 000 stale series). These
//! series are kept here instead, by the state they describe: each
//! [`Exported`] value (a route's, a backend's or an upstream's shared
//! state) registers itself when made and is read at each scrape while it
//! lives. It lives while a live generation names it; when the last one
//! lets go it hands its final values over once more, so the next scrape
//! sees them, and then its series are gone.
//!
//! Every value admitted to export takes its series from a process-wide
//! budget (`metrics.max_series`); what does not fit is not exported and
//! is counted in `cutover_metrics_series_refused_total`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::metrics as m;

/// The series cap when `metrics.max_series` is not set.
pub const DEFAULT_MAX_SERIES: usize = 50_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric family: its name, type and help text, and how two series
/// with the same labels (two backend identities at one address) combine.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// Combined by the smaller value (health), not the sum.
    pub min: bool,
}

const fn family(name: &'static str, kind: Kind, help: &'static str) -> Family {
    Family {
        name,
        kind,
        help,
        min: false,
    }
}

pub static ROUTE_REQUESTS: Family = family(
    m::REQUESTS,
    Kind::Counter,
    "Requests answered, by route and status class",
);
pub static ROUTE_DURATION: Family = family(
    m::REQUEST_DURATION,
    Kind::Histogram,
    "Time from admission to response head, by route",
);
pub static ROUTE_QUOTA: Family = family(
    m::QUOTA_REJECTIONS,
    Kind::Counter,
    "Requests a route's quota answered 429",
);
pub static ROUTE_ADMISSION: Family = family(
    m::ADMISSION_REJECTIONS,
    Kind::Counter,
    "Requests refused by a route's max_inflight",
);
pub static ROUTE_REFUSALS: Family = family(
    m::FILTER_REFUSALS,
    Kind::Counter,
    "Requests a route filter refused, by route and reason",
);
pub static ROUTE_VALUES_DROPPED: Family = family(
    m::FILTER_VALUES_DROPPED,
    Kind::Counter,
    "Templated header values dropped as invalid, by route",
);
pub static ROUTE_GRPC: Family = family(
    m::GRPC_RESPONSES,
    Kind::Counter,
    "gRPC calls answered, by route and status code name",
);
pub static ROUTE_COPIES: Family = family(
    m::SHADOW_REQUESTS,
    Kind::Counter,
    "Copies of a route's requests (mirror, shadow stage), by kind and outcome",
);
pub static ROUTE_AUTH: Family = family(
    m::AUTH,
    Kind::Counter,
    "Authentication checks, by route, method and outcome",
);
pub static ROUTE_AUTH_CACHE: Family = family(
    m::AUTH_CACHE,
    Kind::Counter,
    "Forward auth cache lookups, by route and result",
);
pub static ROUTE_WAF: Family = family(
    m::WAF_DECISIONS,
    Kind::Counter,
    "The web application firewall's decisions, by route and outcome",
);
pub static WAF_RULE_MATCHES: Family = family(
    m::WAF_RULE_MATCHES,
    Kind::Counter,
    "Matches of each web application firewall rule, by rule id",
);
pub static ROUTE_CACHE: Family = family(
    m::CACHE_REQUESTS,
    Kind::Counter,
    "What a route's cache did, by route and status",
);
pub static CACHE_BYTES: Family = family(
    m::CACHE_BYTES,
    Kind::Gauge,
    "Bytes a cache zone holds (bodies, heads and keys)",
);
pub static CACHE_CAPACITY: Family = family(
    m::CACHE_CAPACITY,
    Kind::Gauge,
    "Bytes a cache zone may hold",
);
pub static CACHE_OBJECTS: Family = family(
    m::CACHE_OBJECTS,
    Kind::Gauge,
    "Keys a cache zone holds (each with up to 16 variants)",
);
pub static CACHE_EVICTIONS: Family = family(
    m::CACHE_EVICTIONS,
    Kind::Counter,
    "Keys a cache zone pushed out to make room",
);
pub static CACHE_STORED: Family = family(
    m::CACHE_STORED,
    Kind::Counter,
    "Answers a cache zone stored (new, replaced or revalidated)",
);
pub static CACHE_PURGED: Family = family(
    m::CACHE_PURGED,
    Kind::Counter,
    "Keys a cache zone forgot by purge",
);
pub static CACHE_DISK_BYTES: Family = family(
    m::CACHE_DISK_BYTES,
    Kind::Gauge,
    "Bytes a cache zone's files take (zones with disk)",
);
pub static CACHE_DISK_ERRORS: Family = family(
    m::CACHE_DISK_ERRORS,
    Kind::Counter,
    "Writes of a cache zone's files that failed (a full disk, an unwritable folder)",
);
pub static ROUTE_RATELIMIT: Family = family(
    m::RATELIMIT_DECISIONS,
    Kind::Counter,
    "Quota decisions, by route, outcome and scope",
);
pub static RATELIMIT_STORE_UP: Family = family(
    m::RATELIMIT_STORE_UP,
    Kind::Gauge,
    "1 while the rate-limit store answers",
);
pub static RATELIMIT_STORE_INSTANCES: Family = family(
    m::RATELIMIT_STORE_INSTANCES,
    Kind::Gauge,
    "Gateway instances the rate-limit store counts (this one included)",
);
pub static RATELIMIT_STORE_ERRORS: Family = family(
    m::RATELIMIT_STORE_ERRORS,
    Kind::Counter,
    "Calls to the rate-limit store that failed or timed out",
);
pub static RATELIMIT_STORE_TRANSITIONS: Family = family(
    m::RATELIMIT_STORE_TRANSITIONS,
    Kind::Counter,
    "Changes of the rate-limit store between answering and failing",
);
pub static RATELIMIT_STORE_WAIT: Family = family(
    m::RATELIMIT_STORE_WAIT,
    Kind::Histogram,
    "Time requests waited for a decision from the rate-limit store",
);
pub static RATELIMIT_DEADLINE_MISSES: Family = family(
    m::RATELIMIT_DEADLINE_MISSES,
    Kind::Counter,
    "Requests whose fleet quota decided by on_store_error, by cause",
);
pub static BACKEND_ATTEMPTS: Family = family(
    m::UPSTREAM_ATTEMPTS,
    Kind::Counter,
    "Upstream attempts by backend and outcome",
);
pub static BACKEND_EJECTIONS: Family =
    family(m::EJECTIONS, Kind::Counter, "Outlier ejections, by backend");
pub static BACKEND_HEALTHY: Family = Family {
    name: m::BACKEND_HEALTHY,
    kind: Kind::Gauge,
    help: "1 while a backend passes its active checks (or has none)",
    min: true,
};
pub static BACKEND_CHECKS: Family = family(
    m::HEALTH_CHECKS,
    Kind::Counter,
    "Active health check results, by backend and outcome",
);
pub static BACKEND_INFLIGHT: Family = family(
    m::BACKEND_INFLIGHT,
    Kind::Gauge,
    "Requests in flight to a backend, over every live generation",
);
pub static BACKEND_CONNECT: Family = family(
    m::CONNECT_DURATION,
    Kind::Histogram,
    "Time to open a TCP connection to a backend (TLS handshakes not included)",
);
pub static UPSTREAM_FAIL_OPEN: Family = family(
    m::FAIL_OPEN,
    Kind::Counter,
    "Picks made with every backend of an upstream unhealthy or ejected",
);
pub static UPSTREAM_RETRIES: Family = family(
    m::RETRIES,
    Kind::Counter,
    "Retries by upstream and outcome (retried, budget_exhausted)",
);
pub static UPSTREAM_HEDGES: Family = family(
    m::HEDGES,
    Kind::Counter,
    "Hedged requests by upstream and outcome (won, lost)",
);
pub static DISCOVERY_RESOLUTIONS: Family = family(
    m::DISCOVERY_RESOLUTIONS,
    Kind::Counter,
    "Resolutions of an upstream's dns, srv and endpoints_file sources, by outcome",
);
pub static DISCOVERY_MEMBERS: Family = family(
    m::DISCOVERY_MEMBERS,
    Kind::Gauge,
    "Members an upstream takes from its sources now",
);
pub static DISCOVERY_LEFT_OUT: Family = family(
    m::DISCOVERY_LEFT_OUT,
    Kind::Gauge,
    "Members an upstream's sources give that max_members leaves out",
);
pub static GENERATION_REQUESTS: Family = family(
    m::GENERATION_REQUESTS,
    Kind::Counter,
    "Requests answered, by the role of the generation they were pinned to",
);
pub static GENERATION_ERRORS: Family = family(
    m::GENERATION_ERRORS,
    Kind::Counter,
    "Requests answered 5xx (by the gateway or the backend), by generation role",
);
pub static GENERATION_DURATION: Family = family(
    m::GENERATION_DURATION,
    Kind::Histogram,
    "Time from admission to response head, by generation role",
);

/// Families in output order.
static FAMILIES: [&Family; 43] = [
    &ROUTE_REQUESTS,
    &ROUTE_DURATION,
    &ROUTE_QUOTA,
    &ROUTE_ADMISSION,
    &ROUTE_REFUSALS,
    &ROUTE_VALUES_DROPPED,
    &ROUTE_GRPC,
    &ROUTE_AUTH,
    &ROUTE_AUTH_CACHE,
    &ROUTE_COPIES,
    &ROUTE_CACHE,
    &CACHE_BYTES,
    &CACHE_CAPACITY,
    &CACHE_OBJECTS,
    &CACHE_EVICTIONS,
    &CACHE_STORED,
    &CACHE_PURGED,
    &CACHE_DISK_BYTES,
    &CACHE_DISK_ERRORS,
    &ROUTE_RATELIMIT,
    &ROUTE_WAF,
    &WAF_RULE_MATCHES,
    &RATELIMIT_STORE_UP,
    &RATELIMIT_STORE_INSTANCES,
    &RATELIMIT_STORE_ERRORS,
    &RATELIMIT_STORE_TRANSITIONS,
    &RATELIMIT_STORE_WAIT,
    &RATELIMIT_DEADLINE_MISSES,
    &BACKEND_ATTEMPTS,
    &BACKEND_EJECTIONS,
    &BACKEND_HEALTHY,
    &BACKEND_CHECKS,
    &BACKEND_INFLIGHT,
    &BACKEND_CONNECT,
    &UPSTREAM_FAIL_OPEN,
    &UPSTREAM_RETRIES,
    &UPSTREAM_HEDGES,
    &DISCOVERY_RESOLUTIONS,
    &DISCOVERY_MEMBERS,
    &DISCOVERY_LEFT_OUT,
    &GENERATION_REQUESTS,
    &GENERATION_ERRORS,
    &GENERATION_DURATION,
];

pub type Labels = Vec<(&'static str, Cow<'static, str>)>;

/// One value of one series.
#[derive(Debug, Clone)]
pub struct Sample {
    pub family: &'static Family,
    /// `""`, or `_bucket`, `_sum`, `_count` for a histogram.
    pub suffix: &'static str,
    pub labels: Labels,
    pub value: f64,
}

/// State that exports series while it lives.
pub trait Exported: Send + Sync {
    fn samples(&self, out: &mut Vec<Sample>);
}

/// A counter that is a plain atomic: read at scrape time only.
#[derive(Debug, Default)]
pub struct Count(AtomicU64);

impl Count {
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The `q` quantile's upper bound over bucket `counts` (one per bound,
/// then `+Inf`'s), as `histogram_quantile` would bound it; `None` with
/// no sample.
pub fn quantile_bound_of(bounds: &[f64], counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut cumulative = 0;
    for (i, n) in counts.iter().enumerate() {
        cumulative += n;
        if cumulative >= rank {
            return Some(bounds.get(i).copied().unwrap_or(f64::INFINITY));
        }
    }
    Some(f64::INFINITY)
}

/// A histogram with fixed bucket bounds (seconds), kept as atomics.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; the last one is `+Inf`.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn record(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        let index = self
            .bounds
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(self.bounds.len());
        if let Some(bucket) = self.buckets.get(index) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The `q` quantile's upper bound: the bound of the bucket its sample
    /// falls in (`f64::INFINITY` past the last bound), as
    /// `histogram_quantile` would bound it; `None` with no sample.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        quantile_bound_of(self.bounds, &self.counts(), q)
    }

    /// Each bucket's count (not cumulative; the last is `+Inf`'s).
    pub fn counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// Cumulative `_bucket` series with `le`, then `_sum` and `_count`.
    pub fn samples(&self, family: &'static Family, labels: &Labels, out: &mut Vec<Sample>) {
        let mut cumulative = 0u64;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(bound) => Cow::Owned(bound.to_string()),
                None => Cow::Borrowed("+Inf"),
            };
            let mut labels = labels.clone();
            labels.push(("le", le));
            out.push(Sample {
                family,
                suffix: "_bucket",
                labels,
                value: cumulative as f64,
            });
        }
        out.push(Sample {
            family,
            suffix: "_sum",
            labels: labels.clone(),
            value: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        });
        out.push(Sample {
            family,
            suffix: "_count",
            labels: labels.clone(),
            value: cumulative as f64,
        });
    }
}

/// A sample helper for the common one-value series.
pub fn sample(family: &'static Family, labels: Labels, value: f64) -> Sample {
    Sample {
        family,
        suffix: "",
        labels,
        value,
    }
}

struct Registry {
    live: Vec<Weak<dyn Exported>>,
    /// Final values of exported state that is gone, for one more scrape.
    retired: Vec<Sample>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    live: Vec::new(),
    retired: Vec::new(),
});
static MAX_SERIES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_SERIES);
static USED_SERIES: AtomicUsize = AtomicUsize::new(0);
/// Retired samples kept at most, should nothing scrape for a long time.
const MAX_RETIRED: usize = 100_000;

/// Sets the series cap (`metrics.max_series`, at startup).
pub fn set_max_series(max: usize) {
    MAX_SERIES.store(max, Ordering::Relaxed);
}

/// Takes `series` from the budget; false (and counted) when they do
/// not fit.
pub fn admit(series: usize) -> bool {
    let max = MAX_SERIES.load(Ordering::Relaxed);
    let admitted = USED_SERIES
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            (used + series <= max).then_some(used + series)
        })
        .is_ok();
    if !admitted {
        metrics::counter!(m::SERIES_REFUSED).increment(series as u64);
    }
    admitted
}

/// Gives `series` back to the budget.
pub fn release(series: usize) {
    let _ = USED_SERIES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
        Some(used.saturating_sub(series))
    });
}

/// Starts exporting `entry`'s series, read at each scrape while it lives.
pub fn register<E: Exported + 'static>(entry: &Arc<E>) {
    let weak: Weak<dyn Exported> = Arc::downgrade(entry) as Weak<dyn Exported>;
    let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    // Dead entries go when the list has doubled since the last sweep.
    let len = registry.live.len();
    if len >= 64 && len.is_power_of_two() {
        registry.live.retain(|w| w.strong_count() > 0);
    }
    registry.live.push(weak);
}

/// Keeps `entry`'s final values for the next scrape (from its `Drop`).
pub fn retire(entry: &dyn Exported) {
    let mut samples = Vec::new();
    entry.samples(&mut samples);
    let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    if registry.retired.len() + samples.len() <= MAX_RETIRED {
        registry.retired.extend(samples);
    }
}

/// Every live entry's samples, and the retired ones (which are then
/// forgotten).
pub fn collect(out: &mut Vec<Sample>) {
    let (entries, retired) = {
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        registry.live.retain(|w| w.strong_count() > 0);
        let entries: Vec<Arc<dyn Exported>> =
            registry.live.iter().filter_map(Weak::upgrade).collect();
        (entries, std::mem::take(&mut registry.retired))
    };
    for entry in &entries {
        entry.samples(out);
    }
    out.extend(retired);
    // An entry whose last holder let go meanwhile retires here, with the
    // registry unlocked.
    drop(entries);
}

/// One live generation's answers, under the role it plays now
/// (`active`, `pending` or `previous`): what the store pushes for a scrape.
pub struct GenerationSeries<'a> {
    pub role: &'static str,
    pub id: u64,
    pub requests: u64,
    pub errors: u64,
    pub duration: &'a Histogram,
}

/// The `generation="active" | "pending" | "previous"` series.
pub fn generation_samples(generations: &[GenerationSeries<'_>], out: &mut Vec<Sample>) {
    for generation in generations {
        let labels: Labels = vec![
            (m::LABEL_GENERATION, generation.role.into()),
            ("id", generation.id.to_string().into()),
        ];
        out.push(sample(
            &GENERATION_REQUESTS,
            labels.clone(),
            generation.requests as f64,
        ));
        out.push(sample(
            &GENERATION_ERRORS,
            labels.clone(),
            generation.errors as f64,
        ));
        generation
            .duration
            .samples(&GENERATION_DURATION, &labels, out);
    }
}

/// `/metrics`: the recorder's series, then the labelled ones kept here,
/// then the generations' series.
pub fn scrape(
    recorder: &metrics_exporter_prometheus::PrometheusHandle,
    generations: &[GenerationSeries<'_>],
) -> String {
    let mut text = recorder.render();
    let mut samples = Vec::new();
    collect(&mut samples);
    generation_samples(generations, &mut samples);
    render(samples, &mut text);
    text
}

/// Prometheus text for `samples`: families in a fixed order, each with
/// its help and type once; series with the same labels (two backend
/// identities at one address, or a retired value and a live one)
/// combined by sum, or by minimum for health.
pub fn render(samples: Vec<Sample>, out: &mut String) {
    let mut by_family: HashMap<&'static str, Vec<Sample>> = HashMap::new();
    let mut index: HashMap<(&'static str, &'static str, Labels), usize> = HashMap::new();
    for sample in samples {
        let key = (sample.family.name, sample.suffix, sample.labels.clone());
        let family = by_family.entry(sample.family.name).or_default();
        match index.get(&key) {
            Some(&i) => {
                if let Some(existing) = family.get_mut(i) {
                    existing.value = if sample.family.min {
                        existing.value.min(sample.value)
                    } else {
                        existing.value + sample.value
                    };
                }
            }
            None => {
                index.insert(key, family.len());
                family.push(sample);
            }
        }
    }
    for family in FAMILIES {
        let Some(samples) = by_family.get(family.name) else {
            continue;
        };
        let kind = match family.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {kind}", family.name);
        for sample in samples {
            out.push_str(family.name);
            out.push_str(sample.suffix);
            if !sample.labels.is_empty() {
                out.push('{');
                for (i, (key, value)) in sample.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{key}=\"");
                    escape_label(out, value);
                    out.push('"');
                }
                out.push('}');
            }
            let _ = writeln!(out, " {}", sample.value);
        }
        out.push('\n');
    }
}

/// Label values escape `\`, `"` and newlines (exposition format).
fn escape_label(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The label set of one named thing.
pub fn named(key: &'static str, name: &Arc<str>) -> Labels {
    vec![(key, Cow::Owned(name.to_string()))]
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<Sample>);

    impl Exported for Fixed {
        fn samples(&self, out: &mut Vec<Sample>) {
            out.extend(self.0.iter().cloned());
        }
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        static BOUNDS: [f64; 2] = [0.001, 0.01];
        let h = Histogram::new(&BOUNDS);
        h.record(Duration::from_micros(500));
        h.record(Duration::from_millis(5));
        h.record(Duration::from_secs(1));
        let mut samples = Vec::new();
        h.samples(
            &ROUTE_DURATION,
            &named("route", &Arc::from("a")),
            &mut samples,
        );
        let mut text = String::new();
        render(samples, &mut text);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "# HELP cutover_request_duration_seconds Time from admission to response head, by route",
                "# TYPE cutover_request_duration_seconds histogram",
                "cutover_request_duration_seconds_bucket{route=\"a\",le=\"0.001\"} 1",
                "cutover_request_duration_seconds_bucket{route=\"a\",le=\"0.01\"} 2",
                "cutover_request_duration_seconds_bucket{route=\"a\",le=\"+Inf\"} 3",
                "cutover_request_duration_seconds_sum{route=\"a\"} 1.0055",
                "cutover_request_duration_seconds_count{route=\"a\"} 3",
                "",
            ]
        );
    }

    #[test]
    fn quantile_bounds_come_from_the_buckets() {
        static BOUNDS: [f64; 3] = [0.001, 0.01, 0.1];
        let h = Histogram::new(&BOUNDS);
        assert_eq!(h.quantile_bound(0.99), None);
        for _ in 0..98 {
            h.record(Duration::from_micros(500));
        }
        h.record(Duration::from_millis(5));
        h.record(Duration::from_secs(1));
        assert_eq!(h.quantile_bound(0.5), Some(0.001));
        assert_eq!(h.quantile_bound(0.99), Some(0.01));
        assert_eq!(h.quantile_bound(1.0), Some(f64::INFINITY));
    }

    #[test]
    fn same_labels_combine_and_families_keep_their_order() {
        let up = |v| sample(&BACKEND_HEALTHY, named("backend", &Arc::from("x:1")), v);
        let tries = |v| {
            sample(
                &BACKEND_ATTEMPTS,
                vec![("backend", "x:1".into()), ("outcome", "ok".into())],
                v,
            )
        };
        let mut text = String::new();
        render(vec![up(1.0), tries(2.0), up(0.0), tries(3.0)], &mut text);
        assert!(
            text.contains("cutover_upstream_attempts_total{backend=\"x:1\",outcome=\"ok\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("cutover_backend_healthy{backend=\"x:1\"} 0\n"),
            "{text}"
        );
        assert!(
            text.find("cutover_upstream_attempts_total").unwrap()
                < text.find("cutover_backend_healthy").unwrap()
        );
        let mut text = String::new();
        render(
            vec![sample(
                &ROUTE_QUOTA,
                named("route", &Arc::from("a\"b\\c\nd")),
                1.0,
            )],
            &mut text,
        );
        assert!(text.contains("{route=\"a\\\"b\\\\c\\nd\"} 1"), "{text}");
    }

    #[test]
    fn retired_values_are_scraped_once_then_gone() {
        let entry = Arc::new(Fixed(vec![sample(
            &UPSTREAM_FAIL_OPEN,
            named("upstream", &Arc::from("retired-test")),
            7.0,
        )]));
        register(&entry);
        let scrape = || {
            let mut samples = Vec::new();
            collect(&mut samples);
            samples
                .iter()
                .filter(|s| s.labels.first().is_some_and(|(_, v)| v == "retired-test"))
                .count()
        };
        assert_eq!(scrape(), 1);
        retire(&*entry);
        drop(entry);
        assert_eq!(scrape(), 1, "the final values, once");
        assert_eq!(scrape(), 0);
    }
}

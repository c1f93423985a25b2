//! A shadow stage's live state (DESIGN §22): the candidate generation,
//! built but not active, that copies of live requests go through while
//! an activation shadows it, and the answers both generations gave to
//! the same requests, per route of the candidate.
//!
//! The data plane (`proxy/shadow.rs`) offers requests and records each
//! pair of answers here; the control plane (`control/shadow.rs`)
//! installs it in the store, reads its report and judges it. Bounded:
//! `max_inflight` copies at a time (the data plane's slots), and at most
//! `MAX_ROUTES` routes tallied (the rest together, as `(other routes)`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::generation::{Generation, COPY_OUTCOMES};
use crate::ids::GenerationId;
use crate::telemetry::series::Count;
use crate::waf::tally::{WafShadowReport, WafTally};

/// Routes tallied apart; copies to more go under `OTHER_ROUTES`.
pub const MAX_ROUTES: usize = 1_000;
/// Routes a report lists (the busiest), beside its total.
pub const REPORTED_ROUTES: usize = 50;
const OTHER_ROUTES: &str = "(other routes)";

/// A shadow in progress.
pub struct Shadow {
    pub candidate: Arc<Generation>,
    /// The generation whose answers the copies are compared with.
    pub active: GenerationId,
    /// Share of eligible requests copied, in percent (0 < p ≤ 100).
    pub percent: f64,
    pub max_inflight: u32,
    /// Copies in flight (the data plane's slots).
    pub inflight: Arc<AtomicU64>,
    started: Instant,
    /// When it started, on the wall clock (what status shows).
    started_at: std::time::SystemTime,
    /// By `COPY_OUTCOMES` index.
    outcomes: [Count; 5],
    tally: Mutex<HashMap<Arc<str>, RouteTally>>,
    /// A WAF shadow stage (DESIGN §24): the candidate's firewall judges
    /// the requests instead of copies going to its upstreams.
    pub waf: Option<WafTally>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow")
            .field("candidate", &self.candidate.id)
            .field("active", &self.active)
            .field("percent", &self.percent)
            .finish_non_exhaustive()
    }
}

/// One answer: its status and how long its head took.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub status: u16,
    pub elapsed: Duration,
}

impl Shadow {
    pub fn new(
        candidate: Arc<Generation>,
        active: GenerationId,
        percent: f64,
        max_inflight: u32,
        waf: bool,
    ) -> Self {
        Self {
            candidate,
            active,
            percent,
            max_inflight,
            inflight: Arc::default(),
            started: Instant::now(),
            started_at: std::time::SystemTime::now(),
            outcomes: Default::default(),
            tally: Mutex::default(),
            waf: waf.then(WafTally::default),
        }
    }

    /// Counts a copy that ended as `COPY_OUTCOMES[i]`.
    pub fn counted(&self, i: usize) {
        if let Some(count) = self.outcomes.get(i) {
            count.add(1);
        }
    }

    /// Records the answers of both generations to one request, under the
    /// candidate's route that took the copy.
    pub fn compared(&self, route: &Arc<str>, active: Answer, candidate: Answer) {
        let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if tally.len() < MAX_ROUTES || tally.contains_key(route) {
            Arc::clone(route)
        } else {
            Arc::from(OTHER_ROUTES)
        };
        tally.entry(key).or_default().add(active, candidate);
    }

    /// What the copies showed so far.
    pub fn report(&self) -> ShadowReport {
        let tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        let mut total = RouteTally::default();
        for route in tally.values() {
            total.merge(route);
        }
        let mut routes: Vec<(&Arc<str>, &RouteTally)> = tally.iter().collect();
        routes.sort_by(|a, b| b.1.compared.cmp(&a.1.compared).then(a.0.cmp(b.0)));
        let count = |i: usize| self.outcomes.get(i).map_or(0, Count::get);
        ShadowReport {
            candidate_generation: self.candidate.id,
            active_generation: self.active,
            percent: self.percent,
            seconds: self.started.elapsed().as_secs_f64(),
            started_at: Some(crate::runtime::rfc3339(self.started_at)),
            verdict: ShadowVerdict::Running,
            reason: String::new(),
            copies: CopyCounts {
                compared: total.compared,
                answered: count(0),
                failed: count(1),
                timeout: count(2),
                dropped: count(3),
                skipped: count(4),
            },
            total: total.report("(all routes)"),
            routes: routes
                .into_iter()
                .take(REPORTED_ROUTES)
                .map(|(name, t)| t.report(name))
                .collect(),
            routes_tallied: tally.len(),
            waf: self.waf.as_ref().map(WafTally::report),
        }
    }
}

/// Both generations' answers to the copies one route of the candidate
/// took.
#[derive(Debug, Default, Clone)]
pub struct RouteTally {
    compared: u64,
    /// Pairs whose status classes differ.
    changed: u64,
    active: Side,
    candidate: Side,
}

impl RouteTally {
    fn add(&mut self, active: Answer, candidate: Answer) {
        self.compared += 1;
        if active.status / 100 != candidate.status / 100 {
            self.changed += 1;
        }
        self.active.add(active);
        self.candidate.add(candidate);
    }

    fn merge(&mut self, other: &RouteTally) {
        self.compared += other.compared;
        self.changed += other.changed;
        self.active.merge(&other.active);
        self.candidate.merge(&other.candidate);
    }

    fn report(&self, name: &str) -> RouteReport {
        RouteReport {
            route: name.to_owned(),
            compared: self.compared,
            changed_class: self.changed,
            active: self.active.report(),
            candidate: self.candidate.report(),
        }
    }
}

/// One generation's answers: status classes and latency.
#[derive(Debug, Default, Clone)]
struct Side {
    /// 1xx to 5xx.
    classes: [u64; 5],
    latency: LogHistogram,
}

impl Side {
    fn add(&mut self, answer: Answer) {
        let class = usize::from(answer.status / 100).clamp(1, 5) - 1;
        if let Some(n) = self.classes.get_mut(class) {
            *n += 1;
        }
        self.latency.record(answer.elapsed);
    }

    fn merge(&mut self, other: &Side) {
        for (a, b) in self.classes.iter_mut().zip(other.classes) {
            *a += b;
        }
        self.latency.merge(&other.latency);
    }

    fn report(&self) -> SideReport {
        let requests: u64 = self.classes.iter().sum();
        let errors = self.classes[4];
        SideReport {
            status_classes: self
                .classes
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (format!("{}xx", i + 1), *n))
                .collect(),
            errors,
            error_ratio: errors as f64 / requests.max(1) as f64,
            p50_ms: self.latency.quantile_ms(0.5),
            p99_ms: self.latency.quantile_ms(0.99),
        }
    }
}

/// Latencies in buckets a quarter of an octave wide (each bound 19 %
/// above the last), from 1 µs to over four minutes: quantiles within
/// 19 % in 1 KiB, where the metrics' buckets would be a factor of 2.5
/// apart around a millisecond.
#[derive(Debug, Clone)]
pub struct LogHistogram {
    buckets: Box<[u64; LOG_BUCKETS]>,
}

const LOG_BUCKETS: usize = 112;

impl Default for LogHistogram {
    fn default() -> Self {
        Self {
            buckets: Box::new([0; LOG_BUCKETS]),
        }
    }
}

impl LogHistogram {
    pub fn record(&mut self, elapsed: Duration) {
        let micros = elapsed.as_micros().max(1) as f64;
        let index = ((micros.log2() * 4.0).floor() as usize).min(LOG_BUCKETS - 1);
        if let Some(n) = self.buckets.get_mut(index) {
            *n += 1;
        }
    }

    fn merge(&mut self, other: &LogHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
    }

    /// The `q` quantile's upper bound, milliseconds; `None` when empty.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        let index = self
            .buckets
            .iter()
            .position(|n| {
                seen += n;
                seen >= rank
            })
            .unwrap_or(LOG_BUCKETS - 1);
        let micros = 2f64.powf((index + 1) as f64 / 4.0);
        Some(micros.round() / 1000.0)
    }
}

/// How a shadow stage ended (or that it still runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShadowVerdict {
    Running,
    /// Within its thresholds: the activation went on.
    Passed,
    /// Over a threshold: the activation was refused.
    Breached,
    /// Fewer than `min_requests` compared; `on_no_data` decided.
    NoData,
    /// Stopped by an operator's abort.
    Aborted,
    /// Stopped because the process began to drain.
    Interrupted,
    /// A verdict a newer cutover recorded, read by this one (after a
    /// binary downgrade).
    #[serde(other)]
    Other,
}

/// Copies by what became of them; `compared` counts pairs of answers,
/// the rest by `cutover_shadow_requests_total`'s outcomes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyCounts {
    pub compared: u64,
    pub answered: u64,
    pub failed: u64,
    pub timeout: u64,
    pub dropped: u64,
    pub skipped: u64,
}

/// One generation's answers to the compared requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SideReport {
    /// Non-zero classes only: `{"2xx": 950, "5xx": 50}`.
    pub status_classes: BTreeMap<String, u64>,
    pub errors: u64,
    pub error_ratio: f64,
    /// Upper bounds of the quantiles (within 19 %).
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteReport {
    /// The candidate's route (`-`: it routed nothing, a 404).
    pub route: String,
    pub compared: u64,
    /// Requests whose status class differs between the generations.
    pub changed_class: u64,
    pub active: SideReport,
    pub candidate: SideReport,
}

/// What a shadow stage showed: answered by activate, kept in the
/// operation record, shown by `ctl` and the admin page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowReport {
    /// The id the candidate was built under (it becomes that generation
    /// if nothing else activates first).
    pub candidate_generation: GenerationId,
    pub active_generation: GenerationId,
    pub percent: f64,
    /// How long it ran.
    pub seconds: f64,
    /// When it started (RFC 3339, UTC): a report that stays on screen
    /// after it ended says when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    pub verdict: ShadowVerdict,
    /// The figures against the thresholds, in words.
    pub reason: String,
    pub copies: CopyCounts,
    pub total: RouteReport,
    /// The busiest `REPORTED_ROUTES` routes.
    pub routes: Vec<RouteReport>,
    /// Routes tallied in all.
    pub routes_tallied: usize,
    /// A WAF shadow stage's verdicts (DESIGN §24).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waf: Option<WafShadowReport>,
}

impl SideReport {
    /// Both sides' answers as one (a fleet's instances): counts added,
    /// the ratio recomputed, the worse of the quantile bounds.
    fn add(&mut self, other: &SideReport) {
        for (class, n) in &other.status_classes {
            *self.status_classes.entry(class.clone()).or_default() += n;
        }
        self.errors += other.errors;
        let requests: u64 = self.status_classes.values().sum();
        self.error_ratio = self.errors as f64 / requests.max(1) as f64;
        let worse = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.p50_ms = worse(self.p50_ms, other.p50_ms);
        self.p99_ms = worse(self.p99_ms, other.p99_ms);
    }
}

impl RouteReport {
    fn add(&mut self, other: &RouteReport) {
        self.compared += other.compared;
        self.changed_class += other.changed_class;
        self.active.add(&other.active);
        self.candidate.add(&other.candidate);
    }
}

impl ShadowReport {
    /// A report of nothing compared yet.
    pub fn empty(candidate: GenerationId, active: GenerationId, percent: f64) -> Self {
        ShadowReport {
            candidate_generation: candidate,
            active_generation: active,
            percent,
            seconds: 0.0,
            started_at: Some(crate::runtime::rfc3339(std::time::SystemTime::now())),
            verdict: ShadowVerdict::Running,
            reason: String::new(),
            copies: CopyCounts::default(),
            total: RouteTally::default().report("(all routes)"),
            routes: Vec::new(),
            routes_tallied: 0,
            waf: None,
        }
    }

    /// The sum of several instances' reports of one fleet-wide stage
    /// (DESIGN §22: each shadows its own traffic, the sums decide): the
    /// counts added, each quantile the worst instance's (as a fleet
    /// guard takes the worst p99), the longest time, routes by name.
    pub fn sum(reports: &[ShadowReport]) -> Option<ShadowReport> {
        let (first, rest) = reports.split_first()?;
        let mut sum = first.clone();
        for report in rest {
            sum.seconds = sum.seconds.max(report.seconds);
            let (a, b) = (&mut sum.copies, &report.copies);
            a.compared += b.compared;
            a.answered += b.answered;
            a.failed += b.failed;
            a.timeout += b.timeout;
            a.dropped += b.dropped;
            a.skipped += b.skipped;
            sum.total.add(&report.total);
            for route in &report.routes {
                match sum.routes.iter_mut().find(|r| r.route == route.route) {
                    Some(known) => known.add(route),
                    None => sum.routes.push(route.clone()),
                }
            }
            sum.routes_tallied = sum.routes_tallied.max(report.routes_tallied);
            match (&mut sum.waf, &report.waf) {
                (Some(sum), Some(waf)) => sum.add(waf),
                (None, Some(waf)) => sum.waf = Some(waf.clone()),
                (_, None) => {}
            }
        }
        sum.routes
            .sort_by(|a, b| b.compared.cmp(&a.compared).then(a.route.cmp(&b.route)));
        sum.routes.truncate(REPORTED_ROUTES);
        sum.routes_tallied = sum.routes_tallied.max(sum.routes.len());
        Some(sum)
    }
}

// The outcome indices of `Shadow::counted` follow the metric's labels.
const _: () = assert!(COPY_OUTCOMES.len() == 5);

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: f64) -> Duration {
        Duration::from_secs_f64(n / 1000.0)
    }

    #[test]
    fn quantiles_are_bounded_within_a_fifth() {
        let mut h = LogHistogram::default();
        assert_eq!(h.quantile_ms(0.5), None);
        for i in 1..=1000 {
            h.record(ms(f64::from(i) / 10.0));
        }
        let p50 = h.quantile_ms(0.5).unwrap();
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!((50.0..=50.0 * 1.19).contains(&p50), "{p50}");
        assert!((99.0..=99.0 * 1.19).contains(&p99), "{p99}");
        // Past the last bucket: the last bound, not a panic.
        h.record(Duration::from_secs(100_000));
        assert!(h.quantile_ms(1.0).unwrap() > 200_000.0);
        // Zero counts as a microsecond.
        let mut zero = LogHistogram::default();
        zero.record(Duration::ZERO);
        assert!(zero.quantile_ms(0.5).unwrap() < 0.01);
    }

    #[test]
    fn a_tally_keeps_both_sides_per_route_and_counts_changed_classes() {
        let mut route = RouteTally::default();
        let ok = Answer {
            status: 200,
            elapsed: ms(1.0),
        };
        let failed = Answer {
            status: 503,
            elapsed: ms(4.0),
        };
        route.add(ok, ok);
        route.add(ok, failed);
        route.add(failed, failed);
        let report = route.report("api");
        assert_eq!(report.compared, 3);
        assert_eq!(report.changed_class, 1);
        assert_eq!(report.active.errors, 1);
        assert_eq!(report.candidate.errors, 2);
        assert_eq!(report.candidate.status_classes.get("5xx"), Some(&2));
        assert!(!report.active.status_classes.contains_key("4xx"));
        assert!((report.candidate.error_ratio - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn instances_reports_sum_with_the_worst_quantiles() {
        let ok = Answer {
            status: 200,
            elapsed: ms(1.0),
        };
        let slow_failure = Answer {
            status: 502,
            elapsed: ms(40.0),
        };
        let mut a = RouteTally::default();
        a.add(ok, ok);
        let mut b = RouteTally::default();
        b.add(ok, slow_failure);
        b.add(ok, ok);
        let report = |t: &RouteTally, copies: u64| ShadowReport {
            candidate_generation: GenerationId(3),
            active_generation: GenerationId(2),
            percent: 10.0,
            seconds: copies as f64,
            started_at: None,
            verdict: ShadowVerdict::Running,
            reason: String::new(),
            copies: CopyCounts {
                compared: copies,
                ..CopyCounts::default()
            },
            total: t.report("(all routes)"),
            routes: vec![t.report("api")],
            routes_tallied: 1,
            waf: None,
        };
        let sum = ShadowReport::sum(&[report(&a, 1), report(&b, 2)]).unwrap();
        assert_eq!(sum.copies.compared, 3);
        assert_eq!(sum.total.compared, 3);
        assert_eq!(sum.routes.len(), 1);
        assert_eq!(sum.routes[0].compared, 3);
        assert_eq!(sum.total.candidate.errors, 1);
        assert!((sum.total.candidate.error_ratio - 1.0 / 3.0).abs() < 1e-9);
        assert!(sum.total.candidate.p99_ms.unwrap() >= 40.0);
        assert_eq!(sum.seconds, 2.0);
        assert!(ShadowReport::sum(&[]).is_none());
    }
}

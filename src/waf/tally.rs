//! Two firewalls' verdicts on the same requests (DESIGN §24), as a WAF
//! shadow stage and preview's would-block share count them: for each
//! request, whether the active generation's firewall refuses it (blocks
//! it or, in detection mode, would) and whether the candidate's rules,
//! run in detection mode, would; per route of the candidate, with the
//! rules behind the candidate's refusals and a few redacted examples of
//! requests only the candidate refuses.
//!
//! Bounded: at most `MAX_ROUTES` routes tallied (the rest together),
//! `MAX_RULES` rule ids per route (the rest as rule 0), `EXAMPLES`
//! examples per route.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use std::sync::atomic::{AtomicU64, Ordering};

const MAX_ROUTES: usize = 1_000;
const MAX_RULES: usize = 256;
/// Routes a report lists (the busiest), beside its total.
const REPORTED_ROUTES: usize = 50;
/// Rule ids a route's report lists (the most frequent).
const TOP_RULES: usize = 10;
/// Requests only the candidate refuses, kept per route as examples.
const EXAMPLES: usize = 5;
const OTHER_ROUTES: &str = "(other routes)";

/// The tally of one stage, filled by the data plane.
#[derive(Debug, Default)]
pub struct WafTally {
    routes: Mutex<HashMap<Arc<str>, RouteWaf>>,
    /// Requests not evaluated: a body past what the stage keeps, or a
    /// client that went before its body ended.
    skipped: AtomicU64,
    /// Requests not evaluated because `max_inflight` were.
    dropped: AtomicU64,
}

/// One request, as both generations' firewalls judged it.
#[derive(Debug)]
pub struct Judged<'a> {
    /// The active generation refused it (blocked, or would have).
    pub active: bool,
    /// The candidate's rules would refuse it.
    pub candidate: bool,
    /// The rules the candidate's evaluation matched.
    pub rules: &'a [u32],
    pub method: &'a str,
    /// The request's path, without its query (a redacted example).
    pub path: &'a str,
}

#[derive(Debug, Default, Clone)]
struct RouteWaf {
    evaluated: u64,
    active: u64,
    candidate: u64,
    /// Refused by the candidate only, and by the active generation only:
    /// what the interval of the change is computed from (the same
    /// requests judged twice: a paired difference).
    candidate_only: u64,
    active_only: u64,
    /// Rules matched by the candidate's refusals.
    rules: HashMap<u32, u64>,
    examples: Vec<WafExample>,
}

impl RouteWaf {
    fn add(&mut self, judged: &Judged<'_>) {
        self.evaluated += 1;
        self.active += u64::from(judged.active);
        self.candidate += u64::from(judged.candidate);
        self.candidate_only += u64::from(judged.candidate && !judged.active);
        self.active_only += u64::from(judged.active && !judged.candidate);
        if !judged.candidate {
            return;
        }
        for rule in judged.rules {
            let key = if self.rules.len() < MAX_RULES || self.rules.contains_key(rule) {
                *rule
            } else {
                0
            };
            *self.rules.entry(key).or_default() += 1;
        }
        if !judged.active && self.examples.len() < EXAMPLES {
            self.examples.push(WafExample {
                method: judged.method.to_owned(),
                path: judged.path.chars().take(200).collect(),
                rules: judged.rules.to_vec(),
            });
        }
    }

    fn merge(&mut self, other: &RouteWaf) {
        self.evaluated += other.evaluated;
        self.active += other.active;
        self.candidate += other.candidate;
        self.candidate_only += other.candidate_only;
        self.active_only += other.active_only;
        for (rule, n) in &other.rules {
            *self.rules.entry(*rule).or_default() += n;
        }
        let room = EXAMPLES.saturating_sub(self.examples.len());
        self.examples
            .extend(other.examples.iter().take(room).cloned());
    }

    fn report(&self, route: &str) -> WafRouteReport {
        let mut rules: Vec<RuleCount> = self
            .rules
            .iter()
            .map(|(rule, count)| RuleCount {
                rule: *rule,
                count: *count,
            })
            .collect();
        rules.sort_by(|a, b| b.count.cmp(&a.count).then(a.rule.cmp(&b.rule)));
        rules.truncate(TOP_RULES);
        WafRouteReport::new(
            route,
            [
                self.evaluated,
                self.active,
                self.candidate,
                self.candidate_only,
                self.active_only,
            ],
            rules,
            self.examples.clone(),
        )
    }
}

impl WafTally {
    /// Counts a request not evaluated (see `skipped`).
    pub fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request dropped for want of a slot.
    pub fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one request under the candidate's route that took it.
    pub fn judged(&self, route: &Arc<str>, judged: &Judged<'_>) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if routes.len() < MAX_ROUTES || routes.contains_key(route) {
            Arc::clone(route)
        } else {
            Arc::from(OTHER_ROUTES)
        };
        routes.entry(key).or_default().add(judged);
    }

    /// What the evaluations showed so far.
    pub fn report(&self) -> WafShadowReport {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut total = RouteWaf::default();
        for route in routes.values() {
            total.merge(route);
        }
        let mut busiest: Vec<(&Arc<str>, &RouteWaf)> = routes.iter().collect();
        busiest.sort_by(|a, b| b.1.evaluated.cmp(&a.1.evaluated).then(a.0.cmp(b.0)));
        WafShadowReport {
            evaluated: total.evaluated,
            skipped: self.skipped.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            total: total.report("(all routes)"),
            routes: busiest
                .into_iter()
                .take(REPORTED_ROUTES)
                .map(|(name, route)| route.report(name))
                .collect(),
        }
    }
}

/// A rule id and how many of the candidate's refusals matched it (rule
/// 0: the ids past the tally's bound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleCount {
    pub rule: u32,
    pub count: u64,
}

/// A request only the candidate refuses: its method and path (no query,
/// no headers, no body) and the rules it matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WafExample {
    pub method: String,
    pub path: String,
    pub rules: Vec<u32>,
}

/// Both firewalls' verdicts on one route's requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WafRouteReport {
    /// The candidate's route.
    pub route: String,
    pub evaluated: u64,
    /// Refused (or would have been) by the active generation.
    pub active_blocks: u64,
    /// Would be refused by the candidate.
    pub candidate_blocks: u64,
    pub candidate_only: u64,
    pub active_only: u64,
    pub active_ratio: f64,
    pub candidate_ratio: f64,
    /// The 95 % interval of `candidate_ratio` as a share of the traffic
    /// the requests were drawn from (Wilson score interval).
    pub candidate_interval: [f64; 2],
    /// `candidate_ratio - active_ratio`: what `max_block_increase` bounds.
    pub increase: f64,
    /// The increase's 95 % interval (the same requests judged twice: the
    /// normal approximation of a paired difference).
    pub interval: [f64; 2],
    pub top_rules: Vec<RuleCount>,
    pub examples: Vec<WafExample>,
}

impl WafRouteReport {
    /// From `[evaluated, active, candidate, candidate_only, active_only]`.
    fn new(
        route: &str,
        counts: [u64; 5],
        top_rules: Vec<RuleCount>,
        examples: Vec<WafExample>,
    ) -> Self {
        let [evaluated, active, candidate, candidate_only, active_only] = counts;
        let n = evaluated.max(1) as f64;
        let increase = (candidate_only as f64 - active_only as f64) / n;
        let discordant = (candidate_only + active_only) as f64 / n;
        let spread = 1.96 * ((discordant - increase * increase).max(0.0) / n).sqrt();
        WafRouteReport {
            route: route.to_owned(),
            evaluated,
            active_blocks: active,
            candidate_blocks: candidate,
            candidate_only,
            active_only,
            active_ratio: active as f64 / n,
            candidate_ratio: candidate as f64 / n,
            candidate_interval: wilson(candidate, evaluated),
            increase,
            interval: [increase - spread, increase + spread],
            top_rules,
            examples,
        }
    }

    /// Another instance's report of the same route, added (a fleet).
    fn add(&mut self, other: &WafRouteReport) {
        let mut rules: HashMap<u32, u64> =
            self.top_rules.iter().map(|r| (r.rule, r.count)).collect();
        for r in &other.top_rules {
            *rules.entry(r.rule).or_default() += r.count;
        }
        let mut top: Vec<RuleCount> = rules
            .into_iter()
            .map(|(rule, count)| RuleCount { rule, count })
            .collect();
        top.sort_by(|a, b| b.count.cmp(&a.count).then(a.rule.cmp(&b.rule)));
        top.truncate(TOP_RULES);
        let mut examples = std::mem::take(&mut self.examples);
        let room = EXAMPLES.saturating_sub(examples.len());
        examples.extend(other.examples.iter().take(room).cloned());
        *self = WafRouteReport::new(
            &self.route,
            [
                self.evaluated + other.evaluated,
                self.active_blocks + other.active_blocks,
                self.candidate_blocks + other.candidate_blocks,
                self.candidate_only + other.candidate_only,
                self.active_only + other.active_only,
            ],
            top,
            examples,
        );
    }
}

/// The 95 % Wilson score interval of `k` of `n`, as fractions: it stays
/// within 0–1 and keeps its coverage near 0 and 1 and at small `n`,
/// where the normal approximation does not. `[0, 1]` when `n` is 0.
pub fn wilson(k: u64, n: u64) -> [f64; 2] {
    if n == 0 {
        return [0.0, 1.0];
    }
    const Z: f64 = 1.959_963_984_540_054;
    let (k, n) = (k.min(n) as f64, n as f64);
    let p = k / n;
    let z2 = Z * Z;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    [(centre - half).max(0.0), (centre + half).min(1.0)]
}

/// What two firewalls' verdicts showed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WafShadowReport {
    pub evaluated: u64,
    pub skipped: u64,
    pub dropped: u64,
    pub total: WafRouteReport,
    /// The busiest routes.
    pub routes: Vec<WafRouteReport>,
}

impl WafShadowReport {
    /// Several instances' reports of one fleet-wide stage, added.
    pub fn add(&mut self, other: &WafShadowReport) {
        self.evaluated += other.evaluated;
        self.skipped += other.skipped;
        self.dropped += other.dropped;
        self.total.add(&other.total);
        for route in &other.routes {
            match self.routes.iter_mut().find(|r| r.route == route.route) {
                Some(known) => known.add(route),
                None => self.routes.push(route.clone()),
            }
        }
        self.routes
            .sort_by(|a, b| b.evaluated.cmp(&a.evaluated).then(a.route.cmp(&b.route)));
        self.routes.truncate(REPORTED_ROUTES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged<'a>(active: bool, candidate: bool, rules: &'a [u32]) -> Judged<'a> {
        Judged {
            active,
            candidate,
            rules,
            method: "GET",
            path: "/search",
        }
    }

    #[test]
    fn a_tally_pairs_both_verdicts_per_route_with_the_candidates_rules() {
        let tally = WafTally::default();
        let api: Arc<str> = Arc::from("api");
        let web: Arc<str> = Arc::from("web");
        for _ in 0..90 {
            tally.judged(&api, &judged(false, false, &[]));
        }
        for _ in 0..8 {
            tally.judged(&api, &judged(false, true, &[920_273, 949_110]));
        }
        tally.judged(&api, &judged(true, true, &[942_100, 949_110]));
        tally.judged(&api, &judged(true, false, &[]));
        tally.judged(&web, &judged(false, false, &[]));
        let report = tally.report();
        assert_eq!(report.evaluated, 101);
        let api = &report.routes[0];
        assert_eq!(api.route, "api");
        assert_eq!(
            (api.evaluated, api.active_blocks, api.candidate_blocks),
            (100, 2, 9)
        );
        assert_eq!((api.candidate_only, api.active_only), (8, 1));
        assert!((api.increase - 0.07).abs() < 1e-9, "{api:?}");
        // Paired: sqrt((0.09 - 0.0049) / 100) * 1.96 = 0.0572.
        assert!(
            (api.interval[0] - 0.0128).abs() < 1e-3 && (api.interval[1] - 0.1272).abs() < 1e-3,
            "{api:?}"
        );
        assert_eq!(
            api.top_rules[0],
            RuleCount {
                rule: 949_110,
                count: 9
            }
        );
        assert_eq!(api.top_rules[1].rule, 920_273);
        // Examples are the candidate's new refusals only, redacted.
        assert_eq!(api.examples.len(), EXAMPLES);
        assert!(api.examples.iter().all(|e| e.rules[0] == 920_273));
        assert_eq!(report.routes[1].route, "web");
        assert_eq!(report.total.evaluated, 101);
    }

    #[test]
    fn instances_reports_add_up_by_route() {
        let a = WafTally::default();
        let b = WafTally::default();
        let api: Arc<str> = Arc::from("api");
        a.judged(&api, &judged(false, true, &[1]));
        a.judged(&api, &judged(false, false, &[]));
        b.judged(&api, &judged(false, true, &[1]));
        b.judged(&api, &judged(false, true, &[2]));
        let mut sum = a.report();
        sum.add(&b.report());
        assert_eq!(sum.evaluated, 4);
        assert_eq!(sum.routes.len(), 1);
        assert_eq!(sum.routes[0].candidate_blocks, 3);
        assert!((sum.routes[0].increase - 0.75).abs() < 1e-9);
        assert_eq!(sum.routes[0].top_rules[0], RuleCount { rule: 1, count: 2 });
        assert_eq!(sum.total.candidate_only, 3);
    }
}

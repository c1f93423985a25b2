//! The shadow stage of an activation (DESIGN §22): the candidate is
//! planned and built (not made active), installed in the store for
//! `duration` so that copies of live requests go through it
//! (`proxy/shadow.rs`), judged on the pairs of answers, and only then,
//! if it passed, activated through the one commit path (with whatever
//! confirm window, guard or canary steps the activation also asked for).
//!
//! The operation lock is held from the first step to the last: nothing
//! else activates meanwhile, so the generation the copies were compared
//! with is the one the candidate replaces. The stage runs on a task of
//! its own, so that a client that goes away mid-stage cannot leave the
//! candidate installed; an operator stops it with `abort` naming the
//! candidate's generation, and a drain stops it too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::answers::{Activation, Settled};
use super::candidate::{self, Candidate, ShadowSpec};
use super::changes::Changes;
use super::error::ControlError;
use super::expectation::{admit_change, admit_in_freeze, Expectation};
use super::lock::running;
use super::records::Requester;
use crate::generation::{self, Generation, SharedState};
use crate::ids::GenerationId;
use crate::plan::{self};
use crate::runtime::shadow::{Shadow, ShadowReport, ShadowVerdict, SideReport};
use crate::runtime::{OperationKind, PhaseCell};
use crate::waf::tally::WafShadowReport;

/// A shadow stage installed for another writer (`start_shadow`): it
/// ends when this is dropped.
pub struct ShadowHandle {
    store: Arc<crate::runtime::GenerationStore>,
    shadow: Arc<Shadow>,
}

impl ShadowHandle {
    /// What the copies showed so far.
    pub fn report(&self) -> ShadowReport {
        self.shadow.report()
    }
}

impl Drop for ShadowHandle {
    fn drop(&mut self) {
        if self
            .store
            .shadow()
            .is_some_and(|installed| Arc::ptr_eq(&installed, &self.shadow))
        {
            self.store.set_shadow(None);
        }
    }
}

/// Latencies under this count as this in a p99 ratio: at loopback
/// speeds, 0.2 ms against 0.4 ms is noise, not a regression.
const P99_FLOOR_MS: f64 = 1.0;

/// What the pairs so far say: `None` while the stage should go on.
/// A breach is found as soon as `min_requests` pairs show it (in all, or
/// on one route with that many of its own); a pass only at the end.
pub(crate) fn judge(
    spec: &ShadowSpec,
    report: &ShadowReport,
    ended: bool,
) -> Option<(ShadowVerdict, String)> {
    if let Some(max) = spec.max_block_increase {
        return judge_waf(spec, max, report, ended);
    }
    let enough = spec.min_requests.max(1);
    let total = &report.total;
    let thresholds = format!(
        "thresholds max_error_ratio {}, max_p99_ratio {}",
        spec.max_error_ratio,
        spec.max_p99_ratio.map_or("-".to_owned(), |r| r.to_string())
    );
    if total.compared < enough {
        return ended.then(|| {
            (
                ShadowVerdict::NoData,
                format!(
                    "shadow: {} requests compared in {:.0} s, fewer than min_requests {enough} ({} dropped, {} skipped)",
                    total.compared, report.seconds, report.copies.dropped, report.copies.skipped
                ),
            )
        });
    }
    let routes = report.routes.iter().filter(|r| r.compared >= enough);
    for (name, route) in
        std::iter::once(("all routes", total)).chain(routes.map(|r| (r.route.as_str(), r)))
    {
        if let Some(why) = worse(spec, &route.active, &route.candidate) {
            return Some((
                ShadowVerdict::Breached,
                format!(
                    "shadow breached on {name} ({} requests compared): {why}; {thresholds}",
                    route.compared
                ),
            ));
        }
    }
    ended.then(|| {
        (
            ShadowVerdict::Passed,
            format!(
                "shadow passed: {} requests compared; candidate {}, active {}; {thresholds}",
                total.compared,
                figures(&total.candidate),
                figures(&total.active)
            ),
        )
    })
}

/// A WAF shadow stage's verdict (DESIGN §24): a breach as soon as
/// `min_requests` evaluations (in all, or on one route with that many of
/// its own) show the candidate refusing a share of requests more than
/// `max` above the active generation's; a pass only at the end.
fn judge_waf(
    spec: &ShadowSpec,
    max: f64,
    report: &ShadowReport,
    ended: bool,
) -> Option<(ShadowVerdict, String)> {
    let enough = spec.min_requests.max(1);
    let none = WafShadowReport::default();
    let waf = report.waf.as_ref().unwrap_or(&none);
    let threshold = format!("threshold max_block_increase {max}");
    if waf.total.evaluated < enough {
        return ended.then(|| {
            (
                ShadowVerdict::NoData,
                format!(
                    "waf shadow: {} requests evaluated in {:.0} s, fewer than min_requests {enough} ({} dropped, {} skipped)",
                    waf.total.evaluated, report.seconds, waf.dropped, waf.skipped
                ),
            )
        });
    }
    let routes = waf.routes.iter().filter(|r| r.evaluated >= enough);
    for route in std::iter::once(&waf.total).chain(routes) {
        if route.increase > max {
            let rules: Vec<String> = route
                .top_rules
                .iter()
                .take(5)
                .map(|r| format!("{} ({})", r.rule, r.count))
                .collect();
            return Some((
                ShadowVerdict::Breached,
                format!(
                    "waf shadow breached on {} ({} requests evaluated): the candidate would refuse {:.4} ({}), the active generation {:.4} ({}): +{:.4} (95 % interval {:.4} to {:.4}); top rules {}; {threshold}",
                    route.route,
                    route.evaluated,
                    route.candidate_ratio,
                    route.candidate_blocks,
                    route.active_ratio,
                    route.active_blocks,
                    route.increase,
                    route.interval[0],
                    route.interval[1],
                    if rules.is_empty() { "-".to_owned() } else { rules.join(", ") },
                ),
            ));
        }
    }
    let total = &waf.total;
    ended.then(|| {
        (
            ShadowVerdict::Passed,
            format!(
                "waf shadow passed: {} requests evaluated; the candidate would refuse {:.4}, the active generation {:.4} (+{:.4}, 95 % interval {:.4} to {:.4}); {threshold}",
                total.evaluated,
                total.candidate_ratio,
                total.active_ratio,
                total.increase,
                total.interval[0],
                total.interval[1],
            ),
        )
    })
}

/// How the candidate's answers are worse than the active generation's
/// beyond the thresholds, if they are.
fn worse(spec: &ShadowSpec, active: &SideReport, candidate: &SideReport) -> Option<String> {
    if candidate.error_ratio > active.error_ratio + spec.max_error_ratio {
        return Some(format!(
            "error ratio {:.4} against {:.4}",
            candidate.error_ratio, active.error_ratio
        ));
    }
    let max = spec.max_p99_ratio?;
    let (Some(c), Some(a)) = (candidate.p99_ms, active.p99_ms) else {
        return None;
    };
    let ratio = c.max(P99_FLOOR_MS) / a.max(P99_FLOOR_MS);
    (ratio > max).then(|| format!("p99 <= {c:.2} ms against {a:.2} ms ({ratio:.2}x)"))
}

fn figures(side: &SideReport) -> String {
    format!(
        "error ratio {:.4}, p99 <= {}",
        side.error_ratio,
        side.p99_ms.map_or("-".to_owned(), |p| format!("{p:.2} ms"))
    )
}

impl Changes {
    /// An activation with a shadow stage: the stage first (see the
    /// module), then, if it passed, the activation as without one.
    pub(super) async fn activate_shadowed(
        self: &Arc<Self>,
        candidate: Candidate,
        kind: OperationKind,
        spec: ShadowSpec,
    ) -> Result<Activation, ControlError> {
        let this = Arc::clone(self);
        tokio::spawn(async move { this.shadow_stage(candidate, kind, spec).await })
            .await
            .map_err(|e| ControlError::Internal(e.to_string()))?
    }

    async fn shadow_stage(
        self: Arc<Self>,
        candidate: Candidate,
        kind: OperationKind,
        spec: ShadowSpec,
    ) -> Result<Activation, ControlError> {
        let started = Instant::now();
        let requester = Requester::of(&candidate);
        let refused = |c: &Changes, error: ControlError| {
            c.record_failure(kind, started, &requester, &error);
            Err(error)
        };
        let Some(lock) = self.lock.take_owned() else {
            return refused(&self, ControlError::InProgress);
        };
        let planned = {
            let candidate = candidate.clone();
            self.off_the_data_plane(move |c| c.build_shadowed(&candidate))
                .await
        };
        let (active, built) = match planned {
            Ok(Some(built)) => built,
            // Nothing to shadow: the activation answers "unchanged".
            Ok(None) => {
                return self
                    .activate_held(candidate, kind, started, lock, None)
                    .await
            }
            Err(error) => return refused(&self, error),
        };
        let shadow = Arc::new(Shadow::new(
            built,
            active,
            spec.percent,
            spec.max_inflight,
            spec.max_block_increase.is_some(),
        ));
        let stop = self.shadowing.begin(shadow.candidate.id);
        self.store.set_shadow(Some(Arc::clone(&shadow)));
        tracing::info!(candidate = %shadow.candidate.id, %active, percent = spec.percent, duration = ?spec.duration, "shadow stage started");
        let (verdict, reason) = watch(&shadow, &spec, &stop, self.lock.phase()).await;
        self.store.set_shadow(None);
        let mut report = shadow.report();
        drop(shadow);
        report.verdict = verdict;
        report.reason = reason;
        self.shadowing.end(report.clone());
        tracing::info!(verdict = ?report.verdict, reason = %report.reason, "shadow stage ended");
        self.events().emit(
            "shadow_verdict",
            serde_json::json!({ "generation": report.active_generation, "shadow": report }),
        );
        let goes_on = match verdict {
            ShadowVerdict::Passed => true,
            ShadowVerdict::NoData => !spec.fail_on_no_data,
            _ => false,
        };
        if !goes_on {
            let error = ControlError::ShadowRefused(Box::new(report.clone()));
            self.record_failure(kind, started, &requester, &error);
            self.records.attach_shadow(None, report);
            return Err(error);
        }
        self.activate_held(candidate, kind, started, lock, Some(report))
            .await
    }

    /// Plans and builds the candidate beside the active generation (which
    /// it is compared with): `None` when it changes nothing. The same
    /// rules as any change first; a generation pending confirmation
    /// refuses a shadow (its own window would run out meanwhile).
    fn build_shadowed(
        &self,
        candidate: &Candidate,
    ) -> Result<Option<(GenerationId, Arc<Generation>)>, ControlError> {
        self.lock.check_running()?;
        let active = self.store.load_full();
        admit_change(
            Expectation::activation(candidate.expected_generation, &active.spec),
            active.id,
            None,
        )?;
        // Refused before the stage spends its duration (the activation
        // after it is held to the windows again).
        admit_in_freeze(&active.spec, candidate.freeze).map_err(ControlError::Frozen)?;
        if let Some(pending) = self.pending_view() {
            return Err(ControlError::ShadowWhilePending(pending.generation));
        }
        Ok(
            build_candidate(candidate, &active, self.file.path(), &self.shared)?
                .map(|built| (active.id, built)),
        )
    }

    /// The activation, under the operation lock the shadow stage held.
    async fn activate_held(
        self: &Arc<Self>,
        candidate: Candidate,
        kind: OperationKind,
        started: Instant,
        lock: tokio::sync::OwnedMutexGuard<()>,
        report: Option<ShadowReport>,
    ) -> Result<Activation, ControlError> {
        let activation = self
            .off_the_data_plane(move |c| {
                let result = c.lock.check_running().and_then(|()| {
                    c.activate_locked(&candidate, kind, started, c.store.load_full())
                });
                match &result {
                    Err(error) => {
                        c.record_failure(kind, started, &Requester::of(&candidate), error)
                    }
                    Ok(activation) => {
                        if let Some(report) = &report {
                            c.records
                                .attach_shadow(Some(&activation.operation_id), report.clone());
                        }
                    }
                }
                drop(lock);
                result.map(|mut activation| {
                    activation.shadow = report;
                    activation
                })
            })
            .await?;
        self.supervise_new(&activation);
        Ok(activation)
    }

    /// Starts shadowing `candidate` for another writer that judges it (a
    /// fleet's stage: each instance shadows its own traffic, and the
    /// writer sums the reports): built and installed, with no operation
    /// lock held, until the handle is dropped. `None` when the candidate
    /// changes nothing here.
    pub(super) async fn start_shadow(
        self: &Arc<Self>,
        candidate: Candidate,
        (percent, max_inflight, waf): (f64, u32, bool),
    ) -> Result<Option<ShadowHandle>, ControlError> {
        self.off_the_data_plane(move |c| {
            c.lock.check_running()?;
            if c.store.shadow().is_some() {
                return Err(ControlError::InProgress);
            }
            let active = c.store.load_full();
            let Some(built) = build_candidate(&candidate, &active, c.file.path(), &c.shared)?
            else {
                return Ok(None);
            };
            let shadow = Arc::new(Shadow::new(built, active.id, percent, max_inflight, waf));
            c.store.set_shadow(Some(Arc::clone(&shadow)));
            Ok(Some(ShadowHandle {
                store: Arc::clone(&c.store),
                shadow,
            }))
        })
        .await
    }

    /// Once an aborted shadow stage has recorded its refusal: what abort
    /// answers (the active generation is unchanged).
    pub(super) async fn shadow_aborted(
        &self,
        candidate: GenerationId,
    ) -> Result<Settled, ControlError> {
        self.shadowing.ended(candidate).await;
        Ok(Settled {
            outcome: "shadow_aborted".into(),
            generation: self.store.active_id(),
            rolled_back_to: None,
            operation_id: self.records.last_operation_id().unwrap_or_default(),
        })
    }
}

/// Judges the shadow every twentieth of its duration (between 100 ms and
/// 1 s) until it ends, breaches, is stopped or the process drains.
async fn watch(
    shadow: &Shadow,
    spec: &ShadowSpec,
    stop: &tokio::sync::Notify,
    phase: &PhaseCell,
) -> (ShadowVerdict, String) {
    let every = (spec.duration / 20).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let end = tokio::time::Instant::now() + spec.duration;
    loop {
        let next = (tokio::time::Instant::now() + every).min(end);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = stop.notified() => {
                return (ShadowVerdict::Aborted, "shadow aborted by an operator".into());
            }
        }
        if running(phase).is_err() {
            return (
                ShadowVerdict::Interrupted,
                "shadow interrupted: the gateway is draining".into(),
            );
        }
        let ended = tokio::time::Instant::now() >= end;
        if let Some(verdict) = judge(spec, &shadow.report(), ended) {
            return verdict;
        }
    }
}

/// The candidate planned against `active` and built under the next id
/// (its files read beside `config_file`); `None` when it changes nothing.
fn build_candidate(
    candidate: &Candidate,
    active: &Generation,
    config_file: &std::path::Path,
    shared: &SharedState,
) -> Result<Option<Arc<Generation>>, ControlError> {
    let text = candidate::read(&candidate.source, config_file)?;
    let planned = plan::plan(&text, Some((active.id, &active.spec)));
    let (plan, spec) = super::commit::activatable(planned)?;
    if plan.is_unchanged(Some(&active.spec)) {
        return Ok(None);
    }
    let _primed = shared.discovery.prime_blocking(&spec);
    match generation::build_from(spec, active.id.next(), shared, Some(active)) {
        Ok(built) => Ok(Some(Arc::new(built))),
        Err(source) => Err(ControlError::Build {
            source,
            plan: Box::new(plan),
        }),
    }
}

#[cfg(test)]
mod shadow_tests {
    use super::*;
    use crate::runtime::shadow::{CopyCounts, RouteReport};

    fn spec() -> ShadowSpec {
        ShadowSpec {
            percent: 10.0,
            duration: Duration::from_secs(30),
            max_error_ratio: 0.01,
            max_p99_ratio: Some(1.5),
            max_inflight: 64,
            min_requests: 100,
            fail_on_no_data: true,
            max_block_increase: None,
        }
    }

    fn side(requests: u64, errors: u64, p99_ms: f64) -> SideReport {
        SideReport {
            status_classes: Default::default(),
            errors,
            error_ratio: errors as f64 / requests.max(1) as f64,
            p50_ms: Some(p99_ms / 2.0),
            p99_ms: Some(p99_ms),
        }
    }

    fn route(name: &str, compared: u64, active: SideReport, candidate: SideReport) -> RouteReport {
        RouteReport {
            route: name.into(),
            compared,
            changed_class: 0,
            active,
            candidate,
        }
    }

    fn report(total: RouteReport, routes: Vec<RouteReport>) -> ShadowReport {
        ShadowReport {
            candidate_generation: GenerationId(8),
            active_generation: GenerationId(7),
            percent: 10.0,
            seconds: 12.0,
            started_at: None,
            verdict: ShadowVerdict::Running,
            reason: String::new(),
            copies: CopyCounts::default(),
            total,
            routes,
            routes_tallied: 1,
            waf: None,
        }
    }

    #[test]
    fn a_shadow_waits_for_its_data_and_says_no_data_at_the_end() {
        let few = report(route("*", 99, side(99, 0, 2.0), side(99, 99, 2.0)), vec![]);
        assert_eq!(judge(&spec(), &few, false), None);
        let (verdict, reason) = judge(&spec(), &few, true).unwrap();
        assert_eq!(verdict, ShadowVerdict::NoData);
        assert!(reason.contains("99 requests compared"), "{reason}");
    }

    #[test]
    fn a_breach_is_found_early_in_all_or_on_one_busy_route() {
        // 5 % against 1 %: over one point worse.
        let bad = report(
            route("*", 200, side(200, 2, 2.0), side(200, 10, 2.0)),
            vec![],
        );
        let (verdict, reason) = judge(&spec(), &bad, false).unwrap();
        assert_eq!(verdict, ShadowVerdict::Breached);
        assert!(
            reason.contains("error ratio 0.0500 against 0.0100"),
            "{reason}"
        );
        // In all within the threshold, but one route with enough pairs
        // fails entirely.
        let one = report(
            route("*", 10_000, side(10_000, 0, 2.0), side(10_000, 100, 2.0)),
            vec![
                route("big", 9_900, side(9_900, 0, 2.0), side(9_900, 0, 2.0)),
                route("small", 100, side(100, 0, 2.0), side(100, 100, 2.0)),
            ],
        );
        let (verdict, reason) = judge(&spec(), &one, false).unwrap();
        assert_eq!(verdict, ShadowVerdict::Breached);
        assert!(
            reason.contains("on small (100 requests compared)"),
            "{reason}"
        );
        // A route with too few pairs of its own is judged in the total only.
        let thin = report(
            route("*", 10_000, side(10_000, 0, 2.0), side(10_000, 50, 2.0)),
            vec![route("small", 50, side(50, 0, 2.0), side(50, 50, 2.0))],
        );
        assert_eq!(judge(&spec(), &thin, false), None);
        assert_eq!(
            judge(&spec(), &thin, true).unwrap().0,
            ShadowVerdict::Passed
        );
    }

    #[test]
    fn p99_is_compared_as_a_ratio_above_a_millisecond() {
        let slow = report(
            route("*", 500, side(500, 0, 10.0), side(500, 0, 16.0)),
            vec![],
        );
        let (verdict, reason) = judge(&spec(), &slow, false).unwrap();
        assert_eq!(verdict, ShadowVerdict::Breached);
        assert!(reason.contains("(1.60x)"), "{reason}");
        // 0.2 ms against 0.6 ms: both under the floor, no breach.
        let fast = report(
            route("*", 500, side(500, 0, 0.2), side(500, 0, 0.6)),
            vec![],
        );
        assert_eq!(
            judge(&spec(), &fast, true).unwrap().0,
            ShadowVerdict::Passed
        );
        // Without max_p99_ratio, latency does not decide.
        let lax = ShadowSpec {
            max_p99_ratio: None,
            ..spec()
        };
        assert_eq!(judge(&lax, &slow, true).unwrap().0, ShadowVerdict::Passed);
    }

    #[test]
    fn both_failing_alike_is_no_breach() {
        // A backend outage, not the candidate: the same 20 % on both.
        let outage = report(
            route("*", 500, side(500, 100, 2.0), side(500, 104, 2.0)),
            vec![],
        );
        assert_eq!(
            judge(&spec(), &outage, true).unwrap().0,
            ShadowVerdict::Passed
        );
    }

    /// A WAF shadow (DESIGN §24) is judged on the firewalls' verdicts:
    /// no data below `min_requests` evaluations, a breach when the
    /// candidate would refuse more than `max_block_increase` above the
    /// active generation on all routes or on one busy route, naming the
    /// rules; a pass at the end otherwise.
    #[test]
    fn a_waf_shadow_is_judged_on_the_block_increase_per_route() {
        use crate::waf::tally::{Judged, WafTally};
        let waf = ShadowSpec {
            max_block_increase: Some(0.02),
            ..spec()
        };
        let judged = |tally: &WafTally, route: &str, n: usize, active: bool, candidate: bool| {
            let route: Arc<str> = Arc::from(route);
            for _ in 0..n {
                tally.judged(
                    &route,
                    &Judged {
                        active,
                        candidate,
                        rules: if candidate { &[920_350, 949_110] } else { &[] },
                        method: "GET",
                        path: "/",
                    },
                );
            }
        };
        let with = |tally: &WafTally| ShadowReport {
            waf: Some(tally.report()),
            ..report(route("*", 0, side(0, 0, 1.0), side(0, 0, 1.0)), vec![])
        };
        let tally = WafTally::default();
        judged(&tally, "api", 99, false, false);
        assert_eq!(judge(&waf, &with(&tally), false), None);
        let (verdict, reason) = judge(&waf, &with(&tally), true).unwrap();
        assert_eq!(verdict, ShadowVerdict::NoData);
        assert!(reason.contains("99 requests evaluated"), "{reason}");
        // What both refuse is no increase: 10 % on both passes.
        judged(&tally, "api", 10, true, true);
        judged(&tally, "api", 1, false, false);
        assert_eq!(judge(&waf, &with(&tally), false), None);
        let (verdict, reason) = judge(&waf, &with(&tally), true).unwrap();
        assert_eq!(verdict, ShadowVerdict::Passed, "{reason}");
        // A busy route whose candidate refuses 5 % more breaches at once,
        // though all routes together stay within 2 %.
        judged(&tally, "web", 950, false, false);
        judged(&tally, "web", 50, false, true);
        judged(&tally, "api", 2_000, false, false);
        let (verdict, reason) = judge(&waf, &with(&tally), false).unwrap();
        assert_eq!(verdict, ShadowVerdict::Breached);
        assert!(
            reason.contains("on web (1000 requests evaluated)"),
            "{reason}"
        );
        assert!(reason.contains("+0.0500"), "{reason}");
        assert!(reason.contains("920350 (50)"), "{reason}");
        // The copies' answers do not decide a WAF shadow.
        let (verdict, _) = judge(&waf, &with(&WafTally::default()), true).unwrap();
        assert_eq!(verdict, ShadowVerdict::NoData);
    }
}

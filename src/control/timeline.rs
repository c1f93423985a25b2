//! The console's picture over time (`GET /admin/runtime/timeline`): one
//! point a second for the last 15 minutes, per generation role (active,
//! pending, previous: a canary's two sides, a guard's window), of the
//! requests answered, the 5xx among them and the p99 bound; each
//! backend's health as the moments it changed; and the operations of the
//! window (activations, rollbacks, settlements) to mark on the time axis.
//!
//! Read from what already counts (the generations' ledgers, the backends'
//! state) by a task on the control runtime once a second: the request
//! path does nothing more for it. Bounded: `POINTS` points of at most
//! three roles each (224 bytes a point: about 200 KiB), and at most
//! `CHANGES` health changes (32 bytes each) for at most `BACKENDS`
//! backends (about 2 MiB at worst).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::backends::BackendsView;
use crate::ids::GenerationId;
use crate::runtime::{OperationKind, OperationRecord};

/// Seconds kept: 15 minutes.
pub const POINTS: usize = 900;
/// Backends whose health is followed (the first ones seen).
pub const BACKENDS: usize = 1_000;
/// Health changes kept per backend within the window.
pub const CHANGES: usize = 64;

/// One second of one generation role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolePoint {
    /// `active`, `pending` or `previous`.
    pub role: Cow<'static, str>,
    pub generation: GenerationId,
    /// Answered in that second.
    pub requests: u64,
    pub errors: u64,
    /// The bound of their 99th percentile (the request-duration buckets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Unix seconds at the end of the second.
    pub t: u64,
    pub roles: Vec<RolePoint>,
}

/// A backend's health from a moment on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub t: u64,
    /// `healthy`, `unhealthy`, `unknown`, `unchecked` or `ejected`.
    pub state: Cow<'static, str>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendTimeline {
    pub upstream: String,
    pub addr: String,
    /// Oldest first; the first is the state at the window's start (or
    /// when the backend was first seen).
    pub changes: Vec<Change>,
}

/// An operation of the window, to mark on the time axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub t: u64,
    pub kind: crate::runtime::OperationKind,
    pub outcome: crate::runtime::Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationId>,
    pub summary: String,
}

/// What `GET /admin/runtime/timeline` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimelineView {
    pub interval_seconds: u64,
    pub window_seconds: u64,
    pub points: Vec<Point>,
    pub backends: Vec<BackendTimeline>,
    pub events: Vec<Event>,
}

/// The last reading of one generation's ledger.
#[derive(Debug, Clone, Default)]
struct Reading {
    requests: u64,
    errors: u64,
    buckets: Vec<u64>,
}

/// The ring and what the next point is measured from.
#[derive(Debug, Default)]
pub(super) struct Timeline {
    points: VecDeque<Point>,
    last: HashMap<GenerationId, Reading>,
    health: Vec<BackendTimeline>,
    /// Where each followed backend (upstream, address) is in `health`.
    followed: HashMap<(String, String), usize>,
}

impl Timeline {
    /// Adds the point of second `t`: each role's counts since the last
    /// reading of its generation (a generation read for the first time
    /// counts from zero, which is when it started answering).
    /// Takes the point of second `at`: the roles' answers since the last
    /// one, and the backends' health.
    pub fn sample(
        &mut self,
        at: SystemTime,
        roles: &[(&'static str, Arc<crate::generation::Ledger>)],
        backends: &BackendsView,
    ) {
        let t = unix_seconds(at);
        self.add(t, roles);
        self.observe(t, backends);
    }

    /// A copy of the window: its points and each backend's health.
    pub fn window(&self) -> (Vec<Point>, Vec<BackendTimeline>) {
        (self.points.iter().cloned().collect(), self.health.clone())
    }

    fn add(&mut self, t: u64, roles: &[(&'static str, Arc<crate::generation::Ledger>)]) {
        let mut last = HashMap::with_capacity(roles.len());
        let mut point = Point {
            t,
            roles: Vec::with_capacity(roles.len()),
        };
        for (role, ledger) in roles {
            let now = Reading {
                requests: ledger.requests.get(),
                errors: ledger.errors.get(),
                buckets: ledger.duration.counts(),
            };
            let before = self.last.remove(&ledger.generation()).unwrap_or_default();
            let delta: Vec<u64> = now
                .buckets
                .iter()
                .enumerate()
                .map(|(i, n)| n.saturating_sub(before.buckets.get(i).copied().unwrap_or(0)))
                .collect();
            point.roles.push(RolePoint {
                role: Cow::Borrowed(role),
                generation: ledger.generation(),
                requests: now.requests.saturating_sub(before.requests),
                errors: now.errors.saturating_sub(before.errors),
                p99_ms: crate::telemetry::series::quantile_bound_of(
                    ledger.duration.bounds(),
                    &delta,
                    0.99,
                )
                .map(|s| s * 1000.0),
            });
            last.insert(ledger.generation(), now);
        }
        self.last = last;
        if self.points.len() == POINTS {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }

    /// Notes each backend's state at second `t` where it changed.
    fn observe(&mut self, t: u64, backends: &BackendsView) {
        let oldest = t.saturating_sub(POINTS as u64);
        for upstream in &backends.upstreams {
            for backend in &upstream.backends {
                let state: Cow<'static, str> = if backend.ejected {
                    Cow::Borrowed("ejected")
                } else {
                    Cow::Borrowed(backend.health.name())
                };
                let key = (upstream.name.clone(), backend.addr.clone());
                let index = match self.followed.get(&key) {
                    Some(index) => *index,
                    None if self.health.len() < BACKENDS => {
                        self.health.push(BackendTimeline {
                            upstream: key.0.clone(),
                            addr: key.1.clone(),
                            changes: Vec::new(),
                        });
                        self.followed.insert(key, self.health.len() - 1);
                        self.health.len() - 1
                    }
                    None => continue,
                };
                let Some(entry) = self.health.get_mut(index) else {
                    continue;
                };
                if entry.changes.last().is_some_and(|c| c.state == state) {
                    continue;
                }
                entry.changes.push(Change { t, state });
                // Past the window or the cap, the oldest change goes; the
                // one before the window's start stays as its first state.
                while entry.changes.len() > CHANGES
                    || (entry.changes.len() > 1 && entry.changes[1].t <= oldest)
                {
                    entry.changes.remove(0);
                }
            }
        }
    }
}

/// The view of a window (`Timeline::window`) at `now`, with the
/// operations of the log (newest first) that fall within it, oldest first.
pub fn view<'a>(
    points: Vec<Point>,
    backends: Vec<BackendTimeline>,
    now: SystemTime,
    operations: impl Iterator<Item = &'a OperationRecord>,
) -> TimelineView {
    let since = unix_seconds(now).saturating_sub(POINTS as u64);
    let events = operations
        .filter_map(|o| {
            let t = unix_seconds(humantime::parse_rfc3339(&o.at).ok()?);
            (t >= since && o.kind != OperationKind::Preview).then(|| Event {
                t,
                kind: o.kind,
                outcome: o.outcome,
                generation: o.generation,
                summary: o.summary.clone(),
            })
        })
        .collect::<Vec<_>>();
    TimelineView {
        interval_seconds: 1,
        window_seconds: POINTS as u64,
        points,
        backends,
        events: events.into_iter().rev().collect(),
    }
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod timeline_tests {
    use std::time::Duration;

    use super::*;
    use crate::control::backends::UpstreamView;
    use crate::generation::Ledger;

    #[test]
    fn the_ring_keeps_fifteen_minutes_of_per_second_deltas_per_role() {
        let mut timeline = Timeline::default();
        let active = Arc::new(Ledger::new(GenerationId(2)));
        let previous = Arc::new(Ledger::new(GenerationId(1)));
        previous.answered(200, Duration::from_millis(3));
        for t in 0..(POINTS as u64 + 100) {
            for _ in 0..3 {
                active.answered(200, Duration::from_micros(300));
            }
            active.answered(503, Duration::from_millis(40));
            timeline.add(
                t,
                &[
                    ("active", Arc::clone(&active)),
                    ("previous", Arc::clone(&previous)),
                ],
            );
        }
        assert_eq!(timeline.points.len(), POINTS, "bounded");
        assert_eq!(timeline.points.front().map(|p| p.t), Some(100));
        let last = timeline.points.back().unwrap();
        let active_point = &last.roles[0];
        assert_eq!((active_point.requests, active_point.errors), (4, 1));
        assert_eq!(active_point.p99_ms, Some(50.0), "the 50 ms bucket");
        // Nothing more on the previous generation: zero per second.
        assert_eq!(last.roles[1].requests, 0);
        // Only the generations of the last point are remembered.
        assert_eq!(timeline.last.len(), 2);
    }

    #[test]
    fn the_bound_the_docs_state_holds() {
        // Three roles and the point itself, per second: 224 bytes.
        let point = 3 * std::mem::size_of::<RolePoint>() + std::mem::size_of::<Point>();
        assert!(point <= 224, "{point}");
        assert!(point * POINTS <= 200 * 1024);
        assert!(std::mem::size_of::<Change>() * CHANGES * BACKENDS <= 2 * 1024 * 1024);
    }

    #[test]
    fn health_keeps_its_changes_bounded_per_backend_and_in_backends() {
        let mut timeline = Timeline::default();
        let view = |healthy: bool, n: usize| BackendsView {
            active_generation: GenerationId(1),
            upstreams: vec![UpstreamView {
                name: "app".into(),
                policy: "round_robin".into(),
                backends: (0..n)
                    .map(|i| crate::backends::BackendView {
                        addr: format!("10.0.0.{i}:80"),
                        protocol: "http1".into(),
                        health: if healthy {
                            crate::backends::HealthState::Healthy
                        } else {
                            crate::backends::HealthState::Unhealthy
                        },
                        last_check: None,
                        ejected: false,
                        ejected_until_unix_ms: None,
                        ejections: 0,
                        inflight: 0,
                        ewma_ms: None,
                        attempts: 0,
                        failures: 0,
                        generations: vec![1],
                        source: None,
                        weight: None,
                        priority: None,
                    })
                    .collect(),
                sources: Vec::new(),
            }],
        };
        // A flapping backend, for longer than the window.
        for t in 0..2_000u64 {
            timeline.observe(t, &view(t % 2 == 0, 1));
        }
        let changes = &timeline.health[0].changes;
        assert!(changes.len() <= CHANGES, "{}", changes.len());
        assert_eq!(changes.last().map(|c| c.t), Some(1_999));
        // Steady: one change, whatever the time.
        let mut steady = Timeline::default();
        for t in 0..100 {
            steady.observe(t, &view(true, 1));
        }
        assert_eq!(steady.health[0].changes.len(), 1);
        // More backends than followed: the first BACKENDS.
        let mut many = Timeline::default();
        many.observe(0, &view(true, BACKENDS + 500));
        assert_eq!(many.health.len(), BACKENDS);
    }
}

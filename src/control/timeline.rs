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
//! three roles each (248 bytes a point: about 220 KiB; a second in which
//! generations change roles also lists the ones that left), and at most
//! `CHANGES` health changes (32 bytes each) for at most `BACKENDS`
//! backends (about 2 MiB at worst).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

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
    /// Of them, refused by the web application firewall (DESIGN §24).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub blocked: u64,
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

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The last reading of one generation's ledger.
#[derive(Debug, Clone, Default)]
struct Reading {
    requests: u64,
    errors: u64,
    blocked: u64,
    buckets: Vec<u64>,
}

/// The ring and what the next point is measured from.
#[derive(Debug, Default)]
pub(super) struct Timeline {
    points: VecDeque<Point>,
    /// Each role's generation at the last point: its reading, its role
    /// and its ledger (read once more when it leaves its role, so that
    /// the answers of its last second are not lost).
    last: HashMap<GenerationId, (Reading, &'static str, Arc<crate::generation::Ledger>)>,
    health: Vec<BackendTimeline>,
    /// Where each followed backend is in `health`: by upstream, then by
    /// address (looked up by `&str`, nothing allocated once followed).
    followed: HashMap<String, HashMap<String, usize>>,
    /// The backends' state-change count and the active generation at the
    /// last look at the backends: while neither moves, no backend's
    /// state can have, and the next second looks at none of them.
    looked: Option<(u64, GenerationId)>,
}

impl Timeline {
    /// Takes the point of second `at`: the roles' answers since the last
    /// one, and the health of `active`'s backends if any backend's state
    /// or membership changed (`changes`, read before `active` was loaded:
    /// a change while this looks is looked at again next second) or the
    /// active generation did since the last look.
    pub fn sample(
        &mut self,
        at: SystemTime,
        roles: &[(&'static str, Arc<crate::generation::Ledger>)],
        changes: u64,
        active: &crate::generation::Generation,
    ) {
        let t = unix_seconds(at);
        self.add(t, roles);
        if self.looked == Some((changes, active.id)) {
            return;
        }
        let mut upstreams: Vec<_> = active.upstreams().collect();
        upstreams.sort_by(|a, b| a.name.cmp(&b.name));
        let members: Vec<_> = upstreams.iter().map(|u| (&u.name, u.members())).collect();
        self.observe(
            t,
            members.iter().flat_map(|(upstream, members)| {
                members
                    .backends
                    .iter()
                    .map(|b| (upstream.as_str(), b.key.addr.as_str(), b.state_name()))
            }),
        );
        self.looked = Some((changes, active.id));
    }

    /// A copy of the window at `now`: its points and each backend's
    /// health, from the state it had when the window starts.
    pub fn window(&self, now: SystemTime) -> (Vec<Point>, Vec<BackendTimeline>) {
        let oldest = unix_seconds(now).saturating_sub(POINTS as u64);
        let health = self
            .health
            .iter()
            .map(|backend| {
                // The last change at or before the window's start is the
                // state it starts with; older ones are outside it.
                let from = backend
                    .changes
                    .iter()
                    .rposition(|c| c.t <= oldest)
                    .unwrap_or(0);
                BackendTimeline {
                    upstream: backend.upstream.clone(),
                    addr: backend.addr.clone(),
                    changes: backend.changes[from..].to_vec(),
                }
            })
            .collect();
        (self.points.iter().cloned().collect(), health)
    }

    fn add(&mut self, t: u64, roles: &[(&'static str, Arc<crate::generation::Ledger>)]) {
        let mut last = HashMap::with_capacity(roles.len());
        let mut point = Point {
            t,
            roles: Vec::with_capacity(roles.len()),
        };
        for (role, ledger) in roles {
            let before = self
                .last
                .remove(&ledger.generation())
                .map(|(reading, ..)| reading)
                .unwrap_or_default();
            let (now, answered) = Self::answered(role, ledger, &before);
            point.roles.push(answered);
            last.insert(ledger.generation(), (now, *role, Arc::clone(ledger)));
        }
        // A generation that left its role since the last point (a
        // rollback, a confirmation, a canary's end): what it answered in
        // that second, under the role it had.
        for (before, role, ledger) in std::mem::replace(&mut self.last, last).into_values() {
            let (_, answered) = Self::answered(role, &ledger, &before);
            if answered.requests > 0 {
                point.roles.push(answered);
            }
        }
        if self.points.len() == POINTS {
            self.points.pop_front();
        }
        self.points.push_back(point);
    }

    /// `ledger`'s reading now, and what it answered since `before`.
    fn answered(
        role: &'static str,
        ledger: &crate::generation::Ledger,
        before: &Reading,
    ) -> (Reading, RolePoint) {
        let now = Reading {
            requests: ledger.requests.get(),
            errors: ledger.errors.get(),
            blocked: ledger.waf_blocked.get(),
            buckets: ledger.duration.counts(),
        };
        let delta: Vec<u64> = now
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| n.saturating_sub(before.buckets.get(i).copied().unwrap_or(0)))
            .collect();
        let point = RolePoint {
            role: Cow::Borrowed(role),
            generation: ledger.generation(),
            requests: now.requests.saturating_sub(before.requests),
            errors: now.errors.saturating_sub(before.errors),
            blocked: now.blocked.saturating_sub(before.blocked),
            p99_ms: crate::telemetry::series::quantile_bound_of(
                ledger.duration.bounds(),
                &delta,
                0.99,
            )
            .map(|s| s * 1000.0),
        };
        (now, point)
    }

    /// Notes the state of each backend (upstream, address, state) at
    /// second `t` where it changed.
    fn observe<'a>(
        &mut self,
        t: u64,
        backends: impl Iterator<Item = (&'a str, &'a str, &'static str)>,
    ) {
        let oldest = t.saturating_sub(POINTS as u64);
        for (upstream, addr, state) in backends {
            let followed = self
                .followed
                .get(upstream)
                .and_then(|addrs| addrs.get(addr))
                .copied();
            let index = match followed {
                Some(index) => index,
                None if self.health.len() < BACKENDS => {
                    self.health.push(BackendTimeline {
                        upstream: upstream.to_owned(),
                        addr: addr.to_owned(),
                        changes: Vec::new(),
                    });
                    let index = self.health.len() - 1;
                    self.followed
                        .entry(upstream.to_owned())
                        .or_default()
                        .insert(addr.to_owned(), index);
                    index
                }
                None => continue,
            };
            let Some(entry) = self.health.get_mut(index) else {
                continue;
            };
            if entry.changes.last().is_some_and(|c| c.state == state) {
                continue;
            }
            entry.changes.push(Change {
                t,
                state: Cow::Borrowed(state),
            });
            // Past the window or the cap, the oldest change goes; the one
            // before the window's start stays as its first state.
            while entry.changes.len() > CHANGES
                || (entry.changes.len() > 1 && entry.changes[1].t <= oldest)
            {
                entry.changes.remove(0);
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

    /// A rollback's own second: the pending generation and its previous
    /// one leave their roles, and what they answered in that second is
    /// still in its point, under the roles they had.
    #[test]
    fn a_generation_leaving_its_role_keeps_its_last_seconds_answers() {
        let mut timeline = Timeline::default();
        let previous = Arc::new(Ledger::new(GenerationId(4)));
        let pending = Arc::new(Ledger::new(GenerationId(5)));
        let restored = Arc::new(Ledger::new(GenerationId(6)));
        timeline.add(
            1,
            &[
                ("pending", Arc::clone(&pending)),
                ("previous", Arc::clone(&previous)),
            ],
        );
        // In second 2: both answer, then the rollback makes 6 active.
        for _ in 0..7 {
            pending.answered(500, Duration::from_millis(1));
        }
        for _ in 0..3 {
            previous.answered(200, Duration::from_millis(1));
        }
        restored.answered(200, Duration::from_millis(1));
        timeline.add(
            2,
            &[
                ("active", Arc::clone(&restored)),
                ("previous", Arc::clone(&pending)),
            ],
        );
        let point = timeline.points.back().unwrap();
        let of = |g: u64| {
            point
                .roles
                .iter()
                .find(|r| r.generation == GenerationId(g))
                .map(|r| (r.role.to_string(), r.requests, r.errors))
        };
        assert_eq!(of(6), Some(("active".into(), 1, 0)));
        assert_eq!(of(5), Some(("previous".into(), 7, 7)));
        assert_eq!(of(4), Some(("previous".into(), 3, 0)), "{point:?}");
        // Gone for good: not listed in the next second.
        timeline.add(
            3,
            &[
                ("active", Arc::clone(&restored)),
                ("previous", Arc::clone(&pending)),
            ],
        );
        assert_eq!(timeline.points.back().unwrap().roles.len(), 2);
    }

    #[test]
    fn the_bound_the_docs_state_holds() {
        // Three roles and the point itself, per second: 248 bytes (the
        // firewall's `blocked` added 8 a role).
        let point = 3 * std::mem::size_of::<RolePoint>() + std::mem::size_of::<Point>();
        assert!(point <= 248, "{point}");
        assert!(point * POINTS <= 220 * 1024);
        assert!(std::mem::size_of::<Change>() * CHANGES * BACKENDS <= 2 * 1024 * 1024);
    }

    #[test]
    fn health_keeps_its_changes_bounded_per_backend_and_in_backends() {
        let mut timeline = Timeline::default();
        let addrs: Vec<String> = (0..BACKENDS + 500)
            .map(|i| format!("10.0.{}.{}:80", i / 256, i % 256))
            .collect();
        let view = |healthy: bool, n: usize| {
            let state = if healthy { "healthy" } else { "unhealthy" };
            addrs[..n].iter().map(move |a| ("app", a.as_str(), state))
        };
        // A flapping backend, for longer than the window.
        for t in 0..2_000u64 {
            timeline.observe(t, view(t % 2 == 0, 1));
        }
        let changes = &timeline.health[0].changes;
        assert!(changes.len() <= CHANGES, "{}", changes.len());
        assert_eq!(changes.last().map(|c| c.t), Some(1_999));
        // Steady: one change, whatever the time.
        let mut steady = Timeline::default();
        for t in 0..100 {
            steady.observe(t, view(true, 1));
        }
        assert_eq!(steady.health[0].changes.len(), 1);
        // More backends than followed: the first BACKENDS.
        let mut many = Timeline::default();
        many.observe(0, view(true, BACKENDS + 500));
        assert_eq!(many.health.len(), BACKENDS);
    }

    #[test]
    fn the_window_starts_each_backend_at_its_state_when_the_window_starts() {
        // A backend that flapped long ago and has been steady since: no
        // look trims it (nothing changed), the window does.
        let mut timeline = Timeline::default();
        for (t, state) in [
            (10, "unknown"),
            (20, "healthy"),
            (30, "unhealthy"),
            (40, "healthy"),
        ] {
            timeline.observe(t, std::iter::once(("app", "10.0.0.1:80", state)));
        }
        let at = |t: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(t);
        let (_, health) = timeline.window(at(35 + POINTS as u64));
        let kept: Vec<_> = health[0].changes.iter().map(|c| (c.t, &*c.state)).collect();
        assert_eq!(kept, [(30, "unhealthy"), (40, "healthy")]);
        let (_, health) = timeline.window(at(10_000));
        assert_eq!(health[0].changes.len(), 1, "steady since before the window");
        assert_eq!(health[0].changes[0].state, "healthy");
    }
}

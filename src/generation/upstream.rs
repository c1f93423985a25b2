//! An upstream in one generation: its members (handles into the
//! process-shared `backends` registry) and how it picks one for a
//! request. Every policy skips backends that are unhealthy or ejected;
//! when none is left, it fails open to all of them (DESIGN §12).
//!
//! Members are fixed (`addr` entries: the generation holds them) or
//! follow discovery sources (`members.rs`: swapped without a generation,
//! DESIGN §20). A request takes the members of the moment once
//! ([`Upstream::members`]) and picks, retries and reports within them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::members::{Members, MembersRef, Membership, Tier};
use crate::backends::{Attempt, Backend, BackendError, RetryBudget, Usable};
use crate::plan::{HashKey, OutlierSpec, Policy, UpstreamSpec};

/// An upstream in one generation: its members and how to pick one.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub policy: Policy,
    pub outlier: OutlierSpec,
    slow_start: Option<Duration>,
    cursor: AtomicUsize,
    /// Shared with every generation that has an upstream of this name.
    budget: Arc<RetryBudget>,
    /// For `hash`: what is hashed, and the load bound.
    pub hash_key: Option<HashKey>,
    hash_balance_factor: Option<u32>,
    /// For connections of `tcp` listeners: the PROXY header they start with.
    pub proxy_protocol: Option<crate::plan::ProxyProtocol>,
    http2: bool,
    roster: Roster,
}

/// Where an upstream's members are. Fixed members are inline on purpose:
/// a pick reads them without a pointer to chase, and there is one per
/// upstream.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Roster {
    /// Only `addr` entries: fixed for the generation's life.
    Fixed(Members),
    /// With `dns`, `srv` or `endpoints_file` entries.
    Discovered(Arc<Membership>),
}

/// The least share of its turns a backend in slow start is offered.
const SLOW_START_FLOOR: f64 = 0.1;

impl Upstream {
    /// Builds the upstream, reusing live backends and sources from
    /// `shared`.
    pub fn build(spec: &UpstreamSpec, shared: &super::SharedState) -> Result<Self, BackendError> {
        let roster = if spec.sources.is_empty() {
            let fixed = super::members::fixed(spec, &shared.backends)?;
            Roster::Fixed(Members::new(fixed, spec.policy))
        } else {
            Roster::Discovered(Membership::start(spec, shared)?)
        };
        Ok(Self {
            name: spec.name.clone(),
            policy: spec.policy,
            outlier: spec.outlier,
            slow_start: spec.slow_start,
            cursor: AtomicUsize::new(0),
            budget: shared.backends.budget(&spec.name),
            hash_key: spec.hash_key.clone(),
            hash_balance_factor: spec.hash_balance_factor,
            proxy_protocol: spec.proxy_protocol,
            http2: spec.protocol.is_http2(),
            roster,
        })
    }

    /// Its members now: what one request picks, retries and reports
    /// within (a discovered set changing meanwhile does not move it).
    #[inline]
    pub fn members(&self) -> MembersRef<'_> {
        match &self.roster {
            Roster::Fixed(members) => MembersRef::Fixed(members),
            Roster::Discovered(membership) => MembersRef::Shared(membership.current()),
        }
    }

    /// Its discovery sources (none for fixed members).
    pub fn membership(&self) -> Option<&Arc<Membership>> {
        match &self.roster {
            Roster::Fixed(_) => None,
            Roster::Discovered(membership) => Some(membership),
        }
    }

    /// Notes that generation `id` was built with this upstream.
    pub fn named_by(&self, id: u64) {
        match &self.roster {
            Roster::Fixed(members) => members.backends.iter().for_each(|b| b.named_by(id)),
            Roster::Discovered(membership) => membership.named_by(id),
        }
    }

    /// Whether its backends speak HTTP/2 (`h2c`, `h2`), as gRPC needs.
    pub fn speaks_http2(&self) -> bool {
        self.http2
    }

    /// The backend for the next request: by the policy, among those that
    /// pass their checks and are not ejected, in the most preferred
    /// priority that has one; when there are none, by the policy among
    /// all of the first priority's (fail open, counted). `None` only when
    /// the upstream has no members at all.
    pub fn pick<'m>(&self, members: &'m Members) -> Option<&'m Arc<Backend>> {
        let chosen = if members.is_tiered() {
            members.tiers().find_map(|tier| {
                let backends = members.backends.get(tier.start..tier.end)?;
                self.pick_in(tier, backends)
            })
        } else {
            // Nearly always: one priority, all the members.
            self.pick_in(members.first_tier(), &members.backends)
        };
        if chosen.is_some() {
            return chosen;
        }
        let tier = members.first_tier();
        let backends = members.backends.get(tier.start..tier.end)?;
        if members.backends.len() > 1 || backends.first().is_some_and(|b| !b.is_available()) {
            self.budget.fail_open.add(1);
        }
        let turn = self.cursor.fetch_add(1, Ordering::Relaxed);
        backends.get(self.scheduled(tier, turn))
    }

    /// By the policy, among the usable members of one tier.
    #[inline]
    fn pick_in<'m>(&self, tier: &Tier, backends: &'m [Arc<Backend>]) -> Option<&'m Arc<Backend>> {
        match self.policy {
            // `pick_hashed` is for requests with a key; without one,
            // hashing falls back to round-robin, as HAProxy's does.
            Policy::RoundRobin | Policy::Weighted | Policy::Hash => {
                self.pick_scheduled(tier, backends)
            }
            Policy::LeastRequests => self.pick_two(tier, backends, |b| b.inflight() as f64),
            Policy::P2c => self.pick_two(tier, backends, |b| b.load.cost()),
        }
    }

    /// The backend for the next attempt of a request or connection that
    /// has tried the backends in `tried` (their addresses; the pick is
    /// added): the key's backend first (`hash`, when it has one), then by
    /// the policy one not tried yet, if the upstream has any left.
    pub fn pick_untried<'m>(
        &self,
        members: &'m Members,
        hash: Option<u64>,
        tried: &mut Vec<usize>,
    ) -> Option<&'m Arc<Backend>> {
        let address = |backend: &Arc<Backend>| Arc::as_ptr(backend) as usize;
        if let Some(hash) = hash.filter(|_| tried.is_empty()) {
            let backend = self.pick_hashed(members, hash)?;
            tried.push(address(backend));
            return Some(backend);
        }
        let mut picked = None;
        for _ in 0..members.backends.len().max(1) {
            let backend = self.pick(members)?;
            let fresh = !tried.contains(&address(backend));
            picked = Some(backend);
            if fresh {
                break;
            }
        }
        let backend = picked?;
        tried.push(address(backend));
        Some(backend)
    }

    /// Whether attempts should be timed: only `p2c` reads the latency
    /// estimate, and a clock read per request is not free.
    pub fn measures_latency(&self) -> bool {
        self.policy == Policy::P2c
    }

    pub fn budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// The backend for a request whose `hash_key` hashes to `hash`: the
    /// owner of its Maglev slot, or, when that one is unusable or over
    /// `hash_balance_factor` of the average load, the next in the key's
    /// walk (the same order for every request with that key); in the
    /// next priority when the first has none usable.
    pub fn pick_hashed<'m>(&self, members: &'m Members, hash: u64) -> Option<&'m Arc<Backend>> {
        if members.first_tier().maglev.is_empty() {
            // Not a hashing upstream: no key to follow.
            return self.pick(members);
        }
        for tier in members.tiers() {
            let backends = members
                .backends
                .get(tier.start..tier.end)
                .unwrap_or_default();
            if let Some(backend) = self.hashed_in(tier, backends, hash) {
                return Some(backend);
            }
        }
        self.budget.fail_open.add(1);
        let tier = members.first_tier();
        tier.maglev
            .walk(hash)
            .next()
            .and_then(|i| members.backends.get(tier.start + i))
    }

    fn hashed_in<'m>(
        &self,
        tier: &Tier,
        backends: &'m [Arc<Backend>],
        hash: u64,
    ) -> Option<&'m Arc<Backend>> {
        let n = backends.len();
        let mut total = None;
        let mut overloaded = None;
        let mut previous = usize::MAX;
        // Bounded: far more steps than distinct backends a walk needs.
        for index in tier.maglev.walk(hash).take(4 * n + 16) {
            if index == previous {
                continue;
            }
            previous = index;
            let Some(backend) = backends.get(index) else {
                continue;
            };
            if let Some(factor) = self.hash_balance_factor {
                let load = backend.inflight();
                // An idle backend is under any bound: no sum needed.
                if load > 0 {
                    let bound =
                        |total: u64| ((total + 1) * u64::from(factor)).div_ceil(100 * n as u64);
                    let (mut sum, mut exact) =
                        *total.get_or_insert_with(|| (tier.total_load(backends), false));
                    // A recent sum may lag a burst: before calling a
                    // backend overloaded, make sure with an exact one.
                    if load + 1 > bound(sum) && !exact {
                        (sum, exact) = (tier.total_load_now(backends), true);
                        total = Some((sum, exact));
                    }
                    if load + 1 > bound(sum) {
                        if overloaded.is_none() && backend.is_available() {
                            overloaded = Some(backend);
                        }
                        continue;
                    }
                }
            }
            if self.takes(backend) {
                return Some(backend);
            }
        }
        overloaded
    }

    /// The backend index (within the tier) of turn `turn` under
    /// round-robin or weighted.
    fn scheduled(&self, tier: &Tier, turn: usize) -> usize {
        match self.policy {
            Policy::Weighted => tier.schedule.pick(turn as u64),
            _ => turn % (tier.end - tier.start).max(1),
        }
    }

    fn pick_scheduled<'m>(
        &self,
        tier: &Tier,
        backends: &'m [Arc<Backend>],
    ) -> Option<&'m Arc<Backend>> {
        let turn = self.cursor.fetch_add(1, Ordering::Relaxed);
        // Nearly always: the scheduled backend takes it.
        let first = backends.get(self.scheduled(tier, turn))?;
        if self.takes(first) {
            return Some(first);
        }
        self.pick_scheduled_after(tier, backends, turn)
    }

    /// The first usable backend after turn `turn`'s.
    #[cold]
    fn pick_scheduled_after<'m>(
        &self,
        tier: &Tier,
        backends: &'m [Arc<Backend>],
        turn: usize,
    ) -> Option<&'m Arc<Backend>> {
        let n = backends.len();
        // The turns after this one first, so that the schedule's spread
        // holds among the backends left; then any backend at all.
        (1..n)
            .map(|k| self.scheduled(tier, turn.wrapping_add(k)))
            .chain((0..n).map(|k| (turn + k) % n))
            .filter_map(|i| backends.get(i))
            .find(|b| self.takes(b))
    }

    /// Power of two choices: two distinct backends at random (drawn in
    /// proportion to their weights, when they differ), the one with the
    /// lower `cost` wins, the first drawn on a tie: weights set how often
    /// a member is offered, load decides among the offered.
    fn pick_two<'m>(
        &self,
        tier: &Tier,
        backends: &'m [Arc<Backend>],
        cost: impl Fn(&Backend) -> f64,
    ) -> Option<&'m Arc<Backend>> {
        let n = backends.len();
        if n < 2 {
            return backends.first().filter(|b| self.takes(b));
        }
        let (first, second) = if self.policy.honours_weights() {
            tier.two_by_weight()
        } else {
            Tier::two_alike(n)
        };
        let (a, b) = (backends.get(first)?, backends.get(second)?);
        // A backend whose ejection just ended takes its probe at once.
        let a_ok = self.takes(a);
        if a_ok && a.outlier.is_ejected() {
            return Some(a);
        }
        let b_ok = self.takes(b);
        if b_ok && b.outlier.is_ejected() {
            return Some(b);
        }
        match (a_ok, b_ok) {
            (true, true) => Some(if cost(b) < cost(a) { b } else { a }),
            (true, false) => Some(a),
            (false, true) => Some(b),
            (false, false) => {
                let start = fastrand::usize(..n);
                (0..n)
                    .filter_map(|k| backends.get((start + k) % n))
                    .find(|b| self.takes(b))
            }
        }
    }

    /// Whether `backend` takes this request: checks and outlier state
    /// allow it, and slow start, if it is ramping, offers it this turn.
    #[inline]
    fn takes(&self, backend: &Backend) -> bool {
        if let (Some(ramp), Some(recovered)) = (self.slow_start, backend.health.recovered_at()) {
            let elapsed = Duration::from_millis(crate::clock::now_ms().saturating_sub(recovered));
            let share = (elapsed.as_secs_f64() / ramp.as_secs_f64()).max(SLOW_START_FLOOR);
            if share < 1.0 && fastrand::f64() >= share {
                return false;
            }
        }
        backend.usable() == Usable::Yes
    }

    /// Records how an attempt at `backend` (one of its members) ended,
    /// with the time to its answer, and ejects the backend when outlier
    /// detection asks and at most `max_ejected_percent` of the members
    /// would then be out.
    pub fn report(&self, backend: &Backend, attempt: Attempt, rtt: Option<Duration>) {
        if let (Attempt::Answered(_), Some(rtt)) = (attempt, rtt) {
            backend.load.observe(rtt);
        }
        if !backend.record(attempt, &self.outlier) {
            return;
        }
        let members = self.members();
        let ejected = members
            .backends
            .iter()
            .filter(|b| b.outlier.is_ejected())
            .count();
        let after = ejected + usize::from(!backend.outlier.is_ejected());
        let limit = self.outlier.max_ejected_percent as usize * members.backends.len();
        if after * 100 <= limit {
            backend.eject(&self.outlier);
        } else {
            tracing::debug!(upstream = %self.name, backend = %backend.key.addr, "not ejected: max_ejected_percent of the upstream is out already");
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::plan::UpstreamProtocol;

    #[test]
    fn weighted_distribution_within_two_percent() {
        let spec = UpstreamSpec {
            name: "u".into(),
            policy: Policy::Weighted,
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            tls: None,
            health: None,
            outlier: OutlierSpec::default(),
            slow_start: None,
            hash_key: None,
            hash_balance_factor: None,
            proxy_protocol: None,
            sources: Vec::new(),
            max_members: crate::plan::DEFAULT_MAX_MEMBERS,
            backends: [(1, 3), (2, 1), (3, 6)]
                .iter()
                .map(|(port, weight)| crate::plan::BackendSpec {
                    addr: format!("127.0.0.1:{port}"),
                    weight: *weight,
                })
                .collect(),
        };
        let registry = crate::generation::SharedState::default();
        let upstream = Upstream::build(&spec, &registry).expect("builds");
        let mut counts = [0usize; 3];
        let picks = 10_000;
        for _ in 0..picks {
            let members = upstream.members();
            let b = upstream.pick(&members).expect("a backend");
            let i = upstream
                .members()
                .backends
                .iter()
                .position(|x| Arc::ptr_eq(x, b))
                .expect("known");
            counts[i] += 1;
        }
        for (count, weight) in counts.iter().zip([3.0, 1.0, 6.0]) {
            let share = *count as f64 / picks as f64;
            assert!(
                (share - weight / 10.0).abs() < 0.02,
                "share {share} for weight {weight}"
            );
        }
    }

    pub(crate) fn spec(policy: Policy, ports: &[u16]) -> UpstreamSpec {
        UpstreamSpec {
            name: "u".into(),
            policy,
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            tls: None,
            health: None,
            outlier: OutlierSpec {
                consecutive_failures: 1,
                max_ejected_percent: 100,
                ..OutlierSpec::default()
            },
            slow_start: None,
            hash_key: None,
            hash_balance_factor: None,
            proxy_protocol: None,
            sources: Vec::new(),
            max_members: crate::plan::DEFAULT_MAX_MEMBERS,
            backends: ports
                .iter()
                .map(|port| crate::plan::BackendSpec {
                    addr: format!("127.0.0.1:{port}"),
                    weight: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn every_policy_skips_ejected_backends_and_fails_open_when_all_are() {
        for policy in [
            Policy::RoundRobin,
            Policy::Weighted,
            Policy::LeastRequests,
            Policy::P2c,
            Policy::Hash,
        ] {
            let registry = crate::generation::SharedState::default();
            let mut spec = spec(policy, &[1, 2, 3]);
            if policy == Policy::Hash {
                spec.hash_key = Some(HashKey::Path);
            }
            let upstream = Upstream::build(&spec, &registry).expect("builds");
            let members = upstream.members();
            let (a, b) = (&members.backends[0], &members.backends[1]);
            upstream.report(a, Attempt::ConnectError, None);
            upstream.report(b, Attempt::Answered(http::StatusCode::BAD_GATEWAY), None);
            assert!(
                a.outlier.is_ejected() && b.outlier.is_ejected(),
                "{policy:?}"
            );
            for _ in 0..50 {
                let picked = upstream.pick(&members).expect("a backend");
                assert_eq!(picked.key.addr, "127.0.0.1:3", "{policy:?}");
            }
            for key in 0..50 {
                let keyed = upstream.pick_hashed(&members, key).expect("a backend");
                assert_eq!(keyed.key.addr, "127.0.0.1:3", "{policy:?}");
            }
            // The last one out too: traffic fails open to all of them
            // rather than nowhere.
            upstream.report(&members.backends[2], Attempt::Timeout, None);
            let picked: std::collections::HashSet<_> = (0..30)
                .filter_map(|_| upstream.pick(&members).map(Arc::clone))
                .map(|b| b.key.addr.clone())
                .collect();
            assert!(!picked.is_empty(), "{policy:?}");
        }
    }

    #[test]
    fn max_ejected_percent_keeps_the_rest_in() {
        let registry = crate::generation::SharedState::default();
        let mut half = spec(Policy::RoundRobin, &[1, 2, 3, 4]);
        half.outlier.max_ejected_percent = 50;
        let upstream = Upstream::build(&half, &registry).expect("builds");
        let members = upstream.members();
        for backend in &members.backends {
            upstream.report(backend, Attempt::ConnectError, None);
        }
        let ejected = members
            .backends
            .iter()
            .filter(|b| b.outlier.is_ejected())
            .count();
        assert_eq!(ejected, 2);
    }

    #[test]
    fn registry_reuses_live_backends() {
        let registry = crate::generation::SharedState::default();
        let key = crate::backends::BackendKey {
            addr: "127.0.0.1:1".into(),
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            tls: None,
            health: None,
            proxy_protocol: None,
        };
        let a = registry.backends.get_or_create(key.clone()).expect("a");
        let b = registry.backends.get_or_create(key.clone()).expect("b");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        assert_eq!(registry.backends.live(), 0);
    }
}

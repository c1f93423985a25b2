//! An upstream in one generation: the backends it names (handles into
//! the process-shared `backends` registry) and how it picks one for a
//! request. Every policy skips backends that are unhealthy or ejected;
//! when none is left, it fails open to all of them (DESIGN §12).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::maglev::Maglev;
use crate::backends::{
    Attempt, Backend, BackendError, BackendKey, BackendRegistry, RetryBudget, Usable,
};
use crate::plan::{HashKey, OutlierSpec, Policy, UpstreamSpec};

/// An upstream in one generation: its backends and how to pick one.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub policy: Policy,
    pub backends: Vec<Arc<Backend>>,
    pub outlier: OutlierSpec,
    slow_start: Option<Duration>,
    /// For `weighted`: which backend each turn goes to.
    schedule: WeightedSchedule,
    cursor: AtomicUsize,
    /// Shared with every generation that has an upstream of this name.
    budget: Arc<RetryBudget>,
    /// For `hash`: what is hashed, the table, and the load bound.
    pub hash_key: Option<HashKey>,
    maglev: Maglev,
    hash_balance_factor: Option<u32>,
    load_sum: LoadSum,
    /// For connections of `tcp` listeners: the PROXY header they start with.
    pub proxy_protocol: Option<crate::plan::ProxyProtocol>,
}

/// The last sum of the backends' loads, and when it was taken.
#[derive(Debug, Default)]
struct LoadSum {
    total: AtomicU64,
    at_ms: AtomicU64,
}

/// The least share of its turns a backend in slow start is offered.
const SLOW_START_FLOOR: f64 = 0.1;

impl Upstream {
    /// Builds the upstream, reusing live backends from `registry`.
    pub fn build(spec: &UpstreamSpec, registry: &BackendRegistry) -> Result<Self, BackendError> {
        let backends = spec
            .backends
            .iter()
            .map(|b| {
                registry.get_or_create(BackendKey {
                    addr: b.addr.clone(),
                    protocol: spec.protocol,
                    connect_timeout: spec.connect_timeout,
                    idle_timeout: spec.idle_timeout,
                    tls: spec.tls.clone(),
                    health: spec.health.clone(),
                    proxy_protocol: spec.proxy_protocol,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let weights: Vec<u32> = spec.backends.iter().map(|b| b.weight).collect();
        let schedule = match spec.policy {
            Policy::Weighted => WeightedSchedule::new(&weights),
            _ => WeightedSchedule::default(),
        };
        let maglev = match spec.policy {
            Policy::Hash => {
                let names: Vec<&str> = spec.backends.iter().map(|b| b.addr.as_str()).collect();
                Maglev::new(&names)
            }
            _ => Maglev::default(),
        };
        Ok(Self {
            name: spec.name.clone(),
            policy: spec.policy,
            backends,
            outlier: spec.outlier,
            slow_start: spec.slow_start,
            schedule,
            cursor: AtomicUsize::new(0),
            budget: registry.budget(&spec.name),
            hash_key: spec.hash_key.clone(),
            maglev,
            hash_balance_factor: spec.hash_balance_factor,
            load_sum: LoadSum::default(),
            proxy_protocol: spec.proxy_protocol,
        })
    }

    /// Whether its backends speak HTTP/2 (`h2c`, `h2`), as gRPC needs.
    pub fn speaks_http2(&self) -> bool {
        self.backends
            .first()
            .is_none_or(|b| b.version == http::Version::HTTP_2)
    }

    /// The backend for the next request: by the policy, among those that
    /// pass their checks and are not ejected; when there are none, by
    /// the policy among all of them (fail open, counted).
    pub fn pick(&self) -> Option<&Arc<Backend>> {
        let chosen = match self.policy {
            // `pick_hashed` is for requests with a key; without one,
            // hashing falls back to round-robin, as HAProxy's does.
            Policy::RoundRobin | Policy::Weighted | Policy::Hash => self.pick_scheduled(),
            Policy::LeastRequests => self.pick_two(|b| b.inflight() as f64),
            Policy::P2c => self.pick_two(|b| b.load.cost()),
        };
        if chosen.is_some() {
            return chosen;
        }
        if self.backends.len() > 1 || self.backends.first().is_some_and(|b| !b.is_available()) {
            self.budget.fail_open.add(1);
        }
        let turn = self.cursor.fetch_add(1, Ordering::Relaxed);
        self.backends.get(self.scheduled(turn))
    }

    /// The backend for the next attempt of a request or connection that
    /// has tried the backends in `tried` (their addresses; the pick is
    /// added): the key's backend first (`hash`, when it has one), then by
    /// the policy one not tried yet, if the upstream has any left.
    pub fn pick_untried(&self, hash: Option<u64>, tried: &mut Vec<usize>) -> Option<&Arc<Backend>> {
        let address = |backend: &Arc<Backend>| Arc::as_ptr(backend) as usize;
        if let Some(hash) = hash.filter(|_| tried.is_empty()) {
            let backend = self.pick_hashed(hash)?;
            tried.push(address(backend));
            return Some(backend);
        }
        let mut picked = None;
        for _ in 0..self.backends.len().max(1) {
            let backend = self.pick()?;
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
    /// walk (the same order for every request with that key).
    pub fn pick_hashed(&self, hash: u64) -> Option<&Arc<Backend>> {
        if self.maglev.is_empty() {
            // Not a hashing upstream (or no backends): no key to follow.
            return self.pick();
        }
        let n = self.backends.len();
        let mut total = None;
        let mut overloaded = None;
        let mut previous = usize::MAX;
        // Bounded: far more steps than distinct backends a walk needs.
        for index in self.maglev.walk(hash).take(4 * n + 16) {
            if index == previous {
                continue;
            }
            previous = index;
            let Some(backend) = self.backends.get(index) else {
                continue;
            };
            if let Some(factor) = self.hash_balance_factor {
                let load = backend.inflight();
                // An idle backend is under any bound: no sum needed.
                if load > 0 {
                    let bound =
                        |total: u64| ((total + 1) * u64::from(factor)).div_ceil(100 * n as u64);
                    let (mut sum, mut exact) =
                        *total.get_or_insert_with(|| (self.total_load(), false));
                    // A recent sum may lag a burst: before calling a
                    // backend overloaded, make sure with an exact one.
                    if load + 1 > bound(sum) && !exact {
                        (sum, exact) = (self.total_load_now(), true);
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
        if overloaded.is_some() {
            return overloaded;
        }
        self.budget.fail_open.add(1);
        self.maglev
            .walk(hash)
            .next()
            .and_then(|i| self.backends.get(i))
    }

    /// Requests in flight over this upstream's backends, summed at most
    /// once a millisecond: the load bound needs an average, not an
    /// account, and summing 100 counters on every request cost more than
    /// the rest of the pick.
    fn total_load(&self) -> u64 {
        let now = crate::backends::now_ms();
        if self.load_sum.at_ms.load(Ordering::Relaxed) == now {
            return self.load_sum.total.load(Ordering::Relaxed);
        }
        self.total_load_now()
    }

    /// Requests in flight over this upstream's backends, summed now.
    fn total_load_now(&self) -> u64 {
        let total = self.backends.iter().map(|b| b.inflight()).sum::<u64>();
        self.load_sum.total.store(total, Ordering::Relaxed);
        self.load_sum
            .at_ms
            .store(crate::backends::now_ms(), Ordering::Relaxed);
        total
    }

    /// The backend index of turn `turn` under round-robin or weighted.
    fn scheduled(&self, turn: usize) -> usize {
        match self.policy {
            Policy::Weighted => self.schedule.pick(turn as u64),
            _ => turn % self.backends.len().max(1),
        }
    }

    fn pick_scheduled(&self) -> Option<&Arc<Backend>> {
        let turn = self.cursor.fetch_add(1, Ordering::Relaxed);
        // Nearly always: the scheduled backend takes it.
        let first = self.backends.get(self.scheduled(turn))?;
        if self.takes(first) {
            return Some(first);
        }
        self.pick_scheduled_after(turn)
    }

    /// The first usable backend after turn `turn`'s.
    #[cold]
    fn pick_scheduled_after(&self, turn: usize) -> Option<&Arc<Backend>> {
        let n = self.backends.len();
        // The turns after this one first, so that the schedule's spread
        // holds among the backends left; then any backend at all.
        (1..n)
            .map(|k| self.scheduled(turn.wrapping_add(k)))
            .chain((0..n).map(|k| (turn + k) % n))
            .filter_map(|i| self.backends.get(i))
            .find(|b| self.takes(b))
    }

    /// Power of two choices: two distinct backends at random, the one
    /// with the lower `cost` wins.
    fn pick_two(&self, cost: impl Fn(&Backend) -> f64) -> Option<&Arc<Backend>> {
        let n = self.backends.len();
        if n < 2 {
            return self.backends.first().filter(|b| self.takes(b));
        }
        let first = fastrand::usize(..n);
        let mut second = fastrand::usize(..n - 1);
        if second >= first {
            second += 1;
        }
        let (a, b) = (self.backends.get(first)?, self.backends.get(second)?);
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
                    .filter_map(|k| self.backends.get((start + k) % n))
                    .find(|b| self.takes(b))
            }
        }
    }

    /// Whether `backend` takes this request: checks and outlier state
    /// allow it, and slow start, if it is ramping, offers it this turn.
    #[inline]
    fn takes(&self, backend: &Backend) -> bool {
        if let (Some(ramp), Some(recovered)) = (self.slow_start, backend.health.recovered_at()) {
            let elapsed =
                Duration::from_millis(crate::backends::now_ms().saturating_sub(recovered));
            let share = (elapsed.as_secs_f64() / ramp.as_secs_f64()).max(SLOW_START_FLOOR);
            if share < 1.0 && fastrand::f64() >= share {
                return false;
            }
        }
        backend.usable() == Usable::Yes
    }

    /// Records how an attempt at `backend` (one of this upstream's) ended,
    /// with the time to its answer, and ejects the backend when outlier
    /// detection asks and at most `max_ejected_percent` of this
    /// upstream's backends would then be out.
    pub fn report(&self, backend: &Backend, attempt: Attempt, rtt: Option<Duration>) {
        if let (Attempt::Answered(_), Some(rtt)) = (attempt, rtt) {
            backend.load.observe(rtt);
        }
        if !backend.record(attempt, &self.outlier) {
            return;
        }
        let ejected = self
            .backends
            .iter()
            .filter(|b| b.outlier.is_ejected())
            .count();
        let after = ejected + usize::from(!backend.outlier.is_ejected());
        let limit = self.outlier.max_ejected_percent as usize * self.backends.len();
        if after * 100 <= limit {
            backend.eject(&self.outlier);
        } else {
            tracing::debug!(upstream = %self.name, backend = %backend.key.addr, "not ejected: max_ejected_percent of the upstream is out already");
        }
    }
}

/// Smooth weighted round-robin without unrolling the cycle: picks walk
/// the positions `0..total` (one per unit of reduced weight) with a
/// stride near `total / φ` that is coprime with `total`, and each position
/// belongs to the backend whose weight range holds it.
///
/// Over every `total` consecutive picks each backend gets exactly its
/// weight (the stride visits every position once), and its picks are
/// spread through the cycle: a golden-ratio rotation leaves at most three
/// distinct gaps between visits of any range (the three-distance
/// theorem), each within about 2.6 × the ideal `total / weight`. Building
/// is O(backends), picking is O(log backends) and lock-free; nginx's
/// algorithm, unrolled, was O(total × backends) to build: hundreds of
/// milliseconds for a thousand heavily weighted backends
/// (`docs/performance.md`, "Figures behind choices in the code").
#[derive(Debug, Default)]
pub struct WeightedSchedule {
    /// Cumulative reduced weights: backend `i` owns positions
    /// `ends[i-1]..ends[i]`.
    ends: Vec<u64>,
    total: u64,
    stride: u64,
}

impl WeightedSchedule {
    pub fn new(weights: &[u32]) -> Self {
        let divisor = u64::from(weights.iter().copied().fold(0, gcd).max(1));
        let mut total = 0u64;
        let ends = weights
            .iter()
            .map(|w| {
                total += u64::from(*w) / divisor;
                total
            })
            .collect();
        // ⌊total / φ⌋, then the next value coprime with total.
        let mut stride = ((total as f64) * 0.618_033_988_749_895) as u64;
        stride = stride.clamp(1, total.max(1));
        while total > 1 && gcd64(stride, total) != 1 {
            stride += 1;
        }
        Self {
            ends,
            total,
            stride,
        }
    }

    /// The backend index for pick number `turn`.
    pub fn pick(&self, turn: u64) -> usize {
        if self.total == 0 {
            return 0;
        }
        // Both factors are below `total` (at most 1 000 × backends), so
        // the product fits in 64 bits for any plausible upstream; u128
        // keeps it exact regardless.
        let position = (u128::from(turn % self.total) * u128::from(self.stride)
            % u128::from(self.total)) as u64;
        self.ends.partition_point(|end| *end <= position)
    }
}

fn gcd64(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd64(b, a % b)
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::UpstreamProtocol;

    /// Every backend's picks over two cycles of `weights`: exact shares
    /// per cycle, and no gap between two picks of a backend over three
    /// times its ideal spacing.
    fn assert_smooth(weights: &[u32]) {
        let schedule = WeightedSchedule::new(weights);
        let total = schedule.total;
        let picks: Vec<usize> = (0..2 * total).map(|turn| schedule.pick(turn)).collect();
        let divisor = weights.iter().copied().fold(0, gcd);
        for (i, weight) in weights.iter().enumerate() {
            let share = u64::from(weight / divisor);
            let turns: Vec<u64> = (0..2 * total).filter(|t| picks[*t as usize] == i).collect();
            assert_eq!(turns.len() as u64, 2 * share, "{weights:?}: backend {i}");
            let ideal = total as f64 / share as f64;
            let widest = turns.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
            assert!(
                widest as f64 <= 3.0 * ideal + 1.0,
                "{weights:?}: backend {i} waits {widest} turns, ideal {ideal:.1}"
            );
        }
    }

    #[test]
    fn weighted_picks_are_exact_per_cycle_and_spread() {
        assert_eq!(
            (0..7)
                .map(|t| WeightedSchedule::new(&[5, 1, 1]).pick(t))
                .collect::<Vec<_>>(),
            vec![0, 0, 0, 1, 0, 2, 0]
        );
        // Equal weights are plain round-robin.
        assert_eq!(
            (0..4)
                .map(|t| WeightedSchedule::new(&[2, 2]).pick(t))
                .collect::<Vec<_>>(),
            vec![0, 1, 0, 1]
        );
        for weights in [
            vec![5, 1, 1],
            vec![3, 1, 6],
            vec![1, 1, 1, 1, 1],
            vec![100, 1],
            vec![7, 11, 13, 17],
            (1..=50).collect(),
        ] {
            assert_smooth(&weights);
        }
    }

    #[test]
    fn a_thousand_backends_weighted_to_a_thousand_build_at_once() {
        let weights: Vec<u32> = (1..=1000).collect();
        let started = std::time::Instant::now();
        let schedule = WeightedSchedule::new(&weights);
        assert!(started.elapsed() < Duration::from_millis(10));
        assert_eq!(schedule.total, 500_500);
        // The heaviest backend gets 1000 of each 500 500 turns.
        let heaviest = (0..500_500).filter(|t| schedule.pick(*t) == 999).count();
        assert_eq!(heaviest, 1000);
    }

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
            backends: [(1, 3), (2, 1), (3, 6)]
                .iter()
                .map(|(port, weight)| crate::plan::BackendSpec {
                    addr: format!("127.0.0.1:{port}"),
                    weight: *weight,
                })
                .collect(),
        };
        let registry = BackendRegistry::default();
        let upstream = Upstream::build(&spec, &registry).expect("builds");
        let mut counts = [0usize; 3];
        let picks = 10_000;
        for _ in 0..picks {
            let b = upstream.pick().expect("a backend");
            let i = upstream
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

    fn spec(policy: Policy, ports: &[u16]) -> UpstreamSpec {
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
            let registry = BackendRegistry::default();
            let mut spec = spec(policy, &[1, 2, 3]);
            if policy == Policy::Hash {
                spec.hash_key = Some(HashKey::Path);
            }
            let upstream = Upstream::build(&spec, &registry).expect("builds");
            let (a, b) = (&upstream.backends[0], &upstream.backends[1]);
            upstream.report(a, Attempt::ConnectError, None);
            upstream.report(b, Attempt::Answered(http::StatusCode::BAD_GATEWAY), None);
            assert!(
                a.outlier.is_ejected() && b.outlier.is_ejected(),
                "{policy:?}"
            );
            for _ in 0..50 {
                let picked = upstream.pick().expect("a backend");
                assert_eq!(picked.key.addr, "127.0.0.1:3", "{policy:?}");
            }
            for key in 0..50 {
                let keyed = upstream.pick_hashed(key).expect("a backend");
                assert_eq!(keyed.key.addr, "127.0.0.1:3", "{policy:?}");
            }
            // The last one out too: traffic fails open to all of them
            // rather than nowhere.
            upstream.report(&upstream.backends[2], Attempt::Timeout, None);
            let picked: std::collections::HashSet<_> = (0..30)
                .filter_map(|_| upstream.pick())
                .map(|b| b.key.addr.clone())
                .collect();
            assert!(!picked.is_empty(), "{policy:?}");
        }
    }

    #[test]
    fn max_ejected_percent_keeps_the_rest_in() {
        let registry = BackendRegistry::default();
        let mut half = spec(Policy::RoundRobin, &[1, 2, 3, 4]);
        half.outlier.max_ejected_percent = 50;
        let upstream = Upstream::build(&half, &registry).expect("builds");
        for backend in &upstream.backends {
            upstream.report(backend, Attempt::ConnectError, None);
        }
        let ejected = upstream
            .backends
            .iter()
            .filter(|b| b.outlier.is_ejected())
            .count();
        assert_eq!(ejected, 2);
    }

    #[test]
    fn registry_reuses_live_backends() {
        let registry = BackendRegistry::default();
        let key = BackendKey {
            addr: "127.0.0.1:1".into(),
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            tls: None,
            health: None,
            proxy_protocol: None,
        };
        let a = registry.get_or_create(key.clone()).expect("a");
        let b = registry.get_or_create(key.clone()).expect("b");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        assert_eq!(registry.live(), 0);
    }
}

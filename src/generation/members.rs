//! An upstream's members: the backends it balances over, in priority
//! tiers, with the tables its policy picks by. Fixed members (`addr`
//! entries) are built once with the generation; discovered ones
//! ([`Membership`]) are rebuilt whenever a source's set changes and
//! swapped in without a generation (DESIGN §20). Each member is a
//! backend identity from the process-wide registry, so a member that
//! stays keeps its health, ejection, load and pool across every change
//! of the set and every activation (§12); one that leaves is dropped
//! once the last request that picked it is done.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::maglev::Maglev;
use super::schedule::WeightedSchedule;
use crate::backends::{Backend, BackendError, BackendKey, BackendRegistry};
use crate::discovery::{Endpoint, Source, SourceKey};
use crate::plan::{Policy, UpstreamSpec};

/// One member before it is a backend.
#[derive(Debug, Clone)]
pub struct Entry {
    pub backend: Arc<Backend>,
    pub weight: u32,
    pub priority: u16,
    /// The source it came from (`None`: an `addr` entry).
    pub origin: Option<Arc<str>>,
}

/// Members and the tables the policy picks by: fixed for the life of a
/// value (a discovered upstream swaps whole values).
#[derive(Debug, Default)]
pub struct Members {
    /// Every member, tier after tier (most preferred first).
    pub backends: Vec<Arc<Backend>>,
    /// Aligned with `backends`: where each came from.
    pub origins: Vec<Option<Arc<str>>>,
    /// The most preferred priority's tier, inline: a pick nearly always
    /// needs only it (no pointer to chase).
    first: Tier,
    /// The other priorities', most preferred first.
    rest: Vec<Tier>,
}

/// The members of one priority.
#[derive(Debug, Default)]
pub struct Tier {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) priority: u16,
    weights: Vec<u32>,
    /// Cumulative weights, for picks in proportion to them; empty when
    /// all weights are alike.
    cumulative: Vec<u64>,
    /// For `weighted`: which backend each turn goes to.
    pub(super) schedule: WeightedSchedule,
    /// For `hash`.
    pub(super) maglev: Maglev,
    load_sum: LoadSum,
}

/// The last sum of a tier's loads, and when it was taken.
#[derive(Debug, Default)]
struct LoadSum {
    total: AtomicU64,
    at_ms: AtomicU64,
}

impl Members {
    /// The tables for `entries` (in any order: sorted here by priority,
    /// each tier in the order given).
    pub fn new(mut entries: Vec<Entry>, policy: Policy) -> Self {
        entries.sort_by_key(|e| e.priority);
        let mut members = Members::default();
        let mut start = 0;
        while start < entries.len() {
            let priority = entries.get(start).map_or(0, |e| e.priority);
            let end = entries[start..]
                .iter()
                .position(|e| e.priority != priority)
                .map_or(entries.len(), |k| start + k);
            let tier = &entries[start..end];
            let weights: Vec<u32> = tier.iter().map(|e| e.weight.max(1)).collect();
            let alike = weights.windows(2).all(|w| w[0] == w[1]);
            let cumulative = if alike || !policy.honours_weights() {
                Vec::new()
            } else {
                weights
                    .iter()
                    .scan(0u64, |sum, w| {
                        *sum += u64::from(*w);
                        Some(*sum)
                    })
                    .collect()
            };
            let schedule = match policy {
                Policy::Weighted => WeightedSchedule::new(&weights),
                _ => WeightedSchedule::default(),
            };
            let maglev = match policy {
                Policy::Hash => {
                    let names: Vec<&str> =
                        tier.iter().map(|e| e.backend.key.addr.as_str()).collect();
                    Maglev::weighted(&names, &weights)
                }
                _ => Maglev::default(),
            };
            let tier = Tier {
                start,
                end,
                priority,
                weights,
                cumulative,
                schedule,
                maglev,
                load_sum: LoadSum::default(),
            };
            if start == 0 {
                members.first = tier;
            } else {
                members.rest.push(tier);
            }
            start = end;
        }
        for entry in entries {
            members.backends.push(entry.backend);
            members.origins.push(entry.origin);
        }
        members
    }

    /// Its tiers, most preferred first (one, empty, when it has no member).
    pub(super) fn tiers(&self) -> impl Iterator<Item = &Tier> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    pub(super) fn first_tier(&self) -> &Tier {
        &self.first
    }

    /// Whether it has more than one priority.
    #[inline]
    pub(super) fn is_tiered(&self) -> bool {
        !self.rest.is_empty()
    }

    /// Each member's priority, aligned with `backends`.
    pub fn priorities(&self) -> impl Iterator<Item = u16> + '_ {
        self.tiers()
            .flat_map(|t| std::iter::repeat_n(t.priority, t.end - t.start))
    }

    /// Each member's weight, aligned with `backends`.
    pub fn weights(&self) -> impl Iterator<Item = u32> + '_ {
        self.tiers().flat_map(|t| t.weights.iter().copied())
    }
}

impl Tier {
    /// Two distinct indexes, uniformly.
    pub(super) fn two_alike(n: usize) -> (usize, usize) {
        let first = fastrand::usize(..n);
        let mut second = fastrand::usize(..n - 1);
        if second >= first {
            second += 1;
        }
        (first, second)
    }

    /// Two distinct indexes, each drawn in proportion to its weight.
    pub(super) fn two_by_weight(&self) -> (usize, usize) {
        let n = self.end - self.start;
        let Some(total) = self.cumulative.last().copied() else {
            return Self::two_alike(n);
        };
        let draw = || {
            let at = fastrand::u64(..total);
            self.cumulative.partition_point(|end| *end <= at)
        };
        let first = draw();
        // A heavy member may come up again: a few more draws, then any
        // other.
        for _ in 0..4 {
            let second = draw();
            if second != first {
                return (first, second);
            }
        }
        (first, (first + 1 + fastrand::usize(..n - 1)) % n)
    }

    /// Requests in flight over this tier's backends, summed at most once
    /// a millisecond: the load bound needs an average, not an account,
    /// and summing 100 counters on every request cost more than the rest
    /// of the pick.
    pub(super) fn total_load(&self, backends: &[Arc<Backend>]) -> u64 {
        let now = crate::clock::now_ms();
        if self.load_sum.at_ms.load(Ordering::Relaxed) == now {
            return self.load_sum.total.load(Ordering::Relaxed);
        }
        self.total_load_now(backends)
    }

    /// Requests in flight over this tier's backends, summed now.
    pub(super) fn total_load_now(&self, backends: &[Arc<Backend>]) -> u64 {
        let total = backends.iter().map(|b| b.inflight()).sum::<u64>();
        self.load_sum.total.store(total, Ordering::Relaxed);
        self.load_sum
            .at_ms
            .store(crate::clock::now_ms(), Ordering::Relaxed);
        total
    }
}

/// One request's view of an upstream's members. A discovered set is
/// held through arc-swap's guard: no reference count is touched while
/// the thread has a free debt slot (a few requests at once), and a full
/// one is taken, as `load_full` would, when it has none.
pub enum MembersRef<'u> {
    Fixed(&'u Members),
    Shared(arc_swap::Guard<Arc<Members>>),
}

impl std::ops::Deref for MembersRef<'_> {
    type Target = Members;

    #[inline]
    fn deref(&self) -> &Members {
        match self {
            MembersRef::Fixed(members) => members,
            MembersRef::Shared(members) => members,
        }
    }
}

/// The identity a member of `spec` at `addr` has.
fn key(spec: &UpstreamSpec, addr: String, host: Option<&Arc<str>>) -> BackendKey {
    let mut tls = spec.tls.clone();
    // A discovered member is verified as the name it was found under,
    // unless the upstream names one.
    if let (Some(tls), Some(host)) = (tls.as_mut(), host) {
        if tls.server_name.is_none() {
            tls.server_name = Some(host.to_string());
        }
    }
    BackendKey {
        addr,
        protocol: spec.protocol,
        connect_timeout: spec.connect_timeout,
        idle_timeout: spec.idle_timeout,
        tls,
        health: spec.health.clone(),
        proxy_protocol: spec.proxy_protocol,
    }
}

/// The `addr` entries of `spec`, as members.
pub fn fixed(spec: &UpstreamSpec, registry: &BackendRegistry) -> Result<Vec<Entry>, BackendError> {
    spec.backends
        .iter()
        .map(|b| {
            Ok(Entry {
                backend: registry.get_or_create(key(spec, b.addr.clone(), None))?,
                weight: b.weight,
                priority: 0,
                origin: None,
            })
        })
        .collect()
}

/// An upstream's members when some come from discovery sources: the
/// current set, swapped whenever a source's changes.
#[derive(Debug)]
pub struct Membership {
    current: ArcSwap<Members>,
    pub sources: Vec<Arc<Source>>,
    template: Template,
    /// Generations built with it (the last few), for members that join
    /// later.
    generations: Mutex<Vec<u64>>,
    task: Option<tokio::task::AbortHandle>,
}

/// What a membership rebuilds its members from.
#[derive(Debug)]
struct Template {
    spec: UpstreamSpec,
    fixed: Vec<Entry>,
    registry: BackendRegistry,
}

/// Generation ids a membership remembers.
const GENERATIONS: usize = 16;

impl Membership {
    /// Follows `spec`'s sources (the live ones, or new ones) from now
    /// on, starting from what they give now (`Discovery::prime` and
    /// `prime_blocking` make sure a new one has answered).
    pub fn start(
        spec: &UpstreamSpec,
        shared: &super::SharedState,
    ) -> Result<Arc<Self>, BackendError> {
        let template = Template {
            spec: spec.clone(),
            fixed: fixed(spec, &shared.backends)?,
            registry: shared.backends.clone(),
        };
        let sources: Vec<Arc<Source>> = spec
            .sources
            .iter()
            .map(|s| {
                shared.discovery.source(SourceKey {
                    upstream: spec.name.clone(),
                    spec: s.clone(),
                })
            })
            .collect();
        let receivers: Vec<_> = sources.iter().map(|s| s.subscribe()).collect();
        let members = template.assemble(&sources, &[]);
        let mut membership = Self {
            current: ArcSwap::from_pointee(members),
            sources,
            template,
            generations: Mutex::new(Vec::new()),
            task: None,
        };
        let runtime = tokio::runtime::Handle::try_current().ok();
        Ok(Arc::new_cyclic(|weak: &Weak<Self>| {
            if let Some(runtime) = runtime {
                let task = runtime.spawn(follow(weak.clone(), receivers));
                membership.task = Some(task.abort_handle());
            }
            membership
        }))
    }

    /// Builds the members again from what the sources give now and
    /// swaps them in: what each change of a source's set costs.
    pub fn rebuild(&self) {
        let members = self.template.assemble(&self.sources, &self.generations());
        tracing::debug!(upstream = %self.template.spec.name, members = members.backends.len(), "members changed");
        self.current.store(Arc::new(members));
        crate::backends::note_state_change();
    }

    /// The members now.
    #[inline]
    pub fn current(&self) -> arc_swap::Guard<Arc<Members>> {
        self.current.load()
    }

    pub(super) fn named_by(&self, id: u64) {
        {
            let mut ids = self
                .generations
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !ids.contains(&id) {
                if ids.len() == GENERATIONS {
                    ids.remove(0);
                }
                ids.push(id);
            }
        }
        for backend in &self.current().backends {
            backend.named_by(id);
        }
    }

    fn generations(&self) -> Vec<u64> {
        self.generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Template {
    /// The members the fixed entries and the sources' sets make: fixed
    /// ones first, then the sources' by priority and address up to
    /// `max_members` (the rest left out, counted on their sources), an
    /// address already a member not twice.
    fn assemble(&self, sources: &[Arc<Source>], generations: &[u64]) -> Members {
        let mut entries = self.fixed.clone();
        let mut seen: std::collections::HashSet<String> =
            entries.iter().map(|e| e.backend.key.addr.clone()).collect();
        let sets: Vec<(Arc<str>, Arc<[Endpoint]>)> = sources
            .iter()
            .map(|s| (Arc::from(s.key.spec.label()), s.endpoints()))
            .collect();
        let mut candidates: Vec<(&Endpoint, usize)> = sets
            .iter()
            .enumerate()
            .flat_map(|(i, (_, set))| set.iter().map(move |e| (e, i)))
            .collect();
        candidates.sort_by(|a, b| a.0.cmp(b.0));
        let mut taken = 0;
        let mut left_out = vec![0usize; sets.len()];
        for (endpoint, i) in candidates {
            let addr = endpoint.addr.to_string();
            if seen.contains(&addr) {
                continue;
            }
            if taken == self.spec.max_members {
                if let Some(n) = left_out.get_mut(i) {
                    *n += 1;
                }
                continue;
            }
            let key = key(&self.spec, addr.clone(), endpoint.host.as_ref());
            match self.registry.get_or_create(key) {
                Ok(backend) => {
                    for id in generations {
                        backend.named_by(*id);
                    }
                    entries.push(Entry {
                        backend,
                        weight: endpoint.weight,
                        priority: endpoint.priority,
                        origin: sets.get(i).map(|(label, _)| Arc::clone(label)),
                    });
                    seen.insert(addr);
                    taken += 1;
                }
                Err(error) => {
                    tracing::warn!(upstream = %self.spec.name, member = %addr, %error, "discovered member left out");
                }
            }
        }
        for (source, n) in sources.iter().zip(left_out) {
            source.left_out.store(n, Ordering::Relaxed);
            if n > 0 {
                tracing::warn!(upstream = %self.spec.name, source = %source.key.spec.label(), left_out = n, max_members = self.spec.max_members, "members over max_members left out");
            }
        }
        Members::new(entries, self.spec.policy)
    }
}

/// Rebuilds the members whenever a source's set changes, until the
/// membership is dropped.
async fn follow(
    membership: Weak<Membership>,
    mut receivers: Vec<watch::Receiver<Arc<[Endpoint]>>>,
) {
    if receivers.is_empty() {
        return;
    }
    loop {
        let changes = receivers.iter_mut().map(|r| Box::pin(r.changed()));
        let (changed, _, _) = futures_util::future::select_all(changes).await;
        if changed.is_err() {
            return;
        }
        for receiver in &mut receivers {
            receiver.mark_unchanged();
        }
        let Some(live) = membership.upgrade() else {
            return;
        };
        live.rebuild();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::Attempt;
    use crate::generation::{SharedState, Upstream};

    /// The upstream tests' spec, without backends (members come here).
    fn spec(policy: Policy) -> UpstreamSpec {
        crate::generation::upstream::tests::spec(policy, &[])
    }

    fn entries(
        shared: &SharedState,
        spec: &UpstreamSpec,
        members: &[(u16, u32, u16)],
    ) -> Vec<Entry> {
        members
            .iter()
            .map(|(port, weight, priority)| Entry {
                backend: shared
                    .backends
                    .get_or_create(key(spec, format!("127.0.0.1:{port}"), None))
                    .expect("backend"),
                weight: *weight,
                priority: *priority,
                origin: Some(Arc::from("dns:app.test:80")),
            })
            .collect()
    }

    #[test]
    fn the_most_preferred_priority_with_a_usable_member_takes_every_request() {
        for policy in [
            Policy::RoundRobin,
            Policy::Weighted,
            Policy::LeastRequests,
            Policy::P2c,
            Policy::Hash,
        ] {
            let shared = SharedState::default();
            let spec = spec(policy);
            let upstream = Upstream::build(&spec, &shared).expect("builds");
            let members = Members::new(
                entries(&shared, &spec, &[(3, 1, 20), (1, 1, 10), (2, 1, 10)]),
                policy,
            );
            assert_eq!(members.priorities().collect::<Vec<_>>(), [10, 10, 20]);
            let port = |b: &Arc<Backend>| b.key.addr.rsplit(':').next().unwrap_or("").to_owned();
            for key in 0..50 {
                let picked = upstream.pick(&members).expect("a member");
                assert_ne!(port(picked), "3", "{policy:?}");
                let hashed = upstream.pick_hashed(&members, key).expect("a member");
                assert_ne!(port(hashed), "3", "{policy:?}");
            }
            // Both preferred members out: the next priority, not fail-open.
            for b in &members.backends[..2] {
                upstream.report(b, Attempt::ConnectError, None);
                b.eject(&spec.outlier);
            }
            for key in 0..20 {
                assert_eq!(
                    port(upstream.pick(&members).expect("a member")),
                    "3",
                    "{policy:?}"
                );
                let hashed = upstream.pick_hashed(&members, key).expect("a member");
                assert_eq!(port(hashed), "3", "{policy:?}");
            }
        }
    }

    #[test]
    fn p2c_draws_in_proportion_to_weight() {
        let shared = SharedState::default();
        let spec = spec(Policy::P2c);
        let upstream = Upstream::build(&spec, &shared).expect("builds");
        let members = Members::new(
            entries(&shared, &spec, &[(1, 1, 0), (2, 9, 0)]),
            Policy::P2c,
        );
        // Idle members cost alike, so the first drawn wins: shares follow
        // the draws (a heavy first draw, or a light one then a heavy).
        let heavy = (0..10_000)
            .filter(|_| {
                upstream
                    .pick(&members)
                    .is_some_and(|b| b.key.addr.ends_with(":2"))
            })
            .count();
        assert!((8_500..=9_500).contains(&heavy), "{heavy} of 10 000");
        // Many members: each drawn first in proportion to its weight
        // (members 1..=8 weighing 1..=8).
        let many = Members::new(
            entries(
                &shared,
                &spec,
                &(1..=8).map(|p| (p, u32::from(p), 0)).collect::<Vec<_>>(),
            ),
            Policy::P2c,
        );
        let mut drawn = [0usize; 8];
        for _ in 0..36_000 {
            drawn[many.first.two_by_weight().0] += 1;
        }
        for (i, count) in drawn.iter().enumerate() {
            let expected = 36_000.0 * (i + 1) as f64 / 36.0;
            assert!(
                (*count as f64 - expected).abs() < 0.1 * expected,
                "member {i}: {count}, expected {expected} ({drawn:?})"
            );
        }
        // Alike weights draw uniformly.
        let alike = Members::new(
            entries(&shared, &spec, &[(1, 3, 0), (2, 3, 0)]),
            Policy::P2c,
        );
        let second = (0..10_000)
            .filter(|_| {
                upstream
                    .pick(&alike)
                    .is_some_and(|b| b.key.addr.ends_with(":2"))
            })
            .count();
        assert!((4_500..=5_500).contains(&second), "{second} of 10 000");
    }
}

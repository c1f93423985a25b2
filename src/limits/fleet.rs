//! A fleet quota's leases: per key, the tokens this instance took from
//! the store and has not spent yet.
//!
//! A request spends a leased token without a round trip. When none is
//! left it waits, at most the quota's `deadline`, for one refill of the
//! key (one store call per key at a time, however many requests wait for
//! it: the refill runs on a task of its own, so a request that goes away
//! does not cancel it). A refill asks for `batch` tokens (the
//! pre-allowance, `pre_allowance` of the limit) and the store grants
//! what the limit allows; when the lease falls to half its batch, the
//! next refill starts in the background, so a steady key never waits.
//!
//! What this trades (`docs/rate-limits.md`): tokens leased and not spent
//! before the lease ends are lost, so the fleet admits at most the
//! limit and at least the limit less one batch per instance and lease
//! (a fixed window's lease ends with the window; a token bucket's after
//! the time the bucket takes to make that many tokens).
//!
//! While the store is down, or a request's deadline passes, the quota
//! decides by `on_store_error`: `local` takes a token from a local
//! bucket of this instance's share of the limit (the limit over the
//! instances the store last counted).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::local::QuotaTable;
use super::store::{Ask, Grant, Miss, Store};
use super::{Decision, Left, Outcome};
use crate::clock::now_ms;
use crate::plan::{FleetQuotaSpec, OnStoreError, QuotaAlgorithm, QuotaSpec};

const SHARDS: usize = 16;
/// The shortest a token bucket's lease lasts.
const MIN_LEASE_MS: u64 = 10;
/// Refills a request waits through at most (each within its deadline).
const MAX_ROUNDS: usize = 4;

#[derive(Debug)]
pub struct FleetQuota {
    route: Arc<str>,
    spec: QuotaSpec,
    fleet: FleetQuotaSpec,
    shards: [Mutex<Shard>; SHARDS],
    hasher: std::hash::RandomState,
    /// The local bucket `on_store_error = "local"` takes from, with the
    /// number of instances its share was cut for.
    fallback: Mutex<Option<(u32, Arc<QuotaTable>)>>,
    /// The store its leases came from (set by the first refill): when
    /// an activation drops the quota, what they hold goes back to it.
    store: Mutex<Option<std::sync::Weak<Store>>>,
}

#[derive(Debug, Default)]
struct Shard {
    leases: HashMap<Box<[u8]>, Lease>,
    /// Counts every use, for recency.
    uses: u64,
}

#[derive(Debug, Default)]
struct Lease {
    tokens: u32,
    /// Until when the tokens may be spent (`now_ms`).
    expires_ms: u64,
    /// The store said no until then: refused here without asking.
    denied_until_ms: u64,
    /// Tokens of a token bucket's lease that ended unspent: the next
    /// refill gives them back to the store before it takes.
    returning: u32,
    /// What the store had left for this instance at the last refill (its
    /// share of the key's bucket or window), and when the key's bucket is
    /// whole again (`now_ms`): the `RateLimit` header's `r` and `t`.
    fleet_left: u32,
    full_at_ms: u64,
    /// The refill in flight: told when it lands.
    refill: Option<watch::Receiver<()>>,
    seen: u64,
    /// Requests for this key since `since_ms` (admitted or not), and
    /// the demand they make (requests a second, smoothed), which the
    /// store divides the key's limit by.
    offered: u32,
    since_ms: u64,
    /// Since when requests wait for a refill (0: none do), and how long
    /// they waited in the current span.
    waiting_since_ms: u64,
    waited_ms: u64,
    /// When a request last asked for the key.
    last_ms: u64,
    /// The key is over its limit here: the last refill was refused, or
    /// granted less than a batch, at `over_at_ms`. Requests are then
    /// decided by the lease at once and never wait for the store (refills
    /// go ahead of them), for as long as refills keep saying so.
    over: bool,
    over_at_ms: u64,
    demand: f64,
}

/// The shortest time demand is measured over.
const DEMAND_SPAN_MS: u64 = 100;

impl Lease {
    /// This instance's demand for the key, brought up to date at `now`.
    fn demand(&mut self, now: u64) -> f64 {
        if self.since_ms == 0 {
            self.since_ms = now;
        }
        let span = now.saturating_sub(self.since_ms);
        if span >= DEMAND_SPAN_MS {
            // Over the time requests did not wait for the store: closed-loop
            // clients of an instance whose store answers late offer their
            // usual rate there (and hardly any while they wait), open-loop
            // ones the same rate throughout. At most 8 × the plain rate.
            let open = span.saturating_sub(self.waited_ms).max(span / 8);
            self.waited_ms = 0;
            let rate = f64::from(self.offered) * 1000.0 / open as f64;
            // Half the weight to the last span: a change of demand shows
            // within a few refills, one burst does not swing it.
            self.demand = if self.demand == 0.0 {
                rate
            } else {
                (self.demand + rate) / 2.0
            };
            self.offered = 0;
            self.since_ms = now;
        }
        // Not measured yet (no whole span): 0, which the store reads as
        // the fleet's mean. Then, within a span, what has been seen so
        // far at least.
        if self.demand == 0.0 {
            return 0.0;
        }
        self.demand.max(f64::from(self.offered))
    }
}

/// A decision made at once, or one that waits for the store.
pub enum Take {
    Now(Decision),
    Wait(Pending),
}

/// A request waiting for its key's refill (see [`Pending::decide`]).
pub struct Pending {
    quota: Arc<FleetQuota>,
    store: Arc<Store>,
    key: Box<[u8]>,
    started: Instant,
}

/// What one look at a lease found.
enum Look {
    Decided(Decision),
    /// No token (and no refill joined).
    Empty,
    /// No token: wait for this refill.
    Wait(watch::Receiver<()>),
}

impl FleetQuota {
    /// `spec.fleet` must be `Some` (the caller only builds fleet quotas).
    pub fn new(route: &str, spec: QuotaSpec, fleet: FleetQuotaSpec) -> Self {
        FleetQuota {
            route: Arc::from(route),
            spec,
            fleet,
            shards: Default::default(),
            hasher: std::hash::RandomState::new(),
            fallback: Mutex::new(None),
            store: Mutex::new(None),
        }
    }

    pub fn spec(&self) -> &QuotaSpec {
        &self.spec
    }

    /// Decides for `key` at once when this instance holds a token (or
    /// the store said no, or is down); otherwise the request waits.
    pub fn take(self: &Arc<Self>, key: &[u8], store: &Arc<Store>) -> Take {
        // Just started: the first beat says how many instances share the
        // limit; until it is in, a request waits for it rather than
        // decide alone on the whole limit.
        if !store.is_up() && store.first_beat_done() {
            store.missed(Miss::StoreDown);
            return Take::Now(self.on_store_error(key, store));
        }
        if !store.is_up() {
            return Take::Wait(Pending {
                quota: Arc::clone(self),
                store: Arc::clone(store),
                key: key.into(),
                started: Instant::now(),
            });
        }
        match self.look(key, store, false) {
            Some(decision) => Take::Now(decision),
            None => Take::Wait(Pending {
                quota: Arc::clone(self),
                store: Arc::clone(store),
                key: key.into(),
                started: Instant::now(),
            }),
        }
    }

    /// Spends a token if one is leased; `None` when the lease is empty.
    fn look(self: &Arc<Self>, key: &[u8], store: &Arc<Store>, join: bool) -> Option<Decision> {
        match self.look_or_join(key, store, join) {
            Look::Decided(decision) => Some(decision),
            Look::Empty | Look::Wait(_) => None,
        }
    }

    fn look_or_join(self: &Arc<Self>, key: &[u8], store: &Arc<Store>, join: bool) -> Look {
        let now = now_ms();
        let shard = self.shard(key);
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        shard.uses += 1;
        let seen = shard.uses;
        let cap = (self.spec.max_keys as usize / SHARDS).max(1);
        if !shard.leases.contains_key(key) && shard.leases.len() >= cap {
            evict(&mut shard.leases, now, cap);
        }
        let lease = shard.leases.entry(key.into()).or_default();
        lease.seen = seen;
        if lease.expires_ms <= now {
            let unspent = std::mem::take(&mut lease.tokens);
            // A window's tokens end with their window; a bucket's go back.
            if self.fleet.algorithm == QuotaAlgorithm::TokenBucket {
                lease.returning = lease.returning.saturating_add(unspent);
            }
        }
        // Demand counts the requests that arrive while the key is not
        // waiting for its store: clients that wait for a slow store send
        // fewer, and would shrink this instance's share (see `demand`).
        let waiting = lease.tokens == 0
            && !lease.over
            && lease.denied_until_ms <= now
            && lease.refill.is_some();
        if !join && !waiting {
            lease.offered = lease.offered.saturating_add(1);
        }
        if !join {
            lease.last_ms = now;
        }
        // Over the limit no request waits for the store: an empty lease
        // refuses, and the refill it starts (or one already going) fills
        // it for the requests after. A store that answers late then costs
        // its instance's clients no time (they would send fewer requests,
        // and its share of the limit would shrink with them).
        // A key quiet for a while is not over any more: its bucket may be
        // full again, and its next request waits for the refill that says.
        if lease.over && now.saturating_sub(lease.over_at_ms) > OVER_FOR_MS {
            lease.over = false;
        }
        if lease.tokens == 0 && lease.over && lease.denied_until_ms <= now {
            if lease.refill.is_none() {
                let demand = lease.demand(now);
                let returning = std::mem::take(&mut lease.returning);
                lease.refill = Some(self.refill(key, store, demand, returning));
            }
            return Look::Decided(Decision::refused(
                Outcome::Limited,
                Duration::from_millis(1),
            ));
        }
        // A refusal counts once the lease is spent: a background refill
        // refused while tokens were left must not refuse with them.
        if lease.tokens == 0 && lease.denied_until_ms > now {
            return Look::Decided(Decision::refused(
                Outcome::Limited,
                Duration::from_millis(lease.denied_until_ms - now),
            ));
        }
        // A refill whose task is gone (never: it always sends) is not
        // waited for again.
        if lease
            .refill
            .as_ref()
            .is_some_and(|r| r.has_changed().is_err())
        {
            lease.refill = None;
        }
        if lease.tokens > 0 {
            lease.tokens -= 1;
            let batch = self.fleet.batch;
            if batch >= 2 && lease.tokens <= batch / 2 && lease.refill.is_none() {
                let demand = lease.demand(now);
                lease.refill =
                    Some(self.refill(key, store, demand, std::mem::take(&mut lease.returning)));
            }
            return Look::Decided(Decision::counted(
                Outcome::Allowed,
                Left {
                    remaining: lease.tokens.saturating_add(lease.fleet_left),
                    reset: Duration::from_millis(lease.full_at_ms.saturating_sub(now)),
                },
            ));
        }
        if !join {
            return Look::Empty;
        }
        if lease.waiting_since_ms == 0 {
            lease.waiting_since_ms = now.max(1);
        }
        let refill = match &lease.refill {
            Some(refill) => refill.clone(),
            None => {
                let demand = lease.demand(now);
                let refill = self.refill(key, store, demand, std::mem::take(&mut lease.returning));
                lease.refill = Some(refill.clone());
                refill
            }
        };
        Look::Wait(refill)
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        let i = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        &self.shards[i % SHARDS]
    }

    /// Starts a refill of `key` on the store's runtime.
    fn refill(
        self: &Arc<Self>,
        key: &[u8],
        store: &Arc<Store>,
        demand: f64,
        returning: u32,
    ) -> watch::Receiver<()> {
        let (tx, rx) = watch::channel(());
        let mut known = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        if known.is_none() {
            *known = Some(Arc::downgrade(store));
        }
        drop(known);
        if let Some(runtime) = store.runtime() {
            let quota = Arc::clone(self);
            runtime.spawn(refill(
                quota,
                key.into(),
                Arc::clone(store),
                (demand, returning),
                tx,
            ));
        }
        rx
    }

    /// What the store is asked for.
    fn ask(&self) -> Ask {
        let per_us = u64::try_from(self.spec.per.as_micros()).unwrap_or(u64::MAX);
        match self.fleet.algorithm {
            QuotaAlgorithm::TokenBucket => Ask::TokenBucket {
                interval_us: per_us / u64::from(self.spec.rate.max(1)),
                capacity: self.spec.burst,
            },
            QuotaAlgorithm::FixedWindow => Ask::FixedWindow {
                window_ms: per_us / 1000,
                limit: self.spec.rate,
            },
        }
    }

    fn algorithm_name(&self) -> &'static str {
        match self.fleet.algorithm {
            QuotaAlgorithm::TokenBucket => "tb",
            QuotaAlgorithm::FixedWindow => "fw",
        }
    }

    /// How long `grant`'s tokens may be spent.
    fn lifetime(&self, grant: Grant) -> u64 {
        match self.fleet.algorithm {
            QuotaAlgorithm::FixedWindow => grant.ms.max(1),
            QuotaAlgorithm::TokenBucket => {
                let per_ms = u64::try_from(self.spec.per.as_millis()).unwrap_or(u64::MAX);
                let interval_us = u64::try_from(self.spec.per.as_micros()).unwrap_or(u64::MAX)
                    / u64::from(self.spec.rate.max(1));
                (u64::from(grant.tokens).saturating_mul(interval_us) / 1000)
                    .clamp(MIN_LEASE_MS, per_ms.max(MIN_LEASE_MS))
            }
        }
    }

    /// Gives every leased token not spent yet back to `store`, and
    /// empties the leases; how many tokens the store took back.
    pub async fn give_back(&self, store: &Store) -> u32 {
        if !store.is_up() {
            return 0;
        }
        give_back(
            store,
            &self.route,
            self.algorithm_name(),
            self.ask(),
            self.unspent(),
        )
        .await
    }

    /// The tokens each lease did not spend, taken out of it (a window's
    /// only while its window lasts).
    fn unspent(&self) -> Vec<(Box<[u8]>, u32)> {
        let now = now_ms();
        let bucket = self.fleet.algorithm == QuotaAlgorithm::TokenBucket;
        let mut unspent = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, lease) in shard.leases.iter_mut() {
                let held = std::mem::take(&mut lease.tokens);
                let held = if bucket || lease.expires_ms > now {
                    held
                } else {
                    0
                };
                let tokens = held.saturating_add(std::mem::take(&mut lease.returning));
                if tokens > 0 {
                    unspent.push((key.clone(), tokens));
                }
            }
        }
        unspent
    }

    /// The decision while the store fails (`on_store_error`).
    fn on_store_error(&self, key: &[u8], store: &Store) -> Decision {
        match self.fleet.on_store_error {
            OnStoreError::Allow => Decision::allowed(Outcome::FailedOpen),
            OnStoreError::Deny => Decision::refused(Outcome::FailedClosed, Duration::from_secs(1)),
            OnStoreError::Local => match self.share(store.instances()).take(key) {
                Ok(left) => Decision::counted(Outcome::FallbackAllowed, left),
                Err(wait) => Decision::refused(Outcome::FallbackLimited, wait),
            },
        }
    }

    /// The local bucket of this instance's share among `instances`.
    fn share(&self, instances: u32) -> Arc<QuotaTable> {
        let mut fallback = self.fallback.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((n, table)) = fallback.as_ref() {
            if *n == instances {
                return Arc::clone(table);
            }
        }
        let table = Arc::new(QuotaTable::new(share_of(
            &self.spec,
            &self.fleet,
            instances,
        )));
        *fallback = Some((instances, Arc::clone(&table)));
        table
    }
}

/// Gives `unspent` tokens of a route's keys back to `store`; how many
/// it took back.
async fn give_back(
    store: &Store,
    route: &str,
    algorithm: &str,
    ask: Ask,
    unspent: Vec<(Box<[u8]>, u32)>,
) -> u32 {
    let mut back = 0;
    for (key, tokens) in unspent {
        let store_key = store.key(route, algorithm, &key);
        if let Ok(n) = store.give_back(&store_key, ask, tokens).await {
            back += n;
        }
    }
    back
}

/// An activation dropped the quota (no live generation names it): what
/// its leases hold goes back to the store, on the store's runtime.
impl Drop for FleetQuota {
    fn drop(&mut self) {
        let store = self
            .store
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .and_then(|store| store.upgrade());
        let Some(store) = store.filter(|store| store.is_up()) else {
            return;
        };
        let unspent = self.unspent();
        let Some(runtime) = store.runtime().cloned().filter(|_| !unspent.is_empty()) else {
            return;
        };
        let (route, algorithm, ask) = (Arc::clone(&self.route), self.algorithm_name(), self.ask());
        runtime.spawn(async move {
            give_back(&store, &route, algorithm, ask, unspent).await;
        });
    }
}

/// The local quota of one instance among `instances`: the limit (and
/// the burst) divided, rounded up, never below one token.
pub(crate) fn share_of(spec: &QuotaSpec, fleet: &FleetQuotaSpec, instances: u32) -> QuotaSpec {
    let n = instances.max(1);
    let rate = spec.rate.div_ceil(n).max(1);
    let burst = match fleet.algorithm {
        QuotaAlgorithm::FixedWindow => rate,
        QuotaAlgorithm::TokenBucket => spec.burst.div_ceil(n).max(1),
    };
    QuotaSpec {
        rate,
        burst,
        fleet: None,
        ..spec.clone()
    }
}

impl Pending {
    /// Waits for the key's refill (at most the quota's deadline from
    /// when the request asked), then decides.
    pub async fn decide(self) -> Decision {
        let Pending {
            quota,
            store,
            key,
            started,
        } = self;
        let mut from = started;
        if !store.first_beat_done() {
            // Connecting and one beat: twice the store's timeout at most;
            // then the refill has its deadline.
            store.first_beat(store.spec().timeout * 2).await;
            from = Instant::now();
        }
        let deadline = tokio::time::Instant::from_std(from + quota.fleet.deadline);
        let mut decision = None;
        // Why it falls back, if it does (every round used: `NoGrant`).
        let mut miss = Miss::NoGrant;
        for _ in 0..MAX_ROUNDS {
            if !store.is_up() {
                miss = Miss::StoreDown;
                break;
            }
            let mut refill = match quota.look_or_join(&key, &store, true) {
                Look::Decided(made) => {
                    decision = Some(made);
                    break;
                }
                Look::Wait(refill) => refill,
                Look::Empty => break,
            };
            if tokio::time::timeout_at(deadline, refill.changed())
                .await
                .is_err()
            {
                miss = Miss::RefillLate;
                break;
            }
        }
        store.waited(started.elapsed());
        decision.unwrap_or_else(|| {
            store.missed(miss);
            quota.on_store_error(&key, &store)
        })
    }
}

/// One store call for `key`; whoever waits for it is told when it lands.
/// `returning`: tokens of an ended lease it gives back first.
async fn refill(
    quota: Arc<FleetQuota>,
    key: Box<[u8]>,
    store: Arc<Store>,
    (demand, returning): (f64, u32),
    done: watch::Sender<()>,
) {
    let store_key = store.key(&quota.route, quota.algorithm_name(), &key);
    let asked = now_ms();
    let grant = store
        .take(
            &store_key,
            quota.ask(),
            quota.fleet.batch,
            demand,
            returning,
        )
        .await;
    let now = now_ms();
    {
        let shard = quota.shard(&key);
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let lease = shard.leases.entry(key.clone()).or_default();
        lease.refill = None;
        if lease.waiting_since_ms > 0 {
            lease.waited_ms += now.saturating_sub(lease.waiting_since_ms);
            lease.waiting_since_ms = 0;
        }
        if let Ok(grant) = grant {
            lease.fleet_left = grant.left;
            lease.full_at_ms = now + grant.full_ms;
        }
        match grant {
            Ok(grant) if grant.tokens > 0 => {
                lease.over = grant.tokens < quota.fleet.batch;
                lease.over_at_ms = now;
                lease.tokens = lease.tokens.saturating_add(grant.tokens);
                lease.expires_ms = lease.expires_ms.max(now + quota.lifetime(grant));
                lease.denied_until_ms = 0;
            }
            // The store counted its wait from when it was asked (about
            // when this was sent): a late answer must not make this
            // instance refuse past the store's next token.
            Ok(grant) => {
                lease.over = true;
                lease.over_at_ms = now;
                lease.denied_until_ms = asked + grant.ms.max(1);
                // Still asked for: the next refill goes when the store's
                // next token does, not when the next request finds the
                // refusal over (a late store would have its clients wait
                // a round trip each time, and others take the token).
                if now.saturating_sub(lease.last_ms) < AHEAD_WHILE_MS {
                    ask_ahead(&quota, &key, &store, lease.denied_until_ms);
                }
            }
            // The store is down now: those waiting decide without it.
            Err(()) => {}
        }
    }
    let _ = done.send(());
}

/// How recently a key must have been asked for to be refilled ahead.
const AHEAD_WHILE_MS: u64 = 250;
/// How long a refusal (or a short grant) keeps a key over its limit
/// without another: over the limit, refills follow each other faster.
const OVER_FOR_MS: u64 = 250;

/// At `at_ms` (`now_ms`), refills `key` unless a request already did or
/// the lease holds tokens again.
fn ask_ahead(quota: &Arc<FleetQuota>, key: &[u8], store: &Arc<Store>, at_ms: u64) {
    let Some(runtime) = store.runtime() else {
        return;
    };
    let (quota, store, key) = (Arc::clone(quota), Arc::clone(store), Box::<[u8]>::from(key));
    runtime.spawn(async move {
        let wait = Duration::from_millis(at_ms.saturating_sub(now_ms()));
        tokio::time::sleep(wait).await;
        if !store.is_up() {
            return;
        }
        let now = now_ms();
        let shard = quota.shard(&key);
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(lease) = shard.leases.get_mut(&key) else {
            return;
        };
        if lease.tokens > 0 || lease.refill.is_some() {
            return;
        }
        let demand = lease.demand(now);
        let returning = std::mem::take(&mut lease.returning);
        lease.refill = Some(quota.refill(&key, &store, demand, returning));
    });
}

/// Makes room in a full shard: spent or ended leases with no refill in
/// flight first, then the half idle longest.
fn evict(leases: &mut HashMap<Box<[u8]>, Lease>, now: u64, cap: usize) {
    leases.retain(|_, lease| {
        lease.refill.is_some()
            || (lease.tokens > 0 && lease.expires_ms > now)
            || lease.denied_until_ms > now
    });
    if leases.len() < cap {
        return;
    }
    let mut seen: Vec<u64> = leases.values().map(|l| l.seen).collect();
    let middle = seen.len() / 2;
    let (_, median, _) = seen.select_nth_unstable(middle);
    let median = *median;
    leases.retain(|_, lease| lease.seen > median);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::QuotaKey;

    fn spec(rate: u32, burst: u32) -> QuotaSpec {
        QuotaSpec {
            rate,
            per: Duration::from_secs(1),
            burst,
            key: vec![QuotaKey::ClientIp],
            max_keys: 1000,
            fleet: None,
            advertise: false,
        }
    }

    fn fleet(algorithm: QuotaAlgorithm) -> FleetQuotaSpec {
        FleetQuotaSpec {
            algorithm,
            on_store_error: OnStoreError::Local,
            deadline: Duration::from_millis(5),
            batch: 30,
        }
    }

    #[test]
    fn an_instance_share_divides_the_limit_and_the_burst_rounding_up() {
        let tb = fleet(QuotaAlgorithm::TokenBucket);
        let share = share_of(&spec(300, 600), &tb, 3);
        assert_eq!((share.rate, share.burst, share.fleet), (100, 200, None));
        let share = share_of(&spec(10, 10), &tb, 4);
        assert_eq!((share.rate, share.burst), (3, 3));
        let share = share_of(&spec(1, 1), &tb, 50);
        assert_eq!((share.rate, share.burst), (1, 1));
        // Before the store has counted anyone: the whole limit.
        assert_eq!(share_of(&spec(300, 300), &tb, 0).rate, 300);
        let fw = fleet(QuotaAlgorithm::FixedWindow);
        let share = share_of(&spec(300, 300), &fw, 3);
        assert_eq!((share.rate, share.burst), (100, 100));
    }

    #[test]
    fn a_token_bucket_lease_lasts_as_long_as_the_bucket_takes_to_make_it() {
        let quota = FleetQuota::new("r", spec(300, 300), fleet(QuotaAlgorithm::TokenBucket));
        // 30 tokens at 300/s (3 333 µs each): 99 ms.
        assert_eq!(
            quota.lifetime(Grant {
                tokens: 30,
                ms: 0,
                ..Grant::default()
            }),
            99
        );
        // Never under 10 ms, never past `per`.
        assert_eq!(
            quota.lifetime(Grant {
                tokens: 1,
                ms: 0,
                ..Grant::default()
            }),
            10
        );
        assert_eq!(
            quota.lifetime(Grant {
                tokens: 1000,
                ms: 0,
                ..Grant::default()
            }),
            1000
        );
        let window = FleetQuota::new("r", spec(300, 300), fleet(QuotaAlgorithm::FixedWindow));
        assert_eq!(
            window.lifetime(Grant {
                tokens: 30,
                ms: 420,
                ..Grant::default()
            }),
            420
        );
        match window.ask() {
            Ask::FixedWindow { window_ms, limit } => assert_eq!((window_ms, limit), (1000, 300)),
            other => panic!("{other:?}"),
        }
        match quota.ask() {
            Ask::TokenBucket {
                interval_us,
                capacity,
            } => assert_eq!((interval_us, capacity), (3333, 300)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn demand_is_the_offered_rate_smoothed_over_spans() {
        // Before a whole span: not measured (the store reads 0 as the
        // fleet's mean), whatever has been seen.
        let mut lease = Lease {
            offered: 3,
            ..Lease::default()
        };
        assert_eq!(lease.demand(1_000), 0.0);
        // 20 requests in 100 ms: 200 a second.
        lease.offered = 20;
        assert_eq!(lease.demand(1_100), 200.0);
        // Then 10 in 100 ms (100 a second): half way.
        lease.offered = 10;
        assert_eq!(lease.demand(1_200), 150.0);
        // Within a span nothing changes but the floor.
        lease.offered = 1;
        assert_eq!(lease.demand(1_250), 150.0);
    }

    #[tokio::test]
    async fn before_the_first_beat_a_request_waits_for_it_instead_of_deciding_alone() {
        // A peer that takes the connection and never answers.
        let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let store = Arc::new(Store::new(&crate::plan::StoreSpec {
            url: format!("redis://{}", hole.local_addr().unwrap()),
            sentinel: None,
            username: None,
            password: None,
            tls: None,
            key_prefix: "t:".into(),
            timeout: Duration::from_millis(100),
        }));
        store.start();
        let quota = Arc::new(FleetQuota::new(
            "r",
            spec(5, 5),
            fleet(QuotaAlgorithm::TokenBucket),
        ));
        let Take::Wait(pending) = quota.take(b"k", &store) else {
            panic!("decided before the store was heard from");
        };
        let started = Instant::now();
        let decision = pending.decide().await;
        assert!(store.first_beat_done());
        assert!(started.elapsed() >= Duration::from_millis(90));
        assert_eq!(decision.outcome, Outcome::FallbackAllowed);
        assert_eq!(store.misses(Miss::StoreDown), 1);
        assert_eq!(store.misses(Miss::RefillLate), 0);
        // From then on it decides at once.
        assert!(matches!(quota.take(b"k", &store), Take::Now(_)));
    }

    #[test]
    fn a_store_that_never_answered_falls_back_to_this_instances_share() {
        let store = Arc::new(Store::new(&crate::plan::StoreSpec {
            url: "redis://127.0.0.1:1".into(),
            sentinel: None,
            username: None,
            password: None,
            tls: None,
            key_prefix: "t:".into(),
            timeout: Duration::from_millis(50),
        }));
        let quota = Arc::new(FleetQuota::new(
            "r",
            spec(5, 5),
            fleet(QuotaAlgorithm::TokenBucket),
        ));
        let mut admitted = 0;
        for _ in 0..20 {
            match quota.take(b"k", &store) {
                Take::Now(d) if d.outcome == Outcome::FallbackAllowed => admitted += 1,
                Take::Now(d) => assert_eq!(d.outcome, Outcome::FallbackLimited),
                Take::Wait(_) => panic!("a down store is never waited for"),
            }
        }
        assert_eq!(admitted, 5);
        let mut deny = fleet(QuotaAlgorithm::TokenBucket);
        deny.on_store_error = OnStoreError::Deny;
        let quota = Arc::new(FleetQuota::new("r", spec(5, 5), deny));
        match quota.take(b"k", &store) {
            Take::Now(d) => assert_eq!(d.outcome, Outcome::FailedClosed),
            Take::Wait(_) => panic!("waited"),
        }
    }
}

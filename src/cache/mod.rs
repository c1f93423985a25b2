//! Response caching (RFC 9111; `docs/caching.md`): the store a route's
//! `cache` names (zones, objects and their variants, freshness and
//! revalidation, purge, coalescing of misses). The request path is
//! `proxy/cache.rs`; purge and the zones' view are the admin API's.
//!
//! - A **zone** is process-shared state, like a backend: generations
//!   name it, none owns its contents, and it lives while any live
//!   generation names it ([`Zones`]). Its objects are bounded by bytes
//!   (`quick_cache`'s weighted S3-FIFO, which keeps one-hit wonders from
//!   pushing out what is asked again, where plain LRU would not).
//! - What may be stored, for how long, whether a stored answer satisfies
//!   a request, and how a 304 updates it are RFC 9111's rules as the
//!   `http-cache-semantics` crate implements them for a shared cache
//!   (`s-maxage`, `private`, `Authorization` §3.5, `Vary`, `no-cache`,
//!   `Age`, heuristic freshness only where §4.2.2 allows); nothing of
//!   that is written again here.
//! - A **key** names one resource as the route's generation would ask
//!   for it upstream (the caller builds it: host, path and query as
//!   forwarded, upstream), and holds up to [`MAX_VARIANTS`] variants, one per
//!   combination of the values its `Vary` names.
//! - **Coalescing**: the first miss for a key leads ([`Turn::Lead`]);
//!   later ones wait for it ([`Turn::Wait`]), at most [`MAX_WAITERS`] of
//!   them and each for a bounded time, then look again (or go on their
//!   own).
//! - `stored.rs` is one object and what may be kept; `disk.rs` a zone's
//!   files; `range.rs` ranges answered from an object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{request, response};
pub use http_cache_semantics::RequestLike;
use http_cache_semantics::{AfterResponse, BeforeRequest};

use crate::plan::ZoneSpec;
use crate::telemetry::metrics as m;
use crate::telemetry::series::{self, Exported, Sample};
use crate::weak_map::WeakMap;

/// Variants kept per key; a new one past this replaces the oldest.
pub const MAX_VARIANTS: usize = 16;
/// Requests that may wait for one miss's answer; more go on their own.
pub const MAX_WAITERS: usize = 1_024;

/// Every zone of the process, by name: found again by each generation
/// that names it, dropped with its contents when none does.
#[derive(Debug, Default)]
pub struct Zones {
    zones: WeakMap<String, Zone>,
}

impl Zones {
    /// Zone `name`: the live one, or a new one of `memory` bytes. A zone
    /// found again keeps its size until the generation that gives it
    /// another takes effect ([`Zone::resize`]): building a candidate
    /// that is then refused changes nothing.
    pub fn zone(&self, name: &str, spec: &ZoneSpec) -> Arc<Zone> {
        let zone = self.zones.get_or_insert(name, || Zone::new(name, spec));
        zone.exported.get_or_init(|| {
            let admitted = series::admit(ZONE_SERIES);
            if admitted {
                series::register(&zone);
            }
            admitted
        });
        zone
    }
}

/// The series a zone exports (`Zone::samples`): six, and two for its
/// disk.
const ZONE_SERIES: usize = 8;

/// What the cache did for one request: `cutover_cache_requests_total`'s
/// `status` and the access log's `cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered from the zone, fresh.
    Hit = 0,
    /// Forwarded: nothing usable stored.
    Miss = 1,
    /// A stale object revalidated with a 304, and answered from.
    Revalidated = 2,
    /// Answered from what another request's miss stored meanwhile.
    Collapsed = 3,
    /// Answered from a stale object (`stale_while_revalidate`,
    /// `stale_if_error`).
    Stale = 4,
    /// Not looked up (a method or a request the cache does not answer).
    Bypass = 5,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Hit,
        Outcome::Miss,
        Outcome::Revalidated,
        Outcome::Collapsed,
        Outcome::Stale,
        Outcome::Bypass,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::Miss => "miss",
            Outcome::Revalidated => "revalidated",
            Outcome::Collapsed => "collapsed",
            Outcome::Stale => "stale",
            Outcome::Bypass => "bypass",
        }
    }
}

/// What a zone has counted since it was made.
#[derive(Debug, Default)]
pub struct Counts {
    /// Requests of its routes, by what the cache did for each (the route
    /// metrics' outcomes, counted at the same place).
    pub requests: [AtomicU64; Outcome::ALL.len()],
    pub stored: AtomicU64,
    /// Stored objects refreshed by a 304 (a request's or a background
    /// revalidation's).
    pub revalidated: AtomicU64,
    /// Objects pushed out to make room (not a replaced variant or a
    /// refreshed object).
    pub evicted: AtomicU64,
    pub purged: AtomicU64,
}

impl Counts {
    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.requests[outcome as usize].load(Ordering::Relaxed)
    }

    /// Requests answered without the upstream (fresh, collapsed onto
    /// another's miss, or stale), and those looked up that went to it (a
    /// miss, or a revalidation); a bypass was not looked up.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        let hits = [Outcome::Hit, Outcome::Collapsed, Outcome::Stale]
            .map(|o| self.requests(o))
            .iter()
            .sum();
        let misses = self.requests(Outcome::Miss) + self.requests(Outcome::Revalidated);
        (hits, misses)
    }
}

/// The variants of one key, newest first.
#[derive(Debug, Default)]
pub struct Variants(Vec<Arc<Stored>>);

impl Variants {
    fn weight(&self) -> u64 {
        self.0.iter().map(|s| s.weight).sum()
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ByBytes;

impl quick_cache::Weighter<String, Arc<Variants>> for ByBytes {
    fn weight(&self, key: &String, variants: &Arc<Variants>) -> u64 {
        key.len() as u64 + variants.weight()
    }
}

/// Notes the keys an insert pushed out. quick_cache reports a value
/// replaced under its own key (a new variant, a refreshed object) as
/// evicted too; [`Zone::put`] counts only the others, pushed out for room.
#[derive(Debug, Clone, Copy, Default)]
struct Evictions;

impl quick_cache::Lifecycle<String, Arc<Variants>> for Evictions {
    type RequestState = Vec<String>;

    fn on_evict(&self, evicted: &mut Vec<String>, key: String, _variants: Arc<Variants>) {
        evicted.push(key);
    }
}

type Objects = quick_cache::sync::Cache<
    String,
    Arc<Variants>,
    ByBytes,
    quick_cache::DefaultHashBuilder,
    Evictions,
>;

/// What a look-up found for a request.
#[derive(Debug)]
pub enum Found {
    /// A stored answer that satisfies the request as it is: its head
    /// (with `Age` and `Date`) and body.
    Fresh { head: response::Parts, body: Bytes },
    /// A stored answer for the request that must be validated first:
    /// send `request` (it carries `If-None-Match` / `If-Modified-Since`
    /// where the stored answer has validators), then [`Zone::revalidated`].
    Stale {
        stored: Arc<Stored>,
        request: request::Parts,
    },
    /// Nothing stored for it.
    Miss,
}

/// How a purge selects objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Key(String),
    Prefix(String),
    Tag(String),
}

/// One zone: its objects and the misses in flight.
#[derive(Debug)]
pub struct Zone {
    pub name: String,
    objects: Objects,
    flights: Mutex<HashMap<String, Arc<Flight>>>,
    pub counts: Counts,
    /// Whether the series budget took its series (at its first use).
    exported: std::sync::OnceLock<bool>,
    /// Its files, when it has `disk`.
    pub disk: Option<disk::Disk>,
}

impl Zone {
    fn new(name: &str, spec: &ZoneSpec) -> Self {
        let memory = spec.memory;
        let options = quick_cache::OptionsBuilder::new()
            // A guess at the number of objects (8 KiB each): the cache
            // grows its tables past it.
            .estimated_items_capacity((memory / 8192).clamp(16, 1 << 20) as usize)
            .weight_capacity(memory)
            .build();
        let objects = match options {
            Ok(options) => Objects::with_options(
                options,
                ByBytes,
                quick_cache::DefaultHashBuilder::default(),
                Evictions,
            ),
            // Only a zero capacity is refused, which validation rules out.
            Err(_) => Objects::with(
                16,
                memory.max(1),
                ByBytes,
                quick_cache::DefaultHashBuilder::default(),
                Evictions,
            ),
        };
        Self {
            name: name.to_owned(),
            objects,
            flights: Mutex::new(HashMap::new()),
            counts: Counts::default(),
            exported: std::sync::OnceLock::new(),
            disk: spec
                .disk
                .as_ref()
                .map(|d| disk::Disk::open(name, d.path.clone(), d.size)),
        }
    }

    /// What is stored for `key` that `request` (as it would be forwarded,
    /// method included) can use, at `now`.
    pub fn lookup(&self, key: &str, request: &impl RequestLike, now: SystemTime) -> Found {
        let Some(variants) = self.objects.get(key) else {
            return Found::Miss;
        };
        let mut stale = None;
        for stored in &variants.0 {
            if let Some(head) = stored.plain_hit(request, now) {
                return Found::Fresh {
                    head,
                    body: stored.body.clone(),
                };
            }
            match stored.policy.before_request(request, now) {
                BeforeRequest::Fresh(head) => {
                    return Found::Fresh {
                        head: stored.shown(head, now),
                        body: stored.body.clone(),
                    };
                }
                BeforeRequest::Stale {
                    request,
                    matches: true,
                } if stale.is_none() => stale = Some((Arc::clone(stored), request)),
                BeforeRequest::Stale { .. } => {}
            }
        }
        match stale {
            Some((stored, request)) => Found::Stale { stored, request },
            None => Found::Miss,
        }
    }

    /// Stores `stored` under `key`, replacing the variant selected by the
    /// same request header values, and the oldest past [`MAX_VARIANTS`].
    pub fn store(&self, key: &str, stored: Stored) {
        let stored = Arc::new(stored);
        if let Some(disk) = &self.disk {
            disk.write(key, Arc::clone(&stored));
        }
        let mut variants: Vec<Arc<Stored>> = vec![Arc::clone(&stored)];
        if let Some(old) = self.objects.get(key) {
            variants.extend(
                old.0
                    .iter()
                    .filter(|s| s.selected != stored.selected)
                    .take(MAX_VARIANTS - 1)
                    .cloned(),
            );
        }
        self.put(key, Variants(variants));
        self.counts.stored.fetch_add(1, Ordering::Relaxed);
    }

    /// Puts `variants` under `key`, counting the other keys pushed out to
    /// make room for them.
    fn put(&self, key: &str, variants: Variants) {
        let mut evicted = Vec::new();
        self.objects
            .insert_with_lifecycle(key.to_owned(), Arc::new(variants), &mut evicted);
        let room = evicted.iter().filter(|k| k.as_str() != key).count() as u64;
        if room > 0 {
            self.counts.evicted.fetch_add(room, Ordering::Relaxed);
        }
    }

    /// Counts one request of a route keeping answers here, by `outcome`.
    pub fn answered(&self, outcome: Outcome) {
        self.counts.requests[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The upstream's answer to a revalidation of `stored` (sent as
    /// `request`): a 304 that matches it updates it (its headers merged,
    /// its body kept) and returns the head to answer with; anything else
    /// returns `None` (the answer is the client's, and stored anew if it
    /// may be). `ours`: the request carried only the validators of
    /// `stored` (the client sent none), so a 304 can only be about it, even
    /// one that repeats no validator (many servers send a bare 304 to
    /// `If-Modified-Since`).
    pub fn revalidated(
        &self,
        key: &str,
        stored: &Arc<Stored>,
        request: &impl RequestLike,
        answer: &response::Parts,
        at: SystemTime,
        ours: bool,
    ) -> Option<(response::Parts, Bytes)> {
        let mut filled;
        let answer = if ours && answer.status == http::StatusCode::NOT_MODIFIED {
            filled = answer.clone();
            for (name, value) in stored.validators.iter() {
                if !filled.headers.contains_key(name) {
                    filled.headers.insert(name.clone(), value.clone());
                }
            }
            &filled
        } else {
            answer
        };
        match stored.policy.after_response(request, answer, at) {
            AfterResponse::NotModified(policy, head) => {
                self.counts.revalidated.fetch_add(1, Ordering::Relaxed);
                let updated = stored.revalidated(policy, request, at);
                let body = updated.body.clone();
                let head = updated.shown(head, at);
                self.store(key, updated);
                Some((head, body))
            }
            AfterResponse::Modified(..) => None,
        }
    }

    /// Forgets `key` (an unsafe method went to it: RFC 9111 §4.4), in
    /// memory and on disk.
    pub fn invalidate(&self, key: &str) -> bool {
        if let Some(disk) = &self.disk {
            disk.remove(key);
        }
        self.objects.remove(key).is_some()
    }

    /// Whether memory holds `key`.
    pub fn in_memory(&self, key: &str) -> bool {
        self.objects.contains_key(key)
    }

    /// Brings `key`'s variants from the disk into memory when memory has
    /// none; returns whether it found any. Reads on a blocking thread.
    pub async fn load(self: &Arc<Self>, key: &str) -> bool {
        if self.disk.is_none() || self.in_memory(key) {
            return false;
        }
        let zone = Arc::clone(self);
        let owned = key.to_owned();
        let read = tokio::task::spawn_blocking(move || {
            let found = zone
                .disk
                .as_ref()
                .map(|d| d.read(&owned, MAX_VARIANTS))
                .unwrap_or_default();
            let Some(disk) = zone.disk.as_ref() else {
                return false;
            };
            let mut loaded = false;
            disk.admit(&owned, found, |found| {
                if !zone.in_memory(&owned) {
                    let variants = found.into_iter().map(Arc::new).collect();
                    zone.put(&owned, Variants(variants));
                    loaded = true;
                }
            });
            loaded
        });
        read.await.unwrap_or(false)
    }

    /// Forgets every object `selector` names; returns how many keys.
    pub fn purge(&self, selector: &Selector) -> u64 {
        if let Some(disk) = &self.disk {
            disk.hold(selector);
        }
        let purged: Mutex<std::collections::HashSet<String>> = Mutex::default();
        let forget = |key: &String| {
            purged
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.clone());
        };
        // A key names one upstream's object (`host path?query
        // upstream`): one look-up; without its last part, every
        // upstream's, as a prefix or a tag looks at every key.
        let exact = match selector {
            Selector::Key(key) => self.objects.remove(key).map(|_| forget(key)).is_some(),
            _ => false,
        };
        if !exact {
            self.objects.retain(|key, variants| {
                let named = variants.0.iter().any(|s| selector.names(key, &s.tags));
                if named {
                    forget(key);
                }
                !named
            });
        }
        let mut purged = purged.into_inner().unwrap_or_else(PoisonError::into_inner);
        if let Some(disk) = &self.disk {
            purged.extend(disk.purge(selector));
        }
        let purged = purged.len() as u64;
        self.counts.purged.fetch_add(purged, Ordering::Relaxed);
        purged
    }

    /// Objects (keys) and bytes held, and evictions so far.
    pub fn usage(&self) -> (usize, u64, u64) {
        (
            self.objects.len(),
            self.objects.weight(),
            self.counts.evicted.load(Ordering::Relaxed),
        )
    }

    pub fn capacity(&self) -> u64 {
        self.objects.capacity()
    }

    /// Holds at most `memory` bytes from now (the objects past it go).
    pub fn resize(&self, spec: &ZoneSpec) {
        if self.objects.capacity() != spec.memory {
            self.objects.set_capacity(spec.memory);
        }
        // A disk's folder is startup-owned (a change of it is planned as
        // a restart); its size changes live.
        if let (Some(disk), Some(given)) = (&self.disk, &spec.disk) {
            disk.set_size(given.size);
        }
    }

    /// The first miss for `key` leads; later ones wait for it (at most
    /// [`MAX_WAITERS`]; past that, a request goes on its own).
    pub fn turn(self: &Arc<Self>, key: &str) -> Turn {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(flight) = flights.get(key) {
            if flight.waiters.fetch_add(1, Ordering::AcqRel) < MAX_WAITERS as u64 {
                return Turn::Wait(flight.landed.subscribe());
            }
            return Turn::Alone;
        }
        let flight = Arc::new(Flight {
            landed: tokio::sync::watch::channel(()).0,
            waiters: AtomicU64::new(0),
        });
        flights.insert(key.to_owned(), Arc::clone(&flight));
        Turn::Lead(Lead {
            zone: Arc::clone(self),
            key: key.to_owned(),
            flight,
        })
    }
}

impl Exported for Zone {
    fn samples(&self, out: &mut Vec<Sample>) {
        if self.exported.get() != Some(&true) {
            return;
        }
        let labels: series::Labels = vec![(m::LABEL_ZONE, self.name.clone().into())];
        let (objects, bytes, evicted) = self.usage();
        for (family, value) in [
            (&series::CACHE_BYTES, bytes as f64),
            (&series::CACHE_CAPACITY, self.capacity() as f64),
            (&series::CACHE_OBJECTS, objects as f64),
            (&series::CACHE_EVICTIONS, evicted as f64),
            (
                &series::CACHE_STORED,
                self.counts.stored.load(Ordering::Relaxed) as f64,
            ),
            (
                &series::CACHE_PURGED,
                self.counts.purged.load(Ordering::Relaxed) as f64,
            ),
        ] {
            out.push(series::sample(family, labels.clone(), value));
        }
        if let Some(disk) = &self.disk {
            out.push(series::sample(
                &series::CACHE_DISK_BYTES,
                labels.clone(),
                disk.used() as f64,
            ));
            out.push(series::sample(
                &series::CACHE_DISK_ERRORS,
                labels,
                disk.counts.errors.load(Ordering::Relaxed) as f64,
            ));
        }
    }
}

impl Drop for Zone {
    fn drop(&mut self) {
        if self.exported.get() == Some(&true) {
            series::retire(self);
            series::release(ZONE_SERIES);
        }
    }
}

/// A miss in flight: those waiting for it are told when it lands.
#[derive(Debug)]
struct Flight {
    landed: tokio::sync::watch::Sender<()>,
    waiters: AtomicU64,
}

/// Who asks the upstream for a key.
#[derive(Debug)]
pub enum Turn {
    /// This request: the others wait until `Lead` is dropped (its answer
    /// stored, or not storable, or failed).
    Lead(Lead),
    /// Another request asks: wait for it with [`wait`], then look again.
    Wait(tokio::sync::watch::Receiver<()>),
    /// Too many wait already: ask on your own.
    Alone,
}

/// Leads the miss for one key until dropped.
#[derive(Debug)]
pub struct Lead {
    zone: Arc<Zone>,
    key: String,
    flight: Arc<Flight>,
}

impl Drop for Lead {
    fn drop(&mut self) {
        let mut flights = self
            .zone
            .flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if flights
            .get(&self.key)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
        {
            flights.remove(&self.key);
        }
        drop(flights);
        self.flight.landed.send_replace(());
    }
}

/// Waits until the lead lands (or went away), at most `patience`;
/// returns whether it landed in time.
pub async fn wait(mut landed: tokio::sync::watch::Receiver<()>, patience: Duration) -> bool {
    tokio::time::timeout(patience, landed.changed())
        .await
        .is_ok()
}

pub mod disk;
mod plain;
pub mod range;
mod stored;

pub use stored::{Keepable, StaleUse, Stored};

#[cfg(test)]
mod tests;

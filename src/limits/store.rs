//! The shared store of fleet-scoped quotas: one multiplexed Redis
//! connection per `[limits] store` (redis-rs's `ConnectionManager`, which
//! reconnects; over TLS for `rediss://`), the store's health, and the
//! instances counting in it. With Redis Sentinel the master is asked of
//! the sentinels at start and again whenever the store fails, so a
//! failover moves the connection to the promoted replica.
//!
//! Every call is one Lua script (one round trip) with the store's
//! `timeout`: past it, or on any error, the store is down. While it is
//! down no decision asks it; a keeper task probes it every 250 ms and,
//! while it is up, beats every second in a sorted set of instances so
//! that each knows its share of a limit (the limit over the instances
//! seen in the last 5 s) for when the store fails again. Each change of
//! state is logged once.
//!
//! The connection and every task live on the runtime that built the
//! store (the control plane's): a data-plane worker only waits for an
//! answer, never drives the connection.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Client, ConnectionAddr, IntoConnectionInfo, Script, TlsCertificates, TlsMode};

use crate::plan::StoreSpec;
use crate::telemetry::metrics as m;
use crate::telemetry::series::{self, Count, Exported, Histogram, Sample};

/// How often an instance says it is alive, and how long it counts after.
const BEAT: Duration = Duration::from_secs(1);
const BEAT_TTL: Duration = Duration::from_secs(5);
/// How often a down store is asked again.
const PROBE: Duration = Duration::from_millis(250);

/// The first part of both token scripts: this instance's share of the
/// key's demand. `KEYS[2]` holds each instance's demand (requests a
/// second offered to this key, `ARGV[4]` is this instance's id and
/// `ARGV[5]` its demand) with when it said so; a demand not renewed for
/// 2 s is dropped (an idle instance claims nothing). `share`
/// is this instance's demand over the fleet's: a leaser that asks often
/// cannot take what another instance's clients ask for (issue 75: with
/// one shared bucket, the instance whose refill came first took every
/// new token and another one starved).
///
/// A demand of 0 is one not measured yet (the key's first tenth of a
/// second on that instance): it counts as the mean of the measured ones
/// (all unmeasured: equal shares) for 200 ms, then as
/// nothing. Counted as the requests seen so far, it favoured the
/// instance whose store answers first: its clients sent more while the
/// others' waited, and the first second went 120/120/85 (issue 75).
const SHARE: &str = r"
local nowms = math.floor(now / 1000)
local id = ARGV[4]
local said = math.max(tonumber(ARGV[5]), 0)
redis.call('HSET', KEYS[2], id, string.format('%.3f:%.0f', said, nowms))
redis.call('PEXPIRE', KEYS[2], 10000)
local all = redis.call('HGETALL', KEYS[2])
local total, measured, unmeasured = 0, 0, 0
for i = 1, #all, 2 do
  local d, at = string.match(all[i + 1], '([^:]+):([^:]+)')
  local age = nowms - tonumber(at)
  d = tonumber(d)
  if age > 2000 then
    redis.call('HDEL', KEYS[2], all[i])
  elseif d > 0 then
    total = total + d
    measured = measured + 1
  elseif age <= 200 then
    unmeasured = unmeasured + 1
  end
end
local mean = 1
if measured > 0 then mean = total / measured end
total = total + unmeasured * mean
local demand = said
if said <= 0 then demand = mean end
local share = 1
if total > demand then share = demand / total end
";

/// GCRA (the token bucket as a theoretical arrival time, microseconds of
/// the store's clock), twice: the key's bucket (`KEYS[1]`), and this
/// instance's bucket of its share of the rate and the burst (`KEYS[3]`).
/// Takes up to `want` tokens from both. Answers `{granted, 0, left, full}`
/// or `{0, milliseconds until both have a token, 0, full}`: `left` is what
/// this instance could still take now (the fewer of the key's tokens and
/// its share's), `full` the milliseconds until the key's bucket is whole.
const TOKEN_BUCKET_BODY: &str = r"
local interval = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local mine = interval / share
local my_capacity = math.max(1, math.ceil(capacity * share))
-- At least what this instance's share makes while an answer travels
-- back (`ARGV[7]`: its round trip to the store, µs), twice: a store that
-- answers late is asked for more at once, not waited for more often.
local rtt = tonumber(ARGV[7]) or 0
want = math.min(math.max(want, math.ceil(2 * rtt / mine)), math.max(want, my_capacity))
-- Tokens of this instance's lease that ended unspent go back first, to
-- both buckets (never before now: a bucket holds no more than full).
local returned = tonumber(ARGV[6]) or 0
if returned > 0 then
  for _, kv in ipairs({{KEYS[1], interval}, {KEYS[3], mine}}) do
    local t = tonumber(redis.call('GET', kv[1]))
    if t ~= nil and t > now then
      t = math.max(now, t - returned * kv[2])
      redis.call('SET', kv[1], string.format('%.0f', t), 'PX', math.ceil((t - now) / 1000) + 1)
    end
  end
end
local function free(key, every, size)
  local tat = tonumber(redis.call('GET', key))
  if tat == nil or tat < now then tat = now end
  return tat, math.floor((now + size * every - tat) / every)
end
local tat, available = free(KEYS[1], interval, capacity)
local my_tat, my_available = free(KEYS[3], mine, my_capacity)
local granted = math.min(want, available, my_available)
if granted > 0 then
  tat = tat + granted * interval
  my_tat = my_tat + granted * mine
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  redis.call('SET', KEYS[3], string.format('%.0f', my_tat), 'PX', math.ceil((my_tat - now) / 1000) + 1)
  return {granted, 0, math.min(available, my_available) - granted, math.ceil((tat - now) / 1000)}
end
local wait = math.max(tat + interval - capacity * interval - now, my_tat + mine - my_capacity * mine - now)
return {0, math.max(1, math.ceil(wait / 1000)), 0, math.ceil((tat - now) / 1000)}
";

/// A fixed window of `ARGV[1]` ms aligned on the store's clock: takes up
/// to `want` of the window's `limit`, and of this instance's share of it
/// (counted in the same hash). Answers `{granted, milliseconds until the
/// window ends, left, the same milliseconds}` (`left`: what this instance
/// could still take in the window).
const FIXED_WINDOW_BODY: &str = r"
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local w = math.floor(nowms / window)
local mine = 'i:' .. id
local cur = redis.call('HMGET', KEYS[1], 'w', 'c', mine)
local used, my_used = 0, 0
if tonumber(cur[1]) == w then
  used = tonumber(cur[2]) or 0
  my_used = tonumber(cur[3]) or 0
else
  redis.call('DEL', KEYS[1])
end
local my_limit = math.max(1, math.ceil(limit * share))
local granted = math.max(0, math.min(want, limit - used, my_limit - my_used))
local left = math.max(1, (w + 1) * window - nowms)
if granted > 0 then
  redis.call('HSET', KEYS[1], 'w', string.format('%.0f', w), 'c', used + granted, mine, my_used + granted)
  redis.call('PEXPIRE', KEYS[1], left + 1000)
end
return {granted, left, math.max(0, math.min(limit - used, my_limit - my_used) - granted), left}
";

/// Gives `ARGV[2]` unspent tokens back to a key: a token bucket's
/// arrival time moves back by as many intervals (`ARGV[1]` µs; never
/// before now: a bucket cannot hold more than it holds full), a fixed
/// window's count (and this instance's, `ARGV[3]`) goes down if the
/// window is still the one they were taken in (`ARGV[4]` ms long). The
/// instance leaves the key: its demand leaves the key's (`KEYS[2]`) and
/// its share's bucket (`KEYS[3]`) goes; it claims no share.
const GIVE_BACK: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tokens = tonumber(ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[3])
redis.call('DEL', KEYS[3])
if ARGV[5] == 'tb' then
  local interval = tonumber(ARGV[1])
  local tat = tonumber(redis.call('GET', KEYS[1]))
  if tat == nil or tat <= now then return 0 end
  tat = math.max(now, tat - tokens * interval)
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  return tokens
end
local window = tonumber(ARGV[4])
local w = math.floor(math.floor(now / 1000) / window)
local cur = redis.call('HMGET', KEYS[1], 'w', 'c', 'i:' .. ARGV[3])
if tonumber(cur[1]) ~= w then return 0 end
local back = math.min(tokens, tonumber(cur[2]) or 0)
redis.call('HSET', KEYS[1], 'c', (tonumber(cur[2]) or 0) - back, 'i:' .. ARGV[3], math.max(0, (tonumber(cur[3]) or 0) - back))
return back
";

/// Where each script starts: the store's clock, in microseconds.
const CLOCK: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
";

/// Records this instance as alive and answers how many are.
const BEAT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])
";

fn scripts() -> &'static [Script; 4] {
    static SCRIPTS: OnceLock<[Script; 4]> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        [
            Script::new(&format!("{CLOCK}{SHARE}{TOKEN_BUCKET_BODY}")),
            Script::new(&format!("{CLOCK}{SHARE}{FIXED_WINDOW_BODY}")),
            Script::new(BEAT_SCRIPT),
            Script::new(GIVE_BACK),
        ]
    })
}

/// What the store granted: tokens, and milliseconds (until a token when
/// none were granted; until the window ends for a fixed window); what
/// this instance could still take, and the milliseconds until the key's
/// quota is whole again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    pub tokens: u32,
    pub ms: u64,
    pub left: u32,
    pub full_ms: u64,
}

/// A request for tokens, as the scripts take it.
#[derive(Debug, Clone, Copy)]
pub enum Ask {
    /// Microseconds per token, the bucket's size.
    TokenBucket { interval_us: u64, capacity: u32 },
    /// The window's milliseconds and its limit.
    FixedWindow { window_ms: u64, limit: u32 },
}

/// Buckets of the time a request waited for the store (seconds): the
/// deadline is 1–1000 ms.
const WAIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

pub struct Store {
    spec: StoreSpec,
    /// How the store is reached (none when the spec could not be made a
    /// client: every decision falls back).
    source: Option<Source>,
    /// Where the connection and the tasks run (none outside a runtime:
    /// the store then never answers and every decision falls back).
    runtime: Option<tokio::runtime::Handle>,
    /// The connection to the store (to the master the sentinels named
    /// last, with Sentinel).
    conn: ArcSwapOption<Connection>,
    up: AtomicBool,
    /// Instances seen beating in the last `BEAT_TTL` (this one included).
    instances: AtomicU32,
    /// How long the store takes to answer a take (µs, smoothed).
    rtt_us: AtomicU64,
    id: String,
    started: OnceLock<()>,
    /// Whether the first beat has been answered or has failed: until then
    /// this instance does not know how many share a limit, and does not
    /// decide alone.
    first: tokio::sync::watch::Sender<bool>,
    /// Failed calls, and changes of state.
    errors: Count,
    transitions: Count,
    /// Time requests waited for a decision from the store.
    wait: Histogram,
    /// Decisions that fell back, by `Miss`.
    misses: [Count; 3],
    exported: OnceLock<bool>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("spec", &self.spec)
            .field("up", &self.up)
            .field("instances", &self.instances)
            .finish_non_exhaustive()
    }
}

/// Series of one store: up, instances, errors, transitions, the deadline
/// misses by cause, and the histogram (buckets, `+Inf`, sum, count).
const STORE_SERIES: usize = 4 + Miss::ALL.len() + WAIT_BUCKETS.len() + 3;

/// Why a request's fleet decision fell back to `on_store_error`
/// (`cause` of `cutover_ratelimit_deadline_misses_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The store was down (or had never answered) when it decided.
    StoreDown,
    /// The key's refill did not land within the quota's `deadline`.
    RefillLate,
    /// A refill landed without tokens and without a refusal (its call
    /// failed), or the request waited through every refill it may.
    NoGrant,
}

impl Miss {
    pub const ALL: [Miss; 3] = [Miss::StoreDown, Miss::RefillLate, Miss::NoGrant];

    pub fn name(self) -> &'static str {
        match self {
            Miss::StoreDown => "store_down",
            Miss::RefillLate => "refill_late",
            Miss::NoGrant => "no_grant",
        }
    }
}

/// How the store is reached.
enum Source {
    /// One address (`url`).
    Direct(Client),
    /// The master the sentinels name (asked by one task at a time).
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

/// A connection and the address it goes to.
struct Connection {
    manager: ConnectionManager,
    addr: ConnectionAddr,
}

impl Store {
    pub fn new(spec: &StoreSpec) -> Self {
        let source = source(spec)
            .map_err(|e| tracing::error!(store = %spec.url, error = %e, "rate-limit store refused"))
            .ok();
        let runtime = tokio::runtime::Handle::try_current().ok();
        // Without a client or a runtime no beat will ever be tried.
        let first = tokio::sync::watch::channel(source.is_none() || runtime.is_none()).0;
        Store {
            spec: spec.clone(),
            source,
            runtime,
            first,
            conn: ArcSwapOption::empty(),
            up: AtomicBool::new(false),
            instances: AtomicU32::new(1),
            rtt_us: AtomicU64::new(0),
            id: format!("{}-{:016x}", std::process::id(), fastrand::u64(..)),
            started: OnceLock::new(),
            errors: Count::new(),
            transitions: Count::new(),
            wait: Histogram::new(WAIT_BUCKETS),
            misses: [Count::new(), Count::new(), Count::new()],
            exported: OnceLock::new(),
        }
    }

    /// Connects and starts the keeper (once; a store found again in the
    /// map is already started).
    pub fn start(self: &Arc<Self>) {
        self.started.get_or_init(|| {
            self.exported.get_or_init(|| {
                let admitted = series::admit(STORE_SERIES);
                if admitted {
                    series::register(self);
                }
                admitted
            });
            if let Some(runtime) = &self.runtime {
                runtime.spawn(keep(Arc::downgrade(self)));
            }
        });
    }

    pub fn spec(&self) -> &StoreSpec {
        &self.spec
    }

    /// Whether decisions ask the store now.
    #[inline]
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Whether the first beat has been answered (or has failed).
    pub fn first_beat_done(&self) -> bool {
        *self.first.borrow()
    }

    /// Waits for the first beat to be answered or to fail, at most
    /// `limit`.
    pub async fn first_beat(&self, limit: Duration) {
        let mut first = self.first.subscribe();
        let _ = tokio::time::timeout(limit, first.wait_for(|done| *done)).await;
    }

    /// Instances counting in the store (at least this one).
    pub fn instances(&self) -> u32 {
        self.instances.load(Ordering::Relaxed).max(1)
    }

    pub fn runtime(&self) -> Option<&tokio::runtime::Handle> {
        self.runtime.as_ref()
    }

    /// The store key of a quota's key: the prefix, the route, the
    /// algorithm, and a digest of the key's bytes (a header value may be
    /// long; every instance makes the same digest). The scripts also use
    /// it with `:demand` and `:i:INSTANCE` appended.
    pub fn key(&self, route: &str, algorithm: &str, key: &[u8]) -> Vec<u8> {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(key);
        let mut out = Vec::with_capacity(self.spec.key_prefix.len() + route.len() + 48);
        out.extend_from_slice(self.spec.key_prefix.as_bytes());
        out.extend_from_slice(b"rl:");
        out.extend_from_slice(route.as_bytes());
        out.push(b':');
        out.extend_from_slice(algorithm.as_bytes());
        // In braces: a key's demand and per-instance keys (its suffixes)
        // hash to the same slot of a Redis Cluster.
        out.extend_from_slice(b":{");
        for byte in digest.iter().take(16) {
            out.extend_from_slice(format!("{byte:02x}").as_bytes());
        }
        out.push(b'}');
        out
    }

    /// Takes up to `want` tokens of `key` (one round trip), within this
    /// instance's share of the key's `demand` (requests a second this
    /// instance's clients offer it) among the fleet's; first gives back
    /// `returned` tokens of a token bucket's lease that ended unspent.
    pub async fn take(
        &self,
        key: &[u8],
        ask: Ask,
        want: u32,
        demand: f64,
        returned: u32,
    ) -> Result<Grant, ()> {
        let [token_bucket, fixed_window, _, _] = scripts();
        let script = match ask {
            Ask::TokenBucket { .. } => token_bucket,
            Ask::FixedWindow { .. } => fixed_window,
        };
        let mut call = script.key(key);
        call.key([key, b":demand"].concat())
            .key([key, b":i:", self.id.as_bytes()].concat());
        match ask {
            Ask::TokenBucket {
                interval_us,
                capacity,
            } => call.arg(interval_us.max(1)).arg(capacity),
            Ask::FixedWindow { window_ms, limit } => call.arg(window_ms.max(1)).arg(limit),
        };
        call.arg(want)
            .arg(&self.id)
            .arg(format!("{:.3}", demand.max(0.0)))
            .arg(returned)
            .arg(self.rtt_us.load(Ordering::Relaxed));
        let Some(mut conn) = self.connection() else {
            return Err(());
        };
        let sent = std::time::Instant::now();
        let answer: Result<Vec<i64>, String> =
            match tokio::time::timeout(self.spec.timeout, call.invoke_async(&mut conn)).await {
                Ok(Ok(answer)) => {
                    // Smoothed, an eighth to each answer.
                    let took = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                    let rtt = self.rtt_us.load(Ordering::Relaxed);
                    let next = if rtt == 0 { took } else { (rtt * 7 + took) / 8 };
                    self.rtt_us.store(next, Ordering::Relaxed);
                    Ok(answer)
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {:?}", self.spec.timeout)),
            };
        match answer {
            Ok(answer) => {
                let tokens = answer
                    .first()
                    .copied()
                    .unwrap_or(0)
                    .clamp(0, i64::from(u32::MAX));
                let at = |i: usize| answer.get(i).copied().unwrap_or(0).max(0);
                Ok(Grant {
                    tokens: u32::try_from(tokens).unwrap_or(0),
                    ms: u64::try_from(at(1)).unwrap_or(0),
                    left: u32::try_from(at(2)).unwrap_or(u32::MAX),
                    full_ms: u64::try_from(at(3)).unwrap_or(0),
                })
            }
            Err(why) => {
                self.failed(&why);
                Err(())
            }
        }
    }

    /// Gives `tokens` leased and not spent back to `key` (see
    /// `GIVE_BACK`); how many the store took back.
    pub async fn give_back(&self, key: &[u8], ask: Ask, tokens: u32) -> Result<u32, ()> {
        let [_, _, _, script] = scripts();
        let Some(mut conn) = self.connection() else {
            return Err(());
        };
        let mut call = script.key(key);
        call.key([key, b":demand"].concat())
            .key([key, b":i:", self.id.as_bytes()].concat());
        match ask {
            Ask::TokenBucket { interval_us, .. } => call
                .arg(interval_us.max(1))
                .arg(tokens)
                .arg(&self.id)
                .arg(0)
                .arg("tb"),
            Ask::FixedWindow { window_ms, .. } => call
                .arg(0)
                .arg(tokens)
                .arg(&self.id)
                .arg(window_ms.max(1))
                .arg("fw"),
        };
        match tokio::time::timeout(self.spec.timeout, call.invoke_async::<i64>(&mut conn)).await {
            Ok(Ok(back)) => Ok(u32::try_from(back.max(0)).unwrap_or(0)),
            Ok(Err(e)) => {
                self.failed(&e.to_string());
                Err(())
            }
            Err(_) => {
                self.failed(&format!("no answer within {:?}", self.spec.timeout));
                Err(())
            }
        }
    }

    /// A handle on the connection (a clone shares it).
    fn connection(&self) -> Option<ConnectionManager> {
        self.conn.load().as_ref().map(|c| c.manager.clone())
    }

    /// Counts a decision that fell back to `on_store_error`.
    pub fn missed(&self, cause: Miss) {
        if let Some(count) = Miss::ALL
            .iter()
            .position(|m| *m == cause)
            .and_then(|i| self.misses.get(i))
        {
            count.add(1);
        }
    }

    /// Decisions that fell back for `cause` so far.
    pub fn misses(&self, cause: Miss) -> u64 {
        Miss::ALL
            .iter()
            .position(|m| *m == cause)
            .and_then(|i| self.misses.get(i))
            .map_or(0, Count::get)
    }

    /// Records the time a request waited for the store.
    pub fn waited(&self, waited: Duration) {
        self.wait.record(waited);
    }

    fn failed(&self, why: &str) {
        let first = self
            .first
            .send_if_modified(|done| !std::mem::replace(done, true));
        self.errors.add(1);
        let was_up = self.up.swap(false, Ordering::AcqRel);
        if was_up {
            self.transitions.add(1);
        }
        // Once per change of state, and once for a store never reached
        // (a wrong CA or address shows at start, not only in metrics).
        if was_up || first {
            let instances = self.instances.load(Ordering::Relaxed).max(1);
            tracing::warn!(
                store = %self.spec.url,
                error = %why,
                instances,
                "rate-limit store failed: until it answers again each fleet quota decides by its on_store_error: \
                 \"local\" (the default) admits this instance's share, 1/{instances} of the limit as the fleet was last counted; \
                 \"allow\" admits every request uncounted; \"deny\" answers 503"
            );
        }
    }

    fn answered(&self, instances: u32) {
        self.instances.store(instances.max(1), Ordering::Relaxed);
        self.first
            .send_if_modified(|done| !std::mem::replace(done, true));
        if !self.up.swap(true, Ordering::AcqRel) {
            self.transitions.add(1);
            tracing::info!(
                store = %self.spec.url,
                instances,
                "rate-limit store answers: fleet quotas count in it"
            );
        }
    }

    /// One beat: records this instance and reads how many there are.
    async fn beat(&self) {
        let Some(mut conn) = self.connection() else {
            return;
        };
        let [_, _, beat, _] = scripts();
        let mut key = self.spec.key_prefix.clone().into_bytes();
        key.extend_from_slice(b"instances");
        let mut invocation = beat.key(key);
        invocation
            .arg(&self.id)
            .arg(u64::try_from(BEAT_TTL.as_millis()).unwrap_or(5000));
        let call = invocation.invoke_async::<i64>(&mut conn);
        match tokio::time::timeout(self.spec.timeout, call).await {
            Ok(Ok(n)) => self.answered(u32::try_from(n).unwrap_or(1)),
            Ok(Err(e)) => self.failed(&e.to_string()),
            Err(_) => self.failed(&format!("no answer within {:?}", self.spec.timeout)),
        }
    }
}

/// The certificates of a `rediss://` store (none: the Mozilla roots).
fn certificates(spec: &StoreSpec) -> Option<TlsCertificates> {
    let tls = spec.tls.as_ref()?;
    Some(TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    })
}

/// How a validated spec reaches the store (the passwords from their
/// files).
fn source(spec: &StoreSpec) -> redis::RedisResult<Source> {
    if let Some(sentinel) = &spec.sentinel {
        let nodes = sentinel
            .nodes
            .iter()
            .map(|node| Ok(node.as_str().into_connection_info()?.addr().clone()))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let mut builder =
            SentinelClientBuilder::new(nodes, &sentinel.master, SentinelServerType::Master)?
                .set_client_to_redis_db(sentinel.db);
        if let Some(user) = &spec.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &spec.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(user) = &sentinel.username {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = &sentinel.password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(certificates) = certificates(spec) {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates);
        }
        return Ok(Source::Sentinel(tokio::sync::Mutex::new(builder.build()?)));
    }
    let mut info = spec.url.as_str().into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &spec.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &spec.password {
        settings = settings.set_password(password);
    }
    info = info.set_redis_settings(settings);
    Ok(Source::Direct(match certificates(spec) {
        Some(certificates) => Client::build_with_tls(info, certificates)?,
        None => Client::open(info)?,
    }))
}

impl Store {
    /// Makes the connection if there is none (direct), or if the sentinels
    /// now name another master than the one it goes to. A direct
    /// connection is made once: the manager reconnects by itself.
    async fn connect(&self) -> Result<(), String> {
        let client = match &self.source {
            None => return Err("no client".into()),
            Some(Source::Direct(client)) => {
                if self.conn.load().is_some() {
                    return Ok(());
                }
                client.clone()
            }
            Some(Source::Sentinel(sentinel)) => {
                let mut sentinel = sentinel.lock().await;
                match tokio::time::timeout(self.spec.timeout, sentinel.async_get_client()).await {
                    Ok(Ok(client)) => client,
                    Ok(Err(e)) => return Err(format!("no sentinel named the master: {e}")),
                    Err(_) => {
                        return Err(format!(
                            "no sentinel named the master within {:?}",
                            self.spec.timeout
                        ))
                    }
                }
            }
        };
        let addr = client.get_connection_info().addr().clone();
        if self.conn.load().as_ref().is_some_and(|c| c.addr == addr) {
            return Ok(());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.spec.timeout))
            .set_response_timeout(Some(self.spec.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let manager =
            ConnectionManager::new_lazy_with_config(client, config).map_err(|e| e.to_string())?;
        if self.conn.load().is_some() {
            tracing::warn!(store = %self.spec.url, master = %addr, "rate-limit store: the sentinels name a new master; counting moves to it");
        }
        self.conn
            .store(Some(Arc::new(Connection { manager, addr })));
        Ok(())
    }
}

/// Beats while the store answers and probes while it does not (asking
/// the sentinels again each time, with Sentinel), for as long as the
/// store is held.
async fn keep(store: Weak<Store>) {
    loop {
        let pause = {
            let Some(live) = store.upgrade() else {
                return;
            };
            if live.source.is_none() {
                return;
            }
            let needs = live.conn.load().is_none()
                || (!live.is_up() && matches!(live.source, Some(Source::Sentinel(_))));
            match if needs { live.connect().await } else { Ok(()) } {
                Ok(()) => live.beat().await,
                Err(why) => live.failed(&why),
            }
            if live.is_up() {
                BEAT
            } else {
                PROBE
            }
        };
        tokio::time::sleep(pause).await;
    }
}

impl Exported for Store {
    fn samples(&self, out: &mut Vec<Sample>) {
        if self.exported.get() != Some(&true) {
            return;
        }
        let labels: series::Labels = vec![(m::LABEL_STORE, self.spec.url.clone().into())];
        for (family, value) in [
            (
                &series::RATELIMIT_STORE_UP,
                f64::from(u8::from(self.is_up())),
            ),
            (
                &series::RATELIMIT_STORE_INSTANCES,
                f64::from(self.instances()),
            ),
            (&series::RATELIMIT_STORE_ERRORS, self.errors.get() as f64),
            (
                &series::RATELIMIT_STORE_TRANSITIONS,
                self.transitions.get() as f64,
            ),
        ] {
            out.push(series::sample(family, labels.clone(), value));
        }
        for (cause, count) in Miss::ALL.iter().zip(&self.misses) {
            let mut labels = labels.clone();
            labels.push((m::LABEL_CAUSE, cause.name().into()));
            out.push(series::sample(
                &series::RATELIMIT_DEADLINE_MISSES,
                labels,
                count.get() as f64,
            ));
        }
        if self.wait.count() > 0 {
            self.wait
                .samples(&series::RATELIMIT_STORE_WAIT, &labels, out);
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.exported.get() == Some(&true) {
            series::retire(self);
            series::release(STORE_SERIES);
        }
    }
}

//! Process-shared backend state, keyed by backend identity (DESIGN §12).
//!
//! A [`Backend`] is everything about one backend that outlives a
//! generation: its connection pools and client codecs (`client`, `h1`),
//! its load (in-flight requests, peak-EWMA latency), its health as active
//! checks see it (`health`), its outlier state as traffic sees it
//! (`outlier`) and its counters. The [`BackendRegistry`] hands out one
//! `Arc<Backend>` per [`BackendKey`] (address, protocol, timeouts, TLS
//! settings, health check) to every generation that names it, so an
//! activation that keeps a backend's identity keeps all of that; a changed
//! identity is a different backend and starts fresh. The registry holds
//! backends weakly: when no live generation names a backend any more it
//! is dropped with its pools, and its health checker stops.
//!
//! This module knows nothing of generations: `generation::Upstream` holds
//! handles into it and decides, with its own policy, which backend a
//! request goes to.

mod backend;
mod budget;
mod client;
mod dial;
mod h1;
mod h2;
mod health;
mod load;
mod outlier;
mod quic;
mod send_proxy;
mod transport;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

pub use backend::{Attempt, Backend, BackendError, BackendGuard, Usable};
pub use budget::RetryBudget;
pub use client::{BoxError, ClientBody, RequestBody, SignalledBody, UpstreamClient};
pub use dial::{dial, ConnectError};
pub use h1::{
    header_tokens, request as request_h1, ExchangeError, H1Pool, SendError, UpstreamBody,
};
pub use h2::H2Pool;
pub use health::HealthState;
pub use quic::{H3AnswerBody, Pooled, QuicClient, QuicError};
pub use transport::{connect_error, send, AnswerBody, Sending, TransportError};

use crate::clock::{now_ms, unix_ms};
use crate::plan::{HealthSpec, UpstreamProtocol};
use crate::tls::UpstreamTlsSpec;
use crate::weak_map::WeakMap;

/// What makes two backends the same backend: address, transport and the
/// active check that judges it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BackendKey {
    pub addr: String,
    pub protocol: UpstreamProtocol,
    pub connect_timeout: Duration,
    /// How long a connection to it may be silent, pooled or mid-exchange.
    pub idle_timeout: Duration,
    /// TLS settings, including a fingerprint of the files they name, so a
    /// rotated CA or client certificate makes a new backend.
    pub tls: Option<UpstreamTlsSpec>,
    pub health: Option<HealthSpec>,
    /// Each connection starts with a PROXY header naming its client: its
    /// connections are then never shared between clients.
    pub proxy_protocol: Option<crate::plan::ProxyProtocol>,
}

/// Whether a failed connect was this process's doing (descriptors,
/// memory, local ports) rather than the backend's.
pub fn local_failure(error: &std::io::Error) -> bool {
    use rustix::io::Errno;
    error.raw_os_error().is_some_and(|code| {
        [
            Errno::MFILE,
            Errno::NFILE,
            Errno::NOBUFS,
            Errno::NOMEM,
            Errno::ADDRNOTAVAIL,
        ]
        .iter()
        .any(|e| e.raw_os_error() == code)
    })
}

/// The PROXY header a backend connection for one client starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyHeader {
    pub version: crate::plan::ProxyProtocol,
    /// The client (the peer, or what a trusted PROXY header carried).
    pub client: std::net::SocketAddr,
    /// Where the client connected: the listener's address.
    pub local: std::net::SocketAddr,
}

/// The process-wide set of backends, by identity, and the retry budgets,
/// by upstream name. Holds both weakly: what no generation names any more
/// is dropped (a backend with its pool).
#[derive(Debug, Default, Clone)]
pub struct BackendRegistry {
    backends: Arc<WeakMap<BackendKey, Backend>>,
    budgets: Arc<WeakMap<String, RetryBudget>>,
}

impl BackendRegistry {
    /// The live backend for `key`, or a new one (whose first health
    /// check, if it has one, starts at once).
    pub fn get_or_create(&self, key: BackendKey) -> Result<Arc<Backend>, BackendError> {
        self.backends.get_or_try_insert(&key, || {
            let backend = Backend::exported(key.clone())?;
            health::start(&backend);
            note_state_change();
            Ok(backend)
        })
    }

    /// The retry budget of upstream `name`: the live one, or a new one.
    pub fn budget(&self, name: &str) -> Arc<RetryBudget> {
        match self.budgets.get_or_try_insert(name, || {
            Ok::<_, std::convert::Infallible>(RetryBudget::new(name))
        }) {
            Ok(budget) => budget,
            Err(never) => match never {},
        }
    }

    /// How many backends are alive.
    pub fn live(&self) -> usize {
        self.backends.live()
    }
}

/// How many times a backend's health or ejection changed, a backend was
/// created, or a discovered membership was rebuilt, since start: what the
/// console's timeline compares to know whether any backend's state can
/// have moved since its last look (an idle gateway with 10 000 backends
/// then looks at none of them).
static STATE_CHANGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The count of state changes so far (see [`STATE_CHANGES`]).
pub fn state_changes() -> u64 {
    STATE_CHANGES.load(std::sync::atomic::Ordering::Acquire)
}

/// Notes that some backend's state, or some upstream's membership, moved.
pub fn note_state_change() {
    STATE_CHANGES.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

/// Data-plane workers: backends keep their pooled HTTP/1.1 connections in
/// one share per worker, so that a connection is only ever driven by the
/// thread whose reactor it is registered with.
static SHARDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

thread_local! {
    static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sets how many workers there are; before any backend is created.
pub fn set_shards(workers: usize) {
    SHARDS.store(workers.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// Marks the calling thread as worker `index`.
pub fn enter_shard(index: usize) {
    SHARD.with(|shard| shard.set(index));
    ON_WORKER.with(|on| on.set(true));
}

fn shards() -> usize {
    SHARDS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The calling thread's share (0 off the workers).
fn shard() -> usize {
    SHARD.with(std::cell::Cell::get)
}

/// The calling thread's pooled client among `clients` (one per worker,
/// and the last for every other thread: health checks, the control
/// runtime).
fn client_shard(clients: usize) -> usize {
    if ON_WORKER.with(std::cell::Cell::get) {
        shard() % clients.saturating_sub(1).max(1)
    } else {
        clients.saturating_sub(1)
    }
}

/// What `GET /admin/runtime/backends` shows of one backend.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BackendView {
    pub addr: String,
    pub protocol: Cow<'static, str>,
    pub health: HealthState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_check: Option<CheckView>,
    pub ejected: bool,
    /// End of the current ejection, Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ejected_until_unix_ms: Option<u64>,
    pub ejections: u64,
    pub inflight: u64,
    /// Peak-EWMA latency to the response head, milliseconds (timed for
    /// `p2c` upstreams only; `null` before a sample).
    pub ewma_ms: Option<f64>,
    pub attempts: u64,
    pub failures: u64,
    /// Live generations (active, or with work pinned) that name it.
    pub generations: Vec<u64>,
    /// The discovery source it is a member by (`dns:…`, `srv:…`,
    /// `file:…`); absent for an `addr` entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Its weight, when not 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Its priority (SRV, endpoints files), when not 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u16>,
    /// `h3` and `auto` backends: where HTTP/3 stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<quic::QuicView>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckView {
    pub ago_ms: u64,
    pub passed: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Backend {
    /// What the console's timeline shows of it: `ejected`, or its health
    /// (`healthy`, `unhealthy`, `unknown`, `unchecked`).
    pub fn state_name(&self) -> &'static str {
        if self.outlier.is_ejected() {
            "ejected"
        } else {
            self.health.state().name()
        }
    }

    /// The admin view; `live` are the ids of the live generations.
    pub fn view(&self, live: &[u64]) -> BackendView {
        let until = self.outlier.ejected_until_ms();
        BackendView {
            addr: self.key.addr.clone(),
            protocol: match self.key.protocol {
                UpstreamProtocol::Http1 => "http1".into(),
                UpstreamProtocol::H2c => "h2c".into(),
                UpstreamProtocol::Https => "https".into(),
                UpstreamProtocol::H2 => "h2".into(),
                UpstreamProtocol::H3 => "h3".into(),
                UpstreamProtocol::Auto => "auto".into(),
            },
            health: self.health.state(),
            last_check: self.health.last().map(|c| CheckView {
                ago_ms: now_ms().saturating_sub(c.at_ms),
                passed: c.passed,
                detail: c.detail,
            }),
            ejected: until.is_some(),
            ejected_until_unix_ms: until.map(unix_ms),
            ejections: self.outlier.ejections(),
            inflight: self.inflight(),
            ewma_ms: self.load.ewma().map(|d| d.as_secs_f64() * 1000.0),
            attempts: self.attempts(),
            failures: self.failures(),
            generations: self.named_by_any_of(live),
            source: None,
            weight: None,
            priority: None,
            quic: self.quic.as_ref().map(QuicClient::view),
        }
    }
}

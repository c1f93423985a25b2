//! One backend: its clients and pools, and the state traffic and checks
//! keep about it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{StatusCode, Version};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::client::{TimedConnector, UpstreamClient};
use super::health::Health;
use super::load::Load;
use super::outlier::{Failure, Outlier};
use super::BackendKey;
use crate::plan::{OutlierSpec, UpstreamProtocol};
use crate::telemetry::metrics as m;
use crate::telemetry::series::{self, Count, Exported, Histogram, Sample};

/// How one attempt at a backend ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// A response head came back (for TCP: the connection was made).
    Answered(StatusCode),
    ConnectError,
    Timeout,
    /// Reset, closed early, or an answer that could not be read.
    Error,
}

impl Attempt {
    /// Whether outlier detection counts it against the backend: gateway
    /// failures and 5xx (DESIGN §12).
    pub fn is_failure(self) -> bool {
        match self {
            Attempt::Answered(status) => status.is_server_error(),
            _ => true,
        }
    }

    fn counter_index(self) -> usize {
        match self {
            Attempt::Answered(_) => 0,
            Attempt::ConnectError => 1,
            Attempt::Timeout => 2,
            Attempt::Error => 3,
        }
    }
}

/// Whether a backend takes traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usable {
    Yes,
    /// Unhealthy, unknown or ejected.
    No,
}

/// The body of an answer to one of the gateway's own requests.
pub type OwnBody = http_body_util::combinators::BoxBody<bytes::Bytes, OwnBodyError>;

/// Why such a body failed. (A concrete type: a boxed error here trips
/// the compiler's check that the health checker's future is `Send`.)
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OwnBodyError(String);

fn own_body_error(error: impl std::fmt::Display) -> OwnBodyError {
    OwnBodyError(error.to_string())
}

/// One backend, shared by every generation that names it.
#[derive(Debug)]
pub struct Backend {
    pub key: BackendKey,
    /// The address, shared with access-log lines.
    pub label: Arc<str>,
    pub authority: Authority,
    /// `http` or `https`, for the upstream request URI.
    pub scheme: Scheme,
    /// The HTTP version requests to this backend carry.
    pub version: Version,
    /// hyper-util's pooled clients (TLS, h2 and h2c backends, upgrades,
    /// health checks): one per worker, and one for other threads.
    clients: Box<[UpstreamClient]>,
    /// For plain HTTP/1.1 backends: connections driven by the requests'
    /// own tasks (see `h1`). Upgrades still use `client`.
    pub h1: Option<super::H1Pool>,
    /// For h2c and h2 backends: cutover's own HTTP/2 client (`h2`).
    /// Upgrades still use `client`.
    pub h2: Option<super::H2Pool>,
    /// For `h3` and `auto` backends: HTTP/3 over QUIC (`quic.rs`).
    pub quic: Option<super::QuicClient>,
    pub load: Load,
    pub health: Health,
    pub outlier: Outlier,
    attempts: AtomicU64,
    failures: AtomicU64,
    /// Attempts by outcome, in `Attempt::counter_index` order.
    outcomes: [Count; 4],
    ejections: Count,
    /// Active health check results: passed, failed.
    pub checks: [Count; 2],
    /// Whether the series budget took this backend's series.
    exported: bool,
    /// How long new connections took to open (every protocol; for TLS,
    /// the TCP part).
    connect_time: Arc<Histogram>,
    /// Ids of the most recent generations built with this backend (an
    /// opaque number here), for the admin view.
    named_by: Mutex<VecDeque<u64>>,
}

/// Generation ids a backend remembers naming it.
const NAMED_BY: usize = 64;

impl Backend {
    pub(super) fn new(key: BackendKey) -> Result<Self, BackendError> {
        let authority: Authority = key
            .addr
            .parse()
            .map_err(|_| BackendError::Address(key.addr.clone()))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(key.connect_timeout));
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let connect_time = Arc::new(Histogram::new(m::CONNECT_DURATION_BUCKETS));
        // One pooled client per worker (and one for other threads): an
        // HTTP/2 connection's task runs on the thread that opened it, so a
        // connection shared by the workers woke another thread for half of
        // the requests (`docs/performance.md`, gRPC).
        let tls = match &key.tls {
            Some(tls) => Some(crate::tls::client_config(tls).map_err(BackendError::Tls)?),
            None => None,
        };
        let clients = (0..=super::shards())
            .map(|_| Self::pooled_client(&key, tls.as_ref(), &connector, &connect_time))
            .collect::<Result<Box<[_]>, _>>()?;
        let quic = match &tls {
            Some(tls) => super::QuicClient::new(
                key.protocol,
                &key.addr,
                key.tls.as_ref().and_then(|t| t.server_name.as_deref()),
                tls.clone(),
                (key.connect_timeout, key.idle_timeout),
                clients.len(),
            )
            .map_err(|e| BackendError::Quic(e.to_string()))?,
            None => None,
        };
        let h1 = (key.tls.is_none() && key.protocol == UpstreamProtocol::Http1)
            .then(|| super::H1Pool::new(256, key.idle_timeout, Arc::clone(&connect_time)));
        let h2 = Self::h2_pool(&key, &authority, tls.as_ref(), &connect_time)?;
        let scheme = if key.tls.is_some() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        let version = match key.protocol {
            UpstreamProtocol::H2c | UpstreamProtocol::H2 => Version::HTTP_2,
            UpstreamProtocol::H3 => Version::HTTP_3,
            _ => Version::HTTP_11,
        };
        Ok(Self {
            outcomes: Default::default(),
            ejections: Count::default(),
            checks: Default::default(),
            exported: false,
            connect_time,
            health: Health::new(key.health.is_some()),
            label: Arc::from(key.addr.as_str()),
            key,
            authority,
            scheme,
            version,
            h1,
            h2,
            clients,
            quic,
            load: Load::default(),
            outlier: Outlier::default(),
            attempts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            named_by: Mutex::new(VecDeque::new()),
        })
    }

    /// The pooled client of the calling thread.
    pub fn client(&self) -> &UpstreamClient {
        // INVARIANT: `clients` holds at least two (`shards()` is at least
        // 1), and `client_shard` returns an index below its length.
        &self.clients[super::client_shard(self.clients.len())]
    }

    /// The QUIC connection a request to this backend takes now: `None`
    /// for TCP (every backend but `h3` and `auto`, and `auto` while QUIC
    /// is not up).
    pub async fn quic_connection(&self) -> Result<Option<super::Pooled>, super::QuicError> {
        match &self.quic {
            Some(quic) => {
                quic.connection(super::client_shard(self.clients.len()))
                    .await
            }
            None => Ok(None),
        }
    }

    /// An exchange over QUIC failed (see `QuicClient::exchange_failed`).
    pub fn quic_failed(&self, error: &super::QuicError) {
        if let Some(quic) = &self.quic {
            quic.exchange_failed(super::client_shard(self.clients.len()), error);
        }
    }

    /// A request of the gateway's own (health checks), through the same
    /// door as proxied ones (`transport`): over QUIC for an `h3` backend,
    /// through the pooled client otherwise.
    pub async fn own_request(
        &self,
        request: http::Request<super::SignalledBody>,
    ) -> Result<http::Response<OwnBody>, String> {
        use http_body_util::BodyExt;
        let response = super::transport::pooled(self, request, false)
            .await
            .map_err(|e| e.to_string())?;
        Ok(response.map(|body| body.map_err(own_body_error).boxed()))
    }

    /// cutover's own HTTP/2 client, for h2c backends and TLS h2 ones.
    fn h2_pool(
        key: &BackendKey,
        authority: &Authority,
        config: Option<&rustls::ClientConfig>,
        connect_time: &Arc<Histogram>,
    ) -> Result<Option<super::H2Pool>, BackendError> {
        let tls = match (key.protocol, &key.tls, config) {
            (UpstreamProtocol::H2c, None, _) => None,
            (UpstreamProtocol::H2, Some(tls), Some(config)) => {
                // As hyper-rustls names it: `server_name`, else the host.
                let host = authority
                    .host()
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let name = tls.server_name.as_deref().unwrap_or(host).to_owned();
                let name = rustls_pki_types::ServerName::try_from(name.clone())
                    .map_err(|_| BackendError::ServerName(name))?;
                Some(super::h2::Tls::new(config.clone(), name))
            }
            _ => return Ok(None),
        };
        Ok(Some(super::H2Pool::new(
            key.connect_timeout,
            key.idle_timeout,
            Arc::clone(connect_time),
            tls,
        )))
    }

    fn pooled_client(
        key: &BackendKey,
        config: Option<&rustls::ClientConfig>,
        connector: &HttpConnector,
        connect_time: &Arc<Histogram>,
    ) -> Result<UpstreamClient, BackendError> {
        let connector = connector.clone();
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(key.idle_timeout)
            .pool_max_idle_per_host(1024)
            .http2_only(key.protocol.is_http2());
        Ok(match (&key.tls, config) {
            (Some(tls), Some(config)) => {
                let mut connector = connector;
                connector.enforce_http(false);
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(config.clone())
                    .https_only();
                let https = match &tls.server_name {
                    Some(name) => {
                        let name = rustls_pki_types::ServerName::try_from(name.clone())
                            .map_err(|_| BackendError::ServerName(name.clone()))?;
                        https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                            name,
                        ))
                    }
                    None => https,
                };
                let timed = TimedConnector::new(connector, Arc::clone(connect_time));
                let https = match key.protocol {
                    UpstreamProtocol::H2c | UpstreamProtocol::H2 => {
                        https.enable_http2().wrap_connector(timed)
                    }
                    // `auto` over TCP: HTTP/2 or HTTP/1.1, as ALPN settles.
                    UpstreamProtocol::Auto => https.enable_all_versions().wrap_connector(timed),
                    _ => https.enable_http1().wrap_connector(timed),
                };
                UpstreamClient::Tls(builder.build(https))
            }
            _ => UpstreamClient::Plain(
                builder.build(TimedConnector::new(connector, Arc::clone(connect_time))),
            ),
        })
    }

    /// Whether checks and outlier detection let a request through now.
    /// After an ejection this lets exactly one probe through: call it for
    /// the backend a request will go to, not for every candidate.
    #[inline]
    pub fn usable(&self) -> Usable {
        if self.health.passing() && self.outlier.admits() {
            Usable::Yes
        } else {
            Usable::No
        }
    }

    /// Whether it would take traffic, without claiming a probe.
    pub fn is_available(&self) -> bool {
        self.health.passing() && !self.outlier.is_ejected()
    }

    /// Records an attempt; returns whether outlier detection wants the
    /// backend ejected (the upstream decides, see `eject`).
    pub fn record(&self, attempt: Attempt, spec: &OutlierSpec) -> bool {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if let Some(counter) = self.outcomes.get(attempt.counter_index()) {
            counter.add(1);
        }
        if attempt.is_failure() {
            self.failures.fetch_add(1, Ordering::Relaxed);
            self.outlier.failure(spec) == Failure::Eject
        } else {
            self.outlier.success();
            false
        }
    }

    /// Ejects the backend (outlier detection asked, the upstream agreed).
    pub fn eject(&self, spec: &OutlierSpec) -> Duration {
        self.ejections.add(1);
        let length = self.outlier.eject(spec);
        tracing::warn!(backend = %self.key.addr, ejection = ?length, "backend ejected after consecutive failures");
        length
    }

    /// Records how long a connection to it took to open (TCP listeners
    /// connect themselves; hyper's client and the h1 pool record their own).
    pub fn connected_in(&self, elapsed: Duration) {
        self.connect_time.record(elapsed);
    }

    /// Notes that generation `id` was built with this backend.
    pub fn named_by(&self, id: u64) {
        let mut ids = self.named_by.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.back() != Some(&id) {
            if ids.len() == NAMED_BY {
                ids.pop_front();
            }
            ids.push_back(id);
        }
    }

    /// The generations among `live` that were built with this backend.
    pub fn named_by_any_of(&self, live: &[u64]) -> Vec<u64> {
        let ids = self.named_by.lock().unwrap_or_else(PoisonError::into_inner);
        ids.iter().copied().filter(|id| live.contains(id)).collect()
    }

    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    pub fn inflight(&self) -> u64 {
        self.load.inflight()
    }

    /// Counts one request to this backend until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> BackendGuard {
        self.load.start();
        BackendGuard {
            backend: Arc::clone(self),
        }
    }
}

/// Why a backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend address '{0}' cannot be used as an HTTP authority")]
    Address(String),
    #[error("'{0}' is not a TLS server name")]
    ServerName(String),
    #[error("upstream TLS: {0}")]
    Tls(crate::tls::TlsError),
    #[error("upstream QUIC: {0}")]
    Quic(String),
}

/// One in-flight request to a backend.
#[derive(Debug)]
pub struct BackendGuard {
    backend: Arc<Backend>,
}

impl BackendGuard {
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

/// Series of one backend: 4 outcomes, ejections, health, 2 check
/// outcomes, in flight, and the connect-time histogram.
const BACKEND_SERIES: usize = 4 + 1 + 1 + 2 + 1 + m::CONNECT_DURATION_BUCKETS.len() + 3;

impl Backend {
    /// Makes the backend and starts exporting its series (if they fit).
    pub(super) fn exported(key: BackendKey) -> Result<Arc<Self>, BackendError> {
        let mut backend = Self::new(key)?;
        backend.exported = series::admit(BACKEND_SERIES);
        let backend = Arc::new(backend);
        if backend.exported {
            series::register(&backend);
        }
        Ok(backend)
    }
}

impl Exported for Backend {
    fn samples(&self, out: &mut Vec<Sample>) {
        let labels = series::named(m::LABEL_BACKEND, &self.label);
        let with = |key, value: &'static str| {
            let mut labels = labels.clone();
            labels.push((key, value.into()));
            labels
        };
        for (count, outcome) in
            self.outcomes
                .iter()
                .zip(["ok", "connect_error", "timeout", "error"])
        {
            out.push(series::sample(
                &series::BACKEND_ATTEMPTS,
                with(m::LABEL_OUTCOME, outcome),
                count.get() as f64,
            ));
        }
        out.push(series::sample(
            &series::BACKEND_EJECTIONS,
            labels.clone(),
            self.ejections.get() as f64,
        ));
        out.push(series::sample(
            &series::BACKEND_HEALTHY,
            labels.clone(),
            if self.health.passing() { 1.0 } else { 0.0 },
        ));
        if self.key.health.is_some() {
            for (count, outcome) in self.checks.iter().zip(["pass", "fail"]) {
                out.push(series::sample(
                    &series::BACKEND_CHECKS,
                    with(m::LABEL_OUTCOME, outcome),
                    count.get() as f64,
                ));
            }
        }
        out.push(series::sample(
            &series::BACKEND_INFLIGHT,
            labels.clone(),
            self.load.inflight() as f64,
        ));
        if self.connect_time.count() > 0 {
            self.connect_time
                .samples(&series::BACKEND_CONNECT, &labels, out);
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if self.exported {
            series::retire(self);
            series::release(BACKEND_SERIES);
        }
    }
}

impl Drop for BackendGuard {
    fn drop(&mut self) {
        self.backend.load.finish();
    }
}

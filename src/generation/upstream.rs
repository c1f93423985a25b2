//! Upstreams and backends.
//!
//! A [`Backend`] is process-shared: its connection pool, in-flight counter
//! and metric handles are keyed by backend identity (address + transport
//! settings) in the [`BackendRegistry`] and reused by every generation that
//! still names it, so an activation never cold-starts connections to an
//! unchanged backend. An [`Upstream`] belongs to one generation: it holds
//! the backend set and the load-balancing policy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Version;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::ResponseFuture;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use metrics::Counter;

use crate::plan::{Policy, UpstreamProtocol, UpstreamSpec};
use crate::telemetry::metrics as m;
use crate::tls::UpstreamTlsSpec;

/// What makes two backends the same backend: address and transport.
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
}

/// A client request body on its way through hyper's client, which says
/// when it has been read to its end: the route timeout starts there.
#[derive(Debug)]
pub struct SignalledBody {
    body: Incoming,
    ended: Option<tokio::sync::oneshot::Sender<()>>,
}

impl SignalledBody {
    /// The body, and what completes once it has ended (or failed).
    pub fn new(body: Incoming) -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let (ended, receiver) = tokio::sync::oneshot::channel();
        let ended = Some(ended);
        let mut this = Self { body, ended };
        if this.body.is_end_stream() {
            this.end();
        }
        (this, receiver)
    }

    fn end(&mut self) {
        if let Some(ended) = self.ended.take() {
            let _ = ended.send(());
        }
    }
}

impl http_body::Body for SignalledBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_))))
            || this.body.is_end_stream()
        {
            this.end();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The pooled client of a backend: plain TCP or TLS.
#[derive(Debug)]
pub enum UpstreamClient {
    Plain(Client<HttpConnector, SignalledBody>),
    Tls(Client<HttpsConnector<HttpConnector>, SignalledBody>),
}

impl UpstreamClient {
    pub fn request(&self, req: http::Request<SignalledBody>) -> ResponseFuture {
        match self {
            UpstreamClient::Plain(client) => client.request(req),
            UpstreamClient::Tls(client) => client.request(req),
        }
    }
}

/// Outcomes of an upstream attempt, for metrics.
#[derive(Debug, Clone, Copy)]
pub enum AttemptOutcome {
    Ok,
    ConnectError,
    Timeout,
    Error,
}

/// One backend, shared by every generation that names it.
#[derive(Debug)]
pub struct Backend {
    pub key: BackendKey,
    pub authority: Authority,
    /// `http` or `https`, for the upstream request URI.
    pub scheme: Scheme,
    /// The HTTP version requests to this backend carry.
    pub version: Version,
    pub client: UpstreamClient,
    /// For plain HTTP/1.1 backends: connections driven by the requests'
    /// own tasks (see `h1pool`). Upgrades still use `client`.
    pub h1: Option<super::H1Pool>,
    inflight: AtomicU64,
    outcomes: [Counter; 4],
}

impl Backend {
    fn new(key: BackendKey) -> Result<Self, BackendError> {
        let authority: Authority = key
            .addr
            .parse()
            .map_err(|_| BackendError::Address(key.addr.clone()))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(key.connect_timeout));
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(key.idle_timeout)
            .pool_max_idle_per_host(1024)
            .http2_only(key.protocol.is_http2());
        let client = match &key.tls {
            Some(tls) => {
                connector.enforce_http(false);
                let config = crate::tls::client_config(tls).map_err(BackendError::Tls)?;
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(config)
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
                let https = if key.protocol.is_http2() {
                    https.enable_http2().wrap_connector(connector)
                } else {
                    https.enable_http1().wrap_connector(connector)
                };
                UpstreamClient::Tls(builder.build(https))
            }
            None => UpstreamClient::Plain(builder.build(connector)),
        };
        let h1 = (key.tls.is_none() && key.protocol == UpstreamProtocol::Http1)
            .then(|| super::H1Pool::new(256, key.idle_timeout));
        let scheme = if key.tls.is_some() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        let version = if key.protocol.is_http2() {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let addr = key.addr.clone();
        let outcome = |o: &'static str| metrics::counter!(m::UPSTREAM_ATTEMPTS, m::LABEL_BACKEND => addr.clone(), m::LABEL_OUTCOME => o);
        Ok(Self {
            outcomes: [
                outcome("ok"),
                outcome("connect_error"),
                outcome("timeout"),
                outcome("error"),
            ],
            key,
            authority,
            scheme,
            version,
            h1,
            client,
            inflight: AtomicU64::new(0),
        })
    }

    pub fn record(&self, outcome: AttemptOutcome) {
        let index = match outcome {
            AttemptOutcome::Ok => 0,
            AttemptOutcome::ConnectError => 1,
            AttemptOutcome::Timeout => 2,
            AttemptOutcome::Error => 3,
        };
        if let Some(counter) = self.outcomes.get(index) {
            counter.increment(1);
        }
    }

    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Counts one request to this backend until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> BackendGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
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

impl Drop for BackendGuard {
    fn drop(&mut self) {
        self.backend.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The process-wide set of backends, by identity. Holds them weakly: a
/// backend no generation names any more is dropped with its pool.
#[derive(Debug, Default)]
pub struct BackendRegistry {
    backends: Mutex<HashMap<BackendKey, Weak<Backend>>>,
}

impl BackendRegistry {
    /// The live backend for `key`, or a new one.
    pub fn get_or_create(&self, key: BackendKey) -> Result<Arc<Backend>, BackendError> {
        let mut backends = self.backends.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(live) = backends.get(&key).and_then(Weak::upgrade) {
            return Ok(live);
        }
        super::sweep(&mut backends);
        let backend = Arc::new(Backend::new(key.clone())?);
        backends.insert(key, Arc::downgrade(&backend));
        Ok(backend)
    }

    /// How many backends are alive.
    pub fn live(&self) -> usize {
        let backends = self.backends.lock().unwrap_or_else(PoisonError::into_inner);
        backends.values().filter(|w| w.strong_count() > 0).count()
    }
}

/// An upstream in one generation: its backends and how to pick one.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub policy: Policy,
    pub backends: Vec<Arc<Backend>>,
    /// For `weighted`: which backend each turn goes to.
    schedule: WeightedSchedule,
    cursor: AtomicUsize,
}

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
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let weights: Vec<u32> = spec.backends.iter().map(|b| b.weight).collect();
        let schedule = match spec.policy {
            Policy::Weighted => WeightedSchedule::new(&weights),
            Policy::RoundRobin => WeightedSchedule::default(),
        };
        Ok(Self {
            name: spec.name.clone(),
            policy: spec.policy,
            backends,
            schedule,
            cursor: AtomicUsize::new(0),
        })
    }

    /// The backend for the next request.
    pub fn pick(&self) -> Option<&Arc<Backend>> {
        let turn = self.cursor.fetch_add(1, Ordering::Relaxed);
        let index = match self.policy {
            Policy::RoundRobin => turn % self.backends.len().max(1),
            Policy::Weighted => self.schedule.pick(turn as u64),
        };
        self.backends.get(index)
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
/// algorithm, unrolled, was O(total × backends) to build (391 ms for
/// 1 000 backends weighted 1–1 000).
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

    #[test]
    fn registry_reuses_live_backends() {
        let registry = BackendRegistry::default();
        let key = BackendKey {
            addr: "127.0.0.1:1".into(),
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            tls: None,
        };
        let a = registry.get_or_create(key.clone()).expect("a");
        let b = registry.get_or_create(key.clone()).expect("b");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        assert_eq!(registry.live(), 0);
    }
}

//! The validated configuration: every value given its meaning.
//!
//! A [`Spec`] exists only for a configuration that passed validation:
//! durations are `Duration`s, addresses are parsed, regexes compiled,
//! header names checked. `generation::build` turns it into runtime objects
//! and can no longer fail on the configuration's content.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::callers::CallerSpec;
use super::memory::HugePages;
use super::pattern::PathRegex;
pub use super::quota::*;
use http::{HeaderName, HeaderValue, Method, StatusCode};

use crate::config::FileConfig;

/// Telemetry's own settings, produced by validation.
pub use crate::telemetry::{LogFormat, LogSpec, TracingSpec};

pub use super::pieces::{Piece, Pieces};

/// A configuration that passed validation, with everything resolved.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The decoded file, kept for diffs and history.
    pub file: FileConfig,
    /// Canonical text (see `config::canonical`), in pieces.
    pub canonical: crate::config::Canonical,
    /// What a later candidate may take over unchanged (`validate::reuse`).
    pub pieces: Pieces,
    /// `sha256:<hex>` over the canonical text and every referenced file.
    pub config_version: String,
    /// Every file it references (certificates, keys, token files), as
    /// read: what `run --watch` watches besides the file itself.
    pub referenced_files: Vec<std::path::PathBuf>,
    pub admin: AdminSpec,
    pub metrics_bind: Option<SocketAddr>,
    /// `metrics.max_series`: the cap on labelled series.
    pub metrics_max_series: usize,
    pub log: LogSpec,
    pub tracing: TracingSpec,
    pub runtime: RuntimeSpec,
    pub listeners: Vec<ListenerSpec>,
    /// Shared with the generation built from them.
    pub routes: Vec<Arc<RouteSpec>>,
    pub upstreams: Vec<UpstreamSpec>,
    /// `[fleet]`: where the shared generations come from, if anywhere.
    pub fleet: Option<FleetSpec>,
    /// `[discovery]`: how member names are resolved.
    pub discovery: DiscoverySpec,
    /// `[cache.zones]`: each zone's size and disk, by name.
    pub cache_zones: BTreeMap<String, ZoneSpec>,
    /// `[limits] store`: where fleet-scoped quotas count.
    pub limit_store: Option<StoreSpec>,
    /// `[waf.rulesets]`: each rule set compiled, by name (shared with
    /// the active configuration's when unchanged).
    pub waf_rulesets: BTreeMap<String, Arc<super::WafRuleset>>,
}

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// `[fleet]`, resolved.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// `http://` or `https://` URLs.
    pub endpoints: Vec<String>,
    /// Without a trailing slash.
    pub prefix: String,
    pub instance: String,
    pub lease_ttl: Duration,
    pub tls: Option<FleetTls>,
    /// User and password.
    pub credentials: Option<(String, String)>,
}

/// TLS towards etcd: its CA, and our client identity if it asks for one.
#[derive(Debug, Clone)]
pub struct FleetTls {
    pub ca: Vec<u8>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Clone)]
pub struct AdminSpec {
    pub bind: SocketAddr,
    /// Who may call the admin API (`admin.token_file` is the caller
    /// `admin`, with every scope); none: every call is let in (a loopback
    /// bind only).
    pub callers: Vec<CallerSpec>,
    /// `admin.audit_log`, relative to the configuration's folder.
    pub audit_log: Option<PathBuf>,
    pub require_expected_generation: bool,
    /// The largest request body the admin API reads, once decompressed.
    pub max_body: usize,
    /// `[[admin.freeze]]`: when activations and upgrades are refused
    /// (generation-owned, unlike the rest of `[admin]`).
    pub freeze: Vec<super::freeze::FreezeWindow>,
    /// `[[admin.webhooks]]`: receivers of change events.
    pub webhooks: Vec<WebhookSpec>,
    /// `admin.tls`: the admin API over TLS.
    pub tls: Option<AdminTlsSpec>,
    /// `[admin.approval]`, or the defaults when only a caller's
    /// `requires_approval` asks for approvals; none: nothing waits.
    pub approval: Option<super::ApprovalPolicy>,
}

/// The admin listener's TLS (DESIGN §23): its certificate, and the CA
/// that callers' client certificates are verified against (a client
/// without one may still present a token).
#[derive(Debug, Clone)]
pub struct AdminTlsSpec {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// A receiver of change events (DESIGN §23).
#[derive(Debug, Clone)]
pub struct WebhookSpec {
    pub name: String,
    pub url: http::Uri,
    /// The event kinds it takes; empty: every kind.
    pub events: Vec<&'static str>,
    /// The signatures' key (its `Debug` shows no key material).
    pub key: ring::hmac::Key,
    pub ca: Option<PathBuf>,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct RuntimeSpec {
    pub state_dir: Option<PathBuf>,
    pub history_limit: usize,
    pub drain_timeout: Duration,
    pub max_pinned_age: Option<Duration>,
    pub worker_threads: Option<usize>,
    /// Folders besides the configuration's own that referenced files may
    /// be in (startup-owned: a candidate cannot widen them).
    pub file_roots: Vec<PathBuf>,
    /// See `FileRuntime::write_back`.
    pub write_back: bool,
    /// Request heads each HTTP listener keeps for `impact` (0: none).
    pub impact_sample: usize,
    /// When transparent huge pages back the heap.
    pub huge_pages: HugePages,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerProtocol {
    Http,
    Https,
    Tcp,
    /// Datagrams relayed per client session to `upstream`.
    Udp,
}

impl ListenerProtocol {
    /// `tcp` or `udp`: no HTTP, an upstream of its own.
    pub fn is_l4(self) -> bool {
        matches!(self, ListenerProtocol::Tcp | ListenerProtocol::Udp)
    }
}

/// Per-listener data-plane limits (DESIGN §10 and §13 defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// From a request head's first byte to its last (408).
    pub header_read_timeout: Duration,
    /// Between requests on a client connection.
    pub keepalive_timeout: Duration,
    /// No byte in either direction while a request is open.
    pub idle_timeout: Duration,
    /// HTTP/2 PING interval; `None` sends none.
    pub h2_keepalive_interval: Option<Duration>,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_concurrent_streams: u32,
    /// Open client connections beyond this are closed at accept.
    pub max_connections: Option<usize>,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            h2_keepalive_interval: Some(Duration::from_secs(30)),
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            max_concurrent_streams: 100,
            max_connections: None,
        }
    }
}

/// What `%2F` and `%5C` in a request path get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncodedSlash {
    /// Routed and forwarded as they are (not decoded).
    #[default]
    Keep,
    /// Refused with 400.
    Reject,
}

/// A listener's request rules (DESIGN §13): path normalization options
/// and whose forwarding headers are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerEdge {
    pub merge_slashes: bool,
    pub encoded_slash: EncodedSlash,
    /// Every peer's forwarding headers are extended.
    pub trust_forwarded: bool,
    /// These peers' forwarding headers are extended.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Admission limit over the whole listener: more requests get 503.
    pub max_inflight: Option<u64>,
    /// `allow_from` / `deny_from`: judged before routing (403).
    pub access: Option<super::IpRules>,
    /// `defaults`: filters its routes have unless they set their own.
    pub defaults: Option<Arc<super::Defaults>>,
    /// `tls.client_identity_headers`: the client certificate's identity
    /// goes upstream as `x-client-cert-*`.
    pub client_identity: bool,
}

impl ListenerEdge {
    /// Whether `peer`'s `X-Forwarded-*` and `Forwarded` headers are
    /// extended (else they are replaced).
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        self.trust_forwarded || self.trusted_proxies.iter().any(|net| net.contains(&peer))
    }
}

#[derive(Debug, Clone)]
pub struct ListenerSpec {
    pub name: String,
    pub bind: SocketAddr,
    pub protocol: ListenerProtocol,
    pub limits: ListenerLimits,
    pub edge: ListenerEdge,
    /// For `tcp` listeners: the upstream every connection goes to.
    pub upstream: Option<String>,
    /// For `https` listeners: where the certificate material is (for
    /// `reload-certs`) ...
    pub tls: Option<crate::tls::ListenerTlsSpec>,
    /// ... and the material itself, loaded by validation from the bytes
    /// that `config_version` hashes.
    pub tls_material: Option<std::sync::Arc<crate::tls::ListenerMaterial>>,
    /// Connections start with a PROXY protocol header from a trusted
    /// proxy (`edge.trusted_proxies`).
    pub accept_proxy_protocol: bool,
    /// `https` listeners: HTTP/3 on UDP at the same address.
    pub http3: bool,
    /// With `http3`: 0-RTT accepted, early requests idempotent only.
    pub http3_early_data: bool,
    /// For `tcp` listeners.
    pub l4: L4Spec,
}

/// What a `tcp` or `udp` listener does beyond relaying to `upstream`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct L4Spec {
    /// TLS pass-through by server name, when set (`tcp`).
    pub sni: Option<SniSpec>,
    /// No byte either way for this long ends a connection or a session
    /// (`None`: never; `udp` always has one).
    pub idle_timeout: Option<Duration>,
    /// `udp`: most sessions at once; a datagram that would open one more
    /// is dropped.
    pub max_sessions: usize,
}

/// TLS pass-through routes of a `tcp` listener.
#[derive(Debug, Clone, PartialEq)]
pub struct SniSpec {
    pub routes: Vec<SniRoute>,
    pub default_upstream: Option<String>,
    pub client_hello_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SniRoute {
    pub hosts: Vec<HostMatch>,
    /// Empty: any (or no) ALPN.
    pub alpn: Vec<String>,
    pub upstream: String,
}

impl SniSpec {
    /// The upstream for a ClientHello naming `name` (lower-cased by the
    /// caller) and offering `alpn`: an exact name first, then the longest
    /// wildcard; among routes for the same name, the first whose ALPN
    /// list the client meets; else the default.
    pub fn upstream_for(&self, name: Option<&str>, alpn: &[&[u8]]) -> Option<&str> {
        let offers = |route: &SniRoute| {
            route.alpn.is_empty() || route.alpn.iter().any(|p| alpn.contains(&p.as_bytes()))
        };
        let chosen = name.and_then(|name| {
            let exact = self.routes.iter().find(|r| {
                offers(r)
                    && r.hosts
                        .iter()
                        .any(|h| matches!(h, HostMatch::Exact(e) if e == name))
            });
            exact.or_else(|| {
                self.routes
                    .iter()
                    .filter(|r| offers(r))
                    .filter_map(|r| {
                        r.hosts
                            .iter()
                            .filter_map(|h| match h {
                                HostMatch::Suffix(s) if h.matches(name) => Some(s.len()),
                                _ => None,
                            })
                            .max()
                            .map(|len| (len, r))
                    })
                    .max_by_key(|(len, _)| *len)
                    .map(|(_, r)| r)
            })
        });
        chosen
            .map(|r| r.upstream.as_str())
            .or(self.default_upstream.as_deref())
    }
}

/// `tcp` listener default `idle_timeout` (Envoy's TCP proxy's).
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// `udp` listener default `idle_timeout` (a DNS or syslog exchange is
/// long over by then).
pub const DEFAULT_UDP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// `udp` listener default `max_sessions`.
pub const DEFAULT_UDP_MAX_SESSIONS: usize = 10_000;
/// Longest wait for a pass-through listener's ClientHello by default.
pub const DEFAULT_CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The PROXY protocol header an upstream's connections start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyProtocol {
    V1,
    V2,
}

/// How a route matches the request host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostMatch {
    /// `api.example.com`, lower-cased.
    Exact(String),
    /// `*.example.com` stored as `.example.com`: matches any name ending in it.
    Suffix(String),
}

impl HostMatch {
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(name) => name.eq_ignore_ascii_case(host),
            HostMatch::Suffix(suffix) => {
                host.len() > suffix.len()
                    && host
                        .get(host.len() - suffix.len()..)
                        .is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
            }
        }
    }
}

/// How a route matches the request path.
#[derive(Debug, Clone)]
pub enum PathMatch {
    Any,
    Exact(String),
    Prefix(String),
    Regex(PathRegex),
}

impl PathMatch {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Regex(re) => re.is_match(path),
        }
    }

    /// What identifies the matcher, for duplicate detection.
    pub fn key(&self) -> (char, &str) {
        match self {
            PathMatch::Any => (' ', ""),
            PathMatch::Exact(p) => ('=', p),
            PathMatch::Prefix(p) => ('^', p),
            PathMatch::Regex(re) => ('~', re.as_str()),
        }
    }
}

/// What a matched request gets.
#[derive(Debug, Clone)]
pub enum RouteAction {
    Proxy { upstream: String },
    Respond(DirectResponse),
    Redirect(super::Redirect),
}

#[derive(Debug, Clone)]
pub struct DirectResponse {
    pub status: StatusCode,
    pub body: bytes::Bytes,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

#[derive(Debug, Clone)]
pub struct RouteSpec {
    pub name: String,
    pub listeners: Vec<String>,
    pub hosts: Vec<HostMatch>,
    pub path: PathMatch,
    pub methods: Vec<Method>,
    pub headers: Vec<(HeaderName, super::ValueMatch)>,
    /// Query parameters (decoded names) and what their values must be.
    pub query: Vec<(String, super::ValueMatch)>,
    pub action: RouteAction,
    /// `None` when the route changes nothing (DESIGN §17).
    pub filters: Option<Arc<super::Filters>>,
    /// Upstream response deadline (default 30s, then 504).
    pub timeout: Duration,
    /// Admission limit: concurrent requests beyond it get 503.
    pub max_inflight: Option<u64>,
    pub retry: Option<RetrySpec>,
    pub hedge: Option<HedgeSpec>,
    pub quota: Option<QuotaSpec>,
    /// gRPC-Web calls are translated to gRPC (DESIGN §18).
    pub grpc_web: bool,
    /// Answers kept in a cache zone (`routes.cache`).
    pub cache: Option<RouteCacheSpec>,
    /// `cache = "none"`: not its listener's default cache either.
    pub cache_opt_out: bool,
    /// `waf = { ruleset, mode }`.
    pub waf: Option<super::RouteWafSpec>,
    /// `waf = "none"`: not its listener's default either.
    pub waf_opt_out: bool,
}

/// `[cache.zones.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneSpec {
    /// Bytes its objects may hold in memory.
    pub memory: u64,
    pub disk: Option<DiskSpec>,
}

/// A zone's `disk`: the folder (under the state folder) and the bytes
/// its files may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub size: u64,
}

/// `routes.cache`: the zone answers are kept in, the largest kept, and
/// how long objects live and may be answered stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCacheSpec {
    pub zone: String,
    pub max_object: u64,
    /// Freshness of an answer that states none.
    pub ttl_default: Option<Duration>,
    /// Windows past freshness (zero: none; the answer's own RFC 5861
    /// directives still apply).
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
    /// `HEAD` is answered from a stored `GET` (`methods` lists it).
    pub head: bool,
    /// `key`: what the key holds besides the defaults.
    pub key: Option<CacheKeySpec>,
}

/// `routes.cache.key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKeySpec {
    /// Request headers whose values join the key.
    pub headers: Vec<HeaderName>,
    pub query: QueryKey,
}

/// Which of the query the key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryKey {
    All,
    Nothing,
    /// Only these parameters, in this order.
    Include(Vec<String>),
    /// Every parameter but these, in the request's order.
    Exclude(Vec<String>),
}

/// `routes.retry`: when a failed attempt is made again.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySpec {
    /// Attempts in all, the first included (2–10).
    pub attempts: u32,
    pub on: RetryOn,
    /// Deadline of each attempt's response head (always within the
    /// route's `timeout`, which covers every attempt).
    pub per_try_timeout: Option<Duration>,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub budget: BudgetSpec,
    pub methods: Vec<Method>,
    pub max_replay_body: u64,
}

/// What makes an attempt worth repeating.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryOn {
    /// The connection could not be made (refused, unreachable, timed out).
    pub connect_failure: bool,
    /// The connection was refused.
    pub refused: bool,
    /// The connection broke before a response head.
    pub reset: bool,
    /// No response head within the attempt's deadline.
    pub timeout: bool,
    /// 502, 503 or 504 from the backend.
    pub gateway_error: bool,
    /// Any 5xx from the backend.
    pub server_error: bool,
    /// These statuses from the backend.
    pub statuses: Vec<u16>,
    /// These gRPC statuses in a trailers-only answer (`Code::bit`s).
    pub grpc: u32,
}

/// The gRPC statuses `retry.on` may name (`grpc:NAME`): the ones that
/// say the call may succeed when made again.
pub const RETRYABLE_GRPC: [crate::grpc::Code; 5] = [
    crate::grpc::Code::Unavailable,
    crate::grpc::Code::ResourceExhausted,
    crate::grpc::Code::Cancelled,
    crate::grpc::Code::DeadlineExceeded,
    crate::grpc::Code::Internal,
];

/// Retries (and hedges) allowed per upstream: `ratio` of the requests
/// plus `min_per_second`, over a 10 s window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetSpec {
    pub ratio: f64,
    pub min_per_second: u32,
}

impl Default for BudgetSpec {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_per_second: 10,
        }
    }
}

pub const DEFAULT_RETRY_ATTEMPTS: u32 = 2;
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(25);
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_millis(250);
pub const DEFAULT_MAX_REPLAY_BODY: u64 = 64 * 1024;

/// `routes.hedge`: more attempts when the first is slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgeSpec {
    pub delay: Duration,
    /// Extra attempts at most (1–3), each `delay` after the previous.
    pub max_extra: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    Weighted,
    /// Power of two choices on in-flight requests (counted across every
    /// live generation).
    LeastRequests,
    /// Power of two choices on peak-EWMA latency × load (Linkerd's).
    P2c,
    /// Consistent hashing (Maglev) of `hash_key`.
    Hash,
}

/// What `policy = "hash"` hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// A request header's value (`header:NAME`).
    Header(HeaderName),
    /// A cookie's value (`cookie:NAME`).
    Cookie(String),
    /// The client address (after trusted forwarding headers, if any).
    ClientIp,
    /// The normalized request path.
    Path,
}

/// As `parse_hash_key` reads it.
impl std::fmt::Display for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HashKey::Header(name) => write!(f, "header:{name}"),
            HashKey::Cookie(name) => write!(f, "cookie:{name}"),
            HashKey::ClientIp => f.write_str("client_ip"),
            HashKey::Path => f.write_str("path"),
        }
    }
}

/// `header:NAME`, `cookie:NAME`, `client_ip` or `path`.
pub fn parse_hash_key(key: &str) -> Option<HashKey> {
    match key.split_once(':') {
        None if key == "client_ip" => Some(HashKey::ClientIp),
        None if key == "path" => Some(HashKey::Path),
        Some(("header", name)) => http::HeaderName::from_bytes(name.as_bytes())
            .ok()
            .map(HashKey::Header),
        Some(("cookie", name))
            if !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b)) =>
        {
            Some(HashKey::Cookie(name.to_owned()))
        }
        _ => None,
    }
}

impl Policy {
    /// Whether backends' weights shape its picks (`weighted`, `p2c`,
    /// `hash`); `round_robin` and `least_requests` treat all alike.
    pub fn honours_weights(self) -> bool {
        matches!(self, Policy::Weighted | Policy::P2c | Policy::Hash)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::Weighted => "weighted",
            Policy::LeastRequests => "least_requests",
            Policy::P2c => "p2c",
            Policy::Hash => "hash",
        }
    }
}

/// An active health check: part of a backend's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthSpec {
    pub probe: HealthProbe,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive failures that make a healthy backend unhealthy.
    pub unhealthy_after: u32,
    /// Consecutive passes that make an unhealthy backend healthy.
    pub healthy_after: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HealthProbe {
    /// `GET path` with `Host: host`; passes on one of `expect_status`
    /// (empty: any 2xx).
    Http {
        path: String,
        host: Option<String>,
        expect_status: Vec<u16>,
    },
    /// Passes when a TCP connection is accepted.
    Tcp,
    /// `grpc.health.v1.Health/Check` for `service`; passes on SERVING.
    Grpc { service: String },
}

pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_UNHEALTHY_AFTER: u32 = 3;
pub const DEFAULT_HEALTHY_AFTER: u32 = 2;

/// Passive outlier detection (DESIGN §12): always on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierSpec {
    /// Gateway failures or 5xx in a row that eject a backend.
    pub consecutive_failures: u32,
    /// An ejection lasts `base_ejection × ejections so far` ...
    pub base_ejection: Duration,
    /// ... capped here.
    pub max_ejection: Duration,
    /// At most this share of an upstream's backends is ejected at once.
    pub max_ejected_percent: u32,
}

impl Default for OutlierSpec {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 over TCP.
    Http1,
    /// HTTP/2 over TCP with prior knowledge.
    H2c,
    /// HTTP/1.1 over TLS.
    Https,
    /// HTTP/2 over TLS (ALPN h2).
    H2,
    /// HTTP/3 over QUIC.
    H3,
    /// TLS over TCP (HTTP/2 or HTTP/1.1 by ALPN) until the backend's
    /// `Alt-Svc` offers HTTP/3, then QUIC, TCP whenever QUIC fails.
    Auto,
}

impl UpstreamProtocol {
    pub fn is_tls(self) -> bool {
        matches!(
            self,
            UpstreamProtocol::Https
                | UpstreamProtocol::H2
                | UpstreamProtocol::H3
                | UpstreamProtocol::Auto
        )
    }

    pub fn is_http2(self) -> bool {
        matches!(self, UpstreamProtocol::H2c | UpstreamProtocol::H2)
    }
}

#[derive(Debug, Clone)]
pub struct UpstreamSpec {
    pub name: String,
    pub policy: Policy,
    pub protocol: UpstreamProtocol,
    pub connect_timeout: Duration,
    /// Longest a backend connection may be silent (mid-exchange or pooled).
    pub idle_timeout: Duration,
    /// Fixed addresses (`addr` entries).
    pub backends: Vec<BackendSpec>,
    /// Where members come from besides `backends` (DESIGN §20): the
    /// generation pins these; the members they give are process-shared.
    pub sources: Vec<SourceSpec>,
    /// Most members taken from `sources` (the fixed backends come first).
    pub max_members: usize,
    /// For `https` and `h2`: how to verify the backends.
    pub tls: Option<crate::tls::UpstreamTlsSpec>,
    pub health: Option<HealthSpec>,
    pub outlier: OutlierSpec,
    /// Ramp of a backend that has just become healthy.
    pub slow_start: Option<Duration>,
    /// For `hash`: what is hashed.
    pub hash_key: Option<HashKey>,
    /// For `hash`: no backend takes more than this percentage of the
    /// average in-flight load; the rest spills to the next (HAProxy's
    /// `hash-balance-factor`).
    pub hash_balance_factor: Option<u32>,
    /// `tcp` upstreams: the PROXY header each connection starts with.
    pub proxy_protocol: Option<ProxyProtocol>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    /// `host:port`, resolved when connecting.
    pub addr: String,
    pub weight: u32,
}

/// A source of an upstream's members (`dns`, `srv`, `endpoints_file`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SourceSpec {
    /// Every A/AAAA record of `name` is a member on `port`.
    Dns {
        name: String,
        port: u16,
        family: Family,
        refresh: Duration,
        weight: u32,
    },
    /// Every target of the SRV records of `name`, with their priority,
    /// weight and port.
    Srv { name: String, refresh: Duration },
    /// The members a JSON file lists, read again whenever it changes.
    File { path: std::path::PathBuf },
}

impl SourceSpec {
    /// As the configuration names it: `dns:app.internal:8080`,
    /// `srv:_http._tcp.app.internal`, `file:endpoints.json`.
    pub fn label(&self) -> String {
        match self {
            SourceSpec::Dns { name, port, .. } => format!("dns:{name}:{port}"),
            SourceSpec::Srv { name, .. } => format!("srv:{name}"),
            SourceSpec::File { path } => format!("file:{}", path.display()),
        }
    }
}

/// Which address records a `dns` source takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Any,
    Ipv4,
    Ipv6,
}

/// `[discovery]`: how names are resolved (startup-owned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverySpec {
    /// Empty: the system's resolv.conf.
    pub nameservers: Vec<SocketAddr>,
    pub timeout: Duration,
    pub attempts: u32,
}

impl Default for DiscoverySpec {
    fn default() -> Self {
        Self {
            nameservers: Vec::new(),
            timeout: Duration::from_secs(2),
            attempts: 2,
        }
    }
}

/// Most members an upstream takes from its sources when it sets no
/// `max_members`.
pub const DEFAULT_MAX_MEMBERS: usize = 1000;
/// Between two resolutions of a `dns` or `srv` source that sets no
/// `refresh`.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);

/// Upstream connect deadline when none is configured (then 502).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Backend connection idle limit when none is configured.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Upstream response deadline when a route sets none (then 504).
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Every `auth` a configuration compiled: routes' own and listeners'
/// defaults (each once).
pub fn auths(spec: &Spec) -> Vec<&crate::auth::Auth> {
    let mut out: Vec<&crate::auth::Auth> = Vec::new();
    let routes = spec
        .routes
        .iter()
        .filter_map(|r| match r.filters.as_deref()?.auth.as_ref()? {
            super::RouteAuth::On(auth) => Some(&**auth),
            super::RouteAuth::Off => None,
        });
    let defaults = spec
        .listeners
        .iter()
        .filter_map(|l| l.edge.defaults.as_deref()?.auth.as_deref());
    for auth in routes.chain(defaults) {
        if !out.iter().any(|seen| std::ptr::eq(*seen, auth)) {
            out.push(auth);
        }
    }
    out
}

//! The configuration file format: serde `File*` types, one per TOML table.
//!
//! These types mirror the text exactly (durations and addresses stay
//! strings) so that they can be serialized back into the canonical form
//! that `config_version` hashes and the text diff compares. Meaning is given
//! to them by `plan::validate`, never here.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::route::{FileAuth, FileCompress, FileCors, FileHeaderOps, FileRoute, FileSize};

/// A whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub admin: FileAdmin,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<FileMetrics>,
    #[serde(default)]
    pub log: FileLog,
    #[serde(default, skip_serializing_if = "FileTracing::is_empty")]
    pub tracing: FileTracing,
    #[serde(default)]
    pub runtime: FileRuntime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<FileDiscovery>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<FileListener>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Arc<FileRoute>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub upstreams: BTreeMap<String, FileUpstream>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FileFleet>,
    /// Cache zones (`[cache.zones.NAME]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<super::route::FileCache>,
    /// Where fleet-scoped quotas count (`[limits] store`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<FileLimits>,
    /// Web application firewall rule sets (`[waf.rulesets.NAME]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waf: Option<FileWaf>,
}

/// `[waf]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWaf {
    #[serde(default)]
    pub rulesets: BTreeMap<String, FileWafRuleset>,
}

/// `[waf.rulesets.NAME] = { files, paranoia, inbound_threshold,
/// request_body_limit, request_body_limit_action, outbound_threshold,
/// response_body_limit }` (DESIGN §24).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWafRuleset {
    /// Rule files, or folders whose `.conf` files load in name order.
    pub files: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paranoia: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_threshold: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body_limit: Option<super::route::FileSize>,
    /// `"reject"` (413) or `"process_partial"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body_limit_action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_threshold: Option<u32>,
    /// Answer bodies are read for the rules up to this much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_body_limit: Option<super::route::FileSize>,
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<FileLimitStore>,
}

/// `[limits] store = { redis = { … } }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimitStore {
    pub redis: FileRedisStore,
}

/// `store.redis`: a Redis server (or anything that speaks RESP and Lua,
/// such as Valkey).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRedisStore {
    /// `redis://host:port/db`, `rediss://host:port/db` (TLS, the
    /// certificate verified against `ca` by the host's name) or
    /// `unix:///path/to/socket` (no password: that goes in
    /// `password_file`). Absent with `sentinel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Redis Sentinel names the master (instead of `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<FileRedisSentinel>,
    /// CA bundle (PEM) that signs the store's certificates (`rediss://`;
    /// without it, the Mozilla roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// Client certificate chain and key (PEM) for the store's TLS client
    /// authentication (`tls-auth-clients`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// A file holding the password (ACL or `requirepass`), one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
    /// Prefix of every key the gateway writes (default `cutover:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// A store call past this fails and marks the store down (default 250ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// `store.redis.sentinel`: the sentinels to ask for the master of
/// `master` (asked again whenever the store fails, so a failover moves the
/// gateway to the promoted replica).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRedisSentinel {
    /// The master's name in the sentinels' configuration (`mymaster`).
    pub master: String,
    /// `redis://host:port` (or `rediss://`, TLS to the sentinels and the
    /// master alike), one per sentinel.
    pub nodes: Vec<String>,
    /// The database on the master (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db: Option<i64>,
    /// The sentinels' own credentials (`requirepass` of sentinel.conf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
}

/// `[fleet]`: the etcd cluster this instance shares generations through
/// (startup-owned; DESIGN §15).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileFleet {
    /// etcd client URLs (`http://10.0.0.1:2379`, or `host:port`).
    pub endpoints: Vec<String>,
    /// The key prefix the fleet's generations live under (`/cutover/prod`).
    pub prefix: String,
    /// This instance's name within the fleet (default: the host name's
    /// first label, which is the pod's name in a Kubernetes StatefulSet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// How long this instance's status outlives it (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl: Option<String>,
    /// CA bundle that signs etcd's certificate (turns TLS on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// Client certificate and key for etcd's client authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// etcd user, with its password in `password_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
}

/// `[admin]`: the control API's own socket and credentials (startup-owned).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAdmin {
    #[serde(default = "default_admin_bind")]
    pub bind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    #[serde(default)]
    pub require_expected_generation: bool,
    /// The largest request body the admin API reads (decompressed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body: Option<FileSize>,
    /// `[[admin.callers]]`: who may call the admin API, and for what.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub callers: Vec<FileCaller>,
    /// A file of JSON lines: every admin call that changes something or
    /// is refused by authentication or scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<String>,
    /// `[[admin.freeze]]`: windows in which activations and upgrades are
    /// refused (generation-owned: an activation changes them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<FileFreeze>,
    /// `admin.tls`: the admin API over TLS, and the CA its callers'
    /// client certificates are checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<FileAdminTls>,
    /// `[admin.approval]`: which changes wait for others' approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<FileApproval>,
    /// `[[admin.webhooks]]`: where change events are sent, signed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<FileWebhook>,
}

/// `admin.tls`: the admin listener's certificate and key, and the CA of
/// the client certificates callers may present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAdminTls {
    pub cert: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<String>,
}

/// A caller's client certificate, matched by one SAN or by its subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClientCert {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub san: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

/// `[admin.approval]`: the two-person rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileApproval {
    /// `activate`, `rollback`, `upgrade`.
    #[serde(default)]
    pub required_for: Vec<String>,
    /// Approvals needed (default 1), each by another caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvers: Option<u32>,
    /// How long a proposal waits (default 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire: Option<String>,
}

/// One webhook: a receiver of change events, and the secret their
/// signatures are made with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWebhook {
    pub name: String,
    /// `http://` or `https://`.
    pub url: String,
    /// Event kinds to send (`activation`, `auto_rolled_back`, …); all
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    /// A file (mode 0600) with the HMAC-SHA256 key of the signatures.
    pub secret_file: String,
    /// A CA bundle to verify an `https` receiver (the WebPKI roots when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// How long one delivery attempt may take (default 5 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// One freeze window: fixed (`from`, `to`) or recurring (`cron`,
/// `duration`, `timezone`), and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileFreeze {
    /// RFC 3339, as a string or a TOML date-time.
    #[serde(
        default,
        deserialize_with = "date_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub from: Option<String>,
    #[serde(
        default,
        deserialize_with = "date_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub to: Option<String>,
    /// A five-field cron pattern: when each window starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// How long each recurring window lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// The IANA zone the pattern is read in (UTC unless given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    pub reason: String,
}

/// A date-time written as a string or as TOML's own date-time, kept as
/// its text (validation reads it as RFC 3339).
fn date_time<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Toml(toml::value::Datetime),
    }
    Ok(Option::<Either>::deserialize(d)?.map(|v| match v {
        Either::Text(text) => text,
        Either::Toml(at) => at.to_string(),
    }))
}

impl Default for FileAdmin {
    fn default() -> Self {
        Self {
            bind: default_admin_bind(),
            token_file: None,
            require_expected_generation: false,
            max_body: None,
            callers: Vec::new(),
            audit_log: None,
            freeze: Vec::new(),
            webhooks: Vec::new(),
            approval: None,
            tls: None,
        }
    }
}

/// One named caller of the admin API: one credential and its scopes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCaller {
    pub name: String,
    /// The SHA-256 of its bearer token, in hex (the token itself is
    /// never in the configuration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// A file holding its bearer token, readable by its owner only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// A client certificate (over `admin.tls` with `client_ca`) that
    /// names this caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<FileClientCert>,
    /// `read`, `validate`, `activate`, `approve`, `certs`, `cache`,
    /// `lifecycle`, `fleet`, `override`, `admin` (all of them).
    pub scopes: Vec<String>,
    /// Every change this caller asks for waits for approval.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_approval: bool,
}

fn default_admin_bind() -> String {
    "127.0.0.1:9190".to_owned()
}

/// `[metrics]`: Prometheus endpoint (startup-owned). Absent: no endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMetrics {
    pub bind: String,
    /// The most labelled series exported at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_series: Option<usize>,
}

/// `[log]`: `level` and `access` are live; `format`, `file` and
/// `access_file` need a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLog {
    #[serde(default = "default_log_level")]
    pub level: String,
    #[serde(default = "default_log_format")]
    pub format: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// One access-log line per request and per TCP connection (live).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub access: bool,
    /// Where access lines go; absent: the log sink (`file`, or stderr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_file: Option<String>,
}

impl Default for FileLog {
    fn default() -> Self {
        Self {
            level: default_log_level(),
            format: default_log_format(),
            file: None,
            access: false,
            access_file: None,
        }
    }
}

fn default_log_level() -> String {
    "info".to_owned()
}

fn default_log_format() -> String {
    "text".to_owned()
}

/// `[tracing]`: span export over OTLP/HTTP (the exporter is
/// startup-owned; `sample_ratio` is live).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTracing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_ratio: Option<f64>,
}

impl FileTracing {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `[runtime]`: generation bookkeeping and process settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRuntime {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    #[serde(default = "default_history_limit")]
    pub history_limit: u32,
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pinned_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<u32>,
    /// Folders (absolute) besides the configuration's own that referenced
    /// files may be in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_roots: Vec<String>,
    /// A successful activation or rollback through the admin API rewrites
    /// the configuration file (the previous one kept as `FILE.bak`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_back: Option<bool>,
    /// Request heads each HTTP listener keeps for `impact` (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact_sample: Option<u32>,
    /// When transparent huge pages back the heap: `"busy"`, `"never"`,
    /// `"always"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub huge_pages: Option<String>,
}

impl Default for FileRuntime {
    fn default() -> Self {
        Self {
            state_dir: None,
            history_limit: default_history_limit(),
            drain_timeout: default_drain_timeout(),
            max_pinned_age: None,
            worker_threads: None,
            file_roots: Vec::new(),
            write_back: None,
            impact_sample: None,
            huge_pages: None,
        }
    }
}

fn default_history_limit() -> u32 {
    16
}

fn default_drain_timeout() -> String {
    "30s".to_owned()
}

/// `[[listeners]]`: one bound socket and the protocol spoken on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileListener {
    pub name: String,
    pub bind: String,
    #[serde(default = "default_listener_protocol")]
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<FileListenerTls>,
    /// `tcp` listeners forward to this upstream directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Longest a client may take to send a request head (default 10s, 408).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_read_timeout: Option<String>,
    /// Largest request head in bytes (default 65536, 431).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_header_bytes: Option<u32>,
    /// Most request headers (default 100, 431).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_headers: Option<u32>,
    /// Concurrent HTTP/2 streams per connection (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<u32>,
    /// Longest a client connection may wait between requests (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_timeout: Option<String>,
    /// Longest no byte may move either way during a request (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// HTTP/2 PING interval for liveness of otherwise silent connections
    /// (default 30s; `"off"` sends none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_keepalive_interval: Option<String>,
    /// Most open client connections; further ones are closed at accept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// Most requests in flight on the listener, over every route and
    /// generation; further ones get 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<u64>,
    /// Collapse runs of `/` in request paths (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_slashes: Option<bool>,
    /// `keep` (default) or `reject` (400) for `%2F` and `%5C` in paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoded_slash: Option<String>,
    /// Extend the client's forwarding headers from any peer (default false:
    /// they are replaced unless the peer is in `trusted_proxies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_forwarded: Option<bool>,
    /// Peers (CIDRs) whose forwarding headers are extended, not replaced;
    /// with `accept_proxy_protocol`, the only peers whose PROXY header is
    /// taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<String>,
    /// Every connection starts with a PROXY protocol header (v1 or v2)
    /// from a peer in `trusted_proxies`; its address is the client's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_proxy_protocol: Option<bool>,
    /// `tcp` listeners: TLS pass-through routes by the ClientHello's
    /// server name (and ALPN).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sni_routes: Vec<FileSniRoute>,
    /// `tcp` listeners with `sni_routes`: where a name no route names goes
    /// (closed without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_upstream: Option<String>,
    /// `tcp` listeners with `sni_routes`: longest wait for the ClientHello
    /// (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_hello_timeout: Option<String>,
    /// `udp` listeners: most client sessions at once (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// `https` listeners: also serve HTTP/3 over QUIC on the same address
    /// (UDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http3: Option<bool>,
    /// With `http3`: accept 0-RTT early data (idempotent requests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http3_early_data: Option<bool>,
    /// Clients (CIDRs) the listener serves; others get 403.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_from: Option<Vec<String>>,
    /// Clients (CIDRs) the listener refuses (403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_from: Option<Vec<String>>,
    /// Filters every route of the listener has unless it sets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<FileDefaults>,
}

/// `listeners.defaults`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<FileHeaderOps>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<FileHeaderOps>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_body: Option<FileSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<bool>,
    /// Authentication every route of the listener has unless it sets its
    /// own (`auth = "none"` written out to opt out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<FileAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<FileCors>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<FileCompress>,
    /// A cache every route with an upstream has unless it sets its own
    /// (`cache = "none"` to opt out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<super::route::FileRouteCache>,
    /// The web application firewall of every route that sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waf: Option<super::route::FileRouteWaf>,
}

/// `listeners.sni_routes`: names (exact, or `*.suffix`) to an upstream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSniRoute {
    pub hosts: Vec<String>,
    pub upstream: String,
    /// Only when the client offers one of these ALPN protocols.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alpn: Vec<String>,
}

fn default_listener_protocol() -> String {
    "http".to_owned()
}

/// `listeners.tls`: certificate material for an `https` listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileListenerTls {
    #[serde(default)]
    pub certificates: Vec<FileCertificate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<String>,
    /// `required` (default when `client_ca` is set) or `optional`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<String>,
    /// Pass the client certificate's subject, SANs and fingerprint on
    /// as `x-client-cert-*` headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_identity_headers: Option<bool>,
    /// A request must be for a host the connection's certificate entry
    /// serves (421 otherwise); default: on with `client_ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_sni_host: Option<bool>,
}

/// One certificate entry: a chain and its private key, both PEM files,
/// or a certificate cutover obtains and renews (`acme`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCertificate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<FileAcme>,
    /// The names this entry serves (SNI and, with `strict_sni_host`,
    /// authorities), instead of the names in the certificate; `"*"`: every
    /// name no other entry serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
}

/// `{ acme = { … } }`: an automatic certificate (DESIGN §21).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAcme {
    pub domains: Vec<String>,
    pub directory: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// `tls-alpn-01` (default) or `http-01`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eab: Option<FileEab>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

/// External account binding: the CA's key id and the file holding its
/// HMAC key (base64url).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEab {
    pub kid: String,
    pub hmac_key_file: String,
}

/// `[upstreams.NAME]`: a set of backends and how to pick among them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpstream {
    #[serde(default = "default_policy")]
    pub policy: String,
    /// For `policy = "hash"`: `header:NAME`, `cookie:NAME`, `client_ip`
    /// or `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<String>,
    /// For `policy = "hash"`: a percentage above 100 bounding any
    /// backend's load relative to the average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_balance_factor: Option<u32>,
    #[serde(default = "default_upstream_protocol")]
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<String>,
    /// Longest no byte may move on a backend connection, and longest a
    /// pooled connection may wait for its next request (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// Active health checks (`path` or `tcp = true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<FileHealth>,
    /// Passive outlier detection (always on; these override its defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier: Option<FileOutlier>,
    /// How long a backend that has just become healthy takes to reach its
    /// full share of traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<String>,
    #[serde(default)]
    pub backends: Vec<FileBackend>,
    /// Most members the upstream takes from its `dns`, `srv` and
    /// `endpoints_file` entries (default 1000); the rest are left out,
    /// counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_members: Option<u32>,
    /// TLS to the backends (`protocol = "https"` or `"h2"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<FileUpstreamTls>,
    /// `"v1"` or `"v2"`: each connection to a backend starts with a PROXY
    /// protocol header naming the client (`tcp` upstreams).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<String>,
}

/// `upstreams.NAME.health`: an active check of every backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHealth {
    /// HTTP check: `GET path`, passing on `expect_status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// TCP check: passing when a connection is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<bool>,
    /// gRPC check: `grpc.health.v1.Health/Check` for this service name
    /// (`""`: the server as a whole), passing on SERVING.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<String>,
    /// `Host` of the HTTP check (default: the backend address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_after: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_after: Option<u32>,
    /// Statuses that pass (default: any 2xx).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<Vec<u16>>,
}

/// `upstreams.NAME.outlier`: when failing backends are ejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOutlier {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejected_percent: Option<u32>,
}

/// `upstreams.NAME.tls`: how to verify backends and who we are to them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpstreamTls {
    /// CA bundle; the WebPKI roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// SNI and verification name; the backend host when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Client certificate chain for mutual TLS (with `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The backend's certificate must carry one of these names (DNS, or
    /// a URI such as a SPIFFE ID) instead of `server_name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_alt_names: Option<Vec<String>>,
}

fn default_policy() -> String {
    "round_robin".to_owned()
}

fn default_upstream_protocol() -> String {
    "http1".to_owned()
}

/// One entry of `backends`: a fixed address (`addr`, with an optional
/// weight), or a source of members (`dns`, `srv`, `endpoints_file`) whose
/// set changes without a generation (DESIGN §20). Exactly one of the four.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBackend {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Of `addr`, or of every member of `dns` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// `name:port`: every A/AAAA record of `name` is a member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<String>,
    /// `_service._proto.name`: every SRV target is a member, with its
    /// record's priority, weight and port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub srv: Option<String>,
    /// A JSON file of members, watched: `[{ "addr": "ip:port", "weight": 3 }]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints_file: Option<String>,
    /// For `dns` and `srv`: the longest between two resolutions (records'
    /// TTLs may make it shorter, never under 1s; default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
    /// For `dns`: `any` (default), `ipv4` or `ipv6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
}

impl FileBackend {
    /// What names the entry among an upstream's: its address, or its
    /// source (`dns:NAME:PORT`, `srv:NAME`, `file:PATH`).
    pub fn key(&self) -> String {
        match (&self.addr, &self.dns, &self.srv, &self.endpoints_file) {
            (Some(addr), ..) => addr.clone(),
            (_, Some(dns), ..) => format!("dns:{dns}"),
            (_, _, Some(srv), _) => format!("srv:{srv}"),
            (_, _, _, Some(file)) => format!("file:{file}"),
            _ => String::new(),
        }
    }
}

/// `[discovery]`: how names in `backends` are resolved (startup-owned).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDiscovery {
    /// `ip` or `ip:port` (default port 53); the system's resolv.conf when
    /// empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Per query (default 2s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Queries per resolution before it counts as failed (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
}

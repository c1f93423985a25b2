//! `routes.quota` and `[limits] store` as validation gives them meaning
//! (local token buckets, fleet-scoped quotas: issue 58).

use std::time::Duration;

use http::HeaderName;

/// `routes.quota`: token buckets (or fixed windows) per key. Part of the
/// buckets' identity: an activation that keeps a route's quota unchanged
/// keeps its buckets (and its fleet leases).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QuotaSpec {
    /// Tokens added per `per` (a fixed window's limit).
    pub rate: u32,
    pub per: Duration,
    /// Bucket size.
    pub burst: u32,
    /// The descriptor's sources, in order; empty: one bucket for the route.
    pub key: Vec<QuotaKey>,
    pub max_keys: u32,
    /// `None`: this process counts alone.
    pub fleet: Option<FleetQuotaSpec>,
    /// `RateLimit` and `RateLimit-Policy` on every answer of the route
    /// (`headers = "always"`), not only on its 429s. Not part of what is
    /// counted: a change keeps the buckets.
    pub advertise: bool,
}

impl QuotaSpec {
    /// Whether the key needs the identity `auth` found (the quota is
    /// then taken after authentication).
    pub fn keyed_by_subject(&self) -> bool {
        self.key.contains(&QuotaKey::Subject)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum QuotaKey {
    ClientIp,
    Header(HeaderName),
    /// The subject `auth` found (`sub` of a JWT, the user of basic auth,
    /// forward auth's `subject_header`).
    Subject,
}

/// `scope = "fleet"`: counted in `[limits] store` by every instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FleetQuotaSpec {
    pub algorithm: QuotaAlgorithm,
    pub on_store_error: OnStoreError,
    /// The longest a request waits for the store.
    pub deadline: Duration,
    /// Tokens taken from the store per round trip (at least 1).
    pub batch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaAlgorithm {
    /// GCRA in the store: `rate` per `per`, up to `burst` at once.
    TokenBucket,
    /// `rate` per window of `per`, windows aligned on the store's clock.
    FixedWindow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnStoreError {
    /// This instance's share of the limit (the limit over the instances
    /// the store last counted).
    Local,
    Allow,
    Deny,
}

/// `[limits] store.redis`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StoreSpec {
    /// The URL as written (no password in it); with Sentinel,
    /// `sentinel://NODE,NODE/MASTER`. The store's name in logs and metrics.
    pub url: String,
    /// The sentinels that name the master, when the store is found so.
    pub sentinel: Option<SentinelSpec>,
    pub username: Option<String>,
    /// The password file's content, first line.
    pub password: Option<String>,
    /// TLS to the store (`rediss://`), with what it trusts and shows.
    pub tls: Option<StoreTls>,
    pub key_prefix: String,
    pub timeout: Duration,
}

/// `store.redis.sentinel`, validated.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SentinelSpec {
    pub master: String,
    /// The sentinels' URLs as written.
    pub nodes: Vec<String>,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// The PEM the store's TLS uses: the CA bundle (none: the Mozilla roots)
/// and the client certificate chain with its key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StoreTls {
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |set: bool| set.then_some("<from file>");
        f.debug_struct("StoreSpec")
            .field("url", &self.url)
            .field(
                "sentinel",
                &self.sentinel.as_ref().map(|s| (&s.master, &s.nodes, s.db)),
            )
            .field("username", &self.username)
            .field("password", &hidden(self.password.is_some()))
            .field(
                "tls_ca",
                &self.tls.as_ref().map(|t| t.ca.as_deref().map(digest)),
            )
            // The certificate is public: its digest tells two apart.
            .field(
                "tls_client",
                &self
                    .tls
                    .as_ref()
                    .and_then(|t| t.client.as_ref())
                    .map(|(cert, _)| digest(cert)),
            )
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The first 8 bytes of a file's SHA-256, in hex (what `Debug` shows of
/// PEM material).
fn digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub const DEFAULT_QUOTA_MAX_KEYS: u32 = 100_000;
/// The longest a fleet quota's request waits on the store, by default.
pub const DEFAULT_FLEET_DEADLINE: Duration = Duration::from_millis(5);
/// The share of a fleet limit an instance takes per round trip, by default.
pub const DEFAULT_PRE_ALLOWANCE: f64 = 0.1;
/// A store call past this marks the store down, by default.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(250);

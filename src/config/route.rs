//! The file format of routes: a route table and the filters it carries,
//! the ones a listener's `defaults` share with it included (compression,
//! CORS, authentication, header operations, sizes). Like `file.rs`, these
//! mirror the text exactly; `plan::validate` gives them meaning.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `compress = { … }`: answers compressed for the clients that accept
/// it (DESIGN §17). Every key has a default: `compress = {}` is zstd,
/// brotli and gzip for text types of 1 KiB and more.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCompress {
    /// `"zstd"`, `"br"`, `"gzip"`, in the gateway's order of preference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encodings: Option<Vec<String>>,
    /// Answers known to be shorter are sent as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bytes: Option<FileSize>,
    /// Media types (`text/html`), `type/*` or `type/*+suffix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<String>>,
    /// `"fastest"`, `"default"` or `"best"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
}

/// `cors = { … }`: cross-origin requests from browsers (DESIGN §17).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCors {
    /// Exact origins (`https://app.example`), `"~regex"` (the whole
    /// origin must match), or `"*"` alone.
    pub allow_origins: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_methods: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

/// `auth`: `"none"` (a route opting out of its listener's default), or
/// one method (DESIGN §19).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum FileAuth {
    Keyword(String),
    Method(Box<FileAuthMethod>),
}

/// By hand rather than `untagged`, so that a table's own error (an
/// unknown method, a misspelt key) reaches the diagnostic.
impl<'de> Deserialize<'de> for FileAuth {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FileAuth;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"none\" or a table naming one method ({ basic = { … } }, { jwt = { … } } or { forward = { … } })")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<FileAuth, E> {
                Ok(FileAuth::Keyword(text.to_owned()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<FileAuth, A::Error> {
                FileAuthMethod::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|m| FileAuth::Method(Box::new(m)))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Exactly one of the methods.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthMethod {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<FileBasicAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<FileJwtAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward: Option<FileForwardAuth>,
}

/// `auth = { forward = { … } }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileForwardAuth {
    /// `http://UPSTREAM/path` (or `https://` for an upstream with `tls`):
    /// the host names one of the configuration's upstreams.
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub response_headers: Vec<String>,
    /// `"deny"` (default) or `"allow"` when the auth service fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Keep the auth service's answers for the next requests with the
    /// same credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<FileForwardCache>,
}

/// `forward = { …, cache = { ttl, key_headers, max_entries } }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileForwardCache {
    /// The longest an answer is kept (its `Cache-Control` may say less).
    pub ttl: String,
    /// What tells two requests' credentials apart (default: the
    /// `request_headers`, which it must include).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_headers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
}

/// `auth = { basic = { … } }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBasicAuth {
    /// An htpasswd file of bcrypt or argon2id hashes.
    pub users_file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realm: Option<String>,
    /// `false`: the client's `Authorization` is removed once checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_credentials: Option<bool>,
}

/// `auth = { jwt = { … } }`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileJwtAuth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// CA bundle for `jwks_url` (the WebPKI roots otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_ca: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_refresh: Option<String>,
    /// An HMAC secret (HS256/384/512), at least 32 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac_key_file: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub algorithms: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leeway: Option<String>,
    /// `header:NAME`, `query:NAME` or `cookie:NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims_to_headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_token: Option<bool>,
}

/// `[[routes]]`: a match and what to do with requests that match it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRoute {
    pub name: String,
    #[serde(default)]
    pub listeners: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub respond: Option<FileRespond>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Retries of failed attempts (on other backends, within `timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<FileRetry>,
    /// A second attempt when the first has not answered within `delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hedge: Option<FileHedge>,
    /// A request rate per key (token buckets): beyond it, 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<FileQuota>,
    /// Answers kept in a cache zone (RFC 9111; `docs/caching.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<FileCacheSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<u64>,
    /// Query parameters the request must carry: a value, `*` (present)
    /// or `~regex`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, String>,
    /// A third action beside `upstream` and `respond`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<FileRedirect>,
    /// The forwarded path, made from the routed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<FileRewrite>,
    /// The forwarded `Host`: a name, or `"backend"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_rewrite: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<FileHeaderOps>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<FileHeaderOps>,
    /// `"10MiB"` or bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_body: Option<FileSize>,
    /// Clients (CIDRs) the route serves; others get 403.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_from: Option<Vec<String>>,
    /// Clients (CIDRs) the route refuses (403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_from: Option<Vec<String>>,
    /// Keep a valid `x-request-id` or make one; sent up, returned, logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<bool>,
    /// Translate gRPC-Web calls (binary and text) to gRPC for the upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_web: Option<bool>,
    /// Authentication (DESIGN §19), or `"none"` against the listener's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<FileAuth>,
    /// The web application firewall's rule set and mode (DESIGN §24), or
    /// `"none"` against the listener's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waf: Option<FileRouteWafSetting>,
    /// Cross-origin requests: preflights answered, responses marked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<FileCors>,
    /// Answers compressed for the clients that accept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<FileCompress>,
    /// Copies of a share of the requests to another upstream, answers
    /// discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<FileMirrors>,
    /// Methods beyond the idempotent ones that `mirror` copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_methods: Option<Vec<String>>,
}

/// `mirror`: one `{ upstream, percent, max_inflight }`, or a list of
/// them (each copies on its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FileMirrors {
    One(FileMirror),
    Many(Vec<FileMirror>),
}

impl FileMirrors {
    pub fn list(&self) -> &[FileMirror] {
        match self {
            FileMirrors::One(m) => std::slice::from_ref(m),
            FileMirrors::Many(list) => list,
        }
    }
}

/// A route's `waf`: `"none"` (not its listener's default either), or a
/// rule set and mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FileRouteWafSetting {
    Keyword(String),
    Table(FileRouteWaf),
}

/// `waf = { ruleset, mode, exclusions }` (a route's, or a listener's
/// default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRouteWaf {
    pub ruleset: String,
    /// `"block"` (the default) or `"detect"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// What the rules leave alone, for false positives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclusions: Vec<FileWafExclusion>,
}

/// One of `waf.exclusions`: rules (by id) not evaluated, or targets they
/// (or every rule) no longer read, for requests under some paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWafExclusion {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_ids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

/// `mirror = { upstream, percent, max_inflight }` (DESIGN §17, §22).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMirror {
    pub upstream: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<u32>,
}

/// `request_headers` / `response_headers`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHeaderOps {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// A size: bytes, or text with a unit (`"512KiB"`, `"10MiB"`, `"1GB"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FileSize {
    Bytes(u64),
    Text(String),
}

/// A route's `cache`: `"none"` (a route opting out of its listener's
/// default), or a table.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum FileCacheSetting {
    Keyword(String),
    Table(Box<FileRouteCache>),
}

/// By hand rather than `untagged`, so that a table's own error (a
/// misspelt key) reaches the diagnostic.
impl<'de> Deserialize<'de> for FileCacheSetting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FileCacheSetting;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"none\" or a table ({ zone = \"main\", … })")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<FileCacheSetting, E> {
                Ok(FileCacheSetting::Keyword(text.to_owned()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<FileCacheSetting, A::Error> {
                FileRouteCache::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|c| FileCacheSetting::Table(Box::new(c)))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `routes.cache = { zone, max_object, ttl_default,
/// stale_while_revalidate, stale_if_error, methods }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRouteCache {
    /// A zone of `[cache.zones]`.
    pub zone: String,
    /// The largest answer kept (default 8 MiB); a longer one passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_object: Option<FileSize>,
    /// Freshness of an answer that states none (no `max-age`,
    /// `s-maxage` or `Expires`), in place of the heuristic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_default: Option<String>,
    /// How long past its freshness an object is answered while one
    /// background request revalidates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_while_revalidate: Option<String>,
    /// How long past its freshness an object is answered when the
    /// upstream fails (no answer, a timeout, 500, 502, 503, 504).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_if_error: Option<String>,
    /// The methods answered from the zone: `GET`, and `HEAD` (from a
    /// stored `GET`); default both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// What the key holds besides the host, path, query and upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<FileCacheKey>,
}

/// `cache.key = { headers, query, query_include, query_exclude }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCacheKey {
    /// Request headers (as sent upstream) whose values join the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<String>>,
    /// `false`: the query is not part of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<bool>,
    /// Only these query parameters are part of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_include: Option<Vec<String>>,
    /// Every query parameter but these is part of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_exclude: Option<Vec<String>>,
}

/// `[cache]`: the zones routes keep answers in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCache {
    #[serde(default)]
    pub zones: std::collections::BTreeMap<String, FileCacheZone>,
}

/// `[cache.zones.NAME] = { memory = "256MiB", disk = { path, size } }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCacheZone {
    /// The bytes its objects may hold (heads and bodies).
    pub memory: FileSize,
    /// Objects also kept in files, which outlive the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<FileCacheDisk>,
}

/// `disk = { path = "cache/main", size = "10GiB" }`: a folder under
/// `runtime.state_dir`, and the bytes its files may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileCacheDisk {
    pub path: String,
    pub size: FileSize,
}

/// `routes.rewrite`: exactly one of the three.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix: Option<String>,
    /// `[pattern, replacement]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<Vec<String>>,
}

/// `routes.redirect`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRedirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_query: Option<bool>,
    /// A redirect to the URL the request asked for (only `status`
    /// differs: a 303 turns a POST into a GET) is meant, not a loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_url: Option<bool>,
}

/// `routes.retry`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRetry {
    /// Attempts in all, the first included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// What is retried: `connect_failure`, `refused`, `reset`, `timeout`,
    /// `gateway_error`, `5xx`, or a status such as `"503"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<FileBackoff>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<FileBudget>,
    /// Methods that may be retried (default: the idempotent ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Largest request body, in bytes, kept for sending again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replay_body: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBackoff {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
}

/// `budget = 0.2` or `budget = { ratio = 0.2, min_per_second = 10 }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FileBudget {
    Ratio(f64),
    Table(FileBudgetTable),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileBudgetTable {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_per_second: Option<u32>,
}

/// `routes.quota`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuota {
    /// Requests per `per`.
    pub rate: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<String>,
    /// Requests a key may send at once after a quiet spell (default `rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// What a bucket is counted by: `client_ip` (default), `header:NAME`,
    /// `subject` (the identity `auth` found), `route` (one bucket), or a
    /// list of them (the values joined, as Envoy's descriptors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<FileQuotaKey>,
    /// Keys remembered at most; beyond, the longest idle are forgotten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<u32>,
    /// `local` (default: this process counts alone) or `fleet` (every
    /// instance counts in `[limits] store`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// `token_bucket` (default) or `fixed_window` (fleet only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// What a fleet quota decides while its store fails: `local`
    /// (default: this instance's share of the limit), `allow`, `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_store_error: Option<String>,
    /// The longest a request waits on the store (fleet; default 5ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// The share of the limit an instance takes from the store at once
    /// and spends locally (fleet; default 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_allowance: Option<f64>,
    /// Which answers carry `RateLimit` and `RateLimit-Policy`:
    /// `refusals` (default: 429s) or `always` (every answer of the route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
}

/// `routes.quota.key`: one source or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FileQuotaKey {
    One(String),
    Many(Vec<String>),
}

/// `routes.hedge`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHedge {
    pub delay: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_extra: Option<u32>,
}

/// `routes.respond`: answer directly, without an upstream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRespond {
    #[serde(default = "default_respond_status")]
    pub status: u16,
    #[serde(default)]
    pub body: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

fn default_respond_status() -> u16 {
    200
}

//! Validation: `FileConfig → Spec`, or every diagnostic at once.
//!
//! Pure: reads the files the configuration references (token, certificates)
//! to hash and check them, and nothing else. It never binds, connects or
//! writes, so `validate` and `preview` are safe to call at any time.
//!
//! One `Validator` collects the diagnostics; each domain's checks are a
//! room of their own: `process.rs` (`[admin]`, `[log]`, `[tracing]`,
//! `[runtime]`), `fleet.rs`, `listeners.rs`, `l4.rs` (`tcp`/`udp`),
//! `tls.rs`, `upstreams.rs`, `resilience.rs` (health, outlier, retry,
//! hedge, quota), `routes.rs`, `filters.rs` (route filters, DESIGN §17) and `files.rs` (referenced files). This file
//! holds the entry points, the shared helpers (names, durations, methods,
//! addresses) and the order of the checks (`checked`). The fixtures of a
//! domain are `fixtures/configs/invalid/<domain>.toml`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::pattern::PathRegex;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use sha2::{Digest as _, Sha256};

use super::callers::{
    subject_parts, Approvable, ApprovalPolicy, CallerSpec, CertMatch, Credential, Scope, Scopes,
};
use super::spec::*;
use crate::config::{
    self, quote_key, Code, ConfigText, Diagnostic, FileConfig, FileRoute, FileUpstream,
};

mod auth;
mod cache;
mod compress;
mod cors;
mod files;
mod filters;
mod fleet;
mod l4;
mod limits;
mod listeners;
mod mirror;
mod process;
mod resilience;
mod reuse;
mod routes;
mod tls;
mod upstreams;
mod waf;

use files::confinement;
use routes::{is_host_port, parse_host};

/// Parses and validates configuration text. On failure, every diagnostic
/// found, each located in the text where possible.
pub fn validate(source: &ConfigText) -> Result<Spec, Vec<Diagnostic>> {
    validate_against(source, None, None)
}

/// As [`validate`], reading referenced files only inside the
/// configuration's folder and `file_roots`: the running process's roots
/// for a candidate (`Some`), which it cannot widen, or the text's own
/// `runtime.file_roots` for the configuration a process starts with.
pub fn validate_confined(
    source: &ConfigText,
    file_roots: Option<&[PathBuf]>,
) -> Result<Spec, Vec<Diagnostic>> {
    validate_against(source, file_roots, None)
}

/// As [`validate_confined`], taking over from the `active` configuration
/// every route and upstream the candidate did not change (see `reuse`):
/// the result is the one validating from scratch gives, with unchanged
/// entities shared instead of made again.
pub fn validate_against(
    source: &ConfigText,
    file_roots: Option<&[PathBuf]>,
    active: Option<&Spec>,
) -> Result<Spec, Vec<Diagnostic>> {
    // Unknown keys do not stop validation: everything else wrong with the
    // same entities is reported with them.
    let mut parsed = reuse::parse(&source.text, active)?;
    let file = std::mem::take(&mut parsed.file);
    let unknown_keys = std::mem::take(&mut parsed.unknown_keys);
    let (route_texts, segments) = (parsed.route_texts.take(), parsed.segments.take());
    let own_roots: Vec<PathBuf>;
    let roots = match file_roots {
        Some(roots) => roots,
        None => {
            own_roots = file.runtime.file_roots.iter().map(PathBuf::from).collect();
            &own_roots
        }
    };
    let mut v = Validator {
        base_dir: &source.base_dir,
        roots: confinement(&source.base_dir, roots),
        diagnostics: Vec::new(),
        referenced: Vec::new(),
        upstream_tls: HashMap::new(),
        hints: Vec::new(),
        route_files: Vec::new(),
        route_reused: Vec::new(),
        upstream_files: Vec::new(),
        secrets: HashMap::new(),
        cache_zones: BTreeMap::new(),
        refused_zones: Vec::new(),
        limit_store: false,
        active_waf: active.map(|a| a.waf_rulesets.clone()).unwrap_or_default(),
        waf_names: Vec::new(),
    };
    let context = reuse::route_context(&file, &v.roots);
    if let Some(active) = active.filter(|a| a.pieces.route_context == context) {
        v.hints = parsed.hints(active);
    }
    let spec = v.spec(file, |file| parsed.canonical(file, active));
    if v.diagnostics.is_empty() && unknown_keys.is_empty() {
        if let Some(mut spec) = spec {
            spec.config_version = config_version(&spec.canonical, &v.referenced);
            spec.referenced_files = v
                .referenced
                .iter()
                .map(|(name, _)| source.base_dir.join(name))
                .collect();
            spec.pieces = reuse::pieces(
                &source.text,
                segments,
                route_texts,
                parsed.upstream_texts.take(),
                std::mem::take(&mut v.route_files),
                std::mem::take(&mut v.upstream_files),
                context,
            );
            return Ok(spec);
        }
    }
    let root = toml::de::DeTable::parse(&source.text).ok();
    let map = config::SourceMap::new(&source.text, root);
    let mut diagnostics = v.diagnostics;
    for d in &mut diagnostics {
        if let Some((line, column)) = map.locate(&d.path) {
            d.line = Some(line);
            d.column = Some(column);
        }
    }
    diagnostics.extend(unknown_keys);
    // Report in source order, as a compiler would.
    diagnostics.sort_by_key(|d| (d.line.unwrap_or(usize::MAX), d.column.unwrap_or(0)));
    Err(capped(diagnostics))
}

/// At most this many diagnostics of one code are reported; the rest are
/// counted in one more.
pub const MAX_DIAGNOSTICS_PER_CODE: usize = 100;

/// Keeps the first `MAX_DIAGNOSTICS_PER_CODE` of each code (in source
/// order) and says how many more there were: 10 000 copies of one route
/// must not make an answer of 10 000 errors.
fn capped(diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut per_code: HashMap<Code, usize> = HashMap::new();
    let mut kept = Vec::with_capacity(diagnostics.len().min(1024));
    for d in diagnostics {
        let seen = per_code.entry(d.code).or_default();
        *seen += 1;
        if *seen <= MAX_DIAGNOSTICS_PER_CODE {
            kept.push(d);
        }
    }
    let mut more: Vec<_> = per_code
        .into_iter()
        .filter(|(_, n)| *n > MAX_DIAGNOSTICS_PER_CODE)
        .collect();
    more.sort();
    for (code, n) in more {
        kept.push(Diagnostic::new(
            code,
            "",
            format!(
                "and {} more {code} errors (the first {MAX_DIAGNOSTICS_PER_CODE} are listed)",
                n - MAX_DIAGNOSTICS_PER_CODE
            ),
        ));
    }
    kept
}

/// `sha256:<hex>` over the canonical text and each referenced file as the
/// configuration names it and as its contents are, so that a rotated
/// certificate is a new version. Never over where the configuration was
/// read from: the same text and the same files reached from `-c
/// gateway.toml` or from an absolute `config_path` are one version.
fn config_version(canonical: &config::Canonical, referenced: &[(String, Vec<u8>)]) -> String {
    let mut hasher = Sha256::new();
    canonical.write(|piece| hasher.update(piece.as_bytes()));
    for (name, contents) in referenced {
        hasher.update(b"\0file\0");
        hasher.update(name.as_bytes());
        hasher.update(b"\0");
        hasher.update((contents.len() as u64).to_be_bytes());
        hasher.update(contents);
    }
    format!("sha256:{:x}", hasher.finalize())
}

struct Validator<'a> {
    base_dir: &'a Path,
    /// Where referenced files may be (see `confinement`).
    roots: Vec<PathBuf>,
    diagnostics: Vec<Diagnostic>,
    /// Files read, by the name the configuration gives them.
    referenced: Vec<(String, Vec<u8>)>,
    /// The configuration's upstreams, and whether each has `tls`.
    upstream_tls: HashMap<String, bool>,
    /// Per route: the active configuration's spec, when its piece is
    /// unchanged and its context the same (`reuse`).
    hints: Vec<Option<reuse::Hint>>,
    /// The files each valid route and each upstream read.
    route_files: Vec<Vec<(String, Digest)>>,
    /// Per valid route: whether it is the active configuration's.
    route_reused: Vec<bool>,
    upstream_files: Vec<(String, Vec<(String, Digest)>)>,
    /// Secret files parsed so far, by resolved path and parser: a file
    /// named twice is one `SecretFile` (`auth.rs`).
    secrets: HashMap<(PathBuf, usize), Box<dyn std::any::Any + Send + Sync>>,
    /// `[cache.zones]`, read before the routes that name them.
    cache_zones: BTreeMap<String, ZoneSpec>,
    /// Zones declared but refused (reported there): a route naming one
    /// is not told it is undefined.
    refused_zones: Vec<String>,
    /// Whether `[limits] store` is given (fleet quotas need it).
    limit_store: bool,
    /// The active configuration's compiled rule sets, to share.
    active_waf: BTreeMap<String, Arc<super::WafRuleset>>,
    /// The `[waf.rulesets]` declared (compiled or refused), for the
    /// routes and defaults that name one.
    waf_names: Vec<String>,
}

fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

impl Validator<'_> {
    fn error(&mut self, code: Code, path: impl Into<String>, message: impl Into<String>) {
        self.diagnostics.push(Diagnostic::new(code, path, message));
    }

    fn name(&mut self, kind: &str, path: String, name: &str) {
        if !is_valid_name(name) {
            self.error(
                Code::InvalidName,
                path,
                format!("{kind} name '{name}' is invalid: names are [a-z0-9][a-z0-9_-]*"),
            );
        }
    }

    /// CIDRs (a bare address is a network of one), each refused at its
    /// own index under `path`; `None` when any is.
    fn networks(&mut self, path: &str, list: &[String]) -> Option<Vec<ipnet::IpNet>> {
        let mut nets = Vec::with_capacity(list.len());
        let mut ok = true;
        for (n, text) in list.iter().enumerate() {
            let parsed = text
                .parse::<ipnet::IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
            match parsed {
                Ok(net) => nets.push(net.trunc()),
                Err(_) => {
                    self.error(
                        Code::InvalidAddress,
                        format!("{path}[{n}]"),
                        format!("'{text}' is not an IP address or CIDR (10.0.0.0/8, ::1/128)"),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(nets)
    }

    fn duration(&mut self, path: String, text: &str) -> Option<Duration> {
        match humantime::parse_duration(text) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                self.error(
                    Code::InvalidDuration,
                    path,
                    format!("duration '{text}' must be greater than zero"),
                );
                None
            }
            Err(e) => {
                self.error(
                    Code::InvalidDuration,
                    path,
                    format!(
                        "'{text}' is not a duration ({e}); write e.g. \"250ms\", \"5s\", \"2m\""
                    ),
                );
                None
            }
        }
    }

    /// A method name as requests spell it: methods are case-sensitive
    /// (RFC 9110 §9.1), so `get` would never match a `GET`.
    fn method(&mut self, path: String, text: &str) -> Option<Method> {
        let upper = !text.is_empty() && text.bytes().all(|b| b.is_ascii_uppercase());
        match Method::from_bytes(text.as_bytes()) {
            Ok(method) if upper => Some(method),
            _ => {
                self.error(
                    Code::InvalidMethod,
                    path,
                    format!("'{text}' is not an HTTP method as requests spell it (methods are case-sensitive: GET, POST, …)"),
                );
                None
            }
        }
    }

    fn socket_addr(&mut self, path: String, text: &str) -> Option<SocketAddr> {
        match text.parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.error(
                    Code::InvalidAddress,
                    path,
                    format!("'{text}' is not an IP:port socket address (e.g. \"127.0.0.1:8080\")"),
                );
                None
            }
        }
    }

    fn spec(
        &mut self,
        file: FileConfig,
        canonical: impl Fn(&FileConfig) -> config::Canonical + Sync,
    ) -> Option<Spec> {
        // Serializing a large configuration costs about as much as all
        // the checks: do both at once.
        let large = file.routes.len() >= super::PARALLEL_FROM_ROUTES;
        let (canonical, checked) =
            super::in_parallel(large, || canonical(&file), || self.checked(&file));
        Some(Spec {
            file,
            canonical,
            ..checked?
        })
    }

    /// Every check; the spec it returns lacks only the file and its
    /// canonical text.
    fn checked(&mut self, file: &FileConfig) -> Option<Spec> {
        self.upstream_tls = file
            .upstreams
            .iter()
            .map(|(name, u)| (name.clone(), u.tls.is_some()))
            .collect();
        let admin = self.admin(file);
        let metrics_bind = file
            .metrics
            .as_ref()
            .and_then(|m| self.socket_addr("metrics.bind".into(), &m.bind));
        let metrics_max_series = file
            .metrics
            .as_ref()
            .and_then(|m| m.max_series)
            .unwrap_or(crate::telemetry::series::DEFAULT_MAX_SERIES);
        if metrics_max_series == 0 {
            self.error(
                Code::InvalidMaxSeries,
                "metrics.max_series",
                "metrics.max_series must be at least 1".to_owned(),
            );
        }
        let log = self.log(file);
        let tracing = self.tracing(file);
        let runtime = self.runtime(file);
        let upstreams = self.upstreams(&file.upstreams);
        self.cache_zones = self.cache_zones(file);
        let limit_store = self.limit_store(file);
        let active_waf = std::mem::take(&mut self.active_waf);
        let waf_rulesets = self.waf_rulesets(file, &active_waf);
        self.limit_store = file.limits.as_ref().is_some_and(|l| l.store.is_some());
        let listeners = self.listeners(file);
        self.l4_upstreams(file);
        let routes = self.routes(file);
        self.ambiguous_routes(file, &routes);
        self.acme_served(&listeners, &routes, file.fleet.is_some());
        let fleet = file.fleet.as_ref().and_then(|f| self.fleet(f));
        let discovery = self.discovery(file);
        if file.fleet.is_some() && file.runtime.write_back == Some(true) {
            self.error(
                Code::ConflictingOptions,
                "runtime.write_back",
                "runtime.write_back cannot be set with [fleet]: the fleet's shared document, not this file, holds the routes",
            );
        }
        Some(Spec {
            file: FileConfig::default(),
            canonical: config::Canonical::default(),
            pieces: Pieces::default(),
            config_version: String::new(),
            referenced_files: Vec::new(),
            admin: admin?,
            metrics_bind,
            metrics_max_series,
            log: log?,
            tracing,
            runtime: runtime?,
            listeners,
            routes,
            upstreams,
            fleet,
            discovery,
            cache_zones: std::mem::take(&mut self.cache_zones),
            limit_store,
            waf_rulesets,
        })
    }
}

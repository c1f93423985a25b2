//! Validation: `FileConfig → Spec`, or every diagnostic at once.
//!
//! Pure: reads the files the configuration references (token, certificates)
//! to hash and check them, and nothing else. It never binds, connects or
//! writes, so `validate` and `preview` are safe to call at any time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::pattern::PathRegex;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use sha2::{Digest, Sha256};

use super::spec::*;
use crate::config::{
    self, quote_key, Code, ConfigText, Diagnostic, FileConfig, FileRoute, FileUpstream,
};

/// Parses and validates configuration text. On failure, every diagnostic
/// found, each located in the text where possible.
pub fn validate(source: &ConfigText) -> Result<Spec, Vec<Diagnostic>> {
    validate_confined(source, None)
}

/// As [`validate`], reading referenced files only inside the
/// configuration's folder and `file_roots`: the running process's roots
/// for a candidate (`Some`), which it cannot widen, or the text's own
/// `runtime.file_roots` for the configuration a process starts with.
pub fn validate_confined(
    source: &ConfigText,
    file_roots: Option<&[PathBuf]>,
) -> Result<Spec, Vec<Diagnostic>> {
    // Unknown keys do not stop validation: everything else wrong with the
    // same entities is reported with them.
    let (file, unknown_keys) = config::parse_lenient(&source.text)?;
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
    };
    let spec = v.spec(file);
    if v.diagnostics.is_empty() && unknown_keys.is_empty() {
        if let Some(mut spec) = spec {
            spec.config_version = config_version(&spec.canonical, &v.referenced);
            spec.referenced_files = v
                .referenced
                .iter()
                .map(|(name, _)| source.base_dir.join(name))
                .collect();
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
fn config_version(canonical: &str, referenced: &[(String, Vec<u8>)]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(canonical.as_bytes());
    for (name, contents) in referenced {
        hasher.update(b"\0file\0");
        hasher.update(name.as_bytes());
        hasher.update(b"\0");
        hasher.update((contents.len() as u64).to_be_bytes());
        hasher.update(contents);
    }
    format!("sha256:{:x}", hasher.finalize())
}

/// The folders referenced files may be in, symlinks resolved: the
/// configuration's own and the absolute `roots` that exist.
fn confinement(base_dir: &Path, roots: &[PathBuf]) -> Vec<PathBuf> {
    std::iter::once(base_dir)
        .chain(
            roots
                .iter()
                .map(PathBuf::as_path)
                .filter(|r| r.is_absolute()),
        )
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .collect()
}

/// `path` made absolute and its `.` and `..` resolved by text alone.
fn lexically_absolute(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for part in absolute.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

struct Validator<'a> {
    base_dir: &'a Path,
    /// Where referenced files may be (see `confinement`).
    roots: Vec<PathBuf>,
    diagnostics: Vec<Diagnostic>,
    /// Files read, by the name the configuration gives them.
    referenced: Vec<(String, Vec<u8>)>,
}

fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The host name's first label, lower-cased: the default fleet instance
/// name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
        .trim()
        .split('.')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
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

    fn read_file(&mut self, path: String, name: &str) -> Option<Vec<u8>> {
        let resolved = self.base_dir.join(name);
        // Checked by text first, so that a path outside answers the same
        // whether or not something is there (no oracle for which files
        // exist), then with symlinks resolved.
        let inside = |p: &Path| self.roots.iter().any(|root| p.starts_with(root));
        let outside = !inside(&lexically_absolute(&resolved))
            || std::fs::canonicalize(&resolved).is_ok_and(|real| !inside(&real));
        if outside {
            self.error(
                Code::FileOutsideRoots,
                path,
                format!(
                    "'{name}' is outside the configuration's folder and runtime.file_roots; referenced files must be inside them"
                ),
            );
            return None;
        }
        match config::read_regular(&resolved, config::MAX_REFERENCED_FILE) {
            Ok(contents) => {
                self.referenced.push((name.to_owned(), contents.clone()));
                Some(contents)
            }
            Err(e) => {
                self.error(
                    Code::UnreadableFile,
                    path,
                    format!("cannot read '{}': {e}", resolved.display()),
                );
                None
            }
        }
    }

    fn spec(&mut self, file: FileConfig) -> Option<Spec> {
        // Serializing a large configuration costs about as much as all
        // the checks: do both at once.
        let large = file.routes.len() >= super::PARALLEL_FROM_ROUTES;
        let (canonical, checked) =
            super::in_parallel(large, || config::canonical(&file), || self.checked(&file));
        Some(Spec {
            file,
            canonical,
            ..checked?
        })
    }

    /// Every check; the spec it returns lacks only the file and its
    /// canonical text.
    fn checked(&mut self, file: &FileConfig) -> Option<Spec> {
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
        let listeners = self.listeners(file);
        self.l4_upstreams(file);
        let routes = self.routes(file);
        self.ambiguous_routes(&routes);
        let fleet = file.fleet.as_ref().and_then(|f| self.fleet(f));
        if file.fleet.is_some() && file.runtime.write_back == Some(true) {
            self.error(
                Code::ConflictingOptions,
                "runtime.write_back",
                "runtime.write_back cannot be set with [fleet]: the fleet's shared document, not this file, holds the routes",
            );
        }
        Some(Spec {
            file: FileConfig::default(),
            canonical: String::new(),
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
        })
    }

    fn fleet(&mut self, f: &crate::config::FileFleet) -> Option<FleetSpec> {
        if !cfg!(feature = "fleet") {
            self.error(
                Code::FleetNotBuilt,
                "fleet",
                "this cutover was built without the `fleet` feature: it cannot join a fleet",
            );
            return None;
        }
        let before = self.diagnostics.len();
        let instance = match &f.instance {
            Some(name) => name.clone(),
            None => host_name(),
        };
        if f.instance.is_none() && !is_valid_name(&instance) {
            self.error(
                Code::InvalidName,
                "fleet",
                format!("the host name '{instance}' is not an instance name ([a-z0-9][a-z0-9_-]*): set fleet.instance"),
            );
        } else {
            self.name("instance", "fleet.instance".into(), &instance);
        }
        if f.endpoints.is_empty() {
            self.error(
                Code::InvalidValue,
                "fleet.endpoints",
                "fleet.endpoints must name at least one etcd endpoint",
            );
        }
        let tls = f.ca.is_some();
        let mut endpoints = Vec::with_capacity(f.endpoints.len());
        for (i, text) in f.endpoints.iter().enumerate() {
            let url = if text.contains("://") {
                text.clone()
            } else {
                format!("{}://{text}", if tls { "https" } else { "http" })
            };
            match url.parse::<http::Uri>() {
                Ok(uri)
                    if uri.authority().is_some_and(|a| a.port().is_some())
                        && matches!(uri.path(), "" | "/")
                        && uri.scheme_str() == Some(if tls { "https" } else { "http" }) =>
                {
                    endpoints.push(url)
                }
                _ => self.error(
                    Code::InvalidEndpoint,
                    format!("fleet.endpoints[{i}]"),
                    format!(
                        "'{text}' is not an etcd endpoint: write host:port or {}://host:port ({} because fleet.ca {})",
                        if tls { "https" } else { "http" },
                        if tls { "https" } else { "http" },
                        if tls { "is set" } else { "is not set" }
                    ),
                ),
            }
        }
        let prefix = f.prefix.trim_end_matches('/').to_owned();
        if !prefix.starts_with('/') || prefix.len() < 2 || prefix.chars().any(char::is_whitespace) {
            self.error(
                Code::InvalidValue,
                "fleet.prefix",
                format!("fleet.prefix '{}' must start with '/' and name a key prefix without spaces (e.g. \"/cutover/prod\")", f.prefix),
            );
        }
        let lease_ttl = match &f.lease_ttl {
            None => Some(Duration::from_secs(10)),
            Some(text) => self.duration("fleet.lease_ttl".into(), text).filter(|ttl| {
                let ok = (Duration::from_secs(3)..=Duration::from_secs(300)).contains(ttl);
                if !ok {
                    self.error(
                        Code::InvalidValue,
                        "fleet.lease_ttl",
                        format!("fleet.lease_ttl '{text}' must be between 3s and 5m"),
                    );
                }
                ok
            }),
        };
        let ca =
            f.ca.as_ref()
                .and_then(|name| self.read_file("fleet.ca".into(), name));
        let identity = match (&f.cert, &f.key) {
            (None, None) => None,
            (Some(cert), Some(key)) if tls => {
                let cert = self.read_file("fleet.cert".into(), cert);
                let key = self.read_file("fleet.key".into(), key);
                cert.zip(key)
            }
            _ => {
                self.error(
                    Code::InvalidValue,
                    "fleet.cert",
                    "fleet.cert and fleet.key go together, and need fleet.ca",
                );
                None
            }
        };
        let credentials = match (&f.username, &f.password_file) {
            (None, None) => None,
            (Some(user), Some(file)) => self
                .read_file("fleet.password_file".into(), file)
                .and_then(|bytes| match String::from_utf8(bytes) {
                    Ok(text) => {
                        Some((user.clone(), text.trim_end_matches(['\r', '\n']).to_owned()))
                    }
                    Err(_) => {
                        self.error(
                            Code::InvalidValue,
                            "fleet.password_file",
                            "the password file is not UTF-8",
                        );
                        None
                    }
                }),
            _ => {
                self.error(
                    Code::InvalidValue,
                    "fleet.username",
                    "fleet.username and fleet.password_file go together",
                );
                None
            }
        };
        if self.diagnostics.len() != before {
            return None;
        }
        Some(FleetSpec {
            endpoints,
            prefix,
            instance,
            lease_ttl: lease_ttl?,
            tls: ca.map(|ca| FleetTls { ca, identity }),
            credentials,
        })
    }

    fn admin(&mut self, file: &FileConfig) -> Option<AdminSpec> {
        let bind = self.socket_addr("admin.bind".into(), &file.admin.bind);
        let token = match &file.admin.token_file {
            Some(name) => {
                let contents = self.read_file("admin.token_file".into(), name)?;
                let token = String::from_utf8_lossy(&contents).trim().to_owned();
                if token.len() < 16 {
                    self.error(
                        Code::WeakToken,
                        "admin.token_file",
                        format!("the admin token in '{name}' must be at least 16 characters"),
                    );
                }
                Some(token)
            }
            None => None,
        };
        let bind = bind?;
        if !bind.ip().is_loopback() && token.is_none() {
            self.error(
                Code::AdminUnprotected,
                "admin.bind",
                format!("admin bind {bind} is not a loopback address; set admin.token_file to protect it"),
            );
        }
        Some(AdminSpec {
            bind,
            token,
            require_expected_generation: file.admin.require_expected_generation,
        })
    }

    fn tracing(&mut self, file: &FileConfig) -> TracingSpec {
        let section = file.tracing.clone();
        let otlp_endpoint = section.otlp_endpoint.as_deref().and_then(|text| {
            if !cfg!(feature = "otlp") {
                self.error(
                    Code::OtlpNotBuilt,
                    "tracing.otlp_endpoint",
                    "this cutover was built without the `otlp` feature: it cannot export spans",
                );
                return None;
            }
            match text.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("http" | "https"))
                        && uri.authority().is_some() =>
                {
                    Some(uri)
                }
                _ => {
                    self.error(
                        Code::InvalidOtlpEndpoint,
                        "tracing.otlp_endpoint",
                        format!("'{text}' is not an http:// or https:// URL with a host"),
                    );
                    None
                }
            }
        });
        let sample_ratio = section.sample_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sample_ratio) {
            self.error(
                Code::InvalidSampleRatio,
                "tracing.sample_ratio",
                format!("sample_ratio {sample_ratio} is not between 0 and 1"),
            );
        }
        TracingSpec {
            otlp_endpoint,
            service_name: section.service_name.unwrap_or_else(|| "cutover".to_owned()),
            sample_ratio: sample_ratio.clamp(0.0, 1.0),
        }
    }

    fn log(&mut self, file: &FileConfig) -> Option<LogSpec> {
        let level = file.log.level.trim().to_owned();
        if tracing_subscriber::EnvFilter::builder()
            .parse(&level)
            .is_err()
            || level.is_empty()
        {
            self.error(
                Code::InvalidLogLevel,
                "log.level",
                format!("'{level}' is not a log level or filter (trace, debug, info, warn, error, or target=level)"),
            );
        }
        let format = match file.log.format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                self.error(
                    Code::InvalidLogFormat,
                    "log.format",
                    format!("log format '{other}' is not text or json"),
                );
                LogFormat::Text
            }
        };
        Some(LogSpec {
            level,
            format,
            file: file.log.file.as_ref().map(|f| self.base_dir.join(f)),
            access: file.log.access,
            access_file: file.log.access_file.as_ref().map(|f| self.base_dir.join(f)),
        })
    }

    fn runtime(&mut self, file: &FileConfig) -> Option<RuntimeSpec> {
        let r = &file.runtime;
        if !(1..=1024).contains(&r.history_limit) {
            self.error(
                Code::InvalidValue,
                "runtime.history_limit",
                format!(
                    "history_limit {} must be between 1 and 1024",
                    r.history_limit
                ),
            );
        }
        if let Some(threads) = r.worker_threads {
            if !(1..=1024).contains(&threads) {
                self.error(
                    Code::InvalidValue,
                    "runtime.worker_threads",
                    format!("worker_threads {threads} must be between 1 and 1024"),
                );
            }
        }
        let drain_timeout = self.duration("runtime.drain_timeout".into(), &r.drain_timeout);
        let max_pinned_age = match &r.max_pinned_age {
            Some(text) => Some(self.duration("runtime.max_pinned_age".into(), text)?),
            None => None,
        };
        let mut file_roots = Vec::with_capacity(r.file_roots.len());
        for (i, root) in r.file_roots.iter().enumerate() {
            let root = PathBuf::from(root);
            if root.is_absolute() {
                file_roots.push(root);
            } else {
                self.error(
                    Code::InvalidValue,
                    format!("runtime.file_roots[{i}]"),
                    format!("file root '{}' must be an absolute path", root.display()),
                );
            }
        }
        Some(RuntimeSpec {
            file_roots,
            state_dir: r.state_dir.as_ref().map(|d| self.base_dir.join(d)),
            history_limit: r.history_limit.clamp(1, 1024) as usize,
            drain_timeout: drain_timeout?,
            max_pinned_age,
            worker_threads: r.worker_threads.map(|t| t as usize),
            write_back: r.write_back.unwrap_or(false),
        })
    }

    fn listeners(&mut self, file: &FileConfig) -> Vec<ListenerSpec> {
        let mut out = Vec::new();
        let mut names = HashSet::new();
        // A udp and a tcp listener may share an address (DNS on 53 both
        // ways); two of the same kind may not.
        let mut binds: HashMap<(bool, SocketAddr), String> = HashMap::new();
        for (i, l) in file.listeners.iter().enumerate() {
            let at = |field: &str| format!("listeners[{i}].{field}");
            self.name("listener", at("name"), &l.name);
            if !names.insert(l.name.as_str()) {
                self.error(
                    Code::DuplicateName,
                    at("name"),
                    format!("listener '{}' is defined twice", l.name),
                );
            }
            let bind = self.socket_addr(at("bind"), &l.bind);
            if let Some(bind) = bind.filter(|b| b.port() != 0) {
                if let Some(other) = binds.insert((l.protocol == "udp", bind), l.name.clone()) {
                    self.error(
                        Code::DuplicateBind,
                        at("bind"),
                        format!("listeners '{other}' and '{}' both bind {bind}", l.name),
                    );
                }
            }
            let mut listener_tls = None;
            let protocol = match l.protocol.as_str() {
                "http" => Some(ListenerProtocol::Http),
                "https" => Some(ListenerProtocol::Https),
                "tcp" => Some(ListenerProtocol::Tcp),
                "udp" => Some(ListenerProtocol::Udp),
                other => {
                    self.error(
                        Code::InvalidProtocol,
                        at("protocol"),
                        format!("listener protocol '{other}' is not http, https, tcp or udp"),
                    );
                    None
                }
            };
            match protocol {
                Some(ListenerProtocol::Http) => {
                    if l.tls.is_some() {
                        self.error(Code::UnexpectedTls, at("tls"), format!("listener '{}' speaks plain http but has a tls section; use protocol = \"https\"", l.name));
                    }
                    if l.upstream.is_some() {
                        self.error(Code::UnexpectedUpstream, at("upstream"), format!("http listener '{}' cannot name an upstream; routes choose upstreams", l.name));
                    }
                }
                Some(ListenerProtocol::Https) => {
                    match &l.tls {
                        Some(tls) if !tls.certificates.is_empty() => {
                            listener_tls = self.listener_tls(i, tls);
                        }
                        _ => self.error(
                            Code::MissingTls,
                            at("protocol"),
                            format!("https listener '{}' needs tls.certificates", l.name),
                        ),
                    }
                    if l.upstream.is_some() {
                        self.error(Code::UnexpectedUpstream, at("upstream"), format!("https listener '{}' cannot name an upstream; routes choose upstreams", l.name));
                    }
                }
                Some(ListenerProtocol::Tcp) => match (&l.upstream, l.sni_routes.is_empty()) {
                    (Some(u), true) if !file.upstreams.contains_key(u) => self.error(
                        Code::UnknownUpstream,
                        at("upstream"),
                        format!(
                            "listener '{}' names upstream '{u}', which is not defined",
                            l.name
                        ),
                    ),
                    (Some(_), true) => {}
                    (Some(_), false) => self.error(
                        Code::ConflictingOptions,
                        at("upstream"),
                        format!("tcp listener '{}' routes by SNI: name the fallback with default_upstream, not upstream", l.name),
                    ),
                    (None, false) => {}
                    (None, true) => self.error(
                        Code::MissingUpstream,
                        at("protocol"),
                        format!("tcp listener '{}' needs an upstream (or sni_routes)", l.name),
                    ),
                },
                Some(ListenerProtocol::Udp) => match &l.upstream {
                    Some(u) => match file.upstreams.get(u) {
                        None => self.error(
                            Code::UnknownUpstream,
                            at("upstream"),
                            format!("listener '{}' names upstream '{u}', which is not defined", l.name),
                        ),
                        Some(fu) => {
                            // Refused rather than ignored: neither speaks UDP.
                            if fu.proxy_protocol.is_some() {
                                self.error(Code::UnsupportedOption, at("upstream"), format!("udp listener '{}' names upstream '{u}', which has proxy_protocol; no PROXY header is sent over udp", l.name));
                            }
                            if fu.health.is_some() {
                                self.error(Code::UnsupportedOption, at("upstream"), format!("udp listener '{}' names upstream '{u}', which has active health checks; they speak http or tcp, not udp", l.name));
                            }
                        }
                    },
                    None => self.error(
                        Code::MissingUpstream,
                        at("protocol"),
                        format!("udp listener '{}' needs an upstream", l.name),
                    ),
                },
                None => {}
            }
            if protocol.is_some_and(ListenerProtocol::is_l4) && l.tls.is_some() {
                self.error(
                    Code::UnexpectedTls,
                    at("tls"),
                    format!(
                        "{} listener '{}' cannot terminate TLS in this version",
                        l.protocol, l.name
                    ),
                );
            }
            let mut limits = ListenerLimits::default();
            if let Some(t) = &l.header_read_timeout {
                if let Some(d) = self.duration(at("header_read_timeout"), t) {
                    limits.header_read_timeout = d;
                }
            }
            if let Some(n) = l.max_header_bytes {
                if n < 8192 {
                    self.error(
                        Code::InvalidValue,
                        at("max_header_bytes"),
                        format!("max_header_bytes {n} must be at least 8192"),
                    );
                }
                limits.max_header_bytes = n.max(8192) as usize;
            }
            if let Some(n) = l.max_headers {
                if n == 0 {
                    self.error(
                        Code::InvalidValue,
                        at("max_headers"),
                        "max_headers must be at least 1",
                    );
                }
                limits.max_headers = n.max(1) as usize;
            }
            if let Some(n) = l.max_concurrent_streams {
                if n == 0 {
                    self.error(
                        Code::InvalidValue,
                        at("max_concurrent_streams"),
                        "max_concurrent_streams must be at least 1",
                    );
                }
                limits.max_concurrent_streams = n.max(1);
            }
            for (key, value, slot) in [
                (
                    "keepalive_timeout",
                    &l.keepalive_timeout,
                    &mut limits.keepalive_timeout,
                ),
                ("idle_timeout", &l.idle_timeout, &mut limits.idle_timeout),
            ] {
                if let Some(d) = value.as_ref().and_then(|t| self.duration(at(key), t)) {
                    *slot = d;
                }
            }
            match l.h2_keepalive_interval.as_deref() {
                None => {}
                Some("off") => limits.h2_keepalive_interval = None,
                Some(t) => {
                    if let Some(d) = self.duration(at("h2_keepalive_interval"), t) {
                        limits.h2_keepalive_interval = Some(d);
                    }
                }
            }
            if let Some(n) = l.max_connections {
                if n == 0 {
                    self.error(
                        Code::InvalidValue,
                        at("max_connections"),
                        "max_connections must be at least 1",
                    );
                }
                limits.max_connections = Some(n.max(1) as usize);
            }
            let edge = self.listener_edge(i, l, protocol);
            let l4 = self.listener_l4(i, l, protocol, file);
            if l.http3 == Some(true) && protocol.is_some_and(|p| p != ListenerProtocol::Https) {
                self.error(
                    Code::UnexpectedOption,
                    at("http3"),
                    format!(
                        "listener '{}': http3 needs protocol = \"https\" (QUIC is TLS 1.3)",
                        l.name
                    ),
                );
            }
            if l.http3_early_data == Some(true) {
                if l.http3 != Some(true) {
                    self.error(
                        Code::UnexpectedOption,
                        at("http3_early_data"),
                        format!("listener '{}': http3_early_data needs http3 = true", l.name),
                    );
                } else if l.tls.as_ref().is_some_and(|t| t.client_ca.is_some()) {
                    self.error(
                        Code::ConflictingOptions,
                        at("http3_early_data"),
                        format!("listener '{}': early data would be served before the client certificate is checked; not with tls.client_ca", l.name),
                    );
                }
            }
            if l.accept_proxy_protocol == Some(true) && edge.trusted_proxies.is_empty() {
                self.error(
                    Code::MissingTrustedProxies,
                    at("accept_proxy_protocol"),
                    format!("listener '{}' accepts the PROXY protocol: name the peers that may send it in trusted_proxies (anyone else could claim any address)", l.name),
                );
            }
            if let (Some(bind), Some(protocol)) = (bind, protocol) {
                out.push(ListenerSpec {
                    name: l.name.clone(),
                    bind,
                    protocol,
                    limits,
                    edge,
                    upstream: l.upstream.clone(),
                    tls_material: listener_tls.as_ref().map(|(_, m)| Arc::clone(m)),
                    tls: listener_tls.map(|(spec, _)| spec),
                    accept_proxy_protocol: l.accept_proxy_protocol.unwrap_or(false),
                    http3: l.http3.unwrap_or(false),
                    http3_early_data: l.http3_early_data.unwrap_or(false),
                    l4,
                });
            }
        }
        out
    }

    /// A listener's path and forwarding-header rules (DESIGN §13); HTTP
    /// options on a `tcp` listener are refused rather than ignored.
    fn listener_edge(
        &mut self,
        i: usize,
        l: &crate::config::FileListener,
        protocol: Option<ListenerProtocol>,
    ) -> ListenerEdge {
        let at = |field: &str| format!("listeners[{i}].{field}");
        if protocol == Some(ListenerProtocol::Udp) {
            let not_udp = [
                ("header_read_timeout", l.header_read_timeout.is_some()),
                ("max_header_bytes", l.max_header_bytes.is_some()),
                ("max_headers", l.max_headers.is_some()),
                ("max_concurrent_streams", l.max_concurrent_streams.is_some()),
                ("keepalive_timeout", l.keepalive_timeout.is_some()),
                ("h2_keepalive_interval", l.h2_keepalive_interval.is_some()),
                ("max_connections", l.max_connections.is_some()),
                ("max_inflight", l.max_inflight.is_some()),
                ("merge_slashes", l.merge_slashes.is_some()),
                ("encoded_slash", l.encoded_slash.is_some()),
                ("trust_forwarded", l.trust_forwarded.is_some()),
                ("trusted_proxies", !l.trusted_proxies.is_empty()),
                ("accept_proxy_protocol", l.accept_proxy_protocol.is_some()),
            ];
            self.refuse(i, &not_udp, |key| {
                let hint = if key == "max_connections" {
                    " (max_sessions bounds sessions)"
                } else {
                    ""
                };
                format!(
                    "udp listener '{}' carries datagrams; {key} does not apply{hint}",
                    l.name
                )
            });
        }
        if protocol == Some(ListenerProtocol::Tcp) {
            let http_only = [
                // Only as the PROXY header's deadline.
                (
                    "header_read_timeout",
                    l.header_read_timeout.is_some() && l.accept_proxy_protocol != Some(true),
                ),
                ("max_header_bytes", l.max_header_bytes.is_some()),
                ("max_headers", l.max_headers.is_some()),
                ("max_concurrent_streams", l.max_concurrent_streams.is_some()),
                ("keepalive_timeout", l.keepalive_timeout.is_some()),
                ("h2_keepalive_interval", l.h2_keepalive_interval.is_some()),
                ("merge_slashes", l.merge_slashes.is_some()),
                ("encoded_slash", l.encoded_slash.is_some()),
                ("trust_forwarded", l.trust_forwarded.is_some()),
                // Only as the peers that may send a PROXY header.
                (
                    "trusted_proxies",
                    !l.trusted_proxies.is_empty() && l.accept_proxy_protocol != Some(true),
                ),
                ("max_inflight", l.max_inflight.is_some()),
            ];
            self.refuse(i, &http_only, |key| {
                format!(
                    "tcp listener '{}' carries no HTTP; {key} does not apply",
                    l.name
                )
            });
        }
        let encoded_slash = match l.encoded_slash.as_deref() {
            None | Some("keep") => EncodedSlash::Keep,
            Some("reject") => EncodedSlash::Reject,
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    at("encoded_slash"),
                    format!("encoded_slash '{other}' is not keep or reject"),
                );
                EncodedSlash::Keep
            }
        };
        let trust_forwarded = l.trust_forwarded.unwrap_or(false);
        if trust_forwarded && !l.trusted_proxies.is_empty() {
            self.error(
                Code::ConflictingOptions,
                at("trusted_proxies"),
                "trust_forwarded = true trusts every peer, so trusted_proxies would have no effect; set one of them",
            );
        }
        let mut trusted_proxies = Vec::with_capacity(l.trusted_proxies.len());
        for (p, text) in l.trusted_proxies.iter().enumerate() {
            // A bare address is a network of one.
            let parsed = text
                .parse::<ipnet::IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
            match parsed {
                Ok(net) => trusted_proxies.push(net.trunc()),
                Err(_) => self.error(
                    Code::InvalidAddress,
                    format!("listeners[{i}].trusted_proxies[{p}]"),
                    format!("'{text}' is not an IP address or CIDR (10.0.0.0/8, ::1/128)"),
                ),
            }
        }
        if l.max_inflight == Some(0) {
            self.error(
                Code::InvalidValue,
                at("max_inflight"),
                "max_inflight must be at least 1",
            );
        }
        ListenerEdge {
            max_inflight: l.max_inflight.filter(|n| *n > 0),
            merge_slashes: l.merge_slashes.unwrap_or(false),
            encoded_slash,
            trust_forwarded,
            trusted_proxies,
        }
    }

    /// Refuses (`unexpected_option`) each key of listener `i` that is set
    /// but cannot be honoured there, saying `why`.
    fn refuse(&mut self, i: usize, keys: &[(&str, bool)], why: impl Fn(&str) -> String) {
        for (key, _) in keys.iter().filter(|(_, set)| *set) {
            self.error(
                Code::UnexpectedOption,
                format!("listeners[{i}].{key}"),
                why(key),
            );
        }
    }

    /// A `tcp` listener's idle timeout and SNI routes; the SNI options
    /// on any other listener are refused rather than ignored.
    fn listener_l4(
        &mut self,
        i: usize,
        l: &crate::config::FileListener,
        protocol: Option<ListenerProtocol>,
        file: &FileConfig,
    ) -> L4Spec {
        let at = |field: &str| format!("listeners[{i}].{field}");
        if protocol != Some(ListenerProtocol::Udp) && l.max_sessions.is_some() {
            self.error(
                Code::UnexpectedOption,
                at("max_sessions"),
                format!("max_sessions bounds udp sessions; listener '{}' is not udp (max_connections bounds connections)", l.name),
            );
        }
        if protocol.is_some() && protocol != Some(ListenerProtocol::Tcp) {
            let sni = [
                ("sni_routes", !l.sni_routes.is_empty()),
                ("default_upstream", l.default_upstream.is_some()),
                ("client_hello_timeout", l.client_hello_timeout.is_some()),
            ];
            self.refuse(i, &sni, |key| {
                format!(
                    "{key} routes TLS pass-through on tcp listeners; listener '{}' is {}",
                    l.name, l.protocol
                )
            });
        }
        if protocol == Some(ListenerProtocol::Udp) {
            let idle_timeout = match l.idle_timeout.as_deref() {
                None => Some(DEFAULT_UDP_IDLE_TIMEOUT),
                Some("off") => {
                    self.error(
                        Code::InvalidValue,
                        at("idle_timeout"),
                        "a udp session ends only when it idles: idle_timeout cannot be off",
                    );
                    None
                }
                Some(text) => self.duration(at("idle_timeout"), text),
            };
            if l.max_sessions == Some(0) {
                self.error(
                    Code::InvalidValue,
                    at("max_sessions"),
                    "max_sessions must be at least 1",
                );
            }
            return L4Spec {
                sni: None,
                idle_timeout,
                max_sessions: l
                    .max_sessions
                    .map_or(DEFAULT_UDP_MAX_SESSIONS, |n| n.max(1) as usize),
            };
        }
        if protocol != Some(ListenerProtocol::Tcp) {
            return L4Spec::default();
        }
        let idle_timeout = match l.idle_timeout.as_deref() {
            None => Some(DEFAULT_TCP_IDLE_TIMEOUT),
            Some("off") => None,
            Some(text) => self.duration(at("idle_timeout"), text),
        };
        if l.sni_routes.is_empty() {
            let sni_only = [
                ("default_upstream", l.default_upstream.is_some()),
                ("client_hello_timeout", l.client_hello_timeout.is_some()),
            ];
            self.refuse(i, &sni_only, |key| {
                format!(
                    "{key} applies to sni_routes, and tcp listener '{}' has none",
                    l.name
                )
            });
            return L4Spec {
                sni: None,
                idle_timeout,
                max_sessions: 0,
            };
        }
        let known = |this: &mut Self, path: String, name: &str| {
            if !file.upstreams.contains_key(name) {
                this.error(
                    Code::UnknownUpstream,
                    path,
                    format!(
                        "listener '{}' names upstream '{name}', which is not defined",
                        l.name
                    ),
                );
            }
        };
        let mut routes = Vec::with_capacity(l.sni_routes.len());
        let mut seen: HashMap<(String, Vec<String>), usize> = HashMap::new();
        for (r, route) in l.sni_routes.iter().enumerate() {
            let path = |field: &str| format!("listeners[{i}].sni_routes[{r}].{field}");
            known(self, path("upstream"), &route.upstream);
            if route.hosts.is_empty() {
                self.error(
                    Code::MissingHosts,
                    path("hosts"),
                    "an SNI route needs at least one host",
                );
            }
            let mut hosts = Vec::with_capacity(route.hosts.len());
            for (h, host) in route.hosts.iter().enumerate() {
                match parse_host(host) {
                    Some(m) => {
                        let key = (host.to_ascii_lowercase(), route.alpn.clone());
                        if let Some(first) = seen.insert(key, r) {
                            self.error(
                                Code::AmbiguousSniRoute,
                                format!("listeners[{i}].sni_routes[{r}].hosts[{h}]"),
                                format!("'{host}' is already routed by sni_routes[{first}] with the same alpn"),
                            );
                        }
                        hosts.push(m);
                    }
                    None => self.error(
                        Code::InvalidHost,
                        format!("listeners[{i}].sni_routes[{r}].hosts[{h}]"),
                        format!(
                            "'{host}' is not a host name or a leading wildcard like *.example.com"
                        ),
                    ),
                }
            }
            routes.push(SniRoute {
                hosts,
                alpn: route.alpn.clone(),
                upstream: route.upstream.clone(),
            });
        }
        if let Some(name) = &l.default_upstream {
            known(self, at("default_upstream"), name);
        }
        let client_hello_timeout = match &l.client_hello_timeout {
            Some(text) => self
                .duration(at("client_hello_timeout"), text)
                .unwrap_or(DEFAULT_CLIENT_HELLO_TIMEOUT),
            None => DEFAULT_CLIENT_HELLO_TIMEOUT,
        };
        L4Spec {
            sni: Some(SniSpec {
                routes,
                default_upstream: l.default_upstream.clone(),
                client_hello_timeout,
            }),
            idle_timeout,
            max_sessions: 0,
        }
    }

    /// An upstream a `tcp` or `udp` listener names gets the client's bytes
    /// as they are: its HTTP-only settings would be ignored there, and a
    /// `tls` one would send in cleartext what the operator meant to
    /// encrypt. Each is refused, once per upstream.
    fn l4_upstreams(&mut self, file: &FileConfig) {
        let mut named: BTreeMap<&str, &str> = BTreeMap::new();
        for l in file
            .listeners
            .iter()
            .filter(|l| l.protocol == "tcp" || l.protocol == "udp")
        {
            let names = l
                .upstream
                .iter()
                .chain(&l.default_upstream)
                .chain(l.sni_routes.iter().map(|r| &r.upstream));
            for name in names {
                named.entry(name.as_str()).or_insert(l.name.as_str());
            }
        }
        for (name, listener) in named {
            let Some(u) = file.upstreams.get(name) else {
                continue;
            };
            let at = |field: &str| format!("upstreams.{name}.{field}");
            let why = |what: &str| {
                format!("upstream '{name}' carries the raw bytes of listener '{listener}': {what}; give the listener an upstream of its own")
            };
            if u.protocol != "http1" {
                let what = format!(
                    "protocol = \"{}\" does not apply (the client's own protocol is relayed)",
                    u.protocol
                );
                self.error(Code::UnsupportedOption, at("protocol"), why(&what));
            }
            if u.tls.is_some() {
                self.error(Code::UnsupportedOption, at("tls"), why("TLS origination is not supported on a relayed connection, and the bytes would go in cleartext"));
            }
            if let Some(key) = u.hash_key.as_deref().filter(|k| *k != "client_ip") {
                let what = format!("hash_key = \"{key}\" has nothing to hash on a connection (only client_ip applies)");
                self.error(Code::UnsupportedOption, at("hash_key"), why(&what));
            }
            // Honoured for the routes that share the upstream, if any.
            let routed = file
                .routes
                .iter()
                .any(|r| r.upstream.as_deref() == Some(name));
            if u.idle_timeout.is_some() && !routed {
                self.error(
                    Code::UnsupportedOption,
                    at("idle_timeout"),
                    why("the listener's idle_timeout bounds a relayed connection"),
                );
            }
        }
    }

    fn upstreams(&mut self, upstreams: &BTreeMap<String, FileUpstream>) -> Vec<UpstreamSpec> {
        let mut out = Vec::new();
        for (name, u) in upstreams {
            let base = format!("upstreams.{}", quote_key(name));
            let at = |field: &str| format!("{base}.{field}");
            self.name("upstream", base.clone(), name);
            let policy = match u.policy.as_str() {
                "round_robin" => Some(Policy::RoundRobin),
                "weighted" => Some(Policy::Weighted),
                "least_requests" => Some(Policy::LeastRequests),
                "p2c" => Some(Policy::P2c),
                "hash" => Some(Policy::Hash),
                other => {
                    self.error(
                        Code::InvalidPolicy,
                        at("policy"),
                        format!("policy '{other}' is not round_robin, weighted, least_requests, p2c or hash"),
                    );
                    None
                }
            };
            let hash_key = match (&u.hash_key, policy) {
                (Some(key), Some(Policy::Hash)) => self.hash_key(&at("hash_key"), key),
                (None, Some(Policy::Hash)) => {
                    self.error(
                        Code::MissingKey,
                        at("hash_key"),
                        "policy = \"hash\" needs hash_key = \"header:NAME\", \"cookie:NAME\", \"client_ip\" or \"path\"",
                    );
                    None
                }
                (Some(_), _) => {
                    self.error(
                        Code::UnexpectedOption,
                        at("hash_key"),
                        "hash_key applies to policy = \"hash\" only",
                    );
                    None
                }
                (None, _) => None,
            };
            if let Some(factor) = u.hash_balance_factor {
                if policy.is_some() && policy != Some(Policy::Hash) {
                    self.error(
                        Code::UnexpectedOption,
                        at("hash_balance_factor"),
                        "hash_balance_factor applies to policy = \"hash\" only",
                    );
                } else if !(101..=1000).contains(&factor) {
                    self.error(
                        Code::InvalidValue,
                        at("hash_balance_factor"),
                        format!("hash_balance_factor = {factor} must be a percentage from 101 to 1000 (150: at most 1.5 times the average load)"),
                    );
                }
            }
            let protocol = match u.protocol.as_str() {
                "http1" => Some(UpstreamProtocol::Http1),
                "h2c" => Some(UpstreamProtocol::H2c),
                "https" => Some(UpstreamProtocol::Https),
                "h2" => Some(UpstreamProtocol::H2),
                other => {
                    self.error(
                        Code::InvalidProtocol,
                        at("protocol"),
                        format!("upstream protocol '{other}' is not http1, h2c, https or h2"),
                    );
                    None
                }
            };
            let connect_timeout = match &u.connect_timeout {
                Some(t) => self.duration(at("connect_timeout"), t),
                None => Some(DEFAULT_CONNECT_TIMEOUT),
            };
            let idle_timeout = match &u.idle_timeout {
                Some(t) => self.duration(at("idle_timeout"), t),
                None => Some(DEFAULT_UPSTREAM_IDLE_TIMEOUT),
            };
            let health = u
                .health
                .as_ref()
                .and_then(|h| self.health(&at("health"), h));
            let outlier = self.outlier(&at("outlier"), u.outlier.as_ref());
            let slow_start = u
                .slow_start
                .as_ref()
                .and_then(|t| self.duration(at("slow_start"), t));
            if slow_start.is_some_and(|d| d > Duration::from_secs(3600)) {
                self.error(
                    Code::InvalidDuration,
                    at("slow_start"),
                    "slow_start must be at most 1h",
                );
            }
            if u.backends.is_empty() {
                self.error(
                    Code::EmptyBackends,
                    at("backends"),
                    format!("upstream '{name}' has no backends"),
                );
            }
            let mut seen = HashSet::new();
            let mut backends = Vec::new();
            for (b, backend) in u.backends.iter().enumerate() {
                let bat = |field: &str| format!("{base}.backends[{b}].{field}");
                if !is_host_port(&backend.addr) {
                    self.error(
                        Code::InvalidAddress,
                        bat("addr"),
                        format!("backend '{}' is not host:port", backend.addr),
                    );
                }
                if !seen.insert(backend.addr.as_str()) {
                    self.error(
                        Code::DuplicateBackend,
                        bat("addr"),
                        format!("upstream '{name}' lists backend {} twice", backend.addr),
                    );
                }
                let weight = backend.weight.unwrap_or(1);
                if !(1..=1000).contains(&weight) {
                    self.error(
                        Code::InvalidWeight,
                        bat("weight"),
                        format!("weight {weight} must be between 1 and 1000"),
                    );
                }
                if let Some(policy) = policy.filter(|p| *p != Policy::Weighted && weight != 1) {
                    self.error(
                        Code::IgnoredWeight,
                        bat("weight"),
                        format!("upstream '{name}' uses {}, which ignores weights; set policy = \"weighted\"", policy.as_str()),
                    );
                }
                backends.push(BackendSpec {
                    addr: backend.addr.clone(),
                    weight: weight.clamp(1, 1000),
                });
            }
            let tls = match (protocol, &u.tls) {
                (Some(p), tls) if p.is_tls() => self.upstream_tls(&base, tls.as_ref()),
                (_, Some(_)) => {
                    self.error(
                        Code::UnexpectedTls,
                        at("tls"),
                        format!(
                            "upstream '{name}' has a tls section but protocol \"{}\" is not https or h2",
                            u.protocol
                        ),
                    );
                    None
                }
                _ => None,
            };
            let proxy_protocol = match u.proxy_protocol.as_deref() {
                None => None,
                Some("v1") => Some(ProxyProtocol::V1),
                Some("v2") => Some(ProxyProtocol::V2),
                Some(other) => {
                    self.error(
                        Code::InvalidValue,
                        at("proxy_protocol"),
                        format!("proxy_protocol '{other}' is not v1 or v2"),
                    );
                    None
                }
            };
            if proxy_protocol.is_some() && u.protocol != "http1" {
                // Refused, not ignored: the connections of TLS and HTTP/2
                // backends are pooled by hyper's client across clients,
                // and a PROXY header names one.
                self.error(
                    Code::UnsupportedOption,
                    at("proxy_protocol"),
                    format!(
                        "upstream '{name}' is {}: proxy_protocol is sent on http1 connections (and tcp listeners') only in this version",
                        u.protocol
                    ),
                );
            }
            if let (Some(policy), Some(protocol), Some(connect_timeout), Some(idle_timeout)) =
                (policy, protocol, connect_timeout, idle_timeout)
            {
                out.push(UpstreamSpec {
                    name: name.clone(),
                    policy,
                    protocol,
                    connect_timeout,
                    idle_timeout,
                    backends,
                    tls,
                    health,
                    outlier,
                    slow_start,
                    hash_key,
                    hash_balance_factor: u.hash_balance_factor.filter(|f| (101..=1000).contains(f)),
                    proxy_protocol,
                });
            }
        }
        out
    }

    fn hash_key(&mut self, path: &str, key: &str) -> Option<HashKey> {
        let parsed = parse_hash_key(key);
        if parsed.is_none() {
            self.error(
                Code::InvalidValue,
                path.to_owned(),
                format!("hash_key '{key}' is not header:NAME, cookie:NAME, client_ip or path"),
            );
        }
        parsed
    }

    /// `upstreams.NAME.health`; `None` after reporting what is wrong.
    fn health(&mut self, base: &str, h: &crate::config::FileHealth) -> Option<HealthSpec> {
        let at = |field: &str| format!("{base}.{field}");
        let before = self.diagnostics.len();
        let probe = match (&h.path, h.tcp) {
            (Some(_), Some(true)) => {
                self.error(
                    Code::ConflictingOptions,
                    base.to_owned(),
                    "a health check is either `path` (HTTP) or `tcp = true`, not both",
                );
                None
            }
            (None, Some(true)) => {
                for (field, set) in [
                    ("host", h.host.is_some()),
                    ("expect_status", h.expect_status.is_some()),
                ] {
                    if set {
                        self.error(
                            Code::ConflictingOptions,
                            at(field),
                            format!("`{field}` belongs to HTTP checks; this one is `tcp = true`"),
                        );
                    }
                }
                Some(HealthProbe::Tcp)
            }
            (Some(path), _) => {
                if !path.starts_with('/')
                    || http::uri::PathAndQuery::try_from(path.as_str()).is_err()
                {
                    self.error(
                        Code::InvalidPath,
                        at("path"),
                        format!("health path '{path}' must start with '/' and be a valid request target"),
                    );
                }
                if let Some(host) = &h.host {
                    if host.parse::<http::uri::Authority>().is_err() {
                        self.error(
                            Code::InvalidHost,
                            at("host"),
                            format!("'{host}' is not a valid Host header value"),
                        );
                    }
                }
                let expect_status = h.expect_status.clone().unwrap_or_default();
                for (i, status) in expect_status.iter().enumerate() {
                    if !(100..=599).contains(status) {
                        self.error(
                            Code::InvalidStatus,
                            format!("{base}.expect_status[{i}]"),
                            format!("status {status} is not between 100 and 599"),
                        );
                    }
                }
                Some(HealthProbe::Http {
                    path: path.clone(),
                    host: h.host.clone(),
                    expect_status,
                })
            }
            (None, _) => {
                self.error(
                    Code::MissingKey,
                    base.to_owned(),
                    "a health check needs `path = \"/healthz\"` (HTTP) or `tcp = true`",
                );
                None
            }
        };
        let interval = match &h.interval {
            Some(t) => self.duration(at("interval"), t),
            None => Some(DEFAULT_HEALTH_INTERVAL),
        };
        let timeout = match &h.timeout {
            Some(t) => self.duration(at("timeout"), t),
            None => Some(DEFAULT_HEALTH_TIMEOUT.min(interval.unwrap_or(DEFAULT_HEALTH_TIMEOUT))),
        };
        if let Some(interval) = interval.filter(|i| *i < Duration::from_millis(100)) {
            self.error(
                Code::InvalidDuration,
                at("interval"),
                format!("interval {interval:?} is below 100ms"),
            );
        }
        if let (Some(interval), Some(timeout)) = (interval, timeout) {
            if timeout > interval {
                self.error(
                    Code::InvalidDuration,
                    at("timeout"),
                    format!("timeout {timeout:?} is longer than the interval {interval:?}"),
                );
            }
        }
        let mut count = |field: &str, value: Option<u32>, default: u32| {
            let value = value.unwrap_or(default);
            if !(1..=100).contains(&value) {
                self.error(
                    Code::InvalidValue,
                    at(field),
                    format!("{field} = {value} must be between 1 and 100"),
                );
            }
            value
        };
        let unhealthy_after = count(
            "unhealthy_after",
            h.unhealthy_after,
            DEFAULT_UNHEALTHY_AFTER,
        );
        let healthy_after = count("healthy_after", h.healthy_after, DEFAULT_HEALTHY_AFTER);
        if self.diagnostics.len() != before {
            return None;
        }
        Some(HealthSpec {
            probe: probe?,
            interval: interval?,
            timeout: timeout?,
            unhealthy_after,
            healthy_after,
        })
    }

    /// `upstreams.NAME.outlier` over the defaults of DESIGN §12.
    fn outlier(&mut self, base: &str, o: Option<&crate::config::FileOutlier>) -> OutlierSpec {
        let defaults = OutlierSpec::default();
        let Some(o) = o else {
            return defaults;
        };
        let at = |field: &str| format!("{base}.{field}");
        let consecutive_failures = o
            .consecutive_failures
            .unwrap_or(defaults.consecutive_failures);
        if !(1..=1000).contains(&consecutive_failures) {
            self.error(
                Code::InvalidValue,
                at("consecutive_failures"),
                format!("consecutive_failures = {consecutive_failures} must be between 1 and 1000"),
            );
        }
        let base_ejection = match &o.base_ejection {
            Some(t) => self.duration(at("base_ejection"), t),
            None => Some(defaults.base_ejection),
        };
        let max_ejection = match &o.max_ejection {
            Some(t) => self.duration(at("max_ejection"), t),
            None => Some(defaults.max_ejection.max(base_ejection.unwrap_or_default())),
        };
        if let (Some(base_ejection), Some(max_ejection)) = (base_ejection, max_ejection) {
            if max_ejection < base_ejection {
                self.error(
                    Code::InvalidDuration,
                    at("max_ejection"),
                    format!("max_ejection {max_ejection:?} is shorter than base_ejection {base_ejection:?}"),
                );
            }
        }
        let max_ejected_percent = o
            .max_ejected_percent
            .unwrap_or(defaults.max_ejected_percent);
        if max_ejected_percent > 100 {
            self.error(
                Code::InvalidValue,
                at("max_ejected_percent"),
                format!("max_ejected_percent = {max_ejected_percent} must be between 0 and 100"),
            );
        }
        OutlierSpec {
            consecutive_failures,
            base_ejection: base_ejection.unwrap_or(defaults.base_ejection),
            max_ejection: max_ejection.unwrap_or(defaults.max_ejection),
            max_ejected_percent: max_ejected_percent.min(100),
        }
    }

    /// Reads a listener's certificates (for `config_version`) and loads
    /// them from those same bytes: every chain parses, every key matches
    /// its leaf, the CA bundle loads. The material built here is what the
    /// generation serves, so it is exactly what was hashed.
    fn listener_tls(
        &mut self,
        i: usize,
        tls: &crate::config::FileListenerTls,
    ) -> Option<(
        crate::tls::ListenerTlsSpec,
        Arc<crate::tls::ListenerMaterial>,
    )> {
        let client_auth_required = match tls.client_auth.as_deref() {
            None | Some("required") => true,
            Some("optional") => false,
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    format!("listeners[{i}].tls.client_auth"),
                    format!("client_auth '{other}' is not required or optional"),
                );
                true
            }
        };
        if tls.client_auth.is_some() && tls.client_ca.is_none() {
            self.error(
                Code::MissingClientCa,
                format!("listeners[{i}].tls.client_auth"),
                "client_auth needs tls.client_ca, the bundle client certificates are checked against",
            );
        }
        let mut ok = true;
        let mut paths = Vec::new();
        let mut loaded = Vec::new();
        for (c, pair) in tls.certificates.iter().enumerate() {
            let cert_at = format!("listeners[{i}].tls.certificates[{c}].cert");
            let cert_pem = self.read_file(cert_at.clone(), &pair.cert);
            let key_pem = self.read_file(
                format!("listeners[{i}].tls.certificates[{c}].key"),
                &pair.key,
            );
            let (cert, key) = (
                self.base_dir.join(&pair.cert),
                self.base_dir.join(&pair.key),
            );
            match (cert_pem, key_pem) {
                (Some(cert_pem), Some(key_pem)) => {
                    match crate::tls::parse_cert(&cert, &cert_pem, &key, &key_pem) {
                        Ok(certificate) => loaded.push(certificate),
                        Err(e) => {
                            self.error(Code::InvalidCertificate, cert_at, e.to_string());
                            ok = false;
                        }
                    }
                }
                _ => ok = false,
            }
            paths.push((cert, key));
        }
        let client_ca = tls.client_ca.as_ref().map(|ca| self.base_dir.join(ca));
        let mut client = None;
        if let (Some(name), Some(path)) = (&tls.client_ca, &client_ca) {
            let at = format!("listeners[{i}].tls.client_ca");
            match self.read_file(at.clone(), name) {
                Some(pem) => {
                    match crate::tls::parse_client_verifier(path, &pem, client_auth_required) {
                        Ok(verifier) => client = Some((verifier, client_auth_required)),
                        Err(e) => {
                            self.error(Code::InvalidCertificate, at, e.to_string());
                            ok = false;
                        }
                    }
                }
                None => ok = false,
            }
        }
        ok.then(|| {
            (
                crate::tls::ListenerTlsSpec {
                    certificates: paths,
                    client_ca,
                    client_auth_required,
                },
                Arc::new(crate::tls::ListenerMaterial::assemble(loaded, client)),
            )
        })
    }

    /// Checks an upstream's TLS settings; without a `tls` section, https
    /// and h2 upstreams verify against the WebPKI roots by host name.
    fn upstream_tls(
        &mut self,
        base: &str,
        tls: Option<&crate::config::FileUpstreamTls>,
    ) -> Option<crate::tls::UpstreamTlsSpec> {
        let Some(tls) = tls else {
            return Some(crate::tls::UpstreamTlsSpec {
                ca: None,
                server_name: None,
                client_cert: None,
                files_fingerprint: String::new(),
            });
        };
        let mut ok = true;
        let first_file = self.referenced.len();
        let ca = tls.ca.as_ref().map(|ca| self.base_dir.join(ca));
        if let (Some(name), Some(path)) = (&tls.ca, &ca) {
            if self.read_file(format!("{base}.tls.ca"), name).is_some() {
                if let Err(e) = crate::tls::load_roots(path) {
                    self.error(
                        Code::InvalidCertificate,
                        format!("{base}.tls.ca"),
                        e.to_string(),
                    );
                    ok = false;
                }
            } else {
                ok = false;
            }
        }
        if let Some(name) = &tls.server_name {
            if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
                self.error(
                    Code::InvalidHost,
                    format!("{base}.tls.server_name"),
                    format!("'{name}' is not a server name"),
                );
                ok = false;
            }
        }
        let client_cert = match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                let have_cert = self.read_file(format!("{base}.tls.cert"), cert).is_some();
                let have_key = self.read_file(format!("{base}.tls.key"), key).is_some();
                let (cert_path, key_path) = (self.base_dir.join(cert), self.base_dir.join(key));
                if have_cert && have_key {
                    if let Err(e) = crate::tls::load_cert(&cert_path, &key_path) {
                        self.error(
                            Code::InvalidCertificate,
                            format!("{base}.tls.cert"),
                            e.to_string(),
                        );
                        ok = false;
                    }
                } else {
                    ok = false;
                }
                Some((cert_path, key_path))
            }
            (None, None) => None,
            _ => {
                self.error(
                    Code::InvalidValue,
                    format!("{base}.tls"),
                    "tls.cert and tls.key go together",
                );
                ok = false;
                None
            }
        };
        let files: Vec<u8> = self
            .referenced
            .get(first_file..)
            .unwrap_or_default()
            .iter()
            .flat_map(|(_, contents)| contents.iter().copied())
            .collect();
        ok.then_some(crate::tls::UpstreamTlsSpec {
            ca,
            server_name: tls.server_name.clone(),
            client_cert,
            files_fingerprint: crate::tls::fingerprint(&files),
        })
    }

    fn routes(&mut self, file: &FileConfig) -> Vec<Arc<RouteSpec>> {
        let mut out = Vec::with_capacity(file.routes.len());
        let mut names = HashSet::new();
        for (i, r) in file.routes.iter().enumerate() {
            let at = |field: &str| format!("routes[{i}].{field}");
            self.name("route", at("name"), &r.name);
            if !names.insert(r.name.as_str()) {
                self.error(
                    Code::DuplicateName,
                    at("name"),
                    format!("route '{}' is defined twice", r.name),
                );
            }
            if let Some(route) = self.route(file, i, r) {
                out.push(Arc::new(route));
            }
        }
        out
    }

    fn route(&mut self, file: &FileConfig, i: usize, r: &FileRoute) -> Option<RouteSpec> {
        let at = |field: &str| format!("routes[{i}].{field}");
        let mut ok = true;
        if r.listeners.is_empty() {
            self.error(
                Code::MissingListeners,
                at("listeners"),
                format!("route '{}' names no listeners", r.name),
            );
            ok = false;
        }
        for (l, listener) in r.listeners.iter().enumerate() {
            match file.listeners.iter().find(|fl| &fl.name == listener) {
                None => {
                    self.error(
                        Code::UnknownListener,
                        format!("routes[{i}].listeners[{l}]"),
                        format!(
                            "route '{}' names listener '{listener}', which is not defined",
                            r.name
                        ),
                    );
                    ok = false;
                }
                Some(fl) if fl.protocol == "tcp" || fl.protocol == "udp" => {
                    self.error(
                        Code::TcpListenerRoute,
                        format!("routes[{i}].listeners[{l}]"),
                        format!("route '{}' names {} listener '{listener}'; {} listeners forward to their upstream and have no routes", r.name, fl.protocol, fl.protocol),
                    );
                    ok = false;
                }
                Some(_) => {}
            }
        }
        let mut hosts = Vec::new();
        for (h, host) in r.hosts.iter().enumerate() {
            match parse_host(host) {
                Some(m) => hosts.push(m),
                None => {
                    self.error(
                        Code::InvalidHost,
                        format!("routes[{i}].hosts[{h}]"),
                        format!(
                            "'{host}' is not a host name or a leading wildcard like *.example.com"
                        ),
                    );
                    ok = false;
                }
            }
        }
        let given: Vec<_> = [
            r.path_exact.as_ref().map(|p| ("path_exact", p)),
            r.path_prefix.as_ref().map(|p| ("path_prefix", p)),
            r.path_regex.as_ref().map(|p| ("path_regex", p)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if given.len() > 1 {
            self.error(
                Code::ConflictingPath,
                at(given.get(1).map_or("path_prefix", |g| g.0)),
                format!(
                    "route '{}' sets more than one of path_exact, path_prefix, path_regex",
                    r.name
                ),
            );
            ok = false;
        }
        let path = match given.first() {
            None => PathMatch::Any,
            Some(("path_regex", re)) => match PathRegex::new(re) {
                Ok(re) => PathMatch::Regex(re),
                Err(e) => {
                    self.error(
                        Code::InvalidRegex,
                        at("path_regex"),
                        format!("path_regex '{re}' does not compile: {e}"),
                    );
                    ok = false;
                    PathMatch::Any
                }
            },
            Some((field, p)) => {
                if !p.starts_with('/') {
                    self.error(
                        Code::InvalidPath,
                        at(field),
                        format!("{field} '{p}' must start with '/'"),
                    );
                    ok = false;
                }
                if *field == "path_exact" {
                    PathMatch::Exact((*p).clone())
                } else {
                    PathMatch::Prefix((*p).clone())
                }
            }
        };
        let mut methods = Vec::new();
        for (m, method) in r.methods.iter().enumerate() {
            match self.method(format!("routes[{i}].methods[{m}]"), method) {
                Some(parsed) => methods.push(parsed),
                None => ok = false,
            }
        }
        methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        methods.dedup();
        let headers = self.header_pairs(&format!("routes[{i}].headers"), &r.headers);
        let action = match (&r.upstream, &r.respond) {
            (Some(_), Some(_)) => {
                self.error(
                    Code::ConflictingAction,
                    at("respond"),
                    format!("route '{}' sets both upstream and respond", r.name),
                );
                None
            }
            (None, None) => {
                self.error(
                    Code::MissingAction,
                    at("name"),
                    format!("route '{}' needs an upstream or a respond action", r.name),
                );
                None
            }
            (Some(u), None) => {
                if file.upstreams.contains_key(u) {
                    Some(RouteAction::Proxy {
                        upstream: u.clone(),
                    })
                } else {
                    self.error(
                        Code::UnknownUpstream,
                        at("upstream"),
                        format!(
                            "route '{}' names upstream '{u}', which is not defined",
                            r.name
                        ),
                    );
                    None
                }
            }
            (None, Some(respond)) => {
                let status = StatusCode::from_u16(respond.status)
                    .ok()
                    .filter(|s| (200..=599).contains(&s.as_u16()));
                if status.is_none() {
                    self.error(
                        Code::InvalidStatus,
                        format!("routes[{i}].respond.status"),
                        format!(
                            "respond status {} must be between 200 and 599",
                            respond.status
                        ),
                    );
                }
                let headers =
                    self.header_pairs(&format!("routes[{i}].respond.headers"), &respond.headers);
                status.map(|status| {
                    RouteAction::Respond(DirectResponse {
                        status,
                        body: bytes::Bytes::from(respond.body.clone()),
                        headers,
                    })
                })
            }
        };
        let timeout = match &r.timeout {
            Some(t) => self.duration(at("timeout"), t),
            None => Some(DEFAULT_ROUTE_TIMEOUT),
        };
        if r.max_inflight == Some(0) {
            self.error(
                Code::InvalidValue,
                at("max_inflight"),
                "max_inflight must be at least 1",
            );
        }
        let quota = r.quota.as_ref().and_then(|q| self.quota(&at("quota"), q));
        if r.quota.is_some() && quota.is_none() {
            ok = false;
        }
        let retry = r
            .retry
            .as_ref()
            .and_then(|retry| self.retry(&at("retry"), retry));
        let hedge = r
            .hedge
            .as_ref()
            .and_then(|hedge| self.hedge(&at("hedge"), hedge));
        let proxies = matches!(action, Some(RouteAction::Proxy { .. }));
        // (A quota applies to `respond` routes too: it limits requests,
        // not upstream traffic.)
        for (field, set) in [("retry", r.retry.is_some()), ("hedge", r.hedge.is_some())] {
            if set && !proxies && action.is_some() {
                self.error(
                    Code::UnexpectedOption,
                    at(field),
                    format!("`{field}` applies to routes with an upstream, not to `respond`"),
                );
            }
        }
        if (r.retry.is_some() && retry.is_none()) || (r.hedge.is_some() && hedge.is_none()) {
            ok = false;
        }
        if !ok {
            return None;
        }
        Some(RouteSpec {
            name: r.name.clone(),
            listeners: r.listeners.clone(),
            hosts,
            path,
            methods,
            headers,
            action: action?,
            timeout: timeout?,
            max_inflight: r.max_inflight.filter(|n| *n > 0),
            retry,
            hedge,
            quota,
        })
    }

    /// `routes[i].quota`.
    fn quota(&mut self, base: &str, q: &crate::config::FileQuota) -> Option<QuotaSpec> {
        let at = |field: &str| format!("{base}.{field}");
        let before = self.diagnostics.len();
        if !(1..=1_000_000).contains(&q.rate) {
            self.error(
                Code::InvalidValue,
                at("rate"),
                format!("rate = {} must be between 1 and 1000000", q.rate),
            );
        }
        let per = match &q.per {
            Some(t) => self.duration(at("per"), t),
            None => Some(Duration::from_secs(1)),
        };
        if per.is_some_and(|p| p > Duration::from_secs(86_400)) {
            self.error(Code::InvalidDuration, at("per"), "per must be at most 24h");
        }
        let burst = q.burst.unwrap_or(q.rate);
        if !(1..=10_000_000).contains(&burst) {
            self.error(
                Code::InvalidValue,
                at("burst"),
                format!("burst = {burst} must be between 1 and 10000000"),
            );
        }
        let key = match q.key.as_deref().unwrap_or("client_ip") {
            "client_ip" => Some(QuotaKey::ClientIp),
            "route" => Some(QuotaKey::Route),
            other => match other
                .strip_prefix("header:")
                .map(|n| HeaderName::from_bytes(n.as_bytes()))
            {
                Some(Ok(name)) => Some(QuotaKey::Header(name)),
                _ => {
                    self.error(
                        Code::InvalidValue,
                        at("key"),
                        format!("quota key '{other}' is not client_ip, header:NAME or route"),
                    );
                    None
                }
            },
        };
        let max_keys = q.max_keys.unwrap_or(DEFAULT_QUOTA_MAX_KEYS);
        if !(16..=10_000_000).contains(&max_keys) {
            self.error(
                Code::InvalidValue,
                at("max_keys"),
                format!("max_keys = {max_keys} must be between 16 and 10000000"),
            );
        }
        if self.diagnostics.len() != before {
            return None;
        }
        Some(QuotaSpec {
            rate: q.rate,
            per: per?,
            burst,
            key: key?,
            max_keys,
        })
    }

    /// `routes[i].retry`; `None` after reporting what is wrong.
    fn retry(&mut self, base: &str, r: &crate::config::FileRetry) -> Option<RetrySpec> {
        let at = |field: &str| format!("{base}.{field}");
        let before = self.diagnostics.len();
        let attempts = r.attempts.unwrap_or(DEFAULT_RETRY_ATTEMPTS);
        if !(2..=10).contains(&attempts) {
            self.error(
                Code::InvalidValue,
                at("attempts"),
                format!(
                    "attempts = {attempts} must be between 2 and 10 (the first attempt included)"
                ),
            );
        }
        let mut on = RetryOn::default();
        let conditions = r.on.clone().unwrap_or_else(|| {
            vec![
                "connect_failure".into(),
                "reset".into(),
                "gateway_error".into(),
            ]
        });
        for (k, condition) in conditions.iter().enumerate() {
            match condition.as_str() {
                "connect_failure" => on.connect_failure = true,
                "refused" => on.refused = true,
                "reset" => on.reset = true,
                "timeout" => on.timeout = true,
                "gateway_error" => on.gateway_error = true,
                "5xx" => on.server_error = true,
                other => match other.parse::<u16>() {
                    Ok(status) if (400..=599).contains(&status) => on.statuses.push(status),
                    _ => self.error(
                        Code::InvalidValue,
                        format!("{base}.on[{k}]"),
                        format!("'{other}' is not connect_failure, refused, reset, timeout, gateway_error, 5xx or a status from 400 to 599"),
                    ),
                },
            }
        }
        let per_try_timeout = r
            .per_try_timeout
            .as_ref()
            .and_then(|t| self.duration(at("per_try_timeout"), t));
        let backoff = r.backoff.as_ref();
        let backoff_base = match backoff.and_then(|b| b.base.as_ref()) {
            Some(t) => self.duration(format!("{base}.backoff.base"), t),
            None => Some(DEFAULT_BACKOFF_BASE),
        };
        let backoff_max = match backoff.and_then(|b| b.max.as_ref()) {
            Some(t) => self.duration(format!("{base}.backoff.max"), t),
            None => Some(DEFAULT_BACKOFF_MAX.max(backoff_base.unwrap_or_default())),
        };
        if let (Some(b), Some(m)) = (backoff_base, backoff_max) {
            if m < b {
                self.error(
                    Code::InvalidDuration,
                    format!("{base}.backoff.max"),
                    format!("backoff.max {m:?} is shorter than backoff.base {b:?}"),
                );
            }
        }
        let budget = match &r.budget {
            None => BudgetSpec::default(),
            Some(crate::config::FileBudget::Ratio(ratio)) => BudgetSpec {
                ratio: *ratio,
                ..BudgetSpec::default()
            },
            Some(crate::config::FileBudget::Table(t)) => BudgetSpec {
                ratio: t.ratio.unwrap_or(BudgetSpec::default().ratio),
                min_per_second: t
                    .min_per_second
                    .unwrap_or(BudgetSpec::default().min_per_second),
            },
        };
        if !(0.0..=1.0).contains(&budget.ratio) {
            self.error(
                Code::InvalidValue,
                at("budget"),
                format!("budget ratio {} must be between 0 and 1", budget.ratio),
            );
        }
        if budget.min_per_second > 10_000 {
            self.error(
                Code::InvalidValue,
                at("budget"),
                format!(
                    "budget min_per_second {} must be at most 10000",
                    budget.min_per_second
                ),
            );
        }
        let methods = match &r.methods {
            None => [
                Method::GET,
                Method::HEAD,
                Method::OPTIONS,
                Method::TRACE,
                Method::PUT,
                Method::DELETE,
            ]
            .to_vec(),
            Some(methods) => {
                let mut out = Vec::new();
                for (k, m) in methods.iter().enumerate() {
                    out.extend(self.method(format!("{base}.methods[{k}]"), m));
                }
                out
            }
        };
        let max_replay_body = r.max_replay_body.unwrap_or(DEFAULT_MAX_REPLAY_BODY);
        if max_replay_body > 16 * 1024 * 1024 {
            self.error(
                Code::InvalidValue,
                at("max_replay_body"),
                format!("max_replay_body = {max_replay_body} must be at most 16 MiB (16777216)"),
            );
        }
        if self.diagnostics.len() != before {
            return None;
        }
        Some(RetrySpec {
            attempts,
            on,
            per_try_timeout,
            backoff_base: backoff_base?,
            backoff_max: backoff_max?,
            budget,
            methods,
            max_replay_body,
        })
    }

    /// `routes[i].hedge`.
    fn hedge(&mut self, base: &str, h: &crate::config::FileHedge) -> Option<HedgeSpec> {
        let delay = self.duration(format!("{base}.delay"), &h.delay);
        let max_extra = h.max_extra.unwrap_or(1);
        if !(1..=3).contains(&max_extra) {
            self.error(
                Code::InvalidValue,
                format!("{base}.max_extra"),
                format!("max_extra = {max_extra} must be between 1 and 3"),
            );
            return None;
        }
        Some(HedgeSpec {
            delay: delay?,
            max_extra,
        })
    }

    fn header_pairs(
        &mut self,
        base: &str,
        headers: &BTreeMap<String, String>,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::new();
        for (name, value) in headers {
            let path = format!("{base}.{}", quote_key(name));
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                (Ok(n), Ok(v)) => out.push((n, v)),
                (Err(_), _) => self.error(
                    Code::InvalidHeader,
                    path,
                    format!("'{name}' is not a valid header name"),
                ),
                (_, Err(_)) => self.error(
                    Code::InvalidHeader,
                    path,
                    format!("the value of header '{name}' is not a valid header value"),
                ),
            }
        }
        out
    }

    /// Two routes on one listener that match exactly the same requests can
    /// never both be reached: the later one is dead configuration, and which
    /// one wins would depend on declaration order alone.
    ///
    /// Routes are grouped by what they match; inside a group each method
    /// remembers the first route that takes it, so a route is checked in
    /// time proportional to its methods, not to the routes before it, and
    /// is reported once, against the first route it shadows.
    fn ambiguous_routes(&mut self, routes: &[Arc<RouteSpec>]) {
        let mut seen: HashMap<MatchKey, MethodOwners> = HashMap::new();
        for (index, route) in routes.iter().enumerate() {
            let headers = route
                .headers
                .iter()
                .map(|(n, v)| format!("{n}={}", String::from_utf8_lossy(v.as_bytes())))
                .collect::<Vec<_>>()
                .join("&");
            let hosts: Vec<Option<HostMatch>> = if route.hosts.is_empty() {
                vec![None]
            } else {
                route.hosts.iter().cloned().map(Some).collect()
            };
            for listener in &route.listeners {
                for host in &hosts {
                    let key = (
                        listener.clone(),
                        host.clone(),
                        route.path.key(),
                        headers.clone(),
                    );
                    let owners = seen.entry(key).or_default();
                    if let Some(other) = owners.first_overlapping(&route.methods) {
                        let other = other.to_owned();
                        self.diagnostics.push(Diagnostic::new(
                            Code::AmbiguousRoute,
                            format!("routes[{index}].name"),
                            format!(
                                "routes '{other}' and '{}' match the same host, path, methods and headers on listener '{listener}'",
                                route.name
                            ),
                        ));
                    }
                    owners.take(index, &route.name, &route.methods);
                }
            }
        }
    }
}

/// Within one group of routes that match the same requests: the first
/// route (index, name) to take each method, and the first that takes
/// every method.
#[derive(Default)]
struct MethodOwners {
    any: Option<(usize, String)>,
    by_method: HashMap<Method, (usize, String)>,
}

impl MethodOwners {
    /// The earliest route whose methods meet `methods` (empty: all).
    fn first_overlapping(&self, methods: &[Method]) -> Option<&str> {
        let by_method: Box<dyn Iterator<Item = &(usize, String)>> = if methods.is_empty() {
            Box::new(self.by_method.values())
        } else {
            Box::new(methods.iter().filter_map(|m| self.by_method.get(m)))
        };
        by_method
            .chain(self.any.as_ref())
            .min_by_key(|(index, _)| *index)
            .map(|(_, name)| name.as_str())
    }

    fn take(&mut self, index: usize, name: &str, methods: &[Method]) {
        if methods.is_empty() {
            self.any.get_or_insert_with(|| (index, name.to_owned()));
        }
        for method in methods {
            self.by_method
                .entry(method.clone())
                .or_insert_with(|| (index, name.to_owned()));
        }
    }
}

/// Listener, host, path matcher and header matchers of a route: two
/// routes with equal keys and overlapping methods are ambiguous.
type MatchKey = (String, Option<HostMatch>, String, String);

fn parse_host(host: &str) -> Option<HostMatch> {
    let lower = host.to_ascii_lowercase();
    let (wildcard, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, lower.as_str()),
    };
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !valid {
        return None;
    }
    Some(if wildcard {
        HostMatch::Suffix(format!(".{name}"))
    } else {
        HostMatch::Exact(name.to_owned())
    })
}

fn is_host_port(addr: &str) -> bool {
    if addr.parse::<SocketAddr>().is_ok() {
        return true;
    }
    match addr.rsplit_once(':') {
        Some((host, port)) => {
            port.parse::<u16>().is_ok_and(|p| p != 0) && parse_host(host).is_some()
        }
        None => false,
    }
}

//! `[upstreams.NAME]`: policy, hashing, protocol, timeouts, backends, PROXY
//! protocol.

use super::*;

impl Validator<'_> {
    pub(super) fn upstreams(
        &mut self,
        upstreams: &BTreeMap<String, FileUpstream>,
    ) -> Vec<UpstreamSpec> {
        let mut out = Vec::new();
        for (name, u) in upstreams {
            let read_before = self.referenced.len();
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
                "h3" => Some(UpstreamProtocol::H3),
                "auto" => Some(UpstreamProtocol::Auto),
                other => {
                    self.error(
                        Code::InvalidProtocol,
                        at("protocol"),
                        format!(
                            "upstream protocol '{other}' is not http1, h2c, https, h2, h3 or auto"
                        ),
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
            if let (
                Some(HealthSpec {
                    probe: HealthProbe::Grpc { .. },
                    ..
                }),
                false,
            ) = (&health, matches!(u.protocol.as_str(), "h2c" | "h2"))
            {
                self.error(
                    Code::GrpcNeedsHttp2,
                    at("health.grpc"),
                    format!(
                        "a gRPC health check needs protocol \"h2c\" or \"h2\"; upstream '{name}' is \"{}\"",
                        u.protocol
                    ),
                );
            }
            if let (
                Some(HealthSpec {
                    probe: HealthProbe::Tcp,
                    ..
                }),
                "h3",
            ) = (&health, u.protocol.as_str())
            {
                // A TCP connect says nothing of a backend reached over UDP.
                self.error(
                    Code::UnsupportedOption,
                    at("health.tcp"),
                    format!(
                        "upstream '{name}' is \"h3\": a tcp check says nothing of QUIC; use an http check (`path`), which goes over HTTP/3"
                    ),
                );
            }
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
            let mut sources = Vec::new();
            for (b, backend) in u.backends.iter().enumerate() {
                let bat = |field: &str| format!("{base}.backends[{b}].{field}");
                let weight = backend.weight.unwrap_or(1);
                if !(1..=1000).contains(&weight) {
                    self.error(
                        Code::InvalidWeight,
                        bat("weight"),
                        format!("weight {weight} must be between 1 and 1000"),
                    );
                }
                let weighs = backend.addr.is_some() || backend.dns.is_some();
                if let Some(policy) =
                    policy.filter(|p| weighs && !p.honours_weights() && weight != 1)
                {
                    self.error(
                        Code::IgnoredWeight,
                        bat("weight"),
                        format!("upstream '{name}' uses {}, which ignores weights; set policy = \"weighted\", \"p2c\" or \"hash\"", policy.as_str()),
                    );
                }
                if !seen.insert(backend.key()) {
                    self.error(
                        Code::DuplicateBackend,
                        bat("addr"),
                        format!("upstream '{name}' lists backend {} twice", backend.key()),
                    );
                }
                match self.backend_entry(&bat, backend) {
                    Some(Entry::Fixed(addr)) => backends.push(BackendSpec {
                        addr,
                        weight: weight.clamp(1, 1000),
                    }),
                    Some(Entry::Source(source)) => sources.push(source),
                    None => {}
                }
            }
            let max_members = match u.max_members {
                Some(0) => {
                    self.error(
                        Code::InvalidValue,
                        at("max_members"),
                        "max_members must be at least 1",
                    );
                    DEFAULT_MAX_MEMBERS
                }
                Some(_) if sources.is_empty() => {
                    self.error(
                        Code::UnexpectedOption,
                        at("max_members"),
                        format!("max_members bounds members from dns, srv and endpoints_file entries; upstream '{name}' has none"),
                    );
                    DEFAULT_MAX_MEMBERS
                }
                Some(n) => n as usize,
                None => DEFAULT_MAX_MEMBERS,
            };
            let tls = match (protocol, &u.tls) {
                (Some(p), tls) if p.is_tls() => self.upstream_tls(&base, tls.as_ref()),
                (_, Some(_)) => {
                    self.error(
                        Code::UnexpectedTls,
                        at("tls"),
                        format!(
                            "upstream '{name}' has a tls section but protocol \"{}\" is not https, h2, h3 or auto",
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
                    sources,
                    max_members,
                    tls,
                    health,
                    outlier,
                    slow_start,
                    hash_key,
                    hash_balance_factor: u.hash_balance_factor.filter(|f| (101..=1000).contains(f)),
                    proxy_protocol,
                });
            }
            let files = self.files_since(read_before);
            self.upstream_files.push((name.clone(), files));
        }
        out
    }

    /// One `backends` entry: exactly one of `addr`, `dns`, `srv` and
    /// `endpoints_file`, with only the options that one takes.
    fn backend_entry(
        &mut self,
        at: &dyn Fn(&str) -> String,
        backend: &crate::config::FileBackend,
    ) -> Option<Entry> {
        let kinds: Vec<&str> = [
            ("addr", backend.addr.is_some()),
            ("dns", backend.dns.is_some()),
            ("srv", backend.srv.is_some()),
            ("endpoints_file", backend.endpoints_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(kind, set)| set.then_some(kind))
        .collect();
        if kinds.len() != 1 {
            let path = at(kinds.get(1).copied().unwrap_or("addr"));
            self.error(
                Code::InvalidBackend,
                path,
                match kinds.len() {
                    0 => "a backend needs one of addr, dns, srv or endpoints_file".to_owned(),
                    _ => format!(
                        "a backend is one of addr, dns, srv or endpoints_file; this one sets {}",
                        kinds.join(" and ")
                    ),
                },
            );
            return None;
        }
        let kind = kinds.first().copied().unwrap_or("addr");
        for (option, set, takes) in [
            (
                "weight",
                backend.weight.is_some(),
                ["addr", "dns"].as_slice(),
            ),
            ("refresh", backend.refresh.is_some(), &["dns", "srv"]),
            ("family", backend.family.is_some(), &["dns"]),
        ] {
            if set && !takes.contains(&kind) {
                let why = match option {
                    "weight" if kind == "srv" => "SRV records carry their own weights",
                    "weight" => "the file gives each member its weight",
                    "refresh" => "the file is watched and read again when it changes",
                    _ => "it picks A or AAAA records of a dns entry",
                };
                self.error(
                    Code::UnexpectedOption,
                    at(option),
                    format!("{option} does not apply to a {kind} backend: {why}"),
                );
            }
        }
        let refresh = match &backend.refresh {
            Some(text) => {
                let refresh = self.duration(at("refresh"), text)?;
                if refresh < Duration::from_secs(1) {
                    self.error(
                        Code::InvalidDuration,
                        at("refresh"),
                        format!("refresh = \"{text}\" is under the 1s floor"),
                    );
                    return None;
                }
                refresh
            }
            None => DEFAULT_REFRESH,
        };
        if let Some(addr) = &backend.addr {
            if !is_host_port(addr) {
                self.error(
                    Code::InvalidAddress,
                    at("addr"),
                    format!("backend '{addr}' is not host:port"),
                );
            }
            return Some(Entry::Fixed(addr.to_string()));
        }
        if let Some(dns) = &backend.dns {
            let family = match backend.family.as_deref() {
                None | Some("any") => Family::Any,
                Some("ipv4") => Family::Ipv4,
                Some("ipv6") => Family::Ipv6,
                Some(other) => {
                    self.error(
                        Code::InvalidValue,
                        at("family"),
                        format!("family '{other}' is not any, ipv4 or ipv6"),
                    );
                    return None;
                }
            };
            let parsed = dns
                .rsplit_once(':')
                .and_then(|(name, port)| Some((name, port.parse::<u16>().ok()?)))
                .filter(|(name, port)| is_dns_name(name) && *port != 0);
            let Some((name, port)) = parsed else {
                self.error(
                    Code::InvalidAddress,
                    at("dns"),
                    format!("dns = \"{dns}\" is not name:port (e.g. \"app.internal:8080\")"),
                );
                return None;
            };
            return Some(Entry::Source(SourceSpec::Dns {
                name: name.to_ascii_lowercase(),
                port,
                family,
                refresh,
                weight: backend.weight.unwrap_or(1).clamp(1, 1000),
            }));
        }
        if let Some(srv) = &backend.srv {
            if !is_dns_name(srv) || !srv.starts_with('_') {
                self.error(
                    Code::InvalidAddress,
                    at("srv"),
                    format!(
                        "srv = \"{srv}\" is not an SRV name (e.g. \"_http._tcp.app.internal\")"
                    ),
                );
                return None;
            }
            return Some(Entry::Source(SourceSpec::Srv {
                name: srv.to_ascii_lowercase(),
                refresh,
            }));
        }
        let file = backend.endpoints_file.as_deref()?;
        let (path, inside) = self.confined(file);
        if !inside {
            self.error(
                Code::FileOutsideRoots,
                at("endpoints_file"),
                format!("'{file}' is outside the configuration's folder and runtime.file_roots; referenced files must be inside them"),
            );
            return None;
        }
        Some(Entry::Source(SourceSpec::File {
            path: super::files::lexically_absolute(&path),
        }))
    }

    /// `[discovery]`: resolvers and their patience.
    pub(super) fn discovery(&mut self, file: &FileConfig) -> DiscoverySpec {
        let mut spec = DiscoverySpec::default();
        let Some(d) = &file.discovery else {
            return spec;
        };
        for (i, server) in d.nameservers.iter().enumerate() {
            let parsed = server
                .parse::<SocketAddr>()
                .ok()
                .or_else(|| Some(SocketAddr::new(server.parse().ok()?, 53)));
            match parsed {
                Some(addr) => spec.nameservers.push(addr),
                None => self.error(
                    Code::InvalidAddress,
                    format!("discovery.nameservers[{i}]"),
                    format!("nameserver '{server}' is not an IP address or IP:port"),
                ),
            }
        }
        if let Some(timeout) = d
            .timeout
            .as_ref()
            .and_then(|t| self.duration("discovery.timeout".into(), t))
        {
            spec.timeout = timeout;
        }
        match d.attempts {
            Some(n @ 1..=10) => spec.attempts = n,
            Some(n) => self.error(
                Code::InvalidValue,
                "discovery.attempts",
                format!("attempts = {n} must be from 1 to 10"),
            ),
            None => {}
        }
        spec
    }

    pub(super) fn hash_key(&mut self, path: &str, key: &str) -> Option<HashKey> {
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
}

/// A `backends` entry, checked.
enum Entry {
    Fixed(String),
    Source(SourceSpec),
}

/// A DNS name (a root dot allowed); `_` labels for SRV names.
fn is_dns_name(name: &str) -> bool {
    super::routes::is_host_name(name.strip_suffix('.').unwrap_or(name), true)
}

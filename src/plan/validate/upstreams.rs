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
            let files = self.files_since(read_before);
            self.upstream_files.push((name.clone(), files));
        }
        out
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

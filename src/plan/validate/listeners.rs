//! `[[listeners]]`: names, binds, protocols, limits and the edge rules
//! (DESIGN §13); HTTP options on a listener that carries no HTTP are
//! refused.

use super::*;

impl Validator<'_> {
    pub(super) fn listeners(&mut self, file: &FileConfig) -> Vec<ListenerSpec> {
        let mut out = Vec::new();
        let mut names = HashSet::new();
        // A udp and a tcp listener may share an address (DNS on 53 both
        // ways); two of the same kind may not.
        let mut binds: HashMap<(bool, SocketAddr), String> = HashMap::new();
        let state_dir = file
            .runtime
            .state_dir
            .as_ref()
            .map(|d| self.base_dir.join(d));
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
                            listener_tls = self.listener_tls(i, tls, state_dir.as_deref());
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
                // What its upstream may not have: `l4_upstreams`.
                Some(ListenerProtocol::Udp) => match &l.upstream {
                    Some(u) if !file.upstreams.contains_key(u) => self.error(
                        Code::UnknownUpstream,
                        at("upstream"),
                        format!("listener '{}' names upstream '{u}', which is not defined", l.name),
                    ),
                    Some(_) => {}
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
    pub(super) fn listener_edge(
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
                ("allow_from", l.allow_from.is_some()),
                ("deny_from", l.deny_from.is_some()),
                ("defaults", l.defaults.is_some()),
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
                ("allow_from", l.allow_from.is_some()),
                ("deny_from", l.deny_from.is_some()),
                ("defaults", l.defaults.is_some()),
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
        let trusted_proxies = self
            .networks(
                &format!("listeners[{i}].trusted_proxies"),
                &l.trusted_proxies,
            )
            .unwrap_or_default();
        if l.max_inflight == Some(0) {
            self.error(
                Code::InvalidValue,
                at("max_inflight"),
                "max_inflight must be at least 1",
            );
        }
        let access = self
            .ip_rules(
                &format!("listeners[{i}]."),
                l.allow_from.as_deref(),
                l.deny_from.as_deref(),
            )
            .flatten();
        let defaults = self.listener_defaults(i, l.defaults.as_ref());
        let client_identity = l
            .tls
            .as_ref()
            .and_then(|t| t.client_identity_headers)
            .unwrap_or(false);
        if client_identity && l.tls.as_ref().is_some_and(|t| t.client_ca.is_none()) {
            self.error(
                Code::MissingClientCa,
                at("tls.client_identity_headers"),
                "client_identity_headers passes on client certificates: it needs tls.client_ca",
            );
        }
        ListenerEdge {
            client_identity,
            max_inflight: l.max_inflight.filter(|n| *n > 0),
            merge_slashes: l.merge_slashes.unwrap_or(false),
            encoded_slash,
            trust_forwarded,
            trusted_proxies,
            access,
            defaults,
        }
    }

    /// Refuses (`unexpected_option`) each key of listener `i` that is set
    /// but cannot be honoured there, saying `why`.
    pub(super) fn refuse(&mut self, i: usize, keys: &[(&str, bool)], why: impl Fn(&str) -> String) {
        for (key, _) in keys.iter().filter(|(_, set)| *set) {
            self.error(
                Code::UnexpectedOption,
                format!("listeners[{i}].{key}"),
                why(key),
            );
        }
    }
}

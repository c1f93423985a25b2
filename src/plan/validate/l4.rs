//! L4 listeners (`tcp`, `udp`): idle timeouts, sessions, SNI routes, and
//! the upstream settings a relayed connection cannot honour.

use super::*;

impl Validator<'_> {
    /// A `tcp` listener's idle timeout and SNI routes; the SNI options
    /// on any other listener are refused rather than ignored.
    pub(super) fn listener_l4(
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
    pub(super) fn l4_upstreams(&mut self, file: &FileConfig) {
        let mut named: BTreeMap<&str, &str> = BTreeMap::new();
        for (i, l) in file
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| l.protocol == "tcp" || l.protocol == "udp")
        {
            // Neither speaks UDP: refused, at the listener that would
            // need them.
            let udp = l.upstream.as_deref().filter(|_| l.protocol == "udp");
            if let Some((u, fu)) = udp.and_then(|u| Some((u, file.upstreams.get(u)?))) {
                let at = format!("listeners[{i}].upstream");
                if fu.proxy_protocol.is_some() {
                    self.error(Code::UnsupportedOption, at.clone(), format!("udp listener '{}' names upstream '{u}', which has proxy_protocol; no PROXY header is sent over udp", l.name));
                }
                if fu.health.is_some() {
                    self.error(Code::UnsupportedOption, at, format!("udp listener '{}' names upstream '{u}', which has active health checks; they speak http or tcp, not udp", l.name));
                }
            }
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
}

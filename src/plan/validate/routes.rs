//! `[[routes]]`: matching (hosts, paths, methods, headers), actions, and
//! the ambiguity rules of route selection.

use super::*;

impl Validator<'_> {
    pub(super) fn routes(&mut self, file: &FileConfig) -> Vec<Arc<RouteSpec>> {
        let mut out = Vec::with_capacity(file.routes.len());
        let mut names = foldhash::HashSet::default();
        for (i, r) in file.routes.iter().enumerate() {
            let at = |field: &str| format!("routes[{i}].{field}");
            if !is_valid_name(&r.name) {
                self.name("route", at("name"), &r.name);
            }
            if !names.insert(r.name.as_str()) {
                self.error(
                    Code::DuplicateName,
                    at("name"),
                    format!("route '{}' is defined twice", r.name),
                );
            }
            let read_before = self.referenced.len();
            let hint = self.hints.get_mut(i).and_then(Option::take);
            let (route, reused) = match hint.and_then(|hint| self.take_over(hint)) {
                Some(same) => (Some(same), true),
                None => (self.route(file, i, r).map(Arc::new), false),
            };
            if let Some(route) = route {
                out.push(route);
                self.route_reused.push(reused);
                let files = self.files_since(read_before);
                self.route_files.push(files);
            }
        }
        out
    }

    pub(super) fn route(
        &mut self,
        file: &FileConfig,
        i: usize,
        r: &FileRoute,
    ) -> Option<RouteSpec> {
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
        let headers = self.value_matchers(
            &format!("routes[{i}].headers"),
            &r.headers,
            |name| HeaderName::from_bytes(name.as_bytes()).ok(),
            "header",
        );
        let query = self.value_matchers(
            &format!("routes[{i}].query"),
            &r.query,
            |name| (!name.is_empty()).then(|| name.to_owned()),
            "query parameter",
        );
        ok &= headers.is_some() && query.is_some();
        let actions: Vec<&str> = [
            r.upstream.as_ref().map(|_| "upstream"),
            r.respond.as_ref().map(|_| "respond"),
            r.redirect.as_ref().map(|_| "redirect"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let action = match (&r.upstream, &r.respond, &r.redirect) {
            _ if actions.len() > 1 => {
                self.error(
                    Code::ConflictingAction,
                    at(actions.get(1).copied().unwrap_or("respond")),
                    format!(
                        "route '{}' sets {}: a route has one action",
                        r.name,
                        actions.join(" and ")
                    ),
                );
                None
            }
            (None, None, None) => {
                self.error(
                    Code::MissingAction,
                    at("name"),
                    format!(
                        "route '{}' needs an action: upstream, respond or redirect",
                        r.name
                    ),
                );
                None
            }
            (None, None, Some(redirect)) => {
                let schemes: Vec<&str> = r
                    .listeners
                    .iter()
                    .filter_map(|name| file.listeners.iter().find(|l| &l.name == name))
                    .map(|l| {
                        if l.protocol == "https" {
                            "https"
                        } else {
                            "http"
                        }
                    })
                    .collect();
                self.redirect(i, r, redirect, &path, &schemes)
                    .map(RouteAction::Redirect)
            }
            (Some(u), None, None) => {
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
            (_, Some(respond), _) => {
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
            // More than one action: refused above.
            _ => None,
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
        if quota.as_ref().is_some_and(QuotaSpec::keyed_by_subject) && !authenticates(file, r) {
            self.error(
                Code::ConflictingOptions,
                at("quota.key"),
                "a quota keyed by subject needs the route's auth (its own or its listeners' default): without it every request would share one bucket",
            );
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
        // What says a route carries gRPC: its upstream must speak HTTP/2.
        if let Some(RouteAction::Proxy { upstream }) = &action {
            let protocol = file.upstreams.get(upstream).map(|u| u.protocol.as_str());
            if let (Some("h2c" | "h2"), Some(host)) = (protocol, r.host_rewrite.as_deref()) {
                if host != "backend" {
                    self.error(
                        Code::UnsupportedOption,
                        at("host_rewrite"),
                        format!(
                            "an HTTP/2 upstream ('{upstream}') is sent its backend's address as :authority: host_rewrite = \"{host}\" cannot apply (\"backend\" can)"
                        ),
                    );
                }
            }
            let grpc_retry = retry.as_ref().is_some_and(|r| r.on.grpc != 0);
            for (field, set) in [
                ("grpc_web", r.grpc_web == Some(true)),
                ("retry.on", grpc_retry),
            ] {
                if set && !matches!(protocol, Some("h2c" | "h2")) {
                    self.error(
                        Code::GrpcNeedsHttp2,
                        at(field),
                        format!(
                            "route '{}' carries gRPC (`{field}`), which needs an upstream of protocol \"h2c\" or \"h2\"; '{upstream}' is \"{}\"",
                            r.name,
                            protocol.unwrap_or("http1")
                        ),
                    );
                }
            }
        }
        if r.grpc_web.is_some() && !proxies && action.is_some() {
            self.error(
                Code::UnexpectedOption,
                at("grpc_web"),
                "`grpc_web` applies to routes with an upstream, not to `respond` or `redirect`",
            );
        }
        let zones = std::mem::take(&mut self.cache_zones);
        let (cache, cache_opt_out) = match &r.cache {
            None => (None, false),
            Some(crate::config::FileCacheSetting::Keyword(word)) if word == "none" => (None, true),
            Some(crate::config::FileCacheSetting::Keyword(word)) => {
                self.error(
                    Code::InvalidValue,
                    at("cache"),
                    format!("cache = '{word}': write \"none\" (not the listener's default either) or {{ zone = \"main\" }}"),
                );
                ok = false;
                (None, false)
            }
            Some(crate::config::FileCacheSetting::Table(c)) => {
                let cache = self.route_cache(&at("cache"), c, &zones, proxies || action.is_none());
                ok &= cache.is_some();
                (cache, false)
            }
        };
        self.cache_zones = zones;
        let (waf, waf_opt_out) = match &r.waf {
            None => (None, false),
            Some(w) => self.route_waf_setting(&at("waf"), w).unwrap_or_else(|| {
                ok = false;
                (None, false)
            }),
        };
        let filters = self.route_filters(i, r, &path);
        if !ok {
            return None;
        }
        Some(RouteSpec {
            name: r.name.clone(),
            listeners: r.listeners.clone(),
            hosts,
            path,
            methods,
            headers: headers?,
            query: query?,
            action: action?,
            filters: filters?,
            timeout: timeout?,
            max_inflight: r.max_inflight.filter(|n| *n > 0),
            retry,
            hedge,
            quota,
            grpc_web: r.grpc_web.unwrap_or(false),
            cache,
            cache_opt_out,
            waf,
            waf_opt_out,
        })
    }

    pub(super) fn header_pairs(
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
    pub(super) fn ambiguous_routes(&mut self, file: &FileConfig, routes: &[Arc<RouteSpec>]) {
        // Keys borrow from the routes: checking 100 000 routes allocates
        // only for routes that match on headers or query.
        // Routes taken over from the active configuration were not
        // ambiguous among themselves there (ambiguity does not depend on
        // order): only the groups a new route is in can be.
        let reused = &self.route_reused;
        let only_new = reused.len() == routes.len() && reused.iter().any(|r| *r);
        let mut seen: foldhash::HashMap<MatchKey<'_>, MethodOwners<'_>> = Default::default();
        if only_new {
            for (route, _) in routes.iter().zip(reused).filter(|(_, reused)| !**reused) {
                for_each_key(route, |key| {
                    seen.entry(key).or_default();
                });
            }
        }
        // Hosts are what keys differ in most: a route none of whose hosts
        // a new route names is not hashed whole.
        let new_hosts: foldhash::HashSet<Option<&HostMatch>> = seen.keys().map(|k| k.1).collect();
        let mut ambiguous = Vec::new();
        for (index, route) in routes.iter().enumerate() {
            let may_clash = !only_new
                || match route.hosts.is_empty() {
                    true => new_hosts.contains(&None),
                    false => route.hosts.iter().any(|h| new_hosts.contains(&Some(h))),
                };
            if !may_clash {
                continue;
            }
            for_each_key(route, |key| {
                let listener = key.0;
                let owners = match seen.entry(key) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(_) if only_new => return,
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(MethodOwners::default())
                    }
                };
                if let Some(other) = owners.first_overlapping(&route.methods) {
                    ambiguous.push((index, other, listener));
                }
                owners.take(index, &route.name, &route.methods);
            });
        }
        // Reported at the route's place in the file: invalid routes before
        // it are not in `routes`. (Names are unique, or already an error.)
        let place: HashMap<&str, usize> = match ambiguous.is_empty() {
            true => HashMap::new(),
            false => file
                .routes
                .iter()
                .enumerate()
                .map(|(i, r)| (r.name.as_str(), i))
                .rev()
                .collect(),
        };
        for (index, other, listener) in ambiguous {
            let Some(route) = routes.get(index) else {
                continue;
            };
            let at = place.get(route.name.as_str()).copied().unwrap_or(index);
            self.diagnostics.push(Diagnostic::new(
                Code::AmbiguousRoute,
                format!("routes[{at}].name"),
                format!(
                    "routes '{other}' and '{}' match the same host, path, methods, headers and query on listener '{listener}'",
                    route.name
                ),
            ));
        }
    }
}

/// Calls `f` with each key `route` is grouped under: one per listener and
/// host (or none).
fn for_each_key<'r>(route: &'r RouteSpec, mut f: impl FnMut(MatchKey<'r>)) {
    let headers = if route.headers.is_empty() && route.query.is_empty() {
        String::new()
    } else {
        route
            .headers
            .iter()
            .map(|(n, v)| format!("{n}={}", v.source()))
            .chain(
                route
                    .query
                    .iter()
                    .map(|(n, v)| format!("?{n}={}", v.source())),
            )
            .collect::<Vec<_>>()
            .join("&")
    };
    for listener in &route.listeners {
        if route.hosts.is_empty() {
            f((listener.as_str(), None, route.path.key(), headers.clone()));
        }
        for host in &route.hosts {
            f((
                listener.as_str(),
                Some(host),
                route.path.key(),
                headers.clone(),
            ));
        }
    }
}

/// Within one group of routes that match the same requests: the first
/// route (index, name) to take each method, and the first that takes
/// every method.
#[derive(Default)]
pub(super) struct MethodOwners<'r> {
    any: Option<(usize, &'r str)>,
    by_method: Vec<(&'r Method, usize, &'r str)>,
}

impl<'r> MethodOwners<'r> {
    /// The earliest route whose methods meet `methods` (empty: all).
    fn first_overlapping(&self, methods: &[Method]) -> Option<&'r str> {
        self.by_method
            .iter()
            .filter(|(m, _, _)| methods.is_empty() || methods.contains(m))
            .map(|(_, index, name)| (*index, *name))
            .chain(self.any)
            .min_by_key(|(index, _)| *index)
            .map(|(_, name)| name)
    }

    fn take(&mut self, index: usize, name: &'r str, methods: &'r [Method]) {
        if methods.is_empty() {
            self.any.get_or_insert((index, name));
        }
        for method in methods {
            if !self.by_method.iter().any(|(m, _, _)| *m == method) {
                self.by_method.push((method, index, name));
            }
        }
    }
}

/// Listener, host, path matcher and header matchers of a route: two
/// routes with equal keys and overlapping methods are ambiguous.
type MatchKey<'r> = (&'r str, Option<&'r HostMatch>, (char, &'r str), String);

/// A name of letters, digits and `-` labels (and `_`, when
/// `underscores`: SRV's service and protocol labels), at most 253
/// characters, labels at most 63.
pub(super) fn is_host_name(name: &str, underscores: bool) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || (underscores && b == b'_'))
        })
}

pub(super) fn parse_host(host: &str) -> Option<HostMatch> {
    let lower = host.to_ascii_lowercase();
    let (wildcard, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, lower.as_str()),
    };
    if !is_host_name(name, false) {
        return None;
    }
    Some(if wildcard {
        HostMatch::Suffix(format!(".{name}"))
    } else {
        HostMatch::Exact(name.to_owned())
    })
}

pub(super) fn is_host_port(addr: &str) -> bool {
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

/// Whether requests of route `r` are authenticated: its own `auth`, or
/// one of its listeners' default (unless it opts out).
fn authenticates(file: &FileConfig, r: &crate::config::FileRoute) -> bool {
    use crate::config::FileAuth;
    match &r.auth {
        Some(FileAuth::Method(_)) => true,
        Some(FileAuth::Keyword(_)) => false,
        None => file.listeners.iter().any(|l| {
            r.listeners.contains(&l.name)
                && l.defaults
                    .as_ref()
                    .is_some_and(|d| matches!(d.auth, Some(FileAuth::Method(_))))
        }),
    }
}

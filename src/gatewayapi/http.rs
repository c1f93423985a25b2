//! HTTPRoute: attachment, hostnames, matches, filters and backends, as
//! cutover routes and upstreams.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use super::filters::{apply_filter, backends};
use super::matches::{grpc_match, intersect, route_match, split_path, PathEdit, Redirect};
use super::model::{AllowedFrom, Built, Context, Listener};
use super::routes::{part, Action, Path, Route, METHODS};
use super::status::{unsupported, Condition, ParentStatus, RouteStatus};
use super::{isolation, Fields, Resource, GROUP};

/// Imports one HTTPRoute (or GRPCRoute: matches on the method, backends
/// over h2c); returns its status and how many routes it attached to each
/// listener (by index).
pub(super) fn import_route(
    ctx: &Context<'_>,
    route: &Resource,
    order: usize,
    built: &mut Built,
) -> (RouteStatus, BTreeMap<usize, usize>) {
    let grpc = route.kind == "GRPCRoute";
    let mut status = RouteStatus::new(route);
    let spec = route.spec();
    let hostnames: Vec<String> = spec
        .strings("hostnames")
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();

    let Attachment {
        serve,
        parents: parent_statuses,
        counts: attached_counts,
    } = attach(ctx, route, &spec, &hostnames);

    // The rules, whatever the parents: their problems are every parent's.
    let mut rule_conditions: Vec<Condition> = Vec::new();
    let mut resolved: Vec<Condition> = Vec::new();
    let base = format!(
        "{}_{}{}",
        part(&route.namespace),
        part(&route.name),
        if grpc { "_grpc" } else { "" }
    );
    let mut pending: Vec<Route> = Vec::new();
    // Why rules were dropped alone (PartiallyInvalid).
    let mut partially: Vec<String> = Vec::new();
    for (ri, rule) in spec.list("rules").iter().enumerate() {
        rule.ignore(&["name"]);
        let upstream_name = format!("{base}_r{ri}");
        // Filters every backendRef of the rule carries alike (one
        // backendRef, the common case) are the rule's, applied after its
        // own; different ones cannot be told apart by cutover's routes.
        let backend_filters: Vec<Option<&Value>> = rule
            .list("backendRefs")
            .iter()
            .map(|b| {
                b.get("filters")
                    .filter(|f| f.as_array().is_some_and(|a| !a.is_empty()))
            })
            .collect();
        let lifted = backend_filters
            .first()
            .copied()
            .flatten()
            .filter(|first| backend_filters.iter().all(|f| *f == Some(*first)));
        let action = backends(
            ctx,
            route,
            rule,
            &upstream_name,
            built,
            &mut resolved,
            lifted.is_some(),
        );
        if let (true, Action::Upstream(u)) = (grpc, &action) {
            if let Some(upstream) = built.upstreams.get_mut(u) {
                upstream.protocol = Some(if upstream.tls.is_some() { "h2" } else { "h2c" });
            }
        }
        let mut template = Route {
            name: String::new(),
            listener: String::new(),
            host: None,
            path: Path::Any,
            methods: Vec::new(),
            headers: BTreeMap::new(),
            query: BTreeMap::new(),
            action,
            request_headers: None,
            response_headers: None,
            rewrite: None,
            host_rewrite: None,
            mirrors: Vec::new(),
            timeout: None,
            cors: None,
            retry: None,
            rank: (0, Reverse(0), 0, Reverse(0), Reverse(0), order, 0, 0),
        };
        let mut path_edit: Option<PathEdit> = None;
        // A rule cutover refuses on purpose (a CORS policy the Fetch
        // standard forbids) is dropped alone: the route's other rules
        // serve, and it says PartiallyInvalid.
        let mut dropped = None;
        for (fi, filter) in rule.list("filters").iter().enumerate() {
            if let Err(problem) = apply_filter(
                ctx,
                route,
                filter,
                &mut template,
                &mut path_edit,
                &format!("{base}_r{ri}_m{fi}"),
                built,
                &mut resolved,
            ) {
                if filter.str("type") == Some("CORS") && problem.reason == "UnsupportedValue" {
                    dropped = Some(problem);
                } else {
                    rule_conditions.push(problem);
                }
            }
        }
        if let Some(Value::Array(filters)) = lifted {
            let at = format!("{}.backendRefs[0].filters", rule.path());
            for (fi, filter) in filters.iter().enumerate() {
                let filter = Fields::new(filter, format!("{at}[{fi}]"));
                if let Err(problem) = apply_filter(
                    ctx,
                    route,
                    &filter,
                    &mut template,
                    &mut path_edit,
                    &format!("{base}_r{ri}_b{fi}"),
                    built,
                    &mut resolved,
                ) {
                    rule_conditions.push(problem);
                }
            }
        }
        let (request_timeout, backend_timeout) = match rule.object("timeouts") {
            Some(timeouts) => {
                let pair = (
                    timeouts.str("request").and_then(duration_text),
                    timeouts.str("backendRequest").and_then(duration_text),
                );
                for field in timeouts.rest() {
                    rule_conditions.push(unsupported(&field));
                }
                pair
            }
            None => (None, None),
        };
        let retried = rule.object("retry");
        // With retries, `backendRequest` bounds each attempt and `request`
        // the whole exchange; without, cutover's one `timeout` is the
        // shorter of the two.
        template.timeout = match (&retried, request_timeout, backend_timeout.clone()) {
            (Some(_), request, _) => request,
            (None, Some(r), Some(b)) => Some(shorter(&r, &b).to_owned()),
            (None, Some(t), None) | (None, None, Some(t)) => Some(t),
            (None, None, None) => None,
        };
        if let Some(retry) = retried {
            match super::filters::retry(&retry, backend_timeout.as_deref()) {
                Ok(written) => template.retry = written,
                Err(problem) => rule_conditions.push(problem),
            }
        }
        let mut matches = rule.list("matches");
        let default_match = Value::Object(Map::new());
        if matches.is_empty() {
            matches.push(Fields::new(
                &default_match,
                format!("{}.matches[0]", rule.path()),
            ));
        }
        for (mi, m) in matches.iter().enumerate() {
            let parsed = if grpc { grpc_match(m) } else { route_match(m) };
            match parsed {
                Ok(parts)
                    if prefix_edit(path_edit.as_ref())
                        && matches!(parts.path, Path::Exact(_) | Path::Regex(_)) =>
                {
                    rule_conditions.push(Condition::no(
                        "Accepted",
                        "UnsupportedValue",
                        format!("{}: ReplacePrefixMatch needs a PathPrefix match", m.path()),
                    ));
                }
                Ok(parts) => {
                    for (pi, (path, rewrite)) in split_path(&parts.path, path_edit.as_ref())
                        .into_iter()
                        .enumerate()
                    {
                        let mut r = template.clone();
                        r.name = format!("{base}_r{ri}_m{mi}_{pi}");
                        r.rank = (
                            match &parts.path {
                                Path::Exact(_) => 0,
                                Path::Prefix(_) | Path::Any => 1,
                                Path::Regex(_) => 2,
                            },
                            Reverse(match &parts.path {
                                Path::Exact(p) | Path::Prefix(p) | Path::Regex(p) => p.len(),
                                Path::Any => 1,
                            }),
                            u8::from(parts.method.is_none()),
                            Reverse(parts.headers.len()),
                            Reverse(parts.query.len()),
                            order,
                            ri,
                            mi,
                        );
                        r.path = path;
                        if let Some(Redirect(parts_of)) = &rewrite.redirect {
                            r.action = Action::Redirect(parts_of.clone());
                        }
                        r.rewrite = rewrite.rewrite;
                        r.methods = parts.method.iter().cloned().collect();
                        r.headers = parts.headers.clone();
                        r.query = parts.query.clone();
                        if dropped.is_none() {
                            pending.push(r);
                        }
                    }
                }
                Err(problems) => rule_conditions.extend(problems),
            }
        }
        for field in rule.rest() {
            rule_conditions.push(unsupported(&field));
        }
        if let Some(problem) = dropped {
            partially.push(problem.message);
        }
    }
    for field in spec.rest() {
        rule_conditions.push(unsupported(&field));
    }

    let accepted_problem = rule_conditions.iter().find(|c| !c.status).cloned();
    // The first reason, with every reference's message.
    let refs_problem = resolved.iter().find(|c| !c.status).map(|first| {
        let messages: Vec<&str> = resolved
            .iter()
            .filter(|c| !c.status)
            .map(|c| c.message.as_str())
            .collect();
        Condition::no("ResolvedRefs", &first.reason, messages.join("; "))
    });
    for (parent_ref, mut conditions) in parent_statuses {
        let attached = conditions.iter().all(|c| c.status);
        if attached {
            match &accepted_problem {
                // An unsupported field: the route is not programmed at all
                // (a part of it cannot be honoured).
                Some(problem) => conditions.push(problem.clone()),
                None => conditions.push(Condition::yes("Accepted", "Accepted")),
            }
        }
        conditions.push(match &refs_problem {
            Some(problem) => problem.clone(),
            None => Condition::yes("ResolvedRefs", "ResolvedRefs"),
        });
        if !partially.is_empty() {
            let mut c = Condition::yes("PartiallyInvalid", "UnsupportedValue");
            c.message = format!("rules not served: {}", partially.join("; "));
            conditions.push(c);
        }
        status.parents.push(ParentStatus {
            parent_ref,
            conditions,
        });
    }
    if accepted_problem.is_some() {
        return (status, BTreeMap::new());
    }
    // The client certificate the route's Gateways show backends, on the
    // route's upstreams that speak TLS to them (the first Gateway's when
    // several differ).
    let client = attached_counts
        .keys()
        .filter_map(|&i| ctx.listeners.get(i))
        .find_map(|l| ctx.backend_clients.get(l.gateway).cloned().flatten());
    if let Some(client) = client {
        for r in &pending {
            for name in r.upstreams() {
                if let Some(tls) = built.upstreams.get_mut(name).and_then(|u| u.tls.as_mut()) {
                    tls.client = Some(client.clone());
                }
            }
        }
    }
    for (listener, hosts) in serve {
        for host in hosts {
            for r in &pending {
                let mut r = r.clone();
                r.listener = listener.clone();
                r.name = format!(
                    "{}_{}_{}",
                    r.name,
                    part(&listener),
                    host.as_deref().map_or_else(|| "any".to_owned(), part)
                );
                r.host = host.clone();
                // A redirect naming neither scheme nor port goes to the
                // listener's port (the API's rule), written out: cutover
                // keeps the request's port only while the host stays.
                if let Action::Redirect(parts) = &mut r.action {
                    let named = |k: &str| parts.iter().any(|(key, _)| key == k);
                    if !named("scheme") && !named("port") && named("host") {
                        if let Some(l) = ctx.listeners.iter().find(|l| l.cutover == *listener) {
                            let default = if l.cutover.starts_with("https") {
                                443
                            } else {
                                80
                            };
                            if l.port != default {
                                parts.push(("port".into(), l.port.to_string()));
                            }
                        }
                    }
                }
                built.routes.push(r);
            }
        }
    }
    (status, attached_counts)
}

/// Where a route attaches: per cutover listener the hostnames it serves
/// there (`None`: any host), each parent's conditions so far, and how
/// many attachments each Gateway listener (by index) got.
pub(super) struct Attachment {
    pub serve: BTreeMap<String, BTreeSet<Option<String>>>,
    pub parents: Vec<(Value, Vec<Condition>)>,
    pub counts: BTreeMap<usize, usize>,
}

/// Attaches `route` to the listeners its `parentRefs` name, allow it and
/// serve its kind.
pub(super) fn attach(
    ctx: &Context<'_>,
    route: &Resource,
    spec: &Fields<'_>,
    hostnames: &[String],
) -> Attachment {
    let mut attached_counts = BTreeMap::new();
    // Per cutover listener: the hostnames the route serves there (None:
    // any host).
    let mut serve: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    let mut parent_statuses = Vec::new();
    for parent in spec.list("parentRefs") {
        let parent_ref = parent_ref_json(&parent, route);
        let mut conditions = Vec::new();
        let group = parent.str("group").unwrap_or(GROUP);
        let kind = parent.str("kind").unwrap_or("Gateway");
        let namespace = parent.str("namespace").unwrap_or(&route.namespace);
        let name = parent.str("name").unwrap_or_default();
        let section = parent.str("sectionName");
        let port = parent.int("port");
        for field in parent.rest() {
            conditions.push(unsupported(&field));
        }
        // The parent's listeners: a Gateway's own, or a ListenerSet's
        // (attached to neither through the other).
        let owner = match (group == GROUP, kind) {
            (true, "Gateway") => ctx
                .gateways
                .iter()
                .position(|g| g.namespace == namespace && g.name == name)
                .map(|gi| (gi, None)),
            (true, "ListenerSet") => ctx
                .sets
                .iter()
                .position(|s| s.namespace == namespace && s.name == name)
                .and_then(|si| {
                    ctx.listeners
                        .iter()
                        .find(|l| l.set == Some(si))
                        .map(|l| (l.gateway, Some(si)))
                }),
            _ => None,
        };
        match (
            group == GROUP && matches!(kind, "Gateway" | "ListenerSet"),
            owner,
        ) {
            (false, _) => conditions.push(Condition::no(
                "Accepted",
                "NoMatchingParent",
                format!("parent kind {group}/{kind} is not a Gateway or a ListenerSet"),
            )),
            (true, None) => conditions.push(Condition::no(
                "Accepted",
                "NoMatchingParent",
                format!("no accepted {kind} {namespace}/{name} of the imported class"),
            )),
            (true, Some((gi, set))) => {
                let candidates: Vec<usize> = ctx
                    .listeners
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.gateway == gi && l.set == set)
                    .filter(|(_, l)| section.is_none_or(|s| s == l.name))
                    .filter(|(_, l)| port.is_none_or(|p| p == i64::from(l.port)))
                    .map(|(i, _)| i)
                    .collect();
                let allowed: Vec<usize> = candidates
                    .iter()
                    .copied()
                    .filter(|&i| {
                        ctx.listeners[i].takes(&route.kind) && allows(ctx, &ctx.listeners[i], route)
                    })
                    .collect();
                let mut matched = 0;
                for &i in &allowed {
                    let l = &ctx.listeners[i];
                    let mut hosts = intersect(l.hostname.as_deref(), hostnames);
                    // A name a more specific listener of the port owns is
                    // that listener's alone (listener isolation).
                    hosts.retain(|h| match h {
                        Some(h) => !isolation::owned_elsewhere(ctx.listeners, i, h),
                        None => true,
                    });
                    if hosts.is_empty() {
                        continue;
                    }
                    matched += 1;
                    *attached_counts.entry(i).or_insert(0) += 1;
                    // A listener that is not served (an unresolved
                    // certificate, a client CA it cannot read) counts the
                    // route but serves nothing.
                    if l.served {
                        serve.entry(l.cutover.clone()).or_default().extend(hosts);
                    }
                }
                if candidates.is_empty() {
                    conditions.push(Condition::no(
                        "Accepted",
                        "NoMatchingParent",
                        match (section, port) {
                            (Some(s), _) => format!("Gateway {namespace}/{name} has no accepted listener {s:?} (on that port)"),
                            (None, Some(p)) => format!("Gateway {namespace}/{name} has no accepted listener on port {p}"),
                            (None, None) => format!("Gateway {namespace}/{name} has no accepted listener"),
                        },
                    ));
                } else if allowed.is_empty() {
                    conditions.push(Condition::no(
                        "Accepted",
                        "NotAllowedByListeners",
                        format!(
                            "no listener of Gateway {namespace}/{name} takes {}s from namespace {}",
                            route.kind, route.namespace
                        ),
                    ));
                } else if matched == 0 {
                    conditions.push(Condition::no(
                        "Accepted",
                        "NoMatchingListenerHostname",
                        "no hostname of the route intersects a listener's hostname".into(),
                    ));
                }
            }
        }
        parent_statuses.push((parent_ref, conditions));
    }

    Attachment {
        serve,
        parents: parent_statuses,
        counts: attached_counts,
    }
}

/// Sorts the routes in the API's precedence and gives each match key
/// only the methods no route before it took (dropping routes left with
/// none: an older route with the same match wins).
pub(super) fn settle(routes: &mut Vec<Route>) {
    routes.sort_by_key(|r| r.rank);
    let mut taken: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    routes.retain_mut(|r| {
        let key = format!(
            "{}|{:?}|{:?}|{:?}|{:?}",
            r.listener, r.host, r.path, r.headers, r.query
        );
        let taken = taken.entry(key).or_default();
        if taken.contains("*") {
            return false;
        }
        let wanted: Vec<String> = if r.methods.is_empty() {
            if taken.is_empty() {
                taken.insert("*".into());
                return true;
            }
            METHODS.iter().map(|m| (*m).to_owned()).collect()
        } else {
            r.methods.clone()
        };
        let left: Vec<String> = wanted.into_iter().filter(|m| !taken.contains(m)).collect();
        if left.is_empty() {
            return false;
        }
        taken.extend(left.iter().cloned());
        r.methods = left;
        true
    });
}

fn prefix_edit(edit: Option<&PathEdit>) -> bool {
    match edit {
        Some(PathEdit::Prefix(_)) => true,
        Some(PathEdit::Redirect(_, inner)) => prefix_edit(inner.as_deref()),
        _ => false,
    }
}

fn shorter<'a>(a: &'a str, b: &'a str) -> &'a str {
    match (parse_duration(a), parse_duration(b)) {
        (Some(x), Some(y)) if y < x => b,
        _ => a,
    }
}

/// A Gateway API duration (`1h2m3s4ms`) in milliseconds.
fn parse_duration(text: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3_600_000,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1
            }
            'm' => 60_000,
            's' => 1000,
            _ => return None,
        };
        total += n * unit;
    }
    number.is_empty().then_some(total)
}

fn parent_ref_json(parent: &Fields<'_>, route: &Resource) -> Value {
    let mut out = Map::new();
    out.insert("group".into(), json!(parent.str("group").unwrap_or(GROUP)));
    out.insert(
        "kind".into(),
        json!(parent.str("kind").unwrap_or("Gateway")),
    );
    out.insert(
        "namespace".into(),
        json!(parent.str("namespace").unwrap_or(&route.namespace)),
    );
    out.insert("name".into(), json!(parent.str("name").unwrap_or_default()));
    if let Some(s) = parent.str("sectionName") {
        out.insert("sectionName".into(), json!(s));
    }
    if let Some(p) = parent.int("port") {
        out.insert("port".into(), json!(p));
    }
    Value::Object(out)
}

/// Whether `listener` takes routes from `route`'s namespace.
fn allows(ctx: &Context<'_>, listener: &Listener, route: &Resource) -> bool {
    match &listener.from {
        AllowedFrom::Same => route.namespace == listener.namespace,
        AllowedFrom::All => true,
        AllowedFrom::None => false,
        AllowedFrom::Selector(labels) => labels.iter().all(|(k, v)| {
            // Kubernetes gives every Namespace this label (1.22 on),
            // whether or not the input holds the Namespace.
            if k == "kubernetes.io/metadata.name" {
                return *v == route.namespace;
            }
            ctx.namespaces
                .get(route.namespace.as_str())
                .and_then(|have| have.get(k))
                .and_then(Value::as_str)
                == Some(v.as_str())
        }),
    }
}

/// A Gateway API duration as cutover writes one (`"1500ms"`, `"10s"`);
/// `None` for zero (no timeout) or one that does not parse.
fn duration_text(text: &str) -> Option<String> {
    parse_duration(text)
        .filter(|ms| *ms > 0)
        .map(|ms| match ms % 1000 {
            0 => format!("{}s", ms / 1000),
            _ => format!("{ms}ms"),
        })
}

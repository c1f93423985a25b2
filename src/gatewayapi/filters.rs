//! HTTPRoute filters and backends.

use serde_json::Value;

use super::grants::granted;
use super::matches::{escape, PathEdit};
use super::model::{Built, Context};
use super::policy::{self, BackendTls};
use super::routes::{list, literal, Action, Backend, HeaderEdits, Route, Upstream};
use super::status::{unsupported, Condition};
use super::{toml_str, Fields, Resource, Services};

#[allow(clippy::too_many_arguments)]
pub(super) fn apply_filter(
    ctx: &Context<'_>,
    route: &Resource,
    filter: &Fields<'_>,
    r: &mut Route,
    path_edit: &mut Option<PathEdit>,
    mirror_name: &str,
    built: &mut Built,
    resolved: &mut Vec<Condition>,
) -> Result<(), Condition> {
    let kind = filter.str("type").unwrap_or_default();
    let out = match kind {
        "RequestHeaderModifier" | "ResponseHeaderModifier" => {
            let key = if kind == "RequestHeaderModifier" {
                "requestHeaderModifier"
            } else {
                "responseHeaderModifier"
            };
            let Some(m) = filter.object(key) else {
                return Err(missing(filter, key));
            };
            let mut edits = HeaderEdits::default();
            for (field, into) in [("set", &mut edits.set), ("add", &mut edits.add)] {
                for h in m.list(field) {
                    let name = h.str("name").unwrap_or_default().to_ascii_lowercase();
                    let value = literal(h.str("value").unwrap_or_default());
                    into.insert(name, value);
                    if let Some(f) = h.rest().first() {
                        return Err(unsupported(f));
                    }
                }
            }
            edits.remove = m
                .strings("remove")
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect();
            if let Some(f) = m.rest().first() {
                return Err(unsupported(f));
            }
            // A backendRef's modifier comes after its rule's: the two
            // compose, the later winning on a name both touch.
            let slot = if kind == "RequestHeaderModifier" {
                &mut r.request_headers
            } else {
                &mut r.response_headers
            };
            *slot = Some(match slot.take() {
                Some(earlier) => earlier.then(edits),
                None => edits,
            });
            Ok(())
        }
        "RequestRedirect" => {
            let Some(m) = filter.object("requestRedirect") else {
                return Err(missing(filter, "requestRedirect"));
            };
            let mut parts = Vec::new();
            if let Some(s) = m.str("scheme") {
                parts.push(("scheme".into(), toml_str(s)));
            }
            if let Some(h) = m.str("hostname") {
                parts.push(("host".into(), toml_str(&literal(h))));
            }
            if let Some(p) = m.int("port") {
                parts.push(("port".into(), p.to_string()));
            }
            parts.push((
                "status".into(),
                m.int("statusCode").unwrap_or(302).to_string(),
            ));
            let edit = match m.object("path") {
                Some(p) => Some(Box::new(path_modifier(&p)?)),
                None => None,
            };
            if let Some(f) = m.rest().first() {
                return Err(unsupported(f));
            }
            // Only a status: the same URL, as the API allows (a 303
            // turns a POST into a GET; a 307 or 308 asks to come back).
            if parts.len() == 1 && edit.is_none() {
                parts.push(("same_url".into(), "true".into()));
            }
            *path_edit = Some(PathEdit::Redirect(parts.clone(), edit));
            r.action = Action::Redirect(parts);
            Ok(())
        }
        "URLRewrite" => {
            let Some(m) = filter.object("urlRewrite") else {
                return Err(missing(filter, "urlRewrite"));
            };
            if let Some(h) = m.str("hostname") {
                r.host_rewrite = Some(h.to_owned());
            }
            if let Some(p) = m.object("path") {
                *path_edit = Some(path_modifier(&p)?);
            }
            if let Some(f) = m.rest().first() {
                return Err(unsupported(f));
            }
            Ok(())
        }
        "RequestMirror" => {
            let Some(m) = filter.object("requestMirror") else {
                return Err(missing(filter, "requestMirror"));
            };
            let percent = match (m.int("percent"), m.object("fraction")) {
                (Some(p), _) => u32::try_from(p).unwrap_or(100),
                (None, Some(f)) => {
                    let n = f.int("numerator").unwrap_or(0);
                    let d = f.int("denominator").unwrap_or(100).max(1);
                    u32::try_from((n * 100 + d - 1) / d).unwrap_or(100)
                }
                (None, None) => 100,
            };
            if let Some(backend) = m.object("backendRef") {
                match resolve(ctx, route, &backend) {
                    Ok(members) => {
                        built.upstreams.insert(
                            mirror_name.to_owned(),
                            Upstream {
                                protocol: None,
                                tls: None,
                                backends: members.into_iter().map(|b| (b, 1)).collect(),
                                weighted: false,
                                never_eject: false,
                            },
                        );
                        if percent > 0 {
                            r.mirrors.push((mirror_name.to_owned(), percent.min(100)));
                        }
                    }
                    Err(c) => resolved.push(c),
                }
            }
            if let Some(f) = m.rest().first() {
                return Err(unsupported(f));
            }
            Ok(())
        }
        "CORS" => {
            let Some(m) = filter.object("cors") else {
                return Err(missing(filter, "cors"));
            };
            r.cors = Some(cors(&m)?);
            Ok(())
        }
        other => Err(Condition::no(
            "Accepted",
            "UnsupportedValue",
            format!(
                "{}: filter type {other:?} is not supported by cutover's import",
                filter.path()
            ),
        )),
    };
    if out.is_ok() {
        if let Some(f) = filter.rest().first() {
            return Err(unsupported(f));
        }
    }
    out
}

/// The CORS filter as a route's `cors`.
fn cors(m: &Fields<'_>) -> Result<String, Condition> {
    let list = |items: Vec<String>| list(&items);
    let credentials = m
        .get("allowCredentials")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let origins: Vec<String> = m
        .strings("allowOrigins")
        .into_iter()
        .map(|o| match o.as_str() {
            "*" => o,
            // `https://*.example.com`: a wildcard for the host's labels.
            _ if o.contains('*') => format!("~^{}$", escape(&o).replace("\\*", "[^/:]+")),
            _ => o,
        })
        .collect();
    let methods: Vec<String> = match m.strings("allowMethods") {
        m if m.iter().any(|x| x == "*") => vec!["*".to_owned()],
        m => m,
    };
    let headers = m.strings("allowHeaders");
    let expose = m.strings("exposeHeaders");
    if credentials
        && [&origins, &headers, &expose]
            .iter()
            .any(|l| l.iter().any(|x| x == "*"))
    {
        return Err(Condition::no(
            "Accepted",
            "UnsupportedValue",
            format!("{}: \"*\" with allowCredentials (cutover names origins and headers when credentials are allowed)", m.path()),
        ));
    }
    let mut parts = vec![format!("allow_origins = {}", list(origins))];
    if !methods.is_empty() {
        parts.push(format!("allow_methods = {}", list(methods)));
    }
    if !headers.is_empty() {
        parts.push(format!("allow_headers = {}", list(headers)));
    }
    if !expose.is_empty() {
        parts.push(format!("expose_headers = {}", list(expose)));
    }
    if credentials {
        parts.push("allow_credentials = true".into());
    }
    if let Some(age) = m.int("maxAge").filter(|a| *a > 0) {
        parts.push(format!("max_age = \"{age}s\""));
    }
    if let Some(f) = m.rest().first() {
        return Err(unsupported(f));
    }
    Ok(format!("{{ {} }}", parts.join(", ")))
}

/// A rule's `retry` as the route's (`None`: no retries). The API counts
/// retries, cutover counts attempts (the first included).
///
/// With `timeouts.backendRequest`, each attempt gets that long
/// (`per_try_timeout`) and one that runs out is retried; the API's
/// `attempts` is exact, so the upstream's retry budget is opened wide
/// (the API has no budget of its own here).
pub(super) fn retry(m: &Fields<'_>, per_try: Option<&str>) -> Result<Option<String>, Condition> {
    let retries = m.int("attempts").unwrap_or(1);
    let codes: Vec<String> = m
        .get("codes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .map(|c| format!("\"{c}\""))
        .collect();
    let backoff = m.str("backoff");
    if let Some(f) = m.rest().first() {
        return Err(unsupported(f));
    }
    if retries <= 0 {
        return Ok(None);
    }
    if retries > 9 {
        return Err(Condition::no(
            "Accepted",
            "UnsupportedValue",
            format!(
                "{}.attempts: {retries} retries; cutover makes at most 10 attempts",
                m.path()
            ),
        ));
    }
    // Connection errors are always retried: a refused or failed connect,
    // and a connection that ends without an answer
    // (HTTPRouteRetryConnectionError).
    let mut on = vec!["\"connect_failure\"".to_owned(), "\"reset\"".to_owned()];
    if per_try.is_some() {
        on.push("\"timeout\"".to_owned());
    }
    on.extend(codes);
    let mut parts = vec![
        format!("attempts = {}", retries + 1),
        format!("on = [{}]", on.join(", ")),
        "budget = { ratio = 1.0, min_per_second = 10000 }".to_owned(),
    ];
    if let Some(t) = per_try {
        parts.push(format!("per_try_timeout = {}", toml_str(t)));
    }
    if let Some(b) = backoff {
        parts.push(format!(
            "backoff = {{ base = {}, max = {} }}",
            toml_str(b),
            toml_str(b)
        ));
    }
    Ok(Some(format!("{{ {} }}", parts.join(", "))))
}

pub(super) fn missing(filter: &Fields<'_>, key: &str) -> Condition {
    Condition::no(
        "Accepted",
        "UnsupportedValue",
        format!("{}: the filter has no {key}", filter.path()),
    )
}

pub(super) fn path_modifier(p: &Fields<'_>) -> Result<PathEdit, Condition> {
    let out = match p.str("type").unwrap_or_default() {
        "ReplaceFullPath" => PathEdit::Full(p.str("replaceFullPath").unwrap_or("/").to_owned()),
        "ReplacePrefixMatch" => {
            PathEdit::Prefix(p.str("replacePrefixMatch").unwrap_or("/").to_owned())
        }
        other => {
            return Err(Condition::no(
                "Accepted",
                "UnsupportedValue",
                format!("{}: path modifier {other:?}", p.path()),
            ))
        }
    };
    if let Some(f) = p.rest().first() {
        return Err(unsupported(f));
    }
    Ok(out)
}

/// The rule's backends as one upstream (weights kept as shares), or a
/// 500 answer when none is usable.
pub(super) fn backends(
    ctx: &Context<'_>,
    route: &Resource,
    rule: &Fields<'_>,
    name: &str,
    built: &mut Built,
    resolved: &mut Vec<Condition>,
    filters_lifted: bool,
) -> Action {
    let mut shares: Vec<(Vec<Backend>, u32)> = Vec::new();
    // The weight of references whose own filters cannot be applied: their
    // share is answered 500, never served without them.
    let mut unfiltered: u32 = 0;
    // Each share's BackendTLSPolicy (or none).
    let mut tls: Vec<Option<BackendTls>> = Vec::new();
    // The weight of references that cannot be resolved: their share of
    // the requests is answered 500 (the API's rule).
    let mut invalid: u32 = 0;
    for b in rule.list("backendRefs") {
        let weight = b.int("weight").unwrap_or(1);
        if !b.list("filters").is_empty() && !filters_lifted {
            resolved.push(Condition::no(
                "ResolvedRefs",
                "UnsupportedValue",
                format!(
                    "{}.filters: the backendRefs of this rule have different filters; cutover applies a backend's filters only when every backendRef of the rule has the same ones: this share is answered 500",
                    b.path()
                ),
            ));
            unfiltered = unfiltered.saturating_add(u32::try_from(weight.max(0)).unwrap_or(0));
            b.ignore(&["name", "namespace", "port", "group", "kind"]);
            continue;
        }
        let service_tls = || {
            let namespace = b.str("namespace").unwrap_or(&route.namespace);
            let name = b.str("name").unwrap_or_default();
            policy::backend_tls(
                ctx.resources,
                namespace,
                name,
                b.int("port"),
                ctx.options.base_dir.as_deref(),
            )
        };
        match resolve(ctx, route, &b).and_then(|members| Ok((members, service_tls()?))) {
            Ok((members, service_tls)) if weight > 0 && !members.is_empty() => {
                shares.push((members, u32::try_from(weight).unwrap_or(1)));
                tls.push(service_tls);
            }
            Ok(_) => {}
            Err(c) => {
                resolved.push(c);
                invalid = invalid.saturating_add(u32::try_from(weight.max(0)).unwrap_or(0));
            }
        }
        for f in b.rest() {
            resolved.push(Condition::no(
                "ResolvedRefs",
                "UnsupportedValue",
                format!("{f} is not supported by cutover's import"),
            ));
        }
    }
    // One upstream speaks one way to all its members.
    let upstream_tls = tls.first().cloned().flatten();
    if tls.iter().any(|t| *t != upstream_tls) {
        resolved.push(Condition::no(
            "ResolvedRefs",
            "UnsupportedValue",
            format!(
                "{}: backends with and without (or with different) BackendTLSPolicies in one rule",
                rule.path()
            ),
        ));
        return Action::Respond(500);
    }
    if shares.is_empty() {
        return Action::Respond(500);
    }
    // A share that must not be served without its filters, and no 500
    // listener to send it to (it speaks plain HTTP): the rule answers 500.
    if unfiltered > 0 && upstream_tls.is_some() {
        return Action::Respond(500);
    }
    let invalid = invalid.saturating_add(unfiltered);
    // Valid and invalid references: the invalid share goes to the
    // configuration's own 500 listener (never ejected for its 5xx). Not
    // with TLS to the backends: that listener speaks plain HTTP.
    let mut never_eject = false;
    if invalid > 0 && upstream_tls.is_none() {
        shares.push((
            vec![Backend::Addr(ctx.options.invalid_address.clone())],
            invalid,
        ));
        built.answers_500 = true;
        never_eject = true;
    }
    // Each member's weight is its reference's share over its members,
    // scaled into cutover's 1–1000.
    let per_member: Vec<f64> = shares
        .iter()
        .map(|(members, w)| f64::from(*w) / members.len() as f64)
        .collect();
    let top = per_member.iter().copied().fold(0.0, f64::max);
    let weighted = shares.len() > 1
        && per_member
            .windows(2)
            .any(|w| (w[0] - w[1]).abs() > f64::EPSILON);
    let mut out: Vec<(Backend, u32)> = Vec::new();
    for ((members, _), share) in shares.iter().zip(&per_member) {
        let weight = if weighted {
            ((share / top) * 1000.0).round().clamp(1.0, 1000.0) as u32
        } else {
            1
        };
        for m in members {
            match out.iter_mut().find(|(b, _)| b == m) {
                Some((_, w)) => *w = (*w + weight).min(1000),
                None => out.push((m.clone(), weight)),
            }
        }
    }
    built.upstreams.insert(
        name.to_owned(),
        Upstream {
            protocol: None,
            tls: upstream_tls,
            backends: out,
            weighted,
            never_eject,
        },
    );
    Action::Upstream(name.to_owned())
}

/// A backendRef's members, or the `ResolvedRefs` condition it fails.
pub(super) fn resolve(
    ctx: &Context<'_>,
    route: &Resource,
    b: &Fields<'_>,
) -> Result<Vec<Backend>, Condition> {
    let group = b.str("group").unwrap_or("");
    let kind = b.str("kind").unwrap_or("Service");
    let name = b.str("name").unwrap_or_default();
    let namespace = b.str("namespace").unwrap_or(&route.namespace);
    let port = b.int("port");
    b.ignore(&["weight", "filters"]);
    if !(group.is_empty() || group == "core") || kind != "Service" {
        return Err(Condition::no(
            "ResolvedRefs",
            "InvalidKind",
            format!("backend kind {group}/{kind} is not a Service"),
        ));
    }
    if namespace != route.namespace && !granted(ctx.resources, route, "Service", namespace, name) {
        return Err(Condition::no(
            "ResolvedRefs",
            "RefNotPermitted",
            format!("no ReferenceGrant in namespace {namespace} lets HTTPRoutes of {} refer to Service {name}", route.namespace),
        ));
    }
    let Some(port) = port.and_then(|p| u16::try_from(p).ok()) else {
        return Err(Condition::no(
            "ResolvedRefs",
            "UnsupportedValue",
            format!("{}: a Service backend needs a port", b.path()),
        ));
    };
    let service = ctx.resources.iter().find(|r| {
        r.kind == "Service" && r.group().is_empty() && r.namespace == namespace && r.name == name
    });
    let dns = || {
        vec![Backend::Dns(format!(
            "{name}.{namespace}.svc.{}:{port}",
            ctx.options.cluster_domain
        ))]
    };
    let Some(service) = service else {
        let known = &ctx.options.cluster_services;
        return match ctx.options.services {
            Services::Dns
                if known.contains(&format!("{namespace}/{name}"))
                    || known.contains(&format!("{namespace}/*")) =>
            {
                Ok(dns())
            }
            Services::Dns => Err(Condition::no(
                "ResolvedRefs",
                "BackendNotFound",
                format!("Service {namespace}/{name} is not among the resources, and no --cluster-service names it"),
            )),
            Services::Input => Err(Condition::no(
                "ResolvedRefs",
                "BackendNotFound",
                format!("Service {namespace}/{name} is not among the resources (give it, or import with --services dns and --cluster-service)"),
            )),
        };
    };
    // The Service port: its name and target port.
    let ports = service
        .body
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let Some(service_port) = ports
        .iter()
        .find(|p| p.get("port").and_then(Value::as_i64) == Some(i64::from(port)))
    else {
        return Err(Condition::no(
            "ResolvedRefs",
            "BackendNotFound",
            format!("Service {namespace}/{name} has no port {port}"),
        ));
    };
    let port_name = service_port
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let slices: Vec<&Resource> = ctx
        .resources
        .iter()
        .filter(|r| {
            r.kind == "EndpointSlice"
                && r.namespace == namespace
                && r.labels
                    .get("kubernetes.io/service-name")
                    .and_then(Value::as_str)
                    == Some(name)
        })
        .collect();
    if slices.is_empty() {
        return Ok(dns());
    }
    let mut members = Vec::new();
    for slice in slices {
        let target = slice
            .body
            .get("ports")
            .and_then(Value::as_array)
            .and_then(|ports| {
                ports
                    .iter()
                    .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            })
            .and_then(|p| p.get("port").and_then(Value::as_i64));
        let Some(target) = target else { continue };
        for endpoint in slice
            .body
            .get("endpoints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let ready = endpoint
                .pointer("/conditions/ready")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in endpoint
                .get("addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(a) = address.as_str() {
                    let addr = if a.contains(':') {
                        format!("[{a}]:{target}")
                    } else {
                        format!("{a}:{target}")
                    };
                    if !members.contains(&Backend::Addr(addr.clone())) {
                        members.push(Backend::Addr(addr));
                    }
                }
            }
        }
    }
    Ok(members)
}

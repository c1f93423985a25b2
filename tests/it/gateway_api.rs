//! `cutover import gateway-api` (issue 59): resources written here (our
//! own manifests for the behaviours the Gateway API's conformance tests
//! check: the table in `docs/gateway-api.md` names which test holds
//! which), imported by the real binary, and the configuration served by
//! the real binary against real backends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;

use crate::harness::{full, send, Backend, Gateway, BIN};

const NS: &str = "infra";

/// A backend answering its name, the request line, the host and the
/// request's headers, one per line; it counts what it answered.
struct Named {
    name: &'static str,
    backend: Backend,
    seen: Arc<AtomicU64>,
}

async fn named(name: &'static str) -> Named {
    let seen = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&seen);
    let backend = Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        count.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let mut text = format!("{name}\n{} {}\n", req.method(), req.uri());
            for (k, v) in req.headers() {
                text.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
            }
            let _ = req.into_body().collect().await;
            let mut response = hyper::Response::new(full(text));
            response
                .headers_mut()
                .insert("x-from-backend", "1".parse().unwrap());
            response
        })
    }))
    .await;
    Named {
        name,
        backend,
        seen,
    }
}

/// A Service and its EndpointSlice (the backend's loopback port) for
/// each backend, in namespace `ns`.
fn services(ns: &str, backends: &[&Named]) -> String {
    backends
        .iter()
        .map(|b| service(ns, b.name, ("http", 8080), b.backend.addr.port()))
        .collect()
}

/// A Service `name` with one port (`port_name`, `port`) and its
/// EndpointSlice: loopback on `target`.
fn service(ns: &str, name: &str, (port_name, port): (&str, u16), target: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec: {{ ports: [{{ name: {port_name}, port: {port} }}] }}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: {name}-1, namespace: {ns}, labels: {{ kubernetes.io/service-name: {name} }} }}\n\
         ports: [{{ name: {port_name}, port: {target} }}]\nendpoints: [{{ addresses: [\"127.0.0.1\"] }}]\n---\n"
    )
}

/// Runs the import on `yaml`: exit code, configuration, statuses.
fn import(yaml: &str, extra: &[&str]) -> (i32, String, String) {
    import_in(&tempfile::tempdir().unwrap(), yaml, extra)
}

/// As `import`, in `dir` (where the certificates are written).
fn import_in(dir: &tempfile::TempDir, yaml: &str, extra: &[&str]) -> (i32, String, String) {
    let input = dir.path().join("resources.yaml");
    std::fs::write(&input, yaml).unwrap();
    let output = dir.path().join("cutover.toml");
    let out = Command::new(BIN)
        .args(["import", "gateway-api"])
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .args(extra)
        .output()
        .expect("run cutover import");
    let config = std::fs::read_to_string(&output).unwrap_or_default();
    let statuses = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.code() != Some(1),
        "import failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), config, statuses)
}

/// Serves an imported configuration on ephemeral loopback ports.
fn serve(config: &str) -> Gateway {
    serve_in(tempfile::tempdir().unwrap(), config)
}

/// As `serve`, from `dir` (where the import wrote the certificates).
fn serve_in(dir: tempfile::TempDir, config: &str) -> Gateway {
    let mut text = String::new();
    for line in config.lines() {
        // The listeners (on every address) and the admin API; the 500
        // listener keeps the loopback address its upstream names.
        if line.starts_with("bind = \"0.0.0.0:") || line == "bind = \"127.0.0.1:9190\"" {
            text.push_str("bind = \"127.0.0.1:0\"\n");
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    Gateway::start_in(dir, &text)
}

/// `method path` with `Host: host` and `headers` on a new connection:
/// status, headers, body.
async fn ask(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, hyper::HeaderMap, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", host);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (status, headers, body) = send(addr, req.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("gateway answers");
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// Host, method, path, headers, and the backend (or status) expected.
type Case<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)], &'a str);

fn gateway(listeners: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{ name: cutover }}\nspec: {{ controllerName: cutover.dev/gateway }}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: gw, namespace: {NS} }}\nspec:\n  gatewayClassName: cutover\n  listeners:\n{listeners}\n---\n"
    )
}

fn route(name: &str, ns: &str, spec: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n{spec}\n---\n"
    )
}

/// The gateway run on `folder`'s resources (`run --gateway-api --watch`),
/// its listeners on loopback.
fn watch_folder(folder: &std::path::Path, extra: &[&str]) -> Gateway {
    let folder = folder.to_str().unwrap();
    let mut args = vec![
        "--gateway-api",
        folder,
        "--gateway-api-address",
        "127.0.0.1",
        "--watch",
    ];
    args.extend_from_slice(extra);
    Gateway::start_args("# written by --gateway-api\n", &args)
}

/// Which backend answered (its first body line), or the status.
fn who(answer: &(u16, hyper::HeaderMap, String)) -> String {
    match answer.0 {
        200 => answer.2.lines().next().unwrap_or_default().to_owned(),
        status => status.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matches_hostnames_and_precedence_route_as_the_conformance_tests_expect() {
    let (v1, v2, v3) = (named("v1").await, named("v2").await, named("v3").await);
    let listeners = [
        "  - { name: plain, port: 80, protocol: HTTP }",
        "  - { name: specific, port: 80, protocol: HTTP, hostname: very.specific.com }",
        "  - { name: wild, port: 80, protocol: HTTP, hostname: \"*.wildcard.io\" }",
    ]
    .join("\n");
    let yaml = [
        gateway(&listeners),
        services(NS, &[&v1, &v2, &v3]),
        // HTTPRoutePathMatchOrder, HTTPRouteExactPathMatching.
        route("order", NS, r#"  parentRefs: [{ name: gw, sectionName: plain }]
  rules:
  - { matches: [{ path: { type: Exact, value: /match } }], backendRefs: [{ name: v1, port: 8080 }] }
  - { matches: [{ path: { type: Exact, value: /match/exact } }], backendRefs: [{ name: v2, port: 8080 }] }
  - { matches: [{ path: { type: PathPrefix, value: /match/ } }], backendRefs: [{ name: v3, port: 8080 }] }
  - { matches: [{ path: { type: PathPrefix, value: /match/prefix/ } }], backendRefs: [{ name: v1, port: 8080 }] }
  - { matches: [{ path: { type: PathPrefix, value: /match/prefix/one } }], backendRefs: [{ name: v2, port: 8080 }] }"#),
        // HTTPRouteHeaderMatching, HTTPRouteQueryParamMatching,
        // HTTPRouteMethodMatching, HTTPRouteMatching (several matches
        // in one rule are ORed; the parts of one match are ANDed).
        route("heads", NS, r#"  parentRefs: [{ name: gw, sectionName: plain }]
  rules:
  - matches: [{ path: { type: PathPrefix, value: /h }, headers: [{ name: version, value: one }] }]
    backendRefs: [{ name: v1, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /h }, headers: [{ name: version, value: two }, { name: color, value: orange }] }]
    backendRefs: [{ name: v2, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /q }, queryParams: [{ name: animal, value: whale }] }, { path: { type: PathPrefix, value: /q }, queryParams: [{ name: color, type: RegularExpression, value: "^(red|blue)$" }] }]
    backendRefs: [{ name: v3, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /m }, method: POST }]
    backendRefs: [{ name: v1, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /m } }]
    backendRefs: [{ name: v2, port: 8080 }]"#),
        // HTTPRouteHostnameIntersection, HTTPRouteListenerHostnameMatching.
        route("hosts-specific", NS, r#"  parentRefs: [{ name: gw, sectionName: specific }, { name: gw, sectionName: wild }]
  hostnames: [very.specific.com, foo.wildcard.io, "*.specific.com"]
  rules: [{ matches: [{ path: { type: PathPrefix, value: /s1 } }], backendRefs: [{ name: v1, port: 8080 }] }]"#),
        route("hosts-wild", NS, r#"  parentRefs: [{ name: gw, sectionName: wild }]
  hostnames: ["*.wildcard.io"]
  rules: [{ matches: [{ path: { type: PathPrefix, value: /s2 } }], backendRefs: [{ name: v2, port: 8080 }] }]"#),
        route("hosts-none", NS, r#"  parentRefs: [{ name: gw, sectionName: specific }]
  hostnames: [non.matching.com]
  rules: [{ matches: [{ path: { type: PathPrefix, value: /s5 } }], backendRefs: [{ name: v3, port: 8080 }] }]"#),
        // HTTPRouteMatchingAcrossRoutes: two routes, the same hostname;
        // the older route wins a tie.
        route("across-a", NS, r#"  parentRefs: [{ name: gw, sectionName: plain }]
  hostnames: [example.com]
  rules: [{ matches: [{ path: { type: PathPrefix, value: /across } }], backendRefs: [{ name: v1, port: 8080 }] }]"#)
            .replace("name: across-a, namespace", "name: across-a, creationTimestamp: \"2024-01-01T00:00:00Z\", namespace"),
        route("across-b", NS, r#"  parentRefs: [{ name: gw, sectionName: plain }]
  hostnames: [example.com]
  rules:
  - { matches: [{ path: { type: PathPrefix, value: /across } }], backendRefs: [{ name: v2, port: 8080 }] }
  - { matches: [{ path: { type: PathPrefix, value: /across }, headers: [{ name: x-b, value: "1" }] }], backendRefs: [{ name: v3, port: 8080 }] }"#)
            .replace("name: across-b, namespace", "name: across-b, creationTimestamp: \"2023-01-01T00:00:00Z\", namespace"),
    ]
    .concat();
    let (code, config, statuses) = import(&yaml, &[]);
    // `hosts-none` intersects no listener: the import says so, exit 2.
    assert_eq!(code, 2, "{statuses}");
    assert!(
        statuses.contains("reason: NoMatchingListenerHostname"),
        "{statuses}"
    );
    let gw = serve(&config);
    let at = gw.listener("http-80");
    let cases: &[Case] = &[
        // path match order
        ("any.test", "GET", "/match", &[], "v1"),
        ("any.test", "GET", "/match/exact", &[], "v2"),
        ("any.test", "GET", "/match/exact/one", &[], "v3"),
        ("any.test", "GET", "/match/prefix/one/any", &[], "v2"),
        ("any.test", "GET", "/match/prefix/any", &[], "v1"),
        ("any.test", "GET", "/match/any", &[], "v3"),
        // a prefix matches by path element
        ("any.test", "GET", "/matchless", &[], "404"),
        ("any.test", "GET", "/match/prefix/onex", &[], "v1"),
        // headers (names case-insensitive), AND within a match
        ("any.test", "GET", "/h", &[("Version", "one")], "v1"),
        (
            "any.test",
            "GET",
            "/h",
            &[("version", "two"), ("color", "orange")],
            "v2",
        ),
        ("any.test", "GET", "/h", &[("version", "two")], "404"),
        ("any.test", "GET", "/h", &[], "404"),
        // query parameters, OR across matches
        ("any.test", "GET", "/q?animal=whale", &[], "v3"),
        ("any.test", "GET", "/q?color=blue&x=1", &[], "v3"),
        ("any.test", "GET", "/q?color=green", &[], "404"),
        // methods: the match with one wins
        ("any.test", "POST", "/m", &[], "v1"),
        ("any.test", "GET", "/m", &[], "v2"),
        ("any.test", "DELETE", "/m/x", &[], "v2"),
        // hostnames
        ("very.specific.com", "GET", "/s1", &[], "v1"),
        ("very.specific.com:1234", "GET", "/s1", &[], "v1"),
        ("foo.wildcard.io", "GET", "/s1", &[], "v1"),
        ("bar.wildcard.io", "GET", "/s1", &[], "404"),
        ("non.matching.com", "GET", "/s1", &[], "404"),
        ("foo.wildcard.io", "GET", "/s2", &[], "v2"),
        ("foo.bar.wildcard.io", "GET", "/s2", &[], "v2"),
        ("wildcard.io", "GET", "/s2", &[], "404"),
        ("very.specific.com", "GET", "/s2", &[], "404"),
        ("non.matching.com", "GET", "/s5", &[], "404"),
        // across routes: more headers first, then the older route
        ("example.com", "GET", "/across", &[], "v2"),
        ("example.com", "GET", "/across", &[("x-b", "1")], "v3"),
    ];
    let mut wrong = Vec::new();
    for (host, method, path, headers, expected) in cases {
        let got = who(&ask(at, method, host, path, headers).await);
        if got != *expected {
            wrong.push(format!(
                "{method} {host}{path} {headers:?}: {got}, expected {expected}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}\n{config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_reach_the_backend_and_the_client() {
    let (v1, v2, mirror) = (named("v1").await, named("v2").await, named("mirror").await);
    let broken = crate::harness::failing_backend().await;
    let yaml = [
        gateway("  - { name: http, port: 80, protocol: HTTP }"),
        services(NS, &[&v1, &v2, &mirror]),
        service(NS, "broken", ("http", 8080), broken.addr.port()),
        route("filters", NS, r#"  parentRefs: [{ name: gw }]
  rules:
  # HTTPRouteRequestHeaderModifier, HTTPRouteResponseHeaderModifier
  - matches: [{ path: { type: PathPrefix, value: /headers } }]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: { set: [{ name: X-Set, value: "set {literally}" }], add: [{ name: x-add, value: added }], remove: [x-remove] }
    - type: ResponseHeaderModifier
      responseHeaderModifier: { set: [{ name: x-answer, value: "yes" }], remove: [x-from-backend] }
    backendRefs: [{ name: v1, port: 8080 }]
  # HTTPRouteRewritePath, HTTPRouteRewriteHost
  - matches: [{ path: { type: PathPrefix, value: /prefix/one } }]
    filters: [{ type: URLRewrite, urlRewrite: { hostname: rewritten.test, path: { type: ReplacePrefixMatch, replacePrefixMatch: /one } } }]
    backendRefs: [{ name: v1, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /strip } }]
    filters: [{ type: URLRewrite, urlRewrite: { path: { type: ReplacePrefixMatch, replacePrefixMatch: / } } }]
    backendRefs: [{ name: v1, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /full } }]
    filters: [{ type: URLRewrite, urlRewrite: { path: { type: ReplaceFullPath, replaceFullPath: /one } } }]
    backendRefs: [{ name: v1, port: 8080 }]
  # HTTPRoute303Redirect … 308, HTTPRouteRedirectHostAndStatus,
  # HTTPRouteRedirectPath, HTTPRouteRedirectScheme, HTTPRouteRedirectPort
  - matches: [{ path: { type: PathPrefix, value: /r303 } }]
    filters: [{ type: RequestRedirect, requestRedirect: { statusCode: 303, hostname: example.org } }]
  - matches: [{ path: { type: PathPrefix, value: /r307 } }]
    filters: [{ type: RequestRedirect, requestRedirect: { statusCode: 307, hostname: example.net } }]
  - matches: [{ path: { type: PathPrefix, value: /r308 } }]
    filters: [{ type: RequestRedirect, requestRedirect: { statusCode: 308, scheme: https, port: 8443 } }]
  - matches: [{ path: { type: PathPrefix, value: /old } }]
    filters: [{ type: RequestRedirect, requestRedirect: { hostname: example.org, path: { type: ReplacePrefixMatch, replacePrefixMatch: /new } } }]
  - matches: [{ path: { type: Exact, value: /moved } }]
    filters: [{ type: RequestRedirect, requestRedirect: { statusCode: 301, path: { type: ReplaceFullPath, replaceFullPath: /here } } }]
  # HTTPRouteCORS
  - matches: [{ path: { type: PathPrefix, value: /cors } }]
    filters: [{ type: CORS, cors: { allowOrigins: ["https://app.example", "https://*.example.org"], allowMethods: [GET, PUT], allowHeaders: [x-a], maxAge: 60 } }]
    backendRefs: [{ name: v1, port: 8080 }]
  # HTTPRouteRetry: a 500 from one backend is retried on the other
  - matches: [{ path: { type: PathPrefix, value: /retry } }]
    retry: { codes: [500], attempts: 1 }
    backendRefs: [{ name: v1, port: 8080 }, { name: broken, port: 8080 }]
  # HTTPRouteRequestMirror
  - matches: [{ path: { type: PathPrefix, value: /mirror } }]
    filters: [{ type: RequestMirror, requestMirror: { backendRef: { name: mirror, port: 8080 } } }]
    backendRefs: [{ name: v2, port: 8080 }]"#),
    ]
    .concat();
    let (code, config, statuses) = import(&yaml, &[]);
    assert_eq!(code, 0, "{statuses}");
    let gw = serve(&config);
    let at = gw.listener("http-80");

    let (status, headers, body) = ask(
        at,
        "GET",
        "a.test",
        "/headers",
        &[("x-remove", "1"), ("x-add", "client")],
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("x-set: set {literally}\n"), "{body}");
    assert!(
        body.contains("x-add: client\n") && body.contains("x-add: added\n"),
        "{body}"
    );
    assert!(!body.contains("x-remove"), "{body}");
    assert_eq!(
        headers.get("x-answer").map(|v| v.to_str().unwrap()),
        Some("yes")
    );
    assert!(headers.get("x-from-backend").is_none());

    let line = |body: &str| body.lines().nth(1).unwrap_or_default().to_owned();
    let (_, _, body) = ask(at, "GET", "a.test", "/prefix/one/two?x=1", &[]).await;
    assert_eq!(line(&body), "GET /one/two?x=1");
    assert!(body.contains("host: rewritten.test\n"), "{body}");
    let (_, _, body) = ask(at, "GET", "a.test", "/prefix/one", &[]).await;
    assert_eq!(line(&body), "GET /one");
    let (_, _, body) = ask(at, "GET", "a.test", "/strip/x/y", &[]).await;
    assert_eq!(line(&body), "GET /x/y");
    let (_, _, body) = ask(at, "GET", "a.test", "/strip", &[]).await;
    assert_eq!(line(&body), "GET /");
    let (_, _, body) = ask(at, "GET", "a.test", "/full/a/b", &[]).await;
    assert_eq!(line(&body), "GET /one");

    let location = |a: &(u16, hyper::HeaderMap, String)| {
        (
            a.0,
            a.1.get("location")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default(),
        )
    };
    for (path, status, to) in [
        ("/r303/x", 303, "http://example.org/r303/x"),
        ("/r307?a=b", 307, "http://example.net/r307?a=b"),
        ("/r308", 308, "https://a.test:8443/r308"),
        ("/old/page?q=1", 302, "http://example.org/new/page?q=1"),
        ("/old", 302, "http://example.org/new"),
        ("/moved", 301, "http://a.test/here"),
    ] {
        assert_eq!(
            location(&ask(at, "GET", "a.test", path, &[]).await),
            (status, to.to_owned()),
            "{path}"
        );
    }

    // CORS: a preflight from an allowed origin (exact and by wildcard),
    // and from another.
    let preflight = |origin: &'static str| async move {
        let headers = [("origin", origin), ("access-control-request-method", "PUT")];
        ask(at, "OPTIONS", "a.test", "/cors", &headers).await
    };
    for origin in ["https://app.example", "https://eu.example.org"] {
        let (status, headers, _) = preflight(origin).await;
        assert_eq!(status, 204);
        assert_eq!(headers.get("access-control-allow-origin").unwrap(), origin);
        assert_eq!(headers.get("access-control-max-age").unwrap(), "60");
    }
    let (_, headers, _) = preflight("https://evil.test").await;
    assert!(headers.get("access-control-allow-origin").is_none());

    // Retry: every request answered by v1, half after a 500 from
    // `broken`.
    for _ in 0..20 {
        assert_eq!(who(&ask(at, "GET", "a.test", "/retry", &[]).await), "v1");
    }

    for _ in 0..5 {
        assert_eq!(who(&ask(at, "GET", "a.test", "/mirror", &[]).await), "v2");
    }
    for _ in 0..100 {
        if mirror.seen.load(Ordering::Relaxed) == 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(mirror.seen.load(Ordering::Relaxed), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_weights_and_missing_backends() {
    let (v1, v2, v3) = (named("v1").await, named("v2").await, named("v3").await);
    let grant = |from_ns: &str, to_ns: &str, name: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {{ name: g-{from_ns}, namespace: {to_ns} }}\nspec:\n  from: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: {from_ns} }}]\n  to: [{{ group: \"\", kind: Service, name: {name} }}]\n---\n"
        )
    };
    let yaml = [
        gateway("  - { name: http, port: 80, protocol: HTTP, allowedRoutes: { namespaces: { from: All } } }"),
        services("backends", &[&v1, &v2, &v3]),
        grant("apps", "backends", "v1"),
        // HTTPRouteCrossNamespace, HTTPRouteReferenceGrant
        route("granted", "apps", "  parentRefs: [{ name: gw, namespace: infra }]\n  rules: [{ matches: [{ path: { type: PathPrefix, value: /granted } }], backendRefs: [{ name: v1, namespace: backends, port: 8080 }] }]"),
        // HTTPRouteInvalidCrossNamespaceBackendRef
        // HTTPRoutePartiallyInvalidViaInvalidReferenceGrant: one rule
        // refused (500), the other served.
        route("refused", "apps", "  parentRefs: [{ name: gw, namespace: infra }]\n  rules:\n  - { matches: [{ path: { type: PathPrefix, value: /refused } }], backendRefs: [{ name: v2, namespace: backends, port: 8080 }] }\n  - { matches: [{ path: { type: PathPrefix, value: /partly } }], backendRefs: [{ name: v1, namespace: backends, port: 8080 }] }"),
        // HTTPRouteInvalidNonExistentBackendRef, HTTPRouteInvalidBackendRefUnknownKind, HTTPRouteNoBackendRefs
        route("missing", "apps", "  parentRefs: [{ name: gw, namespace: infra }]\n  rules:\n  - { matches: [{ path: { type: PathPrefix, value: /missing } }], backendRefs: [{ name: nothing, port: 8080 }] }\n  - { matches: [{ path: { type: PathPrefix, value: /none } }] }"),
        route("kind", "apps", "  parentRefs: [{ name: gw, namespace: infra }]\n  rules: [{ matches: [{ path: { type: PathPrefix, value: /kind } }], backendRefs: [{ group: example.com, kind: Bucket, name: b }] }]"),
        // A rule with one valid and one unresolved reference: half its
        // requests answered 500 (the invalid share), half served.
        route("half", "backends", "  parentRefs: [{ name: gw, namespace: infra }]\n  rules: [{ matches: [{ path: { type: PathPrefix, value: /half } }], backendRefs: [{ name: v3, port: 8080 }, { name: nothing, port: 8080 }] }]"),
        // HTTPRouteWeight: 70/30/0
        route("weights", "backends", "  parentRefs: [{ name: gw, namespace: infra }]\n  rules: [{ matches: [{ path: { type: PathPrefix, value: /weights } }], backendRefs: [{ name: v1, port: 8080, weight: 70 }, { name: v2, port: 8080, weight: 30 }, { name: v3, port: 8080, weight: 0 }] }]"),
    ]
    .concat();
    let invalid = crate::harness::closed_port().to_string();
    let (code, config, statuses) = import(&yaml, &["--invalid-address", &invalid]);
    assert_eq!(code, 2);
    for reason in ["RefNotPermitted", "BackendNotFound", "InvalidKind"] {
        assert!(
            statuses.contains(&format!("reason: {reason}")),
            "{reason}: {statuses}"
        );
    }
    let gw = serve(&config);
    let at = gw.listener("http-80");
    assert_eq!(who(&ask(at, "GET", "a.test", "/granted", &[]).await), "v1");
    assert_eq!(who(&ask(at, "GET", "a.test", "/partly", &[]).await), "v1");
    for path in ["/refused", "/missing", "/kind", "/none"] {
        assert_eq!(
            who(&ask(at, "GET", "a.test", path, &[]).await),
            "500",
            "{path}"
        );
    }
    let mut half: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..200 {
        *half
            .entry(who(&ask(at, "GET", "a.test", "/half", &[]).await))
            .or_default() += 1;
    }
    let served = half.get("v3").copied().unwrap_or(0);
    assert_eq!(
        served + half.get("500").copied().unwrap_or(0),
        200,
        "{half:?}"
    );
    assert!((70..=130).contains(&served), "{half:?}");
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..1000 {
        *counts
            .entry(who(&ask(at, "GET", "a.test", "/weights", &[]).await))
            .or_default() += 1;
    }
    let v1 = counts.get("v1").copied().unwrap_or(0);
    let v2 = counts.get("v2").copied().unwrap_or(0);
    assert_eq!(v1 + v2, 1000, "{counts:?}");
    // The conformance test allows 5 % either way.
    assert!((650..=750).contains(&v1), "{counts:?}");
}

#[test]
fn the_status_is_printed_and_unreadable_input_exits_1() {
    let out = Command::new(BIN)
        .args(["import", "gateway-api", "/nonexistent/resources.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: [unclosed").unwrap();
    let out = Command::new(BIN)
        .args(["import", "gateway-api"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not YAML"));
}

/// `count` HTTPRoutes `r0`… on listener `http`, each `/rN` to `v1`, but
/// route `moved` to `v2`.
fn many_routes(count: usize, moved: Option<usize>) -> String {
    (0..count)
        .map(|i| {
            let backend = if Some(i) == moved { "v2" } else { "v1" };
            route(
                &format!("r{i}"),
                NS,
                &format!("  parentRefs: [{{ name: gw }}]\n  rules: [{{ matches: [{{ path: {{ type: PathPrefix, value: /r{i} }} }}], backendRefs: [{{ name: {backend}, port: 8080 }}] }}]"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_folder_becomes_generations_one_route_at_a_time() {
    let (v1, v2) = (named("v1").await, named("v2").await);
    let port = crate::harness::closed_port().port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("settings.toml"),
        "[admin]\nbind = \"127.0.0.1:0\"\n[runtime]\nworker_threads = 1\n",
    )
    .unwrap();
    let resources = |moved: Option<usize>| {
        [
            gateway(&format!(
                "  - {{ name: http, port: {port}, protocol: HTTP }}"
            )),
            services(NS, &[&v1, &v2]),
            many_routes(200, moved),
        ]
        .concat()
    };
    // As a ConfigMap update does: a new file renamed over the old one.
    let replace = |text: &str| {
        let tmp = dir.path().join(".resources.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.path().join("resources.yaml")).unwrap();
    };
    replace(&resources(None));
    let gw = watch_folder(dir.path(), &[]);
    let at = gw.listener(&format!("http-{port}"));
    assert_eq!(who(&ask(at, "GET", "a.test", "/r7", &[]).await), "v1");
    assert!(
        gw.logs().contains("Gateway API resources imported"),
        "{}",
        gw.logs()
    );

    // One route changed: one generation, one upstream modified.
    replace(&resources(Some(7)));
    gw.wait_generation(2).await;
    assert_eq!(who(&ask(at, "GET", "a.test", "/r7", &[]).await), "v2");
    assert_eq!(who(&ask(at, "GET", "a.test", "/r8", &[]).await), "v1");
    let (_, history) =
        crate::harness::admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
    let op = history["operations"]
        .as_array()
        .and_then(|ops| ops.iter().find(|op| op["kind"] == "reload"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(op["requested_by"], "watch", "{op}");
    assert_eq!(op["summary"], "+0 -0 ~1", "{op}");

    // Resources that cannot be read change nothing, and say why.
    replace("kind: [unclosed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gw.logs().contains("cannot be imported") {
        assert!(std::time::Instant::now() < deadline, "{}", gw.logs());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(gw.active_generation().await, 2);
    assert_eq!(who(&ask(at, "GET", "a.test", "/r7", &[]).await), "v2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_example_imports_its_configmap_and_serves_it() {
    let docs = crate::examples::yaml_documents(
        "examples/kubernetes/gateway-api",
        &["deployment.yaml", "kustomization.yaml", "routes.yaml"],
    );
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["args"],
        serde_json::json!([
            "run",
            "-c",
            "/var/lib/cutover/cutover.toml",
            "--gateway-api",
            "/etc/cutover/gateway-api",
            "--cluster-service=default/*",
            "--watch"
        ])
    );
    let mounts = container["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().all(|m| m.get("subPath").is_none()));
    let kustomization = docs
        .iter()
        .find(|d| d["kind"] == "Kustomization")
        .expect("a Kustomization");
    assert_eq!(
        kustomization["configMapGenerator"][0]["files"],
        serde_json::json!(["settings.toml", "routes.yaml"])
    );

    // The folder as the pod sees it, on loopback ports.
    let example = crate::harness::workspace().join("examples/kubernetes/gateway-api");
    let dir = tempfile::tempdir().unwrap();
    let port = crate::harness::closed_port().port();
    let routes = std::fs::read_to_string(example.join("routes.yaml"))
        .unwrap()
        .replace(
            "port: 8080\n      protocol: HTTP",
            &format!("port: {port}\n      protocol: HTTP"),
        );
    std::fs::write(dir.path().join("routes.yaml"), routes).unwrap();
    let settings = std::fs::read_to_string(example.join("settings.toml"))
        .unwrap()
        .replace("127.0.0.1:9190", "127.0.0.1:0")
        .replace("0.0.0.0:9191", "127.0.0.1:0")
        .replace("state_dir = \"/var/lib/cutover/state\"\n", "");
    std::fs::write(dir.path().join("settings.toml"), settings).unwrap();
    let gw = watch_folder(dir.path(), &["--cluster-service=default/*"]);
    let at = gw.listener(&format!("http-{port}"));
    let (status, headers, _) =
        ask(at, "GET", "shop.example.com", "/catalog/shoes?size=9", &[]).await;
    assert_eq!(status, 301);
    assert_eq!(
        headers.get("location").unwrap(),
        "http://shop.example.com/products/shoes?size=9"
    );
    // Every route accepted: nothing but the import's summary logged.
    let logs = gw.logs();
    assert!(logs.contains("Gateway API resources imported"), "{logs}");
    assert!(!logs.contains("Gateway API route condition"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_tls_passthrough_and_udp_routes_relay_to_their_backends() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let ca = crate::pki::ca("gateway api l4");
    let api = crate::l4::tls_identity_backend(&ca, "api").await;
    let db = crate::l4::tls_identity_backend(&ca, "db").await;
    let (echo, _echo_task) = crate::harness::echo_server().await;
    let udp = crate::l4::udp_echo("u").await;
    let (tls_port, tcp_port, udp_port) = (
        crate::harness::closed_port().port(),
        crate::harness::closed_port().port(),
        crate::harness::closed_port().port(),
    );
    let service =
        |name: &str, addr: SocketAddr, _protocol: &str| service(NS, name, ("p", 1), addr.port());
    let l4_route = |kind: &str, name: &str, section: &str, extra: &str, backend: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: {kind}\nmetadata: {{ name: {name}, namespace: {NS} }}\nspec:\n  parentRefs: [{{ name: gw, sectionName: {section} }}]\n{extra}  rules: [{{ backendRefs: [{{ name: {backend}, port: 1 }}] }}]\n---\n"
        )
    };
    let yaml = [
        gateway(&[
            format!("  - {{ name: tls, port: {tls_port}, protocol: TLS, tls: {{ mode: Passthrough }} }}"),
            format!("  - {{ name: tcp, port: {tcp_port}, protocol: TCP }}"),
            format!("  - {{ name: udp, port: {udp_port}, protocol: UDP }}"),
        ]
        .join("\n")),
        service("api", api, "TCP"),
        service("db", db, "TCP"),
        service("echo", echo, "TCP"),
        service("dgram", udp, "UDP"),
        // GATEWAY-TLS: passthrough by SNI, wildcard hostnames.
        l4_route("TLSRoute", "api", "tls", "  hostnames: [api.example.com]\n", "api"),
        l4_route("TLSRoute", "db", "tls", "  hostnames: [\"*.db.example.com\", db.example.com]\n", "db"),
        // GATEWAY-TCP; the UDP listener.
        l4_route("TCPRoute", "relay", "tcp", "", "echo"),
        l4_route("UDPRoute", "dgram", "udp", "", "dgram"),
        // A TCPRoute on an HTTP-less TLS listener: not allowed there.
        l4_route("TCPRoute", "misplaced", "tls", "", "echo"),
    ]
    .concat();
    let (code, config, statuses) = import(&yaml, &[]);
    assert_eq!(code, 2, "{statuses}");
    assert_eq!(
        statuses.matches("reason: NotAllowedByListeners").count(),
        1,
        "{statuses}"
    );
    let gw = serve(&config);

    let tls = gw.listener(&format!("tls-{tls_port}"));
    for (name, expected) in [
        ("api.example.com", "api"),
        ("db.example.com", "db"),
        ("eu.db.example.com", "db"),
    ] {
        let (_, greeting) = crate::l4::connect_tls(tls, &ca, name)
            .await
            .unwrap_or_else(|| panic!("{name}: closed\n{config}"));
        assert_eq!(greeting, expected, "{name}");
    }
    // A name no TLSRoute serves: closed, never relayed.
    assert!(crate::l4::connect_tls(tls, &ca, "other.example.com")
        .await
        .is_none());

    let mut tcp = tokio::net::TcpStream::connect(gw.listener(&format!("tcp-{tcp_port}")))
        .await
        .unwrap();
    tcp.write_all(b"hello").await.unwrap();
    let mut back = [0u8; 5];
    tcp.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"hello");

    let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let to = gw.listener(&format!("udp-{udp_port}"));
    client.send_to(b"ping", to).await.unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client.recv_from(&mut buf),
    )
    .await
    .expect("a datagram back")
    .unwrap();
    assert_eq!(&buf[..n], b"u:ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_routes_match_methods_and_metadata_over_h2c() {
    use crate::grpc::{connect, msg, unary, GrpcBackend};

    let gold = GrpcBackend::start(None).await;
    let plain = GrpcBackend::start(None).await;
    let service = |name: &str, addr: SocketAddr| service(NS, name, ("grpc", 50051), addr.port());
    let yaml = [
        gateway("  - { name: http, port: 80, protocol: HTTP }"),
        service("gold", gold.addr),
        service("plain", plain.addr),
        // GRPCRouteExactMethodMatching, GRPCRouteHeaderMatching.
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: { name: echo, namespace: infra }\nspec:\n  parentRefs: [{ name: gw }]\n  rules:\n  - matches: [{ method: { service: test.Echo, method: Unary }, headers: [{ name: x-tier, value: gold }] }]\n    backendRefs: [{ name: gold, port: 50051 }]\n  - matches: [{ method: { service: test.Echo } }]\n    backendRefs: [{ name: plain, port: 50051 }]\n---\n".to_owned(),
    ]
    .concat();
    let (code, config, statuses) = import(&yaml, &[]);
    assert_eq!(code, 0, "{statuses}");
    assert!(config.contains("protocol = \"h2c\""), "{config}");
    let gw = serve(&config);
    let mut client = connect(gw.listener("http-80")).await;
    let mut request = tonic::Request::new(msg("hello"));
    request
        .metadata_mut()
        .insert("x-tier", "gold".parse().unwrap());
    assert_eq!(
        unary(&mut client, request).await.unwrap().into_inner().text,
        "hello"
    );
    assert_eq!((gold.calls(), plain.calls()), (1, 0));
    let request = tonic::Request::new(msg("again"));
    assert_eq!(
        unary(&mut client, request).await.unwrap().into_inner().text,
        "again"
    );
    assert_eq!((gold.calls(), plain.calls()), (1, 1));
}

/// GET `path` over TLS to `name` (SNI and Host), trusting `ca`.
async fn https_get(
    at: SocketAddr,
    ca: &crate::pki::Ca,
    name: &str,
    path: &str,
) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(at)
        .await
        .map_err(|e| e.to_string())?;
    let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let tls = crate::pki::connector(ca, &[b"http/1.1"])
        .connect(server_name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let mut sender = crate::harness::h1_over(tls)
        .await
        .map_err(|e| e.to_string())?;
    let req = Request::builder()
        .uri(path)
        .header("host", name)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_listeners_serve_secrets_their_reference_grants_allow() {
    use base64::Engine as _;

    let v1 = named("v1").await;
    let ca = crate::pki::ca("gateway api https");
    let secret = |ns: &str, name: &str, host: &str| {
        let (cert, key) = crate::pki::server_leaf(&ca, &[host]);
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{ name: {name}, namespace: {ns} }}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n---\n",
            b64(&cert),
            b64(&key)
        )
    };
    let port = crate::harness::closed_port().port();
    let listeners = [
        format!("  - {{ name: own, port: {port}, protocol: HTTPS, hostname: secure.example.com, tls: {{ certificateRefs: [{{ name: site }}] }} }}"),
        format!("  - {{ name: granted, port: {port}, protocol: HTTPS, hostname: shared.example.com, tls: {{ certificateRefs: [{{ name: shared, namespace: certs }}] }} }}"),
        format!("  - {{ name: refused, port: {port}, protocol: HTTPS, hostname: other.example.com, tls: {{ certificateRefs: [{{ name: other, namespace: certs }}] }} }}"),
    ]
    .join("\n");
    let yaml = [
        gateway(&listeners),
        services(NS, &[&v1]),
        secret(NS, "site", "secure.example.com"),
        secret("certs", "shared", "shared.example.com"),
        secret("certs", "other", "other.example.com"),
        // GatewaySecretReferenceGrantSpecific: `shared` only.
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: { name: gw-certs, namespace: certs }\nspec:\n  from: [{ group: gateway.networking.k8s.io, kind: Gateway, namespace: infra }]\n  to: [{ group: \"\", kind: Secret, name: shared }]\n---\n".to_owned(),
        // HTTPRouteHTTPSListener
        route("web", NS, "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]"),
    ]
    .concat();
    let dir = tempfile::tempdir().unwrap();
    let (code, config, statuses) = import_in(&dir, &yaml, &[]);
    // GatewaySecretMissingReferenceGrant: the third listener.
    assert_eq!(code, 2, "{statuses}");
    assert_eq!(
        statuses.matches("reason: RefNotPermitted").count(),
        1,
        "{statuses}"
    );
    assert!(config.contains("protocol = \"https\""), "{config}");
    let key = dir.path().join("gateway-api-secrets/infra-site.key");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let gw = serve_in(dir, &config);
    let at = gw.listener(&format!("https-{port}"));
    assert_eq!(
        https_get(at, &ca, "secure.example.com", "/").await.unwrap(),
        "v1"
    );
    assert_eq!(
        https_get(at, &ca, "shared.example.com", "/").await.unwrap(),
        "v1"
    );
    // No listener serves other.example.com: no certificate for it.
    assert!(https_get(at, &ca, "other.example.com", "/").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_tls_policy_makes_the_gateway_verify_its_backend() {
    let ca = crate::pki::ca("gateway api backend tls");
    let (backend, _task) = crate::tls::tls_backend(&ca, "secure.backend.test").await;
    let indented: String = ca.pem.lines().map(|l| format!("    {l}\n")).collect();
    let yaml = [
        gateway("  - { name: http, port: 80, protocol: HTTP }"),
        service(NS, "secure", ("https", 443), backend.port()),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: backend-ca, namespace: {NS} }}\ndata:\n  ca.crt: |\n{indented}---\n"
        ),
        // BackendTLSPolicy: TLS to `secure`, verified for its name.
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{ name: secure-tls, namespace: {NS} }}\nspec:\n  targetRefs: [{{ group: \"\", kind: Service, name: secure }}]\n  validation:\n    caCertificateRefs: [{{ group: \"\", kind: ConfigMap, name: backend-ca }}]\n    hostname: secure.backend.test\n---\n"
        ),
        route("tls", NS, "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: secure, port: 443 }] }]"),
        // A kind of the API's group the import does not read: said.
        "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: BackendLBPolicy\nmetadata: { name: extra, namespace: infra }\nspec: {}\n---\n".to_owned(),
    ]
    .concat();
    let dir = tempfile::tempdir().unwrap();
    let (code, config, statuses) = import_in(&dir, &yaml, &[]);
    // Exit 2 for the BackendLBPolicy alone.
    assert_eq!(code, 2, "{statuses}");
    assert!(!statuses.contains("status: \"False\""), "{statuses}");
    assert!(config.contains("protocol = \"https\""), "{config}");
    assert!(
        config.contains("server_name = \"secure.backend.test\""),
        "{config}"
    );
    let gw = serve_in(dir, &config);
    let (status, _, body) = ask(gw.listener("http-80"), "GET", "a.test", "/", &[]).await;
    assert_eq!((status, body.as_str()), (200, "tls HTTP/1.1"));

    // The wrong name: the gateway refuses the backend's certificate.
    let wrong = yaml.replace(
        "hostname: secure.backend.test",
        "hostname: other.backend.test",
    );
    let dir = tempfile::tempdir().unwrap();
    let (_, config, _) = import_in(&dir, &wrong, &[]);
    let gw = serve_in(dir, &config);
    let (status, _, _) = ask(gw.listener("http-80"), "GET", "a.test", "/", &[]).await;
    assert_eq!(status, 502);
}

//! The import's semantics, each against the Gateway API rule it holds.

use std::collections::BTreeSet;
use std::path::Path;

use base64::Engine as _;

use super::matches::intersect;
use super::*;

const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: gw, namespace: infra }
spec:
  gatewayClassName: cutover
  listeners:
  - { name: http, port: 80, protocol: HTTP, allowedRoutes: { namespaces: { from: Same } } }
  - { name: shop, port: 80, protocol: HTTP, hostname: "*.shop.test", allowedRoutes: { namespaces: { from: All } } }
  - { name: other, port: 8080, protocol: HTTP, hostname: "api.test" }
---
apiVersion: v1
kind: Service
metadata: { name: v1, namespace: infra }
spec: { ports: [{ name: http, port: 8080 }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: v1-x, namespace: infra, labels: { kubernetes.io/service-name: v1 } }
ports: [{ name: http, port: 9001 }]
endpoints: [{ addresses: ["127.0.0.1"] }, { addresses: ["127.0.0.2"] }]
---
apiVersion: v1
kind: Service
metadata: { name: v2, namespace: infra }
spec: { ports: [{ name: http, port: 8080 }] }
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: { name: v2-x, namespace: infra, labels: { kubernetes.io/service-name: v2 } }
ports: [{ name: http, port: 9002 }]
endpoints: [{ addresses: ["127.0.0.3"] }]
"#;

fn import(routes: &str) -> Imported {
    try_import(routes).unwrap_or_else(|e| panic!("{e}"))
}

fn try_import(routes: &str) -> Result<Imported, String> {
    let mut resources = Vec::new();
    resources::parse(
        &format!("{GATEWAY}\n---\n{routes}"),
        Path::new("t.yaml"),
        &mut resources,
    )?;
    import_resources(&resources, &Options::default())
}

/// The condition of `kind` of route `name` under its first parent.
fn condition(imported: &Imported, name: &str, kind: &str) -> (bool, String) {
    let route = imported
        .routes
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no status for {name}"));
    let c = route.parents[0]
        .condition(kind)
        .unwrap_or_else(|| panic!("{name}: no {kind}: {route:?}"));
    (c.status, c.reason.clone())
}

fn route(name: &str, body: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name}, namespace: infra }}\nspec:\n{body}\n---\n"
    )
}

/// Every `[[routes]]` block's lines, in order.
fn blocks(config: &str) -> Vec<String> {
    config
        .split("[[routes]]\n")
        .skip(1)
        .map(|b| b.split("\n\n").next().unwrap_or_default().to_owned())
        // Listener isolation's catch-alls (their own test).
        .filter(|b| !b.starts_with("name = \"gateway-api-isolation-"))
        .collect()
}

#[test]
fn hostnames_intersect_as_the_spec_says() {
    let set = |items: &[&str]| -> BTreeSet<Option<String>> {
        items.iter().map(|s| Some((*s).to_owned())).collect()
    };
    let route = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    // Neither names one: any host.
    assert_eq!(intersect(None, &[]), [None].into_iter().collect());
    // The listener's alone, the route's alone.
    assert_eq!(intersect(Some("a.test"), &[]), set(&["a.test"]));
    assert_eq!(intersect(None, &route(&["a.test"])), set(&["a.test"]));
    // Specific in wildcard, wildcard over specific, two wildcards.
    assert_eq!(
        intersect(
            Some("*.wildcard.io"),
            &route(&["foo.wildcard.io", "very.specific.com"])
        ),
        set(&["foo.wildcard.io"])
    );
    assert_eq!(
        intersect(Some("very.specific.com"), &route(&["*.specific.com"])),
        set(&["very.specific.com"])
    );
    assert_eq!(
        intersect(
            Some("*.anotherwildcard.io"),
            &route(&["*.anotherwildcard.io"])
        ),
        set(&["*.anotherwildcard.io"])
    );
    assert_eq!(
        intersect(Some("*.io"), &route(&["*.wildcard.io"])),
        set(&["*.wildcard.io"])
    );
    // A wildcard never covers its bare suffix.
    assert!(intersect(Some("*.wildcard.io"), &route(&["wildcard.io"])).is_empty());
    assert!(intersect(Some("a.test"), &route(&["b.test"])).is_empty());
}

#[test]
fn parents_listeners_and_hostnames_give_the_standard_reasons() {
    let imported = import(&[
        route("ok", "  parentRefs: [{ name: gw, sectionName: http }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]"),
        route("no-gateway", "  parentRefs: [{ name: nope }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]"),
        route("no-section", "  parentRefs: [{ name: gw, sectionName: nope }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]"),
        route("no-port", "  parentRefs: [{ name: gw, port: 81 }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]"),
        route("no-host", "  parentRefs: [{ name: gw, sectionName: shop }]\n  hostnames: [other.test]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]"),
        route("kind", "  parentRefs: [{ name: gw, kind: Service, group: \"\" }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]"),
    ].concat());
    assert_eq!(
        condition(&imported, "ok", "Accepted"),
        (true, "Accepted".into())
    );
    assert_eq!(
        condition(&imported, "ok", "ResolvedRefs"),
        (true, "ResolvedRefs".into())
    );
    for name in ["no-gateway", "no-section", "no-port", "kind"] {
        assert_eq!(
            condition(&imported, name, "Accepted"),
            (false, "NoMatchingParent".into()),
            "{name}"
        );
    }
    assert_eq!(
        condition(&imported, "no-host", "Accepted"),
        (false, "NoMatchingListenerHostname".into())
    );
    assert!(!imported.all_accepted());
    // Only the accepted route is served.
    assert!(imported.config.contains("name = \"infra_ok_"));
    assert!(!imported.config.contains("no-gateway"));
    let listeners = &imported.gateways[0].listeners;
    assert_eq!(listeners[0].attached, 1, "{listeners:?}");
}

#[test]
fn a_listener_takes_routes_only_from_the_namespaces_it_allows() {
    let other = |name: &str, section: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: {name}, namespace: apps }}\nspec:\n  parentRefs: [{{ name: gw, namespace: infra, sectionName: {section} }}]\n  hostnames: [a.shop.test]\n  rules: [{{ backendRefs: [{{ name: v1, namespace: infra, port: 8080 }}] }}]\n---\n"
        )
    };
    let imported = import(&format!(
        "{}{}",
        other("same", "http"),
        other("all", "shop")
    ));
    assert_eq!(
        condition(&imported, "same", "Accepted"),
        (false, "NotAllowedByListeners".into())
    );
    assert_eq!(
        condition(&imported, "all", "Accepted"),
        (true, "Accepted".into())
    );
    // Across namespaces without a ReferenceGrant: refused, answered 500.
    assert_eq!(
        condition(&imported, "all", "ResolvedRefs"),
        (false, "RefNotPermitted".into())
    );
    assert!(imported.config.contains("respond = { status = 500 }"));
    let grant = "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: { name: g, namespace: infra }\nspec:\n  from: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps }]\n  to: [{ group: \"\", kind: Service, name: v1 }]\n---\n";
    let imported = import(&format!("{grant}{}", other("all", "shop")));
    assert_eq!(
        condition(&imported, "all", "ResolvedRefs"),
        (true, "ResolvedRefs".into())
    );
    assert!(imported.config.contains("127.0.0.1:9001"));
}

#[test]
fn backends_resolve_to_ready_endpoints_or_say_why_not() {
    let imported = import(&[
        route("missing", "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: v9, port: 8080 }] }]"),
        route("kind", "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: v1, kind: Bucket, group: example.com }] }]"),
        route("port", "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: v1, port: 7 }] }]"),
        route("none", "  parentRefs: [{ name: gw }]\n  rules: [{ matches: [{ path: { type: Exact, value: /none } }] }]"),
    ].concat());
    assert_eq!(
        condition(&imported, "missing", "ResolvedRefs"),
        (false, "BackendNotFound".into())
    );
    assert_eq!(
        condition(&imported, "kind", "ResolvedRefs"),
        (false, "InvalidKind".into())
    );
    assert_eq!(
        condition(&imported, "port", "ResolvedRefs"),
        (false, "BackendNotFound".into())
    );
    // No backendRefs: accepted, and answered 500 (the spec's rule).
    assert_eq!(
        condition(&imported, "none", "ResolvedRefs"),
        (true, "ResolvedRefs".into())
    );
    // Three routes of one match (every path) and one of `/none`, on the
    // three listeners they attach to: the alphabetically first of the
    // three takes every path (the API's tie-breaker), so 2 × 3 answers.
    let blocks = blocks(&imported.config);
    assert_eq!(blocks.len(), 6, "{}", imported.config);
    assert!(blocks
        .iter()
        .all(|b| b.contains("respond = { status = 500 }")));
    assert!(blocks.iter().any(|b| b.contains("infra_kind_")));
    assert!(!blocks
        .iter()
        .any(|b| b.contains("infra_missing_") || b.contains("infra_port_")));
    // With `--services dns`, an absent Service is its cluster name only
    // when the cluster is said to have it (by name or its namespace);
    // otherwise nothing vouches for it and it is not found.
    let mut resources = Vec::new();
    resources::parse(
        &format!("{GATEWAY}\n---\n{}", route("missing", "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: v9, port: 8080 }] }]")),
        Path::new("t.yaml"),
        &mut resources,
    )
    .unwrap();
    let dns = |known: &[&str]| {
        let options = Options {
            services: Services::Dns,
            cluster_services: known.iter().map(|s| (*s).to_owned()).collect(),
            ..Options::default()
        };
        import_resources(&resources, &options).unwrap()
    };
    for known in [&["infra/v9"][..], &["infra/*"]] {
        let imported = dns(known);
        assert!(
            imported
                .config
                .contains("dns = \"v9.infra.svc.cluster.local:8080\""),
            "{}",
            imported.config
        );
        assert!(imported.all_accepted(), "{}", imported.status_yaml());
    }
    for known in [&[][..], &["infra/v8", "other/*"]] {
        let imported = dns(known);
        assert!(
            !imported.config.contains("svc.cluster.local"),
            "{}",
            imported.config
        );
        let statuses = imported.status_yaml();
        assert!(statuses.contains("BackendNotFound"), "{statuses}");
        assert!(
            statuses.contains("no --cluster-service names it"),
            "{statuses}"
        );
    }
}

#[test]
fn weights_are_shares_of_services_not_of_endpoints() {
    // v1 has two endpoints, v2 one: 3:1 between the services.
    let imported = import(&route(
        "w",
        "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080, weight: 3 }, { name: v2, port: 8080, weight: 1 }, { name: v2, port: 8080, weight: 0 }] }]",
    ));
    assert!(imported.config.contains("policy = \"weighted\""));
    assert!(imported.config.contains(
        "backends = [{ addr = \"127.0.0.1:9001\", weight = 1000 }, { addr = \"127.0.0.2:9001\", weight = 1000 }, { addr = \"127.0.0.3:9002\", weight = 667 }]"
    ), "{}", imported.config);
    // Every weight zero: 500.
    let imported = import(&route(
        "zero",
        "  parentRefs: [{ name: gw }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080, weight: 0 }] }]",
    ));
    assert!(imported.config.contains("respond = { status = 500 }"));
}

#[test]
fn rules_are_written_in_the_apis_precedence_with_prefixes_by_path_element() {
    let imported = import(&route(
        "order",
        r#"  parentRefs: [{ name: gw, sectionName: http }]
  rules:
  - matches: [{ path: { type: PathPrefix, value: /match/ } }]
    backendRefs: [{ name: v1, port: 8080 }]
  - matches: [{ path: { type: Exact, value: /match } }]
    backendRefs: [{ name: v2, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /match }, method: POST }]
    backendRefs: [{ name: v2, port: 8080 }]
  - matches: [{ path: { type: PathPrefix, value: /match }, headers: [{ name: X-A, value: "*" }, { name: x-a, value: ignored }] }]
    backendRefs: [{ name: v2, port: 8080 }]"#,
    ));
    let blocks = blocks(&imported.config);
    let paths: Vec<String> = blocks
        .iter()
        .map(|b| {
            b.lines()
                .filter(|l| {
                    l.starts_with("path_") || l.starts_with("methods") || l.starts_with("headers")
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(
        paths,
        [
            // The Exact rule wins /match over every prefix's exact part.
            "path_exact = \"/match\"",
            // Then the prefix with a method, its POST only.
            "path_prefix = \"/match/\" methods = [\"POST\"]",
            // The prefix with a header; an exact "*" is not "present".
            "path_exact = \"/match\" headers = { \"x-a\" = '~^\\*$' }",
            "path_prefix = \"/match/\" headers = { \"x-a\" = '~^\\*$' }",
            // The plain prefix: /match/ for every method POST left.
            "path_prefix = \"/match/\" methods = [\"GET\", \"HEAD\", \"PUT\", \"DELETE\", \"CONNECT\", \"OPTIONS\", \"TRACE\", \"PATCH\"]",
        ],
        "{}",
        imported.config
    );
}

#[test]
fn filters_become_route_edits_and_redirects() {
    let imported = import(&route(
        "f",
        r#"  parentRefs: [{ name: gw, sectionName: http }]
  rules:
  - matches: [{ path: { type: PathPrefix, value: /api } }]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: { set: [{ name: X-Env, value: "a {b}" }], add: [{ name: x-add, value: "1" }], remove: [X-Drop] }
    - type: ResponseHeaderModifier
      responseHeaderModifier: { set: [{ name: x-answer, value: "yes" }] }
    - type: URLRewrite
      urlRewrite: { hostname: internal.test, path: { type: ReplacePrefixMatch, replacePrefixMatch: /v2 } }
    backendRefs: [{ name: v1, port: 8080 }]
    timeouts: { request: 10s, backendRequest: 1500ms }
  - matches: [{ path: { type: PathPrefix, value: /old } }]
    filters:
    - type: RequestRedirect
      requestRedirect: { scheme: https, hostname: new.test, port: 8443, statusCode: 301, path: { type: ReplacePrefixMatch, replacePrefixMatch: / } }"#,
    ));
    let config = &imported.config;
    assert!(config.contains("request_headers = { remove = [\"x-drop\"], set = { \"x-env\" = \"a {{b}}\" }, add = { \"x-add\" = \"1\" } }"), "{config}");
    assert!(config.contains("response_headers = { set = { \"x-answer\" = \"yes\" } }"));
    assert!(config.contains("host_rewrite = \"internal.test\""));
    assert!(config.contains("rewrite = { regex = [\"^.*$\", \"/v2\"] }"));
    assert!(config.contains("rewrite = { regex = [\"^/api/(.*)$\", \"/v2/${1}\"] }"));
    assert!(config.contains("timeout = \"1500ms\""));
    assert!(config.contains("redirect = { scheme = \"https\", host = \"new.test\", port = 8443, status = 301, path = \"/\" }"), "{config}");
    assert!(config.contains("redirect = { scheme = \"https\", host = \"new.test\", port = 8443, status = 301, replace_prefix = \"/\" }"));
    assert!(imported.all_accepted());
}

#[test]
fn an_unsupported_field_is_reported_and_its_route_not_served() {
    let imported = import(&route(
        "u",
        r#"  parentRefs: [{ name: gw, sectionName: http }]
  rules:
  - backendRefs: [{ name: v1, port: 8080 }]
    sessionPersistence: { type: Cookie }
    filters: [{ type: ExtensionRef, extensionRef: { group: x, kind: y, name: z } }]"#,
    ));
    let status = &imported.routes[0].parents[0];
    let accepted = status.condition("Accepted").unwrap();
    assert!(!accepted.status);
    assert_eq!(accepted.reason, "UnsupportedValue");
    assert!(accepted.message.contains("ExtensionRef"), "{accepted:?}");
    assert!(!imported.config.contains("name = \"infra_u_"));
    // The YAML status names both.
    let yaml = imported.status_yaml();
    assert!(yaml.contains("reason: UnsupportedValue"), "{yaml}");
}

#[test]
fn kinds_and_protocols_not_imported_are_reported() {
    let imported = import(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: tls, namespace: infra }\nspec:\n  gatewayClassName: cutover\n  listeners: [{ name: terminate, port: 443, protocol: TLS }, { name: https, port: 8443, protocol: HTTPS }, { name: tcp, port: 5432, protocol: TCP, allowedRoutes: { kinds: [{ kind: HTTPRoute }] } }]\n---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: { name: db, namespace: infra }\nspec:\n  parentRefs: [{ name: tls, sectionName: terminate }]\n  rules: [{ backendRefs: [{ name: v1, port: 8080 }] }]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: { name: rpc, namespace: infra }\nspec:\n  parentRefs: [{ name: gw }]\n",
    );
    let tls = imported.gateways.iter().find(|g| g.name == "tls").unwrap();
    let reasons: Vec<&str> = tls
        .listeners
        .iter()
        .map(|l| {
            l.conditions
                .iter()
                .find(|c| !c.status)
                .map_or("", |c| c.reason.as_str())
        })
        .collect();
    // Terminating TLS: not imported; HTTPS without a certificate; a TCP
    // listener asked to take HTTPRoutes: not a kind it serves.
    assert_eq!(
        reasons,
        [
            "UnsupportedProtocol",
            "InvalidCertificateRef",
            "InvalidRouteKinds"
        ]
    );
    // The only listener it names is not accepted.
    assert_eq!(
        condition(&imported, "db", "Accepted"),
        (false, "NoMatchingParent".into())
    );
    // A GRPCRoute on an HTTP listener: served.
    assert_eq!(
        condition(&imported, "rpc", "Accepted"),
        (true, "Accepted".into())
    );
    assert!(!imported.all_accepted());
}

#[test]
fn a_gateway_class_selects_gateways() {
    let mut resources = Vec::new();
    resources::parse(GATEWAY, Path::new("t.yaml"), &mut resources).unwrap();
    let options = Options {
        gateway_class: Some("another".into()),
        ..Options::default()
    };
    let imported = import_resources(&resources, &options).unwrap();
    assert_eq!(imported.counts.gateways, 0);
    assert!(!imported.config.contains("[[listeners]]"));
}

#[test]
fn a_route_attached_to_two_gateways_is_served_on_both() {
    // HTTPRouteMultipleGateways: each Gateway's listener serves it.
    let imported = import(
        &[
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: gw2, namespace: infra }\nspec:\n  gatewayClassName: cutover\n  listeners: [{ name: http, port: 81, protocol: HTTP }]\n---\n".to_owned(),
            route("both", "  parentRefs: [{ name: gw, sectionName: http }, { name: gw2 }]\n  rules: [{ matches: [{ path: { type: Exact, value: /both } }], backendRefs: [{ name: v1, port: 8080 }] }]"),
        ]
        .concat(),
    );
    let both = &imported.routes[0];
    assert_eq!(both.parents.len(), 2);
    assert!(both
        .parents
        .iter()
        .all(|p| p.conditions.iter().all(|c| c.status)));
    let blocks = blocks(&imported.config);
    let listeners: Vec<&str> = blocks
        .iter()
        .filter(|b| b.contains("infra_both_"))
        .filter_map(|b| b.lines().find(|l| l.starts_with("listeners = ")))
        .collect();
    assert_eq!(
        listeners,
        ["listeners = [\"http-80\"]", "listeners = [\"http-81\"]"]
    );
}

#[test]
fn a_folder_is_read_without_its_hidden_files() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: a }\nspec: {}\n";
    std::fs::write(dir.path().join("a.yaml"), gateway).unwrap();
    // A write not yet renamed into place, as an editor or a ConfigMap
    // update leaves for a moment.
    std::fs::write(
        dir.path().join(".a.yaml.tmp"),
        gateway.replace("name: a", "name: b"),
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not YAML: {").unwrap();
    let found = resources::read(&[dir.path().to_path_buf()]).unwrap();
    let names: Vec<&str> = found.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a"]);
}

fn listener_condition(
    imported: &Imported,
    gateway: &str,
    listener: &str,
    kind: &str,
) -> (bool, String) {
    let l = imported
        .gateways
        .iter()
        .find(|g| g.name == gateway)
        .and_then(|g| g.listeners.iter().find(|l| l.name == listener))
        .unwrap_or_else(|| panic!("no listener {gateway}/{listener}"));
    let c = l.conditions.iter().find(|c| c.kind == kind).unwrap();
    (c.status, c.reason.clone())
}

#[test]
fn two_gateways_never_share_a_port_they_each_get_an_address() {
    let gw2 = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: gw2, namespace: infra, creationTimestamp: \"2030-01-01T00:00:00Z\" }\nspec:\n  gatewayClassName: cutover\n  listeners: [{ name: http, port: 80, protocol: HTTP }]\n";
    // One address for both: the newer Gateway's port 80 is taken.
    let imported = import(gw2);
    assert_eq!(
        listener_condition(&imported, "gw2", "http", "Accepted"),
        (false, "PortUnavailable".into())
    );
    assert_eq!(
        listener_condition(&imported, "gw", "http", "Accepted"),
        (true, "Accepted".into())
    );
    // Each its own address: both served, on listeners of their own.
    let mut resources = Vec::new();
    resources::parse(
        &format!("{GATEWAY}\n---\n{gw2}"),
        Path::new("t.yaml"),
        &mut resources,
    )
    .unwrap();
    let options = Options {
        gateway_addresses: [("infra/gw2".to_owned(), "10.0.0.2".to_owned())].into(),
        ..Options::default()
    };
    let imported = import_resources(&resources, &options).unwrap();
    assert_eq!(
        listener_condition(&imported, "gw2", "http", "Accepted"),
        (true, "Accepted".into())
    );
    assert!(
        imported.config.contains("bind = \"0.0.0.0:80\""),
        "{}",
        imported.config
    );
    assert!(
        imported.config.contains("bind = \"10.0.0.2:80\""),
        "{}",
        imported.config
    );
    let gw2_status = imported.gateways.iter().find(|g| g.name == "gw2").unwrap();
    assert_eq!(gw2_status.addresses, ["10.0.0.2"]);
    // spec.addresses (an IP) is where a Gateway listens; another type is
    // not accepted.
    let named = gw2.replace(
        "  listeners:",
        "  addresses: [{ type: Hostname, value: lb.example }]\n  listeners:",
    );
    let imported = import(&named);
    let g = imported.gateways.iter().find(|g| g.name == "gw2").unwrap();
    assert!(g
        .conditions
        .iter()
        .any(|c| c.kind == "Accepted" && !c.status && c.reason == "UnsupportedAddress"));
    assert!(!imported.config.contains(
        "name = \"http-80\"\nbind = \"0.0.0.0:80\"\n\n[[listeners]]\nname = \"http-80\""
    ));
}

#[test]
fn client_certificates_are_demanded_or_the_listener_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["secure.test".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{ name: site, namespace: infra }}\ntype: kubernetes.io/tls\ndata: {{ tls.crt: {}, tls.key: {} }}\n",
        b64(&cert.pem()),
        b64(&key.serialize_pem())
    );
    let ca = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: clients, namespace: infra }}\ndata:\n  ca.crt: |\n{}",
        cert.pem().lines().map(|l| format!("    {l}\n")).collect::<String>()
    );
    let gateway = |validation: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: secure, namespace: infra }}\nspec:\n  gatewayClassName: cutover\n  tls: {{ frontend: {{ default: {{ validation: {validation} }} }} }}\n  listeners: [{{ name: https, port: 443, protocol: HTTPS, tls: {{ certificateRefs: [{{ name: site }}] }} }}]\n"
        )
    };
    let run = |validation: &str| {
        let mut resources = Vec::new();
        let text = format!("{secret}---\n{ca}---\n{}", gateway(validation));
        resources::parse(&text, Path::new("t.yaml"), &mut resources).unwrap();
        let options = Options {
            base_dir: Some(dir.path().to_path_buf()),
            ..Options::default()
        };
        import_resources(&resources, &options).unwrap()
    };
    // A CA it reads: the listener demands client certificates.
    let imported = run("{ caCertificateRefs: [{ kind: ConfigMap, group: \"\", name: clients }] }");
    assert!(
        imported
            .config
            .contains("tls.client_ca = \"gateway-api-secrets/client-ca-infra-secure-default.crt\""),
        "{}",
        imported.config
    );
    assert!(!imported.config.contains("client_auth"));
    // AllowInsecureFallback: said on the Gateway, and written as such.
    let imported = run("{ mode: AllowInsecureFallback, caCertificateRefs: [{ kind: ConfigMap, group: \"\", name: clients }] }");
    assert!(imported
        .config
        .contains("tls.client_auth = \"insecure_fallback\""));
    assert!(imported.gateways[0]
        .conditions
        .iter()
        .any(|c| c.kind == "InsecureFrontendValidationMode" && c.status));
    // A CA it cannot read: the listener is not served at all (never
    // served without the check it asks for).
    for (validation, reason) in [
        ("{ caCertificateRefs: [{ kind: ConfigMap, group: \"\", name: missing }] }", "InvalidCACertificateRef"),
        ("{ caCertificateRefs: [{ kind: Secret, group: \"\", name: site }] }", "InvalidCACertificateKind"),
        ("{ caCertificateRefs: [{ kind: ConfigMap, group: \"\", name: clients, namespace: other }] }", "RefNotPermitted"),
    ] {
        let imported = run(validation);
        assert_eq!(listener_condition(&imported, "secure", "https", "ResolvedRefs"), (false, reason.into()));
        assert_eq!(listener_condition(&imported, "secure", "https", "Accepted"), (false, "NoValidCACertificate".into()));
        assert!(!imported.config.contains("[[listeners]]"), "{}", imported.config);
    }
}

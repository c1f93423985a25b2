//! `cutover import gateway-api` (issue 59): reading and importing 1 000
//! HTTPRoutes (each with two matches, a header modifier and two weighted
//! Services with their EndpointSlices), the configuration it writes
//! validated as cutover validates every configuration. Target: ≤ 1 s.
//!
//! Run: `cargo bench --bench gateway_api`.

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::Criterion;
use cutover::gatewayapi::{import_resources, resources, Options};

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn manifests(routes: usize) -> String {
    let mut out = String::from(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: gw, namespace: infra }\nspec:\n  gatewayClassName: cutover\n  listeners:\n  - { name: http, port: 80, protocol: HTTP, allowedRoutes: { namespaces: { from: All } } }\n---\n",
    );
    for i in 0..routes {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Service\nmetadata: {{ name: svc{i}, namespace: team{t} }}\nspec: {{ ports: [{{ name: http, port: 8080 }}] }}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{ name: svc{i}-a, namespace: team{t}, labels: {{ kubernetes.io/service-name: svc{i} }} }}\n\
             ports: [{{ name: http, port: 8080 }}]\nendpoints: [{{ addresses: [\"10.{a}.{b}.1\"] }}, {{ addresses: [\"10.{a}.{b}.2\"] }}]\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: route{i}, namespace: team{t} }}\nspec:\n\
             \x20 parentRefs: [{{ name: gw, namespace: infra }}]\n\
             \x20 hostnames: [app{i}.example.com]\n\
             \x20 rules:\n\
             \x20 - matches: [{{ path: {{ type: PathPrefix, value: /api }} }}, {{ path: {{ type: Exact, value: /health }}, method: GET }}]\n\
             \x20   filters: [{{ type: RequestHeaderModifier, requestHeaderModifier: {{ set: [{{ name: x-team, value: team{t} }}] }} }}]\n\
             \x20   backendRefs: [{{ name: svc{i}, port: 8080, weight: 90 }}, {{ name: svc{j}, port: 8080, weight: 10 }}]\n---\n",
            t = i % 20,
            a = i / 250,
            b = i % 250,
            j = if i % 20 == i { i } else { i - 20 },
        );
    }
    out
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let text = manifests(1000);
    let options = Options::default();
    let import = || {
        let mut found = Vec::new();
        resources::parse(&text, Path::new("bench.yaml"), &mut found).map_err(|e| e.to_string())?;
        import_resources(&found, &options)
    };
    // Once, to show what it makes (and that every route is accepted).
    let started = Instant::now();
    match import() {
        Ok(imported) => println!(
            "1 000 HTTPRoutes: {} cutover routes, {} upstreams, all accepted: {}, {:.0} ms (first run)",
            imported.counts.cutover_routes,
            imported.counts.upstreams,
            imported.all_accepted(),
            started.elapsed().as_secs_f64() * 1000.0
        ),
        Err(e) => {
            println!("the import failed: {e}");
            return;
        }
    }
    c.bench_function("import/1000_httproutes", |b| b.iter(|| black_box(import())));
    c.final_summary();
}

//! Route matching at 10, 1 000, 10 000 and 100 000 routes, generation
//! build at 10, 1 000 and 10 000.
//!
//! Compares the cost of one `Router::route` lookup (hosts, wildcards,
//! prefixes and regexes mixed, the request matching a route near the end
//! of its group) and of `plan::validate` + `generation::build` as the
//! configuration grows, and the build of one upstream of 1 000 backends
//! weighted 1–1 000. Run: `cargo bench --bench routing`.

mod common;

use std::hint::black_box;
use std::sync::Arc;

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cutover::config::ConfigText;
use cutover::generation::{build, RequestHead, SharedState};
use cutover::ids::GenerationId;
use http::{HeaderMap, Method};

/// A configuration with `n` routes: see `common::mixed_config`.
fn config(n: usize) -> String {
    common::mixed_config(n, 0)
}

fn bench_route_match(c: &mut Criterion) {
    let mut group = c.benchmark_group("route_match");
    for n in [10usize, 1_000, 10_000, 100_000] {
        let text = ConfigText::inline(config(n), ".".into(), "<bench>");
        let spec = Arc::new(cutover::plan::validate(&text).expect("bench config validates"));
        let generation = build(spec, GenerationId::FIRST, &SharedState::default()).expect("builds");
        let router = generation.router("web").expect("web router");
        let headers = HeaderMap::new();
        let last_prefix = (n - 1) - ((n - 1) % 4) + 2;
        let last_regex = (n - 4) / 4 * 4 + 3;
        let cases = [
            (
                "exact_host",
                "svc0.example.com".to_owned(),
                "/api/0/users".to_owned(),
            ),
            (
                "wildcard",
                format!("a.tenant{}.example.com", 1),
                "/x".to_owned(),
            ),
            (
                "hostless_prefix",
                "unknown.test".to_owned(),
                format!("/static/{}/app.js", last_prefix.min(n - 1)),
            ),
            (
                "regex",
                format!("re{}.example.com", last_regex),
                format!("/items/12345/{last_regex}/0"),
            ),
            (
                "miss",
                "unknown.test".to_owned(),
                "/nothing/here".to_owned(),
            ),
        ];
        let head = RequestHead {
            method: &Method::GET,
            headers: &headers,
            query: None,
        };
        let routed = router.route(
            Some(&format!("re{last_regex}.example.com")),
            &format!("/items/12345/{last_regex}/0"),
            &head,
        );
        assert!(routed.is_some(), "the regex case matches its route");
        for (name, host, path) in cases {
            group.bench_with_input(
                BenchmarkId::new(name, n),
                &(host, path),
                |b, (host, path)| b.iter(|| black_box(router.route(Some(host), path, &head))),
            );
        }
    }
    group.finish();
}

fn bench_generation_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("generation_build");
    group.sample_size(10);
    for n in [10usize, 1_000, 10_000] {
        let text = ConfigText::inline(config(n), ".".into(), "<bench>");
        let shared = SharedState::default();
        // The active generation, as in a running gateway: it holds the
        // compiled regexes the candidate's plan finds in the memo.
        let _active = build(
            Arc::new(cutover::plan::validate(&text).expect("validates")),
            GenerationId(1),
            &shared,
        )
        .expect("builds");
        group.bench_with_input(
            BenchmarkId::new("validate_and_build", n),
            &text,
            |b, text| {
                b.iter(|| {
                    let spec = Arc::new(cutover::plan::validate(text).expect("validates"));
                    black_box(build(spec, GenerationId(2), &shared).expect("builds"))
                })
            },
        );
    }
    // Cold: every regex is new to the process (a first activation).
    for n in [1_000usize, 10_000] {
        let shared = SharedState::default();
        let mut salt = 0u64;
        group.bench_function(BenchmarkId::new("validate_and_build_cold", n), |b| {
            b.iter_batched(
                || {
                    salt += 1;
                    ConfigText::inline(common::mixed_config(n, salt), ".".into(), "<bench>")
                },
                |text| {
                    let spec = Arc::new(cutover::plan::validate(&text).expect("validates"));
                    black_box(build(spec, GenerationId(2), &shared).expect("builds"))
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

/// One upstream of 1 000 backends weighted 1–1 000 (the weighted
/// schedule's worst case before it stopped unrolling the cycle).
fn weighted_config() -> String {
    let backends: Vec<String> = (1..=1000)
        .map(|i| {
            format!(
                "{{ addr = \"10.0.{}.{}:8080\", weight = {i} }}",
                i / 250,
                i % 250
            )
        })
        .collect();
    format!(
        r#"[admin]
bind = "127.0.0.1:0"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "all"
listeners = ["web"]
upstream = "big"

[upstreams.big]
policy = "weighted"
backends = [{}]
"#,
        backends.join(", ")
    )
}

fn bench_weighted_upstream(c: &mut Criterion) {
    let mut group = c.benchmark_group("weighted_upstream");
    group.sample_size(10);
    let text = ConfigText::inline(weighted_config(), ".".into(), "<bench>");
    let shared = SharedState::default();
    group.bench_function("validate_and_build_1000_backends_weights_1_to_1000", |b| {
        b.iter(|| {
            let spec = Arc::new(cutover::plan::validate(&text).expect("validates"));
            black_box(build(spec, GenerationId(2), &shared).expect("builds"))
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    bench_route_match,
    bench_generation_build,
    bench_weighted_upstream
);
criterion_main!(benches);

//! Admission pinning and configuration diffs.
//!
//! - `pin`: `Admission::pin` (`ArcSwap::load_full` plus the in-flight
//!   guard) against an `RwLock<Arc<_>>` read-and-clone baseline doing the
//!   same counting, single-threaded and with two threads pinning at once.
//! - `diff`: typed diff plus unified text diff of two 1 000-route
//!   configurations that differ in 1 % of their routes.
//! - `control_plane_10000_routes_16_retained`: validate and preview of a
//!   10 000-route candidate whose middle half is rewritten, and the
//!   history view, with 16 generations of that size retained.
//! - `impact`: live impact (DESIGN §22) of a candidate over 10 000
//!   sampled request heads with 10 000 routes (`common::mixed_config`:
//!   exact hosts, wildcards, host-less prefixes, regexes), every route
//!   moved to another upstream: the candidate's routers built and every
//!   head routed through both generations.
//!
//! Run: `cargo bench --bench control`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cutover::admission::Admission;
use cutover::config::ConfigText;
use cutover::generation::{build, Generation, SharedState};
use cutover::ids::GenerationId;
use cutover::runtime::GenerationStore;

mod common;

fn config(routes: usize, timeout_of: impl Fn(usize) -> u32) -> String {
    let mut out = String::from("[admin]\nbind = \"127.0.0.1:0\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n");
    for i in 0..routes {
        out.push_str(&format!(
            "[[routes]]\nname = \"r{i}\"\nlisteners = [\"web\"]\nhosts = [\"svc{i}.example.com\"]\npath_prefix = \"/api/\"\nupstream = \"u{}\"\ntimeout = \"{}s\"\n\n",
            i % 100,
            timeout_of(i)
        ));
    }
    for u in 0..100 {
        out.push_str(&format!(
            "[upstreams.u{u}]\nbackends = [{{ addr = \"127.0.0.1:{}\" }}]\n\n",
            20000 + u
        ));
    }
    out
}

fn generation(routes: usize) -> Generation {
    let text = ConfigText::inline(config(routes, |_| 30), ".".into(), "<bench>");
    let spec = Arc::new(cutover::plan::validate(&text).expect("valid"));
    build(spec, GenerationId::FIRST, &SharedState::default()).expect("builds")
}

/// The baseline: what pinning costs with a lock instead of arc-swap.
struct Locked {
    current: RwLock<Arc<Generation>>,
    inflight: AtomicU64,
}

impl Locked {
    fn pin(&self) -> (Arc<Generation>, &AtomicU64) {
        let generation = Arc::clone(&self.current.read().expect("not poisoned"));
        self.inflight.fetch_add(1, Ordering::Relaxed);
        (generation, &self.inflight)
    }
}

fn bench_pin(c: &mut Criterion) {
    let store = Arc::new(GenerationStore::new(generation(10)));
    let admission = Admission::new(Arc::clone(&store));
    let locked = Arc::new(Locked {
        current: RwLock::new(Arc::new(generation(10))),
        inflight: AtomicU64::new(0),
    });
    let mut group = c.benchmark_group("pin");
    group.bench_function("arc_swap/1_thread", |b| {
        b.iter(|| black_box(admission.pin()))
    });
    group.bench_function("rwlock/1_thread", |b| {
        b.iter(|| {
            let (generation, inflight) = locked.pin();
            black_box(&generation);
            inflight.fetch_sub(1, Ordering::Relaxed);
        })
    });
    // Two threads pinning at once: the cost per pin under contention.
    let contended = |pin: Arc<dyn Fn() + Send + Sync>| {
        move |iters: u64| {
            let started = Instant::now();
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let pin = Arc::clone(&pin);
                    std::thread::spawn(move || (0..iters).for_each(|_| pin()))
                })
                .collect();
            threads.into_iter().for_each(|t| t.join().expect("thread"));
            started.elapsed() / 2
        }
    };
    let a = admission.clone();
    let arc_swap_pin: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        black_box(a.pin());
    });
    group.bench_function("arc_swap/2_threads", |b| {
        b.iter_custom(contended(Arc::clone(&arc_swap_pin)))
    });
    let l = Arc::clone(&locked);
    let rwlock_pin: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let (generation, inflight) = l.pin();
        black_box(&generation);
        inflight.fetch_sub(1, Ordering::Relaxed);
    });
    group.bench_function("rwlock/2_threads", |b| {
        b.iter_custom(contended(Arc::clone(&rwlock_pin)))
    });
    group.finish();
}

fn bench_diff(c: &mut Criterion) {
    let before = ConfigText::inline(config(1000, |_| 30), ".".into(), "<bench>");
    let after = ConfigText::inline(
        config(1000, |i| if i % 100 == 0 { 5 } else { 30 }),
        ".".into(),
        "<bench>",
    );
    let a = cutover::plan::validate(&before).expect("valid");
    let b = cutover::plan::validate(&after).expect("valid");
    let mut group = c.benchmark_group("diff");
    group.measurement_time(Duration::from_secs(5));
    group.bench_with_input(BenchmarkId::new("typed_and_text", 1000), &(), |bench, _| {
        bench.iter(|| {
            black_box(cutover::plan::diff(
                &a.file,
                &a.canonical,
                "generation 1",
                &b.file,
                &b.canonical,
            ))
        })
    });
    group.finish();
}

/// What an activation does in the process before its swap: plan the
/// candidate against the active generation (validate + typed and text
/// diff) and build the next generation; the candidate changes one route's
/// timeout in 100. Binding (no new listeners here) and the CAS are
/// negligible next to it.
fn bench_activation(c: &mut Criterion) {
    let mut group = c.benchmark_group("activation");
    group.sample_size(10);
    for routes in [1_000usize, 10_000] {
        let active_text = ConfigText::inline(config(routes, |_| 30), ".".into(), "<bench>");
        let active = cutover::plan::validate(&active_text).expect("valid");
        let candidate = ConfigText::inline(
            config(routes, |i| if i % 100 == 0 { 5 } else { 30 }),
            ".".into(),
            "<bench>",
        );
        let shared = SharedState::default();
        let _warm = build(Arc::new(active.clone()), GenerationId::FIRST, &shared).expect("builds");
        group.bench_with_input(
            BenchmarkId::new("plan_and_build", routes),
            &candidate,
            |b, candidate| {
                b.iter(|| {
                    let plan = cutover::plan::plan(candidate, Some((GenerationId::FIRST, &active)));
                    let spec = plan.spec.expect("activatable");
                    black_box(build(spec, GenerationId(2), &shared).expect("builds"))
                })
            },
        );
    }
    group.finish();
}

/// A control plane whose active configuration has `routes` routes and
/// whose history retains `retained` generations of the same size.
fn control_with_history(
    runtime: &tokio::runtime::Runtime,
    routes: usize,
    retained: usize,
) -> (Arc<cutover::control::Control>, tempfile::TempDir) {
    use cutover::control::{Candidate, Control, ControlParts};
    use cutover::runtime::{GenerationRecord, History, PersistedState, PhaseCell};
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config(routes, |_| 30)).expect("write");
    let source = ConfigText::read(&path).expect("read");
    let spec = Arc::new(cutover::plan::validate(&source).expect("valid"));
    let shared = Arc::new(SharedState::default());
    let first = build(Arc::clone(&spec), GenerationId::FIRST, &shared).expect("builds");
    let store = Arc::new(GenerationStore::new(first));
    let certificates = Arc::new(cutover::tls::CertStore::default());
    let listeners = cutover::proxy::ListenerSet::new(
        Admission::new(Arc::clone(&store)),
        Arc::clone(&certificates),
        None,
    );
    let mut history = History::new(16, None, PersistedState::default());
    history.record_generation(GenerationRecord {
        generation: GenerationId::FIRST,
        config_version: spec.config_version.clone(),
        activated_at: cutover::runtime::rfc3339(std::time::SystemTime::now()),
        source: cutover::runtime::Source::Startup,
        rolled_back_to: None,
        requested_by: None,
        reason: None,
        caller: None,
        config: cutover::runtime::RetainedText::new(&source.text),
        base_dir: source.base_dir.clone(),
        origin: source.origin.clone(),
    });
    let phase = Arc::new(PhaseCell::default());
    phase.advance(cutover::runtime::Phase::Running);
    let control = Arc::new(Control::new(ControlParts {
        store,
        shared,
        listeners,
        certificates,
        history,
        config_file: path,
        log_level: cutover::telemetry::LogLevel::detached(),
        phase,
        release_memory: || {},
    }));
    for i in 0..retained {
        let text = config(routes, |r| if r == i { 31 + i as u32 } else { 30 });
        runtime
            .block_on(control.activate(
                Candidate::text(text),
                cutover::runtime::OperationKind::Activate,
            ))
            .expect("activates");
    }
    (control, dir)
}

/// The admin calls a pipeline makes, on a 10 000-route configuration with
/// 16 retained generations: validate and preview of a candidate whose
/// middle half is rewritten (the text diff's worst case), and the history
/// view (cold: every retained generation's rollback candidacy planned;
/// warm: a second look).
fn bench_control_plane(c: &mut Criterion) {
    use cutover::control::Candidate;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let routes = 10_000;
    let (control, _dir) = control_with_history(&runtime, routes, 15);
    let rewritten = config(routes, |r| {
        if (routes / 4..3 * routes / 4).contains(&r) {
            29
        } else {
            30
        }
    });
    let candidate = || Candidate::text(rewritten.clone());
    let started = Instant::now();
    let view = runtime.block_on(control.history_view()).expect("history");
    eprintln!(
        "history view, cold ({} retained generations of {routes} routes): {:?}",
        view.generations.len(),
        started.elapsed()
    );
    let mut group = c.benchmark_group("control_plane_10000_routes_16_retained");
    group.sample_size(10);
    group.bench_function("validate_middle_rewritten", |b| {
        b.iter(|| {
            black_box(
                runtime
                    .block_on(control.validate(candidate()))
                    .expect("plans"),
            )
        })
    });
    group.bench_function("preview_middle_rewritten", |b| {
        b.iter(|| {
            black_box(
                runtime
                    .block_on(control.preview(candidate()))
                    .expect("plans"),
            )
        })
    });
    group.bench_function("history_warm", |b| {
        b.iter(|| black_box(runtime.block_on(control.history_view()).expect("history")))
    });
    group.finish();
}

/// The heads of `n` requests over `mixed_config`'s four kinds of route.
fn heads(n: usize) -> Vec<cutover::generation::sample::Head> {
    let at = Instant::now();
    (0..n)
        .map(|i| {
            let (host, path) = match i % 4 {
                0 => (format!("svc{i}.example.com"), format!("/api/{i}/orders")),
                1 => (format!("a.tenant{i}.example.com"), "/".to_owned()),
                2 => ("cdn.example.com".to_owned(), format!("/static/{i}/app.js")),
                _ => (format!("re{i}.example.com"), format!("/items/42/{i}/0")),
            };
            cutover::generation::sample::Head {
                at,
                method: http::Method::GET,
                host,
                path,
                query: None,
                headers: Vec::new(),
            }
        })
        .collect()
}

fn bench_impact(c: &mut Criterion) {
    let mut group = c.benchmark_group("impact");
    group.sample_size(10);
    let n = 10_000;
    let active_text = ConfigText::inline(common::mixed_config(n, 0), ".".into(), "<bench>");
    let active = Arc::new(cutover::plan::validate(&active_text).expect("valid"));
    let generation = build(active, GenerationId::FIRST, &SharedState::default()).expect("builds");
    // Every route to the next upstream: every head moves.
    let upstreams = n / 10;
    let moved: String = common::mixed_config(n, 0)
        .lines()
        .map(|line| match line.strip_prefix("upstream = \"u") {
            Some(rest) => {
                let k: usize = rest.trim_end_matches('"').parse().expect("upstream index");
                format!("upstream = \"u{}\"\n", (k + 1) % upstreams)
            }
            None => format!("{line}\n"),
        })
        .collect();
    let candidate =
        cutover::plan::validate(&ConfigText::inline(moved, ".".into(), "<bench>")).expect("valid");
    let samples = vec![("web".to_owned(), heads(n))];
    let impact = cutover::impact::assess(
        &samples,
        cutover::impact::Before::Active,
        &candidate,
        &generation,
    );
    assert_eq!(impact.sample_size, n);
    assert_eq!(impact.moved.count, n, "every head routes, and moves");
    group.bench_function("10000_samples_10000_routes", |b| {
        b.iter(|| {
            black_box(cutover::impact::assess(
                &samples,
                cutover::impact::Before::Active,
                &candidate,
                &generation,
            ))
        })
    });
    group.finish();
}

/// What the admin guard's caller check adds to a call (DESIGN §23; the
/// governance target: at most 50 µs more): the same calls through the
/// admin router with no callers, and with 16 callers and a bearer token
/// (SHA-256 of the token, compared with every caller's, the scope
/// checked). `health` is the cheapest call, so the guard is most of it;
/// `status` is what the console reads every second.
fn bench_admin_guard(c: &mut Criterion) {
    use tower::ServiceExt as _;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (control, _dir) = control_with_history(&runtime, 10, 0);
    let address: std::net::SocketAddr = "127.0.0.1:9190".parse().expect("addr");
    let callers: Vec<cutover::plan::CallerSpec> = (0..16)
        .map(|i| {
            use sha2::Digest as _;
            cutover::plan::CallerSpec {
                name: format!("caller-{i}"),
                credential: cutover::plan::Credential::Token(
                    sha2::Sha256::digest(format!("token-of-caller-{i:04}")).into(),
                ),
                scopes: cutover::plan::Scopes::default().with(cutover::plan::Scope::Read),
                requires_approval: false,
            }
        })
        .collect();
    let router = |callers: &[cutover::plan::CallerSpec]| {
        cutover::admin::router(
            cutover::writer::Writer::Local(Arc::clone(&control)),
            cutover::admin::Security::new(address, callers, 1 << 20),
        )
    };
    let open = router(&[]);
    let guarded = router(&callers);
    let request = |path: &str, token: Option<&str>| {
        let mut builder = http::Request::get(path).header("host", "127.0.0.1:9190");
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        builder.body(axum::body::Body::empty()).expect("request")
    };
    let mut group = c.benchmark_group("admin_guard");
    for path in ["/admin/health", "/admin/runtime/status"] {
        let name = path.rsplit('/').next().unwrap_or(path);
        group.bench_function(BenchmarkId::new("no_callers", name), |b| {
            b.iter(|| {
                let answer = runtime.block_on(open.clone().oneshot(request(path, None)));
                assert!(answer.is_ok_and(|a| a.status().is_success()));
            })
        });
        // The last caller's token: every comparison is made anyway.
        group.bench_function(BenchmarkId::new("16_callers", name), |b| {
            b.iter(|| {
                let answer = runtime.block_on(
                    guarded
                        .clone()
                        .oneshot(request(path, Some("token-of-caller-0015"))),
                );
                assert!(answer.is_ok_and(|a| a.status().is_success()));
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_admin_guard,
    bench_pin,
    bench_diff,
    bench_activation,
    bench_control_plane,
    bench_impact
);
criterion_main!(benches);

//! The cost of picking a backend, per load-balancing policy, at 100
//! backends (target: 100 ns or less for p2c and hash). Each upstream is
//! built by `generation::build` from a real configuration; outlier
//! detection is on (it always is), active checks are off (no runtime runs
//! them here). `hash_bounded_loaded` puts one request in flight on every
//! backend first, so that the load bound has to sum the loads.
//! Run: `cargo bench --bench balancing`.

use std::hint::black_box;
use std::sync::Arc;

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, Criterion};
use cutover::config::ConfigText;
use cutover::generation::{build, hash_key, Generation, SharedState};
use cutover::ids::GenerationId;

const BACKENDS: usize = 100;

fn generation(policies: &[(&str, &str)]) -> Generation {
    let backends: Vec<String> = (0..BACKENDS)
        .map(|i| format!("{{ addr = \"10.0.{}.{}:8080\" }}", i / 250, i % 250 + 1))
        .collect();
    let mut text = String::from(
        "[admin]\nbind = \"127.0.0.1:0\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n",
    );
    for (name, _) in policies {
        text.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\nlisteners = [\"web\"]\npath_prefix = \"/{name}\"\nupstream = \"{name}\"\n\n"
        ));
    }
    for (name, extra) in policies {
        text.push_str(&format!(
            "[upstreams.{name}]\n{extra}\nbackends = [{}]\n\n",
            backends.join(", ")
        ));
    }
    let text = ConfigText::inline(text, ".".into(), "<bench>");
    let spec = Arc::new(cutover::plan::validate(&text).expect("validates"));
    build(spec, GenerationId(1), &SharedState::default()).expect("builds")
}

fn bench_pick(c: &mut Criterion) {
    let generation = generation(&[
        ("rr", "policy = \"round_robin\""),
        ("weighted", "policy = \"weighted\""),
        ("least", "policy = \"least_requests\""),
        ("p2c", "policy = \"p2c\""),
        ("hash", "policy = \"hash\"\nhash_key = \"header:x-user\""),
        (
            "bounded",
            "policy = \"hash\"\nhash_key = \"header:x-user\"\nhash_balance_factor = 150",
        ),
    ]);
    let upstream = |name: &str| Arc::clone(generation.upstream(name).expect("built"));
    let mut group = c.benchmark_group("pick_100_backends");
    for (label, name) in [
        ("round_robin", "rr"),
        ("weighted", "weighted"),
        ("least_requests", "least"),
        ("p2c", "p2c"),
    ] {
        let upstream = upstream(name);
        group.bench_function(label, |b| {
            b.iter(|| black_box(upstream.pick(&upstream.members()).is_some()))
        });
    }
    let keys: Vec<u64> = (0..1024u32)
        .map(|k| hash_key(format!("user-{k}").as_bytes()))
        .collect();
    for (label, name) in [("hash", "hash"), ("hash_bounded_idle", "bounded")] {
        let upstream = upstream(name);
        let mut i = 0;
        group.bench_function(label, |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(upstream.pick_hashed(&upstream.members(), keys[i]).is_some())
            })
        });
    }
    // Every backend busy: the bound has to sum the loads.
    let bounded = upstream("bounded");
    let _busy: Vec<_> = bounded
        .members()
        .backends
        .iter()
        .map(|b| b.start_request())
        .collect();
    let mut i = 0;
    group.bench_function("hash_bounded_loaded", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(bounded.pick_hashed(&bounded.members(), keys[i]).is_some())
        })
    });
    // The key's hash itself (SipHash of a short header value).
    group.bench_function("hash_key_only", |b| {
        b.iter(|| black_box(hash_key(black_box(b"user-12345"))))
    });
    group.finish();
}

criterion_group!(benches, bench_pick);
criterion_main!(benches);

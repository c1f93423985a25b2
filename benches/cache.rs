//! Response caching (issue 57).
//!
//! In process (criterion): a zone's look-up of a fresh small object (the
//! hit path's engine part: the key's map, the RFC 9111 check, the head
//! built with `Age`), storing one, answering a range from one, and a purge
//! by prefix over 10 000 keys.
//!
//! End to end, in processes of their own: `benches/cache_hit.sh` with this
//! build's binary: one small object from nginx `return 200`, asked for by
//! `wrk -t1 -c64` through cutover (`routes.cache`), nginx `proxy_cache`
//! and Varnish in alternating rounds; CPU per request (the scheduler's
//! run time of each cache's threads) and throughput, and their ratios.
//! Needs `wrk`, `nginx-light`, `python3` and `curl` (and `varnish` for the
//! third); says why it skips when one is missing.
//! `CUTOVER_BENCH_ROUNDS` (default 4) and `CUTOVER_BENCH_SECONDS`
//! (default 8) set its length.
//!
//! Run: `cargo bench --bench cache`.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use criterion::Criterion;
use cutover::cache::{range, Found, Selector, Stored, Zone, Zones};
use cutover::plan::ZoneSpec;
use http::HeaderValue;

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn request() -> http::request::Parts {
    http::Request::builder()
        .uri("/object")
        .header("host", "app.test")
        .header("accept", "*/*")
        .body(())
        .map(|r| r.into_parts().0)
        .unwrap_or_else(|_| unreachable!())
}

fn stored(at: SystemTime) -> Stored {
    let answer = http::Response::builder()
        .header("cache-control", "max-age=3600")
        .header("content-type", "text/plain")
        .header("content-length", "20")
        .body(())
        .map(|r| r.into_parts().0)
        .unwrap_or_else(|_| unreachable!());
    Stored::new(
        &request(),
        &answer,
        Bytes::from_static(b"hello, cached world\n"),
        at,
    )
    .unwrap_or_else(|| unreachable!("storable"))
}

fn zone(name: &str) -> Arc<Zone> {
    Zones::default().zone(
        name,
        &ZoneSpec {
            memory: 64 << 20,
            disk: None,
        },
    )
}

fn in_process(c: &mut Criterion) {
    let now = SystemTime::now();
    let key = "app.test /object app";
    let hits = zone("hits");
    hits.store(key, stored(now));
    let req = request();
    c.bench_function("zone/hit", |b| {
        b.iter(|| match hits.lookup(black_box(key), &req, now) {
            Found::Fresh { head, body } => black_box((head, body)),
            _ => unreachable!("fresh"),
        })
    });
    let stores = zone("stores");
    c.bench_function("zone/store", |b| {
        b.iter(|| stores.store(black_box(key), stored(now)))
    });
    let range_header = HeaderValue::from_static("bytes=2-9");
    let body = Bytes::from_static(b"hello, cached world\n");
    let head = || {
        http::Response::builder()
            .body(())
            .map(|r| r.into_parts().0)
            .unwrap_or_else(|_| unreachable!())
    };
    c.bench_function("range/select_and_cut", |b| {
        b.iter(|| {
            let selected = range::select(&range_header, None, &http::HeaderMap::new(), 20);
            black_box(range::cut(head(), body.clone(), selected))
        })
    });
    c.bench_function("purge/prefix_of_10000_keys", |b| {
        b.iter_batched(
            || {
                let z = zone("purge");
                for i in 0..10_000 {
                    z.store(&format!("app.test /p/{i} app"), stored(now));
                }
                z
            },
            |z| black_box(z.purge(&Selector::Prefix("app.test /p/1".into()))),
            criterion::BatchSize::PerIteration,
        )
    });
}

/// The end-to-end comparison (`benches/cache_hit.sh`), with this build.
fn end_to_end() {
    common::run_script(
        "cache end to end",
        "cache_hit.sh",
        env!("CARGO_BIN_EXE_cutover"),
        &["wrk", "nginx", "python3", "curl"],
        "wrk nginx-light python3 curl varnish",
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    in_process(&mut c);
    c.final_summary();
    if std::env::var("CUTOVER_BENCH_ONLY").is_ok_and(|v| v == "in-process") {
        return;
    }
    end_to_end();
}

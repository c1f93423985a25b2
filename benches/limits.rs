//! Fleet-wide rate limits (issue 58).
//!
//! In process (criterion): a local quota's decision, and a fleet quota's
//! decision against a real `redis-server` (its own process, a unix
//! socket) with the default pre-allowance: most requests spend a leased
//! token, a few start the next refill; the rare one that finds its lease
//! empty waits for it. Left out, saying why, when `redis-server` is not
//! installed.
//!
//! End to end, in processes of their own: `benches/fleet_limit.sh` with
//! this build's binary: nginx `return 200` behind one cutover worker,
//! `wrk -t1 -c16 --latency` on a route without a quota and on fleet-scoped
//! ones (pre-allowance 10 % and 1 %) in alternating rounds; CPU per
//! request (the scheduler's run time of the gateway's threads) and p99,
//! and their ratios. Needs `wrk`, `nginx-light`, `redis-server`, `python3`
//! and `curl`; says why it skips when one is missing.
//! `CUTOVER_BENCH_ROUNDS` (default 4) and `CUTOVER_BENCH_SECONDS`
//! (default 8) set its length.
//!
//! Run: `cargo bench --bench limits`.

mod common;

use std::hint::black_box;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use cutover::limits::fleet::Take;
use cutover::limits::{FleetQuota, QuotaTable, Store};
use cutover::plan::{
    FleetQuotaSpec, OnStoreError, QuotaAlgorithm, QuotaKey, QuotaSpec, StoreSpec,
    DEFAULT_FLEET_DEADLINE, DEFAULT_STORE_TIMEOUT,
};

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RATE: u32 = 1_000_000;

fn spec(fleet: Option<FleetQuotaSpec>) -> QuotaSpec {
    QuotaSpec {
        rate: RATE,
        per: Duration::from_secs(1),
        burst: RATE,
        key: vec![QuotaKey::ClientIp],
        max_keys: 100_000,
        fleet,
        advertise: false,
    }
}

/// A `redis-server` on a unix socket in `dir`, stopped on drop.
struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis(dir: &Path) -> Option<Redis> {
    let socket = dir.join("redis.sock");
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--save",
            "",
            "--appendonly",
            "no",
            "--unixsocket",
        ])
        .arg(&socket)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let redis = Redis(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !socket.exists() {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(redis)
}

fn in_process(c: &mut Criterion) {
    let local = QuotaTable::new(spec(None));
    let key = b"127.0.0.1".as_slice();
    c.bench_function("quota/local_take", |b| {
        b.iter(|| black_box(local.take(black_box(key))))
    });

    let Ok(dir) = tempfile::tempdir() else {
        println!("quota/fleet_take: skipped, no temporary folder");
        return;
    };
    let Some(_redis) = redis(dir.path()) else {
        println!("quota/fleet_take: skipped, redis-server is not installed or did not start (apt-get install redis-server)");
        return;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    else {
        println!("quota/fleet_take: skipped, no runtime");
        return;
    };
    let store = runtime.block_on(async {
        let store = Arc::new(Store::new(&StoreSpec {
            url: format!("unix://{}", dir.path().join("redis.sock").display()),
            sentinel: None,
            username: None,
            password: None,
            tls: None,
            key_prefix: "bench:".into(),
            timeout: DEFAULT_STORE_TIMEOUT,
        }));
        store.start();
        store
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !store.is_up() {
        if Instant::now() > deadline {
            println!("quota/fleet_take: skipped, the store did not come up");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let fleet = Arc::new(FleetQuota::new(
        "bench",
        spec(None),
        FleetQuotaSpec {
            algorithm: QuotaAlgorithm::TokenBucket,
            on_store_error: OnStoreError::Local,
            deadline: DEFAULT_FLEET_DEADLINE,
            batch: RATE / 10,
        },
    ));
    c.bench_function("quota/fleet_take", |b| {
        b.iter(|| {
            let decision = match fleet.take(black_box(key), &store) {
                Take::Now(decision) => decision,
                Take::Wait(pending) => runtime.block_on(pending.decide()),
            };
            black_box(decision)
        })
    });
}

/// The end-to-end comparison (`benches/fleet_limit.sh`), with this build.
fn end_to_end() {
    common::run_script(
        "fleet limit end to end",
        "fleet_limit.sh",
        env!("CARGO_BIN_EXE_cutover"),
        &["wrk", "nginx", "redis-server", "python3", "curl"],
        "wrk nginx-light redis-server python3 curl",
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

//! Resident memory of the real `cutover` binary: idle on a small
//! configuration, and holding a 10 000-route configuration (2 500 regexes,
//! 1 000 upstreams, the `routing` benchmark's mix); then under sustained
//! load with nobody scraping `/metrics` (its RSS after 5 and after 20
//! seconds of load: what recorded request durations cost if they pile up).
//!
//! Starts the binary, waits for its ready line, lets it settle, then reads
//! `VmRSS` and `VmHWM` from `/proc`. Linux only.
//!
//! Run: `cargo bench --bench footprint`.

mod common;

use std::time::Duration;

const SMALL: &str = r#"[admin]
bind = "127.0.0.1:0"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "api"
listeners = ["web"]
path_prefix = "/api/"
upstream = "api"

[[routes]]
name = "health"
listeners = ["web"]
path_exact = "/healthz"
respond = { body = "ok" }

[upstreams.api]
backends = [{ addr = "127.0.0.1:9" }]
"#;

fn main() {
    // `cargo test --benches` and `cargo bench --no-run` must not run this.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    println!(
        "{:<44} {:>10} {:>10}",
        "configuration", "RSS MiB", "peak MiB"
    );
    for (label, config) in [
        ("idle, 2 routes", SMALL.to_owned()),
        (
            "10 000 routes (2 500 regexes, 1 000 upstreams)",
            common::mixed_config(10_000, 0),
        ),
    ] {
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("write config");
        let (mut child, _) = common::start_gateway(&path);
        std::thread::sleep(Duration::from_secs(2));
        let (rss, peak) = memory(&child);
        stop(&mut child);
        println!(
            "{label:<44} {:>10.1} {:>10.1}",
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    }
    under_load(&dir.path().join("gateway.toml"));
}

/// The small configuration's direct-response route under 20 s of
/// keep-alive load on 16 connections, its RSS read after 5 s and after
/// 20 s. A gateway whose per-request bookkeeping piles up grows between
/// the two (recorded durations are 16 bytes a request).
fn under_load(path: &std::path::Path) {
    // Without the access log, which would write a line per request.
    std::fs::write(path, format!("{SMALL}\n[log]\nlevel = \"warn\"\n")).expect("write config");
    let (mut child, ready) = common::start_gateway(path);
    let target: std::net::SocketAddr = ready["listeners"][0]["address"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("listener address in the ready line");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut served = 0;
    for (seconds, label) in [
        (5, "under load, no scrapes: after 5 s"),
        (15, "                          after 20 s"),
    ] {
        let (latencies, errors) = runtime.block_on(common::keep_alive_load(
            target,
            "/healthz",
            16,
            Duration::from_secs(seconds),
        ));
        assert_eq!(errors, 0, "load failed");
        served += latencies.len();
        let (rss, peak) = memory(&child);
        println!(
            "{label:<44} {:>10.1} {:>10.1}   ({served} requests)",
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    }
    stop(&mut child);
}

/// The child's resident and peak resident memory in KiB.
fn memory(child: &std::process::Child) -> (u64, u64) {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("read /proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn stop(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

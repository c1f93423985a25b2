//! Resident memory of the real `cutover` binary: idle on a small
//! configuration, and holding a 10 000-route configuration (2 500 regexes,
//! 1 000 upstreams, the `routing` benchmark's mix).
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
        let (rss, peak) = measure(&path);
        println!(
            "{label:<44} {:>10.1} {:>10.1}",
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    }
}

/// Starts the gateway on `config` and returns its resident and peak
/// resident memory in KiB once it has been ready for two seconds.
fn measure(config: &std::path::Path) -> (u64, u64) {
    let (mut child, _) = common::start_gateway(config);
    std::thread::sleep(Duration::from_secs(2));
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("read /proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let measured = (field("VmRSS:"), field("VmHWM:"));
    let _ = child.kill();
    let _ = child.wait();
    measured
}

//! Resident memory of the real `cutover` binary: idle on a small
//! configuration, and holding a 10 000-route configuration (2 500 regexes,
//! 1 000 upstreams, the `routing` benchmark's mix); then under sustained
//! load with nobody scraping `/metrics` (its RSS after 5 and after 20
//! seconds of load: what recorded request durations cost if they pile up).
//!
//! Starts the binary, waits for its ready line, lets it settle, then reads
//! `VmRSS` and `VmHWM` from `/proc`. Linux only.
//!
//! Then the resident memory an idle keep-alive connection holds, HTTP/1.1
//! and h2c.
//!
//! Then the CPU an idle gateway spends a second with one backend and with
//! 10 000 (100 upstreams of 100, no active checks), nobody reading the
//! admin API: what its own once-a-second work costs (the console's
//! timeline, gauges). `CUTOVER_BENCH_BASELINE=path/to/cutover` measures an
//! earlier build beside this one.
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
    idle_connections(&dir.path().join("gateway.toml"));
    idle_cpu(&dir.path().join("gateway.toml"));
}

/// Resident memory per idle keep-alive connection, HTTP/1.1 and h2c:
/// `N` connections (`CUTOVER_BENCH_CONNECTIONS`, default 1 000) each
/// send one request to the direct-response route, read its answer and
/// stay open; the gateway's `VmRSS` after them less before them, over
/// `N`. Fifty connections come and go first, so that the allocator's
/// first pages are not counted against the connections. For this build
/// and the baseline's if one is given.
fn idle_connections(path: &std::path::Path) {
    let wanted = common::env_u64("CUTOVER_BENCH_CONNECTIONS", 1_000) as usize;
    std::fs::write(path, format!("{SMALL}\n[log]\nlevel = \"warn\"\n")).expect("write config");
    let this: std::path::PathBuf = std::env::var_os("CUTOVER_BENCH_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_cutover").into())
        .into();
    type Answered = fn(std::net::SocketAddr) -> Option<std::net::TcpStream>;
    let protocols: [(&str, Answered); 2] = [
        ("HTTP/1.1", answered_connection),
        ("h2c", answered_h2c_connection),
    ];
    for (protocol, answered) in protocols {
        println!();
        println!(
            "{:<44} {:>10} {:>10}",
            format!("idle keep-alive {protocol} connections"),
            "B / conn",
            "open"
        );
        for (label, binary) in std::iter::once(("this build", this.clone()))
            .chain(common::baseline_binary().map(|b| ("baseline", b)))
        {
            let (mut child, ready) = common::start_binary(&binary, path);
            let target: std::net::SocketAddr = ready["listeners"][0]["address"]
                .as_str()
                .and_then(|a| a.parse().ok())
                .expect("listener address in the ready line");
            for _ in 0..50 {
                drop(answered(target));
            }
            std::thread::sleep(Duration::from_millis(300));
            let (before, _) = memory(&child);
            // Held open until measured; fewer than wanted when this
            // process runs out of descriptors (`ulimit -n`).
            let open: Vec<_> = (0..wanted).map_while(|_| answered(target)).collect();
            std::thread::sleep(Duration::from_millis(500));
            let (after, _) = memory(&child);
            let per = after.saturating_sub(before) as f64 * 1024.0 / open.len().max(1) as f64;
            println!("{label:<44} {per:>10.0} {:>10}", open.len());
            drop(open);
            stop(&mut child);
        }
    }
}

/// A connection to `target` that has had one answer to a keep-alive
/// request, or None when it could not be opened or answered.
fn answered_connection(target: std::net::SocketAddr) -> Option<std::net::TcpStream> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(target).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: bench\r\n\r\n")
        .ok()?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.ends_with(b"ok") {
        let n = stream.read(&mut buf).ok().filter(|n| *n > 0)?;
        seen.extend_from_slice(&buf[..n]);
    }
    Some(stream)
}

/// The same over h2c (prior knowledge): the preface, an empty SETTINGS
/// and one GET; answered once stream 1's last DATA frame has come.
fn answered_h2c_connection(target: std::net::SocketAddr) -> Option<std::net::TcpStream> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(target).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // HPACK: GET, http, then :path and :authority as literals without
    // indexing (static name indices 4 and 1).
    let mut block = vec![0x82, 0x86, 0x04, 8];
    block.extend_from_slice(b"/healthz");
    block.extend_from_slice(&[0x01, 5]);
    block.extend_from_slice(b"bench");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let len = block.len() as u32;
    // HEADERS, END_STREAM | END_HEADERS, stream 1.
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[1, 0x5, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    stream.write_all(&out).ok()?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        // Frames read so far: done at DATA with END_STREAM on stream 1.
        let mut at = 0;
        while seen.len() >= at + 9 {
            let len = u32::from_be_bytes([0, seen[at], seen[at + 1], seen[at + 2]]) as usize;
            let (kind, flags) = (seen[at + 3], seen[at + 4]);
            let id = u32::from_be_bytes([seen[at + 5], seen[at + 6], seen[at + 7], seen[at + 8]]);
            if seen.len() < at + 9 + len {
                break;
            }
            if kind == 0 && flags & 1 != 0 && id == 1 {
                return Some(stream);
            }
            at += 9 + len;
        }
        let n = stream.read(&mut buf).ok().filter(|n| *n > 0)?;
        seen.extend_from_slice(&buf[..n]);
    }
}

/// `upstreams` upstreams of `per` backends each (nothing listens there:
/// no check, no traffic, so nothing should look at them).
fn many_backends(upstreams: usize, per: usize) -> String {
    let mut config = String::from(
        "[admin]\nbind = \"127.0.0.1:0\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n",
    );
    for u in 0..upstreams {
        config.push_str(&format!(
            "\n[[routes]]\nname = \"r{u}\"\nlisteners = [\"web\"]\npath_prefix = \"/u{u}/\"\nupstream = \"u{u}\"\n"
        ));
    }
    for u in 0..upstreams {
        let backends: Vec<String> = (0..per)
            .map(|b| format!("{{ addr = \"127.0.{u}.{}:8080\" }}", b + 1))
            .collect();
        config.push_str(&format!(
            "\n[upstreams.u{u}]\nbackends = [{}]\n",
            backends.join(", ")
        ));
    }
    config
}

/// Milliseconds of CPU per second of an idle gateway, over 20 s after 3 s
/// to settle, for this build and the baseline's if one is given.
fn idle_cpu(path: &std::path::Path) {
    let seconds = common::env_u64("CUTOVER_BENCH_IDLE_SECONDS", 20);
    println!();
    println!(
        "{:<44} {:>10} {:>10}",
        "idle, nobody reading", "this ms/s", "base ms/s"
    );
    for (label, upstreams, per) in [
        ("1 backend", 1, 1),
        ("10 000 backends (100 upstreams x 100)", 100, 100),
    ] {
        std::fs::write(path, many_backends(upstreams, per)).expect("write config");
        let mut measured = Vec::new();
        let this: std::path::PathBuf = std::env::var_os("CUTOVER_BENCH_BINARY")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_cutover").into())
            .into();
        for binary in std::iter::once(this).chain(common::baseline_binary()) {
            let (mut child, _) = common::start_binary(&binary, path);
            std::thread::sleep(Duration::from_secs(3));
            let before = common::run_nanoseconds(child.id());
            std::thread::sleep(Duration::from_secs(seconds));
            let ran = common::run_nanoseconds(child.id()).saturating_sub(before);
            stop(&mut child);
            measured.push(ran as f64 / 1e6 / seconds as f64);
        }
        let base = measured
            .get(1)
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.2}"));
        println!("{label:<44} {:>10.2} {base:>10}", measured[0]);
    }
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

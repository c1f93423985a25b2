//! L4 (`protocol = "tcp"` listeners) against a direct connection and
//! HAProxy `mode tcp`, in one run, each in its own process:
//!
//! - (a) bulk transfer: `iperf3 -c` for `CUTOVER_BENCH_SECONDS` (default
//!   5) to an `iperf3 -s` directly, through cutover and through HAProxy;
//!   reports GB/s and the ratio to direct, and the proxy's CPU seconds per
//!   GB moved;
//! - (b) connection rate, a new connection per request: `wrk -t1 -c32`
//!   with `Connection: close` against nginx answering `return 200`,
//!   directly and through each proxy; reports connections/s, the ratio to
//!   direct and HAProxy, and the proxy's CPU per connection.
//!
//! Each is measured in rounds (`CUTOVER_BENCH_ROUNDS`, default 3) in
//! alternating order, reported as the mean and the spread.
//! `CUTOVER_BENCH_BASELINE=path/to/cutover` adds another build (an
//! earlier commit) as the target `baseline`, measured in the same rounds. Installs
//! nothing: `apt-get install iperf3 wrk nginx-light haproxy`; a missing
//! tool skips what needs it, and says so.
//!
//! Run: `cargo bench --bench l4`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{env_u64, free_port, rounds_of, wait_for, which, Owned, Run, Target};

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let seconds = env_u64("CUTOVER_BENCH_SECONDS", 5);
    let rounds = env_u64("CUTOVER_BENCH_ROUNDS", 3) as usize;
    let dir = tempfile::tempdir().expect("temporary directory");
    if which("iperf3") {
        bulk(dir.path(), seconds, rounds);
    } else {
        println!("(a) bulk transfer: SKIPPED, iperf3 is not installed (apt-get install iperf3)");
    }
    if which("wrk") && which("nginx") {
        connection_rate(dir.path(), seconds, rounds);
    } else {
        println!(
            "(b) connection rate: SKIPPED, needs wrk and nginx (apt-get install wrk nginx-light)"
        );
    }
}

/// cutover's `tcp` listener to `backend`, served by `binary` (this
/// build when `None`).
fn start_cutover(
    dir: &Path,
    name: &str,
    backend: SocketAddr,
    binary: Option<&Path>,
) -> (Owned, SocketAddr) {
    let listen = free_port();
    let config = format!(
        "[admin]\nbind = \"127.0.0.1:0\"\n\n[log]\nlevel = \"warn\"\n\n[[listeners]]\nname = \"tcp\"\nbind = \"{listen}\"\nprotocol = \"tcp\"\nupstream = \"backend\"\n\n[upstreams.backend]\nbackends = [{{ addr = \"{backend}\" }}]\n"
    );
    let path = dir.join(format!("{name}-cutover.toml"));
    std::fs::write(&path, config).expect("write config");
    let (child, _) = match binary {
        Some(binary) => common::start_binary(binary, &path),
        None => common::start_gateway(&path),
    };
    assert!(wait_for(listen), "cutover is not listening on {listen}");
    (Owned(child), listen)
}

/// HAProxy `mode tcp` to `backend`, one thread (cutover's default on two
/// cores is one worker per core: HAProxy gets `nbthread 2` likewise).
fn start_haproxy(dir: &Path, name: &str, backend: SocketAddr) -> Option<(Owned, SocketAddr)> {
    if !which("haproxy") {
        return None;
    }
    let listen = free_port();
    let config = format!(
        "global\n  nbthread 2\n  maxconn 4096\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\nfrontend f\n  bind {listen}\n  default_backend b\nbackend b\n  server s1 {backend}\n"
    );
    let path = dir.join(format!("{name}-haproxy.cfg"));
    std::fs::write(&path, config).ok()?;
    let child = Command::new("haproxy")
        .args(["-f", &path.display().to_string(), "-db"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let child = Owned(child);
    wait_for(listen).then_some((child, listen))
}

/// `backend` directly, through cutover and (when installed) through
/// HAProxy; the proxies' processes live as long as the first value.
fn targets(dir: &Path, name: &str, backend: SocketAddr) -> (Vec<Owned>, Vec<Target>) {
    let (cutover, through_cutover) = start_cutover(dir, name, backend, None);
    let mut targets = vec![
        Target {
            name: "direct",
            address: backend,
            pid: None,
        },
        Target {
            name: "cutover",
            address: through_cutover,
            pid: Some(cutover.0.id()),
        },
    ];
    let mut proxies = vec![cutover];
    if let Some(binary) = common::baseline_binary() {
        let (baseline, address) =
            start_cutover(dir, &format!("{name}-baseline"), backend, Some(&binary));
        targets.push(Target {
            name: "baseline",
            address,
            pid: Some(baseline.0.id()),
        });
        proxies.push(baseline);
    }
    match start_haproxy(dir, name, backend) {
        Some((haproxy, address)) => {
            targets.push(Target {
                name: "haproxy",
                address,
                pid: Some(haproxy.0.id()),
            });
            proxies.push(haproxy);
        }
        None => println!("({name}) HAProxy is not installed: cutover against direct only"),
    }
    (proxies, targets)
}

fn bulk(dir: &Path, seconds: u64, rounds: usize) {
    let port = free_port();
    let server = Command::new("iperf3")
        .args(["-s", "-p", &port.port().to_string(), "-B", "127.0.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 -s");
    let _server = Owned(server);
    assert!(wait_for(port), "iperf3 is not listening");
    let (_proxies, targets) = targets(dir, "bulk", port);
    rounds_of(
        &format!("(a) bulk transfer, one iperf3 stream for {seconds} s"),
        "GB/s",
        "s per GB",
        &targets,
        rounds,
        |target| {
            let out = Command::new("iperf3")
                .args([
                    "-c",
                    &target.address.ip().to_string(),
                    "-p",
                    &target.address.port().to_string(),
                    "-t",
                    &seconds.to_string(),
                    "-J",
                ])
                .output()
                .ok()?;
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let received = &json["end"]["sum_received"];
            let rate = received["bits_per_second"].as_f64()? / 8e9;
            let work = received["bytes"].as_f64()? / 1e9;
            Some(Run {
                rate,
                cpu: 0.0,
                work,
            })
        },
    );
}

fn connection_rate(dir: &Path, seconds: u64, rounds: usize) {
    let backend = free_port();
    let d = dir.display();
    let config = format!(
        "daemon off;\nworker_processes 1;\nerror_log {d}/l4-nginx-error.log;\npid {d}/l4-nginx.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d};\n  server {{\n    listen {backend};\n    location / {{ return 200 \"hello, world\\n\"; }}\n  }}\n}}\n"
    );
    std::fs::write(dir.join("l4-nginx.conf"), config).expect("nginx config");
    let nginx = Command::new("nginx")
        .args([
            "-c",
            &format!("{d}/l4-nginx.conf"),
            "-e",
            &format!("{d}/l4-nginx-error.log"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx");
    let _nginx = Owned(nginx);
    assert!(wait_for(backend), "nginx is not listening");
    let (_proxies, targets) = targets(dir, "rate", backend);
    rounds_of(
        &format!("(b) connection rate, a new connection per request, wrk -t1 -c32 for {seconds} s"),
        "conn/s",
        "ms per 1 000 connections",
        &targets,
        rounds,
        |target| {
            let out = Command::new("wrk")
                .args([
                    "-t1",
                    "-c32",
                    &format!("-d{seconds}s"),
                    "-H",
                    "Connection: close",
                    &format!("http://{}/", target.address),
                ])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let requests: f64 = text
                .lines()
                .find(|l| l.contains("requests in"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let rate: f64 = text
                .lines()
                .find(|l| l.starts_with("Requests/sec:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            // CPU per 1 000 connections, in ms: work counted in
            // thousands, CPU in ms.
            Some(Run {
                rate,
                cpu: 0.0,
                work: requests / 1000.0 / 1000.0,
            })
        },
    );
}

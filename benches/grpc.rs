//! Unary gRPC through cutover, nginx (`grpc_pass`) and HAProxy (`proto
//! h2` both sides), against the same backend, in one run, each in its own
//! process.
//!
//! The backend is nginx over h2c answering every call with one framed
//! message (`00 00 00 00 02 08 01`) and a `grpc-status: 0` trailer, from
//! one worker: a server that costs next to nothing. The load is `h2load
//! -t1 -c16 -m10`, every call a POST of one framed message with
//! `content-type: application/grpc` and `te: trailers`, for
//! `CUTOVER_BENCH_SECONDS` (default 5). Each proxy has two threads or
//! workers (cutover's default on two cores is one worker per core).
//!
//! Measured in rounds (`CUTOVER_BENCH_ROUNDS`, default 3) of alternating
//! order; reported as the mean and the spread: calls/s, the ratio to
//! the backend alone and to HAProxy, and **CPU per 1 000 calls** (the
//! proxy's utime + stime, workers included, from `/proc`).
//!
//! Run: `cargo bench --bench grpc`. Installs nothing: `apt-get install
//! nghttp2-client nginx-light haproxy`; what is missing is skipped, and
//! said.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{cpu_seconds, free_port, stop, wait_for, which};

/// One framed `grpc.health.v1.HealthCheckResponse { status: SERVING }`:
/// the request body and the backend's answer.
const MESSAGE: &[u8] = &[0, 0, 0, 0, 2, 8, 1];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A process that is stopped when this is dropped.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        stop(&mut self.0);
    }
}

struct Target {
    name: &'static str,
    address: SocketAddr,
    /// The proxy's process (`None`: the backend itself).
    pid: Option<u32>,
}

#[derive(Clone, Copy)]
struct Run {
    rate: f64,
    calls: f64,
    cpu: f64,
}

fn spread(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (mean, (max - min) / 2.0)
}

fn main() {
    let seconds = env_u64("CUTOVER_BENCH_SECONDS", 5);
    let rounds = env_u64("CUTOVER_BENCH_ROUNDS", 3) as usize;
    if !which("h2load") || !which("nginx") {
        println!("unary gRPC: SKIPPED, needs h2load and nginx (apt-get install nghttp2-client nginx-light)");
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let d = dir.path();
    std::fs::write(d.join("reply.bin"), MESSAGE).expect("reply");
    std::fs::write(d.join("request.bin"), MESSAGE).expect("request");
    let backend = free_port();
    // A POST to a static file is 405 in nginx: `error_page` turns it into
    // the file (an internal GET), with the trailer a gRPC server sends.
    let config = format!(
        "daemon off;\nworker_processes 1;\nerror_log {d}/backend-error.log;\npid {d}/backend.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  keepalive_requests 10000000;\n  client_body_temp_path {d};\n  server {{\n    listen {backend} http2;\n    location / {{\n      root {d};\n      default_type application/grpc;\n      add_trailer grpc-status 0 always;\n      try_files /reply.bin =404;\n      error_page 405 =200 $uri;\n    }}\n  }}\n}}\n",
        d = d.display()
    );
    std::fs::write(d.join("backend.conf"), config).expect("backend config");
    let _backend = Owned(
        Command::new("nginx")
            .args([
                "-c",
                &format!("{}/backend.conf", d.display()),
                "-e",
                &format!("{}/backend-error.log", d.display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx backend"),
    );
    assert!(wait_for(backend), "the nginx backend is not listening");

    let mut targets = vec![Target {
        name: "backend",
        address: backend,
        pid: None,
    }];
    let mut proxies = Vec::new();
    let (cutover, address) = start_cutover(d, backend);
    targets.push(Target {
        name: "cutover",
        address,
        pid: Some(cutover.0.id()),
    });
    proxies.push(cutover);
    match start_nginx(d, backend) {
        Some((nginx, address)) => {
            targets.push(Target {
                name: "nginx",
                address,
                pid: Some(nginx.0.id()),
            });
            proxies.push(nginx);
        }
        None => println!("nginx grpc_pass: SKIPPED, could not start it"),
    }
    match start_haproxy(d, backend) {
        Some((haproxy, address)) => {
            targets.push(Target {
                name: "haproxy",
                address,
                pid: Some(haproxy.0.id()),
            });
            proxies.push(haproxy);
        }
        None => println!("haproxy: SKIPPED, not installed (apt-get install haproxy)"),
    }

    let request = d.join("request.bin");
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); targets.len()];
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..targets.len()).collect()
        } else {
            (0..targets.len()).rev().collect()
        };
        for i in order {
            let target = &targets[i];
            let before = target.pid.map(cpu_seconds);
            let Some(mut run) = h2load(target.address, &request, seconds) else {
                println!("  {}: measurement failed", target.name);
                continue;
            };
            if let (Some(pid), Some(before)) = (target.pid, before) {
                run.cpu = cpu_seconds(pid) - before;
            }
            runs[i].push(run);
        }
    }
    println!("unary gRPC, h2load -t1 -c16 -m10 for {seconds} s, {rounds} rounds");
    let rate = |i: usize| spread(&runs[i].iter().map(|r| r.rate).collect::<Vec<_>>());
    let (direct, _) = rate(0);
    let haproxy = targets
        .iter()
        .position(|t| t.name == "haproxy")
        .map(|i| rate(i).0);
    let haproxy_cpu = targets.iter().position(|t| t.name == "haproxy").map(|i| {
        let cpu: f64 = runs[i].iter().map(|r| r.cpu).sum();
        let calls: f64 = runs[i].iter().map(|r| r.calls).sum();
        cpu / calls
    });
    for (i, target) in targets.iter().enumerate() {
        let (mean, half) = rate(i);
        let mut line = format!("  {:<8} {mean:>9.0} ± {half:.0} calls/s", target.name);
        if i > 0 {
            line.push_str(&format!("   {:.3} × backend", mean / direct));
            if let Some(h) = haproxy.filter(|_| target.name != "haproxy") {
                line.push_str(&format!("   {:.3} × haproxy", mean / h));
            }
            let cpu: f64 = runs[i].iter().map(|r| r.cpu).sum();
            let calls: f64 = runs[i].iter().map(|r| r.calls).sum();
            if calls > 0.0 {
                line.push_str(&format!(
                    "   CPU {:.3} ms per 1 000 calls",
                    cpu / calls * 1e6
                ));
                if let Some(h) = haproxy_cpu.filter(|_| target.name != "haproxy") {
                    line.push_str(&format!(" ({:.3} × haproxy)", cpu / calls / h));
                }
            }
        }
        println!("{line}");
    }
    drop(proxies);
}

/// One h2load run: calls/s and calls that succeeded.
fn h2load(address: SocketAddr, request: &Path, seconds: u64) -> Option<Run> {
    let out = Command::new("h2load")
        .args([
            "-t1",
            "-c16",
            "-m10",
            "-D",
            &seconds.to_string(),
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "-d",
            &request.display().to_string(),
            &format!("http://{address}/bench.Echo/Unary"),
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rate: f64 = text
        .lines()
        .find(|l| l.starts_with("finished in"))?
        .split(", ")
        .nth(1)?
        .trim_end_matches(" req/s")
        .parse()
        .ok()?;
    let line = text.lines().find(|l| l.starts_with("status codes:"))?;
    let ok: f64 = line
        .trim_start_matches("status codes:")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(Run {
        rate,
        calls: ok,
        cpu: 0.0,
    })
}

fn start_cutover(dir: &Path, backend: SocketAddr) -> (Owned, SocketAddr) {
    let listen = free_port();
    let config = format!(
        "[admin]\nbind = \"127.0.0.1:0\"\n\n[log]\nlevel = \"warn\"\n\n[[listeners]]\nname = \"grpc\"\nbind = \"{listen}\"\n\n[[routes]]\nname = \"echo\"\nlisteners = [\"grpc\"]\npath_prefix = \"/bench.Echo/\"\nupstream = \"echo\"\n\n[upstreams.echo]\nprotocol = \"h2c\"\nbackends = [{{ addr = \"{backend}\" }}]\n"
    );
    let path = dir.join("cutover.toml");
    std::fs::write(&path, config).expect("write config");
    let (child, _) = common::start_gateway(&path);
    assert!(wait_for(listen), "cutover is not listening on {listen}");
    (Owned(child), listen)
}

fn start_nginx(dir: &Path, backend: SocketAddr) -> Option<(Owned, SocketAddr)> {
    let listen = free_port();
    let d = dir.display();
    let config = format!(
        "daemon off;\nworker_processes 2;\nerror_log {d}/nginx-error.log;\npid {d}/nginx.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  keepalive_requests 10000000;\n  client_body_temp_path {d};\n  upstream backend {{ server {backend}; keepalive 128; }}\n  server {{\n    listen {listen} http2;\n    location / {{ grpc_pass grpc://backend; }}\n  }}\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), config).ok()?;
    let child = Command::new("nginx")
        .args([
            "-c",
            &format!("{d}/nginx.conf"),
            "-e",
            &format!("{d}/nginx-error.log"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let child = Owned(child);
    wait_for(listen).then_some((child, listen))
}

fn start_haproxy(dir: &Path, backend: SocketAddr) -> Option<(Owned, SocketAddr)> {
    if !which("haproxy") {
        return None;
    }
    let listen = free_port();
    let config = format!(
        "global\n  nbthread 2\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\nfrontend fe\n  bind {listen} proto h2\n  default_backend be\nbackend be\n  http-reuse always\n  server s1 {backend} proto h2\n"
    );
    let path = dir.join("haproxy.cfg");
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

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
use std::process::{Command, Stdio};

use common::{env_u64, free_port, rounds_of, wait_for, which, Owned, Run, Target};

/// One framed `grpc.health.v1.HealthCheckResponse { status: SERVING }`:
/// the request body and the backend's answer.
const MESSAGE: &[u8] = &[0, 0, 0, 0, 2, 8, 1];

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
    let started = [
        ("cutover", Some(start_cutover(d, backend))),
        ("nginx", start_nginx(d, backend)),
        ("haproxy", start_haproxy(d, backend)),
    ];
    for (name, proxy) in started {
        let Some((process, address)) = proxy else {
            println!("{name}: SKIPPED, not installed or would not start (apt-get install nginx-light haproxy)");
            continue;
        };
        targets.push(Target {
            name,
            address,
            pid: Some(process.0.id()),
        });
        proxies.push(process);
    }

    let request = d.join("request.bin");
    rounds_of(
        &format!("unary gRPC, h2load -t1 -c16 -m10 for {seconds} s, {rounds} rounds"),
        "calls/s",
        "ms per 1 000 calls",
        &targets,
        rounds,
        |target| h2load(target.address, &request, seconds),
    );
    drop(proxies);
}

/// One h2load run: calls/s, and the calls that succeeded in the unit CPU
/// is reported per (CPU seconds per million calls: ms per 1 000).
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
        cpu: 0.0,
        work: ok / 1e6,
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

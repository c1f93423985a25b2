//! End-to-end load: direct to a backend versus through cutover, in one run.
//!
//! Starts a small hyper backend (HTTP/1.1 and h2c) on loopback and the real
//! `cutover` binary in front of it, then drives keep-alive load with `wrk`
//! (HTTP/1.1) and `h2load` (h2c) from Debian's packages when installed,
//! or with a built-in hyper load generator otherwise. Prints requests/s and
//! p50/p99 latency for (a) direct, (b) through cutover, and the ratios b/a;
//! then (c) the same load through cutover while 1 000 activations run,
//! with the error count and the p99 ratio against (b); and (d) the latency
//! each target adds below saturation: an open-loop rate of half cutover's
//! closed-loop throughput (`CUTOVER_BENCH_PACED_PERCENT`) on every target,
//! from the built-in generator, which charges a request the wait when its
//! connection fell behind.
//!
//! nginx and HAProxy, when installed, do the same work (HTTP/1.1 and h2c
//! in front, keep-alive HTTP/1.1 to the backend; nginx with
//! `keepalive_requests` raised, as its default of 1 000 closes client
//! connections, and h2load does not follow a GOAWAY).
//!
//! The HTTP/1.1 runs (direct, cutover, nginx, HAProxy) are repeated in
//! rounds of alternating order and averaged, so that a neighbour that
//! comes and goes during the benchmark weighs on all of them alike.
//!
//! Run: `cargo bench --bench proxy` (`CUTOVER_BENCH_SECONDS` sets the
//! duration of each run, default 10; `CUTOVER_BENCH_ROUNDS` the number of
//! HTTP/1.1 rounds, default 2).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};

mod common;

const CONNECTIONS: usize = 64;

struct Run {
    label: String,
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

fn main() {
    // `cargo test --benches` and `cargo bench --no-run` must not run load.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let setting = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let seconds = setting("CUTOVER_BENCH_SECONDS", 10);
    let rounds = setting("CUTOVER_BENCH_ROUNDS", 2).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let backend = runtime.block_on(start_backend());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "[admin]\nbind = \"127.0.0.1:0\"\n\n[log]\nlevel = \"warn\"\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n[[routes]]\nname = \"all\"\nlisteners = [\"web\"]\nupstream = \"app\"\n\n[upstreams.app]\nbackends = [{{ addr = \"{backend}\" }}]\n"
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &config).expect("write config");
    let (mut gateway, web, admin) = start_gateway(&path);
    let have_wrk = which("wrk");
    let have_h2load = which("h2load");
    println!(
        "load: {CONNECTIONS} keep-alive connections, {seconds}s per run, {rounds} HTTP/1.1 rounds, generator: {}",
        if have_wrk { "wrk -t1" } else { "built-in" }
    );

    // The same work through nginx and HAProxy, when installed, for scale.
    let mut targets = vec![("a) direct", backend), ("b) cutover", web)];
    let mut running_references = Vec::new();
    for reference in [Reference::Nginx, Reference::Haproxy] {
        if let Some(running) = reference.start(dir.path(), backend) {
            targets.push((reference.label(), running.address));
            running_references.push(running);
        }
    }
    let mut measured: Vec<Vec<Run>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (label, address) = targets[i];
            let run = http1(&runtime, have_wrk, address, seconds, label);
            println!(
                "  round {}: {label:<14} {:>9.0} req/s, p99 {:.3} ms",
                round + 1,
                run.requests_per_sec,
                run.p99_ms
            );
            measured[i].push(run);
        }
    }
    let mut means = measured.iter().map(|runs| mean(runs));
    let mut runs: Vec<Run> = means.by_ref().take(2).collect();
    let mut references: Vec<Run> = means.collect();

    // (d) The latency each adds below saturation: the same open-loop rate
    // (a fraction of cutover's closed-loop throughput) on every target.
    let fraction = setting("CUTOVER_BENCH_PACED_PERCENT", 50) as f64 / 100.0;
    let rate = runs[1].requests_per_sec * fraction;
    let paced: Vec<Run> = targets
        .iter()
        .map(|(label, address)| {
            runtime.block_on(paced(*address, rate, seconds, &format!("{label} paced")))
        })
        .collect();
    if have_h2load {
        runs.push(h2(backend, seconds, "a) direct h2c"));
        runs.push(h2(web, seconds, "b) cutover h2c"));
        for (running, i) in running_references.iter().zip(2..) {
            let label = format!("{} h2c", targets[i].0);
            references.push(h2(running.h2c, seconds, &label));
        }
    }
    for running in &mut running_references {
        running.stop();
    }

    // (c) the HTTP/1.1 load again, while 1 000 activations alternate two configurations.
    let stop = Arc::new(AtomicBool::new(false));
    let activations = Arc::new(AtomicU64::new(0));
    let activation_errors = Arc::new(AtomicU64::new(0));
    let activator = {
        let (stop, activations, errors) = (
            Arc::clone(&stop),
            Arc::clone(&activations),
            Arc::clone(&activation_errors),
        );
        let config = config.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async move {
                let mut i = 0u64;
                while i < 1000 && !stop.load(Ordering::Relaxed) {
                    let candidate = config.replace(
                        "upstream = \"app\"",
                        &format!("upstream = \"app\"\ntimeout = \"{}s\"", 10 + i % 2),
                    );
                    match post_toml(admin, "/admin/runtime/activate", candidate).await {
                        Ok(200) => {}
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    activations.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        })
    };
    let mut during = http1(&runtime, have_wrk, web, seconds, "c) cutover + activations");
    stop.store(true, Ordering::Relaxed);
    let _ = activator.join();
    during.errors += activation_errors.load(Ordering::Relaxed);
    runs.push(during);

    println!();
    println!(
        "{:<28} {:>12} {:>10} {:>10} {:>8}",
        "run", "req/s", "p50 ms", "p99 ms", "errors"
    );
    for r in &runs {
        println!(
            "{:<28} {:>12.0} {:>10.3} {:>10.3} {:>8}",
            r.label, r.requests_per_sec, r.p50_ms, r.p99_ms, r.errors
        );
    }
    for r in &references {
        println!(
            "{:<28} {:>12.0} {:>10.3} {:>10.3} {:>8}",
            r.label, r.requests_per_sec, r.p50_ms, r.p99_ms, r.errors
        );
    }
    println!();
    println!(
        "d) open loop at {rate:.0} req/s ({:.0} % of cutover's closed-loop throughput):",
        fraction * 100.0
    );
    for r in &paced {
        println!(
            "{:<28} {:>12.0} {:>10.3} {:>10.3} {:>8}",
            r.label, r.requests_per_sec, r.p50_ms, r.p99_ms, r.errors
        );
    }
    for r in &paced[1..] {
        println!(
            "{} p50 ratio /a: {:.3}, p99 ratio /a: {:.3}",
            r.label,
            r.p50_ms / paced[0].p50_ms,
            r.p99_ms / paced[0].p99_ms
        );
    }
    let (a, b, c) = (&runs[0], &runs[1], &runs[runs.len() - 1]);
    println!();
    println!(
        "HTTP/1.1 throughput ratio b/a: {:.3}",
        b.requests_per_sec / a.requests_per_sec
    );
    println!("HTTP/1.1 p99 ratio b/a:        {:.3}", b.p99_ms / a.p99_ms);
    for r in references.iter().filter(|r| !r.label.ends_with("h2c")) {
        println!(
            "{} throughput ratio /a: {:.3}, p99 ratio /a: {:.3}",
            r.label.trim_start_matches("r) "),
            r.requests_per_sec / a.requests_per_sec,
            r.p99_ms / a.p99_ms
        );
    }
    if runs.len() > 3 {
        let direct_h2c = runs[2].requests_per_sec;
        println!(
            "h2c throughput ratio b/a:      {:.3}",
            runs[3].requests_per_sec / direct_h2c
        );
        for r in references.iter().filter(|r| r.label.ends_with("h2c")) {
            println!(
                "{} throughput ratio /a: {:.3}",
                r.label.trim_start_matches("r) "),
                r.requests_per_sec / direct_h2c
            );
        }
    }
    println!(
        "during {} activations: {} errors, p99 ratio c/b {:.3}, throughput ratio c/b {:.3}",
        activations.load(Ordering::Relaxed),
        c.errors,
        c.p99_ms / b.p99_ms,
        c.requests_per_sec / b.requests_per_sec
    );
    let _ = gateway.kill();
    let _ = gateway.wait();
}

/// The average of repeated runs of one target (errors are summed).
fn mean(runs: &[Run]) -> Run {
    let n = runs.len().max(1) as f64;
    let average = |f: fn(&Run) -> f64| runs.iter().map(f).sum::<f64>() / n;
    Run {
        label: runs.first().map(|r| r.label.clone()).unwrap_or_default(),
        requests_per_sec: average(|r| r.requests_per_sec),
        p50_ms: average(|r| r.p50_ms),
        p99_ms: average(|r| r.p99_ms),
        errors: runs.iter().map(|r| r.errors).sum(),
    }
}

/// Reference proxies run in the same benchmark, when installed
/// (`apt-get install nginx-light haproxy`), with keep-alive to the backend
/// and two workers, like cutover on this machine.
#[derive(Clone, Copy)]
enum Reference {
    Nginx,
    Haproxy,
}

struct RunningReference {
    address: SocketAddr,
    /// The same proxy speaking h2c (prior knowledge).
    h2c: SocketAddr,
    child: Child,
}

impl RunningReference {
    /// SIGTERM, so that nginx's master takes its workers down with it
    /// (killed outright, it left them running, orphaned); SIGKILL if it
    /// is not gone within 5 s.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Reference {
    fn label(self) -> &'static str {
        match self {
            Reference::Nginx => "r) nginx",
            Reference::Haproxy => "r) haproxy",
        }
    }

    fn start(self, dir: &std::path::Path, backend: SocketAddr) -> Option<RunningReference> {
        let binary = match self {
            Reference::Nginx => "nginx",
            Reference::Haproxy => "haproxy",
        };
        if !which(binary) {
            return None;
        }
        let free = || -> Option<SocketAddr> {
            std::net::TcpListener::bind("127.0.0.1:0")
                .ok()?
                .local_addr()
                .ok()
        };
        let (address, h2c) = (free()?, free()?);
        let d = dir.display();
        let (config, args): (String, Vec<String>) = match self {
            Reference::Nginx => (
                format!(
                    "daemon off;\nworker_processes 2;\nerror_log {d}/nginx-error.log;\npid {d}/nginx.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  keepalive_requests 10000000;\n  client_body_temp_path {d};\n  proxy_temp_path {d};\n  upstream backend {{ server {backend}; keepalive 128; }}\n  server {{\n    listen {address};\n    listen {h2c} http2;\n    location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n  }}\n}}\n"
                ),
                vec!["-c".into(), format!("{d}/nginx.conf"), "-e".into(), format!("{d}/nginx-error.log")],
            ),
            Reference::Haproxy => (
                format!(
                    "global\n  nbthread 2\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\nfrontend fe\n  bind {address}\n  bind {h2c} proto h2\n  default_backend be\nbackend be\n  http-reuse always\n  server s1 {backend}\n"
                ),
                vec!["-f".into(), format!("{d}/haproxy.cfg")],
            ),
        };
        let file = match self {
            Reference::Nginx => dir.join("nginx.conf"),
            Reference::Haproxy => dir.join("haproxy.cfg"),
        };
        std::fs::write(file, config).ok()?;
        let child = Command::new(binary)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        // Bounded wait for the port to accept.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(address).is_err() {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(RunningReference {
            address,
            h2c,
            child,
        })
    }
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn start_gateway(config: &std::path::Path) -> (Child, SocketAddr, SocketAddr) {
    let (child, ready) = common::start_gateway(config);
    let address = |value: &serde_json::Value| {
        value
            .as_str()
            .expect("address in the ready line")
            .parse()
            .expect("address")
    };
    let web = address(&ready["listeners"][0]["address"]);
    let admin = address(&ready["admin"]);
    (child, web, admin)
}

async fn start_backend() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(b"hello, world\n"),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn http1(
    runtime: &tokio::runtime::Runtime,
    have_wrk: bool,
    target: SocketAddr,
    seconds: u64,
    label: &str,
) -> Run {
    if have_wrk {
        let out = Command::new("wrk")
            .args([
                "-t1",
                &format!("-c{CONNECTIONS}"),
                &format!("-d{seconds}s"),
                "--latency",
            ])
            .arg(format!("http://{target}/"))
            .output()
            .expect("wrk");
        parse_wrk(label, &String::from_utf8_lossy(&out.stdout))
    } else {
        runtime.block_on(builtin_load(target, seconds, label))
    }
}

fn parse_wrk(label: &str, out: &str) -> Run {
    let value = |prefix: &str| -> Option<&str> {
        out.lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1))
    };
    let ms = |v: Option<&str>| -> f64 {
        let v = v.unwrap_or("0");
        if let Some(x) = v.strip_suffix("us") {
            x.parse::<f64>().unwrap_or(0.0) / 1000.0
        } else if let Some(x) = v.strip_suffix("ms") {
            x.parse().unwrap_or(0.0)
        } else if let Some(x) = v.strip_suffix('s') {
            x.parse::<f64>().unwrap_or(0.0) * 1000.0
        } else {
            0.0
        }
    };
    let errors = out
        .lines()
        .filter(|l| l.contains("Non-2xx") || l.contains("Socket errors"))
        .flat_map(|l| {
            l.split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse::<u64>().ok())
        })
        .sum();
    Run {
        label: label.to_owned(),
        requests_per_sec: value("Requests/sec:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        p50_ms: ms(value("50%")),
        p99_ms: ms(value("99%")),
        errors,
    }
}

fn h2(target: SocketAddr, seconds: u64, label: &str) -> Run {
    let out = Command::new("h2load")
        .args(["-c16", "-m10", "-t1", "-D", &seconds.to_string()])
        .arg(format!("http://{target}/"))
        .output()
        .expect("h2load");
    let out = String::from_utf8_lossy(&out.stdout);
    let rps = out
        .lines()
        .find(|l| l.starts_with("finished in"))
        .and_then(|l| l.split(',').nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let failed = out
        .lines()
        .find(|l| l.starts_with("requests:"))
        .and_then(|l| l.split(',').find(|p| p.contains("failed")))
        .and_then(|p| p.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // h2load reports mean and spread, not percentiles: keep the mean as p50.
    let mean_ms = out
        .lines()
        .find(|l| l.trim_start().starts_with("time for request:"))
        .and_then(|l| l.split_whitespace().nth(5))
        .map(|v| {
            if let Some(x) = v.strip_suffix("us") {
                x.parse::<f64>().unwrap_or(0.0) / 1000.0
            } else {
                v.trim_end_matches("ms").parse().unwrap_or(0.0)
            }
        })
        .unwrap_or(0.0);
    Run {
        label: label.to_owned(),
        requests_per_sec: rps,
        p50_ms: mean_ms,
        p99_ms: f64::NAN,
        errors: failed,
    }
}

/// Keep-alive HTTP/1.1 load without external tools.
async fn builtin_load(target: SocketAddr, seconds: u64, label: &str) -> Run {
    let (all, errors) =
        common::keep_alive_load(target, "/", CONNECTIONS, Duration::from_secs(seconds)).await;
    summarise(all, errors, seconds, label)
}

/// Open-loop HTTP/1.1 load at `rate` requests a second.
async fn paced(target: SocketAddr, rate: f64, seconds: u64, label: &str) -> Run {
    let (all, errors) =
        common::paced_load(target, "/", CONNECTIONS, rate, Duration::from_secs(seconds)).await;
    summarise(all, errors, seconds, label)
}

fn summarise(mut all: Vec<Duration>, errors: u64, seconds: u64, label: &str) -> Run {
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Run {
        label: label.to_owned(),
        requests_per_sec: all.len() as f64 / seconds as f64,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        errors,
    }
}

async fn post_toml(admin: SocketAddr, path: &str, body: String) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect(admin)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::post(path)
        .header("host", admin.to_string())
        .header("content-type", "application/toml")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    Ok(status)
}

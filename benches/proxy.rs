//! End-to-end load: direct to a backend, through cutover, through nginx and
//! through HAProxy, in one run, against a backend that costs next to
//! nothing in its own process.
//!
//! The backend is nginx answering `return 200` from one worker (HTTP/1.1
//! and h2c); without `nginx-light` it is an in-process hyper server, and
//! the bench says so (that backend competes with everything for the same
//! cores and hides most of a proxy's own cost). Every proxy, cutover
//! included, gets the same work on three fronts and keep-alive HTTP/1.1 to
//! the backend:
//!
//! - HTTP/1.1 keep-alive: `wrk -t1 -c64` (or a built-in generator);
//! - h2c with prior knowledge: `h2load -c16 -m10`;
//! - HTTPS, TLS 1.3 keep-alive: `wrk` over TLS, every proxy terminating
//!   with the same certificate (rcgen, P-256);
//! - HTTP/2 over TLS 1.3 (ALPN h2) on the same listeners: `h2load -c16
//!   -m10` to `https://` (wrk offers no ALPN, so it stays on HTTP/1.1).
//!
//! The references are nginx, HAProxy and Caddy (`reverse_proxy`, h2c on),
//! each given two workers, threads or `GOMAXPROCS` like cutover here; for
//! cutover each front also reports its data-plane workers' shares of its
//! CPU (how evenly the kernel spreads connections over their sockets). A
//! summary table of cutover's ratios per front ends the run.
//! `CUTOVER_BENCH_BASELINE=path/to/cutover` adds another build (an
//! earlier commit) as the target `baseline` in the same rounds.
//!
//! Each front is measured in rounds (`CUTOVER_BENCH_ROUNDS`, default 3)
//! of alternating order, so that a neighbour that comes and goes weighs on
//! every target alike. For each proxy it reports requests/s, **CPU per
//! proxied request** (the utime + stime of its processes, workers
//! included, over the requests of the run, from `/proc`) and latency,
//! each as the median and the range over the rounds (one slow round, a
//! neighbour's, moves a mean but not the median), and the ratios of the
//! medians against nginx and HAProxy.
//!
//! Then, HTTP/1.1 only: (c) cutover while 1 000 activations alternate two
//! configurations (errors, p99 against the run without); (d) the latency
//! each target adds below saturation: the same open-loop rate (half of
//! cutover's throughput, `CUTOVER_BENCH_PACED_PERCENT`) on every target,
//! from the built-in generator, which charges a request the wait when its
//! connection fell behind; (e) direct and cutover against the in-process
//! hyper backend, the second backend; (f) cutover with the access log
//! (JSON, to a file) off and on, in alternating rounds; (h) the route
//! without `auth`, with `auth = "none"`, with forward auth asking the
//! same nginx (`return 200`) as its auth service, and with that forward
//! auth's `cache` (every request after the first answered from it), in
//! alternating rounds: the added latency of the auth round trip, what the
//! cache saves, and the cost of the opt-out; (g) HTTP/3 through cutover
//! against its own HTTPS on the same listener and against Caddy's HTTP/3,
//! from generators in processes of their own (`http3/mod.rs`).
//!
//! Run: `cargo bench --bench proxy` (`CUTOVER_BENCH_SECONDS` sets each
//! run's length, default 10). Installs nothing: `apt-get install wrk
//! nghttp2-client nginx-light haproxy caddy` for the full picture.

use std::net::SocketAddr;

use common::{cpu_seconds, free_port, stop, thread_ticks, wait_for, which};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};

mod common;
mod http3;

const CONNECTIONS: usize = 64;

/// One measured run.
#[derive(Clone)]
struct Run {
    requests_per_sec: f64,
    /// Requests the run completed (for CPU per request).
    requests: u64,
    /// CPU seconds the target's processes used during the run.
    cpu_seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

impl Run {
    fn cpu_us_per_request(&self) -> f64 {
        self.cpu_seconds * 1e6 / self.requests.max(1) as f64
    }
}

/// What one load of one front says about a target.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Front {
    Http1,
    H2c,
    Https,
    /// HTTP/2 over TLS 1.3, ALPN h2, on the HTTPS listener.
    H2Tls,
}

impl Front {
    fn name(self) -> &'static str {
        match self {
            Front::Http1 => "HTTP/1.1",
            Front::H2c => "h2c",
            Front::Https => "HTTPS (TLS 1.3)",
            Front::H2Tls => "HTTP/2 over TLS 1.3",
        }
    }
}

/// Something load goes to: the backend itself or a proxy in front of it.
struct Target {
    label: &'static str,
    http1: SocketAddr,
    h2c: Option<SocketAddr>,
    https: Option<SocketAddr>,
    /// Processes whose CPU counts (none for the direct runs).
    pid: Option<u32>,
}

impl Target {
    fn address(&self, front: Front) -> Option<SocketAddr> {
        match front {
            Front::Http1 => Some(self.http1),
            Front::H2c => self.h2c,
            Front::Https | Front::H2Tls => self.https,
        }
    }
}

fn main() {
    // `cargo test --benches` and `cargo bench --no-run` must not run load.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    // Started again by part (g) as its HTTP/3 or HTTPS generator.
    if let Ok(spec) = std::env::var(http3::GENERATOR_ENV) {
        http3::generator_main(&spec);
        return;
    }
    let setting = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    // `CUTOVER_BENCH_ONLY=access-log,activations`: only those parts (http1,
    // h2c, https, h2-tls, open-loop, activations, access-log, hyper-backend).
    let only = std::env::var("CUTOVER_BENCH_ONLY").ok();
    let part = |name: &str| {
        only.as_deref()
            .is_none_or(|only| only.split(',').any(|p| p.trim() == name))
    };
    let seconds = setting("CUTOVER_BENCH_SECONDS", 10);
    let rounds = setting("CUTOVER_BENCH_ROUNDS", 3).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let tools = Tools::find();
    let hyper_backend = runtime.block_on(start_hyper_backend());
    let mut processes = Processes::default();
    let backend = match NginxBackend::start(dir.path(), &tools) {
        Some((backend, child)) => {
            processes.backend = Some(child);
            backend
        }
        None => {
            println!("backend: in-process hyper (install nginx-light for one in its own process)");
            NginxBackend {
                http1: hyper_backend,
                h2c: hyper_backend,
            }
        }
    };
    let (cert, key) = certificate(dir.path());
    let (gateway, gateway_config) =
        Gateway::start(dir.path(), &backend, hyper_backend, &cert, &key);
    let gateway_pid = gateway.child.id();
    println!(
        "load: {CONNECTIONS} keep-alive connections (h2c: 16 × 10 streams), {seconds}s per run, {rounds} rounds, HTTP/1.1 generator: {}",
        if tools.wrk { "wrk -t1" } else { "built-in" }
    );

    let mut targets = vec![
        Target {
            label: "direct",
            http1: backend.http1,
            h2c: Some(backend.h2c),
            https: None,
            pid: None,
        },
        Target {
            label: "cutover",
            http1: gateway.web,
            h2c: Some(gateway.web),
            https: Some(gateway.secure),
            pid: Some(gateway_pid),
        },
    ];
    // Another build in the same rounds (`CUTOVER_BENCH_BASELINE`).
    let baseline = common::baseline_binary().map(|binary| {
        Gateway::start_binary(
            dir.path(),
            &backend,
            hyper_backend,
            &cert,
            &key,
            Some(&binary),
        )
        .0
    });
    if let Some(baseline) = &baseline {
        targets.push(Target {
            label: "baseline",
            http1: baseline.web,
            h2c: Some(baseline.web),
            https: Some(baseline.secure),
            pid: Some(baseline.child.id()),
        });
    }
    for reference in [Reference::Nginx, Reference::Haproxy, Reference::Caddy] {
        if let Some((target, child)) =
            reference.start(dir.path(), &tools, backend.http1, &cert, &key)
        {
            targets.push(target);
            processes.references.push(child);
        }
    }

    let mut summary = Summary::default();
    for front in [Front::Http1, Front::H2c, Front::Https, Front::H2Tls] {
        let wanted = match front {
            Front::Http1 => part("http1"),
            Front::H2c => part("h2c"),
            Front::Https => part("https"),
            Front::H2Tls => part("h2-tls"),
        };
        if !wanted {
            continue;
        }
        let usable = match front {
            Front::Http1 => true,
            Front::H2c | Front::H2Tls => tools.h2load,
            Front::Https => tools.wrk,
        };
        if !usable {
            println!(
                "\n{}: skipped ({} not installed)",
                front.name(),
                if front == Front::Https {
                    "wrk"
                } else {
                    "h2load"
                }
            );
            continue;
        }
        let ratios = measure_front(&runtime, &tools, &targets, front, rounds, seconds);
        summary.fronts.push((front.name().to_owned(), ratios));
    }

    // (d) open loop at half of cutover's closed-loop throughput.
    if part("open-loop") {
        open_loop(
            &runtime,
            &tools,
            &targets,
            gateway.web,
            setting("CUTOVER_BENCH_PACED_PERCENT", 50),
            seconds,
        );
    }
    // (g) HTTP/3 next to HTTPS over TCP on the same listener, and next to
    // Caddy's HTTP/3.
    if part("http3") {
        let caddy = targets
            .iter()
            .find(|t| t.label == "caddy")
            .and_then(|t| Some((t.https?, t.pid?)));
        let ratios = http3_front(&gateway, caddy, &cert, rounds, seconds);
        summary.fronts.push(("HTTP/3".to_owned(), ratios));
    }
    drop(targets.split_off(2));
    drop(baseline);
    processes.stop_references();

    // (c) HTTP/1.1 through cutover while 1 000 activations run.
    if part("activations") {
        let without = http1(&runtime, &tools, gateway.web, seconds, Some(gateway_pid));
        let (during, activations, failed) =
            during_activations(&runtime, &tools, &gateway, &gateway_config, seconds);
        println!(
            "\nc) cutover during {activations} activations: {} errors ({failed} failed activations), p99 {:.3} ms vs {:.3} without (ratio {:.3}), throughput ratio {:.3}",
            during.errors + failed,
            during.p99_ms,
            without.p99_ms,
            during.p99_ms / without.p99_ms,
            during.requests_per_sec / without.requests_per_sec
        );
    }

    // (f) the access log (JSON, to a file) on and off, alternating rounds.
    if part("access-log") {
        access_log(
            &runtime,
            &tools,
            &gateway,
            &gateway_config,
            rounds,
            seconds,
            dir.path(),
        );
    }

    // (e) the second backend: the in-process hyper server.
    if part("hyper-backend") {
        let direct = http1(&runtime, &tools, hyper_backend, seconds, None);
        let through = http1(&runtime, &tools, gateway.hyper, seconds, Some(gateway_pid));
        println!(
            "\ne) in-process hyper backend: direct {:.0} req/s, cutover {:.0} req/s ({:.3}), cutover CPU {:.2} µs/request",
            direct.requests_per_sec,
            through.requests_per_sec,
            through.requests_per_sec / direct.requests_per_sec,
            through.cpu_us_per_request()
        );
    }
    // (h) route authentication: none, `auth = "none"`, forward auth.
    if part("auth") {
        auth_costs(&runtime, &tools, &gateway, &gateway_config, rounds, seconds);
    }
    summary.print();
    drop(gateway);
    drop(processes);
}

/// (g): HTTP/3 and HTTPS GETs on cutover's `secure` listener, and HTTP/3
/// GETs on Caddy's HTTPS site (when Caddy runs), from generators in
/// processes of their own, in rounds of rotating order: throughput and
/// each proxy's CPU per request. Returns cutover's HTTP/3 ratios to its
/// own HTTPS and to Caddy's HTTP/3.
fn http3_front(
    gateway: &Gateway,
    caddy: Option<(SocketAddr, u32)>,
    cert: &Path,
    rounds: u64,
    seconds: u64,
) -> Vec<Ratio> {
    let pid = gateway.child.id();
    let (mut tcp, mut quic, mut peer) = (Vec::new(), Vec::new(), Vec::new());
    let mut spreads = Vec::new();
    let busy = std::cell::RefCell::new(Vec::new());
    let run = |kind: &str, target: SocketAddr, pid: u32| {
        with_cpu(Some(pid), || {
            let generated = http3::generate(kind, target, cert, seconds);
            busy.borrow_mut().push(generated.busy);
            Run {
                requests_per_sec: generated.requests as f64 / seconds as f64,
                requests: generated.requests,
                cpu_seconds: 0.0,
                p50_ms: generated.p50_ms,
                p99_ms: generated.p99_ms,
                errors: generated.errors,
            }
        })
    };
    for round in 0..rounds {
        // Each round opens its QUIC connections anew: where they land
        // (by the Initial's connection ID, see `sockets::steer_quic`) is
        // the round's spread over the workers.
        let h3 = || {
            let before = thread_ticks(pid, WORKER_THREAD);
            let measured = run("h3", gateway.secure, pid);
            let used: Vec<u64> = thread_ticks(pid, WORKER_THREAD)
                .into_iter()
                .map(|(tid, ticks)| ticks.saturating_sub(before.get(&tid).copied().unwrap_or(0)))
                .collect();
            (measured, used)
        };
        let mut order = vec![0, 1, 2];
        order.rotate_left((round % 3) as usize);
        for which in order {
            match which {
                0 => tcp.push(run("https", gateway.secure, pid)),
                1 => {
                    let (measured, used) = h3();
                    quic.push(measured);
                    let total: u64 = used.iter().sum();
                    if total > 0 {
                        spreads.push(
                            used.iter()
                                .map(|t| format!("{:.0}", *t as f64 * 100.0 / total as f64))
                                .collect::<Vec<_>>()
                                .join("/"),
                        );
                    }
                }
                _ => {
                    if let Some((address, caddy_pid)) = caddy {
                        peer.push(run("h3", address, caddy_pid));
                    }
                }
            }
        }
    }
    let median = |runs: &[Run], f: &dyn Fn(&Run) -> f64| spread(runs, f).0;
    let rps = |runs: &[Run]| median(runs, &|r| r.requests_per_sec);
    let cpu = |runs: &[Run]| median(runs, &|r| r.cpu_us_per_request());
    let errors: u64 = tcp.iter().chain(&quic).chain(&peer).map(|r| r.errors).sum();
    println!(
        "\ng) HTTPS over TCP ({CONNECTIONS} keep-alive connections) and HTTP/3 ({} connections × {} streams), generators in their own process, {rounds} rounds:",
        http3::H3_CONNECTIONS,
        http3::H3_STREAMS
    );
    let mut lines = vec![("cutover HTTPS/TCP", &tcp), ("cutover HTTP/3", &quic)];
    if caddy.is_some() {
        lines.push(("Caddy HTTP/3", &peer));
    }
    for (label, runs) in &lines {
        let (r, lo, hi) = spread(runs, |r| r.requests_per_sec);
        let (c, clo, chi) = spread(runs, Run::cpu_us_per_request);
        println!(
            "   {label:<18} {r:>9.0} req/s ({lo:.0}–{hi:.0})  {c:>7.1} µs CPU/request ({clo:.1}–{chi:.1})  p99 {:.2} ms",
            median(runs, &|r| r.p99_ms)
        );
    }
    let mut ratios = vec![("own HTTPS", rps(&quic) / rps(&tcp), cpu(&quic) / cpu(&tcp))];
    println!(
        "   cutover HTTP/3 / own HTTPS: throughput {:.3}, CPU per request {:.3}",
        ratios[0].1, ratios[0].2
    );
    if caddy.is_some() {
        ratios.push(("caddy", rps(&quic) / rps(&peer), cpu(&quic) / cpu(&peer)));
        println!(
            "   cutover HTTP/3 / Caddy HTTP/3: throughput {:.3}, CPU per request {:.3}",
            ratios[1].1, ratios[1].2
        );
    } else {
        println!("   Caddy HTTP/3: not measured (install caddy)");
    }
    let busy = busy.into_inner();
    let (least, most) = busy.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), b| {
        (lo.min(*b), hi.max(*b))
    });
    println!(
        "   errors {errors}; each generator kept {:.0}–{:.0} % of a core busy",
        least * 100.0,
        most * 100.0
    );
    println!(
        "   HTTP/3 workers' shares of their CPU (%), per round: {}",
        spreads.join(", ")
    );
    ratios
}

/// (d): the same open-loop rate, `percent` of cutover's closed-loop
/// throughput, on every target.
fn open_loop(
    runtime: &tokio::runtime::Runtime,
    tools: &Tools,
    targets: &[Target],
    cutover: SocketAddr,
    percent: u64,
    seconds: u64,
) {
    let fraction = percent as f64 / 100.0;
    let cutover_rate = http1(runtime, tools, cutover, seconds.min(5), None).requests_per_sec;
    let rate = cutover_rate * fraction;
    println!(
        "\nd) open loop at {rate:.0} req/s ({:.0} % of cutover's closed-loop HTTP/1.1 throughput):",
        fraction * 100.0
    );
    let mut paced_runs = Vec::new();
    for target in targets {
        let run = runtime.block_on(paced(target.http1, rate, seconds));
        println!(
            "  {:<10} p50 {:>7.3} ms  p99 {:>7.3} ms  errors {}",
            target.label, run.p50_ms, run.p99_ms, run.errors
        );
        paced_runs.push((target.label, run));
    }
    if let Some((_, direct)) = paced_runs.first() {
        for (label, run) in &paced_runs[1..] {
            println!(
                "  {label:<10} p99 / direct {:.3}, p50 / direct {:.3}",
                run.p99_ms / direct.p99_ms,
                run.p50_ms / direct.p50_ms
            );
        }
    }
}

/// Rounds of one front over every target that speaks it, then the table.
fn measure_front(
    runtime: &tokio::runtime::Runtime,
    tools: &Tools,
    targets: &[Target],
    front: Front,
    rounds: u64,
    seconds: u64,
) -> Vec<Ratio> {
    let present: Vec<&Target> = targets
        .iter()
        .filter(|t| t.address(front).is_some())
        .collect();
    let mut runs: Vec<Vec<Run>> = present.iter().map(|_| Vec::new()).collect();
    // CPU ticks of each of cutover's data-plane workers over its runs.
    let mut workers: std::collections::BTreeMap<u32, u64> = Default::default();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..present.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let target = present[i];
            let Some(address) = target.address(front) else {
                continue;
            };
            let cutover = target.pid.filter(|_| target.label == "cutover");
            let before = cutover.map(|pid| thread_ticks(pid, WORKER_THREAD));
            let run = match front {
                Front::Http1 => http1(runtime, tools, address, seconds, target.pid),
                Front::H2c => h2load(&format!("http://{address}/"), seconds, target.pid),
                Front::Https => https(address, seconds, target.pid),
                Front::H2Tls => h2load(&format!("https://{address}/"), seconds, target.pid),
            };
            if let (Some(pid), Some(before)) = (cutover, before) {
                for (tid, ticks) in thread_ticks(pid, WORKER_THREAD) {
                    *workers.entry(tid).or_default() +=
                        ticks.saturating_sub(before.get(&tid).copied().unwrap_or(0));
                }
            }
            runs[i].push(run);
        }
    }
    println!("\n{} ({} rounds):", front.name(), rounds);
    println!(
        "  {:<10} {:>20} {:>22} {:>10} {:>10} {:>7}",
        "target", "req/s (range)", "CPU µs/req (range)", "p50 ms", "p99 ms", "errors"
    );
    for (target, runs) in present.iter().zip(&runs) {
        let rps = spread(runs, |r| r.requests_per_sec);
        let cpu = spread(runs, Run::cpu_us_per_request);
        let cpu = if target.pid.is_some() {
            format!("{:.2} ({:.2}–{:.2})", cpu.0, cpu.1, cpu.2)
        } else {
            "-".into()
        };
        println!(
            "  {:<10} {:>20} {:>22} {:>10.3} {:>10.3} {:>7}",
            target.label,
            format!("{:.0} ({:.0}–{:.0})", rps.0, rps.1, rps.2),
            cpu,
            spread(runs, |r| r.p50_ms).0,
            spread(runs, |r| r.p99_ms).0,
            runs.iter().map(|r| r.errors).sum::<u64>()
        );
    }
    let total: u64 = workers.values().sum();
    if total > 0 {
        let shares: Vec<String> = workers
            .values()
            .map(|t| format!("{:.1} %", *t as f64 * 100.0 / total as f64))
            .collect();
        println!(
            "  cutover's {} workers' shares of their CPU: {}",
            workers.len(),
            shares.join(" / ")
        );
    }
    let mut ratios = Vec::new();
    let find = |label: &str| present.iter().position(|t| t.label == label);
    if let Some(c) = find("cutover") {
        for reference in ["baseline", "nginx", "haproxy", "caddy", "direct"] {
            let Some(r) = find(reference) else { continue };
            let ratio = |f: fn(&Run) -> f64| spread(&runs[c], f).0 / spread(&runs[r], f).0;
            let cpu = present[r].pid.map(|_| ratio(Run::cpu_us_per_request));
            println!(
                "  cutover / {reference}: throughput {:.3}{}, p99 {:.3}",
                ratio(|r| r.requests_per_sec),
                cpu.map(|c| format!(", CPU per request {c:.3}"))
                    .unwrap_or_default(),
                ratio(|r| r.p99_ms)
            );
            if let Some(cpu) = cpu {
                ratios.push((reference, ratio(|r| r.requests_per_sec), cpu));
            }
        }
    }
    ratios
}

/// Names of cutover's data-plane threads (`/proc` truncates to 15 bytes).
const WORKER_THREAD: &str = "cutover-worker";

/// cutover's ratio to one reference on one front: (reference, throughput
/// ratio, CPU-per-request ratio).
type Ratio = (&'static str, f64, f64);

/// cutover's ratios to each reference, per front: one table at the end.
#[derive(Default)]
struct Summary {
    fronts: Vec<(String, Vec<Ratio>)>,
}

impl Summary {
    fn print(&self) {
        if self.fronts.is_empty() {
            return;
        }
        let references = ["baseline", "nginx", "haproxy", "caddy", "own HTTPS"];
        println!("\nSummary: cutover / reference, throughput × and CPU per request × (CPU < 1: cutover spends less)");
        print!("  {:<18}", "front");
        for reference in references {
            print!(" {reference:>22}");
        }
        println!();
        for (front, ratios) in &self.fronts {
            print!("  {front:<18}");
            for reference in references {
                match ratios.iter().find(|(r, _, _)| *r == reference) {
                    Some((_, rps, cpu)) => print!(" {:>22}", format!("{rps:.3} / {cpu:.3}")),
                    None => print!(" {:>22}", "—"),
                }
            }
            println!();
        }
    }
}

/// The median of the rounds' values (the mean of the middle two for an
/// even count), their smallest and their largest.
fn spread(runs: &[Run], f: impl Fn(&Run) -> f64) -> (f64, f64, f64) {
    let mut values: Vec<f64> = runs.iter().map(f).filter(|v| v.is_finite()).collect();
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n.is_multiple_of(2) {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    } else {
        values[n / 2]
    };
    (median, values[0], values[n - 1])
}

/// The load tools found on this machine.
struct Tools {
    wrk: bool,
    h2load: bool,
    nginx: bool,
    haproxy: bool,
    caddy: bool,
}

impl Tools {
    fn find() -> Self {
        Self {
            wrk: which("wrk"),
            h2load: which("h2load"),
            nginx: which("nginx"),
            haproxy: which("haproxy"),
            caddy: which("caddy"),
        }
    }
}

/// Child processes stopped with SIGTERM (nginx's master takes its
/// workers down with it; SIGKILL on the master had left them running),
/// then SIGKILL if still there after 5 s.
#[derive(Default)]
struct Processes {
    backend: Option<Child>,
    references: Vec<Child>,
}

impl Processes {
    /// Stops the reference proxies.
    fn stop_references(&mut self) {
        for child in &mut self.references {
            stop(child);
        }
        self.references.clear();
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop_references();
        if let Some(child) = &mut self.backend {
            stop(child);
        }
    }
}

/// Runs `load`, charging the CPU `pid` used meanwhile to the run.
fn with_cpu(pid: Option<u32>, load: impl FnOnce() -> Run) -> Run {
    let before = pid.map(cpu_seconds);
    let mut run = load();
    if let (Some(pid), Some(before)) = (pid, before) {
        run.cpu_seconds = cpu_seconds(pid) - before;
    }
    run
}

/// nginx answering `return 200` from one worker: the backend.
struct NginxBackend {
    http1: SocketAddr,
    h2c: SocketAddr,
}

impl NginxBackend {
    fn start(dir: &Path, tools: &Tools) -> Option<(Self, Child)> {
        if !tools.nginx {
            return None;
        }
        let (http1, h2c) = (free_port(), free_port());
        let d = dir.display();
        let config = format!(
            "daemon off;\nworker_processes 1;\nerror_log {d}/backend-error.log;\npid {d}/backend.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  keepalive_requests 10000000;\n  client_body_temp_path {d};\n  server {{\n    listen {http1};\n    listen {h2c} http2;\n    location / {{ return 200 \"hello, world\\n\"; }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join("backend.conf"), config).ok()?;
        let child = Command::new("nginx")
            .args([
                "-c",
                &format!("{d}/backend.conf"),
                "-e",
                &format!("{d}/backend-error.log"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        wait_for(http1).then_some((Self { http1, h2c }, child))
    }
}

/// A self-signed certificate every TLS front uses.
fn certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("certificate");
    let (cert_path, key_path) = (dir.join("site.pem"), dir.join("site.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    // HAProxy wants both in one file.
    std::fs::write(
        dir.join("site-combined.pem"),
        format!("{}{}", cert.pem(), key.serialize_pem()),
    )
    .expect("write combined");
    (cert_path, key_path)
}

/// The real `cutover` binary: `web` (HTTP/1.1 and h2c) and `secure` (TLS)
/// to the backend, `hyper` to the in-process hyper backend.
struct Gateway {
    child: Child,
    web: SocketAddr,
    secure: SocketAddr,
    hyper: SocketAddr,
    admin: SocketAddr,
}

impl Gateway {
    fn start(
        dir: &Path,
        backend: &NginxBackend,
        hyper_backend: SocketAddr,
        cert: &Path,
        key: &Path,
    ) -> (Self, String) {
        Self::start_binary(dir, backend, hyper_backend, cert, key, None)
    }

    /// As `start`, served by `binary` (this build when `None`).
    fn start_binary(
        dir: &Path,
        backend: &NginxBackend,
        hyper_backend: SocketAddr,
        cert: &Path,
        key: &Path,
        binary: Option<&Path>,
    ) -> (Self, String) {
        let config = format!(
            r#"[admin]
bind = "127.0.0.1:0"

[log]
level = "warn"
format = "json"
access = false
access_file = "{}"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[listeners]]
name = "secure"
bind = "127.0.0.1:0"
protocol = "https"
http3 = true
tls.certificates = [{{ cert = "{}", key = "{}" }}]

[[listeners]]
name = "hyper"
bind = "127.0.0.1:0"

[[routes]]
name = "all"
listeners = ["web", "secure"]
upstream = "app"

[[routes]]
name = "second"
listeners = ["hyper"]
upstream = "hyper"

[upstreams.app]
backends = [{{ addr = "{}" }}]

[upstreams.hyper]
backends = [{{ addr = "{hyper_backend}" }}]
"#,
            dir.join("access.log").display(),
            cert.display(),
            key.display(),
            backend.http1
        );
        let path = dir.join(if binary.is_some() {
            "baseline.toml"
        } else {
            "gateway.toml"
        });
        std::fs::write(&path, &config).expect("write config");
        let (child, ready) = match binary {
            Some(binary) => common::start_binary(binary, &path),
            None => common::start_gateway(&path),
        };
        let listener = |name: &str| common::ready_listener(&ready, name);
        let admin = ready["admin"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .expect("admin address");
        let gateway = Self {
            web: listener("web"),
            secure: listener("secure"),
            hyper: listener("hyper"),
            admin,
            child,
        };
        (gateway, config)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx, HAProxy and Caddy doing cutover's work, with two workers (or
/// threads, or `GOMAXPROCS`) like cutover on this machine and keep-alive
/// to the backend.
#[derive(Clone, Copy)]
enum Reference {
    Nginx,
    Haproxy,
    Caddy,
}

impl Reference {
    fn start(
        self,
        dir: &Path,
        tools: &Tools,
        backend: SocketAddr,
        cert: &Path,
        key: &Path,
    ) -> Option<(Target, Child)> {
        let (installed, binary, label) = match self {
            Reference::Nginx => (tools.nginx, "nginx", "nginx"),
            Reference::Haproxy => (tools.haproxy, "haproxy", "haproxy"),
            Reference::Caddy => (tools.caddy, "caddy", "caddy"),
        };
        if !installed {
            println!("{label}: not installed, left out");
            return None;
        }
        let (http1, h2c, https) = (free_port(), free_port(), free_port());
        let d = dir.display();
        let (file, config, args) = match self {
            Reference::Nginx => (
                dir.join("nginx.conf"),
                format!(
                    "daemon off;\nworker_processes 2;\nerror_log {d}/nginx-error.log;\npid {d}/nginx.pid;\nevents {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  keepalive_requests 10000000;\n  client_body_temp_path {d};\n  proxy_temp_path {d};\n  ssl_protocols TLSv1.3;\n  ssl_session_cache shared:SSL:10m;\n  upstream backend {{ server {backend}; keepalive 128; }}\n  server {{\n    listen {http1};\n    listen {h2c} http2;\n    listen {https} ssl http2;\n    ssl_certificate {};\n    ssl_certificate_key {};\n    location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n  }}\n}}\n",
                    cert.display(),
                    key.display()
                ),
                vec!["-c".to_owned(), format!("{d}/nginx.conf"), "-e".to_owned(), format!("{d}/nginx-error.log")],
            ),
            Reference::Haproxy => (
                dir.join("haproxy.cfg"),
                format!(
                    "global\n  nbthread 2\n  maxconn 4096\n  ssl-default-bind-options ssl-min-ver TLSv1.3\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\nfrontend fe\n  bind {http1}\n  bind {h2c} proto h2\n  bind {https} ssl crt {d}/site-combined.pem alpn h2,http/1.1\n  default_backend be\nbackend be\n  http-reuse always\n  server s1 {backend}\n"
                ),
                vec!["-f".to_owned(), format!("{d}/haproxy.cfg")],
            ),
            // Access logs are off unless asked for; `default_sni` picks the
            // certificate for clients that send no SNI (wrk to an address).
            Reference::Caddy => (
                dir.join("Caddyfile"),
                format!(
                    "{{\n  admin off\n  auto_https off\n  default_sni localhost\n  servers {{\n    protocols h1 h2 h2c h3\n  }}\n}}\nhttp://{http1} {{\n  reverse_proxy {backend}\n}}\nhttp://{h2c} {{\n  reverse_proxy {backend}\n}}\nhttps://{https} {{\n  tls {} {}\n  reverse_proxy {backend}\n}}\n",
                    cert.display(),
                    key.display()
                ),
                vec![
                    "run".to_owned(),
                    "--config".to_owned(),
                    format!("{d}/Caddyfile"),
                    "--adapter".to_owned(),
                    "caddyfile".to_owned(),
                ],
            ),
        };
        std::fs::write(file, config).ok()?;
        let child = Command::new(binary)
            .args(&args)
            .env("XDG_DATA_HOME", dir)
            .env("XDG_CONFIG_HOME", dir)
            .env("GOMAXPROCS", "2")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        if !wait_for(http1) {
            println!("{label}: did not start, left out");
            return None;
        }
        let pid = child.id();
        Some((
            Target {
                label,
                http1,
                h2c: Some(h2c),
                https: Some(https),
                pid: Some(pid),
            },
            child,
        ))
    }
}

async fn start_hyper_backend() -> SocketAddr {
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

/// Keep-alive HTTP/1.1: `wrk -t1 -c64`, or the built-in generator.
fn http1(
    runtime: &tokio::runtime::Runtime,
    tools: &Tools,
    target: SocketAddr,
    seconds: u64,
    pid: Option<u32>,
) -> Run {
    with_cpu(pid, || {
        if tools.wrk {
            wrk(&format!("http://{target}/"), seconds)
        } else {
            runtime.block_on(builtin_load(target, seconds))
        }
    })
}

/// Keep-alive HTTPS (TLS 1.3 where both ends have it, as all of these do).
fn https(target: SocketAddr, seconds: u64, pid: Option<u32>) -> Run {
    with_cpu(pid, || wrk(&format!("https://{target}/"), seconds))
}

fn wrk(url: &str, seconds: u64) -> Run {
    wrk_with(url, seconds, CONNECTIONS)
}

fn wrk_with(url: &str, seconds: u64, connections: usize) -> Run {
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--latency",
            url,
        ])
        .output()
        .expect("wrk");
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

fn parse_wrk(out: &str) -> Run {
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
    let requests = out
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Run {
        requests_per_sec: value("Requests/sec:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        requests,
        cpu_seconds: 0.0,
        p50_ms: ms(value("50%")),
        p99_ms: ms(value("99%")),
        errors,
    }
}

/// `h2load` to `url`, 16 connections of 10 concurrent streams: h2c by
/// prior knowledge for `http://`, ALPN h2 over TLS for `https://`.
fn h2load(url: &str, seconds: u64, pid: Option<u32>) -> Run {
    with_cpu(pid, || {
        let out = Command::new("h2load")
            .args(["-c16", "-m10", "-t1", "-D", &seconds.to_string()])
            .arg(url)
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
        let field = |name: &str| -> u64 {
            out.lines()
                .find(|l| l.starts_with("requests:"))
                .and_then(|l| l.split(',').find(|p| p.contains(name)))
                .and_then(|p| p.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        // h2load reports mean and spread, not percentiles: the mean as p50.
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
            requests_per_sec: rps,
            requests: field("succeeded"),
            cpu_seconds: 0.0,
            p50_ms: mean_ms,
            p99_ms: f64::NAN,
            errors: field("failed") + field("errored"),
        }
    })
}

/// Keep-alive HTTP/1.1 load without external tools.
async fn builtin_load(target: SocketAddr, seconds: u64) -> Run {
    let (all, errors) =
        common::keep_alive_load(target, "/", CONNECTIONS, Duration::from_secs(seconds)).await;
    summarise(all, errors, seconds)
}

/// Open-loop HTTP/1.1 load at `rate` requests a second.
async fn paced(target: SocketAddr, rate: f64, seconds: u64) -> Run {
    let (all, errors) =
        common::paced_load(target, "/", CONNECTIONS, rate, Duration::from_secs(seconds)).await;
    summarise(all, errors, seconds)
}

fn summarise(mut all: Vec<Duration>, errors: u64, seconds: u64) -> Run {
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Run {
        requests_per_sec: all.len() as f64 / seconds as f64,
        requests: all.len() as u64,
        cpu_seconds: 0.0,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        errors,
    }
}

/// HTTP/1.1 through cutover while 1 000 activations alternate two
/// configurations; returns the run, the activations made and how many
/// failed.
fn during_activations(
    runtime: &tokio::runtime::Runtime,
    tools: &Tools,
    gateway: &Gateway,
    config: &str,
    seconds: u64,
) -> (Run, u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let activations = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let activator = {
        let (stop, activations, failed) = (
            Arc::clone(&stop),
            Arc::clone(&activations),
            Arc::clone(&failed),
        );
        let (config, admin) = (config.to_owned(), gateway.admin);
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
                    if !matches!(
                        post_toml(admin, "/admin/runtime/activate", candidate).await,
                        Ok(200)
                    ) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    activations.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        })
    };
    let run = http1(
        runtime,
        tools,
        gateway.web,
        seconds,
        Some(gateway.child.id()),
    );
    stop.store(true, Ordering::Relaxed);
    let _ = activator.join();
    (
        run,
        activations.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    )
}

/// HTTP/1.1 through cutover with `log.access` off and on (live, by
/// activation), in alternating rounds: throughput and CPU per request.
fn access_log(
    runtime: &tokio::runtime::Runtime,
    tools: &Tools,
    gateway: &Gateway,
    config: &str,
    rounds: u64,
    seconds: u64,
    dir: &Path,
) {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for access in order {
            let candidate = config.replace("access = false", &format!("access = {access}"));
            let label = format!("access = {access}");
            let run = activated_http1(runtime, tools, gateway, candidate, &label, seconds);
            if access {
                on.push(run)
            } else {
                off.push(run)
            }
        }
    }
    let lines = std::fs::read(dir.join("access.log"))
        .map(|b| b.iter().filter(|c| **c == b'\n').count())
        .unwrap_or(0);
    let rps = |runs: &[Run]| spread(runs, |r| r.requests_per_sec);
    let cpu = |runs: &[Run]| spread(runs, Run::cpu_us_per_request);
    println!("\nf) access log, JSON to a file ({rounds} rounds each, {lines} lines written):");
    for (label, runs) in [("off", &off), ("on", &on)] {
        let (r, c) = (rps(runs), cpu(runs));
        println!(
            "  {label:<4} {:.0} req/s ({:.0}–{:.0})  CPU {:.2} µs/request ({:.2}–{:.2})  p99 {:.3} ms",
            r.0, r.1, r.2, c.0, c.1, c.2, spread(runs, |r| r.p99_ms).0
        );
    }
    println!(
        "  on / off: throughput {:.3}, CPU per request {:.3}",
        rps(&on).0 / rps(&off).0,
        cpu(&on).0 / cpu(&off).0
    );
}

/// Activates `candidate` on the gateway, then loads its `web` listener
/// with HTTP/1.1 for `seconds` (the gateway's CPU counted).
fn activated_http1(
    runtime: &tokio::runtime::Runtime,
    tools: &Tools,
    gateway: &Gateway,
    candidate: String,
    label: &str,
    seconds: u64,
) -> Run {
    let activated = runtime.block_on(post_toml(
        gateway.admin,
        "/admin/runtime/activate",
        candidate,
    ));
    assert!(matches!(activated, Ok(200)), "{label}: {activated:?}");
    http1(
        runtime,
        tools,
        gateway.web,
        seconds,
        Some(gateway.child.id()),
    )
}

/// (h): the same route four ways, alternating per round.
fn auth_costs(
    runtime: &tokio::runtime::Runtime,
    tools: &Tools,
    gateway: &Gateway,
    config: &str,
    rounds: u64,
    seconds: u64,
) {
    let route = "upstream = \"app\"\n\n[[routes]]\nname = \"second\"";
    assert!(config.contains(route), "the bench's route layout changed");
    let app = config
        .split("[upstreams.app]\nbackends = ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .expect("the app upstream");
    let variants = [
        ("no auth", config.to_owned()),
        (
            "auth = \"none\"",
            config.replacen(route, &format!("auth = \"none\"\n{route}"), 1),
        ),
        (
            "forward auth",
            format!(
                "{}\n[upstreams.authz]\nbackends = {app}\n",
                config.replacen(
                    route,
                    &format!(
                        "auth = {{ forward = {{ url = \"http://authz/auth\", timeout = \"1s\" }} }}\n{route}"
                    ),
                    1
                )
            ),
        ),
        (
            "forward, cached",
            format!(
                "{}\n[upstreams.authz]\nbackends = {app}\n",
                config.replacen(
                    route,
                    &format!(
                        "auth = {{ forward = {{ url = \"http://authz/auth\", timeout = \"1s\", cache = {{ ttl = \"60s\" }} }} }}\n{route}"
                    ),
                    1
                )
            ),
        ),
    ];
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); variants.len()];
    // One connection, one request at a time: the latency each adds.
    let mut alone: Vec<Vec<Run>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds as usize {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let (label, candidate) = &variants[i];
            runs[i].push(activated_http1(
                runtime,
                tools,
                gateway,
                candidate.clone(),
                label,
                seconds,
            ));
            if tools.wrk {
                alone[i].push(wrk_with(
                    &format!("http://{}/", gateway.web),
                    seconds.div_ceil(2),
                    1,
                ));
            }
        }
    }
    println!("\nh) route authentication ({rounds} rounds each, alternating):");
    for ((label, _), runs) in variants.iter().zip(&runs) {
        println!(
            "  {label:<16} {:.0} req/s  CPU {:.2} µs/request  p50 {:.3} ms  p99 {:.3} ms  errors {}",
            spread(runs, |r| r.requests_per_sec).0,
            spread(runs, Run::cpu_us_per_request).0,
            spread(runs, |r| r.p50_ms).0,
            spread(runs, |r| r.p99_ms).0,
            runs.iter().map(|r| r.errors).sum::<u64>()
        );
    }
    if tools.wrk {
        let p50 = |i: usize| spread(&alone[i], |r| r.p50_ms).0 * 1000.0;
        println!(
            "  one connection, p50: no auth {:.0} µs, auth = \"none\" {:.0} µs, forward auth {:.0} µs (+{:.0} µs for the auth round trip), cached {:.0} µs",
            p50(0),
            p50(1),
            p50(2),
            p50(2) - p50(0),
            p50(3)
        );
    }
    let base = &runs[0];
    for (i, label) in [
        (1, "auth = \"none\""),
        (2, "forward auth"),
        (3, "forward auth, cached"),
    ] {
        println!(
            "  {label} / no auth: throughput {:.3}, CPU per request {:.3}, p50 {:.3}",
            spread(&runs[i], |r| r.requests_per_sec).0 / spread(base, |r| r.requests_per_sec).0,
            spread(&runs[i], Run::cpu_us_per_request).0 / spread(base, Run::cpu_us_per_request).0,
            spread(&runs[i], |r| r.p50_ms).0 / spread(base, |r| r.p50_ms).0,
        );
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

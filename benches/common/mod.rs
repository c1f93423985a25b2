//! What the benchmarks share: configurations and starting the binary.

// Each benchmark uses only some of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

/// Starts the real `cutover` binary on `config` and waits for its ready
/// line; returns the child and the ready line's JSON (addresses, pid).
/// `CUTOVER_BENCH_BINARY` names another build to measure (an A/B against
/// an earlier commit).
pub fn start_gateway(config: &std::path::Path) -> (Child, serde_json::Value) {
    let binary = std::env::var_os("CUTOVER_BENCH_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_cutover").into());
    start_binary(binary.as_ref(), config)
}

/// `CUTOVER_BENCH_BASELINE`: another build (an earlier commit) measured
/// beside this one in the same run, where a bench offers it.
pub fn baseline_binary() -> Option<std::path::PathBuf> {
    std::env::var_os("CUTOVER_BENCH_BASELINE").map(Into::into)
}

/// Starts `binary` (a cutover build) on `config`, as `start_gateway`.
pub fn start_binary(
    binary: &std::path::Path,
    config: &std::path::Path,
) -> (Child, serde_json::Value) {
    let mut child = Command::new(binary)
        .args(["run", "-c"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start cutover");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = loop {
        let line = lines
            .next()
            .expect("cutover exited before ready")
            .expect("read");
        if line.contains("\"event\":\"ready\"") {
            break line;
        }
    };
    // Keep draining stdout so that the gateway never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    (child, serde_json::from_str(&ready).expect("ready JSON"))
}

/// The address listener `name` bound, from the gateway's ready line.
pub fn ready_listener(ready: &serde_json::Value, name: &str) -> SocketAddr {
    ready["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["name"] == name)
        .and_then(|l| l["address"].as_str())
        .and_then(|a| a.parse().ok())
        .expect("listener in the ready line")
}

/// A configuration with `n` routes over `n / 10` upstreams: a quarter
/// exact hosts, a quarter wildcards, a quarter host-less prefixes, a
/// quarter regexes (unique to `salt`, so that nothing is cached).
pub fn mixed_config(n: usize, salt: u64) -> String {
    let mut out = String::from("[admin]\nbind = \"127.0.0.1:0\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n");
    let upstreams = (n / 10).max(1);
    for i in 0..n {
        let matcher = match i % 4 {
            0 => format!("hosts = [\"svc{i}.example.com\"]\npath_prefix = \"/api/{i}/\""),
            1 => format!("hosts = [\"*.tenant{i}.example.com\"]\npath_prefix = \"/\""),
            2 => format!("path_prefix = \"/static/{i}/\""),
            _ => format!(
                "hosts = [\"re{i}.example.com\"]\npath_regex = \"^/items/[0-9]+/{i}/{salt}$\""
            ),
        };
        out.push_str(&format!(
            "[[routes]]\nname = \"r{i}\"\nlisteners = [\"web\"]\n{matcher}\nupstream = \"u{}\"\n\n",
            i % upstreams
        ));
    }
    for u in 0..upstreams {
        out.push_str(&format!(
            "[upstreams.u{u}]\nbackends = [{{ addr = \"127.0.0.1:{}\" }}]\n\n",
            10000 + u
        ));
    }
    out
}

/// Keep-alive HTTP/1.1 GETs of `path` on `connections` connections for
/// `duration`, one request at a time per connection (hyper's client, no
/// external tools; a connection the server closes is opened again);
/// returns every successful request's latency and the number of failures
/// (a connection stops at its first).
pub async fn keep_alive_load(
    target: SocketAddr,
    path: &'static str,
    connections: usize,
    duration: Duration,
) -> (Vec<Duration>, u64) {
    let deadline = Instant::now() + duration;
    let tasks = (0..connections)
        .map(|_| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut sender = None;
                while Instant::now() < deadline {
                    let started = Instant::now();
                    if !get_reconnecting(&mut sender, target, path).await {
                        return (latencies, 1);
                    }
                    latencies.push(started.elapsed());
                }
                (latencies, 0)
            })
        })
        .collect();
    gather(tasks).await
}

/// Open-loop keep-alive HTTP/1.1 load: `rate` GETs of `path` a second,
/// spread evenly over `connections` connections, for `duration` after a
/// one-second warm-up that is not counted (connections and upstream pools
/// being set up). A request's latency counts from when it was due when its
/// connection fell behind (a slow answer delays the next request: that
/// wait is charged, so stalls are not hidden by coordinated omission), and
/// from when it was sent otherwise (tokio's 1 ms timer slack is not
/// charged). A connection the server closes (nginx after 1 000 requests)
/// is opened again, and the request sent on it. Returns every successful
/// request's latency and the number of failures.
pub async fn paced_load(
    target: SocketAddr,
    path: &'static str,
    connections: usize,
    rate: f64,
    duration: Duration,
) -> (Vec<Duration>, u64) {
    let interval = Duration::from_secs_f64(connections as f64 / rate);
    let start = Instant::now() + Duration::from_millis(100);
    let counted = start + Duration::from_secs(1);
    let end = counted + duration;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let first = start + interval.mul_f64(c as f64 / connections as f64);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut sender = None;
            let mut due = first;
            while due < end {
                let origin = if Instant::now() >= due {
                    due
                } else {
                    tokio::time::sleep_until(due.into()).await;
                    Instant::now()
                };
                if !get_reconnecting(&mut sender, target, path).await {
                    return (latencies, 1);
                }
                if due >= counted {
                    latencies.push(origin.elapsed());
                }
                due += interval;
            }
            (latencies, 0)
        }));
    }
    gather(tasks).await
}

/// Every connection's latencies, and the failures summed.
pub async fn gather(
    tasks: Vec<tokio::task::JoinHandle<(Vec<Duration>, u64)>>,
) -> (Vec<Duration>, u64) {
    let mut all = Vec::new();
    let mut errors = 0;
    for task in tasks {
        match task.await {
            Ok((latencies, e)) => {
                all.extend(latencies);
                errors += e;
            }
            Err(_) => errors += 1,
        }
    }
    (all, errors)
}

/// A GET as `get`, sent once more on a new connection when the server
/// closed the one it went out on (nginx does after `keepalive_requests`).
async fn get_reconnecting(
    sender: &mut Option<Sender>,
    target: SocketAddr,
    path: &'static str,
) -> bool {
    match get(sender, target, path).await {
        Ok(ok) => ok,
        Err(()) => get(sender, target, path).await == Ok(true),
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// One GET on `sender`, connecting first if there is none: `Ok(true)` on a
/// 2xx, `Ok(false)` on another answer or a failed connect, `Err(())` if
/// the connection failed under the request (it is then dropped).
async fn get(
    sender: &mut Option<Sender>,
    target: SocketAddr,
    path: &'static str,
) -> Result<bool, ()> {
    if sender.as_ref().is_none_or(|s| s.is_closed()) {
        let Ok(stream) = tokio::net::TcpStream::connect(target).await else {
            return Ok(false);
        };
        let _ = stream.set_nodelay(true);
        let Ok((new, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            return Ok(false);
        };
        tokio::spawn(conn);
        *sender = Some(new);
    }
    let Some(s) = sender.as_mut() else {
        return Ok(false);
    };
    let req = Request::builder()
        .uri(path)
        .header("host", "bench")
        .body(Full::new(Bytes::new()))
        .expect("request");
    match s.send_request(req).await {
        Ok(response) => {
            let ok = response.status().is_success();
            let _ = response.into_body().collect().await;
            Ok(ok)
        }
        Err(_) => {
            *sender = None;
            Err(())
        }
    }
}

pub fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// Waits (bounded) until `address` accepts connections.
pub fn wait_for(address: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(address).is_err() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

pub fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// CPU ticks of each thread of `pid` whose name starts with `prefix`, by
/// thread id (a data-plane worker's share of the work).
pub fn thread_ticks(pid: u32, prefix: &str) -> std::collections::BTreeMap<u32, u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| {
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1;
            if !name.starts_with(prefix) {
                return None;
            }
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((tid, utime + stime))
        })
        .collect()
}

/// Nanoseconds every thread of `pid` has run so far (the scheduler's own
/// account, `/proc/PID/task/*/schedstat`: finer than clock ticks, for an
/// idle process that runs a few milliseconds a second).
pub fn run_nanoseconds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU seconds used so far by `pid` and its child processes (nginx's
/// workers), from `/proc`.
pub fn cpu_seconds(pid: u32) -> f64 {
    let ticks = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                // Fields after the command name, which may hold spaces.
                let rest = stat.rsplit_once(')')?.1;
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let utime: u64 = fields.get(11)?.parse().ok()?;
                let stime: u64 = fields.get(12)?.parse().ok()?;
                Some(utime + stime)
            })
            .unwrap_or(0)
    };
    let children = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        });
    let total: u64 = ticks(pid) + children.map(ticks).sum::<u64>();
    total as f64 / clock_ticks_per_second()
}

pub fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A process that is stopped when this is dropped.
pub struct Owned(pub Child);

impl Drop for Owned {
    fn drop(&mut self) {
        stop(&mut self.0);
    }
}

/// One measured run: the rate, the target's CPU seconds meanwhile, and
/// the work done, in the unit CPU is reported per.
#[derive(Clone, Copy)]
pub struct Run {
    pub rate: f64,
    pub cpu: f64,
    pub work: f64,
}

/// What a run measures: the first of a list is the reference (the
/// backend itself), the others proxies in front of it.
pub struct Target {
    pub name: &'static str,
    pub address: SocketAddr,
    /// The proxy's process (`None`: the reference).
    pub pid: Option<u32>,
}

/// Mean and (max - min) / 2 of `values`.
pub fn spread(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (mean, (max - min) / 2.0)
}

/// Runs `measure` on every target in `rounds` rounds, each round in the
/// opposite order of the one before, the proxies' CPU read from `/proc`
/// around each run; prints each target's rate against the first target
/// and HAProxy, and its CPU per unit of work (and against HAProxy's).
pub fn rounds_of(
    title: &str,
    unit: &str,
    per: &str,
    targets: &[Target],
    rounds: usize,
    measure: impl Fn(&Target) -> Option<Run>,
) {
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
            let Some(mut run) = measure(target) else {
                println!("  {}: measurement failed", target.name);
                continue;
            };
            if let (Some(pid), Some(before)) = (target.pid, before) {
                run.cpu = cpu_seconds(pid) - before;
            }
            runs[i].push(run);
        }
    }
    println!("{title}");
    let rate = |i: usize| spread(&runs[i].iter().map(|r| r.rate).collect::<Vec<_>>());
    let cpu_per_work = |i: usize| {
        let cpu: f64 = runs[i].iter().map(|r| r.cpu).sum();
        let work: f64 = runs[i].iter().map(|r| r.work).sum();
        (work > 0.0).then(|| cpu / work)
    };
    let reference = rate(0).0;
    let haproxy = targets.iter().position(|t| t.name == "haproxy");
    for (i, target) in targets.iter().enumerate() {
        let (mean, half) = rate(i);
        let mut line = format!("  {:<8} {mean:>10.3} ± {half:.3} {unit}", target.name);
        if i > 0 {
            line.push_str(&format!("   {:.3} × {}", mean / reference, targets[0].name));
            let versus = haproxy.filter(|&h| h != i);
            if let Some(h) = versus {
                line.push_str(&format!("   {:.3} × haproxy", mean / rate(h).0));
            }
            if let Some(cpu) = cpu_per_work(i) {
                line.push_str(&format!("   CPU {cpu:.3} {per}"));
                if let Some(theirs) = versus.and_then(cpu_per_work) {
                    line.push_str(&format!(" ({:.3} × haproxy)", cpu / theirs));
                }
            }
        }
        println!("{line}");
    }
}

/// Runs `benches/SCRIPT` with this build's binary, `CUTOVER_BENCH_ROUNDS`
/// (default 4) and `CUTOVER_BENCH_SECONDS` (default 8), after saying why
/// it skips when one of `tools` is missing (`packages` to install).
pub fn run_script(label: &str, script: &str, binary: &str, tools: &[&str], packages: &str) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches")
        .join(script);
    let rounds = std::env::var("CUTOVER_BENCH_ROUNDS").unwrap_or_else(|_| "4".into());
    let seconds = std::env::var("CUTOVER_BENCH_SECONDS").unwrap_or_else(|_| "8".into());
    if let Some(tool) = tools.iter().find(|t| !which(t)) {
        println!("{label}: skipped, {tool} is not installed (apt-get install {packages})");
        return;
    }
    println!(
        "{label}: {} {rounds} rounds of {seconds} s",
        script.display()
    );
    let status = Command::new("bash")
        .arg(&script)
        .arg(binary)
        .arg(&rounds)
        .arg(&seconds)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => println!("{label}: the script failed ({s})"),
        Err(e) => println!("{label}: cannot run bash: {e}"),
    }
}

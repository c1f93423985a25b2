//! What an activation costs at scale, measured on the real binary
//! through its admin API (issue "scale", `docs/performance.md`).
//!
//! For 10 000 and 100 000 routes (each with a host, a prefix and one of
//! 100 upstreams, as `benches/control.rs` writes them): start `cutover`,
//! then activate, by `config_path`, candidates that each rename one route
//! (a different one each time), then candidates that each rename 10 % of
//! the routes. Reported per size:
//!
//! - the `duration_ms` each activation records (median, p90, max) for a
//!   one-route change and for a 10 % change;
//! - RSS after start, after the first activation and after the last, and
//!   the peak RSS during each activation over the RSS just before it
//!   (`VmHWM` is reset before each activation through `clear_refs`).
//!
//! `CUTOVER_SCALE_ACTIVATIONS` (default 100) one-route activations per
//! size, `CUTOVER_SCALE_WIDE` (default 10) 10 % ones,
//! `CUTOVER_SCALE_ROUTES` (e.g. `100000`) to run one size only,
//! `CUTOVER_BENCH_BINARY` to measure another build (an earlier commit),
//! `CUTOVER_SCALE_VERBOSE` to print each activation.
//! Linux only (`/proc`). Run: `cargo bench --bench scale`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

/// `routes` routes; route `i` is named `r{i}` unless `renamed(i)` gives
/// it a suffix.
fn config(routes: usize, renamed: impl Fn(usize) -> Option<usize>) -> String {
    let mut out = String::with_capacity(routes * 120);
    out.push_str("[admin]\nbind = \"127.0.0.1:0\"\n\n[log]\nlevel = \"warn\"\naccess = false\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n");
    for i in 0..routes {
        let name = match renamed(i) {
            Some(version) => format!("r{i}-v{version}"),
            None => format!("r{i}"),
        };
        out.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\nlisteners = [\"web\"]\nhosts = [\"svc{i}.example.com\"]\npath_prefix = \"/api/\"\nupstream = \"u{}\"\n\n",
            i % 100,
        ));
    }
    for u in 0..100 {
        out.push_str(&format!(
            "[upstreams.u{u}]\nbackends = [{{ addr = \"127.0.0.1:{}\" }}]\n\n",
            20000 + u
        ));
    }
    out
}

/// POSTs `body` to the admin API; the answer's status and JSON body.
fn post(admin: SocketAddr, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut stream = TcpStream::connect(admin).expect("connect to admin");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nhost: {admin}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read answer");
    let (head, json) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    // The admin API answers with content-length: the body is all JSON.
    (status, serde_json::from_str(json).unwrap_or_default())
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the peak RSS (`VmHWM`) to the current RSS.
fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(at).copied().unwrap_or(f64::NAN)
}

struct Activated {
    duration_ms: f64,
    before_mib: f64,
    peak_mib: f64,
}

fn activate(admin: SocketAddr, pid: u32, dir: &Path, text: &str) -> Activated {
    std::fs::write(dir.join("candidate.toml"), text).expect("write candidate");
    let (before_mib, _) = memory(pid);
    reset_peak(pid);
    let (status, answer) = post(
        admin,
        "/admin/runtime/activate",
        r#"{"config_path": "candidate.toml"}"#,
    );
    assert_eq!(status, 200, "activation refused: {answer}");
    assert_eq!(answer["outcome"], "activated", "{answer}");
    let (_, peak_mib) = memory(pid);
    Activated {
        duration_ms: answer["duration_ms"].as_f64().unwrap_or(f64::NAN),
        before_mib,
        peak_mib,
    }
}

fn main() {
    // `cargo test --benches` and `cargo bench --no-run` must not run this.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let narrow = common::env_u64("CUTOVER_SCALE_ACTIVATIONS", 100) as usize;
    let wide = common::env_u64("CUTOVER_SCALE_WIDE", 10) as usize;
    let sizes: Vec<usize> = match std::env::var("CUTOVER_SCALE_ROUTES") {
        Ok(n) => vec![n.parse().expect("CUTOVER_SCALE_ROUTES is a number")],
        Err(_) => vec![10_000, 100_000],
    };
    let mut rows = Vec::new();
    for routes in sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gateway.toml");
        let text = config(routes, |_| None);
        std::fs::write(&path, &text).expect("write config");
        let (child, ready) = common::start_gateway(&path);
        let child = common::Owned(child);
        let pid = child.0.id();
        let admin: SocketAddr = ready["admin"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .expect("admin address in the ready line");
        std::thread::sleep(Duration::from_secs(1));
        let (started_mib, _) = memory(pid);
        let mut one = Vec::with_capacity(narrow);
        let mut after_first = 0.0;
        for n in 0..narrow {
            // Route n renamed (one route differs from the active one).
            let stride = routes / narrow.max(1);
            let victim = (n * stride) % routes;
            let text = config(routes, |i| (i == victim).then_some(n));
            one.push(activate(admin, pid, dir.path(), &text));
            if n == 0 {
                std::thread::sleep(Duration::from_millis(500));
                after_first = memory(pid).0;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let after_narrow = memory(pid).0;
        let mut ten = Vec::with_capacity(wide);
        for n in 0..wide {
            // One more tenth of the routes renamed each time: each
            // candidate differs from the active one in a tenth.
            let text = config(routes, |i| (i % 10 <= n % 10).then_some(1000 + i % 10));
            ten.push(activate(admin, pid, dir.path(), &text));
        }
        let durations = |a: &[Activated]| a.iter().map(|a| a.duration_ms).collect::<Vec<_>>();
        let peak_ratio = |a: &[Activated]| {
            a.iter()
                .map(|a| a.peak_mib / a.before_mib)
                .fold(0.0, f64::max)
        };
        if std::env::var_os("CUTOVER_SCALE_VERBOSE").is_some() {
            for (n, a) in one.iter().enumerate() {
                eprintln!(
                    "activation {n}: {:.0} ms, RSS before {:.1} MiB, peak {:.1} MiB",
                    a.duration_ms, a.before_mib, a.peak_mib
                );
            }
        }
        let one_ms = durations(&one);
        let ten_ms = durations(&ten);
        println!(
            "{routes} routes ({:.1} MB): one-route activation median {:.0} ms, p90 {:.0}, max {:.0}; 10 % of routes median {:.0} ms",
            text.len() as f64 / 1e6,
            quantile(&one_ms, 0.5),
            quantile(&one_ms, 0.9),
            quantile(&one_ms, 1.0),
            quantile(&ten_ms, 0.5),
        );
        // The steady RSS: where activating levels off.
        let peak = one.iter().map(|a| a.peak_mib).fold(0.0, f64::max);
        println!(
            "  RSS: {started_mib:.0} MiB after start, {after_first:.0} after the first activation, {after_narrow:.0} after {narrow} (x{:.2}); peak during an activation {peak:.0} MiB, x{:.2} of the steady RSS; up to x{:.2} of the RSS just before it (one route), x{:.2} (10 %)",
            after_narrow / after_first,
            peak / after_narrow,
            peak_ratio(&one),
            peak_ratio(&ten),
        );
        rows.push((
            routes,
            (quantile(&one_ms, 0.5), quantile(&one_ms, 0.9)),
            quantile(&ten_ms, 0.5),
            (started_mib, after_first, after_narrow),
            peak,
        ));
    }
    println!(
        "\n| routes | one route: median (p90) ms | 10 %: median ms | RSS start | after 1st | after {narrow} | ratio | peak | peak / steady |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (routes, (one, one_p90), ten, (start, first, last), peak) in rows {
        println!(
            "| {routes} | {one:.0} ({one_p90:.0}) | {ten:.0} | {start:.0} MiB | {first:.0} MiB | {last:.0} MiB | {:.2} | {peak:.0} MiB | {:.2} |",
            last / first,
            peak / last
        );
    }
}

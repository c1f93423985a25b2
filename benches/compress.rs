//! Response compression through the proxy (DESIGN §17, issue 32): a
//! 64 KiB JSON answer, served as a static file by nginx in its own
//! process, fetched through cutover with each encoding at its default
//! level (and gzip at `"fastest"`), and through nginx with `gzip on`
//! (level 1, its default) and at `gzip_comp_level 6`, in one run, in
//! alternating rounds.
//!
//! For each: requests/s, the proxy's CPU per request and the figure the
//! issue asks for, **MB of input compressed per CPU-second** of the
//! proxy's processes (the proxying itself included, so the uncompressed
//! rows say what that costs), and the compressed size of the answer.
//! Load: `wrk -t1 -c16` with the `Accept-Encoding` of the row.
//!
//! Run: `cargo bench --bench compress` (`CUTOVER_BENCH_SECONDS`, default
//! 10; `CUTOVER_BENCH_ROUNDS`, default 2). Needs `wrk` and `nginx-light`
//! (it says so and stops without them).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{cpu_seconds, env_u64, free_port, spread, wait_for, which, Owned};

mod common;

/// The answer: 64 KiB of JSON as an API returns it.
fn json() -> String {
    let mut out = String::from("[");
    let mut i = 0u64;
    while out.len() < 64 * 1024 - 120 {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"id":{i},"name":"item {i}","tags":["red","green"],"price":{}.{},"stock":{}}}"#,
            i * 37 % 1000,
            i % 100,
            i * 7919 % 500
        ));
        i += 1;
    }
    while out.len() < 64 * 1024 - 1 {
        out.push(' ');
    }
    out.push(']');
    out
}

const CONNECTIONS: usize = 16;

/// A row: where, with which `Accept-Encoding`, whose CPU.
struct Row {
    label: &'static str,
    address: SocketAddr,
    accept: Option<&'static str>,
    pid: u32,
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    if !which("wrk") || !which("nginx") {
        println!("compress: needs wrk and nginx (apt-get install wrk nginx-light); not run");
        return;
    }
    let seconds = env_u64("CUTOVER_BENCH_SECONDS", 10);
    let rounds = env_u64("CUTOVER_BENCH_ROUNDS", 2).max(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let body = json();
    std::fs::write(d.join("data.json"), &body).expect("write the answer");

    // The backend: one nginx worker serving the file.
    let backend = free_port();
    let backend_process = nginx(
        d,
        "backend",
        &format!(
            "worker_processes 1;\nhttp {{\n  access_log off;\n  keepalive_requests 10000000;\n  default_type application/json;\n  server {{\n    listen {backend};\n    location / {{ root {}; }}\n  }}\n}}\n",
            d.display()
        ),
        backend,
    );

    // The references: nginx proxying, two workers as cutover has two
    // cores, gzip at level 1 (`gzip on` alone) and at level 6.
    let (level1, level6) = (free_port(), free_port());
    let proxy = |port: SocketAddr, level: u32| {
        format!(
            "  server {{\n    listen {port};\n    gzip on;\n    gzip_comp_level {level};\n    gzip_types application/json;\n    gzip_min_length 1024;\n    location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffers 32 8k; }}\n  }}\n"
        )
    };
    let reference = nginx(
        d,
        "reference",
        &format!(
            "worker_processes 2;\nhttp {{\n  access_log off;\n  keepalive_requests 10000000;\n  proxy_temp_path {};\n  upstream backend {{ server {backend}; keepalive 64; }}\n{}{}}}\n",
            d.display(),
            proxy(level1, 1),
            proxy(level6, 6)
        ),
        level1,
    );

    // cutover: `web` with the defaults, `fast` with level "fastest".
    let config = format!(
        r#"[admin]
bind = "127.0.0.1:0"

[log]
level = "warn"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[listeners]]
name = "fast"
bind = "127.0.0.1:0"

[[routes]]
name = "default-level"
listeners = ["web"]
upstream = "app"
compress = {{}}

[[routes]]
name = "fastest"
listeners = ["fast"]
upstream = "app"
compress = {{ level = "fastest" }}

[upstreams.app]
backends = [{{ addr = "{backend}" }}]
"#
    );
    std::fs::write(d.join("gateway.toml"), config).expect("write config");
    let (child, ready) = common::start_gateway(&d.join("gateway.toml"));
    let cutover = Owned(child);
    let listener = |name: &str| common::ready_listener(&ready, name);
    let (web, fast) = (listener("web"), listener("fast"));
    let (gw, ng) = (cutover.0.id(), reference.0.id());
    let rows = [
        Row {
            label: "cutover, uncompressed",
            address: web,
            accept: None,
            pid: gw,
        },
        Row {
            label: "cutover zstd (3)",
            address: web,
            accept: Some("zstd"),
            pid: gw,
        },
        Row {
            label: "cutover br (4)",
            address: web,
            accept: Some("br"),
            pid: gw,
        },
        Row {
            label: "cutover gzip (6)",
            address: web,
            accept: Some("gzip"),
            pid: gw,
        },
        Row {
            label: "cutover gzip (fastest: 1)",
            address: fast,
            accept: Some("gzip"),
            pid: gw,
        },
        Row {
            label: "nginx, uncompressed",
            address: level1,
            accept: None,
            pid: ng,
        },
        Row {
            label: "nginx gzip on (1)",
            address: level1,
            accept: Some("gzip"),
            pid: ng,
        },
        Row {
            label: "nginx gzip (6)",
            address: level6,
            accept: Some("gzip"),
            pid: ng,
        },
    ];
    println!(
        "compress: a {} B JSON answer from nginx (static file, own process); wrk -t1 -c{CONNECTIONS}, {seconds}s per run, {rounds} rounds",
        body.len()
    );
    let mut runs: Vec<Vec<common::Run>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds as usize {
        for k in 0..rows.len() {
            // Alternating order: a neighbour that comes and goes weighs on
            // every row alike.
            let i = if round % 2 == 0 {
                k
            } else {
                rows.len() - 1 - k
            };
            let row = &rows[i];
            let before = cpu_seconds(row.pid);
            let requests = wrk(row, seconds);
            let cpu = cpu_seconds(row.pid) - before;
            runs[i].push(common::Run {
                rate: requests as f64 / seconds as f64,
                cpu,
                work: requests as f64,
            });
        }
    }
    println!(
        "  {:<28} {:>9} {:>16} {:>18} {:>10}",
        "", "req/s", "CPU µs/request", "MB in / CPU-second", "bytes out"
    );
    let mut mb_per_cpu = Vec::new();
    for (row, runs) in rows.iter().zip(&runs) {
        let rate = spread(&runs.iter().map(|r| r.rate).collect::<Vec<_>>());
        let per_request = spread(
            &runs
                .iter()
                .map(|r| r.cpu * 1e6 / r.work.max(1.0))
                .collect::<Vec<_>>(),
        );
        let mb = spread(
            &runs
                .iter()
                .map(|r| r.work * body.len() as f64 / r.cpu.max(1e-9) / 1e6)
                .collect::<Vec<_>>(),
        );
        mb_per_cpu.push(mb.0);
        println!(
            "  {:<28} {:>9.0} {:>9.1} ±{:<5.1} {:>11.1} ±{:<5.1} {:>10}",
            row.label,
            rate.0,
            per_request.0,
            per_request.1,
            mb.0,
            mb.1,
            size(row)
        );
    }
    println!(
        "  gzip, MB in per CPU-second, cutover / nginx: at level 1 {:.2}, at level 6 {:.2}",
        mb_per_cpu[4] / mb_per_cpu[6],
        mb_per_cpu[3] / mb_per_cpu[7]
    );
    drop(cutover);
    drop(reference);
    drop(backend_process);
}

/// Starts nginx on `http` (with `events` and paths in `dir`), waiting
/// for `port`.
fn nginx(dir: &Path, name: &str, http: &str, port: SocketAddr) -> Owned {
    let d = dir.display();
    let config = format!(
        "daemon off;\nerror_log {d}/{name}-error.log;\npid {d}/{name}.pid;\nevents {{ worker_connections 4096; }}\n{http}"
    );
    let file = dir.join(format!("{name}.conf"));
    std::fs::write(&file, config).expect("write nginx config");
    let child = Command::new("nginx")
        .arg("-c")
        .arg(&file)
        .args(["-e", &format!("{d}/{name}-error.log")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    let owned = Owned(child);
    assert!(wait_for(port), "nginx ({name}) did not start");
    owned
}

/// Requests `wrk` completed (non-2xx answers would fail the bench).
fn wrk(row: &Row, seconds: u64) -> u64 {
    let mut args = vec![
        "-t1".to_owned(),
        format!("-c{CONNECTIONS}"),
        format!("-d{seconds}s"),
    ];
    if let Some(accept) = row.accept {
        args.push("-H".to_owned());
        args.push(format!("Accept-Encoding: {accept}"));
    }
    args.push(format!("http://{}/data.json", row.address));
    let out = Command::new("wrk").args(&args).output().expect("wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("Non-2xx"),
        "{}: failed answers\n{text}",
        row.label
    );
    text.lines()
        .find_map(|l| {
            let l = l.trim();
            let (n, rest) = l.split_once(' ')?;
            rest.starts_with("requests in").then(|| n.parse().ok())?
        })
        .unwrap_or(0)
}

/// The size of the answer as the row's client receives it (`curl`, which
/// does not decode without `--compressed`).
fn size(row: &Row) -> String {
    let mut args = vec!["-s".to_owned(), "-o".to_owned(), "/dev/null".to_owned()];
    args.extend(["-w".to_owned(), "%{size_download}".to_owned()]);
    if let Some(accept) = row.accept {
        args.push("-H".to_owned());
        args.push(format!("Accept-Encoding: {accept}"));
    }
    args.push(format!("http://{}/data.json", row.address));
    Command::new("curl")
        .args(&args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|_| "?".into())
}

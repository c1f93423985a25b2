//! Access log, trace propagation and metrics, seen from outside the process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::*;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The one line whose `path` (or, for TCP, `protocol`) is `key`.
fn line_for<'a>(lines: &'a [Value], key: &str) -> &'a Value {
    let found: Vec<_> = lines
        .iter()
        .filter(|l| l["path"] == key || (key == "tcp" && l["protocol"] == "tcp"))
        .collect();
    assert_eq!(found.len(), 1, "lines for {key}: {lines:#?}");
    found[0]
}

fn flags(line: &Value) -> Vec<&str> {
    line["flags"]
        .as_array()
        .unwrap_or_else(|| panic!("{line}"))
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect()
}

/// A backend that answers after `delay`.
async fn slow_backend(delay: Duration) -> Backend {
    Backend::start(Arc::new(move |_req| {
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            hyper::Response::new(full("late"))
        })
    }))
    .await
}

/// A backend that streams 256 MiB, far more than any client here reads.
async fn endless_backend() -> Backend {
    Backend::start(Arc::new(|_req| {
        Box::pin(async move { hyper::Response::new(Generated::new(256 << 20).boxed()) })
    }))
    .await
}

fn observed_config(
    echo: SocketAddr,
    slow: SocketAddr,
    endless: SocketAddr,
    tcp: SocketAddr,
) -> String {
    let dead = refusing_addr();
    let web = |path: &str, lines: &str| format!("listeners = [\"web\"]\n{path}\n{lines}");
    Config::new()
        .metrics()
        .log("format = \"json\"\naccess = true\naccess_file = \"access.log\"")
        .listener("web", "")
        .listener("db", "protocol = \"tcp\"\nupstream = \"tcp_echo\"")
        .route("ok", &web("path_exact = \"/ok\"", "upstream = \"echo\""))
        .route(
            "dead",
            &web("path_exact = \"/dead\"", "upstream = \"dead\""),
        )
        .route(
            "retried",
            &web(
                "path_prefix = \"/retried\"",
                "upstream = \"half\"\nretry = { attempts = 2, on = [\"connect_failure\"] }",
            ),
        )
        .route(
            "limited",
            &web(
                "path_exact = \"/limited\"",
                "upstream = \"echo\"\nquota = { rate = 1, per = \"1h\", burst = 1 }",
            ),
        )
        .route(
            "slow",
            &web(
                "path_exact = \"/slow\"",
                "upstream = \"slow\"\ntimeout = \"200ms\"",
            ),
        )
        .route(
            "busy",
            &web(
                "path_exact = \"/busy\"",
                "upstream = \"slow\"\nmax_inflight = 1",
            ),
        )
        .route(
            "endless",
            &web("path_exact = \"/endless\"", "upstream = \"endless\""),
        )
        .upstream("echo", &[echo], "")
        .upstream("dead", &[dead], "")
        .upstream("half", &[dead, echo], "")
        .upstream("slow", &[slow], "")
        .upstream("endless", &[endless], "")
        .upstream("tcp_echo", &[tcp], "")
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_access_line_field_and_flag_on_real_requests() {
    let echo = echo_backend().await;
    let slow = slow_backend(Duration::from_millis(800)).await;
    let endless = endless_backend().await;
    let (tcp, _tcp_task) = echo_server().await;
    let gw = Gateway::start(&observed_config(echo.addr, slow.addr, endless.addr, tcp));
    let web = gw.listener("web");
    let generation = gw.active_generation().await;

    // 200, with a body in and a trace that continues.
    let req = Request::post("/ok")
        .header("host", "app.example")
        .header("traceparent", TRACEPARENT)
        .header("tracestate", "vendor=x")
        .body(Full::new(Bytes::from_static(b"hello")))
        .unwrap();
    let (status, _, body) = send(web, req).await.unwrap();
    assert_eq!(status, 200);
    let echoed = String::from_utf8_lossy(&body);
    let sent = echoed
        .lines()
        .find_map(|l| l.strip_prefix("traceparent: "))
        .unwrap_or_else(|| panic!("no traceparent upstream:\n{echoed}"));
    assert!(sent.starts_with(&format!("00-{TRACE_ID}-")), "{sent}");
    assert!(sent.ends_with("-01"), "{sent}");
    assert!(
        !sent.contains("00f067aa0ba902b7"),
        "the gateway's span is the parent: {sent}"
    );
    assert!(echoed.contains("tracestate: vendor=x"), "{echoed}");

    // A 502 from a dead backend.
    let (status, _, _) = get(web, "app.example", "/dead").await;
    assert_eq!(status, 502);
    // No route.
    let (status, _, _) = get(web, "app.example", "/nowhere").await;
    assert_eq!(status, 404);
    // Rate limited: the second of two.
    assert_eq!(get(web, "app.example", "/limited").await.0, 200);
    assert_eq!(get(web, "app.example", "/limited").await.0, 429);
    // Upstream timeout.
    assert_eq!(get(web, "app.example", "/slow").await.0, 504);
    // Admission: two at once on a route that takes one.
    let (a, b) = tokio::join!(get(web, "app.example", "/busy"), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        get(web, "app.example", "/busy").await
    });
    assert_eq!((a.0, b.0), (200, 503));
    // A malformed head: refused by the codec, before routing.
    let answer = raw_exchange(web, b"GET /bad HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    // A client that leaves before the body ends.
    let response = open(
        web,
        Request::get("/endless")
            .header("host", "app.example")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(response.status(), 200);
    drop(response);
    // A TCP connection.
    let mut stream = tokio::net::TcpStream::connect(gw.listener("db"))
        .await
        .unwrap();
    let tcp_client = stream.local_addr().unwrap().to_string();
    stream.write_all(b"ping\n").await.unwrap();
    let mut pong = [0u8; 5];
    stream.read_exact(&mut pong).await.unwrap();
    drop(stream);
    // Retried: the backends alternate, so one of two requests meets the
    // dead one first.
    for i in 0..2 {
        assert_eq!(
            get(web, "app.example", &format!("/retried/{i}")).await.0,
            200
        );
    }

    // A TCP listener takes whatever connects to its port, and an
    // ephemeral port was some other test's backend a moment ago: a
    // stranger's connection (another gateway's health check, 271 bytes
    // in) made a second `tcp` line once. Only this test's lines count.
    let ours = |l: &Value| l["protocol"] != "tcp" || l["client"] == tcp_client.as_str();
    let mut wanted = 13;
    let lines = loop {
        let all = access_lines(&gw.path("access.log"), wanted).await;
        let mine: Vec<Value> = all.iter().filter(|l| ours(l)).cloned().collect();
        if mine.len() >= 13 || wanted > 13 + 20 {
            break mine;
        }
        wanted = all.len() + 1;
    };
    for line in &lines {
        assert_eq!(line["target"], "cutover::access");
        assert_eq!(line["generation"], generation);
        assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");
        assert!(
            line["client"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{line}"
        );
        assert!(line["duration_ms"].as_f64().unwrap() >= 0.0, "{line}");
    }

    let ok = line_for(&lines, "/ok");
    assert_eq!(ok["listener"], "web");
    assert_eq!(ok["protocol"], "HTTP/1.1");
    assert_eq!(ok["method"], "POST");
    assert_eq!(ok["authority"], "app.example");
    assert_eq!(ok["route"], "ok");
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["bytes_in"], 5);
    assert_eq!(ok["bytes_out"], body.len());
    assert!(ok["upstream_ms"].as_f64().unwrap() > 0.0, "{ok}");
    assert_eq!(ok["backend"], echo.addr.to_string());
    assert_eq!(ok["attempts"], 1);
    assert_eq!(ok["trace_id"], TRACE_ID);
    assert!(flags(ok).is_empty(), "{ok}");

    let dead = line_for(&lines, "/dead");
    assert_eq!(dead["status"], 502);
    assert_eq!(dead["route"], "dead");
    assert_eq!(dead["attempts"], 1);
    assert!(dead["upstream_ms"].is_null(), "{dead}");
    assert_eq!(flags(dead), ["connect_failure"]);
    // A trace started here: 32 hex digits, not the one above.
    let started = dead["trace_id"].as_str().unwrap();
    assert_eq!(started.len(), 32);
    assert_ne!(started, TRACE_ID);

    let none = line_for(&lines, "/nowhere");
    assert_eq!(
        (none["status"].as_u64(), none["route"].is_null()),
        (Some(404), true)
    );
    assert_eq!(flags(none), ["no_route"]);

    let limited: Vec<_> = lines.iter().filter(|l| l["path"] == "/limited").collect();
    assert_eq!(limited.len(), 2);
    assert!(flags(limited[0]).is_empty() || flags(limited[1]).is_empty());
    let refused = limited
        .iter()
        .find(|l| l["status"] == 429)
        .expect("a 429 line");
    assert_eq!(flags(refused), ["rate_limited"]);

    let slow_line = line_for(&lines, "/slow");
    assert_eq!(slow_line["status"], 504);
    assert_eq!(flags(slow_line), ["upstream_timeout"]);

    let busy: Vec<_> = lines.iter().filter(|l| l["path"] == "/busy").collect();
    let rejected = busy
        .iter()
        .find(|l| l["status"] == 503)
        .expect("a 503 line");
    assert_eq!(flags(rejected), ["admission_rejected"]);

    let bad = lines
        .iter()
        .find(|l| l["status"] == 400)
        .unwrap_or_else(|| panic!("no 400 line: {lines:#?}"));
    assert_eq!(flags(bad), ["protocol_error"]);

    let endless_line = line_for(&lines, "/endless");
    assert_eq!(endless_line["status"], 200);
    assert_eq!(flags(endless_line), ["client_closed"]);
    assert!(endless_line["bytes_out"].as_u64().unwrap() < 256 << 20);

    let tcp_line = line_for(&lines, "tcp");
    assert_eq!(tcp_line["listener"], "db");
    assert_eq!(tcp_line["bytes_in"], 5);
    assert_eq!(tcp_line["bytes_out"], 5);
    assert_eq!(tcp_line["backend"], tcp.to_string());
    assert!(
        tcp_line["method"].is_null() && tcp_line["status"] == 0,
        "{tcp_line}"
    );

    let retried: Vec<_> = lines.iter().filter(|l| l["route"] == "retried").collect();
    assert_eq!(retried.len(), 2);
    let twice = retried
        .iter()
        .find(|l| l["attempts"] == 2)
        .unwrap_or_else(|| panic!("no retried line: {retried:#?}"));
    assert_eq!(twice["status"], 200);
    assert_eq!(twice["backend"], echo.addr.to_string());
    assert_eq!(flags(twice), ["connect_failure", "retried"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_turns_on_live_and_reopens_on_sigusr1() {
    let backend = Backend::named("a").await;
    let config = |access: bool| {
        proxy_config(backend.addr, "").replace(
            "level = \"warn\"",
            &format!("level = \"warn\"\nformat = \"json\"\naccess = {access}\naccess_file = \"access.log\""),
        )
    };
    let gw = Gateway::start(&config(false));
    let web = gw.listener("web");
    assert_eq!(get(web, "x", "/before").await.0, 200);
    // Off, the log's queue (7 MiB of slots) and its writer do not exist.
    let writer = |gw: &Gateway| gw.threads().iter().any(|t| t == "cutover-access");
    assert!(!gw.threads().is_empty());
    assert!(!writer(&gw), "{:?}", gw.threads());
    // Turned on by an activation: no restart.
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(config(true)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Started by the activation; a new thread takes its name once it
    // runs (until then /proc shows its parent's), so look for a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !writer(&gw) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(writer(&gw), "{:?}", gw.threads());
    assert_eq!(get(web, "x", "/first").await.0, 200);
    let log = gw.path("access.log");
    let lines = access_lines(&log, 1).await;
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["path"], "/first");

    // logrotate moves the file, then signals.
    let rotated = gw.path("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    gw.signal("USR1");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.exists() {
        assert!(
            Instant::now() < deadline,
            "no new access.log:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(web, "x", "/second").await.0, 200);
    let lines = access_lines(&log, 1).await;
    assert_eq!(lines[0]["path"], "/second");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert_eq!(old.lines().count(), 1, "{old}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_the_sink_cannot_take_are_dropped_and_counted() {
    let backend = Backend::named("a").await;
    // Every write to /dev/full fails: nothing can be written, and the
    // requests must not notice.
    let config = proxy_config(backend.addr, "")
        .replace(
            "level = \"warn\"",
            "level = \"error\"\naccess = true\naccess_file = \"/dev/full\"",
        )
        .replace("[log]", "[metrics]\nbind = \"127.0.0.1:0\"\n\n[log]");
    let gw = Gateway::start(&config);
    let web = gw.listener("web");
    for _ in 0..20 {
        assert_eq!(get(web, "x", "/").await.0, 200);
    }
    let metrics = gw.metrics.expect("metrics endpoint");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, text) = get(metrics, "x", "/metrics").await;
        let dropped = text
            .lines()
            .find_map(|l| l.strip_prefix("cutover_log_dropped_total "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if dropped == Some(20.0) {
            break;
        }
        assert!(Instant::now() < deadline, "dropped {dropped:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The series on a `/metrics` page whose labels contain `needle`.
fn series_with(text: &str, needle: &str) -> usize {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_churn_leaves_only_the_series_live_generations_name() {
    let backend = Backend::named("a").await;
    let config = |i: usize| {
        config(&format!(
            r#"[[routes]]
name = "churn-{i}"
listeners = ["web"]
upstream = "app"

[upstreams.app]
backends = [{{ addr = "{}" }}]
"#,
            backend.addr
        ))
        .replace("[log]", "[metrics]\nbind = \"127.0.0.1:0\"\n\n[log]")
    };
    let gw = Gateway::start(&config(0));
    let web = gw.listener("web");
    let activations = 2_000;
    let mut most = 0;
    for i in 1..=activations {
        let (status, body) = admin_request(
            gw.admin,
            "POST",
            "/admin/runtime/activate",
            Some("application/toml"),
            Some(config(i)),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(get(web, "x", "/").await.0, 200);
        // Prometheus scrapes between activations: each scrape shows the
        // live route, and the one renamed away since the last scrape
        // (its final values, once); the one before that is gone.
        let text = scrape(&gw).await;
        most = most.max(series_with(&text, "route=\"churn-"));
        assert!(text.contains(&format!("route=\"churn-{i}\"")), "{text}");
        if i >= 2 {
            let gone = format!("route=\"churn-{}\"", i - 2);
            assert_eq!(series_with(&text, &gone), 0, "{text}");
        }
    }
    // Twice: the last renamed route's final values go out once, then go.
    scrape(&gw).await;
    let text = scrape(&gw).await;
    let routes = series_with(&text, "route=\"churn-");
    // One route with one status class: 1 + 17 buckets + sum + count.
    assert_eq!(routes, 20, "{text}");
    assert!(
        most <= 2 * 20,
        "at most the live route and the one just retired: {most}"
    );
    println!("series with a route label after {activations} renames: {routes} (at most {most} at any scrape)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_beyond_max_series_are_refused_and_counted() {
    let backend = Backend::named("a").await;
    // A backend (26 series) and its upstream (5) take 31 of 64; the first
    // route to answer (30: its classes, histogram, rejections, filter
    // refusals and dropped values) fits, the second does not.
    let gw = Gateway::start(
        &config(&format!(
            r#"[[routes]]
name = "first"
listeners = ["web"]
path_prefix = "/first"
upstream = "app"

[[routes]]
name = "second"
listeners = ["web"]
path_prefix = "/second"
upstream = "app"

[upstreams.app]
backends = [{{ addr = "{}" }}]
"#,
            backend.addr
        ))
        .replace(
            "[log]",
            "[metrics]\nbind = \"127.0.0.1:0\"\nmax_series = 64\n\n[log]",
        ),
    );
    let web = gw.listener("web");
    assert_eq!(get(web, "x", "/first").await.0, 200);
    assert_eq!(get(web, "x", "/second").await.0, 200);
    let text = scrape(&gw).await;
    assert!(series_with(&text, "route=\"first\"") > 0, "{text}");
    assert_eq!(series_with(&text, "route=\"second\""), 0, "{text}");
    assert!(
        text.contains("cutover_metrics_series_refused_total 30\n"),
        "{text}"
    );
    // The generation series are not capped: they are two at most.
    assert!(
        text.contains("cutover_generation_requests_total{generation=\"active\",id=\"1\"} 2\n"),
        "{text}"
    );
}

/// The path of `program` on `PATH`, if it is installed.
pub fn installed(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// A Prometheus server on loopback; killed on drop.
struct Prometheus {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(binary: &std::path::Path, target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: cutover\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        // Prometheus cannot report a port it chose: take a free one.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = std::process::Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query; the first result's value, if there is one.
    async fn query(&self, expr: &str) -> Option<f64> {
        let encoded: String = expr
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let req = Request::get(format!("/api/v1/query?query={encoded}"))
            .header("host", self.addr.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, _, body) = send(self.addr, req).await.ok()?;
        let answer: Value = serde_json::from_slice(&body).ok()?;
        assert_eq!(status, 200, "{expr}: {answer}");
        answer["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
    }

    /// Waits (up to 30 s) until `expr` has a value that `ok` accepts.
    async fn wait_for(&self, expr: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(value) = self.query(expr).await.filter(|v| ok(*v)) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "{expr}: no acceptable value within 30 s ({:?})\n{}",
                self.query(expr).await,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_gateway_and_accepts_the_rules() {
    let (Some(prometheus), Some(promtool)) = (installed("prometheus"), installed("promtool"))
    else {
        eprintln!(
            "SKIPPED: prometheus and promtool are not installed \
             (apt-get install prometheus; .ci/run installs them)"
        );
        return;
    };
    let rules = workspace().join("examples/observability/alerts.yml");
    let checked = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("run promtool");
    assert!(
        checked.status.success(),
        "promtool refused the rules:\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let backend = Backend::named("a").await;
    let config = |extra: &str| {
        proxy_config(backend.addr, "")
            .replace("[log]", "[metrics]\nbind = \"127.0.0.1:0\"\n\n[log]")
            + extra
    };
    let gw = Gateway::start(&config(""));
    let server = Prometheus::start(&prometheus, gw.metrics.expect("metrics endpoint"));
    let web = gw.listener("web");
    // Steady traffic while Prometheus scrapes: rate() needs increases.
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let traffic = tokio::spawn({
        let running = Arc::clone(&running);
        async move {
            let mut sent = 0u64;
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(get(web, "x", "/").await.0, 200);
                sent += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        }
    });
    let before = server
        .wait_for(r#"cutover_requests_total{route="all",class="2xx"}"#, |v| {
            v >= 20.0
        })
        .await;
    // The route histogram answers histogram_quantile.
    let p99 = server
        .wait_for(
            r#"histogram_quantile(0.99, sum by (le) (rate(cutover_request_duration_seconds_bucket{route="all"}[30s])))"#,
            |v| v.is_finite() && v > 0.0,
        )
        .await;
    assert!(p99 < 1.0, "{p99}");

    // An activation that keeps the route: its counters carry on.
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(config(
            "\n[[routes]]\nname = \"other\"\nlisteners = [\"web\"]\npath_prefix = \"/other\"\nrespond = { body = \"x\" }\n",
        )),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let after = server
        .wait_for(r#"cutover_requests_total{route="all",class="2xx"}"#, |v| {
            v >= before + 20.0
        })
        .await;
    assert!(after >= 40.0, "{after}");
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    let sent = traffic.await.expect("traffic task");
    assert!(sent as f64 >= after, "{sent} sent, Prometheus saw {after}");
    let resets = server
        .wait_for(
            r#"resets(cutover_requests_total{route="all",class="2xx"}[5m])"#,
            |_| true,
        )
        .await;
    assert_eq!(resets, 0.0, "the counter went back across the activation");
    // Both generations' series were seen under their roles.
    server
        .wait_for(
            r#"count(count by (id) (count_over_time(cutover_generation_requests_total[5m])))"#,
            |v| v >= 2.0,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_status_watch_shows_rates_generations_backends_and_history() {
    let backend = Backend::named("a").await;
    let gw = Gateway::start(&proxy_config(backend.addr, ""));
    let web = gw.listener("web");
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/json"),
        Some(
            serde_json::json!({
                "config": proxy_config(backend.addr, "timeout = \"3s\""),
                "requested_by": "pipeline-42",
                "reason": "longer timeout",
            })
            .to_string(),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Traffic while it watches (all 200: the error rate must read 0).
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let traffic = tokio::spawn({
        let running = Arc::clone(&running);
        async move {
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(get(web, "x", "/").await.0, 200);
            }
        }
    });
    // The gateway's timeline measures whole seconds: one with traffic.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let admin = gw.admin_url();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args(["ctl", "--admin", &admin, "status", "--watch"])
            .args(["--interval", "300ms", "--count", "3"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    traffic.await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Three frames (not a terminal: separated, not redrawn).
    assert_eq!(text.matches("live generations").count(), 3, "{text}");
    assert!(!text.contains('\x1b'), "{text}");
    assert!(text.contains("running  generation 2"), "{text}");
    // Rates over the gateway's own seconds (its timeline), in every
    // frame once it has measured one: traffic flowed.
    let rates: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("requests "))
        .filter_map(|l| l.split("/s").next()?.parse().ok())
        .collect();
    assert!(rates.len() >= 2, "{text}");
    assert!(rates.iter().all(|r| *r > 0.0), "{text}");
    assert!(
        text.contains("5xx 0.0/s (0.00 %) over the gateway's last"),
        "{text}"
    );
    assert!(text.contains(&backend.addr.to_string()), "{text}");
    assert!(text.contains("pipeline-42: longer timeout"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_shows_both_generations_and_the_diff_in_a_real_browser() {
    let Some(chromium) = installed("chromium") else {
        eprintln!(
            "SKIPPED: chromium is not installed \
             (apt-get install chromium; .ci/run installs it)"
        );
        return;
    };
    let backend = Backend::named("a").await;
    let gw = Gateway::start(&proxy_config(backend.addr, "timeout = \"15s\""));
    // Traffic for the impact sample.
    for _ in 0..40 {
        let (status, _, _) = get(gw.listener("web"), "api.test", "/").await;
        assert_eq!(status, 200);
    }
    let post = |path: &'static str, body: Value| {
        let admin = gw.admin;
        async move {
            let (status, answer) = admin_request(
                admin,
                "POST",
                path,
                Some("application/json"),
                Some(body.to_string()),
            )
            .await;
            assert_eq!(status, 200, "{path}: {answer}");
        }
    };
    let timeout = |t: &str| proxy_config(backend.addr, &format!("timeout = \"{t}\""));
    // 2: final; 3: pending, aborted (4 brings 2's configuration back);
    // 5: pending.
    // Shadowed first: with no traffic meanwhile, "no data", and on.
    post(
        "/admin/runtime/activate",
        serde_json::json!({ "config": timeout("3s"), "requested_by": "pipeline-7", "reason": "tighter timeout",
                            "shadow": { "duration": "1s", "on_no_data": "hold" } }),
    )
    .await;
    post(
        "/admin/runtime/activate",
        serde_json::json!({ "config": timeout("5s"), "confirm_within": "10m" }),
    )
    .await;
    post(
        "/admin/runtime/abort",
        serde_json::json!({ "generation": 3, "requested_by": "pipeline-7", "reason": "smoke test failed" }),
    )
    .await;
    post(
        "/admin/runtime/activate",
        serde_json::json!({ "config": timeout("5s"), "confirm_within": "10m",
                            "requested_by": "pipeline-7", "reason": "a little looser" }),
    )
    .await;
    let out = headless_dom(chromium, format!("{}/admin/?poll", gw.admin_url())).await;
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && dom.contains("<html"),
        "chromium failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The page ran (the summary replaced "loading…") with no API error.
    assert!(dom.contains("generation 5 · sha256:"), "{dom}");
    assert!(
        dom.contains("PENDING: generation 5 rolls back to generation 4"),
        "{dom}"
    );
    assert!(
        dom.contains(r#"id="error" class="error" role="alert" hidden"#),
        "{dom}"
    );
    // The timeline shows every retained generation, with who and why,
    // and how each guarded one ended.
    for id in 1..=5 {
        assert!(dom.contains(&format!("generation {id}</span>")), "{dom}");
    }
    assert!(dom.contains("pipeline-7: a little looser"), "{dom}");
    assert!(
        dom.contains(r#"<span class="settlement pending">pending</span>"#),
        "{dom}"
    );
    assert!(
        dom.contains(
            r#"<span class="settlement aborted">aborted · pipeline-7: smoke test failed</span>"#
        ),
        "{dom}"
    );
    // The newest entry's diff, side by side.
    assert!(dom.contains("Changes from generation 4 to 5"), "{dom}");
    assert!(
        dom.contains(r#"<td class="del">timeout = "3s"</td>"#),
        "{dom}"
    );
    assert!(
        dom.contains(r#"<td class="add">timeout = "5s"</td>"#),
        "{dom}"
    );
    // Next to it, what the change does to the requests sampled now: a
    // timeout moves none.
    assert!(dom.contains("impact on the "), "{dom}");
    // Each share with its 95 % interval (nothing moved of the sample).
    assert!(
        dom.contains("requests sampled now: 0.00 % (95 %: 0.00–"),
        "{dom}"
    );
    assert!(dom.contains(" %) moved, 0.00 % (95 %: 0.00–"), "{dom}");
    assert!(dom.contains(" %) unrouted (404)"), "{dom}");
    // The last shadow stage, with both sides' figures.
    assert!(
        dom.contains("no data: candidate numbered 2 against generation 1, 10 % of safe requests"),
        "{dom}"
    );
    // Dated, and not mistaken for the generation now serving.
    assert!(dom.contains("the last shadow stage, started at "), "{dom}");
    assert!(
        dom.contains("its candidate was refused and never served"),
        "{dom}"
    );
    assert!(
        dom.contains(r#"<tr class="shadow"><td>(all routes)</td><td>0</td>"#),
        "{dom}"
    );
    // Live generations and backends are filled in.
    assert!(dom.contains(r#"<tr class="generation">"#), "{dom}");
    assert!(dom.contains(&backend.addr.to_string()), "{dom}");
}

/// An OTLP/HTTP collector: keeps every export's JSON body.
async fn otlp_receiver() -> (Backend, Arc<std::sync::Mutex<Vec<Value>>>) {
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = Arc::clone(&received);
    let backend = Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        let store = Arc::clone(&store);
        Box::pin(async move {
            assert_eq!(req.uri().path(), "/v1/traces");
            assert_eq!(req.headers()["content-type"], "application/json");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            store
                .lock()
                .unwrap()
                .push(serde_json::from_slice(&body).expect("an OTLP/JSON body"));
            hyper::Response::new(full("{}"))
        })
    }))
    .await;
    (backend, received)
}

fn exported_spans(received: &std::sync::Mutex<Vec<Value>>) -> Vec<Value> {
    let mut spans = Vec::new();
    for body in received.lock().unwrap().iter() {
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            assert_eq!(
                resource["resource"]["attributes"][0],
                serde_json::json!({ "key": "service.name", "value": { "stringValue": "edge-gw" } })
            );
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                spans.extend(scope["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    spans
}

#[cfg(feature = "otlp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_are_exported_as_spans_over_otlp() {
    let echo = echo_backend().await;
    let (collector, received) = otlp_receiver().await;
    let gw = Gateway::start(&format!(
        "{}\n[tracing]\notlp_endpoint = \"http://{}\"\nservice_name = \"edge-gw\"\nsample_ratio = 1.0\n",
        proxy_config(echo.addr, ""),
        collector.addr
    ));
    let web = gw.listener("web");
    let upstream_traceparent = |body: &Bytes| {
        String::from_utf8_lossy(body)
            .lines()
            .find_map(|l| l.strip_prefix("traceparent: ").map(str::to_owned))
            .expect("traceparent upstream")
    };
    let request = |traceparent: Option<&str>| {
        let mut req = Request::get("/traced").header("host", "app.example");
        if let Some(t) = traceparent {
            req = req.header("traceparent", t);
        }
        req.body(Full::new(Bytes::new())).unwrap()
    };
    // A sampled trace from the client: continued, exported.
    let (status, _, body) = send(web, request(Some(TRACEPARENT))).await.unwrap();
    assert_eq!(status, 200);
    let continued = upstream_traceparent(&body);
    // A trace the client does not record: continued, not exported.
    let unsampled = "00-11111111111111111111111111111111-2222222222222222-00";
    let (_, _, body) = send(web, request(Some(unsampled))).await.unwrap();
    assert!(upstream_traceparent(&body).ends_with("-00"));
    // No trace: a new one, sampled at sample_ratio = 1.
    let (_, _, body) = send(web, request(None)).await.unwrap();
    let started = upstream_traceparent(&body);
    assert!(started.ends_with("-01"), "{started}");

    let deadline = Instant::now() + Duration::from_secs(10);
    while exported_spans(&received).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "spans: {:#?}",
            exported_spans(&received)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One more flush interval: the unsampled request must not follow.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let spans = exported_spans(&received);
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let of = |traceparent: &str| {
        spans
            .iter()
            .find(|s| s["traceId"] == traceparent[3..35])
            .unwrap_or_else(|| panic!("no span for {traceparent}: {spans:#?}"))
            .clone()
    };
    let child = of(&continued);
    assert_eq!(child["traceId"], TRACE_ID);
    assert_eq!(child["parentSpanId"], "00f067aa0ba902b7");
    // The backend's parent is the gateway's span.
    assert_eq!(child["spanId"], continued[36..52]);
    assert_eq!(child["kind"], 2);
    assert_eq!(child["name"], "GET all");
    let attribute = |span: &Value, key: &str| {
        span["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["key"] == key)
            .map(|a| a["value"].clone())
    };
    assert_eq!(
        attribute(&child, "http.response.status_code"),
        Some(serde_json::json!({ "intValue": "200" }))
    );
    assert_eq!(
        attribute(&child, "cutover.backend"),
        Some(serde_json::json!({ "stringValue": echo.addr.to_string() }))
    );
    let start: u128 = child["startTimeUnixNano"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let end: u128 = child["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
    assert!(start > 0 && end >= start);
    let root = of(&started);
    assert!(root.get("parentSpanId").is_none(), "{root}");
    assert_eq!(root["spanId"], started[36..52]);
}

//! Routing around failure (DESIGN §12): active health checks, passive
//! outlier ejection, load-aware balancing, and backend state that
//! survives activation.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::harness::*;

/// What a [`Controlled`] backend does, changeable while it runs.
struct Behaviour {
    /// Status of ordinary requests.
    status: AtomicU16,
    /// Whether `/healthz` answers 200 (else 503).
    healthy: AtomicBool,
    /// Ordinary requests wait until this is false.
    hold: tokio::sync::watch::Sender<bool>,
    /// Ordinary requests being served now.
    inflight: AtomicU64,
    /// When each ordinary request arrived.
    hits: Mutex<Vec<Instant>>,
    /// Health checks answered.
    checks: AtomicU64,
    /// The `Host` of the last health check.
    check_host: Mutex<Option<String>>,
}

/// A backend that answers with its name, counts what it serves, fails on
/// demand, and can be killed (listener and every open connection closed)
/// and started again on the same port.
struct Controlled {
    name: &'static str,
    addr: SocketAddr,
    behaviour: Arc<Behaviour>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Controlled {
    async fn start(name: &'static str) -> Controlled {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let behaviour = Arc::new(Behaviour {
            status: AtomicU16::new(200),
            healthy: AtomicBool::new(true),
            hold: tokio::sync::watch::channel(false).0,
            inflight: AtomicU64::new(0),
            hits: Mutex::new(Vec::new()),
            checks: AtomicU64::new(0),
            check_host: Mutex::new(None),
        });
        let mut this = Controlled {
            name,
            addr,
            behaviour,
            task: None,
        };
        this.serve(listener);
        this
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let (name, behaviour) = (self.name, Arc::clone(&self.behaviour));
        self.task = Some(tokio::spawn(async move {
            // Owned by this task: killing it closes every connection.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let behaviour = Arc::clone(&behaviour);
                connections.spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let behaviour = Arc::clone(&behaviour);
                            async move {
                                if req.uri().path() == "/healthz" {
                                    behaviour.checks.fetch_add(1, Ordering::SeqCst);
                                    *behaviour.check_host.lock().unwrap() = req
                                        .headers()
                                        .get("host")
                                        .and_then(|h| h.to_str().ok())
                                        .map(str::to_owned);
                                    let status = if behaviour.healthy.load(Ordering::SeqCst) {
                                        200
                                    } else {
                                        503
                                    };
                                    let mut response = hyper::Response::new(full("check"));
                                    *response.status_mut() = status.try_into().unwrap();
                                    return Ok::<_, std::convert::Infallible>(response);
                                }
                                // Read the whole request, as real servers do.
                                let _ = req.into_body().collect().await;
                                behaviour.hits.lock().unwrap().push(Instant::now());
                                behaviour.inflight.fetch_add(1, Ordering::SeqCst);
                                let mut hold = behaviour.hold.subscribe();
                                let _ = hold.wait_for(|held| !held).await;
                                behaviour.inflight.fetch_sub(1, Ordering::SeqCst);
                                let mut response = hyper::Response::new(full(name));
                                *response.status_mut() =
                                    behaviour.status.load(Ordering::SeqCst).try_into().unwrap();
                                Ok(response)
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }));
    }

    /// Closes the listener and every open connection.
    async fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens again on the same port.
    async fn revive(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    fn hits(&self) -> usize {
        self.behaviour.hits.lock().unwrap().len()
    }

    fn hits_after(&self, at: Instant) -> usize {
        self.behaviour
            .hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| **h > at)
            .count()
    }

    fn hits_between(&self, from: Instant, to: Instant) -> usize {
        self.behaviour
            .hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| **h > from && **h <= to)
            .count()
    }

    fn first_hit_after(&self, at: Instant) -> Option<Instant> {
        self.behaviour
            .hits
            .lock()
            .unwrap()
            .iter()
            .copied()
            .find(|h| *h > at)
    }
}

impl Drop for Controlled {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Keep-alive clients that GET `/` back to back until stopped, counting
/// every answer; a failed connection is replaced and counted as a failure.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    /// When each failure happened, and what it was.
    failures: Arc<Mutex<Vec<(SystemTime, String)>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..clients)
            .map(|_| {
                let (stop, ok, failures) =
                    (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failures));
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
                            failures
                                .lock()
                                .unwrap()
                                .push((SystemTime::now(), "connect".into()));
                            continue;
                        };
                        let Ok(mut sender) = crate::harness::h1_over(stream).await else {
                            continue;
                        };
                        while !stop.load(Ordering::Relaxed) {
                            let req = Request::builder()
                                .uri("/")
                                .header("host", "a")
                                .body(Full::new(Bytes::new()))
                                .unwrap();
                            let answer = match sender.send_request(req).await {
                                Ok(response) => {
                                    let status = response.status();
                                    match response.into_body().collect().await {
                                        Ok(_) if status.is_success() => Ok(()),
                                        Ok(body) => Err(format!(
                                            "{status} {:?}",
                                            String::from_utf8_lossy(&body.to_bytes())
                                        )),
                                        Err(e) => Err(format!("body: {e}")),
                                    }
                                }
                                Err(e) => Err(format!("request: {e}")),
                            };
                            match answer {
                                Ok(()) => {
                                    ok.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(error) => {
                                    failures.lock().unwrap().push((SystemTime::now(), error));
                                    break;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            clients,
        }
    }

    /// Stops the clients; returns (answered, failures).
    async fn stop(self) -> (u64, Vec<(SystemTime, String)>) {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            let _ = client.await;
        }
        let failures = std::mem::take(&mut *self.failures.lock().unwrap());
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

fn upstream_config(backends: &[&Controlled], upstream_extra: &str) -> String {
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    Config::new()
        .listener("web", "")
        .route("all", "listeners = [\"web\"]\nupstream = \"app\"")
        .route(
            "unrelated",
            r#"listeners = ["web"]
path_exact = "/version"
respond = { status = 200, body = "v0" }"#,
        )
        .upstream("app", &addrs, upstream_extra)
        .build()
}

async fn backends_view(gw: &Gateway) -> Value {
    let (status, body) =
        admin_request(gw.admin, "GET", "/admin/runtime/backends", None, None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The view of the backend at `addr` in upstream `app`.
pub(crate) fn backend_in(view: &Value, addr: SocketAddr) -> Value {
    view["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|u| u["name"] == "app")
        .flat_map(|u| u["backends"].as_array().cloned().unwrap_or_default())
        .find(|b| b["addr"] == addr.to_string().as_str())
        .unwrap_or(Value::Null)
}

/// Polls the backends view until `check` holds for `addr` (at most 10 s).
async fn wait_backend(gw: &Gateway, addr: SocketAddr, what: &str, check: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = backends_view(gw).await;
        let backend = backend_in(&view, addr);
        if check(&backend) {
            return;
        }
        assert!(Instant::now() < deadline, "{addr} never {what}: {view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_killed_under_load_is_ejected_and_costs_at_most_a_thousandth() {
    let a = Controlled::start("a").await;
    let b = Controlled::start("b").await;
    let mut c = Controlled::start("c").await;
    let gw = Gateway::start(&upstream_config(&[&a, &b, &c], ""));
    let load = Load::start(gw.listener("web"), 32);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(c.hits() > 0, "c took no traffic before it died");
    c.kill().await;
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (ok, failures) = load.stop().await;
    let total = ok + failures.len() as u64;
    // (A handler already running on another test thread when its task
    // was aborted may still note its hit: allow it a moment.)
    assert_eq!(c.hits_after(killed + Duration::from_millis(100)), 0);
    // Ejected by outlier detection (defaults: 5 failures in a row, 30 s).
    let view = backends_view(&gw).await;
    let dead = backend_in(&view, c.addr);
    assert_eq!(dead["ejected"], true, "{view}");
    let ejected_at = dead["ejected_until_unix_ms"].as_u64().unwrap() - 30_000;
    let late: Vec<_> = failures
        .iter()
        .filter(|(at, _)| unix_ms(*at) > ejected_at + 200)
        .collect();
    assert!(late.is_empty(), "failures after the ejection: {late:?}");
    assert!(
        failures.len() as f64 <= total as f64 * 0.001,
        "{} of {total} requests failed: {failures:?}",
        failures.len()
    );
    assert!(total > 10_000, "too little traffic to judge: {total}");
    eprintln!(
        "killed backend: {} of {total} requests failed ({:.4} %)",
        failures.len(),
        failures.len() as f64 * 100.0 / total as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_checks_take_a_failing_backend_out_and_ramp_it_back_in() {
    let a = Controlled::start("a").await;
    let b = Controlled::start("b").await;
    let c = Controlled::start("c").await;
    let interval = Duration::from_millis(200);
    let gw = Gateway::start(&upstream_config(
        &[&a, &b, &c],
        r#"health = { path = "/healthz", interval = "200ms", timeout = "100ms", unhealthy_after = 2, healthy_after = 2 }
slow_start = "2s""#,
    ));
    for backend in [&a, &b, &c] {
        wait_backend(&gw, backend.addr, "healthy", |b| b["health"] == "healthy").await;
    }
    let load = Load::start(gw.listener("web"), 8);
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.behaviour.healthy.store(false, Ordering::SeqCst);
    let failing = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // interval × unhealthy_after + interval, with the checks' ±10 % jitter.
    let out_by = failing + interval.mul_f64(3.0 * 1.1) + Duration::from_millis(50);
    assert_eq!(c.hits_after(out_by), 0, "traffic after the checks failed");
    assert!(a.hits_after(out_by) > 0 && b.hits_after(out_by) > 0);
    c.behaviour.healthy.store(true, Ordering::SeqCst);
    let passing = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, failures) = load.stop().await;
    assert!(failures.is_empty(), "{failures:?}");
    // Back after two passing checks: not before the second (an interval
    // after the first at the least), not much after.
    let back = c.first_hit_after(passing).expect("c takes traffic again");
    let waited = back - passing;
    assert!(
        waited >= interval.mul_f64(0.9)
            && waited <= interval.mul_f64(3.0 * 1.1) + Duration::from_millis(100),
        "back after {waited:?}"
    );
    // Slow start: its share grows over 2 s.
    let window = Duration::from_millis(400);
    let early = c.hits_between(back, back + window) as f64
        / a.hits_between(back, back + window).max(1) as f64;
    let late_from = back + Duration::from_millis(2_300);
    let late = c.hits_between(late_from, late_from + window) as f64
        / a.hits_between(late_from, late_from + window).max(1) as f64;
    assert!(late > 0.7, "c's share once ramped: {late:.2} of a's");
    assert!(
        early < 0.5 * late,
        "no ramp: {early:.2} then {late:.2} of a's share"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejection_survives_a_hundred_activations_and_a_new_port_starts_fresh() {
    let a = Controlled::start("a").await;
    let b = Controlled::start("b").await;
    let c = Controlled::start("c").await;
    let health = r#"health = { path = "/healthz", interval = "300ms" }
outlier = { consecutive_failures = 3, base_ejection = "60s" }"#;
    let gw = Gateway::start(&upstream_config(&[&a, &b, &c], health));
    for backend in [&a, &b, &c] {
        wait_backend(&gw, backend.addr, "healthy", |b| b["health"] == "healthy").await;
    }
    // c passes its checks but fails every request: outlier detection.
    c.behaviour.status.store(503, Ordering::SeqCst);
    let web = gw.listener("web");
    for _ in 0..20 {
        get(web, "a", "/").await;
    }
    let before = backend_in(&backends_view(&gw).await, c.addr);
    assert_eq!(before["ejected"], true, "{before}");
    let activate = |i: usize| {
        let text = upstream_config(&[&a, &b, &c], health)
            .replace("body = \"v0\"", &format!("body = \"v{i}\""));
        admin_request(
            gw.admin,
            "POST",
            "/admin/runtime/activate",
            Some("application/toml"),
            Some(text),
        )
    };
    for i in 1..=100 {
        let (status, body) = activate(i).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("activated")),
            "{body}"
        );
    }
    assert_eq!(get(web, "a", "/version").await.2, "v100");
    let hits = c.hits();
    for _ in 0..1000 {
        let (status, _, _) = get(web, "a", "/").await;
        assert_eq!(status, 200);
    }
    assert_eq!(c.hits(), hits, "an ejected backend took traffic");
    let after = backend_in(&backends_view(&gw).await, c.addr);
    assert_eq!(
        after["ejected_until_unix_ms"],
        before["ejected_until_unix_ms"]
    );
    assert_eq!(after["ejections"], before["ejections"]);
    assert_eq!(after["health"], "healthy");

    // The same backend process on a new port is a new identity: checked
    // afresh, nothing of c's record applies.
    let d = Controlled::start("d").await;
    let text = upstream_config(&[&a, &b, &d], health);
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(text),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Nothing names c any more: its checker stops.
    let checks = c.behaviour.checks.load(Ordering::SeqCst);
    assert!(checks > 0, "c was never checked");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let after_removal = c.behaviour.checks.load(Ordering::SeqCst);
    assert!(
        after_removal <= checks + 1,
        "c still checked: {checks} then {after_removal}"
    );
    let fresh = backend_in(&backends_view(&gw).await, d.addr);
    assert_eq!(
        (fresh["ejected"].as_bool(), fresh["ejections"].as_u64()),
        (Some(false), Some(0)),
        "{fresh}"
    );
    assert!(fresh["attempts"] == 0, "{fresh}");
    wait_backend(&gw, d.addr, "healthy", |b| b["health"] == "healthy").await;
    for _ in 0..30 {
        get(web, "a", "/").await;
    }
    assert!(d.hits() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_requests_counts_what_older_generations_have_in_flight() {
    let a = Controlled::start("a").await;
    let b = Controlled::start("b").await;
    a.behaviour.hold.send_replace(true);
    let gw = Gateway::start(&upstream_config(&[&a], ""));
    let web = gw.listener("web");
    let slow: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { get(web, "a", "/").await }))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.behaviour.inflight.load(Ordering::SeqCst) < 50 {
        assert!(
            Instant::now() < deadline,
            "the slow requests did not all arrive"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(upstream_config(&[&a, &b], "policy = \"least_requests\"")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // a serves both live generations; b only the new one.
    let view = backends_view(&gw).await;
    assert_eq!(
        backend_in(&view, a.addr)["generations"],
        serde_json::json!([1, 2]),
        "{view}"
    );
    assert_eq!(
        backend_in(&view, b.addr)["generations"],
        serde_json::json!([2]),
        "{view}"
    );
    assert_eq!(backend_in(&view, a.addr)["inflight"], 50, "{view}");
    let fast: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { get(web, "a", "/").await }))
        .collect();
    for request in fast {
        let (status, _, body) = request.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "b"));
    }
    a.behaviour.hold.send_replace(false);
    for request in slow {
        let (status, _, body) = request.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "a"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_active_checks_a_killed_backend_stops_failing_requests_and_returns_when_revived() {
    let a = Controlled::start("a").await;
    let b = Controlled::start("b").await;
    let mut c = Controlled::start("c").await;
    let interval = Duration::from_millis(200);
    let gw = Gateway::start(&upstream_config(
        &[&a, &b, &c],
        // Outlier detection would eject it first: make it too patient.
        r#"health = { path = "/healthz", interval = "200ms", timeout = "100ms", unhealthy_after = 2, healthy_after = 2 }
outlier = { consecutive_failures = 1000 }"#,
    ));
    for backend in [&a, &b, &c] {
        wait_backend(&gw, backend.addr, "healthy", |b| b["health"] == "healthy").await;
    }
    let load = Load::start(gw.listener("web"), 8);
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.kill().await;
    let killed = SystemTime::now();
    wait_backend(&gw, c.addr, "unhealthy", |b| b["health"] == "unhealthy").await;
    c.revive().await;
    let revived = Instant::now();
    wait_backend(&gw, c.addr, "healthy again", |b| b["health"] == "healthy").await;
    let back = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ok, failures) = load.stop().await;
    // Requests fail only until the checks notice.
    let out_by = unix_ms(killed) + interval.mul_f64(3.0 * 1.1).as_millis() as u64 + 50;
    let late: Vec<_> = failures
        .iter()
        .filter(|(at, _)| unix_ms(*at) > out_by)
        .collect();
    assert!(
        late.is_empty(),
        "failures once the checks had failed: {late:?}"
    );
    // The load ran throughout (a floor, not a throughput target: a busy
    // machine halves the rate).
    assert!(ok > 300, "{ok}");
    assert!(back - revived <= interval.mul_f64(3.0 * 1.1) + Duration::from_millis(200));
    assert!(
        c.hits_after(back) > 0,
        "c took no traffic once healthy again"
    );
}

fn route_config(backends: &[&Controlled], route_extra: &str, upstream_extra: &str) -> String {
    upstream_config(backends, upstream_extra).replace(
        "upstream = \"app\"\n",
        &format!("upstream = \"app\"\n{route_extra}\n"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_retried_on_the_other_backend_and_a_large_post_is_not() {
    let a = Controlled::start("a").await;
    let b = Controlled::start("b").await;
    a.behaviour.status.store(503, Ordering::SeqCst);
    let gw = Gateway::start(&route_config(
        &[&a, &b],
        r#"retry = { attempts = 2, on = ["503"], methods = ["GET", "POST"], budget = { ratio = 1.0, min_per_second = 100 } }"#,
        // Keep a in play: this test is about retries, not ejection.
        "outlier = { consecutive_failures = 1000 }",
    ));
    let web = gw.listener("web");
    for _ in 0..20 {
        let (status, _, body) = get(web, "a", "/").await;
        assert_eq!((status, body.as_str()), (200, "b"));
    }
    assert_eq!(b.hits(), 20);
    assert!(
        a.hits() >= 5,
        "round-robin should have sent some to a first"
    );
    // A small POST is kept and sent again.
    let post = |body: Full<Bytes>| Request::post("/").header("host", "a").body(body).unwrap();
    for _ in 0..4 {
        let (status, _, body) = send(web, post(Full::new(Bytes::from_static(b"order"))))
            .await
            .unwrap();
        assert_eq!((status, &body[..]), (200, &b"b"[..]));
    }
    // A 1 MiB streamed body is not kept: one attempt, whatever it gets.
    let (a_before, b_before) = (a.hits(), b.hits());
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let req = Request::post("/")
            .header("host", "a")
            .body(Generated::new(1024 * 1024))
            .unwrap();
        statuses.push(open(web, req).await.status().as_u16());
    }
    assert_eq!(a.hits() - a_before + b.hits() - b_before, 4, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == 503).count(),
        a.hits() - a_before,
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_bounds_attempts_across_an_activation() {
    let a = Controlled::start("a").await;
    let b = Controlled::start("b").await;
    for backend in [&a, &b] {
        backend.behaviour.status.store(503, Ordering::SeqCst);
    }
    let retry = r#"retry = { attempts = 3, on = ["503"], backoff = { base = "1ms", max = "2ms" }, budget = { ratio = 0.2, min_per_second = 5 } }"#;
    let no_ejection = "outlier = { consecutive_failures = 1000 }";
    // The budget's floor builds up from when the upstream first exists.
    let born = Instant::now();
    let gw = Gateway::start(&route_config(&[&a, &b], retry, no_ejection));
    let web = gw.listener("web");
    // A steady 100 requests a second for 4 s, an activation half-way.
    let started = Instant::now();
    let mut requests = 0u64;
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    let mut activated = false;
    while started.elapsed() < Duration::from_secs(4) {
        ticker.tick().await;
        tokio::spawn(async move { get(web, "a", "/").await });
        requests += 1;
        if !activated && started.elapsed() > Duration::from_secs(2) {
            let text = route_config(&[&a, &b], retry, no_ejection).replace("\"v0\"", "\"v1\"");
            let (status, body) = admin_request(
                gw.admin,
                "POST",
                "/admin/runtime/activate",
                Some("application/toml"),
                Some(text),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            activated = true;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seconds = born.elapsed().as_secs_f64();
    let attempts = (a.hits() + b.hits()) as f64;
    let bound = requests as f64 * 1.2 + 5.0 * seconds.ceil();
    eprintln!(
        "retry budget: {requests} requests, {attempts} attempts, bound {bound:.0} (no budget: {})",
        requests * 3
    );
    assert!(
        attempts > requests as f64 * 1.1,
        "the budget allowed hardly any retry: {attempts}"
    );
    assert!(
        attempts <= bound + 5.0,
        "{attempts} attempts for {requests} requests"
    );
}

/// A backend that answers `name` after `delay`, and notes when the peer
/// closes the connection before that (the hedge it lost was cancelled).
async fn timed_backend(
    name: &'static str,
    delay: Duration,
) -> (SocketAddr, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancelled = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&cancelled);
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut pending = Vec::new();
                loop {
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        tokio::select! {
                            read = stream.read(&mut buf) => {
                                if matches!(read, Ok(0) | Err(_)) {
                                    seen.fetch_add(1, Ordering::SeqCst);
                                }
                                return;
                            }
                            _ = tokio::time::sleep(delay) => {}
                        }
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{name}",
                            name.len()
                        );
                        if stream.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => pending.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    (addr, cancelled, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_answers_from_the_fast_backend_and_cancels_the_slow_attempt() {
    let (slow, cancelled, _slow_task) = timed_backend("slow", Duration::from_millis(200)).await;
    let (fast, _, _fast_task) = timed_backend("fast", Duration::ZERO).await;
    let gw = Gateway::start(&config(&format!(
        r#"[[routes]]
name = "all"
listeners = ["web"]
upstream = "app"
hedge = {{ delay = "20ms" }}
# Hedges spend from the retry budget: room for one per request.
retry = {{ attempts = 2, on = ["reset"], budget = {{ ratio = 1.0, min_per_second = 100 }} }}

[upstreams.app]
backends = [{{ addr = "{slow}" }}, {{ addr = "{fast}" }}]
"#
    )));
    let web = gw.listener("web");
    for _ in 0..20 {
        let started = Instant::now();
        let (status, _, body) = get(web, "a", "/").await;
        assert_eq!((status, body.as_str()), (200, "fast"));
        assert!(
            started.elapsed() < Duration::from_millis(180),
            "{:?}",
            started.elapsed()
        );
    }
    // Half of the requests went to the slow backend first; each of those
    // attempts was dropped, its connection closed under it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while cancelled.load(Ordering::SeqCst) < 10 {
        assert!(
            Instant::now() < deadline,
            "cancelled: {}",
            cancelled.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `GET /` with `header: PREFIX-KEY` for every key, over 16
/// keep-alive connections; returns each key's status and body, in order.
async fn keyed_gets(
    web: SocketAddr,
    header: &'static str,
    prefix: &'static str,
    keys: std::ops::Range<u32>,
) -> Vec<(u16, String)> {
    let keys: Vec<u32> = keys.collect();
    let chunks: Vec<Vec<u32>> = keys
        .chunks(keys.len().div_ceil(16))
        .map(<[u32]>::to_vec)
        .collect();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(web).await.unwrap();
                let mut sender = crate::harness::h1_over(stream).await.unwrap();
                let mut out = Vec::with_capacity(chunk.len());
                for key in chunk {
                    let req = Request::get("/")
                        .header("host", "a")
                        .header(header, format!("{prefix}-{key}"))
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    let response = sender.send_request(req).await.unwrap();
                    let status = response.status().as_u16();
                    let body = response.into_body().collect().await.unwrap().to_bytes();
                    out.push((status, String::from_utf8_lossy(&body).into_owned()));
                }
                out
            })
        })
        .collect();
    let mut all = Vec::with_capacity(keys.len());
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

/// The backend that answered each `x-user` key.
async fn owners(web: SocketAddr, keys: std::ops::Range<u32>) -> Vec<String> {
    keyed_gets(web, "x-user", "user", keys)
        .await
        .into_iter()
        .map(|(status, body)| {
            assert_eq!(status, 200);
            body
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashing_keeps_keys_in_place_and_spills_a_hot_key() {
    let names = ["a", "b", "c", "d", "e"];
    let mut backends = Vec::new();
    for name in names {
        backends.push(Controlled::start(name).await);
    }
    let all: Vec<&Controlled> = backends.iter().collect();
    // Pure consistent hashing first: a bound on load would move keys
    // whenever their owner is busy.
    let hash = "policy = \"hash\"\nhash_key = \"header:x-user\"";
    let gw = Gateway::start(&upstream_config(&all, hash));
    let web = gw.listener("web");
    let before = owners(web, 0..10_000).await;
    // One key, one backend, every time.
    assert_eq!(owners(web, 0..200).await, before[..200]);
    for name in names {
        let share = before.iter().filter(|o| *o == name).count();
        assert!(
            (1_500..=2_500).contains(&share),
            "{name} owns {share} of 10 000 keys"
        );
    }
    // Remove c: only about its fifth of the keys move.
    let four: Vec<&Controlled> = backends.iter().filter(|b| b.name != "c").collect();
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(upstream_config(&four, hash)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let after = owners(web, 0..10_000).await;
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    let from_c = before.iter().filter(|o| *o == "c").count();
    eprintln!("hash: {moved} of 10 000 keys moved when c (owner of {from_c}) left");
    assert!(moved <= 2_500, "{moved} keys moved");
    assert!(after.iter().all(|o| o != "c"));

    // A hot key: with every request held, its owner takes no more than
    // 1.5 × the average; the rest spill along the key's walk.
    let bounded = format!("{hash}\nhash_balance_factor = 150");
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(upstream_config(&four, &bounded)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for backend in &backends {
        backend.behaviour.hold.send_replace(true);
    }
    let hot: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn(async move {
                let req = Request::get("/")
                    .header("host", "a")
                    .header("x-user", "user-7")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                send(web, req).await.unwrap()
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = || -> u64 {
        backends
            .iter()
            .map(|b| b.behaviour.inflight.load(Ordering::SeqCst))
            .sum()
    };
    while held() < 20 {
        assert!(
            Instant::now() < deadline,
            "only {} requests arrived",
            held()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let owner = &after[7];
    let loads: Vec<(&str, u64)> = backends
        .iter()
        .map(|b| (b.name, b.behaviour.inflight.load(Ordering::SeqCst)))
        .collect();
    let owner_load = loads.iter().find(|(n, _)| n == owner).unwrap().1;
    // 20 in flight over 4 backends: average 5, bound ceil(1.5 × 5) = 8.
    assert!(owner_load <= 8, "{loads:?}");
    assert!(
        loads.iter().filter(|(_, l)| *l > 0).count() >= 3,
        "{loads:?}"
    );
    for backend in &backends {
        backend.behaviour.hold.send_replace(false);
    }
    for request in hot {
        assert_eq!(request.await.unwrap().0, 200);
    }
}

async fn get_as(web: SocketAddr, client: &str) -> (u16, hyper::HeaderMap) {
    let req = Request::get("/")
        .header("host", "a")
        .header("x-client", client)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, _) = send(web, req).await.unwrap();
    (status, headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_answers_429_with_retry_after_and_keeps_its_buckets_across_activation() {
    let a = Controlled::start("a").await;
    let quota = r#"quota = { rate = 1, per = "10s", burst = 3, key = "header:x-client" }"#;
    let gw = Gateway::start(&route_config(&[&a], quota, ""));
    let web = gw.listener("web");
    for _ in 0..3 {
        assert_eq!(get_as(web, "alice").await.0, 200);
    }
    let (status, headers) = get_as(web, "alice").await;
    assert_eq!(status, 429);
    // One token per 10 s: the next is due in 10 s at most, never 0.
    let wait: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=10).contains(&wait), "{wait}");
    assert_eq!(
        get_as(web, "bob").await.0,
        200,
        "another key has its own bucket"
    );
    // An activation that keeps the quota keeps the buckets.
    let activate = |text: String| {
        admin_request(
            gw.admin,
            "POST",
            "/admin/runtime/activate",
            Some("application/toml"),
            Some(text),
        )
    };
    let (status, body) = activate(route_config(&[&a], quota, "").replace("\"v0\"", "\"v1\"")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get_as(web, "alice").await.0, 429);
    // A changed quota starts afresh.
    let wider = quota.replace("burst = 3", "burst = 5");
    let (status, body) = activate(route_config(&[&a], &wider, "")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get_as(web, "alice").await.0, 200);
    assert_eq!(a.hits(), 3 + 1 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_with_headers_always_tells_every_answer_what_is_left() {
    let a = Controlled::start("a").await;
    let quota = r#"quota = { rate = 1, per = "10s", burst = 3, key = "header:x-client" }"#;
    let gw = Gateway::start(&route_config(&[&a], quota, ""));
    let web = gw.listener("web");
    // By default only a refusal says it.
    let (status, headers) = get_as(web, "alice").await;
    assert_eq!(status, 200);
    assert!(headers.get("ratelimit").is_none(), "{headers:?}");
    // `headers = "always"` is not part of what is counted: the activation
    // keeps alice's bucket (2 of 3 left).
    let always = quota.replace(" }", r#", headers = "always" }"#);
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(route_config(&[&a], &always, "")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let field = |headers: &hyper::HeaderMap, name: &str| {
        headers[name]
            .to_str()
            .unwrap()
            .split(';')
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // r: what is left; t: seconds until the bucket is whole again (one
    // token per 10 s, so 10 s per token missing, less the time passed).
    let seconds = |t: &str| -> u64 { t.strip_prefix("t=").unwrap().parse().unwrap() };
    let (status, headers) = get_as(web, "alice").await;
    assert_eq!(status, 200);
    assert_eq!(field(&headers, "ratelimit-policy"), ["q=1", "w=10"]);
    let state = field(&headers, "ratelimit");
    assert_eq!(state[0], "r=1", "{state:?}");
    assert!((18..=20).contains(&seconds(&state[1])), "{state:?}");
    // A failing backend's answer says it too: the request was counted.
    a.behaviour.status.store(503, Ordering::SeqCst);
    let (status, headers) = get_as(web, "alice").await;
    assert_eq!(status, 503);
    let state = field(&headers, "ratelimit");
    assert_eq!(state[0], "r=0", "{state:?}");
    assert!((28..=30).contains(&seconds(&state[1])), "{state:?}");
    // The refusal, as before: r=0 and the time until the next token.
    let (status, headers) = get_as(web, "alice").await;
    assert_eq!(status, 429);
    assert_eq!(field(&headers, "ratelimit")[0], "r=0");
    assert_eq!(headers.get_all("ratelimit").iter().count(), 1);
    // Another key, its own bucket.
    a.behaviour.status.store(200, Ordering::SeqCst);
    let (_, headers) = get_as(web, "bob").await;
    let state = field(&headers, "ratelimit");
    assert_eq!(state[0], "r=2", "{state:?}");
    assert!((9..=10).contains(&seconds(&state[1])), "{state:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_max_inflight_of_four_turns_away_exactly_four_of_eight() {
    let a = Controlled::start("a").await;
    a.behaviour.hold.send_replace(true);
    let text = upstream_config(&[&a], "").replace(
        "name = \"web\"\nbind = \"127.0.0.1:0\"\n",
        "name = \"web\"\nbind = \"127.0.0.1:0\"\nmax_inflight = 4\n",
    );
    assert!(text.contains("max_inflight = 4"));
    let gw = Gateway::start(&text);
    let web = gw.listener("web");
    let requests: Vec<_> = (0..8)
        .map(|_| tokio::spawn(async move { get(web, "a", "/").await.0 }))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.behaviour.inflight.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The other four are answered while the first four are still held.
    let mut refused = 0;
    let mut held = Vec::new();
    for request in requests {
        if request.is_finished() {
            assert_eq!(request.await.unwrap(), 503);
            refused += 1;
        } else {
            held.push(request);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while refused < 4 {
        assert!(Instant::now() < deadline, "only {refused} refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut still = Vec::new();
        for request in held {
            if request.is_finished() {
                assert_eq!(request.await.unwrap(), 503);
                refused += 1;
            } else {
                still.push(request);
            }
        }
        held = still;
    }
    assert_eq!(held.len(), 4);
    // A direct answer on another route still counts against the listener.
    assert_eq!(get(web, "a", "/version").await.0, 503);
    a.behaviour.hold.send_replace(false);
    for request in held {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert_eq!(get(web, "a", "/version").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_thousand_quota_keys_keep_memory_bounded() {
    let a = Controlled::start("a").await;
    // One request per key per hour: every new key passes once.
    let quota =
        r#"quota = { rate = 1, per = "1h", burst = 1, key = "header:x-client", max_keys = 1000 }"#;
    // The impact sample (bounded too, and filling over the same
    // requests) is off, and so are huge pages (allowed once the process
    // is busy, they grow resident memory 2 MiB at a time, whenever the
    // kernel backs or collapses a range): what grows here is the
    // quota's alone.
    let text = route_config(&[&a], quota, "").replace(
        "[log]",
        "[runtime]\nimpact_sample = 0\nhuge_pages = \"never\"\n\n[log]",
    );
    let gw = Gateway::start(&text);
    let web = gw.listener("web");
    let send_keys = |keys: std::ops::Range<u32>| async move {
        keyed_gets(web, "x-client", "client", keys)
            .await
            .iter()
            .filter(|(status, _)| *status != 200)
            .count()
    };
    assert_eq!(send_keys(0..20_000).await, 0, "a new key was refused");
    let (rss_early, _) = gw.memory_kib();
    assert_eq!(send_keys(20_000..200_000).await, 0, "a new key was refused");
    let (rss_late, _) = gw.memory_kib();
    // Without the cap: 180 000 more buckets, about 14 MB.
    let grown = rss_late.saturating_sub(rss_early);
    eprintln!("quota keys: RSS {rss_early} KiB after 20 000 keys, {rss_late} KiB after 200 000");
    assert!(grown < 6 * 1024, "RSS grew {grown} KiB over 180 000 keys");
    // A key is remembered (spent) right after its use; the oldest ones
    // were forgotten to make room.
    assert_eq!(get_as(web, "client-fresh").await.0, 200);
    assert_eq!(get_as(web, "client-fresh").await.0, 429);
    assert_eq!(get_as(web, "client-0").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_request_whose_every_attempt_fails_is_answered_at_once() {
    let (a, b) = (refusing_addr(), refusing_addr());
    let gw = Gateway::start(&config(&format!(
        r#"[[routes]]
name = "all"
listeners = ["web"]
upstream = "app"
timeout = "2s"
hedge = {{ delay = "20ms", max_extra = 3 }}

[upstreams.app]
backends = [{{ addr = "{a}" }}, {{ addr = "{b}" }}]
"#
    )));
    for _ in 0..5 {
        let started = Instant::now();
        let (status, _, _) =
            tokio::time::timeout(Duration::from_secs(5), get(gw.listener("web"), "a", "/"))
                .await
                .expect("answered, not hung");
        assert_eq!(status, 502);
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
    }
}

/// The view of the backend at `addr` in upstream `upstream`.
fn backend_of(view: &Value, upstream: &str, addr: SocketAddr) -> Value {
    view["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|u| u["name"] == upstream)
        .flat_map(|u| u["backends"].as_array().cloned().unwrap_or_default())
        .find(|b| b["addr"] == addr.to_string().as_str())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_honour_host_expect_status_and_tcp() {
    let http = Controlled::start("http").await;
    let picky = Controlled::start("picky").await;
    let tcp = Controlled::start("tcp").await;
    // The TCP check passes on a connection: the HTTP answer is not asked.
    tcp.behaviour.healthy.store(false, Ordering::SeqCst);
    let gw = Gateway::start(&config(&format!(
        r#"[[routes]]
name = "http"
listeners = ["web"]
path_prefix = "/http"
upstream = "http"

[[routes]]
name = "picky"
listeners = ["web"]
path_prefix = "/picky"
upstream = "picky"

[[routes]]
name = "tcp"
listeners = ["web"]
path_prefix = "/tcp"
upstream = "tcp"

[upstreams.http]
health = {{ path = "/healthz", host = "checks.internal", interval = "200ms" }}
backends = [{{ addr = "{}" }}]

[upstreams.picky]
health = {{ path = "/healthz", expect_status = [204], interval = "200ms", unhealthy_after = 2 }}
backends = [{{ addr = "{}" }}]

[upstreams.tcp]
health = {{ tcp = true, interval = "200ms" }}
backends = [{{ addr = "{}" }}]
"#,
        http.addr, picky.addr, tcp.addr
    )));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = backends_view(&gw).await;
        let states = (
            backend_of(&view, "http", http.addr)["health"].clone(),
            backend_of(&view, "picky", picky.addr)["health"].clone(),
            backend_of(&view, "tcp", tcp.addr)["health"].clone(),
        );
        if states == ("healthy".into(), "unhealthy".into(), "healthy".into()) {
            let picky = backend_of(&view, "picky", picky.addr);
            assert_eq!(picky["last_check"]["detail"], "status 200", "{picky}");
            break;
        }
        assert!(Instant::now() < deadline, "{states:?}\n{view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        http.behaviour.check_host.lock().unwrap().as_deref(),
        Some("checks.internal")
    );
    // The TCP check never asked for /healthz.
    assert_eq!(tcp.behaviour.checks.load(Ordering::SeqCst), 0);
}

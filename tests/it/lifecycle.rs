//! Long-lived connections, drain, and drain-aware upgrades.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::*;
use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;

fn tcp_config(echo: SocketAddr, runtime: &str, timeout: &str) -> String {
    Config::new()
        .runtime(runtime)
        .listener("db", "protocol = \"tcp\"\nupstream = \"echo\"")
        .listener("web", "")
        .route(
            "hello",
            &format!(
                "listeners = [\"web\"]\ntimeout = \"{timeout}\"\nrespond = {{ body = \"hello\" }}"
            ),
        )
        .upstream("echo", &[echo], "")
        .build()
}

async fn ping(stream: &mut TcpStream, n: u32) -> bool {
    let message = format!("ping {n}\n");
    if stream.write_all(message.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = vec![0u8; message.len()];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf)).await,
        Ok(Ok(_))
    ) && buf == message.as_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_survive_a_thousand_activations() {
    let (echo, _task) = echo_server().await;
    let gw = Gateway::start(&tcp_config(echo, "", "1s"));
    let db = gw.listener("db");
    let mut connections = Vec::new();
    for _ in 0..200 {
        let mut stream = TcpStream::connect(db).await.unwrap();
        assert!(ping(&mut stream, 0).await);
        connections.push(stream);
    }
    let status = gw.status().await;
    assert_eq!(
        status["generations"][0]["open_connections"], 200,
        "{status}"
    );
    // Warm up so that the operation log is at its bound, then measure.
    for i in 0..300 {
        assert_eq!(
            activate_status(&gw, &tcp_config(echo, "", &format!("{}s", 2 + i % 2))).await,
            200
        );
    }
    let (rss_before, _) = gw.memory_kib();
    for i in 0..1000 {
        assert_eq!(
            activate_status(&gw, &tcp_config(echo, "", &format!("{}s", 2 + i % 2))).await,
            200
        );
    }
    let (rss_after, _) = gw.memory_kib();
    for (n, stream) in connections.iter_mut().enumerate() {
        assert!(
            ping(stream, n as u32 + 1).await,
            "connection {n} was cut by an activation"
        );
    }
    let status = gw.status().await;
    let generations = status["generations"].as_array().unwrap();
    // Generation 1 still counts its 200 connections; nothing else of it is kept.
    assert_eq!(generations[0]["generation"], 1);
    assert_eq!(generations[0]["open_connections"], 200);
    assert_eq!(
        generations.len(),
        2,
        "only generation 1 (pinned) and the active one are alive: {status}"
    );
    // A backstop to the exact generation count above (see the same check
    // in `admin::a_thousand_activations_under_load`).
    let growth = rss_after as f64 / rss_before as f64;
    eprintln!("200 TCP connections over 1000 activations: RSS {rss_before} KiB -> {rss_after} KiB ({growth:.3}x)");
    assert!(
        growth < 1.25,
        "resident memory grew from {rss_before} KiB to {rss_after} KiB"
    );
}

/// `cutover_tcp_bytes_total` for one direction, as `/metrics` shows it.
async fn tcp_bytes(gw: &Gateway, direction: &str) -> u64 {
    let (_, _, text) = get(gw.metrics.expect("metrics"), "a", "/metrics").await;
    text.lines()
        .find(|l| {
            l.starts_with("cutover_tcp_bytes_total")
                && l.contains("listener=\"db\"")
                && l.contains(direction)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_bytes_are_counted_as_they_move_and_kept_when_max_pinned_age_closes() {
    let (echo, _task) = echo_server().await;
    let config = tcp_config(echo, "max_pinned_age = \"1s\"", "1s")
        .replace("[log]", "[metrics]\nbind = \"127.0.0.1:0\"\n\n[log]");
    let gw = Gateway::start(&config);
    let mut stream = TcpStream::connect(gw.listener("db")).await.unwrap();
    for n in 0..10 {
        assert!(ping(&mut stream, n).await);
    }
    let sent = (0..10)
        .map(|n| format!("ping {n}\n").len() as u64)
        .sum::<u64>();
    // While the connection is open.
    let deadline = Instant::now() + Duration::from_secs(5);
    while tcp_bytes(&gw, "downstream_to_upstream").await < sent
        || tcp_bytes(&gw, "upstream_to_downstream").await < sent
    {
        assert!(
            Instant::now() < deadline,
            "bytes not counted while the connection is open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Closed by max_pinned_age: what moved stays counted.
    assert_eq!(
        activate_status(&gw, &config.replace("timeout = \"1s\"", "timeout = \"2s\"")).await,
        200
    );
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
    assert_eq!(tcp_bytes(&gw, "downstream_to_upstream").await, sent);
    assert_eq!(tcp_bytes(&gw, "upstream_to_downstream").await, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_pinned_age_closes_superseded_connections() {
    let (echo, _task) = echo_server().await;
    let gw = Gateway::start(&tcp_config(echo, "max_pinned_age = \"2s\"", "1s"));
    let db = gw.listener("db");
    let mut old = TcpStream::connect(db).await.unwrap();
    assert!(ping(&mut old, 1).await);
    assert_eq!(
        activate_status(&gw, &tcp_config(echo, "max_pinned_age = \"2s\"", "2s")).await,
        200
    );
    let superseded = Instant::now();
    let mut fresh = TcpStream::connect(db).await.unwrap();
    assert!(ping(&mut fresh, 1).await);
    assert!(
        ping(&mut old, 2).await,
        "still open right after the activation"
    );
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(6), old.read(&mut buf))
        .await
        .unwrap();
    let after = superseded.elapsed();
    assert!(
        matches!(closed, Ok(0)),
        "expected a clean close, got {closed:?}"
    );
    assert!(
        after > Duration::from_millis(1800) && after < Duration::from_millis(3500),
        "closed after {after:?}"
    );
    assert!(
        ping(&mut fresh, 2).await,
        "a connection on the active generation stays"
    );
}

fn slow_backend_config(backend: SocketAddr, drain_timeout: &str) -> String {
    Config::new()
        .runtime(&format!("drain_timeout = \"{drain_timeout}\""))
        .listener("web", "")
        .route("all", "listeners = [\"web\"]\nupstream = \"app\"")
        .upstream("app", &[backend], "")
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_then_exits_zero() {
    use std::sync::Arc;
    let arrived = Arc::new(tokio::sync::Semaphore::new(0));
    let seen = Arc::clone(&arrived);
    let backend = Backend::start(Arc::new(move |_req| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            seen.add_permits(1);
            tokio::time::sleep(Duration::from_secs(2)).await;
            hyper::Response::new(full("done"))
        })
    }))
    .await;
    let mut gw = Gateway::start(&slow_backend_config(backend.addr, "20s"));
    let web = gw.listener("web");
    let mut requests = Vec::new();
    for _ in 0..32 {
        requests.push(tokio::spawn(async move { get(web, "a", "/held").await }));
    }
    // All 32 are at the backend before the signal.
    let _all = tokio::time::timeout(Duration::from_secs(10), arrived.acquire_many(32))
        .await
        .unwrap()
        .unwrap();
    let signalled = Instant::now();
    gw.signal("TERM");
    // Listeners close at once: new attempts are refused (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match TcpStream::connect(web).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ if Instant::now() > deadline => panic!("listener still accepting after SIGTERM"),
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    for request in requests {
        let (status, _, body) = request.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "done"));
    }
    let code = tokio::task::spawn_blocking(move || {
        let code = gw.wait_exit(Duration::from_secs(10));
        (code, signalled.elapsed())
    })
    .await
    .unwrap();
    assert_eq!(code.0, Some(0));
    assert!(
        code.1 < Duration::from_secs(5),
        "exited after {:?}, well before the 20s drain_timeout",
        code.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_cuts_endless_streams_at_the_deadline_and_sends_goaway() {
    use http_body_util::BodyExt;
    let backend = ticking_backend(Duration::from_millis(100)).await;
    let mut gw = Gateway::start(&slow_backend_config(backend.addr, "2s"));
    let web = gw.listener("web");

    // An HTTP/2 client with an open stream sees GOAWAY when draining starts.
    let stream = TcpStream::connect(web).await.unwrap();
    let (mut h2, h2_conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let h2_conn = tokio::spawn(h2_conn);
    let req = hyper::Request::builder()
        .uri("http://a/stream")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let mut h2_body = h2.send_request(req).await.unwrap().into_body();
    assert!(h2_body.frame().await.is_some());

    let req = hyper::Request::builder()
        .uri("/stream")
        .header("host", "a")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let mut h1_body = open(web, req).await.into_body();
    assert!(h1_body.frame().await.is_some());

    let signalled = Instant::now();
    gw.signal("TERM");
    // The stream keeps flowing during the drain, and is cut at the deadline.
    let mut frames = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), h1_body.frame())
            .await
            .unwrap()
        {
            Some(Ok(_)) => frames += 1,
            other => {
                eprintln!(
                    "stream ended with {other:?} after {:?}\n{}",
                    signalled.elapsed(),
                    gw.logs()
                );
                break;
            }
        }
    }
    let cut_after = signalled.elapsed();
    assert!(
        frames > 5,
        "the stream kept flowing while draining ({frames} frames)"
    );
    assert!(
        cut_after > Duration::from_millis(1500) && cut_after < Duration::from_secs(3),
        "cut after {cut_after:?} (drain_timeout 2s)"
    );
    // h2: the connection future ends once GOAWAY arrives and the stream is done.
    while let Some(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), h2_body.frame())
        .await
        .unwrap()
    {}
    let ended = tokio::time::timeout(Duration::from_secs(5), h2_conn).await;
    assert!(ended.is_ok(), "the HTTP/2 connection was closed");
    // Not a new stream on the GOAWAY'd connection.
    let req = hyper::Request::builder()
        .uri("http://a/again")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert!(h2.send_request(req).await.is_err());
    let code = tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(code, Some(0));
}

/// Installs `bytes` at `path` as a package manager does: a new file
/// renamed over the old one (which a running process keeps executing).
fn install(path: &std::path::Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    let staged = path.with_extension("new");
    std::fs::write(&staged, bytes).unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// The executable the process behind the admin socket runs, once its
/// digest is known.
async fn running_binary(gw: &Gateway) -> (u64, String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, status) = admin_request(gw.admin, "GET", "/admin/runtime/status", None, None).await;
        if let Some(sha) = status["binary"]["sha256"].as_str() {
            return (
                status["pid"].as_u64().unwrap(),
                status["binary"]["path"].as_str().unwrap().to_owned(),
                sha.to_owned(),
            );
        }
        assert!(Instant::now() < deadline, "no binary digest: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

#[tokio::test]
async fn status_names_the_running_binary_and_its_digest_from_the_first_answer() {
    let gw = Gateway::start(&config(""));
    let (_, status) = admin_request(gw.admin, "GET", "/admin/runtime/status", None, None).await;
    let expected = digest(&std::fs::read(BIN).unwrap());
    assert_eq!(status["binary"]["sha256"], expected.as_str(), "{status}");
    assert_eq!(status["binary"]["path"], BIN, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_runs_the_file_now_at_the_path_the_process_was_started_from() {
    let bin_dir = tempfile::tempdir().unwrap();
    let installed = bin_dir.path().join("cutover");
    let original = std::fs::read(BIN).unwrap();
    install(&installed, &original);
    let config = config(
        r#"[[routes]]
name = "hello"
listeners = ["web"]
respond = { body = "hi" }
"#,
    );
    let mut gw = Gateway::start_binary(&installed, tempfile::tempdir().unwrap(), &config);
    let (old_pid, path, sha) = running_binary(&gw).await;
    assert_eq!(path, installed.display().to_string());
    assert_eq!(sha, digest(&original));

    // A package upgrade replaces the file; trailing bytes make it a
    // different file that still runs.
    let mut replacement = original.clone();
    replacement.extend_from_slice(b"\0cutover upgrade test: new build");
    install(&installed, &replacement);
    let op = upgrade(&gw, None).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    gw.adopted.push(op["pid"].as_u64().unwrap() as u32);
    let (pid, path, sha) = running_binary(&gw).await;
    assert_ne!(pid, old_pid);
    assert_eq!(path, installed.display().to_string());
    assert_eq!(sha, digest(&replacement), "the upgrade ran the old code");

    // Another executable, named by the request.
    let other = bin_dir.path().join("cutover-next");
    let mut next = original.clone();
    next.extend_from_slice(b"\0cutover upgrade test: named build");
    install(&other, &next);
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/lifecycle/upgrade",
        Some("application/json"),
        Some(serde_json::json!({ "binary": other }).to_string()),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (pid, path, sha) = loop {
        let running = running_binary(&gw).await;
        if running.0 != pid {
            break running;
        }
        assert!(
            Instant::now() < deadline,
            "the named binary never took over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    gw.adopted.push(pid as u32);
    assert_eq!(path, other.display().to_string());
    assert_eq!(sha, digest(&next));

    // A relative path or a file that is not executable is refused.
    for binary in [
        "cutover".to_owned(),
        bin_dir.path().join("missing").display().to_string(),
    ] {
        let (status, body) = admin_request(
            gw.admin,
            "POST",
            "/admin/lifecycle/upgrade",
            Some("application/json"),
            Some(serde_json::json!({ "binary": binary }).to_string()),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"], "invalid_binary", "{body}");
    }
    // Only upgrades take a binary.
    let (status, _) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/validate",
        Some("application/json"),
        Some(serde_json::json!({ "binary": "/bin/true" }).to_string()),
    )
    .await;
    assert_eq!(status, 400);
}

/// Starts an upgrade through the admin API and waits for its outcome.
pub(crate) async fn upgrade(gw: &Gateway, config: Option<&str>) -> Value {
    let (status, body) = match config {
        Some(text) => {
            admin_request(
                gw.admin,
                "POST",
                "/admin/lifecycle/upgrade",
                Some("application/toml"),
                Some(text.to_owned()),
            )
            .await
        }
        None => admin_request(gw.admin, "POST", "/admin/lifecycle/upgrade", None, None).await,
    };
    assert_eq!(status, 202, "{body}");
    let id = body["operation_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Every poll is answered, by the old process or the new one (no
        // retry on a broken connection: that would hide a defect).
        let req = Request::builder()
            .uri(format!("/admin/runtime/operations/{id}"))
            .header("host", gw.admin.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, _, bytes) = send(gw.admin, req)
            .await
            .unwrap_or_else(|e| panic!("a poll of upgrade {id} was not answered: {e}"));
        let op: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status == 200 && op["outcome"] != "running" {
            return op;
        }
        assert!(Instant::now() < deadline, "upgrade {id} did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_under_load_refuse_no_connection() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let backend = Backend::named("ok").await;
    let mut gw = Gateway::start(&slow_backend_config(backend.addr, "5s"));
    let web = gw.listener("web");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, refused, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut clients = Vec::new();
    for _ in 0..32 {
        let (stop, ok, refused, failed) = (
            Arc::clone(&stop),
            Arc::clone(&ok),
            Arc::clone(&refused),
            Arc::clone(&failed),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut stream = match TcpStream::connect(web).await {
                    Ok(s) => s,
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let _ = stream
                    .write_all(b"GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
                    .await;
                let mut answer = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
                        .await;
                if answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"ok") {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Keep-alive clients beside them: only "closed before the first byte" may happen.
    let (ka_ok, ka_closed, ka_other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    for _ in 0..8 {
        let (stop, ka_ok, ka_closed, ka_other) = (
            Arc::clone(&stop),
            Arc::clone(&ka_ok),
            Arc::clone(&ka_closed),
            Arc::clone(&ka_other),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(stream) = TcpStream::connect(web).await else {
                    ka_other.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let Ok(mut sender) = crate::harness::h1_over(stream).await else {
                    continue;
                };
                while !stop.load(Ordering::Relaxed) {
                    let req = hyper::Request::builder()
                        .uri("/")
                        .header("host", "a")
                        .body(http_body_util::Full::new(bytes::Bytes::new()))
                        .unwrap();
                    match sender.send_request(req).await {
                        Ok(r) if r.status() == 200 => {
                            // A draining gateway answers `Connection: close`:
                            // a well-behaved client does not reuse the connection.
                            let closing =
                                r.headers().get("connection").is_some_and(|v| v == "close");
                            let _ = http_body_util::BodyExt::collect(r.into_body()).await;
                            ka_ok.fetch_add(1, Ordering::Relaxed);
                            if closing {
                                break;
                            }
                        }
                        Ok(_) => {
                            ka_other.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if e.is_canceled() || e.is_closed() || e.is_incomplete_message() => {
                            ka_closed.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Err(_) => {
                            ka_other.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            }
        }));
    }
    let mut pids = vec![gw.pid()];
    // Each new process has another worker count: a listener's group of
    // sockets (one per worker) grows, or fewer workers share it; every
    // socket is handed on, none closed with connections in its backlog.
    for (round, workers) in [3, 1, 2, 4, 2].into_iter().enumerate() {
        let config = Config::new()
            .runtime(&format!(
                "drain_timeout = \"5s\"\nworker_threads = {workers}"
            ))
            .listener("web", "")
            .route("all", "listeners = [\"web\"]\nupstream = \"app\"")
            .upstream("app", &[backend.addr], "")
            .build();
        let op = upgrade(&gw, Some(&config)).await;
        assert_eq!(op["outcome"], "succeeded", "round {round}: {op}");
        let new_pid = op["pid"].as_u64().unwrap() as u32;
        let old_pid = *pids.last().unwrap();
        assert_ne!(new_pid, old_pid);
        assert_eq!(op["previous_pid"].as_u64(), Some(old_pid as u64));
        gw.adopted.push(new_pid);
        pids.push(new_pid);
        // The old process is gone within drain_timeout + 1 s; never more than two.
        let deadline = Instant::now() + Duration::from_secs(6);
        loop {
            let running = gw.gateway_pids();
            assert!(running.len() <= 2, "round {round}: {running:?}");
            if !running.contains(&old_pid) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: pid {old_pid} still running"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let status = gw.status().await;
        assert_eq!(status["pid"].as_u64(), Some(new_pid as u64));
        assert_eq!(
            status["listeners"][0]["address"].as_str(),
            Some(web.to_string().as_str()),
            "listening address unchanged"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let (ok, refused, failed) = (
        ok.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    let (ka_ok, ka_closed, ka_other) = (
        ka_ok.load(Ordering::Relaxed),
        ka_closed.load(Ordering::Relaxed),
        ka_other.load(Ordering::Relaxed),
    );
    eprintln!("5 upgrades: close-mode {ok} ok, {refused} refused, {failed} failed; keep-alive {ka_ok} ok, {ka_closed} closed before a response, {ka_other} other");
    assert!(ok > 500, "too little traffic: {ok}");
    assert_eq!((refused, failed), (0, 0));
    assert_eq!(ka_other, 0);
    assert!(
        (ka_closed as f64) <= 0.001 * (ka_ok + ka_closed) as f64,
        "{ka_closed} of {} keep-alive requests were cut",
        ka_ok + ka_closed
    );
    // History continued across all five processes.
    let history = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None)
        .await
        .1;
    let upgrades = history["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"] == "upgrade" && o["outcome"] == "succeeded")
        .count();
    assert_eq!(upgrades, 5, "{history}");
    let first_exit =
        tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(1)).map(|c| (c, gw)))
            .await
            .unwrap();
    assert_eq!(
        first_exit.map(|(c, _)| c),
        Some(0),
        "the original process exited 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_applies_restart_required_changes_and_continues_history() {
    let backend = Backend::named("ok").await;
    let base = slow_backend_config(backend.addr, "5s");
    let mut gw = Gateway::start(&base);
    let old_web = gw.listener("web");
    let new_port = closed_port();
    let candidate = base
        .replacen(
            "bind = \"127.0.0.1:0\"\n\n[[routes]]",
            &format!("bind = \"{new_port}\"\n\n[[routes]]"),
            1,
        )
        .replace("level = \"warn\"", "level = \"info\"\nformat = \"json\"");
    // Activation refuses it...
    let (status, plan) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(candidate.clone()),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(plan["rejected"].as_array().map(Vec::len), Some(2), "{plan}");
    // ... an upgrade applies it.
    let op = upgrade(&gw, Some(&candidate)).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    gw.adopted.push(op["pid"].as_u64().unwrap() as u32);
    assert_eq!(
        op["generation"], 2,
        "the history continues with the next generation id"
    );
    let (status, _, body) = get(new_port, "a", "/").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let history = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None)
        .await
        .1;
    assert_eq!(history["generations"][0]["generation"], 2);
    assert_eq!(history["generations"][0]["source"], "upgrade");
    assert_eq!(history["generations"][1]["generation"], 1);
    let code = tokio::task::spawn_blocking(move || {
        let code = gw.wait_exit(Duration::from_secs(7));
        (code, gw)
    })
    .await
    .unwrap();
    assert_eq!(code.0, Some(0));
    assert!(
        TcpStream::connect(old_web).await.is_err(),
        "the old listener closed with the old process"
    );
    // The new process logs in JSON: the format switch took effect.
    let logs = code.1.logs();
    assert!(
        logs.lines()
            .any(|l| l.starts_with('{') && l.contains("cutover ready")),
        "no JSON log line from the new process:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_new_process_leaves_the_old_one_serving() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let backend = Backend::named("ok").await;
    let base = slow_backend_config(backend.addr, "5s");
    let gw = Gateway::start(&base);
    let web = gw.listener("web");
    // The new process will fail to bind a port someone else holds.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let candidate = format!(
        "{base}\n[[listeners]]\nname = \"taken\"\nbind = \"{}\"\n",
        held.local_addr().unwrap()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (stop, ok, bad) = (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&bad));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (status, _, body) = get(web, "a", "/").await;
                if status == 200 && body == "ok" {
                    ok.fetch_add(1, Ordering::Relaxed)
                } else {
                    bad.fetch_add(1, Ordering::Relaxed)
                };
            }
        })
    };
    let op = upgrade(&gw, Some(&candidate)).await;
    assert_eq!(op["outcome"], "failed", "{op}");
    assert!(
        op["error"]
            .as_str()
            .unwrap_or("")
            .contains("the new process"),
        "{op}"
    );
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(ok.load(Ordering::Relaxed) > 0);
    assert_eq!(bad.load(Ordering::Relaxed), 0);
    let status = gw.status().await;
    assert_eq!(status["pid"].as_u64(), Some(gw.pid() as u64));
    assert_eq!(status["phase"], "running");
    assert_eq!(gw.gateway_pids(), vec![gw.pid()]);
    // The lock is released: a normal activation works again.
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(base.replace("drain_timeout = \"5s\"", "drain_timeout = \"6s\"")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// A backend that switches to an echo protocol on `Upgrade: echo`.
async fn upgrading_backend() -> Backend {
    use std::sync::Arc;
    Backend::start(Arc::new(
        |mut req: hyper::Request<hyper::body::Incoming>| {
            Box::pin(async move {
                if req.headers().get("upgrade").is_none() {
                    return hyper::Response::new(full("plain"));
                }
                let on_upgrade = hyper::upgrade::on(&mut req);
                tokio::spawn(async move {
                    if let Ok(upgraded) = on_upgrade.await {
                        let mut io = hyper_util::rt::TokioIo::new(upgraded);
                        let (mut r, mut w) = tokio::io::split(&mut io);
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    }
                });
                let mut response = hyper::Response::new(full(""));
                *response.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
                response
                    .headers_mut()
                    .insert("upgrade", "echo".parse().unwrap());
                response
                    .headers_mut()
                    .insert("connection", "upgrade".parse().unwrap());
                response
            })
        },
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgraded_connections_are_tunnelled_and_survive_activations() {
    let backend = upgrading_backend().await;
    // A route that retries and hedges still tunnels upgrades: they take
    // the single-attempt path.
    let base = slow_backend_config(backend.addr, "5s")
        .replace(
            "upstream = \"app\"\n",
            "upstream = \"app\"\nretry = { attempts = 2 }\nhedge = { delay = \"50ms\" }\n",
        )
        .replace(
            "level = \"warn\"",
            "level = \"warn\"\nformat = \"json\"\naccess = true\naccess_file = \"access.log\"",
        );
    assert!(base.contains("hedge") && base.contains("access_file"));
    let gw = Gateway::start(&base);
    let web = gw.listener("web");
    let (mut stream, head) = switch_protocols(
        web,
        "GET /socket HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    assert!(
        ping(&mut stream, 1).await,
        "bytes flow through the tunnel\n{}",
        gw.logs()
    );
    // Activations do not cut it; its generation keeps counting it.
    for i in 0..20 {
        let (status, _) = admin_request(
            gw.admin,
            "POST",
            "/admin/runtime/activate",
            Some("application/toml"),
            Some(base.replace(
                "drain_timeout = \"5s\"",
                &format!("drain_timeout = \"{}s\"", 6 + i),
            )),
        )
        .await;
        assert_eq!(status, 200);
    }
    assert!(
        ping(&mut stream, 2).await,
        "the tunnel survived 20 activations"
    );
    let status = gw.status().await;
    assert_eq!(status["generations"][0]["generation"], 1, "{status}");
    assert_eq!(status["generations"][0]["open_connections"], 1, "{status}");
    assert_eq!(get(web, "a", "/").await.2, "plain");
    // The tunnel's access line is written when it closes, and covers it.
    let log = gw.path("access.log");
    let socket_lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|l| l["path"] == "/socket")
            .collect::<Vec<_>>()
    };
    // The plain request's line is out, so the writer has run since the
    // tunnel opened: none for the open tunnel yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("\"path\":\"/\"")
    {
        assert!(Instant::now() < deadline, "no line for the plain request");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(socket_lines().is_empty());
    drop(stream);
    let line = loop {
        if let Some(line) = socket_lines().pop() {
            break line;
        }
        assert!(Instant::now() < deadline, "no line for the closed tunnel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(line["status"], 101, "{line}");
    assert_eq!(line["flags"], serde_json::json!(["upgraded"]), "{line}");
    // Two pings each way ("ping 1\n", "ping 2\n").
    assert_eq!(
        (line["bytes_in"].as_u64(), line["bytes_out"].as_u64()),
        (Some(14), Some(14)),
        "{line}"
    );
    assert!(line["duration_ms"].as_f64().unwrap() > 1.0, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_pinned_age_ends_superseded_streaming_responses() {
    use http_body_util::BodyExt;
    let backend = ticking_backend(Duration::from_millis(50)).await;
    let base = slow_backend_config(backend.addr, "5s")
        .replace("[runtime]\n", "[runtime]\nmax_pinned_age = \"1s\"\n");
    let gw = Gateway::start(&base);
    let req = hyper::Request::builder()
        .uri("/stream")
        .header("host", "a")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let mut body = open(gw.listener("web"), req).await.into_body();
    // Not superseded: it flows past max_pinned_age.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        assert!(
            matches!(body.frame().await, Some(Ok(_))),
            "cut while its generation was active"
        );
    }
    let (status, _) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(base.replace("drain_timeout = \"5s\"", "drain_timeout = \"6s\"")),
    )
    .await;
    assert_eq!(status, 200);
    let superseded = Instant::now();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .unwrap()
        {
            Some(Ok(_)) => continue,
            other => break other,
        }
    };
    let after = superseded.elapsed();
    assert!(!matches!(ended, Some(Ok(_))));
    assert!(
        after > Duration::from_millis(800) && after < Duration::from_millis(2500),
        "ended {after:?} after the activation"
    );
}

/// A backend whose responses stream one chunk every `every`, forever.
async fn ticking_backend(every: Duration) -> Backend {
    use http_body_util::BodyExt;
    Backend::start(std::sync::Arc::new(move |_req| {
        Box::pin(async move {
            let (mut tx, body) =
                http_body_util::channel::Channel::<bytes::Bytes, std::io::Error>::new(4);
            tokio::spawn(async move {
                while tx
                    .send_data(bytes::Bytes::from_static(b"tick\n"))
                    .await
                    .is_ok()
                {
                    tokio::time::sleep(every).await;
                }
            });
            hyper::Response::new(body.boxed())
        })
    }))
    .await
}

/// Every admin request the old process accepts during a hand-over is
/// answered (issue 56 item 1): three clients ask for status in a loop, a
/// new connection each time (as `curl` and `ctl` do), across 10
/// upgrades; each request is answered 200 or its connection refused at
/// connect, none closed or reset after it was sent. A fourth keeps its
/// connection alive: the old process's last answer on it says
/// `Connection: close`, and it reconnects, never sending on a
/// connection the old process is about to close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_requests_across_ten_upgrades_are_answered_or_refused_at_connect() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Mutex};
    let backend = Backend::named("ok").await;
    let gw = Gateway::start(&slow_backend_config(backend.addr, "5s"));
    let admin = gw.admin;
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut clients: Vec<_> = (0..3)
        .map(|_| {
            let (stop, answered, refused, broken) = (
                Arc::clone(&stop),
                Arc::clone(&answered),
                Arc::clone(&refused),
                Arc::clone(&broken),
            );
            tokio::spawn(async move {
                let request = format!(
                    "GET /admin/runtime/status HTTP/1.1\r\nhost: {admin}\r\nconnection: close\r\n\r\n"
                );
                while !stop.load(Relaxed) {
                    let Ok(mut stream) = TcpStream::connect(admin).await else {
                        refused.fetch_add(1, Relaxed);
                        continue;
                    };
                    let sent = stream.write_all(request.as_bytes()).await;
                    let mut answer = Vec::new();
                    let read = tokio::time::timeout(
                        Duration::from_secs(10),
                        stream.read_to_end(&mut answer),
                    )
                    .await;
                    if answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"}") {
                        answered.fetch_add(1, Relaxed);
                    } else {
                        let head = String::from_utf8_lossy(&answer[..answer.len().min(80)]);
                        broken
                            .lock()
                            .unwrap()
                            .push(format!("sent {sent:?}, read {read:?}: {head:?}"));
                    }
                }
            })
        })
        .collect();
    let (reconnects, kept_alive) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    clients.push({
        let (stop, broken) = (Arc::clone(&stop), Arc::clone(&broken));
        let (reconnects, kept_alive) = (Arc::clone(&reconnects), Arc::clone(&kept_alive));
        tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let Ok(stream) = TcpStream::connect(admin).await else {
                    continue;
                };
                let Ok(mut sender) = crate::harness::h1_over(stream).await else {
                    continue;
                };
                reconnects.fetch_add(1, Relaxed);
                // Until an answer says close (the connection is then done).
                while !stop.load(Relaxed) && sender.ready().await.is_ok() {
                    let req = Request::get("/admin/runtime/status")
                        .header("host", admin.to_string())
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    match sender.send_request(req).await {
                        Ok(response) if response.status() == 200 => {
                            kept_alive.fetch_add(1, Relaxed);
                        }
                        Ok(response) => broken
                            .lock()
                            .unwrap()
                            .push(format!("keep-alive: {}", response.status())),
                        Err(error) => broken.lock().unwrap().push(format!("keep-alive: {error}")),
                    }
                }
            }
        })
    });
    for round in 0..10 {
        let before = answered.load(Relaxed);
        let op = upgrade(&gw, None).await;
        assert_eq!(op["outcome"], "succeeded", "upgrade {round}: {op}");
        // At least 20 answered per round, some across the hand-over.
        let deadline = Instant::now() + Duration::from_secs(10);
        while answered.load(Relaxed) < before + 20 {
            assert!(
                Instant::now() < deadline,
                "round {round}: the clients stalled"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    stop.store(true, Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let broken = broken.lock().unwrap().clone();
    let answered = answered.load(Relaxed);
    eprintln!(
        "10 upgrades: {answered} admin requests answered, {} refused at connect, {} broken; keep-alive: {} answered on {} connections",
        refused.load(Relaxed),
        broken.len(),
        kept_alive.load(Relaxed),
        reconnects.load(Relaxed),
    );
    assert!(answered >= 200, "{answered}");
    assert!(
        reconnects.load(Relaxed) >= 10,
        "the keep-alive client moved to each new process"
    );
    assert!(broken.is_empty(), "{} broken: {broken:?}", broken.len());
}

/// Connects to `at`, sends `request` (an upgrade) and reads the answer's
/// head, byte by byte so that nothing past it is taken: the stream, and
/// the head in lower case.
async fn switch_protocols(at: SocketAddr, request: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(at).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            stream.read(&mut byte).await.unwrap(),
            1,
            "closed during the answer's head"
        );
        head.push(byte[0]);
    }
    (stream, String::from_utf8_lossy(&head).to_ascii_lowercase())
}

/// A WebSocket client's frame: `payload` under `opcode`, masked.
pub(crate) fn ws_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let key = [0x5a, 0x17, 0xc3, 0x09];
    assert!(payload.len() < 126);
    let mut frame = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&key);
    frame.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
    frame
}

/// Reads one WebSocket frame (at most 125 bytes of payload): its opcode
/// and unmasked payload; `None` at the end of the stream.
pub(crate) async fn ws_read(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.ok()?;
    let len = usize::from(head[1] & 0x7f);
    assert!(len < 126, "long frame");
    let mut key = [0u8; 4];
    if head[1] & 0x80 != 0 {
        stream.read_exact(&mut key).await.ok()?;
    }
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.ok()?;
    for (b, k) in payload.iter_mut().zip(key.iter().cycle()) {
        *b ^= k;
    }
    Some((head[0] & 0x0f, payload))
}

/// A WebSocket backend (RFC 6455 framing, handshake unchecked): echoes
/// every frame, and answers a close with its own and a FIN.
pub(crate) async fn websocket_backend() -> Backend {
    use std::sync::Arc;
    Backend::start(Arc::new(
        |mut req: hyper::Request<hyper::body::Incoming>| {
            Box::pin(async move {
                let on_upgrade = hyper::upgrade::on(&mut req);
                tokio::spawn(async move {
                    let Ok(upgraded) = on_upgrade.await else {
                        return;
                    };
                    let mut io = hyper_util::rt::TokioIo::new(upgraded);
                    while let Some((opcode, payload)) = ws_read(&mut io).await {
                        let mut frame = vec![0x80 | opcode, payload.len() as u8];
                        frame.extend_from_slice(&payload);
                        if io.write_all(&frame).await.is_err() || opcode == 8 {
                            break;
                        }
                    }
                    let _ = io.shutdown().await;
                });
                let mut response = hyper::Response::new(full(""));
                *response.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
                for (name, value) in [("upgrade", "websocket"), ("connection", "upgrade")] {
                    response.headers_mut().insert(name, value.parse().unwrap());
                }
                response
            })
        },
    ))
    .await
}

/// Issue 69 item 1: a WebSocket is open work. An upgrade's drain keeps
/// it (every message echoed by the old process, which it was not: the
/// socket died a fraction of a second into the drain), and at the drain
/// deadline the gateway closes it as a server going away does: close
/// 1001 after the last echo, a FIN once the client answered, and an
/// access-log line saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_outlives_the_upgrade_until_the_drain_deadline_then_gets_1001() {
    let backend = websocket_backend().await;
    let base = slow_backend_config(backend.addr, "4s").replace(
        "level = \"warn\"",
        "level = \"warn\"\nformat = \"json\"\naccess = true\naccess_file = \"access.log\"",
    );
    assert!(base.contains("access_file"));
    let gw = Gateway::start(&base);
    let (mut ws, head) = switch_protocols(
        gw.listener("web"),
        "GET /chat HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    let op = upgrade(&gw, None).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    let drained_from = Instant::now();
    // Half the drain: every message comes back.
    let mut sent = 0;
    while drained_from.elapsed() < Duration::from_secs(2) {
        let message = format!("message {sent}");
        ws.write_all(&ws_frame(1, message.as_bytes()))
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), ws_read(&mut ws))
            .await
            .unwrap_or_else(|_| panic!("message {sent} not echoed\n{}", gw.logs()));
        assert_eq!(
            answer,
            Some((1, message.into_bytes())),
            "message {sent}, {:?} into the drain\n{}",
            drained_from.elapsed(),
            gw.logs()
        );
        sent += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sent >= 20, "{sent}");
    // The deadline: a close 1001, at a frame boundary.
    let close = tokio::time::timeout(Duration::from_secs(10), ws_read(&mut ws))
        .await
        .expect("no close at the drain deadline");
    let waited = drained_from.elapsed();
    assert_eq!(
        close,
        Some((8, 1001u16.to_be_bytes().to_vec())),
        "{}",
        gw.logs()
    );
    assert!(
        waited >= Duration::from_millis(3500),
        "closed {waited:?} into a 4 s drain"
    );
    ws.write_all(&ws_frame(8, &1001u16.to_be_bytes()))
        .await
        .unwrap();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), ws.read_to_end(&mut rest)).await;
    assert!(matches!(end, Ok(Ok(0))), "{end:?} {rest:?}");
    // Its access-log line, from the old process.
    let log = gw.path("access.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let found = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["path"] == "/chat");
        if let Some(line) = found {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "no access-log line for the socket"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(line["status"], 101, "{line}");
    assert_eq!(
        line["flags"],
        serde_json::json!(["upgraded", "drain_timeout"]),
        "{line}"
    );
    assert!(line["bytes_in"].as_u64().unwrap() > 0, "{line}");
}

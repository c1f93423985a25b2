//! HTTP/3 to backends (`protocol = "h3"` and `"auto"`), against a real
//! HTTP/3 server: Caddy (Debian's `caddy`, quic-go), which `.ci/run`
//! installs. Without it these tests say so and skip.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;
use crate::pki::*;

const CADDY: &str = "/usr/bin/caddy";

/// A Caddy serving HTTPS as `backend.test` on one port: `/echo` is passed
/// to an echo backend of the test's, anything else answers with the
/// protocol the request came over (`HTTP/3.0`, `HTTP/2.0`, `HTTP/1.1`).
struct Caddy {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Caddy {
    /// `h3`: whether Caddy serves HTTP/3 (on UDP, same port). `alt_svc`:
    /// an `Alt-Svc` of the test's own on every answer. `None` when Caddy
    /// is not installed.
    async fn start(ca: &Ca, echo: SocketAddr, h3: bool, alt_svc: Option<&str>) -> Option<Caddy> {
        if !Path::new(CADDY).exists() {
            eprintln!(
                "SKIPPED: {CADDY} is not installed (Debian package caddy; .ci/run installs it)"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = server_leaf(ca, &["backend.test"]);
        std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), key).unwrap();
        // Caddy wants a number, free on TCP and UDP.
        let port = closed_port().port();
        let protocols = if h3 { "h1 h2 h3" } else { "h1 h2" };
        let header = alt_svc
            .map(|v| format!("  header Alt-Svc `{v}`\n"))
            .unwrap_or_default();
        let d = dir.path().display();
        let caddyfile = format!(
            "{{\n  admin off\n  auto_https off\n  default_sni backend.test\n  servers {{\n    protocols {protocols}\n  }}\n}}\n\
             https://:{port} {{\n  tls {d}/cert.pem {d}/key.pem\n{header}  handle /echo* {{\n    reverse_proxy {echo}\n  }}\n  handle {{\n    respond \"{{http.request.proto}}\" 200\n  }}\n}}\n"
        );
        std::fs::write(dir.path().join("Caddyfile"), caddyfile).unwrap();
        let child = Command::new(CADDY)
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(dir.path().join("Caddyfile"))
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .env("HOME", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start caddy");
        let caddy = Caddy {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while tokio::net::TcpStream::connect(caddy.addr()).await.is_err() {
            assert!(Instant::now() < deadline, "caddy did not start on {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(caddy)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

/// A gateway routing `web` to Caddy through upstream `app` of
/// `protocol`, with the access log in JSON.
fn gateway(
    ca: &Ca,
    caddy: SocketAddr,
    protocol: &str,
    upstream_extra: &str,
    route_extra: &str,
) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    let config = Config::new()
        .log("format = \"json\"\naccess = true\naccess_file = \"access.log\"")
        .listener("web", "")
        .route(
            "all",
            &format!("listeners = [\"web\"]\nupstream = \"app\"\n{route_extra}"),
        )
        .upstream(
            "app",
            &[caddy],
            &format!(
                "protocol = \"{protocol}\"\ntls = {{ ca = \"ca.pem\", server_name = \"backend.test\" }}\n{upstream_extra}"
            ),
        )
        .build();
    Gateway::start_in(dir, &config)
}

async fn backends(gw: &Gateway) -> Vec<Value> {
    let (status, body) =
        admin_request(gw.admin, "GET", "/admin/runtime/backends", None, None).await;
    assert_eq!(status, 200, "{body}");
    body["upstreams"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "app"))
        .and_then(|app| app["backends"].as_array().cloned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h3_upstream_carries_requests_bodies_and_checks_over_quic_to_caddy() {
    let ca = ca("h3 upstream CA");
    let echo = echo_backend().await;
    let Some(caddy) = Caddy::start(&ca, echo.addr, true, None).await else {
        return;
    };
    let gw = gateway(
        &ca,
        caddy.addr(),
        "h3",
        "health = { path = \"/\", interval = \"1s\", healthy_after = 1 }",
        "",
    );
    let web = gw.listener("web");
    // Every answer came over HTTP/3, from the first.
    for _ in 0..5 {
        let (status, _, body) = get(web, "app.test", "/").await;
        assert_eq!((status, body.as_str()), (200, "HTTP/3.0"));
    }
    // A body each way, through Caddy to the echo backend.
    let payload = "x".repeat(300_000);
    let req = http::Request::builder()
        .method("POST")
        .uri("/echo/upload?q=1")
        .header("host", "app.test")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            payload.clone(),
        )))
        .unwrap();
    let (status, _, body) = send(web, req).await.unwrap();
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("POST /echo/upload?q=1\n"), "{body:.200}");
    assert!(body.contains("\nhost: app.test\n"), "{body:.600}");
    assert!(body.ends_with(&payload), "the body did not come back whole");
    // The access log says what the answer came over.
    let lines = access_lines(&gw.path("access.log"), 6).await;
    for line in &lines {
        assert_eq!(line["upstream_protocol"], "h3", "{line}");
    }
    // The check passes over HTTP/3 too; one connection per thread used.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = backends(&gw).await;
        let app = &view[0];
        if app["health"] == "healthy" {
            assert_eq!(app["protocol"], "h3");
            let connections = app["quic"]["connections"].as_u64().unwrap();
            assert!((1..=3).contains(&connections), "{app}");
            break;
        }
        assert!(Instant::now() < deadline, "never healthy: {app}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h3_upstream_loses_no_request_through_100_activations() {
    let ca = ca("h3 upstream CA");
    let echo = echo_backend().await;
    let Some(caddy) = Caddy::start(&ca, echo.addr, true, None).await else {
        return;
    };
    let gw = gateway(&ca, caddy.addr(), "h3", "", "");
    let web = gw.listener("web");
    assert_eq!(get(web, "app.test", "/").await.2, "HTTP/3.0");
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (ok, failed, stop) = (Arc::clone(&ok), Arc::clone(&failed), Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = http::Request::builder()
                    .uri("/")
                    .header("host", "app.test")
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                match send(web, req).await {
                    Ok((200, _, body)) if &body[..] == b"HTTP/3.0" => {
                        ok.fetch_add(1, Ordering::Relaxed)
                    }
                    other => {
                        eprintln!("failed: {other:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    let base = gw.active_generation().await;
    for i in 0..100 {
        let config = std::fs::read_to_string(&gw.config_path).unwrap();
        let changed = config.replace(
            "upstream = \"app\"\n",
            &format!(
                "upstream = \"app\"\nresponse_headers = {{ set = {{ \"x-round\" = \"{i}\" }} }}\n"
            ),
        );
        assert_eq!(activate_status(&gw, &changed).await, 200, "activation {i}");
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(gw.active_generation().await, base + 100);
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("100 activations: {ok} answered over HTTP/3, {failed} failed");
    assert_eq!(failed, 0);
    assert!(ok >= 100, "{ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_learns_alt_svc_then_takes_quic_and_falls_back_to_tcp() {
    let ca = ca("h3 upstream CA");
    let echo = echo_backend().await;
    // (a) Caddy offers HTTP/3 (its own Alt-Svc): TCP first, then QUIC.
    let Some(caddy) = Caddy::start(&ca, echo.addr, true, None).await else {
        return;
    };
    let gw = gateway(&ca, caddy.addr(), "auto", "", "");
    let web = gw.listener("web");
    let (status, _, first) = get(web, "app.test", "/").await;
    assert_eq!(
        (status, first.as_str()),
        (200, "HTTP/2.0"),
        "TCP (h2 by ALPN) before any offer"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut over_tcp = 1;
    loop {
        let (status, _, body) = get(web, "app.test", "/").await;
        assert_eq!(status, 200);
        if body == "HTTP/3.0" {
            break;
        }
        over_tcp += 1;
        assert!(
            Instant::now() < deadline,
            "never over QUIC after {over_tcp} requests"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("auto: {over_tcp} requests over TCP before QUIC");
    let view = backends(&gw).await;
    assert_eq!(view[0]["protocol"], "auto");
    assert_eq!(view[0]["quic"]["offered_port"], caddy.port);
    drop(gw);
    drop(caddy);

    // (b) An offer of HTTP/3 on a UDP port nothing listens on: every
    // request is answered, over TCP, and QUIC is marked broken.
    let dead = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let offer = format!("h3=\":{dead_port}\"; ma=3600");
    let Some(caddy) = Caddy::start(&ca, echo.addr, false, Some(&offer)).await else {
        return;
    };
    let gw = gateway(&ca, caddy.addr(), "auto", "connect_timeout = \"300ms\"", "");
    let web = gw.listener("web");
    let started = Instant::now();
    let mut answered = 0;
    let broken = loop {
        let (status, _, body) = get(web, "app.test", "/").await;
        assert_eq!((status, body.as_str()), (200, "HTTP/2.0"));
        answered += 1;
        let view = backends(&gw).await;
        if view[0]["quic"]["broken_for_ms"].as_u64().is_some() {
            break view[0]["quic"].clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "QUIC never marked broken: {}",
            view[0]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("auto fallback: {answered} answered over TCP; {broken}");
    assert_eq!(broken["offered_port"], dead_port);
    assert_eq!(broken["failures"], 1);
    assert!(broken["broken_for_ms"].as_u64().unwrap() > 200_000);
    for _ in 0..20 {
        assert_eq!(get(web, "app.test", "/").await.2, "HTTP/2.0");
    }
    let lines = access_lines(&gw.path("access.log"), answered + 20).await;
    assert!(lines
        .iter()
        .all(|l| l["upstream_protocol"] == "h2" && l["status"] == 200));
    assert!(
        gw.logs().contains("HTTP/3 to the backend failed"),
        "{}",
        gw.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h3_upstream_with_nothing_on_udp_answers_502_within_one_connect_timeout() {
    let dead = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    let ca = ca("h3 upstream CA");
    let gw = gateway(&ca, addr, "h3", "connect_timeout = \"300ms\"", "");
    let web = gw.listener("web");
    for _ in 0..3 {
        let started = Instant::now();
        let (status, _, _) = get(web, "app.test", "/").await;
        assert_eq!(status, 502);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    // Twenty at once: the requests waiting for one worker's connection
    // take the failure of the attempt they waited for, not one connect
    // timeout each (twenty in a row would be 6 s).
    let started = Instant::now();
    let all: Vec<_> = (0..20)
        .map(|_| tokio::spawn(async move { get(web, "app.test", "/").await.0 }))
        .collect();
    for one in all {
        assert_eq!(one.await.unwrap(), 502);
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let lines = access_lines(&gw.path("access.log"), 23).await;
    for line in lines {
        let flags = line["flags"].as_array().unwrap();
        assert!(flags.iter().any(|f| f == "connect_failure"), "{line}");
        assert_eq!(line["upstream_protocol"], Value::Null);
    }
}

//! Long-lived connections, drain, and drain-aware upgrades.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::*;

/// A TCP echo server on loopback.
async fn echo_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, task)
}

fn tcp_config(echo: SocketAddr, runtime: &str, timeout: &str) -> String {
    format!(
        r#"[admin]
bind = "127.0.0.1:0"

[log]
level = "warn"

[runtime]
{runtime}

[[listeners]]
name = "db"
bind = "127.0.0.1:0"
protocol = "tcp"
upstream = "echo"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "hello"
listeners = ["web"]
timeout = "{timeout}"
respond = {{ body = "hello" }}

[upstreams.echo]
backends = [{{ addr = "{echo}" }}]
"#
    )
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

async fn activate(gw: &Gateway, config: &str) -> u16 {
    admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(config.to_owned()),
    )
    .await
    .0
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
            activate(&gw, &tcp_config(echo, "", &format!("{}s", 2 + i % 2))).await,
            200
        );
    }
    let (rss_before, _) = gw.memory_kib();
    for i in 0..1000 {
        assert_eq!(
            activate(&gw, &tcp_config(echo, "", &format!("{}s", 2 + i % 2))).await,
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
    let growth = rss_after as f64 / rss_before as f64;
    eprintln!("200 TCP connections over 1000 activations: RSS {rss_before} KiB -> {rss_after} KiB ({growth:.3}x)");
    assert!(
        growth < 1.10,
        "resident memory grew from {rss_before} KiB to {rss_after} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_pinned_age_closes_superseded_connections() {
    let (echo, _task) = echo_server().await;
    let gw = Gateway::start(&tcp_config(echo, "max_pinned_age = \"2s\"", "1s"));
    let db = gw.listener("db");
    let mut old = TcpStream::connect(db).await.unwrap();
    assert!(ping(&mut old, 1).await);
    assert_eq!(
        activate(&gw, &tcp_config(echo, "max_pinned_age = \"2s\"", "2s")).await,
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

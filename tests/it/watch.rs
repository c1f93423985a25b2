//! `cutover run --watch` (DESIGN §15's file-watch trigger), and whether the
//! file still matches the active generation.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;

/// Replaces the file the way editors and ConfigMaps do: a new file
/// renamed over the old one.
fn replace(gw: &Gateway, text: &str) {
    let tmp = gw.path(".gateway.toml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, gw.path("gateway.toml")).unwrap();
}

/// The newest operation of `kind`, waited for (bounded).
async fn newest(gw: &Gateway, kind: &str, after: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, history) =
            admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
        let ops: Vec<Value> = history["operations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|op| op["kind"] == kind)
            .collect();
        if ops.len() > after {
            return ops[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {kind} operation after {after}: {history}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_is_activated_when_replaced_and_an_invalid_one_is_recorded() {
    let gw = Gateway::start_args(&answering("one"), &["--watch"]);
    let web = gw.listener("web");
    assert_eq!(gw.status().await["config_file_matches_active"], true);
    // An atomic rename: activated, recorded as the watch's.
    replace(&gw, &answering("two"));
    gw.wait_generation(2).await;
    assert_eq!(get(web, "x", "/").await.2, "two");
    let op = newest(&gw, "reload", 0).await;
    assert_eq!(op["requested_by"], "watch", "{op}");
    assert_eq!(op["outcome"], "succeeded", "{op}");
    assert_eq!(gw.status().await["config_file_matches_active"], true);
    // A burst of writes is one activation of the last.
    for body in ["three", "four", "five"] {
        replace(&gw, &answering(body));
    }
    gw.wait_generation(3).await;
    assert_eq!(get(web, "x", "/").await.2, "five");
    // An invalid write: recorded, refused, nothing changes.
    replace(&gw, &answering("six").replace("respond", "respnod"));
    let refused = newest(&gw, "reload", 2).await;
    assert_eq!(refused["outcome"], "rejected", "{refused}");
    assert_eq!(refused["requested_by"], "watch", "{refused}");
    assert_eq!(gw.active_generation().await, 3);
    assert_eq!(get(web, "x", "/").await.2, "five");
    assert_eq!(gw.status().await["config_file_matches_active"], false);
    // Touching something else in the folder changes nothing.
    std::fs::write(gw.path("notes.txt"), "unrelated").unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(gw.active_generation().await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_whether_the_file_matches_and_ctl_export_prints_the_active_configuration() {
    let gw = Gateway::start(&answering("one"));
    assert_eq!(gw.status().await["config_file_matches_active"], true);
    assert_eq!(activate_status(&gw, &answering("two")).await, 200);
    // Activated through the API: the file is behind now.
    assert_eq!(gw.status().await["config_file_matches_active"], false);
    let out = std::process::Command::new(BIN)
        .args(["ctl", "--admin", &gw.admin_url(), "export"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let exported = String::from_utf8(out.stdout).unwrap();
    assert_eq!(exported, answering("two"));
    // Written back by hand: they match again.
    std::fs::write(gw.path("gateway.toml"), &exported).unwrap();
    assert_eq!(gw.status().await["config_file_matches_active"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_back_keeps_the_file_on_what_runs_after_an_activation_and_a_rollback() {
    let with =
        |body: &str| answering(body).replace("[log]", "[runtime]\nwrite_back = true\n\n[log]");
    let gw = Gateway::start(&with("one"));
    let file = gw.path("gateway.toml");
    assert_eq!(activate_status(&gw, &with("two")).await, 200);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), with("two"));
    assert_eq!(
        std::fs::read_to_string(gw.path("gateway.toml.bak")).unwrap(),
        with("one")
    );
    assert_eq!(gw.status().await["config_file_matches_active"], true);
    // A pending activation is not written until it is final: a restart
    // in its window must not come up on it.
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate?confirm_within=1m",
        Some("application/toml"),
        Some(with("three")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), with("two"));
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/confirm",
        Some("application/json"),
        Some(r#"{"generation": 3}"#.to_owned()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), with("three"));
    // A rollback writes the configuration it brings back.
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/rollback",
        Some("application/json"),
        Some(r#"{"target_generation": 1}"#.to_owned()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), with("one"));
    assert_eq!(
        std::fs::read_to_string(gw.path("gateway.toml.bak")).unwrap(),
        with("three")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_without_the_token_on_the_metrics_listener_until_draining() {
    let (echo, _task) = echo_server().await;
    // A TCP connection kept open holds the drain (for up to 30 s).
    let text = answering("one").replace(
        "[log]",
        &format!("[metrics]\nbind = \"127.0.0.1:0\"\n\n[runtime]\ndrain_timeout = \"30s\"\n\n[[listeners]]\nname = \"db\"\nbind = \"127.0.0.1:0\"\nprotocol = \"tcp\"\nupstream = \"echo\"\n\n[upstreams.echo]\nbackends = [{{ addr = \"{echo}\" }}]\n\n[log]"),
    );
    let gw = Gateway::start(&text);
    let metrics = gw.metrics.expect("metrics");
    assert_eq!(probe(metrics).await, Some(200));
    let mut held = tokio::net::TcpStream::connect(gw.listener("db"))
        .await
        .unwrap();
    // Echoed through the gateway: accepted and counted, so it holds the
    // drain (a connection still in the kernel's backlog would not).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        held.write_all(b"ping").await.unwrap();
        let mut echoed = [0u8; 4];
        held.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"ping");
    }
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/lifecycle/drain",
        Some("application/json"),
        Some("{}".into()),
    )
    .await;
    assert!(status < 300, "{status} {body}");
    // Still up (the held connection keeps it draining), and not ready.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match probe(metrics).await {
            Some(503) => break,
            other => assert_eq!(other, Some(200), "the process went away instead"),
        }
        assert!(Instant::now() < deadline, "still ready while draining");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /ready`'s status, or `None` when nothing answers.
async fn probe(addr: std::net::SocketAddr) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

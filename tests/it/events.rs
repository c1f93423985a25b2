//! Change events against the real binary (DESIGN §23): the SSE stream in
//! order across an activation with a confirm window that runs out, resumed
//! with `Last-Event-ID`; webhooks to a real HTTP receiver, signed,
//! retried while it is down, and a receiver that never answers delaying
//! nothing; over HTTPS, only to a receiver the webhook's `ca` signed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::Request;
use serde_json::Value;

use crate::harness::*;

/// An SSE reader over one admin connection.
struct Stream {
    body: hyper::body::Incoming,
    text: String,
}

impl Stream {
    async fn open(admin: SocketAddr, token: &str, last_event_id: Option<&str>) -> Self {
        let tcp = tokio::net::TcpStream::connect(admin).await.expect("admin");
        let mut sender = h1_over::<_, Empty<Bytes>>(tcp).await.expect("handshake");
        let mut request = Request::get("/admin/events")
            .header("host", admin.to_string())
            .header("authorization", format!("Bearer {token}"));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = sender
            .send_request(request.body(Empty::new()).unwrap())
            .await
            .expect("answered");
        assert_eq!(response.status(), 200);
        Self {
            body: response.into_body(),
            text: String::new(),
        }
    }

    /// The next `n` events as `(id, event, data)`, within 20 s.
    async fn next(&mut self, n: usize) -> Vec<(String, String, Value)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut out = Vec::new();
        while out.len() < n {
            while let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                if !event.is_empty() {
                    out.push((
                        id,
                        event,
                        serde_json::from_str(&data).unwrap_or(Value::Null),
                    ));
                }
            }
            if out.len() >= n {
                break;
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .expect("events in time")
                .expect("the stream goes on")
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.text.push_str(&String::from_utf8_lossy(&data));
            }
        }
        out
    }
}

type Received = Arc<Mutex<Vec<(hyper::HeaderMap, Bytes)>>>;

/// The end of each test's configuration: one listener, one route that
/// answers "one".
const HELLO: &str = r#"[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "hello"
listeners = ["web"]
respond = { body = "one" }
"#;

/// Activates the running file with the route answering "two" instead
/// (`query` after the path), as the admin token's holder.
async fn activate_two(gw: &Gateway, token: &str, query: &str) -> (u16, Bytes) {
    let candidate = std::fs::read_to_string(&gw.config_path)
        .unwrap()
        .replace("body = \"one\"", "body = \"two\"");
    let req = Request::post(format!("/admin/runtime/activate{query}"))
        .header("host", gw.admin.to_string())
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/toml")
        .body(Full::new(Bytes::from(candidate)))
        .unwrap();
    let (status, _, body) = send(gw.admin, req).await.unwrap();
    (status, body)
}

/// A webhook receiver on `addr`: answers 204 to every POST and keeps it.
fn receive_on(listener: tokio::net::TcpListener, received: Received) {
    receive(listener, None, received);
}

/// As `receive_on`, over TLS with `acceptor`'s certificate: a POST is
/// kept only once a handshake succeeded.
fn receive(
    listener: tokio::net::TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    received: Received,
) {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let received = Arc::clone(&received);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let received = Arc::clone(&received);
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            received.lock().unwrap().push((parts.headers, body));
                            Ok::<_, hyper::Error>(
                                hyper::Response::builder()
                                    .status(204)
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                let http1 = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    None => {
                        let _ = http1
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    }
                    Some(acceptor) => {
                        if let Ok(tls) = acceptor.accept(stream).await {
                            let _ = http1
                                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                                .await;
                        }
                    }
                }
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_stream_in_order_and_reach_webhooks_signed_through_a_receiver_outage() {
    let dir = tempfile::tempdir().unwrap();
    let token = "events-reader-token-0123456789";
    let secret = "webhook-secret-0123456789abcdef";
    write_secrets(
        dir.path(),
        &[("admin.token", token), ("hook.secret", secret)],
    );
    // The receiver's port, not listened on yet: deliveries are refused
    // until it comes up.
    let receiver_port = closed_port();
    // A receiver that takes connections and never answers.
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hanging_addr = hanging.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    {
        let held = Arc::clone(&held);
        tokio::spawn(async move {
            while let Ok((stream, _)) = hanging.accept().await {
                held.lock().unwrap().push(stream);
            }
        });
    }
    let text = format!(
        r#"[admin]
bind = "127.0.0.1:0"
token_file = "admin.token"

[[admin.webhooks]]
name = "chatops"
url = "http://{receiver_port}/hooks/cutover"
events = ["activation", "pending", "auto_rolled_back"]
secret_file = "hook.secret"

[[admin.webhooks]]
name = "stuck"
url = "http://{hanging_addr}/never"
secret_file = "hook.secret"
timeout = "1s"

[metrics]
bind = "127.0.0.1:0"

{HELLO}"#
    );
    let gw = Gateway::start_in(dir, &text);
    let mut stream = Stream::open(gw.admin, token, None).await;

    let started = Instant::now();
    let (status, body) = activate_two(&gw, token, "?confirm_within=2s&reason=try+two").await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    // Neither the refused receiver nor the one that never answers is
    // waited for.
    assert!(
        took < Duration::from_millis(900),
        "the activation took {took:?}"
    );

    // The receiver comes up a second later; the deadline rolls the
    // generation back meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received: Received = Arc::default();
    receive_on(
        tokio::net::TcpListener::bind(receiver_port).await.unwrap(),
        Arc::clone(&received),
    );

    let seen = stream.next(3).await;
    let kinds: Vec<&str> = seen.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(
        kinds,
        ["activation", "pending", "auto_rolled_back"],
        "{seen:#?}"
    );
    assert_eq!(seen[0].2["operation"]["reason"], "try two");
    assert_eq!(seen[1].2["pending"]["generation"], 2);
    assert_eq!(seen[2].2["operation"]["kind"], "auto_rollback");
    assert_eq!(seen[2].2["generation"], 3);

    // Back with the first id: the two after it, the same ids.
    let mut resumed = Stream::open(gw.admin, token, Some(&seen[0].0)).await;
    let again = resumed.next(2).await;
    assert_eq!(
        again
            .iter()
            .map(|(id, _, _)| id.as_str())
            .collect::<Vec<_>>(),
        [seen[1].0.as_str(), seen[2].0.as_str()]
    );

    // The receiver gets all three, in order, each signed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.lock().unwrap().len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "deliveries: {got:#?}");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    for ((headers, body), (id, event, _)) in got.iter().zip(&seen) {
        assert_eq!(headers["x-cutover-event"], event.as_str());
        assert_eq!(headers["x-cutover-delivery"], id.as_str());
        assert_signed(&key, headers, body);
        let json: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(json["event"], event.as_str());
        assert_eq!(json["id"], id.as_str());
    }

    // What each webhook was sent.
    let (status, hooks) = admin_get(&gw, token, "/admin/webhooks").await;
    assert_eq!(status, 200);
    let hooks = hooks["webhooks"].as_array().unwrap().clone();
    let chatops = &hooks[0];
    assert_eq!(chatops["name"], "chatops");
    assert_eq!(chatops["delivered"], 3, "{chatops:#}");
    assert!(chatops["retries"].as_u64().unwrap() >= 1, "{chatops:#}");
    assert_eq!(chatops["failed"], 0, "{chatops:#}");
    let stuck = &hooks[1];
    assert_eq!(stuck["delivered"], 0, "{stuck:#}");
    assert!(
        stuck["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no answer within")),
        "{stuck:#}"
    );
    assert!(
        !held.lock().unwrap().is_empty(),
        "the hanging receiver was called"
    );
    let metrics = scrape(&gw).await;
    let delivered = sample(
        &metrics,
        "cutover_webhook_deliveries_total",
        &["webhook=\"chatops\"", "outcome=\"delivered\""],
    );
    assert_eq!(delivered, 3.0, "{metrics}");
}

async fn admin_get(gw: &Gateway, token: &str, path: &str) -> (u16, Value) {
    let req = Request::get(path)
        .header("host", gw.admin.to_string())
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = send(gw.admin, req).await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Webhooks over HTTPS verify their receiver: one whose `ca` signed the
/// receiver's certificate delivers (signed, as over HTTP); one naming
/// another CA never gets past the handshake, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_webhooks_reach_only_a_receiver_their_ca_signed() {
    let dir = tempfile::tempdir().unwrap();
    let token = "events-reader-token-0123456789";
    let secret = "webhook-secret-0123456789abcdef";
    write_secrets(
        dir.path(),
        &[("admin.token", token), ("hook.secret", secret)],
    );
    let ca = crate::pki::ca("receivers' ca");
    let other = crate::pki::ca("another ca");
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.path().join("other-ca.pem"), &other.pem).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let receiver = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    receive(
        listener,
        Some(crate::pki::backend_acceptor(
            &ca,
            "127.0.0.1",
            &[b"http/1.1"],
        )),
        Arc::clone(&received),
    );
    let text = format!(
        r#"[admin]
bind = "127.0.0.1:0"
token_file = "admin.token"

[[admin.webhooks]]
name = "trusted"
url = "https://{receiver}/hooks/cutover"
events = ["activation"]
secret_file = "hook.secret"
ca = "ca.pem"

[[admin.webhooks]]
name = "untrusted"
url = "https://{receiver}/hooks/cutover"
events = ["activation"]
secret_file = "hook.secret"
ca = "other-ca.pem"

{HELLO}"#
    );
    let gw = Gateway::start_in(dir, &text);
    let (status, body) = activate_two(&gw, token, "").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    // Both have tried once (the untrusted one keeps retrying).
    let deadline = Instant::now() + Duration::from_secs(15);
    let hooks = loop {
        let (status, hooks) = admin_get(&gw, token, "/admin/webhooks").await;
        assert_eq!(status, 200);
        let hooks = hooks["webhooks"].as_array().unwrap().clone();
        if hooks[0]["delivered"] == 1 && hooks[1]["last_error"].is_string() {
            break hooks;
        }
        assert!(Instant::now() < deadline, "{hooks:#?}\n{}", gw.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let untrusted = &hooks[1];
    assert_eq!(untrusted["name"], "untrusted");
    assert_eq!(untrusted["delivered"], 0, "{untrusted:#}");
    let error = untrusted["last_error"].as_str().unwrap();
    assert!(
        error.to_lowercase().contains("certificate") || error.contains("UnknownIssuer"),
        "{error}"
    );

    // Only the trusted delivery reached the receiver, signed.
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:#?}");
    let (headers, body) = &got[0];
    assert_eq!(headers["x-cutover-event"], "activation");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    assert_signed(&key, headers, body);
}

/// The delivery's `X-Cutover-Signature-256` is `sha256=` and the hex
/// HMAC-SHA256 of its body under `key`, checked as a receiver would.
fn assert_signed(key: &ring::hmac::Key, headers: &hyper::HeaderMap, body: &[u8]) {
    let signed = headers["x-cutover-signature-256"].to_str().unwrap();
    let hex = signed.strip_prefix("sha256=").expect("sha256=");
    let tag: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    ring::hmac::verify(key, body, &tag).expect("a valid signature");
}

//! HTTP/3 on `https` listeners, with an in-process client (quinn + h3)
//! and certificates made in the test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;

use crate::harness::*;
use crate::pki::*;

/// A gateway with an `https` listener `secure` serving HTTP/3 too, and a
/// plain `web` listener, both routing to `backend`.
fn config(dir: &std::path::Path, ca: &Ca, backend: SocketAddr, extra: &str) -> String {
    let (cert, key) = server_leaf(ca, &["localhost"]);
    std::fs::write(dir.join("site.pem"), cert).unwrap();
    std::fs::write(dir.join("site.key"), key).unwrap();
    Config::new()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener(
            "secure",
            r#"protocol = "https"
http3 = true
tls.certificates = [{ cert = "site.pem", key = "site.key" }]"#,
        )
        .listener("web", "")
        .route(
            "all",
            &format!("listeners = [\"secure\", \"web\"]\nupstream = \"app\"\n{extra}"),
        )
        .upstream("app", &[backend], "")
        .build()
}

/// An HTTP/3 client trusting `ca`.
pub(crate) fn client(ca: &Ca) -> quinn::Endpoint {
    client_with(ca, false)
}

/// An HTTP/3 client trusting `ca`; with `early_data`, it sends requests
/// in 0-RTT on resumed sessions.
fn client_with(ca: &Ca, early_data: bool) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.enable_early_data = early_data;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    endpoint
}

type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// One QUIC connection to `addr` as `localhost`: its request sender and
/// the server's certificate.
async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
) -> (Sender, CertificateDer<'static>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let connection = loop {
        // HTTP/3 starts beside the TCP listener: a first attempt may
        // come before the UDP socket is bound.
        match endpoint.connect(addr, "localhost").unwrap().await {
            Ok(connection) => break connection,
            Err(error) => {
                assert!(Instant::now() < deadline, "no HTTP/3 at {addr}: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let certificate = connection
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .map(|chain| chain[0].clone())
        .expect("a server certificate");
    let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(connection))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    (sender, certificate)
}

/// One request on `sender`: status, headers, body.
async fn exchange(
    sender: &mut Sender,
    method: &str,
    path: &str,
    body: Option<Bytes>,
) -> (u16, http::HeaderMap, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .body(())
        .unwrap();
    let mut stream = sender.send_request(req).await.unwrap();
    if let Some(body) = body {
        stream.send_data(body).await.unwrap();
    }
    stream.finish().await.unwrap();
    let response = stream.recv_response().await.unwrap();
    let mut out = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        out.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    (
        response.status().as_u16(),
        response.headers().clone(),
        String::from_utf8_lossy(&out).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_proxies_get_and_post_with_bodies_and_tcp_advertises_it() {
    let backend = echo_backend().await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), &ca, backend.addr, "");
    let gw = Gateway::start_in(dir, &text);
    let secure = gw.listener("secure");
    let endpoint = client(&ca);
    let (mut sender, _) = connect(&endpoint, secure).await;

    let listeners = gw.status().await["listeners"].clone();
    let by_name = |name: &str| {
        listeners
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name("secure")["http3"], "serving");
    assert!(by_name("web").get("http3").is_none());
    let (status, _, body) = exchange(&mut sender, "GET", "/hello?x=1", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("GET /hello?x=1\n"), "{body}");
    // No body reaches the backend (forwarded as none when the stream's
    // end came with the head, else as an empty chunked body).
    assert!(body.ends_with("\n\n"), "an empty body: {body}");
    // A body both ways, larger than one QUIC packet and one h3 frame.
    let payload: String = (0..20_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let (status, _, body) = exchange(
        &mut sender,
        "POST",
        "/upload",
        Some(Bytes::from(payload.clone())),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.starts_with("POST /upload\n"), "{body}");
    assert!(body.ends_with(&payload), "the body came back whole");

    // The TCP side of the same listener advertises HTTP/3 at its port; a
    // listener without HTTP/3 does not.
    let tls = connector(&ca, &[b"http/1.1"]);
    let tcp = tokio::net::TcpStream::connect(secure).await.unwrap();
    let stream = tls
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let mut send = crate::harness::h1_over(stream).await.unwrap();
    let response = send
        .send_request(
            hyper::Request::builder()
                .uri("/")
                .header("host", "localhost")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        response.headers()["alt-svc"],
        format!("h3=\":{}\"; ma=86400", secure.port()).as_str()
    );
    let (_, headers, _) = get(gw.listener("web"), "localhost", "/").await;
    assert!(headers.get("alt-svc").is_none());

    // The access log names the protocol.
    let lines = access_lines(&gw.path("access.log"), 4).await;
    let h3_lines: Vec<&Value> = lines.iter().filter(|l| l["protocol"] == "HTTP/3").collect();
    assert_eq!(h3_lines.len(), 2, "{lines:?}");
    assert_eq!(h3_lines[1]["bytes_in"], 20_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_quic_connection_carries_requests_of_two_generations() {
    let one = Backend::named("one").await;
    let two = Backend::named("two").await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), &ca, one.addr, "");
    let gw = Gateway::start_in(dir, &text);
    let endpoint = client(&ca);
    let (mut sender, _) = connect(&endpoint, gw.listener("secure")).await;
    let first = gw.active_generation().await;
    assert_eq!(exchange(&mut sender, "GET", "/", None).await.2, "one");
    let next = text.replace(&one.addr.to_string(), &two.addr.to_string());
    assert_eq!(activate_status(&gw, &next).await, 200);
    // The same connection: the new generation.
    assert_eq!(exchange(&mut sender, "GET", "/", None).await.2, "two");
    let lines = access_lines(&gw.path("access.log"), 2).await;
    assert_eq!(lines[0]["generation"], first);
    assert_eq!(lines[1]["generation"], first + 1);
    assert_eq!(lines[0]["protocol"], "HTTP/3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_seen_by_new_http3_handshakes_while_old_connections_work() {
    let backend = Backend::named("ok").await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), &ca, backend.addr, "");
    let gw = Gateway::start_in(dir, &text);
    let endpoint = client(&ca);
    let (mut old, before) = connect(&endpoint, gw.listener("secure")).await;
    let (cert, key) = server_leaf(&ca, &["localhost"]);
    std::fs::write(gw.path("site.pem.new"), &cert).unwrap();
    std::fs::write(gw.path("site.key.new"), key).unwrap();
    std::fs::rename(gw.path("site.key.new"), gw.path("site.key")).unwrap();
    std::fs::rename(gw.path("site.pem.new"), gw.path("site.pem")).unwrap();
    let (status, body) =
        admin_request(gw.admin, "POST", "/admin/runtime/reload-certs", None, None).await;
    assert_eq!(status, 200, "{body}");
    // A client without the old session to resume.
    let (_, after) = connect(&client(&ca), gw.listener("secure")).await;
    assert_ne!(before, after, "a new handshake gets the new certificate");
    assert_eq!(
        after.as_ref(),
        CertificateDer::from_pem_slice(cert.as_bytes())
            .unwrap()
            .as_ref()
    );
    assert_eq!(
        exchange(&mut old, "GET", "/", None).await.0,
        200,
        "the old connection works"
    );
}

/// Answers every request with `n` lines, one every `every`.
async fn slow_backend(n: usize, every: Duration) -> Backend {
    use http_body_util::BodyExt;
    Backend::start(Arc::new(move |_req| {
        Box::pin(async move {
            let (mut tx, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
            tokio::spawn(async move {
                for i in 0..n {
                    if tx
                        .send_data(Bytes::from(format!("line {i}\n")))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            });
            hyper::Response::new(body.boxed())
        })
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_downloads_complete_on_the_old_process_while_the_new_one_serves_new_connections() {
    // 40 lines 100 ms apart: the old process drains for about 4 s.
    let backend = slow_backend(40, Duration::from_millis(100)).await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), &ca, backend.addr, "")
        .replace(
            "[[listeners]]\nname = \"secure\"",
            "[runtime]\ndrain_timeout = \"20s\"\n\n[[listeners]]\nname = \"secure\"",
        )
        .replace("level = \"warn\"", "level = \"info\"");
    let mut gw = Gateway::start_in(dir, &text);
    let secure = gw.listener("secure");
    let old_pid = gw.pid();
    let endpoint = client(&ca);
    // 20 downloads over 4 connections, each under way before the upgrade.
    let mut senders = Vec::new();
    for _ in 0..4 {
        senders.push(connect(&endpoint, secure).await.0);
    }
    let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<()>(20);
    let mut downloads = Vec::new();
    for i in 0..20 {
        let mut sender = senders[i % 4].clone();
        let started = started_tx.clone();
        downloads.push(tokio::spawn(async move {
            let req = http::Request::builder()
                .uri("https://localhost/download")
                .body(())
                .unwrap();
            let mut stream = sender.send_request(req).await.map_err(|e| e.to_string())?;
            stream.finish().await.map_err(|e| e.to_string())?;
            let response = stream.recv_response().await.map_err(|e| e.to_string())?;
            let mut body = Vec::new();
            let mut first = true;
            while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
                body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
                if first {
                    first = false;
                    let _ = started.send(()).await;
                }
            }
            Ok::<_, String>((
                response.status().as_u16(),
                String::from_utf8_lossy(&body).into_owned(),
            ))
        }));
    }
    for _ in 0..20 {
        started_rx.recv().await.unwrap();
    }
    let op = crate::lifecycle::upgrade(&gw, None).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    // While the old process drains (it refuses new connections), a new
    // client is served by the new process on the handed-over UDP group:
    // no gap in HTTP/3. Packets of the old connections that the new
    // process reads are relayed to the old one, so the downloads go on.
    let (mut during, _) = connect(&client(&ca), secure).await;
    assert!(
        gw.wait_exit(Duration::ZERO).is_none(),
        "the old process still drains while the new connection is made"
    );
    let (status, _, body) = exchange(&mut during, "GET", "/during", None).await;
    assert_eq!(status, 200);
    assert_eq!(body.lines().count(), 40);
    let mut complete = 0;
    for download in downloads {
        let (status, body) = download.await.unwrap().expect("the download finished");
        assert_eq!(status, 200);
        assert_eq!(body.lines().count(), 40, "{body}");
        complete += 1;
    }
    assert_eq!(complete, 20);
    // The old process exits once its streams are done.
    assert!(
        gw.wait_exit(Duration::from_secs(20)).is_some(),
        "the old process exited"
    );
    let new_pid = gw.gateway_pids();
    assert_eq!(new_pid.len(), 1, "{new_pid:?}");
    assert_ne!(new_pid[0], old_pid);
    gw.adopted = new_pid.clone();
    let (mut sender, _) = connect(&client(&ca), secure).await;
    let (status, _, body) = exchange(&mut sender, "GET", "/after", None).await;
    assert_eq!(status, 200);
    assert_eq!(body.lines().count(), 40);
    let status = gw.status().await;
    assert_eq!(status["pid"], new_pid[0]);
    // The path was taken: the new process read packets of the old one's
    // connections and relayed them (each relay logs what crossed it when
    // the old process is gone).
    let relayed: u64 = gw
        .logs()
        .lines()
        .filter(|l| l.contains("QUIC relay to the previous process closed"))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| l["fields"]["relayed_to"].as_u64())
        .sum();
    assert!(relayed > 0, "no packet crossed a relay:\n{}", gw.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_serves_idempotent_requests_and_answers_others_425() {
    let backend = echo_backend().await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), &ca, backend.addr, "")
        .replace("http3 = true\n", "http3 = true\nhttp3_early_data = true\n");
    let gw = Gateway::start_in(dir, &text);
    let secure = gw.listener("secure");
    // A client that resumes sessions and sends early data on them.
    let endpoint = client_with(&ca, true);
    // The first connection gets a ticket.
    let (mut first, _) = connect(&endpoint, secure).await;
    assert_eq!(exchange(&mut first, "GET", "/", None).await.0, 200);
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Later connections send their requests in 0-RTT, before the
    // handshake completes. Whether the gateway reads them before it
    // completes is a race on loopback: a request read after it counts as
    // an ordinary one (the handshake vouches for it). Every early one
    // must be marked (idempotent) or refused with 425 (not idempotent).
    let mut early_seen = 0;
    let mut sender = None;
    for attempt in 0..40 {
        let connecting = endpoint.connect(secure, "localhost").unwrap();
        let (connection, accepted) = connecting
            .into_0rtt()
            .unwrap_or_else(|_| panic!("attempt {attempt}: no ticket with early data"));
        let (mut driver, this) = h3::client::new(h3_quinn::Connection::new(connection))
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        let (mut get, mut post) = (this.clone(), this.clone());
        let (got, posted) = tokio::join!(
            exchange(&mut get, "GET", "/early", None),
            exchange(&mut post, "POST", "/early", Some(Bytes::from_static(b"x"))),
        );
        assert!(accepted.await, "0-RTT accepted");
        assert_eq!(got.0, 200, "{}", got.2);
        match posted.0 {
            425 => early_seen += 1,
            200 => assert!(
                !posted.2.contains("early-data"),
                "a non-idempotent request served as early data: {}",
                posted.2
            ),
            other => panic!("POST in 0-RTT: {other}"),
        }
        if got.2.contains("early-data: 1") {
            early_seen += 1;
        }
        sender = Some(this);
        if early_seen >= 2 {
            break;
        }
    }
    assert!(
        early_seen > 0,
        "no request was read as early data in 40 attempts"
    );
    let mut sender = sender.unwrap();
    // After the handshake, the same request is served.
    let (status, _, body) =
        exchange(&mut sender, "POST", "/late", Some(Bytes::from_static(b"x"))).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("early-data"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_answers_are_compressed_as_the_client_accepts() {
    if !crate::compress::decoders() {
        return;
    }
    let text: Bytes = "{\"items\": [1, 2, 3], \"name\": \"compressible\"}\n"
        .repeat(200)
        .into();
    let served = text.clone();
    let backend = Backend::start(Arc::new(move |_req| {
        let body = served.clone();
        Box::pin(async move {
            let mut response = hyper::Response::new(full(body));
            response
                .headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            response
        })
    }))
    .await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text_config = config(dir.path(), &ca, backend.addr, "compress = {}");
    let gw = Gateway::start_in(dir, &text_config);
    let endpoint = client(&ca);
    let (mut sender, _) = connect(&endpoint, gw.listener("secure")).await;
    for encoding in ["zstd", "br", "gzip"] {
        let req = http::Request::builder()
            .uri("https://localhost/data")
            .header("accept-encoding", encoding)
            .body(())
            .unwrap();
        let mut stream = sender.send_request(req).await.unwrap();
        stream.finish().await.unwrap();
        let response = stream.recv_response().await.unwrap();
        assert_eq!(response.headers()["content-encoding"], encoding);
        assert!(response.headers().get("content-length").is_none());
        let mut body = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await.unwrap() {
            body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
        }
        assert!(
            body.len() < text.len() / 4,
            "{encoding}: {} bytes",
            body.len()
        );
        let decoded = crate::compress::decode(encoding, &body, true).unwrap();
        assert!(
            decoded == text,
            "HTTP/3 {encoding} decodes to the backend's bytes"
        );
    }
}

/// Each worker runs a QUIC endpoint of its own; the kernel steers every
/// packet to the endpoint its connection ID names, so a client whose
/// address changes mid-connection (a NAT rebinding) still reaches the
/// endpoint that knows its connection. (Spread by address alone, each of
/// these moves would find the right one of four endpoints one time in
/// four.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_address_changes_keeps_its_connection() {
    let backend = echo_backend().await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), &ca, backend.addr, "")
        .replace("[log]", "[runtime]\nworker_threads = 4\n\n[log]");
    let gw = Gateway::start_in(dir, &text);
    let secure = gw.listener("secure");
    let endpoint = client(&ca);
    let (mut sender, _) = connect(&endpoint, secure).await;
    assert_eq!(exchange(&mut sender, "GET", "/", None).await.0, 200);
    for step in 0..12 {
        endpoint
            .rebind(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .unwrap();
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            exchange(&mut sender, "GET", "/", None),
        )
        .await;
        assert_eq!(
            answer.map(|a| a.0).ok(),
            Some(200),
            "no answer after move {step}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_connections_held_open_spread_over_the_workers() {
    let backend = echo_backend().await;
    let ca = ca("h3 ca");
    let dir = tempfile::tempdir().unwrap();
    let text = config(dir.path(), &ca, backend.addr, "")
        .replace("[log]", "[runtime]\nworker_threads = 4\n\n[log]")
        + "\n[metrics]\nbind = \"127.0.0.1:0\"\n";
    let gw = Gateway::start_in(dir, &text);
    let secure = gw.listener("secure");
    // One client socket, as a load balancer's or a benchmark's: the
    // connections differ only by the IDs the client picks at random, so
    // without a Retry to a less loaded worker they land where those fall.
    let endpoint = client(&ca);
    let mut held = Vec::new();
    for _ in 0..16 {
        let (mut sender, _) = connect(&endpoint, secure).await;
        assert_eq!(exchange(&mut sender, "GET", "/", None).await.0, 200);
        held.push(sender);
    }
    let metrics = scrape(&gw).await;
    let workers: Vec<f64> = (0..4)
        .map(|w| {
            sample(
                &metrics,
                "cutover_worker_connections_total",
                &[&format!("worker=\"{w}\"")],
            )
        })
        .collect();
    let rebalanced = sample(
        &metrics,
        "cutover_connections_rebalanced_total",
        &["listener=\"secure\""],
    );
    eprintln!(
        "16 QUIC connections over four workers: {workers:?}, {rebalanced} sent on by a Retry"
    );
    assert_eq!(workers.iter().sum::<f64>(), 16.0);
    let most = workers.iter().copied().fold(0.0, f64::max);
    let least = workers.iter().copied().fold(f64::MAX, f64::min);
    assert!(
        most <= least + 2.0 + (most / 8.0).floor(),
        "unbalanced: {workers:?}"
    );
    drop(held);
}

//! TLS termination, certificate rotation and upstream TLS, with
//! certificates generated in the test (rcgen); no private key is committed.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::ExtendedKeyUsagePurpose;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::harness::*;
use crate::pki::*;

/// Writes a file the way an operator should: temporary file, then rename.
fn put(dir: &Path, name: &str, contents: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// An HTTPS listener on `s.pem` that asks for client certificates from
/// `clients.pem` and takes connections without one.
const MTLS_OPTIONAL: &str = r#"protocol = "https"
tls.certificates = [{ cert = "s.pem", key = "s.key" }]
tls.client_ca = "clients.pem"
tls.client_auth = "optional""#;

/// A server CA, a client CA, and a folder with `s.pem`/`s.key` (a leaf
/// for `default.test`) and `clients.pem`.
fn mtls_files() -> (Ca, Ca, tempfile::TempDir) {
    let ca = ca("test ca");
    let clients = self::ca("client ca");
    let dir = tempfile::tempdir().unwrap();
    let server = server_leaf(&ca, &["default.test"]);
    put(dir.path(), "s.pem", &server.0);
    put(dir.path(), "s.key", &server.1);
    put(dir.path(), "clients.pem", &clients.pem);
    (ca, clients, dir)
}

fn fingerprint(pem: &str) -> String {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    cutover::tls::fingerprint(&der)
}

fn https_config(extra_tls: &str, certificates: &str) -> String {
    Config::new()
        .metrics()
        .listener(
            "secure",
            &format!("protocol = \"https\"\ntls.certificates = [{certificates}]\n{extra_tls}"),
        )
        .route(
            "hello",
            "listeners = [\"secure\"]\nrespond = { body = \"secure hello\" }",
        )
        .build()
}

struct Client {
    roots: rustls::RootCertStore,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl Client {
    fn trusting(ca: &Ca) -> Client {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
            .unwrap();
        Client {
            roots,
            identity: None,
        }
    }

    fn with_identity(mut self, (cert, key): (String, String)) -> Client {
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        self.identity = Some((
            chain,
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        ));
        self
    }

    /// Handshakes with `addr`; `sni: None` sends no SNI (and verifies `default.test`).
    async fn connect(
        &self,
        addr: SocketAddr,
        sni: Option<&str>,
        alpn: &[&[u8]],
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(self.roots.clone());
        let mut config = match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config.enable_sni = sni.is_some();
        let name = ServerName::try_from(sni.unwrap_or("default.test").to_owned()).unwrap();
        let tcp = TcpStream::connect(addr).await?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }
}

fn peer_fingerprint(stream: &TlsStream<TcpStream>) -> String {
    let certs = stream.get_ref().1.peer_certificates().unwrap();
    cutover::tls::fingerprint(&certs[0])
}

async fn h1_get(
    stream: TlsStream<TcpStream>,
    host: &str,
) -> Result<
    (
        u16,
        String,
        hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    ),
    String,
> {
    let mut sender = crate::harness::h1_over(stream)
        .await
        .map_err(|e| e.to_string())?;
    let (status, body) = h1_again(&mut sender, host).await?;
    Ok((status, body, sender))
}

async fn h1_again(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: &str,
) -> Result<(u16, String), String> {
    h1_again_with(sender, host, &[]).await
}

/// `h1_again` with these extra headers.
async fn h1_again_with(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut req = Request::builder().uri("/").header("host", host);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(Bytes::new())).unwrap();
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_alpn_and_the_default_certificate() {
    let ca = ca("test ca");
    let dir = tempfile::tempdir().unwrap();
    let default = server_leaf(&ca, &["default.test", "a.test"]);
    let wildcard = server_leaf(&ca, &["*.b.test"]);
    put(dir.path(), "a.pem", &default.0);
    put(dir.path(), "a.key", &default.1);
    put(dir.path(), "b.pem", &wildcard.0);
    put(dir.path(), "b.key", &wildcard.1);
    let gw = Gateway::start_in(
        dir,
        &https_config(
            "",
            r#"{ cert = "a.pem", key = "a.key" }, { cert = "b.pem", key = "b.key" }"#,
        ),
    );
    let secure = gw.listener("secure");
    let client = Client::trusting(&ca);

    let b = client
        .connect(secure, Some("x.b.test"), &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(peer_fingerprint(&b), fingerprint(&wildcard.0));
    let a = client
        .connect(secure, Some("a.test"), &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(peer_fingerprint(&a), fingerprint(&default.0));
    let none = client.connect(secure, None, &[b"http/1.1"]).await.unwrap();
    assert_eq!(
        peer_fingerprint(&none),
        fingerprint(&default.0),
        "no SNI gets the default certificate"
    );

    // ALPN: HTTP/1.1 ...
    assert_eq!(a.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (status, body, _) = h1_get(a, "a.test").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "secure hello"));
    // ... and HTTP/2.
    let h2 = client
        .connect(secure, Some("a.test"), &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(h2))
            .await
            .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(
            Request::builder()
                .uri("https://a.test/")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "secure hello"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_client_certificates() {
    let ca = ca("test ca");
    let clients = self::ca("client ca");
    let dir = tempfile::tempdir().unwrap();
    let server = server_leaf(&ca, &["default.test"]);
    put(dir.path(), "s.pem", &server.0);
    put(dir.path(), "s.key", &server.1);
    put(dir.path(), "clients.pem", &clients.pem);
    let gw = Gateway::start_in(
        dir,
        &https_config(
            "tls.client_ca = \"clients.pem\"",
            r#"{ cert = "s.pem", key = "s.key" }"#,
        ),
    );
    let secure = gw.listener("secure");

    // Without a certificate: the handshake (or the first exchange, in TLS 1.3) fails.
    let anonymous = Client::trusting(&ca);
    let refused = match anonymous.connect(secure, None, &[b"http/1.1"]).await {
        Err(_) => true,
        Ok(stream) => h1_get(stream, "default.test").await.is_err(),
    };
    assert!(refused, "a client without a certificate was served");

    let authenticated = Client::trusting(&ca).with_identity(leaf(
        &clients,
        &["client.test"],
        ExtendedKeyUsagePurpose::ClientAuth,
    ));
    let stream = authenticated
        .connect(secure, None, &[b"http/1.1"])
        .await
        .unwrap();
    let (status, _, _) = h1_get(stream, "default.test").await.unwrap();
    assert_eq!(status, 200);

    // A certificate from another CA is refused too.
    let stranger = self::ca("stranger ca");
    let other = Client::trusting(&ca).with_identity(leaf(
        &stranger,
        &["client.test"],
        ExtendedKeyUsagePurpose::ClientAuth,
    ));
    let refused = match other.connect(secure, None, &[b"http/1.1"]).await {
        Err(_) => true,
        Ok(stream) => h1_get(stream, "default.test").await.is_err(),
    };
    assert!(refused);

    // Each handshake is counted by outcome, each connection once. In TLS
    // 1.3 the client's side of a refused handshake can end before the
    // gateway's task has counted the failure: scrape until it has (a
    // bounded wait), then check every figure.
    let metrics = gw.metrics.expect("metrics endpoint");
    let failed = r#"cutover_tls_handshakes_total{listener="secure",outcome="failed"} 2"#;
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let (_, _, text) = get(metrics, "x", "/metrics").await;
        if text.lines().any(|l| l == failed) || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series}:\n{text}"))
    };
    assert_eq!(
        value(r#"cutover_tls_handshakes_total{listener="secure",outcome="ok"} "#),
        1.0
    );
    assert_eq!(
        value(r#"cutover_tls_handshakes_total{listener="secure",outcome="failed"} "#),
        2.0
    );
    assert_eq!(
        value(r#"cutover_listener_connections_total{listener="secure"} "#),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_certs_rotates_without_touching_established_connections() {
    let ca = ca("test ca");
    let dir = tempfile::tempdir().unwrap();
    let a = server_leaf(&ca, &["default.test"]);
    put(dir.path(), "site.pem", &a.0);
    put(dir.path(), "site.key", &a.1);
    let gw = Gateway::start_in(
        dir,
        &https_config("", r#"{ cert = "site.pem", key = "site.key" }"#),
    );
    let secure = gw.listener("secure");
    let client = Client::trusting(&ca);

    let before = client.connect(secure, None, &[b"http/1.1"]).await.unwrap();
    assert_eq!(peer_fingerprint(&before), fingerprint(&a.0));
    let (status, _, mut established) = h1_get(before, "default.test").await.unwrap();
    assert_eq!(status, 200);

    let b = server_leaf(&ca, &["default.test"]);
    put(gw.dir.path(), "site.pem", &b.0);
    put(gw.dir.path(), "site.key", &b.1);
    let (status, body) = reload_certs(&gw).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "reloaded");
    assert_eq!(body["generation"], 1, "no generation is minted");
    let cert = &body["listeners"][0]["certificates"][0];
    assert_eq!(body["listeners"][0]["listener"], "secure");
    assert_eq!(cert["fingerprint"], fingerprint(&b.0));
    assert_eq!(cert["changed"], true);
    assert_eq!(cert["names"], serde_json::json!(["default.test"]));
    assert!(cert["not_after"].as_str().is_some_and(|t| t.ends_with('Z')));

    let after = client.connect(secure, None, &[b"http/1.1"]).await.unwrap();
    assert_eq!(
        peer_fingerprint(&after),
        fingerprint(&b.0),
        "new handshakes get B"
    );
    assert_eq!(
        h1_again(&mut established, "default.test").await.unwrap().0,
        200,
        "the connection made before the reload keeps working"
    );

    let (_, again) = reload_certs(&gw).await;
    assert_eq!(again["listeners"][0]["certificates"][0]["changed"], false);
    let history = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None)
        .await
        .1;
    assert_eq!(history["operations"][0]["kind"], "reload_certs");
    assert_eq!(gw.active_generation().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_material_is_refused_and_the_old_certificate_served() {
    let ca = ca("test ca");
    let dir = tempfile::tempdir().unwrap();
    let a = server_leaf(&ca, &["default.test"]);
    put(dir.path(), "site.pem", &a.0);
    put(dir.path(), "site.key", &a.1);
    let gw = Gateway::start_in(
        dir,
        &https_config("", r#"{ cert = "site.pem", key = "site.key" }"#),
    );
    let secure = gw.listener("secure");
    let client = Client::trusting(&ca);
    let other = server_leaf(&ca, &["default.test"]);

    type Breaks<'a> = Box<dyn Fn(&Path) + 'a>;
    let cases: [(&str, Breaks); 3] = [
        (
            "mismatched key",
            Box::new(|d: &Path| put(d, "site.key", &other.1)),
        ),
        (
            "truncated PEM",
            Box::new(|d: &Path| put(d, "site.pem", &a.0[..a.0.len() / 2])),
        ),
        (
            "missing file",
            Box::new(|d: &Path| std::fs::remove_file(d.join("site.pem")).unwrap()),
        ),
    ];
    for (what, break_it) in cases {
        break_it(gw.dir.path());
        let (status, body) = reload_certs(&gw).await;
        assert_eq!(status, 422, "{what}: {body}");
        assert_eq!(body["error"], "certificate_invalid", "{what}");
        assert_eq!(body["listener"], "secure");
        assert!(
            body["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("site.pem") || f.ends_with("site.key")),
            "{what}: {body}"
        );
        let stream = client.connect(secure, None, &[b"http/1.1"]).await.unwrap();
        assert_eq!(
            peer_fingerprint(&stream),
            fingerprint(&a.0),
            "{what}: the previous certificate is still served"
        );
        put(gw.dir.path(), "site.pem", &a.0);
        put(gw.dir.path(), "site.key", &a.1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_rotations_under_reconnecting_load() {
    let ca = ca("test ca");
    let dir = tempfile::tempdir().unwrap();
    let first = server_leaf(&ca, &["default.test"]);
    put(dir.path(), "site.pem", &first.0);
    put(dir.path(), "site.key", &first.1);
    let gw = Gateway::start_in(
        dir,
        &https_config("", r#"{ cert = "site.pem", key = "site.key" }"#),
    );
    let secure = gw.listener("secure");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut clients = Vec::new();
    for _ in 0..16 {
        let (stop, ok, failed) = (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failed));
        let client = Client::trusting(&ca);
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let result = match client.connect(secure, None, &[b"http/1.1"]).await {
                    Ok(stream) => h1_get(stream, "default.test").await.map(|r| r.0),
                    Err(e) => Err(format!("handshake: {e}")),
                };
                match result {
                    Ok(200) => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        eprintln!("failed: {other:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    for round in 0..50 {
        let next = server_leaf(&ca, &["default.test"]);
        put(gw.dir.path(), "site.pem", &next.0);
        put(gw.dir.path(), "site.key", &next.1);
        let (status, body) = reload_certs(&gw).await;
        assert_eq!(status, 200, "round {round}: {body}");
        assert_eq!(
            body["listeners"][0]["certificates"][0]["fingerprint"],
            fingerprint(&next.0)
        );
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("50 rotations: {ok} TLS requests, {failed} failed");
    assert!(ok > 100, "too little traffic: {ok}");
    assert_eq!(failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_file_behind_the_same_text_is_a_change() {
    let ca = ca("test ca");
    let dir = tempfile::tempdir().unwrap();
    let a = server_leaf(&ca, &["default.test"]);
    put(dir.path(), "site.pem", &a.0);
    put(dir.path(), "site.key", &a.1);
    let config = https_config("", r#"{ cert = "site.pem", key = "site.key" }"#);
    let gw = Gateway::start_in(dir, &config);
    let activate = |text: String| {
        admin_request(
            gw.admin,
            "POST",
            "/admin/runtime/activate",
            Some("application/toml"),
            Some(text),
        )
    };
    assert_eq!(activate(config.clone()).await.1["outcome"], "unchanged");
    let b = server_leaf(&ca, &["default.test"]);
    put(gw.dir.path(), "site.pem", &b.0);
    put(gw.dir.path(), "site.key", &b.1);
    let (status, body) = activate(config.clone()).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("activated")),
        "{body}"
    );
    // Activation loaded the certificate it references.
    let stream = Client::trusting(&ca)
        .connect(gw.listener("secure"), None, &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(peer_fingerprint(&stream), fingerprint(&b.0));
}

/// A TLS backend that answers with the protocol version it saw.
pub(crate) async fn tls_backend(ca: &Ca, name: &str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let acceptor = backend_acceptor(ca, name, &[b"h2", b"http/1.1"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(full(format!(
                            "tls {:?}",
                            req.version()
                        ))))
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_hints_from_an_https_backend_reach_the_client() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = ca("backend ca");
    let acceptor = backend_acceptor(&ca, "backend.test", &[b"http/1.1"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let _task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut head = [0u8; 4096];
                let _ = tls.read(&mut head).await;
                let _ = tls
                    .write_all(b"HTTP/1.1 103 Early Hints\r\nlink: </b.js>; rel=preload\r\n\r\n")
                    .await;
                let _ = tls.flush().await;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "backend-ca.pem", &ca.pem);
    let gw = Gateway::start_in(
        dir,
        &config(&format!(
            r#"[[routes]]
name = "https"
listeners = ["web"]
upstream = "https"

[upstreams.https]
protocol = "https"
tls = {{ ca = "backend-ca.pem", server_name = "backend.test" }}
backends = [{{ addr = "{backend}" }}]
"#
        )),
    );
    let answer = raw_exchange(
        gw.listener("web"),
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with(
            "HTTP/1.1 103 Early Hints\r\nlink: </b.js>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"
        ),
        "{answer}"
    );
    assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_https_h2_and_h2c() {
    let ca = ca("backend ca");
    let (tls_addr, _tls_task) = tls_backend(&ca, "backend.test").await;
    // h2c backend: plain TCP, HTTP/2 with prior knowledge.
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let h2c_addr = plain.local_addr().unwrap();
    let _h2c_task = tokio::spawn(async move {
        while let Ok((stream, _)) = plain.accept().await {
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(full(format!(
                            "plain {:?}",
                            req.version()
                        ))))
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "backend-ca.pem", &ca.pem);
    let tls = r#"tls = { ca = "backend-ca.pem", server_name = "backend.test" }"#;
    let gw = Gateway::start_in(
        dir,
        &config(&format!(
            r#"[[routes]]
name = "https"
listeners = ["web"]
path_prefix = "/https"
upstream = "https"

[[routes]]
name = "h2"
listeners = ["web"]
path_prefix = "/h2"
upstream = "h2"

[[routes]]
name = "h2c"
listeners = ["web"]
path_prefix = "/plain"
upstream = "h2c"

[upstreams.https]
protocol = "https"
{tls}
backends = [{{ addr = "{tls_addr}" }}]

[upstreams.h2]
protocol = "h2"
{tls}
backends = [{{ addr = "{tls_addr}" }}]

[upstreams.h2c]
protocol = "h2c"
backends = [{{ addr = "{h2c_addr}" }}]
"#
        ))
        .replace("[log]", "[metrics]\nbind = \"127.0.0.1:0\"\n\n[log]"),
    );
    let web = gw.listener("web");
    assert_eq!(get(web, "a", "/https").await.2, "tls HTTP/1.1");
    assert_eq!(get(web, "a", "/h2").await.2, "tls HTTP/2.0");
    assert_eq!(get(web, "a", "/plain").await.2, "plain HTTP/2.0");
    // Connections opened by hyper's client are timed too (TLS: the TCP
    // part): one for the TLS backend's identities, one for h2c.
    let metrics = gw.metrics.expect("metrics endpoint");
    let (_, _, text) = get(metrics, "x", "/metrics").await;
    for backend in [tls_addr, h2c_addr] {
        let count =
            format!("cutover_backend_connect_duration_seconds_count{{backend=\"{backend}\"}} ");
        let value: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(count.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {count}:\n{text}"));
        assert!(value >= 1.0, "{count}{value}");
    }

    // A backend whose certificate the configured CA did not sign: 502.
    let stranger = ca_for_test("stranger");
    let (bad_addr, _bad) = tls_backend(&stranger, "backend.test").await;
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(
            config(&format!(
                "[[routes]]\nname = \"https\"\nlisteners = [\"web\"]\nupstream = \"https\"\n\n[upstreams.https]\nprotocol = \"https\"\n{tls}\nbackends = [{{ addr = \"{bad_addr}\" }}]\n"
            ))
            .replace("[log]", "[metrics]\nbind = \"127.0.0.1:0\"\n\n[log]"),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(web, "a", "/").await.0, 502);
}

fn ca_for_test(name: &str) -> Ca {
    ca(name)
}

/// A TLS ClientHello whose server name extension carries `name`, as wrk
/// and many probes send an IP address there.
fn client_hello_with_sni(name: &str) -> Vec<u8> {
    let mut sni = vec![0u8]; // host_name
    sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sni.extend_from_slice(name.as_bytes());
    let mut list = (sni.len() as u16).to_be_bytes().to_vec();
    list.extend(sni);
    let mut extensions = vec![0, 0]; // server_name
    extensions.extend_from_slice(&(list.len() as u16).to_be_bytes());
    extensions.extend(list);
    let mut hello = vec![3, 3]; // TLS 1.2 legacy version
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // no session id
    hello.extend_from_slice(&[0, 4, 0x13, 0x01, 0xc0, 0x2f]); // two suites
    hello.extend_from_slice(&[1, 0]); // null compression
    hello.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    hello.extend(extensions);
    let mut handshake = vec![1]; // client_hello
    handshake.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    handshake.extend(hello);
    let mut record = vec![0x16, 3, 1];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_quirks_do_not_grow_the_log() {
    let ca = ca("test ca");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = server_leaf(&ca, &["a.test"]);
    put(dir.path(), "a.pem", &cert);
    put(dir.path(), "a.key", &key);
    let gw = Gateway::start_in(
        dir,
        &https_config("", r#"{ cert = "a.pem", key = "a.key" }"#),
    );
    let before = gw.logs().lines().count();
    for _ in 0..20 {
        let answer = raw_exchange(gw.listener("secure"), &client_hello_with_sni("127.0.0.1")).await;
        // rustls answers the incomplete hello with an alert, or closes.
        let _ = answer;
    }
    // The handshakes are over (each exchange waited for the close); the
    // log at the default level did not grow with them.
    let logs = gw.logs();
    assert!(!logs.contains("Illegal SNI"), "{logs}");
    assert_eq!(logs.lines().count(), before, "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_certificate_rotation_goes_through_reload_certs() {
    let ca = ca("test ca");
    let dir = tempfile::tempdir().unwrap();
    let a = server_leaf(&ca, &["default.test"]);
    put(dir.path(), "site.pem", &a.0);
    put(dir.path(), "site.key", &a.1);
    let gw = Gateway::start_args_in(
        dir,
        &https_config("", r#"{ cert = "site.pem", key = "site.key" }"#),
        &["--watch"],
    );
    let secure = gw.listener("secure");
    let client = Client::trusting(&ca);
    let b = server_leaf(&ca, &["default.test"]);
    // The key first, then the chain: one settled change either way.
    put(gw.dir.path(), "site.key", &b.1);
    put(gw.dir.path(), "site.pem", &b.0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let op = loop {
        let history = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None)
            .await
            .1;
        let op = history["operations"][0].clone();
        if op["kind"] == "reload_certs" && op["outcome"] == "succeeded" {
            break op;
        }
        assert!(std::time::Instant::now() < deadline, "{history}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(op["requested_by"], "watch", "{op}");
    // No generation minted; new handshakes get the new certificate.
    assert_eq!(gw.active_generation().await, 1);
    let after = client.connect(secure, None, &[b"http/1.1"]).await.unwrap();
    assert_eq!(peer_fingerprint(&after), fingerprint(&b.0));
}

/// Route filter templates (DESIGN §17) read the handshake: the server
/// name and the client certificate's subject and fingerprint; empty
/// without a certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_template_variables_name_the_server_name_and_the_client_certificate() {
    let echo = echo_backend().await;
    let (ca, clients, dir) = mtls_files();
    let text = Config::new()
        .listener(
            "secure",
            MTLS_OPTIONAL,
        )
        .route(
            "echo",
            r#"listeners = ["secure"]
upstream = "app"
request_headers = { set = { "x-sni" = "{tls.sni}", "x-subject" = "{tls.client.subject}", "x-fingerprint" = "{tls.client.fingerprint}", "x-scheme" = "{scheme}" } }"#,
        )
        .upstream("app", &[echo.addr], "")
        .build();
    let gw = Gateway::start_in(dir, &text);
    let secure = gw.listener("secure");
    let identity = leaf(
        &clients,
        &["client.test"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let expected = fingerprint(&identity.0);
    let stream = Client::trusting(&ca)
        .with_identity(identity)
        .connect(secure, Some("default.test"), &[b"http/1.1"])
        .await
        .unwrap();
    let (status, body, _) = h1_get(stream, "default.test").await.unwrap();
    assert_eq!(status, 200, "{body}");
    for line in [
        "x-sni: default.test".to_owned(),
        "x-subject: CN=client.test".to_owned(),
        format!("x-fingerprint: {expected}"),
        "x-scheme: https".to_owned(),
    ] {
        assert!(body.lines().any(|l| l == line), "{line} in\n{body}");
    }
    let stream = Client::trusting(&ca)
        .connect(secure, Some("default.test"), &[b"http/1.1"])
        .await
        .unwrap();
    let (status, body, _) = h1_get(stream, "default.test").await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.lines().any(|l| l == "x-sni: default.test"), "{body}");
    assert!(body.lines().any(|l| l == "x-subject: "), "{body}");
}

/// One request with spoofed identity headers on a new connection.
async fn spoofing_get(stream: TlsStream<TcpStream>, host: &str) -> (u16, String) {
    let mut sender = crate::harness::h1_over(stream).await.unwrap();
    let spoofed = [
        ("x-client-cert-subject", "CN=admin"),
        ("x-client-cert-san", "DNS:admin.internal"),
        ("x-client-cert-fingerprint", "sha256:00"),
    ];
    h1_again_with(&mut sender, host, &spoofed).await.unwrap()
}

#[tokio::test]
async fn client_identity_headers_name_the_certificate_and_cannot_be_spoofed() {
    let echo = echo_backend().await;
    let (ca, clients, dir) = mtls_files();
    let text = Config::new()
        .listener(
            "secure",
            &format!("{MTLS_OPTIONAL}\ntls.client_identity_headers = true"),
        )
        .listener(
            "plain",
            r#"protocol = "https"
tls.certificates = [{ cert = "s.pem", key = "s.key" }]"#,
        )
        .route(
            "echo",
            "listeners = [\"secure\", \"plain\"]\nupstream = \"app\"",
        )
        .upstream("app", &[echo.addr], "")
        .build();
    let gw = Gateway::start_in(dir, &text);
    let identity = leaf(
        &clients,
        &["client.test"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let expected = fingerprint(&identity.0);
    let header = |body: &str, name: &str| -> Vec<String> {
        body.lines()
            .filter_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(str::to_owned)
            .collect()
    };
    // With a certificate: the gateway's values, the client's gone.
    let stream = Client::trusting(&ca)
        .with_identity(identity)
        .connect(gw.listener("secure"), Some("default.test"), &[b"http/1.1"])
        .await
        .unwrap();
    let (status, body) = spoofing_get(stream, "default.test").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&body, "x-client-cert-subject"),
        ["CN=client.test"],
        "{body}"
    );
    assert_eq!(
        header(&body, "x-client-cert-san"),
        ["DNS:client.test"],
        "{body}"
    );
    assert_eq!(
        header(&body, "x-client-cert-fingerprint"),
        [expected],
        "{body}"
    );
    // Without one, and on a listener that sets none: nothing of the
    // client's reaches the backend.
    for listener in ["secure", "plain"] {
        let stream = Client::trusting(&ca)
            .connect(gw.listener(listener), Some("default.test"), &[b"http/1.1"])
            .await
            .unwrap();
        let (status, body) = spoofing_get(stream, "default.test").await;
        assert_eq!(status, 200, "{body}");
        assert!(!body.contains("x-client-cert-"), "{listener}: {body}");
    }
}

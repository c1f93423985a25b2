//! Automatic certificates (DESIGN §21) against a real ACME server:
//! Debian's `pebble`, with `pebble-challtestsrv` as its DNS (every name
//! is 127.0.0.1), both started per test on loopback. The package ships
//! no certificates, so each test makes the CA of pebble's own HTTPS API.
//! OCSP stapling is checked against `openssl ocsp` as the responder.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;

use crate::harness::*;
use crate::pki;

const PEBBLE: &str = "/usr/bin/pebble";
const CHALLTESTSRV: &str = "/usr/bin/pebble-challtestsrv";

fn free_port() -> u16 {
    closed_port().port()
}

/// pebble and its DNS; both killed when dropped.
struct Pebble {
    children: Vec<Child>,
    /// The CA of pebble's own API (for `ca_root`).
    pub api_ca: PathBuf,
    pub directory: String,
    management: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Pebble {
    /// `None` (with the reason) when pebble is not installed. Validation
    /// connects to 127.0.0.1 at `http_port` (http-01) and `tls_port`
    /// (tls-alpn-01); certificates live `validity` seconds.
    async fn start(http_port: u16, tls_port: u16, validity: u64) -> Option<Pebble> {
        Self::start_with(http_port, tls_port, validity, None).await
    }

    /// As `start`; with `eab`, accounts need an external account binding
    /// with this key id and base64url HMAC key.
    async fn start_with(
        http_port: u16,
        tls_port: u16,
        validity: u64,
        eab: Option<(&str, &str)>,
    ) -> Option<Pebble> {
        if !Path::new(PEBBLE).exists() || !Path::new(CHALLTESTSRV).exists() {
            eprintln!(
                "SKIPPED: {PEBBLE} is not installed (Debian package pebble; .ci/run installs it)"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ca = pki::ca("pebble API test CA");
        let (cert, key) = pki::server_leaf(&ca, &["localhost", "127.0.0.1"]);
        let api_ca = dir.path().join("api-ca.pem");
        std::fs::write(&api_ca, &ca.pem).unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), key).unwrap();
        let (listen, management, dns, dns_management) =
            (free_port(), free_port(), free_port(), free_port());
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{listen}"),
                "managementListenAddress": format!("127.0.0.1:{management}"),
                "certificate": dir.path().join("cert.pem"),
                "privateKey": dir.path().join("key.pem"),
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": eab.is_some(),
                "externalAccountMACKeys": eab.map(|(kid, key)| serde_json::json!({ kid: key })),
                "certificateValidityPeriod": validity,
            }
        });
        std::fs::write(dir.path().join("pebble.json"), config.to_string()).unwrap();
        let log = |name: &str| std::fs::File::create(dir.path().join(name)).unwrap();
        let dns_server = Command::new(CHALLTESTSRV)
            .args([
                "-defaultIPv4",
                "127.0.0.1",
                "-defaultIPv6",
                "",
                "-dns01",
                &format!("127.0.0.1:{dns}"),
                "-http01",
                "",
                "-https01",
                "",
                "-tlsalpn01",
                "",
                "-management",
                &format!("127.0.0.1:{dns_management}"),
            ])
            .stdout(log("challtestsrv.log"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start pebble-challtestsrv");
        let pebble = Command::new(PEBBLE)
            .arg("-config")
            .arg(dir.path().join("pebble.json"))
            .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(log("pebble.log"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start pebble");
        let logs = dir.path().to_owned();
        let mut out = Pebble {
            children: vec![dns_server, pebble],
            api_ca,
            directory: format!("https://127.0.0.1:{listen}/dir"),
            management,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        for port in [listen, management] {
            while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
                // Why, when it does not come up: exited (a port taken
                // meanwhile?) or slow, with what it said.
                let exited: Vec<_> = out
                    .children
                    .iter_mut()
                    .filter_map(|c| c.try_wait().ok().flatten())
                    .collect();
                let said = || {
                    ["pebble.log", "challtestsrv.log"]
                        .map(|f| std::fs::read_to_string(logs.join(f)).unwrap_or_default())
                        .join("\n---\n")
                };
                assert!(
                    exited.is_empty() && Instant::now() < deadline,
                    "pebble did not start on {port} (exited: {exited:?}):\n{}",
                    said()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Some(out)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("pebble.log")).unwrap_or_default()
    }

    /// The root pebble issues under (made at its start).
    fn root(&self) -> rustls::RootCertStore {
        let out = Command::new("curl")
            .args(["-sf", "--cacert"])
            .arg(&self.api_ca)
            .arg(format!("https://127.0.0.1:{}/roots/0", self.management))
            .output()
            .expect("curl");
        assert!(out.status.success(), "pebble's root: {out:?}");
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&out.stdout) {
            roots.add(cert.unwrap()).unwrap();
        }
        roots
    }

    /// Orders pebble has seen finalized (its log says so once per order).
    fn orders(&self) -> usize {
        self.log().matches("Issued certificate serial").count()
    }
}

/// A handshake with `addr` for `sni`, verified against `roots`: the
/// leaf's fingerprint.
async fn handshake(
    addr: SocketAddr,
    sni: &str,
    roots: &rustls::RootCertStore,
) -> Result<String, String> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots.clone())
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let certs = stream
        .get_ref()
        .1
        .peer_certificates()
        .ok_or("no certificate")?;
    Ok(cutover::tls::fingerprint(&certs[0]))
}

/// Waits (bounded) until `addr` serves a certificate for `sni` that
/// `roots` verify.
async fn wait_issued(
    gw: &Gateway,
    addr: SocketAddr,
    sni: &str,
    roots: &rustls::RootCertStore,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match handshake(addr, sni, roots).await {
            Ok(fingerprint) => return fingerprint,
            Err(error) => assert!(
                Instant::now() < deadline,
                "no certificate for {sni} within 60 s ({error}):\n{}",
                gw.logs()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The certificate operations of the operation log, newest first.
async fn certificate_operations(gw: &Gateway) -> Vec<Value> {
    let (status, history) =
        admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
    assert_eq!(status, 200);
    history["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["kind"] == "certificate")
        .cloned()
        .collect()
}

/// Waits (bounded) until the operation log holds `count` certificate
/// operations; returns them, newest first.
async fn wait_operations(gw: &Gateway, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let operations = certificate_operations(gw).await;
        if operations.len() >= count {
            return operations;
        }
        assert!(
            Instant::now() < deadline,
            "{count} certificate operations not recorded within 60 s:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Site {
    state: tempfile::TempDir,
    http_port: u16,
    tls_port: u16,
}

impl Site {
    fn new() -> Site {
        Site {
            state: tempfile::tempdir().unwrap(),
            http_port: free_port(),
            tls_port: free_port(),
        }
    }

    /// A gateway that orders `domains` from `pebble` by `challenge`.
    fn config(&self, pebble: &Pebble, challenge: &str, extra: &str) -> String {
        format!(
            r#"
[admin]
bind = "127.0.0.1:0"

[metrics]
bind = "127.0.0.1:0"

[runtime]
state_dir = "{state}"
file_roots = ["{roots}"]

[[listeners]]
name = "web"
bind = "127.0.0.1:{http}"

[[listeners]]
name = "secure"
bind = "127.0.0.1:{tls}"
protocol = "https"
tls.certificates = [ {{ acme = {{ domains = ["a.test", "www.a.test"], directory = "{directory}", ca_root = "{ca}", challenge = "{challenge}", email = "ops@a.test"{extra} }} }} ]

[[routes]]
name = "site"
listeners = ["web", "secure"]
respond = {{ body = "hello" }}
"#,
            state = self.state.path().display(),
            http = self.http_port,
            tls = self.tls_port,
            directory = pebble.directory,
            ca = pebble.api_ca.display(),
            roots = pebble._dir.path().display(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn_01_issues_and_a_restart_serves_the_stored_certificate_without_ordering() {
    let site = Site::new();
    let Some(pebble) = Pebble::start(site.http_port, site.tls_port, 3600).await else {
        return;
    };
    let config = site.config(&pebble, "tls-alpn-01", "");
    let gw = Gateway::start(&config);
    let secure = gw.listener("secure");
    let roots = pebble.root();
    let fingerprint = wait_issued(&gw, secure, "a.test", &roots).await;
    // Both names, one certificate; the request goes through.
    assert_eq!(
        handshake(secure, "www.a.test", &roots).await.unwrap(),
        fingerprint
    );
    assert_eq!(pebble.orders(), 1, "{}", pebble.log());
    // History: one certificate operation with domains, serial and expiry.
    let operations = wait_operations(&gw, 1).await;
    assert_eq!(operations.len(), 1, "{operations:#?}");
    let certificate = &operations[0]["certificate"];
    assert_eq!(certificate["event"], "issued");
    assert_eq!(
        certificate["domains"],
        serde_json::json!(["a.test", "www.a.test"])
    );
    assert!(certificate["serial"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert!(certificate["not_after"].as_str().is_some());
    assert_eq!(certificate["fingerprint"], fingerprint.as_str());
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(
            &metrics,
            "cutover_acme_orders_total",
            &["outcome=\"issued\""]
        ),
        1.0
    );
    let expiry = sample(
        &metrics,
        "cutover_certificate_expiry_seconds",
        &["name=\"a.test\""],
    );
    assert!((3000.0..=3600.0).contains(&expiry), "expiry {expiry}");
    // Keys are 0600: the account's and the certificate's.
    use std::os::unix::fs::PermissionsExt as _;
    let acme_dir = site.state.path().join("acme");
    let mut keys = Vec::new();
    for entry in walk(&acme_dir) {
        let name = entry.file_name().unwrap().to_string_lossy().into_owned();
        if name == "key.pem" || name.ends_with(".json") {
            let mode = std::fs::metadata(&entry).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", entry.display());
            keys.push(name);
        }
    }
    assert_eq!(keys.len(), 2, "account and certificate key: {keys:?}");

    // A restart serves the stored certificate from its first handshake
    // and orders nothing.
    drop(gw);
    let gw = Gateway::start(&config);
    let secure = gw.listener("secure");
    assert_eq!(
        handshake(secure, "a.test", &roots).await.unwrap(),
        fingerprint
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        pebble.orders(),
        1,
        "a restart ordered again:\n{}",
        pebble.log()
    );
    // History is durable: the one issuance, nothing since.
    assert_eq!(certificate_operations(&gw).await.len(), 1);
    let metrics = scrape(&gw).await;
    assert_eq!(sample(&metrics, "cutover_acme_orders_total", &[]), 0.0);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_01_is_answered_on_the_http_listener_before_routing() {
    let site = Site::new();
    let Some(pebble) = Pebble::start(site.http_port, site.tls_port, 3600).await else {
        return;
    };
    let gw = Gateway::start(&site.config(&pebble, "http-01", ""));
    let roots = pebble.root();
    wait_issued(&gw, gw.listener("secure"), "a.test", &roots).await;
    assert_eq!(pebble.orders(), 1);
    // A token no order waits for is the routes' business.
    let (status, _, body) = get(
        gw.listener("web"),
        "a.test",
        "/.well-known/acme-challenge/nothing",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "hello"));
    // The certificate is served first and recorded just after: wait for the
    // record rather than read the log at once (seen empty once on a busy run).
    let operations = wait_operations(&gw, 1).await;
    assert_eq!(operations[0]["certificate"]["event"], "issued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_requires_external_account_binding_gets_it() {
    const KEY: &str = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";
    let site = Site::new();
    let Some(pebble) =
        Pebble::start_with(site.http_port, site.tls_port, 3600, Some(("kid-1", KEY))).await
    else {
        return;
    };
    let key_file = pebble._dir.path().join("eab.key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    // Without the binding the CA refuses the account, and says why.
    let unbound = Gateway::start(&site.config(&pebble, "tls-alpn-01", ""));
    let refused = wait_operations(&unbound, 1).await[0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(refused.contains("making the account"), "{refused}");
    assert!(refused.contains("externalAccountRequired"), "{refused}");
    drop(unbound);
    let site = Site {
        state: tempfile::tempdir().unwrap(),
        ..site
    };
    let eab = format!(
        ", eab = {{ kid = \"kid-1\", hmac_key_file = \"{}\" }}",
        key_file.display()
    );
    let gw = Gateway::start(&site.config(&pebble, "tls-alpn-01", &eab));
    wait_issued(&gw, gw.listener("secure"), "a.test", &pebble.root()).await;
    assert_eq!(pebble.orders(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_under_load_fails_no_handshake_and_no_request() {
    let site = Site::new();
    // 30-second certificates: renewed a third of their lifetime before
    // expiry, every 20 s.
    let Some(pebble) = Pebble::start(site.http_port, site.tls_port, 30).await else {
        return;
    };
    let gw = Gateway::start(&site.config(&pebble, "tls-alpn-01", ""));
    let secure = gw.listener("secure");
    let roots = pebble.root();
    let first = wait_issued(&gw, secure, "a.test", &roots).await;
    // New handshakes and requests, four clients, until a second renewal.
    let failures = Arc::new(AtomicU64::new(0));
    let handshakes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (failures, handshakes, stop, seen, roots) = (
            Arc::clone(&failures),
            Arc::clone(&handshakes),
            Arc::clone(&stop),
            Arc::clone(&seen),
            roots.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match request_over_tls(secure, &roots).await {
                    Ok((fingerprint, 200)) => {
                        seen.lock().unwrap().insert(fingerprint);
                    }
                    other => {
                        eprintln!("failed: {other:?}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                handshakes.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "two renewals did not happen within 60 s:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let (failed, total) = (
        failures.load(Ordering::Relaxed),
        handshakes.load(Ordering::Relaxed),
    );
    eprintln!("{total} handshakes and requests across two renewals, {failed} failed");
    assert_eq!(failed, 0);
    assert!(total > 100, "too little load: {total}");
    assert!(seen.lock().unwrap().contains(&first));
    // Oldest first.
    let events: Vec<String> = certificate_operations(&gw)
        .await
        .iter()
        .rev()
        .map(|op| op["certificate"]["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(events[..3], ["issued", "renewed", "renewed"], "{events:?}");
    // No generation was made for it.
    assert_eq!(gw.active_generation().await, 1);
}

/// One request on a new TLS connection: the certificate's fingerprint
/// and the status.
async fn request_over_tls(
    addr: SocketAddr,
    roots: &rustls::RootCertStore,
) -> Result<(String, u16), String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots.clone())
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("a.test").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let fingerprint =
        cutover::tls::fingerprint(&stream.get_ref().1.peer_certificates().unwrap()[0]);
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: a.test\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status: {text}"))?;
    Ok((fingerprint, status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_that_fails_is_recorded_and_backed_off_not_stormed() {
    let site = Site::new();
    // Validation connects to a port nothing listens on.
    let Some(pebble) = Pebble::start(free_port(), free_port(), 3600).await else {
        return;
    };
    let gw = Gateway::start(&site.config(&pebble, "tls-alpn-01", ""));
    let failed = wait_operations(&gw, 1).await[0].clone();
    assert_eq!(failed["outcome"], "failed");
    assert_eq!(failed["certificate"]["event"], "failed");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("tls-alpn-01"), "{error}");
    // The next attempt waits 30 s: none in the next 10.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(certificate_operations(&gw).await.len(), 1);
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(
            &metrics,
            "cutover_acme_orders_total",
            &["outcome=\"rejected\""]
        ),
        1.0
    );
    // Handshakes for the name fail cleanly meanwhile (no certificate yet).
    let roots = pebble.root();
    assert!(handshake(gw.listener("secure"), "a.test", &roots)
        .await
        .is_err());
    let (status, _, _) = get(gw.listener("web"), "a.test", "/").await;
    assert_eq!(status, 200);
}

/// An HTTPS "CA" that answers every request with 10 MB of garbage.
async fn garbage_ca(ca: &pki::Ca) -> SocketAddr {
    use tokio::io::AsyncWriteExt as _;
    let acceptor = pki::backend_acceptor(ca, "127.0.0.1", &[b"http/1.1"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = vec![0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut tls, &mut head).await;
                let body = vec![b'x'; 10 << 20];
                let _ = tls
                    .write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes())
                    .await;
                let _ = tls.write_all(&body).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_answering_ten_megabytes_or_nothing_costs_one_failed_attempt() {
    let ca = pki::ca("garbage CA");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    let garbage = garbage_ca(&ca).await;
    let closed = refusing_addr();
    let config = format!(
        r#"
[admin]
bind = "127.0.0.1:0"

[metrics]
bind = "127.0.0.1:0"

[runtime]
state_dir = "state"

[[listeners]]
name = "secure"
bind = "127.0.0.1:0"
protocol = "https"
tls.certificates = [
  {{ acme = {{ domains = ["garbage.test"], directory = "https://127.0.0.1:{garbage}/dir", ca_root = "ca.pem" }} }},
  {{ acme = {{ domains = ["closed.test"], directory = "https://127.0.0.1:{closed}/dir", ca_root = "ca.pem" }} }},
]

[[routes]]
name = "site"
listeners = ["secure"]
respond = {{ body = "hello" }}
"#,
        garbage = garbage.port(),
        closed = closed.port(),
    );
    let gw = Gateway::start_in(dir, &config);
    let operations = wait_operations(&gw, 2).await;
    let errors: Vec<&str> = operations
        .iter()
        .map(|op| op["error"].as_str().unwrap())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("larger than 1048576 bytes")),
        "{errors:?}"
    );
    assert!(
        errors.iter().all(|e| e.contains("making the account")),
        "{errors:?}"
    );
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(
            &metrics,
            "cutover_acme_orders_total",
            &["outcome=\"unreachable\""]
        ),
        2.0
    );
    // The gateway serves on: admin answers, nothing else is tried yet.
    assert_eq!(gw.active_generation().await, 1);
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package openssl; .ci/run installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl s_client -status`: what the handshake's staple says.
fn s_client_status(addr: SocketAddr, dir: &Path) -> String {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            "ocsp.test",
            "-status",
            "-CAfile",
            "ca.pem",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ocsp_responses_are_stapled_refreshed_at_half_validity_and_never_stale() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!(
            "SKIPPED: openssl is not installed (Debian package openssl; .ci/run installs it)"
        );
        return;
    }
    // The responder's answer is made by `openssl ocsp` from the CA's
    // index (valid one minute) and served on loopback by the test.
    let requests = Arc::new(AtomicU64::new(0));
    let answer = Arc::new(std::sync::Mutex::new(bytes::Bytes::new()));
    let responder = {
        let (requests, answer) = (Arc::clone(&requests), Arc::clone(&answer));
        Backend::start(Arc::new(
            move |req: hyper::Request<hyper::body::Incoming>| {
                let (requests, answer) = (Arc::clone(&requests), Arc::clone(&answer));
                Box::pin(async move {
                    let post = req.method() == hyper::Method::POST
                        && req
                            .headers()
                            .get("content-type")
                            .is_some_and(|v| v == "application/ocsp-request");
                    if post {
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut response = hyper::Response::new(full(answer.lock().unwrap().clone()));
                    response
                        .headers_mut()
                        .insert("content-type", "application/ocsp-response".parse().unwrap());
                    response
                })
            },
        ))
        .await
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=OCSP test CA",
            "-days",
            "2",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ],
    );
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=ocsp.test",
        ],
    );
    std::fs::write(
        d.join("ext.cnf"),
        format!("subjectAltName=DNS:ocsp.test\nextendedKeyUsage=serverAuth\nauthorityInfoAccess=OCSP;URI:http://{}/\n", responder.addr),
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ],
    );
    let chain = std::fs::read_to_string(d.join("leaf.pem")).unwrap()
        + &std::fs::read_to_string(d.join("ca.pem")).unwrap();
    std::fs::write(d.join("chain.pem"), chain).unwrap();
    let serial = Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in", "leaf.pem"])
        .current_dir(d)
        .output()
        .unwrap();
    let serial = String::from_utf8_lossy(&serial.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_owned();
    std::fs::write(
        d.join("index.txt"),
        format!("V\t301231000000Z\t\t{serial}\tunknown\t/CN=ocsp.test\n"),
    )
    .unwrap();
    openssl(
        d,
        &[
            "ocsp",
            "-issuer",
            "ca.pem",
            "-cert",
            "leaf.pem",
            "-no_nonce",
            "-reqout",
            "req.der",
        ],
    );
    let make_answer = || {
        openssl(
            d,
            &[
                "ocsp",
                "-index",
                "index.txt",
                "-rsigner",
                "ca.pem",
                "-rkey",
                "ca.key",
                "-CA",
                "ca.pem",
                "-reqin",
                "req.der",
                "-respout",
                "resp.der",
                "-nmin",
                "1",
            ],
        );
        *answer.lock().unwrap() = bytes::Bytes::from(std::fs::read(d.join("resp.der")).unwrap());
    };
    make_answer();

    let gw = Gateway::start(
        &Config::new()
            .metrics()
            .listener(
                "secure",
                "protocol = \"https\"\ntls.certificates = [ { cert = \"CHAIN\", key = \"KEY\" } ]"
                    .replace("CHAIN", &d.join("chain.pem").display().to_string())
                    .replace("KEY", &d.join("leaf.key").display().to_string())
                    .as_str(),
            )
            .runtime(&format!("file_roots = [\"{}\"]", d.display()))
            .route(
                "site",
                "listeners = [\"secure\"]\nrespond = { body = \"hello\" }",
            )
            .build(),
    );
    let secure = gw.listener("secure");
    let stapled = |metrics: &str| sample(metrics, "cutover_ocsp_stapled", &["name=\"ocsp.test\""]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while stapled(&scrape(&gw).await) != 1.0 {
        assert!(
            Instant::now() < deadline,
            "nothing stapled within 20 s:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shown = s_client_status(secure, d);
    assert!(
        shown.contains("OCSP Response Status: successful"),
        "{shown}"
    );
    assert!(shown.contains("Cert Status: good"), "{shown}");
    let status = gw.status().await;
    let certificate = &status["certificates"][0];
    assert_eq!(certificate["source"], "files");
    assert_eq!(certificate["ocsp"]["stapled"], true);
    assert_eq!(certificate["ocsp"]["status"], "good");
    assert_eq!(
        certificate["ocsp"]["responder"],
        format!("http://{}/", responder.addr)
    );
    let age = sample(
        &scrape(&gw).await,
        "cutover_ocsp_staple_age_seconds",
        &["name=\"ocsp.test\""],
    );
    assert!((0.0..30.0).contains(&age), "age {age}");

    // Asked again at half its validity (30 s), and not before.
    assert_eq!(requests.load(Ordering::Relaxed), 1);
    make_answer();
    let deadline = Instant::now() + Duration::from_secs(45);
    while requests.load(Ordering::Relaxed) < 2 {
        assert!(
            Instant::now() < deadline,
            "not asked again within 45 s:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(requests.load(Ordering::Relaxed), 2);

    // The responder breaks (answers garbage): the staple serves until its
    // next update, then none is stapled.
    *answer.lock().unwrap() = bytes::Bytes::from_static(b"garbage");
    let deadline = Instant::now() + Duration::from_secs(75);
    while stapled(&scrape(&gw).await) != 0.0 {
        assert!(
            Instant::now() < deadline,
            "a stale staple is still served:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let shown = s_client_status(secure, d);
    assert!(shown.contains("OCSP response: no response sent"), "{shown}");
    let status = gw.status().await;
    assert_eq!(status["certificates"][0]["ocsp"]["stapled"], false);
    assert!(status["certificates"][0]["ocsp"]["error"]
        .as_str()
        .is_some());
    // Handshakes go on without it.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(d.join("ca.pem")).unwrap())
        .unwrap();
    handshake(secure, "ocsp.test", &roots).await.unwrap();
    drop(responder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_three_orders_once_and_every_instance_serves_it() {
    let Some(etcd) = crate::fleet::Etcd::start().await else {
        return;
    };
    // The CA validates at the first instance's port; whichever instance
    // orders, the answer must be given there.
    let tls_port = free_port();
    let Some(pebble) = Pebble::start(free_port(), tls_port, 3600).await else {
        return;
    };
    let prefix = format!("/cutover-test/acme-{}", std::process::id());
    let instance = |name: &str, port: u16| {
        format!(
            r#"
[admin]
bind = "127.0.0.1:0"

[runtime]
state_dir = "state"
file_roots = ["{roots}"]

[[listeners]]
name = "secure"
bind = "127.0.0.1:{port}"
protocol = "https"
tls.certificates = [ {{ acme = {{ domains = ["a.test", "www.a.test"], directory = "{directory}", ca_root = "{ca}" }} }} ]

[fleet]
endpoints = ["{etcd}"]
prefix = "{prefix}"
instance = "{name}"
lease_ttl = "3s"
"#,
            roots = pebble._dir.path().display(),
            directory = pebble.directory,
            ca = pebble.api_ca.display(),
            etcd = etcd.endpoint(),
        )
    };
    let gateways = [
        Gateway::start(&instance("one", tls_port)),
        Gateway::start(&instance("two", 0)),
        Gateway::start(&instance("three", 0)),
    ];
    let roots = pebble.root();
    let mut fingerprints = Vec::new();
    for gw in &gateways {
        fingerprints.push(wait_issued(gw, gw.listener("secure"), "a.test", &roots).await);
    }
    assert!(
        fingerprints.iter().all(|f| *f == fingerprints[0]),
        "{fingerprints:?}"
    );
    assert_eq!(pebble.orders(), 1, "{}", pebble.log());
    let mut events = Vec::new();
    for gw in &gateways {
        for op in certificate_operations(gw).await {
            events.push(op["certificate"]["event"].as_str().unwrap().to_owned());
        }
    }
    events.sort();
    assert_eq!(events, ["fleet", "fleet", "issued"]);
    // Nothing more is ordered afterwards.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pebble.orders(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_listeners_naming_one_entry_share_one_order() {
    let site = Site::new();
    let Some(pebble) = Pebble::start(site.http_port, site.tls_port, 3600).await else {
        return;
    };
    let config = site.config(&pebble, "tls-alpn-01", "").replace(
        "listeners = [\"web\", \"secure\"]",
        "listeners = [\"web\", \"secure\", \"other\"]",
    );
    let entry = config
        .lines()
        .find(|l| l.starts_with("tls.certificates"))
        .unwrap()
        .to_owned();
    let config = format!(
        "{config}\n[[listeners]]\nname = \"other\"\nbind = \"127.0.0.1:0\"\nprotocol = \"https\"\n{entry}\n"
    );
    let gw = Gateway::start(&config);
    let roots = pebble.root();
    let first = wait_issued(&gw, gw.listener("secure"), "a.test", &roots).await;
    let second = wait_issued(&gw, gw.listener("other"), "a.test", &roots).await;
    assert_eq!(first, second);
    assert_eq!(pebble.orders(), 1, "{}", pebble.log());
    assert_eq!(certificate_operations(&gw).await.len(), 1);
}

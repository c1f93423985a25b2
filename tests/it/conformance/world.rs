//! What the suite's cluster would hold, on loopback: the Secrets and
//! ConfigMaps the suite makes in code, an echo server for every pod a
//! Service selects (at its own loopback address, on the Service's target
//! ports, answering as the suite's `echo-basic` does), EndpointSlices
//! for them, and an address for every Gateway.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use serde_json::{json, Value};

/// Certificates and CAs the suite creates before any test
/// (`conformance/utils/suite/suite.go`).
pub struct Pki {
    /// `(namespace, name)` → (certificate chain PEM, key PEM).
    pub secrets: BTreeMap<(String, String), (String, String)>,
    /// `(namespace, name)` → `ca.crt` PEM.
    pub config_maps: BTreeMap<(String, String), String>,
}

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let pem = params.self_signed(&key).expect("self-signed").pem();
    Ca {
        issuer: Issuer::new(params, key),
        pem,
    }
}

fn params_for(names: &[&str]) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    for name in names {
        let san = if name.contains("://") {
            SanType::URI(name.to_string().try_into().expect("uri"))
        } else {
            SanType::DnsName(name.to_string().try_into().expect("dns name"))
        };
        params.subject_alt_names.push(san);
    }
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().copied().unwrap_or("client"),
    );
    params
}

fn signed(ca: &Ca, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let mut params = params_for(names);
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, &ca.issuer).expect("signed");
    (cert.pem(), key.serialize_pem())
}

fn self_signed(names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let cert = params_for(names).self_signed(&key).expect("self-signed");
    (cert.pem(), key.serialize_pem())
}

pub const INFRA: &str = "gateway-conformance-infra";
pub const APP: &str = "gateway-conformance-app-backend";
pub const WEB: &str = "gateway-conformance-web-backend";

impl Pki {
    pub fn new() -> Pki {
        let mut secrets = BTreeMap::new();
        let mut config_maps = BTreeMap::new();
        let mut secret = |ns: &str, name: &str, pair: (String, String)| {
            secrets.insert((ns.to_owned(), name.to_owned()), pair);
        };
        secret(WEB, "certificate", self_signed(&["*"]));
        secret(
            INFRA,
            "tls-validity-checks-certificate",
            self_signed(&["*", "*.org", "*.wildcard.org"]),
        );
        let web = ca("web-backend-cm");
        config_maps.insert((WEB.into(), "web-backend-cm".into()), web.pem.clone());
        let validity = ca("tls-validity-checks-ca-certificate");
        config_maps.insert(
            (INFRA.into(), "tls-validity-checks-ca-certificate".into()),
            validity.pem.clone(),
        );
        secret(
            INFRA,
            "tls-validity-checks-client-certificate",
            signed(&validity, &["client"], ExtendedKeyUsagePurpose::ClientAuth),
        );
        let per_port = ca("tls-validity-checks-per-port-ca-certificate");
        config_maps.insert(
            (
                INFRA.into(),
                "tls-validity-checks-per-port-ca-certificate".into(),
            ),
            per_port.pem.clone(),
        );
        secret(
            INFRA,
            "tls-validity-checks-per-port-client-certificate",
            signed(&per_port, &["client"], ExtendedKeyUsagePurpose::ClientAuth),
        );
        let checks = ca("tls-checks-ca-certificate");
        config_maps.insert(
            (INFRA.into(), "tls-checks-ca-certificate".into()),
            checks.pem.clone(),
        );
        secret(
            INFRA,
            "tls-checks-certificate",
            signed(
                &checks,
                &[
                    "abc.example.com",
                    "spiffe://abc.example.com/test-identity",
                    "other.example.com",
                ],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
        );
        secret(
            INFRA,
            "tls-checks-client-certificate",
            signed(&checks, &["client"], ExtendedKeyUsagePurpose::ClientAuth),
        );
        for ns in [INFRA, APP] {
            secret(
                ns,
                "tls-passthrough-checks-certificate",
                signed(
                    &checks,
                    &["abc.example.com"],
                    ExtendedKeyUsagePurpose::ServerAuth,
                ),
            );
        }
        secret(
            INFRA,
            "tls-terminate-checks-certificate",
            signed(
                &checks,
                &["tls.example.com"],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
        );
        let mismatch = ca("mismatch-ca-certificate");
        config_maps.insert(
            (INFRA.into(), "mismatch-ca-certificate".into()),
            mismatch.pem,
        );
        Pki {
            secrets,
            config_maps,
        }
    }

    /// The Secrets and ConfigMaps as resources.
    pub fn resources(&self) -> Vec<Value> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut out = Vec::new();
        for ((ns, name), (cert, key)) in &self.secrets {
            out.push(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": { "namespace": ns, "name": name },
                "type": "kubernetes.io/tls",
                "data": { "tls.crt": b64(cert), "tls.key": b64(key) },
            }));
        }
        for ((ns, name), ca) in &self.config_maps {
            out.push(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "namespace": ns, "name": name },
                "data": { "ca.crt": ca },
            }));
        }
        out
    }
}

/// What one echo server saw: for the mirror assertions.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    /// Milliseconds since the epoch.
    pub at: i64,
}

/// One pod's echo server on one target port.
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub ip: Ipv4Addr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

/// Every pod started so far, by `(namespace, deployment)`; each serves
/// whatever target ports the Services selecting it name.
#[derive(Default)]
pub struct Pods {
    by_deployment: Mutex<HashMap<(String, String), Arc<Pod>>>,
    ports: Mutex<HashMap<(Ipv4Addr, u16), tokio::task::JoinHandle<()>>>,
}

static NEXT_POD: AtomicU32 = AtomicU32::new(1);
/// Requests seen per `uuid` (the echo server's retry simulation).
static ATTEMPTS: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());
static NEXT_GATEWAY: AtomicU32 = AtomicU32::new(1);

fn address(prefix: u8, n: u32) -> Ipv4Addr {
    Ipv4Addr::new(127, prefix, (n >> 8) as u8, (n & 0xff) as u8)
}

/// A loopback address of its own for a Gateway (`127.1.x.y`).
pub fn gateway_address() -> Ipv4Addr {
    address(1, NEXT_GATEWAY.fetch_add(1, Ordering::Relaxed))
}

impl Pods {
    /// The pod of `deployment`, started if new.
    pub fn pod(&self, namespace: &str, deployment: &str) -> Arc<Pod> {
        let mut pods = self.by_deployment.lock().expect("pods");
        Arc::clone(
            pods.entry((namespace.to_owned(), deployment.to_owned()))
                .or_insert_with(|| {
                    let n = NEXT_POD.fetch_add(1, Ordering::Relaxed);
                    Arc::new(Pod {
                        // `weight.extractBackendName` drops the last two
                        // dash-separated parts, as of a ReplicaSet's pod.
                        name: format!("{deployment}-7d4b9c8f5-{n:05}"),
                        namespace: namespace.to_owned(),
                        ip: address(2, n),
                        seen: Arc::default(),
                    })
                }),
        )
    }

    /// Makes `pod` answer on `port` (TLS with `tls` when given).
    pub fn serve(
        &self,
        pod: &Arc<Pod>,
        port: u16,
        tls: Option<(String, String)>,
    ) -> Result<(), String> {
        let key = (pod.ip, port);
        // Held across the bind: two tests asking for one pod's port at
        // once get one server.
        let mut ports = self.ports.lock().expect("ports");
        if ports.contains_key(&key) {
            return Ok(());
        }
        let listener = std::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(pod.ip), port))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(|e| format!("{}:{port}: {e}", pod.ip))?;
        let acceptor = match tls {
            Some((cert, key)) => Some(acceptor(&cert, &key)?),
            None => None,
        };
        let pod = Arc::clone(pod);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let pod = Arc::clone(&pod);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let (_, session) = stream.get_ref();
                            let sni = session.server_name().unwrap_or_default().to_owned();
                            let alpn = session
                                .alpn_protocol()
                                .map(|p| String::from_utf8_lossy(p).into_owned())
                                .unwrap_or_default();
                            let peers: Vec<String> = session
                                .peer_certificates()
                                .unwrap_or_default()
                                .iter()
                                .map(|c| pem("CERTIFICATE", c.as_ref()))
                                .collect();
                            let tls = json!({ "version": "TLSv1.3", "serverName": sni,
                                              "negotiatedProtocol": alpn, "peerCertificates": peers });
                            serve_echo(TokioIo::new(stream), pod, port, Some(tls)).await;
                        }
                        None => serve_echo(TokioIo::new(stream), pod, port, None).await,
                    }
                });
            }
        });
        ports.insert(key, task);
        Ok(())
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        if let Ok(ports) = self.ports.lock() {
            for task in ports.values() {
                task.abort();
            }
        }
    }
}

fn pem(tag: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {tag}-----\n");
    for chunk in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {tag}-----\n"));
    out
}

fn acceptor(cert: &str, key: &str) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| e.to_string())?;
    // Clients may present a certificate (the echo reports it); none is
    // required.
    let verifier = Arc::new(AnyClientCertificate);
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_client_cert_verifier(verifier)
    .with_single_cert(chain, key)
    .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Takes any client certificate, and none.
#[derive(Debug)]
struct AnyClientCertificate;

impl rustls::server::danger::ClientCertVerifier for AnyClientCertificate {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn verify_client_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Go's canonical header key: `x-echo-set-header` → `X-Echo-Set-Header`.
pub fn canonical_header(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for c in name.chars() {
        out.push(if upper {
            c.to_ascii_uppercase()
        } else {
            c.to_ascii_lowercase()
        });
        upper = c == '-';
    }
    out
}

async fn serve_echo<I>(io: I, pod: Arc<Pod>, port: u16, tls: Option<Value>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let pod = Arc::clone(&pod);
        let tls = tls.clone();
        async move {
            let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v) in req.headers() {
                if k == hyper::header::HOST {
                    continue;
                }
                headers
                    .entry(canonical_header(k.as_str()))
                    .or_default()
                    .push(v.to_str().unwrap_or_default().to_owned());
            }
            let host = req
                .headers()
                .get(hyper::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
                .or_else(|| req.uri().authority().map(|a| a.to_string()))
                .unwrap_or_default();
            let path = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_else(|| "/".into());
            let proto = match req.version() {
                hyper::Version::HTTP_2 => "HTTP/2.0",
                hyper::Version::HTTP_10 => "HTTP/1.0",
                _ => "HTTP/1.1",
            };
            if let Ok(mut seen) = pod.seen.lock() {
                seen.push(Seen {
                    path: path.clone(),
                    at: super::interp::now_ms(),
                });
            }
            let set: Vec<(String, String)> = headers
                .get("X-Echo-Set-Header")
                .and_then(|v| v.first())
                .map(|v| {
                    v.split(',')
                        .filter_map(|pair| pair.split_once(':'))
                        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            let method = req.method().to_string();
            let _ = req.into_body().collect().await;
            // The echo server's test knobs: `delay`, and `uuid` with
            // `succeedAfter` (answer `responseCode`, or drop the
            // connection without one, until that many requests of that
            // uuid were seen).
            let query: Vec<(String, String)> = path
                .split_once('?')
                .map(|(_, q)| {
                    q.split('&')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            let knob = |name: &str| {
                query
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            if let Some(delay) = knob("delay").and_then(|d| humantime::parse_duration(&d).ok()) {
                tokio::time::sleep(delay).await;
            }
            if let (Some(id), Some(after)) = (
                knob("uuid"),
                knob("succeedAfter").and_then(|n| n.parse::<u32>().ok()),
            ) {
                let seen = {
                    let mut attempts = ATTEMPTS.lock().expect("attempts");
                    let n = attempts.entry(id).or_insert(0);
                    *n += 1;
                    *n
                };
                if seen <= after {
                    if let Some(delay) =
                        knob("delayRetry").and_then(|d| humantime::parse_duration(&d).ok())
                    {
                        tokio::time::sleep(delay).await;
                    }
                    return match knob("responseCode").and_then(|c| c.parse::<u16>().ok()) {
                        Some(code) => {
                            let mut response = hyper::Response::new(Full::new(Bytes::new()));
                            *response.status_mut() = hyper::StatusCode::from_u16(code)
                                .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
                            Ok(response)
                        }
                        None => Err(std::io::Error::other("dropped, as the test asked")),
                    };
                }
            }
            let mut body = json!({
                "path": path, "host": host, "method": method, "proto": proto,
                "headers": headers, "namespace": pod.namespace, "ingress": "", "service": "",
                "pod": pod.name, "httpPort": port.to_string(),
            });
            if let Some(tls) = tls {
                body["tls"] = tls;
            }
            let mut response = hyper::Response::new(Full::new(Bytes::from(body.to_string())));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            for (k, v) in set {
                if let (Ok(k), Ok(v)) = (
                    hyper::header::HeaderName::from_bytes(k.as_bytes()),
                    hyper::header::HeaderValue::from_str(&v),
                ) {
                    response.headers_mut().append(k, v);
                }
            }
            Ok::<_, std::io::Error>(response)
        }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(io, service)
        .await;
}

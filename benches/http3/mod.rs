//! (g) of the proxy bench: HTTP/3 GETs through cutover next to HTTPS over
//! TCP on the same listener, and through Caddy's HTTP/3 (quic-go, Debian's
//! `caddy`, `reverse_proxy` to the same nginx), on the same small answer.
//! The generators (quinn and h3; hyper over tokio-rustls) run in a
//! process of their own, one thread, closed loop: this bench binary
//! started again with `CUTOVER_BENCH_GENERATOR` set, so that the
//! proxies' CPU per request is counted apart from the client's.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// QUIC connections and concurrent streams on each.
pub const H3_CONNECTIONS: usize = 4;
pub const H3_STREAMS: usize = 16;

fn tls_config(cert: &Path, alpn: &[u8]) -> rustls::ClientConfig {
    let pem = std::fs::read(cert).expect("certificate");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&pem).expect("PEM"))
        .expect("root");
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .expect("TLS 1.3")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

/// Closed-loop HTTP/3 GETs for `seconds`: every request's latency, and
/// the failures.
pub async fn h3_load(target: SocketAddr, cert: &Path, seconds: u64) -> (Vec<Duration>, u64) {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls_config(cert, b"h3"))
        .expect("QUIC client");
    let mut endpoint =
        quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("endpoint");
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..H3_CONNECTIONS {
        let Ok(connecting) = endpoint.connect(target, "localhost") else {
            return (Vec::new(), 1);
        };
        let Ok(connection) = connecting.await else {
            return (Vec::new(), 1);
        };
        let Ok((mut driver, sender)) = h3::client::new(h3_quinn::Connection::new(connection)).await
        else {
            return (Vec::new(), 1);
        };
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        for _ in 0..H3_STREAMS {
            let mut sender = sender.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0u64;
                while Instant::now() < until {
                    let started = Instant::now();
                    match h3_get(&mut sender).await {
                        Ok(true) => latencies.push(started.elapsed()),
                        _ => errors += 1,
                    }
                }
                (latencies, errors)
            }));
        }
    }
    let gathered = super::common::gather(tasks).await;
    endpoint.close(0u32.into(), b"done");
    gathered
}

async fn h3_get(
    sender: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
) -> Result<bool, h3::error::StreamError> {
    let req = http::Request::get("https://localhost/")
        .body(())
        .expect("request");
    let mut stream = sender.send_request(req).await?;
    stream.finish().await?;
    let response = stream.recv_response().await?;
    while let Some(mut chunk) = stream.recv_data().await? {
        chunk.advance(chunk.remaining());
    }
    Ok(response.status().is_success())
}

/// Closed-loop HTTPS (HTTP/1.1 keep-alive over TLS 1.3) GETs on
/// `connections` connections for `seconds`.
pub async fn https_load(
    target: SocketAddr,
    cert: &Path,
    connections: usize,
    seconds: u64,
) -> (Vec<Duration>, u64) {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(cert, b"http/1.1")));
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let connector = connector.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let Ok(tcp) = tokio::net::TcpStream::connect(target).await else {
                return (latencies, 1);
            };
            let _ = tcp.set_nodelay(true);
            let Ok(tls) = connector
                .connect("localhost".try_into().expect("name"), tcp)
                .await
            else {
                return (latencies, 1);
            };
            let Ok((mut sender, conn)) =
                hyper::client::conn::http1::handshake(TokioIo::new(tls)).await
            else {
                return (latencies, 1);
            };
            tokio::spawn(conn);
            let mut errors = 0u64;
            while Instant::now() < until {
                let started = Instant::now();
                let req = hyper::Request::get("/")
                    .header("host", "localhost")
                    .body(Empty::<Bytes>::new())
                    .expect("request");
                let ok = match sender.send_request(req).await {
                    Ok(response) => {
                        let status = response.status();
                        response.into_body().collect().await.is_ok() && status.is_success()
                    }
                    Err(_) => false,
                };
                if ok {
                    latencies.push(started.elapsed());
                } else {
                    errors += 1;
                    break;
                }
            }
            (latencies, errors)
        }));
    }
    super::common::gather(tasks).await
}

/// The environment variable that makes this binary a generator:
/// `h3|https,TARGET,CERT,SECONDS`.
pub const GENERATOR_ENV: &str = "CUTOVER_BENCH_GENERATOR";

/// Runs as the generator `spec` names (see `GENERATOR_ENV`) and prints
/// `requests errors p50_us p99_us cpu_ms` on one line (`cpu_ms`: the
/// generator's own CPU time, to tell a client-bound run).
pub fn generator_main(spec: &str) {
    let fields: Vec<&str> = spec.split(',').collect();
    let [kind, target, cert, seconds] = fields[..] else {
        eprintln!("{GENERATOR_ENV}: want kind,target,cert,seconds; got {spec}");
        std::process::exit(2);
    };
    let target: SocketAddr = target.parse().expect("generator target");
    let seconds: u64 = seconds.parse().expect("generator seconds");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cert = Path::new(cert);
    let (mut all, errors) = runtime.block_on(async {
        match kind {
            "h3" => h3_load(target, cert, seconds).await,
            _ => https_load(target, cert, super::CONNECTIONS, seconds).await,
        }
    });
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0, |d| d.as_micros())
    };
    let cpu_ms = (super::common::cpu_seconds(std::process::id()) * 1000.0) as u64;
    println!(
        "{} {errors} {} {} {cpu_ms}",
        all.len(),
        pct(0.50),
        pct(0.99)
    );
}

/// One load from a generator process: requests, errors and the request
/// latencies' median and 99th percentile (ms).
pub struct Generated {
    pub requests: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The generator's CPU time over the run's length (1.0: one core
    /// busy all along).
    pub busy: f64,
}

/// Starts this binary as a generator of `kind` (`h3`, `https`) against
/// `target` for `seconds` and waits for what it measured.
pub fn generate(kind: &str, target: SocketAddr, cert: &Path, seconds: u64) -> Generated {
    let failed = Generated {
        requests: 0,
        errors: 1,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        busy: f64::NAN,
    };
    let Ok(exe) = std::env::current_exe() else {
        return failed;
    };
    let output = std::process::Command::new(exe)
        .env(
            GENERATOR_ENV,
            format!("{kind},{target},{},{seconds}", cert.display()),
        )
        .stderr(std::process::Stdio::inherit())
        .output();
    let Ok(output) = output else {
        return failed;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers: Vec<u64> = text
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers[..] {
        [requests, errors, p50, p99, cpu_ms] => Generated {
            requests,
            errors,
            p50_ms: p50 as f64 / 1000.0,
            p99_ms: p99 as f64 / 1000.0,
            busy: cpu_ms as f64 / 1000.0 / seconds as f64,
        },
        _ => failed,
    }
}

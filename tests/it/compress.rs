//! Response compression (DESIGN §17) through the real binary, every body
//! decoded by decoders that are not ours: Python's `zlib`, `brotli` and
//! `zstandard` (Debian's python3-brotli and python3-zstandard, which
//! `.ci/run` installs). What it shows: negotiation by q-values, the head
//! a compressed answer gets, the answers that pass as they are, events
//! that stream (each decodable before the backend sends the next), and a
//! client that stops reading holding the backend back instead of the
//! gateway's memory growing.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Notify;
use tokio_stream::StreamExt;

use crate::harness::*;

/// Decodes `data` as `encoding` with Python's decoders. `complete`: the
/// stream must be finished (its end marker, its checksum). `None` when
/// the decoders are absent (the test then says why it skips).
pub fn decode(encoding: &str, data: &[u8], complete: bool) -> Option<Vec<u8>> {
    const SCRIPT: &str = r#"
import sys, zlib
encoding, complete = sys.argv[1], sys.argv[2] == "1"
data = sys.stdin.buffer.read()
if encoding == "gzip":
    d = zlib.decompressobj(31)
    out = d.decompress(data)
    done = d.eof
elif encoding == "br":
    import brotli
    d = brotli.Decompressor()
    out = d.process(data)
    done = d.is_finished()
elif encoding == "zstd":
    import zstandard
    d = zstandard.ZstdDecompressor().decompressobj()
    out = d.decompress(data)
    done = d.eof
else:
    sys.exit("unknown encoding " + encoding)
if complete and not done:
    sys.exit(encoding + " stream is not finished")
sys.stdout.buffer.write(out)
"#;
    if !decoders() {
        return None;
    }
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", SCRIPT, encoding, if complete { "1" } else { "0" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().unwrap();
    let input = data.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{encoding} does not decode: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out.stdout)
}

/// Whether Debian's Python with its brotli and zstandard modules is here.
pub fn decoders() -> bool {
    let present = Command::new("/usr/bin/python3")
        .args(["-c", "import zlib, brotli, zstandard"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        eprintln!("skipped: the independent decoders are absent (Debian packages python3, python3-brotli, python3-zstandard; .ci/run installs them)");
    }
    present
}

/// 64 KiB of JSON, as an API answers it.
fn json() -> Bytes {
    let mut out = String::from("[");
    let mut i = 0;
    while out.len() < 64 * 1024 - 100 {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"id":{i},"name":"item {i}","tags":["red","green"],"price":{}.5}}"#,
            i * 3
        ));
        i += 1;
    }
    out.push(']');
    Bytes::from(out)
}

/// Text that does not compress (random letters).
fn noise(n: usize) -> Vec<u8> {
    (0..n).map(|_| fastrand::alphanumeric() as u8).collect()
}

struct Answers {
    backend: Backend,
    /// Released once per `/events` stream: the second event follows.
    next_event: Arc<Notify>,
    /// Bytes `/endless` has handed to its connection so far.
    produced: Arc<AtomicU64>,
}

fn answer(
    status: u16,
    headers: &[(&'static str, &str)],
    body: impl Into<Bytes>,
) -> hyper::Response<BackendBody> {
    let mut response = hyper::Response::new(full(body.into()));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    for (name, value) in headers {
        response.headers_mut().append(*name, value.parse().unwrap());
    }
    response
}

async fn backend() -> Answers {
    let next_event = Arc::new(Notify::new());
    let produced = Arc::new(AtomicU64::new(0));
    let (events, counted) = (Arc::clone(&next_event), Arc::clone(&produced));
    let backend = Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        let (events, counted) = (Arc::clone(&events), Arc::clone(&counted));
        Box::pin(async move {
            let text = ("content-type", "text/plain; charset=utf-8");
            let packed = {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
                std::io::Write::write_all(&mut gz, &json()).unwrap();
                gz.finish().unwrap()
            };
            match req.uri().path() {
                "/json" => answer(
                    200,
                    &[
                        ("content-type", "application/json"),
                        ("etag", "\"v1\""),
                        ("accept-ranges", "bytes"),
                        ("vary", "origin"),
                    ],
                    json(),
                ),
                "/small" => answer(200, &[text], "short"),
                "/png" => answer(200, &[("content-type", "image/png")], noise(4096)),
                "/untyped" => answer(200, &[], noise(4096)),
                // Says gzip, sends plain text: passed as it is (the
                // gateway neither decodes nor codes it again).
                "/lying" => answer(200, &[text, ("content-encoding", "gzip")], json()),
                "/range" => answer(
                    206,
                    &[text, ("content-range", "bytes 0-4095/9000")],
                    noise(4096),
                ),
                "/no-transform" => answer(
                    200,
                    &[text, ("cache-control", "public, no-transform")],
                    json(),
                ),
                // Compressed already, and labelled as text.
                "/packed" => answer(200, &[text], packed),
                "/events" => {
                    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
                    tokio::spawn(async move {
                        let _ = tx.send(Bytes::from_static(b"data: one\n\n")).await;
                        events.notified().await;
                        let _ = tx.send(Bytes::from_static(b"data: two\n\n")).await;
                    });
                    let body = StreamBody::new(
                        tokio_stream::wrappers::ReceiverStream::new(rx)
                            .map(|b| Ok::<_, std::io::Error>(Frame::data(b))),
                    );
                    let mut response = hyper::Response::new(body.boxed());
                    response
                        .headers_mut()
                        .insert("content-type", "text/event-stream".parse().unwrap());
                    response
                }
                "/endless" => {
                    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
                    tokio::spawn(async move {
                        // Bounded: 1 GiB, far more than the test reads.
                        // New noise each time: a repeated chunk would
                        // compress to nothing in zstd's and brotli's
                        // windows.
                        for _ in 0..16 * 1024 {
                            let chunk = Bytes::from(noise(64 * 1024));
                            if tx.send(chunk.clone()).await.is_err() {
                                break;
                            }
                            counted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        }
                    });
                    let body = StreamBody::new(
                        tokio_stream::wrappers::ReceiverStream::new(rx)
                            .map(|b| Ok::<_, std::io::Error>(Frame::data(b))),
                    );
                    let mut response = hyper::Response::new(body.boxed());
                    response
                        .headers_mut()
                        .insert("content-type", "text/plain".parse().unwrap());
                    response
                }
                _ => answer(404, &[text], "no such answer"),
            }
        })
    }))
    .await;
    Answers {
        backend,
        next_event,
        produced,
    }
}

fn compress_config(backend: SocketAddr, compress: &str) -> String {
    Config::new()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener("web", "")
        .route(
            "api",
            &format!("listeners = [\"web\"]\nupstream = \"app\"\ncompress = {compress}"),
        )
        .upstream("app", &[backend], "")
        .build()
}

/// GET `path` with `accept-encoding` (when given) on a new HTTP/1.1
/// connection: status, headers, body bytes.
async fn fetch(
    addr: SocketAddr,
    method: &str,
    path: &str,
    accept: Option<&str>,
) -> (u16, hyper::HeaderMap, Bytes) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "api.test");
    if let Some(accept) = accept {
        req = req.header("accept-encoding", accept);
    }
    send(addr, req.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("the gateway answers")
}

/// GET `path` accepting `encoding` on a new HTTP/1.1 connection; the
/// answer, which must be in that encoding, with its body left to stream.
async fn streamed(
    addr: SocketAddr,
    path: &str,
    encoding: &str,
) -> hyper::Response<hyper::body::Incoming> {
    let req = Request::builder()
        .uri(path)
        .header("host", "api.test")
        .header("accept-encoding", encoding)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = open(addr, req).await;
    assert_eq!(response.headers()["content-encoding"], encoding);
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_compressed_as_the_client_accepts_and_decode_with_other_decoders() {
    if !decoders() {
        return;
    }
    let answers = backend().await;
    let gw = Gateway::start(&compress_config(answers.backend.addr, "{}"));
    let web = gw.listener("web");
    let original = json();
    for (accept, want) in [
        ("zstd", "zstd"),
        ("br", "br"),
        ("gzip", "gzip"),
        // A browser's list: the route's order decides among equals.
        ("gzip, deflate, br, zstd", "zstd"),
        ("gzip;q=0.5, br;q=0.9, zstd;q=0.1", "br"),
        ("x-gzip, *;q=0", "gzip"),
        ("*", "zstd"),
    ] {
        let (status, headers, body) = fetch(web, "GET", "/json", Some(accept)).await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-encoding"], want, "{accept}");
        assert!(headers.get("content-length").is_none(), "{headers:?}");
        assert!(headers.get("accept-ranges").is_none(), "{headers:?}");
        assert_eq!(headers["etag"], "W/\"v1\"");
        let vary: Vec<_> = headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["origin", "accept-encoding"]);
        assert!(
            body.len() < original.len() / 4,
            "{want}: {} bytes",
            body.len()
        );
        let decoded = decode(want, &body, true).unwrap();
        assert!(decoded == original, "{want} decodes to the backend's bytes");
    }
    // Nothing acceptable: the backend's answer, which still says it
    // varies by Accept-Encoding (a cache must not serve it to all).
    for accept in [
        None,
        Some("identity"),
        Some("gzip;q=0, identity"),
        Some("deflate"),
    ] {
        let (status, headers, body) = fetch(web, "GET", "/json", accept).await;
        assert_eq!(status, 200);
        assert!(headers.get("content-encoding").is_none(), "{accept:?}");
        assert_eq!(
            headers["content-length"],
            original.len().to_string().as_str()
        );
        assert_eq!(headers["etag"], "\"v1\"");
        let vary: Vec<_> = headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["origin", "accept-encoding"]);
        assert!(body == original);
    }

    // HTTP/2 (cleartext, prior knowledge): the same bodies.
    let tcp = tokio::net::TcpStream::connect(web).await.unwrap();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    for encoding in ["zstd", "br", "gzip"] {
        let req = Request::builder()
            .uri(format!("http://api.test/json?{encoding}"))
            .header("accept-encoding", encoding)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = h2.send_request(req).await.unwrap();
        assert_eq!(response.headers()["content-encoding"], encoding);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(
            decode(encoding, &body, true).unwrap() == original,
            "HTTP/2 {encoding}"
        );
    }

    // The access log: the coding, the bytes before it and after it.
    let lines = access_lines(&gw.path("access.log"), 14).await;
    let zstd = &lines[0];
    assert_eq!(zstd["encoding"], "zstd");
    assert_eq!(zstd["bytes_uncompressed"], original.len());
    let sent = zstd["bytes_out"].as_u64().unwrap();
    assert!(sent > 0 && sent < original.len() as u64 / 4, "{zstd}");
    let plain = &lines[7];
    assert_eq!(plain["encoding"], serde_json::Value::Null, "{plain}");
    assert_eq!(plain["bytes_uncompressed"], serde_json::Value::Null);
    assert_eq!(plain["bytes_out"], original.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_ranged_no_transform_small_and_unlisted_answers_pass_as_they_are() {
    if !decoders() {
        return;
    }
    let answers = backend().await;
    let gw = Gateway::start(&compress_config(
        answers.backend.addr,
        r#"{ encodings = ["gzip"], min_bytes = 100, types = ["text/*", "application/json"] }"#,
    ));
    let web = gw.listener("web");
    for path in [
        "/small",
        "/png",
        "/untyped",
        "/lying",
        "/range",
        "/no-transform",
    ] {
        let (status, headers, body) = fetch(web, "GET", path, Some("gzip")).await;
        assert!(status == 200 || status == 206, "{path}: {status}");
        let coding = headers.get("content-encoding").map(|v| v.to_str().unwrap());
        let expected = (path == "/lying").then_some("gzip");
        assert_eq!(coding, expected, "{path}: untouched");
        assert!(
            headers.get("content-length").is_some(),
            "{path}: length kept"
        );
        if path == "/lying" {
            // The backend's bytes, exactly: never decoded, never coded
            // twice.
            assert!(body == json());
        }
    }
    // Only a listed, long enough answer says it varies.
    let (_, headers, _) = fetch(web, "GET", "/small", Some("gzip")).await;
    assert!(headers.get("vary").is_none());
    // The route lists gzip only.
    let (_, headers, _) = fetch(web, "GET", "/json", Some("zstd, br")).await;
    assert!(headers.get("content-encoding").is_none());

    // A body compressed already but labelled text is coded again: the
    // client decodes the gateway's coding and has the backend's bytes.
    let (_, headers, body) = fetch(web, "GET", "/packed", Some("gzip")).await;
    assert_eq!(headers["content-encoding"], "gzip");
    let once = decode("gzip", &body, true).unwrap();
    assert!(decode("gzip", &once, true).unwrap() == json());

    // HEAD says what GET would (no body to code).
    let (status, headers, body) = fetch(web, "HEAD", "/json", Some("gzip")).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-encoding"], "gzip");
    assert!(headers.get("content-length").is_none());
    assert!(body.is_empty());

    // Accept-Encoding abuse: 10 KiB of it, or 1 000 entries, is answered
    // (200), uncompressed when there are too many entries to read.
    let long = format!("{}, gzip", "a".repeat(10 * 1024));
    let (status, headers, body) = fetch(web, "GET", "/json", Some(&long)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-encoding"], "gzip");
    assert!(decode("gzip", &body, true).unwrap() == json());
    let many = vec!["x-custom;q=0.5"; 1000].join(", ") + ", gzip";
    let (status, headers, body) = fetch(web, "GET", "/json", Some(&many)).await;
    assert_eq!(status, 200);
    assert!(headers.get("content-encoding").is_none());
    assert!(body == json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_each_decodable_before_the_backend_sends_the_next() {
    if !decoders() {
        return;
    }
    let answers = backend().await;
    let gw = Gateway::start(&compress_config(
        answers.backend.addr,
        r#"{ types = ["text/event-stream"] }"#,
    ));
    let web = gw.listener("web");
    for encoding in ["zstd", "br", "gzip"] {
        let response = streamed(web, "/events", encoding).await;
        let mut body = response.into_body();
        let mut received = Vec::new();
        // The first event, whole, while the backend still holds the
        // second.
        let first = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let frame = body.frame().await.expect("more").expect("a frame");
                if let Some(data) = frame.data_ref() {
                    received.extend_from_slice(data);
                }
                let so_far = decode(encoding, &received, false).unwrap();
                if so_far == b"data: one\n\n" {
                    break;
                }
            }
        })
        .await;
        assert!(
            first.is_ok(),
            "{encoding}: the first event arrives before the second is sent"
        );
        answers.next_event.notify_one();
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame.unwrap().data_ref() {
                received.extend_from_slice(data);
            }
        }
        assert_eq!(
            decode(encoding, &received, true).unwrap(),
            b"data: one\n\ndata: two\n\n",
            "{encoding}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_holds_the_backend_back_not_the_gateways_memory() {
    let answers = backend().await;
    let gw = Gateway::start(&compress_config(answers.backend.addr, "{}"));
    let web = gw.listener("web");
    // Warmed up (one of each), so that what follows measures the stalled
    // streams only.
    for encoding in ["zstd", "br", "gzip"] {
        let (status, _, _) = fetch(web, "GET", "/json", Some(encoding)).await;
        assert_eq!(status, 200);
    }
    let (before, _) = gw.memory_kib();
    let mut responses = Vec::new();
    for encoding in ["zstd", "br", "gzip"] {
        let response = streamed(web, "/endless", encoding).await;
        // Read a little, then stop reading (the connection stays open).
        let mut body = response.into_body();
        let frame = body.frame().await.unwrap().unwrap();
        assert!(frame.data_ref().is_some_and(|d| !d.is_empty()));
        responses.push(body);
    }
    // The backend produces until the sockets' buffers and the gateway's
    // one frame per stream are full, then waits.
    let mut last = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = answers.produced.load(Ordering::Relaxed);
        if now == last && now > 0 {
            break;
        }
        last = now;
    }
    let produced = answers.produced.load(Ordering::Relaxed);
    let (after, _) = gw.memory_kib();
    eprintln!(
        "stalled: {} MiB produced, {} KiB more held",
        produced >> 20,
        after.saturating_sub(before)
    );
    assert!(
        produced < 64 << 20,
        "the backend was held back: {} MiB produced for three stalled clients",
        produced >> 20
    );
    // Three encoders with 4 MiB windows (zstd, brotli) are most of it:
    // 7-34 MiB more over repeated runs, however far each got (the
    // allocator reuses what the warm-up freed, or not). A gateway that
    // kept what the backend sends fails the assertion above first.
    assert!(
        after < before + 48 * 1024,
        "the gateway holds {after} KiB, {before} KiB before"
    );
    drop(responses);
}

//! The edge rules of DESIGN §13 and the abuse suite: exact bytes on raw
//! sockets against the real binary, and misbehaving backends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::*;

/// `web` with short client timeouts, `trusting` believing forwarding
/// headers from loopback, `patient` with minute-long timeouts (so that a
/// closed connection there was closed for what it did, not for idling),
/// all routing `public.example/public` to `app`.
fn edge_config(backend: SocketAddr, extra_upstream: &str) -> String {
    Config::new()
        .listener(
            "web",
            "header_read_timeout = \"400ms\"\nkeepalive_timeout = \"1500ms\"\nidle_timeout = \"800ms\"",
        )
        .listener(
            "trusting",
            "trusted_proxies = [\"127.0.0.0/8\"]\nencoded_slash = \"reject\"\nmerge_slashes = true",
        )
        .listener(
            "patient",
            "keepalive_timeout = \"60s\"\nidle_timeout = \"60s\"",
        )
        .route(
            "public",
            r#"listeners = ["web", "trusting", "patient"]
hosts = ["public.example"]
path_prefix = "/public"
upstream = "app"
timeout = "500ms""#,
        )
        .upstream("app", &[backend], extra_upstream)
        .build()
}

/// The status code of a raw HTTP/1.1 answer (0 when there is none).
fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// An echo backend that counts the requests it received.
async fn counting_echo() -> (Backend, Arc<AtomicUsize>) {
    let echo = Arc::new(echo_backend().await);
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    let backend = Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let target = echo.addr;
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut forward = Request::from_parts(parts, http_body_util::Full::new(body));
            *forward.uri_mut() = format!("http://{target}{}", forward.uri())
                .parse()
                .expect("uri");
            match send(target, forward).await {
                Ok((status, _, body)) => {
                    let mut response = hyper::Response::new(full(body));
                    *response.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
                    response
                }
                Err(e) => hyper::Response::new(full(e)),
            }
        })
    }))
    .await;
    (backend, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_authority_and_path_are_what_the_backend_receives() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let web = gw.listener("web");

    // Absolute-form wins over Host, and the backend gets it as Host.
    let answer = raw_exchange(
        web,
        b"GET http://public.example/public/x HTTP/1.1\r\nHost: internal.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.contains("GET /public/x\n"), "{answer}");
    assert!(answer.contains("host: public.example\n"), "{answer}");
    assert!(!answer.contains("internal.example"), "{answer}");
    // The other way round: routed by the target's authority, not Host.
    let answer = raw_exchange(
        web,
        b"GET http://internal.example/public HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 404, "{answer}");

    // Dot segments, plain or encoded, are resolved before routing.
    for target in [
        "/public/../admin/secret",
        "/public/%2e%2e/admin",
        "/public/%2E%2E/admin",
        "/public/./../admin",
    ] {
        let request =
            format!("GET {target} HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n");
        let answer = raw_exchange(web, request.as_bytes()).await;
        assert_eq!(status_of(&answer), 404, "{target}: {answer}");
    }
    // A raw backslash is a separator to some backends: refused.
    let answer = raw_exchange(
        web,
        b"GET /public\\..\\admin HTTP/1.1\r\nHost: public.example\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 400, "{answer}");
    // ... and the backend receives exactly the routed path.
    let answer = raw_exchange(
        web,
        b"GET /public/a/./b/../%7Euser/%2e/c%20d?q=%2e%2e HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(
        answer.contains("GET /public/a/~user/c%20d?q=%2e%2e\n"),
        "{answer}"
    );
    // Encoded slashes are kept on `web` and refused on `trusting`, which
    // also merges slashes.
    let answer = raw_exchange(
        web,
        b"GET /public/a%2fb HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.contains("GET /public/a%2Fb\n"), "{answer}");
    let trusting = gw.listener("trusting");
    let answer = raw_exchange(
        trusting,
        b"GET /public/a%2fb HTTP/1.1\r\nHost: public.example\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 400, "{answer}");
    let answer = raw_exchange(
        trusting,
        b"GET //public//a HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.contains("GET /public/a\n"), "{answer}");

    // Two Host lines, none, or a malformed one: 400, and the connection closes.
    for head in [
        "GET /public HTTP/1.1\r\nHost: public.example\r\nHost: internal.example\r\n\r\n",
        "GET /public HTTP/1.1\r\nHost: public.example\r\nHost: public.example\r\n\r\n",
        "GET /public HTTP/1.1\r\n\r\n",
        "GET /public HTTP/1.1\r\nHost: user@public.example\r\n\r\n",
    ] {
        let answer = raw_exchange(web, head.as_bytes()).await;
        assert_eq!(status_of(&answer), 400, "{head:?}: {answer}");
        assert!(answer.contains("connection: close"), "{answer}");
    }
    // HTTP/1.0 may name no host: it is routed without one (404 here).
    let answer = raw_exchange(web, b"GET /public HTTP/1.0\r\n\r\n").await;
    assert_eq!(status_of(&answer), 404, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_authority_must_agree_with_host() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let mut h2 = RawH2::connect(gw.listener("web")).await;
    // :authority public.example, host internal.example: refused.
    let stream = h2
        .request(&[(":path", "/public"), ("host", "internal.example")])
        .await;
    assert_eq!(h2.response_status(stream).await, Some(400));
    // Agreeing ones are served, with :authority as the forwarded Host.
    let stream = h2
        .request(&[(":path", "/public/h2"), ("host", "public.example")])
        .await;
    assert_eq!(h2.response_status(stream).await, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_are_replaced_unless_the_peer_is_trusted() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let request = b"GET /public HTTP/1.1\r\nHost: public.example\r\n\
        X-Forwarded-For: 198.51.100.1\r\nX-Forwarded-For: 198.51.100.2, 198.51.100.3\r\n\
        X-Forwarded-Proto: https\r\nX-Forwarded-Host: spoofed.example\r\n\
        Forwarded: for=198.51.100.1\r\nConnection: close\r\n\r\n";
    let answer = raw_exchange(gw.listener("web"), request).await;
    assert!(answer.contains("x-forwarded-for: 127.0.0.1\n"), "{answer}");
    assert!(answer.contains("x-forwarded-proto: http\n"), "{answer}");
    assert!(
        answer.contains("x-forwarded-host: public.example\n"),
        "{answer}"
    );
    assert!(
        answer.contains("forwarded: for=127.0.0.1;proto=http;host=\"public.example\"\n"),
        "{answer}"
    );
    assert!(!answer.contains("198.51.100"), "{answer}");

    let answer = raw_exchange(gw.listener("trusting"), request).await;
    assert!(
        answer.contains("x-forwarded-for: 198.51.100.1, 198.51.100.2, 198.51.100.3, 127.0.0.1\n"),
        "{answer}"
    );
    assert!(answer.contains("x-forwarded-proto: https\n"), "{answer}");
    assert!(
        answer.contains("x-forwarded-host: spoofed.example\n"),
        "{answer}"
    );
    assert!(
        answer.contains(
            "forwarded: for=198.51.100.1, for=127.0.0.1;proto=http;host=\"public.example\"\n"
        ),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_forms_are_answered_and_never_forwarded() {
    let (backend, hits) = counting_echo().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let web = gw.listener("web");
    let head = "POST /public HTTP/1.1\r\nHost: public.example\r\n";
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "CL+TE",
            format!("{head}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
                .into(),
        ),
        (
            "TE+CL",
            format!("{head}Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n")
                .into(),
        ),
        (
            "differing Content-Length",
            format!("{head}Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!").into(),
        ),
        (
            "Content-Length list",
            format!("{head}Content-Length: 5, 6\r\n\r\nhello!").into(),
        ),
        (
            "TE not ending in chunked",
            format!("{head}Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n").into(),
        ),
        (
            "TE gzip, chunked",
            format!("{head}Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n").into(),
        ),
        (
            "TE chunked twice",
            format!(
                "{head}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            )
            .into(),
        ),
        (
            "TE with a space before the colon",
            format!("{head}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n").into(),
        ),
        (
            "obs-fold",
            format!("{head}X-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n").into(),
        ),
        (
            "invalid header name",
            format!("{head}Bad Name: 1\r\nContent-Length: 0\r\n\r\n").into(),
        ),
        (
            "NUL in a value",
            [head.as_bytes(), b"X-A: a\0b\r\nContent-Length: 0\r\n\r\n"].concat(),
        ),
        (
            "CR in a value",
            [head.as_bytes(), b"X-A: a\rb\r\nContent-Length: 0\r\n\r\n"].concat(),
        ),
        (
            "chunk size overflow",
            format!("{head}Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nx\r\n0\r\n\r\n")
                .into(),
        ),
        (
            "invalid chunk size",
            format!("{head}Transfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n").into(),
        ),
        (
            "negative chunk size",
            format!("{head}Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n").into(),
        ),
    ];
    for (name, bytes) in cases {
        let before = hits.load(Ordering::SeqCst);
        let answer = raw_exchange(web, &bytes).await;
        assert_eq!(status_of(&answer), 400, "{name}: {answer}");
        let forwarded = hits.load(Ordering::SeqCst) - before;
        let chunk_case = name.contains("chunk size");
        // A bad chunk arrives after the head was forwarded: the backend
        // then sees a request whose body never completes, never a second
        // request smuggled inside it.
        assert!(chunk_case || forwarded == 0, "{name} reached the backend");
    }
    // The gateway still serves a well-formed request afterwards.
    let answer = raw_exchange(
        web,
        format!("{head}Content-Length: 5\r\nConnection: close\r\n\r\nhello").as_bytes(),
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_lf_line_ends_are_refused() {
    let (backend, hits) = counting_echo().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let answer = raw_exchange(
        gw.listener("web"),
        b"GET /public HTTP/1.1\nHost: public.example\nConnection: close\n\n",
    )
    .await;
    assert_eq!(status_of(&answer), 400, "{answer}");
    let answer = raw_exchange(
        gw.listener("web"),
        b"GET /public HTTP/1.1\r\nHost: public.example\nX-A: 1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 400, "{answer}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_request_lines_get_431() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let web = gw.listener("web");
    let big = "a".repeat(64 * 1024);
    let answer = raw_exchange(
        web,
        format!("GET /public HTTP/1.1\r\nHost: public.example\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(
        status_of(&answer),
        431,
        "{}",
        &answer[..answer.len().min(200)]
    );
    let many: String = (0..101).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    let answer = raw_exchange(
        web,
        format!("GET /public HTTP/1.1\r\nHost: public.example\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert_eq!(status_of(&answer), 431, "{answer}");
    let long = "b".repeat(70 * 1024);
    let answer = raw_exchange(
        web,
        format!("GET /public/{long} HTTP/1.1\r\nHost: public.example\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(
        status_of(&answer),
        431,
        "{}",
        &answer[..answer.len().min(200)]
    );
    // Fewer are fine (90 here: the backend, hyper too, also counts the
    // three X-Forwarded-* headers against its limit of 100).
    let hundred: String = (0..90).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    let answer = raw_exchange(
        web,
        format!(
            "GET /public HTTP/1.1\r\nHost: public.example\r\n{hundred}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
}

/// Writes `bytes` in pieces of `piece` bytes, a millisecond apart (so
/// the gateway reads the head in different sizes), then reads the answer
/// until the gateway closes (a reset after the answer ends it too).
async fn exchange_in_pieces(addr: SocketAddr, bytes: &[u8], piece: usize) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    for chunk in bytes.chunks(piece) {
        stream.write_all(chunk).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("the gateway answers and closes within 5 s");
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// `max_header_bytes` holds to the byte on every path: HTTP/1
/// connections whose version hyper learns from their first bytes (a
/// first request `POST`, `PUT` or `PATCH`: hyper's only limit there is its
/// read buffer, whose capacity grows in powers of two, so a limit that is
/// not one let a head up to a read larger through), whatever sizes the
/// head arrives in; those served as HTTP/1 from the first byte; and
/// HTTP/2, where it bounds the header list as RFC 9113 measures it
/// (hyper's default would be 16 KiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_header_bytes_holds_to_the_byte_on_every_path() {
    const LIMIT: usize = 20_000;
    let backend = echo_backend().await;
    let config = Config::new()
        .listener("tight", &format!("max_header_bytes = {LIMIT}"))
        .route(
            "public",
            "listeners = [\"tight\"]\npath_prefix = \"/public\"\nupstream = \"app\"",
        )
        .upstream("app", &[backend.addr], "")
        .build();
    let gw = Gateway::start(&config);
    let tight = gw.listener("tight");
    // A head of exactly `len` bytes.
    let head = |method: &str, len: usize| {
        let start = format!(
            "{method} /public HTTP/1.1\r\nHost: public.example\r\nContent-Length: 0\r\nConnection: close\r\nX-Pad: "
        );
        let pad = "p".repeat(len - start.len() - 4);
        format!("{start}{pad}\r\n\r\n").into_bytes()
    };
    for method in ["POST", "GET"] {
        for piece in [usize::MAX, 4096, 1500] {
            for (len, status) in [(LIMIT, 200), (LIMIT + 1, 431), (LIMIT + 60, 431)] {
                let bytes = head(method, len);
                assert_eq!(bytes.len(), len);
                let answer = exchange_in_pieces(tight, &bytes, piece).await;
                assert_eq!(
                    status_of(&answer),
                    status,
                    "{method}, {len} bytes in pieces of {piece}: {}",
                    &answer[..answer.len().min(200)]
                );
                if status == 200 {
                    assert!(answer.contains(&format!("{method} /public")), "forwarded");
                }
            }
        }
    }

    let stream = TcpStream::connect(tight).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for (size, status) in [(LIMIT - 1000, 200), (LIMIT + 1000, 431)] {
        let req = Request::get("http://public.example/public")
            .header("x-pad", "p".repeat(size))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = sender.send_request(req).await.unwrap();
        assert_eq!(response.status(), status, "HTTP/2, a {size}-byte header");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_head_gets_408_while_others_are_served() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let web = gw.listener("web");
    let mut slow = TcpStream::connect(web).await.unwrap();
    let started = Instant::now();
    let head = b"GET /public HTTP/1.1\r\nHost: public.example\r\nX-Slow: ";
    slow.write_all(head).await.unwrap();
    // A byte every 50 ms keeps bytes moving but the head never ends.
    let trickle = async {
        for _ in 0..100 {
            if slow.write_all(b"a").await.is_err() {
                break;
            }
            // Meanwhile another client is served.
            let (status, _, _) = get(web, "public.example", "/public").await;
            assert_eq!(status, 200);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), trickle)
        .await
        .ok();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), slow.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_flowing_upload_outlasts_the_route_timeout() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let mut client = TcpStream::connect(gw.listener("web")).await.unwrap();
    client
        .write_all(b"POST /public HTTP/1.1\r\nHost: public.example\r\nContent-Length: 10\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    // 10 bytes over 2 s: four times the 500 ms route timeout, each gap
    // well inside the 800 ms idle timeout.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.write_all(b"x").await.unwrap();
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), client.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.ends_with("xxxxxxxxxx"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_closed_at_the_idle_timeout() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let web = gw.listener("web");
    let mut client = TcpStream::connect(web).await.unwrap();
    client
        .write_all(b"POST /public HTTP/1.1\r\nHost: public.example\r\nContent-Length: 10\r\n\r\nxx")
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), client.read_to_end(&mut answer))
        .await
        .expect("closed within 3 s")
        .ok();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(700), "{took:?}");
    // Others were and are served.
    assert_eq!(get(web, "public.example", "/public").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_idleness_is_not_the_header_timeout() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let mut client = TcpStream::connect(gw.listener("web")).await.unwrap();
    let request = b"GET /public HTTP/1.1\r\nHost: public.example\r\n\r\n";
    client.write_all(request).await.unwrap();
    read_one_response(&mut client).await;
    // Idle longer than the 400 ms header timeout, inside the 1.5 s
    // keep-alive timeout: the connection still takes a request.
    tokio::time::sleep(Duration::from_millis(900)).await;
    client.write_all(request).await.unwrap();
    read_one_response(&mut client).await;
    // Idle past the keep-alive timeout: closed without a word.
    let started = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(4), client.read_to_end(&mut rest))
        .await
        .expect("closed")
        .ok();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(3500),
        "{took:?}"
    );
}

/// Reads one `Content-Length` response off a keep-alive connection.
async fn read_one_response(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return text;
            }
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline.into(), stream.read(&mut chunk))
            .await
            .expect("a response within 3 s")
            .unwrap();
        assert!(n > 0, "closed before a whole response");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_under_thousands_of_idle_clients() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&config(&format!(
        r#"[[listeners]]
name = "capped"
bind = "127.0.0.1:0"
max_connections = 2000
header_read_timeout = "30s"

[[routes]]
name = "all"
listeners = ["web", "capped"]
upstream = "app"

[upstreams.app]
backends = [{{ addr = "{}" }}]
"#,
        backend.addr
    )));
    // 8 000 sockets here and 2 000 in the gateway: both need the room.
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let open_files: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|soft| soft.parse().ok())
        .unwrap_or(u64::MAX);
    if open_files < 9_000 {
        eprintln!("skipped: the open-file limit is {open_files}, 8 000 idle clients need 9 000 (ulimit -n)");
        return;
    }
    let capped = gw.listener("capped");
    let (rss_before, _) = gw.memory_kib();
    // 8 000 clients connect and say nothing.
    let mut idle = Vec::with_capacity(8000);
    for _ in 0..8000 {
        match TcpStream::connect(capped).await {
            Ok(stream) => idle.push(stream),
            Err(e) => panic!("connect: {e}"),
        }
    }
    // Those beyond the cap are closed by the gateway: reading them ends.
    // Which ones those are is the workers' order of accepting (each takes
    // from its own socket's backlog), not the order of connecting.
    let reads: Vec<_> = idle
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let mut byte = [0u8; 1];
                let read =
                    tokio::time::timeout(Duration::from_secs(2), stream.read(&mut byte)).await;
                (stream, matches!(read, Ok(Ok(0) | Err(_))))
            })
        })
        .collect();
    let mut idle = Vec::with_capacity(2000);
    let mut closed = 0;
    for read in reads {
        let (stream, was_closed) = read.await.unwrap();
        if was_closed {
            closed += 1;
        } else {
            idle.push(stream);
        }
    }
    assert_eq!(closed, 6000, "connections beyond the cap must be closed");
    assert_eq!(idle.len(), 2000);
    // The admin API and the other listener keep answering.
    let (status, _) = admin_request(gw.admin, "GET", "/admin/runtime/status", None, None).await;
    assert_eq!(status, 200);
    assert_eq!(get(gw.listener("web"), "a", "/").await.0, 200);
    let (rss, _) = gw.memory_kib();
    assert!(
        rss < rss_before + 64 * 1024,
        "RSS grew from {rss_before} to {rss} KiB with 2 000 idle connections"
    );
    // Once some leave, new ones are admitted again.
    idle.truncate(1000);
    let mut fresh = TcpStream::connect(capped).await.unwrap();
    fresh
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), fresh.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status_of(&String::from_utf8_lossy(&answer)), 200);
}

/// A raw HTTP/2 client: exact frames, for the abuse cases.
struct RawH2 {
    stream: TcpStream,
    next_stream: u32,
}

const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK block of literal fields without indexing (new names), plus
/// `:method GET`, `:scheme http` and `:authority public.example`.
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = vec![0x82, 0x86];
    let mut literal = |name: &str, value: &str| {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    };
    literal(":authority", "public.example");
    for (name, value) in fields {
        literal(name, value);
    }
    block
}

impl RawH2 {
    async fn connect(addr: SocketAddr) -> RawH2 {
        Self::connect_with(addr, &[]).await
    }

    /// Connects and sends the preface with `settings` (id, value) pairs.
    async fn connect_with(addr: SocketAddr, settings: &[(u16, u32)]) -> RawH2 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut payload = Vec::new();
        for (id, value) in settings {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &payload));
        stream.write_all(&hello).await.unwrap();
        RawH2 {
            stream,
            next_stream: 1,
        }
    }

    async fn request(&mut self, fields: &[(&str, &str)]) -> u32 {
        let id = self.next_stream;
        self.next_stream += 2;
        let bytes = frame(HEADERS, END_STREAM | END_HEADERS, id, &header_block(fields));
        self.stream.write_all(&bytes).await.unwrap();
        id
    }

    /// Reads frames until the response HEADERS of `stream`; returns its
    /// `:status` (indexed static entries 8-14 or a literal).
    async fn response_status(&mut self, stream: u32) -> Option<u16> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (kind, flags, id, payload) = self.read_frame(deadline).await?;
            if kind == SETTINGS && flags & 1 == 0 {
                let ack = frame(SETTINGS, 1, 0, &[]);
                self.stream.write_all(&ack).await.ok()?;
            }
            if kind == HEADERS && id == stream {
                let first = *payload.first()?;
                return match first {
                    0x88 => Some(200),
                    0x89 => Some(204),
                    0x8a => Some(206),
                    0x8b => Some(304),
                    0x8c => Some(400),
                    0x8d => Some(404),
                    0x8e => Some(500),
                    // Literal with an indexed :status name: the value follows.
                    _ => payload
                        .get(2..5)
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|v| v.parse().ok()),
                };
            }
        }
    }

    async fn read_frame(&mut self, deadline: Instant) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        tokio::time::timeout_at(deadline.into(), self.stream.read_exact(&mut head))
            .await
            .ok()?
            .ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        tokio::time::timeout_at(deadline.into(), self.stream.read_exact(&mut payload))
            .await
            .ok()?
            .ok()?;
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Some((head[3], head[4], id, payload))
    }

    /// Writes `bytes` as long as the gateway accepts them, then reads until
    /// it closes; true if it sent GOAWAY or closed within `within`.
    async fn flood_until_closed(&mut self, chunk: &[u8], rounds: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        for _ in 0..rounds {
            let write =
                tokio::time::timeout_at(deadline.into(), self.stream.write_all(chunk)).await;
            if !matches!(write, Ok(Ok(()))) {
                break;
            }
        }
        let mut goaway = false;
        loop {
            match self.read_frame(deadline).await {
                Some((GOAWAY, ..)) => goaway = true,
                Some(_) => {}
                None => {
                    // Closed, or timed out with the connection still open.
                    return goaway || Instant::now() < deadline;
                }
            }
        }
    }
}

/// Each HTTP/2 abuse closes the offender while another client is served.
async fn assert_h2_abuse_closed(
    name: &str,
    mut abuse: RawH2,
    chunk: Vec<u8>,
    rounds: usize,
    web: SocketAddr,
) {
    let closed = abuse
        .flood_until_closed(&chunk, rounds, Duration::from_secs(10))
        .await;
    assert!(closed, "{name}: the offending connection stayed open");
    let mut polite = RawH2::connect(web).await;
    let stream = polite.request(&[(":path", "/public")]).await;
    assert_eq!(polite.response_status(stream).await, Some(200), "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_floods_close_the_offender() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let web = gw.listener("patient");

    // Rapid reset: open a stream and cancel it, thousands of times.
    let mut rapid = Vec::new();
    for i in 0..500u32 {
        let id = 2 * i + 1;
        rapid.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            id,
            &header_block(&[(":path", "/public")]),
        ));
        rapid.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let abuse = RawH2::connect(web).await;
    assert_h2_abuse_closed("rapid reset", abuse, rapid, 1, web).await;

    // CONTINUATION flood: a header block that never ends.
    let mut abuse = RawH2::connect(web).await;
    let opening = frame(HEADERS, 0, 1, &header_block(&[(":path", "/public")]));
    abuse.stream.write_all(&opening).await.unwrap();
    let mut filler = Vec::new();
    for i in 0..200 {
        filler.push(0x00);
        filler.push(8);
        filler.extend_from_slice(format!("x-f{i:05}").as_bytes());
        filler.push(100);
        filler.extend_from_slice(&[b'v'; 100]);
    }
    let continuation = frame(CONTINUATION, 0, 1, &filler);
    assert_h2_abuse_closed("CONTINUATION flood", abuse, continuation, 10_000, web).await;

    // SETTINGS and PING floods whose answers are never read: the
    // gateway sends one acknowledgement at a time and reads the next
    // frame only once it is written, so the offender's own socket
    // buffers fill and it stalls; memory stays flat, and the stalled
    // connection (no request open) is closed by the keep-alive rule.
    // On `web` that is 1.5 s.
    let web = gw.listener("web");
    let (rss_before, _) = gw.memory_kib();
    let abuse = RawH2::connect(web).await;
    let settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
    assert_h2_abuse_closed("SETTINGS flood", abuse, settings.repeat(1000), 1000, web).await;
    let abuse = RawH2::connect(web).await;
    let ping = frame(PING, 0, 0, &[7; 8]);
    assert_h2_abuse_closed("PING flood", abuse, ping.repeat(1000), 1000, web).await;
    let (rss, _) = gw.memory_kib();
    assert!(
        rss < rss_before + 16 * 1024,
        "RSS grew from {rss_before} to {rss} KiB under control-frame floods"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_never_opens_its_window_is_closed() {
    let backend = Backend::start(Arc::new(|_req| {
        Box::pin(async move { hyper::Response::new(full(vec![b'z'; 1 << 20])) })
    }))
    .await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    let web = gw.listener("web");
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: nothing of the body can be sent.
    let mut stingy = RawH2::connect_with(web, &[(4, 0)]).await;
    let stream = stingy.request(&[(":path", "/public")]).await;
    assert_eq!(stingy.response_status(stream).await, Some(200));
    let started = Instant::now();
    let closed = stingy
        .flood_until_closed(&[], 0, Duration::from_secs(5))
        .await;
    assert!(closed, "a stalled stream kept its connection");
    assert!(started.elapsed() >= Duration::from_millis(700));
    let mut polite = RawH2::connect(web).await;
    let stream = polite.request(&[(":path", "/public")]).await;
    assert_eq!(polite.response_status(stream).await, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_faults_become_502_and_504_and_truncation_stays_visible() {
    const BODY: usize = 256 * 1024;
    let backend = Backend::start(Arc::new(|_req| {
        Box::pin(async move { hyper::Response::new(full(vec![b'b'; BODY])) })
    }))
    .await;
    let cases = [
        (
            "latency inside the timeout",
            Fault::Latency(Duration::from_millis(150)),
            Some(200),
        ),
        (
            "latency past the timeout",
            Fault::Latency(Duration::from_millis(1500)),
            Some(504),
        ),
        ("bandwidth cap", Fault::Bandwidth(1024 * 1024), Some(200)),
        ("reset inside the head", Fault::ResetAfter(10), Some(502)),
        ("reset inside the body", Fault::ResetAfter(20_000), None),
        ("blackhole", Fault::Blackhole, Some(504)),
        ("garbage head", Fault::GarbageHead, Some(502)),
        ("oversized head", Fault::OversizedHead, Some(502)),
        ("accepts but never reads", Fault::NeverReads, Some(504)),
    ];
    for (name, fault, expected) in cases {
        let proxy = FaultProxy::start(backend.addr, fault).await;
        let gw = Gateway::start(&edge_config(proxy.addr, ""));
        let web = gw.listener("web");
        let started = Instant::now();
        let req = Request::get("/public")
            .header("host", "public.example")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let answer = send(web, req).await;
        match expected {
            Some(200) => {
                let (status, _, body) = answer.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(status, 200, "{name}");
                assert_eq!(body.len(), BODY, "{name}: the whole body");
            }
            Some(status) => {
                let (got, _, _) = answer.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(got, status, "{name}");
                // 504s come at the 500 ms route timeout, not later.
                assert!(started.elapsed() < Duration::from_secs(2), "{name}");
            }
            None => {
                // The head went out before the backend failed: the client
                // must see the body end early, never a complete response.
                assert!(answer.is_err(), "{name}: truncation delivered as complete");
            }
        }
        // The gateway keeps serving other requests.
        assert_eq!(get(web, "x", "/").await.0, 404, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_silent_mid_body_is_cut_at_the_upstream_idle_timeout() {
    // Sends a head and half its body, then nothing while the connection
    // stays open.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello")
                .await;
            held.push(stream);
        }
    });
    let gw = Gateway::start(&edge_config(addr, "idle_timeout = \"400ms\""));
    // `patient` waits a minute for idle clients: what ends this exchange
    // is the upstream rule.
    let started = Instant::now();
    let req = Request::get("/public")
        .header("host", "public.example")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let answer = send(gw.listener("patient"), req).await;
    let took = started.elapsed();
    assert!(answer.is_err(), "a cut body was delivered as complete");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    silent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_gets_goaway_at_the_keepalive_timeout() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, ""));
    // Preface and SETTINGS, then nothing: neither a half-read HTTP/1 head
    // (no 408 bytes on an HTTP/2 connection) nor idle before 1.5 s.
    let mut h2 = RawH2::connect(gw.listener("web")).await;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(5);
    let mut goaway_at = None;
    while let Some((kind, flags, _, _)) = h2.read_frame(deadline).await {
        if kind == SETTINGS && flags & 1 == 0 {
            let ack = frame(SETTINGS, 1, 0, &[]);
            h2.stream.write_all(&ack).await.unwrap();
        }
        if kind == GOAWAY {
            goaway_at = Some(started.elapsed());
            break;
        }
    }
    let took = goaway_at.expect("GOAWAY before the connection closed");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_shows_the_routed_path() {
    let backend = echo_backend().await;
    let gw = Gateway::start(
        &edge_config(backend.addr, "")
            .replace("level = \"warn\"", "level = \"warn\"\naccess = true"),
    );
    let answer = raw_exchange(
        gw.listener("web"),
        b"GET /public/a/../b/%7Ec HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gw.logs().contains("path=/public/b/~c") {
        assert!(Instant::now() < deadline, "no access line:\n{}", gw.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!gw.logs().contains("/public/a/../b"), "{}", gw.logs());
}

/// A backend that answers every request with `response`, exactly.
async fn raw_backend(response: &'static [u8]) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = stream.read(&mut head).await;
                let _ = stream.write_all(response).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_framing_the_gateway_cannot_pass_on_is_a_502() {
    for (name, response) in [
        (
            "gzip, chunked",
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"[..],
        ),
        (
            "chunked, chunked",
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n7\r\n2\r\nok\r\n\r\n0\r\n\r\n"[..],
        ),
        (
            "chunked twice",
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"[..],
        ),
        (
            "gzip alone",
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nok"[..],
        ),
        // The body fails before a byte of it could go to the client:
        // a 502, not a 200 head with nothing behind it.
        (
            "garbage where the first chunk should be",
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n"[..],
        ),
    ] {
        let (addr, task) = raw_backend(response).await;
        let gw = Gateway::start(&edge_config(addr, ""));
        let (status, _, _) = get(gw.listener("web"), "public.example", "/public").await;
        assert_eq!(status, 502, "{name}");
        task.abort();
    }
    // A bare LF in a chunk extension: the body is cut, never delivered
    // as complete with the wrong bytes.
    let (addr, task) = raw_backend(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;a\nhello\r\n5\r\nworld\r\n0\r\n\r\n",
    )
    .await;
    let gw = Gateway::start(&edge_config(addr, ""));
    let req = Request::get("/public")
        .header("host", "public.example")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    if let Ok((status, _, body)) = send(gw.listener("web"), req).await {
        assert_eq!(status, 502, "delivered {body:?}");
    }
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_are_pinged_at_the_keepalive_interval() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&edge_config(backend.addr, "").replace(
        "name = \"patient\"\nbind = \"127.0.0.1:0\"\n",
        "name = \"patient\"\nbind = \"127.0.0.1:0\"\nh2_keepalive_interval = \"300ms\"\n",
    ));
    let mut h2 = RawH2::connect(gw.listener("patient")).await;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(5);
    let mut pinged = None;
    while let Some((kind, flags, _, payload)) = h2.read_frame(deadline).await {
        if kind == SETTINGS && flags & 1 == 0 {
            h2.stream
                .write_all(&frame(SETTINGS, 1, 0, &[]))
                .await
                .unwrap();
        }
        if kind == PING && flags & 1 == 0 {
            pinged = Some(started.elapsed());
            // Answered: the connection stays.
            h2.stream
                .write_all(&frame(PING, 1, 0, &payload))
                .await
                .unwrap();
            break;
        }
    }
    let after = pinged.expect("a PING within 5 s");
    assert!(after < Duration::from_secs(2), "{after:?}");
    let stream = h2.request(&[(":path", "/public")]).await;
    assert_eq!(h2.response_status(stream).await, Some(200));
}

/// A keep-alive backend that answers each request with `parts`, written
/// one after another with `pause` between them.
async fn staged_backend(
    parts: &'static [&'static [u8]],
    pause: Duration,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        for (i, part) in parts.iter().enumerate() {
                            if i > 0 {
                                tokio::time::sleep(pause).await;
                            }
                            if stream.write_all(part).await.is_err() {
                                return;
                            }
                        }
                    }
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => pending.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backends_early_hints_reach_http11_clients_before_the_response() {
    const HINTS: &[u8] = b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\nconnection: x-hop\r\nx-hop: 1\r\n\r\n";
    const FINAL: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    // 100 Continue is the gateway's own business (hyper answers a
    // client's Expect); the backend's is not passed on.
    let (addr, task) = staged_backend(
        &[b"HTTP/1.1 100 Continue\r\n\r\n", HINTS, FINAL],
        Duration::from_millis(150),
    )
    .await;
    let gw = Gateway::start(&edge_config(addr, ""));
    let hints = "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n";
    // The hints go out on their own, while the final answer is pending.
    let mut client = TcpStream::connect(gw.listener("web")).await.unwrap();
    client
        .write_all(b"GET /public HTTP/1.1\r\nHost: public.example\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(hints) {
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
            .await
            .expect("hints within 5 s")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert_eq!(String::from_utf8_lossy(&seen), hints);
    drop(client);
    // Two requests on one connection: framing holds for the next exchange.
    let answer = raw_exchange(
        gw.listener("web"),
        b"GET /public HTTP/1.1\r\nHost: public.example\r\n\r\nGET /public HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    let exchanges: Vec<&str> = answer.split(hints).collect();
    assert_eq!(exchanges.len(), 3, "{answer}");
    assert_eq!(exchanges[0], "", "{answer}");
    for exchange in &exchanges[1..] {
        assert!(exchange.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(exchange.ends_with("\r\n\r\nok"), "{answer}");
    }
    assert!(
        !answer.contains("x-hop") && !answer.contains("100 Continue"),
        "{answer}"
    );
    // RFC 9110 §15.2: never to an HTTP/1.0 client.
    let answer = raw_exchange(
        gw.listener("web"),
        b"GET /public HTTP/1.0\r\nHost: public.example\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
    assert!(!answer.contains("103"), "{answer}");
    task.abort();
}

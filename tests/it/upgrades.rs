//! Issue 69: a published zero across drain-aware upgrades, every protocol
//! at once. Real clients in this process, each on its own tasks, against
//! the real binary: HTTP/1.1 keep-alive, h2c (reconnecting after
//! GOAWAY), gRPC server streams (tonic), 8 WebSockets sending every 50 ms
//! and awaiting each echo, and 4 HTTP/3 connections, while the gateway
//! is activated and upgraded ten times back to back. Every answer is
//! counted; the test prints the figure `docs/operations.md` publishes.
//!
//! `CUTOVER_UPGRADE_BINARY=PATH` runs the same against another build of
//! `cutover` (an earlier release, say) and only prints its figure.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::grpc::{GrpcBackend, Msg};
use crate::harness::*;
use crate::lifecycle::{upgrade, websocket_backend, ws_frame, ws_read};
use crate::pki::*;

/// Every count the run keeps.
#[derive(Default)]
struct Tally {
    h1_ok: AtomicU64,
    /// A keep-alive connection closed before an answer began: the
    /// request was not processed and is sent again (RFC 9110 §9.2.2).
    h1_resent: AtomicU64,
    h1_failed: AtomicU64,
    h2_ok: AtomicU64,
    /// A request the server refused by GOAWAY (not processed), sent again
    /// on a new connection.
    h2_resent: AtomicU64,
    h2_failed: AtomicU64,
    grpc_ok: AtomicU64,
    /// A call the client never sent: its connection was closing (after
    /// the server's GOAWAY). gRPC clients retry these transparently
    /// (gRPC A6); so does this one.
    grpc_resent: AtomicU64,
    grpc_failed: AtomicU64,
    ws_echoed: AtomicU64,
    /// Sockets the gateway closed with 1001 at a drain deadline (then
    /// opened again).
    ws_going_away: AtomicU64,
    /// A message sent and never echoed.
    ws_lost: AtomicU64,
    h3_ok: AtomicU64,
    /// QUIC connections that ended under the client (then opened again),
    /// by how: closed by the server (after its GOAWAY), a stateless reset
    /// (a packet reached a process that does not know the connection),
    /// or anything else.
    h3_closed: AtomicU64,
    h3_reset: AtomicU64,
    h3_ended_otherwise: AtomicU64,
    h3_failed: AtomicU64,
    /// Connections on which the server's GOAWAY was read.
    h3_goaways: AtomicU64,
    /// Streams answered although a GOAWAY named them or one before them
    /// as not processed (RFC 9114 §5.2): a strict client would have sent
    /// them again elsewhere.
    h3_goaway_answered: AtomicU64,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The gateway: `web` (HTTP/1.1 and h2c) and `secure` (HTTPS and
/// HTTP/3); routes for the WebSocket and gRPC backends and a plain one,
/// which answers `x-round: ROUND` so that each activation shows.
fn mixed_config(
    backend: SocketAddr,
    websocket: SocketAddr,
    grpc: SocketAddr,
    round: usize,
) -> String {
    Config::new()
        .runtime("drain_timeout = \"3s\"")
        .listener("web", "")
        .listener(
            "secure",
            "protocol = \"https\"\nhttp3 = true\ntls.certificates = [{ cert = \"site.pem\", key = \"site.key\" }]",
        )
        .route(
            "chat",
            "listeners = [\"web\"]\npath_prefix = \"/chat\"\nupstream = \"ws\"",
        )
        .route(
            "echo",
            "listeners = [\"web\"]\npath_prefix = \"/test.Echo/\"\nupstream = \"grpc\"",
        )
        .route(
            "all",
            &format!("listeners = [\"web\", \"secure\"]\nupstream = \"app\"\nresponse_headers = {{ set = {{ \"x-round\" = \"{round}\" }} }}"),
        )
        .upstream("app", &[backend], "")
        .upstream("ws", &[websocket], "")
        .upstream("grpc", &[grpc], "protocol = \"h2c\"")
        .build()
}

async fn h1_client(web: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(web).await else {
            add(&tally.h1_failed);
            continue;
        };
        let Ok(mut sender) = crate::harness::h1_over(stream).await else {
            add(&tally.h1_failed);
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let req = hyper::Request::get("/")
                .header("host", "a")
                .body(Full::new(Bytes::new()));
            let Ok(req) = req else { return };
            match sender.send_request(req).await {
                Ok(r) if r.status() == 200 => {
                    let closing = r.headers().get("connection").is_some_and(|v| v == "close");
                    match r.into_body().collect().await {
                        Ok(_) => add(&tally.h1_ok),
                        Err(_) => add(&tally.h1_failed),
                    }
                    if closing {
                        break;
                    }
                }
                Ok(_) => add(&tally.h1_failed),
                Err(e) if e.is_canceled() || e.is_closed() || e.is_incomplete_message() => {
                    add(&tally.h1_resent);
                    break;
                }
                Err(_) => {
                    add(&tally.h1_failed);
                    break;
                }
            }
        }
    }
}

async fn h2_client(web: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(web).await else {
            add(&tally.h2_failed);
            continue;
        };
        let Ok((mut sender, conn)) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        else {
            add(&tally.h2_failed);
            continue;
        };
        tokio::spawn(conn);
        while !stop.load(Ordering::Relaxed) {
            let req = hyper::Request::get("http://a/").body(Full::new(Bytes::new()));
            let Ok(req) = req else { return };
            match sender.send_request(req).await {
                Ok(r) if r.status() == 200 => match r.into_body().collect().await {
                    Ok(_) => add(&tally.h2_ok),
                    Err(_) => add(&tally.h2_failed),
                },
                Ok(_) => add(&tally.h2_failed),
                // GOAWAY: a stream past the last one the server took is
                // refused (REFUSED_STREAM, or the connection is closed for
                // new ones); it was not processed.
                Err(e) => {
                    let refused = e.is_canceled()
                        || e.is_closed()
                        || std::error::Error::source(&e)
                            .and_then(|s| s.downcast_ref::<h2::Error>())
                            .is_some_and(|h2| {
                                h2.is_go_away() || h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                            });
                    add(if refused {
                        &tally.h2_resent
                    } else {
                        &tally.h2_failed
                    });
                    break;
                }
            }
        }
    }
}

async fn grpc_client(web: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let Ok(channel) = tonic::transport::Channel::from_shared(format!("http://{web}")) else {
        return;
    };
    let channel = channel.connect_lazy();
    let mut client = tonic::client::Grpc::new(channel);
    while !stop.load(Ordering::Relaxed) {
        if client.ready().await.is_err() {
            add(&tally.grpc_failed);
            continue;
        }
        let request = Msg {
            count: 5,
            delay_ms: 20,
            ..crate::grpc::msg("tick")
        };
        let call = client
            .server_streaming(
                tonic::Request::new(request),
                crate::grpc::path("Stream"),
                crate::grpc::Codec::default(),
            )
            .await;
        let response = match call {
            Ok(response) => response,
            Err(status) => {
                add(if never_sent(&status) {
                    &tally.grpc_resent
                } else {
                    eprintln!("gRPC call failed: {status:?}");
                    &tally.grpc_failed
                });
                continue;
            }
        };
        let mut stream = response.into_inner();
        let mut messages = 0;
        let ended = loop {
            match stream.message().await {
                Ok(Some(_)) => messages += 1,
                Ok(None) => break true,
                Err(status) => {
                    eprintln!("gRPC stream failed after {messages}: {status:?}");
                    break false;
                }
            }
        };
        add(if ended && messages == 5 {
            &tally.grpc_ok
        } else {
            &tally.grpc_failed
        });
    }
}

/// Whether a call that failed before its answer's head was never
/// processed: hyper's "canceled" (the connection closed before the
/// request was written), or the stream was past the last one a draining
/// process's final GOAWAY took (RFC 9113 §6.8; the h2c client above
/// counts the same as refused). Failures after the head stay failures.
fn never_sent(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR);
        }
        if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
            if hyper.is_canceled() {
                return true;
            }
        }
        source = error.source();
    }
    false
}

/// One WebSocket: a message every 50 ms, each echo awaited; a close 1001
/// from the gateway is answered and the socket opened again.
async fn websocket_client(web: SocketAddr, id: usize, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let request = "GET /chat HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut ws) = TcpStream::connect(web).await else {
            add(&tally.ws_lost);
            continue;
        };
        if ws.write_all(request.as_bytes()).await.is_err() {
            add(&tally.ws_lost);
            continue;
        }
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            match tokio::io::AsyncReadExt::read(&mut ws, &mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        if !head.starts_with(b"HTTP/1.1 101") {
            add(&tally.ws_lost);
            continue;
        }
        while !stop.load(Ordering::Relaxed) {
            let message = format!("{id}:{n}");
            n += 1;
            if ws
                .write_all(&ws_frame(1, message.as_bytes()))
                .await
                .is_err()
            {
                add(&tally.ws_lost);
                break;
            }
            let answer = tokio::time::timeout(Duration::from_secs(5), ws_read(&mut ws)).await;
            match answer {
                Ok(Some((1, echoed))) if echoed == message.as_bytes() => add(&tally.ws_echoed),
                // Going away (at a frame boundary: the message before the
                // close was echoed; this one was sent after the gateway's
                // close and is answered by nobody, by the protocol).
                Ok(Some((8, code))) if code == 1001u16.to_be_bytes() => {
                    add(&tally.ws_going_away);
                    let _ = ws.write_all(&ws_frame(8, &code)).await;
                    break;
                }
                _ => {
                    add(&tally.ws_lost);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn h3_client(
    endpoint: quinn::Endpoint,
    secure: SocketAddr,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(connecting) = endpoint.connect(secure, "localhost") else {
            add(&tally.h3_failed);
            continue;
        };
        let Ok(connection) = connecting.await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let quic = connection.clone();
        let (watched, goaway) = crate::goaway::Watched::new(connection);
        let Ok((mut driver, mut sender)) = h3::client::new(watched).await else {
            continue;
        };
        let mut answered = Vec::new();
        tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        while !stop.load(Ordering::Relaxed) {
            let Ok(req) = http::Request::get("https://localhost/").body(()) else {
                return;
            };
            // A request the connection could not open a stream for, or a
            // stream the server reset unprocessed: the connection is done.
            let Ok(mut stream) = sender.send_request(req).await else {
                break;
            };
            if stream.finish().await.is_err() {
                break;
            }
            let Ok(response) = stream.recv_response().await else {
                break;
            };
            let mut whole = true;
            loop {
                match stream.recv_data().await {
                    Ok(Some(mut chunk)) => {
                        chunk.advance(chunk.remaining());
                    }
                    Ok(None) => break,
                    Err(_) => {
                        whole = false;
                        break;
                    }
                }
            }
            if whole && response.status() == 200 {
                add(&tally.h3_ok);
                answered.push(stream.id().into_inner());
            } else {
                add(&tally.h3_failed);
            }
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // How the connection ended (wait for it: the client may have
        // stopped on the GOAWAY before the close arrived).
        let reason = tokio::time::timeout(Duration::from_secs(5), quic.closed()).await;
        if let Some(first_not_processed) = goaway.first_not_processed() {
            add(&tally.h3_goaways);
            let past = answered
                .iter()
                .filter(|&&id| id >= first_not_processed)
                .count();
            tally
                .h3_goaway_answered
                .fetch_add(past as u64, Ordering::Relaxed);
        }
        add(match reason {
            Ok(quinn::ConnectionError::ApplicationClosed(_)) => &tally.h3_closed,
            Ok(quinn::ConnectionError::Reset) => &tally.h3_reset,
            _ => &tally.h3_ended_otherwise,
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_through_ten_upgrades_and_activations() {
    let backend = Backend::named("ok").await;
    let websocket = websocket_backend().await;
    let grpc = GrpcBackend::start(None).await;
    let ca = ca("upgrades ca");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = server_leaf(&ca, &["localhost"]);
    std::fs::write(dir.path().join("site.pem"), cert).unwrap();
    std::fs::write(dir.path().join("site.key"), key).unwrap();
    let other = std::env::var_os("CUTOVER_UPGRADE_BINARY").map(std::path::PathBuf::from);
    let first = mixed_config(backend.addr, websocket.addr, grpc.addr, 0);
    let mut gw = match &other {
        Some(binary) => Gateway::start_binary(binary, dir, &first),
        None => Gateway::start_in(dir, &first),
    };
    let (web, secure) = (gw.listener("web"), gw.listener("secure"));
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut clients = Vec::new();
    let spawn =
        |f: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| tokio::spawn(f);
    for _ in 0..2 {
        clients.push(spawn(Box::pin(h1_client(
            web,
            Arc::clone(&stop),
            Arc::clone(&tally),
        ))));
        clients.push(spawn(Box::pin(h2_client(
            web,
            Arc::clone(&stop),
            Arc::clone(&tally),
        ))));
        clients.push(spawn(Box::pin(grpc_client(
            web,
            Arc::clone(&stop),
            Arc::clone(&tally),
        ))));
    }
    for id in 0..8 {
        clients.push(spawn(Box::pin(websocket_client(
            web,
            id,
            Arc::clone(&stop),
            Arc::clone(&tally),
        ))));
    }
    let endpoint = crate::http3::client(&ca);
    for _ in 0..4 {
        clients.push(spawn(Box::pin(h3_client(
            endpoint.clone(),
            secure,
            Arc::clone(&stop),
            Arc::clone(&tally),
        ))));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let (mut upgrades, mut activations) = (0, 0);
    for round in 1..=10 {
        // An activation, then an upgrade carrying the next one's config.
        let (status, body) = admin_request(
            gw.admin,
            "POST",
            "/admin/runtime/activate",
            Some("application/toml"),
            Some(mixed_config(
                backend.addr,
                websocket.addr,
                grpc.addr,
                2 * round - 1,
            )),
        )
        .await;
        assert_eq!(status, 200, "round {round}: {body}");
        activations += 1;
        let old_pid = gw.gateway_pids().last().copied().unwrap_or(0);
        let next = mixed_config(backend.addr, websocket.addr, grpc.addr, 2 * round);
        let op = upgrade(&gw, Some(&next)).await;
        assert_eq!(
            op["outcome"],
            "succeeded",
            "round {round}: {op}\n{}",
            gw.logs()
        );
        upgrades += 1;
        let new_pid = op["pid"].as_u64().unwrap() as u32;
        gw.adopted.push(new_pid);
        // The old process ends within drain_timeout (3 s) and a second.
        let deadline = Instant::now() + Duration::from_secs(5);
        while gw.gateway_pids().contains(&old_pid) {
            assert!(
                Instant::now() < deadline,
                "round {round}: pid {old_pid} still running"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = tokio::time::timeout(Duration::from_secs(10), client).await;
    }
    let t = &tally;
    let figure = format!(
        "{upgrades} upgrades and {activations} activations in {:.0} s: HTTP/1.1 {} ok, {} resent (closed before an answer), {} failed; h2c {} ok, {} resent after GOAWAY, {} failed; gRPC {} streams ok, {} not processed (the connection was closing), {} failed; WebSocket {} messages echoed, {} closes 1001 at a drain deadline, {} lost; HTTP/3 {} ok, {} failed, connections ended {} by the server's close, {} by a stateless reset, {} otherwise, {} GOAWAYs read, {} streams answered at or past a GOAWAY's ID",
        started.elapsed().as_secs_f64(),
        get(&t.h1_ok), get(&t.h1_resent), get(&t.h1_failed),
        get(&t.h2_ok), get(&t.h2_resent), get(&t.h2_failed),
        get(&t.grpc_ok), get(&t.grpc_resent), get(&t.grpc_failed),
        get(&t.ws_echoed), get(&t.ws_going_away), get(&t.ws_lost),
        get(&t.h3_ok), get(&t.h3_failed),
        get(&t.h3_closed), get(&t.h3_reset), get(&t.h3_ended_otherwise),
        get(&t.h3_goaways), get(&t.h3_goaway_answered),
    );
    eprintln!("{figure}");
    if let Some(binary) = other {
        eprintln!("(with {}: figure only)", binary.display());
        return;
    }
    for (what, n) in [
        ("HTTP/1.1", get(&t.h1_ok)),
        ("h2c", get(&t.h2_ok)),
        ("gRPC", get(&t.grpc_ok)),
        ("WebSocket", get(&t.ws_echoed)),
        ("HTTP/3", get(&t.h3_ok)),
        ("HTTP/3 GOAWAY", get(&t.h3_goaways) * 10),
    ] {
        assert!(n > 50, "too little {what} traffic: {figure}");
    }
    assert_eq!(
        (
            get(&t.h1_failed),
            get(&t.h2_failed),
            get(&t.grpc_failed),
            get(&t.ws_lost),
            get(&t.h3_failed),
            get(&t.h3_reset),
            get(&t.h3_goaway_answered)
        ),
        (0, 0, 0, 0, 0, 0, 0),
        "{figure}\n{}",
        gw.logs()
    );
}

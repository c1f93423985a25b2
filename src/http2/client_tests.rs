//! The client against cutover's own server (whole exchanges, many at
//! once) and against a backend of exact frames: GOAWAY and refused
//! streams, resets, malformed answers, interim heads, trailers, a caller
//! that leaves, an idle connection.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame as BodyFrame;
use http_body_util::BodyExt;

use super::frame::{self, Kind, Reason, FLAG_END_HEADERS, FLAG_END_STREAM};
use super::hpack::{self, Decoder};
use super::tests::Client as Peer;
use super::{
    handshake, ClientError, ClientSettings, Connection, Failed, RecvBody, Resend, SendRequest,
};

/// A body of given frames (data, then trailers), in order.
#[derive(Debug, Default)]
struct Frames(VecDeque<BodyFrame<Bytes>>);

impl Frames {
    fn data(chunks: &[&'static str]) -> Frames {
        Frames(
            chunks
                .iter()
                .map(|c| BodyFrame::data(Bytes::from_static(c.as_bytes())))
                .collect(),
        )
    }

    fn with_trailers(mut self, name: &'static str, value: &'static str) -> Frames {
        let mut trailers = HeaderMap::new();
        trailers.insert(name, HeaderValue::from_static(value));
        self.0.push_back(BodyFrame::trailers(trailers));
        self
    }
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

const CLIENT: ClientSettings = ClientSettings {
    max_header_list_size: 16 * 1024,
    idle_timeout: Duration::from_secs(30),
};

fn request(method: &str, path: &str, body: Frames) -> Request<Resend<Frames>> {
    Request::builder()
        .method(method)
        .uri(format!("http://backend.test{path}"))
        .header("x-request", "1")
        .body(Resend::new(body))
        .unwrap()
}

/// What `answer` gives: the status, the body's bytes and its trailers
/// (or the body's error).
async fn read(response: Response<RecvBody>) -> (StatusCode, Result<(Bytes, HeaderMap), String>) {
    let status = response.status();
    let collected = response.into_body().collect().await;
    let body = collected
        .map(|c| {
            let trailers = c.trailers().cloned().unwrap_or_default();
            (c.to_bytes(), trailers)
        })
        .map_err(|e| e.to_string());
    (status, body)
}

async fn answer(sender: &SendRequest<Frames>, req: Request<Resend<Frames>>) -> Response<RecvBody> {
    match sender.send(req) {
        Ok(future) => match future.await {
            Ok(response) => response,
            Err(Failed::Error(error)) => panic!("failed: {error}"),
            Err(Failed::Unsent(_)) => panic!("refused unsent"),
        },
        Err(_) => panic!("the connection took no stream"),
    }
}

/// The echo service: the request's method, path and body back, its
/// trailers and one more.
async fn echo(req: Request<RecvBody>) -> Result<Response<Frames>, Infallible> {
    let (parts, body) = req.into_parts();
    let collected = body.collect().await.unwrap();
    let mut trailers = collected.trailers().cloned().unwrap_or_default();
    trailers.insert("x-echo", HeaderValue::from_static("done"));
    let text = format!(
        "{} {} {} {}",
        parts.method,
        parts.uri,
        parts.headers["x-request"].to_str().unwrap(),
        String::from_utf8_lossy(&collected.to_bytes())
    );
    let mut frames = VecDeque::new();
    frames.push_back(BodyFrame::data(Bytes::from(text)));
    frames.push_back(BodyFrame::trailers(trailers));
    Ok(Response::new(Frames(frames)))
}

#[tokio::test]
async fn whole_exchanges_with_our_own_server_many_at_once() {
    let (near, far) = tokio::io::duplex(1 << 20);
    let settings = super::Settings {
        max_concurrent_streams: 8,
        max_header_list_size: 16 * 1024,
        keepalive_interval: None,
        keepalive_timeout: Duration::from_secs(20),
    };
    tokio::spawn(Connection::new(far, settings, echo));
    let (sender, connection) = handshake(near, CLIENT);
    tokio::spawn(connection);

    let first = answer(&sender, request("GET", "/", Frames::default())).await;
    let (status, body) = read(first).await;
    assert_eq!(status, StatusCode::OK);
    let (bytes, trailers) = body.unwrap();
    assert_eq!(&bytes[..], b"GET http://backend.test/ 1 ");
    assert_eq!(trailers["x-echo"], "done");

    // The server's SETTINGS are in: eight streams at once, not nine.
    let mut answers = Vec::new();
    for n in 0..8 {
        let body = Frames::data(&["part one, ", "part two"]).with_trailers("x-sent", "yes");
        let req = request("POST", &format!("/call/{n}?q=1"), body);
        answers.push(sender.send(req).ok().unwrap());
    }
    assert!(!sender.has_room());
    assert!(sender.send(request("GET", "/", Frames::default())).is_err());
    for (n, future) in answers.into_iter().enumerate() {
        let response = future.await.ok().unwrap();
        let (status, body) = read(response).await;
        assert_eq!(status, StatusCode::OK);
        let (bytes, trailers) = body.unwrap();
        let expected = format!("POST http://backend.test/call/{n}?q=1 1 part one, part two");
        assert_eq!(bytes, expected.as_bytes());
        assert_eq!(trailers["x-sent"], "yes");
        assert_eq!(trailers["x-echo"], "done");
    }
    assert!(sender.has_room());
}

/// A client on one end of a pipe, and the backend's end after the
/// client's preface, our SETTINGS sent.
async fn raw(settings: ClientSettings) -> (SendRequest<Frames>, Peer) {
    let (near, far) = tokio::io::duplex(1 << 20);
    let (sender, connection) = handshake(near, settings);
    tokio::spawn(connection);
    let mut peer = Peer {
        io: far,
        read: BytesMut::new(),
        decoder: Decoder::new(4096),
    };
    while peer.read.len() < frame::PREFACE.len() {
        use tokio::io::AsyncReadExt;
        assert!(peer.io.read_buf(&mut peer.read).await.unwrap() > 0);
    }
    assert_eq!(&peer.read[..frame::PREFACE.len()], frame::PREFACE);
    let _ = peer.read.split_to(frame::PREFACE.len());
    peer.send(Kind::Settings, 0, 0, &[]).await;
    (sender, peer)
}

/// `request(method, path, body)` on `sender`, which must take it.
fn sent(
    sender: &SendRequest<Frames>,
    method: &str,
    path: &str,
    body: Frames,
) -> super::ResponseFuture<Frames> {
    match sender.send(request(method, path, body)) {
        Ok(future) => future,
        Err(_) => panic!("the connection took no stream"),
    }
}

/// The backend resets `stream` with `reason`.
async fn reset_stream(peer: &mut Peer, stream: u32, reason: Reason) {
    peer.send(Kind::RstStream, 0, stream, &reason.0.to_be_bytes())
        .await;
}

/// An answer head's block: `status` and `fields`.
fn head(status: u16, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = BytesMut::new();
    hpack::encode_status(StatusCode::from_u16(status).unwrap(), &mut block);
    for (name, value) in fields {
        let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        hpack::encode_field(&name, value.as_bytes(), false, &mut block);
    }
    block.to_vec()
}

#[tokio::test]
async fn a_goaway_refuses_later_streams_and_gives_them_back_from_their_start() {
    let (sender, mut peer) = raw(CLIENT).await;
    let get = sent(&sender, "GET", "/a", Frames::default());
    let post = sent(&sender, "POST", "/b", Frames::data(&["body"]));
    let first = peer.next_of(Kind::Headers).await.unwrap();
    assert_eq!(first.stream, 1);
    let fields = peer.decode(&first.payload);
    assert!(fields.iter().any(|f| f == "x-request 1"), "{fields:?}");
    let second = peer.next_of(Kind::Headers).await.unwrap();
    assert_eq!(second.stream, 3);
    let data = peer.next_of(Kind::Data).await.unwrap();
    assert_eq!(
        (&data.payload[..], data.flags & FLAG_END_STREAM),
        (&b"body"[..], FLAG_END_STREAM)
    );

    // Nothing processed: both come back to be sent again, the POST with
    // its body from the start although it went out.
    let mut goaway = BytesMut::new();
    goaway.put_u32(0);
    goaway.put_u32(0);
    peer.send(Kind::GoAway, 0, 0, &goaway).await;
    match get.await {
        Err(Failed::Unsent(back)) => assert_eq!(back.uri().path(), "/a"),
        _ => panic!("the GET should come back unsent"),
    }
    match post.await {
        Err(Failed::Unsent(back)) => {
            let body = back.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"body");
        }
        _ => panic!("the POST should come back unsent"),
    }
    assert!(sender.is_closed());
    assert!(sender
        .send(request("GET", "/c", Frames::default()))
        .is_err());
}

#[tokio::test]
async fn a_refused_body_too_long_to_keep_fails_and_an_answered_one_is_not_kept() {
    let (sender, mut peer) = raw(CLIENT).await;
    // 80 KiB in 40 frames: past what is kept to be sent again.
    let chunk: &'static str = Box::leak("x".repeat(2048).into_boxed_str());
    let long = sender
        .send(request("POST", "/long", Frames::data(&[chunk; 40])))
        .ok()
        .unwrap();
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    // The window lets 64 KiB through; give the rest room.
    let mut more = BytesMut::new();
    more.put_u32(1 << 20);
    peer.send(Kind::WindowUpdate, 0, 0, &more).await;
    peer.send(Kind::WindowUpdate, 0, opened.stream, &more).await;
    let mut received = 0;
    while received < 40 * 2048 {
        received += peer.next_of(Kind::Data).await.unwrap().payload.len();
    }
    reset_stream(&mut peer, opened.stream, Reason::REFUSED_STREAM).await;
    assert!(matches!(
        long.await,
        Err(Failed::Error(ClientError::Refused))
    ));

    // Answered before the backend refuses anything more: a reset then is
    // the stream's error, not a refusal.
    let short = sent(&sender, "POST", "/short", Frames::data(&["b"]));
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS,
        opened.stream,
        &head(200, &[]),
    )
    .await;
    reset_stream(&mut peer, opened.stream, Reason::REFUSED_STREAM).await;
    let (_, body) = read(short.await.ok().unwrap()).await;
    assert!(body.unwrap_err().contains("0x7"));
}

#[tokio::test]
async fn resets_and_malformed_answers_fail_their_stream_only() {
    let (sender, mut peer) = raw(CLIENT).await;
    // REFUSED_STREAM before any answer: sent again elsewhere.
    let refused = sent(&sender, "GET", "/r", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    reset_stream(&mut peer, opened.stream, Reason::REFUSED_STREAM).await;
    assert!(matches!(refused.await, Err(Failed::Unsent(_))));

    // DATA before the head.
    let early = sent(&sender, "GET", "/d", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    peer.send(Kind::Data, 0, opened.stream, b"x").await;
    assert!(matches!(
        early.await,
        Err(Failed::Error(ClientError::Malformed(_)))
    ));
    let reset = peer.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(
        super::tests::reset_of(&reset),
        (opened.stream, Reason::PROTOCOL_ERROR)
    );

    // A body shorter than its content-length: the body fails.
    let short = sent(&sender, "GET", "/s", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    let block = head(200, &[("content-length", "5")]);
    peer.send(Kind::Headers, FLAG_END_HEADERS, opened.stream, &block)
        .await;
    peer.send(Kind::Data, FLAG_END_STREAM, opened.stream, b"abc")
        .await;
    let (status, body) = read(short.await.ok().unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.is_err(), "{body:?}");

    // A reset after the head: the body fails with its code.
    let cut = sent(&sender, "GET", "/c", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS,
        opened.stream,
        &head(200, &[]),
    )
    .await;
    reset_stream(&mut peer, opened.stream, Reason::INTERNAL_ERROR).await;
    let (_, body) = read(cut.await.ok().unwrap()).await;
    assert!(body.unwrap_err().contains("0x2"));

    // The connection goes on: an interim head, then the answer with
    // data and trailers.
    let fine = sent(&sender, "GET", "/f", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    let id = opened.stream;
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS,
        id,
        &head(103, &[("link", "</a>")]),
    )
    .await;
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS,
        id,
        &head(200, &[("x-b", "2")]),
    )
    .await;
    peer.send(Kind::Data, 0, id, b"payload").await;
    let trailers = head(200, &[("grpc-status", "0")])[1..].to_vec();
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        id,
        &trailers,
    )
    .await;
    let response = fine.await.ok().unwrap();
    assert_eq!(response.headers()["x-b"], "2");
    let (status, body) = read(response).await;
    let (bytes, trailers) = body.unwrap();
    assert_eq!((status, &bytes[..]), (StatusCode::OK, &b"payload"[..]));
    assert_eq!(trailers["grpc-status"], "0");
}

#[tokio::test]
async fn priority_errors_on_our_streams_fail_them_only() {
    let (sender, mut peer) = raw(CLIENT).await;
    // A PRIORITY of 4 bytes (§6.3), one naming its own stream (§5.3.1),
    // an answer whose HEADERS name its own stream: each fails its
    // stream, reset with the error's code.
    let flags = FLAG_END_HEADERS | frame::FLAG_PRIORITY;
    for (path, expected) in [
        ("/short", Reason::FRAME_SIZE_ERROR),
        ("/self", Reason::PROTOCOL_ERROR),
        ("/head", Reason::PROTOCOL_ERROR),
    ] {
        let call = sent(&sender, "GET", path, Frames::default());
        let id = peer.next_of(Kind::Headers).await.unwrap().stream;
        let own = id.to_be_bytes();
        match path {
            "/short" => peer.send(Kind::Priority, 0, id, &own).await,
            "/self" => {
                peer.send(Kind::Priority, 0, id, &[own[0], own[1], own[2], own[3], 16])
                    .await
            }
            _ => {
                let mut payload = own.to_vec();
                payload.push(16);
                payload.extend(head(200, &[]));
                peer.send(Kind::Headers, flags, id, &payload).await;
            }
        }
        assert!(
            matches!(call.await, Err(Failed::Error(ClientError::Malformed(_)))),
            "{path}"
        );
        let reset = peer.next_of(Kind::RstStream).await.unwrap();
        assert_eq!(super::tests::reset_of(&reset), (id, expected), "{path}");
    }

    // A PRIORITY naming another stream is read and left; the connection
    // serves on.
    let fine = sent(&sender, "GET", "/fine", Frames::default());
    let id = peer.next_of(Kind::Headers).await.unwrap().stream;
    peer.send(Kind::Priority, 0, id, &[0, 0, 0, 1, 16]).await;
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        id,
        &head(204, &[]),
    )
    .await;
    let (status, _) = read(fine.await.ok().unwrap()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_caller_that_leaves_has_its_stream_cancelled() {
    let (sender, mut peer) = raw(CLIENT).await;
    let future = sent(&sender, "GET", "/slow", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    drop(future);
    let reset = peer.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(
        super::tests::reset_of(&reset),
        (opened.stream, Reason::CANCEL)
    );

    // A body dropped before its end, too.
    let future = sent(&sender, "GET", "/big", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS,
        opened.stream,
        &head(200, &[]),
    )
    .await;
    peer.send(Kind::Data, 0, opened.stream, b"first").await;
    let response = future.await.ok().unwrap();
    drop(response);
    let reset = peer.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(
        super::tests::reset_of(&reset),
        (opened.stream, Reason::CANCEL)
    );
    assert!(sender.has_room());
}

#[tokio::test]
async fn an_idle_connection_says_goodbye_and_closes() {
    let settings = ClientSettings {
        idle_timeout: Duration::from_millis(50),
        ..CLIENT
    };
    let (sender, mut peer) = raw(settings).await;
    let future = sent(&sender, "HEAD", "/", Frames::default());
    let opened = peer.next_of(Kind::Headers).await.unwrap();
    // A HEAD answer names a length and carries no body.
    let block = head(200, &[("content-length", "10")]);
    peer.send(
        Kind::Headers,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        opened.stream,
        &block,
    )
    .await;
    let (status, body) = read(future.await.ok().unwrap()).await;
    assert_eq!((status, body.unwrap().0.len()), (StatusCode::OK, 0));
    assert!(!sender.is_closed());
    let goaway = peer.goaway().await;
    assert_eq!(goaway, Some(Reason::NO_ERROR));
    assert!(peer.next().await.is_none(), "the connection should close");
    assert!(sender.is_closed());
}

#[tokio::test]
async fn a_backend_that_breaks_the_protocol_loses_the_connection() {
    let (sender, mut peer) = raw(CLIENT).await;
    let future = sent(&sender, "GET", "/", Frames::default());
    peer.next_of(Kind::Headers).await.unwrap();
    // PUSH_PROMISE after SETTINGS_ENABLE_PUSH 0.
    peer.send(Kind::PushPromise, FLAG_END_HEADERS, 1, &[0, 0, 0, 2, 0x82])
        .await;
    assert_eq!(peer.goaway().await, Some(Reason::PROTOCOL_ERROR));
    assert!(matches!(
        future.await,
        Err(Failed::Error(ClientError::Connection(_)))
    ));
    assert!(sender.is_closed());
}

//! The server against a client of exact frames (the cases h2spec and the
//! `h2` crate's own tests hold a server to): the preface and SETTINGS,
//! flow control both ways, resets, header limits, stream limits, floods,
//! CONTINUATION, GOAWAY.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::frame::{self, Kind, Reason, FLAG_ACK, FLAG_END_HEADERS, FLAG_END_STREAM};
use super::hpack::{self, Decoder, Field};
use super::{spare, Connection, RecvBody, Settings};

const SETTINGS: Settings = Settings {
    max_concurrent_streams: 4,
    max_header_list_size: 1024,
    keepalive_interval: None,
    keepalive_timeout: Duration::from_secs(20),
};

type Answer = Result<Response<Full<Bytes>>, Infallible>;

/// A raw client on one end of an in-memory pipe (the client's tests use
/// it as a raw backend).
pub(super) struct Client {
    pub(super) io: DuplexStream,
    pub(super) read: BytesMut,
    pub(super) decoder: Decoder,
}

#[derive(Debug)]
pub(super) struct Frame {
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
    pub(super) payload: Bytes,
}

impl Client {
    pub(super) async fn send(&mut self, kind: Kind, flags: u8, stream: u32, payload: &[u8]) {
        let mut out = BytesMut::new();
        frame::head(&mut out, payload.len(), kind, flags, stream);
        out.put_slice(payload);
        self.io.write_all(&out).await.unwrap();
    }

    /// The preface and an empty SETTINGS (or `settings`).
    pub(super) async fn hello(&mut self, settings: &[(u16, u32)]) {
        self.io.write_all(frame::PREFACE).await.unwrap();
        let mut payload = Vec::new();
        for (id, value) in settings {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        self.send(Kind::Settings, 0, 0, &payload).await;
    }

    /// The next frame, or None once the server closed (or 5 s passed).
    pub(super) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(header) = frame::Header::parse(&self.read) {
                if self.read.len() >= 9 + header.len {
                    let bytes = self.read.split_to(9 + header.len).freeze();
                    return Some(Frame {
                        kind: header.kind,
                        flags: header.flags,
                        stream: header.stream,
                        payload: bytes.slice(9..),
                    });
                }
            }
            let read =
                tokio::time::timeout(Duration::from_secs(5), self.io.read_buf(&mut self.read));
            match read.await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// Frames until one of `kind` (SETTINGS and WINDOW_UPDATE from the
    /// server's start are skipped).
    pub(super) async fn next_of(&mut self, kind: Kind) -> Option<Frame> {
        loop {
            let frame = self.next().await?;
            if frame.kind == kind as u8 {
                return Some(frame);
            }
        }
    }

    /// The GOAWAY that ends the connection: its error code.
    pub(super) async fn goaway(&mut self) -> Option<Reason> {
        let frame = self.next_of(Kind::GoAway).await?;
        let code = u32::from_be_bytes(frame.payload[4..8].try_into().unwrap());
        Some(Reason(code))
    }

    pub(super) fn decode(&mut self, block: &[u8]) -> Vec<String> {
        let mut fields = Vec::new();
        self.decoder.decode(block, 1 << 16, &mut fields).unwrap();
        fields
            .into_iter()
            .map(|f| match f {
                Field::Status(v) => format!(":status {}", String::from_utf8_lossy(&v)),
                Field::Header(n, v) => format!("{n} {}", v.to_str().unwrap()),
                other => format!("{other:?}"),
            })
            .collect()
    }

    pub(super) async fn get(&mut self, stream: u32, path: &str) {
        let block = request_block(path, &[]);
        self.send(
            Kind::Headers,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            stream,
            &block,
        )
        .await;
    }
}

/// A request's field block: GET `path` on https://a.example, plus `extra`.
pub(super) fn request_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut block = BytesMut::new();
    block.put_slice(&[0x82, 0x87]);
    // :authority (literal without indexing, name index 1), :path (4).
    block.put_slice(&[0x01, 9]);
    block.put_slice(b"a.example");
    block.put_slice(&[0x04, path.len() as u8]);
    block.put_slice(path.as_bytes());
    for (name, value) in extra {
        hpack::encode_field(
            &http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.as_bytes(),
            false,
            &mut block,
        );
    }
    block.to_vec()
}

/// Serves `service` on a pipe; the client end and the server's task.
fn serve<S, F>(
    settings: Settings,
    service: S,
) -> (Client, tokio::task::JoinHandle<Result<(), super::Error>>)
where
    S: FnMut(Request<RecvBody>) -> F + Send + Unpin + 'static,
    F: std::future::Future<Output = Answer> + Send + 'static,
{
    let (client, server) = tokio::io::duplex(1 << 20);
    let task = tokio::spawn(Connection::new(server, settings, service));
    let client = Client {
        io: client,
        read: BytesMut::new(),
        decoder: Decoder::new(4096),
    };
    (client, task)
}

fn hello(
    body: &'static str,
) -> impl FnMut(Request<RecvBody>) -> std::future::Ready<Answer> + Send + Unpin {
    move |_req| {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(
            body.as_bytes(),
        )))))
    }
}

#[tokio::test]
async fn settings_then_a_request_and_its_answer() {
    let (mut client, _task) = serve(SETTINGS, hello("hello"));
    client.hello(&[]).await;
    let settings = client.next().await.unwrap();
    assert_eq!(settings.kind, Kind::Settings as u8);
    assert_eq!(settings.flags, 0);
    client.get(1, "/").await;
    let ack = client.next_of(Kind::Settings).await.unwrap();
    assert_eq!(ack.flags, FLAG_ACK);
    let head = client.next_of(Kind::Headers).await.unwrap();
    assert_eq!(head.stream, 1);
    assert_eq!(head.flags & FLAG_END_STREAM, 0);
    let fields = client.decode(&head.payload);
    assert_eq!(fields[0], ":status 200");
    assert!(fields.iter().any(|f| f.starts_with("date ")), "{fields:?}");
    assert!(
        fields.contains(&"content-length 5".to_owned()),
        "{fields:?}"
    );
    let data = client.next_of(Kind::Data).await.unwrap();
    assert_eq!(
        (data.stream, data.flags, &data.payload[..]),
        (1, FLAG_END_STREAM, &b"hello"[..])
    );
}

#[tokio::test]
async fn a_connection_at_rest_holds_no_buffer() {
    // One thread (the test's runtime): the server's task runs here, and
    // the spares it gives back are this thread's.
    let (mut client, task) = serve(SETTINGS, hello("hello"));
    assert_eq!(spare::held(), 0, "both buffers taken at the start");
    client.hello(&[]).await;
    for stream in [1, 3] {
        client.get(stream, "/").await;
        let data = client.next_of(Kind::Data).await.unwrap();
        assert_eq!((data.stream, &data.payload[..]), (stream, &b"hello"[..]));
        // Answered and flushed: at rest, its read and write buffers are
        // the worker's again, and taken back when the next request comes.
        assert_eq!(spare::held(), 2, "after stream {stream}");
    }
    drop(client);
    assert!(task.await.unwrap().is_ok());
    assert_eq!(
        spare::held(),
        2,
        "an ended connection leaves both with the worker"
    );
}

#[tokio::test]
async fn a_bad_preface_or_a_first_frame_other_than_settings_is_a_protocol_error() {
    let (mut client, task) = serve(SETTINGS, hello(""));
    client
        .io
        .write_all(b"GET / HTTP/1.1\r\n\r\n and more")
        .await
        .unwrap();
    assert_eq!(client.goaway().await, Some(Reason::PROTOCOL_ERROR));
    assert!(task.await.unwrap().is_err());

    let (mut client, _task) = serve(SETTINGS, hello(""));
    client.io.write_all(frame::PREFACE).await.unwrap();
    client.send(Kind::Ping, 0, 0, &[0; 8]).await;
    assert_eq!(client.goaway().await, Some(Reason::PROTOCOL_ERROR));
}

#[tokio::test]
async fn frame_and_window_errors_close_the_connection_with_their_codes() {
    for (kind, flags, stream, payload, reason) in [
        (Kind::Data, 0, 0, vec![0; 16_385], Reason::FRAME_SIZE_ERROR),
        (Kind::Ping, 0, 0, vec![0; 7], Reason::FRAME_SIZE_ERROR),
        (Kind::Ping, 0, 1, vec![0; 8], Reason::PROTOCOL_ERROR),
        (Kind::Settings, 0, 0, vec![0; 5], Reason::FRAME_SIZE_ERROR),
        (
            Kind::Settings,
            FLAG_ACK,
            0,
            vec![0; 6],
            Reason::FRAME_SIZE_ERROR,
        ),
        (
            Kind::Settings,
            0,
            0,
            vec![0, 4, 0x80, 0, 0, 0],
            Reason::FLOW_CONTROL_ERROR,
        ),
        (
            Kind::Settings,
            0,
            0,
            vec![0, 5, 0, 0, 0x10, 0],
            Reason::PROTOCOL_ERROR,
        ),
        (
            Kind::WindowUpdate,
            0,
            0,
            vec![0, 0, 0, 0],
            Reason::PROTOCOL_ERROR,
        ),
        (
            Kind::WindowUpdate,
            0,
            0,
            vec![0x7f, 0xff, 0xff, 0xff],
            Reason::FLOW_CONTROL_ERROR,
        ),
        (Kind::Data, 0, 1, vec![1], Reason::PROTOCOL_ERROR),
        (
            Kind::RstStream,
            0,
            3,
            vec![0, 0, 0, 8],
            Reason::PROTOCOL_ERROR,
        ),
        (
            Kind::PushPromise,
            FLAG_END_HEADERS,
            1,
            vec![0, 0, 0, 2],
            Reason::PROTOCOL_ERROR,
        ),
        (
            Kind::Headers,
            FLAG_END_HEADERS,
            2,
            request_block("/", &[]),
            Reason::PROTOCOL_ERROR,
        ),
        (
            Kind::Headers,
            FLAG_END_HEADERS,
            1,
            vec![0x80],
            Reason::COMPRESSION_ERROR,
        ),
    ] {
        let (mut client, _task) = serve(SETTINGS, hello(""));
        client.hello(&[]).await;
        client.send(kind, flags, stream, &payload).await;
        assert_eq!(client.goaway().await, Some(reason), "{kind:?} {payload:?}");
    }
}

#[tokio::test]
async fn pings_are_answered_with_their_payload() {
    let (mut client, _task) = serve(SETTINGS, hello(""));
    client.hello(&[]).await;
    client.send(Kind::Ping, 0, 0, b"12345678").await;
    let pong = client.next_of(Kind::Ping).await.unwrap();
    assert_eq!(
        (pong.flags, &pong.payload[..]),
        (FLAG_ACK, &b"12345678"[..])
    );
}

#[tokio::test]
async fn an_answer_waits_for_the_clients_window() {
    let (mut client, _task) = serve(SETTINGS, hello("0123456789abcdefghij"));
    // SETTINGS_INITIAL_WINDOW_SIZE = 8: the stream may take 8 bytes.
    client
        .hello(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 8)])
        .await;
    client.get(1, "/").await;
    let first = client.next_of(Kind::Data).await.unwrap();
    assert_eq!(&first.payload[..], b"01234567");
    assert_eq!(first.flags, 0);
    client
        .send(Kind::WindowUpdate, 0, 1, &100u32.to_be_bytes())
        .await;
    let rest = client.next_of(Kind::Data).await.unwrap();
    assert_eq!(
        (&rest.payload[..], rest.flags),
        (&b"89abcdefghij"[..], FLAG_END_STREAM)
    );
}

#[tokio::test]
async fn a_request_body_streams_and_its_window_comes_back() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&seen);
    let service = move |req: Request<RecvBody>| {
        let counted = Arc::clone(&counted);
        async move {
            let body = req.into_body().collect().await.unwrap();
            let trailer = body.trailers().and_then(|t| t.get("x-sum")).cloned();
            counted.store(body.to_bytes().len(), Ordering::SeqCst);
            let mut answer = Response::new(Full::new(Bytes::from_static(b"done")));
            if let Some(sum) = trailer {
                answer.headers_mut().insert("x-sum", sum);
            }
            Ok(answer)
        }
    };
    let (mut client, _task) = serve(SETTINGS, service);
    client.hello(&[]).await;
    client
        .send(
            Kind::Headers,
            FLAG_END_HEADERS,
            1,
            &request_block("/up", &[]),
        )
        .await;
    // 3 MiB: three times the window the server opens, so it must give
    // the window back as the body is read.
    let chunk = vec![7u8; 16_384];
    let mut given_back = 0usize;
    let mut sent = 0usize;
    let mut window = 1024 * 1024usize;
    while sent < 3 * 1024 * 1024 {
        while window < chunk.len() {
            let update = client
                .next_of(Kind::WindowUpdate)
                .await
                .expect("a window update");
            if update.stream == 0 {
                let n = u32::from_be_bytes(update.payload[..4].try_into().unwrap()) as usize;
                window += n;
                given_back += n;
            }
        }
        client.send(Kind::Data, 0, 1, &chunk).await;
        window -= chunk.len();
        sent += chunk.len();
    }
    let trailers = {
        let mut block = BytesMut::new();
        hpack::encode_field(
            &http::HeaderName::from_static("x-sum"),
            b"42",
            false,
            &mut block,
        );
        block
    };
    client
        .send(
            Kind::Headers,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &trailers,
        )
        .await;
    let head = client.next_of(Kind::Headers).await.unwrap();
    let fields = client.decode(&head.payload);
    assert!(fields.contains(&"x-sum 42".to_owned()), "{fields:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 3 * 1024 * 1024);
    assert!(given_back >= 2 * 1024 * 1024, "{given_back}");
}

#[tokio::test]
async fn a_reset_cancels_the_streams_future() {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    let service = move |_req: Request<RecvBody>| {
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let guard = Guard(Arc::clone(&flag));
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok(Response::new(Full::new(Bytes::new())))
        }
    };
    let (mut client, _task) = serve(SETTINGS, service);
    client.hello(&[]).await;
    client.get(1, "/slow").await;
    client.send(Kind::Ping, 0, 0, &[1; 8]).await;
    client.next_of(Kind::Ping).await.unwrap();
    assert!(!dropped.load(Ordering::SeqCst));
    client
        .send(Kind::RstStream, 0, 1, &8u32.to_be_bytes())
        .await;
    client.send(Kind::Ping, 0, 0, &[2; 8]).await;
    client.next_of(Kind::Ping).await.unwrap();
    assert!(
        dropped.load(Ordering::SeqCst),
        "the future outlived its stream"
    );
}

#[tokio::test]
async fn a_rapid_reset_flood_is_told_to_calm_down() {
    let started = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&started);
    let service = move |_req: Request<RecvBody>| {
        count.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Answer>()
    };
    let settings = Settings {
        max_concurrent_streams: 100,
        ..SETTINGS
    };
    let (mut client, task) = serve(settings, service);
    client.hello(&[]).await;
    let mut flood = BytesMut::new();
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        let block = request_block("/", &[]);
        frame::head(
            &mut flood,
            block.len(),
            Kind::Headers,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            id,
        );
        flood.put_slice(&block);
        frame::head(&mut flood, 4, Kind::RstStream, 0, id);
        flood.put_u32(8);
    }
    let _ = client.io.write_all(&flood).await;
    assert_eq!(client.goaway().await, Some(Reason::ENHANCE_YOUR_CALM));
    assert!(task.await.unwrap().is_err());
    // Bounded: the flood stopped at the limit, not at its end.
    assert!(
        started.load(Ordering::SeqCst) <= 201,
        "{}",
        started.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn a_flood_of_tiny_data_frames_is_queued_as_a_few_copies() {
    // The body is read only once every frame has been taken (the PING
    // after them is answered): 20 000 one-byte DATA frames reach the
    // reader as a few chunks, not 20 000 slices of the read buffers.
    let chunks = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&chunks);
    let go = Arc::new(tokio::sync::Notify::new());
    let wait = Arc::clone(&go);
    let service = move |req: Request<RecvBody>| {
        let (counted, wait) = (Arc::clone(&counted), Arc::clone(&wait));
        async move {
            wait.notified().await;
            let mut body = req.into_body();
            let mut bytes = 0;
            while let Some(frame) = body.frame().await {
                let data = frame.unwrap().into_data().unwrap();
                assert!(data.iter().all(|&b| b == 7));
                bytes += data.len();
                counted.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Response::new(Full::new(Bytes::from(bytes.to_string()))))
        }
    };
    let (mut client, _task) = serve(SETTINGS, service);
    client.hello(&[]).await;
    let block = request_block("/up", &[]);
    client
        .send(Kind::Headers, FLAG_END_HEADERS, 1, &block)
        .await;
    let mut flood = BytesMut::new();
    for _ in 0..20_000 {
        frame::head(&mut flood, 1, Kind::Data, 0, 1);
        flood.put_u8(7);
    }
    frame::head(&mut flood, 0, Kind::Data, FLAG_END_STREAM, 1);
    client.io.write_all(&flood).await.unwrap();
    client.send(Kind::Ping, 0, 0, b"allthere").await;
    client.next_of(Kind::Ping).await.expect("the PING's answer");
    go.notify_one();
    client.next_of(Kind::Headers).await.expect("the answer");
    let data = client.next_of(Kind::Data).await.unwrap();
    assert_eq!(&data.payload[..], b"20000");
    // The first frame as it came, 16 KiB copied together, the rest.
    assert_eq!(chunks.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_flood_of_empty_data_frames_is_told_to_calm_down() {
    let service = |_req: Request<RecvBody>| std::future::pending::<Answer>();
    let (mut client, task) = serve(SETTINGS, service);
    client.hello(&[]).await;
    let block = request_block("/up", &[]);
    client
        .send(Kind::Headers, FLAG_END_HEADERS, 1, &block)
        .await;
    // 64 in a row are let through; a frame with a payload starts the
    // count again.
    for _ in 0..64 {
        client.send(Kind::Data, 0, 1, &[]).await;
    }
    client.send(Kind::Data, 0, 1, b"x").await;
    for _ in 0..64 {
        client.send(Kind::Data, 0, 1, &[]).await;
    }
    client.send(Kind::Ping, 0, 0, b"stillok!").await;
    let pong = client.next_of(Kind::Ping).await.expect("still served");
    assert_eq!(&pong.payload[..], b"stillok!");
    client.send(Kind::Data, 0, 1, &[]).await;
    assert_eq!(client.goaway().await, Some(Reason::ENHANCE_YOUR_CALM));
    assert!(task.await.unwrap().is_err());
}

#[tokio::test]
async fn a_header_block_that_never_ends_is_bounded() {
    let (mut client, _task) = serve(SETTINGS, hello(""));
    client.hello(&[]).await;
    client
        .send(Kind::Headers, 0, 1, &request_block("/", &[]))
        .await;
    let filler = [0u8; 1000];
    let mut reason = None;
    for _ in 0..100 {
        client.send(Kind::Continuation, 0, 1, &filler).await;
        if let Ok(Some(frame)) =
            tokio::time::timeout(Duration::from_millis(1), client.next_of(Kind::GoAway)).await
        {
            reason = Some(u32::from_be_bytes(frame.payload[4..8].try_into().unwrap()));
            break;
        }
    }
    let reason = match reason {
        Some(code) => Reason(code),
        None => client.goaway().await.unwrap(),
    };
    assert_eq!(reason, Reason::ENHANCE_YOUR_CALM);
}

/// The RST_STREAM's stream and error code.
pub(super) fn reset_of(frame: &Frame) -> (u32, Reason) {
    let code = u32::from_be_bytes(frame.payload[..4].try_into().unwrap());
    (frame.stream, Reason(code))
}

#[tokio::test]
async fn priority_errors_reset_their_stream_and_hpack_stays_in_step() {
    // Answers with the request's `x-tag`.
    let echo = |req: Request<RecvBody>| {
        let tag = req.headers().get("x-tag").map(|v| v.as_bytes().to_vec());
        std::future::ready(Ok(Response::new(Full::new(Bytes::from(
            tag.unwrap_or_default(),
        )))))
    };
    let (mut client, _task) = serve(SETTINGS, echo);
    client.hello(&[]).await;
    // §6.3: a PRIORITY of 4 bytes; §5.3.1: one naming its own stream;
    // one naming another stream is read and left.
    client.send(Kind::Priority, 0, 3, &[0, 0, 0, 1]).await;
    let reset = client.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(reset_of(&reset), (3, Reason::FRAME_SIZE_ERROR));
    client
        .send(Kind::Priority, 0, 5, &[0x80, 0, 0, 5, 16])
        .await;
    let reset = client.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(reset_of(&reset), (5, Reason::PROTOCOL_ERROR));
    client.send(Kind::Priority, 0, 7, &[0, 0, 0, 1, 16]).await;

    // A request whose priority fields name its own stream, its block
    // adding `x-tag: one` to HPACK's table: reset, never served, and the
    // table keeps the entry for the next request, which names it by
    // index (62).
    let mut payload = vec![0x80, 0, 0, 9, 16];
    payload.extend(request_block("/", &[]));
    payload.extend([0x40, 5]);
    payload.extend(b"x-tag");
    payload.push(3);
    payload.extend(b"one");
    let flags = FLAG_END_HEADERS | FLAG_END_STREAM | frame::FLAG_PRIORITY;
    client.send(Kind::Headers, flags, 9, &payload).await;
    let reset = client.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(reset_of(&reset), (9, Reason::PROTOCOL_ERROR));
    let mut block = request_block("/", &[]);
    block.push(0x80 | 62);
    client
        .send(
            Kind::Headers,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            11,
            &block,
        )
        .await;
    let head = client.next_of(Kind::Headers).await.unwrap();
    assert_eq!(head.stream, 11);
    let data = client.next_of(Kind::Data).await.unwrap();
    assert_eq!((data.stream, &data.payload[..]), (11, &b"one"[..]));
}

#[tokio::test]
async fn continuation_must_follow_its_headers() {
    let (mut client, _task) = serve(SETTINGS, hello(""));
    client.hello(&[]).await;
    let block = request_block("/", &[]);
    client
        .send(Kind::Headers, FLAG_END_STREAM, 1, &block[..3])
        .await;
    client.send(Kind::Ping, 0, 0, &[0; 8]).await;
    assert_eq!(client.goaway().await, Some(Reason::PROTOCOL_ERROR));

    // Split over HEADERS and two CONTINUATIONs, it is one request.
    let (mut client, _task) = serve(SETTINGS, hello("split"));
    client.hello(&[]).await;
    client
        .send(Kind::Headers, FLAG_END_STREAM, 1, &block[..3])
        .await;
    client.send(Kind::Continuation, 0, 1, &block[3..6]).await;
    client
        .send(Kind::Continuation, FLAG_END_HEADERS, 1, &block[6..])
        .await;
    let data = client.next_of(Kind::Data).await.unwrap();
    assert_eq!(&data.payload[..], b"split");
}

#[tokio::test]
async fn a_header_list_over_the_limit_is_answered_431_and_the_connection_goes_on() {
    let (mut client, _task) = serve(SETTINGS, hello("fine"));
    client.hello(&[]).await;
    let long = "x".repeat(1100);
    let block = request_block("/", &[("x-long", &long)]);
    client
        .send(Kind::Headers, FLAG_END_HEADERS | FLAG_END_STREAM, 1, &block)
        .await;
    let head = client.next_of(Kind::Headers).await.unwrap();
    assert_eq!(client.decode(&head.payload)[0], ":status 431");
    assert_eq!(head.flags & FLAG_END_STREAM, FLAG_END_STREAM);
    client.get(3, "/").await;
    let data = client.next_of(Kind::Data).await.unwrap();
    assert_eq!((data.stream, &data.payload[..]), (3, &b"fine"[..]));
}

#[tokio::test]
async fn streams_past_the_limit_are_refused() {
    let service = |_req: Request<RecvBody>| std::future::pending::<Answer>();
    let (mut client, _task) = serve(SETTINGS, service);
    client.hello(&[]).await;
    for id in [1, 3, 5, 7, 9] {
        client.get(id, "/").await;
    }
    let refused = client.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(refused.stream, 9);
    assert_eq!(
        &refused.payload[..],
        &Reason::REFUSED_STREAM.0.to_be_bytes()
    );
}

#[tokio::test]
async fn malformed_requests_are_reset_and_the_connection_goes_on() {
    let (mut client, _task) = serve(SETTINGS, hello("ok"));
    client.hello(&[]).await;
    let block = request_block("/", &[("connection", "close")]);
    client
        .send(Kind::Headers, FLAG_END_HEADERS | FLAG_END_STREAM, 1, &block)
        .await;
    let reset = client.next_of(Kind::RstStream).await.unwrap();
    assert_eq!(
        (reset.stream, &reset.payload[..]),
        (1, &Reason::PROTOCOL_ERROR.0.to_be_bytes()[..])
    );
    client.get(3, "/").await;
    let data = client.next_of(Kind::Data).await.unwrap();
    assert_eq!(data.stream, 3);
}

#[tokio::test]
async fn a_graceful_shutdown_lets_open_streams_finish() {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let mut rx = Some(rx);
    let service = move |_req: Request<RecvBody>| {
        let rx = rx.take();
        async move {
            if let Some(rx) = rx {
                let _ = rx.await;
            }
            Answer::Ok(Response::new(Full::new(Bytes::from_static(b"late"))))
        }
    };
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let mut client = Client {
        io: client_io,
        read: BytesMut::new(),
        decoder: Decoder::new(4096),
    };
    let mut conn = Box::pin(Connection::new(server_io, SETTINGS, service));
    client.hello(&[]).await;
    client.get(1, "/").await;
    // Let the connection take the request, then ask it to shut down.
    let _ = tokio::time::timeout(Duration::from_millis(50), conn.as_mut()).await;
    conn.as_mut().get_mut().graceful_shutdown();
    let server = tokio::spawn(conn);
    let first = client.next_of(Kind::GoAway).await.unwrap();
    assert_eq!(&first.payload[..4], &frame::MAX_STREAM_ID.to_be_bytes());
    let ping = client.next_of(Kind::Ping).await.unwrap();
    client.send(Kind::Ping, FLAG_ACK, 0, &ping.payload).await;
    let last = client.next_of(Kind::GoAway).await.unwrap();
    assert_eq!(&last.payload[..8], &[0, 0, 0, 1, 0, 0, 0, 0]);
    // A stream opened after the final GOAWAY is ignored; stream 1 ends.
    client.get(3, "/").await;
    tx.send(()).unwrap();
    let data = client.next_of(Kind::Data).await.unwrap();
    assert_eq!((data.stream, &data.payload[..]), (1, &b"late"[..]));
    assert!(server.await.unwrap().is_ok());
}

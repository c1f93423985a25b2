//! gRPC through the real binary (DESIGN §18), with real gRPC peers on
//! both ends: tonic servers and clients (plain and gRPC-Web), and a
//! C-core server (Python `grpcio`) where it is installed, which is what
//! refused calls before `te: trailers` was forwarded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::{Buf, Bytes};
use http::uri::PathAndQuery;
use serde_json::{json, Value};
use tokio_stream::StreamExt;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Status};

use crate::harness::*;

/// The one message every method of `test.Echo` takes and returns.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Msg {
    #[prost(string, tag = "1")]
    pub text: String,
    #[prost(bytes = "vec", tag = "2")]
    pub blob: Vec<u8>,
    /// Server streaming: how many messages to send.
    #[prost(uint32, tag = "3")]
    pub count: u32,
    /// Milliseconds to wait before answering (or between messages).
    #[prost(uint64, tag = "4")]
    pub delay_ms: u64,
}

pub(crate) type Codec = tonic_prost::ProstCodec<Msg, Msg>;
const LIMIT: usize = 64 << 20;
const MIB: usize = 1 << 20;

/// What a backend saw.
#[derive(Default)]
struct Seen {
    calls: AtomicU32,
    cancelled: AtomicU32,
    /// The `grpc-timeout` of each call that had one.
    timeouts: Mutex<Vec<String>>,
    /// Whether each call came with `te: trailers`.
    te: Mutex<Vec<String>>,
    /// `host` fields beside `:authority` (strict servers refuse them).
    hosts: Mutex<Vec<String>>,
}

/// `test.Echo`: Unary, Stream (server streaming), Collect (client
/// streaming) and Chat (bidirectional).
#[derive(Clone)]
struct Echo {
    seen: Arc<Seen>,
    /// Every call fails with this status (trailers-only).
    fail_with: Option<Code>,
}

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;
type MsgStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Msg, Status>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            this.seen.calls.fetch_add(1, Ordering::SeqCst);
            this.note(req.headers());
            let mut grpc = tonic::server::Grpc::new(Codec::default())
                .max_decoding_message_size(LIMIT)
                .max_encoding_message_size(LIMIT);
            let path = req.uri().path().to_owned();
            let response = match path.as_str() {
                "/test.Echo/Unary" => {
                    let echo = this.clone();
                    grpc.unary(tower::service_fn(move |r| echo.clone().unary(r)), req)
                        .await
                }
                "/test.Echo/Stream" => {
                    let echo = this.clone();
                    grpc.server_streaming(tower::service_fn(move |r| echo.clone().stream(r)), req)
                        .await
                }
                "/test.Echo/Collect" => {
                    grpc.client_streaming(tower::service_fn(collect), req).await
                }
                "/test.Echo/Chat" => grpc.streaming(tower::service_fn(chat), req).await,
                _ => Status::unimplemented(path).into_http(),
            };
            Ok(response)
        })
    }
}

impl Echo {
    fn note(&self, headers: &http::HeaderMap) {
        let header = |name: &str| {
            headers
                .get(name)
                .map(|v| v.to_str().unwrap_or("?").to_owned())
        };
        if let Some(timeout) = header("grpc-timeout") {
            self.seen.timeouts.lock().unwrap().push(timeout);
        }
        self.seen
            .te
            .lock()
            .unwrap()
            .push(header("te").unwrap_or_default());
        if let Some(host) = header("host") {
            self.seen.hosts.lock().unwrap().push(host);
        }
    }

    async fn unary(self, request: Request<Msg>) -> Result<tonic::Response<Msg>, Status> {
        if let Some(code) = self.fail_with {
            return Err(Status::new(code, "backend says no"));
        }
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap_or("?").to_owned());
        let msg = request.into_inner();
        if msg.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(msg.delay_ms)).await;
        }
        match msg.text.as_str() {
            "fail" => {
                let mut metadata = MetadataMap::new();
                metadata.insert_bin("x-detail-bin", MetadataValue::from_bytes(&[0, 159, 255, 1]));
                metadata.insert("x-reason", "bad-text".parse().unwrap());
                Err(Status::with_details_and_metadata(
                    Code::InvalidArgument,
                    "text may not be 'fail'",
                    Bytes::from_static(b"\x08\x2a details \xff"),
                    metadata,
                ))
            }
            "timeout?" => Ok(tonic::Response::new(Msg {
                text: timeout.unwrap_or_default(),
                ..Msg::default()
            })),
            _ => Ok(tonic::Response::new(msg)),
        }
    }

    async fn stream(self, request: Request<Msg>) -> Result<tonic::Response<MsgStream>, Status> {
        let msg = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let seen = Arc::clone(&self.seen);
        tokio::spawn(async move {
            for i in 0..msg.count {
                if i > 0 && msg.delay_ms > 0 {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(msg.delay_ms)) => {}
                        _ = tx.closed() => break,
                    }
                }
                let item = Msg {
                    text: format!("{}-{i}", msg.text),
                    ..Msg::default()
                };
                if tx.send(Ok(item)).await.is_err() {
                    break;
                }
            }
            if tx.is_closed() {
                seen.cancelled.fetch_add(1, Ordering::SeqCst);
            }
        });
        let stream: MsgStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(tonic::Response::new(stream))
    }
}

async fn collect(request: Request<tonic::Streaming<Msg>>) -> Result<tonic::Response<Msg>, Status> {
    let mut stream = request.into_inner();
    let mut texts = Vec::new();
    while let Some(msg) = stream.message().await? {
        texts.push(msg.text);
    }
    Ok(tonic::Response::new(Msg {
        count: texts.len() as u32,
        text: texts.join(","),
        ..Msg::default()
    }))
}

async fn chat(
    request: Request<tonic::Streaming<Msg>>,
) -> Result<tonic::Response<MsgStream>, Status> {
    let stream = request.into_inner().map(|m| {
        m.map(|m| Msg {
            text: format!("re:{}", m.text),
            ..Msg::default()
        })
    });
    let stream: MsgStream = Box::pin(stream);
    Ok(tonic::Response::new(stream))
}

/// A tonic server for `echo` (and the standard health service, when
/// given) on an ephemeral loopback port, over h2c.
pub(crate) struct GrpcBackend {
    pub(crate) addr: SocketAddr,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcBackend {
    pub(crate) async fn start(fail_with: Option<Code>) -> Self {
        Self::start_with(fail_with, None::<Echo>).await
    }

    /// With another service beside `test.Echo` (the health service).
    async fn start_with<S>(fail_with: Option<Code>, other: Option<S>) -> Self
    where
        S: tower::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
                Error = Infallible,
            > + tonic::server::NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let echo = Echo {
            seen: Arc::clone(&seen),
            fail_with,
        };
        let mut routes = tonic::service::Routes::new(echo);
        if let Some(other) = other {
            routes = routes.add_service(other);
        }
        let service = hyper_util::service::TowerToHyperService::new(routes.prepare());
        // Served by hyper directly, not `tonic::transport::Server`: that
        // one wraps every service in its own `grpc-timeout` enforcement,
        // which would race the gateway's deadline (the deadline test must
        // see the gateway's DEADLINE_EXCEEDED, not tonic's CANCELLED).
        // The connections live in the accept task's set, so dropping the
        // backend ends them all, as a server that went away would.
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                connections.spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .http2_only()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        GrpcBackend { addr, seen, task }
    }

    pub(crate) fn calls(&self) -> u32 {
        self.seen.calls.load(Ordering::SeqCst)
    }
}

impl Drop for GrpcBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) type Client = tonic::client::Grpc<tonic::transport::Channel>;

pub(crate) async fn connect(addr: SocketAddr) -> Client {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
        .max_decoding_message_size(LIMIT)
        .max_encoding_message_size(LIMIT)
}

pub(crate) fn path(method: &str) -> PathAndQuery {
    PathAndQuery::try_from(format!("/test.Echo/{method}")).unwrap()
}

pub(crate) fn msg(text: &str) -> Msg {
    Msg {
        text: text.to_owned(),
        ..Msg::default()
    }
}

/// The texts of a server-streaming call for `count` messages of `text`,
/// over any client (plain gRPC or gRPC-Web).
async fn streamed<T>(client: &mut tonic::client::Grpc<T>, text: &str, count: u32) -> Vec<String>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let ready: Result<(), Box<dyn std::error::Error + Send + Sync>> =
        client.ready().await.map_err(Into::into);
    ready.unwrap();
    let request = Msg { count, ..msg(text) };
    let mut stream = client
        .server_streaming(Request::new(request), path("Stream"), Codec::default())
        .await
        .unwrap()
        .into_inner();
    let mut texts = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        texts.push(m.text);
    }
    texts
}

pub(crate) async fn unary(
    client: &mut Client,
    request: Request<Msg>,
) -> Result<tonic::Response<Msg>, Status> {
    client.ready().await.unwrap();
    client.unary(request, path("Unary"), Codec::default()).await
}

/// The gateway in front of `backends` (h2c) for the `test.Echo/`
/// service, with the access log on; `route` and `upstream` add lines.
fn grpc_config(backends: &[SocketAddr], route: &str, upstream: &str) -> String {
    Config::new()
        .metrics()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener("web", "")
        .route(
            "echo",
            &format!(
                "listeners = [\"web\"]\npath_prefix = \"/test.Echo/\"\nupstream = \"app\"\n{route}"
            ),
        )
        .upstream("app", backends, &format!("protocol = \"h2c\"\n{upstream}"))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_every_kind_pass_with_their_messages_status_and_metadata() {
    let backend = GrpcBackend::start(None).await;
    let gw = Gateway::start(&grpc_config(&[backend.addr], "", ""));
    let mut client = connect(gw.listener("web")).await;

    // Unary, 16 MiB each way.
    let big = Msg {
        text: "big".into(),
        blob: (0..16 * MIB).map(|i| (i % 251) as u8).collect(),
        ..Msg::default()
    };
    let answer = unary(&mut client, Request::new(big.clone())).await.unwrap();
    assert!(
        answer.get_ref() == &big,
        "the 16 MiB message came back changed"
    );

    // Server streaming.
    assert_eq!(
        streamed(&mut client, "s", 5).await,
        ["s-0", "s-1", "s-2", "s-3", "s-4"]
    );

    // Client streaming.
    client.ready().await.unwrap();
    let outbound = tokio_stream::iter(["a", "b", "c", "d"].map(msg));
    let answer = client
        .client_streaming(Request::new(outbound), path("Collect"), Codec::default())
        .await
        .unwrap();
    assert_eq!(answer.get_ref().text, "a,b,c,d");
    assert_eq!(answer.get_ref().count, 4);

    // Bidirectional, in lock step: each answer must arrive before the next
    // message is sent, so nothing may wait for the end of either stream.
    client.ready().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
    tx.send(msg("one")).await.unwrap();
    let mut inbound = client
        .streaming(Request::new(outbound), path("Chat"), Codec::default())
        .await
        .unwrap()
        .into_inner();
    for word in ["one", "two", "three"] {
        if word != "one" {
            tx.send(msg(word)).await.unwrap();
        }
        let answer = tokio::time::timeout(Duration::from_secs(5), inbound.message())
            .await
            .expect("each answer arrives before the stream ends")
            .unwrap()
            .unwrap();
        assert_eq!(answer.text, format!("re:{word}"));
    }
    drop(tx);
    assert!(inbound.message().await.unwrap().is_none());

    // A status with details and binary metadata, unchanged.
    let status = unary(&mut client, Request::new(msg("fail")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "text may not be 'fail'");
    assert_eq!(status.details(), b"\x08\x2a details \xff");
    let binary = status
        .metadata()
        .get_bin("x-detail-bin")
        .expect("binary metadata");
    assert_eq!(binary.to_bytes().unwrap().as_ref(), &[0, 159, 255, 1]);
    assert_eq!(status.metadata().get("x-reason").unwrap(), "bad-text");

    // Every call reached the backend with `te: trailers` (C-core servers
    // refuse calls without it).
    assert!(backend
        .seen
        .te
        .lock()
        .unwrap()
        .iter()
        .all(|te| te == "trailers"));
    // And without a `host` that differs from `:authority` (nginx refuses
    // such a request with 400).
    assert_eq!(*backend.seen.hosts.lock().unwrap(), Vec::<String>::new());

    // The access log and the metric name each call's status.
    let lines = access_lines(&gw.path("access.log"), 5).await;
    let statuses: Vec<Value> = lines.iter().map(|l| l["grpc_status"].clone()).collect();
    assert_eq!(
        statuses,
        [json!(0), json!(0), json!(0), json!(0), json!(3)],
        "{lines:?}"
    );
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(
            &metrics,
            "cutover_grpc_responses_total",
            &["route=\"echo\"", "code=\"ok\""]
        ),
        4.0
    );
    assert_eq!(
        sample(
            &metrics,
            "cutover_grpc_responses_total",
            &["code=\"invalid_argument\""]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_clients_that_ask_for_trailers_get_them_chunked() {
    let backend = GrpcBackend::start(None).await;
    let gw = Gateway::start(&grpc_config(&[backend.addr], "", ""));
    let message = prost::Message::encode_to_vec(&msg("over h1"));
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    let mut request = format!(
        "POST /test.Echo/Unary HTTP/1.1\r\nhost: x\r\ncontent-type: application/grpc\r\nte: trailers\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let answer = raw_exchange(gw.listener("web"), &request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{answer}"
    );
    assert!(answer.contains("over h1"), "{answer}");
    // The trailer section after the last chunk.
    let tail = answer.rsplit("\r\n0\r\n").next().unwrap_or_default();
    assert!(
        tail.contains("grpc-status: 0"),
        "no trailers after the last chunk: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_gateway_answers_itself_is_a_grpc_status() {
    let backend = GrpcBackend::start(None).await;
    let closed = refusing_addr();
    let http1 = Backend::named("not grpc").await;
    let config = Config::new()
        .metrics()
        .listener("web", "")
        .route("echo", "listeners = [\"web\"]\npath_prefix = \"/test.Echo/\"\nupstream = \"app\"")
        .route("down", "listeners = [\"web\"]\npath_prefix = \"/down.Svc/\"\nupstream = \"down\"")
        .route("old", "listeners = [\"web\"]\npath_prefix = \"/old.Svc/\"\nupstream = \"old\"")
        .route(
            "limited",
            // To a method that reads the whole message before answering:
            // an unknown one is refused on its head, and that answer could
            // overtake the cut of the body.
            "listeners = [\"web\"]\npath_prefix = \"/limited.Svc/\"\nrewrite = { replace_prefix = \"/test.Echo/\" }\nupstream = \"app\"\nmax_request_body = 64",
        )
        .upstream("app", &[backend.addr], "protocol = \"h2c\"")
        .upstream("down", &[closed], "protocol = \"h2c\"")
        .upstream("old", &[http1.addr], "")
        .build();
    let gw = Gateway::start(&config);
    let mut client = connect(gw.listener("web")).await;
    let call = |client: &mut Client, service: &'static str, text: &str| {
        let request = Request::new(msg(text));
        let mut client = client.clone();
        async move {
            client.ready().await.unwrap();
            let path = PathAndQuery::from_static(service);
            client.unary(request, path, Codec::default()).await
        }
    };
    let no_route = call(&mut client, "/nowhere.Svc/Call", "x")
        .await
        .unwrap_err();
    assert_eq!(no_route.code(), Code::Unimplemented, "{no_route:?}");
    assert_eq!(no_route.message(), "no route for this method");
    let down = call(&mut client, "/down.Svc/Call", "x").await.unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert_eq!(down.message(), "could not connect to a backend");
    let old = call(&mut client, "/old.Svc/Call", "x").await.unwrap_err();
    assert_eq!(old.code(), Code::Unavailable, "{old:?}");
    assert!(old.message().contains("HTTP/1.1"), "{old:?}");
    let big = call(&mut client, "/limited.Svc/Unary", &"x".repeat(100))
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::ResourceExhausted, "{big:?}");
    // Still a working gateway for the calls that have a way.
    assert_eq!(
        call(&mut client, "/test.Echo/Unary", "ok")
            .await
            .unwrap()
            .get_ref()
            .text,
        "ok"
    );
    let metrics = scrape(&gw).await;
    let count = |code: &str| {
        sample(
            &metrics,
            "cutover_grpc_responses_total",
            &[&format!("code=\"{code}\"")],
        )
    };
    assert_eq!(count("unimplemented"), 1.0, "{metrics}");
    assert_eq!(count("unavailable"), 2.0);
    assert_eq!(count("resource_exhausted"), 1.0);
    assert_eq!(count("ok"), 1.0);
    // The route's own records count the failures as what they stand for,
    // not as the 200 that carried them.
    assert_eq!(
        sample(
            &metrics,
            "cutover_requests_total",
            &["route=\"down\"", "class=\"5xx\""]
        ),
        1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_are_the_smaller_of_grpc_timeout_and_the_route_timeout() {
    let backend = GrpcBackend::start(None).await;
    let gw = Gateway::start(&grpc_config(&[backend.addr], "timeout = \"1s\"", ""));
    let mut client = connect(gw.listener("web")).await;
    let seen_timeout = |answer: tonic::Response<Msg>| -> Duration {
        let text = &answer.get_ref().text;
        let (digits, unit) = text.split_at(text.len() - 1);
        let n: u64 = digits
            .parse()
            .unwrap_or_else(|_| panic!("grpc-timeout {text:?}"));
        match unit {
            "n" => Duration::from_nanos(n),
            "u" => Duration::from_micros(n),
            "m" => Duration::from_millis(n),
            "S" => Duration::from_secs(n),
            other => panic!("unit {other}"),
        }
    };
    // The client's 300 ms: the backend is sent what is left of it.
    let mut request = Request::new(msg("timeout?"));
    request.set_timeout(Duration::from_millis(300));
    let left = seen_timeout(unary(&mut client, request).await.unwrap());
    assert!(
        left <= Duration::from_millis(300) && left > Duration::from_millis(200),
        "{left:?}"
    );
    // The client's 10 s against the route's 1 s: the route's.
    let mut request = Request::new(msg("timeout?"));
    request.set_timeout(Duration::from_secs(10));
    let left = seen_timeout(unary(&mut client, request).await.unwrap());
    assert!(
        left <= Duration::from_secs(1) && left > Duration::from_millis(800),
        "{left:?}"
    );

    // A slow answer: DEADLINE_EXCEEDED at the deadline, the route's 1 s
    // (the client's own timer, at 10 s, plays no part).
    let mut request = Request::new(Msg {
        delay_ms: 3000,
        ..msg("slow")
    });
    request.set_timeout(Duration::from_secs(10));
    let started = Instant::now();
    let status = unary(&mut client, request).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let elapsed = started.elapsed();
    assert!(
        elapsed > Duration::from_millis(900) && elapsed < Duration::from_millis(1800),
        "{elapsed:?}"
    );

    // A stream that outlives its deadline is ended by the gateway with
    // DEADLINE_EXCEEDED after the messages sent in time (the backend
    // would go on: it keeps no deadline of its own for a stream).
    client.ready().await.unwrap();
    let mut request = Request::new(Msg {
        count: 100,
        delay_ms: 200,
        ..msg("tick")
    });
    request.set_timeout(Duration::from_millis(700));
    let started = Instant::now();
    let mut stream = client
        .server_streaming(request, path("Stream"), Codec::default())
        .await
        .unwrap()
        .into_inner();
    let mut received = 0;
    let status = loop {
        match stream.message().await {
            Ok(Some(_)) => received += 1,
            Ok(None) => panic!("the stream ended without a status after {received}"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!((2..=5).contains(&received), "{received} messages in 700 ms");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );

    // A `grpc-timeout` not of the protocol's form is ignored, counted,
    // and not passed on.
    let mut request = Request::new(msg("timeout?"));
    request
        .metadata_mut()
        .insert("grpc-timeout", "1.5S".parse().unwrap());
    let answer = unary(&mut client, request).await.unwrap();
    assert_eq!(answer.get_ref().text, "", "the backend saw a grpc-timeout");
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(&metrics, "cutover_grpc_timeout_invalid_total", &[]),
        1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_calls_are_retried_on_another_backend() {
    let failing = GrpcBackend::start(Some(Code::Unavailable)).await;
    let working = GrpcBackend::start(None).await;
    let gw = Gateway::start(&grpc_config(
        &[failing.addr, working.addr],
        "retry = { attempts = 2, on = [\"grpc:unavailable\"], methods = [\"POST\"] }",
        "",
    ));
    let mut client = connect(gw.listener("web")).await;
    for i in 0..10 {
        let answer = unary(&mut client, Request::new(msg(&format!("call {i}"))))
            .await
            .unwrap_or_else(|status| panic!("call {i}: {status:?}"));
        assert_eq!(answer.get_ref().text, format!("call {i}"));
    }
    assert!(
        failing.calls() >= 3,
        "round robin sent {} to the failing one",
        failing.calls()
    );
    assert_eq!(working.calls(), 10);
    // A backend that refuses connections never read the call's body: the
    // body (which had arrived with the call) is sent again all the same.
    let gw = Gateway::start(&grpc_config(
        &[refusing_addr(), working.addr],
        "retry = { attempts = 2, on = [\"connect_failure\"], methods = [\"POST\"] }",
        "",
    ));
    let mut client = connect(gw.listener("web")).await;
    for i in 0..6 {
        let answer = unary(&mut client, Request::new(msg(&format!("again {i}"))))
            .await
            .unwrap_or_else(|status| panic!("call {i}: {status:?}"));
        assert_eq!(answer.get_ref().text, format!("again {i}"));
    }
    // A status the route does not name is the answer.
    let refusing = GrpcBackend::start(Some(Code::PermissionDenied)).await;
    let gw = Gateway::start(&grpc_config(
        &[refusing.addr, working.addr],
        "retry = { attempts = 2, on = [\"grpc:unavailable\"], methods = [\"POST\"] }",
        "",
    ));
    let mut client = connect(gw.listener("web")).await;
    let mut denied = 0;
    for _ in 0..4 {
        if unary(&mut client, Request::new(msg("x"))).await.is_err() {
            denied += 1;
        }
    }
    assert_eq!(denied, 2, "PERMISSION_DENIED is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_checks_flip_a_backend_out_and_back() {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("test.Echo", tonic_health::ServingStatus::Serving)
        .await;
    let checked = GrpcBackend::start_with(None, Some(health)).await;
    let other = GrpcBackend::start(None).await;
    let gw = Gateway::start(&grpc_config(
        &[checked.addr],
        "",
        "health = { grpc = \"test.Echo\", interval = \"200ms\", timeout = \"150ms\", unhealthy_after = 1, healthy_after = 1 }",
    ));
    let state = |addr| {
        let gw = &gw;
        async move {
            let (_, view) =
                admin_request(gw.admin, "GET", "/admin/runtime/backends", None, None).await;
            crate::resilience::backend_in(&view, addr)["health"].clone()
        }
    };
    let wait = |want: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let health = state(checked.addr).await;
            if health == want {
                return;
            }
            assert!(Instant::now() < deadline, "never {want}: {health}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait("healthy").await;
    reporter
        .set_service_status("test.Echo", tonic_health::ServingStatus::NotServing)
        .await;
    wait("unhealthy").await;
    reporter
        .set_service_status("test.Echo", tonic_health::ServingStatus::Serving)
        .await;
    wait("healthy").await;
    // A server without the health service fails the check (UNIMPLEMENTED).
    let gw2 = Gateway::start(&grpc_config(
        &[other.addr],
        "",
        "health = { grpc = \"\", interval = \"200ms\", timeout = \"150ms\", unhealthy_after = 1 }",
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, view) =
            admin_request(gw2.admin, "GET", "/admin/runtime/backends", None, None).await;
        let backend = crate::resilience::backend_in(&view, other.addr);
        if backend["health"] == "unhealthy" {
            let detail = backend.to_string();
            assert!(detail.contains("unimplemented"), "{detail}");
            break;
        }
        assert!(Instant::now() < deadline, "never unhealthy: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_cancels_the_backend_call() {
    let backend = GrpcBackend::start(None).await;
    let gw = Gateway::start(&grpc_config(&[backend.addr], "", ""));
    let mut client = connect(gw.listener("web")).await;
    client.ready().await.unwrap();
    let request = Msg {
        count: 1000,
        delay_ms: 50,
        ..msg("c")
    };
    let mut stream = client
        .server_streaming(Request::new(request), path("Stream"), Codec::default())
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        stream.message().await.unwrap().unwrap();
    }
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.seen.cancelled.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the backend's stream was never cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(
            &metrics,
            "cutover_grpc_responses_total",
            &["code=\"cancelled\""]
        ),
        1.0,
        "{metrics}"
    );
}

/// A raw h2c backend whose one answer sends a message and then breaks
/// its stream (RST_STREAM), as a crashing server does.
async fn breaking_backend() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    let (mut tx, body) =
                        http_body_util::channel::Channel::<Bytes, std::io::Error>::new(4);
                    tokio::spawn(async move {
                        let message = prost::Message::encode_to_vec(&msg("first"));
                        let mut frame = vec![0u8];
                        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
                        frame.extend_from_slice(&message);
                        let _ = tx.send_data(Bytes::from(frame)).await;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        tx.abort(std::io::Error::other("the backend crashed"));
                    });
                    let response = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                        .unwrap();
                    Ok::<_, Infallible>(response)
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_breaks_mid_stream_gives_the_client_a_status() {
    let (addr, task) = breaking_backend().await;
    let gw = Gateway::start(&grpc_config(&[addr], "", ""));
    let mut client = connect(gw.listener("web")).await;
    client.ready().await.unwrap();
    let mut stream = client
        .server_streaming(Request::new(msg("x")), path("Stream"), Codec::default())
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.text, "first");
    let status = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("a status, not a hang")
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "the backend broke the call");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_calls_are_translated_both_ways() {
    let backend = GrpcBackend::start(None).await;
    let gw = Gateway::start(&grpc_config(&[backend.addr], "grpc_web = true", ""));
    // tonic-web's client, over HTTP/1.1.
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let service = tower::ServiceBuilder::new()
        .layer(tonic_web::GrpcWebClientLayer::new())
        .service(http);
    let origin = format!("http://{}", gw.listener("web")).parse().unwrap();
    let mut client = tonic::client::Grpc::with_origin(service, origin);
    client.ready().await.unwrap();
    let answer = client
        .unary(
            Request::new(msg("from a browser")),
            path("Unary"),
            Codec::default(),
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref().text, "from a browser");
    assert_eq!(streamed(&mut client, "w", 3).await, ["w-0", "w-1", "w-2"]);
    client.ready().await.unwrap();
    let status = client
        .unary(Request::new(msg("fail")), path("Unary"), Codec::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "text may not be 'fail'");

    // grpc-web-text, as browsers without binary streams send it.
    let message = prost::Message::encode_to_vec(&Msg {
        count: 2,
        ..msg("t")
    });
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let text = base64::engine::general_purpose::STANDARD.encode(&frame);
    let req = http::Request::builder()
        .method("POST")
        .uri("/test.Echo/Stream")
        .header("host", "x")
        .header("content-type", "application/grpc-web-text")
        .header("accept", "application/grpc-web-text")
        .body(http_body_util::Full::new(Bytes::from(text)))
        .unwrap();
    let (status, headers, body) = send(gw.listener("web"), req).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/grpc-web-text");
    // Padded pieces follow one another: decode each quantum run.
    let decoded = decode_pieces(&body);
    let mut rest = &decoded[..];
    let mut messages = Vec::new();
    let mut trailer = None;
    while rest.len() >= 5 {
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let payload = &rest[5..5 + len];
        if flags & 0x80 != 0 {
            trailer = Some(String::from_utf8_lossy(payload).into_owned());
        } else {
            messages.push(<Msg as prost::Message>::decode(payload).unwrap().text);
        }
        rest = &rest[5 + len..];
    }
    assert_eq!(messages, ["t-0", "t-1"]);
    let trailer = trailer.expect("a trailer frame");
    assert!(trailer.contains("grpc-status: 0\r\n"), "{trailer:?}");
}

/// Base64 text made of padded pieces one after another.
fn decode_pieces(text: &[u8]) -> Vec<u8> {
    let engine = &base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    let mut start = 0;
    for quantum in (0..text.len()).step_by(4) {
        if text.get(quantum + 3) == Some(&b'=') {
            engine
                .decode_vec(&text[start..quantum + 4], &mut out)
                .unwrap();
            start = quantum + 4;
        }
    }
    engine.decode_vec(&text[start..], &mut out).unwrap();
    out
}

/// A C-core gRPC server (Python `grpcio`), the kind that refused calls
/// without `te: trailers`: unary, server streaming and an error status.
const PYTHON_SERVER: &str = r#"
import sys, time
from concurrent import futures
import grpc

def unary(request, context):
    if request == b"fail":
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "c-core says no")
    return request

def stream(request, context):
    for i in range(3):
        yield request + str(i).encode()

handler = grpc.method_handlers_generic_handler("test.Raw", {
    "Unary": grpc.unary_unary_rpc_method_handler(unary),
    "Stream": grpc.unary_stream_rpc_method_handler(stream),
})
server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((handler,))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
sys.stdin.read()
server.stop(0)
"#;

/// Bytes as they are: the raw methods of the Python server.
#[derive(Default, Clone)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_c_core_server_answers_through_the_gateway() {
    use std::io::BufRead;
    // Debian's interpreter first: python3-grpcio installs for it, and a
    // `python3` earlier on PATH may be another one.
    let python = ["/usr/bin/python3", "python3"].into_iter().find(|python| {
        std::process::Command::new(python)
            .args(["-c", "import grpc"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(python) = python else {
        eprintln!("SKIPPED: no python3 with the grpc module (Debian package python3-grpcio) is installed; .ci/run installs it");
        return;
    };
    let mut server = std::process::Command::new(python)
        .args(["-c", PYTHON_SERVER])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _server = Killed(server);
    let port: u16 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("python said {line:?}"));
    let backend: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = Config::new()
        .listener("web", "")
        .route(
            "raw",
            "listeners = [\"web\"]\npath_prefix = \"/test.Raw/\"\nupstream = \"py\"",
        )
        .upstream("py", &[backend], "protocol = \"h2c\"")
        .build();
    let gw = Gateway::start(&config);
    let mut client = connect(gw.listener("web")).await;
    client.ready().await.unwrap();
    let answer = client
        .unary(
            Request::new(Bytes::from_static(b"hello c-core")),
            PathAndQuery::from_static("/test.Raw/Unary"),
            RawCodec,
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref().as_ref(), b"hello c-core");
    client.ready().await.unwrap();
    let mut stream = client
        .server_streaming(
            Request::new(Bytes::from_static(b"n")),
            PathAndQuery::from_static("/test.Raw/Stream"),
            RawCodec,
        )
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        got.push(String::from_utf8_lossy(&m).into_owned());
    }
    assert_eq!(got, ["n0", "n1", "n2"]);
    client.ready().await.unwrap();
    let status = client
        .unary(
            Request::new(Bytes::from_static(b"fail")),
            PathAndQuery::from_static("/test.Raw/Unary"),
            RawCodec,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(status.message(), "c-core says no");
}

#[tokio::test]
async fn routes_that_carry_grpc_need_an_http2_upstream() {
    let gw = Gateway::start(&config(""));
    let candidate = Config::new()
        .listener("web", "")
        .route(
            "web",
            "listeners = [\"web\"]\nupstream = \"old\"\ngrpc_web = true\nretry = { on = [\"grpc:unavailable\"], methods = [\"POST\"] }",
        )
        .upstream(
            "old",
            &["127.0.0.1:1".parse().unwrap()],
            "health = { grpc = \"x\" }",
        )
        .build();
    let (status, body) = activate_with(&gw, &candidate, "").await;
    assert_eq!(status, 422, "{body}");
    let codes: Vec<(&str, &str)> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["code"].as_str().unwrap(), d["path"].as_str().unwrap()))
        .collect();
    for path in [
        "routes[0].grpc_web",
        "routes[0].retry.on",
        "upstreams.old.health.grpc",
    ] {
        assert!(
            codes.contains(&("grpc_needs_http2", path)),
            "{path}: {codes:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_series_go_with_the_route_they_name() {
    let backend = GrpcBackend::start(None).await;
    let config = |route: &str| {
        grpc_config(&[backend.addr], "", "")
            .replace("name = \"echo\"", &format!("name = \"{route}\""))
    };
    let gw = Gateway::start(&config("echo-0"));
    let mut client = connect(gw.listener("web")).await;
    for i in 1..=3 {
        unary(&mut client, Request::new(msg("x"))).await.unwrap();
        let (status, body) = activate_with(&gw, &config(&format!("echo-{i}")), "").await;
        assert_eq!(status, 200, "{body}");
        // The renamed-away route's final values go out once, then go.
        scrape(&gw).await;
        let text = scrape(&gw).await;
        let gone = format!("route=\"echo-{}\"", i - 1);
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("cutover_grpc_responses_total") && l.contains(&gone)),
            "{gone} is still exported:\n{text}"
        );
    }
}

/// nginx as a gRPC backend that closes each connection after 25 calls
/// (`keepalive_requests`; its default is 1 000): its GOAWAY names the
/// last stream it took, and the calls already on their way past it were
/// never processed (RFC 9113 §8.7). Behind an h2c upstream, every call is
/// answered, those included: they go again on another connection, their
/// bodies from the start. (hyper's client, before cutover's own, failed
/// some 5 % of such calls with stock nginx.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nginx_backend_that_closes_connections_every_25_calls_loses_none() {
    let nginx = "/usr/sbin/nginx";
    if !std::path::Path::new(nginx).exists() {
        eprintln!("skipped: {nginx} is absent (Debian package nginx-light; .ci/run installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let port = closed_port().port();
    // One framed message (field 1 = 1) and `grpc-status: 0` for any call.
    std::fs::write(dir.path().join("reply.bin"), [0, 0, 0, 0, 2, 8, 1]).unwrap();
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\n\
         events {{}}\n\
         http {{ log_format conn \"$connection\"; access_log {d}/access.log conn;\n\
           keepalive_requests 25; client_body_temp_path {d}; proxy_temp_path {d};\n\
           server {{ listen 127.0.0.1:{port} http2; location / {{ root {d}; default_type application/grpc;\n\
             add_trailer grpc-status 0 always; try_files /reply.bin =404; error_page 405 =200 $uri; }} }} }}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let server = std::process::Command::new(nginx)
        .args(["-e", &format!("{d}/error.log"), "-p", &d.to_string(), "-c"])
        .arg(dir.path().join("nginx.conf"))
        .spawn()
        .unwrap();
    let _server = Killed(server);
    let backend: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut up = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(backend).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "nginx did not listen on {backend}");
    let config = Config::new()
        .listener("web", "")
        .route(
            "echo",
            "listeners = [\"web\"]\npath_prefix = \"/bench.Echo/\"\nupstream = \"nginx\"",
        )
        .upstream("nginx", &[backend], "protocol = \"h2c\"")
        .build();
    let gw = Gateway::start(&config);
    let client = connect(gw.listener("web")).await;
    let mut calls = Vec::new();
    for _ in 0..16 {
        let mut client = client.clone();
        calls.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for _ in 0..40 {
                client.ready().await.unwrap();
                let answer = client
                    .unary(
                        Request::new(Bytes::from_static(b"\x08\x01")),
                        PathAndQuery::from_static("/bench.Echo/Unary"),
                        RawCodec,
                    )
                    .await;
                match answer {
                    Ok(answer) if answer.get_ref().as_ref() == b"\x08\x01" => {}
                    other => failed.push(format!("{other:?}")),
                }
            }
            failed
        }));
    }
    let mut failed = Vec::new();
    for call in calls {
        failed.extend(call.await.unwrap());
    }
    assert!(
        failed.is_empty(),
        "{} of 640 calls failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    // nginx took the calls over many connections: it did close them.
    let log = std::fs::read_to_string(dir.path().join("access.log")).unwrap();
    let connections: std::collections::HashSet<&str> = log.lines().collect();
    assert!(
        log.lines().count() >= 640,
        "nginx logged {} calls",
        log.lines().count()
    );
    assert!(
        connections.len() >= 640 / 25,
        "{} connections",
        connections.len()
    );
}

/// A child process, killed and reaped when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

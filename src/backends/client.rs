//! The clients that carry requests to a backend through hyper: TLS
//! HTTP/1.1 and `auto` backends, protocol upgrades, and the external
//! authorization and mirror calls. (Plain HTTP/1.1 traffic goes through
//! cutover's own codec, `h1`; h2c and h2 through cutover's HTTP/2
//! client, `h2`.)

use std::sync::Arc;

use bytes::Bytes;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};

use crate::telemetry::access::Trail;
use crate::telemetry::series::Histogram;

/// An error of a request body: whatever failed, boxed (hyper's and
/// HTTP/3's both end here; causes are told apart by downcasting).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client's request body as it arrives: from hyper's server (HTTP/1.1,
/// HTTP/2), or another (an HTTP/3 request stream).
pub enum ClientBody {
    Hyper(Incoming),
    /// cutover's HTTP/2 server's (`crate::http2`).
    Http2(crate::http2::RecvBody),
    Other(std::pin::Pin<Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send>>),
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBody::Hyper(body) => body.fmt(f),
            ClientBody::Http2(body) => body.fmt(f),
            ClientBody::Other(_) => f.write_str("ClientBody::Other"),
        }
    }
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Hyper(body) => std::pin::Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(|e| Box::new(e) as BoxError))),
            ClientBody::Http2(body) => std::pin::Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(|e| Box::new(e) as BoxError))),
            ClientBody::Other(body) => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(body) => body.is_end_stream(),
            ClientBody::Http2(body) => body.is_end_stream(),
            ClientBody::Other(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            ClientBody::Hyper(body) => body.size_hint(),
            ClientBody::Http2(body) => body.size_hint(),
            ClientBody::Other(body) => body.size_hint(),
        }
    }
}

/// A request body on its way to a backend: the client's, streamed, or
/// one read in full beforehand so that it can be sent more than once
/// (retries, hedging; `None` is an empty body).
#[derive(Debug)]
pub enum RequestBody {
    /// The client's body as it arrives, its bytes counted for the access
    /// log when a trail is given.
    Streaming(ClientBody, Option<Arc<Trail>>),
    Buffered(Option<Bytes>),
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Streaming(body, trail) => {
                let polled = std::pin::Pin::new(body).poll_frame(cx);
                if let (Some(trail), std::task::Poll::Ready(Some(Ok(frame)))) = (trail, &polled) {
                    if let Some(data) = frame.data_ref() {
                        trail.add_bytes_in(data.len());
                    }
                }
                polled
            }
            RequestBody::Buffered(bytes) => {
                std::task::Poll::Ready(bytes.take().map(|b| Ok(http_body::Frame::data(b))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Streaming(body, _) => body.is_end_stream(),
            RequestBody::Buffered(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            RequestBody::Streaming(body, _) => body.size_hint(),
            RequestBody::Buffered(bytes) => {
                http_body::SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

/// A client request body on its way through hyper's client, which says
/// when it has been read to its end (the route timeout starts there) and
/// keeps the error it failed with, if it did: hyper's HTTP/2 client
/// reports a failed request body as a reset stream, which says nothing
/// of whose fault it was.
#[derive(Debug)]
pub struct SignalledBody {
    body: RequestBody,
    ended: Option<tokio::sync::oneshot::Sender<()>>,
    failure: Arc<std::sync::Mutex<Option<BoxError>>>,
}

/// What hyper is told when the client's body failed (the cause is kept
/// by the `SignalledBody`).
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed")]
pub struct ClientBodyFailed;

impl SignalledBody {
    /// The body, and what completes once it has ended (or failed).
    pub fn new(body: RequestBody) -> (Self, tokio::sync::oneshot::Receiver<()>) {
        let (ended, receiver) = tokio::sync::oneshot::channel();
        let ended = Some(ended);
        let mut this = Self {
            body,
            ended,
            failure: Arc::default(),
        };
        if this.is_end_stream() {
            this.end();
        }
        (this, receiver)
    }

    /// A body with nothing in it.
    pub fn empty() -> Self {
        Self {
            body: RequestBody::Buffered(None),
            ended: None,
            failure: Arc::default(),
        }
    }

    /// Where the error the body fails with will be, if it fails.
    pub fn failure(&self) -> Arc<std::sync::Mutex<Option<BoxError>>> {
        Arc::clone(&self.failure)
    }

    fn end(&mut self) {
        if let Some(ended) = self.ended.take() {
            let _ = ended.send(());
        }
    }
}

impl http_body::Body for SignalledBody {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_))))
            || this.body.is_end_stream()
        {
            this.end();
        }
        match polled {
            std::task::Poll::Ready(Some(Err(error))) => {
                let mut slot = this
                    .failure
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *slot = Some(error);
                std::task::Poll::Ready(Some(Err(Box::new(ClientBodyFailed))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The pooled client of a backend: plain TCP or TLS.
#[derive(Debug)]
pub enum UpstreamClient {
    Plain(Client<TimedConnector, SignalledBody>),
    Tls(Client<HttpsConnector<TimedConnector>, SignalledBody>),
}

/// hyper-util's connector, each new TCP connection's connect time
/// recorded in the backend's histogram (`cutover_backend_connect_duration_seconds`;
/// for TLS backends the handshake is not in it).
#[derive(Clone)]
pub struct TimedConnector {
    inner: HttpConnector,
    times: Arc<Histogram>,
}

impl TimedConnector {
    pub fn new(inner: HttpConnector, times: Arc<Histogram>) -> Self {
        Self { inner, times }
    }
}

impl tower::Service<http::Uri> for TimedConnector {
    type Response = <HttpConnector as tower::Service<http::Uri>>::Response;
    type Error = <HttpConnector as tower::Service<http::Uri>>::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let started = std::time::Instant::now();
        let times = Arc::clone(&self.times);
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let connected = connecting.await;
            if connected.is_ok() {
                times.record(started.elapsed());
            }
            connected
        })
    }
}

impl UpstreamClient {
    pub fn request(&self, req: http::Request<SignalledBody>) -> ResponseFuture {
        match self {
            UpstreamClient::Plain(client) => client.request(req),
            UpstreamClient::Tls(client) => client.request(req),
        }
    }
}

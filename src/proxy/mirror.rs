//! Route `mirror` on the request path (DESIGN §17, §22): a share of the
//! route's requests is copied to another upstream of the request's
//! generation, and the copies' answers are discarded.
//!
//! A copy never delays or changes the client's answer: its body is
//! teed from the client's as it streams to the route's own upstream (a
//! copy only starts once that body has ended, and only if it was at most
//! 64 KiB), it runs as a task of its own that holds no part of the
//! generation's in-flight count, and at most `max_inflight` copies of the
//! route are in flight: one more is dropped and counted. Methods that
//! are not idempotent are copied only when the route lists them in
//! `mirror_methods`. Every copy's outcome is counted in
//! `cutover_shadow_requests_total{route,outcome}`: `answered`, `failed`,
//! `timeout`, `dropped` (too many in flight), `skipped` (a body too long
//! to keep, or one the client never finished).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{header, Method, Request};
use http_body::Frame;
use http_body_util::BodyExt as _;

use crate::backends::{Attempt, ClientBody, RequestBody, SignalledBody};
use crate::generation::{Route, RouteShared, Upstream};
use crate::plan::Mirror;

/// The longest body a copy carries; a longer one is not copied.
pub const MAX_MIRROR_BODY: usize = 64 * 1024;
/// A copy's answer is read (for the backend's connection to be reused)
/// up to this much, then dropped.
const MAX_ANSWER_READ: usize = 1024 * 1024;

/// How a copy ended.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Answered,
    Failed,
    Timeout,
    Dropped,
    Skipped,
}

/// The `outcome` label of each, in the enum's order.
const OUTCOMES: [&str; 5] = ["answered", "failed", "timeout", "dropped", "skipped"];

fn count(route: &RouteShared, outcome: Outcome) {
    route.copied(&OUTCOMES, outcome as usize);
}

/// Idempotent by RFC 9110 §9.2.2: copying them twice changes nothing
/// more than once.
fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// One copy in flight of a route; counts down when dropped.
struct Slot(Arc<AtomicU64>);

impl Slot {
    fn take(inflight: &Arc<AtomicU64>, max: u32) -> Option<Slot> {
        if inflight.fetch_add(1, Ordering::AcqRel) >= u64::from(max) {
            inflight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(Arc::clone(inflight)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Copies `req` to `mirror`'s upstream when the route's share picks it;
/// returns the request to forward (its body teed when a copy was made).
/// `path`: the path forwarded, when a `rewrite` changed it.
pub(super) fn copy(
    req: Request<ClientBody>,
    mirror: &Mirror,
    route: &Route,
    upstream: &Arc<Upstream>,
    path: Option<&str>,
) -> Request<ClientBody> {
    if fastrand::f64() * 100.0 >= mirror.percent {
        return req;
    }
    if !idempotent(req.method()) && !mirror.methods.contains(req.method()) {
        return req;
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_MIRROR_BODY as u64) {
        count(&route.shared, Outcome::Skipped);
        return req;
    }
    let Some(slot) = Slot::take(&route.shared.mirror_inflight, mirror.max_inflight) else {
        count(&route.shared, Outcome::Dropped);
        return req;
    };
    let path_and_query = match (path, req.uri().query()) {
        (Some(path), Some(query)) => format!("{path}?{query}"),
        (Some(path), None) => path.to_owned(),
        (None, _) => req
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |pq| pq.as_str().to_owned()),
    };
    let (mut head, ()) = Request::new(()).into_parts();
    head.method = req.method().clone();
    head.headers = req.headers().clone();
    super::exchange::strip_hop_by_hop(&mut head.headers);
    // An HTTP/2 client's host is its `:authority`.
    if !head.headers.contains_key(header::HOST) {
        if let Some(authority) = req.uri().authority() {
            if let Ok(value) = http::HeaderValue::from_str(authority.as_str()) {
                head.headers.insert(header::HOST, value);
            }
        }
    }
    let (req, body) = if http_body::Body::is_end_stream(req.body()) {
        (req, None)
    } else {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = req.map(|inner| {
            ClientBody::Other(Box::pin(Tee {
                inner,
                kept: Some(BytesMut::new()),
                tx: Some(tx),
            }))
        });
        (req, Some(rx))
    };
    let upstream = Arc::clone(upstream);
    let shared = Arc::clone(&route.shared);
    let timeout = route.timeout();
    tokio::spawn(async move {
        let _slot = slot;
        let body = match body {
            None => Bytes::new(),
            Some(rx) => match rx.await {
                Ok(body) => body,
                Err(_) => return count(&shared, Outcome::Skipped),
            },
        };
        let outcome = send(head, path_and_query, body, &upstream, timeout).await;
        count(&shared, outcome);
    });
    req
}

/// Sends one copy through `upstream` (its pool, health and outlier
/// detection) and reads its answer only to discard it: on the driven
/// HTTP/1.1 client for a plain HTTP/1.1 backend, as the route's own
/// requests go, else on hyper's pooled client.
async fn send(
    mut head: http::request::Parts,
    path_and_query: String,
    body: Bytes,
    upstream: &Upstream,
    timeout: std::time::Duration,
) -> Outcome {
    let Some(backend) = upstream.pick() else {
        return Outcome::Failed;
    };
    let _inflight = backend.start_request();
    let sent = Instant::now();
    let answered = match &backend.h1 {
        Some(pool) => {
            let Ok(target) = http::Uri::try_from(path_and_query) else {
                return Outcome::Failed;
            };
            head.uri = target;
            let request = Request::from_parts(head, http_body_util::Full::new(body));
            driven(pool, backend, request, timeout).await
        }
        None => {
            let uri = http::Uri::builder()
                .scheme(backend.scheme.clone())
                .authority(backend.authority.clone())
                .path_and_query(path_and_query)
                .build();
            let Ok(uri) = uri else {
                return Outcome::Failed;
            };
            head.uri = uri;
            head.version = backend.version;
            // An HTTP/2 backend is told its own address as `:authority`,
            // as the route's requests are.
            if backend.version == http::Version::HTTP_2 {
                head.headers.remove(header::HOST);
            }
            let body = SignalledBody::new(RequestBody::Buffered(Some(body))).0;
            pooled(backend, Request::from_parts(head, body), timeout).await
        }
    };
    match answered {
        Err(Attempt::Timeout) => {
            upstream.report(backend, Attempt::Timeout, None);
            Outcome::Timeout
        }
        Err(attempt) => {
            upstream.report(backend, attempt, None);
            Outcome::Failed
        }
        Ok(status) => {
            upstream.report(backend, Attempt::Answered(status), Some(sent.elapsed()));
            Outcome::Answered
        }
    }
}

/// One copy on the driven HTTP/1.1 client; its connection goes back to
/// the pool once the answer is read.
async fn driven(
    pool: &crate::backends::H1Pool,
    backend: &crate::backends::Backend,
    request: Request<http_body_util::Full<Bytes>>,
    timeout: std::time::Duration,
) -> Result<http::StatusCode, Attempt> {
    let exchange = async {
        let response = crate::backends::request_h1(
            pool,
            &backend.key.addr,
            backend.key.connect_timeout,
            timeout,
            request,
            std::iter::empty(),
            None,
            None,
        )
        .await
        .map_err(|error| match error {
            crate::backends::ExchangeError::Connect(_) => Attempt::ConnectError,
            crate::backends::ExchangeError::Send(crate::backends::SendError::Timeout(_)) => {
                Attempt::Timeout
            }
            crate::backends::ExchangeError::Send(_) => Attempt::Error,
        })?;
        let status = response.status();
        let mut body = response.into_body();
        let mut read = 0;
        // Never past its end: a driven body is not polled again once it
        // says it is done.
        while !http_body::Body::is_end_stream(&*body) {
            let Some(Ok(frame)) = body.frame().await else {
                break;
            };
            read += frame.data_ref().map_or(0, Bytes::len);
            if read > MAX_ANSWER_READ {
                break;
            }
        }
        if let Some(conn) = body.take_connection() {
            pool.put(conn);
        }
        Ok(status)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or(Err(Attempt::Timeout))
}

/// One copy on hyper's pooled client (TLS, h2 and h2c backends).
async fn pooled(
    backend: &crate::backends::Backend,
    request: Request<SignalledBody>,
    timeout: std::time::Duration,
) -> Result<http::StatusCode, Attempt> {
    let exchange = async {
        let response = backend.client().request(request).await.map_err(|e| {
            if e.is_connect() {
                Attempt::ConnectError
            } else {
                Attempt::Error
            }
        })?;
        let status = response.status();
        let _ = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_READ)
            .collect()
            .await;
        Ok(status)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or(Err(Attempt::Timeout))
}

/// The client's body on its way to the route's upstream, kept (up to
/// `MAX_MIRROR_BODY`) for the copy, which gets it once it has ended.
struct Tee {
    inner: ClientBody,
    /// `None` once the body was too long to keep.
    kept: Option<BytesMut>,
    tx: Option<tokio::sync::oneshot::Sender<Bytes>>,
}

impl Tee {
    fn hand_over(&mut self) {
        if let (Some(kept), Some(tx)) = (self.kept.take(), self.tx.take()) {
            let _ = tx.send(kept.freeze());
        }
    }
}

impl http_body::Body for Tee {
    type Data = Bytes;
    type Error = crate::backends::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(kept)) = (frame.data_ref(), this.kept.as_mut()) {
                    if kept.len() + data.len() > MAX_MIRROR_BODY {
                        // Too long to copy: the copy is skipped.
                        this.kept = None;
                        this.tx = None;
                    } else {
                        kept.extend_from_slice(data);
                    }
                }
                // Nobody polls a body past its declared end.
                if this.inner.is_end_stream() {
                    this.hand_over();
                }
            }
            Poll::Ready(None) => this.hand_over(),
            Poll::Ready(Some(Err(_))) => {
                this.kept = None;
                this.tx = None;
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

//! Copies of client requests (DESIGN §17 `mirror`, §22 shadow): what a
//! route's mirror and an activation's shadow stage share. A copy carries
//! the client's head and, teed from the client's body as it streams to
//! the request's own upstream, a body of at most `MAX_COPY_BODY`; it is
//! sent on a task of its own, one at most per `Slot`, and its answer is
//! read only to be discarded.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{header, Request};
use http_body::Frame;
use http_body_util::BodyExt as _;

use super::conn::ConnContext;
use super::edge;
use crate::backends::{Attempt, ClientBody, RequestBody, SignalledBody};
use crate::generation::Upstream;

/// The longest body a copy carries; a longer one is not copied.
pub const MAX_COPY_BODY: usize = 64 * 1024;
/// A copy's answer is read (for the backend's connection to be reused)
/// up to this much, then dropped.
const MAX_ANSWER_READ: usize = 1024 * 1024;

/// How a copy ended: the `outcome` of `cutover_shadow_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Its upstream answered (whatever the status).
    Answered,
    /// No backend, a refused connection, a reset.
    Failed,
    Timeout,
    /// Too many copies were in flight.
    Dropped,
    /// A body too long to keep, or one the client never finished.
    Skipped,
}

impl Outcome {
    /// Its position in `crate::generation::COPY_OUTCOMES`.
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// One copy in flight, of at most `max` sharing `inflight`; counts down
/// when dropped.
pub(super) struct Slot(Arc<AtomicU64>);

impl Slot {
    pub(super) fn take(inflight: &Arc<AtomicU64>, max: u32) -> Option<Slot> {
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

/// The client's request head as it came (method, target, version,
/// headers): what a candidate reads of it on its own task.
pub(super) fn bare_head(req: &Request<ClientBody>) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = req.uri().clone();
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    head
}

/// What a live request's step hands to the task that copies it (the
/// active generation's verdict on it), riding in the request's
/// extensions: shared, as extensions must be `Clone`; the first `send`
/// takes it, and dropped unsent the task's receiver says so.
pub(super) struct Handoff<T>(Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<T>>>>);

impl<T> Clone for Handoff<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> Handoff<T> {
    pub(super) fn new() -> (Self, tokio::sync::oneshot::Receiver<T>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Self(Arc::new(std::sync::Mutex::new(Some(tx)))), rx)
    }

    pub(super) fn send(self, value: T) {
        let taken = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(sender) = taken {
            let _ = sender.send(value);
        }
    }
}

/// Whether the request declares a body longer than a copy carries.
pub(super) fn declared_too_long(req: &Request<ClientBody>) -> bool {
    declares_more_than(req, MAX_COPY_BODY)
}

/// Whether the request declares a body longer than `cap`.
pub(super) fn declares_more_than(req: &Request<ClientBody>, cap: usize) -> bool {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > cap as u64)
}

/// Where a generation that does not serve the request (a shadow's
/// candidate) routes it.
pub(super) struct Routed<'g> {
    pub(super) router: &'g crate::generation::Router,
    pub(super) route: &'g Arc<crate::generation::Route>,
    pub(super) authority: Option<http::HeaderValue>,
    /// The request's path as the listener normalizes it.
    pub(super) path: String,
}

/// Routes `req` in `generation`: its listener's rules (the authority,
/// the client's access, the normalized path), then its routes; or the
/// status it would answer instead.
pub(super) fn route_in<'g>(
    req: &Request<ClientBody>,
    conn: &ConnContext,
    generation: &'g crate::generation::Generation,
) -> Result<Routed<'g>, http::StatusCode> {
    use super::error::ProxyError;
    let router = generation
        .router(&conn.listener)
        .ok_or(http::StatusCode::NOT_FOUND)?;
    let authority = edge::authority(req).map_err(|e| ProxyError::BadRequest(e).status())?;
    if let Some(access) = &router.edge.access {
        if !access.admits(super::filters::client_ip(conn, req.headers(), &router.edge)) {
            return Err(ProxyError::Forbidden.status());
        }
    }
    let path = edge::normalize_path(req.uri().path(), &router.edge)
        .map_err(|e| ProxyError::BadRequest(e).status())?
        .into_owned();
    let asked_method = edge::preflight_method(req);
    let (host, head) = edge::routing_head(req, authority.as_ref(), asked_method.as_ref());
    let route = router
        .route(host, &path, &head)
        .ok_or(http::StatusCode::NOT_FOUND)?;
    Ok(Routed {
        router,
        route,
        authority,
        path,
    })
}

/// The copy's head: the client's method and headers (without hop-by-hop
/// ones, with `Host` from an HTTP/2 client's `:authority`), and its
/// target, `path` replacing the client's when given.
pub(super) fn head(
    req: &Request<ClientBody>,
    path: Option<&str>,
) -> (http::request::Parts, String) {
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
    super::headers::strip_hop_by_hop(&mut head.headers);
    if !head.headers.contains_key(header::HOST) {
        if let Some(authority) = req.uri().authority() {
            if let Ok(value) = http::HeaderValue::from_str(authority.as_str()) {
                head.headers.insert(header::HOST, value);
            }
        }
    }
    (head, path_and_query)
}

/// The request to forward, its body teed when it has one; the receiver
/// gets the body once it has ended (nothing, when it was longer than
/// `MAX_COPY_BODY` or the client never finished it).
pub(super) fn tee(
    req: Request<ClientBody>,
) -> (
    Request<ClientBody>,
    Option<tokio::sync::oneshot::Receiver<Bytes>>,
) {
    tee_within(req, MAX_COPY_BODY)
}

/// `tee`, keeping a body of at most `cap` bytes.
pub(super) fn tee_within(
    req: Request<ClientBody>,
    cap: usize,
) -> (
    Request<ClientBody>,
    Option<tokio::sync::oneshot::Receiver<Bytes>>,
) {
    if http_body::Body::is_end_stream(req.body()) {
        return (req, None);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let req = req.map(|inner| {
        ClientBody::Other(Box::pin(Tee {
            inner,
            kept: Some(BytesMut::new()),
            cap,
            tx: Some(tx),
        }))
    });
    (req, Some(rx))
}

/// The copy's body once the client's has ended (empty without one);
/// `None` when it was too long to keep or the client never finished it.
pub(super) async fn received(teed: Option<tokio::sync::oneshot::Receiver<Bytes>>) -> Option<Bytes> {
    match teed {
        None => Some(Bytes::new()),
        Some(rx) => rx.await.ok(),
    }
}

/// Whether a copy's answer feeds the upstream's passive health and
/// outlier detection: a mirror's does (it is that upstream's real
/// traffic); a shadow's does not (a candidate's mistakes must not eject
/// a backend the active generation serves from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Report {
    Health,
    Nothing,
}

/// An answer to a request sent on the side: its head, and its body when
/// it was at most the `keep` bytes asked for.
pub(super) struct Answer {
    pub(super) head: http::response::Parts,
    pub(super) body: Option<Bytes>,
}

/// Sends one request on the side (a copy, a cache's background
/// revalidation) through `upstream` (its pool and balancing), and reads
/// its answer, keeping up to `keep` bytes of its body: on the driven
/// HTTP/1.1 client for a plain HTTP/1.1 backend, as a route's own
/// requests go, else on hyper's pooled client. `None`: the upstream has
/// no backend to take it. `backend_host`: the route's `host_rewrite =
/// "backend"` (an HTTP/1.1 backend is sent its own address as `Host`).
#[expect(clippy::too_many_arguments, reason = "the request and how to send it")]
pub(super) async fn send(
    mut head: http::request::Parts,
    path_and_query: String,
    body: Bytes,
    upstream: &Upstream,
    timeout: std::time::Duration,
    report: Report,
    backend_host: bool,
    keep: usize,
) -> Option<Result<Answer, Attempt>> {
    let backend = upstream.pick(&upstream.members()).map(Arc::clone)?;
    let backend = &backend;
    if backend_host {
        if let Ok(host) = http::HeaderValue::from_str(backend.authority.as_str()) {
            head.headers.insert(header::HOST, host);
        }
    }
    let _inflight = backend.start_request();
    let sent = Instant::now();
    let answered = match &backend.h1 {
        Some(pool) => match http::Uri::try_from(path_and_query) {
            Ok(target) => {
                head.uri = target;
                let request = Request::from_parts(head, http_body_util::Full::new(body));
                driven(pool, backend, request, timeout, keep).await
            }
            Err(_) => Err(Attempt::Error),
        },
        None => {
            let uri = http::Uri::builder()
                .scheme(backend.scheme.clone())
                .authority(backend.authority.clone())
                .path_and_query(path_and_query)
                .build();
            match uri {
                Ok(uri) => {
                    head.uri = uri;
                    head.version = backend.version;
                    // An HTTP/2 backend is told its own address as
                    // `:authority`, as a route's requests are.
                    if backend.version == http::Version::HTTP_2 {
                        head.headers.remove(header::HOST);
                    }
                    let body = SignalledBody::new(RequestBody::Buffered(Some(body))).0;
                    pooled(backend, Request::from_parts(head, body), timeout, keep).await
                }
                Err(_) => Err(Attempt::Error),
            }
        }
    };
    if report == Report::Health {
        match &answered {
            Ok(answer) => {
                upstream.report(
                    backend,
                    Attempt::Answered(answer.head.status),
                    Some(sent.elapsed()),
                );
            }
            Err(attempt) => upstream.report(backend, *attempt, None),
        }
    }
    Some(answered)
}

/// One request on the driven HTTP/1.1 client; its connection goes back
/// to the pool once the answer is read.
async fn driven(
    pool: &crate::backends::H1Pool,
    backend: &crate::backends::Backend,
    request: Request<http_body_util::Full<Bytes>>,
    timeout: std::time::Duration,
    keep: usize,
) -> Result<Answer, Attempt> {
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
            true,
        )
        .await
        .map_err(|error| match error {
            crate::backends::ExchangeError::Connect(_) => Attempt::ConnectError,
            crate::backends::ExchangeError::Send(crate::backends::SendError::Timeout(_)) => {
                Attempt::Timeout
            }
            crate::backends::ExchangeError::Send(_) => Attempt::Error,
        })?;
        let (head, mut body) = response.into_parts();
        let mut read = 0;
        let mut kept = Some(BytesMut::new());
        let mut ended = false;
        // Never past its end: a driven body is not polled again once it
        // says it is done.
        loop {
            if http_body::Body::is_end_stream(&*body) {
                ended = true;
                break;
            }
            let frame = match body.frame().await {
                None => {
                    ended = true;
                    break;
                }
                Some(Err(_)) => {
                    kept = None;
                    break;
                }
                Some(Ok(frame)) => frame,
            };
            if let Some(data) = frame.data_ref() {
                read += data.len();
                match &mut kept {
                    Some(bytes) if read <= keep => bytes.extend_from_slice(data),
                    _ => kept = None,
                }
            }
            if read > MAX_ANSWER_READ.max(keep) {
                break;
            }
        }
        if let Some(conn) = body.take_connection() {
            pool.put(conn);
        }
        let body = kept.filter(|_| ended).map(BytesMut::freeze);
        Ok(Answer { head, body })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or(Err(Attempt::Timeout))
}

/// One request on hyper's pooled client (TLS, h2 and h2c backends).
async fn pooled(
    backend: &crate::backends::Backend,
    request: Request<SignalledBody>,
    timeout: std::time::Duration,
    keep: usize,
) -> Result<Answer, Attempt> {
    let exchange = async {
        let response = backend.client().request(request).await.map_err(|e| {
            if e.is_connect() {
                Attempt::ConnectError
            } else {
                Attempt::Error
            }
        })?;
        let (head, body) = response.into_parts();
        let read = http_body_util::Limited::new(body, MAX_ANSWER_READ.max(keep))
            .collect()
            .await;
        let body = read
            .ok()
            .map(http_body_util::Collected::to_bytes)
            .filter(|b| b.len() <= keep);
        Ok(Answer { head, body })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or(Err(Attempt::Timeout))
}

/// The client's body on its way to the request's upstream, kept (up to
/// `cap`) for the copy, which gets it once it has ended.
struct Tee {
    inner: ClientBody,
    /// `None` once the body was too long to keep.
    kept: Option<BytesMut>,
    cap: usize,
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
                    if kept.len() + data.len() > this.cap {
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

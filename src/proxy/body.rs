//! The response body type the gateway serves: a streamed upstream body
//! (which carries the request's guards until its last byte), a small
//! in-memory one, a compressed one, or a gRPC call's answer
//! ([`CallBody`]: its status counted, its deadline kept, a broken stream
//! ended with a status; see `grpc.rs`). A leaf below the request path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::grpc_web::Encoder;
use crate::backends::{BackendGuard, SendError, UpstreamBody};
use crate::generation::{InflightGuard, ListenerSlot, RouteShared, RouteSlot};
use crate::grpc::{Code, GRPC_MESSAGE, GRPC_STATUS};
use crate::runtime::GenerationStore;
use crate::telemetry::access::Trail;

/// Holds what a streaming response keeps alive: the slim part of its
/// generation (the ledger entry), its route slot and its backend count.
pub struct StreamGuards {
    pub inflight: InflightGuard,
    pub route: Option<RouteSlot>,
    /// The listener's `max_inflight` place, if it has one.
    pub listener: Option<ListenerSlot>,
    pub backend: BackendGuard,
    /// To follow supersession for `runtime.max_pinned_age`.
    pub store: Arc<GenerationStore>,
    /// Completes when the response has been pinned too long; created the
    /// first time the body has to wait, so short responses never pay.
    expiry: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Frames passed on; a stream that never waits is checked every 64.
    frames: u32,
    /// Fires when the backend has sent nothing for its upstream
    /// `idle_timeout`; armed the first time the body has to wait.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Frames seen when `idle` was last armed.
    idle_frames: u32,
}

impl StreamGuards {
    pub fn new(
        inflight: InflightGuard,
        route: Option<RouteSlot>,
        backend: BackendGuard,
        store: Arc<GenerationStore>,
    ) -> Self {
        Self {
            inflight,
            route,
            listener: None,
            backend,
            store,
            expiry: None,
            frames: 0,
            idle: None,
            idle_frames: 0,
        }
    }

    /// Whether the backend has been silent for its `idle_timeout` while
    /// the body waits; (re)arms the timer when frames came since.
    fn silent(&mut self, cx: &mut Context<'_>) -> bool {
        let timeout = self.backend.backend().key.idle_timeout;
        let moved = self.frames != self.idle_frames;
        let deadline = tokio::time::Instant::now() + timeout;
        match &mut self.idle {
            Some(idle) if moved => idle.as_mut().reset(deadline),
            Some(_) => {}
            None => self.idle = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.idle_frames = self.frames;
        self.idle
            .as_mut()
            .is_some_and(|idle| idle.as_mut().poll(cx).is_ready())
    }

    /// Whether the stream's generation was superseded longer ago than
    /// `max_pinned_age`; registers the waker otherwise.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let expiry = self.expiry.get_or_insert_with(|| {
            let store = Arc::clone(&self.store);
            let generation = self.inflight.ledger().generation();
            Box::pin(async move { super::conn::pinned_age_expired(&store, generation).await })
        });
        expiry.as_mut().poll(cx).is_ready()
    }
}

impl std::fmt::Debug for StreamGuards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamGuards")
            .field("inflight", &self.inflight)
            .finish()
    }
}

/// A streaming response cut because the backend sent nothing for its
/// upstream `idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("response stream closed: the backend sent nothing for {0:?} (upstream idle_timeout)")]
pub struct UpstreamIdle(std::time::Duration);

/// A streaming response cut because its generation was superseded longer
/// ago than `runtime.max_pinned_age`.
#[derive(Debug, thiserror::Error)]
#[error("response stream closed: pinned to a generation superseded longer ago than runtime.max_pinned_age")]
pub struct PinnedTooLong;

#[derive(Debug)]
pub enum ResponseBody {
    /// Through `backends::send` (TLS, h2, h2c and HTTP/3 backends).
    Upstream {
        body: crate::backends::AnswerBody,
        guards: Option<StreamGuards>,
    },
    /// From a plain HTTP/1.1 backend through cutover's own client; its
    /// connection goes back to the backend's pool when the body is done.
    Driven {
        body: Box<UpstreamBody>,
        guards: Option<StreamGuards>,
        /// A frame read before the head was answered (see `peek`),
        /// delivered first.
        first: Option<Held>,
    },
    Full(Option<Bytes>),
    /// A gRPC answer from a backend (`grpc.rs`).
    Grpc(Box<CallBody>),
    /// Compressed as it streams (`compress.rs`, `encode.rs`).
    Compressed(Box<super::encode::Compressing<ResponseBody>>),
    /// Kept in a cache zone as it streams to the client (`cache.rs`).
    Keeping(Box<Keeping>),
    /// Read in part ahead of the client, for a firewall's rules
    /// (`waf_answer.rs`): what was read, then the rest as it comes.
    Replayed(Box<Replayed<ResponseBody>>),
}

/// A body whose first bytes were read ahead (for a firewall's rules, a
/// request's or an answer's): those, then the rest of the body (or the
/// error that cut it), then its trailers.
#[derive(Debug)]
pub struct Replayed<B> {
    first: Option<Bytes>,
    rest: Option<B>,
    /// The error that ended the reading ahead.
    pub failed: Option<BoxError>,
    trailers: Option<HeaderMap>,
}

/// Reads `body` until it ends, fails, or more than `limit` bytes are in:
/// what was read (past the limit by at most one frame), and the body
/// that gives it again, then the rest.
pub async fn read_within<B>(mut body: B, limit: usize) -> (Bytes, Replayed<B>)
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    use http_body_util::BodyExt as _;
    let mut read = bytes::BytesMut::new();
    let (mut trailers, mut failed) = (None, None);
    let mut ended = body.is_end_stream();
    while !ended && read.len() <= limit {
        match body.frame().await {
            None => ended = true,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => read.extend_from_slice(&data),
                Err(frame) => {
                    trailers = frame.into_trailers().ok();
                    ended = true;
                }
            },
            Some(Err(error)) => {
                failed = Some(error);
                ended = true;
            }
        }
    }
    let read = read.freeze();
    let replayed = Replayed {
        first: Some(read.clone()).filter(|r| !r.is_empty()),
        rest: (!ended).then_some(body),
        failed,
        trailers,
    };
    (read, replayed)
}

impl<B> Body for Replayed<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if let Some(rest) = this.rest.as_mut() {
            match Pin::new(rest).poll_frame(cx) {
                Poll::Ready(None) => this.rest = None,
                polled => return polled,
            }
        }
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Some(Err(error)));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none()
            && self.rest.as_ref().is_none_or(B::is_end_stream)
            && self.failed.is_none()
            && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        let mut hint = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + first);
        }
        hint.set_lower(hint.lower() + first);
        hint
    }
}

/// An upstream answer on its way to the client, copied (up to the
/// route's `max_object`) into a cache zone: stored when its last byte
/// has passed, dropped if it runs longer, fails or carries trailers.
/// Holds the key's lead (`cache::Lead`) until then, so that misses
/// waiting on the same key look again once it is stored.
pub struct Keeping {
    pub inner: ResponseBody,
    kept: bytes::BytesMut,
    limit: usize,
    /// The declared length: stored when it is all in (the server may not
    /// poll once more for the end).
    declared: Option<u64>,
    into: Option<KeepInto>,
}

impl std::fmt::Debug for Keeping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeping")
            .field("kept", &self.kept.len())
            .field("limit", &self.limit)
            .field("storing", &self.into.is_some())
            .finish()
    }
}

struct KeepInto {
    zone: std::sync::Arc<crate::cache::Zone>,
    key: String,
    head: crate::cache::Keepable,
    _lead: Option<crate::cache::Lead>,
}

impl Keeping {
    pub fn new(
        inner: ResponseBody,
        (limit, declared): (usize, Option<u64>),
        zone: std::sync::Arc<crate::cache::Zone>,
        key: String,
        head: crate::cache::Keepable,
        lead: Option<crate::cache::Lead>,
    ) -> Self {
        Self {
            inner,
            kept: bytes::BytesMut::new(),
            limit,
            declared,
            into: Some(KeepInto {
                zone,
                key,
                head,
                _lead: lead,
            }),
        }
    }

    fn saw(&mut self, polled: &Poll<Option<Result<Frame<Bytes>, BoxError>>>) {
        match polled {
            Poll::Pending => {}
            Poll::Ready(Some(Ok(frame))) => match frame.data_ref() {
                Some(data) if self.kept.len() + data.len() <= self.limit => {
                    if self.into.is_some() {
                        self.kept.extend_from_slice(data);
                        if self.declared == Some(self.kept.len() as u64) {
                            self.store();
                        }
                    }
                }
                // Too long, or trailers: passed on, not kept.
                _ => {
                    self.into = None;
                    self.kept = bytes::BytesMut::new();
                }
            },
            Poll::Ready(Some(Err(_))) => self.into = None,
            Poll::Ready(None) => self.store(),
        }
    }

    /// Stores what was kept (once), when the whole body is in.
    fn store(&mut self) {
        if let Some(into) = self.into.take() {
            let body = std::mem::take(&mut self.kept).freeze();
            if self.declared.is_none_or(|n| n == body.len() as u64) {
                into.zone.store(&into.key, into.head.with_body(body));
            }
        }
    }
}

impl ResponseBody {
    pub fn full(bytes: Bytes) -> Self {
        ResponseBody::Full(Some(bytes).filter(|b| !b.is_empty()))
    }

    /// The guards a streamed body carries, if it still has them.
    pub fn guards_mut(&mut self) -> Option<&mut StreamGuards> {
        match self {
            ResponseBody::Upstream { guards, .. } | ResponseBody::Driven { guards, .. } => {
                guards.as_mut()
            }
            ResponseBody::Full(_) => None,
            ResponseBody::Grpc(call) => call.inner_mut().guards_mut(),
            ResponseBody::Compressed(body) => body.inner_mut().guards_mut(),
            ResponseBody::Keeping(body) => body.inner.guards_mut(),
            ResponseBody::Replayed(body) => body.rest.as_mut()?.guards_mut(),
        }
    }
}

/// Applies a streamed body's guards to what it yielded: they are
/// released as soon as the stream ends (rather than when hyper drops the
/// body), and the stream is cut once its generation has been superseded
/// longer than `max_pinned_age`.
fn guard(
    polled: Poll<Option<Result<Frame<Bytes>, BoxError>>>,
    guards: &mut Option<StreamGuards>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    match &polled {
        Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
            guards.take();
        }
        Poll::Pending => {
            if guards.as_mut().is_some_and(|g| g.expired(cx)) {
                guards.take();
                return Poll::Ready(Some(Err(Box::new(PinnedTooLong))));
            }
            if guards.as_mut().is_some_and(|g| g.silent(cx)) {
                let timeout = guards
                    .take()
                    .map(|g| g.backend.backend().key.idle_timeout)
                    .unwrap_or_default();
                return Poll::Ready(Some(Err(Box::new(UpstreamIdle(timeout)))));
            }
        }
        Poll::Ready(Some(Ok(_))) => {
            if let Some(g) = guards.as_mut() {
                g.frames = g.frames.wrapping_add(1);
                if g.frames % 64 == 0 && g.expired(cx) {
                    guards.take();
                    return Poll::Ready(Some(Err(Box::new(PinnedTooLong))));
                }
            }
        }
    }
    polled
}

/// A frame `peek` read, held until the body is first polled: data as it
/// is, trailers (rare there) boxed. A `Frame` would make every response
/// 56 bytes larger, and responses are moved by value several times on
/// their way out.
#[derive(Debug)]
pub enum Held {
    Data(Bytes),
    Trailers(Box<http::HeaderMap>),
}

impl Held {
    fn of(frame: Frame<Bytes>) -> Option<Self> {
        match frame.into_data() {
            Ok(data) => Some(Held::Data(data)),
            Err(frame) => frame
                .into_trailers()
                .ok()
                .map(|t| Held::Trailers(Box::new(t))),
        }
    }

    fn into_frame(self) -> Frame<Bytes> {
        match self {
            Held::Data(data) => Frame::data(data),
            Held::Trailers(trailers) => Frame::trailers(*trailers),
        }
    }

    fn data_len(&self) -> u64 {
        match self {
            Held::Data(data) => data.len() as u64,
            Held::Trailers(_) => 0,
        }
    }
}

/// Reads what a driven body already has, before its head is answered: a
/// body that fails at once (the backend closed right after its head, or
/// sent garbage where the body should be) is reported while a 502 can
/// still be answered instead of a head with nothing behind it. One poll,
/// with a waker that does nothing: the first real poll registers its own.
pub fn peek(body: &mut UpstreamBody) -> Result<Option<Held>, SendError> {
    if body.is_end_stream() {
        return Ok(None);
    }
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(Some(Err(error))) => Err(error),
        Poll::Ready(Some(Ok(frame))) => Ok(Held::of(frame)),
        Poll::Ready(None) | Poll::Pending => Ok(None),
    }
}

/// Gives a driven connection whose exchange completed back to its pool.
pub fn return_connection(body: &mut UpstreamBody, guards: Option<&StreamGuards>) {
    if let (Some(conn), Some(g)) = (body.take_connection(), guards) {
        if let Some(pool) = &g.backend.backend().h1 {
            pool.put(conn);
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ResponseBody::Upstream { body, guards } => {
                guard(Pin::new(body).poll_frame(cx), guards, cx)
            }
            ResponseBody::Driven {
                body,
                guards,
                first,
            } => {
                let polled = match first.take() {
                    Some(held) => Poll::Ready(Some(Ok(held.into_frame()))),
                    None => Pin::new(&mut **body).poll_frame(cx).map_err(Into::into),
                };
                // Before the guards go: they know the connection's pool.
                return_connection(body, guards.as_ref());
                let polled = guard(polled, guards, cx);
                // The last byte of a declared length is in: hyper will not
                // poll again, so release the pin now.
                if body.is_end_stream() {
                    guards.take();
                }
                polled
            }
            ResponseBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Grpc(call) => Pin::new(&mut **call).poll_frame(cx),
            ResponseBody::Compressed(body) => Pin::new(&mut **body).poll_frame(cx),
            ResponseBody::Keeping(keeping) => {
                let polled = Pin::new(&mut keeping.inner).poll_frame(cx);
                keeping.saw(&polled);
                polled
            }
            ResponseBody::Replayed(replayed) => Pin::new(&mut **replayed).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream { body, .. } => body.is_end_stream(),
            ResponseBody::Driven { body, first, .. } => first.is_none() && body.is_end_stream(),
            ResponseBody::Full(bytes) => bytes.is_none(),
            ResponseBody::Grpc(call) => call.is_end_stream(),
            ResponseBody::Compressed(body) => body.is_end_stream(),
            ResponseBody::Keeping(keeping) => keeping.inner.is_end_stream(),
            ResponseBody::Replayed(replayed) => replayed.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream { body, .. } => body.size_hint(),
            ResponseBody::Driven { body, first, .. } => {
                let mut hint = body.size_hint();
                let held = first.as_ref().map_or(0, Held::data_len);
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper + held);
                }
                hint.set_lower(hint.lower() + held);
                hint
            }
            ResponseBody::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            ResponseBody::Grpc(call) => call.size_hint(),
            ResponseBody::Compressed(body) => body.size_hint(),
            ResponseBody::Keeping(keeping) => keeping.inner.size_hint(),
            ResponseBody::Replayed(replayed) => replayed.size_hint(),
        }
    }
}

/// Counts one call's status: the route's series (`route="-"` for a call
/// no route took), and the access log's field.
pub fn count(route: Option<&RouteShared>, trail: Option<&Trail>, code: Code) {
    route.unwrap_or_else(|| RouteShared::unrouted()).grpc(code);
    if let Some(trail) = trail {
        trail.grpc_status(code as u8);
    }
}

/// A gRPC answer from a backend on its way to the client (see the module
/// notes).
pub struct CallBody {
    inner: ResponseBody,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    route: Option<Arc<RouteShared>>,
    trail: Option<Arc<Trail>>,
    web: Option<Encoder>,
    done: bool,
    recorded: bool,
}

impl std::fmt::Debug for CallBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallBody")
            .field("inner", &self.inner)
            .field("done", &self.done)
            .finish()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl CallBody {
    /// The answer `inner` to a call that must be over by `deadline`,
    /// written back in gRPC-Web when `web` is set.
    pub fn new(
        inner: ResponseBody,
        deadline: Option<Instant>,
        route: Option<Arc<RouteShared>>,
        trail: Option<Arc<Trail>>,
        web: Option<Encoder>,
    ) -> Self {
        Self {
            inner,
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            route,
            trail,
            web,
            done: false,
            recorded: false,
        }
    }

    pub fn inner_mut(&mut self) -> &mut ResponseBody {
        &mut self.inner
    }

    /// Counts the call's status, once.
    pub fn record(&mut self, code: Code) {
        if !std::mem::replace(&mut self.recorded, true) {
            count(self.route.as_deref(), self.trail.as_deref(), code);
        }
    }

    /// Ends the call with the gateway's own status: the backend's stream
    /// is dropped (which resets it), the client gets trailers.
    fn end(&mut self, code: Code, message: &'static str) -> Frame<Bytes> {
        self.inner = ResponseBody::Full(None);
        self.record(code);
        let mut trailers = HeaderMap::with_capacity(2);
        trailers.insert(GRPC_STATUS.clone(), code.value());
        trailers.insert(GRPC_MESSAGE.clone(), HeaderValue::from_static(message));
        self.trailers(trailers)
    }

    /// The frame that carries trailers to the client: HTTP trailers, or
    /// gRPC-Web's trailer frame. Nothing follows it.
    fn trailers(&mut self, trailers: HeaderMap) -> Frame<Bytes> {
        self.done = true;
        match &mut self.web {
            Some(encoder) => Frame::data(encoder.trailers(&trailers)),
            None => Frame::trailers(trailers),
        }
    }
}

impl Body for CallBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready())
                {
                    let frame = this.end(Code::DeadlineExceeded, "deadline exceeded");
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Pending
            }
            Poll::Ready(None) => {
                this.done = true;
                if !this.recorded {
                    // A 200 that ended without a status: the client's
                    // library reports it as an error of its own.
                    this.record(Code::Unknown);
                }
                let rest = this.web.as_mut().and_then(Encoder::finish);
                Poll::Ready(rest.map(|bytes| Ok(Frame::data(bytes))))
            }
            Poll::Ready(Some(Err(error))) => {
                tracing::debug!(%error, "gRPC response stream failed");
                let frame = this.end(Code::Unavailable, "the backend broke the call");
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(match &mut this.web {
                    Some(encoder) => encoder.data(data),
                    None => data,
                })))),
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => {
                        this.record(Code::of(&trailers).unwrap_or(Code::Unknown));
                        Poll::Ready(Some(Ok(this.trailers(trailers))))
                    }
                    Err(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::new())))),
                },
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.web.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match self.web {
            // Re-encoded, with a trailer frame added: unknown.
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}

impl Drop for CallBody {
    fn drop(&mut self) {
        if !self.recorded {
            // Dropped before its end: the client went away.
            self.record(Code::Cancelled);
        }
    }
}

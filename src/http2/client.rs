//! cutover's HTTP/2 client (RFC 9113): requests to h2c and h2 backends
//! over one connection per worker and backend (`backends::h2` pools
//! them), on the framing and HPACK the server already has.
//!
//! A request's head is encoded by its own task (the encoder keeps no
//! table) and queued for the connection's task, which gives it a stream,
//! writes it with whatever else the turn produced in one write, sends the
//! request body within the windows, and hands the answer's head and body
//! back through the stream's shared state (`stream::Shared`), as the
//! server hands a request's body to its reader. The `h2` crate under
//! hyper's client was a third of a proxied gRPC call's instructions
//! (docs/performance.md).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, Method, Request, Response, StatusCode};
use http_body::Body;

use super::hpack;
use super::request::connection_specific;
pub use super::stream::ClientError;
use super::stream::{Head, RecvBody, Shared, Window};

/// How a request on the client ended without an answer.
#[expect(
    clippy::large_enum_variant,
    reason = "the request goes back as it came, to go again: a box would cost each refusal an allocation for nothing"
)]
pub enum Failed<B> {
    Error(ClientError),
    /// The backend did not process it (RFC 9113 §8.7): the request, its
    /// body from the start, to send again.
    Unsent(Request<Resend<B>>),
}

/// Most a request body keeps of what it gave, to be sent again after
/// a refusal; a longer one is not sent again.
const RESEND_BYTES: usize = 64 * 1024;
/// Most frames it keeps (each a slice that pins its buffer).
const RESEND_FRAMES: usize = 64;

/// One frame a body gave.
#[derive(Debug, Clone)]
enum Given {
    Data(Bytes),
    Trailers(Box<http::HeaderMap>),
}

/// A request body that keeps what it gave until the answer's head, so
/// that a stream the backend refused unprocessed (its GOAWAY's last
/// stream below it, or REFUSED_STREAM) goes again on another connection:
/// a backend that closes connections after so many requests (nginx's
/// `keepalive_requests`) refuses those already on their way. Past
/// `RESEND_BYTES` it keeps nothing and cannot go again.
#[derive(Debug)]
pub struct Resend<B> {
    inner: B,
    /// What `inner` gave, in order; `None` once past the bounds or no
    /// longer needed.
    given: Option<Vec<Given>>,
    kept: usize,
    /// When sent again: the next of `given` to give.
    replay: usize,
}

impl<B> Resend<B> {
    pub fn new(inner: B) -> Self {
        Resend {
            inner,
            given: Some(Vec::new()),
            kept: 0,
            replay: 0,
        }
    }

    /// Whether it can be sent again from its start.
    pub(super) fn can_resend(&self) -> bool {
        self.given.is_some()
    }

    /// Back to its start, to be sent again.
    pub(super) fn rewind(&mut self) {
        self.replay = 0;
    }

    /// The answer's head came: nothing will be sent again.
    pub(super) fn forget(&mut self) {
        self.given = None;
    }

    fn keep(&mut self, given: Given, len: usize) {
        self.kept += len;
        match &mut self.given {
            Some(list) if self.kept <= RESEND_BYTES && list.len() < RESEND_FRAMES => {
                list.push(given);
                self.replay = list.len();
            }
            _ => self.given = None,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Resend<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(given) = this.given.as_ref().and_then(|g| g.get(this.replay)) {
            this.replay += 1;
            return Poll::Ready(Some(Ok(match given.clone() {
                Given::Data(data) => http_body::Frame::data(data),
                Given::Trailers(trailers) => http_body::Frame::trailers(*trailers),
            })));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if this.given.is_some() {
                if let Some(data) = frame.data_ref() {
                    this.keep(Given::Data(data.clone()), data.len());
                } else if let Some(trailers) = frame.trailers_ref() {
                    this.keep(Given::Trailers(Box::new(trailers.clone())), 0);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let replaying = self
            .given
            .as_ref()
            .is_some_and(|given| self.replay < given.len());
        !replaying && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What a client connection asks of its backend.
#[derive(Debug, Clone, Copy)]
pub struct ClientSettings {
    /// SETTINGS_MAX_HEADER_LIST_SIZE: an answer's head past it fails the
    /// stream.
    pub max_header_list_size: u32,
    /// With no stream open this long, the connection closes.
    pub idle_timeout: Duration,
}

/// Streams a connection takes before the peer's SETTINGS say how many
/// (RFC 9113 §6.5.2 advises no fewer than 100).
const INITIAL_MAX_STREAMS: usize = 100;

/// A request waiting for the connection's task to give it a stream.
pub(super) struct Opening<B> {
    pub(super) block: Bytes,
    /// `None`: the request ended with its head.
    pub(super) body: Option<Resend<B>>,
    /// No content may come back (HEAD).
    pub(super) bodiless: bool,
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Queue<B> {
    pub(super) opening: Vec<Opening<B>>,
    /// Bodies of streams refused unprocessed, for their senders (by the
    /// address of the stream's shared state).
    pub(super) returned: Vec<(usize, Resend<B>)>,
    /// The connection's task.
    pub(super) waker: Option<Waker>,
    /// Streams queued or open.
    pub(super) active: usize,
    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS.
    pub(super) max: usize,
    /// Why it takes no new streams.
    pub(super) closed: Option<ClientError>,
}

pub(super) struct Handle<B> {
    queue: Mutex<Queue<B>>,
    pub(super) window: Arc<Window>,
}

impl<B> Handle<B> {
    pub(super) fn new(window: Arc<Window>) -> Self {
        Handle {
            queue: Mutex::new(Queue {
                opening: Vec::new(),
                returned: Vec::new(),
                waker: None,
                active: 0,
                max: INITIAL_MAX_STREAMS,
                closed: None,
            }),
            window,
        }
    }

    pub(super) fn queue(&self) -> MutexGuard<'_, Queue<B>> {
        // Every step leaves the queue consistent: a poisoned lock only
        // means a panic elsewhere held it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sends requests on one client connection; cloned by everyone who does.
pub struct SendRequest<B> {
    handle: Arc<Handle<B>>,
}

impl<B> Clone for SendRequest<B> {
    fn clone(&self) -> Self {
        SendRequest {
            handle: Arc::clone(&self.handle),
        }
    }
}

impl<B> SendRequest<B> {
    pub(super) fn new(handle: Arc<Handle<B>>) -> Self {
        SendRequest { handle }
    }

    /// Whether it takes no more streams (ended, idle, or going away).
    pub fn is_closed(&self) -> bool {
        self.handle.queue().closed.is_some()
    }

    /// Whether a new stream fits now.
    pub fn has_room(&self) -> bool {
        let queue = self.handle.queue();
        queue.closed.is_none() && queue.active < queue.max
    }

    /// Sends `request` on a new stream (its URI absolute: scheme and
    /// authority go as `:scheme` and `:authority`); the request back when
    /// the connection takes no more.
    #[expect(
        clippy::result_large_err,
        reason = "the request comes back as it went in, to go to another connection: boxed, every full connection would cost an allocation"
    )]
    pub fn send(&self, request: Request<Resend<B>>) -> Result<ResponseFuture<B>, Request<Resend<B>>>
    where
        B: Body<Data = Bytes> + Unpin,
    {
        let (parts, body) = request.into_parts();
        let shared = Shared::new(&self.handle.window);
        let mut block = BytesMut::with_capacity(256);
        let encoded = encode_head(&parts, &mut block);
        let mut kept = None;
        match encoded {
            Err(error) => {
                shared.recv().head = Head::Failed(error);
                kept = Some(body);
            }
            Ok(()) => {
                let mut queue = self.handle.queue();
                if queue.closed.is_some() || queue.active >= queue.max {
                    drop(queue);
                    return Err(Request::from_parts(parts, body));
                }
                let body = match body.is_end_stream() {
                    true => {
                        kept = Some(body);
                        None
                    }
                    false => Some(body),
                };
                queue.active += 1;
                queue.opening.push(Opening {
                    block: block.freeze(),
                    body,
                    bodiless: parts.method == Method::HEAD,
                    shared: Arc::clone(&shared),
                });
                if let Some(waker) = &queue.waker {
                    waker.wake_by_ref();
                }
            }
        }
        Ok(ResponseFuture {
            shared: Some(shared),
            handle: Arc::clone(&self.handle),
            parts: Some(parts),
            kept,
        })
    }
}

/// A request's pseudo-fields and headers as one HPACK block (§8.3.1).
fn encode_head(parts: &http::request::Parts, out: &mut BytesMut) -> Result<(), ClientError> {
    if parts.method == Method::CONNECT {
        return Err(ClientError::Request(
            "CONNECT is not proxied to HTTP/2 backends",
        ));
    }
    match parts.method {
        Method::GET => hpack::encode_indexed(2, out),
        Method::POST => hpack::encode_indexed(3, out),
        ref other => hpack::encode_named(2, other.as_str().as_bytes(), out),
    }
    match parts.uri.scheme_str() {
        Some("https") => hpack::encode_indexed(7, out),
        _ => hpack::encode_indexed(6, out),
    }
    let host = parts.headers.get(header::HOST).map(|h| h.as_bytes());
    let authority = match parts.uri.authority() {
        Some(authority) => authority.as_str().as_bytes(),
        None => host.ok_or(ClientError::Request("no authority"))?,
    };
    hpack::encode_named(1, authority, out);
    match parts.uri.path_and_query().map(|p| p.as_str()) {
        None | Some("/") | Some("") => hpack::encode_indexed(4, out),
        Some(path) => hpack::encode_named(4, path.as_bytes(), out),
    }
    for (name, value) in &parts.headers {
        if connection_specific(name)
            || *name == header::HOST
            || (*name == header::TE && value != "trailers")
        {
            continue;
        }
        hpack::encode_field(name, value.as_bytes(), value.is_sensitive(), out);
    }
    Ok(())
}

/// The answer's head to a request sent on a client connection.
pub struct ResponseFuture<B> {
    shared: Option<Arc<Shared>>,
    handle: Arc<Handle<B>>,
    /// The request's head, to send it again if it is refused unsent.
    parts: Option<http::request::Parts>,
    /// The body of a request that ended with its head.
    kept: Option<Resend<B>>,
}

impl<B: Unpin> Future for ResponseFuture<B> {
    type Output = Result<Response<RecvBody>, Failed<B>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(shared) = this.shared.take() else {
            return Poll::Ready(Err(Failed::Error(ClientError::Request(
                "answer polled after it came",
            ))));
        };
        let mut recv = shared.recv();
        match std::mem::replace(&mut recv.head, Head::Taken) {
            Head::Ready(head) => {
                let ended = recv.ended && recv.is_drained();
                drop(recv);
                let bodiless = this
                    .parts
                    .as_ref()
                    .is_some_and(|p| p.method == Method::HEAD)
                    || head.status == StatusCode::NO_CONTENT
                    || head.status == StatusCode::NOT_MODIFIED;
                let length = match bodiless {
                    true => Some(0),
                    false => content_length(&head.headers),
                };
                let body = match ended {
                    true => RecvBody::new(None, length),
                    false => RecvBody::new(Some(shared), length),
                };
                Poll::Ready(Ok(Response::from_parts(head, body)))
            }
            Head::Failed(ClientError::Refused) => {
                drop(recv);
                Poll::Ready(Err(this.refused(&shared)))
            }
            Head::Failed(error) => Poll::Ready(Err(Failed::Error(error))),
            head @ (Head::Waiting | Head::Taken) => {
                recv.head = head;
                recv.wait(cx);
                drop(recv);
                this.shared = Some(shared);
                Poll::Pending
            }
        }
    }
}

impl<B> ResponseFuture<B> {
    /// The stream was refused: the request back if none of it went out
    /// (still queued, or ended with its head).
    fn refused(&mut self, shared: &Arc<Shared>) -> Failed<B> {
        let body = self.kept.take().or_else(|| {
            let mut queue = self.handle.queue();
            let key = Arc::as_ptr(shared) as usize;
            let at = queue.returned.iter().position(|(k, _)| *k == key)?;
            Some(queue.returned.swap_remove(at).1)
        });
        match (self.parts.take(), body) {
            (Some(parts), Some(body)) => Failed::Unsent(Request::from_parts(parts, body)),
            _ => Failed::Error(ClientError::Refused),
        }
    }
}

impl<B> Drop for ResponseFuture<B> {
    fn drop(&mut self) {
        // Gone before the head: the connection resets the stream.
        if let Some(shared) = &self.shared {
            let mut recv = shared.recv();
            recv.dropped = true;
            match recv.head {
                Head::Waiting => {
                    drop(recv);
                    self.handle.window.abandon();
                }
                Head::Failed(ClientError::Refused) => {
                    drop(recv);
                    let key = Arc::as_ptr(shared) as usize;
                    self.handle.queue().returned.retain(|(k, _)| *k != key);
                }
                _ => {}
            }
        }
    }
}

/// A head's `content-length`, when it names one valid length.
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let first = values.next()?;
    let n = std::str::from_utf8(first.as_bytes()).ok()?.parse().ok()?;
    values.all(|v| v == first).then_some(n)
}

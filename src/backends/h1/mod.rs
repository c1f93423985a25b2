//! Plain HTTP/1.1 upstream connections: cutover's own client codec.
//!
//! hyper's client runs each exchange through a dispatcher, a request
//! channel and a response oneshot, and needs a poll of the whole
//! dispatcher to tell whether an idle connection is still usable: 45 % of
//! the instructions of a proxied request (callgrind). For plain HTTP/1.1
//! backends cutover writes the request head itself, parses the response
//! head with `httparse`, decodes the body framing (length, chunked, to
//! close) and streams the request body while it reads, all from the
//! request's own task. TLS, h2 and h2c backends and protocol upgrades
//! still go through hyper.
//!
//! Framing follows RFC 9112 §6: no body for HEAD, 1xx, 204 and 304;
//! chunked when `Transfer-Encoding` is exactly `chunked` (any other coding,
//! or chunked twice, is refused: the body would reach the client in a
//! coding nobody names); else `Content-Length` (conflicting or malformed
//! values are refused); else to end of connection. Chunk-size lines with
//! control characters are refused. A connection is pooled again only after a complete, clean
//! exchange with nothing left over. Interim 1xx responses are handed to
//! the caller's [`Informational`] hook, if any, and otherwise skipped.

use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::ConnectError;

mod answer_framing;

use crate::telemetry::series::Histogram;
use answer_framing::body_framing;
#[cfg(test)]
use answer_framing::chunk_size;
pub use answer_framing::{header_tokens, UpstreamBody};

/// Largest response head accepted from a backend.
const MAX_HEAD: usize = 64 * 1024;
/// Most response headers accepted from a backend.
const MAX_HEADERS: usize = 128;
/// Read buffer per connection (grows to `MAX_HEAD` for a large head).
const READ_CHUNK: usize = 16 * 1024;
/// Longest chunk-size line (size plus extensions) or trailer section.
const MAX_CHUNK_LINE: usize = 4096;

/// Told each interim (1xx) response head before the final one, as
/// hyper's `ext::on_informational` is.
pub type Informational<'a> = &'a (dyn Fn(StatusCode, &HeaderMap) + Sync);

/// Why an exchange on an upstream connection failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the connection closed before the response was complete")]
    Closed,
    #[error("invalid response from the backend: {0}")]
    Invalid(&'static str),
    #[error("request body: {0}")]
    RequestBody(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// No response head within the route timeout, counted from the end
    /// of the request body.
    #[error("no response head within {0:?} of the end of the request")]
    Timeout(Duration),
}

/// One upstream HTTP/1.1 connection and the bytes read from it that have
/// not been consumed yet.
pub struct H1Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The client its PROXY header named: it serves no other.
    client: Option<std::net::SocketAddr>,
    /// The response timeout's timer, kept from one request to the next:
    /// moving a registered timer's deadline later is one atomic exchange,
    /// where a timer per request is an insertion into the runtime's timer
    /// wheel and a removal from it every time. Idle in the pool it may
    /// still fire once, waking the task of its last request for nothing.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl std::fmt::Debug for H1Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Conn")
            .field("peer", &self.stream.peer_addr().ok())
            .finish_non_exhaustive()
    }
}

impl H1Conn {
    fn new(stream: TcpStream, client: Option<std::net::SocketAddr>) -> Self {
        Self {
            stream,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            client,
            timer: None,
        }
    }

    /// Sets the response timer to `at` (its deadline only moves, unless
    /// `at` is earlier than the one it had).
    fn arm(&mut self, at: tokio::time::Instant) -> Pin<&mut tokio::time::Sleep> {
        match &mut self.timer {
            Some(timer) => {
                timer.as_mut().reset(at);
                timer.as_mut()
            }
            timer => timer
                .insert(Box::pin(tokio::time::sleep_until(at)))
                .as_mut(),
        }
    }

    fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads more bytes after the buffered ones; `Ok(0)` at end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.buf.len() < MAX_HEAD {
                self.buf.resize((self.buf.len() * 2).min(MAX_HEAD), 0);
            } else {
                return Poll::Ready(Err(io::Error::other("response head too large")));
            }
        }
        let mut read = ReadBuf::new(&mut self.buf[self.end..]);
        // A short read tells tokio the socket is drained, so an idle
        // connection is known quiet without another system call.
        ready!(Pin::new(&mut self.stream).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        self.end += n;
        Poll::Ready(Ok(n))
    }

    /// Whether an idle connection can take a request: an idle HTTP/1.1
    /// connection has nothing to say, so anything readable (end of
    /// stream, stray bytes) means it must go.
    fn reusable(&mut self) -> bool {
        if !self.buffered().is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        if self.stream.poll_read_ready(&mut cx).is_pending() {
            return true;
        }
        // Readiness can be left over from the last read: ask the socket.
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// One worker's idle connections, with the time each became idle.
type Share = Mutex<VecDeque<(Instant, H1Conn)>>;

/// Idle connections of one backend, most recently used last, in one
/// share per data-plane worker (see `set_shards`): a connection is taken
/// and returned by the worker whose reactor drives it.
#[derive(Debug)]
pub struct H1Pool {
    shares: Box<[Share]>,
    max_idle: usize,
    /// A connection idle longer is never handed out again.
    idle_timeout: Duration,
    /// How long new connections took to open (the backend's histogram).
    connect_time: std::sync::Arc<Histogram>,
}

impl H1Pool {
    pub fn new(
        max_idle: usize,
        idle_timeout: Duration,
        connect_time: std::sync::Arc<Histogram>,
    ) -> Self {
        Self {
            shares: (0..super::shards())
                .map(|_| Mutex::new(VecDeque::new()))
                .collect(),
            max_idle,
            idle_timeout,
            connect_time,
        }
    }

    /// A new connection to `addr`, its connect time recorded; with
    /// `proxy`, its PROXY header written first.
    async fn connect(
        &self,
        addr: &str,
        timeout: Duration,
        proxy: Option<&super::ProxyHeader>,
    ) -> Result<H1Conn, ConnectError> {
        let started = Instant::now();
        let mut conn = connect(addr, timeout).await?;
        self.connect_time.record(started.elapsed());
        if let Some(proxy) = proxy {
            let header = proxy.bytes();
            tokio::io::AsyncWriteExt::write_all(&mut conn.stream, &header).await?;
            conn.client = Some(proxy.client);
        }
        Ok(conn)
    }

    /// The calling worker's share.
    fn share(&self) -> &Share {
        // INVARIANT: `shares` is never empty (`shards()` is at least 1), so
        // the index is in range.
        debug_assert!(!self.shares.is_empty());
        &self.shares[super::shard() % self.shares.len()]
    }

    /// The most recently used idle connection that is still usable and
    /// has not been idle past `idle_timeout` (the backend may be about to
    /// close it, or have closed it already); for a backend that gets PROXY
    /// headers, one whose header named `client`.
    fn take(&self, client: Option<std::net::SocketAddr>) -> Option<H1Conn> {
        let now = Instant::now();
        loop {
            let mut idle = self.share().lock().unwrap_or_else(PoisonError::into_inner);
            let at = if client.is_none() {
                idle.len().checked_sub(1)?
            } else {
                idle.iter().rposition(|(_, conn)| conn.client == client)?
            };
            let (since, mut conn) = idle.remove(at)?;
            if now.duration_since(since) > self.idle_timeout {
                // The newest is too old: so is every older one.
                idle.drain(..at);
                return None;
            }
            drop(idle);
            if conn.reusable() {
                return Some(conn);
            }
        }
    }

    /// Returns a connection whose exchange completed cleanly, and closes
    /// those idle longer than `idle_timeout` (the least recently used end).
    pub fn put(&self, conn: H1Conn) {
        let now = Instant::now();
        let mut idle = self.share().lock().unwrap_or_else(PoisonError::into_inner);
        while idle
            .front()
            .is_some_and(|(since, _)| now.duration_since(*since) > self.idle_timeout)
        {
            idle.pop_front();
        }
        if idle.len() < self.max_idle {
            idle.push_back((now, conn));
        }
    }
}

/// Opens a new connection to `addr` within `timeout`.
async fn connect(addr: &str, timeout: Duration) -> Result<H1Conn, ConnectError> {
    Ok(H1Conn::new(super::dial(addr, timeout).await?, None))
}

/// Why an exchange through a backend's pool failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Send(#[from] SendError),
}

/// Sends `req` (origin-form target, hop-by-hop headers already gone) to
/// the backend at `addr`, on the most recently used idle connection of
/// `pool` or a new one, and reads up to the end of the response head,
/// which must come within `response_timeout` of the request's end (one
/// deadline for every attempt).
///
/// A pooled connection can be closed by the backend (idle timeout,
/// restart) just as it is handed a request; the request then fails
/// without an answer. An idempotent request without a body is then sent
/// once more on a new connection (with `resend_unanswered`: the caller's
/// own retries may count such a failure instead), as nginx and Envoy do;
/// anything else fails (502).
///
/// An `async move` block rather than an `async fn`, which would copy the
/// request into a local of its own before encoding it.
#[expect(clippy::manual_async_fn, reason = "no copy of the request argument")]
#[allow(clippy::too_many_arguments)]
pub fn request<'h, 'a, B, I>(
    pool: &'a H1Pool,
    addr: &'a str,
    connect_timeout: Duration,
    response_timeout: Duration,
    req: Request<B>,
    extra_headers: I,
    informational: Option<Informational<'a>>,
    proxy: Option<&'a super::ProxyHeader>,
    resend_unanswered: bool,
) -> impl std::future::Future<Output = Result<Response<Box<UpstreamBody<B>>>, ExchangeError>>
       + use<'h, 'a, B, I>
where
    I: IntoIterator<Item = (&'h HeaderName, &'h [u8])>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    async move {
        // Connecting is the rare path once the pool is warm: its futures live
        // on the heap so that this one, moved on every request, stays small.
        let encoded = Encoded::with_headers(req, extra_headers);
        let mut deadline = Deadline::new(response_timeout);
        let Some(pooled) = pool.take(proxy.map(|p| p.client)) else {
            let fresh = Box::pin(pool.connect(addr, connect_timeout, proxy)).await?;
            return Ok(send(fresh, encoded, &mut deadline, informational).await?);
        };
        let replay = (resend_unanswered && encoded.replayable()).then(|| encoded.replay());
        match (
            send(pooled, encoded, &mut deadline, informational).await,
            replay,
        ) {
            (Err(error), Some(replay)) if error.is_unanswered() => {
                tracing::debug!(backend = addr, %error, "pooled connection closed under the request; sending it again on a new one");
                Box::pin(async {
                    let fresh = pool.connect(addr, connect_timeout, proxy).await?;
                    Ok(send(fresh, replay, &mut deadline, informational).await?)
                })
                .await
            }
            (result, _) => Ok(result?),
        }
    }
}

impl SendError {
    /// The connection failed before the backend answered anything.
    fn is_unanswered(&self) -> bool {
        matches!(self, SendError::Closed | SendError::Io(_))
    }
}

/// The route timeout of one request: it starts when the request has been
/// written in full (a slow upload is the idle timeout's business, not
/// this one's) and is shared by every attempt.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    timeout: Duration,
    at: Option<tokio::time::Instant>,
}

impl Deadline {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout, at: None }
    }

    /// The request is written: the clock starts, unless an earlier
    /// attempt started it already.
    fn start(&mut self) -> tokio::time::Instant {
        *self
            .at
            .get_or_insert_with(|| tokio::time::Instant::now() + self.timeout)
    }
}

/// A request ready to write: its head encoded, its body and framing.
struct Encoded<B> {
    head: Bytes,
    body: Option<B>,
    framing: RequestFraming,
    method: Method,
}

impl<B: Body> Encoded<B> {
    #[cfg(test)]
    fn new(req: Request<B>) -> Self {
        Self::with_headers(req, [])
    }

    /// Encodes `req` with `extra` headers written after its own (which
    /// must not have them already).
    fn with_headers<'h>(
        mut req: Request<B>,
        extra: impl IntoIterator<Item = (&'h HeaderName, &'h [u8])>,
    ) -> Self {
        let (head, framing) = encode_head(&mut req, extra);
        let method = req.method().clone();
        Self {
            head,
            body: Some(req.into_body()),
            framing,
            method,
        }
    }

    /// Whether the request can be sent again as it is: idempotent
    /// (RFC 9110 §9.2.2) and without a body.
    fn replayable(&self) -> bool {
        self.framing == RequestFraming::None && self.method.is_idempotent()
    }

    fn replay(&self) -> Self {
        Self {
            head: self.head.clone(),
            body: None,
            framing: self.framing,
            method: self.method.clone(),
        }
    }
}

/// Sends an encoded request on `conn` and reads up to the end of the
/// response head. The returned body goes on writing the request body
/// while it reads the response; once the exchange is complete and clean,
/// `UpstreamBody::take_connection` hands the connection back for the pool.
async fn send<B>(
    mut conn: H1Conn,
    request: Encoded<B>,
    deadline: &mut Deadline,
    informational: Option<Informational<'_>>,
) -> Result<Response<Box<UpstreamBody<B>>>, SendError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let head_request = request.method == Method::HEAD;
    let mut writer = Some(RequestWriter::new(
        request.head,
        request.body,
        request.framing,
    ));
    let mut write_error = None;
    let mut armed = false;
    let mut parsed = std::future::poll_fn(|cx| {
        if let Some(w) = writer.as_mut() {
            match w.poll(cx, &mut conn.stream) {
                Poll::Ready(Ok(())) => writer = None,
                // The client's body failed: the backend has half a
                // request and no answer to give.
                Poll::Ready(Err(error @ SendError::RequestBody(_))) => {
                    return Poll::Ready(Err(error))
                }
                // The backend may have answered before reading the whole
                // request (and closed its side): its answer still counts.
                Poll::Ready(Err(error)) => {
                    writer = None;
                    write_error = Some(error);
                }
                Poll::Pending => {}
            }
        }
        match poll_head(&mut conn, cx, informational) {
            Poll::Ready(Err(error)) => {
                return Poll::Ready(Err(write_error.take().unwrap_or(error)))
            }
            Poll::Ready(Ok(head)) => return Poll::Ready(Ok(head)),
            Poll::Pending => {}
        }
        if writer.is_some() {
            return Poll::Pending;
        }
        let timer = match (armed, conn.timer.as_mut()) {
            (true, Some(timer)) => timer.as_mut(),
            _ => {
                armed = true;
                conn.arm(deadline.start())
            }
        };
        match timer.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(SendError::Timeout(deadline.timeout))),
            Poll::Pending => Poll::Pending,
        }
    })
    .await?;
    let (framing, keep_alive) = body_framing(&mut parsed, head_request)?;
    let mut body = Box::new(UpstreamBody {
        conn: Some(conn),
        writer,
        write_failed: write_error.is_some(),
        framing,
        keep_alive,
        idle: None,
    });
    if body.framing.is_finished() {
        body.complete();
    }
    let mut response = Response::new(body);
    *response.status_mut() = parsed.status;
    *response.version_mut() = parsed.version;
    *response.headers_mut() = parsed.headers;
    Ok(response)
}

/// A response head as the backend sent it.
struct ParsedHead {
    status: StatusCode,
    version: Version,
    /// Without `Keep-Alive`, and without `Connection` when it held only
    /// `close` and `keep-alive` (what nearly every backend sends): both
    /// are hop-by-hop, and removing them later cost more than the rest
    /// of the head. A `Connection` that names other headers stays, for
    /// the proxy to strip those too.
    headers: HeaderMap,
    /// `Connection` has `close`.
    close: bool,
    /// `Connection` has `keep-alive`.
    keep_alive: bool,
    /// The head has a `Transfer-Encoding` field.
    transfer_encoding: bool,
    /// What its `Content-Length` fields say together (read as the head
    /// is, instead of looked up again): no length, one, or why there is
    /// no usable one.
    content_length: Result<Option<u64>, &'static str>,
}

/// Reads until a final (non-1xx) response head is complete.
fn poll_head(
    conn: &mut H1Conn,
    cx: &mut Context<'_>,
    informational: Option<Informational<'_>>,
) -> Poll<Result<ParsedHead, SendError>> {
    loop {
        if !conn.buffered().is_empty() {
            let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut []);
            let parsed = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
                &mut response,
                conn.buffered(),
                &mut slots,
            ) {
                Ok(httparse::Status::Complete(len)) => {
                    match build_head(&response, conn.buffered().get(..len).unwrap_or_default()) {
                        Ok(head) => Some((len, head)),
                        Err(error) => return Poll::Ready(Err(error)),
                    }
                }
                Ok(httparse::Status::Partial) => None,
                Err(httparse::Error::TooManyHeaders) => {
                    return Poll::Ready(Err(SendError::Invalid("too many response headers")))
                }
                Err(_) => return Poll::Ready(Err(SendError::Invalid("malformed response head"))),
            };
            if let Some((len, head)) = parsed {
                conn.consume(len);
                if head.status == StatusCode::SWITCHING_PROTOCOLS {
                    return Poll::Ready(Err(SendError::Invalid(
                        "switched protocols without being asked to",
                    )));
                }
                // 100 Continue, 103 Early Hints: interim, the final answer follows.
                if head.status.is_informational() {
                    if let Some(hook) = informational {
                        hook(head.status, &head.headers);
                    }
                    continue;
                }
                return Poll::Ready(Ok(head));
            }
            if conn.buffered().len() >= MAX_HEAD {
                return Poll::Ready(Err(SendError::Invalid("response head larger than 64 KiB")));
            }
        }
        match ready!(conn.poll_fill(cx)) {
            // `Closed` means nothing of the answer arrived (what makes a
            // request safe to send again); half a head is a bad answer.
            Ok(0) if conn.buffered().is_empty() => return Poll::Ready(Err(SendError::Closed)),
            Ok(0) => {
                return Poll::Ready(Err(SendError::Invalid(
                    "connection closed in the middle of the response head",
                )))
            }
            Ok(_) => {}
            Err(error) => return Poll::Ready(Err(SendError::Io(error))),
        }
    }
}

/// The response head `response` parsed from `raw`. Its header values
/// share one copy of `raw` instead of one allocation each.
fn build_head(response: &httparse::Response<'_, '_>, raw: &[u8]) -> Result<ParsedHead, SendError> {
    let status = response
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(SendError::Invalid("bad status code"))?;
    let version = match response.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let (mut close, mut keep_alive, mut names_others) = (false, false, false);
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                } else if !token.is_empty() {
                    names_others = true;
                }
            }
        }
    }
    let block = Bytes::copy_from_slice(raw);
    let (mut transfer_encoding, mut content_length) = (false, Ok(None));
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    for h in response.headers.iter() {
        let hop = h.name.eq_ignore_ascii_case("keep-alive")
            || (!names_others && h.name.eq_ignore_ascii_case("connection"));
        if hop {
            continue;
        }
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| SendError::Invalid("bad header name"))?;
        if name == header::TRANSFER_ENCODING {
            transfer_encoding = true;
        } else if name == header::CONTENT_LENGTH {
            content_length = content_length.and_then(|known| add_length(known, h.value));
        }
        let value = HeaderValue::from_maybe_shared(piece_of(&block, raw, h.value))
            .map_err(|_| SendError::Invalid("bad header value"))?;
        headers.append(name, value);
    }
    Ok(ParsedHead {
        status,
        version,
        headers,
        close,
        keep_alive,
        transfer_encoding,
        content_length,
    })
}

/// `part`, a slice of `raw`, as the same bytes of `block` (a copy of
/// `raw`): a reference, not a copy. (A `part` outside `raw` is copied.)
fn piece_of(block: &Bytes, raw: &[u8], part: &[u8]) -> Bytes {
    let at = part.as_ptr().addr().wrapping_sub(raw.as_ptr().addr());
    match at.checked_add(part.len()) {
        Some(end) if end <= raw.len() && raw.len() == block.len() => block.slice(at..end),
        _ => Bytes::copy_from_slice(part),
    }
}

/// The length `known` from earlier `Content-Length` fields, with `value`
/// (a comma-separated list of the same number) read too.
fn add_length(mut known: Option<u64>, value: &[u8]) -> Result<Option<u64>, &'static str> {
    for part in value.split(|b| *b == b',') {
        let part = part.trim_ascii();
        let n = std::str::from_utf8(part)
            .ok()
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u64>().ok())
            .ok_or("bad Content-Length")?;
        if known.is_some_and(|l| l != n) {
            return Err("conflicting Content-Length values");
        }
        known = Some(n);
    }
    Ok(known)
}

/// Encodes the request head and decides how the body is framed.
fn encode_head<'h, B: Body>(
    req: &mut Request<B>,
    extra: impl IntoIterator<Item = (&'h HeaderName, &'h [u8])>,
) -> (Bytes, RequestFraming) {
    let body = req.body();
    let framing = if body.is_end_stream() {
        RequestFraming::None
    } else {
        match body.size_hint().exact() {
            Some(n) => RequestFraming::Length(n),
            None => RequestFraming::Chunked,
        }
    };
    let headers = req.headers_mut();
    match framing {
        RequestFraming::Length(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        RequestFraming::Chunked => {
            headers.remove(header::CONTENT_LENGTH);
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        RequestFraming::None => {}
    }
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut head = BytesMut::with_capacity(256 + req.headers().len() * 32);
    head.extend_from_slice(req.method().as_str().as_bytes());
    head.extend_from_slice(b" ");
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    let mut field = |name: &HeaderName, value: &[u8]| {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    };
    for (name, value) in req.headers() {
        field(name, value.as_bytes());
    }
    for (name, value) in extra {
        field(name, value);
    }
    head.extend_from_slice(b"\r\n");
    (head.freeze(), framing)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestFraming {
    None,
    Length(u64),
    Chunked,
}

/// Writes the request: head, then the body as it arrives, framed.
struct RequestWriter<B> {
    out: VecDeque<Bytes>,
    body: Option<B>,
    framing: RequestFraming,
    done: bool,
}

impl<B> RequestWriter<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn new(head: Bytes, body: Option<B>, framing: RequestFraming) -> Self {
        let mut out = VecDeque::with_capacity(4);
        out.push_back(head);
        Self {
            out,
            body: body.filter(|_| framing != RequestFraming::None),
            framing,
            done: false,
        }
    }

    /// Writes what it can; ready once the whole request is written.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut TcpStream,
    ) -> Poll<Result<(), SendError>> {
        loop {
            while let Some(first) = self.out.front() {
                // One piece (a head alone, the common case) goes out by
                // `send`: `writev` takes the file-system path through the
                // kernel (`vfs_writev`, the iovec's import; docs/performance.md,
                // "The kernel's side of an HTTP/2 request").
                let mut written = if self.out.len() == 1 {
                    ready!(Pin::new(&mut *stream).poll_write(cx, first))?
                } else {
                    let mut slices = [IoSlice::new(&[]); 8];
                    let count = self.out.len().min(slices.len());
                    for (slice, bytes) in slices.iter_mut().zip(self.out.iter()) {
                        *slice = IoSlice::new(bytes);
                    }
                    ready!(Pin::new(&mut *stream).poll_write_vectored(cx, &slices[..count]))?
                };
                if written == 0 {
                    return Poll::Ready(Err(SendError::Closed));
                }
                while written > 0 {
                    let Some(front) = self.out.front_mut() else {
                        break;
                    };
                    if written >= front.len() {
                        written -= front.len();
                        self.out.pop_front();
                    } else {
                        let _ = front.split_to(written);
                        written = 0;
                    }
                }
            }
            if self.done {
                return Poll::Ready(Ok(()));
            }
            let Some(body) = self.body.as_mut() else {
                self.done = true;
                continue;
            };
            match ready!(Pin::new(body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => {
                        if self.framing == RequestFraming::Chunked {
                            self.out
                                .push_back(Bytes::from(format!("{:x}\r\n", data.len())));
                            self.out.push_back(data);
                            self.out.push_back(Bytes::from_static(b"\r\n"));
                        } else {
                            self.out.push_back(data);
                        }
                    }
                    // Trailers end the body; only chunked framing can carry them.
                    Err(frame) => {
                        if let (Ok(trailers), RequestFraming::Chunked) =
                            (frame.into_trailers(), self.framing)
                        {
                            let mut last = BytesMut::from(&b"0\r\n"[..]);
                            for (name, value) in &trailers {
                                last.extend_from_slice(name.as_str().as_bytes());
                                last.extend_from_slice(b": ");
                                last.extend_from_slice(value.as_bytes());
                                last.extend_from_slice(b"\r\n");
                            }
                            last.extend_from_slice(b"\r\n");
                            self.out.push_back(last.freeze());
                            self.body = None;
                            self.done = true;
                        }
                    }
                },
                Some(Err(error)) => return Poll::Ready(Err(SendError::RequestBody(error.into()))),
                None => {
                    if self.framing == RequestFraming::Chunked {
                        self.out.push_back(Bytes::from_static(b"0\r\n\r\n"));
                    }
                    self.body = None;
                    self.done = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_histogram() -> std::sync::Arc<Histogram> {
        std::sync::Arc::new(Histogram::new(
            crate::telemetry::metrics::CONNECT_DURATION_BUCKETS,
        ))
    }
    use http_body_util::channel::Channel;
    use http_body_util::{BodyExt, Empty, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::oneshot;

    /// What one exchange came to: status, headers, body, trailers, and
    /// whether the connection was handed back for reuse.
    #[derive(Debug)]
    struct Outcome {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        trailers: Option<HeaderMap>,
        reusable: bool,
    }

    /// A backend that reads one request (head plus `body_len` bytes),
    /// reports what it read, answers with `response`, and closes the
    /// connection if `close`, else holds it open for a while.
    async fn backend(
        response: &[u8],
        body_len: usize,
        close: bool,
    ) -> (String, oneshot::Receiver<Vec<u8>>) {
        let response = response.to_vec();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let head_end = seen.windows(4).position(|w| w == b"\r\n\r\n");
                if head_end.is_some_and(|end| seen.len() >= end + 4 + body_len) {
                    break;
                }
                let n = stream.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(seen);
            stream.write_all(&response).await.unwrap();
            if close {
                return;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        (addr, rx)
    }

    fn get(method: Method) -> Request<Empty<Bytes>> {
        let mut req = Request::new(Empty::new());
        *req.method_mut() = method;
        *req.uri_mut() = "/x?y=1".parse().unwrap();
        req.headers_mut()
            .insert(header::HOST, HeaderValue::from_static("a.test"));
        req
    }

    async fn exchange<B>(
        response: &[u8],
        req: Request<B>,
        body_len: usize,
        close: bool,
    ) -> (Result<Outcome, SendError>, String)
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (addr, seen) = backend(response, body_len, close).await;
        let conn = connect(&addr, Duration::from_secs(1)).await.unwrap();
        let outcome = async {
            let response = send(
                conn,
                Encoded::new(req),
                &mut Deadline::new(Duration::from_secs(5)),
                None,
            )
            .await?;
            let (parts, mut body) = response.into_parts();
            let mut data = BytesMut::new();
            let mut trailers = None;
            while let Some(frame) = body.frame().await {
                match frame?.into_data() {
                    Ok(bytes) => data.extend_from_slice(&bytes),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                }
            }
            Ok(Outcome {
                status: parts.status,
                headers: parts.headers,
                body: data.freeze(),
                trailers,
                reusable: body.take_connection().is_some(),
            })
        }
        .await;
        let request = String::from_utf8_lossy(&seen.await.unwrap_or_default()).into_owned();
        (outcome, request)
    }

    async fn answer(response: &[u8]) -> Outcome {
        exchange(response, get(Method::GET), 0, false)
            .await
            .0
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn refusal(response: &[u8]) -> SendError {
        match exchange(response, get(Method::GET), 0, true).await.0 {
            Ok(outcome) => panic!("accepted: {outcome:?}"),
            Err(error) => error,
        }
    }

    /// A framed response body and how it is cut.
    fn framed(body: &[u8], chunks: &[usize], chunked: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if chunked {
            out.extend_from_slice(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
            let mut rest = body;
            let mut sizes = chunks.iter().cycle();
            while !rest.is_empty() {
                let n = sizes.next().copied().unwrap_or(1).clamp(1, rest.len());
                out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                out.extend_from_slice(&rest[..n]);
                out.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            out.extend_from_slice(b"0\r\n\r\n");
        } else {
            out.extend_from_slice(
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes(),
            );
            out.extend_from_slice(body);
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            // Each case is a real loopback exchange.
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64),
            ..Default::default()
        })]

        /// Arbitrary bytes from a backend: an answer or an error, never a panic.
        #[test]
        fn arbitrary_responses_never_panic(response in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let _ = runtime.block_on(exchange(&response, get(Method::GET), 0, true));
        }

        /// A response cut anywhere before its framing ends is never
        /// delivered as complete; whole, it is delivered exactly.
        #[test]
        fn truncated_bodies_are_never_complete(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            chunks in proptest::collection::vec(1usize..200, 1..6),
            chunked in proptest::bool::ANY,
            cut in 0.0f64..1.0,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let whole = framed(&body, &chunks, chunked);
            let outcome = runtime.block_on(exchange(&whole, get(Method::GET), 0, true)).0;
            let outcome = outcome.map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            proptest::prop_assert_eq!(&outcome.body[..], &body[..]);
            let at = ((whole.len() as f64) * cut) as usize;
            let cut_short = &whole[..at.min(whole.len() - 1)];
            let outcome = runtime.block_on(exchange(cut_short, get(Method::GET), 0, true)).0;
            proptest::prop_assert!(outcome.is_err(), "cut at {} of {} delivered as complete", cut_short.len(), whole.len());
        }
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_pool_timeout_is_never_handed_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let pool = H1Pool::new(4, Duration::from_millis(100), test_histogram());
        pool.put(connect(&addr, Duration::from_secs(1)).await.unwrap());
        assert!(pool.take(None).is_some(), "a fresh connection is reused");
        pool.put(connect(&addr, Duration::from_secs(1)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            pool.take(None).is_none(),
            "an expired connection was handed out"
        );
        accepting.abort();
    }

    #[tokio::test]
    async fn a_length_delimited_response_is_read_and_its_connection_pooled() {
        let (outcome, request) = exchange(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-app: 1\r\n\r\nhello",
            get(Method::GET),
            0,
            false,
        )
        .await;
        let outcome = outcome.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outcome.status, 200);
        assert_eq!(outcome.body, "hello");
        assert_eq!(outcome.headers["x-app"], "1");
        assert!(outcome.reusable);
        assert_eq!(request, "GET /x?y=1 HTTP/1.1\r\nhost: a.test\r\n\r\n");
    }

    #[tokio::test]
    async fn chunked_bodies_decode_with_extensions_and_trailers() {
        let outcome = answer(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: 42\r\n\r\n",
        )
        .await;
        assert_eq!(outcome.body, "hello world");
        assert_eq!(outcome.trailers.unwrap_or_default()["x-checksum"], "42");
        assert!(outcome.reusable);
    }

    #[tokio::test]
    async fn a_body_without_length_runs_to_close_and_is_not_pooled() {
        let outcome = exchange(
            b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
            get(Method::GET),
            0,
            true,
        )
        .await
        .0
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outcome.body, "until the end");
        assert!(!outcome.reusable);
    }

    #[tokio::test]
    async fn head_204_and_304_have_no_body() {
        let (outcome, _) = exchange(
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n",
            get(Method::HEAD),
            0,
            false,
        )
        .await;
        let outcome = outcome.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((outcome.body.len(), outcome.reusable), (0, true));
        assert_eq!(outcome.headers[header::CONTENT_LENGTH], "10");
        for response in [
            &b"HTTP/1.1 204 No Content\r\n\r\n"[..],
            &b"HTTP/1.1 304 Not Modified\r\ncontent-length: 3\r\n\r\n"[..],
        ] {
            let outcome = answer(response).await;
            assert_eq!((outcome.body.len(), outcome.reusable), (0, true));
        }
    }

    #[tokio::test]
    async fn interim_responses_are_skipped() {
        let outcome = answer(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        )
        .await;
        assert_eq!(
            (outcome.status, outcome.body.as_ref()),
            (StatusCode::CREATED, &b"ok"[..])
        );
        assert!(!outcome.headers.contains_key("link"));
    }

    #[tokio::test]
    async fn hop_by_hop_connection_fields_are_left_out_of_the_head() {
        let plain = answer(
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\ncontent-length: 2\r\nx-app: 1\r\n\r\nok",
        )
        .await;
        assert!(plain.reusable);
        assert!(
            !plain.headers.contains_key("connection") && !plain.headers.contains_key("keep-alive")
        );
        assert_eq!(plain.headers["x-app"], "1");
        // A Connection that names another field stays, for the proxy to
        // strip that field too.
        let naming = answer(
            b"HTTP/1.1 200 OK\r\nconnection: close, x-hop\r\nx-hop: 1\r\ncontent-length: 2\r\n\r\nok",
        )
        .await;
        assert!(!naming.reusable);
        assert_eq!(naming.headers["connection"], "close, x-hop");
        assert_eq!(naming.headers["x-hop"], "1");
    }

    #[tokio::test]
    async fn only_connections_the_backend_keeps_open_are_pooled() {
        let close =
            answer(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok").await;
        assert!(!close.reusable);
        let http10 = answer(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        assert!(!http10.reusable);
        let http10_keep =
            answer(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok")
                .await;
        assert!(http10_keep.reusable);
        // Bytes after the response: the stream is out of step.
        let extra = answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK").await;
        assert_eq!((extra.body.as_ref(), extra.reusable), (&b"ok"[..], false));
        // Chunked and a length: chunked wins, the connection is not reused.
        let both = answer(
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!((both.body.as_ref(), both.reusable), (&b"ok"[..], false));
        assert!(!both.headers.contains_key(header::CONTENT_LENGTH));
    }

    #[tokio::test]
    async fn malformed_responses_are_refused() {
        for response in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello"[..],
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nhello"[..],
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5,\r\n\r\nhello"[..],
            &b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"[..],
            &b"HTTP/1.1 2xx OK\r\n\r\n"[..],
            &b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n"[..],
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"[..],
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"[..],
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"[..],
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"[..],
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"[..],
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nok"[..],
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;a\nb\r\nhello\r\n0\r\n\r\n"[..],
        ] {
            let error = refusal(response).await;
            assert!(matches!(error, SendError::Invalid(_)), "{error}");
        }
    }

    #[tokio::test]
    async fn repeated_equal_lengths_are_one_length_and_a_transfer_coding_overrides_any() {
        let repeated = answer(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\nx-a: 1\r\ncontent-length: 5\r\n\r\nhello",
        )
        .await;
        assert_eq!(repeated.body, "hello");
        assert!(repeated.reusable);
        // The length is not read at all: it is dropped, and so is the
        // connection after the body.
        let overridden = answer(
            b"HTTP/1.1 200 OK\r\ncontent-length: nonsense\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(overridden.body, "ok");
        assert!(!overridden.headers.contains_key(header::CONTENT_LENGTH));
        assert!(!overridden.reusable);
    }

    #[test]
    fn header_values_are_pieces_of_one_copy_of_the_head() {
        let raw = b"HTTP/1.1 200 OK\r\nserver: x\r\ndate: today\r\n\r\n".to_vec();
        let mut slots = [httparse::EMPTY_HEADER; 4];
        let mut response = httparse::Response::new(&mut slots);
        assert!(response.parse(&raw).is_ok_and(|s| s.is_complete()));
        let head = build_head(&response, &raw).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(head.headers["server"], "x");
        assert_eq!(head.headers["date"], "today");
        let block = Bytes::copy_from_slice(&raw);
        let piece = piece_of(&block, &raw, &raw[17..23]);
        assert_eq!(piece, "server");
        assert_eq!(
            piece.as_ptr(),
            block[17..].as_ptr(),
            "a reference into the copy"
        );
        // Bytes from elsewhere are copied, never read out of bounds.
        let elsewhere = b"somewhere else entirely".to_vec();
        assert_eq!(piece_of(&block, &raw, &elsewhere), &elsewhere[..]);
        assert_eq!(piece_of(&block, &raw[..10], &raw[5..]), &raw[5..]);
    }

    #[tokio::test]
    async fn large_heads_are_read_up_to_the_limit() {
        let big = format!(
            "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 2\r\n\r\nok",
            "a".repeat(40_000)
        );
        let outcome = answer(big.as_bytes()).await;
        assert_eq!(outcome.headers["x-big"].len(), 40_000);
        assert_eq!(
            (outcome.body.as_ref(), outcome.reusable),
            (&b"ok"[..], true)
        );
        let too_big = format!("HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n", "a".repeat(70_000));
        let error = refusal(too_big.as_bytes()).await;
        assert!(matches!(error, SendError::Invalid(_)), "{error}");
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error() {
        let error = refusal(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello").await;
        assert!(matches!(error, SendError::Closed), "{error}");
        let error = refusal(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel").await;
        assert!(matches!(error, SendError::Closed), "{error}");
        let error = refusal(b"HTTP/1.1 200 OK\r\ncontent-len").await;
        assert!(matches!(error, SendError::Invalid(_)), "{error}");
        let error = refusal(b"").await;
        assert!(matches!(error, SendError::Closed), "{error}");
    }

    #[tokio::test]
    async fn request_bodies_are_sent_with_a_length_or_chunked() {
        let mut req = Request::new(Full::new(Bytes::from_static(b"hello")));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = "/upload".parse().unwrap();
        let (outcome, request) = exchange(
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            req,
            5,
            false,
        )
        .await;
        assert!(outcome.is_ok_and(|o| o.reusable));
        assert_eq!(
            request,
            "POST /upload HTTP/1.1\r\ncontent-length: 5\r\n\r\nhello"
        );

        let (mut sender, body) = Channel::<Bytes>::new(2);
        tokio::spawn(async move {
            let _ = sender.send_data(Bytes::from_static(b"hello")).await;
            let _ = sender.send_data(Bytes::from_static(b" world")).await;
            let mut trailers = HeaderMap::new();
            trailers.insert("x-sum", HeaderValue::from_static("11"));
            let _ = sender.send_trailers(trailers).await;
        });
        let mut req = Request::new(body);
        *req.method_mut() = Method::PUT;
        *req.uri_mut() = "/stream".parse().unwrap();
        let chunked = "5\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 11\r\n\r\n";
        let (outcome, request) = exchange(
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            req,
            chunked.len(),
            false,
        )
        .await;
        assert!(outcome.is_ok_and(|o| o.reusable));
        assert_eq!(
            request,
            format!("PUT /stream HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n{chunked}")
        );
    }

    #[tokio::test]
    async fn a_failing_request_body_ends_the_exchange_at_once() {
        // The backend waits for a body that never completes.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            while stream.read(&mut buf).await.unwrap_or(0) > 0 {}
        });
        let (mut sender, body) = Channel::<Bytes, io::Error>::new(1);
        tokio::spawn(async move {
            let _ = sender.send_data(Bytes::from_static(b"part")).await;
            sender.abort(io::Error::other("client went away"));
        });
        let mut req = Request::new(body);
        *req.method_mut() = Method::POST;
        let conn = connect(&addr, Duration::from_secs(1)).await.unwrap();
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            send(
                conn,
                Encoded::new(req),
                &mut Deadline::new(Duration::from_secs(5)),
                None,
            ),
        )
        .await;
        assert!(
            matches!(outcome, Ok(Err(SendError::RequestBody(_)))),
            "{:?}",
            outcome.map(|r| r.map(|_| ()))
        );
    }

    #[tokio::test]
    async fn a_pooled_connection_the_backend_closed_is_not_handed_out() {
        let (addr, _seen) = backend(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", 0, true).await;
        let conn = connect(&addr, Duration::from_secs(1)).await.unwrap();
        let mut response = send(
            conn,
            Encoded::new(get(Method::GET)),
            &mut Deadline::new(Duration::from_secs(5)),
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let conn = response.body_mut().take_connection().expect("complete");
        let pool = H1Pool::new(4, Duration::from_secs(60), test_histogram());
        pool.put(conn);
        // The backend closes right after answering.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(pool.take(None).is_none());
    }

    #[tokio::test]
    async fn responses_arriving_a_byte_at_a_time_decode_the_same() {
        let response: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nx-app: 1\r\ntransfer-encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 11\r\n\r\n";
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let _ = stream.set_nodelay(true);
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await;
            for byte in response {
                stream.write_all(std::slice::from_ref(byte)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let conn = connect(&addr, Duration::from_secs(1)).await.unwrap();
        let interim = Mutex::new(Vec::new());
        let hook = |status: StatusCode, headers: &HeaderMap| {
            let link = headers.get("link").cloned();
            interim.lock().unwrap().push((status.as_u16(), link));
        };
        let response = send(
            conn,
            Encoded::new(get(Method::GET)),
            &mut Deadline::new(Duration::from_secs(5)),
            Some(&hook),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            *interim.lock().unwrap(),
            [
                (100, None),
                (103, Some(HeaderValue::from_static("</a.css>")))
            ]
        );
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-app"], "1");
        let mut body = response.into_body();
        let mut data = BytesMut::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            match frame.unwrap_or_else(|e| panic!("{e}")).into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        assert_eq!(data, "hello world");
        assert_eq!(trailers.unwrap_or_default()["x-sum"], "11");
        assert!(body.take_connection().is_some());
    }

    /// Reads one request head (no body).
    async fn read_head(stream: &mut tokio::net::TcpStream) {
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                return;
            }
            seen.push(byte[0]);
        }
    }

    /// A backend whose first connection answers once, then reads the next
    /// request and closes without a word (an idle timeout racing the
    /// request); later connections answer every request.
    async fn closes_its_first_connection_under_the_second_request() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.unwrap();
            read_head(&mut first).await;
            let _ = first
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst")
                .await;
            read_head(&mut first).await;
            drop(first);
            while let Ok((mut next, _)) = listener.accept().await {
                tokio::spawn(async move {
                    read_head(&mut next).await;
                    let _ = next
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext")
                        .await;
                    tokio::time::sleep(Duration::from_secs(5)).await;
                });
            }
        });
        addr
    }

    async fn through_pool<B>(
        pool: &H1Pool,
        addr: &str,
        req: Request<B>,
    ) -> Result<Bytes, ExchangeError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        timed_through_pool(pool, addr, req, Duration::from_secs(5)).await
    }

    async fn timed_through_pool<B>(
        pool: &H1Pool,
        addr: &str,
        req: Request<B>,
        response_timeout: Duration,
    ) -> Result<Bytes, ExchangeError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let response = request(
            pool,
            addr,
            Duration::from_secs(1),
            response_timeout,
            req,
            [],
            None,
            None,
            true,
        )
        .await?;
        let mut body = response.into_body();
        let mut data = BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Ok(bytes) = frame?.into_data() {
                data.extend_from_slice(&bytes);
            }
        }
        if let Some(conn) = body.take_connection() {
            pool.put(conn);
        }
        Ok(data.freeze())
    }

    #[tokio::test]
    async fn an_idempotent_request_on_a_connection_closed_under_it_is_sent_again() {
        let addr = closes_its_first_connection_under_the_second_request().await;
        let pool = H1Pool::new(4, Duration::from_secs(60), test_histogram());
        let first = through_pool(&pool, &addr, get(Method::GET)).await;
        assert_eq!(first.ok().as_deref(), Some(&b"first"[..]));
        let second = through_pool(&pool, &addr, get(Method::GET)).await;
        assert_eq!(second.ok().as_deref(), Some(&b"next"[..]));
    }

    #[tokio::test]
    async fn a_request_with_a_body_is_not_sent_twice() {
        let addr = closes_its_first_connection_under_the_second_request().await;
        let pool = H1Pool::new(4, Duration::from_secs(60), test_histogram());
        let first = through_pool(&pool, &addr, get(Method::GET)).await;
        assert_eq!(first.ok().as_deref(), Some(&b"first"[..]));
        let mut post = Request::new(Full::new(Bytes::from_static(b"order #1")));
        *post.method_mut() = Method::POST;
        *post.uri_mut() = "/orders".parse().unwrap();
        let second = through_pool(&pool, &addr, post).await;
        assert!(
            matches!(
                second,
                Err(ExchangeError::Send(SendError::Closed | SendError::Io(_)))
            ),
            "{second:?}"
        );
    }

    /// The response timer stays with a pooled connection from one request
    /// to the next: a later deadline only moves it, an earlier one (a
    /// route with a shorter timeout) must still hold, and a timer that
    /// fired while the connection sat idle must not fail the next request.
    #[tokio::test]
    async fn a_pooled_connection_times_each_request_by_its_own_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // One connection only: a request on a new one would go unanswered.
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            for _ in 0..3 {
                read_head(&mut conn).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
            read_head(&mut conn).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let pool = H1Pool::new(4, Duration::from_secs(60), test_histogram());
        let long = Duration::from_secs(60);
        let answered = |r: Result<Bytes, ExchangeError>| r.ok().as_deref() == Some(&b"ok"[..]);
        assert!(answered(
            timed_through_pool(&pool, &addr, get(Method::GET), long).await
        ));
        // Earlier than the armed deadline, then fired while idle.
        let short = Duration::from_millis(50);
        assert!(answered(
            timed_through_pool(&pool, &addr, get(Method::GET), short).await
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(answered(
            timed_through_pool(&pool, &addr, get(Method::GET), long).await
        ));
        // Armed 60 s out by the last request: 200 ms must still hold.
        let started = std::time::Instant::now();
        let unanswered =
            timed_through_pool(&pool, &addr, get(Method::GET), Duration::from_millis(200)).await;
        assert!(
            matches!(unanswered, Err(ExchangeError::Send(SendError::Timeout(_)))),
            "{unanswered:?}"
        );
        let waited = started.elapsed();
        assert!(
            (Duration::from_millis(190)..Duration::from_secs(2)).contains(&waited),
            "timed out after {waited:?}"
        );
    }

    #[test]
    fn chunk_sizes_are_hex_with_optional_extensions() {
        assert_eq!(chunk_size(b"1a\r\n").ok(), Some(26));
        assert_eq!(chunk_size(b"1A ;ext=\"v\"\r\n").ok(), Some(26));
        assert_eq!(chunk_size(b"0\r\n").ok(), Some(0));
        for bad in [
            &b""[..],
            b"zz",
            b"1 2",
            b"-1",
            b"0x10",
            b"1234567890abcdef0",
            b"5;a\nb",
            b"5;a\x00",
        ] {
            assert!(
                chunk_size(&[bad, b"\r\n"].concat()).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

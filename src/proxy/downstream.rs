//! The downstream socket as hyper sees it, and the client timeouts of
//! DESIGN §13 that hyper does not keep.
//!
//! [`Downstream`] wraps the client's TCP stream (under TLS when there is
//! TLS) and notes what moves on it in an [`Activity`]: bytes either way,
//! whether a request head is being read, and when it started. The
//! per-connection [`watchdog`] reads that record and tells the connection
//! when to end:
//!
//! - a request head not complete `header_read_timeout` after its first
//!   byte (slowloris): 408 on plain connections, then close;
//! - a request open (body uploading, response awaited or streaming) with
//!   no byte in either direction for `idle_timeout`: close;
//! - no request open for `keepalive_timeout` (for HTTP/1, no byte either;
//!   HTTP/2 PINGs do not count): close quietly (GOAWAY on HTTP/2).
//!
//! Byte counting is a plain store per read or write; the watchdog wakes
//! four times per limit (and at least once per header timeout between
//! requests), so an idle or keep-alive limit fires within a quarter of
//! its length late, never early; the head timeout is exact.
//! When the head timeout fires, the connection is polled once more with
//! the head marked expired: [`Downstream`] then writes the 408 (plain
//! connections) and ends the stream, and hyper gives the head up.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::observed::{Observed, Observer};
use crate::plan::ListenerLimits;
use crate::telemetry::access::Pending;

/// What has moved on one client connection. The byte count and the head
/// state are written by the connection's own task only (it does all the
/// socket I/O), so they are plain loads and stores; request counts may
/// change on HTTP/2 stream tasks.
#[derive(Debug)]
pub struct Activity {
    /// When the connection was accepted; the time base of `head_started`.
    origin: Instant,
    bytes: AtomicU64,
    /// The client sent bytes since our last write: a head (or body) is
    /// on its way.
    read_since_write: AtomicBool,
    /// Nanoseconds after `origin` when the current head's first byte came.
    head_started: AtomicU64,
    /// Requests handed to the service whose response is not finished.
    open: AtomicUsize,
    /// Requests ever handed to the service.
    started: AtomicU64,
    /// The first head `framing::HeadCheck` refused (`u64::MAX`: none)...
    refused_head: AtomicU64,
    /// ... and why (an index into `REFUSALS`).
    refused_reason: AtomicUsize,
    /// The connection speaks HTTP/2 (preface or ALPN seen): it is drained
    /// with GOAWAY, and its PINGs are not activity.
    http2: AtomicBool,
    /// The head being read outstayed `header_read_timeout`: the stream
    /// ends (see `Downstream`).
    head_expired: AtomicBool,
}

/// What `framing::HeadCheck` refuses heads for.
const REFUSALS: [&str; 3] = [
    super::framing::BARE_LF,
    super::framing::LENGTH_AND_CHUNKED,
    super::framing::HEAD_TOO_LARGE,
];

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            bytes: AtomicU64::new(0),
            read_since_write: AtomicBool::new(false),
            head_started: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            refused_head: AtomicU64::new(u64::MAX),
            refused_reason: AtomicUsize::new(0),
            http2: AtomicBool::new(false),
            head_expired: AtomicBool::new(false),
        })
    }

    fn moved(&self, n: usize) {
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.bytes
            .store(bytes.wrapping_add(n as u64), Ordering::Relaxed);
    }

    fn read(&self, n: usize) {
        self.moved(n);
        // HTTP/2 frames go both ways all the time and have no head
        // timeout here: no clock read for them.
        if !self.read_since_write.load(Ordering::Relaxed) && !self.is_http2() {
            self.read_since_write.store(true, Ordering::Relaxed);
            let since = self.origin.elapsed().as_nanos();
            self.head_started
                .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }

    fn wrote(&self, n: usize) {
        self.moved(n);
        self.read_since_write.store(false, Ordering::Relaxed);
    }

    pub fn mark_http2(&self) {
        self.http2.store(true, Ordering::Relaxed);
    }

    /// The head being read is too late: the stream ends on its next read
    /// (with a 408 first on plain connections).
    pub fn expire_head(&self) {
        self.head_expired.store(true, Ordering::Relaxed);
    }

    pub fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// A request was handed to the service; the guard ends it. Also
    /// returns why its head is refused, if `framing::HeadCheck` found a
    /// reason (HTTP/1 requests are handed over in head order).
    pub fn request(self: &Arc<Self>) -> (OpenRequest, Option<&'static str>) {
        self.open.fetch_add(1, Ordering::Relaxed);
        let index = self.started.fetch_add(1, Ordering::Relaxed);
        let refused = (self.refused_head.load(Ordering::Relaxed) == index)
            .then(|| {
                REFUSALS
                    .get(self.refused_reason.load(Ordering::Relaxed))
                    .copied()
            })
            .flatten();
        (OpenRequest(Arc::clone(self)), refused)
    }

    /// Records that head `head` of this connection breaks a framing rule
    /// or is too large; the first such head is answered 400 (431 for its
    /// size) and the connection closed.
    pub fn refuse_head(&self, head: u64, reason: &'static str) {
        if self.refused_head.load(Ordering::Relaxed) != u64::MAX {
            return;
        }
        let index = REFUSALS.iter().position(|r| *r == reason).unwrap_or(0);
        self.refused_reason.store(index, Ordering::Relaxed);
        self.refused_head.store(head, Ordering::Relaxed);
    }
}

/// Counts a request as open until its response body is dropped.
#[derive(Debug)]
pub struct OpenRequest(Arc<Activity>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted as open until hyper
/// has finished with it, and holds its access-log line until then.
#[derive(Debug)]
pub struct Tracked<B> {
    body: B,
    _open: OpenRequest,
    log: Option<Box<Pending>>,
}

impl<B> Tracked<B> {
    pub fn new(body: B, open: OpenRequest, log: Option<Box<Pending>>) -> Self {
        Self {
            body,
            _open: open,
            log,
        }
    }
}

impl<B: Body + Unpin> Body for Tracked<B>
where
    B::Data: bytes::Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let (Some(log), Poll::Ready(frame)) = (this.log.as_mut(), &polled) {
            match frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        log.sent(bytes::Buf::remaining(data));
                    }
                    // hyper stops polling once the body says it is done.
                    if this.body.is_end_stream() {
                        log.ended(false);
                    }
                }
                Some(Err(_)) => log.ended(true),
                None => log.ended(false),
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Why the watchdog ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// A request head took longer than `header_read_timeout`.
    Head,
    /// An open request saw no byte for `idle_timeout`.
    Idle,
    /// No request for `keepalive_timeout`.
    KeepAlive,
}

/// Completes when the connection has outstayed one of its limits.
pub async fn watchdog(activity: &Activity, limits: ListenerLimits) -> Expired {
    let mut seen_bytes = activity.bytes.load(Ordering::Relaxed);
    let mut seen_started = activity.started.load(Ordering::Relaxed);
    let mut quiet_since = Instant::now();
    loop {
        let open = activity.open.load(Ordering::Relaxed) > 0;
        let reading_head = !open && activity.read_since_write.load(Ordering::Relaxed);
        let (limit, expired) = if open {
            (limits.idle_timeout, Expired::Idle)
        } else if reading_head && !activity.is_http2() {
            (limits.header_read_timeout, Expired::Head)
        } else {
            (limits.keepalive_timeout, Expired::KeepAlive)
        };
        let now = Instant::now();
        if expired == Expired::Head {
            let started = activity.origin
                + Duration::from_nanos(activity.head_started.load(Ordering::Relaxed));
            let deadline = started + limit;
            if now >= deadline {
                return expired;
            }
            // Exact: the head's first byte is timestamped.
            tokio::time::sleep_until(deadline.min(now + limit / 4)).await;
            continue;
        }
        let bytes = activity.bytes.load(Ordering::Relaxed);
        let started = activity.started.load(Ordering::Relaxed);
        // HTTP/2 PINGs (ours, every h2_keepalive_interval, and their
        // acknowledgements) move bytes on a connection that is otherwise
        // silent: between requests only a new request counts, and during
        // one, only more bytes than the pings of a tick could make.
        let active = match (expired, activity.is_http2()) {
            (Expired::KeepAlive, true) => started != seen_started,
            (_, true) => {
                bytes.wrapping_sub(seen_bytes) > ping_noise(limits, limit)
                    || started != seen_started
            }
            _ => bytes != seen_bytes || started != seen_started,
        };
        if active {
            seen_bytes = bytes;
            seen_started = started;
            quiet_since = now;
        } else if now.duration_since(quiet_since) >= limit {
            return expired;
        }
        // A head may start at any moment between requests; it is timed
        // from its first byte, so seeing it within header_read_timeout
        // is soon enough.
        let mut tick = limit / 4;
        if expired == Expired::KeepAlive {
            tick = tick.min(limits.header_read_timeout);
        }
        let tick = tick.max(Duration::from_millis(5));
        tokio::time::sleep_until((quiet_since + limit).min(now + tick)).await;
    }
}

/// The most bytes HTTP/2 PINGs can move between two looks at a
/// connection whose limit is `limit`: a 17-byte PING frame each way per
/// `h2_keepalive_interval` (39 bytes as a TLS 1.3 record), rounded up.
fn ping_noise(limits: ListenerLimits, limit: Duration) -> u64 {
    const PING_ROUND_TRIP: u64 = 2 * (17 + 22);
    let Some(interval) = limits.h2_keepalive_interval else {
        return 0;
    };
    // From the last look to the deadline is at most `limit`.
    let pings = limit.as_millis() / interval.as_millis().max(1) + 1;
    PING_ROUND_TRIP * u64::try_from(pings).unwrap_or(u64::MAX / PING_ROUND_TRIP)
}

/// A downstream TCP stream that records what moves on it, and ends
/// once the watchdog found its head too slow (see [`Activity::expire_head`]).
pub struct Downstream {
    io: Observed<TcpStream, Arc<Activity>>,
    /// The connection's first bytes, read before it was served (the
    /// listener reads them to learn what the client speaks): given back
    /// before anything more is read, then let go.
    first: Vec<u8>,
    /// How much of `first` has been given back.
    replayed: usize,
    /// Plain HTTP: the stream answers `408` itself as it ends (under TLS
    /// the answer would have to be encrypted).
    answers_timeout: bool,
}

const REQUEST_TIMEOUT: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

impl Downstream {
    /// `first`: what was read of the connection before it was served.
    pub fn new(
        stream: TcpStream,
        first: Vec<u8>,
        activity: Arc<Activity>,
        answers_timeout: bool,
    ) -> Self {
        Self {
            io: Observed::new(stream, activity),
            first,
            replayed: 0,
            answers_timeout,
        }
    }

    /// Gives back what is left of the first bytes into `buf`; false when
    /// nothing is, or `buf` has no room (a read of nothing would say the
    /// stream ended).
    fn replay(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let left = self.first.get(self.replayed..).unwrap_or_default();
        if left.is_empty() || buf.remaining() == 0 {
            return false;
        }
        let given = &left[..left.len().min(buf.remaining())];
        buf.put_slice(given);
        self.io.observer.read(given);
        self.replayed += given.len();
        if self.replayed == self.first.len() {
            self.first = Vec::new();
            self.replayed = 0;
        }
        true
    }
}

impl AsyncRead for Downstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.io.observer.head_expired.load(Ordering::Relaxed) {
            if std::mem::take(&mut this.answers_timeout) {
                // Through the socket itself: no second descriptor kept for
                // it on every connection. Non-blocking; a tiny write into
                // an empty send buffer completes or fails at once.
                let _ = this.io.stream.try_write(REQUEST_TIMEOUT);
                let _ = rustix::net::shutdown(&this.io.stream, rustix::net::Shutdown::Write);
            }
            // The end of the stream: hyper gives the head up (an
            // incomplete message, which it does not answer).
            return Poll::Ready(Ok(()));
        }
        if this.replay(buf) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Downstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The connection's record, told of every read and write.
impl Observer for Arc<Activity> {
    fn read(&mut self, data: &[u8]) {
        Activity::read(self, data.len());
    }

    fn wrote(&mut self, n: usize) {
        Activity::wrote(self, n);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{Activity, Downstream};

    #[tokio::test]
    async fn the_bytes_read_before_serving_come_first_and_count_as_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        client.write_all(b"rest\r\n").await.expect("send");
        client.shutdown().await.expect("half-close");
        let activity = Activity::new();
        let first = b"GET / HTTP/1.1\r\n".to_vec();
        let mut downstream = Downstream::new(accepted, first, activity.clone(), true);
        // A read with no room takes nothing of what was read before.
        assert_eq!(downstream.read(&mut []).await.expect("empty read"), 0);
        // In pieces smaller than what was read before: nothing is lost
        // or read twice across reads.
        let mut piece = [0u8; 5];
        let mut got = Vec::new();
        for _ in 0..64 {
            let n = downstream.read(&mut piece).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&piece[..n]);
        }
        assert_eq!(got, b"GET / HTTP/1.1\r\nrest\r\n");
        assert!(downstream.first.is_empty(), "let go once given back");
        assert_eq!(activity.bytes.load(Ordering::Relaxed), 22);
        assert!(activity.read_since_write.load(Ordering::Relaxed));
    }
}

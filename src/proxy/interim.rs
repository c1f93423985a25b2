//! Interim (1xx) responses from a backend, forwarded to an HTTP/1.1
//! client (RFC 9110 §15.2: a proxy forwards the 1xx it did not ask for).
//!
//! hyper's server has no way to send one (hyperium/hyper#4114), so they go
//! around it: the request path encodes each 1xx head into the
//! connection's [`InterimQueue`], and [`InterimWriter`], the outermost
//! layer of the client stream that hyper writes to, puts the queued bytes
//! on the wire at the next point where hyper's own output is at a message
//! boundary: when hyper flushes (it only flushes the stream once its
//! buffer is empty) or before hyper's next write, unless an earlier write
//! of hyper's is still partly unsent. A request's final response head
//! comes after its 1xx heads are queued, so it always follows them.
//!
//! Not forwarded: `100 Continue` (hyper answers a client's `Expect`
//! itself, when the request body is first read), `101` (upgrades have
//! their own path), 1xx to HTTP/1.0 clients (RFC 9110 §15.2 forbids it),
//! and 1xx to HTTP/2 clients (hyper's server cannot send them yet). At
//! most `MAX_QUEUED` bytes wait for a client that does not read; further
//! 1xx are dropped and counted in the debug log.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};

use http::{HeaderMap, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most 1xx bytes held for a client that is not reading.
const MAX_QUEUED: usize = 64 * 1024;

/// 1xx heads of one client connection, waiting for the wire.
#[derive(Debug, Default)]
pub struct InterimQueue {
    /// Bytes are waiting: the writer's one check on its hot path.
    pending: AtomicBool,
    queued: Mutex<Queued>,
}

#[derive(Debug, Default)]
struct Queued {
    bytes: Vec<u8>,
    /// How much of `bytes` is on the wire already.
    written: usize,
}

impl InterimQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Queues a backend's 1xx head for the client, without its hop-by-hop
    /// fields. Returns whether it was queued (see the module notes).
    pub fn push(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        if !forwarded(status) {
            return false;
        }
        let mut headers = headers.clone();
        super::headers::strip_hop_by_hop(&mut headers);
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        let before = queued.bytes.len();
        encode(status, &headers, &mut queued.bytes);
        if queued.bytes.len() - queued.written > MAX_QUEUED {
            queued.bytes.truncate(before);
            tracing::debug!(
                status = status.as_u16(),
                "client is not reading; interim response dropped"
            );
            return false;
        }
        self.pending.store(true, Ordering::Release);
        true
    }

    /// Whether anything waits: the one check every write makes.
    #[inline]
    fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Writes what is queued to `stream`; ready once nothing is left.
    #[cold]
    fn poll_drain<S: AsyncWrite + Unpin>(
        &self,
        stream: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let Queued { bytes, written } = &mut *queued;
            let Some(rest) = bytes.get(*written..).filter(|rest| !rest.is_empty()) else {
                bytes.clear();
                *written = 0;
                self.pending.store(false, Ordering::Release);
                return Poll::Ready(Ok(()));
            };
            match ready!(Pin::new(&mut *stream).poll_write(cx, rest)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => *written += n,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

/// Whether a 1xx from the backend goes on to the client.
fn forwarded(status: StatusCode) -> bool {
    status.is_informational()
        && status != StatusCode::CONTINUE
        && status != StatusCode::SWITCHING_PROTOCOLS
}

fn encode(status: StatusCode, headers: &HeaderMap, out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The client stream hyper writes to, with 1xx heads put in between its
/// messages (see the module notes).
pub struct InterimWriter<S> {
    stream: S,
    queue: Arc<InterimQueue>,
    /// hyper handed over bytes that are not all written yet: nothing may
    /// go in between until it flushes or a write takes the rest.
    mid_message: bool,
}

impl<S> InterimWriter<S> {
    pub fn new(stream: S, queue: Arc<InterimQueue>) -> Self {
        Self {
            stream,
            queue,
            mid_message: false,
        }
    }
}

impl<S: AsyncWrite + Unpin> InterimWriter<S> {
    /// Drains the queue if hyper's output is at a boundary.
    #[inline]
    fn poll_interim(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.mid_message || !self.queue.is_pending() {
            return Poll::Ready(Ok(()));
        }
        self.queue.poll_drain(&mut self.stream, cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for InterimWriter<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for InterimWriter<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_interim(cx))?;
        let polled = Pin::new(&mut this.stream).poll_write(cx, data);
        this.mid_message = !matches!(polled, Poll::Ready(Ok(n)) if n == data.len());
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_interim(cx))?;
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        this.mid_message = !matches!(polled, Poll::Ready(Ok(n)) if n == total);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    /// hyper flushes the stream only once its own buffer is empty.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.mid_message = false;
        ready!(this.poll_interim(cx))?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use tokio::io::AsyncWriteExt;

    fn hints() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("link", HeaderValue::from_static("</a.css>; rel=preload"));
        headers.insert("connection", HeaderValue::from_static("x-hop"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers
    }

    #[tokio::test]
    async fn queued_heads_go_out_before_the_next_message() {
        let queue = InterimQueue::new();
        let mut out = InterimWriter::new(Vec::new(), Arc::clone(&queue));
        out.write_all(b"first").await.unwrap();
        assert!(queue.push(StatusCode::EARLY_HINTS, &hints()));
        assert!(!queue.push(StatusCode::CONTINUE, &hints()));
        assert!(!queue.push(StatusCode::OK, &hints()));
        out.write_all(b"second").await.unwrap();
        let wire = String::from_utf8(out.stream).unwrap();
        assert_eq!(
            wire,
            "firstHTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\nsecond"
        );
    }

    /// A stream that takes at most `step` bytes per write.
    struct Trickle {
        wire: Vec<u8>,
        step: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = data.len().min(self.step);
            self.get_mut().wire.extend_from_slice(&data[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn nothing_goes_into_the_middle_of_a_partly_written_message() {
        let queue = InterimQueue::new();
        let stream = Trickle {
            wire: Vec::new(),
            step: 3,
        };
        let mut out = InterimWriter::new(stream, Arc::clone(&queue));
        // hyper writes its buffer; the first write takes only part of it.
        let written = out.write(b"previous-tail").await.unwrap();
        assert_eq!(written, 3);
        assert!(queue.push(StatusCode::EARLY_HINTS, &HeaderMap::new()));
        out.write_all(&b"previous-tail"[written..]).await.unwrap();
        out.flush().await.unwrap();
        out.write_all(b"final").await.unwrap();
        let wire = String::from_utf8(out.stream.wire).unwrap();
        assert_eq!(wire, "previous-tailHTTP/1.1 103 Early Hints\r\n\r\nfinal");
    }

    #[test]
    fn a_client_that_does_not_read_holds_a_bounded_queue() {
        let queue = InterimQueue::default();
        let mut headers = HeaderMap::new();
        headers.insert("link", HeaderValue::from_str(&"x".repeat(1000)).unwrap());
        let queued = (0..200)
            .filter(|_| queue.push(StatusCode::EARLY_HINTS, &headers))
            .count();
        assert!((60..70).contains(&queued), "{queued}");
        let held = queue.queued.lock().unwrap().bytes.len();
        assert!(held <= MAX_QUEUED, "{held}");
    }
}

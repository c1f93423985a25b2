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
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::activity::{Activity, OpenRequest};
use super::observed::{Observed, Observer};
use crate::telemetry::access::Pending;

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
        if this.io.observer.head_expired() {
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

#[cfg(test)]
mod tests {

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
        assert_eq!(activity.moved_and_reading(), (22, true));
    }
}

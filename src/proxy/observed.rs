//! A stream whose traffic something watches: the one wrapper behind the
//! client connection's activity record, the HTTP/1 head check and the TCP
//! byte counters. Takes any tokio stream and an [`Observer`]; returns the
//! same stream, told about every read and write as it happens.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Told what moves through an [`Observed`] stream.
pub trait Observer {
    /// `data` was just read.
    fn read(&mut self, data: &[u8]);
    /// `n` bytes were just written.
    fn wrote(&mut self, _n: usize) {}
}

/// A stream and what watches it.
pub struct Observed<S, O> {
    pub stream: S,
    pub observer: O,
}

impl<S, O> Observed<S, O> {
    pub fn new(stream: S, observer: O) -> Self {
        Self { stream, observer }
    }
}

impl<S: AsyncRead + Unpin, O: Observer + Unpin> AsyncRead for Observed<S, O> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some(read) = buf.filled().get(before..).filter(|r| !r.is_empty()) {
            this.observer.read(read);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin, O: Observer + Unpin> AsyncWrite for Observed<S, O> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            this.observer.wrote(n);
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            this.observer.wrote(n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Counts the bytes read.
impl Observer for metrics::Counter {
    fn read(&mut self, data: &[u8]) {
        self.increment(data.len() as u64);
    }
}

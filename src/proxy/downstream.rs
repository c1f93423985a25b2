//! The downstream socket as hyper sees it, plus what hyper will not do.
//!
//! hyper enforces the header read timeout by closing the connection; it
//! sends no `408`. [`Downstream`] notes whether the client has sent bytes
//! since our last write, and [`TimeoutReply`] keeps a duplicate handle on
//! the socket, so that when hyper gives up on a half-sent request head we
//! can still tell the client why. An idle keep-alive connection that
//! times out is closed silently, as clients expect.

use std::io::{self, Write};
use std::net::TcpStream as StdTcpStream;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A downstream TCP stream that remembers whether a request is half read.
pub struct Downstream {
    stream: TcpStream,
    read_since_write: Arc<AtomicBool>,
}

/// What is needed to answer `408` after hyper dropped the connection.
pub struct TimeoutReply {
    socket: Option<StdTcpStream>,
    read_since_write: Arc<AtomicBool>,
}

impl Downstream {
    pub fn new(stream: TcpStream) -> (Self, TimeoutReply) {
        let flag = Arc::new(AtomicBool::new(false));
        let socket = stream
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .map(StdTcpStream::from);
        (
            Self {
                stream,
                read_since_write: Arc::clone(&flag),
            },
            TimeoutReply {
                socket,
                read_since_write: flag,
            },
        )
    }
}

impl TimeoutReply {
    /// Sends `408 Request Timeout` if the client was part-way through a
    /// request head; says nothing to an idle connection.
    pub fn send(mut self) {
        if !self.read_since_write.load(Ordering::Relaxed) {
            return;
        }
        if let Some(socket) = self.socket.as_mut() {
            // The socket is non-blocking; a tiny write into an empty send
            // buffer completes or fails at once.
            let _ = socket.write_all(
                b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            );
            let _ = socket.shutdown(std::net::Shutdown::Write);
        }
    }
}

impl AsyncRead for Downstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.read_since_write.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Downstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.read_since_write.store(false, Ordering::Relaxed);
        Pin::new(&mut this.stream).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.read_since_write.store(false, Ordering::Relaxed);
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
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

//! Plain HTTP/1.1 upstream connections driven by the task that uses them.
//!
//! hyper-util's pooled client runs every upstream connection in its own
//! task and hands requests and responses across channels, which costs two
//! task wake-ups per proxied request. For plain HTTP/1.1 backends cutover
//! keeps its own pool of `(SendRequest, Connection)` pairs instead and
//! polls the connection from the request's task (and from the response
//! body while it streams): the same work, with no hand-offs. An idle
//! connection is polled once, without a waker, before reuse, so one the
//! backend closed is never handed a request.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One upstream HTTP/1.1 connection: the sending half and the connection
/// future that performs its I/O when polled.
pub struct H1Conn {
    pub sender: http1::SendRequest<Incoming>,
    pub conn: Pin<Box<http1::Connection<TokioIo<TcpStream>, Incoming>>>,
}

impl std::fmt::Debug for H1Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Conn").finish_non_exhaustive()
    }
}

impl H1Conn {
    /// Performs pending I/O; `false` once the connection has ended.
    pub fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        self.conn.as_mut().poll(cx).is_pending()
    }

    /// Whether the connection can take a new request now.
    fn reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        // Finishing a response and signalling readiness for the next one
        // take the connection more than one turn.
        for _ in 0..4 {
            if !self.drive(&mut cx) || self.sender.is_closed() {
                return false;
            }
            if self.sender.poll_ready(&mut cx).is_ready() {
                return self.sender.is_ready();
            }
        }
        false
    }
}

/// Why a new upstream connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Handshake(#[from] hyper::Error),
}

/// How long a connection may sit idle in the pool.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections of one backend, most recently used last.
#[derive(Debug)]
pub struct H1Pool {
    idle: Mutex<VecDeque<(Instant, H1Conn)>>,
    max_idle: usize,
}

impl H1Pool {
    pub fn new(max_idle: usize) -> Self {
        Self {
            idle: Mutex::new(VecDeque::new()),
            max_idle,
        }
    }

    /// The most recently used idle connection that is still usable.
    pub fn take(&self) -> Option<H1Conn> {
        loop {
            let (_, mut conn) = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_back()?;
            if conn.reusable() {
                return Some(conn);
            }
        }
    }

    /// Returns a connection whose exchange completed, and closes those
    /// idle longer than `IDLE_TIMEOUT` (the least recently used end).
    pub fn put(&self, mut conn: H1Conn) {
        if !conn.reusable() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while idle
            .front()
            .is_some_and(|(since, _)| now.duration_since(*since) > IDLE_TIMEOUT)
        {
            idle.pop_front();
        }
        if idle.len() < self.max_idle {
            idle.push_back((now, conn));
        }
    }
}

/// Opens a new connection to `addr` within `timeout`.
pub async fn connect(addr: &str, timeout: Duration) -> Result<H1Conn, ConnectError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| ConnectError::Timeout(timeout))??;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    Ok(H1Conn {
        sender,
        conn: Box::pin(conn),
    })
}

/// Why an exchange on a driven connection failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Hyper(#[from] hyper::Error),
    #[error("the connection closed before the response")]
    Closed,
}

/// Sends `req` on `conn`, driving the connection until the response head
/// arrives.
pub async fn send(
    conn: &mut H1Conn,
    req: http::Request<Incoming>,
) -> Result<http::Response<Incoming>, SendError> {
    let response = conn.sender.send_request(req);
    tokio::pin!(response);
    std::future::poll_fn(|cx| {
        let open = conn.drive(cx);
        match response.as_mut().poll(cx) {
            Poll::Ready(result) => Poll::Ready(result.map_err(SendError::from)),
            Poll::Pending if open => Poll::Pending,
            Poll::Pending => Poll::Ready(Err(SendError::Closed)),
        }
    })
    .await
}

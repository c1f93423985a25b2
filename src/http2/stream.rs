//! What a stream shares between the connection's task and whoever holds
//! its request body: the body's data as it arrives, the window its
//! reader gave back, and the cancellation of the stream's future.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Frame, SizeHint};

use super::frame::Reason;

/// An error of a request body: the stream was reset, or the connection
/// ended before the body did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyError(pub u32);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            0x8 => f.write_str("the client cancelled the HTTP/2 stream"),
            code => write!(f, "HTTP/2 stream ended early (error code {code:#x})"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Why a request on a client connection failed.
#[derive(Debug, Clone)]
pub enum ClientError {
    /// The backend reset the stream.
    Reset(Reason),
    /// The backend did not process the stream (REFUSED_STREAM, or above
    /// its GOAWAY's last stream) and its body had already gone out.
    Refused,
    /// The connection ended before the answer did.
    Connection(Arc<str>),
    /// The answer broke HTTP/2's rules.
    Malformed(&'static str),
    /// The request cannot be written on HTTP/2.
    Request(&'static str),
    /// The request body failed (the caller holds why).
    Body,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Reset(reason) => {
                write!(f, "the backend reset the HTTP/2 stream ({reason})")
            }
            ClientError::Refused => f.write_str("the backend refused the HTTP/2 stream"),
            ClientError::Connection(why) => write!(f, "HTTP/2 connection to the backend: {why}"),
            ClientError::Malformed(what) => write!(f, "malformed HTTP/2 answer: {what}"),
            ClientError::Request(what) => write!(f, "the request cannot go over HTTP/2: {what}"),
            ClientError::Body => f.write_str("the request body failed"),
        }
    }
}

impl std::error::Error for ClientError {}

#[derive(Default)]
pub(super) struct Recv {
    data: VecDeque<Bytes>,
    /// Small payloads that arrived while the reader was behind, copied
    /// together after everything in `data`. Queued one `Bytes` each, a
    /// flood of one-byte DATA frames would cost 32 bytes of queue per
    /// byte and hold every read buffer they are slices of (bounded only
    /// by the windows: a 1 MiB window, some 40 MiB).
    small: BytesMut,
    trailers: Option<HeaderMap>,
    /// END_STREAM arrived: the body ends once `data` and `small` are read.
    pub ended: bool,
    failed: Option<u32>,
    reader: Option<Waker>,
    /// Bytes the reader took and the connection has not given back to
    /// the stream's window yet.
    pub released: usize,
    /// The body was dropped: what arrives from now on is given back at
    /// once.
    pub dropped: bool,
    /// The client's: the answer's head, until its reader takes it.
    pub(super) head: Head,
}

/// Where the answer's head of a client stream is.
#[derive(Default)]
pub(super) enum Head {
    /// Not here yet (and, on the server, never).
    #[default]
    Waiting,
    Ready(http::response::Parts),
    Taken,
    /// The stream failed before its head came.
    Failed(ClientError),
}

/// A payload under this many bytes is copied behind others still unread
/// rather than queued as a slice of the read buffer.
const SMALL: usize = 1024;

impl Recv {
    fn queue(&mut self, data: Bytes) {
        // The reader keeping up (the common case): the slice as it is.
        if self.data.is_empty() && self.small.is_empty() {
            self.data.push_back(data);
            return;
        }
        if data.len() < SMALL {
            self.small.extend_from_slice(&data);
            if self.small.len() < RELEASE_STEP {
                return;
            }
        }
        if !self.small.is_empty() {
            let copied = self.small.split().freeze();
            self.data.push_back(copied);
        }
        if data.len() >= SMALL {
            self.data.push_back(data);
        }
    }

    fn pop(&mut self) -> Option<Bytes> {
        match self.data.pop_front() {
            Some(data) => Some(data),
            None if !self.small.is_empty() => Some(self.small.split().freeze()),
            None => None,
        }
    }

    /// Wakes whoever waits on the stream.
    pub(super) fn wake(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
    }

    /// Keeps `cx`'s waker, to be woken by `wake`.
    pub(super) fn wait(&mut self, cx: &Context<'_>) {
        match &self.reader {
            Some(reader) if reader.will_wake(cx.waker()) => {}
            _ => self.reader = Some(cx.waker().clone()),
        }
    }

    /// Whether nothing is left to read but the end.
    pub(super) fn is_drained(&self) -> bool {
        self.data.is_empty() && self.small.is_empty() && self.trailers.is_none()
    }

    /// Drops what is queued: how many bytes it was.
    fn clear(&mut self) -> usize {
        let unread = self.data.drain(..).map(|d| d.len()).sum::<usize>() + self.small.len();
        self.small = BytesMut::new();
        unread
    }
}

/// The connection's receive window as its bodies' readers give it back:
/// counted here whether or not the stream is still open, so that no
/// byte read after its stream closed is lost to the connection.
#[derive(Default)]
pub(super) struct Window {
    released: AtomicUsize,
    /// A stream's reader went away before its end (the client's: the
    /// connection resets such streams).
    abandoned: AtomicBool,
    /// The connection's task, woken when enough window was released.
    waker: Mutex<Option<Waker>>,
}

impl Window {
    /// Takes what was released since the last call.
    pub(super) fn take(&self) -> usize {
        self.released.swap(0, Ordering::AcqRel)
    }

    pub(super) fn register(&self, waker: &Waker) {
        *self
            .waker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(waker.clone());
    }

    /// A reader left a stream before its end: the connection is woken to
    /// see which.
    pub(super) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(waker) = &*waker {
            waker.wake_by_ref();
        }
    }

    /// Whether a reader left since the last call.
    pub(super) fn take_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire) && self.abandoned.swap(false, Ordering::AcqRel)
    }

    /// Counts `n` released bytes; the connection is woken each time the
    /// count (or the stream's own, `stream`) passes a step.
    fn release(&self, n: usize, stream: usize) {
        let before = self.released.fetch_add(n, Ordering::AcqRel);
        if before / RELEASE_STEP != (before + n) / RELEASE_STEP || stream >= RELEASE_STEP {
            self.wake();
        }
    }
}

/// A stream's shared half; one allocation per stream.
pub(super) struct Shared {
    cancelled: AtomicBool,
    /// The stream's future's waker, to poll it once more when cancelled.
    task: Mutex<Option<Waker>>,
    recv: Mutex<Recv>,
    pub(super) window: Arc<Window>,
}

/// Window updates are sent in steps of this many bytes at least.
pub(super) const RELEASE_STEP: usize = 16 * 1024;

impl Shared {
    pub(super) fn new(window: &Arc<Window>) -> Arc<Shared> {
        Arc::new(Shared {
            cancelled: AtomicBool::new(false),
            task: Mutex::new(None),
            recv: Mutex::new(Recv::default()),
            window: Arc::clone(window),
        })
    }

    pub(super) fn recv(&self) -> MutexGuard<'_, Recv> {
        // A poisoned lock only means a panic elsewhere held it; the
        // queue itself is consistent at every step.
        self.recv
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues a DATA frame's payload for the reader; false if the body
    /// is gone (the caller gives the window back at once).
    pub(super) fn push(&self, data: Bytes) -> bool {
        let mut recv = self.recv();
        if recv.dropped {
            return false;
        }
        recv.queue(data);
        if let Some(reader) = recv.reader.take() {
            reader.wake();
        }
        true
    }

    pub(super) fn end(&self, trailers: Option<HeaderMap>) {
        let mut recv = self.recv();
        recv.ended = true;
        recv.trailers = trailers;
        if let Some(reader) = recv.reader.take() {
            reader.wake();
        }
    }

    pub(super) fn fail(&self, code: u32) {
        let mut recv = self.recv();
        if !recv.ended {
            recv.failed = Some(code);
        }
        if let Some(reader) = recv.reader.take() {
            reader.wake();
        }
    }

    /// Cancels the stream's future: it is polled once more, and dropped.
    pub(super) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        let waker = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A request's body on HTTP/2: DATA frames as the client sends them,
/// then its trailers. Reading it gives the client window back.
pub struct RecvBody {
    shared: Option<Arc<Shared>>,
    length: Option<u64>,
    /// The reader saw the end (or an error).
    done: bool,
}

impl RecvBody {
    pub(super) fn new(shared: Option<Arc<Shared>>, length: Option<u64>) -> RecvBody {
        RecvBody {
            done: shared.is_none(),
            shared,
            length,
        }
    }
}

impl std::fmt::Debug for RecvBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBody")
            .field("length", &self.length)
            .field("done", &self.done)
            .finish()
    }
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let Some(shared) = &self.shared else {
            return Poll::Ready(None);
        };
        let mut recv = shared.recv();
        if let Some(data) = recv.pop() {
            recv.released += data.len();
            let stream = recv.released;
            drop(recv);
            shared.window.release(data.len(), stream);
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = recv.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if recv.ended {
            drop(recv);
            self.done = true;
            return Poll::Ready(None);
        }
        if let Some(code) = recv.failed {
            drop(recv);
            self.done = true;
            return Poll::Ready(Some(Err(BodyError(code))));
        }
        match &recv.reader {
            Some(reader) if reader.will_wake(cx.waker()) => {}
            _ => recv.reader = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.length == Some(0) && self.shared.as_ref().is_some_and(|s| s.recv().ended)
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(length) => SizeHint::with_exact(length),
            None if self.shared.is_none() => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}

impl Drop for RecvBody {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            let mut recv = shared.recv();
            recv.dropped = true;
            let early = !recv.ended && recv.failed.is_none();
            // What was queued and never read goes back to the window.
            let unread = recv.clear();
            recv.released += unread;
            let stream = recv.released;
            drop(recv);
            if early {
                shared.window.abandon();
            }
            if unread > 0 {
                // Past the step: the connection learns at once.
                shared.window.release(unread, stream.max(RELEASE_STEP));
            }
        }
    }
}

/// A stream's future, run inside the connection's task; it ends with
/// `None` when the client reset the stream.
///
/// The future is boxed: the set of streams moves what it is given into an
/// allocation of its own, a copy of the future's full size (a proxied
/// request's is some 4.5 KiB, whatever state it is in) twice over; boxed,
/// it is copied once (callgrind, h2c: 2.5 % fewer instructions per
/// request); built in its box, it is not copied at all
/// (docs/performance.md).
pub(super) struct StreamTask<F> {
    pub(super) id: u32,
    shared: Arc<Shared>,
    registered: bool,
    future: Pin<Box<F>>,
}

impl<F> StreamTask<F> {
    /// `make` builds the stream's future in its box.
    pub(super) fn new(id: u32, shared: Arc<Shared>, make: impl FnOnce() -> F) -> Self {
        StreamTask {
            id,
            shared,
            registered: false,
            future: crate::boxed::pin_in_place(make),
        }
    }
}

impl<F: Future> Future for StreamTask<F> {
    type Output = (u32, Option<F::Output>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if !this.registered {
            // The waker of a future in a `FuturesUnordered` is its own
            // and stays the same: kept once, for `cancel`.
            *this
                .shared
                .task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
            this.registered = true;
        }
        if this.shared.cancelled.load(Ordering::Acquire) {
            return Poll::Ready((this.id, None));
        }
        let id = this.id;
        this.future.as_mut().poll(cx).map(|out| (id, Some(out)))
    }
}

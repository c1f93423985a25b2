//! One HTTP/2 server connection (RFC 9113): one task reads the client's
//! frames, runs each stream's future (no spawn, no lock on the way of a
//! frame), and writes everything it has to say in one turn with one
//! write.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::frame::{self, Kind, Reason, FLAG_ACK, FLAG_END_STREAM};
use super::hpack::{self, Decoder, Field};
use super::link::{Block, Entry, Fill, Link, Outgoing, RECV_WINDOW};
use super::request;
use super::spare;
use super::stream::{RecvBody, Shared, StreamTask};
use super::Settings;

/// Streams a client may reset before their answers, net of answered
/// ones, before the connection is closed (CVE-2023-44487).
const EARLY_RESETS: u32 = 200;
/// DATA frames in a row that carry nothing and end nothing, before the
/// connection is closed (CVE-2019-9518: each costs a parse and no
/// window). Envoy's per-stream default is 1; a data frame with a
/// payload, or a new request, starts the count again.
const EMPTY_DATA_IN_A_ROW: u32 = 64;
const PING_KEEPALIVE: [u8; 8] = *b"cutover1";
const PING_SHUTDOWN: [u8; 8] = *b"cutover2";

/// A connection's end other than the client leaving.
#[derive(Debug)]
pub enum Error {
    Io(std::io::Error),
    /// We closed it with this code (GOAWAY sent).
    Protocol(Reason),
    /// The client sent GOAWAY with an error code.
    Remote(Reason),
    /// No PING acknowledgement within the keep-alive timeout.
    KeepAliveTimeout,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "HTTP/2 connection: {e}"),
            Error::Protocol(r) => write!(f, "HTTP/2 connection closed by us: {r}"),
            Error::Remote(r) => write!(f, "HTTP/2 connection closed by the client: {r}"),
            Error::KeepAliveTimeout => f.write_str("HTTP/2 PING not acknowledged in time"),
        }
    }
}

impl std::error::Error for Error {}

/// Where a graceful shutdown is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shutdown {
    Open,
    /// GOAWAY(2^31-1) and a PING sent: streams already on their way
    /// are still taken until the PING comes back.
    Announced,
    /// The final GOAWAY is sent; streams above `last_stream` are ignored.
    Closing,
}

/// An HTTP/2 server connection on `I`, serving each request with `S`:
/// a future that ends when the client leaves or the connection closes.
pub struct Connection<I, S, F, B> {
    pub(super) io: I,
    pub(super) read: BytesMut,
    pub(super) link: Link,
    pub(super) preface: bool,
    pub(super) read_closed: bool,
    pub(super) service: S,
    pub(super) settings: Settings,
    pub(super) decoder: Decoder,
    pub(super) fields: Vec<Field>,
    pub(super) tasks: FuturesUnordered<StreamTask<F>>,
    pub(super) streams: Vec<Entry<B>>,
    pub(super) last_stream: u32,
    pub(super) early_resets: u32,
    /// Empty DATA frames without END_STREAM since the last one that
    /// carried something (or the last request).
    pub(super) empty_data: u32,
    pub(super) shutdown: Shutdown,
    /// The keep-alive's next deadline (a PING, or its timeout).
    pub(super) timer: Option<Pin<Box<Sleep>>>,
    pub(super) ping_outstanding: bool,
    /// A connection error to end with, once GOAWAY is written.
    pub(super) failed: Option<Error>,
}

impl<I, S, F, B, E> Connection<I, S, F, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: FnMut(Request<RecvBody>) -> F,
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    pub fn new(io: I, settings: Settings, service: S) -> Self {
        let (read, mut write) = spare::take_two();
        // Our SETTINGS, then the connection's window opened to RECV_WINDOW.
        Link::settings_frame(
            &mut write,
            &[
                (
                    frame::SETTINGS_MAX_CONCURRENT_STREAMS,
                    settings.max_concurrent_streams,
                ),
                (
                    frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                    settings.max_header_list_size,
                ),
            ],
        );
        let timer = settings
            .keepalive_interval
            .map(|every| Box::pin(tokio::time::sleep(every)));
        Connection {
            io,
            read,
            link: Link::new(write),
            preface: false,
            read_closed: false,
            service,
            settings,
            decoder: Decoder::new(4096),
            fields: Vec::with_capacity(16),
            tasks: FuturesUnordered::new(),
            streams: Vec::new(),
            last_stream: 0,
            early_resets: 0,
            empty_data: 0,
            shutdown: Shutdown::Open,
            timer,
            ping_outstanding: false,
            failed: None,
        }
    }

    /// Starts a graceful shutdown: no new streams past the ones already
    /// on their way, the open ones run to their end.
    pub fn graceful_shutdown(&mut self) {
        if self.shutdown != Shutdown::Open || self.failed.is_some() {
            return;
        }
        frame::goaway(&mut self.link.write, frame::MAX_STREAM_ID, Reason::NO_ERROR);
        frame::ping(&mut self.link.write, 0, PING_SHUTDOWN);
        // No deadline for the acknowledgement: a client that has not read
        // the first GOAWAY yet may still open streams, and a final GOAWAY
        // sent before it did would refuse requests it already sent (the
        // `h2` crate waits too). The drain's own deadline bounds it.
        self.shutdown = Shutdown::Announced;
    }

    fn poll_connection(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if self.read.capacity() == 0 && self.link.write.capacity() == 0 {
            // Woken from rest (`rest` leaves both without an allocation):
            // both buffers from the worker's spares. Either alone at zero
            // (a write buffer flushed to its very end, a GOAWAY written
            // while at rest) grows where it is used.
            (self.read, self.link.write) = spare::take_two();
        }
        loop {
            let mut again = false;
            if let Err(error) = self.poll_timer(cx) {
                return Poll::Ready(Err(error));
            }
            if self.failed.is_none() && !self.read_closed {
                match self.read_some(cx) {
                    Ok(more) => again |= more,
                    Err(error) => self.fail(error),
                }
            }
            while let Poll::Ready(Some((id, answer))) = self.tasks.poll_next_unpin(cx) {
                match answer {
                    Some(Ok(response)) => self.answer(id, response),
                    Some(Err(error)) => {
                        let error: Box<dyn std::error::Error + Send + Sync> = error.into();
                        tracing::debug!(stream = id, %error, "HTTP/2 service failed");
                        if let Some(at) = self.position(id) {
                            let _ = self.stream_error(at, Reason::INTERNAL_ERROR);
                        }
                    }
                    None => self.forget(id),
                }
            }
            self.link.release_windows(&mut self.streams, cx);
            self.poll_bodies(cx);
            match self.link.flush(&mut self.io, cx) {
                Poll::Ready(Ok(())) => again |= std::mem::take(&mut self.link.write_blocked),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(Error::Io(error))),
                Poll::Pending => {}
            }
            if self.link.write.is_empty() {
                if let Some(error) = self.failed.take() {
                    return Poll::Ready(Err(error));
                }
                let idle = self.streams.is_empty() && self.tasks.is_empty();
                if self.read_closed || (idle && self.shutdown == Shutdown::Closing) {
                    return match Pin::new(&mut self.io).poll_shutdown(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(_) => Poll::Ready(Ok(())),
                    };
                }
            }
            if !again {
                self.rest();
                return Poll::Pending;
            }
        }
    }

    /// At rest (no stream, nothing read or to write), the connection
    /// gives its buffers back to the worker's spares until it wakes.
    fn rest(&mut self) {
        if self.read.is_empty()
            && self.link.write.is_empty()
            && self.streams.is_empty()
            && self.tasks.is_empty()
        {
            spare::give_two(&mut self.read, &mut self.link.write);
        }
    }

    /// The keep-alive PING and its timeout.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        let Some(timer) = &mut self.timer else {
            return Ok(());
        };
        if timer.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        if self.ping_outstanding {
            return Err(Error::KeepAliveTimeout);
        }
        frame::ping(&mut self.link.write, 0, PING_KEEPALIVE);
        self.ping_outstanding = true;
        let timeout = self.settings.keepalive_timeout;
        timer.as_mut().reset(Instant::now() + timeout);
        // Poll it once so that it is registered.
        let _ = timer.as_mut().poll(cx);
        Ok(())
    }

    fn close_gracefully(&mut self) {
        frame::goaway(&mut self.link.write, self.last_stream, Reason::NO_ERROR);
        self.shutdown = Shutdown::Closing;
        self.timer = None;
    }

    /// Reads what the client has sent and handles its frames; true if
    /// it stopped with more to read (the read bound).
    fn read_some(&mut self, cx: &mut Context<'_>) -> Result<bool, Reason> {
        for _ in 0..8 {
            match self.link.fill(&mut self.io, &mut self.read, cx) {
                Fill::Closed => {
                    self.read_closed = true;
                    self.end_all(Reason::CANCEL);
                    return Ok(false);
                }
                Fill::Read => self.frames()?,
                Fill::Stop => return Ok(false),
            }
            if self.failed.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn frames(&mut self) -> Result<(), Reason> {
        if !self.preface {
            let want = frame::PREFACE.len().min(self.read.len());
            if self.read[..want] != frame::PREFACE[..want] {
                return Err(Reason::PROTOCOL_ERROR);
            }
            if want < frame::PREFACE.len() {
                return Ok(());
            }
            self.read.advance(frame::PREFACE.len());
            self.preface = true;
        }
        while let Some((header, payload)) = frame::next(&mut self.read)? {
            self.frame(header, payload)?;
            if self.failed.is_some() {
                return Ok(());
            }
        }
        Ok(())
    }

    fn frame(&mut self, header: frame::Header, payload: Bytes) -> Result<(), Reason> {
        let frame::Header {
            kind,
            flags,
            stream,
            ..
        } = header;
        self.link.in_order(&header)?;
        match Kind::of(kind) {
            Some(Kind::Data) => self.data(flags, stream, payload),
            Some(kind @ (Kind::Headers | Kind::Continuation)) => {
                let limit = self.settings.max_header_list_size as usize;
                let continued = kind == Kind::Continuation;
                match self
                    .link
                    .header_part(continued, flags, stream, &payload, limit)?
                {
                    Some(block) => self.header_block(&block),
                    None => Ok(()),
                }
            }
            Some(Kind::Priority) if stream == 0 => Err(Reason::PROTOCOL_ERROR),
            Some(Kind::Priority) => match frame::priority_error(stream, &payload) {
                Some(reason) => self.stream_error_on(stream, reason),
                None => Ok(()),
            },
            Some(Kind::RstStream) => self.reset(stream, &payload),
            Some(Kind::Settings) => self.peer_settings(flags, stream, &payload),
            Some(Kind::PushPromise) => Err(Reason::PROTOCOL_ERROR),
            Some(Kind::Ping) => {
                let Some(opaque) = self.link.ping(flags, stream, &payload)? else {
                    return Ok(());
                };
                if opaque == PING_SHUTDOWN && self.shutdown == Shutdown::Announced {
                    self.close_gracefully();
                } else if opaque == PING_KEEPALIVE && self.shutdown != Shutdown::Closing {
                    self.ping_outstanding = false;
                    if let (Some(timer), Some(every)) =
                        (&mut self.timer, self.settings.keepalive_interval)
                    {
                        timer.as_mut().reset(Instant::now() + every);
                    }
                }
                Ok(())
            }
            Some(Kind::GoAway) => {
                if stream != 0 || payload.len() < 8 {
                    return Err(Reason::PROTOCOL_ERROR);
                }
                let code = Reason(u32::from_be_bytes([
                    payload[4], payload[5], payload[6], payload[7],
                ]));
                if code != Reason::NO_ERROR {
                    self.failed = Some(Error::Remote(code));
                    self.end_all(Reason::CANCEL);
                } else if self.shutdown == Shutdown::Open {
                    // The client opens no more streams; those it has run out.
                    self.shutdown = Shutdown::Closing;
                    self.timer = None;
                }
                Ok(())
            }
            Some(Kind::WindowUpdate) => self.window_update(stream, &payload),
            // Unknown frame types are ignored (§5.5).
            None => Ok(()),
        }
    }

    pub(super) fn position(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|e| e.id == id)
    }

    fn data(&mut self, flags: u8, id: u32, payload: Bytes) -> Result<(), Reason> {
        if id == 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        let (data, flow) = self.link.data(flags, payload)?;
        let end = flags & FLAG_END_STREAM != 0;
        if data.is_empty() && !end {
            self.empty_data += 1;
            if self.empty_data > EMPTY_DATA_IN_A_ROW {
                return Err(Reason::ENHANCE_YOUR_CALM);
            }
        } else {
            self.empty_data = 0;
        }
        let Some(at) = self.position(id).filter(|&at| self.streams[at].recv_open) else {
            if id > self.last_stream {
                return Err(Reason::PROTOCOL_ERROR);
            }
            // A stream we reset or answered in full: what was on its way
            // is ignored (§5.4.2), its window given back.
            self.link.recv_released += data.len() as i64;
            return Ok(());
        };
        let entry = &mut self.streams[at];
        entry.recv_window -= flow;
        if entry.recv_window < 0 {
            self.link.recv_released += data.len() as i64;
            return self.stream_error(at, Reason::FLOW_CONTROL_ERROR);
        }
        entry.received += data.len() as u64;
        if let Some(expected) = entry.expected {
            if entry.received > expected || (end && entry.received != expected) {
                self.link.recv_released += data.len() as i64;
                return self.stream_error(at, Reason::PROTOCOL_ERROR);
            }
        }
        if !data.is_empty() {
            let len = data.len() as i64;
            if !entry.shared.push(data) {
                self.link.recv_released += len;
            }
        }
        if end {
            entry.recv_open = false;
            entry.shared.end(None);
            self.close_if_done(at);
        }
        Ok(())
    }

    /// A whole header block: a new request, or a request's trailers.
    fn header_block(&mut self, block: &Block<'_>) -> Result<(), Reason> {
        let id = block.id;
        self.fields.clear();
        let max_list = self.settings.max_header_list_size as usize;
        let decoded = self
            .decoder
            .decode(block.bytes(), max_list, &mut self.fields)
            .map_err(|_| Reason::COMPRESSION_ERROR)?;
        let end = block.flags & FLAG_END_STREAM != 0;
        if id <= self.last_stream {
            if block.depends_on_itself && self.position(id).is_some() {
                return self.stream_error_on(id, Reason::PROTOCOL_ERROR);
            }
            return self.trailers(id, end, decoded.oversized);
        }
        if id.is_multiple_of(2) {
            return Err(Reason::PROTOCOL_ERROR);
        }
        self.last_stream = id;
        if self.shutdown == Shutdown::Closing {
            // Past the final GOAWAY: ignored (§6.8).
            return Ok(());
        }
        if block.depends_on_itself {
            // §5.3.1, as the `h2` crate answers it: the stream is reset
            // and its request never served.
            self.link.rst(id, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        if self.streams.len() >= self.settings.max_concurrent_streams as usize {
            self.link.rst(id, Reason::REFUSED_STREAM);
            return Ok(());
        }
        if decoded.oversized {
            // Answered, as hyper's server did: 431 and the stream ends.
            self.link.head.clear();
            hpack::encode_status(
                http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                &mut self.link.head,
            );
            self.link.write_head(id, true);
            if !end {
                self.link.rst(id, Reason::NO_ERROR);
            }
            return Ok(());
        }
        let Some((request, expected)) = request::build(&mut self.fields) else {
            self.link.rst(id, Reason::PROTOCOL_ERROR);
            return Ok(());
        };
        if expected.is_some_and(|n| n > 0) && end {
            self.link.rst(id, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        self.empty_data = 0;
        let shared = Shared::new(&self.link.window);
        let body_shared = (!end).then(|| Arc::clone(&shared));
        let request = request.map(|()| RecvBody::new(body_shared, expected));
        let service = &mut self.service;
        self.tasks
            .push(StreamTask::new(id, Arc::clone(&shared), || {
                service(request)
            }));
        self.streams.push(Entry {
            id,
            shared,
            recv_open: !end,
            recv_window: i64::from(RECV_WINDOW),
            head_in: true,
            expected,
            received: 0,
            send: Outgoing::Waiting,
            send_window: self.link.peer_initial_window,
        });
        Ok(())
    }

    /// HEADERS on a stream already open: its trailers, which end it.
    fn trailers(&mut self, id: u32, end: bool, oversized: bool) -> Result<(), Reason> {
        let Some(at) = self.position(id).filter(|&at| self.streams[at].recv_open) else {
            return Err(Reason::STREAM_CLOSED);
        };
        if !end {
            return Err(Reason::PROTOCOL_ERROR);
        }
        let mut trailers = HeaderMap::with_capacity(self.fields.len());
        let mut malformed = oversized;
        for field in self.fields.drain(..) {
            match field {
                Field::Header(name, value) => {
                    trailers.append(name, value);
                }
                _ => malformed = true,
            }
        }
        if malformed {
            return self.stream_error(at, Reason::PROTOCOL_ERROR);
        }
        let entry = &mut self.streams[at];
        if entry.expected.is_some_and(|n| n != entry.received) {
            return self.stream_error(at, Reason::PROTOCOL_ERROR);
        }
        entry.recv_open = false;
        entry.shared.end(Some(trailers));
        self.close_if_done(at);
        Ok(())
    }

    fn reset(&mut self, id: u32, payload: &[u8]) -> Result<(), Reason> {
        if id == 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        let code: [u8; 4] = payload.try_into().map_err(|_| Reason::FRAME_SIZE_ERROR)?;
        if id > self.last_stream {
            return Err(Reason::PROTOCOL_ERROR);
        }
        let Some(at) = self.position(id) else {
            return Ok(());
        };
        let entry = self.streams.swap_remove(at);
        entry.shared.fail(u32::from_be_bytes(code));
        if matches!(entry.send, Outgoing::Waiting) {
            // Reset before its answer: the future is cancelled, and a
            // client that does it all the time is told to stop.
            entry.shared.cancel();
            self.early_resets += 1;
            if self.early_resets > EARLY_RESETS {
                return Err(Reason::ENHANCE_YOUR_CALM);
            }
        }
        Ok(())
    }

    fn peer_settings(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), Reason> {
        if id != 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        if flags & FLAG_ACK != 0 {
            return if payload.is_empty() {
                Ok(())
            } else {
                Err(Reason::FRAME_SIZE_ERROR)
            };
        }
        self.link.peer_settings(payload, &mut self.streams)?;
        Ok(())
    }

    fn window_update(&mut self, id: u32, payload: &[u8]) -> Result<(), Reason> {
        let add = Link::increment(payload)?;
        if id == 0 {
            return self.link.connection_window(add);
        }
        if id > self.last_stream {
            return Err(Reason::PROTOCOL_ERROR);
        }
        let Some(at) = self.position(id) else {
            return Ok(());
        };
        if add == 0 {
            return self.stream_error(at, Reason::PROTOCOL_ERROR);
        }
        let entry = &mut self.streams[at];
        entry.send_window += add;
        if entry.send_window > i64::from(frame::MAX_WINDOW) {
            return self.stream_error(at, Reason::FLOW_CONTROL_ERROR);
        }
        Ok(())
    }

    /// Resets stream `id`: one of ours ends for both sides, any other
    /// is only answered.
    fn stream_error_on(&mut self, id: u32, reason: Reason) -> Result<(), Reason> {
        match self.position(id) {
            Some(at) => self.stream_error(at, reason),
            None => {
                self.link.rst(id, reason);
                Ok(())
            }
        }
    }

    /// Resets stream `at` (it ends for both sides).
    pub(super) fn stream_error(&mut self, at: usize, reason: Reason) -> Result<(), Reason> {
        let entry = self.streams.swap_remove(at);
        entry.shared.fail(reason.0);
        entry.shared.cancel();
        self.link.rst(entry.id, reason);
        Ok(())
    }

    /// A stream's future ended after its entry did (reset, or the
    /// connection is ending).
    fn forget(&mut self, id: u32) {
        if let Some(at) = self.position(id) {
            self.streams.swap_remove(at);
        }
    }

    pub(super) fn close_if_done(&mut self, at: usize) {
        let entry = &self.streams[at];
        if !entry.recv_open && matches!(entry.send, Outgoing::Done) {
            self.streams.swap_remove(at);
        }
    }

    /// Ends every stream: the connection is going away.
    fn end_all(&mut self, reason: Reason) {
        for entry in self.streams.drain(..) {
            entry.shared.fail(reason.0);
            entry.shared.cancel();
        }
    }

    fn fail(&mut self, reason: Reason) {
        tracing::debug!(%reason, "HTTP/2 connection error");
        frame::goaway(&mut self.link.write, self.last_stream, reason);
        self.failed = Some(Error::Protocol(reason));
        self.end_all(Reason::CANCEL);
    }
}

impl<I, S, F, B, E> Future for Connection<I, S, F, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: FnMut(Request<RecvBody>) -> F + Unpin,
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_connection(cx)
    }
}

/// An ended connection's buffers go to the next one on the worker.
impl<I, S, F, B> Drop for Connection<I, S, F, B> {
    fn drop(&mut self) {
        spare::give_two(&mut self.read, &mut self.link.write);
    }
}

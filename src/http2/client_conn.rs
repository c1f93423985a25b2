//! One HTTP/2 client connection's task: gives queued requests their
//! streams, reads the backend's frames, sends request bodies within the
//! windows, and writes each turn's frames in one write.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::client::{ClientError, ClientSettings, Handle, Opening, Queue, Resend, SendRequest};
use super::frame::{self, Kind, Reason, FLAG_ACK, FLAG_END_STREAM};
use super::hpack::{Decoder, Field};
use super::link::{Block, Entry, Fill, Link, Outgoing, Sent, RECV_WINDOW};
use super::stream::{Head, Shared};

/// An HTTP/2 connection to a backend: a future that ends when the
/// connection does (spawn it); requests go through its `SendRequest`.
pub struct ClientConnection<I, B> {
    io: I,
    read: BytesMut,
    link: Link,
    handle: Arc<Handle<B>>,
    settings: ClientSettings,
    decoder: Decoder,
    fields: Vec<Field>,
    streams: Vec<Entry<Resend<B>>>,
    /// Openings taken from the queue (kept for its capacity).
    taken: Vec<Opening<B>>,
    next_id: u32,
    /// The last stream the backend's GOAWAY said it processes.
    going_away: Option<u32>,
    /// Streams ended since the queue's count was last brought down.
    ended: usize,
    idle: Pin<Box<Sleep>>,
    idle_armed: bool,
    read_closed: bool,
    /// Why the connection ends, once what is written is out.
    failed: Option<ClientError>,
}

/// A new connection on `io` (connected, TLS done): the preface and our
/// SETTINGS are written with the first request.
pub fn handshake<I, B>(io: I, settings: ClientSettings) -> (SendRequest<B>, ClientConnection<I, B>)
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut write = BytesMut::with_capacity(16 * 1024);
    write.extend_from_slice(frame::PREFACE);
    Link::settings_frame(
        &mut write,
        &[
            (frame::SETTINGS_ENABLE_PUSH, 0),
            (
                frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                settings.max_header_list_size,
            ),
        ],
    );
    let link = Link::new(write);
    let handle = Arc::new(Handle::new(Arc::clone(&link.window)));
    let connection = ClientConnection {
        io,
        read: BytesMut::with_capacity(16 * 1024),
        link,
        handle: Arc::clone(&handle),
        settings,
        decoder: Decoder::new(4096),
        fields: Vec::with_capacity(16),
        streams: Vec::new(),
        taken: Vec::new(),
        next_id: 1,
        going_away: None,
        ended: 0,
        idle: Box::pin(tokio::time::sleep(settings.idle_timeout)),
        idle_armed: true,
        read_closed: false,
        failed: None,
    };
    (SendRequest::new(handle), connection)
}

impl<I, B> ClientConnection<I, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn poll_connection(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let mut again = false;
            self.open_streams(cx);
            if self.failed.is_none() && !self.read_closed {
                match self.read_some(cx) {
                    Ok(more) => again |= more,
                    Err(reason) => self.fail(reason),
                }
            }
            if self.link.window.take_abandoned() {
                self.reap();
            }
            self.link.release_windows(&mut self.streams, cx);
            self.poll_bodies(cx);
            self.settle();
            match self.link.flush(&mut self.io, cx) {
                Poll::Ready(Ok(())) => again |= std::mem::take(&mut self.link.write_blocked),
                Poll::Ready(Err(error)) => {
                    self.end(ClientError::Connection(error.to_string().into()));
                    return Poll::Ready(());
                }
                Poll::Pending => {}
            }
            if self.link.write.is_empty() {
                let done = self.going_away.is_some() && self.streams.is_empty();
                if self.read_closed || self.failed.is_some() || done || self.idled_out(cx) {
                    let why = self.failed.take().unwrap_or_else(|| {
                        ClientError::Connection("the backend closed the connection".into())
                    });
                    self.end(why);
                    let _ = Pin::new(&mut self.io).poll_shutdown(cx);
                    return Poll::Ready(());
                }
            }
            if !again {
                return Poll::Pending;
            }
        }
    }

    /// Gives each queued request a stream and writes its head.
    fn open_streams(&mut self, cx: &mut Context<'_>) {
        {
            let mut queue = self.handle.queue();
            if !queue
                .waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                queue.waker = Some(cx.waker().clone());
            }
            if queue.opening.is_empty() {
                return;
            }
            std::mem::swap(&mut queue.opening, &mut self.taken);
        }
        let mut taken = std::mem::take(&mut self.taken);
        for opening in taken.drain(..) {
            if self.going_away.is_some() || self.next_id > frame::MAX_STREAM_ID {
                refuse_unsent(&mut self.handle.queue(), opening);
                self.ended += 1;
                continue;
            }
            let id = self.next_id;
            self.next_id += 2;
            self.link
                .write_block(id, opening.body.is_none(), &opening.block);
            self.streams.push(Entry {
                id,
                shared: opening.shared,
                recv_open: true,
                recv_window: i64::from(RECV_WINDOW),
                head_in: false,
                expected: opening.bodiless.then_some(0),
                received: 0,
                send: match opening.body {
                    Some(body) => Outgoing::Body {
                        body: Box::pin(body),
                        pending: Bytes::new(),
                    },
                    None => Outgoing::Done,
                },
                send_window: self.link.peer_initial_window,
            });
        }
        self.taken = taken;
        if self.idle_armed {
            self.idle_armed = false;
        }
        if self.next_id > frame::MAX_STREAM_ID {
            self.stop_taking(ClientError::Connection("stream ids used up".into()));
        }
    }

    /// No new streams from now on; those queued are refused.
    fn stop_taking(&mut self, why: ClientError) {
        let mut queue = self.handle.queue();
        if queue.closed.is_none() {
            queue.closed = Some(why);
        }
        let unsent = std::mem::take(&mut queue.opening);
        queue.active -= unsent.len().min(queue.active);
        for opening in unsent {
            refuse_unsent(&mut queue, opening);
        }
    }

    /// The queue's count of streams comes down by those that ended.
    fn settle(&mut self) {
        if self.ended > 0 {
            let mut queue = self.handle.queue();
            queue.active -= self.ended.min(queue.active);
            self.ended = 0;
        }
    }

    /// Whether the connection sat idle past its timeout (and now closes).
    fn idled_out(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.streams.is_empty() {
            return false;
        }
        if !self.idle_armed {
            self.idle_armed = true;
            let deadline = Instant::now() + self.settings.idle_timeout;
            self.idle.as_mut().reset(deadline);
        }
        if self.idle.as_mut().poll(cx).is_pending() {
            return false;
        }
        let mut queue = self.handle.queue();
        if queue.active > 0 || !queue.opening.is_empty() {
            return false;
        }
        queue.closed = Some(ClientError::Connection("closed when idle".into()));
        drop(queue);
        frame::goaway(&mut self.link.write, 0, Reason::NO_ERROR);
        let _ = self.link.flush(&mut self.io, cx);
        true
    }

    /// Reads what the backend sent and handles its frames; true if it
    /// stopped with more to read.
    fn read_some(&mut self, cx: &mut Context<'_>) -> Result<bool, Reason> {
        for _ in 0..8 {
            match self.link.fill(&mut self.io, &mut self.read, cx) {
                Fill::Closed => {
                    self.read_closed = true;
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
            Some(Kind::Priority) => {
                // Only our own streams are reset: a backend opens none.
                let reason = frame::priority_error(stream, &payload);
                if let (Some(reason), Some(at)) = (reason, self.position(stream)) {
                    let error = ClientError::Malformed("a PRIORITY frame in error");
                    self.stream_failed(at, Some(reason), error);
                }
                Ok(())
            }
            Some(Kind::RstStream) => self.reset(stream, &payload),
            Some(Kind::Settings) => {
                if stream != 0 {
                    return Err(Reason::PROTOCOL_ERROR);
                }
                if flags & FLAG_ACK != 0 {
                    return match payload.is_empty() {
                        true => Ok(()),
                        false => Err(Reason::FRAME_SIZE_ERROR),
                    };
                }
                if let Some(max) = self.link.peer_settings(&payload, &mut self.streams)? {
                    self.handle.queue().max = max as usize;
                }
                Ok(())
            }
            // We said SETTINGS_ENABLE_PUSH 0 (§8.4).
            Some(Kind::PushPromise) => Err(Reason::PROTOCOL_ERROR),
            Some(Kind::Ping) => self.link.ping(flags, stream, &payload).map(|_| ()),
            Some(Kind::GoAway) => self.goaway(stream, &payload),
            Some(Kind::WindowUpdate) => self.window_update(stream, &payload),
            None => Ok(()),
        }
    }

    fn position(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|e| e.id == id)
    }

    /// A frame on a stream we do not have: one we ended (ignored, §5.4.2)
    /// or one never opened (a connection error).
    fn unknown(&self, id: u32) -> Result<(), Reason> {
        match id >= self.next_id || id.is_multiple_of(2) {
            true => Err(Reason::PROTOCOL_ERROR),
            false => Ok(()),
        }
    }

    fn data(&mut self, flags: u8, id: u32, payload: Bytes) -> Result<(), Reason> {
        if id == 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        let (data, flow) = self.link.data(flags, payload)?;
        let end = flags & FLAG_END_STREAM != 0;
        let Some(at) = self.position(id).filter(|&at| self.streams[at].recv_open) else {
            self.link.recv_released += data.len() as i64;
            return self.unknown(id);
        };
        let entry = &mut self.streams[at];
        entry.recv_window -= flow;
        if entry.recv_window < 0 {
            self.link.recv_released += data.len() as i64;
            let error = ClientError::Reset(Reason::FLOW_CONTROL_ERROR);
            self.stream_failed(at, Some(Reason::FLOW_CONTROL_ERROR), error);
            return Ok(());
        }
        entry.received += data.len() as u64;
        let overrun = entry.expected.is_some_and(|expected| {
            entry.received > expected || (end && entry.received != expected)
        });
        if !entry.head_in || overrun {
            self.link.recv_released += data.len() as i64;
            let what = match entry.head_in {
                true => "a body other than its content-length",
                false => "DATA before the head",
            };
            self.stream_failed(
                at,
                Some(Reason::PROTOCOL_ERROR),
                ClientError::Malformed(what),
            );
            return Ok(());
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

    /// A whole header block: the answer's head (or an interim one), or
    /// its trailers.
    fn header_block(&mut self, block: &Block<'_>) -> Result<(), Reason> {
        let id = block.id;
        self.fields.clear();
        let max_list = self.settings.max_header_list_size as usize;
        let decoded = self
            .decoder
            .decode(block.bytes(), max_list, &mut self.fields)
            .map_err(|_| Reason::COMPRESSION_ERROR)?;
        let end = block.flags & FLAG_END_STREAM != 0;
        let Some(at) = self.position(id) else {
            return self.unknown(id);
        };
        if block.depends_on_itself {
            let error = ClientError::Malformed("the answer's stream depends on itself");
            self.stream_failed(at, Some(Reason::PROTOCOL_ERROR), error);
            return Ok(());
        }
        if !self.streams[at].recv_open {
            self.stream_failed(
                at,
                Some(Reason::STREAM_CLOSED),
                ClientError::Reset(Reason::STREAM_CLOSED),
            );
            return Ok(());
        }
        if decoded.oversized {
            let error = ClientError::Malformed("the answer's head is larger than allowed");
            self.stream_failed(at, Some(Reason::CANCEL), error);
            return Ok(());
        }
        if self.streams[at].head_in {
            return self.trailers(at, end);
        }
        let Some((status, headers)) = answer_head(&mut self.fields) else {
            let error = ClientError::Malformed("an invalid answer head");
            self.stream_failed(at, Some(Reason::PROTOCOL_ERROR), error);
            return Ok(());
        };
        if status.is_informational() {
            if end || status == StatusCode::SWITCHING_PROTOCOLS {
                let error = ClientError::Malformed("an interim answer that ends the stream");
                self.stream_failed(at, Some(Reason::PROTOCOL_ERROR), error);
            }
            return Ok(());
        }
        let entry = &mut self.streams[at];
        if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            entry.expected = Some(0);
        } else if entry.expected.is_none() {
            entry.expected = length(&headers);
        }
        if end && entry.expected.is_some_and(|n| n > 0) {
            let error = ClientError::Malformed("a body other than its content-length");
            self.stream_failed(at, Some(Reason::PROTOCOL_ERROR), error);
            return Ok(());
        }
        entry.head_in = true;
        // Answered: nothing will be sent again.
        match &mut entry.send {
            Outgoing::Sent(_) => entry.send = Outgoing::Done,
            Outgoing::Body { body, .. } => body.forget(),
            _ => {}
        }
        let (mut head, ()) = http::Response::new(()).into_parts();
        head.status = status;
        head.version = http::Version::HTTP_2;
        head.headers = headers;
        {
            let mut recv = entry.shared.recv();
            recv.head = Head::Ready(head);
            recv.ended = end;
            recv.wake();
        }
        if end {
            entry.recv_open = false;
            self.close_if_done(at);
        }
        Ok(())
    }

    fn trailers(&mut self, at: usize, end: bool) -> Result<(), Reason> {
        let mut trailers = HeaderMap::with_capacity(self.fields.len());
        let mut malformed = !end;
        for field in self.fields.drain(..) {
            match field {
                Field::Header(name, value) => {
                    trailers.append(name, value);
                }
                _ => malformed = true,
            }
        }
        let entry = &mut self.streams[at];
        if malformed || entry.expected.is_some_and(|n| n != entry.received) {
            let error = ClientError::Malformed("invalid trailers");
            self.stream_failed(at, Some(Reason::PROTOCOL_ERROR), error);
            return Ok(());
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
        let reason = Reason(u32::from_be_bytes(code));
        let Some(at) = self.position(id) else {
            return self.unknown(id);
        };
        let entry = &self.streams[at];
        if !entry.recv_open {
            // The answer is complete: the backend only asks us to stop
            // sending (§8.1).
            self.streams.swap_remove(at);
            self.ended += 1;
            return Ok(());
        }
        match (reason, entry.head_in) {
            (Reason::REFUSED_STREAM, false) => self.refused(at),
            _ => self.stream_failed(at, None, ClientError::Reset(reason)),
        }
        Ok(())
    }

    fn goaway(&mut self, id: u32, payload: &[u8]) -> Result<(), Reason> {
        if id != 0 || payload.len() < 8 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
            & frame::MAX_STREAM_ID;
        let code = Reason(u32::from_be_bytes([
            payload[4], payload[5], payload[6], payload[7],
        ]));
        self.going_away = Some(self.going_away.map_or(last, |seen| seen.min(last)));
        self.stop_taking(ClientError::Connection(
            format!("the backend sent GOAWAY ({code})").into(),
        ));
        // Streams past `last` were never processed.
        let mut at = 0;
        while at < self.streams.len() {
            if self.streams[at].id > last {
                self.refused(at);
            } else {
                at += 1;
            }
        }
        if code != Reason::NO_ERROR {
            self.failed = Some(ClientError::Connection(
                format!("the backend closed the connection ({code})").into(),
            ));
        }
        Ok(())
    }

    fn window_update(&mut self, id: u32, payload: &[u8]) -> Result<(), Reason> {
        let add = Link::increment(payload)?;
        if id == 0 {
            return self.link.connection_window(add);
        }
        let Some(at) = self.position(id) else {
            return self.unknown(id);
        };
        let entry = &mut self.streams[at];
        entry.send_window += add;
        if add == 0 || entry.send_window > i64::from(frame::MAX_WINDOW) {
            let reason = match add {
                0 => Reason::PROTOCOL_ERROR,
                _ => Reason::FLOW_CONTROL_ERROR,
            };
            self.stream_failed(at, Some(reason), ClientError::Reset(reason));
        }
        Ok(())
    }

    fn poll_bodies(&mut self, cx: &mut Context<'_>) {
        let mut at = 0;
        while at < self.streams.len() {
            let before = self.streams.len();
            let entry = &mut self.streams[at];
            if !matches!(entry.send, Outgoing::Body { .. }) {
                at += 1;
                continue;
            }
            match self.link.poll_body(entry, cx) {
                Sent::Pending => {}
                Sent::Ended => {
                    // Kept until the answer's head, to go again if refused.
                    let send = std::mem::replace(&mut entry.send, Outgoing::Done);
                    if let (Outgoing::Body { body, .. }, false) = (send, entry.head_in) {
                        if body.can_resend() {
                            entry.send = Outgoing::Sent(body);
                        }
                    }
                    self.close_if_done(at);
                }
                Sent::Failed(error) => {
                    tracing::debug!(stream = entry.id, %error, "request body failed");
                    self.stream_failed(at, Some(Reason::CANCEL), ClientError::Body);
                }
            }
            if self.streams.len() == before {
                at += 1;
            }
        }
    }

    /// The backend did not process stream `at` (§8.7): its body, if it
    /// can go again, is returned to its sender, who learns it was refused.
    fn refused(&mut self, at: usize) {
        let entry = self.streams.swap_remove(at);
        self.ended += 1;
        let body = match entry.send {
            Outgoing::Body { body, .. } | Outgoing::Sent(body) => Some(Pin::into_inner(body)),
            Outgoing::Waiting | Outgoing::Done => None,
        };
        if let Some(mut body) = body.filter(|b| b.can_resend()) {
            body.rewind();
            let key = Arc::as_ptr(&entry.shared) as usize;
            self.handle.queue().returned.push((key, *body));
        }
        fail(&entry.shared, ClientError::Refused);
    }

    /// Resets the streams whose answer nobody waits for any more.
    fn reap(&mut self) {
        let mut at = 0;
        while at < self.streams.len() {
            let entry = &self.streams[at];
            let gone = entry.recv_open && entry.shared.recv().dropped;
            if gone {
                let id = entry.id;
                self.streams.swap_remove(at);
                self.ended += 1;
                self.link.rst(id, Reason::CANCEL);
            } else {
                at += 1;
            }
        }
    }

    /// Ends stream `at` with `error` for its reader, resetting it with
    /// `reason` when given.
    fn stream_failed(&mut self, at: usize, reason: Option<Reason>, error: ClientError) {
        let entry = self.streams.swap_remove(at);
        self.ended += 1;
        if let Some(reason) = reason {
            self.link.rst(entry.id, reason);
        }
        fail(&entry.shared, error);
    }

    fn close_if_done(&mut self, at: usize) {
        let entry = &self.streams[at];
        if !entry.recv_open && matches!(entry.send, Outgoing::Done | Outgoing::Sent(_)) {
            self.streams.swap_remove(at);
            self.ended += 1;
        }
    }

    /// A connection error: GOAWAY, and every stream ends.
    fn fail(&mut self, reason: Reason) {
        tracing::debug!(%reason, "HTTP/2 backend connection error");
        let last = self.streams.iter().map(|e| e.id).max().unwrap_or(0);
        frame::goaway(&mut self.link.write, last, reason);
        self.failed = Some(ClientError::Connection(
            format!("we closed it ({reason})").into(),
        ));
    }

    /// The connection is over: whoever still waits learns why.
    fn end(&mut self, why: ClientError) {
        self.stop_taking(why.clone());
        for entry in self.streams.drain(..) {
            fail(&entry.shared, why.clone());
        }
        self.ended = 0;
        self.handle.queue().active = 0;
    }
}

/// A request that never went out fails as refused; its body waits in
/// the queue for its sender, who sends it again elsewhere.
fn refuse_unsent<B>(queue: &mut Queue<B>, opening: Opening<B>) {
    if let Some(body) = opening.body {
        let key = Arc::as_ptr(&opening.shared) as usize;
        queue.returned.push((key, body));
    }
    let mut recv = opening.shared.recv();
    recv.head = Head::Failed(ClientError::Refused);
    recv.wake();
}

/// Fails a stream's reader: before the head with `error`, after it the
/// body ends in error.
fn fail(shared: &Shared, error: ClientError) {
    let code = match &error {
        ClientError::Reset(reason) => reason.0,
        ClientError::Malformed(_) => Reason::PROTOCOL_ERROR.0,
        _ => Reason::CANCEL.0,
    };
    {
        let mut recv = shared.recv();
        if matches!(recv.head, Head::Waiting) {
            recv.head = Head::Failed(error);
        }
    }
    shared.fail(code);
}

/// The `:status` and headers of an answer's head; `None` when it is
/// malformed (§8.3.2: one `:status`, before the regular fields, no
/// request pseudo-fields; no connection-specific fields).
fn answer_head(fields: &mut Vec<Field>) -> Option<(StatusCode, HeaderMap)> {
    let mut status = None;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for field in fields.drain(..) {
        match field {
            Field::Status(value) if status.is_none() && headers.is_empty() => {
                status = Some(StatusCode::from_bytes(&value).ok()?);
            }
            Field::Header(name, value) => {
                if super::request::connection_specific(&name) {
                    return None;
                }
                headers.append(name, value);
            }
            _ => return None,
        }
    }
    Some((status?, headers))
}

/// `content-length`, when present and valid.
fn length(headers: &HeaderMap) -> Option<u64> {
    let value = headers.get(http::header::CONTENT_LENGTH)?;
    std::str::from_utf8(value.as_bytes()).ok()?.parse().ok()
}

impl<I, B> Future for ClientConnection<I, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().poll_connection(cx)
    }
}

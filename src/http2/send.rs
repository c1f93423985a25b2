//! The answer's side of a connection: a stream's head when its future
//! ends, then its body within the client's windows, then its trailers.

use std::future::Future;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use http::{HeaderMap, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::{Connection, Outgoing, WRITE_HIGH};
use super::frame::{self, Kind, Reason, FLAG_END_HEADERS, FLAG_END_STREAM};
use super::hpack;
use super::request;
use super::stream::RecvBody;

impl<I, S, F, B, E> Connection<I, S, F, B>
where
    I: AsyncRead + AsyncWrite + Unpin,
    S: FnMut(http::Request<RecvBody>) -> F,
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A stream's future answered: its head goes out, its body follows.
    pub(super) fn answer(&mut self, id: u32, response: Response<B>) {
        let Some(at) = self.position(id) else {
            return;
        };
        if self.early_resets > 0 {
            self.early_resets -= 1;
        }
        let (parts, body) = response.into_parts();
        let end = body.is_end_stream();
        self.head.clear();
        hpack::encode_status(parts.status, &mut self.head);
        let mut date = false;
        let mut length = false;
        for (name, value) in &parts.headers {
            if request::connection_specific(name) {
                continue;
            }
            date |= name == http::header::DATE;
            length |= name == http::header::CONTENT_LENGTH;
            hpack::encode_field(name, value.as_bytes(), value.is_sensitive(), &mut self.head);
        }
        if !date {
            let now = crate::clock::http_date(std::time::SystemTime::now());
            hpack::encode_field(&http::header::DATE, now.as_bytes(), false, &mut self.head);
        }
        if !length && !end {
            if let Some(exact) = body.size_hint().exact() {
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(exact).as_bytes();
                hpack::encode_field(&http::header::CONTENT_LENGTH, digits, false, &mut self.head);
            }
        }
        self.write_head(id, end);
        let entry = &mut self.streams[at];
        if end {
            entry.send = Outgoing::Done;
            self.answered(at);
        } else {
            entry.send = Outgoing::Body {
                body: Box::pin(body),
                pending: Bytes::new(),
            };
        }
    }

    /// The answer is complete: a client still sending is asked to stop
    /// (§8.1) unless someone still reads its body.
    fn answered(&mut self, at: usize) {
        let entry = &mut self.streams[at];
        if entry.recv_open {
            let dropped = entry.shared.recv().dropped;
            if dropped {
                entry.recv_open = false;
                let id = entry.id;
                self.rst(id, Reason::NO_ERROR);
            }
        }
        self.close_if_done(at);
    }

    /// Writes `self.head` as HEADERS (and CONTINUATION frames when it is
    /// larger than the client's frames).
    pub(super) fn write_head(&mut self, id: u32, end: bool) {
        let end_stream = if end { FLAG_END_STREAM } else { 0 };
        let mut block = &self.head[..];
        let mut kind = Kind::Headers;
        let mut flags = end_stream;
        loop {
            let n = block.len().min(self.peer_max_frame);
            let last = n == block.len();
            let end_headers = if last { FLAG_END_HEADERS } else { 0 };
            frame::head(&mut self.write, n, kind, flags | end_headers, id);
            self.write.put_slice(&block[..n]);
            block = &block[n..];
            if last {
                return;
            }
            kind = Kind::Continuation;
            flags = 0;
        }
    }

    pub(super) fn poll_bodies(&mut self, cx: &mut Context<'_>) {
        let mut at = 0;
        while at < self.streams.len() {
            if matches!(self.streams[at].send, Outgoing::Body { .. }) && self.poll_body(at, cx) {
                self.streams[at].send = Outgoing::Done;
                let before = self.streams.len();
                self.answered(at);
                if self.streams.len() < before {
                    continue;
                }
            }
            at += 1;
        }
    }

    /// Sends what stream `at`'s body has, within the windows; true once
    /// the body has ended (its last frame written, or the stream reset).
    fn poll_body(&mut self, at: usize, cx: &mut Context<'_>) -> bool {
        loop {
            if self.write.len() >= WRITE_HIGH {
                self.write_blocked = true;
                return false;
            }
            let max_frame = self.peer_max_frame as i64;
            let entry = &mut self.streams[at];
            let Outgoing::Body { body, pending } = &mut entry.send else {
                return true;
            };
            if !pending.is_empty() {
                let room = entry.send_window.min(self.send_window).min(max_frame);
                if room <= 0 {
                    return false;
                }
                let n = pending.len().min(room as usize);
                let chunk = pending.split_to(n);
                let end = pending.is_empty() && body.is_end_stream();
                entry.send_window -= n as i64;
                self.send_window -= n as i64;
                let id = entry.id;
                let flags = if end { FLAG_END_STREAM } else { 0 };
                frame::head(&mut self.write, n, Kind::Data, flags, id);
                self.write.put_slice(&chunk);
                if end {
                    return true;
                }
                continue;
            }
            let id = entry.id;
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {
                        if body.is_end_stream() {
                            frame::head(&mut self.write, 0, Kind::Data, FLAG_END_STREAM, id);
                            return true;
                        }
                    }
                    Ok(data) => *pending = data,
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.write_trailers(id, &trailers);
                            return true;
                        }
                    }
                },
                Poll::Ready(Some(Err(error))) => {
                    let error: Box<dyn std::error::Error + Send + Sync> = error.into();
                    tracing::debug!(stream = id, %error, "HTTP/2 answer body failed");
                    self.rst(id, Reason::INTERNAL_ERROR);
                    return true;
                }
                Poll::Ready(None) => {
                    frame::head(&mut self.write, 0, Kind::Data, FLAG_END_STREAM, id);
                    return true;
                }
                Poll::Pending => return false,
            }
        }
    }

    fn write_trailers(&mut self, id: u32, trailers: &HeaderMap) {
        self.head.clear();
        for (name, value) in trailers {
            if !request::connection_specific(name) {
                hpack::encode_field(name, value.as_bytes(), value.is_sensitive(), &mut self.head);
            }
        }
        self.write_head(id, true);
    }
}

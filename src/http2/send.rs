//! The answer's side of a connection: a stream's head when its future
//! ends, then its body within the client's windows, then its trailers.

use std::future::Future;
use std::task::Context;

use bytes::Bytes;
use http::Response;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::Connection;
use super::frame::Reason;
use super::hpack;
use super::link::{Outgoing, Sent};
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
        self.link.head.clear();
        hpack::encode_status(parts.status, &mut self.link.head);
        let mut date = false;
        let mut length = false;
        for (name, value) in &parts.headers {
            if request::connection_specific(name) {
                continue;
            }
            date |= name == http::header::DATE;
            length |= name == http::header::CONTENT_LENGTH;
            hpack::encode_field(
                name,
                value.as_bytes(),
                value.is_sensitive(),
                &mut self.link.head,
            );
        }
        if !date {
            let now = crate::clock::http_date(std::time::SystemTime::now());
            hpack::encode_field(
                &http::header::DATE,
                now.as_bytes(),
                false,
                &mut self.link.head,
            );
        }
        if !length && !end {
            if let Some(exact) = body.size_hint().exact() {
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(exact).as_bytes();
                hpack::encode_field(
                    &http::header::CONTENT_LENGTH,
                    digits,
                    false,
                    &mut self.link.head,
                );
            }
        }
        self.link.write_head(id, end);
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
                self.link.rst(id, Reason::NO_ERROR);
            }
        }
        self.close_if_done(at);
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
        let entry = &mut self.streams[at];
        match self.link.poll_body(entry, cx) {
            Sent::Pending => false,
            Sent::Ended => true,
            Sent::Failed(error) => {
                let id = entry.id;
                tracing::debug!(stream = id, %error, "HTTP/2 answer body failed");
                self.link.rst(id, Reason::INTERNAL_ERROR);
                true
            }
        }
    }
}

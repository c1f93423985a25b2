//! The body side of the HTTP/1.1 client codec: how a response body is
//! delimited (RFC 9112 §6.3: none, length, chunked, to close), decoding
//! it from the connection's buffer, and [`UpstreamBody`], the body a
//! proxied answer streams from, which hands its connection back to the
//! pool after a clean end.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};
use http_body::{Body, Frame, SizeHint};

use super::{H1Conn, ParsedHead, RequestWriter, SendError, MAX_CHUNK_LINE};

/// The non-empty, trimmed items of a comma-separated header, over all
/// its fields (`Connection: close, x-a`, `Transfer-Encoding: gzip, chunked`).
pub fn header_tokens<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl DoubleEndedIterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// How the response body is delimited (RFC 9112 §6.3), and whether the
/// connection may carry another request after it.
pub(super) fn body_framing(
    head: &mut ParsedHead,
    head_request: bool,
) -> Result<(BodyFraming, bool), SendError> {
    let headers = &mut head.headers;
    let mut keep_alive = match head.version {
        Version::HTTP_10 => head.keep_alive,
        _ => !head.close,
    };
    let status = head.status;
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((BodyFraming::Length(0), keep_alive));
    }
    if head.transfer_encoding {
        // With Content-Length as well, the transfer coding wins, the
        // length is dropped and the connection is not reused (RFC 9112
        // §6.1): the client must not see a length the body does not have.
        if headers.remove(header::CONTENT_LENGTH).is_some() {
            keep_alive = false;
        }
        // Only `chunked`, once: the gateway decodes it and frames the body
        // anew for its client, and would have to drop any other coding
        // (`gzip, chunked` would reach the client as gzip bytes labelled
        // plain), or decode one layer of two. HAProxy answers 502 too.
        let mut codings = header_tokens(headers, &header::TRANSFER_ENCODING);
        let only_chunked = codings
            .next()
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
            && codings.next().is_none();
        if !only_chunked {
            return Err(SendError::Invalid(
                "a transfer coding other than a single chunked",
            ));
        }
        return Ok((BodyFraming::Chunked(Chunked::Size), keep_alive));
    }
    let length = head.content_length.map_err(SendError::Invalid)?;
    Ok(match length {
        Some(n) => (BodyFraming::Length(n), keep_alive),
        None => (BodyFraming::Close, false),
    })
}

/// Where the response body ends.
#[derive(Debug)]
pub(super) enum BodyFraming {
    /// This many bytes are still to come.
    Length(u64),
    Chunked(Chunked),
    /// Everything until the backend closes the connection.
    Close,
}

/// Where a chunked body decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunked {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

impl BodyFraming {
    pub(super) fn is_finished(&self) -> bool {
        matches!(
            self,
            BodyFraming::Length(0) | BodyFraming::Chunked(Chunked::Done)
        )
    }

    /// The next body frame; `None` at the end of the body.
    fn poll_frame(
        &mut self,
        conn: &mut H1Conn,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SendError>>> {
        loop {
            match self {
                BodyFraming::Length(0) | BodyFraming::Chunked(Chunked::Done) => {
                    return Poll::Ready(None)
                }
                BodyFraming::Length(left) => {
                    if let Some(data) = take_data(conn, left) {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                BodyFraming::Close => {
                    let available = conn.buffered().len();
                    if available > 0 {
                        let data = Bytes::copy_from_slice(conn.buffered());
                        conn.consume(available);
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    match ready!(conn.poll_fill(cx)) {
                        Ok(0) => return Poll::Ready(None),
                        Ok(_) => continue,
                        Err(error) => return Poll::Ready(Some(Err(SendError::Io(error)))),
                    }
                }
                BodyFraming::Chunked(state) => match decode_chunked(state, conn) {
                    Ok(Some(frame)) => return Poll::Ready(Some(Ok(frame))),
                    Ok(None) if *state == Chunked::Done => return Poll::Ready(None),
                    Ok(None) => {}
                    Err(error) => return Poll::Ready(Some(Err(error))),
                },
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => return Poll::Ready(Some(Err(SendError::Closed))),
                Ok(_) => {}
                Err(error) => return Poll::Ready(Some(Err(SendError::Io(error)))),
            }
        }
    }
}

/// Up to `left` buffered body bytes, if any are buffered.
pub(super) fn take_data(conn: &mut H1Conn, left: &mut u64) -> Option<Bytes> {
    let available = conn.buffered().len();
    if available == 0 || *left == 0 {
        return None;
    }
    let n = usize::try_from(*left).map_or(available, |l| l.min(available));
    let data = Bytes::copy_from_slice(&conn.buffered()[..n]);
    conn.consume(n);
    *left -= n as u64;
    Some(data)
}

/// Advances a chunked decoder over the buffered bytes. `Ok(Some)` is a
/// frame to pass on; `Ok(None)` means more bytes are needed (or, in
/// `Done`, that the body is over).
pub(super) fn decode_chunked(
    state: &mut Chunked,
    conn: &mut H1Conn,
) -> Result<Option<Frame<Bytes>>, SendError> {
    loop {
        match *state {
            Chunked::Done => return Ok(None),
            Chunked::Size => {
                let buffered = conn.buffered();
                let Some(line_end) = buffered.windows(2).position(|w| w == b"\r\n") else {
                    if buffered.len() > MAX_CHUNK_LINE {
                        return Err(SendError::Invalid("chunk size line too long"));
                    }
                    return Ok(None);
                };
                let size = chunk_size(&buffered[..line_end + 2])?;
                conn.consume(line_end + 2);
                *state = if size == 0 {
                    Chunked::Trailers
                } else {
                    Chunked::Data(size)
                };
            }
            Chunked::Data(mut left) => {
                let Some(data) = take_data(conn, &mut left) else {
                    return Ok(None);
                };
                *state = if left == 0 {
                    Chunked::DataEnd
                } else {
                    Chunked::Data(left)
                };
                return Ok(Some(Frame::data(data)));
            }
            Chunked::DataEnd => {
                let buffered = conn.buffered();
                if buffered.len() < 2 {
                    return Ok(None);
                }
                if &buffered[..2] != b"\r\n" {
                    return Err(SendError::Invalid("chunk not followed by CRLF"));
                }
                conn.consume(2);
                *state = Chunked::Size;
            }
            Chunked::Trailers => {
                let mut slots = [httparse::EMPTY_HEADER; 32];
                let (len, trailers) = match httparse::parse_headers(conn.buffered(), &mut slots) {
                    Ok(httparse::Status::Complete((len, fields))) => {
                        let mut trailers = HeaderMap::with_capacity(fields.len());
                        for f in fields {
                            let name = HeaderName::from_bytes(f.name.as_bytes())
                                .map_err(|_| SendError::Invalid("bad trailer name"))?;
                            let value = HeaderValue::from_bytes(f.value)
                                .map_err(|_| SendError::Invalid("bad trailer value"))?;
                            trailers.append(name, value);
                        }
                        (len, trailers)
                    }
                    Ok(httparse::Status::Partial) => {
                        if conn.buffered().len() > MAX_CHUNK_LINE {
                            return Err(SendError::Invalid("trailer section too long"));
                        }
                        return Ok(None);
                    }
                    Err(_) => return Err(SendError::Invalid("malformed trailers")),
                };
                conn.consume(len);
                *state = Chunked::Done;
                if !trailers.is_empty() {
                    return Ok(Some(Frame::trailers(trailers)));
                }
                return Ok(None);
            }
        }
    }
}

/// The size in a chunk-size line (with its CRLF): hex digits, then
/// optional extensions, as `httparse` reads them. Stricter than it in two
/// ways that keep framing unambiguous: at least one digit (it reads an
/// empty line as the last chunk), and no control characters anywhere (a
/// bare LF in an extension would be a line end to the next parser).
pub(super) fn chunk_size(line: &[u8]) -> Result<u64, SendError> {
    let bad = || SendError::Invalid("bad chunk size");
    let content = line.strip_suffix(b"\r\n").ok_or_else(bad)?;
    if !content.first().is_some_and(u8::is_ascii_hexdigit)
        || content.iter().any(|b| b.is_ascii_control() && *b != b'\t')
    {
        return Err(bad());
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((_, size))) => Ok(size),
        _ => Err(bad()),
    }
}

/// A response body read from a plain HTTP/1.1 backend; also finishes
/// writing the request body, for backends that answer while they read.
pub struct UpstreamBody<B = crate::backends::RequestBody> {
    pub(super) conn: Option<H1Conn>,
    pub(super) writer: Option<RequestWriter<B>>,
    pub(super) write_failed: bool,
    pub(super) framing: BodyFraming,
    pub(super) keep_alive: bool,
    /// The connection, once the exchange completed cleanly.
    pub(super) idle: Option<H1Conn>,
}

impl<B> std::fmt::Debug for UpstreamBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("framing", &self.framing)
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

impl<B> UpstreamBody<B> {
    /// The response is over: the connection may serve again only if the
    /// request was written in full, the backend keeps the connection
    /// open, and nothing follows the response.
    pub(super) fn complete(&mut self) {
        let conn = self.conn.take();
        if self.writer.is_none() && !self.write_failed && self.keep_alive {
            self.idle = conn.filter(|c| c.buffered().is_empty());
        }
    }

    /// The connection, once the exchange has completed cleanly.
    pub fn take_connection(&mut self) -> Option<H1Conn> {
        self.idle.take()
    }
}

impl<B> Body for UpstreamBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = SendError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SendError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(writer) = this.writer.as_mut() {
            match writer.poll(cx, &mut conn.stream) {
                Poll::Ready(Ok(())) => this.writer = None,
                Poll::Ready(Err(_)) => {
                    this.writer = None;
                    this.write_failed = true;
                }
                Poll::Pending => {}
            }
        }
        let polled = this.framing.poll_frame(conn, cx);
        match &polled {
            Poll::Ready(None) => this.complete(),
            Poll::Ready(Some(Err(_))) => this.conn = None,
            // hyper stops polling once a declared length is written: hand
            // the connection back as soon as the last byte is in.
            Poll::Ready(Some(Ok(_))) if this.framing.is_finished() => this.complete(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            BodyFraming::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

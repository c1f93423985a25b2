//! What both ends of an HTTP/2 connection keep the same way, whichever
//! side they serve: the bytes to write, the windows both ways, the
//! peer's frame size, and how a stream's outgoing body and a reader's
//! released window turn into frames. The server (`conn`) and the client
//! (`client`) each hold one.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::HeaderMap;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use super::frame::{self, Kind, Reason, FLAG_END_HEADERS, FLAG_END_STREAM};
use super::hpack;
use super::request;
use super::spare;
use super::stream::{Shared, Window, RELEASE_STEP};

/// The window each stream and the connection open to the peer: about
/// what hyper opened (1 MiB), so uploads are not slower.
pub(super) const RECV_WINDOW: u32 = 1024 * 1024;
/// Past this many bytes waiting to be written, the peer's frames are
/// not read: a flood of PINGs or SETTINGS whose answers it never reads
/// fills its own buffers, not ours.
pub(super) const WRITE_HIGH: usize = 256 * 1024;
/// Every window's size before SETTINGS change it (§6.9.2).
pub(super) const DEFAULT_WINDOW: i64 = 65_535;

/// The outgoing side of a stream: the server's answer, the client's
/// request body.
pub(super) enum Outgoing<B> {
    /// The server's: the stream's future is running.
    Waiting,
    /// Its body goes out as the windows allow.
    Body {
        body: Pin<Box<B>>,
        /// Polled from the body; not sent yet for want of window.
        pending: Bytes,
    },
    /// The client's: the request body went out in full and is kept
    /// until the answer's head, to be sent again if the backend refuses
    /// the stream unprocessed.
    Sent(Pin<Box<B>>),
    Done,
}

pub(super) struct Entry<B> {
    pub(super) id: u32,
    pub(super) shared: Arc<Shared>,
    /// The peer may still send DATA (no END_STREAM yet).
    pub(super) recv_open: bool,
    /// What the peer may still send on it before a WINDOW_UPDATE.
    pub(super) recv_window: i64,
    /// The peer's head arrived (on the server, always).
    pub(super) head_in: bool,
    /// `content-length` of what arrives, and what arrived.
    pub(super) expected: Option<u64>,
    pub(super) received: u64,
    pub(super) send: Outgoing<B>,
    /// What we may still send on it.
    pub(super) send_window: i64,
}

/// How far a stream's outgoing body got in one poll.
pub(super) enum Sent {
    /// Waiting for the body, the windows or the write buffer.
    Pending,
    /// Its last frame is written.
    Ended,
    /// The body failed: the caller resets the stream.
    Failed(Box<dyn std::error::Error + Send + Sync>),
}

/// A header block, whole: its stream, its HEADERS frame's flags, and
/// its bytes (the HEADERS frame's own, or joined from CONTINUATION).
pub(super) struct Block<'a> {
    pub(super) id: u32,
    pub(super) flags: u8,
    /// The HEADERS frame named its own stream as its parent (§5.3.1): a
    /// stream error, answered once the block is decoded (so that HPACK's
    /// table stays the peer's).
    pub(super) depends_on_itself: bool,
    bytes: Cow<'a, [u8]>,
}

impl Block<'_> {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// What one read from the peer did.
pub(super) enum Fill {
    /// Bytes arrived.
    Read,
    /// Nothing to read now, or reading waits for the write buffer.
    Stop,
    /// The peer closed its side (or the read failed).
    Closed,
}

pub(super) struct Link {
    pub(super) write: BytesMut,
    /// A header block being encoded.
    pub(super) head: BytesMut,
    pub(super) send_window: i64,
    /// What the peer may still send on the connection.
    pub(super) recv_window: i64,
    /// Window given back by dropped data, not yet announced.
    pub(super) recv_released: i64,
    /// Window given back by the bodies' readers.
    pub(super) window: Arc<Window>,
    /// Reading or a body stopped at `WRITE_HIGH`: once the buffer is
    /// written, go on.
    pub(super) write_blocked: bool,
    /// The waker `window` holds (registered again only when it changes).
    pub(super) waker: Option<Waker>,
    pub(super) peer_initial_window: i64,
    pub(super) peer_max_frame: usize,
    /// A header block whose CONTINUATION frames are still coming: what
    /// arrived so far, copied.
    pub(super) continuation: Option<Block<'static>>,
    /// The peer's SETTINGS came (its first frame must be them).
    pub(super) settings_seen: bool,
}

impl Link {
    /// A link whose first bytes are `write` (the preface, SETTINGS), with
    /// the connection's window opened to `RECV_WINDOW` after them.
    pub(super) fn new(mut write: BytesMut) -> Link {
        frame::window_update(&mut write, 0, RECV_WINDOW - DEFAULT_WINDOW as u32);
        Link {
            write,
            head: BytesMut::new(),
            send_window: DEFAULT_WINDOW,
            recv_window: i64::from(RECV_WINDOW),
            recv_released: 0,
            window: Arc::new(Window::default()),
            write_blocked: false,
            waker: None,
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            continuation: None,
            settings_seen: false,
        }
    }

    /// Our SETTINGS frame: `settings` and the streams' window.
    pub(super) fn settings_frame(out: &mut BytesMut, settings: &[(u16, u32)]) {
        frame::head(out, 6 * (settings.len() + 1), Kind::Settings, 0, 0);
        for &(id, value) in settings
            .iter()
            .chain(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, RECV_WINDOW)])
        {
            out.put_u16(id);
            out.put_u32(value);
        }
    }

    /// Writes `self.head` as HEADERS (and CONTINUATION frames when it is
    /// larger than the peer's frames).
    pub(super) fn write_head(&mut self, id: u32, end: bool) {
        let head = std::mem::take(&mut self.head);
        self.write_block(id, end, &head);
        self.head = head;
    }

    /// Writes the header block `block` as HEADERS (and CONTINUATION).
    #[inline(always)]
    pub(super) fn write_block(&mut self, id: u32, end: bool, mut block: &[u8]) {
        let end_stream = if end { FLAG_END_STREAM } else { 0 };
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

    /// Writes `trailers` as the stream's last HEADERS.
    pub(super) fn write_trailers(&mut self, id: u32, trailers: &HeaderMap) {
        self.head.clear();
        for (name, value) in trailers {
            if !request::connection_specific(name) {
                hpack::encode_field(name, value.as_bytes(), value.is_sensitive(), &mut self.head);
            }
        }
        self.write_head(id, true);
    }

    pub(super) fn rst(&mut self, id: u32, reason: Reason) {
        frame::head(&mut self.write, 4, Kind::RstStream, 0, id);
        self.write.put_u32(reason.0);
    }

    /// Sends what `entry`'s outgoing body has, within the windows.
    #[inline(always)]
    pub(super) fn poll_body<B>(&mut self, entry: &mut Entry<B>, cx: &mut Context<'_>) -> Sent
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let id = entry.id;
        loop {
            if self.write.len() >= WRITE_HIGH {
                self.write_blocked = true;
                return Sent::Pending;
            }
            let Outgoing::Body { body, pending } = &mut entry.send else {
                return Sent::Ended;
            };
            if !pending.is_empty() {
                let max_frame = self.peer_max_frame as i64;
                let room = entry.send_window.min(self.send_window).min(max_frame);
                if room <= 0 {
                    return Sent::Pending;
                }
                let n = pending.len().min(room as usize);
                let chunk = pending.split_to(n);
                let end = pending.is_empty() && body.is_end_stream();
                entry.send_window -= n as i64;
                self.send_window -= n as i64;
                let flags = if end { FLAG_END_STREAM } else { 0 };
                frame::head(&mut self.write, n, Kind::Data, flags, id);
                self.write.put_slice(&chunk);
                if end {
                    return Sent::Ended;
                }
                continue;
            }
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {
                        if body.is_end_stream() {
                            frame::head(&mut self.write, 0, Kind::Data, FLAG_END_STREAM, id);
                            return Sent::Ended;
                        }
                    }
                    Ok(data) => *pending = data,
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.write_trailers(id, &trailers);
                            return Sent::Ended;
                        }
                    }
                },
                Poll::Ready(Some(Err(error))) => return Sent::Failed(error.into()),
                Poll::Ready(None) => {
                    frame::head(&mut self.write, 0, Kind::Data, FLAG_END_STREAM, id);
                    return Sent::Ended;
                }
                Poll::Pending => return Sent::Pending,
            }
        }
    }

    /// The order every frame keeps (`frame::in_order`).
    #[inline]
    pub(super) fn in_order(&mut self, header: &frame::Header) -> Result<(), Reason> {
        let open = self.continuation.as_ref().map(|block| block.id);
        frame::in_order(header, &mut self.settings_seen, open)
    }

    /// A HEADERS (`continued` false) or CONTINUATION frame's part of a
    /// header block: the block once its last part came. A block that
    /// never ends is bounded by `limit` (the header list's): twice it is
    /// more than any encoding of an acceptable list takes.
    #[inline(always)]
    pub(super) fn header_part<'a>(
        &mut self,
        continued: bool,
        flags: u8,
        id: u32,
        payload: &'a [u8],
        limit: usize,
    ) -> Result<Option<Block<'a>>, Reason> {
        let end = flags & FLAG_END_HEADERS != 0;
        if !continued {
            let fragment = frame::header_block(flags, payload)?;
            if id == 0 {
                return Err(Reason::PROTOCOL_ERROR);
            }
            let block = Block {
                id,
                flags,
                depends_on_itself: frame::header_dependency(flags, payload) == Some(id),
                bytes: Cow::Borrowed(fragment),
            };
            if end {
                return Ok(Some(block));
            }
            let bytes = Cow::Owned(block.bytes.into_owned());
            self.continuation = Some(Block { bytes, ..block });
            return Ok(None);
        }
        let Some(mut block) = self.continuation.take() else {
            return Err(Reason::PROTOCOL_ERROR);
        };
        block.bytes.to_mut().extend_from_slice(payload);
        if block.bytes.len() > 2 * limit + 1024 {
            return Err(Reason::ENHANCE_YOUR_CALM);
        }
        if end {
            return Ok(Some(block));
        }
        self.continuation = Some(block);
        Ok(None)
    }

    /// A PING: answered unless it is an acknowledgement, whose payload
    /// is returned.
    pub(super) fn ping(
        &mut self,
        flags: u8,
        stream: u32,
        payload: &[u8],
    ) -> Result<Option<[u8; 8]>, Reason> {
        let opaque: [u8; 8] = payload.try_into().map_err(|_| Reason::FRAME_SIZE_ERROR)?;
        if stream != 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        if flags & frame::FLAG_ACK != 0 {
            return Ok(Some(opaque));
        }
        frame::ping(&mut self.write, frame::FLAG_ACK, opaque);
        Ok(None)
    }

    /// A DATA frame's share of the connection's window, and its content
    /// without padding (which is given back at once).
    pub(super) fn data(&mut self, flags: u8, payload: Bytes) -> Result<(Bytes, i64), Reason> {
        let flow = payload.len() as i64;
        self.recv_window -= flow;
        if self.recv_window < 0 {
            return Err(Reason::FLOW_CONTROL_ERROR);
        }
        let data = frame::unpad(flags, payload)?;
        self.recv_released += flow - data.len() as i64;
        Ok((data, flow))
    }

    /// The peer's SETTINGS (not an acknowledgement): windows and frame
    /// size taken, acknowledged; returns its MAX_CONCURRENT_STREAMS.
    pub(super) fn peer_settings<B>(
        &mut self,
        payload: &[u8],
        streams: &mut [Entry<B>],
    ) -> Result<Option<u32>, Reason> {
        if !payload.len().is_multiple_of(6) {
            return Err(Reason::FRAME_SIZE_ERROR);
        }
        let mut max_streams = None;
        for setting in payload.chunks_exact(6) {
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match u16::from_be_bytes([setting[0], setting[1]]) {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => return Err(Reason::PROTOCOL_ERROR),
                frame::SETTINGS_MAX_CONCURRENT_STREAMS => max_streams = Some(value),
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if value > frame::MAX_WINDOW {
                        return Err(Reason::FLOW_CONTROL_ERROR);
                    }
                    let delta = i64::from(value) - self.peer_initial_window;
                    self.peer_initial_window = i64::from(value);
                    for entry in streams.iter_mut() {
                        entry.send_window += delta;
                        if entry.send_window > i64::from(frame::MAX_WINDOW) {
                            return Err(Reason::FLOW_CONTROL_ERROR);
                        }
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(16_384..=16_777_215).contains(&value) {
                        return Err(Reason::PROTOCOL_ERROR);
                    }
                    self.peer_max_frame = value as usize;
                }
                _ => {}
            }
        }
        frame::head(&mut self.write, 0, Kind::Settings, frame::FLAG_ACK, 0);
        Ok(max_streams)
    }

    /// A WINDOW_UPDATE's increment (§6.9), checked; for the connection
    /// when `id` is 0.
    pub(super) fn increment(payload: &[u8]) -> Result<i64, Reason> {
        let raw: [u8; 4] = payload.try_into().map_err(|_| Reason::FRAME_SIZE_ERROR)?;
        Ok(i64::from(u32::from_be_bytes(raw) & 0x7fff_ffff))
    }

    /// The connection's window grows by `add`.
    pub(super) fn connection_window(&mut self, add: i64) -> Result<(), Reason> {
        if add == 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        self.send_window += add;
        if self.send_window > i64::from(frame::MAX_WINDOW) {
            return Err(Reason::FLOW_CONTROL_ERROR);
        }
        Ok(())
    }

    /// Gives the peer back the window its bodies' readers released: a
    /// stream's own while it may still send, the connection's always.
    pub(super) fn release_windows<B>(&mut self, streams: &mut [Entry<B>], cx: &mut Context<'_>) {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.window.register(cx.waker());
            self.waker = Some(cx.waker().clone());
        }
        self.recv_released += self.window.take() as i64;
        for entry in streams.iter_mut() {
            if !entry.recv_open {
                continue;
            }
            let released = {
                let mut recv = entry.shared.recv();
                if recv.released >= RELEASE_STEP {
                    std::mem::take(&mut recv.released)
                } else {
                    0
                }
            };
            if released > 0 {
                entry.recv_window += released as i64;
                frame::window_update(&mut self.write, entry.id, released as u32);
            }
        }
        if self.recv_released >= i64::from(RECV_WINDOW) / 4
            || (self.recv_released > 0 && self.recv_window < i64::from(RECV_WINDOW) / 2)
        {
            frame::window_update(&mut self.write, 0, self.recv_released as u32);
            self.recv_window += self.recv_released;
            self.recv_released = 0;
        }
    }

    /// Reads what the peer sent into `read`, unless `WRITE_HIGH` bytes
    /// wait to be written (then the write side goes first).
    #[inline]
    pub(super) fn fill<I: AsyncRead + Unpin>(
        &mut self,
        io: &mut I,
        read: &mut BytesMut,
        cx: &mut Context<'_>,
    ) -> Fill {
        if self.write.len() >= WRITE_HIGH {
            self.write_blocked = true;
            return Fill::Stop;
        }
        if read.capacity() == 0 {
            *read = spare::take();
        } else if read.capacity() - read.len() < 4096 {
            read.reserve(spare::SIZE);
        }
        match tokio_util::io::poll_read_buf(Pin::new(io), cx, read) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Fill::Closed,
            Poll::Ready(Ok(_)) => Fill::Read,
            Poll::Pending => Fill::Stop,
        }
    }

    /// Writes what is buffered to `io`.
    pub(super) fn flush<I: AsyncWrite + Unpin>(
        &mut self,
        io: &mut I,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.write.is_empty() {
            return Poll::Ready(Ok(()));
        }
        while !self.write.is_empty() {
            match Pin::new(&mut *io).poll_write(cx, &self.write) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => self.write.advance(n),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
        // All of it went out: the buffer starts over at its beginning.
        self.write.clear();
        Pin::new(io).poll_flush(cx)
    }
}

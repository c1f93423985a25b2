//! An HTTP/3 client connection that reads the server's GOAWAY frames as
//! they arrive on its control stream (the h3 client keeps the stream ID
//! a GOAWAY names to itself): what a strict client would act on, so a
//! test can check that no stream at or past that ID is answered (RFC 9114
//! §5.2: those were not processed and may be sent again elsewhere).

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};

/// The smallest stream ID any GOAWAY of one connection named.
#[derive(Clone, Default)]
pub struct GoawaySeen(Arc<Mutex<Option<u64>>>);

impl GoawaySeen {
    pub fn first_not_processed(&self) -> Option<u64> {
        *self.0.lock().unwrap()
    }

    fn saw(&self, id: u64) {
        let mut seen = self.0.lock().unwrap();
        *seen = Some(seen.map_or(id, |s| s.min(id)));
    }
}

/// `h3_quinn::Connection` with the server's control stream read twice:
/// by h3, and by a parser of its frames.
pub struct Watched {
    inner: h3_quinn::Connection,
    seen: GoawaySeen,
}

impl Watched {
    pub fn new(connection: quinn::Connection) -> (Self, GoawaySeen) {
        let seen = GoawaySeen::default();
        (
            Self {
                inner: h3_quinn::Connection::new(connection),
                seen: seen.clone(),
            },
            seen,
        )
    }
}

impl quic::Connection<Bytes> for Watched {
    type RecvStream = WatchedRecv;
    type OpenStreams = h3_quinn::OpenStreams;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::RecvStream, ConnectionErrorIncoming>> {
        <h3_quinn::Connection as quic::Connection<Bytes>>::poll_accept_recv(&mut self.inner, cx)
            .map_ok(|inner| WatchedRecv {
                inner,
                seen: self.seen.clone(),
                bytes: Some(Vec::new()),
            })
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        <h3_quinn::Connection as quic::Connection<Bytes>>::poll_accept_bidi(&mut self.inner, cx)
    }

    fn opener(&self) -> Self::OpenStreams {
        <h3_quinn::Connection as quic::Connection<Bytes>>::opener(&self.inner)
    }
}

impl quic::OpenStreams<Bytes> for Watched {
    type BidiStream = h3_quinn::BidiStream<Bytes>;
    type SendStream = h3_quinn::SendStream<Bytes>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        quic::OpenStreams::<Bytes>::poll_open_bidi(&mut self.inner, cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<Bytes>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<Bytes>::close(&mut self.inner, code, reason)
    }
}

/// A unidirectional stream from the server, its bytes also kept while it
/// may be the control stream (type 0x00).
pub struct WatchedRecv {
    inner: h3_quinn::RecvStream,
    seen: GoawaySeen,
    /// What is not parsed yet; `None` once the stream is known to be of
    /// another type.
    bytes: Option<Vec<u8>>,
}

impl quic::RecvStream for WatchedRecv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let polled = self.inner.poll_data(cx);
        if let (Poll::Ready(Ok(Some(chunk))), Some(bytes)) = (&polled, &mut self.bytes) {
            bytes.extend_from_slice(chunk.chunk());
            match goaways(bytes) {
                Some(ids) => ids.into_iter().for_each(|id| self.seen.saw(id)),
                None => self.bytes = None,
            }
        }
        polled
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

/// A QUIC variable-length integer at the start of `bytes`, and its length.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let first = *bytes.first()?;
    let len = 1usize << (first >> 6);
    let body = bytes.get(..len)?;
    let mut value = u64::from(first & 0x3f);
    for byte in &body[1..] {
        value = (value << 8) | u64::from(*byte);
    }
    Some((value, len))
}

/// The GOAWAY IDs in the control stream `bytes` (stream type, then
/// frames), consuming whole frames; `None` for a stream of another type.
fn goaways(bytes: &mut Vec<u8>) -> Option<Vec<u64>> {
    const CONTROL: u64 = 0x00;
    const GOAWAY: u64 = 0x07;
    let mut found = Vec::new();
    // The stream type is kept at the front; frames after it are consumed.
    let Some((kind, type_len)) = varint(bytes) else {
        return Some(found);
    };
    if kind != CONTROL {
        return None;
    }
    let mut at = type_len;
    while let Some((frame, frame_len)) = varint(&bytes[at..]) {
        let Some((len, len_len)) = varint(&bytes[at + frame_len..]) else {
            break;
        };
        let start = at + frame_len + len_len;
        let Some(payload) = usize::try_from(len)
            .ok()
            .and_then(|len| bytes.get(start..start + len))
        else {
            break;
        };
        if frame == GOAWAY {
            if let Some((id, _)) = varint(payload) {
                found.push(id);
            }
        }
        at = start + payload.len();
    }
    bytes.drain(type_len..at);
    Some(found)
}

#[test]
fn goaway_frames_are_read_across_chunks() {
    // Control stream: type 0, SETTINGS (4) with one setting, GOAWAY (7)
    // naming stream 8, GOAWAY naming stream 4 (two-byte varint 0x4004).
    let stream = [
        0x00, 0x04, 0x02, 0x06, 0x10, 0x07, 0x01, 0x08, 0x07, 0x02, 0x40, 0x04,
    ];
    for split in 0..stream.len() {
        let mut bytes = stream[..split].to_vec();
        let mut ids = goaways(&mut bytes).unwrap();
        bytes.extend_from_slice(&stream[split..]);
        ids.extend(goaways(&mut bytes).unwrap());
        assert_eq!(ids, [8, 4], "split at {split}");
    }
    let mut other = vec![0x02, 0x07, 0x01, 0x08];
    assert_eq!(goaways(&mut other), None, "not a control stream");
}

//! HTTP/2 frames (RFC 9113 §4, §6): their header, their types and flags,
//! and the few the server writes.

use bytes::{BufMut, Bytes, BytesMut};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE's initial value; the server never raises its
/// own.
pub const DEFAULT_MAX_FRAME: usize = 16_384;
pub const MAX_WINDOW: u32 = (1 << 31) - 1;
pub const MAX_STREAM_ID: u32 = (1 << 31) - 1;

pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_ACK: u8 = 0x1;
pub const FLAG_END_HEADERS: u8 = 0x4;
pub const FLAG_PADDED: u8 = 0x8;
pub const FLAG_PRIORITY: u8 = 0x20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Data = 0,
    Headers = 1,
    Priority = 2,
    RstStream = 3,
    Settings = 4,
    PushPromise = 5,
    Ping = 6,
    GoAway = 7,
    WindowUpdate = 8,
    Continuation = 9,
}

impl Kind {
    pub fn of(byte: u8) -> Option<Kind> {
        Some(match byte {
            0 => Kind::Data,
            1 => Kind::Headers,
            2 => Kind::Priority,
            3 => Kind::RstStream,
            4 => Kind::Settings,
            5 => Kind::PushPromise,
            6 => Kind::Ping,
            7 => Kind::GoAway,
            8 => Kind::WindowUpdate,
            9 => Kind::Continuation,
            _ => return None,
        })
    }
}

/// An error code (§7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub u32);

impl Reason {
    pub const NO_ERROR: Reason = Reason(0x0);
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    pub const CANCEL: Reason = Reason(0x8);
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            0x0 => "NO_ERROR",
            0x1 => "PROTOCOL_ERROR",
            0x2 => "INTERNAL_ERROR",
            0x3 => "FLOW_CONTROL_ERROR",
            0x4 => "SETTINGS_TIMEOUT",
            0x5 => "STREAM_CLOSED",
            0x6 => "FRAME_SIZE_ERROR",
            0x7 => "REFUSED_STREAM",
            0x8 => "CANCEL",
            0x9 => "COMPRESSION_ERROR",
            0xa => "CONNECT_ERROR",
            0xb => "ENHANCE_YOUR_CALM",
            0xc => "INADEQUATE_SECURITY",
            0xd => "HTTP_1_1_REQUIRED",
            code => return write!(f, "error code {code:#x}"),
        };
        f.write_str(name)
    }
}

/// A frame's 9-byte header.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Header {
    /// The header at the start of `bytes`, if all 9 bytes are there.
    pub fn parse(bytes: &[u8]) -> Option<Header> {
        let b: &[u8; 9] = bytes.get(..9)?.try_into().ok()?;
        Some(Header {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & MAX_STREAM_ID,
        })
    }
}

/// The next whole frame at the start of `read`, split off (no copy: a
/// DATA payload goes on to its body as it is); `None` until all of it
/// arrived.
#[inline(always)]
pub fn next(read: &mut BytesMut) -> Result<Option<(Header, Bytes)>, Reason> {
    let Some(header) = Header::parse(read) else {
        return Ok(None);
    };
    // We never raise our SETTINGS_MAX_FRAME_SIZE.
    if header.len > DEFAULT_MAX_FRAME {
        return Err(Reason::FRAME_SIZE_ERROR);
    }
    if read.len() < 9 + header.len {
        return Ok(None);
    }
    let payload = read.split_to(9 + header.len).freeze().slice(9..);
    Ok(Some((header, payload)))
}

/// The order every frame keeps: the peer's first is its SETTINGS (§3.4),
/// and nothing comes between a header block's frames (§6.10; `open` is
/// the stream of a block still open).
#[inline]
pub fn in_order(
    header: &Header,
    settings_seen: &mut bool,
    open: Option<u32>,
) -> Result<(), Reason> {
    if !*settings_seen {
        if header.kind != Kind::Settings as u8 || header.flags & FLAG_ACK != 0 {
            return Err(Reason::PROTOCOL_ERROR);
        }
        *settings_seen = true;
    }
    match open {
        Some(open) if header.kind != Kind::Continuation as u8 || header.stream != open => {
            Err(Reason::PROTOCOL_ERROR)
        }
        _ => Ok(()),
    }
}

pub fn head(out: &mut BytesMut, len: usize, kind: Kind, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    let id = stream.to_be_bytes();
    out.put_slice(&[
        len[1], len[2], len[3], kind as u8, flags, id[0], id[1], id[2], id[3],
    ]);
}

pub fn goaway(out: &mut BytesMut, last_stream: u32, reason: Reason) {
    head(out, 8, Kind::GoAway, 0, 0);
    out.put_u32(last_stream);
    out.put_u32(reason.0);
}

pub fn ping(out: &mut BytesMut, flags: u8, opaque: [u8; 8]) {
    head(out, 8, Kind::Ping, flags, 0);
    out.put_slice(&opaque);
}

pub fn window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    head(out, 4, Kind::WindowUpdate, 0, stream);
    out.put_u32(increment);
}

/// A padded frame's content without its padding (§6.1).
pub fn unpad(flags: u8, mut payload: Bytes) -> Result<Bytes, Reason> {
    if flags & FLAG_PADDED == 0 {
        return Ok(payload);
    }
    let Some(&pad) = payload.first() else {
        return Err(Reason::PROTOCOL_ERROR);
    };
    let pad = usize::from(pad);
    if pad + 1 > payload.len() {
        return Err(Reason::PROTOCOL_ERROR);
    }
    let end = payload.len() - pad;
    payload.truncate(end);
    Ok(payload.slice(1..))
}

/// The stream a HEADERS frame's priority fields (§6.2) name as its
/// parent, when it carries them.
pub fn header_dependency(flags: u8, payload: &[u8]) -> Option<u32> {
    if flags & FLAG_PRIORITY == 0 {
        return None;
    }
    let at = usize::from(flags & FLAG_PADDED != 0);
    payload.get(at..)?.first_chunk().map(parent)
}

/// What a PRIORITY frame on `stream` is a stream error of, if anything:
/// a length other than 5 (FRAME_SIZE_ERROR, §6.3), or the stream named
/// as its own parent (PROTOCOL_ERROR, §5.3.1). Neither side schedules
/// by priorities; the frame is read for its errors only.
pub fn priority_error(stream: u32, payload: &[u8]) -> Option<Reason> {
    match payload.first_chunk() {
        Some(fields) if payload.len() == 5 => {
            (parent(fields) == stream).then_some(Reason::PROTOCOL_ERROR)
        }
        _ => Some(Reason::FRAME_SIZE_ERROR),
    }
}

/// The parent stream of priority fields: 31 bits after the exclusive flag.
fn parent(fields: &[u8; 4]) -> u32 {
    u32::from_be_bytes(*fields) & 0x7fff_ffff
}

/// A HEADERS payload's field block fragment: without padding and the
/// priority fields (§6.2).
pub fn header_block(flags: u8, payload: &[u8]) -> Result<&[u8], Reason> {
    let mut rest = payload;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        let (&p, tail) = rest.split_first().ok_or(Reason::PROTOCOL_ERROR)?;
        pad = usize::from(p);
        rest = tail;
    }
    if flags & FLAG_PRIORITY != 0 {
        rest = rest.get(5..).ok_or(Reason::PROTOCOL_ERROR)?;
    }
    if pad > rest.len() {
        return Err(Reason::PROTOCOL_ERROR);
    }
    Ok(&rest[..rest.len() - pad])
}

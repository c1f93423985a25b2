//! A second, minimal reading of every HTTP/1 request head, for what
//! hyper's parser accepts or hides: bare LF line ends (httparse takes
//! them) and a `Content-Length` beside a `Transfer-Encoding` (hyper drops
//! the length and decodes chunked). Both are how one parser is made to
//! frame a request differently from the next (RFC 9112 §2.2, §6.3), so
//! DESIGN §10 refuses them with 400. It also measures every head against
//! the listener's `max_header_bytes` (431): where hyper may speak either
//! version its only limit is the read buffer's, reached when it fills
//! with the head incomplete, so a head up to one read larger would pass.
//!
//! [`HeadCheck`] wraps the client stream hyper reads (above TLS) and
//! follows the message framing as the bytes go by: head lines up to the
//! empty line, then the body by its length or its chunks, then the next
//! head. A violation is recorded against the head's index in the
//! connection's `Activity`; the request path asks before routing. The
//! scan stops for good on a protocol switch (`Upgrade`, `CONNECT`), on
//! the HTTP/2 preface, and on a head it cannot follow: hyper refuses
//! those itself, or they are no longer HTTP/1.

use std::sync::Arc;

use super::activity::{Activity, BARE_LF, HEAD_TOO_LARGE, LENGTH_AND_CHUNKED};
use super::observed::{Observed, Observer};

/// The longest line prefix kept: enough for `transfer-encoding:` and a
/// Content-Length value.
const KEPT: usize = 64;

#[derive(Debug)]
enum State {
    Head(HeadScan),
    /// Body bytes left of a `Content-Length` body.
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data: bytes left to skip.
    ChunkEnd(u8),
    Trailers,
    /// No longer following: an upgrade, HTTP/2, or a head hyper refuses.
    Off,
}

#[derive(Debug, Default)]
struct HeadScan {
    /// Lines of this head so far (the request line is line 0).
    lines: usize,
    content_length: Option<u64>,
    length_invalid: bool,
    transfer_encoding: bool,
    switches: bool,
    bare_lf: bool,
}

impl HeadScan {
    /// A line of the head other than its end: the request line (an
    /// HTTP/2 preface, a CONNECT) or a header (only three names matter).
    /// Returns whether it is the HTTP/2 preface.
    #[inline]
    fn saw(&mut self, line: &[u8], content: &[u8], complete: bool) -> bool {
        let mut http2 = false;
        if self.lines == 0 {
            if line.starts_with(b"PRI ") {
                http2 = true;
                self.switches = true;
            } else if line.starts_with(b"CONNECT ") {
                self.switches = true;
            }
        } else {
            // A look at the first byte passes over every other header.
            match line.first().map(|b| b | 0x20) {
                Some(b'c') => match header_value(content, b"content-length") {
                    Some(value) if complete => {
                        match std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                            Some(n) if self.content_length.is_none_or(|m| m == n) => {
                                self.content_length = Some(n)
                            }
                            _ => self.length_invalid = true,
                        }
                    }
                    Some(_) => self.length_invalid = true,
                    None => {}
                },
                Some(b't') if header_value(line, b"transfer-encoding").is_some() => {
                    self.transfer_encoding = true;
                }
                Some(b'u') if header_value(line, b"upgrade").is_some() => {
                    self.switches = true;
                }
                _ => {}
            }
        }
        self.lines += 1;
        http2
    }
}

/// The start of a line that spans reads.
#[derive(Debug)]
struct Line {
    kept: [u8; KEPT],
    /// Bytes of the line so far (more than `KEPT` were seen, not kept).
    len: usize,
    last_cr: bool,
}

impl Default for Line {
    fn default() -> Self {
        Self {
            kept: [0; KEPT],
            len: 0,
            last_cr: false,
        }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        if let Some(&last) = bytes.last() {
            self.last_cr = last == b'\r';
        }
        let room = KEPT.saturating_sub(self.len);
        let keep = bytes.len().min(room);
        if let (Some(dst), Some(src)) = (
            self.kept.get_mut(self.len..self.len + keep),
            bytes.get(..keep),
        ) {
            dst.copy_from_slice(src);
        }
        self.len = self.len.saturating_add(bytes.len());
    }
}

fn header_value<'l>(line: &'l [u8], name: &[u8]) -> Option<&'l [u8]> {
    let prefix = line.get(..name.len())?;
    if !prefix.eq_ignore_ascii_case(name) || line.get(name.len()) != Some(&b':') {
        return None;
    }
    Some(line.get(name.len() + 1..)?.trim_ascii())
}

/// Follows HTTP/1 framing over the bytes a client sends.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    line: Line,
    /// Index of the head being read (0 for the connection's first).
    head: u64,
    /// Bytes of the head being read so far, empty lines before its
    /// request line included (as hyper counts them).
    head_bytes: usize,
    /// The largest head allowed (`max_header_bytes`).
    max_head: usize,
    /// The HTTP/2 connection preface was seen.
    http2: bool,
}

impl Scanner {
    pub fn new(max_head: usize) -> Self {
        Self {
            state: State::Head(HeadScan::default()),
            line: Line::default(),
            head: 0,
            head_bytes: 0,
            max_head,
            http2: false,
        }
    }

    /// Follows `data`; calls `flag(head, reason)` for every head that
    /// breaks a rule.
    pub fn scan(&mut self, mut data: &[u8], flag: &mut impl FnMut(u64, &'static str)) {
        while !data.is_empty() {
            let taken = match &mut self.state {
                State::Off => return,
                State::Body(left) => {
                    let n = data.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= n as u64;
                    if *left == 0 {
                        self.next_head();
                    }
                    n
                }
                State::ChunkData(left) => {
                    let n = data.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= n as u64;
                    if *left == 0 {
                        self.state = State::ChunkEnd(2);
                    }
                    n
                }
                State::ChunkEnd(left) => {
                    let n = data.len().min(usize::from(*left));
                    *left -= n as u8;
                    if *left == 0 {
                        self.state = State::ChunkSize;
                    }
                    n
                }
                State::Head(_) | State::ChunkSize | State::Trailers => {
                    let end = memchr::memchr(b'\n', data);
                    if matches!(self.state, State::Head(_)) {
                        let line = end.map_or(data.len(), |at| at + 1);
                        self.head_bytes = self.head_bytes.saturating_add(line);
                        if self.head_bytes > self.max_head {
                            // Answered 431 and closed: nothing after it
                            // is read as a request.
                            flag(self.head, HEAD_TOO_LARGE);
                            self.state = State::Off;
                            return;
                        }
                    }
                    match end {
                        // Most lines arrive whole: looked at where they are.
                        Some(at) if self.line.len == 0 => {
                            let line = data.get(..at).unwrap_or(&[]);
                            let crlf = line.last() == Some(&b'\r');
                            self.line_ended(line, true, crlf, flag);
                            at + 1
                        }
                        Some(at) => {
                            self.line.push(data.get(..at).unwrap_or(&[]));
                            let Line { kept, len, last_cr } = std::mem::take(&mut self.line);
                            let line = kept.get(..len.min(KEPT)).unwrap_or(&[]);
                            self.line_ended(line, len <= KEPT, last_cr, flag);
                            at + 1
                        }
                        None => {
                            self.line.push(data);
                            data.len()
                        }
                    }
                }
            };
            data = data.get(taken..).unwrap_or(&[]);
        }
    }

    fn next_head(&mut self) {
        self.head += 1;
        self.head_bytes = 0;
        self.state = State::Head(HeadScan::default());
    }

    /// A line ended: `line` is all of it (`complete`) or its first
    /// `KEPT` bytes, without the LF; `crlf` says whether a CR preceded it.
    fn line_ended(
        &mut self,
        line: &[u8],
        complete: bool,
        crlf: bool,
        flag: &mut impl FnMut(u64, &'static str),
    ) {
        let content = match line.strip_suffix(b"\r") {
            Some(content) if crlf && complete => content,
            _ => line,
        };
        let empty = complete && content.is_empty();
        match &mut self.state {
            State::Head(scan) => {
                if empty && scan.lines == 0 {
                    // Empty lines before a request line are allowed.
                    return;
                }
                if !crlf {
                    scan.bare_lf = true;
                }
                if !empty {
                    if scan.saw(line, content, complete) {
                        self.http2 = true;
                    }
                    return;
                }
                // The head is complete.
                let head = self.head;
                if scan.bare_lf {
                    flag(head, BARE_LF);
                }
                if scan.transfer_encoding && (scan.content_length.is_some() || scan.length_invalid)
                {
                    flag(head, LENGTH_AND_CHUNKED);
                }
                self.state = if scan.switches || scan.length_invalid {
                    State::Off
                } else if scan.transfer_encoding {
                    State::ChunkSize
                } else {
                    match scan.content_length {
                        Some(n) if n > 0 => State::Body(n),
                        _ => {
                            self.next_head();
                            return;
                        }
                    }
                };
            }
            State::ChunkSize => {
                let size = Some(content).filter(|_| complete).and_then(|line| {
                    let digits = line
                        .split(|&b| b == b';' || b == b' ' || b == b'\t')
                        .next()?;
                    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
                });
                self.state = match size {
                    Some(0) => State::Trailers,
                    Some(n) => State::ChunkData(n),
                    // hyper refuses it and closes the connection.
                    None => State::Off,
                };
            }
            State::Trailers => {
                if empty {
                    self.next_head();
                }
            }
            State::Body(_) | State::ChunkData(_) | State::ChunkEnd(_) | State::Off => {}
        }
    }
}

/// Checks the HTTP/1 heads of a client stream as hyper reads them.
pub struct HeadCheck {
    scanner: Scanner,
    activity: Arc<Activity>,
}

impl HeadCheck {
    /// Checks the heads read from `io`, none larger than `max_head`
    /// bytes; `http1` false (ALPN chose h2) passes everything through
    /// unread.
    pub fn wrap<I>(
        io: I,
        activity: Arc<Activity>,
        http1: bool,
        max_head: usize,
    ) -> Observed<I, Self> {
        let mut scanner = Scanner::new(max_head);
        if !http1 {
            scanner.state = State::Off;
            activity.mark_http2();
        }
        Observed::new(io, Self { scanner, activity })
    }
}

impl Observer for HeadCheck {
    fn read(&mut self, data: &[u8]) {
        let activity = &self.activity;
        self.scanner
            .scan(data, &mut |head, reason| activity.refuse_head(head, reason));
        if self.scanner.http2 {
            activity.mark_http2();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scans `data` in pieces of `step` bytes; returns the flags raised.
    fn flags(data: &[u8], step: usize) -> Vec<(u64, &'static str)> {
        flags_within(data, step, usize::MAX)
    }

    fn flags_within(data: &[u8], step: usize, max_head: usize) -> Vec<(u64, &'static str)> {
        let mut scanner = Scanner::new(max_head);
        let mut raised = Vec::new();
        for piece in data.chunks(step) {
            scanner.scan(piece, &mut |head, reason| raised.push((head, reason)));
        }
        raised
    }

    #[test]
    fn clean_pipelined_requests_raise_nothing_at_any_split() {
        let data = b"\r\nPOST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhe\nlo\
            POST /b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            3;ext=1\r\na\nb\r\n0\r\nX-T: 1\r\n\r\n\
            GET /c HTTP/1.1\r\nHost: a\r\n\r\n";
        for step in [1, 2, 3, 7, data.len()] {
            assert!(flags(data, step).is_empty(), "step {step}");
        }
    }

    #[test]
    fn bare_lf_and_length_beside_chunked_are_flagged_on_their_head() {
        let data = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n\
            POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n\
            GET /c HTTP/1.1\nHost: a\r\n\r\n";
        for step in [1, 5, data.len()] {
            assert_eq!(
                flags(data, step),
                vec![(1, LENGTH_AND_CHUNKED), (2, BARE_LF)],
                "step {step}"
            );
        }
        // Either order of the two headers.
        let data = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\ncontent-length: 3\r\n\r\n";
        assert_eq!(flags(data, 4), vec![(0, LENGTH_AND_CHUNKED)]);
    }

    #[test]
    fn long_lines_are_followed_and_still_checked() {
        let long = "a".repeat(300);
        let data = format!(
            "GET /{long} HTTP/1.1\r\nCookie: {long}\r\nContent-Length: 2\r\n\r\nok\
             POST /{long} HTTP/1.1\r\nX-Long: {long}\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n"
        );
        for step in [1, 10, 70, data.len()] {
            assert_eq!(
                flags(data.as_bytes(), step),
                vec![(1, LENGTH_AND_CHUNKED)],
                "step {step}"
            );
        }
    }

    #[test]
    fn heads_are_measured_against_the_limit_at_any_split() {
        // 16 + 9 + 2 = 27 bytes.
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert_eq!(head.len(), 27);
        let data = [&head[..], b"\r\n", &head[..]].concat();
        for step in [1, 4, data.len()] {
            // Exactly at the limit passes; the empty line before the
            // second request line counts, as hyper counts it.
            assert!(flags_within(head, step, 27).is_empty(), "step {step}");
            assert_eq!(flags_within(&data, step, 28), vec![(1, HEAD_TOO_LARGE)]);
            assert_eq!(flags_within(head, step, 26), vec![(0, HEAD_TOO_LARGE)]);
        }
        // A body does not count against the head, and each head starts
        // from nothing.
        let data = b"POST / HTTP/1.1\r\nContent-Length: 40\r\n\r\n\
            0123456789012345678901234567890123456789\
            GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(flags_within(data, 3, 40).is_empty());
        // One long line, never ended, is refused once it passes the limit:
        // then the scan stops.
        let long = [&b"GET /"[..], &[b'a'; 100]].concat();
        assert_eq!(flags_within(&long, 7, 64), vec![(0, HEAD_TOO_LARGE)]);
    }

    #[test]
    fn upgrades_and_http2_stop_the_scan() {
        let data = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n\n\n\x00binary\n";
        assert!(flags(data, 3).is_empty());
        let data = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\n\n";
        assert!(flags(data, 3).is_empty());
    }
}

//! HPACK (RFC 7541): the decoder of request header blocks, with its
//! dynamic table and Huffman-coded strings, and the encoder of answers.
//!
//! The encoder indexes nothing and codes no string: each field is a
//! literal without indexing, its name from the static table where there
//! is one. A few more bytes an answer than an indexing encoder, fewer
//! instructions, and no table to keep in step with the client.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use std::collections::VecDeque;

/// Code lengths of the 257 symbols of RFC 7541 Appendix B. The code is
/// canonical (codes of one length are consecutive, in symbol order), so
/// the lengths determine the codes; the tests check them against the
/// table's hex column and appendix C's examples.
#[rustfmt::skip]
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
];

/// Bits looked up at once: every code of up to this length (the 5- to
/// 8-bit codes of lower-case letters, digits and URL punctuation, and
/// most upper-case letters) decodes in one step.
const FAST_BITS: u32 = 9;

/// Canonical decoding tables: for each length, the first code, how many
/// codes have it, and where its symbols start in `symbols`; and a table
/// of the codes of up to `FAST_BITS` bits by their first `FAST_BITS` bits.
struct Huffman {
    first: [u32; 31],
    count: [u16; 31],
    offset: [u16; 31],
    symbols: [u16; 257],
    /// The symbol and code length of each `FAST_BITS`-bit prefix; length
    /// 0 where the code is longer.
    fast: [(u8, u8); 1 << FAST_BITS],
}

impl Huffman {
    const fn new() -> Huffman {
        let mut count = [0u16; 31];
        let mut i = 0;
        while i < 257 {
            count[LENGTHS[i] as usize] += 1;
            i += 1;
        }
        let mut first = [0u32; 31];
        let mut offset = [0u16; 31];
        let mut code = 0u32;
        let mut at = 0u16;
        let mut len = 1;
        while len <= 30 {
            first[len] = code;
            offset[len] = at;
            code = (code + count[len] as u32) << 1;
            at += count[len];
            len += 1;
        }
        let mut symbols = [0u16; 257];
        let mut next = offset;
        let mut s = 0;
        while s < 257 {
            let l = LENGTHS[s] as usize;
            symbols[next[l] as usize] = s as u16;
            next[l] += 1;
            s += 1;
        }
        let mut fast = [(0u8, 0u8); 1 << FAST_BITS];
        let mut len = 1;
        while len <= FAST_BITS as usize {
            let mut i = 0;
            while i < count[len] as usize {
                let code = first[len] as usize + i;
                let shift = FAST_BITS as usize - len;
                let mut at = code << shift;
                while at < (code + 1) << shift {
                    // Codes this short are all of byte symbols, never EOS.
                    fast[at] = (symbols[offset[len] as usize + i] as u8, len as u8);
                    at += 1;
                }
                i += 1;
            }
            len += 1;
        }
        Huffman {
            first,
            count,
            offset,
            symbols,
            fast,
        }
    }

    fn decode(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        let mut acc: u64 = 0;
        let mut bits: u32 = 0;
        let mut input = input.iter();
        loop {
            while bits <= 56 {
                match input.next() {
                    Some(&b) => {
                        acc |= u64::from(b) << (56 - bits);
                        bits += 8;
                    }
                    None => break,
                }
            }
            if bits == 0 {
                return Ok(());
            }
            // Zeros past `bits`: an entry counts only if its code ends
            // within them.
            let (fast, fast_len) = self.fast[(acc >> (64 - FAST_BITS)) as usize];
            if fast_len != 0 && u32::from(fast_len) <= bits {
                out.push(fast);
                acc <<= fast_len;
                bits -= u32::from(fast_len);
                continue;
            }
            // Longer codes, and the padding at the end: the canonical
            // search, from the shortest code (5 bits) or past the table.
            let mut len = if fast_len == 0 && bits > FAST_BITS {
                FAST_BITS + 1
            } else {
                5
            };
            let symbol = loop {
                if len > bits {
                    // Padding: fewer than 8 bits, all ones.
                    let pad = (acc >> (64 - bits)) as u32;
                    if bits < 8 && pad == (1 << bits) - 1 {
                        return Ok(());
                    }
                    return Err(Error::Huffman);
                }
                let code = (acc >> (64 - len)) as u32;
                let l = len as usize;
                let first = self.first[l];
                if code >= first && code - first < u32::from(self.count[l]) {
                    break self.symbols[usize::from(self.offset[l]) + (code - first) as usize];
                }
                len += 1;
                if len > 30 {
                    return Err(Error::Huffman);
                }
            };
            if symbol == 256 {
                return Err(Error::Huffman);
            }
            out.push(symbol as u8);
            acc <<= len;
            bits -= len;
        }
    }
}

static HUFFMAN: Huffman = Huffman::new();

/// Why a header block could not be decoded: all are connection errors
/// (COMPRESSION_ERROR), the decoder's table being no longer in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    Integer,
    Truncated,
    Huffman,
    Index,
    TableSize,
}

/// A decoded field: a pseudo-header or a regular one. A regular field
/// whose name or value HTTP does not allow is kept as `Invalid`, so that
/// the block still decodes (and the table stays in step) while the
/// request is refused (RFC 9113 §8.2.1: malformed).
#[derive(Clone, Debug)]
pub enum Field {
    Method(Bytes),
    Scheme(Bytes),
    Authority(Bytes),
    Path(Bytes),
    Protocol(Bytes),
    Status(Bytes),
    Header(HeaderName, HeaderValue),
    /// The lengths of its name and value: its size in the table.
    Invalid(usize, usize),
}

impl Field {
    /// RFC 7541 §4.1: name and value lengths plus 32.
    fn size(&self) -> usize {
        let (name, value) = match self {
            Field::Method(v) | Field::Scheme(v) | Field::Status(v) => (7, v.len()),
            Field::Authority(v) => (10, v.len()),
            Field::Path(v) => (5, v.len()),
            Field::Protocol(v) => (9, v.len()),
            Field::Header(n, v) => (n.as_str().len(), v.len()),
            Field::Invalid(name, value) => (*name, *value),
        };
        name + value + 32
    }

    fn new(name: &[u8], value: Bytes) -> Field {
        match name {
            b":method" => Field::Method(value),
            b":scheme" => Field::Scheme(value),
            b":authority" => Field::Authority(value),
            b":path" => Field::Path(value),
            b":protocol" => Field::Protocol(value),
            b":status" => Field::Status(value),
            _ => {
                let lengths = (name.len(), value.len());
                // Names are lowercase on HTTP/2 (RFC 9113 §8.2.1).
                match (
                    HeaderName::from_lowercase(name),
                    HeaderValue::from_maybe_shared(value),
                ) {
                    (Ok(name), Ok(value)) => Field::Header(name, value),
                    _ => Field::Invalid(lengths.0, lengths.1),
                }
            }
        }
    }

    fn with_value(&self, value: Bytes) -> Field {
        match self {
            Field::Method(_) => Field::Method(value),
            Field::Scheme(_) => Field::Scheme(value),
            Field::Authority(_) => Field::Authority(value),
            Field::Path(_) => Field::Path(value),
            Field::Protocol(_) => Field::Protocol(value),
            Field::Status(_) => Field::Status(value),
            Field::Header(name, _) => {
                let lengths = (name.as_str().len(), value.len());
                match HeaderValue::from_maybe_shared(value) {
                    Ok(value) => Field::Header(name.clone(), value),
                    Err(_) => Field::Invalid(lengths.0, lengths.1),
                }
            }
            // An invalid name stays invalid with any value, and its length.
            Field::Invalid(name, _) => Field::Invalid(*name, value.len()),
        }
    }
}

/// The static table (RFC 7541 Appendix A).
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

thread_local! {
    /// The static table as fields, made once per thread: an indexed
    /// field is then a clone (reference counts, no parsing).
    static STATIC_FIELDS: Vec<Field> = STATIC
        .iter()
        .map(|(n, v)| Field::new(n.as_bytes(), Bytes::from_static(v.as_bytes())))
        .collect();
}

/// A connection's decoder: the dynamic table the client's encoder fills.
pub struct Decoder {
    table: VecDeque<Field>,
    size: usize,
    max: usize,
    /// The largest size our SETTINGS_HEADER_TABLE_SIZE allows.
    limit: usize,
    scratch: Vec<u8>,
    /// Huffman-coded strings decoded lately, by their coded bytes: peers
    /// code the same fields the same way request after request (nginx
    /// every answer field and trailer, nghttp2 and browsers the
    /// `:path`), and a lookup costs a fraction of decoding.
    recent: Vec<Recent>,
    /// The entry of `recent` the next new string replaces.
    replace: usize,
}

/// A coded string and what it decodes to.
struct Recent {
    /// Its length and first bytes, compared before the bytes themselves.
    key: u64,
    coded: Bytes,
    decoded: Bytes,
}

/// Strings `Decoder::recent` keeps (a search of them all is cheaper
/// than decoding one).
const RECENT: usize = 16;
/// Longest coded string `Decoder::recent` keeps.
const RECENT_LONGEST: usize = 96;

/// What a decoded block holds beyond its fields.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The list's size (RFC 9113 §6.5.2's measure) passed `max_list`:
    /// the block was decoded to its end, its fields dropped.
    pub oversized: bool,
}

impl Decoder {
    pub fn new(limit: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: limit,
            limit,
            scratch: Vec::new(),
            recent: Vec::new(),
            replace: 0,
        }
    }

    fn get(&self, index: usize) -> Result<Field, Error> {
        match index {
            0 => Err(Error::Index),
            1..=61 => Ok(STATIC_FIELDS.with(|s| s[index - 1].clone())),
            _ => self.table.get(index - 62).cloned().ok_or(Error::Index),
        }
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            match self.table.pop_back() {
                Some(old) => self.size -= old.size(),
                None => break,
            }
        }
    }

    fn insert(&mut self, field: Field) {
        let size = field.size();
        // An entry larger than the table empties it (§4.4).
        self.evict_to(self.max.saturating_sub(size));
        if size <= self.max {
            self.size += size;
            self.table.push_front(field);
        }
    }

    /// Decodes one whole header block into `out`. Past `max_list` the
    /// block is still decoded (the table must stay in step) but its
    /// fields are dropped.
    pub fn decode(
        &mut self,
        mut block: &[u8],
        max_list: usize,
        out: &mut Vec<Field>,
    ) -> Result<Decoded, Error> {
        let mut list = 0usize;
        let mut decoded = Decoded::default();
        let mut updates_allowed = true;
        while let Some(&first) = block.first() {
            let field = if first & 0x80 != 0 {
                let index = integer(&mut block, 7)?;
                self.get(index)?
            } else if first & 0xc0 == 0x40 {
                let field = self.literal(&mut block, 6)?;
                self.insert(field.clone());
                field
            } else if first & 0xe0 == 0x20 {
                // Size updates only at the start of a block (§4.2).
                if !updates_allowed {
                    return Err(Error::TableSize);
                }
                let size = integer(&mut block, 5)?;
                if size > self.limit {
                    return Err(Error::TableSize);
                }
                self.max = size;
                self.evict_to(size);
                continue;
            } else {
                // Without indexing (0000) or never indexed (0001).
                self.literal(&mut block, 4)?
            };
            updates_allowed = false;
            list += field.size();
            if list > max_list {
                decoded.oversized = true;
                out.clear();
            }
            if !decoded.oversized {
                out.push(field);
            }
        }
        Ok(decoded)
    }

    fn literal(&mut self, block: &mut &[u8], prefix: u8) -> Result<Field, Error> {
        let index = integer(block, prefix)?;
        if index == 0 {
            let name = self.string(block)?;
            let value = self.string(block)?;
            Ok(Field::new(&name, value))
        } else {
            let value = self.string(block)?;
            Ok(self.get(index)?.with_value(value))
        }
    }

    fn string(&mut self, block: &mut &[u8]) -> Result<Bytes, Error> {
        let huffman = block.first().ok_or(Error::Truncated)? & 0x80 != 0;
        let len = integer(block, 7)?;
        if len > block.len() {
            return Err(Error::Truncated);
        }
        let (raw, rest) = block.split_at(len);
        *block = rest;
        if huffman {
            self.huffman(raw)
        } else {
            Ok(Bytes::copy_from_slice(raw))
        }
    }
}

impl Decoder {
    /// A Huffman-coded string: from `recent` when these bytes were
    /// decoded lately, decoded (and kept) otherwise.
    fn huffman(&mut self, raw: &[u8]) -> Result<Bytes, Error> {
        let kept = (2..=RECENT_LONGEST).contains(&raw.len());
        let key = recent_key(raw);
        if kept {
            if let Some(recent) = self
                .recent
                .iter()
                .find(|r| r.key == key && r.coded[..] == *raw)
            {
                return Ok(recent.decoded.clone());
            }
        }
        self.scratch.clear();
        HUFFMAN.decode(raw, &mut self.scratch)?;
        let decoded = Bytes::copy_from_slice(&self.scratch);
        if kept {
            let recent = Recent {
                key,
                coded: Bytes::copy_from_slice(raw),
                decoded: decoded.clone(),
            };
            if self.recent.len() < RECENT {
                self.recent.push(recent);
            } else {
                self.recent[self.replace] = recent;
                self.replace = (self.replace + 1) % RECENT;
            }
        }
        Ok(decoded)
    }
}

/// A coded string's length and first (up to 7) bytes, as one word.
fn recent_key(raw: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    let n = raw.len().min(7);
    word[..n].copy_from_slice(&raw[..n]);
    word[7] = raw.len() as u8;
    u64::from_le_bytes(word)
}

/// An integer with an N-bit prefix (§5.1), at most 2^21 + prefix.
fn integer(block: &mut &[u8], prefix: u8) -> Result<usize, Error> {
    let mask = (1u8 << prefix) - 1;
    let (&first, mut rest) = block.split_first().ok_or(Error::Truncated)?;
    let mut value = usize::from(first & mask);
    if value == usize::from(mask) {
        let mut shift = 0;
        loop {
            let (&b, r) = rest.split_first().ok_or(Error::Truncated)?;
            rest = r;
            value += usize::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 21 {
                return Err(Error::Integer);
            }
        }
    }
    *block = rest;
    Ok(value)
}

// Always inlined: left to the inliner, its code changed with unrelated
// changes elsewhere (a response's eight calls took 156 instructions
// instead of 84 after one; callgrind).
#[inline(always)]
fn put_integer(out: &mut BytesMut, flags: u8, prefix: u8, value: usize) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.put_u8(flags | value as u8);
        return;
    }
    out.put_u8(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.put_u8((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.put_u8(rest as u8);
}

/// The static index of a regular field's name, for the encoder.
fn static_name(name: &HeaderName) -> Option<usize> {
    use http::header::*;
    Some(match *name {
        ACCEPT_RANGES => 18,
        ACCESS_CONTROL_ALLOW_ORIGIN => 20,
        AGE => 21,
        ALLOW => 22,
        CACHE_CONTROL => 24,
        CONTENT_DISPOSITION => 25,
        CONTENT_ENCODING => 26,
        CONTENT_LANGUAGE => 27,
        CONTENT_LENGTH => 28,
        CONTENT_LOCATION => 29,
        CONTENT_RANGE => 30,
        CONTENT_TYPE => 31,
        DATE => 33,
        ETAG => 34,
        EXPIRES => 36,
        LAST_MODIFIED => 44,
        LINK => 45,
        LOCATION => 46,
        PROXY_AUTHENTICATE => 48,
        REFRESH => 52,
        RETRY_AFTER => 53,
        SERVER => 54,
        SET_COOKIE => 55,
        STRICT_TRANSPORT_SECURITY => 56,
        VARY => 59,
        VIA => 60,
        WWW_AUTHENTICATE => 61,
        _ => return None,
    })
}

/// Encodes `:status` (none for trailers).
pub fn encode_status(status: http::StatusCode, out: &mut BytesMut) {
    match status.as_u16() {
        200 => out.put_u8(0x88),
        204 => out.put_u8(0x89),
        206 => out.put_u8(0x8a),
        304 => out.put_u8(0x8b),
        400 => out.put_u8(0x8c),
        404 => out.put_u8(0x8d),
        500 => out.put_u8(0x8e),
        _ => {
            // Literal without indexing, the name :status (index 8).
            out.put_u8(0x08);
            out.put_u8(3);
            out.put_slice(status.as_str().as_bytes());
        }
    }
}

/// Encodes a field of the static table's entry `index` (§6.1): a
/// request's `:method GET`, `:path /`, `:scheme http`.
pub fn encode_indexed(index: usize, out: &mut BytesMut) {
    put_integer(out, 0x80, 7, index);
}

/// Encodes a pseudo-field whose name is the static table's entry
/// `index`, as a literal without indexing.
pub fn encode_named(index: usize, value: &[u8], out: &mut BytesMut) {
    put_integer(out, 0x00, 4, index);
    put_integer(out, 0, 7, value.len());
    out.put_slice(value);
}

/// Encodes one regular field: a literal without indexing, or never
/// indexed when its value is marked sensitive (§6.2.3: no intermediary
/// may index it either).
pub fn encode_field(name: &HeaderName, value: &[u8], sensitive: bool, out: &mut BytesMut) {
    let flags = if sensitive { 0x10 } else { 0x00 };
    match static_name(name) {
        Some(index) => put_integer(out, flags, 4, index),
        None => {
            out.put_u8(flags);
            put_integer(out, 0, 7, name.as_str().len());
            out.put_slice(name.as_str().as_bytes());
        }
    }
    put_integer(out, 0, 7, value.len());
    out.put_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Huffman {
        /// The code of `symbol`: its rank among the codes of its length.
        fn code(&self, symbol: u16) -> (u32, u8) {
            let len = LENGTHS[symbol as usize];
            let l = len as usize;
            let rank = (self.offset[l]..self.offset[l] + self.count[l])
                .position(|i| self.symbols[i as usize] == symbol)
                .unwrap_or(0) as u32;
            (self.first[l] + rank, len)
        }
    }

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    #[test]
    fn the_huffman_code_is_the_rfcs() {
        // Appendix B's hex column, for codes of every length class.
        let known = [
            (0u16, 0x1ff8u32, 13u8),
            (1, 0x7fffd8, 23),
            (10, 0x3ffffffc, 30),
            (32, 0x14, 6),
            (48, 0x0, 5),
            (58, 0x5c, 7),
            (92, 0x7fff0, 19),
            (127, 0xffffffc, 28),
            (128, 0xfffe6, 20),
            (199, 0x1ffffec, 25),
            (203, 0x7ffffde, 27),
            (255, 0x3ffffee, 26),
            (256, 0x3fffffff, 30),
        ];
        for (symbol, code, len) in known {
            assert_eq!(HUFFMAN.code(symbol), (code, len), "symbol {symbol}");
        }
        // A complete prefix code: Kraft's sum is exactly 1.
        let kraft: u64 = LENGTHS.iter().map(|&l| 1u64 << (30 - l)).sum();
        assert_eq!(kraft, 1 << 30);
        // Every symbol's code decodes to it (padded with ones).
        for symbol in 0..256u16 {
            let (code, len) = HUFFMAN.code(symbol);
            let bits = u64::from(len);
            let padded = bits.div_ceil(8) * 8;
            let value = (u64::from(code) << (padded - bits)) | ((1 << (padded - bits)) - 1);
            let bytes: Vec<u8> = (0..padded / 8)
                .rev()
                .map(|i| (value >> (i * 8)) as u8)
                .collect();
            let mut out = Vec::new();
            HUFFMAN.decode(&bytes, &mut out).unwrap();
            assert_eq!(out, [symbol as u8], "symbol {symbol}");
        }
    }

    #[test]
    fn huffman_text_of_every_byte_decodes_at_every_bit_offset() {
        // Short and long codes one after another, so that codes of the
        // lookup table and of the canonical search start at every bit
        // position; each run shifted by one more leading symbol.
        for lead in 0..8u16 {
            let text: Vec<u8> = (0..lead)
                .map(|_| b'a')
                .chain((0..=255u8).rev())
                .chain(0..=255u8)
                .collect();
            let coded = huffman_coded(&text);
            let mut out = Vec::new();
            HUFFMAN.decode(&coded, &mut out).unwrap();
            assert_eq!(out, text, "lead {lead}");
        }
    }

    #[test]
    fn huffman_strings_of_appendix_c_decode() {
        for (coded, text) in [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            ("6402", "302"),
            ("aec3 771a 4b", "private"),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            ("9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3", "https://www.example.com"),
            ("9bd9 ab", "gzip"),
            (
                "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ] {
            let mut out = Vec::new();
            HUFFMAN.decode(&hex(coded), &mut out).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), text);
        }
    }

    #[test]
    fn bad_huffman_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // 'a' (00011) padded with zeros instead of ones.
        assert_eq!(
            HUFFMAN.decode(&[0b0001_1000], &mut out),
            Err(Error::Huffman)
        );
        // Eight bits of padding: a whole byte of ones.
        assert_eq!(
            HUFFMAN.decode(&[0b0001_1111, 0xff], &mut out),
            Err(Error::Huffman)
        );
        // EOS itself (30 ones), padded.
        assert_eq!(
            HUFFMAN.decode(&[0xff, 0xff, 0xff, 0xff], &mut out),
            Err(Error::Huffman)
        );
    }

    fn names(fields: &[Field]) -> Vec<String> {
        fields
            .iter()
            .map(|f| match f {
                Field::Method(v) => format!(":method {}", String::from_utf8_lossy(v)),
                Field::Scheme(v) => format!(":scheme {}", String::from_utf8_lossy(v)),
                Field::Authority(v) => format!(":authority {}", String::from_utf8_lossy(v)),
                Field::Path(v) => format!(":path {}", String::from_utf8_lossy(v)),
                Field::Protocol(v) => format!(":protocol {}", String::from_utf8_lossy(v)),
                Field::Status(v) => format!(":status {}", String::from_utf8_lossy(v)),
                Field::Header(n, v) => format!("{n} {}", v.to_str().unwrap()),
                Field::Invalid(..) => "invalid".to_owned(),
            })
            .collect()
    }

    /// `text` Huffman-coded (RFC 7541 §5.2), padded with ones.
    fn huffman_coded(text: &[u8]) -> Vec<u8> {
        let (mut acc, mut bits, mut coded) = (0u64, 0u32, Vec::new());
        for &b in text {
            let (code, len) = HUFFMAN.code(u16::from(b));
            acc = (acc << len) | u64::from(code);
            bits += u32::from(len);
            while bits >= 8 {
                coded.push((acc >> (bits - 8)) as u8);
                bits -= 8;
            }
        }
        if bits > 0 {
            coded.push(((acc << (8 - bits)) as u8) | ((1u8 << (8 - bits)) - 1));
        }
        coded
    }

    /// More strings than the decoder keeps, over and over: each decodes
    /// to itself whether kept, replaced or never kept (too long).
    #[test]
    fn many_recurring_huffman_strings_decode_to_themselves() {
        let mut decoder = Decoder::new(4096);
        let texts: Vec<Vec<u8>> = (0..3 * RECENT)
            .map(|n| format!("field-{n}-{}", "v".repeat(n * 5)).into_bytes())
            .collect();
        for round in 0..3 {
            for text in &texts {
                let decoded = decoder.huffman(&huffman_coded(text)).unwrap();
                assert_eq!(&decoded[..], &text[..], "round {round}");
            }
        }
        assert_eq!(decoder.recent.len(), RECENT);
    }

    /// Huffman strings decoded again come from the decoder's recent
    /// ones, and only for the same coded bytes.
    #[test]
    fn recent_huffman_strings_answer_only_for_their_own_bytes() {
        let mut decoder = Decoder::new(4096);
        // RFC 7541 C.4.1's "www.example.com", twice.
        let coded = hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff");
        for _ in 0..2 {
            assert_eq!(&decoder.huffman(&coded).unwrap()[..], b"www.example.com");
        }
        assert_eq!(decoder.recent.len(), 1);
        // The same length and first seven bytes (so the same key), a later
        // byte changed: decoded anew, never the kept one.
        let mut other = coded.clone();
        other[9] ^= 0x10;
        let decoded = decoder.huffman(&other).map(|b| b.to_vec());
        assert_ne!(decoded.as_deref(), Ok(&b"www.example.com"[..]));
        assert_eq!(decoded, {
            let mut out = Vec::new();
            HUFFMAN.decode(&other, &mut out).map(|()| out)
        });
        // "no-cache" and "custom-key" (C.4.2, C.4.3) beside it.
        for (text, plain) in [
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
        ] {
            for _ in 0..2 {
                assert_eq!(&decoder.huffman(&hex(text)).unwrap()[..], plain.as_bytes());
            }
        }
    }

    /// RFC 7541 C.3 (plain strings) and C.4 (Huffman): three requests on
    /// one connection, the table's size after each.
    #[test]
    fn the_request_examples_of_appendix_c_decode_in_sequence() {
        let requests = [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ];
        let huffman = [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ];
        let expected = [
            vec![
                ":method GET",
                ":scheme http",
                ":path /",
                ":authority www.example.com",
            ],
            vec![
                ":method GET",
                ":scheme http",
                ":path /",
                ":authority www.example.com",
                "cache-control no-cache",
            ],
            vec![
                ":method GET",
                ":scheme https",
                ":path /index.html",
                ":authority www.example.com",
                "custom-key custom-value",
            ],
        ];
        for blocks in [requests, huffman] {
            let mut decoder = Decoder::new(4096);
            for ((block, want), size) in blocks.iter().zip(&expected).zip([57, 110, 164]) {
                let mut out = Vec::new();
                decoder.decode(&hex(block), 1 << 16, &mut out).unwrap();
                assert_eq!(names(&out), *want);
                assert_eq!(decoder.size, size);
            }
        }
    }

    #[test]
    fn an_oversized_list_is_decoded_to_its_end_and_dropped() {
        let mut decoder = Decoder::new(4096);
        let mut out = Vec::new();
        let block = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
        let decoded = decoder.decode(&block, 60, &mut out).unwrap();
        assert!(decoded.oversized);
        assert!(out.is_empty());
        // The table took the literal all the same: the next block's
        // reference to it (index 62) resolves.
        let decoded = decoder.decode(&hex("be"), 1 << 16, &mut out).unwrap();
        assert!(!decoded.oversized);
        assert_eq!(names(&out), [":authority www.example.com"]);
    }

    #[test]
    fn malformed_blocks_are_errors_not_panics() {
        let mut decoder = Decoder::new(4096);
        let mut out = Vec::new();
        for bad in [
            "80",
            "ff",
            "bf",
            "41",
            "4105",
            "41 8561",
            "ffffffffff0f",
            "3fe21f",
            "82 20",
        ] {
            assert!(
                decoder.decode(&hex(bad), 1 << 16, &mut out).is_err(),
                "{bad}"
            );
        }
        // An uppercase name decodes, as a field the request will refuse.
        let block = hex("0003 4142 4301 78");
        decoder.decode(&block, 1 << 16, &mut out).unwrap();
        assert!(matches!(out.last(), Some(Field::Invalid(3, 1))));
        // Indexed with its (invalid) name, it keeps the name's length: the
        // table's size stays the client's (here 3 + 1 + 32, then 3 + 2 + 32).
        let mut decoder = Decoder::new(4096);
        out.clear();
        decoder
            .decode(&hex("4003 4142 4301 78"), 1 << 16, &mut out)
            .unwrap();
        assert_eq!(decoder.size, 36);
        decoder
            .decode(&hex("7e02 7879"), 1 << 16, &mut out)
            .unwrap();
        assert_eq!(decoder.size, 36 + 37);
        assert!(matches!(out.last(), Some(Field::Invalid(3, 2))));
    }

    #[test]
    fn answers_encode_to_what_the_decoder_reads() {
        let mut out = BytesMut::new();
        encode_status(http::StatusCode::OK, &mut out);
        encode_status(http::StatusCode::from_u16(431).unwrap(), &mut out);
        encode_field(&http::header::CONTENT_TYPE, b"text/plain", false, &mut out);
        let long = "v".repeat(300);
        encode_field(
            &HeaderName::from_static("x-long"),
            long.as_bytes(),
            false,
            &mut out,
        );
        encode_field(&http::header::SET_COOKIE, b"a=b", true, &mut out);
        let mut decoder = Decoder::new(4096);
        let mut fields = Vec::new();
        decoder.decode(&out, 1 << 16, &mut fields).unwrap();
        assert_eq!(
            names(&fields),
            [
                ":status 200".to_owned(),
                ":status 431".to_owned(),
                "content-type text/plain".to_owned(),
                format!("x-long {long}"),
                "set-cookie a=b".to_owned(),
            ]
        );
        // Nothing was indexed.
        assert_eq!(decoder.size, 0);
    }
}

//! W3C Trace Context (`traceparent`, `tracestate`) at the edge.
//!
//! Every proxied request carries a `traceparent` to its backend: the
//! client's trace continues with the gateway's own span as the parent;
//! a request without one, or with one that does not parse, starts a new
//! trace (and its `tracestate`, which belongs to the trace it came with,
//! is dropped). The trace id goes into the access log.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use http::header::{Entry, HeaderMap, HeaderName, HeaderValue};

pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The trace a request belongs to and the gateway's span in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The gateway's span: the parent the backend sees.
    pub span_id: [u8; 8],
    /// The caller's span, when the trace came with the request.
    pub parent_id: Option<[u8; 8]>,
    /// `trace-flags` (bit 0: sampled), kept from the caller.
    pub flags: u8,
}

impl TraceContext {
    /// Takes the trace headers out of a request: continues a valid
    /// `traceparent` (and keeps its `tracestate` in place), otherwise
    /// starts a new trace and removes both.
    pub fn take(headers: &mut HeaderMap) -> Self {
        // One pass over the names; most requests carry neither field.
        let (mut parent, mut state) = (false, false);
        for name in headers.keys() {
            let name = name.as_str();
            if name.len() == 11 && name.starts_with("trace") {
                parent |= name == "traceparent";
            } else if name.len() == 10 && name.starts_with("trace") {
                state |= name == "tracestate";
            }
        }
        let continued = if parent {
            match headers.entry(&TRACEPARENT) {
                Entry::Occupied(entry) => {
                    let (_, mut values) = entry.remove_entry_mult();
                    let first = values.next();
                    // Two `traceparent` fields are no trace context at all.
                    let single = values.next().is_none();
                    first
                        .filter(|_| single)
                        .and_then(|v| Self::parse(v.as_bytes()))
                }
                Entry::Vacant(_) => None,
            }
        } else {
            None
        };
        match continued {
            Some(context) => context,
            None => {
                if state {
                    headers.remove(&TRACESTATE);
                }
                Self::start(sample_new_trace())
            }
        }
    }

    /// A new trace, sampled or not.
    pub fn start(sampled: bool) -> Self {
        Self {
            // Never zero, which the standard reserves for "invalid".
            trace_id: fastrand::u128(1..).to_be_bytes(),
            span_id: span_id(),
            parent_id: None,
            flags: u8::from(sampled),
        }
    }

    /// `trace-flags` bit 0: the trace is recorded.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// Parses a `traceparent` value (W3C Trace Context §3.2): version 00
    /// exactly, a later version by its first four fields.
    pub fn parse(value: &[u8]) -> Option<Self> {
        if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let version = hex::<1>(&value[0..2])?[0];
        if version == 0xff || (version == 0 && value.len() != 55) {
            return None;
        }
        // A later version may append fields after a dash.
        if value.len() > 55 && value[55] != b'-' {
            return None;
        }
        let trace_id = hex::<16>(&value[3..35])?;
        let parent_id = hex::<8>(&value[36..52])?;
        let flags = hex::<1>(&value[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id: span_id(),
            parent_id: Some(parent_id),
            flags,
        })
    }

    /// The `traceparent` the backend gets: this trace, the gateway's span.
    pub fn traceparent(&self) -> Traceparent {
        // On every proxied request: bytes on the stack, no formatting
        // machinery (the `String` and `write!` version cost 1 270
        // instructions a request).
        let mut text = [b'-'; 55];
        text[..2].copy_from_slice(b"00");
        hex_into(&mut text[3..35], &self.trace_id);
        hex_into(&mut text[36..52], &self.span_id);
        hex_into(&mut text[53..55], &[self.flags]);
        Traceparent(text)
    }

    pub fn trace_id_hex(&self) -> String {
        let mut text = String::with_capacity(32);
        push_hex(&mut text, &self.trace_id);
        text
    }
}

/// A `traceparent` value as sent: 55 bytes of lower-case hex and dashes,
/// on the stack. cutover's own HTTP/1.1 client writes it straight into
/// the request head; a `HeaderValue` (an allocation and a check of every
/// byte) is made only for hyper's clients.
#[derive(Clone, Copy)]
pub struct Traceparent([u8; 55]);

impl Traceparent {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written into it.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    pub fn header_value(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.0).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

impl std::fmt::Debug for Traceparent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn span_id() -> [u8; 8] {
    fastrand::u64(1..).to_be_bytes()
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex, as the standard requires (upper case is invalid).
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

/// `bytes` as lower-case hex into `out`, which is twice as long.
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

fn hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Whether spans are exported (an OTLP exporter started).
static EXPORTING: AtomicBool = AtomicBool::new(false);
/// `tracing.sample_ratio` as f64 bits (live).
static SAMPLE_RATIO: AtomicU64 = AtomicU64::new(0);

/// From now on, spans are exported.
pub fn exporting() {
    EXPORTING.store(true, Ordering::Relaxed);
}

/// Whether spans are exported at all.
pub fn exported() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// `tracing.sample_ratio` (live).
pub fn set_sample_ratio(ratio: f64) {
    SAMPLE_RATIO.store(ratio.to_bits(), Ordering::Relaxed);
}

/// Whether a new trace (one the request did not bring) is sampled: only
/// while spans are exported, with probability `sample_ratio`.
pub fn sample_new_trace() -> bool {
    exported() && fastrand::f64() < f64::from_bits(SAMPLE_RATIO.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn a_valid_traceparent_is_continued_with_a_new_span() {
        let mut map = headers(&[("traceparent", VALID), ("tracestate", "vendor=x")]);
        let context = TraceContext::take(&mut map);
        assert_eq!(context.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            context.parent_id,
            Some(*b"\x00\xf0\x67\xaa\x0b\xa9\x02\xb7")
        );
        assert_eq!(context.flags, 1);
        let sent = context.traceparent();
        let sent = sent.as_str();
        assert!(
            sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{sent}"
        );
        assert!(sent.ends_with("-01"));
        assert_ne!(
            &sent[36..52],
            "00f067aa0ba902b7",
            "the gateway's span is the parent"
        );
        // The client's field is taken out (ours replaces it), its state kept.
        assert!(map.get("traceparent").is_none());
        assert_eq!(map.get("tracestate").unwrap(), "vendor=x");
        assert_eq!(
            TraceContext::parse(sent.as_bytes()).unwrap().trace_id,
            context.trace_id
        );
    }

    #[test]
    fn an_invalid_or_absent_traceparent_starts_a_new_trace_without_its_state() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad.as_bytes()), None, "{bad:?}");
        }
        // A later version may carry more fields.
        assert!(TraceContext::parse(
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        )
        .is_some());
        let mut map = headers(&[("traceparent", "garbage"), ("tracestate", "vendor=x")]);
        let context = TraceContext::take(&mut map);
        assert_eq!(context.parent_id, None);
        assert_eq!(context.flags, 0);
        assert!(map.is_empty(), "{map:?}");
        // Two traceparent fields are invalid too.
        let mut map = headers(&[("traceparent", VALID), ("traceparent", VALID)]);
        assert_eq!(TraceContext::take(&mut map).parent_id, None);
        // Nothing at all: a new trace, the map untouched.
        let mut map = headers(&[("x-app", "1")]);
        let context = TraceContext::take(&mut map);
        assert_ne!(context.trace_id, [0; 16]);
        assert_eq!(map.len(), 1);
        let sent = context.traceparent();
        assert!(TraceContext::parse(sent.as_bytes()).is_some(), "{sent:?}");
    }
}

//! gRPC as the gateway sees it (DESIGN §18): which requests are gRPC, the
//! status codes (a closed set, so that metric labels stay bounded), the
//! `grpc-timeout` header, the length-prefixed message frame, and the two
//! messages of `grpc.health.v1.Health/Check`. Protocol facts only: the
//! request path uses them in `proxy::grpc`, health checks in
//! `backends::health`, validation in `plan`.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};

pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// Whether a message with these headers is gRPC (or gRPC-Web):
/// `application/grpc`, alone or with a `+codec` or `;params` suffix.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC status codes (grpc/doc/statuscodes.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The lower-case name: the metric label, and what `retry.on` takes
    /// after `grpc:`.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::Cancelled => "cancelled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The code a `grpc-status` value names; a value outside the set is
    /// UNKNOWN, as gRPC's own clients read it.
    pub fn from_value(value: &HeaderValue) -> Code {
        std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|text| text.parse::<usize>().ok())
            .and_then(|n| Code::ALL.get(n).copied())
            .unwrap_or(Code::Unknown)
    }

    /// The code of a message's `grpc-status`, if it has one.
    pub fn of(headers: &HeaderMap) -> Option<Code> {
        headers.get(&GRPC_STATUS).map(Code::from_value)
    }

    /// What a gRPC client makes of an HTTP answer without a gRPC status
    /// (grpc/doc/http-grpc-status-mapping.md).
    pub fn from_http(status: http::StatusCode) -> Code {
        match status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }

    pub fn value(self) -> HeaderValue {
        HeaderValue::from(u16::from(self as u8))
    }

    /// A bit of its own, for sets of codes.
    pub fn bit(self) -> u32 {
        1 << (self as u8)
    }
}

/// The longest `grpc-timeout` value: eight digits (gRPC's PROTOCOL-HTTP2).
const TIMEOUT_DIGITS: usize = 8;

/// Reads a `grpc-timeout` value (`1-8 digits` and a unit of `H M S m u
/// n`); anything else is `None`.
pub fn parse_timeout(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (&unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > TIMEOUT_DIGITS || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Writes `left` as a `grpc-timeout` value in the finest unit whose
/// count fits eight digits, rounded down (the backend never gets more
/// time than is left).
pub fn format_timeout(left: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let candidates: [(u128, &str); 5] = [
        (left.as_nanos(), "n"),
        (left.as_micros(), "u"),
        (left.as_millis(), "m"),
        (u128::from(left.as_secs()), "S"),
        (u128::from(left.as_secs() / 60), "M"),
    ];
    let (count, unit) = candidates
        .into_iter()
        .find(|(n, _)| *n <= MAX)
        .unwrap_or((u128::from(left.as_secs() / 3600).min(MAX), "H"));
    HeaderValue::try_from(format!("{count}{unit}"))
        .unwrap_or_else(|_| HeaderValue::from_static("0n"))
}

/// One length-prefixed message (uncompressed): the frame every gRPC
/// message travels in.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    out.put_slice(message);
    out.freeze()
}

/// `grpc.health.v1.HealthCheckRequest { service }`, framed.
pub fn health_request(service: &str) -> Bytes {
    let mut message = Vec::with_capacity(service.len() + 6);
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        push_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    frame(&message)
}

/// The `status` of a framed `grpc.health.v1.HealthCheckResponse`
/// (1 = SERVING), or why the bytes are not one.
pub fn health_status(body: &[u8]) -> Result<u64, &'static str> {
    let (flags, rest) = body.split_first().ok_or("empty response")?;
    if *flags != 0 {
        return Err("compressed response");
    }
    let len = rest
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("truncated frame")?;
    let mut message = rest.get(4..4 + len).ok_or("truncated message")?;
    // Unset means the default: UNKNOWN (0).
    let mut status = 0;
    while let Some((&key, rest)) = message.split_first() {
        message = rest;
        let field = key >> 3;
        match key & 7 {
            0 => {
                let value = read_varint(&mut message)?;
                if field == 1 {
                    status = value;
                }
            }
            2 => {
                let len = read_varint(&mut message)? as usize;
                message = message.get(len..).ok_or("truncated field")?;
            }
            _ => return Err("unexpected field type"),
        }
    }
    Ok(status)
}

fn push_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn read_varint(bytes: &mut &[u8]) -> Result<u64, &'static str> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first().ok_or("truncated varint")?;
        *bytes = rest;
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(n);
        }
    }
    Err("varint too long")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_in_every_unit_and_refuse_the_rest() {
        let read = |s: &'static str| parse_timeout(&HeaderValue::from_static(s));
        assert_eq!(read("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(read("3M"), Some(Duration::from_secs(180)));
        assert_eq!(read("10S"), Some(Duration::from_secs(10)));
        assert_eq!(read("250m"), Some(Duration::from_millis(250)));
        assert_eq!(read("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(read("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "m", "123456789m", "1.5S", "10s", "-1S", "10 S", "S10"] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn timeouts_are_written_in_eight_digits_never_rounded_up() {
        let write = |d: Duration| format_timeout(d).to_str().unwrap().to_owned();
        assert_eq!(write(Duration::from_millis(1500)), "1500000u");
        assert_eq!(write(Duration::from_nanos(99_999_999)), "99999999n");
        assert_eq!(write(Duration::from_secs(3600 * 24 * 365)), "31536000S");
        assert_eq!(write(Duration::from_secs(3600 * 24 * 3650)), "5256000M");
        assert_eq!(write(Duration::ZERO), "0n");
        for d in [
            Duration::from_nanos(1),
            Duration::from_millis(123_456),
            Duration::from_secs(86_400 * 3000),
        ] {
            let back = parse_timeout(&format_timeout(d)).unwrap();
            assert!(
                back <= d && back.as_secs_f64() >= d.as_secs_f64() * 0.99,
                "{d:?} → {back:?}"
            );
        }
    }

    #[test]
    fn codes_read_from_values_names_and_http_statuses() {
        assert_eq!(
            Code::from_value(&HeaderValue::from_static("14")),
            Code::Unavailable
        );
        assert_eq!(
            Code::from_value(&HeaderValue::from_static("17")),
            Code::Unknown
        );
        assert_eq!(
            Code::from_value(&HeaderValue::from_static("x")),
            Code::Unknown
        );
        for code in Code::ALL {
            assert_eq!(Code::from_name(code.name()), Some(code));
            assert_eq!(Code::from_value(&code.value()), code);
        }
        assert_eq!(
            Code::from_http(http::StatusCode::NOT_FOUND),
            Code::Unimplemented
        );
        assert_eq!(
            Code::from_http(http::StatusCode::BAD_GATEWAY),
            Code::Unavailable
        );
    }

    #[test]
    fn health_messages_round_trip() {
        let request = health_request("pkg.Echo");
        assert_eq!(&request[..5], &[0, 0, 0, 0, 10]);
        assert_eq!(&request[5..7], &[0x0a, 8]);
        // SERVING, NOT_SERVING, and the default (UNKNOWN) with an unknown
        // length-delimited field skipped.
        assert_eq!(health_status(&frame(&[0x08, 0x01])), Ok(1));
        assert_eq!(health_status(&frame(&[0x08, 0x02])), Ok(2));
        assert_eq!(health_status(&frame(&[0x12, 0x01, b'x'])), Ok(0));
        assert!(health_status(&[0, 0, 0, 0, 9, 0x08]).is_err());
        assert!(health_status(&[1, 0, 0, 0, 0]).is_err());
    }
}

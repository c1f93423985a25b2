//! Access lines as text: `key=value` (values quoted when they need it)
//! or JSON, one per line, numbers, addresses and times written without
//! `fmt`.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use http::Method;

use super::Line;
use crate::telemetry::LogFormat;

/// Appends one line, text (`key=value`, values quoted when they need it)
/// or JSON, and a newline. Numbers, addresses and the time are written
/// without `fmt`, which costs several times as much
/// (`docs/performance.md`, "Figures behind choices in the code").
pub fn format_line(out: &mut Vec<u8>, line: &Line, format: LogFormat) {
    let start = line.ended.checked_sub(line.duration).unwrap_or(line.ended);
    let method = line.method.as_ref().map(Method::as_str);
    let authority = line.authority.as_deref();
    let trace_id = line.trace_id.map(|id| {
        let mut text = String::with_capacity(32);
        crate::telemetry::trace::push_hex(&mut text, &id);
        text
    });
    match format {
        LogFormat::Json => {
            // Written field by field: serde_json's escaping looks at every
            // byte of every string through a table; most values here need
            // none (see `push_json_str`).
            out.extend_from_slice(b"{\"time\":\"");
            push_time(out, start);
            out.extend_from_slice(b"\",\"target\":\"cutover::access\",\"listener\":");
            push_json_str(out, &line.listener);
            out.extend_from_slice(b",\"generation\":");
            push_u64(out, line.generation);
            out.extend_from_slice(b",\"protocol\":\"");
            out.extend_from_slice(line.protocol.as_bytes());
            out.extend_from_slice(b"\",\"client\":\"");
            push_addr(out, line.client);
            out.extend_from_slice(b"\",\"method\":");
            push_json_opt(out, method);
            out.extend_from_slice(b",\"authority\":");
            push_json_opt(out, authority);
            out.extend_from_slice(b",\"path\":");
            push_json_opt(out, line.path.as_deref());
            out.extend_from_slice(b",\"upstream_path\":");
            push_json_opt(out, line.upstream_path.as_deref());
            out.extend_from_slice(b",\"route\":");
            push_json_opt(out, line.route.as_deref());
            out.extend_from_slice(b",\"request_id\":");
            push_json_opt(out, line.request_id.as_deref());
            out.extend_from_slice(b",\"auth\":");
            push_json_opt(out, line.auth);
            out.extend_from_slice(b",\"subject\":");
            push_json_opt(out, line.subject.as_deref());
            out.extend_from_slice(b",\"cache\":");
            push_json_opt(out, line.cache);
            out.extend_from_slice(b",\"limited\":");
            push_json_opt(out, line.limited);
            out.extend_from_slice(b",\"waf\":");
            push_json_opt(out, line.waf.as_deref());
            out.extend_from_slice(b",\"status\":");
            push_u64(out, u64::from(line.status));
            out.extend_from_slice(b",\"grpc_status\":");
            match line.grpc_status {
                Some(code) => push_u64(out, u64::from(code)),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"bytes_in\":");
            push_u64(out, line.bytes_in);
            out.extend_from_slice(b",\"bytes_out\":");
            push_u64(out, line.bytes_out);
            out.extend_from_slice(b",\"encoding\":");
            push_json_opt(out, line.encoding);
            out.extend_from_slice(b",\"bytes_uncompressed\":");
            match line.encoding {
                Some(_) => push_u64(out, line.bytes_uncompressed),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"duration_ms\":");
            push_millis(out, line.duration);
            out.extend_from_slice(b",\"upstream_ms\":");
            match line.upstream_time {
                Some(t) => push_millis(out, t),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"upstream_protocol\":");
            push_json_opt(out, line.upstream_protocol);
            out.extend_from_slice(b",\"backend\":");
            push_json_opt(out, line.backend.as_deref());
            out.extend_from_slice(b",\"attempts\":");
            push_u64(out, u64::from(line.attempts));
            out.extend_from_slice(b",\"trace_id\":");
            push_json_opt(out, trace_id.as_deref());
            out.extend_from_slice(b",\"flags\":[");
            for (i, name) in line.flags.names().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'"');
                out.extend_from_slice(name.as_bytes());
                out.push(b'"');
            }
            out.extend_from_slice(b"]}");
        }
        LogFormat::Text => {
            let dash = "-";
            out.extend_from_slice(b"time=");
            push_time(out, start);
            push_field(out, b" listener=", &line.listener);
            out.extend_from_slice(b" protocol=");
            out.extend_from_slice(line.protocol.as_bytes());
            out.extend_from_slice(b" client=");
            push_addr(out, line.client);
            for (key, value) in [
                (&b" method="[..], method.unwrap_or(dash)),
                (b" authority=", authority.unwrap_or(dash)),
                (b" path=", line.path.as_deref().unwrap_or(dash)),
                (
                    b" upstream_path=",
                    line.upstream_path.as_deref().unwrap_or(dash),
                ),
                (b" route=", line.route.as_deref().unwrap_or(dash)),
                (b" request_id=", line.request_id.as_deref().unwrap_or(dash)),
                (b" auth=", line.auth.unwrap_or(dash)),
                (b" subject=", line.subject.as_deref().unwrap_or(dash)),
                (b" cache=", line.cache.unwrap_or(dash)),
                (b" limited=", line.limited.unwrap_or(dash)),
                (b" waf=", line.waf.as_deref().unwrap_or(dash)),
            ] {
                push_field(out, key, value);
            }
            out.extend_from_slice(b" generation=");
            push_u64(out, line.generation);
            out.extend_from_slice(b" status=");
            push_u64(out, u64::from(line.status));
            out.extend_from_slice(b" grpc_status=");
            match line.grpc_status {
                Some(code) => push_u64(out, u64::from(code)),
                None => out.push(b'-'),
            }
            out.extend_from_slice(b" bytes_in=");
            push_u64(out, line.bytes_in);
            out.extend_from_slice(b" bytes_out=");
            push_u64(out, line.bytes_out);
            out.extend_from_slice(b" encoding=");
            out.extend_from_slice(line.encoding.unwrap_or(dash).as_bytes());
            out.extend_from_slice(b" bytes_uncompressed=");
            match line.encoding {
                Some(_) => push_u64(out, line.bytes_uncompressed),
                None => out.push(b'-'),
            }
            out.extend_from_slice(b" duration_ms=");
            push_millis(out, line.duration);
            out.extend_from_slice(b" upstream_ms=");
            match line.upstream_time {
                Some(t) => push_millis(out, t),
                None => out.push(b'-'),
            }
            out.extend_from_slice(b" upstream_protocol=");
            out.extend_from_slice(line.upstream_protocol.unwrap_or(dash).as_bytes());
            push_field(out, b" backend=", line.backend.as_deref().unwrap_or(dash));
            out.extend_from_slice(b" attempts=");
            push_u64(out, u64::from(line.attempts));
            push_field(out, b" trace_id=", trace_id.as_deref().unwrap_or(dash));
            out.extend_from_slice(b" flags=");
            if line.flags.is_empty() {
                out.push(b'-');
            }
            for (i, name) in line.flags.names().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(name.as_bytes());
            }
        }
    }
    out.push(b'\n');
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Milliseconds with three decimals (microsecond precision).
fn push_millis(out: &mut Vec<u8>, duration: Duration) {
    let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
    push_u64(out, micros / 1000);
    let fraction = micros % 1000;
    out.push(b'.');
    out.extend_from_slice(&[
        b'0' + (fraction / 100) as u8,
        b'0' + (fraction / 10 % 10) as u8,
        b'0' + (fraction % 10) as u8,
    ]);
}

fn push_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => {
            push_ip(out, IpAddr::V4(*v4.ip()));
            out.push(b':');
            push_u64(out, u64::from(v4.port()));
        }
        SocketAddr::V6(_) => {
            let _ = write!(out, "{addr}");
        }
    }
}

/// An address as `Display` writes it; IPv4 without `fmt` (a tenth of
/// the instructions; it is written for every connection's
/// `X-Forwarded-For` and every access-log line).
pub fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                push_u64(out, u64::from(octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// RFC 3339 UTC with milliseconds; the part up to the second is formatted
/// once per second (lines come in order of their requests' ends, so
/// nearly every line shares its second with the one before).
fn push_time(out: &mut Vec<u8>, at: SystemTime) {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let second = since.as_secs();
    SECOND.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second {
            let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(second);
            // "2026-11-30T14:31:24Z" without its "Z".
            let mut text = humantime::format_rfc3339_seconds(whole).to_string();
            text.pop();
            *cached = (second, text);
        }
        out.extend_from_slice(cached.1.as_bytes());
    });
    let millis = since.subsec_millis();
    out.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
        b'Z',
    ]);
}

/// A JSON string: copied as is when nothing in it needs escaping (the
/// common case), else escaped by serde_json.
fn push_json_str(out: &mut Vec<u8>, value: &str) {
    if value
        .bytes()
        .all(|b| b >= b' ' && b != b'"' && b != b'\\' && b != 0x7f)
    {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, value);
    }
}

fn push_json_opt(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(value) => push_json_str(out, value),
        None => out.extend_from_slice(b"null"),
    }
}

/// Bytes a text field's value holds as they are (unquoted): above the
/// space, other than `"`, `=`, `\` and DEL (UTF-8's bytes included).
const PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = 0x21;
    while b < 256 {
        plain[b] = !matches!(b as u8, b'"' | b'=' | b'\\' | 0x7f);
        b += 1;
    }
    plain
};

/// `prefix` (` key=`) and the value, quoted (with `"` and `\` escaped,
/// control bytes as `\xNN`) when it is empty or holds a space, a quote,
/// `=` or a control byte, so every line splits the same way. Written in
/// as few copies as it can: a line has sixteen of these.
fn push_field(out: &mut Vec<u8>, prefix: &[u8], value: &str) {
    let plain = !value.is_empty() && value.bytes().all(|b| PLAIN[usize::from(b)]);
    if plain {
        out.reserve(prefix.len() + value.len());
        out.extend_from_slice(prefix);
        out.extend_from_slice(value.as_bytes());
        return;
    }
    out.extend_from_slice(prefix);
    out.push(b'"');
    for b in value.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push(b'\\');
                out.push(b);
            }
            b if b < b' ' || b == 0x7f => {
                let _ = write!(out, "\\x{b:02x}");
            }
            b => out.push(b),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::telemetry::access::Flags;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for text in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.255.9",
            "255.255.255.255",
            "::1",
            "2001:db8::17",
            "::ffff:192.0.2.1",
        ] {
            let ip: IpAddr = text.parse().expect("address");
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string().as_bytes(), "{text}");
        }
    }

    pub(in crate::telemetry::access) fn line() -> Line {
        Line {
            ended: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_513_084_123),
            duration: Duration::from_micros(1_500),
            protocol: "HTTP/1.1",
            listener: "web".into(),
            generation: 7,
            client: "127.0.0.1:5555".parse().unwrap(),
            method: Some(Method::GET),
            authority: Some("api.example.com".into()),
            path: Some("/v1/a b".into()),
            upstream_path: None,
            request_id: None,
            auth: None,
            subject: None,
            cache: None,
            limited: None,
            waf: None,
            route: Some("api".into()),
            status: 502,
            grpc_status: None,
            bytes_in: 3,
            bytes_out: 12,
            encoding: None,
            bytes_uncompressed: 0,
            upstream_time: None,
            upstream_protocol: None,
            backend: Some("127.0.0.1:9001".into()),
            attempts: 2,
            trace_id: Some([0xab; 16]),
            span_id: Some([0x01; 8]),
            parent_span_id: None,
            sampled: false,
            logged: true,
            flags: Flags::CONNECT_FAILURE | Flags::RETRIED,
        }
    }

    #[test]
    fn plain_bytes_are_those_a_value_may_hold_unquoted() {
        for b in 0..=255u8 {
            let plain = b > b' ' && b != b'"' && b != b'=' && b != b'\\' && b != 0x7f;
            assert_eq!(PLAIN[usize::from(b)], plain, "{b:#x}");
        }
    }

    #[test]
    fn text_lines_carry_every_field_and_quote_what_needs_it() {
        let mut out = Vec::new();
        format_line(&mut out, &line(), LogFormat::Text);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "time=2025-11-30T14:31:24.121Z listener=web protocol=HTTP/1.1 client=127.0.0.1:5555 \
             method=GET authority=api.example.com path=\"/v1/a b\" upstream_path=- route=api \
             request_id=- auth=- subject=- cache=- limited=- waf=- generation=7 \
             status=502 grpc_status=- bytes_in=3 bytes_out=12 encoding=- bytes_uncompressed=- duration_ms=1.500 upstream_ms=- \
             upstream_protocol=- backend=127.0.0.1:9001 attempts=2 trace_id=abababababababababababababababab \
             flags=connect_failure,retried\n"
        );
        let mut out = Vec::new();
        push_field(&mut out, b"k=", "a\"b\\c\x01");
        assert_eq!(out, b"k=\"a\\\"b\\\\c\\x01\"");
        let mut out = Vec::new();
        push_field(&mut out, b"k=", "");
        assert_eq!(out, b"k=\"\"");
    }

    #[test]
    fn json_lines_carry_every_field() {
        let mut out = Vec::new();
        let mut l = line();
        l.upstream_time = Some(Duration::from_micros(250));
        l.upstream_protocol = Some("h3");
        l.flags = Flags::NONE;
        l.auth = Some("allowed");
        l.subject = Some("alice \"a\"".into());
        format_line(&mut out, &l, LogFormat::Json);
        assert_eq!(out.last(), Some(&b'\n'));
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["time"], "2025-11-30T14:31:24.121Z");
        assert_eq!(value["target"], "cutover::access");
        assert_eq!(value["path"], "/v1/a b");
        assert_eq!(value["status"], 502);
        assert_eq!(value["upstream_ms"], 0.25);
        assert_eq!(value["upstream_protocol"], "h3");
        assert_eq!(value["attempts"], 2);
        assert_eq!(value["flags"], serde_json::json!([]));
        for key in [
            "listener",
            "generation",
            "protocol",
            "client",
            "method",
            "authority",
            "route",
            "bytes_in",
            "bytes_out",
            "duration_ms",
            "backend",
            "trace_id",
            "auth",
            "subject",
        ] {
            assert!(!value[key].is_null(), "{key}");
        }
        assert_eq!(value["subject"], "alice \"a\"");
    }

    #[test]
    fn json_strings_that_need_escaping_are_escaped() {
        let mut l = line();
        l.path = Some("/a\"b\\c\u{1}d".into());
        l.authority = Some("host\twith-tab".into());
        let mut out = Vec::new();
        format_line(&mut out, &l, LogFormat::Json);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["path"], "/a\"b\\c\u{1}d");
        assert_eq!(value["authority"], "host\twith-tab");
        assert_eq!(
            value["flags"],
            serde_json::json!(["connect_failure", "retried"])
        );
    }
}

//! Edge request rules (DESIGN §13): what a request is routed by is what
//! the backend receives.
//!
//! Takes a request head as hyper parsed it (HTTP/1.1 or HTTP/2) and the
//! listener's [`ListenerEdge`]; returns the one authority and the one
//! normalized path that routing and forwarding both use, the forwarding
//! headers to send, or the reason the request is refused (400). Nothing
//! here allocates for an ordinary request: a path that needs no
//! normalization is borrowed, and the authority is a refcounted clone.

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Version};

use crate::backends::{header_tokens, ClientBody};
use crate::generation::RequestHead;
use crate::plan::{EncodedSlash, ListenerEdge};

/// Why a request head is refused (the 400's log reason).
pub type Refusal = &'static str;

/// The request's authority: an absolute-form target or HTTP/2
/// `:authority` wins over `Host` (RFC 9112 §3.2.2, RFC 9113 §8.3.1).
/// `None` only for an HTTP/1.0 request that named no host.
pub fn authority<B>(req: &Request<B>) -> Result<Option<HeaderValue>, Refusal> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    if let Some(authority) = req.uri().authority() {
        let authority = authority.as_str();
        if authority.contains('@') {
            return Err("userinfo in the request target");
        }
        if matches!(req.version(), Version::HTTP_2 | Version::HTTP_3) {
            if let Some(host) = host {
                if !host.as_bytes().eq_ignore_ascii_case(authority.as_bytes()) {
                    return Err("host header disagrees with :authority");
                }
            }
        }
        return HeaderValue::from_str(authority)
            .map(Some)
            .map_err(|_| "invalid authority");
    }
    match host {
        Some(host) if host.is_empty() => Ok(None),
        Some(host) if host.as_bytes().iter().all(|&b| is_authority_byte(b)) => {
            Ok(Some(host.clone()))
        }
        Some(_) => Err("invalid Host header"),
        None if req.version() == Version::HTTP_11 => Err("HTTP/1.1 request without Host"),
        None => Ok(None),
    }
}

/// A byte an authority may hold (RFC 3986 §3.2: unreserved, escapes,
/// sub-delims, the port colon and IP-literal brackets), never `@`.
fn is_authority_byte(b: u8) -> bool {
    matches!(b,
        b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~'
        | b'%' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b','
        | b';' | b'=' | b':' | b'[' | b']')
}

/// The host part of an authority, without port or IPv6 brackets, as the
/// router matches it.
pub fn route_host(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// The path routing and forwarding use: percent-encoded unreserved
/// characters decoded (and other escapes upper-cased), dot segments
/// removed (RFC 3986 §6.2.2, §5.2.4), runs of `/` merged when the
/// listener asks. Encoded `/` and `\` stay encoded, or are refused; a
/// raw `\` is refused.
pub fn normalize_path<'p>(path: &'p str, edge: &ListenerEdge) -> Result<Cow<'p, str>, Refusal> {
    if !path.starts_with('/') {
        // `*` (OPTIONS) and authority-form targets have no path to clean.
        return Ok(Cow::Borrowed(path));
    }
    let bytes = path.as_bytes();
    // Not a URI character (RFC 3986 §3.3), and a path separator to some
    // backends: `/public\..\admin` would be `/admin` there.
    if bytes.contains(&b'\\') {
        return Err("backslash in the path");
    }
    let escaped = bytes.contains(&b'%');
    let merge = edge.merge_slashes && path.contains("//");
    if !(escaped || merge || has_dot_segment(bytes)) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = if escaped {
        Cow::Owned(decode_unreserved(bytes, edge.encoded_slash)?)
    } else {
        Cow::Borrowed(path)
    };
    Ok(Cow::Owned(remove_dot_segments(
        &decoded,
        edge.merge_slashes,
    )))
}

/// Whether a segment of the path is `.` or `..`.
fn has_dot_segment(path: &[u8]) -> bool {
    path.split(|&b| b == b'/')
        .any(|segment| segment == b"." || segment == b"..")
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn decode_unreserved(path: &[u8], encoded_slash: EncodedSlash) -> Result<String, Refusal> {
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while let Some(&b) = path.get(i) {
        if b != b'%' {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            path.get(i + 1).copied().and_then(hex),
            path.get(i + 2).copied().and_then(hex),
        ) else {
            return Err("invalid percent-encoding in the path");
        };
        let decoded = hi << 4 | lo;
        if is_unreserved(decoded) {
            out.push(char::from(decoded));
        } else if matches!(decoded, b'/' | b'\\') && encoded_slash == EncodedSlash::Reject {
            return Err("encoded slash or backslash in the path");
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(char::from(HEX[usize::from(hi)]));
            out.push(char::from(HEX[usize::from(lo)]));
        }
        i += 3;
    }
    Ok(out)
}

/// RFC 3986 §5.2.4 on an absolute path, segment by segment.
fn remove_dot_segments(path: &str, merge_slashes: bool) -> String {
    let segments: Vec<&str> = path.get(1..).unwrap_or("").split('/').collect();
    let last = segments.len().saturating_sub(1);
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    // A path ending in `.` or `..` names a directory: it keeps its slash.
    let mut trailing_slash = false;
    for (i, segment) in segments.into_iter().enumerate() {
        trailing_slash = false;
        match segment {
            "." => trailing_slash = true,
            ".." => {
                out.pop();
                trailing_slash = true;
            }
            "" if merge_slashes && i != last => {}
            segment => out.push(segment),
        }
    }
    let mut normalized = String::with_capacity(path.len());
    for segment in &out {
        normalized.push('/');
        normalized.push_str(segment);
    }
    if trailing_slash || normalized.is_empty() {
        normalized.push('/');
    }
    normalized
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The forwarding headers of one upstream request: `X-Forwarded-*`
/// always, `Forwarded` (RFC 7239) when the client sent one.
pub struct Forwarded {
    client: HeaderValue,
    proto: HeaderValue,
    host: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
    /// The W3C `traceparent` naming the gateway's span.
    pub traceparent: Option<crate::telemetry::trace::Traceparent>,
}

impl Forwarded {
    /// Takes the client's forwarding headers out of `headers` and builds
    /// the ones to send. A trusted peer's are extended (every line joined,
    /// then this hop appended); anyone else's are replaced, since a client
    /// can write whatever it likes in them.
    pub fn take(
        headers: &mut HeaderMap,
        edge: &ListenerEdge,
        peer: IpAddr,
        peer_header: &HeaderValue,
        https: bool,
        authority: Option<&HeaderValue>,
    ) -> Self {
        let proto = HeaderValue::from_static(if https { "https" } else { "http" });
        let mut this = Forwarded {
            client: peer_header.clone(),
            proto,
            host: authority.cloned(),
            forwarded: None,
            traceparent: None,
        };
        // Most requests carry none: one look at the names instead of
        // hashing four absent ones.
        if !headers
            .keys()
            .any(|n| n.as_str().starts_with("x-forwarded-") || n == header::FORWARDED)
        {
            return this;
        }
        let client_for = join_lines(headers, &X_FORWARDED_FOR);
        let client_proto = join_lines(headers, &X_FORWARDED_PROTO);
        let client_host = join_lines(headers, &X_FORWARDED_HOST);
        let client_forwarded = join_lines(headers, &header::FORWARDED);
        for name in [
            &X_FORWARDED_FOR,
            &X_FORWARDED_PROTO,
            &X_FORWARDED_HOST,
            &header::FORWARDED,
        ] {
            headers.remove(name);
        }
        let trusted = edge.trusts(peer);
        if client_forwarded.is_some() {
            let element = forwarded_element(peer, https, authority);
            this.forwarded = match client_forwarded.as_ref().filter(|_| trusted) {
                Some(existing) => append(existing, &element),
                None => HeaderValue::from_str(&element).ok(),
            };
        }
        if trusted {
            if let Some(chain) = client_for {
                this.client = append(&chain, peer_header.to_str().unwrap_or("unknown"))
                    .unwrap_or_else(|| peer_header.clone());
            }
            this.proto = client_proto.unwrap_or(this.proto);
            this.host = client_host.or(this.host);
        }
        this
    }

    /// The headers, for a client that writes them straight into the head.
    pub fn headers(&self) -> impl Iterator<Item = (&HeaderName, &[u8])> {
        [
            (&X_FORWARDED_FOR, self.client.as_bytes()),
            (&X_FORWARDED_PROTO, self.proto.as_bytes()),
        ]
        .into_iter()
        .chain(
            self.host
                .as_ref()
                .map(|h| (&X_FORWARDED_HOST, h.as_bytes())),
        )
        .chain(
            self.forwarded
                .as_ref()
                .map(|f| (&header::FORWARDED, f.as_bytes())),
        )
        .chain(
            self.traceparent
                .as_ref()
                .map(|t| (&crate::telemetry::trace::TRACEPARENT, t.as_bytes())),
        )
    }

    pub fn insert_into(self, headers: &mut HeaderMap) {
        headers.insert(X_FORWARDED_FOR.clone(), self.client);
        headers.insert(X_FORWARDED_PROTO.clone(), self.proto);
        if let Some(host) = self.host {
            headers.insert(X_FORWARDED_HOST.clone(), host);
        }
        if let Some(forwarded) = self.forwarded {
            headers.insert(header::FORWARDED, forwarded);
        }
        if let Some(traceparent) = self.traceparent {
            // New with every request: HPACK must not index it (each
            // insertion would evict a reusable entry from an HTTP/2
            // backend connection's table).
            let mut traceparent = traceparent.header_value();
            traceparent.set_sensitive(true);
            headers.insert(crate::telemetry::trace::TRACEPARENT.clone(), traceparent);
        }
    }
}

/// Every line of a header joined with `, ` (RFC 9110 §5.3), if any.
fn join_lines(headers: &HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    let mut lines = headers.get_all(name).iter().filter(|v| !v.is_empty());
    let first = lines.next()?;
    let Some(second) = lines.next() else {
        return Some(first.clone());
    };
    let mut joined = Vec::with_capacity(first.len() + second.len() + 2);
    for line in [first, second].into_iter().chain(lines) {
        if !joined.is_empty() {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    HeaderValue::from_bytes(&joined).ok()
}

fn append(existing: &HeaderValue, element: &str) -> Option<HeaderValue> {
    let mut joined = Vec::with_capacity(existing.len() + element.len() + 2);
    joined.extend_from_slice(existing.as_bytes());
    joined.extend_from_slice(b", ");
    joined.extend_from_slice(element.as_bytes());
    HeaderValue::from_bytes(&joined).ok()
}

/// This hop as an RFC 7239 element: `for=…;proto=…;host="…"`.
fn forwarded_element(peer: IpAddr, https: bool, authority: Option<&HeaderValue>) -> String {
    let proto = if https { "https" } else { "http" };
    let mut element = match peer {
        IpAddr::V4(ip) => format!("for={ip};proto={proto}"),
        IpAddr::V6(ip) => format!("for=\"[{ip}]\";proto={proto}"),
    };
    if let Some(host) = authority.and_then(|a| a.to_str().ok()) {
        // An authority is made of characters a quoted-string may hold
        // unescaped, but never trust that: drop quotes and backslashes.
        let host: String = host.chars().filter(|c| !matches!(c, '"' | '\\')).collect();
        element.push_str(";host=\"");
        element.push_str(&host);
        element.push('"');
    }
    element
}

/// Request framing that different parsers read differently (RFC 9112
/// §6.1, §6.3): refused, and the connection closed after the answer.
pub fn smuggling_risk(headers: &HeaderMap) -> Option<Refusal> {
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter().peekable();
    if codings.peek().is_some() {
        if headers.contains_key(header::CONTENT_LENGTH) {
            return Some("both Transfer-Encoding and Content-Length");
        }
        // Any coding besides chunked would have to be forwarded with the
        // body re-framed; no client needs that, and dropping it would
        // hand the backend bytes in a coding it was not told about.
        let mut tokens = header_tokens(headers, &header::TRANSFER_ENCODING);
        let only_chunked = tokens
            .next()
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
            && tokens.next().is_none();
        if !only_chunked {
            return Some("Transfer-Encoding other than a single chunked");
        }
    }
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    if let (Some(first), Some(_)) = (lengths.next(), lengths.next()) {
        if headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|v| v != first)
        {
            return Some("conflicting Content-Length headers");
        }
    }
    None
}

/// A client address as 16 bytes (IPv4 mapped into IPv6), the key that
/// hashing and quotas use for `client_ip`.
pub fn client_key(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(ip) => ip.octets(),
    }
}

/// The method a CORS preflight asks about (`OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`): routes are matched by it, so that a
/// route limited to `POST` answers the preflight of its `POST`s.
pub fn preflight_method(req: &Request<ClientBody>) -> Option<http::Method> {
    if req.method() != http::Method::OPTIONS || !req.headers().contains_key(header::ORIGIN) {
        return None;
    }
    let asked = req.headers().get(header::ACCESS_CONTROL_REQUEST_METHOD)?;
    http::Method::from_bytes(asked.as_bytes()).ok()
}

/// What routing reads of a request: the host of its authority, and its
/// method (for a CORS preflight, `asked`: the method it asks about),
/// headers and query.
pub fn routing_head<'r>(
    req: &'r Request<ClientBody>,
    authority: Option<&'r HeaderValue>,
    asked: Option<&'r http::Method>,
) -> (Option<&'r str>, RequestHead<'r>) {
    let host = authority.and_then(|a| a.to_str().ok()).map(route_host);
    let head = RequestHead {
        method: asked.unwrap_or(req.method()),
        headers: req.headers(),
        query: req.uri().query(),
    };
    (host, head)
}

/// The key authorization for an http-01 token an order waits for.
pub fn acme_challenge<B>(req: &Request<B>) -> Option<http::Response<super::body::ResponseBody>> {
    let token = req
        .uri()
        .path()
        .strip_prefix("/.well-known/acme-challenge/")?;
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return None;
    }
    let answer = crate::tls::http01_answer(token)?;
    let mut response = http::Response::new(super::body::ResponseBody::full(
        bytes::Bytes::copy_from_slice(answer.as_bytes()),
    ));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep() -> ListenerEdge {
        ListenerEdge::default()
    }

    fn norm(path: &str) -> String {
        normalize_path(path, &keep()).expect("valid").into_owned()
    }

    #[test]
    fn ordinary_paths_are_borrowed() {
        for path in ["/", "/public/a", "/a.b/c..d/.e", "/a//b", "*"] {
            assert!(
                matches!(normalize_path(path, &keep()), Ok(Cow::Borrowed(_))),
                "{path}"
            );
        }
    }

    #[test]
    fn dot_segments_are_removed() {
        assert_eq!(norm("/public/../admin/secret"), "/admin/secret");
        assert_eq!(norm("/public/%2e%2e/admin"), "/admin");
        assert_eq!(norm("/public/%2E%2e/admin"), "/admin");
        assert_eq!(norm("/a/./b"), "/a/b");
        assert_eq!(norm("/a/b/.."), "/a/");
        assert_eq!(norm("/a/b/."), "/a/b/");
        assert_eq!(norm("/.."), "/");
        assert_eq!(norm("/../../x"), "/x");
        assert_eq!(norm("/a//../b"), "/a/b");
        assert_eq!(norm("/."), "/");
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_others_upper_cased() {
        assert_eq!(norm("/%7euser/%41b"), "/~user/Ab");
        assert_eq!(norm("/a%20b%2fc"), "/a%20b%2Fc");
        assert_eq!(norm("/a%5cb"), "/a%5Cb");
        assert_eq!(norm("/%252e%252e/x"), "/%252e%252e/x");
        assert!(normalize_path("/a%2", &keep()).is_err());
        assert!(normalize_path("/public\\..\\admin", &keep()).is_err());
        assert!(normalize_path("/a%zz", &keep()).is_err());
    }

    #[test]
    fn encoded_slashes_can_be_refused_and_slashes_merged() {
        let strict = ListenerEdge {
            encoded_slash: EncodedSlash::Reject,
            merge_slashes: true,
            ..ListenerEdge::default()
        };
        assert!(normalize_path("/a%2Fb", &strict).is_err());
        assert!(normalize_path("/a%5cb", &strict).is_err());
        assert_eq!(normalize_path("//a///b/", &strict).expect("ok"), "/a/b/");
        assert_eq!(normalize_path("//", &strict).expect("ok"), "/");
        assert_eq!(norm("//a///b/"), "//a///b/");
    }

    fn request(version: Version, uri: &str, hosts: &[&str]) -> Request<()> {
        let mut builder = Request::get(uri).version(version);
        for host in hosts {
            builder = builder.header(header::HOST, *host);
        }
        builder.body(()).expect("request")
    }

    #[test]
    fn the_target_authority_wins_over_host() {
        let req = request(
            Version::HTTP_11,
            "http://public.example/public",
            &["internal.example"],
        );
        assert_eq!(
            authority(&req).expect("ok").expect("some"),
            "public.example"
        );
        let req = request(Version::HTTP_11, "/x", &["a.example:8080"]);
        let a = authority(&req).expect("ok").expect("some");
        assert_eq!(route_host(a.to_str().expect("str")), "a.example");
        assert_eq!(route_host("[::1]:80"), "::1");
    }

    #[test]
    fn ambiguous_authorities_are_refused() {
        let two = request(Version::HTTP_11, "/", &["a.example", "b.example"]);
        assert!(authority(&two).is_err());
        let none = request(Version::HTTP_11, "/", &[]);
        assert!(authority(&none).is_err());
        assert_eq!(
            authority(&request(Version::HTTP_10, "/", &[])).expect("ok"),
            None
        );
        let h2 = request(Version::HTTP_2, "https://a.example/", &["b.example"]);
        assert!(authority(&h2).is_err());
        let h2 = request(Version::HTTP_2, "https://a.example/", &["A.example"]);
        assert!(authority(&h2).is_ok());
        let userinfo = request(Version::HTTP_11, "/", &["user@a.example"]);
        assert!(authority(&userinfo).is_err());
        let garbage = request(Version::HTTP_11, "/", &["a example"]);
        assert!(authority(&garbage).is_err());
    }

    fn forwarding(pairs: &[(&'static str, &'static str)], edge: &ListenerEdge) -> HeaderMap {
        let mut headers: HeaderMap = pairs
            .iter()
            .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
            .collect::<Vec<_>>()
            .into_iter()
            .fold(HeaderMap::new(), |mut h, (n, v)| {
                h.append(n, v);
                h
            });
        let peer: IpAddr = "10.0.0.9".parse().expect("ip");
        let host = HeaderValue::from_static("public.example");
        let out = Forwarded::take(
            &mut headers,
            edge,
            peer,
            &HeaderValue::from_static("10.0.0.9"),
            false,
            Some(&host),
        );
        out.insert_into(&mut headers);
        headers
    }

    #[test]
    fn untrusted_forwarding_headers_are_replaced() {
        let h = forwarding(
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2"),
                ("x-forwarded-proto", "https"),
                ("forwarded", "for=1.1.1.1"),
            ],
            &keep(),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "public.example");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.9;proto=http;host=\"public.example\""
        );
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn trusted_forwarding_headers_are_joined_and_extended() {
        let edge = ListenerEdge {
            trusted_proxies: vec!["10.0.0.0/8".parse().expect("cidr")],
            ..ListenerEdge::default()
        };
        let h = forwarding(
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2, 3.3.3.3"),
                ("x-forwarded-proto", "https"),
                ("forwarded", "for=1.1.1.1"),
                ("forwarded", "for=2.2.2.2"),
            ],
            &edge,
        );
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.9");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(
            h["forwarded"],
            "for=1.1.1.1, for=2.2.2.2, for=10.0.0.9;proto=http;host=\"public.example\""
        );
        // Absent Forwarded stays absent.
        let h = forwarding(&[("x-forwarded-for", "1.1.1.1")], &edge);
        assert!(!h.contains_key("forwarded"));
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.9");
    }

    proptest::proptest! {
        /// `PROPTEST_CASES=100000 cargo test --lib normalization_` for
        /// the longer run.
        #[test]
        fn normalization_is_idempotent_and_leaves_no_dot_segment(
            path in "/[a-zA-Z0-9./%~_-]{0,40}",
            merge in proptest::bool::ANY,
        ) {
            let edge = ListenerEdge { merge_slashes: merge, ..ListenerEdge::default() };
            if let Ok(once) = normalize_path(&path, &edge) {
                let twice = normalize_path(&once, &edge).expect("a normalized path is valid");
                proptest::prop_assert_eq!(&*once, &*twice);
                proptest::prop_assert!(once.starts_with('/'));
                proptest::prop_assert!(!has_dot_segment(once.as_bytes()), "{}", once);
                if merge {
                    proptest::prop_assert!(!once.contains("//"), "{}", once);
                }
            }
        }
    }

    #[test]
    fn trust_forwarded_trusts_every_peer_and_trusted_proxies_only_theirs() {
        let everyone = ListenerEdge {
            trust_forwarded: true,
            ..ListenerEdge::default()
        };
        let lan = ListenerEdge {
            trusted_proxies: vec!["10.0.0.0/8".parse().expect("cidr")],
            ..ListenerEdge::default()
        };
        let (inside, outside): (IpAddr, IpAddr) = (
            "10.1.2.3".parse().expect("ip"),
            "192.0.2.1".parse().expect("ip"),
        );
        assert!(everyone.trusts(inside) && everyone.trusts(outside));
        assert!(lan.trusts(inside) && !lan.trusts(outside));
        assert!(!keep().trusts(inside));
        let h = forwarding(&[("x-forwarded-for", "1.1.1.1")], &everyone);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.9");
    }

    #[test]
    fn smuggling_forms_are_named() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (n, v) in pairs {
                map.append(HeaderName::from_static(n), HeaderValue::from_static(v));
            }
            smuggling_risk(&map)
        };
        assert!(h(&[("transfer-encoding", "chunked"), ("content-length", "5")]).is_some());
        assert!(h(&[("transfer-encoding", "chunked, gzip")]).is_some());
        assert!(h(&[
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked")
        ])
        .is_some());
        assert!(h(&[("transfer-encoding", "gzip")]).is_some());
        assert!(h(&[("content-length", "5"), ("content-length", "6")]).is_some());
        assert!(h(&[("transfer-encoding", "gzip, chunked")]).is_some());
        assert!(h(&[("transfer-encoding", "Chunked")]).is_none());
        assert!(h(&[("content-length", "5"), ("content-length", "5")]).is_none());
        assert!(h(&[("content-length", "5")]).is_none());
    }
}

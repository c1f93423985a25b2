//! Which answers a route's `compress` applies to (DESIGN §17): the
//! encoding a client accepts, chosen when the request comes in
//! (`Accept-Encoding` q-values over the route's order of preference),
//! and, once the answer's head is known, whether it is worth and allowed
//! compressing. The compressing itself is `encode.rs`'s.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::body::ResponseBody;
use super::encode::{Compressing, Encoder};
use crate::plan::{Compress, Encoding};
use crate::telemetry::access::Trail;

/// More entries than this in `Accept-Encoding` and the answer goes
/// uncompressed: no real client sends them, and reading them costs.
const MAX_ENTRIES: usize = 64;

/// A route's `compress` for one request: the encoding its client
/// accepts, if any.
pub(super) struct CompressMark<'g> {
    compress: &'g Compress,
    chosen: Option<Encoding>,
    /// The answer has no body to compress (its head still says what a
    /// `GET` would get).
    head: bool,
    /// HTTP/1.0 has no chunked framing: a compressed answer would have
    /// to end with its connection.
    http10: bool,
}

impl<'g> CompressMark<'g> {
    pub(super) fn of<B>(compress: &'g Compress, req: &http::Request<B>) -> Self {
        CompressMark {
            compress,
            chosen: negotiate(&compress.encodings, req.headers()),
            head: req.method() == http::Method::HEAD,
            http10: req.version() < http::Version::HTTP_11,
        }
    }

    /// Compresses `response` when it may be: returns the encoding used.
    /// An answer that would be compressed for another client says it
    /// varies by `Accept-Encoding` either way.
    pub(super) fn apply(
        self,
        response: &mut Response<ResponseBody>,
        trail: Option<&Arc<Trail>>,
    ) -> Option<Encoding> {
        let length = eligible(self.compress, response)?;
        add_vary(response.headers_mut());
        let encoding = self.chosen.filter(|_| !self.http10)?;
        // The encoder first: an answer whose encoder cannot be set up goes
        // as it is, head untouched.
        let encoder = match self.head {
            true => None,
            false => match Encoder::new(encoding, self.compress.level, length) {
                Ok(encoder) => Some(encoder),
                Err(error) => {
                    tracing::warn!(%error, encoding = encoding.token(), "compressor set-up failed");
                    return None;
                }
            },
        };
        let headers = response.headers_mut();
        headers.remove(header::CONTENT_LENGTH);
        // Byte ranges of the compressed answer are not ranges of the
        // backend's: none are offered.
        headers.remove(header::ACCEPT_RANGES);
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(encoding.token()),
        );
        weaken_etag(headers);
        if let Some(encoder) = encoder {
            let body = std::mem::replace(response.body_mut(), ResponseBody::Full(None));
            *response.body_mut() =
                ResponseBody::Compressed(Box::new(Compressing::new(body, encoder, trail.cloned())));
        }
        Some(encoding)
    }
}

/// The encoding to use for a client's `Accept-Encoding`: the highest
/// q-value among the route's encodings (a `*` covers those not named),
/// ties going to the route's order. None without the header, for a
/// malformed or oversized one, or when nothing acceptable is offered
/// (`identity` is always acceptable in practice: the answer goes as it
/// is).
pub(super) fn negotiate(offered: &[Encoding], headers: &HeaderMap) -> Option<Encoding> {
    // Thousandths, per offered encoding (at most three).
    let mut weights: [Option<u16>; 3] = [None; 3];
    let mut any = None;
    let mut entries = 0;
    for line in headers.get_all(header::ACCEPT_ENCODING) {
        let text = line.to_str().ok()?;
        for item in text.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            entries += 1;
            if entries > MAX_ENTRIES {
                return None;
            }
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or_default().trim();
            let mut weight = 1000;
            for param in parts {
                let param = param.trim();
                if let Some(q) = param
                    .strip_prefix("q=")
                    .or_else(|| param.strip_prefix("Q="))
                {
                    // An unreadable q-value is no acceptance.
                    weight = qvalue(q).unwrap_or(0);
                }
            }
            if coding == "*" {
                any = Some(weight);
                continue;
            }
            for (slot, encoding) in weights.iter_mut().zip(offered) {
                if encoding.named(coding) {
                    *slot = Some(slot.map_or(weight, |w| w.max(weight)));
                }
            }
        }
    }
    let mut best: Option<(u16, Encoding)> = None;
    for (weight, encoding) in weights.iter().zip(offered) {
        let Some(weight) = weight.or(any).filter(|w| *w > 0) else {
            continue;
        };
        if best.is_none_or(|(w, _)| weight > w) {
            best = Some((weight, *encoding));
        }
    }
    best.map(|(_, encoding)| encoding)
}

/// `0`, `0.5`, `1.000`: thousandths.
fn qvalue(text: &str) -> Option<u16> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: u16 = match whole {
        "0" => 0,
        "1" => 1000,
        _ => return None,
    };
    for (i, digit) in fraction.bytes().enumerate() {
        thousandths += u16::from(digit - b'0') * [100, 10, 1].get(i).copied().unwrap_or(0);
    }
    (thousandths <= 1000).then_some(thousandths)
}

/// Whether `response` may be compressed under `compress`: `Some` with
/// its length when known. Not: an answer without a body to speak of
/// (1xx, 204, 304), a range (206, `Content-Range`), one already encoded,
/// one the backend marked `no-transform`, one of a type not listed or
/// without a type, a gRPC answer, or one known to be under `min_bytes`.
fn eligible(compress: &Compress, response: &Response<ResponseBody>) -> Option<Option<u64>> {
    let status = response.status();
    if status.is_informational()
        || matches!(
            status,
            StatusCode::NO_CONTENT | StatusCode::PARTIAL_CONTENT | StatusCode::NOT_MODIFIED
        )
    {
        return None;
    }
    let headers = response.headers();
    // The length first: most answers too short to compress stop here,
    // after one lookup.
    let length = match headers.get(header::CONTENT_LENGTH) {
        Some(value) => Some(
            std::str::from_utf8(value.as_bytes())
                .ok()?
                .parse::<u64>()
                .ok()?,
        ),
        None => http_body::Body::size_hint(response.body()).exact(),
    };
    // An empty body has nothing to gain, whatever `min_bytes` says.
    if length.is_some_and(|n| n == 0 || n < compress.min_bytes) {
        return None;
    }
    let (top, sub) = essence(headers.get(header::CONTENT_TYPE)?.as_bytes())?;
    // gRPC (and gRPC-Web) compresses its own messages.
    if top.eq_ignore_ascii_case("application")
        && sub.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("grpc"))
    {
        return None;
    }
    if !compress.types.iter().any(|t| t.admits(top, sub)) {
        return None;
    }
    if headers.contains_key(header::CONTENT_RANGE) {
        return None;
    }
    // Coded already (even if the backend lied: the gateway never
    // decodes, so never codes twice). `identity` is no coding.
    if headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        return None;
    }
    let no_transform = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| d.trim().eq_ignore_ascii_case("no-transform"));
    if no_transform {
        return None;
    }
    Some(length)
}

/// A `Content-Type`'s type and subtype, without parameters.
fn essence(value: &[u8]) -> Option<(&str, &str)> {
    let end = memchr::memchr(b';', value).unwrap_or(value.len());
    let text = std::str::from_utf8(value.get(..end)?).ok()?.trim_ascii();
    text.split_once('/')
}

/// `Vary: Accept-Encoding`, unless the answer says so already (or
/// varies by everything).
fn add_vary(headers: &mut HeaderMap) {
    let said = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|name| name == "*" || name.eq_ignore_ascii_case("accept-encoding"));
    if !said {
        headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
}

/// A strong validator names the backend's bytes, not the gateway's: it
/// becomes weak (`W/"…"`).
fn weaken_etag(headers: &mut HeaderMap) {
    let Some(etag) = headers.get(header::ETAG) else {
        return;
    };
    if etag.as_bytes().starts_with(b"W/") {
        return;
    }
    let mut weak = Vec::with_capacity(etag.len() + 2);
    weak.extend_from_slice(b"W/");
    weak.extend_from_slice(etag.as_bytes());
    match HeaderValue::from_bytes(&weak) {
        Ok(value) => {
            headers.insert(header::ETAG, value);
        }
        Err(_) => {
            headers.remove(header::ETAG);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).unwrap(),
        );
        headers
    }

    const ALL: &[Encoding] = &Encoding::ALL;

    #[test]
    fn the_clients_q_values_rank_first_then_the_routes_order() {
        use Encoding::*;
        assert_eq!(
            negotiate(ALL, &accept("gzip, deflate, br, zstd")),
            Some(Zstd)
        );
        assert_eq!(negotiate(ALL, &accept("gzip, br;q=0.9")), Some(Gzip));
        assert_eq!(
            negotiate(ALL, &accept("gzip;q=0.5, br;q=0.9")),
            Some(Brotli)
        );
        assert_eq!(negotiate(&[Gzip, Brotli], &accept("br, gzip")), Some(Gzip));
        assert_eq!(negotiate(ALL, &accept("x-gzip")), Some(Gzip));
        assert_eq!(negotiate(ALL, &accept("GZIP;Q=1.0")), Some(Gzip));
        assert_eq!(negotiate(ALL, &accept("*")), Some(Zstd));
        assert_eq!(negotiate(ALL, &accept("*;q=0.1, zstd;q=0")), Some(Brotli));
        assert_eq!(negotiate(ALL, &accept("*;q=0")), None);
        assert_eq!(negotiate(ALL, &accept("identity")), None);
        assert_eq!(negotiate(ALL, &accept("identity;q=0")), None);
        assert_eq!(negotiate(ALL, &accept("gzip;q=0")), None);
        assert_eq!(negotiate(ALL, &accept("gzip;q=2")), None);
        assert_eq!(negotiate(ALL, &accept("gzip;q=0.0001")), None);
        assert_eq!(negotiate(ALL, &accept("deflate")), None);
        assert_eq!(negotiate(&[Gzip], &accept("br")), None);
        assert_eq!(negotiate(ALL, &HeaderMap::new()), None);
        // Two lines are one list.
        let mut headers = accept("br;q=0.5");
        headers.append(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        assert_eq!(negotiate(ALL, &headers), Some(Gzip));
    }

    #[test]
    fn oversized_accept_encodings_get_the_answer_as_it_is() {
        let many = vec!["x-custom"; 1000].join(", ") + ", gzip";
        assert_eq!(negotiate(ALL, &accept(&many)), None);
        let long = format!("{}, gzip", "a".repeat(10 * 1024));
        assert_eq!(negotiate(ALL, &accept(&long)), Some(Encoding::Gzip));
    }

    #[test]
    fn q_values_read_up_to_three_decimals() {
        assert_eq!(qvalue("1"), Some(1000));
        assert_eq!(qvalue("1.000"), Some(1000));
        assert_eq!(qvalue("0.5"), Some(500));
        assert_eq!(qvalue("0.125"), Some(125));
        assert_eq!(qvalue("0"), Some(0));
        for bad in ["1.5", "2", "0.1234", "", ".5", "0.x", "-1"] {
            assert_eq!(qvalue(bad), None, "{bad}");
        }
    }

    fn compress() -> Compress {
        Compress {
            encodings: Encoding::ALL.to_vec(),
            min_bytes: 100,
            types: vec![crate::plan::MediaRange::Type("text".into())],
            level: crate::plan::Level::Default,
        }
    }

    fn answer(
        status: u16,
        headers: &[(&str, &str)],
        body: &'static [u8],
    ) -> Response<ResponseBody> {
        let mut response = Response::new(ResponseBody::full(bytes::Bytes::from_static(body)));
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in headers {
            response.headers_mut().append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        response
    }

    #[test]
    fn only_plain_listed_long_enough_answers_are_eligible() {
        let c = compress();
        let long = &[b'a'; 200];
        let text = ("content-type", "text/plain");
        assert_eq!(eligible(&c, &answer(200, &[text], long)), Some(Some(200)));
        assert_eq!(eligible(&c, &answer(404, &[text], long)), Some(Some(200)));
        assert_eq!(
            eligible(&c, &answer(200, &[text, ("content-length", "5000")], b"")),
            Some(Some(5000))
        );
        assert_eq!(eligible(&c, &answer(200, &[text], b"short")), None);
        assert_eq!(eligible(&c, &answer(206, &[text], long)), None);
        assert_eq!(eligible(&c, &answer(304, &[text], b"")), None);
        assert_eq!(eligible(&c, &answer(204, &[text], b"")), None);
        assert_eq!(
            eligible(&c, &answer(200, &[("content-type", "image/png")], long)),
            None
        );
        assert_eq!(eligible(&c, &answer(200, &[], long)), None);
        assert_eq!(
            eligible(
                &c,
                &answer(200, &[text, ("content-encoding", "gzip")], long)
            ),
            None
        );
        assert_eq!(
            eligible(
                &c,
                &answer(200, &[text, ("content-encoding", "identity")], long)
            ),
            Some(Some(200))
        );
        assert_eq!(
            eligible(
                &c,
                &answer(200, &[text, ("content-range", "bytes 0-199/400")], long)
            ),
            None
        );
        assert_eq!(
            eligible(
                &c,
                &answer(
                    200,
                    &[text, ("cache-control", "public, No-Transform")],
                    long
                )
            ),
            None
        );
        assert_eq!(
            eligible(&c, &answer(200, &[text, ("content-length", "x")], long)),
            None
        );
    }

    #[test]
    fn empty_answers_are_never_compressed() {
        let c = Compress {
            min_bytes: 0,
            ..compress()
        };
        let text = ("content-type", "text/plain");
        assert_eq!(eligible(&c, &answer(200, &[text], b"")), None);
        assert_eq!(eligible(&c, &answer(200, &[text], b"x")), Some(Some(1)));
    }

    #[test]
    fn etags_weaken_and_vary_is_said_once() {
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
        weaken_etag(&mut headers);
        assert_eq!(headers[header::ETAG], "W/\"abc\"");
        weaken_etag(&mut headers);
        assert_eq!(headers[header::ETAG], "W/\"abc\"");
        headers.insert(
            header::VARY,
            HeaderValue::from_static("Origin, Accept-Encoding"),
        );
        add_vary(&mut headers);
        assert_eq!(headers.get_all(header::VARY).iter().count(), 1);
        headers.insert(header::VARY, HeaderValue::from_static("origin"));
        add_vary(&mut headers);
        let vary: Vec<_> = headers.get_all(header::VARY).iter().collect();
        assert_eq!(vary, ["origin", "accept-encoding"]);
    }
}

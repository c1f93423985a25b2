//! Connection fields: the headers that describe one hop and never cross
//! the proxy (RFC 9110 §7.6.1), and the client-certificate headers only
//! the gateway may set. Stripped from requests on their way up and from
//! answers on their way down, by every front. A leaf.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::backends::header_tokens;

/// Headers that describe one connection and must not cross the proxy
/// (RFC 9110 §7.6.1), plus any the `Connection` header names.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip(headers, false, false);
}

/// The index of `TE` in `HOP_BY_HOP`.
const TE: usize = 5;

/// What the gateway says of a client certificate (listener
/// `tls.client_identity_headers`): never taken from the client.
pub static CLIENT_CERT_SUBJECT: HeaderName = HeaderName::from_static("x-client-cert-subject");
pub static CLIENT_CERT_SAN: HeaderName = HeaderName::from_static("x-client-cert-san");
pub static CLIENT_CERT_FINGERPRINT: HeaderName =
    HeaderName::from_static("x-client-cert-fingerprint");
/// Their common start; their lengths are 17, 21 and 25.
const CLIENT_CERT: &str = "x-client-cert-";

/// Strips hop-by-hop headers; with `keep_trailers`, a `TE` that lists
/// `trailers` is forwarded as `te: trailers` (that value only). For a
/// `request`, the `x-client-cert-*` headers a client sent go as well
/// (only the gateway says who a certificate names).
pub fn strip(headers: &mut HeaderMap, keep_trailers: bool, request: bool) {
    // One pass over the names says which of them are here; only those
    // are removed. Most messages carry none; most that do carry only
    // `Connection: keep-alive` (every nginx response), and for that a
    // removal of each of ten names cost thousands of instructions a
    // response (`docs/performance.md`).
    let mut present = 0u16;
    for name in headers.keys() {
        // The names' lengths (2, 7, 10, 16–19, 21, 25) rule most fields
        // out before any comparison.
        if !matches!(name.as_str().len(), 2 | 7 | 10 | 16..=19 | 21 | 25) {
            continue;
        }
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present |= 1 << i;
        } else if name == header::TRANSFER_ENCODING {
            present |= 1 << HOP_BY_HOP.len();
        } else if request && name.as_str().starts_with(CLIENT_CERT) {
            present |= 1 << (HOP_BY_HOP.len() + 1);
        }
    }
    if present == 0 {
        return;
    }
    // Headers the `Connection` field names, besides the listed ones and
    // its own options (`close`, `keep-alive`, `upgrade` are names or
    // options already covered).
    if present & 1 != 0 {
        let named: Vec<HeaderName> = header_tokens(headers, &header::CONNECTION)
            .filter(|token| {
                !token.eq_ignore_ascii_case("close")
                    && !HOP_BY_HOP
                        .iter()
                        .any(|h| token.eq_ignore_ascii_case(h.as_str()))
            })
            .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    let trailers = keep_trailers
        && present & (1 << TE) != 0
        && header_tokens(headers, &header::TE).any(|t| t.eq_ignore_ascii_case("trailers"));
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    // Framing is re-done by our own client and server.
    if present & (1 << HOP_BY_HOP.len()) != 0 {
        headers.remove(header::TRANSFER_ENCODING);
    }
    if present & (1 << (HOP_BY_HOP.len() + 1)) != 0 {
        for name in [
            &CLIENT_CERT_SUBJECT,
            &CLIENT_CERT_SAN,
            &CLIENT_CERT_FINGERPRINT,
        ] {
            headers.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn stripping_leaves_end_to_end_headers_alone() {
        let mut h = headers(&[("content-length", "5"), ("x-app", "1"), ("date", "now")]);
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }

    #[test]
    fn stripping_removes_hop_by_hop_and_connection_named_headers() {
        let mut h = headers(&[
            ("connection", "close, x-session"),
            ("x-session", "abc"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-app", "1"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h, headers(&[("x-app", "1")]));
        // A lone Transfer-Encoding is framing: gone as well.
        let mut h = headers(&[("transfer-encoding", "chunked"), ("x-app", "1")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h, headers(&[("x-app", "1")]));
    }

    #[test]
    fn connection_options_and_listed_names_need_no_second_removal() {
        let mut h = headers(&[
            ("connection", "keep-alive, Upgrade, X-Trace"),
            ("keep-alive", "timeout=5"),
            ("x-trace", "1"),
            ("x-app", "1"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h, headers(&[("x-app", "1")]));
    }

    #[test]
    fn te_trailers_alone_crosses_to_http2_backends() {
        assert_eq!(HOP_BY_HOP[TE], header::TE);
        let mut h = headers(&[("te", "trailers, deflate;q=0.5"), ("x-app", "1")]);
        strip(&mut h, true, true);
        assert_eq!(h, headers(&[("x-app", "1"), ("te", "trailers")]));
        let mut h = headers(&[("te", "deflate"), ("x-app", "1")]);
        strip(&mut h, true, true);
        assert_eq!(h, headers(&[("x-app", "1")]));
        let mut h = headers(&[("te", "trailers"), ("x-app", "1")]);
        strip(&mut h, false, true);
        assert_eq!(h, headers(&[("x-app", "1")]));
    }

    #[test]
    fn a_client_cannot_send_the_identity_headers_of_a_certificate() {
        for name in [
            &CLIENT_CERT_SUBJECT,
            &CLIENT_CERT_SAN,
            &CLIENT_CERT_FINGERPRINT,
        ] {
            assert!(matches!(name.as_str().len(), 17 | 21 | 25), "{name}");
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("CN=admin"));
            h.insert("x-app", HeaderValue::from_static("1"));
            strip(&mut h, false, true);
            assert_eq!(h, headers(&[("x-app", "1")]), "{name}");
        }
        // A lookalike stays; responses keep theirs.
        let mut h = headers(&[("x-client-cert-other", "1")]);
        strip(&mut h, false, true);
        assert_eq!(h.len(), 1);
        let mut h = headers(&[("x-client-cert-subject", "CN=x")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn each_hop_by_hop_header_alone_is_stripped() {
        // The quick check by name and the list of removals must agree.
        for name in HOP_BY_HOP.iter().chain([&header::TRANSFER_ENCODING]) {
            assert!(
                matches!(name.as_str().len(), 2 | 7 | 10 | 16..=19),
                "{name}: outside the lengths the scan looks at"
            );
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            h.insert("x-app", HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h, headers(&[("x-app", "1")]), "{name}");
        }
    }
}

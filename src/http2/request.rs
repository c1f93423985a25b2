//! A request from its decoded fields (RFC 9113 §8.3).

use http::header::{self, HeaderName};
use http::{HeaderMap, Method, Request, Uri};

use super::hpack::Field;

/// Fields that belong to one HTTP/1 connection and have no place on
/// HTTP/2 (§8.2.2).
pub fn connection_specific(name: &HeaderName) -> bool {
    *name == header::CONNECTION
        || *name == header::TRANSFER_ENCODING
        || *name == header::UPGRADE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// The request of `fields` and its `content-length`; `None` when it is
/// malformed (a stream error): pseudo-fields after regular ones, twice,
/// missing or unknown, connection-specific fields, `te` other than
/// `trailers`, differing lengths.
pub fn build(fields: &mut Vec<Field>) -> Option<(Request<()>, Option<u64>)> {
    let (mut method, mut scheme, mut authority, mut path) = (None, None, None, None);
    let mut headers = HeaderMap::with_capacity(fields.len());
    let mut regular = false;
    let mut length: Option<u64> = None;
    for field in fields.drain(..) {
        let (slot, value) = match field {
            Field::Header(name, value) => {
                regular = true;
                if connection_specific(&name) || (name == header::TE && value != "trailers") {
                    return None;
                }
                if name == header::CONTENT_LENGTH {
                    let n = std::str::from_utf8(value.as_bytes()).ok()?.parse().ok()?;
                    if length.is_some_and(|seen| seen != n) {
                        return None;
                    }
                    length = Some(n);
                }
                headers.append(name, value);
                continue;
            }
            Field::Method(v) => (&mut method, v),
            Field::Scheme(v) => (&mut scheme, v),
            Field::Authority(v) => (&mut authority, v),
            Field::Path(v) => (&mut path, v),
            // Extended CONNECT is not offered; responses' own field.
            Field::Protocol(_) | Field::Status(_) | Field::Invalid(..) => return None,
        };
        if regular || slot.is_some() {
            return None;
        }
        *slot = Some(value);
    }
    let method = Method::from_bytes(&method?).ok()?;
    let mut parts = http::uri::Parts::default();
    if let Some(authority) = authority {
        parts.authority = Some(http::uri::Authority::from_maybe_shared(authority).ok()?);
    }
    if method == Method::CONNECT {
        // §8.5: :authority only.
        if scheme.is_some() || path.is_some() || parts.authority.is_none() {
            return None;
        }
    } else {
        parts.scheme = Some(http::uri::Scheme::try_from(&scheme?[..]).ok()?);
        let path = path?;
        if path.is_empty() {
            return None;
        }
        parts.path_and_query = Some(http::uri::PathAndQuery::from_maybe_shared(path).ok()?);
    }
    let uri = Uri::from_parts(parts).ok()?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = http::Version::HTTP_2;
    *request.headers_mut() = headers;
    Some((request, length))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::HeaderValue;

    fn fields(list: &[(&str, &str)]) -> Vec<Field> {
        list.iter()
            .map(|(n, v)| {
                let v = Bytes::copy_from_slice(v.as_bytes());
                match *n {
                    ":method" => Field::Method(v),
                    ":scheme" => Field::Scheme(v),
                    ":authority" => Field::Authority(v),
                    ":path" => Field::Path(v),
                    ":protocol" => Field::Protocol(v),
                    name => Field::Header(
                        HeaderName::from_bytes(name.as_bytes()).unwrap(),
                        HeaderValue::from_maybe_shared(v).unwrap(),
                    ),
                }
            })
            .collect()
    }

    const GET: [(&str, &str); 4] = [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "a.example"),
        (":path", "/p?q=1"),
    ];

    #[test]
    fn a_request_takes_its_pseudo_fields_and_headers() {
        let mut list = GET.to_vec();
        list.push(("content-length", "0"));
        list.push(("cookie", "a=1"));
        list.push(("cookie", "b=2"));
        let (request, length) = build(&mut fields(&list)).unwrap();
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri(), "https://a.example/p?q=1");
        assert_eq!(request.version(), http::Version::HTTP_2);
        assert_eq!(request.headers().get_all("cookie").iter().count(), 2);
        assert_eq!(length, Some(0));
    }

    #[test]
    fn malformed_requests_are_refused() {
        let cases: Vec<Vec<(&str, &str)>> = vec![
            vec![
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", "a"),
            ],
            vec![(":method", "GET"), (":path", "/"), (":authority", "a")],
            vec![(":scheme", "https"), (":path", "/")],
            [&GET[..], &[(":path", "/again")]].concat(),
            [&GET[..1], &[("x-a", "1")], &GET[1..]].concat(),
            [&GET[..], &[("connection", "close")]].concat(),
            [&GET[..], &[("transfer-encoding", "chunked")]].concat(),
            [&GET[..], &[("te", "gzip")]].concat(),
            [&GET[..], &[(":protocol", "websocket")]].concat(),
            [
                &GET[..],
                &[("content-length", "1"), ("content-length", "2")],
            ]
            .concat(),
            [&GET[..], &[("content-length", "x")]].concat(),
            vec![(":method", "GET"), (":scheme", "https"), (":path", "")],
            vec![
                (":method", "CONNECT"),
                (":authority", "a:443"),
                (":path", "/"),
            ],
        ];
        for case in cases {
            assert!(build(&mut fields(&case)).is_none(), "{case:?}");
        }
        let mut te = GET.to_vec();
        te.push(("te", "trailers"));
        assert!(build(&mut fields(&te)).is_some());
        let connect = [(":method", "CONNECT"), (":authority", "a.example:443")];
        let (request, _) = build(&mut fields(&connect)).unwrap();
        assert_eq!(request.uri().authority().unwrap(), "a.example:443");
    }
}

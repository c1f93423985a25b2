//! The hit of a request that says nothing of caching, worked out once.
//!
//! A request without `Cache-Control` and `Pragma` leaves RFC 9111's
//! decision (as `http-cache-semantics` makes it: `before_request`) to
//! what the stored answer was stored with: the request's URI, `Host` and
//! the headers the answer's `Vary` names must be those it was stored
//! for, and the answer must still be fresh (§4.2). The head the crate
//! then answers is the stored head without hop-by-hop fields, with `Age`
//! (§5.1) and `Date` set; the `Warning` it adds past a day of age is
//! left to the crate. So that head is made once, when the answer is
//! stored, and a hit clones it and sets the two fields: the crate's
//! answer, without parsing the stored head's `Cache-Control`, copying
//! its fields by name and formatting two dates on every hit.

use std::time::{Duration, SystemTime};

use http::{header, response, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use http_cache_semantics::{BeforeRequest, CachePolicy, RequestLike};

/// Past this age the crate may add `Warning: 113` (RFC 7234 §5.5.4): it
/// decides from then on.
const DAY: Duration = Duration::from_secs(24 * 3600);

/// What a plain hit answers, made when the answer was stored.
#[derive(Debug)]
pub(super) struct Plain {
    status: StatusCode,
    version: Version,
    /// The head as shown, but for `Age` and `Date`.
    headers: HeaderMap,
    uri: http::Uri,
    host: Option<HeaderValue>,
    /// When it was stored, and the age the policy gave it then.
    at: SystemTime,
    age_at: Duration,
}

impl Plain {
    /// The head `policy` answers `request` with at `at`, the time it is
    /// stored, made into `show` (the head as clients see it); `None` when
    /// it is not fresh then, is older than a day, or varies on `*`.
    pub(super) fn new(
        policy: &CachePolicy,
        request: &impl RequestLike,
        selected: &[(HeaderName, Option<HeaderValue>)],
        at: SystemTime,
        show: impl FnOnce(response::Parts) -> response::Parts,
    ) -> Option<Box<Self>> {
        if selected.iter().any(|(name, _)| name.as_str() == "*") {
            return None;
        }
        let age_at = policy.age(at);
        if age_at > DAY || request.method() != Method::GET {
            return None;
        }
        let BeforeRequest::Fresh(head) = policy.before_request(request, at) else {
            return None;
        };
        let mut head = show(head);
        head.headers.remove(header::AGE);
        head.headers.remove(header::DATE);
        Some(Box::new(Self {
            status: head.status,
            version: head.version,
            headers: head.headers,
            uri: request.uri(),
            host: request.headers().get(header::HOST).cloned(),
            at,
            age_at,
        }))
    }

    /// The bytes it holds besides what the policy holds: its copy of the
    /// head's fields and the URI (counted in the zone's size).
    pub(super) fn weight(&self) -> u64 {
        let fields: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len())
            .sum();
        (fields + self.uri.to_string().len() + 64) as u64
    }

    /// The head to answer `request` with at `now`, if the request says
    /// nothing of caching and matches what was stored (`selected`: the
    /// `Vary`'d values it was stored with) and the answer is fresh until
    /// `fresh_until`; `None` leaves the decision to the policy.
    pub(super) fn hit(
        &self,
        request: &impl RequestLike,
        selected: &[(HeaderName, Option<HeaderValue>)],
        fresh_until: SystemTime,
        now: SystemTime,
    ) -> Option<response::Parts> {
        let headers = request.headers();
        if headers.contains_key(header::CACHE_CONTROL)
            || headers.contains_key(header::PRAGMA)
            || request.method() != Method::GET
            || now >= fresh_until
            || headers.get(header::HOST) != self.host.as_ref()
            || !selected
                .iter()
                .all(|(name, value)| headers.get(name) == value.as_ref())
            || !request.is_same_uri(&self.uri)
        {
            return None;
        }
        let age = self.age_at + now.duration_since(self.at).ok()?;
        if age > DAY {
            return None;
        }
        let (mut head, ()) = http::Response::new(()).into_parts();
        head.status = self.status;
        head.version = self.version;
        head.headers = self.headers.clone();
        let mut digits = itoa::Buffer::new();
        head.headers.insert(
            header::AGE,
            HeaderValue::from_str(digits.format(age.as_secs())).ok()?,
        );
        head.headers
            .insert(header::DATE, crate::clock::http_date(now));
        Some(head)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Keepable, Stored};
    use super::*;
    use bytes::Bytes;
    use http::request;

    fn request(method: Method, uri: &str, headers: &[(&str, &str)]) -> request::Parts {
        let mut builder = http::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn answer(headers: &[(&str, &str)]) -> response::Parts {
        let mut builder = http::Response::builder().status(200);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    type Fields<'a> = Vec<(&'a str, &'a str)>;

    /// Status, version and every field, in a comparable order.
    fn fields(head: &response::Parts) -> (StatusCode, Version, Vec<(String, Vec<u8>)>) {
        let mut fields: Vec<_> = head
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        fields.sort();
        (head.status, head.version, fields)
    }

    /// The plain hit is the policy's answer, field for field, wherever it
    /// answers; and it answers the plain request while fresh.
    #[test]
    fn a_plain_hit_is_what_the_policy_answers() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let date = httpdate::fmt_http_date(at);
        let expires = httpdate::fmt_http_date(at + Duration::from_secs(90));
        let old = httpdate::fmt_http_date(at - Duration::from_secs(400 * 24 * 3600));
        // Each answer's fields, and the route's `ttl_default`.
        let answers: Vec<(Fields, Option<Duration>)> = vec![
            (vec![("cache-control", "max-age=60")], None),
            (vec![("cache-control", "max-age=60"), ("age", "30")], None),
            (vec![("cache-control", "max-age=10, s-maxage=60")], None),
            (vec![("cache-control", "no-cache"), ("etag", "\"a\"")], None),
            (vec![("date", &date), ("expires", &expires)], None),
            (vec![("date", &date), ("last-modified", &old)], None),
            (
                vec![("cache-control", "max-age=60"), ("vary", "Accept-Encoding")],
                None,
            ),
            (vec![("cache-control", "max-age=60"), ("vary", "*")], None),
            (
                vec![
                    ("cache-control", "max-age=60"),
                    ("connection", "x-hop"),
                    ("x-hop", "1"),
                    ("keep-alive", "timeout=5"),
                    ("x-kept", "2"),
                ],
                None,
            ),
            (vec![("x-silent", "1")], Some(Duration::from_secs(60))),
            (
                vec![("cache-control", "public"), ("x-silent", "1")],
                Some(Duration::from_secs(3 * 24 * 3600)),
            ),
        ];
        let stored_for = [("host", "app.test"), ("accept-encoding", "gzip")];
        let lookups = [
            request(Method::GET, "/a?x=1", &stored_for),
            request(Method::GET, "/a?x=1", &[("host", "app.test")]),
            request(
                Method::GET,
                "/a?x=1",
                &[("host", "other.test"), ("accept-encoding", "gzip")],
            ),
            request(Method::GET, "/a?x=2", &stored_for),
            request(Method::HEAD, "/a?x=1", &stored_for),
            request(
                Method::GET,
                "/a?x=1",
                &[
                    ("host", "app.test"),
                    ("accept-encoding", "gzip"),
                    ("cache-control", "no-cache"),
                ],
            ),
            request(
                Method::GET,
                "/a?x=1",
                &[
                    ("host", "app.test"),
                    ("accept-encoding", "gzip"),
                    ("cache-control", "max-age=0"),
                ],
            ),
            request(
                Method::GET,
                "/a?x=1",
                &[
                    ("host", "app.test"),
                    ("accept-encoding", "gzip"),
                    ("pragma", "no-cache"),
                ],
            ),
        ];
        let times = [
            0i64,
            1,
            9,
            10,
            29,
            30,
            59,
            60,
            61,
            89,
            90,
            3600,
            2 * 86400,
            4 * 86400,
            -5,
        ];
        let mut plain_hits = 0;
        for (fields_of_answer, ttl_default) in &answers {
            let stored_request = request(Method::GET, "/a?x=1", &stored_for);
            let head = answer(fields_of_answer);
            let stored: Stored = Keepable::new(&stored_request, &head, at, *ttl_default)
                .unwrap_or_else(|| panic!("storable: {fields_of_answer:?}"))
                .with_body(Bytes::from_static(b"body"));
            for lookup in &lookups {
                for t in times {
                    let now = if t >= 0 {
                        at + Duration::from_secs(t.unsigned_abs())
                    } else {
                        at - Duration::from_secs(t.unsigned_abs())
                    };
                    let Some(fast) = stored.plain_hit(lookup, now) else {
                        continue;
                    };
                    plain_hits += 1;
                    let slow = match stored.policy.before_request(lookup, now) {
                        BeforeRequest::Fresh(head) => stored.shown(head, now),
                        BeforeRequest::Stale { .. } => panic!(
                            "{fields_of_answer:?} at +{t}s for {lookup:?}: a plain hit where the policy says stale"
                        ),
                    };
                    assert_eq!(
                        fields(&fast),
                        fields(&slow),
                        "{fields_of_answer:?} at +{t}s for {lookup:?}"
                    );
                }
            }
        }
        // The plain request is answered without the policy while fresh:
        // the first lookup of most answers, at most of their times.
        assert!(plain_hits >= 40, "{plain_hits} plain hits");
        let stored_request = request(Method::GET, "/a?x=1", &stored_for);
        let stored = Keepable::new(&stored_request, &answer(&answers[0].0), at, None)
            .unwrap()
            .with_body(Bytes::new());
        let hit = stored.plain_hit(&stored_request, at + Duration::from_secs(5));
        assert_eq!(
            hit.as_ref().and_then(|h| h.headers.get(header::AGE)),
            Some(&HeaderValue::from_static("5"))
        );
    }
}

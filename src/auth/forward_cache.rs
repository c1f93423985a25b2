//! Forward auth's cache of answers (`forward = { …, cache = { ttl,
//! key_headers, max_entries } }`): an auth service's answer to one set of
//! credentials is kept and reused for the next requests that carry the
//! same ones, so that a client does not cost a second exchange on every
//! request.
//!
//! - **Key**: a salted SHA-256 of the listed request headers' values
//!   (`key_headers`, by default the `request_headers` the auth service is
//!   sent; validation refuses a key that leaves one of those out, as two
//!   clients differing only in it would share one answer). The names
//!   `x-forwarded-method`, `-uri`, `-host`, `-proto` and `-for` stand for
//!   the values the gateway sends the auth service under them, for an
//!   auth service that decides per path, host or client. Credentials are
//!   never held, only the hash.
//! - **What is kept**: an answer below 500: a 2xx (the identity its
//!   `response_headers` give) or a refusal (status, `Location`,
//!   `WWW-Authenticate`, `Content-Type`, body); never a 5xx, a timeout or
//!   a failure to connect (those follow `failure` every time).
//! - **For how long**: the auth service's `Cache-Control` decides within
//!   `ttl`: `s-maxage`, else `max-age`, never past `ttl`; `no-store`,
//!   `no-cache`, `private` or `max-age=0` keep nothing; without
//!   `Cache-Control`, `ttl`. (`Expires` is not read.)
//! - **Bounds**: `max_entries` per route; full, the expired entries go,
//!   and if all are live, all go.
//! - **Lifetime**: the cache belongs to the route's generation (an
//!   activation starts an empty one), and `reload-certs` empties it (a
//!   revoked credential is refused at once, without waiting for `ttl`).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::remember::Remembered;
use super::{Asked, Denial, Identity, Verdict};

/// Longest `ttl` validation takes.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// `max_entries` when not given, and the most validation takes.
pub const DEFAULT_ENTRIES: usize = 10_000;
pub const MAX_ENTRIES: usize = 1_000_000;

/// One part of the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The client's values of this header.
    Header(HeaderName),
    /// What the gateway sends the auth service under an `x-forwarded-*`
    /// name.
    Forwarded(Forwarded),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    Method,
    Uri,
    Host,
    Proto,
    For,
}

impl KeyPart {
    /// `name` as a key part: `x-forwarded-method`, `-uri`, `-host`,
    /// `-proto` or `-for` as what the gateway sends, another as the
    /// client's header.
    pub fn of(name: HeaderName) -> Self {
        let forwarded = match name.as_str() {
            "x-forwarded-method" => Forwarded::Method,
            "x-forwarded-uri" => Forwarded::Uri,
            "x-forwarded-host" => Forwarded::Host,
            "x-forwarded-proto" => Forwarded::Proto,
            "x-forwarded-for" => Forwarded::For,
            _ => return KeyPart::Header(name),
        };
        KeyPart::Forwarded(forwarded)
    }
}

/// An answer kept.
#[derive(Debug, Clone)]
enum Stored {
    Allowed(Identity),
    /// A refusal as the client gets it.
    Refused {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
}

#[derive(Debug)]
pub struct ForwardCache {
    pub ttl: Duration,
    key: Vec<KeyPart>,
    answers: Remembered<Stored>,
}

impl ForwardCache {
    pub fn new(ttl: Duration, key: Vec<KeyPart>, max_entries: usize) -> Self {
        Self {
            ttl,
            key,
            answers: Remembered::bounded(max_entries, ttl),
        }
    }

    /// The key of `asked`: each key part's name, how many values it has
    /// and the values, in order (so that neither "a" then "b" and "ab",
    /// nor a header sent empty and one not sent, nor one value under two
    /// names, can meet).
    pub fn key(&self, asked: &Asked<'_>) -> [u8; 32] {
        Remembered::<Stored>::key_with(|put| {
            for part in &self.key {
                match part {
                    KeyPart::Header(name) => {
                        let values = asked.headers.get_all(name);
                        put(name.as_str().as_bytes());
                        put(&(values.iter().count() as u32).to_be_bytes());
                        values.iter().for_each(|value| put(value.as_bytes()));
                    }
                    KeyPart::Forwarded(forwarded) => {
                        put(b"\0forwarded");
                        match forwarded {
                            Forwarded::Method => put(asked.method.as_str().as_bytes()),
                            Forwarded::Uri => put(asked
                                .uri
                                .path_and_query()
                                .map_or(b"/", |p| p.as_str().as_bytes())),
                            Forwarded::Host => {
                                put(asked.authority.map_or(&[][..], HeaderValue::as_bytes))
                            }
                            Forwarded::Proto => put(asked.scheme.as_bytes()),
                            Forwarded::For => put(asked.client.to_string().as_bytes()),
                        }
                    }
                }
            }
        })
    }

    /// The verdict kept under `key`, if a live one is.
    pub fn get(&self, key: &[u8; 32]) -> Option<Verdict> {
        self.answers.get(key).map(|stored| match stored {
            Stored::Allowed(identity) => Verdict::Allowed(identity),
            Stored::Refused {
                status,
                headers,
                body,
            } => {
                let mut answer = Response::new(body);
                *answer.status_mut() = status;
                *answer.headers_mut() = headers;
                Verdict::Denied(Denial::Answer(Box::new(answer)))
            }
        })
    }

    /// How long an answer with these headers may be kept (its
    /// `Cache-Control` within `ttl`); `None`: not at all.
    pub fn lifetime(&self, answered: &HeaderMap) -> Option<Duration> {
        lifetime(answered, self.ttl)
    }

    /// Keeps the verdict an answer made for `lifetime` (see
    /// [`ForwardCache::lifetime`]): only an allowance or the auth
    /// service's own refusal; returns whether it was kept.
    pub fn keep(&self, key: [u8; 32], lifetime: Option<Duration>, verdict: &Verdict) -> bool {
        let stored = match verdict {
            Verdict::Allowed(identity) => Stored::Allowed(identity.clone()),
            Verdict::Denied(Denial::Answer(answer)) => Stored::Refused {
                status: answer.status(),
                headers: answer.headers().clone(),
                body: answer.body().clone(),
            },
            // The service failed (5xx, no answer): asked again next time.
            Verdict::Denied(_) | Verdict::FailedOpen => return false,
        };
        let Some(lifetime) = lifetime else {
            return false;
        };
        self.answers.put(key, lifetime, stored);
        true
    }

    /// Forgets every answer; returns how many there were.
    pub fn clear(&self) -> usize {
        self.answers.clear()
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long an answer with these headers may be kept, at most `ttl`;
/// `None`: not at all.
pub fn lifetime(headers: &HeaderMap, ttl: Duration) -> Option<Duration> {
    let mut max_age = None;
    let mut s_maxage = None;
    for value in headers.get_all(http::header::CACHE_CONTROL) {
        // A value that is not text is not understood: keep nothing.
        let text = value.to_str().ok()?;
        for directive in text.split(',') {
            let (name, argument) = match directive.split_once('=') {
                Some((name, argument)) => (name.trim(), Some(argument.trim().trim_matches('"'))),
                None => (directive.trim(), None),
            };
            let seconds = || argument.and_then(|a| a.parse::<u64>().ok());
            if name.eq_ignore_ascii_case("no-store")
                || name.eq_ignore_ascii_case("no-cache")
                || name.eq_ignore_ascii_case("private")
            {
                return None;
            } else if name.eq_ignore_ascii_case("max-age") {
                // RFC 9111 §4.2.1: an invalid value is stale.
                max_age = Some(seconds().unwrap_or(0));
            } else if name.eq_ignore_ascii_case("s-maxage") {
                s_maxage = Some(seconds().unwrap_or(0));
            }
        }
    }
    match s_maxage.or(max_age) {
        Some(0) => None,
        Some(seconds) => Some(Duration::from_secs(seconds).min(ttl)),
        None => Some(ttl),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(cache_control: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in cache_control {
            headers.append(
                http::header::CACHE_CONTROL,
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn the_auth_service_says_how_long_within_the_ttl() {
        let ttl = Duration::from_secs(60);
        let cases: [(&[&str], Option<u64>); 10] = [
            (&[], Some(60)),
            (&["max-age=10"], Some(10)),
            (&["max-age=3600"], Some(60)),
            (&["public, max-age=10, s-maxage=20"], Some(20)),
            (&["S-MaxAge=\"5\""], Some(5)),
            (&["max-age=0"], None),
            (&["max-age=soon"], None),
            (&["no-store"], None),
            (&["max-age=30", "no-cache"], None),
            (&["private, max-age=30"], None),
        ];
        for (given, expected) in cases {
            assert_eq!(
                lifetime(&headers(given), ttl),
                expected.map(Duration::from_secs),
                "{given:?}"
            );
        }
    }

    fn asked<'a>(headers: &'a HeaderMap, uri: &'a http::Uri) -> Asked<'a> {
        Asked {
            method: &http::Method::GET,
            uri,
            headers,
            authority: None,
            scheme: "http",
            client: std::net::IpAddr::from([127, 0, 0, 1]),
        }
    }

    #[test]
    fn the_key_is_every_listed_value_and_nothing_else() {
        let cache = ForwardCache::new(
            Duration::from_secs(60),
            vec![
                KeyPart::of(HeaderName::from_static("authorization")),
                KeyPart::of(HeaderName::from_static("cookie")),
            ],
            16,
        );
        let uri: http::Uri = "/a".parse().unwrap();
        let key = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.append(*name, HeaderValue::from_static(value));
            }
            cache.key(&asked(&headers, &uri))
        };
        let alice = key(&[("authorization", "Bearer alice")]);
        assert_eq!(
            alice,
            key(&[("authorization", "Bearer alice"), ("x-other", "1")])
        );
        assert_ne!(alice, key(&[("authorization", "Bearer bob")]));
        assert_ne!(
            alice,
            key(&[("authorization", "Bearer alice"), ("cookie", "s=1")])
        );
        // Sent empty is not absent; values do not run into each other.
        assert_ne!(key(&[]), key(&[("authorization", "")]));
        assert_ne!(
            key(&[("authorization", "ab")]),
            key(&[("authorization", "a"), ("authorization", "b")])
        );
        assert_ne!(
            key(&[("authorization", "a")]),
            key(&[("cookie", "a")]),
            "the same value under another name"
        );
        // A forwarded part: the path and query the auth service is sent.
        let per_path = ForwardCache::new(
            Duration::from_secs(60),
            vec![
                KeyPart::of(HeaderName::from_static("authorization")),
                KeyPart::of(HeaderName::from_static("x-forwarded-uri")),
            ],
            16,
        );
        let headers = HeaderMap::new();
        let (a, b): (http::Uri, http::Uri) = ("/a?x=1".parse().unwrap(), "/b".parse().unwrap());
        assert_ne!(
            per_path.key(&asked(&headers, &a)),
            per_path.key(&asked(&headers, &b))
        );
        assert_eq!(
            per_path.key(&asked(&headers, &b)),
            per_path.key(&asked(&headers, &b))
        );
    }

    #[test]
    fn allowances_and_refusals_are_kept_and_failures_never() {
        let cache = ForwardCache::new(
            Duration::from_secs(60),
            vec![KeyPart::of(HeaderName::from_static("authorization"))],
            16,
        );
        let identity = Identity {
            subject: Some("alice".into()),
            headers: vec![(
                HeaderName::from_static("x-user"),
                HeaderValue::from_static("alice"),
            )],
            remove_credentials: false,
        };
        let none = cache.lifetime(&HeaderMap::new());
        assert_eq!(none, Some(Duration::from_secs(60)));
        assert!(cache.keep([1; 32], none, &Verdict::Allowed(identity)));
        let Some(Verdict::Allowed(kept)) = cache.get(&[1; 32]) else {
            panic!("the allowance is kept");
        };
        assert_eq!(kept.subject.as_deref(), Some("alice"));
        assert_eq!(kept.headers.len(), 1);
        let mut refusal = Response::new(Bytes::from_static(b"no"));
        *refusal.status_mut() = StatusCode::FORBIDDEN;
        let refused = Verdict::Denied(Denial::Answer(Box::new(refusal)));
        assert!(cache.keep([2; 32], none, &refused));
        match cache.get(&[2; 32]) {
            Some(Verdict::Denied(Denial::Answer(answer))) => {
                assert_eq!(answer.status(), StatusCode::FORBIDDEN);
                assert_eq!(answer.body(), "no");
            }
            other => panic!("the refusal is kept: {other:?}"),
        }
        // A 5xx or no answer (Unavailable), or failing open: never.
        assert!(!cache.keep([3; 32], none, &Verdict::Denied(Denial::Unavailable)));
        assert!(!cache.keep([4; 32], none, &Verdict::FailedOpen));
        assert!(cache.get(&[3; 32]).is_none() && cache.get(&[4; 32]).is_none());
        // The service says not to.
        let allowed = Verdict::Allowed(Identity::default());
        let lifetime = cache.lifetime(&headers(&["no-store"]));
        assert!(!cache.keep([5; 32], lifetime, &allowed));
        assert!(cache.get(&[5; 32]).is_none());
        assert_eq!(cache.clear(), 2);
        assert!(cache.get(&[1; 32]).is_none());
    }

    #[test]
    fn entries_stay_within_max_entries() {
        let cache = ForwardCache::new(Duration::from_secs(60), Vec::new(), 100);
        for n in 0..1_000u32 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&n.to_be_bytes());
            let lifetime = Some(Duration::from_secs(60));
            cache.keep(key, lifetime, &Verdict::Allowed(Identity::default()));
            assert!(cache.len() <= 100);
        }
    }
}

//! One stored answer (`Stored`) and what decides whether an answer may be
//! stored and for how long (`Keepable`: RFC 9111 through the
//! `http-cache-semantics` crate, `ttl_default`, RFC 5861 windows).

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{response, HeaderMap, HeaderName, HeaderValue};
use http_cache_semantics::{BeforeRequest, CacheOptions, CachePolicy, RequestLike};

use super::plain::Plain;
use crate::clock::http_date;

/// One stored answer: its policy (the request and response heads it was
/// stored from) and its body.
#[derive(Debug)]
pub struct Stored {
    pub policy: CachePolicy,
    pub body: Bytes,
    /// Surrogate keys (`Surrogate-Key`, `Cache-Tag`), for purges.
    pub tags: Box<[String]>,
    /// The request's values of the headers the answer's `Vary` names:
    /// a later answer with the same ones replaces this one.
    pub(super) selected: Box<[(HeaderName, Option<HeaderValue>)]>,
    /// Its `ETag` and `Last-Modified`, for a 304 that leaves them out.
    pub(super) validators: Box<[(HeaderName, HeaderValue)]>,
    /// Until when it is fresh (then stale, and perhaps still usable:
    /// [`Stored::stale_head`]).
    pub(super) fresh_until: SystemTime,
    pub(super) grace: Grace,
    /// The answer's own `Cache-Control` values when the route's
    /// `ttl_default` added a `max-age` to its policy: what clients see.
    pub(super) shown_cache_control: Option<Box<[HeaderValue]>>,
    pub(super) weight: u64,
    /// The head a request that says nothing of caching gets, made when
    /// it was stored (`plain.rs`); `None` for what was read from disk.
    pub(super) plain: Option<Box<Plain>>,
}

impl Stored {
    /// An answer to `request` (as forwarded) with `head` and `body`, if
    /// RFC 9111 lets a shared cache store it.
    pub fn new(
        request: &impl RequestLike,
        head: &response::Parts,
        body: Bytes,
        at: SystemTime,
    ) -> Option<Self> {
        Some(Keepable::new(request, head, at, None)?.with_body(body))
    }

    pub fn weight(&self) -> u64 {
        self.weight
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// `head` as clients see it: with the answer's own `Cache-Control`
    /// where `ttl_default` added to it, and the `Date` the policy set (to
    /// `now`) in RFC 9110's IMF-fixdate (the crate writes RFC 2822's
    /// `+0000`).
    pub(super) fn shown(&self, head: response::Parts, now: SystemTime) -> response::Parts {
        shown(self.shown_cache_control.as_deref(), head, now)
    }

    /// The head of a fresh hit on this object for `request` at `now`,
    /// when the request says nothing of caching: what the policy would
    /// answer, made when it was stored. `None`: ask the policy.
    pub(super) fn plain_hit(
        &self,
        request: &impl RequestLike,
        now: SystemTime,
    ) -> Option<response::Parts> {
        self.plain
            .as_ref()?
            .hit(request, &self.selected, self.fresh_until, now)
    }

    /// This object with `policy` (a 304 revalidated it at `at`, for
    /// `request`).
    pub(super) fn revalidated(
        &self,
        policy: CachePolicy,
        request: &impl RequestLike,
        at: SystemTime,
    ) -> Self {
        let plain = Plain::new(&policy, request, &self.selected, at, |head| {
            shown(self.shown_cache_control.as_deref(), head, at)
        });
        Stored {
            fresh_until: at + policy.time_to_live(at),
            policy,
            body: self.body.clone(),
            tags: self.tags.clone(),
            selected: self.selected.clone(),
            validators: self.validators.clone(),
            grace: self.grace,
            shown_cache_control: self.shown_cache_control.clone(),
            weight: self.weight,
            plain,
        }
    }

    /// The head to answer `request` with from this object, stale at
    /// `now`, for `use_`: if neither the answer nor the request forbids
    /// it and it is stale by no more than the window (the longer of the
    /// route's `window` and the answer's own RFC 5861 directive).
    pub fn stale_head(
        &self,
        request: &impl RequestLike,
        now: SystemTime,
        use_: StaleUse,
        window: Duration,
    ) -> Option<response::Parts> {
        let own = match use_ {
            StaleUse::WhileRevalidate => self.grace.while_revalidate,
            StaleUse::IfError => self.grace.if_error,
        };
        let route = if self.grace.own_only {
            Duration::ZERO
        } else {
            window
        };
        let window = route.max(own.unwrap_or_default());
        if self.grace.never || window.is_zero() {
            return None;
        }
        let stale_for = now.duration_since(self.fresh_until).unwrap_or_default();
        if stale_for > window {
            return None;
        }
        // The crate answers a stale object to a request that accepts
        // it (`max-stale`); what the request itself forbids (`no-cache`,
        // `max-age`) still holds.
        let accepting = AcceptingStale::new(request);
        match self.policy.before_request(&accepting, now) {
            BeforeRequest::Fresh(head) => Some(self.shown(head, now)),
            BeforeRequest::Stale { .. } => None,
        }
    }
}

/// `head` with the answer's own `Cache-Control` values (`own`, where
/// `ttl_default` added to the policy's) and the `Date` of `now`.
fn shown(
    own: Option<&[HeaderValue]>,
    mut head: response::Parts,
    now: SystemTime,
) -> response::Parts {
    if head.headers.contains_key(http::header::DATE) {
        head.headers.insert(http::header::DATE, http_date(now));
    }
    if let Some(values) = own {
        head.headers.remove(http::header::CACHE_CONTROL);
        for value in values {
            head.headers
                .append(http::header::CACHE_CONTROL, value.clone());
        }
    }
    head
}

/// What a stale object is answered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleUse {
    /// While one background request revalidates it.
    WhileRevalidate,
    /// Because the upstream failed.
    IfError,
}

/// What an answer's `Cache-Control` says about answering it stale.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Grace {
    /// Its own `stale-while-revalidate=N` and `stale-if-error=N` (RFC 5861).
    pub(super) while_revalidate: Option<Duration>,
    pub(super) if_error: Option<Duration>,
    /// `no-cache`, `must-revalidate`, `proxy-revalidate`: never answered
    /// stale (RFC 9111 §4.2.4).
    pub(super) never: bool,
    /// `s-maxage`, which carries `proxy-revalidate` for a shared cache
    /// (RFC 9111 §5.2.2.10): only the answer's own directives apply, not
    /// the route's windows.
    pub(super) own_only: bool,
}

impl Grace {
    fn of(headers: &HeaderMap) -> Self {
        let mut grace = Grace::default();
        let seconds = |value: Option<&str>| {
            value
                .and_then(|v| v.trim().trim_matches('"').parse::<u64>().ok())
                .map(Duration::from_secs)
        };
        for (name, value) in directives(headers) {
            match name.as_str() {
                "no-cache" | "must-revalidate" | "proxy-revalidate" => grace.never = true,
                "s-maxage" => grace.own_only = true,
                "stale-while-revalidate" => grace.while_revalidate = seconds(value),
                "stale-if-error" => grace.if_error = seconds(value),
                _ => {}
            }
        }
        grace
    }
}

/// A response's `Cache-Control` directives: names in lower case, and
/// their values.
fn directives(headers: &HeaderMap) -> impl Iterator<Item = (String, Option<&str>)> {
    headers
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|d| {
            let (name, value) = match d.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (d, None),
            };
            (name.trim().to_ascii_lowercase(), value)
        })
}

/// Whether an answer states its freshness (RFC 9111 §4.2.1): then
/// `ttl_default` does not apply.
fn states_freshness(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::EXPIRES)
        || directives(headers).any(|(name, _)| name == "max-age" || name == "s-maxage")
}

/// Statuses RFC 9110 §15.1 calls heuristically cacheable: the only ones
/// `ttl_default` makes fresh (never a 5xx but 501, never a 302).
fn heuristically_cacheable(status: http::StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// A request as it was, but accepting a stale answer (`max-stale`).
struct AcceptingStale<'a, R> {
    request: &'a R,
    headers: HeaderMap,
}

impl<'a, R: RequestLike> AcceptingStale<'a, R> {
    fn new(request: &'a R) -> Self {
        let mut headers = request.headers().clone();
        headers.append(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("max-stale"),
        );
        Self { request, headers }
    }
}

impl<R: RequestLike> RequestLike for AcceptingStale<'_, R> {
    fn uri(&self) -> http::Uri {
        self.request.uri()
    }

    fn is_same_uri(&self, other: &http::Uri) -> bool {
        self.request.is_same_uri(other)
    }

    fn method(&self) -> &http::Method {
        self.request.method()
    }

    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
}

/// An answer's head that may be stored, waiting for its body.
#[derive(Debug)]
pub struct Keepable {
    policy: CachePolicy,
    tags: Box<[String]>,
    selected: Box<[(HeaderName, Option<HeaderValue>)]>,
    validators: Box<[(HeaderName, HeaderValue)]>,
    fresh_until: SystemTime,
    grace: Grace,
    shown_cache_control: Option<Box<[HeaderValue]>>,
    head_weight: u64,
    plain: Option<Box<Plain>>,
}

impl Keepable {
    /// `head`, the answer to `request` (as forwarded), if RFC 9111 lets
    /// a shared cache store it. `ttl_default`: the freshness of an
    /// answer that states none, of a heuristically cacheable status (as
    /// a `max-age` added to its policy, not to what clients see; a
    /// `max-age`, not an `s-maxage`, so that it never makes an answer to
    /// `Authorization` storable).
    pub fn new(
        request: &impl RequestLike,
        head: &response::Parts,
        at: SystemTime,
        ttl_default: Option<Duration>,
    ) -> Option<Self> {
        // An answer that sets a cookie is one client's (a session, a
        // consent): never kept, as nginx and Varnish do by default,
        // though RFC 9111 would allow it.
        if head.headers.contains_key(http::header::SET_COOKIE) {
            return None;
        }
        let defaulted = ttl_default
            .filter(|_| heuristically_cacheable(head.status) && !states_freshness(&head.headers));
        let (policy, shown_cache_control) = match defaulted {
            None => (
                CachePolicy::new_options(request, head, at, CacheOptions::default()),
                None,
            ),
            Some(ttl) => {
                let mut given = http::Response::new(());
                *given.status_mut() = head.status;
                *given.headers_mut() = head.headers.clone();
                let max_age = HeaderValue::from_str(&format!("max-age={}", ttl.as_secs()))
                    .unwrap_or(HeaderValue::from_static("max-age=0"));
                given
                    .headers_mut()
                    .append(http::header::CACHE_CONTROL, max_age);
                let own = head
                    .headers
                    .get_all(http::header::CACHE_CONTROL)
                    .iter()
                    .cloned()
                    .collect();
                (
                    CachePolicy::new_options(request, &given, at, CacheOptions::default()),
                    Some(own),
                )
            }
        };
        if !policy.is_storable() {
            return None;
        }
        let selected: Box<[_]> = vary_names(&head.headers)
            .map(|name| {
                let value = request.headers().get(&name).cloned();
                (name, value)
            })
            .collect();
        let head_weight = head
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().len() + v.len()) as u64)
            .sum::<u64>()
            + 256;
        let validators = [http::header::ETAG, http::header::LAST_MODIFIED]
            .into_iter()
            .filter_map(|name| Some((name.clone(), head.headers.get(&name)?.clone())))
            .collect();
        let plain = Plain::new(&policy, request, &selected, at, |head| {
            shown(shown_cache_control.as_deref(), head, at)
        });
        let head_weight = head_weight + plain.as_ref().map_or(0, |p| p.weight());
        Some(Self {
            fresh_until: at + policy.time_to_live(at),
            policy,
            plain,
            tags: surrogate_keys(&head.headers),
            selected,
            validators,
            grace: Grace::of(&head.headers),
            shown_cache_control,
            head_weight,
        })
    }

    pub fn with_body(self, body: Bytes) -> Stored {
        Stored {
            weight: self.head_weight + body.len() as u64,
            policy: self.policy,
            body,
            tags: self.tags,
            selected: self.selected,
            validators: self.validators,
            fresh_until: self.fresh_until,
            grace: self.grace,
            shown_cache_control: self.shown_cache_control,
            plain: self.plain,
        }
    }
}

/// The names a response's `Vary` lists (`*` included, which matches no
/// request: the crate refuses it on look-up).
fn vary_names(headers: &HeaderMap) -> impl Iterator<Item = HeaderName> + '_ {
    headers
        .get_all(http::header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
}

/// `Surrogate-Key` (space-separated) and `Cache-Tag` (comma-separated).
fn surrogate_keys(headers: &HeaderMap) -> Box<[String]> {
    let spaced = headers
        .get_all("surrogate-key")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(str::split_whitespace);
    let commas = headers
        .get_all("cache-tag")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    let mut tags: Vec<String> = spaced
        .chain(commas)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    tags.sort();
    tags.dedup();
    tags.into_boxed_slice()
}

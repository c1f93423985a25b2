//! A route's `cache` on the request path (issue 57; `docs/caching.md`):
//! answers from its zone (`crate::cache`) where RFC 9111 allows, and
//! upstream answers kept as they stream to the client.
//!
//! - **Key**: what the route's generation sends upstream: the `Host` it
//!   is sent, the path (as normalized or rewritten) and query, and the
//!   upstream (`example.com /a/b?c=1 app`), then the route's `key`
//!   headers. A changed rewrite makes other keys, so it cannot serve what
//!   another route stored; a rollback makes the old generation's keys.
//! - `GET` is looked up; `HEAD` is looked up as the `GET` it stands for
//!   and answered without the body. One `Range` is answered from a fresh
//!   object (206, or 416; `cache::range`); on a miss, `bytes=0-` fetches
//!   the whole object, any other range goes upstream as it is. Unsafe
//!   methods (`POST`, `PUT`, `DELETE`, `PATCH`) pass, and a non-error
//!   answer to one forgets the key (§4.4). Other methods pass.
//! - A zone with a disk reads a key's files when memory lacks the key.
//! - A stale object with validators is revalidated: the upstream is sent
//!   `If-None-Match` / `If-Modified-Since`, and a 304 freshens the object
//!   and answers from it (§4.3.4). Within `stale_while_revalidate` it
//!   answers at once and one background request per key revalidates it;
//!   within `stale_if_error` it answers when the revalidation fails.
//! - Concurrent misses for one key make one upstream request; the others
//!   wait (at most the route's timeout) and look again.
//! - Every answer says what the cache did (`Cache-Status`, RFC 9211):
//!   `cutover; hit`, `cutover; fwd=miss`, `cutover; fwd=miss; stored`,
//!   `cutover; fwd=stale; fwd-status=304`, `cutover; fwd=miss; collapsed`
//!   (answered from what another request's miss stored), `cutover; hit;
//!   detail=stale-while-revalidate`, `cutover; fwd=stale;
//!   detail=stale-if-error`, `cutover; fwd=bypass`.

use std::sync::Arc;
use std::time::SystemTime;

use http::{
    header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri,
};

use super::body::{Keeping, ResponseBody};
use super::conn::ConnContext;
use super::error::ProxyError;
use super::exchange::Target;
use crate::backends::ClientBody;
use crate::cache::{Found, Keepable, Outcome, RequestLike, StaleUse, Turn, Zone};
use crate::generation::{InflightGuard, Route, RouteSlot, Upstream};
use crate::plan::{CacheKeySpec, QueryKey, RouteCacheSpec};

/// RFC 9211's header.
static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// The request as the cache compares it with what it stored: the
/// method it stands for (`GET` for a `HEAD`), the path and query as
/// forwarded, and the client's headers. The path is compared as text
/// (a hit parses no URI); a `Uri` is made only to store a policy.
struct View<'a> {
    method: &'a Method,
    path_and_query: &'a str,
    headers: &'a HeaderMap,
}

impl RequestLike for View<'_> {
    fn uri(&self) -> Uri {
        // Unparsable, it is stored as `/`, which no request's text is.
        Uri::try_from(self.path_and_query).unwrap_or_default()
    }

    fn is_same_uri(&self, other: &Uri) -> bool {
        other.scheme().is_none()
            && other.authority().is_none()
            && other.path_and_query().map(http::uri::PathAndQuery::as_str)
                == Some(self.path_and_query)
    }

    fn method(&self) -> &Method {
        self.method
    }

    fn headers(&self) -> &HeaderMap {
        self.headers
    }
}

/// Answers `req` for `route` through its zone, forwarding what the zone
/// cannot answer.
#[expect(
    clippy::too_many_arguments,
    reason = "the forward's own arguments, and the zone"
)]
pub(super) async fn answer(
    (zone, spec): (&Arc<Zone>, &RouteCacheSpec),
    req: Request<ClientBody>,
    target: Target<'_>,
    conn: &ConnContext,
    route: &Route,
    upstream: &Arc<Upstream>,
    guard: InflightGuard,
    slot: Option<RouteSlot>,
) -> (Outcome, Result<Response<ResponseBody>, ProxyError>) {
    let (key, path) = key(upstream, &req, &target, spec.key.as_ref());
    let path_and_query = key.get(path).unwrap_or("/");
    let method = req.method().clone();
    let unsafe_method = matches!(
        method,
        Method::POST | Method::PUT | Method::DELETE | Method::PATCH
    );
    let looked_up = method == Method::GET || (method == Method::HEAD && spec.head);
    if !looked_up {
        let answered = super::retry::forward(req, target, conn, route, upstream, guard, slot).await;
        if unsafe_method
            && answered
                .as_ref()
                .is_ok_and(|r| !r.status().is_client_error() && !r.status().is_server_error())
        {
            zone.invalidate(&key);
        }
        return (Outcome::Bypass, answered.map(|r| marked(r, "fwd=bypass")));
    }
    let head_only = method == Method::HEAD;
    // A zone with a disk: what memory lacks may be in its files.
    if zone.disk.is_some() {
        zone.load(&key).await;
    }
    let now = SystemTime::now();
    let found = {
        let view = View {
            method: &Method::GET,
            path_and_query,
            headers: req.headers(),
        };
        zone.lookup(&key, &view, now)
    };
    let mut req = req;
    // `Range` (a GET's): answered from a fresh object; otherwise a range
    // from the first byte fetches and keeps the whole object (answered
    // whole: RFC 9110 §14.2 lets a server ignore `Range`), and any other
    // goes upstream as it is, not kept.
    let range = match (&method, req.headers().get(header::RANGE)) {
        (&Method::GET, Some(range)) => Some(range.clone()),
        _ => None,
    };
    if let Some(range) = &range {
        if let Found::Fresh { head, body } = found {
            if head.status != StatusCode::OK {
                return (Outcome::Hit, Ok(from_zone(head, body, false, "hit")));
            }
            let selected = crate::cache::range::select(
                range,
                req.headers().get(header::IF_RANGE),
                &head.headers,
                body.len() as u64,
            );
            let (head, body) = crate::cache::range::cut(head, body, selected);
            return (Outcome::Hit, Ok(from_zone(head, body, false, "hit")));
        }
        if !crate::cache::range::from_start(range) {
            let answered =
                super::retry::forward(req, target, conn, route, upstream, guard, slot).await;
            return (Outcome::Miss, answered.map(|r| marked(r, "fwd=miss")));
        }
        req.headers_mut().remove(header::RANGE);
        req.headers_mut().remove(header::IF_RANGE);
    }
    let lead = match found {
        Found::Fresh { head, body } => {
            return (Outcome::Hit, Ok(from_zone(head, body, head_only, "hit")))
        }
        Found::Stale { stored, request } => {
            let client = View {
                method: &Method::GET,
                path_and_query,
                headers: req.headers(),
            };
            // Within `stale-while-revalidate`: answered now; one request
            // (this key's first) revalidates it in the background.
            let stale = stored.stale_head(
                &client,
                now,
                StaleUse::WhileRevalidate,
                spec.stale_while_revalidate,
            );
            if let Some(head) = stale {
                if let Turn::Lead(lead) = zone.turn(&key) {
                    revalidate_in_background(
                        lead,
                        (zone, spec, &key, path_and_query),
                        &stored,
                        &request,
                        &req,
                        &target,
                        (route, upstream),
                    );
                }
                let body = stored.body().clone();
                return (
                    Outcome::Stale,
                    Ok(from_zone(
                        head,
                        body,
                        head_only,
                        "hit; detail=stale-while-revalidate",
                    )),
                );
            }
            let ours = !req.headers().contains_key(header::IF_NONE_MATCH)
                && !req.headers().contains_key(header::IF_MODIFIED_SINCE);
            // Revalidation: the validators the zone would send.
            for name in [header::IF_NONE_MATCH, header::IF_MODIFIED_SINCE] {
                if let Some(value) = request.headers.get(&name) {
                    req.headers_mut().insert(name, value.clone());
                }
            }
            if head_only {
                *req.method_mut() = Method::GET;
            }
            let view_headers = req.headers().clone();
            let view = View {
                method: &Method::GET,
                path_and_query,
                headers: &view_headers,
            };
            let answered =
                super::retry::forward(req, target, conn, route, upstream, guard, slot).await;
            // The upstream failed: within `stale-if-error`, the stale
            // object answers instead.
            let failed = match &answered {
                Err(_) => Some(String::new()),
                Ok(r) if matches!(r.status().as_u16(), 500 | 502 | 503 | 504) => {
                    Some(format!("; fwd-status={}", r.status().as_u16()))
                }
                Ok(_) => None,
            };
            if let Some(fwd_status) = failed {
                let stale = stored.stale_head(
                    &view,
                    SystemTime::now(),
                    StaleUse::IfError,
                    spec.stale_if_error,
                );
                if let Some(head) = stale {
                    return (
                        Outcome::Stale,
                        Ok(from_zone(
                            head,
                            stored.body().clone(),
                            head_only,
                            &format!("fwd=stale{fwd_status}; detail=stale-if-error"),
                        )),
                    );
                }
            }
            let answered = match answered {
                Ok(answered) => answered,
                Err(error) => return (Outcome::Miss, Err(error)),
            };
            if answered.status() == StatusCode::NOT_MODIFIED {
                let (parts, _) = answered.into_parts();
                return match zone.revalidated(&key, &stored, &view, &parts, SystemTime::now(), ours)
                {
                    Some((head, body)) => (
                        Outcome::Revalidated,
                        Ok(from_zone(
                            head,
                            body,
                            head_only,
                            "fwd=stale; fwd-status=304",
                        )),
                    ),
                    // A 304 for something else (the client's own
                    // validators): the client's.
                    None => (
                        Outcome::Miss,
                        Ok(marked(
                            Response::from_parts(parts, ResponseBody::Full(None)),
                            "fwd=stale",
                        )),
                    ),
                };
            }
            return (
                Outcome::Miss,
                Ok(keep(
                    answered,
                    (zone, key.clone()),
                    &view,
                    spec,
                    None,
                    head_only,
                    "fwd=stale",
                )),
            );
        }
        Found::Miss => match zone.turn(&key) {
            Turn::Lead(lead) => Some(lead),
            Turn::Wait(landed) => {
                crate::cache::wait(landed, route.timeout()).await;
                let view = View {
                    method: &Method::GET,
                    path_and_query,
                    headers: req.headers(),
                };
                if let Found::Fresh { head, body } = zone.lookup(&key, &view, SystemTime::now()) {
                    return (
                        Outcome::Collapsed,
                        Ok(from_zone(head, body, head_only, "fwd=miss; collapsed")),
                    );
                }
                None
            }
            Turn::Alone => None,
        },
    };
    // A miss: the upstream is asked for the whole object (a HEAD as the
    // GET it stands for, so that what comes back can be kept).
    if head_only {
        *req.method_mut() = Method::GET;
    }
    let view_headers = req.headers().clone();
    let answered =
        match super::retry::forward(req, target, conn, route, upstream, guard, slot).await {
            Ok(answered) => answered,
            Err(error) => return (Outcome::Miss, Err(error)),
        };
    let view = View {
        method: &Method::GET,
        path_and_query,
        headers: &view_headers,
    };
    (
        Outcome::Miss,
        Ok(keep(
            answered,
            (zone, key.clone()),
            &view,
            spec,
            lead,
            head_only,
            "fwd=miss",
        )),
    )
}

/// Revalidates `stored` on a task of its own while the stale object
/// answers (`stale-while-revalidate`): the request the client's would
/// have been (its prepared headers, the zone's validators), through the
/// route's upstream; a 304 freshens the object, a storable answer
/// replaces it, anything else leaves it. `lead` is held to the end, so
/// that one refresh at most runs per key.
fn revalidate_in_background(
    lead: crate::cache::Lead,
    (zone, spec, key, path_and_query): (&Arc<Zone>, &RouteCacheSpec, &str, &str),
    stored: &Arc<crate::cache::Stored>,
    validation: &http::request::Parts,
    req: &Request<ClientBody>,
    target: &Target<'_>,
    (route, upstream): (&Route, &Arc<Upstream>),
) {
    let (mut head, _) = super::copy::head(req, None);
    head.method = Method::GET;
    for name in [header::IF_NONE_MATCH, header::IF_MODIFIED_SINCE] {
        head.headers.remove(&name);
        if let Some(value) = validation.headers.get(&name) {
            head.headers.insert(name, value.clone());
        }
    }
    match (target.host_rewrite, &target.authority) {
        (Some(crate::plan::HostRewrite::Literal(host)), _) => {
            head.headers.insert(header::HOST, host.clone());
        }
        (None, Some(authority)) => {
            head.headers.insert(header::HOST, authority.clone());
        }
        _ => {}
    }
    let backend_host = matches!(target.host_rewrite, Some(crate::plan::HostRewrite::Backend));
    let zone = Arc::clone(zone);
    let stored = Arc::clone(stored);
    let upstream = Arc::clone(upstream);
    let key = key.to_owned();
    let path_and_query = path_and_query.to_owned();
    let timeout = route.timeout();
    let spec = spec.clone();
    tokio::spawn(async move {
        let _lead = lead;
        let headers = head.headers.clone();
        let sent = super::copy::send(
            head,
            path_and_query.clone(),
            bytes::Bytes::new(),
            &upstream,
            timeout,
            super::copy::Report::Health,
            backend_host,
            usize::try_from(spec.max_object).unwrap_or(usize::MAX),
        )
        .await;
        let Some(Ok(answer)) = sent else { return };
        let view = View {
            method: &Method::GET,
            path_and_query: &path_and_query,
            headers: &headers,
        };
        let now = SystemTime::now();
        if answer.head.status == StatusCode::NOT_MODIFIED {
            zone.revalidated(&key, &stored, &view, &answer.head, now, true);
        } else if let Some(body) = answer.body {
            if let Some(keepable) = Keepable::new(&view, &answer.head, now, spec.ttl_default) {
                zone.store(&key, keepable.with_body(body));
            }
        }
    });
}

/// The key, and where its path and query lie in it: the `Host` sent
/// upstream, the path (as forwarded: normalized or rewritten) and query,
/// and the upstream, separated by spaces (which none of them can hold):
/// `example.com /a/b?c=1 app`; then, with the route's `key`, each header
/// it names on a line of its own (`\naccept-language:en`). The query is
/// the one `key` keeps (all of it by default).
fn key(
    upstream: &Upstream,
    req: &Request<ClientBody>,
    target: &Target<'_>,
    spec: Option<&CacheKeySpec>,
) -> (String, std::ops::Range<usize>) {
    let host: &[u8] = match target.host_rewrite {
        Some(crate::plan::HostRewrite::Literal(host)) => host.as_bytes(),
        Some(crate::plan::HostRewrite::Backend) => b"(backend)",
        None => target
            .authority
            .as_ref()
            .map(HeaderValue::as_bytes)
            .or_else(|| req.headers().get(header::HOST).map(HeaderValue::as_bytes))
            .unwrap_or_default(),
    };
    let path = target.path.as_deref().unwrap_or(req.uri().path());
    let query: Option<std::borrow::Cow<'_, str>> = match (req.uri().query(), spec) {
        (None, _) => None,
        (Some(query), None) => Some(query.into()),
        (Some(query), Some(spec)) => kept_query(query, &spec.query),
    };
    let mut key = String::with_capacity(
        upstream.name.len()
            + host.len()
            + path.len()
            + query.as_ref().map_or(0, |q| q.len() + 1)
            + 2,
    );
    key.push_str(&String::from_utf8_lossy(host));
    key.push(' ');
    let path_at = key.len();
    key.push_str(path);
    if let Some(query) = query {
        key.push('?');
        key.push_str(&query);
    }
    let path_end = key.len();
    key.push(' ');
    key.push_str(&upstream.name);
    for name in spec.iter().flat_map(|s| &s.headers) {
        key.push('\n');
        key.push_str(name.as_str());
        key.push(':');
        for (i, value) in req.headers().get_all(name).iter().enumerate() {
            if i > 0 {
                key.push(',');
            }
            key.push_str(&String::from_utf8_lossy(value.as_bytes()));
        }
    }
    (key, path_at..path_end)
}

/// The part of `query` the key keeps; `None` when nothing is left.
fn kept_query<'q>(query: &'q str, kept: &QueryKey) -> Option<std::borrow::Cow<'q, str>> {
    let name = |pair: &str| pair.split_once('=').map_or(pair, |(n, _)| n).to_owned();
    let pairs = query.split('&').filter(|p| !p.is_empty());
    let joined: Vec<&str> = match kept {
        QueryKey::All => return Some(query.into()),
        QueryKey::Nothing => return None,
        QueryKey::Include(names) => names
            .iter()
            .flat_map(|wanted| pairs.clone().filter(move |p| &name(p) == wanted))
            .collect(),
        QueryKey::Exclude(names) => pairs.filter(|p| !names.contains(&name(p))).collect(),
    };
    (!joined.is_empty()).then(|| joined.join("&").into())
}

/// An answer from the zone: its head (with `Age`), its body unless the
/// request was a `HEAD`.
fn from_zone(
    head: http::response::Parts,
    body: bytes::Bytes,
    head_only: bool,
    status: &str,
) -> Response<ResponseBody> {
    let body = if head_only {
        ResponseBody::Full(None)
    } else {
        ResponseBody::full(body)
    };
    marked(Response::from_parts(head, body), status)
}

fn marked(mut response: Response<ResponseBody>, status: &str) -> Response<ResponseBody> {
    let value = match status {
        "hit" => HeaderValue::from_static("cutover; hit"),
        other => HeaderValue::from_str(&format!("cutover; {other}"))
            .unwrap_or(HeaderValue::from_static("cutover")),
    };
    response.headers_mut().insert(CACHE_STATUS.clone(), value);
    response
}

/// The upstream's answer to the client, kept on its way if it may be:
/// storable by RFC 9111, and not longer than the route's `max_object` by
/// its declared length.
fn keep(
    answered: Response<ResponseBody>,
    (zone, key): (&Arc<Zone>, String),
    view: &View<'_>,
    spec: &RouteCacheSpec,
    lead: Option<crate::cache::Lead>,
    head_only: bool,
    status: &'static str,
) -> Response<ResponseBody> {
    let max_object = spec.max_object;
    let (parts, body) = answered.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let keepable = declared
        .is_none_or(|n| n <= max_object)
        .then(|| Keepable::new(view, &parts, SystemTime::now(), spec.ttl_default))
        .flatten();
    let Some(keepable) = keepable else {
        let body = if head_only {
            ResponseBody::Full(None)
        } else {
            body
        };
        return marked(Response::from_parts(parts, body), status);
    };
    let limit = usize::try_from(max_object).unwrap_or(usize::MAX);
    let keeping = ResponseBody::Keeping(Box::new(Keeping::new(
        body,
        (limit, declared),
        Arc::clone(zone),
        key,
        keepable,
        lead,
    )));
    if head_only {
        // The client asked for the head: the body is read to keep it,
        // on a task of its own, and not sent.
        tokio::spawn(drain(keeping, max_object));
        let marked_status = if declared.is_some() {
            "fwd=miss; stored"
        } else {
            status
        };
        return marked(
            Response::from_parts(parts, ResponseBody::Full(None)),
            marked_status,
        );
    }
    let status = match (status, declared) {
        ("fwd=miss", Some(_)) => "fwd=miss; stored",
        ("fwd=stale", Some(_)) => "fwd=stale; stored",
        (status, _) => status,
    };
    marked(Response::from_parts(parts, keeping), status)
}

/// Reads a body to its end (what `Keeping` needs to store it), or until
/// it runs past `limit` (it will not be kept: the rest is not fetched).
async fn drain(mut body: ResponseBody, limit: u64) {
    use http_body_util::BodyExt as _;
    let mut read = 0u64;
    while let Some(Ok(frame)) = body.frame().await {
        read += frame.data_ref().map_or(0, |d| d.len() as u64);
        if read > limit {
            return;
        }
    }
}

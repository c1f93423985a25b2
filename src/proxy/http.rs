//! The HTTP request path: admit, route, then answer directly or forward.
//!
//! Every request pins the active generation once, at admission (after its
//! head is read), and runs on that generation to the end: a reload during
//! the request changes nothing for it. Bodies stream in both directions;
//! nothing here buffers a whole body.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Scheme, Uri};
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;

use crate::backends::ClientBody;
use metrics::Counter;

use super::body::{ResponseBody, StreamGuards};
use super::downstream::Tracked;
use super::edge::{self, Forwarded};
use super::error::{error_response, ProxyError};
use crate::admission::{Admission, Pinned};
use crate::backends::{header_tokens, Attempt, Backend, ExchangeError, RequestBody, SendError};
use crate::generation::{Action, Generation, Route, Upstream};
use crate::plan::{DirectResponse, HashKey, QuotaKey};
use crate::telemetry::access::{self, Flags, Trail};
use crate::telemetry::metrics as m;
use crate::telemetry::trace::TraceContext;

/// What every request on one downstream connection shares.
pub struct ConnContext {
    pub listener: Arc<str>,
    pub admission: Admission,
    pub remote: SocketAddr,
    /// Where the client connected (for a PROXY header to a backend).
    pub local: SocketAddr,
    /// The client IP as an `X-Forwarded-For` value, formatted once.
    pub client_ip: HeaderValue,
    pub scheme: Scheme,
    pub responses: Arc<[Counter; 5]>,
    /// Set for the whole listener set when draining begins.
    pub draining: Arc<AtomicBool>,
    /// What moves on the connection, for its timeouts.
    pub activity: Arc<super::downstream::Activity>,
    /// Backends' 1xx responses on their way to an HTTP/1.1 client.
    pub interim: Arc<super::interim::InterimQueue>,
    /// On the TCP side of a listener that also serves HTTP/3: what
    /// responses advertise while it does.
    pub alt_svc: Option<Arc<super::h3::AltSvc>>,
}

/// The `X-Forwarded-For` value for a client address.
pub fn client_ip_header(remote: SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&remote.ip().to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Per-listener response counters, registered once per listener.
pub fn listener_counters(listener: &str) -> Arc<[Counter; 5]> {
    let listener = listener.to_owned();
    Arc::new(m::CLASSES.map(|class| {
        metrics::counter!(m::LISTENER_REQUESTS, m::LABEL_LISTENER => listener.clone(), m::LABEL_CLASS => class)
    }))
}

/// What a request's access-log line needs from its path through `serve`
/// (noted only while the access log is on).
struct Noted {
    method: http::Method,
    /// As routed: replaced by the normalized path when that differs.
    path: String,
    authority: Option<String>,
}

/// Serves one request. Never fails: errors become responses here.
pub async fn handle(
    mut req: Request<ClientBody>,
    conn: Arc<ConnContext>,
) -> Result<Response<Tracked<ResponseBody>>, Infallible> {
    let (open, refused) = conn.activity.request();
    let started = Instant::now();
    let Pinned { generation, guard } = conn
        .admission
        .pin_request(&conn.listener, |key| canary_key(key, &req, &conn));
    let trace = TraceContext::take(req.headers_mut());
    // Only pay for the line's copies when the access log is on or the
    // request's span is exported.
    let logged = access::enabled();
    let sampled = trace.sampled() && crate::telemetry::otlp::enabled();
    let mut noted = (logged || sampled).then(|| Noted {
        method: req.method().clone(),
        path: req.uri().path().to_owned(),
        authority: None,
    });
    let trail = noted.as_ref().map(|_| Trail::new());
    let version = req.version();
    if version == Version::HTTP_2 {
        conn.activity.mark_http2();
    }
    let (route, served) = match refused {
        Some(reason) => (None, Err(ProxyError::BadRequest(reason))),
        None => {
            let context = RequestContext {
                trace: &trace,
                trail: trail.as_ref(),
            };
            serve(req, &conn, &generation, guard, context, noted.as_mut()).await
        }
    };
    let route_name = route.map_or("-", |r| r.name());
    let mut flags = Flags::NONE;
    let mut response = match served {
        Ok(response) => response,
        Err(error) => {
            flags = error.flags();
            if error.is_upstream() {
                tracing::warn!(listener = %conn.listener, generation = %generation.id, route = route_name, %error, "upstream failure");
            } else if matches!(
                error,
                ProxyError::ClientBody { .. } | ProxyError::BadRequest(_)
            ) {
                tracing::debug!(listener = %conn.listener, client = %conn.remote, route = route_name, %error, "request refused");
            }
            let mut response = error_response(&error);
            // A head we refused may be followed by bytes we cannot frame:
            // nothing more is read from this HTTP/1 connection.
            if matches!(error, ProxyError::BadRequest(_)) && version < Version::HTTP_2 {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        }
    };
    if version < Version::HTTP_2
        && conn.draining.load(Ordering::Relaxed)
        && response.status() != StatusCode::SWITCHING_PROTOCOLS
    {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(value) = conn.alt_svc.as_ref().and_then(|a| a.current()) {
        if !conn.draining.load(Ordering::Relaxed) {
            response
                .headers_mut()
                .insert(header::ALT_SVC, value.clone());
        }
    }
    let status = response.status();
    // One clock read for the route's and the generation's records.
    let elapsed = started.elapsed();
    if let Some(route) = route {
        route.shared.record(status.as_u16(), elapsed);
    }
    generation.ledger.answered(status.as_u16(), elapsed);
    let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
    if let Some(counter) = conn.responses.get(class) {
        counter.increment(1);
    }
    let log = noted.and_then(|noted| {
        if status == StatusCode::SWITCHING_PROTOCOLS {
            flags |= Flags::UPGRADED;
        }
        // Nothing more to wait for: hyper sends no body for these.
        let bodiless = noted.method == http::Method::HEAD
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
            || http_body::Body::is_end_stream(response.body());
        let line = access::Line {
            method: Some(noted.method),
            authority: noted.authority,
            path: Some(noted.path),
            route: route.map(|r| Arc::clone(r.shared.name())),
            status: status.as_u16(),
            trace_id: Some(trace.trace_id),
            span_id: Some(trace.span_id),
            parent_span_id: trace.parent_id,
            sampled,
            logged,
            flags,
            ..access::Line::new(
                protocol_name(version),
                Arc::clone(&conn.listener),
                generation.id.0,
                conn.remote,
            )
        };
        let pending = access::Pending::new(line, trail.clone(), started, bodiless);
        // A protocol switch is logged when its tunnel closes.
        match (&trail, status == StatusCode::SWITCHING_PROTOCOLS) {
            (Some(trail), true) => {
                trail.defer(pending);
                None
            }
            _ => Some(pending),
        }
    });
    crate::admission::release(generation);
    Ok(response.map(|body| Tracked::new(body, open, log)))
}

fn protocol_name(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// What one request carries through `serve` besides the request itself.
struct RequestContext<'r> {
    trace: &'r TraceContext,
    trail: Option<&'r Arc<Trail>>,
}

/// Routes and serves a request on its pinned generation; returns the
/// route that took it (for logs) and the response or the error.
async fn serve<'g>(
    req: Request<ClientBody>,
    conn: &ConnContext,
    generation: &'g Generation,
    guard: crate::generation::InflightGuard,
    context: RequestContext<'_>,
    noted: Option<&mut Noted>,
) -> (
    Option<&'g Arc<Route>>,
    Result<Response<ResponseBody>, ProxyError>,
) {
    let refuse = |reason| (None, Err(ProxyError::BadRequest(reason)));
    if let Some(reason) = edge::smuggling_risk(req.headers()) {
        return refuse(reason);
    }
    let authority = match edge::authority(&req) {
        Ok(authority) => authority,
        Err(reason) => return refuse(reason),
    };
    let Some(router) = generation.router(&conn.listener) else {
        return (None, Err(ProxyError::NoRoute));
    };
    let Ok(listener_slot) = router.admit() else {
        return (None, Err(ProxyError::Saturated));
    };
    let path = match edge::normalize_path(req.uri().path(), &router.edge) {
        Ok(path) => path,
        Err(reason) => return refuse(reason),
    };
    if let Some(noted) = noted {
        if let Cow::Owned(normalized) = &path {
            noted.path.clone_from(normalized);
        }
        noted.authority = authority
            .as_ref()
            .map(|a| String::from_utf8_lossy(a.as_bytes()).into_owned());
    }
    let host = authority
        .as_ref()
        .and_then(|a| a.to_str().ok())
        .map(edge::route_host);
    let Some(route) = router.route(host, &path, req.method(), req.headers()) else {
        return (None, Err(ProxyError::NoRoute));
    };
    let target = Target {
        authority,
        path: match path {
            Cow::Borrowed(_) => None,
            Cow::Owned(path) => Some(path),
        },
        edge: &router.edge,
        traceparent: context.trace.traceparent(),
        trail: context.trail.cloned(),
    };
    let mut result = serve_route(req, target, conn, route, guard).await;
    // A streamed answer keeps the listener's place until its last byte.
    if let (Some(slot), Ok(response)) = (listener_slot, result.as_mut()) {
        if let Some(guards) = response.body_mut().guards_mut() {
            guards.listener = Some(slot);
        }
    }
    (Some(route), result)
}

/// Where a request goes, as the edge rules settled it.
#[derive(Clone)]
pub(super) struct Target<'g> {
    /// Routed by, and sent upstream as `Host`.
    authority: Option<HeaderValue>,
    /// The normalized path, when it differs from the one the client sent.
    path: Option<String>,
    edge: &'g crate::plan::ListenerEdge,
    /// Sent upstream: the request's trace, the gateway's span.
    traceparent: HeaderValue,
    /// Where attempts leave what the access log reports.
    pub trail: Option<Arc<Trail>>,
}

async fn serve_route(
    req: Request<ClientBody>,
    target: Target<'_>,
    conn: &ConnContext,
    route: &Route,
    guard: crate::generation::InflightGuard,
) -> Result<Response<ResponseBody>, ProxyError> {
    if let Some(quota) = &route.quota {
        let key: Cow<'_, [u8]> = match &quota.spec().key {
            QuotaKey::ClientIp => Cow::Owned(edge::client_key(conn.remote.ip()).to_vec()),
            // Requests without the header share one bucket.
            QuotaKey::Header(name) => {
                Cow::Borrowed(req.headers().get(name).map_or(&b""[..], |v| v.as_bytes()))
            }
            QuotaKey::Route => Cow::Borrowed(&b""[..]),
        };
        if let Err(wait) = quota.take(&key) {
            route.shared.rate_limited();
            return Err(ProxyError::RateLimited(wait));
        }
    }
    let slot = route.admit().map_err(|_| ProxyError::Saturated)?;
    let upstream = match &route.action {
        Action::Respond(direct) => return Ok(direct_response(direct)),
        Action::Proxy(upstream) => upstream,
    };
    if super::retry::applies(route, &req) {
        return Box::pin(super::retry::serve(
            req, target, conn, route, upstream, guard, slot,
        ))
        .await;
    }
    let hash = upstream
        .hash_key
        .as_ref()
        .and_then(|_| request_hash(upstream, &req, conn, &target));
    let backend = match hash {
        Some(hash) => upstream.pick_hashed(hash),
        None => upstream.pick(),
    }
    .ok_or(ProxyError::NoBackend)?;
    let backend_guard = backend.start_request();
    let mut req = req;
    // An HTTP/1.1 upgrade (WebSocket and the like) to an HTTP/1.1 backend:
    // keep the downstream half to join with the upstream half on 101.
    let upgrade = requested_upgrade(&req)
        .filter(|_| backend.version == Version::HTTP_11)
        .map(|protocol| (protocol, hyper::upgrade::on(&mut req)));
    // RFC 9110 §15.2: 1xx go on to HTTP/1.1 clients (not HTTP/1.0, and
    // hyper's server cannot send them on HTTP/2).
    let interim = (req.version() == Version::HTTP_11 && upgrade.is_none()).then_some(&conn.interim);
    let hop = Hop {
        conn,
        upstream,
        backend,
        timeout: route.timeout(),
        trail: target.trail.clone(),
    };
    let req = req.map(|body| RequestBody::Streaming(body, target.trail.clone()));
    let guards = StreamGuards::new(
        guard,
        slot,
        backend_guard,
        Arc::clone(conn.admission.store()),
    );
    match upgrade {
        None => {
            let driven = backend.h1.as_ref();
            let (mut upstream_req, forwarded) =
                upstream_request(req, target, conn, backend, None, driven.is_some())?;
            if let Some(pool) = driven {
                let interim = interim.map(|q| &**q);
                return driven_exchange(upstream_req, &forwarded, pool, &hop, interim, guards)
                    .await;
            }
            forwarded.insert_into(upstream_req.headers_mut());
            if interim.is_some() && backend.version == Version::HTTP_11 {
                let queue = Arc::clone(&conn.interim);
                hyper::ext::on_informational(&mut upstream_req, move |response| {
                    queue.push(response.status(), response.headers());
                });
            }
            // On the heap: this path's futures are large, and the plain
            // HTTP/1.1 one above is what most deployments take.
            Box::pin(client_exchange(upstream_req, None, &hop, guards)).await
        }
        Some((protocol, downstream)) => {
            let (upstream_req, forwarded) =
                upstream_request(req, target, conn, backend, Some(&protocol), false)?;
            let mut upstream_req = upstream_req;
            forwarded.insert_into(upstream_req.headers_mut());
            Box::pin(client_exchange(
                upstream_req,
                Some((protocol, downstream)),
                &hop,
                guards,
            ))
            .await
        }
    }
}

/// What `policy = "hash"` hashes for this request, if the upstream
/// hashes and the request has the key.
pub(super) fn request_hash(
    upstream: &Upstream,
    req: &Request<ClientBody>,
    conn: &ConnContext,
    target: &Target<'_>,
) -> Option<u64> {
    let key = upstream.hash_key.as_ref()?;
    let bytes: Cow<'_, [u8]> = match key {
        HashKey::Header(name) => Cow::Borrowed(req.headers().get(name)?.as_bytes()),
        HashKey::Cookie(name) => Cow::Borrowed(cookie(req.headers(), name)?.as_bytes()),
        HashKey::ClientIp => Cow::Owned(edge::client_key(conn.remote.ip()).to_vec()),
        HashKey::Path => Cow::Borrowed(
            target
                .path
                .as_deref()
                .unwrap_or(req.uri().path())
                .as_bytes(),
        ),
    };
    Some(crate::generation::hash_key(&bytes))
}

/// The hash of a request's canary key (DESIGN §14): the same value, the
/// same generation.
fn canary_key(key: &HashKey, req: &Request<ClientBody>, conn: &ConnContext) -> Option<u64> {
    let bytes: Cow<'_, [u8]> = match key {
        HashKey::Header(name) => Cow::Borrowed(req.headers().get(name)?.as_bytes()),
        HashKey::Cookie(name) => Cow::Borrowed(cookie(req.headers(), name)?.as_bytes()),
        HashKey::ClientIp => Cow::Owned(edge::client_key(conn.remote.ip()).to_vec()),
        HashKey::Path => Cow::Borrowed(req.uri().path().as_bytes()),
    };
    Some(crate::generation::hash_key(&bytes))
}

/// The value of cookie `name` (the first, over every `Cookie` field).
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value.trim_matches('"'))
}

/// Where one attempt goes and how long it may wait for its answer.
pub(super) struct Hop<'a> {
    pub conn: &'a ConnContext,
    pub upstream: &'a Upstream,
    pub backend: &'a Arc<Backend>,
    /// For the response head, from the end of the request body.
    pub timeout: std::time::Duration,
    pub trail: Option<Arc<Trail>>,
}

impl Hop<'_> {
    /// An attempt at the hop's backend begins: the time it starts, when
    /// anything will want it.
    fn begin(&self) -> Option<Instant> {
        if let Some(trail) = &self.trail {
            trail.attempt(&self.backend.label);
        }
        (self.upstream.measures_latency() || self.trail.is_some()).then(Instant::now)
    }

    /// How the attempt ended: for the upstream's balancing and outlier
    /// state, and for the access log.
    fn report(&self, attempt: Attempt, sent: Option<Instant>) {
        let rtt = sent.map(|s| s.elapsed());
        let measured = rtt.filter(|_| self.upstream.measures_latency());
        self.upstream.report(self.backend, attempt, measured);
        if let Some(trail) = &self.trail {
            match attempt {
                Attempt::Answered(_) => {
                    if let Some(rtt) = rtt {
                        trail.answered(rtt);
                    }
                }
                Attempt::ConnectError => trail.flag(Flags::CONNECT_FAILURE),
                Attempt::Timeout => trail.flag(Flags::UPSTREAM_TIMEOUT),
                Attempt::Error => trail.flag(Flags::UPSTREAM_RESET),
            }
        }
    }
}

/// One attempt at a backend (no protocol upgrade, no 1xx forwarding), the
/// answer with `guards` riding on its body: the retry path's. (The
/// single-attempt path in `serve_route` spells the same steps out: an
/// async layer and a returned request less per request.)
pub(super) async fn exchange(
    req: Request<RequestBody>,
    target: Target<'_>,
    hop: &Hop<'_>,
    guards: StreamGuards,
) -> Result<Response<ResponseBody>, ProxyError> {
    let driven = hop.backend.h1.as_ref();
    let (mut upstream_req, forwarded) =
        upstream_request(req, target, hop.conn, hop.backend, None, driven.is_some())?;
    if let Some(pool) = driven {
        return driven_exchange(upstream_req, &forwarded, pool, hop, None, guards).await;
    }
    forwarded.insert_into(upstream_req.headers_mut());
    Box::pin(client_exchange(upstream_req, None, hop, guards)).await
}

/// An exchange through hyper-util's pooled client (TLS, h2 and h2c
/// backends, and protocol upgrades).
async fn client_exchange(
    upstream_req: Request<RequestBody>,
    upgrade: Option<(HeaderValue, hyper::upgrade::OnUpgrade)>,
    hop: &Hop<'_>,
    guards: StreamGuards,
) -> Result<Response<ResponseBody>, ProxyError> {
    let Hop {
        conn,
        backend,
        timeout,
        ..
    } = *hop;
    // The route timeout counts from the end of the request body.
    let (upstream_req, body_ended) = {
        let (parts, body) = upstream_req.into_parts();
        let (body, ended) = crate::backends::SignalledBody::new(body);
        (Request::from_parts(parts, body), ended)
    };
    let answer_due = async move {
        let _ = body_ended.await;
        tokio::time::sleep(timeout).await;
    };
    let sent = hop.begin();
    // A backend that gets PROXY headers (only upgrades come this way for
    // it) is asked on a connection of the request's own.
    let proxy = proxy_header(backend, conn);
    let sending = async {
        match &proxy {
            Some(proxy) => proxied_request(backend, proxy, upstream_req).await,
            None => backend
                .client
                .request(upstream_req)
                .await
                .map_err(|e| match e.is_connect() {
                    true => (Attempt::ConnectError, connect_failed(backend, &e)),
                    false => (
                        Attempt::Error,
                        ProxyError::Upstream(format!("{}: {}", backend.key.addr, error_chain(&e))),
                    ),
                }),
        }
    };
    let answered = tokio::select! {
        answered = sending => Ok(answered),
        _ = answer_due => Err(()),
    };
    let response = match answered {
        Ok(Ok(response)) => {
            hop.report(Attempt::Answered(response.status()), sent);
            response
        }
        Ok(Err((attempt, error))) => {
            hop.report(attempt, None);
            return Err(error);
        }
        Err(_) => {
            hop.report(Attempt::Timeout, None);
            return Err(ProxyError::UpstreamTimeout(timeout));
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some((protocol, downstream)) = upgrade else {
            return Err(ProxyError::Upstream(format!(
                "{} switched protocols without being asked to",
                backend.key.addr
            )));
        };
        let mut response = response;
        let upstream_half = hyper::upgrade::on(&mut response);
        let (mut parts, _) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.insert(header::UPGRADE, protocol);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        let tunnel = Tunnel {
            // The upgraded stream pins its generation for its lifetime, as
            // a connection: only the ledger entry and the backend are kept.
            pinned: guards.inflight.ledger().connection(),
            backend: guards.backend,
            route: guards.route,
            store: guards.store,
            trail: hop.trail.clone(),
        };
        drop(guards.inflight);
        tokio::spawn(tunnel.run(downstream, upstream_half, Arc::clone(&conn.listener)));
        return Ok(Response::from_parts(
            parts,
            ResponseBody::full(Bytes::new()),
        ));
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = ResponseBody::Upstream {
        body,
        guards: Some(guards),
    };
    Ok(Response::from_parts(parts, body))
}

/// A plain HTTP/1.1 exchange through cutover's own client (see
/// `backends::h1`), on a pooled connection or a new one.
async fn driven_exchange(
    req: Request<RequestBody>,
    forwarded: &Forwarded,
    pool: &crate::backends::H1Pool,
    hop: &Hop<'_>,
    interim: Option<&super::interim::InterimQueue>,
    guards: StreamGuards,
) -> Result<Response<ResponseBody>, ProxyError> {
    let backend = &**hop.backend;
    let failed = |attempt, error: String| {
        hop.report(attempt, None);
        ProxyError::Upstream(format!("{}: {error}", backend.key.addr))
    };
    let forward_interim = |status, headers: &_| {
        if let Some(queue) = interim {
            queue.push(status, headers);
        }
    };
    let sent = hop.begin();
    let proxy = proxy_header(backend, hop.conn);
    let response = match crate::backends::request_h1(
        pool,
        &backend.key.addr,
        backend.key.connect_timeout,
        hop.timeout,
        req,
        forwarded.headers(),
        interim.is_some().then_some(&forward_interim),
        proxy.as_ref(),
    )
    .await
    {
        Ok(response) => response,
        Err(ExchangeError::Connect(error)) => {
            // Out of descriptors or local ports is this process's
            // trouble: the backend's health is left alone.
            match &error {
                crate::backends::ConnectError::Io(io) if crate::backends::local_failure(io) => {
                    tracing::error!(backend = %backend.key.addr, %io, "cannot open a connection to a backend");
                    if let Some(trail) = &hop.trail {
                        trail.flag(Flags::CONNECT_FAILURE);
                    }
                }
                _ => hop.report(Attempt::ConnectError, None),
            }
            return Err(connect_failed(backend, &error));
        }
        Err(ExchangeError::Send(SendError::RequestBody(error))) => {
            return Err(ProxyError::client_body(&*error))
        }
        Err(ExchangeError::Send(SendError::Timeout(timeout))) => {
            hop.report(Attempt::Timeout, None);
            return Err(ProxyError::UpstreamTimeout(timeout));
        }
        Err(ExchangeError::Send(error)) => return Err(failed(Attempt::Error, error_chain(&error))),
    };
    let (mut parts, mut body) = response.into_parts();
    let first = match super::body::peek(&mut body) {
        Ok(first) => first,
        Err(error) => return Err(failed(Attempt::Error, error_chain(&error))),
    };
    hop.report(Attempt::Answered(parts.status), sent);
    strip_hop_by_hop(&mut parts.headers);
    // A response without a body (HEAD, 204, 304, length 0), or whose body
    // came whole with its head, is complete already: its connection can
    // serve the next request right away.
    super::body::return_connection(&mut body, Some(&guards));
    Ok(Response::from_parts(
        parts,
        ResponseBody::Driven {
            body,
            guards: Some(guards),
            first,
        },
    ))
}

fn direct_response(direct: &DirectResponse) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(direct.body.clone()));
    *response.status_mut() = direct.status;
    let headers = response.headers_mut();
    for (name, value) in &direct.headers {
        headers.append(name.clone(), value.clone());
    }
    if !headers.contains_key(header::CONTENT_TYPE) && !direct.body.is_empty() {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    response
}

/// Rewrites a downstream request into the upstream request: the routed
/// authority as `Host`, the routed path, HTTP/1.1, hop-by-hop headers
/// gone. Its forwarding headers are returned apart: cutover's own
/// HTTP/1.1 client writes them straight into the request head (inserting
/// them would grow the header map on every request); for hyper's client
/// they go into the map.
fn upstream_request(
    req: Request<RequestBody>,
    target: Target<'_>,
    conn: &ConnContext,
    backend: &Backend,
    upgrade: Option<&HeaderValue>,
    origin_form: bool,
) -> Result<(Request<RequestBody>, Forwarded), ProxyError> {
    let (mut parts, body) = req.into_parts();
    let unforwardable = || ProxyError::BadRequest("request target cannot be forwarded");
    // HTTP/2 and absolute-form requests carry the authority in the URI;
    // it wins over any Host the client sent (see `edge::authority`).
    let authority_in_uri = parts.uri.authority().is_some();
    let path_and_query = match (target.path, parts.uri.path_and_query()) {
        (Some(path), original) => {
            let query = original.and_then(PathAndQuery::query);
            let text = match query {
                Some(query) => format!("{path}?{query}"),
                None => path,
            };
            PathAndQuery::try_from(text).map_err(|_| unforwardable())?
        }
        (None, Some(original)) => original.clone(),
        (None, None) => PathAndQuery::from_static("/"),
    };
    // A driven connection writes the target as is: origin-form, as to any
    // origin server. hyper-util's client wants the absolute URI to pick
    // its pooled connection, and writes origin-form itself.
    parts.uri = if origin_form {
        Uri::from(path_and_query)
    } else {
        Uri::builder()
            .scheme(backend.scheme.clone())
            .authority(backend.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|_| unforwardable())?
    };
    parts.version = backend.version;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    if authority_in_uri {
        if let Some(authority) = &target.authority {
            headers.insert(header::HOST, authority.clone());
        }
    }
    if let Some(protocol) = upgrade {
        headers.insert(header::UPGRADE, protocol.clone());
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let mut forwarded = Forwarded::take(
        headers,
        target.edge,
        conn.remote.ip(),
        &conn.client_ip,
        conn.scheme == Scheme::HTTPS,
        target.authority.as_ref(),
    );
    forwarded.traceparent = Some(target.traceparent);
    Ok((Request::from_parts(parts, body), forwarded))
}

/// The protocol an HTTP/1.1 request asks to switch to (`Connection:
/// upgrade` plus `Upgrade`), if any.
pub(super) fn requested_upgrade(req: &Request<ClientBody>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let asks = header_tokens(req.headers(), &header::CONNECTION)
        .any(|token| token.eq_ignore_ascii_case("upgrade"));
    asks.then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

/// An upgraded connection (WebSocket, …) spliced to its backend.
struct Tunnel {
    pinned: crate::generation::InflightGuard,
    backend: crate::backends::BackendGuard,
    route: Option<crate::generation::RouteSlot>,
    store: Arc<crate::runtime::GenerationStore>,
    /// Holds the request's access-log line (`handle` leaves it there for
    /// a 101) until the tunnel closes.
    trail: Option<Arc<Trail>>,
}

impl Tunnel {
    async fn run(
        self,
        downstream: hyper::upgrade::OnUpgrade,
        upstream: hyper::upgrade::OnUpgrade,
        listener: Arc<str>,
    ) {
        let joined = tokio::join!(downstream, upstream);
        // The 101 has been sent by now, so `handle` has left the line in
        // the trail: it is taken out on every path (the line holds the
        // trail too), and written when it drops.
        let mut line = self.trail.as_ref().and_then(|t| t.take_deferred());
        let (downstream, upstream) = match joined {
            (Ok(d), Ok(u)) => (d, u),
            (Err(error), _) | (_, Err(error)) => {
                tracing::debug!(listener = %listener, %error, "protocol switch did not complete");
                return;
            }
        };
        let mut downstream = hyper_util::rt::TokioIo::new(downstream);
        let mut upstream = hyper_util::rt::TokioIo::new(upstream);
        let generation = self.pinned.ledger().generation();
        let copied = tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut downstream, &mut upstream) => copied.ok(),
            _ = super::tcp::pinned_age_expired(&self.store, generation) => {
                tracing::info!(listener = %listener, %generation, "closing an upgraded connection pinned past max_pinned_age");
                None
            }
        };
        // The line covers the whole session: its bytes each way, and its
        // duration to the close.
        if let (Some(line), Some((sent, received))) = (line.as_mut(), copied) {
            line.tunnelled(sent, received);
        }
        drop((line, self.pinned, self.backend, self.route));
    }
}

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
    // One pass over the names says which of them are here; only those
    // are removed. Most messages carry none; most that do carry only
    // `Connection: keep-alive` (every nginx response), and for that a
    // removal of each of ten names cost thousands of instructions a
    // response (`docs/performance.md`).
    let mut present = 0u16;
    for name in headers.keys() {
        // The names' lengths (2, 7, 10, 16–19) rule most fields out
        // before any comparison.
        if !matches!(name.as_str().len(), 2 | 7 | 10 | 16..=19) {
            continue;
        }
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present |= 1 << i;
        } else if name == header::TRANSFER_ENCODING {
            present |= 1 << HOP_BY_HOP.len();
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
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    // Framing is re-done by our own client and server.
    if present & (1 << HOP_BY_HOP.len()) != 0 {
        headers.remove(header::TRANSFER_ENCODING);
    }
}

/// A failed connection attempt, refused or not (retries tell them apart).
/// The PROXY header a connection to `backend` for this client starts
/// with, when the backend's upstream sends one.
fn proxy_header(backend: &Backend, conn: &ConnContext) -> Option<crate::backends::ProxyHeader> {
    backend
        .key
        .proxy_protocol
        .map(|version| crate::backends::ProxyHeader {
            version,
            client: conn.remote,
            local: conn.local,
        })
}

/// A request on a connection of its own (never pooled: a protocol
/// upgrade takes it over) that starts with `proxy`'s header.
async fn proxied_request(
    backend: &Backend,
    proxy: &crate::backends::ProxyHeader,
    req: Request<crate::backends::SignalledBody>,
) -> Result<Response<Incoming>, (Attempt, ProxyError)> {
    use tokio::io::AsyncWriteExt;
    let connect = tokio::net::TcpStream::connect(backend.key.addr.as_str());
    let mut stream = match tokio::time::timeout(backend.key.connect_timeout, connect).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Err((Attempt::ConnectError, connect_failed(backend, &error))),
        Err(_) => {
            let detail = format!("{}: connect timed out", backend.key.addr);
            return Err((Attempt::ConnectError, ProxyError::UpstreamConnect(detail)));
        }
    };
    let _ = stream.set_nodelay(true);
    let upstream = |e: &dyn std::error::Error| {
        let detail = format!("{}: {}", backend.key.addr, error_chain(e));
        (Attempt::Error, ProxyError::Upstream(detail))
    };
    stream
        .write_all(&proxy.bytes())
        .await
        .map_err(|e| upstream(&e))?;
    // hyper's connection writes the target as given: origin-form here,
    // as cutover's own client writes it (the routed Host is a header).
    let mut req = req;
    if let Some(target) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = http::Uri::from(target);
    }
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| upstream(&e))?;
    tokio::spawn(connection.with_upgrades());
    sender.send_request(req).await.map_err(|e| upstream(&e))
}

fn connect_failed(backend: &Backend, error: &(dyn std::error::Error + 'static)) -> ProxyError {
    let detail = format!("{}: {}", backend.key.addr, error_chain(error));
    let mut source = Some(error);
    while let Some(cause) = source {
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return ProxyError::UpstreamRefused(detail);
        }
        source = cause.source();
    }
    ProxyError::UpstreamConnect(detail)
}

pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
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

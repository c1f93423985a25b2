//! The HTTP request path: admit, route, then answer directly or forward.
//!
//! Every request pins the active generation once, at admission (after its
//! head is read), and runs on that generation to the end: a reload during
//! the request changes nothing for it. Bodies stream in both directions;
//! nothing here buffers a whole body.

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
use metrics::Counter;

use super::body::{ResponseBody, StreamGuards};
use super::error::{error_response, ProxyError};
use crate::admission::{Admission, Pinned};
use crate::generation::{
    header_tokens, Action, AttemptOutcome, Backend, ExchangeError, Generation, Route, SendError,
};
use crate::plan::DirectResponse;
use crate::telemetry::metrics as m;

/// What every request on one downstream connection shares.
pub struct ConnContext {
    pub listener: Arc<str>,
    pub admission: Admission,
    pub remote: SocketAddr,
    /// The client IP as an `X-Forwarded-For` value, formatted once.
    pub client_ip: HeaderValue,
    pub scheme: Scheme,
    pub responses: Arc<[Counter; 5]>,
    /// Set for the whole listener set when draining begins.
    pub draining: Arc<AtomicBool>,
    /// Whether this connection speaks HTTP/2 (decides how it is drained).
    pub http2: AtomicBool,
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

/// Serves one request. Never fails: errors become responses here.
pub async fn handle(
    req: Request<Incoming>,
    conn: Arc<ConnContext>,
) -> Result<Response<ResponseBody>, Infallible> {
    let started = Instant::now();
    let Pinned { generation, guard } = conn.admission.pin();
    // Only pay for the access log's copies when it is on.
    let access = tracing::enabled!(target: "cutover::access", tracing::Level::INFO)
        .then(|| (req.method().clone(), req.uri().path().to_owned()));
    let version = req.version();
    if version == Version::HTTP_2 {
        conn.http2.store(true, Ordering::Relaxed);
    }
    let (route, served) = serve(req, &conn, &generation, guard, started).await;
    let route_name = route.map_or("-", |r| r.name());
    let mut response = match served {
        Ok(response) => response,
        Err(error) => {
            if error.is_upstream() {
                tracing::warn!(listener = %conn.listener, generation = %generation.id, route = route_name, %error, "upstream failure");
            } else if matches!(error, ProxyError::ClientBody(_)) {
                tracing::debug!(listener = %conn.listener, client = %conn.remote, route = route_name, %error, "client request body failed");
            }
            error_response(&error)
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
    let status = response.status().as_u16();
    let class = usize::from(status / 100).clamp(1, 5) - 1;
    if let Some(counter) = conn.responses.get(class) {
        counter.increment(1);
    }
    if let Some((method, path)) = access {
        tracing::info!(
            target: "cutover::access",
            listener = %conn.listener,
            generation = %generation.id,
            client = %conn.remote,
            %method,
            path = %path,
            route = route_name,
            status,
            duration_us = started.elapsed().as_micros() as u64,
        );
    }
    crate::admission::release(generation);
    Ok(response)
}

/// Routes and serves a request on its pinned generation; returns the
/// route that took it (for logs) and the response or the error.
async fn serve<'g>(
    req: Request<Incoming>,
    conn: &ConnContext,
    generation: &'g Generation,
    guard: crate::generation::InflightGuard,
    started: Instant,
) -> (
    Option<&'g Arc<Route>>,
    Result<Response<ResponseBody>, ProxyError>,
) {
    if let Some(reason) = smuggling_risk(req.headers()) {
        return (None, Err(ProxyError::BadRequest(reason)));
    }
    let Some(router) = generation.router(&conn.listener) else {
        return (None, Err(ProxyError::NoRoute));
    };
    let host = request_host(&req);
    let Some(route) = router.route(host, req.uri().path(), req.method(), req.headers()) else {
        return (None, Err(ProxyError::NoRoute));
    };
    let result = serve_route(req, conn, route, guard).await;
    let status = match &result {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.status().as_u16(),
    };
    route.shared.record(status, started.elapsed());
    (Some(route), result)
}

async fn serve_route(
    req: Request<Incoming>,
    conn: &ConnContext,
    route: &Route,
    guard: crate::generation::InflightGuard,
) -> Result<Response<ResponseBody>, ProxyError> {
    let slot = route.admit().map_err(|_| ProxyError::Saturated)?;
    let upstream = match &route.action {
        Action::Respond(direct) => return Ok(direct_response(direct)),
        Action::Proxy(upstream) => upstream,
    };
    let backend = upstream.pick().ok_or(ProxyError::NoBackend)?;
    let backend_guard = backend.start_request();
    let mut req = req;
    // An HTTP/1.1 upgrade (WebSocket and the like) to an HTTP/1.1 backend:
    // keep the downstream half to join with the upstream half on 101.
    let upgrade = requested_upgrade(&req)
        .filter(|_| backend.version == Version::HTTP_11)
        .map(|protocol| (protocol, hyper::upgrade::on(&mut req)));
    let driven = backend.h1.as_ref().filter(|_| upgrade.is_none());
    let (mut upstream_req, forwarded) = upstream_request(
        req,
        conn,
        backend,
        upgrade.as_ref().map(|(p, _)| p),
        driven.is_some(),
    )?;
    if let Some(pool) = driven {
        return driven_exchange(
            upstream_req,
            &forwarded,
            pool,
            route,
            backend,
            StreamGuards::new(
                guard,
                slot,
                backend_guard,
                Arc::clone(conn.admission.store()),
            ),
        )
        .await;
    }
    forwarded.insert_into(upstream_req.headers_mut());
    // On the heap: this path's futures are large, and the plain HTTP/1.1
    // path above is the one every request of most deployments takes.
    Box::pin(client_exchange(
        upstream_req,
        upgrade,
        conn,
        route,
        backend,
        guard,
        slot,
        backend_guard,
    ))
    .await
}

/// An exchange through hyper-util's pooled client (TLS, h2 and h2c
/// backends, and protocol upgrades).
#[allow(clippy::too_many_arguments)]
async fn client_exchange(
    upstream_req: Request<Incoming>,
    upgrade: Option<(HeaderValue, hyper::upgrade::OnUpgrade)>,
    conn: &ConnContext,
    route: &Route,
    backend: &Backend,
    guard: crate::generation::InflightGuard,
    slot: Option<crate::generation::RouteSlot>,
    backend_guard: crate::generation::BackendGuard,
) -> Result<Response<ResponseBody>, ProxyError> {
    let response =
        match tokio::time::timeout(route.timeout(), backend.client.request(upstream_req)).await {
            Ok(Ok(response)) => {
                backend.record(AttemptOutcome::Ok);
                response
            }
            Ok(Err(e)) if e.is_connect() => {
                backend.record(AttemptOutcome::ConnectError);
                return Err(ProxyError::UpstreamConnect(format!(
                    "{}: {}",
                    backend.key.addr,
                    error_chain(&e)
                )));
            }
            Ok(Err(e)) => {
                backend.record(AttemptOutcome::Error);
                return Err(ProxyError::Upstream(format!(
                    "{}: {}",
                    backend.key.addr,
                    error_chain(&e)
                )));
            }
            Err(_) => {
                backend.record(AttemptOutcome::Timeout);
                return Err(ProxyError::UpstreamTimeout(route.timeout()));
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
            pinned: guard.ledger().connection(),
            backend: backend_guard,
            route: slot,
            store: Arc::clone(conn.admission.store()),
        };
        drop(guard);
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
        guards: Some(StreamGuards::new(
            guard,
            slot,
            backend_guard,
            Arc::clone(conn.admission.store()),
        )),
    };
    Ok(Response::from_parts(parts, body))
}

/// A plain HTTP/1.1 exchange through cutover's own client (see
/// `generation::h1client`), on a pooled connection or a new one.
async fn driven_exchange(
    req: Request<Incoming>,
    forwarded: &Forwarded,
    pool: &crate::generation::H1Pool,
    route: &Route,
    backend: &Backend,
    guards: StreamGuards,
) -> Result<Response<ResponseBody>, ProxyError> {
    let failed = |outcome, error: String| {
        backend.record(outcome);
        match outcome {
            AttemptOutcome::ConnectError => {
                ProxyError::UpstreamConnect(format!("{}: {error}", backend.key.addr))
            }
            _ => ProxyError::Upstream(format!("{}: {error}", backend.key.addr)),
        }
    };
    // Built inside the timeout rather than bound to a local first: a
    // local would keep its own slot in this future's state beside the
    // timeout's copy (1.2 KiB more to move on every request).
    let response = match tokio::time::timeout(
        route.timeout(),
        crate::generation::request_h1(
            pool,
            &backend.key.addr,
            backend.key.connect_timeout,
            req,
            forwarded.headers(),
        ),
    )
    .await
    {
        Ok(Ok(response)) => response,
        Ok(Err(ExchangeError::Connect(error))) => {
            return Err(failed(AttemptOutcome::ConnectError, error_chain(&error)))
        }
        Ok(Err(ExchangeError::Send(SendError::RequestBody(error)))) => {
            return Err(ProxyError::ClientBody(error_chain(&*error)))
        }
        Ok(Err(ExchangeError::Send(error))) => {
            return Err(failed(AttemptOutcome::Error, error_chain(&error)))
        }
        Err(_) => {
            backend.record(AttemptOutcome::Timeout);
            return Err(ProxyError::UpstreamTimeout(route.timeout()));
        }
    };
    backend.record(AttemptOutcome::Ok);
    let (mut parts, mut body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // A response without a body (HEAD, 204, 304, length 0) is complete
    // already: its connection can serve the next request right away.
    super::body::return_connection(&mut body, Some(&guards));
    Ok(Response::from_parts(
        parts,
        ResponseBody::Driven {
            body,
            guards: Some(guards),
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

/// Rewrites a downstream request into the upstream request: absolute URI
/// to the backend, HTTP/1.1, hop-by-hop headers gone. Its X-Forwarded-*
/// headers are returned apart: cutover's own HTTP/1.1 client writes them
/// straight into the request head (inserting them would grow the header
/// map on every request); for hyper's client they go into the map.
fn upstream_request(
    req: Request<Incoming>,
    conn: &ConnContext,
    backend: &Backend,
    upgrade: Option<&HeaderValue>,
    origin_form: bool,
) -> Result<(Request<Incoming>, Forwarded), ProxyError> {
    let (mut parts, body) = req.into_parts();
    // HTTP/2 and absolute-form requests carry the host in the URI; the
    // upstream request, in origin-form, needs it as a header.
    let original_host = parts.headers.get(header::HOST).cloned();
    let authority_host = original_host
        .is_none()
        .then(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        })
        .flatten();
    let path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
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
            .map_err(|_| ProxyError::BadRequest("request target cannot be forwarded"))?
    };
    parts.version = backend.version;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    let forwarded_host = match authority_host {
        Some(host) => {
            headers.insert(header::HOST, host.clone());
            Some(host)
        }
        None => original_host,
    };
    if let Some(protocol) = upgrade {
        headers.insert(header::UPGRADE, protocol.clone());
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    // The client's own X-Forwarded-Host and -Proto are replaced, its
    // X-Forwarded-For is extended. Most requests carry none: one look at
    // the names instead of hashing three absent ones.
    let mut client_chain = None;
    if headers
        .keys()
        .any(|name| name.as_str().starts_with("x-forwarded-"))
    {
        headers.remove(&X_FORWARDED_HOST);
        headers.remove(&X_FORWARDED_PROTO);
        client_chain = headers.remove(&X_FORWARDED_FOR);
    }
    let forwarded = Forwarded {
        client: chain_forwarded_for(client_chain, &conn.client_ip),
        proto: HeaderValue::from_static(if conn.scheme == Scheme::HTTPS {
            "https"
        } else {
            "http"
        }),
        host: forwarded_host,
    };
    Ok((Request::from_parts(parts, body), forwarded))
}

/// The protocol an HTTP/1.1 request asks to switch to (`Connection:
/// upgrade` plus `Upgrade`), if any.
fn requested_upgrade(req: &Request<Incoming>) -> Option<HeaderValue> {
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
    backend: crate::generation::BackendGuard,
    route: Option<crate::generation::RouteSlot>,
    store: Arc<crate::runtime::GenerationStore>,
}

impl Tunnel {
    async fn run(
        self,
        downstream: hyper::upgrade::OnUpgrade,
        upstream: hyper::upgrade::OnUpgrade,
        listener: Arc<str>,
    ) {
        let (downstream, upstream) = match tokio::join!(downstream, upstream) {
            (Ok(d), Ok(u)) => (d, u),
            (Err(error), _) | (_, Err(error)) => {
                tracing::debug!(listener = %listener, %error, "protocol switch did not complete");
                return;
            }
        };
        let mut downstream = hyper_util::rt::TokioIo::new(downstream);
        let mut upstream = hyper_util::rt::TokioIo::new(upstream);
        let generation = self.pinned.ledger().generation();
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream) => {}
            _ = super::tcp::pinned_age_expired(&self.store, generation) => {
                tracing::info!(listener = %listener, %generation, "closing an upgraded connection pinned past max_pinned_age");
            }
        }
        drop((self.pinned, self.backend, self.route));
    }
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The X-Forwarded-* headers of one upstream request.
struct Forwarded {
    client: HeaderValue,
    proto: HeaderValue,
    /// The host the client asked for, when it named one.
    host: Option<HeaderValue>,
}

impl Forwarded {
    fn headers(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        [
            (&X_FORWARDED_FOR, &self.client),
            (&X_FORWARDED_PROTO, &self.proto),
        ]
        .into_iter()
        .chain(self.host.as_ref().map(|host| (&X_FORWARDED_HOST, host)))
    }

    fn insert_into(self, headers: &mut HeaderMap) {
        headers.insert(X_FORWARDED_FOR.clone(), self.client);
        headers.insert(X_FORWARDED_PROTO.clone(), self.proto);
        if let Some(host) = self.host {
            headers.insert(X_FORWARDED_HOST.clone(), host);
        }
    }
}

/// `existing, client` when the request already carried X-Forwarded-For.
fn chain_forwarded_for(existing: Option<HeaderValue>, client: &HeaderValue) -> HeaderValue {
    existing
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .filter(|existing| !existing.is_empty())
        .and_then(|existing| {
            HeaderValue::from_str(&format!("{existing}, {}", client.to_str().unwrap_or(""))).ok()
        })
        .unwrap_or_else(|| client.clone())
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
    // Most messages carry none of them: one pass over the names is much
    // cheaper than ten hashed removals.
    if !headers
        .keys()
        .any(|name| HOP_BY_HOP.contains(name) || name == header::TRANSFER_ENCODING)
    {
        return;
    }
    let named: Vec<HeaderName> = header_tokens(headers, &header::CONNECTION)
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    // Framing is re-done by our own client and server.
    headers.remove(header::TRANSFER_ENCODING);
}

/// Request forms that different parsers read differently (RFC 9112 §6.1).
fn smuggling_risk(headers: &HeaderMap) -> Option<&'static str> {
    if headers.contains_key(header::TRANSFER_ENCODING)
        && headers.contains_key(header::CONTENT_LENGTH)
    {
        return Some("both Transfer-Encoding and Content-Length");
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

/// The request's host without port: the URI authority (HTTP/2,
/// absolute-form) or the Host header.
fn request_host(req: &Request<Incoming>) -> Option<&str> {
    let raw = match req.uri().host() {
        Some(host) => host,
        None => req.headers().get(header::HOST)?.to_str().ok()?,
    };
    let host = if raw.starts_with('[') {
        raw.split(']')
            .next()
            .map(|h| h.trim_start_matches('['))
            .unwrap_or(raw)
    } else {
        raw.rsplit_once(':').map_or(raw, |(h, _)| h)
    };
    Some(host)
}

fn error_chain(error: &dyn std::error::Error) -> String {
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
    fn each_hop_by_hop_header_alone_is_stripped() {
        // The quick check by name and the list of removals must agree.
        for name in HOP_BY_HOP.iter().chain([&header::TRANSFER_ENCODING]) {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            h.insert("x-app", HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h, headers(&[("x-app", "1")]), "{name}");
        }
    }
}

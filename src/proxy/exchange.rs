//! The last step of a request: where it goes (`Target`), the backend it
//! is sent to (`Hop`), the upstream request built from it, and the
//! exchange with the backend, whose answer streams back with the
//! request's guards riding on its body. Called by `request.rs` (one
//! attempt) and `retry.rs` (several); it calls neither.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{PathAndQuery, Scheme, Uri};
use http::{Request, Response, StatusCode, Version};

use crate::backends::ClientBody;

use super::body::{ResponseBody, StreamGuards};
use super::conn::ConnContext;
use super::edge::{self, Forwarded};
use super::error::error_chain;
use super::error::ProxyError;
use super::headers::{
    strip, strip_hop_by_hop, CLIENT_CERT_FINGERPRINT, CLIENT_CERT_SAN, CLIENT_CERT_SUBJECT,
};
use crate::backends::{
    header_tokens, Attempt, Backend, ExchangeError, RequestBody, SendError, TransportError,
};
use crate::generation::{Route, Upstream};
use crate::plan::HashKey;
use crate::telemetry::access::{Flags, Trail};

/// The single-attempt path: pick a backend, send the request once (an
/// HTTP/1.1 upgrade joined to its backend on 101), answer with what
/// comes back. Retried and hedged requests go through `retry.rs`.
///
/// An `async move` block, not an `async fn`, for the reason
/// `request::handle` gives: the request is not copied into a second place.
#[expect(
    clippy::manual_async_fn,
    reason = "see `request::handle`: no argument copies"
)]
pub(super) fn forward<'a>(
    mut req: Request<ClientBody>,
    target: Target<'a>,
    conn: &'a ConnContext,
    route: &'a Route,
    upstream: &'a Upstream,
    guard: crate::generation::InflightGuard,
    slot: Option<crate::generation::RouteSlot>,
) -> impl std::future::Future<Output = Result<Response<ResponseBody>, ProxyError>> + use<'a> {
    async move {
        let hash = upstream
            .hash_key
            .as_ref()
            .and_then(|_| request_hash(upstream, &req, conn, &target));
        let members = upstream.members();
        let backend = match hash {
            Some(hash) => upstream.pick_hashed(&members, hash),
            None => upstream.pick(&members),
        }
        .ok_or(ProxyError::NoBackend)?;
        let backend_guard = backend.start_request();
        // An HTTP/1.1 upgrade (WebSocket and the like) to an HTTP/1.1 backend:
        // keep the downstream half to join with the upstream half on 101.
        let upgrade = requested_upgrade(&req)
            .filter(|_| backend.version == Version::HTTP_11)
            .map(|protocol| (protocol, hyper::upgrade::on(&mut req)));
        // RFC 9110 §15.2: 1xx go on to HTTP/1.1 clients (not HTTP/1.0, and
        // hyper's server cannot send them on HTTP/2).
        let interim =
            (req.version() == Version::HTTP_11 && upgrade.is_none()).then_some(&conn.interim);
        let hop = Hop {
            conn,
            upstream,
            backend,
            timeout: route.timeout(),
            trail: target.trail.clone(),
            resend_unanswered: true,
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
                let mut upstream_req = req;
                let forwarded = upstream_request(
                    &mut upstream_req,
                    target,
                    conn,
                    backend,
                    None,
                    driven.is_some(),
                )?;
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
            Some(upgrade) => Box::pin(switching_exchange(req, target, upgrade, &hop, guards)).await,
        }
    }
}

/// An HTTP/1.1 protocol switch (WebSocket and the like): the upstream
/// request asks for it, and the client's half of the connection waits
/// for the backend's 101 (`switch_protocols`).
async fn switching_exchange(
    req: Request<RequestBody>,
    target: Target<'_>,
    (protocol, downstream): (HeaderValue, hyper::upgrade::OnUpgrade),
    hop: &Hop<'_>,
    guards: StreamGuards,
) -> Result<Response<ResponseBody>, ProxyError> {
    let mut upstream_req = req;
    let forwarded = upstream_request(
        &mut upstream_req,
        target,
        hop.conn,
        hop.backend,
        Some(&protocol),
        false,
    )?;
    forwarded.insert_into(upstream_req.headers_mut());
    client_exchange(upstream_req, Some((protocol, downstream)), hop, guards).await
}

/// Where a request goes, as the edge rules settled it.
#[derive(Clone)]
pub(super) struct Target<'g> {
    /// Routed by, and sent upstream as `Host`.
    pub(super) authority: Option<HeaderValue>,
    /// The path to forward (normalized, or rewritten), when it differs
    /// from the one the client sent.
    pub(super) path: Option<String>,
    /// The route's `host_rewrite`: the `Host` the backend is sent.
    pub(super) host_rewrite: Option<&'g crate::plan::HostRewrite>,
    pub(super) edge: &'g crate::plan::ListenerEdge,
    /// Sent upstream: the request's trace, the gateway's span.
    pub(super) traceparent: crate::telemetry::trace::Traceparent,
    /// Where attempts leave what the access log reports.
    pub trail: Option<Arc<Trail>>,
    /// A gRPC call's deadline: each attempt sends what is left of it as
    /// `grpc-timeout`.
    pub grpc_deadline: Option<tokio::time::Instant>,
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
    let path = target.path.as_deref().unwrap_or(req.uri().path());
    key_hash(key, req, conn, path)
}

/// The hash of `key`'s value in this request (`path` for `HashKey::Path`):
/// the same value, the same hash. A backend's (`request_hash`) and a
/// canary's (DESIGN §14).
pub(super) fn key_hash(
    key: &HashKey,
    req: &Request<ClientBody>,
    conn: &ConnContext,
    path: &str,
) -> Option<u64> {
    let bytes: Cow<'_, [u8]> = match key {
        HashKey::Header(name) => Cow::Borrowed(req.headers().get(name)?.as_bytes()),
        HashKey::Cookie(name) => Cow::Borrowed(cookie(req.headers(), name)?.as_bytes()),
        HashKey::ClientIp => Cow::Owned(edge::client_key(conn.remote.ip()).to_vec()),
        HashKey::Path => Cow::Borrowed(path.as_bytes()),
    };
    Some(crate::generation::hash_key(&bytes))
}

/// The value of cookie `name` (the first, over every `Cookie` field).
pub(super) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
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
    /// A pooled HTTP/1.1 connection that closes under an idempotent
    /// request sends it once more on a new one; not when the route's own
    /// retries count resets (their `attempts` is then exact).
    pub resend_unanswered: bool,
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
    let mut upstream_req = req;
    let forwarded = upstream_request(
        &mut upstream_req,
        target,
        hop.conn,
        hop.backend,
        None,
        driven.is_some(),
    )?;
    if let Some(pool) = driven {
        return driven_exchange(upstream_req, &forwarded, pool, hop, None, guards).await;
    }
    forwarded.insert_into(upstream_req.headers_mut());
    Box::pin(client_exchange(upstream_req, None, hop, guards)).await
}

/// An exchange through `backends::send`, the door for every transport
/// but cutover's own HTTP/1.1 client (TLS, h2, h2c and HTTP/3 backends,
/// and protocol upgrades).
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
    let sent = hop.begin();
    let sending = crate::backends::Sending {
        backend,
        timeout,
        upgrading: upgrade.is_some(),
        // A backend that gets PROXY headers (only upgrades come this way
        // for it) is asked on a connection of the request's own.
        proxy: proxy_header(backend, conn),
    };
    let response = match crate::backends::send(upstream_req, sending).await {
        Ok(response) => {
            hop.report(Attempt::Answered(response.status()), sent);
            if let Some(trail) = &hop.trail {
                trail.upstream_protocol(response.version());
            }
            response
        }
        Err(error) => {
            let (attempt, error) = transport_failed(error);
            // A body past `max_request_body`, or one the client broke, is
            // not the backend's doing.
            if !matches!(
                error,
                ProxyError::PayloadTooLarge | ProxyError::ClientBody { .. }
            ) {
                hop.report(attempt, None);
            }
            return Err(error);
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        return switch_protocols(response, upgrade, hop, guards);
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // What the backend spoke is the access log's; hyper's HTTP/1 server
    // writes a head of version 1.x or 2 only (and panics on 3).
    if parts.version == Version::HTTP_3 {
        parts.version = Version::HTTP_11;
    }
    let body = ResponseBody::Upstream {
        body,
        guards: Some(guards),
    };
    Ok(Response::from_parts(parts, body))
}

/// The backend switched protocols (101): the tunnel between the client's
/// upgraded connection and the backend's runs on a task of its own,
/// counted as open work; the client gets the 101.
fn switch_protocols(
    response: Response<crate::backends::AnswerBody>,
    upgrade: Option<(HeaderValue, hyper::upgrade::OnUpgrade)>,
    hop: &Hop<'_>,
    guards: StreamGuards,
) -> Result<Response<ResponseBody>, ProxyError> {
    let (conn, backend) = (hop.conn, hop.backend);
    let Some((protocol, downstream)) = upgrade else {
        return Err(ProxyError::Upstream(format!(
            "{} switched protocols without being asked to",
            backend.key.addr
        )));
    };
    let websocket = protocol
        .to_str()
        .is_ok_and(|p| p.trim().eq_ignore_ascii_case("websocket"));
    let mut response = response;
    let upstream_half = hyper::upgrade::on(&mut response);
    let (mut parts, _) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.insert(header::UPGRADE, protocol);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    let tunnel = super::tunnel::Tunnel {
        // The upgraded stream pins its generation for its lifetime, as
        // a connection: only the ledger entry and the backend are kept.
        pinned: guards.inflight.ledger().connection(),
        backend: guards.backend,
        route: guards.route,
        store: guards.store,
        trail: hop.trail.clone(),
        // Taken while the connection still counts: drain never sees
        // the tunnel uncounted.
        hold: (
            conn.lingering.open.hold(),
            conn.lingering.ended_at_cut.hold(),
        ),
        cut: conn.lingering.cut.clone(),
        websocket,
    };
    drop(guards.inflight);
    tokio::spawn(tunnel.run(downstream, upstream_half, Arc::clone(&conn.listener)));
    Ok(Response::from_parts(
        parts,
        ResponseBody::full(Bytes::new()),
    ))
}

/// How a failed exchange is reported and answered.
fn transport_failed(error: TransportError) -> (Attempt, ProxyError) {
    match error {
        TransportError::Connect {
            refused: true,
            detail,
        } => (Attempt::ConnectError, ProxyError::UpstreamRefused(detail)),
        TransportError::Connect {
            refused: false,
            detail,
        } => (Attempt::ConnectError, ProxyError::UpstreamConnect(detail)),
        TransportError::Timeout(timeout) => {
            (Attempt::Timeout, ProxyError::UpstreamTimeout(timeout))
        }
        TransportError::ClientBody(error) => (Attempt::Error, ProxyError::client_body(&*error)),
        TransportError::Backend(detail) => (Attempt::Error, ProxyError::Upstream(detail)),
    }
}

/// A plain HTTP/1.1 exchange through cutover's own client (see
/// `backends::h1`), on a pooled connection or a new one.
#[expect(
    clippy::manual_async_fn,
    reason = "see `request::handle`: no argument copies"
)]
fn driven_exchange<'a>(
    req: Request<RequestBody>,
    forwarded: &'a Forwarded,
    pool: &'a crate::backends::H1Pool,
    hop: &'a Hop<'a>,
    interim: Option<&'a super::interim::InterimQueue>,
    guards: StreamGuards,
) -> impl std::future::Future<Output = Result<Response<ResponseBody>, ProxyError>> + use<'a> {
    async move {
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
            hop.resend_unanswered,
        )
        .await
        {
            Ok(response) => response,
            Err(error) => return Err(driven_failed(hop, error)),
        };
        let (mut parts, mut body) = response.into_parts();
        let first = match super::body::peek(&mut body) {
            Ok(first) => first,
            Err(error) => return Err(failed(Attempt::Error, error_chain(&error))),
        };
        hop.report(Attempt::Answered(parts.status), sent);
        if let Some(trail) = &hop.trail {
            trail.upstream_protocol(parts.version);
        }
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
}

/// How a failed exchange through cutover's own HTTP/1.1 client is
/// reported and answered.
#[cold]
fn driven_failed(hop: &Hop<'_>, error: ExchangeError) -> ProxyError {
    let backend = &**hop.backend;
    match error {
        ExchangeError::Connect(error) => {
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
            transport_failed(crate::backends::connect_error(&backend.key.addr, &error)).1
        }
        ExchangeError::Send(SendError::RequestBody(error)) => ProxyError::client_body(&*error),
        ExchangeError::Send(SendError::Timeout(timeout)) => {
            hop.report(Attempt::Timeout, None);
            ProxyError::UpstreamTimeout(timeout)
        }
        ExchangeError::Send(error) => {
            hop.report(Attempt::Error, None);
            ProxyError::Upstream(format!("{}: {}", backend.key.addr, error_chain(&error)))
        }
    }
}

/// Rewrites a downstream request into the upstream request: the routed
/// authority as `Host`, the routed path, HTTP/1.1, hop-by-hop headers
/// gone, in place (a request returned by value is a copy of its 272
/// bytes, twice). Its forwarding headers are returned apart: cutover's own
/// HTTP/1.1 client writes them straight into the request head (inserting
/// them would grow the header map on every request); for hyper's client
/// they go into the map.
fn upstream_request(
    req: &mut Request<RequestBody>,
    target: Target<'_>,
    conn: &ConnContext,
    backend: &Backend,
    upgrade: Option<&HeaderValue>,
    origin_form: bool,
) -> Result<Forwarded, ProxyError> {
    let unforwardable = || ProxyError::BadRequest("request target cannot be forwarded");
    // HTTP/2 and absolute-form requests carry the authority in the URI;
    // it wins over any Host the client sent (see `edge::authority`).
    let authority_in_uri = req.uri().authority().is_some();
    let path_and_query = match (target.path, req.uri().path_and_query()) {
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
    *req.uri_mut() = if origin_form {
        Uri::from(path_and_query)
    } else {
        Uri::builder()
            .scheme(backend.scheme.clone())
            .authority(backend.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|_| unforwardable())?
    };
    *req.version_mut() = backend.version;
    let headers = req.headers_mut();
    // HTTP/2 carries `te: trailers` end to end (gRPC servers require it);
    // HTTP/1.1 would need it named in `Connection` as well.
    strip(headers, backend.version == Version::HTTP_2, true);
    if target.edge.client_identity {
        client_identity(headers, conn);
    }
    if let Some(deadline) = target.grpc_deadline {
        headers.insert(
            crate::grpc::GRPC_TIMEOUT.clone(),
            super::grpc::Call::forwarded_timeout(deadline),
        );
    }
    upstream_host(
        headers,
        target.authority.as_ref().filter(|_| authority_in_uri),
        target.host_rewrite,
        backend,
    );
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
    Ok(forwarded)
}

/// The `Host` the backend gets: none for HTTP/2 (its `:authority` is the
/// backend's address), otherwise the client's (`from_uri` when the
/// request carried its authority in the URI), unless the route rewrites
/// it.
#[inline]
fn upstream_host(
    headers: &mut HeaderMap,
    from_uri: Option<&HeaderValue>,
    host_rewrite: Option<&crate::plan::HostRewrite>,
    backend: &Backend,
) {
    if backend.version == Version::HTTP_2 {
        // Its `:authority` is the backend's address (hyper's pooled client
        // keys connections by it); a `host` beside it that differs is
        // malformed (RFC 9113 §8.3.1), and strict servers (nginx) refuse
        // it. The client's host goes as `X-Forwarded-Host`.
        headers.remove(header::HOST);
    } else {
        if let Some(authority) = from_uri {
            headers.insert(header::HOST, authority.clone());
        }
        match host_rewrite {
            Some(crate::plan::HostRewrite::Literal(host)) => {
                headers.insert(header::HOST, host.clone());
            }
            Some(crate::plan::HostRewrite::Backend) => {
                if let Ok(host) = HeaderValue::from_str(backend.authority.as_str()) {
                    headers.insert(header::HOST, host);
                }
            }
            None => {}
        }
    }
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

/// The client certificate's identity as `x-client-cert-*` headers (what
/// the client sent of them is gone already). A value a header cannot
/// carry (a subject with non-ASCII text) is left out.
fn client_identity(headers: &mut HeaderMap, conn: &ConnContext) {
    let Some(tls) = conn.tls.get() else {
        return;
    };
    for (name, value) in [
        (&CLIENT_CERT_SUBJECT, &tls.client_subject),
        (&CLIENT_CERT_SAN, &tls.client_san),
        (&CLIENT_CERT_FINGERPRINT, &tls.client_fingerprint),
    ] {
        if let Some(value) = value.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(name.clone(), value);
        }
    }
}

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

//! The HTTP request path: admit, route, then answer directly or forward.
//!
//! Every request pins the active generation once, at admission (after its
//! head is read), and runs on that generation to the end: a reload during
//! the request changes nothing for it. Bodies stream in both directions;
//! nothing here buffers a whole body. The path reads forward: `edge.rs`
//! (the request rules) → admission → the route (`admit_route`: quota,
//! `max_inflight`, its action) → `retry.rs` (several attempts) or
//! `exchange.rs` (one) → the response; neither of those calls back
//! into this file.

use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::uri::Scheme;
use http::{Request, Response, StatusCode, Version};

use crate::backends::ClientBody;
use crate::boxed::pin_in_place;

use super::body::ResponseBody;
use super::conn::ConnContext;
use super::downstream::Tracked;
use super::edge::{self};
use super::error::{error_response, Advertised, ProxyError};
use super::exchange::{key_hash, Target};
use super::filters;
use crate::admission::Pinned;
use crate::auth::Verdict;
use crate::generation::{Action, Generation, Route, Upstream};
use crate::plan::DirectResponse;
use crate::telemetry::access::{self, Flags, Trail};
use crate::telemetry::trace::TraceContext;

/// What a request's access-log line needs from its path through `serve`
/// (noted only while the access log is on).
struct Noted {
    method: http::Method,
    /// As routed: replaced by the normalized path when that differs.
    path: String,
    /// As forwarded, when a `rewrite` changed it.
    upstream_path: Option<String>,
    request_id: Option<String>,
    authority: Option<String>,
    /// The route's `auth` outcome, and who it found.
    auth: Option<crate::auth::Outcome>,
    subject: Option<String>,
    /// What the route's cache did.
    cache: Option<crate::cache::Outcome>,
    /// What refused it, when a quota did.
    limited: Option<&'static str>,
    waf: Option<super::waf::Decision>,
}

/// Serves one request. Never fails: errors become responses here.
///
/// A plain function returning an `async move` block rather than an
/// `async fn`: an `async fn` copies each argument into a local of its
/// own when first polled, and that local (the request's 264 bytes, here)
/// stays in the future beside the argument wherever it was borrowed. The
/// block uses what it captured in place (session 23: a copy and 264
/// bytes less at each layer of the request path).
#[expect(clippy::manual_async_fn, reason = "see above: no argument copies")]
pub fn handle(
    mut req: Request<ClientBody>,
    conn: Arc<ConnContext>,
) -> impl std::future::Future<Output = Result<Response<Tracked<ResponseBody>>, Infallible>> {
    async move {
        let (open, refused) = conn.activity.request();
        let started = Instant::now();
        let Pinned { generation, guard } = conn.admission.pin_request(&conn.listener, |key| {
            key_hash(key, &req, &conn, req.uri().path())
        });
        // While an activation shadows its candidate (DESIGN §22): one atomic
        // load otherwise.
        let mut offered = None;
        if refused.is_none() {
            if let Some(shadow) = conn.admission.store().shadow() {
                let (copied, waiting) = super::shadow::offer(req, &conn, shadow, &generation);
                req = copied;
                offered = waiting;
            }
        }
        let trace = TraceContext::take(req.headers_mut());
        // Only pay for the line's copies when the access log is on or the
        // request's span is exported.
        let logged = access::enabled();
        let sampled = trace.sampled() && crate::telemetry::trace::exported();
        // Boxed: 240 bytes the future would carry on every request.
        let noted = (logged || sampled).then(|| Noted {
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
            upstream_path: None,
            request_id: None,
            authority: None,
            auth: None,
            subject: None,
            cache: None,
            limited: None,
            waf: None,
        });
        let mut noted = noted.map(Box::new);
        let trail = noted.as_ref().map(|_| Trail::new());
        let mut call = super::grpc::Call::of(&req);
        let version = req.version();
        if version == Version::HTTP_2 {
            conn.activity.mark_http2();
        }
        let mut advertised = None;
        let Served {
            route,
            result: served,
            shaped,
        } = match refused {
            Some(reason) => Served::refused(ProxyError::refused_head(reason)),
            None => {
                let context = RequestContext {
                    trace: &trace,
                    trail: trail.as_ref(),
                    grpc: call.as_mut(),
                    advertised: &mut advertised,
                };
                let noted = noted.as_deref_mut();
                route_and_answer(req, &conn, &generation, guard, context, noted).await
            }
        };
        let route_name = route.map_or("-", |r| r.name());
        let mut flags = Flags::NONE;
        // What the route's and the generation's records count: the status
        // sent, except for a gRPC call the gateway failed, whose 200 stands
        // for the HTTP status of its failure (guards must see it).
        let mut accounted = None;
        let mut response = match served {
            Ok(response) => match &call {
                Some(call) => call.answer(
                    response,
                    route.map(|r| Arc::clone(&r.shared)),
                    trail.clone(),
                    version < Version::HTTP_2,
                ),
                None => response,
            },
            Err(error) => {
                flags = error.flags();
                // The refusals of a route's filters, whichever step found them
                // (a streamed body passes `max_request_body` mid-exchange).
                let refusal = match error {
                    ProxyError::Forbidden => Some(crate::generation::Refusal::Forbidden),
                    ProxyError::PayloadTooLarge => Some(crate::generation::Refusal::BodyTooLarge),
                    _ => None,
                };
                if let (Some(route), Some(why)) = (route, refusal) {
                    route.shared.refused(why);
                }
                if error.is_upstream() {
                    tracing::warn!(listener = %conn.listener, generation = %generation.id, route = route_name, %error, "upstream failure");
                } else if matches!(
                    error,
                    ProxyError::ClientBody { .. }
                        | ProxyError::BadRequest(_)
                        | ProxyError::HeadTooLarge
                ) {
                    tracing::debug!(listener = %conn.listener, client = %conn.remote, route = route_name, %error, "request refused");
                }
                let mut response = match &call {
                    Some(call) => {
                        let (response, code) = call.error_answer(&error);
                        super::body::count(route.map(|r| &*r.shared), trail.as_deref(), code);
                        accounted = Some(error.status());
                        response
                    }
                    None => error_response(&error),
                };
                // A head we refused may be followed by bytes we cannot frame:
                // nothing more is read from this HTTP/1 connection.
                if matches!(error, ProxyError::BadRequest(_) | ProxyError::HeadTooLarge)
                    && version < Version::HTTP_2
                {
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                response
            }
        };
        if let Some(advertised) = &advertised {
            advertised.headers(response.headers_mut());
        }
        // Response headers, CORS marks, then compression (DESIGN §17).
        let encoding = match shaped {
            Some(shaped) => shaped.apply(&mut response, trail.as_ref()),
            None => None,
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
        let counted = accounted.unwrap_or(status).as_u16();
        if let Some(route) = route {
            route.shared.record(counted, elapsed);
        }
        generation.ledger.answered(counted, elapsed);
        if let Some(offered) = offered {
            offered.answered(counted, elapsed);
        }
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
                upstream_path: noted.upstream_path,
                request_id: noted
                    .request_id
                    .or_else(|| noted.waf.as_ref()?.request_id.clone()),
                auth: noted.auth.map(crate::auth::Outcome::name),
                subject: noted.subject,
                cache: noted.cache.map(crate::cache::Outcome::name),
                limited: noted.limited,
                waf: noted.waf.as_ref().map(super::waf::Decision::logged),
                encoding: encoding.map(crate::plan::Encoding::token),
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
    /// Set for a gRPC call: its deadline and gRPC-Web mode are settled
    /// here.
    grpc: Option<&'r mut super::grpc::Call>,
    /// Set when the route's quota admitted the request and says so on
    /// every answer (`headers = "always"`).
    advertised: &'r mut Option<Advertised>,
}

/// What `serve` did: the route that took the request (for logs), the
/// answer or the error, and the route's response header changes, which
/// apply to either.
struct Served<'g> {
    route: Option<&'g Arc<Route>>,
    result: Result<Response<ResponseBody>, ProxyError>,
    /// Boxed: a route without filters carries one word for it.
    shaped: Option<Box<filters::Shaped<'g>>>,
}

impl Served<'_> {
    fn refused(error: ProxyError) -> Self {
        Served {
            route: None,
            result: Err(error),
            shaped: None,
        }
    }

    /// Answered before any route (an ACME challenge).
    fn answered(answer: Response<ResponseBody>) -> Self {
        Served {
            route: None,
            result: Ok(answer),
            shaped: None,
        }
    }
}

/// Routes and serves a request on its pinned generation (an `async move`
/// block for the reason `handle` gives), in stages, each of which goes on
/// or answers:
///
/// 1. `route_request`: the listener's edge rules, then the route;
/// 2. the route's filters check the request (CORS preflight, IP rules,
///    header limits… DESIGN §17), then its firewall (`waf.rs`, §24);
/// 3. its admission: the quota, then `max_inflight` (`admit_route`);
/// 4. `authenticate`, then a quota keyed by the subject it found;
/// 5. the filters prepare what is forwarded (rewrites, headers, mirrors,
///    gRPC-Web);
/// 6. one step forward: a direct answer, a redirect, the route's cache,
///    several attempts (`retry.rs`) or one (`exchange.rs`);
/// 7. a streamed answer keeps the listener's place until its last byte.
#[expect(clippy::manual_async_fn, reason = "see `handle`: no argument copies")]
fn route_and_answer<'g, 'a>(
    mut req: Request<ClientBody>,
    conn: &'a ConnContext,
    generation: &'g Generation,
    guard: crate::generation::InflightGuard,
    mut context: RequestContext<'a>,
    mut noted: Option<&'a mut Noted>,
) -> impl std::future::Future<Output = Served<'g>> + use<'g, 'a> {
    async move {
        // 1. The listener's edge rules, then the route.
        let Routing {
            router,
            route,
            authority,
            normalized,
            listener_slot,
        } = match route_request(&req, conn, generation, noted.as_deref_mut()) {
            Ok(routing) => routing,
            Err(answered) => return answered,
        };
        let mut target = Target {
            authority,
            path: normalized,
            host_rewrite: None,
            edge: &router.edge,
            traceparent: context.trace.traceparent(),
            trail: context.trail.cloned(),
            grpc_deadline: None,
        };
        if let Some(call) = context.grpc.as_deref_mut() {
            call.routed(route.timeout());
            target.grpc_deadline = call.deadline;
        }
        // 2. The route's filters, in the order of DESIGN §17; a route
        // without any (and a listener without defaults) pays this one check.
        let effective = filters::Effective::of(
            route.spec.filters.as_deref(),
            router.edge.defaults.as_deref(),
        );
        // What the filters and a redirect read of the request: the routed path
        // from a `Uri` clone (it shares its bytes) or, when normalizing changed
        // it, a copy, so that the request can move on.
        let needs_seen = effective.is_some() || matches!(route.action, Action::Redirect(_));
        let uri = needs_seen.then(|| req.uri().clone());
        let changed = needs_seen.then(|| target.path.clone()).flatten();
        let seen = filters::Seen {
            conn,
            route,
            edge: &router.edge,
            path: changed
                .as_deref()
                .or(uri.as_ref().map(http::Uri::path))
                .unwrap_or("/"),
            authority: target.authority.as_ref(),
            generation: generation.id.0,
        };
        let mut checked = match &effective {
            None => None,
            Some(f) => match filters::check(&req, &seen, f) {
                Ok(checked) => Some(checked),
                Err((error, shaped)) => {
                    return Served {
                        route: Some(route),
                        result: Err(error),
                        shaped,
                    }
                }
            },
        };
        let shaped = checked.as_mut().and_then(|c| c.shaped.take());
        if let Some(preflight) = checked.as_mut().and_then(|c| c.preflight.take()) {
            return Served {
                route: Some(route),
                result: Ok(*preflight),
                shaped,
            };
        }
        // 2½. The route's web application firewall (DESIGN §24).
        let mut answer_phases = None;
        if let Some(waf) = super::waf::of(route, effective.as_ref()) {
            let waf_noted = noted.as_deref_mut().map(|n| &mut n.waf);
            let at = (conn, generation, &**route, waf_noted);
            req = match pin_in_place(|| super::waf::stage(req, at, waf)).await {
                Ok((req, carried)) => {
                    answer_phases = carried;
                    req
                }
                Err(refused) => {
                    return Served {
                        route: Some(route),
                        result: Err(refused),
                        shaped,
                    }
                }
            };
        }
        // 3. The route's own admission: its quota (after authentication
        // when it is keyed by the subject), then its `max_inflight`.
        let quota = route.quota.as_ref();
        if let Some(quota) = quota.filter(|q| !q.spec().keyed_by_subject()) {
            match take_quota(route, quota, &req, conn, generation, None).await {
                Ok(advertised) => *context.advertised = advertised,
                Err(refused) => {
                    if let Some(noted) = noted.as_deref_mut() {
                        noted.limited = super::quota::limited_by(&refused);
                    }
                    return Served {
                        route: Some(route),
                        result: Err(refused),
                        shaped,
                    };
                }
            }
        }
        let step = match admit_route(route) {
            Ok(step) => step,
            Err(refused) => {
                return Served {
                    route: Some(route),
                    result: Err(refused),
                    shaped,
                }
            }
        };
        // 4. Authentication, then a quota keyed by the subject it found.
        if let Some(auth) = effective.as_ref().and_then(filters::Effective::auth) {
            // Boxed: the future of every request without `auth` stays as
            // small as it was.
            let authenticated = pin_in_place(|| {
                authenticate(
                    auth,
                    &mut req,
                    (conn, generation, route),
                    &target,
                    &mut *context.advertised,
                    noted.as_deref_mut(),
                )
            })
            .await;
            if let Err(refused) = authenticated {
                return Served {
                    route: Some(route),
                    result: Err(refused),
                    shaped,
                };
            }
        }
        // 5. What is forwarded, as the filters prepare it (a plain route's
        // request is not moved through it: it has nothing to prepare).
        let mut request_id = None;
        if effective.is_some() || context.grpc.is_some() {
            let prepared = prepare(
                req,
                effective.as_ref().zip(checked),
                &seen,
                (generation, &step),
                (&mut target.path, &mut target.host_rewrite),
                context.grpc.as_deref_mut(),
                noted.as_deref_mut(),
            );
            (req, request_id) = match prepared {
                Ok(prepared) => prepared,
                Err(error) => {
                    return Served {
                        route: Some(route),
                        result: Err(error),
                        shaped,
                    }
                }
            };
        }
        // 6. One step forward: a direct answer, a redirect, several
        // attempts (`retry.rs`) or one (`exchange.rs`).
        let mut result = match step {
            Step::Respond(direct) => Ok(filters::direct_response(direct)),
            Step::Redirect(redirect) => Ok(filters::redirect_for(
                redirect,
                &req,
                &seen,
                request_id.as_ref(),
            )),
            Step::Proxy(upstream, slot) => {
                // Not kept across the exchange (the future stays small).
                drop(request_id);
                // The route's cache, else its listener's default (for a
                // route that did not write `cache = "none"`).
                let cache = match (&route.cache, &route.spec.cache) {
                    (Some(zone), Some(spec)) => Some((zone, spec)),
                    _ if route.spec.cache_opt_out => None,
                    _ => effective
                        .as_ref()
                        .and_then(filters::Effective::cache)
                        .and_then(|spec| Some((generation.cache_zone(&spec.zone)?, spec))),
                };
                match (target.grpc_deadline, cache) {
                    _ if context.grpc.is_some() && !upstream.speaks_http2() => {
                        Err(ProxyError::GrpcOverHttp1)
                    }
                    // A gRPC call with a deadline: the answer's head is due by
                    // then (its body is held to it in `grpc.rs`).
                    (Some(deadline), _) => {
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        let forwarding = pin_in_place(|| {
                            super::retry::forward(req, target, conn, route, upstream, guard, slot)
                        });
                        tokio::time::timeout_at(deadline, forwarding)
                            .await
                            .unwrap_or(Err(ProxyError::UpstreamTimeout(left)))
                    }
                    // Through the route's cache zone (a gRPC call is not
                    // cached: its answer ends in trailers).
                    (None, Some((zone, spec))) if context.grpc.is_none() => {
                        let (outcome, answered) = pin_in_place(|| {
                            super::cache::answer(
                                (zone, spec),
                                req,
                                target,
                                conn,
                                route,
                                upstream,
                                guard,
                                slot,
                            )
                        })
                        .await;
                        route.shared.cached(outcome);
                        zone.answered(outcome);
                        if let Some(noted) = noted.as_deref_mut() {
                            noted.cache = Some(outcome);
                        }
                        answered
                    }
                    // Spelled out rather than through `retry::forward`: an
                    // async layer less for every other request.
                    (None, _) if super::retry::applies(route, &req) => {
                        pin_in_place(|| {
                            super::retry::forward_with_retries(
                                req, target, conn, route, upstream, guard, slot,
                            )
                        })
                        .await
                    }
                    (None, _) => {
                        super::exchange::forward(req, target, conn, route, upstream, guard, slot)
                            .await
                    }
                }
            }
        };
        // 6½. The answer through the firewall's rules, when they read it.
        if let Some(carried) = answer_phases {
            let waf_noted = noted.as_deref_mut().map(|n| &mut n.waf);
            let at = (&*route.shared, &*generation.ledger);
            result =
                pin_in_place(|| super::waf_answer::answer(*carried, result, at, waf_noted)).await;
        }
        // 7. A streamed answer keeps the listener's place until its last
        // byte.
        if let (Some(slot), Ok(response)) = (listener_slot, result.as_mut()) {
            if let Some(guards) = response.body_mut().guards_mut() {
                guards.listener = Some(slot);
            }
        }
        Served {
            route: Some(route),
            result,
            shaped,
        }
    }
}

/// Where routing placed a request: its listener's router and route, and
/// what the edge read of it (its authority, its path when normalizing
/// changed it, its place under the listener's `max_inflight`).
struct Routing<'g> {
    router: &'g crate::generation::Router,
    route: &'g Arc<Route>,
    authority: Option<HeaderValue>,
    normalized: Option<String>,
    listener_slot: Option<crate::generation::ListenerSlot>,
}

/// Stage 1: the listener's edge rules (smuggling, authority, an ACME
/// challenge, the access list, `max_inflight`, path normalization, a
/// misdirected host), the impact sample, then the route; `Err` when the
/// request is answered here.
#[expect(
    clippy::result_large_err,
    reason = "the answer is the request's, returned in place: a box would cost every refused request an allocation"
)]
fn route_request<'g>(
    req: &Request<ClientBody>,
    conn: &ConnContext,
    generation: &'g Generation,
    noted: Option<&mut Noted>,
) -> Result<Routing<'g>, Served<'g>> {
    if let Some(reason) = edge::smuggling_risk(req.headers()) {
        return Err(Served::refused(ProxyError::BadRequest(reason)));
    }
    let authority = match edge::authority(req) {
        Ok(authority) => authority,
        Err(reason) => return Err(Served::refused(ProxyError::BadRequest(reason))),
    };
    // An ACME http-01 validation, answered before routing and any fence
    // (DESIGN §21); a token no order waits for goes on to the routes.
    if conn.scheme == Scheme::HTTP && crate::tls::http01_waiting() {
        if let Some(answer) = edge::acme_challenge(req) {
            return Err(Served::answered(answer));
        }
    }
    let Some(router) = generation.router(&conn.listener) else {
        return Err(Served::refused(ProxyError::NoRoute));
    };
    if let Some(access) = &router.edge.access {
        if !access.admits(filters::client_ip(conn, req.headers(), &router.edge)) {
            return Err(Served::refused(ProxyError::Forbidden));
        }
    }
    let Ok(listener_slot) = router.admit() else {
        return Err(Served::refused(ProxyError::Saturated));
    };
    let path = match edge::normalize_path(req.uri().path(), &router.edge) {
        Ok(path) => path,
        Err(reason) => return Err(Served::refused(ProxyError::BadRequest(reason))),
    };
    if let Some(noted) = noted {
        if let Cow::Owned(normalized) = &path {
            noted.path.clone_from(normalized);
        }
        noted.authority = authority
            .as_ref()
            .map(|a| String::from_utf8_lossy(a.as_bytes()).into_owned());
    }
    let asked_method = edge::preflight_method(req);
    let (host, head) = edge::routing_head(req, authority.as_ref(), asked_method.as_ref());
    if let (Some(tls), Some(host)) = (conn.tls.get(), host) {
        if tls.misdirected(host) {
            return Err(Served::refused(ProxyError::Misdirected));
        }
    }
    // One request in a few, on each serving thread, is kept for `impact`.
    if let Some(sample) = router.sample.as_ref().filter(|s| s.offered()) {
        let offered = crate::generation::sample::Offered {
            method: head.method,
            host,
            path: &path,
            query: head.query,
            headers: head.headers,
        };
        sample.record(&offered, &router.sample_names);
    }
    let Some(route) = router.route(host, &path, &head) else {
        return Err(unrouted(req, router));
    };
    let normalized = match path {
        Cow::Owned(path) => Some(path),
        Cow::Borrowed(_) => None,
    };
    Ok(Routing {
        router,
        route,
        authority,
        normalized,
        listener_slot,
    })
}

/// No route takes the request: 404, unless the listener's default CORS
/// answers it (a preflight).
#[cold]
fn unrouted<'g>(req: &Request<ClientBody>, router: &'g crate::generation::Router) -> Served<'g> {
    let (answer, shaped) = match filters::unrouted(req, router.edge.defaults.as_deref()) {
        Some((answer, shaped)) => (answer, Some(shaped)),
        None => (None, None),
    };
    Served {
        route: None,
        result: answer.ok_or(ProxyError::NoRoute),
        shaped,
    }
}

/// Stage 4: the route's authentication (DESIGN §19), after its quota: a
/// flood of bad credentials is rate-limited before it costs a password
/// hash. Then the quota keyed by the subject it found. `Err`: refused.
async fn authenticate(
    auth: &crate::auth::Auth,
    req: &mut Request<ClientBody>,
    (conn, generation, route): (&ConnContext, &Generation, &Route),
    target: &Target<'_>,
    advertised: &mut Option<Advertised>,
    mut noted: Option<&mut Noted>,
) -> Result<(), ProxyError> {
    auth.strip_identity(req.headers_mut());
    let asked = crate::auth::Asked {
        method: req.method(),
        uri: req.uri(),
        headers: req.headers(),
        authority: target.authority.as_ref(),
        scheme: if conn.scheme == http::uri::Scheme::HTTPS {
            "https"
        } else {
            "http"
        },
        client: filters::client_ip(conn, req.headers(), target.edge),
    };
    let service = match auth {
        crate::auth::Auth::Forward(forward) => generation.upstream(&forward.upstream),
        _ => None,
    };
    let verdict = super::auth::check(auth, &asked, service, &route.shared).await;
    // A shadow copy of this request takes this verdict (never a
    // check of its own).
    if let Some(vouch) = req.extensions_mut().remove::<super::shadow::Vouch>() {
        vouch.send(&verdict);
    }
    let outcome = verdict.outcome();
    route.shared.authenticated(auth.method(), outcome);
    if let Some(noted) = noted.as_deref_mut() {
        noted.auth = Some(outcome);
    }
    let mut subject = None;
    match verdict {
        Verdict::Allowed(identity) => {
            auth.apply(&identity, req.headers_mut());
            subject = identity.subject;
        }
        Verdict::FailedOpen => {}
        Verdict::Denied(denial) => {
            return Err(ProxyError::Unauthenticated(denial));
        }
    }
    if let Some(quota) = route.quota.as_ref().filter(|q| q.spec().keyed_by_subject()) {
        let taken = take_quota(route, quota, req, conn, generation, subject.as_deref()).await;
        match taken {
            Ok(taken) => *advertised = taken,
            Err(refused) => {
                if let Some(noted) = noted.as_deref_mut() {
                    noted.limited = super::quota::limited_by(&refused);
                    noted.subject = subject;
                }
                return Err(refused);
            }
        }
    }
    if let Some(noted) = noted {
        noted.subject = subject;
    }
    Ok(())
}

/// Stage 5: what is forwarded, as the route's filters prepare it (the
/// request id, the streamed body limit, a rewrite, request headers), a
/// copy to each of its mirrors, and a gRPC call's own changes. Returns
/// the request and its id; `Err`: refused.
fn prepare<'g>(
    mut req: Request<ClientBody>,
    filtered: Option<(&filters::Effective<'g>, filters::Checked<'g>)>,
    seen: &filters::Seen<'_, 'g>,
    (generation, step): (&'g Generation, &Step<'_>),
    (path, host_rewrite): (
        &mut Option<String>,
        &mut Option<&'g crate::plan::HostRewrite>,
    ),
    grpc: Option<&mut super::grpc::Call>,
    noted: Option<&mut Noted>,
) -> Result<(Request<ClientBody>, Option<HeaderValue>), ProxyError> {
    let route = seen.route;
    let mut request_id = None;
    if let Some((f, checked)) = filtered {
        let (prepared, forwarded) = filters::prepare(req, &checked, seen, f)?;
        if let Some(noted) = noted {
            noted.request_id = checked
                .request_id
                .as_ref()
                .map(|id| String::from_utf8_lossy(id.as_bytes()).into_owned());
            noted.upstream_path.clone_from(&forwarded);
        }
        req = prepared;
        if forwarded.is_some() {
            *path = forwarded;
        }
        *host_rewrite = f.host_rewrite();
        request_id = checked.request_id;
        // A copy to each of the route's mirrors, as it is forwarded.
        if let Step::Proxy(..) = step {
            for mirror in f.mirrors() {
                if let Some(upstream) = generation.upstream(&mirror.upstream) {
                    req = super::mirror::copy(req, mirror, route, upstream, path.as_deref());
                }
            }
        }
    }
    if let Some(call) = grpc {
        if call.malformed_timeout {
            req.headers_mut().remove(&crate::grpc::GRPC_TIMEOUT);
        }
        if route.spec.grpc_web {
            let (translated, mode) = super::grpc_web::translate(req);
            req = translated;
            call.web = mode;
        }
    }
    Ok((req, request_id))
}

/// Where a route sends an admitted request.
enum Step<'r> {
    Respond(&'r DirectResponse),
    Redirect(&'r crate::plan::Redirect),
    /// With the route's `max_inflight` slot.
    Proxy(&'r Arc<Upstream>, Option<crate::generation::RouteSlot>),
}

/// A token of the route's quota for this request (see `quota.rs`): the
/// wait for a fleet's store, when there is one, is boxed so that every
/// other request's future stays as small as it was.
/// The future holds neither the request nor the connection: the key is
/// made, and the token taken if one is leased, before it is polled.
fn take_quota<'r>(
    route: &'r Route,
    quota: &crate::generation::Quota,
    req: &Request<ClientBody>,
    conn: &ConnContext,
    generation: &Generation,
    subject: Option<&str>,
) -> impl std::future::Future<Output = Result<Option<Advertised>, ProxyError>> + use<'r> {
    let taken = super::quota::take(route, quota, req, conn, generation, subject);
    async move {
        match taken {
            super::quota::Taken::Now(decided) => decided,
            super::quota::Taken::Wait(waiting) => Box::pin(waiting.decided()).await,
        }
    }
}

/// The route's `max_inflight`, and where it sends an admitted request.
fn admit_route(route: &Route) -> Result<Step<'_>, ProxyError> {
    let slot = route.admit().map_err(|_| ProxyError::Saturated)?;
    Ok(match &route.action {
        // A direct answer is made at once: it holds no slot.
        Action::Respond(direct) => Step::Respond(direct),
        Action::Redirect(redirect) => Step::Redirect(redirect),
        Action::Proxy(upstream) => Step::Proxy(upstream, slot),
    })
}

//! The shadow stage on the request path (DESIGN §22): while an
//! activation shadows its candidate, a share of the requests the active
//! generation admits is copied through the candidate generation (built,
//! not active) to its upstreams; the copy's answer is discarded, and its
//! status and latency are compared with the active generation's answer
//! to the same request, under the candidate's route.
//!
//! Only safe methods are copied (GET, HEAD, OPTIONS): a shadow usually
//! reaches the same backends as the active generation, and a copy of a
//! write arriving after a later write would undo it, idempotent or not.
//! A copy never delays or changes the client's answer: it is taken before
//! the request is served (its body, if any, teed up to 64 KiB as it
//! streams), runs on its own task, holds no part of the active
//! generation's in-flight count, and at most `max_inflight` run at once
//! (one more is dropped and counted). It takes no quota token or route
//! slot (those are the live traffic's) and makes one attempt (no retry),
//! and reports nothing to passive health or outlier detection (a
//! candidate's mistake must not eject a backend the active generation
//! serves from).
//!
//! A copy never runs an `auth` check of its own (a second password hash
//! or auth-service call per copy): it takes the active request's verdict
//! (`Vouch`). Where the candidate's route has `auth`, the copy waits for
//! the active request's check; allowed, it carries the identity that
//! check produced (the candidate's identity headers stripped first, then
//! the identity's set, the credentials removed if the identity says so);
//! denied, it is answered locally with the denial's status and sent
//! nowhere; failed open, it goes on without an identity. When the
//! active route checked nothing there is no verdict to take and the copy
//! is skipped (counted, not compared).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt as _;

use super::conn::ConnContext;
use super::copy::{self, Outcome, Report, Slot};
use super::edge;
use super::filters;
use crate::auth::{Identity, Verdict};
use crate::backends::{Attempt, ClientBody};
use crate::generation::{Action, CopyKind, Generation, RouteShared};
use crate::runtime::shadow::{Answer, Shadow};

/// A request that was copied: the copy waits for the client's answer.
pub(super) struct Offered {
    tx: tokio::sync::oneshot::Sender<Answer>,
}

impl Offered {
    /// The active generation's answer to the request: `status` (as the
    /// generation's ledger counts it) after `elapsed`.
    pub(super) fn answered(self, status: u16, elapsed: Duration) {
        let _ = self.tx.send(Answer { status, elapsed });
    }
}

/// What the active request's `auth` check decided, for its copy.
enum Vouched {
    Identity(Identity),
    Denied(StatusCode),
    FailedOpen,
}

/// Rides in a copied request's extensions to its `auth` step, which
/// sends the verdict to the copy (`send`); dropped unsent (the route
/// checks nothing, the request never got that far), the copy has no
/// verdict to take.
#[derive(Clone)]
pub(super) struct Vouch(copy::Handoff<Vouched>);

impl Vouch {
    pub(super) fn send(self, verdict: &Verdict) {
        self.0.send(match verdict {
            Verdict::Allowed(identity) => Vouched::Identity(identity.clone()),
            Verdict::Denied(denial) => Vouched::Denied(denial.status()),
            Verdict::FailedOpen => Vouched::FailedOpen,
        });
    }
}

fn count(shadow: &Shadow, route: &RouteShared, outcome: Outcome) {
    shadow.counted(outcome.index());
    route.copied(CopyKind::Shadow, outcome.index());
}

/// Copies `req` through the shadow's candidate when its share picks it;
/// returns the request to serve (its body teed when it has one) and,
/// for a copy, what waits for its answer. `pinned`: the generation that
/// admitted it (only the active generation's answers are compared).
pub(super) fn offer(
    req: Request<ClientBody>,
    conn: &Arc<ConnContext>,
    shadow: Arc<Shadow>,
    pinned: &Generation,
) -> (Request<ClientBody>, Option<Offered>) {
    // A WAF shadow judges requests; it copies none upstream.
    if shadow.waf.is_some() {
        return (super::waf_shadow::offer(req, conn, shadow, pinned), None);
    }
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe
        || pinned.id != shadow.active
        || fastrand::f64() * 100.0 >= shadow.percent
        || req.headers().contains_key(header::UPGRADE)
        || edge::smuggling_risk(req.headers()).is_some()
        || shadow.candidate.router(&conn.listener).is_none()
    {
        return (req, None);
    }
    let unrouted = RouteShared::unrouted();
    if copy::declared_too_long(&req) {
        count(&shadow, unrouted, Outcome::Skipped);
        return (req, None);
    }
    let Some(slot) = Slot::take(&shadow.inflight, shadow.max_inflight) else {
        count(&shadow, unrouted, Outcome::Dropped);
        return (req, None);
    };
    // The client's request as it came: the candidate applies its own
    // routing and filters to it.
    let copied = copy::bare_head(&req);
    let (vouch, vouched) = copy::Handoff::new();
    let mut req = req;
    req.extensions_mut().insert(Vouch(vouch));
    let (req, body) = copy::tee(req);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let conn = Arc::clone(conn);
    tokio::spawn(async move {
        let _slot = slot;
        let Some(body) = copy::received(body).await else {
            return count(&shadow, unrouted, Outcome::Skipped);
        };
        let started = Instant::now();
        let replayed = replay(copied.map(|()| body), &conn, &shadow.candidate, vouched).await;
        let candidate = Answer {
            status: replayed.status.as_u16(),
            elapsed: started.elapsed(),
        };
        let route = replayed.route.unwrap_or(unrouted);
        match rx.await {
            Ok(_) if replayed.outcome == Outcome::Skipped => {
                count(&shadow, route, Outcome::Skipped)
            }
            Ok(active) => {
                shadow.compared(route.name(), active, candidate);
                count(&shadow, route, replayed.outcome);
            }
            // The client went before its answer: nothing to compare.
            Err(_) => count(&shadow, route, Outcome::Skipped),
        }
    });
    (req, Some(Offered { tx }))
}

/// What the candidate did with a copy.
struct Replayed<'g> {
    route: Option<&'g RouteShared>,
    status: StatusCode,
    outcome: Outcome,
}

impl<'g> Replayed<'g> {
    fn local(route: Option<&'g RouteShared>, status: StatusCode) -> Self {
        Replayed {
            route,
            status,
            outcome: Outcome::Answered,
        }
    }
}

/// Where and how a replayed request goes to its upstream.
struct Sent<'a> {
    forwarded: Option<&'a str>,
    rewrite: Option<&'a crate::plan::HostRewrite>,
    upstream: &'a crate::generation::Upstream,
    timeout: Duration,
}

impl Sent<'_> {
    /// Sends `req`'s head with `body` once (no retries, nothing
    /// reported): the status the candidate answered and how.
    async fn send(self, req: Request<ClientBody>, body: Bytes) -> (StatusCode, Outcome) {
        let (mut head, path_and_query) = copy::head(&req, self.forwarded);
        drop(req);
        if let Some(crate::plan::HostRewrite::Literal(host)) = self.rewrite {
            head.headers.insert(header::HOST, host.clone());
        }
        let sent = copy::send(
            head,
            path_and_query,
            body,
            self.upstream,
            self.timeout,
            Report::Nothing,
            matches!(self.rewrite, Some(crate::plan::HostRewrite::Backend)),
            0,
        );
        match sent.await {
            Some(Ok(answer)) => (answer.head.status, Outcome::Answered),
            Some(Err(Attempt::Timeout)) => (StatusCode::GATEWAY_TIMEOUT, Outcome::Timeout),
            Some(Err(_)) => (StatusCode::BAD_GATEWAY, Outcome::Failed),
            None => (StatusCode::SERVICE_UNAVAILABLE, Outcome::Failed),
        }
    }
}

/// The replayed request through the route's filters (checks, the
/// verdict the live request's authentication vouched for, rewrites): the
/// prepared request and its rewritten path; or the candidate's own
/// answer (its `route` is the caller's to fill).
async fn filtered<'g>(
    req: Request<ClientBody>,
    seen: &filters::Seen<'_, '_>,
    f: &filters::Effective<'_>,
    vouched: tokio::sync::oneshot::Receiver<Vouched>,
) -> Result<(Request<ClientBody>, Option<String>), Replayed<'g>> {
    let mut req = req;
    let checked = match filters::check(&req, seen, f) {
        Ok(checked) => checked,
        Err((error, _)) => return Err(Replayed::local(None, error.status())),
    };
    if let Some(preflight) = &checked.preflight {
        return Err(Replayed::local(None, preflight.status()));
    }
    if let Some(auth) = f.auth() {
        auth.strip_identity(req.headers_mut());
        match vouched.await {
            Ok(Vouched::Identity(identity)) => auth.apply(&identity, req.headers_mut()),
            Ok(Vouched::FailedOpen) => {}
            Ok(Vouched::Denied(status)) => return Err(Replayed::local(None, status)),
            Err(_) => {
                return Err(Replayed {
                    route: None,
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    outcome: Outcome::Skipped,
                })
            }
        }
    }
    filters::prepare(req, &checked, seen, f).map_err(|error| Replayed::local(None, error.status()))
}

/// Runs a copy through `candidate`: its listener rules, its routes, its
/// filters, the active request's `auth` verdict (`vouched`), its action;
/// a proxied copy goes to its upstream once.
async fn replay<'g>(
    req: Request<Bytes>,
    conn: &ConnContext,
    candidate: &'g Generation,
    vouched: tokio::sync::oneshot::Receiver<Vouched>,
) -> Replayed<'g> {
    let (parts, body) = req.into_parts();
    let req = Request::from_parts(
        parts,
        ClientBody::Other(Box::pin(
            http_body_util::Full::new(body.clone()).map_err(|never| match never {}),
        )),
    );
    let copy::Routed {
        router,
        route,
        authority,
        path,
    } = match copy::route_in(&req, conn, candidate) {
        Ok(routed) => routed,
        Err(status) => return Replayed::local(None, status),
    };
    let shared = Some(&*route.shared);
    let effective = filters::Effective::of(
        route.spec.filters.as_deref(),
        router.edge.defaults.as_deref(),
    );
    let mut forwarded = (path != req.uri().path()).then(|| path.clone());
    let mut req = req;
    if let Some(f) = &effective {
        let seen = filters::Seen {
            conn,
            route,
            edge: &router.edge,
            path: &path,
            authority: authority.as_ref(),
            generation: candidate.id.0,
        };
        match filtered(req, &seen, f, vouched).await {
            Ok((prepared, rewritten)) => {
                req = prepared;
                if rewritten.is_some() {
                    forwarded = rewritten;
                }
            }
            Err(local) => {
                return Replayed {
                    route: shared,
                    ..local
                }
            }
        }
    }
    let upstream = match &route.action {
        Action::Respond(direct) => return Replayed::local(shared, direct.status),
        Action::Redirect(redirect) => return Replayed::local(shared, redirect.status),
        Action::Proxy(upstream) => upstream,
    };
    let rewrite = effective
        .as_ref()
        .and_then(filters::Effective::host_rewrite);
    let sent = Sent {
        forwarded: forwarded.as_deref(),
        rewrite,
        upstream,
        timeout: route.timeout(),
    };
    let (status, outcome) = sent.send(req, body).await;
    Replayed {
        route: shared,
        status,
        outcome,
    }
}

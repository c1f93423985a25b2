//! Route `mirror` on the request path (DESIGN §17, §22): a share of the
//! route's requests is copied to another upstream of the request's
//! generation, and the copies' answers are discarded.
//!
//! A copy never delays or changes the client's answer: its body is
//! teed from the client's as it streams to the route's own upstream (a
//! copy only starts once that body has ended, and only if it was at most
//! 64 KiB), it runs as a task of its own that holds no part of the
//! generation's in-flight count, and at most `max_inflight` copies of the
//! route are in flight: one more is dropped and counted. Methods that
//! are not idempotent are copied only when the route lists them in
//! `mirror_methods`. Every copy's outcome is counted in
//! `cutover_shadow_requests_total{route,kind="mirror",outcome}`
//! (`copy::Outcome`). The mechanics are `copy.rs`'s.

use std::sync::Arc;

use http::{Method, Request};

use super::copy::{self, Outcome, Report, Slot};
use crate::backends::{Attempt, ClientBody};
use crate::generation::{CopyKind, Route, RouteShared, Upstream};
use crate::plan::Mirror;

fn count(route: &RouteShared, outcome: Outcome) {
    route.copied(CopyKind::Mirror, outcome.index());
}

/// Idempotent by RFC 9110 §9.2.2: copying them twice changes nothing
/// more than once.
fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Copies `req` to `mirror`'s upstream when the route's share picks it;
/// returns the request to forward (its body teed when a copy was made).
/// `path`: the path forwarded, when a `rewrite` changed it.
pub(super) fn copy(
    req: Request<ClientBody>,
    mirror: &Mirror,
    route: &Route,
    upstream: &Arc<Upstream>,
    path: Option<&str>,
) -> Request<ClientBody> {
    if fastrand::f64() * 100.0 >= mirror.percent {
        return req;
    }
    if !idempotent(req.method()) && !mirror.methods.contains(req.method()) {
        return req;
    }
    if copy::declared_too_long(&req) {
        count(&route.shared, Outcome::Skipped);
        return req;
    }
    let Some(slot) = Slot::take(&route.shared.mirror_inflight, mirror.max_inflight) else {
        count(&route.shared, Outcome::Dropped);
        return req;
    };
    let (head, path_and_query) = copy::head(&req, path);
    let (req, body) = copy::tee(req);
    let upstream = Arc::clone(upstream);
    let shared = Arc::clone(&route.shared);
    let timeout = route.timeout();
    tokio::spawn(async move {
        let _slot = slot;
        let Some(body) = copy::received(body).await else {
            return count(&shared, Outcome::Skipped);
        };
        let sent = copy::send(
            head,
            path_and_query,
            body,
            &upstream,
            timeout,
            Report::Health,
            false,
            0,
        );
        let outcome = match sent.await {
            Some(Ok(_)) => Outcome::Answered,
            Some(Err(Attempt::Timeout)) => Outcome::Timeout,
            Some(Err(_)) | None => Outcome::Failed,
        };
        count(&shared, outcome);
    });
    req
}

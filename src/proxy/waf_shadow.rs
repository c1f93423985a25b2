//! A WAF shadow stage on the request path (DESIGN §24): while an
//! activation shadows its candidate with `shadow.waf`, a share of the
//! requests the active generation admits is judged by the candidate's
//! firewall too, in detection mode, on a task of its own: the request's
//! head as it came, and its body as it streams to the active generation
//! (teed, up to the candidate's `request_body_limit` and at most
//! `MAX_BODY`). Nothing is sent anywhere, and the client's answer is
//! never delayed or changed. The active generation's own verdict on the
//! same request comes back through the request's extensions
//! (`waf::Verdicts`): the two are compared per route of the candidate.
//!
//! Every method is judged (a firewall's business is with writes too). At
//! most `max_inflight` evaluations run at once (one more is dropped and
//! counted); a body past what is kept, or one the client never finished,
//! is skipped (counted). A route of the candidate without a firewall is
//! not judged: it refuses nothing.

use std::sync::Arc;

use http::{header, Request};

use super::conn::ConnContext;
use super::copy::{self, Slot};
use super::filters;
use super::waf;
use crate::backends::ClientBody;
use crate::generation::Generation;
use crate::runtime::shadow::Shadow;
use crate::waf::tally::Judged;

/// The most of a body kept for the candidate's rules, whatever its
/// `request_body_limit`: at most `max_inflight` of these are held.
const MAX_BODY: usize = 1024 * 1024;

/// Has the shadow's candidate judge `req` when its share picks it;
/// returns the request to serve (its body teed when it has one).
/// `pinned`: the generation that admitted it (only the active
/// generation's verdicts are compared).
pub(super) fn offer(
    req: Request<ClientBody>,
    conn: &Arc<ConnContext>,
    shadow: Arc<Shadow>,
    pinned: &Generation,
) -> Request<ClientBody> {
    let Some(tally) = shadow.waf.as_ref() else {
        return req;
    };
    if pinned.id != shadow.active
        || fastrand::f64() * 100.0 >= shadow.percent
        || req.headers().contains_key(header::UPGRADE)
    {
        return req;
    }
    let Ok(routed) = copy::route_in(&req, conn, &shadow.candidate) else {
        return req;
    };
    let effective = filters::Effective::of(
        routed.route.spec.filters.as_deref(),
        routed.router.edge.defaults.as_deref(),
    );
    let Some(spec) = waf::of(routed.route, effective.as_ref()) else {
        return req;
    };
    let Some(ruleset) = shadow.candidate.spec.waf_rulesets.get(&spec.ruleset) else {
        return req;
    };
    let cap = usize::try_from(ruleset.request_body_limit)
        .unwrap_or(usize::MAX)
        .min(MAX_BODY);
    if copy::declares_more_than(&req, cap) {
        tally.skipped();
        return req;
    }
    let Some(slot) = Slot::take(&shadow.inflight, shadow.max_inflight) else {
        tally.dropped();
        return req;
    };
    let route = Arc::clone(routed.route.shared.name());
    let spec = spec.clone();
    let head = copy::bare_head(&req);
    let (verdicts, active) = copy::Handoff::new();
    let mut req = req;
    req.extensions_mut().insert(waf::Verdicts(verdicts));
    let (req, body) = copy::tee_within(req, cap);
    let conn = Arc::clone(conn);
    tokio::spawn(async move {
        let _slot = slot;
        let Some(tally) = shadow.waf.as_ref() else {
            return;
        };
        let Some(body) = copy::received(body).await else {
            return tally.skipped();
        };
        let Some(ruleset) = shadow.candidate.spec.waf_rulesets.get(&spec.ruleset) else {
            return;
        };
        let (parts, ()) = head.into_parts();
        let (candidate, rules) = waf::judge(&spec, ruleset, &parts, &body, &conn);
        // Not sent: the active route has no firewall, or the request was
        // answered before it (a 404, a filter's refusal).
        let active = active.await.unwrap_or(false);
        tally.judged(
            &route,
            &Judged {
                active,
                candidate,
                rules: &rules,
                method: parts.method.as_str(),
                path: parts.uri.path(),
            },
        );
    });
    req
}

//! A route's web application firewall (DESIGN §24): the request's head,
//! and its body up to the rule set's `request_body_limit`, through the
//! rules' phases 1 and 2, after the route's filters and before its
//! admission. A blocked request gets the rule's status (403) with its
//! request id; the rule ids go to the access log only.
//!
//! The body is read here, within the limit, and handed on as read (the
//! rest, past the limit with `process_partial`, streams after it).

use http::Request;

use super::conn::ConnContext;
use super::error::ProxyError;
use crate::backends::ClientBody;
use crate::plan::{RouteWafSpec, WafLimitAction, WafRuleset};
use crate::waf::Mode;

/// What the firewall did with one request, for its access-log line and
/// `cutover_waf_decisions_total`.
#[derive(Debug, Clone)]
pub struct Decision {
    pub mode: Mode,
    /// `pass`, `blocked`, `would_block` (detection mode).
    pub outcome: &'static str,
    /// CRS's inbound anomaly score, when the rules set one.
    pub score: u32,
    /// The ids of the rules that matched, in order.
    pub rules: Vec<u32>,
    /// A blocked request's id, as its answer gives it: the access log's
    /// `request_id`, so that a client's 403 leads to its line.
    pub request_id: Option<String>,
}

impl Decision {
    /// The access log's `waf` field.
    pub fn logged(&self) -> String {
        let mode = match self.mode {
            Mode::Block => "block",
            Mode::Detect => "detect",
            Mode::Off => "off",
        };
        let rules: Vec<String> = self.rules.iter().map(u32::to_string).collect();
        format!(
            "{mode}:{}:score={}:rules={}",
            self.outcome,
            self.score,
            rules.join(",")
        )
    }
}

/// The route's `waf`, else its listener's default (unless the route
/// wrote `waf = "none"`).
pub fn of<'g>(
    route: &'g crate::generation::Route,
    effective: Option<&super::filters::Effective<'g>>,
) -> Option<&'g RouteWafSpec> {
    route
        .spec
        .firewall(effective.and_then(super::filters::Effective::defaults))
}

/// A request its rules let through, on a route whose rules read the
/// answer too (CRS's outbound rules): what the answer's phases take up
/// (`waf_answer.rs`).
pub struct Carried {
    pub(super) paused: crate::waf::Paused,
    pub(super) request: crate::waf::Request,
    pub(super) request_id: http::HeaderValue,
    pub(super) ruleset: std::sync::Arc<WafRuleset>,
}

/// The request path's stage: `spec`'s rule set (from the generation
/// serving the request) on `req`, what it did noted in `noted`; the
/// request to go on with and, when the rules read the answer, what
/// their phases on it need.
pub async fn stage(
    mut req: Request<ClientBody>,
    (conn, generation, route, noted): (
        &ConnContext,
        &crate::generation::Generation,
        &crate::generation::Route,
        Option<&mut Option<Decision>>,
    ),
    spec: &RouteWafSpec,
) -> Result<(Request<ClientBody>, Option<Box<Carried>>), ProxyError> {
    let Some(ruleset) = generation.spec.waf_rulesets.get(&spec.ruleset) else {
        return Ok((req, None));
    };
    let verdicts = req.extensions_mut().remove::<Verdicts>();
    let (checked, decision) = check(spec, ruleset, req, conn, &route.shared).await;
    if let Some(verdicts) = verdicts {
        verdicts
            .0
            .send(decision.as_ref().is_some_and(|d| d.outcome != "pass"));
    }
    // What a guard's `max_block_ratio` compares.
    if decision.as_ref().is_some_and(|d| d.outcome == "blocked") {
        generation.ledger.waf_blocked.add(1);
    }
    if let Some(noted) = noted {
        *noted = decision;
    }
    checked
}

/// Runs the route's rules on `req`; the request to go on with, or the
/// refusal.
async fn check(
    spec: &RouteWafSpec,
    ruleset: &std::sync::Arc<WafRuleset>,
    req: Request<ClientBody>,
    conn: &ConnContext,
    route: &crate::generation::RouteShared,
) -> (
    Result<(Request<ClientBody>, Option<Box<Carried>>), ProxyError>,
    Option<Decision>,
) {
    let (parts, body) = req.into_parts();
    let limit = usize::try_from(ruleset.request_body_limit).unwrap_or(usize::MAX);
    let (read, mut body) = super::body::read_within(body, limit).await;
    if let Some(error) = body.failed.take() {
        return (Err(ProxyError::client_body(&*error)), None);
    }
    if read.len() > limit && ruleset.limit_action == WafLimitAction::Reject {
        route.waf_decided("body_too_large");
        return (Err(ProxyError::PayloadTooLarge), None);
    }
    let request_id = super::filters::request_id(&parts.headers);
    let request = rules_request(&parts, &read[..read.len().min(limit)], &request_id, conn);
    let (interrupted, decision, paused) =
        evaluate(spec, (spec.mode, ruleset.answer_phases), ruleset, &request);
    route.waf_decided(decision.outcome);
    crate::telemetry::waf::matched(&decision.rules);
    if let Some(interruption) = interrupted {
        return (
            Err(ProxyError::WafBlocked {
                status: interruption.status,
                request_id,
            }),
            Some(decision),
        );
    }
    let body = ClientBody::Other(Box::pin(body));
    let carried = paused.map(|paused| {
        Box::new(Carried {
            paused,
            request,
            request_id,
            ruleset: std::sync::Arc::clone(ruleset),
        })
    });
    (
        Ok((Request::from_parts(parts, body), carried)),
        Some(decision),
    )
}

/// Runs `spec`'s rules (`ruleset`) on `request` in `mode`: the
/// interruption, if the rules interrupt it, what they did, and (with
/// `keep`, when they let it through) the transaction paused for the
/// answer's phases.
fn evaluate(
    spec: &RouteWafSpec,
    (mode, keep): (Mode, bool),
    ruleset: &WafRuleset,
    request: &crate::waf::Request,
) -> (
    Option<crate::waf::Interruption>,
    Decision,
    Option<crate::waf::Paused>,
) {
    let evaluation = spec.evaluate(ruleset, request, (mode, keep));
    let decision = Decision {
        mode,
        outcome: evaluation.outcome,
        score: evaluation.score,
        rules: evaluation.rules,
        request_id: evaluation.interrupted.map(|_| request.id.clone()),
    };
    (evaluation.interrupted, decision, evaluation.paused)
}

/// A WAF shadow stage's judgement of one request (`waf_shadow`): `spec`'s
/// rules in detection mode on its head `parts` and `body` (within the
/// rule set's limit). Whether they would refuse it, and the rules that
/// matched.
pub(super) fn judge(
    spec: &RouteWafSpec,
    ruleset: &WafRuleset,
    parts: &http::request::Parts,
    body: &[u8],
    conn: &ConnContext,
) -> (bool, Vec<u32>) {
    let limit = usize::try_from(ruleset.request_body_limit).unwrap_or(usize::MAX);
    let id = super::filters::request_id(&parts.headers);
    let request = rules_request(parts, &body[..body.len().min(limit)], &id, conn);
    let (_, decision, _) = evaluate(spec, (Mode::Detect, false), ruleset, &request);
    (decision.outcome != "pass", decision.rules)
}

/// Rides in a request a WAF shadow stage took (`waf_shadow`): the active
/// generation's firewall says through it whether it refused the request
/// (blocked it, or would have in detection mode). Dropped unsent (the
/// route has no firewall, or the request never reached it), it did not.
#[derive(Clone)]
pub(super) struct Verdicts(pub(super) super::copy::Handoff<bool>);

/// The request as the rules read it: its head, `body` (within the
/// limit), and `id` as `UNIQUE_ID`.
fn rules_request(
    parts: &http::request::Parts,
    body: &[u8],
    id: &http::HeaderValue,
    conn: &ConnContext,
) -> crate::waf::Request {
    let mut headers: Vec<(String, Vec<u8>)> = parts
        .headers
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    // An HTTP/2 or HTTP/3 request names its host in `:authority`.
    if !parts.headers.contains_key(http::header::HOST) {
        if let Some(authority) = parts.uri.authority() {
            headers.push(("host".to_owned(), authority.as_str().as_bytes().to_vec()));
        }
    }
    crate::waf::Request {
        id: String::from_utf8_lossy(id.as_bytes()).into_owned(),
        remote_addr: conn.remote.ip().to_string(),
        method: parts.method.as_str().to_owned(),
        uri: parts
            .uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
        protocol: protocol(parts.version).to_owned(),
        headers,
        body: body.to_vec(),
    }
}

fn protocol(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

//! A route's web application firewall on the answer (DESIGN §24): when
//! its rule set has rules for the answer's phases (CRS's outbound rules:
//! data leakage, error pages), the request's transaction, paused after
//! phase 2 (`waf::Carried`), takes up the upstream's answer before the
//! client gets anything: phase 3 on its head, phase 4 on its body when
//! its media type is one the rules read (`ANSWER_BODY_TYPES`), read up to
//! `response_body_limit` (the rest passed on unread, as ModSecurity's
//! `ProcessPartial`). In blocking mode an answer the rules refuse is
//! replaced by the rule's status (403) with the request's id; the
//! access log's `waf` field gains the rules that matched (phase 5's
//! too: CRS's correlation rules run last).

use bytes::Bytes;
use http::Response;
use http_body::Body as _;

use super::body::{read_within, ResponseBody};
use super::error::ProxyError;
use super::waf::{Carried, Decision};
use crate::plan::ANSWER_BODY_TYPES;
use crate::waf::{Mode, Transaction};

/// `result`, the upstream's answer (or its failure), through the rules'
/// answer phases; what they did noted in `noted`, counted on `route` and
/// (a refusal) in `ledger`.
pub async fn answer(
    carried: Carried,
    result: Result<Response<ResponseBody>, ProxyError>,
    (route, ledger): (&crate::generation::RouteShared, &crate::generation::Ledger),
    noted: Option<&mut Option<Decision>>,
) -> Result<Response<ResponseBody>, ProxyError> {
    let response = result?;
    let (parts, body) = response.into_parts();
    let limit = usize::try_from(carried.ruleset.response_body_limit).unwrap_or(usize::MAX);
    let (read, body) = if read_by_rules(&parts.headers) && !body.is_end_stream() {
        let (read, replayed) = read_within(body, limit).await;
        (read, ResponseBody::Replayed(Box::new(replayed)))
    } else {
        (Bytes::new(), body)
    };
    let answer = crate::waf::Response {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect(),
        body: read[..read.len().min(limit)].to_vec(),
    };
    let Carried {
        paused,
        request,
        request_id,
        ruleset,
    } = carried;
    let before = paused.matches.len();
    let mut tx = Transaction::resume(&ruleset.rules, &request, paused);
    let interrupted = tx.response(&answer);
    // Phase 5 (CRS's correlation rules log the scores), whatever the
    // answer's phases decided.
    tx.logging();
    let outcome = match (interrupted, tx.would_interrupt) {
        (Some(_), _) => Some("answer_blocked"),
        (None, Some(_)) => Some("answer_would_block"),
        (None, None) => None,
    };
    let matched: Vec<u32> = tx.matches[before..].iter().map(|m| m.id).collect();
    if let Some(outcome) = outcome {
        route.waf_decided(outcome);
    }
    crate::telemetry::waf::matched(&matched);
    if let Some(decision) = noted.and_then(Option::as_mut) {
        decision.rules.extend(matched);
        match (outcome, decision.mode) {
            (Some(_), Mode::Block) => decision.outcome = "blocked",
            (Some(_), _) if decision.outcome == "pass" => decision.outcome = "would_block",
            _ => {}
        }
        if interrupted.is_some() {
            decision.request_id = Some(String::from_utf8_lossy(request_id.as_bytes()).into_owned());
        }
    }
    if let Some(interruption) = interrupted {
        ledger.waf_blocked.add(1);
        return Err(ProxyError::WafBlocked {
            status: interruption.status,
            request_id,
        });
    }
    Ok(Response::from_parts(parts, body))
}

/// Whether the rules read an answer with these headers' body: one of
/// `ANSWER_BODY_TYPES`, not already encoded (a compressed body would be
/// read as bytes the rules cannot match).
fn read_by_rules(headers: &http::HeaderMap) -> bool {
    let encoded = headers
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    let media = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    !encoded && media.is_some_and(|m| ANSWER_BODY_TYPES.contains(&m.as_str()))
}

//! A route's quota (`routes.quota`; `scope = "fleet"` is issue 58): the
//! request's key from the quota's sources, a token from this process's
//! bucket or from the fleet's lease, the decision counted, and the
//! refusal a client is answered with (429 with `RateLimit-Policy`,
//! `RateLimit` and `Retry-After`; 503 when a failed store denies).
//!
//! Deciding is synchronous unless a fleet quota's lease is empty: only
//! then does the request wait, at most the quota's `deadline`
//! (`limits::fleet`).

use std::borrow::Cow;
use std::sync::Arc;

use http::Request;

use super::conn::ConnContext;
use super::edge;
use super::error::{Advertised, Limited, ProxyError};
use crate::backends::ClientBody;
use crate::generation::{Generation, Quota, Route};
use crate::limits::fleet::{Pending, Take};
use crate::limits::{push_part, Decision, Outcome, Scope};
use crate::plan::{QuotaKey, QuotaSpec};

/// A decision made at once, or one that waits for the fleet's store.
pub enum Taken<'r> {
    Now(Result<Option<Advertised>, ProxyError>),
    Wait(Waiting<'r>),
}

/// A request waiting for its fleet lease's refill.
pub struct Waiting<'r> {
    route: &'r Route,
    pending: Pending,
}

impl Waiting<'_> {
    pub async fn decided(self) -> Result<Option<Advertised>, ProxyError> {
        let decision = self.pending.decide().await;
        verdict(self.route, Scope::Fleet, decision)
    }
}

/// Takes a token of `quota` (the route's) for this request. `subject`:
/// what `auth` found, for a quota keyed by it.
pub fn take<'r>(
    route: &'r Route,
    quota: &Quota,
    req: &Request<ClientBody>,
    conn: &ConnContext,
    generation: &Generation,
    subject: Option<&str>,
) -> Taken<'r> {
    let key = key(quota.spec(), req, conn, subject);
    let (scope, decision) = match quota {
        Quota::Local(table) => (
            Scope::Local,
            match table.take(&key) {
                Ok(left) => Decision::counted(Outcome::Allowed, left),
                Err(wait) => Decision::refused(Outcome::Limited, wait),
            },
        ),
        Quota::Fleet(fleet) => match generation.limit_store() {
            Some(store) => match fleet.take(&key, store) {
                Take::Now(decision) => (Scope::Fleet, decision),
                Take::Wait(pending) => return Taken::Wait(Waiting { route, pending }),
            },
            // Validation refuses a fleet quota without a store.
            None => (Scope::Fleet, Decision::allowed(Outcome::FailedOpen)),
        },
    };
    Taken::Now(verdict(route, scope, decision))
}

/// Counts `decision`; makes a refusal's error, or what an admitted
/// request's answer says of the quota when the route's quota says so
/// (`headers = "always"`; not when a failed store let it through
/// uncounted).
fn verdict(
    route: &Route,
    scope: Scope,
    decision: Decision,
) -> Result<Option<Advertised>, ProxyError> {
    route.shared.decided(scope, decision.outcome);
    let spec = route.quota.as_ref().map(Quota::spec);
    if decision.outcome.admitted() {
        let advertise = route.spec.quota.as_ref().is_some_and(|q| q.advertise);
        return Ok(match (advertise, spec, decision.left) {
            (true, Some(spec), Some(left)) => Some(Advertised {
                policy: Arc::clone(route.shared.name()),
                quota: spec.rate,
                window: spec.per,
                left,
            }),
            _ => None,
        });
    }
    if decision.outcome == Outcome::FailedClosed {
        return Err(ProxyError::QuotaUnavailable);
    }
    route.shared.rate_limited();
    Err(ProxyError::RateLimited(Box::new(Limited {
        wait: decision.wait,
        policy: Arc::clone(route.shared.name()),
        quota: spec.map_or(0, |s| s.rate),
        window: spec.map_or(std::time::Duration::from_secs(1), |s| s.per),
        by: match (scope, decision.outcome) {
            (_, Outcome::FallbackLimited) => "fallback",
            (Scope::Fleet, _) => "fleet",
            (Scope::Local, _) => "local",
        },
    })))
}

/// The request's key: one source's value as it is (the buckets of a
/// quota keyed by one source are the same as before lists existed), or
/// every source's, each preceded by its length.
fn key<'a>(
    spec: &QuotaSpec,
    req: &'a Request<ClientBody>,
    conn: &ConnContext,
    subject: Option<&'a str>,
) -> Cow<'a, [u8]> {
    match spec.key.as_slice() {
        [] => Cow::Borrowed(&b""[..]),
        [one] => part(one, req, conn, subject),
        many => {
            let mut out = Vec::with_capacity(64);
            for source in many {
                push_part(&mut out, &part(source, req, conn, subject));
            }
            Cow::Owned(out)
        }
    }
}

fn part<'a>(
    source: &QuotaKey,
    req: &'a Request<ClientBody>,
    conn: &ConnContext,
    subject: Option<&'a str>,
) -> Cow<'a, [u8]> {
    match source {
        QuotaKey::ClientIp => Cow::Owned(edge::client_key(conn.remote.ip()).to_vec()),
        // Requests without the header (or the subject) share one bucket.
        QuotaKey::Header(name) => {
            Cow::Borrowed(req.headers().get(name).map_or(&b""[..], |v| v.as_bytes()))
        }
        QuotaKey::Subject => Cow::Borrowed(subject.map_or(&b""[..], str::as_bytes)),
    }
}

/// The access log's `limited`: what refused the request.
pub fn limited_by(error: &ProxyError) -> Option<&'static str> {
    match error {
        ProxyError::RateLimited(limited) => Some(limited.by),
        ProxyError::QuotaUnavailable => Some("store_error"),
        _ => None,
    }
}

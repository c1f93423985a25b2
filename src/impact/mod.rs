//! Live impact (DESIGN §22): what a candidate would do to the traffic
//! the listeners have now. Each HTTP listener keeps a sample of recent
//! request heads (`generation/sample.rs`); `assess` replays every head
//! through routers built from the active configuration's routes and from
//! the candidate's (the generation's own matching code over route specs
//! alone: no upstream, no backend, nothing started), and compares where
//! each lands: the same route and upstream,
//! another (moved), none (unrouted: a 404 after), or an upstream none of
//! whose backends takes traffic now (unusable).
//!
//! Pure and off the data plane: validate and preview call it on the
//! blocking pool. Takes the heads, the active generation and the
//! candidate's spec; returns an `Impact` the admin API answers.

use std::collections::HashMap;
use std::sync::Arc;

use crate::generation::sample::Head;
use crate::generation::{Generation, RequestHead, Router, SharedState};
use crate::plan::impact::{interval, percent, Destination, Impact, Share, WafImpact};
use crate::plan::{RouteAction, RouteSpec, RouteWafSpec, Spec, WafRuleset};
use crate::waf::tally::{Judged, WafTally};

pub use crate::plan::impact::Example;

/// Examples kept per kind.
pub const EXAMPLES: usize = 20;
/// Paths in examples are cut to this many characters.
const EXAMPLE_PATH: usize = 100;

/// Where "before" routes: the active generation's own routers (a
/// candidate against what runs), or a retained configuration's specs.
pub enum Before<'a> {
    Active,
    Spec(&'a Spec),
}

/// The routers of one side, by listener.
enum Routers<'a> {
    Generation(&'a Generation),
    Specs(HashMap<&'a str, Router<RouteSpec>>),
}

impl Routers<'_> {
    fn route(
        &self,
        listener: &str,
        host: &str,
        path: &str,
        head: &RequestHead<'_>,
    ) -> Option<&RouteSpec> {
        match self {
            Routers::Generation(g) => g
                .router(listener)?
                .route(Some(host), path, head)
                .map(|route| &*route.spec),
            Routers::Specs(routers) => routers
                .get(listener)?
                .route(Some(host), path, head)
                .map(|spec| &**spec),
        }
    }
}

/// A route, and its upstream when it forwards, borrowed from its spec.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Landing<'a> {
    route: &'a str,
    upstream: Option<&'a str>,
}

impl<'a> Landing<'a> {
    fn of(spec: &'a RouteSpec) -> Self {
        Landing {
            route: &spec.name,
            upstream: match &spec.action {
                RouteAction::Proxy { upstream } => Some(upstream),
                RouteAction::Respond(_) | RouteAction::Redirect(_) => None,
            },
        }
    }

    fn owned(self) -> Destination {
        Destination {
            route: self.route.to_owned(),
            upstream: self.upstream.map(str::to_owned),
        }
    }
}

/// What going from `before` to `after` does to the requests the
/// listeners of `active` sampled into `shared`; `None` while sampling is
/// off and nothing was sampled.
pub fn of_sampled(
    shared: &SharedState,
    before: Before<'_>,
    after: &Spec,
    active: &Generation,
) -> Option<Impact> {
    let samples: Vec<_> = shared
        .samples()
        .into_iter()
        // A listener the configuration no longer has keeps its sample
        // (bounded) but is no traffic of now.
        .filter(|(listener, _)| active.router(listener).is_some())
        .map(|(listener, sample)| (listener, sample.heads()))
        .filter(|(_, heads)| !heads.is_empty())
        .collect();
    (active.spec.runtime.impact_sample > 0 || !samples.is_empty())
        .then(|| assess(&samples, before, after, active))
}

/// Replays `samples` (per listener, oldest first) through `before`'s
/// routes and `after`'s; which backends take traffic now is `active`'s
/// to say. For a candidate, `before` is the active generation; for a
/// retained generation, its predecessor's configuration.
pub fn assess(
    samples: &[(String, Vec<Head>)],
    before: Before<'_>,
    after: &Spec,
    active: &Generation,
) -> Impact {
    let (before_routers, before_spec) = match before {
        Before::Active => (Routers::Generation(active), &*active.spec),
        Before::Spec(spec) => (Routers::Specs(spec_routers(spec)), spec),
    };
    let mut firewalls = Firewalls::new(before_spec, after);
    let after_routers = Routers::Specs(spec_routers(after));
    let usable = usable_upstreams(active, after);
    let mut impact = Impact::default();
    let mut routes: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut upstreams: HashMap<&str, (usize, usize)> = HashMap::new();
    let (mut oldest, mut newest) = (None, None);
    let no_headers = http::HeaderMap::new();
    for (listener, heads) in samples {
        for head in heads {
            oldest = Some(oldest.map_or(head.at, |o: std::time::Instant| o.min(head.at)));
            newest = Some(newest.map_or(head.at, |n: std::time::Instant| n.max(head.at)));
            let kept;
            let headers = if head.headers.is_empty() {
                &no_headers
            } else {
                kept = head.header_map();
                &kept
            };
            let request = RequestHead {
                method: &head.method,
                headers,
                query: head.query.as_deref(),
            };
            let before_route = before_routers.route(listener, &head.host, &head.path, &request);
            let after_route = after_routers.route(listener, &head.host, &head.path, &request);
            firewalls.offer(listener, head, before_route, after_route);
            let before = before_route.map(Landing::of);
            let after = after_route.map(Landing::of);
            impact.sample_size += 1;
            if let Some(b) = before {
                routes.entry(b.route).or_default().0 += 1;
                if let Some(u) = b.upstream {
                    upstreams.entry(u).or_default().0 += 1;
                }
            }
            if let Some(a) = after {
                routes.entry(a.route).or_default().1 += 1;
                if let Some(u) = a.upstream {
                    upstreams.entry(u).or_default().1 += 1;
                }
            }
            let kind = match (before, after) {
                (Some(b), Some(a)) if b != a => Some(&mut impact.moved),
                (Some(_), None) => Some(&mut impact.unrouted),
                (None, Some(_)) => Some(&mut impact.newly_routed),
                _ => None,
            };
            let unusable = after
                .and_then(|a| a.upstream)
                .is_some_and(|u| !usable.get(u).copied().unwrap_or(true));
            let example = || Example {
                listener: listener.clone(),
                method: head.method.to_string(),
                host: head.host.clone(),
                path: cut(&head.path, head.query.as_deref()),
                before: before.map(Landing::owned),
                after: after.map(Landing::owned),
            };
            if let Some(kind) = kind {
                kind.count += 1;
                if kind.examples.len() < EXAMPLES {
                    kind.examples.push(example());
                }
            }
            if unusable {
                impact.unusable.count += 1;
                if impact.unusable.examples.len() < EXAMPLES {
                    impact.unusable.examples.push(example());
                }
            }
        }
    }
    let n = impact.sample_size;
    for kind in [
        &mut impact.moved,
        &mut impact.unrouted,
        &mut impact.unusable,
        &mut impact.newly_routed,
    ] {
        kind.percent = percent(kind.count, n);
        kind.interval = interval(kind.count, n);
    }
    impact.span_seconds = match (oldest, newest) {
        (Some(o), Some(n)) => (n.duration_since(o).as_secs_f64() * 1000.0).round() / 1000.0,
        _ => 0.0,
    };
    impact.routes = shares(routes, n);
    impact.upstreams = shares(upstreams, n);
    impact.waf = firewalls.judge();
    impact
}

/// Heads preview runs through both firewalls at most (the newest): each
/// costs two evaluations of the rules.
pub const WAF_HEADS: usize = 1_000;

/// What the sample holds, as preview's would-block share says it.
const WAF_SAMPLE: &str = "request heads only: the method, host, path and query, and the values of the headers routes match on and of User-Agent, Accept and Content-Type (never Authorization or Cookie, never a body): rules on other headers, cookies or bodies see nothing here";

/// A firewall and its compiled rules.
type Firewall<'a> = (&'a RouteWafSpec, &'a Arc<WafRuleset>);

/// Preview's would-block share (DESIGN §24): the heads whose route's
/// firewall differs between the two sides, then each judged by both.
struct Firewalls<'a> {
    before: &'a Spec,
    after: &'a Spec,
    /// Some firewall differs: without one, nothing is judged or said.
    differ: bool,
    /// A head, the candidate's route for it, both sides' firewalls.
    heads: Vec<(&'a Head, &'a str, Option<Firewall<'a>>, Firewall<'a>)>,
}

impl<'a> Firewalls<'a> {
    fn new(before: &'a Spec, after: &'a Spec) -> Self {
        let differ = before.waf_rulesets.len() != after.waf_rulesets.len()
            || before.waf_rulesets.iter().any(|(name, set)| {
                after
                    .waf_rulesets
                    .get(name)
                    .is_none_or(|other| set.digest != other.digest)
            })
            || before
                .routes
                .iter()
                .map(|r| (&r.waf, r.waf_opt_out))
                .ne(after.routes.iter().map(|r| (&r.waf, r.waf_opt_out)))
            || before
                .listeners
                .iter()
                .map(|l| l.edge.defaults.as_ref().map(|d| &d.waf))
                .ne(after
                    .listeners
                    .iter()
                    .map(|l| l.edge.defaults.as_ref().map(|d| &d.waf)));
        Firewalls {
            before,
            after,
            differ,
            heads: Vec::new(),
        }
    }

    /// The firewall `route` of `spec` runs on `listener`.
    fn of(spec: &'a Spec, listener: &str, route: Option<&'a RouteSpec>) -> Option<Firewall<'a>> {
        let defaults = spec
            .listeners
            .iter()
            .find(|l| l.name == listener)
            .and_then(|l| l.edge.defaults.as_deref());
        let firewall = route?.firewall(defaults)?;
        Some((firewall, spec.waf_rulesets.get(&firewall.ruleset)?))
    }

    /// Keeps `head` when the candidate's route has a firewall that is
    /// not the same as the active one's (the same spec, rules of the
    /// same digest).
    fn offer(
        &mut self,
        listener: &'a str,
        head: &'a Head,
        before: Option<&'a RouteSpec>,
        after: Option<&'a RouteSpec>,
    ) {
        if !self.differ {
            return;
        }
        let Some((route, candidate)) = after.zip(Self::of(self.after, listener, after)) else {
            return;
        };
        let active = Self::of(self.before, listener, before);
        let same = active
            .is_some_and(|(spec, set)| spec == candidate.0 && set.digest == candidate.1.digest);
        if !same {
            self.heads.push((head, &route.name, active, candidate));
        }
    }

    /// The kept heads (the newest `WAF_HEADS`) through both sides' rules.
    fn judge(mut self) -> Option<WafImpact> {
        if !self.differ {
            return None;
        }
        self.heads
            .sort_by_key(|(head, ..)| std::cmp::Reverse(head.at));
        let tally = WafTally::default();
        for (head, route, active, candidate) in self.heads.into_iter().take(WAF_HEADS) {
            let request = rules_request(head);
            let refuses = |(spec, set): Firewall<'_>| {
                spec.evaluate(set, &request, (crate::waf::Mode::Detect, false))
            };
            let candidate = refuses(candidate);
            let active = active.map(refuses);
            tally.judged(
                &Arc::from(route),
                &Judged {
                    active: active.is_some_and(|a| a.outcome != "pass"),
                    candidate: candidate.outcome != "pass",
                    rules: &candidate.rules,
                    method: head.method.as_str(),
                    path: &head.path,
                },
            );
        }
        Some(WafImpact {
            sample: WAF_SAMPLE.to_owned(),
            judged: tally.report(),
        })
    }
}

/// A sampled head as the rules read it: no body, and only the headers
/// the sample keeps (with the host).
fn rules_request(head: &Head) -> crate::waf::Request {
    let mut headers = Vec::with_capacity(head.headers.len() + 1);
    if !head.host.is_empty() {
        headers.push(("host".to_owned(), head.host.as_bytes().to_vec()));
    }
    headers.extend(
        head.headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.clone())),
    );
    crate::waf::Request {
        id: "preview".to_owned(),
        remote_addr: "0.0.0.0".to_owned(),
        method: head.method.to_string(),
        uri: match &head.query {
            Some(query) => format!("{}?{query}", head.path),
            None => head.path.clone(),
        },
        protocol: "HTTP/1.1".to_owned(),
        headers,
        body: Vec::new(),
    }
}

/// A router per HTTP listener of `spec`, over its route specs alone.
fn spec_routers(spec: &Spec) -> HashMap<&str, Router<RouteSpec>> {
    spec.listeners
        .iter()
        .filter(|l| !l.protocol.is_l4())
        .map(|l| {
            let routes = spec
                .routes
                .iter()
                .filter(|r| r.listeners.contains(&l.name))
                .map(Arc::clone);
            (l.name.as_str(), Router::new(routes))
        })
        .collect()
}

fn shares(counts: HashMap<&str, (usize, usize)>, n: usize) -> Vec<Share> {
    let mut out: Vec<Share> = counts
        .into_iter()
        .map(|(name, (before, after))| Share {
            name: name.to_owned(),
            before,
            after,
            before_percent: percent(before, n),
            after_percent: percent(after, n),
            before_interval: interval(before, n),
            after_interval: interval(after, n),
        })
        .collect();
    out.sort_by(|a, b| {
        (b.before.max(b.after))
            .cmp(&a.before.max(a.after))
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

/// The path and query of an example, at most `EXAMPLE_PATH` characters.
/// Query values are left out (`?token=…`): a client may carry a
/// credential there (a JWT route can read one from the query), and an
/// example is shown by preview and on the admin page.
fn cut(path: &str, query: Option<&str>) -> String {
    let mut text = path.to_owned();
    if let Some(query) = query {
        for (i, pair) in query.split('&').enumerate() {
            text.push(if i == 0 { '?' } else { '&' });
            match pair.split_once('=') {
                Some((name, _)) => {
                    text.push_str(name);
                    text.push_str("=…");
                }
                None => text.push_str(pair),
            }
        }
    }
    if let Some((end, _)) = text.char_indices().nth(EXAMPLE_PATH) {
        text.truncate(end);
        text.push('…');
    }
    text
}

/// For each of the candidate's upstreams: whether it could take traffic
/// now. Not when every one of its backends is one the active generation
/// has and none of those takes traffic (failing checks, or ejected); a
/// backend the process does not have yet is presumed usable (its checks
/// have not run).
fn usable_upstreams(active: &Generation, candidate: &Spec) -> HashMap<String, bool> {
    let mut available: HashMap<String, bool> = HashMap::new();
    let mut discovered: HashMap<&str, bool> = HashMap::new();
    for upstream in active.upstreams() {
        let members = upstream.members();
        if upstream.membership().is_some() {
            discovered.insert(
                upstream.name.as_str(),
                members.backends.iter().any(|b| b.is_available()),
            );
        }
        for backend in &members.backends {
            let entry = available.entry(backend.key.addr.clone()).or_insert(false);
            *entry |= backend.is_available();
        }
    }
    candidate
        .upstreams
        .iter()
        .map(|u| {
            // Members from sources: what the active upstream of that name
            // has now, if it follows sources; else presumed usable.
            let fixed = u
                .backends
                .iter()
                .any(|b| available.get(b.addr.as_str()).copied().unwrap_or(true));
            let usable = fixed
                || if u.sources.is_empty() {
                    u.backends.is_empty()
                } else {
                    discovered.get(u.name.as_str()).copied().unwrap_or(true)
                };
            (u.name.clone(), usable)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_are_cut() {
        let long = "/a".repeat(80);
        let cut = cut(&long, Some("x=1"));
        assert_eq!(cut.chars().count(), EXAMPLE_PATH + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(super::cut("/short", None), "/short");
        assert_eq!(
            super::cut("/short", Some("q=1&access_token=secret&flag")),
            "/short?q=…&access_token=…&flag"
        );
    }
}

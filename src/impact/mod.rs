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
use crate::generation::{Generation, RequestHead, Router};
use crate::plan::impact::{percent, Destination, Impact, Share};
use crate::plan::{RouteAction, RouteSpec, Spec};

pub use crate::plan::impact::Example;

/// Examples kept per kind.
pub const EXAMPLES: usize = 20;
/// Paths in examples are cut to this many characters.
const EXAMPLE_PATH: usize = 100;

fn destination(spec: &RouteSpec) -> Destination {
    Destination {
        route: spec.name.clone(),
        upstream: match &spec.action {
            RouteAction::Proxy { upstream } => Some(upstream.clone()),
            RouteAction::Respond(_) | RouteAction::Redirect(_) => None,
        },
    }
}

/// Replays `samples` (per listener, oldest first) through `before`'s
/// routes and `after`'s; which backends take traffic now is `active`'s
/// to say. For a candidate, `before` is the active generation's spec; for
/// a retained generation, its predecessor's.
pub fn assess(
    samples: &[(String, Vec<Head>)],
    before: &Spec,
    after: &Spec,
    active: &Generation,
) -> Impact {
    let before_routers = spec_routers(before);
    let after_routers = spec_routers(after);
    let usable = usable_upstreams(active, after);
    let mut impact = Impact::default();
    let mut routes: HashMap<String, (usize, usize)> = HashMap::new();
    let mut upstreams: HashMap<String, (usize, usize)> = HashMap::new();
    let (mut oldest, mut newest) = (None, None);
    for (listener, heads) in samples {
        let before_router = before_routers.get(listener.as_str());
        let after_router = after_routers.get(listener.as_str());
        for head in heads {
            oldest = Some(oldest.map_or(head.at, |o: std::time::Instant| o.min(head.at)));
            newest = Some(newest.map_or(head.at, |n: std::time::Instant| n.max(head.at)));
            let headers = head.header_map();
            let request = RequestHead {
                method: &head.method,
                headers: &headers,
                query: head.query.as_deref(),
            };
            let host = Some(head.host.as_str());
            let before = before_router
                .and_then(|r| r.route(host, &head.path, &request))
                .map(|spec| destination(spec));
            let after = after_router
                .and_then(|r| r.route(host, &head.path, &request))
                .map(|spec| destination(spec));
            impact.sample_size += 1;
            for (side, landed) in [(0, &before), (1, &after)] {
                if let Some(d) = landed {
                    let counts = routes.entry(d.route.clone()).or_default();
                    *if side == 0 {
                        &mut counts.0
                    } else {
                        &mut counts.1
                    } += 1;
                    if let Some(u) = &d.upstream {
                        let counts = upstreams.entry(u.clone()).or_default();
                        *if side == 0 {
                            &mut counts.0
                        } else {
                            &mut counts.1
                        } += 1;
                    }
                }
            }
            let kind = match (&before, &after) {
                (Some(b), Some(a)) if b != a => Some(&mut impact.moved),
                (Some(_), None) => Some(&mut impact.unrouted),
                (None, Some(_)) => Some(&mut impact.newly_routed),
                _ => None,
            };
            let unusable = after
                .as_ref()
                .and_then(|a| a.upstream.as_deref())
                .is_some_and(|u| !usable.get(u).copied().unwrap_or(true));
            let example = || Example {
                listener: listener.clone(),
                method: head.method.to_string(),
                host: head.host.clone(),
                path: cut(&head.path, head.query.as_deref()),
                before: before.clone(),
                after: after.clone(),
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
    }
    impact.span_seconds = match (oldest, newest) {
        (Some(o), Some(n)) => (n.duration_since(o).as_secs_f64() * 1000.0).round() / 1000.0,
        _ => 0.0,
    };
    impact.routes = shares(routes, n);
    impact.upstreams = shares(upstreams, n);
    impact
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

fn shares(counts: HashMap<String, (usize, usize)>, n: usize) -> Vec<Share> {
    let mut out: Vec<Share> = counts
        .into_iter()
        .map(|(name, (before, after))| Share {
            name,
            before,
            after,
            before_percent: percent(before, n),
            after_percent: percent(after, n),
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
fn cut(path: &str, query: Option<&str>) -> String {
    let mut text = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
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
    let mut available: HashMap<&str, bool> = HashMap::new();
    for upstream in active.upstreams() {
        for backend in &upstream.backends {
            let entry = available.entry(backend.key.addr.as_str()).or_insert(false);
            *entry |= backend.is_available();
        }
    }
    candidate
        .upstreams
        .iter()
        .map(|u| {
            let usable = u.backends.is_empty()
                || u.backends
                    .iter()
                    .any(|b| available.get(b.addr.as_str()).copied().unwrap_or(true));
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
        assert_eq!(super::cut("/short", Some("q=1")), "/short?q=1");
    }
}

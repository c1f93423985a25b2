//! The compiled router of one listener in one generation.
//!
//! Route selection is deterministic: the most specific host group that has
//! a matching route wins (exact name, then wildcards from the longest
//! suffix, then routes without hosts); inside a group the longest path
//! wins (exact before prefix at equal length, regexes after every literal
//! path), then declaration order. Lookups are hash probes per host label,
//! then a scan of the group's candidates in precedence order.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, Method};

use super::route::Route;
use crate::plan::{HostMatch, PathMatch};

/// Routes of one listener, indexed by host.
#[derive(Debug, Default)]
pub struct Router {
    exact: HashMap<String, Vec<Arc<Route>>>,
    /// Keyed by `.suffix`; probed for every label boundary of the host.
    suffix: HashMap<String, Vec<Arc<Route>>>,
    any_host: Vec<Arc<Route>>,
}

/// Orders routes inside a host group: longest literal path first, exact
/// before prefix at equal length, regexes and path-less routes last;
/// declaration order breaks ties (the sort is stable).
fn precedence(route: &Route) -> (usize, u8) {
    match &route.path {
        PathMatch::Exact(p) => (p.len(), 3),
        PathMatch::Prefix(p) => (p.len(), 2),
        PathMatch::Regex(_) => (0, 1),
        PathMatch::Any => (0, 0),
    }
}

impl Router {
    /// Builds the router from routes in declaration order.
    pub fn new(routes: impl IntoIterator<Item = Arc<Route>>) -> Self {
        let mut router = Router::default();
        for route in routes {
            if route.hosts.is_empty() {
                router.any_host.push(route);
                continue;
            }
            for host in &route.hosts {
                let group = match host {
                    HostMatch::Exact(name) => router.exact.entry(name.clone()).or_default(),
                    HostMatch::Suffix(suffix) => router.suffix.entry(suffix.clone()).or_default(),
                };
                if !group.iter().any(|r| Arc::ptr_eq(r, &route)) {
                    group.push(Arc::clone(&route));
                }
            }
        }
        let sort = |group: &mut Vec<Arc<Route>>| {
            group.sort_by_key(|route| std::cmp::Reverse(precedence(route)));
        };
        router.exact.values_mut().for_each(sort);
        router.suffix.values_mut().for_each(sort);
        sort(&mut router.any_host);
        router
    }

    /// The route for a request, if any. `host` is the request's host
    /// without port, in any case.
    pub fn route<'r>(
        &'r self,
        host: Option<&str>,
        path: &str,
        method: &Method,
        headers: &HeaderMap,
    ) -> Option<&'r Arc<Route>> {
        let find = |group: &'r [Arc<Route>]| -> Option<&'r Arc<Route>> {
            group.iter().find(|r| r.matches(path, method, headers))
        };
        if let Some(host) = host.filter(|h| !h.is_empty()) {
            let host: Cow<'_, str> = if host.bytes().any(|b| b.is_ascii_uppercase()) {
                Cow::Owned(host.to_ascii_lowercase())
            } else {
                Cow::Borrowed(host)
            };
            if let Some(found) = self.exact.get(host.as_ref()).and_then(|g| find(g)) {
                return Some(found);
            }
            if !self.suffix.is_empty() {
                // `a.b.example.com` probes `.b.example.com`, `.example.com`, `.com`.
                for (i, _) in host.match_indices('.') {
                    if let Some(found) = host
                        .get(i..)
                        .and_then(|s| self.suffix.get(s))
                        .and_then(|g| find(g))
                    {
                        return Some(found);
                    }
                }
            }
        }
        find(&self.any_host)
    }

    /// How many distinct routes this router can answer with.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.suffix.is_empty() && self.any_host.is_empty()
    }
}

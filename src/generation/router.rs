//! The compiled router of one listener in one generation.
//!
//! Route selection is deterministic: the most specific host group that has
//! a matching route wins (exact name, then wildcards from the longest
//! suffix, then routes without hosts); inside a group the longest path
//! wins (`path_exact` before `path_prefix` at equal length, regexes after
//! every literal path, routes without a path last), then declaration
//! order. Lookups are hash probes: one per host label for the group, then
//! one for the exact path and one per distinct prefix length, so matching
//! cost does not grow with the number of routes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::route::{matches_request, RequestHead, Route};
use crate::plan::{HostMatch, ListenerEdge, PathMatch, RouteSpec};

/// What a router indexes: a generation's compiled routes, or only their
/// specs (a candidate's, to replay sampled requests through: `impact`).
pub trait Routed: std::fmt::Debug {
    fn route_spec(&self) -> &RouteSpec;
}

impl Routed for Route {
    fn route_spec(&self) -> &RouteSpec {
        &self.spec
    }
}

impl Routed for RouteSpec {
    fn route_spec(&self) -> &RouteSpec {
        self
    }
}

/// Which host group a route is in: one per distinct host it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum GroupKey<'a> {
    Exact(&'a str),
    Suffix(&'a str),
    AnyHost,
}

/// Calls `f` with each group of `spec`, once.
fn for_each_group<'s>(spec: &'s RouteSpec, mut f: impl FnMut(GroupKey<'s>)) {
    if spec.hosts.is_empty() {
        return f(GroupKey::AnyHost);
    }
    for (n, host) in spec.hosts.iter().enumerate() {
        if spec
            .hosts
            .get(..n)
            .is_some_and(|before| before.contains(host))
        {
            continue;
        }
        f(match host {
            HostMatch::Exact(name) => GroupKey::Exact(name),
            HostMatch::Suffix(suffix) => GroupKey::Suffix(suffix),
        });
    }
}

/// Routes by literal path (exact, or prefix of one length), each list in
/// declaration order.
type PathIndex<R> = HashMap<Box<str>, Vec<Arc<R>>>;

/// The routes of one host group, indexed by path.
#[derive(Debug)]
struct RouteGroup<R> {
    exact: PathIndex<R>,
    /// `(prefix length, prefix → routes)`, longest first.
    prefixes: Vec<(usize, PathIndex<R>)>,
    regexes: Vec<Arc<R>>,
    any_path: Vec<Arc<R>>,
}

impl<R> Default for RouteGroup<R> {
    fn default() -> Self {
        RouteGroup {
            exact: HashMap::new(),
            prefixes: Vec::new(),
            regexes: Vec::new(),
            any_path: Vec::new(),
        }
    }
}

impl<R: Routed> RouteGroup<R> {
    /// Adds a route; routes must be added in declaration order.
    fn add(&mut self, route: Arc<R>) {
        match &route.route_spec().path {
            PathMatch::Exact(p) => self.exact.entry(p.as_str().into()).or_default().push(route),
            PathMatch::Prefix(p) => {
                let len = p.len();
                let slot = match self.prefixes.iter().position(|(l, _)| *l == len) {
                    Some(i) => i,
                    None => {
                        self.prefixes.push((len, HashMap::new()));
                        self.prefixes
                            .sort_by_key(|(len, _)| std::cmp::Reverse(*len));
                        self.prefixes
                            .iter()
                            .position(|(l, _)| *l == len)
                            .unwrap_or(0)
                    }
                };
                if let Some((_, map)) = self.prefixes.get_mut(slot) {
                    map.entry(p.as_str().into()).or_default().push(route);
                }
            }
            PathMatch::Regex(_) => self.regexes.push(route),
            PathMatch::Any => self.any_path.push(route),
        }
    }

    fn find(&self, path: &str, head: &RequestHead<'_>) -> Option<&Arc<R>> {
        let pick = |routes: &'_ [Arc<R>]| -> Option<usize> {
            routes
                .iter()
                .position(|r| matches_request(r.route_spec(), head))
        };
        if let Some(routes) = self.exact.get(path) {
            if let Some(i) = pick(routes) {
                return routes.get(i);
            }
        }
        for (len, map) in &self.prefixes {
            let Some(head) = path.get(..*len) else {
                continue;
            };
            if let Some(routes) = map.get(head) {
                if let Some(i) = pick(routes) {
                    return routes.get(i);
                }
            }
        }
        self.regexes
            .iter()
            .find(|r| r.route_spec().path.matches(path) && matches_request(r.route_spec(), head))
            .or_else(|| {
                self.any_path
                    .iter()
                    .find(|r| matches_request(r.route_spec(), head))
            })
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty()
            && self.prefixes.is_empty()
            && self.regexes.is_empty()
            && self.any_path.is_empty()
    }
}

/// Routes of one listener, indexed by host. Host groups are shared with
/// the router of the generation it was patched from (`patched`).
#[derive(Debug)]
pub struct Router<R = Route> {
    exact: HashMap<Arc<str>, Arc<RouteGroup<R>>>,
    /// Keyed by `.suffix`; probed for every label boundary of the host.
    suffix: HashMap<Arc<str>, Arc<RouteGroup<R>>>,
    any_host: Arc<RouteGroup<R>>,
    /// Every route, in declaration order.
    routes: Vec<Arc<R>>,
    /// The listener's request rules, read before routing.
    pub edge: ListenerEdge,
    /// The listener's admission counter, shared across generations.
    pub shared: Option<Arc<super::route::ListenerShared>>,
    /// The listener's impact sample (DESIGN §22), and the header names
    /// this generation's routes match on (what a head keeps).
    pub sample: Option<Arc<super::sample::ListenerSample>>,
    pub sample_names: Vec<http::HeaderName>,
}

impl<R> Default for Router<R> {
    fn default() -> Self {
        Router {
            exact: HashMap::new(),
            suffix: HashMap::new(),
            any_host: Arc::default(),
            routes: Vec::new(),
            edge: ListenerEdge::default(),
            shared: None,
            sample: None,
            sample_names: Vec::new(),
        }
    }
}

impl<R: Routed> Router<R> {
    /// The same router under a listener's request rules.
    pub fn with_edge(mut self, edge: ListenerEdge) -> Self {
        self.edge = edge;
        self
    }

    /// The same router counting requests in `shared`.
    pub fn with_shared(mut self, shared: Arc<super::route::ListenerShared>) -> Self {
        self.shared = Some(shared);
        self
    }

    /// Takes a place under the listener's `max_inflight`.
    pub fn admit(&self) -> Result<Option<super::route::ListenerSlot>, super::Saturated> {
        match &self.shared {
            Some(shared) => shared.admit(self.edge.max_inflight),
            None => Ok(None),
        }
    }

    /// Builds the router from routes in declaration order.
    pub fn new(routes: impl IntoIterator<Item = Arc<R>>) -> Self {
        let routes: Vec<Arc<R>> = routes.into_iter().collect();
        let mut exact: HashMap<Arc<str>, RouteGroup<R>> = HashMap::new();
        let mut suffix: HashMap<Arc<str>, RouteGroup<R>> = HashMap::new();
        let mut any_host = RouteGroup::default();
        for route in &routes {
            for_each_group(route.route_spec(), |key| {
                let group = match key {
                    GroupKey::Exact(name) => exact.entry(name.into()).or_default(),
                    GroupKey::Suffix(suffix_) => suffix.entry(suffix_.into()).or_default(),
                    GroupKey::AnyHost => &mut any_host,
                };
                group.add(Arc::clone(route));
            });
        }
        Router {
            exact: exact.into_iter().map(|(k, g)| (k, Arc::new(g))).collect(),
            suffix: suffix.into_iter().map(|(k, g)| (k, Arc::new(g))).collect(),
            any_host: Arc::new(any_host),
            routes,
            ..Router::default()
        }
    }

    /// The router of `routes`, sharing with `previous` every host group
    /// none of whose routes changed: the work follows the change, not the
    /// number of routes (issue "scale"). Built whole when the routes that
    /// stayed are in another order, or when most groups changed.
    pub fn patched(previous: &Router<R>, routes: Vec<Arc<R>>) -> Self {
        use foldhash::HashSet;
        let ptr = |r: &Arc<R>| Arc::as_ptr(r) as *const () as usize;
        let changed: Vec<&Arc<R>> = if previous.routes.len() == routes.len() {
            // Edited in place, the usual change: what differs by index.
            previous
                .routes
                .iter()
                .zip(&routes)
                .filter(|(a, b)| !Arc::ptr_eq(a, b))
                .flat_map(|(a, b)| [a, b])
                .collect()
        } else {
            let now: HashSet<usize> = routes.iter().map(ptr).collect();
            let before: HashSet<usize> = previous.routes.iter().map(ptr).collect();
            // The routes that stayed must stay in their order: it decides
            // between routes of one group.
            let stayed_before = previous.routes.iter().filter(|r| now.contains(&ptr(r)));
            let stayed_now = routes.iter().filter(|r| before.contains(&ptr(r)));
            if !stayed_before.map(ptr).eq(stayed_now.map(ptr)) {
                return Router::new(routes);
            }
            previous
                .routes
                .iter()
                .filter(|r| !now.contains(&ptr(r)))
                .chain(routes.iter().filter(|r| !before.contains(&ptr(r))))
                .collect()
        };
        let mut touched: HashSet<GroupKey<'_>> = HashSet::default();
        for route in changed {
            for_each_group(route.route_spec(), |key| {
                touched.insert(key);
            });
            if touched.len() > routes.len() / 4 + 16 {
                return Router::new(routes);
            }
        }
        let mut groups: foldhash::HashMap<GroupKey<'_>, RouteGroup<R>> = touched
            .iter()
            .map(|k| (k.clone(), RouteGroup::default()))
            .collect();
        for route in &routes {
            for_each_group(route.route_spec(), |key| {
                if let Some(group) = groups.get_mut(&key) {
                    group.add(Arc::clone(route));
                }
            });
        }
        let mut exact = previous.exact.clone();
        let mut suffix = previous.suffix.clone();
        let mut any_host = Arc::clone(&previous.any_host);
        for (key, group) in groups {
            let group = (!group.is_empty()).then(|| Arc::new(group));
            match (key, group) {
                (GroupKey::Exact(name), Some(g)) => {
                    exact.insert(name.into(), g);
                }
                (GroupKey::Exact(name), None) => {
                    exact.remove(name);
                }
                (GroupKey::Suffix(s), Some(g)) => {
                    suffix.insert(s.into(), g);
                }
                (GroupKey::Suffix(s), None) => {
                    suffix.remove(s);
                }
                (GroupKey::AnyHost, g) => any_host = g.unwrap_or_default(),
            }
        }
        Router {
            exact,
            suffix,
            any_host,
            routes,
            ..Router::default()
        }
    }

    /// The route for a request, if any. `host` is the request's host
    /// without port, in any case.
    pub fn route<'r>(
        &'r self,
        host: Option<&str>,
        path: &str,
        head: &RequestHead<'_>,
    ) -> Option<&'r Arc<R>> {
        if let Some(host) = host.filter(|h| !h.is_empty()) {
            let host: Cow<'_, str> = if host.bytes().any(|b| b.is_ascii_uppercase()) {
                Cow::Owned(host.to_ascii_lowercase())
            } else {
                Cow::Borrowed(host)
            };
            if let Some(found) = self
                .exact
                .get(host.as_ref())
                .and_then(|g| g.find(path, head))
            {
                return Some(found);
            }
            if !self.suffix.is_empty() {
                // `a.b.example.com` probes `.b.example.com`, `.example.com`, `.com`.
                for (i, _) in host.match_indices('.') {
                    let found = host
                        .get(i..)
                        .and_then(|s| self.suffix.get(s))
                        .and_then(|g| g.find(path, head));
                    if found.is_some() {
                        return found;
                    }
                }
            }
        }
        self.any_host.find(path, head)
    }

    /// Whether the router has no routes at all.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.suffix.is_empty() && self.any_host.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigText;

    /// Routes (name, host, path prefix); a name ending in `-hdr` also
    /// asks for header `x-a`, which every request below has: it and a
    /// route without it are not ambiguous, and their order decides.
    fn specs(routes: &[(&str, &str, &str)]) -> Vec<Arc<RouteSpec>> {
        let mut text = String::from("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n");
        for (name, host, path) in routes {
            let hosts = match *host {
                "" => String::new(),
                host => format!("hosts = [\"{host}\"]\n"),
            };
            let matchers = match name.ends_with("-hdr") {
                true => "headers = { \"x-a\" = \"*\" }\n",
                false => "",
            };
            text.push_str(&format!(
                "\n[[routes]]\nname = \"{name}\"\nlisteners = [\"web\"]\n{hosts}{matchers}path_prefix = \"{path}\"\nrespond = {{ body = \"{name}\" }}\n"
            ));
        }
        let source = ConfigText::inline(text, ".".into(), "<test>");
        crate::plan::validate(&source)
            .unwrap_or_else(|e| panic!("{e:?}"))
            .routes
    }

    /// Each request's route name in `router`.
    fn answers(router: &Router<RouteSpec>) -> Vec<Option<String>> {
        let method = http::Method::GET;
        let mut headers = http::HeaderMap::new();
        headers.insert("x-a", http::HeaderValue::from_static("1"));
        let head = RequestHead {
            method: &method,
            headers: &headers,
            query: None,
        };
        let hosts = [
            "a.example.com",
            "b.example.com",
            "x.wild.example.com",
            "other.test",
        ];
        let paths = ["/", "/v1/x", "/v1/users/1", "/v2/"];
        hosts
            .iter()
            .flat_map(|h| paths.iter().map(move |p| (h, p)))
            .map(|(h, p)| router.route(Some(h), p, &head).map(|r| r.name.clone()))
            .collect()
    }

    /// A router patched from the previous one routes every request as a
    /// router built from scratch does: routes edited in place, inserted,
    /// removed, moved between hosts, and reordered within a group.
    #[test]
    fn a_patched_router_routes_as_one_built_from_scratch() {
        let base = [
            ("a1", "a.example.com", "/v1/"),
            ("a2-hdr", "a.example.com", "/v1/"),
            ("b1", "b.example.com", "/"),
            ("w1", "*.wild.example.com", "/v1/"),
            ("any", "", "/v2/"),
            ("fallback", "", "/"),
        ];
        let before = specs(&base);
        let previous = Router::new(before.iter().cloned());
        let edits: Vec<Vec<(&str, &str, &str)>> = vec![
            // In place: a route's host changed.
            base.iter()
                .map(|r| {
                    if r.0 == "b1" {
                        ("b1", "a.example.com", "/v1/users/")
                    } else {
                        *r
                    }
                })
                .collect(),
            // Two routes of one group swapped (order decides between them).
            vec![base[1], base[0], base[2], base[3], base[4], base[5]],
            // Inserted before everything, and one removed.
            std::iter::once(("new", "b.example.com", "/v1/"))
                .chain(base.iter().copied().filter(|r| r.0 != "w1"))
                .collect(),
            // The host-less group changed.
            base.iter()
                .map(|r| {
                    if r.0 == "any" {
                        ("any", "", "/v1/")
                    } else {
                        *r
                    }
                })
                .collect(),
        ];
        for (n, edit) in edits.iter().enumerate() {
            let fresh = specs(edit);
            // What the candidate took over is the same allocation.
            let after: Vec<Arc<RouteSpec>> = fresh
                .iter()
                .map(|f| {
                    before
                        .iter()
                        .find(|b| b.name == f.name && format!("{b:?}") == format!("{f:?}"))
                        .cloned()
                        .unwrap_or_else(|| Arc::clone(f))
                })
                .collect();
            let patched = Router::patched(&previous, after.clone());
            let scratch = Router::new(after);
            assert_ne!(answers(&previous), answers(&scratch), "edit {n} shows");
            assert_eq!(answers(&patched), answers(&scratch), "edit {n}");
        }
    }
}

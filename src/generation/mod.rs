//! The immutable runtime: one compiled configuration.
//!
//! `build` takes a validated [`Spec`] and the process-shared state and
//! returns a [`Generation`]: per-listener routers, upstreams bound to
//! shared backends, and the ledger of work pinned to it. It spawns nothing
//! and binds nothing; once built, a generation never changes.

mod ledger;
mod maglev;
mod members;
mod route;
mod router;
pub mod sample;
mod schedule;
mod upstream;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::limits::QuotaTable;
pub use ledger::{answered_totals, InflightGuard, Ledger};
pub use maglev::{hash_key, Maglev};
pub use members::{Members, MembersRef, Membership};
pub use route::{
    matches_request, Action, CacheLookup, CopyKind, ListenerSlot, Quota, Refusal, RequestHead,
    Route, RouteShared, RouteSlot, Saturated, COPY_OUTCOMES,
};
pub use router::{Routed, Router};
pub use schedule::WeightedSchedule;
pub use upstream::Upstream;

use crate::backends::{BackendError, BackendRegistry};
use crate::ids::GenerationId;
use crate::plan::{RouteAction, Spec};
use crate::weak_map::WeakMap;

/// State that outlives generations and is carried into each new one.
#[derive(Debug, Default)]
pub struct SharedState {
    pub backends: BackendRegistry,
    /// Members from DNS, SRV and files (DESIGN §20), by upstream and source.
    pub discovery: crate::discovery::Discovery,
    routes: WeakMap<String, RouteShared>,
    listeners: WeakMap<String, route::ListenerShared>,
    /// Quota buckets by route name and quota: kept while both are.
    quotas: WeakMap<(String, crate::plan::QuotaSpec), QuotaTable>,
    /// Fleet quotas' leases, by route name and quota.
    fleet_quotas: WeakMap<(String, crate::plan::QuotaSpec), crate::limits::FleetQuota>,
    /// Rate-limit stores (`[limits] store`), by spec: kept while a
    /// generation names one.
    limit_stores: WeakMap<crate::plan::StoreSpec, crate::limits::Store>,
    /// Each HTTP listener's impact sample, kept across generations.
    samples: std::sync::Mutex<HashMap<String, Arc<sample::ListenerSample>>>,
    /// Cache zones, by name: kept while a generation names them.
    pub cache: crate::cache::Zones,
}

impl SharedState {
    /// Listener `name`'s impact sample, sized to `capacity` (`None` when
    /// that is 0: nothing is recorded, what was is dropped).
    pub fn sample(&self, name: &str, capacity: usize) -> Option<Arc<sample::ListenerSample>> {
        let mut samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sample = samples
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(sample::ListenerSample::new(capacity)));
        sample.resize(capacity);
        (capacity > 0).then(|| Arc::clone(sample))
    }

    /// The samples of the listeners that have one.
    pub fn samples(&self) -> Vec<(String, Arc<sample::ListenerSample>)> {
        self.samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(name, sample)| (name.clone(), Arc::clone(sample)))
            .collect()
    }

    /// The buckets of route `name`'s quota: the live table if the route
    /// had this same quota before, else a new one.
    fn quota(&self, name: &str, spec: &crate::plan::QuotaSpec) -> Quota {
        // What the answers say of a quota is not what it counts.
        let spec = &crate::plan::QuotaSpec {
            advertise: false,
            ..spec.clone()
        };
        let key = (name.to_owned(), spec.clone());
        match &spec.fleet {
            None => Quota::Local(
                self.quotas
                    .get_or_insert(&key, || QuotaTable::new(spec.clone())),
            ),
            Some(fleet) => Quota::Fleet(self.fleet_quotas.get_or_insert(&key, || {
                crate::limits::FleetQuota::new(name, spec.clone(), fleet.clone())
            })),
        }
    }

    /// The store `[limits] store` names: the live one if a generation
    /// holds it, else a new one (which connects on the runtime building
    /// the generation).
    fn limit_store(&self, spec: &crate::plan::StoreSpec) -> Arc<crate::limits::Store> {
        let store = self
            .limit_stores
            .get_or_insert(spec, || crate::limits::Store::new(spec));
        store.start();
        store
    }

    fn listener(&self, name: &str) -> Arc<route::ListenerShared> {
        self.listeners
            .get_or_insert(name, || route::ListenerShared::new(name))
    }

    fn route(&self, name: &str) -> Arc<RouteShared> {
        match self.routes.get_or_try_insert(name, || {
            Ok::<_, std::convert::Infallible>(RouteShared::new(name))
        }) {
            Ok(shared) => shared,
            Err(never) => match never {},
        }
    }
}

/// Why a validated configuration could still not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("upstream '{upstream}': {source}")]
    Backend {
        upstream: String,
        #[source]
        source: BackendError,
    },
    #[error("route '{route}' names upstream '{upstream}', which was not built")]
    MissingUpstream { route: String, upstream: String },
}

/// One complete, immutable runtime configuration.
#[derive(Debug)]
pub struct Generation {
    pub id: GenerationId,
    pub spec: Arc<Spec>,
    pub ledger: Arc<Ledger>,
    pub built_at: SystemTime,
    routers: HashMap<String, Router>,
    upstreams: HashMap<String, Arc<Upstream>>,
    /// Every compiled route, aligned with `spec.routes`.
    routes: Vec<Arc<Route>>,
    /// The cache zones it names, with the sizes it gives each.
    cache_zones: Vec<(Arc<crate::cache::Zone>, crate::plan::ZoneSpec)>,
    /// Where its fleet quotas count (`[limits] store`).
    limit_store: Option<Arc<crate::limits::Store>>,
}

impl Generation {
    /// What of it applies to process-shared state only once it is the
    /// active generation (the store calls this when it publishes it):
    /// its cache zones' sizes.
    pub fn take_effect(&self) {
        for (zone, spec) in &self.cache_zones {
            zone.resize(spec);
        }
    }

    /// The cache zone `name`, if it names it.
    pub fn cache_zone(&self, name: &str) -> Option<&Arc<crate::cache::Zone>> {
        self.cache_zones
            .iter()
            .map(|(zone, _)| zone)
            .find(|zone| zone.name == name)
    }

    /// Where its fleet quotas count.
    #[inline]
    pub fn limit_store(&self) -> Option<&Arc<crate::limits::Store>> {
        self.limit_store.as_ref()
    }

    /// Gives the tokens its fleet quotas leased and did not spend back
    /// to the store (a drain: the rest of the fleet gets them at once);
    /// how many the store took back.
    pub async fn give_back_leases(&self) -> u32 {
        let Some(store) = self.limit_store() else {
            return 0;
        };
        let mut back = 0;
        for route in self.routes() {
            if let Some(route::Quota::Fleet(quota)) = &route.quota {
                back += quota.give_back(store).await;
            }
        }
        back
    }

    /// The cache zones it names.
    pub fn cache_zones(&self) -> impl Iterator<Item = &Arc<crate::cache::Zone>> {
        self.cache_zones.iter().map(|(zone, _)| zone)
    }

    /// The router of an HTTP listener, if this generation has that listener.
    pub fn router(&self, listener: &str) -> Option<&Router> {
        self.routers.get(listener)
    }

    pub fn upstream(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.upstreams.get(name)
    }

    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.upstreams.values()
    }

    /// Every compiled route, in declaration order.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    pub fn config_version(&self) -> &str {
        &self.spec.config_version
    }
}

/// The certificate material of every TLS listener of `spec`, as
/// validation loaded it. Swapped into the `CertStore` right after the
/// generation is committed (and replaced by `reload-certs` on its own).
pub fn certificate_material(spec: &Spec, generation: GenerationId) -> crate::tls::Material {
    let listeners = spec
        .listeners
        .iter()
        .filter_map(|l| Some((l.name.clone(), Arc::clone(l.tls_material.as_ref()?))))
        .collect();
    crate::tls::Material {
        generation,
        listeners,
    }
}

/// Compiles `spec` into generation `id`, reusing shared backends.
pub fn build(
    spec: Arc<Spec>,
    id: GenerationId,
    shared: &SharedState,
) -> Result<Generation, BuildError> {
    build_from(spec, id, shared, None)
}

/// As [`build`], keeping from `previous` (the active generation) every
/// upstream and route the candidate took over unchanged: the same
/// allocations, so that a generation costs what its change costs (issue
/// "scale"). Neither generation is changed by this: what they share is
/// immutable, and each holds what it uses for as long as it lives.
pub fn build_from(
    spec: Arc<Spec>,
    id: GenerationId,
    shared: &SharedState,
    previous: Option<&Generation>,
) -> Result<Generation, BuildError> {
    let mut upstreams = HashMap::with_capacity(spec.upstreams.len());
    for u in &spec.upstreams {
        let same = previous.and_then(|p| {
            let piece = spec.pieces.upstreams.get(&u.name)?;
            (p.spec.pieces.upstreams.get(&u.name)? == piece).then_some(p.upstreams.get(&u.name)?)
        });
        let upstream = match same {
            Some(same) => Arc::clone(same),
            None => Arc::new(
                Upstream::build(u, shared).map_err(|source| BuildError::Backend {
                    upstream: u.name.clone(),
                    source,
                })?,
            ),
        };
        upstream.named_by(id.0);
        upstreams.insert(u.name.clone(), upstream);
    }
    let mut per_listener: HashMap<&str, (&crate::plan::ListenerEdge, Vec<Arc<Route>>)> = spec
        .listeners
        .iter()
        .filter(|l| !l.protocol.is_l4())
        .map(|l| (l.name.as_str(), (&l.edge, Vec::new())))
        .collect();
    let kept = Kept::new(previous);
    // Every zone this generation names; sized as it says when it takes
    // effect (`Generation::take_effect`), not when it is built.
    let zones: HashMap<&str, Arc<crate::cache::Zone>> = spec
        .cache_zones
        .iter()
        .map(|(name, spec)| (name.as_str(), shared.cache.zone(name, spec)))
        .collect();
    let mut routes = Vec::with_capacity(spec.routes.len());
    for (i, r) in spec.routes.iter().enumerate() {
        let action = match &r.action {
            RouteAction::Proxy { upstream } => {
                Action::Proxy(Arc::clone(upstreams.get(upstream).ok_or_else(|| {
                    BuildError::MissingUpstream {
                        route: r.name.clone(),
                        upstream: upstream.clone(),
                    }
                })?))
            }
            RouteAction::Respond(response) => Action::Respond(response.clone()),
            RouteAction::Redirect(redirect) => Action::Redirect(redirect.clone()),
        };
        let route = match kept.route(i, r).filter(|same| same.action.same_as(&action)) {
            Some(same) => Arc::clone(same),
            None => Arc::new(Route {
                spec: Arc::clone(r),
                action,
                shared: shared.route(&r.name),
                quota: r.quota.as_ref().map(|q| shared.quota(&r.name, q)),
                cache: r
                    .cache
                    .as_ref()
                    .and_then(|c| zones.get(c.zone.as_str()).map(Arc::clone)),
            }),
        };
        for listener in &r.listeners {
            if let Some((_, routes)) = per_listener.get_mut(listener.as_str()) {
                routes.push(Arc::clone(&route));
            }
        }
        routes.push(route);
    }
    // What authentication runs beside the requests (a JWKS URL's fetches)
    // starts with the first generation that names it.
    for auth in crate::plan::auths(&spec) {
        auth.start();
    }
    let routers = per_listener
        .into_iter()
        .map(|(name, (edge, routes))| {
            let mut names = sample::matched_names(routes.iter().map(|r| &*r.spec));
            let defaults = edge.defaults.as_deref();
            if routes.iter().any(|r| r.spec.firewall(defaults).is_some()) {
                names = sample::with_firewall_names(names);
            }
            let mut router = match previous.and_then(|p| p.router(name)) {
                Some(before) => Router::patched(before, routes),
                None => Router::new(routes),
            }
            .with_edge(edge.clone());
            router.sample = shared.sample(name, spec.runtime.impact_sample);
            router.sample_names = names;
            let router = match edge.max_inflight {
                Some(_) => router.with_shared(shared.listener(name)),
                None => router,
            };
            (name.to_owned(), router)
        })
        .collect();
    let cache_zones = spec
        .cache_zones
        .iter()
        .filter_map(|(name, spec)| Some((Arc::clone(zones.get(name.as_str())?), spec.clone())))
        .collect();
    let limit_store = spec.limit_store.as_ref().map(|s| shared.limit_store(s));
    Ok(Generation {
        id,
        ledger: Arc::new(Ledger::new(id)),
        spec,
        built_at: SystemTime::now(),
        routers,
        upstreams,
        routes,
        cache_zones,
        limit_store,
    })
}

/// The previous generation's compiled routes, found by their spec: a
/// route whose spec the candidate took over (the same allocation).
struct Kept<'g> {
    previous: Option<&'g Generation>,
    /// Built on the first route that moved from its index.
    by_spec: std::cell::OnceCell<foldhash::HashMap<*const crate::plan::RouteSpec, &'g Arc<Route>>>,
}

impl<'g> Kept<'g> {
    fn new(previous: Option<&'g Generation>) -> Self {
        Self {
            previous,
            by_spec: std::cell::OnceCell::new(),
        }
    }

    fn route(&self, i: usize, spec: &Arc<crate::plan::RouteSpec>) -> Option<&'g Arc<Route>> {
        let previous = self.previous?;
        // Most routes are where they were.
        if let Some(same) = previous
            .routes
            .get(i)
            .filter(|r| Arc::ptr_eq(&r.spec, spec))
        {
            return Some(same);
        }
        self.by_spec
            .get_or_init(|| {
                previous
                    .routes
                    .iter()
                    .map(|r| (Arc::as_ptr(&r.spec), r))
                    .collect()
            })
            .get(&Arc::as_ptr(spec))
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigText;
    use crate::test_config::TestConfig;
    use http::{HeaderMap, Method};

    fn generation(text: &str) -> Generation {
        let source = ConfigText::inline(text.to_owned(), ".".into(), "<test>");
        let spec = crate::plan::validate(&source).unwrap_or_else(|e| panic!("{e:#?}"));
        build(Arc::new(spec), GenerationId::FIRST, &SharedState::default()).expect("builds")
    }

    /// A zone keeps its size while a candidate that resizes it is only
    /// built (a refused activation, a shadow stage): it takes the new
    /// size when the candidate is published, and keeps its objects.
    #[test]
    fn a_zone_is_resized_when_its_generation_takes_effect_not_when_built() {
        let config = |memory: &str| {
            TestConfig::web()
                .route(
                    "r",
                    "listeners = [\"web\"]\nupstream = \"app\"\ncache = { zone = \"main\" }",
                )
                .upstream("app", &["127.0.0.1:9"], "")
                .text(&format!("[cache.zones.main]\nmemory = \"{memory}\""))
                .build()
        };
        let spec = |memory: &str| {
            let source = ConfigText::inline(config(memory), ".".into(), "<test>");
            Arc::new(crate::plan::validate(&source).unwrap_or_else(|e| panic!("{e:#?}")))
        };
        let shared = SharedState::default();
        let store = crate::runtime::GenerationStore::new(
            build(spec("16MiB"), GenerationId::FIRST, &shared).expect("builds"),
        );
        let any = crate::plan::ZoneSpec {
            memory: 0,
            disk: None,
        };
        let zone = shared.cache.zone("main", &any);
        assert_eq!(zone.capacity(), 16 << 20);
        let candidate = build(spec("32MiB"), GenerationId(2), &shared).expect("builds");
        assert_eq!(zone.capacity(), 16 << 20, "built, not published");
        assert!(store.commit(GenerationId::FIRST, candidate, None).is_ok());
        assert_eq!(zone.capacity(), 32 << 20, "published");
        assert!(
            Arc::ptr_eq(&zone, &shared.cache.zone("main", &any)),
            "the same zone"
        );
    }

    fn pick<'g>(
        g: &'g Generation,
        host: &str,
        path: &str,
        method: &str,
        headers: &[(&str, &str)],
    ) -> Option<&'g str> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let (path, query) = match path.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (path, None),
        };
        let head = RequestHead {
            method: &method,
            headers: &map,
            query,
        };
        g.router("web")?
            .route(Some(host), path, &head)
            .map(|r| r.name())
    }

    static ROUTES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        TestConfig::new()
            .listener("web", "")
            .text(
                r#"
[[routes]]
name = "fallback"
listeners = ["web"]
respond = { status = 404, body = "none" }

[[routes]]
name = "any-v1"
listeners = ["web"]
path_prefix = "/v1/"
respond = { body = "any-v1" }

[[routes]]
name = "wild"
listeners = ["web"]
hosts = ["*.example.com"]
respond = { body = "wild" }

[[routes]]
name = "wild-deep"
listeners = ["web"]
hosts = ["*.api.example.com"]
path_prefix = "/"
respond = { body = "wild-deep" }

[[routes]]
name = "exact-short"
listeners = ["web"]
hosts = ["api.example.com"]
path_prefix = "/v1/"
respond = { body = "short" }

[[routes]]
name = "exact-long"
listeners = ["web"]
hosts = ["api.example.com"]
path_prefix = "/v1/users/"
respond = { body = "long" }

[[routes]]
name = "exact-path"
listeners = ["web"]
hosts = ["api.example.com"]
path_exact = "/v1/users/me"
respond = { body = "me" }

[[routes]]
name = "regex"
listeners = ["web"]
hosts = ["api.example.com"]
path_regex = "^/v[0-9]+/items$"
respond = { body = "regex" }

[[routes]]
name = "canary"
listeners = ["web"]
hosts = ["api.example.com"]
path_prefix = "/v1/"
methods = ["POST"]
headers = { "x-canary" = "1" }
respond = { body = "canary" }
"#,
            )
            .build()
    });

    static SHARED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        TestConfig::new()
            .listener("web", "")
            .text(
                r#"
[[routes]]
name = "api"
listeners = ["web"]
hosts = ["api.example.com"]
upstream = "api"

[[routes]]
name = "hello"
listeners = ["web"]
hosts = ["hello.example.com"]
respond = { body = "hello" }

[[routes]]
name = "private"
listeners = ["web"]
hosts = ["private.example.com"]
upstream = "other"
auth = { basic = { users_file = "users.htpasswd" } }

[upstreams.api]
backends = [{ addr = "127.0.0.1:9001" }]

[upstreams.other]
backends = [{ addr = "127.0.0.1:9002" }]
"#,
            )
            .build()
    });

    /// The body `host`'s route answers with in `g`, or its upstream.
    fn answer(g: &Generation, host: &str) -> String {
        let method = Method::GET;
        let headers = HeaderMap::new();
        let head = RequestHead {
            method: &method,
            headers: &headers,
            query: None,
        };
        let route = g
            .router("web")
            .and_then(|r| r.route(Some(host), "/", &head));
        match route.map(|r| &r.action) {
            Some(Action::Respond(response)) => String::from_utf8_lossy(&response.body).into_owned(),
            Some(Action::Proxy(upstream)) => format!("upstream {}", upstream.name),
            _ => "none".into(),
        }
    }

    /// What a candidate does not change is the active generation's own
    /// compiled route, upstream and router group (the same allocations),
    /// what it changes is not, and the generation requests are pinned to
    /// goes on answering as it did (issue "scale").
    #[test]
    fn a_generation_shares_what_the_candidate_did_not_change() {
        let dir = tempfile::tempdir().expect("dir");
        let users = dir.path().join("users.htpasswd");
        std::fs::write(
            &users,
            "demo:$2y$10$Xl6Oc/K9C22SAVMrBxC2b.2f.kdY07J41OBCVTm8TK/hg1JK3cXJG\n",
        )
        .expect("write");
        let text = |t: &str| ConfigText::inline(t.to_owned(), dir.path().into(), "<test>");
        let shared = SharedState::default();
        let first = crate::plan::validate(&text(&SHARED)).expect("valid");
        let g1 = build(Arc::new(first), GenerationId::FIRST, &shared).expect("builds");
        let next = |active: &Generation, t: &str| {
            let plan = crate::plan::plan(&text(t), Some((active.id, &active.spec)));
            let spec = plan.spec.unwrap_or_else(|| panic!("{:?}", plan.errors));
            build_from(spec, active.id.next(), &shared, Some(active)).expect("builds")
        };
        let same =
            |a: &Generation, b: &Generation, i: usize| Arc::ptr_eq(&a.routes()[i], &b.routes()[i]);

        // One route's answer changed.
        let g2 = next(
            &g1,
            &SHARED.replace("body = \"hello\"", "body = \"bonjour\""),
        );
        assert!(
            same(&g1, &g2, 0) && same(&g1, &g2, 2),
            "unchanged routes are shared"
        );
        assert!(!same(&g1, &g2, 1), "the changed route is new");
        assert!(Arc::ptr_eq(&g1.spec.routes[0], &g2.spec.routes[0]));
        assert!(Arc::ptr_eq(
            &g1.spec.file.routes[0],
            &g2.spec.file.routes[0]
        ));
        assert!(Arc::ptr_eq(
            g1.upstream("api").expect("api"),
            g2.upstream("api").expect("api")
        ));
        // The generation requests are pinned to answers as it did.
        assert_eq!(answer(&g1, "hello.example.com"), "hello");
        assert_eq!(answer(&g2, "hello.example.com"), "bonjour");
        assert_eq!(answer(&g1, "api.example.com"), "upstream api");
        assert_eq!(answer(&g2, "api.example.com"), "upstream api");

        // The same text, but a file the route reads changed: not shared.
        std::fs::write(
            &users,
            "other:$2y$10$Xl6Oc/K9C22SAVMrBxC2b.2f.kdY07J41OBCVTm8TK/hg1JK3cXJG\n",
        )
        .expect("write");
        let g3 = next(
            &g2,
            &SHARED.replace("body = \"hello\"", "body = \"bonjour\""),
        );
        assert!(same(&g2, &g3, 0) && same(&g2, &g3, 1));
        assert!(
            !same(&g2, &g3, 2),
            "a route whose users file changed is built again"
        );
        assert_ne!(g2.spec.config_version, g3.spec.config_version);

        // An upstream's backends changed: it and the route to it are new,
        // the rest is shared.
        let g4 = next(&g3, &SHARED.replace("127.0.0.1:9002", "127.0.0.1:9003"));
        assert!(!Arc::ptr_eq(
            g3.upstream("other").expect("other"),
            g4.upstream("other").expect("other")
        ));
        assert!(Arc::ptr_eq(
            g3.upstream("api").expect("api"),
            g4.upstream("api").expect("api")
        ));
        assert!(same(&g3, &g4, 0) && !same(&g3, &g4, 2));
        assert_eq!(answer(&g4, "hello.example.com"), "hello");

        // A route moved (another inserted before it) is still shared, and
        // routed as before.
        let inserted = SHARED.replacen(
            "[[routes]]",
            "[[routes]]\nname = \"first\"\nlisteners = [\"web\"]\nhosts = [\"first.example.com\"]\nrespond = { body = \"first\" }\n\n[[routes]]",
            1,
        );
        let g5 = next(&g4, &inserted);
        assert!(Arc::ptr_eq(&g4.routes()[0], &g5.routes()[1]));
        assert_eq!(answer(&g5, "first.example.com"), "first");
        assert_eq!(answer(&g5, "api.example.com"), "upstream api");
        assert_eq!(answer(&g4, "first.example.com"), "none");
    }

    #[test]
    fn most_specific_host_then_longest_path_then_order() {
        let g = generation(&ROUTES);
        assert_eq!(
            pick(&g, "api.example.com", "/v1/users/7", "GET", &[]),
            Some("exact-long")
        );
        assert_eq!(
            pick(&g, "API.example.com", "/v1/other", "GET", &[]),
            Some("exact-short")
        );
        assert_eq!(
            pick(&g, "api.example.com", "/v1/users/me", "GET", &[]),
            Some("exact-path")
        );
        assert_eq!(
            pick(&g, "api.example.com", "/v2/items", "GET", &[]),
            Some("regex")
        );
        // Declaration order: exact-short is declared before canary and matches too.
        assert_eq!(
            pick(&g, "api.example.com", "/v1/x", "POST", &[("x-canary", "1")]),
            Some("exact-short")
        );
        // Nothing in the exact group matches: longest wildcard, then shorter.
        assert_eq!(
            pick(&g, "api.example.com", "/other", "GET", &[]),
            Some("wild")
        );
        assert_eq!(
            pick(&g, "a.api.example.com", "/x", "GET", &[]),
            Some("wild-deep")
        );
        assert_eq!(
            pick(&g, "www.example.com", "/v1/x", "GET", &[]),
            Some("wild")
        );
        // A wildcard does not match its bare suffix.
        assert_eq!(pick(&g, "example.com", "/v1/x", "GET", &[]), Some("any-v1"));
        assert_eq!(pick(&g, "other.test", "/", "GET", &[]), Some("fallback"));
    }

    #[test]
    fn query_and_header_patterns_pick_the_first_route_that_accepts_them() {
        let g = generation(
            &TestConfig::web()
                .text(
                    r#"
[[routes]]
name = "v2"
listeners = ["web"]
path_exact = "/s"
query = { version = "2", lang = "~^(en|de)$", debug = "*" }
respond = { body = "v2" }

[[routes]]
name = "canary"
listeners = ["web"]
path_exact = "/s"
headers = { "x-env" = "~^(staging|prod)$", "x-canary" = "*" }
respond = { body = "canary" }

[[routes]]
name = "rest"
listeners = ["web"]
path_exact = "/s"
respond = { body = "rest" }
"#,
                )
                .build(),
        );
        let at = |path: &str, headers: &[(&str, &str)]| pick(&g, "h", path, "GET", headers);
        assert_eq!(at("/s?version=2&lang=en&debug", &[]), Some("v2"));
        assert_eq!(at("/s?debug=&lang=d%65&version=2", &[]), Some("v2"));
        assert_eq!(
            at("/s?version=2+&lang=en&debug", &[]),
            Some("rest"),
            "'2 ' is not '2'"
        );
        assert_eq!(at("/s?version=2&lang=fr&debug", &[]), Some("rest"));
        assert_eq!(
            at("/s?version=2&lang=en", &[]),
            Some("rest"),
            "debug absent"
        );
        assert_eq!(at("/s", &[]), Some("rest"));
        assert_eq!(
            at("/s", &[("x-env", "prod"), ("x-canary", "")]),
            Some("canary"),
            "present with an empty value"
        );
        assert_eq!(
            at("/s", &[("x-env", "production"), ("x-canary", "1")]),
            Some("rest")
        );
        assert_eq!(at("/s", &[("x-env", "staging")]), Some("rest"));
    }

    #[test]
    fn method_and_header_matchers_filter() {
        let text = ROUTES.replace(
            "[[routes]]\nname = \"exact-short\"",
            "[[routes]]\nname = \"exact-short\"\nmethods = [\"GET\"]",
        );
        let g = generation(&text);
        assert_eq!(
            pick(&g, "api.example.com", "/v1/x", "POST", &[("x-canary", "1")]),
            Some("canary")
        );
        // No exact-host route takes a POST without the header: the wildcard does.
        assert_eq!(
            pick(&g, "api.example.com", "/v1/x", "POST", &[("x-canary", "2")]),
            Some("wild")
        );
        assert_eq!(
            pick(&g, "api.example.com", "/v1/x", "GET", &[]),
            Some("exact-short")
        );
    }
}

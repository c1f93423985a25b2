//! `cutover import gateway-api`: Kubernetes Gateway API resources read
//! from YAML and written as a cutover configuration
//! (`docs/gateway-api.md`).
//!
//! The importer does what a Gateway API controller does for one class:
//! attaches each route to the listeners its `parentRefs` name and allow
//! it, intersects hostnames, resolves backends (Services and their
//! EndpointSlices from the input, or cluster DNS names), and writes every
//! rule as cutover routes in the API's precedence order. What it cannot
//! honour is never dropped silently: each route gets the API's status
//! conditions (`Accepted`, `ResolvedRefs`, with the standard reasons),
//! and an unsupported field is `UnsupportedValue` naming the field.
//!
//! The configuration written is checked by cutover's own validation
//! before it is returned.

mod filters;
mod frontend;
mod gateways;
mod grants;
mod http;
mod isolation;
mod l4;
mod listener_sets;
mod listeners;
mod matches;
mod model;
mod policy;
pub mod resources;
mod routes;
mod secrets;
mod status;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::Value;

use model::{Listener, ListenerKind};
pub use resources::{Fields, Resource};
pub use status::{Condition, ParentStatus, RouteStatus};

/// The group of every Gateway API kind.
pub const GROUP: &str = "gateway.networking.k8s.io";
/// The kinds of the Gateway API's group the import reads.
const READ: [&str; 10] = [
    "GatewayClass",
    "Gateway",
    "ListenerSet",
    "HTTPRoute",
    "GRPCRoute",
    "TLSRoute",
    "TCPRoute",
    "UDPRoute",
    "ReferenceGrant",
    "BackendTLSPolicy",
];

/// The default of [`Options::invalid_address`].
pub const INVALID_ADDRESS: &str = "127.0.0.1:9198";

/// The `controllerName` written in statuses.
pub const CONTROLLER: &str = "cutover.dev/gateway";

/// How backends without EndpointSlices in the input are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Services {
    /// Only Services (and EndpointSlices) given in the input; another is
    /// `BackendNotFound`.
    Input,
    /// A Service without EndpointSlices in the input is its cluster DNS
    /// name, `NAME.NAMESPACE.svc.DOMAIN:PORT`; so is one absent from the
    /// input that `Options::cluster_services` names. Any other absent
    /// Service is `BackendNotFound`: nothing says the cluster has it.
    Dns,
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Only Gateways of this class (all Gateways when `None`).
    pub gateway_class: Option<String>,
    /// The address listeners bind on (their port is the Gateway's), for
    /// Gateways without one of their own.
    pub address: String,
    /// Each Gateway's own address, by `namespace/name` (before its
    /// `spec.addresses`).
    pub gateway_addresses: BTreeMap<String, String>,
    pub services: Services,
    /// With `Services::Dns`: the Services the cluster has beyond the
    /// input, as `namespace/name` or `namespace/*` (every Service of
    /// that namespace).
    pub cluster_services: BTreeSet<String>,
    /// The cluster's DNS domain.
    pub cluster_domain: String,
    /// `[admin] bind` of the written configuration.
    pub admin: String,
    /// Where the configuration answers 500 for the share of a rule's
    /// requests its unresolved backendRefs would have had (a listener
    /// of its own, written only when some rule needs it).
    pub invalid_address: String,
    /// The folder the configuration will be written to: HTTPS listeners'
    /// certificates are written beside it (`gateway-api-secrets/`), and
    /// it is validated there. `None`: no file is written, and an HTTPS
    /// listener cannot be served.
    pub base_dir: Option<PathBuf>,
    /// Settings written first (`[admin]`, `[log]`, `[runtime]`, …: the
    /// `*.toml` of a `run --gateway-api` folder); no `[admin]` is
    /// written after them.
    pub settings: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            gateway_class: None,
            address: "0.0.0.0".into(),
            gateway_addresses: BTreeMap::new(),
            services: Services::Input,
            cluster_services: BTreeSet::new(),
            cluster_domain: "cluster.local".into(),
            admin: "127.0.0.1:9190".into(),
            invalid_address: INVALID_ADDRESS.into(),
            settings: None,
            base_dir: None,
        }
    }
}

/// What an import produced.
#[derive(Debug)]
pub struct Imported {
    /// The cutover configuration (TOML), valid by cutover's validation.
    pub config: String,
    /// One per route of an imported kind, with a status per parent.
    pub routes: Vec<RouteStatus>,
    /// One per Gateway: its listeners' conditions.
    pub gateways: Vec<status::GatewayStatus>,
    /// One per ListenerSet.
    pub listener_sets: Vec<status::ListenerSetStatus>,
    /// One per BackendTLSPolicy.
    pub policies: Vec<status::PolicyStatus>,
    /// Resources of the Gateway API's group the import does not read
    /// (`Kind namespace/name`): said, never dropped silently.
    pub ignored: Vec<String>,
    pub counts: Counts,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub gateways: usize,
    pub routes: usize,
    pub cutover_routes: usize,
    pub upstreams: usize,
}

impl Imported {
    /// Whether every route is accepted with every reference resolved,
    /// and every listener accepted.
    pub fn all_accepted(&self) -> bool {
        self.routes
            .iter()
            .flat_map(|r| &r.parents)
            .flat_map(|p| &p.conditions)
            .chain(
                self.gateways
                    .iter()
                    .flat_map(|g| &g.listeners)
                    .flat_map(|l| &l.conditions),
            )
            .chain(self.gateways.iter().flat_map(|g| &g.conditions))
            .chain(self.listener_sets.iter().flat_map(|s| {
                s.conditions
                    .iter()
                    .chain(s.listeners.iter().flat_map(|l| &l.conditions))
            }))
            .all(|c| {
                // A condition true for a problem (a rule dropped, an
                // insecure mode, some listeners invalid) is not all well.
                c.status
                    && !matches!(
                        c.kind,
                        "InsecureFrontendValidationMode" | "PartiallyInvalid" | "Conflicted"
                    )
                    && c.reason != "ListenersNotValid"
            })
            && self
                .policies
                .iter()
                .flat_map(|p| &p.conditions)
                .all(|c| c.status)
            && self.ignored.is_empty()
    }

    /// Writes the configuration to `path` whole or not at all (a
    /// `--watch`ing gateway never reads half a file).
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write as _;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => std::path::Path::new("."),
        };
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name")
        })?;
        crate::files::write_atomically(dir, name, |out| out.write_all(self.config.as_bytes()))
    }

    /// The statuses as YAML documents (`kind`, `metadata`, `status`),
    /// the way `kubectl get -o yaml` shows them.
    pub fn status_yaml(&self) -> String {
        status::yaml(
            &self.gateways,
            &self.listener_sets,
            &self.routes,
            &self.policies,
        )
    }
}

/// `cutover run --gateway-api DIR [--gateway-api-address ADDR]`.
#[derive(Debug, Clone)]
pub struct Source {
    pub dir: PathBuf,
    /// Where the imported listeners bind.
    pub address: String,
    /// Each Gateway's own address, by `namespace/name`.
    pub gateway_addresses: BTreeMap<String, String>,
    /// The Services the cluster has beyond the folder's
    /// (`namespace/name` or `namespace/*`).
    pub cluster_services: BTreeSet<String>,
}

/// What `cutover run --gateway-api DIR` serves: DIR's settings file
/// (its one `*.toml`, if any) followed by the import of DIR's resources,
/// written to `config` when it differs from what is there. `Ok(None)`
/// when nothing changed.
pub fn compose_into(source: &Source, config: &std::path::Path) -> Result<Option<Imported>, String> {
    let dir = source.dir.as_path();
    let mut settings = Vec::new();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: cannot read the folder: {e}", dir.display()))?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        // A ConfigMap's `..data` and its timestamped folder are not ours.
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if path.extension().is_some_and(|x| x == "toml") && !hidden {
            settings.push(path);
        }
    }
    settings.sort();
    if settings.len() > 1 {
        return Err(format!(
            "{}: more than one settings file ({}): keep one",
            dir.display(),
            settings
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let settings = match settings.first() {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("{}: cannot read: {e}", path.display()))?,
        ),
        None => None,
    };
    // In a cluster the folder holds routes, not EndpointSlices: a
    // Service it describes, or one the cluster is said to have, is its
    // cluster DNS name.
    let options = Options {
        settings,
        base_dir: Some(match config.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        }),
        address: source.address.clone(),
        gateway_addresses: source.gateway_addresses.clone(),
        services: Services::Dns,
        cluster_services: source.cluster_services.clone(),
        ..Options::default()
    };
    let imported = import(&[dir.to_path_buf()], &options)?;
    if std::fs::read_to_string(config).is_ok_and(|text| text == imported.config) {
        return Ok(None);
    }
    imported
        .write(config)
        .map_err(|e| format!("{}: cannot write: {e}", config.display()))?;
    Ok(Some(imported))
}

/// Reads `paths` (files or folders of YAML) and imports them.
pub fn import(paths: &[PathBuf], options: &Options) -> Result<Imported, String> {
    let resources = resources::read(paths)?;
    import_resources(&resources, options)
}

pub fn import_resources(resources: &[Resource], options: &Options) -> Result<Imported, String> {
    // 1. The Gateways: their listeners (and their ListenerSets'), the
    // ports that serve them, their statuses.
    let of_kind = |kind: &'static str| of_kind(resources, kind);
    let model::Gateways {
        gateways,
        sets,
        listeners,
        ports,
        statuses: gateway_statuses,
        set_statuses,
        backend_clients,
    } = gateways::read(resources, options);
    let namespaces: BTreeMap<&str, &serde_json::Map<String, Value>> = of_kind("Namespace")
        .map(|n| (n.name.as_str(), &n.labels))
        .collect();
    let ctx = model::Context {
        resources,
        gateways: &gateways,
        sets: &sets,
        listeners: &listeners,
        namespaces: &namespaces,
        backend_clients: &backend_clients,
        options,
    };
    let mut statuses = Statuses {
        listeners: &listeners,
        gateways: gateway_statuses,
        sets: set_statuses,
        routes: Vec::new(),
    };
    // 2. HTTPRoutes, then GRPCRoutes, each oldest first (the API's
    // precedence).
    let http_routes = oldest_first(of_kind("HTTPRoute"));
    let grpc_routes = oldest_first(of_kind("GRPCRoute"));
    let mut built = model::Built::default();
    for (order, route) in http_routes.iter().chain(&grpc_routes).enumerate() {
        let (status, attached) = http::import_route(&ctx, route, order, &mut built);
        statuses.add(status, attached);
    }
    http::settle(&mut built.routes);
    // 3. TCP, TLS passthrough and UDP routes, oldest first.
    let l4_routes = oldest_first(resources.iter().filter(|r| {
        r.group() == GROUP && matches!(r.kind.as_str(), "TLSRoute" | "TCPRoute" | "UDPRoute")
    }));
    let mut l4 = BTreeMap::new();
    for route in l4_routes {
        let (status, attached) = l4::import_route(&ctx, route, &mut l4, &mut built.upstreams);
        statuses.add(status, attached);
    }
    // 4. The configuration, held to the validation any other is.
    let config = emit(&ports, &built, &l4, options);
    validate_import(&config, options)?;
    // 5. What was imported, and every status.
    Ok(Imported {
        counts: Counts {
            gateways: gateways.len(),
            routes: http_routes.len(),
            cutover_routes: built.routes.len(),
            upstreams: built.upstreams.len(),
        },
        config,
        routes: statuses.routes,
        gateways: statuses.gateways,
        listener_sets: statuses.sets,
        policies: policy::statuses(resources, options.base_dir.as_deref()),
        ignored: resources
            .iter()
            .filter(|r| r.group() == GROUP && !READ.contains(&r.kind.as_str()))
            .map(Resource::id)
            .collect(),
    })
}

/// Resources oldest first, then by namespace and name: the Gateway API's
/// tie-breakers between routes.
fn oldest_first<'a>(resources: impl Iterator<Item = &'a Resource>) -> Vec<&'a Resource> {
    let mut sorted: Vec<&Resource> = resources.collect();
    sorted.sort_by(|a, b| {
        (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name))
    });
    sorted
}

/// The written configuration validates as any other would; one that does
/// not is a bug of the import, said as such.
fn validate_import(config: &str, options: &Options) -> Result<(), String> {
    let text = crate::config::ConfigText::inline(
        config.to_owned(),
        options
            .base_dir
            .clone()
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(|| PathBuf::from(".")),
        "gateway-api import",
    );
    match crate::plan::validate(&text) {
        Ok(_) => Ok(()),
        Err(diagnostics) => {
            let mut message = String::from("the configuration written from the resources does not validate (a bug of the import):\n");
            for d in diagnostics {
                let _ = writeln!(message, "  {}", d.render("import"));
            }
            Err(message)
        }
    }
}

/// The statuses an import writes, as routes attach to listeners.
struct Statuses<'a> {
    listeners: &'a [Listener],
    gateways: Vec<status::GatewayStatus>,
    sets: Vec<status::ListenerSetStatus>,
    routes: Vec<status::RouteStatus>,
}

impl Statuses<'_> {
    /// A route's status, and its attachments added to its listeners'
    /// `attachedRoutes`.
    fn add(&mut self, route: status::RouteStatus, attached: BTreeMap<usize, usize>) {
        for (listener, count) in attached {
            let Some(l) = self.listeners.get(listener) else {
                continue;
            };
            let owner = match l.set {
                Some(si) => self.sets.get_mut(si).map(|s| &mut s.listeners),
                None => self.gateways.get_mut(l.gateway).map(|g| &mut g.listeners),
            };
            if let Some(ls) = owner.and_then(|ls| ls.iter_mut().find(|s| s.name == l.name)) {
                ls.attached += count;
            }
        }
        self.routes.push(route);
    }
}

/// The resources of a Gateway API kind, or of a core kind.
fn of_kind<'a>(resources: &'a [Resource], kind: &'a str) -> impl Iterator<Item = &'a Resource> {
    resources
        .iter()
        .filter(move |r| r.kind == kind && (r.group() == GROUP || kind_is_core(kind)))
}

fn kind_is_core(kind: &str) -> bool {
    matches!(kind, "Service" | "Namespace" | "Secret" | "ConfigMap")
}

/// The configuration's text.
fn emit(
    ports: &[model::Port],
    built: &model::Built,
    l4: &BTreeMap<String, l4::Served>,
    options: &Options,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Written by `cutover import gateway-api`: change the resources and import again.\n"
    );
    match &options.settings {
        Some(settings) => {
            out.push_str(settings);
            let _ = writeln!(
                out,
                "\n# ---- imported from the Gateway API resources ----\n"
            );
        }
        None => {
            let _ = writeln!(out, "[admin]\nbind = {}\n", toml_str(&options.admin));
        }
    }
    for port in ports {
        let name = toml_str(&port.name);
        let bind = toml_str(&port.bind);
        match port.kind {
            ListenerKind::Http => {
                let _ = writeln!(out, "[[listeners]]\nname = {name}\nbind = {bind}\n");
            }
            ListenerKind::Https => {
                // Each Gateway listener's certificates serve its hostname;
                // a request for a host another listener of the port owns
                // is 421 Misdirected Request.
                let pairs: Vec<String> = port
                    .certificates
                    .iter()
                    .map(|(cert, key, host)| {
                        format!(
                            "{{ cert = {}, key = {}, hosts = [{}] }}",
                            toml_str(cert),
                            toml_str(key),
                            toml_str(host)
                        )
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "[[listeners]]\nname = {name}\nbind = {bind}\nprotocol = \"https\"\ntls.certificates = [{}]\ntls.strict_sni_host = true",
                    pairs.join(", ")
                );
                if let Some(client) = &port.client {
                    let _ = writeln!(out, "tls.client_ca = {}", toml_str(&client.ca));
                    if client.optional {
                        let _ = writeln!(out, "tls.client_auth = \"insecure_fallback\"");
                    }
                }
                out.push('\n');
            }
            // An L4 listener without a route has nothing to relay to.
            kind => {
                if let Some(served) = l4.get(&port.name) {
                    out.push_str(&served.toml(&port.name, &bind, kind.is_udp()));
                    out.push('\n');
                }
            }
        }
    }
    if built.answers_500 {
        let _ = writeln!(
            out,
            "# The share of requests a rule's unresolved backendRefs would have had\n\
             # is sent here and answered 500, as the Gateway API requires.\n\
             [[listeners]]\nname = \"gateway-api-invalid\"\nbind = {}\n\n\
             [[routes]]\nname = \"gateway-api-invalid\"\nlisteners = [\"gateway-api-invalid\"]\n\
             respond = {{ status = 500, body = \"backend not resolved (see the route's ResolvedRefs condition)\\n\" }}\n",
            toml_str(&options.invalid_address)
        );
    }
    for route in &built.routes {
        out.push_str(&route.toml());
        out.push('\n');
    }
    for port in ports {
        out.push_str(&isolation::isolation(port, &built.routes));
    }
    let used: BTreeSet<&str> = built
        .routes
        .iter()
        .flat_map(|r| r.upstreams())
        .chain(l4.values().flat_map(l4::Served::upstreams))
        .collect();
    for (name, upstream) in &built.upstreams {
        if used.contains(name.as_str()) {
            out.push_str(&upstream.toml(name));
            out.push('\n');
        }
    }
    out
}

fn join_host_port(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

/// A TOML string literal.
pub(crate) fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

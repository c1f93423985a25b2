//! Gateways and their listeners: the address each Gateway listens on (its
//! own, as each has in a cluster), which listeners are accepted, which are
//! served, which conflict; the client certificates an HTTPS port demands
//! (`spec.tls.frontend`); and the Gateway's and each listener's status.
//!
//! A listener is served only when everything it asks for is honoured:
//! an unresolved certificate, an unreadable client CA, a field the import
//! does not read, a port another Gateway holds: the listener is reported
//! and not served (fail closed), never served without what it asked.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::filters::granted;
use super::status::{self, Condition};
use super::{secrets, Options, Resource, GROUP};

/// What a Gateway listener serves, as cutover serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListenerKind {
    /// `HTTP`: HTTPRoutes and GRPCRoutes on an `http` listener.
    Http,
    /// `HTTPS`: the same on an `https` listener, with the certificates of
    /// its `certificateRefs`.
    Https,
    /// `TCP`: one TCPRoute on a `tcp` listener.
    Tcp,
    /// `TLS` with `mode: Passthrough`: TLSRoutes by SNI on a `tcp`
    /// listener.
    Passthrough,
    /// `UDP`: one UDPRoute on a `udp` listener.
    Udp,
}

impl ListenerKind {
    fn of(protocol: &str, tls_mode: Option<&str>) -> Result<Self, String> {
        match (protocol, tls_mode.unwrap_or("Terminate")) {
            ("HTTP", _) => Ok(ListenerKind::Http),
            ("HTTPS", _) => Ok(ListenerKind::Https),
            ("TCP", _) => Ok(ListenerKind::Tcp),
            ("UDP", _) => Ok(ListenerKind::Udp),
            ("TLS", "Passthrough") => Ok(ListenerKind::Passthrough),
            ("TLS", mode) => Err(format!("TLS mode {mode:?}: only Passthrough is imported (terminating TLS listeners are not: docs/gateway-api.md)")),
            (other, _) => Err(format!("protocol {other:?} is not a Gateway API protocol cutover serves")),
        }
    }

    /// The route kinds it can take.
    fn route_kinds(self) -> &'static [&'static str] {
        match self {
            ListenerKind::Http | ListenerKind::Https => &["HTTPRoute", "GRPCRoute"],
            ListenerKind::Tcp => &["TCPRoute"],
            ListenerKind::Passthrough => &["TLSRoute"],
            ListenerKind::Udp => &["UDPRoute"],
        }
    }

    /// The cutover listener's name prefix.
    fn prefix(self) -> &'static str {
        match self {
            ListenerKind::Http => "http",
            ListenerKind::Https => "https",
            ListenerKind::Tcp => "tcp",
            ListenerKind::Passthrough => "tls",
            ListenerKind::Udp => "udp",
        }
    }

    pub fn is_udp(self) -> bool {
        self == ListenerKind::Udp
    }
}

#[derive(Debug, Clone)]
pub(super) enum AllowedFrom {
    Same,
    All,
    Selector(BTreeMap<String, String>),
    /// `from: None`: no route attaches.
    None,
}

/// One Gateway listener that was accepted: routes attach to it; it is
/// served when `served`.
#[derive(Debug, Clone)]
pub(super) struct Listener {
    pub gateway: usize,
    pub name: String,
    pub hostname: Option<String>,
    pub port: u16,
    pub from: AllowedFrom,
    /// The cutover listener serving it.
    pub cutover: String,
    /// The route kinds it takes (`allowedRoutes.kinds`, or its protocol's).
    pub kinds: Vec<&'static str>,
    pub served: bool,
}

impl Listener {
    pub fn takes(&self, route_kind: &str) -> bool {
        self.kinds.contains(&route_kind)
    }
}

/// Client certificates a port demands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClientValidation {
    /// The CA bundle file, relative to the configuration.
    pub ca: String,
    /// `AllowInsecureFallback`: a client without a (valid) certificate is
    /// served too.
    pub optional: bool,
}

/// One cutover listener: an address and port of one Gateway.
#[derive(Debug, Clone)]
pub(super) struct Port {
    pub name: String,
    pub bind: String,
    pub kind: ListenerKind,
    /// `(cert, key, hosts)`: each Gateway listener's certificates serve
    /// its hostname (`*`: a listener without one).
    pub certificates: Vec<(String, String, String)>,
    pub client: Option<ClientValidation>,
    /// The hostnames of the Gateway listeners it serves (`None`: any).
    pub hostnames: Vec<Option<String>>,
}

pub(super) struct Gateways<'a> {
    pub gateways: Vec<&'a Resource>,
    pub listeners: Vec<Listener>,
    pub ports: Vec<Port>,
    pub statuses: Vec<status::GatewayStatus>,
}

/// The Gateways of the class, each with its address and listeners.
pub(super) fn read<'a>(resources: &'a [Resource], options: &Options) -> Gateways<'a> {
    let mut gateways: Vec<&Resource> = resources
        .iter()
        .filter(|r| r.kind == "Gateway" && r.group() == GROUP)
        .filter(|g| match &options.gateway_class {
            Some(class) => {
                g.body
                    .pointer("/spec/gatewayClassName")
                    .and_then(Value::as_str)
                    == Some(class)
            }
            None => true,
        })
        .collect();
    // The API's order: the oldest first, then namespace/name (a port two
    // Gateways ask for goes to the first).
    gateways.sort_by(|a, b| {
        (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name))
    });
    let mut out = Gateways {
        gateways: Vec::new(),
        listeners: Vec::new(),
        ports: Vec::new(),
        statuses: Vec::new(),
    };
    // (bind, udp) → the index of the Gateway holding it.
    let mut held: BTreeMap<(String, bool), usize> = BTreeMap::new();
    for (gi, gateway) in gateways.iter().enumerate() {
        let status = read_gateway(resources, gateway, gi, options, &mut held, &mut out);
        out.statuses.push(status);
    }
    out.gateways = gateways;
    out
}

/// A listener being read: its conditions by type.
#[derive(Default)]
struct Verdict {
    accepted: Vec<Condition>,
    refs: Vec<Condition>,
    conflicted: Option<Condition>,
    /// The only unresolved references are route kinds, and some kinds
    /// are valid: served for those.
    kinds_only: bool,
}

impl Verdict {
    fn refuse(&mut self, c: Condition) {
        match c.kind {
            "ResolvedRefs" => self.refs.push(c),
            _ => self.accepted.push(c),
        }
    }

    fn conditions(&self, served: bool) -> Vec<Condition> {
        let mut out = vec![
            merged("Accepted", "Accepted", &self.accepted),
            merged("ResolvedRefs", "ResolvedRefs", &self.refs),
            if served {
                Condition::yes("Programmed", "Programmed")
            } else {
                Condition::no(
                    "Programmed",
                    "Invalid",
                    "not served: see its Accepted and ResolvedRefs conditions".into(),
                )
            },
        ];
        if let Some(c) = &self.conflicted {
            out.push(c.clone());
        }
        out
    }
}

/// One condition of a type: true with `reason` when there is no
/// problem, else the first problem's reason with every message.
fn merged(kind: &'static str, reason: &str, problems: &[Condition]) -> Condition {
    match problems.first() {
        None => Condition::yes(kind, reason),
        Some(first) => Condition::no(
            kind,
            &first.reason,
            problems
                .iter()
                .map(|c| c.message.as_str())
                .filter(|m| !m.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    }
}

fn read_gateway(
    resources: &[Resource],
    gateway: &Resource,
    gi: usize,
    options: &Options,
    held: &mut BTreeMap<(String, bool), usize>,
    out: &mut Gateways<'_>,
) -> status::GatewayStatus {
    let spec = gateway.spec();
    spec.ignore(&["gatewayClassName"]);
    let mut status = status::GatewayStatus::new(gateway);
    // Problems of the Gateway itself: none of its listeners is served.
    let mut gateway_problems: Vec<Condition> = Vec::new();
    let address = match address(gateway, &spec, options) {
        Ok(a) => a,
        Err(c) => {
            gateway_problems.push(c);
            options.address.clone()
        }
    };
    if let Some(infra) = spec.object("infrastructure") {
        if infra.get("parametersRef").is_some() {
            gateway_problems.push(Condition::no(
                "Accepted",
                "InvalidParameters",
                "spec.infrastructure.parametersRef: cutover reads no parameters resource".into(),
            ));
        }
        // Labels and annotations are for the pods a controller makes:
        // there are none to carry them.
        infra.ignore(&["labels", "annotations"]);
        for field in infra.rest() {
            gateway_problems.push(unsupported_gateway(&field));
        }
    }
    let frontend = Frontend::read(resources, gateway, &spec, options.base_dir.as_deref());
    let insecure = frontend.insecure;
    for field in &frontend.unsupported {
        gateway_problems.push(unsupported_gateway(field));
    }
    let gateway_ok = gateway_problems.is_empty();

    // Within one Gateway: the first listener on a port sets its protocol.
    let mut on_port: BTreeMap<(u16, bool), (ListenerKind, Vec<Option<String>>)> = BTreeMap::new();
    let mut accepted_count = 0;
    let mut listener_count = 0;
    for l in spec.list("listeners") {
        listener_count += 1;
        let name = l.str("name").unwrap_or_default().to_owned();
        let protocol = l.str("protocol").unwrap_or_default();
        let port = l
            .int("port")
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0);
        let hostname = l.str("hostname").map(str::to_ascii_lowercase);
        let mut verdict = Verdict::default();
        let tls = l.object("tls");
        let tls_mode = tls.as_ref().and_then(|t| t.str("mode").map(str::to_owned));
        let kind = ListenerKind::of(protocol, tls_mode.as_deref());
        let mut certificates = Vec::new();
        let mut client = None;
        match (&kind, &tls) {
            (Ok(ListenerKind::Https), _) => {
                match secrets::listener_certificates(
                    resources,
                    gateway,
                    tls.as_ref(),
                    options.base_dir.as_deref(),
                ) {
                    Ok(c) => certificates = c,
                    Err(c) => verdict.refuse(c),
                }
                match frontend.for_port(port) {
                    Some(Ok(v)) => client = Some(v.clone()),
                    Some(Err(conditions)) => {
                        for c in conditions {
                            verdict.refuse(c.clone());
                        }
                    }
                    None => {}
                }
            }
            // A passthrough listener keeps no certificate.
            (_, Some(t)) => t.ignore(&["certificateRefs"]),
            (_, None) => {}
        }
        if let Some(t) = &tls {
            for field in t.rest() {
                verdict.refuse(status::unsupported_listener(&field));
            }
        }
        let (from, kinds) = allowed_routes(&l, kind.as_ref().ok().copied(), &mut verdict);
        if let Err(why) = &kind {
            verdict.refuse(Condition::no(
                "Accepted",
                "UnsupportedProtocol",
                why.clone(),
            ));
        }
        if port == 0 {
            verdict.refuse(Condition::no(
                "Accepted",
                "UnsupportedValue",
                "a port between 1 and 65535 is required".into(),
            ));
        }
        for field in l.rest() {
            verdict.refuse(status::unsupported_listener(&field));
        }
        let bind = super::join_host_port(&address, port);
        if let Ok(kind) = kind {
            if port != 0 {
                match on_port.get_mut(&(port, kind.is_udp())) {
                    Some((first, _)) if *first != kind => {
                        let why = format!(
                            "port {port} is already this Gateway's {} listener",
                            first.prefix()
                        );
                        verdict.conflicted = Some(Condition::yes("Conflicted", "ProtocolConflict"));
                        verdict.refuse(Condition::no("Accepted", "ProtocolConflict", why));
                    }
                    Some((_, hostnames))
                        if hostnames.contains(&hostname)
                            || matches!(kind, ListenerKind::Tcp | ListenerKind::Udp) =>
                    {
                        let why = match &hostname {
                            Some(h) => {
                                format!("another listener on port {port} already serves {h}")
                            }
                            None => format!(
                                "another listener on port {port} already serves every hostname"
                            ),
                        };
                        verdict.conflicted = Some(Condition::yes("Conflicted", "HostnameConflict"));
                        verdict.refuse(Condition::no("Accepted", "HostnameConflict", why));
                    }
                    Some((_, hostnames)) => hostnames.push(hostname.clone()),
                    None => {
                        on_port.insert((port, kind.is_udp()), (kind, vec![hostname.clone()]));
                    }
                }
                if let Some(&other) = held.get(&(bind.clone(), kind.is_udp())) {
                    if other != gi {
                        let holder = out
                            .statuses
                            .get(other)
                            .map(|s| format!("{}/{}", s.namespace, s.name))
                            .unwrap_or_default();
                        verdict.refuse(Condition::no(
                            "Accepted",
                            "PortUnavailable",
                            format!(
                                "{bind} is Gateway {holder}'s: give each Gateway its own address (spec.addresses, or --gateway-address {}/{}=ADDRESS)",
                                gateway.namespace, gateway.name
                            ),
                        ));
                    }
                }
            }
        }
        let accepted = verdict.accepted.is_empty();
        let refs_ok = verdict.refs.is_empty() || verdict.kinds_only;
        let served = accepted && refs_ok && gateway_ok;
        if let (true, Ok(kind)) = (accepted, kind) {
            accepted_count += 1;
            let cutover = if address == options.address {
                format!("{}-{port}", kind.prefix())
            } else {
                format!("{}-{}-{port}", kind.prefix(), name_part(&address))
            };
            if served {
                held.insert((bind.clone(), kind.is_udp()), gi);
                let host = hostname.clone().unwrap_or_else(|| "*".into());
                let certificates: Vec<(String, String, String)> = certificates
                    .into_iter()
                    .map(|(cert, key)| (cert, key, host.clone()))
                    .collect();
                match out.ports.iter_mut().find(|p| p.name == cutover) {
                    Some(p) => {
                        for entry in certificates {
                            if !p.certificates.contains(&entry) {
                                p.certificates.push(entry);
                            }
                        }
                        p.hostnames.push(hostname.clone());
                    }
                    None => out.ports.push(Port {
                        name: cutover.clone(),
                        bind,
                        kind,
                        certificates,
                        client,
                        hostnames: vec![hostname.clone()],
                    }),
                }
            }
            out.listeners.push(Listener {
                gateway: gi,
                name: name.clone(),
                hostname,
                port,
                from,
                cutover,
                kinds: kinds.clone(),
                served,
            });
        }
        status.listeners.push(status::ListenerStatus {
            name,
            attached: 0,
            supported_kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
            conditions: verdict.conditions(served),
        });
    }
    for field in spec.rest() {
        gateway_problems.push(unsupported_gateway(&field));
    }
    let served_any = out.listeners.iter().any(|l| l.gateway == gi && l.served);
    status.conditions = if let Some(first) = gateway_problems.first() {
        vec![
            merged("Accepted", &first.reason, &gateway_problems),
            Condition::no(
                "Programmed",
                "Invalid",
                "not served: see the Accepted condition".into(),
            ),
        ]
    } else {
        let accepted = if accepted_count == listener_count {
            Condition::yes("Accepted", "Accepted")
        } else if accepted_count == 0 {
            Condition::no(
                "Accepted",
                "ListenersNotValid",
                "no listener is valid: see the listeners' conditions".into(),
            )
        } else {
            let mut c = Condition::yes("Accepted", "ListenersNotValid");
            c.message = "some listeners are not valid: see their conditions".into();
            c
        };
        let programmed = if served_any || listener_count == 0 {
            Condition::yes("Programmed", "Programmed")
        } else {
            Condition::no("Programmed", "Invalid", "no listener is served".into())
        };
        vec![accepted, programmed]
    };
    if insecure {
        let mut c = Condition::yes("InsecureFrontendValidationMode", "ConfigurationChanged");
        c.message = "AllowInsecureFallback: clients without a valid certificate are served".into();
        status.conditions.push(c);
    }
    if gateway_ok && !is_wildcard(&address) {
        status.addresses.push(address);
    }
    status
}

fn unsupported_gateway(field: &str) -> Condition {
    Condition::no(
        "Accepted",
        "UnsupportedValue",
        format!("{field} is not supported by cutover's import"),
    )
}

fn is_wildcard(address: &str) -> bool {
    address
        .parse::<std::net::IpAddr>()
        .is_ok_and(|a| a.is_unspecified())
}

/// An address as a name part: `10.0.0.5` → `10-0-0-5`.
fn name_part(address: &str) -> String {
    address
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_owned()
}

/// Where the Gateway listens: `--gateway-address NS/NAME=ADDRESS`, then
/// its first `spec.addresses` IP, then `--address`.
fn address(
    gateway: &Resource,
    spec: &super::Fields<'_>,
    options: &Options,
) -> Result<String, Condition> {
    let mut from_spec = None;
    for a in spec.list("addresses") {
        let kind = a.str("type").unwrap_or("IPAddress");
        // An address without a value asks the implementation to choose.
        let Some(value) = a.str("value").filter(|v| !v.is_empty()) else {
            if kind == "IPAddress" {
                continue;
            }
            return Err(Condition::no(
                "Accepted",
                "UnsupportedAddress",
                format!(
                    "{}: address type {kind:?}: only IPAddress is served",
                    a.path()
                ),
            ));
        };
        if kind != "IPAddress" {
            return Err(Condition::no(
                "Accepted",
                "UnsupportedAddress",
                format!(
                    "{}: address type {kind:?}: only IPAddress is served",
                    a.path()
                ),
            ));
        }
        if value.parse::<std::net::IpAddr>().is_err() {
            return Err(Condition::no(
                "Accepted",
                "UnsupportedAddress",
                format!("{}: {value:?} is not an IP address", a.path()),
            ));
        }
        from_spec.get_or_insert_with(|| value.to_owned());
    }
    let named = format!("{}/{}", gateway.namespace, gateway.name);
    Ok(options
        .gateway_addresses
        .get(&named)
        .cloned()
        .or(from_spec)
        .unwrap_or_else(|| options.address.clone()))
}

/// `allowedRoutes`: the namespaces routes may come from and the kinds the
/// listener takes.
fn allowed_routes(
    l: &super::Fields<'_>,
    kind: Option<ListenerKind>,
    verdict: &mut Verdict,
) -> (AllowedFrom, Vec<&'static str>) {
    let default_kinds: Vec<&'static str> =
        kind.map(|k| k.route_kinds().to_vec()).unwrap_or_default();
    let Some(allowed) = l.object("allowedRoutes") else {
        return (AllowedFrom::Same, default_kinds);
    };
    let from = match allowed.object("namespaces") {
        Some(ns) => match ns.str("from").unwrap_or("Same") {
            "All" => AllowedFrom::All,
            "Selector" => {
                let labels = ns
                    .object("selector")
                    .map(|s| {
                        let labels = s
                            .get("matchLabels")
                            .and_then(Value::as_object)
                            .map(|m| {
                                m.iter()
                                    .map(|(k, v)| {
                                        (k.clone(), v.as_str().unwrap_or_default().to_owned())
                                    })
                                    .collect()
                            })
                            .unwrap_or_default();
                        for field in s.rest() {
                            verdict.refuse(status::unsupported_listener(&field));
                        }
                        labels
                    })
                    .unwrap_or_default();
                AllowedFrom::Selector(labels)
            }
            "None" => AllowedFrom::None,
            _ => AllowedFrom::Same,
        },
        None => AllowedFrom::Same,
    };
    let listed = allowed.list("kinds");
    let kinds = if listed.is_empty() {
        default_kinds
    } else {
        let mut valid = Vec::new();
        let mut invalid = Vec::new();
        for k in &listed {
            let name = k.str("kind").unwrap_or_default();
            let group = k.str("group").unwrap_or(GROUP);
            match default_kinds.iter().find(|d| **d == name) {
                Some(d) if group == GROUP => valid.push(*d),
                _ => invalid.push(format!("{group}/{name}")),
            }
        }
        if !invalid.is_empty() {
            verdict.refuse(Condition::no(
                "ResolvedRefs",
                "InvalidRouteKinds",
                format!(
                    "route kinds {} are not what this listener serves ({})",
                    invalid.join(", "),
                    default_kinds.join(", ")
                ),
            ));
            verdict.kinds_only = !valid.is_empty();
        }
        valid
    };
    for field in allowed.rest() {
        verdict.refuse(status::unsupported_listener(&field));
    }
    (from, kinds)
}

/// `spec.tls.frontend`: the client certificates HTTPS ports demand.
struct Frontend {
    default: Option<Result<ClientValidation, Vec<Condition>>>,
    per_port: BTreeMap<u16, Result<ClientValidation, Vec<Condition>>>,
    insecure: bool,
    unsupported: Vec<String>,
}

impl Frontend {
    fn read(
        resources: &[Resource],
        gateway: &Resource,
        spec: &super::Fields<'_>,
        base: Option<&Path>,
    ) -> Frontend {
        let mut out = Frontend {
            default: None,
            per_port: BTreeMap::new(),
            insecure: false,
            unsupported: Vec::new(),
        };
        let Some(tls) = spec.object("tls") else {
            return out;
        };
        if let Some(frontend) = tls.object("frontend") {
            if let Some(default) = frontend.object("default") {
                out.default = Some(out.validation(resources, gateway, &default, base, "default"));
                out.unsupported.extend(default.rest());
            }
            for p in frontend.list("perPort") {
                let port = p
                    .int("port")
                    .and_then(|n| u16::try_from(n).ok())
                    .unwrap_or(0);
                if let Some(t) = p.object("tls") {
                    let v = out.validation(resources, gateway, &t, base, &port.to_string());
                    out.per_port.insert(port, v);
                    out.unsupported.extend(t.rest());
                }
                out.unsupported.extend(p.rest());
            }
            out.unsupported.extend(frontend.rest());
        }
        // `tls.backend` (the gateway's client certificate towards
        // backends) is not read: the Gateway is then not served.
        out.unsupported.extend(tls.rest());
        out
    }

    fn validation(
        &mut self,
        resources: &[Resource],
        gateway: &Resource,
        t: &super::Fields<'_>,
        base: Option<&Path>,
        which: &str,
    ) -> Result<ClientValidation, Vec<Condition>> {
        let Some(validation) = t.object("validation") else {
            return Err(vec![Condition::no(
                "Accepted",
                "NoValidCACertificate",
                format!("{}: no validation", t.path()),
            )]);
        };
        let optional = match validation.str("mode").unwrap_or("AllowValidOnly") {
            "AllowValidOnly" => false,
            "AllowInsecureFallback" => {
                self.insecure = true;
                true
            }
            other => {
                return Err(vec![Condition::no(
                    "Accepted",
                    "UnsupportedValue",
                    format!("{}: mode {other:?}", validation.path()),
                )])
            }
        };
        let mut pem = String::new();
        let mut problems = Vec::new();
        for r in validation.list("caCertificateRefs") {
            let group = r.str("group").unwrap_or("");
            let kind = r.str("kind").unwrap_or("ConfigMap");
            let name = r.str("name").unwrap_or_default();
            let namespace = r.str("namespace").unwrap_or(&gateway.namespace);
            if !group.is_empty() || kind != "ConfigMap" {
                problems.push(Condition::no(
                    "ResolvedRefs",
                    "InvalidCACertificateKind",
                    format!(
                        "{}: {group}/{kind}: client CAs are read from ConfigMaps",
                        r.path()
                    ),
                ));
                continue;
            }
            if namespace != gateway.namespace
                && !granted(resources, gateway, "ConfigMap", namespace, name)
            {
                problems.push(Condition::no(
                    "ResolvedRefs",
                    "RefNotPermitted",
                    format!(
                        "no ReferenceGrant in namespace {namespace} lets Gateways of {} refer to ConfigMap {name}",
                        gateway.namespace
                    ),
                ));
                continue;
            }
            let found = resources
                .iter()
                .find(|c| {
                    c.kind == "ConfigMap"
                        && c.group().is_empty()
                        && c.namespace == namespace
                        && c.name == name
                })
                .and_then(|c| c.body.pointer("/data/ca.crt").and_then(Value::as_str))
                .filter(|p| super::secrets::is_certificate_pem(p));
            match found {
                Some(p) => {
                    pem.push_str(p.trim_end());
                    pem.push('\n');
                }
                None => problems.push(Condition::no(
                    "ResolvedRefs",
                    "InvalidCACertificateRef",
                    format!("ConfigMap {namespace}/{name} with a PEM `ca.crt` is not among the resources"),
                )),
            }
        }
        if !problems.is_empty() || pem.is_empty() {
            if problems.is_empty() {
                problems.push(Condition::no(
                    "ResolvedRefs",
                    "InvalidCACertificateRef",
                    format!("{}: no caCertificateRefs", validation.path()),
                ));
            }
            problems.push(Condition::no(
                "Accepted",
                "NoValidCACertificate",
                "no client CA could be read: the listener would serve clients without checking them".into(),
            ));
            return Err(problems);
        }
        let Some(base) = base else {
            return Err(vec![Condition::no(
                "ResolvedRefs",
                "InvalidCACertificateRef",
                "CA files are written beside the configuration: give -o FILE".into(),
            )]);
        };
        let file = format!(
            "client-ca-{}-{}-{which}.crt",
            gateway.namespace, gateway.name
        );
        if let Err(e) = secrets::write_file(base, &file, pem.as_bytes(), 0o644) {
            return Err(vec![Condition::no(
                "ResolvedRefs",
                "InvalidCACertificateRef",
                format!("cannot write {file}: {e}"),
            )]);
        }
        Ok(ClientValidation {
            ca: format!("{}/{file}", secrets::FOLDER),
            optional,
        })
    }

    /// The validation port `port`'s HTTPS listeners get (`None`: none).
    fn for_port(&self, port: u16) -> Option<&Result<ClientValidation, Vec<Condition>>> {
        self.per_port.get(&port).or(self.default.as_ref())
    }
}

/// Listener isolation: a request for a hostname one Gateway listener of
/// a port names belongs to that listener alone, even when a route of a
/// listener with a wider hostname (or none) on the same port matches it
/// (`GatewayHTTPListenerIsolation`). cutover picks the most specific host
/// group with a matching route, so a last route answering 404 for each
/// such hostname keeps its requests in its group.
pub(super) fn isolation(port: &Port, routes: &[super::routes::Route]) -> String {
    if !matches!(port.kind, ListenerKind::Http | ListenerKind::Https) {
        return String::new();
    }
    let mut out = String::new();
    for (i, host) in port.hostnames.iter().enumerate() {
        let Some(host) = host else { continue };
        let wider = port
            .hostnames
            .iter()
            .any(|other| other.as_ref() != Some(host) && covers(other.as_deref(), host));
        // A route of the listener that takes every request for the name
        // already keeps them there.
        let caught = routes.iter().any(|r| {
            r.listener == port.name
                && r.host.as_deref() == Some(host.as_str())
                && r.path == super::routes::Path::Any
                && r.methods.is_empty()
                && r.headers.is_empty()
                && r.query.is_empty()
        });
        if !wider || caught {
            continue;
        }
        out.push_str(&format!(
            "[[routes]]\nname = {}\nlisteners = [{}]\nhosts = [{}]\nrespond = {{ status = 404 }}\n\n",
            super::toml_str(&format!("gateway-api-isolation-{}-{i}", port.name)),
            super::toml_str(&port.name),
            super::toml_str(host)
        ));
    }
    out
}

/// Whether a listener with hostname `wider` (`None`: any) also matches
/// every name `host` matches.
fn covers(wider: Option<&str>, host: &str) -> bool {
    match wider {
        None => true,
        Some(w) => match w.strip_prefix('*') {
            // `*.example.com` covers `a.example.com` and `*.a.example.com`.
            Some(suffix) => {
                host.trim_start_matches('*').ends_with(suffix) && host.len() > w.len() - 1
            }
            None => false,
        },
    }
}

/// Whether every name `host` matches belongs to another listener of the
/// same port whose hostname is narrower than listener `i`'s.
pub(super) fn owned_elsewhere(listeners: &[Listener], i: usize, host: &str) -> bool {
    let Some(me) = listeners.get(i) else {
        return false;
    };
    listeners.iter().enumerate().any(|(j, other)| {
        let Some(theirs) = other.hostname.as_deref() else {
            return false;
        };
        j != i
            && other.cutover == me.cutover
            && other.hostname != me.hostname
            && covers(me.hostname.as_deref(), theirs)
            && (theirs == host || covers(Some(theirs), host))
    })
}

//! What the import works on: the Gateways' listeners and ports as
//! cutover serves them, the context every route import reads, and the
//! routes and upstreams built so far. Types only: the files that read
//! Gateways and routes fill them.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::frontend::ClientValidation;
use super::routes::{Route, Upstream};
use super::status;
use super::{Options, Resource};

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
    pub fn of(protocol: &str, tls_mode: Option<&str>) -> Result<Self, String> {
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
    pub fn route_kinds(self) -> &'static [&'static str] {
        match self {
            ListenerKind::Http | ListenerKind::Https => &["HTTPRoute", "GRPCRoute"],
            ListenerKind::Tcp => &["TCPRoute"],
            ListenerKind::Passthrough => &["TLSRoute"],
            ListenerKind::Udp => &["UDPRoute"],
        }
    }

    /// The cutover listener's name prefix.
    pub fn prefix(self) -> &'static str {
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
    /// The ListenerSet it comes from (index into `Gateways::sets`), or
    /// `None` for the Gateway's own.
    pub set: Option<usize>,
    /// Its owner's namespace (`allowedRoutes` `from: Same`).
    pub namespace: String,
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
    /// Every ListenerSet of the input, in the API's order.
    pub sets: Vec<&'a Resource>,
    pub listeners: Vec<Listener>,
    pub ports: Vec<Port>,
    pub statuses: Vec<status::GatewayStatus>,
    pub set_statuses: Vec<status::ListenerSetStatus>,
    /// Per Gateway: the client certificate it shows backends
    /// (`spec.tls.backend`), `(cert, key)` files.
    pub backend_clients: Vec<Option<(String, String)>>,
}

pub(super) struct Context<'a> {
    pub resources: &'a [Resource],
    pub gateways: &'a [&'a Resource],
    pub sets: &'a [&'a Resource],
    pub listeners: &'a [Listener],
    pub namespaces: &'a BTreeMap<&'a str, &'a Map<String, Value>>,
    /// Per Gateway: the client certificate it shows backends.
    pub backend_clients: &'a [Option<(String, String)>],
    pub options: &'a Options,
}

/// Cutover routes and upstreams made so far, in the API's precedence.
#[derive(Debug, Default)]
pub(super) struct Built {
    pub routes: Vec<Route>,
    pub upstreams: BTreeMap<String, Upstream>,
    /// Some upstream sends a share of its requests to the 500 listener.
    pub answers_500: bool,
}

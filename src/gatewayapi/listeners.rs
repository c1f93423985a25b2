//! One listener of a Gateway or of a ListenerSet, read where its Gateway
//! listens (a [`Site`]): its protocol, certificates and client CA, the
//! routes it allows, its conflicts with the listeners read before it on
//! the same port, and whether it is served.

use std::collections::BTreeMap;

use serde_json::Value;

use super::frontend::Frontend;
use super::model::{AllowedFrom, Gateways, Listener, ListenerKind, Port};
use super::status::{self, Condition};
use super::{secrets, Fields, Options, Resource, GROUP};

/// Where one Gateway's listeners (its own, then its ListenerSets', in
/// the API's precedence) are read.
pub(super) struct Site<'r> {
    pub resources: &'r [Resource],
    pub gateway: &'r Resource,
    pub gi: usize,
    pub options: &'r Options,
    pub address: String,
    /// The Gateway itself is accepted: its listeners may be served.
    pub gateway_ok: bool,
    pub frontend: Frontend,
    /// The listeners read so far, by port: the first sets its protocol.
    on_port: BTreeMap<(u16, bool), OnPort>,
}

/// A port's protocol (set by its first listener) and the hostnames of
/// its listeners so far.
type OnPort = (ListenerKind, Vec<Option<String>>);

/// What reading one listener gave.
pub(super) struct Read {
    pub status: status::ListenerStatus,
    pub accepted: bool,
    pub served: bool,
}

impl<'r> Site<'r> {
    pub fn new(
        resources: &'r [Resource],
        gateway: &'r Resource,
        gi: usize,
        options: &'r Options,
        address: String,
        gateway_ok: bool,
        frontend: Frontend,
    ) -> Self {
        Site {
            resources,
            gateway,
            gi,
            options,
            address,
            gateway_ok,
            frontend,
            on_port: BTreeMap::new(),
        }
    }

    /// Reads listener `l` of `owner` (the Gateway, or ListenerSet `set`).
    pub fn listener(
        &mut self,
        l: &Fields<'_>,
        owner: &Resource,
        set: Option<usize>,
        held: &mut BTreeMap<(String, bool), usize>,
        out: &mut Gateways<'_>,
    ) -> Read {
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
                // A ListenerSet's certificates are its own references
                // (grants to the Gateway are not inherited).
                match secrets::listener_certificates(
                    self.resources,
                    owner,
                    tls.as_ref(),
                    self.options.base_dir.as_deref(),
                ) {
                    Ok(c) => certificates = c,
                    Err(c) => verdict.refuse(c),
                }
                match self.frontend.for_port(port) {
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
        let (from, kinds) = allowed_routes(l, kind.as_ref().ok().copied(), &mut verdict);
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
        let bind = super::join_host_port(&self.address, port);
        if let (Ok(kind), true) = (&kind, port != 0) {
            let kind = *kind;
            self.conflicts(kind, port, &hostname, &mut verdict);
            if let Some(&other) = held.get(&(bind.clone(), kind.is_udp())) {
                if other != self.gi {
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
                            self.gateway.namespace, self.gateway.name
                        ),
                    ));
                }
            }
        }
        let accepted = verdict.accepted.is_empty();
        let refs_ok = verdict.refs.is_empty() || verdict.kinds_only;
        let served = accepted && refs_ok && self.gateway_ok;
        if let (true, Ok(kind)) = (accepted, kind) {
            let cutover = if self.address == self.options.address {
                format!("{}-{port}", kind.prefix())
            } else {
                format!("{}-{}-{port}", kind.prefix(), name_part(&self.address))
            };
            if served {
                held.insert((bind.clone(), kind.is_udp()), self.gi);
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
                gateway: self.gi,
                set,
                namespace: owner.namespace.clone(),
                name: name.clone(),
                hostname,
                port,
                from,
                cutover,
                kinds: kinds.clone(),
                served,
            });
        }
        Read {
            status: status::ListenerStatus {
                name,
                attached: 0,
                supported_kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
                conditions: verdict.conditions(served),
            },
            accepted,
            served,
        }
    }

    /// A listener against those read before it on its port: another
    /// protocol is a `ProtocolConflict`, the same hostname (or two
    /// TCP/UDP listeners) a `HostnameConflict`.
    fn conflicts(
        &mut self,
        kind: ListenerKind,
        port: u16,
        hostname: &Option<String>,
        verdict: &mut Verdict,
    ) {
        match self.on_port.get_mut(&(port, kind.is_udp())) {
            Some((first, _)) if *first != kind => {
                let why = format!(
                    "port {port} is already this Gateway's {} listener",
                    first.prefix()
                );
                verdict.conflicted = Some(Condition::yes("Conflicted", "ProtocolConflict"));
                verdict.refuse(Condition::no("Accepted", "ProtocolConflict", why));
            }
            Some((_, hostnames))
                if hostnames.contains(hostname)
                    || matches!(kind, ListenerKind::Tcp | ListenerKind::Udp) =>
            {
                let why = match hostname {
                    Some(h) => format!("another listener on port {port} already serves {h}"),
                    None => {
                        format!("another listener on port {port} already serves every hostname")
                    }
                };
                verdict.conflicted = Some(Condition::yes("Conflicted", "HostnameConflict"));
                verdict.refuse(Condition::no("Accepted", "HostnameConflict", why));
            }
            Some((_, hostnames)) => hostnames.push(hostname.clone()),
            None => {
                self.on_port
                    .insert((port, kind.is_udp()), (kind, vec![hostname.clone()]));
            }
        }
    }
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

/// A listener being read: its conditions by type.
#[derive(Default)]
pub(super) struct Verdict {
    pub accepted: Vec<Condition>,
    pub refs: Vec<Condition>,
    pub conflicted: Option<Condition>,
    /// The only unresolved references are route kinds, and some kinds
    /// are valid: served for those.
    pub kinds_only: bool,
}

impl Verdict {
    pub(super) fn refuse(&mut self, c: Condition) {
        match c.kind {
            "ResolvedRefs" => self.refs.push(c),
            _ => self.accepted.push(c),
        }
    }

    pub(super) fn conditions(&self, served: bool) -> Vec<Condition> {
        let mut out = vec![
            merged("Accepted", "Accepted", &self.accepted),
            merged("ResolvedRefs", "ResolvedRefs", &self.refs),
            if served {
                Condition::yes("Programmed", "Programmed")
            } else {
                // Not served: for the reason it was not accepted (a
                // conflict, a port), or as `Invalid`.
                let reason = self
                    .accepted
                    .first()
                    .map_or("Invalid", |c| c.reason.as_str());
                Condition::no(
                    "Programmed",
                    reason,
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
pub(super) fn merged(kind: &'static str, reason: &str, problems: &[Condition]) -> Condition {
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

/// `allowedRoutes`: the namespaces routes may come from and the kinds the
/// listener takes.
pub(super) fn allowed_routes(
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

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

use serde_json::Value;

use super::frontend::Frontend;
use super::listeners::{merged, Site};
use super::model::Gateways;
use super::status::{self, Condition};
use super::{Options, Resource, GROUP};

/// The Gateways of the class, each with its address, its listeners and
/// those of the ListenerSets it allows.
pub(super) fn read<'a>(resources: &'a [Resource], options: &Options) -> Gateways<'a> {
    let in_order = |mut list: Vec<&'a Resource>| {
        // The API's order: the oldest first, then namespace/name (a port
        // two Gateways ask for goes to the first).
        list.sort_by(|a, b| {
            (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name))
        });
        list
    };
    let gateways = in_order(
        resources
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
            .collect(),
    );
    let sets = in_order(
        resources
            .iter()
            .filter(|r| r.kind == "ListenerSet" && r.group() == GROUP)
            .collect(),
    );
    let mut out = Gateways {
        gateways: Vec::new(),
        sets: sets.clone(),
        listeners: Vec::new(),
        ports: Vec::new(),
        statuses: Vec::new(),
        set_statuses: vec![status::ListenerSetStatus::default(); sets.len()],
        backend_clients: Vec::new(),
    };
    // (bind, udp) → the index of the Gateway holding it.
    let mut held: BTreeMap<(String, bool), usize> = BTreeMap::new();
    let mut parented = vec![false; sets.len()];
    for (gi, gateway) in gateways.iter().enumerate() {
        let status = read_gateway(
            resources,
            gateway,
            gi,
            options,
            &sets,
            &mut parented,
            &mut held,
            &mut out,
        );
        out.statuses.push(status);
    }
    // A ListenerSet whose parent is not a Gateway of the class.
    for (si, set) in sets.iter().enumerate().filter(|(si, _)| !parented[*si]) {
        out.set_statuses[si] = super::listener_sets::orphan(set);
    }
    out.gateways = gateways;
    out
}

#[allow(clippy::too_many_arguments)]
fn read_gateway<'a>(
    resources: &'a [Resource],
    gateway: &'a Resource,
    gi: usize,
    options: &'a Options,
    sets: &[&'a Resource],
    parented: &mut [bool],
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
    let backend_client =
        super::secrets::backend_client(resources, gateway, &spec, options.base_dir.as_deref());
    let allowed_sets = super::listener_sets::Allowed::read(&spec);
    let gateway_ok = gateway_problems.is_empty();

    let mut site = Site::new(
        resources,
        gateway,
        gi,
        options,
        address.clone(),
        gateway_ok,
        frontend,
    );
    let mut accepted_count = 0;
    let mut listener_count = 0;
    for l in spec.list("listeners") {
        listener_count += 1;
        let read = site.listener(&l, gateway, None, held, out);
        accepted_count += usize::from(read.accepted);
        status.listeners.push(read.status);
    }
    // Its ListenerSets, after its own listeners, in the API's order.
    let mut attached_sets = 0;
    for (si, set) in sets.iter().enumerate() {
        if !super::listener_sets::names_parent(set, gateway) {
            continue;
        }
        parented[si] = true;
        let set_status = super::listener_sets::read(&mut site, set, si, &allowed_sets, held, out);
        attached_sets += usize::from(set_status.attached);
        out.set_statuses[si] = set_status;
    }
    if allowed_sets.is_some() || attached_sets > 0 {
        status.attached_listener_sets = Some(attached_sets);
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
    // What the Gateway refers to besides listeners: the client
    // certificate it shows backends.
    status.conditions.push(match &backend_client {
        Some(Err(c)) => c.clone(),
        _ => Condition::yes("ResolvedRefs", "ResolvedRefs"),
    });
    out.backend_clients
        .push(backend_client.and_then(Result::ok));
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

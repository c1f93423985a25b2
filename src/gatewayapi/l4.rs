//! TCPRoute, TLSRoute (passthrough, by SNI) and UDPRoute: a cutover
//! `tcp` or `udp` listener relaying to the route's backends.

use std::collections::BTreeMap;

use super::filters::backends;
use super::http::{attach, Attachment};
use super::model::{Built, Context};
use super::routes::{part, Action, Upstream};
use super::status::{unsupported, Condition, ParentStatus, RouteStatus};
use super::{toml_str, Resource};

/// What one cutover L4 listener relays to.
#[derive(Debug, Default)]
pub(super) struct Served {
    /// Every connection (TCP, UDP), or those whose SNI no `sni` entry
    /// names (TLS passthrough).
    default: Option<String>,
    /// `(hosts, upstream)` by SNI, oldest route first.
    sni: Vec<(Vec<String>, String)>,
}

impl Served {
    pub fn upstreams(&self) -> impl Iterator<Item = &str> {
        self.default
            .iter()
            .map(String::as_str)
            .chain(self.sni.iter().map(|(_, u)| u.as_str()))
    }

    pub fn toml(&self, name: &str, bind: &str, udp: bool) -> String {
        let mut out = format!(
            "[[listeners]]\nname = {}\nbind = {bind}\nprotocol = {}\n",
            toml_str(name),
            if udp { "\"udp\"" } else { "\"tcp\"" }
        );
        if self.sni.is_empty() {
            if let Some(upstream) = &self.default {
                out.push_str(&format!("upstream = {}\n", toml_str(upstream)));
            }
            return out;
        }
        let entries: Vec<String> = self
            .sni
            .iter()
            .map(|(hosts, upstream)| {
                format!(
                    "{{ hosts = [{}], upstream = {} }}",
                    hosts
                        .iter()
                        .map(|h| toml_str(h))
                        .collect::<Vec<_>>()
                        .join(", "),
                    toml_str(upstream)
                )
            })
            .collect();
        out.push_str(&format!("sni_routes = [{}]\n", entries.join(", ")));
        if let Some(upstream) = &self.default {
            out.push_str(&format!("default_upstream = {}\n", toml_str(upstream)));
        }
        out
    }
}

/// Imports one TCPRoute, TLSRoute or UDPRoute.
pub(super) fn import_route(
    ctx: &Context<'_>,
    route: &Resource,
    served: &mut BTreeMap<String, Served>,
    upstreams: &mut BTreeMap<String, Upstream>,
) -> (RouteStatus, BTreeMap<usize, usize>) {
    let mut status = RouteStatus::new(route);
    let spec = route.spec();
    let hostnames: Vec<String> = if route.kind == "TLSRoute" {
        spec.strings("hostnames")
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect()
    } else {
        Vec::new()
    };
    let Attachment {
        serve,
        parents,
        counts,
    } = attach(ctx, route, &spec, &hostnames);

    let mut problems = Vec::new();
    let mut resolved = Vec::new();
    let name = format!("{}_{}", part(&route.namespace), part(&route.name));
    let rules = spec.list("rules");
    if rules.len() > 1 {
        problems.push(Condition::no(
            "Accepted",
            "UnsupportedValue",
            format!(
                "spec.rules: {} rules; cutover relays a {} to one set of backends",
                rules.len(),
                route.kind
            ),
        ));
    }
    let mut upstream = None;
    if let Some(rule) = rules.first() {
        rule.ignore(&["name"]);
        let mut made = Built::default();
        if let Action::Upstream(u) =
            backends(ctx, route, rule, &name, &mut made, &mut resolved, false)
        {
            upstream = Some(u);
            // Passthrough relays the client's TLS; a BackendTLSPolicy
            // cannot apply to bytes the gateway does not read.
            for u in made.upstreams.values_mut() {
                u.tls = None;
            }
            upstreams.append(&mut made.upstreams);
        }
        for field in rule.rest() {
            problems.push(unsupported(&field));
        }
    }
    for field in spec.rest() {
        problems.push(unsupported(&field));
    }
    let accepted = problems.is_empty() && upstream.is_some();
    // A TCP or UDP listener relays to one route: the oldest keeps it.
    let mut taken = Vec::new();
    if accepted {
        for (listener, hosts) in &serve {
            let entry = served.entry(listener.clone()).or_default();
            let any = hosts.iter().any(Option::is_none);
            let named: Vec<String> = hosts.iter().flatten().cloned().collect();
            if any {
                match entry.default {
                    Some(_) => taken.push(listener.clone()),
                    None => entry.default = upstream.clone(),
                }
            }
            if !named.is_empty() {
                if let Some(u) = &upstream {
                    entry.sni.push((named, u.clone()));
                }
            }
        }
    }
    if upstream.is_none() && resolved.is_empty() {
        resolved.push(Condition::no(
            "ResolvedRefs",
            "BackendNotFound",
            "no backend to relay to: connections are refused".into(),
        ));
    }
    for (parent_ref, mut conditions) in parents {
        if conditions.iter().all(|c| c.status) {
            match (problems.first(), taken.is_empty()) {
                (Some(problem), _) => conditions.push(problem.clone()),
                (None, false) => conditions.push(Condition::no(
                    "Accepted",
                    "UnsupportedValue",
                    format!(
                        "an older {} already takes every connection of listener {}",
                        route.kind,
                        taken.join(", ")
                    ),
                )),
                (None, true) => conditions.push(Condition::yes("Accepted", "Accepted")),
            }
        }
        conditions.push(match resolved.iter().find(|c| !c.status) {
            Some(c) => c.clone(),
            None => Condition::yes("ResolvedRefs", "ResolvedRefs"),
        });
        status.parents.push(ParentStatus {
            parent_ref,
            conditions,
        });
    }
    (status, counts)
}

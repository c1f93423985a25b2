//! The Gateway API's status conditions, as a controller would write
//! them, printed as YAML.

use serde_json::{json, Value};
use yaml_rust2::{Yaml, YamlEmitter};

use super::{Resource, CONTROLLER, GROUP};

/// One condition: `type`, `status` (True/False), `reason`, `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub kind: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Condition {
    pub fn yes(kind: &'static str, reason: &str) -> Self {
        Condition {
            kind,
            status: true,
            reason: reason.to_owned(),
            message: String::new(),
        }
    }

    pub fn no(kind: &'static str, reason: &str, message: String) -> Self {
        Condition {
            kind,
            status: false,
            reason: reason.to_owned(),
            message,
        }
    }

    /// As the API writes it, for generation `observed` of its resource.
    fn json(&self, observed: i64) -> Value {
        json!({
            "type": self.kind,
            "status": if self.status { "True" } else { "False" },
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": observed,
        })
    }
}

/// One BackendTLSPolicy's status.
#[derive(Debug, Clone)]
pub struct PolicyStatus {
    pub namespace: String,
    pub name: String,
    pub generation: i64,
    pub conditions: Vec<Condition>,
}

/// A route's field the import does not read: the route is not
/// accepted (fail closed).
pub(super) fn unsupported(field: &str) -> Condition {
    Condition::no(
        "Accepted",
        "UnsupportedValue",
        format!("{field} is not supported by cutover's import"),
    )
}

/// A field of a listener the import does not read.
pub fn unsupported_listener(field: &str) -> Condition {
    Condition::no(
        "Accepted",
        "UnsupportedValue",
        format!("{field} is not supported by cutover's import"),
    )
}

/// A route's status under one parent.
#[derive(Debug, Clone)]
pub struct ParentStatus {
    pub parent_ref: Value,
    pub conditions: Vec<Condition>,
}

impl ParentStatus {
    /// The condition of `kind`, if set.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

#[derive(Debug, Clone)]
pub struct RouteStatus {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The route's `metadata.generation` the status describes.
    pub generation: i64,
    pub parents: Vec<ParentStatus>,
}

impl RouteStatus {
    pub fn new(route: &Resource) -> Self {
        RouteStatus {
            kind: route.kind.clone(),
            namespace: route.namespace.clone(),
            name: route.name.clone(),
            generation: generation_of(route),
            parents: Vec::new(),
        }
    }

    /// The status under the parent named `name` (first one).
    pub fn parent(&self, name: &str) -> Option<&ParentStatus> {
        self.parents
            .iter()
            .find(|p| p.parent_ref.get("name").and_then(Value::as_str) == Some(name))
    }
}

#[derive(Debug, Clone)]
pub struct ListenerStatus {
    pub name: String,
    pub attached: usize,
    /// The route kinds it takes (all of the API's group).
    pub supported_kinds: Vec<String>,
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone)]
pub struct GatewayStatus {
    pub namespace: String,
    pub name: String,
    /// The Gateway's `metadata.generation` the status describes.
    pub generation: i64,
    pub listeners: Vec<ListenerStatus>,
    /// `Accepted`, `Programmed`, `ResolvedRefs` (and
    /// `InsecureFrontendValidationMode`).
    pub conditions: Vec<Condition>,
    /// `attachedListenerSets`, when the Gateway takes ListenerSets.
    pub attached_listener_sets: Option<usize>,
    /// The address it listens on (none when that is every address).
    pub addresses: Vec<String>,
}

impl GatewayStatus {
    pub fn new(gateway: &Resource) -> Self {
        GatewayStatus {
            namespace: gateway.namespace.clone(),
            name: gateway.name.clone(),
            generation: generation_of(gateway),
            listeners: Vec::new(),
            conditions: Vec::new(),
            attached_listener_sets: None,
            addresses: Vec::new(),
        }
    }
}

/// A ListenerSet's status: its conditions and its listeners'.
#[derive(Debug, Clone, Default)]
pub struct ListenerSetStatus {
    pub namespace: String,
    pub name: String,
    pub generation: i64,
    pub conditions: Vec<Condition>,
    pub listeners: Vec<ListenerStatus>,
    /// Accepted by its parent (counted in its `attachedListenerSets`).
    pub attached: bool,
}

impl ListenerSetStatus {
    pub fn new(set: &Resource) -> Self {
        ListenerSetStatus {
            namespace: set.namespace.clone(),
            name: set.name.clone(),
            generation: generation_of(set),
            ..Self::default()
        }
    }
}

fn listeners_json(listeners: &[ListenerStatus], generation: i64) -> Vec<Value> {
    listeners
        .iter()
        .map(|l| {
            json!({
                "name": l.name,
                "attachedRoutes": l.attached,
                "supportedKinds": l.supported_kinds.iter().map(|k| json!({ "group": GROUP, "kind": k })).collect::<Vec<_>>(),
                "conditions": l.conditions.iter().map(|c| c.json(generation)).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// Every status as a YAML document.
pub fn yaml(
    gateways: &[GatewayStatus],
    sets: &[ListenerSetStatus],
    routes: &[RouteStatus],
    policies: &[PolicyStatus],
) -> String {
    let mut documents = Vec::new();
    for g in gateways {
        let mut status = json!({
            "conditions": g.conditions.iter().map(|c| c.json(g.generation)).collect::<Vec<_>>(),
            "listeners": listeners_json(&g.listeners, g.generation),
        });
        if let Some(n) = g.attached_listener_sets {
            status["attachedListenerSets"] = json!(n);
        }
        if !g.addresses.is_empty() {
            status["addresses"] = g
                .addresses
                .iter()
                .map(|a| json!({ "type": "IPAddress", "value": a }))
                .collect();
        }
        documents.push(json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "Gateway",
            "metadata": { "namespace": g.namespace, "name": g.name },
            "status": status,
        }));
    }
    for set in sets {
        documents.push(json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "ListenerSet",
            "metadata": { "namespace": set.namespace, "name": set.name },
            "status": {
                "conditions": set.conditions.iter().map(|c| c.json(set.generation)).collect::<Vec<_>>(),
                "listeners": listeners_json(&set.listeners, set.generation),
            },
        }));
    }
    for r in routes {
        documents.push(json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": r.kind,
            "metadata": { "namespace": r.namespace, "name": r.name },
            "status": {
                "parents": r.parents.iter().map(|p| json!({
                    "parentRef": p.parent_ref,
                    "controllerName": CONTROLLER,
                    "conditions": p.conditions.iter().map(|c| c.json(r.generation)).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            },
        }));
    }
    for p in policies {
        documents.push(json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "BackendTLSPolicy",
            "metadata": { "namespace": p.namespace, "name": p.name },
            "status": {
                "ancestors": [{
                    "controllerName": CONTROLLER,
                    "conditions": p.conditions.iter().map(|c| c.json(p.generation)).collect::<Vec<_>>(),
                }],
            },
        }));
    }
    let mut out = String::new();
    for document in documents {
        let mut text = String::new();
        let mut emitter = YamlEmitter::new(&mut text);
        if emitter.dump(&to_yaml(&document)).is_ok() {
            out.push_str(&text);
            out.push('\n');
        }
    }
    out
}

fn to_yaml(value: &Value) -> Yaml {
    match value {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(*b),
        Value::Number(n) => n
            .as_i64()
            .map_or_else(|| Yaml::Real(n.to_string()), Yaml::Integer),
        Value::String(s) => Yaml::String(s.clone()),
        Value::Array(items) => Yaml::Array(items.iter().map(to_yaml).collect()),
        Value::Object(map) => Yaml::Hash(
            map.iter()
                .map(|(k, v)| (Yaml::String(k.clone()), to_yaml(v)))
                .collect(),
        ),
    }
}

/// A resource's `metadata.generation` (1, the API server's first, when
/// the input does not say).
pub(super) fn generation_of(resource: &Resource) -> i64 {
    resource
        .body
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

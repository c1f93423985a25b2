//! ListenerSets (the API's `ListenerSet`, GEP-1713): listeners kept in
//! resources of their own and merged into the parent Gateway that allows
//! them (`spec.allowedListeners`), after the Gateway's own listeners and
//! in the API's order (oldest first, then namespace/name). Each set's
//! listeners are served on the Gateway's address; routes attach to them
//! through a `ListenerSet` parentRef, never through the Gateway's.

use std::collections::BTreeMap;

use serde_json::Value;

use super::listeners::Site;
use super::model::Gateways;
use super::status::{self, Condition};
use super::{Fields, Resource, GROUP};

/// A Gateway's `allowedListeners.namespaces`; `None` (the default) when
/// it allows no ListenerSet.
pub(super) enum Allowed {
    Same,
    All,
    Selector(BTreeMap<String, String>),
}

impl Allowed {
    pub fn read(spec: &Fields<'_>) -> Option<Allowed> {
        let allowed = spec.object("allowedListeners")?;
        let namespaces = allowed.object("namespaces")?;
        match namespaces.str("from").unwrap_or("None") {
            "Same" => Some(Allowed::Same),
            "All" => Some(Allowed::All),
            "Selector" => Some(Allowed::Selector(
                namespaces
                    .object("selector")
                    .and_then(|s| s.get("matchLabels").and_then(Value::as_object).cloned())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_owned()))
                    .collect(),
            )),
            _ => None,
        }
    }

    fn admits(&self, resources: &[Resource], gateway: &Resource, set: &Resource) -> bool {
        match self {
            Allowed::Same => set.namespace == gateway.namespace,
            Allowed::All => true,
            Allowed::Selector(labels) => labels.iter().all(|(k, v)| {
                // Every Namespace carries its name as this label.
                if k == "kubernetes.io/metadata.name" {
                    return *v == set.namespace;
                }
                resources
                    .iter()
                    .find(|n| n.kind == "Namespace" && n.name == set.namespace)
                    .and_then(|n| n.labels.get(k))
                    .and_then(Value::as_str)
                    == Some(v.as_str())
            }),
        }
    }
}

/// Whether `set`'s `parentRef` names `gateway`.
pub(super) fn names_parent(set: &Resource, gateway: &Resource) -> bool {
    let parent = set.body.pointer("/spec/parentRef");
    let field = |k: &str| parent.and_then(|p| p.get(k)).and_then(Value::as_str);
    field("group").unwrap_or(GROUP) == GROUP
        && field("kind").unwrap_or("Gateway") == "Gateway"
        && field("name") == Some(gateway.name.as_str())
        && field("namespace").unwrap_or(&set.namespace) == gateway.namespace
}

/// Reads ListenerSet `si` where its parent Gateway listens.
pub(super) fn read(
    site: &mut Site<'_>,
    set: &Resource,
    si: usize,
    allowed: &Option<Allowed>,
    held: &mut BTreeMap<(String, bool), usize>,
    out: &mut Gateways<'_>,
) -> status::ListenerSetStatus {
    let mut status = status::ListenerSetStatus::new(set);
    let refused = |reason: &str, message: String| {
        vec![
            Condition::no("Accepted", reason, message.clone()),
            Condition::no("Programmed", reason, message),
        ]
    };
    let gateway = format!("{}/{}", site.gateway.namespace, site.gateway.name);
    if !allowed
        .as_ref()
        .is_some_and(|a| a.admits(site.resources, site.gateway, set))
    {
        status.conditions = refused(
            "NotAllowed",
            format!(
                "Gateway {gateway}'s allowedListeners does not take ListenerSets from namespace {}",
                set.namespace
            ),
        );
        return status;
    }
    if !site.gateway_ok {
        status.conditions = refused(
            "ParentNotAccepted",
            format!("Gateway {gateway} is not accepted"),
        );
        return status;
    }
    let spec = set.spec();
    spec.ignore(&["parentRef"]);
    // A set is valid by the listeners it can serve (accepted, with their
    // references resolved).
    let (mut served, mut count) = (0usize, 0usize);
    for l in spec.list("listeners") {
        count += 1;
        let read = site.listener(&l, set, Some(si), held, out);
        served += usize::from(read.served);
        status.listeners.push(read.status);
    }
    let unsupported: Vec<String> = spec.rest();
    status.conditions = if let Some(field) = unsupported.first() {
        refused(
            "Invalid",
            format!("{field} is not supported by cutover's import"),
        )
    } else if served == 0 {
        refused(
            "ListenersNotValid",
            "no listener is valid: see the listeners' conditions".into(),
        )
    } else {
        let mut ok = if served == count {
            Condition::yes("Accepted", "Accepted")
        } else {
            let mut c = Condition::yes("Accepted", "ListenersNotValid");
            c.message = "some listeners are not valid: see their conditions".into();
            c
        };
        if ok.message.is_empty() {
            ok.message = format!("merged into Gateway {gateway}");
        }
        vec![
            ok,
            if served > 0 {
                Condition::yes("Programmed", "Programmed")
            } else {
                Condition::no("Programmed", "Invalid", "no listener is served".into())
            },
        ]
    };
    status.attached = status
        .conditions
        .iter()
        .any(|c| c.kind == "Accepted" && c.status);
    status
}

/// A ListenerSet whose parentRef names no Gateway of the imported class.
pub(super) fn orphan(set: &Resource) -> status::ListenerSetStatus {
    let mut status = status::ListenerSetStatus::new(set);
    let message = "its parentRef names no Gateway of the imported class".to_owned();
    status.conditions = vec![
        Condition::no("Accepted", "ParentNotAccepted", message.clone()),
        Condition::no("Programmed", "ParentNotAccepted", message),
    ];
    status
}

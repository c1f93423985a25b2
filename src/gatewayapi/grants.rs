//! ReferenceGrants: whether an object may refer to one in another
//! namespace.

use super::{Resource, GROUP};

/// Whether a ReferenceGrant in `namespace` lets `from` (a route, a
/// Gateway) refer to the core `to_kind` object `name` there.
pub(super) fn granted(
    resources: &[Resource],
    from: &Resource,
    to_kind: &str,
    namespace: &str,
    name: &str,
) -> bool {
    resources
        .iter()
        .filter(|r| r.kind == "ReferenceGrant" && r.group() == GROUP && r.namespace == namespace)
        .any(|grant| {
            let spec = &grant.body["spec"];
            let allowed_from = spec["from"].as_array().into_iter().flatten().any(|f| {
                f["group"].as_str() == Some(GROUP)
                    && f["kind"].as_str() == Some(&from.kind)
                    && f["namespace"].as_str() == Some(&from.namespace)
            });
            let to = spec["to"].as_array().into_iter().flatten().any(|t| {
                t["group"].as_str().unwrap_or("").is_empty()
                    && t["kind"].as_str() == Some(to_kind)
                    && t["name"].as_str().is_none_or(|n| n == name)
            });
            allowed_from && to
        })
}

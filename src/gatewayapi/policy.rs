//! BackendTLSPolicy: TLS from the gateway to the Services a policy
//! targets, verified against a CA from a ConfigMap (or the system's
//! roots) for the policy's hostname.

use serde_json::Value;

use super::secrets;
use super::status::Condition;
use super::{Resource, GROUP};

/// How the gateway talks to a Service's members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BackendTls {
    /// The CA file (relative to the configuration); `None`: the system's
    /// (WebPKI) roots.
    pub ca: Option<String>,
    /// SNI and the name the certificate must carry.
    pub server_name: String,
}

/// The policies among `resources`, oldest first.
fn policies(resources: &[Resource]) -> Vec<&Resource> {
    let mut out: Vec<&Resource> = resources
        .iter()
        .filter(|r| r.kind == "BackendTLSPolicy" && r.group() == GROUP)
        .collect();
    out.sort_by(|a, b| {
        (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name))
    });
    out
}

fn targets(policy: &Resource, namespace: &str, service: &str) -> bool {
    policy.namespace == namespace
        && policy
            .body
            .pointer("/spec/targetRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|t| {
                t["group"].as_str().unwrap_or("").is_empty()
                    && t["kind"].as_str() == Some("Service")
                    && t["name"].as_str() == Some(service)
            })
}

/// The TLS the oldest policy targeting Service `namespace/service` asks
/// for (`None`: no policy, plain connections), or why it cannot be
/// honoured.
pub(super) fn backend_tls(
    resources: &[Resource],
    namespace: &str,
    service: &str,
    base: Option<&std::path::Path>,
) -> Result<Option<BackendTls>, Condition> {
    let Some(policy) = policies(resources)
        .into_iter()
        .find(|p| targets(p, namespace, service))
    else {
        return Ok(None);
    };
    read(resources, policy, base).map(Some)
}

/// A policy's TLS, or the condition it fails.
pub(super) fn read(
    resources: &[Resource],
    policy: &Resource,
    base: Option<&std::path::Path>,
) -> Result<BackendTls, Condition> {
    let spec = policy.spec();
    spec.ignore(&["targetRefs"]);
    let invalid = |reason: &str, why: String| Condition::no("ResolvedRefs", reason, why);
    let Some(validation) = spec.object("validation") else {
        return Err(invalid(
            "NoValidCACertificate",
            format!("{}: no spec.validation", policy.id()),
        ));
    };
    let Some(hostname) = validation.str("hostname") else {
        return Err(invalid(
            "NoValidCACertificate",
            format!("{}: no validation.hostname", policy.id()),
        ));
    };
    let refs = validation.list("caCertificateRefs");
    let system = validation.str("wellKnownCACertificates");
    let unsupported = validation
        .rest()
        .into_iter()
        .chain(spec.rest())
        .map(|f| format!("{f} is not supported by cutover's import"))
        .next();
    if let Some(why) = unsupported {
        return Err(Condition::no(
            "Accepted",
            "UnsupportedValue",
            format!("{}: {why}", policy.id()),
        ));
    }
    let ca = match (refs.first(), system, refs.len()) {
        (None, Some("System"), _) => None,
        (Some(r), None, 1) => {
            let kind = r.str("kind").unwrap_or("ConfigMap");
            let name = r.str("name").unwrap_or_default();
            let group = r.str("group").unwrap_or("");
            if !group.is_empty() || kind != "ConfigMap" {
                return Err(invalid(
                    "InvalidKind",
                    format!(
                        "{}: CA reference {group}/{kind}: only ConfigMaps are read",
                        policy.id()
                    ),
                ));
            }
            let Some(pem) = resources
                .iter()
                .find(|c| {
                    c.kind == "ConfigMap"
                        && c.group().is_empty()
                        && c.namespace == policy.namespace
                        && c.name == name
                })
                .and_then(|c| c.body.pointer("/data/ca.crt").and_then(Value::as_str))
                .filter(|pem| pem.contains("-----BEGIN CERTIFICATE-----"))
            else {
                return Err(invalid(
                    "InvalidCACertificateRef",
                    format!(
                        "{}: ConfigMap {}/{name} with a PEM `ca.crt` is not among the resources",
                        policy.id(),
                        policy.namespace
                    ),
                ));
            };
            let Some(base) = base else {
                return Err(invalid(
                    "InvalidCACertificateRef",
                    "CA files are written beside the configuration: give -o FILE".into(),
                ));
            };
            let file = format!("ca-{}-{name}.crt", policy.namespace);
            secrets::write_file(base, &file, pem.as_bytes(), 0o644).map_err(|e| {
                invalid(
                    "InvalidCACertificateRef",
                    format!("cannot write {file}: {e}"),
                )
            })?;
            Some(format!("{}/{file}", secrets::FOLDER))
        }
        _ => {
            return Err(invalid(
                "InvalidCACertificateRef",
                format!(
                "{}: exactly one of one caCertificateRefs entry or wellKnownCACertificates: System",
                policy.id()
            ),
            ))
        }
    };
    Ok(BackendTls {
        ca,
        server_name: hostname.to_owned(),
    })
}

/// Each policy's conditions: `Accepted` (false for a field cutover does
/// not read) and `ResolvedRefs` (its CA).
pub(super) fn statuses(
    resources: &[Resource],
    base: Option<&std::path::Path>,
) -> Vec<(String, String, Vec<Condition>)> {
    policies(resources)
        .into_iter()
        .map(|p| {
            let conditions = match read(resources, p, base) {
                Ok(_) => vec![
                    Condition::yes("Accepted", "Accepted"),
                    Condition::yes("ResolvedRefs", "ResolvedRefs"),
                ],
                Err(c) if c.kind == "Accepted" => vec![c],
                Err(c) => vec![Condition::yes("Accepted", "Accepted"), c],
            };
            (p.namespace.clone(), p.name.clone(), conditions)
        })
        .collect()
}

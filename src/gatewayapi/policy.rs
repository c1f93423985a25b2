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
    /// `validation.subjectAltNames`: what the certificate must name
    /// instead of `server_name` (DNS names and URIs).
    pub subject_alt_names: Vec<String>,
    /// The client certificate shown to the backend (the Gateway's
    /// `spec.tls.backend`): `(cert, key)` files.
    pub client: Option<(String, String)>,
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

/// A policy's targets: `(service, sectionName)`.
fn target_refs(policy: &Resource) -> Vec<(String, Option<String>)> {
    policy
        .body
        .pointer("/spec/targetRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| {
            t["group"].as_str().unwrap_or("").is_empty() && t["kind"].as_str() == Some("Service")
        })
        .filter_map(|t| {
            Some((
                t["name"].as_str()?.to_owned(),
                t["sectionName"].as_str().map(str::to_owned),
            ))
        })
        .collect()
}

/// How closely a policy targets port `section` of `service`: 2 by the
/// port's name, 1 the whole Service, `None` not at all.
fn targets(policy: &Resource, namespace: &str, service: &str, section: &str) -> Option<u8> {
    if policy.namespace != namespace {
        return None;
    }
    target_refs(policy)
        .iter()
        .filter(|(name, _)| name == service)
        .filter_map(|(_, s)| match s {
            Some(s) if s == section => Some(2),
            Some(_) => None,
            None => Some(1),
        })
        .max()
}

/// The TLS the policy for port `port` of Service `namespace/service`
/// asks for: the one naming the port (`sectionName`) before one naming
/// the Service, the oldest of equals (`None`: no policy, plain
/// connections), or why it cannot be honoured.
pub(super) fn backend_tls(
    resources: &[Resource],
    namespace: &str,
    service: &str,
    port: Option<i64>,
    base: Option<&std::path::Path>,
) -> Result<Option<BackendTls>, Condition> {
    // The Service port's name (a policy's `sectionName`).
    let section = resources
        .iter()
        .find(|r| {
            r.kind == "Service"
                && r.group().is_empty()
                && r.namespace == namespace
                && r.name == service
        })
        .and_then(|r| {
            r.body
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .cloned()
        })
        .unwrap_or_default()
        .iter()
        .find(|p| p.get("port").and_then(Value::as_i64) == port)
        .and_then(|p| p.get("name").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default();
    let mut best: Option<(u8, &Resource)> = None;
    for policy in policies(resources) {
        if let Some(rank) = targets(policy, namespace, service, &section) {
            if best.is_none_or(|(b, _)| rank > b) {
                best = Some((rank, policy));
            }
        }
    }
    let Some((_, policy)) = best else {
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
    let mut subject_alt_names = Vec::new();
    for san in validation.list("subjectAltNames") {
        let name = match san.str("type") {
            Some("Hostname") => san.str("hostname"),
            Some("URI") => san.str("uri"),
            _ => None,
        };
        match name {
            Some(n) => subject_alt_names.push(n.to_owned()),
            None => {
                return Err(Condition::no(
                    "Accepted",
                    "UnsupportedValue",
                    format!("{}: a subjectAltName is a Hostname or a URI", san.path()),
                ))
            }
        }
    }
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
                .filter(|pem| super::secrets::is_certificate_pem(pem))
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
        subject_alt_names,
        client: None,
    })
}

/// Each policy's conditions: `Accepted` (false for a field cutover does
/// not read, a CA it cannot use, or a conflict: a policy targeting the
/// same Service port as an older one is `Conflicted`) and `ResolvedRefs`
/// (its CA).
pub(super) fn statuses(
    resources: &[Resource],
    base: Option<&std::path::Path>,
) -> Vec<super::status::PolicyStatus> {
    let all = policies(resources);
    all.iter()
        .enumerate()
        .map(|(i, p)| {
            let mine = target_refs(p);
            let conflict = all[..i].iter().find(|older| {
                older.namespace == p.namespace && target_refs(older).iter().any(|t| mine.contains(t))
            });
            let conditions = match (conflict, read(resources, p, base)) {
                (Some(older), _) => vec![Condition::no(
                    "Accepted",
                    "Conflicted",
                    format!(
                        "BackendTLSPolicy {} targets the same Service (and section) and is older: it applies",
                        older.name
                    ),
                )],
                (None, Ok(_)) => vec![
                    Condition::yes("Accepted", "Accepted"),
                    Condition::yes("ResolvedRefs", "ResolvedRefs"),
                ],
                (None, Err(c)) if c.kind == "Accepted" => vec![c],
                // A CA it cannot read: not accepted (its Services are not
                // served over TLS it cannot verify), and why.
                (None, Err(c)) => vec![
                    Condition::no("Accepted", "NoValidCACertificate", c.message.clone()),
                    c,
                ],
            };
            super::status::PolicyStatus {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                generation: super::status::generation_of(p),
                conditions,
            }
        })
        .collect()
}

//! `spec.tls.frontend` of a Gateway: the client certificates its HTTPS
//! ports demand (a default and per-port settings), each CA bundle read
//! from ConfigMaps and written beside the configuration.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::grants::granted;
use super::secrets;
use super::status::Condition;
use super::Resource;

/// Client certificates a port demands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClientValidation {
    /// The CA bundle file, relative to the configuration.
    pub ca: String,
    /// `AllowInsecureFallback`: a client without a (valid) certificate is
    /// served too.
    pub optional: bool,
}

/// `spec.tls.frontend`: the client certificates HTTPS ports demand.
pub(super) struct Frontend {
    pub default: Option<Result<ClientValidation, Vec<Condition>>>,
    pub per_port: BTreeMap<u16, Result<ClientValidation, Vec<Condition>>>,
    pub insecure: bool,
    pub unsupported: Vec<String>,
}

impl Frontend {
    pub(super) fn read(
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
        // `tls.backend` is the client certificate for backends
        // (`secrets::backend_client`).
        tls.ignore(&["backend"]);
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
    pub(super) fn for_port(&self, port: u16) -> Option<&Result<ClientValidation, Vec<Condition>>> {
        self.per_port.get(&port).or(self.default.as_ref())
    }
}

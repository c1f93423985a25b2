//! An HTTPS listener's `tls.certificateRefs`: `kubernetes.io/tls` Secrets
//! among the resources, written as PEM files beside the configuration.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustls_pki_types::pem::PemObject as _;
use serde_json::Value;

use super::grants::granted;
use super::status::Condition;
use super::{Fields, Resource};

/// The folder, beside the configuration, the certificates are written to.
pub const FOLDER: &str = "gateway-api-secrets";

/// The certificate and key files of one reference, relative to the
/// configuration's folder `base` (written there), or the condition it
/// fails (`ResolvedRefs`: `InvalidCertificateRef`, `RefNotPermitted`).
pub(super) fn certificate(
    resources: &[Resource],
    gateway: &Resource,
    r: &Fields<'_>,
    base: Option<&Path>,
) -> Result<(String, String), Condition> {
    let group = r.str("group").unwrap_or("");
    let kind = r.str("kind").unwrap_or("Secret");
    let name = r.str("name").unwrap_or_default();
    let namespace = r.str("namespace").unwrap_or(&gateway.namespace);
    let invalid = |why: String| Condition::no("ResolvedRefs", "InvalidCertificateRef", why);
    if !(group.is_empty() || group == "core") || kind != "Secret" {
        return Err(invalid(format!(
            "certificate reference {group}/{kind}: only Secrets are read"
        )));
    }
    if namespace != gateway.namespace && !granted(resources, gateway, "Secret", namespace, name) {
        return Err(Condition::no(
            "ResolvedRefs",
            "RefNotPermitted",
            format!("no ReferenceGrant in namespace {namespace} lets Gateways of {} refer to Secret {name}", gateway.namespace),
        ));
    }
    let Some(secret) = resources.iter().find(|s| {
        s.kind == "Secret" && s.group().is_empty() && s.namespace == namespace && s.name == name
    }) else {
        return Err(invalid(format!(
            "Secret {namespace}/{name} is not among the resources"
        )));
    };
    let field = |key: &str| -> Option<Vec<u8>> {
        let data = secret
            .body
            .get("data")
            .and_then(|d| d.get(key))
            .and_then(Value::as_str);
        match data {
            Some(encoded) => base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok(),
            None => secret
                .body
                .get("stringData")
                .and_then(|d| d.get(key))
                .and_then(Value::as_str)
                .map(|s| s.as_bytes().to_vec()),
        }
    };
    let (Some(cert), Some(key)) = (field("tls.crt"), field("tls.key")) else {
        return Err(invalid(format!(
            "Secret {namespace}/{name} has no tls.crt and tls.key"
        )));
    };
    let key_parses = rustls_pki_types::PrivateKeyDer::from_pem_slice(&key).is_ok();
    if !is_certificate_pem(&String::from_utf8_lossy(&cert)) || !key_parses {
        return Err(invalid(format!(
            "Secret {namespace}/{name}: tls.crt and tls.key are not PEM"
        )));
    }
    let Some(base) = base else {
        return Err(invalid(
            "certificates are written beside the configuration: give -o FILE".into(),
        ));
    };
    let stem = format!("{namespace}-{name}");
    let dir = base.join(FOLDER);
    write(&dir, &format!("{stem}.crt"), &cert, 0o644)
        .and_then(|()| write(&dir, &format!("{stem}.key"), &key, 0o600))
        .map_err(|e| invalid(format!("cannot write {}: {e}", dir.display())))?;
    let relative = |file: &str| format!("{FOLDER}/{file}");
    Ok((
        relative(&format!("{stem}.crt")),
        relative(&format!("{stem}.key")),
    ))
}

/// Writes `base/gateway-api-secrets/name` (see [`write`]).
pub(super) fn write_file(base: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write(&base.join(FOLDER), name, bytes, mode)
}

/// Writes `dir/name` whole (a temporary file renamed over it), readable
/// as `mode` says.
fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    let target: PathBuf = dir.join(name);
    if std::fs::read(&target).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut file = std::fs::File::create(&tmp)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, &target)
}

/// The certificate references of a listener's `tls`, each resolved.
pub(super) fn listener_certificates(
    resources: &[Resource],
    gateway: &Resource,
    tls: Option<&Fields<'_>>,
    base: Option<&Path>,
) -> Result<Vec<(String, String)>, Condition> {
    let refs = tls.map(|t| t.list("certificateRefs")).unwrap_or_default();
    if refs.is_empty() {
        return Err(Condition::no(
            "ResolvedRefs",
            "InvalidCertificateRef",
            "an HTTPS listener needs tls.certificateRefs".into(),
        ));
    }
    refs.iter()
        .map(|r| certificate(resources, gateway, r, base))
        .collect()
}

/// Whether `pem` holds at least one certificate, each of which parses
/// (a ConfigMap's `ca.crt` that merely looks like PEM is refused here,
/// with the API's reason, rather than by cutover's own validation).
pub(super) fn is_certificate_pem(pem: &str) -> bool {
    let mut any = false;
    for der in rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
        match der {
            Ok(der) if x509_parser::parse_x509_certificate(&der).is_ok() => any = true,
            _ => return false,
        }
    }
    any
}

/// `spec.tls.backend.clientCertificateRef` of a Gateway: the certificate
/// it shows backends that ask (those of its routes' BackendTLSPolicies),
/// as `(cert, key)` files; `None` when none is set; the `ResolvedRefs`
/// condition it fails (`InvalidClientCertificateRef`, `RefNotPermitted`).
pub(super) fn backend_client(
    resources: &[Resource],
    gateway: &Resource,
    spec: &Fields<'_>,
    base: Option<&Path>,
) -> Option<Result<(String, String), Condition>> {
    let tls = spec.object("tls")?;
    let backend = tls.object("backend")?;
    let reference = backend.object("clientCertificateRef")?;
    Some(
        certificate(resources, gateway, &reference, base).map_err(|c| {
            let reason = if c.reason == "RefNotPermitted" {
                "RefNotPermitted"
            } else {
                "InvalidClientCertificateRef"
            };
            Condition::no("ResolvedRefs", reason, c.message)
        }),
    )
}

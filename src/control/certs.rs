//! Certificate-only reload: new material for TLS listeners, no generation.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::error::ControlError;
use crate::generation::Generation;
use crate::plan::{HostMatch, Spec};
use crate::telemetry::metrics as m;
use crate::tls::{CertStore, ListenerMaterial, Material};

/// One certificate as `reload-certs` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CertView {
    pub names: Vec<String>,
    pub fingerprint: String,
    pub not_after: String,
    pub cert_file: String,
    pub changed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerCerts {
    pub listener: String,
    pub certificates: Vec<CertView>,
}

/// A secret file (an htpasswd file, a JWKS, an HMAC key) as
/// `reload-certs` reports it: whether it changed, or why the last good
/// contents stay. Never its contents.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecretView {
    pub file: String,
    pub changed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer to `reload-certs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CertReload {
    pub outcome: Cow<'static, str>,
    pub generation: crate::ids::GenerationId,
    pub listeners: Vec<ListenerCerts>,
    /// Certificates that expire within 7 days, or do not cover a host the
    /// listener's routes serve.
    pub warnings: Vec<String>,
    /// The route authentication's secret files (all of them, when no
    /// listener is named).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretView>,
    /// The forward-auth answers the routes' caches held, forgotten (with
    /// the secrets: when no listener is named).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub auth_answers_forgotten: usize,
    pub operation_id: String,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

const EXPIRY_WARNING_SECS: i64 = 7 * 24 * 3600;

/// What a certificate reload read, before it is recorded.
pub(super) struct Reloaded {
    pub listeners: Vec<ListenerCerts>,
    pub warnings: Vec<String>,
    pub secrets: Vec<SecretView>,
    pub auth_answers_forgotten: usize,
    /// For the operation log.
    pub summary: String,
}

/// Re-reads the certificate material of `active`'s TLS listeners (all,
/// or those named) and installs it in `certificates` in one step; on any
/// failure nothing changes. Without names, the routes' secret files are
/// read again and their forward-auth answers forgotten too. The caller
/// holds the operation lock.
pub(super) fn reload(
    certificates: &CertStore,
    active: &Generation,
    only: Option<&[String]>,
) -> Result<Reloaded, ControlError> {
    let tls_listeners: Vec<_> = active
        .spec
        .listeners
        .iter()
        .filter(|l| l.tls.is_some())
        .collect();
    if let Some(names) = only {
        for name in names {
            if !tls_listeners.iter().any(|l| &l.name == name) {
                return Err(ControlError::NotTlsListener(name.clone()));
            }
        }
    }
    let previous = certificates.load();
    let mut next = Material {
        generation: active.id,
        ..Material::default()
    };
    let mut reloaded = Vec::new();
    for listener in &tls_listeners {
        let selected = only.is_none_or(|names| names.contains(&listener.name));
        let material = match (&listener.tls, selected) {
            (Some(tls), true) => {
                let loaded =
                    ListenerMaterial::load(tls).map_err(|source| ControlError::Certificate {
                        listener: listener.name.clone(),
                        source,
                    })?;
                reloaded.push(listener.name.clone());
                Arc::new(loaded)
            }
            _ => match previous.listeners.get(&listener.name) {
                Some(kept) => Arc::clone(kept),
                None => continue,
            },
        };
        next.listeners.insert(listener.name.clone(), material);
    }
    let mut warnings = warnings(&active.spec, &next);
    let listeners = reloaded
        .iter()
        .filter_map(|name| {
            let now = next.listeners.get(name)?;
            let before: Vec<String> = previous
                .listeners
                .get(name)
                .map(|b| {
                    b.certificates()
                        .into_iter()
                        .map(|c| c.fingerprint)
                        .collect()
                })
                .unwrap_or_default();
            Some(ListenerCerts {
                listener: name.clone(),
                certificates: now
                    .certificates()
                    .into_iter()
                    .map(|info| CertView {
                        changed: !before.contains(&info.fingerprint),
                        names: info.names,
                        fingerprint: info.fingerprint,
                        not_after: info.not_after,
                        cert_file: info.cert_file.display().to_string(),
                    })
                    .collect(),
            })
        })
        .collect::<Vec<_>>();
    install(certificates, next);
    let (secrets, forgotten) = match only {
        Some(_) => (Vec::new(), 0),
        None => (
            reload_secrets(&active.spec, &mut warnings),
            forget_auth_answers(&active.spec),
        ),
    };
    let changed = listeners
        .iter()
        .flat_map(|l| &l.certificates)
        .filter(|c| c.changed)
        .count();
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        listeners = listeners.len(),
        changed,
        "certificates reloaded"
    );
    let summary = format!(
        "{} listeners reloaded, {changed} certificates changed, {} of {} secret files changed",
        listeners.len(),
        secrets.iter().filter(|s| s.changed).count(),
        secrets.len()
    );
    Ok(Reloaded {
        listeners,
        warnings,
        secrets,
        auth_answers_forgotten: forgotten,
        summary,
    })
}

/// Makes `material` what new handshakes get, and exports its expiry.
pub(super) fn install(certificates: &CertStore, material: Material) {
    for (listener, certs) in &material.listeners {
        for info in certs.certificates() {
            for name in &info.names {
                metrics::gauge!(m::CERT_NOT_AFTER, m::LABEL_LISTENER => listener.clone(), m::LABEL_NAME => name.clone())
                    .set(info.not_after_unix as f64);
            }
        }
    }
    certificates.swap(material);
}

/// Reads every secret file of `spec`'s authentication again; one that
/// does not read or parse keeps its last good contents and is reported.
fn reload_secrets(spec: &Spec, warnings: &mut Vec<String>) -> Vec<SecretView> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for auth in crate::plan::auths(spec) {
        // A file several routes name is one secret: reloaded and listed once.
        for secret in auth
            .secrets()
            .into_iter()
            .filter(|s| seen.insert(s.identity()))
        {
            let view = match secret.reload() {
                Ok(changed) => SecretView {
                    file: secret.file().to_owned(),
                    changed,
                    error: None,
                },
                Err(error) => {
                    warnings.push(format!(
                        "secret file '{}' was not reloaded ({error}); its last good contents stay",
                        secret.file()
                    ));
                    SecretView {
                        file: secret.file().to_owned(),
                        changed: false,
                        error: Some(error),
                    }
                }
            };
            out.push(view);
        }
    }
    out
}

/// Empties every forward auth's cache of answers (a credential revoked
/// at the auth service is refused from now on, not after `ttl`); returns
/// how many answers were forgotten.
fn forget_auth_answers(spec: &Spec) -> usize {
    crate::plan::auths(spec)
        .into_iter()
        .filter_map(|auth| match auth {
            crate::auth::Auth::Forward(forward) => forward.cache.as_ref(),
            _ => None,
        })
        .map(crate::auth::forward_cache::ForwardCache::clear)
        .sum()
}

/// Expiring certificates, and route hosts no certificate of their listener covers.
fn warnings(spec: &Spec, material: &Material) -> Vec<String> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mut out = Vec::new();
    for (listener, certs) in &material.listeners {
        let certificates = certs.certificates();
        for info in &certificates {
            if info.not_after_unix - now < EXPIRY_WARNING_SECS {
                out.push(format!(
                    "listener '{listener}': certificate {} ({}) expires {}",
                    info.cert_file.display(),
                    info.names.join(", "),
                    info.not_after
                ));
            }
        }
        let covered = |host: &HostMatch| {
            certificates
                .iter()
                .flat_map(|c| &c.names)
                .any(|name| match host {
                    HostMatch::Exact(h) => {
                        name == h
                            || name.strip_prefix("*.").is_some_and(|s| {
                                h.split_once('.').is_some_and(|(_, rest)| rest == s)
                            })
                    }
                    HostMatch::Suffix(suffix) => {
                        name.strip_prefix('*').is_some_and(|s| s == suffix)
                    }
                })
        };
        for route in spec
            .routes
            .iter()
            .filter(|r| r.listeners.contains(listener))
        {
            for host in route.hosts.iter().filter(|h| !covered(h)) {
                let shown = match host {
                    HostMatch::Exact(h) => h.clone(),
                    HostMatch::Suffix(s) => format!("*{s}"),
                };
                out.push(format!(
                    "listener '{listener}': route '{}' serves {shown}, which no certificate covers",
                    route.name
                ));
            }
        }
    }
    out
}

//! The certificates served, as status shows them.

use std::time::{Duration, SystemTime};

use super::renew_at;
use crate::tls::CertSlot;

/// One certificate of a listener, as status shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CertificateStatus {
    pub listener: String,
    /// `files` or `acme`.
    pub source: String,
    pub names: Vec<String>,
    /// None while an ACME certificate is not issued yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<AcmeStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocsp: Option<OcspStatus>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AcmeStatus {
    pub directory: String,
    pub challenge: String,
    /// When renewal is due (RFC 3339), once a certificate is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OcspStatus {
    pub responder: String,
    pub stapled: bool,
    /// `good`, `revoked` or `unknown`, of the staple.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub this_update: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_update: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_secs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn rfc3339_unix(secs: i64) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    crate::runtime::rfc3339(at)
}

impl CertificateStatus {
    pub(super) fn of(listener: &str, slot: &CertSlot, now: i64) -> Self {
        let info = slot.info();
        let notes = slot.notes();
        let acme = slot.acme().map(|spec| AcmeStatus {
            directory: spec.directory.clone(),
            challenge: spec.challenge.name().to_owned(),
            renew_at: info
                .as_ref()
                .map(|i| rfc3339_unix(renew_at(i, spec.renew_before))),
            last_error: notes.acme_error.clone(),
            retry_at: notes.acme_retry_at.map(rfc3339_unix),
        });
        let responder = slot
            .ocsp_target()
            .map(|t| t.url)
            .or_else(|| slot.ocsp_unusable());
        let ocsp = responder.map(|responder| {
            let staple = slot.staple();
            let error = match (slot.ocsp_target(), &notes.ocsp_error) {
                (None, _) => Some(
                    "the chain holds no issuer certificate to ask the responder about this one"
                        .to_owned(),
                ),
                (Some(_), error) => error.clone(),
            };
            OcspStatus {
                responder,
                stapled: staple.is_some(),
                status: staple.as_ref().map(|s| s.status.to_owned()),
                this_update: staple.as_ref().map(|s| rfc3339_unix(s.this_update)),
                next_update: staple.as_ref().map(|s| rfc3339_unix(s.next_update)),
                age_secs: staple.as_ref().map(|s| now - s.this_update),
                error,
            }
        });
        Self {
            listener: listener.to_owned(),
            source: if slot.acme().is_some() {
                "acme"
            } else {
                "files"
            }
            .to_owned(),
            names: match (slot.acme(), &info) {
                (Some(spec), _) => spec.domains.clone(),
                (None, Some(info)) => info.names.clone(),
                (None, None) => Vec::new(),
            },
            fingerprint: info.as_ref().map(|i| i.fingerprint.clone()),
            serial: info.as_ref().map(|i| i.serial.clone()),
            not_after: info.as_ref().map(|i| i.not_after.clone()),
            expires_in_secs: info.as_ref().map(|i| i.not_after_unix - now),
            acme,
            ocsp,
        }
    }
}

//! One ACME order, start to finish: the account (stored, or made once),
//! the order, each authorization's challenge answered where the CA will
//! look (the slot's tls-alpn-01 certificate, or the http-01 token table),
//! finalization with a fresh key, and the chain. The answers are taken
//! down whatever happens.

use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, ExternalAccountKey,
    Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use rustls::sign::CertifiedKey;

use super::client::Bounded;
use super::shared::{Answer, Shared};
use super::store::{account_file, write_private, CertificateFiles};
use crate::tls::{AcmeSpec, CertSlot, Challenge, LoadedCert};

/// A certificate the CA issued.
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
    pub loaded: LoadedCert,
}

/// Why an order did not give a certificate.
#[derive(Debug, Clone)]
pub struct Failure {
    /// `unreachable`, `rejected`, `invalid`, `rate_limited` or `storage`:
    /// the `outcome` of `cutover_acme_orders_total`.
    pub outcome: &'static str,
    pub message: String,
}

impl Failure {
    fn new(outcome: &'static str, message: impl Into<String>) -> Self {
        Self {
            outcome,
            message: message.into(),
        }
    }

    /// Sorts an ACME error: the CA's own problems by their type, the rest
    /// as the CA being unreachable.
    fn of(doing: &str, error: instant_acme::Error) -> Self {
        match &error {
            instant_acme::Error::Api(problem) => {
                let kind = problem.r#type.as_deref().unwrap_or("");
                let outcome = if kind.ends_with(":rateLimited") {
                    "rate_limited"
                } else if kind.ends_with(":badNonce") || kind.ends_with(":serverInternal") {
                    "unreachable"
                } else {
                    "rejected"
                };
                Self::new(outcome, format!("{doing}: {problem}"))
            }
            instant_acme::Error::Json(_) => Self::new(
                "invalid",
                format!("{doing}: the CA's answer is not ACME: {error}"),
            ),
            _ => Self::new("unreachable", format!("{doing}: {error}")),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Takes every answer it set down when dropped.
struct Answers<'s> {
    slot: &'s CertSlot,
    tls: Vec<String>,
    http: Vec<String>,
}

impl Drop for Answers<'_> {
    fn drop(&mut self) {
        for domain in &self.tls {
            self.slot.set_challenge(domain, None);
        }
        for token in &self.http {
            crate::tls::set_http01(token, None);
        }
    }
}

/// How long a published answer is given to reach every instance.
const FLEET_PROPAGATION: Duration = Duration::from_secs(2);

/// Polling while the CA validates and issues: quick at first, about a
/// minute in all.
fn patience() -> RetryPolicy {
    RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .backoff(1.5)
        .timeout(Duration::from_secs(60))
}

fn roots(spec: &AcmeSpec) -> Result<rustls::RootCertStore, Failure> {
    match &spec.ca_root {
        Some(path) => {
            crate::tls::load_roots(path).map_err(|e| Failure::new("storage", e.to_string()))
        }
        None => Ok(rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        }),
    }
}

/// The stored account for `spec`'s directory and contact, or a new one
/// (kept 0600 before it is used).
async fn account(spec: &AcmeSpec) -> Result<Account, Failure> {
    let http = || -> Result<Box<Bounded>, Failure> {
        Ok(Box::new(
            Bounded::new(roots(spec)?).map_err(|e| Failure::new("storage", e))?,
        ))
    };
    let file = account_file(spec);
    if let Ok(text) = std::fs::read(&file) {
        match serde_json::from_slice::<AccountCredentials>(&text) {
            Ok(credentials) => {
                return Account::builder_with_http(http()?)
                    .from_credentials(credentials)
                    .await
                    .map_err(|e| Failure::of("reading the directory", e));
            }
            Err(error) => {
                tracing::warn!(file = %file.display(), %error, "the stored ACME account does not read; a new one is made");
            }
        }
    }
    let contact = spec.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let eab = match &spec.eab {
        Some(eab) => {
            let bytes = crate::files::read_regular(&eab.hmac_file, 4096).map_err(|e| {
                Failure::new("storage", format!("{}: {e}", eab.hmac_file.display()))
            })?;
            let key = super::eab_key(&bytes).ok_or_else(|| {
                Failure::new(
                    "storage",
                    format!("{}: not a base64url HMAC key", eab.hmac_file.display()),
                )
            })?;
            Some(ExternalAccountKey::new(eab.kid.clone(), &key))
        }
        None => None,
    };
    let (account, credentials) = Account::builder_with_http(http()?)
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            spec.directory.clone(),
            eab.as_ref(),
        )
        .await
        .map_err(|e| Failure::of("making the account", e))?;
    let text =
        serde_json::to_vec(&credentials).map_err(|e| Failure::new("storage", e.to_string()))?;
    write_private(&file, &text, 0o600)
        .map_err(|e| Failure::new("storage", format!("{}: {e}", file.display())))?;
    tracing::info!(directory = %spec.directory, "ACME account made");
    Ok(account)
}

/// The tls-alpn-01 answer for `domain` (RFC 8737): a self-signed
/// certificate for it carrying the key authorization's digest.
pub fn alpn_certificate(domain: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(vec![domain.to_owned()]).map_err(|e| e.to_string())?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signing,
    )))
}

/// Orders `spec`'s certificate, answering its challenges through `slot`
/// (and, in a fleet, through every instance: `shared`), and keeps it in
/// `state_dir`.
pub async fn issue(
    spec: &AcmeSpec,
    slot: &CertSlot,
    shared: Option<&dyn Shared>,
) -> Result<Issued, Failure> {
    let mut published = Vec::new();
    let result = order(spec, slot, shared, &mut published).await;
    if let Some(shared) = shared {
        for answer in published {
            if let Err(error) = shared.withdraw(answer).await {
                tracing::debug!(%error, "a published ACME answer was not withdrawn; it expires by itself");
            }
        }
    }
    result
}

async fn order(
    spec: &AcmeSpec,
    slot: &CertSlot,
    shared: Option<&dyn Shared>,
    published: &mut Vec<Answer>,
) -> Result<Issued, Failure> {
    let account = account(spec).await?;
    let identifiers: Vec<Identifier> = spec
        .domains
        .iter()
        .map(|d| Identifier::Dns(d.clone()))
        .collect();
    let mut order = account
        .new_order(&NewOrder::new(&identifiers))
        .await
        .map_err(|e| Failure::of("placing the order", e))?;
    let kind = match spec.challenge {
        Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        Challenge::Http01 => ChallengeType::Http01,
    };
    let mut answers = Answers {
        slot,
        tls: Vec::new(),
        http: Vec::new(),
    };
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization =
            authorization.map_err(|e| Failure::of("reading an authorization", e))?;
        match authorization.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            other => {
                return Err(Failure::new(
                    "rejected",
                    format!("an authorization is {other:?}"),
                ))
            }
        }
        let mut challenge = authorization.challenge(kind.clone()).ok_or_else(|| {
            Failure::new(
                "rejected",
                format!("the CA offers no {} challenge", spec.challenge.name()),
            )
        })?;
        let domain = challenge.identifier().to_string();
        let authorization_key = challenge.key_authorization();
        let answer = match spec.challenge {
            Challenge::TlsAlpn01 => {
                let cert = alpn_certificate(&domain, authorization_key.digest().as_ref())
                    .map_err(|e| Failure::new("storage", e))?;
                slot.set_challenge(&domain, Some(cert));
                answers.tls.push(domain.clone());
                Answer::new(spec.challenge, &domain, authorization_key.as_str())
            }
            Challenge::Http01 => {
                crate::tls::set_http01(&challenge.token, Some(authorization_key.as_str()));
                answers.http.push(challenge.token.clone());
                Answer::new(spec.challenge, &challenge.token, authorization_key.as_str())
            }
        };
        if let Some(shared) = shared {
            shared.publish(answer.clone()).await.map_err(|e| {
                Failure::new(
                    "unreachable",
                    format!("publishing a challenge answer to the fleet: {e}"),
                )
            })?;
            published.push(answer);
            // Every instance takes the fleet's answers within a second:
            // the CA may reach any of them once told to look.
            tokio::time::sleep(FLEET_PROPAGATION).await;
        }
        challenge
            .set_ready()
            .await
            .map_err(|e| Failure::of("answering a challenge", e))?;
    }
    let status = order
        .poll_ready(&patience())
        .await
        .map_err(|e| Failure::of("waiting for validation", e))?;
    if status != OrderStatus::Ready {
        return Err(Failure::new(
            "rejected",
            format!("validation failed: {}", validation_errors(&mut order).await),
        ));
    }
    let key_pem = order
        .finalize()
        .await
        .map_err(|e| Failure::of("finalizing", e))?;
    let chain_pem = order
        .poll_certificate(&patience())
        .await
        .map_err(|e| Failure::of("fetching the certificate", e))?;
    drop(answers);
    let files = CertificateFiles::of(spec);
    let loaded = crate::tls::parse_cert(
        &files.cert,
        chain_pem.as_bytes(),
        &files.key,
        key_pem.as_bytes(),
    )
    .map_err(|e| Failure::new("invalid", format!("the issued certificate: {e}")))?;
    let missing: Vec<&String> = spec
        .domains
        .iter()
        .filter(|d| !loaded.info.names.contains(d))
        .collect();
    if !missing.is_empty() {
        return Err(Failure::new(
            "invalid",
            format!("the issued certificate does not name {missing:?}"),
        ));
    }
    super::write_issued(spec, &chain_pem, &key_pem)
        .map_err(|e| Failure::new("storage", format!("{}: {e}", files.dir.display())))?;
    Ok(Issued {
        chain_pem,
        key_pem,
        loaded,
    })
}

/// What the CA said of the challenges that failed.
async fn validation_errors(order: &mut instant_acme::Order) -> String {
    let mut out = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authorization)) = authorizations.next().await {
        if let Ok(state) = authorization.refresh().await {
            for challenge in &state.challenges {
                if let Some(error) = &challenge.error {
                    out.push(error.to_string());
                }
            }
        }
    }
    if out.is_empty() {
        "the order is invalid".to_owned()
    } else {
        out.join("; ")
    }
}

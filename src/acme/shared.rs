//! What a fleet shares of ACME (DESIGN §21): one instance orders each
//! certificate, under a lock that lives as long as it does; the result is
//! stored for the others to install; the challenge answers are published
//! so that whichever instance the CA reaches answers them. The fleet
//! implements it over etcd (`fleet/certificates.rs`); the certificate
//! keeper uses it without knowing where it lives.

use futures_util::future::BoxFuture;

use crate::tls::Challenge;

/// A certificate as the fleet keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SharedCert {
    pub chain_pem: String,
    pub key_pem: String,
}

/// One challenge answer: an http-01 token's key authorization, or the
/// key authorization a tls-alpn-01 certificate for a domain carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Answer {
    /// `tls-alpn-01` or `http-01`.
    pub challenge: String,
    /// The http-01 token, or the tls-alpn-01 domain.
    pub name: String,
    pub key_authorization: String,
}

impl Answer {
    pub fn new(challenge: Challenge, name: &str, key_authorization: &str) -> Self {
        Self {
            challenge: challenge.name().to_owned(),
            name: name.to_owned(),
            key_authorization: key_authorization.to_owned(),
        }
    }

    pub fn kind(&self) -> Option<Challenge> {
        match self.challenge.as_str() {
            "tls-alpn-01" => Some(Challenge::TlsAlpn01),
            "http-01" => Some(Challenge::Http01),
            _ => None,
        }
    }
}

/// Held while this instance orders a certificate; dropping it lets the
/// lock go.
pub type OrderLock = Box<dyn Send + Sync>;

/// Where instances share ACME certificates and answers. `id` names one
/// certificate (its directory and domains, as its files are named).
pub trait Shared: Send + Sync {
    /// The order lock for `id`: `Ok(None)` while another instance holds
    /// it.
    fn lock(&self, id: String) -> BoxFuture<'_, Result<Option<OrderLock>, String>>;
    /// The certificate stored for `id`, if any.
    fn load(&self, id: String) -> BoxFuture<'_, Result<Option<SharedCert>, String>>;
    fn store(&self, id: String, certificate: SharedCert) -> BoxFuture<'_, Result<(), String>>;
    /// Makes `answer` every instance's to give (it expires by itself if
    /// this instance goes away).
    fn publish(&self, answer: Answer) -> BoxFuture<'_, Result<(), String>>;
    fn withdraw(&self, answer: Answer) -> BoxFuture<'_, Result<(), String>>;
    /// Every answer published now.
    fn answers(&self) -> BoxFuture<'_, Result<Vec<Answer>, String>>;
}

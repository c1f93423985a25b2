//! Upstream TLS: the rustls client configuration of a backend.

use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;
use std::path::PathBuf;

use super::material::{read_chain, server_verifier, TlsError};

/// How cutover talks TLS to an upstream (paths resolved).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTlsSpec {
    /// CA bundle to verify the backend; the WebPKI roots when absent.
    pub ca: Option<PathBuf>,
    /// SNI and verification name; the backend's host when absent.
    pub server_name: Option<String>,
    /// Client certificate and key for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Fingerprint of the files above as validated: part of the backend's
    /// identity, so a rotated CA or client certificate builds a new client.
    pub files_fingerprint: String,
}

/// The client configuration for a backend. ALPN is left empty: the
/// connector offers `h2` or `http/1.1` by the upstream's protocol.
pub fn client_config(spec: &UpstreamTlsSpec) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(super::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Bundle {
            path: PathBuf::new(),
            reason: e.to_string(),
        })?
        .with_webpki_verifier(server_verifier(spec.ca.as_deref())?);
    let config = match &spec.client_cert {
        Some((cert, key)) => {
            let chain = read_chain(cert)?;
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
                path: key.clone(),
                reason: e.to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| TlsError::Key {
                    path: key.clone(),
                    reason: e.to_string(),
                })?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(config)
}

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
    /// When set: the names (DNS, or URIs such as SPIFFE IDs) one of which
    /// the backend's certificate must carry, instead of `server_name`.
    pub subject_alt_names: Vec<String>,
    /// Fingerprint of the files above as validated: part of the backend's
    /// identity, so a rotated CA or client certificate builds a new client.
    pub files_fingerprint: String,
}

/// An HTTP/1.1 client for the gateway's own calls out (a JWKS, a
/// webhook): `https://` verified against `ca` (the WebPKI roots when
/// none), `http://` as it is.
pub type OwnClient<B> = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    B,
>;

/// Builds an [`OwnClient`] that trusts `ca`.
pub fn own_client<B>(ca: Option<PathBuf>) -> Result<OwnClient<B>, TlsError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    let tls = client_config(&UpstreamTlsSpec {
        ca,
        server_name: None,
        client_cert: None,
        subject_alt_names: Vec::new(),
        files_fingerprint: String::new(),
    })?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https),
    )
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
        .dangerous()
        .with_custom_certificate_verifier(verifier(spec)?);
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

/// The backend-certificate verifier: the WebPKI rules by server name, or,
/// with `subject_alt_names`, the chain by WebPKI and the name among those.
fn verifier(
    spec: &UpstreamTlsSpec,
) -> Result<std::sync::Arc<dyn rustls::client::danger::ServerCertVerifier>, TlsError> {
    let webpki = server_verifier(spec.ca.as_deref())?;
    if spec.subject_alt_names.is_empty() {
        return Ok(webpki);
    }
    let roots = match spec.ca.as_deref() {
        Some(path) => super::material::load_roots(path)?,
        None => rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    Ok(std::sync::Arc::new(SubjectAltNames {
        webpki,
        roots: std::sync::Arc::new(roots),
        names: spec.subject_alt_names.clone(),
    }))
}

/// Verifies the chain and then that the leaf names one of `names`.
#[derive(Debug)]
struct SubjectAltNames {
    webpki: std::sync::Arc<rustls::client::WebPkiServerVerifier>,
    roots: std::sync::Arc<rustls::RootCertStore>,
    names: Vec<String>,
}

impl rustls::client::danger::ServerCertVerifier for SubjectAltNames {
    fn verify_server_cert(
        &self,
        end_entity: &rustls_pki_types::CertificateDer<'_>,
        intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            super::provider().signature_verification_algorithms.all,
        )?;
        if names_match(end_entity.as_ref(), &self.names) {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Whether the certificate's subject alternative names hold one of
/// `names`: a URI exactly, a DNS name exactly or by a `*.` wildcard of
/// the certificate covering one label.
fn names_match(der: &[u8], names: &[String]) -> bool {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    san.value.general_names.iter().any(|general| match general {
        GeneralName::URI(uri) => names.iter().any(|n| n == uri),
        GeneralName::DNSName(dns) => {
            let dns = dns.to_ascii_lowercase();
            names.iter().any(|n| {
                let n = n.to_ascii_lowercase();
                n == dns
                    || dns.strip_prefix("*.").is_some_and(|suffix| {
                        n.split_once('.').is_some_and(|(_, rest)| rest == suffix)
                    })
            })
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(sans: Vec<rcgen::SanType>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn subject_alt_names_match_dns_wildcards_and_uris() {
        let der = cert(vec![
            rcgen::SanType::DnsName("abc.example.com".try_into().unwrap()),
            rcgen::SanType::DnsName("*.wild.example".try_into().unwrap()),
            rcgen::SanType::URI("spiffe://abc.example.com/test-identity".try_into().unwrap()),
        ]);
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(names_match(&der, &names(&["abc.example.com"])));
        assert!(names_match(
            &der,
            &names(&["nope.example", "ABC.example.com"])
        ));
        assert!(names_match(&der, &names(&["a.wild.example"])));
        assert!(!names_match(&der, &names(&["a.b.wild.example"])));
        assert!(names_match(
            &der,
            &names(&["spiffe://abc.example.com/test-identity"])
        ));
        assert!(!names_match(
            &der,
            &names(&["spiffe://abc.example.com/other"])
        ));
        assert!(!names_match(&der, &names(&["dce.example.com"])));
    }
}

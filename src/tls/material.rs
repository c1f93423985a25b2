//! Certificate material: reading, checking and describing PEM files.
//!
//! Pure functions over files: a chain and its key become a rustls
//! `CertifiedKey` (after checking that the key matches the leaf), described
//! by its names, SHA-256 fingerprint and `not_after`; a CA bundle becomes a
//! client-certificate verifier or an upstream root store. Every failure
//! names the file and the reason.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why certificate material could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: no PEM certificate in the file")]
    NoCertificate { path: PathBuf },
    #[error("{path}: not a valid PEM certificate chain: {reason}")]
    Chain { path: PathBuf, reason: String },
    #[error("{path}: not a usable private key: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("{key}: the key does not match the certificate in {cert}")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("{path}: not a usable CA bundle: {reason}")]
    Bundle { path: PathBuf, reason: String },
}

impl TlsError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            TlsError::Read { path, .. }
            | TlsError::NoCertificate { path }
            | TlsError::Chain { path, .. }
            | TlsError::Key { path, .. }
            | TlsError::Bundle { path, .. } => path,
            TlsError::Mismatch { key, .. } => key,
        }
    }
}

/// What a loaded certificate is, for responses, logs and metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertInfo {
    /// DNS names from the subject alternative names (the CN without them).
    pub names: Vec<String>,
    /// `sha256:<hex>` of the leaf certificate's DER.
    pub fingerprint: String,
    /// RFC 3339.
    pub not_after: String,
    #[serde(skip)]
    pub not_after_unix: i64,
    #[serde(skip)]
    pub not_before_unix: i64,
    /// The leaf's serial number, hex.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub serial: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// A certificate chain with its key, ready to serve.
#[derive(Debug, Clone)]
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    pub info: CertInfo,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::files::read_regular(path, crate::files::MAX_REFERENCED_FILE).map_err(|e| {
        TlsError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })
}

/// Reads every certificate of a PEM file.
pub fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_chain(path, &read(path)?)
}

/// Every certificate of PEM text read from `path`.
fn parse_chain(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Chain {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    for der in &chain {
        x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::Chain {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(chain)
}

fn parse_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Key {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Loads a chain and its key and checks that they belong together.
pub fn load_cert(cert_file: &Path, key_file: &Path) -> Result<LoadedCert, TlsError> {
    parse_cert(cert_file, &read(cert_file)?, key_file, &read(key_file)?)
}

/// `load_cert` over contents already read (so that what is served is
/// exactly what was hashed into `config_version`).
pub fn parse_cert(
    cert_file: &Path,
    cert_pem: &[u8],
    key_file: &Path,
    key_pem: &[u8],
) -> Result<LoadedCert, TlsError> {
    let chain = parse_chain(cert_file, cert_pem)?;
    let key_der = parse_key(key_file, key_pem)?;
    let signing_key =
        rustls::crypto::ring::sign::any_supported_type(&key_der).map_err(|e| TlsError::Key {
            path: key_file.to_path_buf(),
            reason: e.to_string(),
        })?;
    let key = CertifiedKey::new(chain, signing_key);
    key.keys_match().map_err(|_| TlsError::Mismatch {
        cert: cert_file.to_path_buf(),
        key: key_file.to_path_buf(),
    })?;
    let info = describe(&key, cert_file, key_file)?;
    Ok(LoadedCert {
        key: Arc::new(key),
        info,
    })
}

fn describe(key: &CertifiedKey, cert_file: &Path, key_file: &Path) -> Result<CertInfo, TlsError> {
    let leaf = key.cert.first().ok_or_else(|| TlsError::NoCertificate {
        path: cert_file.to_path_buf(),
    })?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf).map_err(|e| TlsError::Chain {
        path: cert_file.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut names: Vec<String> = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(name) => {
                        Some(name.to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        names.extend(
            parsed
                .subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    let not_after_unix = parsed.validity().not_after.timestamp();
    let not_before_unix = parsed.validity().not_before.timestamp();
    let serial = parsed.raw_serial_as_string().replace(':', "");
    let not_after = std::time::UNIX_EPOCH
        .checked_add(std::time::Duration::from_secs(
            u64::try_from(not_after_unix).unwrap_or(0),
        ))
        .map(|t| humantime::format_rfc3339_seconds(t).to_string())
        .unwrap_or_default();
    Ok(CertInfo {
        names,
        fingerprint: fingerprint(leaf),
        not_after,
        not_after_unix,
        not_before_unix,
        serial,
        cert_file: cert_file.to_path_buf(),
        key_file: key_file.to_path_buf(),
    })
}

/// `sha256:<hex>` of a certificate's DER.
pub fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(der))
}

/// Reads a CA bundle into a root store.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    parse_roots(path, &read(path)?)
}

pub fn parse_roots(path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for der in parse_chain(path, pem)? {
        roots.add(der).map_err(|e| TlsError::Bundle {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// A verifier of client certificates signed by the bundle at `path`.
pub fn client_verifier(
    path: &Path,
    required: bool,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    parse_client_verifier(path, &read(path)?, required)
}

/// `client_verifier` over a bundle already read.
pub fn parse_client_verifier(
    path: &Path,
    pem: &[u8],
    required: bool,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let roots = Arc::new(parse_roots(path, pem)?);
    let builder = WebPkiClientVerifier::builder_with_provider(roots, crate::tls::provider());
    let builder = if required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder.build().map_err(|e| TlsError::Bundle {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// A verifier of upstream server certificates: the bundle, or the
/// WebPKI roots when none is given.
pub fn server_verifier(ca: Option<&Path>) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    let roots = match ca {
        Some(path) => load_roots(path)?,
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), crate::tls::provider())
        .build()
        .map_err(|e| TlsError::Bundle {
            path: ca.map(Path::to_path_buf).unwrap_or_default(),
            reason: e.to_string(),
        })
}

/// Who a certificate names: its subject (RFC 4514-like, as x509-parser
/// writes it) and its subject alternative names, each with its kind
/// (`DNS:`, `URI:` (a SPIFFE ID is one), `email:`, `IP:`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertNames {
    pub subject: Option<String>,
    pub sans: Vec<String>,
}

/// The names of the certificate `der` (none when it does not parse).
pub fn certificate_names(der: &[u8]) -> CertNames {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return CertNames::default();
    };
    let sans = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|names| {
            names
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some(format!("DNS:{dns}")),
                    GeneralName::URI(uri) => Some(format!("URI:{uri}")),
                    GeneralName::RFC822Name(email) => Some(format!("email:{email}")),
                    GeneralName::IPAddress(bytes) => ip_of(bytes).map(|ip| format!("IP:{ip}")),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    CertNames {
        subject: Some(cert.subject().to_string()),
        sans,
    }
}

/// An address from a certificate's `iPAddress` name (4 or 16 bytes).
fn ip_of(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        _ => None,
    }
}

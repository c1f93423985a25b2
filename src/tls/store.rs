//! The process-shared certificate store and what rustls asks of it.
//!
//! One `ArcSwap<Material>` holds the certificate material of every TLS
//! listener. Each listener's rustls `ServerConfig` is built once, with a
//! [`Resolver`] (SNI → certificate) and a [`ClientAuth`] verifier that both
//! read the current material on every handshake, so swapping the material
//! (reload-certs, activation) changes what new handshakes get, in one step
//! for all listeners, while established sessions keep theirs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use super::material::{client_verifier, load_cert, CertInfo, LoadedCert, TlsError};

/// A TLS listener's certificate configuration (paths resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTlsSpec {
    /// `(cert, key)` pairs; the first is the default for clients without SNI.
    pub certificates: Vec<(PathBuf, PathBuf)>,
    pub client_ca: Option<PathBuf>,
    pub client_auth_required: bool,
}

struct ClientCa {
    verifier: Arc<dyn ClientCertVerifier>,
    required: bool,
}

/// One listener's certificates, indexed for SNI.
pub struct ListenerMaterial {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// Keyed by `.suffix` for `*.suffix` names.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    pub certificates: Vec<CertInfo>,
    client: Option<ClientCa>,
}

impl std::fmt::Debug for ListenerMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerMaterial")
            .field("certificates", &self.certificates)
            .finish()
    }
}

impl ListenerMaterial {
    /// Loads and checks everything a listener's TLS section names.
    pub fn load(spec: &ListenerTlsSpec) -> Result<Self, TlsError> {
        let certificates = spec
            .certificates
            .iter()
            .map(|(cert, key)| load_cert(cert, key))
            .collect::<Result<Vec<_>, _>>()?;
        let client = match &spec.client_ca {
            Some(ca) => Some((
                client_verifier(ca, spec.client_auth_required)?,
                spec.client_auth_required,
            )),
            None => None,
        };
        Ok(Self::assemble(certificates, client))
    }

    /// Indexes loaded certificates by name (the first is the default) and
    /// adds the client verifier with whether it is required.
    pub fn assemble(
        certificates: Vec<LoadedCert>,
        client: Option<(Arc<dyn ClientCertVerifier>, bool)>,
    ) -> Self {
        let mut material = ListenerMaterial {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default: None,
            certificates: Vec::new(),
            client: client.map(|(verifier, required)| ClientCa { verifier, required }),
        };
        for loaded in certificates {
            for name in &loaded.info.names {
                let key = Arc::clone(&loaded.key);
                match name.strip_prefix("*.") {
                    Some(suffix) => material.wildcard.entry(format!(".{suffix}")).or_insert(key),
                    None => material.exact.entry(name.clone()).or_insert(key),
                };
            }
            material
                .default
                .get_or_insert_with(|| Arc::clone(&loaded.key));
            material.certificates.push(loaded.info);
        }
        material
    }

    /// The certificate for an SNI name: exact, then the longest wildcard,
    /// then the default.
    fn pick(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = sni.map(str::to_ascii_lowercase) {
            if let Some(key) = self.exact.get(&name) {
                return Some(Arc::clone(key));
            }
            // A wildcard covers exactly one label.
            if let Some(dot) = name.find('.') {
                if let Some(key) = name.get(dot..).and_then(|suffix| self.wildcard.get(suffix)) {
                    return Some(Arc::clone(key));
                }
            }
        }
        self.default.clone()
    }
}

/// Certificate material of every TLS listener, by listener name.
#[derive(Debug, Default)]
pub struct Material {
    pub listeners: HashMap<String, Arc<ListenerMaterial>>,
}

/// The one swap point for certificate material.
#[derive(Debug, Default)]
pub struct CertStore {
    current: ArcSwap<Material>,
}

impl CertStore {
    pub fn load(&self) -> Arc<Material> {
        self.current.load_full()
    }

    /// Replaces all listeners' material in one step.
    pub fn swap(&self, material: Material) -> Arc<Material> {
        self.current.swap(Arc::new(material))
    }

    fn listener(&self, name: &str) -> Option<Arc<ListenerMaterial>> {
        self.current.load().listeners.get(name).cloned()
    }

    /// The rustls configuration of a TLS listener: TLS 1.2 and 1.3, ALPN
    /// `h2` and `http/1.1`, session resumption by cache and tickets, and
    /// certificates and client verification read from this store.
    pub fn server_config(
        self: &Arc<Self>,
        listener: &str,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(super::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_client_cert_verifier(Arc::new(ClientAuth {
                store: Arc::clone(self),
                listener: listener.to_owned(),
            }))
            .with_cert_resolver(Arc::new(Resolver {
                store: Arc::clone(self),
                listener: listener.to_owned(),
            }));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
        Ok(Arc::new(config))
    }
}

/// SNI → certificate, from the current material.
#[derive(Debug)]
struct Resolver {
    store: Arc<CertStore>,
    listener: String,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.store
            .listener(&self.listener)?
            .pick(hello.server_name())
    }
}

/// Client-certificate verification from the current material: off,
/// optional or required per listener, and swappable like certificates.
#[derive(Debug)]
struct ClientAuth {
    store: Arc<CertStore>,
    listener: String,
}

impl ClientAuth {
    fn verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.store
            .listener(&self.listener)
            .and_then(|m| m.client.as_ref().map(|c| Arc::clone(&c.verifier)))
            .ok_or_else(|| rustls::Error::General("client authentication is not configured".into()))
    }
}

impl ClientCertVerifier for ClientAuth {
    fn offer_client_auth(&self) -> bool {
        self.store
            .listener(&self.listener)
            .is_some_and(|m| m.client.is_some())
    }

    fn client_auth_mandatory(&self) -> bool {
        self.store
            .listener(&self.listener)
            .is_some_and(|m| m.client.as_ref().is_some_and(|c| c.required))
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional; the verifier behind them may change at any time.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verifier()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        super::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

//! The process-shared certificate store and what rustls asks of it.
//!
//! One `ArcSwap<Material>` holds the certificate material of every TLS
//! listener. Each listener's rustls `ServerConfig` is built once, with a
//! [`Resolver`] (SNI → certificate) and a [`ClientAuth`] verifier that both
//! read the current material on every handshake, so swapping the material
//! (reload-certs, activation) changes what new handshakes get, in one step
//! for all listeners, while established sessions keep theirs.
//!
//! The material is tagged with the generation it was loaded for, and the
//! store follows the active generation (an [`ActiveMaterial`]): when the
//! active generation is newer than the stored material, a handshake gets
//! the material that generation was built with. So an activation's
//! certificates take effect with its compare-and-swap, not a moment after
//! it: no handshake pairs the new routes with the old certificates.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use super::material::{client_verifier, load_cert, CertInfo, TlsError};
use super::slot::{AcmeSpec, CertSlot};
use crate::ids::GenerationId;

/// One certificate entry of a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// A chain and its key, read from files (paths resolved).
    Files { cert: PathBuf, key: PathBuf },
    /// Obtained and renewed by cutover (DESIGN §21).
    Acme(Arc<AcmeSpec>),
}

/// A TLS listener's certificate configuration (paths resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTlsSpec {
    /// The first is the default for clients without SNI.
    pub certificates: Vec<CertSource>,
    /// Per entry (aligned with `certificates`): the names it serves
    /// instead of the certificate's own (`"*"`: every other name).
    pub hosts: Vec<Option<Vec<String>>>,
    pub client_ca: Option<PathBuf>,
    pub client_auth_required: bool,
    /// `insecure_fallback`: a certificate that fails verification is let
    /// through as if none had been shown (no identity is taken from it).
    pub client_auth_fallback: bool,
    /// Requests must be for a host of the connection's entry (421).
    pub strict_sni_host: bool,
}

/// A listener's client-certificate verification, as it is built.
pub struct ClientAuthSpec {
    pub verifier: Arc<dyn ClientCertVerifier>,
    pub required: bool,
    /// Let a certificate that fails verification through (no identity).
    pub fallback: bool,
}

struct ClientCa {
    verifier: Arc<dyn ClientCertVerifier>,
    required: bool,
    fallback: bool,
}

/// One listener's certificates, indexed for SNI.
pub struct ListenerMaterial {
    exact: HashMap<String, Arc<CertSlot>>,
    /// Keyed by `.suffix` for `*.suffix` names.
    wildcard: HashMap<String, Arc<CertSlot>>,
    /// In the order of the listener's entries.
    slots: Vec<Arc<CertSlot>>,
    /// The entry of `hosts = ["*"]`, if any: every name no other serves.
    any: Option<Arc<CertSlot>>,
    client: Option<ClientCa>,
    strict_sni_host: bool,
}

impl std::fmt::Debug for ListenerMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerMaterial")
            .field("slots", &self.slots)
            .finish()
    }
}

impl ListenerMaterial {
    /// Loads and checks everything a listener's TLS section names (ACME
    /// entries: the process's slot, whatever it serves now).
    pub fn load(spec: &ListenerTlsSpec) -> Result<Self, TlsError> {
        let certificates = spec
            .certificates
            .iter()
            .map(|source| match source {
                CertSource::Files { cert, key } => load_cert(cert, key).map(CertSlot::fixed),
                CertSource::Acme(acme) => Ok(super::acme_slot(acme, || None)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = match &spec.client_ca {
            Some(ca) => Some(ClientAuthSpec {
                verifier: client_verifier(ca, spec.client_auth_required)?,
                required: spec.client_auth_required,
                fallback: spec.client_auth_fallback,
            }),
            None => None,
        };
        let entries = certificates
            .into_iter()
            .zip(spec.hosts.iter().cloned().chain(std::iter::repeat(None)))
            .collect();
        Ok(Self::assemble(entries, client, spec.strict_sni_host))
    }

    /// Indexes certificate slots by name (the first serving one is the
    /// default) and adds the client verifier with whether it is required.
    /// A file certificate is indexed by the names in it, an ACME one by
    /// the domains it is ordered for.
    pub fn assemble(
        entries: Vec<(Arc<CertSlot>, Option<Vec<String>>)>,
        client: Option<ClientAuthSpec>,
        strict_sni_host: bool,
    ) -> Self {
        let mut material = ListenerMaterial {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            slots: Vec::new(),
            any: None,
            client: client.map(|c| ClientCa {
                verifier: c.verifier,
                required: c.required,
                fallback: c.fallback,
            }),
            strict_sni_host,
        };
        for (slot, hosts) in entries {
            let names = match (hosts, slot.acme(), slot.info()) {
                (Some(hosts), _, _) => hosts,
                (None, Some(acme), _) => acme.domains.clone(),
                (None, None, Some(info)) => info.names,
                (None, None, None) => Vec::new(),
            };
            for name in names {
                if name == "*" {
                    material.any.get_or_insert_with(|| Arc::clone(&slot));
                    continue;
                }
                let held = Arc::clone(&slot);
                match name.strip_prefix("*.") {
                    Some(suffix) => material
                        .wildcard
                        .entry(format!(".{suffix}"))
                        .or_insert(held),
                    None => material.exact.entry(name).or_insert(held),
                };
            }
            material.slots.push(slot);
        }
        material
    }

    /// The certificates served now (an ACME entry not issued yet has none).
    pub fn certificates(&self) -> Vec<CertInfo> {
        self.slots.iter().filter_map(|s| s.info()).collect()
    }

    /// Every entry's slot, in order.
    pub fn slots(&self) -> &[Arc<CertSlot>] {
        &self.slots
    }

    /// The certificate for an SNI name: exact, then the longest wildcard,
    /// then the first entry that serves one.
    fn pick(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        self.entry(sni).and_then(|slot| slot.certified())
    }

    /// The entry serving `name`: exact, then the wildcard (one label),
    /// then the `"*"` entry, then the first entry that serves one.
    fn entry(&self, name: Option<&str>) -> Option<&Arc<CertSlot>> {
        if let Some(name) = name.map(str::to_ascii_lowercase) {
            if let Some(slot) = self.exact.get(&name).filter(|s| s.certified().is_some()) {
                return Some(slot);
            }
            // A wildcard covers exactly one label.
            if let Some(dot) = name.find('.') {
                if let Some(slot) = name
                    .get(dot..)
                    .and_then(|suffix| self.wildcard.get(suffix))
                    .filter(|s| s.certified().is_some())
                {
                    return Some(slot);
                }
            }
        }
        self.any
            .as_ref()
            .filter(|s| s.certified().is_some())
            .or_else(|| self.slots.iter().find(|s| s.certified().is_some()))
    }

    pub fn strict_sni_host(&self) -> bool {
        self.strict_sni_host
    }

    /// Whether a client certificate chain shown on a handshake verifies
    /// against the listener's CA (with `insecure_fallback` a failing one
    /// was let through: it names nobody).
    pub fn client_verified(&self, chain: &[CertificateDer<'_>]) -> bool {
        let (Some(client), Some((end_entity, intermediates))) = (&self.client, chain.split_first())
        else {
            return false;
        };
        client
            .verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .is_ok()
    }

    /// With `insecure_fallback`.
    pub fn client_fallback(&self) -> bool {
        self.client.as_ref().is_some_and(|c| c.fallback)
    }

    /// With `strict_sni_host`: whether a request for `host` on a
    /// connection whose handshake named `sni` belongs to another
    /// certificate entry (RFC 9110 §15.5.20: 421 Misdirected Request).
    /// A connection without SNI is not checked.
    pub fn misdirected(&self, sni: Option<&str>, host: &str) -> bool {
        let Some(sni) = sni else {
            return false;
        };
        if !self.strict_sni_host || sni.eq_ignore_ascii_case(host) {
            return false;
        }
        match (self.entry(Some(sni)), self.entry(Some(host))) {
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The tls-alpn-01 answer for an SNI name (RFC 8737: only the exact
    /// name, never a default).
    fn challenge(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let name = sni?.to_ascii_lowercase();
        self.exact.get(&name)?.challenge(&name)
    }
}

/// ALPN of a tls-alpn-01 validation (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Certificate material of every TLS listener, by listener name.
#[derive(Debug)]
pub struct Material {
    /// The generation it was loaded for (by its activation, or by a
    /// reload-certs while it was active).
    pub generation: GenerationId,
    pub listeners: HashMap<String, Arc<ListenerMaterial>>,
}

impl Default for Material {
    /// No material, older than any generation.
    fn default() -> Self {
        Self {
            generation: GenerationId(0),
            listeners: HashMap::new(),
        }
    }
}

/// The active generation, as far as certificates go.
pub trait ActiveMaterial: Send + Sync {
    /// The active generation's id and the material it was built with for
    /// `listener`.
    fn active_material(&self, listener: &str) -> (GenerationId, Option<Arc<ListenerMaterial>>);
}

/// The one swap point for certificate material.
#[derive(Default)]
pub struct CertStore {
    current: ArcSwap<Material>,
    /// Consulted on every handshake once set (see the module comment).
    active: std::sync::OnceLock<Arc<dyn ActiveMaterial>>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl CertStore {
    pub fn load(&self) -> Arc<Material> {
        self.current.load_full()
    }

    /// Replaces all listeners' material in one step.
    pub fn swap(&self, material: Material) -> Arc<Material> {
        self.current.swap(Arc::new(material))
    }

    /// Follows the active generation from now on.
    pub fn follow(&self, active: Arc<dyn ActiveMaterial>) {
        let _ = self.active.set(active);
    }

    /// The material handshakes on `listener` get now.
    pub fn serving(&self, listener: &str) -> Option<Arc<ListenerMaterial>> {
        self.listener(listener)
    }

    /// What a handshake on `name` gets: the stored material, unless the
    /// active generation is newer than it (committed, not yet installed).
    fn listener(&self, name: &str) -> Option<Arc<ListenerMaterial>> {
        let stored = self.current.load();
        if let Some(active) = self.active.get() {
            let (generation, own) = active.active_material(name);
            if generation > stored.generation {
                return own;
            }
        }
        stored.listeners.get(name).cloned()
    }

    /// The rustls configuration of a TLS listener: TLS 1.2 and 1.3, ALPN
    /// `h2` and `http/1.1`, session resumption by cache and tickets, and
    /// certificates and client verification read from this store.
    pub fn server_config(
        self: &Arc<Self>,
        listener: &str,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        self.server_config_for(listener, false, false)
    }

    /// The same for HTTP/3 on the listener: TLS 1.3 only (QUIC), ALPN
    /// `h3`; early data (0-RTT) only with `early_data`.
    pub fn quic_server_config(
        self: &Arc<Self>,
        listener: &str,
        early_data: bool,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        self.server_config_for(listener, true, early_data)
    }

    fn server_config_for(
        self: &Arc<Self>,
        listener: &str,
        quic: bool,
        early_data: bool,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        let versions: &[&rustls::SupportedProtocolVersion] = if quic {
            &[&rustls::version::TLS13]
        } else {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        };
        let mut config = ServerConfig::builder_with_provider(super::provider())
            .with_protocol_versions(versions)?
            .with_client_cert_verifier(Arc::new(ClientAuth {
                store: Arc::clone(self),
                listener: listener.to_owned(),
            }))
            .with_cert_resolver(Arc::new(Resolver {
                store: Arc::clone(self),
                listener: listener.to_owned(),
            }));
        config.alpn_protocols = if quic {
            vec![b"h3".to_vec()]
        } else {
            // `acme-tls/1` last: only a validation offering it alone gets it.
            vec![b"h2".to_vec(), b"http/1.1".to_vec(), ACME_TLS_ALPN.to_vec()]
        };
        if early_data {
            // rustls accepts early data only on sessions it can take out
            // of its own cache (each at most once): no tickets then. QUIC
            // takes 0 or all: its stream limits bound early data.
            config.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
            config.max_early_data_size = u32::MAX;
        } else {
            config.ticketer = rustls::crypto::ring::Ticketer::new()?;
            config.max_early_data_size = 0;
        }
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
        let material = self.store.listener(&self.listener)?;
        let validation = hello
            .alpn()
            .is_some_and(|mut offered| offered.any(|p| p == ACME_TLS_ALPN));
        if validation {
            // A validation gets its challenge certificate or nothing.
            return material.challenge(hello.server_name());
        }
        material.pick(hello.server_name())
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
        let verified = self
            .verifier()?
            .verify_client_cert(end_entity, intermediates, now);
        let fallback = self
            .store
            .listener(&self.listener)
            .is_some_and(|m| m.client_fallback());
        match verified {
            // `insecure_fallback`: served as a client without a
            // certificate (TlsInfo takes no identity from it).
            Err(_) if fallback => Ok(ClientCertVerified::assertion()),
            other => other,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Active {
        generation: Mutex<GenerationId>,
        own: Arc<ListenerMaterial>,
    }

    impl ActiveMaterial for Active {
        fn active_material(&self, _: &str) -> (GenerationId, Option<Arc<ListenerMaterial>>) {
            let generation = *self.generation.lock().unwrap_or_else(|e| e.into_inner());
            (generation, Some(Arc::clone(&self.own)))
        }
    }

    fn material(generation: u64, listener: &Arc<ListenerMaterial>) -> Material {
        Material {
            generation: GenerationId(generation),
            listeners: [("secure".to_owned(), Arc::clone(listener))].into(),
        }
    }

    #[test]
    fn a_committed_generation_serves_its_certificates_before_they_are_installed() {
        let empty = || Arc::new(ListenerMaterial::assemble(Vec::new(), None, false));
        let (old, new, reloaded) = (empty(), empty(), empty());
        let store = CertStore::default();
        store.swap(material(1, &old));
        let active = Arc::new(Active {
            generation: Mutex::new(GenerationId(1)),
            own: Arc::clone(&new),
        });
        store.follow(Arc::clone(&active) as Arc<dyn ActiveMaterial>);
        let served = |store: &CertStore| store.listener("secure").expect("material");
        assert!(Arc::ptr_eq(&served(&store), &old));
        // Generation 2 is committed; its material is not installed yet.
        *active.generation.lock().unwrap_or_else(|e| e.into_inner()) = GenerationId(2);
        assert!(
            Arc::ptr_eq(&served(&store), &new),
            "the old certificate in the window"
        );
        // A reload-certs while 2 is active: the stored material wins again.
        store.swap(material(2, &reloaded));
        assert!(Arc::ptr_eq(&served(&store), &reloaded));
    }
}

//! TLS: certificate material, the process-shared certificate store, and
//! upstream client configuration. A leaf module: it knows rustls and files,
//! nothing of the configuration format or generations.

mod client;
mod material;
mod slot;
#[cfg(test)]
pub(crate) use slot::tests as slot_tests;
mod store;

use std::sync::Arc;

pub use client::{client_config, own_client, OwnClient, UpstreamTlsSpec};
pub use material::{
    certificate_names, client_verifier, fingerprint, load_cert, load_roots, parse_cert,
    parse_client_verifier, parse_roots, read_chain, CertInfo, CertNames, LoadedCert, TlsError,
};
pub use slot::{
    acme_slot, http01_answer, http01_waiting, responder, set_http01, AcmeSpec, CertSlot, Challenge,
    Eab, OcspTarget, Staple,
};
pub use store::{
    ActiveMaterial, CertSource, CertStore, ClientAuthSpec, ListenerMaterial, ListenerTlsSpec,
    Material, ACME_TLS_ALPN,
};

/// The one crypto provider cutover uses (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

//! What a listener serves for one certificate entry: a [`CertSlot`],
//! swappable without a generation, so that an OCSP staple (files and
//! ACME) or a renewal (ACME) changes what new handshakes get in one step.
//!
//! ACME slots are process-shared: every listener and every generation
//! naming the same `acme` entry holds the same slot (a weak map here), so
//! an activation that keeps the entry keeps its certificate, its renewal
//! schedule and its staple, and two listeners asking for the same domains
//! share one order. The challenge answers (tls-alpn-01 certificates,
//! http-01 key authorizations) are kept here too, where the handshake and
//! the plain-HTTP path read them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::sign::CertifiedKey;
use rustls_pki_types::CertificateDer;

use super::material::{CertInfo, LoadedCert};

/// An ACME challenge type cutover answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Challenge {
    /// Answered by the TLS listener itself (ALPN `acme-tls/1`).
    TlsAlpn01,
    /// Answered at `/.well-known/acme-challenge/` on `http` listeners.
    Http01,
}

impl Challenge {
    pub fn name(self) -> &'static str {
        match self {
            Challenge::TlsAlpn01 => "tls-alpn-01",
            Challenge::Http01 => "http-01",
        }
    }
}

/// External account binding: the CA's key id and the file holding the
/// base64url HMAC key (read when an account is made, never logged).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Eab {
    pub kid: String,
    pub hmac_file: PathBuf,
}

/// An `acme` certificate entry, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcmeSpec {
    /// Lower-case, sorted, without duplicates; the first names the files.
    pub domains: Vec<String>,
    pub directory: String,
    pub email: Option<String>,
    pub challenge: Challenge,
    /// Roots that verify the ACME server (a private or test CA); the
    /// WebPKI roots otherwise.
    pub ca_root: Option<PathBuf>,
    pub eab: Option<Eab>,
    /// Renew this long before expiry; a third of the lifetime when unset.
    pub renew_before: Option<Duration>,
    /// `runtime.state_dir`: where the account and certificates are kept.
    pub state_dir: PathBuf,
}

/// An OCSP staple: the DER of a response and when it says it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Staple {
    pub der: Arc<[u8]>,
    /// Unix seconds.
    pub this_update: i64,
    pub next_update: i64,
    /// When it was fetched (Unix seconds).
    pub fetched: i64,
    /// `good`, `revoked` or `unknown`.
    pub status: &'static str,
}

impl Staple {
    /// When half of its validity is gone: time to ask again.
    pub fn refresh_at(&self) -> i64 {
        self.this_update + (self.next_update - self.this_update) / 2
    }
}

/// What an OCSP request for a slot's certificate needs.
#[derive(Debug, Clone)]
pub struct OcspTarget {
    pub url: String,
    pub leaf: CertificateDer<'static>,
    pub issuer: CertificateDer<'static>,
    pub fingerprint: String,
}

/// What the certificate keeper last noted of a slot, for status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotNotes {
    /// The last ACME order's failure, until one succeeds.
    pub acme_error: Option<String>,
    /// When the next order is tried after it (Unix seconds).
    pub acme_retry_at: Option<i64>,
    /// The last OCSP fetch's failure, until one succeeds.
    pub ocsp_error: Option<String>,
}

#[derive(Default)]
struct Inner {
    notes: SlotNotes,
    bare: Option<Arc<CertifiedKey>>,
    info: Option<CertInfo>,
    ocsp: Option<OcspTarget>,
    /// The responder named in the leaf, when the chain has no issuer to
    /// ask about it with (reported, never fetched).
    ocsp_unusable: Option<String>,
    staple: Option<Staple>,
}

/// One certificate entry of a listener.
pub struct CertSlot {
    /// The certificate with its staple, as handshakes get it.
    served: ArcSwapOption<CertifiedKey>,
    inner: Mutex<Inner>,
    acme: Option<AcmeSlot>,
}

impl std::fmt::Debug for CertSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertSlot")
            .field("info", &self.info())
            .field("acme", &self.acme.as_ref().map(|a| &a.spec.domains))
            .finish()
    }
}

/// An ACME slot's own part.
pub struct AcmeSlot {
    pub spec: AcmeSpec,
    /// tls-alpn-01 answers, by domain, while an order waits for them.
    challenges: ArcSwap<HashMap<String, Arc<CertifiedKey>>>,
}

impl CertSlot {
    /// A certificate read from files.
    pub fn fixed(loaded: LoadedCert) -> Arc<Self> {
        let slot = Arc::new(Self {
            served: ArcSwapOption::empty(),
            inner: Mutex::default(),
            acme: None,
        });
        slot.install(loaded);
        slot
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a handshake gets (none while an ACME certificate is not
    /// issued yet).
    pub fn certified(&self) -> Option<Arc<CertifiedKey>> {
        self.served.load_full()
    }

    pub fn info(&self) -> Option<CertInfo> {
        self.inner().info.clone()
    }

    pub fn acme(&self) -> Option<&AcmeSpec> {
        self.acme.as_ref().map(|a| &a.spec)
    }

    /// Serves `loaded` from now on (an issuance or a renewal): a staple of
    /// the previous certificate goes with it.
    pub fn install(&self, loaded: LoadedCert) {
        let mut inner = self.inner();
        let (ocsp, unusable) = ocsp_target(&loaded);
        inner.ocsp = ocsp;
        inner.ocsp_unusable = unusable;
        inner.staple = None;
        inner.info = Some(loaded.info);
        inner.bare = Some(Arc::clone(&loaded.key));
        self.served.store(Some(loaded.key));
    }

    pub fn notes(&self) -> SlotNotes {
        self.inner().notes.clone()
    }

    pub fn note(&self, change: impl FnOnce(&mut SlotNotes)) {
        change(&mut self.inner().notes);
    }

    /// Where to ask for this certificate's OCSP status, if its leaf names
    /// a responder and the chain holds its issuer.
    pub fn ocsp_target(&self) -> Option<OcspTarget> {
        self.inner().ocsp.clone()
    }

    /// The responder a leaf names that cannot be asked (no issuer in the
    /// chain).
    pub fn ocsp_unusable(&self) -> Option<String> {
        self.inner().ocsp_unusable.clone()
    }

    pub fn staple(&self) -> Option<Staple> {
        self.inner().staple.clone()
    }

    /// Staples `staple` to the certificate whose fingerprint is
    /// `fingerprint` (nothing when the slot serves another one by now),
    /// or takes the staple off (`None`).
    pub fn set_staple(&self, fingerprint: &str, staple: Option<Staple>) {
        let mut inner = self.inner();
        let current = inner.info.as_ref().map(|i| i.fingerprint.as_str());
        if current != Some(fingerprint) || inner.staple == staple {
            return;
        }
        let Some(bare) = inner.bare.clone() else {
            return;
        };
        let served = match &staple {
            Some(staple) => Arc::new(CertifiedKey {
                cert: bare.cert.clone(),
                key: Arc::clone(&bare.key),
                ocsp: Some(staple.der.to_vec()),
            }),
            None => bare,
        };
        inner.staple = staple;
        self.served.store(Some(served));
    }

    /// The tls-alpn-01 certificate for `domain`, while an order waits.
    pub fn challenge(&self, domain: &str) -> Option<Arc<CertifiedKey>> {
        self.acme.as_ref()?.challenges.load().get(domain).cloned()
    }

    /// Sets (or with `None` clears) the tls-alpn-01 answer for `domain`.
    pub fn set_challenge(&self, domain: &str, key: Option<Arc<CertifiedKey>>) {
        let Some(acme) = &self.acme else {
            return;
        };
        acme.challenges.rcu(|map| {
            let mut map = HashMap::clone(map);
            match &key {
                Some(key) => map.insert(domain.to_owned(), Arc::clone(key)),
                None => map.remove(domain),
            };
            map
        });
    }
}

/// The responder URL of a leaf, with the issuer to ask about it.
fn ocsp_target(loaded: &LoadedCert) -> (Option<OcspTarget>, Option<String>) {
    let Some(leaf) = loaded.key.cert.first() else {
        return (None, None);
    };
    let Some(url) = responder(leaf) else {
        return (None, None);
    };
    match loaded.key.cert.get(1) {
        Some(issuer) => (
            Some(OcspTarget {
                url,
                leaf: leaf.clone().into_owned(),
                issuer: issuer.clone().into_owned(),
                fingerprint: loaded.info.fingerprint.clone(),
            }),
            None,
        ),
        None => (None, Some(url)),
    }
}

/// The first `http` OCSP responder of a certificate's Authority
/// Information Access.
pub fn responder(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    cert.extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::AuthorityInfoAccess(aia) => {
                aia.accessdescs.iter().find_map(|d| {
                    match (&d.access_location, d.access_method.to_id_string().as_str()) {
                        (GeneralName::URI(uri), "1.3.6.1.5.5.7.48.1")
                            if uri.starts_with("http://") =>
                        {
                            Some((*uri).to_owned())
                        }
                        _ => None,
                    }
                })
            }
            _ => None,
        })
}

type AcmeSlots = Mutex<HashMap<AcmeSpec, Weak<CertSlot>>>;

fn acme_slots() -> &'static AcmeSlots {
    static SLOTS: OnceLock<AcmeSlots> = OnceLock::new();
    SLOTS.get_or_init(Mutex::default)
}

/// The process's slot for an `acme` entry: the one every listener and
/// generation naming it holds. A new slot starts with the certificate
/// stored for its domains, when one is there and still valid (`stored`
/// reads it: a restart serves at once, without ordering).
pub fn acme_slot(spec: &AcmeSpec, stored: impl FnOnce() -> Option<LoadedCert>) -> Arc<CertSlot> {
    let existing = || {
        acme_slots()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(spec)
            .and_then(Weak::upgrade)
    };
    if let Some(slot) = existing() {
        return slot;
    }
    // The files are read outside the lock.
    let loaded = stored();
    let mut slots = acme_slots().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(slot) = slots.get(spec).and_then(Weak::upgrade) {
        return slot;
    }
    slots.retain(|_, slot| slot.strong_count() > 0);
    let slot = Arc::new(CertSlot {
        served: ArcSwapOption::empty(),
        inner: Mutex::default(),
        acme: Some(AcmeSlot {
            spec: spec.clone(),
            challenges: ArcSwap::default(),
        }),
    });
    if let Some(loaded) = loaded {
        slot.install(loaded);
    }
    slots.insert(spec.clone(), Arc::downgrade(&slot));
    slot
}

type Tokens = ArcSwap<HashMap<String, Arc<str>>>;

fn http01_tokens() -> &'static Tokens {
    static TOKENS: OnceLock<Tokens> = OnceLock::new();
    TOKENS.get_or_init(ArcSwap::default)
}

/// The key authorization for an http-01 `token`, while an order waits
/// for it.
pub fn http01_answer(token: &str) -> Option<Arc<str>> {
    http01_tokens().load().get(token).cloned()
}

/// How many http-01 answers wait: the request path reads this (one
/// relaxed load) before it looks further.
static HTTP01_WAITING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets (or with `None` clears) the http-01 answer for `token`.
pub fn set_http01(token: &str, answer: Option<&str>) {
    let previous = http01_tokens().rcu(|map| {
        let mut map = HashMap::clone(map);
        match answer {
            Some(answer) => map.insert(token.to_owned(), Arc::from(answer)),
            None => map.remove(token),
        };
        map
    });
    let had = usize::from(previous.contains_key(token));
    let has = usize::from(answer.is_some());
    if has > had {
        HTTP01_WAITING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    } else if had > has {
        HTTP01_WAITING.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether any http-01 answer is waiting.
pub fn http01_waiting() -> bool {
    HTTP01_WAITING.load(std::sync::atomic::Ordering::Relaxed) != 0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A CA and a leaf it signs for `name`, the leaf naming `responder`
    /// as its OCSP responder when given: (chain PEM with the CA, key PEM).
    pub(crate) fn chain(name: &str, responder: Option<&str>) -> (String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        if let Some(url) = responder {
            // AuthorityInfoAccess { ocsp: uniformResourceIdentifier }
            let oid = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01];
            let mut location = vec![0x86, u8::try_from(url.len()).unwrap()];
            location.extend_from_slice(url.as_bytes());
            let mut description = vec![0x30, u8::try_from(oid.len() + location.len()).unwrap()];
            description.extend_from_slice(&oid);
            description.extend_from_slice(&location);
            let mut content = vec![0x30, u8::try_from(description.len()).unwrap()];
            content.extend_from_slice(&description);
            leaf.custom_extensions = vec![rcgen::CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 5, 5, 7, 1, 1],
                content,
            )];
        }
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        (cert.pem() + &ca_cert.pem(), key.serialize_pem())
    }

    pub(crate) fn loaded(name: &str, responder: Option<&str>) -> LoadedCert {
        let (cert, key) = chain(name, responder);
        let path = std::path::Path::new("test.pem");
        crate::tls::parse_cert(path, cert.as_bytes(), path, key.as_bytes()).unwrap()
    }

    fn staple(der: &[u8]) -> Staple {
        Staple {
            der: der.into(),
            this_update: 0,
            next_update: 100,
            fetched: 0,
            status: "good",
        }
    }

    #[test]
    fn a_staple_goes_to_the_certificate_it_is_for_and_leaves_with_it() {
        let first = loaded("a.example", Some("http://127.0.0.1:9/ocsp"));
        let fingerprint = first.info.fingerprint.clone();
        let slot = CertSlot::fixed(first);
        let target = slot.ocsp_target().expect("the leaf names a responder");
        assert_eq!(target.url, "http://127.0.0.1:9/ocsp");
        assert_eq!(target.fingerprint, fingerprint);
        slot.set_staple("sha256:another", Some(staple(b"other")));
        assert!(
            slot.certified().unwrap().ocsp.is_none(),
            "not its certificate"
        );
        slot.set_staple(&fingerprint, Some(staple(b"response")));
        assert_eq!(
            slot.certified().unwrap().ocsp.as_deref(),
            Some(&b"response"[..])
        );
        slot.set_staple(&fingerprint, None);
        assert!(slot.certified().unwrap().ocsp.is_none(), "taken off");
        // A renewal: the old staple is not the new certificate's.
        slot.set_staple(&fingerprint, Some(staple(b"response")));
        slot.install(loaded("a.example", None));
        assert!(slot.staple().is_none());
        assert!(slot.certified().unwrap().ocsp.is_none());
        assert!(slot.ocsp_target().is_none());
    }

    #[test]
    fn a_responder_without_the_issuer_in_the_chain_is_reported_not_asked() {
        let (cert, key) = chain("a.example", Some("http://127.0.0.1:9/"));
        let leaf_only: String = cert
            .split_inclusive("-----END CERTIFICATE-----\n")
            .next()
            .unwrap()
            .to_owned();
        let path = std::path::Path::new("test.pem");
        let slot = CertSlot::fixed(
            crate::tls::parse_cert(path, leaf_only.as_bytes(), path, key.as_bytes()).unwrap(),
        );
        assert!(slot.ocsp_target().is_none());
        assert_eq!(slot.ocsp_unusable().as_deref(), Some("http://127.0.0.1:9/"));
    }

    fn spec(domain: &str) -> AcmeSpec {
        AcmeSpec {
            domains: vec![domain.to_owned()],
            directory: "https://acme.example/dir".to_owned(),
            email: None,
            challenge: Challenge::TlsAlpn01,
            ca_root: None,
            eab: None,
            renew_before: None,
            state_dir: PathBuf::from("/nonexistent"),
        }
    }

    #[test]
    fn one_acme_entry_is_one_slot_while_anything_holds_it() {
        let a = acme_slot(&spec("slot-a.example"), || None);
        let again = acme_slot(&spec("slot-a.example"), || panic!("not read again"));
        assert!(Arc::ptr_eq(&a, &again));
        let b = acme_slot(&spec("slot-b.example"), || None);
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(a.certified().is_none(), "nothing issued yet");
        // tls-alpn-01 answers, by domain.
        let answer = Arc::clone(&loaded("slot-a.example", None).key);
        a.set_challenge("slot-a.example", Some(answer));
        assert!(again.challenge("slot-a.example").is_some());
        a.set_challenge("slot-a.example", None);
        assert!(a.challenge("slot-a.example").is_none());
        drop((a, again));
        let stored = loaded("slot-a.example", None);
        let fingerprint = stored.info.fingerprint.clone();
        let fresh = acme_slot(&spec("slot-a.example"), || Some(stored));
        assert_eq!(
            fresh.info().unwrap().fingerprint,
            fingerprint,
            "made anew, from state_dir"
        );
    }

    #[test]
    fn http_01_answers_come_and_go() {
        set_http01("unit-token", Some("unit-token.thumbprint"));
        assert!(http01_waiting());
        assert_eq!(
            http01_answer("unit-token").as_deref(),
            Some("unit-token.thumbprint")
        );
        set_http01("unit-token", None);
        assert!(http01_answer("unit-token").is_none());
    }
}

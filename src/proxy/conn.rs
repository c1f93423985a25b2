//! What one downstream connection is, for every request on it and every
//! step of their path: its [`ConnContext`] (listener, client, TLS, what
//! moves on it), what its TCP side advertises while HTTP/3 serves
//! ([`AltSvc`]), when a connection pinned to a superseded generation
//! must end ([`pinned_age_expired`]), and the count of open work drain
//! waits for ([`OpenWork`], [`Lingering`]). A leaf below the request path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
use http::uri::Scheme;
use metrics::Counter;
use tokio::sync::{watch, Notify};

use super::activity::Activity;
use super::interim::InterimQueue;
use crate::admission::Admission;
use crate::ids::GenerationId;
use crate::runtime::GenerationStore;
use crate::telemetry::metrics as m;

/// What every request on one downstream connection shares.
pub struct ConnContext {
    pub listener: Arc<str>,
    pub admission: Admission,
    pub remote: SocketAddr,
    /// Where the client connected (for a PROXY header to a backend).
    pub local: SocketAddr,
    /// The client IP as an `X-Forwarded-For` value, formatted once.
    pub client_ip: HeaderValue,
    pub scheme: Scheme,
    pub responses: Arc<[Counter; 5]>,
    /// Set for the whole listener set when draining begins.
    pub draining: Arc<AtomicBool>,
    /// What moves on the connection, for its timeouts.
    pub activity: Arc<Activity>,
    /// Backends' 1xx responses on their way to an HTTP/1.1 client.
    pub interim: Arc<InterimQueue>,
    /// On the TCP side of a listener that also serves HTTP/3: what
    /// responses advertise while it does.
    pub alt_svc: Option<Arc<AltSvc>>,
    /// What the TLS handshake said (HTTPS connections), for templates.
    pub tls: std::sync::OnceLock<TlsInfo>,
    /// For a tunnel the connection switches to: drain waits for it, and
    /// ends it at the drain deadline.
    pub lingering: Arc<Lingering>,
}

/// How many units of work drain waits for are open, and who waits.
#[derive(Default)]
pub struct OpenConnections {
    pub count: AtomicUsize,
    pub idle: Notify,
}

/// Counts work that drain waits for besides connections (a `udp`
/// listener's sessions, HTTP/3 connections, tunnels).
#[derive(Clone)]
pub struct OpenWork(pub Arc<OpenConnections>);

/// One unit of open work, until dropped.
pub struct OpenHold(Arc<OpenConnections>);

/// What outlives the request that opened it (a tunnel after a protocol
/// switch, an L4 relay) needs to be drained: a hold on open work, so
/// drain waits for it, and the drain deadline, when it must end.
pub struct Lingering {
    pub open: OpenWork,
    /// What the deadline waits for once it has passed.
    pub ended_at_cut: OpenWork,
    pub cut: watch::Receiver<bool>,
}

impl OpenWork {
    pub fn hold(&self) -> OpenHold {
        self.0.count.fetch_add(1, Ordering::AcqRel);
        OpenHold(Arc::clone(&self.0))
    }
}

impl Drop for OpenHold {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// An HTTPS connection's server name and client certificate.
#[derive(Debug, Default)]
pub struct TlsInfo {
    pub sni: Option<String>,
    /// The client certificate's subject (RFC 4514) and `sha256:` of its
    /// DER, when one was presented.
    pub client_subject: Option<String>,
    /// Its subject alternative names (`DNS:…`, `IP:…`, `URI:…`,
    /// `email:…`, comma-separated).
    pub client_san: Option<String>,
    pub client_fingerprint: Option<String>,
    /// The listener's certificates as the handshake saw them, kept when
    /// its `strict_sni_host` asks every request to be checked.
    pub strict: Option<Arc<crate::tls::ListenerMaterial>>,
}

impl TlsInfo {
    pub fn of(
        connection: &rustls::ServerConnection,
        material: Option<Arc<crate::tls::ListenerMaterial>>,
    ) -> Self {
        let chain = connection.peer_certificates().unwrap_or_default();
        // With `insecure_fallback` a failing certificate was let through:
        // it names nobody.
        let trusted = match &material {
            Some(m) if m.client_fallback() => m.client_verified(chain),
            _ => true,
        };
        let mut info =
            Self::from_parts(connection.server_name(), chain.first().filter(|_| trusted));
        info.strict = material.filter(|m| m.strict_sni_host());
        info
    }

    /// Whether a request for `host` belongs to another certificate
    /// entry than this connection's (421).
    pub fn misdirected(&self, host: &str) -> bool {
        self.strict
            .as_ref()
            .is_some_and(|m| m.misdirected(self.sni.as_deref(), host))
    }

    pub fn from_parts(
        sni: Option<&str>,
        client: Option<&rustls::pki_types::CertificateDer<'_>>,
    ) -> Self {
        let names = client.map(|der| crate::tls::certificate_names(der));
        let subject = names.as_ref().and_then(|n| n.subject.clone());
        let san = names
            .as_ref()
            .filter(|n| !n.sans.is_empty())
            .map(|n| n.sans.join(","));
        TlsInfo {
            sni: sni.map(str::to_owned),
            client_subject: subject,
            client_san: san,
            client_fingerprint: client.map(|der| crate::tls::fingerprint(der)),
            strict: None,
        }
    }
}

/// The `X-Forwarded-For` value for a client address.
pub fn client_ip_header(remote: SocketAddr) -> HeaderValue {
    let mut text = Vec::with_capacity(15);
    crate::telemetry::access::push_ip(&mut text, remote.ip());
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text))
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Per-listener response counters, registered once per listener.
pub fn listener_counters(listener: &str) -> Arc<[Counter; 5]> {
    let listener = listener.to_owned();
    Arc::new(m::CLASSES.map(|class| {
        metrics::counter!(m::LISTENER_REQUESTS, m::LABEL_LISTENER => listener.clone(), m::LABEL_CLASS => class)
    }))
}

/// What the TCP side of the listener advertises while HTTP/3 serves.
#[derive(Debug)]
pub struct AltSvc {
    value: HeaderValue,
    serving: AtomicBool,
}

impl AltSvc {
    pub fn new(port: u16) -> Arc<Self> {
        let value = HeaderValue::from_str(&format!("h3=\":{port}\"; ma=86400"))
            .unwrap_or_else(|_| HeaderValue::from_static("clear"));
        Arc::new(Self {
            value,
            serving: AtomicBool::new(false),
        })
    }

    /// HTTP/3 starts (`true`) or stops serving.
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    /// The header value, while HTTP/3 is serving.
    pub fn current(&self) -> Option<&HeaderValue> {
        self.serving.load(Ordering::Relaxed).then_some(&self.value)
    }
}

/// Completes when generation `pinned` has been superseded for longer than
/// the `max_pinned_age` of the newest generation; never when that is off.
pub async fn pinned_age_expired(store: &GenerationStore, pinned: GenerationId) {
    let mut active = store.subscribe();
    if active.wait_for(|id| *id != pinned).await.is_err() {
        return std::future::pending().await;
    }
    // From the moment it was superseded, not from when this watcher
    // started (a streaming response starts watching the first time it
    // waits, which may be long after).
    let superseded_at = store
        .superseded_at(pinned)
        .map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std);
    loop {
        let max_age: Option<Duration> = store.load_full().spec.runtime.max_pinned_age;
        match max_age {
            Some(age) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(superseded_at + age) => return,
                    changed = active.changed() => if changed.is_err() { return std::future::pending().await },
                }
            }
            None => {
                if active.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigText;
    use crate::generation::{build, SharedState};

    #[test]
    fn the_forwarded_client_address_is_the_ip_without_the_port() {
        for (addr, value) in [
            ("192.0.2.7:50123", "192.0.2.7"),
            ("[2001:db8::17]:443", "2001:db8::17"),
        ] {
            let addr: SocketAddr = addr.parse().expect("address");
            assert_eq!(client_ip_header(addr).to_str().ok(), Some(value));
        }
    }

    #[tokio::test]
    async fn pinned_age_counts_from_supersession_not_from_watching() {
        let shared = SharedState::default();
        let generation = |id| {
            let text = "[runtime]\nmax_pinned_age = \"400ms\"\n";
            let spec = crate::plan::validate(&ConfigText::inline(text.into(), ".".into(), "<t>"))
                .unwrap_or_else(|e| panic!("{e:?}"));
            build(Arc::new(spec), GenerationId(id), &shared).expect("builds")
        };
        let store = GenerationStore::new(generation(1));
        // A connection pinned to generation 1 keeps its ledger alive.
        let pinned = store.load_full().ledger.connection();
        store
            .commit(GenerationId(1), generation(2), None)
            .expect("commits");
        // Something that starts watching 300 ms after the supersession...
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        pinned_age_expired(&store, GenerationId(1)).await;
        // ... has about 100 ms left, not 400.
        let waited = started.elapsed();
        assert!(waited < Duration::from_millis(250), "{waited:?}");
        drop(pinned);
    }
}

//! Listeners: bound sockets that outlive generations, and their accept loops.
//!
//! By job: `bind.rs` binds or adopts sockets, `accept.rs` runs the accept
//! loops and hands each connection to what serves it, `serve.rs` serves an
//! HTTP connection; this file is the set that holds them and starts the
//! fronts (accept loops, HTTP/3, UDP).
//!
//! The [`ListenerSet`] is process-shared. Activation binds the listeners a
//! candidate adds *before* the swap (`bind_new`, all or nothing) and starts
//! their accept loops after it (`start`). Each accepted connection is served
//! by hyper's auto builder (HTTP/1.1, or h2c with prior knowledge) with the
//! limits the active generation sets for its listener; each request on it
//! pins the generation active when its head arrived.

pub(super) mod accept;
mod bind;
mod serve;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::conn::AltSvc;
use super::h3;
use super::steering::{HandedGroup, InheritedGroup, QuicGroup};
use super::udp;
use super::workers::Workers;
use crate::admission::Admission;
use crate::plan::{ListenerProtocol, ListenerSpec};
use crate::tls::CertStore;
use accept::Gate;
use bind::{adopt_socket, bind_socket, protocol_name};
pub use bind::{BindError, BoundListener, ListenerSocket};

/// A listener as reported by status and activation responses.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListenerInfo {
    pub name: String,
    /// The configured bind.
    pub bind: SocketAddr,
    /// The address actually bound (differs from `bind` for port 0).
    pub address: SocketAddr,
    pub protocol: Cow<'static, str>,
    pub state: Cow<'static, str>,
    /// Listeners with `http3`: `serving`, or `waiting` (the UDP port is
    /// not bound yet, or no longer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http3: Option<Cow<'static, str>>,
}

struct RunningListener {
    spec: ListenerSpec,
    local_addr: SocketAddr,
    /// Kept for a socket hand-over; released when draining so that new
    /// connection attempts are refused once the accept loops have stopped.
    sockets: Vec<ListenerSocket>,
    /// With `http3`: what its TCP side advertises while HTTP/3 serves.
    alt_svc: Option<Arc<AltSvc>>,
    /// With `http3`: its UDP group once bound, for a hand-over.
    quic: Arc<Mutex<Option<QuicGroup>>>,
}

/// A listening socket as a drain-aware restart hands it over.
pub struct ListeningSocket {
    pub name: String,
    pub bind: SocketAddr,
    pub socket: ListenerSocket,
}

/// Every listener of the process.
pub struct ListenerSet {
    /// What the accept loops and fronts share with the set.
    gate: Arc<Gate>,
    certificates: Arc<CertStore>,
    running: Mutex<BTreeMap<String, RunningListener>>,
    /// Sockets handed over by the previous process, by listener name and
    /// configured bind (a TCP listener's whole group); adopted instead of
    /// bound.
    inherited: Mutex<BTreeMap<(String, SocketAddr), Vec<std::os::fd::OwnedFd>>>,
    /// UDP groups handed over by the previous process, by listener name
    /// and the address they are bound to; served instead of bound.
    inherited_quic: Mutex<BTreeMap<(String, SocketAddr), InheritedGroup>>,
}

/// A listener's UDP group as a drain-aware upgrade hands it over.
pub struct HandedQuic {
    pub name: String,
    /// The address the group is bound to.
    pub address: SocketAddr,
    pub group: HandedGroup,
}

impl ListenerSet {
    /// A listener set whose connections are served by `workers`, or by
    /// the calling runtime when there are none.
    pub fn new(
        admission: Admission,
        certificates: Arc<CertStore>,
        workers: Option<Arc<Workers>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            gate: Arc::new(Gate::new(admission, workers)),
            certificates,
            running: Mutex::new(BTreeMap::new()),
            inherited: Mutex::new(BTreeMap::new()),
            inherited_quic: Mutex::new(BTreeMap::new()),
        })
    }

    /// Binds every listener in `specs` that is not running yet. All or
    /// nothing: when one bind fails, the sockets bound so far are closed.
    pub fn bind_new(&self, specs: &[ListenerSpec]) -> Result<Vec<BoundListener>, BindError> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let mut inherited = self
            .inherited
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = self.gate.workers.as_ref().map_or(1, |w| w.threads());
        specs
            .iter()
            .filter(|spec| !running.contains_key(&spec.name))
            .map(
                |spec| match inherited.remove(&(spec.name.clone(), spec.bind)) {
                    Some(sockets) if !sockets.is_empty() => adopt_socket(spec, sockets, count),
                    _ => bind_socket(spec, count),
                },
            )
            .collect()
    }

    /// Offers sockets handed over by the previous process; `bind_new`
    /// adopts those whose listener name and configured bind match.
    pub fn inherit(&self, sockets: Vec<(String, SocketAddr, std::os::fd::OwnedFd)>) {
        let mut inherited = self
            .inherited
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (name, bind, socket) in sockets {
            inherited.entry((name, bind)).or_default().push(socket);
        }
    }

    /// Offers a UDP group handed over by the previous process: the
    /// listener of that name serves HTTP/3 on it if it is bound to the
    /// same address.
    pub fn inherit_quic(&self, name: String, address: SocketAddr, group: InheritedGroup) {
        self.inherited_quic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((name, address), group);
    }

    /// Every listener's UDP group joined to a successor about to start:
    /// what it inherits.
    pub fn hand_over_quic(&self) -> std::io::Result<Vec<HandedQuic>> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let mut handed = Vec::new();
        for listener in running.values() {
            let quic = listener.quic.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(group) = quic.as_ref() {
                handed.push(HandedQuic {
                    name: listener.spec.name.clone(),
                    address: listener.local_addr,
                    group: group.hand_over()?,
                });
            }
        }
        Ok(handed)
    }

    /// Closes inherited sockets no listener adopted (their bind changed).
    pub fn release_unadopted(&self) {
        let mut inherited = self
            .inherited
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (name, bind) in std::mem::take(&mut *inherited).into_keys() {
            tracing::info!(listener = %name, %bind, "closing a handed-over socket no listener uses any more");
        }
    }

    /// The listening sockets, for a drain-aware restart.
    pub fn sockets(&self) -> Vec<ListeningSocket> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running
            .values()
            .flat_map(|l| {
                l.sockets.iter().map(|socket| ListeningSocket {
                    name: l.spec.name.clone(),
                    bind: l.spec.bind,
                    socket: socket.clone(),
                })
            })
            .collect()
    }

    /// Starts accepting on listeners bound by `bind_new`.
    pub fn start(self: &Arc<Self>, bound: Vec<BoundListener>) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        for listener in bound {
            tracing::info!(listener = %listener.spec.name, address = %listener.local_addr, protocol = protocol_name(listener.spec.protocol), sockets = listener.sockets.len(), "listener accepting");
            let alt_svc = (listener.spec.http3
                && listener.spec.protocol == ListenerProtocol::Https)
                .then(|| AltSvc::new(listener.local_addr.port()));
            let quic = Arc::new(Mutex::new(None));
            running.insert(
                listener.spec.name.clone(),
                RunningListener {
                    spec: listener.spec.clone(),
                    local_addr: listener.local_addr,
                    sockets: listener.sockets.clone(),
                    alt_svc: alt_svc.clone(),
                    quic: Arc::clone(&quic),
                },
            );
            if let Some(ListenerSocket::Udp(socket)) = listener.sockets.first() {
                let name: Arc<str> = Arc::from(listener.spec.name.as_str());
                tokio::spawn(udp::serve_listener(
                    Arc::clone(socket),
                    name,
                    self.gate.admission.clone(),
                    self.gate.draining.subscribe(),
                    self.gate.open_work(),
                ));
                continue;
            }
            let spec = listener.spec.clone();
            let address = listener.local_addr;
            let accepting = accept::accept_on_workers(
                &self.gate,
                &self.certificates,
                listener,
                alt_svc.clone(),
            );
            // HTTP/3 beside it, advertised on the TCP side while it serves.
            if let Some(alt_svc) = alt_svc.filter(|_| accepting) {
                self.serve_http3(&spec, address, alt_svc, quic);
            }
        }
        // Handed-over UDP groups are for the first listeners only.
        let unadopted = std::mem::take(
            &mut *self
                .inherited_quic
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (name, address) in unadopted.into_keys() {
            tracing::info!(listener = %name, %address, "closing a handed-over UDP group no HTTP/3 listener uses any more");
        }
    }

    /// Listeners and their bound addresses, by name.
    pub fn info(&self) -> Vec<ListenerInfo> {
        let draining = *self.gate.draining.borrow();
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running
            .values()
            .map(|l| ListenerInfo {
                name: l.spec.name.clone(),
                bind: l.spec.bind,
                address: l.local_addr,
                protocol: protocol_name(l.spec.protocol).into(),
                state: if draining { "closed" } else { "bound" }.into(),
                http3: l.alt_svc.as_ref().map(|a| {
                    if a.current().is_some() {
                        "serving"
                    } else {
                        "waiting"
                    }
                    .into()
                }),
            })
            .collect()
    }

    /// Stops accepting on every listener and asks every connection to
    /// finish: HTTP/1 closes after its in-flight response, HTTP/2 gets GOAWAY.
    pub fn drain(&self) {
        self.gate.draining_flag.store(true, Ordering::Relaxed);
        self.gate.draining.send_replace(true);
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        for listener in running.values_mut() {
            listener.sockets.clear();
        }
    }

    /// Waits until every downstream connection has closed, or `timeout`.
    /// Returns how many were still open.
    pub async fn wait_closed(&self, timeout: Duration) -> usize {
        wait_none(&self.gate.open, timeout).await
    }

    /// The drain deadline has passed: every tunnel and L4 relay still
    /// open ends now, as its protocol allows (a WebSocket with a close
    /// 1001 both ways), each with its access-log line; then waits up to
    /// `grace` for them to be gone. Returns how many were still open.
    pub async fn cut(&self, grace: Duration) -> usize {
        self.gate.cut.send_replace(true);
        wait_none(&self.gate.ended_at_cut, grace).await
    }

    /// Starts HTTP/3 on the UDP port of an HTTPS listener.
    fn serve_http3(
        &self,
        spec: &ListenerSpec,
        address: SocketAddr,
        alt_svc: Arc<AltSvc>,
        group: Arc<Mutex<Option<QuicGroup>>>,
    ) {
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let inherited = self
            .inherited_quic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(spec.name.clone(), address));
        tokio::spawn(h3::serve_endpoint(h3::Http3 {
            name: Arc::clone(&name),
            address,
            admission: self.gate.admission.clone(),
            certificates: Arc::clone(&self.certificates),
            limits: {
                let (gate, name) = (Arc::clone(&self.gate), Arc::clone(&name));
                Arc::new(move || gate.admit(&name, std::net::Ipv4Addr::UNSPECIFIED.into()).0)
            },
            draining: self.gate.draining.subscribe(),
            draining_flag: Arc::clone(&self.gate.draining_flag),
            open: self.gate.open_work(),
            lingering: self.gate.lingering(),
            alt_svc,
            early_data: spec.http3_early_data,
            workers: self.gate.workers.clone(),
            inherited,
            group,
        }));
    }
}

/// Waits until nothing `open` counts is left, or `timeout`; returns how
/// many were left.
async fn wait_none(open: &crate::proxy::conn::OpenConnections, timeout: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let idle = open.idle.notified();
        let left = open.count.load(Ordering::Acquire);
        if left == 0 {
            return 0;
        }
        if tokio::time::timeout_at(deadline, idle).await.is_err() {
            return open.count.load(Ordering::Acquire);
        }
    }
}

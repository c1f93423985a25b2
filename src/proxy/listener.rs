//! Listeners: bound sockets that outlive generations, and their accept loops.
//!
//! The [`ListenerSet`] is process-shared. Activation binds the listeners a
//! candidate adds *before* the swap (`bind_new`, all or nothing) and starts
//! their accept loops after it (`start`). Each accepted connection is served
//! by hyper's auto builder (HTTP/1.1, or h2c with prior knowledge) with the
//! limits the active generation sets for its listener; each request on it
//! pins the generation active when its head arrived.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::Scheme;
use http::StatusCode;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

use super::activity::{watchdog, Activity, Expired};
use super::conn::{client_ip_header, listener_counters, ConnContext};
use super::downstream::Downstream;
use super::framing::HeadCheck;
use super::interim::{InterimQueue, InterimWriter};
use super::request::handle;
use super::sockets;
use super::tcp::{self, TcpCounters};
use super::workers::Workers;
use crate::admission::Admission;
use crate::plan::{ListenerLimits, ListenerProtocol, ListenerSpec};
use crate::telemetry::access::{self, Flags};
use crate::telemetry::metrics as m;
use crate::tls::CertStore;
use tokio_rustls::TlsAcceptor;

/// A listener's socket: one listening TCP socket of its per-worker
/// group (see `sockets`), or the UDP socket a `udp` listener receives
/// every client's datagrams on.
#[derive(Clone)]
pub enum ListenerSocket {
    Tcp(Arc<std::net::TcpListener>),
    Udp(Arc<tokio::net::UdpSocket>),
}

impl std::os::fd::AsFd for ListenerSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            ListenerSocket::Tcp(socket) => socket.as_fd(),
            ListenerSocket::Udp(socket) => socket.as_fd(),
        }
    }
}

/// A listener bound but not yet accepting (between bind and commit).
pub struct BoundListener {
    spec: ListenerSpec,
    sockets: Vec<ListenerSocket>,
    local_addr: SocketAddr,
}

impl BoundListener {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

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

#[derive(Debug, thiserror::Error)]
#[error("cannot bind listener '{name}' to {bind}: {source}")]
pub struct BindError {
    pub name: String,
    pub bind: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

struct RunningListener {
    spec: ListenerSpec,
    local_addr: SocketAddr,
    /// Kept for a socket hand-over; released when draining so that new
    /// connection attempts are refused once the accept loops have stopped.
    sockets: Vec<ListenerSocket>,
    /// With `http3`: what its TCP side advertises while HTTP/3 serves.
    alt_svc: Option<Arc<super::conn::AltSvc>>,
}

/// A listening socket as a drain-aware restart hands it over.
pub struct ListeningSocket {
    pub name: String,
    pub bind: SocketAddr,
    pub socket: ListenerSocket,
}

/// Every listener of the process.
pub struct ListenerSet {
    /// The data-plane threads connections are handed to.
    workers: Option<Arc<Workers>>,
    admission: Admission,
    certificates: Arc<CertStore>,
    running: Mutex<BTreeMap<String, RunningListener>>,
    /// Sockets handed over by the previous process, by listener name and
    /// configured bind (a TCP listener's whole group); adopted instead of
    /// bound.
    inherited: Mutex<BTreeMap<(String, SocketAddr), Vec<std::os::fd::OwnedFd>>>,
    draining: watch::Sender<bool>,
    /// The same as `draining`, read on every response.
    draining_flag: Arc<AtomicBool>,
    open: Arc<OpenConnections>,
}

#[derive(Default)]
struct OpenConnections {
    count: AtomicUsize,
    idle: Notify,
}

/// Counts work that drain waits for besides connections (a `udp`
/// listener's sessions).
#[derive(Clone)]
pub struct OpenWork(Arc<OpenConnections>);

/// One unit of open work, until dropped.
pub struct OpenHold(Arc<OpenConnections>);

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

/// Counts a client connection as open, for the whole set (drain waits
/// on it) and for its listener (`max_connections`).
struct ConnectionGuard {
    accepting: Arc<Accepting>,
    /// The worker serving it.
    worker: usize,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let accepting = &self.accepting;
        accepting.gauge.decrement(1.0);
        accepting.open.fetch_sub(1, Ordering::AcqRel);
        if let Some(load) = accepting.workers.get(self.worker) {
            load.open.fetch_sub(1, Ordering::AcqRel);
        }
        let all = &accepting.set.open;
        if all.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            all.idle.notify_waiters();
        }
    }
}

fn protocol_name(p: ListenerProtocol) -> &'static str {
    match p {
        ListenerProtocol::Http => "http",
        ListenerProtocol::Https => "https",
        ListenerProtocol::Tcp => "tcp",
        ListenerProtocol::Udp => "udp",
    }
}

/// Binds a listener: a `udp` listener's one socket, or one listening
/// socket per worker (`count`) for the others.
fn bind_socket(spec: &ListenerSpec, count: usize) -> Result<BoundListener, BindError> {
    let fail = |source| BindError {
        name: spec.name.clone(),
        bind: spec.bind,
        source,
    };
    if spec.protocol == ListenerProtocol::Udp {
        let socket = std::net::UdpSocket::bind(spec.bind)
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .and_then(tokio::net::UdpSocket::from_std)
            .map_err(fail)?;
        let local_addr = socket.local_addr().map_err(fail)?;
        return Ok(BoundListener {
            spec: spec.clone(),
            sockets: vec![ListenerSocket::Udp(Arc::new(socket))],
            local_addr,
        });
    }
    let (group, local_addr) = sockets::tcp_group(spec.bind, count).map_err(fail)?;
    Ok(BoundListener {
        spec: spec.clone(),
        sockets: group
            .into_iter()
            .map(|s| ListenerSocket::Tcp(Arc::new(s)))
            .collect(),
        local_addr,
    })
}

/// Takes over the sockets the previous process was listening on (or, for
/// a `udp` listener, receiving on). A TCP group smaller than `count` (a
/// predecessor with fewer workers) grows to one socket per worker when it
/// is a group; a single socket without `SO_REUSEPORT` (from a build
/// before groups) stays alone and every worker accepts on it.
fn adopt_socket(
    spec: &ListenerSpec,
    inherited: Vec<std::os::fd::OwnedFd>,
    count: usize,
) -> Result<BoundListener, BindError> {
    let fail = |source| BindError {
        name: spec.name.clone(),
        bind: spec.bind,
        source,
    };
    let mut sockets = Vec::with_capacity(inherited.len().max(count));
    let mut local_addr = spec.bind;
    for socket in inherited {
        local_addr = sockets::local_address(&socket).map_err(fail)?;
        if spec.protocol == ListenerProtocol::Udp {
            let socket = std::net::UdpSocket::from(socket);
            socket.set_nonblocking(true).map_err(fail)?;
            let socket = tokio::net::UdpSocket::from_std(socket).map_err(fail)?;
            sockets.push(ListenerSocket::Udp(Arc::new(socket)));
        } else {
            let socket = std::net::TcpListener::from(socket);
            socket.set_nonblocking(true).map_err(fail)?;
            sockets.push(ListenerSocket::Tcp(Arc::new(socket)));
        }
    }
    let grows = match sockets.first() {
        Some(ListenerSocket::Tcp(first)) => sockets::in_group(first.as_ref()),
        _ => false,
    };
    while grows && sockets.len() < count {
        match sockets::tcp_member(local_addr) {
            Ok(socket) => sockets.push(ListenerSocket::Tcp(Arc::new(socket))),
            Err(error) => {
                tracing::warn!(listener = %spec.name, %error, "could not add a listening socket for a worker; workers share the handed-over ones");
                break;
            }
        }
    }
    tracing::info!(listener = %spec.name, address = %local_addr, sockets = sockets.len(), "adopted listening sockets from the previous process");
    Ok(BoundListener {
        spec: spec.clone(),
        sockets,
        local_addr,
    })
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
            admission,
            certificates,
            workers,
            running: Mutex::new(BTreeMap::new()),
            inherited: Mutex::new(BTreeMap::new()),
            draining: watch::channel(false).0,
            draining_flag: Arc::new(AtomicBool::new(false)),
            open: Arc::new(OpenConnections::default()),
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
        let count = self.workers.as_ref().map_or(1, |w| w.threads());
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

    fn open_guard(&self) -> OpenWork {
        OpenWork(Arc::clone(&self.open))
    }

    /// Starts accepting on listeners bound by `bind_new`.
    pub fn start(self: &Arc<Self>, bound: Vec<BoundListener>) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        for listener in bound {
            tracing::info!(listener = %listener.spec.name, address = %listener.local_addr, protocol = protocol_name(listener.spec.protocol), sockets = listener.sockets.len(), "listener accepting");
            let alt_svc = (listener.spec.http3
                && listener.spec.protocol == ListenerProtocol::Https)
                .then(|| super::conn::AltSvc::new(listener.local_addr.port()));
            running.insert(
                listener.spec.name.clone(),
                RunningListener {
                    spec: listener.spec.clone(),
                    local_addr: listener.local_addr,
                    sockets: listener.sockets.clone(),
                    alt_svc: alt_svc.clone(),
                },
            );
            if let Some(ListenerSocket::Udp(socket)) = listener.sockets.first() {
                let name: Arc<str> = Arc::from(listener.spec.name.as_str());
                tokio::spawn(super::udp::serve(
                    Arc::clone(socket),
                    name,
                    self.admission.clone(),
                    self.draining.subscribe(),
                    self.open_guard(),
                ));
                continue;
            }
            self.accept_on_workers(listener, alt_svc);
        }
    }

    /// Listeners and their bound addresses, by name.
    pub fn info(&self) -> Vec<ListenerInfo> {
        let draining = *self.draining.borrow();
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
        self.draining_flag.store(true, Ordering::Relaxed);
        self.draining.send_replace(true);
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        for listener in running.values_mut() {
            listener.sockets.clear();
        }
    }

    /// Waits until every downstream connection has closed, or `timeout`.
    /// Returns how many were still open.
    pub async fn wait_closed(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let idle = self.open.idle.notified();
            let open = self.open.count.load(Ordering::Acquire);
            if open == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.open.count.load(Ordering::Acquire);
            }
        }
    }

    /// Starts one accept loop per worker and socket of a TCP listener's
    /// group (see `sockets::share`), each serving what it accepts on its
    /// own worker; and HTTP/3 beside an `https` listener with `http3`.
    fn accept_on_workers(
        self: &Arc<Self>,
        listener: BoundListener,
        alt_svc: Option<Arc<super::conn::AltSvc>>,
    ) {
        let name: Arc<str> = Arc::from(listener.spec.name.as_str());
        let tls = match listener.spec.protocol {
            ListenerProtocol::Https => match self.certificates.server_config(&name) {
                Ok(config) => Some(TlsAcceptor::from(config)),
                Err(error) => {
                    tracing::error!(listener = %name, %error, "cannot set up TLS; listener not accepting");
                    return;
                }
            },
            _ => None,
        };
        // Where clients connect: the bound address, unless it is a
        // wildcard (then each connection's own, asked of the socket).
        let bound = listener.local_addr;
        // HTTP/3 beside it, advertised on this side while it serves.
        let alt_svc = alt_svc.filter(|_| tls.is_some()).inspect(|alt_svc| {
            tokio::spawn(super::h3::serve(super::h3::Http3 {
                name: Arc::clone(&name),
                address: bound,
                admission: self.admission.clone(),
                certificates: Arc::clone(&self.certificates),
                limits: {
                    let (set, name) = (Arc::clone(self), Arc::clone(&name));
                    Arc::new(move || set.admit(&name, std::net::Ipv4Addr::UNSPECIFIED.into()).0)
                },
                draining: self.draining.subscribe(),
                draining_flag: Arc::clone(&self.draining_flag),
                open: self.open_guard(),
                alt_svc: Arc::clone(alt_svc),
                early_data: listener.spec.http3_early_data,
                workers: self.workers.clone(),
            }));
        });
        let label = || name.to_string();
        let accepting = Arc::new(Accepting {
            set: Arc::clone(self),
            bound,
            wildcard: bound.ip().is_unspecified(),
            responses: listener_counters(&name),
            gauge: metrics::gauge!(m::DOWNSTREAM_CONNECTIONS, m::LABEL_LISTENER => label()),
            // Only TCP listeners get byte series: an HTTP one would
            // export two that never move.
            tcp_counters: (listener.spec.protocol == ListenerProtocol::Tcp).then(|| TcpCounters {
                downstream_to_upstream: metrics::counter!(m::TCP_BYTES, m::LABEL_LISTENER => label(), m::LABEL_DIRECTION => "downstream_to_upstream"),
                upstream_to_downstream: metrics::counter!(m::TCP_BYTES, m::LABEL_LISTENER => label(), m::LABEL_DIRECTION => "upstream_to_downstream"),
                duration: metrics::histogram!(m::TCP_CONNECTION_DURATION, m::LABEL_LISTENER => label()),
            }),
            scheme: if tls.is_some() {
                Scheme::HTTPS
            } else {
                Scheme::HTTP
            },
            tls,
            alt_svc,
            open: AtomicUsize::new(0),
            workers: (0..self.workers.as_ref().map_or(1, |w| w.threads()))
                .map(|worker| WorkerLoad {
                    open: AtomicUsize::new(0),
                    accepted: metrics::counter!(m::WORKER_CONNECTIONS, m::LABEL_WORKER => worker.to_string()),
                })
                .collect(),
            rebalanced: metrics::counter!(m::CONNECTIONS_REBALANCED, m::LABEL_LISTENER => label()),
            refused: metrics::counter!(m::CONNECTIONS_REFUSED, m::LABEL_LISTENER => label()),
            accepted: metrics::counter!(m::CONNECTIONS_ACCEPTED, m::LABEL_LISTENER => label()),
            untrusted: metrics::counter!(m::PROXY_HEADERS, m::LABEL_LISTENER => label(), m::LABEL_OUTCOME => "untrusted"),
            warned_at: Mutex::new(None),
            name,
        });
        let sockets: Vec<Arc<std::net::TcpListener>> = listener
            .sockets
            .iter()
            .filter_map(|socket| match socket {
                ListenerSocket::Tcp(socket) => Some(Arc::clone(socket)),
                ListenerSocket::Udp(_) => None,
            })
            .collect();
        let workers = self.workers.as_ref().map_or(1, |w| w.threads());
        for worker in 0..workers {
            for index in sockets::share(worker, workers, sockets.len()) {
                // Each loop owns a duplicate, registered with its own
                // worker's reactor; the set keeps the original for a
                // hand-over until draining.
                let socket = match sockets[index].try_clone() {
                    Ok(socket) => socket,
                    Err(error) => {
                        tracing::error!(listener = %accepting.name, worker, %error, "cannot accept on a listening socket");
                        continue;
                    }
                };
                let accepting = Arc::clone(&accepting);
                let accept =
                    move || -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
                        Box::pin(accepting.accept_loop(socket, worker))
                    };
                match &self.workers {
                    Some(workers) => workers.spawn_on(worker, Box::new(accept)),
                    None => {
                        tokio::spawn(accept());
                    }
                }
            }
        }
    }

    /// The limits the active generation sets for a listener, and whether
    /// `peer` may (or must not) send it a PROXY header.
    fn admit(&self, listener: &str, peer: std::net::IpAddr) -> (ListenerLimits, Proxy) {
        let generation = self.admission.store().load_full();
        let admit = generation
            .spec
            .listeners
            .iter()
            .find(|l| l.name == listener)
            .map(|l| {
                // `trusts` is `trusted_proxies` here: validation refuses
                // the PROXY protocol without them, and them together with
                // `trust_forwarded`.
                let proxy = match (l.accept_proxy_protocol, l.edge.trusts(peer)) {
                    (false, _) => Proxy::None,
                    (true, true) => Proxy::Trusted,
                    (true, false) => Proxy::Untrusted,
                };
                (l.limits, proxy)
            })
            .unwrap_or((ListenerLimits::default(), Proxy::None));
        crate::admission::release(generation);
        admit
    }
}

/// What every accept loop of one TCP listener shares.
struct Accepting {
    set: Arc<ListenerSet>,
    name: Arc<str>,
    bound: SocketAddr,
    wildcard: bool,
    responses: Arc<[metrics::Counter; 5]>,
    gauge: metrics::Gauge,
    tcp_counters: Option<TcpCounters>,
    tls: Option<TlsAcceptor>,
    scheme: Scheme,
    alt_svc: Option<Arc<super::conn::AltSvc>>,
    /// The listener's open connections, over all its loops
    /// (`max_connections`).
    open: AtomicUsize,
    /// Each worker's share of them.
    workers: Box<[WorkerLoad]>,
    rebalanced: metrics::Counter,
    refused: metrics::Counter,
    accepted: metrics::Counter,
    untrusted: metrics::Counter,
    /// At most one warning a second while the cap turns clients away.
    warned_at: Mutex<Option<std::time::Instant>>,
}

/// One worker's connections of one listener.
struct WorkerLoad {
    open: AtomicUsize,
    /// `cutover_worker_connections_total` of the worker.
    accepted: metrics::Counter,
}

/// Which of the workers with `loads` open connections serves a connection
/// that `worker` accepted. The kernel spreads new connections over the
/// workers' sockets by a hash of the client's address and port: even over
/// many short connections, lumpy over a few long ones (16 HTTP/2
/// connections from a load balancer often split 10 to 6, leaving one core
/// idle while the other is saturated). So the worker that accepted serves
/// unless another has fewer open by more than `1 + its own / 8` (then the
/// least loaded one does), which keeps any two within `2 + load / 8` of
/// each other: Envoy's `exact_balance` in spirit, without a lock, and
/// without a hand-over in the common case (a connection or two that has
/// not closed yet is not an imbalance).
pub(super) fn balance(loads: impl Iterator<Item = usize>, worker: usize) -> usize {
    let mut mine = None;
    let mut least: Option<(usize, usize)> = None;
    for (index, load) in loads.enumerate() {
        if index == worker {
            mine = Some(load);
        }
        if least.is_none_or(|(_, fewest)| load < fewest) {
            least = Some((index, load));
        }
    }
    match (mine, least) {
        (Some(mine), Some((index, fewest))) if fewest + 1 + mine / 8 < mine => index,
        _ => worker,
    }
}

impl Accepting {
    /// Accepts on `socket` on worker `worker` and serves each connection
    /// there, until draining.
    async fn accept_loop(self: Arc<Self>, socket: std::net::TcpListener, worker: usize) {
        // `AsyncFd::with_interest` is deprecated for types whose
        // descriptor might be closed behind the registration's back; this
        // one owns its listener, which outlives the registration.
        #[allow(deprecated)]
        let registered = AsyncFd::with_interest(socket, Interest::READABLE);
        let socket = match registered {
            Ok(socket) => socket,
            Err(error) => {
                tracing::error!(listener = %self.name, worker, %error, "cannot accept on a listening socket");
                return;
            }
        };
        let mut draining = self.set.draining.subscribe();
        loop {
            let accepted = tokio::select! {
                accepted = accept(&socket) => accepted,
                _ = async { let _ = draining.wait_for(|d| *d).await; } => break,
            };
            let (stream, remote) = match accepted {
                Ok(pair) => pair,
                Err(error) if out_of_resources(&error) => {
                    // Out of file descriptors or memory: back off briefly
                    // instead of spinning; the listener stays up.
                    tracing::warn!(listener = %self.name, %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                Err(error) => {
                    // One connection's trouble (reset before it was
                    // accepted, a network error Linux reports on accept):
                    // the next one is taken at once.
                    tracing::debug!(listener = %self.name, %error, "a connection was lost before it was accepted");
                    continue;
                }
            };
            let (limits, proxy) = self.set.admit(&self.name, remote.ip());
            // A PROXY header is taken only from the proxies trusted to
            // send one: anyone else could claim any address.
            if proxy == Proxy::Untrusted {
                self.untrusted.increment(1);
                tracing::debug!(listener = %self.name, peer = %remote, "PROXY header expected from an untrusted peer; closing");
                continue;
            }
            // Over the listener's cap: closed at once, before it costs a
            // task or a buffer (the client sees a reset or an EOF). The
            // place is taken before it is checked, so that loops on other
            // workers cannot overshoot the cap together.
            let before = self.open.fetch_add(1, Ordering::AcqRel);
            if let Some(max) = limits.max_connections.filter(|max| before >= *max) {
                self.open.fetch_sub(1, Ordering::AcqRel);
                self.refuse(max);
                continue;
            }
            let serving = self.balance(worker);
            self.set.open.count.fetch_add(1, Ordering::AcqRel);
            self.gauge.increment(1.0);
            self.accepted.increment(1);
            let guard = ConnectionGuard {
                accepting: Arc::clone(&self),
                worker: serving,
            };
            let proxied = proxy == Proxy::Trusted;
            let workers = self.set.workers.as_ref().filter(|_| serving != worker);
            let Some(workers) = workers else {
                // Boxed: tokio moves a task's future several times while
                // spawning and finishing it, and a box moves as a pointer
                // (an L4 connection's future is about 2 KiB).
                tokio::spawn(Box::pin(
                    Arc::clone(&self).serve(stream, remote, proxied, limits, guard),
                ));
                continue;
            };
            // Served elsewhere: registered with that worker's reactor
            // only (it never was with this one's).
            self.rebalanced.increment(1);
            let accepting = Arc::clone(&self);
            workers.spawn_on(
                serving,
                Box::new(move || Box::pin(accepting.serve(stream, remote, proxied, limits, guard))),
            );
        }
        tracing::info!(listener = %self.name, worker, "listener closed");
    }

    /// The worker that serves a connection `worker` accepted: itself,
    /// unless another serves markedly fewer of this listener's
    /// connections (see `balance`); counted on the one chosen.
    fn balance(&self, worker: usize) -> usize {
        let loads = self.workers.iter().map(|w| w.open.load(Ordering::Relaxed));
        let serving = balance(loads, worker);
        if let Some(chosen) = self.workers.get(serving) {
            chosen.open.fetch_add(1, Ordering::AcqRel);
            chosen.accepted.increment(1);
        }
        serving
    }

    fn refuse(&self, max: usize) {
        self.refused.increment(1);
        let mut warned_at = self
            .warned_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if warned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            *warned_at = Some(std::time::Instant::now());
            tracing::warn!(listener = %self.name, max_connections = max, "max_connections reached: closing new connections at accept");
        }
    }

    /// Serves one accepted connection on this worker, to its end,
    /// registering it with the worker's reactor.
    async fn serve(
        self: Arc<Self>,
        stream: std::net::TcpStream,
        remote: SocketAddr,
        proxied: bool,
        limits: ListenerLimits,
        guard: ConnectionGuard,
    ) {
        // An HTTP client's first bytes (a request head, a ClientHello)
        // usually arrive with its connection: taken before the socket is
        // registered, they cost one read, where waiting for them costs a
        // trip through epoll, a timer and a peek. A PROXY header is read
        // exactly, and a TCP listener relays what arrives.
        let mut first = Vec::new();
        if !proxied && self.tcp_counters.is_none() {
            match read_arrived(&stream, &mut first) {
                // Closed before a byte: a port check.
                Ok(0) => return,
                Ok(_) => {}
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
        let mut stream = match TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(listener = %self.name, %error, "cannot register a connection");
                return;
            }
        };
        let header_timeout = limits.header_read_timeout;
        let Some(remote) =
            client_address(&mut stream, remote, proxied, header_timeout, &self.name).await
        else {
            return;
        };
        if let Some(counters) = &self.tcp_counters {
            tcp::serve(
                stream,
                remote,
                Arc::clone(&self.name),
                self.set.admission.clone(),
                counters.clone(),
            )
            .await;
            drop(guard);
            return;
        }
        let local = if self.wildcard {
            stream.local_addr().unwrap_or(self.bound)
        } else {
            self.bound
        };
        let ctx = Arc::new(ConnContext {
            listener: Arc::clone(&self.name),
            admission: self.set.admission.clone(),
            remote,
            local,
            client_ip: client_ip_header(remote),
            scheme: self.scheme.clone(),
            responses: Arc::clone(&self.responses),
            draining: Arc::clone(&self.set.draining_flag),
            activity: Activity::new(),
            interim: InterimQueue::new(),
            alt_svc: self.alt_svc.clone(),
            tls: std::sync::OnceLock::new(),
        });
        let draining = self.set.draining.subscribe();
        // Boxed: an HTTP connection's future (hyper's, TLS's) is several
        // KiB, and would make every L4 connection's task as large.
        Box::pin(serve_connection(
            stream,
            first,
            ctx,
            limits,
            draining,
            guard,
            self.tls.clone(),
        ))
        .await
    }
}

/// Whether an accept failed for want of descriptors or memory, which
/// trying again at once would not cure (accept(2): other errors belong
/// to the one connection, and are to be treated like `EAGAIN`).
fn out_of_resources(error: &std::io::Error) -> bool {
    use rustix::io::Errno;
    error.raw_os_error().is_some_and(|code| {
        [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM]
            .iter()
            .any(|e| e.raw_os_error() == code)
    })
}

/// Accepts a connection off `socket`, non-blocking but not yet registered
/// with any worker's reactor: the worker that serves it registers it, so
/// a connection handed to another worker costs no deregistration.
async fn accept(
    socket: &AsyncFd<std::net::TcpListener>,
) -> std::io::Result<(std::net::TcpStream, SocketAddr)> {
    use rustix::net::SocketFlags;
    loop {
        let mut ready = socket.readable().await?;
        let accepted = ready.try_io(|socket| {
            rustix::net::acceptfrom_with(socket, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)
                .map_err(std::io::Error::from)
        });
        let Ok(accepted) = accepted else {
            // Nothing left to accept: the readiness is cleared.
            continue;
        };
        let (fd, peer) = accepted?;
        let peer = peer
            .and_then(|peer| SocketAddr::try_from(peer).ok())
            .ok_or_else(|| std::io::Error::other("accepted a connection without an IP peer"))?;
        return Ok((std::net::TcpStream::from(fd), peer));
    }
}

/// Whether a connection starts with a PROXY header, as its listener and
/// peer have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    /// The listener takes none.
    None,
    /// From a peer in `trusted_proxies`: read and believed.
    Trusted,
    /// From anyone else: the connection is closed at accept.
    Untrusted,
}

/// The client of a connection: its peer, or, on a listener that takes a
/// PROXY header (`proxied`, the peer already known trusted), the address
/// the header carries (the peer for a `LOCAL` one). `None` when the
/// header is missing, malformed or late: the connection is closed.
async fn client_address(
    stream: &mut TcpStream,
    peer: SocketAddr,
    proxied: bool,
    timeout: Duration,
    listener: &Arc<str>,
) -> Option<SocketAddr> {
    if !proxied {
        return Some(peer);
    }
    let read = super::accept_proxy::read(stream, timeout).await;
    let outcome = match &read {
        Ok(_) => "accepted",
        Err(super::accept_proxy::HeaderError::Timeout(_)) => "timeout",
        Err(_) => "invalid",
    };
    metrics::counter!(m::PROXY_HEADERS, m::LABEL_LISTENER => listener.to_string(), m::LABEL_OUTCOME => outcome).increment(1);
    match read {
        Ok(carried) => Some(carried.unwrap_or(peer)),
        Err(error) => {
            tracing::debug!(listener = %listener, %peer, %error, "no usable PROXY header; closing");
            None
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    mut first: Vec<u8>,
    ctx: Arc<ConnContext>,
    limits: ListenerLimits,
    draining: watch::Receiver<bool>,
    _guard: ConnectionGuard,
    tls: Option<TlsAcceptor>,
) {
    let _ = stream.set_nodelay(true);
    // The first byte tells a plain HTTP/1 connection from one that may
    // start with HTTP/2's preface (`Speaks`), and a TLS handshake needs
    // the first bytes too. When none had arrived as the connection was
    // taken, they are waited for here: a client that connects and says
    // nothing is timed out. A connection accepted just before draining
    // began is still served: its client has no way to know it should
    // have gone elsewhere.
    if first.is_empty() {
        let arrived =
            tokio::time::timeout(limits.header_read_timeout, read_first(&stream, &mut first));
        if !matches!(arrived.await, Ok(Ok(n)) if n > 0) {
            return;
        }
    }
    let first_byte = first.first().copied();
    let io = Downstream::new(stream, first, Arc::clone(&ctx.activity), tls.is_none());
    match tls {
        None => {
            let io = HeadCheck::wrap(io, Arc::clone(&ctx.activity), true, limits.max_header_bytes);
            let io = InterimWriter::new(io, Arc::clone(&ctx.interim));
            let speaks = first_byte.map_or(Speaks::Either, Speaks::of_first_byte);
            serve_http(io, ctx, limits, draining, speaks).await;
        }
        Some(acceptor) => {
            let handshake = tokio::time::timeout(limits.header_read_timeout, acceptor.accept(io));
            let handshake = handshake.await;
            let outcome = match &handshake {
                Ok(Ok(_)) => "ok",
                Ok(Err(_)) => "failed",
                Err(_) => "timeout",
            };
            metrics::counter!(m::TLS_HANDSHAKES, m::LABEL_LISTENER => ctx.listener.to_string(), m::LABEL_OUTCOME => outcome).increment(1);
            match handshake {
                Ok(Ok(tls)) => {
                    // A tls-alpn-01 validation ends with its handshake.
                    if tls.get_ref().1.alpn_protocol() == Some(crate::tls::ACME_TLS_ALPN) {
                        return;
                    }
                    let _ = ctx.tls.set(super::conn::TlsInfo::of(tls.get_ref().1));
                    let alpn = tls.get_ref().1.alpn_protocol();
                    let http1 = alpn != Some(b"h2");
                    let speaks = Speaks::of_alpn(alpn);
                    let max_head = limits.max_header_bytes;
                    let io = HeadCheck::wrap(tls, Arc::clone(&ctx.activity), http1, max_head);
                    let io = InterimWriter::new(io, Arc::clone(&ctx.interim));
                    serve_http(io, ctx, limits, draining, speaks).await
                }
                Ok(Err(error)) => {
                    metrics::counter!(m::TLS_HANDSHAKE_FAILURES, m::LABEL_LISTENER => ctx.listener.to_string()).increment(1);
                    tracing::debug!(listener = %ctx.listener, client = %ctx.remote, %error, "TLS handshake failed");
                }
                Err(_) => {
                    metrics::counter!(m::TLS_HANDSHAKE_FAILURES, m::LABEL_LISTENER => ctx.listener.to_string()).increment(1);
                }
            }
        }
    }
}

/// How much of a connection's first bytes is read before it is served:
/// most request heads and ClientHellos; hyper reads the rest of a longer
/// one.
const FIRST_READ: usize = 4096;

/// Reads what has arrived on an accepted, unregistered socket into
/// `into` (`WouldBlock` when nothing has), without waiting.
fn read_arrived(socket: &std::net::TcpStream, into: &mut Vec<u8>) -> std::io::Result<usize> {
    use rustix::net::{recv, RecvFlags};
    into.reserve_exact(FIRST_READ);
    loop {
        match recv(
            socket,
            rustix::buffer::spare_capacity(into),
            RecvFlags::empty(),
        ) {
            Ok((n, _)) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// Waits for a registered socket's first bytes and reads what has
/// arrived into `into`.
async fn read_first(socket: &TcpStream, into: &mut Vec<u8>) -> std::io::Result<usize> {
    into.reserve_exact(FIRST_READ);
    loop {
        socket.readable().await?;
        match socket.try_read_buf(into) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

/// What a client connection speaks, as far as it is known before hyper
/// reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    /// Its first byte cannot begin HTTP/2's preface (`PRI * HTTP/2.0`),
    /// or TLS agreed on `http/1.1`: served by hyper's HTTP/1 connection
    /// directly, without the version probe (a read of 24 bytes before
    /// the rest of the request, another system call per connection) and
    /// the replay of those bytes on every read after it.
    Http1,
    /// Either: hyper reads the first bytes to tell.
    Either,
}

impl Speaks {
    /// A plain connection, by its first byte.
    fn of_first_byte(byte: u8) -> Self {
        if byte == b'P' {
            Speaks::Either
        } else {
            Speaks::Http1
        }
    }

    /// A TLS connection, by the protocol ALPN agreed on (none: either).
    fn of_alpn(alpn: Option<&[u8]>) -> Self {
        match alpn {
            Some(b"http/1.1") => Speaks::Http1,
            _ => Speaks::Either,
        }
    }
}

/// The HTTP/1 settings of a listener, on hyper's HTTP/1 builder or the
/// auto builder's HTTP/1 part (the same methods on two types).
macro_rules! http1_settings {
    ($builder:expr, $limits:expr) => {{
        $builder
            .timer(TokioTimer::new())
            // The watchdog keeps the head timeout (and answers 408);
            // hyper's own would also run between requests, where
            // keepalive_timeout rules, and costs a timer per request.
            .header_read_timeout(None)
            // One buffer per response instead of a queue of head and
            // body pieces for writev: fewer instructions per request, and
            // what rustls prefers anyway; bodies still stream in chunks
            // of at most `max_buf_size`.
            .writev(false)
            .max_buf_size($limits.max_header_bytes);
        // hyper parses into a stack array sized for its default limit;
        // any other limit makes it allocate and initialise a vector on
        // every request.
        if $limits.max_headers != HYPER_DEFAULT_MAX_HEADERS {
            $builder.max_headers($limits.max_headers);
        }
    }};
}

/// Serves HTTP/1.1 or HTTP/2 on an established (plain or TLS) stream,
/// until the client leaves, a client timeout of DESIGN §13 expires (see
/// `downstream::watchdog`), or draining ends it.
async fn serve_http<I>(
    io: I,
    ctx: Arc<ConnContext>,
    limits: ListenerLimits,
    draining: watch::Receiver<bool>,
    speaks: Speaks,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let shared = Arc::clone(&ctx);
    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        handle(
            req.map(crate::backends::ClientBody::Hyper),
            Arc::clone(&ctx),
        )
    });
    let io = TokioIo::new(io);
    match speaks {
        Speaks::Http1 => {
            let mut builder = hyper::server::conn::http1::Builder::new();
            http1_settings!(builder, limits);
            // Exactly, whatever sizes the head arrives in (the auto
            // builder has only the buffer's limit, reached by whole reads).
            builder.max_header_size(limits.max_header_bytes);
            // Boxed where it is made: hyper's connection is most of a
            // connection's state, and the futures around it stay small.
            let mut conn = Box::pin(builder.serve_connection(io, service).with_upgrades());
            let conn = conn.as_mut();
            let stop = |conn: Pin<&mut _>| {
                hyper::server::conn::http1::UpgradeableConnection::graceful_shutdown(conn)
            };
            drive(conn, stop, &shared, limits, draining).await;
        }
        Speaks::Either => {
            let mut builder = auto::Builder::new(StreamExecutor);
            http1_settings!(builder.http1(), limits);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.max_concurrent_streams)
                // The same limit as HTTP/1's, measured as RFC 9113 §6.5.2
                // does (names and values plus 32 bytes each); h2 answers
                // 431 above it. hyper's default would be 16 KiB.
                .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
                .keep_alive_interval(limits.h2_keepalive_interval)
                .keep_alive_timeout(H2_PING_TIMEOUT);
            let mut conn = Box::pin(builder.serve_connection_with_upgrades(io, service));
            let conn = conn.as_mut();
            let stop = |conn: Pin<&mut _>| auto::UpgradeableConnection::graceful_shutdown(conn);
            drive(conn, stop, &shared, limits, draining).await;
        }
    }
}

/// Runs a served connection `conn` to its end, or until a client timeout
/// or draining ends it (`stop` asks it to finish gracefully).
async fn drive<C, E>(
    mut conn: Pin<&mut C>,
    stop: impl Fn(Pin<&mut C>),
    shared: &ConnContext,
    limits: ListenerLimits,
    mut draining: watch::Receiver<bool>,
) where
    C: std::future::Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let finish = |result: Result<(), E>| finish(result.map_err(Into::into), shared);
    let listener = &shared.listener;
    let expired = tokio::select! {
        result = conn.as_mut() => return finish(result),
        expired = watchdog(&shared.activity, limits) => Some(expired),
        _ = async { let _ = draining.wait_for(|d| *d).await; } => None,
    };
    match expired {
        Some(Expired::Head) => {
            tracing::debug!(listener = %listener, client = %shared.remote, "request head not complete within header_read_timeout");
            // One more poll with the head expired: the stream answers 408
            // (plain connections), ends, and hyper gives the head up.
            shared.activity.expire_head();
            let _ = tokio::time::timeout(HEAD_EXPIRY_GRACE, conn.as_mut()).await;
            refused_head_line(shared, StatusCode::REQUEST_TIMEOUT, Flags::HEADER_TIMEOUT);
        }
        Some(Expired::Idle) => {
            tracing::debug!(listener = %listener, client = %shared.remote, "no byte moved within idle_timeout; closing");
        }
        Some(Expired::KeepAlive) => {
            // HTTP/2 gets GOAWAY; an idle HTTP/1 connection just closes.
            stop(conn.as_mut());
            if let Ok(result) = tokio::time::timeout(DRAIN_IDLE_GRACE, conn.as_mut()).await {
                finish(result);
            }
        }
        None => {
            // HTTP/2 clients handle GOAWAY: send it now. HTTP/1 responses
            // carry `Connection: close` from now on (see `handle`), so
            // busy keep-alive clients leave cleanly; the rest get a short
            // grace before idle connections are closed.
            if !shared.activity.is_http2() {
                tokio::select! {
                    result = conn.as_mut() => return finish(result),
                    _ = tokio::time::sleep(DRAIN_IDLE_GRACE) => {}
                }
            }
            stop(conn.as_mut());
            finish(conn.as_mut().await);
        }
    }
}

/// Runs each HTTP/2 stream hyper hands over as a task, boxed first: a
/// stream's future holds the whole request path (several KiB), and tokio
/// moves a task's future several times while spawning and completing it
/// (9.2k of an h2c request's 46.5k instructions were memory copies; 5.4k
/// with the box), where a box moves as a pointer.
#[derive(Clone, Copy)]
struct StreamExecutor;

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(Box::pin(future));
    }
}

/// hyper's HTTP/1 header count limit when none is set (not exported).
const HYPER_DEFAULT_MAX_HEADERS: usize = 100;

/// How long idle HTTP/1 keep-alive connections may stay once draining
/// starts, and how long an HTTP/2 client gets to leave after GOAWAY for
/// keep-alive expiry.
const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// How long a connection whose head timed out gets to end once its
/// stream has (it takes one poll; the bound is for safety).
const HEAD_EXPIRY_GRACE: Duration = Duration::from_millis(100);

/// How long an HTTP/2 PING may go unanswered before the connection is
/// taken for dead.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

fn finish(result: Result<(), Box<dyn std::error::Error + Send + Sync>>, ctx: &ConnContext) {
    let Err(error) = result else { return };
    tracing::debug!(listener = %ctx.listener, %error, "downstream connection ended with an error");
    // A head hyper refused never reached `handle`: its line is written here.
    if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
        if hyper.is_parse_too_large() {
            refused_head_line(
                ctx,
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                Flags::PROTOCOL_ERROR,
            );
        } else if hyper.is_parse() {
            refused_head_line(ctx, StatusCode::BAD_REQUEST, Flags::PROTOCOL_ERROR);
        }
    }
}

/// The access-log line of a request refused before it had a head that
/// could be handed on: a malformed or oversized head (hyper answers it),
/// or one that did not arrive within `header_read_timeout` (408).
fn refused_head_line(ctx: &ConnContext, status: StatusCode, flags: Flags) {
    if !access::enabled() {
        return;
    }
    let listener = Arc::clone(&ctx.listener);
    let generation = ctx.admission.store().active_id().0;
    access::emit(access::Line {
        ended: std::time::SystemTime::now(),
        status: status.as_u16(),
        flags,
        ..access::Line::new("HTTP/1.1", listener, generation, ctx.remote)
    });
}

#[cfg(test)]
mod tests {
    use super::{balance, Speaks};

    #[test]
    fn only_exhaustion_makes_the_accept_loop_back_off() {
        use rustix::io::Errno;
        let os = |e: Errno| std::io::Error::from_raw_os_error(e.raw_os_error());
        for exhausted in [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM] {
            assert!(super::out_of_resources(&os(exhausted)), "{exhausted:?}");
        }
        for one_connection in [
            Errno::CONNABORTED,
            Errno::PROTO,
            Errno::PERM,
            Errno::NETUNREACH,
        ] {
            assert!(
                !super::out_of_resources(&os(one_connection)),
                "{one_connection:?}"
            );
        }
    }

    #[test]
    fn only_a_connection_that_may_start_with_the_h2_preface_is_probed() {
        for method in ["GET", "HEAD", "DELETE", "OPTIONS", "CONNECT", "TRACE"] {
            assert_eq!(
                Speaks::of_first_byte(method.as_bytes()[0]),
                Speaks::Http1,
                "{method}"
            );
        }
        // PRI (the preface), but also POST, PUT and PATCH.
        assert_eq!(Speaks::of_first_byte(b'P'), Speaks::Either);
        // Not HTTP at all: hyper's HTTP/1 parser refuses it (400).
        assert_eq!(Speaks::of_first_byte(0x16), Speaks::Http1);
        assert_eq!(Speaks::of_alpn(Some(b"http/1.1")), Speaks::Http1);
        assert_eq!(Speaks::of_alpn(Some(b"h2")), Speaks::Either);
        assert_eq!(Speaks::of_alpn(None), Speaks::Either);
    }

    #[test]
    fn the_accepting_worker_serves_unless_another_is_markedly_less_loaded() {
        // Within 1 + an eighth of its own: no hand-over.
        assert_eq!(balance([0, 0].into_iter(), 0), 0);
        assert_eq!(balance([1, 0].into_iter(), 0), 0);
        assert_eq!(balance([9, 7].into_iter(), 0), 0);
        assert_eq!(balance([16, 13].into_iter(), 0), 0);
        assert_eq!(balance([13, 16].into_iter(), 0), 0);
        // More than that: the least loaded serves.
        assert_eq!(balance([2, 0].into_iter(), 0), 1);
        assert_eq!(balance([9, 6].into_iter(), 0), 1);
        assert_eq!(balance([20, 16, 17].into_iter(), 0), 1);
        assert_eq!(balance([20, 17, 16].into_iter(), 0), 2);
        // Out of range: itself.
        assert_eq!(balance([5].into_iter(), 3), 3);
    }

    /// A loopback connection: the accepted end, non-blocking and not
    /// registered (as `accept` returns it), and the client's end.
    fn accepted() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        accepted.set_nonblocking(true).expect("non-blocking");
        (accepted, client)
    }

    #[test]
    fn what_arrived_with_a_connection_is_read_without_waiting() {
        use std::io::Write;
        let (accepted, mut client) = accepted();
        let mut first = Vec::new();
        let nothing = super::read_arrived(&accepted, &mut first).expect_err("nothing yet");
        assert_eq!(nothing.kind(), std::io::ErrorKind::WouldBlock);
        assert!(first.is_empty());
        // Loopback delivers as the client writes; bounded all the same.
        let arrived = |into: &mut Vec<u8>| {
            let mut read = super::read_arrived(&accepted, into);
            for _ in 0..500 {
                if read.is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
                read = super::read_arrived(&accepted, into);
            }
            read
        };
        client.write_all(b"GET / HTTP/1.1\r\n").expect("send");
        assert_eq!(arrived(&mut first).expect("read"), 16);
        assert_eq!(first, b"GET / HTTP/1.1\r\n");
        drop(client);
        let closed = arrived(&mut Vec::new()).expect("the end");
        assert_eq!(closed, 0, "a client that closed reads as 0");
    }

    #[tokio::test]
    async fn a_connection_whose_first_bytes_are_late_waits_for_them() {
        use std::io::Write;
        let (accepted, mut client) = accepted();
        let stream = tokio::net::TcpStream::from_std(accepted).expect("register");
        let sender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            client.write_all(b"PRI * HTTP/2.0").expect("send");
            client
        });
        let mut first = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            super::read_first(&stream, &mut first),
        )
        .await
        .expect("woken by the bytes")
        .expect("read");
        assert_eq!((read, first.as_slice()), (14, &b"PRI * HTTP/2.0"[..]));
        drop(sender.join());
    }

    /// Every new connection hashed to one worker: the loads still end
    /// within the margin of each other.
    #[test]
    fn connections_all_hashed_to_one_worker_end_spread() {
        for workers in [2usize, 3, 4] {
            for total in [4usize, 16, 64, 500] {
                let mut loads = vec![0; workers];
                for _ in 0..total {
                    let serving = balance(loads.iter().copied(), 0);
                    loads[serving] += 1;
                }
                let (most, least) = (*loads.iter().max().unwrap(), *loads.iter().min().unwrap());
                assert!(
                    most <= least + 2 + most / 8,
                    "{workers} workers, {total} connections: {loads:?}"
                );
            }
        }
    }
}

//! Accepting: one loop per worker and listening socket of a TCP
//! listener's group, what they share ([`Gate`], [`Accepting`]), the
//! worker balance, the listener's connection cap, a trusted peer's PROXY
//! header, and the hand-off of each accepted connection to what serves
//! it: the L4 relay (`tcp.rs`) or an HTTP connection (`serve.rs`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::Scheme;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::bind::{BoundListener, ListenerSocket};
use super::serve;
use crate::admission::Admission;
use crate::plan::{ListenerLimits, ListenerProtocol};
use crate::proxy::accept_proxy;
use crate::proxy::activity::Activity;
use crate::proxy::conn::{
    client_ip_header, listener_counters, AltSvc, ConnContext, Lingering, OpenConnections, OpenWork,
};
use crate::proxy::interim::InterimQueue;
use crate::proxy::sockets;
use crate::proxy::tcp::{self, TcpCounters};
use crate::proxy::workers::Workers;
use crate::telemetry::metrics as m;
use crate::tls::CertStore;

/// What the set shares with every accept loop and front it starts: the
/// data-plane threads, admission, the drain signal, and the count of
/// open work drain waits for.
pub(in crate::proxy) struct Gate {
    pub(super) workers: Option<Arc<Workers>>,
    pub(in crate::proxy) admission: Admission,
    pub(in crate::proxy) draining: watch::Sender<bool>,
    /// The same as `draining`, read on every response.
    pub(in crate::proxy) draining_flag: Arc<AtomicBool>,
    pub(super) open: Arc<OpenConnections>,
    /// Set when the drain deadline passes: tunnels and L4 relays still
    /// open end as their protocol allows.
    pub(in crate::proxy) cut: watch::Sender<bool>,
    /// Of the open work, what the deadline ends (tunnels, L4 relays).
    pub(super) ended_at_cut: Arc<OpenConnections>,
    /// Both, and the deadline, as every connection carries them: made
    /// once, so that a connection costs one reference, not a subscription.
    lingering: Arc<Lingering>,
}

impl Gate {
    pub(super) fn new(admission: Admission, workers: Option<Arc<Workers>>) -> Self {
        let open = Arc::new(OpenConnections::default());
        let ended_at_cut = Arc::new(OpenConnections::default());
        let (cut, watching) = watch::channel(false);
        let lingering = Arc::new(Lingering {
            open: OpenWork(Arc::clone(&open)),
            ended_at_cut: OpenWork(Arc::clone(&ended_at_cut)),
            cut: watching,
        });
        Self {
            workers,
            admission,
            draining: watch::channel(false).0,
            draining_flag: Arc::new(AtomicBool::new(false)),
            open,
            cut,
            ended_at_cut,
            lingering,
        }
    }

    /// What a connection's tunnels (and L4 relays) need of the set.
    pub(super) fn lingering(&self) -> Arc<Lingering> {
        Arc::clone(&self.lingering)
    }

    /// Counts open work besides connections (a `udp` listener's
    /// sessions, HTTP/3 connections) for drain.
    pub(super) fn open_work(&self) -> OpenWork {
        OpenWork(Arc::clone(&self.open))
    }

    /// The limits the active generation sets for a listener, and whether
    /// `peer` may (or must not) send it a PROXY header.
    pub(super) fn admit(&self, listener: &str, peer: std::net::IpAddr) -> (ListenerLimits, Proxy) {
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

/// What is known of a connection a worker accepted and admitted, on
/// its way (with its socket) to the worker that serves it.
struct Accepted {
    /// The peer (a trusted proxy, until its PROXY header is read).
    remote: SocketAddr,
    /// Whether a PROXY header is due from the peer.
    proxied: bool,
    limits: ListenerLimits,
    /// Counts it open until it ends.
    guard: ConnectionGuard,
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
        let all = &accepting.gate.open;
        if all.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            all.idle.notify_waiters();
        }
    }
}

/// Starts one accept loop per worker and socket of a TCP listener's
/// group (see `sockets::share`), each serving what it accepts on its
/// own worker; and HTTP/3 beside an `https` listener with `http3`.
pub(super) fn accept_on_workers(
    gate: &Arc<Gate>,
    certificates: &Arc<CertStore>,
    listener: BoundListener,
    alt_svc: Option<Arc<AltSvc>>,
) -> bool {
    let name: Arc<str> = Arc::from(listener.spec.name.as_str());
    let tls = match listener.spec.protocol {
        ListenerProtocol::Https => match certificates.server_config(&name) {
            Ok(config) => Some(super::serve::Tls {
                acceptor: TlsAcceptor::from(config),
                store: Arc::clone(certificates),
            }),
            Err(error) => {
                tracing::error!(listener = %name, %error, "cannot set up TLS; listener not accepting");
                return false;
            }
        },
        _ => None,
    };
    // Where clients connect: the bound address, unless it is a
    // wildcard (then each connection's own, asked of the socket).
    let bound = listener.local_addr;
    // HTTP/3 beside it (started by the set) is advertised on this
    // side while it serves.
    let alt_svc = alt_svc.filter(|_| tls.is_some());
    let label = || name.to_string();
    let accepting = Arc::new(Accepting {
        gate: Arc::clone(gate),
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
        workers: (0..gate.workers.as_ref().map_or(1, |w| w.threads()))
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
    accepting.spawn_loops(&listener.sockets);
    true
}

impl Accepting {
    /// One accept loop per worker on its share of the listener's
    /// `sockets` (`sockets::share`), each on its worker.
    fn spawn_loops(self: &Arc<Self>, sockets: &[ListenerSocket]) {
        let gate = &self.gate;
        let sockets: Vec<Arc<std::net::TcpListener>> = sockets
            .iter()
            .filter_map(|socket| match socket {
                ListenerSocket::Tcp(socket) => Some(Arc::clone(socket)),
                ListenerSocket::Udp(_) => None,
            })
            .collect();
        let workers = gate.workers.as_ref().map_or(1, |w| w.threads());
        for worker in 0..workers {
            for index in sockets::share(worker, workers, sockets.len()) {
                // Each loop owns a duplicate, registered with its own
                // worker's reactor; the set keeps the original for a
                // hand-over until draining.
                let socket = match sockets[index].try_clone() {
                    Ok(socket) => socket,
                    Err(error) => {
                        tracing::error!(listener = %self.name, worker, %error, "cannot accept on a listening socket");
                        continue;
                    }
                };
                let accepting = Arc::clone(self);
                let accept =
                    move || -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
                        Box::pin(accepting.accept_loop(socket, worker))
                    };
                match &gate.workers {
                    Some(workers) => workers.spawn_on(worker, Box::new(accept)),
                    None => {
                        tokio::spawn(accept());
                    }
                }
            }
        }
    }
}

/// What every accept loop of one TCP listener shares.
struct Accepting {
    gate: Arc<Gate>,
    name: Arc<str>,
    bound: SocketAddr,
    wildcard: bool,
    responses: Arc<[metrics::Counter; 5]>,
    gauge: metrics::Gauge,
    tcp_counters: Option<TcpCounters>,
    tls: Option<super::serve::Tls>,
    scheme: Scheme,
    alt_svc: Option<Arc<AltSvc>>,
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
pub(in crate::proxy) fn balance(loads: impl Iterator<Item = usize>, worker: usize) -> usize {
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
        let mut draining = self.gate.draining.subscribe();
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
            self.dispatch(stream, remote, worker);
        }
        tracing::info!(listener = %self.name, worker, "listener closed");
    }

    /// Admits a connection this worker accepted (trusted PROXY peers,
    /// the listener's cap) and serves it on the worker `balance` picks.
    fn dispatch(self: &Arc<Self>, stream: std::net::TcpStream, remote: SocketAddr, worker: usize) {
        let (limits, proxy) = self.gate.admit(&self.name, remote.ip());
        // A PROXY header is taken only from the proxies trusted to
        // send one: anyone else could claim any address.
        if proxy == Proxy::Untrusted {
            self.untrusted.increment(1);
            tracing::debug!(listener = %self.name, peer = %remote, "PROXY header expected from an untrusted peer; closing");
            return;
        }
        // Over the listener's cap: closed at once, before it costs a
        // task or a buffer (the client sees a reset or an EOF). The
        // place is taken before it is checked, so that loops on other
        // workers cannot overshoot the cap together.
        let before = self.open.fetch_add(1, Ordering::AcqRel);
        if let Some(max) = limits.max_connections.filter(|max| before >= *max) {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.refuse(max);
            return;
        }
        let serving = self.balance(worker);
        self.gate.open.count.fetch_add(1, Ordering::AcqRel);
        self.gauge.increment(1.0);
        self.accepted.increment(1);
        let guard = ConnectionGuard {
            accepting: Arc::clone(self),
            worker: serving,
        };
        let accepted = Accepted {
            remote,
            proxied: proxy == Proxy::Trusted,
            limits,
            guard,
        };
        let workers = self.gate.workers.as_ref().filter(|_| serving != worker);
        let Some(workers) = workers else {
            tokio::spawn(Arc::clone(self).connection_task(stream, accepted));
            return;
        };
        // Served elsewhere: registered with that worker's reactor
        // only (it never was with this one's).
        self.rebalanced.increment(1);
        let accepting = Arc::clone(self);
        workers.spawn_on(
            serving,
            Box::new(move || accepting.connection_task(stream, accepted)),
        );
    }

    /// The task that serves one accepted connection to its end, on the
    /// worker that polls it: an L4 relay (`tcp.rs`) or an HTTP connection
    /// (`serve.rs`), each a future of its own size (one future for both
    /// would be as large as the larger for every connection), boxed where
    /// it is made (tokio moves a task's future several times while
    /// spawning it, and a box moves as a pointer).
    fn connection_task(
        self: Arc<Self>,
        stream: std::net::TcpStream,
        accepted: Accepted,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        match self.tcp_counters.clone() {
            Some(counters) => {
                crate::boxed::pin_in_place(|| self.relay_accepted(stream, accepted, counters))
            }
            None => crate::boxed::pin_in_place(|| self.serve_accepted(stream, accepted)),
        }
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

    /// What every request of an HTTP connection from `remote` shares.
    fn context(&self, stream: &TcpStream, remote: SocketAddr) -> Arc<ConnContext> {
        let local = if self.wildcard {
            stream.local_addr().unwrap_or(self.bound)
        } else {
            self.bound
        };
        Arc::new(ConnContext {
            listener: Arc::clone(&self.name),
            admission: self.gate.admission.clone(),
            remote,
            local,
            client_ip: client_ip_header(remote),
            scheme: self.scheme.clone(),
            responses: Arc::clone(&self.responses),
            draining: Arc::clone(&self.gate.draining_flag),
            activity: Activity::new(),
            interim: InterimQueue::new(),
            alt_svc: self.alt_svc.clone(),
            tls: std::sync::OnceLock::new(),
            lingering: self.gate.lingering(),
        })
    }

    /// Serves one accepted HTTP connection on this worker, to its end.
    async fn serve_accepted(self: Arc<Self>, stream: std::net::TcpStream, accepted: Accepted) {
        // An HTTP client's first bytes (a request head, a ClientHello)
        // usually arrive with its connection: taken before the socket is
        // registered, they cost one read, where waiting for them costs a
        // trip through epoll, a timer and a peek. A PROXY header is read
        // exactly.
        let mut first = Vec::new();
        if !accepted.proxied {
            match serve::read_arrived(&stream, &mut first) {
                // Closed before a byte: a port check.
                Ok(0) => return,
                Ok(_) => {}
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
        let Some((stream, remote)) = self.register(stream, &accepted).await else {
            return;
        };
        let ctx = self.context(&stream, remote);
        let draining = self.gate.draining.subscribe();
        let tls = self.tls.clone();
        serve::serve_http_connection(stream, first, ctx, accepted.limits, draining, tls).await;
        drop(accepted.guard);
    }

    /// Relays one accepted TCP connection on this worker, to its end;
    /// what arrives is relayed as it comes.
    async fn relay_accepted(
        self: Arc<Self>,
        stream: std::net::TcpStream,
        accepted: Accepted,
        counters: TcpCounters,
    ) {
        let Some((stream, remote)) = self.register(stream, &accepted).await else {
            return;
        };
        let _relay = OpenWork(Arc::clone(&self.gate.ended_at_cut)).hold();
        tcp::relay_connection(
            stream,
            remote,
            Arc::clone(&self.name),
            self.gate.admission.clone(),
            counters,
            self.gate.cut.subscribe(),
        )
        .await;
        drop(accepted.guard);
    }

    /// Registers an accepted socket with this worker's reactor, and reads
    /// the client's address from a trusted proxy's PROXY header when one
    /// is due (None: the connection is to be closed).
    async fn register(
        &self,
        stream: std::net::TcpStream,
        accepted: &Accepted,
    ) -> Option<(TcpStream, SocketAddr)> {
        let mut stream = match TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(listener = %self.name, %error, "cannot register a connection");
                return None;
            }
        };
        let (remote, proxied) = (accepted.remote, accepted.proxied);
        let timeout = accepted.limits.header_read_timeout;
        let remote = client_address(&mut stream, remote, proxied, timeout, &self.name).await?;
        Some((stream, remote))
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
pub(super) enum Proxy {
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
    let read = accept_proxy::read(stream, timeout).await;
    let outcome = match &read {
        Ok(_) => "accepted",
        Err(accept_proxy::HeaderError::Timeout(_)) => "timeout",
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

#[cfg(test)]
mod tests {
    use super::{balance, out_of_resources};

    #[test]
    fn only_exhaustion_makes_the_accept_loop_back_off() {
        use rustix::io::Errno;
        let os = |e: Errno| std::io::Error::from_raw_os_error(e.raw_os_error());
        for exhausted in [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM] {
            assert!(out_of_resources(&os(exhausted)), "{exhausted:?}");
        }
        for one_connection in [
            Errno::CONNABORTED,
            Errno::PROTO,
            Errno::PERM,
            Errno::NETUNREACH,
        ] {
            assert!(!out_of_resources(&os(one_connection)), "{one_connection:?}");
        }
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

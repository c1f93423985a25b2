//! HTTP/3 on `https` listeners with `http3 = true`: QUIC (quinn) on UDP
//! at the listener's address, HTTP/3 framing (h3). Each request stream is
//! served by the same `handle` as HTTP/1.1 and HTTP/2 requests, so it is
//! pinned to the generation that admits it and every route, upstream and
//! policy applies; one QUIC connection may carry requests of several
//! generations. Handshakes take the listener's certificates from the
//! process's certificate store, so `reload-certs` covers them.
//!
//! Lifecycle. While HTTP/3 serves, the TCP side advertises it
//! (`alt-svc`). Draining stops that, refuses new QUIC connections, sends
//! every connection a GOAWAY and lets its streams finish (drain waits for
//! them like for TCP connections). A drain-aware upgrade hands the UDP
//! group over: the successor serves new connections on it at once, and
//! a packet either process reads for the other's connection is relayed to
//! it (`steering`), so this process's connections finish here.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::activity::Activity;
use super::conn::AltSvc;
use super::conn::OpenWork;
use super::conn::{client_ip_header, listener_counters, ConnContext};
use super::interim::InterimQueue;
use super::listener::accept::balance;
use super::sockets;
use super::steering::{self, InheritedGroup, Link, QuicGroup, SteeredSocket, Tag, WorkerCids};
use crate::admission::Admission;
use crate::backends::BoxError;
use crate::plan::ListenerLimits;
use crate::telemetry::metrics as m;
use crate::tls::CertStore;

/// What serving one listener's HTTP/3 needs.
pub struct Http3 {
    pub name: Arc<str>,
    pub address: SocketAddr,
    pub admission: Admission,
    pub certificates: Arc<CertStore>,
    /// The listener's limits as the active generation sets them (read
    /// for every new connection: they are live).
    pub limits: Arc<dyn Fn() -> ListenerLimits + Send + Sync>,
    pub draining: watch::Receiver<bool>,
    pub draining_flag: Arc<std::sync::atomic::AtomicBool>,
    pub open: OpenWork,
    /// No tunnel opens over HTTP/3 (no protocol switch there); the
    /// connection context carries it all the same.
    pub lingering: Arc<super::conn::Lingering>,
    pub alt_svc: Arc<AltSvc>,
    /// `http3_early_data`: accept 0-RTT requests (idempotent ones).
    pub early_data: bool,
    /// The data-plane threads each connection's requests are served on
    /// (the endpoint's packets are on this runtime).
    pub workers: Option<Arc<super::workers::Workers>>,
    /// The UDP group the previous process handed over for this listener,
    /// served instead of a group of its own.
    pub inherited: Option<InheritedGroup>,
    /// Where the group is kept for the next drain-aware upgrade.
    pub group: Arc<Mutex<Option<QuicGroup>>>,
}

/// How often a taken UDP port is tried again (a predecessor draining).
const BIND_RETRY: Duration = Duration::from_millis(100);

/// Serves HTTP/3 until the listener drains: one QUIC endpoint per
/// data-plane worker (at most `steering::MAX_MEMBERS`), each on its own
/// UDP socket of the listener's group (`sockets::udp_group`, or the group
/// the previous process handed over), its packets steered to it by
/// connection ID (`sockets::steer_quic`) and, during a hand-over, to the
/// process that knows the connection (`steering`); an endpoint's packet
/// I/O, crypto, timers and requests all run on its worker. Where
/// steering cannot be attached, one endpoint serves alone.
pub async fn serve_endpoint(mut h3: Http3) {
    let Some(group) = group_to_serve(&mut h3).await else {
        return;
    };
    let InheritedGroup {
        sockets,
        tag,
        relays,
    } = group;
    let links: Vec<Arc<Link>> = sockets
        .iter()
        .map(|_| Link::new(Arc::clone(&h3.draining_flag)))
        .collect();
    keep_for_hand_over(&h3, &sockets, tag, &links);
    let server = match shared_server_config(&h3) {
        Ok(server) => server,
        Err(error) => {
            tracing::error!(listener = %h3.name, %error, "cannot serve HTTP/3");
            return;
        }
    };
    let members = sockets.len();
    let shared = Arc::new(Endpoints {
        server,
        started: AtomicUsize::new(0),
        members,
        open_connections: AtomicUsize::new(0),
        loads: (0..members).map(|_| AtomicUsize::new(0)).collect(),
        accepting: (0..members).map(|_| AtomicBool::new(false)).collect(),
        served: (0..members)
            .map(|member| metrics::counter!(m::WORKER_CONNECTIONS, m::LABEL_WORKER => member.to_string()))
            .collect(),
        rebalanced: metrics::counter!(m::CONNECTIONS_REBALANCED, m::LABEL_LISTENER => h3.name.to_string()),
        responses: listener_counters(&h3.name),
        refused: metrics::counter!(m::CONNECTIONS_REFUSED, m::LABEL_LISTENER => h3.name.to_string()),
        accepted: metrics::counter!(m::CONNECTIONS_ACCEPTED, m::LABEL_LISTENER => h3.name.to_string()),
        gauge: metrics::gauge!(m::DOWNSTREAM_CONNECTIONS, m::LABEL_LISTENER => h3.name.to_string()),
        tag,
        h3,
    });
    let mut relays = relays.into_iter();
    for ((member, socket), link) in sockets.into_iter().enumerate().zip(links) {
        let endpoints = Arc::clone(&shared);
        let joined = Joined {
            link,
            predecessor: relays.next(),
        };
        let run = move || -> Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
            Box::pin(endpoints.endpoint(member, socket, joined))
        };
        match &shared.h3.workers {
            Some(workers) => workers.spawn_on(member, Box::new(run)),
            None => {
                tokio::spawn(run());
            }
        }
    }
}

/// The UDP group to serve: the one the previous process handed over, or
/// one bound here (`None` once the listener drains before it is bound),
/// with steering attached; where it cannot be attached to a group of our
/// own, one socket serves alone.
async fn group_to_serve(h3: &mut Http3) -> Option<InheritedGroup> {
    let workers = h3
        .workers
        .as_ref()
        .map_or(1, |w| w.threads())
        .min(steering::MAX_MEMBERS);
    let mut group = match h3.inherited.take() {
        Some(group) if !group.sockets.is_empty() => {
            tracing::info!(listener = %h3.name, endpoints = group.sockets.len(), "HTTP/3: serving on the UDP sockets the previous process handed over, beside its connections");
            group
        }
        _ => InheritedGroup {
            sockets: bind(h3, workers).await?,
            tag: Tag::default(),
            relays: Vec::new(),
        },
    };
    if group.sockets.len() > 1 {
        if let Err(error) = sockets::steer_quic(&group.sockets[0], group.sockets.len()) {
            if group.relays.is_empty() {
                tracing::warn!(listener = %h3.name, %error, "HTTP/3: cannot steer packets to per-worker endpoints; one endpoint serves");
                group.sockets.truncate(1);
            } else {
                // The previous process's program stays attached to the group.
                tracing::warn!(listener = %h3.name, %error, "HTTP/3: cannot attach steering to the handed-over group; the previous process's steering stays");
            }
        }
    }
    Some(group)
}

/// Keeps duplicates of the group's sockets and the endpoints' links where
/// a drain-aware upgrade finds them (`ListenerSet::hand_over_quic`).
fn keep_for_hand_over(h3: &Http3, sockets: &[std::net::UdpSocket], tag: Tag, links: &[Arc<Link>]) {
    match sockets.iter().map(std::net::UdpSocket::try_clone).collect() {
        Ok(kept) => {
            *h3.group.lock().unwrap_or_else(PoisonError::into_inner) = Some(QuicGroup {
                tag,
                sockets: kept,
                links: links.to_vec(),
            });
        }
        Err(error) => {
            tracing::warn!(listener = %h3.name, %error, "HTTP/3: the UDP group is not kept for an upgrade; the next process binds it once this one is gone");
        }
    }
}

/// What the endpoints of one listener share.
struct Endpoints {
    h3: Http3,
    server: quinn::ServerConfig,
    /// Endpoints serving; `alt-svc` is advertised once all are.
    started: AtomicUsize,
    members: usize,
    /// The listener's QUIC connections, over all endpoints.
    open_connections: AtomicUsize,
    /// Each endpoint's share of them.
    loads: Box<[AtomicUsize]>,
    /// Which endpoints accept new connections: a Retry never sends a
    /// client to one that does not (not started yet, or draining).
    accepting: Box<[AtomicBool]>,
    /// `cutover_worker_connections_total` of each endpoint's worker.
    served: Box<[metrics::Counter]>,
    rebalanced: metrics::Counter,
    responses: Arc<[metrics::Counter; 5]>,
    refused: metrics::Counter,
    accepted: metrics::Counter,
    gauge: metrics::Gauge,
    /// What this process's connection IDs carry (`steering::Tag`).
    tag: Tag,
}

/// How an endpoint is joined to its counterparts in the processes before
/// and after this one (`steering`).
struct Joined {
    link: Arc<Link>,
    /// The relay to the previous process's endpoint on the same socket.
    predecessor: Option<OwnedFd>,
}

impl Endpoints {
    /// One endpoint on the calling worker, until the listener drains and
    /// its connections are gone.
    async fn endpoint(self: Arc<Self>, member: usize, socket: std::net::UdpSocket, joined: Joined) {
        let h3 = &self.h3;
        let mut applied = (h3.limits)();
        let mut draining = h3.draining.clone();
        let Some(endpoint) = self
            .start(member, socket, joined, &applied, &mut draining)
            .await
        else {
            return;
        };
        self.set_accepting(member, true);
        let local = endpoint.local_addr().unwrap_or(h3.address);
        if self.started.fetch_add(1, Ordering::AcqRel) + 1 == self.members {
            tracing::info!(listener = %h3.name, address = %local, endpoints = self.members, "HTTP/3 accepting");
            h3.alt_svc.set_serving(true);
        }
        loop {
            let incoming = tokio::select! {
                incoming = endpoint.accept() => incoming,
                _ = async { let _ = draining.wait_for(|d| *d).await; } => break,
            };
            let Some(incoming) = incoming else { break };
            let limits = (h3.limits)();
            // Stream cap and idle timeout apply to connections from now on.
            if (limits.max_concurrent_streams, limits.keepalive_timeout)
                != (applied.max_concurrent_streams, applied.keepalive_timeout)
            {
                match server_config(&self.server, &limits) {
                    Ok(config) => {
                        endpoint.set_server_config(Some(config));
                        applied = limits;
                    }
                    Err(error) => {
                        tracing::error!(listener = %h3.name, %error, "HTTP/3 limits not applied")
                    }
                }
            }
            // A client's first packet lands on an endpoint by the
            // connection ID it chose at random: a few busy connections can
            // all land on one worker. A markedly busier endpoint than
            // another answers with a Retry whose new ID names the other,
            // where the client's next Initial then goes (one round trip
            // more for that connection; the balance of TCP listeners,
            // `listener::accept::balance`, decides when).
            if let Some(incoming) = self.rebalance(incoming, member) {
                self.serve(incoming, member, local, limits);
            }
        }
        // Draining: no more advertising, no new connections; those open
        // get a GOAWAY from their own task and finish their streams.
        h3.alt_svc.set_serving(false);
        self.set_accepting(member, false);
        endpoint.set_server_config(None);
        if member == 0 {
            tracing::info!(listener = %h3.name, "HTTP/3 closed to new connections");
        }
        // The endpoint (and its socket) lives while connections do.
        endpoint.wait_idle().await;
    }

    /// Starts member `member`'s endpoint on `socket`, joined to the
    /// processes before and after this one, trying again until it starts
    /// or the listener drains (`None`).
    async fn start(
        &self,
        member: usize,
        socket: std::net::UdpSocket,
        joined: Joined,
        applied: &ListenerLimits,
        draining: &mut watch::Receiver<bool>,
    ) -> Option<quinn::Endpoint> {
        let h3 = &self.h3;
        let (members, tag) = (self.members, self.tag);
        // The socket stays open while an endpoint fails to start on a
        // duplicate of it: closing it would shrink the group under the
        // steering program and send another member's packets astray.
        let start = || -> Result<quinn::Endpoint, BoxError> {
            let mut config = quinn::EndpointConfig::default();
            config.cid_generator(move || {
                Box::new(WorkerCids {
                    member,
                    members,
                    tag,
                })
            });
            let server = server_config(&self.server, applied)?;
            let predecessor = joined
                .predecessor
                .as_ref()
                .map(OwnedFd::try_clone)
                .transpose()?;
            let socket = SteeredSocket::new(
                socket.try_clone()?,
                tag,
                Arc::clone(&joined.link),
                predecessor,
                Arc::clone(&h3.name),
            )?;
            Ok(quinn::Endpoint::new_with_abstract_socket(
                config,
                Some(server),
                socket,
                Arc::new(quinn::TokioRuntime),
            )?)
        };
        let failed = |error: &BoxError, first: bool| {
            if first {
                tracing::error!(listener = %h3.name, member, %error, "HTTP/3: an endpoint cannot start; retrying, alt-svc is not advertised until every endpoint serves");
            } else {
                tracing::debug!(listener = %h3.name, member, %error, "HTTP/3: endpoint start retried");
            }
        };
        retry_start(start, failed, draining).await
    }

    /// Serves one connection attempt on its own task, unless the
    /// listener's `max_connections` is reached (then it is refused).
    fn serve(
        self: &Arc<Self>,
        incoming: quinn::Incoming,
        member: usize,
        local: SocketAddr,
        limits: ListenerLimits,
    ) {
        let h3 = &self.h3;
        // The place is taken before it is checked: endpoints on other
        // workers cannot overshoot the cap together.
        let counted = Counted::new(self, member);
        if limits
            .max_connections
            .is_some_and(|max| counted.before >= max)
        {
            self.refused.increment(1);
            incoming.refuse();
            return;
        }
        let remote = incoming.remote_address();
        // On a wildcard bind, the address the client reached.
        let reached = incoming
            .local_ip()
            .map_or(local, |ip| SocketAddr::new(ip, local.port()));
        let ctx = Arc::new(ConnContext {
            listener: Arc::clone(&h3.name),
            admission: h3.admission.clone(),
            remote,
            local: reached,
            client_ip: client_ip_header(remote),
            scheme: http::uri::Scheme::HTTPS,
            responses: Arc::clone(&self.responses),
            draining: Arc::clone(&h3.draining_flag),
            activity: Activity::new(),
            interim: InterimQueue::new(),
            alt_svc: None,
            tls: std::sync::OnceLock::new(),
            lingering: Arc::clone(&h3.lingering),
        });
        let hold = h3.open.hold();
        self.accepted.increment(1);
        if let Some(served) = self.served.get(member) {
            served.increment(1);
        }
        self.gauge.increment(1.0);
        let (gauge, draining, early_data) =
            (self.gauge.clone(), h3.draining.clone(), h3.early_data);
        let certificates = Arc::clone(&h3.certificates);
        tokio::spawn(async move {
            super::h3_connection::connection(
                incoming,
                ctx,
                limits,
                draining,
                early_data,
                certificates,
            )
            .await;
            gauge.decrement(1.0);
            drop((hold, counted));
        });
    }

    fn set_accepting(&self, member: usize, accepting: bool) {
        if let Some(flag) = self.accepting.get(member) {
            flag.store(accepting, Ordering::Relaxed);
        }
    }

    /// `incoming`, to be served here; `None` if a Retry sent it to a less
    /// loaded member.
    fn rebalance(&self, incoming: quinn::Incoming, member: usize) -> Option<quinn::Incoming> {
        // Not twice for one connection: a retried client comes back with
        // its address validated.
        if self.members < 2 || incoming.remote_address_validated() || !incoming.may_retry() {
            return Some(incoming);
        }
        let members = self.loads.iter().zip(self.accepting.iter());
        let target = retry_target(
            members.map(|(l, a)| (l.load(Ordering::Relaxed), a.load(Ordering::Relaxed))),
            member,
        );
        if target == member {
            return Some(incoming);
        }
        // The ID of the Retry is made during `retry`, on this thread.
        let retried = steering::retrying_to(target, || incoming.retry());
        match retried {
            Ok(()) => {
                self.rebalanced.increment(1);
                None
            }
            Err(error) => Some(error.into_incoming()),
        }
    }
}

/// The member a new client of `member` should be served by: the
/// listeners' `balance` over the members that accept connections (one
/// that does not would never answer the client's next Initial).
/// `members` gives each member's open connections and whether it accepts.
fn retry_target(members: impl Iterator<Item = (usize, bool)>, member: usize) -> usize {
    // `member` itself accepts and counts, so the least loaded one never
    // has the stand-in count of one that does not.
    let loads = members.enumerate().map(|(index, (load, accepting))| {
        if accepting || index == member {
            load
        } else {
            usize::MAX
        }
    });
    balance(loads, member)
}

/// First and longest wait between attempts to start an endpoint.
const START_RETRY: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(30));

/// Calls `start` until it succeeds, waiting 250 ms doubling to 30 s
/// between attempts and telling `failed` of each failure (`true` the
/// first time); `None` once the listener drains.
async fn retry_start<T>(
    mut start: impl FnMut() -> Result<T, BoxError>,
    failed: impl Fn(&BoxError, bool),
    draining: &mut watch::Receiver<bool>,
) -> Option<T> {
    let (mut wait, longest) = START_RETRY;
    let mut first = true;
    loop {
        match start() {
            Ok(started) => return Some(started),
            Err(error) => failed(&error, std::mem::replace(&mut first, false)),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = async { let _ = draining.wait_for(|d| *d).await; } => return None,
        }
        wait = (wait * 2).min(longest);
    }
}

/// Binds the listener's UDP group, waiting while the port is taken (a
/// predecessor still draining its HTTP/3 connections).
async fn bind(h3: &mut Http3, members: usize) -> Option<Vec<std::net::UdpSocket>> {
    let mut warned = false;
    loop {
        match sockets::udp_group(h3.address, members) {
            Ok((sockets, _)) => return Some(sockets),
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
                if !warned {
                    warned = true;
                    tracing::warn!(listener = %h3.name, address = %h3.address, "HTTP/3: the UDP port is taken (a previous process draining?); retrying until it is free");
                }
            }
            Err(error) => {
                tracing::error!(listener = %h3.name, address = %h3.address, %error, "HTTP/3: cannot bind the UDP socket; serving TCP only");
                return None;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(BIND_RETRY) => {}
            _ = async { let _ = h3.draining.wait_for(|d| *d).await; } => return None,
        }
    }
}

/// The QUIC server side every endpoint of a listener shares: the
/// listener's certificates (TLS 1.3, ALPN h3, 0-RTT with
/// `http3_early_data`), one session cache (a ticket from one endpoint
/// resumes, with early data, on any other) and one address-validation
/// token key.
fn shared_server_config(h3: &Http3) -> Result<quinn::ServerConfig, BoxError> {
    let tls = h3
        .certificates
        .quic_server_config(&h3.name, h3.early_data)?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    Ok(quinn::ServerConfig::with_crypto(Arc::new(crypto)))
}

/// `shared` with the listener's stream cap (`max_concurrent_streams`)
/// and idle timeout (`keepalive_timeout`: how long a connection may carry
/// no request).
fn server_config(
    shared: &quinn::ServerConfig,
    limits: &ListenerLimits,
) -> Result<quinn::ServerConfig, BoxError> {
    let mut config = shared.clone();
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(limits.max_concurrent_streams.into())
        .max_idle_timeout(Some(quinn::IdleTimeout::try_from(
            limits.keepalive_timeout,
        )?));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// Counts a QUIC connection against the listener's `max_connections`.
struct Counted {
    endpoints: Arc<Endpoints>,
    member: usize,
    /// How many were open before this one.
    before: usize,
}

impl Counted {
    fn new(endpoints: &Arc<Endpoints>, member: usize) -> Self {
        let before = endpoints.open_connections.fetch_add(1, Ordering::AcqRel);
        if let Some(load) = endpoints.loads.get(member) {
            load.fetch_add(1, Ordering::Relaxed);
        }
        Self {
            endpoints: Arc::clone(endpoints),
            member,
            before,
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.endpoints
            .open_connections
            .fetch_sub(1, Ordering::AcqRel);
        if let Some(load) = self.endpoints.loads.get(self.member) {
            load.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_that_fails_to_start_is_tried_again_until_it_starts_or_the_listener_drains()
    {
        let (drain, mut draining) = watch::channel(false);
        let attempts = std::cell::Cell::new(0);
        let failures = std::cell::RefCell::new(Vec::new());
        let started = tokio::time::Instant::now();
        let start = || {
            attempts.set(attempts.get() + 1);
            if attempts.get() < 4 {
                Err(BoxError::from("socket option refused"))
            } else {
                Ok(attempts.get())
            }
        };
        let failed = |_: &BoxError, first: bool| failures.borrow_mut().push(first);
        assert_eq!(retry_start(start, failed, &mut draining).await, Some(4));
        assert_eq!(*failures.borrow(), [true, false, false]);
        // 250 + 500 + 1000 ms of back-off.
        assert_eq!(started.elapsed(), Duration::from_millis(1750));

        // Never starting: the back-off stops at 30 s, and draining ends it.
        let attempts = std::cell::Cell::new(0u32);
        let never = || -> Result<(), BoxError> {
            attempts.set(attempts.get() + 1);
            Err("no".into())
        };
        let stop = async {
            tokio::time::sleep(Duration::from_secs(120)).await;
            let _ = drain.send(true);
        };
        let (outcome, ()) = tokio::join!(retry_start(never, |_, _| {}, &mut draining), stop);
        assert_eq!(outcome, None);
        // Attempts at 0, 0.25, 0.75, 1.75, 3.75, 7.75, 15.75 and 31.75 s,
        // then every 30 s: 61.75 and 91.75 s before the drain at 120 s.
        assert_eq!(attempts.get(), 10);
    }

    #[test]
    fn a_client_is_sent_on_only_to_a_less_loaded_endpoint_that_accepts() {
        let target = |loads: [usize; 3], accepting: [bool; 3]| {
            retry_target(loads.into_iter().zip(accepting), 0)
        };
        let all = [true, true, true];
        assert_eq!(target([2, 2, 1], all), 0, "within the margin");
        assert_eq!(target([5, 2, 1], all), 2, "to the least loaded");
        assert_eq!(target([5, 2, 1], [true, true, false]), 1);
        assert_eq!(target([5, 0, 0], [true, false, false]), 0);
    }
}

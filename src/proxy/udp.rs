//! UDP listeners: datagrams relayed per client session.
//!
//! A session is keyed by the client's address. Its first datagram pins
//! the generation active then, and the session keeps that generation's
//! backend for its life: a socket of its own, connected to the backend,
//! carries the client's datagrams there and the backend's answers back
//! (sent from the listener's socket, so the client sees the address it
//! wrote to). It ends after `idle_timeout` without a datagram either way
//! (one second once draining: a DNS or syslog exchange is over by then),
//! or when the backend refuses (ICMP port unreachable, reported to the
//! upstream's health like a refused TCP connect). `max_sessions` bounds
//! how many there are; a datagram that would open one more is dropped,
//! and counted, as UDP allows.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use metrics::{Counter, Gauge, Histogram};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};

use super::conn::{OpenHold, OpenWork};
use super::relay::Progress;
use crate::admission::Admission;
use crate::backends::Attempt;
use crate::telemetry::access::{self, Flags};
use crate::telemetry::metrics as m;

/// Datagrams a session holds for its backend before it drops new ones.
const QUEUE: usize = 64;
/// Largest datagram taken (the UDP maximum).
const MAX_DATAGRAM: usize = 65_535;
/// How long a session lasts without a datagram once the listener drains.
const DRAINING_IDLE: Duration = Duration::from_secs(1);

/// The series of one `udp` listener.
#[derive(Clone)]
struct Meters {
    datagrams_up: Counter,
    datagrams_down: Counter,
    bytes_up: Counter,
    bytes_down: Counter,
    dropped_max_sessions: Counter,
    dropped_queue_full: Counter,
    sessions: Gauge,
    duration: Histogram,
}

impl Meters {
    fn new(listener: &str) -> Self {
        let way = |name: &'static str, direction: &'static str| metrics::counter!(name, m::LABEL_LISTENER => listener.to_owned(), m::LABEL_DIRECTION => direction);
        let dropped = |reason: &'static str| metrics::counter!(m::UDP_DROPPED, m::LABEL_LISTENER => listener.to_owned(), "reason" => reason);
        Self {
            datagrams_up: way(m::UDP_DATAGRAMS, "downstream_to_upstream"),
            datagrams_down: way(m::UDP_DATAGRAMS, "upstream_to_downstream"),
            bytes_up: way(m::UDP_BYTES, "downstream_to_upstream"),
            bytes_down: way(m::UDP_BYTES, "upstream_to_downstream"),
            dropped_max_sessions: dropped("max_sessions"),
            dropped_queue_full: dropped("queue_full"),
            sessions: metrics::gauge!(m::UDP_SESSIONS, m::LABEL_LISTENER => listener.to_owned()),
            duration: metrics::histogram!(m::UDP_SESSION_DURATION, m::LABEL_LISTENER => listener.to_owned()),
        }
    }
}

/// The live sessions of one listener, by client address: each one's
/// number (told apart from a later session of the same client) and the
/// queue of its datagrams.
type Sessions = Arc<Mutex<HashMap<SocketAddr, (u64, mpsc::Sender<Bytes>)>>>;

/// Receives on a `udp` listener's socket until it drains, handing each
/// datagram to its client's session (opened on the first).
pub async fn serve_listener(
    socket: Arc<UdpSocket>,
    listener: Arc<str>,
    admission: Admission,
    mut draining: watch::Receiver<bool>,
    open: OpenWork,
) {
    let meters = Meters::new(&listener);
    let sessions: Sessions = Arc::default();
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let mut warned_at: Option<std::time::Instant> = None;
    let mut opened: u64 = 0;
    loop {
        let received = tokio::select! {
            received = socket.recv_from(&mut buffer) => received,
            _ = async { let _ = draining.wait_for(|d| *d).await; } => break,
        };
        let (n, client) = match received {
            Ok(pair) => pair,
            Err(error) => {
                // Linux reports an earlier send's ICMP error on the next
                // receive of an unconnected socket: nothing to do.
                tracing::debug!(listener = %listener, %error, "udp receive failed");
                continue;
            }
        };
        let datagram = Bytes::copy_from_slice(&buffer[..n]);
        let sender = {
            let mut live = sessions.lock().unwrap_or_else(PoisonError::into_inner);
            // A session that has ended but is still in the table (it takes
            // itself out as it ends) counts as none.
            match live.get(&client).filter(|(_, sender)| !sender.is_closed()) {
                Some((_, sender)) => Some(sender.clone()),
                None => {
                    let max = max_sessions(&admission, &listener);
                    if live.len() >= max {
                        meters.dropped_max_sessions.increment(1);
                        if warned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                            warned_at = Some(std::time::Instant::now());
                            tracing::warn!(listener = %listener, max_sessions = max, "max_sessions reached: dropping datagrams of new clients");
                        }
                        None
                    } else {
                        let (sender, receiver) = mpsc::channel(QUEUE);
                        opened += 1;
                        live.insert(client, (opened, sender.clone()));
                        let session = Session {
                            number: opened,
                            client,
                            listener: Arc::clone(&listener),
                            socket: Arc::clone(&socket),
                            sessions: Arc::clone(&sessions),
                            meters: meters.clone(),
                            draining: draining.clone(),
                            _open: open.hold(),
                        };
                        tokio::spawn(session.run(admission.clone(), receiver));
                        Some(sender)
                    }
                }
            }
        };
        if let Some(sender) = sender {
            if sender.try_send(datagram).is_err() {
                meters.dropped_queue_full.increment(1);
            }
        }
    }
    tracing::info!(listener = %listener, "udp listener stopped receiving");
}

/// The active generation's `max_sessions` for `listener`.
fn max_sessions(admission: &Admission, listener: &str) -> usize {
    let generation = admission.store().load_full();
    let max = generation
        .spec
        .listeners
        .iter()
        .find(|l| l.name == listener)
        .map_or(crate::plan::DEFAULT_UDP_MAX_SESSIONS, |l| l.l4.max_sessions);
    crate::admission::release(generation);
    max
}

/// Why a session could not reach its backend: the backend's doing (its
/// name, its address), or this process's (no socket to be had).
enum Unusable {
    Backend(std::io::Error),
    Local(std::io::Error),
}

/// One client's session.
struct Session {
    number: u64,
    client: SocketAddr,
    listener: Arc<str>,
    /// The listener's socket: answers go out from where the client wrote.
    socket: Arc<UdpSocket>,
    sessions: Sessions,
    meters: Meters,
    draining: watch::Receiver<bool>,
    _open: OpenHold,
}

impl Session {
    async fn run(mut self, admission: Admission, mut datagrams: mpsc::Receiver<Bytes>) {
        let started = std::time::Instant::now();
        self.meters.sessions.increment(1.0);
        let generation = admission.store().load_full();
        let _pinned = generation.ledger.connection();
        let mut line = access::enabled().then(|| {
            access::Line::new(
                "udp",
                Arc::clone(&self.listener),
                generation.id.0,
                self.client,
            )
        });
        let spec = generation
            .spec
            .listeners
            .iter()
            .find(|l| *l.name == *self.listener);
        let idle = spec
            .and_then(|l| l.l4.idle_timeout)
            .unwrap_or(crate::plan::DEFAULT_UDP_IDLE_TIMEOUT);
        let upstream = spec
            .and_then(|l| l.upstream.as_deref())
            .and_then(|name| generation.upstream(name).map(Arc::clone));
        crate::admission::release(generation);
        let progress = Progress::new();
        let flags = match upstream {
            None => Flags::NO_ROUTE,
            Some(upstream) => {
                self.through(&upstream, &mut line, &mut datagrams, &progress, idle)
                    .await
            }
        };
        // Out of the table first: a datagram from this client from now on
        // opens a new session (on the generation active then).
        {
            let mut live = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
            if live
                .get(&self.client)
                .is_some_and(|(n, _)| *n == self.number)
            {
                live.remove(&self.client);
            }
        }
        self.meters.sessions.decrement(1.0);
        let lived = started.elapsed();
        self.meters.duration.record(lived.as_secs_f64());
        if let Some(mut line) = line {
            line.duration = lived;
            line.ended = std::time::SystemTime::now();
            line.flags |= flags;
            line.bytes_in = progress.up.load(std::sync::atomic::Ordering::Relaxed);
            line.bytes_out = progress.down.load(std::sync::atomic::Ordering::Relaxed);
            access::emit(line);
        }
    }

    /// The session through a backend of `upstream` (by the client's hash
    /// or the policy): relayed until it idles out; the flags its line
    /// gets.
    async fn through(
        &mut self,
        upstream: &crate::generation::Upstream,
        line: &mut Option<access::Line>,
        datagrams: &mut mpsc::Receiver<Bytes>,
        progress: &Progress,
        idle: Duration,
    ) -> Flags {
        let hash = super::tcp::client_hash(upstream, self.client);
        let backend = upstream
            .pick_untried(&upstream.members(), hash, &mut Vec::new())
            .map(Arc::clone);
        match backend {
            None => Flags::NO_HEALTHY_BACKEND,
            Some(backend) => {
                if let Some(line) = line.as_mut() {
                    line.backend = Some(Arc::clone(&backend.label));
                    line.attempts = 1;
                }
                let _in_flight = backend.start_request();
                match self
                    .connect(&backend.key.addr, backend.key.connect_timeout)
                    .await
                {
                    Err(Unusable::Backend(error)) => {
                        upstream.report(&backend, Attempt::ConnectError, None);
                        tracing::warn!(listener = %self.listener, backend = %backend.key.addr, %error, "udp backend unusable");
                        Flags::CONNECT_FAILURE
                    }
                    // Not the backend's doing (out of descriptors):
                    // its health is left alone.
                    Err(Unusable::Local(error)) => {
                        tracing::error!(listener = %self.listener, %error, "cannot open a socket for a udp session");
                        Flags::CONNECT_FAILURE
                    }
                    Ok(server) => {
                        let ended = self.relay(&server, datagrams, progress, idle).await;
                        let attempt = if ended == Flags::CONNECT_FAILURE {
                            Attempt::ConnectError
                        } else {
                            Attempt::Answered(http::StatusCode::OK)
                        };
                        upstream.report(&backend, attempt, None);
                        ended
                    }
                }
            }
        }
    }

    /// A socket of the session's own, connected to the backend (so that
    /// only its answers arrive on it).
    async fn connect(&self, addr: &str, timeout: Duration) -> Result<UdpSocket, Unusable> {
        let resolve = tokio::time::timeout(timeout, tokio::net::lookup_host(addr)).await;
        let target = resolve
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "name resolution timed out")
            })
            .and_then(|found| found)
            .map_err(Unusable::Backend)?
            .next()
            .ok_or_else(|| {
                Unusable::Backend(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no address",
                ))
            })?;
        let local: SocketAddr = if target.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).await.map_err(Unusable::Local)?;
        socket.connect(target).await.map_err(Unusable::Backend)?;
        Ok(socket)
    }

    /// Moves datagrams both ways until the session idles out (no flag),
    /// or the backend refuses (`connect_failure`).
    async fn relay(
        &mut self,
        server: &UdpSocket,
        datagrams: &mut mpsc::Receiver<Bytes>,
        progress: &Progress,
        idle: Duration,
    ) -> Flags {
        let mut buffer = vec![0u8; MAX_DATAGRAM];
        loop {
            let draining = *self.draining.borrow();
            let idle = if draining {
                idle.min(DRAINING_IDLE)
            } else {
                idle
            };
            tokio::select! {
                datagram = datagrams.recv() => {
                    let Some(datagram) = datagram else { return Flags::NONE };
                    match server.send(&datagram).await {
                        Ok(n) => {
                            progress.moved(&progress.up, n);
                            self.meters.datagrams_up.increment(1);
                            self.meters.bytes_up.increment(n as u64);
                        }
                        Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => return Flags::CONNECT_FAILURE,
                        Err(error) => tracing::debug!(listener = %self.listener, %error, "udp send to backend failed"),
                    }
                }
                answer = server.recv(&mut buffer) => match answer {
                    Ok(n) => {
                        match self.socket.send_to(&buffer[..n], self.client).await {
                            Ok(_) => {
                                progress.moved(&progress.down, n);
                                self.meters.datagrams_down.increment(1);
                                self.meters.bytes_down.increment(n as u64);
                            }
                            Err(error) => tracing::debug!(listener = %self.listener, client = %self.client, %error, "udp send to client failed"),
                        }
                    }
                    // ICMP port unreachable from the backend.
                    Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => return Flags::CONNECT_FAILURE,
                    Err(error) => {
                        tracing::debug!(listener = %self.listener, %error, "udp receive from backend failed");
                        return Flags::UPSTREAM_RESET;
                    }
                },
                _ = progress.idle_for(idle) => return Flags::NONE,
                // Draining shortens the idle wait: look again.
                changed = self.draining.changed(), if !draining => {
                    // The listener set is gone: so is the process.
                    if changed.is_err() {
                        return Flags::NONE;
                    }
                }
            }
        }
    }
}

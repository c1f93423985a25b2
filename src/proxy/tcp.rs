//! The TCP (L4) proxy: one downstream connection, one upstream connection.
//!
//! A connection pins its generation for its lifetime, but keeps only the
//! slim part of it: the ledger entry (so status counts it under the
//! generation that admitted it) and the chosen backend. The route table of
//! an old generation is freed as soon as the connection is set up, so
//! thousands of activations with long-lived connections open cost bounded
//! memory, and activations never cut them. `runtime.max_pinned_age`
//! closes connections whose generation was superseded longer ago than that.
//!
//! A listener with `sni_routes` reads the ClientHello first and picks the
//! upstream by its server name (TLS pass-through: the gateway never
//! terminates it). An upstream with `proxy_protocol` gets a PROXY header
//! naming the client before the first byte of the client's. The bytes are
//! relayed by `relay` (zero-copy `splice` on Linux).

use std::net::SocketAddr;
use std::sync::Arc;

use metrics::Counter;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::conn::pinned_age_expired;
use super::relay::{self, Meters, Progress};
use crate::admission::Admission;
use crate::backends::{Attempt, Backend, ConnectError};
use crate::generation::Upstream;
use crate::plan::ProxyProtocol;
use crate::telemetry::access::{self, Flags};

/// Byte counters and the connection-duration histogram of one TCP
/// listener.
#[derive(Clone)]
pub struct TcpCounters {
    pub downstream_to_upstream: Counter,
    pub upstream_to_downstream: Counter,
    pub duration: metrics::Histogram,
}

/// Most backends one connection tries before it gives up.
const MAX_CONNECT_ATTEMPTS: usize = 3;

/// A connection as it is being set up: where it came from and its
/// access-log line.
struct Setup {
    listener: Arc<str>,
    client: SocketAddr,
    started: std::time::Instant,
    line: Option<access::Line>,
    duration: metrics::Histogram,
}

impl Setup {
    /// Records the connection's duration, and writes its line (when the
    /// access log is on) with `flags` and the bytes moved.
    fn finish(self, flags: Flags, progress: Option<&Progress>) {
        let lived = self.started.elapsed();
        self.duration.record(lived.as_secs_f64());
        if let Some(mut line) = self.line {
            line.duration = lived;
            line.ended = std::time::SystemTime::now();
            line.flags |= flags;
            if let Some(p) = progress {
                line.bytes_in = p.up.load(std::sync::atomic::Ordering::Relaxed);
                line.bytes_out = p.down.load(std::sync::atomic::Ordering::Relaxed);
            }
            access::emit(line);
        }
    }
}

/// Proxies one accepted TCP connection from `client` (the peer, or the
/// address a trusted PROXY header carried) until either side closes, it
/// idles past the listener's `idle_timeout`, its generation has been
/// superseded for longer than `max_pinned_age`, or the drain deadline
/// passes (`cut`).
pub async fn relay_connection(
    mut downstream: TcpStream,
    client: SocketAddr,
    listener: Arc<str>,
    admission: Admission,
    counters: TcpCounters,
    cut: tokio::sync::watch::Receiver<bool>,
) {
    let _ = downstream.set_nodelay(true);
    let generation = admission.store().load_full();
    let guard = generation.ledger.connection();
    let generation_id = generation.id;
    let mut setup = Setup {
        line: access::enabled()
            .then(|| access::Line::new("tcp", Arc::clone(&listener), generation_id.0, client)),
        listener,
        client,
        started: std::time::Instant::now(),
        duration: counters.duration.clone(),
    };
    let chosen = choose(&mut downstream, &generation, &mut setup).await;
    // Only the guard, the upstream and the backend outlive set-up.
    crate::admission::release(generation);
    let Chosen {
        upstream,
        idle_timeout,
        prefix,
    } = match chosen {
        Ok(chosen) => chosen,
        Err(flags) => {
            setup.finish(flags, None);
            return;
        }
    };
    let (server, backend, attempts) = match connect(&upstream, &mut setup).await {
        Ok(connected) => connected,
        Err(flags) => {
            let _ = downstream.shutdown().await;
            setup.finish(flags, None);
            return;
        }
    };
    let proxy_protocol = upstream.proxy_protocol;
    drop(upstream);
    let _backend_guard = backend.start_request();
    if let Some(line) = setup.line.as_mut() {
        line.backend = Some(Arc::clone(&backend.label));
        line.attempts = attempts;
        line.upstream_time = Some(setup.started.elapsed());
    }
    let progress = Progress::new();
    let opening = Opening {
        proxy_protocol,
        client,
        prefix,
    };
    if let Err(error) = opening
        .send(&downstream, &server, &progress, &counters)
        .await
    {
        tracing::debug!(listener = %setup.listener, backend = %backend.key.addr, %error, "upstream closed before the first bytes");
        setup.finish(Flags::UPSTREAM_RESET, Some(&progress));
        return;
    }
    let ends = Ends {
        store: Arc::clone(admission.store()),
        generation: generation_id,
        idle_timeout,
        cut,
    };
    let flags = relay_until_an_end(downstream, server, &counters, &progress, ends, &setup).await;
    // Both sockets are closed by now (the relay owned them).
    drop(guard);
    setup.finish(flags, Some(&progress));
}

/// Where a connection goes: its upstream, the listener's idle timeout
/// and what was read to choose (a ClientHello, sent on ahead).
struct Chosen {
    upstream: Arc<crate::generation::Upstream>,
    idle_timeout: Option<std::time::Duration>,
    prefix: Vec<u8>,
}

/// The listener's upstream in `generation` for this connection (by its
/// ClientHello with SNI pass-through); the flags to log when none takes
/// it.
async fn choose(
    downstream: &mut TcpStream,
    generation: &crate::generation::Generation,
    setup: &mut Setup,
) -> Result<Chosen, Flags> {
    let spec = generation
        .spec
        .listeners
        .iter()
        .find(|l| *l.name == *setup.listener)
        .ok_or(Flags::NO_ROUTE)?;
    // Pass-through: the ClientHello names the upstream; its bytes go on
    // to the backend ahead of the rest.
    let (upstream_name, prefix) = match &spec.l4.sni {
        None => (spec.upstream.clone(), Vec::new()),
        Some(sni) => by_client_hello(downstream, sni, setup).await?,
    };
    let upstream = upstream_name
        .and_then(|name| generation.upstream(&name).map(Arc::clone))
        .ok_or(Flags::NO_ROUTE)?;
    Ok(Chosen {
        upstream,
        idle_timeout: spec.l4.idle_timeout,
        prefix,
    })
}

/// What a backend gets before the relay starts: a PROXY header naming
/// the client (when the upstream sends one), then the ClientHello read
/// for SNI routing.
struct Opening {
    proxy_protocol: Option<crate::plan::ProxyProtocol>,
    client: SocketAddr,
    prefix: Vec<u8>,
}

impl Opening {
    async fn send(
        self,
        downstream: &TcpStream,
        server: &TcpStream,
        progress: &Progress,
        counters: &TcpCounters,
    ) -> std::io::Result<()> {
        // The listener's address, for a PROXY header only (a system call).
        let local = self.proxy_protocol.map(|version| {
            let local = downstream
                .local_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
            (version, local)
        });
        send_first(server, local, self.client, &self.prefix).await?;
        // The ClientHello counts as client bytes, as it would unread.
        let sent = self.prefix.len() as u64;
        progress
            .up
            .fetch_add(sent, std::sync::atomic::Ordering::Relaxed);
        counters.downstream_to_upstream.increment(sent);
        Ok(())
    }
}

/// The upstream a pass-through connection's ClientHello names (SNI,
/// ALPN), `None` when no route takes that name, and the hello's bytes;
/// the flags to log when there is no usable hello.
async fn by_client_hello(
    downstream: &mut TcpStream,
    sni: &crate::plan::SniSpec,
    setup: &mut Setup,
) -> Result<(Option<String>, Vec<u8>), Flags> {
    match super::client_hello::read(downstream, sni.client_hello_timeout).await {
        Ok(hello) => {
            let alpn: Vec<&[u8]> = hello.alpn.iter().map(Vec::as_slice).collect();
            let chosen = sni.upstream_for(hello.server_name.as_deref(), &alpn);
            if let Some(line) = setup.line.as_mut() {
                line.authority = hello.server_name.clone();
            }
            if chosen.is_none() {
                tracing::debug!(listener = %setup.listener, server_name = ?hello.server_name, "no SNI route for this name; closing");
            }
            Ok((chosen.map(str::to_owned), hello.bytes))
        }
        Err(error) => {
            tracing::debug!(listener = %setup.listener, client = %setup.client, %error, "no usable ClientHello; closing");
            Err(match error {
                super::client_hello::HelloError::Timeout(_) => Flags::HEADER_TIMEOUT,
                super::client_hello::HelloError::Closed => Flags::CLIENT_CLOSED,
                _ => Flags::PROTOCOL_ERROR,
            })
        }
    }
}

/// What ends a relay besides its sockets: no byte within `idle_timeout`,
/// its generation superseded past `max_pinned_age`, the drain deadline.
struct Ends {
    store: Arc<crate::runtime::GenerationStore>,
    generation: crate::ids::GenerationId,
    idle_timeout: Option<std::time::Duration>,
    cut: tokio::sync::watch::Receiver<bool>,
}

/// Relays bytes both ways until a side closes or an end comes; the flags
/// the access line gets.
async fn relay_until_an_end(
    downstream: TcpStream,
    server: TcpStream,
    counters: &TcpCounters,
    progress: &Progress,
    ends: Ends,
    setup: &Setup,
) -> Flags {
    let Ends {
        store,
        generation,
        idle_timeout,
        mut cut,
    } = ends;
    let meters = Meters {
        progress,
        up: &counters.downstream_to_upstream,
        down: &counters.upstream_to_downstream,
    };
    let idle = async {
        match idle_timeout {
            Some(idle) => progress.idle_for(idle).await,
            None => std::future::pending().await,
        }
    };
    let client = setup.client;
    tokio::select! {
        relayed = relay::relay(downstream, server, meters) => match relayed {
            Ok(()) => Flags::NONE,
            // Reset by one side or the other; which one is not known.
            Err(_) => Flags::UPSTREAM_RESET,
        },
        _ = idle => {
            tracing::debug!(listener = %setup.listener, client = %client, "no byte moved within idle_timeout; closing");
            Flags::IDLE_TIMEOUT
        }
        _ = pinned_age_expired(&store, generation) => {
            tracing::info!(listener = %setup.listener, generation = %generation, "closing a connection pinned past max_pinned_age");
            Flags::NONE
        }
        Ok(_) = cut.wait_for(|cut| *cut) => {
            tracing::info!(listener = %setup.listener, client = %client, "closing a connection still open at the drain deadline");
            Flags::DRAIN_TIMEOUT
        }
    }
}

/// Connects to a backend of `upstream`: the client's by its address when
/// the upstream hashes `client_ip`, else by the policy; a failed connect
/// (reported to the backend's health) moves on to a backend not tried
/// yet, up to `MAX_CONNECT_ATTEMPTS`. The flags for the access log when
/// none answered.
async fn connect(
    upstream: &Upstream,
    setup: &mut Setup,
) -> Result<(TcpStream, Arc<Backend>, u32), Flags> {
    let hash = client_hash(upstream, setup.client);
    let mut tried = Vec::with_capacity(MAX_CONNECT_ATTEMPTS);
    let mut flags = Flags::NONE;
    let members = upstream.members();
    let attempts = members.backends.len().clamp(1, MAX_CONNECT_ATTEMPTS);
    for attempt in 1..=attempts {
        let Some(backend) = upstream
            .pick_untried(&members, hash, &mut tried)
            .map(Arc::clone)
        else {
            break;
        };
        if attempt > 1 {
            flags |= Flags::RETRIED;
        }
        let connecting = std::time::Instant::now();
        let connected =
            crate::backends::dial(backend.key.addr.as_str(), backend.key.connect_timeout).await;
        match connected {
            Ok(stream) => {
                backend.connected_in(connecting.elapsed());
                upstream.report(&backend, Attempt::Answered(http::StatusCode::OK), None);
                if let Some(line) = setup.line.as_mut() {
                    line.flags |= flags;
                }
                return Ok((stream, backend, attempt as u32));
            }
            // Out of descriptors, buffers or local ports: this process's
            // trouble, not the backend's. Its health is left alone, and
            // no other backend would fare better.
            Err(ConnectError::Io(error)) if crate::backends::local_failure(&error) => {
                tracing::error!(listener = %setup.listener, backend = %backend.key.addr, %error, "cannot open a connection to a tcp backend");
                return Err(flags | Flags::CONNECT_FAILURE);
            }
            Err(ConnectError::Io(error)) => {
                upstream.report(&backend, Attempt::ConnectError, None);
                flags |= Flags::CONNECT_FAILURE;
                tracing::warn!(listener = %setup.listener, backend = %backend.key.addr, %error, attempt, "tcp upstream connect failed");
            }
            Err(ConnectError::Timeout(_)) => {
                upstream.report(&backend, Attempt::Timeout, None);
                flags |= Flags::CONNECT_FAILURE | Flags::UPSTREAM_TIMEOUT;
                tracing::warn!(listener = %setup.listener, backend = %backend.key.addr, attempt, "tcp upstream connect timed out");
            }
        }
        if let Some(line) = setup.line.as_mut() {
            line.backend = Some(Arc::clone(&backend.label));
            line.attempts = attempt as u32;
        }
    }
    if tried.is_empty() {
        tracing::warn!(listener = %setup.listener, upstream = %upstream.name, "tcp upstream has no backend");
        flags |= Flags::NO_HEALTHY_BACKEND;
    }
    Err(flags)
}

/// What an L4 connection or session hashes, when its upstream hashes:
/// the one key it has, its client's address.
pub(super) fn client_hash(upstream: &Upstream, client: SocketAddr) -> Option<u64> {
    match upstream.hash_key {
        Some(crate::plan::HashKey::ClientIp) => Some(crate::generation::hash_key(
            &super::edge::client_key(client.ip()),
        )),
        _ => None,
    }
}

/// What the upstream reads before the client's own bytes: the PROXY
/// header, if the upstream wants one, and what set-up read off the
/// client (a ClientHello).
async fn send_first(
    server: &TcpStream,
    proxy_protocol: Option<(ProxyProtocol, SocketAddr)>,
    client: SocketAddr,
    prefix: &[u8],
) -> std::io::Result<()> {
    let mut first = match proxy_protocol {
        Some((version, local)) => crate::backends::ProxyHeader {
            version,
            client,
            local,
        }
        .bytes(),
        None => Vec::new(),
    };
    first.extend_from_slice(prefix);
    let mut written = 0;
    while written < first.len() {
        server.writable().await?;
        match server.try_write(&first[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn running_out_of_descriptors_is_not_the_backends_failure() {
        use rustix::io::Errno;
        let os = |e: Errno| std::io::Error::from_raw_os_error(e.raw_os_error());
        let local = crate::backends::local_failure;
        assert!(local(&os(Errno::MFILE)));
        assert!(local(&os(Errno::ADDRNOTAVAIL)));
        assert!(!local(&os(Errno::CONNREFUSED)));
        assert!(!local(&os(Errno::HOSTUNREACH)));
        assert!(!local(&std::io::Error::other("not an OS error")));
    }
}

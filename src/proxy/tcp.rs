//! The TCP (L4) proxy: one downstream connection, one upstream connection.
//!
//! A connection pins its generation for its lifetime, but keeps only the
//! slim part of it: the ledger entry (so status counts it under the
//! generation that admitted it) and the chosen backend. The route table of
//! an old generation is freed as soon as the connection is set up, so
//! thousands of activations with long-lived connections open cost bounded
//! memory, and activations never cut them. `runtime.max_pinned_age`
//! closes connections whose generation was superseded longer ago than that.

use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::observed::Observed;
use crate::admission::Admission;
use crate::backends::Attempt;
use crate::ids::GenerationId;
use crate::runtime::GenerationStore;
use crate::telemetry::access::{self, Flags};

/// Byte counters of one TCP listener.
#[derive(Clone)]
pub struct TcpCounters {
    pub downstream_to_upstream: Counter,
    pub upstream_to_downstream: Counter,
}

/// Proxies one accepted TCP connection until either side closes, or its
/// generation has been superseded for longer than `max_pinned_age`.
pub async fn serve(
    mut downstream: TcpStream,
    listener: Arc<str>,
    admission: Admission,
    counters: TcpCounters,
) {
    let _ = downstream.set_nodelay(true);
    let started = std::time::Instant::now();
    let peer = downstream.peer_addr().ok();
    let generation = admission.store().load_full();
    let guard = generation.ledger.connection();
    let generation_id = generation.id;
    let backend = generation
        .spec
        .listeners
        .iter()
        .find(|l| *l.name == *listener)
        .and_then(|l| l.upstream.as_deref())
        .and_then(|name| generation.upstream(name))
        .and_then(|upstream| {
            // A TCP connection has one key to hash: its client's address.
            let picked = match (&upstream.hash_key, peer) {
                (Some(crate::plan::HashKey::ClientIp), Some(peer)) => upstream.pick_hashed(
                    crate::generation::hash_key(&super::edge::client_key(peer.ip())),
                ),
                _ => upstream.pick(),
            };
            Some((Arc::clone(upstream), Arc::clone(picked?)))
        });
    // Only the guard and the backend outlive set-up.
    crate::admission::release(generation);
    // The connection's access-log line, when the access log is on.
    let mut line = access::enabled().then(|| {
        let client = peer.unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        access::Line::new("tcp", Arc::clone(&listener), generation_id.0, client)
    });
    let finish = |line: Option<access::Line>| {
        if let Some(mut line) = line {
            line.duration = started.elapsed();
            line.ended = std::time::SystemTime::now();
            access::emit(line);
        }
    };
    let Some((upstream, backend)) = backend else {
        tracing::warn!(listener = %listener, "tcp listener has no upstream in the active generation");
        finish(line.map(|l| access::Line {
            flags: Flags::NO_HEALTHY_BACKEND,
            ..l
        }));
        return;
    };
    if let Some(line) = line.as_mut() {
        line.backend = Some(Arc::clone(&backend.label));
        line.attempts = 1;
    }
    let _backend_guard = backend.start_request();
    let connecting = std::time::Instant::now();
    let connect = tokio::time::timeout(
        backend.key.connect_timeout,
        TcpStream::connect(backend.key.addr.as_str()),
    )
    .await;
    let upstream = match connect {
        Ok(Ok(stream)) => {
            backend.connected_in(connecting.elapsed());
            upstream.report(&backend, Attempt::Answered(http::StatusCode::OK), None);
            if let Some(line) = line.as_mut() {
                line.upstream_time = Some(started.elapsed());
            }
            drop(upstream);
            stream
        }
        Ok(Err(error)) => {
            upstream.report(&backend, Attempt::ConnectError, None);
            tracing::warn!(listener = %listener, backend = %backend.key.addr, %error, "tcp upstream connect failed");
            let _ = downstream.shutdown().await;
            finish(line.map(|l| access::Line {
                flags: Flags::CONNECT_FAILURE,
                ..l
            }));
            return;
        }
        Err(_) => {
            upstream.report(&backend, Attempt::Timeout, None);
            tracing::warn!(listener = %listener, backend = %backend.key.addr, "tcp upstream connect timed out");
            let _ = downstream.shutdown().await;
            finish(line.map(|l| access::Line {
                flags: Flags::CONNECT_FAILURE | Flags::UPSTREAM_TIMEOUT,
                ..l
            }));
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let store = Arc::clone(admission.store());
    // Counted as they move: a connection that lives for days shows its
    // traffic while it does, and one closed by max_pinned_age keeps it.
    let mut downstream = Observed::new(downstream, Tally::new(counters.downstream_to_upstream));
    let mut upstream = Observed::new(upstream, Tally::new(counters.upstream_to_downstream));
    let flags = tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut downstream, &mut upstream) => {
            match copied {
                Ok(_) => Flags::NONE,
                // Reset by one side or the other; which one is not known.
                Err(_) => Flags::UPSTREAM_RESET,
            }
        }
        _ = pinned_age_expired(&store, generation_id) => {
            tracing::info!(listener = %listener, generation = %generation_id, "closing a connection pinned past max_pinned_age");
            let _ = downstream.shutdown().await;
            let _ = upstream.shutdown().await;
            Flags::NONE
        }
    };
    drop(guard);
    finish(line.map(|l| access::Line {
        bytes_in: downstream.observer.bytes,
        bytes_out: upstream.observer.bytes,
        flags,
        ..l
    }));
}

/// Counts what a TCP connection reads on one side: into the listener's
/// counter as it moves, and for the connection's access-log line.
struct Tally {
    counter: Counter,
    bytes: u64,
}

impl Tally {
    fn new(counter: Counter) -> Self {
        Self { counter, bytes: 0 }
    }
}

impl super::observed::Observer for Tally {
    fn read(&mut self, data: &[u8]) {
        self.counter.increment(data.len() as u64);
        self.bytes += data.len() as u64;
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
            .commit(GenerationId(1), generation(2))
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

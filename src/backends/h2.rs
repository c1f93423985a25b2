//! Plain h2c backends through cutover's own HTTP/2 client
//! (`crate::http2`): connections per worker, each shared by the worker's
//! requests up to the backend's stream limit. (TLS h2 backends, `auto`
//! and protocol upgrades still go through hyper's client.)

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{Request, Response};

use super::transport::{connect_error, TransportError};
use super::SignalledBody;
use crate::http2::{ClientSettings, Failed, RecvBody, SendRequest};
use crate::telemetry::series::Histogram;

/// Largest answer head (the HPACK-decoded list, RFC 9113 §6.5.2)
/// accepted from a backend: as for HTTP/1.1 backends.
const MAX_HEADER_LIST: u32 = 64 * 1024;
/// Times a request refused before any of it went out is sent again, on
/// another connection (a backend's GOAWAY racing it).
const RESENDS: usize = 3;

type Sender = SendRequest<SignalledBody>;

/// A backend's HTTP/2 connections, by worker.
pub struct H2Pool {
    shards: Box<[Mutex<Vec<Sender>>]>,
    settings: ClientSettings,
    connect_timeout: Duration,
    connect_time: Arc<Histogram>,
}

impl std::fmt::Debug for H2Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Pool")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl H2Pool {
    pub fn new(
        connect_timeout: Duration,
        idle_timeout: Duration,
        connect_time: Arc<Histogram>,
    ) -> Self {
        H2Pool {
            // One per worker and one for other threads (`client_shard`).
            shards: (0..=super::shards()).map(|_| Mutex::default()).collect(),
            settings: ClientSettings {
                max_header_list_size: MAX_HEADER_LIST,
                idle_timeout,
            },
            connect_timeout,
            connect_time,
        }
    }

    /// Sends `request` (its URI absolute) to `addr` and returns the
    /// answer's head.
    pub async fn send(
        &self,
        addr: &str,
        request: Request<SignalledBody>,
    ) -> Result<Response<RecvBody>, TransportError> {
        let mut request = request;
        for _ in 0..=RESENDS {
            let sender = match self.pick() {
                Some(sender) => sender,
                None => self.connect(addr).await?,
            };
            let answer = match sender.send(request) {
                Ok(answer) => answer,
                Err(back) => {
                    request = back;
                    continue;
                }
            };
            match answer.await {
                Ok(response) => return Ok(response),
                Err(Failed::Unsent(back)) => request = back,
                Err(Failed::Error(error)) => {
                    return Err(TransportError::Backend(format!("{addr}: {error}")))
                }
            }
        }
        Err(TransportError::Backend(format!(
            "{addr}: HTTP/2 connections closed under the request {} times",
            RESENDS + 1
        )))
    }

    fn shard(&self) -> &Mutex<Vec<Sender>> {
        // INVARIANT: `client_shard` returns an index below its argument.
        &self.shards[super::client_shard(self.shards.len())]
    }

    /// A connection of this worker's with room for a stream.
    fn pick(&self) -> Option<Sender> {
        let mut senders = self.shard().lock().unwrap_or_else(PoisonError::into_inner);
        senders.retain(|sender| !sender.is_closed());
        senders.iter().find(|sender| sender.has_room()).cloned()
    }

    /// A new connection, its task spawned on this worker.
    async fn connect(&self, addr: &str) -> Result<Sender, TransportError> {
        let started = Instant::now();
        let stream = super::dial(addr, self.connect_timeout)
            .await
            .map_err(|error| connect_error(addr, &error))?;
        self.connect_time.record(started.elapsed());
        let (sender, connection) = crate::http2::handshake(stream, self.settings);
        tokio::spawn(connection);
        self.shard()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sender.clone());
        Ok(sender)
    }
}

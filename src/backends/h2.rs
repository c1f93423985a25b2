//! h2c and h2 backends through cutover's own HTTP/2 client
//! (`crate::http2`): connections per worker, each shared by the worker's
//! requests up to the backend's stream limit, over TCP or TLS (ALPN
//! `h2`). (`auto` backends and protocol upgrades still go through
//! hyper's client.)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::{FutureExt, Shared};
use http::{Request, Response};
use rustls_pki_types::ServerName;

use super::transport::{connect_error, TransportError};
use super::SignalledBody;
use crate::http2::{ClientSettings, Failed, RecvBody, Resend, SendRequest};
use crate::telemetry::series::Histogram;

/// Largest answer head (the HPACK-decoded list, RFC 9113 §6.5.2)
/// accepted from a backend: as for HTTP/1.1 backends.
const MAX_HEADER_LIST: u32 = 64 * 1024;
/// Times a request is sent again, on another connection, when the
/// backend did not process it (a GOAWAY racing it) or the connection
/// picked for it filled up or closed first.
const RESENDS: usize = 3;

type Sender = SendRequest<SignalledBody>;

/// A connect in progress that every request of the worker waiting for a
/// connection shares: its connection, or the connect error's parts.
type Dialing = Shared<Dial>;
type Dial = Pin<Box<dyn Future<Output = Result<Sender, (bool, String)>> + Send>>;

#[derive(Default)]
struct Shard {
    senders: Vec<Sender>,
    /// At most one connect at a time per worker (hyper's pool does the
    /// same for HTTP/2): a burst of requests with no connection to take
    /// them waits for one, rather than opening one each.
    dialing: Option<Dialing>,
}

/// A backend's HTTP/2 connections, by worker.
pub struct H2Pool {
    shards: Box<[Mutex<Shard>]>,
    settings: ClientSettings,
    connect_timeout: Duration,
    connect_time: Arc<Histogram>,
    tls: Option<Tls>,
}

/// How an h2 backend's connections are secured.
#[derive(Clone)]
pub struct Tls {
    /// The backend's client configuration, offering only `h2` by ALPN.
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl Tls {
    /// `config` (the backend's `tls`) offering `h2`, for `name` (SNI and
    /// the verified name).
    pub fn new(mut config: rustls::ClientConfig, name: ServerName<'static>) -> Self {
        config.alpn_protocols = vec![b"h2".to_vec()];
        Tls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
        }
    }
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
        tls: Option<Tls>,
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
            tls,
        }
    }

    /// Sends `request` (its URI absolute) to `addr` and returns the
    /// answer's head.
    pub async fn send(
        &self,
        addr: &str,
        request: Request<SignalledBody>,
    ) -> Result<Response<RecvBody>, TransportError> {
        let mut request = request.map(Resend::new);
        for _ in 0..=RESENDS {
            let sender = self.connection(addr).await?;
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

    fn shard(&self) -> &Mutex<Shard> {
        // INVARIANT: `client_shard` returns an index below its argument.
        &self.shards[super::client_shard(self.shards.len())]
    }

    /// A connection of this worker's with room for a stream: one it has,
    /// or the one being opened, or a new one.
    async fn connection(&self, addr: &str) -> Result<Sender, TransportError> {
        let dialing = {
            let mut shard = self.shard().lock().unwrap_or_else(PoisonError::into_inner);
            shard.senders.retain(|sender| !sender.is_closed());
            if let Some(sender) = shard.senders.iter().find(|sender| sender.has_room()) {
                return Ok(sender.clone());
            }
            match &shard.dialing {
                Some(dialing) => dialing.clone(),
                None => {
                    let dialing = self.dial(addr).shared();
                    shard.dialing = Some(dialing.clone());
                    dialing
                }
            }
        };
        let dialed = dialing.clone().await;
        let mut shard = self.shard().lock().unwrap_or_else(PoisonError::into_inner);
        if shard.dialing.as_ref().is_some_and(|d| d.ptr_eq(&dialing)) {
            shard.dialing = None;
            if let Ok(sender) = &dialed {
                shard.senders.push(sender.clone());
            }
        }
        dialed.map_err(|(refused, detail)| TransportError::Connect { refused, detail })
    }

    /// Opens a connection; its task is spawned on the calling worker.
    fn dial(&self, addr: &str) -> Dial {
        let addr = addr.to_owned();
        let (timeout, settings) = (self.connect_timeout, self.settings);
        let connect_time = Arc::clone(&self.connect_time);
        let tls = self.tls.clone();
        Box::pin(async move {
            let started = Instant::now();
            let stream = super::dial(&addr, timeout)
                .await
                .map_err(|error| match connect_error(&addr, &error) {
                    TransportError::Connect { refused, detail } => (refused, detail),
                    other => (false, other.to_string()),
                })?;
            connect_time.record(started.elapsed());
            let Some(tls) = tls else {
                let (sender, connection) = crate::http2::handshake(stream, settings);
                tokio::spawn(connection);
                return Ok(sender);
            };
            let failed = |why: String| (false, format!("{addr}: TLS: {why}"));
            let stream = tls
                .connector
                .connect(tls.name.clone(), stream)
                .await
                .map_err(|e| failed(e.to_string()))?;
            if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(failed("the backend did not agree on h2 (ALPN)".into()));
            }
            let (sender, connection) = crate::http2::handshake(stream, settings);
            tokio::spawn(connection);
            Ok(sender)
        })
    }
}

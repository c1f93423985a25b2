//! HTTP/3 to a backend: `protocol = "h3"` and `protocol = "auto"`.
//!
//! `h3` sends every request over QUIC. `auto` sends them over TLS on TCP
//! (HTTP/2 or HTTP/1.1, as ALPN settles) until an answer's `Alt-Svc`
//! offers `h3` on the backend's own host (RFC 7838); a QUIC connection to
//! the port it names is then opened in the background, and requests take
//! it once its handshake is done. A request never waits for QUIC in
//! `auto`: while the connection is being opened, and whenever it cannot
//! be (UDP blocked, nothing on the port, a failed handshake), TCP serves.
//! A failed handshake or a broken connection marks QUIC broken for five
//! minutes, doubling with each failure in a row up to an hour (Chromium's
//! and Envoy's rule), then it is tried again; `Alt-Svc: clear` or an
//! offer's `ma` running out forgets it.
//!
//! Connections are pooled as the TCP clients are: one per worker (and one
//! for every other thread), each carrying as many concurrent requests as
//! the backend's stream limit allows. 0-RTT is never used: a replayed
//! request is the backend's problem to refuse, and cutover does not know
//! which of its requests are safe to replay.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http::header::{HeaderMap, HOST};
use http::{Request, Response, Uri};
use http_body::{Body, Frame};
use http_body_util::BodyExt;

use super::client::{BoxError, SignalledBody};
use crate::plan::UpstreamProtocol;

/// How long QUIC stays broken after its first failure, and at most.
const BROKEN_FIRST: Duration = Duration::from_secs(300);
const BROKEN_MOST: Duration = Duration::from_secs(3600);
/// An `Alt-Svc` offer without `ma` lasts a day (RFC 7838 §3.1).
const DEFAULT_MAX_AGE: Duration = Duration::from_secs(86_400);

/// The HTTP/3 side of a backend.
pub struct QuicClient {
    shared: Arc<Shared>,
    /// One pooled connection per worker, and one for other threads.
    slots: Box<[Slot]>,
}

/// One worker's connection, and how its last attempt to open one went.
#[derive(Default)]
struct Slot {
    state: Arc<tokio::sync::Mutex<SlotState>>,
    /// Attempts to open a connection so far (read before waiting for
    /// `state`, to tell an attempt made meanwhile).
    attempts: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct SlotState {
    pooled: Option<Pooled>,
    /// The last attempt that failed: its number and why.
    failed: Option<(u64, String)>,
}

struct Shared {
    /// `false` for `h3` (QUIC only), `true` for `auto`.
    auto: bool,
    config: quinn::ClientConfig,
    /// SNI and the name verified.
    server_name: String,
    /// `host:port` as configured (resolved at each connect).
    addr: String,
    connect_timeout: Duration,
    /// `auto`: what the backend offered, and whether QUIC is broken.
    offer: Mutex<Offer>,
    /// `auto`: a background connect is under way (one at a time).
    connecting: AtomicBool,
}

impl std::fmt::Debug for QuicClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicClient")
            .field("auto", &self.shared.auto)
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

/// An open HTTP/3 connection to the backend.
#[derive(Clone)]
pub struct Pooled {
    sender: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    connection: quinn::Connection,
}

impl Pooled {
    fn open(&self) -> bool {
        self.connection.close_reason().is_none()
    }
}

#[derive(Debug, Default)]
struct Offer {
    /// The UDP port `Alt-Svc` offered `h3` on, and until when.
    port: Option<(u16, Instant)>,
    broken_until: Option<Instant>,
    /// Failures in a row (each doubles the time QUIC stays broken).
    failures: u32,
}

/// Why a request could not be sent over QUIC.
#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    /// No connection could be opened: nothing was sent.
    #[error("{0}")]
    Connect(String),
    /// The exchange failed once the request was on its way.
    #[error("{0}")]
    Exchange(String),
}

impl QuicClient {
    /// The QUIC side of a backend of `protocol` (`H3` or `Auto`), `None`
    /// for the others. `tls` is the backend's TLS client configuration.
    pub fn new(
        protocol: UpstreamProtocol,
        addr: &str,
        server_name: Option<&str>,
        mut tls: rustls::ClientConfig,
        (connect_timeout, idle_timeout): (Duration, Duration),
        slots: usize,
    ) -> Result<Option<Self>, BoxError> {
        let auto = match protocol {
            UpstreamProtocol::H3 => false,
            UpstreamProtocol::Auto => true,
            _ => return Ok(None),
        };
        tls.alpn_protocols = vec![b"h3".to_vec()];
        // 0-RTT is never sent (see the module's comment).
        tls.enable_early_data = false;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        // A pooled connection idle longer than the backend's idle timeout
        // is closed by QUIC itself.
        transport.max_idle_timeout(Some(quinn::IdleTimeout::try_from(idle_timeout)?));
        config.transport_config(Arc::new(transport));
        Ok(Some(Self {
            shared: Arc::new(Shared {
                auto,
                config,
                server_name: server_name.unwrap_or(host_of(addr)).to_owned(),
                addr: addr.to_owned(),
                connect_timeout,
                offer: Mutex::new(Offer::default()),
                connecting: AtomicBool::new(false),
            }),
            slots: (0..slots.max(1)).map(|_| Slot::default()).collect(),
        }))
    }

    /// Whether every request goes over QUIC (`h3`), not only offered ones.
    pub fn only(&self) -> bool {
        !self.shared.auto
    }

    /// The connection a request takes: `Some` over QUIC, `None` over TCP
    /// (`auto` only, while QUIC is not up). For `h3`, waits for a
    /// connection to open (at most `connect_timeout`).
    pub async fn connection(&self, slot: usize) -> Result<Option<Pooled>, QuicError> {
        let Some(slot) = self.slots.get(slot).or(self.slots.last()) else {
            return Err(QuicError::Connect("no connection slot".into()));
        };
        if self.shared.auto {
            // Never wait: a slot being filled means TCP for this request.
            let Ok(state) = Arc::clone(&slot.state).try_lock_owned() else {
                return Ok(None);
            };
            if let Some(open) = state.pooled.as_ref().filter(|p| p.open()) {
                return Ok(Some(open.clone()));
            }
            if let Some(port) = self.shared.offered_port() {
                if !self.shared.connecting.swap(true, Ordering::AcqRel) {
                    let shared = Arc::clone(&self.shared);
                    tokio::spawn(async move {
                        let mut state = state;
                        match shared.open(port).await {
                            Ok(opened) => {
                                shared.worked();
                                state.pooled = Some(opened);
                            }
                            Err(error) => shared.failed(&error),
                        }
                        shared.connecting.store(false, Ordering::Release);
                    });
                }
            }
            return Ok(None);
        }
        let seen = slot.attempts.load(Ordering::Acquire);
        let mut state = slot.state.lock().await;
        if let Some(open) = state.pooled.as_ref().filter(|p| p.open()) {
            return Ok(Some(open.clone()));
        }
        // An attempt made while this request waited failed: its failure is
        // this request's too (a backend that does not answer costs the
        // requests waiting for it one connect timeout, not one each).
        if let Some((attempt, error)) = &state.failed {
            if *attempt > seen {
                return Err(QuicError::Connect(error.clone()));
            }
        }
        let attempt = slot.attempts.fetch_add(1, Ordering::AcqRel) + 1;
        let port = port_of(&self.shared.addr).unwrap_or(443);
        match self.shared.open(port).await {
            Ok(opened) => {
                state.pooled = Some(opened.clone());
                state.failed = None;
                Ok(Some(opened))
            }
            Err(error) => {
                state.failed = Some((attempt, error.to_string()));
                Err(error)
            }
        }
    }

    /// `auto`: reads the `Alt-Svc` of an answer that came over TCP.
    pub fn learn(&self, headers: &HeaderMap) {
        if !self.shared.auto {
            return;
        }
        let Some(value) = headers.get(http::header::ALT_SVC) else {
            return;
        };
        let Ok(value) = value.to_str() else {
            return;
        };
        let host = host_of(&self.shared.addr);
        let learned = match alt_svc_h3(value, host) {
            AltSvc::Clear => None,
            AltSvc::H3 { port, max_age } => Some((port, Instant::now() + max_age)),
            AltSvc::Nothing => return,
        };
        let mut offer = self
            .shared
            .offer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if offer.port.map(|(p, _)| p) != learned.map(|(p, _)| p) {
            // A new port is a new chance.
            offer.broken_until = None;
            offer.failures = 0;
        }
        offer.port = learned;
    }

    /// An exchange over `pooled` failed before any answer: in `auto`,
    /// QUIC is marked broken and the connection dropped from its slot.
    pub fn exchange_failed(&self, slot: usize, error: &QuicError) {
        if let Some(slot) = self.slots.get(slot) {
            if let Ok(mut state) = slot.state.try_lock() {
                if state.pooled.as_ref().is_some_and(|p| !p.open()) {
                    state.pooled = None;
                }
            }
        }
        if self.shared.auto && matches!(error, QuicError::Connect(_)) {
            self.shared.failed(error);
        }
    }
}

/// The admin view of a backend's HTTP/3 (`GET /admin/runtime/backends`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct QuicView {
    /// Connections open now (one per worker at most).
    pub connections: usize,
    /// `auto`: the UDP port the backend's `Alt-Svc` offers HTTP/3 on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_port: Option<u16>,
    /// `auto`: QUIC failed and TCP serves for this much longer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken_for_ms: Option<u64>,
    /// `auto`: failures in a row.
    pub failures: u32,
}

impl QuicClient {
    pub fn view(&self) -> QuicView {
        let connections = self
            .slots
            .iter()
            .filter(|slot| {
                slot.state
                    .try_lock()
                    .is_ok_and(|state| state.pooled.as_ref().is_some_and(Pooled::open))
            })
            .count();
        let offer = self
            .shared
            .offer
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        QuicView {
            connections,
            offered_port: offer
                .port
                .filter(|(_, until)| *until > now)
                .map(|(port, _)| port),
            broken_for_ms: offer
                .broken_until
                .and_then(|until| until.checked_duration_since(now))
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            failures: offer.failures,
        }
    }
}

impl Shared {
    /// The port `Alt-Svc` offers QUIC on, while the offer lasts and QUIC
    /// is not broken.
    fn offered_port(&self) -> Option<u16> {
        let mut offer = self.offer.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if offer.port.is_some_and(|(_, until)| until <= now) {
            offer.port = None;
        }
        if offer.broken_until.is_some_and(|until| until > now) {
            return None;
        }
        offer.port.map(|(port, _)| port)
    }

    fn worked(&self) {
        let mut offer = self.offer.lock().unwrap_or_else(PoisonError::into_inner);
        offer.failures = 0;
        offer.broken_until = None;
    }

    fn failed(&self, error: &QuicError) {
        let mut offer = self.offer.lock().unwrap_or_else(PoisonError::into_inner);
        let broken_for = BROKEN_FIRST
            .saturating_mul(1 << offer.failures.min(4))
            .min(BROKEN_MOST);
        offer.failures = offer.failures.saturating_add(1);
        offer.broken_until = Some(Instant::now() + broken_for);
        tracing::warn!(
            backend = %self.addr,
            error = %error,
            "HTTP/3 to the backend failed; TCP for the next {} s",
            broken_for.as_secs()
        );
    }

    /// Opens a connection to the backend's host on UDP `port` (at most
    /// `connect_timeout`).
    async fn open(&self, port: u16) -> Result<Pooled, QuicError> {
        let connecting = async {
            let host = host_of(&self.addr);
            let target = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
                .await
                .map_err(|e| format!("resolving {host}: {e}"))?
                .next()
                .ok_or_else(|| format!("{host} has no address"))?;
            let bind: SocketAddr = if target.is_ipv4() {
                (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let endpoint = quinn::Endpoint::client(bind).map_err(|e| format!("UDP socket: {e}"))?;
            let connection = endpoint
                .connect_with(self.config.clone(), target, &self.server_name)
                .map_err(|e| format!("{target}: {e}"))?
                .await
                .map_err(|e| format!("{target}: {e}"))?;
            let (mut driver, sender) =
                h3::client::new(h3_quinn::Connection::new(connection.clone()))
                    .await
                    .map_err(|e| format!("{target}: HTTP/3: {e}"))?;
            // The connection's control streams, until it closes (the
            // endpoint lives as long as this task holds it).
            tokio::spawn(async move {
                let _endpoint = endpoint;
                let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
            });
            Ok::<_, String>(Pooled { sender, connection })
        };
        match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(pooled)) => Ok(pooled),
            Ok(Err(detail)) => Err(QuicError::Connect(format!("{}: {detail}", self.addr))),
            Err(_) => Err(QuicError::Connect(format!(
                "{}: no QUIC handshake within {:?}",
                self.addr, self.connect_timeout
            ))),
        }
    }
}

/// Sends `request` over `pooled`: its head, then its body on a task of
/// its own (the answer may start before the body ends), and returns the
/// answer's head with its body to stream. When the stream cannot be
/// opened nothing was sent: with `keep`, the request comes back with the
/// error, to go another way (`auto`'s TCP).
pub async fn send(
    pooled: Pooled,
    request: Request<SignalledBody>,
    keep: bool,
) -> Result<Response<H3AnswerBody>, (QuicError, Option<Request<SignalledBody>>)> {
    let (mut parts, body) = request.into_parts();
    let mut headers = if keep {
        parts.headers.clone()
    } else {
        std::mem::take(&mut parts.headers)
    };
    // HTTP/3 carries the authority as `:authority`: the `Host` the
    // request would have had goes there.
    let mut uri = parts.uri.clone().into_parts();
    if let Some(host) = headers.remove(HOST) {
        uri.authority = host
            .to_str()
            .ok()
            .and_then(|h| h.parse().ok())
            .or(uri.authority);
    }
    uri.scheme = Some(http::uri::Scheme::HTTPS);
    let head = Uri::from_parts(uri).map(|uri| {
        let mut head = Request::new(());
        *head.method_mut() = parts.method.clone();
        *head.uri_mut() = uri;
        *head.version_mut() = http::Version::HTTP_3;
        *head.headers_mut() = headers;
        head
    });
    let head = match head {
        Ok(head) => head,
        Err(e) => return Err((QuicError::Exchange(e.to_string()), None)),
    };
    let mut sender = pooled.sender.clone();
    let stream = match sender.send_request(head).await {
        Ok(stream) => stream,
        // A connection that closed (GOAWAY, idle) before the request
        // went out: nothing was sent.
        Err(e) => {
            let request = keep.then(|| Request::from_parts(parts, body));
            return Err((
                QuicError::Connect(format!("opening a stream: {e}")),
                request,
            ));
        }
    };
    let (mut send, mut recv) = stream.split();
    if body.is_end_stream() {
        if let Err(e) = send.finish().await {
            return Err((QuicError::Exchange(format!("request: {e}")), None));
        }
    } else {
        tokio::spawn(async move {
            let mut body = body;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    // The client's body failed: the backend is told.
                    send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
                    return;
                };
                let sent = match frame.into_data() {
                    Ok(data) => send.send_data(data).await,
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => send.send_trailers(trailers).await,
                        Err(_) => Ok(()),
                    },
                };
                if sent.is_err() {
                    return;
                }
            }
            let _ = send.finish().await;
        });
    }
    let head = match recv.recv_response().await {
        Ok(head) => head,
        Err(e) => return Err((QuicError::Exchange(format!("answer: {e}")), None)),
    };
    let (parts, ()) = head.into_parts();
    Ok(Response::from_parts(
        parts,
        H3AnswerBody {
            recv,
            data_done: false,
            _connection: pooled.connection,
        },
    ))
}

/// An answer's body arriving over QUIC.
pub struct H3AnswerBody {
    recv: h3::client::RequestStream<h3_quinn::RecvStream, Bytes>,
    /// The data is all in; trailers (if any) come next.
    data_done: bool,
    /// Keeps the connection open while its answer streams.
    _connection: quinn::Connection,
}

impl std::fmt::Debug for H3AnswerBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H3AnswerBody")
            .field("data_done", &self.data_done)
            .finish_non_exhaustive()
    }
}

impl Body for H3AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if !this.data_done {
            match this.recv.poll_recv_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Some(mut data))) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Poll::Ready(Ok(None)) => this.data_done = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
            }
        }
        match this.recv.poll_recv_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(Box::new(e)))),
        }
    }
}

/// What an `Alt-Svc` field value says of HTTP/3 on `host`.
#[derive(Debug, PartialEq, Eq)]
pub enum AltSvc {
    /// `clear`: every alternative is withdrawn.
    Clear,
    /// `h3` on this UDP port of the same host, for this long.
    H3 { port: u16, max_age: Duration },
    /// No `h3` offer for this host.
    Nothing,
}

/// Reads an `Alt-Svc` field value (RFC 7838 §3): the first `h3` offer
/// whose host is empty or `host` (an offer naming another host is not
/// taken: the gateway talks to the backend it was configured with).
pub fn alt_svc_h3(value: &str, host: &str) -> AltSvc {
    if value.trim().eq_ignore_ascii_case("clear") {
        return AltSvc::Clear;
    }
    for alternative in split_outside_quotes(value, ',') {
        let mut parts = split_outside_quotes(alternative, ';').into_iter();
        let Some((protocol, authority)) = parts.next().and_then(|p| p.split_once('=')) else {
            continue;
        };
        if protocol.trim() != "h3" {
            continue;
        }
        let authority = authority.trim().trim_matches('"');
        let Some((offered_host, port)) = authority.rsplit_once(':') else {
            continue;
        };
        if !offered_host.is_empty() && !offered_host.eq_ignore_ascii_case(host) {
            continue;
        }
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        if port == 0 {
            continue;
        }
        let max_age = parts
            .filter_map(|p| p.split_once('='))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("ma"))
            .and_then(|(_, seconds)| seconds.trim().trim_matches('"').parse::<u64>().ok())
            .map_or(DEFAULT_MAX_AGE, Duration::from_secs);
        if max_age.is_zero() {
            continue;
        }
        return AltSvc::H3 { port, max_age };
    }
    AltSvc::Nothing
}

/// `value` split at `separator`s that are not inside a quoted string.
fn split_outside_quotes(value: &str, separator: char) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                pieces.push(value[start..i].trim());
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    pieces.push(value[start..].trim());
    pieces
}

/// The host of `host:port` (an IPv6 address keeps its brackets).
fn host_of(addr: &str) -> &str {
    match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => addr,
    }
}

fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_svc_offers_are_read_as_rfc_7838_writes_them() {
        let h3 = |port, secs| AltSvc::H3 {
            port,
            max_age: Duration::from_secs(secs),
        };
        for (value, expected) in [
            (r#"h3=":443"; ma=3600"#, h3(443, 3600)),
            (r#"h3=":8443""#, h3(8443, 86_400)),
            (
                r#"h3-29=":443", h3=":9443"; ma=60; persist=1"#,
                h3(9443, 60),
            ),
            (r#"h2=":443", h3="backend.internal:4433""#, h3(4433, 86_400)),
            (r#"h3="other.example:443", h3=":8443""#, h3(8443, 86_400)),
            (r#"h3="other.example:443""#, AltSvc::Nothing),
            (r#"h3=":443"; ma=0"#, AltSvc::Nothing),
            (r#"h3=":0""#, AltSvc::Nothing),
            (r#"h3=":http""#, AltSvc::Nothing),
            (r#"h2=":443""#, AltSvc::Nothing),
            ("clear", AltSvc::Clear),
            (" Clear ", AltSvc::Clear),
            ("", AltSvc::Nothing),
            (r#"h3=":44,3""#, AltSvc::Nothing),
        ] {
            assert_eq!(alt_svc_h3(value, "backend.internal"), expected, "{value}");
        }
    }

    #[test]
    fn hosts_and_ports_of_addresses() {
        assert_eq!(host_of("127.0.0.1:8443"), "127.0.0.1");
        assert_eq!(host_of("[::1]:8443"), "[::1]");
        assert_eq!(host_of("backend.internal:443"), "backend.internal");
        assert_eq!(port_of("[::1]:8443"), Some(8443));
        assert_eq!(port_of("backend"), None);
    }
}

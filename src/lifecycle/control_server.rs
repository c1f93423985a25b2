//! Serving the admin and metrics routers on their (hand-over-able) sockets.
//!
//! Like the proxy listeners, and unlike `axum::serve`'s graceful shutdown,
//! stopping here never closes a connection whose request is on its way.
//! A hand-over is one accepting process at a time:
//!
//! 1. the new process binds nothing new for these sockets and does not
//!    accept on them until the old one says it has stopped (`Gate`: the
//!    old process closes a pipe); connections meanwhile wait in the
//!    socket's backlog, which both share;
//! 2. the old process stops accepting at once when the new one is ready
//!    (`Served::accepting` reaches none), and only then records the
//!    upgrade as succeeded and opens the gate: a client that has read the
//!    success cannot reach the old process on a new connection;
//! 3. each connection the old process accepted gets a short grace to
//!    send its request; every answer from then on says `Connection:
//!    close` (a keep-alive client does not reuse the connection), and
//!    the old process exits only once every such connection has ended
//!    (`Served::open`), within its drain timeout.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tower::ServiceExt as _;

use super::stop::Stop;

/// How long a client may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections may go on once the sockets are handed over.
const HANDOVER_GRACE: Duration = Duration::from_secs(1);

/// How long the new process waits for the old one to stop accepting
/// before it accepts anyway (the old one is stuck, or gone).
const GATE_PATIENCE: Duration = Duration::from_secs(5);

/// How many of something are still going, and a way to wait for none.
#[derive(Debug, Clone, Default)]
pub struct Tally(Arc<(AtomicUsize, Notify)>);

/// One of a [`Tally`], until dropped.
pub struct Counted(Tally);

impl Tally {
    pub fn enter(&self) -> Counted {
        self.0 .0.fetch_add(1, Ordering::AcqRel);
        Counted(self.clone())
    }

    /// Resolves once none is left.
    pub async fn none(&self) {
        loop {
            let notified = self.0 .1.notified();
            tokio::pin!(notified);
            // Registered before the count is read: a last one leaving in
            // between still wakes this.
            notified.as_mut().enable();
            if self.0 .0.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0 .0 .0.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0 .0 .1.notify_waiters();
        }
    }
}

/// The admin and metrics servers of this process, as a hand-over waits
/// on them.
#[derive(Debug, Clone, Default)]
pub struct Served {
    /// Accept loops still accepting.
    pub accepting: Tally,
    /// Connections still open.
    pub open: Tally,
}

/// Opens when the process that handed its sockets over has stopped
/// accepting on them (it closes the pipe whose other end this reads), or
/// at once for a process that took nothing over.
#[derive(Debug, Clone)]
pub struct Gate(watch::Receiver<bool>);

impl Gate {
    pub fn open() -> Self {
        Gate(watch::channel(true).1)
    }

    /// Opens at the end of `pipe` (the old process closed its side, or
    /// exited), or after [`GATE_PATIENCE`].
    pub fn until_closed(pipe: std::os::fd::OwnedFd) -> Self {
        let (opened, gate) = watch::channel(false);
        tokio::spawn(async move {
            let closed = tokio::task::spawn_blocking(move || {
                use std::io::Read as _;
                let mut pipe = std::fs::File::from(pipe);
                let mut byte = [0u8; 1];
                while matches!(pipe.read(&mut byte), Ok(n) if n > 0) {}
            });
            if tokio::time::timeout(GATE_PATIENCE, closed).await.is_err() {
                tracing::warn!(patience = ?GATE_PATIENCE, "the previous process did not say it stopped accepting; accepting on the admin socket anyway");
            }
            let _ = opened.send(true);
        });
        Gate(gate)
    }

    async fn opened(mut self) {
        let _ = self.0.wait_for(|open| *open).await;
    }
}

/// Serves `router` on `socket` from when `gate` opens until this process
/// hands its sockets over; counted in `served` (the loop from now: the
/// caller spawns it).
pub fn serve(
    socket: TcpListener,
    router: axum::Router,
    stop: watch::Receiver<Option<Stop>>,
    what: &'static str,
    served: &Served,
    gate: Gate,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    serve_tls(socket, router, stop, what, served, gate, None)
}

/// As [`serve`], over TLS when `tls` is given (`admin.tls`): a client
/// certificate the acceptor verified is on each of its connection's
/// requests as a [`PeerCertificate`](crate::admin::PeerCertificate).
pub fn serve_tls(
    socket: TcpListener,
    router: axum::Router,
    stop: watch::Receiver<Option<Stop>>,
    what: &'static str,
    served: &Served,
    gate: Gate,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let accepting = served.accepting.enter();
    let open = served.open.clone();
    async move {
        gate.opened().await;
        accept_loop(socket, router, stop, what, open, tls).await;
        drop(accepting);
    }
}

async fn accept_loop(
    socket: TcpListener,
    router: axum::Router,
    stop: watch::Receiver<Option<Stop>>,
    what: &'static str,
    open: Tally,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let mut handed_over = stop.clone();
    loop {
        let accepted = tokio::select! {
            // Handed over: not one more connection, even one ready now.
            biased;
            _ = async { let _ = handed_over.wait_for(|s| *s == Some(Stop::HandedOver)).await; } => break,
            accepted = socket.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(server = what, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let counted = open.enter();
        let (router, stop, tls) = (router.clone(), stop.clone(), tls.clone());
        tokio::spawn(async move {
            let _counted = counted;
            let Some(tls) = tls else {
                connection(TokioIo::new(stream), router, stop, peer, None).await;
                return;
            };
            // The handshake within the time a request head may take.
            let stream = match tokio::time::timeout(HEADER_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(server = what, %peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let certificate = stream.get_ref().1.peer_certificates().and_then(|chain| {
                let names = crate::tls::certificate_names(chain.first()?);
                Some(Arc::new(crate::admin::PeerCertificate {
                    subject: names.subject,
                    sans: names.sans,
                }))
            });
            connection(TokioIo::new(stream), router, stop, peer, certificate).await;
        });
    }
    tracing::info!(
        server = what,
        "stopped accepting: the new process serves this socket"
    );
}

/// The admin listener's TLS (`admin.tls`): its certificate, and with
/// `client_ca` client certificates verified when presented (a client
/// without one may still send a token; one that does not verify is
/// refused in the handshake).
pub fn tls_acceptor(tls: &crate::plan::AdminTlsSpec) -> Result<tokio_rustls::TlsAcceptor, String> {
    let loaded = crate::tls::load_cert(&tls.cert, &tls.key).map_err(|e| e.to_string())?;
    let builder = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &tls.client_ca {
        Some(ca) => builder.with_client_cert_verifier(
            crate::tls::client_verifier(ca, false).map_err(|e| e.to_string())?,
        ),
        None => builder.with_no_client_auth(),
    };
    let mut config =
        builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(loaded.key)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves one connection until it ends, or (after a hand-over) until its
/// grace runs out and its request in flight is answered.
async fn connection<I>(
    io: I,
    router: axum::Router,
    mut stop: watch::Receiver<Option<Stop>>,
    peer: std::net::SocketAddr,
    certificate: Option<Arc<crate::admin::PeerCertificate>>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = {
        let stop = stop.clone();
        hyper::service::service_fn(move |req| {
            answer(router.clone(), stop.clone(), peer, certificate.clone(), req)
        })
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = async { let _ = stop.wait_for(|s| *s == Some(Stop::HandedOver)).await; } => {}
    }
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = tokio::time::sleep(HANDOVER_GRACE) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// One request to `router`: once this process has handed its sockets
/// over, an HTTP/1 answer says `Connection: close`, so that the client's
/// next request goes on a new connection, to the new process.
async fn answer(
    router: axum::Router,
    stop: watch::Receiver<Option<Stop>>,
    peer: std::net::SocketAddr,
    certificate: Option<Arc<crate::admin::PeerCertificate>>,
    req: http::Request<hyper::body::Incoming>,
) -> Result<axum::response::Response, Infallible> {
    let http1 = req.version() < http::Version::HTTP_2;
    let mut req = req.map(axum::body::Body::new);
    // Who is calling, for the admin's audit log.
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    if let Some(certificate) = certificate {
        req.extensions_mut().insert((*certificate).clone());
    }
    let mut response = router.oneshot(req).await?;
    if http1 && *stop.borrow() == Some(Stop::HandedOver) {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    Ok(response)
}

//! Serving one accepted HTTP connection: the bytes that came with it,
//! the TLS handshake, the choice between HTTP/1.1 and HTTP/2 (first byte
//! or ALPN), hyper's connection with the listener's limits and client
//! timeouts, and the access-log line of a head refused before the
//! request path saw it. Each request goes to `request::handle`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::plan::ListenerLimits;
use crate::proxy::activity::{watchdog, Expired};
use crate::proxy::conn::{ConnContext, TlsInfo};
use crate::proxy::downstream::Downstream;
use crate::proxy::interim::InterimWriter;
use crate::proxy::request::handle;
use crate::proxy::request_framing::HeadCheck;
use crate::telemetry::access::{self, Flags};
use crate::telemetry::metrics as m;

/// A TLS listener's acceptor, and the store its certificates come from
/// (a connection keeps what its handshake saw, for `strict_sni_host`).
#[derive(Clone)]
pub(super) struct Tls {
    pub acceptor: TlsAcceptor,
    pub store: Arc<crate::tls::CertStore>,
}

/// Serves one HTTP connection to its end: its first bytes, TLS when the
/// listener has it, then hyper (HTTP/1.1, or HTTP/2 when the first bytes
/// or ALPN allow it), each request handed to the request path.
pub(super) async fn serve_http_connection(
    stream: TcpStream,
    mut first: Vec<u8>,
    ctx: Arc<ConnContext>,
    limits: ListenerLimits,
    draining: watch::Receiver<bool>,
    tls: Option<Tls>,
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
    if tls.is_none() && Speaks::of_first_bytes(&first) == Speaks::Either {
        // The start of HTTP/2's preface, or of POST, PUT, PATCH: the rest
        // of the 24 bytes that tell them apart, within the head's time.
        let more = read_preface(&stream, &mut first);
        let _ = tokio::time::timeout(limits.header_read_timeout, more).await;
    }
    let speaks = Speaks::of_first_bytes(&first);
    let io = Downstream::new(stream, first, Arc::clone(&ctx.activity), tls.is_none());
    match tls {
        None => {
            let http1 = speaks != Speaks::Http2;
            let max_head = limits.max_header_bytes;
            let io = HeadCheck::wrap(io, Arc::clone(&ctx.activity), http1, max_head);
            let io = InterimWriter::new(io, Arc::clone(&ctx.interim));
            serve_http(io, ctx, limits, draining, speaks).await;
        }
        // Boxed: a TLS session is kilobytes that every plain
        // connection's future would otherwise be as large as.
        Some(tls) => crate::boxed::pin_in_place(|| serve_tls(io, tls, ctx, limits, draining)).await,
    }
}

/// Serves a TLS connection: the handshake within the head's time, then
/// HTTP/1.1 or HTTP/2 as ALPN agreed.
async fn serve_tls(
    io: Downstream,
    Tls { acceptor, store }: Tls,
    ctx: Arc<ConnContext>,
    limits: ListenerLimits,
    draining: watch::Receiver<bool>,
) {
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
            let material = store.serving(&ctx.listener);
            let _ = ctx.tls.set(TlsInfo::of(tls.get_ref().1, material));
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

/// How much of a connection's first bytes is read before it is served:
/// most request heads and ClientHellos; hyper reads the rest of a longer
/// one.
const FIRST_READ: usize = 4096;

/// Reads what has arrived on an accepted, unregistered socket into
/// `into` (`WouldBlock` when nothing has), without waiting.
pub(super) fn read_arrived(
    socket: &std::net::TcpStream,
    into: &mut Vec<u8>,
) -> std::io::Result<usize> {
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

/// Reads until `into` holds HTTP/2's preface, or bytes that are not it
/// (or the client stops sending).
async fn read_preface(socket: &TcpStream, into: &mut Vec<u8>) -> std::io::Result<()> {
    while Speaks::of_first_bytes(into) == Speaks::Either {
        socket.readable().await?;
        match socket.try_read_buf(into) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
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

/// What a client connection speaks, as far as it is known before it is
/// served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    /// Its first bytes are not HTTP/2's preface (`PRI * HTTP/2.0`), or
    /// TLS agreed on `http/1.1`: served by hyper's HTTP/1 connection.
    Http1,
    /// The preface arrived, or TLS agreed on `h2`: served by cutover's
    /// HTTP/2 server (`crate::http2`).
    Http2,
    /// Not known: too few bytes arrived to tell (plain), or TLS agreed
    /// on nothing; hyper reads the first bytes to tell.
    Either,
}

impl Speaks {
    /// A plain connection, by its first bytes.
    fn of_first_bytes(first: &[u8]) -> Self {
        let preface = crate::http2::PREFACE;
        if first.starts_with(preface) {
            Speaks::Http2
        } else if !first.is_empty() && preface.starts_with(first) {
            Speaks::Either
        } else {
            Speaks::Http1
        }
    }

    /// A TLS connection, by the protocol ALPN agreed on.
    fn of_alpn(alpn: Option<&[u8]>) -> Self {
        match alpn {
            Some(b"http/1.1") => Speaks::Http1,
            Some(b"h2") => Speaks::Http2,
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
/// `activity::watchdog`), or draining ends it.
async fn serve_http<I>(
    io: I,
    ctx: Arc<ConnContext>,
    limits: ListenerLimits,
    draining: watch::Receiver<bool>,
    speaks: Speaks,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if speaks == Speaks::Http2 {
        // Boxed: cutover's HTTP/2 connection is kilobytes that every
        // HTTP/1 connection's future would otherwise be as large as.
        return crate::boxed::pin_in_place(|| serve_http2(io, ctx, limits, draining)).await;
    }
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
        // Served above.
        Speaks::Http2 => {}
    }
}

/// Serves an HTTP/2 connection with cutover's own server.
async fn serve_http2<I>(
    io: I,
    ctx: Arc<ConnContext>,
    limits: ListenerLimits,
    draining: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let settings = crate::http2::Settings {
        max_concurrent_streams: limits.max_concurrent_streams,
        // The same limit as HTTP/1's, measured as RFC 9113 §6.5.2 does
        // (names and values plus 32 bytes each); above it, 431.
        max_header_list_size: u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX),
        keepalive_interval: limits.h2_keepalive_interval,
        keepalive_timeout: H2_PING_TIMEOUT,
    };
    let shared = Arc::clone(&ctx);
    let service = move |req: http::Request<crate::http2::RecvBody>| {
        handle(
            req.map(crate::backends::ClientBody::Http2),
            Arc::clone(&ctx),
        )
    };
    let mut conn = std::pin::pin!(crate::http2::Connection::new(io, settings, service));
    let stop =
        |conn: Pin<&mut crate::http2::Connection<_, _, _, _>>| conn.get_mut().graceful_shutdown();
    drive(conn.as_mut(), stop, &shared, limits, draining).await;
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
    use super::Speaks;

    #[test]
    fn only_the_h2_preface_is_served_as_http2() {
        for method in [
            "GET", "HEAD", "DELETE", "OPTIONS", "CONNECT", "TRACE", "POST", "PUT",
        ] {
            let head = format!("{method} / HTTP/1.1\r\nHost: a\r\n\r\n");
            assert_eq!(
                Speaks::of_first_bytes(head.as_bytes()),
                Speaks::Http1,
                "{method}"
            );
        }
        let preface = crate::http2::PREFACE;
        assert_eq!(Speaks::of_first_bytes(preface), Speaks::Http2);
        assert_eq!(
            Speaks::of_first_bytes(&[preface, b"\0\0\x12\x04"].concat()),
            Speaks::Http2
        );
        // Too few bytes to tell: PRI, or POST, PUT, PATCH.
        assert_eq!(Speaks::of_first_bytes(b"P"), Speaks::Either);
        assert_eq!(Speaks::of_first_bytes(&preface[..10]), Speaks::Either);
        assert_eq!(Speaks::of_first_bytes(b"PO"), Speaks::Http1);
        // Not HTTP at all: hyper's HTTP/1 parser refuses it (400).
        assert_eq!(Speaks::of_first_bytes(&[0x16, 3, 1]), Speaks::Http1);
        assert_eq!(Speaks::of_alpn(Some(b"http/1.1")), Speaks::Http1);
        assert_eq!(Speaks::of_alpn(Some(b"h2")), Speaks::Http2);
        assert_eq!(Speaks::of_alpn(None), Speaks::Either);
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
}

//! One door to a backend for every transport but cutover's own HTTP/1.1
//! codec (`h1`, which writes the forwarding headers into the head and
//! relays 1xx answers): cutover's own HTTP/2 client (h2c and h2
//! backends, `h2.rs`), hyper's pooled client (TLS HTTP/1.1 and `auto`
//! backends, protocol upgrades), QUIC with HTTP/3 (`h3` and `auto` backends, with
//! `auto`'s fall back to TCP and its learning from `Alt-Svc`), and a
//! connection of the request's own behind a PROXY header. A prepared
//! request goes in; the answer's head comes out with one body type, or
//! one error that says where the exchange failed. The proxy above keeps
//! headers, reporting and protocol upgrades.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::{Backend, BoxError, ConnectError, H3AnswerBody, ProxyHeader, QuicError};
use super::{RequestBody, SignalledBody};
use crate::errors::error_chain;

/// Where an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Nothing reached the backend; `refused` when it said no (a TCP
    /// reset to the connect), rather than not answering.
    #[error("{detail}")]
    Connect { refused: bool, detail: String },
    /// No answer's head within the timeout after the request body ended.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The client's request body failed (or grew past its limit): not
    /// the backend's doing.
    #[error("the request body: {0}")]
    ClientBody(BoxError),
    /// The backend broke the exchange off or answered what cannot be read.
    #[error("{0}")]
    Backend(String),
}

/// An answer's body as it arrives: over TCP through hyper's client, or
/// over QUIC.
#[derive(Debug)]
pub enum AnswerBody {
    Tcp(Incoming),
    /// From an h2c or h2 backend, through cutover's own HTTP/2 client.
    H2(crate::http2::RecvBody),
    Quic(Box<H3AnswerBody>),
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            AnswerBody::Tcp(body) => std::pin::Pin::new(body).poll_frame(cx).map_err(Into::into),
            AnswerBody::H2(body) => std::pin::Pin::new(body).poll_frame(cx).map_err(Into::into),
            AnswerBody::Quic(body) => std::pin::Pin::new(&mut **body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnswerBody::Tcp(body) => body.is_end_stream(),
            AnswerBody::H2(body) => body.is_end_stream(),
            AnswerBody::Quic(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AnswerBody::Tcp(body) => body.size_hint(),
            AnswerBody::H2(body) => body.size_hint(),
            AnswerBody::Quic(body) => body.size_hint(),
        }
    }
}

/// How one request is sent.
pub struct Sending<'a> {
    pub backend: &'a Backend,
    /// For the answer's head, from the end of the request body.
    pub timeout: Duration,
    /// An HTTP/1.1 protocol switch: always over TCP (HTTP/3 has no 101).
    pub upgrading: bool,
    /// The PROXY header the backend's connections start with: the
    /// request then gets a connection of its own.
    pub proxy: Option<ProxyHeader>,
}

/// Sends `request`, prepared for `how.backend` (target, version and
/// headers as the backend takes them), and returns the answer's head.
pub async fn send(
    request: Request<RequestBody>,
    how: Sending<'_>,
) -> Result<Response<AnswerBody>, TransportError> {
    let Sending {
        backend,
        timeout,
        upgrading,
        proxy,
    } = how;
    // The timeout counts from the end of the request body.
    let (parts, body) = request.into_parts();
    let (body, ended) = SignalledBody::new(body);
    let failure = body.failure();
    let request = Request::from_parts(parts, body);
    let answer_due = async move {
        let _ = ended.await;
        tokio::time::sleep(timeout).await;
    };
    let sending = async {
        match &proxy {
            Some(proxy) => own_connection(backend, proxy, request)
                .await
                .map(|r| r.map(AnswerBody::Tcp)),
            None => pooled(backend, request, upgrading).await,
        }
    };
    let answered = tokio::select! {
        answered = sending => answered,
        _ = answer_due => return Err(TransportError::Timeout(timeout)),
    };
    answered.map_err(|error| match error {
        // The client's body failing is the client's doing, however the
        // exchange reports it.
        TransportError::Backend(_) => failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .map_or(error, TransportError::ClientBody),
        error => error,
    })
}

/// Over QUIC when the backend's is up (`h3`; `auto` takes TCP when it is
/// not, or when a stream could not be opened), through cutover's own
/// HTTP/2 client for h2c and h2, otherwise through hyper's pooled client.
pub(super) async fn pooled(
    backend: &Backend,
    request: Request<SignalledBody>,
    upgrading: bool,
) -> Result<Response<AnswerBody>, TransportError> {
    let mut request = request;
    let quic = match upgrading {
        true => Ok(None),
        false => backend.quic_connection().await,
    };
    let quic_failed = |error: QuicError| {
        backend.quic_failed(&error);
        let detail = format!("{}: {error}", backend.key.addr);
        match error {
            QuicError::Connect(_) => TransportError::Connect {
                refused: false,
                detail,
            },
            QuicError::Exchange(_) => TransportError::Backend(detail),
        }
    };
    match quic {
        Ok(None) => {}
        Ok(Some(pooled)) => {
            let keep = backend.quic.as_ref().is_some_and(|q| !q.only());
            match super::quic::send(pooled, request, keep).await {
                Ok(response) => return Ok(response.map(|b| AnswerBody::Quic(Box::new(b)))),
                Err((error, Some(unsent))) => {
                    backend.quic_failed(&error);
                    request = unsent;
                }
                Err((error, None)) => return Err(quic_failed(error)),
            }
        }
        Err(error) => return Err(quic_failed(error)),
    }
    if let (Some(pool), false) = (&backend.h2, upgrading) {
        let response = pool.send(&backend.key.addr, request).await?;
        return Ok(response.map(AnswerBody::H2));
    }
    let response = backend
        .client()
        .request(request)
        .await
        .map_err(|e| match e.is_connect() {
            true => connect_failed(&backend.key.addr, &e),
            false => TransportError::Backend(format!("{}: {}", backend.key.addr, error_chain(&e))),
        })?;
    if let Some(quic) = &backend.quic {
        quic.learn(response.headers());
    }
    Ok(response.map(AnswerBody::Tcp))
}

/// A request on a connection of its own (never pooled: a protocol
/// upgrade takes it over) that starts with `proxy`'s header.
async fn own_connection(
    backend: &Backend,
    proxy: &ProxyHeader,
    req: Request<SignalledBody>,
) -> Result<Response<Incoming>, TransportError> {
    use tokio::io::AsyncWriteExt;
    let connect = super::dial(backend.key.addr.as_str(), backend.key.connect_timeout);
    let mut stream = connect
        .await
        .map_err(|error| connect_error(&backend.key.addr, &error))?;
    let failed = |e: &dyn std::error::Error| {
        TransportError::Backend(format!("{}: {}", backend.key.addr, error_chain(e)))
    };
    stream
        .write_all(&proxy.bytes())
        .await
        .map_err(|e| failed(&e))?;
    // hyper's connection writes the target as given: origin-form here,
    // as cutover's own client writes it (the routed Host is a header).
    let mut req = req;
    if let Some(target) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = http::Uri::from(target);
    }
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| failed(&e))?;
    tokio::spawn(connection.with_upgrades());
    sender.send_request(req).await.map_err(|e| failed(&e))
}

/// A failed connect to `addr` as the door reports it.
pub fn connect_error(addr: &str, error: &ConnectError) -> TransportError {
    match error {
        ConnectError::Io(io) => connect_failed(addr, io),
        ConnectError::Timeout(_) => TransportError::Connect {
            refused: false,
            detail: format!("{addr}: {error}"),
        },
    }
}

/// A failed connect, refused when anything in its chain is a refused
/// connection.
fn connect_failed(addr: &str, error: &(dyn std::error::Error + 'static)) -> TransportError {
    let detail = format!("{addr}: {}", error_chain(error));
    let mut source = Some(error);
    while let Some(cause) = source {
        if cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return TransportError::Connect {
                refused: true,
                detail,
            };
        }
        source = cause.source();
    }
    TransportError::Connect {
        refused: false,
        detail,
    }
}

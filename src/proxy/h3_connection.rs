//! One HTTP/3 connection, once its endpoint accepted it (`h3.rs`): the
//! QUIC handshake (with 0-RTT where the listener allows early data), the
//! client's identity from its TLS, then its request streams, each served
//! by the same `handle` as HTTP/1.1 and HTTP/2 requests; when the
//! listener drains, a GOAWAY naming the first stream not processed.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderValue, Version};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::watch;

use super::conn::ConnContext;
use super::headers::strip_hop_by_hop;
use super::request::handle;
use crate::backends::{BoxError, ClientBody};
use crate::plan::ListenerLimits;
use crate::telemetry::metrics as m;
use crate::tls::CertStore;

/// H3_REQUEST_REJECTED (RFC 9114 §8.1): not processed, safe to retry.
const H3_REQUEST_REJECTED: u64 = 0x010b;

/// A connection attempt: already usable (0-RTT accepted), or after its
/// handshake.
enum Either {
    Early(quinn::Connection),
    Full(quinn::Connecting),
}

/// One QUIC connection: the handshake (within `header_read_timeout`),
/// then its request streams, each a task of its own; a GOAWAY when the
/// listener drains, then its open streams finish.
pub(super) async fn connection(
    incoming: quinn::Incoming,
    ctx: Arc<ConnContext>,
    limits: ListenerLimits,
    draining: watch::Receiver<bool>,
    early_data: bool,
    certificates: Arc<CertStore>,
) {
    let Some((connection, confirmed)) = handshake(incoming, &ctx, &limits, early_data).await else {
        return;
    };
    take_identity(&connection, &ctx, &certificates);
    let field_section = u64::try_from(limits.max_header_bytes).unwrap_or(u64::MAX);
    let quic = connection.clone();
    let built = h3::server::builder()
        .max_field_section_size(field_section)
        .build::<_, Bytes>(h3_quinn::Connection::new(connection))
        .await;
    let conn = match built {
        Ok(conn) => conn,
        Err(error) => {
            tracing::debug!(client = %ctx.remote, %error, "HTTP/3 connection failed");
            return;
        }
    };
    serve_streams(conn, quic, ctx, confirmed, draining).await;
}

/// The connection's handshake (within `header_read_timeout`; with early
/// data, none to wait for), counted with the listener's TLS handshakes,
/// and whether its requests are confirmed (`false` while they may be
/// 0-RTT ones, until the handshake completes).
async fn handshake(
    incoming: quinn::Incoming,
    ctx: &ConnContext,
    limits: &ListenerLimits,
    early_data: bool,
) -> Option<(quinn::Connection, Arc<AtomicBool>)> {
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(error) => {
            tracing::debug!(client = %ctx.remote, %error, "QUIC connection refused");
            return None;
        }
    };
    // With early data, requests are read before the handshake completes;
    // until it does, they may be 0-RTT (replayable) ones.
    let confirmed = Arc::new(AtomicBool::new(true));
    let connecting = if early_data {
        match connecting.into_0rtt() {
            Ok((connection, accepted)) => {
                confirmed.store(false, Ordering::Release);
                let flag = Arc::clone(&confirmed);
                tokio::spawn(async move {
                    accepted.await;
                    flag.store(true, Ordering::Release);
                });
                Either::Early(connection)
            }
            Err(connecting) => Either::Full(connecting),
        }
    } else {
        Either::Full(connecting)
    };
    let handshake = match connecting {
        Either::Early(connection) => Ok(Ok(connection)),
        Either::Full(connecting) => {
            tokio::time::timeout(limits.header_read_timeout, connecting).await
        }
    };
    // Counted with the listener's TLS handshakes (QUIC carries TLS 1.3).
    let outcome = match &handshake {
        Ok(Ok(_)) => "ok",
        Ok(Err(_)) => "failed",
        Err(_) => "timeout",
    };
    let listener = ctx.listener.to_string();
    metrics::counter!(m::TLS_HANDSHAKES, m::LABEL_LISTENER => listener.clone(), m::LABEL_OUTCOME => outcome).increment(1);
    let connection = match handshake {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => {
            metrics::counter!(m::TLS_HANDSHAKE_FAILURES, m::LABEL_LISTENER => listener)
                .increment(1);
            tracing::debug!(client = %ctx.remote, %error, "QUIC handshake failed");
            return None;
        }
        Err(_) => {
            metrics::counter!(m::TLS_HANDSHAKE_FAILURES, m::LABEL_LISTENER => listener)
                .increment(1);
            tracing::debug!(client = %ctx.remote, "QUIC handshake timed out");
            return None;
        }
    };
    Some((connection, confirmed))
}

/// What the connection's TLS says of its client (SNI, certificate) for
/// the templates and the strict-SNI check.
fn take_identity(connection: &quinn::Connection, ctx: &ConnContext, certificates: &CertStore) {
    // (With 0-RTT the client's certificate may not be known yet: the
    // templates then read none.)
    let sni = connection
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name);
    let material = certificates.serving(&ctx.listener);
    let chain = connection.peer_identity().and_then(|i| {
        i.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    });
    let chain = chain.as_deref().map(Vec::as_slice).unwrap_or_default();
    // With `insecure_fallback` a failing certificate was let through:
    // it names nobody.
    let trusted = match &material {
        Some(m) if m.client_fallback() => m.client_verified(chain),
        _ => true,
    };
    let mut info =
        super::conn::TlsInfo::from_parts(sni.as_deref(), chain.first().filter(|_| trusted));
    info.strict = material.filter(|m| m.strict_sni_host());
    let _ = ctx.tls.set(info);
}

/// The connection's request streams, each on a task of its own, until it
/// closes; when the listener drains, a GOAWAY naming the first stream not
/// processed, then the streams taken finish and the connection closes.
async fn serve_streams(
    mut conn: h3::server::Connection<h3_quinn::Connection, Bytes>,
    quic: quinn::Connection,
    ctx: Arc<ConnContext>,
    confirmed: Arc<AtomicBool>,
    mut draining: watch::Receiver<bool>,
) {
    let mut requests = tokio::task::JoinSet::new();
    let mut goaway_sent = false;
    // The last request stream taken, and once the GOAWAY is out, the
    // first stream it says was not processed (RFC 9114 §5.2).
    let mut last_taken: Option<u64> = None;
    let mut not_processed_from = u64::MAX;
    loop {
        // After the GOAWAY, the connection ends with its last stream
        // (a client may keep an idle one open: drain would wait for it).
        if goaway_sent && requests.is_empty() {
            break;
        }
        tokio::select! {
            accepted = conn.accept() => match accepted {
                Ok(Some(mut resolver)) => {
                    let id = resolver.frame_stream.id().into_inner();
                    if id >= not_processed_from {
                        // Named in the GOAWAY as not processed: the client
                        // may send it again elsewhere, so it is refused here.
                        use h3::quic::SendStream as _;
                        resolver.frame_stream.reset(H3_REQUEST_REJECTED);
                        tracing::debug!(client = %ctx.remote, stream = id, "HTTP/3 request past the GOAWAY refused");
                        continue;
                    }
                    last_taken = last_taken.max(Some(id));
                    let ctx = Arc::clone(&ctx);
                    let early = !confirmed.load(Ordering::Acquire);
                    // Boxed first: a request's future holds the whole
                    // request path (about 7 KiB), and spawning moves it
                    // several times (9 % of the gateway's CPU under
                    // HTTP/3 load was memory copies, a third of them
                    // here); boxed where it is made, it is not copied.
                    requests.spawn(crate::boxed::pin_in_place(|| request(resolver, ctx, early)));
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(client = %ctx.remote, %error, "HTTP/3 connection closed");
                    break;
                }
            },
            // Finished request tasks are collected as they end.
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
            _ = async { let _ = draining.wait_for(|d| *d).await; }, if !goaway_sent => {
                goaway_sent = true;
                // The GOAWAY names the first request stream not processed:
                // the one after the last taken (client bidirectional
                // streams are 4 apart), or the first of all. h3 still
                // hands over that very stream if it arrives: it is refused
                // above.
                not_processed_from = last_taken.map_or(0, |id| id + 4);
                tracing::debug!(client = %ctx.remote, goaway_stream = not_processed_from, "HTTP/3 GOAWAY sent");
                if let Err(error) = conn.shutdown(usize::from(last_taken.is_some())).await {
                    tracing::debug!(client = %ctx.remote, %error, "HTTP/3 GOAWAY failed");
                }
            }
        }
    }
    while requests.join_next().await.is_some() {}
    if goaway_sent {
        // The last bytes of the last answers may still be in flight:
        // give the client a few round trips to close first.
        let grace = (quic.rtt() * 8).clamp(Duration::from_millis(500), Duration::from_secs(5));
        let _ = tokio::time::timeout(grace, quic.closed()).await;
        quic.close(0u32.into(), b"draining");
    }
}

/// One request stream: read as a request, served by `handle`, its
/// answer written back.
async fn request(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    ctx: Arc<ConnContext>,
    early: bool,
) {
    let (req, mut stream) = match resolver.resolve_request().await {
        Ok(pair) => pair,
        Err(error) => {
            tracing::debug!(client = %ctx.remote, %error, "malformed HTTP/3 request");
            return;
        }
    };
    // Early data may be replayed: only idempotent requests are served
    // from it, marked for the backend (RFC 8470); others get 425.
    if early && !req.method().is_idempotent() {
        tracing::debug!(client = %ctx.remote, method = %req.method(), "non-idempotent request in early data: 425");
        let mut response = http::Response::new(());
        *response.status_mut() = http::StatusCode::TOO_EARLY;
        if stream.send_response(response).await.is_ok() {
            let _ = stream.finish().await;
        }
        return;
    }
    let (mut send, recv) = stream.split();
    let mut req = req.map(|()| ClientBody::Other(Box::pin(H3RequestBody::new(recv))));
    *req.version_mut() = Version::HTTP_3;
    if early {
        req.headers_mut()
            .insert("early-data", HeaderValue::from_static("1"));
    }
    let response = match handle(req, ctx).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (mut parts, mut body) = response.into_parts();
    // Connection-specific fields have no place in HTTP/3 (RFC 9114 §4.2).
    // A proxied answer has lost them already; one the gateway made may
    // not have (one pass over its names when it has none).
    strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::HTTP_3;
    if send
        .send_response(http::Response::from_parts(parts, ()))
        .await
        .is_err()
    {
        return;
    }
    while let Some(frame) = body.frame().await {
        let sent = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => send.send_data(data).await,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => send.send_trailers(trailers).await,
                    Err(_) => Ok(()),
                },
            },
            Err(error) => {
                tracing::debug!(%error, "response body failed; resetting the HTTP/3 stream");
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
    let _ = send.finish().await;
}

/// A request body read from an HTTP/3 stream: its DATA frames, then its
/// trailers.
struct H3RequestBody {
    stream: h3::server::RequestStream<h3_quinn::RecvStream, Bytes>,
    /// What was read ahead (see `new`), delivered first.
    first: Option<Result<Frame<Bytes>, BoxError>>,
    data_done: bool,
    done: bool,
}

impl H3RequestBody {
    /// Reads ahead what has already arrived: a request whose stream's end
    /// came with its head (a GET, usually) is then known to have no body
    /// and is forwarded without one. When the end comes later, it is
    /// forwarded as an empty chunked body.
    fn new(stream: h3::server::RequestStream<h3_quinn::RecvStream, Bytes>) -> Self {
        let mut body = Self {
            stream,
            first: None,
            data_done: false,
            done: false,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(read)) => body.first = Some(read),
            Poll::Ready(None) | Poll::Pending => {}
        }
        body
    }
}

impl Body for H3RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(read) = this.first.take() {
            return Poll::Ready(Some(read));
        }
        if this.done {
            return Poll::Ready(None);
        }
        if !this.data_done {
            match ready!(this.stream.poll_recv_data(cx)) {
                Ok(Some(mut chunk)) => {
                    let bytes = chunk.copy_to_bytes(chunk.remaining());
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Ok(None) => this.data_done = true,
                Err(error) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(Box::new(error))));
                }
            }
        }
        let trailers = ready!(this.stream.poll_recv_trailers(cx));
        this.done = true;
        match trailers {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(error) => Poll::Ready(Some(Err(Box::new(error)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.first.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_loses_its_connection_specific_fields_and_keeps_the_rest() {
        let gone = [
            "connection",
            "transfer-encoding",
            "upgrade",
            "keep-alive",
            "proxy-connection",
        ];
        let kept = [
            "server",
            "date",
            "content-length",
            "x-keep-alive",
            "alt-svc",
        ];
        let mut headers = http::HeaderMap::new();
        for name in gone.iter().chain(&kept) {
            headers.insert(
                http::header::HeaderName::from_static(name),
                HeaderValue::from_static("1"),
            );
        }
        strip_hop_by_hop(&mut headers);
        for name in gone {
            assert!(!headers.contains_key(name), "{name}");
        }
        for name in kept {
            assert!(headers.contains_key(name), "{name}");
        }
    }
}

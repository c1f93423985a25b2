//! gRPC on the request path (DESIGN §18).
//!
//! A request is gRPC when its content type is `application/grpc…`. For
//! one, `handle` keeps a [`Call`]: `serve` fills in its deadline (the
//! smaller of `grpc-timeout` and the route `timeout`; the backend is sent
//! what is left) and, on a `grpc_web` route, translates gRPC-Web to gRPC
//! (`grpc_web.rs`). What the gateway itself answers to it is a
//! trailers-only gRPC answer ([`error_answer`]); what a backend answers
//! streams back through [`CallBody`], which reads the status for the
//! access log and `cutover_grpc_responses_total`, ends the call with
//! DEADLINE_EXCEEDED at its deadline, and turns a stream the backend
//! broke into an UNAVAILABLE status instead of a reset.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::body::ResponseBody;
use super::error::ProxyError;
use super::grpc_web::{Encoder, Mode};
use crate::backends::ClientBody;
use crate::generation::RouteShared;
use crate::grpc::{Code, GRPC_MESSAGE, GRPC_STATUS, GRPC_TIMEOUT};
use crate::telemetry::access::Trail;
use crate::telemetry::metrics as m;

/// What the gateway knows of one gRPC call.
#[derive(Debug)]
pub struct Call {
    /// The client's `grpc-timeout`, when it sent a valid one.
    timeout: Option<Duration>,
    /// It sent one not of the protocol's form: ignored, and not passed on.
    pub malformed_timeout: bool,
    /// When the call must be over; set once the route is known.
    pub deadline: Option<Instant>,
    /// How a gRPC-Web call's answer is written back, when its route
    /// translates it.
    pub web: Option<Mode>,
    /// The content type the client sent: gateway answers repeat it.
    content_type: HeaderValue,
}

impl Call {
    /// The call a request is, if it is gRPC. Every gRPC call is a POST;
    /// anything else pays one comparison.
    pub fn of(req: &Request<ClientBody>) -> Option<Call> {
        if req.method() != Method::POST || !crate::grpc::is_grpc(req.headers()) {
            return None;
        }
        let headers = req.headers();
        let sent = headers.get(&GRPC_TIMEOUT);
        let timeout = sent.and_then(crate::grpc::parse_timeout);
        let malformed_timeout = sent.is_some() && timeout.is_none();
        if malformed_timeout {
            metrics::counter!(m::GRPC_TIMEOUT_INVALID).increment(1);
        }
        Some(Call {
            timeout,
            malformed_timeout,
            deadline: None,
            web: None,
            content_type: headers.get(header::CONTENT_TYPE)?.clone(),
        })
    }

    /// The route is known: the deadline is the smaller of the client's
    /// `grpc-timeout` and the route's `timeout`, counted from now.
    pub fn routed(&mut self, route_timeout: Duration) {
        if let Some(timeout) = self.timeout {
            self.deadline = Some(Instant::now() + timeout.min(route_timeout));
        }
    }

    /// The answer the gateway makes for `error`: trailers-only.
    pub fn error_answer(&self, error: &ProxyError) -> (Response<ResponseBody>, Code) {
        let (code, message) = status_of(error);
        let mut response = Response::new(ResponseBody::full(Bytes::new()));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, self.content_type.clone());
        headers.insert(GRPC_STATUS.clone(), code.value());
        headers.insert(GRPC_MESSAGE.clone(), HeaderValue::from_static(message));
        (response, code)
    }

    /// Wraps a backend's answer: its status is read as it passes, the
    /// deadline is kept, a broken stream ends with a status, and a
    /// gRPC-Web call's answer is written in its encoding.
    /// `http1`: the client speaks HTTP/1.x, whose trailers (chunked,
    /// for a client that sent `te: trailers`) must be named in the head.
    pub fn answer(
        &self,
        response: Response<ResponseBody>,
        route: Option<Arc<RouteShared>>,
        trail: Option<Arc<Trail>>,
        http1: bool,
    ) -> Response<ResponseBody> {
        let (mut parts, inner) = response.into_parts();
        let mut body = CallBody {
            inner,
            deadline: self
                .deadline
                .map(|at| Box::pin(tokio::time::sleep_until(at))),
            route,
            trail,
            web: None,
            done: false,
            recorded: false,
        };
        if let Some(mode) = self.web {
            super::grpc_web::answer_head(&mut parts.headers, mode);
            body.web = Some(Encoder::new(mode));
        }
        // Trailers-only (the status in the head), or not a gRPC answer at
        // all: the status is known now.
        if let Some(code) = Code::of(&parts.headers) {
            body.record(code);
        } else if parts.status != StatusCode::OK {
            body.record(Code::from_http(parts.status));
        } else if body.inner.is_end_stream() {
            body.record(Code::Unknown);
        } else if http1 && self.web.is_none() {
            parts.headers.insert(
                header::TRAILER,
                HeaderValue::from_static("grpc-status, grpc-message, grpc-status-details-bin"),
            );
        }
        Response::from_parts(parts, ResponseBody::Grpc(Box::new(body)))
    }

    /// The header the backend is sent: the time left until the deadline.
    pub fn forwarded_timeout(deadline: Instant) -> HeaderValue {
        crate::grpc::format_timeout(deadline.saturating_duration_since(Instant::now()))
    }
}

/// Counts one call's status: the route's series (`route="-"` for a call
/// no route took), and the access log's field.
pub fn count(route: Option<&RouteShared>, trail: Option<&Trail>, code: Code) {
    route.unwrap_or_else(|| RouteShared::unrouted()).grpc(code);
    if let Some(trail) = trail {
        trail.grpc_status(code as u8);
    }
}

/// The status and message for a failure the gateway answers itself: what
/// happened, in words that name no internals.
fn status_of(error: &ProxyError) -> (Code, &'static str) {
    match error {
        ProxyError::NoRoute => (Code::Unimplemented, "no route for this method"),
        ProxyError::NoBackend => (Code::Unavailable, "no backend available"),
        ProxyError::UpstreamConnect(_) | ProxyError::UpstreamRefused(_) => {
            (Code::Unavailable, "could not connect to a backend")
        }
        ProxyError::Upstream(_) => (Code::Unavailable, "the backend failed the call"),
        ProxyError::GrpcOverHttp1 => (
            Code::Unavailable,
            "the route's upstream speaks HTTP/1.1, gRPC needs HTTP/2",
        ),
        ProxyError::UpstreamTimeout(_) => (Code::DeadlineExceeded, "deadline exceeded"),
        ProxyError::Saturated => (Code::Unavailable, "the route is at its max_inflight limit"),
        ProxyError::RateLimited(_) => (Code::ResourceExhausted, "quota exceeded"),
        ProxyError::PayloadTooLarge => (
            Code::ResourceExhausted,
            "request body exceeds max_request_body",
        ),
        ProxyError::HeadTooLarge => (
            Code::ResourceExhausted,
            "request headers exceed max_header_bytes",
        ),
        ProxyError::Forbidden => (Code::PermissionDenied, "client address refused"),
        ProxyError::Unauthenticated(denial) => match denial.status() {
            StatusCode::UNAUTHORIZED => (Code::Unauthenticated, "authentication required"),
            StatusCode::FORBIDDEN => (Code::PermissionDenied, "refused by the auth service"),
            StatusCode::SERVICE_UNAVAILABLE => {
                (Code::Unavailable, "authentication could not be checked")
            }
            other => (Code::from_http(other), "refused by the auth service"),
        },
        ProxyError::ClientBody { closed: true, .. } => (Code::Cancelled, "the client went away"),
        ProxyError::ClientBody { closed: false, .. } | ProxyError::BadRequest(_) => {
            (Code::Internal, "malformed request")
        }
    }
}

/// A gRPC answer from a backend on its way to the client (see the module
/// notes).
pub struct CallBody {
    inner: ResponseBody,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    route: Option<Arc<RouteShared>>,
    trail: Option<Arc<Trail>>,
    web: Option<Encoder>,
    done: bool,
    recorded: bool,
}

impl std::fmt::Debug for CallBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallBody")
            .field("inner", &self.inner)
            .field("done", &self.done)
            .finish()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl CallBody {
    pub fn inner_mut(&mut self) -> &mut ResponseBody {
        &mut self.inner
    }

    fn record(&mut self, code: Code) {
        if !std::mem::replace(&mut self.recorded, true) {
            count(self.route.as_deref(), self.trail.as_deref(), code);
        }
    }

    /// Ends the call with the gateway's own status: the backend's stream
    /// is dropped (which resets it), the client gets trailers.
    fn end(&mut self, code: Code, message: &'static str) -> Frame<Bytes> {
        self.inner = ResponseBody::Full(None);
        self.record(code);
        let mut trailers = HeaderMap::with_capacity(2);
        trailers.insert(GRPC_STATUS.clone(), code.value());
        trailers.insert(GRPC_MESSAGE.clone(), HeaderValue::from_static(message));
        self.trailers(trailers)
    }

    /// The frame that carries trailers to the client: HTTP trailers, or
    /// gRPC-Web's trailer frame. Nothing follows it.
    fn trailers(&mut self, trailers: HeaderMap) -> Frame<Bytes> {
        self.done = true;
        match &mut self.web {
            Some(encoder) => Frame::data(encoder.trailers(&trailers)),
            None => Frame::trailers(trailers),
        }
    }
}

impl Body for CallBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready())
                {
                    let frame = this.end(Code::DeadlineExceeded, "deadline exceeded");
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Pending
            }
            Poll::Ready(None) => {
                this.done = true;
                if !this.recorded {
                    // A 200 that ended without a status: the client's
                    // library reports it as an error of its own.
                    this.record(Code::Unknown);
                }
                let rest = this.web.as_mut().and_then(Encoder::finish);
                Poll::Ready(rest.map(|bytes| Ok(Frame::data(bytes))))
            }
            Poll::Ready(Some(Err(error))) => {
                tracing::debug!(%error, "gRPC response stream failed");
                let frame = this.end(Code::Unavailable, "the backend broke the call");
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(match &mut this.web {
                    Some(encoder) => encoder.data(data),
                    None => data,
                })))),
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => {
                        this.record(Code::of(&trailers).unwrap_or(Code::Unknown));
                        Poll::Ready(Some(Ok(this.trailers(trailers))))
                    }
                    Err(_) => Poll::Ready(Some(Ok(Frame::data(Bytes::new())))),
                },
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.web.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match self.web {
            // Re-encoded, with a trailer frame added: unknown.
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}

impl Drop for CallBody {
    fn drop(&mut self) {
        if !self.recorded {
            // Dropped before its end: the client went away.
            self.record(Code::Cancelled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gateway_failure_has_the_status_of_design_18() {
        let cases = [
            (ProxyError::NoRoute, Code::Unimplemented),
            (ProxyError::NoBackend, Code::Unavailable),
            (
                ProxyError::UpstreamRefused("10.9.8.7:1".into()),
                Code::Unavailable,
            ),
            (
                ProxyError::UpstreamConnect("10.9.8.7:1".into()),
                Code::Unavailable,
            ),
            (
                ProxyError::Upstream("10.9.8.7:1: reset".into()),
                Code::Unavailable,
            ),
            (
                ProxyError::UpstreamTimeout(Duration::from_secs(1)),
                Code::DeadlineExceeded,
            ),
            (
                ProxyError::RateLimited(Duration::from_secs(1)),
                Code::ResourceExhausted,
            ),
            (ProxyError::PayloadTooLarge, Code::ResourceExhausted),
            (ProxyError::Forbidden, Code::PermissionDenied),
        ];
        for (error, code) in cases {
            assert_eq!(status_of(&error).0, code, "{error}");
            // No internal detail: the message is one of ours.
            assert!(!status_of(&error).1.contains("10.9.8.7"), "{error}");
        }
    }
}

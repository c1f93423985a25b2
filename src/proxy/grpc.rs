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

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::time::Instant;

use super::body::{CallBody, ResponseBody};
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
        // A quota's refusal keeps its limits in the metadata.
        if let ProxyError::RateLimited(limited) = error {
            limited.headers(headers);
        }
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
        let web = self.web.map(|mode| {
            super::grpc_web::answer_head(&mut parts.headers, mode);
            Encoder::new(mode)
        });
        let mut body = CallBody::new(inner, self.deadline, route, trail, web);
        // Trailers-only (the status in the head), or not a gRPC answer at
        // all: the status is known now.
        if let Some(code) = Code::of(&parts.headers) {
            body.record(code);
        } else if parts.status != StatusCode::OK {
            body.record(Code::from_http(parts.status));
        } else if body.inner_mut().is_end_stream() {
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

/// The status and message for a failure the gateway answers itself: what
/// happened, in words that name no internals.
fn status_of(error: &ProxyError) -> (Code, &'static str) {
    match error {
        ProxyError::NoRoute => (Code::Unimplemented, "no route for this method"),
        ProxyError::Misdirected => (
            Code::Unavailable,
            "misdirected: open a connection for this host",
        ),
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
        ProxyError::WafBlocked { .. } => (
            Code::PermissionDenied,
            "blocked by the web application firewall",
        ),
        ProxyError::QuotaUnavailable => (Code::Unavailable, "the quota's store is unavailable"),
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
                ProxyError::RateLimited(Box::new(crate::proxy::error::Limited {
                    wait: Duration::from_secs(1),
                    policy: "r".into(),
                    quota: 10,
                    window: Duration::from_secs(1),
                    by: "local",
                })),
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

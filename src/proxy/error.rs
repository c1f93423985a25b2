//! Proxy errors, classified by source, and the one place they become
//! HTTP responses.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use super::body::ResponseBody;
use crate::telemetry::access::Flags;

/// Why a request could not be served, by whose fault.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The client sent something we refuse to forward.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// The request head is larger than the listener's `max_header_bytes`
    /// (where hyper's own limit did not catch it first).
    #[error("request head larger than max_header_bytes")]
    HeadTooLarge,
    /// No route of the pinned generation matches.
    #[error("no route matches")]
    NoRoute,
    /// The request is for a host another certificate entry of the
    /// listener serves than the one the connection's SNI chose
    /// (`tls.strict_sni_host`).
    #[error("misdirected request: not a host of this connection's certificate")]
    Misdirected,
    /// The route's `max_inflight` is reached.
    #[error("route is at its max_inflight limit")]
    Saturated,
    /// The route's quota is spent for this key (boxed: the error stays
    /// small on every other path).
    #[error("quota exceeded")]
    RateLimited(Box<Limited>),
    /// A fleet quota's store failed and its `on_store_error` is `deny`.
    #[error("quota store unavailable")]
    QuotaUnavailable,
    /// `allow_from` / `deny_from` refused the client.
    #[error("client address refused")]
    Forbidden,
    /// The body is larger than `max_request_body` (declared, or found so
    /// while it streamed before the answer began).
    #[error("request body exceeds max_request_body")]
    PayloadTooLarge,
    /// The route's web application firewall blocked the request (its
    /// status, 403 unless the rule says; the request's id in the answer,
    /// never a rule).
    #[error("blocked by the web application firewall")]
    WafBlocked {
        status: u16,
        request_id: HeaderValue,
    },
    /// The route's `auth` refused the request (401 with a challenge), or
    /// could not check it (503).
    #[error("authentication: {}", .0.outcome().name())]
    Unauthenticated(crate::auth::Denial),
    /// The route's upstream has no backend to offer.
    #[error("upstream has no backend")]
    NoBackend,
    /// The backend could not be connected to in time.
    #[error("upstream connect failed: {0}")]
    UpstreamConnect(String),
    /// The backend refused the connection.
    #[error("upstream refused the connection: {0}")]
    UpstreamRefused(String),
    /// The backend did not answer within the route's timeout.
    #[error("upstream did not answer within {0:?}")]
    UpstreamTimeout(std::time::Duration),
    /// The backend broke the exchange.
    #[error("upstream failed: {0}")]
    Upstream(String),
    /// A gRPC call for an upstream that speaks only HTTP/1.1.
    #[error("gRPC call for an HTTP/1.1 upstream")]
    GrpcOverHttp1,
    /// The client's request body failed while it was being forwarded
    /// (the client went away, or sent a malformed chunked body): the
    /// client's doing, so neither logged as nor counted against the
    /// backend.
    #[error("client request body failed: {detail}")]
    ClientBody {
        detail: String,
        /// The client went away before its body ended (rather than
        /// sending one that breaks the framing rules).
        closed: bool,
    },
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest(_) | ProxyError::ClientBody { .. } => StatusCode::BAD_REQUEST,
            ProxyError::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            ProxyError::Forbidden => StatusCode::FORBIDDEN,
            ProxyError::WafBlocked { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::FORBIDDEN)
            }
            ProxyError::Unauthenticated(denial) => denial.status(),
            ProxyError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Saturated | ProxyError::NoBackend | ProxyError::QuotaUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::UpstreamConnect(_)
            | ProxyError::UpstreamRefused(_)
            | ProxyError::Upstream(_)
            | ProxyError::GrpcOverHttp1 => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The answer to a head `request_framing::HeadCheck` refused for `reason`.
    pub fn refused_head(reason: &'static str) -> Self {
        if reason == super::activity::HEAD_TOO_LARGE {
            ProxyError::HeadTooLarge
        } else {
            ProxyError::BadRequest(reason)
        }
    }

    /// A failure of the client's request body, told apart by its cause.
    pub fn client_body(error: &(dyn std::error::Error + 'static)) -> Self {
        if too_large(error) {
            return ProxyError::PayloadTooLarge;
        }
        let mut closed = false;
        let mut source = Some(error);
        while let Some(cause) = source {
            if let Some(hyper) = cause.downcast_ref::<hyper::Error>() {
                closed |= hyper.is_incomplete_message() || hyper.is_canceled();
            }
            if let Some(io) = cause.downcast_ref::<std::io::Error>() {
                closed |= matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionAborted
                );
            }
            source = cause.source();
        }
        ProxyError::ClientBody {
            detail: super::error::error_chain(error),
            closed,
        }
    }

    /// How the request ended, for its access-log line.
    pub fn flags(&self) -> Flags {
        match self {
            ProxyError::BadRequest(_)
            | ProxyError::HeadTooLarge
            | ProxyError::ClientBody { closed: false, .. } => Flags::PROTOCOL_ERROR,
            ProxyError::ClientBody { closed: true, .. } => Flags::CLIENT_CLOSED,
            ProxyError::NoRoute => Flags::NO_ROUTE,
            ProxyError::Misdirected => Flags::DENIED,
            ProxyError::Forbidden | ProxyError::WafBlocked { .. } => Flags::DENIED,
            ProxyError::Unauthenticated(_) => Flags::NONE,
            ProxyError::PayloadTooLarge => Flags::BODY_TOO_LARGE,
            ProxyError::Saturated => Flags::ADMISSION_REJECTED,
            ProxyError::RateLimited(_) | ProxyError::QuotaUnavailable => Flags::RATE_LIMITED,
            ProxyError::NoBackend => Flags::NO_HEALTHY_BACKEND,
            ProxyError::UpstreamConnect(_) | ProxyError::UpstreamRefused(_) => {
                Flags::CONNECT_FAILURE
            }
            ProxyError::UpstreamTimeout(_) => Flags::UPSTREAM_TIMEOUT,
            ProxyError::Upstream(_) => Flags::UPSTREAM_RESET,
            ProxyError::GrpcOverHttp1 => Flags::UPSTREAM_PROTOCOL,
        }
    }

    /// Whether the failure lies with the upstream (for logs and metrics).
    pub fn is_upstream(&self) -> bool {
        matches!(
            self,
            ProxyError::UpstreamConnect(_)
                | ProxyError::UpstreamRefused(_)
                | ProxyError::UpstreamTimeout(_)
                | ProxyError::Upstream(_)
        )
    }
}

/// The response for an error: status, a one-line plain-text reason that
/// names no internals, and `Retry-After` where retrying makes sense.
pub fn error_response(error: &ProxyError) -> Response<ResponseBody> {
    // A forward auth service's refusal goes to the client as it said it.
    if let ProxyError::Unauthenticated(crate::auth::Denial::Answer(answer)) = error {
        let mut response = Response::new(ResponseBody::full(answer.body().clone()));
        *response.status_mut() = answer.status();
        *response.headers_mut() = answer.headers().clone();
        return response;
    }
    let status = error.status();
    let reason = status.canonical_reason().unwrap_or("error");
    let text = match error {
        ProxyError::WafBlocked { request_id, .. } => format!(
            "{} {reason}\nrequest id: {}\n",
            status.as_u16(),
            String::from_utf8_lossy(request_id.as_bytes())
        ),
        _ => format!("{} {reason}\n", status.as_u16()),
    };
    let mut response = Response::new(ResponseBody::full(Bytes::from(text)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if let Some(challenge) = match error {
        ProxyError::Unauthenticated(denial) => denial.challenge(),
        _ => None,
    } {
        headers.insert(header::WWW_AUTHENTICATE, challenge.clone());
    }
    if let ProxyError::RateLimited(limited) = error {
        limited.headers(headers);
    }
    if let ProxyError::WafBlocked { request_id, .. } = error {
        headers.insert(
            http::HeaderName::from_static("x-request-id"),
            request_id.clone(),
        );
    }
    response
}

/// A refusal by a route's quota, and what its answer tells the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// Until a token is free.
    pub wait: std::time::Duration,
    /// The policy's name: the route's.
    pub policy: std::sync::Arc<str>,
    /// Requests per window, and the window.
    pub quota: u32,
    pub window: std::time::Duration,
    /// What refused (the access log's `limited`): `local`, `fleet`, or
    /// `fallback` (this instance's share while the fleet's store fails).
    pub by: &'static str,
}

impl Limited {
    /// Whole seconds until a token (RFC 9110 §10.2.3), rounded up: never
    /// too early.
    pub fn seconds(&self) -> u64 {
        (self.wait.as_secs_f64().ceil() as u64).max(1)
    }

    /// `Retry-After`, and the IETF draft's `RateLimit-Policy` and
    /// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-09: a policy
    /// named by the route, `q` requests per `w` seconds; none remaining,
    /// `t` seconds until there is).
    pub fn headers(&self, headers: &mut http::HeaderMap) {
        let seconds = self.seconds();
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        for (name, value) in ratelimit_fields(&self.policy, self.quota, self.window, 0, seconds) {
            headers.insert(name, value);
        }
    }
}

/// What an admitted request's answer says of its route's quota
/// (`headers = "always"`): the policy, and what is left of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    pub policy: std::sync::Arc<str>,
    pub quota: u32,
    pub window: std::time::Duration,
    pub left: crate::limits::Left,
}

impl Advertised {
    /// `RateLimit-Policy` and `RateLimit`, appended: a backend's own
    /// policies stay beside the route's (the fields are lists).
    pub fn headers(&self, headers: &mut http::HeaderMap) {
        // Whole seconds until the quota is whole again, rounded up.
        let reset = self.left.reset.as_secs_f64().ceil() as u64;
        let fields = ratelimit_fields(
            &self.policy,
            self.quota,
            self.window,
            self.left.remaining,
            reset,
        );
        for (name, value) in fields {
            headers.append(name, value);
        }
    }
}

/// The draft's two fields for policy `policy`: `q` requests per `w`
/// seconds; `r` remaining, `t` seconds until the quota is whole again.
fn ratelimit_fields(
    policy: &str,
    quota: u32,
    window: std::time::Duration,
    remaining: u32,
    reset: u64,
) -> impl Iterator<Item = (http::HeaderName, HeaderValue)> {
    let window = window.as_secs().max(1);
    let policy_field = format!("\"{policy}\";q={quota};w={window}");
    let state = format!("\"{policy}\";r={remaining};t={reset}");
    [("ratelimit-policy", policy_field), ("ratelimit", state)]
        .into_iter()
        .filter_map(|(name, value)| {
            Some((
                http::HeaderName::from_static(name),
                HeaderValue::try_from(value).ok()?,
            ))
        })
}

/// A request body past `max_request_body`.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds max_request_body ({0} bytes)")]
pub struct BodyTooLarge(pub u64);

/// Whether `error`'s chain holds a `BodyTooLarge`.
pub fn too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(cause) = source {
        if cause.is::<BodyTooLarge>() {
            return true;
        }
        source = cause.source();
    }
    false
}

pub use crate::errors::error_chain;

//! Forward authentication (DESIGN §19; Envoy `ext_authz`, Traefik
//! `forwardAuth`): an auth service, reached as one of the configuration's
//! upstreams (its pool, health checks, outlier detection and TLS), is
//! asked about each request; a 2xx lets it on, with `response_headers`
//! copied onto it; any other answer goes back to the client as it is.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt as _;

use super::{Asked, Denial, Identity, Verdict};
use crate::backends::{Attempt, SignalledBody};

/// Largest body of an auth service's refusal passed to the client.
pub const MAX_ANSWER_BODY: usize = 64 * 1024;

/// `auth = { forward = { … } }`.
#[derive(Debug)]
pub struct Forward {
    /// The upstream the url's host names.
    pub upstream: String,
    /// The url's path and query.
    pub path: http::uri::PathAndQuery,
    pub timeout: Duration,
    /// Copied from the client's request to the auth service.
    pub request_headers: Vec<HeaderName>,
    /// Copied from a 2xx answer onto the request forwarded; the first
    /// present one is the access log's `subject`.
    pub response_headers: Vec<HeaderName>,
    /// `true`: a failed auth service lets requests through.
    pub fail_open: bool,
}

/// What the auth service said.
enum Said {
    Allowed(Response<Bytes>),
    Refused(Response<Bytes>),
    Failed(String),
}

impl Forward {
    pub async fn check(&self, asked: &Asked<'_>) -> Verdict {
        match self.ask(asked).await {
            Said::Allowed(answer) => {
                let mut identity = Identity::default();
                for name in &self.response_headers {
                    for value in answer.headers().get_all(name) {
                        if identity.subject.is_none() {
                            identity.subject = value.to_str().ok().map(str::to_owned);
                        }
                        identity.headers.push((name.clone(), value.clone()));
                    }
                }
                Verdict::Allowed(identity)
            }
            Said::Refused(answer) => Verdict::Denied(Denial::Answer(Box::new(answer))),
            Said::Failed(why) => {
                tracing::warn!(upstream = %self.upstream, error = %why, fail_open = self.fail_open, "forward auth failed");
                if self.fail_open {
                    Verdict::FailedOpen
                } else {
                    Verdict::Denied(Denial::Unavailable)
                }
            }
        }
    }

    async fn ask(&self, asked: &Asked<'_>) -> Said {
        let Some(service) = asked.service else {
            return Said::Failed(format!(
                "upstream '{}' is not in the generation",
                self.upstream
            ));
        };
        let Some(backend) = service.pick() else {
            return Said::Failed(format!(
                "upstream '{}' has no usable backend",
                self.upstream
            ));
        };
        let uri = http::Uri::builder()
            .scheme(backend.scheme.clone())
            .authority(backend.authority.clone())
            .path_and_query(self.path.clone())
            .build();
        let Ok(uri) = uri else {
            return Said::Failed("the auth service's address makes no URI".into());
        };
        let mut request = Request::new(SignalledBody::empty());
        *request.uri_mut() = uri;
        *request.version_mut() = backend.version;
        let headers = request.headers_mut();
        for name in &self.request_headers {
            for value in asked.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        let forwarded = [
            (
                "x-forwarded-method",
                HeaderValue::from_str(asked.method.as_str()).ok(),
            ),
            (
                "x-forwarded-proto",
                Some(HeaderValue::from_static(asked.scheme)),
            ),
            ("x-forwarded-host", asked.authority.cloned()),
            (
                "x-forwarded-uri",
                asked
                    .uri
                    .path_and_query()
                    .and_then(|p| HeaderValue::from_str(p.as_str()).ok()),
            ),
            (
                "x-forwarded-for",
                HeaderValue::from_str(&asked.client.to_string()).ok(),
            ),
        ];
        for (name, value) in forwarded {
            if let Some(value) = value {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        let _inflight = backend.start_request();
        let sent = Instant::now();
        let exchange = async {
            let response = backend.client().request(request).await.map_err(|e| {
                let attempt = if e.is_connect() {
                    Attempt::ConnectError
                } else {
                    Attempt::Error
                };
                (attempt, crate::proxy::error_chain(&e))
            })?;
            let status = response.status();
            let (parts, body) = response.into_parts();
            // A refusal's body goes to the client (bounded); a success's
            // is not needed.
            let body = if status.is_success() {
                Bytes::new()
            } else {
                http_body_util::Limited::new(body, MAX_ANSWER_BODY)
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default()
            };
            Ok(Response::from_parts(parts, body))
        };
        let result = tokio::time::timeout(self.timeout, exchange).await;
        let (attempt, said) = match result {
            Err(_) => (
                Attempt::Timeout,
                Said::Failed(format!("no answer within {:?}", self.timeout)),
            ),
            Ok(Err((attempt, why))) => (
                attempt,
                Said::Failed(format!("{}: {why}", backend.key.addr)),
            ),
            Ok(Ok(answer)) => {
                let status = answer.status();
                let said = if status.is_success() {
                    Said::Allowed(answer)
                } else if status.is_server_error() {
                    Said::Failed(format!("{}: answered {status}", backend.key.addr))
                } else {
                    Said::Refused(refusal(answer))
                };
                (Attempt::Answered(status), said)
            }
        };
        service.report(backend, attempt, Some(sent.elapsed()));
        said
    }
}

/// The part of a refusal the client gets: its status, `Location`,
/// `WWW-Authenticate`, `Content-Type` and body.
fn refusal(answer: Response<Bytes>) -> Response<Bytes> {
    let (parts, body) = answer.into_parts();
    let mut out = Response::new(body);
    *out.status_mut() = match parts.status {
        // An informational or redirect-without-location status would not
        // make sense to a client as the answer to its request.
        s if s.is_informational() => StatusCode::FORBIDDEN,
        s => s,
    };
    for name in [
        header::LOCATION,
        header::WWW_AUTHENTICATE,
        header::CONTENT_TYPE,
    ] {
        for value in parts.headers.get_all(&name) {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    out
}

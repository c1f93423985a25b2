//! Forward authentication (DESIGN §19; Envoy `ext_authz`, Traefik
//! `forwardAuth`): an auth service, reached as one of the configuration's
//! upstreams (its pool, health checks, outlier detection and TLS), is
//! asked about each request; a 2xx lets it on, with `response_headers`
//! copied onto it; any other answer below 500 goes back to the client as
//! it is; no answer or a 5xx follows `failure`. What is asked and what an
//! answer means are here; the exchange itself is the data plane's
//! (`proxy/auth.rs`), through the generation's upstream.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};

use super::{Asked, Denial, Identity, Verdict};

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
    /// Answers kept for the next requests with the same credentials
    /// (`cache = { … }`; `forward_cache.rs`).
    pub cache: Option<super::forward_cache::ForwardCache>,
}

impl Forward {
    /// What the auth service's answer (or its failure) means for the
    /// request.
    pub fn judge(&self, said: Said) -> Verdict {
        match said {
            Said::Answered(answer) if answer.status().is_success() => {
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
            Said::Answered(answer) if answer.status().is_server_error() => {
                self.failed(&format!("answered {}", answer.status()))
            }
            Said::Answered(answer) => Verdict::Denied(Denial::Answer(Box::new(refusal(answer)))),
            Said::Failed(why) => self.failed(&why),
        }
    }

    fn failed(&self, why: &str) -> Verdict {
        tracing::warn!(upstream = %self.upstream, error = %why, fail_open = self.fail_open, "forward auth failed");
        if self.fail_open {
            Verdict::FailedOpen
        } else {
            Verdict::Denied(Denial::Unavailable)
        }
    }

    /// The request to send the auth service, for a backend at
    /// `scheme://authority`: `GET` of the url's path and query with the
    /// listed headers and the `X-Forwarded-*` of the client's request.
    pub fn request<B>(
        &self,
        asked: &Asked<'_>,
        scheme: http::uri::Scheme,
        authority: http::uri::Authority,
        body: B,
    ) -> Option<Request<B>> {
        let uri = http::Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query(self.path.clone())
            .build()
            .ok()?;
        let mut request = Request::new(body);
        *request.uri_mut() = uri;
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
        Some(request)
    }
}

/// What became of asking the auth service.
pub enum Said {
    /// Its answer; a refusal's body read (at most [`MAX_ANSWER_BODY`]).
    Answered(Response<Bytes>),
    /// No answer: no usable backend, a connection failure, the timeout.
    Failed(String),
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

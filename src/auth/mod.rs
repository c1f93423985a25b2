//! Authentication at the gateway (DESIGN §19): a route's (or its
//! listener's default) `auth`, compiled at plan time, checked on the
//! request path after the route's quota and before its action.
//!
//! - `basic.rs`: htpasswd files of bcrypt / argon2id hashes;
//! - `jwt.rs`: bearer tokens, keys from a JWKS file or URL, or an HMAC key;
//! - `forward.rs`: an auth service, one of the configuration's upstreams
//!   (asked by `proxy/auth.rs`);
//! - `secret.rs`: the files secrets live in, re-read by `reload-certs`.
//!
//! Every header the gateway sets from an identity is removed from what
//! the client sent before the check: a client cannot spoof one.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Method as HttpMethod};

pub mod basic;
pub mod forward;
pub mod forward_cache;
pub mod jwt;
mod remember;
pub mod secret;

pub use secret::{Reload, SecretFile};

/// How a route authenticates.
#[derive(Debug)]
pub enum Auth {
    Basic(basic::Basic),
    Jwt(jwt::Jwt),
    Forward(forward::Forward),
}

/// The request as a check needs it (the checks run in `proxy/auth.rs`:
/// forward auth's goes through a generation's upstream).
pub struct Asked<'a> {
    pub method: &'a HttpMethod,
    pub uri: &'a http::Uri,
    pub headers: &'a HeaderMap,
    pub authority: Option<&'a HeaderValue>,
    pub scheme: &'static str,
    pub client: IpAddr,
}

/// Two compiled methods are equal when they are one: each holds its own
/// secrets and caches.
impl PartialEq for Auth {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Auth {}

/// The method, for `cutover_auth_total{method}` and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Basic,
    Jwt,
    Forward,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Basic, Method::Jwt, Method::Forward];

    pub fn name(self) -> &'static str {
        match self {
            Method::Basic => "basic",
            Method::Jwt => "jwt",
            Method::Forward => "forward",
        }
    }
}

/// What a check found, for `cutover_auth_total{outcome}` and the access
/// log's `auth` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    /// No credentials (401).
    Missing,
    /// Credentials that do not hold (401).
    Invalid,
    /// The keys or the auth service could not be had, or verification is
    /// saturated (503).
    Unavailable,
    /// The auth service answered something other than 2xx (passed on).
    Refused,
    /// The auth service failed and `failure = "allow"` let the request on.
    FailedOpen,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Allowed,
        Outcome::Missing,
        Outcome::Invalid,
        Outcome::Unavailable,
        Outcome::Refused,
        Outcome::FailedOpen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Missing => "missing",
            Outcome::Invalid => "invalid",
            Outcome::Unavailable => "unavailable",
            Outcome::Refused => "refused",
            Outcome::FailedOpen => "failed_open",
        }
    }
}

/// Who a request was found to be.
#[derive(Debug, Default, Clone)]
pub struct Identity {
    /// The user, or the token's `sub`.
    pub subject: Option<String>,
    /// Set on the request (`claims_to_headers`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Remove the credentials before forwarding (JWT `forward_token =
    /// false`, Basic `forward_credentials = false`).
    pub remove_credentials: bool,
}

impl Identity {
    fn subject(subject: String) -> Self {
        Identity {
            subject: Some(subject),
            ..Identity::default()
        }
    }
}

/// Why a request was refused.
#[derive(Debug)]
pub enum Denial {
    /// 401 with this `WWW-Authenticate`.
    Missing(HeaderValue),
    Invalid(HeaderValue),
    /// 503: keys or the auth service not to be had, or too many
    /// verifications waiting.
    Unavailable,
    Busy,
    /// The auth service's refusal, passed to the client.
    Answer(Box<http::Response<bytes::Bytes>>),
}

impl Denial {
    pub fn outcome(&self) -> Outcome {
        match self {
            Denial::Missing(_) => Outcome::Missing,
            Denial::Invalid(_) => Outcome::Invalid,
            Denial::Unavailable | Denial::Busy => Outcome::Unavailable,
            Denial::Answer(_) => Outcome::Refused,
        }
    }

    pub fn status(&self) -> http::StatusCode {
        match self {
            Denial::Missing(_) | Denial::Invalid(_) => http::StatusCode::UNAUTHORIZED,
            Denial::Unavailable | Denial::Busy => http::StatusCode::SERVICE_UNAVAILABLE,
            Denial::Answer(answer) => answer.status(),
        }
    }

    /// The `WWW-Authenticate` of a 401.
    pub fn challenge(&self) -> Option<&HeaderValue> {
        match self {
            Denial::Missing(c) | Denial::Invalid(c) => Some(c),
            Denial::Unavailable | Denial::Busy | Denial::Answer(_) => None,
        }
    }
}

#[derive(Debug)]
pub enum Verdict {
    Allowed(Identity),
    Denied(Denial),
    /// The auth service failed; `failure = "allow"` lets the request on
    /// without an identity.
    FailedOpen,
}

impl Verdict {
    pub fn outcome(&self) -> Outcome {
        match self {
            Verdict::Allowed(_) => Outcome::Allowed,
            Verdict::Denied(denial) => denial.outcome(),
            Verdict::FailedOpen => Outcome::FailedOpen,
        }
    }
}

impl Auth {
    pub fn method(&self) -> Method {
        match self {
            Auth::Basic(_) => Method::Basic,
            Auth::Jwt(_) => Method::Jwt,
            Auth::Forward(_) => Method::Forward,
        }
    }

    /// Removes from a client's request every header this method sets.
    pub fn strip_identity(&self, headers: &mut HeaderMap) {
        let names: &mut dyn Iterator<Item = &HeaderName> = match self {
            Auth::Basic(_) => &mut std::iter::empty(),
            Auth::Jwt(jwt) => &mut jwt.identity_headers(),
            Auth::Forward(forward) => &mut forward.response_headers.iter(),
        };
        for name in names {
            headers.remove(name);
        }
    }

    /// Sets what the check found on the request to forward.
    pub fn apply(&self, identity: &Identity, headers: &mut HeaderMap) {
        if identity.remove_credentials {
            match self {
                Auth::Basic(_) => {
                    headers.remove(http::header::AUTHORIZATION);
                }
                Auth::Jwt(jwt) => {
                    if let jwt::TokenSource::Header(name) = &jwt.from {
                        headers.remove(name);
                    }
                }
                Auth::Forward(_) => {}
            }
        }
        for (name, value) in &identity.headers {
            headers.insert(name.clone(), value.clone());
        }
    }

    /// The secret files it reads, for `reload-certs`.
    pub fn secrets(&self) -> Vec<&dyn Reload> {
        match self {
            Auth::Basic(basic) => vec![&basic.users as &dyn Reload],
            Auth::Jwt(jwt) => match &jwt.keys {
                jwt::Keys::File(file) => vec![file as &dyn Reload],
                jwt::Keys::Hmac(file) => vec![file as &dyn Reload],
                jwt::Keys::Url(_) => Vec::new(),
            },
            Auth::Forward(_) => Vec::new(),
        }
    }

    /// Starts what runs beside the requests (a JWKS URL's fetches), on
    /// the current runtime.
    pub fn start(&self) {
        if let Auth::Jwt(jwt) = self {
            if let jwt::Keys::Url(remote) = &jwt.keys {
                remote.start();
            }
        }
    }
}

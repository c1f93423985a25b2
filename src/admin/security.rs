//! Admin API guards (DESIGN §10): bearer token in constant time, Host
//! check against DNS rebinding, foreign browser Origins refused, and a
//! browser's writes held to the console session's CSRF token.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// What the guards and limits check requests against.
#[derive(Debug, Clone)]
pub struct Security {
    /// The admin socket's bound address.
    pub address: SocketAddr,
    /// Expected bearer token, if one is configured.
    pub token: Option<String>,
    /// The largest request body read, once decompressed (`admin.max_body`).
    pub max_body: usize,
    /// What this process derives the console's CSRF tokens from.
    csrf_key: ring::hmac::Key,
}

/// The header a browser's write must carry (see `guard`).
pub const CSRF_HEADER: &str = "x-cutover-csrf";

/// The console session's CSRF token, for `GET /admin/ui/session`.
#[derive(Debug, Clone)]
pub struct Csrf(pub String);

impl Security {
    pub fn new(address: SocketAddr, token: Option<String>, max_body: usize) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .unwrap_or_else(|_| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[0; 32]));
        Self {
            address,
            token,
            max_body,
            csrf_key: key,
        }
    }

    /// The CSRF token of a session: bound to this process and to the
    /// credentials the browser presents, so that a token read under one
    /// login (or by a process before a restart) is worth nothing under
    /// another.
    fn csrf_token(&self, authorization: Option<&HeaderValue>) -> String {
        let presented = authorization.map_or(&b""[..], HeaderValue::as_bytes);
        let tag = ring::hmac::sign(&self.csrf_key, presented);
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }
    /// Host values a request may carry: the bound address, and `localhost`
    /// for loopback binds. A wildcard bind accepts any host.
    fn host_allowed(&self, host: &str) -> bool {
        if self.address.ip().is_unspecified() {
            return true;
        }
        let port = self.address.port();
        let exact = self.address.to_string();
        host == exact || (self.address.ip().is_loopback() && (host == format!("localhost:{port}")))
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|host| self.host_allowed(host))
    }

    /// The token as a bearer token, or as the password of HTTP Basic
    /// credentials (any user name): how a browser on the admin page
    /// presents it, since a page cannot add a header to its own loading.
    fn token_ok(&self, presented: Option<&HeaderValue>) -> bool {
        let Some(expected) = &self.token else {
            return true;
        };
        let presented = presented.and_then(|v| v.to_str().ok()).unwrap_or("");
        let token: Vec<u8> = if let Some(bearer) = presented.strip_prefix("Bearer ") {
            bearer.as_bytes().to_vec()
        } else if let Some(basic) = presented.strip_prefix("Basic ") {
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(basic.trim())
                .unwrap_or_default();
            match decoded.iter().position(|b| *b == b':') {
                Some(colon) => decoded[colon + 1..].to_vec(),
                None => Vec::new(),
            }
        } else {
            Vec::new()
        };
        bool::from(token.ct_eq(expected.as_bytes()))
    }
}

/// Middleware: refuses with 401/403 and no detail.
pub async fn guard(
    State(security): State<Arc<Security>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    // Exactly one Host, and it names this server: a missing one is refused
    // like a wrong one (a DNS-rebinding page cannot be told apart from a
    // client that sent none), and a second one could be read by something
    // in front of us instead of the first.
    let mut hosts = headers.get_all(header::HOST).iter();
    let host_ok = match (hosts.next(), hosts.next()) {
        (Some(host), None) => host.to_str().is_ok_and(|h| security.host_allowed(h)),
        _ => false,
    };
    // An absolute-form target names a host of its own, which wins over
    // Host for any proxy in between (RFC 9112 §3.2.2): it must be ours too.
    let target_ok = request
        .uri()
        .authority()
        .is_none_or(|a| security.host_allowed(a.as_str()));
    if !host_ok || !target_ok {
        return StatusCode::FORBIDDEN.into_response();
    }
    for origin in headers.get_all(header::ORIGIN) {
        if !origin.to_str().is_ok_and(|o| security.origin_allowed(o)) {
            return StatusCode::FORBIDDEN.into_response();
        }
    }
    if !security.token_ok(headers.get(header::AUTHORIZATION)) {
        let mut response = StatusCode::UNAUTHORIZED.into_response();
        // The page asks the browser for the token as a Basic password;
        // API clients are told to send a bearer token.
        let challenge = if is_page(request.uri().path()) {
            HeaderValue::from_static("Basic realm=\"cutover admin\", charset=\"UTF-8\"")
        } else {
            HeaderValue::from_static("Bearer")
        };
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
        return response;
    }
    // A browser's write (the page's Basic login, or any request a browser
    // marks with Origin or Sec-Fetch-Site) must carry the session's CSRF
    // token in a header: a cross-site form cannot set one, and a page of
    // another origin cannot read the token. Scripts with a bearer token
    // send none of these and are not asked.
    let browser = headers.contains_key(header::ORIGIN)
        || headers.contains_key("sec-fetch-site")
        || headers
            .get(header::AUTHORIZATION)
            .is_some_and(|v| v.as_bytes().starts_with(b"Basic "));
    let csrf = Csrf(security.csrf_token(headers.get(header::AUTHORIZATION)));
    let reads = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if browser && !reads {
        let presented = headers
            .get(CSRF_HEADER)
            .map_or(&b""[..], HeaderValue::as_bytes);
        if !bool::from(presented.ct_eq(csrf.0.as_bytes())) {
            return StatusCode::FORBIDDEN.into_response();
        }
    }
    let mut request = request;
    request.extensions_mut().insert(csrf);
    next.run(request).await
}

/// The console's paths: a browser loads them, so a missing token is
/// asked for as Basic credentials.
pub fn is_page(path: &str) -> bool {
    path == "/admin/" || path == "/admin" || path.starts_with("/admin/ui/")
}

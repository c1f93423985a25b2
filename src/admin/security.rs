//! Admin API guards (DESIGN §10, §23): the caller named by its bearer
//! token (compared by SHA-256 in constant time, over every caller) and
//! held to its scopes, Host check against DNS rebinding, foreign browser
//! Origins refused, and a browser's writes held to the console session's
//! CSRF token.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::plan::{CallerSpec, Credential, Scope, Scopes};
use crate::telemetry::audit;

/// What the guards and limits check requests against.
#[derive(Debug, Clone)]
pub struct Security {
    /// The admin socket's bound address.
    pub address: SocketAddr,
    /// Who may call, by the SHA-256 of their tokens; none: every call is
    /// let in (a loopback bind only, see `plan`).
    callers: Vec<Caller>,
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

/// The authenticated caller of a request (none when the admin API has no
/// callers), for the handlers that record who acted.
#[derive(Debug, Clone)]
pub struct CallerName(pub Option<Arc<str>>);

/// The scopes of the authenticated caller (none when the admin API has
/// no callers: every call is let in).
#[derive(Debug, Clone, Copy)]
pub struct CallerScopes(Option<Scopes>);

impl CallerScopes {
    pub fn allow(self, scope: Scope) -> bool {
        self.0.is_none_or(|scopes| scopes.allow(scope))
    }
}

/// Whether the caller the guard authenticated for `request` has `scope`.
pub fn caller_may<B>(request: &axum::http::Request<B>, scope: Scope) -> bool {
    request
        .extensions()
        .get::<CallerScopes>()
        .is_some_and(|s| s.allow(scope))
}

/// The caller the guard authenticated for `request`.
pub fn caller_of<B>(request: &axum::http::Request<B>) -> Option<String> {
    request
        .extensions()
        .get::<CallerName>()
        .and_then(|c| c.0.as_deref())
        .map(str::to_owned)
}

/// A caller of the admin API as the guard knows it.
#[derive(Debug, Clone)]
struct Caller {
    name: Arc<str>,
    credential: Credential,
    scopes: Scopes,
}

/// The client certificate a connection to the admin listener presented,
/// verified against `admin.tls.client_ca` (set by the server on each of
/// the connection's requests).
#[derive(Debug, Clone, Default)]
pub struct PeerCertificate {
    pub subject: Option<String>,
    pub sans: Vec<String>,
}

impl Security {
    pub fn new(address: SocketAddr, callers: &[CallerSpec], max_body: usize) -> Self {
        let rng = ring::rand::SystemRandom::new();
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .unwrap_or_else(|_| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[0; 32]));
        Self {
            address,
            callers: callers
                .iter()
                .map(|c| Caller {
                    name: Arc::from(c.name.as_str()),
                    credential: c.credential.clone(),
                    scopes: c.scopes,
                })
                .collect(),
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

    /// The caller whose token is presented, as a bearer token or as the
    /// password of HTTP Basic (what the console's login sends), or else
    /// the one the connection's client certificate names: `Ok(None)`
    /// when no callers are configured, `Err` when nothing presented names
    /// one. The presented token's SHA-256 is compared with every token
    /// caller's, in constant time, so the time taken says nothing of
    /// which matched.
    fn caller(
        &self,
        presented: Option<&HeaderValue>,
        certificate: Option<&PeerCertificate>,
    ) -> Result<Option<&Caller>, ()> {
        use sha2::Digest as _;
        if self.callers.is_empty() {
            return Ok(None);
        }
        let Some(presented) = presented else {
            let certificate = certificate.ok_or(())?;
            return self
                .callers
                .iter()
                .find(|c| match &c.credential {
                    Credential::Certificate(matcher) => {
                        matcher.matches(certificate.subject.as_deref(), &certificate.sans)
                    }
                    Credential::Token(_) => false,
                })
                .map(Some)
                .ok_or(());
        };
        let presented = presented.as_bytes();
        let token: Vec<u8> = if let Some(bearer) = presented.strip_prefix(b"Bearer ") {
            bearer.trim_ascii().to_vec()
        } else if let Some(basic) = presented.strip_prefix(b"Basic ") {
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(basic.trim_ascii())
                .map_err(|_| ())?;
            // user:password; the user name is not checked.
            match decoded.iter().position(|&b| b == b':') {
                Some(colon) => decoded[colon + 1..].to_vec(),
                None => return Err(()),
            }
        } else {
            return Err(());
        };
        let digest: [u8; 32] = sha2::Sha256::digest(&token).into();
        let mut found = None;
        for caller in &self.callers {
            if let Credential::Token(hash) = &caller.credential {
                if bool::from(digest.ct_eq(hash)) {
                    found = Some(caller);
                }
            }
        }
        found.map(Some).ok_or(())
    }
}

/// The scope a call needs: reads need `read`; each write the scope of
/// its kind (an unknown one `admin`: it is answered 404 anyway).
pub fn required_scope(method: &axum::http::Method, path: &str) -> Scope {
    use axum::http::Method;
    if *method == Method::GET || *method == Method::HEAD {
        return Scope::Read;
    }
    match path.trim_end_matches('/') {
        "/admin/runtime/validate" | "/admin/runtime/preview" => Scope::Validate,
        "/admin/runtime/activate"
        | "/admin/runtime/reload"
        | "/admin/runtime/rollback"
        | "/admin/runtime/confirm"
        | "/admin/runtime/abort" => Scope::Activate,
        "/admin/runtime/reload-certs" => Scope::Certs,
        // Proposing a change takes the scope of the change itself.
        "/admin/runtime/proposals" => Scope::Activate,
        decided
            if decided.starts_with("/admin/runtime/proposals/")
                && (decided.ends_with("/approve") || decided.ends_with("/reject")) =>
        {
            Scope::Approve
        }
        "/admin/cache/purge" => Scope::Cache,
        "/admin/lifecycle/drain" | "/admin/lifecycle/upgrade" => Scope::Lifecycle,
        fleet if fleet.starts_with("/admin/fleet/") => Scope::Fleet,
        _ => Scope::Admin,
    }
}

/// 403 `forbidden` naming the scope the caller lacks (never which
/// callers exist or what they may do).
pub fn forbidden(scope: Scope) -> Response {
    let body = serde_json::json!({
        "error": "forbidden",
        "message": format!("this caller lacks the '{}' scope", scope.name()),
        "missing_scope": scope.name(),
    });
    (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
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
    let needed = required_scope(request.method(), request.uri().path());
    let audit = Audit::of(&request, needed);
    let certificate = request.extensions().get::<PeerCertificate>();
    let Ok(caller) = security.caller(headers.get(header::AUTHORIZATION), certificate) else {
        audit.refused(None, "unauthorized", None);
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
    };
    if let Some(caller) = caller.filter(|c| !c.scopes.allow(needed)) {
        tracing::info!(caller = %caller.name, scope = needed.name(), method = %request.method(), path = request.uri().path(), "admin call refused: scope missing");
        audit.refused(Some(&caller.name), "forbidden", Some(needed));
        return forbidden(needed);
    }
    let scopes = CallerScopes(caller.map(|c| c.scopes));
    let caller = caller.map(|c| Arc::clone(&c.name));

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
    request.extensions_mut().insert(CallerName(caller.clone()));
    request.extensions_mut().insert(scopes);
    let response = next.run(request).await;
    audit.done(caller.as_deref(), response).await
}

/// What the audit log (`telemetry::audit`) keeps of one call: calls that
/// change something, and refusals by authentication or scope.
struct Audit {
    /// Whether the call changes something (not a read, validate or
    /// preview).
    changes: bool,
    peer: Option<SocketAddr>,
    method: String,
    path: String,
}

impl Audit {
    fn of(request: &Request, needed: Scope) -> Option<Self> {
        if !audit::enabled() {
            return None;
        }
        Some(Self {
            changes: !matches!(needed, Scope::Read | Scope::Validate),
            peer: request
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
        })
    }

    fn entry(&self, caller: Option<&str>, status: StatusCode) -> audit::Entry {
        audit::Entry {
            time: crate::runtime::rfc3339(std::time::SystemTime::now()),
            caller: caller.map(str::to_owned),
            refused: None,
            missing_scope: None,
            peer: self.peer,
            method: self.method.clone(),
            path: self.path.clone(),
            status: status.as_u16(),
            operation_id: None,
        }
    }
}

trait AuditExt {
    fn refused(&self, caller: Option<&str>, why: &'static str, missing: Option<Scope>);
    async fn done(&self, caller: Option<&str>, response: Response) -> Response;
}

impl AuditExt for Option<Audit> {
    /// A refusal by authentication (401) or scope (403).
    fn refused(&self, caller: Option<&str>, why: &'static str, missing: Option<Scope>) {
        let Some(audit) = self else { return };
        let status = match missing {
            Some(_) => StatusCode::FORBIDDEN,
            None => StatusCode::UNAUTHORIZED,
        };
        audit::record(audit::Entry {
            refused: Some(why),
            missing_scope: missing.map(Scope::name),
            ..audit.entry(caller, status)
        });
    }

    /// A call let through: recorded when it changes something, with the
    /// operation its answer names; a scope refused past the guard (going
    /// through a freeze takes `override`, which only the body asks for)
    /// is recorded as the guard records its own.
    async fn done(&self, caller: Option<&str>, response: Response) -> Response {
        let Some(audit) = self.as_ref().filter(|a| a.changes) else {
            return response;
        };
        let status = response.status();
        let (parts, body) = response.into_parts();
        let (body, answer) = match axum::body::to_bytes(body, 64 << 20).await {
            Ok(bytes) => {
                let answer = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
                (axum::body::Body::from(bytes), answer)
            }
            Err(_) => (axum::body::Body::empty(), None),
        };
        let field = |name: &str| answer.as_ref().and_then(|a| a.get(name)?.as_str());
        let missing_scope = field("missing_scope")
            .filter(|_| status == StatusCode::FORBIDDEN)
            .and_then(Scope::parse);
        audit::record(audit::Entry {
            operation_id: field("operation_id").map(str::to_owned),
            refused: missing_scope.map(|_| "forbidden"),
            missing_scope: missing_scope.map(Scope::name),
            ..audit.entry(caller, status)
        });
        Response::from_parts(parts, body)
    }
}

/// The console's paths: a browser loads them, so a missing token is
/// asked for as Basic credentials.
pub fn is_page(path: &str) -> bool {
    path == "/admin/" || path == "/admin" || path.starts_with("/admin/ui/")
}

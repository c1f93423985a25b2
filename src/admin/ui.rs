//! The admin page (`GET /admin/`): plain HTML, CSS and JavaScript in the
//! binary, fed by the admin API's own JSON from the same origin; its
//! actions (confirm, abort, roll back, preview) are calls to the same API
//! carrying the session's CSRF token. It sits behind the same guards as every admin call (token,
//! Host, Origin) and sends a Content-Security-Policy that allows nothing
//! but its own two files and same-origin requests: no inline script, no
//! other origin, no framing.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

pub async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// The console session's CSRF token, which its writes carry in
/// `X-Cutover-Csrf` (see `security::guard`). Same-origin only: another
/// origin's page cannot read it.
pub async fn session(axum::Extension(csrf): axum::Extension<super::security::Csrf>) -> Response {
    let mut response = axum::Json(serde_json::json!({ "csrf": csrf.0 })).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

//! What every admin request gets before a handler sees it, and every
//! error answer after: bodies read whole within a size and a time bound,
//! and error bodies that are always JSON (DESIGN §4).

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use serde_json::json;

use super::MAX_BODY;

/// Longest a client may take to send a request body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest `reason` and `requested_by` (bytes): they are kept in history
/// and written to disk with every operation.
pub const MAX_METADATA: usize = 1024;

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let message = message.into();
    (status, Json(json!({ "error": code, "message": message }))).into_response()
}

/// Reads the body before the handler runs: a declared `Content-Length`
/// over `MAX_BODY` is refused before a byte is read (413), a body that
/// does not arrive within `BODY_TIMEOUT` is refused (408), and the
/// handler gets it whole, so no handler can wait on a stalled client.
pub async fn bounded_body(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("bodies are limited to {MAX_BODY} bytes"),
        );
    }
    let (parts, body) = request.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    match tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await {
        Err(_) => error(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the body did not arrive within {BODY_TIMEOUT:?}"),
        ),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("bodies are limited to {MAX_BODY} bytes"),
        ),
        Ok(Err(e)) => error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("cannot read the body: {e}"),
        ),
        Ok(Ok(collected)) => {
            let body = Body::from(collected.to_bytes());
            next.run(Request::from_parts(parts, body)).await
        }
    }
}

/// Turns every error answer that is not JSON yet (axum's own 405, 400
/// for a bad query string, the guards' 401 and 403) into
/// `{"error": code, "message": …}`. The guards' answers carry no detail.
pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = http_body_util::Limited::new(body, 4096)
        .collect()
        .await
        .map(|c| String::from_utf8_lossy(&c.to_bytes()).trim().to_owned())
        .unwrap_or_default();
    let (code, message) = match status {
        StatusCode::UNAUTHORIZED => ("unauthorized", "authentication required".to_owned()),
        StatusCode::FORBIDDEN => ("forbidden", "forbidden".to_owned()),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "this endpoint does not take this method".to_owned(),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "payload_too_large",
            format!("bodies are limited to {MAX_BODY} bytes"),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported_media_type", text),
        StatusCode::BAD_REQUEST => ("bad_request", text),
        other => (
            "error",
            other.canonical_reason().unwrap_or("error").to_owned(),
        ),
    };
    let body = json!({ "error": code, "message": message }).to_string();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// Refuses `reason` or `requested_by` longer than `MAX_METADATA`, before
/// anything is recorded: a refused call stores nothing of them.
pub fn check_metadata(fields: &[(&str, Option<&str>)]) -> Result<(), super::ApiError> {
    for (name, value) in fields {
        if value.is_some_and(|v| v.len() > MAX_METADATA) {
            return Err(super::ApiError::BadRequest(format!(
                "{name} is longer than {MAX_METADATA} bytes"
            )));
        }
    }
    Ok(())
}

//! What every admin request gets before a handler sees it, and every
//! error answer after: bodies read whole within a size and a time bound,
//! and error bodies that are always JSON (DESIGN §4).

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use serde_json::json;

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
/// over `max_body` (`admin.max_body`) is refused before a byte is read
/// (413), a body that does not arrive within `BODY_TIMEOUT` is refused
/// (408), a `gzip` or `zstd` body is decompressed within the same bound
/// (413 past it, however small the compressed body), and the handler gets
/// it whole, so no handler can wait on a stalled client.
pub async fn bounded_body(State(max_body): State<usize>, request: Request, next: Next) -> Response {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("bodies are limited to {max_body} bytes (admin.max_body)"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return too_large();
    }
    let encoding = match Encoding::of(request.headers()) {
        Ok(encoding) => encoding,
        Err(named) => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_encoding",
                format!("Content-Encoding '{named}' is not accepted; send gzip, zstd or none"),
            )
        }
    };
    let (mut parts, body) = request.into_parts();
    let limited = http_body_util::Limited::new(body, max_body);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await {
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!("the body did not arrive within {BODY_TIMEOUT:?}"),
            )
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read the body: {e}"),
            )
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let bytes = match encoding {
        None => bytes,
        Some(encoding) => {
            let inflated =
                tokio::task::spawn_blocking(move || encoding.decode(&bytes, max_body)).await;
            match inflated {
                Ok(Ok(bytes)) => {
                    parts.headers.remove(header::CONTENT_ENCODING);
                    parts.headers.remove(header::CONTENT_LENGTH);
                    bytes
                }
                Ok(Err(Inflate::TooLarge)) => return too_large(),
                Ok(Err(Inflate::Corrupt(why))) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        format!("cannot decompress the body: {why}"),
                    )
                }
                Err(e) => {
                    return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
                }
            }
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A request body's `Content-Encoding` the admin API reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Gzip,
    Zstd,
}

/// Why a compressed body was not read.
#[derive(Debug)]
enum Inflate {
    /// It decompresses past the limit.
    TooLarge,
    Corrupt(String),
}

impl Encoding {
    /// `None` without one (or `identity`); the name of one it does not
    /// read.
    fn of(headers: &axum::http::HeaderMap) -> Result<Option<Encoding>, String> {
        let Some(value) = headers.get(header::CONTENT_ENCODING) else {
            return Ok(None);
        };
        let text = value.to_str().unwrap_or("").trim().to_ascii_lowercase();
        match text.as_str() {
            "" | "identity" => Ok(None),
            "gzip" | "x-gzip" => Ok(Some(Encoding::Gzip)),
            "zstd" => Ok(Some(Encoding::Zstd)),
            _ => Err(text),
        }
    }

    /// The body decompressed, never more than `max` bytes of it kept: a
    /// small body that inflates past the limit stops there. zstd's window
    /// is bounded too (a frame may ask for up to 2 GiB of it).
    fn decode(self, compressed: &[u8], max: usize) -> Result<bytes::Bytes, Inflate> {
        use std::io::Read;
        let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
        let mut out = Vec::new();
        let read = match self {
            Encoding::Gzip => flate2::read::MultiGzDecoder::new(compressed)
                .take(limit)
                .read_to_end(&mut out),
            Encoding::Zstd => {
                let mut decoder = zstd::stream::read::Decoder::new(compressed)
                    .map_err(|e| Inflate::Corrupt(e.to_string()))?;
                // A window more than twice what the body may hold is
                // refused as too large (zstd says it "requires too much
                // memory"): the frame was made for a larger body.
                let window = usize::BITS - max.max(1 << 10).leading_zeros() + 1;
                decoder
                    .window_log_max(window.clamp(10, 27))
                    .map_err(|e| Inflate::Corrupt(e.to_string()))?;
                match decoder.take(limit).read_to_end(&mut out) {
                    Err(e) if e.to_string().contains("too much memory") => {
                        return Err(Inflate::TooLarge)
                    }
                    read => read,
                }
            }
        };
        read.map_err(|e| Inflate::Corrupt(e.to_string()))?;
        if out.len() > max {
            return Err(Inflate::TooLarge);
        }
        Ok(bytes::Bytes::from(out))
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
            "the body is larger than admin.max_body allows".to_owned(),
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

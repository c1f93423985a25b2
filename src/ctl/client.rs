//! The HTTP/1.1 client ctl talks to the admin API with.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use super::{Answer, CtlError};
use crate::runtime::{OperationRecord, Outcome};

/// Request bodies longer than this are sent zstd-compressed.
const COMPRESS_OVER: usize = 64 * 1024;

/// How long a call may take to be answered.
const ANSWER_WITHIN: Duration = Duration::from_secs(120);

pub(super) struct Client {
    pub(super) base: String,
    pub(super) token: Option<String>,
    /// For an `https://` admin URL (`--cacert`, `--cert`, `--key`).
    pub(super) tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Client {
    pub(super) async fn get(&self, path: &str) -> Result<Answer, CtlError> {
        self.send(Method::GET, path, None, ANSWER_WITHIN).await
    }

    pub(super) async fn post(&self, path: &str, body: Value) -> Result<Answer, CtlError> {
        self.send(Method::POST, path, Some(body), ANSWER_WITHIN)
            .await
    }

    /// A call that may take `within` to be answered (a shadowed
    /// activation's stage).
    pub(super) async fn post_within(
        &self,
        path: &str,
        body: Value,
        within: Duration,
    ) -> Result<Answer, CtlError> {
        self.send(Method::POST, path, Some(body), within.max(ANSWER_WITHIN))
            .await
    }

    /// Polls an operation until it is no longer running (an upgrade).
    pub(super) async fn follow(&self, id: &str) -> Result<Answer, CtlError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            // The admin socket passes to the new process mid-way: a poll
            // may briefly fail while it does.
            if let Ok(answer) = self.get(&format!("/admin/runtime/operations/{id}")).await {
                let settled = answer
                    .read::<OperationRecord>()
                    .is_some_and(|op| op.outcome != Outcome::Running);
                if answer.status.is_success() && settled {
                    return Ok(answer);
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(CtlError::Unreachable(
                    self.base.clone(),
                    format!("operation {id} did not finish in time"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        within: Duration,
    ) -> Result<Answer, CtlError> {
        let url = format!("{}{}", self.base, path);
        let uri: Uri = url.parse().map_err(|_| CtlError::Url(self.base.clone()))?;
        let authority = uri
            .authority()
            .ok_or_else(|| CtlError::Url(self.base.clone()))?
            .clone();
        let tls = match (uri.scheme_str(), &self.tls) {
            (Some("http"), _) => None,
            (Some("https"), Some(tls)) => Some(tls),
            _ => {
                return Err(CtlError::Url(format!(
                    "{} (http:// or https://)",
                    self.base
                )))
            }
        };
        let port = authority
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        let unreachable =
            |e: &dyn std::fmt::Display| CtlError::Unreachable(self.base.clone(), e.to_string());
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect((authority.host().trim_matches(['[', ']']), port)),
        )
        .await
        .map_err(|e| unreachable(&e))?
        .map_err(|e| unreachable(&e))?;
        let _ = stream.set_nodelay(true);
        let mut sender = match tls {
            None => {
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| unreachable(&e))?;
                tokio::spawn(conn);
                sender
            }
            Some(tls) => {
                let host = authority.host().trim_matches(['[', ']']).to_owned();
                let name =
                    rustls::pki_types::ServerName::try_from(host).map_err(|e| unreachable(&e))?;
                let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::clone(tls))
                    .connect(name, stream)
                    .await
                    .map_err(|e| unreachable(&e))?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| unreachable(&e))?;
                tokio::spawn(conn);
                sender
            }
        };
        let mut request = Request::builder()
            .method(method)
            .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(header::HOST, authority.as_str());
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let payload = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                let text = body.to_string();
                // A large configuration goes compressed: the admin API
                // reads it within `admin.max_body` once decompressed.
                match (text.len() > COMPRESS_OVER)
                    .then(|| zstd::encode_all(text.as_bytes(), 3).ok())
                    .flatten()
                {
                    Some(compressed) => {
                        request = request.header(header::CONTENT_ENCODING, "zstd");
                        Bytes::from(compressed)
                    }
                    None => Bytes::from(text),
                }
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|e| unreachable(&e))?;
        let response = tokio::time::timeout(within, sender.send_request(request))
            .await
            .map_err(|e| unreachable(&e))?
            .map_err(|e| unreachable(&e))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!({ "error": "unexpected_response", "message": String::from_utf8_lossy(&bytes) }));
        Ok(Answer { status, body })
    }
}

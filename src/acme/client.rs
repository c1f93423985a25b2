//! The HTTP client ACME and OCSP requests go through: bounded in time and
//! size, so a CA that answers slowly or with megabytes of garbage costs
//! one failed attempt, never a stuck task or the memory of the process.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};

/// Longest wait for one request, answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest answer body read (a certificate chain is a few KiB).
pub const MAX_BODY: usize = 1 << 20;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// ACME's client: HTTPS only, verified against `roots`.
pub struct Bounded {
    client: Client<Https, BodyWrapper<Bytes>>,
}

impl Bounded {
    pub fn new(roots: rustls::RootCertStore) -> Result<Self, String> {
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(REQUEST_TIMEOUT));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }
}

/// Reads a whole answer within the bounds.
pub async fn read_bounded<B>(
    response: http::Response<B>,
) -> Result<(http::response::Parts, Bytes), String>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = response.into_parts();
    let collected = tokio::time::timeout(REQUEST_TIMEOUT, Limited::new(body, MAX_BODY).collect())
        .await
        .map_err(|_| format!("no whole answer within {}s", REQUEST_TIMEOUT.as_secs()))?
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                format!("an answer larger than {MAX_BODY} bytes")
            } else {
                e.to_string()
            }
        })?;
    Ok((parts, collected.to_bytes()))
}

impl HttpClient for Bounded {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let sent = self.client.request(req);
        Box::pin(async move {
            let response = tokio::time::timeout(REQUEST_TIMEOUT, sent)
                .await
                .map_err(|_| {
                    instant_acme::Error::Other(
                        format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()).into(),
                    )
                })?
                .map_err(|e| instant_acme::Error::Other(Box::new(e)))?;
            let (parts, body) = read_bounded(response)
                .await
                .map_err(|e| instant_acme::Error::Other(e.into()))?;
            Ok(BytesResponse::from(http::Response::from_parts(
                parts,
                Full::new(body),
            )))
        })
    }
}

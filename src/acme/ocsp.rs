//! OCSP responses for stapling (RFC 6960, RFC 6066 §8): a request for a
//! leaf by its issuer (SHA-1 `CertID`, as RFC 5019 responders expect),
//! POSTed to the responder the leaf names, and the answer checked before
//! it is stapled: a successful basic response, about this certificate,
//! current, with a next update in the future. Its signature is the
//! client's to verify (the staple is the responder's bytes, unchanged).

use bytes::Bytes;
use der::{Decode as _, Encode as _};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use x509_cert::Certificate;
use x509_ocsp::{
    BasicOcspResponse, CertId, CertStatus, OcspRequest, OcspResponse, OcspResponseStatus, Request,
    TbsRequest,
};

use super::client::{read_bounded, REQUEST_TIMEOUT};
use crate::tls::{OcspTarget, Staple};

/// How far a responder's clock may run ahead of ours.
const SKEW_SECS: i64 = 300;
/// A response without `nextUpdate` is asked again after this long, and
/// not stapled past it.
const WITHOUT_NEXT_UPDATE_SECS: i64 = 3600;

/// The client OCSP requests go through (plain HTTP: responses are
/// signed, and responders are `http://` by convention).
pub struct Responders {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Responders {
    fn default() -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(REQUEST_TIMEOUT));
        Self {
            client: Client::builder(TokioExecutor::new()).build(http),
        }
    }
}

fn cert_id(target: &OcspTarget) -> Result<CertId, String> {
    let leaf = Certificate::from_der(&target.leaf).map_err(|e| format!("the leaf: {e}"))?;
    let issuer = Certificate::from_der(&target.issuer).map_err(|e| format!("its issuer: {e}"))?;
    CertId::from_cert::<sha1::Sha1>(&issuer, &leaf).map_err(|e| e.to_string())
}

/// The DER of an OCSP request for `target`'s leaf.
pub fn request(target: &OcspTarget) -> Result<Vec<u8>, String> {
    let request = OcspRequest {
        tbs_request: TbsRequest {
            request_list: vec![Request::new(cert_id(target)?)],
            ..TbsRequest::default()
        },
        optional_signature: None,
    };
    request.to_der().map_err(|e| e.to_string())
}

fn unix(time: &x509_ocsp::OcspGeneralizedTime) -> i64 {
    i64::try_from(time.0.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
}

/// Checks a responder's answer for `target` at `now` (Unix seconds) and
/// makes it a staple.
pub fn staple(der: &[u8], target: &OcspTarget, now: i64) -> Result<Staple, String> {
    let response = OcspResponse::from_der(der).map_err(|e| format!("not an OCSP response: {e}"))?;
    if response.response_status != OcspResponseStatus::Successful {
        return Err(format!(
            "the responder answered {:?}",
            response.response_status
        ));
    }
    let bytes = response
        .response_bytes
        .ok_or("a successful response without a body")?;
    let basic = BasicOcspResponse::from_der(bytes.response.as_bytes())
        .map_err(|e| format!("not a basic OCSP response: {e}"))?;
    let id = cert_id(target)?;
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .find(|r| r.cert_id == id)
        .ok_or("the response is about another certificate")?;
    let this_update = unix(&single.this_update);
    let next_update = single
        .next_update
        .as_ref()
        .map_or(this_update + WITHOUT_NEXT_UPDATE_SECS, unix);
    if this_update > now + SKEW_SECS {
        return Err(format!(
            "the response starts {}s in the future (clock skew?)",
            this_update - now
        ));
    }
    if next_update <= now {
        return Err("the response is out of date".to_owned());
    }
    let status = match single.cert_status {
        CertStatus::Good(_) => "good",
        CertStatus::Revoked(_) => "revoked",
        CertStatus::Unknown(_) => "unknown",
    };
    Ok(Staple {
        der: der.into(),
        this_update,
        next_update,
        fetched: now,
        status,
    })
}

impl Responders {
    /// Asks `target`'s responder and checks its answer.
    pub async fn fetch(&self, target: &OcspTarget) -> Result<Staple, String> {
        let body = request(target)?;
        let request = http::Request::post(&target.url)
            .header(http::header::CONTENT_TYPE, "application/ocsp-request")
            .header(http::header::ACCEPT, "application/ocsp-response")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("{}: {e}", target.url))?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| {
                format!(
                    "{}: no answer within {}s",
                    target.url,
                    REQUEST_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| format!("{}: {e}", target.url))?;
        let (parts, body) = read_bounded(response)
            .await
            .map_err(|e| format!("{}: {e}", target.url))?;
        if !parts.status.is_success() {
            return Err(format!("{}: answered {}", target.url, parts.status));
        }
        staple(&body, target, super::store::unix_now()).map_err(|e| format!("{}: {e}", target.url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> OcspTarget {
        let loaded = crate::tls::slot_tests::loaded("a.example", Some("http://127.0.0.1:9/"));
        crate::tls::CertSlot::fixed(loaded)
            .ocsp_target()
            .expect("the leaf names a responder")
    }

    #[test]
    fn a_request_asks_about_the_leaf_by_its_issuer_and_serial() {
        let target = target();
        let der = request(&target).unwrap();
        let parsed = OcspRequest::from_der(&der).unwrap();
        assert_eq!(parsed.tbs_request.request_list.len(), 1);
        let id = &parsed.tbs_request.request_list[0].req_cert;
        let leaf = Certificate::from_der(&target.leaf).unwrap();
        assert_eq!(id.serial_number, leaf.tbs_certificate.serial_number);
        assert_eq!(
            id.issuer_name_hash.as_bytes().len(),
            20,
            "SHA-1, as RFC 5019 responders expect"
        );
    }

    #[test]
    fn what_is_not_a_successful_response_is_never_a_staple() {
        let target = target();
        assert!(staple(b"garbage", &target, 0)
            .unwrap_err()
            .contains("not an OCSP response"));
        // tryLater, with no body.
        let try_later = OcspResponse::try_later().to_der().unwrap();
        assert!(staple(&try_later, &target, 0)
            .unwrap_err()
            .contains("TryLater"));
    }
}

//! Automatic certificates (DESIGN §21): ordering from an ACME CA, the
//! files they are kept in, and OCSP responses for stapling.
//!
//! What it does is one order at a time, asked for by the certificate
//! keeper on the control runtime (`src/keeper/`, which imports this
//! module and is never imported by it), which decides
//! when (issuance, renewal, back-off) and installs the result through the
//! certificate path. Nothing here runs on a serving thread, and nothing
//! here knows generations.

mod client;
pub mod ocsp;
mod order;
mod shared;
mod store;

pub use order::{alpn_certificate, issue, Failure, Issued};
pub use shared::{Answer, OrderLock, Shared, SharedCert};
pub use store::{lock_domains, stored, unix_now, write_issued, CertificateFiles};

/// The SHA-256 of a key authorization, which a tls-alpn-01 certificate
/// carries.
pub fn authorization_digest(key_authorization: &str) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(key_authorization.as_bytes()).to_vec()
}

/// An EAB HMAC key file's contents, decoded (base64url, with or without
/// padding, surrounding whitespace ignored).
pub fn eab_key(bytes: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let text = std::str::from_utf8(bytes).ok()?.trim();
    let text = text.trim_end_matches('=');
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()?;
    (!key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eab_key_is_base64url_with_or_without_padding() {
        assert_eq!(eab_key(b" AQID\n"), Some(vec![1, 2, 3]));
        assert_eq!(eab_key(b"-_8="), Some(vec![0xfb, 0xff]));
        assert_eq!(eab_key(b"not base64!"), None);
        assert_eq!(eab_key(b"\n"), None);
    }
}

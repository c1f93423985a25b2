//! JWT bearer tokens (DESIGN §19): signatures by the keys of a JWKS (a
//! file, or a URL fetched off the serving threads) or an HMAC key file,
//! `exp`/`nbf`/`iss`/`aud` checked, claims passed on as headers.
//!
//! A key is used only with the algorithms of its own type (an RSA key
//! never verifies an HMAC signature: no algorithm confusion), only with
//! the algorithms the route lists, and never from a JWKS for HMAC
//! (symmetric keys are secrets; a JWKS is published).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwapOption;
use http::{HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::remember::Remembered;
use super::secret::SecretFile;
use super::{Denial, Identity, Verdict};

/// Longest token taken; a longer one is refused unread.
pub const MAX_TOKEN: usize = 8 * 1024;
/// Largest JWKS answer read from a URL.
pub const MAX_JWKS: usize = 1024 * 1024;
/// Time for a JWKS fetch, connection included.
pub const JWKS_TIMEOUT: Duration = Duration::from_secs(5);
/// An unknown `kid` fetches the JWKS again at most this often.
pub const UNKNOWN_KID_REFRESH: Duration = Duration::from_secs(30);

/// `auth = { jwt = { … } }`.
#[derive(Debug)]
pub struct Jwt {
    pub issuer: Option<String>,
    pub audiences: Vec<String>,
    pub keys: Keys,
    pub algorithms: Vec<Algorithm>,
    pub leeway: Duration,
    pub from: TokenSource,
    /// Claim → request header.
    pub claims_to_headers: Vec<(String, HeaderName)>,
    /// Leave the token in the request (default); `false` removes it.
    pub forward_token: bool,
    challenge: HeaderValue,
    /// Tokens verified lately, with the keys that verified them.
    remembered: Remembered<Remembers>,
}

type Remembers = (Arc<KeySet>, Identity);

/// Where the keys come from.
#[derive(Debug)]
pub enum Keys {
    File(SecretFile<KeySet>),
    Url(Arc<Remote>),
    /// One anonymous HMAC key.
    Hmac(SecretFile<KeySet>),
}

/// Where the token is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `header:NAME`; for `authorization`, after `Bearer `.
    Header(HeaderName),
    Query(String),
    Cookie(String),
}

impl TokenSource {
    pub fn parse(text: &str) -> Option<Self> {
        let (kind, name) = text.split_once(':')?;
        if name.is_empty() {
            return None;
        }
        match kind {
            "header" => HeaderName::from_bytes(name.as_bytes())
                .ok()
                .map(TokenSource::Header),
            "query" => Some(TokenSource::Query(name.to_owned())),
            "cookie" => Some(TokenSource::Cookie(name.to_owned())),
            _ => None,
        }
    }

    fn token<'a>(&self, headers: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
        match self {
            TokenSource::Header(name) => {
                let value = headers.get(name)?.to_str().ok()?;
                if name == http::header::AUTHORIZATION {
                    let (scheme, token) = value.split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
                } else {
                    Some(value.trim())
                }
            }
            TokenSource::Query(name) => query?
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| k == name)
                .map(|(_, v)| v),
            TokenSource::Cookie(name) => headers
                .get_all(http::header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .filter_map(|c| c.trim().split_once('='))
                .find(|(k, _)| k == name)
                .map(|(_, v)| v),
        }
        .filter(|t| !t.is_empty())
    }
}

/// Public keys by `kid`; keys without one are tried in turn.
#[derive(Default)]
pub struct KeySet {
    by_kid: HashMap<String, Vec<Key>>,
    anonymous: Vec<Key>,
}

struct Key {
    decoding: DecodingKey,
    kind: KeyKind,
    /// The key's own `alg`, when the JWKS names one.
    alg: Option<Algorithm>,
}

/// What a key can verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
    Hmac,
}

impl KeyKind {
    fn verifies(self, alg: Algorithm) -> bool {
        use Algorithm::*;
        matches!(
            (self, alg),
            (KeyKind::Rsa, RS256 | RS384 | RS512 | PS256 | PS384 | PS512)
                | (KeyKind::P256, ES256)
                | (KeyKind::P384, ES384)
                | (KeyKind::Ed25519, EdDSA)
                | (KeyKind::Hmac, HS256 | HS384 | HS512)
        )
    }
}

impl KeySet {
    fn keys_for(&self, kid: Option<&str>) -> Option<&[Key]> {
        match kid {
            Some(kid) => self.by_kid.get(kid).map(Vec::as_slice),
            None => Some(&self.anonymous),
        }
    }
}

/// Parses a JWKS document. Symmetric (`oct`) keys are refused; keys of a
/// type `ring` cannot verify (P-521, X25519, encryption keys) are skipped.
pub fn parse_jwks(bytes: &[u8]) -> Result<KeySet, String> {
    let set: JwkSet =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS (JSON Web Key Set): {e}"))?;
    let mut keys = KeySet::default();
    let mut usable = 0;
    for (n, jwk) in set.keys.iter().enumerate() {
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => KeyKind::Rsa,
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => KeyKind::P256,
                EllipticCurve::P384 => KeyKind::P384,
                _ => continue,
            },
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                KeyKind::Ed25519
            }
            AlgorithmParameters::OctetKeyPair(_) => continue,
            AlgorithmParameters::OctetKey(_) => {
                return Err(format!(
                    "key {n} is symmetric (kty \"oct\"): a JWKS is public; HMAC keys go in hmac_key_file"
                ))
            }
        };
        if matches!(
            jwk.common.public_key_use,
            Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
        ) {
            continue;
        }
        let alg = match jwk.common.key_algorithm {
            None => None,
            Some(a) => match a.to_string().parse::<Algorithm>() {
                Ok(alg) => Some(alg),
                Err(_) => continue,
            },
        };
        let decoding = match &jwk.algorithm {
            AlgorithmParameters::EllipticCurve(ec) => {
                let size = if kind == KeyKind::P256 { 32 } else { 48 };
                let x = coordinate(&ec.x, size).map_err(|e| format!("key {n}: x {e}"))?;
                let y = coordinate(&ec.y, size).map_err(|e| format!("key {n}: y {e}"))?;
                DecodingKey::from_ec_components(&x, &y)
            }
            _ => DecodingKey::from_jwk(jwk),
        }
        .map_err(|e| format!("key {n}: {e}"))?;
        let key = Key {
            decoding,
            kind,
            alg,
        };
        usable += 1;
        match &jwk.common.key_id {
            Some(kid) => keys.by_kid.entry(kid.clone()).or_default().push(key),
            None => keys.anonymous.push(key),
        }
    }
    if usable == 0 {
        return Err("no key this gateway can verify with (RSA, P-256, P-384 or Ed25519)".into());
    }
    Ok(keys)
}

/// An EC coordinate (base64url) at the curve's full size, which RFC 7518
/// §6.2.1.2 requires and the point's encoding needs. A shorter one is
/// padded with leading zeros: some producers (PyJWT before 2.8, as in
/// Debian 12) drop them, one key in 128, and its tokens must not all
/// fail; a longer one is refused here rather than failing every token.
fn coordinate(text: &str, size: usize) -> Result<String, String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let bytes = URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|e| format!("is not base64url: {e}"))?;
    if bytes.len() > size {
        return Err(format!(
            "is {} bytes; the curve's coordinates are {size}",
            bytes.len()
        ));
    }
    let mut full = vec![0; size - bytes.len()];
    full.extend_from_slice(&bytes);
    Ok(URL_SAFE_NO_PAD.encode(full))
}

/// An HMAC secret, at least 32 bytes (trailing whitespace is not part
/// of it), as a key set of one key without a `kid`.
pub fn parse_hmac_key(bytes: &[u8]) -> Result<KeySet, String> {
    let key = bytes.trim_ascii_end();
    if key.len() < 32 {
        return Err(format!(
            "an HMAC key must be at least 32 bytes (this one is {})",
            key.len()
        ));
    }
    Ok(KeySet {
        by_kid: HashMap::new(),
        anonymous: vec![Key {
            decoding: DecodingKey::from_secret(key),
            kind: KeyKind::Hmac,
            alg: None,
        }],
    })
}

impl Jwt {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        issuer: Option<String>,
        audiences: Vec<String>,
        keys: Keys,
        algorithms: Vec<Algorithm>,
        leeway: Duration,
        from: TokenSource,
        claims_to_headers: Vec<(String, HeaderName)>,
        forward_token: bool,
    ) -> Self {
        Self {
            issuer,
            audiences,
            keys,
            algorithms,
            leeway,
            from,
            claims_to_headers,
            forward_token,
            challenge: HeaderValue::from_static("Bearer"),
            remembered: Remembered::new(),
        }
    }

    fn invalid(&self, error: &'static str) -> Verdict {
        let challenge = HeaderValue::from_str(&format!(
            "Bearer error=\"invalid_token\", error_description=\"{error}\""
        ))
        .unwrap_or_else(|_| self.challenge.clone());
        Verdict::Denied(Denial::Invalid(challenge))
    }

    /// The headers the route sets from a token: removed from what the
    /// client sent.
    pub fn identity_headers(&self) -> impl Iterator<Item = &HeaderName> {
        self.claims_to_headers.iter().map(|(_, h)| h)
    }

    pub async fn check(&self, headers: &HeaderMap, query: Option<&str>) -> Verdict {
        let Some(token) = self.from.token(headers, query) else {
            return Verdict::Denied(Denial::Missing(self.challenge.clone()));
        };
        if token.len() > MAX_TOKEN {
            return self.invalid("token too large");
        }
        let Ok(header) = jsonwebtoken::decode_header(token) else {
            return self.invalid("malformed token");
        };
        if !self.algorithms.contains(&header.alg) {
            return self.invalid("algorithm not accepted");
        }
        // A token verified a moment ago with the keys in effect now is
        // taken again without its signature (ES256 costs ~90 µs).
        let remembered = Remembered::<Remembers>::key(&[token.as_bytes()]);
        let current = self.current_keys();
        if let (Some(current), Some((keys, identity))) =
            (&current, self.remembered.get(&remembered))
        {
            if Arc::ptr_eq(current, &keys) {
                return Verdict::Allowed(identity);
            }
        }
        let kid = header.kid.as_deref();
        let keys = match (&self.keys, current) {
            (Keys::Url(remote), set) => {
                let mut set = set;
                let known = set.as_ref().and_then(|s| s.keys_for(kid)).is_some();
                if !known && remote.refresh_for_unknown_kid().await {
                    set = remote.keys.load_full();
                }
                match set {
                    Some(set) => set,
                    None => return Verdict::Denied(Denial::Unavailable),
                }
            }
            (_, Some(set)) => set,
            (_, None) => return Verdict::Denied(Denial::Unavailable),
        };
        // An HMAC key file is one key, whatever `kid` the token names.
        let candidates = match &self.keys {
            Keys::Hmac(_) => Some(keys.anonymous.as_slice()),
            _ => keys.keys_for(kid),
        };
        let claims = match self.verify(token, header.alg, candidates) {
            Ok(claims) => claims,
            Err(why) => return self.invalid(why),
        };
        let left = match self.check_times(&claims) {
            Ok(left) => left,
            Err(why) => return self.invalid(why),
        };
        let subject = claims
            .get("sub")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let mut identity = Identity {
            subject,
            headers: Vec::with_capacity(self.claims_to_headers.len()),
            remove_credentials: !self.forward_token,
        };
        for (claim, header) in &self.claims_to_headers {
            let value = match claims.get(claim) {
                Some(serde_json::Value::String(s)) => HeaderValue::from_str(s).ok(),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                    HeaderValue::from_str(&v.to_string()).ok()
                }
                _ => None,
            };
            if let Some(value) = value {
                identity.headers.push((header.clone(), value));
            }
        }
        self.remembered
            .put(remembered, left, (keys, identity.clone()));
        Verdict::Allowed(identity)
    }

    /// The keys requests are checked with now (none yet for a URL never
    /// fetched).
    fn current_keys(&self) -> Option<Arc<KeySet>> {
        match &self.keys {
            Keys::File(file) | Keys::Hmac(file) => Some(file.get()),
            Keys::Url(remote) => remote.keys.load_full(),
        }
    }

    /// The claims of a token whose signature one of `keys` verifies, and
    /// whose `iss` and `aud` are the route's.
    fn verify(
        &self,
        token: &str,
        alg: Algorithm,
        keys: Option<&[Key]>,
    ) -> Result<serde_json::Map<String, serde_json::Value>, &'static str> {
        let keys = keys.ok_or("unknown key id")?;
        let mut validation = Validation::new(alg);
        // Times are checked in `check_times` (exp required).
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.leeway = 0;
        let mut required = Vec::new();
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        if self.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.audiences);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        let mut last = "no key verifies the signature";
        for key in keys
            .iter()
            .filter(|k| k.kind.verifies(alg) && k.alg.is_none_or(|a| a == alg))
        {
            match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
                token,
                &key.decoding,
                &validation,
            ) {
                Ok(data) => return Ok(data.claims),
                Err(error) => {
                    use jsonwebtoken::errors::ErrorKind as K;
                    last = match error.kind() {
                        K::InvalidIssuer => return Err("wrong issuer"),
                        K::InvalidAudience => return Err("wrong audience"),
                        K::MissingRequiredClaim(_) => return Err("a required claim is missing"),
                        K::InvalidSignature => "bad signature",
                        _ => "malformed token",
                    }
                }
            }
        }
        Err(last)
    }

    /// `exp` and `nbf` against the clock with the leeway; how long the
    /// token has left.
    fn check_times(
        &self,
        claims: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Duration, &'static str> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let leeway = self.leeway.as_secs_f64();
        let exp = claims
            .get("exp")
            .and_then(serde_json::Value::as_f64)
            .ok_or("no exp claim")?;
        if exp + leeway <= now {
            return Err("token expired");
        }
        if let Some(nbf) = claims.get("nbf") {
            let nbf = nbf.as_f64().ok_or("malformed nbf claim")?;
            if nbf - leeway > now {
                return Err("token not yet valid");
            }
        }
        Ok(Duration::try_from_secs_f64(exp + leeway - now).unwrap_or(Duration::ZERO))
    }
}

/// A JWKS URL's keys, shared by every generation that names the same
/// URL, CA and refresh interval (an activation does not fetch again);
/// fetched by a task on the control runtime while a generation holds it.
pub struct Remote {
    url: http::Uri,
    ca: Option<PathBuf>,
    refresh: Duration,
    keys: ArcSwapOption<KeySet>,
    started: AtomicBool,
    /// Asks the task to fetch now.
    wake: tokio::sync::Notify,
    /// Fetches begun, counted from 1.
    begun: AtomicU64,
    /// The number of the last fetch that ended, good or bad.
    fetched: tokio::sync::watch::Sender<u64>,
    /// When an unknown `kid` last asked for a fetch.
    asked: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Remote").field(&self.url).finish()
    }
}

type RemoteKey = (String, Option<PathBuf>, Duration);

impl Remote {
    /// The shared keys of `url` (made, not fetched, when new).
    pub fn shared(url: http::Uri, ca: Option<PathBuf>, refresh: Duration) -> Arc<Remote> {
        static REMOTES: OnceLock<Mutex<HashMap<RemoteKey, Weak<Remote>>>> = OnceLock::new();
        let mut remotes = REMOTES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        remotes.retain(|_, r| r.strong_count() > 0);
        let key = (url.to_string(), ca.clone(), refresh);
        if let Some(remote) = remotes.get(&key).and_then(Weak::upgrade) {
            return remote;
        }
        let remote = Arc::new(Remote {
            url,
            ca,
            refresh,
            keys: ArcSwapOption::empty(),
            started: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            begun: AtomicU64::new(0),
            fetched: tokio::sync::watch::channel(0).0,
            asked: Mutex::new(None),
        });
        remotes.insert(key, Arc::downgrade(&remote));
        remote
    }

    /// Starts fetching on the current runtime (the control runtime, when a
    /// generation is built), once.
    pub fn start(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(refresh_loop(Arc::downgrade(self)));
    }

    /// For a `kid` the keys do not hold (or no keys yet): asks for a fetch
    /// unless one was asked within [`UNKNOWN_KID_REFRESH`] (a second
    /// without keys), and waits for the next fetch; whether one came.
    async fn refresh_for_unknown_kid(&self) -> bool {
        // Without keys (none fetched yet, or the first fetch failed) a
        // request may ask once a second: the issuer is not hammered
        // either way.
        let have_keys = self.keys.load().is_some();
        let every = if have_keys {
            UNKNOWN_KID_REFRESH
        } else {
            Duration::from_secs(1)
        };
        let wake = {
            let mut asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
            let due = asked.is_none_or(|at| at.elapsed() >= every);
            if due {
                *asked = Some(Instant::now());
            }
            due
        };
        if !wake && have_keys {
            return false;
        }
        // Only a fetch begun after this request saw the kid can know it:
        // one already under way is waited through, then the one it asks.
        // Without keys, whichever fetch ends next.
        let mut fetched = self.fetched.subscribe();
        let seen = if have_keys {
            self.begun.load(Ordering::Acquire)
        } else {
            *fetched.borrow()
        };
        if wake {
            self.wake.notify_one();
        }
        tokio::time::timeout(
            2 * JWKS_TIMEOUT + Duration::from_secs(1),
            fetched.wait_for(|ended| *ended > seen),
        )
        .await
        .is_ok_and(|r| r.is_ok())
    }

    async fn fetch(&self) -> Result<KeySet, String> {
        use http_body_util::BodyExt as _;
        let client = crate::tls::own_client::<http_body_util::Empty<bytes::Bytes>>(self.ca.clone())
            .map_err(|e| e.to_string())?;
        let request = http::Request::get(self.url.clone())
            .header(http::header::ACCEPT, "application/json")
            .body(http_body_util::Empty::new())
            .map_err(|e| e.to_string())?;
        let work = async {
            let response = client.request(request).await.map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("answered {}", response.status()));
            }
            let body = http_body_util::Limited::new(response.into_body(), MAX_JWKS)
                .collect()
                .await
                .map_err(|e| format!("the answer failed or is larger than {MAX_JWKS} bytes: {e}"))?
                .to_bytes();
            parse_jwks(&body)
        };
        tokio::time::timeout(JWKS_TIMEOUT, work)
            .await
            .map_err(|_| format!("no answer within {JWKS_TIMEOUT:?}"))?
    }
}

/// Fetches every `refresh` (sooner when asked), retrying a failure after
/// 5 s, doubling to `refresh`; the last good keys stay meanwhile. Ends
/// when no generation holds the keys.
async fn refresh_loop(remote: Weak<Remote>) {
    let mut backoff = Duration::from_secs(5);
    loop {
        let Some(live) = remote.upgrade() else {
            return;
        };
        let number = live.begun.fetch_add(1, Ordering::AcqRel) + 1;
        let wait = match live.fetch().await {
            Ok(keys) => {
                live.keys.store(Some(Arc::new(keys)));
                backoff = Duration::from_secs(5);
                live.refresh
            }
            Err(error) => {
                tracing::warn!(url = %live.url, %error, "JWKS fetch failed; the last good keys stay");
                let wait = backoff.min(live.refresh);
                backoff = (backoff * 2).min(live.refresh);
                wait
            }
        };
        live.fetched.send_replace(number);
        // Held while it waits: keys a generation let go of are fetched
        // at most once more.
        let _ = tokio::time::timeout(wait, live.wake.notified()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn hmac_jwt(leeway: Duration) -> Jwt {
        let file = SecretFile::new("k", "k".into(), SECRET, parse_hmac_key).unwrap();
        Jwt::new(
            Some("iss".into()),
            vec!["api".into()],
            Keys::Hmac(file),
            vec![Algorithm::HS256],
            leeway,
            TokenSource::Header(http::header::AUTHORIZATION),
            vec![("sub".into(), HeaderName::from_static("x-user"))],
            true,
        )
    }

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn token(claims: serde_json::Value) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap()
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        headers
    }

    async fn verdict(jwt: &Jwt, claims: serde_json::Value) -> Result<Identity, String> {
        match jwt.check(&bearer(&token(claims)), None).await {
            Verdict::Allowed(identity) => Ok(identity),
            Verdict::Denied(Denial::Invalid(challenge)) => {
                Err(challenge.to_str().unwrap_or_default().to_owned())
            }
            other => Err(format!("{other:?}")),
        }
    }

    #[tokio::test]
    async fn times_issuer_and_audience_are_checked_with_the_leeway() {
        let jwt = hmac_jwt(Duration::from_secs(30));
        let t = now();
        let ok = serde_json::json!({ "iss": "iss", "aud": "api", "sub": "u1", "exp": t + 60 });
        let identity = verdict(&jwt, ok.clone()).await.unwrap();
        assert_eq!(identity.subject.as_deref(), Some("u1"));
        assert_eq!(identity.headers[0].1, "u1");
        // Within the leeway on both sides, and past it.
        let mut within = ok.clone();
        within["exp"] = (t - 10).into();
        within["nbf"] = (t + 10).into();
        assert!(verdict(&jwt, within).await.is_ok());
        for (key, value, why) in [
            ("exp", serde_json::json!(t - 31), "token expired"),
            ("nbf", serde_json::json!(t + 31), "not yet valid"),
            ("exp", serde_json::json!("soon"), "no exp"),
            ("iss", serde_json::json!("other"), "wrong issuer"),
            ("aud", serde_json::json!(["x", "y"]), "wrong audience"),
        ] {
            let mut claims = ok.clone();
            claims[key] = value;
            let error = verdict(&jwt, claims).await.unwrap_err();
            assert!(error.contains(why), "{key}: {error}");
        }
        let mut claims = ok.clone();
        claims.as_object_mut().unwrap().remove("aud");
        assert!(verdict(&jwt, claims)
            .await
            .unwrap_err()
            .contains("required claim"));
        claims = ok;
        claims.as_object_mut().unwrap().remove("exp");
        assert!(verdict(&jwt, claims).await.unwrap_err().contains("no exp"));
    }

    #[tokio::test]
    async fn a_verified_token_is_remembered_until_the_keys_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, SECRET).unwrap();
        let file = SecretFile::new("k", path.clone(), SECRET, parse_hmac_key).unwrap();
        let mut jwt = hmac_jwt(Duration::ZERO);
        jwt.keys = Keys::Hmac(file);
        let claims =
            serde_json::json!({ "iss": "iss", "aud": "api", "sub": "u", "exp": now() + 60 });
        assert!(verdict(&jwt, claims.clone()).await.is_ok());
        assert_eq!(jwt.remembered.len(), 1);
        assert!(verdict(&jwt, claims.clone()).await.is_ok());
        assert_eq!(jwt.remembered.len(), 1, "taken from memory");
        // Another key in the file: the remembered token is checked again,
        // and fails.
        std::fs::write(&path, b"another-secret-of-at-least-32-bytes").unwrap();
        let Keys::Hmac(file) = &jwt.keys else {
            unreachable!()
        };
        assert_eq!(crate::auth::Reload::reload(file), Ok(true));
        assert!(verdict(&jwt, claims)
            .await
            .unwrap_err()
            .contains("bad signature"));
        // A refused token is never remembered.
        assert_eq!(jwt.remembered.len(), 1);
    }

    #[test]
    fn a_key_verifies_only_its_own_type() {
        use Algorithm::*;
        assert!(KeyKind::Rsa.verifies(RS256) && KeyKind::Rsa.verifies(PS512));
        assert!(!KeyKind::Rsa.verifies(HS256) && !KeyKind::Rsa.verifies(ES256));
        assert!(KeyKind::P256.verifies(ES256) && !KeyKind::P256.verifies(ES384));
        assert!(KeyKind::Ed25519.verifies(EdDSA) && !KeyKind::Hmac.verifies(RS256));
    }

    #[test]
    fn jwks_refuse_symmetric_keys_and_need_a_usable_one() {
        let oct = br#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"h"}]}"#;
        assert!(parse_jwks(oct).err().unwrap().contains("symmetric"));
        let only_p521 = br#"{"keys":[{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}]}"#;
        assert!(parse_jwks(only_p521).err().unwrap().contains("no key"));
        assert!(parse_jwks(b"{\"keys\": [")
            .err()
            .unwrap()
            .contains("not a JWKS"));
        assert!(parse_hmac_key(b"short\n")
            .err()
            .unwrap()
            .contains("at least 32"));
    }

    /// A P-256 key whose x starts with a zero byte, published the way
    /// PyJWT 2.6 does (the zero dropped: 31 bytes), verifies its tokens;
    /// a coordinate longer than the curve's is refused with the key.
    #[test]
    fn ec_coordinates_short_of_the_curve_size_are_padded_and_long_ones_refused() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine as _;
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        // One key in 256 has x below 2^248; 10 000 tries miss one with
        // a chance of about e^-39.
        let (pkcs8, public) = (0..10_000)
            .find_map(|_| {
                let pkcs8 =
                    EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).ok()?;
                let pair = EcdsaKeyPair::from_pkcs8(
                    &ECDSA_P256_SHA256_FIXED_SIGNING,
                    pkcs8.as_ref(),
                    &rng,
                )
                .ok()?;
                let public = pair.public_key().as_ref().to_vec();
                (public[1] == 0).then_some((pkcs8, public))
            })
            .expect("a key with a leading zero in x");
        let (x, y) = (&public[2..33], &public[33..65]);
        assert_eq!(x.len(), 31);
        let jwks = format!(
            r#"{{"keys":[{{"kty":"EC","crv":"P-256","kid":"ec","x":"{}","y":"{}"}}]}}"#,
            URL_SAFE_NO_PAD.encode(x),
            URL_SAFE_NO_PAD.encode(y)
        );
        let keys = parse_jwks(jwks.as_bytes()).unwrap();
        let key = &keys.keys_for(Some("ec")).unwrap()[0];
        let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
        header.kid = Some("ec".into());
        let token = jsonwebtoken::encode(
            &header,
            &serde_json::json!({"sub": "bob", "exp": now() + 60}),
            &jsonwebtoken::EncodingKey::from_ec_der(pkcs8.as_ref()),
        )
        .unwrap();
        let decoded = jsonwebtoken::decode::<serde_json::Value>(
            &token,
            &key.decoding,
            &Validation::new(Algorithm::ES256),
        )
        .unwrap();
        assert_eq!(decoded.claims["sub"], "bob");

        let long = URL_SAFE_NO_PAD.encode([1u8; 33]);
        let jwks =
            format!(r#"{{"keys":[{{"kty":"EC","crv":"P-256","x":"{long}","y":"{long}"}}]}}"#);
        let error = parse_jwks(jwks.as_bytes()).err().unwrap();
        assert!(error.contains("key 0: x is 33 bytes"), "{error}");
    }

    #[test]
    fn tokens_are_read_where_from_says() {
        let mut headers = HeaderMap::new();
        headers.insert("cookie", HeaderValue::from_static("a=1; session=tok; b=2"));
        headers.insert("x-token", HeaderValue::from_static(" raw "));
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Basic abc"),
        );
        let from = |s: &str| TokenSource::parse(s).unwrap();
        assert_eq!(from("cookie:session").token(&headers, None), Some("tok"));
        assert_eq!(from("header:x-token").token(&headers, None), Some("raw"));
        assert_eq!(from("header:authorization").token(&headers, None), None);
        assert_eq!(
            from("query:access_token").token(&headers, Some("x=1&access_token=q")),
            Some("q")
        );
        assert_eq!(
            from("query:access_token").token(&headers, Some("x=1")),
            None
        );
        for bad in ["body:x", "header:", "cookie", "header:bad name"] {
            assert!(TokenSource::parse(bad).is_none(), "{bad}");
        }
    }
}

//! HTTP Basic authentication against an htpasswd file of bcrypt or
//! argon2id hashes (DESIGN §19).
//!
//! A hash costs tens of milliseconds by design, so verification runs on
//! the blocking pool, at most one per core at a time, and a success is
//! remembered for [`REMEMBERED`] keyed by a salted hash of the user, the
//! stored hash and the password (never the password itself); a changed
//! hash in the file changes the key, so a rotated password is asked again.
//! A user the file does not name costs a verification all the same, so
//! timing does not tell which users exist.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::remember::{Remembered, REMEMBERED};
use super::secret::SecretFile;
use super::{Denial, Identity, Verdict};
use base64::Engine as _;
use http::{HeaderMap, HeaderValue};

/// Requests waiting for a verification beyond which the gateway answers
/// 503 rather than queueing more hashing.
const MAX_WAITING: usize = 1024;

/// `auth = { basic = { users_file, realm, forward_credentials } }`.
#[derive(Debug)]
pub struct Basic {
    pub users: SecretFile<Users>,
    pub realm: String,
    /// Whether the backend is sent the client's `Authorization` (the
    /// password) once it was checked.
    pub forward_credentials: bool,
    challenge: HeaderValue,
    remembered: Remembered<()>,
}

/// An htpasswd file: user → hash.
pub struct Users {
    by_name: HashMap<String, Hash>,
    /// Checked when the user is unknown (same algorithm and cost as the
    /// file's first line), so that an unknown user costs a known one's
    /// time.
    decoy: Option<Hash>,
}

#[derive(Clone)]
enum Hash {
    Bcrypt(String),
    Argon2id(String),
}

impl Hash {
    fn text(&self) -> &str {
        match self {
            Hash::Bcrypt(h) | Hash::Argon2id(h) => h,
        }
    }

    fn verify(&self, password: &[u8]) -> bool {
        match self {
            Hash::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            Hash::Argon2id(hash) => {
                use argon2::PasswordVerifier as _;
                argon2::PasswordHash::new(hash).is_ok_and(|parsed| {
                    argon2::Argon2::default()
                        .verify_password(password, &parsed)
                        .is_ok()
                })
            }
        }
    }
}

/// Parses an htpasswd file: `user:hash` lines, `#` comments and blank
/// lines. Only bcrypt (`$2a$`, `$2b$`, `$2y$`) and argon2id hashes are
/// taken; MD5-crypt, SHA-1, crypt(3) and plain text are refused with
/// their line (and never their text).
pub fn parse_users(bytes: &[u8]) -> Result<Users, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    let mut by_name = HashMap::new();
    let mut decoy = None;
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            return Err(format!("line {n}: not 'user:hash'"));
        };
        if user.is_empty() {
            return Err(format!("line {n}: no user name"));
        }
        let hash = hash_of(hash).map_err(|why| format!("line {n}: {why}"))?;
        decoy.get_or_insert_with(|| hash.clone());
        if by_name.insert(user.to_owned(), hash).is_some() {
            return Err(format!("line {n}: user '{user}' is named twice"));
        }
    }
    Ok(Users { by_name, decoy })
}

fn hash_of(text: &str) -> Result<Hash, &'static str> {
    if ["$2a$", "$2b$", "$2y$"].iter().any(|p| text.starts_with(p)) {
        text.parse::<bcrypt::HashParts>()
            .map_err(|_| "a malformed bcrypt hash")?;
        return Ok(Hash::Bcrypt(text.to_owned()));
    }
    if text.starts_with("$argon2id$") {
        argon2::PasswordHash::new(text).map_err(|_| "a malformed argon2id hash")?;
        return Ok(Hash::Argon2id(text.to_owned()));
    }
    Err(if text.starts_with("$apr1$") || text.starts_with("$1$") {
        "an MD5-crypt hash is refused; use bcrypt (htpasswd -B) or argon2id"
    } else if text.starts_with("{SHA}") {
        "a SHA-1 hash is refused; use bcrypt (htpasswd -B) or argon2id"
    } else if text.starts_with("$argon2") {
        "only argon2id is taken of the argon2 variants"
    } else if text.starts_with('$') {
        "this hash scheme is refused; use bcrypt (htpasswd -B) or argon2id"
    } else {
        "a plain-text or crypt(3) password is refused; use bcrypt (htpasswd -B) or argon2id"
    })
}

impl Basic {
    pub fn new(
        users: SecretFile<Users>,
        realm: String,
        forward_credentials: bool,
    ) -> Result<Self, String> {
        let challenge =
            HeaderValue::from_str(&format!("Basic realm=\"{realm}\", charset=\"UTF-8\""))
                .map_err(|_| "the realm must be printable text".to_owned())?;
        Ok(Self {
            users,
            realm,
            forward_credentials,
            challenge,
            remembered: Remembered::new(),
        })
    }

    fn deny(&self, denial: fn(HeaderValue) -> Denial) -> Verdict {
        Verdict::Denied(denial(self.challenge.clone()))
    }

    pub async fn check(&self, headers: &HeaderMap) -> Verdict {
        let (user, password) = match credentials(headers) {
            Credentials::None => return self.deny(Denial::Missing),
            Credentials::Malformed => return self.deny(Denial::Invalid),
            Credentials::Given(user, password) => (user, password),
        };
        let users = self.users.get();
        let known = users.by_name.get(&user);
        let Some(hash) = known.or(users.decoy.as_ref()).cloned() else {
            return self.deny(Denial::Invalid);
        };
        let key = Remembered::<()>::key(&[user.as_bytes(), hash.text().as_bytes(), &password]);
        if known.is_some() && self.remembered.get(&key).is_some() {
            return Verdict::Allowed(self.identity(user));
        }
        let verified = match verify_off_thread(hash, password).await {
            Some(verified) => verified,
            None => return Verdict::Denied(Denial::Busy),
        };
        if !(verified && known.is_some()) {
            return self.deny(Denial::Invalid);
        }
        self.remembered.put(key, REMEMBERED, ());
        Verdict::Allowed(self.identity(user))
    }

    fn identity(&self, user: String) -> Identity {
        Identity {
            remove_credentials: !self.forward_credentials,
            ..Identity::subject(user)
        }
    }
}

enum Credentials {
    /// No `Authorization`, or another scheme's.
    None,
    Malformed,
    Given(String, Vec<u8>),
}

/// `Authorization: Basic base64(user:password)`.
fn credentials(headers: &HeaderMap) -> Credentials {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Credentials::None;
    };
    let value = value.as_bytes();
    let split = value.iter().position(|b| *b == b' ').unwrap_or(value.len());
    let (scheme, rest) = value.split_at(split);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Credentials::None;
    }
    match decode(rest) {
        Some((user, password)) => Credentials::Given(user, password),
        None => Credentials::Malformed,
    }
}

fn decode(rest: &[u8]) -> Option<(String, Vec<u8>)> {
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    let user = std::str::from_utf8(decoded.get(..colon)?).ok()?.to_owned();
    let password = decoded.get(colon + 1..)?.to_vec();
    Some((user, password))
}

/// Verifies on the blocking pool, one verification per core at a time;
/// `None` when too many requests wait already.
async fn verify_off_thread(hash: Hash, password: Vec<u8>) -> Option<bool> {
    static SLOTS: OnceLock<tokio::sync::Semaphore> = OnceLock::new();
    static WAITING: AtomicUsize = AtomicUsize::new(0);
    let slots = SLOTS.get_or_init(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    });
    if WAITING.fetch_add(1, Ordering::Relaxed) >= MAX_WAITING {
        WAITING.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    let permit = slots.acquire().await;
    WAITING.fetch_sub(1, Ordering::Relaxed);
    let _permit = permit.ok()?;
    tokio::task::spawn_blocking(move || hash.verify(&password))
        .await
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Hashes of "secret" (the integration tests use `htpasswd -B`'s).
    fn bcrypt() -> String {
        bcrypt::hash("secret", 4).unwrap()
    }

    fn argon2id() -> String {
        use argon2::PasswordHasher as _;
        argon2::Argon2::default()
            .hash_password_with_salt(b"secret", b"0123456789abcdef")
            .map(|h| h.to_string())
            .unwrap_or_default()
    }

    fn basic(users: &str) -> Basic {
        let file = SecretFile::new("users", "users".into(), users.as_bytes(), parse_users).unwrap();
        Basic::new(file, "ops".into(), true).unwrap()
    }

    fn with(user: &str, password: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {token}")).unwrap(),
        );
        headers
    }

    #[test]
    fn only_bcrypt_and_argon2id_lines_are_taken() {
        let ok =
            parse_users(format!("# ops\n\nalice:{}\nbob:{}\n", bcrypt(), argon2id()).as_bytes())
                .unwrap();
        assert_eq!(ok.by_name.len(), 2);
        for (line, why) in [
            ("carol:$apr1$abc$def", "MD5-crypt"),
            ("carol:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "SHA-1"),
            ("carol:plaintext", "plain-text"),
            (
                "carol:$argon2i$v=19$m=16,t=2,p=1$c2FsdHNhbHQ$aGFzaA",
                "argon2id",
            ),
            ("carol:$2y$04$short", "malformed bcrypt"),
            ("carol", "not 'user:hash'"),
        ] {
            let text = format!("alice:{}\n{line}\n", bcrypt());
            let error = parse_users(text.as_bytes()).err().unwrap();
            assert!(error.starts_with("line 2: "), "{error}");
            assert!(error.contains(why), "{line}: {error}");
            // The refused text itself is never repeated.
            assert!(
                !error.contains(line.split_once(':').map_or(line, |(_, h)| h)),
                "{error}"
            );
        }
        assert!(parse_users(format!("a:{}\na:{}\n", bcrypt(), bcrypt()).as_bytes()).is_err());
    }

    #[tokio::test]
    async fn the_right_password_passes_and_is_remembered_under_a_hash() {
        let basic = basic(&format!("alice:{}\nbob:{}\n", bcrypt(), argon2id()));
        assert!(matches!(
            basic.check(&HeaderMap::new()).await,
            Verdict::Denied(Denial::Missing(_))
        ));
        assert!(matches!(
            basic.check(&with("alice", "wrong")).await,
            Verdict::Denied(Denial::Invalid(_))
        ));
        assert!(matches!(
            basic.check(&with("nobody", "secret")).await,
            Verdict::Denied(Denial::Invalid(_))
        ));
        for user in ["alice", "bob"] {
            match basic.check(&with(user, "secret")).await {
                Verdict::Allowed(identity) => assert_eq!(identity.subject.as_deref(), Some(user)),
                other => panic!("{user}: {other:?}"),
            }
        }
        assert_eq!(basic.remembered.len(), 2);
        // A remembered success is keyed by a hash: a wrong password for a
        // remembered user still costs a verification and fails.
        assert!(matches!(
            basic.check(&with("alice", "secreT")).await,
            Verdict::Denied(Denial::Invalid(_))
        ));
    }

    #[test]
    fn the_challenge_names_the_realm() {
        assert_eq!(
            basic(&format!("alice:{}\n", bcrypt())).challenge,
            "Basic realm=\"ops\", charset=\"UTF-8\""
        );
    }
}

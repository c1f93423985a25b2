//! Where ACME material is kept in `runtime.state_dir`:
//!
//! ```text
//! acme/accounts/<id>.json          account key and URL (0600)
//! acme/certs/<domain>-<id>/cert.pem  the chain the CA issued
//! acme/certs/<domain>-<id>/key.pem   its private key (0600)
//! ```
//!
//! `<id>` is a digest of what makes the thing distinct (the directory, and
//! the domains or the account's contact and binding), so a configuration
//! that changes other keys finds what it stored before. Files are written
//! to a temporary name, synced and renamed: a crash leaves the old pair or
//! the new one, never half of each.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

use sha2::{Digest as _, Sha256};

use crate::tls::{AcmeSpec, LoadedCert};

fn short_digest(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The files of one certificate.
#[derive(Debug, Clone)]
pub struct CertificateFiles {
    pub dir: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertificateFiles {
    /// The certificate's name among others: its folder's (the fleet
    /// keys it so too).
    pub fn id(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub fn of(spec: &AcmeSpec) -> Self {
        let mut parts = vec![spec.directory.as_str()];
        parts.extend(spec.domains.iter().map(String::as_str));
        let first = spec.domains.first().map_or("certificate", String::as_str);
        let dir = spec
            .state_dir
            .join("acme")
            .join("certs")
            .join(format!("{first}-{}", short_digest(&parts)));
        Self {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            dir,
        }
    }
}

/// The account file for `spec`'s directory, contact and binding.
pub fn account_file(spec: &AcmeSpec) -> PathBuf {
    let kid = spec.eab.as_ref().map_or("", |e| e.kid.as_str());
    let id = short_digest(&[
        spec.directory.as_str(),
        spec.email.as_deref().unwrap_or(""),
        kid,
    ]);
    spec.state_dir
        .join("acme")
        .join("accounts")
        .join(format!("{id}.json"))
}

/// The certificate stored for `spec`, when it is there, reads, covers
/// every domain and has not expired. Anything else is `None`: the keeper
/// orders then.
pub fn stored(spec: &AcmeSpec) -> Option<LoadedCert> {
    let files = CertificateFiles::of(spec);
    let loaded = match crate::tls::load_cert(&files.cert, &files.key) {
        Ok(loaded) => loaded,
        Err(error) => {
            if files.cert.exists() {
                tracing::warn!(%error, "a stored ACME certificate does not load; it will be ordered again");
            }
            return None;
        }
    };
    let now = unix_now();
    let covers = spec
        .domains
        .iter()
        .all(|d| loaded.info.names.iter().any(|n| n == d));
    (covers && loaded.info.not_after_unix > now).then_some(loaded)
}

/// Writes `contents` to `path` with `mode`, through a synced temporary
/// file renamed over it.
pub(super) fn write_private(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent folder"))?;
    std::fs::create_dir_all(dir)?;
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Keeps an issued chain and its key (0600), key first: a chain on disk
/// always has its key.
pub fn write_issued(spec: &AcmeSpec, chain_pem: &str, key_pem: &str) -> std::io::Result<()> {
    let files = CertificateFiles::of(spec);
    write_private(&files.key, key_pem.as_bytes(), 0o600)?;
    write_private(&files.cert, chain_pem.as_bytes(), 0o644)
}

type Locks = Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>;

/// One order at a time per certificate in this process: two slots for
/// the same domains (a configuration that changed only `renew_before`,
/// say) never order twice; the second finds what the first stored.
pub fn lock_domains(spec: &AcmeSpec) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Locks> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    locks.retain(|_, lock| Arc::strong_count(lock) > 1);
    Arc::clone(locks.entry(CertificateFiles::of(spec).dir).or_default())
}

/// Now, in Unix seconds.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

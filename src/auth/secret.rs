//! Secret files (DESIGN §19): htpasswd files, JWKS and HMAC keys.
//!
//! A secret file is read by validation (so its bytes are hashed into
//! `config_version` like a certificate's), parsed into what the request
//! path checks against, and read again by `reload-certs`. A file that no
//! longer reads or parses then keeps its last good contents, and the
//! reload reports it. Contents never leave this type: errors name the
//! file and a line, `Debug` names the file. A file that several routes
//! (or a listener default and a route) name is one `SecretFile`, cloned:
//! parsed once, reloaded once.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

/// Parses a secret file's bytes; the error names a line, never a value.
pub type Parse<T> = fn(&[u8]) -> Result<T, String>;

/// One secret file; clones share it.
pub struct SecretFile<T>(Arc<Shared<T>>);

struct Shared<T> {
    /// As the configuration names it (relative names stay relative).
    shown: String,
    /// Resolved against the configuration's folder.
    path: PathBuf,
    parse: Parse<T>,
    current: ArcSwap<Loaded<T>>,
}

struct Loaded<T> {
    value: Arc<T>,
    digest: [u8; 32],
}

impl<T> Clone for SecretFile<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> std::fmt::Debug for SecretFile<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SecretFile").field(&self.0.shown).finish()
    }
}

impl<T: Send + Sync + 'static> SecretFile<T> {
    /// From the bytes validation read.
    pub fn new(shown: &str, path: PathBuf, bytes: &[u8], parse: Parse<T>) -> Result<Self, String> {
        let value = parse(bytes)?;
        Ok(Self(Arc::new(Shared {
            shown: shown.to_owned(),
            path,
            parse,
            current: ArcSwap::from_pointee(Loaded {
                value: Arc::new(value),
                digest: Sha256::digest(bytes).into(),
            }),
        })))
    }

    /// What requests check against now.
    pub fn get(&self) -> Arc<T> {
        Arc::clone(&self.0.current.load().value)
    }
}

/// A secret file as `reload-certs` sees it, whatever it holds.
pub trait Reload: Send + Sync {
    /// The file as the configuration names it.
    fn file(&self) -> &str;
    /// Reads and parses the file again: whether its bytes changed, or why
    /// it could not be taken (the last good contents stay).
    fn reload(&self) -> Result<bool, String>;
    /// The same for every clone of one file: a reload lists it once.
    fn identity(&self) -> usize;
}

impl<T: Send + Sync + 'static> Reload for SecretFile<T> {
    fn file(&self) -> &str {
        &self.0.shown
    }

    fn reload(&self) -> Result<bool, String> {
        let this = &self.0;
        let bytes = crate::files::read_regular(&this.path, crate::files::MAX_REFERENCED_FILE)
            .map_err(|e| format!("cannot read '{}': {e}", this.path.display()))?;
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        if digest == this.current.load().digest {
            return Ok(false);
        }
        let value = (this.parse)(&bytes).map_err(|e| format!("'{}': {e}", this.shown))?;
        this.current.store(Arc::new(Loaded {
            value: Arc::new(value),
            digest,
        }));
        Ok(true)
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.0).cast::<()>() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(bytes: &[u8]) -> Result<usize, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
        if text.contains("bad") {
            return Err("line 1: refused".into());
        }
        Ok(text.lines().count())
    }

    #[test]
    fn a_reload_takes_good_contents_and_keeps_the_last_good_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "a\n").unwrap();
        let file = SecretFile::new("s", path.clone(), b"a\n", lines).unwrap();
        assert_eq!(*file.get(), 1);
        assert_eq!(file.reload(), Ok(false));
        std::fs::write(&path, "a\nb\n").unwrap();
        assert_eq!(file.reload(), Ok(true));
        assert_eq!(*file.get(), 2);
        std::fs::write(&path, "bad\n").unwrap();
        assert!(file.reload().unwrap_err().contains("line 1"));
        std::fs::remove_file(&path).unwrap();
        assert!(file.reload().unwrap_err().contains("cannot read"));
        assert_eq!(*file.get(), 2);
        assert_eq!(format!("{file:?}"), "SecretFile(\"s\")");
    }
}

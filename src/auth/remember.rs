//! Successes remembered for a short time, so that a client repeating the
//! same credentials does not pay for a password hash or a signature on
//! every request. Keyed by a salted SHA-256 of what identifies the
//! credentials (never the credentials themselves), bounded in entries,
//! each until the earlier of its own deadline and [`REMEMBERED`].

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Longest a success is remembered.
pub const REMEMBERED: Duration = Duration::from_secs(60);
/// Most successes remembered per route.
pub const REMEMBERED_MAX: usize = 4096;

pub struct Remembered<V> {
    entries: Mutex<HashMap<[u8; 32], (Instant, V)>>,
}

impl<V> std::fmt::Debug for Remembered<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.entries.lock().map_or(0, |e| e.len());
        f.debug_struct("Remembered")
            .field("entries", &entries)
            .finish()
    }
}

impl<V: Clone> Remembered<V> {
    pub fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The key of `parts` (each length-prefixed): sha256(process salt ‖
    /// parts).
    pub fn key(parts: &[&[u8]]) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(salt());
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        hasher.finalize().into()
    }

    pub fn get(&self, key: &[u8; 32]) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(key)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, value)| value.clone())
    }

    /// Remembers `value` for `ttl`, at most [`REMEMBERED`].
    pub fn put(&self, key: [u8; 32], ttl: Duration, value: V) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= REMEMBERED_MAX {
            entries.retain(|_, (until, _)| *until > now);
            if entries.len() >= REMEMBERED_MAX {
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl.min(REMEMBERED), value));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl<V: Clone> Default for Remembered<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// Random for the process: the keys mean nothing outside it.
fn salt() -> &'static [u8; 32] {
    static SALT: OnceLock<[u8; 32]> = OnceLock::new();
    SALT.get_or_init(|| {
        let mut salt = [0u8; 32];
        // Without the system's randomness the salt is the clock: a key
        // still never holds what it was made from.
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt).is_err() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            salt[..16].copy_from_slice(&now.as_nanos().to_le_bytes());
        }
        salt
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_stay_bounded() {
        let remembered = Remembered::new();
        let a = Remembered::<u8>::key(&[b"a", b"b"]);
        assert_ne!(
            a,
            Remembered::<u8>::key(&[b"ab"]),
            "parts are length-prefixed"
        );
        remembered.put(a, Duration::from_secs(10), 1u8);
        assert_eq!(remembered.get(&a), Some(1));
        let b = Remembered::<u8>::key(&[b"b"]);
        remembered.put(b, Duration::ZERO, 2);
        assert_eq!(remembered.get(&b), None);
        for n in 0..REMEMBERED_MAX as u32 + 10 {
            remembered.put(
                Remembered::<u8>::key(&[&n.to_be_bytes()]),
                Duration::from_secs(10),
                0,
            );
        }
        assert!(remembered.len() <= REMEMBERED_MAX);
    }
}

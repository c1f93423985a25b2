//! Successes remembered for a short time, so that a client repeating the
//! same credentials does not pay for a password hash or a signature on
//! every request. Keyed by a salted SHA-256 of what identifies the
//! credentials (never the credentials themselves), bounded in entries,
//! each until the earlier of its own deadline and the longest it may be
//! kept ([`REMEMBERED`] for Basic and JWT; forward auth's `cache.ttl`).

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
    /// At most this many entries ...
    max: usize,
    /// ... each for at most this long.
    longest: Duration,
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
    /// [`REMEMBERED_MAX`] entries, each for at most [`REMEMBERED`].
    pub fn new() -> Self {
        Self::bounded(REMEMBERED_MAX, REMEMBERED)
    }

    /// `max` entries, each for at most `longest`.
    pub fn bounded(max: usize, longest: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            max: max.max(1),
            longest,
        }
    }

    /// The key of `parts` (each length-prefixed): sha256(process salt ‖
    /// parts).
    pub fn key(parts: &[&[u8]]) -> [u8; 32] {
        Self::key_with(|put| parts.iter().for_each(|part| put(part)))
    }

    /// [`Remembered::key`] of the parts `feed` puts, one by one.
    pub fn key_with(feed: impl FnOnce(&mut dyn FnMut(&[u8]))) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(salt());
        feed(&mut |part: &[u8]| {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        });
        hasher.finalize().into()
    }

    pub fn get(&self, key: &[u8; 32]) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(key)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, value)| value.clone())
    }

    /// Remembers `value` for `ttl`, at most the longest it may be kept.
    /// Full, the expired entries go; full of live ones, all go (one
    /// sweep per `max` insertions at worst, never a scan per request).
    pub fn put(&self, key: [u8; 32], ttl: Duration, value: V) {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.max && !entries.contains_key(&key) {
            entries.retain(|_, (until, _)| *until > now);
            if entries.len() >= self.max {
                entries.clear();
            }
        }
        entries.insert(key, (now + ttl.min(self.longest), value));
    }

    /// Forgets everything; returns how many entries there were.
    pub fn clear(&self) -> usize {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let n = entries.len();
        entries.clear();
        n
    }

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

//! Route quotas: token buckets per key (`routes.quota`). A bucket holds
//! up to `burst` tokens and gains `rate` per `per`; a request takes one
//! or is answered 429 with the time until the next token.
//!
//! Memory is bounded: keys live in 16 shards of at most `max_keys / 16`
//! entries each. A shard that is full first forgets buckets that have
//! refilled (a full bucket behaves exactly like a key never seen), then,
//! if it must, the half that was idle longest. The table is shared by
//! every generation whose route keeps the same quota (see
//! `SharedState::quota`), so an activation neither refills nor resets it.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::Left;
use crate::clock::now_ms;
use crate::plan::QuotaSpec;

const SHARDS: usize = 16;

#[derive(Debug)]
pub struct QuotaTable {
    spec: QuotaSpec,
    shards: [Mutex<Shard>; SHARDS],
    hasher: std::hash::RandomState,
}

#[derive(Debug, Default)]
struct Shard {
    buckets: HashMap<Box<[u8]>, Bucket>,
    /// Counts every use, for recency: milliseconds tie within a burst.
    uses: u64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    /// When `tokens` was last brought up to date (`now_ms`).
    at_ms: u64,
    /// The shard's `uses` when the key was last seen.
    seen: u64,
}

impl QuotaTable {
    pub fn new(spec: QuotaSpec) -> Self {
        Self {
            spec,
            shards: Default::default(),
            hasher: std::hash::RandomState::new(),
        }
    }

    pub fn spec(&self) -> &QuotaSpec {
        &self.spec
    }

    /// Takes a token for `key`: what is left of its bucket, or (`Err`)
    /// how long until a token is free.
    pub fn take(&self, key: &[u8]) -> Result<Left, Duration> {
        self.take_at(key, now_ms())
    }

    fn take_at(&self, key: &[u8], now: u64) -> Result<Left, Duration> {
        let shard = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        let Some(shard) = self.shards.get(shard) else {
            return Ok(Left {
                remaining: 0,
                reset: Duration::ZERO,
            });
        };
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        shard.uses += 1;
        let seen = shard.uses;
        let burst = f64::from(self.spec.burst);
        let cap = (self.spec.max_keys as usize / SHARDS).max(1);
        if !shard.buckets.contains_key(key) && shard.buckets.len() >= cap {
            self.evict(&mut shard.buckets, now, cap);
        }
        let bucket = match shard.buckets.get_mut(key) {
            Some(bucket) => {
                bucket.tokens = self.refilled(bucket, now);
                bucket.at_ms = now;
                bucket.seen = seen;
                bucket
            }
            None => shard.buckets.entry(key.into()).or_insert(Bucket {
                tokens: burst,
                at_ms: now,
                seen,
            }),
        };
        let per_token_ms = self.spec.per.as_secs_f64() * 1000.0 / f64::from(self.spec.rate);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(Left {
                remaining: bucket.tokens as u32,
                reset: Duration::from_secs_f64((burst - bucket.tokens) * per_token_ms / 1000.0),
            });
        }
        Err(Duration::from_secs_f64(
            (1.0 - bucket.tokens) * per_token_ms / 1000.0,
        ))
    }

    fn refilled(&self, bucket: &Bucket, now: u64) -> f64 {
        let elapsed = now.saturating_sub(bucket.at_ms) as f64;
        let per_ms = self.spec.per.as_secs_f64() * 1000.0;
        (bucket.tokens + elapsed * f64::from(self.spec.rate) / per_ms)
            .min(f64::from(self.spec.burst))
    }

    /// Makes room in a full shard (see the module notes).
    fn evict(&self, buckets: &mut HashMap<Box<[u8]>, Bucket>, now: u64, cap: usize) {
        let burst = f64::from(self.spec.burst);
        buckets.retain(|_, bucket| self.refilled(bucket, now) < burst);
        if buckets.len() < cap {
            return;
        }
        let mut seen: Vec<u64> = buckets.values().map(|b| b.seen).collect();
        let middle = seen.len() / 2;
        let (_, median, _) = seen.select_nth_unstable(middle);
        let median = *median;
        buckets.retain(|_, bucket| bucket.seen > median);
    }

    /// Keys remembered now.
    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .buckets
                    .len()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::QuotaKey;

    fn table(rate: u32, burst: u32, max_keys: u32) -> QuotaTable {
        QuotaTable::new(QuotaSpec {
            rate,
            per: Duration::from_secs(1),
            burst,
            key: vec![QuotaKey::ClientIp],
            max_keys,
            fleet: None,
            advertise: false,
        })
    }

    #[test]
    fn a_burst_then_the_rate_with_the_wait_until_the_next_token() {
        let quota = table(10, 5, 100);
        // What is left: 4 now, whole again in one token's time (100 ms);
        // then 3, 200 ms; … 0, 500 ms.
        for left in (0..5u32).rev() {
            let taken = quota.take_at(b"k", 1_000).unwrap();
            assert_eq!(taken.remaining, left);
            let reset = Duration::from_millis(u64::from(5 - left) * 100);
            assert!(
                taken.reset.abs_diff(reset) < Duration::from_micros(1),
                "{taken:?}"
            );
        }
        let wait = quota.take_at(b"k", 1_000).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        // 50 ms later, half a token: 50 ms to go.
        let wait = quota.take_at(b"k", 1_050).unwrap_err();
        assert!((wait.as_secs_f64() - 0.05).abs() < 1e-6, "{wait:?}");
        assert!(quota.take_at(b"k", 1_100).is_ok());
        // Another key has its own bucket.
        assert!(quota.take_at(b"other", 1_100).is_ok());
    }

    #[test]
    fn a_burst_within_one_millisecond_keeps_its_newest_keys() {
        let quota = table(1, 1, 160);
        for key in 0u32..10_000 {
            let _ = quota.take_at(&key.to_le_bytes(), 5_000);
        }
        assert!(quota.keys() <= 160);
        // Spent and remembered: the last key of each shard at least.
        assert!(quota.take_at(&9_999u32.to_le_bytes(), 5_000).is_err());
    }

    #[test]
    fn two_hundred_thousand_keys_stay_within_the_cap() {
        let quota = table(1, 1, 10_000);
        for key in 0u32..200_000 {
            let _ = quota.take_at(&key.to_le_bytes(), 1_000 + u64::from(key / 1000));
        }
        let keys = quota.keys();
        assert!(keys <= 10_000, "{keys} keys kept");
        assert!(keys >= 2_000, "{keys}: eviction forgot too much");
        // The most recent keys are still limited.
        assert!(quota.take_at(&199_999u32.to_le_bytes(), 1_199).is_err());
    }
}

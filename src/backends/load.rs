//! A backend's load: requests in flight (across every generation that
//! names it) and a peak-EWMA estimate of its response latency, as
//! Linkerd's balancer keeps it: a slower sample replaces the estimate at
//! once, faster ones pull it down with a 10 s time constant, and an
//! estimate nobody refreshes decays towards zero, so a backend that was
//! slow once is tried again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::now_ms;

/// Estimate of a backend nothing has been measured on yet.
const DEFAULT_RTT: Duration = Duration::from_millis(30);
/// How fast the estimate forgets, in milliseconds.
const DECAY_MS: f64 = 10_000.0;

#[derive(Debug, Default)]
pub struct Load {
    inflight: AtomicU64,
    /// The estimate in nanoseconds, as `f64` bits.
    rtt_ns: AtomicU64,
    /// When it was last updated (`now_ms`), 0 before the first sample.
    updated_ms: AtomicU64,
}

impl Load {
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }

    pub(super) fn start(&self) {
        self.inflight.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn finish(&self) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Takes one latency sample (time to the response head). Concurrent
    /// samples may overwrite each other; the estimate stays a sample's.
    pub fn observe(&self, rtt: Duration) {
        let now = now_ms();
        let sample = rtt.as_nanos() as f64;
        let updated = self.updated_ms.load(Ordering::Relaxed);
        let previous = if updated == 0 {
            DEFAULT_RTT.as_nanos() as f64
        } else {
            f64::from_bits(self.rtt_ns.load(Ordering::Relaxed))
        };
        let next = if sample > previous {
            sample
        } else {
            let decay = (-(now.saturating_sub(updated) as f64) / DECAY_MS).exp();
            previous * decay + sample * (1.0 - decay)
        };
        self.rtt_ns.store(next.to_bits(), Ordering::Relaxed);
        self.updated_ms.store(now, Ordering::Relaxed);
    }

    /// The latency estimate now, in nanoseconds.
    fn estimate_at(&self, now: u64) -> f64 {
        let updated = self.updated_ms.load(Ordering::Relaxed);
        if updated == 0 {
            return DEFAULT_RTT.as_nanos() as f64;
        }
        let rtt = f64::from_bits(self.rtt_ns.load(Ordering::Relaxed));
        let idle = now.saturating_sub(updated) as f64;
        rtt * (-idle / DECAY_MS).exp()
    }

    /// The latency estimate, for the admin view; `None` before the first
    /// sample (only `p2c` upstreams time their attempts).
    pub fn ewma(&self) -> Option<Duration> {
        (self.updated_ms.load(Ordering::Relaxed) != 0)
            .then(|| Duration::from_nanos(self.estimate_at(now_ms()) as u64))
    }

    /// What p2c compares: expected latency times the queue it would join.
    pub fn cost(&self) -> f64 {
        self.estimate_at(now_ms()) * (self.inflight() + 1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_sample_wins_at_once_and_fast_ones_pull_it_down() {
        let load = Load::default();
        assert_eq!(load.ewma(), None);
        load.observe(Duration::from_millis(200));
        let peak = load.ewma().unwrap();
        assert!(peak > Duration::from_millis(190), "{peak:?}");
        for _ in 0..5 {
            load.observe(Duration::from_millis(1));
        }
        // Samples within the same few milliseconds barely move it...
        assert!(load.ewma().unwrap() > Duration::from_millis(150));
        // ... and a queue makes a backend costlier.
        let idle = load.cost();
        load.start();
        load.start();
        assert!(load.cost() > 2.5 * idle);
        load.finish();
        load.finish();
        assert_eq!(load.inflight(), 0);
    }
}

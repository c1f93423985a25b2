//! Passive outlier detection (DESIGN §12), fed by the traffic itself:
//! `consecutive_failures` gateway failures or 5xx answers in a row eject a
//! backend for `base_ejection × ejections` (capped at `max_ejection`).
//! When the ejection ends, exactly one request is let through as a probe:
//! its success trusts the backend again, its failure ejects it for
//! longer. The ejection count starts over once a backend has stayed
//! trusted for `max_ejection`.
//!
//! Whether an ejection may happen at all (at most `max_ejected_percent`
//! of an upstream's backends) is the upstream's call: a backend does not
//! know which upstreams name it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::now_ms;
use crate::plan::OutlierSpec;

/// A probe that has not reported back within this long (its client went
/// away, say) no longer holds the backend's one probe slot.
const PROBE_PATIENCE_MS: u64 = 30_000;

#[derive(Debug, Default)]
pub struct Outlier {
    consecutive: AtomicU32,
    /// End of the current ejection (`now_ms`); 0: trusted.
    ejected_until: AtomicU64,
    /// Ejections in the current series (the multiplier).
    series: AtomicU32,
    /// When the backend was last trusted again (`now_ms`).
    trusted_since: AtomicU64,
    /// When the probe in flight was let through; 0: none.
    probe_at: AtomicU64,
    ejections: AtomicU64,
}

/// What a failure leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Below the threshold, or ejected already.
    Counted,
    /// The threshold is crossed: eject, if the upstream allows it.
    Eject,
}

impl Outlier {
    /// Whether a request may go to the backend now. Cheap while trusted;
    /// after an ejection ends it admits one probe at a time.
    #[inline]
    pub fn admits(&self) -> bool {
        match self.ejected_until.load(Ordering::Acquire) {
            0 => true,
            until => self.admits_after(until),
        }
    }

    /// `admits` for a backend that is or was ejected.
    #[cold]
    fn admits_after(&self, until: u64) -> bool {
        let now = now_ms();
        if now < until {
            return false;
        }
        let probe = self.probe_at.load(Ordering::Acquire);
        if probe != 0 && now.saturating_sub(probe) < PROBE_PATIENCE_MS {
            return false;
        }
        self.probe_at
            .compare_exchange(probe, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ejected now (a probe may be due, but it has not succeeded).
    pub fn is_ejected(&self) -> bool {
        self.ejected_until.load(Ordering::Acquire) != 0
    }

    /// The end of the current ejection (`now_ms`), if any.
    pub fn ejected_until_ms(&self) -> Option<u64> {
        match self.ejected_until.load(Ordering::Acquire) {
            0 => None,
            until => Some(until),
        }
    }

    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn success(&self) {
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.consecutive.store(0, Ordering::Relaxed);
        }
        if self.ejected_until.load(Ordering::Acquire) != 0 {
            // The probe (or a request admitted just before the ejection)
            // came back fine.
            self.trusted_since.store(now_ms(), Ordering::Relaxed);
            self.probe_at.store(0, Ordering::Release);
            self.ejected_until.store(0, Ordering::Release);
            super::note_state_change();
        }
    }

    pub fn failure(&self, spec: &OutlierSpec) -> Failure {
        let failures = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        let until = self.ejected_until.load(Ordering::Acquire);
        if until != 0 {
            // A failed probe ejects again at once; failures of requests
            // admitted before the ejection change nothing.
            let probing = self.probe_at.load(Ordering::Acquire) != 0 && now_ms() >= until;
            return if probing {
                Failure::Eject
            } else {
                Failure::Counted
            };
        }
        if failures >= spec.consecutive_failures {
            Failure::Eject
        } else {
            Failure::Counted
        }
    }

    /// Ejects the backend; returns for how long.
    pub fn eject(&self, spec: &OutlierSpec) -> Duration {
        let now = now_ms();
        let trusted_for = now.saturating_sub(self.trusted_since.load(Ordering::Relaxed));
        if self.ejected_until.load(Ordering::Acquire) == 0
            && trusted_for >= spec.max_ejection.as_millis() as u64
        {
            self.series.store(0, Ordering::Relaxed);
        }
        let series = self.series.fetch_add(1, Ordering::Relaxed) + 1;
        let length = spec
            .base_ejection
            .saturating_mul(series)
            .min(spec.max_ejection);
        self.consecutive.store(0, Ordering::Relaxed);
        self.probe_at.store(0, Ordering::Release);
        self.ejected_until
            .store(now + length.as_millis() as u64, Ordering::Release);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        super::note_state_change();
        length
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(base_ms: u64) -> OutlierSpec {
        OutlierSpec {
            consecutive_failures: 3,
            base_ejection: Duration::from_millis(base_ms),
            max_ejection: Duration::from_millis(base_ms * 3),
            max_ejected_percent: 50,
        }
    }

    #[test]
    fn consecutive_failures_eject_and_a_success_resets_the_count() {
        let outlier = Outlier::default();
        let spec = spec(60_000);
        assert_eq!(outlier.failure(&spec), Failure::Counted);
        assert_eq!(outlier.failure(&spec), Failure::Counted);
        outlier.success();
        assert_eq!(outlier.failure(&spec), Failure::Counted);
        assert_eq!(outlier.failure(&spec), Failure::Counted);
        assert_eq!(outlier.failure(&spec), Failure::Eject);
        assert_eq!(outlier.eject(&spec), Duration::from_secs(60));
        assert!(!outlier.admits());
        assert!(outlier.is_ejected());
        // Late failures of requests sent before the ejection do nothing.
        assert_eq!(outlier.failure(&spec), Failure::Counted);
    }

    #[test]
    fn one_probe_after_the_ejection_decides() {
        let outlier = Outlier::default();
        let spec = spec(1);
        assert_eq!(outlier.eject(&spec), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(outlier.admits(), "the probe");
        assert!(!outlier.admits(), "only one probe at a time");
        // The probe fails: ejected again, for longer.
        assert_eq!(outlier.failure(&spec), Failure::Eject);
        assert_eq!(outlier.eject(&spec), Duration::from_millis(2));
        std::thread::sleep(Duration::from_millis(5));
        assert!(outlier.admits());
        outlier.success();
        assert!(!outlier.is_ejected());
        assert!(outlier.admits() && outlier.admits());
        assert_eq!(outlier.ejections(), 2);
    }

    #[test]
    fn ejections_grow_to_the_cap() {
        let outlier = Outlier::default();
        let spec = spec(10_000);
        let lengths: Vec<u64> = (0..5).map(|_| outlier.eject(&spec).as_secs()).collect();
        assert_eq!(lengths, [10, 20, 30, 30, 30]);
    }
}

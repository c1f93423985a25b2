//! The in-flight ledger: what is still running on one generation.
//!
//! Each generation owns one [`Ledger`]; an [`InflightGuard`] counts one
//! request (or one long-lived connection) and counts down when dropped,
//! whatever path the request took to its end. A long-lived stream keeps
//! only its guard's `Arc<Ledger>`, never the whole generation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::ids::GenerationId;
use crate::telemetry::series::{Count, Histogram};

/// Counters of work pinned to one generation, and of how its requests
/// were answered (what a guarded activation compares, and the
/// `generation="active" | "previous"` series).
#[derive(Debug)]
pub struct Ledger {
    generation: GenerationId,
    inflight_requests: AtomicU64,
    open_connections: AtomicU64,
    pub requests: Count,
    /// Answered 5xx, by the gateway or the backend.
    pub errors: Count,
    /// Refused by the route's web application firewall in blocking mode
    /// (what `guard.max_block_ratio` compares).
    pub waf_blocked: Count,
    pub duration: Histogram,
}

impl Ledger {
    pub fn new(generation: GenerationId) -> Self {
        Self {
            generation,
            inflight_requests: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            requests: Count::default(),
            errors: Count::default(),
            waf_blocked: Count::default(),
            duration: Histogram::new(crate::telemetry::metrics::REQUEST_DURATION_BUCKETS),
        }
    }

    /// Counts a request answered `status` after `duration` (to its head).
    pub fn answered(&self, status: u16, duration: std::time::Duration) {
        self.requests.add(1);
        ANSWERED.add(1);
        if status >= 500 {
            self.errors.add(1);
            FAILED.add(1);
        }
        self.duration.record(duration);
    }
}

/// Requests answered by the process, over every generation.
static ANSWERED: Count = Count::new();
/// Of them, answered 5xx.
static FAILED: Count = Count::new();

/// Requests the process answered so far, and how many 5xx: a watcher
/// takes rates from two readings.
pub fn answered_totals() -> (u64, u64) {
    (ANSWERED.get(), FAILED.get())
}

impl Ledger {
    pub fn generation(&self) -> GenerationId {
        self.generation
    }

    pub fn inflight_requests(&self) -> u64 {
        self.inflight_requests.load(Ordering::Relaxed)
    }

    pub fn open_connections(&self) -> u64 {
        self.open_connections.load(Ordering::Relaxed)
    }

    /// Counts one request until the guard is dropped.
    pub fn request(self: &Arc<Self>) -> InflightGuard {
        self.inflight_requests.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            ledger: Arc::clone(self),
            kind: GuardKind::Request,
        }
    }

    /// Counts one long-lived connection until the guard is dropped.
    pub fn connection(self: &Arc<Self>) -> InflightGuard {
        self.open_connections.fetch_add(1, Ordering::Relaxed);
        InflightGuard {
            ledger: Arc::clone(self),
            kind: GuardKind::Connection,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum GuardKind {
    Request,
    Connection,
}

/// One unit of pinned work; counts down on drop.
#[derive(Debug)]
pub struct InflightGuard {
    ledger: Arc<Ledger>,
    kind: GuardKind,
}

impl InflightGuard {
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let counter = match self.kind {
            GuardKind::Request => &self.ledger.inflight_requests,
            GuardKind::Connection => &self.ledger.open_connections,
        };
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_down_on_drop() {
        let ledger = Arc::new(Ledger::new(GenerationId(3)));
        let a = ledger.request();
        let b = ledger.request();
        let c = ledger.connection();
        assert_eq!(
            (ledger.inflight_requests(), ledger.open_connections()),
            (2, 1)
        );
        drop(a);
        drop(c);
        assert_eq!(
            (ledger.inflight_requests(), ledger.open_connections()),
            (1, 0)
        );
        drop(b);
        assert_eq!(ledger.inflight_requests(), 0);
    }
}

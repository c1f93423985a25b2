//! Retry budgets (DESIGN §12): per upstream name, shared by every
//! generation, so an activation neither refills nor empties one. Over a
//! sliding 10 s window, retries (and hedges) may number
//! `ratio × requests + min_per_second × 10`: a steady failure costs the
//! backends at most `1 + ratio` times the traffic, plus a floor that lets
//! a quiet upstream still retry. The floor builds up at `min_per_second`
//! from the budget's creation, so a new upstream cannot spend ten seconds'
//! worth of it at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::plan::BudgetSpec;
use crate::telemetry::metrics as m;
use crate::telemetry::series::{self, Count, Exported, Sample};

/// Seconds the window spans (one slot each).
const WINDOW: u64 = 10;

/// The retry budget of one upstream name, and the upstream's counters
/// (exported as its series while a live generation names it).
#[derive(Debug)]
pub struct RetryBudget {
    slots: [Slot; WINDOW as usize],
    /// When it was made (`second()`).
    created: u64,
    name: Arc<str>,
    pub fail_open: Count,
    pub retried: Count,
    pub exhausted: Count,
    pub hedges_won: Count,
    pub hedges_lost: Count,
    exported: bool,
}

/// Series of one upstream: fail-open, two retry and two hedge outcomes.
const UPSTREAM_SERIES: usize = 5;

impl RetryBudget {
    /// The budget of upstream `name`, exporting its series if they fit.
    pub fn new(name: &str) -> Arc<Self> {
        Self::made_at(name, second())
    }

    fn made_at(name: &str, created: u64) -> Arc<Self> {
        let budget = Arc::new(Self {
            slots: Default::default(),
            created,
            name: Arc::from(name),
            fail_open: Count::default(),
            retried: Count::default(),
            exhausted: Count::default(),
            hedges_won: Count::default(),
            hedges_lost: Count::default(),
            exported: series::admit(UPSTREAM_SERIES),
        });
        if budget.exported {
            series::register(&budget);
        }
        budget
    }
}

impl Exported for RetryBudget {
    fn samples(&self, out: &mut Vec<Sample>) {
        let labels = series::named(m::LABEL_UPSTREAM, &self.name);
        let with = |outcome: &'static str| {
            let mut labels = labels.clone();
            labels.push((m::LABEL_OUTCOME, outcome.into()));
            labels
        };
        out.push(series::sample(
            &series::UPSTREAM_FAIL_OPEN,
            labels.clone(),
            self.fail_open.get() as f64,
        ));
        for (count, outcome) in [
            (&self.retried, "retried"),
            (&self.exhausted, "budget_exhausted"),
        ] {
            out.push(series::sample(
                &series::UPSTREAM_RETRIES,
                with(outcome),
                count.get() as f64,
            ));
        }
        for (count, outcome) in [(&self.hedges_won, "won"), (&self.hedges_lost, "lost")] {
            out.push(series::sample(
                &series::UPSTREAM_HEDGES,
                with(outcome),
                count.get() as f64,
            ));
        }
    }
}

impl Drop for RetryBudget {
    fn drop(&mut self) {
        if self.exported {
            series::retire(self);
            series::release(UPSTREAM_SERIES);
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// The second (since the process's clock origin) this slot counts.
    second: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

impl RetryBudget {
    /// Counts a request (its first attempt).
    pub fn request(&self) {
        self.current().requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry from the budget, if it has one.
    pub fn try_spend(&self, spec: &BudgetSpec) -> bool {
        let now = second();
        let (mut requests, mut retries) = (0u64, 0u64);
        for slot in &self.slots {
            if now.saturating_sub(slot.second.load(Ordering::Relaxed)) < WINDOW {
                requests += slot.requests.load(Ordering::Relaxed);
                retries += slot.retries.load(Ordering::Relaxed);
            }
        }
        let floor_seconds = (now.saturating_sub(self.created) + 1).min(WINDOW);
        let allowed =
            spec.ratio * requests as f64 + f64::from(spec.min_per_second) * floor_seconds as f64;
        if (retries + 1) as f64 > allowed {
            return false;
        }
        self.current().retries.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The slot of this second, cleared if it last counted an older one.
    /// Two threads crossing into a new second at once may lose a count
    /// or two: a budget is an estimate, not an account.
    fn current(&self) -> &Slot {
        let now = second();
        let index = usize::try_from(now % WINDOW).unwrap_or(0);
        let slot = &self.slots[index];
        let seen = slot.second.load(Ordering::Relaxed);
        if seen != now
            && slot
                .second
                .compare_exchange(seen, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            slot.requests.store(0, Ordering::Relaxed);
            slot.retries.store(0, Ordering::Relaxed);
        }
        slot
    }
}

fn second() -> u64 {
    // Offset by a window so that never-used slots (second 0) are stale.
    crate::clock::now_ms() / 1000 + WINDOW
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_a_share_of_requests_plus_a_floor() {
        let budget = RetryBudget::new("test");
        let spec = BudgetSpec {
            ratio: 0.2,
            min_per_second: 1,
        };
        // The floor of a new budget: one second's worth.
        assert_eq!((0..50).filter(|_| budget.try_spend(&spec)).count(), 1);
        for _ in 0..100 {
            budget.request();
        }
        // 20 % of 100 requests on top.
        assert_eq!((0..50).filter(|_| budget.try_spend(&spec)).count(), 20);
        // A budget that has been around the whole window has all of it.
        let old = RetryBudget::made_at("test", second() - WINDOW);
        assert_eq!((0..50).filter(|_| old.try_spend(&spec)).count(), 10);
        let none = BudgetSpec {
            ratio: 0.0,
            min_per_second: 0,
        };
        assert!(!RetryBudget::new("test").try_spend(&none));
    }
}

//! The process's millisecond clock: deadlines kept in atomics count
//! milliseconds from the process's first look at it, and show as Unix
//! milliseconds. The ground floor: it imports nothing of the crate.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// The origin of [`now_ms`], on the monotonic and on the wall clock.
fn origin() -> &'static (Instant, SystemTime) {
    static ORIGIN: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        let ms = Duration::from_millis(1);
        (Instant::now() - ms, SystemTime::now() - ms)
    })
}

/// Milliseconds since the process's first call: the time base of every
/// deadline kept in an atomic here (0 means "none").
pub fn now_ms() -> u64 {
    u64::try_from(origin().0.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// `at_ms` as Unix milliseconds: stable from one call to the next, so
/// two views of one deadline compare equal.
pub fn unix_ms(at_ms: u64) -> u64 {
    let at = origin().1 + Duration::from_millis(at_ms);
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

//! The process's millisecond clock: deadlines kept in atomics count
//! milliseconds from the process's first look at it, and show as Unix
//! milliseconds; and the `Date` of answers. The ground floor: it imports
//! nothing of the crate.

use std::cell::RefCell;
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

thread_local! {
    /// The last second's `Date`, formatted once per second per thread.
    static DATE: RefCell<(u64, Option<http::HeaderValue>)> = const { RefCell::new((0, None)) };
}

/// `now` as RFC 9110's IMF-fixdate, for `Date` fields (the cache's
/// answers, HTTP/2's).
pub fn http_date(now: SystemTime) -> http::HeaderValue {
    let second = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|cached| {
        let mut cached = cached.borrow_mut();
        match &cached.1 {
            Some(value) if cached.0 == second => value.clone(),
            _ => {
                let value = http::HeaderValue::from_str(&httpdate::fmt_http_date(now)).unwrap_or(
                    http::HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"),
                );
                *cached = (second, Some(value.clone()));
                value
            }
        }
    })
}

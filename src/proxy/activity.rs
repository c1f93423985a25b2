//! What has moved on one client connection ([`Activity`]): written by
//! the socket wrapper (`downstream.rs`), the head checks (`request_framing.rs`)
//! and the request path, read by the connection's [`watchdog`], which
//! keeps the client timeouts of DESIGN §13 that hyper does not keep (see
//! `downstream.rs` for what each one does). A leaf: it imports nothing of
//! the request path.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::observed::Observer;
use crate::plan::ListenerLimits;

/// What has moved on one client connection. The byte count and the head
/// state are written by the connection's own task only (it does all the
/// socket I/O), so they are plain loads and stores; request counts may
/// change on HTTP/2 stream tasks.
#[derive(Debug)]
pub struct Activity {
    /// When the connection was accepted; the time base of `head_started`.
    origin: Instant,
    bytes: AtomicU64,
    /// The client sent bytes since our last write: a head (or body) is
    /// on its way.
    read_since_write: AtomicBool,
    /// Nanoseconds after `origin` when the current head's first byte came.
    head_started: AtomicU64,
    /// Requests handed to the service whose response is not finished.
    open: AtomicUsize,
    /// Requests ever handed to the service.
    started: AtomicU64,
    /// The first head `request_framing::HeadCheck` refused (`u64::MAX`: none)...
    refused_head: AtomicU64,
    /// ... and why (an index into `REFUSALS`).
    refused_reason: AtomicUsize,
    /// The connection speaks HTTP/2 (preface or ALPN seen): it is drained
    /// with GOAWAY, and its PINGs are not activity.
    http2: AtomicBool,
    /// The head being read outstayed `header_read_timeout`: the stream
    /// ends (see `Downstream`).
    head_expired: AtomicBool,
}

/// Why a head was refused, as the 400 is logged.
pub const BARE_LF: &str = "bare LF line end in the request head";
pub const LENGTH_AND_CHUNKED: &str = "both Transfer-Encoding and Content-Length";
/// Answered 431, not 400.
pub const HEAD_TOO_LARGE: &str = "request head larger than max_header_bytes";

/// What `request_framing::HeadCheck` refuses heads for.
const REFUSALS: [&str; 3] = [BARE_LF, LENGTH_AND_CHUNKED, HEAD_TOO_LARGE];

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            bytes: AtomicU64::new(0),
            read_since_write: AtomicBool::new(false),
            head_started: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            refused_head: AtomicU64::new(u64::MAX),
            refused_reason: AtomicUsize::new(0),
            http2: AtomicBool::new(false),
            head_expired: AtomicBool::new(false),
        })
    }

    fn moved(&self, n: usize) {
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.bytes
            .store(bytes.wrapping_add(n as u64), Ordering::Relaxed);
    }

    fn read(&self, n: usize) {
        self.moved(n);
        // HTTP/2 frames go both ways all the time and have no head
        // timeout here: no clock read for them.
        if !self.read_since_write.load(Ordering::Relaxed) && !self.is_http2() {
            self.read_since_write.store(true, Ordering::Relaxed);
            let since = self.origin.elapsed().as_nanos();
            self.head_started
                .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }

    fn wrote(&self, n: usize) {
        self.moved(n);
        self.read_since_write.store(false, Ordering::Relaxed);
    }

    pub fn mark_http2(&self) {
        self.http2.store(true, Ordering::Relaxed);
    }

    /// The head being read is too late: the stream ends on its next read
    /// (with a 408 first on plain connections).
    pub fn expire_head(&self) {
        self.head_expired.store(true, Ordering::Relaxed);
    }

    /// Whether the head being read outstayed `header_read_timeout`.
    pub fn head_expired(&self) -> bool {
        self.head_expired.load(Ordering::Relaxed)
    }

    /// Bytes moved either way so far, and whether the client sent some
    /// since the last write (what the watchdog reads).
    #[cfg(test)]
    pub fn moved_and_reading(&self) -> (u64, bool) {
        (
            self.bytes.load(Ordering::Relaxed),
            self.read_since_write.load(Ordering::Relaxed),
        )
    }

    pub fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// A request was handed to the service; the guard ends it. Also
    /// returns why its head is refused, if `request_framing::HeadCheck` found a
    /// reason (HTTP/1 requests are handed over in head order).
    pub fn request(self: &Arc<Self>) -> (OpenRequest, Option<&'static str>) {
        self.open.fetch_add(1, Ordering::Relaxed);
        let index = self.started.fetch_add(1, Ordering::Relaxed);
        let refused = (self.refused_head.load(Ordering::Relaxed) == index)
            .then(|| {
                REFUSALS
                    .get(self.refused_reason.load(Ordering::Relaxed))
                    .copied()
            })
            .flatten();
        (OpenRequest(Arc::clone(self)), refused)
    }

    /// Records that head `head` of this connection breaks a framing rule
    /// or is too large; the first such head is answered 400 (431 for its
    /// size) and the connection closed.
    pub fn refuse_head(&self, head: u64, reason: &'static str) {
        if self.refused_head.load(Ordering::Relaxed) != u64::MAX {
            return;
        }
        let index = REFUSALS.iter().position(|r| *r == reason).unwrap_or(0);
        self.refused_reason.store(index, Ordering::Relaxed);
        self.refused_head.store(head, Ordering::Relaxed);
    }
}

/// Counts a request as open until its response body is dropped.
#[derive(Debug)]
pub struct OpenRequest(Arc<Activity>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection's record, told of every read and write.
impl Observer for Arc<Activity> {
    fn read(&mut self, data: &[u8]) {
        Activity::read(self, data.len());
    }

    fn wrote(&mut self, n: usize) {
        Activity::wrote(self, n);
    }
}

/// Why the watchdog ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// A request head took longer than `header_read_timeout`.
    Head,
    /// An open request saw no byte for `idle_timeout`.
    Idle,
    /// No request for `keepalive_timeout`.
    KeepAlive,
}

/// Completes when the connection has outstayed one of its limits.
pub async fn watchdog(activity: &Activity, limits: ListenerLimits) -> Expired {
    let mut seen_bytes = activity.bytes.load(Ordering::Relaxed);
    let mut seen_started = activity.started.load(Ordering::Relaxed);
    let mut quiet_since = Instant::now();
    loop {
        let open = activity.open.load(Ordering::Relaxed) > 0;
        let reading_head = !open && activity.read_since_write.load(Ordering::Relaxed);
        let (limit, expired) = if open {
            (limits.idle_timeout, Expired::Idle)
        } else if reading_head && !activity.is_http2() {
            (limits.header_read_timeout, Expired::Head)
        } else {
            (limits.keepalive_timeout, Expired::KeepAlive)
        };
        let now = Instant::now();
        if expired == Expired::Head {
            let started = activity.origin
                + Duration::from_nanos(activity.head_started.load(Ordering::Relaxed));
            let deadline = started + limit;
            if now >= deadline {
                return expired;
            }
            // Exact: the head's first byte is timestamped.
            tokio::time::sleep_until(deadline.min(now + limit / 4)).await;
            continue;
        }
        let bytes = activity.bytes.load(Ordering::Relaxed);
        let started = activity.started.load(Ordering::Relaxed);
        // HTTP/2 PINGs (ours, every h2_keepalive_interval, and their
        // acknowledgements) move bytes on a connection that is otherwise
        // silent: between requests only a new request counts, and during
        // one, only more bytes than the pings of a tick could make.
        let active = match (expired, activity.is_http2()) {
            (Expired::KeepAlive, true) => started != seen_started,
            (_, true) => {
                bytes.wrapping_sub(seen_bytes) > ping_noise(limits, limit)
                    || started != seen_started
            }
            _ => bytes != seen_bytes || started != seen_started,
        };
        if active {
            seen_bytes = bytes;
            seen_started = started;
            quiet_since = now;
        } else if now.duration_since(quiet_since) >= limit {
            return expired;
        }
        // A head may start at any moment between requests; it is timed
        // from its first byte, so seeing it within header_read_timeout
        // is soon enough.
        let mut tick = limit / 4;
        if expired == Expired::KeepAlive {
            tick = tick.min(limits.header_read_timeout);
        }
        let tick = tick.max(Duration::from_millis(5));
        tokio::time::sleep_until((quiet_since + limit).min(now + tick)).await;
    }
}

/// The most bytes HTTP/2 PINGs can move between two looks at a
/// connection whose limit is `limit`: a 17-byte PING frame each way per
/// `h2_keepalive_interval` (39 bytes as a TLS 1.3 record), rounded up.
fn ping_noise(limits: ListenerLimits, limit: Duration) -> u64 {
    const PING_ROUND_TRIP: u64 = 2 * (17 + 22);
    let Some(interval) = limits.h2_keepalive_interval else {
        return 0;
    };
    // From the last look to the deadline is at most `limit`.
    let pings = limit.as_millis() / interval.as_millis().max(1) + 1;
    PING_ROUND_TRIP * u64::try_from(pings).unwrap_or(u64::MAX / PING_ROUND_TRIP)
}

//! The impact sample of one HTTP listener (DESIGN §22): a ring of recent
//! request heads, kept across generations, that `impact` replays through
//! a candidate's routers. A head is what routing reads and nothing more:
//! the method, the host as routed, the normalized path, the query, and
//! the values of the headers the listener's routes match on (never
//! `Authorization`, `Proxy-Authorization` or `Cookie`, never a body).
//!
//! Recording never waits: each request is offered with probability
//! 1/`STRIDE`, drawn from the serving thread's own generator (a fixed
//! stride would alias with periodic traffic: pollers, health checks,
//! round robins), and a ring another thread holds is skipped. A slot's buffers
//! are reused when it is overwritten, so a full ring records without
//! allocating. Bounded: at most `capacity` heads of at most `MAX_PATH` +
//! `MAX_QUERY` + `MAX_VALUE` × (1 + `MAX_HEADERS`) bytes each (about
//! 4.3 KiB); a typical head is well under 200 bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use http::{HeaderMap, HeaderName, Method};

/// One request in this many, on average, is offered to the ring: what
/// recording costs is spread over them.
pub const STRIDE: u32 = 4;
/// Longer paths and queries are not recorded (a truncated one would
/// route differently); nor are longer header values.
pub const MAX_PATH: usize = 1024;
pub const MAX_QUERY: usize = 1024;
pub const MAX_VALUE: usize = 256;
/// Header names recorded per head, at most.
pub const MAX_HEADERS: usize = 8;

/// Names never recorded, whatever a route matches on.
const SECRET: [HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::header::PROXY_AUTHORIZATION,
    http::header::COOKIE,
];

/// One recorded request head.
#[derive(Debug, Clone)]
pub struct Head {
    pub at: Instant,
    pub method: Method,
    /// As routed: lower case, without port; empty without one.
    pub host: String,
    /// Normalized, as routed.
    pub path: String,
    pub query: Option<String>,
    /// Values of the headers routes match on, each at most `MAX_VALUE`.
    pub headers: Vec<(HeaderName, Vec<u8>)>,
}

impl Head {
    /// The headers as a map, for a router to read.
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            if let Ok(value) = http::HeaderValue::from_bytes(value) {
                map.append(name.clone(), value);
            }
        }
        map
    }
}

#[derive(Debug, Default)]
struct Ring {
    heads: Vec<Head>,
    /// Where the next head goes once the ring is full.
    next: usize,
}

/// A listener's sample; shared by every generation's router of it.
#[derive(Debug)]
pub struct ListenerSample {
    ring: Mutex<Ring>,
    capacity: AtomicUsize,
}

/// What a request offers the sample.
pub struct Offered<'a> {
    pub method: &'a Method,
    pub host: Option<&'a str>,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

impl ListenerSample {
    pub fn new(capacity: usize) -> Self {
        ListenerSample {
            ring: Mutex::new(Ring::default()),
            capacity: AtomicUsize::new(capacity),
        }
    }

    /// Sets how many heads the ring keeps (the oldest go first).
    pub fn resize(&self, capacity: usize) {
        self.capacity.store(capacity, Ordering::Relaxed);
        let mut ring = self
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ring.heads.len() > capacity {
            let ring = &mut *ring;
            // Oldest first, then keep the newest `capacity`.
            ring.heads.rotate_left(ring.next);
            let drop = ring.heads.len() - capacity;
            ring.heads.drain(..drop);
            ring.next = 0;
        }
    }

    /// Whether this request is one the sample takes: a draw of the
    /// serving thread's generator (`fastrand`'s thread-local wyrand: an
    /// add and a multiply), true with probability 1/`STRIDE`,
    /// independently of every other request.
    #[inline]
    pub fn offered(&self) -> bool {
        fastrand::u32(..).is_multiple_of(STRIDE)
    }

    /// Records `head`, keeping the values of `names`. Skipped when
    /// another thread holds the ring, or the head is too long to keep
    /// whole.
    pub fn record(&self, head: &Offered<'_>, names: &[HeaderName]) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if capacity == 0
            || head.path.len() > MAX_PATH
            || head.query.is_some_and(|q| q.len() > MAX_QUERY)
            || head.host.is_some_and(|h| h.len() > MAX_VALUE)
        {
            return;
        }
        let Ok(mut ring) = self.ring.try_lock() else {
            return;
        };
        let ring = &mut *ring;
        let at = Instant::now();
        let slot = if ring.heads.len() < capacity {
            ring.heads.push(Head {
                at,
                method: Method::GET,
                host: String::new(),
                path: String::new(),
                query: None,
                headers: Vec::new(),
            });
            ring.heads.last_mut()
        } else {
            let i = ring.next % ring.heads.len().max(1);
            ring.next = i + 1;
            ring.heads.get_mut(i)
        };
        let Some(slot) = slot else { return };
        slot.at = at;
        slot.method.clone_from(head.method);
        slot.host.clear();
        slot.host.push_str(head.host.unwrap_or_default());
        slot.path.clear();
        slot.path.push_str(head.path);
        match (head.query, &mut slot.query) {
            (Some(q), Some(kept)) => {
                kept.clear();
                kept.push_str(q);
            }
            (Some(q), kept) => *kept = Some(q.to_owned()),
            (None, kept) => *kept = None,
        }
        // Reuse the value buffers already there.
        let mut kept = 0;
        for name in names.iter().take(MAX_HEADERS) {
            for value in head.headers.get_all(name) {
                let bytes = value.as_bytes();
                if bytes.len() > MAX_VALUE || kept >= MAX_HEADERS {
                    continue;
                }
                match slot.headers.get_mut(kept) {
                    Some((n, v)) => {
                        n.clone_from(name);
                        v.clear();
                        v.extend_from_slice(bytes);
                    }
                    None => slot.headers.push((name.clone(), bytes.to_vec())),
                }
                kept += 1;
            }
        }
        slot.headers.truncate(kept);
    }

    /// The heads held now, oldest first.
    pub fn heads(&self) -> Vec<Head> {
        let ring = self
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (newer, older) = ring.heads.split_at(ring.next.min(ring.heads.len()));
        older.iter().chain(newer).cloned().collect()
    }
}

/// The header names a listener's routes match on that a sample may keep.
pub fn matched_names<'a>(
    specs: impl Iterator<Item = &'a crate::plan::RouteSpec>,
) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = Vec::new();
    for spec in specs {
        for (name, _) in &spec.headers {
            if !SECRET.contains(name) && !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

/// Headers a firewall's rules read beside routing, recorded on a
/// listener with one (after what its routes match on, within
/// `MAX_HEADERS`): preview's would-block share (DESIGN §24) replays the
/// heads through the rules, and a head without them would look like a
/// client that sends none (CRS counts a missing `User-Agent` or `Accept`
/// against it).
pub const FIREWALL_NAMES: [HeaderName; 3] = [
    http::header::USER_AGENT,
    http::header::ACCEPT,
    http::header::CONTENT_TYPE,
];

/// `names`, with `FIREWALL_NAMES` it does not have yet.
pub fn with_firewall_names(mut names: Vec<HeaderName>) -> Vec<HeaderName> {
    for name in FIREWALL_NAMES {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer<'a>(path: &'a str, headers: &'a HeaderMap) -> Offered<'a> {
        Offered {
            method: &Method::GET,
            host: Some("api.example"),
            path,
            query: Some("a=1"),
            headers,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_heads_and_only_the_matched_headers() {
        let sample = ListenerSample::new(3);
        let mut headers = HeaderMap::new();
        headers.insert("x-env", "prod".parse().unwrap());
        headers.insert("authorization", "Bearer secret".parse().unwrap());
        headers.insert("x-other", "no".parse().unwrap());
        let names = vec![HeaderName::from_static("x-env")];
        for i in 0..5 {
            sample.record(&offer(&format!("/p{i}"), &headers), &names);
        }
        let heads = sample.heads();
        let paths: Vec<_> = heads.iter().map(|h| h.path.as_str()).collect();
        assert_eq!(paths, ["/p2", "/p3", "/p4"]);
        assert_eq!(heads[0].headers.len(), 1);
        assert_eq!(heads[0].headers[0].1, b"prod");
        assert_eq!(heads[0].query.as_deref(), Some("a=1"));
        sample.resize(2);
        let paths: Vec<_> = sample.heads().into_iter().map(|h| h.path).collect();
        assert_eq!(paths, ["/p3", "/p4"]);
        sample.resize(0);
        sample.record(&offer("/p5", &headers), &names);
        assert!(sample.heads().is_empty());
    }

    #[test]
    fn offers_do_not_follow_a_requests_place_in_a_cycle() {
        // A fixed stride of 4 offers every request at one place of a
        // cycle of 4 and none at the others (and 2 of 10's places
        // twice as often as their share); draws offer each place alike.
        let sample = ListenerSample::new(1);
        for cycle in [4usize, 10] {
            let mut offered = vec![0u32; cycle];
            for i in 0..cycle * 10_000 {
                if sample.offered() {
                    offered[i % cycle] += 1;
                }
            }
            for (place, n) in offered.iter().enumerate() {
                // 1/4 of 10 000: 2 500, standard deviation 43.
                assert!(
                    (2_200..=2_800).contains(n),
                    "cycle {cycle}, place {place}: {offered:?}"
                );
            }
        }
    }

    #[test]
    fn secrets_are_never_among_the_names_and_long_heads_are_skipped() {
        let spec_names = matched_names(std::iter::empty());
        assert!(spec_names.is_empty());
        let sample = ListenerSample::new(4);
        let headers = HeaderMap::new();
        sample.record(&offer(&"/x".repeat(MAX_PATH), &headers), &[]);
        assert!(sample.heads().is_empty());
        let long_value = HeaderMap::from_iter([(
            HeaderName::from_static("x-env"),
            "v".repeat(MAX_VALUE + 1).parse().unwrap(),
        )]);
        sample.record(
            &offer("/ok", &long_value),
            &[HeaderName::from_static("x-env")],
        );
        assert!(sample.heads()[0].headers.is_empty());
    }
}

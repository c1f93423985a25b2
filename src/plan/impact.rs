//! What a candidate would do to the sampled traffic (DESIGN §22), as
//! validate and preview answer it: plain data. `impact::assess` makes
//! it; `ctl` prints it and holds `--max-moved` against it.

use serde::{Deserialize, Serialize};

/// What a candidate does to the sampled traffic.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Impact {
    /// Request heads replayed (every listener's sample).
    pub sample_size: usize,
    /// Seconds from the oldest head to the newest.
    pub span_seconds: f64,
    /// To another route, or to the same route's other upstream.
    pub moved: Kind,
    /// Routed now, no route after (404).
    pub unrouted: Kind,
    /// Routed after to an upstream none of whose backends takes traffic
    /// now (every one known, and every one failing its checks or
    /// ejected).
    pub unusable: Kind,
    /// Unrouted now, routed after.
    pub newly_routed: Kind,
    /// Each route's share before and after, largest first.
    pub routes: Vec<Share>,
    /// Each upstream's share before and after, largest first.
    pub upstreams: Vec<Share>,
}

impl Impact {
    /// The share that would go elsewhere than now: moved or unrouted
    /// (what `ctl activate --max-moved` compares).
    pub fn moved_percent(&self) -> f64 {
        percent(self.moved.count + self.unrouted.count, self.sample_size)
    }
}

/// Requests of one kind: how many, their share of the sample, examples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Kind {
    pub count: usize,
    pub percent: f64,
    pub examples: Vec<Example>,
}

/// One sampled request and where it lands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    pub listener: String,
    pub method: String,
    pub host: String,
    /// The path (and query), cut to 100 characters.
    pub path: String,
    pub before: Option<Destination>,
    pub after: Option<Destination>,
}

/// A route, and its upstream when it forwards.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Destination {
    pub route: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
}

/// A route's or an upstream's share of the sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Share {
    pub name: String,
    pub before: usize,
    pub after: usize,
    pub before_percent: f64,
    pub after_percent: f64,
}

/// `n` of `of`, in percent with two decimals.
pub fn percent(n: usize, of: usize) -> f64 {
    if of == 0 {
        return 0.0;
    }
    (n as f64 * 10_000.0 / of as f64).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_to_two_places() {
        assert_eq!(percent(1, 3), 33.33);
        assert_eq!(percent(0, 0), 0.0);
        assert_eq!(percent(2, 2), 100.0);
    }
}

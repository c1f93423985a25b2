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
    /// What the candidate's web application firewall would refuse of
    /// the sample beside the active one's (DESIGN §24), when a firewall
    /// differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waf: Option<WafImpact>,
}

/// Preview's would-block share (DESIGN §24): the sampled heads through
/// both generations' firewalls, in detection mode, per route of the
/// candidate, with the 95 % interval of the share the candidate would
/// refuse (`total.candidate_interval`) and of the change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WafImpact {
    /// What the rules saw: what the sample holds.
    pub sample: String,
    #[serde(flatten)]
    pub judged: crate::waf::tally::WafShadowReport,
}

impl Impact {
    /// The share that would go elsewhere than now: moved or unrouted
    /// (what `ctl activate --max-moved` compares).
    pub fn moved_percent(&self) -> f64 {
        percent(self.moved.count + self.unrouted.count, self.sample_size)
    }

    /// The 95 % interval of `moved_percent` (what `ctl activate
    /// --max-moved-upper` compares its upper end with).
    pub fn moved_interval(&self) -> [f64; 2] {
        interval(self.moved.count + self.unrouted.count, self.sample_size)
    }
}

/// Requests of one kind: how many, their share of the sample, examples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Kind {
    pub count: usize,
    pub percent: f64,
    /// The 95 % interval of `percent`: where the share of all the
    /// traffic the sample was drawn from lies (Wilson score interval).
    #[serde(default = "unknown_interval")]
    pub interval: [f64; 2],
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
    /// The 95 % intervals of the two percentages.
    #[serde(default = "unknown_interval")]
    pub before_interval: [f64; 2],
    #[serde(default = "unknown_interval")]
    pub after_interval: [f64; 2],
}

/// `n` of `of`, in percent with two decimals.
pub fn percent(n: usize, of: usize) -> f64 {
    if of == 0 {
        return 0.0;
    }
    (n as f64 * 10_000.0 / of as f64).round() / 100.0
}

/// What an interval is before anything is known: all of it.
fn unknown_interval() -> [f64; 2] {
    [0.0, 100.0]
}

/// The 95 % Wilson score interval of `n` of `of`, in percent with two
/// decimals (lower end rounded down, upper end up). Offers to the sample
/// are independent draws (probability 1/4 per request, `sample.rs`),
/// so a share of the sample is a binomial proportion of the traffic it
/// was drawn from; Wilson's interval stays inside 0–100 and keeps its
/// coverage at shares near 0 and 100 and at small samples, where the
/// normal approximation does not. At 1 000 heads it is at most ±3.1
/// points (at 50 %).
pub fn interval(n: usize, of: usize) -> [f64; 2] {
    if of == 0 {
        return unknown_interval();
    }
    let [low, high] = crate::waf::tally::wilson(n as u64, of as u64);
    [
        (low * 10_000.0).floor() / 100.0,
        (high * 10_000.0).ceil() / 100.0,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_intervals_hold_known_values_and_stay_within_bounds() {
        // Reference values of the 95 % Wilson interval (z = 1.96).
        assert_eq!(interval(300, 1000), [27.24, 32.92]);
        assert_eq!(interval(500, 1000), [46.9, 53.1]);
        assert_eq!(interval(0, 10), [0.0, 27.76]);
        assert_eq!(interval(10, 10), [72.24, 100.0]);
        assert_eq!(interval(0, 0), [0.0, 100.0]);
        // At 1 000 heads, never wider than ±4 points.
        for k in 0..=1000 {
            let [low, high] = interval(k, 1000);
            let share = percent(k, 1000);
            assert!(low <= share && share <= high, "{k}");
            assert!(high - low <= 8.0, "{k}: {low}–{high}");
            assert!((0.0..=100.0).contains(&low) && (0.0..=100.0).contains(&high));
        }
    }

    #[test]
    fn percentages_round_to_two_places() {
        assert_eq!(percent(1, 3), 33.33);
        assert_eq!(percent(0, 0), 0.0);
        assert_eq!(percent(2, 2), 100.0);
    }
}

//! `cutover_waf_rule_matches_total{rule}`: how often each firewall rule
//! matched, process-wide (DESIGN §24), and the most matched ones for
//! `GET /admin/waf`. Bounded: at most `MAX_RULES` rule ids get a series
//! of their own, each taken from the series budget at its first match;
//! the rest count as `rule="other"`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::metrics as m;
use super::series::{self, Exported, Sample};

/// Rule ids counted apart (CRS v4 has about 700 rules; a request that
/// is blocked matches a handful).
pub const MAX_RULES: usize = 256;

#[derive(Default)]
struct RuleMatches {
    counts: Mutex<HashMap<u32, u64>>,
    other: AtomicU64,
}

fn matches() -> &'static Arc<RuleMatches> {
    static MATCHES: OnceLock<Arc<RuleMatches>> = OnceLock::new();
    MATCHES.get_or_init(|| {
        let matches = Arc::new(RuleMatches::default());
        series::register(&matches);
        matches
    })
}

/// Counts one match of each rule in `rules` (one request's).
pub fn matched(rules: &[u32]) {
    if rules.is_empty() {
        return;
    }
    let matches = matches();
    let mut counts = matches
        .counts
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for id in rules {
        if let Some(n) = counts.get_mut(id) {
            *n += 1;
        } else if counts.len() < MAX_RULES && series::admit(1) {
            counts.insert(*id, 1);
        } else {
            matches.other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The `n` rules matched most often since the process started, most
/// first (ties by id).
pub fn top(n: usize) -> Vec<(u32, u64)> {
    let matches = matches();
    let counts = matches
        .counts
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut all: Vec<(u32, u64)> = counts.iter().map(|(id, n)| (*id, *n)).collect();
    drop(counts);
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    all.truncate(n);
    all
}

impl Exported for RuleMatches {
    fn samples(&self, out: &mut Vec<Sample>) {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        for (id, n) in counts.iter() {
            out.push(series::sample(
                &series::WAF_RULE_MATCHES,
                vec![(m::LABEL_RULE, id.to_string().into())],
                *n as f64,
            ));
        }
        let other = self.other.load(Ordering::Relaxed);
        if other > 0 {
            out.push(series::sample(
                &series::WAF_RULE_MATCHES,
                vec![(m::LABEL_RULE, "other".into())],
                other as f64,
            ));
        }
    }
}

//! The web application firewall's settings (DESIGN §24), resolved:
//! `[waf.rulesets.NAME]` compiled, and a route's `waf`.

use super::Digest;

/// One `[waf.rulesets.NAME]`: its rule files compiled with the settings
/// given. Shared (one `Arc`) by every generation whose rule set has the
/// same files, contents and settings: it is compiled once.
pub struct WafRuleset {
    pub name: String,
    /// Over the settings and every file read (rule and data files, by
    /// name and contents): equal digests share one compiled set.
    pub digest: Digest,
    /// The data files its rules read (`@pmFromFile`), by the name the
    /// digest gives them: read again to tell whether a candidate changed
    /// them.
    pub data_files: Vec<String>,
    pub rules: crate::waf::RuleSet,
    /// Rules (chains counted once) loaded.
    pub rule_count: usize,
    pub paranoia: u8,
    pub inbound_threshold: u32,
    pub outbound_threshold: u32,
    /// Request bodies are read for the rules up to this many bytes.
    pub request_body_limit: u64,
    pub limit_action: WafLimitAction,
    /// Answer bodies (of the types `ANSWER_BODY_TYPES` names) are read
    /// for the rules up to this many bytes; the rest is passed on unread.
    pub response_body_limit: u64,
    /// Some rule reads the answer (phase 3 or 4): the answer goes through
    /// the rules before the client gets it.
    pub answer_phases: bool,
}

/// The media types whose answer bodies the rules read (ModSecurity's
/// recommended `SecResponseBodyMimeType`): a binary download, a stream
/// of events or a gRPC answer passes without being held.
pub const ANSWER_BODY_TYPES: [&str; 3] = ["text/plain", "text/html", "text/xml"];

impl std::fmt::Debug for WafRuleset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WafRuleset")
            .field("name", &self.name)
            .field("rules", &self.rule_count)
            .field("paranoia", &self.paranoia)
            .field("inbound_threshold", &self.inbound_threshold)
            .field("request_body_limit", &self.request_body_limit)
            .field("limit_action", &self.limit_action)
            .field("outbound_threshold", &self.outbound_threshold)
            .field("response_body_limit", &self.response_body_limit)
            .finish_non_exhaustive()
    }
}

/// What a request body longer than `request_body_limit` gets
/// (ModSecurity's `SecRequestBodyLimitAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WafLimitAction {
    /// 413, before the rules run.
    Reject,
    /// The rules read the first `request_body_limit` bytes; the whole
    /// body is forwarded.
    ProcessPartial,
}

/// A route's `waf = { ruleset, mode }`. The rule set is looked up by name
/// in the generation serving the request (a route taken over unchanged
/// by a candidate then uses the candidate's rule set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteWafSpec {
    pub ruleset: String,
    /// `Block` or `Detect`.
    pub mode: crate::waf::Mode,
    pub exclusions: Vec<WafExclusion>,
}

/// What a firewall's rules did with one request.
#[derive(Debug)]
pub struct WafEvaluation {
    /// The rules interrupted it (blocking mode).
    pub interrupted: Option<crate::waf::Interruption>,
    /// `pass`, `blocked`, `would_block` (detection mode).
    pub outcome: &'static str,
    /// CRS's inbound anomaly score, when the rules set one.
    pub score: u32,
    /// The ids of the rules that matched, in order.
    pub rules: Vec<u32>,
    /// The transaction, paused after the request's phases for the
    /// answer's: when asked for, and the rules did not interrupt it.
    pub paused: Option<crate::waf::Paused>,
}

impl RouteWafSpec {
    /// Runs `ruleset`'s rules (phases 1 and 2) on `request` in `mode`,
    /// with the exclusions that apply to its path; `keep`: the
    /// transaction is paused for the answer's phases.
    pub fn evaluate(
        &self,
        ruleset: &WafRuleset,
        request: &crate::waf::Request,
        (mode, keep): (crate::waf::Mode, bool),
    ) -> WafEvaluation {
        let path = request.uri.split('?').next().unwrap_or("");
        let mut tx = crate::waf::Transaction::new(&ruleset.rules, request, mode);
        for x in self.exclusions.iter().filter(|x| x.applies(path)) {
            tx.exclude(&x.rule_ids, &x.targets);
        }
        let interrupted = tx.request();
        let score = tx
            .tx("blocking_inbound_anomaly_score")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
            .unwrap_or(0);
        let outcome = match (interrupted, tx.would_interrupt) {
            (Some(_), _) => "blocked",
            (None, Some(_)) => "would_block",
            (None, None) => "pass",
        };
        WafEvaluation {
            interrupted,
            outcome,
            score,
            rules: tx.matches.iter().map(|m| m.id).collect(),
            paused: (keep && interrupted.is_none()).then(|| tx.pause()),
        }
    }
}

impl super::RouteSpec {
    /// The route's firewall: its own `waf`, else its listener's default
    /// (`defaults`) unless it wrote `waf = "none"`.
    pub fn firewall<'a>(
        &'a self,
        defaults: Option<&'a super::Defaults>,
    ) -> Option<&'a RouteWafSpec> {
        match (&self.waf, self.waf_opt_out) {
            (Some(own), _) => Some(own),
            (None, true) => None,
            (None, false) => defaults.and_then(|d| d.waf.as_ref()),
        }
    }
}

/// One of a route's `waf.exclusions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WafExclusion {
    /// Rules not evaluated (no `targets`), or that no longer read
    /// `targets` (every rule when empty).
    pub rule_ids: Vec<u32>,
    /// Each one variable, or one value of it (`ARGS:password`).
    pub targets: Vec<crate::waf::Target>,
    /// Path prefixes it applies under (every path when empty).
    pub paths: Vec<String>,
}

impl WafExclusion {
    /// Whether it applies to a request for `path`.
    pub fn applies(&self, path: &str) -> bool {
        self.paths.is_empty() || self.paths.iter().any(|p| path.starts_with(p.as_str()))
    }
}

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
    /// Request bodies are read for the rules up to this many bytes.
    pub request_body_limit: u64,
    pub limit_action: WafLimitAction,
}

impl std::fmt::Debug for WafRuleset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WafRuleset")
            .field("name", &self.name)
            .field("rules", &self.rule_count)
            .field("paranoia", &self.paranoia)
            .field("inbound_threshold", &self.inbound_threshold)
            .field("request_body_limit", &self.request_body_limit)
            .field("limit_action", &self.limit_action)
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

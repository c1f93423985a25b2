//! The web application firewall as the admin API shows it (`GET
//! /admin/waf`, DESIGN §24): the active generation's rule sets, the
//! routes that use each and how, and the rules matched most.

use serde::{Deserialize, Serialize};

use crate::generation::Generation;
use crate::plan::{RouteWafSpec, WafLimitAction};

/// How many of the most matched rules the view lists.
const TOP_RULES: usize = 20;

/// `GET /admin/waf`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WafView {
    pub generation: u64,
    pub rulesets: Vec<RulesetView>,
    /// The rules matched most since the process started (every rule
    /// set's), most first.
    pub top_rules: Vec<RuleCount>,
}

/// One `[waf.rulesets.NAME]` and the routes that use it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RulesetView {
    pub name: String,
    /// Rules loaded (a chain counts once).
    pub rules: usize,
    pub paranoia: u8,
    pub inbound_threshold: u32,
    pub request_body_limit: u64,
    pub request_body_limit_action: String,
    /// Routes that name it.
    pub routes: Vec<RouteWafView>,
    /// Listeners whose `defaults` name it (for their routes without a
    /// `waf` of their own).
    pub listener_defaults: Vec<RouteWafView>,
}

/// A route's (or a listener default's) use of a rule set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteWafView {
    /// The route's name, or the listener's.
    pub route: String,
    /// `block` or `detect`.
    pub mode: String,
    pub exclusions: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuleCount {
    pub rule: u32,
    pub matches: u64,
}

/// How `name` uses rule set `ruleset`, if it does.
fn use_of(name: &str, waf: Option<&RouteWafSpec>, ruleset: &str) -> Option<RouteWafView> {
    let waf = waf.filter(|w| w.ruleset == ruleset)?;
    Some(RouteWafView {
        route: name.to_owned(),
        mode: match waf.mode {
            crate::waf::Mode::Block => "block",
            crate::waf::Mode::Detect => "detect",
            crate::waf::Mode::Off => "off",
        }
        .to_owned(),
        exclusions: waf.exclusions.len(),
    })
}

impl WafView {
    pub fn of(generation: &Generation) -> Self {
        let spec = &generation.spec;
        let rulesets = spec
            .waf_rulesets
            .values()
            .map(|set| RulesetView {
                name: set.name.clone(),
                rules: set.rule_count,
                paranoia: set.paranoia,
                inbound_threshold: set.inbound_threshold,
                request_body_limit: set.request_body_limit,
                request_body_limit_action: match set.limit_action {
                    WafLimitAction::Reject => "reject",
                    WafLimitAction::ProcessPartial => "process_partial",
                }
                .to_owned(),
                routes: spec
                    .routes
                    .iter()
                    .filter_map(|route| use_of(&route.name, route.waf.as_ref(), &set.name))
                    .collect(),
                listener_defaults: spec
                    .listeners
                    .iter()
                    .filter_map(|l| {
                        use_of(&l.name, l.edge.defaults.as_ref()?.waf.as_ref(), &set.name)
                    })
                    .collect(),
            })
            .collect();
        WafView {
            generation: generation.id.0,
            rulesets,
            top_rules: crate::telemetry::waf::top(TOP_RULES)
                .into_iter()
                .map(|(rule, matches)| RuleCount { rule, matches })
                .collect(),
        }
    }
}

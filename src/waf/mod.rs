//! The web application firewall's rule language: SecLang, the subset the
//! OWASP Core Rule Set v4 is written in (DESIGN §24), read from rule
//! files into a checked [`RuleSet`]. `lex.rs` turns text into directives,
//! `rule.rs` reads a rule's targets, operator and actions (refusing any
//! name the engine does not evaluate), `load.rs` builds the set: chains,
//! markers, default actions, target updates, phrase files, and every
//! regular expression compiled for a linear-time engine.
//!
//! `engine.rs` evaluates a request (and an answer) against a set. A
//! configuration's `[waf.rulesets]` are compiled by `plan` and a route's
//! requests evaluated by `proxy/waf.rs`; this module imports nothing of
//! cutover.

#[cfg(test)]
mod corpus;
#[cfg(test)]
mod corpus_cases;
mod engine;
mod lex;
mod load;
mod operator;
mod request;
mod rule;
pub mod tally;
mod transform;

pub use engine::{Interruption, Matched, Mode, Transaction};
pub use lex::{directives, Directive, LexError};
pub use load::{compile, conf_files, Entry, Matcher, Rule, RuleSet, WafError};
pub use request::{BodyProcessor, Request, Response};
pub use rule::targets;
pub use rule::{
    Actions, Ctl, CtlOption, Disruptive, Operator, OperatorKind, Selector, SetOp, SetVar, Target,
    Transform, Variable,
};
pub use transform::apply as transform;

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// The Core Rule Set beside the project (`../shared/crs`), its setup
    /// first and its rule files in order, as a deployment loads them.
    fn crs_files() -> Option<Vec<PathBuf>> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/crs");
        let mut files = vec![root.join("crs-setup.conf.example")];
        files.extend(conf_files(&root.join("rules")).ok()?);
        Some(files)
    }

    #[test]
    fn the_core_rule_set_loads_whole() {
        let Some(files) = crs_files() else {
            eprintln!("skipped: ../shared/crs is not beside the project");
            return;
        };
        let set = match RuleSet::load(&files) {
            Ok(set) => set,
            Err(errors) => {
                let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
                panic!("{} errors:\n{}", errors.len(), listed.join("\n"));
            }
        };
        let rules: Vec<&Rule> = set.rules().collect();
        let links: usize = rules.iter().map(|r| r.links().count()).sum();
        let regexes = rules
            .iter()
            .flat_map(|r| r.links())
            .filter(|l| matches!(l.matcher, Matcher::Regex(_)))
            .count();
        let deferred = rules
            .iter()
            .flat_map(|r| r.links())
            .filter(|l| matches!(l.matcher, Matcher::Deferred(_)))
            .count();
        eprintln!(
            "CRS: {} rules ({links} with their chained links), {regexes} regular expressions \
             compiled, {deferred} with macros, {} target updates, {} markers",
            rules.len(),
            set.target_updates.len(),
            set.entries.len() - rules.len()
        );
        assert!(rules.len() > 600, "{} rules", rules.len());
        assert_eq!(set.signatures, ["OWASP_CRS/4.28.0"]);
        // The anomaly-scoring decisions are there.
        for id in [949110, 959100, 980170] {
            assert!(rules.iter().any(|r| r.id() == Some(id)), "rule {id}");
        }
    }
}

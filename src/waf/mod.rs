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

pub use engine::{Interruption, Matched, Mode, Paused, Transaction};
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
        assert!(
            set.reads_answers(),
            "CRS's outbound rules run on the answer"
        );
    }

    /// A transaction paused after the request's phases (while the
    /// upstream answers) takes up the answer as one run straight through
    /// would: the `TX` its request's rules set, what matched, and the
    /// answer's own rules.
    #[test]
    fn a_paused_transaction_takes_up_the_answer_where_it_stopped() {
        let text = "SecAction \"id:1,phase:1,pass,nolog,setvar:tx.seen=1\"\n\
                    SecRule REQUEST_URI \"@contains leak\" \"id:2,phase:2,pass,log,setvar:tx.asked=1\"\n\
                    SecRule TX:asked \"@eq 1\" \"id:3,phase:3,pass,log\"\n\
                    SecRule RESPONSE_BODY \"@contains secret\" \"id:4,phase:4,deny,status:403,log\"\n";
        let set = RuleSet::parse(&PathBuf::from("rules.conf"), text).expect("rules");
        assert!(set.reads_answers());
        let request = Request {
            id: "1".into(),
            remote_addr: "127.0.0.1".into(),
            method: "GET".into(),
            uri: "/leak".into(),
            protocol: "HTTP/1.1".into(),
            headers: vec![("host".into(), b"a".to_vec())],
            body: Vec::new(),
        };
        let answer = Response {
            status: 200,
            headers: vec![("content-type".into(), b"text/plain".to_vec())],
            body: b"the secret is out".to_vec(),
        };
        let ids = |tx: &Transaction<'_>| -> Vec<u32> { tx.matches.iter().map(|m| m.id).collect() };
        let mut straight = Transaction::new(&set, &request, Mode::Block);
        assert_eq!(straight.request(), None);
        let stopped = straight.response(&answer);
        let mut first = Transaction::new(&set, &request, Mode::Block);
        assert_eq!(first.request(), None);
        let paused = first.pause();
        assert_eq!(paused.matches.len(), 1);
        let mut resumed = Transaction::resume(&set, &request, paused);
        assert_eq!(resumed.tx("seen"), Some(&b"1"[..]));
        assert_eq!(resumed.response(&answer), stopped);
        assert_eq!(stopped.map(|i| (i.rule, i.status)), Some((4, 403)));
        assert_eq!(ids(&resumed), ids(&straight));
        assert_eq!(ids(&resumed), [2, 3, 4]);
    }
}

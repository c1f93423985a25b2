//! Property tests: the parser and the planner take any text, however
//! broken, and answer with diagnostics, never a panic, within a second.
//!
//! Runs `PROPTEST_CASES` cases (256 unless set); the longer run is
//! `PROPTEST_CASES=20000 cargo test --lib proptests`.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::config::ConfigText;

const EXAMPLE: &str = include_str!("../../examples/gateway.toml");

/// Plans `text` as a candidate against nothing, timed.
fn plan_within_a_second(text: String) {
    let started = Instant::now();
    let candidate = ConfigText::inline(text, std::env::temp_dir(), "<proptest>");
    let plan = super::plan(&candidate, None);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "planning took {took:?}");
    // Every diagnostic names where it applies.
    for error in &plan.errors {
        assert!(!error.message.is_empty());
    }
}

/// One edit of a valid configuration: bytes removed at `at`, `insert`
/// put in their place.
fn mutated(at: usize, remove: usize, insert: &str) -> String {
    let mut text = EXAMPLE.to_owned();
    let mut start = at % (text.len() + 1);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + remove).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    text.replace_range(start..end, insert);
    text
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
        plan_within_a_second(text);
    }

    #[test]
    fn toml_shaped_text_never_panics(
        text in "(\\[{1,2}[a-z_.\"]{0,12}\\]{1,2}\n|[a-z_\"]{1,12} = (\"[^\"\n]{0,12}\"|[0-9]{1,6}|true|\\[\\]|\\{\\}|\\{ [a-z]+ = \"[a-z0-9:.]*\" \\})\n){0,30}"
    ) {
        plan_within_a_second(text);
    }

    #[test]
    fn mutated_example_never_panics(
        at in 0usize..4096,
        remove in 0usize..64,
        insert in prop_oneof![
            Just(String::new()),
            "[\\[\\]{}=\",.\n#a-z0-9 ]{0,16}",
            Just("\n[[routes]]\nname = \"x\"\nlisteners = [\"web\"]\n".to_owned()),
            Just("\n[upstreams.x]\nbackends = []\n".to_owned()),
            Just("\"\u{0}\u{feff}".to_owned()),
        ],
    ) {
        plan_within_a_second(mutated(at, remove, &insert));
    }
}

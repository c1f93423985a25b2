//! The reference documentation says what the code does: every diagnostic
//! code the code can emit is listed in `docs/config.md`, and every `ctl`
//! subcommand in `docs/admin-api.md`'s synopsis.

use std::collections::BTreeSet;

use cutover::config::Code;

use crate::harness::workspace;

fn doc(name: &str) -> String {
    std::fs::read_to_string(workspace().join("docs").join(name)).unwrap()
}

#[test]
fn the_diagnostic_codes_in_the_reference_are_the_codes_the_code_emits() {
    let text = doc("config.md");
    let table = text
        .split("## Diagnostic codes")
        .nth(1)
        .expect("docs/config.md has a Diagnostic codes section");
    let listed: Vec<&str> = table
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .collect();
    let emitted: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(listed, emitted, "docs/config.md's codes, in Code's order");
}

#[test]
fn the_ctl_synopsis_names_every_subcommand() {
    use clap::Args;
    let command = cutover::ctl::CtlArgs::augment_args(clap::Command::new("ctl"));
    let mut names = BTreeSet::new();
    for sub in command.get_subcommands() {
        let mut nested = sub.get_subcommands().peekable();
        if nested.peek().is_none() {
            names.insert(sub.get_name().to_owned());
        }
        for inner in nested {
            names.insert(format!("{} {}", sub.get_name(), inner.get_name()));
        }
    }
    let text = doc("admin-api.md");
    let synopsis = text
        .split("[--json] ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .expect("docs/admin-api.md has the ctl synopsis");
    let documented: BTreeSet<String> = synopsis.split('|').map(str::to_owned).collect();
    assert_eq!(documented, names, "the ctl synopsis in docs/admin-api.md");
    // And each has a row in the table below it.
    for name in &names {
        assert!(
            text.contains(&format!("| `{name}")) || text.contains(&format!(", `{name}")),
            "docs/admin-api.md has no row for ctl {name}"
        );
    }
}

/// The documentation speaks to users: no issue numbers (what a change
/// is for is said in words; the changelog and the issues keep the rest).
#[test]
fn the_docs_name_no_issue_numbers() {
    let dir = workspace().join("docs");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let numbered = lower.match_indices("issue ").any(|(at, _)| {
                lower[at + 6..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            });
            if numbered {
                found.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "issue numbers in the docs: {found:#?}");
}

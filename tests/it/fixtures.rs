//! Every fixture and example configuration is checked: valid ones
//! validate, invalid ones yield exactly their expected codes and lines.

use std::path::Path;
use std::process::Command;

use cutover::config::ConfigText;

use crate::harness::{workspace, BIN};

fn toml_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

#[test]
fn valid_fixtures_and_examples_validate() {
    let mut files = toml_files(&workspace().join("fixtures/configs/valid"));
    files.extend(toml_files(&workspace().join("examples")));
    for file in files {
        let text = ConfigText::read(&file).unwrap();
        if let Err(diagnostics) = cutover::plan::validate(&text) {
            panic!("{} should be valid: {diagnostics:#?}", file.display());
        }
    }
}

/// Each invalid fixture starts with `# expect: code@line ...`.
#[test]
fn invalid_fixtures_report_every_expected_error() {
    for file in toml_files(&workspace().join("fixtures/configs/invalid")) {
        let text = ConfigText::read(&file).unwrap();
        let expected: Vec<(String, usize)> = text
            .text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect:"))
            .unwrap_or_else(|| panic!("{} lacks an '# expect:' line", file.display()))
            .split_whitespace()
            .map(|item| {
                let (code, line) = item.split_once('@').expect("code@line");
                (code.to_owned(), line.parse().expect("line number"))
            })
            .collect();
        let diagnostics = cutover::plan::validate(&text).err().unwrap_or_default();
        let mut found: Vec<(String, usize)> = diagnostics
            .iter()
            .map(|d| (d.code.as_str().to_owned(), d.line.unwrap_or(0)))
            .collect();
        let mut expected_sorted = expected.clone();
        found.sort();
        expected_sorted.sort();
        assert_eq!(
            found,
            expected_sorted,
            "{}: {diagnostics:#?}",
            file.display()
        );
        assert!(
            diagnostics.iter().all(|d| d.column.is_some()),
            "{}: every diagnostic has a column",
            file.display()
        );
    }
}

#[test]
fn check_command_prints_file_line_column_and_exits_1() {
    let file = workspace().join("fixtures/configs/invalid/references.toml");
    let out = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "{}:10:12: unknown_upstream: route 'api' names upstream 'apii', which is not defined",
            file.display()
        )
    );
    assert!(stderr.contains(": 3 error(s)"), "{stderr}");

    let ok = Command::new(BIN)
        .args(["check", "-c"])
        .arg(workspace().join("examples/gateway.toml"))
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        stdout.contains(": ok: 1 listeners, 3 routes, 1 upstreams (sha256:"),
        "{stdout}"
    );
}

//! The module graph keeps the layering of `shared/STYLE.md`: no import
//! cycle between top-level modules of `src/`, `telemetry` imports none of
//! them, the data plane never imports the control plane, and `control`
//! never imports `fleet` (the fleet sits above it; `writer.rs` chooses).
//!
//! Read from the source: every `crate::module` a non-test line names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::harness::workspace;

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// `from → to → files of `from` that name `to``.
fn graph() -> Graph {
    let src = workspace().join("src");
    let modules: BTreeSet<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_stem()?.to_str()?.to_owned();
            (name != "lib" && name != "main").then_some(name)
        })
        .collect();
    let mut graph = Graph::new();
    let mut files = Vec::new();
    walk(&src, &mut files);
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let from = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|c| c.trim_end_matches(".rs").to_owned())
            .unwrap();
        if !modules.contains(&from) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Tests may reach anywhere: only the code above the first test
        // module counts.
        let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for to in named_modules(line) {
                if to != from && modules.contains(&to) {
                    graph
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_default()
                        .insert(relative.display().to_string());
                }
            }
        }
    }
    graph
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a line names: `crate::x…` and the members of
/// `use crate::{x, y::…}`.
fn named_modules(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in line.match_indices("crate::") {
        let rest = &line[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            out.extend(
                group
                    .split(',')
                    .filter_map(|item| item.trim().split("::").next())
                    .map(str::to_owned),
            );
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// Every cycle's members (strongly connected components of two or more).
fn cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = graph
        .keys()
        .chain(graph.values().flat_map(|t| t.keys()))
        .collect();
    let reaches = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for next in graph.get(&node).into_iter().flat_map(|t| t.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reaches(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for node in &nodes {
        let component: BTreeSet<String> = nodes
            .iter()
            .filter(|other| reach[*node].contains(**other) && reach[**other].contains(*node))
            .map(|n| (*n).clone())
            .collect();
        if component.len() > 1 && !out.contains(&component) {
            out.push(component);
        }
    }
    out
}

fn edges<'a>(graph: &'a Graph, from: &str, to: &[&str]) -> Vec<(&'a String, &'a BTreeSet<String>)> {
    graph
        .get(from)
        .into_iter()
        .flat_map(|targets| targets.iter())
        .filter(|(target, _)| to.contains(&target.as_str()))
        .collect()
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let graph = graph();
    assert!(
        graph.contains_key("proxy"),
        "the graph was not read: {graph:?}"
    );
    let cycles = cycles(&graph);
    let explained: Vec<String> = cycles
        .iter()
        .map(|cycle| {
            let edges: Vec<String> = cycle
                .iter()
                .flat_map(|from| {
                    edges(
                        &graph,
                        from,
                        &cycle.iter().map(String::as_str).collect::<Vec<_>>(),
                    )
                    .into_iter()
                    .map(move |(to, files)| format!("{from} -> {to} ({files:?})"))
                })
                .collect();
            format!("{cycle:?}: {edges:#?}")
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles: {explained:#?}");
}

#[test]
fn the_layers_point_one_way() {
    let graph = graph();
    let everything: Vec<&str> = graph.keys().map(String::as_str).collect();
    let mut broken = Vec::new();
    let rules: [(&str, &[&str], &str); 7] = [
        (
            "telemetry",
            &everything,
            "telemetry is the floor: it imports none of the others (they push what a scrape needs)",
        ),
        (
            "control",
            &["fleet", "admin", "writer", "lifecycle"],
            "control is below the fleet, the writer, admin and lifecycle",
        ),
        (
            "fleet",
            &["admin", "writer", "lifecycle"],
            "the fleet is below the writer",
        ),
        (
            "proxy",
            &["config", "control", "fleet", "admin", "writer", "lifecycle"],
            "the data plane never imports the control plane",
        ),
        (
            "generation",
            &[
                "config",
                "control",
                "fleet",
                "admin",
                "writer",
                "runtime",
                "proxy",
                "lifecycle",
            ],
            "a generation knows nothing above it",
        ),
        (
            "backends",
            &[
                "config",
                "control",
                "fleet",
                "admin",
                "writer",
                "generation",
                "runtime",
                "proxy",
                "lifecycle",
            ],
            "backend state knows nothing of generations",
        ),
        (
            "discovery",
            &[
                "control",
                "fleet",
                "admin",
                "writer",
                "generation",
                "runtime",
                "proxy",
                "lifecycle",
            ],
            "discovery publishes members; it knows nothing of the generations that follow them",
        ),
    ];
    for (from, forbidden, why) in rules {
        for (to, files) in edges(&graph, from, forbidden) {
            broken.push(format!("{from} -> {to} in {files:?}: {why}"));
        }
    }
    for admission_target in ["config", "control", "fleet", "admin", "writer", "proxy"] {
        for (to, files) in edges(&graph, "admission", &[admission_target]) {
            broken.push(format!(
                "admission -> {to} in {files:?}: admission only pins generations"
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

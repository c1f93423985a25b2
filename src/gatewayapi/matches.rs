//! Hostnames, matches and path changes of HTTPRoute rules, as cutover
//! matchers.

use std::collections::{BTreeMap, BTreeSet};

use super::routes::{literal, Path};
use super::status::{unsupported, Condition};
use super::{toml_str, Fields};

/// The hostnames a route serves on a listener: `{None}` for any host,
/// empty when none intersect.
pub(super) fn intersect(listener: Option<&str>, route: &[String]) -> BTreeSet<Option<String>> {
    let mut out = BTreeSet::new();
    match (listener, route.is_empty()) {
        (None, true) => {
            out.insert(None);
        }
        (None, false) => out.extend(route.iter().cloned().map(Some)),
        (Some(l), true) => {
            out.insert(Some(l.to_owned()));
        }
        (Some(l), false) => {
            for h in route {
                if let Some(both) = meet(l, h) {
                    out.insert(Some(both));
                }
            }
        }
    }
    out
}

/// Where two hostnames (either may be a `*.` wildcard) meet: the more
/// specific of the two, or `None`.
pub(super) fn meet(a: &str, b: &str) -> Option<String> {
    let covers = |wild: &str, name: &str| {
        wild.strip_prefix('*')
            .is_some_and(|suffix| name.len() > suffix.len() && name.ends_with(suffix))
    };
    if a == b {
        Some(a.to_owned())
    } else if covers(a, b) {
        Some(b.to_owned())
    } else if covers(b, a) {
        Some(a.to_owned())
    } else {
        None
    }
}

pub(super) struct MatchParts {
    pub(super) path: Path,
    pub(super) method: Option<String>,
    pub(super) headers: BTreeMap<String, String>,
    pub(super) query: BTreeMap<String, String>,
}

pub(super) fn route_match(m: &Fields<'_>) -> Result<MatchParts, Vec<Condition>> {
    let mut problems = Vec::new();
    let path = match m.object("path") {
        Some(p) => {
            let value = p.str("value").unwrap_or("/").to_owned();
            let kind = p.str("type").unwrap_or("PathPrefix");
            for field in p.rest() {
                problems.push(unsupported(&field));
            }
            match kind {
                "Exact" => Path::Exact(value),
                "PathPrefix" => {
                    let trimmed = value.trim_end_matches('/');
                    if trimmed.is_empty() {
                        Path::Any
                    } else {
                        Path::Prefix(trimmed.to_owned())
                    }
                }
                "RegularExpression" => Path::Regex(value),
                other => {
                    problems.push(Condition::no(
                        "Accepted",
                        "UnsupportedValue",
                        format!("{}: path match type {other:?}", p.path()),
                    ));
                    Path::Any
                }
            }
        }
        None => Path::Any,
    };
    let headers = matchers(m, "headers", &mut problems);
    let query = matchers(m, "queryParams", &mut problems);
    let method = m.str("method").map(str::to_owned);
    for field in m.rest() {
        problems.push(unsupported(&field));
    }
    if problems.is_empty() {
        Ok(MatchParts {
            path,
            method,
            headers,
            query,
        })
    } else {
        Err(problems)
    }
}

/// Header or query matchers (`key`) of a match, as cutover writes them.
fn matchers(m: &Fields<'_>, key: &str, problems: &mut Vec<Condition>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for h in m.list(key) {
        let name = h.str("name").unwrap_or_default();
        let name = if key == "headers" {
            name.to_ascii_lowercase()
        } else {
            name.to_owned()
        };
        let value = h.str("value").unwrap_or_default();
        let matcher = match h.str("type").unwrap_or("Exact") {
            "Exact" if value == "*" || value.starts_with('~') => format!("~^{}$", escape(value)),
            "Exact" => value.to_owned(),
            "RegularExpression" => format!("~{value}"),
            other => {
                problems.push(Condition::no(
                    "Accepted",
                    "UnsupportedValue",
                    format!("{}: match type {other:?}", h.path()),
                ));
                continue;
            }
        };
        for field in h.rest() {
            problems.push(unsupported(&field));
        }
        // The first entry of a name counts (the API's rule).
        out.entry(name).or_insert(matcher);
    }
    out
}

/// A GRPCRoute match: the method as the call's path (`/service/method`)
/// and headers (metadata).
pub(super) fn grpc_match(m: &Fields<'_>) -> Result<MatchParts, Vec<Condition>> {
    let mut problems = Vec::new();
    let path = match m.object("method") {
        Some(method) => {
            let kind = method.str("type").unwrap_or("Exact");
            let service = method.str("service");
            let name = method.str("method");
            for field in method.rest() {
                problems.push(unsupported(&field));
            }
            match (kind, service, name) {
                (_, None, None) => Path::Any,
                ("Exact", Some(s), Some(n)) => Path::Exact(format!("/{s}/{n}")),
                ("Exact", Some(s), None) => Path::Prefix(format!("/{s}")),
                ("Exact", None, Some(n)) => Path::Regex(format!("^/[^/]+/{}$", escape(n))),
                ("RegularExpression", s, n) => Path::Regex(format!(
                    "^/(?:{})/(?:{})$",
                    s.unwrap_or("[^/]+"),
                    n.unwrap_or("[^/]+")
                )),
                (other, _, _) => {
                    problems.push(Condition::no(
                        "Accepted",
                        "UnsupportedValue",
                        format!("{}: method match type {other:?}", method.path()),
                    ));
                    Path::Any
                }
            }
        }
        None => Path::Any,
    };
    let headers = matchers(m, "headers", &mut problems);
    for field in m.rest() {
        problems.push(unsupported(&field));
    }
    if problems.is_empty() {
        Ok(MatchParts {
            path,
            method: None,
            headers,
            query: BTreeMap::new(),
        })
    } else {
        Err(problems)
    }
}

/// A rule's path change: `URLRewrite` or `RequestRedirect`'s `path`.
#[derive(Debug, Clone)]
pub(super) enum PathEdit {
    Full(String),
    Prefix(String),
    /// A redirect's other parts, and its path change.
    Redirect(Vec<(String, String)>, Option<Box<PathEdit>>),
}

pub(super) struct Redirect(pub(super) Vec<(String, String)>);

#[derive(Default)]
pub(super) struct Edited {
    pub(super) rewrite: Option<(String, String)>,
    pub(super) redirect: Option<Redirect>,
}

/// A match's path as cutover matchers (a prefix is matched by path
/// element: `/foo` takes `/foo` and `/foo/…`, not `/foobar`), each with
/// its rewrite or redirect.
pub(super) fn split_path(path: &Path, edit: Option<&PathEdit>) -> Vec<(Path, Edited)> {
    let (redirect, edit) = match edit {
        Some(PathEdit::Redirect(parts, edit)) => (Some(parts.clone()), edit.as_deref()),
        other => (None, other),
    };
    let prefix_of = |p: &str| p.trim_end_matches('/').to_owned();
    // (matcher, how the path after the match's prefix is written)
    let pieces: Vec<(Path, Option<String>)> = match path {
        Path::Prefix(p) => vec![
            (Path::Exact(p.clone()), Some(String::new())),
            (Path::Prefix(format!("{p}/")), Some("/".into())),
        ],
        Path::Any => vec![(Path::Any, Some(String::new()))],
        other => vec![(other.clone(), None)],
    };
    pieces
        .into_iter()
        .map(|(matcher, _)| {
            let mut edited = Edited::default();
            // The path written, as a regex replacement over the whole path.
            let new_path: Option<(String, String)> = match (edit, &matcher, path) {
                (Some(PathEdit::Full(full)), _, _) => Some(("^.*$".into(), dollar(full))),
                (Some(PathEdit::Prefix(to)), Path::Exact(_), Path::Prefix(_)) => {
                    let to = if to.is_empty() {
                        "/".to_owned()
                    } else {
                        to.clone()
                    };
                    Some(("^.*$".into(), dollar(&to)))
                }
                (Some(PathEdit::Prefix(to)), Path::Prefix(p), Path::Prefix(_)) => {
                    let cut = escape(p.trim_end_matches('/'));
                    Some((
                        format!("^{cut}/(.*)$"),
                        format!("{}/${{1}}", dollar(&prefix_of(to))),
                    ))
                }
                (Some(PathEdit::Prefix(to)), Path::Any, _) => Some((
                    "^/(.*)$".into(),
                    format!("{}/${{1}}", dollar(&prefix_of(to))),
                )),
                _ => None,
            };
            match redirect.clone() {
                Some(mut parts) => {
                    if let Some((_, replacement)) = &new_path {
                        // A redirect's path is a template, not a regex
                        // replacement: only a full path is written.
                        if !replacement.contains("${1}") {
                            parts.push((
                                "path".into(),
                                toml_str(&literal(&replacement.replace("$$", "$"))),
                            ));
                        } else if let (Path::Prefix(p), Some(PathEdit::Prefix(to))) =
                            (&matcher, edit)
                        {
                            let _ = p;
                            parts.push((
                                "replace_prefix".into(),
                                toml_str(&literal(&format!("{}/", prefix_of(to)))),
                            ));
                        } else if let (Path::Any, Some(PathEdit::Prefix(to))) = (&matcher, edit) {
                            parts.push((
                                "path".into(),
                                toml_str(&format!("{}{{path}}", literal(&prefix_of(to)))),
                            ));
                        }
                    }
                    edited.redirect = Some(Redirect(parts));
                }
                None => edited.rewrite = new_path,
            }
            (matcher, edited)
        })
        .collect()
}

/// A literal as a regex.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `$` written for a regex replacement.
pub(super) fn dollar(s: &str) -> String {
    s.replace('$', "$$")
}

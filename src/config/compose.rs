//! Fleet composition (DESIGN §15): an instance's own file keeps the
//! startup-owned part (process settings, listeners and their binds, admin,
//! metrics, `[fleet]`); the fleet's shared document brings the
//! generation-owned domains. The composed text is what each instance plans,
//! with the same code as any candidate.

use toml_edit::{DocumentMut, Item};

use super::{Code, Diagnostic, SourceMap};

/// What a shared document may hold: routes, upstreams and `log.level`.
pub const SHARED_DOMAINS: &str = "routes, upstreams and log.level";

/// Checks that `shared` is a well-formed shared document: TOML whose top
/// level holds only `routes`, `upstreams` and `log` (with only `level`).
/// Every problem is reported, located in `shared`.
pub fn check_shared(shared: &str) -> Result<DocumentMut, Vec<Diagnostic>> {
    let map = SourceMap::new(shared, None);
    let locate = |diagnostic: Diagnostic, span: Option<std::ops::Range<usize>>| {
        let (line, column) = span.map(|s| map.line_column(s.start)).unzip();
        Diagnostic {
            line,
            column,
            ..diagnostic
        }
    };
    let document = toml_edit::Document::parse(shared).map_err(|e| {
        vec![locate(
            Diagnostic::new(Code::InvalidToml, "", e.message().trim().to_owned()),
            e.span(),
        )]
    })?;
    let mut errors = Vec::new();
    let not_shared = |path: String| {
        Diagnostic::new(
            Code::NotShared,
            path.clone(),
            format!(
                "'{path}' belongs in each instance's own file, not in the fleet's shared document (which holds {SHARED_DOMAINS})"
            ),
        )
    };
    for (key, item) in document.iter() {
        let span = document.key(key).and_then(toml_edit::Key::span);
        match key {
            "routes" | "upstreams" => {}
            "log" => match item.as_table_like() {
                Some(log) => {
                    for (inner, _) in log.iter().filter(|(k, _)| *k != "level") {
                        let span = log.key(inner).and_then(toml_edit::Key::span);
                        errors.push(locate(not_shared(format!("log.{inner}")), span));
                    }
                }
                None => errors.push(locate(
                    Diagnostic::new(Code::InvalidType, "log", "log must be a table"),
                    span,
                )),
            },
            other => errors.push(locate(not_shared(other.to_owned()), span)),
        }
    }
    if errors.is_empty() {
        Ok(document.into_mut())
    } else {
        Err(errors)
    }
}

/// The configuration an instance plans for a shared document: its own
/// file with `routes`, `upstreams` and `log.level` replaced by the shared
/// document's (absent there means none, and the default level).
pub fn compose(instance: &str, shared: &str) -> Result<String, Vec<Diagnostic>> {
    let shared = check_shared(shared)?;
    let mut composed: DocumentMut = instance.parse().map_err(|e: toml_edit::TomlError| {
        vec![Diagnostic::new(
            Code::InvalidToml,
            "",
            format!("the instance file: {}", e.message().trim()),
        )]
    })?;
    composed.remove("routes");
    composed.remove("upstreams");
    if let Some(log) = composed.get_mut("log").and_then(Item::as_table_like_mut) {
        log.remove("level");
    }
    for (key, item) in shared.iter() {
        if key == "log" {
            let level = item
                .as_table_like()
                .and_then(|log| log.get("level"))
                .cloned();
            if let Some(level) = level {
                let log = composed
                    .entry("log")
                    .or_insert_with(toml_edit::table)
                    .as_table_like_mut();
                if let Some(log) = log {
                    log.insert("level", level);
                }
            }
        } else {
            composed.insert(key, item.clone());
        }
    }
    Ok(composed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    const INSTANCE: &str = r#"
[admin]
bind = "127.0.0.1:9190"

[log]
level = "warn"
format = "json"

[[listeners]]
name = "web"
bind = "127.0.0.1:8080"

[[routes]]
name = "seed"
listeners = ["web"]
upstream = "seed"

[upstreams.seed]
backends = [{ addr = "127.0.0.1:9000" }]

[fleet]
endpoints = ["127.0.0.1:2379"]
prefix = "/cutover/test"
instance = "a"
"#;

    #[test]
    fn the_shared_document_replaces_routes_upstreams_and_the_level() {
        let shared = r#"
log.level = "debug"
routes = [{ name = "api", listeners = ["web"], upstream = "api" }]

[upstreams.api]
backends = [{ addr = "127.0.0.1:9001" }]
"#;
        let text = compose(INSTANCE, shared).unwrap();
        let file = parse(&text).unwrap();
        assert_eq!(file.log.level, "debug");
        assert_eq!(file.log.format, "json");
        assert_eq!(file.routes.len(), 1);
        assert_eq!(file.routes[0].name, "api");
        assert_eq!(file.upstreams.keys().collect::<Vec<_>>(), ["api"]);
        assert_eq!(file.listeners[0].name, "web");
        assert_eq!(file.fleet.unwrap().instance.as_deref(), Some("a"));
    }

    #[test]
    fn array_of_tables_and_no_level_compose_too() {
        let shared = r#"
[[routes]]
name = "api"
listeners = ["web"]
upstream = "api"

[upstreams.api]
backends = [{ addr = "127.0.0.1:9001" }]

[[routes]]
name = "b"
listeners = ["web"]
upstream = "api"
"#;
        let file = parse(&compose(INSTANCE, shared).unwrap()).unwrap();
        assert_eq!(file.log.level, "info", "absent: the default level");
        let names: Vec<_> = file.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["api", "b"]);
    }

    #[test]
    fn instance_owned_keys_in_the_shared_document_are_refused_with_their_place() {
        let shared = "[admin]\nbind = \"0.0.0.0:1\"\n\n[log]\nlevel = \"info\"\nfile = \"x\"\n\n[[listeners]]\nname = \"x\"\n";
        let errors = check_shared(shared).unwrap_err();
        let found: Vec<_> = errors
            .iter()
            .map(|d| (d.code.as_str(), d.path.as_str(), d.line))
            .collect();
        assert_eq!(
            found,
            [
                ("not_shared", "admin", Some(1)),
                ("not_shared", "log.file", Some(6)),
                ("not_shared", "listeners", Some(8)),
            ]
        );
        assert!(errors[0].message.contains("each instance's own file"));
    }

    #[test]
    fn a_syntax_error_is_located() {
        let errors = check_shared("[[routes]]\nname = \n").unwrap_err();
        assert_eq!(errors[0].code, "invalid_toml");
        assert_eq!(errors[0].line, Some(2));
    }
}

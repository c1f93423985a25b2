//! The configuration file format: `config.toml → FileConfig`.
//!
//! Takes TOML text, returns typed [`FileConfig`] values or every
//! [`Diagnostic`] found on the way. Syntax errors come from the TOML
//! parser's recovering mode; each top-level section and each element of
//! `listeners`, `routes` and `upstreams` is then decoded on its own, so one
//! bad route does not hide a bad upstream further down. Meaning (durations,
//! references, addresses) is checked later by `plan::validate`.

mod diagnostic;
mod file;
mod source;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use toml::de::{DeTable, DeValue, ValueDeserializer};
use toml::Spanned;

pub use diagnostic::Diagnostic;
pub use file::*;
pub use source::SourceMap;

/// Configuration text together with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigText {
    /// The TOML text itself.
    pub text: String,
    /// The folder relative file references resolve against.
    pub base_dir: PathBuf,
    /// How to name the text in diagnostics (a path, or `<admin>`).
    pub origin: String,
}

impl ConfigText {
    /// Reads a configuration file from disk.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(Self {
            text,
            base_dir,
            origin: path.display().to_string(),
        })
    }

    /// Text that did not come from a file (an admin request body).
    pub fn inline(text: String, base_dir: PathBuf, origin: &str) -> Self {
        Self {
            text,
            base_dir,
            origin: origin.to_owned(),
        }
    }
}

/// Parses TOML text into a [`FileConfig`], reporting every problem found.
pub fn parse(text: &str) -> Result<FileConfig, Vec<Diagnostic>> {
    let (root, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        let map = SourceMap::new(text, None);
        return Err(syntax_errors
            .iter()
            .map(|e| toml_error("syntax_error", "", e, &map))
            .collect());
    }
    // Decoding consumes the parse tree, so positions found by path come
    // from a second parse, paid only by a configuration with errors.
    let map = SourceMap::new(text, None);
    let mut decoder = Decoder {
        map: &map,
        diagnostics: Vec::new(),
    };
    let mut config = FileConfig::default();
    for (key, value) in root.into_inner() {
        let key_name = key.get_ref().to_string();
        match key_name.as_str() {
            "admin" => decoder.section(&key_name, value, &mut config.admin),
            "log" => decoder.section(&key_name, value, &mut config.log),
            "runtime" => decoder.section(&key_name, value, &mut config.runtime),
            "metrics" => {
                let mut metrics = None;
                decoder.section(&key_name, value, &mut metrics);
                config.metrics = metrics;
            }
            "listeners" => config.listeners = decoder.array(&key_name, value),
            "routes" => config.routes = decoder.array(&key_name, value),
            "upstreams" => match value.into_inner() {
                DeValue::Table(table) => {
                    for (name, value) in table {
                        let path = format!("upstreams.{}", quote_key(name.get_ref()));
                        let mut upstream = None;
                        decoder.section(&path, value, &mut upstream);
                        if let Some(upstream) = upstream {
                            config
                                .upstreams
                                .insert(name.get_ref().to_string(), upstream);
                        }
                    }
                }
                _ => decoder.push(Diagnostic::new(
                    "invalid_type",
                    "upstreams",
                    "`upstreams` must be a table of named upstreams ([upstreams.NAME])",
                )),
            },
            other => {
                let mut d = Diagnostic::new(
                    "unknown_key",
                    other,
                    format!(
                        "unknown top-level key `{other}`; expected one of admin, metrics, log, runtime, listeners, routes, upstreams"
                    ),
                );
                let (line, column) = map.line_column(key.span().start);
                d.line = Some(line);
                d.column = Some(column);
                decoder.diagnostics.push(d);
            }
        }
    }
    if decoder.diagnostics.is_empty() {
        return Ok(config);
    }
    let mut diagnostics = decoder.diagnostics;
    if diagnostics.iter().any(|d| d.line.is_none()) {
        let map = SourceMap::new(text, DeTable::parse(text).ok());
        for d in diagnostics.iter_mut().filter(|d| d.line.is_none()) {
            if let Some((line, column)) = map.locate(&d.path) {
                d.line = Some(line);
                d.column = Some(column);
            }
        }
    }
    Err(diagnostics)
}

/// Serializes a configuration into its canonical text: defaults filled in,
/// keys in a fixed order, comments and formatting gone. Two texts that mean
/// the same configuration have the same canonical form.
pub fn canonical(config: &FileConfig) -> String {
    let mut text = toml::to_string(config)
        .unwrap_or_else(|e| format!("# unserializable configuration: {e}\n"));
    text.shrink_to_fit();
    text
}

struct Decoder<'m, 'a> {
    map: &'m SourceMap<'a>,
    diagnostics: Vec<Diagnostic>,
}

impl Decoder<'_, '_> {
    fn push(&mut self, d: Diagnostic) {
        self.diagnostics.push(d);
    }

    fn decode<T: DeserializeOwned>(
        &mut self,
        path: &str,
        value: Spanned<DeValue<'_>>,
    ) -> Option<T> {
        match T::deserialize(ValueDeserializer::from(value)) {
            Ok(v) => Some(v),
            Err(e) => {
                let code = if e.message().starts_with("unknown field") {
                    "unknown_key"
                } else if e.message().starts_with("missing field") {
                    "missing_key"
                } else {
                    "invalid_value"
                };
                let d = toml_error(code, path, &e, self.map);
                self.diagnostics.push(d);
                None
            }
        }
    }

    fn section<T: DeserializeOwned>(
        &mut self,
        path: &str,
        value: Spanned<DeValue<'_>>,
        out: &mut T,
    ) {
        if let Some(v) = self.decode(path, value) {
            *out = v;
        }
    }

    fn array<T: DeserializeOwned>(&mut self, key: &str, value: Spanned<DeValue<'_>>) -> Vec<T> {
        match value.into_inner() {
            DeValue::Array(items) => {
                // Sized up front: a configuration is kept for as long as
                // its generation, and growth by doubling wastes up to half.
                let mut out = Vec::with_capacity(items.len());
                out.extend(
                    items
                        .into_iter()
                        .enumerate()
                        .filter_map(|(i, item)| self.decode(&format!("{key}[{i}]"), item)),
                );
                out
            }
            _ => {
                self.push(Diagnostic::new(
                    "invalid_type",
                    key,
                    format!("`{key}` must be an array of tables ([[{key}]])"),
                ));
                Vec::new()
            }
        }
    }
}

fn toml_error(
    code: &'static str,
    path: &str,
    e: &toml::de::Error,
    map: &SourceMap<'_>,
) -> Diagnostic {
    let mut d = Diagnostic::new(code, path, e.message().trim().to_owned());
    if !path.is_empty() {
        d.message = format!("{path}: {}", d.message);
    }
    if let Some(span) = e.span() {
        let (line, column) = map.line_column(span.start);
        d.line = Some(line);
        d.column = Some(column);
    }
    d
}

/// Writes a key the way paths quote it: bare when it is a plain name.
pub fn quote_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        key.to_owned()
    } else {
        format!("\"{key}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_section_error_with_position() {
        let text = r#"
[admin]
bind = "127.0.0.1:0"
colour = "blue"

[[routes]]
name = "a"
upstream = 5

[[routes]]
name = "b"
mystery = true
"#;
        let errors = parse(text).err().unwrap_or_default();
        let found: Vec<_> = errors.iter().map(|d| (d.code, d.line)).collect();
        assert_eq!(
            found,
            vec![
                ("unknown_key", Some(4)),
                ("invalid_value", Some(8)),
                ("unknown_key", Some(12)),
            ]
        );
    }

    #[test]
    fn syntax_errors_have_positions() {
        let errors = parse("[admin\nbind = 1\n").err().unwrap_or_default();
        assert!(!errors.is_empty());
        assert!(errors
            .iter()
            .all(|d| d.code == "syntax_error" && d.line == Some(1)));
    }

    #[test]
    fn canonical_form_ignores_formatting() {
        let a = parse("[log]\nlevel = \"info\"  # default\n").unwrap_or_default();
        let b = parse("").unwrap_or_default();
        assert_eq!(canonical(&a), canonical(&b));
    }
}

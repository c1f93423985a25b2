//! The configuration file format: `config.toml → FileConfig`.
//!
//! Takes TOML text, returns typed [`FileConfig`] values or every
//! [`Diagnostic`] found on the way. Syntax errors come from the TOML
//! parser's recovering mode; each top-level section and each element of
//! `listeners`, `routes` and `upstreams` is then decoded on its own, so one
//! bad route does not hide a bad upstream further down. Meaning (durations,
//! references, addresses) is checked later by `plan::validate`.

mod compose;
mod diagnostic;
mod file;
mod route;
pub mod segments;
mod source;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use toml::de::{DeTable, DeValue, ValueDeserializer};
use toml::Spanned;

pub use compose::{check_shared, compose, SHARED_DOMAINS};
pub use diagnostic::{Code, Diagnostic};
pub use file::*;
pub use route::*;
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
    /// Only a regular file of at most `MAX_CONFIG_FILE` bytes is read.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        let text = crate::files::read_regular_text(path, crate::files::MAX_CONFIG_FILE)?;
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
    match parse_lenient(text) {
        Ok((config, unknown)) if unknown.is_empty() => Ok(config),
        Ok((_, unknown)) => Err(unknown),
        Err(diagnostics) => Err(diagnostics),
    }
}

/// As [`parse`], but a configuration whose only problems are unknown keys
/// is still returned, without them, beside their diagnostics: validation
/// can then report everything else about the same entities (a route with
/// a misspelt key and an unknown upstream shows both at once). Any other
/// problem is an `Err` with every diagnostic.
pub fn parse_lenient(text: &str) -> Result<(FileConfig, Vec<Diagnostic>), Vec<Diagnostic>> {
    let (root, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        let map = SourceMap::new(text, None);
        return Err(syntax_errors
            .iter()
            .map(|e| toml_error(Code::SyntaxError, "", e, &map))
            .collect());
    }
    // Decoding consumes the parse tree, so positions found by path come
    // from a second parse, paid only by a configuration with errors.
    let map = SourceMap::new(text, None);
    let mut decoder = Decoder {
        text,
        map: &map,
        diagnostics: Vec::new(),
        only_unknown_keys: true,
    };
    let mut config = FileConfig::default();
    for (key, value) in root.into_inner() {
        let key_name = key.get_ref().to_string();
        match key_name.as_str() {
            "admin" => decoder.section(&key_name, Locator::Section, value, &mut config.admin),
            "log" => decoder.section(&key_name, Locator::Section, value, &mut config.log),
            "tracing" => decoder.section(&key_name, Locator::Section, value, &mut config.tracing),
            "runtime" => decoder.section(&key_name, Locator::Section, value, &mut config.runtime),
            "metrics" => {
                let mut metrics = None;
                decoder.section(&key_name, Locator::Section, value, &mut metrics);
                config.metrics = metrics;
            }
            "discovery" => {
                let mut discovery = None;
                decoder.section(&key_name, Locator::Section, value, &mut discovery);
                config.discovery = discovery;
            }
            "fleet" => {
                let mut fleet = None;
                decoder.section(&key_name, Locator::Section, value, &mut fleet);
                config.fleet = fleet;
            }
            "cache" => {
                let mut cache = None;
                decoder.section(&key_name, Locator::Section, value, &mut cache);
                config.cache = cache;
            }
            "limits" => {
                let mut limits = None;
                decoder.section(&key_name, Locator::Section, value, &mut limits);
                config.limits = limits;
            }
            "waf" => {
                let mut waf = None;
                decoder.section(&key_name, Locator::Section, value, &mut waf);
                config.waf = waf;
            }
            "listeners" => config.listeners = decoder.array(&key_name, value),
            "routes" => config.routes = decoder.array(&key_name, value),
            "upstreams" => match value.into_inner() {
                DeValue::Table(table) => {
                    for (name, value) in table {
                        let path = format!("upstreams.{}", quote_key(name.get_ref()));
                        let mut upstream = None;
                        let at = Locator::Named(name.get_ref());
                        decoder.section(&path, at, value, &mut upstream);
                        if let Some(upstream) = upstream {
                            config
                                .upstreams
                                .insert(name.get_ref().to_string(), upstream);
                        }
                    }
                }
                _ => decoder.fail(Diagnostic::new(
                    Code::InvalidType,
                    "upstreams",
                    "`upstreams` must be a table of named upstreams ([upstreams.NAME])",
                )),
            },
            other => {
                let mut d = Diagnostic::new(
                    Code::UnknownKey,
                    other,
                    format!(
                        "unknown top-level key `{other}`; expected one of admin, metrics, log, tracing, runtime, discovery, listeners, routes, upstreams, fleet, cache, limits, waf"
                    ),
                );
                let (line, column) = map.line_column(key.span().start);
                d.line = Some(line);
                d.column = Some(column);
                decoder.diagnostics.push(d);
            }
        }
    }
    if decoder.only_unknown_keys {
        return Ok((config, decoder.diagnostics));
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

/// `diagnostics` with the line and column of their paths in `candidate`
/// (found by parsing it again: for the few found after validation).
pub fn locate(candidate: &ConfigText, mut diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    if diagnostics.is_empty() {
        return diagnostics;
    }
    let text = candidate.text.as_str();
    let map = SourceMap::new(text, DeTable::parse(text).ok());
    for d in &mut diagnostics {
        if let Some((line, column)) = map.locate(&d.path) {
            d.line = Some(line);
            d.column = Some(column);
        }
    }
    diagnostics
}

/// Serializes a configuration into its canonical text: defaults filled in,
/// keys in a fixed order, comments and formatting gone. Two texts that mean
/// the same configuration have the same canonical form.
pub fn canonical(config: &FileConfig) -> String {
    Canonical::of(config).text()
}

/// The canonical text in pieces: every section but the routes, the
/// upstreams, `[fleet]` and `[cache]`; each route; each upstream (by
/// name); then `[fleet]` and `[cache]`. Joined, they are exactly the whole configuration's canonical
/// text; apart, a route the candidate did not change keeps its piece (the
/// same allocation) from one generation to the next.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Canonical {
    pub head: String,
    pub routes: Vec<Arc<str>>,
    pub upstreams: Vec<Arc<str>>,
    pub tail: String,
}

impl Canonical {
    pub fn of(config: &FileConfig) -> Self {
        Self {
            head: canonical_head(config),
            routes: config.routes.iter().map(|r| canonical_route(r)).collect(),
            upstreams: config
                .upstreams
                .iter()
                .map(|(name, u)| canonical_upstream(name, u))
                .collect(),
            tail: canonical_tail(config),
        }
    }

    /// The pieces in order, each starting a table (the text joins them
    /// with one blank line).
    pub fn pieces(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.head.as_str())
            .chain(self.routes.iter().map(|r| &**r))
            .chain(self.upstreams.iter().map(|u| &**u))
            .chain(std::iter::once(self.tail.as_str()))
            .filter(|p| !p.is_empty())
    }

    /// Calls `out` with the text's bytes in order, without joining them.
    pub fn write(&self, mut out: impl FnMut(&str)) {
        for (i, piece) in self.pieces().enumerate() {
            if i > 0 {
                out("\n");
            }
            out(piece);
        }
    }

    pub fn text(&self) -> String {
        let mut text = String::with_capacity(self.pieces().map(|p| p.len() + 1).sum());
        self.write(|piece| text.push_str(piece));
        text
    }
}

fn to_toml<T: serde::Serialize>(value: &T) -> String {
    let mut text = toml::to_string(value).unwrap_or_else(|e| format!("# unserializable: {e}\n"));
    text.shrink_to_fit();
    text
}

/// Every section but the routes, the upstreams, `[fleet]` and `[cache]`.
pub fn canonical_head(config: &FileConfig) -> String {
    to_toml(&FileConfig {
        admin: config.admin.clone(),
        metrics: config.metrics.clone(),
        log: config.log.clone(),
        tracing: config.tracing.clone(),
        runtime: config.runtime.clone(),
        discovery: config.discovery.clone(),
        listeners: config.listeners.clone(),
        ..FileConfig::default()
    })
}

/// One route as the whole text has it (`[[routes]]` and its tables).
pub fn canonical_route(route: &FileRoute) -> Arc<str> {
    #[derive(serde::Serialize)]
    struct Piece<'a> {
        routes: [&'a FileRoute; 1],
    }
    to_toml(&Piece { routes: [route] }).into()
}

/// One upstream as the whole text has it (`[upstreams.NAME]`).
pub fn canonical_upstream(name: &str, upstream: &FileUpstream) -> Arc<str> {
    #[derive(serde::Serialize)]
    struct Piece<'a> {
        upstreams: std::collections::BTreeMap<&'a str, &'a FileUpstream>,
    }
    to_toml(&Piece {
        upstreams: std::iter::once((name, upstream)).collect(),
    })
    .into()
}

/// `[fleet]`, `[cache]` and `[limits]`, which the whole text writes
/// after the upstreams.
pub fn canonical_tail(config: &FileConfig) -> String {
    #[derive(serde::Serialize)]
    struct Piece<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        fleet: Option<&'a FileFleet>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache: Option<&'a FileCache>,
        #[serde(skip_serializing_if = "Option::is_none")]
        limits: Option<&'a FileLimits>,
        #[serde(skip_serializing_if = "Option::is_none")]
        waf: Option<&'a FileWaf>,
    }
    if config.fleet.is_none()
        && config.cache.is_none()
        && config.limits.is_none()
        && config.waf.is_none()
    {
        return String::new();
    }
    to_toml(&Piece {
        fleet: config.fleet.as_ref(),
        cache: config.cache.as_ref(),
        limits: config.limits.as_ref(),
        waf: config.waf.as_ref(),
    })
}

/// Where an entity is in the document, to find it again.
#[derive(Debug, Clone, Copy)]
enum Locator<'k> {
    /// A top-level table (`admin`, `log`, …), named by the path.
    Section,
    /// Element `i` of an array of tables (`listeners`, `routes`).
    Item(usize),
    /// `upstreams.NAME`.
    Named(&'k str),
}

struct Decoder<'m, 'a> {
    text: &'a str,
    map: &'m SourceMap<'a>,
    diagnostics: Vec<Diagnostic>,
    /// Every diagnostic so far is an unknown key, and every entity
    /// decoded once its unknown keys were set aside.
    only_unknown_keys: bool,
}

impl<'a> Decoder<'_, 'a> {
    fn fail(&mut self, d: Diagnostic) {
        self.only_unknown_keys = false;
        self.diagnostics.push(d);
    }

    fn decode<T: DeserializeOwned>(
        &mut self,
        path: &str,
        at: Locator<'_>,
        value: Spanned<DeValue<'_>>,
    ) -> Option<T> {
        let error = match T::deserialize(ValueDeserializer::from(value)) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        if !is_unknown_field(&error) {
            self.fail(toml_error(error_code(&error), path, &error, self.map));
            return None;
        }
        self.diagnostics
            .push(toml_error(Code::UnknownKey, path, &error, self.map));
        self.without_unknown_keys(path, at, &error)
    }

    /// Decodes the entity at `at` again from a fresh parse (the first
    /// decode consumed it; this is paid only by a configuration with an
    /// unknown key), setting aside each unknown key as it is reported.
    fn without_unknown_keys<T: DeserializeOwned>(
        &mut self,
        path: &str,
        at: Locator<'_>,
        first: &toml::de::Error,
    ) -> Option<T> {
        let recovered = (|| {
            let tree = DeTable::parse(self.text).ok()?.into_inner();
            let mut value = match (path.split(['[', '.']).next()?, at) {
                (section, Locator::Section) => tree.get(section)?.clone(),
                (key, Locator::Item(i)) => match tree.get(key)?.get_ref() {
                    DeValue::Array(items) => items.get(i)?.clone(),
                    _ => return None,
                },
                (_, Locator::Named(name)) => match tree.get("upstreams")?.get_ref() {
                    DeValue::Table(table) => table.get(name)?.clone(),
                    _ => return None,
                },
            };
            let mut span = first.span()?;
            // Bounded: each round removes one key.
            for _ in 0..256 {
                if !remove_key_at(value.get_mut(), span.start) {
                    return Some(Err(None));
                }
                match T::deserialize(ValueDeserializer::from(value.clone())) {
                    Ok(v) => return Some(Ok(v)),
                    Err(e) if is_unknown_field(&e) => {
                        span = e.span()?;
                        self.diagnostics
                            .push(toml_error(Code::UnknownKey, path, &e, self.map));
                    }
                    Err(e) => return Some(Err(Some(e))),
                }
            }
            Some(Err(None))
        })();
        match recovered {
            Some(Ok(v)) => Some(v),
            Some(Err(Some(e))) => {
                self.fail(toml_error(error_code(&e), path, &e, self.map));
                None
            }
            Some(Err(None)) | None => {
                self.only_unknown_keys = false;
                None
            }
        }
    }

    fn section<T: DeserializeOwned>(
        &mut self,
        path: &str,
        at: Locator<'_>,
        value: Spanned<DeValue<'_>>,
        out: &mut T,
    ) {
        if let Some(v) = self.decode(path, at, value) {
            *out = v;
        }
    }

    fn array<T: DeserializeOwned>(&mut self, key: &str, value: Spanned<DeValue<'_>>) -> Vec<T> {
        match value.into_inner() {
            DeValue::Array(items) => {
                // Sized up front: a configuration is kept for as long as
                // its generation, and growth by doubling wastes up to half.
                let mut out = Vec::with_capacity(items.len());
                out.extend(items.into_iter().enumerate().filter_map(|(i, item)| {
                    self.decode(&format!("{key}[{i}]"), Locator::Item(i), item)
                }));
                out
            }
            _ => {
                self.fail(Diagnostic::new(
                    Code::InvalidType,
                    key,
                    format!("`{key}` must be an array of tables ([[{key}]])"),
                ));
                Vec::new()
            }
        }
    }
}

fn is_unknown_field(e: &toml::de::Error) -> bool {
    e.message().starts_with("unknown field")
}

fn error_code(e: &toml::de::Error) -> Code {
    if is_unknown_field(e) {
        Code::UnknownKey
    } else if e.message().starts_with("missing field") {
        Code::MissingKey
    } else {
        Code::InvalidValue
    }
}

/// Removes the key that starts at byte `at` of the text, wherever it is
/// inside `value`; false when there is none.
fn remove_key_at(value: &mut DeValue<'_>, at: usize) -> bool {
    match value {
        DeValue::Table(table) => {
            let found = table
                .keys()
                .find(|key| key.span().start == at)
                .map(|key| key.get_ref().to_string());
            match found {
                Some(name) => table.remove(name.as_str()).is_some(),
                None => table
                    .iter_mut()
                    .any(|(_, v)| remove_key_at(v.get_mut(), at)),
            }
        }
        DeValue::Array(items) => items.iter_mut().any(|v| remove_key_at(v.get_mut(), at)),
        _ => false,
    }
}

fn toml_error(code: Code, path: &str, e: &toml::de::Error, map: &SourceMap<'_>) -> Diagnostic {
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
        let found: Vec<_> = errors.iter().map(|d| (d.code.as_str(), d.line)).collect();
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

    /// The pieces join into exactly what serializing the whole
    /// configuration at once writes, so versions do not change with how
    /// the text was put together.
    #[test]
    fn canonical_pieces_join_into_the_whole_serialization() {
        let folders = ["fixtures/configs/valid", "examples", "examples/kubernetes"];
        let mut checked = 0;
        for entry in folders
            .iter()
            .filter_map(|f| std::fs::read_dir(f).ok())
            .flatten()
        {
            let path = entry.expect("entry").path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let Ok(file) = parse(&text) else { continue };
            let whole = toml::to_string(&file).expect("serializes");
            assert_eq!(canonical(&file), whole, "{}", path.display());
            checked += 1;
        }
        assert!(checked >= 8, "only {checked} configurations checked");
    }

    #[test]
    fn canonical_form_ignores_formatting() {
        let a = parse("[log]\nlevel = \"info\"  # default\n").unwrap_or_default();
        let b = parse("").unwrap_or_default();
        assert_eq!(canonical(&a), canonical(&b));
    }
}

//! Diagnostics: one finding about a candidate configuration, as data.
//!
//! Every stage that can refuse a configuration (TOML parsing, section
//! decoding, semantic validation) produces [`Diagnostic`]s; the stage
//! collects all of them before failing, so an operator sees every problem
//! in one round trip. `path` is the document path (`routes[1].upstream`),
//! `line`/`column` are 1-based and resolved from the source text.

use serde::Serialize;

/// One problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Stable, machine-readable code (`unknown_upstream`, `invalid_duration`, ...).
    pub code: &'static str,
    /// Document path of the offending value, e.g. `routes[1].upstream`.
    pub path: String,
    /// Human-readable explanation naming the input that was refused.
    pub message: String,
    /// 1-based line in the source text, when the value could be located.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// 1-based column (in characters) in the source text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
}

impl Diagnostic {
    /// A diagnostic that has not been located in the source yet.
    pub fn new(code: &'static str, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            path: path.into(),
            message: message.into(),
            line: None,
            column: None,
        }
    }

    /// Formats as `FILE:LINE:COL: code: message`, the form `cutover check` prints.
    pub fn render(&self, file: &str) -> String {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                format!("{file}:{line}:{column}: {}: {}", self.code, self.message)
            }
            _ => format!("{file}: {}: {} (at {})", self.code, self.message, self.path),
        }
    }
}

//! Source positions: turns byte offsets and document paths into line and column.
//!
//! Takes the raw TOML text and its span-preserving parse tree; answers
//! "where is `routes[1].upstream`?" so that validation, which works on plain
//! typed values, can still point at the exact line and column.

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Line index plus the span-carrying parse tree of one configuration text.
pub struct SourceMap<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
    root: Option<Spanned<DeTable<'a>>>,
}

impl<'a> SourceMap<'a> {
    /// Indexes `text`; `root` is its parse tree when it parsed.
    pub fn new(text: &'a str, root: Option<Spanned<DeTable<'a>>>) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self {
            text,
            line_starts,
            root,
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = match self.line_starts.binary_search(&offset) {
            Ok(exact) => exact,
            Err(next) => next.saturating_sub(1),
        };
        let start = self.line_starts.get(line).copied().unwrap_or(0);
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line + 1, column + 1)
    }

    /// Span of the value at a document path such as `routes[1].upstream`
    /// or `upstreams.api.backends[0].addr`. Falls back to the nearest
    /// ancestor that exists, so a missing key points at its table.
    pub fn span_of(&self, path: &str) -> Option<Range<usize>> {
        let root = self.root.as_ref()?;
        let mut best = root.span();
        let mut current: Option<&DeValue<'_>> = None;
        let mut table: Option<&DeTable<'_>> = Some(root.get_ref());
        for segment in split_path(path) {
            let next = match (segment, table, current) {
                (Segment::Key(key), Some(t), _) => lookup(t, key),
                (Segment::Index(i), _, Some(DeValue::Array(items))) => items.get(i),
                _ => None,
            };
            let Some(next) = next else { break };
            best = next.span();
            current = Some(next.get_ref());
            table = match next.get_ref() {
                DeValue::Table(t) => Some(t),
                _ => None,
            };
        }
        Some(best)
    }

    /// Line and column of a document path, if it can be located.
    pub fn locate(&self, path: &str) -> Option<(usize, usize)> {
        self.span_of(path).map(|span| self.line_column(span.start))
    }
}

fn lookup<'t, 'i>(table: &'t DeTable<'i>, key: &str) -> Option<&'t Spanned<DeValue<'i>>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v)
}

enum Segment<'p> {
    Key(&'p str),
    Index(usize),
}

/// Splits `a.b[2].c` into `a`, `b`, `2`, `c`. Keys containing dots are
/// written quoted in paths we produce (`headers."x.y"`) and kept whole.
fn split_path(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').unwrap_or(after.len());
            if let Ok(i) = after[..end].parse() {
                out.push(Segment::Index(i));
            }
            rest = after.get(end + 1..).unwrap_or("");
        } else if let Some(after) = rest.strip_prefix('.') {
            rest = after;
        } else if let Some(after) = rest.strip_prefix('"') {
            let end = after.find('"').unwrap_or(after.len());
            out.push(Segment::Key(&after[..end]));
            rest = after.get(end + 1..).unwrap_or("");
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            out.push(Segment::Key(&rest[..end]));
            rest = &rest[end..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_nested_paths() {
        let text = "[a]\nx = 1\n\n[[routes]]\nname = \"r0\"\n\n[[routes]]\nname = \"r1\"\nupstream = \"u\"\n";
        let root = DeTable::parse(text).ok();
        let map = SourceMap::new(text, root);
        assert_eq!(map.locate("a.x"), Some((2, 5)));
        assert_eq!(map.locate("routes[1].upstream"), Some((9, 12)));
        // A missing key points at the closest existing ancestor.
        assert_eq!(map.locate("routes[1].missing").map(|l| l.0), Some(7));
    }

    #[test]
    fn columns_count_characters() {
        let text = "k = \"é\"\nv = 1\n";
        let map = SourceMap::new(text, None);
        assert_eq!(map.line_column(text.find('v').unwrap_or(0)), (2, 1));
    }
}

//! Segments: a configuration text cut into the pieces that parse alone.
//!
//! Takes TOML text; returns where each `[[routes]]` element and each
//! `[upstreams.NAME]` table begins and ends (with their sub-tables), and
//! the rest of the document. Each piece is valid TOML on its own and
//! decodes to the same value as in the whole document, so a candidate
//! whose route pieces are byte-for-byte those of the active configuration
//! need not parse, validate or compile them again (DESIGN §2, issue
//! "scale"). Cutting reads tokens (strings, comments and multi-line
//! arrays are the lexer's business), never values.
//!
//! A layout this does not recognise (quoted table names, a sub-table of an
//! upstream away from it, `[upstreams]` with inline members, a route's
//! sub-table before any route) gives `None`: the caller parses the whole
//! text, which is always correct and only slower.

use std::ops::Range;

use toml_parser::lexer::TokenKind;

/// Where the pieces of one configuration text are.
#[derive(Debug, Default, PartialEq)]
pub struct Segments {
    /// Everything that is neither a route nor an upstream, in order: the
    /// top-level keys first, then each other table with its sub-tables.
    pub rest: Vec<Range<usize>>,
    /// Each `[[routes]]` element, in order.
    pub routes: Vec<Range<usize>>,
    /// Each `[upstreams.NAME]` table, in order, with its name.
    pub upstreams: Vec<(String, Range<usize>)>,
}

/// What the table currently being read belongs to.
#[derive(Clone, Copy, PartialEq)]
enum Owner {
    Rest,
    Route,
    Upstream,
}

/// Cuts `text` into segments; `None` when its layout is not one this
/// recognises (see the module's documentation).
pub fn segment(text: &str) -> Option<Segments> {
    let source = toml_parser::Source::new(text);
    let mut tokens = source.lex().peekable();
    let mut out = Segments::default();
    let mut seen_upstreams = std::collections::HashSet::new();
    // The open piece: what it belongs to and where it starts.
    let mut owner = Owner::Rest;
    let mut start = 0;
    let mut upstream_name = String::new();
    let mut depth = 0usize;
    let mut line_start = true;
    while let Some(token) = tokens.next() {
        match token.kind() {
            TokenKind::Newline => {
                if depth == 0 {
                    line_start = true;
                }
                continue;
            }
            TokenKind::Whitespace | TokenKind::Comment => continue,
            TokenKind::Eof => break,
            TokenKind::LeftSquareBracket if line_start && depth == 0 => {}
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => {
                depth += 1;
                line_start = false;
                continue;
            }
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => {
                depth = depth.saturating_sub(1);
                line_start = false;
                continue;
            }
            _ => {
                line_start = false;
                continue;
            }
        }
        // A table header: `[key.path]` or `[[key.path]]`.
        let header_at = token.span().start();
        let array = tokens
            .next_if(|t| t.kind() == TokenKind::LeftSquareBracket)
            .is_some();
        let mut key: Vec<&str> = Vec::new();
        loop {
            let t = tokens.next()?;
            match t.kind() {
                TokenKind::Whitespace | TokenKind::Dot => {}
                TokenKind::Atom => key.push(text.get(t.span().start()..t.span().end())?),
                TokenKind::RightSquareBracket => break,
                // Quoted names and anything stranger: parse it whole.
                _ => return None,
            }
        }
        if array
            && tokens
                .next_if(|t| t.kind() == TokenKind::RightSquareBracket)
                .is_none()
        {
            return None;
        }
        line_start = false;
        let (next, name) = match (key.as_slice(), array) {
            (["routes"], true) => (Owner::Route, None),
            (["routes", ..], _) if owner == Owner::Route => continue,
            (["routes", ..], _) => return None,
            (["upstreams", name], false) => (Owner::Upstream, Some(*name)),
            (["upstreams", name, _, ..], _)
                if owner == Owner::Upstream && upstream_name == *name =>
            {
                continue
            }
            (["upstreams", ..], _) => return None,
            _ => (Owner::Rest, None),
        };
        close(&mut out, owner, start..header_at, &upstream_name);
        owner = next;
        start = header_at;
        if let Some(name) = name {
            if !seen_upstreams.insert(name) {
                return None;
            }
            upstream_name = name.to_owned();
        }
    }
    close(&mut out, owner, start..text.len(), &upstream_name);
    Some(out)
}

fn close(out: &mut Segments, owner: Owner, range: Range<usize>, upstream: &str) {
    match owner {
        Owner::Rest => match out.rest.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ if range.is_empty() => {}
            _ => out.rest.push(range),
        },
        Owner::Route => out.routes.push(range),
        Owner::Upstream => out.upstreams.push((upstream.to_owned(), range)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces<'t>(
        text: &'t str,
        s: &Segments,
    ) -> (Vec<&'t str>, Vec<&'t str>, Vec<(String, &'t str)>) {
        let at = |r: &Range<usize>| text.get(r.clone()).unwrap_or_default();
        (
            s.rest.iter().map(at).collect(),
            s.routes.iter().map(at).collect(),
            s.upstreams
                .iter()
                .map(|(n, r)| (n.clone(), at(r)))
                .collect(),
        )
    }

    const TEXT: &str = r#"# top
[admin]
bind = "127.0.0.1:0"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"
[listeners.limits]
max_headers = 10

[[routes]]
name = "a"
listeners = ["web"]
hosts = [
  "a.example.com",
[ "not a header" ],
]
respond = { body = """
[[routes]]
[upstreams.fake]
""" }
[routes.filters]
set_headers = { x = "1" }

[upstreams.u1]
backends = [{ addr = "127.0.0.1:1" }]
[upstreams.u1.health]
path = "/h"

[[routes]]
name = "b" # [[routes]]
upstream = 'u1'

[log]
level = "warn"
"#;

    #[test]
    fn routes_and_upstreams_are_cut_with_their_sub_tables() {
        let s = segment(TEXT).expect("recognised");
        let (rest, routes, upstreams) = pieces(TEXT, &s);
        assert_eq!(rest.len(), 2, "{rest:#?}");
        assert!(rest[0].starts_with("# top\n[admin]") && rest[0].contains("[listeners.limits]"));
        assert!(rest[1].starts_with("[log]"));
        assert_eq!(routes.len(), 2, "{routes:#?}");
        assert!(
            routes[0].contains("[ \"not a header\" ]") && routes[0].contains("[routes.filters]")
        );
        assert!(routes[1].starts_with("[[routes]]\nname = \"b\""));
        assert_eq!(upstreams.len(), 1);
        assert_eq!(upstreams[0].0, "u1");
        assert!(upstreams[0].1.contains("[upstreams.u1.health]"));
        // Every byte is in exactly one piece.
        let total: usize = s
            .rest
            .iter()
            .chain(&s.routes)
            .map(|r| r.len())
            .sum::<usize>()
            + s.upstreams.iter().map(|(_, r)| r.len()).sum::<usize>();
        assert_eq!(total, TEXT.len());
    }

    #[test]
    fn layouts_it_does_not_recognise_are_left_to_the_whole_parse() {
        for text in [
            "[routes.filters]\nx = 1\n",
            "[upstreams]\nu1 = { backends = [] }\n",
            "[upstreams.\"u1\"]\nbackends = []\n",
            "[upstreams.u1]\nbackends = []\n[upstreams.u2]\nbackends = []\n[upstreams.u1.health]\npath = \"/\"\n",
            "[upstreams.u1]\nbackends = []\n[upstreams.u1]\nbackends = []\n",
            "[[upstreams.u1]]\n",
        ] {
            assert_eq!(segment(text), None, "{text}");
        }
        assert!(segment("").is_some_and(|s| s == Segments::default()));
    }
}

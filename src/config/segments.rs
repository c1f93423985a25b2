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
    let mut out = Segments::default();
    cut_from(text, 0, &mut out, &|_| None)?;
    Some(out)
}

/// Cuts `text` from `from` (its start, or where a table starts) into
/// `out`, until a table starts at an offset `resume` names: then the
/// segment before it is closed and `resume`'s answer returned.
fn cut_from(
    text: &str,
    from: usize,
    out: &mut Segments,
    resume: &dyn Fn(usize) -> Option<usize>,
) -> Option<Option<usize>> {
    let source = toml_parser::Source::new(text.get(from..)?);
    let mut tokens = source.lex().peekable();
    let mut seen_upstreams = std::collections::HashSet::new();
    // The open piece: what it belongs to and where it starts.
    let mut owner = Owner::Rest;
    let mut start = from;
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
        let header_at = from + token.span().start();
        let array = tokens
            .next_if(|t| t.kind() == TokenKind::LeftSquareBracket)
            .is_some();
        let mut key: Vec<&str> = Vec::new();
        loop {
            let t = tokens.next()?;
            match t.kind() {
                TokenKind::Whitespace | TokenKind::Dot => {}
                TokenKind::Atom => {
                    key.push(text.get(from + t.span().start()..from + t.span().end())?)
                }
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
        close(out, owner, start..header_at, &upstream_name);
        if let Some(resumed) = resume(header_at) {
            return Some(Some(resumed));
        }
        owner = next;
        start = header_at;
        if let Some(name) = name {
            if !seen_upstreams.insert(name) {
                return None;
            }
            upstream_name = name.to_owned();
        }
    }
    close(out, owner, start..text.len(), &upstream_name);
    Some(None)
}

/// A text with its segments, kept so that the next text is cut only where
/// it differs (`segment_after`).
#[derive(Debug, Default, PartialEq)]
pub struct Cut {
    pub text: String,
    pub segments: Segments,
}

/// A text's segments, and which of them are byte for byte segments of the
/// text it was cut after (by their index there).
#[derive(Debug, PartialEq)]
pub struct Recut {
    pub segments: Segments,
    pub routes_from: Vec<Option<usize>>,
    pub upstreams_from: Vec<Option<usize>>,
}

/// Cuts `text`, which is mostly `before.text`: only from the last segment
/// that starts in their common prefix to the first that starts in their
/// common suffix is read; the segments around are `before`'s, moved by
/// the change in length. Gives what `segment` gives (the same ranges),
/// at the cost of the change instead of the text.
pub fn segment_after(text: &str, before: &Cut) -> Option<Recut> {
    let (old, new) = (before.text.as_bytes(), text.as_bytes());
    let prefix = common_prefix(old, new);
    let room = old.len().min(new.len()) - prefix;
    let suffix = common_suffix(old, new, room);
    // Every segment of `before`, by where it starts.
    #[derive(Clone, Copy)]
    enum Kind {
        Rest(usize),
        Route(usize),
        Upstream(usize),
    }
    let b = &before.segments;
    let mut starts: Vec<(usize, Kind)> = b
        .rest
        .iter()
        .enumerate()
        .map(|(i, r)| (r.start, Kind::Rest(i)))
        .chain(
            b.routes
                .iter()
                .enumerate()
                .map(|(i, r)| (r.start, Kind::Route(i))),
        )
        .chain(
            b.upstreams
                .iter()
                .enumerate()
                .map(|(i, (_, r))| (r.start, Kind::Upstream(i))),
        )
        .collect();
    starts.sort_by_key(|(start, _)| *start);
    // Read from the segment before the one the first changed byte is in:
    // what comes before it is unchanged, so the lexer is between tables
    // there, and its header is unchanged (the changed segment's header may
    // not be, or be gone, its bytes now the segment's before).
    let from = starts
        .partition_point(|(start, _)| *start < prefix)
        .saturating_sub(2);
    let read_from = starts.get(from).map_or(0, |(start, _)| *start);
    let mut out = Recut {
        segments: Segments::default(),
        routes_from: Vec::new(),
        upstreams_from: Vec::new(),
    };
    let keep = |out: &mut Recut, kind: Kind, shift: isize| {
        let moved = |r: &Range<usize>| {
            Some(r.start.checked_add_signed(shift)?..r.end.checked_add_signed(shift)?)
        };
        match kind {
            Kind::Rest(i) => {
                let r = moved(b.rest.get(i)?)?;
                close(&mut out.segments, Owner::Rest, r, "");
            }
            Kind::Route(i) => {
                out.segments.routes.push(moved(b.routes.get(i)?)?);
                out.routes_from.push(Some(i));
            }
            Kind::Upstream(i) => {
                let (name, r) = b.upstreams.get(i)?;
                out.segments.upstreams.push((name.clone(), moved(r)?));
                out.upstreams_from.push(Some(i));
            }
        }
        Some(())
    };
    for (_, kind) in starts.iter().take(from) {
        keep(&mut out, *kind, 0)?;
    }
    // Read until a table starts where one of `before`'s starts in the
    // common suffix: from there on, the segments are `before`'s.
    let shift = isize::try_from(new.len()).ok()? - isize::try_from(old.len()).ok()?;
    let suffix_from = new.len() - suffix;
    let resume = |at: usize| {
        let was = at.checked_add_signed(-shift)?;
        let i = starts
            .binary_search_by_key(&was, |(start, _)| *start)
            .ok()?;
        (at >= suffix_from).then_some(i)
    };
    let mut read = Segments::default();
    let stopped = cut_from(text, read_from, &mut read, &resume)?;
    for r in read.rest {
        close(&mut out.segments, Owner::Rest, r, "");
    }
    out.routes_from
        .extend(std::iter::repeat_n(None, read.routes.len()));
    out.segments.routes.extend(read.routes);
    out.upstreams_from
        .extend(std::iter::repeat_n(None, read.upstreams.len()));
    out.segments.upstreams.extend(read.upstreams);
    if let Some(i) = stopped {
        for (_, kind) in starts.iter().skip(i) {
            keep(&mut out, *kind, shift)?;
        }
    }
    // Names are checked across all the segments, as `segment` does.
    let mut names = std::collections::HashSet::new();
    if !out
        .segments
        .upstreams
        .iter()
        .all(|(name, _)| names.insert(name.as_str()))
    {
        return None;
    }
    Some(out)
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 4096;
    let mut at = 0;
    while let (Some(x), Some(y)) = (a.get(at..at + CHUNK), b.get(at..at + CHUNK)) {
        if x != y {
            break;
        }
        at += CHUNK;
    }
    at + a
        .get(at..)
        .unwrap_or_default()
        .iter()
        .zip(b.get(at..).unwrap_or_default())
        .take_while(|(x, y)| x == y)
        .count()
}

/// The length of the common suffix, at most `room`.
fn common_suffix(a: &[u8], b: &[u8], room: usize) -> usize {
    const CHUNK: usize = 4096;
    // The last `n` bytes of `s` without their last `skip`.
    fn tail(s: &[u8], n: usize, skip: usize) -> &[u8] {
        let end = s.len().saturating_sub(skip);
        s.get(end.saturating_sub(n)..end).unwrap_or_default()
    }
    let mut n = 0;
    while n + CHUNK <= room && tail(a, CHUNK, n) == tail(b, CHUNK, n) {
        n += CHUNK;
    }
    let (x, y) = (tail(a, room - n, n), tail(b, room - n, n));
    n + x
        .iter()
        .rev()
        .zip(y.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
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

    fn base() -> String {
        let mut text = String::from("# gateway\n[admin]\nbind = \"127.0.0.1:0\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n");
        for i in 0..40 {
            text.push_str(&format!("[[routes]]\nname = \"r{i}\"\nlisteners = [\"web\"]\nhosts = [\n  \"h{i}.example.com\",\n]\nupstream = \"u{}\"\n", i % 5));
            if i % 7 == 0 {
                text.push_str(&format!(
                    "[routes.filters]\nset_headers = {{ x = \"{i}\" }}\n"
                ));
            }
            if i == 20 {
                text.push_str("[log]\nlevel = \"warn\"\n");
            }
            text.push('\n');
        }
        for u in 0..5 {
            text.push_str(&format!("[upstreams.u{u}]\nbackends = [{{ addr = \"127.0.0.1:{u}\" }}]\n[upstreams.u{u}.health]\npath = \"/\"\n\n"));
        }
        text
    }

    /// Cutting after a text gives what cutting from scratch gives, and
    /// every segment it says is the earlier text's is that, byte for byte.
    #[test]
    fn cutting_after_a_text_gives_what_cutting_from_scratch_gives() {
        let before = base();
        let cut = Cut {
            segments: segment(&before).expect("cut"),
            text: before.clone(),
        };
        let route = |i: usize| {
            let at = before.find(&format!("name = \"r{i}\"")).expect("route");
            before[..at].rfind("[[routes]]").expect("header")
        };
        let edits: Vec<String> = vec![
            before.clone(),
            before.replace("name = \"r13\"", "name = \"r13b\""),
            before.replace("\"h0.example.com\"", "\"h0.example.org\""),
            before.replace("backends = [{ addr = \"127.0.0.1:4\" }]", "backends = []"),
            format!("{}[[routes]]\nname = \"new\"\nlisteners = [\"web\"]\nrespond = {{ body = \"x\" }}\n\n{}", &before[..route(9)], &before[route(9)..]),
            format!("{}{}", &before[..route(9)], &before[route(10)..]),
            format!("{}{}", &before[..route(0)], &before[route(39)..]),
            before.replace("[log]\nlevel = \"warn\"\n", ""),
            before.replace("[log]\nlevel = \"warn\"\n", "[log]\nlevel = \"warn\"\n[metrics]\nbind = \"127.0.0.1:0\"\n"),
            // A string opened in one route and closed in another.
            before.replace("upstream = \"u1\"\n\n[[routes]]\nname = \"r12\"", "upstream = \"\"\"u1\n\n[[routes]]\nname = \"r12\"\"\"\""),
            before.replace("[[routes]]\nname = \"r30\"", "[routes.extra]\nname = \"r30\""),
            before.replace("# gateway\n", ""),
            format!("{before}[upstreams.u9]\nbackends = []\n"),
            format!("{before}[upstreams.u0]\nbackends = []\n"),
            String::new(),
        ];
        for (n, text) in edits.iter().enumerate() {
            let scratch = segment(text);
            let after = segment_after(text, &cut);
            assert_eq!(
                after.as_ref().map(|r| &r.segments),
                scratch.as_ref(),
                "edit {n}"
            );
            let Some(after) = after else { continue };
            let same =
                |a: &Range<usize>, b: &Range<usize>| text.get(a.clone()) == before.get(b.clone());
            for (r, from) in after.segments.routes.iter().zip(&after.routes_from) {
                if let Some(j) = from {
                    assert!(same(r, &cut.segments.routes[*j]), "edit {n}: route {j}");
                }
            }
            for ((_, r), from) in after.segments.upstreams.iter().zip(&after.upstreams_from) {
                if let Some(j) = from {
                    assert!(
                        same(r, &cut.segments.upstreams[*j].1),
                        "edit {n}: upstream {j}"
                    );
                }
            }
            if n == 1 {
                let read = after.routes_from.iter().filter(|f| f.is_none()).count();
                // The changed route, and the one before it (whose end is
                // where a change at a table's start would move it).
                assert_eq!(read, 2, "only the changed route is read again");
            }
        }
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

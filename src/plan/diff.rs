//! The typed diff between two configurations, as plain data.
//!
//! Takes the active and the candidate `FileConfig`; returns one [`Change`]
//! per added, removed or modified entity (a listener, a route, an
//! upstream's backends, ...) down to field paths with from/to values, each
//! with its disposition (`live` or `restart_required`), plus a unified text
//! diff of the canonical texts. `flip` turns it around for a rollback.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ownership::needs_restart;
use crate::config::{quote_key, Canonical, FileConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    Modified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    Live,
    RestartRequired,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    pub path: String,
    pub from: Value,
    pub to: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub domain: Cow<'static, str>,
    pub name: String,
    pub change: ChangeKind,
    pub disposition: Disposition,
    pub fields: Vec<FieldChange>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub added: usize,
    pub removed: usize,
    pub modified: usize,
    pub restart_required: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Diff {
    pub changes: Vec<Change>,
    pub summary: Summary,
    pub text: String,
}

impl Diff {
    /// Whether the two configurations differ at all.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// Compares `from` (labelled `from_label` in the text diff) with `to`.
pub fn diff(
    from: &FileConfig,
    from_canonical: &Canonical,
    from_label: &str,
    to: &FileConfig,
    to_canonical: &Canonical,
) -> Diff {
    // The text diff of a large configuration costs about twice the typed
    // one: do both at once.
    let large = from.routes.len().max(to.routes.len()) >= super::PARALLEL_FROM_ROUTES;
    let (text, (a, b)) = super::in_parallel(
        large,
        || pieces_diff(from_canonical, from_label, to_canonical),
        || (split_domains(from, to), split_domains(to, from)),
    );
    let mut changes = Vec::new();
    for (key, before) in &a {
        match b.get(key) {
            None => changes.push(entity_change(key, before, &Value::Null)),
            Some(after) if after != before => changes.push(entity_change(key, before, after)),
            Some(_) => {}
        }
    }
    for (key, after) in &b {
        if !a.contains_key(key) {
            changes.push(entity_change(key, &Value::Null, after));
        }
    }
    let summary = summarize(&changes);
    Diff {
        changes,
        summary,
        text,
    }
}

/// The changes counted by what an operator names: one upstream added is
/// one added (not its `upstreams`, `backends` and `policies` entries).
/// An entity is added or removed when its own entry is, and modified
/// otherwise (a policy given to an existing route modifies the route);
/// `restart_required` counts the entities with a change that needs one.
fn summarize(changes: &[Change]) -> Summary {
    let mut entities: BTreeMap<(&str, &str), (Option<ChangeKind>, bool)> = BTreeMap::new();
    for c in changes {
        let (kind, name, own) = match (&*c.domain, c.name.as_str()) {
            ("upstreams", name) => ("upstream", name, true),
            ("backends", name) => ("upstream", name, false),
            ("routes", name) => ("route", name, true),
            ("policies", name) => match name.split_once('.') {
                Some(("upstreams", name)) => ("upstream", name, false),
                Some(("routes", name)) => ("route", name, false),
                _ => ("policies", name, true),
            },
            (domain, name) => (domain, name, true),
        };
        let entry = entities.entry((kind, name)).or_default();
        if own {
            entry.0 = Some(c.change);
        }
        entry.1 |= c.disposition == Disposition::RestartRequired;
    }
    let mut summary = Summary::default();
    for (change, restart) in entities.values() {
        match change {
            Some(ChangeKind::Added) => summary.added += 1,
            Some(ChangeKind::Removed) => summary.removed += 1,
            Some(ChangeKind::Modified) | None => summary.modified += 1,
        }
        summary.restart_required += usize::from(*restart);
    }
    summary
}

/// How long the text diff may search for the smallest edit.
const TEXT_DIFF_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// A unified diff of two texts, three lines of context, as `similar`'s
/// `TextDiff::unified_diff` writes it.
#[cfg(test)]
fn text_diff(from: &str, from_label: &str, to: &str) -> String {
    unified(&Lines::new(vec![from]), from_label, &Lines::new(vec![to]))
}

/// A unified diff of two canonical texts (see `unified`).
fn pieces_diff(from: &Canonical, from_label: &str, to: &Canonical) -> String {
    unified(
        &Lines::new(from.pieces().collect()),
        from_label,
        &Lines::new(to.pieces().collect()),
    )
}

/// A text as its pieces (a route's, an upstream's, …), each after the
/// first preceded by one blank line, as `Canonical::text` joins them.
struct Lines<'a> {
    pieces: Vec<&'a str>,
    /// The index of each piece's first line (its blank line, after the
    /// first piece) in the whole text.
    starts: Vec<usize>,
    total: usize,
    /// Where each line of a piece starts, for the pieces a hunk shows.
    offsets: std::cell::RefCell<std::collections::HashMap<usize, Vec<usize>>>,
}

impl<'a> Lines<'a> {
    fn new(pieces: Vec<&'a str>) -> Self {
        let mut starts = Vec::with_capacity(pieces.len());
        let mut total = 0;
        for (k, piece) in pieces.iter().enumerate() {
            starts.push(total);
            let newlines = memchr::memchr_iter(b'\n', piece.as_bytes()).count();
            let unterminated = usize::from(!piece.is_empty() && !piece.ends_with('\n'));
            total += usize::from(k > 0) + newlines + unterminated;
        }
        Self {
            pieces,
            starts,
            total,
            offsets: Default::default(),
        }
    }

    /// The line range of pieces `units`.
    fn span(&self, units: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let at = |k: usize| self.starts.get(k).copied().unwrap_or(self.total);
        at(units.start)..at(units.end)
    }

    /// The lines of piece `k`.
    fn piece_lines(&self, k: usize) -> impl Iterator<Item = &'a str> {
        let piece = self.pieces.get(k).copied().unwrap_or("");
        (k > 0)
            .then_some("\n")
            .into_iter()
            .chain(piece.split_inclusive('\n'))
    }

    /// Line `i` of the whole text.
    fn line(&self, i: usize) -> &'a str {
        let k = self.starts.partition_point(|&s| s <= i).saturating_sub(1);
        let mut n = i - self.starts.get(k).copied().unwrap_or(0);
        if k > 0 {
            if n == 0 {
                return "\n";
            }
            n -= 1;
        }
        let piece = self.pieces.get(k).copied().unwrap_or("");
        let mut offsets = self.offsets.borrow_mut();
        let starts = offsets.entry(k).or_insert_with(|| {
            std::iter::once(0)
                .chain(memchr::memchr_iter(b'\n', piece.as_bytes()).map(|at| at + 1))
                .filter(|&at| at < piece.len())
                .collect()
        });
        let start = starts.get(n).copied().unwrap_or(piece.len());
        let end = starts.get(n + 1).copied().unwrap_or(piece.len());
        piece.get(start..end).unwrap_or("")
    }
}

/// Appends `op`, merging it into the previous one when both are equal
/// runs that follow each other.
fn push_op(ops: &mut Vec<similar::DiffOp>, op: similar::DiffOp) {
    use similar::DiffOp::Equal;
    if let (
        Some(Equal { old_index, len, .. }),
        Equal {
            old_index: next,
            len: more,
            ..
        },
    ) = (ops.last_mut(), op)
    {
        if *old_index + *len == next {
            *len += more;
            return;
        }
    }
    ops.push(op);
}

/// `op` moved by `old` and `new` lines.
fn shifted(op: similar::DiffOp, old: usize, new: usize) -> similar::DiffOp {
    use similar::DiffOp::*;
    match op {
        Equal {
            old_index,
            new_index,
            len,
        } => Equal {
            old_index: old_index + old,
            new_index: new_index + new,
            len,
        },
        Delete {
            old_index,
            old_len,
            new_index,
        } => Delete {
            old_index: old_index + old,
            old_len,
            new_index: new_index + new,
        },
        Insert {
            old_index,
            new_index,
            new_len,
        } => Insert {
            old_index: old_index + old,
            new_index: new_index + new,
            new_len,
        },
        Replace {
            old_index,
            old_len,
            new_index,
            new_len,
        } => Replace {
            old_index: old_index + old,
            old_len,
            new_index: new_index + new,
            new_len,
        },
    }
}

/// The pieces' edits: in place when both texts have as many pieces (a
/// pipeline's usual change: entities edited where they are), otherwise
/// the smallest edit `similar` finds within the budget.
fn piece_ops(old: &[&str], new: &[&str], deadline: std::time::Instant) -> Vec<similar::DiffOp> {
    if old.len() != new.len() {
        return similar::capture_diff_slices_deadline(
            similar::Algorithm::Myers,
            old,
            new,
            Some(deadline),
        );
    }
    let mut ops = Vec::new();
    for (k, (a, b)) in old.iter().zip(new).enumerate() {
        let op = if a == b {
            similar::DiffOp::Equal {
                old_index: k,
                new_index: k,
                len: 1,
            }
        } else {
            similar::DiffOp::Replace {
                old_index: k,
                old_len: 1,
                new_index: k,
                new_len: 1,
            }
        };
        push_op(&mut ops, op);
    }
    ops
}

/// A unified diff, three lines of context, as `similar`'s
/// `TextDiff::unified_diff` writes it. Pieces are compared first, so that
/// only the lines of changed pieces are diffed: the cost follows the
/// change, not the configuration. Myers is quadratic in the worst case
/// (10 000 routes with the middle rewritten took 3 s): past its budget
/// `similar` finishes with a coarser diff, still correct, just with
/// larger hunks.
fn unified(old: &Lines<'_>, from_label: &str, new: &Lines<'_>) -> String {
    use std::fmt::Write as _;
    let deadline = std::time::Instant::now() + TEXT_DIFF_BUDGET;
    let pieces = piece_ops(&old.pieces, &new.pieces, deadline);
    if pieces.iter().all(|op| op.tag() == similar::DiffTag::Equal) {
        return String::new();
    }
    let mut ops = Vec::new();
    for op in pieces {
        let (tag, o, n) = op.as_tag_tuple();
        let (lo, ln) = (old.span(o.clone()), new.span(n.clone()));
        if tag == similar::DiffTag::Equal {
            push_op(
                &mut ops,
                similar::DiffOp::Equal {
                    old_index: lo.start,
                    new_index: ln.start,
                    len: lo.len(),
                },
            );
            continue;
        }
        let a: Vec<&str> = o.flat_map(|k| old.piece_lines(k)).collect();
        let b: Vec<&str> = n.flat_map(|k| new.piece_lines(k)).collect();
        let lines = similar::capture_diff_slices_deadline(
            similar::Algorithm::Myers,
            &a,
            &b,
            Some(deadline),
        );
        for op in lines {
            push_op(&mut ops, shifted(op, lo.start, ln.start));
        }
    }
    let mut out = format!("--- {from_label}\n+++ candidate\n");
    for hunk in similar::group_diff_ops(ops, 3) {
        let _ = writeln!(out, "{}", similar::udiff::UnifiedHunkHeader::new(&hunk));
        for op in &hunk {
            let (tag, o, n) = op.as_tag_tuple();
            match tag {
                similar::DiffTag::Equal => o.for_each(|i| put_line(&mut out, ' ', old.line(i))),
                similar::DiffTag::Delete => o.for_each(|i| put_line(&mut out, '-', old.line(i))),
                similar::DiffTag::Insert => n.for_each(|i| put_line(&mut out, '+', new.line(i))),
                similar::DiffTag::Replace => {
                    o.for_each(|i| put_line(&mut out, '-', old.line(i)));
                    n.for_each(|i| put_line(&mut out, '+', new.line(i)));
                }
            }
        }
    }
    out
}

fn put_line(out: &mut String, sign: char, line: &str) {
    out.push(sign);
    out.push_str(line);
    if !line.ends_with('\n') {
        out.push_str("\n\\ No newline at end of file\n");
    }
}

/// Where an entity lives: its domain, its name, and its path prefix.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct EntityKey {
    order: u8,
    domain: &'static str,
    name: String,
    path: String,
}

/// Cuts a configuration into comparable entities. Upstream backends and
/// policies are their own domains so that a pipeline can tell "traffic
/// shifted" from "routing changed" at a glance.
///
/// Listeners, routes and upstreams that are identical in `other` are left
/// out: they cannot differ, and converting thousands of unchanged routes
/// to JSON was most of the cost of planning a one-route change.
fn split_domains(config: &FileConfig, other: &FileConfig) -> BTreeMap<EntityKey, Value> {
    // A route the other side took over unchanged is the same allocation,
    // usually at the same index; names are unique on both sides, so a
    // route's counterpart is there or among the other's unaligned routes.
    let aligned = |i: usize, r: &std::sync::Arc<crate::config::FileRoute>, side: &FileConfig| {
        side.routes
            .get(i)
            .is_some_and(|o| std::sync::Arc::ptr_eq(o, r))
    };
    let same_routes: foldhash::HashMap<&str, &std::sync::Arc<crate::config::FileRoute>> = other
        .routes
        .iter()
        .enumerate()
        .filter(|(j, o)| !aligned(*j, o, config))
        .map(|(_, r)| (r.name.as_str(), r))
        .collect();
    let same_listeners: std::collections::HashMap<&str, &crate::config::FileListener> = other
        .listeners
        .iter()
        .map(|l| (l.name.as_str(), l))
        .collect();
    let mut out = BTreeMap::new();
    let mut put = |order: u8, domain: &'static str, name: &str, path: String, value: Value| {
        out.insert(
            EntityKey {
                order,
                domain,
                name: name.to_owned(),
                path,
            },
            value,
        );
    };
    put(0, "admin", "admin", "admin".into(), json(&config.admin));
    if let Some(metrics) = &config.metrics {
        put(1, "metrics", "metrics", "metrics".into(), json(metrics));
    }
    put(2, "log", "log", "log".into(), json(&config.log));
    put(
        2,
        "tracing",
        "tracing",
        "tracing".into(),
        json(&config.tracing),
    );
    put(
        3,
        "runtime",
        "runtime",
        "runtime".into(),
        json(&config.runtime),
    );
    if let Some(discovery) = &config.discovery {
        put(
            3,
            "discovery",
            "discovery",
            "discovery".into(),
            json(discovery),
        );
    }
    if let Some(cache) = &config.cache {
        put(3, "cache", "cache", "cache".into(), json(cache));
    }
    for l in &config.listeners {
        if same_listeners.get(l.name.as_str()) == Some(&l) {
            continue;
        }
        let mut v = json(l);
        strip(&mut v, &["name"]);
        put(
            4,
            "listeners",
            &l.name,
            format!("listeners.{}", quote_key(&l.name)),
            v,
        );
    }
    for (i, r) in config.routes.iter().enumerate() {
        if aligned(i, r, other)
            || same_routes
                .get(r.name.as_str())
                .is_some_and(|o| std::sync::Arc::ptr_eq(o, r) || o == &r)
        {
            continue;
        }
        let mut v = json(r);
        let policy = take(
            &mut v,
            &["timeout", "retry", "hedge", "quota", "max_inflight"],
        );
        strip(&mut v, &["name"]);
        let base = format!("routes.{}", quote_key(&r.name));
        put(5, "routes", &r.name, base.clone(), v);
        if !policy.is_empty() {
            put(
                8,
                "policies",
                &format!("routes.{}", r.name),
                base,
                Value::Object(policy),
            );
        }
    }
    for (name, u) in &config.upstreams {
        if other.upstreams.get(name) == Some(u) {
            continue;
        }
        let mut v = json(u);
        let backends: Map<String, Value> = u
            .backends
            .iter()
            .map(|b| {
                let mut v = json(b);
                strip(&mut v, &["addr", "dns", "srv", "endpoints_file"]);
                if b.addr.is_some() || b.dns.is_some() {
                    if let Value::Object(map) = &mut v {
                        map.insert("weight".into(), b.weight.unwrap_or(1).into());
                    }
                }
                (quote_key(&b.key()), v)
            })
            .collect();
        let policy = take(&mut v, &["policy", "hash_key", "health"]);
        strip(&mut v, &["backends"]);
        let base = format!("upstreams.{}", quote_key(name));
        put(6, "upstreams", name, base.clone(), v);
        put(
            7,
            "backends",
            name,
            format!("{base}.backends"),
            Value::Object(backends),
        );
        if !policy.is_empty() {
            put(
                8,
                "policies",
                &format!("upstreams.{name}"),
                base,
                Value::Object(policy),
            );
        }
    }
    out
}

fn json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn strip(value: &mut Value, keys: &[&str]) {
    if let Value::Object(map) = value {
        for k in keys {
            map.remove(*k);
        }
    }
}

fn take(value: &mut Value, keys: &[&str]) -> Map<String, Value> {
    let mut out = Map::new();
    if let Value::Object(map) = value {
        for k in keys {
            if let Some(v) = map.remove(*k) {
                out.insert((*k).to_owned(), v);
            }
        }
    }
    out
}

fn entity_change(key: &EntityKey, before: &Value, after: &Value) -> Change {
    let change = match (before.is_null(), after.is_null()) {
        (true, _) => ChangeKind::Added,
        (_, true) => ChangeKind::Removed,
        _ => ChangeKind::Modified,
    };
    let mut fields = Vec::new();
    match change {
        ChangeKind::Modified => flatten(&key.path, before, after, &mut fields),
        _ => fields.push(FieldChange {
            path: key.path.clone(),
            from: before.clone(),
            to: after.clone(),
        }),
    }
    // Removing a listener closes a socket: only a restart may do that.
    // Adding one is live: it is bound before the swap.
    let listener_removed = key.domain == "listeners" && change == ChangeKind::Removed;
    let restart = listener_removed
        || fields
            .iter()
            .any(|f| needs_restart(&f.path, &f.from, &f.to))
        || (change != ChangeKind::Modified
            && key.domain != "listeners"
            && needs_restart(&key.path, before, after));
    Change {
        domain: key.domain.into(),
        name: key.name.clone(),
        change,
        disposition: if restart {
            Disposition::RestartRequired
        } else {
            Disposition::Live
        },
        fields,
    }
}

/// Records every leaf that differs. Objects are walked key by key; arrays
/// and scalars are compared whole, since their elements have no names.
fn flatten(path: &str, before: &Value, after: &Value, out: &mut Vec<FieldChange>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let from = a.get(k).unwrap_or(&Value::Null);
                let to = b.get(k).unwrap_or(&Value::Null);
                if from != to {
                    flatten(&format!("{path}.{}", quote_key(k)), from, to, out);
                }
            }
        }
        _ if before != after => out.push(FieldChange {
            path: path.to_owned(),
            from: before.clone(),
            to: after.clone(),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    #[test]
    fn a_text_diff_rewritten_in_the_middle_keeps_to_its_budget() {
        let lines = |tag: &str| -> String {
            (0..20_000)
                .map(|i| {
                    if (5_000..15_000).contains(&i) {
                        format!("line {i} {tag}\n")
                    } else {
                        format!("line {i}\n")
                    }
                })
                .collect()
        };
        let (from, to) = (lines("old"), lines("new"));
        let started = std::time::Instant::now();
        let diff = text_diff(&from, "generation 1", &to);
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        // Coarser past the budget, never wrong: every changed line is in it.
        assert!(diff.contains("-line 5000 old\n") && diff.contains("+line 14999 new\n"));
        assert!(!diff.contains("-line 4000\n"));
    }

    #[test]
    fn text_diff_matches_similars_unified_diff() {
        let base: String = (0..60).map(|i| format!("line {i}\n")).collect();
        let edited = base
            .replace("line 3\n", "line three\n")
            .replace("line 30\n", "")
            .replace("line 50\n", "line 50\nline 50b\n");
        let cases = [
            (base.as_str(), edited.as_str()),
            ("a\nb\nc\n", "a\nb\nc"),
            ("a\nb", "a\nc"),
            ("", "x = 1\n"),
            ("x = 1\n", ""),
        ];
        for (from, to) in cases {
            let expected = similar::TextDiff::from_lines(from, to)
                .unified_diff()
                .context_radius(3)
                .header("generation 1", "candidate")
                .to_string();
            assert_eq!(
                text_diff(from, "generation 1", to),
                expected,
                "{from:?} -> {to:?}"
            );
        }
        assert_eq!(text_diff(&base, "generation 1", &base), "");
    }

    fn cfg(text: &str) -> FileConfig {
        parse(text).unwrap_or_else(|e| panic!("{e:?}"))
    }

    const BASE: &str = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:8080"

[[routes]]
name = "api"
listeners = ["web"]
upstream = "api"
timeout = "15s"

[upstreams.api]
backends = [{ addr = "127.0.0.1:9001" }]
"#;

    fn diff_texts(a: &str, b: &str) -> Diff {
        let (a, b) = (cfg(a), cfg(b));
        diff(
            &a,
            &Canonical::of(&a),
            "generation 1",
            &b,
            &Canonical::of(&b),
        )
    }

    #[test]
    fn identical_configs_have_no_changes() {
        let d = diff_texts(BASE, BASE);
        assert!(d.is_empty());
        assert!(d.text.is_empty());
    }

    /// The summary counts what an operator names: an upstream added with
    /// its backends and policy is one added (three change entries); a
    /// policy given to an existing route modifies that route.
    #[test]
    fn the_summary_counts_routes_and_upstreams_not_entries() {
        let added = format!(
            "{BASE}\n[upstreams.web2]\npolicy = \"least_request\"\nbackends = [{{ addr = \"127.0.0.1:9002\" }}]\n"
        );
        let d = diff_texts(BASE, &added);
        assert_eq!(d.changes.len(), 3, "{:?}", d.changes);
        assert_eq!(
            d.summary,
            Summary {
                added: 1,
                removed: 0,
                modified: 0,
                restart_required: 0
            }
        );
        let d = diff_texts(&added, BASE);
        assert_eq!((d.summary.added, d.summary.removed), (0, 1));
        let d = diff_texts(BASE, &BASE.replace("timeout = \"15s\"\n", ""));
        assert_eq!(
            (d.summary.removed, d.summary.modified),
            (0, 1),
            "{:?}",
            d.changes
        );
    }

    #[test]
    fn route_timeout_is_a_live_policy_change() {
        let d = diff_texts(BASE, &BASE.replace("\"15s\"", "\"5s\""));
        assert_eq!(d.changes.len(), 1);
        let c = &d.changes[0];
        assert_eq!(
            (c.domain.as_ref(), c.change, c.disposition),
            ("policies", ChangeKind::Modified, Disposition::Live)
        );
        assert_eq!(c.fields[0].path, "routes.api.timeout");
        assert_eq!(c.fields[0].from, Value::from("15s"));
        assert!(d.text.contains("-timeout = \"15s\""), "{}", d.text);
    }

    #[test]
    fn listener_bind_change_requires_restart() {
        let d = diff_texts(BASE, &BASE.replace("127.0.0.1:8080", "127.0.0.1:9090"));
        assert_eq!(d.summary.restart_required, 1);
        assert_eq!(d.changes[0].fields[0].path, "listeners.web.bind");
    }

    #[test]
    fn backend_changes_are_their_own_domain() {
        let d = diff_texts(
            BASE,
            &BASE.replace(
                "{ addr = \"127.0.0.1:9001\" }",
                "{ addr = \"127.0.0.1:9002\" }",
            ),
        );
        assert_eq!(d.changes.len(), 1);
        assert_eq!(d.changes[0].domain, "backends");
        assert_eq!(d.changes[0].disposition, Disposition::Live);
        assert_eq!(d.changes[0].fields.len(), 2);
    }

    #[test]
    fn adding_a_listener_is_live_removing_one_is_not() {
        let two = format!("{BASE}\n[[listeners]]\nname = \"extra\"\nbind = \"127.0.0.1:0\"\n");
        let added = diff_texts(BASE, &two);
        assert_eq!(added.summary.added, 1);
        assert_eq!(added.summary.restart_required, 0);
        let removed = diff_texts(&two, BASE);
        assert_eq!(removed.summary.removed, 1);
        assert_eq!(removed.summary.restart_required, 1);
    }
}

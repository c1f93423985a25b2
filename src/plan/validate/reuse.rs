//! Taking over what a candidate did not change (issue "scale").
//!
//! A candidate's text is cut into pieces (`config::segments`); a route or
//! upstream whose piece has the digest of one of the active
//! configuration's is not parsed again: it is the active one's decoded
//! value (the same allocation), with its canonical text. A route whose
//! piece, context (`route_context`) and files are unchanged is not
//! validated again either: its spec is the active one's, so the generation
//! built from it keeps the compiled route (`generation::build_from`). Anything
//! this cannot prove equal is parsed and validated as if it were new, and
//! a text whose layout is not cut parses whole: the result is always what
//! validating the text from scratch gives.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::*;
use crate::config::segments::{segment, segment_after, Cut, Recut, Segments};
use crate::config::Canonical;

/// The SHA-256 of `bytes`.
pub(crate) fn digest(bytes: &[u8]) -> Digest {
    Sha256::digest(bytes).into()
}

/// Digests are uniformly distributed: their first eight bytes are the
/// hash.
#[derive(Default)]
pub(super) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.iter().take(8).enumerate() {
            self.0 ^= u64::from(*b) << (8 * i);
        }
    }
}

type DigestMap<V> = HashMap<Digest, V, BuildHasherDefault<DigestHasher>>;

/// A candidate decoded, with where its pieces came from.
pub(super) struct Parsed {
    pub file: FileConfig,
    pub unknown_keys: Vec<Diagnostic>,
    /// Per route (aligned with `file.routes`) and per upstream: the digest
    /// of its source piece; `None` when the text was not cut.
    pub route_texts: Option<Vec<Digest>>,
    pub upstream_texts: Option<HashMap<String, Digest>>,
    /// Per route: the index of the active route with the same piece.
    pub from_active: Vec<Option<usize>>,
    /// Where the pieces are, when the text was cut.
    pub segments: Option<Segments>,
}

/// Decodes `text`, taking over from `active` every route and upstream
/// whose piece is unchanged. Errors are those of decoding the whole text.
pub(super) fn parse(text: &str, active: Option<&Spec>) -> Result<Parsed, Vec<Diagnostic>> {
    // Cut where it differs from the active text, when that is kept.
    let recut = match active.and_then(|a| a.pieces.cut.as_deref()) {
        Some(cut) => segment_after(text, cut),
        None => segment(text).map(|segments| Recut {
            routes_from: vec![None; segments.routes.len()],
            upstreams_from: vec![None; segments.upstreams.len()],
            segments,
        }),
    };
    let pieces = match (&recut, active) {
        (Some(recut), Some(active)) => parse_pieces(text, recut, active),
        _ => None,
    };
    if let Some(parsed) = pieces {
        return Ok(Parsed {
            segments: recut.map(|r| r.segments),
            ..parsed
        });
    }
    let segments = recut.map(|r| r.segments);
    // The whole text: every diagnostic with its position.
    let (mut file, unknown_keys) = config::parse_lenient(text)?;
    let mut parsed = Parsed {
        route_texts: None,
        upstream_texts: None,
        from_active: vec![None; file.routes.len()],
        unknown_keys,
        file: FileConfig::default(),
        segments: None,
    };
    if let Some(segments) = segments.filter(|s| {
        s.routes.len() == file.routes.len()
            && s.upstreams.len() == file.upstreams.len()
            && s.upstreams
                .iter()
                .all(|(name, _)| file.upstreams.contains_key(name))
    }) {
        let piece =
            |r: &std::ops::Range<usize>| digest(text.get(r.clone()).unwrap_or("").as_bytes());
        let routes: Vec<Digest> = segments.routes.iter().map(piece).collect();
        if let Some(active) = active {
            let by_text = active_routes(active, &[]);
            for (i, d) in routes.iter().enumerate() {
                if let (Some(&j), Some(slot)) = (by_text.get(d), file.routes.get_mut(i)) {
                    // The same piece decodes to the same value: keep one.
                    if let Some(same) = active.file.routes.get(j) {
                        *slot = Arc::clone(same);
                        parsed.from_active[i] = Some(j);
                    }
                }
            }
        }
        parsed.route_texts = Some(routes);
        parsed.upstream_texts = Some(
            segments
                .upstreams
                .iter()
                .map(|(name, r)| (name.clone(), piece(r)))
                .collect(),
        );
        parsed.segments = Some(segments);
    }
    parsed.file = file;
    Ok(parsed)
}

/// The active routes by the digest of their piece, but for those `taken`
/// (known by where they are) already.
fn active_routes(active: &Spec, taken: &[Option<usize>]) -> DigestMap<usize> {
    if active.pieces.routes.len() != active.file.routes.len() {
        return DigestMap::default();
    }
    let mut free = vec![true; active.pieces.routes.len()];
    for j in taken.iter().flatten() {
        if let Some(slot) = free.get_mut(*j) {
            *slot = false;
        }
    }
    active
        .pieces
        .routes
        .iter()
        .enumerate()
        .filter(|(i, _)| free.get(*i).copied().unwrap_or(false))
        .map(|(i, p)| (p.text, i))
        .collect()
}

/// Decodes only the pieces `active` does not have; `None` when any piece
/// does not decode alone (the whole text then says why, with positions).
fn parse_pieces(text: &str, recut: &Recut, active: &Spec) -> Option<Parsed> {
    let segments = &recut.segments;
    // A piece known to be an active one by where it is needs no digest.
    let cut_aligned =
        active.pieces.cut.is_some() && active.pieces.routes.len() == active.file.routes.len();
    let mut rest = String::with_capacity(segments.rest.iter().map(|r| r.len()).sum());
    for r in &segments.rest {
        rest.push_str(text.get(r.clone())?);
    }
    let mut file = config::parse(&rest).ok()?;
    if !file.routes.is_empty() || !file.upstreams.is_empty() {
        return None;
    }
    let by_text = std::cell::OnceCell::new();
    let mut route_texts = Vec::with_capacity(segments.routes.len());
    let mut from_active = Vec::with_capacity(segments.routes.len());
    let mut routes: Vec<Option<Arc<FileRoute>>> = Vec::with_capacity(segments.routes.len());
    // The new pieces, decoded together: one parse, not one per piece.
    let mut batch = String::new();
    for (i, r) in segments.routes.iter().enumerate() {
        let known = recut
            .routes_from
            .get(i)
            .copied()
            .flatten()
            .filter(|_| cut_aligned);
        if let Some((j, (same, piece))) = known.and_then(|j| {
            Some((
                j,
                (active.file.routes.get(j)?, active.pieces.routes.get(j)?),
            ))
        }) {
            routes.push(Some(Arc::clone(same)));
            from_active.push(Some(j));
            route_texts.push(piece.text);
            continue;
        }
        let piece = text.get(r.clone())?;
        let d = digest(piece.as_bytes());
        // Most routes are where they were; the index of every active
        // route is made only when one moved.
        let j = match active.pieces.routes.get(i) {
            Some(p) if p.text == d => Some(i),
            _ => by_text
                .get_or_init(|| active_routes(active, &recut.routes_from))
                .get(&d)
                .copied(),
        };
        match j.and_then(|j| Some((j, active.file.routes.get(j)?))) {
            Some((j, same)) => {
                routes.push(Some(Arc::clone(same)));
                from_active.push(Some(j));
            }
            None => {
                add_piece(&mut batch, piece);
                routes.push(None);
                from_active.push(None);
            }
        }
        route_texts.push(d);
    }
    if !batch.is_empty() {
        let mut new = config::parse(&batch).ok()?.routes.into_iter();
        for slot in routes.iter_mut().filter(|r| r.is_none()) {
            *slot = Some(new.next()?);
        }
        if new.next().is_some() {
            return None;
        }
    }
    file.routes = routes.into_iter().collect::<Option<_>>()?;
    let mut upstream_texts = HashMap::with_capacity(segments.upstreams.len());
    let mut fresh = Vec::new();
    batch.clear();
    for (k, (name, r)) in segments.upstreams.iter().enumerate() {
        let piece = text.get(r.clone())?;
        let known = recut.upstreams_from.get(k).copied().flatten().is_some();
        let d = match active.pieces.upstreams.get(name).filter(|_| known) {
            Some(p) => p.text,
            None => digest(piece.as_bytes()),
        };
        let same = active
            .pieces
            .upstreams
            .get(name)
            .filter(|p| p.text == d)
            .and_then(|_| active.file.upstreams.get(name));
        match same {
            Some(same) => {
                file.upstreams.insert(name.clone(), same.clone());
            }
            None => {
                add_piece(&mut batch, piece);
                fresh.push(name);
            }
        }
        upstream_texts.insert(name.clone(), d);
    }
    if !batch.is_empty() {
        let mut new = config::parse(&batch).ok()?.upstreams;
        for name in fresh {
            let upstream = new.remove(name)?;
            file.upstreams.insert(name.clone(), upstream);
        }
        if !new.is_empty() {
            return None;
        }
    }
    Some(Parsed {
        file,
        unknown_keys: Vec::new(),
        route_texts: Some(route_texts),
        upstream_texts: Some(upstream_texts),
        from_active,
        segments: None,
    })
}

/// Appends a piece to a batch of pieces decoded together: each starts a
/// table of its own, so each must start a line.
fn add_piece(batch: &mut String, piece: &str) {
    batch.push_str(piece);
    if !piece.ends_with('\n') {
        batch.push('\n');
    }
}

/// What a route's validation reads besides its own piece and files.
/// Where files are read from is in it as the roots, resolved (the
/// configuration's folder first): the same folder named another way is
/// the same context, and a route's files are read again and compared
/// anyway.
pub(super) fn route_context(file: &FileConfig, roots: &[PathBuf]) -> Digest {
    let mut h = Sha256::new();
    for root in roots {
        h.update(b"\0root\0");
        h.update(root.as_os_str().as_encoded_bytes());
    }
    for l in &file.listeners {
        h.update(b"\0listener\0");
        h.update(l.name.as_bytes());
        h.update(b"\0");
        h.update(l.protocol.as_bytes());
        // A quota keyed by subject is checked against a default `auth`.
        let default_auth = l.defaults.as_ref().is_some_and(|d| d.auth.is_some());
        h.update(if default_auth { b"\0auth" } else { b"\0----" });
    }
    for (name, u) in &file.upstreams {
        h.update(b"\0upstream\0");
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(u.protocol.as_bytes());
        h.update(if u.tls.is_some() { b"\0tls" } else { b"\0---" });
    }
    // A route's `cache` is checked against the zones.
    for (name, zone) in file.cache.iter().flat_map(|c| &c.zones) {
        h.update(b"\0zone\0");
        h.update(name.as_bytes());
        h.update(format!("\0{:?}", zone.memory).as_bytes());
    }
    // A route's `waf` is checked against the rule sets' names.
    for name in file.waf.iter().flat_map(|w| w.rulesets.keys()) {
        h.update(b"\0waf\0");
        h.update(name.as_bytes());
    }
    // A fleet quota is checked against the store's presence.
    if file.limits.as_ref().is_some_and(|l| l.store.is_some()) {
        h.update(b"\0limit-store");
    }
    h.finalize().into()
}

impl Parsed {
    /// The canonical text, taking over the active pieces of unchanged
    /// routes and upstreams.
    pub fn canonical(&self, file: &FileConfig, active: Option<&Spec>) -> Canonical {
        let routes = file
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let same = self.from_active.get(i).copied().flatten();
                match same.and_then(|j| active?.canonical.routes.get(j)) {
                    Some(piece) => Arc::clone(piece),
                    None => config::canonical_route(r),
                }
            })
            .collect();
        let active_upstreams: HashMap<&str, &Arc<str>> = match active {
            Some(a) if a.canonical.upstreams.len() == a.file.upstreams.len() => a
                .file
                .upstreams
                .keys()
                .map(String::as_str)
                .zip(&a.canonical.upstreams)
                .collect(),
            _ => HashMap::new(),
        };
        let upstreams = file
            .upstreams
            .iter()
            .map(|(name, u)| {
                let unchanged = match (&self.upstream_texts, active) {
                    (Some(texts), Some(active)) => texts.get(name).is_some_and(|d| {
                        active
                            .pieces
                            .upstreams
                            .get(name)
                            .is_some_and(|p| p.text == *d)
                    }),
                    _ => false,
                };
                match active_upstreams.get(name.as_str()).filter(|_| unchanged) {
                    Some(piece) => Arc::clone(piece),
                    None => config::canonical_upstream(name, u),
                }
            })
            .collect();
        Canonical {
            head: config::canonical_head(file),
            routes,
            upstreams,
            tail: config::canonical_tail(file),
        }
    }

    /// Per route, the active spec it may keep if its files are unchanged.
    pub fn hints(&self, active: &Spec) -> Vec<Option<Hint>> {
        self.from_active
            .iter()
            .map(|same| {
                let j = (*same)?;
                Some(Hint {
                    spec: Arc::clone(active.routes.get(j)?),
                    files: active.pieces.routes.get(j)?.files.clone(),
                })
            })
            .collect()
    }
}

/// An active route's validated spec and the files it read.
pub(super) struct Hint {
    pub spec: Arc<RouteSpec>,
    pub files: Vec<(String, Digest)>,
}

impl Validator<'_> {
    /// The digests of the files read since `before`.
    pub(super) fn files_since(&self, before: usize) -> Vec<(String, Digest)> {
        self.referenced
            .get(before..)
            .unwrap_or_default()
            .iter()
            .map(|(name, contents)| (name.clone(), digest(contents)))
            .collect()
    }

    /// The hinted spec when every file it read is still what it was
    /// (read again, and kept for the version's hash, in the same order);
    /// `None`, with nothing kept, otherwise.
    pub(super) fn take_over(&mut self, hint: Hint) -> Option<Arc<RouteSpec>> {
        let before = self.referenced.len();
        for (name, was) in &hint.files {
            match self.probe_file(name) {
                Some(contents) if digest(&contents) == *was => {
                    self.referenced.push((name.clone(), contents));
                }
                _ => {
                    self.referenced.truncate(before);
                    return None;
                }
            }
        }
        Some(hint.spec)
    }
}

/// The pieces of a validated configuration, for the next candidate: with
/// its text, to cut the next one only where it differs.
pub(super) fn pieces(
    text: &str,
    segments: Option<Segments>,
    parsed_routes: Option<Vec<Digest>>,
    parsed_upstreams: Option<HashMap<String, Digest>>,
    route_files: Vec<Vec<(String, Digest)>>,
    upstream_files: Vec<(String, Vec<(String, Digest)>)>,
    route_context: Digest,
) -> Pieces {
    let routes = match parsed_routes {
        Some(texts) if texts.len() == route_files.len() => texts
            .into_iter()
            .zip(route_files)
            .map(|(text, files)| Piece { text, files })
            .collect(),
        _ => Vec::new(),
    };
    let upstreams = match parsed_upstreams {
        Some(mut texts) => upstream_files
            .into_iter()
            .filter_map(|(name, files)| {
                let text = texts.remove(&name)?;
                Some((name, Piece { text, files }))
            })
            .collect(),
        None => HashMap::new(),
    };
    let cut = segments
        .filter(|s| s.routes.len() == routes.len() && s.upstreams.len() == upstreams.len())
        .map(|segments| {
            Arc::new(Cut {
                text: text.to_owned(),
                segments,
            })
        });
    Pieces {
        routes,
        upstreams,
        route_context,
        cut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `validate_against` makes of a candidate, compared with
    /// validating it from scratch: the same version, canonical text and
    /// routes, or the same diagnostics.
    fn outcome(spec: &Result<Spec, Vec<Diagnostic>>) -> String {
        match spec {
            Ok(spec) => format!(
                "{}\n{}\n{:?}\n{:?}",
                spec.config_version,
                spec.canonical.text(),
                spec.routes,
                spec.upstreams
            ),
            Err(errors) => format!("{errors:?}"),
        }
    }

    #[test]
    fn taking_over_gives_what_validating_from_scratch_gives() {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let base = std::fs::read_to_string(folder.join("auth.toml")).expect("example");
        let text = |t: &str| ConfigText::inline(t.to_owned(), folder.clone(), "<test>");
        let active = validate(&text(&base)).expect("the example validates");
        assert!(active.pieces.cut.is_some() && !active.pieces.routes.is_empty());
        let first_route = base.find("[[routes]]").expect("a route");
        let candidates = [
            base.clone(),
            base.replace("name = \"api\"", "name = \"api2\""),
            format!("{base}\n[[routes]]\nname = \"late\"\nlisteners = [\"web\"]\npath_prefix = \"/late/\"\nrespond = {{ body = \"late\" }}\n"),
            format!("{}[[routes]]\nname = \"early\"\nlisteners = [\"web\"]\npath_exact = \"/early\"\nrespond = {{ body = \"x\" }}\n\n{}", &base[..first_route], &base[first_route..]),
            // Errors in a changed route: each with its line.
            base.replace("name = \"api\"", "name = \"api\"\nmystery = 1"),
            base.replace("name = \"api\"", "name = \"Api!\""),
            base.replacen("[[routes]]", "[[routes]\n", 1),
            format!("{base}\n[[routes]]\nname = \"api\"\nlisteners = [\"web\"]\nrespond = {{ body = \"twice\" }}\n"),
            format!("{base}\n[[routes]]\nname = \"nowhere\"\nlisteners = [\"web\"]\nupstream = \"missing\"\n"),
            // The routes' context changed: every route is validated again.
            base.replace("name = \"web\"", "name = \"www\""),
            format!("{base}\n[[listeners]]\nname = \"more\"\nbind = \"127.0.0.1:0\"\n"),
        ];
        for (n, candidate) in candidates.iter().enumerate() {
            assert!(
                n == 0 || *candidate != base,
                "candidate {n} changes nothing"
            );
            let scratch = validate(&text(candidate));
            let taken = validate_against(&text(candidate), None, Some(&active));
            assert_eq!(outcome(&taken), outcome(&scratch), "candidate {n}");
        }
        // And it did take over: the unchanged routes are the active ones.
        let renamed = validate_against(&text(&candidates[1]), None, Some(&active)).expect("valid");
        assert!(Arc::ptr_eq(&renamed.routes[0], &active.routes[0]));
        assert!(!Arc::ptr_eq(&renamed.routes[1], &active.routes[1]));
        assert!(Arc::ptr_eq(
            &renamed.canonical.routes[2],
            &active.canonical.routes[2]
        ));
    }

    #[test]
    fn the_digest_hasher_takes_the_first_eight_bytes() {
        let mut h = DigestHasher::default();
        h.write(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(h.finish(), u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
    }
}

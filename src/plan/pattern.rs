//! Compiled path regexes, shared across validations.
//!
//! A route only asks whether its regex matches the path, so a path regex
//! is a forward lazy DFA (`regex_automata::hybrid`) with a pool of caches:
//! a quarter of the memory of a full `meta::Regex` (which also builds a
//! reverse NFA and DFA, a PikeVM and a prefilter to report match
//! positions) and as fast. Patterns the lazy DFA cannot run (Unicode word
//! boundaries) fall back to `meta::Regex`. Compiled regexes are memoized
//! per pattern: re-planning a configuration whose regexes did not change,
//! the common case for a pipeline that edits one route, compiles nothing.
//! The memo holds its regexes weakly, so it is bounded by what live
//! generations and plans in progress use: a regex nothing holds any more
//! is freed, and its entry swept.

use std::collections::HashMap;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_automata::util::pool::Pool;
use regex_automata::{meta, Input};

type MakeCache = Box<dyn Fn() -> Cache + Send + Sync + UnwindSafe + RefUnwindSafe>;

/// Compiled regexes by pattern, held weakly.
fn memo() -> &'static Mutex<HashMap<Arc<str>, Weak<Engine>>> {
    static MEMO: OnceLock<Mutex<HashMap<Arc<str>, Weak<Engine>>>> = OnceLock::new();
    MEMO.get_or_init(Mutex::default)
}

enum Engine {
    Lazy {
        dfa: Arc<DFA>,
        caches: Pool<Cache, MakeCache>,
    },
    Meta(meta::Regex),
}

/// A compiled path regex and its source text. Clones share the compiled
/// regex and its caches (the memo, the spec and the generation each hold
/// one).
#[derive(Clone)]
pub struct PathRegex {
    pattern: Arc<str>,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for PathRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PathRegex").field(&self.pattern).finish()
    }
}

impl PathRegex {
    /// Compiles `pattern`, or returns the compiled copy of an earlier call
    /// that something still holds.
    pub fn new(pattern: &str) -> Result<Self, String> {
        let memo = memo();
        if let Some((pattern, engine)) = memo
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_key_value(pattern)
            .and_then(|(p, weak)| Some((Arc::clone(p), weak.upgrade()?)))
        {
            return Ok(PathRegex { pattern, engine });
        }
        let compiled = PathRegex {
            pattern: Arc::from(pattern),
            engine: Arc::new(compile(pattern)?),
        };
        let mut memo = memo.lock().unwrap_or_else(PoisonError::into_inner);
        // Dead entries go when the map has doubled since the last sweep:
        // sweeping on every insert would make compiling N patterns O(N²).
        if memo.len() >= 64 && memo.len().is_power_of_two() {
            memo.retain(|_, weak| weak.strong_count() > 0);
        }
        memo.insert(
            Arc::clone(&compiled.pattern),
            Arc::downgrade(&compiled.engine),
        );
        Ok(compiled)
    }

    pub fn is_match(&self, path: &str) -> bool {
        match &*self.engine {
            Engine::Lazy { dfa, caches } => {
                let mut cache = caches.get();
                match dfa.try_search_fwd(&mut cache, &Input::new(path).earliest(true)) {
                    Ok(found) => found.is_some(),
                    // Only quit bytes or a give-up threshold fail a search,
                    // and this configuration sets neither; should one
                    // ever fail, answer as the full engine would.
                    Err(_) => meta::Regex::new(&self.pattern).is_ok_and(|r| r.is_match(path)),
                }
            }
            Engine::Meta(regex) => regex.is_match(path),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.pattern
    }
}

fn compile(pattern: &str) -> Result<Engine, String> {
    let lazy = DFA::builder()
        .thompson(thompson::Config::new().which_captures(WhichCaptures::None))
        .build(pattern);
    match lazy {
        Ok(dfa) => {
            let dfa = Arc::new(dfa);
            let for_caches = Arc::clone(&dfa);
            let make: MakeCache = Box::new(move || for_caches.create_cache());
            Ok(Engine::Lazy {
                dfa,
                caches: Pool::new(make),
            })
        }
        // A syntax error reads the same from either engine; anything else
        // (Unicode word boundaries, say) is something only the full
        // engine runs.
        Err(_) => meta::Regex::new(pattern)
            .map(Engine::Meta)
            .map_err(|e| describe(&e)),
    }
}

/// What is wrong with a pattern, in one line: `unclosed group`.
pub(super) fn describe(error: &meta::BuildError) -> String {
    let Some(syntax) = error.syntax_error() else {
        return error.to_string();
    };
    // regex-syntax renders the pattern, a caret line, then `error: …`.
    let rendered = syntax.to_string();
    let reason = rendered
        .lines()
        .last()
        .map(|l| l.trim().trim_start_matches("error:").trim())
        .unwrap_or_default();
    if reason.is_empty() {
        rendered
    } else {
        reason.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_like_the_full_engine() {
        let cases = [
            ("^/items/[0-9]+$", "/items/42", true),
            ("^/items/[0-9]+$", "/items/42/x", false),
            ("/v[12]/", "/api/v2/users", true),
            ("^/caf\u{e9}/", "/caf\u{e9}/menu", true),
            (r"^/\w+/\d{3}$", "/shop/123", true),
            (r"^/\w+/\d{3}$", "/shop/12", false),
            (r"\bapi\b", "/api/x", true),
            (r"\bapi\b", "/rapid", false),
            ("", "/anything", true),
        ];
        for (pattern, path, expected) in cases {
            let regex = PathRegex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
            let full = meta::Regex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
            assert_eq!(regex.is_match(path), expected, "{pattern} on {path}");
            assert_eq!(full.is_match(path), expected, "{pattern} on {path} (meta)");
        }
        // Unicode word boundaries are the full engine's.
        assert!(matches!(
            *PathRegex::new(r"\bapi\b")
                .map(|r| r.engine)
                .unwrap_or_else(|e| panic!("{e}")),
            Engine::Meta(_)
        ));
        assert!(matches!(
            *PathRegex::new("^/items/[0-9]+$")
                .map(|r| r.engine)
                .unwrap_or_else(|e| panic!("{e}")),
            Engine::Lazy { .. }
        ));
    }

    #[test]
    fn the_memo_keeps_what_is_held_and_lets_go_of_the_rest() {
        let held = PathRegex::new("^/memo/held/[0-9]+$").unwrap_or_else(|e| panic!("{e}"));
        let again = PathRegex::new("^/memo/held/[0-9]+$").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            Arc::ptr_eq(&held.engine, &again.engine),
            "a held regex is reused"
        );
        // A thousand patterns compiled and dropped, as a thousand
        // validations of candidates that were never activated.
        for i in 0..1_000 {
            drop(
                PathRegex::new(&format!("^/memo/dropped/{i}/[a-z]+$"))
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        let entries = memo().lock().unwrap_or_else(PoisonError::into_inner).len();
        // Other tests compile regexes in parallel: a bound, not an exact count.
        assert!(entries <= 512, "{entries} entries for 1 held pattern");
        assert!(PathRegex::new("^/memo/held/[0-9]+$")
            .is_ok_and(|r| Arc::ptr_eq(&r.engine, &held.engine)));
    }

    #[test]
    fn syntax_errors_are_reported() {
        let error = PathRegex::new("^/items/(").err().unwrap_or_default();
        assert_eq!(error, "unclosed group");
    }

    #[test]
    fn matches_from_many_threads_at_once() {
        let regex = PathRegex::new("^/t/[0-9]+/x$").unwrap_or_else(|e| panic!("{e}"));
        std::thread::scope(|scope| {
            for t in 0..4 {
                let regex = &regex;
                scope.spawn(move || {
                    for i in 0..2_000 {
                        assert!(regex.is_match(&format!("/t/{}/x", t * 10_000 + i)));
                        assert!(!regex.is_match(&format!("/t/{i}/y")));
                    }
                });
            }
        });
    }
}

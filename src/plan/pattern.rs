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

use std::collections::HashMap;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_automata::util::pool::Pool;
use regex_automata::{meta, Input};

type MakeCache = Box<dyn Fn() -> Cache + Send + Sync + UnwindSafe + RefUnwindSafe>;

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
    /// Compiles `pattern`, or returns the compiled copy of an earlier call.
    pub fn new(pattern: &str) -> Result<Self, String> {
        static CACHE: OnceLock<Mutex<HashMap<Arc<str>, PathRegex>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Mutex::default);
        if let Some(hit) = cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(pattern)
        {
            return Ok(hit.clone());
        }
        let compiled = PathRegex {
            pattern: Arc::from(pattern),
            engine: Arc::new(compile(pattern)?),
        };
        let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
        // Bounded: a process that has seen this many distinct patterns
        // starts over rather than growing without end.
        if cache.len() >= 100_000 {
            cache.clear();
        }
        cache.insert(Arc::clone(&compiled.pattern), compiled.clone());
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
fn describe(error: &meta::BuildError) -> String {
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

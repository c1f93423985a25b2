//! Rule files to a [`RuleSet`]: every directive read, every rule
//! checked (its names, its id, its chain, the markers it skips to, the
//! data files it reads) and its regular expression compiled, with every
//! error named by file, line and rule id.
//!
//! Regular expressions are compiled for a linear-time engine
//! (`regex-automata`'s meta regex: no backtracking, so no rule can take
//! time beyond the length of what it reads), on bytes as PCRE reads them
//! without its UTF mode, `.` matching a newline too (ModSecurity compiles
//! with `DOTALL`). A pattern PCRE would take and this engine would not
//! (look-around, back-references, possessive quantifiers) is refused
//! with its rule id.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aho_corasick::AhoCorasick;
use regex_automata::meta::Regex;

use super::lex::{self, Directive};
use super::rule::{self, Actions, Operator, OperatorKind, Target};

/// A rule file's error: where, which rule, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WafError {
    pub file: PathBuf,
    pub line: usize,
    pub rule: Option<u32>,
    pub message: String,
}

impl fmt::Display for WafError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if let Some(id) = self.rule {
            write!(f, "rule {id}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// What an operator tests against, made once when the rules load.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// `@rx` (or the pattern of a target's selector).
    Regex(Regex),
    /// `@rx` whose pattern holds a `%{…}` macro: compiled per request.
    Deferred(String),
    /// `@pm`, `@pmFromFile`: the phrases, matched without regard to
    /// ASCII case anywhere in the value.
    Phrases(Arc<AhoCorasick>),
    /// Every other operator reads its parameter as written.
    Param,
}

impl Matcher {
    /// The automaton of `phrases`.
    pub fn phrases(phrases: &[String]) -> Result<Matcher, String> {
        // A contiguous NFA, not the DFA the builder picks for short lists:
        // CRS's phrase lists took 7.0 MiB as DFAs (2.4 MiB for one list of
        // 74 long phrases), 2.1 MiB so.
        AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
            .build(phrases)
            .map(|automaton| Matcher::Phrases(Arc::new(automaton)))
            .map_err(|e| format!("the phrase list cannot be built: {e}"))
    }
}

/// One rule (a `SecRule`, or a `SecAction` with no target and an
/// unconditional operator) and the rule chained to it.
#[derive(Debug, Clone)]
pub struct Rule {
    pub file: Arc<Path>,
    pub line: usize,
    pub targets: Vec<Target>,
    pub operator: Operator,
    pub matcher: Matcher,
    pub actions: Actions,
    pub chained: Option<Box<Rule>>,
}

impl Rule {
    /// The id of a chain's first rule; `None` for a link.
    pub fn id(&self) -> Option<u32> {
        self.actions.id
    }

    /// The rule and every rule chained to it.
    pub fn links(&self) -> impl Iterator<Item = &Rule> {
        std::iter::successors(Some(self), |r| r.chained.as_deref())
    }
}

/// What a rule set holds, in order.
#[derive(Debug, Clone)]
pub enum Entry {
    Rule(Box<Rule>),
    /// `SecMarker NAME`: where a `skipAfter:NAME` goes on.
    Marker(String),
}

/// Rule files read and checked, in the order given.
#[derive(Debug, Clone)]
pub struct RuleSet {
    pub entries: Vec<Entry>,
    /// `SecDefaultAction` for each phase (1 to 5).
    pub defaults: [Option<Actions>; 6],
    /// `SecRuleUpdateTargetById`: targets added to (or, with `!`, taken
    /// out of) a rule loaded before.
    pub target_updates: Vec<(u32, Vec<Target>)>,
    /// `SecComponentSignature`.
    pub signatures: Vec<String>,
    /// Every `/pattern/` selector of the rules and target updates,
    /// compiled once.
    pub patterns: HashMap<String, Regex>,
}

impl RuleSet {
    /// Whether a rule runs in the answer's phases (3 or 4).
    pub fn reads_answers(&self) -> bool {
        self.rules()
            .any(|rule| matches!(rule.actions.phase.unwrap_or(2), 3 | 4))
    }

    /// Reads `files` in order; every error of every file when any.
    pub fn load(files: &[PathBuf]) -> Result<RuleSet, Vec<WafError>> {
        let mut loader = Loader::default();
        for file in files {
            match std::fs::read_to_string(file) {
                Ok(text) => loader.file(file, &text),
                Err(e) => loader.errors.push(WafError {
                    file: file.clone(),
                    line: 0,
                    rule: None,
                    message: format!("cannot read the rule file: {e}"),
                }),
            }
        }
        loader.finish()
    }

    /// Rule files already read, in order; the data files their rules
    /// name (`@pmFromFile`) are read through `read`, once each (the
    /// caller confines and records them).
    pub fn load_texts(
        files: &[(PathBuf, String)],
        read: &mut ReadData<'_>,
    ) -> Result<RuleSet, Vec<WafError>> {
        let mut loader = Loader {
            read: Some(read),
            ..Loader::default()
        };
        for (file, text) in files {
            loader.file(file, text);
        }
        loader.finish()
    }

    /// Reads one file's text (tests, and a rule set given inline).
    pub fn parse(file: &Path, text: &str) -> Result<RuleSet, Vec<WafError>> {
        let mut loader = Loader::default();
        loader.file(file, text);
        loader.finish()
    }

    /// Every chain's first rule, in order.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Rule(rule) => Some(&**rule),
            Entry::Marker(_) => None,
        })
    }
}

/// How a data file is read: its bytes, or why not.
pub type ReadData<'a> = dyn FnMut(&Path) -> Result<Vec<u8>, String> + 'a;

#[derive(Default)]
struct Loader<'r> {
    /// How data files are read (the file system when `None`).
    read: Option<&'r mut ReadData<'r>>,
    set: Vec<Entry>,
    defaults: [Option<Actions>; 6],
    target_updates: Vec<(u32, Vec<Target>)>,
    signatures: Vec<String>,
    patterns: HashMap<String, Regex>,
    errors: Vec<WafError>,
    ids: HashMap<u32, (Arc<Path>, usize)>,
    /// The rule whose `chain` waits for the next `SecRule`.
    open_chain: Option<Rule>,
    /// Phrase files read once however many rules name them.
    phrase_files: HashMap<PathBuf, Arc<[String]>>,
    /// The links still to come of a chain one of whose rules was
    /// refused: skipped, not reported again.
    broken_chain: bool,
}

impl Loader<'_> {
    fn file(&mut self, path: &Path, text: &str) {
        let file: Arc<Path> = Arc::from(path);
        let directives = match lex::directives(text) {
            Ok(directives) => directives,
            Err(errors) => {
                self.errors.extend(errors.into_iter().map(|e| WafError {
                    file: path.to_owned(),
                    line: e.line,
                    rule: None,
                    message: e.message,
                }));
                return;
            }
        };
        for directive in directives {
            let chains = directive.name == "SecRule"
                && directive.args.get(2).is_some_and(|a| rule::chains(a));
            if self.broken_chain && directive.name == "SecRule" {
                self.broken_chain = chains;
                continue;
            }
            self.broken_chain = false;
            if let Err(message) = self.directive(&file, &directive) {
                let rule = directive
                    .args
                    .last()
                    .and_then(|a| id_in(a))
                    .or_else(|| self.open_chain.as_ref().and_then(Rule::id));
                self.errors.push(WafError {
                    file: path.to_owned(),
                    line: directive.line,
                    rule,
                    message,
                });
                // The rest of this rule's chain is part of what is refused.
                self.open_chain = None;
                self.broken_chain = chains;
            }
        }
        if let Some(open) = self.open_chain.take() {
            self.errors.push(WafError {
                file: path.to_owned(),
                line: open.line,
                rule: open.id(),
                message: "'chain' with no rule after it in the file".into(),
            });
        }
    }

    fn directive(&mut self, file: &Arc<Path>, d: &Directive) -> Result<(), String> {
        let args = |n: std::ops::RangeInclusive<usize>| {
            if n.contains(&d.args.len()) {
                Ok(())
            } else {
                Err(format!(
                    "{} takes {} to {} arguments, not {}",
                    d.name,
                    n.start(),
                    n.end(),
                    d.args.len()
                ))
            }
        };
        if self.open_chain.is_some() && d.name != "SecRule" {
            return Err(format!(
                "{} where the chain above waits for a SecRule",
                d.name
            ));
        }
        match d.name.as_str() {
            "SecRule" => {
                args(2..=3)?;
                let targets = rule::targets(&d.args[0])?;
                let operator = rule::operator(&d.args[1])?;
                let actions = match d.args.get(2) {
                    Some(text) => rule::actions(text).map_err(|e| e.join("; "))?,
                    None => Actions::default(),
                };
                self.rule(file, d.line, targets, operator, actions)
            }
            "SecAction" => {
                args(1..=1)?;
                let actions = rule::actions(&d.args[0]).map_err(|e| e.join("; "))?;
                if actions.chain {
                    return Err("a SecAction cannot start a chain".into());
                }
                let operator = Operator {
                    kind: OperatorKind::UnconditionalMatch,
                    negated: false,
                    param: String::new(),
                };
                self.rule(file, d.line, Vec::new(), operator, actions)
            }
            "SecMarker" => {
                args(1..=1)?;
                self.set.push(Entry::Marker(d.args[0].clone()));
                Ok(())
            }
            "SecDefaultAction" => {
                args(1..=1)?;
                let actions = rule::actions(&d.args[0]).map_err(|e| e.join("; "))?;
                let phase = actions.phase.ok_or("SecDefaultAction names no phase")?;
                if actions.id.is_some() || actions.chain || !actions.setvars.is_empty() {
                    return Err("SecDefaultAction takes no id, chain or setvar".into());
                }
                self.defaults[usize::from(phase)] = Some(actions);
                Ok(())
            }
            "SecRuleUpdateTargetById" => {
                args(2..=2)?;
                let id = d.args[0]
                    .parse::<u32>()
                    .map_err(|_| format!("'{}' is not a rule id", d.args[0]))?;
                if !self.ids.contains_key(&id) {
                    return Err(format!("rule {id} is not loaded before this update"));
                }
                let targets = rule::targets(&d.args[1])?;
                self.selector_patterns(&targets)?;
                self.target_updates.push((id, targets));
                Ok(())
            }
            "SecComponentSignature" => {
                args(1..=1)?;
                self.signatures.push(d.args[0].clone());
                Ok(())
            }
            other => Err(format!("unknown or unsupported directive '{other}'")),
        }
    }

    fn rule(
        &mut self,
        file: &Arc<Path>,
        line: usize,
        targets: Vec<Target>,
        operator: Operator,
        actions: Actions,
    ) -> Result<(), String> {
        let matcher = self.matcher(file, &operator)?;
        self.selector_patterns(&targets)?;
        let chains_on = actions.chain;
        let rule = Rule {
            file: Arc::clone(file),
            line,
            targets,
            operator,
            matcher,
            actions,
            chained: None,
        };
        let head = match self.open_chain.take() {
            Some(mut head) => {
                let a = &rule.actions;
                if a.id.is_some() || a.phase.is_some() || a.disruptive.is_some() {
                    return Err("a chained rule takes no id, phase or disruptive action".into());
                }
                let mut last = &mut head;
                while let Some(ref mut next) = last.chained {
                    last = next;
                }
                last.chained = Some(Box::new(rule));
                head
            }
            None => {
                let id = rule.id().ok_or("a rule without an id")?;
                if let Some((other, other_line)) = self.ids.get(&id) {
                    return Err(format!(
                        "id {id} is taken by {}:{other_line}",
                        other.display()
                    ));
                }
                self.ids.insert(id, (Arc::clone(file), line));
                rule
            }
        };
        if chains_on {
            self.open_chain = Some(head);
        } else {
            self.set.push(Entry::Rule(Box::new(head)));
        }
        Ok(())
    }

    /// Compiles the `/pattern/` selectors of `targets`, once each.
    fn selector_patterns(&mut self, targets: &[Target]) -> Result<(), String> {
        for target in targets {
            if let Some(rule::Selector::Pattern(pattern)) = &target.selector {
                if !self.patterns.contains_key(pattern) {
                    let re = compile_selector(pattern)
                        .map_err(|e| format!("selector /{pattern}/: {e}"))?;
                    self.patterns.insert(pattern.clone(), re);
                }
            }
        }
        Ok(())
    }

    fn matcher(&mut self, file: &Path, operator: &Operator) -> Result<Matcher, String> {
        Ok(match operator.kind {
            OperatorKind::Rx if operator.param.contains("%{") => {
                Matcher::Deferred(operator.param.clone())
            }
            OperatorKind::Rx => {
                Matcher::Regex(compile(&operator.param).map_err(|e| format!("@rx: {e}"))?)
            }
            OperatorKind::Pm => {
                let phrases: Vec<String> = operator
                    .param
                    .split_whitespace()
                    .map(str::to_lowercase)
                    .collect();
                if phrases.is_empty() {
                    return Err("@pm with no phrase".into());
                }
                Matcher::phrases(&phrases)?
            }
            OperatorKind::PmFromFile => {
                let mut phrases = Vec::new();
                for name in operator.param.split_whitespace() {
                    let path = file.parent().unwrap_or(Path::new(".")).join(name);
                    phrases.extend(self.phrase_file(&path)?.iter().cloned());
                }
                if phrases.is_empty() {
                    return Err("@pmFromFile with no phrase".into());
                }
                let unique: HashSet<String> = phrases.into_iter().collect();
                let mut phrases: Vec<String> = unique.into_iter().collect();
                phrases.sort();
                Matcher::phrases(&phrases)?
            }
            _ => Matcher::Param,
        })
    }

    /// A data file's phrases: one a line, `#` comments and blank lines
    /// left out, lowercase.
    fn phrase_file(&mut self, path: &Path) -> Result<Arc<[String]>, String> {
        if let Some(phrases) = self.phrase_files.get(path) {
            return Ok(Arc::clone(phrases));
        }
        let text = match self.read.as_mut() {
            Some(read) => read(path).and_then(|bytes| {
                String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())
            }),
            None => std::fs::read_to_string(path).map_err(|e| e.to_string()),
        }
        .map_err(|e| format!("@pmFromFile {}: {e}", path.display()))?;
        let phrases: Arc<[String]> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_lowercase)
            .collect();
        self.phrase_files
            .insert(path.to_owned(), Arc::clone(&phrases));
        Ok(phrases)
    }

    fn finish(mut self) -> Result<RuleSet, Vec<WafError>> {
        // A skipAfter goes on after a marker loaded later.
        let mut later: HashSet<&str> = HashSet::new();
        let mut missing = Vec::new();
        for entry in self.set.iter().rev() {
            match entry {
                Entry::Marker(name) => {
                    later.insert(name);
                }
                Entry::Rule(rule) => {
                    for link in rule.links() {
                        if let Some(marker) = &link.actions.skip_after {
                            if !later.contains(marker.as_str()) {
                                missing.push(WafError {
                                    file: link.file.to_path_buf(),
                                    line: link.line,
                                    rule: rule.id(),
                                    message: format!(
                                        "skipAfter:{marker} names no SecMarker after it"
                                    ),
                                });
                            }
                        }
                    }
                }
            }
        }
        missing.reverse();
        self.errors.extend(missing);
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        Ok(RuleSet {
            entries: self.set,
            defaults: self.defaults,
            target_updates: self.target_updates,
            signatures: self.signatures,
            patterns: self.patterns,
        })
    }
}

/// The `.conf` files of a folder in name order, as `Include dir/*.conf`
/// loads them (the Core Rule Set's `rules/` is read so).
pub fn conf_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    files.sort();
    Ok(files)
}

/// A pattern compiled as ModSecurity's PCRE reads it: bytes, `.` matches
/// a newline; linear time.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    let pattern = byte_escapes(pattern);
    Regex::builder()
        .syntax(
            regex_automata::util::syntax::Config::new()
                .unicode(false)
                .utf8(false)
                .dot_matches_new_line(true),
        )
        .build(&pattern)
        .map_err(|e| match e.syntax_error() {
            Some(syntax) => one_line(&syntax.to_string()),
            None => one_line(&e.to_string()),
        })
}

/// A `/pattern/` selector: collection keys are compared without regard
/// to case (`TX` keeps its names in lowercase; rules write them in
/// capitals), so is the pattern.
pub fn compile_selector(pattern: &str) -> Result<Regex, String> {
    compile(&format!("(?i:{pattern})"))
}

/// PCRE without its UTF mode reads `\x{e2}` as the byte 0xE2; the
/// engine here reads braces as a code point, so a brace escape up to
/// 0xFF becomes the two-digit one (`\xe2`). Everything else is kept.
fn byte_escapes(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut rest = pattern;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let byte = after
            .strip_prefix("x{")
            .and_then(|hex| hex.split_once('}'))
            .and_then(|(hex, tail)| Some((u8::from_str_radix(hex, 16).ok()?, tail)));
        match byte {
            Some((byte, tail)) => {
                out.push_str(&format!("\\x{byte:02x}"));
                rest = tail;
            }
            None => {
                // The backslash and the character it escapes, as they are.
                let escaped = after.chars().next().map_or(0, char::len_utf8);
                out.push_str(&rest[at..at + 1 + escaped]);
                rest = &after[escaped..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A multi-line regex-syntax message on one line.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `id:N` of an actions text, for naming a rule whose reading failed.
fn id_in(actions: &str) -> Option<u32> {
    let at = actions.find("id:")?;
    let digits: String = actions[at + 3..]
        .trim_start_matches('\'')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RuleSet, Vec<WafError>> {
        RuleSet::parse(Path::new("rules.conf"), text)
    }

    #[test]
    fn chains_link_to_their_head_and_markers_keep_their_place() {
        let set = parse(
            "SecDefaultAction \"phase:2,log,pass\"\n\
             SecRule ARGS \"@rx a\" \"id:1,phase:2,block,chain,skipAfter:END\"\n\
             \tSecRule MATCHED_VAR \"@pm x y\" \"t:lowercase\"\n\
             SecAction \"id:2,phase:1,pass,setvar:tx.a=1\"\n\
             SecMarker END\n\
             SecRuleUpdateTargetById 1 \"!ARGS:q\"\n",
        )
        .unwrap();
        let rules: Vec<&Rule> = set.rules().collect();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].links().count(), 2);
        assert!(matches!(
            rules[0].links().nth(1).unwrap().matcher,
            Matcher::Phrases(_)
        ));
        assert_eq!(rules[1].operator.kind, OperatorKind::UnconditionalMatch);
        assert!(matches!(set.entries[2], Entry::Marker(ref m) if m == "END"));
        assert_eq!(set.target_updates[0].0, 1);
        assert!(set.defaults[2].is_some());
    }

    #[test]
    fn every_error_is_named_by_line_and_rule() {
        let errors = parse(
            "SecRule ARGS \"@rx a\" \"id:10,phase:2,pass\"\n\
             SecRule ARGS \"@rx a\" \"id:10,phase:2,pass\"\n\
             SecRule ARGS \"@rx (?<=a)b\" \"id:14,phase:2,pass\"\n\
             SecRule ARGS \"@rx a\" \"id:11,phase:2,pass,skipAfter:NOWHERE\"\n\
             SecRule ARGS \"@rx a\" \"phase:2,pass\"\n\
             SecRule NOPE \"@rx a\" \"id:12,phase:2\"\n\
             SecRuleEngine On\n\
             SecRule ARGS \"@rx a\" \"id:13,phase:2,chain\"\n",
        )
        .unwrap_err();
        let got: Vec<(usize, Option<u32>)> = errors.iter().map(|e| (e.line, e.rule)).collect();
        assert_eq!(
            got,
            [
                (2, Some(10)),
                (3, Some(14)),
                (5, None),
                (6, Some(12)),
                (7, None),
                (8, Some(13)),
                (4, Some(11)),
            ],
            "{errors:#?}"
        );
        assert_eq!(
            errors[0].to_string(),
            "rules.conf:2: rule 10: id 10 is taken by rules.conf:1"
        );
        assert!(errors[1].message.starts_with("@rx: "), "{}", errors[1]);
    }

    #[test]
    fn a_chained_rule_takes_no_id_and_a_chain_needs_its_link() {
        let errors = parse(
            "SecRule ARGS \"@rx a\" \"id:1,phase:2,chain\"\n\
             SecRule ARGS \"@rx b\" \"id:2\"\n",
        )
        .unwrap_err();
        assert!(
            errors[0].message.contains("chained rule takes no id"),
            "{errors:?}"
        );
        // A refused link is reported once, not again by the links after it.
        let errors = parse(
            "SecRule ARGS \"@rx a\" \"id:1,phase:2,chain\"\n\
             SecRule NOPE \"@rx b\" \"chain\"\n\
             SecRule ARGS \"@rx c\" \"t:none\"\n\
             SecRule ARGS \"@rx d\" \"id:2,phase:2,pass\"\n",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!((errors[0].line, errors[0].rule), (2, Some(1)));
    }

    #[test]
    fn patterns_read_bytes_and_dot_matches_newlines() {
        let re = compile(r"a.b\x00[\x80-\xff]").unwrap();
        assert!(re.is_match(&b"a\nb\x00\xe9"[..]));
        let braces = compile(r"\x{e2}\x91[\xa0-\x{bf}]|\\x{e3}|\x{100}");
        assert_eq!(byte_escapes(r"\x{e2}\\x{e3}\x{100}"), r"\xe2\\x{e3}\x{100}");
        assert!(braces.is_err(), "a code point above 0xFF is not a byte");
        let re = compile(r"\x{e2}\x91[\xa0-\x{bf}]").unwrap();
        assert!(re.is_match(&b"\xe2\x91\xa5"[..]));
        assert!(compile(r"(a)\1").is_err());
    }
}

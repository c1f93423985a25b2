//! A transaction: one request (and its answer) through a [`RuleSet`],
//! phase by phase, as ModSecurity evaluates SecLang. Each rule of the
//! phase, in order: its targets' values (with the exclusions of the
//! rule, of `SecRuleUpdateTargetById` and of `ctl`), each through the
//! transformations, tested by the operator; a match records
//! `MATCHED_VAR(S)` and the captures and runs the link's non-disruptive
//! actions (`setvar`, `ctl`) for each value that matched; a chain goes on
//! to its next rule; a whole match is logged (unless `nolog`), applies
//! the disruptive action and `skipAfter`.
//!
//! In detection-only mode nothing is interrupted: every match is only
//! recorded. The anomaly scores CRS keeps are ordinary `TX` variables.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::load::{compile_selector, Entry, Rule, RuleSet};
use super::operator::{self, number, Captures};
use super::request::{BodyProcessor, Parsed, Request, Response};
use super::rule::{CtlOption, Disruptive, SetOp, Target, Transform, Variable};
use super::transform;

/// Whether the rules may interrupt the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Block,
    Detect,
    Off,
}

/// A rule that matched whole and was logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub id: u32,
    pub phase: u8,
    pub msg: String,
    pub logdata: String,
    pub severity: Option<u8>,
}

/// How a transaction was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interruption {
    pub rule: u32,
    pub status: u16,
}

/// One request's evaluation.
pub struct Transaction<'a> {
    set: &'a RuleSet,
    request: &'a Request,
    response: Option<&'a Response>,
    /// The request taken apart (shared with the values a rule reads
    /// while the rule changes the transaction).
    parsed: Arc<Parsed>,
    mode: Mode,
    tx: HashMap<String, Vec<u8>>,
    matched_var: (String, Vec<u8>),
    /// The values the current rule matched; the previous link's while a
    /// chained rule reads `MATCHED_VARS`.
    matched_vars: Vec<(String, Vec<u8>)>,
    removed_ids: Vec<(u32, u32)>,
    removed_tags: Vec<String>,
    /// `ctl:ruleRemoveTargetBy{Id,Tag}`: the rule (by id or tag) and the
    /// target taken out of it.
    removed_targets: Vec<(RuleRef, Target)>,
    forced_processor: Option<BodyProcessor>,
    force_body_variable: bool,
    /// Set by `allow`: the request phases are done.
    allowed: bool,
    pub matches: Vec<Matched>,
    pub interruption: Option<Interruption>,
    /// In detection mode: the first interruption a rule asked for (what
    /// blocking mode would have done).
    pub would_interrupt: Option<Interruption>,
}

/// A transaction between its request's phases and its answer's, owning
/// what the rules set and read (the request taken apart, `TX`, the
/// exclusions, what matched): a gateway holds it while the upstream
/// answers, then `resume`s it with the answer.
#[derive(Debug, Default)]
pub struct Paused {
    parsed: Arc<Parsed>,
    mode: Mode,
    tx: HashMap<String, Vec<u8>>,
    removed_ids: Vec<(u32, u32)>,
    removed_tags: Vec<String>,
    removed_targets: Vec<(RuleRef, Target)>,
    forced_processor: Option<BodyProcessor>,
    force_body_variable: bool,
    allowed: bool,
    pub matches: Vec<Matched>,
    pub interruption: Option<Interruption>,
    pub would_interrupt: Option<Interruption>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RuleRef {
    Id(u32),
    Tag(String),
    /// Every rule (an operator's exclusion of a target).
    All,
}

impl<'a> Transaction<'a> {
    pub fn new(set: &'a RuleSet, request: &'a Request, mode: Mode) -> Self {
        let parsed = Arc::new(request.parse_head());
        Self::resume(
            set,
            request,
            Paused {
                parsed,
                mode,
                ..Paused::default()
            },
        )
    }

    /// An operator's exclusion, before the phases run: with no targets,
    /// rules `rules` are not evaluated; with targets, those rules (every
    /// rule when `rules` is empty) no longer read them.
    pub fn exclude(&mut self, rules: &[u32], targets: &[Target]) {
        if targets.is_empty() {
            self.removed_ids.extend(rules.iter().map(|id| (*id, *id)));
            return;
        }
        for target in targets {
            if rules.is_empty() {
                self.removed_targets.push((RuleRef::All, target.clone()));
            }
            for id in rules {
                self.removed_targets
                    .push((RuleRef::Id(*id), target.clone()));
            }
        }
    }

    /// Phases 1 and 2: the request's head, then its body.
    pub fn request(&mut self) -> Option<Interruption> {
        self.phase(1);
        if self.interruption.is_none() {
            self.request
                .read_body(Arc::make_mut(&mut self.parsed), self.forced_processor);
            self.phase(2);
        }
        self.interruption
    }

    /// What the request's phases left, owned, for the answer's phases
    /// later (`resume`).
    pub fn pause(self) -> Paused {
        Paused {
            parsed: self.parsed,
            mode: self.mode,
            tx: self.tx,
            removed_ids: self.removed_ids,
            removed_tags: self.removed_tags,
            removed_targets: self.removed_targets,
            forced_processor: self.forced_processor,
            force_body_variable: self.force_body_variable,
            allowed: self.allowed,
            matches: self.matches,
            interruption: self.interruption,
            would_interrupt: self.would_interrupt,
        }
    }

    /// A paused transaction of `request` through `set` again, where it
    /// stopped.
    pub fn resume(set: &'a RuleSet, request: &'a Request, paused: Paused) -> Self {
        Self {
            set,
            request,
            response: None,
            parsed: paused.parsed,
            mode: paused.mode,
            tx: paused.tx,
            matched_var: (String::new(), Vec::new()),
            matched_vars: Vec::new(),
            removed_ids: paused.removed_ids,
            removed_tags: paused.removed_tags,
            removed_targets: paused.removed_targets,
            forced_processor: paused.forced_processor,
            force_body_variable: paused.force_body_variable,
            allowed: paused.allowed,
            matches: paused.matches,
            interruption: paused.interruption,
            would_interrupt: paused.would_interrupt,
        }
    }

    /// Phases 3 and 4: the answer's head, then its body.
    pub fn response(&mut self, response: &'a Response) -> Option<Interruption> {
        self.response = Some(response);
        if self.interruption.is_none() {
            self.phase(3);
        }
        if self.interruption.is_none() {
            self.phase(4);
        }
        self.interruption
    }

    /// Phase 5, after everything else.
    pub fn logging(&mut self) {
        self.phase(5);
    }

    /// A transaction variable (`TX:name`), as the rules left it.
    pub fn tx(&self, name: &str) -> Option<&[u8]> {
        self.tx.get(&name.to_ascii_lowercase()).map(Vec::as_slice)
    }

    fn phase(&mut self, phase: u8) {
        if self.mode == Mode::Off || (self.allowed && phase <= 4) {
            return;
        }
        let set = self.set;
        let mut skip_to: Option<&str> = None;
        for entry in &set.entries {
            let rule = match entry {
                Entry::Marker(name) => {
                    if skip_to == Some(name.as_str()) {
                        skip_to = None;
                    }
                    continue;
                }
                Entry::Rule(rule) => rule,
            };
            if skip_to.is_some() || rule.actions.phase.unwrap_or(2) != phase || self.removed(rule) {
                continue;
            }
            if !self.chain_matches(rule) {
                continue;
            }
            self.matched_whole(rule, phase);
            if self.interruption.is_some() || self.allowed || self.mode == Mode::Off {
                return;
            }
            if let Some(marker) = rule.links().find_map(|l| l.actions.skip_after.as_deref()) {
                skip_to = Some(marker);
            }
        }
    }

    fn removed(&self, rule: &Rule) -> bool {
        let id = rule.id().unwrap_or_default();
        self.removed_ids
            .iter()
            .any(|(low, high)| (*low..=*high).contains(&id))
            || rule
                .actions
                .tags
                .iter()
                .any(|t| self.removed_tags.contains(t))
    }

    fn chain_matches(&mut self, head: &Rule) -> bool {
        self.matched_vars.clear();
        head.links().all(|link| self.link_matches(head, link))
    }

    fn link_matches(&mut self, head: &Rule, link: &Rule) -> bool {
        let parsed = Arc::clone(&self.parsed);
        let values = if link.targets.is_empty() {
            vec![(Name::whole(""), Cow::Borrowed(&[][..]))]
        } else {
            self.values(head, link, &parsed)
        };
        self.matched_vars.clear();
        let param = self.expand(&link.operator.param, head);
        let transforms = self.transforms(head, link);
        let want_captures = link.actions.capture;
        let mut captures = Captures::new();
        let mut matched = false;
        for (name, value) in values {
            let mut current: Cow<'_, [u8]> = Cow::Borrowed(&value);
            let mut hit = false;
            let multi = link.actions.multi_match;
            if multi {
                hit = self.test(
                    link,
                    &param,
                    &current,
                    want_captures.then_some(&mut captures),
                );
            }
            for t in &transforms {
                // A transformation that changes nothing hands the value
                // back: nothing is copied then.
                let next = match transform::apply(*t, &current) {
                    Cow::Borrowed(same) if same.len() == current.len() => None,
                    Cow::Borrowed(part) => Some(part.to_vec()),
                    Cow::Owned(changed) => Some(changed),
                };
                if let Some(next) = next {
                    current = Cow::Owned(next);
                }
                if multi && !hit {
                    hit = self.test(
                        link,
                        &param,
                        &current,
                        want_captures.then_some(&mut captures),
                    );
                }
            }
            if !multi {
                hit = self.test(
                    link,
                    &param,
                    &current,
                    want_captures.then_some(&mut captures),
                );
            }
            if !hit {
                continue;
            }
            matched = true;
            let name = name.text();
            let value = current.into_owned();
            self.matched_var = (name.clone(), value.clone());
            self.matched_vars.push((name, value));
            if want_captures {
                for (i, group) in captures.iter().enumerate() {
                    self.tx.insert(i.to_string(), group.clone());
                }
            }
            self.act(head, link);
        }
        matched
    }

    fn test(
        &self,
        link: &Rule,
        param: &[u8],
        value: &[u8],
        captures: Option<&mut Captures>,
    ) -> bool {
        let found = operator::matches(link.operator.kind, &link.matcher, param, value, captures);
        found != link.operator.negated
    }

    /// The rule's transformations, after its phase's default ones unless
    /// it says `t:none`.
    fn transforms(&self, head: &Rule, link: &Rule) -> Vec<Transform> {
        let phase = usize::from(head.actions.phase.unwrap_or(2));
        let mut all = Vec::new();
        if !link.actions.transforms_reset {
            if let Some(Some(defaults)) = self.set.defaults.get(phase) {
                all.extend_from_slice(&defaults.transforms);
            }
        }
        all.extend_from_slice(&link.actions.transforms);
        all
    }

    /// The non-disruptive actions of a link, for one value it matched.
    fn act(&mut self, head: &Rule, link: &Rule) {
        for setvar in &link.actions.setvars {
            let name =
                String::from_utf8_lossy(&self.expand(&setvar.name, head)).to_ascii_lowercase();
            match &setvar.op {
                SetOp::Delete => {
                    self.tx.remove(&name);
                }
                SetOp::Set(value) => {
                    let value = self.expand(value, head).into_owned();
                    self.tx.insert(name, value);
                }
                SetOp::Add(value) | SetOp::Sub(value) => {
                    let by = number(&self.expand(value, head));
                    let now = self.tx.get(&name).map_or(0, |v| number(v));
                    let next = if matches!(setvar.op, SetOp::Add(_)) {
                        now.saturating_add(by)
                    } else {
                        now.saturating_sub(by)
                    };
                    self.tx.insert(name, next.to_string().into_bytes());
                }
            }
        }
        for ctl in &link.actions.ctls {
            let value = String::from_utf8_lossy(&self.expand(&ctl.value, head)).into_owned();
            self.ctl(ctl.option, &value);
        }
    }

    fn ctl(&mut self, option: CtlOption, value: &str) {
        match option {
            CtlOption::RuleEngine => {
                self.mode = match value.to_ascii_lowercase().as_str() {
                    "off" => Mode::Off,
                    "detectiononly" => Mode::Detect,
                    _ => self.mode,
                }
            }
            CtlOption::RuleRemoveById => {
                for part in value.split([' ', ',']).filter(|p| !p.is_empty()) {
                    let (low, high) = part.split_once('-').unwrap_or((part, part));
                    if let (Ok(low), Ok(high)) = (low.parse(), high.parse()) {
                        self.removed_ids.push((low, high));
                    }
                }
            }
            CtlOption::RuleRemoveByTag => self.removed_tags.push(value.to_owned()),
            CtlOption::RuleRemoveTargetById | CtlOption::RuleRemoveTargetByTag => {
                let Some((rule, target)) = value.split_once(';') else {
                    return;
                };
                let rule = match option {
                    CtlOption::RuleRemoveTargetById => match rule.trim().parse() {
                        Ok(id) => RuleRef::Id(id),
                        Err(_) => return,
                    },
                    _ => RuleRef::Tag(rule.trim().to_owned()),
                };
                if let Ok(targets) = super::rule::targets(target.trim()) {
                    for target in targets {
                        self.removed_targets.push((rule.clone(), target));
                    }
                }
            }
            CtlOption::RequestBodyProcessor => self.forced_processor = BodyProcessor::named(value),
            CtlOption::ForceRequestBodyVariable => {
                self.force_body_variable = value.eq_ignore_ascii_case("on");
            }
            // There is no audit log: every match is in `matches`.
            CtlOption::AuditEngine => {}
        }
    }

    fn matched_whole(&mut self, rule: &Rule, phase: u8) {
        let id = rule.id().unwrap_or_default();
        let defaults = self
            .set
            .defaults
            .get(usize::from(phase))
            .and_then(Option::as_ref);
        let log = rule
            .actions
            .log
            .or_else(|| defaults.and_then(|d| d.log))
            .unwrap_or(true);
        if log {
            let msg = rule
                .actions
                .msg
                .as_deref()
                .map(|m| self.expand_text(m, rule));
            let logdata = rule
                .actions
                .logdata
                .as_deref()
                .map(|m| self.expand_text(m, rule));
            self.matches.push(Matched {
                id,
                phase,
                msg: msg.unwrap_or_default(),
                logdata: logdata.unwrap_or_default(),
                severity: rule.actions.severity,
            });
        }
        let disruptive = match rule.actions.disruptive {
            Some(Disruptive::Block) => defaults.and_then(|d| d.disruptive),
            other => other,
        };
        match disruptive {
            Some(Disruptive::Deny | Disruptive::Drop) if self.mode != Mode::Off => {
                let status = rule
                    .actions
                    .status
                    .or_else(|| defaults.and_then(|d| d.status))
                    .unwrap_or(403);
                let interruption = Some(Interruption { rule: id, status });
                if self.mode == Mode::Block {
                    self.interruption = interruption;
                } else if self.would_interrupt.is_none() {
                    self.would_interrupt = interruption;
                }
            }
            Some(Disruptive::Allow) => self.allowed = true,
            _ => {}
        }
    }

    fn expand_text(&self, text: &str, rule: &Rule) -> String {
        String::from_utf8_lossy(&self.expand(text, rule)).into_owned()
    }

    /// `text` with each `%{NAME}` or `%{COLLECTION.key}` replaced by its
    /// value (empty when there is none).
    fn expand<'t>(&self, text: &'t str, rule: &Rule) -> Cow<'t, [u8]> {
        if !text.contains("%{") {
            return Cow::Borrowed(text.as_bytes());
        }
        let mut out = Vec::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("%{") {
            out.extend_from_slice(&rest.as_bytes()[..at]);
            let Some(end) = rest[at..].find('}') else {
                out.extend_from_slice(&rest.as_bytes()[at..]);
                return Cow::Owned(out);
            };
            let name = &rest[at + 2..at + end];
            out.extend_from_slice(&self.macro_value(name, rule));
            rest = &rest[at + end + 1..];
        }
        out.extend_from_slice(rest.as_bytes());
        Cow::Owned(out)
    }

    fn macro_value(&self, name: &str, rule: &Rule) -> Vec<u8> {
        let (collection, key) = match name.split_once('.') {
            Some((c, k)) => (c, Some(k)),
            None => (name, None),
        };
        let collection = collection.to_ascii_uppercase();
        match (collection.as_str(), key) {
            ("TX", Some(key)) => self.tx(key).map(<[u8]>::to_vec).unwrap_or_default(),
            ("MATCHED_VAR", None) => self.matched_var.1.clone(),
            ("MATCHED_VAR_NAME", None) => self.matched_var.0.clone().into_bytes(),
            ("RULE", Some(key)) => match key.to_ascii_lowercase().as_str() {
                "id" => rule.id().unwrap_or_default().to_string().into_bytes(),
                "msg" => rule.actions.msg.clone().unwrap_or_default().into_bytes(),
                "severity" => rule
                    .actions
                    .severity
                    .map(|s| s.to_string())
                    .unwrap_or_default()
                    .into_bytes(),
                _ => Vec::new(),
            },
            _ => {
                let Some(variable) = Variable::named(&collection) else {
                    return Vec::new();
                };
                let target = Target {
                    variable,
                    selector: key.map(|k| super::rule::Selector::Name(k.to_owned())),
                    count: false,
                    exclude: false,
                };
                let parsed = Arc::clone(&self.parsed);
                self.collect(&target, &parsed)
                    .into_iter()
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            }
        }
    }

    /// The values a link reads: its targets' (and, for a chain's first
    /// rule, those `SecRuleUpdateTargetById` adds), less every exclusion.
    fn values<'p>(&self, head: &Rule, link: &Rule, parsed: &'p Parsed) -> Vec<Value<'p>>
    where
        'a: 'p,
    {
        let id = head.id();
        let is_head = std::ptr::eq(head, link);
        let updates = self
            .set
            .target_updates
            .iter()
            .filter(|(updated, _)| is_head && Some(*updated) == id)
            .flat_map(|(_, targets)| targets.iter());
        let removed = self
            .removed_targets
            .iter()
            .filter(|(rule, _)| match rule {
                RuleRef::Id(removed) => is_head && Some(*removed) == id,
                RuleRef::Tag(tag) => head.actions.tags.contains(tag),
                RuleRef::All => true,
            })
            .map(|(_, target)| target);
        let all: Vec<&Target> = link.targets.iter().chain(updates).collect();
        let excluded: Vec<&Target> = all
            .iter()
            .copied()
            .filter(|t| t.exclude)
            .chain(removed)
            .collect();
        let mut values = Vec::new();
        for target in all.iter().filter(|t| !t.exclude) {
            let mut found = self.collect(target, parsed);
            if !target.count {
                found.retain(|(name, _)| {
                    !excluded
                        .iter()
                        .any(|x| x.variable == target.variable && self.selects(x, name.key()))
                });
            }
            values.extend(found);
        }
        values
    }

    /// Whether target `x`'s selector names `key` (no selector: all).
    fn selects(&self, x: &Target, key: &str) -> bool {
        x.selector
            .as_ref()
            .is_none_or(|selector| self.selector_keeps(selector, key))
    }

    /// Whether `selector` names `key`.
    fn selector_keeps(&self, selector: &super::rule::Selector, key: &str) -> bool {
        match selector {
            super::rule::Selector::Name(name) => name.eq_ignore_ascii_case(key),
            super::rule::Selector::Pattern(pattern) => self.pattern_matches(pattern, key),
        }
    }

    fn pattern_matches(&self, pattern: &str, key: &str) -> bool {
        match self.set.patterns.get(pattern) {
            Some(re) => re.is_match(key.as_bytes()),
            None => compile_selector(pattern).is_ok_and(|re| re.is_match(key.as_bytes())),
        }
    }

    /// A target's values with their names (`ARGS:x`); a count target's
    /// one value, the count.
    fn collect<'p>(&self, target: &Target, parsed: &'p Parsed) -> Vec<Value<'p>>
    where
        'a: 'p,
    {
        let variable = target.variable;
        let label = variable.name();
        let mut keyed: Vec<Value<'p>> = Vec::new();
        let request: &'a Request = self.request;
        // Only the values the selector names are copied out.
        let selector = target
            .selector
            .as_ref()
            .filter(|_| variable != Variable::Xml);
        let keep = |key: &str| selector.is_none_or(|s| self.selector_keeps(s, key));
        let pairs = |list: &mut Vec<Value<'p>>, pairs: &'p [(Vec<u8>, Vec<u8>)], names: bool| {
            for (name, value) in pairs {
                let key = String::from_utf8_lossy(name);
                if !keep(&key) {
                    continue;
                }
                let value: &'p [u8] = if names { name } else { value };
                list.push((Name::keyed(label, key), Cow::Borrowed(value)));
            }
        };
        let headers = |list: &mut Vec<Value<'p>>, headers: &'p [(String, Vec<u8>)], names: bool| {
            for (name, value) in headers.iter().filter(|(name, _)| keep(name)) {
                let value: &'p [u8] = if names { name.as_bytes() } else { value };
                list.push((
                    Name::keyed(label, Cow::Borrowed(name)),
                    Cow::Borrowed(value),
                ));
            }
        };
        let body_allowed = matches!(parsed.processor, None | Some(BodyProcessor::UrlEncoded))
            || self.force_body_variable;
        let mut whole: Option<Cow<'p, [u8]>> = match variable {
            Variable::Args => {
                pairs(&mut keyed, &parsed.args_get, false);
                pairs(&mut keyed, &parsed.args_post, false);
                None
            }
            Variable::ArgsNames => {
                pairs(&mut keyed, &parsed.args_get, true);
                pairs(&mut keyed, &parsed.args_post, true);
                None
            }
            Variable::ArgsGet => {
                pairs(&mut keyed, &parsed.args_get, false);
                None
            }
            Variable::ArgsGetNames => {
                pairs(&mut keyed, &parsed.args_get, true);
                None
            }
            Variable::ArgsPost => {
                pairs(&mut keyed, &parsed.args_post, false);
                None
            }
            Variable::ArgsPostNames => {
                pairs(&mut keyed, &parsed.args_post, true);
                None
            }
            Variable::ArgsCombinedSize => {
                let size: usize = parsed
                    .args_get
                    .iter()
                    .chain(&parsed.args_post)
                    .map(|(n, v)| n.len() + v.len())
                    .sum();
                Some(Cow::Owned(size.to_string().into_bytes()))
            }
            Variable::Files => {
                pairs(&mut keyed, &parsed.files, false);
                None
            }
            Variable::FilesNames => {
                pairs(&mut keyed, &parsed.files, true);
                None
            }
            Variable::FilesCombinedSize => {
                Some(Cow::Owned(parsed.files_size.to_string().into_bytes()))
            }
            Variable::MultipartPartHeaders => {
                pairs(&mut keyed, &parsed.part_headers, false);
                None
            }
            Variable::MatchedVar => Some(Cow::Owned(self.matched_var.1.clone())),
            Variable::MatchedVarName => Some(Cow::Owned(self.matched_var.0.clone().into_bytes())),
            Variable::MatchedVars => {
                for (name, value) in self.matched_vars.iter().filter(|(n, _)| keep(name_key(n))) {
                    keyed.push((Name::parse(name), Cow::Owned(value.clone())));
                }
                None
            }
            Variable::MatchedVarsNames => {
                for (name, _) in self.matched_vars.iter().filter(|(n, _)| keep(name_key(n))) {
                    keyed.push((Name::parse(name), Cow::Owned(name.clone().into_bytes())));
                }
                None
            }
            Variable::QueryString => Some(Cow::Borrowed(&parsed.query[..])),
            Variable::RemoteAddr => Some(Cow::Borrowed(request.remote_addr.as_bytes())),
            Variable::ReqbodyError => Some(Cow::Borrowed(if parsed.body_error.is_some() {
                b"1"
            } else {
                b"0"
            })),
            Variable::ReqbodyProcessor => Some(Cow::Borrowed(
                parsed.processor.map_or("", BodyProcessor::name).as_bytes(),
            )),
            Variable::RequestBasename => Some(Cow::Borrowed(&parsed.basename[..])),
            Variable::RequestBody => body_allowed.then_some(Cow::Borrowed(&request.body[..])),
            Variable::RequestBodyLength => {
                Some(Cow::Owned(request.body.len().to_string().into_bytes()))
            }
            Variable::RequestCookies => {
                pairs(&mut keyed, &parsed.cookies, false);
                None
            }
            Variable::RequestCookiesNames => {
                pairs(&mut keyed, &parsed.cookies, true);
                None
            }
            Variable::RequestFilename => Some(Cow::Borrowed(&parsed.filename[..])),
            Variable::RequestHeaders => {
                headers(&mut keyed, &request.headers, false);
                None
            }
            Variable::RequestHeadersNames => {
                headers(&mut keyed, &request.headers, true);
                None
            }
            Variable::RequestLine => Some(Cow::Owned(
                format!("{} {} {}", request.method, request.uri, request.protocol).into_bytes(),
            )),
            Variable::RequestMethod => Some(Cow::Borrowed(request.method.as_bytes())),
            Variable::RequestProtocol => Some(Cow::Borrowed(request.protocol.as_bytes())),
            Variable::RequestUri | Variable::RequestUriRaw => {
                Some(Cow::Borrowed(request.uri.as_bytes()))
            }
            Variable::ResponseBody => self.response.map(|r| Cow::Borrowed(&r.body[..])),
            Variable::ResponseHeaders => {
                if let Some(response) = self.response {
                    headers(&mut keyed, &response.headers, false);
                }
                None
            }
            Variable::ResponseHeadersNames => {
                if let Some(response) = self.response {
                    headers(&mut keyed, &response.headers, true);
                }
                None
            }
            Variable::ResponseStatus => self
                .response
                .map(|r| Cow::Owned(r.status.to_string().into_bytes())),
            Variable::Tx => {
                match selector {
                    // One variable by name: looked up, not searched for.
                    Some(super::rule::Selector::Name(key)) => {
                        let key = key.to_ascii_lowercase();
                        if let Some(value) = self.tx.get(&key) {
                            keyed.push((
                                Name::keyed("TX", Cow::Owned(key)),
                                Cow::Owned(value.clone()),
                            ));
                        }
                    }
                    _ => {
                        let mut names: Vec<&String> =
                            self.tx.keys().filter(|name| keep(name)).collect();
                        names.sort();
                        for name in names {
                            keyed.push((
                                Name::keyed("TX", Cow::Owned(name.clone())),
                                Cow::Owned(self.tx[name].clone()),
                            ));
                        }
                    }
                }
                None
            }
            Variable::UniqueId => Some(Cow::Borrowed(request.id.as_bytes())),
            Variable::Xml => {
                let list = match &target.selector {
                    Some(super::rule::Selector::Name(path)) if path == "//@*" => {
                        &parsed.xml_attributes
                    }
                    _ => &parsed.xml_text,
                };
                for value in list {
                    keyed.push((Name::whole("XML"), Cow::Borrowed(&value[..])));
                }
                None
            }
        };
        // A single value's variable has no parts to select.
        let found = match whole.take() {
            Some(value) => vec![(Name::whole(label), value)],
            None => keyed,
        };
        if target.count {
            return vec![(
                Name::whole(label),
                Cow::Owned(found.len().to_string().into_bytes()),
            )];
        }
        found
    }
}

/// A value as a rule reads it: its name and the bytes.
type Value<'p> = (Name<'p>, Cow<'p, [u8]>);

/// A value's name: its variable and, in a collection, its key
/// (`ARGS:x`); written out only for a value a rule matched.
#[derive(Debug, Clone)]
struct Name<'p> {
    label: Cow<'p, str>,
    key: Option<Cow<'p, str>>,
}

impl<'p> Name<'p> {
    fn whole(label: &'static str) -> Self {
        Name {
            label: Cow::Borrowed(label),
            key: None,
        }
    }

    fn keyed(label: &'static str, key: Cow<'p, str>) -> Self {
        Name {
            label: Cow::Borrowed(label),
            key: Some(key),
        }
    }

    /// A name as it was written out (`ARGS:x`), read back.
    fn parse(text: &str) -> Name<'static> {
        match text.split_once(':') {
            Some((label, key)) => Name {
                label: Cow::Owned(label.to_owned()),
                key: Some(Cow::Owned(key.to_owned())),
            },
            None => Name {
                label: Cow::Owned(text.to_owned()),
                key: None,
            },
        }
    }

    /// What a selector compares: the key, or the variable's name.
    fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(&self.label)
    }

    fn text(&self) -> String {
        match &self.key {
            Some(key) => format!("{}:{key}", self.label),
            None => self.label.to_string(),
        }
    }
}

/// The key of a value's name (`ARGS:x` → `x`).
fn name_key(name: &str) -> &str {
    name.split_once(':').map_or(name, |(_, key)| key)
}

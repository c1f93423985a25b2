//! `[waf.rulesets]` and `routes.waf` (DESIGN §24): rule files read
//! through the confined reader (hashed into `config_version`), compiled
//! once, and shared with the active configuration's rule set when
//! nothing it was compiled from changed. A rule refused names its file,
//! line and rule id. Fixture: `fixtures/configs/invalid/waf.toml`.

use super::*;
use crate::config::{
    FileRouteWaf, FileRouteWafSetting, FileSize, FileWafExclusion, FileWafRuleset,
};
use crate::plan::{RouteWafSpec, WafExclusion, WafLimitAction, WafRuleset};

/// `request_body_limit` when not given (CRS's recommended 128 KiB), and
/// the largest accepted: a body up to it is held in memory per request.
const DEFAULT_BODY_LIMIT: u64 = 128 << 10;
const MAX_BODY_LIMIT: u64 = 64 << 20;
/// `response_body_limit` when not given: ModSecurity's recommended
/// `SecResponseBodyLimit` (512 KiB).
const DEFAULT_RESPONSE_BODY_LIMIT: u64 = 512 << 10;
/// The id of the rule that carries the rule set's settings into CRS's
/// variables, loaded before the files (outside CRS's id ranges).
const SETTINGS_RULE_ID: u32 = 899_000;

impl Validator<'_> {
    /// `[waf.rulesets.NAME]`, compiled (or taken over from `active`).
    pub(super) fn waf_rulesets(
        &mut self,
        file: &FileConfig,
        active: &BTreeMap<String, Arc<WafRuleset>>,
    ) -> BTreeMap<String, Arc<WafRuleset>> {
        let mut out = BTreeMap::new();
        self.waf_names = file
            .waf
            .iter()
            .flat_map(|w| w.rulesets.keys().cloned())
            .collect();
        for (name, set) in file.waf.iter().flat_map(|w| &w.rulesets) {
            let at = |field: &str| format!("waf.rulesets.{}.{field}", quote_key(name));
            if !is_valid_name(name) {
                self.error(
                    Code::InvalidName,
                    format!("waf.rulesets.{}", quote_key(name)),
                    format!("rule set name '{name}': lowercase letters, digits, '-' and '_'"),
                );
                continue;
            }
            if let Some(ruleset) = self.waf_ruleset(name, set, &at, active.get(name)) {
                out.insert(name.clone(), ruleset);
            }
        }
        out
    }

    fn waf_ruleset(
        &mut self,
        name: &str,
        set: &FileWafRuleset,
        at: &dyn Fn(&str) -> String,
        active: Option<&Arc<WafRuleset>>,
    ) -> Option<Arc<WafRuleset>> {
        let paranoia = set.paranoia.unwrap_or(1);
        let mut ok = true;
        if !(1..=4).contains(&paranoia) {
            self.error(
                Code::InvalidValue,
                at("paranoia"),
                format!("paranoia = {paranoia}: CRS's levels are 1 to 4"),
            );
            ok = false;
        }
        let inbound_threshold = set.inbound_threshold.unwrap_or(5);
        if inbound_threshold == 0 {
            self.error(
                Code::InvalidValue,
                at("inbound_threshold"),
                "inbound_threshold = 0 would block every request: at least 1 (CRS's default is 5)",
            );
            ok = false;
        }
        let outbound_threshold = set.outbound_threshold.unwrap_or(4);
        if outbound_threshold == 0 {
            self.error(
                Code::InvalidValue,
                at("outbound_threshold"),
                "outbound_threshold = 0 would refuse every answer: at least 1 (CRS's default is 4)",
            );
            ok = false;
        }
        let request_body_limit = match &set.request_body_limit {
            None => Some(DEFAULT_BODY_LIMIT),
            Some(size) => self.waf_body_limit(at("request_body_limit"), size),
        };
        ok &= request_body_limit.is_some();
        let response_body_limit = match &set.response_body_limit {
            None => Some(DEFAULT_RESPONSE_BODY_LIMIT),
            Some(size) => self.waf_body_limit(at("response_body_limit"), size),
        };
        ok &= response_body_limit.is_some();
        let limit_action = match set.request_body_limit_action.as_deref() {
            None | Some("reject") => WafLimitAction::Reject,
            Some("process_partial") => WafLimitAction::ProcessPartial,
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    at("request_body_limit_action"),
                    format!("request_body_limit_action = '{other}': \"reject\" (413) or \"process_partial\""),
                );
                ok = false;
                WafLimitAction::Reject
            }
        };
        if set.files.is_empty() {
            self.error(
                Code::MissingKey,
                at("files"),
                format!("rule set '{name}' has no rule files"),
            );
            return None;
        }
        // The settings first, then each file as read: what the digest
        // covers besides the data files.
        let settings = format!(
            "SecAction \"id:{SETTINGS_RULE_ID},phase:1,pass,nolog,\
             setvar:tx.blocking_paranoia_level={paranoia},\
             setvar:tx.inbound_anomaly_score_threshold={inbound_threshold},\
             setvar:tx.outbound_anomaly_score_threshold={outbound_threshold}\""
        );
        let mut texts = vec![(PathBuf::from("<settings>"), settings)];
        for (i, entry) in set.files.iter().enumerate() {
            let path = format!("{}[{i}]", at("files"));
            for name in self.waf_file_names(&path, entry) {
                let Some(bytes) = self.read_file(path.clone(), &name) else {
                    ok = false;
                    continue;
                };
                match String::from_utf8(bytes) {
                    Ok(text) => texts.push((PathBuf::from(name), text)),
                    Err(_) => {
                        self.error(
                            Code::InvalidRule,
                            path.clone(),
                            format!("'{name}' is not UTF-8 text"),
                        );
                        ok = false;
                    }
                }
            }
        }
        let (request_body_limit, response_body_limit, true) =
            (request_body_limit?, response_body_limit?, ok)
        else {
            return None;
        };
        let mut digest = Sha256::new();
        digest.update(
            format!("{request_body_limit}\0{limit_action:?}\0{response_body_limit}\0").as_bytes(),
        );
        for (name, text) in &texts {
            hash_file(
                &mut digest,
                b"rules",
                &name.to_string_lossy(),
                text.as_bytes(),
            );
        }
        // Unchanged since the active configuration (its data files too):
        // the compiled set is shared, not compiled again.
        if let Some(active) = active {
            let mut same = digest.clone();
            let mut read = Vec::with_capacity(active.data_files.len());
            for data in &active.data_files {
                if let Some(bytes) = self.probe_file(data) {
                    hash_file(&mut same, b"data", data, &bytes);
                    read.push((data.clone(), bytes));
                }
            }
            if read.len() == active.data_files.len()
                && <[u8; 32]>::from(same.finalize()) == active.digest
            {
                self.referenced.extend(read);
                return Some(Arc::clone(active));
            }
        }
        let base_dir = self.base_dir.to_path_buf();
        let mut data: Vec<(String, Vec<u8>)> = Vec::new();
        let loaded = {
            let mut read = |file: &Path| -> Result<Vec<u8>, String> {
                let name = file
                    .strip_prefix(&base_dir)
                    .unwrap_or(file)
                    .display()
                    .to_string();
                match self.probe_file(&name) {
                    Some(bytes) => {
                        data.push((name, bytes.clone()));
                        Ok(bytes)
                    }
                    None => Err(
                        "cannot be read inside the configuration's folder and runtime.file_roots"
                            .to_owned(),
                    ),
                }
            };
            crate::waf::RuleSet::load_texts(&texts, &mut read)
        };
        let rules = match loaded {
            Ok(rules) => rules,
            Err(errors) => {
                for e in errors {
                    let rule = e.rule.map_or(String::new(), |id| format!(", rule {id}"));
                    self.error(
                        Code::InvalidRule,
                        at("files"),
                        format!(
                            "rule set '{name}': {}:{}{rule}: {}",
                            e.file.display(),
                            e.line,
                            e.message
                        ),
                    );
                }
                return None;
            }
        };
        let mut data_files = Vec::with_capacity(data.len());
        for (name, bytes) in data {
            hash_file(&mut digest, b"data", &name, &bytes);
            self.referenced.push((name.clone(), bytes));
            data_files.push(name);
        }
        Some(Arc::new(WafRuleset {
            name: name.to_owned(),
            digest: digest.finalize().into(),
            data_files,
            rule_count: rules.rules().count().saturating_sub(1),
            answer_phases: rules.reads_answers(),
            rules,
            paranoia,
            inbound_threshold,
            outbound_threshold,
            request_body_limit,
            limit_action,
            response_body_limit,
        }))
    }

    fn waf_body_limit(&mut self, path: String, size: &FileSize) -> Option<u64> {
        let limit = self.size(path.clone(), size)?;
        if limit > MAX_BODY_LIMIT {
            self.error(
                Code::InvalidValue,
                path,
                format!("{limit} bytes: at most 64MiB (a body up to it is held in memory)"),
            );
            return None;
        }
        Some(limit)
    }

    /// A `files` entry: a file, or a folder's `.conf` files in name order.
    fn waf_file_names(&mut self, path: &str, entry: &str) -> Vec<String> {
        let (resolved, inside) = self.confined(entry);
        if !inside || !resolved.is_dir() {
            return vec![entry.to_owned()];
        }
        match crate::waf::conf_files(&resolved) {
            Ok(files) if !files.is_empty() => files
                .iter()
                .filter_map(|f| f.file_name())
                .map(|f| format!("{}/{}", entry.trim_end_matches('/'), f.to_string_lossy()))
                .collect(),
            Ok(_) => {
                self.error(
                    Code::MissingKey,
                    path.to_owned(),
                    format!("folder '{entry}' holds no .conf rule file"),
                );
                Vec::new()
            }
            Err(e) => {
                self.error(
                    Code::UnreadableFile,
                    path.to_owned(),
                    format!("cannot list '{entry}': {e}"),
                );
                Vec::new()
            }
        }
    }

    /// A route's `waf`: the spec, and whether it wrote `"none"`; `None`
    /// when refused.
    pub(super) fn route_waf_setting(
        &mut self,
        at: &str,
        setting: &FileRouteWafSetting,
    ) -> Option<(Option<RouteWafSpec>, bool)> {
        match setting {
            FileRouteWafSetting::Keyword(word) if word == "none" => Some((None, true)),
            FileRouteWafSetting::Keyword(word) => {
                self.error(
                    Code::InvalidValue,
                    at.to_owned(),
                    format!("waf = '{word}': write \"none\" (not the listener's default either) or {{ ruleset = \"crs\" }}"),
                );
                None
            }
            FileRouteWafSetting::Table(waf) => Some((Some(self.route_waf(at, waf)?), false)),
        }
    }

    /// `waf = { ruleset, mode, exclusions }` (a route's, or a listener's
    /// default).
    pub(super) fn route_waf(&mut self, at: &str, waf: &FileRouteWaf) -> Option<RouteWafSpec> {
        if !self.waf_names.contains(&waf.ruleset) {
            self.error(
                Code::UnknownWafRuleset,
                format!("{at}.ruleset"),
                format!(
                    "waf.ruleset = '{}' is not a [waf.rulesets] entry",
                    waf.ruleset
                ),
            );
            return None;
        }
        let mode = match waf.mode.as_deref() {
            None | Some("block") => crate::waf::Mode::Block,
            Some("detect") => crate::waf::Mode::Detect,
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    format!("{at}.mode"),
                    format!("waf.mode = '{other}': \"block\" or \"detect\""),
                );
                return None;
            }
        };
        let mut exclusions = Vec::with_capacity(waf.exclusions.len());
        let mut ok = true;
        for (i, x) in waf.exclusions.iter().enumerate() {
            let at = format!("{at}.exclusions[{i}]");
            match self.waf_exclusion(&at, x) {
                Some(x) => exclusions.push(x),
                None => ok = false,
            }
        }
        ok.then(|| RouteWafSpec {
            ruleset: waf.ruleset.clone(),
            mode,
            exclusions,
        })
    }

    /// One of `waf.exclusions`: rule ids, targets (one variable, or one
    /// value of it by name), path prefixes.
    fn waf_exclusion(&mut self, at: &str, x: &FileWafExclusion) -> Option<WafExclusion> {
        if x.rule_ids.is_empty() && x.targets.is_empty() {
            self.error(
                Code::MissingKey,
                format!("{at}.rule_ids"),
                "an exclusion names rule_ids, targets or both (to run no rule at all, leave out `waf`)",
            );
            return None;
        }
        let mut ok = true;
        let mut targets = Vec::with_capacity(x.targets.len());
        for (j, text) in x.targets.iter().enumerate() {
            let parsed = crate::waf::targets(text).and_then(|found| match found.as_slice() {
                [one] if !one.count && !one.exclude => match &one.selector {
                    Some(crate::waf::Selector::Pattern(_)) => {
                        Err("a /regex/ selector: name the value (`ARGS:password`)".to_owned())
                    }
                    _ => Ok(one.clone()),
                },
                _ => Err(
                    "one variable, or one value of it (`ARGS:password`), without `!` or `&`"
                        .to_owned(),
                ),
            });
            match parsed {
                Ok(target) => targets.push(target),
                Err(why) => {
                    self.error(
                        Code::InvalidValue,
                        format!("{at}.targets[{j}]"),
                        format!("target '{text}': {why}"),
                    );
                    ok = false;
                }
            }
        }
        for (j, path) in x.paths.iter().enumerate() {
            if !path.starts_with('/') {
                self.error(
                    Code::InvalidValue,
                    format!("{at}.paths[{j}]"),
                    format!("path '{path}': a path prefix starts with '/'"),
                );
                ok = false;
            }
        }
        ok.then(|| WafExclusion {
            rule_ids: x.rule_ids.clone(),
            targets,
            paths: x.paths.clone(),
        })
    }
}

/// One input of a rule set's digest: its kind, name and contents.
fn hash_file(digest: &mut Sha256, kind: &[u8], name: &str, bytes: &[u8]) {
    digest.update(b"\0");
    digest.update(kind);
    digest.update(b"\0");
    digest.update(name.as_bytes());
    digest.update(b"\0");
    digest.update((bytes.len() as u64).to_be_bytes());
    digest.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigText;

    fn at(dir: &Path, text: &str) -> ConfigText {
        ConfigText::inline(text.to_owned(), dir.to_path_buf(), "<t>")
    }

    #[test]
    fn an_unchanged_rule_set_is_shared_and_a_changed_input_compiles_again() {
        let dir = tempfile::tempdir().expect("dir");
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text);
        write(
            "rules.conf",
            "SecRule ARGS \"@pmFromFile words.data\" \"id:1,phase:2,deny\"\n",
        )
        .expect("rules");
        write("words.data", "attack\n").expect("data");
        let text = "[waf.rulesets.main]\nfiles = [\"rules.conf\"]\n";
        let check = |text: &str, active: Option<&Spec>| {
            validate_against(&at(dir.path(), text), None, active).expect("valid")
        };
        let first = check(text, None);
        let same = check(text, Some(&first));
        assert!(Arc::ptr_eq(
            &first.waf_rulesets["main"],
            &same.waf_rulesets["main"]
        ));
        assert_eq!(first.config_version, same.config_version);
        // A setting is part of what was compiled.
        let stricter = check(&format!("{text}paranoia = 2\n"), Some(&first));
        assert!(!Arc::ptr_eq(
            &first.waf_rulesets["main"],
            &stricter.waf_rulesets["main"]
        ));
        // And of the version: a paranoia change alone is a change (it
        // was "unchanged" while `[waf]` was left out of the canonical
        // text).
        assert_ne!(first.config_version, stricter.config_version);
        // So is a data file a rule reads: a new version, compiled again,
        // and the same version a fresh validation gives.
        write("words.data", "attack\nexploit\n").expect("data");
        let changed = check(text, Some(&first));
        assert!(!Arc::ptr_eq(
            &first.waf_rulesets["main"],
            &changed.waf_rulesets["main"]
        ));
        assert_ne!(first.config_version, changed.config_version);
        assert_eq!(check(text, None).config_version, changed.config_version);
    }

    /// The Core Rule Set compiled, then a candidate that keeps it: the
    /// time each validation takes (printed; the second reads the files
    /// and shares the compiled set).
    #[test]
    fn keeping_the_core_rule_set_costs_no_compilation() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/crs");
        let Ok(root) = std::fs::canonicalize(root) else {
            eprintln!("skipped: ../shared/crs is not beside the project");
            return;
        };
        let dir = tempfile::tempdir().expect("dir");
        let text = format!(
            "[waf.rulesets.crs]\nfiles = [\"{0}/crs-setup.conf.example\", \"{0}/rules\"]\n",
            root.display()
        );
        let roots = [root.clone()];
        let timed = |active: Option<&Spec>| {
            let started = std::time::Instant::now();
            let spec =
                validate_against(&at(dir.path(), &text), Some(&roots), active).expect("valid");
            (spec, started.elapsed())
        };
        let (first, compiled) = timed(None);
        let (kept, shared) = timed(Some(&first));
        eprintln!("CRS: compiled in {compiled:?}, kept in {shared:?}");
        assert!(Arc::ptr_eq(
            &first.waf_rulesets["crs"],
            &kept.waf_rulesets["crs"]
        ));
        assert!(shared * 4 < compiled, "{shared:?} against {compiled:?}");
    }
}

//! The cases of the OWASP CRS regression corpus
//! (`../shared/crs/tests/regression/tests`), read: each stage's request
//! as go-ftw sends it and the rule ids it expects to match or not.
//! Shared, by path, between the in-process corpus test (`corpus.rs`) and
//! the one through the real binary (`tests/it/waf_corpus.rs`), so that
//! both read the corpus the same way.

use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

/// CRS's test set-up beside `crs-setup.conf`: every paranoia level,
/// UTF-8 validation and the argument limits its cases are written for.
pub const TEST_SETUP: &str = "SecAction \"id:900005,phase:1,nolog,pass,\
    ctl:ruleRemoveById=910000,\
    setvar:tx.blocking_paranoia_level=4,\
    setvar:tx.crs_validate_utf8_encoding=1,\
    setvar:tx.arg_name_length=100,\
    setvar:tx.arg_length=400,\
    setvar:tx.total_arg_length=64000,\
    setvar:tx.max_num_args=255,\
    setvar:tx.max_file_size=64100,\
    setvar:tx.combined_file_sizes=65535\"\n";

/// How one case went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// Why not: the ids missing and the ids that should not have matched.
    Failed(String),
    /// Only an HTTP status is expected: not judged in process.
    StatusOnly,
    /// The case cannot be read.
    Unreadable(String),
}

/// One stage of a case.
pub struct Stage {
    /// `942100-3`.
    pub name: String,
    pub expect: Vec<u32>,
    pub refuse: Vec<u32>,
    /// The request, or why it cannot be read.
    pub input: Result<Input, String>,
}

impl Stage {
    /// Only an HTTP status is expected (no rule ids either way).
    pub fn status_only(&self) -> bool {
        self.expect.is_empty() && self.refuse.is_empty()
    }
}

/// A stage's request.
pub enum Input {
    /// `encoded_request`: the bytes as sent.
    Raw(Vec<u8>),
    /// The request's parts, headers completed as go-ftw completes them
    /// (`Content-Length` and a form `Content-Type` for a body).
    Parts {
        method: String,
        uri: String,
        version: String,
        headers: Vec<(String, Vec<u8>)>,
        data: Vec<u8>,
    },
}

impl Input {
    /// The bytes go-ftw writes to the connection (the corpus through the
    /// real binary sends them; the in-process run reads the parts).
    #[allow(dead_code)]
    pub fn wire(&self) -> Vec<u8> {
        match self {
            Input::Raw(raw) => raw.clone(),
            Input::Parts {
                method,
                uri,
                version,
                headers,
                data,
            } => {
                let mut out = format!("{method} {uri} {version}\r\n").into_bytes();
                for (name, value) in headers {
                    out.extend_from_slice(name.as_bytes());
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(value);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(data);
                out
            }
        }
    }
}

/// The Core Rule Set beside the project.
pub fn crs_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/crs")
}

/// Every stage of every case, in file order; a file that is not YAML is
/// one stage that cannot be read.
pub fn stages() -> Vec<Stage> {
    let mut files = Vec::new();
    collect_yaml(&crs_root().join("tests/regression/tests"), &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        out.extend(stages_of(&file, None));
    }
    out
}

/// The stages of case `case` (`942100-3`).
pub fn stages_of_case(case: &str) -> Vec<Stage> {
    let Some((rule, id)) = case.split_once('-') else {
        return Vec::new();
    };
    let mut files = Vec::new();
    collect_yaml(&crs_root().join("tests/regression/tests"), &mut files);
    files
        .iter()
        .filter(|f| f.file_stem().is_some_and(|s| s == rule))
        .flat_map(|f| stages_of(f, Some(id)))
        .collect()
}

fn stages_of(file: &Path, only: Option<&str>) -> Vec<Stage> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let Ok(docs) = YamlLoader::load_from_str(&text) else {
        return vec![Stage {
            name: file.display().to_string(),
            expect: Vec::new(),
            refuse: Vec::new(),
            input: Err("not YAML".into()),
        }];
    };
    let Some(doc) = docs.first() else {
        return Vec::new();
    };
    let rule = doc["rule_id"].as_i64().unwrap_or_default();
    let mut out = Vec::new();
    for test in doc["tests"].as_vec().into_iter().flatten() {
        let id = test["test_id"].as_i64().unwrap_or_default();
        if only.is_some_and(|only| only != id.to_string()) {
            continue;
        }
        for stage in test["stages"].as_vec().into_iter().flatten() {
            let output = &stage["output"];
            out.push(Stage {
                name: format!("{rule}-{id}"),
                expect: ids(&output["log"]["expect_ids"]),
                refuse: ids(&output["log"]["no_expect_ids"]),
                input: input_of(&stage["input"]),
            });
        }
    }
    out
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_yaml(&path, out);
        } else if path.extension().is_some_and(|x| x == "yaml") {
            out.push(path);
        }
    }
}

fn ids(list: &Yaml) -> Vec<u32> {
    list.as_vec()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_i64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn input_of(input: &Yaml) -> Result<Input, String> {
    if let Some(encoded) = input["encoded_request"].as_str() {
        use base64::Engine as _;
        return base64::engine::general_purpose::STANDARD
            .decode(encoded.split_whitespace().collect::<String>())
            .map(Input::Raw)
            .map_err(|e| format!("encoded_request: {e}"));
    }
    let text = |key: &str, default: &str| input[key].as_str().unwrap_or(default).to_owned();
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(map) = input["headers"].as_hash() {
        for (name, value) in map {
            let name = name.as_str().unwrap_or_default().to_owned();
            let value = match value {
                Yaml::String(s) => s.clone(),
                Yaml::Integer(n) => n.to_string(),
                Yaml::Real(r) => r.clone(),
                Yaml::Boolean(b) => b.to_string(),
                _ => String::new(),
            };
            headers.push((name, value.into_bytes()));
        }
    }
    let data = input["data"]
        .as_str()
        .unwrap_or_default()
        .as_bytes()
        .to_vec();
    let autocomplete = input["autocomplete_headers"].as_bool().unwrap_or(true);
    let has = |headers: &[(String, Vec<u8>)], name: &str| {
        headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    if autocomplete && !data.is_empty() {
        if !has(&headers, "content-length") {
            headers.push(("Content-Length".into(), data.len().to_string().into_bytes()));
        }
        if !has(&headers, "content-type") {
            headers.push((
                "Content-Type".into(),
                b"application/x-www-form-urlencoded".to_vec(),
            ));
        }
    }
    Ok(Input::Parts {
        method: text("method", "GET"),
        uri: text("uri", "/"),
        version: text("version", "HTTP/1.1"),
        headers,
        data,
    })
}

/// A stage's outcome, given the rule ids that matched.
pub fn judge(stage: &Stage, matched: &[u32]) -> Outcome {
    let missing: Vec<u32> = stage
        .expect
        .iter()
        .copied()
        .filter(|id| !matched.contains(id))
        .collect();
    let unwanted: Vec<u32> = stage
        .refuse
        .iter()
        .copied()
        .filter(|id| matched.contains(id))
        .collect();
    if missing.is_empty() && unwanted.is_empty() {
        Outcome::Passed
    } else {
        let mut why = Vec::new();
        if !missing.is_empty() {
            why.push(format!("expected {missing:?} did not match"));
        }
        if !unwanted.is_empty() {
            why.push(format!("{unwanted:?} matched"));
        }
        Outcome::Failed(why.join("; "))
    }
}

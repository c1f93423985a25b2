//! Reading Kubernetes resources from YAML (multi-document files and
//! folders), and a field tracker that reports every field the importer
//! did not read, so nothing is dropped without a word.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// One resource of the input, in the order read.
#[derive(Debug, Clone)]
pub struct Resource {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub namespace: String,
    /// `metadata.creationTimestamp` (RFC 3339 sorts as text); empty
    /// when absent, which sorts first, like the oldest.
    pub created: String,
    pub labels: Map<String, Value>,
    pub body: Value,
    /// Where it was read: `file` and document number.
    pub origin: String,
}

impl Resource {
    pub fn group(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map_or("", |(group, _)| group)
    }

    pub fn version(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map_or(self.api_version.as_str(), |(_, v)| v)
    }

    /// `Kind namespace/name`, as messages name it.
    pub fn id(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }

    /// A tracker over the resource's `spec`.
    pub fn spec(&self) -> Fields<'_> {
        Fields::new(self.body.get("spec").unwrap_or(&Value::Null), "spec".into())
    }
}

/// Every `.yaml`/`.yml` file of the paths (folders read in name order,
/// not recursively), each document a resource. `List` kinds are opened.
pub fn read(paths: &[PathBuf]) -> Result<Vec<Resource>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|e| format!("{}: cannot read the folder: {e}", path.display()))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                // Hidden files are an editor's or a rename's temporaries
                // (and a ConfigMap's `..data`), never resources.
                .filter(|p| {
                    let hidden = p
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with('.'));
                    !hidden
                        && p.extension()
                            .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
                })
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("{}: cannot read: {e}", file.display()))?;
        parse(&text, &file, &mut out)?;
    }
    Ok(out)
}

/// The resources of one file's text.
pub fn parse(text: &str, file: &Path, out: &mut Vec<Resource>) -> Result<(), String> {
    let documents = YamlLoader::load_from_str(text)
        .map_err(|e| format!("{}: not YAML: {e}", file.display()))?;
    for (i, document) in documents.iter().enumerate() {
        let origin = format!("{} (document {})", file.display(), i + 1);
        let value = to_json(document);
        if value.is_null() {
            continue;
        }
        push(value, &origin, out)?;
    }
    Ok(())
}

fn push(value: Value, origin: &str, out: &mut Vec<Resource>) -> Result<(), String> {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{origin}: a resource without `kind`"))?
        .to_owned();
    if kind.ends_with("List") {
        if let Some(items) = value.get("items").and_then(Value::as_array) {
            for item in items {
                push(item.clone(), origin, out)?;
            }
        }
        return Ok(());
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{origin}: {kind} without `apiVersion`"))?
        .to_owned();
    let metadata = value.get("metadata").cloned().unwrap_or(Value::Null);
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{origin}: {kind} without `metadata.name`"))?
        .to_owned();
    let text = |key: &str| metadata.get(key).and_then(Value::as_str).map(str::to_owned);
    out.push(Resource {
        api_version,
        namespace: text("namespace").unwrap_or_else(|| "default".into()),
        created: text("creationTimestamp").unwrap_or_default(),
        labels: metadata
            .get("labels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        kind,
        name,
        body: value,
        origin: origin.to_owned(),
    });
    Ok(())
}

/// A YAML value as JSON (keys as strings; aliases and bad values null).
pub fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::String(text.clone()), Value::Number),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(hash) => Value::Object(
            hash.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        other => format!("{other:?}"),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

/// An object being read: the fields asked for are noted; [`Fields::rest`]
/// names the others (with their paths), which the caller reports as
/// unsupported.
pub struct Fields<'v> {
    value: &'v Value,
    path: String,
    read: RefCell<BTreeSet<String>>,
}

impl<'v> Fields<'v> {
    pub fn new(value: &'v Value, path: String) -> Self {
        Fields {
            value,
            path,
            read: RefCell::default(),
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path of `key` under this object.
    pub fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    pub fn get(&self, key: &str) -> Option<&'v Value> {
        self.read.borrow_mut().insert(key.to_owned());
        self.value.get(key).filter(|v| !v.is_null())
    }

    pub fn str(&self, key: &str) -> Option<&'v str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(Value::as_i64)
    }

    /// A list of objects, each a tracker of its own.
    pub fn list(&self, key: &str) -> Vec<Fields<'v>> {
        let at = self.at(key);
        self.get(key)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Fields::new(v, format!("{at}[{i}]")))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn strings(&self, key: &str) -> Vec<String> {
        self.get(key)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn object(&self, key: &str) -> Option<Fields<'v>> {
        self.get(key)
            .filter(|v| v.is_object())
            .map(|v| Fields::new(v, self.at(key)))
    }

    /// Marks fields as read without using them (status, defaults the
    /// importer gives the same meaning).
    pub fn ignore(&self, keys: &[&str]) {
        let mut read = self.read.borrow_mut();
        for key in keys {
            read.insert((*key).to_owned());
        }
    }

    /// The paths of the fields present and never asked for.
    pub fn rest(&self) -> Vec<String> {
        let read = self.read.borrow();
        self.value
            .as_object()
            .map(|map| {
                map.iter()
                    .filter(|(k, v)| !read.contains(*k) && !v.is_null())
                    .map(|(k, _)| self.at(k))
                    .collect()
            })
            .unwrap_or_default()
    }
}

//! The cutover routes and upstreams an import writes, and their TOML.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::toml_str;

/// The methods a route without `method` stands for, less those routes
/// before it on the same match took (cutover refuses two routes of one
/// match whose methods overlap; the API lets the one with a method win).
pub(super) const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Path {
    Exact(String),
    Prefix(String),
    Regex(String),
    Any,
}

#[derive(Debug, Clone, Default)]
pub(super) struct HeaderEdits {
    pub(super) set: BTreeMap<String, String>,
    pub(super) add: BTreeMap<String, String>,
    pub(super) remove: Vec<String>,
}

impl HeaderEdits {
    /// These edits, then `later`'s: a name `later` sets, adds or removes
    /// is its alone.
    pub(super) fn then(mut self, later: HeaderEdits) -> HeaderEdits {
        for name in later
            .set
            .keys()
            .chain(later.add.keys())
            .chain(&later.remove)
        {
            if later.set.contains_key(name) || later.remove.contains(name) {
                self.set.remove(name);
                self.add.remove(name);
            }
            if later.set.contains_key(name) || later.add.contains_key(name) {
                self.remove.retain(|r| r != name);
            }
        }
        self.set.extend(later.set);
        for (name, value) in later.add {
            match self.set.get_mut(&name) {
                // Set earlier, added to now: the value is both.
                Some(set) => *set = format!("{set},{value}"),
                None => {
                    self.add.insert(name, value);
                }
            }
        }
        for name in later.remove {
            if !self.remove.contains(&name) {
                self.remove.push(name);
            }
        }
        self
    }
}

#[derive(Debug, Clone)]
pub(super) enum Action {
    Upstream(String),
    Respond(u16),
    Redirect(Vec<(String, String)>),
}

#[derive(Debug, Clone)]
pub(super) struct Route {
    pub(super) name: String,
    pub(super) listener: String,
    pub(super) host: Option<String>,
    pub(super) path: Path,
    pub(super) methods: Vec<String>,
    pub(super) headers: BTreeMap<String, String>,
    pub(super) query: BTreeMap<String, String>,
    pub(super) action: Action,
    pub(super) request_headers: Option<HeaderEdits>,
    pub(super) response_headers: Option<HeaderEdits>,
    pub(super) rewrite: Option<(String, String)>,
    pub(super) host_rewrite: Option<String>,
    /// `(upstream, percent)` of each `RequestMirror`.
    pub(super) mirrors: Vec<(String, u32)>,
    pub(super) timeout: Option<String>,
    /// `cors = { … }` (the CORS filter), as written.
    pub(super) cors: Option<String>,
    /// `retry = { … }` (the rule's `retry`), as written.
    pub(super) retry: Option<String>,
    /// The API's precedence (smaller first).
    pub(super) rank: Rank,
}

/// exact path, longest prefix, method, most headers, most query
/// parameters, oldest route, namespace/name, rule, match.
pub(super) type Rank = (
    u8,
    Reverse<usize>,
    u8,
    Reverse<usize>,
    Reverse<usize>,
    usize,
    usize,
    usize,
);

#[derive(Debug, Clone)]
pub(super) struct Upstream {
    /// `h2c` for GRPCRoute backends (`h2` with TLS).
    pub(super) protocol: Option<&'static str>,
    /// TLS to the members (BackendTLSPolicy).
    pub(super) tls: Option<super::policy::BackendTls>,
    /// `(backend entry, weight)`.
    pub(super) backends: Vec<(Backend, u32)>,
    pub(super) weighted: bool,
    /// One member answers 500 on purpose: outlier detection must not
    /// eject it (`max_ejected_percent = 0`).
    pub(super) never_eject: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Backend {
    Addr(String),
    Dns(String),
}

impl Route {
    pub fn upstreams(&self) -> Vec<&str> {
        let mut out = Vec::new();
        if let Action::Upstream(u) = &self.action {
            out.push(u.as_str());
            for (m, _) in &self.mirrors {
                out.push(m.as_str());
            }
        }
        out
    }

    pub fn toml(&self) -> String {
        let mut out = String::from("[[routes]]\n");
        let mut line = |key: &str, value: String| {
            let _ = writeln!(out, "{key} = {value}");
        };
        line("name", toml_str(&self.name));
        line("listeners", format!("[{}]", toml_str(&self.listener)));
        if let Some(host) = &self.host {
            line("hosts", format!("[{}]", toml_str(host)));
        }
        match &self.path {
            Path::Exact(p) => line("path_exact", toml_str(p)),
            Path::Prefix(p) => line("path_prefix", toml_str(p)),
            Path::Regex(p) => line("path_regex", toml_str(p)),
            Path::Any => {}
        }
        if !self.methods.is_empty() {
            line("methods", list(&self.methods));
        }
        if !self.headers.is_empty() {
            line("headers", table(&self.headers));
        }
        if !self.query.is_empty() {
            line("query", table(&self.query));
        }
        match &self.action {
            Action::Upstream(u) => line("upstream", toml_str(u)),
            Action::Respond(status) => line("respond", format!("{{ status = {status} }}")),
            Action::Redirect(parts) => line(
                "redirect",
                format!(
                    "{{ {} }}",
                    parts
                        .iter()
                        .map(|(k, v)| format!("{k} = {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        }
        // What is sent upstream means nothing to an answer made here.
        let forwards = matches!(self.action, Action::Upstream(_));
        if let Some(edits) = self.request_headers.as_ref().filter(|_| forwards) {
            line("request_headers", edits.toml());
        }
        if let Some(edits) = &self.response_headers {
            line("response_headers", edits.toml());
        }
        if let Some((pattern, replacement)) = self.rewrite.as_ref().filter(|_| forwards) {
            line(
                "rewrite",
                format!(
                    "{{ regex = [{}, {}] }}",
                    toml_str(pattern),
                    toml_str(replacement)
                ),
            );
        }
        if let Some(host) = self.host_rewrite.as_ref().filter(|_| forwards) {
            line("host_rewrite", toml_str(host));
        }
        if forwards && !self.mirrors.is_empty() {
            let each: Vec<String> = self
                .mirrors
                .iter()
                .map(|(upstream, percent)| {
                    format!(
                        "{{ upstream = {}, percent = {percent} }}",
                        toml_str(upstream)
                    )
                })
                .collect();
            line(
                "mirror",
                if each.len() == 1 {
                    each[0].clone()
                } else {
                    format!("[{}]", each.join(", "))
                },
            );
        }
        if let Some(timeout) = &self.timeout {
            line("timeout", toml_str(timeout));
        }
        if let Some(cors) = &self.cors {
            line("cors", cors.clone());
        }
        if let Some(retry) = self.retry.as_ref().filter(|_| forwards) {
            line("retry", retry.clone());
        }
        out
    }
}

impl HeaderEdits {
    fn toml(&self) -> String {
        let mut parts = Vec::new();
        if !self.remove.is_empty() {
            parts.push(format!("remove = {}", list(&self.remove)));
        }
        if !self.set.is_empty() {
            parts.push(format!("set = {}", table(&self.set)));
        }
        if !self.add.is_empty() {
            parts.push(format!("add = {}", table(&self.add)));
        }
        format!("{{ {} }}", parts.join(", "))
    }
}

impl Upstream {
    pub fn toml(&self, name: &str) -> String {
        let mut out = format!("[upstreams.{}]\n", toml_str(name));
        if self.weighted {
            out.push_str("policy = \"weighted\"\n");
        }
        let protocol = self.protocol.or(self.tls.as_ref().map(|_| "https"));
        if let Some(protocol) = protocol {
            let _ = writeln!(out, "protocol = {}", toml_str(protocol));
        }
        if let Some(tls) = &self.tls {
            let ca = tls
                .ca
                .as_ref()
                .map(|ca| format!("ca = {}, ", toml_str(ca)))
                .unwrap_or_default();
            let sans = if tls.subject_alt_names.is_empty() {
                String::new()
            } else {
                format!(", subject_alt_names = {}", list(&tls.subject_alt_names))
            };
            let client = match &tls.client {
                Some((cert, key)) => {
                    format!(", cert = {}, key = {}", toml_str(cert), toml_str(key))
                }
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "tls = {{ {ca}server_name = {}{sans}{client} }}",
                toml_str(&tls.server_name)
            );
        }
        let entries: Vec<String> = self
            .backends
            .iter()
            .map(|(b, w)| match b {
                Backend::Addr(a) => format!("{{ addr = {}, weight = {w} }}", toml_str(a)),
                Backend::Dns(d) => format!("{{ dns = {}, weight = {w} }}", toml_str(d)),
            })
            .collect();
        let _ = writeln!(out, "backends = [{}]", entries.join(", "));
        if self.never_eject {
            out.push_str("outlier = { max_ejected_percent = 0 }\n");
        }
        out
    }
}

pub(super) fn list(items: &[String]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|s| toml_str(s))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

pub(super) fn table(map: &BTreeMap<String, String>) -> String {
    format!(
        "{{ {} }}",
        map.iter()
            .map(|(k, v)| format!("{} = {}", toml_str(k), toml_str(v)))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A value written where cutover reads templates: braces doubled.
pub(super) fn literal(value: &str) -> String {
    value.replace('{', "{{").replace('}', "}}")
}

/// A cutover name part from Kubernetes names (`[a-z0-9-.]`): dots
/// become dashes; `_` (never in a Kubernetes name) separates parts.
pub(super) fn part(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

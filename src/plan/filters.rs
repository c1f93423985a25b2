//! Route filters (DESIGN §17), as planned: what a route changes in the
//! requests and answers it passes, compiled once per plan (templates
//! parsed, regexes built, CIDRs read) so that the request path only
//! applies them. A route without filters carries `None`: one check.

use std::fmt;
use std::sync::Arc;

use crate::auth::Auth;

use http::{HeaderName, HeaderValue, StatusCode};
use regex_automata::meta;

use super::pattern::PathRegex;

/// Everything a route may change. What it leaves unset of
/// `request_headers`, `response_headers`, `max_request_body` and
/// `request_id` comes from its listener's `defaults` (a route's own key
/// replaces the default whole).
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// Judged first, on the client address of the edge rules (§13).
    pub access: Option<IpRules>,
    /// Bytes; 413 when `Content-Length` says more, the stream cut past it.
    pub max_request_body: Option<u64>,
    pub rewrite: Option<Rewrite>,
    pub host_rewrite: Option<HostRewrite>,
    /// Keep a valid `x-request-id` or make one; sent up and back, logged.
    pub request_id: Option<bool>,
    pub request_headers: Option<HeaderOps>,
    pub response_headers: Option<HeaderOps>,
    /// `auth` (DESIGN §19): a method, or `"none"` written out against the
    /// listener's default.
    pub auth: Option<RouteAuth>,
    pub cors: Option<Arc<Cors>>,
    pub compress: Option<Arc<Compress>>,
    /// Copies to other upstreams (routes with `upstream` only), each on
    /// its own.
    pub mirrors: Vec<Arc<Mirror>>,
}

/// `mirror = { upstream, percent, max_inflight }` with the route's
/// `mirror_methods`: a share of the route's requests copied to another
/// upstream, the copies' answers discarded.
#[derive(Debug, Clone, PartialEq)]
pub struct Mirror {
    pub upstream: String,
    /// 0 < percent ≤ 100.
    pub percent: f64,
    /// Copies of the route in flight at once; more are dropped.
    pub max_inflight: u32,
    /// Copied besides the idempotent methods (GET, HEAD, OPTIONS, TRACE,
    /// PUT, DELETE).
    pub methods: Vec<http::Method>,
}

/// `compress = { … }`: answers of the listed types, long enough, are
/// compressed for the clients that accept one of the encodings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compress {
    /// The gateway's preference, first first; a client's q-values rank
    /// above it.
    pub encodings: Vec<Encoding>,
    /// Answers whose length is known and shorter go as they are.
    pub min_bytes: u64,
    pub types: Vec<MediaRange>,
    pub level: Level,
}

/// A content coding the gateway makes (it never decodes one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Zstd,
    Brotli,
    Gzip,
}

impl Encoding {
    pub const ALL: [Encoding; 3] = [Encoding::Zstd, Encoding::Brotli, Encoding::Gzip];

    /// Its `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            Encoding::Zstd => "zstd",
            Encoding::Brotli => "br",
            Encoding::Gzip => "gzip",
        }
    }

    /// `token` in a client's `Accept-Encoding` names this coding.
    pub fn named(self, token: &str) -> bool {
        token.eq_ignore_ascii_case(self.token())
            || (self == Encoding::Gzip && token.eq_ignore_ascii_case("x-gzip"))
    }
}

/// `compress.level`, one name for every encoding (their numeric scales
/// differ): gzip 1 / 6 / 9, brotli 1 / 4 / 11, zstd 1 / 3 / 19.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    Fastest,
    #[default]
    Default,
    Best,
}

impl Level {
    pub fn of(self, encoding: Encoding) -> i32 {
        match (encoding, self) {
            (_, Level::Fastest) => 1,
            (Encoding::Gzip, Level::Default) => 6,
            (Encoding::Brotli, Level::Default) => 4,
            (Encoding::Zstd, Level::Default) => 3,
            (Encoding::Gzip, Level::Best) => 9,
            (Encoding::Brotli, Level::Best) => 11,
            (Encoding::Zstd, Level::Best) => 19,
        }
    }
}

/// One entry of `compress.types`, lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaRange {
    /// `text/html`: the type and the subtype.
    Exact(String, String),
    /// `text/*`: the top-level type.
    Type(String),
    /// `application/*+json`: the top-level type and the `+suffix`.
    Suffix(String, String),
}

impl MediaRange {
    /// Whether a `Content-Type` of `top/sub` (its parameters left off)
    /// is in range.
    pub fn admits(&self, top: &str, sub: &str) -> bool {
        match self {
            MediaRange::Exact(t, s) => top.eq_ignore_ascii_case(t) && sub.eq_ignore_ascii_case(s),
            MediaRange::Type(t) => top.eq_ignore_ascii_case(t),
            MediaRange::Suffix(t, suffix) => {
                top.eq_ignore_ascii_case(t)
                    && sub.len() > suffix.len()
                    && sub
                        .get(sub.len() - suffix.len()..)
                        .is_some_and(|end| end.eq_ignore_ascii_case(suffix))
            }
        }
    }
}

/// `cors = { … }`, with every header value it answers made at plan time.
#[derive(Debug)]
pub struct Cors {
    pub origins: Origins,
    pub methods: Vec<http::Method>,
    /// `allow_methods = ["*"]`: every method (answered `*`, or the
    /// method asked for on a credentialed request).
    pub any_method: bool,
    /// `Access-Control-Allow-Methods`.
    pub methods_value: HeaderValue,
    pub allow_headers: AllowHeaders,
    /// `Access-Control-Expose-Headers`, when there are any.
    pub expose: Option<HeaderValue>,
    pub credentials: bool,
    /// `Access-Control-Max-Age`, in seconds.
    pub max_age: Option<HeaderValue>,
}

/// Two compiled CORS policies are equal when they are one.
impl PartialEq for Cors {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Cors {}

#[derive(Debug)]
pub enum Origins {
    /// `"*"`: every origin, answered `*` (never with credentials).
    Any,
    List {
        exact: Vec<String>,
        /// Each must match the whole origin.
        patterns: Vec<PathRegex>,
    },
}

impl Origins {
    pub fn admits(&self, origin: &str) -> bool {
        match self {
            Origins::Any => true,
            Origins::List { exact, patterns } => {
                exact.iter().any(|o| o.eq_ignore_ascii_case(origin))
                    || patterns.iter().any(|p| p.is_match(origin))
            }
        }
    }
}

#[derive(Debug)]
pub enum AllowHeaders {
    /// `"*"`: whatever a preflight asks for (never with credentials).
    Any,
    List(Vec<HeaderName>, Option<HeaderValue>),
}

impl AllowHeaders {
    /// Whether every name of an `Access-Control-Request-Headers` value
    /// is allowed.
    pub fn admits(&self, requested: &str) -> bool {
        match self {
            AllowHeaders::Any => true,
            AllowHeaders::List(names, _) => requested
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .all(|n| names.iter().any(|a| a.as_str().eq_ignore_ascii_case(n))),
        }
    }
}

/// A route's own `auth`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAuth {
    /// `auth = "none"`: the listener's default does not apply.
    Off,
    On(Arc<Auth>),
}

impl Filters {
    /// Whether any filter is set (a route without any carries none).
    pub fn is_empty(&self) -> bool {
        self.auth.is_none() && self.sets_nothing_but_auth()
    }

    /// Whether `auth = "none"` is all the route sets.
    pub fn only_opts_out_of_auth(&self) -> bool {
        matches!(self.auth, Some(RouteAuth::Off)) && self.sets_nothing_but_auth()
    }

    fn sets_nothing_but_auth(&self) -> bool {
        self.access.is_none()
            && self.max_request_body.is_none()
            && self.rewrite.is_none()
            && self.host_rewrite.is_none()
            && self.request_id.is_none()
            && self.request_headers.is_none()
            && self.response_headers.is_none()
            && self.cors.is_none()
            && self.compress.is_none()
            && self.mirrors.is_empty()
    }
}

/// A listener's `defaults`: the filters its routes have unless they set
/// the key themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    pub request_headers: Option<HeaderOps>,
    pub response_headers: Option<HeaderOps>,
    pub max_request_body: Option<u64>,
    pub request_id: Option<bool>,
    pub auth: Option<Arc<Auth>>,
    pub cors: Option<Arc<Cors>>,
    pub compress: Option<Arc<Compress>>,
    /// The cache of every route with an upstream that sets none.
    pub cache: Option<Arc<super::RouteCacheSpec>>,
    /// The web application firewall of every route that sets none.
    pub waf: Option<super::RouteWafSpec>,
}

/// `allow_from` / `deny_from`: a client in `deny` is refused; with an
/// `allow` list, so is a client outside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpRules {
    pub allow: Option<Vec<ipnet::IpNet>>,
    pub deny: Vec<ipnet::IpNet>,
}

impl IpRules {
    pub fn admits(&self, client: std::net::IpAddr) -> bool {
        // An IPv4 client seen through a dual-stack socket is itself.
        let client = match client {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, std::net::IpAddr::V4),
            v4 => v4,
        };
        !self.deny.iter().any(|net| net.contains(&client))
            && self
                .allow
                .as_ref()
                .is_none_or(|allow| allow.iter().any(|net| net.contains(&client)))
    }
}

/// How the forwarded path is made from the routed one.
#[derive(Debug, Clone)]
pub enum Rewrite {
    /// Removed when the path starts with it at a segment boundary.
    StripPrefix(String),
    /// The route's `path_prefix` (`.0`) replaced by `.1`.
    ReplacePrefix(String, String),
    /// The first match replaced; `$1`, `${name}` name its groups.
    Regex(RewriteRegex),
}

#[derive(Clone)]
pub struct RewriteRegex {
    pub regex: meta::Regex,
    pub pattern: String,
    pub replacement: String,
}

impl fmt::Debug for RewriteRegex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RewriteRegex")
            .field(&self.pattern)
            .field(&self.replacement)
            .finish()
    }
}

impl Rewrite {
    /// The path forwarded for `path` (normalized, starting with `/`), or
    /// `None` when this rewrite leaves it as it is.
    pub fn apply(&self, path: &str) -> Option<String> {
        match self {
            Rewrite::StripPrefix(prefix) => {
                let rest = strip_segment_prefix(path, prefix)?;
                Some(if rest.is_empty() {
                    "/".to_owned()
                } else {
                    rest.to_owned()
                })
            }
            Rewrite::ReplacePrefix(prefix, with) => replace_prefix(path, prefix, with),
            Rewrite::Regex(re) => {
                let mut caps = re.regex.create_captures();
                re.regex.captures(path, &mut caps);
                if !caps.is_match() {
                    return None;
                }
                let whole = caps.get_match()?;
                let mut out = String::with_capacity(path.len() + re.replacement.len());
                out.push_str(path.get(..whole.start())?);
                caps.interpolate_string_into(path, &re.replacement, &mut out);
                out.push_str(path.get(whole.end()..)?);
                Some(out)
            }
        }
    }
}

/// `path` with `prefix` replaced by `with`, literally (as Envoy's
/// `prefix_rewrite`; a slash on both sides of the seam is written once);
/// `None` when `path` does not start with `prefix`. For `rewrite` and a
/// redirect's `replace_prefix` alike.
pub fn replace_prefix(path: &str, prefix: &str, with: &str) -> Option<String> {
    let rest = path.strip_prefix(prefix)?;
    let rest = match with.ends_with('/') {
        true => rest.strip_prefix('/').unwrap_or(rest),
        false => rest,
    };
    let out = format!("{with}{rest}");
    Some(if out.is_empty() { "/".to_owned() } else { out })
}

/// `path` without `prefix`, when `prefix` ends where a segment does
/// (`/api` strips `/api` and `/api/x`, not `/apix`).
fn strip_segment_prefix<'p>(path: &'p str, prefix: &str) -> Option<&'p str> {
    let prefix = prefix.trim_end_matches('/');
    let rest = path.strip_prefix(prefix)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// What the forwarded `Host` becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRewrite {
    Literal(HeaderValue),
    /// The backend's own address (`host:port` as configured).
    Backend,
}

/// `request_headers` / `response_headers`: `remove`, then `set`, then
/// `add`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderOps {
    pub remove: Vec<HeaderName>,
    pub set: Vec<(HeaderName, Template)>,
    pub add: Vec<(HeaderName, Template)>,
}

impl HeaderOps {
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }
}

/// `redirect = { … }`: an answer made from the request. Unset parts are
/// the request's own.
#[derive(Debug, Clone)]
pub struct Redirect {
    pub scheme: Option<Template>,
    pub host: Option<Template>,
    pub port: Option<u16>,
    pub path: RedirectPath,
    pub status: StatusCode,
    pub keep_query: bool,
}

#[derive(Debug, Clone)]
pub enum RedirectPath {
    /// The request's path.
    Same,
    Template(Template),
    /// The route's `path_prefix` (`.0`) replaced by `.1`.
    ReplacePrefix(String, String),
}

/// A value with `{variable}`s from the closed set of §17, parsed at plan
/// time. `{{` and `}}` are literal braces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    /// The value when it has no variable, checked once.
    literal: Option<HeaderValue>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Var(Var),
}

/// The variables a template may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    ClientIp,
    ClientPort,
    Host,
    Path,
    Query,
    Method,
    Scheme,
    RequestId,
    Route,
    Generation,
    TlsSni,
    TlsClientSubject,
    TlsClientFingerprint,
    Header(HeaderName),
}

/// The names `Var` is spelled with, for messages and docs.
pub const TEMPLATE_VARIABLES: &[&str] = &[
    "client_ip",
    "client_port",
    "host",
    "path",
    "query",
    "method",
    "scheme",
    "request_id",
    "route",
    "generation",
    "tls.sni",
    "tls.client.subject",
    "tls.client.fingerprint",
    "header.NAME",
];

/// Why a template was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateError {
    UnknownVariable(String),
    Unclosed,
    /// A `}` without its `{` (write `}}` for a brace).
    StrayBrace,
    /// Bytes a header value may not hold (CR, LF, NUL, other controls).
    InvalidValue,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::UnknownVariable(name) => write!(
                f,
                "unknown template variable '{{{name}}}' (known: {})",
                TEMPLATE_VARIABLES.join(", ")
            ),
            TemplateError::Unclosed => write!(f, "a '{{' is not closed (write '{{{{' for a brace)"),
            TemplateError::StrayBrace => {
                write!(f, "a '}}' closes nothing (write '}}}}' for a brace)")
            }
            TemplateError::InvalidValue => write!(
                f,
                "holds a byte a header value may not (CR, LF, NUL or another control character)"
            ),
        }
    }
}

impl Template {
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.peek().is_some_and(|(_, n)| *n == '{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().is_some_and(|(_, n)| *n == '}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(TemplateError::StrayBrace),
                '{' => {
                    let rest = text.get(i + 1..).unwrap_or_default();
                    let end = rest.find('}').ok_or(TemplateError::Unclosed)?;
                    let name = rest.get(..end).unwrap_or_default();
                    let var = Var::parse(name)
                        .ok_or_else(|| TemplateError::UnknownVariable(name.to_owned()))?;
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Var(var));
                    for _ in 0..=end {
                        chars.next();
                    }
                }
                c if c != '\t' && (c.is_control() || c == '\u{7f}') => {
                    return Err(TemplateError::InvalidValue)
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        let literal = match parts.as_slice() {
            [] => Some(HeaderValue::from_static("")),
            [Part::Text(text)] => {
                Some(HeaderValue::from_str(text).map_err(|_| TemplateError::InvalidValue)?)
            }
            _ => None,
        };
        Ok(Template { parts, literal })
    }

    /// The value, when the template names no variable.
    pub fn literal(&self) -> Option<&HeaderValue> {
        self.literal.as_ref()
    }

    pub fn parts(&self) -> &[Part] {
        &self.parts
    }
}

impl Var {
    fn parse(name: &str) -> Option<Var> {
        Some(match name {
            "client_ip" => Var::ClientIp,
            "client_port" => Var::ClientPort,
            "host" => Var::Host,
            "path" => Var::Path,
            "query" => Var::Query,
            "method" => Var::Method,
            "scheme" => Var::Scheme,
            "request_id" => Var::RequestId,
            "route" => Var::Route,
            "generation" => Var::Generation,
            "tls.sni" => Var::TlsSni,
            "tls.client.subject" => Var::TlsClientSubject,
            "tls.client.fingerprint" => Var::TlsClientFingerprint,
            other => {
                let header = other.strip_prefix("header.")?;
                Var::Header(HeaderName::from_bytes(header.as_bytes()).ok()?)
            }
        })
    }
}

/// A `query` or `headers` matcher value: exact, present (`*`), or a
/// regex (`~pattern`, anchored as written).
#[derive(Debug, Clone)]
pub enum ValueMatch {
    Exact(String),
    Present,
    Regex(PathRegex),
}

impl ValueMatch {
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            ValueMatch::Present => true,
            ValueMatch::Exact(expected) => expected.as_bytes() == value,
            ValueMatch::Regex(re) => std::str::from_utf8(value).is_ok_and(|v| re.is_match(v)),
        }
    }

    /// How it is written in the configuration (for ambiguity keys).
    pub fn source(&self) -> String {
        match self {
            ValueMatch::Exact(v) => v.clone(),
            ValueMatch::Present => "*".into(),
            ValueMatch::Regex(re) => format!("~{}", re.as_str()),
        }
    }
}

impl PartialEq for ValueMatch {
    fn eq(&self, other: &Self) -> bool {
        self.source() == other.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_variables_braces_and_refuse_the_rest() {
        let t = Template::parse("{client_ip}:{client_port} via {header.x-env}").unwrap();
        assert_eq!(
            t.parts(),
            &[
                Part::Var(Var::ClientIp),
                Part::Text(":".into()),
                Part::Var(Var::ClientPort),
                Part::Text(" via ".into()),
                Part::Var(Var::Header(HeaderName::from_static("x-env"))),
            ]
        );
        assert!(t.literal().is_none());
        let braces = Template::parse("{{json}}").unwrap();
        assert_eq!(braces.literal().unwrap(), "{json}");
        assert_eq!(
            Template::parse("{nope}"),
            Err(TemplateError::UnknownVariable("nope".into()))
        );
        assert_eq!(Template::parse("{host"), Err(TemplateError::Unclosed));
        assert_eq!(Template::parse("a}b"), Err(TemplateError::StrayBrace));
        assert_eq!(
            Template::parse("a\r\nx-evil: 1"),
            Err(TemplateError::InvalidValue)
        );
        assert_eq!(
            Template::parse("{header.bad name}"),
            Err(TemplateError::UnknownVariable("header.bad name".into()))
        );
    }

    #[test]
    fn rewrites_keep_a_leading_slash_and_segment_boundaries() {
        let strip = Rewrite::StripPrefix("/api".into());
        assert_eq!(strip.apply("/api/users").as_deref(), Some("/users"));
        assert_eq!(strip.apply("/api").as_deref(), Some("/"));
        assert_eq!(strip.apply("/apix"), None);
        let replace = Rewrite::ReplacePrefix("/v1/".into(), "/v2/".into());
        assert_eq!(replace.apply("/v1/users").as_deref(), Some("/v2/users"));
        let to_root = Rewrite::ReplacePrefix("/old".into(), "/".into());
        assert_eq!(to_root.apply("/old/x").as_deref(), Some("/x"));
        assert_eq!(to_root.apply("/old").as_deref(), Some("/"));
        let regex = Rewrite::Regex(RewriteRegex {
            regex: meta::Regex::new(r"^/u/(\d+)$").unwrap(),
            pattern: r"^/u/(\d+)$".into(),
            replacement: "/users/$1".into(),
        });
        assert_eq!(regex.apply("/u/42").as_deref(), Some("/users/42"));
        assert_eq!(regex.apply("/u/x"), None);
    }

    #[test]
    fn ip_rules_deny_first_then_allow() {
        let rules = IpRules {
            allow: Some(vec!["10.0.0.0/8".parse().unwrap()]),
            deny: vec!["10.9.0.0/16".parse().unwrap()],
        };
        assert!(rules.admits("10.1.2.3".parse().unwrap()));
        assert!(!rules.admits("10.9.2.3".parse().unwrap()));
        assert!(!rules.admits("192.168.1.1".parse().unwrap()));
        assert!(rules.admits("::ffff:10.1.2.3".parse().unwrap()));
    }
}

//! Route filters (DESIGN §17): `query` and `headers` matchers, `rewrite`,
//! `host_rewrite`, `request_headers` / `response_headers` with their
//! templates, `max_request_body`, `allow_from` / `deny_from`,
//! `request_id`, the `redirect` action, and listener `defaults`.
//! Fixtures: `fixtures/configs/invalid/filters.toml`.

use regex_automata::meta;

use super::*;
use crate::config::{FileDefaults, FileHeaderOps, FileRedirect, FileRewrite, FileSize};
use crate::plan::{
    Defaults, Filters, HeaderOps, HostRewrite, IpRules, Redirect, RedirectPath, Rewrite,
    RewriteRegex, Template, TemplateError, ValueMatch,
};

/// Header names no filter may touch: they frame the message or belong to
/// one hop (RFC 9110 §7.6.1); `host` has `host_rewrite`.
const UNTOUCHABLE: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
];

impl Validator<'_> {
    /// `headers` (exact, `*`, `~regex`) and `query` matchers.
    pub(super) fn value_matchers<K>(
        &mut self,
        base: &str,
        given: &BTreeMap<String, String>,
        key: impl Fn(&str) -> Option<K>,
        what: &str,
    ) -> Option<Vec<(K, ValueMatch)>> {
        let mut out = Vec::with_capacity(given.len());
        let mut ok = true;
        for (name, value) in given {
            let path = format!("{base}.{}", quote_key(name));
            let Some(k) = key(name) else {
                self.error(
                    Code::InvalidHeader,
                    path,
                    format!("'{name}' is not a valid {what} name"),
                );
                ok = false;
                continue;
            };
            let matcher = if value == "*" {
                ValueMatch::Present
            } else if let Some(pattern) = value.strip_prefix('~') {
                match PathRegex::new(pattern) {
                    Ok(re) => ValueMatch::Regex(re),
                    Err(e) => {
                        self.error(
                            Code::InvalidRegex,
                            path,
                            format!("{what} '{name}': regex '{pattern}' does not compile: {e}"),
                        );
                        ok = false;
                        continue;
                    }
                }
            } else {
                if HeaderValue::from_str(value).is_err() {
                    self.error(
                        Code::InvalidHeader,
                        path,
                        format!("the value of {what} '{name}' is not a valid header value"),
                    );
                    ok = false;
                    continue;
                }
                ValueMatch::Exact(value.clone())
            };
            out.push((k, matcher));
        }
        ok.then_some(out)
    }

    /// The filters route `r` sets itself. `Some(None)`: valid, and none.
    pub(super) fn route_filters(
        &mut self,
        i: usize,
        r: &FileRoute,
        path: &PathMatch,
    ) -> Option<Option<Arc<Filters>>> {
        let at = |field: &str| format!("routes[{i}].{field}");
        let mut ok = true;
        let request_headers =
            self.optional_header_ops(&at("request_headers"), r.request_headers.as_ref());
        let response_headers =
            self.optional_header_ops(&at("response_headers"), r.response_headers.as_ref());
        let max_request_body = match &r.max_request_body {
            Some(size) => self.size(at("max_request_body"), size).map(Some),
            None => Some(None),
        };
        let access = self.ip_rules(&at(""), r.allow_from.as_deref(), r.deny_from.as_deref());
        let rewrite = match &r.rewrite {
            Some(rewrite) => self.rewrite(&at("rewrite"), rewrite, path).map(Some),
            None => Some(None),
        };
        let host_rewrite = match r.host_rewrite.as_deref() {
            None => Some(None),
            Some("backend") => Some(Some(HostRewrite::Backend)),
            Some(host) => {
                match HeaderValue::from_str(host) {
                    Ok(value) if parse_host(host).is_some() || is_host_port(host) => {
                        Some(Some(HostRewrite::Literal(value)))
                    }
                    _ => {
                        self.error(
                        Code::InvalidHost,
                        at("host_rewrite"),
                        format!("host_rewrite '{host}' is not a host name, host:port or \"backend\""),
                    );
                        None
                    }
                }
            }
        };
        let auth = match &r.auth {
            Some(given) => self.route_auth(&at("auth"), given).map(Some),
            None => Some(None),
        };
        let cors = match &r.cors {
            Some(given) => self.cors(&at("cors"), given).map(Some),
            None => Some(None),
        };
        let compress = match &r.compress {
            Some(given) => self.compress(&at("compress"), given).map(Some),
            None => Some(None),
        };
        let mirrors = self.mirrors(i, r);
        let proxies = r.upstream.is_some();
        for (key, set) in [
            ("rewrite", r.rewrite.is_some()),
            ("host_rewrite", r.host_rewrite.is_some()),
            ("request_headers", r.request_headers.is_some()),
        ] {
            if set && !proxies && (r.respond.is_some() || r.redirect.is_some()) {
                self.error(
                    Code::UnexpectedOption,
                    at(key),
                    format!("`{key}` changes what is forwarded: it applies to routes with an upstream, not to `respond` or `redirect`"),
                );
                ok = false;
            }
        }
        let filters = Filters {
            access: access?,
            max_request_body: max_request_body?,
            rewrite: rewrite?,
            host_rewrite: host_rewrite?,
            request_id: r.request_id,
            request_headers: request_headers?,
            response_headers: response_headers?,
            auth: auth?,
            cors: cors?,
            compress: compress?,
            mirrors: mirrors?,
        };
        if !ok {
            return None;
        }
        Some((!filters.is_empty()).then(|| Arc::new(filters)))
    }

    /// Listener `i`'s `defaults`.
    pub(super) fn listener_defaults(
        &mut self,
        i: usize,
        defaults: Option<&FileDefaults>,
    ) -> Option<Arc<Defaults>> {
        let d = defaults?;
        let at = |field: &str| format!("listeners[{i}].defaults.{field}");
        let max_request_body = match &d.max_request_body {
            Some(size) => self.size(at("max_request_body"), size),
            None => None,
        };
        let zones = std::mem::take(&mut self.cache_zones);
        let cache = d
            .cache
            .as_ref()
            .and_then(|c| self.route_cache(&at("cache"), c, &zones, true))
            .map(Arc::new);
        self.cache_zones = zones;
        let waf = d.waf.as_ref().and_then(|w| self.route_waf(&at("waf"), w));
        let defaults = Defaults {
            request_headers: self
                .optional_header_ops(&at("request_headers"), d.request_headers.as_ref())
                .flatten(),
            response_headers: self
                .optional_header_ops(&at("response_headers"), d.response_headers.as_ref())
                .flatten(),
            max_request_body,
            request_id: d.request_id,
            auth: d.auth.as_ref().and_then(|a| self.auth(&at("auth"), a)),
            cors: d.cors.as_ref().and_then(|c| self.cors(&at("cors"), c)),
            compress: d
                .compress
                .as_ref()
                .and_then(|c| self.compress(&at("compress"), c)),
            cache,
            waf,
        };
        (defaults != Defaults::default()).then(|| Arc::new(defaults))
    }

    fn optional_header_ops(
        &mut self,
        base: &str,
        ops: Option<&FileHeaderOps>,
    ) -> Option<Option<HeaderOps>> {
        match ops {
            Some(ops) => self.header_ops(base, ops).map(Some),
            None => Some(None),
        }
    }

    /// `allow_from` / `deny_from` at `base` (`routes[0].` or
    /// `listeners[0].`).
    pub(super) fn ip_rules(
        &mut self,
        base: &str,
        allow: Option<&[String]>,
        deny: Option<&[String]>,
    ) -> Option<Option<IpRules>> {
        if allow.is_none() && deny.is_none() {
            return Some(None);
        }
        let allow = allow.map(|list| self.networks(&format!("{base}allow_from"), list));
        let deny = deny.map(|list| self.networks(&format!("{base}deny_from"), list));
        let mut ok = !matches!(allow, Some(None)) && !matches!(deny, Some(None));
        let allow = allow.flatten();
        let deny = deny.flatten().unwrap_or_default();
        if allow.as_ref().is_some_and(Vec::is_empty) && ok {
            self.error(
                Code::InvalidValue,
                format!("{base}allow_from"),
                "allow_from = [] would refuse every client; remove the route, or name who may reach it",
            );
            ok = false;
        }
        ok.then_some(Some(IpRules { allow, deny }))
    }

    /// A size in bytes: a number, or text with a unit.
    pub(super) fn size(&mut self, path: String, size: &FileSize) -> Option<u64> {
        let parsed = match size {
            FileSize::Bytes(n) => Some(*n),
            FileSize::Text(text) => parse_size(text),
        };
        match parsed {
            Some(0) | None => {
                let shown = match size {
                    FileSize::Bytes(n) => n.to_string(),
                    FileSize::Text(t) => format!("'{t}'"),
                };
                self.error(
                    Code::InvalidValue,
                    path,
                    format!("{shown} is not a size above zero (bytes, or a number with B, KB, MB, GB, KiB, MiB or GiB)"),
                );
                None
            }
            some => some,
        }
    }

    pub(super) fn template(&mut self, path: String, text: &str) -> Option<Template> {
        match Template::parse(text) {
            Ok(template) => Some(template),
            Err(error) => {
                let code = match error {
                    TemplateError::UnknownVariable(_) => Code::UnknownVariable,
                    _ => Code::InvalidTemplate,
                };
                self.error(code, path, format!("'{}': {error}", text.escape_debug()));
                None
            }
        }
    }

    fn header_ops(&mut self, base: &str, ops: &FileHeaderOps) -> Option<HeaderOps> {
        let mut ok = true;
        let mut out = HeaderOps::default();
        for (r, text) in ops.remove.iter().enumerate() {
            match self.filter_header_name(format!("{base}.remove[{r}]"), text) {
                Some(n) => out.remove.push(n),
                None => ok = false,
            }
        }
        for (key, given, into) in [
            ("set", &ops.set, &mut out.set),
            ("add", &ops.add, &mut out.add),
        ] {
            for (header, value) in given {
                let path = format!("{base}.{key}.{}", quote_key(header));
                let n = self.filter_header_name(path.clone(), header);
                match (n, self.template(path, value)) {
                    (Some(n), Some(t)) => into.push((n, t)),
                    _ => ok = false,
                }
            }
        }
        ok.then_some(out)
    }

    /// A header name a filter may change.
    pub(super) fn filter_header_name(&mut self, path: String, text: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(text.as_bytes()) {
            Ok(n) if UNTOUCHABLE.contains(&n.as_str()) => {
                let hint = if n == http::header::HOST {
                    " (use host_rewrite)"
                } else {
                    ""
                };
                self.error(
                    Code::InvalidHeader,
                    path,
                    format!("'{text}' frames the message or belongs to one hop; a filter may not change it{hint}"),
                );
                None
            }
            Ok(n) => Some(n),
            Err(_) => {
                self.error(
                    Code::InvalidHeader,
                    path,
                    format!("'{text}' is not a valid header name"),
                );
                None
            }
        }
    }

    fn rewrite(&mut self, base: &str, rewrite: &FileRewrite, path: &PathMatch) -> Option<Rewrite> {
        let given: Vec<&str> = [
            rewrite.strip_prefix.as_ref().map(|_| "strip_prefix"),
            rewrite.replace_prefix.as_ref().map(|_| "replace_prefix"),
            rewrite.regex.as_ref().map(|_| "regex"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if given.len() != 1 {
            self.error(
                Code::InvalidRewrite,
                base.to_owned(),
                format!(
                    "rewrite takes exactly one of strip_prefix, replace_prefix, regex (got {})",
                    if given.is_empty() {
                        "none".to_owned()
                    } else {
                        given.join(", ")
                    }
                ),
            );
            return None;
        }
        if let Some(prefix) = &rewrite.strip_prefix {
            if !prefix.starts_with('/') || prefix.len() < 2 {
                self.error(
                    Code::InvalidRewrite,
                    format!("{base}.strip_prefix"),
                    format!("strip_prefix '{prefix}' must start with '/' and name a segment"),
                );
                return None;
            }
            return Some(Rewrite::StripPrefix(prefix.clone()));
        }
        if let Some(with) = &rewrite.replace_prefix {
            return self
                .replace_prefix(format!("{base}.replace_prefix"), with, path)
                .map(|(prefix, with)| Rewrite::ReplacePrefix(prefix, with));
        }
        let parts = rewrite.regex.as_deref().unwrap_or_default();
        let [pattern, replacement] = parts else {
            self.error(
                Code::InvalidRewrite,
                format!("{base}.regex"),
                format!(
                    "regex takes [pattern, replacement], got {} strings",
                    parts.len()
                ),
            );
            return None;
        };
        let regex = match meta::Regex::new(pattern) {
            Ok(regex) => regex,
            Err(e) => {
                self.error(
                    Code::InvalidRegex,
                    format!("{base}.regex"),
                    format!(
                        "regex '{pattern}' does not compile: {}",
                        crate::plan::pattern::describe(&e)
                    ),
                );
                return None;
            }
        };
        if let Err(reference) = check_groups(&regex, replacement) {
            self.error(
                Code::InvalidRewrite,
                format!("{base}.regex"),
                format!("replacement '{replacement}' names group {reference}, which '{pattern}' does not have"),
            );
            return None;
        }
        // Anchored at the start, the match begins the path: so must the
        // replacement.
        if pattern.starts_with('^') && !replacement.starts_with('/') {
            self.error(
                Code::InvalidRewrite,
                format!("{base}.regex"),
                format!("replacement '{replacement}' of a pattern anchored at the start must begin with '/': the forwarded path would not"),
            );
            return None;
        }
        Some(Rewrite::Regex(RewriteRegex {
            regex,
            pattern: pattern.clone(),
            replacement: replacement.clone(),
        }))
    }

    /// A `replace_prefix` (rewrite or redirect): the route's `path_prefix`
    /// and what replaces it.
    fn replace_prefix(
        &mut self,
        path: String,
        with: &str,
        route_path: &PathMatch,
    ) -> Option<(String, String)> {
        let PathMatch::Prefix(prefix) = route_path else {
            self.error(
                Code::InvalidRewrite,
                path,
                "replace_prefix replaces the route's path_prefix: this route has none",
            );
            return None;
        };
        if !with.starts_with('/') {
            self.error(
                Code::InvalidRewrite,
                path,
                format!("replace_prefix '{with}' must start with '/'"),
            );
            return None;
        }
        Some((prefix.clone(), with.to_owned()))
    }

    /// The `redirect` action of route `i` on a listener serving `scheme`.
    pub(super) fn redirect(
        &mut self,
        i: usize,
        r: &FileRoute,
        redirect: &FileRedirect,
        path: &PathMatch,
        schemes: &[&str],
    ) -> Option<Redirect> {
        let base = format!("routes[{i}].redirect");
        let mut ok = true;
        let scheme = match redirect.scheme.as_deref() {
            None => None,
            Some(s @ ("http" | "https")) => Template::parse(s).ok(),
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    format!("{base}.scheme"),
                    format!("redirect scheme '{other}' is not http or https"),
                );
                ok = false;
                None
            }
        };
        let host = match &redirect.host {
            Some(host) => {
                let t = self.template(format!("{base}.host"), host);
                ok &= t.is_some();
                t
            }
            None => None,
        };
        if redirect.port == Some(0) {
            self.error(
                Code::InvalidValue,
                format!("{base}.port"),
                "port 0 is not a port",
            );
            ok = false;
        }
        let target = match (&redirect.path, &redirect.replace_prefix) {
            (Some(_), Some(_)) => {
                self.error(
                    Code::ConflictingOptions,
                    format!("{base}.replace_prefix"),
                    "redirect takes path or replace_prefix, not both",
                );
                None
            }
            (Some(p), None) => {
                if !p.starts_with('/') && !p.starts_with('{') {
                    self.error(
                        Code::InvalidPath,
                        format!("{base}.path"),
                        format!("redirect path '{p}' must start with '/'"),
                    );
                    None
                } else {
                    self.template(format!("{base}.path"), p)
                        .map(RedirectPath::Template)
                }
            }
            (None, Some(with)) => self
                .replace_prefix(format!("{base}.replace_prefix"), with, path)
                .map(|(prefix, with)| RedirectPath::ReplacePrefix(prefix, with)),
            (None, None) => Some(RedirectPath::Same),
        };
        ok &= target.is_some();
        let status = redirect.status.unwrap_or(302);
        if ![301, 302, 303, 307, 308].contains(&status) {
            self.error(
                Code::InvalidStatus,
                format!("{base}.status"),
                format!("redirect status {status} is not 301, 302, 303, 307 or 308"),
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        let target = target?;
        // Nothing changes the place: every request would come back here.
        // (On any of its listeners: one loop is enough.)
        let same_scheme = redirect
            .scheme
            .as_deref()
            .is_none_or(|s| schemes.contains(&s));
        let same_path = match (&target, path) {
            (RedirectPath::Same, _) => true,
            (RedirectPath::Template(t), PathMatch::Exact(exact)) => t
                .literal()
                .is_some_and(|v| v.as_bytes() == exact.as_bytes()),
            _ => false,
        };
        let meant = redirect.same_url == Some(true);
        if same_scheme && redirect.host.is_none() && redirect.port.is_none() && same_path && !meant
        {
            self.error(
                Code::RedirectLoop,
                base,
                format!("route '{}' would redirect to the very scheme, host and path it serves: set scheme, host, port or path (or same_url = true if that is meant)", r.name),
            );
            return None;
        }
        Some(Redirect {
            scheme,
            host,
            port: redirect.port,
            path: target,
            status: StatusCode::from_u16(status).ok()?,
            keep_query: redirect.keep_query.unwrap_or(true),
        })
    }
}

/// `10MiB`, `512KB`, `1G`, `2TiB`, `4096`: bytes.
pub(super) fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    number.checked_mul(factor)
}

/// Every `$n`, `${n}`, `$name`, `${name}` in `replacement` names a group
/// of `regex`; `Err` names the first that does not.
fn check_groups(regex: &meta::Regex, replacement: &str) -> Result<(), String> {
    let info = regex.group_info();
    let groups = info.group_len(regex_automata::PatternID::ZERO);
    let mut rest = replacement;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            rest = after;
            continue;
        }
        let (name, after) = match rest.strip_prefix('{') {
            Some(inner) => match inner.find('}') {
                Some(end) => (&inner[..end], &inner[end + 1..]),
                None => return Err(format!("'${rest}' (unclosed)")),
            },
            None => {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        rest = after;
        if name.is_empty() {
            continue;
        }
        let known = match name.parse::<usize>() {
            Ok(index) => index < groups,
            Err(_) => info
                .to_index(regex_automata::PatternID::ZERO, name)
                .is_some(),
        };
        if !known {
            return Err(format!("'{name}'"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_size("10MiB"), Some(10 << 20));
        assert_eq!(parse_size("512KB"), Some(512_000));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1 GiB"), Some(1 << 30));
        // Issue 70: the cache's range says "to 64TiB"; it is accepted.
        assert_eq!(parse_size("64TiB"), Some(64 << 40));
        assert_eq!(parse_size("2TB"), Some(2_000_000_000_000));
        assert_eq!(parse_size("ten"), None);
        assert_eq!(parse_size("5XB"), None);
    }

    #[test]
    fn replacement_groups_must_exist() {
        let re = meta::Regex::new(r"^/u/(?P<id>\d+)$").unwrap();
        assert!(check_groups(&re, "/users/$1").is_ok());
        assert!(check_groups(&re, "/users/${id}/x").is_ok());
        assert!(check_groups(&re, "/cost/$$5").is_ok());
        assert!(check_groups(&re, "/users/$2").is_err());
        assert!(check_groups(&re, "/users/${nope}").is_err());
    }
}

//! `cors` on routes and listener `defaults` (DESIGN §17): origins exact,
//! `~regex` (matching the whole origin) or `*`; every answer header made
//! here. Fixtures: `fixtures/configs/invalid/filters.toml`.

use super::*;
use crate::config::FileCors;
use crate::plan::{AllowHeaders, Cors, Origins};

/// Methods a preflight may ask for when `allow_methods` is not given
/// (the CORS-safelisted ones).
const DEFAULT_METHODS: &[&str] = &["GET", "HEAD", "POST"];

impl Validator<'_> {
    pub(super) fn cors(&mut self, base: &str, c: &FileCors) -> Option<Arc<Cors>> {
        let at = |key: &str| format!("{base}.{key}");
        let mut ok = true;
        let credentials = c.allow_credentials.unwrap_or(false);
        let origins = if c.allow_origins.iter().any(|o| o == "*") {
            if c.allow_origins.len() > 1 {
                self.error(
                    Code::InvalidValue,
                    at("allow_origins"),
                    "\"*\" stands for every origin: list it alone",
                );
                ok = false;
            }
            if credentials {
                self.error(
                    Code::ConflictingOptions,
                    at("allow_origins"),
                    "allow_origins = [\"*\"] with allow_credentials = true: the Fetch standard forbids a wildcard origin on credentialed requests; list the origins",
                );
                ok = false;
            }
            Origins::Any
        } else {
            let mut exact = Vec::new();
            let mut patterns = Vec::new();
            if c.allow_origins.is_empty() {
                self.error(
                    Code::InvalidValue,
                    at("allow_origins"),
                    "allow_origins = [] allows no origin; name them, or remove cors",
                );
                ok = false;
            }
            for (n, origin) in c.allow_origins.iter().enumerate() {
                let path = format!("{base}.allow_origins[{n}]");
                if let Some(pattern) = origin.strip_prefix('~') {
                    match PathRegex::new(&format!("^(?:{pattern})$")) {
                        Ok(re) => patterns.push(re),
                        Err(e) => {
                            self.error(
                                Code::InvalidRegex,
                                path,
                                format!("origin regex '{pattern}' does not compile: {e}"),
                            );
                            ok = false;
                        }
                    }
                } else if is_origin(origin) {
                    exact.push(origin.to_ascii_lowercase());
                } else {
                    self.error(
                        Code::InvalidValue,
                        path,
                        format!("'{origin}' is not an origin: scheme://host[:port], no path (or \"~regex\", or \"*\")"),
                    );
                    ok = false;
                }
            }
            Origins::List { exact, patterns }
        };
        let any_method = c
            .allow_methods
            .as_ref()
            .is_some_and(|list| list.iter().any(|m| m == "*"));
        if any_method && c.allow_methods.as_ref().is_some_and(|list| list.len() > 1) {
            self.error(
                Code::InvalidValue,
                at("allow_methods"),
                "\"*\" stands for every method: list it alone",
            );
            ok = false;
        }
        let names: Vec<&str> = match &c.allow_methods {
            Some(_) if any_method => Vec::new(),
            Some(list) => list.iter().map(String::as_str).collect(),
            None => DEFAULT_METHODS.to_vec(),
        };
        let mut methods = Vec::with_capacity(names.len());
        for (n, name) in names.iter().enumerate() {
            match self.method(format!("{base}.allow_methods[{n}]"), name) {
                Some(m) => methods.push(m),
                None => ok = false,
            }
        }
        let allow_headers = if c.allow_headers.iter().any(|h| h == "*") {
            if credentials {
                self.error(
                    Code::ConflictingOptions,
                    at("allow_headers"),
                    "allow_headers = [\"*\"] with allow_credentials = true: on credentialed requests \"*\" is a header name, not a wildcard; list the headers",
                );
                ok = false;
            }
            AllowHeaders::Any
        } else {
            let names = self.cors_headers(&at("allow_headers"), &c.allow_headers);
            ok &= names.is_some();
            let names = names.unwrap_or_default();
            let value = joined(names.iter().map(HeaderName::as_str));
            AllowHeaders::List(names, value)
        };
        let expose = if c.expose_headers.iter().any(|h| h == "*") {
            if credentials {
                self.error(
                    Code::ConflictingOptions,
                    at("expose_headers"),
                    "expose_headers = [\"*\"] with allow_credentials = true: on credentialed requests \"*\" is a header name, not a wildcard; list the headers",
                );
                ok = false;
            }
            Some(HeaderValue::from_static("*"))
        } else {
            let names = self.cors_headers(&at("expose_headers"), &c.expose_headers);
            ok &= names.is_some();
            joined(names.unwrap_or_default().iter().map(HeaderName::as_str))
        };
        let max_age = match c.max_age.as_deref() {
            None => None,
            Some(text) => {
                let age = self.duration(at("max_age"), text);
                ok &= age.is_some();
                age.map(|d| HeaderValue::from(d.as_secs()))
            }
        };
        let methods_value = if any_method {
            Some(HeaderValue::from_static("*"))
        } else {
            joined(methods.iter().map(Method::as_str))
        };
        if !ok {
            return None;
        }
        Some(Arc::new(Cors {
            origins,
            methods_value: methods_value.unwrap_or_else(|| HeaderValue::from_static("GET")),
            methods,
            any_method,
            allow_headers,
            expose,
            credentials,
            max_age,
        }))
    }

    fn cors_headers(&mut self, base: &str, names: &[String]) -> Option<Vec<HeaderName>> {
        let mut out = Vec::with_capacity(names.len());
        let mut ok = true;
        for (n, name) in names.iter().enumerate() {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(h) => out.push(h),
                Err(_) => {
                    self.error(
                        Code::InvalidHeader,
                        format!("{base}[{n}]"),
                        format!("'{name}' is not a valid header name"),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }
}

/// `scheme://host[:port]` with nothing after, or the opaque `null`.
fn is_origin(text: &str) -> bool {
    if text == "null" {
        return true;
    }
    let Ok(uri) = text.parse::<http::Uri>() else {
        return false;
    };
    uri.scheme().is_some()
        && uri.host().is_some_and(|h| !h.is_empty())
        && uri
            .path_and_query()
            .is_none_or(|p| p.as_str().is_empty() || p.as_str() == "/")
        && !text.ends_with('/')
}

fn joined<'a>(names: impl Iterator<Item = &'a str>) -> Option<HeaderValue> {
    let text = names.collect::<Vec<_>>().join(", ");
    (!text.is_empty())
        .then(|| HeaderValue::from_str(&text).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_scheme_host_and_port_only() {
        for ok in ["https://app.example", "http://localhost:8080", "null"] {
            assert!(is_origin(ok), "{ok}");
        }
        for bad in [
            "app.example",
            "https://app.example/",
            "https://app.example/x",
            "https://",
        ] {
            assert!(!is_origin(bad), "{bad}");
        }
    }
}

//! `auth` on routes and listener `defaults` (DESIGN §19). Secret files
//! are read here (hashed into `config_version`) and parsed into what
//! requests are checked against; their contents never reach a
//! diagnostic. Fixtures: `fixtures/configs/invalid/auth.toml`.

use super::*;
use crate::auth::forward_cache::{self, ForwardCache, KeyPart};
use crate::auth::{self, basic, forward, jwt, Auth, SecretFile};
use crate::config::{FileAuth, FileBasicAuth, FileForwardAuth, FileJwtAuth};
use crate::plan::RouteAuth;

/// Algorithms a JWKS verifies when the route lists none.
const DEFAULT_ASYMMETRIC: &[&str] = &["RS256", "ES256", "EdDSA"];
const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(300);

impl Validator<'_> {
    /// A route's `auth`: `"none"` or a method.
    pub(super) fn route_auth(&mut self, base: &str, given: &FileAuth) -> Option<RouteAuth> {
        match given {
            FileAuth::Keyword(word) if word == "none" => Some(RouteAuth::Off),
            FileAuth::Keyword(word) => {
                self.error(
                    Code::InvalidValue,
                    base,
                    format!("auth = '{word}' is not a method: write \"none\" or {{ basic = {{ … }} }} / {{ jwt = {{ … }} }}"),
                );
                None
            }
            FileAuth::Method(_) => self.auth(base, given).map(RouteAuth::On),
        }
    }

    /// A method (a listener default cannot be `"none"`: leave it out).
    pub(super) fn auth(&mut self, base: &str, given: &FileAuth) -> Option<Arc<Auth>> {
        let method = match given {
            FileAuth::Method(method) => method,
            FileAuth::Keyword(word) => {
                self.error(
                    Code::InvalidValue,
                    base,
                    format!("a listener's default auth must be a method, not '{word}'; leave the key out for none"),
                );
                return None;
            }
        };
        let auth = match (&method.basic, &method.jwt, &method.forward) {
            (Some(b), None, None) => Auth::Basic(self.basic_auth(&format!("{base}.basic"), b)?),
            (None, Some(j), None) => Auth::Jwt(self.jwt_auth(&format!("{base}.jwt"), j)?),
            (None, None, Some(f)) => {
                Auth::Forward(self.forward_auth(&format!("{base}.forward"), f)?)
            }
            (None, None, None) => {
                self.error(
                    Code::InvalidValue,
                    base,
                    "auth names no method: write { basic = { … } }, { jwt = { … } } or { forward = { … } }",
                );
                return None;
            }
            _ => {
                self.error(
                    Code::ConflictingOptions,
                    base,
                    "auth names more than one method; a route has one",
                );
                return None;
            }
        };
        Some(Arc::new(auth))
    }

    fn secret_file<T: Send + Sync + 'static>(
        &mut self,
        path: String,
        name: &str,
        parse: auth::secret::Parse<T>,
    ) -> Option<SecretFile<T>> {
        let bytes = self.read_file(path.clone(), name)?;
        let resolved = self.base_dir.join(name);
        // Named again (a listener default and a route, two routes): the
        // one parsed the first time, shared.
        let key = (resolved.clone(), parse as usize);
        if let Some(file) = self
            .secrets
            .get(&key)
            .and_then(|known| known.downcast_ref::<SecretFile<T>>())
        {
            return Some(file.clone());
        }
        match SecretFile::new(name, resolved, &bytes, parse) {
            Ok(file) => {
                self.secrets.insert(key, Box::new(file.clone()));
                Some(file)
            }
            Err(why) => {
                self.error(Code::InvalidSecretFile, path, format!("'{name}': {why}"));
                None
            }
        }
    }

    fn basic_auth(&mut self, base: &str, b: &FileBasicAuth) -> Option<basic::Basic> {
        let realm = b.realm.clone().unwrap_or_else(|| "restricted".to_owned());
        let printable = !realm.is_empty()
            && realm
                .chars()
                .all(|c| !c.is_control() && c != '"' && c != '\\');
        if !printable {
            self.error(
                Code::InvalidValue,
                format!("{base}.realm"),
                "a realm is printable text without quotes or backslashes",
            );
        }
        let users = self.secret_file(
            format!("{base}.users_file"),
            &b.users_file,
            basic::parse_users,
        )?;
        if !printable {
            return None;
        }
        basic::Basic::new(users, realm, b.forward_credentials.unwrap_or(true))
            .map_err(|why| self.error(Code::InvalidValue, format!("{base}.realm"), why))
            .ok()
    }

    fn jwt_auth(&mut self, base: &str, j: &FileJwtAuth) -> Option<jwt::Jwt> {
        let at = |key: &str| format!("{base}.{key}");
        let sources: Vec<&str> = [
            j.jwks_file.as_ref().map(|_| "jwks_file"),
            j.jwks_url.as_ref().map(|_| "jwks_url"),
            j.hmac_key_file.as_ref().map(|_| "hmac_key_file"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut ok = true;
        for (key, set) in [
            ("jwks_ca", j.jwks_ca.is_some()),
            ("jwks_refresh", j.jwks_refresh.is_some()),
        ] {
            if set && j.jwks_url.is_none() {
                self.error(
                    Code::UnexpectedOption,
                    at(key),
                    format!("{key} applies to jwks_url only"),
                );
                ok = false;
            }
        }
        if sources.len() != 1 {
            self.error(
                if sources.is_empty() {
                    Code::InvalidValue
                } else {
                    Code::ConflictingOptions
                },
                base,
                format!(
                    "a jwt auth takes its keys from exactly one of jwks_file, jwks_url, hmac_key_file (given: {})",
                    if sources.is_empty() { "none".to_owned() } else { sources.join(", ") }
                ),
            );
            return None;
        }
        let hmac = j.hmac_key_file.is_some();
        let names: Vec<&str> = match (j.algorithms.is_empty(), hmac) {
            (true, true) => vec!["HS256"],
            (true, false) => DEFAULT_ASYMMETRIC.to_vec(),
            (false, _) => j.algorithms.iter().map(String::as_str).collect(),
        };
        let mut algorithms = Vec::with_capacity(names.len());
        for (n, name) in names.iter().enumerate() {
            let path = format!("{base}.algorithms[{n}]");
            match name.parse::<jsonwebtoken::Algorithm>() {
                Ok(alg) => {
                    let symmetric = name.starts_with("HS");
                    if symmetric != hmac {
                        self.error(
                            Code::InvalidValue,
                            path,
                            if symmetric {
                                format!("{name} needs hmac_key_file: HMAC keys are secrets, never published in a JWKS")
                            } else {
                                format!("{name} is not an HMAC algorithm; hmac_key_file verifies HS256, HS384 or HS512")
                            },
                        );
                        ok = false;
                    } else {
                        algorithms.push(alg);
                    }
                }
                _ => {
                    self.error(
                        Code::InvalidValue,
                        path,
                        format!("'{name}' is not an algorithm taken here (RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, HS256, HS384, HS512)"),
                    );
                    ok = false;
                }
            }
        }
        let leeway = match j.leeway.as_deref() {
            None => Some(DEFAULT_LEEWAY),
            Some("0s" | "0") => Some(Duration::ZERO),
            Some(text) => self.duration(at("leeway"), text),
        };
        let from = match j.from.as_deref() {
            None => Some(jwt::TokenSource::Header(http::header::AUTHORIZATION)),
            Some(text) => {
                let parsed = jwt::TokenSource::parse(text);
                if parsed.is_none() {
                    self.error(
                        Code::InvalidValue,
                        at("from"),
                        format!("from = '{text}': write header:NAME, query:NAME or cookie:NAME"),
                    );
                }
                parsed
            }
        };
        let mut claims_to_headers = Vec::with_capacity(j.claims_to_headers.len());
        for (claim, header) in &j.claims_to_headers {
            let path = format!("{base}.claims_to_headers.{}", quote_key(claim));
            match self.filter_header_name(path.clone(), header) {
                Some(name) if name == http::header::AUTHORIZATION => {
                    self.error(
                        Code::InvalidHeader,
                        path,
                        "a claim may not be written into authorization",
                    );
                    ok = false;
                }
                Some(name) => claims_to_headers.push((claim.clone(), name)),
                None => ok = false,
            }
        }
        if j.audiences.iter().any(String::is_empty) || j.issuer.as_deref() == Some("") {
            self.error(
                Code::InvalidValue,
                base,
                "issuer and audiences may not be empty text",
            );
            ok = false;
        }
        let keys = if let Some(name) = &j.jwks_file {
            jwt::Keys::File(self.secret_file(at("jwks_file"), name, jwt::parse_jwks)?)
        } else if let Some(name) = &j.hmac_key_file {
            jwt::Keys::Hmac(self.secret_file(at("hmac_key_file"), name, jwt::parse_hmac_key)?)
        } else {
            let url = j.jwks_url.as_deref().unwrap_or_default();
            let uri = self.jwks_url(&at("jwks_url"), url);
            let ca = match &j.jwks_ca {
                Some(ca) => self
                    .read_file(at("jwks_ca"), ca)
                    .map(|_| Some(self.base_dir.join(ca))),
                None => Some(None),
            };
            let refresh = match j.jwks_refresh.as_deref() {
                None => Some(DEFAULT_JWKS_REFRESH),
                Some(text) => self.duration(at("jwks_refresh"), text),
            };
            jwt::Keys::Url(jwt::Remote::shared(uri?, ca?, refresh?))
        };
        if !ok {
            return None;
        }
        Some(jwt::Jwt::new(
            j.issuer.clone(),
            j.audiences.clone(),
            keys,
            algorithms,
            leeway?,
            from?,
            claims_to_headers,
            j.forward_token.unwrap_or(true),
        ))
    }

    fn forward_auth(&mut self, base: &str, f: &FileForwardAuth) -> Option<forward::Forward> {
        let at = |key: &str| format!("{base}.{key}");
        let mut ok = true;
        let uri = f.url.parse::<http::Uri>().ok();
        let target = uri.as_ref().and_then(|u| {
            let host = u.host()?;
            Some((
                u.scheme_str()?,
                host,
                u.port_u16(),
                u.path_and_query().cloned(),
            ))
        });
        let mut upstream = None;
        let mut path = None;
        match target {
            None => {
                self.error(
                    Code::InvalidValue,
                    at("url"),
                    format!("url '{}' is not an absolute http:// or https:// URL", f.url),
                );
                ok = false;
            }
            Some((scheme, host, port, path_and_query)) => {
                match self.upstream_tls.get(host).copied() {
                    None => {
                        self.error(
                        Code::UnknownUpstream,
                        at("url"),
                        format!("the host of url '{}' names the upstream the auth service is in (its pool, health checks and TLS); '{host}' is not an upstream of this configuration", f.url),
                    );
                        ok = false;
                    }
                    Some(tls) => {
                        if port.is_some() || scheme != if tls { "https" } else { "http" } {
                            self.error(
                            Code::InvalidValue,
                            at("url"),
                            format!(
                                "write the url as {}://{host}/PATH: the upstream's backends give the address and port{}",
                                if tls { "https" } else { "http" },
                                if tls { ", and its tls the https" } else { "; https needs tls on the upstream" }
                            ),
                        );
                            ok = false;
                        }
                        upstream = Some(host.to_owned());
                        path = Some(
                            path_and_query
                                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
                        );
                    }
                }
            }
        }
        let timeout = match f.timeout.as_deref() {
            None => Some(Duration::from_secs(1)),
            Some(text) => self.duration(at("timeout"), text),
        };
        let fail_open = match f.failure.as_deref() {
            None | Some("deny") => Some(false),
            Some("allow") => Some(true),
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    at("failure"),
                    format!("failure = '{other}': write \"deny\" or \"allow\""),
                );
                None
            }
        };
        let default_asked = ["authorization", "cookie"].map(str::to_owned);
        let asked = f.request_headers.as_deref().unwrap_or(&default_asked);
        let mut request_headers = Vec::with_capacity(asked.len());
        for (n, name) in asked.iter().enumerate() {
            match self.filter_header_name(format!("{base}.request_headers[{n}]"), name) {
                Some(name) => request_headers.push(name),
                None => ok = false,
            }
        }
        let mut response_headers = Vec::with_capacity(f.response_headers.len());
        for (n, name) in f.response_headers.iter().enumerate() {
            match self.filter_header_name(format!("{base}.response_headers[{n}]"), name) {
                Some(name) => response_headers.push(name),
                None => ok = false,
            }
        }
        let cache = match &f.cache {
            None => None,
            Some(cache) => {
                let built = self.forward_cache(&at("cache"), cache, &request_headers);
                ok &= built.is_some();
                built
            }
        };
        if !ok {
            return None;
        }
        Some(forward::Forward {
            upstream: upstream?,
            path: path?,
            timeout: timeout?,
            request_headers,
            response_headers,
            fail_open: fail_open?,
            cache,
        })
    }

    /// `cache = { ttl, key_headers, max_entries }`: the key must tell
    /// apart every header the auth service is sent (`asked`).
    fn forward_cache(
        &mut self,
        base: &str,
        c: &crate::config::FileForwardCache,
        asked: &[http::HeaderName],
    ) -> Option<ForwardCache> {
        let at = |key: &str| format!("{base}.{key}");
        let ttl = self.duration(at("ttl"), &c.ttl);
        let ttl = match ttl {
            Some(ttl) if ttl > forward_cache::MAX_TTL => {
                self.error(
                    Code::InvalidValue,
                    at("ttl"),
                    format!(
                        "ttl = '{}' is longer than the 24h an answer may be kept",
                        c.ttl
                    ),
                );
                None
            }
            other => other,
        };
        let max_entries = match c.max_entries {
            None => Some(forward_cache::DEFAULT_ENTRIES),
            Some(n) if (1..=forward_cache::MAX_ENTRIES as u64).contains(&n) => Some(n as usize),
            Some(n) => {
                self.error(
                    Code::InvalidValue,
                    at("max_entries"),
                    format!(
                        "max_entries = {n} is out of range: 1 to {}",
                        forward_cache::MAX_ENTRIES
                    ),
                );
                None
            }
        };
        let key = match &c.key_headers {
            None => Some(asked.to_vec()),
            Some(names) => {
                let mut key = Vec::with_capacity(names.len());
                let mut ok = true;
                for (n, name) in names.iter().enumerate() {
                    match self.filter_header_name(format!("{base}.key_headers[{n}]"), name) {
                        Some(name) => key.push(name),
                        None => ok = false,
                    }
                }
                let missing: Vec<&str> = asked
                    .iter()
                    .filter(|name| !key.contains(name))
                    .map(http::HeaderName::as_str)
                    .collect();
                if ok && !missing.is_empty() {
                    self.error(
                        Code::InvalidValue,
                        at("key_headers"),
                        format!(
                            "key_headers leaves out {} that the auth service is sent (request_headers): two clients differing only there would share one answer; list every request header in key_headers",
                            missing.join(", ")
                        ),
                    );
                    ok = false;
                }
                ok.then_some(key)
            }
        };
        let key = match key {
            Some(key) if key.is_empty() => {
                self.error(
                    Code::InvalidValue,
                    base,
                    "a cache keyed by nothing would give every client the first client's answer: send the auth service the headers that carry credentials (request_headers) or name them in key_headers".to_owned(),
                );
                None
            }
            other => other,
        };
        Some(ForwardCache::new(
            ttl?,
            key?.into_iter().map(KeyPart::of).collect(),
            max_entries?,
        ))
    }

    /// An `https` URL, or `http` to a loopback address (keys fetched in
    /// cleartext from anywhere else could be anyone's).
    fn jwks_url(&mut self, path: &str, text: &str) -> Option<http::Uri> {
        let uri = text
            .parse::<http::Uri>()
            .ok()
            .filter(|u| u.host().is_some());
        let loopback = |u: &http::Uri| {
            u.host().is_some_and(|h| {
                h == "localhost"
                    || h.trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            })
        };
        match uri {
            Some(u) if u.scheme_str() == Some("https") => Some(u),
            Some(u) if u.scheme_str() == Some("http") && loopback(&u) => Some(u),
            Some(_) => {
                self.error(
                    Code::InvalidValue,
                    path,
                    format!("jwks_url '{text}' must be https (http only to a loopback address)"),
                );
                None
            }
            None => {
                self.error(
                    Code::InvalidValue,
                    path,
                    format!("jwks_url '{text}' is not an absolute URL"),
                );
                None
            }
        }
    }
}

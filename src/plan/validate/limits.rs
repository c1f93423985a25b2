//! `[limits] store` (issue 58): the Redis that fleet-scoped quotas count
//! in. Its password comes from a file (as `auth`'s secrets do), never
//! from the URL. Fixture: `fixtures/configs/invalid/limits.toml`.

use super::*;
use crate::config::{FileConfig, FileRedisSentinel, FileRedisStore};
use crate::plan::{SentinelSpec, StoreSpec, StoreTls, DEFAULT_STORE_TIMEOUT};

/// The longest prefix: every key carries it.
const MAX_PREFIX: usize = 64;

impl Validator<'_> {
    /// `[limits] store`; `None` when absent or wrong (reported).
    pub(super) fn limit_store(&mut self, file: &FileConfig) -> Option<StoreSpec> {
        let store = file.limits.as_ref()?.store.as_ref()?;
        self.redis_store("limits.store.redis", &store.redis)
    }

    fn redis_store(&mut self, base: &str, r: &FileRedisStore) -> Option<StoreSpec> {
        let at = |field: &str| format!("{base}.{field}");
        let before = self.diagnostics.len();
        let (url, sentinel, tls) = match (&r.url, &r.sentinel) {
            (Some(url), None) => {
                let tls = self.store_address(at("url"), url).is_some_and(|a| a.tls);
                (url.clone(), None, tls)
            }
            (None, Some(s)) => {
                let (spec, tls) = self.sentinel(&at("sentinel"), s);
                let name = format!("sentinel://{}/{}", s.nodes.join(","), s.master);
                (name, spec, tls)
            }
            (Some(_), Some(_)) => {
                self.error(
                    Code::InvalidValue,
                    at("sentinel"),
                    "url and sentinel are two ways to find the store: write one",
                );
                (String::new(), None, false)
            }
            (None, None) => {
                self.error(
                    Code::MissingKey,
                    at("url"),
                    "name the store: url = \"redis://host:port/db\", or sentinel = { master, nodes }",
                );
                (String::new(), None, false)
            }
        };
        let tls = self.store_tls(base, r, tls);
        let password = r
            .password_file
            .as_ref()
            .and_then(|name| self.password_file(at("password_file"), name));
        if r.username.is_some() && r.password_file.is_none() {
            self.error(
                Code::MissingKey,
                at("password_file"),
                "a username needs a password: name the file that holds it in password_file",
            );
        }
        let key_prefix = r
            .key_prefix
            .clone()
            .unwrap_or_else(|| "cutover:".to_owned());
        if key_prefix.is_empty() || key_prefix.len() > MAX_PREFIX {
            self.error(
                Code::InvalidValue,
                at("key_prefix"),
                format!("key_prefix must be 1 to {MAX_PREFIX} bytes: it keeps the gateway's keys apart from others in the same database"),
            );
        }
        let timeout = match &r.timeout {
            None => Some(DEFAULT_STORE_TIMEOUT),
            Some(text) => self.duration(at("timeout"), text),
        };
        if let Some(t) = timeout {
            if t < Duration::from_millis(10) || t > Duration::from_secs(10) {
                self.error(
                    Code::InvalidDuration,
                    at("timeout"),
                    "timeout must be between 10ms and 10s",
                );
            }
        }
        if self.diagnostics.len() != before {
            return None;
        }
        Some(StoreSpec {
            url,
            sentinel,
            username: r.username.clone(),
            password,
            tls,
            key_prefix,
            timeout: timeout?,
        })
    }
}

impl Validator<'_> {
    /// The first line of a password file.
    fn password_file(&mut self, at: String, name: &str) -> Option<String> {
        match self.read_file(at.clone(), name).map(String::from_utf8) {
            None => None,
            Some(Ok(text)) => {
                let line = text.lines().next().unwrap_or("").trim_end().to_owned();
                if line.is_empty() {
                    self.error(
                        Code::InvalidSecretFile,
                        at,
                        format!("'{name}' is empty: its first line is the password"),
                    );
                }
                Some(line)
            }
            Some(Err(_)) => {
                self.error(
                    Code::InvalidSecretFile,
                    at,
                    format!("'{name}' is not UTF-8 text"),
                );
                None
            }
        }
    }

    /// A store or sentinel URL, reported where it is wrong.
    fn store_address(&mut self, at: String, url: &str) -> Option<Address> {
        match redis_address(url) {
            Err(why) => {
                self.error(Code::InvalidAddress, at, why);
                None
            }
            Ok(a) if a.password => {
                self.error(
                    Code::InlineSecret,
                    at,
                    "the URL holds a password: put it in a file and name it in password_file (the configuration is shown by preview and kept in history)",
                );
                None
            }
            Ok(a) => Some(a),
        }
    }

    /// `store.redis.sentinel`, and whether its nodes speak TLS.
    fn sentinel(&mut self, at: &str, s: &FileRedisSentinel) -> (Option<SentinelSpec>, bool) {
        let before = self.diagnostics.len();
        if s.master.trim().is_empty() {
            self.error(
                Code::InvalidValue,
                format!("{at}.master"),
                "master is the name the sentinels know the master by (`sentinel monitor NAME …`)",
            );
        }
        if s.nodes.is_empty() {
            self.error(
                Code::InvalidValue,
                format!("{at}.nodes"),
                "name at least one sentinel (redis://host:26379); name every one, so that one down is not the store down",
            );
        }
        let schemes: Vec<bool> = s
            .nodes
            .iter()
            .filter_map(|node| self.store_address(format!("{at}.nodes"), node))
            .map(|a| a.tls)
            .collect();
        let tls = schemes.first().copied().unwrap_or(false);
        if schemes.iter().any(|t| *t != tls) {
            self.error(
                Code::InvalidValue,
                format!("{at}.nodes"),
                "the sentinels are all redis:// or all rediss://: the scheme says whether the sentinels and the master speak TLS",
            );
        }
        if s.db.is_some_and(|db| !(0..=1_000_000).contains(&db)) {
            self.error(
                Code::InvalidValue,
                format!("{at}.db"),
                "db is a database number (0 and up)",
            );
        }
        let password = match (&s.username, &s.password_file) {
            (_, Some(name)) => self.password_file(format!("{at}.password_file"), name),
            (Some(_), None) => {
                self.error(
                    Code::MissingKey,
                    format!("{at}.password_file"),
                    "a username needs a password: name the file that holds it in password_file",
                );
                None
            }
            (None, None) => None,
        };
        if self.diagnostics.len() != before {
            return (None, tls);
        }
        let spec = SentinelSpec {
            master: s.master.clone(),
            nodes: s.nodes.clone(),
            db: s.db.unwrap_or(0),
            username: s.username.clone(),
            password,
        };
        (Some(spec), tls)
    }

    /// `ca`, `cert` and `key`: read and checked when the store speaks TLS,
    /// refused when it does not.
    fn store_tls(&mut self, base: &str, r: &FileRedisStore, tls: bool) -> Option<StoreTls> {
        let at = |field: &str| format!("{base}.{field}");
        if !tls {
            if r.ca.is_some() || r.cert.is_some() || r.key.is_some() {
                self.error(
                    Code::InvalidValue,
                    at(if r.ca.is_some() { "ca" } else { "cert" }),
                    "ca, cert and key are for TLS to the store: write its URL as rediss://",
                );
            }
            return None;
        }
        let ca = r.ca.as_ref().and_then(|name| {
            let pem = self.read_file(at("ca"), name)?;
            match crate::tls::parse_roots(std::path::Path::new(name), &pem) {
                Ok(_) => Some(pem),
                Err(e) => {
                    self.error(Code::InvalidCertificate, at("ca"), e.to_string());
                    None
                }
            }
        });
        let client = match (&r.cert, &r.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let cert_pem = self.read_file(at("cert"), cert);
                let key_pem = self.read_file(at("key"), key);
                let (cert_pem, key_pem) = cert_pem.zip(key_pem)?;
                match crate::tls::parse_cert(
                    std::path::Path::new(cert),
                    &cert_pem,
                    std::path::Path::new(key),
                    &key_pem,
                ) {
                    Ok(_) => Some((cert_pem, key_pem)),
                    Err(e) => {
                        self.error(Code::InvalidCertificate, at("cert"), e.to_string());
                        None
                    }
                }
            }
            _ => {
                self.error(
                    Code::InvalidValue,
                    at("cert"),
                    "cert and key go together: the client certificate chain and its private key",
                );
                None
            }
        };
        Some(StoreTls { ca, client })
    }
}

/// What a store URL says besides the address.
#[derive(Debug, PartialEq, Eq)]
struct Address {
    /// A password is written in it.
    password: bool,
    /// `rediss://`: TLS, verified by name.
    tls: bool,
}

/// Checks a store URL as the client will read it: `redis://` over TCP,
/// `rediss://` over TLS, or `unix://` (or `redis+unix://`) to a socket.
fn redis_address(url: &str) -> Result<Address, String> {
    use redis::{ConnectionAddr, IntoConnectionInfo};
    let info = url.into_connection_info().map_err(|e| {
        format!("'{url}' is not a Redis URL (redis://host:port/db, rediss://host:port/db or unix:///path): {e}")
    })?;
    let tls = match info.addr() {
        ConnectionAddr::TcpTls { insecure: true, .. } => {
            return Err(format!(
                "'{url}': the store's certificate is always verified by its name; name the CA that signs it in ca instead of #insecure"
            ))
        }
        ConnectionAddr::TcpTls { .. } => true,
        addr if !addr.is_supported() => {
            return Err(format!("'{url}': this address kind is not supported"))
        }
        _ => false,
    };
    Ok(Address {
        password: info.redis_settings().password().is_some(),
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_read_as_the_client_reads_them() {
        let plain = Ok(Address {
            password: false,
            tls: false,
        });
        let inline = Ok(Address {
            password: true,
            tls: false,
        });
        assert_eq!(redis_address("redis://127.0.0.1:6379/0"), plain);
        assert_eq!(redis_address("redis://redis.internal"), plain);
        assert_eq!(redis_address("unix:///run/redis.sock"), plain);
        assert_eq!(redis_address("redis://app@127.0.0.1:6379"), plain);
        assert_eq!(redis_address("redis://:hunter2@127.0.0.1"), inline);
        assert_eq!(redis_address("redis://app:hunter2@127.0.0.1"), inline);
        assert_eq!(
            redis_address("rediss://redis.internal:6380/0"),
            Ok(Address {
                password: false,
                tls: true,
            })
        );
        assert!(redis_address("rediss://redis.internal:6380/#insecure")
            .unwrap_err()
            .contains("always verified"));
        assert!(redis_address("http://127.0.0.1").is_err());
        assert!(redis_address("127.0.0.1:6379").is_err());
    }
}

//! `[limits] store` (issue 58): the Redis that fleet-scoped quotas count
//! in. Its password comes from a file (as `auth`'s secrets do), never
//! from the URL. Fixture: `fixtures/configs/invalid/limits.toml`.

use super::*;
use crate::config::{FileConfig, FileRedisStore};
use crate::plan::{StoreSpec, DEFAULT_STORE_TIMEOUT};

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
        match redis_address(&r.url) {
            Err(why) => self.error(Code::InvalidAddress, at("url"), why),
            Ok(Inline::Password) => self.error(
                Code::InlineSecret,
                at("url"),
                "the URL holds a password: put it in a file and name it in password_file (the configuration is shown by preview and kept in history)",
            ),
            Ok(Inline::Nothing) => {}
        }
        let password = match &r.password_file {
            None => None,
            Some(name) => {
                let bytes = self.read_file(at("password_file"), name);
                match bytes.map(String::from_utf8) {
                    None => None,
                    Some(Ok(text)) => {
                        let line = text.lines().next().unwrap_or("").trim_end().to_owned();
                        if line.is_empty() {
                            self.error(
                                Code::InvalidSecretFile,
                                at("password_file"),
                                format!("'{name}' is empty: its first line is the password"),
                            );
                        }
                        Some(line)
                    }
                    Some(Err(_)) => {
                        self.error(
                            Code::InvalidSecretFile,
                            at("password_file"),
                            format!("'{name}' is not UTF-8 text"),
                        );
                        None
                    }
                }
            }
        };
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
            url: r.url.clone(),
            username: r.username.clone(),
            password,
            key_prefix,
            timeout: timeout?,
        })
    }
}

/// What a store URL carries besides the address.
#[derive(Debug, PartialEq, Eq)]
enum Inline {
    Nothing,
    Password,
}

/// Checks a store URL as the client will read it: `redis://` over TCP or
/// `unix://` (or `redis+unix://`) to a socket.
fn redis_address(url: &str) -> Result<Inline, String> {
    use redis::IntoConnectionInfo;
    if url.starts_with("rediss://") || url.starts_with("valkeys://") {
        return Err(format!(
            "'{url}': TLS to the store is not built in; reach it over loopback, a unix socket or a private network"
        ));
    }
    let info = url.into_connection_info().map_err(|e| {
        format!("'{url}' is not a Redis URL (redis://host:port/db or unix:///path): {e}")
    })?;
    if !info.addr().is_supported() {
        return Err(format!("'{url}': this address kind is not supported"));
    }
    Ok(if info.redis_settings().password().is_some() {
        Inline::Password
    } else {
        Inline::Nothing
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_read_as_the_client_reads_them() {
        assert_eq!(
            redis_address("redis://127.0.0.1:6379/0"),
            Ok(Inline::Nothing)
        );
        assert_eq!(redis_address("redis://redis.internal"), Ok(Inline::Nothing));
        assert_eq!(redis_address("unix:///run/redis.sock"), Ok(Inline::Nothing));
        assert_eq!(
            redis_address("redis://app@127.0.0.1:6379"),
            Ok(Inline::Nothing)
        );
        assert_eq!(
            redis_address("redis://:hunter2@127.0.0.1"),
            Ok(Inline::Password)
        );
        assert_eq!(
            redis_address("redis://app:hunter2@127.0.0.1"),
            Ok(Inline::Password)
        );
        assert!(redis_address("rediss://127.0.0.1")
            .unwrap_err()
            .contains("TLS"));
        assert!(redis_address("http://127.0.0.1").is_err());
        assert!(redis_address("127.0.0.1:6379").is_err());
    }
}

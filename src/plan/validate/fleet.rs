//! `[fleet]`: endpoints, prefix, instance name, lease, TLS and credentials
//! towards etcd.

use super::*;

impl Validator<'_> {
    pub(super) fn fleet(&mut self, f: &crate::config::FileFleet) -> Option<FleetSpec> {
        if !cfg!(feature = "fleet") {
            self.error(
                Code::FleetNotBuilt,
                "fleet",
                "this cutover was built without the `fleet` feature: it cannot join a fleet",
            );
            return None;
        }
        let before = self.diagnostics.len();
        let instance = match &f.instance {
            Some(name) => name.clone(),
            None => host_name(),
        };
        if f.instance.is_none() && !is_valid_name(&instance) {
            self.error(
                Code::InvalidName,
                "fleet",
                format!("the host name '{instance}' is not an instance name ([a-z0-9][a-z0-9_-]*): set fleet.instance"),
            );
        } else {
            self.name("instance", "fleet.instance".into(), &instance);
        }
        if f.endpoints.is_empty() {
            self.error(
                Code::InvalidValue,
                "fleet.endpoints",
                "fleet.endpoints must name at least one etcd endpoint",
            );
        }
        let tls = f.ca.is_some();
        let mut endpoints = Vec::with_capacity(f.endpoints.len());
        for (i, text) in f.endpoints.iter().enumerate() {
            let url = if text.contains("://") {
                text.clone()
            } else {
                format!("{}://{text}", if tls { "https" } else { "http" })
            };
            match url.parse::<http::Uri>() {
                Ok(uri)
                    if uri.authority().is_some_and(|a| a.port().is_some())
                        && matches!(uri.path(), "" | "/")
                        && uri.scheme_str() == Some(if tls { "https" } else { "http" }) =>
                {
                    endpoints.push(url)
                }
                _ => self.error(
                    Code::InvalidEndpoint,
                    format!("fleet.endpoints[{i}]"),
                    format!(
                        "'{text}' is not an etcd endpoint: write host:port or {}://host:port ({} because fleet.ca {})",
                        if tls { "https" } else { "http" },
                        if tls { "https" } else { "http" },
                        if tls { "is set" } else { "is not set" }
                    ),
                ),
            }
        }
        let prefix = f.prefix.trim_end_matches('/').to_owned();
        if !prefix.starts_with('/') || prefix.len() < 2 || prefix.chars().any(char::is_whitespace) {
            self.error(
                Code::InvalidValue,
                "fleet.prefix",
                format!("fleet.prefix '{}' must start with '/' and name a key prefix without spaces (e.g. \"/cutover/prod\")", f.prefix),
            );
        }
        let lease_ttl = match &f.lease_ttl {
            None => Some(Duration::from_secs(10)),
            Some(text) => self.duration("fleet.lease_ttl".into(), text).filter(|ttl| {
                let ok = (Duration::from_secs(3)..=Duration::from_secs(300)).contains(ttl);
                if !ok {
                    self.error(
                        Code::InvalidValue,
                        "fleet.lease_ttl",
                        format!("fleet.lease_ttl '{text}' must be between 3s and 5m"),
                    );
                }
                ok
            }),
        };
        let ca =
            f.ca.as_ref()
                .and_then(|name| self.read_file("fleet.ca".into(), name));
        let identity = match (&f.cert, &f.key) {
            (None, None) => None,
            (Some(cert), Some(key)) if tls => {
                let cert = self.read_file("fleet.cert".into(), cert);
                let key = self.read_file("fleet.key".into(), key);
                cert.zip(key)
            }
            _ => {
                self.error(
                    Code::InvalidValue,
                    "fleet.cert",
                    "fleet.cert and fleet.key go together, and need fleet.ca",
                );
                None
            }
        };
        let credentials = match (&f.username, &f.password_file) {
            (None, None) => None,
            (Some(user), Some(file)) => self
                .read_file("fleet.password_file".into(), file)
                .and_then(|bytes| match String::from_utf8(bytes) {
                    Ok(text) => {
                        Some((user.clone(), text.trim_end_matches(['\r', '\n']).to_owned()))
                    }
                    Err(_) => {
                        self.error(
                            Code::InvalidValue,
                            "fleet.password_file",
                            "the password file is not UTF-8",
                        );
                        None
                    }
                }),
            _ => {
                self.error(
                    Code::InvalidValue,
                    "fleet.username",
                    "fleet.username and fleet.password_file go together",
                );
                None
            }
        };
        if self.diagnostics.len() != before {
            return None;
        }
        Some(FleetSpec {
            endpoints,
            prefix,
            instance,
            lease_ttl: lease_ttl?,
            tls: ca.map(|ca| FleetTls { ca, identity }),
            credentials,
        })
    }
}

/// The host name's first label, lower-cased: the default fleet instance
/// name.
pub(super) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
        .trim()
        .split('.')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

//! TLS material: listener certificates and client CAs, and how upstreams
//! verify their backends.

use super::*;

impl Validator<'_> {
    /// Reads a listener's certificates (for `config_version`) and loads
    /// them from those same bytes: every chain parses, every key matches
    /// its leaf, the CA bundle loads. The material built here is what the
    /// generation serves, so it is exactly what was hashed.
    pub(super) fn listener_tls(
        &mut self,
        i: usize,
        tls: &crate::config::FileListenerTls,
        state_dir: Option<&Path>,
    ) -> Option<(
        crate::tls::ListenerTlsSpec,
        Arc<crate::tls::ListenerMaterial>,
    )> {
        let client_auth_fallback = tls.client_auth.as_deref() == Some("insecure_fallback");
        let client_auth_required = match tls.client_auth.as_deref() {
            None | Some("required") => true,
            Some("optional" | "insecure_fallback") => false,
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    format!("listeners[{i}].tls.client_auth"),
                    format!("client_auth '{other}' is not required, optional or insecure_fallback"),
                );
                true
            }
        };
        if tls.client_auth.is_some() && tls.client_ca.is_none() {
            self.error(
                Code::MissingClientCa,
                format!("listeners[{i}].tls.client_auth"),
                "client_auth needs tls.client_ca, the bundle client certificates are checked against",
            );
        }
        let mut ok = true;
        let mut sources = Vec::new();
        let mut slots = Vec::new();
        for (c, entry) in tls.certificates.iter().enumerate() {
            let at = format!("listeners[{i}].tls.certificates[{c}]");
            match (entry, state_dir) {
                (
                    crate::config::FileCertificate {
                        cert: Some(cert),
                        key: Some(key),
                        acme: None,
                        ..
                    },
                    _,
                ) => match self.file_certificate(&at, cert, key) {
                    Some((source, slot)) => {
                        sources.push(source);
                        slots.push(slot);
                    }
                    None => ok = false,
                },
                (
                    crate::config::FileCertificate {
                        cert: None,
                        key: None,
                        acme: Some(acme),
                        ..
                    },
                    Some(state_dir),
                ) => match self.acme(&format!("{at}.acme"), acme, state_dir) {
                    Some(spec) => {
                        let spec = Arc::new(spec);
                        slots.push(crate::tls::acme_slot(&spec, || crate::acme::stored(&spec)));
                        sources.push(crate::tls::CertSource::Acme(spec));
                    }
                    None => ok = false,
                },
                (
                    crate::config::FileCertificate {
                        cert: None,
                        key: None,
                        acme: Some(_),
                        ..
                    },
                    None,
                ) => {
                    self.error(
                        Code::MissingStateDir,
                        format!("{at}.acme"),
                        "an acme certificate is kept in runtime.state_dir (account and keys 0600), and none is set",
                    );
                    ok = false;
                }
                (entry, _) => {
                    let given: Vec<&str> = [
                        entry.cert.as_ref().map(|_| "cert"),
                        entry.key.as_ref().map(|_| "key"),
                        entry.acme.as_ref().map(|_| "acme"),
                    ]
                    .into_iter()
                    .flatten()
                    .collect();
                    self.error(
                        if entry.acme.is_some() {
                            Code::ConflictingOptions
                        } else {
                            Code::MissingKey
                        },
                        at,
                        format!(
                            "a certificate entry is either cert and key (PEM files) or acme (given: {})",
                            if given.is_empty() { "none".to_owned() } else { given.join(", ") }
                        ),
                    );
                    ok = false;
                }
            }
        }
        let mut hosts = Vec::new();
        for (c, entry) in tls.certificates.iter().enumerate() {
            if let Some(names) = &entry.hosts {
                let at = format!("listeners[{i}].tls.certificates[{c}].hosts");
                if names.is_empty() {
                    self.error(Code::InvalidHost, at.clone(), "hosts, when given, names at least one host (\"*\": every name no other entry serves)");
                    ok = false;
                }
                for name in names {
                    let valid = name == "*"
                        || super::routes::is_host_name(
                            name.strip_prefix("*.").unwrap_or(name),
                            false,
                        );
                    if !valid {
                        self.error(
                            Code::InvalidHost,
                            at.clone(),
                            format!("'{name}' is not a host name, a *.wildcard or \"*\""),
                        );
                        ok = false;
                    }
                }
            }
            hosts.push(
                entry
                    .hosts
                    .clone()
                    .map(|names| names.iter().map(|n| n.to_ascii_lowercase()).collect()),
            );
        }
        let strict_sni_host = tls.strict_sni_host.unwrap_or(tls.client_ca.is_some());
        let client_ca = tls.client_ca.as_ref().map(|ca| self.base_dir.join(ca));
        let mut client = None;
        if let (Some(name), Some(path)) = (&tls.client_ca, &client_ca) {
            let at = format!("listeners[{i}].tls.client_ca");
            match self.read_file(at.clone(), name) {
                Some(pem) => {
                    match crate::tls::parse_client_verifier(path, &pem, client_auth_required) {
                        Ok(verifier) => {
                            client = Some(crate::tls::ClientAuthSpec {
                                verifier,
                                required: client_auth_required,
                                fallback: client_auth_fallback,
                            })
                        }
                        Err(e) => {
                            self.error(Code::InvalidCertificate, at, e.to_string());
                            ok = false;
                        }
                    }
                }
                None => ok = false,
            }
        }
        ok.then(|| {
            (
                crate::tls::ListenerTlsSpec {
                    certificates: sources,
                    hosts: hosts.clone(),
                    client_ca,
                    client_auth_required,
                    client_auth_fallback,
                    strict_sni_host,
                },
                Arc::new(crate::tls::ListenerMaterial::assemble(
                    slots.into_iter().zip(hosts).collect(),
                    client,
                    strict_sni_host,
                )),
            )
        })
    }

    /// A chain and its key from files, read once and checked.
    fn file_certificate(
        &mut self,
        at: &str,
        cert_name: &str,
        key_name: &str,
    ) -> Option<(crate::tls::CertSource, Arc<crate::tls::CertSlot>)> {
        let cert_at = format!("{at}.cert");
        let cert_pem = self.read_file(cert_at.clone(), cert_name);
        let key_pem = self.read_file(format!("{at}.key"), key_name);
        let (cert, key) = (self.base_dir.join(cert_name), self.base_dir.join(key_name));
        match crate::tls::parse_cert(&cert, &cert_pem?, &key, &key_pem?) {
            Ok(loaded) => Some((
                crate::tls::CertSource::Files { cert, key },
                crate::tls::CertSlot::fixed(loaded),
            )),
            Err(e) => {
                self.error(Code::InvalidCertificate, cert_at, e.to_string());
                None
            }
        }
    }

    /// An `acme` entry (DESIGN §21): what can be checked without asking
    /// the CA. Whether its domains are served is `acme_served`'s.
    fn acme(
        &mut self,
        at: &str,
        acme: &crate::config::FileAcme,
        state_dir: &Path,
    ) -> Option<crate::tls::AcmeSpec> {
        let mut ok = true;
        let mut domains = Vec::new();
        if acme.domains.is_empty() {
            self.error(
                Code::InvalidAcme,
                format!("{at}.domains"),
                "an acme certificate names at least one domain",
            );
            ok = false;
        }
        for (d, domain) in acme.domains.iter().enumerate() {
            let name = domain.to_ascii_lowercase();
            let why = if name.starts_with("*.") {
                Some("a wildcard is validated by dns-01 only, which cutover does not answer; name each host".to_owned())
            } else if name.parse::<std::net::IpAddr>().is_ok() {
                Some(
                    "an IP address is not a domain; a certificate for it is not ordered".to_owned(),
                )
            } else if !routes::is_host_name(&name, false) || !name.contains('.') {
                Some(format!("'{domain}' is not a fully qualified host name"))
            } else {
                None
            };
            match why {
                Some(why) => {
                    self.error(Code::InvalidAcme, format!("{at}.domains[{d}]"), why);
                    ok = false;
                }
                None => domains.push(name),
            }
        }
        domains.sort();
        domains.dedup();
        match acme.directory.parse::<http::Uri>() {
            Ok(uri) if uri.scheme_str() == Some("https") && uri.host().is_some() => {}
            _ => {
                self.error(
                    Code::InvalidAcme,
                    format!("{at}.directory"),
                    format!(
                        "directory '{}' is not an https URL of an ACME directory",
                        acme.directory
                    ),
                );
                ok = false;
            }
        }
        let challenge = match acme.challenge.as_deref() {
            None | Some("tls-alpn-01") => crate::tls::Challenge::TlsAlpn01,
            Some("http-01") => crate::tls::Challenge::Http01,
            Some(other) => {
                self.error(
                    Code::InvalidAcme,
                    format!("{at}.challenge"),
                    format!("challenge '{other}' is not tls-alpn-01 or http-01"),
                );
                ok = false;
                crate::tls::Challenge::TlsAlpn01
            }
        };
        if let Some(email) = &acme.email {
            let plausible = email
                .split_once('@')
                .is_some_and(|(user, host)| !user.is_empty() && host.contains('.'))
                && !email.chars().any(|c| c.is_whitespace() || c.is_control());
            if !plausible {
                self.error(
                    Code::InvalidAcme,
                    format!("{at}.email"),
                    format!("'{email}' is not an email address"),
                );
                ok = false;
            }
        }
        let ca_root = acme.ca_root.as_ref().map(|name| self.base_dir.join(name));
        if let (Some(name), Some(path)) = (&acme.ca_root, &ca_root) {
            let root_at = format!("{at}.ca_root");
            match self.read_file(root_at.clone(), name) {
                Some(_) => {
                    if let Err(e) = crate::tls::load_roots(path) {
                        self.error(Code::InvalidCertificate, root_at, e.to_string());
                        ok = false;
                    }
                }
                None => ok = false,
            }
        }
        let eab = match &acme.eab {
            Some(eab) => {
                let key_at = format!("{at}.eab.hmac_key_file");
                match self.read_file(key_at.clone(), &eab.hmac_key_file) {
                    Some(bytes) if crate::acme::eab_key(&bytes).is_some() => {}
                    Some(_) => {
                        self.error(
                            Code::InvalidSecretFile,
                            key_at,
                            format!("'{}': not a base64url HMAC key", eab.hmac_key_file),
                        );
                        ok = false;
                    }
                    None => ok = false,
                }
                Some(crate::tls::Eab {
                    kid: eab.kid.clone(),
                    hmac_file: self.base_dir.join(&eab.hmac_key_file),
                })
            }
            None => None,
        };
        let renew_before = match &acme.renew_before {
            Some(text) => {
                let parsed = self.duration(format!("{at}.renew_before"), text);
                ok &= parsed.is_some();
                parsed
            }
            None => None,
        };
        ok.then(|| crate::tls::AcmeSpec {
            domains,
            directory: acme.directory.clone(),
            email: acme.email.clone(),
            challenge,
            ca_root,
            eab,
            renew_before,
            state_dir: state_dir.to_path_buf(),
        })
    }

    /// Every ACME domain is served where its certificate is (a route of
    /// its listener takes the host; a fleet instance's routes are in the
    /// shared document, not here), an http-01 domain also on an `http`
    /// listener, and a domain is ordered by one entry only.
    pub(super) fn acme_served(
        &mut self,
        listeners: &[ListenerSpec],
        routes: &[Arc<RouteSpec>],
        fleet: bool,
    ) {
        let mut owners: HashMap<&str, (&str, &crate::tls::AcmeSpec)> = HashMap::new();
        let http = listeners
            .iter()
            .filter(|l| l.protocol == ListenerProtocol::Http)
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>();
        for (i, listener) in listeners.iter().enumerate() {
            let Some(tls) = &listener.tls else { continue };
            for (c, source) in tls.certificates.iter().enumerate() {
                let crate::tls::CertSource::Acme(acme) = source else {
                    continue;
                };
                let at = format!("listeners[{i}].tls.certificates[{c}].acme.domains");
                for domain in &acme.domains {
                    let served_on = |name: &str| {
                        routes.iter().any(|r| {
                            r.listeners.iter().any(|l| l == name)
                                && (r.hosts.is_empty() || r.hosts.iter().any(|h| h.matches(domain)))
                        })
                    };
                    if !fleet && !served_on(&listener.name) {
                        self.error(
                            Code::AcmeDomainNotServed,
                            at.clone(),
                            format!(
                                "no route of listener '{}' serves {domain}: its certificate would serve nothing",
                                listener.name
                            ),
                        );
                    }
                    if acme.challenge == crate::tls::Challenge::Http01 && http.is_empty() {
                        self.error(
                            Code::AcmeDomainNotServed,
                            at.clone(),
                            format!("http-01 for {domain} is answered on an http listener, and there is none"),
                        );
                    }
                    match owners.get(domain.as_str()) {
                        Some((_, other)) if **other != **acme => self.error(
                            Code::ConflictingAcme,
                            at.clone(),
                            format!(
                                "{domain} is also in another acme entry with other settings; two entries would order it twice: give both listeners the same entry"
                            ),
                        ),
                        Some(_) => {}
                        None => {
                            owners.insert(domain, (&listener.name, acme));
                        }
                    }
                }
            }
        }
    }

    /// Checks an upstream's TLS settings; without a `tls` section, https
    /// and h2 upstreams verify against the WebPKI roots by host name.
    pub(super) fn upstream_tls(
        &mut self,
        base: &str,
        tls: Option<&crate::config::FileUpstreamTls>,
    ) -> Option<crate::tls::UpstreamTlsSpec> {
        let Some(tls) = tls else {
            return Some(crate::tls::UpstreamTlsSpec {
                ca: None,
                server_name: None,
                client_cert: None,
                subject_alt_names: Vec::new(),
                files_fingerprint: String::new(),
            });
        };
        let mut ok = true;
        let first_file = self.referenced.len();
        let ca = tls.ca.as_ref().map(|ca| self.base_dir.join(ca));
        if let (Some(name), Some(path)) = (&tls.ca, &ca) {
            if self.read_file(format!("{base}.tls.ca"), name).is_some() {
                if let Err(e) = crate::tls::load_roots(path) {
                    self.error(
                        Code::InvalidCertificate,
                        format!("{base}.tls.ca"),
                        e.to_string(),
                    );
                    ok = false;
                }
            } else {
                ok = false;
            }
        }
        if let Some(name) = &tls.server_name {
            if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
                self.error(
                    Code::InvalidHost,
                    format!("{base}.tls.server_name"),
                    format!("'{name}' is not a server name"),
                );
                ok = false;
            }
        }
        let client_cert = match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                let have_cert = self.read_file(format!("{base}.tls.cert"), cert).is_some();
                let have_key = self.read_file(format!("{base}.tls.key"), key).is_some();
                let (cert_path, key_path) = (self.base_dir.join(cert), self.base_dir.join(key));
                if have_cert && have_key {
                    if let Err(e) = crate::tls::load_cert(&cert_path, &key_path) {
                        self.error(
                            Code::InvalidCertificate,
                            format!("{base}.tls.cert"),
                            e.to_string(),
                        );
                        ok = false;
                    }
                } else {
                    ok = false;
                }
                Some((cert_path, key_path))
            }
            (None, None) => None,
            _ => {
                self.error(
                    Code::InvalidValue,
                    format!("{base}.tls"),
                    "tls.cert and tls.key go together",
                );
                ok = false;
                None
            }
        };
        let files: Vec<u8> = self
            .referenced
            .get(first_file..)
            .unwrap_or_default()
            .iter()
            .flat_map(|(_, contents)| contents.iter().copied())
            .collect();
        let subject_alt_names = tls.subject_alt_names.clone().unwrap_or_default();
        if tls.subject_alt_names.as_ref().is_some_and(Vec::is_empty) {
            self.error(
                Code::InvalidValue,
                format!("{base}.tls.subject_alt_names"),
                "subject_alt_names, when given, names at least one name",
            );
            ok = false;
        }
        for name in &subject_alt_names {
            let uri = name.contains("://");
            let dns = super::routes::is_host_name(name.strip_prefix("*.").unwrap_or(name), false);
            if !uri && !dns {
                self.error(
                    Code::InvalidValue,
                    format!("{base}.tls.subject_alt_names"),
                    format!("'{name}' is neither a DNS name nor a URI (scheme://…)"),
                );
                ok = false;
            }
        }
        ok.then_some(crate::tls::UpstreamTlsSpec {
            ca,
            server_name: tls.server_name.clone(),
            client_cert,
            subject_alt_names,
            files_fingerprint: crate::tls::fingerprint(&files),
        })
    }
}

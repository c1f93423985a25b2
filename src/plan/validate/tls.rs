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
    ) -> Option<(
        crate::tls::ListenerTlsSpec,
        Arc<crate::tls::ListenerMaterial>,
    )> {
        let client_auth_required = match tls.client_auth.as_deref() {
            None | Some("required") => true,
            Some("optional") => false,
            Some(other) => {
                self.error(
                    Code::InvalidValue,
                    format!("listeners[{i}].tls.client_auth"),
                    format!("client_auth '{other}' is not required or optional"),
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
        let mut paths = Vec::new();
        let mut loaded = Vec::new();
        for (c, pair) in tls.certificates.iter().enumerate() {
            let cert_at = format!("listeners[{i}].tls.certificates[{c}].cert");
            let cert_pem = self.read_file(cert_at.clone(), &pair.cert);
            let key_pem = self.read_file(
                format!("listeners[{i}].tls.certificates[{c}].key"),
                &pair.key,
            );
            let (cert, key) = (
                self.base_dir.join(&pair.cert),
                self.base_dir.join(&pair.key),
            );
            match (cert_pem, key_pem) {
                (Some(cert_pem), Some(key_pem)) => {
                    match crate::tls::parse_cert(&cert, &cert_pem, &key, &key_pem) {
                        Ok(certificate) => loaded.push(certificate),
                        Err(e) => {
                            self.error(Code::InvalidCertificate, cert_at, e.to_string());
                            ok = false;
                        }
                    }
                }
                _ => ok = false,
            }
            paths.push((cert, key));
        }
        let client_ca = tls.client_ca.as_ref().map(|ca| self.base_dir.join(ca));
        let mut client = None;
        if let (Some(name), Some(path)) = (&tls.client_ca, &client_ca) {
            let at = format!("listeners[{i}].tls.client_ca");
            match self.read_file(at.clone(), name) {
                Some(pem) => {
                    match crate::tls::parse_client_verifier(path, &pem, client_auth_required) {
                        Ok(verifier) => client = Some((verifier, client_auth_required)),
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
                    certificates: paths,
                    client_ca,
                    client_auth_required,
                },
                Arc::new(crate::tls::ListenerMaterial::assemble(loaded, client)),
            )
        })
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
        ok.then_some(crate::tls::UpstreamTlsSpec {
            ca,
            server_name: tls.server_name.clone(),
            client_cert,
            files_fingerprint: crate::tls::fingerprint(&files),
        })
    }
}

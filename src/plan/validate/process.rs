//! Process settings: `[admin]`, `[tracing]`, `[log]`, `[runtime]`.

use super::*;
use crate::config::FileFreeze;
use crate::plan::freeze::{self, FreezeWhen, FreezeWindow};
use crate::plan::HugePages;

/// Request heads a listener keeps for `impact` unless told otherwise.
pub const DEFAULT_IMPACT_SAMPLE: u32 = 10_000;
/// At most this many (each head is at most ~4 KiB: see `generation/sample.rs`).
pub const MAX_IMPACT_SAMPLE: u32 = 100_000;

/// The admin API's body limit unless `admin.max_body` says otherwise.
pub const DEFAULT_ADMIN_BODY: usize = 1024 * 1024;
const MIN_ADMIN_BODY: u64 = 64 * 1024;
const MAX_ADMIN_BODY: u64 = 64 * 1024 * 1024;

impl Validator<'_> {
    pub(super) fn admin(&mut self, file: &FileConfig) -> Option<AdminSpec> {
        let bind = self.socket_addr("admin.bind".into(), &file.admin.bind);
        let mut callers = Vec::new();
        if let Some(name) = &file.admin.token_file {
            let contents = self.read_file("admin.token_file".into(), name)?;
            let token = String::from_utf8_lossy(&contents).trim().to_owned();
            if token.len() < 16 {
                self.error(
                    Code::WeakToken,
                    "admin.token_file",
                    format!("the admin token in '{name}' must be at least 16 characters"),
                );
            }
            callers.push(CallerSpec {
                name: "admin".into(),
                credential: Credential::Token(sha256(token.as_bytes())),
                scopes: Scopes::all(),
                requires_approval: false,
            });
        }
        for (i, caller) in file.admin.callers.iter().enumerate() {
            if let Some(caller) = self.caller(file, i, caller) {
                if callers.iter().any(|c| c.name == caller.name) {
                    self.error(
                        Code::DuplicateCaller,
                        format!("admin.callers[{i}].name"),
                        format!(
                            "caller '{}' is named twice (admin.token_file is the caller 'admin')",
                            caller.name
                        ),
                    );
                } else if matches!(caller.credential, Credential::Token(_))
                    && callers.iter().any(|c| c.credential == caller.credential)
                {
                    self.error(
                        Code::DuplicateCaller,
                        format!("admin.callers[{i}]"),
                        format!(
                            "caller '{}' has another caller's token: a token names one caller",
                            caller.name
                        ),
                    );
                } else {
                    callers.push(caller);
                }
            }
        }
        let bind = bind?;
        if !bind.ip().is_loopback() && callers.is_empty() {
            self.error(
                Code::AdminUnprotected,
                "admin.bind",
                format!("admin bind {bind} is not a loopback address; set admin.token_file or admin.callers to protect it"),
            );
        }
        let max_body = match &file.admin.max_body {
            None => DEFAULT_ADMIN_BODY,
            Some(size) => match self.size("admin.max_body".into(), size)? {
                n if (MIN_ADMIN_BODY..=MAX_ADMIN_BODY).contains(&n) => n as usize,
                n => {
                    self.error(
                        Code::InvalidValue,
                        "admin.max_body",
                        format!("admin.max_body {n} bytes is not between 64 KiB and 64 MiB"),
                    );
                    return None;
                }
            },
        };
        let freeze = file
            .admin
            .freeze
            .iter()
            .enumerate()
            .filter_map(|(i, window)| self.freeze(i, window))
            .collect();
        let mut webhooks: Vec<WebhookSpec> = Vec::new();
        for (i, hook) in file.admin.webhooks.iter().enumerate() {
            if let Some(hook) = self.webhook(i, hook) {
                if webhooks.iter().any(|w| w.name == hook.name) {
                    self.error(
                        Code::DuplicateName,
                        format!("admin.webhooks[{i}].name"),
                        format!("webhook '{}' is named twice", hook.name),
                    );
                } else {
                    webhooks.push(hook);
                }
            }
        }
        let approval = self.approval(file, &callers);
        let tls = file.admin.tls.as_ref().and_then(|tls| self.admin_tls(tls));
        Some(AdminSpec {
            bind,
            tls,
            callers,
            freeze,
            webhooks,
            approval,
            audit_log: file.admin.audit_log.as_ref().map(|f| self.base_dir.join(f)),
            require_expected_generation: file.admin.require_expected_generation,
            max_body,
        })
    }

    /// One `[[admin.callers]]` entry: a name, exactly one token (its
    /// SHA-256, or a file only its owner can read) and known scopes.
    fn caller(
        &mut self,
        file: &FileConfig,
        i: usize,
        caller: &crate::config::FileCaller,
    ) -> Option<CallerSpec> {
        let at = |field: &str| format!("admin.callers[{i}].{field}");
        let mut ok = true;
        if caller.name.is_empty()
            || !caller
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
        {
            self.error(
                Code::InvalidValue,
                at("name"),
                format!(
                    "caller name '{}' must be letters, digits, '-', '_', '.' or '@'",
                    caller.name
                ),
            );
            ok = false;
        }
        let mut scopes = Scopes::default();
        for (j, name) in caller.scopes.iter().enumerate() {
            match Scope::parse(name) {
                Some(scope) => scopes = scopes.with(scope),
                None => {
                    let known: Vec<&str> = Scope::ALL.iter().map(|s| s.name()).collect();
                    self.error(
                        Code::UnknownScope,
                        format!("admin.callers[{i}].scopes[{j}]"),
                        format!("unknown scope '{name}'; scopes are {}", known.join(", ")),
                    );
                    ok = false;
                }
            }
        }
        if caller.scopes.is_empty() {
            self.error(
                Code::MissingKey,
                at("scopes"),
                format!("caller '{}' has no scopes: give it at least one (read, for a caller that only looks)", caller.name),
            );
            ok = false;
        }
        let given = [
            caller.token_sha256.is_some(),
            caller.token_file.is_some(),
            caller.client_cert.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            self.error(
                Code::ConflictingOptions,
                at("token_sha256"),
                "a caller has one credential: token_sha256, token_file or client_cert",
            );
            return None;
        }
        if let Some(cert) = &caller.client_cert {
            let matcher = match (&cert.san, &cert.subject) {
                (Some(san), None) if !san.trim().is_empty() => {
                    Some(CertMatch::San(san.trim().to_owned()))
                }
                (None, Some(subject)) if !subject_parts(subject).is_empty() => {
                    Some(CertMatch::Subject(subject_parts(subject)))
                }
                _ => {
                    self.error(
                        Code::InvalidValue,
                        at("client_cert"),
                        "client_cert names the caller by one san (\"spiffe://example.org/ci\") or by its subject (\"CN=ci, O=Example\")",
                    );
                    None
                }
            };
            if file
                .admin
                .tls
                .as_ref()
                .is_none_or(|t| t.client_ca.is_none())
            {
                self.error(
                    Code::MissingKey,
                    at("client_cert"),
                    "a caller named by its client certificate needs admin.tls with client_ca to verify it",
                );
                return None;
            }
            let matcher = matcher?;
            return ok.then(|| CallerSpec {
                name: caller.name.clone(),
                credential: Credential::Certificate(matcher),
                scopes,
                requires_approval: caller.requires_approval,
            });
        }
        let token_sha256 = match (&caller.token_sha256, &caller.token_file) {
            (Some(hex), None) => match parse_sha256(hex) {
                Some(hash) => Some(hash),
                None => {
                    self.error(
                        Code::InvalidValue,
                        at("token_sha256"),
                        "token_sha256 must be 64 hex digits: the SHA-256 of the token (`printf %s TOKEN | sha256sum`)",
                    );
                    None
                }
            },
            (None, Some(name)) => self.secret(at("token_file"), name).and_then(|contents| {
                let token = String::from_utf8_lossy(&contents).trim().to_owned();
                if token.len() < 16 {
                    self.error(
                        Code::WeakToken,
                        at("token_file"),
                        format!("the token in '{name}' must be at least 16 characters"),
                    );
                    return None;
                }
                Some(sha256(token.as_bytes()))
            }),
            _ => {
                self.error(
                    Code::MissingKey,
                    at("token_sha256"),
                    format!(
                        "caller '{}' has no credential: set token_sha256, token_file or client_cert",
                        caller.name
                    ),
                );
                None
            }
        };
        let token_sha256 = token_sha256?;
        ok.then(|| CallerSpec {
            name: caller.name.clone(),
            credential: Credential::Token(token_sha256),
            scopes,
            requires_approval: caller.requires_approval,
        })
    }

    /// `admin.tls`: a certificate and key that belong together, and a
    /// client CA bundle that reads.
    fn admin_tls(&mut self, tls: &crate::config::FileAdminTls) -> Option<AdminTlsSpec> {
        let cert = self.base_dir.join(&tls.cert);
        let key = self.base_dir.join(&tls.key);
        let cert_pem = self.read_file("admin.tls.cert".into(), &tls.cert);
        let key_pem = self.read_file("admin.tls.key".into(), &tls.key);
        if let (Some(cert_pem), Some(key_pem)) = (&cert_pem, &key_pem) {
            if let Err(error) = crate::tls::parse_cert(&cert, cert_pem, &key, key_pem) {
                self.error(
                    Code::InvalidCertificate,
                    "admin.tls.cert",
                    error.to_string(),
                );
                return None;
            }
        }
        let client_ca = match &tls.client_ca {
            None => None,
            Some(name) => {
                let pem = self.read_file("admin.tls.client_ca".into(), name)?;
                let path = self.base_dir.join(name);
                if let Err(error) = crate::tls::parse_roots(&path, &pem) {
                    self.error(
                        Code::InvalidCertificate,
                        "admin.tls.client_ca",
                        error.to_string(),
                    );
                    return None;
                }
                Some(path)
            }
        };
        cert_pem?;
        key_pem?;
        Some(AdminTlsSpec {
            cert,
            key,
            client_ca,
        })
    }

    /// `[admin.approval]` (or a caller's `requires_approval`): known
    /// operations, 1 to 10 approvers that the callers can supply, an
    /// expiry of 1 minute to 7 days; callers to propose and approve; one
    /// instance (proposals are not shared through a fleet in this build).
    fn approval(&mut self, file: &FileConfig, callers: &[CallerSpec]) -> Option<ApprovalPolicy> {
        let asked = file.admin.approval.as_ref();
        let by_caller = callers.iter().any(|c| c.requires_approval);
        if asked.is_none() && !by_caller {
            return None;
        }
        let at = |field: &str| format!("admin.approval.{field}");
        let mut required_for = Vec::new();
        for (i, name) in asked.iter().flat_map(|a| a.required_for.iter()).enumerate() {
            match Approvable::parse(name) {
                Some(op) if !required_for.contains(&op) => required_for.push(op),
                Some(_) => {}
                None => self.error(
                    Code::InvalidValue,
                    format!("admin.approval.required_for[{i}]"),
                    format!("'{name}' is not an operation that can wait for approval: activate, rollback, upgrade"),
                ),
            }
        }
        let approvers = asked.and_then(|a| a.approvers).unwrap_or(1);
        if !(1..=10).contains(&approvers) {
            self.error(
                Code::InvalidValue,
                at("approvers"),
                "approvers must be between 1 and 10",
            );
        }
        let expire = match asked.and_then(|a| a.expire.as_deref()) {
            None => Duration::from_secs(3600),
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) if d >= Duration::from_secs(60) && d <= Duration::from_secs(7 * 86_400) => d,
                _ => {
                    self.error(
                        Code::InvalidValue,
                        at("expire"),
                        format!("expire '{text}' is not a duration between 1m and 7d"),
                    );
                    Duration::from_secs(3600)
                }
            },
        };
        let where_ = if asked.is_some() {
            "admin.approval"
        } else {
            "admin.callers"
        };
        let can_approve = callers
            .iter()
            .filter(|c| c.scopes.allow(Scope::Approve))
            .count();
        if can_approve < approvers as usize {
            self.error(
                Code::InvalidValue,
                where_,
                format!("{approvers} approvals are needed but {can_approve} callers have the 'approve' scope: nothing could ever be approved"),
            );
        }
        Some(ApprovalPolicy {
            required_for,
            approvers,
            expire,
        })
    }

    /// One `[[admin.webhooks]]` entry: a name, an http(s) URL, known event
    /// kinds, a secret of at least 16 bytes only its owner can read.
    fn webhook(&mut self, i: usize, hook: &crate::config::FileWebhook) -> Option<WebhookSpec> {
        let at = |field: &str| format!("admin.webhooks[{i}].{field}");
        let name_ok = !hook.name.is_empty()
            && hook
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !name_ok {
            self.error(
                Code::InvalidValue,
                at("name"),
                format!(
                    "webhook name '{}' must be letters, digits, '-', '_' or '.'",
                    hook.name
                ),
            );
        }
        let url = match hook.url.parse::<http::Uri>() {
            Ok(url)
                if matches!(url.scheme_str(), Some("http" | "https")) && url.host().is_some() =>
            {
                Some(url)
            }
            _ => {
                self.error(
                    Code::InvalidValue,
                    at("url"),
                    format!(
                        "'{}' is not an http:// or https:// URL with a host",
                        hook.url
                    ),
                );
                None
            }
        };
        let mut events = Vec::new();
        for (j, name) in hook.events.iter().flatten().enumerate() {
            match super::super::EVENT_KINDS.iter().find(|k| **k == name) {
                Some(kind) => events.push(*kind),
                None => self.error(
                    Code::InvalidValue,
                    format!("admin.webhooks[{i}].events[{j}]"),
                    format!(
                        "unknown event '{name}'; events are {}",
                        super::super::EVENT_KINDS.join(", ")
                    ),
                ),
            }
        }
        if hook.events.as_ref().is_some_and(Vec::is_empty) {
            self.error(
                Code::InvalidValue,
                at("events"),
                "an empty events list sends nothing: leave it out for every event",
            );
        }
        let key = self
            .secret(at("secret_file"), &hook.secret_file)
            .and_then(|bytes| {
                let secret = String::from_utf8_lossy(&bytes).trim().to_owned();
                if secret.len() < 16 {
                    self.error(
                        Code::WeakToken,
                        at("secret_file"),
                        format!(
                            "the secret in '{}' must be at least 16 characters",
                            hook.secret_file
                        ),
                    );
                    return None;
                }
                Some(ring::hmac::Key::new(
                    ring::hmac::HMAC_SHA256,
                    secret.as_bytes(),
                ))
            });
        let ca = hook.ca.as_ref().and_then(|ca| {
            self.read_file(at("ca"), ca)?;
            Some(self.base_dir.join(ca))
        });
        let timeout = match hook.timeout.as_deref().map(humantime::parse_duration) {
            None => Some(Duration::from_secs(5)),
            Some(Ok(d)) if d >= Duration::from_millis(100) && d <= Duration::from_secs(60) => {
                Some(d)
            }
            Some(_) => {
                self.error(
                    Code::InvalidValue,
                    at("timeout"),
                    "timeout must be a duration between 100ms and 60s",
                );
                None
            }
        };
        if !name_ok {
            return None;
        }
        Some(WebhookSpec {
            name: hook.name.clone(),
            url: url?,
            events,
            key: key?,
            ca,
            timeout: timeout?,
        })
    }

    /// One `[[admin.freeze]]` window: `from` before `to` (RFC 3339), or a
    /// cron pattern with a duration and a known zone; never both; a
    /// reason always.
    fn freeze(&mut self, i: usize, window: &crate::config::FileFreeze) -> Option<FreezeWindow> {
        let at = |field: &str| format!("admin.freeze[{i}].{field}");
        if window.reason.trim().is_empty() {
            self.error(
                Code::MissingKey,
                at("reason"),
                "a freeze window needs a reason: it is what a refused change is told",
            );
        }
        let instant = |v: &mut Self, field: &str, text: &str| {
            let parsed = freeze::parse_instant(text);
            if parsed.is_none() {
                v.error(
                    Code::InvalidValue,
                    at(field),
                    format!("'{text}' is not an RFC 3339 date-time with an offset (2026-12-20T00:00:00Z)"),
                );
            }
            parsed
        };
        let when = match window {
            FileFreeze {
                from: Some(from),
                to: Some(to),
                cron: None,
                duration: None,
                timezone: None,
                ..
            } => {
                let (from, to) = (instant(self, "from", from), instant(self, "to", to));
                let (from, to) = (from?, to?);
                if to <= from {
                    self.error(
                        Code::InvalidValue,
                        at("to"),
                        format!("freeze window ends ({to}) before it starts ({from})"),
                    );
                    return None;
                }
                FreezeWhen::Fixed { from, to }
            }
            FileFreeze {
                from: None,
                to: None,
                cron: Some(pattern),
                duration,
                timezone,
                ..
            } => {
                let cron = freeze::parse_cron(pattern).map_err(|e| {
                    self.error(
                        Code::InvalidValue,
                        at("cron"),
                        format!("'{pattern}' is not a five-field cron pattern: {e}"),
                    );
                });
                let Some(duration) = duration else {
                    self.error(
                        Code::MissingKey,
                        at("duration"),
                        "a recurring freeze window needs a duration (\"62h\")",
                    );
                    return None;
                };
                let duration = match humantime::parse_duration(duration) {
                    Ok(d) if !d.is_zero() && d <= Duration::from_secs(366 * 86_400) => Some(d),
                    _ => {
                        self.error(
                            Code::InvalidValue,
                            at("duration"),
                            format!(
                                "duration '{duration}' is not a duration between 1s and 366 days"
                            ),
                        );
                        None
                    }
                };
                let timezone = match timezone.as_deref() {
                    None => Some(chrono_tz::Tz::UTC),
                    Some(name) => name.parse::<chrono_tz::Tz>().ok().or_else(|| {
                        self.error(
                            Code::InvalidValue,
                            at("timezone"),
                            format!("'{name}' is not an IANA time zone (Europe/Berlin, UTC)"),
                        );
                        None
                    }),
                };
                FreezeWhen::Recurring {
                    cron: Box::new(cron.ok()?),
                    pattern: pattern.clone(),
                    duration: duration?,
                    timezone: timezone?,
                }
            }
            FileFreeze { cron: Some(_), .. } => {
                self.error(
                    Code::ConflictingOptions,
                    at("cron"),
                    "a freeze window is fixed (from, to) or recurring (cron, duration, timezone), not both",
                );
                return None;
            }
            FileFreeze { cron: None, .. } => {
                let (field, message) = match (&window.from, &window.to) {
                    (Some(_), None) => ("to", "a fixed freeze window needs to"),
                    (None, Some(_)) => ("from", "a fixed freeze window needs from"),
                    _ if window.duration.is_some() || window.timezone.is_some() => {
                        ("cron", "duration and timezone need cron")
                    }
                    _ => (
                        "from",
                        "a freeze window needs from and to, or cron and duration",
                    ),
                };
                self.error(Code::MissingKey, at(field), message);
                return None;
            }
        };
        Some(FreezeWindow {
            reason: window.reason.clone(),
            when,
        })
    }

    pub(super) fn tracing(&mut self, file: &FileConfig) -> TracingSpec {
        let section = file.tracing.clone();
        let otlp_endpoint = section.otlp_endpoint.as_deref().and_then(|text| {
            if !cfg!(feature = "otlp") {
                self.error(
                    Code::OtlpNotBuilt,
                    "tracing.otlp_endpoint",
                    "this cutover was built without the `otlp` feature: it cannot export spans",
                );
                return None;
            }
            match text.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("http" | "https"))
                        && uri.authority().is_some() =>
                {
                    Some(uri)
                }
                _ => {
                    self.error(
                        Code::InvalidOtlpEndpoint,
                        "tracing.otlp_endpoint",
                        format!("'{text}' is not an http:// or https:// URL with a host"),
                    );
                    None
                }
            }
        });
        let sample_ratio = section.sample_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sample_ratio) {
            self.error(
                Code::InvalidSampleRatio,
                "tracing.sample_ratio",
                format!("sample_ratio {sample_ratio} is not between 0 and 1"),
            );
        }
        TracingSpec {
            otlp_endpoint,
            service_name: section.service_name.unwrap_or_else(|| "cutover".to_owned()),
            sample_ratio: sample_ratio.clamp(0.0, 1.0),
        }
    }

    pub(super) fn log(&mut self, file: &FileConfig) -> Option<LogSpec> {
        let level = file.log.level.trim().to_owned();
        if tracing_subscriber::EnvFilter::builder()
            .parse(&level)
            .is_err()
            || level.is_empty()
        {
            self.error(
                Code::InvalidLogLevel,
                "log.level",
                format!("'{level}' is not a log level or filter (trace, debug, info, warn, error, or target=level)"),
            );
        }
        let format = match file.log.format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                self.error(
                    Code::InvalidLogFormat,
                    "log.format",
                    format!("log format '{other}' is not text or json"),
                );
                LogFormat::Text
            }
        };
        Some(LogSpec {
            level,
            format,
            file: file.log.file.as_ref().map(|f| self.base_dir.join(f)),
            access: file.log.access,
            access_file: file.log.access_file.as_ref().map(|f| self.base_dir.join(f)),
        })
    }

    pub(super) fn runtime(&mut self, file: &FileConfig) -> Option<RuntimeSpec> {
        let r = &file.runtime;
        if !(1..=1024).contains(&r.history_limit) {
            self.error(
                Code::InvalidValue,
                "runtime.history_limit",
                format!(
                    "history_limit {} must be between 1 and 1024",
                    r.history_limit
                ),
            );
        }
        if let Some(threads) = r.worker_threads {
            if !(1..=1024).contains(&threads) {
                self.error(
                    Code::InvalidValue,
                    "runtime.worker_threads",
                    format!("worker_threads {threads} must be between 1 and 1024"),
                );
            }
        }
        let impact_sample = r.impact_sample.unwrap_or(DEFAULT_IMPACT_SAMPLE);
        if impact_sample > MAX_IMPACT_SAMPLE {
            self.error(
                Code::InvalidValue,
                "runtime.impact_sample",
                format!("impact_sample {impact_sample} must be at most {MAX_IMPACT_SAMPLE} (0 turns sampling off)"),
            );
        }
        let huge_pages = match r.huge_pages.as_deref() {
            None => HugePages::default(),
            Some(text) => HugePages::parse(text).unwrap_or_else(|| {
                self.error(
                    Code::InvalidValue,
                    "runtime.huge_pages",
                    format!("huge_pages '{text}' must be \"busy\", \"never\" or \"always\""),
                );
                HugePages::default()
            }),
        };
        let drain_timeout = self.duration("runtime.drain_timeout".into(), &r.drain_timeout);
        let max_pinned_age = match &r.max_pinned_age {
            Some(text) => Some(self.duration("runtime.max_pinned_age".into(), text)?),
            None => None,
        };
        let mut file_roots = Vec::with_capacity(r.file_roots.len());
        for (i, root) in r.file_roots.iter().enumerate() {
            let root = PathBuf::from(root);
            if root.is_absolute() {
                file_roots.push(root);
            } else {
                self.error(
                    Code::InvalidValue,
                    format!("runtime.file_roots[{i}]"),
                    format!("file root '{}' must be an absolute path", root.display()),
                );
            }
        }
        Some(RuntimeSpec {
            file_roots,
            state_dir: r.state_dir.as_ref().map(|d| self.base_dir.join(d)),
            history_limit: r.history_limit.clamp(1, 1024) as usize,
            drain_timeout: drain_timeout?,
            max_pinned_age,
            worker_threads: r.worker_threads.map(|t| t as usize),
            write_back: r.write_back.unwrap_or(false),
            impact_sample: impact_sample.min(MAX_IMPACT_SAMPLE) as usize,
            huge_pages,
        })
    }
}

/// The SHA-256 of `bytes`.
fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

/// 64 hex digits as 32 bytes.
fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

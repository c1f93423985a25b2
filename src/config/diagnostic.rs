//! Diagnostics: one finding about a candidate configuration, as data.
//!
//! Every stage that can refuse a configuration (TOML parsing, section
//! decoding, semantic validation) produces [`Diagnostic`]s; the stage
//! collects all of them before failing, so an operator sees every problem
//! in one round trip. `path` is the document path (`routes[1].upstream`),
//! `line`/`column` are 1-based and resolved from the source text.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Declares [`Code`] and the list of every code, in one place: a code the
/// code base can emit is a variant here, and `docs/config.md` lists them
/// all (a test compares the two).
macro_rules! codes {
    ($($variant:ident = $text:literal,)*) => {
        /// A diagnostic's stable, machine-readable code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $($variant,)*
        }

        impl Code {
            /// Every code, in the order `docs/config.md` lists them.
            pub const ALL: &[Code] = &[$(Code::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text,)*
                }
            }
        }
    };
}

codes! {
    SyntaxError = "syntax_error",
    InvalidToml = "invalid_toml",
    UnknownKey = "unknown_key",
    MissingKey = "missing_key",
    InvalidValue = "invalid_value",
    InvalidType = "invalid_type",
    InvalidName = "invalid_name",
    DuplicateName = "duplicate_name",
    InvalidAddress = "invalid_address",
    DuplicateBind = "duplicate_bind",
    InvalidProtocol = "invalid_protocol",
    UnexpectedTls = "unexpected_tls",
    MissingTls = "missing_tls",
    UnexpectedUpstream = "unexpected_upstream",
    MissingUpstream = "missing_upstream",
    UnknownUpstream = "unknown_upstream",
    UnknownZone = "unknown_zone",
    UnknownListener = "unknown_listener",
    TcpListenerRoute = "tcp_listener_route",
    MissingListeners = "missing_listeners",
    InvalidHost = "invalid_host",
    ConflictingPath = "conflicting_path",
    InvalidPath = "invalid_path",
    InvalidRegex = "invalid_regex",
    InvalidMethod = "invalid_method",
    InvalidHeader = "invalid_header",
    ConflictingAction = "conflicting_action",
    MissingAction = "missing_action",
    InvalidStatus = "invalid_status",
    InvalidDuration = "invalid_duration",
    InvalidPolicy = "invalid_policy",
    EmptyBackends = "empty_backends",
    DuplicateBackend = "duplicate_backend",
    InvalidWeight = "invalid_weight",
    IgnoredWeight = "ignored_weight",
    AmbiguousRoute = "ambiguous_route",
    InvalidCertificate = "invalid_certificate",
    MissingClientCa = "missing_client_ca",
    InvalidLogLevel = "invalid_log_level",
    InvalidLogFormat = "invalid_log_format",
    InvalidMaxSeries = "invalid_max_series",
    InvalidOtlpEndpoint = "invalid_otlp_endpoint",
    InvalidSampleRatio = "invalid_sample_ratio",
    OtlpNotBuilt = "otlp_not_built",
    AdminUnprotected = "admin_unprotected",
    WeakToken = "weak_token",
    UnknownScope = "unknown_scope",
    DuplicateCaller = "duplicate_caller",
    ExposedSecret = "exposed_secret",
    UnreadableFile = "unreadable_file",
    FileOutsideRoots = "file_outside_roots",
    UnexpectedOption = "unexpected_option",
    UnsupportedOption = "unsupported_option",
    ConflictingOptions = "conflicting_options",
    MissingHosts = "missing_hosts",
    AmbiguousSniRoute = "ambiguous_sni_route",
    MissingTrustedProxies = "missing_trusted_proxies",
    InvalidEndpoint = "invalid_endpoint",
    FleetNotBuilt = "fleet_not_built",
    NotShared = "not_shared",
    InvalidTemplate = "invalid_template",
    UnknownVariable = "unknown_variable",
    InvalidRewrite = "invalid_rewrite",
    RedirectLoop = "redirect_loop",
    GrpcNeedsHttp2 = "grpc_needs_http2",
    InvalidSecretFile = "invalid_secret_file",
    InvalidBackend = "invalid_backend",
    UnresolvedName = "unresolved_name",
    MissingStateDir = "missing_state_dir",
    InvalidAcme = "invalid_acme",
    AcmeDomainNotServed = "acme_domain_not_served",
    ConflictingAcme = "conflicting_acme",
    MissingLimitStore = "missing_limit_store",
    InlineSecret = "inline_secret",
    InvalidRule = "invalid_rule",
    UnknownWafRuleset = "unknown_waf_ruleset",
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Code::ALL
            .iter()
            .copied()
            .find(|code| code.as_str() == text)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown diagnostic code '{text}'")))
    }
}

impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Stable, machine-readable code (`unknown_upstream`, `invalid_duration`, ...).
    pub code: Code,
    /// Document path of the offending value, e.g. `routes[1].upstream`.
    pub path: String,
    /// Human-readable explanation naming the input that was refused.
    pub message: String,
    /// 1-based line in the source text, when the value could be located.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// 1-based column (in characters) in the source text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
}

impl Diagnostic {
    /// A diagnostic that has not been located in the source yet.
    pub fn new(code: Code, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            path: path.into(),
            message: message.into(),
            line: None,
            column: None,
        }
    }

    /// Formats as `FILE:LINE:COL: code: message`, the form `cutover check` prints.
    pub fn render(&self, file: &str) -> String {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                format!("{file}:{line}:{column}: {}: {}", self.code, self.message)
            }
            _ => format!("{file}: {}: {} (at {})", self.code, self.message, self.path),
        }
    }
}

//! Who may call the admin API, and for what (DESIGN §23): the callers
//! `[admin]` names and their scopes, as validation leaves them.

/// A caller of the admin API: the SHA-256 of its bearer token (the token
/// is never kept) and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerSpec {
    pub name: String,
    pub credential: Credential,
    pub scopes: Scopes,
    /// Every change this caller asks for becomes a proposal that others
    /// approve (`requires_approval`).
    pub requires_approval: bool,
}

/// What names a caller: a bearer token (by its SHA-256), or a client
/// certificate verified against `admin.tls.client_ca`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    Token([u8; 32]),
    Certificate(CertMatch),
}

/// How a client certificate names a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertMatch {
    /// One of its subject alternative names, by value: a SPIFFE ID or
    /// another URI, a DNS name, an e-mail address (`URI:`, `DNS:`,
    /// `email:` may prefix it to say which kind).
    San(String),
    /// Its subject: the same attributes (`CN=ci, O=Example`), in any
    /// order, spaces around `,` and `=` ignored.
    Subject(Vec<(String, String)>),
}

impl CertMatch {
    /// Whether a certificate with these names is this caller's.
    pub fn matches(&self, subject: Option<&str>, sans: &[String]) -> bool {
        match self {
            CertMatch::San(wanted) => sans.iter().any(|san| {
                san == wanted
                    || san
                        .split_once(':')
                        .is_some_and(|(_, value)| value == wanted)
            }),
            CertMatch::Subject(wanted) => subject.is_some_and(|s| subject_parts(s) == *wanted),
        }
    }
}

/// A subject's attributes, sorted: `CN=ci, O=Example` and `O=Example,CN=ci`
/// are one subject.
pub fn subject_parts(subject: &str) -> Vec<(String, String)> {
    let mut parts: Vec<(String, String)> = subject
        .split(',')
        .filter_map(|part| {
            let (key, value) = part.split_once('=')?;
            Some((key.trim().to_ascii_uppercase(), value.trim().to_owned()))
        })
        .collect();
    parts.sort();
    parts
}

/// A change that can be made to wait for approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approvable {
    /// Activate and reload through the API.
    Activate,
    Rollback,
    Upgrade,
}

impl Approvable {
    pub const ALL: [Approvable; 3] = [
        Approvable::Activate,
        Approvable::Rollback,
        Approvable::Upgrade,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Approvable::Activate => "activate",
            Approvable::Rollback => "rollback",
            Approvable::Upgrade => "upgrade",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// `[admin.approval]` (DESIGN §23): which changes wait for how many
/// approvals, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalPolicy {
    /// Changes that need approval whoever asks.
    pub required_for: Vec<Approvable>,
    /// Approvals needed, each by another caller than the proposer.
    pub approvers: u32,
    /// A proposal not approved within this long expires.
    pub expire: std::time::Duration,
}

impl ApprovalPolicy {
    /// Whether `operation` by `caller` waits for approval.
    pub fn required(&self, operation: Approvable, caller: Option<&CallerSpec>) -> bool {
        self.required_for.contains(&operation) || caller.is_some_and(|c| c.requires_approval)
    }
}

/// What a caller may do (DESIGN §23).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Status, history, views, the console.
    Read,
    /// Validate and preview.
    Validate,
    /// Activate, confirm, abort, roll back, reload.
    Activate,
    Approve,
    /// Reload certificates.
    Certs,
    /// Purge the cache.
    Cache,
    /// Drain and upgrade.
    Lifecycle,
    Fleet,
    /// Past a freeze window.
    Override,
    /// Every scope.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 10] = [
        Scope::Read,
        Scope::Validate,
        Scope::Activate,
        Scope::Approve,
        Scope::Certs,
        Scope::Cache,
        Scope::Lifecycle,
        Scope::Fleet,
        Scope::Override,
        Scope::Admin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Validate => "validate",
            Scope::Activate => "activate",
            Scope::Approve => "approve",
            Scope::Certs => "certs",
            Scope::Cache => "cache",
            Scope::Lifecycle => "lifecycle",
            Scope::Fleet => "fleet",
            Scope::Override => "override",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u16);

impl Scopes {
    /// Every scope (`admin`).
    pub fn all() -> Self {
        Self(Scope::Admin.bit())
    }

    pub fn with(self, scope: Scope) -> Self {
        Self(self.0 | scope.bit())
    }

    /// Whether these let a caller do what `scope` covers (`admin` covers
    /// everything).
    pub fn allow(self, scope: Scope) -> bool {
        self.0 & (scope.bit() | Scope::Admin.bit()) != 0
    }

    /// The scopes, by name, in `Scope::ALL`'s order (for tests: nothing
    /// tells a caller's scopes to anyone).
    #[cfg(test)]
    pub fn names(self) -> Vec<&'static str> {
        Scope::ALL
            .into_iter()
            .filter(|s| self.0 & s.bit() != 0)
            .map(Scope::name)
            .collect()
    }
}

/// Every change event kind (DESIGN §23), as `GET /admin/events` names
/// them and webhooks' `events` choose among them.
pub const EVENT_KINDS: &[&str] = &[
    "activation",
    "pending",
    "confirmed",
    "aborted",
    "auto_rolled_back",
    "rollback",
    "canary_step",
    "shadow_verdict",
    "freeze_entered",
    "freeze_left",
    "reload_certs",
    "certificate",
    "cache_purge",
    "drain",
    "upgrade",
    "fleet_ack",
    "fleet_nack",
    "proposal_made",
    "proposal_approved",
    "proposal_rejected",
    "proposal_expired",
];

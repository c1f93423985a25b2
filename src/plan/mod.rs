//! Planning: validation, the typed diff, and restart-required rejection.
//!
//! Takes candidate configuration text and (when there is one) the active
//! generation's validated [`Spec`]; returns a [`Plan`]: every error, every
//! change with its disposition, the changes that would need a restart, and
//! whether the candidate can be activated live. Pure: no bind, no write.

mod callers;
mod diff;
mod freeze;
pub mod impact;
mod memory;
mod ownership;
mod pattern;
mod pieces;
mod quota;
mod spec;
mod validate;
mod waf;

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod filters;
pub use callers::{
    subject_parts, Approvable, ApprovalPolicy, CallerSpec, CertMatch, Credential, Scope, Scopes,
    EVENT_KINDS,
};
pub use diff::{diff, Change, ChangeKind, Diff, Disposition, FieldChange, Summary};
pub use filters::{
    replace_prefix, AllowHeaders, Compress, Cors, Defaults, Encoding, Filters, HeaderOps,
    HostRewrite, IpRules, Level, MediaRange, Mirror, Origins, Part, Redirect, RedirectPath,
    Rewrite, RewriteRegex, RouteAuth, Template, TemplateError, ValueMatch, Var, TEMPLATE_VARIABLES,
};
pub use freeze::{frozen_at, FreezeWhen, FreezeWindow, Frozen};
pub use memory::HugePages;
pub use ownership::{needs_restart, ownership, Ownership};
pub use pattern::PathRegex;
pub use quota::*;
pub use spec::*;
pub use validate::{validate, validate_confined};
pub use waf::{
    RouteWafSpec, WafEvaluation, WafExclusion, WafLimitAction, WafRuleset, ANSWER_BODY_TYPES,
};

use crate::config::{ConfigText, Diagnostic};
use crate::ids::GenerationId;

/// A change planning refused because the running process cannot honour it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub domain: Cow<'static, str>,
    pub path: String,
    pub from: Value,
    pub to: Value,
    pub reason: Cow<'static, str>,
    pub action: Cow<'static, str>,
}

/// What activating a candidate would do, and whether it may.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub activatable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_version: Option<String>,
    pub active_generation: Option<GenerationId>,
    pub errors: Vec<Diagnostic>,
    pub rejected: Vec<Rejection>,
    pub diff: Diff,
    /// What the candidate would do to the sampled traffic (DESIGN §22):
    /// when it validated and the process samples its listeners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<impact::Impact>,
    /// What does not stop the candidate but deserves a look: a member
    /// name that does not resolve now (DNS may come later).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Diagnostic>,
    /// The members each new or changed upstream's discovery sources give
    /// now (DESIGN §20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<UpstreamMembers>,
    /// The validated candidate, when it validated.
    #[serde(skip)]
    pub spec: Option<Arc<Spec>>,
}

/// What an upstream's discovery sources give now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpstreamMembers {
    pub upstream: String,
    pub sources: Vec<SourceMembers>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceMembers {
    /// `dns:NAME:PORT`, `srv:NAME` or `file:PATH`.
    pub source: String,
    /// `ip:port` of each member.
    pub members: Vec<String>,
    /// Why it gives none, or what it lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether the running process follows this source already (its set
    /// is the live one), or it was resolved once for this plan.
    pub followed: bool,
}

impl Plan {
    /// A plan refused before validation could run (a shared document
    /// that does not compose), with its findings.
    pub fn refused(errors: Vec<Diagnostic>, active: Option<GenerationId>) -> Self {
        Plan {
            activatable: false,
            config_version: None,
            active_generation: active,
            errors,
            rejected: Vec::new(),
            diff: Diff::default(),
            impact: None,
            warnings: Vec::new(),
            members: Vec::new(),
            spec: None,
        }
    }

    /// Whether the candidate equals the active configuration (same
    /// `config_version`, files included): activating it changes nothing.
    pub fn is_unchanged(&self, active: Option<&Spec>) -> bool {
        match (active, &self.config_version) {
            (Some(active), Some(version)) => &active.config_version == version,
            _ => false,
        }
    }
}

/// Configurations with at least this many routes are planned on two
/// threads; below it, starting a thread costs more than it saves.
const PARALLEL_FROM_ROUTES: usize = 500;

/// Runs `side` on a second thread while `main` runs on this one when
/// `worth_it`, and both here otherwise (also when no thread can start).
fn in_parallel<A: Send, B>(
    worth_it: bool,
    side: impl Fn() -> A + Sync,
    main: impl FnOnce() -> B,
) -> (A, B) {
    if !worth_it {
        return (side(), main());
    }
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("cutover-plan".into())
            .spawn_scoped(scope, &side);
        let b = main();
        let a = match spawned {
            Ok(handle) => match handle.join() {
                Ok(a) => a,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            Err(_) => side(),
        };
        (a, b)
    })
}

const RESTART_ACTION: &str = "apply it with a drain-aware restart that starts from this configuration: `cutover ctl upgrade --config FILE` (POST /admin/lifecycle/upgrade with the configuration as the body); activation cannot";

/// As [`validate`], taking over from `active` what the text did not
/// change (its compiled rule sets, say): for views that read an older
/// configuration again.
pub fn validate_sharing(
    source: &ConfigText,
    active: &Spec,
) -> Result<Spec, Vec<crate::config::Diagnostic>> {
    validate::validate_against(source, None, Some(active))
}

/// Plans `candidate` against the active generation (`None` at start-up).
pub fn plan(candidate: &ConfigText, active: Option<(GenerationId, &Spec)>) -> Plan {
    // A candidate reads files only where the running process allows.
    let roots = active.map(|(_, spec)| spec.runtime.file_roots.as_slice());
    // What the candidate did not change is taken over, not made again.
    let spec = match validate::validate_against(candidate, roots, active.map(|(_, spec)| spec)) {
        Ok(spec) => spec,
        Err(errors) => {
            return Plan {
                activatable: false,
                config_version: None,
                active_generation: active.map(|(id, _)| id),
                errors,
                rejected: Vec::new(),
                diff: Diff::default(),
                impact: None,
                warnings: Vec::new(),
                members: Vec::new(),
                spec: None,
            }
        }
    };
    let diff = match active {
        Some((id, active)) => diff::diff(
            &active.file,
            &active.canonical,
            &format!("generation {id}"),
            &spec.file,
            &spec.canonical,
        ),
        None => Diff::default(),
    };
    let rejected: Vec<Rejection> = diff
        .changes
        .iter()
        .filter(|c| c.disposition == Disposition::RestartRequired)
        .flat_map(|c| {
            let restart_fields: Vec<&FieldChange> = match c.change {
                ChangeKind::Modified => c
                    .fields
                    .iter()
                    .filter(|f| needs_restart(&f.path, &f.from, &f.to))
                    .collect(),
                _ => c.fields.iter().collect(),
            };
            restart_fields.into_iter().map(move |f| Rejection {
                domain: c.domain.clone(),
                path: f.path.clone(),
                from: f.from.clone(),
                to: f.to.clone(),
                reason: "restart_required".into(),
                action: RESTART_ACTION.into(),
            })
        })
        .collect();
    Plan {
        activatable: rejected.is_empty(),
        config_version: Some(spec.config_version.clone()),
        active_generation: active.map(|(id, _)| id),
        errors: Vec::new(),
        rejected,
        diff,
        impact: None,
        warnings: Vec::new(),
        members: Vec::new(),
        spec: Some(Arc::new(spec)),
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_config::TestConfig;

    /// Each refusal's code and path (none when the text validates).
    fn codes_at(validated: Result<Spec, Vec<crate::config::Diagnostic>>) -> Vec<(String, String)> {
        validated
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|d| (d.code.to_string(), d.path.to_string()))
            .collect()
    }

    fn text(s: &str) -> ConfigText {
        ConfigText::inline(s.to_owned(), ".".into(), "<test>")
    }

    const L4: &str = r#"
[[listeners]]
name = "tls"
bind = "127.0.0.1:0"
protocol = "tcp"
idle_timeout = "10m"
default_upstream = "fallback"
client_hello_timeout = "2s"
sni_routes = [
  { hosts = ["db.example.com"], upstream = "exact" },
  { hosts = ["*.example.com"], upstream = "short" },
  { hosts = ["*.db.example.com"], upstream = "long" },
  { hosts = ["h2.example.com"], alpn = ["h2"], upstream = "h2" },
  { hosts = ["h2.example.com"], upstream = "exact" },
]

[[listeners]]
name = "plain"
bind = "127.0.0.1:0"
protocol = "tcp"
upstream = "fallback"
accept_proxy_protocol = true
trusted_proxies = ["10.0.0.0/8"]

[upstreams.exact]
backends = [{ addr = "127.0.0.1:1" }]
[upstreams.short]
backends = [{ addr = "127.0.0.1:1" }]
[upstreams.long]
backends = [{ addr = "127.0.0.1:1" }]
[upstreams.h2]
backends = [{ addr = "127.0.0.1:1" }]
[upstreams.fallback]
proxy_protocol = "v2"
backends = [{ addr = "127.0.0.1:1" }]
"#;

    #[test]
    fn sni_routes_take_the_exact_name_then_the_longest_wildcard_then_the_default() {
        let spec = validate(&text(L4)).unwrap_or_else(|e| panic!("{e:?}"));
        let tls = &spec.listeners[0];
        assert_eq!(
            tls.l4.idle_timeout,
            Some(std::time::Duration::from_secs(600))
        );
        let sni = tls.l4.sni.as_ref().expect("sni");
        assert_eq!(sni.client_hello_timeout, std::time::Duration::from_secs(2));
        let pick = |name: Option<&str>, alpn: &[&[u8]]| sni.upstream_for(name, alpn);
        assert_eq!(pick(Some("db.example.com"), &[]), Some("exact"));
        assert_eq!(pick(Some("eu.db.example.com"), &[]), Some("long"));
        assert_eq!(pick(Some("api.example.com"), &[]), Some("short"));
        assert_eq!(pick(Some("example.com"), &[]), Some("fallback"));
        assert_eq!(pick(None, &[]), Some("fallback"));
        assert_eq!(
            pick(Some("h2.example.com"), &[b"http/1.1", b"h2"]),
            Some("h2")
        );
        assert_eq!(pick(Some("h2.example.com"), &[b"http/1.1"]), Some("exact"));
        let plain = &spec.listeners[1];
        assert!(plain.accept_proxy_protocol);
        assert_eq!(
            plain.l4.idle_timeout,
            Some(crate::plan::spec::DEFAULT_TCP_IDLE_TIMEOUT)
        );
        assert!(plain.l4.sni.is_none());
        let fallback = spec
            .upstreams
            .iter()
            .find(|u| u.name == "fallback")
            .expect("fallback");
        assert_eq!(fallback.proxy_protocol, Some(ProxyProtocol::V2));
    }

    const UDP: &str = r#"
[[listeners]]
name = "dns_udp"
bind = "127.0.0.1:5353"
protocol = "udp"
upstream = "resolvers"
max_sessions = 500

[[listeners]]
name = "dns_tcp"
bind = "127.0.0.1:5353"
protocol = "tcp"
upstream = "resolvers"

[upstreams.resolvers]
backends = [{ addr = "127.0.0.1:53" }]
"#;

    #[test]
    fn a_udp_listener_has_sessions_and_may_share_its_port_with_a_tcp_one() {
        let spec = validate(&text(UDP)).unwrap_or_else(|e| panic!("{e:?}"));
        let udp = &spec.listeners[0];
        assert_eq!(udp.protocol, ListenerProtocol::Udp);
        assert_eq!(udp.l4.max_sessions, 500);
        assert_eq!(
            udp.l4.idle_timeout,
            Some(crate::plan::spec::DEFAULT_UDP_IDLE_TIMEOUT)
        );
        let cases = [
            (UDP.replace("max_sessions = 500", "max_connections = 5"), "unexpected_option"),
            (UDP.replace("max_sessions = 500", "idle_timeout = \"off\""), "invalid_value"),
            (UDP.replace("max_sessions = 500", "accept_proxy_protocol = true"), "unexpected_option"),
            (UDP.replace("protocol = \"tcp\"", "protocol = \"udp\""), "duplicate_bind"),
            (UDP.replace("backends = [", "proxy_protocol = \"v2\"\nbackends = ["), "unsupported_option"),
            (UDP.replace("backends = [", "health = { tcp = true }\nbackends = ["), "unsupported_option"),
            (UDP.replace("upstream = \"resolvers\"\nmax_sessions", "max_sessions"), "missing_upstream"),
            (format!("{UDP}\n[[routes]]\nname = \"r\"\nlisteners = [\"dns_udp\"]\nrespond = {{ body = \"x\" }}\n"), "tcp_listener_route"),
            (UDP.replace("protocol = \"tcp\"\nupstream = \"resolvers\"", "protocol = \"tcp\"\nupstream = \"resolvers\"\nmax_sessions = 5"), "unexpected_option"),
        ];
        for (candidate, code) in cases {
            let errors = validate(&text(&candidate)).expect_err(code);
            assert!(errors.iter().any(|d| d.code == code), "{code}: {errors:?}");
        }
    }

    #[test]
    fn l4_options_are_refused_where_they_cannot_be_honoured() {
        let cases = [
            // SNI routes and a fixed upstream at once.
            (L4.replace("default_upstream = \"fallback\"", "upstream = \"fallback\""), "conflicting_options"),
            // The same name twice with the same ALPN.
            (L4.replace("\"*.example.com\"], upstream = \"short\"", "\"db.example.com\"], upstream = \"short\""), "ambiguous_sni_route"),
            (L4.replace("upstream = \"long\"", "upstream = \"nope\""), "unknown_upstream"),
            (L4.replace("\"*.db.example.com\"", "\"db.*.com\""), "invalid_host"),
            // PROXY from anyone.
            (L4.replace("trusted_proxies = [\"10.0.0.0/8\"]", ""), "missing_trusted_proxies"),
            (L4.replace("proxy_protocol = \"v2\"", "proxy_protocol = \"v3\""), "invalid_value"),
            // hyper's client pools TLS and HTTP/2 connections across clients.
            (L4.replace("proxy_protocol = \"v2\"", "proxy_protocol = \"v2\"\nprotocol = \"h2c\""), "unsupported_option"),
            // SNI options on an HTTP listener.
            (format!("{L4}\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nclient_hello_timeout = \"1s\"\n"), "unexpected_option"),
        ];
        for (candidate, code) in cases {
            let errors = validate(&text(&candidate)).expect_err(code);
            assert!(errors.iter().any(|d| d.code == code), "{code}: {errors:?}");
        }
    }

    /// `routes` routes, each on its own upstream-less direct response
    /// except `bad`, which names an upstream that does not exist.
    fn large(routes: usize, bad: Option<usize>, timeout: &str) -> ConfigText {
        (0..routes)
            .fold(TestConfig::new().listener("web", ""), |config, i| {
                let action = if Some(i) == bad {
                    "upstream = \"missing\""
                } else {
                    "respond = { body = \"ok\" }"
                };
                config.route(
                    &format!("r{i}"),
                    &format!("listeners = [\"web\"]\npath_prefix = \"/r{i}/\"\ntimeout = \"{timeout}\"\n{action}"),
                )
            })
            .source()
    }

    #[test]
    fn thousands_of_identical_routes_give_a_bounded_answer_at_once() {
        let config = (0..3_000).fold(TestConfig::new().listener("web", ""), |config, i| {
            config.route(
                &format!("r{i}"),
                "listeners = [\"web\"]\npath_prefix = \"/same/\"\nrespond = { body = \"ok\" }",
            )
        });
        let started = std::time::Instant::now();
        let errors = validate(&config.source()).err().unwrap_or_default();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(errors.len(), validate::MAX_DIAGNOSTICS_PER_CODE + 1);
        assert!(errors[..validate::MAX_DIAGNOSTICS_PER_CODE]
            .iter()
            .all(|d| d.code == "ambiguous_route" && d.message.contains("'r0'")));
        let last = errors.last().expect("the count of the rest");
        assert_eq!(last.code, "ambiguous_route");
        assert!(last.message.contains("2899 more"), "{}", last.message);
    }

    #[test]
    fn http3_upstreams_take_tls_settings_and_refuse_what_quic_cannot_honour() {
        let base = |protocol: &str, extra: &str| {
            TestConfig::new()
                .listener("web", "")
                .route("r", "listeners = [\"web\"]\nupstream = \"app\"")
                .upstream(
                    "app",
                    &["127.0.0.1:8443"],
                    &format!("protocol = \"{protocol}\"\ntls = {{ server_name = \"backend.internal\" }}\n{extra}"),
                )
                .build()
        };
        for protocol in ["h3", "auto"] {
            let spec = validate(&text(&base(protocol, "health = { path = \"/\" }\n")))
                .unwrap_or_else(|e| panic!("{protocol}: {e:?}"));
            let app = &spec.upstreams[0];
            assert!(app.protocol.is_tls() && !app.protocol.is_http2());
            assert_eq!(
                app.tls.as_ref().and_then(|t| t.server_name.as_deref()),
                Some("backend.internal")
            );
        }
        let codes = |protocol: &str, extra: &str| -> Vec<(String, String)> {
            validate(&text(&base(protocol, extra)))
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(|d| (d.code.to_string(), d.message))
                .collect()
        };
        // A TCP connect says nothing of QUIC; `auto` is checked over TCP.
        let refused = codes("h3", "health = { tcp = true }\n");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, "unsupported_option");
        assert!(refused[0].1.contains("over HTTP/3"), "{}", refused[0].1);
        assert!(codes("auto", "health = { tcp = true }\n").is_empty());
        let refused = codes("h3", "proxy_protocol = \"v2\"\n");
        assert_eq!(refused[0].0, "unsupported_option");
        let refused = codes("h4", "");
        assert!(
            refused
                .iter()
                .any(|(code, m)| code == "invalid_protocol" && m.contains("h3 or auto")),
            "{refused:?}"
        );
    }

    #[test]
    fn an_unknown_key_hides_nothing_else_about_its_entity() {
        let text = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:0"
colour = "blue"

[[routes]]
name = "api"
bogus = 1
listeners = ["nope"]
upstream = "missing"
also_bogus = true

[upstreams.app]
backends = [{ addr = "127.0.0.1:1", wieght = 2 }]
"#;
        let errors = validate(&ConfigText::inline(text.into(), ".".into(), "<t>"))
            .err()
            .unwrap_or_default();
        let found: Vec<_> = errors.iter().map(|d| (d.code.as_str(), d.line)).collect();
        assert_eq!(
            found,
            vec![
                ("unknown_key", Some(5)),
                ("unknown_key", Some(9)),
                ("unknown_listener", Some(10)),
                ("unknown_upstream", Some(11)),
                ("unknown_key", Some(12)),
                ("unknown_key", Some(15)),
            ],
            "{errors:#?}"
        );
        // Any other decoding problem still stops at decoding, as the rest
        // of the entity cannot be trusted.
        let errors = validate(&ConfigText::inline(
            "[[routes]]\nname = 5\nbogus = 1\nlisteners = [\"nope\"]\n".into(),
            ".".into(),
            "<t>",
        ))
        .err()
        .unwrap_or_default();
        assert!(
            errors.iter().all(|d| d.code != "unknown_listener"),
            "{errors:#?}"
        );
    }

    #[test]
    fn file_roots_of_the_starting_configuration_are_honoured_and_not_a_candidates() {
        let config_dir = tempfile::tempdir().expect("dir");
        let secrets = tempfile::tempdir().expect("dir");
        let token = secrets.path().join("admin.token");
        std::fs::write(&token, "0123456789abcdef-token\n").expect("write");
        let text = format!(
            "[runtime]\nfile_roots = [\"{}\"]\n\n[admin]\nbind = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n",
            secrets.path().display(),
            token.display()
        );
        let source = ConfigText::inline(text, config_dir.path().to_path_buf(), "<t>");
        // The operator's own file: its roots count.
        let spec = validate(&source).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(spec.runtime.file_roots, vec![secrets.path().to_path_buf()]);
        // The same text as a candidate to a process started without them.
        let started = validate(&ConfigText::inline(
            "[admin]\nbind = \"127.0.0.1:0\"\n".into(),
            config_dir.path().to_path_buf(),
            "<t>",
        ))
        .unwrap_or_else(|e| panic!("{e:?}"));
        let plan = plan(&source, Some((GenerationId::FIRST, &started)));
        assert!(
            plan.errors.iter().any(|d| d.code == "file_outside_roots"),
            "{:?}",
            plan.errors
        );
        // Relative roots mean nothing safe: refused.
        let relative = ConfigText::inline(
            "[runtime]\nfile_roots = [\"certs\"]\n".into(),
            config_dir.path().to_path_buf(),
            "<t>",
        );
        assert!(validate(&relative).is_err());
    }

    #[test]
    fn admin_callers_are_checked_and_kept_hashed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let token = dir.path().join("ci.token");
        std::fs::write(&token, "ci-token-0123456789abcdef\n").expect("write");
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(dir.path().join("admin.token"), "0123456789abcdef-token\n").expect("write");
        // Some token's SHA-256 (what `printf %s TOKEN | sha256sum` prints).
        let dashboard = "b5b0e5de1c0b1b9f2b13a7b1e6d9c1a0f6a5e3c3d2b1a0f9e8d7c6b5a4938271";
        let text = format!(
            r#"[admin]
bind = "0.0.0.0:9190"
token_file = "admin.token"

[[admin.callers]]
name = "ci"
token_file = "ci.token"
scopes = ["read", "validate"]

[[admin.callers]]
name = "dashboard"
token_sha256 = "{dashboard}"
scopes = ["read"]
"#
        );
        let at = |text: &str| ConfigText::inline(text.to_owned(), dir.path().to_path_buf(), "<t>");
        let spec = validate(&at(&text)).unwrap_or_else(|e| panic!("{e:?}"));
        let names: Vec<&str> = spec.admin.callers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["admin", "ci", "dashboard"]);
        let ci = &spec.admin.callers[1];
        assert_eq!(ci.scopes.names(), ["read", "validate"]);
        assert!(ci.scopes.allow(Scope::Validate) && !ci.scopes.allow(Scope::Activate));
        assert!(
            spec.admin.callers[0].scopes.allow(Scope::Lifecycle),
            "admin: every scope"
        );
        use sha2::Digest as _;
        let hashed: [u8; 32] = sha2::Sha256::digest(b"ci-token-0123456789abcdef").into();
        assert_eq!(
            ci.credential,
            Credential::Token(hashed),
            "the file's token, trimmed, hashed"
        );
        assert!(
            !format!("{:?}", spec.admin).contains("ci-token"),
            "no token kept"
        );

        // Every problem at once, each at its place.
        let errors = |text: &str| -> Vec<(String, String)> { codes_at(validate(&at(text))) };
        let bad = format!(
            r#"[admin]
token_file = "admin.token"

[[admin.callers]]
name = "admin"
token_sha256 = "{dashboard}"
scopes = ["read"]

[[admin.callers]]
name = "x"
token_sha256 = "abc"
scopes = ["read", "deploy", "approve"]

[[admin.callers]]
name = "y"
token_sha256 = "{dashboard}"
token_file = "ci.token"
scopes = ["read"]

[[admin.callers]]
name = "z"
scopes = []
"#
        );
        let found = errors(&bad);
        for expected in [
            ("duplicate_caller", "admin.callers[0].name"),
            ("invalid_value", "admin.callers[1].token_sha256"),
            ("unknown_scope", "admin.callers[1].scopes[1]"),
            ("conflicting_options", "admin.callers[2].token_sha256"),
            ("missing_key", "admin.callers[3].scopes"),
            ("missing_key", "admin.callers[3].token_sha256"),
        ] {
            assert!(
                found
                    .iter()
                    .any(|(c, p)| (c.as_str(), p.as_str()) == expected),
                "{expected:?} not in {found:#?}"
            );
        }
        // A token file others may read is refused, as ssh refuses a key.
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let found = errors(&text);
        assert_eq!(
            found,
            [(
                "exposed_secret".to_string(),
                "admin.callers[0].token_file".to_string()
            )]
        );
        // A caller is a protection: a public bind with callers only is fine.
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let only_callers = text.replace("token_file = \"admin.token\"\n", "");
        assert!(validate(&at(&only_callers)).is_ok());
    }

    #[test]
    fn freeze_windows_are_checked_and_change_live() {
        let dir = tempfile::tempdir().expect("dir");
        let at = |text: &str| ConfigText::inline(text.to_owned(), dir.path().to_path_buf(), "<t>");
        let good = r#"[[admin.freeze]]
from = 2026-12-20T00:00:00Z
to = "2027-01-04T00:00:00+01:00"
reason = "holidays"

[[admin.freeze]]
cron = "0 18 * * FRI"
duration = "62h"
timezone = "Europe/Berlin"
reason = "weekend"
"#;
        let spec = validate(&at(good)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(spec.admin.freeze.len(), 2);
        let christmas = std::time::SystemTime::from(
            chrono::DateTime::parse_from_rfc3339("2026-12-25T12:00:00Z").expect("time"),
        );
        let frozen = frozen_at(&spec.admin.freeze, christmas).expect("frozen at Christmas");
        assert_eq!(frozen.reason, "holidays");
        assert_eq!(frozen.until, "2027-01-03T23:00:00Z");

        // Adding, changing or removing a window is a live change.
        let base = validate(&at("")).expect("empty is valid");
        let planned = plan(&at(good), Some((GenerationId(1), &base)));
        assert!(planned.activatable, "{planned:#?}");
        assert!(planned.rejected.is_empty(), "{:#?}", planned.rejected);

        let bad = r#"[[admin.freeze]]
from = "2026-12-20T00:00:00Z"
to = "2026-12-19T00:00:00Z"
reason = "backwards"

[[admin.freeze]]
from = "tomorrow"
to = "2026-12-19T00:00:00Z"
reason = "unreadable"

[[admin.freeze]]
cron = "0 25 * * *"
duration = "1h"
timezone = "Mars/Olympus"
reason = "bad pattern and zone"

[[admin.freeze]]
cron = "0 18 * * FRI"
reason = "no duration"

[[admin.freeze]]
from = "2026-12-20T00:00:00Z"
to = "2026-12-21T00:00:00Z"
cron = "0 18 * * FRI"
duration = "1h"
reason = "both"

[[admin.freeze]]
from = "2026-12-20T00:00:00Z"
reason = ""
"#;
        let found: Vec<(String, String)> = codes_at(validate(&at(bad)));
        for expected in [
            ("invalid_value", "admin.freeze[0].to"),
            ("invalid_value", "admin.freeze[1].from"),
            ("invalid_value", "admin.freeze[2].cron"),
            ("invalid_value", "admin.freeze[2].timezone"),
            ("missing_key", "admin.freeze[3].duration"),
            ("conflicting_options", "admin.freeze[4].cron"),
            ("missing_key", "admin.freeze[5].reason"),
            ("missing_key", "admin.freeze[5].to"),
        ] {
            assert!(
                found
                    .iter()
                    .any(|(c, p)| (c.as_str(), p.as_str()) == expected),
                "{expected:?} not in {found:#?}"
            );
        }
        // Every error has its line.
        let lines: Vec<Option<usize>> = validate(&at(bad))
            .err()
            .unwrap_or_default()
            .iter()
            .map(|d| d.line)
            .collect();
        assert!(lines.iter().all(Option::is_some), "{lines:?}");
    }

    #[test]
    fn client_certificate_callers_need_admin_tls_with_a_client_ca() {
        let dir = tempfile::tempdir().expect("dir");
        let at = |text: &str| ConfigText::inline(text.to_owned(), dir.path().to_path_buf(), "<t>");
        let callers = r#"
[[admin.callers]]
name = "deployer"
client_cert = { san = "spiffe://example.org/ci/deployer" }
scopes = ["read", "activate"]

[[admin.callers]]
name = "auditor"
client_cert = { subject = "CN=auditor, O=Example" }
scopes = ["read"]

[[admin.callers]]
name = "both"
client_cert = { san = "x", subject = "CN=x" }
scopes = ["read"]

[[admin.callers]]
name = "two"
client_cert = { san = "y" }
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000001"
scopes = ["read"]
"#;
        let found: Vec<(String, String)> = codes_at(validate(&at(callers)));
        for expected in [
            ("missing_key", "admin.callers[0].client_cert"),
            ("missing_key", "admin.callers[1].client_cert"),
            ("invalid_value", "admin.callers[2].client_cert"),
            ("conflicting_options", "admin.callers[3].token_sha256"),
        ] {
            assert!(
                found
                    .iter()
                    .any(|(c, p)| (c.as_str(), p.as_str()) == expected),
                "{expected:?} not in {found:#?}"
            );
        }
        // With a TLS listener that has a client CA: the matchers.
        let with_tls = format!(
            "[admin]\ntls = {{ cert = \"missing.pem\", key = \"missing.key\", client_ca = \"missing-ca.pem\" }}\n{}",
            callers.split("[[admin.callers]]\nname = \"both\"").next().unwrap_or_default()
        );
        let found: Vec<(String, String)> = codes_at(validate(&at(&with_tls)));
        assert!(
            found.iter().all(|(_, p)| p.starts_with("admin.tls")),
            "only the missing files: {found:#?}"
        );
        assert!(
            found
                .iter()
                .any(|(c, p)| c == "unreadable_file" && p == "admin.tls.cert"),
            "{found:#?}"
        );
        let deployer = CertMatch::San("spiffe://example.org/ci/deployer".into());
        let sans = ["URI:spiffe://example.org/ci/deployer".to_owned()];
        assert!(deployer.matches(None, &sans));
        assert!(!deployer.matches(None, &["URI:spiffe://example.org/ci/other".to_owned()]));
        let auditor = CertMatch::Subject(subject_parts("CN=auditor, O=Example"));
        assert!(auditor.matches(Some("O=Example,CN=auditor"), &[]));
        assert!(!auditor.matches(Some("CN=auditor, O=Other"), &[]));
    }

    #[test]
    fn approvals_are_checked_against_the_callers_that_could_give_them() {
        let dir = tempfile::tempdir().expect("dir");
        let at = |text: &str| ConfigText::inline(text.to_owned(), dir.path().to_path_buf(), "<t>");
        let callers = r#"
[[admin.callers]]
name = "ci"
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000001"
scopes = ["read", "activate"]
requires_approval = true

[[admin.callers]]
name = "alice"
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000002"
scopes = ["approve"]
"#;
        let good = format!(
            "[admin.approval]\nrequired_for = [\"rollback\", \"upgrade\"]\napprovers = 1\nexpire = \"30m\"\n{callers}"
        );
        let spec = validate(&at(&good)).unwrap_or_else(|e| panic!("{e:?}"));
        let policy = spec.admin.approval.expect("a policy");
        assert_eq!(
            policy.required_for,
            [Approvable::Rollback, Approvable::Upgrade]
        );
        assert_eq!(policy.expire, std::time::Duration::from_secs(1800));
        let ci = &spec.admin.callers[0];
        assert!(
            policy.required(Approvable::Activate, Some(ci)),
            "ci's every change waits"
        );
        assert!(!policy.required(Approvable::Activate, Some(&spec.admin.callers[1])));
        // A caller's requires_approval alone makes a policy of defaults.
        let spec = validate(&at(callers)).unwrap_or_else(|e| panic!("{e:?}"));
        let policy = spec.admin.approval.expect("defaults");
        assert_eq!((policy.approvers, policy.required_for.len()), (1, 0));

        let bad = format!(
            "[admin.approval]\nrequired_for = [\"activate\", \"deploy\"]\napprovers = 2\nexpire = \"10s\"\n{callers}"
        );
        let found: Vec<(String, String)> = codes_at(validate(&at(&bad)));
        for expected in [
            ("invalid_value", "admin.approval.required_for[1]"),
            ("invalid_value", "admin.approval.expire"),
            // Two approvals, one caller that can give them.
            ("invalid_value", "admin.approval"),
        ] {
            assert!(
                found
                    .iter()
                    .any(|(c, p)| (c.as_str(), p.as_str()) == expected),
                "{expected:?} not in {found:#?}"
            );
        }
    }

    #[test]
    fn webhooks_are_checked_and_their_secrets_kept_only_as_keys() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let secret = dir.path().join("hook.secret");
        std::fs::write(&secret, "webhook-secret-0123456789\n").expect("write");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(dir.path().join("short.secret"), "short").expect("write");
        std::fs::set_permissions(
            dir.path().join("short.secret"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        let at = |text: &str| ConfigText::inline(text.to_owned(), dir.path().to_path_buf(), "<t>");
        let good = r#"[[admin.webhooks]]
name = "chatops"
url = "https://hooks.example.com/cutover"
events = ["activation", "auto_rolled_back"]
secret_file = "hook.secret"
timeout = "2s"
"#;
        let spec = validate(&at(good)).unwrap_or_else(|e| panic!("{e:?}"));
        let hook = &spec.admin.webhooks[0];
        assert_eq!(hook.events, ["activation", "auto_rolled_back"]);
        assert_eq!(hook.timeout, std::time::Duration::from_secs(2));
        assert!(
            !format!("{:?}", spec.admin).contains("webhook-secret"),
            "no secret in the spec's Debug"
        );
        let bad = r#"[[admin.webhooks]]
name = "chatops"
url = "ftp://hooks.example.com/"
events = ["activation", "deployed"]
secret_file = "short.secret"

[[admin.webhooks]]
name = "chatops"
url = "http://hooks.example.com/"
secret_file = "hook.secret"
timeout = "5m"

[[admin.webhooks]]
name = "open"
url = "http://hooks.example.com/"
secret_file = "missing.secret"
events = []
"#;
        let found: Vec<(String, String)> = codes_at(validate(&at(bad)));
        for expected in [
            ("invalid_value", "admin.webhooks[0].url"),
            ("invalid_value", "admin.webhooks[0].events[1]"),
            ("weak_token", "admin.webhooks[0].secret_file"),
            ("invalid_value", "admin.webhooks[1].timeout"),
            ("unreadable_file", "admin.webhooks[2].secret_file"),
            ("invalid_value", "admin.webhooks[2].events"),
        ] {
            assert!(
                found
                    .iter()
                    .any(|(c, p)| (c.as_str(), p.as_str()) == expected),
                "{expected:?} not in {found:#?}"
            );
        }
        // Readable by others: refused as a token file is.
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let found: Vec<String> = validate(&at(good))
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.code.to_string())
            .collect();
        assert_eq!(found, ["exposed_secret"]);
        // Two of one name: the second is refused at its name.
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let twice = format!(
            "{good}\n{}",
            good.replace("events = [\"activation\", \"auto_rolled_back\"]\n", "")
        );
        let found: Vec<(String, String)> = codes_at(validate(&at(&twice)));
        assert_eq!(
            found,
            [(
                "duplicate_name".to_string(),
                "admin.webhooks[1].name".to_string()
            )]
        );
    }

    #[test]
    fn the_version_is_the_same_however_the_folder_is_spelled() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("admin.token"), "0123456789abcdef-token\n").expect("write");
        let text = "[admin]\nbind = \"127.0.0.1:0\"\ntoken_file = \"admin.token\"\n";
        let version = |base: std::path::PathBuf| {
            validate(&ConfigText::inline(text.to_owned(), base, "<test>"))
                .unwrap_or_else(|e| panic!("{e:?}"))
                .config_version
        };
        let plain = version(dir.path().to_path_buf());
        assert_eq!(plain, version(dir.path().join(".")));
        assert_eq!(
            plain,
            version(
                dir.path()
                    .join("..")
                    .join(dir.path().file_name().expect("name"))
            )
        );
        // What the file holds still counts.
        std::fs::write(dir.path().join("admin.token"), "another-token-0123456789\n")
            .expect("write");
        assert_ne!(plain, version(dir.path().to_path_buf()));
    }

    #[test]
    fn large_configurations_plan_on_two_threads_with_the_same_results() {
        let routes = PARALLEL_FROM_ROUTES + 100;
        let spec = validate(&large(routes, None, "30s")).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(spec.routes.len(), routes);
        assert_eq!(spec.canonical.text(), crate::config::canonical(&spec.file));
        let again = validate(&large(routes, None, "30s")).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(spec.config_version, again.config_version);

        // Errors found while the canonical text is written elsewhere are
        // all reported, with their positions.
        let errors = validate(&large(routes, Some(routes - 3), "30s"))
            .err()
            .unwrap_or_default();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].code, "unknown_upstream");
        assert!(errors[0].line.is_some_and(|l| l > 3000), "{errors:?}");

        let plan = plan(
            &large(routes, None, "5s"),
            Some((GenerationId::FIRST, &spec)),
        );
        assert!(plan.activatable);
        assert_eq!(plan.diff.summary.modified, routes);
        assert!(plan
            .diff
            .text
            .starts_with("--- generation 1\n+++ candidate\n@@ "));
    }

    #[test]
    fn work_split_over_two_threads_returns_both_results() {
        for worth_it in [false, true] {
            let (a, b) = in_parallel(worth_it, || 6 * 7, || "main");
            assert_eq!((a, b), (42, "main"));
        }
    }
}

//! Every key `docs/config.md` documents, walked: set in a place it does
//! not belong, it is refused at its own line; set where it belongs, it
//! changes the validated configuration (a key that is parsed and then
//! ignored would leave it as it was). The table below names each
//! documented key once; the test fails when the documentation and the
//! table disagree, so a new key cannot be documented without being walked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cutover::config::ConfigText;
use cutover::plan::Spec;

use crate::harness::workspace;

/// Where a key may be written: a section of the baseline configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Place {
    Admin,
    Metrics,
    Log,
    Tracing,
    Runtime,
    Discovery,
    Fleet,
    Http,
    Https,
    Tcp,
    Udp,
    Route,
    Retry,
    Upstream,
    Health,
    Outlier,
    /// An https listener's `acme` certificate entry (with a route for it).
    Acme,
    Limits,
    /// A `[waf.rulesets.NAME]` rule set.
    Waf,
}
use Place::*;

const PLACES: [Place; 19] = [
    Admin, Metrics, Log, Tracing, Runtime, Discovery, Fleet, Http, Https, Tcp, Udp, Route, Retry,
    Upstream, Health, Outlier, Acme, Limits, Waf,
];
const LISTENERS: &[Place] = &[Http, Https, Tcp, Udp];
const HTTP: &[Place] = &[Http, Https];

impl Place {
    /// The `docs/config.md` section that documents this place's keys.
    fn section(self) -> &'static str {
        match self {
            Admin => "admin",
            Metrics => "metrics",
            Log => "log",
            Tracing => "tracing",
            Runtime => "runtime",
            Discovery => "discovery",
            Fleet => "fleet",
            Http | Https | Tcp | Udp => "listeners",
            Route => "routes",
            Retry => "retry",
            Upstream => "upstreams",
            Health => "health",
            Outlier => "outlier",
            Acme => "acme",
            Limits => "limits",
            Waf => "waf",
        }
    }

    /// The section's header and the lines the baseline gives it.
    fn baseline(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Admin => ("[admin]", &["bind = \"127.0.0.1:0\""]),
            Metrics => ("[metrics]", &["bind = \"127.0.0.1:0\""]),
            Log => ("[log]", &["level = \"warn\""]),
            Tracing => ("[tracing]", &[]),
            Runtime => ("[runtime]", &[]),
            Discovery => ("[discovery]", &[]),
            Fleet => (
                "[fleet]",
                &["endpoints = [\"127.0.0.1:2379\"]", "prefix = \"/t\""],
            ),
            Http => (
                "[[listeners]]",
                &[
                    "name = \"web\"",
                    "bind = \"127.0.0.1:0\"",
                    "protocol = \"http\"",
                ],
            ),
            Https => (
                "[[listeners]]",
                &[
                    "name = \"secure\"",
                    "bind = \"127.0.0.1:0\"",
                    "protocol = \"https\"",
                    "tls.certificates = [{ cert = \"site.pem\", key = \"site.key\" }]",
                ],
            ),
            Tcp => (
                "[[listeners]]",
                &[
                    "name = \"relay\"",
                    "bind = \"127.0.0.1:0\"",
                    "protocol = \"tcp\"",
                    "upstream = \"relayed\"",
                ],
            ),
            Udp => (
                "[[listeners]]",
                &[
                    "name = \"dgram\"",
                    "bind = \"127.0.0.1:0\"",
                    "protocol = \"udp\"",
                    "upstream = \"datagrams\"",
                ],
            ),
            Route => (
                "[[routes]]",
                &[
                    "name = \"r\"",
                    "listeners = [\"web\", \"secure\"]",
                    "upstream = \"app\"",
                ],
            ),
            Retry => ("[routes.retry]", &[]),
            Upstream => (
                "[upstreams.app]",
                &["backends = [{ addr = \"127.0.0.1:9\" }]"],
            ),
            Health => ("[upstreams.app.health]", &["path = \"/healthz\""]),
            Outlier => ("[upstreams.app.outlier]", &[]),
            Limits => ("[limits]", &[]),
            Waf => ("[waf.rulesets.main]", &[WAF_FILES]),
            Acme => (
                "[[routes]]",
                &[
                    "name = \"auto-site\"",
                    "listeners = [\"auto\"]",
                    "respond = { body = \"ok\" }",
                    "[[listeners]]",
                    "name = \"auto\"",
                    "bind = \"127.0.0.1:0\"",
                    "protocol = \"https\"",
                    "[[listeners.tls.certificates]]",
                    "[listeners.tls.certificates.acme]",
                    "domains = [\"auto.example\"]",
                    "directory = \"https://acme.example/dir\"",
                ],
            ),
        }
    }
}

/// One documented key: where it belongs (`applies`), and a change that
/// must show: `before` and `after` are the lines `checked` gets in the
/// reference and in the changed configuration, which goes without the
/// baseline lines `replaces` names (both go without those of `without`).
/// The wrong-place probe writes `after`'s line for `key`.
struct Row {
    section: &'static str,
    key: &'static str,
    applies: &'static [Place],
    checked: Place,
    before: &'static [&'static str],
    after: &'static [&'static str],
    replaces: &'static [&'static str],
    without: &'static [&'static str],
    /// Lines both configurations get in other places.
    also: &'static [(Place, &'static str)],
}

const fn row(
    section: &'static str,
    key: &'static str,
    place: Place,
    after: &'static [&'static str],
) -> Row {
    Row {
        section,
        key,
        applies: &[],
        checked: place,
        before: &[],
        after,
        replaces: &[],
        without: &[],
        also: &[],
    }
}

impl Row {
    const fn on(mut self, applies: &'static [Place]) -> Row {
        self.applies = applies;
        self
    }
    const fn before(mut self, before: &'static [&'static str]) -> Row {
        self.before = before;
        self
    }
    /// Baseline lines the changed configuration goes without.
    const fn replaces(mut self, lines: &'static [&'static str]) -> Row {
        self.replaces = lines;
        self
    }
    /// Baseline lines both configurations go without.
    const fn without(mut self, lines: &'static [&'static str]) -> Row {
        self.without = lines;
        self
    }
    /// Lines both configurations get in other places.
    const fn also(mut self, lines: &'static [(Place, &'static str)]) -> Row {
        self.also = lines;
        self
    }
    fn applies(&self) -> Vec<Place> {
        if self.applies.is_empty() {
            vec![self.checked]
        } else {
            self.applies.to_vec()
        }
    }
    /// The line that sets `key` in `after`.
    fn line(&self) -> &'static str {
        let dotted = format!("{} =", self.key);
        self.after
            .iter()
            .find(|l| l.starts_with(&dotted))
            .unwrap_or_else(|| panic!("{}.{}: no line sets it in `after`", self.section, self.key))
    }
}

/// ACME keeps its account and certificates in `state_dir`.
const STATE_DIR: &[(Place, &str)] = &[(Runtime, "state_dir = \"state\"")];
const SNI: &str = "sni_routes = [{ hosts = [\"db.example.com\"], upstream = \"relayed\" }]";
const REDIS: &str = "store.redis.url = \"redis://127.0.0.1:6379/0\"";
const TLS_REDIS: &str = "store.redis.url = \"rediss://redis.internal:6380/0\"";
const REDIS_OTHER: &str = "store.redis.url = \"redis://127.0.0.1:6380/0\"";
const TRUSTED: &str = "trusted_proxies = [\"127.0.0.1\"]";
const WAF_FILES: &str = "files = [\"waf.conf\"]";

fn rows() -> Vec<Row> {
    vec![
        row("admin", "bind", Admin, &["bind = \"127.0.0.1:19190\""])
            .replaces(&["bind = \"127.0.0.1:0\""]),
        row(
            "admin",
            "token_file",
            Admin,
            &["token_file = \"admin.token\""],
        ),
        row(
            "admin",
            "require_expected_generation",
            Admin,
            &["require_expected_generation = true"],
        ),
        row("admin", "max_body", Admin, &["max_body = \"8MiB\""]),
        row(
            "admin",
            "callers",
            Admin,
            &["callers = [{ name = \"ci\", token_sha256 = \"0000000000000000000000000000000000000000000000000000000000000001\", scopes = [\"read\", \"validate\"] }]"],
        ),
        row("admin", "audit_log", Admin, &["audit_log = \"audit.log\""]),
        row(
            "admin",
            "tls",
            Admin,
            &["tls = { cert = \"site.pem\", key = \"site.key\", client_ca = \"ca.pem\" }"],
        ),
        row(
            "admin",
            "approval",
            Admin,
            &[
                "approval = { required_for = [\"rollback\"], approvers = 1, expire = \"2h\" }",
                "callers = [{ name = \"alice\", token_sha256 = \"0000000000000000000000000000000000000000000000000000000000000002\", scopes = [\"approve\"] }]",
            ],
        ),
        row(
            "admin",
            "webhooks",
            Admin,
            &["webhooks = [{ name = \"chatops\", url = \"https://hooks.example/cutover\", secret_file = \"hook.secret\" }]"],
        ),
        row(
            "admin",
            "freeze",
            Admin,
            &["freeze = [{ cron = \"0 18 * * FRI\", duration = \"62h\", timezone = \"Europe/Berlin\", reason = \"weekend\" }]"],
        ),
        row("metrics", "bind", Metrics, &["bind = \"127.0.0.1:19191\""])
            .replaces(&["bind = \"127.0.0.1:0\""]),
        row("metrics", "max_series", Metrics, &["max_series = 100"]),
        row("log", "level", Log, &["level = \"debug\""]).replaces(&["level = \"warn\""]),
        row("log", "format", Log, &["format = \"json\""]),
        row("log", "file", Log, &["file = \"gateway.log\""]),
        row("log", "access", Log, &["access = true"]),
        row("log", "access_file", Log, &["access_file = \"access.log\""]),
        row(
            "tracing",
            "otlp_endpoint",
            Tracing,
            &["otlp_endpoint = \"http://127.0.0.1:4318\""],
        ),
        row(
            "tracing",
            "service_name",
            Tracing,
            &["service_name = \"edge\""],
        ),
        row("tracing", "sample_ratio", Tracing, &["sample_ratio = 0.5"]),
        row("runtime", "state_dir", Runtime, &["state_dir = \"state\""]),
        row("runtime", "history_limit", Runtime, &["history_limit = 4"]),
        row(
            "runtime",
            "impact_sample",
            Runtime,
            &["impact_sample = 100"],
        ),
        row(
            "runtime",
            "drain_timeout",
            Runtime,
            &["drain_timeout = \"5s\""],
        ),
        row(
            "runtime",
            "max_pinned_age",
            Runtime,
            &["max_pinned_age = \"10m\""],
        ),
        row(
            "runtime",
            "worker_threads",
            Runtime,
            &["worker_threads = 3"],
        ),
        row("runtime", "write_back", Runtime, &["write_back = true"]),
        row(
            "runtime",
            "huge_pages",
            Runtime,
            &["huge_pages = \"never\""],
        ),
        row(
            "runtime",
            "file_roots",
            Runtime,
            &["file_roots = [\"/tmp\"]"],
        ),
        row(
            "discovery",
            "nameservers",
            Discovery,
            &["nameservers = [\"127.0.0.53\"]"],
        ),
        row("discovery", "timeout", Discovery, &["timeout = \"1s\""]),
        row("discovery", "attempts", Discovery, &["attempts = 3"]),
        row(
            "fleet",
            "endpoints",
            Fleet,
            &["endpoints = [\"127.0.0.1:2380\"]"],
        )
        .replaces(&["endpoints = [\"127.0.0.1:2379\"]"]),
        row("fleet", "prefix", Fleet, &["prefix = \"/u\""]).replaces(&["prefix = \"/t\""]),
        row("fleet", "instance", Fleet, &["instance = \"node-a\""]),
        row("fleet", "lease_ttl", Fleet, &["lease_ttl = \"20s\""]),
        row("fleet", "ca", Fleet, &["ca = \"ca.pem\""]),
        // A client identity needs both halves (and the CA).
        row(
            "fleet",
            "cert",
            Fleet,
            &[
                "ca = \"ca.pem\"",
                "cert = \"client.pem\"",
                "key = \"client.key\"",
            ],
        )
        .before(&["ca = \"ca.pem\""]),
        row(
            "fleet",
            "key",
            Fleet,
            &[
                "ca = \"ca.pem\"",
                "cert = \"client.pem\"",
                "key = \"client.key\"",
            ],
        )
        .before(&["ca = \"ca.pem\""]),
        row(
            "fleet",
            "username",
            Fleet,
            &["username = \"root\"", "password_file = \"etcd.pass\""],
        ),
        row(
            "fleet",
            "password_file",
            Fleet,
            &["username = \"root\"", "password_file = \"etcd.pass\""],
        ),
        row("limits", "store.redis.url", Limits, &[REDIS_OTHER]).before(&[REDIS]),
        row(
            "limits",
            "store.redis.username",
            Limits,
            &[
                REDIS,
                "store.redis.username = \"gw\"",
                "store.redis.password_file = \"redis.pass\"",
            ],
        )
        .before(&[REDIS, "store.redis.password_file = \"redis.pass\""]),
        row(
            "limits",
            "store.redis.password_file",
            Limits,
            &[REDIS, "store.redis.password_file = \"redis.pass\""],
        )
        .before(&[REDIS]),
        row(
            "limits",
            "store.redis.sentinel",
            Limits,
            &["store.redis.sentinel = { master = \"store\", nodes = [\"redis://127.0.0.1:26379\"] }"],
        )
        .before(&[REDIS]),
        row(
            "limits",
            "store.redis.ca",
            Limits,
            &[TLS_REDIS, "store.redis.ca = \"ca.pem\""],
        )
        .before(&[TLS_REDIS]),
        row(
            "limits",
            "store.redis.cert",
            Limits,
            &[
                TLS_REDIS,
                "store.redis.cert = \"client.pem\"",
                "store.redis.key = \"client.key\"",
            ],
        )
        .before(&[TLS_REDIS]),
        row(
            "limits",
            "store.redis.key",
            Limits,
            &[
                TLS_REDIS,
                "store.redis.cert = \"site.pem\"",
                "store.redis.key = \"site.key\"",
            ],
        )
        .before(&[
            TLS_REDIS,
            "store.redis.cert = \"client.pem\"",
            "store.redis.key = \"client.key\"",
        ]),
        row(
            "limits",
            "store.redis.key_prefix",
            Limits,
            &[REDIS, "store.redis.key_prefix = \"edge:\""],
        )
        .before(&[REDIS]),
        row(
            "limits",
            "store.redis.timeout",
            Limits,
            &[REDIS, "store.redis.timeout = \"1s\""],
        )
        .before(&[REDIS]),
        row("listeners", "name", Tcp, &["name = \"relay2\""])
            .on(LISTENERS)
            .replaces(&["name = \"relay\""]),
        row("listeners", "bind", Tcp, &["bind = \"127.0.0.1:15432\""])
            .on(LISTENERS)
            .replaces(&["bind = \"127.0.0.1:0\""]),
        row("listeners", "protocol", Tcp, &["protocol = \"udp\""])
            .on(LISTENERS)
            .replaces(&["protocol = \"tcp\""]),
        row(
            "listeners",
            "tls.certificates",
            Https,
            &["tls.certificates = [{ cert = \"other.pem\", key = \"other.key\" }]"],
        )
        .replaces(&["tls.certificates = [{ cert = \"site.pem\", key = \"site.key\" }]"]),
        row("listeners", "http3", Https, &["http3 = true"]),
        row(
            "listeners",
            "http3_early_data",
            Https,
            &["http3 = true", "http3_early_data = true"],
        )
        .before(&["http3 = true"]),
        row(
            "listeners",
            "tls.client_ca",
            Https,
            &["tls.client_ca = \"ca.pem\""],
        ),
        row(
            "listeners",
            "tls.client_auth",
            Https,
            &[
                "tls.client_ca = \"ca.pem\"",
                "tls.client_auth = \"optional\"",
            ],
        )
        .before(&["tls.client_ca = \"ca.pem\""]),
        row(
            "listeners",
            "tls.strict_sni_host",
            Https,
            &["tls.strict_sni_host = true"],
        ),
        row(
            "listeners",
            "tls.client_identity_headers",
            Https,
            &[
                "tls.client_ca = \"ca.pem\"",
                "tls.client_identity_headers = true",
            ],
        )
        .before(&["tls.client_ca = \"ca.pem\""]),
        row("listeners", "upstream", Tcp, &["upstream = \"datagrams\""])
            .on(&[Tcp, Udp])
            .replaces(&["upstream = \"relayed\""]),
        row("listeners", "sni_routes", Tcp, &[SNI]).replaces(&["upstream = \"relayed\""]),
        row(
            "listeners",
            "default_upstream",
            Tcp,
            &[SNI, "default_upstream = \"relayed\""],
        )
        .before(&[SNI])
        .without(&["upstream = \"relayed\""]),
        row(
            "listeners",
            "client_hello_timeout",
            Tcp,
            &[SNI, "client_hello_timeout = \"2s\""],
        )
        .before(&[SNI])
        .without(&["upstream = \"relayed\""]),
        row(
            "listeners",
            "accept_proxy_protocol",
            Http,
            &[TRUSTED, "accept_proxy_protocol = true"],
        )
        .on(&[Http, Https, Tcp])
        .before(&[TRUSTED]),
        row(
            "listeners",
            "header_read_timeout",
            Http,
            &["header_read_timeout = \"3s\""],
        )
        .on(HTTP),
        row(
            "listeners",
            "keepalive_timeout",
            Http,
            &["keepalive_timeout = \"3s\""],
        )
        .on(HTTP),
        row("listeners", "idle_timeout", Udp, &["idle_timeout = \"3s\""]).on(LISTENERS),
        row(
            "listeners",
            "h2_keepalive_interval",
            Http,
            &["h2_keepalive_interval = \"off\""],
        )
        .on(HTTP),
        row(
            "listeners",
            "max_header_bytes",
            Http,
            &["max_header_bytes = 16384"],
        )
        .on(HTTP),
        row("listeners", "max_headers", Http, &["max_headers = 20"]).on(HTTP),
        row(
            "listeners",
            "max_concurrent_streams",
            Https,
            &["max_concurrent_streams = 5"],
        )
        .on(HTTP),
        row("listeners", "max_sessions", Udp, &["max_sessions = 5"]),
        row(
            "listeners",
            "max_connections",
            Tcp,
            &["max_connections = 5"],
        )
        .on(&[Http, Https, Tcp]),
        row("listeners", "max_inflight", Http, &["max_inflight = 5"]).on(HTTP),
        row(
            "listeners",
            "merge_slashes",
            Http,
            &["merge_slashes = true"],
        )
        .on(HTTP),
        row(
            "listeners",
            "encoded_slash",
            Http,
            &["encoded_slash = \"reject\""],
        )
        .on(HTTP),
        row(
            "listeners",
            "trust_forwarded",
            Http,
            &["trust_forwarded = true"],
        )
        .on(HTTP),
        row("listeners", "trusted_proxies", Http, &[TRUSTED]).on(HTTP),
        row(
            "listeners",
            "allow_from",
            Http,
            &["allow_from = [\"10.0.0.0/8\"]"],
        )
        .on(HTTP),
        row(
            "listeners",
            "deny_from",
            Http,
            &["deny_from = [\"10.0.0.0/8\"]"],
        )
        .on(HTTP),
        row(
            "listeners",
            "defaults",
            Http,
            &["defaults = { request_id = true }"],
        )
        .on(HTTP),
        row("routes", "name", Route, &["name = \"r2\""]).replaces(&["name = \"r\""]),
        row("routes", "listeners", Route, &["listeners = [\"web\"]"])
            .replaces(&["listeners = [\"web\", \"secure\"]"]),
        row("routes", "hosts", Route, &["hosts = [\"api.example.com\"]"]),
        row("routes", "path_exact", Route, &["path_exact = \"/x\""]),
        row("routes", "path_prefix", Route, &["path_prefix = \"/x/\""]),
        row("routes", "path_regex", Route, &["path_regex = \"^/x\""]),
        row("routes", "methods", Route, &["methods = [\"GET\"]"]),
        row(
            "routes",
            "headers",
            Route,
            &["headers = { \"x-canary\" = \"1\" }"],
        ),
        row("routes", "upstream", Route, &["upstream = \"spare\""])
            .replaces(&["upstream = \"app\""]),
        row("routes", "respond", Route, &["respond = { status = 204 }"])
            .replaces(&["upstream = \"app\"", "[routes.retry]"]),
        row("routes", "timeout", Route, &["timeout = \"5s\""]),
        row("routes", "max_inflight", Route, &["max_inflight = 5"]),
        row("routes", "retry", Route, &["retry = { attempts = 3 }"]).replaces(&["[routes.retry]"]),
        row("routes", "hedge", Route, &["hedge = { delay = \"50ms\" }"]),
        row("routes", "quota", Route, &["quota = { rate = 10 }"]),
        row("routes", "cache", Route, &["cache = { zone = \"main\" }"]),
        row("routes", "waf", Route, &["waf = { ruleset = \"main\" }"]),
        row("waf", "files", Waf, &["files = [\"waf.conf\", \"waf2.conf\"]"]).replaces(&[WAF_FILES]),
        row("waf", "paranoia", Waf, &["paranoia = 3"]),
        row("waf", "inbound_threshold", Waf, &["inbound_threshold = 10"]),
        row("waf", "request_body_limit", Waf, &["request_body_limit = \"1MiB\""]),
        row(
            "waf",
            "request_body_limit_action",
            Waf,
            &["request_body_limit_action = \"process_partial\""],
        ),
        row("waf", "outbound_threshold", Waf, &["outbound_threshold = 8"]),
        row(
            "waf",
            "response_body_limit",
            Waf,
            &["response_body_limit = \"64KiB\""],
        ),
        row("routes", "query", Route, &["query = { v = \"2\" }"]),
        row(
            "routes",
            "redirect",
            Route,
            &["redirect = { host = \"www.example.com\" }"],
        )
        .replaces(&["upstream = \"app\"", "[routes.retry]"]),
        row(
            "routes",
            "rewrite",
            Route,
            &["rewrite = { strip_prefix = \"/x\" }"],
        ),
        row(
            "routes",
            "host_rewrite",
            Route,
            &["host_rewrite = \"internal\""],
        ),
        row(
            "routes",
            "request_headers",
            Route,
            &["request_headers = { set = { \"x-a\" = \"{client_ip}\" } }"],
        ),
        row(
            "routes",
            "response_headers",
            Route,
            &["response_headers = { remove = [\"server\"] }"],
        ),
        row(
            "routes",
            "max_request_body",
            Route,
            &["max_request_body = \"1MiB\""],
        ),
        row(
            "routes",
            "allow_from",
            Route,
            &["allow_from = [\"10.0.0.0/8\"]"],
        ),
        row(
            "routes",
            "deny_from",
            Route,
            &["deny_from = [\"10.0.0.0/8\"]"],
        ),
        row("routes", "request_id", Route, &["request_id = true"]),
        row("routes", "grpc_web", Route, &["grpc_web = true"])
            .also(&[(Upstream, "protocol = \"h2c\"")]),
        row(
            "routes",
            "cors",
            Route,
            &["cors = { allow_origins = [\"https://app.example\"] }"],
        ),
        row("routes", "compress", Route, &["compress = {}"]),
        row(
            "routes",
            "mirror",
            Route,
            &["mirror = { upstream = \"spare\", percent = 5 }"],
        ),
        row(
            "routes",
            "mirror_methods",
            Route,
            &[
                "mirror = { upstream = \"spare\" }",
                "mirror_methods = [\"POST\"]",
            ],
        ),
        row(
            "routes",
            "auth",
            Route,
            &["auth = { forward = { url = \"http://app/check\" } }"],
        ),
        row("retry", "attempts", Retry, &["attempts = 3"]),
        row("retry", "on", Retry, &["on = [\"reset\"]"]),
        row(
            "retry",
            "per_try_timeout",
            Retry,
            &["per_try_timeout = \"1s\""],
        ),
        row(
            "retry",
            "backoff",
            Retry,
            &["backoff = { base = \"10ms\", max = \"100ms\" }"],
        ),
        row("retry", "budget", Retry, &["budget = 0.5"]),
        row("retry", "methods", Retry, &["methods = [\"GET\"]"]),
        row(
            "retry",
            "max_replay_body",
            Retry,
            &["max_replay_body = 1024"],
        ),
        row("upstreams", "policy", Upstream, &["policy = \"p2c\""]),
        row(
            "upstreams",
            "hash_key",
            Upstream,
            &["policy = \"hash\"", "hash_key = \"header:x-user\""],
        )
        .before(&["policy = \"hash\"", "hash_key = \"client_ip\""]),
        row(
            "upstreams",
            "hash_balance_factor",
            Upstream,
            &[
                "policy = \"hash\"",
                "hash_key = \"client_ip\"",
                "hash_balance_factor = 150",
            ],
        )
        .before(&["policy = \"hash\"", "hash_key = \"client_ip\""]),
        row("upstreams", "protocol", Upstream, &["protocol = \"h2c\""]),
        row(
            "upstreams",
            "tls",
            Upstream,
            &[
                "protocol = \"https\"",
                "tls = { server_name = \"backend.internal\" }",
            ],
        )
        .before(&["protocol = \"https\""]),
        row(
            "upstreams",
            "connect_timeout",
            Upstream,
            &["connect_timeout = \"1s\""],
        ),
        row(
            "upstreams",
            "idle_timeout",
            Upstream,
            &["idle_timeout = \"10s\""],
        ),
        row(
            "upstreams",
            "health",
            Upstream,
            &["health = { tcp = true }"],
        )
        .replaces(&["[upstreams.app.health]"]),
        row(
            "upstreams",
            "outlier",
            Upstream,
            &["outlier = { consecutive_failures = 2 }"],
        )
        .replaces(&["[upstreams.app.outlier]"]),
        row(
            "upstreams",
            "slow_start",
            Upstream,
            &["slow_start = \"30s\""],
        ),
        row(
            "upstreams",
            "backends",
            Upstream,
            &["backends = [{ addr = \"127.0.0.1:11\" }]"],
        )
        .replaces(&["backends = [{ addr = \"127.0.0.1:9\" }]"]),
        // Bounds members from sources: the upstream needs one.
        row(
            "upstreams",
            "max_members",
            Upstream,
            &[
                "backends = [{ dns = \"app.internal:80\" }]",
                "max_members = 10",
            ],
        )
        .before(&["backends = [{ dns = \"app.internal:80\" }]"])
        .without(&["backends = [{ addr = \"127.0.0.1:9\" }]"]),
        row(
            "upstreams",
            "proxy_protocol",
            Upstream,
            &["proxy_protocol = \"v1\""],
        ),
        row(
            "acme",
            "domains",
            Acme,
            &["domains = [\"auto.example\", \"www.auto.example\"]"],
        )
        .replaces(&["domains = [\"auto.example\"]"])
        .also(STATE_DIR),
        row(
            "acme",
            "directory",
            Acme,
            &["directory = \"https://other-ca.example/dir\""],
        )
        .replaces(&["directory = \"https://acme.example/dir\""])
        .also(STATE_DIR),
        row("acme", "email", Acme, &["email = \"ops@auto.example\""]).also(STATE_DIR),
        row("acme", "challenge", Acme, &["challenge = \"http-01\""]).also(STATE_DIR),
        row("acme", "ca_root", Acme, &["ca_root = \"ca.pem\""]).also(STATE_DIR),
        row(
            "acme",
            "eab",
            Acme,
            &["eab = { kid = \"kid-1\", hmac_key_file = \"eab.key\" }"],
        )
        .also(STATE_DIR),
        row("acme", "renew_before", Acme, &["renew_before = \"10d\""]).also(STATE_DIR),
        row("health", "path", Health, &["path = \"/live\""]).replaces(&["path = \"/healthz\""]),
        row("health", "tcp", Health, &["tcp = true"]).replaces(&["path = \"/healthz\""]),
        row("health", "grpc", Health, &["grpc = \"pkg.Service\""])
            .replaces(&["path = \"/healthz\""])
            .also(&[(Upstream, "protocol = \"h2c\"")]),
        row("health", "host", Health, &["host = \"app.internal\""]),
        row(
            "health",
            "expect_status",
            Health,
            &["expect_status = [204]"],
        ),
        row("health", "interval", Health, &["interval = \"1s\""]),
        row("health", "timeout", Health, &["timeout = \"500ms\""]),
        row(
            "health",
            "unhealthy_after",
            Health,
            &["unhealthy_after = 5"],
        ),
        row("health", "healthy_after", Health, &["healthy_after = 4"]),
        row(
            "outlier",
            "consecutive_failures",
            Outlier,
            &["consecutive_failures = 3"],
        ),
        row(
            "outlier",
            "base_ejection",
            Outlier,
            &["base_ejection = \"10s\""],
        ),
        row(
            "outlier",
            "max_ejection",
            Outlier,
            &["max_ejection = \"1m\""],
        ),
        row(
            "outlier",
            "max_ejected_percent",
            Outlier,
            &["max_ejected_percent = 20"],
        ),
    ]
}

/// The baseline with `extra` lines in `place` (the fleet section only
/// when it is the place), without the lines of `place` that `drop` names
/// and without every section whose header it names; and the line number
/// of the first of `extra`; `also` adds lines to other places.
fn configuration(
    place: Place,
    extra: &[&str],
    drop: &[&str],
    also: &[(Place, &str)],
) -> (String, usize) {
    let mut text = String::new();
    let mut lines = 0;
    let mut first_extra = 0;
    let mut push = |text: &mut String, line: &str| {
        text.push_str(line);
        text.push('\n');
        lines += 1;
        lines
    };
    for p in PLACES {
        let (header, baseline) = p.baseline();
        if (p == Fleet && place != Fleet) || (p == Acme && place != Acme) || drop.contains(&header)
        {
            continue;
        }
        push(&mut text, header);
        for line in baseline {
            if p != place || !drop.contains(line) {
                push(&mut text, line);
            }
        }
        for (_, line) in also.iter().filter(|(at, _)| *at == p) {
            push(&mut text, line);
        }
        if p == place {
            for (i, line) in extra.iter().enumerate() {
                let at = push(&mut text, line);
                if i == 0 {
                    first_extra = at;
                }
            }
        }
        push(&mut text, "");
    }
    // Upstreams that are no place of their own.
    for (name, port) in [("relayed", 12), ("datagrams", 13), ("spare", 14)] {
        push(&mut text, &format!("[upstreams.{name}]"));
        push(
            &mut text,
            &format!("backends = [{{ addr = \"127.0.0.1:{port}\" }}]"),
        );
        push(&mut text, "");
    }
    // The cache zone a route's `cache` names.
    push(&mut text, "[cache.zones.main]");
    push(&mut text, "memory = \"16MiB\"");
    (text, first_extra)
}

/// What a configuration does, without the text it came from.
fn behaviour(spec: &Spec) -> String {
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
        spec.admin,
        spec.metrics_bind,
        spec.metrics_max_series,
        spec.log,
        spec.tracing,
        spec.runtime,
        spec.listeners,
        spec.routes,
        spec.upstreams,
        spec.fleet,
        spec.discovery,
        spec.limit_store,
        spec.waf_rulesets
    )
}

/// A folder with every file the rows name.
fn files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ca = crate::pki::ca("keys test");
    let (site, site_key) = crate::pki::server_leaf(&ca, &["site.example"]);
    let (other, other_key) = crate::pki::server_leaf(&ca, &["other.example"]);
    let (client, client_key) = crate::pki::server_leaf(&ca, &["client.example"]);
    for (name, content) in [
        ("ca.pem", ca.pem.as_str()),
        (
            "eab.key",
            "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W",
        ),
        ("site.pem", &site),
        ("site.key", &site_key),
        ("other.pem", &other),
        ("other.key", &other_key),
        ("client.pem", &client),
        ("client.key", &client_key),
        ("admin.token", "a-token-of-at-least-sixteen-characters"),
        ("etcd.pass", "s3cret"),
        ("redis.pass", "s3cret"),
        ("hook.secret", "a-webhook-secret-0123456789"),
        (
            "waf.conf",
            "SecRule ARGS \"@contains attack\" \"id:1,phase:2,deny,log\"\n",
        ),
        (
            "waf2.conf",
            "SecRule REQUEST_HEADERS:User-Agent \"@contains scanner\" \"id:2,phase:1,deny,log\"\n",
        ),
    ] {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.path().join("hook.secret"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
    }
    dir
}

fn validate(dir: &Path, text: &str) -> Result<Spec, Vec<cutover::config::Diagnostic>> {
    cutover::plan::validate(&ConfigText::inline(
        text.to_owned(),
        dir.to_path_buf(),
        "keys.toml",
    ))
}

/// The keys `docs/config.md` documents, by section (`retry`, `health`
/// and `outlier` are the subsections of those names).
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(workspace().join("docs/config.md")).unwrap();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section = None;
    for line in text.lines() {
        if line.starts_with("## ") || line.starts_with("### ") {
            // "## `[admin]`", "## `[[listeners]]`", "## `[upstreams.NAME]`", "### `retry`"
            section = line.split('`').nth(1).map(|name| {
                name.trim_matches(|c| c == '[' || c == ']')
                    .split('.')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            });
            continue;
        }
        let (Some(section), Some(first)) = (&section, line.strip_prefix("| `")) else {
            continue;
        };
        let cell = first.split(" |").next().unwrap_or_default();
        for key in format!("`{cell}").split('`').skip(1).step_by(2) {
            out.entry(section.clone())
                .or_default()
                .insert(key.to_owned());
        }
    }
    out
}

#[test]
fn the_table_walks_every_documented_key() {
    let documented = documented();
    let walked: BTreeMap<String, BTreeSet<String>> =
        rows().iter().fold(BTreeMap::new(), |mut map, row| {
            map.entry(row.section.to_owned())
                .or_default()
                .insert(row.key.to_owned());
            map
        });
    assert_eq!(
        walked, documented,
        "docs/config.md's key tables and this test's rows must name the same keys"
    );
}

#[test]
fn every_documented_key_changes_the_configuration_where_it_belongs() {
    let dir = files();
    let mut silent = Vec::new();
    for row in rows() {
        let (reference, _) = configuration(row.checked, row.before, row.without, row.also);
        let dropped = [row.replaces, row.without].concat();
        let (changed, _) = configuration(row.checked, row.after, &dropped, row.also);
        let reference = validate(dir.path(), &reference).unwrap_or_else(|e| {
            panic!(
                "{}.{}: the reference must validate: {e:#?}\n{reference}",
                row.section, row.key
            )
        });
        let spec = validate(dir.path(), &changed).unwrap_or_else(|e| {
            panic!(
                "{}.{} in {:?} must validate: {e:#?}\n{changed}",
                row.section, row.key, row.checked
            )
        });
        if behaviour(&reference) == behaviour(&spec) {
            silent.push(format!("{}.{} ({:?})", row.section, row.key, row.checked));
        }
    }
    assert!(silent.is_empty(), "accepted and ignored: {silent:?}");
}

#[test]
fn every_documented_key_is_refused_where_it_does_not_belong() {
    let dir = files();
    let documented = documented();
    let mut accepted = Vec::new();
    let mut probes = 0;
    for row in rows() {
        let applies = row.applies();
        for place in PLACES {
            let belongs = if LISTENERS.contains(&place) && row.section == "listeners" {
                applies.contains(&place)
            } else {
                documented
                    .get(place.section())
                    .is_some_and(|keys| keys.contains(row.key))
            };
            if belongs {
                continue;
            }
            probes += 1;
            let line = row.line();
            let (text, at) = configuration(place, &[line], &[], &[]);
            match validate(dir.path(), &text) {
                Ok(_) => accepted.push(format!(
                    "{}.{} in {place:?}: accepted",
                    row.section, row.key
                )),
                Err(errors) if !errors.iter().any(|d| d.line == Some(at)) => {
                    accepted.push(format!(
                        "{}.{} in {place:?}: refused, but not at line {at}: {:?}",
                        row.section,
                        row.key,
                        errors
                            .iter()
                            .map(|d| (d.code.as_str(), d.line))
                            .collect::<Vec<_>>()
                    ))
                }
                Err(_) => {}
            }
        }
    }
    assert!(probes > 1000, "only {probes} probes");
    assert!(accepted.is_empty(), "{accepted:#?}");
}

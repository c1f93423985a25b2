//! The web application firewall through the real binary (DESIGN §24),
//! with the OWASP Core Rule Set as shipped beside the project
//! (`../shared/crs`): a route in blocking mode answers an SQL injection
//! in the query or in a form body with 403 and the request's id (no
//! rule in the answer), a benign request passes, a route in detection
//! mode passes what it would block, and `cutover_waf_decisions_total`
//! counts each outcome; a body past `request_body_limit` is refused
//! (413) or read in part, as the rule set says.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;

use crate::harness::{get, scrape, send, workspace, Gateway};

/// Where the Core Rule Set is, when it is beside the project.
pub fn crs() -> Option<std::path::PathBuf> {
    let root = workspace().join("../shared/crs");
    let root = std::fs::canonicalize(root).ok()?;
    root.join("rules").is_dir().then_some(root)
}

async fn post(gw: &Gateway, path: &str, body: &str) -> (u16, hyper::HeaderMap, String) {
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "app.test")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("user-agent", "cutover-test")
        .header("accept", "*/*")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let (status, headers, body) = send(gw.listener("web"), req).await.expect("answered");
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_rule_set_blocks_and_detects_through_the_binary() {
    let Some(crs) = crs() else {
        eprintln!("skipped: the Core Rule Set is not at ../shared/crs");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"[admin]
bind = "127.0.0.1:0"

[metrics]
bind = "127.0.0.1:0"

[log]
format = "json"
access = true
access_file = "access.log"

[runtime]
file_roots = ["{root}"]

[waf.rulesets.crs]
files = ["{root}/crs-setup.conf.example", "{root}/rules"]
request_body_limit = "4KiB"

[waf.rulesets.partial]
files = ["{root}/crs-setup.conf.example", "{root}/rules"]
request_body_limit = "4KiB"
request_body_limit_action = "process_partial"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[listeners]]
name = "edge"
bind = "127.0.0.1:0"
defaults = {{ waf = {{ ruleset = "crs" }} }}

[[routes]]
name = "defaulted"
listeners = ["edge"]
path_prefix = "/d"
respond = {{ body = "d" }}

[[routes]]
name = "opted-out"
listeners = ["edge"]
path_prefix = "/open"
respond = {{ body = "open" }}
waf = "none"

[[routes]]
name = "guarded"
listeners = ["web"]
path_prefix = "/app"
respond = {{ body = "app" }}
waf = {{ ruleset = "crs" }}

[[routes]]
name = "watched"
listeners = ["web"]
path_prefix = "/watch"
respond = {{ body = "watch" }}
waf = {{ ruleset = "crs", mode = "detect" }}

[[routes]]
name = "excused"
listeners = ["web"]
path_prefix = "/excused"
respond = {{ body = "excused" }}
waf = {{ ruleset = "crs", exclusions = [
    {{ targets = ["ARGS:q"], paths = ["/excused/search"] }},
    {{ rule_ids = [941100, 941110, 941160, 949110], paths = ["/excused/html"] }},
] }}

[[routes]]
name = "partial"
listeners = ["web"]
path_prefix = "/partial"
respond = {{ body = "partial" }}
waf = {{ ruleset = "partial" }}
"#,
        root = crs.display()
    );
    let access = dir.path().join("access.log");
    let gw = Gateway::start_in(dir, &config);
    let web = gw.listener("web");

    // Benign: through.
    let (status, _, body) = post(&gw, "/app/login", "user=alice&remember=1").await;
    assert_eq!((status, body.as_str()), (200, "app"));
    // SQL injection in the query: 403, the request's id, no rule.
    let attack = "/app/item?id=1%27%20OR%20%271%27%3D%271";
    let (status, headers, body) = get(web, "app.test", attack).await;
    assert_eq!(status, 403, "{body}");
    let id = headers["x-request-id"].to_str().unwrap().to_owned();
    assert!(body.contains(&id), "{body}");
    assert!(!body.contains("942"), "no rule id in the answer: {body}");
    // In a form body.
    let (status, _, _) = post(&gw, "/app/login", "user=1' OR '1'='1&pass=x").await;
    assert_eq!(status, 403);
    // Cross-site scripting and path traversal, at paranoia 1.
    let xss = "/app/page?name=%3Cscript%3Ealert(1)%3C%2Fscript%3E";
    let traversal = "/app/file?name=..%2F..%2F..%2Fetc%2Fpasswd";
    for path in [xss, traversal] {
        let (status, _, body) = get(web, "app.test", path).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    // Detection mode passes what blocking would stop.
    for path in [attack, xss, traversal] {
        let watched = path.replace("/app", "/watch");
        let (status, _, body) = get(web, "app.test", &watched).await;
        assert_eq!((status, body.as_str()), (200, "watch"), "{watched}");
    }
    // A listener's default guards its routes without a `waf`, not one
    // that wrote `waf = "none"`.
    let edge = gw.listener("edge");
    let (status, _, _) = get(edge, "app.test", &attack.replace("/app", "/d")).await;
    assert_eq!(status, 403);
    let (status, _, body) = get(edge, "app.test", &attack.replace("/app", "/open")).await;
    assert_eq!((status, body.as_str()), (200, "open"));
    // Exclusions: a value the rules no longer read under one path (and
    // still read under another), rules not evaluated under a path.
    let (status, _, _) = get(
        web,
        "app.test",
        "/excused/search?q=1%27%20OR%20%271%27%3D%271",
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = get(
        web,
        "app.test",
        "/excused/other?q=1%27%20OR%20%271%27%3D%271",
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, _) = get(web, "app.test", &xss.replace("/app/page", "/excused/html")).await;
    assert_eq!(status, 200);
    // A body past the limit: refused before the rules run, or read in
    // part (an attack past the first 4 KiB goes through then; one
    // within them does not).
    let padding = format!("pad={}", "a".repeat(5000));
    let (status, _, _) = post(&gw, "/app/upload", &padding).await;
    assert_eq!(status, 413);
    let late = format!("{padding}&q=1' OR '1'='1");
    let (status, _, body) = post(&gw, "/partial/upload", &late).await;
    assert_eq!((status, body.as_str()), (200, "partial"));
    let early = format!("q=1' OR '1'='1&{padding}");
    let (status, _, _) = post(&gw, "/partial/upload", &early).await;
    assert_eq!(status, 403);

    let text = scrape(&gw).await;
    let count = |route: &str, outcome: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with("cutover_waf_decisions_total{")
                    && l.contains(&format!("route=\"{route}\""))
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(count("guarded", "pass"), 1.0, "{text}");
    assert_eq!(count("guarded", "blocked"), 4.0);
    assert_eq!(count("guarded", "body_too_large"), 1.0);
    assert_eq!(count("watched", "would_block"), 3.0);
    assert_eq!(count("excused", "pass"), 2.0);
    assert_eq!(count("excused", "blocked"), 1.0);
    assert_eq!(count("partial", "pass"), 1.0);
    assert_eq!(count("partial", "blocked"), 1.0);
    assert_eq!(count("defaulted", "blocked"), 1.0);
    assert_eq!(
        count("opted-out", "pass") + count("opted-out", "blocked"),
        0.0
    );

    // GET /admin/waf: the rule sets, the routes on each, the rules
    // matched most.
    let (status, _, view) = get(gw.admin, &gw.admin.to_string(), "/admin/waf").await;
    assert_eq!(status, 200, "{view}");
    let view: serde_json::Value = serde_json::from_str(&view).unwrap();
    let crs = view["rulesets"]
        .as_array()
        .and_then(|sets| sets.iter().find(|s| s["name"] == "crs"))
        .unwrap_or_else(|| panic!("{view:#}"));
    assert!(crs["rules"].as_u64().unwrap() > 600, "{crs:#}");
    assert_eq!(crs["paranoia"], 1);
    assert_eq!(crs["request_body_limit"], 4096);
    let routes: Vec<(&str, &str)> = crs["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["route"].as_str().unwrap(), r["mode"].as_str().unwrap()))
        .collect();
    assert_eq!(
        routes,
        [
            ("guarded", "block"),
            ("watched", "detect"),
            ("excused", "block")
        ]
    );
    assert_eq!(crs["listener_defaults"][0]["route"], "edge", "{crs:#}");
    let top: Vec<u64> = view["top_rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_u64().unwrap())
        .collect();
    assert!(top.contains(&949110), "{view:#}");
    assert!(
        text.contains("cutover_waf_rule_matches_total{rule=\"949110\"}"),
        "{text}"
    );

    // The access log names the rules: CRS's SQL injection (942…), XSS
    // (941…) and traversal (930…) rules and the blocking evaluation
    // (949110), in block and in detect mode.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut lines: Vec<serde_json::Value> = Vec::new();
    while lines.len() < 16 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        lines = std::fs::read_to_string(&access)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
    }
    let waf_of = |prefix: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
            .filter_map(|l| l["waf"].as_str().map(str::to_owned))
            .collect()
    };
    // A blocked request's line has the id its answer gave.
    assert!(
        lines
            .iter()
            .any(|l| l["path"] == "/app/item" && l["request_id"] == id.as_str()),
        "no line with request_id {id}"
    );
    for (path, family) in [
        ("/app/item", "942"),
        ("/app/page", "941"),
        ("/app/file", "930"),
    ] {
        let seen = waf_of(path);
        assert!(
            seen.iter().any(|w| w.starts_with("block:blocked:")
                && w.contains(family)
                && w.contains("949110")),
            "{path}: {seen:?}"
        );
    }
    let watched = waf_of("/watch/");
    assert_eq!(watched.len(), 3, "{watched:?}");
    assert!(
        watched
            .iter()
            .all(|w| w.starts_with("detect:would_block:") && w.contains("949110")),
        "{watched:?}"
    );
    assert!(
        waf_of("/app/login")
            .iter()
            .any(|w| w.starts_with("block:pass:score=0:")),
        "{:?}",
        waf_of("/app/login")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_the_engine_refuses_is_named_by_file_line_and_id() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.conf"),
        "SecRule ARGS \"@contains x\" \"id:10,phase:2,deny\"\n\
         SecRule ARGS \"@noSuchOperator x\" \"id:11,phase:2,deny\"\n",
    )
    .unwrap();
    let text = r#"[waf.rulesets.main]
files = ["bad.conf"]

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "r"
listeners = ["web"]
respond = { body = "ok" }
waf = { ruleset = "main" }

[[routes]]
name = "s"
listeners = ["web"]
path_prefix = "/s"
respond = { body = "ok" }
waf = { ruleset = "other", mode = "audit" }

[[routes]]
name = "t"
listeners = ["web"]
path_prefix = "/t"
respond = { body = "ok" }
waf = "off"
"#;
    let errors = cutover::plan::validate(&cutover::config::ConfigText::inline(
        text.to_owned(),
        dir.path().to_path_buf(),
        "waf.toml",
    ))
    .expect_err("refused");
    let found: Vec<(&str, &str, Option<usize>)> = errors
        .iter()
        .map(|d| (d.code.as_str(), d.path.as_str(), d.line))
        .collect();
    let rule = errors
        .iter()
        .find(|d| d.code.as_str() == "invalid_rule")
        .unwrap_or_else(|| panic!("{found:?}"));
    assert!(
        rule.message.contains("bad.conf:2") && rule.message.contains("rule 11"),
        "{}",
        rule.message
    );
    assert_eq!(rule.line, Some(2), "{found:?}");
    assert!(
        found.contains(&("unknown_waf_ruleset", "routes[1].waf.ruleset", Some(19))),
        "{found:?}"
    );
    assert!(
        found.contains(&("invalid_value", "routes[2].waf", Some(26))),
        "{found:?}"
    );
}

/// A backend's answers by path: a page that leaks a MySQL error
/// (`/…/leak`), the same text as JSON (`/…/json`), and the leak past
/// 600 KiB of HTML (`/…/late`).
const LEAK: &str =
    "<html><body>You have an error in your SQL syntax; check the manual</body></html>";

async fn leaking_backend() -> crate::harness::Backend {
    crate::harness::Backend::start(std::sync::Arc::new(|req| {
        let path = req.uri().path().to_owned();
        Box::pin(async move {
            let (body, media) = if path.ends_with("/json") {
                (format!("{{\"error\": \"{LEAK}\"}}"), "application/json")
            } else if path.ends_with("/late") {
                (format!("{}{LEAK}", "a".repeat(600 << 10)), "text/html")
            } else {
                (LEAK.to_owned(), "text/html; charset=utf-8")
            };
            let mut answer = hyper::Response::new(crate::harness::full(body));
            answer.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(media),
            );
            answer
        })
    }))
    .await
}

/// The answer's phases (CRS's outbound rules, DESIGN §24) through the
/// binary: an HTML page that leaks a database error is refused at
/// paranoia 1 in blocking mode (403 with the request's id; the SQL
/// leakage rule, 951230, and the outbound decision, 959100, in the
/// access log), and passes whole in detection mode; a JSON answer is not
/// read (not a type the rules read); a page whose leak is past
/// `response_body_limit` passes whole, its first part read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_rules_refuse_a_leaking_page_before_the_client_gets_it() {
    let Some(crs) = crs() else {
        eprintln!("skipped: the Core Rule Set is not at ../shared/crs");
        return;
    };
    let backend = leaking_backend().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"[admin]
bind = "127.0.0.1:0"

[metrics]
bind = "127.0.0.1:0"

[log]
format = "json"
access = true
access_file = "access.log"

[runtime]
file_roots = ["{root}"]

[waf.rulesets.crs]
files = ["{root}/crs-setup.conf.example", "{root}/rules"]

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "watched"
listeners = ["web"]
path_prefix = "/watched"
upstream = "app"
waf = {{ ruleset = "crs", mode = "detect" }}

[[routes]]
name = "guarded"
listeners = ["web"]
path_prefix = "/"
upstream = "app"
waf = {{ ruleset = "crs" }}

[upstreams.app]
backends = [{{ addr = "{backend}" }}]
"#,
        root = crs.display(),
        backend = backend.addr,
    );
    let access = dir.path().join("access.log");
    let gw = Gateway::start_in(dir, &config);
    let web = gw.listener("web");

    let (status, headers, body) = get(web, "app.test", "/page/leak").await;
    assert_eq!(status, 403, "{body}");
    let id = headers["x-request-id"].to_str().unwrap().to_owned();
    assert!(body.contains(&id) && !body.contains("SQL"), "{body}");
    let (status, _, body) = get(web, "app.test", "/watched/leak").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("You have an error in your SQL syntax"),
        "{body}"
    );
    let (status, _, body) = get(web, "app.test", "/page/json").await;
    assert_eq!(status, 200, "a JSON answer is not read: {body}");
    let (status, _, body) = get(web, "app.test", "/page/late").await;
    assert_eq!(status, 200, "past response_body_limit");
    assert_eq!(
        body.len(),
        (600 << 10) + LEAK.len(),
        "the whole page, as sent"
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let waf_of = |path: &str| -> Option<String> {
        std::fs::read_to_string(&access)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["path"] == path)
            .and_then(|l| l["waf"].as_str().map(str::to_owned))
    };
    while waf_of("/page/late").is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let blocked = waf_of("/page/leak").expect("a line for the leak");
    assert!(
        blocked.starts_with("block:blocked:")
            && blocked.contains("951230")
            && blocked.contains("959100"),
        "{blocked}"
    );
    let watched = waf_of("/watched/leak").expect("a line for the watched leak");
    assert!(
        watched.starts_with("detect:would_block:") && watched.contains("951230"),
        "{watched}"
    );
    for path in ["/page/json", "/page/late"] {
        let line = waf_of(path).expect("a line");
        assert!(line.starts_with("block:pass:"), "{path}: {line}");
    }
    let text = scrape(&gw).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("cutover_waf_decisions_total{")
                && l.contains("route=\"guarded\"")
                && l.contains("outcome=\"answer_blocked\"")),
        "{text}"
    );
}

//! Route filters (DESIGN §17) through the real binary: matching on query
//! and header patterns, rewrites, host rewrites, header changes with
//! templates, redirects, body limits, address rules, request ids and
//! listener defaults; and the refusals of bad input at activation.

use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

use crate::harness::*;

/// The echo backend's answer: its request line and headers, one per line.
fn echoed(body: &str) -> (String, Vec<(String, String)>) {
    let mut lines = body.lines();
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    (request_line, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn shaping_config(backend: SocketAddr) -> String {
    Config::new()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener(
            "web",
            r#"defaults = { response_headers = { set = { "strict-transport-security" = "max-age=63072000" }, remove = ["x-backend"] } }"#,
        )
        .listener("plain", "")
        .route(
            "to-https",
            "listeners = [\"plain\"]\nredirect = { scheme = \"https\", status = 308 }",
        )
        .route(
            "api",
            r#"listeners = ["web"]
path_prefix = "/api/"
upstream = "app"
rewrite = { strip_prefix = "/api" }
host_rewrite = "internal.example"
request_id = true
request_headers = { set = { "x-client" = "{client_ip}", "x-seen" = "{method} {host}{path}?{query} on {route}@{generation} via {header.x-env}" }, add = { "x-via" = "cutover" }, remove = ["x-debug"] }
response_headers = { set = { "x-served-by" = "{route}" }, add = { "cache-control" = "no-store" } }"#,
        )
        .route(
            "v1",
            r#"listeners = ["web"]
path_prefix = "/v1/"
upstream = "app"
rewrite = { replace_prefix = "/v2/" }
host_rewrite = "backend""#,
        )
        .route(
            "users",
            r#"listeners = ["web"]
path_regex = "^/u/[0-9]+$"
upstream = "app"
rewrite = { regex = ["^/u/(?P<id>[0-9]+)$", "/users/${id}"] }"#,
        )
        .route(
            "queried",
            r#"listeners = ["web"]
path_exact = "/search"
query = { version = "2", lang = "~^(en|de)$", debug = "*" }
respond = { body = "query v2" }"#,
        )
        .route(
            "headed",
            r#"listeners = ["web"]
path_exact = "/search"
headers = { "x-env" = "~^(staging|prod)$", "x-canary" = "*" }
respond = { body = "headed" }"#,
        )
        .route(
            "search",
            "listeners = [\"web\"]\npath_exact = \"/search\"\nrespond = { body = \"plain search\" }",
        )
        .route(
            "elsewhere",
            r#"listeners = ["web"]
path_prefix = "/go/"
redirect = { scheme = "https", host = "{header.x-target}", port = 8443, path = "/landing{path}", status = 307 }"#,
        )
        .route(
            "moved",
            r#"listeners = ["web"]
path_prefix = "/old/"
redirect = { replace_prefix = "/new/", status = 301, keep_query = false }"#,
        )
        .upstream("app", &[backend], "")
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrites_headers_templates_and_request_ids_reach_the_backend_and_the_client() {
    let echo = echo_backend().await;
    let gw = Gateway::start(&shaping_config(echo.addr));
    let web = gw.listener("web");

    let req = Request::builder()
        .uri("/api/orders/7?x=1")
        .header("host", "shop.example")
        .header("x-debug", "secret")
        .header("x-env", "prod")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, body) = send(web, req).await.unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "{text}");
    let (line, sent) = echoed(&text);
    assert_eq!(
        line, "GET /orders/7?x=1",
        "the prefix stripped, the query kept"
    );
    assert_eq!(header(&sent, "host"), Some("internal.example"));
    assert_eq!(
        header(&sent, "x-forwarded-host"),
        Some("shop.example"),
        "the client's host stays in X-Forwarded-Host"
    );
    assert_eq!(header(&sent, "x-client"), Some("127.0.0.1"));
    assert_eq!(
        header(&sent, "x-seen"),
        Some("GET shop.example/api/orders/7?x=1 on api@1 via prod"),
        "templates read the request as routed"
    );
    assert_eq!(header(&sent, "x-via"), Some("cutover"));
    assert_eq!(header(&sent, "x-debug"), None, "removed before forwarding");
    let id = header(&sent, "x-request-id")
        .expect("a request id was made")
        .to_owned();
    assert_eq!(id.len(), 36, "{id}");
    // The answer: the route's own response headers replace the listener's
    // defaults whole (no HSTS here), the id comes back.
    assert_eq!(headers["x-request-id"], id.as_str());
    assert_eq!(headers["x-served-by"], "api");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(
        headers["x-backend"], "echo",
        "the default's remove does not apply"
    );
    assert!(!headers.contains_key("strict-transport-security"));

    // A valid incoming id is kept.
    let req = Request::builder()
        .uri("/api/x")
        .header("host", "shop.example")
        .header("x-request-id", "ci-run-42.step:7")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (_, headers, body) = send(web, req).await.unwrap();
    let (_, sent) = echoed(&String::from_utf8_lossy(&body));
    assert_eq!(header(&sent, "x-request-id"), Some("ci-run-42.step:7"));
    assert_eq!(headers["x-request-id"], "ci-run-42.step:7");

    // replace_prefix, and the backend's own address as Host.
    let (_, _, body) = get(web, "shop.example", "/v1/users?page=2").await;
    let (line, sent) = echoed(&body);
    assert_eq!(line, "GET /v2/users?page=2");
    assert_eq!(header(&sent, "host"), Some(echo.addr.to_string().as_str()));

    // A regex rewrite with a named group; the listener's defaults apply to
    // a route without response headers of its own.
    let (status, headers, body) = get(web, "shop.example", "/u/42").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body).0, "GET /users/42");
    assert_eq!(headers["strict-transport-security"], "max-age=63072000");
    assert!(!headers.contains_key("x-backend"), "removed by the default");

    // The access log shows the routed and the forwarded path, and the id.
    let lines = wait_for_access_lines(&gw, 4).await;
    let first = &lines[0];
    assert_eq!(first["path"], "/api/orders/7", "{first}");
    assert_eq!(first["upstream_path"], "/orders/7", "{first}");
    assert_eq!(first["request_id"], id.as_str(), "{first}");
    let last = &lines[3];
    assert_eq!(last["path"], "/u/42");
    assert_eq!(last["upstream_path"], "/users/42");
    assert_eq!(last["request_id"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_and_header_patterns_select_routes_and_redirects_keep_what_they_should() {
    let echo = echo_backend().await;
    let gw = Gateway::start(&shaping_config(echo.addr));
    let web = gw.listener("web");
    let search = |query: &'static str, headers: &'static [(&'static str, &'static str)]| {
        let mut req = Request::builder()
            .uri(format!("/search{query}"))
            .header("host", "shop.example");
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        send(web, req.body(Full::new(Bytes::new())).unwrap())
    };
    let body = |r: Result<(u16, http::HeaderMap, Bytes), String>| {
        String::from_utf8_lossy(&r.unwrap().2).into_owned()
    };
    assert_eq!(
        body(search("?version=2&lang=de&debug", &[]).await),
        "query v2"
    );
    // Decoded before matching; order and other parameters do not matter.
    assert_eq!(
        body(search("?debug=1&other=x&lang=%65n&version=2", &[]).await),
        "query v2"
    );
    assert_eq!(
        body(search("?version=2&lang=fr&debug", &[]).await),
        "plain search"
    );
    assert_eq!(
        body(search("?version=2&lang=en", &[]).await),
        "plain search"
    );
    assert_eq!(
        body(search("", &[("x-env", "staging"), ("x-canary", "")]).await),
        "headed"
    );
    assert_eq!(
        body(search("", &[("x-env", "dev"), ("x-canary", "1")]).await),
        "plain search"
    );
    assert_eq!(body(search("", &[("x-env", "prod")]).await), "plain search");

    // http → https keeps host, port-less, path and query.
    let plain = gw.listener("plain");
    let (status, headers, _) = get(plain, "shop.example:8080", "/cart/3?coupon=a%20b").await;
    assert_eq!(status, 308);
    assert_eq!(
        headers["location"],
        "https://shop.example/cart/3?coupon=a%20b"
    );
    // A prefix moved, the query dropped as configured; the port kept.
    let (status, headers, _) = get(web, "shop.example:8080", "/old/page?x=1").await;
    assert_eq!(status, 301);
    assert_eq!(headers["location"], "http://shop.example:8080/new/page");
    // Every part set, from templates.
    let req = Request::builder()
        .uri("/go/x?y=1")
        .header("host", "shop.example")
        .header("x-target", "eu.shop.example")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, _) = send(web, req).await.unwrap();
    assert_eq!(status, 307);
    assert_eq!(
        headers["location"],
        "https://eu.shop.example:8443/landing/go/x?y=1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_rules_and_body_limits_refuse_before_the_backend_sees_anything() {
    let (counted, hits) = counting().await;
    let text = Config::new()
        .metrics()
        .listener("web", "")
        .listener("fenced", "deny_from = [\"127.0.0.0/8\"]")
        .listener(
            "office",
            "allow_from = [\"127.0.0.1\"]\ndeny_from = [\"10.0.0.0/8\"]",
        )
        .route(
            "internal",
            r#"listeners = ["web"]
path_prefix = "/internal/"
allow_from = ["10.0.0.0/8"]
upstream = "app""#,
        )
        .route(
            "uploads",
            r#"listeners = ["web", "fenced", "office"]
path_prefix = "/upload"
max_request_body = "1KiB"
upstream = "app""#,
        )
        .upstream("app", &[counted.addr], "")
        .build();
    let gw = Gateway::start(&text);
    let web = gw.listener("web");

    let (status, _, _) = get(web, "a.test", "/internal/stats").await;
    assert_eq!(status, 403);
    let (status, _, _) = get(gw.listener("fenced"), "a.test", "/upload").await;
    assert_eq!(status, 403, "the listener's own rule, before routing");
    let (status, _, _) = get(gw.listener("office"), "a.test", "/upload").await;
    assert_eq!(status, 200, "allowed by the listener");

    // Declared too large: 413 before a byte of the body is read.
    let post = |body: Vec<u8>, chunked: bool| {
        let mut req = Request::builder()
            .method("POST")
            .uri("/upload")
            .header("host", "a.test");
        if chunked {
            req = req.header("transfer-encoding", "chunked");
        }
        req.body(Full::new(Bytes::from(body))).unwrap()
    };
    let (status, _, _) = send(web, post(vec![b'x'; 2048], false)).await.unwrap();
    assert_eq!(status, 413);
    let (status, _, body) = send(web, post(vec![b'x'; 1024], false)).await.unwrap();
    assert_eq!(status, 200, "{body:?}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2);

    // Streamed (chunked, no length): cut when it passes the limit.
    let answer = raw_exchange(
        web,
        format!(
            "POST /upload HTTP/1.1\r\nhost: a.test\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n800\r\n{}\r\n800\r\n{}\r\n0\r\n\r\n",
            "y".repeat(0x800),
            "y".repeat(0x800)
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let metrics = gw.metrics.expect("metrics");
    let (_, _, scrape) = get(metrics, "a.test", "/metrics").await;
    assert!(
        scrape.contains(r#"cutover_filter_refusals_total{route="internal",reason="forbidden"} 1"#),
        "{scrape}"
    );
    // Both 413s, the declared length and the streamed body, as
    // docs/config.md says (the refusal is counted from the error,
    // wherever it was found).
    assert!(
        scrape.contains(
            r#"cutover_filter_refusals_total{route="uploads",reason="body_too_large"} 2"#
        ),
        "{scrape}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxies_name_the_client_that_address_rules_judge() {
    let echo = echo_backend().await;
    let text = Config::new()
        .listener("web", "trusted_proxies = [\"127.0.0.0/8\"]")
        .route(
            "office",
            r#"listeners = ["web"]
allow_from = ["203.0.113.0/24"]
upstream = "app"
request_headers = { set = { "x-client" = "{client_ip}" } }"#,
        )
        .upstream("app", &[echo.addr], "")
        .build();
    let gw = Gateway::start(&text);
    let web = gw.listener("web");
    let through = |xff: &'static str| {
        let req = Request::builder()
            .uri("/")
            .header("host", "a.test")
            .header("x-forwarded-for", xff)
            .body(Full::new(Bytes::new()))
            .unwrap();
        send(web, req)
    };
    // The nearest address that is not a trusted proxy is the client.
    let (status, _, body) = through("198.51.100.9, 203.0.113.7, 127.0.0.5")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (_, sent) = echoed(&String::from_utf8_lossy(&body));
    assert_eq!(header(&sent, "x-client"), Some("203.0.113.7"));
    let (status, _, _) = through("203.0.113.7, 198.51.100.9").await.unwrap();
    assert_eq!(status, 403, "a client outside the office, behind it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_bytes_cannot_inject_a_header_line_through_a_template() {
    let echo = echo_backend().await;
    let text = Config::new()
        .metrics()
        .listener("web", "")
        .route(
            "all",
            r#"listeners = ["web"]
upstream = "app"
request_headers = { set = { "x-copied" = "{header.x-in}", "x-path" = "{path}" } }"#,
        )
        .upstream("app", &[echo.addr], "")
        .build();
    let gw = Gateway::start(&text);
    // obs-text survives hyper's parser and is a valid value: copied as is.
    let answer = raw_exchange(
        gw.listener("web"),
        b"GET /a HTTP/1.1\r\nhost: a.test\r\nx-in: caf\xc3\xa9\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains("x-evil"), "{answer}");
    // A value is checked after substitution: the parser already refuses a
    // raw CR or LF in a header, so nothing can reach a template to add a
    // line; the proof is the head the backend received.
    let (_, _, body) = get(gw.listener("web"), "a.test", "/b%0D%0Ax-evil:%201").await;
    let (_, sent) = echoed(&body);
    assert!(header(&sent, "x-evil").is_none(), "{body}");
    assert_eq!(header(&sent, "x-path"), Some("/b%0D%0Ax-evil:%201"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_filters_are_refused_at_activation_with_their_positions() {
    let gw = Gateway::start(&config(
        "[[routes]]\nname = \"hello\"\nlisteners = [\"web\"]\nrespond = { body = \"hi\" }\n",
    ));
    let candidate =
        std::fs::read_to_string(workspace().join("fixtures/configs/invalid/filters.toml")).unwrap();
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(candidate),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let errors = body["errors"].as_array().unwrap();
    let codes: Vec<(&str, u64)> = errors
        .iter()
        .map(|e| (e["code"].as_str().unwrap(), e["line"].as_u64().unwrap()))
        .collect();
    for expected in [
        ("invalid_rewrite", 23),
        ("unknown_variable", 44),
        ("invalid_template", 44),
        ("invalid_header", 44),
        ("conflicting_action", 52),
        ("redirect_loop", 58),
        ("invalid_regex", 68),
    ] {
        assert!(codes.contains(&expected), "{expected:?} in {codes:?}");
    }
    // Nothing changed.
    let (_, _, text) = get(gw.listener("web"), "a.test", "/").await;
    assert_eq!(text, "hi");
}

/// A backend that counts the requests it sees and answers with the size
/// of the body it received.
async fn counting() -> (Backend, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&hits);
    let backend = Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        seen.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            use http_body_util::BodyExt;
            let size = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            hyper::Response::new(full(format!("{size} bytes")))
        })
    }))
    .await;
    (backend, hits)
}

/// The access log's first `n` JSON lines, waiting for them to be written.
async fn wait_for_access_lines(gw: &Gateway, n: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let lines: Vec<Value> = std::fs::read_to_string(gw.path("access.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(std::time::Instant::now() < deadline, "{lines:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_are_generation_owned_shown_in_preview_and_activated_live() {
    let echo = echo_backend().await;
    let before = shaping_config(echo.addr);
    let gw = Gateway::start(&before);
    let after = before.replace(
        "rewrite = { strip_prefix = \"/api\" }",
        "rewrite = { replace_prefix = \"/internal/\" }",
    );
    assert_ne!(before, after);
    let (status, plan) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/preview",
        Some("application/toml"),
        Some(after.clone()),
    )
    .await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["activatable"], true, "{plan}");
    let fields: Vec<&str> = plan["diff"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["fields"].as_array().unwrap())
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert!(
        fields.contains(&"routes.api.rewrite.replace_prefix")
            && fields.contains(&"routes.api.rewrite.strip_prefix"),
        "{fields:?}"
    );
    assert_eq!(plan["diff"]["changes"][0]["disposition"], "live");
    let (status, body) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/activate",
        Some("application/toml"),
        Some(after),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, _, answer) = get(gw.listener("web"), "shop.example", "/api/orders").await;
    assert_eq!(echoed(&answer).0, "GET /internal/orders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_keyed_on_a_header_sees_the_clients_not_one_a_filter_sets() {
    let echo = echo_backend().await;
    let text = Config::new()
        .listener("web", "")
        .route(
            "limited",
            r#"listeners = ["web"]
upstream = "app"
quota = { rate = 1, per = "1h", burst = 1, key = "header:x-user" }
request_headers = { set = { "x-user" = "everyone" } }
response_headers = { set = { "x-shaped" = "yes" } }"#,
        )
        .upstream("app", &[echo.addr], "")
        .build();
    let gw = Gateway::start(&text);
    let as_user = |user: &'static str| {
        let req = Request::builder()
            .uri("/")
            .header("host", "a.test")
            .header("x-user", user)
            .body(Full::new(Bytes::new()))
            .unwrap();
        send(gw.listener("web"), req)
    };
    let (status, _, body) = as_user("ann").await.unwrap();
    assert_eq!(status, 200);
    let (_, sent) = echoed(&String::from_utf8_lossy(&body));
    assert_eq!(
        header(&sent, "x-user"),
        Some("everyone"),
        "set after the quota"
    );
    let (status, _, _) = as_user("bob").await.unwrap();
    assert_eq!(status, 200, "bob has a bucket of his own");
    let (status, headers, _) = as_user("ann").await.unwrap();
    assert_eq!(status, 429, "ann's bucket is spent");
    assert_eq!(
        headers["x-shaped"], "yes",
        "response headers on a refusal too"
    );
}

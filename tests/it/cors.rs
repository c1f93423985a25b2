//! CORS (DESIGN §17) through the real binary: preflights answered by the
//! gateway before quota and auth, actual answers marked, disallowed
//! origins left unmarked; and a real browser (headless Chromium, which
//! `.ci/run` installs) making a preflighted cross-origin fetch.

use std::net::SocketAddr;

use crate::harness::{request_with as request, *};

fn cors_config(backend: SocketAddr, origin: &str) -> String {
    Config::new()
        .listener("web", "")
        .route(
            "api",
            &format!(
                r#"listeners = ["web"]
path_prefix = "/api/"
methods = ["GET", "PUT"]
upstream = "app"
quota = {{ rate = 1, per = "1h", burst = 2, key = "route" }}
auth = {{ forward = {{ url = "http://app/auth" }} }}
cors = {{ allow_origins = ["{origin}", "~https://[a-z]+\\.example\\.com"], allow_methods = ["GET", "PUT"], allow_headers = ["content-type", "x-token"], expose_headers = ["x-backend"], allow_credentials = true, max_age = "10m" }}"#
            ),
        )
        .route(
            "public",
            r#"listeners = ["web"]
path_prefix = "/public/"
upstream = "app"
cors = { allow_origins = ["*"] }"#,
        )
        .upstream("app", &[backend], "")
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_are_answered_before_quota_and_auth_and_answers_are_marked() {
    let backend = echo_backend().await;
    let gw = Gateway::start(&cors_config(backend.addr, "https://app.test"));
    let web = gw.listener("web");
    let preflight = |origin: &'static str, method: &'static str, headers: &'static str| async move {
        request(
            web,
            "OPTIONS",
            "/api/items",
            &[
                ("origin", origin),
                ("access-control-request-method", method),
                ("access-control-request-headers", headers),
            ],
        )
        .await
    };
    // More preflights than the quota's burst: none reaches the quota, the
    // auth service or the backend.
    for origin in [
        "https://app.test",
        "https://shop.example.com",
        "https://app.test",
    ] {
        let (status, headers, body) = preflight(origin, "PUT", "X-Token, content-type").await;
        assert_eq!((status, body.as_str()), (204, ""));
        assert_eq!(headers["access-control-allow-origin"], origin);
        assert_eq!(headers["access-control-allow-methods"], "GET, PUT");
        assert_eq!(
            headers["access-control-allow-headers"],
            "content-type, x-token"
        );
        assert_eq!(headers["access-control-allow-credentials"], "true");
        assert_eq!(headers["access-control-max-age"], "600");
        // The whole policy, for clients that check a preflight (browsers
        // read it on the actual answer).
        assert_eq!(headers["access-control-expose-headers"], "x-backend");
        let vary: Vec<_> = headers.get_all("vary").iter().collect();
        assert!(vary.iter().any(|v| *v == "origin"), "{vary:?}");
    }
    // Refused preflights: no CORS headers at all. (A method the route
    // does not serve finds no route: 404.)
    for (origin, method, asked, want) in [
        ("https://evil.test", "PUT", "x-token", 204),
        ("https://app.example.com.evil.test", "PUT", "x-token", 204),
        ("https://app.test", "PUT", "x-secret", 204),
        ("https://app.test", "DELETE", "x-token", 404),
    ] {
        let (status, headers, _) = request(
            web,
            "OPTIONS",
            "/api/items",
            &[
                ("origin", origin),
                ("access-control-request-method", method),
                ("access-control-request-headers", asked),
            ],
        )
        .await;
        assert_eq!(status, want, "{origin} {method} {asked}");
        for name in [
            "access-control-allow-origin",
            "access-control-allow-methods",
            "access-control-allow-credentials",
        ] {
            assert!(
                headers.get(name).is_none(),
                "{origin} {method} {asked}: {name}"
            );
        }
    }
    // The actual request goes through quota and auth, and its answer is
    // marked for an allowed origin only.
    let (status, headers, _) =
        request(web, "GET", "/api/items", &[("origin", "https://app.test")]).await;
    assert_eq!(status, 200);
    assert_eq!(headers["access-control-allow-origin"], "https://app.test");
    assert_eq!(headers["access-control-expose-headers"], "x-backend");
    assert_eq!(headers["access-control-allow-credentials"], "true");
    let (status, headers, _) =
        request(web, "GET", "/api/items", &[("origin", "https://evil.test")]).await;
    assert_eq!(status, 200);
    assert!(headers.get("access-control-allow-origin").is_none());
    assert!(headers.get_all("vary").iter().any(|v| v == "origin"));
    let (status, _, _) = request(web, "GET", "/api/items", &[("origin", "https://app.test")]).await;
    assert_eq!(
        status, 429,
        "the quota's burst of 2 is spent by real requests only"
    );

    // `*` without credentials: a constant answer, no Vary.
    let (status, headers, _) = request(
        web,
        "GET",
        "/public/x",
        &[("origin", "https://anyone.test")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["access-control-allow-origin"], "*");
    assert!(headers.get("vary").is_none());
    // A request without Origin is not a CORS request: nothing added.
    let (_, headers, _) = request(web, "GET", "/public/x", &[]).await;
    assert!(headers.get("access-control-allow-origin").is_none());

    // `*` with credentials is refused at validation.
    let bad = cors_config(backend.addr, "https://app.test").replace(
        r#"allow_origins = ["*"]"#,
        r#"allow_origins = ["*"], allow_credentials = true"#,
    );
    let (status, body) = activate_with(&gw, &bad, "").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("Fetch standard"), "{body}");
}

/// The page's own server (its address is its origin) and the page it
/// serves, written once the gateway's address is known.
async fn page_site() -> (Backend, std::sync::Arc<std::sync::Mutex<String>>) {
    let page = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let served = std::sync::Arc::clone(&page);
    let site = Backend::start(std::sync::Arc::new(move |_req| {
        let html = served.lock().unwrap().clone();
        Box::pin(async move {
            let mut response = hyper::Response::new(full(html));
            response
                .headers_mut()
                .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
            response
        })
    }))
    .await;
    (site, page)
}

/// Chromium, or `None` having said why the test skips.
fn chromium() -> Option<std::path::PathBuf> {
    let found = crate::observability::installed("chromium");
    if found.is_none() {
        eprintln!(
            "SKIPPED: chromium is not installed (apt-get install chromium; .ci/run installs it)"
        );
    }
    found
}

/// The DOM of `origin`'s page once headless Chromium ran its script.
async fn page_in_chromium(chromium: std::path::PathBuf, origin: &str) -> String {
    let out = headless_dom(chromium, format!("{origin}/")).await;
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && dom.contains("<html"),
        "chromium failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

/// A page on one origin fetches from the gateway on another, with a
/// method and a header that make the browser send a preflight first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_browser_makes_a_preflighted_cross_origin_fetch() {
    let Some(chromium) = chromium() else {
        return;
    };
    let backend = echo_backend().await;
    let (site, page) = page_site().await;
    let origin = format!("http://{}", site.addr);
    let config = Config::new()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener("web", "")
        .route(
            "api",
            &format!(
                r#"listeners = ["web"]
path_prefix = "/api/"
methods = ["PUT"]
upstream = "app"
cors = {{ allow_origins = ["{origin}"], allow_methods = ["PUT"], allow_headers = ["x-token", "content-type"], expose_headers = ["x-backend"] }}"#
            ),
        )
        .route(
            "closed",
            r#"listeners = ["web"]
path_prefix = "/closed/"
upstream = "app"
cors = { allow_origins = ["https://somewhere.else"], allow_methods = ["PUT"], allow_headers = ["x-token"] }"#,
        )
        .upstream("app", &[backend.addr], "")
        .build();
    let gw = Gateway::start(&config);
    let api = format!("http://{}", gw.listener("web"));
    *page.lock().unwrap() = format!(
        r#"<!doctype html><html><body><p id="allowed">pending</p><p id="refused">pending</p><script>
const ask = (path, id) => fetch("{api}" + path, {{ method: "PUT", headers: {{ "x-token": "t1", "content-type": "application/json" }}, body: "{{}}" }})
  .then(r => r.text().then(t => {{ document.getElementById(id).textContent = "status " + r.status + " backend " + r.headers.get("x-backend") + " echoed " + t.split("\n")[0]; }}))
  .catch(e => {{ document.getElementById(id).textContent = "failed " + e.name; }});
ask("/api/items", "allowed").then(() => ask("/closed/items", "refused"));
</script></body></html>"#
    );
    let dom = page_in_chromium(chromium, &origin).await;
    assert!(
        dom.contains(r#"<p id="allowed">status 200 backend echo echoed PUT /api/items</p>"#),
        "{dom}"
    );
    assert!(
        dom.contains(r#"<p id="refused">failed TypeError</p>"#),
        "{dom}"
    );
    // The browser's preflights were answered by the gateway.
    let lines = access_lines(&gw.path("access.log"), 3).await;
    let preflights: Vec<_> = lines
        .iter()
        .filter(|l| l["method"] == "OPTIONS")
        .map(|l| {
            (
                l["route"].as_str().unwrap_or("-").to_owned(),
                l["status"].as_u64(),
            )
        })
        .collect();
    assert!(
        preflights.contains(&("api".to_owned(), Some(204))),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["backend"].is_null() || l["method"] != "OPTIONS"),
        "{lines:?}"
    );
}

/// A preflight for a method no route serves (issue 56 item 4) is answered
/// by the listener's default `cors`, and the 404 that follows is marked:
/// the page reads "404" instead of a CORS failure. A method the default
/// does not allow is still refused at the preflight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_reads_the_404_of_a_method_no_route_serves() {
    let Some(chromium) = chromium() else {
        return;
    };
    let backend = echo_backend().await;
    let (site, page) = page_site().await;
    let origin = format!("http://{}", site.addr);
    let config = Config::new()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener(
            "web",
            &format!(
                r#"defaults = {{ cors = {{ allow_origins = ["{origin}"], allow_methods = ["PUT", "DELETE"], allow_headers = ["x-token"] }} }}"#
            ),
        )
        .route(
            "api",
            r#"listeners = ["web"]
path_prefix = "/api/"
methods = ["PUT"]
upstream = "app""#,
        )
        .upstream("app", &[backend.addr], "")
        .build();
    let gw = Gateway::start(&config);
    let api = format!("http://{}", gw.listener("web"));
    *page.lock().unwrap() = format!(
        r#"<!doctype html><html><body><p id="unrouted">pending</p><p id="refused">pending</p><script>
const ask = (method, id) => fetch("{api}/api/items", {{ method, headers: {{ "x-token": "t1" }} }})
  .then(r => {{ document.getElementById(id).textContent = "status " + r.status; }})
  .catch(e => {{ document.getElementById(id).textContent = "failed " + e.name; }});
ask("DELETE", "unrouted").then(() => ask("PATCH", "refused"));
</script></body></html>"#
    );
    let dom = page_in_chromium(chromium, &origin).await;
    assert!(dom.contains(r#"<p id="unrouted">status 404</p>"#), "{dom}");
    assert!(
        dom.contains(r#"<p id="refused">failed TypeError</p>"#),
        "{dom}"
    );
    // The gateway answered the preflights itself: no route, 204.
    let lines = access_lines(&gw.path("access.log"), 3).await;
    let answered = lines
        .iter()
        .filter(|l| l["method"] == "OPTIONS" && l["status"] == 204 && l["route"].is_null())
        .count();
    assert_eq!(answered, 2, "{lines:?}");
}

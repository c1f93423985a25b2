//! A route's `cache` (issue 57) through the real binary, against a
//! backend that counts what reaches it. Each test names the RFC 9111
//! (and RFC 9211) section it holds the gateway to:
//!
//! | section | test |
//! |---|---|
//! | §4.2.1 freshness (`max-age`), §5.1 `Age`, RFC 9211 `hit` | `a_fresh_answer_is_served_from_the_zone_with_its_age` |
//! | §5.2.2.5 `no-store`, §5.2.2.7 `private` | `what_the_backend_forbids_is_not_kept` |
//! | §3.5 `Authorization` | `authorized_requests_are_kept_only_where_the_answer_allows` |
//! | §4.1 `Vary` | `vary_keeps_a_variant_per_value` |
//! | §4.3 validation, §4.3.4 304 merging | `a_stale_answer_is_revalidated_and_a_304_freshens_it` |
//! | RFC 9110 §9.3.2 `HEAD` from a stored `GET` | `head_is_answered_from_a_stored_get` |
//! | §4.4 invalidation by unsafe methods | `a_post_forgets_what_was_kept_for_its_uri` |
//! | coalescing (issue 57 item 3) | `a_hundred_concurrent_misses_make_one_upstream_request` |
//! | generation semantics (item 6) | `a_rewrite_makes_its_own_keys` |
//! | purge by key, prefix, surrogate key; views (item 4) | `purges_by_key_prefix_and_tag_are_recorded_and_counted` |
//! | RFC 5861 `stale-if-error`, §4.2.4 (item 3) | `stale_if_error_answers_while_the_backend_is_killed` |
//! | RFC 5861 `stale-while-revalidate`: one background refresh (item 3) | `stale_while_revalidate_answers_now_and_refreshes_once` |
//! | §4.2.2 (`ttl_default` in place of the heuristic), `methods` | `ttl_default_and_methods` |
//! | RFC 9110 §14 ranges from a stored object, §13.1.5 `If-Range` | `ranges_are_answered_from_a_stored_object` |
//! | `key`: query parameters left out, headers added; purge by key names every variant | `a_route_key_leaves_out_and_adds` |
//! | listener `defaults`, `cache = "none"` | `a_listener_default_caches_routes_that_set_none` |
//! | disk zones across a restart and a drain-aware upgrade; a damaged file is a miss (item 1, 5) | `disk_objects_survive_a_restart_and_an_upgrade` |

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::harness::*;

/// What reached the backend, by path, and the headers of the last
/// request for each.
#[derive(Default)]
struct Seen {
    counts: Mutex<HashMap<String, u64>>,
    last: Mutex<HashMap<String, http::HeaderMap>>,
}

impl Seen {
    fn count(&self, path: &str) -> u64 {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn last(&self, path: &str) -> Option<http::HeaderMap> {
        self.last.lock().unwrap().get(path).cloned()
    }
}

/// Answers by path: `/fresh` max-age=60; `/nostore`; `/private`;
/// `/public` (public, max-age=60); `/vary` (by Accept-Language);
/// `/etag` (max-age=1, an ETag, 304 to a matching If-None-Match);
/// `/slow` (max-age=60 after 300 ms). The body names the path and how
/// many times it was asked.
async fn counting_backend(seen: Arc<Seen>) -> Backend {
    Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            let path = req.uri().path().to_owned();
            let n = {
                let mut counts = seen.counts.lock().unwrap();
                let n = counts.entry(path.clone()).or_default();
                *n += 1;
                *n
            };
            seen.last
                .lock()
                .unwrap()
                .insert(path.clone(), req.headers().clone());
            let mut response = hyper::Response::new(full(format!("{path} #{n}")));
            let headers = response.headers_mut();
            let cache_control = match path.as_str() {
                "/nostore" => "no-store",
                "/private" => "private, max-age=60",
                "/public" => "public, max-age=60",
                "/etag" | "/swr" | "/sie" | "/sie-plain" => "max-age=1",
                _ => "max-age=60",
            };
            if !path.ends_with("/silent") {
                headers.insert("cache-control", cache_control.parse().unwrap());
            }
            if path == "/vary" {
                headers.insert("vary", "accept-language".parse().unwrap());
                let language = req
                    .headers()
                    .get("accept-language")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                *response.body_mut() = full(format!("{language} #{n}"));
            }
            if path == "/etag" {
                response
                    .headers_mut()
                    .insert("etag", "\"v1\"".parse().unwrap());
                if req
                    .headers()
                    .get("if-none-match")
                    .is_some_and(|v| v == "\"v1\"")
                {
                    *response.status_mut() = http::StatusCode::NOT_MODIFIED;
                    *response.body_mut() = full("");
                }
            }
            // `/tagged/<letter>…`: the surrogate key `product-<letter>`.
            if let Some(rest) = path.strip_prefix("/tagged/") {
                let tag = format!("product-{}", rest.get(..1).unwrap_or("none"));
                response
                    .headers_mut()
                    .insert("surrogate-key", tag.parse().unwrap());
            }
            // A refresh that takes a while: stale answers go on meanwhile.
            if path == "/swr" && n > 1 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            if path == "/slow" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            response
        })
    }))
    .await
}

fn cache_config(backend: std::net::SocketAddr, extra_routes: &str) -> String {
    cache_builder(backend, extra_routes).build()
}

fn cache_builder(backend: std::net::SocketAddr, extra_routes: &str) -> Config {
    Config::new()
        .listener("web", "")
        .route(
            "cached",
            "listeners = [\"web\"]\npath_prefix = \"/\"\nupstream = \"app\"\ncache = { zone = \"main\" }",
        )
        .text(extra_routes)
        .upstream("app", &[backend], "")
        .text("[cache.zones.main]\nmemory = \"16MiB\"\n")
}

async fn ask(
    gw: &Gateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "app.test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let (status, headers, body) = send(
        gw.listener("web"),
        req.body(Full::new(Bytes::new())).unwrap(),
    )
    .await
    .expect("answered");
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn cache_status(headers: &http::HeaderMap) -> &str {
    headers
        .get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_answer_is_served_from_the_zone_with_its_age() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    let (status, headers, body) = ask(&gw, "GET", "/fresh?q=1", &[]).await;
    assert_eq!((status, body.as_str()), (200, "/fresh #1"));
    assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, headers, body) = ask(&gw, "GET", "/fresh?q=1", &[]).await;
    assert_eq!((status, body.as_str()), (200, "/fresh #1"), "from the zone");
    assert_eq!(cache_status(&headers), "cutover; hit");
    assert!(
        headers["age"].to_str().unwrap().parse::<u64>().unwrap() >= 1,
        "{headers:?}"
    );
    // Another query is another resource.
    let (_, headers, body) = ask(&gw, "GET", "/fresh?q=2", &[]).await;
    assert_eq!(body, "/fresh #2");
    assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    assert_eq!(seen.count("/fresh"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_backend_forbids_is_not_kept() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    for path in ["/nostore", "/private"] {
        for n in 1..=3 {
            let (_, headers, body) = ask(&gw, "GET", path, &[]).await;
            assert_eq!(body, format!("{path} #{n}"));
            assert_eq!(cache_status(&headers), "cutover; fwd=miss", "{path}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorized_requests_are_kept_only_where_the_answer_allows() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    let token = [("authorization", "Bearer x")];
    for _ in 0..2 {
        ask(&gw, "GET", "/fresh", &token).await;
        ask(&gw, "GET", "/public", &token).await;
    }
    assert_eq!(
        seen.count("/fresh"),
        2,
        "max-age alone: not for a shared cache"
    );
    assert_eq!(seen.count("/public"), 1, "public: kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_keeps_a_variant_per_value() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    for _ in 0..3 {
        let (_, _, en) = ask(&gw, "GET", "/vary", &[("accept-language", "en")]).await;
        let (_, _, fr) = ask(&gw, "GET", "/vary", &[("accept-language", "fr")]).await;
        assert_eq!((en.as_str(), fr.as_str()), ("en #1", "fr #2"));
    }
    assert_eq!(seen.count("/vary"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_answer_is_revalidated_and_a_304_freshens_it() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    let (_, _, body) = ask(&gw, "GET", "/etag", &[]).await;
    assert_eq!(body, "/etag #1");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, headers, body) = ask(&gw, "GET", "/etag", &[]).await;
    assert_eq!((status, body.as_str()), (200, "/etag #1"), "the kept body");
    assert_eq!(cache_status(&headers), "cutover; fwd=stale; fwd-status=304");
    let sent = seen.last("/etag").unwrap();
    assert_eq!(sent["if-none-match"], "\"v1\"", "validated with its ETag");
    // Freshened: a hit again.
    let (_, headers, _) = ask(&gw, "GET", "/etag", &[]).await;
    assert_eq!(cache_status(&headers), "cutover; hit");
    assert_eq!(seen.count("/etag"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_answered_from_a_stored_get() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    ask(&gw, "GET", "/fresh", &[]).await;
    let (status, headers, body) = ask(&gw, "HEAD", "/fresh", &[]).await;
    assert_eq!((status, body.as_str()), (200, ""));
    assert_eq!(cache_status(&headers), "cutover; hit");
    assert_eq!(headers["content-length"], "9", "the GET's length");
    // A HEAD first asks for the whole object and keeps it.
    let (_, headers, body) = ask(&gw, "HEAD", "/other", &[]).await;
    assert_eq!(
        (body.as_str(), cache_status(&headers)),
        ("", "cutover; fwd=miss; stored")
    );
    let mut body = String::new();
    for _ in 0..50 {
        let (_, headers, got) = ask(&gw, "GET", "/other", &[]).await;
        if cache_status(&headers) == "cutover; hit" {
            body = got;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(body, "/other #1");
    assert_eq!(seen.count("/other"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_forgets_what_was_kept_for_its_uri() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    ask(&gw, "GET", "/fresh", &[]).await;
    ask(&gw, "GET", "/fresh", &[]).await;
    assert_eq!(seen.count("/fresh"), 1);
    let (_, headers, _) = ask(&gw, "POST", "/fresh", &[]).await;
    assert_eq!(cache_status(&headers), "cutover; fwd=bypass");
    let (_, _, body) = ask(&gw, "GET", "/fresh", &[]).await;
    assert_eq!(body, "/fresh #3", "asked again after the POST");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_misses_make_one_upstream_request() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Arc::new(Gateway::start(&cache_config(backend.addr, "")));
    let asks: Vec<_> = (0..100)
        .map(|_| {
            let gw = Arc::clone(&gw);
            tokio::spawn(async move { ask(&gw, "GET", "/slow", &[]).await })
        })
        .collect();
    for asked in asks {
        let (status, _, body) = asked.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "/slow #1"));
    }
    assert_eq!(seen.count("/slow"), 1, "one upstream request");
}

/// A zone counts requests by outcome, as the route metrics do (issue
/// 70 item 5), not look-ups: a coalesced burst is one miss and 49
/// answered without the upstream, a second `Vary` variant and a 304
/// refresh evict nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_counters_count_requests_as_the_route_metrics_do() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Arc::new(Gateway::start(
        &cache_builder(backend.addr, "").metrics().build(),
    ));
    let asks: Vec<_> = (0..50)
        .map(|_| {
            let gw = Arc::clone(&gw);
            tokio::spawn(async move { ask(&gw, "GET", "/slow", &[]).await.0 })
        })
        .collect();
    for asked in asks {
        assert_eq!(asked.await.unwrap(), 200);
    }
    assert_eq!(seen.count("/slow"), 1);
    for language in ["en", "de", "en", "de"] {
        ask(&gw, "GET", "/vary", &[("accept-language", language)]).await;
    }
    assert_eq!(seen.count("/vary"), 2);
    ask(&gw, "GET", "/etag", &[]).await;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let (_, headers, _) = ask(&gw, "GET", "/etag", &[]).await;
        assert_eq!(cache_status(&headers), "cutover; fwd=stale; fwd-status=304");
    }
    let (status, view) = admin_request(gw.admin, "GET", "/admin/cache", None, None).await;
    assert_eq!(status, 200, "{view}");
    let zone = &view["zones"][0];
    let metrics = scrape(&gw).await;
    for outcome in ["hit", "miss", "revalidated", "collapsed", "stale", "bypass"] {
        let metric = sample(
            &metrics,
            "cutover_cache_requests_total",
            &["route=\"cached\"", &format!("status=\"{outcome}\"")],
        );
        assert_eq!(
            zone["requests"][outcome].as_f64(),
            Some(metric),
            "{outcome}: {zone} against {metrics}"
        );
    }
    // 57 requests looked up: 4 misses and 2 revalidations went upstream,
    // 51 were answered from the zone (49 of the burst, 2 variants).
    assert_eq!(
        (zone["hits"].as_u64(), zone["misses"].as_u64()),
        (Some(51), Some(6)),
        "{zone}"
    );
    assert_eq!(zone["revalidated"], 2, "{zone}");
    assert_eq!(zone["evicted"], 0, "{zone}");
    assert_eq!(
        sample(
            &metrics,
            "cutover_cache_evictions_total",
            &["zone=\"main\""]
        ),
        0.0
    );
    let (code, out, err) = ctl(&gw.admin_url(), &["cache", "show"]);
    assert_eq!(code, Some(0), "{err}");
    let line = out.lines().find(|l| l.starts_with("main ")).unwrap_or("");
    assert_eq!(line.split_whitespace().nth(5), Some("89.5"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_makes_its_own_keys() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let rewritten = "\n[[routes]]\nname = \"v2\"\nlisteners = [\"web\"]\npath_prefix = \"/v2/\"\nupstream = \"app\"\nrewrite = { strip_prefix = \"/v2\" }\ncache = { zone = \"main\" }\n";
    let gw = Gateway::start(&cache_config(backend.addr, rewritten));
    // `/v2/fresh` is sent upstream as `/fresh`: the same key as `/fresh`.
    let (_, _, direct) = ask(&gw, "GET", "/fresh", &[]).await;
    let (_, headers, through) = ask(&gw, "GET", "/v2/fresh", &[]).await;
    assert_eq!(
        (direct.as_str(), through.as_str()),
        ("/fresh #1", "/fresh #1")
    );
    assert_eq!(cache_status(&headers), "cutover; hit");
    // Changed to strip nothing, the route sends `/v2/fresh`: another key.
    let changed = cache_config(
        backend.addr,
        &rewritten.replace("strip_prefix = \"/v2\"", "strip_prefix = \"/none\""),
    );
    assert_eq!(activate_status(&gw, &changed).await, 200);
    let (_, headers, body) = ask(&gw, "GET", "/v2/fresh", &[]).await;
    assert_eq!(body, "/v2/fresh #1");
    assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_by_key_prefix_and_tag_are_recorded_and_counted() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let config = cache_builder(backend.addr, "")
        .metrics()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .build();
    let gw = Gateway::start(&config);
    let paths = [
        "/fresh",
        "/static/a",
        "/static/b",
        "/tagged/x1",
        "/tagged/y1",
    ];
    for path in paths {
        let (_, headers, _) = ask(&gw, "GET", path, &[]).await;
        assert_eq!(
            cache_status(&headers),
            "cutover; fwd=miss; stored",
            "{path}"
        );
        let (_, headers, _) = ask(&gw, "GET", path, &[]).await;
        assert_eq!(cache_status(&headers), "cutover; hit", "{path}");
    }
    let admin = gw.admin;
    let (status, view) = admin_request(admin, "GET", "/admin/cache", None, None).await;
    assert_eq!(status, 200, "{view}");
    let zone = &view["zones"][0];
    assert_eq!(zone["name"], "main");
    assert_eq!(zone["objects"], 5);
    assert_eq!(zone["hits"], 5);
    assert_eq!(zone["routes"], serde_json::json!(["cached"]));
    assert!(zone["bytes"].as_u64().unwrap() > 0);
    assert_eq!(zone["capacity_bytes"], 16 << 20);

    // By key: the host and the path (every upstream's object), or with
    // the upstream (that one's).
    let (status, purged) = post_json(
        admin,
        "/admin/cache/purge",
        serde_json::json!({ "key": "app.test /fresh", "requested_by": "ci" }),
    )
    .await;
    assert_eq!(
        (status, purged["purged"].as_u64()),
        (200, Some(1)),
        "{purged}"
    );
    let operation = purged["operation_id"].as_str().unwrap().to_owned();
    let (_, record) = admin_request(
        admin,
        "GET",
        &format!("/admin/runtime/operations/{operation}"),
        None,
        None,
    )
    .await;
    assert_eq!(record["kind"], "cache_purge", "{record}");
    assert_eq!(record["requested_by"], "ci");
    assert!(
        record["summary"]
            .as_str()
            .unwrap()
            .contains("1 objects purged by key"),
        "{record}"
    );
    let (_, _, body) = ask(&gw, "GET", "/fresh", &[]).await;
    assert_eq!(body, "/fresh #2", "asked again");
    let (_, purged) = post_json(
        admin,
        "/admin/cache/purge",
        serde_json::json!({ "zone": "main", "key": "app.test /fresh app" }),
    )
    .await;
    assert_eq!(purged["purged"], 1, "the exact key");

    // By prefix of keys.
    let (_, purged) = post_json(
        admin,
        "/admin/cache/purge",
        serde_json::json!({ "prefix": "app.test /static/" }),
    )
    .await;
    assert_eq!(purged["purged"], 2, "{purged}");
    // By surrogate key.
    let (_, purged) = post_json(
        admin,
        "/admin/cache/purge",
        serde_json::json!({ "tag": "product-x" }),
    )
    .await;
    assert_eq!(purged["purged"], 1, "{purged}");
    let (_, headers, _) = ask(&gw, "GET", "/tagged/y1", &[]).await;
    assert_eq!(cache_status(&headers), "cutover; hit", "another tag stays");
    let (_, headers, body) = ask(&gw, "GET", "/tagged/x1", &[]).await;
    assert_eq!(
        (body.as_str(), cache_status(&headers)),
        ("/tagged/x1 #2", "cutover; fwd=miss; stored")
    );
    for path in ["/static/a", "/static/b"] {
        let (_, _, body) = ask(&gw, "GET", path, &[]).await;
        assert_eq!(body, format!("{path} #2"));
    }

    // Refusals: two selectors, none, an unknown zone, not JSON.
    for (body, expected) in [
        (serde_json::json!({ "key": "a", "tag": "b" }), 400),
        (serde_json::json!({ "zone": "main" }), 400),
        (serde_json::json!({ "prefix": "" }), 400),
        (serde_json::json!({ "tag": "t", "zone": "nope" }), 404),
        (serde_json::json!({ "tag": "t", "zones": "main" }), 400),
    ] {
        let (status, answer) = post_json(admin, "/admin/cache/purge", body.clone()).await;
        assert_eq!(status, expected, "{body}: {answer}");
    }
    let (status, _) = admin_request(
        admin,
        "POST",
        "/admin/cache/purge",
        Some("text/plain"),
        Some("tag=t".into()),
    )
    .await;
    assert_eq!(status, 415);

    // Counted: by route and status, and the zone's use.
    let metrics = scrape(&gw).await;
    let hits = sample(
        &metrics,
        "cutover_cache_requests_total",
        &["route=\"cached\"", "status=\"hit\""],
    );
    let misses = sample(
        &metrics,
        "cutover_cache_requests_total",
        &["route=\"cached\"", "status=\"miss\""],
    );
    assert_eq!((hits, misses), (6.0, 9.0), "{metrics}");
    assert_eq!(
        sample(&metrics, "cutover_cache_objects", &["zone=\"main\""]),
        4.0
    );
    assert_eq!(
        sample(&metrics, "cutover_cache_purged_total", &["zone=\"main\""]),
        5.0
    );
    assert!(sample(&metrics, "cutover_cache_bytes", &["zone=\"main\""]) > 0.0);
    // And in the access log.
    let lines = access_lines(&gw.path("access.log"), 15).await;
    let outcomes: Vec<&str> = lines.iter().filter_map(|l| l["cache"].as_str()).collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == "hit").count(),
        6,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == "miss").count(),
        9,
        "{outcomes:?}"
    );

    // The same from a pipeline: `cutover ctl cache show` and `purge`.
    let admin = gw.admin_url();
    let (code, out, err) = ctl(&admin, &["cache", "show"]);
    assert_eq!(code, Some(0), "{err}");
    let zone_line = out.lines().find(|l| l.starts_with("main ")).unwrap_or("");
    let columns: Vec<&str> = zone_line.split_whitespace().collect();
    // zone, MiB, objects, hits, misses, hit %, stored, evicted, purged, routes
    assert_eq!(
        (
            columns.get(2),
            columns.get(3),
            columns.get(4),
            columns.get(9)
        ),
        (Some(&"4"), Some(&"6"), Some(&"9"), Some(&"cached")),
        "{out}"
    );
    let (code, out, err) = ctl(
        &admin,
        &[
            "cache",
            "purge",
            "--tag",
            "product-y",
            "--reason",
            "release 42",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("purged 1 keys (main 1) (op-"), "{out}");
    let (_, headers, _) = ask(&gw, "GET", "/tagged/y1", &[]).await;
    assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    let (code, _, err) = ctl(&admin, &["cache", "purge", "--tag", "t", "--zone", "nope"]);
    assert_eq!(code, Some(1), "an unknown zone is refused: {err}");
    assert!(err.contains("404 unknown_zone"), "{err}");
    for two_or_none in [
        &["cache", "purge"][..],
        &["cache", "purge", "--key", "a", "--tag", "b"],
    ] {
        let (code, _, err) = ctl(&admin, two_or_none);
        assert_eq!(code, Some(2), "{two_or_none:?}: {err}");
    }
}

/// A backend that can be killed: its listener and every connection it
/// holds close at once, as when its process dies (the port then refuses).
struct Killable {
    addr: std::net::SocketAddr,
    tasks: Arc<Mutex<tokio::task::JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Killable {
    async fn start(seen: Arc<Seen>) -> Killable {
        // The counting backend's answers, served here.
        let inner = counting_backend(seen).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks = Arc::new(Mutex::new(tokio::task::JoinSet::new()));
        let held = Arc::clone(&tasks);
        let target = inner.addr;
        let accept = tokio::spawn(async move {
            let _inner = inner;
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                held.lock().unwrap().spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Killable {
            addr,
            tasks,
            accept,
        }
    }

    fn kill(&self) {
        self.accept.abort();
        self.tasks.lock().unwrap().abort_all();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_answers_while_the_backend_is_killed() {
    let seen = Arc::new(Seen::default());
    let backend = Killable::start(Arc::clone(&seen)).await;
    let plain = "\n[[routes]]\nname = \"plain\"\nlisteners = [\"web\"]\npath_prefix = \"/sie-plain\"\nupstream = \"app\"\ncache = { zone = \"main\" }\n";
    // The first route (`cached`) has the window; `plain` has none.
    let config = cache_config(backend.addr, plain).replacen(
        "cache = { zone = \"main\" }",
        "cache = { zone = \"main\", stale_if_error = \"3s\" }",
        1,
    );
    assert!(config.contains("stale_if_error"), "{config}");
    let gw = Gateway::start(&config);
    for path in ["/sie", "/sie-plain"] {
        let (_, headers, _) = ask(&gw, "GET", path, &[]).await;
        assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    }
    backend.kill();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Stale (max-age=1) and the upstream gone: every request within the
    // route's 3 s is answered from the zone.
    let started = std::time::Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let (status, headers, body) = ask(&gw, "GET", "/sie", &[]).await;
        assert_eq!((status, body.as_str()), (200, "/sie #1"));
        assert_eq!(
            cache_status(&headers),
            "cutover; fwd=stale; detail=stale-if-error"
        );
        assert!(headers["age"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
        answered += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered > 20, "{answered}");
    // A route without the window answers the failure.
    let (status, _, _) = ask(&gw, "GET", "/sie-plain", &[]).await;
    assert_eq!(status, 502);
    // Past the window: the failure too.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let (status, headers, _) = ask(&gw, "GET", "/sie", &[]).await;
    assert_eq!(status, 502, "{headers:?}");
    assert_eq!(seen.count("/sie"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_answers_now_and_refreshes_once() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let config = cache_config(backend.addr, "").replace(
        "cache = { zone = \"main\" }",
        "cache = { zone = \"main\", stale_while_revalidate = \"30s\" }",
    );
    let gw = Arc::new(Gateway::start(&config));
    ask(&gw, "GET", "/swr", &[]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Stale: 20 concurrent requests are answered from the zone at once,
    // while one refresh (300 ms at the backend) runs in the background.
    let started = std::time::Instant::now();
    let asks: Vec<_> = (0..20)
        .map(|_| {
            let gw = Arc::clone(&gw);
            tokio::spawn(async move { ask(&gw, "GET", "/swr", &[]).await })
        })
        .collect();
    for asked in asks {
        let (status, headers, body) = asked.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "/swr #1"));
        assert_eq!(
            cache_status(&headers),
            "cutover; hit; detail=stale-while-revalidate"
        );
    }
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "answered before the refresh came back: {:?}",
        started.elapsed()
    );
    // The refresh lands: a fresh hit with the new body.
    let mut body = String::new();
    for _ in 0..100 {
        let (_, headers, got) = ask(&gw, "GET", "/swr", &[]).await;
        if cache_status(&headers) == "cutover; hit" {
            body = got;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(body, "/swr #2");
    assert_eq!(seen.count("/swr"), 2, "one background refresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_default_and_methods() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let config = cache_config(backend.addr, "").replace(
        "cache = { zone = \"main\" }",
        "cache = { zone = \"main\", ttl_default = \"1m\", methods = [\"GET\"] }",
    );
    let gw = Gateway::start(&config);
    // No Cache-Control, no Expires, no Last-Modified: kept for a minute.
    let (_, headers, _) = ask(&gw, "GET", "/silent", &[]).await;
    assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    let (_, headers, body) = ask(&gw, "GET", "/silent", &[]).await;
    assert_eq!(
        (body.as_str(), cache_status(&headers)),
        ("/silent #1", "cutover; hit")
    );
    assert!(
        !headers.contains_key("cache-control"),
        "clients see what the backend said: {headers:?}"
    );
    // HEAD is not in `methods`: it goes upstream.
    let (_, headers, _) = ask(&gw, "HEAD", "/silent", &[]).await;
    assert_eq!(cache_status(&headers), "cutover; fwd=bypass");
    assert_eq!(seen.count("/silent"), 2);
    // Without ttl_default the same answer is not kept.
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    for _ in 0..2 {
        ask(&gw, "GET", "/silent", &[]).await;
    }
    assert_eq!(seen.count("/silent"), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_are_answered_from_a_stored_object() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let gw = Gateway::start(&cache_config(backend.addr, ""));
    // A miss for a middle range goes upstream as it is, and is not kept.
    let (_, headers, _) = ask(&gw, "GET", "/video", &[("range", "bytes=2-5")]).await;
    assert_eq!(cache_status(&headers), "cutover; fwd=miss");
    assert_eq!(seen.last("/video").unwrap()["range"], "bytes=2-5");
    // From the first byte: the whole object is fetched and kept.
    let (status, headers, body) = ask(&gw, "GET", "/video", &[("range", "bytes=0-")]).await;
    assert_eq!((status, body.as_str()), (200, "/video #2"));
    assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    assert!(!seen.last("/video").unwrap().contains_key("range"));
    // Now from the zone.
    let (status, headers, body) = ask(&gw, "GET", "/video", &[("range", "bytes=2-5")]).await;
    assert_eq!((status, body.as_str()), (206, "ideo"));
    assert_eq!(headers["content-range"], "bytes 2-5/9");
    assert_eq!(headers["content-length"], "4");
    assert_eq!(cache_status(&headers), "cutover; hit");
    let (status, _, body) = ask(&gw, "GET", "/video", &[("range", "bytes=-2")]).await;
    assert_eq!((status, body.as_str()), (206, "#2"));
    let (status, headers, body) = ask(&gw, "GET", "/video", &[("range", "bytes=9-")]).await;
    assert_eq!((status, body.as_str()), (416, ""));
    assert_eq!(headers["content-range"], "bytes */9");
    // Several ranges, or an If-Range that does not match: the whole.
    for extra in [
        [("range", "bytes=0-1,3-4"), ("x-none", "")],
        [("range", "bytes=0-1"), ("if-range", "\"other\"")],
    ] {
        let (status, _, body) = ask(&gw, "GET", "/video", &extra).await;
        assert_eq!((status, body.as_str()), (200, "/video #2"), "{extra:?}");
    }
    assert_eq!(seen.count("/video"), 2);
}

/// The zone's view (`GET /admin/cache`).
async fn zone_view(gw: &Gateway) -> serde_json::Value {
    let (status, view) = admin_request(gw.admin, "GET", "/admin/cache", None, None).await;
    assert_eq!(status, 200, "{view}");
    view["zones"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_objects_survive_a_restart_and_an_upgrade() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let state = tempfile::tempdir().unwrap();
    let config = cache_builder(backend.addr, "")
        .runtime(&format!("state_dir = \"{}\"", state.path().display()))
        .build()
        .replace(
            "memory = \"16MiB\"\n",
            "memory = \"16MiB\"\ndisk = { path = \"cache/main\", size = \"64MiB\" }\n",
        );
    let gw = Gateway::start(&config);
    for path in ["/fresh", "/public"] {
        let (_, headers, _) = ask(&gw, "GET", path, &[]).await;
        assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    }
    for _ in 0..200 {
        if zone_view(&gw).await["disk"]["written"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let disk = zone_view(&gw).await["disk"].clone();
    assert_eq!(disk["written"], 2, "{disk}");
    assert!(disk["bytes"].as_u64().unwrap() > 0);
    assert!(disk["path"].as_str().unwrap().ends_with("cache/main"));

    // A drain-aware upgrade: the new process answers from the files.
    let op = crate::lifecycle::upgrade(&gw, None).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    let (_, headers, body) = ask(&gw, "GET", "/fresh", &[]).await;
    assert_eq!(
        (body.as_str(), cache_status(&headers)),
        ("/fresh #1", "cutover; hit")
    );
    assert_eq!(zone_view(&gw).await["disk"]["read"], 1);

    // A restart: the same.
    drop(gw);
    let gw = Gateway::start(&config);
    let (_, headers, body) = ask(&gw, "GET", "/public", &[]).await;
    assert_eq!(
        (body.as_str(), cache_status(&headers)),
        ("/public #1", "cutover; hit")
    );
    assert_eq!(seen.count("/fresh") + seen.count("/public"), 2);

    // Damaged files (each cut short): misses, never served, removed.
    drop(gw);
    let mut damaged = 0;
    let mut stack = vec![state.path().join("cache/main")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "obj") {
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
                damaged += 1;
            }
        }
    }
    assert_eq!(damaged, 2);
    let gw = Gateway::start(&config);
    let (status, headers, body) = ask(&gw, "GET", "/fresh", &[]).await;
    assert_eq!((status, body.as_str()), (200, "/fresh #2"));
    assert_eq!(cache_status(&headers), "cutover; fwd=miss; stored");
    assert_eq!(zone_view(&gw).await["disk"]["corrupt"], 1);

    // Its folder is where the process found it: moving it is a restart.
    let moved = config.replace("cache/main", "cache/elsewhere");
    let (status, plan) = activate_with(&gw, &moved, "").await;
    assert_eq!(status, 422, "{plan}");
    assert!(
        plan["rejected"][0]["path"]
            .as_str()
            .unwrap_or_default()
            .contains("disk"),
        "{plan}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_key_leaves_out_and_adds() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let config = cache_config(backend.addr, "").replace(
        "cache = { zone = \"main\" }",
        "cache = { zone = \"main\", key = { headers = [\"x-tenant\"], query_exclude = [\"utm_source\"] } }",
    );
    let gw = Gateway::start(&config);
    let status = |headers: http::HeaderMap| cache_status(&headers).to_owned();
    let (_, h, _) = ask(&gw, "GET", "/fresh?a=1&utm_source=mail", &[]).await;
    assert_eq!(status(h), "cutover; fwd=miss; stored");
    // `utm_source` is not part of the key: the same object.
    for path in [
        "/fresh?a=1&utm_source=ads",
        "/fresh?a=1",
        "/fresh?utm_source=x&a=1",
    ] {
        let (_, h, body) = ask(&gw, "GET", path, &[]).await;
        assert_eq!(
            (body.as_str(), status(h).as_str()),
            ("/fresh #1", "cutover; hit"),
            "{path}"
        );
    }
    // `a` is.
    let (_, h, _) = ask(&gw, "GET", "/fresh?a=2", &[]).await;
    assert_eq!(status(h), "cutover; fwd=miss; stored");
    // So is `x-tenant`.
    let tenant = [("x-tenant", "t1")];
    let (_, h, body) = ask(&gw, "GET", "/fresh?a=1", &tenant).await;
    assert_eq!(
        (body.as_str(), status(h).as_str()),
        ("/fresh #3", "cutover; fwd=miss; stored")
    );
    let (_, h, _) = ask(&gw, "GET", "/fresh?a=1", &tenant).await;
    assert_eq!(status(h), "cutover; hit");
    // A purge by key names the object for every tenant.
    let (_, purged) = post_json(
        gw.admin,
        "/admin/cache/purge",
        serde_json::json!({ "key": "app.test /fresh?a=1" }),
    )
    .await;
    assert_eq!(purged["purged"], 2, "{purged}");
    assert_eq!(seen.count("/fresh"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_default_caches_routes_that_set_none() {
    let seen = Arc::new(Seen::default());
    let backend = counting_backend(Arc::clone(&seen)).await;
    let config = Config::new()
        .listener("web", "defaults = { cache = { zone = \"main\", ttl_default = \"1m\" } }")
        .route("plain", "listeners = [\"web\"]\npath_prefix = \"/\"\nupstream = \"app\"")
        .route(
            "out",
            "listeners = [\"web\"]\npath_prefix = \"/out/\"\nupstream = \"app\"\ncache = \"none\"",
        )
        .route(
            "own",
            "listeners = [\"web\"]\npath_prefix = \"/own/\"\nupstream = \"app\"\ncache = { zone = \"main\", methods = [\"GET\"] }",
        )
        .upstream("app", &[backend.addr], "")
        .text("[cache.zones.main]\nmemory = \"16MiB\"\n")
        .build();
    let gw = Gateway::start(&config);
    // The default: kept (its ttl_default too: `/silent` says nothing).
    for path in ["/fresh", "/silent"] {
        ask(&gw, "GET", path, &[]).await;
        let (_, headers, _) = ask(&gw, "GET", path, &[]).await;
        assert_eq!(cache_status(&headers), "cutover; hit", "{path}");
    }
    // `cache = "none"`: not looked up, no Cache-Status.
    for _ in 0..2 {
        let (_, headers, _) = ask(&gw, "GET", "/out/fresh", &[]).await;
        assert!(!headers.contains_key("cache-status"), "{headers:?}");
    }
    assert_eq!(seen.count("/out/fresh"), 2);
    // The route's own replaces the default whole: its `methods` hold,
    // and the default's ttl_default does not.
    let (_, headers, _) = ask(&gw, "HEAD", "/own/fresh", &[]).await;
    assert_eq!(cache_status(&headers), "cutover; fwd=bypass");
    for _ in 0..2 {
        ask(&gw, "GET", "/own/silent", &[]).await;
    }
    assert_eq!(seen.count("/own/silent"), 2);
}

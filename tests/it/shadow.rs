//! The shadow stage of an activation (DESIGN §22) through the real
//! binary, under live keep-alive traffic whose every answer is counted:
//! a candidate whose upstream answers 500 is refused (409
//! `shadow_breach`, the figures in the answer and the operation record)
//! while clients see no error; a healthy one passes and then takes the
//! guarded switch it also asked for; a candidate whose upstream hangs
//! costs bounded copies (dropped and timed out, counted); no traffic is
//! "no data" and `on_no_data` decides; an operator's abort stops a
//! stage; `ctl activate --shadow` prints the report and exits 6 on a
//! refusal.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;

fn shadow_config(app: &[std::net::SocketAddr], route: &str, upstream: &str) -> String {
    Config::new()
        .metrics()
        .listener("web", "")
        .route(
            route,
            "listeners = [\"web\"]\nupstream = \"app\"\ntimeout = \"1s\"",
        )
        .upstream("app", app, upstream)
        .build()
}

/// Activates `config` with `fields` (shadow, confirm_within, …) as JSON.
async fn activate_json(gw: &Gateway, config: &str, fields: Value) -> (u16, Value) {
    let mut body = json!({ "config": config, "requested_by": "shadow-test" });
    if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
        body.extend(fields.clone());
    }
    post_json(gw.admin, "/admin/runtime/activate", body).await
}

/// Every client's answers were 2xx with an expected body.
async fn no_client_error(load: KeepAliveLoad) {
    for client in load.stop().await {
        client.expect("a client saw an error");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_whose_upstream_fails_is_refused_while_clients_see_no_error() {
    let ok = Backend::named("ok").await;
    let broken = failing_backend().await;
    let gw = Gateway::start(&shadow_config(&[ok.addr], "all", ""));
    let load = KeepAliveLoad::start(gw.listener("web"), 8, &["ok"]);
    let candidate = shadow_config(&[broken.addr], "all", "");
    let started = Instant::now();
    let (status, answer) = activate_json(
        &gw,
        &candidate,
        json!({ "shadow": { "percent": 50, "duration": "20s", "min_requests": 50 } }),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"], "shadow_breach", "{answer}");
    let shadow = &answer["shadow"];
    assert_eq!(shadow["verdict"], "breached", "{shadow}");
    assert_eq!(shadow["candidate_generation"], 2);
    assert_eq!(shadow["active_generation"], 1);
    assert!(
        shadow["total"]["compared"].as_u64().unwrap() >= 50,
        "{shadow}"
    );
    assert_eq!(shadow["total"]["candidate"]["error_ratio"], 1.0, "{shadow}");
    assert_eq!(shadow["total"]["active"]["errors"], 0, "{shadow}");
    assert_eq!(shadow["routes"][0]["route"], "all");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("error ratio 1.0000 against 0.0000"),
        "{answer}"
    );
    // A breach is found as soon as enough requests show it.
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(gw.active_generation().await, 1, "nothing was activated");
    no_client_error(load).await;

    // The operation record keeps the report; status shows the last one.
    let (_, history) = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
    let operation = &history["operations"][0];
    assert_eq!(operation["kind"], "activate", "{operation}");
    assert_eq!(operation["outcome"], "rejected", "{operation}");
    assert_eq!(operation["shadow"]["verdict"], "breached", "{operation}");
    assert_eq!(gw.status().await["shadow"]["verdict"], "breached");
    let metrics = scrape(&gw).await;
    let answered = sample(
        &metrics,
        "cutover_shadow_requests_total",
        &["kind=\"shadow\"", "outcome=\"answered\""],
    );
    assert!(answered >= 50.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_candidate_passes_its_shadow_then_takes_the_guarded_switch() {
    let ok = Backend::named("ok").await;
    let gw = Gateway::start(&shadow_config(&[ok.addr], "all", ""));
    let load = KeepAliveLoad::start(gw.listener("web"), 8, &["ok"]);
    // Renamed: a change, to the same backend.
    let candidate = shadow_config(&[ok.addr], "everything", "");
    let (status, answer) = activate_json(
        &gw,
        &candidate,
        json!({
            "shadow": { "percent": 100, "duration": "2s", "min_requests": 20, "max_p99_ratio": 5 },
            "confirm_within": "60s",
        }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["shadow"]["verdict"], "passed", "{answer}");
    assert_eq!(answer["shadow"]["routes"][0]["route"], "everything");
    assert!(answer["shadow"]["seconds"].as_f64().unwrap() >= 2.0);
    assert_eq!(answer["shadow"]["total"]["changed_class"], 0);
    // Shadow first, then the guarded switch.
    assert_eq!(answer["generation"], 2);
    assert_eq!(answer["pending"]["generation"], 2, "{answer}");
    // A second shadowed change waits for the pending one to settle.
    let (status, refused) = activate_json(
        &gw,
        &shadow_config(&[ok.addr], "third", ""),
        json!({ "expected_generation": 2, "shadow": { "duration": "1s" } }),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"], "pending_activation");
    let (status, _) = post_json(
        gw.admin,
        "/admin/runtime/confirm",
        json!({ "generation": 2 }),
    )
    .await;
    assert_eq!(status, 200);
    let (_, history) = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
    let activation = history["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "activate" && o["outcome"] == "succeeded")
        .cloned()
        .unwrap();
    assert_eq!(activation["shadow"]["verdict"], "passed", "{activation}");
    no_client_error(load).await;

    // ctl: the report, then a refusal (the backend gone) with exit 6.
    let admin = gw.admin_url();
    let file = gw.path("candidate.toml");
    std::fs::write(&file, shadow_config(&[ok.addr], "again", "")).unwrap();
    let load = KeepAliveLoad::start(gw.listener("web"), 4, &["ok"]);
    let (code, out, err) = ctl(
        &admin,
        &[
            "activate",
            "--shadow",
            "1s",
            "--shadow-percent",
            "100",
            "--shadow-min-requests",
            "10",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("shadow passed"), "{out}");
    assert!(out.contains("again"), "{out}");
    assert!(!out.contains("pending"), "{out}");
    std::fs::write(&file, shadow_config(&[refusing_addr()], "gone", "")).unwrap();
    let (code, out, err) = ctl(
        &admin,
        &[
            "activate",
            "--shadow",
            "5s",
            "--shadow-percent",
            "100",
            "--shadow-min-requests",
            "10",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(6), "{out}{err}");
    assert!(err.contains("409 shadow_breach"), "{err}");
    assert!(out.contains("shadow breached on all routes"), "{out}");
    assert_eq!(gw.active_generation().await, 3);
    no_client_error(load).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_candidate_costs_bounded_copies_and_no_traffic_is_no_data() {
    let ok = Backend::named("ok").await;
    // Accepts, reads nothing, answers nothing.
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hanging.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = hanging.accept().await {
            open.push(stream);
        }
    });
    let gw = Gateway::start(&shadow_config(&[ok.addr], "all", ""));

    // No traffic: no data, and on_no_data decides.
    let quiet = shadow_config(&[ok.addr], "quiet", "");
    let (status, answer) =
        activate_json(&gw, &quiet, json!({ "shadow": { "duration": "1s" } })).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["shadow"]["verdict"], "no_data", "{answer}");
    assert!(answer["message"]
        .as_str()
        .unwrap()
        .contains("0 requests compared"));
    let (status, answer) = activate_json(
        &gw,
        &quiet,
        json!({ "shadow": { "duration": "1s", "on_no_data": "hold" } }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["shadow"]["verdict"], "no_data");
    assert_eq!(gw.active_generation().await, 2);

    // Copies to an upstream that never answers: at most 4 in flight,
    // each given up after the route's 1 s; the rest dropped.
    let load = KeepAliveLoad::start(gw.listener("web"), 8, &["ok"]);
    let candidate = shadow_config(&[hang_addr], "hangs", "");
    let (status, answer) = activate_json(
        &gw,
        &candidate,
        json!({ "shadow": { "percent": 100, "duration": "10s", "max_inflight": 4, "min_requests": 8 } }),
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    let copies = &answer["shadow"]["copies"];
    assert!(copies["dropped"].as_u64().unwrap() > 100, "{copies}");
    assert!(copies["timeout"].as_u64().unwrap() >= 8, "{copies}");
    assert_eq!(
        answer["shadow"]["total"]["candidate"]["status_classes"]["5xx"],
        answer["shadow"]["total"]["compared"]
    );
    no_client_error(load).await;
    let metrics = scrape(&gw).await;
    let dropped = sample(
        &metrics,
        "cutover_shadow_requests_total",
        &["kind=\"shadow\"", "outcome=\"dropped\""],
    );
    assert!(dropped > 100.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_stops_a_shadow_with_abort() {
    let ok = Backend::named("ok").await;
    let gw = Gateway::start(&shadow_config(&[ok.addr], "all", ""));
    let load = KeepAliveLoad::start(gw.listener("web"), 4, &["ok"]);
    let admin = gw.admin;
    let candidate = shadow_config(&[ok.addr], "long", "");
    let stage = tokio::spawn(async move {
        let body =
            json!({ "config": candidate, "requested_by": "ci", "shadow": { "duration": "10m" } });
        post_json(admin, "/admin/runtime/activate", body).await
    });
    // Status shows it while it runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    let running = loop {
        let status = gw.status().await;
        if status["shadow"]["verdict"] == "running" || Instant::now() > deadline {
            break status["shadow"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(running["verdict"], "running", "{running}");
    assert_eq!(running["candidate_generation"], 2);
    // Another change meanwhile: the stage holds the operation.
    assert_eq!(
        activate_status(&gw, &shadow_config(&[ok.addr], "other", "")).await,
        409
    );
    let (status, aborted) = post_json(
        gw.admin,
        "/admin/runtime/abort",
        json!({ "generation": 2, "requested_by": "operator" }),
    )
    .await;
    assert_eq!(status, 200, "{aborted}");
    assert_eq!(aborted["outcome"], "shadow_aborted", "{aborted}");
    assert_eq!(aborted["generation"], 1);
    let (status, answer) = tokio::time::timeout(Duration::from_secs(5), stage)
        .await
        .expect("the activation answers once aborted")
        .unwrap();
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"], "shadow_aborted");
    assert_eq!(gw.active_generation().await, 1);
    no_client_error(load).await;
}

/// Copies of an `auth` route carry the identity the active request's
/// check produced, and never a check of their own (issue 56 item 3): the
/// backend answers only requests that name a user (`x-user`, set by
/// forward auth from the auth service's answer), and counts the ones
/// that do not; the auth service counts its checks. One request in five
/// has no credentials (401 on the active path: its copy is answered 401
/// by the verdict, and sent nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_an_auth_route_carry_the_identity_the_active_check_produced() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;

    let checks = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&checks);
    let authz = Backend::start(Arc::new(
        move |req: hyper::Request<hyper::body::Incoming>| {
            counted.fetch_add(1, Relaxed);
            let allowed = req
                .headers()
                .get("authorization")
                .is_some_and(|v| v == "Bearer ok");
            Box::pin(async move {
                let mut response = hyper::Response::new(full(""));
                if allowed {
                    response
                        .headers_mut()
                        .insert("x-user", "alice".parse().unwrap());
                } else {
                    *response.status_mut() = http::StatusCode::UNAUTHORIZED;
                }
                response
            })
        },
    ))
    .await;
    let anonymous = Arc::new(AtomicU64::new(0));
    let named = Arc::new(AtomicU64::new(0));
    let (seen_anonymous, seen_named) = (Arc::clone(&anonymous), Arc::clone(&named));
    let app = Backend::start(Arc::new(
        move |req: hyper::Request<hyper::body::Incoming>| {
            let alice = req.headers().get("x-user").is_some_and(|v| v == "alice");
            let mut response = hyper::Response::new(full("ok"));
            if alice {
                seen_named.fetch_add(1, Relaxed);
            } else {
                seen_anonymous.fetch_add(1, Relaxed);
                *response.status_mut() = http::StatusCode::FORBIDDEN;
            }
            Box::pin(async move { response })
        },
    ))
    .await;
    let config = |route: &str| {
        Config::new()
            .metrics()
            .listener("web", "")
            .route(
                route,
                r#"listeners = ["web"]
upstream = "app"
timeout = "1s"
auth = { forward = { url = "http://authz/check", timeout = "500ms", response_headers = ["x-user"] } }"#,
            )
            .upstream("app", &[app.addr], "")
            .upstream("authz", &[authz.addr], "")
            .build()
    };
    let gw = Gateway::start(&config("all"));
    let web = gw.listener("web");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let (mut sent, mut wrong) = (0u64, Vec::new());
            while !stop.load(Relaxed) {
                let credentials = sent % 5 != 4;
                let mut request = hyper::Request::get("/").header("host", "a");
                if credentials {
                    request = request.header("authorization", "Bearer ok");
                }
                let body = http_body_util::Full::new(bytes::Bytes::new());
                let status = match send(web, request.body(body).unwrap()).await {
                    Ok((status, _, _)) => status.to_string(),
                    Err(error) => error,
                };
                let expected = if credentials { "200" } else { "401" };
                if status != expected {
                    wrong.push((sent, status));
                }
                sent += 1;
            }
            (sent, wrong)
        })
    };
    let (status, answer) = activate_json(
        &gw,
        &config("everything"),
        json!({ "shadow": { "percent": 100, "duration": "2s", "min_requests": 30 } }),
    )
    .await;
    stop.store(true, Relaxed);
    let (sent, wrong) = client.await.unwrap();
    assert!(wrong.is_empty(), "clients saw {wrong:?}");
    assert_eq!(status, 200, "{answer}");
    let shadow = &answer["shadow"];
    assert_eq!(shadow["verdict"], "passed", "{shadow}");
    let compared = shadow["total"]["compared"].as_u64().unwrap();
    assert!(compared >= 30, "{shadow}");
    assert_eq!(shadow["total"]["changed_class"], 0, "{shadow}");
    // Every copy reached the backend as alice; none without a user.
    assert_eq!(anonymous.load(Relaxed), 0, "requests without an identity");
    assert!(
        named.load(Relaxed) > sent * 4 / 5,
        "copies and clients' requests"
    );
    // One check per client request: the copies took theirs.
    assert_eq!(checks.load(Relaxed), sent, "auth service checks");
}

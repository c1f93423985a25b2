//! Guarded activation (DESIGN §14): confirm-or-revert.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;

async fn activate_pending(gw: &Gateway, body: &str, expected: u64, within: &str) -> (u16, Value) {
    post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({
            "config": answering(body),
            "expected_generation": expected,
            "confirm_within": within,
            "requested_by": "pipeline",
        }),
    )
    .await
}

async fn answer(gw: &Gateway) -> String {
    get(gw.listener("web"), "x", "/").await.2
}

/// Waits (bounded) until the active generation is `id`.
async fn wait_active(gw: &Gateway, id: u64, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let status = gw.status().await;
        if status["active_generation"] == id {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "generation {id} not active: {status}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn history_entry(gw: &Gateway, id: u64) -> Value {
    let (status, body) = admin_request(
        gw.admin,
        "GET",
        &format!("/admin/runtime/history/{id}"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_confirm_deadline_rolls_back_to_the_last_final_generation() {
    let gw = Gateway::start(&answering("old"));
    let (status, body) = activate_pending(&gw, "new", 1, "2s").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pending"]["generation"], 2, "{body}");
    assert_eq!(body["pending"]["rollback_to"], 1, "{body}");
    // Active (and serving) but pending, until the deadline.
    let status = gw.status().await;
    assert_eq!(status["active_generation"], 2);
    assert_eq!(status["pending"]["generation"], 2, "{status}");
    assert_eq!(answer(&gw).await, "new");
    let started = Instant::now();
    let status = wait_active(&gw, 3, Duration::from_secs(6)).await;
    assert!(
        started.elapsed() > Duration::from_millis(1200),
        "rolled back early"
    );
    assert!(status["pending"].is_null(), "{status}");
    assert_eq!(answer(&gw).await, "old");
    let entry = history_entry(&gw, 3).await;
    assert_eq!(entry["source"], "auto_rollback", "{entry}");
    assert_eq!(entry["rolled_back_to"], 1, "{entry}");
    assert_eq!(entry["reason"], "confirm deadline passed", "{entry}");
    // A confirm after the fact changes nothing.
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/confirm",
        json!({ "generation": 2 }),
    )
    .await;
    assert_eq!((status, body["error"].clone()), (409, json!("not_pending")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_keeps_the_generation_and_abort_rolls_back_at_once() {
    let gw = Gateway::start(&answering("old"));
    let (status, body) = activate_pending(&gw, "new", 1, "2s").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/confirm",
        json!({ "generation": 2, "expected_active_generation": 2 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "confirmed");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let status = gw.status().await;
    assert_eq!(
        status["active_generation"], 2,
        "confirmed: the deadline does nothing"
    );
    assert!(status["pending"].is_null(), "{status}");

    let (status, body) = activate_pending(&gw, "newer", 2, "60s").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answer(&gw).await, "newer");
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/abort",
        json!({ "generation": 3, "reason": "smoke test failed" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "rolled_back");
    assert_eq!(body["generation"], 4);
    assert_eq!(body["rolled_back_to"], 2);
    assert_eq!(answer(&gw).await, "new");
    let entry = history_entry(&gw, 4).await;
    assert_eq!(entry["rolled_back_to"], 2, "{entry}");
    assert_eq!(entry["reason"], "smoke test failed", "{entry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pending_change_at_a_time_unless_it_is_superseded() {
    let gw = Gateway::start(&answering("v1"));
    assert_eq!(activate_pending(&gw, "v2", 1, "60s").await.0, 200);
    // Planned against the last final generation: refused while 2 pends.
    let (status, body) = activate_pending(&gw, "v3", 1, "60s").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "generation_conflict", "{body}");
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": answering("v3") }),
    )
    .await;
    assert_eq!(
        (status, body["error"].clone()),
        (409, json!("pending_activation")),
        "{body}"
    );
    assert_eq!(body["pending_generation"], 2);
    // Naming the pending generation supersedes it; the rollback target
    // stays generation 1.
    let (status, body) = activate_pending(&gw, "v3", 2, "60s").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pending"]["generation"], 3);
    assert_eq!(body["pending"]["rollback_to"], 1);
    let (status, body) =
        post_json(gw.admin, "/admin/runtime/abort", json!({ "generation": 3 })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_back_to"], 1);
    assert_eq!(answer(&gw).await, "v1");
    // Nothing pends now: plain activations go through again.
    let (status, _) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": answering("v5") }),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_and_abort_racing_have_exactly_one_winner() {
    let gw = Gateway::start(&answering("old"));
    for round in 0..5u64 {
        let active = gw.active_generation().await;
        let (status, body) = activate_pending(&gw, &format!("new{round}"), active, "60s").await;
        assert_eq!(status, 200, "{body}");
        let pending = active + 1;
        let (a, b) = tokio::join!(
            post_json(
                gw.admin,
                "/admin/runtime/confirm",
                json!({ "generation": pending })
            ),
            post_json(
                gw.admin,
                "/admin/runtime/abort",
                json!({ "generation": pending })
            ),
        );
        let statuses = [a.0, b.0];
        assert!(
            statuses.contains(&200) && statuses.iter().filter(|s| **s == 200).count() == 1,
            "round {round}: {a:?} {b:?}"
        );
        // The loser is told why: not pending any more, or busy.
        let loser = if a.0 == 200 { &b.1 } else { &a.1 };
        assert!(
            loser["error"] == "not_pending" || loser["error"] == "operation_in_progress",
            "{loser}"
        );
        let status = gw.status().await;
        assert!(status["pending"].is_null(), "{status}");
        let expected = if a.0 == 200 {
            format!("new{round}")
        } else {
            "old".to_owned()
        };
        if a.0 == 200 {
            assert_eq!(status["active_generation"], pending);
        }
        if expected == "old" {
            // Aborted: the rollback brought back what was final before.
            assert_ne!(answer(&gw).await, format!("new{round}"));
        } else {
            assert_eq!(answer(&gw).await, expected);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_racing_the_deadline_has_exactly_one_outcome() {
    let gw = Gateway::start(&answering("old"));
    let (status, _) = activate_pending(&gw, "new", 1, "1s").await;
    assert_eq!(status, 200);
    // Confirm as close to the deadline as the clock allows.
    tokio::time::sleep(Duration::from_millis(990)).await;
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/confirm",
        json!({ "generation": 2 }),
    )
    .await;
    // Give the timer its chance, then look.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let state = gw.status().await;
    assert!(state["pending"].is_null(), "{state}");
    match status {
        200 => {
            assert_eq!(
                state["active_generation"], 2,
                "confirmed, then rolled back: {state}"
            );
            assert_eq!(answer(&gw).await, "new");
        }
        409 => {
            // Lost to the timer: settled already, or settling right then.
            assert!(
                body["error"] == "not_pending" || body["error"] == "operation_in_progress",
                "{body}"
            );
            assert_eq!(state["active_generation"], 3, "{state}");
            assert_eq!(answer(&gw).await, "old");
        }
        other => panic!("confirm answered {other}: {body}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_within_is_checked() {
    let gw = Gateway::start(&answering("old"));
    for bad in ["soon", "0s", "500ms", "2d"] {
        let (status, body) = activate_pending(&gw, "new", 1, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    assert_eq!(gw.active_generation().await, 1);
}

/// Stops `gw` with SIGKILL (nothing is flushed on the way out) and
/// returns its folder for the next process.
fn kill(gw: Gateway) -> tempfile::TempDir {
    let mut gw = gw;
    gw.signal("KILL");
    // Reaped before the next process starts (a killed process has no
    // exit code to check).
    let _ = gw.wait_exit(Duration::from_secs(10));
    std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap())
}

fn with_state(dir: &std::path::Path, body: &str) -> String {
    format!(
        "[runtime]\nstate_dir = \"{}\"\n{}",
        dir.join("state").display(),
        answering(body)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_the_window_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let gw = Gateway::start_in(dir, &with_state(&root, "old"));
    let (status, body) = post_json(gw.admin,
        "/admin/runtime/activate",
        json!({ "config": with_state(&root, "new"), "expected_generation": 1, "confirm_within": "4s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let started = Instant::now();
    let dir = kill(gw);
    let gw = Gateway::start_in(dir, &with_state(&root, "old"));
    // Back on the pending generation, with what is left of its window.
    let status = gw.status().await;
    assert_eq!(status["active_generation"], 2, "{status}");
    assert_eq!(status["pending"]["generation"], 2, "{status}");
    assert_eq!(status["pending"]["rollback_to"], 1, "{status}");
    let left = status["pending"]["seconds_left"].as_f64().unwrap();
    assert!(
        left <= 4.0 - started.elapsed().as_secs_f64() + 0.1,
        "{left}"
    );
    assert_eq!(answer(&gw).await, "new");
    // And it still rolls back when the window closes.
    wait_active(&gw, 3, Duration::from_secs(8)).await;
    assert_eq!(answer(&gw).await, "old");
    assert_eq!(history_entry(&gw, 3).await["source"], "auto_rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_the_deadline_boots_the_previous_generation() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let gw = Gateway::start_in(dir, &with_state(&root, "old"));
    let (status, body) = post_json(gw.admin,
        "/admin/runtime/activate",
        json!({ "config": with_state(&root, "new"), "expected_generation": 1, "confirm_within": "1s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let dir = kill(gw);
    // Down past the deadline.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let gw = Gateway::start_in(dir, &with_state(&root, "old"));
    let status = gw.status().await;
    assert_eq!(status["active_generation"], 3, "{status}");
    assert!(status["pending"].is_null(), "{status}");
    assert_eq!(answer(&gw).await, "old");
    let entry = history_entry(&gw, 3).await;
    assert_eq!(entry["source"], "auto_rollback", "{entry}");
    assert_eq!(entry["rolled_back_to"], 1, "{entry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_activates_with_a_window_and_confirms() {
    let gw = Gateway::start(&answering("old"));
    let file = gw.path("candidate.toml");
    std::fs::write(&file, answering("new")).unwrap();
    let admin = gw.admin_url();
    let ctl = |args: &[&str]| {
        let (code, out, _) = ctl(&admin, args);
        (code, out)
    };
    let file = file.to_str().unwrap();
    let (code, out) = ctl(&["activate", file, "--expect", "1", "--confirm-within", "30s"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("pending: confirm generation 2 by "), "{out}");
    let (code, out) = ctl(&["status"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("PENDING: generation 2 rolls back to 1 in "),
        "{out}"
    );
    let (code, out) = ctl(&["confirm", "2", "--expect", "2"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("confirmed: generation 2 active"), "{out}");
    // Nothing pends any more: a second confirm is a conflict (exit 2).
    let (code, _) = ctl(&["abort", "2"]);
    assert_eq!(code, Some(2));
    assert!(gw.status().await["pending"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_automatic_rollback_under_load_fails_no_request() {
    let gw = Gateway::start(&answering("old"));
    let load = KeepAliveLoad::start(gw.listener("web"), 32, &["old", "new"]);
    let (status, body) = activate_pending(&gw, "new", 1, "1s").await;
    assert_eq!(status, 200, "{body}");
    wait_active(&gw, 3, Duration::from_secs(6)).await;
    let answered_before = load.answered();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(load.answered() > answered_before, "traffic kept flowing");
    let mut seen = std::collections::HashSet::new();
    for client in load.stop().await {
        seen.extend(client.expect("every request of every client answered 200"));
    }
    // Both generations served, and nothing failed across the rollback.
    assert!(
        seen.contains(&bytes::Bytes::from_static(b"new")),
        "{seen:?}"
    );
    assert!(
        seen.contains(&bytes::Bytes::from_static(b"old")),
        "{seen:?}"
    );
}

/// `/api` to `backend`, anything else answered directly.
fn api_to(backend: std::net::SocketAddr) -> String {
    config(&format!(
        "[[routes]]\nname = \"api\"\nlisteners = [\"web\"]\npath_prefix = \"/api\"\nupstream = \"api\"\n\n[[routes]]\nname = \"rest\"\nlisteners = [\"web\"]\nrespond = {{ body = \"rest\" }}\n\n[upstreams.api]\nbackends = [{{ addr = \"{backend}\" }}]\n"
    ))
}

/// A backend that answers every request with `status`.
async fn answering_status(status: u16) -> Backend {
    Backend::start(std::sync::Arc::new(move |_req| {
        Box::pin(async move {
            let mut response = hyper::Response::new(full("x"));
            *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
            response
        })
    }))
    .await
}

async fn guarded(gw: &Gateway, config: String, guard: Value, extra: Value) -> (u16, Value) {
    let mut body = json!({ "config": config, "expected_generation": 1, "guard": guard });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    post_json(gw.admin, "/admin/runtime/activate", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_rolls_back_a_generation_whose_backend_fails() {
    let good = answering_status(200).await;
    let bad = answering_status(500).await;
    let gw = Gateway::start(&api_to(good.addr));
    let (status, body) = guarded(
        &gw,
        api_to(bad.addr),
        json!({ "window": "20s", "min_requests": 20, "max_error_ratio": 0.05 }),
        json!({ "confirm_within": "60s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let web = gw.listener("web");
    for _ in 0..20 {
        assert_eq!(get(web, "x", "/api/a").await.0, 500);
    }
    // Evaluated every second (a tenth of the window, at most 1 s): rolled
    // back within two evaluations of min_requests.
    let reached = Instant::now();
    wait_active(&gw, 3, Duration::from_secs(3)).await;
    assert!(reached.elapsed() < Duration::from_millis(2500));
    assert_eq!(get(web, "x", "/api/a").await.0, 200);
    let entry = history_entry(&gw, 3).await;
    assert_eq!(entry["source"], "auto_rollback", "{entry}");
    assert_eq!(entry["requested_by"], "cutover-guard", "{entry}");
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("guard breached: error ratio 1.0000 (20 of 20)"),
        "{reason}"
    );
    assert!(reason.contains("max_error_ratio 0.05"), "{reason}");
    // The rolled-back generation says how it ended, and why.
    let settled = history_entry(&gw, 2).await["settlement"].clone();
    assert_eq!(settled["state"], "auto_rolled_back", "{settled}");
    assert_eq!(settled["reason"], reason, "{settled}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_confirms_a_healthy_generation_when_its_window_passes() {
    let first = answering_status(200).await;
    let second = answering_status(200).await;
    let gw = Gateway::start(&api_to(first.addr));
    let (status, body) = guarded(
        &gw,
        api_to(second.addr),
        json!({ "window": "2s", "min_requests": 10, "max_error_ratio": 0.01, "max_p99": "1s" }),
        json!({ "confirm_on_pass": true }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["pending"]["deadline"].is_null(),
        "no confirm window: {body}"
    );
    let web = gw.listener("web");
    for _ in 0..20 {
        assert_eq!(get(web, "x", "/api/a").await.0, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = gw.status().await;
        if status["pending"].is_null() {
            assert_eq!(status["active_generation"], 2, "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "still pending: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, history) = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
    let confirm = history["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "confirm")
        .unwrap_or_else(|| panic!("{history}"))
        .clone();
    assert_eq!(confirm["requested_by"], "cutover-guard", "{confirm}");
    assert!(
        confirm["reason"]
            .as_str()
            .unwrap()
            .starts_with("guard passed: error ratio 0.0000 (0 of 20)"),
        "{confirm}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_without_traffic_fails_when_told_to() {
    let backend = answering_status(200).await;
    let gw = Gateway::start(&api_to(backend.addr));
    let (status, body) = guarded(
        &gw,
        api_to(backend.addr).replace("body = \"rest\"", "body = \"rest2\""),
        json!({ "window": "1s", "min_requests": 5, "on_no_data": "fail" }),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    wait_active(&gw, 3, Duration::from_secs(4)).await;
    let reason = history_entry(&gw, 3).await["reason"].clone();
    assert!(
        reason
            .as_str()
            .unwrap()
            .contains("fewer than min_requests 5"),
        "{reason}"
    );
    // A guard that would hold forever is refused up front.
    let (status, body) = guarded(
        &gw,
        api_to(backend.addr),
        json!({ "window": "1s" }),
        json!({ "expected_generation": 3 }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_generation_has_its_own_series() {
    let with_metrics =
        |body: &str| answering(body).replace("[log]", "[metrics]\nbind = \"127.0.0.1:0\"\n\n[log]");
    let gw = Gateway::start(&with_metrics("old"));
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": with_metrics("new"), "expected_generation": 1, "confirm_within": "60s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for _ in 0..3 {
        assert_eq!(answer(&gw).await, "new");
    }
    let metrics = gw.metrics.expect("metrics endpoint");
    let (_, _, text) = get(metrics, "x", "/metrics").await;
    assert!(
        text.contains("cutover_generation_requests_total{generation=\"pending\",id=\"2\"} 3\n"),
        "{text}"
    );
    assert!(
        !text.contains("cutover_generation_requests_total{generation=\"active\""),
        "{text}"
    );
    let (status, _) = post_json(
        gw.admin,
        "/admin/runtime/confirm",
        json!({ "generation": 2 }),
    )
    .await;
    assert_eq!(status, 200);
    let (_, _, text) = get(metrics, "x", "/metrics").await;
    assert!(
        text.contains("cutover_generation_requests_total{generation=\"active\",id=\"2\"} 3\n"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_resumes_after_a_restart_with_a_new_window() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let gw = Gateway::start_in(dir, &with_state(&root, "old"));
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({
            "config": with_state(&root, "new"),
            "expected_generation": 1,
            "guard": { "window": "2s", "min_requests": 20 },
            "confirm_on_pass": true,
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["pending"]["deadline"].is_null(), "{body}");
    let dir = kill(gw);
    let gw = Gateway::start_in(dir, &with_state(&root, "old"));
    // Pending again, judged by its guard: no deadline, and no verdict
    // before the new window has its 20 answers.
    let status = gw.status().await;
    assert_eq!(status["active_generation"], 2, "{status}");
    assert_eq!(status["pending"]["generation"], 2, "{status}");
    assert!(status["pending"]["deadline"].is_null(), "{status}");
    let bodies = keep_alive_bodies(gw.listener("web"), 40, None).await;
    assert!(bodies.iter().all(|b| b == "new"), "{bodies:?}");
    // The window passes with 40 healthy answers: confirmed, not rolled back.
    let deadline = Instant::now() + Duration::from_secs(6);
    let status = loop {
        let status = gw.status().await;
        if status["pending"].is_null() {
            break status;
        }
        assert!(Instant::now() < deadline, "still pending: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status["active_generation"], 2, "{status}");
    let (code, ops) = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
    assert_eq!(code, 200, "{ops}");
    let confirmed = ops["operations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|op| op["kind"] == "confirm" && op["requested_by"] == "cutover-guard");
    assert!(confirmed, "{ops}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_resumes_on_its_step_after_a_drain_aware_upgrade() {
    let mut gw = Gateway::start(&answering("old"));
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": answering("new"), "expected_generation": 1,
                "steps": [10, 50, 100], "step_interval": "3s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(6);
    while gw.status().await["pending"]["canary_percent"] != 50 {
        assert!(Instant::now() < deadline, "never reached 50 %");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let op = crate::lifecycle::upgrade(&gw, None).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    let new_pid = op["pid"].as_u64().unwrap();
    gw.adopted.push(new_pid as u32);
    // The new process canaries on the step the old one had reached, with
    // the previous generation built again to take the other half.
    let status = gw.status().await;
    assert_eq!(status["pid"], new_pid, "{status}");
    assert_eq!(status["pending"]["generation"], 2, "{status}");
    assert_eq!(status["pending"]["canary_percent"], 50, "{status}");
    let live: Vec<u64> = status["generations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["generation"].as_u64().unwrap())
        .collect();
    assert!(live.contains(&1) && live.contains(&2), "{status}");
    let bodies = keep_alive_bodies(gw.listener("web"), 200, None).await;
    let new = bodies.iter().filter(|b| *b == "new").count();
    assert!((40..=160).contains(&new), "{new} of 200 at 50 %");
    // And it goes on to 100 %: final.
    let deadline = Instant::now() + Duration::from_secs(8);
    while !gw.status().await["pending"].is_null() {
        assert!(Instant::now() < deadline, "still canarying");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gw.active_generation().await, 2);
    let bodies = keep_alive_bodies(gw.listener("web"), 50, None).await;
    assert!(bodies.iter().all(|b| b == "new"), "{bodies:?}");
}

/// Sends `n` GETs on one keep-alive connection (with `header`, if given);
/// returns the bodies.
async fn keep_alive_bodies(
    addr: std::net::SocketAddr,
    n: usize,
    header: Option<(&str, String)>,
) -> Vec<String> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut sender = crate::harness::h1_over(stream).await.unwrap();
    let mut bodies = Vec::with_capacity(n);
    for _ in 0..n {
        let mut req = hyper::Request::get("/").header("host", "x");
        if let Some((name, value)) = &header {
            req = req.header(*name, value.as_str());
        }
        sender.ready().await.unwrap();
        let response = sender
            .send_request(
                req.body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        bodies.push(String::from_utf8_lossy(&body).into_owned());
    }
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_at_ten_percent_takes_a_tenth_of_new_requests() {
    let gw = Gateway::start(&answering("old"));
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": answering("new"), "expected_generation": 1,
                "steps": [10, 100], "step_interval": "10m" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pending"]["canary_percent"], 10, "{body}");
    let bodies = keep_alive_bodies(gw.listener("web"), 10_000, None).await;
    let new = bodies.iter().filter(|b| *b == "new").count();
    let old = bodies.iter().filter(|b| *b == "old").count();
    assert_eq!(new + old, 10_000);
    // Binomial(10 000, 0.1): 1 000 ± 90 is three standard deviations.
    assert!(
        (910..=1090).contains(&new),
        "{new} of 10 000 to the pending generation"
    );
    // Both generations are live and visible.
    let status = gw.status().await;
    let live: Vec<u64> = status["generations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["generation"].as_u64().unwrap())
        .collect();
    assert!(live.contains(&1) && live.contains(&2), "{status}");
    assert_eq!(status["pending"]["canary_percent"], 10, "{status}");
    let per_generation = |id: u64| {
        status["generations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["generation"] == id)
            .map(|g| g["requests"].as_u64().unwrap())
            .unwrap()
    };
    assert_eq!(
        per_generation(2) as usize,
        new,
        "every request pinned to one generation"
    );
    // Abort: back to 1, and every new request with it.
    let (status, body) =
        post_json(gw.admin, "/admin/runtime/abort", json!({ "generation": 2 })).await;
    assert_eq!(status, 200, "{body}");
    let bodies = keep_alive_bodies(gw.listener("web"), 200, None).await;
    assert!(bodies.iter().all(|b| b == "old"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sticky_canary_keeps_each_key_on_one_generation() {
    let gw = Gateway::start(&answering("old"));
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": answering("new"), "expected_generation": 1,
                "steps": [50, 100], "step_interval": "10m", "hash_key": "header:x-user" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut sides = std::collections::HashSet::new();
    for user in 0..40 {
        let bodies = keep_alive_bodies(
            gw.listener("web"),
            10,
            Some(("x-user", format!("user-{user}"))),
        )
        .await;
        assert!(
            bodies.iter().all(|b| *b == bodies[0]),
            "user {user}: {bodies:?}"
        );
        sides.insert(bodies[0].clone());
    }
    assert_eq!(sides.len(), 2, "40 users at 50 % land on both sides");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_steps_end_in_a_confirmation_or_a_guarded_rollback() {
    let gw = Gateway::start(&answering("old"));
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": answering("new"), "expected_generation": 1,
                "steps": [50, 100], "step_interval": "1s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gw.status().await["pending"].is_null() {
        assert!(Instant::now() < deadline, "still canarying");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gw.active_generation().await, 2);
    let bodies = keep_alive_bodies(gw.listener("web"), 100, None).await;
    assert!(bodies.iter().all(|b| b == "new"), "final: every request");

    // A failing canary, judged at its first step.
    let good = answering_status(200).await;
    let bad = answering_status(500).await;
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": api_to(good.addr), "expected_generation": 2 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": api_to(bad.addr), "expected_generation": 3,
                "steps": [50, 100], "step_interval": "1s",
                "guard": { "window": "1s", "min_requests": 10, "max_error_ratio": 0.05 } }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let web = gw.listener("web");
    let mut failed = 0;
    for _ in 0..60 {
        if get(web, "x", "/api/x").await.0 == 500 {
            failed += 1;
        }
    }
    assert!(
        failed > 10 && failed < 60,
        "about half to the canary: {failed}"
    );
    wait_active(&gw, 5, Duration::from_secs(5)).await;
    let entry = history_entry(&gw, 5).await;
    assert_eq!(entry["rolled_back_to"], 3, "{entry}");
    assert_eq!(entry["requested_by"], "cutover-canary", "{entry}");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .starts_with("canary at 50 %: guard breached"),
        "{entry}"
    );
    assert_eq!(get(web, "x", "/api/x").await.0, 200);
}

/// A canary's guard judges all through a step, not only at its end: a
/// breaching canary on a 30 s step ends within two evaluations (a tenth
/// of the 5 s window: 500 ms) of reaching `min_requests`, and the clients
/// see only the failures that reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaching_canary_ends_within_its_step() {
    let good = answering_status(200).await;
    let bad = answering_status(500).await;
    let gw = Gateway::start(&api_to(good.addr));
    let (status, body) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": api_to(bad.addr), "expected_generation": 1,
                "steps": [50, 100], "step_interval": "30s",
                "guard": { "window": "5s", "min_requests": 20, "max_error_ratio": 0.05 } }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let web = gw.listener("web");
    let (mut failed, mut sent) = (0, 0);
    while failed < 20 {
        sent += 1;
        assert!(sent < 400, "{failed} of {sent} reached the canary");
        if get(web, "x", "/api/x").await.0 == 500 {
            failed += 1;
        }
    }
    let reached = Instant::now();
    // Traffic goes on while the guard decides; count what still fails.
    let mut after = 0;
    while gw.status().await["active_generation"] != 3 {
        assert!(
            reached.elapsed() < Duration::from_secs(5),
            "the canary still runs {:?} after min_requests",
            reached.elapsed()
        );
        if get(web, "x", "/api/x").await.0 == 500 {
            after += 1;
        }
    }
    let took = reached.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "ended {took:?} after min_requests; two evaluations are 1 s"
    );
    let entry = history_entry(&gw, 3).await;
    assert_eq!(entry["requested_by"], "cutover-canary", "{entry}");
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("canary at 50 %: guard breached"),
        "{reason}"
    );
    assert_eq!(get(web, "x", "/api/x").await.0, 200);
    eprintln!(
        "breaching canary: {failed} failed before min_requests, {after} after, ended {took:?} later"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_generation_survives_a_drain_aware_upgrade() {
    let mut gw = Gateway::start(&answering("old"));
    let (status, body) = activate_pending(&gw, "new", 1, "30s").await;
    assert_eq!(status, 200, "{body}");
    let op = crate::lifecycle::upgrade(&gw, None).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    let new_pid = op["pid"].as_u64().unwrap();
    gw.adopted.push(new_pid as u32);
    let status = gw.status().await;
    assert_eq!(status["pid"], new_pid, "{status}");
    assert_eq!(status["active_generation"], 2, "{status}");
    assert_eq!(status["pending"]["generation"], 2, "{status}");
    assert!(
        status["pending"]["seconds_left"].as_f64().unwrap() <= 30.0,
        "{status}"
    );
    assert_eq!(answer(&gw).await, "new");
    // Settled in the new process.
    let (status, body) =
        post_json(gw.admin, "/admin/runtime/abort", json!({ "generation": 2 })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answer(&gw).await, "old");
}

/// Runs `cutover ctl activate FILE ARGS --wait` against `gw` while
/// sending requests to `/api` (the guard needs answers to judge); returns
/// its exit code and output.
async fn ctl_wait(gw: &Gateway, file: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(BIN);
    command
        .args(["ctl", "--admin", &gw.admin_url(), "activate"])
        .arg(file)
        .args(args)
        .arg("--wait");
    let ctl = tokio::task::spawn_blocking(move || command.output().unwrap());
    let web = gw.listener("web");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ctl.is_finished() {
        assert!(Instant::now() < deadline, "ctl --wait never returned");
        get(web, "x", "/api/a").await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = ctl.await.unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_wait_follows_a_guarded_activation_to_its_end() {
    let good = answering_status(200).await;
    let bad = answering_status(500).await;
    let gw = Gateway::start(&api_to(good.addr));
    let file = gw.path("candidate.toml");
    // A failing backend: the guard rolls it back, ctl exits 4 and says why.
    std::fs::write(&file, api_to(bad.addr)).unwrap();
    let (code, out) = ctl_wait(
        &gw,
        &file,
        &[
            "--expect",
            "1",
            "--confirm-within",
            "30s",
            "--guard-error-ratio",
            "0.05",
            "--min-requests",
            "10",
            "--guard-window",
            "10s",
        ],
    )
    .await;
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains("generation 2 rolled back: guard breached: error ratio"),
        "{out}"
    );
    assert!(out.contains("(by cutover-guard)"), "{out}");
    assert_eq!(gw.active_generation().await, 3);
    // A healthy one through canary steps: final, exit 0.
    let other = answering_status(200).await;
    std::fs::write(&file, api_to(other.addr)).unwrap();
    let (code, out) = ctl_wait(
        &gw,
        &file,
        &[
            "--expect",
            "3",
            "--steps",
            "50,100",
            "--step-interval",
            "1s",
            "--guard-error-ratio",
            "0.05",
            "--min-requests",
            "5",
            "--guard-window",
            "1s",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("canary: generation 4 takes 50 % of new requests"),
        "{out}"
    );
    assert!(
        out.contains("generation 4 confirmed: canary steps [50, 100] completed"),
        "{out}"
    );
    assert_eq!(gw.active_generation().await, 4);
    assert!(gw.status().await["pending"].is_null());
}

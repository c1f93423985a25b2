//! Router tests: every status code of DESIGN §4, through `oneshot`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{router, Security};
use crate::config::ConfigText;
use crate::control::Control;
use crate::ids::GenerationId;
use crate::runtime::Phase;
use crate::test_config::TestConfig;

const ADMIN: &str = "127.0.0.1:9190";

/// The configuration most tests start from.
static BASE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    TestConfig::web()
        .route(
            "hello",
            "listeners = [\"web\"]\ntimeout = \"15s\"\nrespond = { body = \"hello\" }",
        )
        .build()
});

struct Admin {
    control: Arc<Control>,
    router: axum::Router,
    _dir: tempfile::TempDir,
}

fn admin_with(text: &str, token: Option<&str>) -> Admin {
    admin_with_hook(text, token, || {})
}

/// A caller named `name` with `token` and `scopes`.
fn caller(name: &str, token: &str, scopes: &[crate::plan::Scope]) -> crate::plan::CallerSpec {
    use sha2::Digest as _;
    crate::plan::CallerSpec {
        name: name.into(),
        credential: crate::plan::Credential::Token(sha2::Sha256::digest(token.as_bytes()).into()),
        scopes: scopes
            .iter()
            .fold(crate::plan::Scopes::default(), |s, scope| s.with(*scope)),
        requires_approval: false,
    }
}

/// `release_memory` runs right after control-plane work, on its thread.
fn admin_with_hook(text: &str, token: Option<&str>, release_memory: fn()) -> Admin {
    let callers: Vec<_> = token
        .map(|t| caller("admin", t, &[crate::plan::Scope::Admin]))
        .into_iter()
        .collect();
    admin_with_callers(text, &callers, release_memory)
}

fn admin_with_callers(
    text: &str,
    callers: &[crate::plan::CallerSpec],
    release_memory: fn(),
) -> Admin {
    let (control, dir) = crate::control::tests::control_with(text, release_memory);
    let security = Security::new(
        ADMIN.parse().expect("addr"),
        callers,
        control.store().load_full().spec.admin.max_body,
    );
    Admin {
        router: router(crate::writer::Writer::Local(Arc::clone(&control)), security),
        control,
        _dir: dir,
    }
}

fn admin() -> Admin {
    admin_with(BASE.as_str(), None)
}

async fn call(admin: &Admin, request: Request<Body>) -> (StatusCode, Value) {
    let response = admin
        .router
        .clone()
        .oneshot(request)
        .await
        .expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
}

fn post(path: &str, content_type: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("host", ADMIN)
        .header("content-type", content_type)
        .body(body.into())
        .expect("request")
}

fn get(path: &str) -> Request<Body> {
    Request::get(path)
        .header("host", ADMIN)
        .body(Body::empty())
        .expect("request")
}

fn toml(path: &str, text: &str) -> Request<Body> {
    post(path, "application/toml", text.to_owned())
}

#[tokio::test]
async fn validate_answers_a_plan_and_records_nothing() {
    let a = admin();
    let candidate = BASE.replace("\"15s\"", "\"5s\"");
    let (status, plan) = call(&a, toml("/admin/runtime/validate", &candidate)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(plan["activatable"], true);
    assert_eq!(plan["active_generation"], 1);
    assert!(plan["config_version"]
        .as_str()
        .is_some_and(|v| v.starts_with("sha256:")));
    assert_eq!(
        plan["diff"]["changes"][0]["fields"][0]["path"],
        "routes.hello.timeout"
    );
    assert_eq!(plan["diff"]["changes"][0]["disposition"], "live");
    assert!(plan["diff"]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("--- generation 1\n+++ candidate\n")));

    let invalid = BASE.replace("respond = { body = \"hello\" }", "upstream = \"nope\"");
    let (status, plan) = call(&a, toml("/admin/runtime/validate", &invalid)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(plan["activatable"], false);
    assert_eq!(plan["errors"][0]["code"], "unknown_upstream");
    assert_eq!(plan["errors"][0]["path"], "routes[0].upstream");
    assert_eq!(plan["errors"][0]["line"], 12);
    assert_eq!(plan["errors"][0]["column"], 12);

    let (_, history) = call(&a, get("/admin/runtime/history")).await;
    assert_eq!(history["operations"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn candidate_forms_and_request_errors() {
    let a = admin();
    let json_form = json!({ "config": BASE.as_str(), "requested_by": "ci" }).to_string();
    let (status, plan) = call(
        &a,
        post("/admin/runtime/validate", "application/json", json_form),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(plan["activatable"], true);
    // Empty body: the file the process started with.
    let (status, plan) = call(&a, post("/admin/runtime/validate", "application/json", "")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(plan["diff"]["changes"], json!([]));
    let (status, _) = call(
        &a,
        post(
            "/admin/runtime/validate",
            "application/json",
            r#"{"config_path": "gateway.toml"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(
        &a,
        post(
            "/admin/runtime/validate",
            "application/json",
            r#"{"config_path": "../../etc/passwd"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = call(
        &a,
        post("/admin/runtime/validate", "application/json", "{not json"),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    let (status, _) = call(&a, post("/admin/runtime/validate", "text/plain", "x = 1")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let huge = "#".repeat(2 * 1024 * 1024);
    let (status, _) = call(
        &a,
        post("/admin/runtime/validate", "application/toml", huge),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, body) = call(&a, get("/admin/runtime/activate")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["error"], "method_not_allowed", "{body}");
    let (status, body) = call(&a, get("/admin/nothing")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "not_found", "{body}");
    // A query string that does not parse: JSON too.
    let (status, body) = call(
        &a,
        post(
            "/admin/runtime/validate?expected_generation=seven",
            "application/toml",
            "",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "bad_request", "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

fn compressed(encoding: &str, body: Vec<u8>) -> Request<Body> {
    Request::post("/admin/runtime/validate")
        .header("host", ADMIN)
        .header("content-type", "application/toml")
        .header("content-encoding", encoding)
        .body(Body::from(body))
        .expect("request")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

#[tokio::test]
async fn compressed_bodies_are_read_within_the_same_bound() {
    let a = admin();
    // A configuration over the 1 MiB default, sent gzip and zstd: read.
    let padding = "# padding\n".repeat(150_000);
    let large = format!("{}{padding}", *BASE);
    assert!(large.len() > 1024 * 1024);
    for (encoding, body) in [
        ("gzip", gzip(BASE.as_bytes())),
        ("zstd", zstd::encode_all(BASE.as_bytes(), 3).expect("zstd")),
    ] {
        let (status, plan) = call(&a, compressed(encoding, body)).await;
        assert_eq!(status, StatusCode::OK, "{encoding}: {plan}");
        assert_eq!(plan["activatable"], true, "{plan}");
    }
    // Small on the wire, past the limit once inflated: 413, and no more
    // than the limit was ever held.
    for (encoding, body) in [
        ("gzip", gzip(large.as_bytes())),
        (
            "zstd",
            zstd::encode_all(large.as_bytes(), 19).expect("zstd"),
        ),
    ] {
        assert!(body.len() < 64 * 1024, "{encoding}: {}", body.len());
        let (status, answer) = call(&a, compressed(encoding, body)).await;
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{encoding}: {answer}"
        );
        assert_eq!(answer["error"], "payload_too_large");
    }
    let (status, answer) = call(&a, compressed("br", b"x".to_vec())).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{answer}");
    assert_eq!(answer["error"], "unsupported_encoding");
    let (status, answer) = call(&a, compressed("gzip", b"not gzip at all".to_vec())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

    // With admin.max_body = "4MiB", the large one is read.
    let roomy = admin_with(
        &BASE.replace("[admin]\n", "[admin]\nmax_body = \"4MiB\"\n"),
        None,
    );
    let (status, plan) = call(
        &roomy,
        compressed("zstd", zstd::encode_all(large.as_bytes(), 3).expect("zstd")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{plan}");
}

/// A body that never arrives: the sender is kept, nothing is sent.
fn stalled_body() -> (Body, http_body_util::channel::Sender<bytes::Bytes>) {
    let (sender, body) = http_body_util::channel::Channel::<bytes::Bytes>::new(1);
    (Body::new(body), sender)
}

#[tokio::test(start_paused = true)]
async fn bodies_are_bounded_in_size_and_time_before_any_handler() {
    let a = admin();
    // Declared over the limit: refused without reading a byte (the body
    // never arrives, so reading it would never end).
    let (body, _keep) = stalled_body();
    let request = Request::post("/admin/runtime/validate")
        .header("host", ADMIN)
        .header("content-type", "application/toml")
        .header("content-length", (2 * 1024 * 1024).to_string())
        .body(body)
        .expect("request");
    let (status, body) = call(&a, request).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"], "payload_too_large", "{body}");
    // A body that stalls: 408 after the body timeout (virtual time).
    let (body, _keep) = stalled_body();
    let request = Request::post("/admin/runtime/activate")
        .header("host", ADMIN)
        .header("content-type", "application/toml")
        .body(body)
        .expect("request");
    let started = tokio::time::Instant::now();
    let (status, body) = call(&a, request).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert_eq!(body["error"], "request_timeout", "{body}");
    assert!(started.elapsed() >= super::limits::BODY_TIMEOUT);
    // The operation lock was never taken: an activation goes through.
    let (status, _) = call(&a, toml("/admin/runtime/validate", BASE.as_str())).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn reason_and_requested_by_are_capped_and_a_refusal_stores_nothing() {
    let a = admin();
    let operations = |a: &Admin| a.control.with_history(|h| h.operations().count());
    let before = operations(&a);
    let long = "r".repeat(super::limits::MAX_METADATA + 1);
    let text = serde_json::json!({ "config": BASE.as_str(), "reason": long }).to_string();
    let (status, body) = call(
        &a,
        post("/admin/runtime/activate", "application/json", text),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let query = format!("/admin/runtime/preview?requested_by={long}");
    let (status, _) = call(&a, post(&query, "application/toml", BASE.as_str())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let rollback = serde_json::json!({ "target_generation": 1, "requested_by": long }).to_string();
    let (status, _) = call(
        &a,
        post("/admin/runtime/rollback", "application/json", rollback),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(operations(&a), before, "a refused call stored something");
    // At the limit is fine.
    let fits = "r".repeat(super::limits::MAX_METADATA);
    let text = serde_json::json!({ "config": BASE.as_str(), "reason": fits }).to_string();
    let (status, _) = call(
        &a,
        post("/admin/runtime/validate", "application/json", text),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn preview_is_recorded() {
    let a = admin();
    let (status, plan) = call(
        &a,
        toml(
            "/admin/runtime/preview?requested_by=ci&reason=check",
            BASE.as_str(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let id = plan["operation_id"]
        .as_str()
        .expect("operation id")
        .to_owned();
    let (status, op) = call(&a, get(&format!("/admin/runtime/operations/{id}"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            op["kind"].as_str(),
            op["outcome"].as_str(),
            op["requested_by"].as_str()
        ),
        (Some("preview"), Some("succeeded"), Some("ci"))
    );
    let (status, _) = call(&a, get("/admin/runtime/operations/op-999999")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn activate_commits_then_conflicts_then_is_unchanged() {
    let a = admin();
    let candidate = BASE.replace("\"15s\"", "\"5s\"");
    let (status, activation) = call(
        &a,
        toml(
            "/admin/runtime/activate?expected_generation=1&requested_by=ci",
            &candidate,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{activation}");
    assert_eq!(activation["outcome"], "activated");
    assert_eq!(
        (
            activation["generation"].as_u64(),
            activation["previous_generation"].as_u64()
        ),
        (Some(2), Some(1))
    );
    assert_eq!(activation["rolled_back_to"], Value::Null);
    assert_eq!(activation["listeners"][0]["name"], "web");
    assert_eq!(activation["listeners"][0]["state"], "bound");
    assert!(activation["operation_id"]
        .as_str()
        .is_some_and(|id| id.starts_with("op-")));
    assert_eq!(a.control.store().active_id(), GenerationId(2));

    let (status, conflict) = call(
        &a,
        toml(
            "/admin/runtime/activate?expected_generation=1",
            BASE.as_str(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(conflict["error"], "generation_conflict");
    assert_eq!(
        (
            conflict["expected_generation"].as_u64(),
            conflict["active_generation"].as_u64()
        ),
        (Some(1), Some(2))
    );

    let (status, same) = call(&a, toml("/admin/runtime/activate", &candidate)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (same["outcome"].as_str(), same["generation"].as_u64()),
        (Some("unchanged"), Some(2))
    );
    assert_eq!(a.control.store().active_id(), GenerationId(2));

    let (status, reload) = call(&a, post("/admin/runtime/reload", "application/json", "")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (reload["outcome"].as_str(), reload["generation"].as_u64()),
        (Some("activated"), Some(3))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_status_shows_active_is_already_in_the_history() {
    let a = Arc::new(admin());
    // 600 KiB of comment that does not compress well: what the
    // history keeps of each generation takes a while to make, which
    // widens any gap between the swap and the record.
    let mut noise = String::from("\n");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while noise.len() < 600 << 10 {
        noise.push_str("# ");
        for _ in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            noise.push_str(&format!("{x:016x}"));
        }
        noise.push('\n');
    }
    let writer = {
        let a = Arc::clone(&a);
        tokio::spawn(async move {
            for round in 0..20 {
                let timeout = if round % 2 == 0 { "\"5s\"" } else { "\"15s\"" };
                let text = BASE.replace("\"15s\"", timeout) + &noise;
                let (status, _) = call(&a, toml("/admin/runtime/activate", &text)).await;
                assert_eq!(status, StatusCode::OK);
            }
        })
    };
    // A pipeline polling status, then reading what it saw become active.
    let mut seen = 0;
    while !writer.is_finished() {
        let (_, status) = call(&a, get("/admin/runtime/status")).await;
        let Some(active) = status["active_generation"].as_u64() else {
            panic!("{status}");
        };
        let (code, detail) = call(&a, get(&format!("/admin/runtime/history/{active}"))).await;
        assert_eq!(
            code,
            StatusCode::OK,
            "generation {active} active but: {detail}"
        );
        seen += 1;
    }
    writer.await.expect("activations");
    assert!(seen > 0);
}

#[tokio::test]
async fn invalid_and_restart_required_candidates_are_422_and_change_nothing() {
    let a = admin();
    let invalid = BASE.replace("timeout = \"15s\"", "timeout = \"soon\"");
    let (status, plan) = call(&a, toml("/admin/runtime/activate", &invalid)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(plan["errors"][0]["code"], "invalid_duration");

    let moved = BASE.replace(
        "name = \"web\"\nbind = \"127.0.0.1:0\"",
        "name = \"web\"\nbind = \"127.0.0.1:1\"",
    );
    let (status, plan) = call(&a, toml("/admin/runtime/activate", &moved)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(plan["activatable"], false);
    assert_eq!(plan["rejected"][0]["path"], "listeners.web.bind");
    assert_eq!(plan["rejected"][0]["reason"], "restart_required");
    // The refusal names the command that applies it.
    let action = plan["rejected"][0]["action"].as_str().unwrap_or_default();
    assert!(action.contains("cutover ctl upgrade --config"), "{action}");
    assert_eq!(plan["diff"]["summary"]["restart_required"], 1);
    assert_eq!(a.control.store().active_id(), GenerationId(1));

    let (_, history) = call(&a, get("/admin/runtime/history")).await;
    let outcomes: Vec<_> = history["operations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| o["outcome"].clone())
        .collect();
    assert_eq!(outcomes, vec![json!("rejected"), json!("rejected")]);
}

#[tokio::test]
async fn expected_generation_can_be_required() {
    let text = BASE.replace("[admin]\n", "[admin]\nrequire_expected_generation = true\n");
    let a = admin_with(&text, None);
    let (status, body) = call(&a, toml("/admin/runtime/activate", &text)).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(body["error"], "expected_generation_required");
    let (status, _) = call(
        &a,
        toml("/admin/runtime/activate?expected_generation=1", &text),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn draining_refuses_changes_and_readiness() {
    let a = admin();
    let (status, _) = call(&a, get("/admin/ready")).await;
    assert_eq!(status, StatusCode::OK);
    a.control.phase().advance(Phase::Draining);
    let (status, body) = call(&a, toml("/admin/runtime/activate", BASE.as_str())).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("draining"))
    );
    let (status, _) = call(&a, get("/admin/ready")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = call(&a, get("/admin/health")).await;
    assert_eq!(status, StatusCode::OK);
}

/// Threads that control-plane work of `history_reads_plan_off_the_serving_thread` ran on.
static WORKED_ON: std::sync::Mutex<Vec<std::thread::ThreadId>> = std::sync::Mutex::new(Vec::new());

fn note_thread() {
    if let Ok(mut threads) = WORKED_ON.lock() {
        threads.push(std::thread::current().id());
    }
}

/// History views plan every retained configuration (`rollback_candidate`,
/// the detail's diff): tens of milliseconds each for large ones, which
/// must not stall a thread that serves requests.
#[tokio::test]
async fn history_reads_plan_off_the_serving_thread() {
    let a = admin_with_hook(BASE.as_str(), None, note_thread);
    let v2 = BASE.replace("\"15s\"", "\"5s\"");
    assert_eq!(
        call(&a, toml("/admin/runtime/activate", &v2)).await.0,
        StatusCode::OK
    );
    WORKED_ON.lock().expect("lock").clear();
    let (status, history) = call(&a, get("/admin/runtime/history")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(history["generations"][1]["rollback_candidate"], true);
    let (status, detail) = call(&a, get("/admin/runtime/history/2")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        detail["diff"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("5s")),
        "{detail}"
    );
    let threads = WORKED_ON.lock().expect("lock").clone();
    // This current-thread runtime's only thread is the test's.
    assert_eq!(threads.len(), 2, "{threads:?}");
    assert!(threads.iter().all(|t| *t != std::thread::current().id()));
}

#[tokio::test]
async fn history_status_and_rollback() {
    let a = admin();
    let v2 = BASE.replace("\"15s\"", "\"5s\"");
    let with_listener = format!("{v2}\n[[listeners]]\nname = \"extra\"\nbind = \"127.0.0.1:0\"\n");
    assert_eq!(
        call(&a, toml("/admin/runtime/activate", &v2)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&a, toml("/admin/runtime/activate", &with_listener))
            .await
            .0,
        StatusCode::OK
    );

    let (status, history) = call(&a, get("/admin/runtime/history")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(history["active_generation"], 3);
    assert_eq!(history["history_limit"], 16);
    let generations = history["generations"].as_array().expect("generations");
    let ids: Vec<_> = generations
        .iter()
        .map(|g| g["generation"].as_u64())
        .collect();
    assert_eq!(ids, vec![Some(3), Some(2), Some(1)]);
    assert_eq!(generations[0]["status"], "active");
    assert_eq!(generations[0]["rollback_candidate"], false);
    // Going back to 2 or 1 would remove the `extra` listener: restart-required.
    assert_eq!(generations[1]["rollback_candidate"], false);
    assert_eq!(generations[0]["source"], "activate");

    // Candidacy was planned once for each retained generation, against
    // generation 3, and a second look plans nothing more.
    assert_eq!(a.control.cached_candidacy(), (GenerationId(3), 2));
    let (_, again) = call(&a, get("/admin/runtime/history")).await;
    assert_eq!(again["generations"], history["generations"]);
    assert_eq!(a.control.cached_candidacy(), (GenerationId(3), 2));

    let (status, detail) = call(&a, get("/admin/runtime/history/2")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["predecessor"], 1);
    assert!(detail["config"].as_str().is_some_and(|c| c.contains("5s")));
    assert_eq!(detail["diff"]["summary"]["modified"], 1);
    assert_eq!(
        call(&a, get("/admin/runtime/history/99")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&a, get("/admin/runtime/history/abc")).await.0,
        StatusCode::BAD_REQUEST
    );

    let rollback = |body: Value| {
        post(
            "/admin/runtime/rollback",
            "application/json",
            body.to_string(),
        )
    };
    let (status, body) = call(
        &a,
        rollback(json!({ "target_generation": 2, "expected_active_generation": 3 })),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"], "target_not_activatable");
    assert_eq!(body["rejected"][0]["path"], "listeners.extra");
    let (status, body) = call(&a, rollback(json!({ "target_generation": 3 }))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("target_active"))
    );
    let (status, body) = call(&a, rollback(json!({ "target_generation": 42 }))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("generation_not_retained"))
    );

    // Add generation 4 without the listener removal problem: back to 3's content.
    let v4 = with_listener.replace("\"5s\"", "\"7s\"");
    assert_eq!(
        call(&a, toml("/admin/runtime/activate", &v4)).await.0,
        StatusCode::OK
    );
    let (status, body) = call(
        &a,
        rollback(json!({ "target_generation": 3, "expected_active_generation": 2 })),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("generation_conflict"))
    );
    let (status, body) = call(&a, rollback(json!({ "target_generation": 3, "expected_active_generation": 4, "reason": "bad deploy" }))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["generation"].as_u64(), body["rolled_back_to"].as_u64()),
        (Some(5), Some(3))
    );

    let (status, st) = call(&a, get("/admin/runtime/status")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(st["active_generation"], 5);
    assert_eq!(st["phase"], "running");
    assert_eq!(st["last_operation"]["kind"], "rollback");
    assert_eq!(st["last_operation"]["outcome"], "succeeded");
    assert!(st["pid"].as_u64().is_some());
    assert_eq!(
        st["generations"][st["generations"].as_array().map_or(0, Vec::len) - 1]["generation"],
        5
    );
    let (status, _) = call(&a, post("/admin/runtime/rollback", "text/plain", "3")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn guards_refuse_without_detail() {
    let a = admin_with(BASE.as_str(), Some("0123456789abcdef-secret"));
    let (status, body) = call(&a, get("/admin/runtime/status")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        body,
        serde_json::json!({ "error": "unauthorized", "message": "authentication required" })
    );
    let authed = |req: axum::http::request::Builder| {
        req.header("authorization", "Bearer 0123456789abcdef-secret")
            .body(Body::empty())
            .expect("request")
    };
    let (status, _) = call(
        &a,
        authed(Request::get("/admin/runtime/status").header("host", ADMIN)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(
        &a,
        authed(Request::get("/admin/runtime/status").header("host", "localhost:9190")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(
        &a,
        authed(Request::get("/admin/runtime/status").header("host", "evil.example:9190")),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(
        &a,
        authed(
            Request::get("/admin/runtime/status")
                .header("host", ADMIN)
                .header("origin", "https://evil.example"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(
        &a,
        authed(
            Request::get("/admin/runtime/status")
                .header("host", ADMIN)
                .header("origin", "http://127.0.0.1:9190"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // No Host, two Hosts, an absolute-form target naming another host,
    // or a second, foreign Origin: refused like a wrong Host.
    let (status, _) = call(
        &a,
        authed(Request::get("http://evil.example/admin/runtime/status").header("host", ADMIN)),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(
        &a,
        authed(Request::get(format!("http://{ADMIN}/admin/runtime/status")).header("host", ADMIN)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(&a, authed(Request::get("/admin/runtime/status"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(
        &a,
        authed(
            Request::get("/admin/runtime/status")
                .header("host", ADMIN)
                .header("host", ADMIN),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(
        &a,
        authed(
            Request::get("/admin/runtime/status")
                .header("host", ADMIN)
                .header("origin", "http://127.0.0.1:9190")
                .header("origin", "https://evil.example"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let wrong = Request::get("/admin/runtime/status")
        .header("host", ADMIN)
        .header("authorization", "Bearer 0123456789abcdef-secreT")
        .body(Body::empty())
        .expect("request");
    assert_eq!(call(&a, wrong).await.0, StatusCode::UNAUTHORIZED);
}

/// Stands in for the process lifecycle: records what it was asked.
#[derive(Default)]
struct FakeProcess {
    draining: std::sync::atomic::AtomicBool,
}

impl crate::control::ProcessControl for FakeProcess {
    fn binary(&self) -> Option<crate::control::BinaryView> {
        None
    }

    fn drain(
        &self,
        _control: &Arc<Control>,
        _requester: crate::control::Requester,
    ) -> Result<String, crate::control::LifecycleError> {
        if self
            .draining
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(crate::control::LifecycleError::AlreadyDraining);
        }
        Ok("op-000900".into())
    }

    fn upgrade(
        &self,
        _control: &Arc<Control>,
        request: crate::control::UpgradeRequest,
    ) -> Result<String, crate::control::LifecycleError> {
        match request.config.as_deref() {
            Some("busy") => Err(crate::control::LifecycleError::UpgradeRunning),
            Some(text) => {
                let plan = crate::plan::plan(
                    &ConfigText::inline(text.to_owned(), ".".into(), "<t>"),
                    None,
                );
                if plan.errors.is_empty() {
                    Ok("op-000901".into())
                } else {
                    Err(crate::control::LifecycleError::Invalid(Box::new(plan)))
                }
            }
            None => Ok("op-000902".into()),
        }
    }
}

#[tokio::test]
async fn lifecycle_endpoints_map_every_outcome() {
    let a = admin();
    // Without a process lifecycle (as in a library embedding): 503.
    let (status, body) = call(&a, post("/admin/lifecycle/drain", "application/json", "")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    a.control.set_process(Arc::new(FakeProcess::default()));

    let (status, body) = call(&a, post("/admin/lifecycle/upgrade", "application/json", "")).await;
    assert_eq!(
        (status, body["operation_id"].as_str()),
        (StatusCode::ACCEPTED, Some("op-000902"))
    );
    let (status, body) = call(&a, toml("/admin/lifecycle/upgrade", BASE.as_str())).await;
    assert_eq!(
        (status, body["operation_id"].as_str()),
        (StatusCode::ACCEPTED, Some("op-000901"))
    );
    let (status, body) = call(&a, toml("/admin/lifecycle/upgrade", "busy")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("operation_in_progress"))
    );
    let (status, body) = call(&a, toml("/admin/lifecycle/upgrade", "[admin\n")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["errors"][0]["code"], "syntax_error");
    let (status, _) = call(
        &a,
        post(
            "/admin/lifecycle/upgrade",
            "application/json",
            r#"{"config_path": "gateway.toml"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, body) = call(&a, post("/admin/lifecycle/drain", "application/json", "")).await;
    assert_eq!(
        (status, body["phase"].as_str()),
        (StatusCode::ACCEPTED, Some("draining"))
    );
    let (status, body) = call(&a, post("/admin/lifecycle/drain", "application/json", "")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_draining"))
    );
}

#[tokio::test]
async fn reload_certs_request_errors() {
    let a = admin();
    // No TLS listener: nothing to reload, nothing minted.
    let (status, body) = call(
        &a,
        post("/admin/runtime/reload-certs", "application/json", ""),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["outcome"].as_str(), body["generation"].as_u64()),
        (Some("reloaded"), Some(1))
    );
    assert_eq!(body["listeners"], json!([]));
    let (status, body) = call(
        &a,
        post(
            "/admin/runtime/reload-certs",
            "application/json",
            r#"{"listeners": ["web"]}"#,
        ),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("not_a_tls_listener"))
    );
    let (status, _) = call(&a, post("/admin/runtime/reload-certs", "text/plain", "web")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _) = call(
        &a,
        post(
            "/admin/runtime/reload-certs",
            "application/json",
            r#"{"listener": "x"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(a.control.store().active_id(), GenerationId::FIRST);
}

#[tokio::test]
async fn the_admin_page_is_served_with_a_strict_policy_and_no_inline_code() {
    let a = admin_with(BASE.as_str(), None);
    for (path, kind) in [
        ("/admin/", "text/html"),
        ("/admin/ui/app.js", "text/javascript"),
        ("/admin/ui/app.css", "text/css"),
    ] {
        let response = a
            .router
            .clone()
            .oneshot(get(path))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind));
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(
            policy.starts_with("default-src 'none'; script-src 'self';"),
            "{policy}"
        );
        assert!(!policy.contains("unsafe"), "{policy}");
        assert_eq!(headers["x-frame-options"], "DENY");
        assert_eq!(headers["x-content-type-options"], "nosniff");
    }
    let page = a
        .router
        .clone()
        .oneshot(get("/admin/"))
        .await
        .expect("infallible");
    let html = page.into_body().collect().await.expect("body").to_bytes();
    let html = String::from_utf8_lossy(&html);
    // Every script and style comes from the page's own files.
    assert_eq!(html.matches("<script").count(), 1, "{html}");
    assert!(html.contains(r#"<script src="/admin/ui/app.js" defer></script>"#));
    assert!(!html.contains("<style") && !html.contains(" style=") && !html.contains(" on"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no outside assets"
    );
    // The script writes data as text, never as markup.
    let script = include_str!("ui/app.js");
    assert!(!script.contains("innerHTML") && !script.contains("eval("));
}

#[tokio::test]
async fn the_admin_page_asks_a_browser_for_the_token_and_keeps_every_guard() {
    let a = admin_with(BASE.as_str(), Some("0123456789abcdef-secret"));
    let response = a
        .router
        .clone()
        .oneshot(get("/admin/"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.headers()["www-authenticate"],
        r#"Basic realm="cutover admin", charset="UTF-8""#
    );
    // The API itself still asks for a bearer token.
    let response = a
        .router
        .clone()
        .oneshot(get("/admin/runtime/status"))
        .await
        .expect("infallible");
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    use base64::Engine as _;
    let basic = |password: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("operator:{password}"))
        )
    };
    for (path, credentials, expected) in [
        ("/admin/", basic("0123456789abcdef-secret"), StatusCode::OK),
        (
            "/admin/runtime/status",
            basic("0123456789abcdef-secret"),
            StatusCode::OK,
        ),
        ("/admin/", basic("wrong"), StatusCode::UNAUTHORIZED),
        ("/admin/", "Basic !!!".to_owned(), StatusCode::UNAUTHORIZED),
        ("/admin/", basic(""), StatusCode::UNAUTHORIZED),
    ] {
        let request = Request::get(path)
            .header("host", ADMIN)
            .header("authorization", credentials.as_str())
            .body(Body::empty())
            .expect("request");
        let (status, _) = call(&a, request).await;
        assert_eq!(status, expected, "{path} {credentials}");
    }
    // Host and Origin are checked for the page as for any call.
    let credentials = basic("0123456789abcdef-secret");
    for (host, origin) in [("evil.example", None), (ADMIN, Some("http://evil.example"))] {
        let mut request = Request::get("/admin/")
            .header("host", host)
            .header("authorization", credentials.as_str());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        let (status, _) = call(&a, request.body(Body::empty()).expect("request")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{host} {origin:?}");
    }
}

#[tokio::test]
async fn confirm_and_abort_check_their_request_and_need_a_pending_generation() {
    let a = admin_with(BASE.as_str(), None);
    for path in ["/admin/runtime/confirm", "/admin/runtime/abort"] {
        let (status, _) = call(&a, post(path, "text/plain", "{}")).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{path}");
        let (status, body) = call(&a, post(path, "application/json", "{}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        let (status, body) = call(&a, post(path, "application/json", r#"{"generation": 1}"#)).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}");
        assert_eq!(body["error"], "not_pending", "{body}");
    }
    // confirm_within is checked before anything is planned.
    let (status, body) = call(
        &a,
        post(
            "/admin/runtime/activate?confirm_within=forever",
            "application/toml",
            BASE.as_str(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_browser_write_needs_the_console_session_token() {
    use base64::Engine as _;
    let a = admin_with(BASE.as_str(), Some("0123456789abcdef-secret"));
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("operator:0123456789abcdef-secret")
    );
    let with = |headers: &[(&str, &str)], path: &str| {
        let mut request = Request::post(path)
            .header("host", ADMIN)
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .body(Body::from(r#"{"generation": 1}"#))
            .expect("request")
    };
    // The session's token, read with the page's login.
    let session = Request::get("/admin/ui/session")
        .header("host", ADMIN)
        .header("authorization", &basic)
        .body(Body::empty())
        .expect("request");
    let (status, body) = call(&a, session).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let token = body["csrf"].as_str().expect("a token").to_owned();
    assert_eq!(token.len(), 64);
    let origin = format!("http://{ADMIN}");
    for (headers, expected) in [
        // The page's login without the token: refused, whatever else.
        (
            vec![("authorization", basic.as_str())],
            StatusCode::FORBIDDEN,
        ),
        (
            vec![
                ("authorization", basic.as_str()),
                ("x-cutover-csrf", "0000"),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            vec![
                ("authorization", "Bearer 0123456789abcdef-secret"),
                ("origin", origin.as_str()),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            vec![
                ("authorization", "Bearer 0123456789abcdef-secret"),
                ("sec-fetch-site", "same-origin"),
            ],
            StatusCode::FORBIDDEN,
        ),
        // With it: the call is made (nothing pends: 409 not_pending).
        (
            vec![
                ("authorization", basic.as_str()),
                ("x-cutover-csrf", token.as_str()),
            ],
            StatusCode::CONFLICT,
        ),
        // A script's bearer token needs none.
        (
            vec![("authorization", "Bearer 0123456789abcdef-secret")],
            StatusCode::CONFLICT,
        ),
        // No credentials at all: 401 first.
        (vec![("origin", origin.as_str())], StatusCode::UNAUTHORIZED),
    ] {
        let (status, body) = call(&a, with(&headers, "/admin/runtime/confirm")).await;
        assert_eq!(status, expected, "{headers:?}: {body}");
    }
    // A token read under one login is worth nothing under another.
    let other = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("someone:0123456789abcdef-secret")
    );
    let (status, _) = call(
        &a,
        with(
            &[
                ("authorization", other.as_str()),
                ("x-cutover-csrf", token.as_str()),
            ],
            "/admin/runtime/confirm",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Reads need no token.
    let (status, _) = call(
        &a,
        Request::get("/admin/runtime/timeline")
            .header("host", ADMIN)
            .header("authorization", &basic)
            .header("origin", origin.as_str())
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn the_timeline_answers_points_backends_and_events() {
    let a = admin();
    a.control.sample_timeline();
    a.control.sample_timeline();
    let (status, body) = call(&a, get("/admin/runtime/timeline")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["interval_seconds"], 1);
    assert_eq!(body["window_seconds"], 900);
    let points = body["points"].as_array().expect("points");
    assert_eq!(points.len(), 2, "{body}");
    assert_eq!(points[0]["roles"][0]["role"], "active", "{body}");
    assert_eq!(points[0]["roles"][0]["generation"], 1, "{body}");
    assert!(body["backends"].is_array());
    assert!(body["events"].is_array());
}

#[tokio::test]
async fn guards_and_canary_steps_are_checked_before_anything_is_planned() {
    let a = admin_with(BASE.as_str(), None);
    let config = serde_json::to_string(BASE.as_str()).expect("json");
    for (extra, says) in [
        (
            r#""guard": { "window": "0s", "on_no_data": "fail" }"#,
            "guard.window",
        ),
        (
            r#""guard": { "window": "10s", "max_error_ratio": 2, "on_no_data": "fail" }"#,
            "max_error_ratio",
        ),
        (
            r#""guard": { "window": "10s", "on_no_data": "maybe" }"#,
            "on_no_data",
        ),
        (
            r#""guard": { "window": "10s", "max_p99": "0s", "on_no_data": "fail" }"#,
            "max_p99",
        ),
        (
            r#""guard": { "window": "10s", "max_block_ratio": 1.5, "on_no_data": "fail" }"#,
            "guard.max_block_ratio 1.5",
        ),
        // Nothing would ever settle it.
        (r#""guard": { "window": "10s" }"#, "needs confirm_within"),
        // The deadline would always come first.
        (
            r#""guard": { "window": "2m" }, "confirm_on_pass": true, "confirm_within": "1m""#,
            "not shorter than confirm_within",
        ),
        (r#""confirm_on_pass": true"#, "needs a guard"),
        (
            r#""steps": [10, 5, 100], "step_interval": "10s""#,
            "must grow",
        ),
        (r#""steps": [10, 50], "step_interval": "10s""#, "end at 100"),
        (r#""steps": [10, 100]"#, "need step_interval"),
        (
            r#""steps": [10, 100], "step_interval": "10s", "hash_key": "body""#,
            "hash_key",
        ),
        (r#""step_interval": "10s""#, "need steps"),
        (
            r#""shadow": { "percent": 0, "duration": "10s" }"#,
            "shadow.percent",
        ),
        (
            r#""shadow": { "percent": 101, "duration": "10s" }"#,
            "shadow.percent",
        ),
        (r#""shadow": { "duration": "2h" }"#, "between 1s and 1h"),
        (r#""shadow": { "duration": "soon" }"#, "shadow.duration"),
        (r#""shadow": { "percent": 10 }"#, "missing field `duration`"),
        (
            r#""shadow": { "duration": "10s", "max_error_ratio": -1 }"#,
            "shadow.max_error_ratio",
        ),
        (
            r#""shadow": { "duration": "10s", "max_p99_ratio": 0.5 }"#,
            "shadow.max_p99_ratio",
        ),
        (
            r#""shadow": { "duration": "10s", "max_block_increase": 0.1 }"#,
            "needs shadow.waf = true",
        ),
        (
            r#""shadow": { "duration": "10s", "waf": true, "max_block_increase": 2 }"#,
            "shadow.max_block_increase 2",
        ),
        (
            r#""shadow": { "duration": "10s", "waf": true, "max_error_ratio": 0.1 }"#,
            "takes no max_error_ratio",
        ),
        (
            r#""shadow": { "duration": "10s", "max_inflight": 0 }"#,
            "shadow.max_inflight",
        ),
        (
            r#""shadow": { "duration": "10s", "on_no_data": "maybe" }"#,
            "shadow.on_no_data",
        ),
        (
            r#""shadow": { "duration": "10s", "copies": 3 }"#,
            "unknown field `copies`",
        ),
    ] {
        let body = format!(r#"{{ "config": {config}, {extra} }}"#);
        let (status, answer) = call(
            &a,
            post("/admin/runtime/activate", "application/json", body),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{extra}: {message}");
    }
    let (status, body) = call(&a, get("/admin/runtime/status")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["active_generation"], 1, "{body}");
}

#[tokio::test]
async fn an_upgrade_refuses_what_only_an_activation_honours() {
    let a = admin_with(BASE.as_str(), None);
    for extra in [
        r#""confirm_within": "1m""#,
        r#""guard": { "window": "10s", "on_no_data": "fail" }"#,
        r#""steps": [10, 100], "step_interval": "10s""#,
        r#""shadow": { "duration": "10s" }"#,
    ] {
        let body = format!(r#"{{ {extra} }}"#);
        let (status, answer) = call(
            &a,
            post("/admin/lifecycle/upgrade", "application/json", body),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {answer}");
    }
}

#[tokio::test]
async fn fleet_endpoints_say_when_the_instance_is_not_in_a_fleet() {
    let a = admin();
    let (status, body) = call(&a, get("/admin/fleet/status")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["message"].as_str().unwrap().contains("not in a fleet"));
    let (status, _) = call(
        &a,
        post(
            "/admin/fleet/forget",
            "application/json",
            r#"{"instance":"a"}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(
        &a,
        post("/admin/fleet/forget", "application/json", r#"{"name":"a"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call(&a, post("/admin/fleet/forget", "text/plain", "a")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Status carries no fleet block outside a fleet.
    let (_, status) = call(&a, get("/admin/runtime/status")).await;
    assert!(status.get("fleet").is_none());
}

/// `cutover ctl` reads answers as the types the API serializes them
/// from: every answer must read back as its type and serialize to the
/// same JSON (a field skipped without a default, or renamed one way only,
/// fails here instead of in an operator's pipeline).
#[tokio::test]
async fn every_answer_reads_back_as_the_type_it_was_written_from() {
    use crate::control::{BackendsView, CertReload, GenerationDetail, HistoryView, RecordedPlan};
    use crate::plan::Plan;
    use crate::runtime::OperationRecord;
    use crate::writer::{Activated, Settlement, Status};
    use serde::de::DeserializeOwned;

    fn same<T: DeserializeOwned + serde::Serialize>(what: &str, value: &Value) {
        let read: T = serde_json::from_value(value.clone())
            .unwrap_or_else(|e| panic!("{what} does not read back: {e}\n{value:#}"));
        assert_eq!(&serde_json::to_value(read).unwrap(), value, "{what}");
    }

    let a = admin();
    let candidate = BASE.replace("\"15s\"", "\"5s\"");
    let (_, plan) = call(&a, toml("/admin/runtime/validate", &candidate)).await;
    same::<Plan>("validate", &plan);
    let invalid = BASE.replace("respond = { body = \"hello\" }", "upstream = \"nope\"");
    let (_, refused) = call(&a, toml("/admin/runtime/validate", &invalid)).await;
    same::<Plan>("validate (refused)", &refused);
    let (_, preview) = call(&a, toml("/admin/runtime/preview", &candidate)).await;
    same::<RecordedPlan>("preview", &preview);

    let (status, activated) = call(
        &a,
        toml(
            "/admin/runtime/activate?expected_generation=1&confirm_within=5m",
            &candidate,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{activated}");
    assert!(activated["pending"].is_object(), "{activated}");
    same::<Activated>("activate", &activated);
    let (_, status_view) = call(&a, get("/admin/runtime/status")).await;
    assert!(status_view["pending"].is_object(), "{status_view}");
    same::<Status>("status", &status_view);
    let (_, settled) = call(
        &a,
        post(
            "/admin/runtime/confirm",
            "application/json",
            r#"{"generation": 2}"#,
        ),
    )
    .await;
    same::<Settlement>("confirm", &settled);

    let (status, rolled) = call(
        &a,
        post(
            "/admin/runtime/rollback",
            "application/json",
            r#"{"target_generation": 1}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rolled}");
    same::<Activated>("rollback", &rolled);
    let (_, history) = call(&a, get("/admin/runtime/history")).await;
    same::<HistoryView>("history", &history);
    let (_, detail) = call(&a, get("/admin/runtime/history/2")).await;
    same::<GenerationDetail>("history/2", &detail);
    let (_, backends) = call(&a, get("/admin/runtime/backends")).await;
    same::<BackendsView>("backends", &backends);
    let (_, certs) = call(
        &a,
        post("/admin/runtime/reload-certs", "application/json", "{}"),
    )
    .await;
    same::<CertReload>("reload-certs", &certs);
    let operation = history["operations"][0]["id"].as_str().unwrap_or_default();
    let (_, record) = call(&a, get(&format!("/admin/runtime/operations/{operation}"))).await;
    same::<OperationRecord>("operations/{id}", &record);

    let (status, conflict) = call(
        &a,
        toml(
            "/admin/runtime/activate?expected_generation=1",
            BASE.as_str(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    let refusal: super::ErrorBody = serde_json::from_value(conflict).unwrap();
    assert_eq!(refusal.error.as_deref(), Some("generation_conflict"));
}

/// Each caller is held to its scopes: a read-only caller reads and is
/// refused every change with 403 naming the scope it lacks; a pipeline
/// that validates cannot activate; an unknown token gets 401 and nothing
/// more; `admin` may do everything.
#[tokio::test]
async fn callers_are_held_to_their_scopes() {
    use crate::plan::Scope;
    let callers = [
        caller("dashboard", "dashboard-token-0123456789", &[Scope::Read]),
        caller(
            "ci",
            "ci-pipeline-token-0123456789",
            &[Scope::Read, Scope::Validate],
        ),
        caller("oncall", "oncall-token-0123456789abc", &[Scope::Admin]),
    ];
    let admin = admin_with_callers(BASE.as_str(), &callers, || {});
    let as_caller = |token: &str, mut req: Request<Body>| {
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        req
    };
    let activate = |token: &str| {
        as_caller(
            token,
            toml("/admin/runtime/activate", &BASE.replace("hello", "bye")),
        )
    };
    // Reads: every caller.
    for token in ["dashboard-token-0123456789", "ci-pipeline-token-0123456789"] {
        let (status, _) = call(&admin, as_caller(token, get("/admin/runtime/status"))).await;
        assert_eq!(status, StatusCode::OK);
    }
    // A change outside the scopes: 403 naming the missing one.
    let (status, body) = call(&admin, activate("dashboard-token-0123456789")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "forbidden");
    assert_eq!(body["missing_scope"], "activate");
    assert!(
        !body.to_string().contains("oncall"),
        "no other caller named: {body}"
    );
    let (status, body) = call(
        &admin,
        as_caller(
            "dashboard-token-0123456789",
            toml("/admin/runtime/validate", BASE.as_str()),
        ),
    )
    .await;
    assert_eq!(
        (status, body["missing_scope"].as_str()),
        (StatusCode::FORBIDDEN, Some("validate"))
    );
    // The pipeline validates but does not activate.
    let (status, _) = call(
        &admin,
        as_caller(
            "ci-pipeline-token-0123456789",
            toml("/admin/runtime/validate", BASE.as_str()),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(&admin, activate("ci-pipeline-token-0123456789")).await;
    assert_eq!(
        (status, body["missing_scope"].as_str()),
        (StatusCode::FORBIDDEN, Some("activate"))
    );
    for (path, scope) in [
        ("/admin/runtime/reload-certs", "certs"),
        ("/admin/cache/purge", "cache"),
        ("/admin/lifecycle/drain", "lifecycle"),
        ("/admin/fleet/forget", "fleet"),
        ("/admin/runtime/rollback", "activate"),
    ] {
        let (status, body) = call(
            &admin,
            as_caller(
                "ci-pipeline-token-0123456789",
                post(path, "application/json", "{}"),
            ),
        )
        .await;
        assert_eq!(
            (status, body["missing_scope"].as_str()),
            (StatusCode::FORBIDDEN, Some(scope)),
            "{path}"
        );
    }
    // Nothing was changed by the refusals.
    assert_eq!(admin.control.store().active_id(), GenerationId(1));
    // An unknown token, or none: 401, nothing more.
    for req in [
        activate("not-a-token-of-anyone-0123"),
        toml("/admin/runtime/activate", BASE.as_str()),
    ] {
        let (status, body) = call(&admin, req).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(body.get("missing_scope").is_none(), "{body}");
    }
    // `admin` covers every scope.
    let (status, body) = call(&admin, activate("oncall-token-0123456789abc")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(admin.control.store().active_id(), GenerationId(2));
    // History names the authenticated caller beside the free text.
    let (status, history) = call(
        &admin,
        as_caller("dashboard-token-0123456789", get("/admin/runtime/history")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let activated = history["operations"]
        .as_array()
        .and_then(|ops| ops.iter().find(|op| op["kind"] == "activate"))
        .unwrap_or_else(|| panic!("{history}"));
    assert_eq!(activated["caller"], "oncall", "{activated}");
    let generation = history["generations"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["generation"] == 2))
        .unwrap_or_else(|| panic!("{history}"));
    assert_eq!(generation["caller"], "oncall", "{generation}");
}

/// Reads SSE events off `body` until `n` have come (comments skipped):
/// `(id, event, data)` each.
async fn sse_events(body: &mut Body, n: usize) -> Vec<(Option<String>, String, Value)> {
    let mut text = String::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while out.len() < n {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("events in time")
            .expect("the stream goes on")
            .expect("a frame");
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            if !event.is_empty() {
                out.push((
                    id,
                    event,
                    serde_json::from_str(&data).unwrap_or(Value::Null),
                ));
            }
        }
    }
    out
}

fn events_request(last_event_id: Option<&str>) -> Request<Body> {
    let mut builder = Request::get("/admin/events").header("host", ADMIN);
    if let Some(id) = last_event_id {
        builder = builder.header("last-event-id", id);
    }
    builder.body(Body::empty()).expect("request")
}

/// `GET /admin/events`: an activation with a confirm window, its pending
/// generation and its confirmation, in order, each with its operation;
/// a reader that comes back with `Last-Event-ID` gets what came after
/// its id, one with another process's id gets `reset` first; previews
/// and validations are not events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_stream_in_order_and_resume_from_their_id() {
    let a = admin();
    let response = a
        .router
        .clone()
        .oneshot(events_request(None))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("text/event-stream")
    );
    let mut body = response.into_body();
    let candidate = BASE.replace("\"15s\"", "\"5s\"");
    call(&a, toml("/admin/runtime/validate", &candidate)).await;
    call(&a, toml("/admin/runtime/preview", &candidate)).await;
    let (status, activated) = call(
        &a,
        toml(
            "/admin/runtime/activate?confirm_within=5m&reason=faster",
            &candidate,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{activated}");
    let (status, _) = call(
        &a,
        post(
            "/admin/runtime/confirm",
            "application/json",
            r#"{"generation": 2}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let seen = sse_events(&mut body, 3).await;
    let kinds: Vec<&str> = seen.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(kinds, ["activation", "pending", "confirmed"], "{seen:#?}");
    let (_, _, activation) = &seen[0];
    assert_eq!(activation["generation"], 2);
    assert_eq!(activation["operation"]["reason"], "faster");
    assert_eq!(activation["operation"]["outcome"], "succeeded");
    assert_eq!(seen[1].2["pending"]["generation"], 2);
    assert!(
        seen[1].2["pending"]["deadline"].is_string(),
        "{:#}",
        seen[1].2
    );
    assert_eq!(seen[2].2["operation"]["kind"], "confirm");
    // Each event carries its id in the data too.
    assert_eq!(
        seen[0].0.as_deref(),
        seen[0].2["id"].as_str(),
        "{:#}",
        seen[0].2
    );

    // Back with the first one's id: the two after it.
    let first = seen[0].0.clone().expect("an id");
    let response = a
        .router
        .clone()
        .oneshot(events_request(Some(&first)))
        .await
        .expect("infallible");
    let mut again = response.into_body();
    let resumed = sse_events(&mut again, 2).await;
    assert_eq!(
        resumed
            .iter()
            .map(|(id, _, _)| id.clone())
            .collect::<Vec<_>>(),
        [seen[1].0.clone(), seen[2].0.clone()]
    );

    // Another process's id: reset, then what this one holds.
    let response = a
        .router
        .clone()
        .oneshot(events_request(Some("1-7")))
        .await
        .expect("infallible");
    let mut other = response.into_body();
    let reset = sse_events(&mut other, 4).await;
    let kinds: Vec<&str> = reset.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(kinds, ["reset", "activation", "pending", "confirmed"]);

    // The stream ends when the process hands over.
    a.control.events().close();
    let end = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(frame) = body.frame().await {
            frame.expect("a frame");
        }
    })
    .await;
    assert!(end.is_ok(), "the stream ended");
}

/// The console refreshes on every event kind there is (a kind added to
/// the ring and not to the page would show only at the next poll).
#[test]
fn the_console_listens_for_every_event_kind() {
    let script = include_str!("ui/app.js");
    for kind in crate::runtime::events::KINDS {
        assert!(
            script.contains(&format!("\"{kind}\"")),
            "{kind} not in app.js"
        );
    }
}

/// A proposal whose time ran out is expired (an event says so) and can
/// no longer be approved; events and webhooks carry no candidate text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_proposal_cannot_be_approved() {
    use crate::plan::Scope;
    use sha2::Digest as _;
    let (bob, alice) = ("bob-token-0123456789abcdef", "alice-token-0123456789abcd");
    let hex = |token: &str| -> String {
        sha2::Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let text = format!(
        "{}\n[admin.approval]\nrequired_for = [\"activate\"]\n\n[[admin.callers]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\nscopes = [\"read\", \"activate\"]\n\n[[admin.callers]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nscopes = [\"read\", \"approve\"]\n",
        *BASE,
        hex(bob),
        hex(alice)
    );
    let callers = [
        caller("bob", bob, &[Scope::Read, Scope::Activate]),
        caller("alice", alice, &[Scope::Read, Scope::Approve]),
    ];
    let a = admin_with_callers(&text, &callers, || {});
    let as_caller = |token: &str, mut req: Request<Body>| {
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        req
    };
    let mut events = a
        .router
        .clone()
        .oneshot(as_caller(alice, events_request(None)))
        .await
        .expect("infallible")
        .into_body();
    let candidate = text.replace("body = \"hello\"", "body = \"secret-text\"");
    let (status, body) = call(
        &a,
        as_caller(bob, toml("/admin/runtime/activate", &candidate)),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["proposal"]["id"].as_str().expect("id").to_owned();
    // Its time runs out.
    a.control.with_history(|h| {
        h.update_proposals(|proposals| proposals[0].expires_unix_ms = 1);
    });
    let (_, body) = call(
        &a,
        as_caller(alice, get(&format!("/admin/runtime/proposals/{id}"))),
    )
    .await;
    assert_eq!(body["proposal"]["state"], "expired", "{body}");
    let (status, body) = call(
        &a,
        as_caller(
            alice,
            post(
                &format!("/admin/runtime/proposals/{id}/approve"),
                "application/json",
                "{}",
            ),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        (body["error"].as_str(), body["state"].as_str()),
        (Some("proposal_closed"), Some("expired"))
    );
    let seen = sse_events(&mut events, 2).await;
    let kinds: Vec<&str> = seen.iter().map(|(_, e, _)| e.as_str()).collect();
    assert_eq!(kinds, ["proposal_made", "proposal_expired"]);
    for (_, _, data) in &seen {
        assert!(!data.to_string().contains("secret-text"), "{data}");
        assert_eq!(data["proposal"]["id"], id.as_str());
    }
    // Nothing changed.
    assert_eq!(a.control.store().active_id(), GenerationId(1));
}

//! Approvals against the real binary (DESIGN §23): a change that needs
//! approval becomes a proposal (202) and changes nothing; its proposer
//! cannot approve it; another caller's approval carries it out as asked
//! (its confirm window included) and history names both; a proposal
//! overtaken by another activation is refused with 409 when approved; a
//! proposal survives a restart and is approved after it.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use serde_json::Value;

use crate::harness::*;

const BOB: &str = "bob-token-0123456789abcdef";
const ALICE: &str = "alice-token-0123456789abcdef";
const CI: &str = "ci-token-0123456789abcdef0";

async fn call(
    gw: &Gateway,
    token: &str,
    method: &str,
    path: &str,
    body: Option<(&str, String)>,
) -> (u16, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", gw.admin.to_string())
        .header("authorization", format!("Bearer {token}"));
    let body = match body {
        Some((content_type, body)) => {
            req = req.header("content-type", content_type);
            body
        }
        None => String::new(),
    };
    let (status, _, bytes) = send(gw.admin, req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .expect("admin reachable");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn with_body(config: &str, body: &str) -> String {
    config.replace("body = \"one\"", &format!("body = \"{body}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_waits_for_another_callers_approval_and_is_carried_out_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    write_secrets(
        dir.path(),
        &[("bob.token", BOB), ("alice.token", ALICE), ("ci.token", CI)],
    );
    let text = r#"[runtime]
state_dir = "state"

[admin]
bind = "127.0.0.1:0"

[admin.approval]
required_for = ["activate", "rollback"]
approvers = 1
expire = "1h"

[[admin.callers]]
name = "ci"
token_file = "ci.token"
scopes = ["read", "validate", "activate"]

[[admin.callers]]
name = "alice"
token_file = "alice.token"
scopes = ["read", "approve"]

[[admin.callers]]
name = "bob"
token_file = "bob.token"
scopes = ["read", "activate", "approve"]

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "hello"
listeners = ["web"]
respond = { body = "one" }
"#;
    let gw = Gateway::start_in(dir, text);
    let config = std::fs::read_to_string(&gw.config_path).unwrap();
    let toml = |body: &str| Some(("application/toml", with_body(&config, body)));

    // An activation becomes a proposal and changes nothing.
    let (status, body) = call(
        &gw,
        BOB,
        "POST",
        "/admin/runtime/activate?confirm_within=5m&reason=ship+two",
        toml("two"),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let first = body["proposal"].clone();
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(first["state"], "open");
    assert_eq!(first["proposer"], "bob");
    assert_eq!(first["expected_generation"], 1);
    assert_eq!(first["plan"]["diff"]["summary"]["modified"], 1, "{first:#}");
    assert_eq!(get(gw.listener("web"), "x", "/").await.2, "one");

    // Not by its proposer; not without the scope.
    let approve = |id: &str| format!("/admin/runtime/proposals/{id}/approve");
    let (status, body) = call(&gw, BOB, "POST", &approve(&id), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("self_approval")),
        "{body}"
    );
    let (status, body) = call(&gw, CI, "POST", &approve(&id), None).await;
    assert_eq!(
        (status, body["missing_scope"].as_str()),
        (403, Some("approve")),
        "{body}"
    );

    // Another caller's approval carries it out, confirm window and all.
    let (status, body) = call(
        &gw,
        ALICE,
        "POST",
        &approve(&id),
        Some(("application/json", r#"{"reason": "looks right"}"#.into())),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["generation"], 2, "{body:#}");
    assert!(body["result"]["pending"].is_object(), "as asked: {body:#}");
    assert_eq!(body["proposal"]["state"], "executed");
    assert_eq!(body["proposal"]["approvals"][0]["caller"], "alice");
    assert_eq!(get(gw.listener("web"), "x", "/").await.2, "two");
    let operation = body["proposal"]["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, op) = call(
        &gw,
        CI,
        "GET",
        &format!("/admin/runtime/operations/{operation}"),
        None,
    )
    .await;
    assert_eq!(op["caller"], "bob", "{op:#}");
    assert_eq!(op["approved_by"], serde_json::json!(["alice"]), "{op:#}");
    assert_eq!(op["reason"], "ship two");
    // Confirming is not a change that waits.
    let (status, body) = call(
        &gw,
        BOB,
        "POST",
        "/admin/runtime/confirm",
        Some(("application/json", r#"{"generation": 2}"#.into())),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Two proposals against generation 2: the second approved first.
    let (_, stale) = call(&gw, CI, "POST", "/admin/runtime/activate", toml("three")).await;
    let (_, fresh) = call(&gw, BOB, "POST", "/admin/runtime/activate", toml("four")).await;
    let (stale, fresh) = (
        stale["proposal"]["id"].as_str().unwrap().to_owned(),
        fresh["proposal"]["id"].as_str().unwrap().to_owned(),
    );
    let (status, body) = call(&gw, ALICE, "POST", &approve(&fresh), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["generation"], 3);
    let (status, body) = call(&gw, ALICE, "POST", &approve(&stale), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("generation_conflict")),
        "{body}"
    );
    assert_eq!(body["proposal"]["state"], "failed");
    assert_eq!(get(gw.listener("web"), "x", "/").await.2, "four");
    let (status, _) = call(&gw, ALICE, "POST", &approve(&stale), None).await;
    assert_eq!(status, 409, "a decided proposal stays decided");

    // A rollback waits too; the proposal outlives a restart.
    let (status, body) = call(
        &gw,
        CI,
        "POST",
        "/admin/runtime/rollback",
        Some((
            "application/json",
            r#"{"target_generation": 1, "reason": "back"}"#.into(),
        )),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let rollback = body["proposal"]["id"].as_str().unwrap().to_owned();
    assert_eq!(body["proposal"]["operation"], "rollback");
    let dir = {
        let mut gw = gw;
        gw.signal("TERM");
        assert_eq!(gw.wait_exit(std::time::Duration::from_secs(10)), Some(0));
        std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap())
    };
    let gw = Gateway::start_in(dir, text);
    let (status, listed) = call(&gw, CI, "GET", "/admin/runtime/proposals", None).await;
    assert_eq!(status, 200);
    let states: Vec<(String, String)> = listed["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            (rollback.clone(), "open".to_owned()),
            (fresh, "executed".to_owned()),
            (stale, "failed".to_owned()),
            (id, "executed".to_owned()),
        ]
    );
    let (status, body) = call(&gw, BOB, "POST", &approve(&rollback), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["rolled_back_to"], 1, "{body:#}");
    assert_eq!(get(gw.listener("web"), "x", "/").await.2, "one");
}

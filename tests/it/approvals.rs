//! Approvals against the real binary (DESIGN §23): a change that needs
//! approval becomes a proposal (202) and changes nothing; its proposer
//! cannot approve it; another caller's approval carries it out as asked
//! (its confirm window included) and history names both; a proposal
//! overtaken by another activation is refused with 409 when approved; a
//! proposal survives a restart and is approved after it. In a fleet (a
//! real etcd, three instances) a proposal made through one instance is
//! decided through the others, exactly once.

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

/// A directory with the three callers' token files, and a configuration
/// whose `[admin.approval]` requires approval for `required_for` (a TOML
/// list): `ci` may activate (and upgrade) but not approve, `alice` may
/// only approve, `bob` may do both; one `web` listener, then `rest`.
fn approving(required_for: &str, rest: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    write_secrets(
        dir.path(),
        &[("bob.token", BOB), ("alice.token", ALICE), ("ci.token", CI)],
    );
    let text = format!(
        r#"[runtime]
state_dir = "state"

[admin]
bind = "127.0.0.1:0"

[admin.approval]
required_for = {required_for}
approvers = 1
expire = "1h"

[[admin.callers]]
name = "ci"
token_file = "ci.token"
scopes = ["read", "validate", "activate", "lifecycle"]

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

{rest}"#
    );
    (dir, text)
}

fn with_body(config: &str, body: &str) -> String {
    config.replace("body = \"one\"", &format!("body = \"{body}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_waits_for_another_callers_approval_and_is_carried_out_as_asked() {
    let (dir, text) = approving(
        r#"["activate", "rollback"]"#,
        "[[routes]]\nname = \"hello\"\nlisteners = [\"web\"]\nrespond = { body = \"one\" }\n",
    );
    let gw = Gateway::start_in(dir, &text);
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
    let gw = Gateway::start_in(dir, &text);
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

/// An instance of a fleet on `etcd` under `prefix`, with the callers and
/// the approval rule of the test below.
fn fleet_instance(etcd: &crate::fleet::Etcd, prefix: &str, name: &str) -> Gateway {
    let (dir, text) = approving(
        r#"["activate", "upgrade"]"#,
        &format!(
            "[fleet]\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\ninstance = \"{name}\"\nlease_ttl = \"3s\"\n",
            etcd.endpoint()
        ),
    );
    Gateway::start_in(dir, &text)
}

fn shared_document(body: &str) -> Option<(&'static str, String)> {
    Some((
        "application/toml",
        format!(
            "[[routes]]\nname = \"hello\"\nlisteners = [\"web\"]\nrespond = {{ body = \"{body}\" }}\n"
        ),
    ))
}

/// Waits (bounded) until `gw` answers `body` on `web`.
async fn wait_serving(gw: &Gateway, body: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (status, _, got) = get(gw.listener("web"), "x", "/").await;
        if status == 200 && got == body {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not serving {body:?} within 5 s (last {status} {got:?})\n{}",
            gw.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until proposal `id`, read through `gw`, is `state`.
async fn wait_state(gw: &Gateway, id: &str, state: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, body) = call(
            gw,
            CI,
            "GET",
            &format!("/admin/runtime/proposals/{id}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        if body["proposal"]["state"] == state {
            return body["proposal"].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{id} not {state} within 10 s: {body:#}\n{}",
            gw.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// DESIGN §23 in a fleet: proposals live in etcd, so a change proposed
/// through one instance is listed, approved or rejected through any
/// other; two approvals racing on two instances carry it out once; an
/// upgrade approved elsewhere is carried out by the instance it was
/// proposed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_proposal_made_on_one_instance_is_approved_on_another() {
    let Some(etcd) = crate::fleet::Etcd::start().await else {
        return;
    };
    let prefix = format!("/cutover-test/approvals-{}", std::process::id());
    let a = fleet_instance(&etcd, &prefix, "a");
    let b = fleet_instance(&etcd, &prefix, "b");
    let c = fleet_instance(&etcd, &prefix, "c");
    let approve = |id: &str| format!("/admin/runtime/proposals/{id}/approve");

    // Proposed through a (the fleet has no generation yet): c lists it.
    let (status, body) = call(
        &a,
        BOB,
        "POST",
        "/admin/runtime/activate?reason=first",
        shared_document("one"),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let first = body["proposal"]["id"].as_str().unwrap().to_owned();
    assert_eq!(body["proposal"]["instance"], "a");
    assert_eq!(body["proposal"]["expected_generation"], 0);
    let (status, listed) = call(&c, CI, "GET", "/admin/runtime/proposals", None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["proposals"][0]["id"], first.as_str(), "{listed:#}");
    assert_eq!(listed["proposals"][0]["state"], "open");
    // Its proposer cannot approve it through another instance either.
    let (status, body) = call(&c, BOB, "POST", &approve(&first), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("self_approval")),
        "{body}"
    );

    // Approved through b: b carries it out fleet-wide, every instance serves it.
    let (status, body) = call(&b, ALICE, "POST", &approve(&first), None).await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["result"]["generation"], 1, "{body:#}");
    assert_eq!(body["proposal"]["state"], "executed");
    assert_eq!(body["proposal"]["carrier"], "b");
    for gw in [&a, &b, &c] {
        wait_serving(gw, "one").await;
    }
    // Each instance's history names who asked and who approved.
    let (_, history) = call(&c, CI, "GET", "/admin/runtime/history", None).await;
    let applied = history["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["kind"] == "activate" && op["outcome"] == "succeeded")
        .unwrap_or_else(|| panic!("no activation on c: {history:#}"));
    assert_eq!(applied["caller"], "bob", "{applied:#}");
    assert_eq!(
        applied["approved_by"],
        serde_json::json!(["alice"]),
        "{applied:#}"
    );

    // Two approvals racing through two instances: one carries it out,
    // the other finds it decided; the fleet moves once.
    let (status, body) = call(
        &a,
        CI,
        "POST",
        "/admin/runtime/activate",
        shared_document("two"),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let second = body["proposal"]["id"].as_str().unwrap().to_owned();
    let path = approve(&second);
    let (through_b, through_c) = tokio::join!(
        call(&b, ALICE, "POST", &path, None),
        call(&c, BOB, "POST", &path, None),
    );
    let mut statuses = [through_b.0, through_c.0];
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 409],
        "b: {:#}\nc: {:#}",
        through_b.1,
        through_c.1
    );
    let loser = if through_b.0 == 409 {
        &through_b.1
    } else {
        &through_c.1
    };
    assert_eq!(loser["error"], "proposal_closed", "{loser:#}");
    for gw in [&a, &b, &c] {
        wait_serving(gw, "two").await;
    }
    let (_, fleet) = call(&a, CI, "GET", "/admin/fleet/status", None).await;
    assert_eq!(
        fleet["active"]["generation"], 2,
        "one new generation: {fleet:#}"
    );

    // Rejected through c, seen so through b.
    let (_, body) = call(
        &a,
        CI,
        "POST",
        "/admin/runtime/activate",
        shared_document("three"),
    )
    .await;
    let third = body["proposal"]["id"].as_str().unwrap().to_owned();
    let (status, body) = call(
        &c,
        ALICE,
        "POST",
        &format!("/admin/runtime/proposals/{third}/reject"),
        Some(("application/json", r#"{"reason": "not today"}"#.into())),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = call(
        &b,
        CI,
        "GET",
        &format!("/admin/runtime/proposals/{third}"),
        None,
    )
    .await;
    assert_eq!(body["proposal"]["state"], "rejected", "{body:#}");
    assert_eq!(body["proposal"]["rejection"]["caller"], "alice");

    // An upgrade proposed through a and approved through b is a's: b
    // answers 202 and a carries it out within a second or two.
    let (status, body) = call(&a, CI, "POST", "/admin/lifecycle/upgrade", None).await;
    assert_eq!(status, 202, "{body}");
    let upgrade = body["proposal"]["id"].as_str().unwrap().to_owned();
    let (status, body) = call(&b, ALICE, "POST", &approve(&upgrade), None).await;
    assert_eq!(status, 202, "{body:#}");
    assert_eq!(body["proposal"]["state"], "approved");
    assert_eq!(body["proposal"]["carrier"], "a");
    let done = wait_state(&b, &upgrade, "executed").await;
    let operation = done["operation_id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, op) = call(
            &a,
            CI,
            "GET",
            &format!("/admin/runtime/operations/{operation}"),
            None,
        )
        .await;
        if status == 200 && op["outcome"] != "running" {
            assert_eq!(op["outcome"], "succeeded", "{op:#}");
            assert_eq!(op["approved_by"], serde_json::json!(["alice"]), "{op:#}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "upgrade {operation} did not finish: {op:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The new process of a still serves the fleet's generation.
    wait_serving(&a, "two").await;
}

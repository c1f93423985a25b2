//! Live impact (DESIGN §22) through the real binary: a known mix of
//! requests is sampled, and validate, preview and `ctl` say what a
//! candidate would do to it: a reorder that moves 30 %, a route removed
//! (unrouted), an upstream whose only backend fails its checks
//! (unusable); `ctl activate --max-moved` refuses with exit 5 unless
//! `--force`.

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::harness::*;

/// `users` before `api`: both regexes, so declaration order decides.
fn routes(first: &str, second: &str, api_upstream: &str) -> String {
    let users = "[[routes]]\nname = \"users\"\nlisteners = [\"web\"]\npath_regex = \"^/api/users/\"\nupstream = \"users\"\n";
    let api = format!(
        "[[routes]]\nname = \"api\"\nlisteners = [\"web\"]\npath_regex = \"^/api/\"\nupstream = \"{api_upstream}\"\n"
    );
    let pick = |name: &str| match name {
        "users" => users.to_owned(),
        "api" => api.clone(),
        _ => String::new(),
    };
    format!("{}\n{}", pick(first), pick(second))
}

fn impact_config(
    backend: std::net::SocketAddr,
    dead: std::net::SocketAddr,
    routes: &str,
) -> String {
    Config::new()
        .listener("web", "")
        .text(routes)
        .route(
            "dead",
            "listeners = [\"web\"]\npath_exact = \"/dead\"\nupstream = \"dead\"",
        )
        .upstream("users", &[backend], "")
        .upstream("api", &[backend], "")
        .upstream(
            "dead",
            &[dead],
            "health = { path = \"/\", interval = \"100ms\", unhealthy_after = 1 }",
        )
        .build()
}

/// `n` requests on one keep-alive connection (one serving thread, whose
/// sample takes every fourth): of each 33, 10 for `/api/users/…` and 23
/// for `/api/items/…`, so that the sample holds exactly 10/33 of users.
async fn mix(addr: std::net::SocketAddr, n: usize) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    for i in 0..n {
        let path = if i % 33 < 10 {
            format!("/api/users/{i}")
        } else {
            format!("/api/items/{i}")
        };
        let req = Request::builder()
            .uri(path)
            .header("host", "api.test")
            .body(Full::new(Bytes::new()))
            .unwrap();
        sender.ready().await.unwrap();
        let response = sender.send_request(req).await.unwrap();
        assert_eq!(response.status(), 200);
        let _ = response.into_body().collect().await;
    }
}

async fn validate(gw: &Gateway, config: &str) -> Value {
    let (status, plan) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/validate",
        Some("application/toml"),
        Some(config.to_owned()),
    )
    .await;
    assert_eq!(status, 200, "{plan}");
    plan
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_says_what_a_candidate_would_do_to_the_sampled_traffic() {
    let backend = Backend::named("ok").await;
    let dead = closed_port();
    let active = impact_config(backend.addr, dead, &routes("users", "api", "api"));
    let gw = Gateway::start(&active);
    let web = gw.listener("web");
    mix(web, 33 * 40).await;

    // Nothing changes: nothing moves.
    let same = validate(&gw, &active).await;
    let impact = &same["impact"];
    assert_eq!(impact["sample_size"], 330, "{impact}");
    assert_eq!(impact["moved"]["count"], 0);
    assert_eq!(impact["unrouted"]["count"], 0);

    // The reorder: every /api/users/ request goes to `api` instead.
    let reordered = impact_config(backend.addr, dead, &routes("api", "users", "api"));
    let plan = validate(&gw, &reordered).await;
    let moved = &plan["impact"]["moved"];
    let percent = moved["percent"].as_f64().unwrap();
    assert!((28.0..=32.0).contains(&percent), "{moved}");
    assert_eq!(moved["percent"], 30.3);
    let example = &moved["examples"][0];
    assert!(example["path"].as_str().unwrap().starts_with("/api/users/"));
    assert_eq!(example["before"]["route"], "users");
    assert_eq!(example["after"]["route"], "api");
    assert_eq!(example["after"]["upstream"], "api");
    assert_eq!(moved["examples"].as_array().unwrap().len(), 20);
    let users = plan["impact"]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "users")
        .cloned()
        .unwrap();
    assert_eq!(
        (
            users["before_percent"].as_f64(),
            users["after_percent"].as_f64()
        ),
        (Some(30.3), Some(0.0))
    );

    // A route removed: its requests find none.
    let removed = impact_config(
        backend.addr,
        dead,
        &routes("api", "", "api").replace("^/api/", "^/api/items/"),
    );
    let unrouted = &validate(&gw, &removed).await["impact"]["unrouted"];
    assert_eq!(unrouted["percent"], 30.3, "{unrouted}");
    assert_eq!(unrouted["examples"][0]["after"], Value::Null);

    // An upstream whose only backend fails its checks now.
    let to_dead = impact_config(backend.addr, dead, &routes("users", "api", "dead"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let unusable = loop {
        let plan = validate(&gw, &to_dead).await;
        let unusable = plan["impact"]["unusable"].clone();
        if unusable["count"] != 0 || Instant::now() > deadline {
            break unusable;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(unusable["percent"], 69.7, "{unusable}");

    // ctl: the table, and --max-moved.
    let candidate = gw.path("reordered.toml");
    std::fs::write(&candidate, &reordered).unwrap();
    let admin = gw.admin_url();
    let ctl = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["ctl", "--admin", &admin])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let file = candidate.to_str().unwrap();
    let (code, out, _) = ctl(&["preview", file]);
    assert_eq!(code, Some(0));
    assert!(out.contains("impact: 330 sampled requests"), "{out}");
    assert!(out.contains("30.30 %"), "{out}");
    assert!(out.contains("moved: GET api.test/api/users/"), "{out}");
    let (code, out, err) = ctl(&["activate", "--max-moved", "5%", file]);
    assert_eq!(code, Some(5), "{out}{err}");
    assert!(err.contains("more than --max-moved 5 %"), "{err}");
    assert_eq!(gw.active_generation().await, 1, "nothing was activated");
    let (code, _, err) = ctl(&["activate", "--max-moved", "50", file]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(gw.active_generation().await, 2);
    let back = gw.path("back.toml");
    std::fs::write(&back, &active).unwrap();
    let (code, _, err) = ctl(&[
        "activate",
        "--max-moved",
        "5",
        "--force",
        back.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("--force"), "{err}");
    assert_eq!(gw.active_generation().await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_without_samples_says_no_data_and_zero_turns_sampling_off() {
    let backend = Backend::named("ok").await;
    let text = proxy_config(backend.addr, "");
    let gw = Gateway::start(&text);
    let plan = validate(&gw, &text).await;
    assert_eq!(plan["impact"]["sample_size"], 0, "{plan}");
    let off = text.replace("[log]", "[runtime]\nimpact_sample = 0\n\n[log]");
    assert_eq!(activate_status(&gw, &off).await, 200);
    for _ in 0..40 {
        let (status, _, _) = get(gw.listener("web"), "api.test", "/").await;
        assert_eq!(status, 200);
    }
    let plan = validate(&gw, &off).await;
    assert!(plan.get("impact").is_none(), "{plan}");
}

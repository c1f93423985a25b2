//! `examples/ci-activate.sh`, the documented pipeline step, run for real.

use std::process::Command;

use crate::harness::*;

fn ci_activate(
    gw: &Gateway,
    candidate: &str,
    smoke_url: &str,
    guard: &str,
) -> (Option<i32>, String) {
    let file = gw.path("candidate.toml");
    std::fs::write(&file, candidate).unwrap();
    let out = Command::new("bash")
        .env("CUTOVER_GUARD", guard)
        .arg(workspace().join("examples/ci-activate.sh"))
        .arg(&file)
        .arg(smoke_url)
        .env("CUTOVER", BIN)
        .env("CUTOVER_ADMIN", gw.admin_url())
        .env("CI_COMMIT_SHA", "abc123")
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_step_activates_and_rolls_back_on_a_failed_smoke_test() {
    let a = Backend::named("A").await;
    let b = Backend::named("B").await;
    let gw = Gateway::start(&proxy_config(a.addr, ""));
    let web = gw.listener("web");
    let smoke = format!("http://{web}/");

    let (code, log) =
        tokio::task::block_in_place(|| ci_activate(&gw, &proxy_config(b.addr, ""), &smoke, ""));
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("planned against generation 1")
            && log.contains("smoke test passed")
            && log.contains("confirmed: generation 2 active"),
        "{log}"
    );
    assert_eq!(get(web, "a", "/").await.2, "B");
    assert!(gw.status().await["pending"].is_null());

    // A candidate whose backend is down: the smoke test fails, the step rolls back.
    let broken = proxy_config(closed_port(), "");
    let (code, log) = tokio::task::block_in_place(|| ci_activate(&gw, &broken, &smoke, ""));
    assert_eq!(code, Some(4), "{log}");
    assert!(log.contains("rolling back to generation 2"), "{log}");
    assert_eq!(
        get(web, "a", "/").await.2,
        "B",
        "routing is back to the previewed generation"
    );
    let history = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None)
        .await
        .1;
    assert_eq!(history["generations"][0]["generation"], 4);
    assert_eq!(history["generations"][0]["rolled_back_to"], 2);
    assert_eq!(history["generations"][1]["requested_by"], "ci");

    // With a guard, the gateway has the last word: its window passes on
    // the smoke test's answer and it confirms.
    let c = Backend::named("C").await;
    let guard = "--guard-error-ratio 0.05 --min-requests 1 --guard-window 1s";
    let (code, log) =
        tokio::task::block_in_place(|| ci_activate(&gw, &proxy_config(c.addr, ""), &smoke, guard));
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("generation 5 confirmed: guard passed: error ratio 0.0000"),
        "{log}"
    );
    assert_eq!(get(web, "a", "/").await.2, "C");
}

/// Every `cutover_…` series the alert rules and the dashboard query is
/// one the gateway exports (histogram suffixes aside): a renamed metric
/// cannot leave them silently querying nothing.
#[test]
fn the_observability_examples_query_only_exported_series() {
    let names = std::fs::read_to_string(workspace().join("src/telemetry/metrics.rs")).unwrap();
    let dashboard =
        std::fs::read_to_string(workspace().join("examples/observability/grafana-dashboard.json"))
            .unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| p.len() >= 10));
    let rules =
        std::fs::read_to_string(workspace().join("examples/observability/alerts.yml")).unwrap();
    let scrape =
        std::fs::read_to_string(workspace().join("examples/observability/prometheus.yml")).unwrap();
    assert!(scrape.contains("alerts.yml"));
    let mut seen = 0;
    for text in [&dashboard, &rules] {
        for (start, _) in text.match_indices("cutover_") {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name);
            assert!(
                names.contains(&format!("\"{family}\"")),
                "{name} is queried but not exported"
            );
            seen += 1;
        }
    }
    assert!(seen > 20, "{seen}");
}

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
    let broken = proxy_config(refusing_addr(), "");
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

/// The Kubernetes example's manifests, as JSON (PyYAML as glue).
fn kubernetes_manifests() -> Vec<serde_json::Value> {
    yaml_documents(
        "examples/kubernetes",
        &[
            "deployment.yaml",
            "services.yaml",
            "networkpolicy.yaml",
            "kustomization.yaml",
        ],
    )
}

/// Every YAML document in `files` of the workspace folder `dir`, as JSON.
pub fn yaml_documents(dir: &str, files: &[&str]) -> Vec<serde_json::Value> {
    let dir = workspace().join(dir);
    let mut docs = Vec::new();
    for file in files {
        // Debian's interpreter, which python3-yaml serves (`.ci/run`
        // installs both), not whichever python3 is first on PATH.
        let out = Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            ])
            .arg(dir.join(file))
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{file} does not parse (/usr/bin/python3 with PyYAML is needed: apt-get install python3 python3-yaml): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let parsed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        docs.extend(parsed);
    }
    docs
}

/// Lays `text` and an admin token out as the kubelet does for a projected
/// ConfigMap and Secret: the files are symlinks through `..data` to a
/// timestamped folder, swapped as a whole on an update.
fn configmap_folder(dir: &std::path::Path, version: &str, text: &str) {
    let data = dir.join(format!("..{version}"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("gateway.toml"), text).unwrap();
    std::fs::write(
        data.join("admin-token"),
        "k8s-example-token-0123456789abcdef\n",
    )
    .unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["gateway.toml", "admin-token"] {
        let link = dir.join(name);
        if !link.exists() {
            std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_example_serves_its_configmap_and_follows_its_updates() {
    let docs = kubernetes_manifests();
    let kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k);
    let deployment = kind("Deployment").next().expect("a Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["args"],
        serde_json::json!(["run", "-c", "/etc/cutover/gateway.toml", "--watch"])
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/ready");
    assert!(container["lifecycle"]["preStop"].is_object());
    assert!(
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.get("subPath").is_none()),
        "a subPath mount is never updated"
    );
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    assert_eq!(kind("Service").count(), 3);
    let headless = kind("Service")
        .find(|s| s["metadata"]["name"] == "api-headless")
        .expect("the API's headless Service");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(kind("NetworkPolicy").count(), 1);
    let ports: Vec<u64> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect();
    let text =
        std::fs::read_to_string(workspace().join("examples/kubernetes/gateway.toml")).unwrap();
    for port in &ports {
        assert!(
            text.contains(&format!("0.0.0.0:{port}\"")),
            "port {port} is not bound in gateway.toml"
        );
    }

    // Run it as the pod would, on ephemeral ports, from a ConfigMap-style
    // folder; then update the ConfigMap the kubelet's way.
    // The cluster's DNS: a server of the test's that knows the headless
    // Service's two pods.
    let dns = crate::dns::DnsServer::start().await;
    dns.set_a(
        "api-headless.default.svc.cluster.local",
        &["127.0.0.11".parse().unwrap(), "127.0.0.12".parse().unwrap()],
    );
    let local = text
        .replace("0.0.0.0:8080", "127.0.0.1:0")
        .replace("0.0.0.0:9190", "0.0.0.0:0")
        .replace("0.0.0.0:9191", "127.0.0.1:0")
        + &format!("\n[discovery]\nnameservers = [\"{}\"]\n", dns.addr);
    let dir = tempfile::tempdir().unwrap();
    configmap_folder(dir.path(), "2026_11_30_a", &local);
    let gw = Gateway::start_args_in(dir, &local, &["--watch"]);
    let metrics = gw.metrics.expect("metrics");
    let (status, _, body) = get(metrics, "10.1.2.3:9191", "/ready").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ready\n"),
        "the kubelet's probe"
    );
    // The admin API: the token, and any Host (a wildcard bind: the
    // Service's name).
    let admin_port = gw.admin.port();
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], admin_port));
    let (status, _, _) = get(admin, "cutover-admin:9190", "/admin/runtime/status").await;
    assert_eq!(status, 401);
    let updated = local.replace("timeout = \"10s\"", "timeout = \"20s\"");
    configmap_folder(gw.dir.path(), "2026_11_30_b", &updated);
    // What runs, asked with the token: the update, within a few seconds.
    let export = || {
        let out = Command::new(BIN)
            .args(["ctl", "--admin", &format!("http://{admin}"), "--token-file"])
            .arg(gw.path("admin-token"))
            .arg("export")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while export() != updated {
        assert!(
            std::time::Instant::now() < deadline,
            "the ConfigMap update was not activated"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The headless Service's pods are the api upstream's members.
    let out = Command::new(BIN)
        .args(["ctl", "--admin", &format!("http://{admin}"), "--token-file"])
        .arg(gw.path("admin-token"))
        .arg("backends")
        .output()
        .unwrap();
    let backends = String::from_utf8_lossy(&out.stdout);
    assert!(
        backends.contains("127.0.0.11:8080")
            && backends.contains("127.0.0.12:8080")
            && backends.contains("dns:api-headless.default.svc.cluster.local:8080"),
        "{backends}"
    );
}

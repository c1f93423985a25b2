//! Fleets (DESIGN §15) against a real etcd: Debian's `etcd-server`, started
//! by each test on loopback ports with a temporary data dir. When the
//! binary is absent the tests say so and skip (`.ci/run` installs it).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::harness::{
    admin_request, closed_port, failing_backend, get, post_json, Backend, Config, Gateway,
};

const ETCD: &str = "/usr/bin/etcd";

/// A single-member etcd on loopback; killed when dropped.
pub(crate) struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client: SocketAddr,
    peer: SocketAddr,
    /// Client TLS with client certificates: (CA, server cert, server key)
    /// files in `dir`.
    tls: bool,
    /// More command-line flags.
    flags: Vec<String>,
}

impl Etcd {
    /// `None` (with the reason on stderr) when etcd is not installed.
    pub(crate) async fn start() -> Option<Etcd> {
        Self::start_with(&[]).await
    }

    /// With more command-line flags.
    async fn start_with(flags: &[&str]) -> Option<Etcd> {
        if !Path::new(ETCD).exists() {
            eprintln!("SKIPPED: {ETCD} is not installed (Debian package etcd-server; .ci/run installs it)");
            return None;
        }
        let mut etcd = Etcd {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            client: closed_port(),
            peer: closed_port(),
            tls: false,
            flags: flags.iter().map(|f| f.to_string()).collect(),
        };
        etcd.resume().await;
        Some(etcd)
    }

    /// Serving clients over TLS only, and only those with a certificate
    /// `ca` signed; its own certificate is for 127.0.0.1.
    async fn start_tls(ca: &crate::pki::Ca) -> Option<Etcd> {
        if !Path::new(ETCD).exists() {
            eprintln!("SKIPPED: {ETCD} is not installed (Debian package etcd-server; .ci/run installs it)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = crate::pki::server_leaf(ca, &["127.0.0.1"]);
        std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
        std::fs::write(dir.path().join("server.pem"), cert).unwrap();
        std::fs::write(dir.path().join("server.key"), key).unwrap();
        let mut etcd = Etcd {
            child: None,
            dir,
            client: closed_port(),
            peer: closed_port(),
            tls: true,
            flags: Vec::new(),
        };
        etcd.resume().await;
        Some(etcd)
    }

    /// Starts the member again on its data dir and ports; waits until it
    /// answers.
    async fn resume(&mut self) {
        let scheme = if self.tls { "https" } else { "http" };
        let client = format!("{scheme}://{}", self.client);
        let peer = format!("http://{}", self.peer);
        let mut command = Command::new(ETCD);
        if self.tls {
            let file = |name: &str| self.dir.path().join(name).display().to_string();
            command
                .arg(format!("--cert-file={}", file("server.pem")))
                .arg(format!("--key-file={}", file("server.key")))
                .arg(format!("--trusted-ca-file={}", file("ca.pem")))
                .arg("--client-cert-auth");
        }
        let child = command
            .args(&self.flags)
            .arg("--name=t")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=t={peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        if self.tls {
            // Its JSON gateway wants a client certificate: a TCP accept
            // is readiness enough (instances retry until it answers).
            while tokio::net::TcpStream::connect(self.client).await.is_err() {
                assert!(Instant::now() < deadline, "etcd did not start");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            return;
        }
        loop {
            if let Ok(answer) = self.call("/v3/kv/range", json!({ "key": b64("/") })).await {
                if answer.get("header").is_some() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "etcd did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn endpoint(&self) -> String {
        self.client.to_string()
    }

    /// A call to etcd's JSON gateway.
    async fn call(&self, path: &str, body: Value) -> Result<Value, String> {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", self.client.to_string())
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap();
        let (_, _, bytes) = crate::harness::send(self.client, req).await?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    }

    async fn put(&self, key: &str, value: &str) {
        self.call(
            "/v3/kv/put",
            json!({ "key": b64(key), "value": b64(value) }),
        )
        .await
        .expect("etcd put");
    }

    /// Compacts everything before the current revision.
    async fn compact(&self) {
        let answer = self
            .call("/v3/kv/range", json!({ "key": b64("/") }))
            .await
            .unwrap();
        let revision = answer["header"]["revision"].as_str().unwrap().to_owned();
        self.call(
            "/v3/kv/compaction",
            json!({ "revision": revision, "physical": true }),
        )
        .await
        .expect("compaction");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// An instance's own file: one `web` listener, a state dir, `[fleet]`.
fn instance(etcd: &Etcd, prefix: &str, name: &str) -> String {
    Config::new()
        .metrics()
        .runtime("state_dir = \"state\"")
        .listener("web", "")
        .text(&format!(
            "[fleet]\nendpoints = [\"{}\"]\nprefix = \"{prefix}\"\ninstance = \"{name}\"\nlease_ttl = \"3s\"",
            etcd.endpoint()
        ))
        .build()
}

/// A shared document routing everything on `web` to `backend`.
fn shared(backend: SocketAddr, extra: &str) -> String {
    format!(
        r#"log.level = "warn"

[[routes]]
name = "all"
listeners = ["web"]
upstream = "app"

[upstreams.app]
backends = [{{ addr = "{backend}" }}]
{extra}"#
    )
}

fn prefix(test: &str) -> String {
    format!("/cutover-test/{test}-{}", std::process::id())
}

async fn activate(gw: &Gateway, document: &str, expected: Option<u64>) -> (u16, Value) {
    let query = expected.map_or(String::new(), |g| format!("?expected_generation={g}"));
    crate::harness::activate_with(gw, document, &query).await
}

async fn fleet_status(gw: &Gateway) -> Value {
    let (status, body) = admin_request(gw.admin, "GET", "/admin/fleet/status", None, None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits (bounded by `within`) until `check` holds for the fleet status
/// read through `gw`; returns it and how long it took.
async fn wait_fleet(
    gw: &Gateway,
    within: Duration,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> (Value, Duration) {
    let started = Instant::now();
    loop {
        let (status, body) =
            admin_request(gw.admin, "GET", "/admin/fleet/status", None, None).await;
        if status == 200 && check(&body) {
            return (body, started.elapsed());
        }
        assert!(
            started.elapsed() < within,
            "{what} within {within:?}; last fleet status: {body}\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn all_synced_on(generation: u64, count: usize) -> impl Fn(&Value) -> bool {
    move |s: &Value| {
        s["active"]["generation"] == json!(generation)
            && s["synced"] == json!(count)
            && s["total"] == json!(count)
    }
}

fn member<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["instance"] == json!(name))
        .unwrap_or_else(|| panic!("{name} is not in {status}"))
}

/// Instances `names` that joined one prefix and acked its first
/// generation, which routes to `backend`; returns them and its id.
async fn serving(
    etcd: &Etcd,
    prefix: &str,
    names: &[&str],
    backend: SocketAddr,
) -> (Vec<Gateway>, u64) {
    let gws = join(etcd, prefix, names).await;
    let (status, body) = activate(&gws[0], &shared(backend, ""), None).await;
    assert_eq!(status, 200, "{body}");
    let first = body["generation"].as_u64().unwrap();
    let all = all_synced_on(first, names.len());
    wait_fleet(&gws[0], Duration::from_secs(2), "all ack", all).await;
    (gws, first)
}

/// Instances `names` that joined one prefix (each wrote its status).
async fn join(etcd: &Etcd, prefix: &str, names: &[&str]) -> Vec<Gateway> {
    let gateways: Vec<Gateway> = names
        .iter()
        .map(|name| Gateway::start(&instance(etcd, prefix, name)))
        .collect();
    let count = names.len();
    wait_fleet(
        &gateways[0],
        Duration::from_secs(10),
        "the instances join",
        |s| s["total"] == json!(count),
    )
    .await;
    gateways
}

async fn body_through(gw: &Gateway) -> String {
    let (status, _, body) = get(gw.listener("web"), "fleet.test", "/").await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_reaches_three_instances_within_two_seconds() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("reach");
    let gws = join(&etcd, &prefix, &["a", "b", "c"]).await;
    let one = Backend::named("one").await;
    let two = Backend::named("two").await;

    let (status, body) = activate(&gws[0], &shared(one.addr, ""), None).await;
    assert_eq!(status, 200, "{body}");
    let first = body["generation"].as_u64().unwrap();
    assert_eq!(body["outcome"], "activated");
    assert_eq!(body["instance"]["instance"], "a");
    let (_, took) = wait_fleet(
        &gws[1],
        Duration::from_secs(2),
        "all ack",
        all_synced_on(first, 3),
    )
    .await;
    eprintln!("generation {first}: all three acked in {took:?}");
    for gw in &gws {
        assert_eq!(body_through(gw).await, "one");
    }

    // The next one through another instance, against the generation seen.
    let (status, body) = activate(&gws[1], &shared(two.addr, ""), Some(first)).await;
    assert_eq!(status, 200, "{body}");
    let second = body["generation"].as_u64().unwrap();
    assert_eq!(second, first + 1);
    assert_eq!(body["previous_generation"], json!(first));
    let (status_body, took) = wait_fleet(
        &gws[2],
        Duration::from_secs(2),
        "all ack",
        all_synced_on(second, 3),
    )
    .await;
    eprintln!("generation {second}: all three acked in {took:?}");
    for gw in &gws {
        assert_eq!(body_through(gw).await, "two");
    }
    // Acks carry the listeners each instance has bound.
    let c = member(&status_body, "c");
    assert_eq!(c["listeners"][0]["name"], "web");
    assert_eq!(
        c["listeners"][0]["address"],
        gws[2].listener("web").to_string()
    );
    assert_eq!(c["drift"], false);
    // Local status names the fleet generation it serves.
    let local = gws[2].status().await;
    assert_eq!(local["fleet"]["generation"], json!(second));
    assert_eq!(local["fleet"]["connected"], true);
    assert_eq!(local["config_file_matches_active"], true, "{local}");
    let (_, _, metrics) = get(gws[2].metrics.unwrap(), "m", "/metrics").await;
    for line in [
        format!("cutover_fleet_generation {second}"),
        "cutover_fleet_connected 1".to_owned(),
        "cutover_fleet_applies_total{outcome=\"ack\"} 2".to_owned(),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    // Rollback through any instance: a new generation with the old text.
    let (status, body) = admin_request(
        gws[2].admin,
        "POST",
        "/admin/runtime/rollback",
        Some("application/json"),
        Some(
            json!({ "target_generation": first, "expected_active_generation": second }).to_string(),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rolled_back_to"], json!(first));
    let third = body["generation"].as_u64().unwrap();
    wait_fleet(
        &gws[0],
        Duration::from_secs(2),
        "all ack the rollback",
        all_synced_on(third, 3),
    )
    .await;
    for gw in &gws {
        assert_eq!(body_through(gw).await, "one");
    }
    // The same document again changes nothing.
    let (status, body) = activate(&gws[0], &shared(one.addr, ""), Some(third)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "unchanged");
    assert_eq!(body["generation"], json!(third));
    assert_eq!(body["instance"]["generation"], json!(third));
    assert!(body["instance"]["local_generation"].is_u64(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_activations_against_the_same_expected_generation_exactly_one_wins() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("race");
    let backends = [Backend::named("left").await, Backend::named("right").await];
    let (gws, mut expected) = serving(&etcd, &prefix, &["a", "b", "c"], backends[0].addr).await;
    for round in 0..5 {
        let left = shared(backends[0].addr, &format!("# left {round}\n"));
        let right = shared(backends[1].addr, &format!("# right {round}\n"));
        let (a, b) = tokio::join!(
            activate(&gws[0], &left, Some(expected)),
            activate(&gws[1], &right, Some(expected)),
        );
        let statuses = [a.0, b.0];
        assert!(
            statuses.contains(&200) && statuses.contains(&409),
            "round {round}: exactly one wins: {a:?} {b:?}"
        );
        let (winner, loser) = if a.0 == 200 { (a.1, b.1) } else { (b.1, a.1) };
        assert_eq!(loser["error"], "generation_conflict", "{loser}");
        let generation = winner["generation"].as_u64().unwrap();
        assert!(generation > expected);
        let (_, _) = wait_fleet(
            &gws[2],
            Duration::from_secs(5),
            "all converge",
            all_synced_on(generation, 3),
        )
        .await;
        let name = if a.0 == 200 { "left" } else { "right" };
        for gw in &gws {
            assert_eq!(body_through(gw).await, name, "round {round}");
        }
        expected = generation;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_missing_a_referenced_file_nacks_and_keeps_serving() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("nack");
    let one = Backend::named("one").await;
    let two = Backend::named("two").await;
    let (gws, first) = serving(&etcd, &prefix, &["a", "b", "c"], one.addr).await;

    // The CA file the document names exists beside a and b only.
    let ca = crate::pki::ca("upstream ca");
    for gw in &gws[..2] {
        std::fs::write(gw.path("upstream-ca.pem"), &ca.pem).unwrap();
    }
    let extra = r#"
[upstreams.secure]
protocol = "https"
tls = { ca = "upstream-ca.pem" }
backends = [{ addr = "127.0.0.1:9" }]
"#;
    let (status, body) = activate(&gws[0], &shared(two.addr, extra), Some(first)).await;
    assert_eq!(status, 200, "{body}");
    let second = body["generation"].as_u64().unwrap();
    let (s, _) = wait_fleet(
        &gws[0],
        Duration::from_secs(3),
        "two ack and one nacks",
        |s| {
            s["active"]["generation"] == json!(second)
                && s["synced"] == json!(2)
                && member(s, "c")["status"] == "nacked"
        },
    )
    .await;
    let c = member(&s, "c");
    assert_eq!(c["generation"], json!(first), "c serves what it had");
    assert_eq!(c["drift"], true);
    assert!(
        c["error"].as_str().unwrap().contains("upstream-ca.pem"),
        "{c}"
    );
    assert!(
        c["diagnostics"][0]
            .as_str()
            .unwrap()
            .starts_with("unreadable_file"),
        "{c}"
    );
    assert_eq!(body_through(&gws[0]).await, "two");
    assert_eq!(body_through(&gws[1]).await, "two");
    assert_eq!(body_through(&gws[2]).await, "one");
    // `ctl fleet status` shows it, and says not every instance is synced.
    let out = std::process::Command::new(crate::harness::BIN)
        .args(["ctl", "--admin", &gws[2].admin_url(), "fleet", "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("2 of 3 instances synced"), "{text}");
    let line = text.lines().find(|l| l.starts_with("c ")).unwrap();
    assert!(
        line.contains("nacked") && line.contains("upstream-ca.pem"),
        "{line}"
    );
    // The file put in place, a SIGHUP: c tries the generation again.
    std::fs::write(gws[2].path("upstream-ca.pem"), &ca.pem).unwrap();
    gws[2].signal("HUP");
    wait_fleet(
        &gws[0],
        Duration::from_secs(5),
        "c acks after its reload",
        all_synced_on(second, 3),
    )
    .await;
    assert_eq!(body_through(&gws[2]).await, "two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_etcd_never_stops_traffic_and_instances_follow_it_back_and_past_compaction() {
    let Some(mut etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("outage");
    let one = Backend::named("one").await;
    let two = Backend::named("two").await;
    let three_ = Backend::named("three").await;
    let (gws, first) = serving(&etcd, &prefix, &["a", "b", "c"], one.addr).await;

    etcd.stop();
    for gw in &gws {
        for _ in 0..100 {
            assert_eq!(body_through(gw).await, "one");
        }
    }
    // Status answers 503 while etcd is away; activation changes nothing.
    let (status, body) =
        admin_request(gws[0].admin, "GET", "/admin/fleet/status", None, None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "fleet_unavailable");
    let (status, _) = activate(&gws[0], &shared(two.addr, ""), Some(first)).await;
    assert_eq!(status, 503);

    etcd.resume().await;
    // Every instance comes back by itself (no restart).
    for gw in &gws {
        let deadline = Instant::now() + Duration::from_secs(15);
        while gw.status().await["fleet"]["connected"] != true {
            assert!(Instant::now() < deadline, "{}", gw.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let (status, body) = activate(&gws[1], &shared(two.addr, ""), Some(first)).await;
    assert_eq!(status, 200, "{body}");
    let second = body["generation"].as_u64().unwrap();
    wait_fleet(
        &gws[2],
        Duration::from_secs(3),
        "all ack after etcd returned",
        all_synced_on(second, 3),
    )
    .await;
    for gw in &gws {
        assert_eq!(body_through(gw).await, "two");
    }

    // c frozen past its lease while the fleet moves on and etcd compacts
    // past its watch revision: it lists again and acks the next one.
    let pid = gws[2].pid().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    let mut current = second;
    for i in 0..3 {
        let (status, body) = activate(
            &gws[0],
            &shared(two.addr, &format!("# {i}\n")),
            Some(current),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        current = body["generation"].as_u64().unwrap();
    }
    etcd.compact().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    let (status, body) = activate(&gws[0], &shared(three_.addr, ""), Some(current)).await;
    assert_eq!(status, 200, "{body}");
    let last = body["generation"].as_u64().unwrap();
    wait_fleet(
        &gws[0],
        Duration::from_secs(10),
        "c re-lists and acks",
        all_synced_on(last, 3),
    )
    .await;
    assert_eq!(body_through(&gws[2]).await, "three");
    let logs = gws[2].logs();
    assert!(
        logs.contains("listing again") || logs.contains("etcd session lost"),
        "c listed again rather than catching up on a live watch:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_is_gone_within_its_lease_and_restarts_on_its_last_generation_without_etcd(
) {
    let Some(mut etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("gone");
    let one = Backend::named("one").await;
    let (mut gws, first) = serving(&etcd, &prefix, &["a", "b", "c"], one.addr).await;

    let mut c = gws.pop().unwrap();
    Command::new("kill")
        .args(["-9", &c.pid().to_string()])
        .status()
        .unwrap();
    let _ = c.wait_exit(Duration::from_secs(5));
    // Within the lease TTL (3 s here).
    let (s, took) = wait_fleet(&gws[0], Duration::from_secs(3), "c is gone", |s| {
        member(s, "c")["status"] == "gone"
    })
    .await;
    eprintln!("c shown gone {took:?} after kill -9");
    assert_eq!(s["synced"], json!(2));

    // Restarted while etcd is down: it serves the generation it applied.
    etcd.stop();
    let dir = std::mem::replace(&mut c.dir, tempfile::tempdir().unwrap());
    drop(c);
    let c = Gateway::start_in(dir, &instance(&etcd, &prefix, "c"));
    assert_eq!(body_through(&c).await, "one");
    let local = c.status().await;
    assert_eq!(local["fleet"]["generation"], json!(first), "{local}");
    assert_eq!(local["fleet"]["connected"], false);
    etcd.resume().await;
    wait_fleet(
        &gws[0],
        Duration::from_secs(10),
        "c rejoins",
        all_synced_on(first, 3),
    )
    .await;

    // A draining instance leaves at once (its lease revoked), not a TTL
    // later.
    gws[1].signal("TERM");
    let (_, took) = wait_fleet(&gws[0], Duration::from_secs(1), "b leaves on drain", |s| {
        member(s, "b")["status"] == "gone"
    })
    .await;
    eprintln!("b shown gone {took:?} after SIGTERM");
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_documents_are_refused_and_never_applied() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("bad");
    let one = Backend::named("one").await;
    let (gws, first) = serving(&etcd, &prefix, &["a", "b", "c"], one.addr).await;

    // Instance-owned settings in a shared document: refused where they
    // are, and nothing is written.
    let (status, body) = activate(
        &gws[0],
        &format!("[admin]\nbind = \"0.0.0.0:1\"\n\n{}", shared(one.addr, "")),
        Some(first),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["errors"][0]["code"], "not_shared");
    assert_eq!(body["errors"][0]["line"], 1);
    // Validate answers the same plan for a shared document.
    let (status, body) = admin_request(
        gws[1].admin,
        "POST",
        "/admin/runtime/validate",
        Some("application/toml"),
        Some(shared(one.addr, "[log]\nformat = \"json\"\n")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["activatable"], false, "{body}");
    // A route naming a listener the instances do not have.
    let (status, body) = activate(
        &gws[0],
        &shared(one.addr, "").replace("listeners = [\"web\"]", "listeners = [\"web\", \"other\"]"),
        Some(first),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        fleet_status(&gws[0]).await["active"]["generation"],
        json!(first)
    );

    // A document that does not parse, made active behind the API's back:
    // every instance nacks it and serves what it had.
    etcd.put(
        &format!("{prefix}/generations/{:020}", first + 1),
        "{ not json",
    )
    .await;
    etcd.put(
        &format!("{prefix}/active"),
        &json!({ "generation": first + 1, "config_version": "sha256:x", "previous": first, "activated_at": "now" }).to_string(),
    )
    .await;
    let (s, _) = wait_fleet(&gws[0], Duration::from_secs(3), "all nack", |s| {
        s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["status"] == "nacked")
    })
    .await;
    assert!(
        member(&s, "a")["error"]
            .as_str()
            .unwrap()
            .contains("unreadable"),
        "{s}"
    );
    for gw in &gws {
        assert_eq!(body_through(gw).await, "one");
    }
    // An older generation replayed is ignored.
    etcd.put(
        &format!("{prefix}/active"),
        &json!({ "generation": first, "config_version": "sha256:x", "previous": null, "activated_at": "now" }).to_string(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gws[0].status().await["fleet"]["generation"], json!(first));

    // A prefix another layout format owns is refused with a clear message.
    let other = format!("{prefix}-future");
    etcd.put(
        &format!("{other}/meta"),
        r#"{"format":99,"created_by":"cutover 9.0.0"}"#,
    )
    .await;
    let d = Gateway::start(&instance(&etcd, &other, "d"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let local = d.status().await;
        if let Some(error) = local["fleet"]["last_error"].as_str() {
            if error.contains("format 99") {
                assert!(error.contains("cutover 9.0.0"), "{error}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "{local}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_fleet_example_joins_etcd_and_serves_its_shared_document() {
    let docs = crate::examples::yaml_documents(
        "examples/kubernetes/fleet",
        &["kustomization.yaml", "statefulset.yaml"],
    );
    let kustomization = docs.iter().find(|d| d["kind"] == "Kustomization").unwrap();
    assert_eq!(
        kustomization["resources"],
        json!(["..", "statefulset.yaml"])
    );
    assert!(
        kustomization["patches"][0]["patch"]
            .as_str()
            .unwrap()
            .contains("$patch: delete"),
        "the overlay removes the single-source Deployment"
    );
    let set = docs.iter().find(|d| d["kind"] == "StatefulSet").unwrap();
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["args"],
        json!(["run", "-c", "/etc/cutover/gateway.toml"]),
        "no --watch in a fleet"
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/ready");
    let mounts = container["volumeMounts"].as_array().unwrap();
    assert!(mounts
        .iter()
        .any(|m| m["name"] == "state" && m["mountPath"] == "/var/lib/cutover"));
    assert_eq!(
        set["spec"]["template"]["metadata"]["labels"]["app"],
        "cutover"
    );

    let dir = crate::harness::workspace().join("examples/kubernetes/fleet");
    let own = std::fs::read_to_string(dir.join("gateway.toml")).unwrap();
    let shared_doc = std::fs::read_to_string(dir.join("shared.toml")).unwrap();
    assert!(own.contains("state_dir = \"/var/lib/cutover\""));
    // The two compose into a valid configuration (every instance plans that).
    let composed = cutover::config::compose(&own, &shared_doc).unwrap();
    let text = cutover::config::ConfigText::inline(composed, dir.clone(), "composed");
    let dummy_token = tempfile::tempdir().unwrap();
    std::fs::write(
        dummy_token.path().join("admin-token"),
        "k8s-example-token-0123456789abcdef\n",
    )
    .unwrap();
    let text = cutover::config::ConfigText {
        base_dir: dummy_token.path().to_path_buf(),
        ..text
    };
    if let Err(d) = cutover::plan::validate(&text) {
        panic!("the fleet example does not compose into a valid configuration: {d:#?}");
    }

    // Run one instance of it, as cutover-0, against a real etcd.
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let endpoints =
        "[\"http://etcd-0.etcd:2379\", \"http://etcd-1.etcd:2379\", \"http://etcd-2.etcd:2379\"]";
    assert!(own.contains(endpoints));
    let local = own
        .replace("0.0.0.0:8080", "127.0.0.1:0")
        .replace("0.0.0.0:9190", "0.0.0.0:0")
        .replace("0.0.0.0:9191", "127.0.0.1:0")
        .replace("/var/lib/cutover", "state")
        .replace(endpoints, &format!("[\"http://{}\"]", etcd.endpoint()))
        .replace("/cutover/prod", &prefix("k8s"))
        + "instance = \"cutover-0\"\n";
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(
        folder.path().join("admin-token"),
        "k8s-example-token-0123456789abcdef\n",
    )
    .unwrap();
    let gw = Gateway::start_in(folder, &local);
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], gw.admin.port()));
    let (admin, token) = (format!("http://{admin}"), gw.path("admin-token"));
    let ctl = |args: &[&str]| {
        let token = token.to_str().unwrap();
        crate::harness::ctl(&admin, &[&["--token-file", token], args].concat())
    };
    // require_expected_generation: the first activation expects 0.
    let shared_path = dir.join("shared.toml");
    let (code, out, err) = ctl(&["activate", shared_path.to_str().unwrap(), "--expect", "0"]);
    assert_eq!(code, Some(0), "{out}{err}\n{}", gw.logs());
    assert!(out.contains("activated: fleet generation 1"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, out, _) = ctl(&["fleet", "status"]);
        if code == Some(0) {
            assert!(out.contains("1 of 1 instances synced"), "{out}");
            assert!(out.contains("cutover-0"), "{out}");
            break;
        }
        assert!(Instant::now() < deadline, "{out}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The fleet's record and the instance's own history name the
    // authenticated caller (the token file's `admin`).
    let (code, out, err) = ctl(&["--json", "history"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let history: Value = serde_json::from_str(&out).unwrap();
    let applied = history["operations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["kind"] == "activate" && op["outcome"] == "succeeded")
        .cloned()
        .unwrap_or_default();
    assert_eq!(applied["caller"], "admin", "{history:#}");
    // It routes by the shared document: /api/ to the api upstream (not
    // resolvable here, so 502), no 404.
    let (status, _, _) = get(gw.listener("web"), "example.test", "/api/x").await;
    assert_ne!(status, 404);
}

/// Activates `document` through `gw` with the JSON form's `extra` fields
/// (confirm_within, guard, steps ...).
async fn activate_json(gw: &Gateway, document: &str, expected: u64, extra: Value) -> (u16, Value) {
    let body = activation(document, expected, extra);
    post_json(gw.admin, "/admin/runtime/activate", body).await
}

/// The JSON activation of `document` against `expected`, with `extra`.
fn activation(document: &str, expected: u64, extra: Value) -> Value {
    let mut body = json!({ "config": document, "expected_generation": expected });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// Waits until the pending `generation` is settled; the fleet status.
async fn wait_settled(gw: &Gateway, generation: u64, within: Duration) -> Value {
    wait_fleet(gw, within, "the pending generation is settled", |s| {
        s["active"]["settlement"]["generation"] == json!(generation)
            && s["active"]["pending"].is_null()
            && s["instances"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["status"] == "synced" || m["status"] == "gone")
    })
    .await
    .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_fleet_generation_is_settled_by_its_deadline_by_confirm_or_by_abort_from_any_instance(
) {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("pending");
    let one = Backend::named("one").await;
    let two = Backend::named("two").await;
    let (mut gws, first) = serving(&etcd, &prefix, &["a", "b"], one.addr).await;

    // Pending with a 2 s deadline, activated through a, which is then
    // killed: b enforces the deadline.
    let (status, body) = activate_json(
        &gws[0],
        &shared(two.addr, ""),
        first,
        json!({ "confirm_within": "2s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let pending = body["generation"].as_u64().unwrap();
    assert_eq!(body["pending"]["rollback_to"], json!(first));
    assert!(body["pending"]["deadline_unix_ms"].is_u64());
    wait_fleet(
        &gws[1],
        Duration::from_secs(2),
        "b serves it",
        all_synced_on(pending, 2),
    )
    .await;
    assert_eq!(body_through(&gws[1]).await, "two");
    // One pending change at a time.
    let (status, body) = activate(&gws[1], &shared(one.addr, "# other\n"), Some(first)).await;
    assert_eq!(status, 409, "{body}");
    let local = gws[1].status().await;
    assert_eq!(local["fleet"]["pending"]["rollback_to"], json!(first));
    let a = gws.remove(0);
    drop(a);
    let s = wait_fleet(
        &gws[0],
        Duration::from_secs(8),
        "b rolls back at the deadline",
        |s| {
            s["active"]["settlement"]["generation"] == json!(pending)
                && member(s, "b")["status"] == "synced"
        },
    )
    .await
    .0;
    let settlement = &s["active"]["settlement"];
    assert_eq!(settlement["outcome"], "auto_rolled_back", "{s}");
    assert_eq!(settlement["by"], "cutover-deadline");
    let rolled = s["active"]["generation"].as_u64().unwrap();
    assert!(rolled > pending);
    assert_eq!(body_through(&gws[0]).await, "one");
    // A gone member can be forgotten; a live one cannot.
    let forget = |name: &str| {
        Command::new(crate::harness::BIN)
            .args([
                "ctl",
                "--admin",
                &gws[0].admin_url(),
                "fleet",
                "forget",
                name,
            ])
            .output()
            .unwrap()
    };
    let out = forget("b");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("is live"));
    wait_fleet(&gws[0], Duration::from_secs(5), "a is gone", |s| {
        member(s, "a")["status"] == "gone"
    })
    .await;
    let out = forget("a");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fleet_status(&gws[0]).await["total"], json!(1));
    assert_eq!(forget("a").status.code(), Some(1), "not a member any more");

    // Confirmed through an instance: final, no new generation.
    let b = &gws[0];
    let (status, body) = activate_json(
        b,
        &shared(two.addr, ""),
        rolled,
        json!({ "confirm_within": "60s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let g = body["generation"].as_u64().unwrap();
    let (status, body) = admin_request(
        b.admin,
        "POST",
        "/admin/runtime/confirm",
        Some("application/json"),
        Some(json!({ "generation": g, "reason": "smoke tests passed" }).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "confirmed");
    let s = wait_settled(b, g, Duration::from_secs(2)).await;
    assert_eq!(s["active"]["generation"], json!(g));
    assert_eq!(s["active"]["settlement"]["reason"], "smoke tests passed");
    assert_eq!(body_through(b).await, "two");

    // Aborted: back to the last final generation's document.
    let (status, body) = activate_json(
        b,
        &shared(one.addr, "# abort me\n"),
        g,
        json!({ "confirm_within": "60s" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let h = body["generation"].as_u64().unwrap();
    let (status, body) = admin_request(
        b.admin,
        "POST",
        "/admin/runtime/abort",
        Some("application/json"),
        Some(json!({ "generation": h }).to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "rolled_back");
    assert_eq!(body["rolled_back_to"], json!(g));
    let s = wait_settled(b, h, Duration::from_secs(2)).await;
    assert_eq!(s["active"]["settlement"]["outcome"], "aborted");
    assert_eq!(body_through(b).await, "two");
    // Settling what is not pending.
    let (status, body) = admin_request(
        b.admin,
        "POST",
        "/admin/runtime/confirm",
        Some("application/json"),
        Some(json!({ "generation": h }).to_string()),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "not_pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_guard_judges_the_sum_of_every_instance_answers() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("guard");
    let one = Backend::named("one").await;
    let failing = failing_backend().await;
    let (gws, first) = serving(&etcd, &prefix, &["a", "b"], one.addr).await;

    // 20 answers are needed; each instance gets 12: only their sum shows
    // the breach.
    let guard = json!({ "confirm_within": "60s", "guard": { "window": "30s", "min_requests": 20, "max_error_ratio": 0.1 } });
    let (status, body) = activate_json(&gws[0], &shared(failing.addr, ""), first, guard).await;
    assert_eq!(status, 200, "{body}");
    let bad = body["generation"].as_u64().unwrap();
    wait_fleet(
        &gws[1],
        Duration::from_secs(2),
        "both serve it",
        all_synced_on(bad, 2),
    )
    .await;
    for gw in &gws {
        for _ in 0..12 {
            let (status, _, _) = get(gw.listener("web"), "fleet.test", "/").await;
            assert_eq!(status, 500);
        }
    }
    let s = wait_settled(&gws[1], bad, Duration::from_secs(10)).await;
    let settlement = &s["active"]["settlement"];
    assert_eq!(settlement["outcome"], "auto_rolled_back", "{s}");
    assert_eq!(settlement["by"], "cutover-guard");
    let reason = settlement["reason"].as_str().unwrap();
    assert!(
        reason.contains("guard breached") && reason.contains("of 24"),
        "{reason}"
    );
    for gw in &gws {
        assert_eq!(body_through(gw).await, "one");
    }

    // A healthy one passes the guard and is confirmed by it.
    let current = s["active"]["generation"].as_u64().unwrap();
    let two = Backend::named("two").await;
    let guard = json!({ "guard": { "window": "1s", "min_requests": 10 }, "confirm_on_pass": true });
    let (status, body) = activate_json(&gws[1], &shared(two.addr, ""), current, guard).await;
    assert_eq!(status, 200, "{body}");
    let good = body["generation"].as_u64().unwrap();
    wait_fleet(
        &gws[0],
        Duration::from_secs(2),
        "both serve it",
        all_synced_on(good, 2),
    )
    .await;
    for gw in &gws {
        for _ in 0..6 {
            assert_eq!(body_through(gw).await, "two");
        }
    }
    let s = wait_settled(&gws[0], good, Duration::from_secs(10)).await;
    assert_eq!(s["active"]["settlement"]["outcome"], "confirmed", "{s}");
    assert_eq!(s["active"]["settlement"]["by"], "cutover-guard");
    assert_eq!(s["active"]["generation"], json!(good));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_canary_splits_each_instance_traffic_and_ctl_waits_for_its_end() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("canary");
    let one = Backend::named("one").await;
    let two = Backend::named("two").await;
    let (gws, first) = serving(&etcd, &prefix, &["a", "b"], one.addr).await;
    let file = gws[0].path("shared.toml");
    std::fs::write(&file, shared(two.addr, "")).unwrap();
    let admin = gws[0].admin_url();
    let ctl = std::thread::spawn(move || {
        Command::new(crate::harness::BIN)
            .args(["ctl", "--admin", &admin, "activate"])
            .arg(&file)
            .args([
                "--expect",
                &first.to_string(),
                "--steps",
                "50,100",
                "--step-interval",
                "2s",
                "--wait",
            ])
            .output()
            .unwrap()
    });
    // During the 50 % step each instance sends new requests both ways.
    let deadline = Instant::now() + Duration::from_secs(5);
    for gw in &gws {
        let mut seen = std::collections::HashSet::new();
        while seen.len() < 2 {
            seen.insert(body_through(gw).await);
            assert!(Instant::now() < deadline, "{seen:?}");
        }
    }
    let out = ctl.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("confirmed: canary steps [50, 100] completed (by cutover-canary)"),
        "{text}"
    );
    // Final everywhere: every new request goes to the new backend.
    for gw in &gws {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let bodies: Vec<String> = futures_join(gw, 10).await;
            if bodies.iter().all(|b| b == "two") {
                break;
            }
            assert!(Instant::now() < deadline, "{bodies:?}");
        }
    }
}

async fn futures_join(gw: &Gateway, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(body_through(gw).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_reach_an_etcd_that_requires_tls_client_certificates() {
    let ca = crate::pki::ca("etcd ca");
    let Some(etcd) = Etcd::start_tls(&ca).await else {
        return;
    };
    let prefix = prefix("tls");
    let one = Backend::named("one").await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = crate::pki::leaf(
        &ca,
        &["gateway"],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    );
    std::fs::write(dir.path().join("etcd-ca.pem"), &ca.pem).unwrap();
    std::fs::write(dir.path().join("client.pem"), cert).unwrap();
    std::fs::write(dir.path().join("client.key"), key).unwrap();
    let config = instance(&etcd, &prefix, "a")
        + "ca = \"etcd-ca.pem\"\ncert = \"client.pem\"\nkey = \"client.key\"\n";
    let gw = Gateway::start_in(dir, &config);
    let deadline = Instant::now() + Duration::from_secs(15);
    while gw.status().await["fleet"]["connected"] != true {
        assert!(Instant::now() < deadline, "{}", gw.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = activate(&gw, &shared(one.addr, ""), Some(0)).await;
    assert_eq!(status, 200, "{body}");
    wait_fleet(&gw, Duration::from_secs(2), "it acks", all_synced_on(1, 1)).await;
    assert_eq!(body_through(&gw).await, "one");

    // Without a client certificate etcd refuses it: never connected.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("etcd-ca.pem"), &ca.pem).unwrap();
    let config = instance(&etcd, &prefix, "b") + "ca = \"etcd-ca.pem\"\n";
    let b = Gateway::start_in(dir, &config);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let local = b.status().await;
        if local["fleet"]["last_error"].is_string() {
            assert_eq!(local["fleet"]["connected"], false, "{local}");
            break;
        }
        assert!(Instant::now() < deadline, "{local}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_authenticate_to_etcd_with_a_user_and_password_file() {
    // Tokens that expire a second after their last use: the instance must
    // take a new one by itself.
    let Some(etcd) = Etcd::start_with(&["--auth-token-ttl=1"]).await else {
        return;
    };
    // etcd's own authentication: a root user, then auth on.
    for (path, body) in [
        (
            "/v3/auth/user/add",
            json!({ "name": "root", "password": "s3cret-pass" }),
        ),
        (
            "/v3/auth/user/grant",
            json!({ "user": "root", "role": "root" }),
        ),
        ("/v3/auth/enable", json!({})),
    ] {
        let answer = etcd.call(path, body).await.unwrap();
        assert!(answer.get("header").is_some(), "{path}: {answer}");
    }
    let prefix = prefix("auth");
    let one = Backend::named("one").await;
    let start = |name: &str, password: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etcd-password"), format!("{password}\n")).unwrap();
        let config = instance(&etcd, &prefix, name)
            + "username = \"root\"\npassword_file = \"etcd-password\"\n";
        Gateway::start_in(dir, &config)
    };
    let a = start("a", "s3cret-pass");
    let deadline = Instant::now() + Duration::from_secs(15);
    while a.status().await["fleet"]["connected"] != true {
        assert!(Instant::now() < deadline, "{}", a.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = activate(&a, &shared(one.addr, ""), Some(0)).await;
    assert_eq!(status, 200, "{body}");
    wait_fleet(&a, Duration::from_secs(2), "it acks", all_synced_on(1, 1)).await;

    // Past the token's life: the next calls re-authenticate.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, body) = activate(&a, &shared(one.addr, "# again\n"), Some(1)).await;
    assert_eq!(status, 200, "an expired token is taken again: {body}");
    wait_fleet(&a, Duration::from_secs(2), "it acks", all_synced_on(2, 1)).await;

    let b = start("b", "wrong");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let local = b.status().await;
        let error = local["fleet"]["last_error"].as_str().unwrap_or_default();
        if error.contains("authentication failed") {
            assert_eq!(local["fleet"]["connected"], false, "{local}");
            break;
        }
        assert!(Instant::now() < deadline, "{local}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every one of `gws` shadows a stage (its own status says
/// so).
async fn all_shadowing(gws: &[Gateway]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for gw in gws {
        loop {
            let status = gw.status().await;
            if status["shadow"]["verdict"] == "running" {
                break;
            }
            assert!(Instant::now() < deadline, "no shadow stage here: {status}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An activation with `extra` through `gw`, on a task of its own (a
/// shadowed one answers when its stage ends).
fn activate_later(
    gw: &Gateway,
    document: String,
    expected: u64,
    extra: Value,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let admin = gw.admin;
    let body = activation(&document, expected, extra);
    tokio::spawn(async move { post_json(admin, "/admin/runtime/activate", body).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_shadow_stage_is_judged_on_the_sum_of_every_instance_copies() {
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let prefix = prefix("shadow");
    let one = Backend::named("one").await;
    let failing = failing_backend().await;
    let (gws, first) = serving(&etcd, &prefix, &["a", "b"], one.addr).await;

    // 20 pairs are needed; each instance sees 12: only their sum shows
    // the breach. Clients get the active generation's answers only.
    let shadow = json!({ "shadow": { "percent": 100, "duration": "30s", "min_requests": 20 } });
    let stage = activate_later(&gws[0], shared(failing.addr, ""), first, shadow);
    all_shadowing(&gws).await;
    for gw in &gws {
        for _ in 0..12 {
            assert_eq!(body_through(gw).await, "one");
        }
    }
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), stage)
        .await
        .expect("the breach is found before the stage ends")
        .unwrap();
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "shadow_breach");
    let total = &body["shadow"]["total"];
    assert_eq!(total["compared"], 24, "{body}");
    assert_eq!(total["candidate"]["errors"], 24, "{body}");
    assert_eq!(total["active"]["errors"], 0, "{body}");
    let s = fleet_status(&gws[1]).await;
    assert_eq!(s["active"]["generation"], json!(first), "{s}");
    assert!(s["active"]["shadow"].is_null(), "the stage is cleared: {s}");

    // A healthy document passes on both instances' copies, then is
    // activated fleet-wide.
    let two = Backend::named("two").await;
    let shadow = json!({ "shadow": { "percent": 100, "duration": "2s", "min_requests": 10 } });
    let stage = activate_later(&gws[1], shared(two.addr, ""), first, shadow);
    all_shadowing(&gws).await;
    for gw in &gws {
        for _ in 0..8 {
            assert_eq!(body_through(gw).await, "one");
        }
    }
    let (status, body) = stage.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["shadow"]["verdict"], "passed", "{body}");
    assert_eq!(body["shadow"]["total"]["compared"], 16, "{body}");
    let good = body["generation"].as_u64().unwrap();
    wait_fleet(
        &gws[0],
        Duration::from_secs(2),
        "both serve it",
        all_synced_on(good, 2),
    )
    .await;
    for gw in &gws {
        assert_eq!(body_through(gw).await, "two");
    }

    // An operator aborts a stage through another instance than its
    // writer, by the candidate generation fleet status names.
    let stage = activate_later(
        &gws[0],
        shared(one.addr, ""),
        good,
        json!({ "shadow": { "duration": "10m" } }),
    );
    let (s, _) = wait_fleet(&gws[1], Duration::from_secs(5), "the stage runs", |s| {
        !s["active"]["shadow"].is_null()
    })
    .await;
    let candidate = s["active"]["shadow"]["candidate"].clone();
    let (status, aborted) = post_json(
        gws[1].admin,
        "/admin/runtime/abort",
        json!({ "generation": candidate }),
    )
    .await;
    assert_eq!(status, 200, "{aborted}");
    assert_eq!(aborted["outcome"], "shadow_aborted");
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), stage)
        .await
        .expect("the writer sees the stage gone")
        .unwrap();
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "shadow_aborted");
    wait_fleet(
        &gws[0],
        Duration::from_secs(5),
        "no instance shadows",
        |s| s["active"]["shadow"].is_null() && s["active"]["generation"] == json!(good),
    )
    .await;
}

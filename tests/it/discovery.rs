//! Discovery (DESIGN §20): members from DNS names, SRV records and
//! endpoint files follow the source without a generation, against a
//! real DNS server on loopback that each test controls (`dns.rs`).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::dns::{DnsServer, Mode};
use super::harness::*;

/// A backend on 127.0.0.`n`:`port` answering its own name, counting
/// what it answers.
struct Member {
    count: Arc<AtomicU64>,
    /// While set, it answers 503 (its checks fail).
    down: Arc<std::sync::atomic::AtomicBool>,
    _backend: Backend,
}

/// Backends on 127.0.0.1..=n, all on one port (found free on each).
async fn members(n: u8) -> (u16, Vec<Member>) {
    'port: for _ in 0..50 {
        let port = closed_port().port();
        let mut out = Vec::new();
        for i in 1..=n {
            let count = Arc::new(AtomicU64::new(0));
            let name: &'static str = Box::leak(format!("m{i}").into_boxed_str());
            let counter = Arc::clone(&count);
            let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let is_down = Arc::clone(&down);
            let handler: Handler = Arc::new(move |req| {
                if is_down.load(Ordering::Relaxed) {
                    return Box::pin(async move {
                        let mut response = hyper::Response::new(full("down"));
                        *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                        response
                    });
                }
                // Health checks are not traffic.
                let check = req
                    .headers()
                    .get("user-agent")
                    .is_some_and(|ua| ua == "cutover-health-check");
                if !check {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                Box::pin(async move { hyper::Response::new(full(name)) })
            });
            let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, i), port));
            let Some(backend) = Backend::start_at(addr, handler).await else {
                continue 'port;
            };
            out.push(Member {
                count,
                down,
                _backend: backend,
            });
        }
        return (port, out);
    }
    panic!("no port free on 127.0.0.1-{n}");
}

fn ips(last: &[u8]) -> Vec<Ipv4Addr> {
    last.iter().map(|i| Ipv4Addr::new(127, 0, 0, *i)).collect()
}

fn discovery_config(dns: &DnsServer, backends: &str, upstream_lines: &str) -> String {
    Config::new()
        .metrics()
        .listener("web", "")
        .route("all", "listeners = [\"web\"]\nupstream = \"app\"")
        .text(&format!(
            "[upstreams.app]\nbackends = [{backends}]\n{upstream_lines}"
        ))
        .text(&format!(
            "[discovery]\nnameservers = [\"{}\"]\ntimeout = \"300ms\"\nattempts = 1",
            dns.addr
        ))
        .build()
}

/// The `app` upstream of `/admin/runtime/backends`.
async fn app(gw: &Gateway) -> Value {
    let (status, view) =
        admin_request(gw.admin, "GET", "/admin/runtime/backends", None, None).await;
    assert_eq!(status, 200, "{view}");
    view["upstreams"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["name"] == "app"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The member addresses of `app`, sorted.
async fn member_addrs(gw: &Gateway) -> Vec<String> {
    let mut addrs: Vec<String> = app(gw).await["backends"]
        .as_array()
        .map(|b| {
            b.iter()
                .filter_map(|b| b["addr"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    addrs.sort();
    addrs
}

/// Waits (bounded) for every member of `app` to pass its checks.
async fn wait_healthy(gw: &Gateway) {
    let started = Instant::now();
    while !app(gw).await["backends"]
        .as_array()
        .is_some_and(|b| b.iter().all(|b| b["health"] == "healthy"))
    {
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until `app` has exactly `want` members; how long it took.
async fn wait_members(gw: &Gateway, want: &[String], within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let now = member_addrs(gw).await;
        if now == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "members {now:?}, waited {within:?} for {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn addrs(port: u16, last: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = last.iter().map(|i| format!("127.0.0.{i}:{port}")).collect();
    out.sort();
    out
}

/// `n` members on one port, a DNS server whose `app.test` names those of
/// `initial`, and a gateway whose `app` upstream follows it every second.
async fn dns_pool(n: u8, initial: &[u8]) -> (DnsServer, u16, Vec<Member>, Gateway) {
    let dns = DnsServer::start().await;
    let (port, backends) = members(n).await;
    dns.set_a("app.test", &ips(initial));
    let gw = Gateway::start(&discovery_config(
        &dns,
        &format!("{{ dns = \"app.test:{port}\", refresh = \"1s\" }}"),
        "",
    ));
    (dns, port, backends, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dns_pool_scales_2_5_1_under_load_with_no_failed_request() {
    let (dns, port, backends, gw) = dns_pool(5, &[1, 2]).await;
    // Started with both members in: no moment without them.
    assert_eq!(member_addrs(&gw).await, addrs(port, &[1, 2]));
    let generation = gw.active_generation().await;
    let load = KeepAliveLoad::start(gw.listener("web"), 8, &["m1", "m2", "m3", "m4", "m5"]);

    // 2 -> 5: the new members take traffic within one refresh.
    dns.set_a("app.test", &ips(&[1, 2, 3, 4, 5]));
    let changed = Instant::now();
    loop {
        if backends[2..]
            .iter()
            .all(|m| m.count.load(Ordering::Relaxed) > 0)
        {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_millis(2_500),
            "new members took no traffic within a refresh (1s) and a resolution"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let joined = changed.elapsed();
    wait_members(&gw, &addrs(port, &[1, 2, 3, 4, 5]), Duration::from_secs(3)).await;

    // 5 -> 1: once the set has changed, the others get no new request.
    dns.set_a("app.test", &ips(&[3]));
    wait_members(&gw, &addrs(port, &[3]), Duration::from_secs(3)).await;
    // Requests picked just before the swap may still be arriving.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before: Vec<u64> = backends
        .iter()
        .map(|m| m.count.load(Ordering::Relaxed))
        .collect();
    let answered = load.answered();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(load.answered() > answered + 100, "the load goes on");
    for (i, member) in backends.iter().enumerate() {
        if i != 2 {
            assert_eq!(
                member.count.load(Ordering::Relaxed),
                before[i],
                "m{} left the set but got new requests",
                i + 1
            );
        }
    }
    let total = load.answered();
    for client in load.stop().await {
        client.expect("no request failed while the set changed");
    }
    assert!(total > 500, "{total} answered");
    // Membership changes minted no generation.
    assert_eq!(gw.active_generation().await, generation);
    let metrics = scrape(&gw).await;
    assert!(
        sample(
            &metrics,
            "cutover_discovery_resolutions_total",
            &["upstream=\"app\"", "outcome=\"ok\""]
        ) >= 3.0
    );
    assert_eq!(
        sample(
            &metrics,
            "cutover_discovery_members{",
            &["upstream=\"app\""]
        ),
        1.0
    );
    eprintln!("members joined within {joined:?}; {total} requests, 0 failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_weights_are_honoured_and_a_lower_priority_takes_over() {
    let dns = DnsServer::start().await;
    let (port, backends) = members(3).await;
    dns.set_srv(
        "_http._tcp.app.test",
        &[
            (10, 1, port, "a.test"),
            (10, 3, port, "b.test"),
            (20, 1, port, "c.test"),
            // A target that does not resolve: left out, reported.
            (10, 5, port, "gone.test"),
        ],
    );
    dns.set_a("a.test", &ips(&[1]));
    dns.set_a("b.test", &ips(&[2]));
    dns.set_a("c.test", &ips(&[3]));
    let gw = Gateway::start(&discovery_config(
        &dns,
        "{ srv = \"_http._tcp.app.test\", refresh = \"1s\" }",
        "policy = \"weighted\"\nhealth = { path = \"/\", interval = \"200ms\", timeout = \"200ms\", unhealthy_after = 1 }",
    ));
    let view = app(&gw).await;
    assert_eq!(view["sources"][0]["source"], "srv:_http._tcp.app.test");
    assert_eq!(view["sources"][0]["members"], 3);
    assert!(
        view["sources"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("gone.test") && e.contains("did not resolve")),
        "{view}"
    );
    // Wait for the checks' first verdicts.
    wait_healthy(&gw).await;
    let web = gw.listener("web");
    let n = 4_000;
    for _ in 0..n / 100 {
        let burst: Vec<_> = (0..100).map(|_| get(web, "a", "/")).collect();
        for (status, _, _) in futures_util::future::join_all(burst).await {
            assert_eq!(status, 200);
        }
    }
    let counts: Vec<f64> = backends
        .iter()
        .map(|m| m.count.load(Ordering::Relaxed) as f64)
        .collect();
    let served = counts[0] + counts[1];
    for (count, expected) in [(counts[0], 0.25), (counts[1], 0.75)] {
        let share = count / served;
        assert!(
            (share - expected).abs() <= 0.05 * expected,
            "share {share:.4}, weight says {expected} ({counts:?})"
        );
    }
    assert_eq!(
        counts[2], 0.0,
        "the lower priority took requests: {counts:?}"
    );

    // The preferred priority goes down: the next one takes over.
    backends[0].down.store(true, Ordering::Relaxed);
    backends[1].down.store(true, Ordering::Relaxed);
    let started = Instant::now();
    loop {
        let (status, _, body) = get(web, "a", "/").await;
        if status == 200 && body == "m3" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "priority 20 never took over: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resolver_down_for_30s_changes_nothing_and_only_agreed_empty_answers_empty_a_set() {
    let (dns, port, _backends, gw) = dns_pool(2, &[1, 2]).await;
    let both = addrs(port, &[1, 2]);
    assert_eq!(member_addrs(&gw).await, both);
    let load = KeepAliveLoad::start(gw.listener("web"), 4, &["m1", "m2"]);

    // 30 s of silence, then SERVFAIL: the last good set stays.
    dns.set_mode(Mode::Silent);
    let started = Instant::now();
    let mut saw_stale = false;
    while started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            member_addrs(&gw).await,
            both,
            "a silent resolver changed the set"
        );
        let source = &app(&gw).await["sources"][0];
        saw_stale |= source["stale"] == true && source["error"].is_string();
    }
    assert!(saw_stale, "the view never said the set is stale");
    dns.set_mode(Mode::ServFail);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(member_addrs(&gw).await, both);
    let metrics = scrape(&gw).await;
    let counted = |outcome: &str| {
        sample(
            &metrics,
            "cutover_discovery_resolutions_total",
            &["upstream=\"app\"", &format!("outcome=\"{outcome}\"")],
        )
    };
    assert!(counted("timeout") >= 5.0, "{}", counted("timeout"));
    assert!(counted("error") >= 1.0, "{}", counted("error"));

    // Back: the error clears.
    dns.set_mode(Mode::Answer);
    let started = Instant::now();
    while !app(&gw).await["sources"][0]["error"].is_null() {
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for client in load.stop().await {
        client.expect("no request failed while the resolver was down");
    }

    // NXDOMAIN: kept until three answers in a row agree, then empty, and
    // an upstream with no member answers 503 no_healthy_backend.
    dns.set_a("other.test", &ips(&[9]));
    dns.remove("app.test");
    let gone = Instant::now();
    let waited = wait_members(&gw, &[], Duration::from_secs(8)).await;
    assert!(
        gone.elapsed() >= Duration::from_secs(2),
        "emptied after {waited:?}: before three answers could agree"
    );
    let source = &app(&gw).await["sources"][0];
    assert!(
        source["error"]
            .as_str()
            .is_some_and(|e| e.contains("NXDOMAIN")),
        "{source}"
    );
    let (status, _, _) = get(gw.listener("web"), "a", "/").await;
    assert_eq!(status, 503);
    assert!(
        sample(
            &scrape(&gw).await,
            "cutover_discovery_resolutions_total",
            &["upstream=\"app\"", "outcome=\"nxdomain\""]
        ) >= 3.0
    );
    // And back again.
    dns.set_a("app.test", &ips(&[2]));
    wait_members(&gw, &addrs(port, &[2]), Duration::from_secs(3)).await;
    let (status, _, body) = get(gw.listener("web"), "a", "/").await;
    assert_eq!((status, body.as_str()), (200, "m2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_keeps_its_health_and_ejection_across_100_activations() {
    let dns = DnsServer::start().await;
    let (port, backends) = members(2).await;
    dns.set_a("app.test", &ips(&[1, 2]));
    let config = |i: usize| {
        discovery_config(
            &dns,
            &format!("{{ dns = \"app.test:{port}\", refresh = \"1s\" }}"),
            // Each activation changes the upstream itself (max_members),
            // not the members' identity.
            &format!(
                "max_members = {}\nhealth = {{ path = \"/\", interval = \"300ms\" }}\noutlier = {{ consecutive_failures = 1, base_ejection = \"5m\", max_ejected_percent = 50 }}",
                100 + i
            ),
        )
    };
    let gw = Gateway::start(&config(0));
    wait_healthy(&gw).await;
    // m2 fails a request: ejected (its checks still pass).
    backends[1].down.store(true, Ordering::Relaxed);
    let web = gw.listener("web");
    let started = Instant::now();
    loop {
        let _ = get(web, "a", "/").await;
        let view = app(&gw).await;
        if view["backends"][1]["ejected"] == true {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{view}");
    }
    backends[1].down.store(false, Ordering::Relaxed);
    let state = |view: &Value| -> Vec<(Value, Value, Value, Value)> {
        view["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["addr"].clone(),
                    b["ejected_until_unix_ms"].clone(),
                    b["ejections"].clone(),
                    b["failures"].clone(),
                )
            })
            .collect()
    };
    let before = app(&gw).await;
    let queries = dns.queries();
    let activated = Instant::now();
    for i in 1..=100 {
        let (status, body) = activate_with(&gw, &config(i), "").await;
        assert_eq!(status, 200, "activation {i}: {body}");
    }
    let elapsed = activated.elapsed();
    let after = app(&gw).await;
    assert_eq!(state(&after), state(&before), "members' state changed");
    assert!(
        after["backends"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["health"] == "healthy"),
        "{after}"
    );
    // The source was followed, not made again 100 times.
    let asked = dns.queries() - queries;
    let refreshes = elapsed.as_secs() + 2;
    assert!(
        asked <= 2 * (refreshes + 1),
        "{asked} queries in {elapsed:?} of activations"
    );
    // Every request still goes to m1 only (m2 stays ejected).
    for _ in 0..20 {
        let (status, _, body) = get(web, "a", "/").await;
        assert_eq!((status, body.as_str()), (200, "m1"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_file_is_followed_through_renames_and_symlink_swaps_and_a_bad_one_is_kept_out()
{
    let (port, _backends) = members(3).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let write = |name: &str, members: &[u8]| {
        let list: Vec<String> = members
            .iter()
            .map(|i| format!("{{\"addr\": \"127.0.0.{i}:{port}\"}}"))
            .collect();
        let path = data.join(name);
        std::fs::write(&path, format!("[{}]", list.join(","))).unwrap();
        path
    };
    // A Kubernetes-style layout: endpoints.json -> current/endpoints.json.
    write("v1.json", &[1, 2]);
    std::os::unix::fs::symlink("data/v1.json", dir.path().join("endpoints.json")).unwrap();
    let config = Config::new()
        .listener("web", "")
        .route("all", "listeners = [\"web\"]\nupstream = \"app\"")
        .text("[upstreams.app]\nbackends = [{ endpoints_file = \"endpoints.json\" }]")
        .build();
    let gw = Gateway::start_in(dir, &config);
    assert_eq!(member_addrs(&gw).await, addrs(port, &[1, 2]));
    let link = gw.dir.path().join("endpoints.json");
    let data = gw.dir.path().join("data");

    // A symlink swap (ln -sfn through a rename).
    std::fs::write(
        data.join("v2.json"),
        format!("[{{\"addr\": \"127.0.0.3:{port}\", \"weight\": 2}}]"),
    )
    .unwrap();
    let tmp = gw.dir.path().join(".endpoints.tmp");
    std::os::unix::fs::symlink("data/v2.json", &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    wait_members(&gw, &addrs(port, &[3]), Duration::from_secs(3)).await;
    let (status, _, body) = get(gw.listener("web"), "a", "/").await;
    assert_eq!((status, body.as_str()), (200, "m3"));

    // A half-written list is refused whole; the last good one stays.
    std::fs::remove_file(&link).unwrap();
    std::fs::write(&link, "[{\"addr\": \"127.0.0.1:").unwrap();
    let started = Instant::now();
    loop {
        let source = app(&gw).await["sources"][0].clone();
        if source["error"].is_string() {
            assert_eq!(source["stale"], true, "{source}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(7), "{source}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(member_addrs(&gw).await, addrs(port, &[3]));

    // An atomic rename over it.
    let next = gw.dir.path().join(".next.json");
    std::fs::write(
        &next,
        format!("[{{\"addr\": \"127.0.0.1:{port}\"}}, {{\"addr\": \"127.0.0.2:{port}\"}}]"),
    )
    .unwrap();
    std::fs::rename(&next, &link).unwrap();
    wait_members(&gw, &addrs(port, &[1, 2]), Duration::from_secs(3)).await;
    assert!(app(&gw).await["sources"][0]["error"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_records_are_capped_by_max_members_and_a_zero_ttl_is_floored() {
    let dns = DnsServer::start().await;
    // 2 500 A records: about the most one DNS message holds as this
    // server writes them (24 bytes each, 64 KiB over TCP; 5 000 would
    // need 120). Truncated over UDP, asked again over TCP.
    let many: Vec<Ipv4Addr> = (0..2_500u32)
        .map(|i| Ipv4Addr::from(0x0a00_0000 + i + 1))
        .collect();
    dns.set_a("many.test", &many);
    dns.set_ttl(0);
    // A large answer takes this debug-built server a while to write.
    let config = discovery_config(
        &dns,
        "{ dns = \"many.test:8080\", refresh = \"30s\" }",
        "max_members = 1000",
    )
    .replace("timeout = \"300ms\"", "timeout = \"3s\"");
    let gw = Gateway::start(&config);
    let view = app(&gw).await;
    assert_eq!(
        view["backends"].as_array().map(Vec::len),
        Some(1000),
        "{}",
        view["sources"]
    );
    let source = &view["sources"][0];
    assert_eq!(source["members"], 2500, "{source}");
    assert_eq!(source["left_out"], 1500, "{source}");
    // TTL 0 asks again, but not sooner than a second after.
    let (last, next) = (
        source["last_resolution_unix_ms"].as_u64().unwrap(),
        source["next_refresh_unix_ms"].as_u64().unwrap(),
    );
    assert!((1000..1500).contains(&(next - last)), "{source}");
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(
            &metrics,
            "cutover_discovery_members_left_out",
            &["upstream=\"app\""]
        ),
        1500.0
    );
    assert_eq!(
        sample(
            &metrics,
            "cutover_discovery_members{",
            &["upstream=\"app\""]
        ),
        1000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_warns_of_names_that_do_not_resolve_and_preview_shows_members() {
    let dns = DnsServer::start().await;
    dns.set_a("app.test", &ips(&[1, 2]));
    let gw = Gateway::start(&discovery_config(
        &dns,
        &format!("{{ addr = \"{}\" }}", refusing_addr()),
        "",
    ));
    let candidate = discovery_config(
        &dns,
        "{ dns = \"app.test:8080\" },\n  { dns = \"nowhere.test:8080\" }",
        "",
    );
    let (status, plan) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/validate",
        Some("application/toml"),
        Some(candidate.clone()),
    )
    .await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["activatable"], true, "a warning refuses nothing");
    let warning = &plan["warnings"][0];
    assert_eq!(warning["code"], "unresolved_name", "{plan}");
    assert_eq!(warning["path"], "upstreams.app.backends[1].dns");
    assert!(warning["line"].as_u64().is_some(), "{warning}");
    assert!(
        warning["message"]
            .as_str()
            .is_some_and(|m| m.contains("NXDOMAIN")),
        "{warning}"
    );
    let sources = &plan["members"][0]["sources"];
    assert_eq!(plan["members"][0]["upstream"], "app");
    assert_eq!(
        sources[0]["members"],
        serde_json::json!(["127.0.0.1:8080", "127.0.0.2:8080"])
    );
    assert_eq!(sources[0]["followed"], false);

    // Activated, then previewed again: the set is the live one.
    let (status, body) = activate_with(&gw, &candidate, "").await;
    assert_eq!(status, 200, "{body}");
    let changed = candidate.replace(
        "{ dns = \"nowhere.test:8080\" }",
        "{ dns = \"nowhere.test:8081\" }",
    );
    let (status, plan) = admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/preview",
        Some("application/toml"),
        Some(changed),
    )
    .await;
    assert_eq!(status, 200, "{plan}");
    let sources = &plan["members"][0]["sources"];
    assert_eq!(sources[0]["followed"], true, "{plan}");
    assert_eq!(sources[0]["members"].as_array().map(Vec::len), Some(2));

    // ctl shows each member's source and each source's state.
    let (code, out, err) = ctl(&gw.admin_url(), &["backends"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("127.0.0.2:8080") && out.contains("dns:app.test:8080"),
        "{out}"
    );
    assert!(
        out.contains("dns:nowhere.test:8080") && out.contains("NXDOMAIN"),
        "{out}"
    );
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dns_pool_scales_2_5_1_under_load_with_no_failed_request() {
    let dns = DnsServer::start().await;
    let (port, backends) = members(5).await;
    dns.set_a("app.test", &ips(&[1, 2]));
    let gw = Gateway::start(&discovery_config(
        &dns,
        &format!("{{ dns = \"app.test:{port}\", refresh = \"1s\" }}"),
        "",
    ));
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
        sample(&metrics, "cutover_discovery_members", &["upstream=\"app\""]),
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
    // Wait for the checks' first verdicts.
    let started = Instant::now();
    while !app(&gw).await["backends"]
        .as_array()
        .is_some_and(|b| b.iter().all(|b| b["health"] == "healthy"))
    {
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

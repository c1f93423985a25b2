//! Generations under reload: pinning, and zero errors while swapping.

use std::sync::Arc;
use std::time::Duration;

use hyper::Request;
use tokio::sync::Notify;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_finishes_on_the_generation_that_admitted_it() {
    let release = Arc::new(Notify::new());
    let arrived = Arc::new(Notify::new());
    let (release_a, arrived_a) = (Arc::clone(&release), Arc::clone(&arrived));
    let backend_a = Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        let (release, arrived) = (Arc::clone(&release_a), Arc::clone(&arrived_a));
        Box::pin(async move {
            if req.uri().path() == "/slow" {
                arrived.notify_one();
                release.notified().await;
            }
            hyper::Response::new(full("A"))
        })
    }))
    .await;
    let backend_b = Backend::named("B").await;
    let gw = Gateway::start(&proxy_config(backend_a.addr, ""));
    let web = gw.listener("web");

    let slow = tokio::spawn(async move { get(web, "a", "/slow").await });
    tokio::time::timeout(Duration::from_secs(5), arrived.notified())
        .await
        .expect("slow request reached A");

    gw.write_config(&proxy_config(backend_b.addr, ""));
    gw.signal("HUP");
    gw.wait_generation(2).await;
    let status = gw.status().await;
    let pinned = status["generations"].as_array().unwrap();
    assert!(
        pinned
            .iter()
            .any(|g| g["generation"] == 1 && g["inflight_requests"] == 1),
        "generation 1 should still carry the slow request: {status}"
    );

    let (code, _, body) = get(web, "a", "/fast").await;
    assert_eq!(
        (code, body.as_str()),
        (200, "B"),
        "a request admitted after the swap goes to B"
    );

    release.notify_one();
    let (code, _, body) = slow.await.unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, "A"),
        "the pinned request finishes on A"
    );
}

/// 32 keep-alive connections send requests back to back while the
/// configuration file is reloaded 200 times, alternating two backend sets.
/// Every response must be a 200 from a known backend, and no connection
/// may be closed by the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_errors_while_reloading_200_times() {
    let a = Backend::named("A").await;
    let b = Backend::named("B").await;
    let config_a = proxy_config(a.addr, "");
    let config_b = proxy_config(b.addr, "");
    let gw = Gateway::start(&config_a);
    let web = gw.listener("web");

    let load = KeepAliveLoad::start(web, 32, &["A", "B"]);

    for i in 0..200u64 {
        gw.write_config(if i % 2 == 0 { &config_b } else { &config_a });
        gw.signal("HUP");
        gw.wait_generation(i + 2).await;
    }
    let answered = load.answered();
    let mut saw_both = 0;
    for client in load.stop().await {
        let seen = client.unwrap_or_else(|e| panic!("client error: {e}\n{}", gw.logs()));
        if seen.len() == 2 {
            saw_both += 1;
        }
    }
    assert_eq!(gw.active_generation().await, 201);
    assert!(answered > 1000, "too few requests: {answered}");
    assert!(
        saw_both > 0,
        "no connection saw both backends: keep-alive requests did not follow the swaps"
    );
}

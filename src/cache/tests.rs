//! The cache engine against RFC 9111's cases, in process. Each test names
//! the section it holds the engine to.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{request, response, Method, StatusCode};

use super::*;

fn req(method: Method, headers: &[(&str, &str)]) -> request::Parts {
    let mut builder = http::Request::builder()
        .method(method)
        .uri("/a?x=1")
        .header("host", "app.test");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

fn get(headers: &[(&str, &str)]) -> request::Parts {
    req(Method::GET, headers)
}

fn head(status: u16, headers: &[(&str, &str)]) -> response::Parts {
    let mut builder = http::Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

fn memory(bytes: u64) -> ZoneSpec {
    ZoneSpec {
        memory: bytes,
        disk: None,
    }
}

fn zone() -> Arc<Zone> {
    Zones::default().zone("test", &memory(1 << 20))
}

fn store(
    zone: &Zone,
    key: &str,
    request: &request::Parts,
    answer: &response::Parts,
    at: SystemTime,
) {
    let stored = Stored::new(request, answer, Bytes::from_static(b"body"), at).expect("storable");
    zone.store(key, stored);
}

#[test]
fn fresh_by_max_age_then_stale_with_a_conditional_request() {
    // §4.2.1 (max-age), §5.1 (Age), §4.3.1 (validators sent).
    let zone = zone();
    let t0 = SystemTime::now();
    let answer = head(200, &[("cache-control", "max-age=60"), ("etag", "\"v1\"")]);
    store(&zone, "k", &get(&[]), &answer, t0);
    match zone.lookup("k", &get(&[]), t0 + Duration::from_secs(10)) {
        Found::Fresh { head, body } => {
            assert_eq!(head.status, StatusCode::OK);
            assert_eq!(head.headers["age"], "10");
            assert_eq!(body, "body");
            // RFC 9110 §5.6.7: IMF-fixdate, the time of the answer.
            let date = head.headers["date"].to_str().unwrap();
            assert!(date.ends_with(" GMT"), "{date}");
            assert_eq!(
                httpdate::parse_http_date(date).ok(),
                Some(t0 + Duration::from_secs(10))
                    .map(|t| { httpdate::parse_http_date(&httpdate::fmt_http_date(t)).unwrap() })
            );
        }
        other => panic!("fresh expected: {other:?}"),
    }
    match zone.lookup("k", &get(&[]), t0 + Duration::from_secs(61)) {
        Found::Stale { request, .. } => {
            assert_eq!(request.headers["if-none-match"], "\"v1\"");
        }
        other => panic!("stale expected: {other:?}"),
    }
}

#[test]
fn s_maxage_wins_for_a_shared_cache_and_private_no_store_are_not_stored() {
    // §5.2.2.10 s-maxage, §5.2.2.7 private, §5.2.2.5 no-store.
    let t0 = SystemTime::now();
    let zone = zone();
    let answer = head(200, &[("cache-control", "max-age=1, s-maxage=100")]);
    store(&zone, "k", &get(&[]), &answer, t0);
    assert!(matches!(
        zone.lookup("k", &get(&[]), t0 + Duration::from_secs(50)),
        Found::Fresh { .. }
    ));
    let cookie = head(
        200,
        &[("cache-control", "max-age=60"), ("set-cookie", "s=1")],
    );
    assert!(
        Stored::new(&get(&[]), &cookie, Bytes::new(), t0).is_none(),
        "an answer that sets a cookie"
    );
    for directive in ["private, max-age=60", "no-store", "max-age=60, no-store"] {
        let answer = head(200, &[("cache-control", directive)]);
        assert!(
            Stored::new(&get(&[]), &answer, Bytes::new(), t0).is_none(),
            "{directive}"
        );
    }
}

#[test]
fn authorization_requests_are_stored_only_where_the_answer_allows() {
    // §3.5.
    let t0 = SystemTime::now();
    let asked = get(&[("authorization", "Bearer x")]);
    let plain = head(200, &[("cache-control", "max-age=60")]);
    assert!(Stored::new(&asked, &plain, Bytes::new(), t0).is_none());
    for allows in [
        "public, max-age=60",
        "s-maxage=60",
        "max-age=60, must-revalidate",
    ] {
        let answer = head(200, &[("cache-control", allows)]);
        assert!(
            Stored::new(&asked, &answer, Bytes::new(), t0).is_some(),
            "{allows}"
        );
    }
}

#[test]
fn no_cache_answers_are_revalidated_every_time() {
    // §5.2.2.4 no-cache (response), §5.2.1.4 no-cache (request).
    let t0 = SystemTime::now();
    let zone = zone();
    let answer = head(
        200,
        &[
            ("cache-control", "no-cache"),
            ("last-modified", "Tue, 01 Dec 2026 00:00:00 GMT"),
        ],
    );
    store(&zone, "k", &get(&[]), &answer, t0);
    match zone.lookup("k", &get(&[]), t0) {
        Found::Stale { request, .. } => {
            assert_eq!(
                request.headers["if-modified-since"],
                "Tue, 01 Dec 2026 00:00:00 GMT"
            );
        }
        other => panic!("{other:?}"),
    }
    let zone = self::zone();
    store(
        &zone,
        "k",
        &get(&[]),
        &head(200, &[("cache-control", "max-age=60")]),
        t0,
    );
    assert!(matches!(
        zone.lookup("k", &get(&[("cache-control", "no-cache")]), t0),
        Found::Stale { .. }
    ));
}

#[test]
fn expires_gives_freshness_and_heuristics_need_last_modified() {
    // §5.3 Expires, §4.2.2 heuristic freshness.
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_342_400); // 2026-12-04
    let zone = zone();
    let answer = head(
        200,
        &[
            ("date", "Fri, 04 Dec 2026 00:00:00 GMT"),
            ("expires", "Fri, 04 Dec 2026 00:01:00 GMT"),
        ],
    );
    store(&zone, "k", &get(&[]), &answer, t0);
    assert!(matches!(
        zone.lookup("k", &get(&[]), t0 + Duration::from_secs(30)),
        Found::Fresh { .. }
    ));
    assert!(matches!(
        zone.lookup("k", &get(&[]), t0 + Duration::from_secs(90)),
        Found::Stale { .. }
    ));
    // No explicit freshness: fresh for 10 % of its age since
    // Last-Modified (10 days old: one day), for a status §4.2.2 allows.
    let answer = head(
        200,
        &[
            ("date", "Fri, 04 Dec 2026 00:00:00 GMT"),
            ("last-modified", "Tue, 24 Nov 2026 00:00:00 GMT"),
        ],
    );
    let zone = self::zone();
    store(&zone, "k", &get(&[]), &answer, t0);
    assert!(matches!(
        zone.lookup("k", &get(&[]), t0 + Duration::from_secs(3600)),
        Found::Fresh { .. }
    ));
}

#[test]
fn vary_keeps_one_variant_per_selected_value() {
    // §4.1 Vary.
    let t0 = SystemTime::now();
    let zone = zone();
    let answer = head(
        200,
        &[("cache-control", "max-age=60"), ("vary", "Accept-Language")],
    );
    let en = get(&[("accept-language", "en")]);
    let fr = get(&[("accept-language", "fr")]);
    zone.store(
        "k",
        Stored::new(&en, &answer, Bytes::from_static(b"hello"), t0).unwrap(),
    );
    zone.store(
        "k",
        Stored::new(&fr, &answer, Bytes::from_static(b"bonjour"), t0).unwrap(),
    );
    // The same selection replaces, not adds.
    zone.store(
        "k",
        Stored::new(&fr, &answer, Bytes::from_static(b"salut"), t0).unwrap(),
    );
    let body = |request: &request::Parts| match zone.lookup("k", request, t0) {
        Found::Fresh { body, .. } => Some(body),
        _ => None,
    };
    assert_eq!(body(&en).as_deref(), Some(&b"hello"[..]));
    assert_eq!(body(&fr).as_deref(), Some(&b"salut"[..]));
    assert_eq!(body(&get(&[("accept-language", "de")])), None);
    assert_eq!(zone.objects.get("k").map(|v| v.0.len()), Some(2));
    // Vary: * matches nothing.
    let star = head(200, &[("cache-control", "max-age=60"), ("vary", "*")]);
    zone.store("s", Stored::new(&en, &star, Bytes::new(), t0).unwrap());
    assert!(!matches!(zone.lookup("s", &en, t0), Found::Fresh { .. }));
}

#[test]
fn a_bare_304_to_our_own_if_modified_since_still_freshens() {
    // §4.3.4 selects by validator; a 304 that repeats none answers the
    // request's validators, which were ours alone.
    let t0 = SystemTime::now();
    let zone = zone();
    let answer = head(
        200,
        &[
            ("cache-control", "max-age=1"),
            ("last-modified", "Tue, 01 Dec 2026 00:00:00 GMT"),
        ],
    );
    store(&zone, "k", &get(&[]), &answer, t0);
    let later = t0 + Duration::from_secs(5);
    let Found::Stale { stored, request } = zone.lookup("k", &get(&[]), later) else {
        panic!("stale expected");
    };
    let bare = head(304, &[("cache-control", "max-age=60")]);
    assert!(
        zone.revalidated("k", &stored, &request, &bare, later, false)
            .is_none(),
        "the client's own validators: not ours to apply"
    );
    let (merged, body) = zone
        .revalidated("k", &stored, &request, &bare, later, true)
        .expect("ours alone: about the stored answer");
    assert_eq!(
        (merged.status, body.as_ref()),
        (StatusCode::OK, &b"body"[..])
    );
}

#[test]
fn a_304_updates_the_stored_answer_and_keeps_its_body() {
    // §4.3.4 freshening stored responses upon validation.
    let t0 = SystemTime::now();
    let zone = zone();
    let answer = head(
        200,
        &[
            ("cache-control", "max-age=1"),
            ("etag", "\"v1\""),
            ("x-version", "1"),
        ],
    );
    store(&zone, "k", &get(&[]), &answer, t0);
    let later = t0 + Duration::from_secs(5);
    let Found::Stale { stored, request } = zone.lookup("k", &get(&[]), later) else {
        panic!("stale expected");
    };
    let not_modified = head(
        304,
        &[
            ("cache-control", "max-age=60"),
            ("etag", "\"v1\""),
            ("x-version", "2"),
        ],
    );
    let (merged, body) = zone
        .revalidated("k", &stored, &request, &not_modified, later, true)
        .expect("a matching 304");
    assert_eq!(merged.status, StatusCode::OK);
    assert_eq!(merged.headers["x-version"], "2");
    if let Some(date) = merged.headers.get("date") {
        assert!(
            httpdate::parse_http_date(date.to_str().unwrap()).is_ok(),
            "{date:?}"
        );
    }
    assert_eq!(body, "body");
    assert!(matches!(
        zone.lookup("k", &get(&[]), later + Duration::from_secs(30)),
        Found::Fresh { .. }
    ));
    // A 200 to the revalidation is a new answer, not an update.
    let Found::Stale { stored, request } =
        zone.lookup("k", &get(&[]), later + Duration::from_secs(120))
    else {
        panic!("stale again");
    };
    let changed = head(200, &[("etag", "\"v2\"")]);
    assert!(zone
        .revalidated("k", &stored, &request, &changed, later, true)
        .is_none());
}

#[test]
fn methods_match_exactly_so_a_head_is_looked_up_as_its_get() {
    // §4: a stored answer is used for the method it was stored for; a
    // HEAD may be answered from a stored GET (§9.3.2 of RFC 9110), which
    // the request path does by looking a HEAD up as the GET it stands for.
    let t0 = SystemTime::now();
    let zone = zone();
    store(
        &zone,
        "k",
        &get(&[]),
        &head(200, &[("cache-control", "max-age=60")]),
        t0,
    );
    assert!(matches!(
        zone.lookup("k", &get(&[]), t0),
        Found::Fresh { .. }
    ));
    assert!(matches!(
        zone.lookup("k", &req(Method::HEAD, &[]), t0),
        Found::Miss
    ));
    assert!(matches!(
        zone.lookup("k", &req(Method::POST, &[]), t0),
        Found::Miss
    ));
}

#[test]
fn purge_by_key_prefix_and_surrogate_key() {
    let t0 = SystemTime::now();
    let zone = zone();
    let tagged = |tags: &str| {
        head(
            200,
            &[("cache-control", "max-age=60"), ("surrogate-key", tags)],
        )
    };
    store(&zone, "app|/a", &get(&[]), &tagged("red blue"), t0);
    store(&zone, "app|/b", &get(&[]), &tagged("blue"), t0);
    store(
        &zone,
        "img|/c",
        &get(&[]),
        &head(
            200,
            &[("cache-control", "max-age=60"), ("cache-tag", "green, red")],
        ),
        t0,
    );
    assert_eq!(zone.purge(&Selector::Tag("red".into())), 2);
    assert!(matches!(
        zone.lookup("app|/b", &get(&[]), t0),
        Found::Fresh { .. }
    ));
    assert_eq!(zone.purge(&Selector::Prefix("app|".into())), 1);
    assert_eq!(zone.usage().0, 0);
    store(&zone, "x", &get(&[]), &tagged("t"), t0);
    assert_eq!(zone.purge(&Selector::Key("x".into())), 1);
    assert_eq!(zone.purge(&Selector::Key("x".into())), 0);
}

#[test]
fn a_zone_stays_within_its_bytes_and_counts_evictions() {
    let t0 = SystemTime::now();
    let zone = Zones::default().zone("small", &memory(64 * 1024));
    let answer = head(200, &[("cache-control", "max-age=60")]);
    for n in 0..200 {
        let stored = Stored::new(&get(&[]), &answer, Bytes::from(vec![0u8; 4096]), t0).unwrap();
        zone.store(&format!("k{n}"), stored);
    }
    let (objects, bytes, evicted) = zone.usage();
    assert!(bytes <= 64 * 1024, "{bytes}");
    assert!(objects < 200 && evicted > 0, "{objects} {evicted}");
}

#[test]
fn a_zone_is_shared_while_named_and_takes_its_new_size() {
    let zones = Zones::default();
    let a = zones.zone("z", &memory(1 << 20));
    store(
        &a,
        "k",
        &get(&[]),
        &head(200, &[("cache-control", "max-age=60")]),
        SystemTime::now(),
    );
    let b = zones.zone("z", &memory(2 << 20));
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(b.capacity(), 1 << 20, "found again, it keeps its size ...");
    b.resize(&memory(2 << 20));
    assert_eq!(a.capacity(), 2 << 20, "... until a generation takes effect");
    assert_eq!(b.usage().0, 1, "contents survive");
    drop((a, b));
    assert_eq!(
        zones.zone("z", &memory(1 << 20)).usage().0,
        0,
        "named by no one: gone"
    );
}

#[tokio::test]
async fn concurrent_misses_wait_for_one_lead() {
    let zone = zone();
    let Turn::Lead(lead) = zone.turn("k") else {
        panic!("the first miss leads");
    };
    let waiters: Vec<_> = (0..100)
        .map(|_| match zone.turn("k") {
            Turn::Wait(landed) => tokio::spawn(wait(landed, Duration::from_secs(5))),
            other => panic!("{other:?}"),
        })
        .collect();
    store(
        &zone,
        "k",
        &get(&[]),
        &head(200, &[("cache-control", "max-age=60")]),
        SystemTime::now(),
    );
    drop(lead);
    for waiter in waiters {
        assert!(waiter.await.unwrap(), "told in time");
    }
    // Landed: the next miss leads again.
    assert!(matches!(zone.turn("k"), Turn::Lead(_)));
    // A lead that never lands: waiters go on after their patience.
    let Turn::Lead(_stuck) = zone.turn("j") else {
        panic!()
    };
    let Turn::Wait(landed) = zone.turn("j") else {
        panic!()
    };
    assert!(!wait(landed, Duration::from_millis(20)).await);
}

fn keep_with_default(
    zone: &Zone,
    request: &request::Parts,
    answer: &response::Parts,
    at: SystemTime,
    ttl: Duration,
) -> bool {
    match Keepable::new(request, answer, at, Some(ttl)) {
        Some(keepable) => {
            zone.store("k", keepable.with_body(Bytes::from_static(b"body")));
            true
        }
        None => false,
    }
}

#[test]
fn ttl_default_makes_silent_answers_fresh_without_showing_it() {
    // §4.2.2: in place of the heuristic, for an answer that states no
    // freshness and whose status is heuristically cacheable.
    let t0 = SystemTime::now();
    let zone = zone();
    let silent = head(200, &[("cache-control", "public")]);
    assert!(keep_with_default(
        &zone,
        &get(&[]),
        &silent,
        t0,
        Duration::from_secs(30)
    ));
    match zone.lookup("k", &get(&[]), t0 + Duration::from_secs(29)) {
        Found::Fresh { head, .. } => {
            let shown: Vec<_> = head.headers.get_all("cache-control").iter().collect();
            assert_eq!(shown, ["public"], "clients see the answer's own");
        }
        other => panic!("fresh by ttl_default expected: {other:?}"),
    }
    assert!(matches!(
        zone.lookup("k", &get(&[]), t0 + Duration::from_secs(31)),
        Found::Stale { .. } | Found::Miss
    ));
    // An answer that states its freshness keeps it.
    let zone = super::tests::zone();
    let stated = head(200, &[("cache-control", "max-age=5")]);
    assert!(keep_with_default(
        &zone,
        &get(&[]),
        &stated,
        t0,
        Duration::from_secs(300)
    ));
    assert!(!matches!(
        zone.lookup("k", &get(&[]), t0 + Duration::from_secs(6)),
        Found::Fresh { .. }
    ));
    // Not for a 302 or a 500, and never for a request with
    // `Authorization` (§3.5: a max-age does not allow it).
    for status in [302, 500, 503] {
        assert!(
            !keep_with_default(
                &zone,
                &get(&[]),
                &head(status, &[]),
                t0,
                Duration::from_secs(30)
            ),
            "{status}"
        );
    }
    assert!(!keep_with_default(
        &zone,
        &get(&[("authorization", "Bearer x")]),
        &head(200, &[]),
        t0,
        Duration::from_secs(30)
    ));
}

#[test]
fn stale_answers_within_the_longer_window_unless_the_answer_forbids() {
    // RFC 5861 (stale-while-revalidate, stale-if-error), RFC 9111 §4.2.4
    // (no stale where no-cache, must-revalidate, proxy-revalidate or
    // s-maxage forbids).
    let t0 = SystemTime::now();
    let stored = |cache_control: &str| {
        Stored::new(
            &get(&[]),
            &head(200, &[("cache-control", cache_control)]),
            Bytes::from_static(b"body"),
            t0,
        )
        .expect("storable")
    };
    let minute = Duration::from_secs(60);
    let at = |secs| t0 + Duration::from_secs(secs);
    let plain = stored("max-age=10");
    let swr = StaleUse::WhileRevalidate;
    let sie = StaleUse::IfError;
    // 30 s stale: within the route's minute, not past it.
    let head = plain
        .stale_head(&get(&[]), at(40), swr, minute)
        .expect("in window");
    assert_eq!(head.headers["age"], "40");
    assert!(plain.stale_head(&get(&[]), at(71), swr, minute).is_none());
    assert!(plain
        .stale_head(&get(&[]), at(40), sie, Duration::ZERO)
        .is_none());
    // Still fresh is not this method's business, but it answers too.
    assert!(plain.stale_head(&get(&[]), at(5), sie, minute).is_some());
    // The answer's own window, longer than the route's.
    let own = stored("max-age=10, stale-if-error=600");
    assert!(own.stale_head(&get(&[]), at(400), sie, minute).is_some());
    assert!(own.stale_head(&get(&[]), at(400), swr, minute).is_none());
    // Forbidden by the answer.
    for forbidding in [
        "max-age=10, must-revalidate",
        "max-age=10, proxy-revalidate",
        "no-cache, stale-if-error=600",
    ] {
        let s = stored(forbidding);
        assert!(
            s.stale_head(&get(&[]), at(20), sie, minute).is_none(),
            "{forbidding}"
        );
    }
    // s-maxage: the answer's own directive only.
    let shared = stored("s-maxage=10");
    assert!(shared.stale_head(&get(&[]), at(20), sie, minute).is_none());
    let shared_own = stored("s-maxage=10, stale-while-revalidate=30");
    assert!(shared_own
        .stale_head(&get(&[]), at(20), swr, minute)
        .is_some());
    // Forbidden by the request: a client that asks for no-cache.
    assert!(plain
        .stale_head(&get(&[("cache-control", "no-cache")]), at(20), sie, minute)
        .is_none());
}

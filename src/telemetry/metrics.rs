//! Metric names and label keys: every one the gateway exports, in one place.

/// Requests answered, by `route` and status `class` (1xx..5xx).
pub const REQUESTS: &str = "cutover_requests_total";
/// Requests answered, by `listener` and status `class`.
pub const LISTENER_REQUESTS: &str = "cutover_listener_requests_total";
/// Request duration from admission to response head, by `route`.
pub const REQUEST_DURATION: &str = "cutover_request_duration_seconds";
/// Upstream attempts by `backend` and `outcome` (ok, connect_error, timeout, error).
pub const UPSTREAM_ATTEMPTS: &str = "cutover_upstream_attempts_total";
/// Requests refused by admission (`max_inflight`), by `route`.
pub const ADMISSION_REJECTIONS: &str = "cutover_admission_rejections_total";
/// Activations by `kind` (activate, reload, rollback) and `outcome`.
pub const ACTIVATIONS: &str = "cutover_activations_total";
/// Time from plan to commit of an activation.
pub const ACTIVATION_DURATION: &str = "cutover_activation_duration_seconds";
/// The active generation id.
pub const ACTIVE_GENERATION: &str = "cutover_active_generation";
/// In-flight requests by `generation` (`active` or `superseded`; per-id
/// figures are in the status and history JSON, to keep cardinality bounded).
pub const GENERATION_INFLIGHT: &str = "cutover_generation_inflight_requests";
/// Open long-lived connections by `generation` (`active` or `superseded`).
pub const GENERATION_CONNECTIONS: &str = "cutover_generation_open_connections";
/// Generations still alive (active plus those with pinned work).
pub const LIVE_GENERATIONS: &str = "cutover_live_generations";
/// Downstream connections currently open, by `listener`.
pub const DOWNSTREAM_CONNECTIONS: &str = "cutover_downstream_connections";

/// Bytes proxied by TCP listeners, by `listener` and `direction`.
pub const TCP_BYTES: &str = "cutover_tcp_bytes_total";
/// `udp` listeners: datagrams and their bytes relayed, by `listener` and
/// `direction` (`downstream_to_upstream`, `upstream_to_downstream`).
pub const UDP_DATAGRAMS: &str = "cutover_udp_datagrams_total";
pub const UDP_BYTES: &str = "cutover_udp_bytes_total";
/// `udp` listeners: datagrams dropped, by `listener` and `reason`
/// (`max_sessions`: it would have opened a session past the cap;
/// `queue_full`: its session had 64 waiting for the backend).
pub const UDP_DROPPED: &str = "cutover_udp_datagrams_dropped_total";
/// `udp` listeners: open sessions, by `listener`.
pub const UDP_SESSIONS: &str = "cutover_udp_sessions";
/// `udp` listeners: how long sessions lived, by `listener` (the TCP
/// connection buckets).
pub const UDP_SESSION_DURATION: &str = "cutover_udp_session_duration_seconds";
/// How long `tcp` listeners' connections lived, set-up included, by
/// `listener`.
pub const TCP_CONNECTION_DURATION: &str = "cutover_tcp_connection_duration_seconds";
/// Its buckets: from a refused connection to a day-long session.
pub const TCP_CONNECTION_DURATION_BUCKETS: &[f64] = &[
    0.005, 0.05, 0.5, 5.0, 30.0, 300.0, 1800.0, 3600.0, 14400.0, 86400.0,
];
/// Resolutions of discovery sources, by `upstream` and `outcome` (`ok`,
/// `empty`, `nxdomain`, `error`, `timeout`, `invalid` for an endpoints
/// file that does not parse).
pub const DISCOVERY_RESOLUTIONS: &str = "cutover_discovery_resolutions_total";
/// Members an upstream takes from its sources, by `upstream`.
pub const DISCOVERY_MEMBERS: &str = "cutover_discovery_members";
/// Members left out by `max_members`, by `upstream`.
pub const DISCOVERY_LEFT_OUT: &str = "cutover_discovery_members_left_out";
/// Fleet mode: the fleet generation this instance serves (0: none yet).
pub const FLEET_GENERATION: &str = "cutover_fleet_generation";
/// Fleet mode: 1 while the session with etcd is up.
pub const FLEET_CONNECTED: &str = "cutover_fleet_connected";
/// Fleet mode: generations applied (`ack`) or refused (`nack`), by `outcome`.
pub const FLEET_APPLIES: &str = "cutover_fleet_applies_total";
/// The lifecycle phase: 0 starting, 1 running, 2 draining, 3 stopped.
pub const PHASE: &str = "cutover_phase";
/// Age in seconds of the oldest superseded generation that still has pinned work.
pub const OLDEST_PIN_AGE: &str = "cutover_oldest_pin_age_seconds";
/// TLS handshakes that failed or timed out, by `listener`.
pub const TLS_HANDSHAKE_FAILURES: &str = "cutover_tls_handshake_failures_total";
/// Client connections closed at accept because the listener was at
/// `max_connections`.
pub const CONNECTIONS_REFUSED: &str = "cutover_connections_refused_total";
/// PROXY protocol headers on listeners that take them, by `listener` and
/// `outcome`: accepted, untrusted (the peer is not in `trusted_proxies`),
/// invalid, timeout. Every outcome but accepted closes the connection.
pub const PROXY_HEADERS: &str = "cutover_proxy_protocol_headers_total";
/// Client connections accepted (not refused at `max_connections`), by
/// `listener`.
pub const CONNECTIONS_ACCEPTED: &str = "cutover_listener_connections_total";
/// Client connections accepted by each data-plane `worker` (all
/// listeners): how evenly the kernel spreads them.
pub const WORKER_CONNECTIONS: &str = "cutover_worker_connections_total";
/// Client connections of `listener` served by another worker than the
/// one that accepted them, to even out the workers' loads.
pub const CONNECTIONS_REBALANCED: &str = "cutover_connections_rebalanced_total";
/// TLS handshakes by `listener` and `outcome` (`ok`, `failed`, `timeout`).
pub const TLS_HANDSHAKES: &str = "cutover_tls_handshakes_total";
/// A certificate's `not_after` as Unix seconds, by `listener` and `name`.
pub const CERT_NOT_AFTER: &str = "cutover_certificate_not_after_seconds";
/// Seconds until the certificate served for `name` expires (files and
/// ACME; negative once expired).
pub const CERT_EXPIRY: &str = "cutover_certificate_expiry_seconds";
/// ACME orders by `outcome`: `issued`, `renewed`, `unreachable`,
/// `rejected`, `invalid`, `rate_limited`, `storage`.
pub const ACME_ORDERS: &str = "cutover_acme_orders_total";
/// Age of the OCSP response stapled for `name` (from its `thisUpdate`);
/// with `cutover_ocsp_stapled` 0, none is.
pub const OCSP_STAPLE_AGE: &str = "cutover_ocsp_staple_age_seconds";
/// 1 while a current OCSP response is stapled for `name`, 0 while its
/// certificate names a responder and none is.
pub const OCSP_STAPLED: &str = "cutover_ocsp_stapled";
/// OCSP fetches by `outcome` (`ok`, `failed`).
pub const OCSP_FETCHES: &str = "cutover_ocsp_fetches_total";
/// Certificate reloads by `outcome`.
pub const CERT_RELOADS: &str = "cutover_certificate_reloads_total";
/// Drain-aware restarts by `outcome`.
pub const UPGRADES: &str = "cutover_upgrades_total";
/// Active health check results, by backend and `outcome` (pass, fail).
pub const HEALTH_CHECKS: &str = "cutover_health_checks_total";
/// 1 while a backend passes its active checks (or has none), else 0.
pub const BACKEND_HEALTHY: &str = "cutover_backend_healthy";
/// Outlier ejections, by backend.
pub const EJECTIONS: &str = "cutover_backend_ejections_total";
/// Picks made with every backend of an upstream unhealthy or ejected
/// (traffic fails open to all of them), by upstream.
pub const FAIL_OPEN: &str = "cutover_upstream_fail_open_total";
/// Requests refused by a listener's `max_inflight`, by listener.
pub const LISTENER_ADMISSION_REJECTIONS: &str = "cutover_listener_admission_rejections_total";
/// Requests a route's quota answered 429, by route.
pub const QUOTA_REJECTIONS: &str = "cutover_quota_rejections_total";
/// Retries by upstream and `outcome` (`retried`, `budget_exhausted`).
pub const RETRIES: &str = "cutover_retries_total";
/// Hedged requests by upstream and `outcome`: `won` (an extra attempt
/// answered first) or `lost` (the first attempt did).
pub const HEDGES: &str = "cutover_hedges_total";

/// Requests in flight to a backend, by `backend`.
pub const BACKEND_INFLIGHT: &str = "cutover_backend_inflight_requests";
/// Time to connect to a backend, by `backend`.
pub const CONNECT_DURATION: &str = "cutover_backend_connect_duration_seconds";
/// Requests answered, by `generation` role (`active`, `previous`,
/// `pending`) and `id`.
pub const GENERATION_REQUESTS: &str = "cutover_generation_requests_total";
/// Requests answered 5xx, by `generation` role and `id`.
pub const GENERATION_ERRORS: &str = "cutover_generation_errors_total";
/// Admission to response head, by `generation` role and `id`.
pub const GENERATION_DURATION: &str = "cutover_generation_request_duration_seconds";
/// Series not exported because `metrics.max_series` was reached.
pub const SERIES_REFUSED: &str = "cutover_metrics_series_refused_total";

/// Spans not exported: the exporter was behind or the collector failed.
pub const TRACE_SPANS_DROPPED: &str = "cutover_trace_spans_dropped_total";
/// Copies of requests by `route`, `kind` (`mirror`: the route's mirror;
/// `shadow`: a shadow stage's, by the candidate's route) and `outcome`
/// (answered, failed, timeout, dropped, skipped). Kept with the route's
/// other series (`telemetry::series`).
pub const SHADOW_REQUESTS: &str = "cutover_shadow_requests_total";
/// Requests a route filter refused, by `route` and `reason`
/// (`forbidden`: allow/deny; `body_too_large`: `max_request_body`;
/// `rewrite`: a rewritten path the listener would not forward). Kept with
/// the route's other series (`telemetry::series`).
pub const FILTER_REFUSALS: &str = "cutover_filter_refusals_total";
/// Header values a template made invalid (a client's bytes a header may
/// not hold), dropped instead of sent, by `route`.
pub const FILTER_VALUES_DROPPED: &str = "cutover_filter_values_dropped_total";
/// Access-log lines dropped because the writer was behind or its file
/// could not be written.
pub const LOG_DROPPED: &str = "cutover_log_dropped_total";
/// Webhook delivery attempts, by `webhook` and `outcome` (`delivered`,
/// `retried`, `failed`).
pub const WEBHOOK_DELIVERIES: &str = "cutover_webhook_deliveries_total";
/// Change events a webhook never got: it fell behind the event ring.
pub const WEBHOOK_DROPPED: &str = "cutover_webhook_dropped_total";
/// gRPC calls answered, by `route` and `code` (the status's lower-case
/// name: a closed set of 17).
pub const GRPC_RESPONSES: &str = "cutover_grpc_responses_total";
/// Authentication checks, by `route`, `method` (`basic`, `jwt`,
/// `forward`) and `outcome` (`allowed`, `missing`, `invalid`,
/// `unavailable`, `refused`, `failed_open`).
pub const AUTH: &str = "cutover_auth_total";
/// Forward auth's cache (`cache = { … }`), by `route` and `result`:
/// `hit` (a kept answer decided), `stored` (the auth service was asked,
/// its answer kept) or `miss` (asked, not kept: a 5xx, no answer, or its
/// `Cache-Control` said not to).
pub const AUTH_CACHE: &str = "cutover_auth_cache_total";
/// `grpc-timeout` values that were not of the protocol's form (ignored).
/// What a route's cache did, by route and status (hit, miss,
/// revalidated, collapsed, stale, bypass).
pub const CACHE_REQUESTS: &str = "cutover_cache_requests_total";
/// A cache zone's bytes held, capacity, objects (keys), evictions,
/// objects stored and purged.
pub const CACHE_BYTES: &str = "cutover_cache_bytes";
pub const CACHE_CAPACITY: &str = "cutover_cache_capacity_bytes";
pub const CACHE_OBJECTS: &str = "cutover_cache_objects";
pub const CACHE_EVICTIONS: &str = "cutover_cache_evictions_total";
pub const CACHE_STORED: &str = "cutover_cache_stored_total";
pub const CACHE_PURGED: &str = "cutover_cache_purged_total";
/// A zone's files: bytes they take, and writes that failed.
pub const CACHE_DISK_BYTES: &str = "cutover_cache_disk_bytes";
pub const CACHE_DISK_ERRORS: &str = "cutover_cache_disk_errors_total";
/// Quota decisions, by route, `outcome` (`allowed`, `limited`,
/// `fallback_allowed`, `fallback_limited`, `failed_open`,
/// `failed_closed`) and `scope` (`local`, `fleet`).
pub const RATELIMIT_DECISIONS: &str = "cutover_ratelimit_decisions_total";
/// The web application firewall's decisions, by route and `outcome`
/// (`pass`, `blocked`, `would_block`, `body_too_large`).
pub const WAF_DECISIONS: &str = "cutover_waf_decisions_total";
/// Matches of each firewall rule, by `rule` (its id; at most 256 ids,
/// the rest as `other`).
pub const WAF_RULE_MATCHES: &str = "cutover_waf_rule_matches_total";
/// 1 while the rate-limit store answers, by `store` (its URL).
pub const RATELIMIT_STORE_UP: &str = "cutover_ratelimit_store_up";
/// Instances the rate-limit store counts (this one included).
pub const RATELIMIT_STORE_INSTANCES: &str = "cutover_ratelimit_store_instances";
/// Calls to the rate-limit store that failed or timed out.
pub const RATELIMIT_STORE_ERRORS: &str = "cutover_ratelimit_store_errors_total";
/// Changes between up and down of the rate-limit store.
pub const RATELIMIT_STORE_TRANSITIONS: &str = "cutover_ratelimit_store_transitions_total";
/// Time requests waited for a decision from the rate-limit store.
pub const RATELIMIT_STORE_WAIT: &str = "cutover_ratelimit_store_wait_seconds";
/// Requests whose fleet decision fell back to `on_store_error`, by cause.
pub const RATELIMIT_DEADLINE_MISSES: &str = "cutover_ratelimit_deadline_misses_total";
pub const GRPC_TIMEOUT_INVALID: &str = "cutover_grpc_timeout_invalid_total";

/// Bucket bounds (seconds) of `REQUEST_DURATION`: sub-millisecond answers
/// up to the longest upstream timeouts.
pub const REQUEST_DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// Bucket bounds (seconds) of `CONNECT_DURATION`.
pub const CONNECT_DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Bucket bounds (seconds) of `ACTIVATION_DURATION`.
pub const ACTIVATION_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

pub const LABEL_ROUTE: &str = "route";
pub const LABEL_LISTENER: &str = "listener";
pub const LABEL_WORKER: &str = "worker";
pub const LABEL_CLASS: &str = "class";
pub const LABEL_BACKEND: &str = "backend";
pub const LABEL_OUTCOME: &str = "outcome";
pub const LABEL_RULE: &str = "rule";
pub const LABEL_KIND: &str = "kind";
pub const LABEL_GENERATION: &str = "generation";
pub const LABEL_DIRECTION: &str = "direction";
pub const LABEL_REASON: &str = "reason";
pub const LABEL_NAME: &str = "name";
pub const LABEL_UPSTREAM: &str = "upstream";
pub const LABEL_CODE: &str = "code";
pub const LABEL_METHOD: &str = "method";
pub const LABEL_RESULT: &str = "result";
pub const LABEL_STATUS: &str = "status";
pub const LABEL_ZONE: &str = "zone";
pub const LABEL_STORE: &str = "store";
pub const LABEL_CAUSE: &str = "cause";
pub const LABEL_SCOPE: &str = "scope";

/// Status classes in label order; index with `status / 100 - 1`.
pub const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Registers descriptions so `/metrics` explains each family.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        LISTENER_REQUESTS,
        "Requests answered, by listener and status class"
    );
    describe_counter!(ACTIVATIONS, "Configuration activations by kind and outcome");
    describe_counter!(
        GRPC_TIMEOUT_INVALID,
        "grpc-timeout values not of the protocol's form, ignored"
    );
    describe_histogram!(
        ACTIVATION_DURATION,
        Unit::Seconds,
        "Time from plan to commit of an activation"
    );
    describe_gauge!(ACTIVE_GENERATION, "The active generation id");
    describe_gauge!(
        CERT_EXPIRY,
        Unit::Seconds,
        "Seconds until the certificate served for a name expires"
    );
    describe_counter!(ACME_ORDERS, "ACME orders by outcome");
    describe_gauge!(
        OCSP_STAPLE_AGE,
        Unit::Seconds,
        "Age of the OCSP response stapled for a name"
    );
    describe_gauge!(
        OCSP_STAPLED,
        "1 while a current OCSP response is stapled for a name"
    );
    describe_counter!(OCSP_FETCHES, "OCSP responder requests by outcome");
    describe_gauge!(
        GENERATION_INFLIGHT,
        "In-flight requests pinned to a generation"
    );
    describe_gauge!(
        GENERATION_CONNECTIONS,
        "Open long-lived connections pinned to a generation"
    );
    describe_gauge!(
        LIVE_GENERATIONS,
        "Generations alive: the active one and those with pinned work"
    );
    describe_counter!(
        CONNECTIONS_ACCEPTED,
        "Client connections accepted, by listener"
    );
    describe_counter!(
        WORKER_CONNECTIONS,
        "Client connections served, by data-plane worker"
    );
    describe_counter!(
        CONNECTIONS_REBALANCED,
        "Client connections handed to a less loaded worker than the one that accepted them, by listener"
    );
    describe_histogram!(
        TCP_CONNECTION_DURATION,
        Unit::Seconds,
        "How long tcp listeners' connections lived, by listener"
    );
    describe_counter!(
        UDP_DATAGRAMS,
        "Datagrams relayed by udp listeners, by listener and direction"
    );
    describe_counter!(
        UDP_BYTES,
        Unit::Bytes,
        "Bytes relayed by udp listeners, by listener and direction"
    );
    describe_counter!(
        UDP_DROPPED,
        "Datagrams udp listeners dropped, by listener and reason"
    );
    describe_gauge!(UDP_SESSIONS, "Open udp sessions, by listener");
    describe_histogram!(
        UDP_SESSION_DURATION,
        Unit::Seconds,
        "How long udp sessions lived, by listener"
    );
    describe_counter!(
        PROXY_HEADERS,
        "PROXY protocol headers on listeners that take them, by listener and outcome"
    );
    describe_counter!(
        TLS_HANDSHAKES,
        "TLS handshakes by listener and outcome (ok, failed, timeout)"
    );
    describe_counter!(
        SERIES_REFUSED,
        "Series not exported because metrics.max_series was reached"
    );
    describe_counter!(
        TRACE_SPANS_DROPPED,
        "Spans not exported: the exporter was behind or the collector failed"
    );
    describe_counter!(
        WEBHOOK_DELIVERIES,
        "Webhook delivery attempts by webhook and outcome (delivered, retried, failed)"
    );
    describe_counter!(
        WEBHOOK_DROPPED,
        "Change events a webhook never got: it fell behind the event ring"
    );
    describe_counter!(
        LOG_DROPPED,
        "Access-log lines dropped: the writer was behind, or its file failed"
    );
    describe_gauge!(
        DOWNSTREAM_CONNECTIONS,
        "Open downstream connections by listener"
    );
}

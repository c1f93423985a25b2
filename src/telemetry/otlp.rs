//! One span per sampled request, exported over OTLP/HTTP (JSON encoding)
//! to `[tracing] otlp_endpoint` + `/v1/traces`.
//!
//! A request's span is built from its access-log line (the same fields,
//! plus the span ids) by the access writer thread, never on a serving
//! thread, and handed to an exporter thread of its own that posts batches
//! of up to 512 spans at least once a second. A collector that is slow
//! or down costs dropped spans (counted in
//! `cutover_trace_spans_dropped_total`), never a waiting request.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use super::access::Line;
use super::TracingSpec;

/// Spans waiting for the exporter before new ones are dropped.
const QUEUE: usize = 8 * 1024;
/// Spans per request to the collector.
const BATCH: usize = 512;
/// The longest a span waits for its batch.
const FLUSH: Duration = Duration::from_secs(1);
/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

struct Exporter {
    spans: SyncSender<Value>,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

/// Starts the exporter when `spec` names a collector (once per process).
pub fn init(spec: &TracingSpec) -> std::io::Result<()> {
    super::trace::set_sample_ratio(spec.sample_ratio);
    let Some(endpoint) = spec.otlp_endpoint.clone() else {
        return Ok(());
    };
    if EXPORTER.get().is_some() {
        return Ok(());
    }
    let url = traces_url(&endpoint);
    let (spans, queue) = mpsc::sync_channel(QUEUE);
    let service = spec.service_name.clone();
    std::thread::Builder::new()
        .name("cutover-otlp".into())
        .spawn(move || export(queue, url, service))?;
    let _ = EXPORTER.set(Exporter { spans });
    // Spans travel as access lines: their queue is needed now, and
    // the sampled ones come here.
    super::access::export_sampled(submit);
    super::access::start();
    super::trace::exporting();
    Ok(())
}

/// `{endpoint}/v1/traces`, as OTLP/HTTP names it.
fn traces_url(endpoint: &http::Uri) -> String {
    format!("{}/v1/traces", endpoint.to_string().trim_end_matches('/'))
}

/// Queues the span of a finished request; drops and counts it when the
/// exporter is behind.
pub fn submit(line: &Line) {
    let Some(exporter) = EXPORTER.get() else {
        return;
    };
    let Some(span) = span(line) else { return };
    if exporter.spans.try_send(span).is_err() {
        dropped(1);
    }
}

fn dropped(spans: u64) {
    metrics::counter!(super::metrics::TRACE_SPANS_DROPPED).increment(spans);
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    super::trace::push_hex(&mut text, bytes);
    text
}

fn nanos(at: SystemTime) -> String {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
        .to_string()
}

fn text(key: &str, value: &str) -> Value {
    json!({ "key": key, "value": { "stringValue": value } })
}

fn int(key: &str, value: u64) -> Value {
    // OTLP/JSON carries 64-bit integers as strings.
    json!({ "key": key, "value": { "intValue": value.to_string() } })
}

/// The OTLP/JSON span of a request's line (`None` for TCP lines, which
/// carry no trace).
pub fn span(line: &Line) -> Option<Value> {
    let (trace_id, span_id) = (line.trace_id?, line.span_id?);
    let start = line.ended.checked_sub(line.duration).unwrap_or(line.ended);
    let method = line.method.as_ref().map_or("-", http::Method::as_str);
    let name = match &line.route {
        Some(route) => format!("{method} {route}"),
        None => method.to_owned(),
    };
    let mut attributes = vec![
        text("http.request.method", method),
        int("http.response.status_code", u64::from(line.status)),
        text("network.protocol.name", "http"),
        text("client.address", &line.client.ip().to_string()),
        int("client.port", u64::from(line.client.port())),
        text("cutover.listener", &line.listener),
        int("cutover.generation", line.generation),
        int("cutover.attempts", u64::from(line.attempts)),
        int("http.request.body.size", line.bytes_in),
        int("http.response.body.size", line.bytes_out),
    ];
    if let Some(path) = &line.path {
        attributes.push(text("url.path", path));
    }
    if let Some(authority) = &line.authority {
        attributes.push(text("server.address", authority));
    }
    if let Some(id) = &line.request_id {
        attributes.push(text("http.request.header.x-request-id", id));
    }
    if let Some(route) = &line.route {
        attributes.push(text("http.route", route));
    }
    if let Some(backend) = &line.backend {
        attributes.push(text("cutover.backend", backend));
    }
    if let Some(code) = line.grpc_status {
        attributes.push(int("rpc.grpc.status_code", u64::from(code)));
    }
    if !line.flags.is_empty() {
        let flags: Vec<&str> = line.flags.names().collect();
        attributes.push(text("cutover.flags", &flags.join(",")));
    }
    let mut span = json!({
        "traceId": hex(&trace_id),
        "spanId": hex(&span_id),
        "name": name,
        // SPAN_KIND_SERVER
        "kind": 2,
        "startTimeUnixNano": nanos(start),
        "endTimeUnixNano": nanos(line.ended),
        "attributes": attributes,
        // STATUS_CODE_ERROR for answers the server failed; unset otherwise.
        "status": { "code": if line.status >= 500 { 2 } else { 0 } },
    });
    if let Some(parent) = line.parent_span_id {
        span["parentSpanId"] = json!(hex(&parent));
    }
    Some(span)
}

/// The body of one export: the spans under the service's resource.
pub fn request_body(service: &str, spans: Vec<Value>) -> Value {
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [text("service.name", service)] },
            "scopeSpans": [{
                "scope": { "name": "cutover", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    })
}

/// The exporter thread: batches spans and posts them, one batch at a
/// time, on a runtime of its own.
fn export(queue: Receiver<Value>, url: String, service: String) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "otlp: no runtime; spans are not exported");
            return;
        }
    };
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, http_body_util::Full<bytes::Bytes>>(https);
    let mut failed_at: Option<Instant> = None;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let deadline = Instant::now() + FLUSH;
        let mut closed = false;
        while batch.len() < BATCH {
            match queue.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(span) => batch.push(span),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let spans = std::mem::take(&mut batch);
            let count = spans.len() as u64;
            let body = request_body(&service, spans).to_string();
            let sent = runtime.block_on(async {
                let request = http::Request::post(url.as_str())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    .map_err(|e| e.to_string())?;
                match tokio::time::timeout(EXPORT_TIMEOUT, client.request(request)).await {
                    Ok(Ok(response)) if response.status().is_success() => Ok(()),
                    Ok(Ok(response)) => Err(format!("collector answered {}", response.status())),
                    Ok(Err(error)) => Err(error.to_string()),
                    Err(_) => Err("no answer within 10 s".to_owned()),
                }
            });
            if let Err(error) = sent {
                dropped(count);
                // Once a minute at most: a collector that is down must not
                // flood the log.
                if failed_at.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!(%url, %error, spans = count, "otlp: export failed; spans dropped");
                    failed_at = Some(Instant::now());
                }
            }
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::access::Flags;

    #[test]
    fn a_line_becomes_a_server_span_with_its_parent() {
        let line = Line {
            ended: SystemTime::UNIX_EPOCH + Duration::from_secs(10),
            duration: Duration::from_millis(2),
            protocol: "HTTP/1.1",
            listener: "web".into(),
            generation: 7,
            client: "10.0.0.1:5555".parse().unwrap(),
            method: Some(http::Method::POST),
            authority: Some("api.example.com".into()),
            path: Some("/v1/orders".into()),
            upstream_path: None,
            request_id: None,
            auth: None,
            subject: None,
            cache: None,
            limited: None,
            waf: None,
            route: Some("api".into()),
            status: 503,
            grpc_status: None,
            bytes_in: 3,
            bytes_out: 4,
            encoding: None,
            bytes_uncompressed: 0,
            upstream_time: None,
            upstream_protocol: None,
            backend: Some("10.0.1.4:9001".into()),
            attempts: 2,
            trace_id: Some([0xab; 16]),
            span_id: Some([0x01; 8]),
            parent_span_id: Some([0x02; 8]),
            sampled: true,
            logged: false,
            flags: Flags::CONNECT_FAILURE | Flags::RETRIED,
        };
        let span = span(&line).unwrap();
        assert_eq!(span["traceId"], "abababababababababababababababab");
        assert_eq!(span["spanId"], "0101010101010101");
        assert_eq!(span["parentSpanId"], "0202020202020202");
        assert_eq!(span["name"], "POST api");
        assert_eq!(span["kind"], 2);
        assert_eq!(span["startTimeUnixNano"], "9998000000");
        assert_eq!(span["endTimeUnixNano"], "10000000000");
        assert_eq!(span["status"]["code"], 2);
        let attributes = span["attributes"].as_array().unwrap();
        let find =
            |key: &str| attributes.iter().find(|a| a["key"] == key).unwrap()["value"].clone();
        assert_eq!(
            find("http.response.status_code"),
            json!({ "intValue": "503" })
        );
        assert_eq!(
            find("cutover.flags"),
            json!({ "stringValue": "connect_failure,retried" })
        );
        assert_eq!(find("http.route"), json!({ "stringValue": "api" }));
        let body = request_body("edge", vec![span]);
        assert_eq!(
            body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "edge"
        );
        assert_eq!(
            traces_url(&"http://collector:4318/".parse().unwrap()),
            "http://collector:4318/v1/traces"
        );
    }
}

//! The OWASP CRS regression corpus through the real binary (issue 73):
//! every case's request written to a gateway's listener as go-ftw
//! writes it, on a route running CRS at paranoia 4 in detection mode
//! with CRS's test set-up, and the rule ids the access log's `waf` field
//! names for it (found by the `X-Request-Id` each request is given)
//! judged against the case's `expect_ids` and `no_expect_ids`. A case
//! whose rules read the answer asks `/reflect` for one (as go-ftw asks
//! its albedo backend): a backend here answers with the status, headers
//! and body the request's JSON names, through the gateway, whose rules
//! read it in the answer's phases. A request the HTTP server refuses
//! before the rules does not pass: every case that does not pass is
//! listed with its reason in `fixtures/waf/crs-corpus-binary.txt`, and
//! the test fails when a case passes or fails otherwise than the list
//! says.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::workspace;
use crate::harness::{full, Backend, BackendBody, Gateway};

/// go-ftw's albedo `/reflect`: the answer the request's JSON body names
/// (`status`, `headers`, `body` or base64 `encodedBody`; `text/plain`
/// when it names no type).
async fn reflect(req: hyper::Request<hyper::body::Incoming>) -> hyper::Response<BackendBody> {
    use http_body_util::BodyExt as _;
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let spec: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let content = match spec["encodedBody"].as_str() {
        Some(encoded) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap_or_default()
        }
        None => spec["body"]
            .as_str()
            .unwrap_or_default()
            .as_bytes()
            .to_vec(),
    };
    let mut answer = hyper::Response::new(full(content));
    *answer.status_mut() = spec["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| hyper::StatusCode::from_u16(s).ok())
        .unwrap_or(hyper::StatusCode::OK);
    if let Some(headers) = spec["headers"].as_object() {
        for (name, value) in headers {
            if let (Ok(name), Ok(value)) = (
                hyper::header::HeaderName::from_bytes(name.as_bytes()),
                hyper::header::HeaderValue::from_str(value.as_str().unwrap_or_default()),
            ) {
                answer.headers_mut().append(name, value);
            }
        }
    }
    if !answer.headers().contains_key(hyper::header::CONTENT_TYPE) {
        answer.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain"),
        );
    }
    answer
}

#[allow(dead_code)]
#[path = "../../src/waf/corpus_cases.rs"]
mod cases;

use cases::{Input, Outcome};

/// Writes `bytes` on a new connection and reads the answer's head and
/// body (by its length); its status, 0 when none came within 5 s (a
/// request whose body never ends as declared, say). The connection is
/// not half-closed: the server would take that as the client gone.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> u16 {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let _ = stream.write_all(bytes).await;
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if answer.len() >= end + 4 + length {
                    break;
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    std::str::from_utf8(answer.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The request with `X-Request-Id: id` after its request line.
fn tagged(input: &Input, id: &str) -> Vec<u8> {
    let wire = input.wire();
    let line_end = wire
        .iter()
        .position(|b| *b == b'\n')
        .map_or(wire.len(), |at| at + 1);
    let mut out = wire[..line_end].to_vec();
    out.extend_from_slice(format!("X-Request-Id: {id}\r\n").as_bytes());
    out.extend_from_slice(&wire[line_end..]);
    out
}

/// Why a stage that did not pass did not, in words for the list.
fn reason(status: u16, logged: bool, outcome: &Outcome) -> String {
    match outcome {
        _ if !logged => format!("the HTTP server answered {status} before the rules"),
        Outcome::Failed(why) => why.clone(),
        Outcome::Unreadable(why) => why.clone(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crs_regression_corpus_through_the_binary() {
    let root = cases::crs_root();
    let Ok(root) = std::fs::canonicalize(&root) else {
        eprintln!("skipped: the Core Rule Set is not at ../shared/crs");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("test-setup.conf"), cases::TEST_SETUP).unwrap();
    let albedo = Backend::start(std::sync::Arc::new(|req| Box::pin(reflect(req)))).await;
    let config = format!(
        r#"[admin]
bind = "127.0.0.1:0"

[log]
format = "json"
access = true
access_file = "access.log"

[runtime]
file_roots = ["{root}"]

[waf.rulesets.crs]
files = ["{root}/crs-setup.conf.example", "test-setup.conf", "{root}/rules"]
paranoia = 4
request_body_limit = "1MiB"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "reflect"
listeners = ["web"]
path_prefix = "/reflect"
upstream = "albedo"
request_id = true
waf = {{ ruleset = "crs", mode = "detect" }}

[[routes]]
name = "corpus"
listeners = ["web"]
respond = {{ body = "ok" }}
request_id = true
waf = {{ ruleset = "crs", mode = "detect" }}

[upstreams.albedo]
backends = [{{ addr = "{albedo}" }}]
"#,
        root = root.display(),
        albedo = albedo.addr,
    );
    let access = dir.path().join("access.log");
    let gw = Gateway::start_in(dir, &config);
    let web = gw.listener("web");

    let stages = cases::stages();
    assert!(stages.len() > 4900, "{} stages", stages.len());
    let started = Instant::now();
    // Four connections at a time.
    let mut statuses = vec![0u16; stages.len()];
    let mut sent: Vec<Option<String>> = vec![None; stages.len()];
    let mut pending = tokio::task::JoinSet::new();
    for (i, stage) in stages.iter().enumerate() {
        let Ok(input) = &stage.input else { continue };
        if stage.status_only() {
            continue;
        }
        let id = format!("case-{i}");
        let bytes = tagged(input, &id);
        sent[i] = Some(id);
        if pending.len() >= 4 {
            if let Some(Ok((j, status))) = pending.join_next().await {
                statuses[j] = status;
            }
        }
        pending.spawn(async move { (i, exchange(web, &bytes).await) });
    }
    while let Some(Ok((j, status))) = pending.join_next().await {
        statuses[j] = status;
    }
    // The access log is written by a thread of its own: wait for it.
    let mut matched: HashMap<String, Vec<u32>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let answered = statuses.iter().filter(|s| **s != 0 && **s != 400).count();
    loop {
        matched.clear();
        for line in std::fs::read_to_string(&access).unwrap_or_default().lines() {
            let Ok(line) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let (Some(id), Some(waf)) = (line["request_id"].as_str(), line["waf"].as_str()) else {
                continue;
            };
            let rules = waf
                .rsplit("rules=")
                .next()
                .unwrap_or_default()
                .split(',')
                .filter_map(|r| r.parse().ok())
                .collect();
            matched.insert(id.to_owned(), rules);
        }
        if matched.len() >= answered || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut passed = 0;
    let mut judged = 0;
    let mut failed: Vec<String> = Vec::new();
    for (i, stage) in stages.iter().enumerate() {
        let outcome = match (&stage.input, &sent[i]) {
            (Err(why), _) if !stage.status_only() => Outcome::Unreadable(why.clone()),
            (_, None) => continue,
            (Ok(_), Some(id)) => {
                cases::judge(stage, matched.get(id).map_or(&[][..], Vec::as_slice))
            }
            (Err(_), Some(_)) => continue,
        };
        judged += 1;
        if outcome == Outcome::Passed {
            passed += 1;
            continue;
        }
        let logged = sent[i].as_ref().is_some_and(|id| matched.contains_key(id));
        failed.push(format!(
            "failed {} {}",
            stage.name,
            reason(statuses[i], logged, &outcome)
        ));
    }
    eprintln!(
        "CRS corpus through the binary: {passed} of {judged} judged cases pass ({:.2} %) in {:?}",
        100.0 * passed as f64 / judged.max(1) as f64,
        started.elapsed()
    );
    if let Ok(out) = std::env::var("CUTOVER_WAF_CORPUS_REPORT") {
        let _ = std::fs::write(out, failed.join("\n") + "\n");
    }
    let listed = std::fs::read_to_string(workspace().join("fixtures/waf/crs-corpus-binary.txt"))
        .unwrap_or_default();
    let listed: Vec<&str> = listed
        .lines()
        .filter(|l| l.starts_with("failed "))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let names: Vec<&str> = failed
        .iter()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let new: Vec<&String> = failed
        .iter()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|n| !listed.contains(&n))
        })
        .collect();
    let fixed: Vec<&&str> = listed.iter().filter(|n| !names.contains(n)).collect();
    assert!(
        new.is_empty() && fixed.is_empty(),
        "cases that differ from fixtures/waf/crs-corpus-binary.txt: new failures {new:#?}, \
         listed but passing {fixed:?}"
    );
    assert!(
        passed as f64 >= 0.97 * judged as f64,
        "{passed} of {judged}: under 97 %"
    );
}

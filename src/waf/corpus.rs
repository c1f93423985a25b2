//! The OWASP CRS regression corpus (`../shared/crs/tests/regression`),
//! run in process against the engine as CRS's own CI runs it: the Core
//! Rule Set at paranoia level 4 in detection-only mode, each case's
//! request through phases 1 and 2 (and, for `/reflect`, the answer the
//! case describes through phases 3 and 4), the matched rule ids compared
//! with `expect_ids` and `no_expect_ids`. A case that only names a status
//! is an HTTP server's answer, judged against the real binary, not here.

use std::path::PathBuf;

use super::corpus_cases::{
    crs_root, judge, stages, stages_of_case, Input, Outcome, Stage, TEST_SETUP,
};
use super::{Mode, Request, Response, RuleSet, Transaction};

/// A case's name (`942100-3`) and outcome.
pub struct Case {
    pub name: String,
    pub outcome: Outcome,
}

/// The Core Rule Set with CRS's test set-up, or `None` when it is not
/// beside the project.
pub fn rule_set() -> Option<RuleSet> {
    let root = crs_root();
    let setup = std::env::temp_dir().join(format!(
        "cutover-crs-test-setup-{}.conf",
        std::process::id()
    ));
    std::fs::write(&setup, TEST_SETUP).ok()?;
    let mut files = vec![root.join("crs-setup.conf.example"), setup.clone()];
    files.extend(super::conf_files(&root.join("rules")).ok()?);
    let set = RuleSet::load(&files);
    let _ = std::fs::remove_file(&setup);
    set.ok()
}

/// Every case of the corpus, run.
pub fn run(set: &RuleSet) -> Vec<Case> {
    stages()
        .iter()
        .map(|stage| Case {
            name: stage.name.clone(),
            outcome: run_stage(set, stage),
        })
        .collect()
}

fn run_stage(set: &RuleSet, stage: &Stage) -> Outcome {
    let input = match &stage.input {
        Ok(input) => input,
        Err(why) if !stage.status_only() || why == "not YAML" => {
            return Outcome::Unreadable(why.clone())
        }
        Err(_) => return Outcome::StatusOnly,
    };
    if stage.status_only() {
        return Outcome::StatusOnly;
    }
    let request = match request_of(input) {
        Ok(request) => request,
        Err(why) => return Outcome::Unreadable(why),
    };
    let mut transaction = Transaction::new(set, &request, Mode::Detect);
    transaction.request();
    let response = reflected(&request);
    if let Some(response) = &response {
        transaction.response(response);
    }
    transaction.logging();
    let matched: Vec<u32> = transaction.matches.iter().map(|m| m.id).collect();
    judge(stage, &matched)
}

/// The request a case's input describes, as the HTTP server in front
/// hands it to the rules.
fn request_of(input: &Input) -> Result<Request, String> {
    let (method, uri, version, mut headers, data) = match input {
        Input::Raw(raw) => return raw_request(raw),
        Input::Parts {
            method,
            uri,
            version,
            headers,
            data,
        } => (method, uri, version, headers.clone(), data.clone()),
    };
    let body = dechunked(&mut headers, data);
    // Without a length or chunked framing an HTTP/1.1 request has no body
    // (RFC 9112 §6.3): the server reads none.
    let framed = headers.iter().any(|(n, _)| {
        n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding")
    });
    Ok(Request {
        id: "corpus".into(),
        remote_addr: "127.0.0.1".into(),
        method: method.clone(),
        uri: uri.clone(),
        protocol: version.clone(),
        headers,
        body: if framed { body } else { Vec::new() },
    })
}

/// A chunked body as the HTTP server in front hands it on: decoded,
/// without `Content-Length` (RFC 9112 §6.3: `Transfer-Encoding` wins).
fn dechunked(headers: &mut Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Vec<u8> {
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().ends_with(b"chunked")
    });
    if !chunked {
        return body;
    }
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case("content-length"));
    let mut out = Vec::new();
    let mut rest = &body[..];
    while let Some(end) = memchr::memmem::find(rest, b"\r\n") {
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size.filter(|s| *s > 0) else {
            break;
        };
        let start = end + 2;
        let Some(chunk) = rest.get(start..start + size) else {
            break;
        };
        out.extend_from_slice(chunk);
        rest = rest.get(start + size + 2..).unwrap_or_default();
    }
    out
}

/// A request written out in bytes: its line, headers and body.
fn raw_request(raw: &[u8]) -> Result<Request, String> {
    let head_end = memchr::memmem::find(raw, b"\r\n\r\n")
        .map(|at| (at, at + 4))
        .or_else(|| memchr::memmem::find(raw, b"\n\n").map(|at| (at, at + 2)))
        .unwrap_or((raw.len(), raw.len()));
    let head = String::from_utf8_lossy(&raw[..head_end.0]).into_owned();
    let mut lines = head.lines();
    let line = lines.next().ok_or("an empty request")?;
    let mut parts = line.splitn(3, ' ');
    let method = parts.next().unwrap_or_default().to_owned();
    let uri = parts.next().unwrap_or("/").to_owned();
    let protocol = parts.next().unwrap_or("HTTP/0.9").to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().as_bytes().to_vec()))
        .collect();
    let mut headers = headers;
    let body = dechunked(&mut headers, raw[head_end.1..].to_vec());
    Ok(Request {
        id: "corpus".into(),
        remote_addr: "127.0.0.1".into(),
        method,
        uri,
        protocol,
        headers,
        body,
    })
}

/// The answer the test backend (albedo) gives `/reflect`: the status,
/// headers and body the request's JSON names.
fn reflected(request: &Request) -> Option<Response> {
    if !request.uri.starts_with("/reflect") {
        return None;
    }
    let spec: serde_json::Value = serde_json::from_slice(&request.body).ok()?;
    let mut headers: Vec<(String, Vec<u8>)> = spec["headers"]
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(n, v)| {
                    (
                        n.clone(),
                        v.as_str().unwrap_or_default().as_bytes().to_vec(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    if !headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
    {
        headers.push(("Content-Type".into(), b"text/plain".to_vec()));
    }
    let body = match spec["encodedBody"].as_str() {
        Some(encoded) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()?
        }
        None => spec["body"]
            .as_str()
            .unwrap_or_default()
            .as_bytes()
            .to_vec(),
    };
    Some(Response {
        status: spec["status"]
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
            .unwrap_or(200),
        headers,
        body,
    })
}

/// Prints what one case (`942100-3`) matched and the paranoia and
/// score variables it left, for finding why a case fails.
pub fn explain(set: &RuleSet, case: &str) {
    for stage in stages_of_case(case) {
        let Some(Ok(request)) = stage.input.as_ref().ok().map(request_of) else {
            continue;
        };
        eprintln!(
            "{} {} body {:?}",
            request.method,
            request.uri,
            String::from_utf8_lossy(&request.body)
        );
        let mut transaction = Transaction::new(set, &request, Mode::Detect);
        transaction.request();
        for m in &transaction.matches {
            eprintln!("matched {} ({}): {}", m.id, m.msg, m.logdata);
        }
        for name in [
            "detection_paranoia_level",
            "blocking_paranoia_level",
            "inbound_anomaly_score_pl1",
            "inbound_anomaly_score_pl2",
        ] {
            eprintln!(
                "tx.{name} = {:?}",
                transaction.tx(name).map(String::from_utf8_lossy)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crs_regression_corpus() {
        let Some(set) = rule_set() else {
            eprintln!("skipped: ../shared/crs is not beside the project");
            return;
        };
        if let Ok(only) = std::env::var("CUTOVER_WAF_CASE") {
            explain(&set, &only);
            return;
        }
        let started = std::time::Instant::now();
        let cases = run(&set);
        let count = |f: fn(&Outcome) -> bool| cases.iter().filter(|c| f(&c.outcome)).count();
        let passed = count(|o| *o == Outcome::Passed);
        let judged = passed + count(|o| matches!(o, Outcome::Failed(_) | Outcome::Unreadable(_)));
        eprintln!(
            "CRS corpus: {} cases in {:?}: {passed} of {judged} judged pass ({:.2} %), {} status-only",
            cases.len(),
            started.elapsed(),
            100.0 * passed as f64 / judged.max(1) as f64,
            count(|o| *o == Outcome::StatusOnly),
        );
        if let Ok(out) = std::env::var("CUTOVER_WAF_CORPUS_REPORT") {
            let lines: Vec<String> = cases
                .iter()
                .filter(|c| !matches!(c.outcome, Outcome::Passed))
                .map(|c| format!("{} {:?}", c.name, c.outcome))
                .collect();
            let _ = std::fs::write(out, lines.join("\n") + "\n");
        }
        assert!(cases.len() > 4900, "{} cases", cases.len());
        // Held to the list of what does not pass, with its reasons.
        let listed = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/waf/crs-corpus.txt"),
        )
        .unwrap();
        let entries: Vec<(&str, &str)> = listed
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                Some((words.next()?, words.next()?))
            })
            .collect();
        let listed_as = |kind: &str, name: &str| entries.contains(&(kind, name));
        let mut wrong = Vec::new();
        for case in &cases {
            let fine = match &case.outcome {
                Outcome::Passed => !listed_as("failed", &case.name),
                Outcome::Failed(_) | Outcome::Unreadable(_) => listed_as("failed", &case.name),
                Outcome::StatusOnly => listed_as("status", &case.name),
            };
            if !fine {
                wrong.push(format!("{} {:?}", case.name, case.outcome));
            }
        }
        assert!(
            wrong.is_empty(),
            "cases that differ from fixtures/waf/crs-corpus.txt (a new failure, or a listed one \
             that now passes):\n{}",
            wrong.join("\n")
        );
    }
}

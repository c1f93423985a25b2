//! Reading a candidate out of an admin request: raw TOML, JSON with
//! `config`, JSON with `config_path`, or an empty body.

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use serde::Deserialize;

use super::error::ApiError;
use crate::control::{CanarySpec, Candidate, CandidateSource, FreezeRule, GuardSpec, ShadowSpec};
use crate::ids::GenerationId;

/// Metadata sent in the query string (with raw TOML or an empty body).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateQuery {
    pub expected_generation: Option<u64>,
    pub reason: Option<String>,
    pub requested_by: Option<String>,
    pub confirm_within: Option<String>,
    /// Go through a freeze window (`override` scope, with a reason).
    pub override_freeze: Option<bool>,
}

/// `confirm_within` ("120s", "2m"): at least 1 s, at most a day.
fn confirm_within(text: Option<&str>) -> Result<Option<std::time::Duration>, ApiError> {
    let Some(text) = text else { return Ok(None) };
    match humantime::parse_duration(text) {
        Ok(within)
            if within >= std::time::Duration::from_secs(1)
                && within <= std::time::Duration::from_secs(86_400) =>
        {
            Ok(Some(within))
        }
        _ => Err(ApiError::BadRequest(format!(
            "confirm_within '{text}' is not a duration between 1s and 24h"
        ))),
    }
}

/// The JSON candidate form.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CandidateJson {
    config: Option<String>,
    config_path: Option<String>,
    expected_generation: Option<u64>,
    reason: Option<String>,
    requested_by: Option<String>,
    /// Upgrade only: the executable to start.
    binary: Option<String>,
    override_freeze: Option<bool>,
    confirm_within: Option<String>,
    guard: Option<GuardJson>,
    confirm_on_pass: Option<bool>,
    steps: Option<Vec<u8>>,
    step_interval: Option<String>,
    hash_key: Option<String>,
    shadow: Option<ShadowJson>,
}

/// Checked canary steps: strictly growing percentages ending at 100, an
/// interval of 1 s to 24 h, a known key.
fn canary(
    steps: Option<Vec<u8>>,
    interval: Option<String>,
    key: Option<String>,
) -> Result<Option<CanarySpec>, ApiError> {
    let bad = |message: String| Err(ApiError::BadRequest(message));
    let Some(steps) = steps else {
        return match (interval, key) {
            (None, None) => Ok(None),
            _ => bad("step_interval and hash_key need steps".into()),
        };
    };
    let growing = steps.windows(2).all(|w| w[0] < w[1]);
    if steps.is_empty() || !growing || steps[0] == 0 || steps.last() != Some(&100) {
        return bad(format!(
            "steps {steps:?} must grow strictly from at least 1 and end at 100"
        ));
    }
    let Some(interval) = interval else {
        return bad("steps need step_interval".into());
    };
    let step_interval = match humantime::parse_duration(&interval) {
        Ok(d)
            if d >= std::time::Duration::from_secs(1)
                && d <= std::time::Duration::from_secs(86_400) =>
        {
            d
        }
        _ => {
            return bad(format!(
                "step_interval '{interval}' is not a duration between 1s and 24h"
            ))
        }
    };
    let key = match key {
        None => None,
        Some(text) => match crate::plan::parse_hash_key(&text) {
            Some(key) => Some(key),
            None => {
                return bad(format!(
                    "hash_key '{text}' is not header:NAME, cookie:NAME, client_ip or path"
                ))
            }
        },
    };
    Ok(Some(CanarySpec {
        steps,
        step_interval,
        key,
    }))
}

/// `guard` of an activation (DESIGN §14).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GuardJson {
    window: String,
    #[serde(default = "default_min_requests")]
    min_requests: u64,
    #[serde(default = "default_max_error_ratio")]
    max_error_ratio: f64,
    max_p99: Option<String>,
    max_block_ratio: Option<f64>,
    #[serde(default = "default_on_no_data")]
    on_no_data: String,
}

fn default_min_requests() -> u64 {
    100
}

fn default_max_error_ratio() -> f64 {
    0.01
}

fn default_on_no_data() -> String {
    "hold".to_owned()
}

/// A checked guard: a window of 1 s to 24 h, a ratio within 0..=1, a
/// known `on_no_data`; one that holds without data needs a deadline
/// (canary steps end in a confirmation of their own: not with them); one
/// that confirms on pass, a window shorter than the deadline.
fn guard(
    json: Option<GuardJson>,
    confirm_on_pass: Option<bool>,
    confirm_within: Option<std::time::Duration>,
    canary: bool,
) -> Result<Option<GuardSpec>, ApiError> {
    let bad = |message: String| Err(ApiError::BadRequest(message));
    let Some(json) = json else {
        return match confirm_on_pass {
            Some(_) => bad("confirm_on_pass needs a guard".into()),
            None => Ok(None),
        };
    };
    let window = match humantime::parse_duration(&json.window) {
        Ok(w)
            if w >= std::time::Duration::from_secs(1)
                && w <= std::time::Duration::from_secs(86_400) =>
        {
            w
        }
        _ => {
            return bad(format!(
                "guard.window '{}' is not a duration between 1s and 24h",
                json.window
            ))
        }
    };
    if !(0.0..=1.0).contains(&json.max_error_ratio) {
        return bad(format!(
            "guard.max_error_ratio {} is not between 0 and 1",
            json.max_error_ratio
        ));
    }
    if let Some(ratio) = json.max_block_ratio.filter(|r| !(0.0..=1.0).contains(r)) {
        return bad(format!(
            "guard.max_block_ratio {ratio} is not between 0 and 1"
        ));
    }
    let max_p99 = match json.max_p99.as_deref().map(humantime::parse_duration) {
        None => None,
        Some(Ok(p99)) if !p99.is_zero() => Some(p99),
        Some(_) => return bad("guard.max_p99 is not a positive duration".into()),
    };
    let fail_on_no_data = match json.on_no_data.as_str() {
        "fail" => true,
        "hold" => false,
        other => return bad(format!("guard.on_no_data '{other}' is not hold or fail")),
    };
    if !fail_on_no_data && confirm_within.is_none() && !canary && confirm_on_pass != Some(true) {
        return bad(
            "a guard that holds without data and does not confirm on pass needs confirm_within"
                .into(),
        );
    }
    if let Some(within) = confirm_within.filter(|w| confirm_on_pass == Some(true) && window >= *w) {
        return bad(format!(
            "guard.window {} is not shorter than confirm_within {}: the deadline would roll back a generation before its guard could pass it",
            json.window,
            humantime::format_duration(within)
        ));
    }
    Ok(Some(GuardSpec {
        window,
        min_requests: json.min_requests,
        max_error_ratio: json.max_error_ratio,
        max_p99,
        max_block_ratio: json.max_block_ratio,
        fail_on_no_data,
        confirm_on_pass: confirm_on_pass.unwrap_or(false),
    }))
}

/// `shadow` of an activation (DESIGN §22).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShadowJson {
    #[serde(default = "default_shadow_percent")]
    percent: f64,
    duration: String,
    max_error_ratio: Option<f64>,
    max_p99_ratio: Option<f64>,
    /// A WAF shadow stage (DESIGN §24).
    #[serde(default)]
    waf: bool,
    max_block_increase: Option<f64>,
    #[serde(default = "default_shadow_inflight")]
    max_inflight: u32,
    #[serde(default = "default_min_requests")]
    min_requests: u64,
    #[serde(default = "default_shadow_on_no_data")]
    on_no_data: String,
}

fn default_shadow_percent() -> f64 {
    10.0
}

fn default_shadow_inflight() -> u32 {
    64
}

fn default_shadow_on_no_data() -> String {
    "fail".to_owned()
}

/// The longest shadow: copies of live traffic for longer are a mirror's
/// job, and an activation request would stay open for it.
const MAX_SHADOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// A checked shadow: a share above 0 up to 100 %, a duration of 1 s to
/// 1 h, a ratio within 0..=1, a p99 ratio of at least 1, 1 to 10 000
/// copies in flight, a known `on_no_data`.
fn shadow(json: Option<ShadowJson>) -> Result<Option<ShadowSpec>, ApiError> {
    let bad = |message: String| Err(ApiError::BadRequest(message));
    let Some(json) = json else { return Ok(None) };
    if !(json.percent > 0.0 && json.percent <= 100.0) {
        return bad(format!(
            "shadow.percent {} is not above 0 and at most 100",
            json.percent
        ));
    }
    let duration = match humantime::parse_duration(&json.duration) {
        Ok(d) if d >= std::time::Duration::from_secs(1) && d <= MAX_SHADOW => d,
        _ => {
            return bad(format!(
                "shadow.duration '{}' is not a duration between 1s and 1h",
                json.duration
            ))
        }
    };
    let max_error_ratio = json.max_error_ratio.unwrap_or_else(default_max_error_ratio);
    if !(0.0..=1.0).contains(&max_error_ratio) {
        return bad(format!(
            "shadow.max_error_ratio {max_error_ratio} is not between 0 and 1"
        ));
    }
    let max_block_increase = match (json.waf, json.max_block_increase) {
        (false, Some(_)) => {
            return bad("shadow.max_block_increase needs shadow.waf = true".into())
        }
        (false, None) => None,
        (true, _) if json.max_error_ratio.is_some() || json.max_p99_ratio.is_some() => {
            return bad(
                "a WAF shadow (shadow.waf = true) compares the firewalls' verdicts, not answers: it takes no max_error_ratio or max_p99_ratio".into(),
            )
        }
        (true, increase) => {
            let increase = increase.unwrap_or(0.01);
            if !(0.0..=1.0).contains(&increase) {
                return bad(format!(
                    "shadow.max_block_increase {increase} is not between 0 and 1"
                ));
            }
            Some(increase)
        }
    };
    if let Some(ratio) = json.max_p99_ratio.filter(|r| !(*r >= 1.0 && r.is_finite())) {
        return bad(format!(
            "shadow.max_p99_ratio {ratio} is not a finite ratio of at least 1"
        ));
    }
    if !(1..=10_000).contains(&json.max_inflight) {
        return bad(format!(
            "shadow.max_inflight {} is not between 1 and 10000",
            json.max_inflight
        ));
    }
    let fail_on_no_data = match json.on_no_data.as_str() {
        "fail" => true,
        "hold" => false,
        other => return bad(format!("shadow.on_no_data '{other}' is not hold or fail")),
    };
    Ok(Some(ShadowSpec {
        percent: json.percent,
        duration,
        max_error_ratio,
        max_p99_ratio: json.max_p99_ratio,
        max_inflight: json.max_inflight,
        min_requests: json.min_requests.max(1),
        fail_on_no_data,
        max_block_increase,
    }))
}

fn freeze_rule(override_freeze: Option<bool>) -> FreezeRule {
    match override_freeze {
        Some(true) => FreezeRule::Override,
        _ => FreezeRule::Honour,
    }
}

/// The media type of a request, without parameters, lower-cased.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
}

/// A candidate, and the executable an upgrade request names (JSON
/// `binary`; refused by every other call).
pub fn parse(
    query: CandidateQuery,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Candidate, Option<String>), ApiError> {
    let query_within = confirm_within(query.confirm_within.as_deref())?;
    let from_query = |source| Candidate {
        source,
        expected_generation: query.expected_generation.map(GenerationId),
        reason: query.reason.clone(),
        requested_by: query.requested_by.clone(),
        caller: None,
        confirm_within: query_within,
        guard: None,
        canary: None,
        shadow: None,
        freeze: freeze_rule(query.override_freeze),
        approved_by: Vec::new(),
    };
    let media = media_type(headers);
    if body.iter().all(u8::is_ascii_whitespace) && media.as_deref() != Some("application/toml") {
        return Ok((from_query(CandidateSource::Path(None)), None));
    }
    match media.as_deref() {
        Some("application/toml") => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::BadRequest("the TOML body is not UTF-8".into()))?;
            Ok((from_query(CandidateSource::Text(text.to_owned())), None))
        }
        Some("application/json") => {
            let json: CandidateJson = serde_json::from_slice(body).map_err(|e| {
                ApiError::BadRequest(format!("the JSON body is not a candidate: {e}"))
            })?;
            let source = match (json.config, json.config_path) {
                (Some(_), Some(_)) => {
                    return Err(ApiError::BadRequest(
                        "give either config or config_path, not both".into(),
                    ))
                }
                (Some(text), None) => CandidateSource::Text(text),
                (None, path) => CandidateSource::Path(path.map(Into::into)),
            };
            let candidate = Candidate {
                source,
                expected_generation: json
                    .expected_generation
                    .or(query.expected_generation)
                    .map(GenerationId),
                reason: json.reason.or(query.reason),
                requested_by: json.requested_by.or(query.requested_by),
                caller: None,
                confirm_within: match json.confirm_within {
                    Some(text) => confirm_within(Some(&text))?,
                    None => query_within,
                },
                guard: None,
                canary: canary(json.steps, json.step_interval, json.hash_key)?,
                shadow: shadow(json.shadow)?,
                freeze: freeze_rule(json.override_freeze.or(query.override_freeze)),
                approved_by: Vec::new(),
            };
            let candidate = Candidate {
                guard: guard(
                    json.guard,
                    json.confirm_on_pass,
                    candidate.confirm_within,
                    candidate.canary.is_some(),
                )?,
                ..candidate
            };
            Ok((candidate, json.binary))
        }
        other => Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type {} is not accepted; send application/toml or application/json",
            other.unwrap_or("(none)")
        ))),
    }
}

/// `parse`, with its metadata within `limits::MAX_METADATA`.
fn parse_checked(
    query: CandidateQuery,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Candidate, Option<String>), ApiError> {
    let (candidate, binary) = parse(query, headers, body)?;
    super::limits::check_metadata(&[
        ("reason", candidate.reason.as_deref()),
        ("requested_by", candidate.requested_by.as_deref()),
    ])?;
    Ok((candidate, binary))
}

/// Extracts a candidate from any of its request forms: query metadata,
/// Content-Type and a body of at most `admin.max_body` bytes (413
/// beyond).
pub struct CandidateRequest(pub Candidate);

/// An upgrade's candidate and the executable it names, if any.
pub struct UpgradeCandidate(pub Candidate, pub Option<String>);

async fn extract<S: Send + Sync>(
    req: axum::extract::Request,
    state: &S,
) -> Result<(Candidate, Option<String>), axum::response::Response> {
    use axum::extract::FromRequest;
    use axum::response::IntoResponse;
    let query = axum::extract::Query::<CandidateQuery>::try_from_uri(req.uri())
        .map_err(IntoResponse::into_response)?;
    let headers = req.headers().clone();
    let caller = super::security::caller_of(&req);
    let may_override = super::security::caller_may(&req, crate::plan::Scope::Override);
    let body = Bytes::from_request(req, state)
        .await
        .map_err(IntoResponse::into_response)?;
    // Megabytes of configuration in a JSON string are decoded off the
    // admin runtime's threads, as they are then planned.
    let (mut candidate, binary) = if body.len() <= OFF_THE_REACTOR_FROM {
        parse_checked(query.0, &headers, &body).map_err(IntoResponse::into_response)?
    } else {
        tokio::task::spawn_blocking(move || parse_checked(query.0, &headers, &body))
            .await
            .map_err(|e| {
                ApiError::Control(crate::control::ControlError::Internal(e.to_string()))
                    .into_response()
            })?
            .map_err(IntoResponse::into_response)?
    };
    // Going through a freeze takes the `override` scope and a reason,
    // which the operation's record keeps.
    if candidate.freeze == FreezeRule::Override {
        if !may_override {
            return Err(super::security::forbidden(crate::plan::Scope::Override));
        }
        if candidate
            .reason
            .as_deref()
            .is_none_or(|r| r.trim().is_empty())
        {
            return Err(ApiError::BadRequest(
                "override_freeze needs a reason: it is recorded with the operation".into(),
            )
            .into_response());
        }
    }
    candidate.caller = caller;
    Ok((candidate, binary))
}

/// Bodies larger than this are decoded on the blocking pool.
const OFF_THE_REACTOR_FROM: usize = 64 * 1024;

impl<S: Send + Sync> axum::extract::FromRequest<S> for CandidateRequest {
    type Rejection = axum::response::Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::response::IntoResponse;
        match extract(req, state).await? {
            (candidate, None) => Ok(CandidateRequest(candidate)),
            (_, Some(_)) => {
                Err(ApiError::BadRequest("binary applies to upgrades only".into()).into_response())
            }
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequest<S> for UpgradeCandidate {
    type Rejection = axum::response::Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::response::IntoResponse;
        let (candidate, binary) = extract(req, state).await?;
        // A drain-aware restart activates nothing that could be pending.
        if candidate.confirm_within.is_some()
            || candidate.guard.is_some()
            || candidate.canary.is_some()
            || candidate.shadow.is_some()
        {
            return Err(ApiError::BadRequest(
                "confirm_within, guard, steps and shadow apply to activate and reload, not to upgrades"
                    .into(),
            )
            .into_response());
        }
        Ok(UpgradeCandidate(candidate, binary))
    }
}

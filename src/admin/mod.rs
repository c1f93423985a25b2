//! The admin API: a thin axum surface over the writer (`writer.rs`).
//!
//! Handlers turn requests into writer calls (changes) or control calls
//! (reads) and results into JSON; they hold no logic of their own, and
//! never ask whether the instance is in a fleet. Errors become responses
//! in `error.rs`.
//! Guards (token, Host, Origin) are in `security.rs`; bodies are read
//! whole within 1 MiB (413) and 10 s (408), error answers are always JSON
//! (`limits.rs`), and mutations are POST only (405 otherwise).

mod approvals;
mod candidate;
mod error;
mod events;
mod limits;
mod proposal_book;
mod security;
mod ui;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use approvals::{Approvals, Asked};
use candidate::{CandidateRequest, UpgradeCandidate};
pub use error::{ApiError, ErrorBody};
use security::CallerName;
pub use security::{PeerCertificate, Security};

use crate::control::{
    BackendsView, CacheView, CandidateSource, RollbackRequest, Settle, SettleRequest,
    UpgradeRequest,
};
use crate::ids::GenerationId;
use crate::plan::Approvable;
use crate::runtime::Phase;
use crate::writer::Writer;

/// The admin router over `writer`, guarded by `security`.
pub fn router(writer: Writer, security: Security) -> Router {
    let max_body = security.max_body;
    let security = Arc::new(security);
    let approvals = Approvals::new(writer.clone());
    Router::new()
        .route("/admin/runtime/validate", post(validate))
        .route("/admin/runtime/preview", post(preview))
        .route("/admin/runtime/activate", post(activate))
        .route("/admin/runtime/reload", post(reload))
        .route("/admin/runtime/rollback", post(rollback))
        .route("/admin/runtime/confirm", post(confirm))
        .route("/admin/runtime/abort", post(abort))
        .route("/admin/runtime/reload-certs", post(reload_certs))
        .route("/admin/runtime/history", get(history))
        .route(
            "/admin/runtime/history/{generation}",
            get(history_generation),
        )
        .route("/admin/runtime/status", get(status))
        .route("/admin/runtime/timeline", get(timeline))
        .route("/admin/events", get(events::stream))
        .route("/admin/runtime/proposals", get(proposals).post(propose))
        .route("/admin/runtime/proposals/{id}", get(proposal))
        .route("/admin/runtime/proposals/{id}/{verdict}", post(decide))
        .route("/admin/webhooks", get(webhooks))
        .route("/admin/fleet/status", get(fleet_status))
        .route("/admin/fleet/forget", post(fleet_forget))
        .route("/admin/runtime/backends", get(backends))
        .route("/admin/runtime/operations/{id}", get(operation))
        .route("/admin/cache", get(cache))
        .route("/admin/waf", get(waf))
        .route("/admin/cache/purge", post(cache_purge))
        .route("/admin/lifecycle/drain", post(drain))
        .route("/admin/lifecycle/upgrade", post(upgrade))
        .route(
            "/admin",
            get(|| async { axum::response::Redirect::permanent("/admin/") }),
        )
        .route("/admin/", get(ui::index))
        .route("/admin/ui/app.js", get(ui::script))
        .route("/admin/ui/app.css", get(ui::style))
        .route("/admin/ui/session", get(ui::session))
        .route("/admin/health", get(health))
        .route("/admin/ready", get(ready))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(
            max_body,
            limits::bounded_body,
        ))
        .layer(axum::middleware::from_fn_with_state(
            security,
            security::guard,
        ))
        .layer(axum::middleware::map_response(limits::json_errors))
        .layer(Extension(approvals))
        .with_state(Arc::new(writer))
}

type Shared = State<Arc<Writer>>;

/// The JSON body of a call that takes only JSON (`what` names the call in
/// the refusal).
fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
    what: &str,
) -> Result<T, ApiError> {
    if candidate::media_type(headers).as_deref() != Some("application/json") {
        return Err(ApiError::UnsupportedMediaType(format!(
            "{what}: the body must be application/json"
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("the {what} body is not valid: {e}")))
}

async fn validate(
    State(writer): Shared,
    CandidateRequest(candidate): CandidateRequest,
) -> Result<Response, ApiError> {
    let candidate = match writer.as_planned(candidate) {
        Ok(candidate) => candidate,
        // An invalid shared document is a plan like any other.
        Err(crate::control::ControlError::Invalid(plan)) => return Ok(Json(plan).into_response()),
        Err(error) => return Err(error.into()),
    };
    Ok(Json(writer.control().validate(candidate).await?).into_response())
}

async fn preview(
    State(writer): Shared,
    CandidateRequest(candidate): CandidateRequest,
) -> Result<Response, ApiError> {
    let candidate = writer.as_planned(candidate)?;
    Ok(Json(writer.control().preview(candidate).await?).into_response())
}

/// Activates on this instance, or (in a fleet) on every instance through
/// etcd.
async fn activate(
    State(writer): Shared,
    Extension(approvals): Extension<Arc<Approvals>>,
    CandidateRequest(candidate): CandidateRequest,
) -> Result<Response, ApiError> {
    if approvals.required(Approvable::Activate, candidate.caller.as_deref()) {
        let change = approvals::activation_change(&candidate, writer.control())?;
        return approvals.propose(change, Asked::of(&candidate)).await;
    }
    Ok(Json(writer.activate(candidate).await?).into_response())
}

/// A reload through the API waits for approval as an activation does
/// (the file's text, read now, is what is proposed).
async fn reload(
    State(writer): Shared,
    Extension(approvals): Extension<Arc<Approvals>>,
    CandidateRequest(candidate): CandidateRequest,
) -> Result<Response, ApiError> {
    if approvals.required(Approvable::Activate, candidate.caller.as_deref()) {
        let change = approvals::activation_change(&candidate, writer.control())?;
        return approvals.propose(change, Asked::of(&candidate)).await;
    }
    Ok(Json(writer.reload(candidate).await?).into_response())
}

/// `POST /admin/runtime/proposals`: an activation proposed for approval,
/// whether or not the policy asks for one.
async fn propose(
    State(writer): Shared,
    Extension(approvals): Extension<Arc<Approvals>>,
    CandidateRequest(candidate): CandidateRequest,
) -> Result<Response, ApiError> {
    let change = approvals::activation_change(&candidate, writer.control())?;
    approvals.propose(change, Asked::of(&candidate)).await
}

async fn proposals(Extension(approvals): Extension<Arc<Approvals>>) -> Result<Response, ApiError> {
    Ok(Json(json!({ "proposals": approvals.list().await? })).into_response())
}

async fn proposal(
    Extension(approvals): Extension<Arc<Approvals>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(json!({ "proposal": approvals.get(&id).await? })).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerdictBody {
    reason: Option<String>,
}

/// The body of an approval or a rejection: JSON, or nothing.
fn verdict_body(headers: &HeaderMap, body: &Bytes, what: &str) -> Result<VerdictBody, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(VerdictBody::default());
    }
    let verdict: VerdictBody = json_body(headers, body, what)?;
    limits::check_metadata(&[("reason", verdict.reason.as_deref())])?;
    Ok(verdict)
}

/// `POST …/proposals/{id}/approve|reject` (any other verdict: 404).
async fn decide(
    Extension(approvals): Extension<Arc<Approvals>>,
    Extension(caller): Extension<CallerName>,
    Path((id, verdict)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let caller = caller.0.as_deref().map(str::to_owned);
    match verdict.as_str() {
        "approve" => {
            let body = verdict_body(&headers, &body, "approve")?;
            approvals.approve(&id, caller, body.reason).await
        }
        "reject" => {
            let body = verdict_body(&headers, &body, "reject")?;
            approvals.reject(&id, caller, body.reason).await
        }
        other => Err(ApiError::NotFound(format!(
            "no verdict '{other}': approve or reject"
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForgetBody {
    instance: String,
}

/// Forgets a gone member of the fleet.
async fn fleet_forget(
    State(writer): Shared,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: ForgetBody = json_body(&headers, &body, "forget")?;
    #[cfg(feature = "fleet")]
    {
        writer.forget(&body.instance).await?;
        Ok(Json(json!({ "forgotten": body.instance })).into_response())
    }
    #[cfg(not(feature = "fleet"))]
    {
        let _ = writer;
        Err(ApiError::NotFound(format!(
            "this instance is not in a fleet (no [fleet] section): there is no '{}' to forget",
            body.instance
        )))
    }
}

/// The fleet's active generation and where each instance stands.
async fn fleet_status(State(writer): Shared) -> Result<Response, ApiError> {
    #[cfg(feature = "fleet")]
    {
        Ok(Json(writer.fleet_status().await?).into_response())
    }
    #[cfg(not(feature = "fleet"))]
    {
        let _ = writer;
        Err(ApiError::NotFound(
            "this instance is not in a fleet (no [fleet] section)".into(),
        ))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackBody {
    target_generation: u64,
    expected_active_generation: Option<u64>,
    reason: Option<String>,
    requested_by: Option<String>,
}

async fn rollback(
    State(writer): Shared,
    Extension(approvals): Extension<Arc<Approvals>>,
    Extension(caller): Extension<CallerName>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: RollbackBody = json_body(&headers, &body, "rollback")?;
    limits::check_metadata(&[
        ("reason", body.reason.as_deref()),
        ("requested_by", body.requested_by.as_deref()),
    ])?;
    if approvals.required(Approvable::Rollback, caller.0.as_deref()) {
        let change = approvals::Change::Rollback {
            target_generation: GenerationId(body.target_generation),
        };
        let asked = Asked {
            caller: caller.0.as_deref().map(str::to_owned),
            requested_by: body.requested_by,
            reason: body.reason,
            expected_generation: body.expected_active_generation.map(GenerationId),
        };
        return approvals.propose(change, asked).await;
    }
    let activated = writer
        .rollback(RollbackRequest {
            target_generation: GenerationId(body.target_generation),
            expected_active_generation: body.expected_active_generation.map(GenerationId),
            reason: body.reason,
            requested_by: body.requested_by,
            caller: caller.0.as_deref().map(str::to_owned),
            approved_by: Vec::new(),
        })
        .await?;
    Ok(Json(activated).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    generation: u64,
    expected_active_generation: Option<u64>,
    reason: Option<String>,
    requested_by: Option<String>,
}

async fn confirm(
    State(writer): Shared,
    Extension(caller): Extension<CallerName>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    settle(&writer, caller, &headers, &body, Settle::Confirm).await
}

async fn abort(
    State(writer): Shared,
    Extension(caller): Extension<CallerName>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    settle(&writer, caller, &headers, &body, Settle::Abort).await
}

/// `confirm` and `abort`: compare-and-swap on the pending generation.
async fn settle(
    writer: &Writer,
    caller: CallerName,
    headers: &HeaderMap,
    body: &Bytes,
    how: Settle,
) -> Result<Response, ApiError> {
    let body: SettleBody = json_body(headers, body, "confirm and abort")?;
    limits::check_metadata(&[
        ("reason", body.reason.as_deref()),
        ("requested_by", body.requested_by.as_deref()),
    ])?;
    let settled = writer
        .settle(
            SettleRequest {
                generation: GenerationId(body.generation),
                expected_active_generation: body.expected_active_generation.map(GenerationId),
                requested_by: body.requested_by,
                reason: body.reason,
                caller: caller.0.as_deref().map(str::to_owned),
            },
            how,
        )
        .await?;
    Ok(Json(settled).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReloadCertsBody {
    listeners: Option<Vec<String>>,
}

async fn reload_certs(
    State(writer): Shared,
    Extension(caller): Extension<CallerName>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let control = writer.control();
    let body: ReloadCertsBody = if body.iter().all(u8::is_ascii_whitespace) {
        ReloadCertsBody::default()
    } else if candidate::media_type(&headers).as_deref() == Some("application/json") {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("the reload-certs body is not valid: {e}")))?
    } else {
        return Err(ApiError::UnsupportedMediaType(
            "reload-certs takes application/json".into(),
        ));
    };
    let caller = caller.0.as_deref().map(str::to_owned);
    Ok(Json(control.reload_certs(body.listeners, None, caller).await?).into_response())
}

async fn cache(State(writer): Shared) -> Response {
    Json(CacheView::of(&writer.control().store().load_full())).into_response()
}

/// `GET /admin/waf`: the active generation's rule sets, the routes that
/// use them, and the rules matched most.
async fn waf(State(writer): Shared) -> Response {
    Json(crate::control::WafView::of(
        &writer.control().store().load_full(),
    ))
    .into_response()
}

/// `POST /admin/cache/purge`: exactly one of `key`, `prefix` (of keys)
/// and `tag` (a `Surrogate-Key` / `Cache-Tag` value), in `zone` or in
/// every zone.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    zone: Option<String>,
    key: Option<String>,
    prefix: Option<String>,
    tag: Option<String>,
    requested_by: Option<String>,
    reason: Option<String>,
}

async fn cache_purge(
    State(writer): Shared,
    Extension(caller): Extension<CallerName>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if candidate::media_type(&headers).as_deref() != Some("application/json") {
        return Err(ApiError::UnsupportedMediaType(
            "cache purge takes application/json".into(),
        ));
    }
    let body: PurgeBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("the purge body is not valid: {e}")))?;
    let selector = match (body.key, body.prefix, body.tag) {
        (Some(key), None, None) if !key.is_empty() => crate::cache::Selector::Key(key),
        (None, Some(prefix), None) if !prefix.is_empty() => crate::cache::Selector::Prefix(prefix),
        (None, None, Some(tag)) if !tag.is_empty() => crate::cache::Selector::Tag(tag),
        _ => {
            return Err(ApiError::BadRequest(
                "a purge names exactly one of key, prefix or tag, not empty".into(),
            ))
        }
    };
    let requester = crate::control::Requester {
        requested_by: body.requested_by,
        reason: body.reason,
        caller: caller.0.as_deref().map(str::to_owned),
        overrode_freeze: None,
        approved_by: Vec::new(),
    };
    let control = writer.control();
    let purged = control.purge_cache(body.zone, selector, requester).await?;
    Ok(Json(purged).into_response())
}

/// What drain and upgrade answer: the operation that follows them.
#[derive(Debug, Serialize, Deserialize)]
pub struct Started {
    pub operation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
}

async fn drain(
    State(writer): Shared,
    Extension(caller): Extension<CallerName>,
) -> Result<Response, ApiError> {
    let control = writer.control();
    let requester = crate::control::Requester {
        caller: caller.0.as_deref().map(str::to_owned),
        overrode_freeze: None,
        approved_by: Vec::new(),
        ..Default::default()
    };
    let operation_id = control.drain(requester).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Started {
            operation_id,
            phase: Some(Phase::Draining),
        }),
    )
        .into_response())
}

/// Takes a candidate in the usual forms; an empty body (or the process's
/// own file by `config_path`) restarts on the active configuration.
async fn upgrade(
    State(writer): Shared,
    Extension(approvals): Extension<Arc<Approvals>>,
    UpgradeCandidate(candidate, binary): UpgradeCandidate,
) -> Result<Response, ApiError> {
    let control = writer.control();
    let asked = Asked::of(&candidate);
    let config = match candidate.source {
        CandidateSource::Text(text) => Some(text),
        CandidateSource::Path(None) => None,
        CandidateSource::Path(Some(_)) | CandidateSource::Composed { .. } => {
            return Err(ApiError::BadRequest(
                "upgrade takes the candidate text, not config_path".into(),
            ));
        }
    };
    if approvals.required(Approvable::Upgrade, asked.caller.as_deref()) {
        let change = approvals::Change::Upgrade {
            config,
            binary: binary.map(Into::into),
            override_freeze: candidate.freeze == crate::control::FreezeRule::Override,
        };
        return approvals.propose(change, asked).await;
    }
    let operation_id = control.upgrade(UpgradeRequest {
        config,
        binary: binary.map(Into::into),
        requested_by: candidate.requested_by,
        reason: candidate.reason,
        caller: candidate.caller,
        freeze: candidate.freeze,
        overrode_freeze: None,
        approved_by: Vec::new(),
    })?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Started {
            operation_id,
            phase: None,
        }),
    )
        .into_response())
}

/// Each webhook (`admin.webhooks`) and what it has been sent.
async fn webhooks(State(writer): Shared) -> Response {
    Json(json!({ "webhooks": writer.control().webhook_views() })).into_response()
}

async fn history(State(writer): Shared) -> Result<Response, ApiError> {
    let control = writer.control();
    Ok(Json(control.history_view().await?).into_response())
}

async fn history_generation(
    State(writer): Shared,
    Path(generation): Path<String>,
) -> Result<Response, ApiError> {
    let control = writer.control();
    let id = generation
        .parse::<u64>()
        .map_err(|_| ApiError::BadRequest(format!("'{generation}' is not a generation id")))?;
    control
        .generation_detail(GenerationId(id))
        .await?
        .map(|d| Json(d).into_response())
        .ok_or_else(|| ApiError::NotFound(format!("generation {id} is not retained")))
}

async fn status(State(writer): Shared) -> Response {
    Json(writer.status()).into_response()
}

/// The last 15 minutes, one point a second (the console's charts).
async fn timeline(State(writer): Shared) -> Response {
    Json(writer.control().timeline_view()).into_response()
}

async fn backends(State(writer): Shared) -> Response {
    let control = writer.control();
    Json(BackendsView::of(control.store())).into_response()
}

async fn operation(State(writer): Shared, Path(id): Path<String>) -> Result<Response, ApiError> {
    let control = writer.control();
    control
        .operation(&id)
        .map(|o| Json(o).into_response())
        .ok_or_else(|| ApiError::NotFound(format!("operation {id} is not in the log")))
}

async fn health() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

async fn ready(State(writer): Shared) -> Response {
    let control = writer.control();
    let phase = control.phase().get();
    let body =
        Json(json!({ "phase": phase.as_str(), "active_generation": control.store().active_id() }));
    if phase == Phase::Running {
        body.into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn not_found() -> Response {
    ApiError::NotFound("no such admin endpoint".into()).into_response()
}

#[cfg(test)]
mod tests;

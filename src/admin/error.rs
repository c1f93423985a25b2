//! The one place control-plane errors become admin API responses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::borrow::Cow;

use crate::control::{CandidateError, ControlError, LifecycleError};
pub use crate::runtime::proposals::ProposalError;
use crate::runtime::shadow::ShadowVerdict;
use crate::writer::FleetCallError;

/// An admin API failure.
#[derive(Debug)]
pub enum ApiError {
    Control(ControlError),
    /// The request itself could not be understood (400).
    BadRequest(String),
    /// Content-Type the endpoint does not take (415).
    UnsupportedMediaType(String),
    NotFound(String),
    Lifecycle(LifecycleError),
    /// A fleet-only call (`/admin/fleet/…`).
    Fleet(FleetCallError),
    /// A proposal call (`/admin/runtime/proposals…`).
    Proposal(ProposalError),
}

impl From<ProposalError> for ApiError {
    fn from(e: ProposalError) -> Self {
        ApiError::Proposal(e)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Control(e) => e.fmt(f),
            ApiError::BadRequest(m) | ApiError::UnsupportedMediaType(m) | ApiError::NotFound(m) => {
                f.write_str(m)
            }
            ApiError::Lifecycle(e) => e.fmt(f),
            ApiError::Fleet(e) => e.fmt(f),
            ApiError::Proposal(e) => e.fmt(f),
        }
    }
}

impl From<FleetCallError> for ApiError {
    fn from(e: FleetCallError) -> Self {
        ApiError::Fleet(e)
    }
}

impl From<LifecycleError> for ApiError {
    fn from(e: LifecycleError) -> Self {
        ApiError::Lifecycle(e)
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        ApiError::Control(e)
    }
}

/// What every refusal carries (some add the plan or the generations
/// involved); `cutover ctl` reads it back.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable, machine-readable (`generation_conflict`, `draining`, …).
    pub error: Option<Cow<'static, str>>,
    pub message: Option<String>,
}

fn body(status: StatusCode, code: &'static str, message: String) -> Response {
    let body = ErrorBody {
        error: Some(code.into()),
        message: Some(message),
    };
    (status, Json(body)).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::BadRequest(message) => body(StatusCode::BAD_REQUEST, "bad_request", message),
            ApiError::UnsupportedMediaType(message) => body(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                message,
            ),
            ApiError::NotFound(message) => body(StatusCode::NOT_FOUND, "not_found", message),
            ApiError::Control(error) => control_error(error),
            ApiError::Lifecycle(error) => lifecycle_error(error),
            ApiError::Fleet(error) => fleet_error(error),
            ApiError::Proposal(error) => error.into_response(),
        }
    }
}

fn fleet_error(error: FleetCallError) -> Response {
    let message = error.to_string();
    match error {
        FleetCallError::NotInFleet => body(StatusCode::NOT_FOUND, "not_found", message),
        #[cfg(feature = "fleet")]
        FleetCallError::Forget(crate::fleet::ForgetError::Live(_)) => {
            body(StatusCode::CONFLICT, "instance_live", message)
        }
        #[cfg(feature = "fleet")]
        FleetCallError::Forget(crate::fleet::ForgetError::Control(error)) => control_error(error),
        #[cfg(feature = "fleet")]
        FleetCallError::Forget(crate::fleet::ForgetError::Unknown(_)) => {
            body(StatusCode::NOT_FOUND, "not_found", message)
        }
        FleetCallError::Control(error) => control_error(error),
    }
}

fn lifecycle_error(error: LifecycleError) -> Response {
    let message = error.to_string();
    match error {
        LifecycleError::AlreadyDraining => body(StatusCode::CONFLICT, "already_draining", message),
        LifecycleError::UpgradeRunning => {
            body(StatusCode::CONFLICT, "operation_in_progress", message)
        }
        LifecycleError::Draining => body(StatusCode::SERVICE_UNAVAILABLE, "draining", message),
        LifecycleError::Invalid(plan) => {
            (StatusCode::UNPROCESSABLE_ENTITY, Json(plan)).into_response()
        }
        LifecycleError::Unavailable => {
            body(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
        LifecycleError::Binary(_) => {
            body(StatusCode::UNPROCESSABLE_ENTITY, "invalid_binary", message)
        }
        LifecycleError::Failed(_) => {
            body(StatusCode::INTERNAL_SERVER_ERROR, "upgrade_failed", message)
        }
        LifecycleError::Frozen(window) => frozen(&window, message),
    }
}

/// 423 `frozen`: the window, its reason and when it ends; a caller with
/// `override` may go through it with `override_freeze` and a reason.
fn frozen(window: &crate::plan::Frozen, message: String) -> Response {
    (
        StatusCode::LOCKED,
        Json(json!({ "error": "frozen", "message": message, "freeze": window })),
    )
        .into_response()
}

fn control_error(error: ControlError) -> Response {
    let message = error.to_string();
    match error {
        ControlError::Candidate(CandidateError::Unreadable(..)) => body(StatusCode::BAD_REQUEST, "unreadable_candidate", message),
        ControlError::Candidate(CandidateError::OutsideConfigFolder(..)) => {
            body(StatusCode::BAD_REQUEST, "config_path_forbidden", message)
        }
        ControlError::Invalid(plan) | ControlError::RestartRequired(plan) => {
            (StatusCode::UNPROCESSABLE_ENTITY, Json(plan)).into_response()
        }
        ControlError::Bind { plan, .. } | ControlError::Build { plan, .. } => {
            let mut value = serde_json::to_value(&*plan).unwrap_or_else(|_| json!({}));
            if let Some(object) = value.as_object_mut() {
                object.insert("activatable".into(), json!(false));
                object.insert("error".into(), json!("activation_failed"));
                object.insert("message".into(), json!(message));
            }
            (StatusCode::UNPROCESSABLE_ENTITY, Json(value)).into_response()
        }
        ControlError::NotActivatable { target, plan } => {
            let mut value = serde_json::to_value(&*plan).unwrap_or_else(|_| json!({}));
            if let Some(object) = value.as_object_mut() {
                object.insert("error".into(), json!("target_not_activatable"));
                object.insert("target_generation".into(), json!(target));
                object.insert("message".into(), json!(message));
            }
            (StatusCode::UNPROCESSABLE_ENTITY, Json(value)).into_response()
        }
        ControlError::Conflict { expected, active } => (
            StatusCode::CONFLICT,
            Json(json!({ "error": "generation_conflict", "expected_generation": expected, "active_generation": active, "message": message })),
        )
            .into_response(),
        ControlError::InProgress => body(StatusCode::CONFLICT, "operation_in_progress", message),
        ControlError::Internal(_) => body(StatusCode::INTERNAL_SERVER_ERROR, "internal", message),
        ControlError::NotTlsListener(_) => body(StatusCode::BAD_REQUEST, "not_a_tls_listener", message),
        ControlError::UnknownZone(_) => body(StatusCode::NOT_FOUND, "unknown_zone", message),
        ControlError::Certificate { listener, source } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({
                "error": "certificate_invalid",
                "listener": listener,
                "file": source.path().display().to_string(),
                "message": message,
            })),
        )
            .into_response(),
        ControlError::TargetActive(target) => (
            StatusCode::CONFLICT,
            Json(json!({ "error": "target_active", "target_generation": target, "message": message })),
        )
            .into_response(),
        ControlError::ExpectedGenerationRequired => {
            body(StatusCode::PRECONDITION_REQUIRED, "expected_generation_required", message)
        }
        ControlError::Draining => {
            let mut response = body(StatusCode::SERVICE_UNAVAILABLE, "draining", message);
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
            response
        }
        ControlError::PendingActivation { pending } => (
            StatusCode::CONFLICT,
            Json(json!({ "error": "pending_activation", "pending_generation": pending, "message": message })),
        )
            .into_response(),
        ControlError::ShadowRefused(report) => {
            let (status, code) = match report.verdict {
                ShadowVerdict::Aborted => (StatusCode::CONFLICT, "shadow_aborted"),
                ShadowVerdict::Interrupted => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
                _ => (StatusCode::CONFLICT, "shadow_breach"),
            };
            (
                status,
                Json(json!({ "error": code, "message": message, "shadow": report })),
            )
                .into_response()
        }
        ControlError::ShadowWhilePending(pending) => (
            StatusCode::CONFLICT,
            Json(json!({ "error": "pending_activation", "pending_generation": pending, "message": message })),
        )
            .into_response(),
        ControlError::NotPending(generation) => (
            StatusCode::CONFLICT,
            Json(json!({ "error": "not_pending", "generation": generation, "message": message })),
        )
            .into_response(),
        ControlError::FleetUnavailable(_) => {
            body(StatusCode::SERVICE_UNAVAILABLE, "fleet_unavailable", message)
        }
        ControlError::Frozen(window) => frozen(&window, message),
        ControlError::FleetUnsupported(_) => {
            body(StatusCode::BAD_REQUEST, "unsupported_in_fleet", message)
        }
        ControlError::NotRetained(target) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": "generation_not_retained", "target_generation": target, "message": message })),
        )
            .into_response(),
    }
}

/// Why a proposal call was refused.
impl IntoResponse for ProposalError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            ProposalError::NotConfigured => (StatusCode::NOT_FOUND, "approvals_not_configured"),
            ProposalError::Anonymous => (StatusCode::FORBIDDEN, "forbidden"),
            ProposalError::NotFound(_) => (StatusCode::NOT_FOUND, "proposal_not_found"),
            ProposalError::Closed { .. } => (StatusCode::CONFLICT, "proposal_closed"),
            ProposalError::SelfApproval(_) => (StatusCode::FORBIDDEN, "self_approval"),
            ProposalError::AlreadyApproved { .. } => (StatusCode::CONFLICT, "already_approved"),
            ProposalError::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_proposals"),
            ProposalError::NoReason => (StatusCode::BAD_REQUEST, "bad_request"),
            ProposalError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "fleet_unavailable"),
        };
        let mut body = json!({ "error": code, "message": self.to_string() });
        if let ProposalError::Closed { state, .. } = &self {
            body["state"] = json!(state);
        }
        (status, Json(body)).into_response()
    }
}

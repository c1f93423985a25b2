//! Why a control operation did not succeed: one enum, mapped to HTTP
//! answers in `admin/error.rs` only.

use super::candidate::CandidateError;
use crate::generation::{self};
use crate::ids::GenerationId;
use crate::plan::Plan;
use crate::proxy::BindError;

/// Why an operation did not succeed. The admin API maps each variant to
/// its status code in one place.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Candidate(#[from] CandidateError),
    #[error("the candidate configuration is invalid ({} errors)", .0.errors.len())]
    Invalid(Box<Plan>),
    #[error("the candidate needs a drain-aware restart ({} restart-required changes)", .0.rejected.len())]
    RestartRequired(Box<Plan>),
    #[error("expected generation {expected} but generation {active} is active")]
    Conflict {
        expected: GenerationId,
        active: GenerationId,
    },
    #[error("another operation is in progress")]
    InProgress,
    #[error("this gateway requires expected_generation on every activation")]
    ExpectedGenerationRequired,
    #[error("the gateway is draining and accepts no configuration changes")]
    Draining,
    #[error("{source}")]
    Bind { source: BindError, plan: Box<Plan> },
    #[error("building the generation failed: {source}")]
    Build {
        source: generation::BuildError,
        plan: Box<Plan>,
    },
    #[error("generation {0} is not retained")]
    NotRetained(GenerationId),
    #[error("generation {0} is already active")]
    TargetActive(GenerationId),
    #[error("listener '{0}' is not a TLS listener of the active configuration")]
    NotTlsListener(String),
    #[error("cache zone '{0}' is not named by the active configuration")]
    UnknownZone(String),
    #[error("listener '{listener}': {source}")]
    Certificate {
        listener: String,
        source: crate::tls::TlsError,
    },
    #[error("internal error: {0}")]
    Internal(String),
    #[error("generation {target} can no longer be activated")]
    NotActivatable {
        target: GenerationId,
        plan: Box<Plan>,
    },
    #[error("generation {pending} is pending confirmation: confirm or abort it, or name it as expected_generation to supersede it")]
    PendingActivation { pending: GenerationId },
    /// A shadow stage refused the activation (or was stopped).
    #[error("{}", .0.reason)]
    ShadowRefused(Box<crate::runtime::shadow::ShadowReport>),
    #[error(
        "generation {0} is pending confirmation: confirm or abort it before a shadowed activation"
    )]
    ShadowWhilePending(GenerationId),
    #[error("generation {0} is not pending")]
    NotPending(GenerationId),
    /// Fleet mode: etcd did not answer, so nothing was changed.
    #[error("the fleet's etcd cannot be reached: {0}")]
    FleetUnavailable(String),
    /// A freeze window of the active configuration holds (DESIGN §23).
    #[error("{0}")]
    Frozen(Box<crate::plan::Frozen>),
    /// Fleet mode: an operation that works on one instance only.
    #[error("{0}")]
    FleetUnsupported(&'static str),
}

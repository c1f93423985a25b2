//! The one dispatch for changes: this instance's control plane, or (with
//! `[fleet]`) every instance through etcd.
//!
//! Takes the admin API's and the signal loop's requests (activate,
//! rollback, confirm and abort, reload, what validate and preview plan,
//! status) and hands each to the writer this process has; returns the
//! writer's answer. Nothing above this module asks whether it is in a
//! fleet, and `control` never knows about fleets: the fleet sits above it
//! and uses it like any client.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::control::{
    Activation, Candidate, Control, ControlError, RollbackRequest, Settle, SettleRequest, Settled,
    StatusView,
};
#[cfg(feature = "fleet")]
use crate::fleet::{Fleet, FleetActivation, FleetSettled, FleetStatus, ForgetError, LocalView};
use crate::runtime::OperationKind;

/// Who writes the active generation.
#[derive(Clone)]
pub enum Writer {
    /// This instance alone.
    Local(Arc<Control>),
    /// The fleet this instance is in.
    #[cfg(feature = "fleet")]
    Fleet(Arc<Fleet>),
}

/// An activation or rollback: this instance's, or the fleet's (with how
/// this instance applied it).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Activated {
    Local(Box<Activation>),
    #[cfg(feature = "fleet")]
    Fleet(Box<FleetActivation>),
}

/// A settled pending generation: this instance's or the fleet's.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Settlement {
    Local(Settled),
    #[cfg(feature = "fleet")]
    Fleet(FleetSettled),
}

/// `GET /admin/runtime/status`: this instance's status, and where it
/// stands in its fleet when it is in one.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    #[serde(flatten)]
    pub local: StatusView,
    #[cfg(feature = "fleet")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<LocalView>,
}

/// Why a fleet-only call was refused.
#[derive(Debug, thiserror::Error)]
pub enum FleetCallError {
    #[error("this instance is not in a fleet (no [fleet] section)")]
    NotInFleet,
    /// `forget` refused: a live instance, none of that name, or etcd away.
    #[cfg(feature = "fleet")]
    #[error(transparent)]
    Forget(ForgetError),
    #[error(transparent)]
    Control(#[from] ControlError),
}

impl Writer {
    /// The writer `[fleet]` calls for: joins the fleet when `fleet` is set
    /// (its agent starts at once), else this instance writes alone.
    pub fn start(control: Arc<Control>, fleet: Option<crate::plan::FleetSpec>) -> Self {
        #[cfg(feature = "fleet")]
        if let Some(spec) = fleet {
            let fleet = Fleet::start(Arc::clone(&control), spec);
            // The file this instance was started with serves composed
            // with the shared document: so it is compared with the active
            // text (status's `config_file_matches_active`).
            let weak = Arc::downgrade(&fleet);
            control.compose_file_with(Box::new(move |own| match weak.upgrade() {
                Some(fleet) => fleet.as_composed(own),
                None => own,
            }));
            return Writer::Fleet(fleet);
        }
        #[cfg(not(feature = "fleet"))]
        let _ = fleet;
        Writer::Local(control)
    }

    /// This instance's control plane (a fleet instance has one too).
    pub fn control(&self) -> &Arc<Control> {
        match self {
            Writer::Local(control) => control,
            #[cfg(feature = "fleet")]
            Writer::Fleet(fleet) => fleet.control(),
        }
    }

    /// The candidate validate and preview plan: in a fleet, a shared
    /// document composed with this instance's file.
    pub fn as_planned(&self, candidate: Candidate) -> Result<Candidate, ControlError> {
        match self {
            Writer::Local(_) => Ok(candidate),
            #[cfg(feature = "fleet")]
            Writer::Fleet(fleet) => fleet.compose(candidate),
        }
    }

    pub async fn activate(&self, candidate: Candidate) -> Result<Activated, ControlError> {
        match self {
            Writer::Local(control) => control
                .activate(candidate, OperationKind::Activate)
                .await
                .map(|a| Activated::Local(Box::new(a))),
            #[cfg(feature = "fleet")]
            Writer::Fleet(fleet) => fleet
                .activate(candidate)
                .await
                .map(|a| Activated::Fleet(Box::new(a))),
        }
    }

    /// Reloads the configuration file (SIGHUP, `POST …/reload`); in a
    /// fleet, composed with the shared document the instance serves.
    pub async fn reload(&self, candidate: Candidate) -> Result<Activation, ControlError> {
        match self {
            Writer::Local(control) => control.activate(candidate, OperationKind::Reload).await,
            #[cfg(feature = "fleet")]
            Writer::Fleet(fleet) => fleet.reload(candidate).await,
        }
    }

    pub async fn rollback(&self, request: RollbackRequest) -> Result<Activated, ControlError> {
        match self {
            Writer::Local(control) => control
                .rollback(request)
                .await
                .map(|a| Activated::Local(Box::new(a))),
            #[cfg(feature = "fleet")]
            Writer::Fleet(fleet) => fleet
                .rollback(request)
                .await
                .map(|a| Activated::Fleet(Box::new(a))),
        }
    }

    /// Confirms or aborts the pending generation.
    pub async fn settle(
        &self,
        request: SettleRequest,
        how: Settle,
    ) -> Result<Settlement, ControlError> {
        match self {
            Writer::Local(control) => control.settle(request, how).await.map(Settlement::Local),
            #[cfg(feature = "fleet")]
            Writer::Fleet(fleet) => fleet.settle(request, how).await.map(Settlement::Fleet),
        }
    }

    pub fn status(&self) -> Status {
        Status {
            local: self.control().status_view(),
            #[cfg(feature = "fleet")]
            fleet: match self {
                Writer::Fleet(fleet) => Some(fleet.local_view()),
                Writer::Local(_) => None,
            },
        }
    }

    /// The fleet's active generation and where each instance stands.
    #[cfg(feature = "fleet")]
    pub async fn fleet_status(&self) -> Result<FleetStatus, FleetCallError> {
        match self {
            Writer::Fleet(fleet) => Ok(fleet.status().await?),
            Writer::Local(_) => Err(FleetCallError::NotInFleet),
        }
    }

    /// Forgets a fleet member that is gone.
    #[cfg(feature = "fleet")]
    pub async fn forget(&self, instance: &str) -> Result<(), FleetCallError> {
        match self {
            Writer::Fleet(fleet) => fleet.forget(instance).await.map_err(FleetCallError::Forget),
            Writer::Local(_) => Err(FleetCallError::NotInFleet),
        }
    }

    /// Leaves the fleet as the process drains (bounded: etcd may be away).
    pub async fn leave(&self) {
        #[cfg(feature = "fleet")]
        if let Writer::Fleet(fleet) = self {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), fleet.leave()).await;
        }
    }
}

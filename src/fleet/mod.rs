//! Fleets (DESIGN §15): many instances activated as one through etcd.
//!
//! Each instance's own file keeps what it owns (listeners and their
//! binds, admin, metrics, `[fleet]`); the fleet shares one document of
//! routes, upstreams and `log.level`. An activation through any instance's
//! admin API writes the document once under `generations/<id>` and moves
//! `active` in one transaction that compares its revision: etcd's
//! compare-and-swap is the fleet's `expected_generation`. Every instance
//! (the agent in `agent.rs`) watches `active`, composes the document with
//! its own file, plans it with the same code as validate, and acks or
//! nacks under its lease. Losing etcd never stops traffic: an instance
//! serves what it has and catches up when etcd returns.

mod agent;
mod certificates;
mod etcd;
mod probation;
mod proposals;
mod records;
mod shadow;

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use etcd::{Client, EtcdError};
pub use probation::FleetSettled;
use probation::Probation;
pub use records::{ActiveRecord, FleetPending, InstanceRecord, Report, Settlement};
use records::{GenerationDoc, Keys};

use crate::config::ConfigText;
use crate::control::{
    Activation, Candidate, CandidateSource, Control, ControlError, RollbackRequest,
};
use crate::ids::GenerationId;
use crate::plan::{FleetSpec, Plan};
use crate::runtime::rfc3339;

/// What was applied, in `runtime.state_dir`.
const STATE_FILE: &str = "fleet.json";

/// How long one etcd request may take before the fleet counts it failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// An etcd request that failed or timed out.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("etcd did not answer within {REQUEST_TIMEOUT:?}")]
    Timeout,
    /// The prefix cannot be joined (another layout format): retried
    /// slowly.
    #[error("{0}")]
    Refused(String),
    /// The session ended (watch closed, lease expired, draining): a
    /// new one is opened after the back-off.
    #[error("{0}")]
    Lost(&'static str),
}

/// One etcd request, bounded by `REQUEST_TIMEOUT`.
async fn within<T>(
    request: impl std::future::Future<Output = Result<T, EtcdError>>,
) -> Result<T, FleetError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(FleetError::Timeout),
    }
}

impl From<FleetError> for ControlError {
    fn from(error: FleetError) -> Self {
        ControlError::FleetUnavailable(error.to_string())
    }
}

/// What this instance serves of the fleet, kept in `state_dir` so that a
/// restart while etcd is down knows it (the generation itself is in the
/// local history).
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
struct Applied {
    /// `0`: none yet (the instance file's own routes serve).
    generation: GenerationId,
    config_version: Option<String>,
    /// The shared document, to compose again when the instance file is
    /// reloaded.
    shared: Option<String>,
    /// The local generation it became.
    local_generation: GenerationId,
    /// The local generation before it: a guard's baseline.
    #[serde(default)]
    previous_local: GenerationId,
}

/// The answer of a fleet-wide activation or rollback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetActivation {
    pub outcome: Cow<'static, str>,
    /// Fleet generation ids.
    pub generation: GenerationId,
    pub previous_generation: Option<GenerationId>,
    /// Of the shared document.
    pub config_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<GenerationId>,
    /// Set when the generation is on probation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<FleetPending>,
    /// How the instance that answered applied it: its local activation,
    /// or why it refused.
    pub instance: InstanceOutcome,
    /// What its shadow stage showed, summed over the fleet (DESIGN §22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<crate::runtime::shadow::ShadowReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum InstanceOutcome {
    Applied {
        instance: String,
        activation: Box<Activation>,
    },
    Refused {
        instance: String,
        error: String,
    },
    /// It serves the generation already (its watch was first, or the
    /// activation changed nothing).
    Serving {
        instance: String,
        generation: GenerationId,
        local_generation: GenerationId,
    },
}

/// Why `forget` did nothing.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    #[error("instance '{0}' is live: stop it first (its status key goes with its lease)")]
    Live(String),
    #[error("instance '{0}' is not a member of this fleet")]
    Unknown(String),
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// An instance's place in the fleet, for `GET /admin/fleet/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberView {
    pub instance: String,
    /// `synced`, `applying`, `nacked`, `stale` or `gone`.
    pub status: Cow<'static, str>,
    /// What it serves, and of which shared document.
    pub generation: Option<GenerationId>,
    pub config_version: Option<String>,
    /// Serving another `config_version` than the fleet's active one.
    pub drift: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<GenerationId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diagnostics: Vec<String>,
    pub listeners: Vec<records::BoundListener>,
    pub updated_at: Option<String>,
    pub version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetStatus {
    pub prefix: String,
    pub active: Option<ActiveRecord>,
    pub instances: Vec<MemberView>,
    pub synced: usize,
    pub total: usize,
}

/// This instance's view of its fleet, for `/admin/runtime/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalView {
    pub instance: String,
    pub prefix: String,
    /// The fleet generation served (`null`: the instance file's own
    /// routes, before any was applied).
    pub generation: Option<GenerationId>,
    pub config_version: Option<String>,
    /// Whether the session with etcd is up.
    pub connected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The fleet generation on probation, as last seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<FleetPending>,
}

/// This instance's membership in a fleet.
pub struct Fleet {
    spec: FleetSpec,
    keys: Keys,
    control: Arc<Control>,
    client: tokio::sync::OnceCell<Client>,
    applied: Mutex<Applied>,
    /// Serialises applying (watch, admin, reload): one at a time, in order.
    applying: tokio::sync::Mutex<()>,
    /// Where `fleet.json` is kept (`runtime.state_dir`).
    state_dir: Option<PathBuf>,
    /// The agent's session: up, or why not.
    session: Mutex<Result<(), String>>,
    /// The lease the status key lives under, while the session is up.
    lease: Mutex<Option<i64>>,
    /// The last `active` record seen.
    last_active: Mutex<Option<ActiveRecord>>,
    /// The pending generation a probation task watches, if any.
    supervising: Mutex<Option<GenerationId>>,
    /// What this instance last said (repeated when its answers change).
    said: Mutex<Said>,
    /// The last write of the status key failed: the session writes it
    /// again at its next lease renewal, not only in its next session.
    unsaid: std::sync::atomic::AtomicBool,
    /// The fleet-wide shadow stage this instance runs: its id, and what
    /// stops it early.
    shadowing: Mutex<Option<(String, Arc<tokio::sync::Notify>)>>,
}

/// An instance's last report, and its answers while a guard judges.
#[derive(Debug, Clone)]
struct Said {
    report: Report,
    target: Option<GenerationId>,
    error: Option<String>,
    diagnostics: Vec<String>,
    answers: Option<records::PendingAnswers>,
    /// While a fleet-wide shadow stage runs: this instance's report.
    shadow: Option<records::InstanceShadow>,
}

/// Who asked for a fleet change, as its records keep it.
pub(crate) struct Asked {
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    /// The authenticated admin caller, on the instance that wrote it.
    pub caller: Option<String>,
    /// The callers that approved it (a proposal carried out).
    pub approved_by: Vec<String>,
}

impl Fleet {
    /// Joins the fleet `spec` names: reads what was applied before (from
    /// `state_dir`), then starts the agent, which connects (retrying with
    /// back-off while the local configuration serves).
    pub fn start(control: Arc<Control>, spec: FleetSpec) -> Arc<Self> {
        let active = control.store().load_full();
        let state_dir = active.spec.runtime.state_dir.clone();
        // What was applied counts only if the local history still serves
        // it (a state dir that was reset starts on the file's routes).
        let applied = state_dir
            .as_ref()
            .and_then(|dir| std::fs::read(dir.join(STATE_FILE)).ok())
            .and_then(|bytes| serde_json::from_slice::<Applied>(&bytes).ok())
            .filter(|a| a.local_generation == active.id)
            .unwrap_or_default();
        if applied.generation > GenerationId::NONE {
            tracing::info!(
                generation = %applied.generation,
                "fleet: serving the last applied fleet generation"
            );
        }
        let fleet = Arc::new(Self {
            keys: Keys::new(&spec.prefix),
            spec,
            control,
            client: tokio::sync::OnceCell::new(),
            applied: Mutex::new(applied),
            applying: tokio::sync::Mutex::new(()),
            state_dir,
            session: Mutex::new(Err("connecting".into())),
            lease: Mutex::new(None),
            last_active: Mutex::new(None),
            supervising: Mutex::new(None),
            said: Mutex::new(Said {
                report: Report::Ack,
                target: None,
                error: None,
                diagnostics: Vec::new(),
                answers: None,
                shadow: None,
            }),
            unsaid: std::sync::atomic::AtomicBool::new(false),
            shadowing: Mutex::new(None),
        });
        tokio::spawn(agent::run(Arc::clone(&fleet)));
        // ACME orders once per certificate across the fleet.
        let shared: Arc<dyn crate::acme::Shared> = Arc::clone(&fleet) as _;
        fleet.control.keeper().share(Arc::downgrade(&shared));
        fleet
    }

    /// This instance's control plane, which applies what the fleet
    /// activates.
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    pub fn instance(&self) -> &str {
        &self.spec.instance
    }

    fn applied(&self) -> Applied {
        self.applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The etcd client: built once (it reconnects by itself).
    async fn client(&self) -> Result<Client, FleetError> {
        let client = self
            .client
            .get_or_try_init(|| within(Client::connect(&self.spec)))
            .await?;
        Ok(client.clone())
    }

    /// This instance's view of its fleet.
    pub fn local_view(&self) -> LocalView {
        let applied = self.applied();
        let session = self
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        LocalView {
            instance: self.spec.instance.clone(),
            prefix: self.spec.prefix.clone(),
            generation: (applied.generation > GenerationId::NONE).then_some(applied.generation),
            config_version: applied.config_version,
            connected: session.is_ok(),
            last_error: session.err(),
            pending: self
                .last_active
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .and_then(|a| a.pending.clone()),
        }
    }

    /// The candidate a shared document makes on this instance: its own
    /// file with the document's domains (what validate and preview plan).
    pub fn compose(&self, candidate: Candidate) -> Result<Candidate, ControlError> {
        let shared = self.shared_text(&candidate)?;
        let text = self.composed(&shared, "<admin>")?;
        Ok(Candidate {
            source: CandidateSource::Composed {
                text,
                origin: "<admin> with the instance file".into(),
            },
            ..candidate
        })
    }

    /// `own` (the instance file's text) composed with the shared document
    /// this instance serves; `own` itself before any was applied.
    pub fn as_composed(&self, own: String) -> String {
        match self.applied().shared {
            Some(shared) => crate::config::compose(&own, &shared).unwrap_or(own),
            None => own,
        }
    }

    /// The shared document a request sent.
    fn shared_text(&self, candidate: &Candidate) -> Result<String, ControlError> {
        let text = crate::control::read_candidate(&candidate.source, self.control.config_file())?;
        Ok(text.text)
    }

    /// `shared` composed with the instance file as it is on disk now.
    fn composed(&self, shared: &str, origin: &str) -> Result<String, ControlError> {
        let own = ConfigText::read(self.control.config_file()).map_err(|e| {
            ControlError::Candidate(crate::control::CandidateError::Unreadable(
                self.control.config_file().to_path_buf(),
                e,
            ))
        })?;
        crate::config::compose(&own.text, shared).map_err(|errors| {
            let active = self.control.store().active_id();
            tracing::debug!(origin, "shared document refused");
            ControlError::Invalid(Box::new(Plan::refused(errors, Some(active))))
        })
    }

    /// Activates a shared document fleet-wide: checks it on this instance,
    /// writes it as the next generation and moves `active` in one
    /// transaction, then applies it here. Other instances follow by their
    /// watch.
    pub async fn activate(
        self: &Arc<Self>,
        candidate: Candidate,
    ) -> Result<FleetActivation, ControlError> {
        let probation = Probation::of(&candidate);
        let shared = self.shared_text(&candidate)?;
        // Checked here first: a document this instance would refuse is
        // never written.
        let plan = self
            .control
            .validate(self.compose(candidate.clone())?)
            .await?;
        if !plan.errors.is_empty() {
            return Err(ControlError::Invalid(Box::new(plan)));
        }
        if !plan.rejected.is_empty() {
            return Err(ControlError::RestartRequired(Box::new(plan)));
        }
        let expected = crate::control::Expectation::activation(
            candidate.expected_generation,
            &self.control.store().load_full().spec,
        );
        // Refused before etcd is asked anything; this instance's freeze
        // windows decide for the fleet (each instance applies what was
        // written).
        expected.given()?;
        crate::control::admit_in_freeze(&self.control.store().load_full().spec, candidate.freeze)
            .map_err(ControlError::Frozen)?;
        if let Some(spec) = candidate.shadow.clone() {
            return self
                .activate_shadowed(candidate, expected, spec, shared, probation)
                .await;
        }
        let asked = Asked {
            requested_by: candidate.requested_by,
            reason: candidate.reason,
            caller: candidate.caller,
            approved_by: candidate.approved_by,
        };
        self.publish(shared, expected, asked, None, probation).await
    }

    /// Rolls the fleet back to generation `target`'s document, as a new
    /// generation.
    pub async fn rollback(
        self: &Arc<Self>,
        request: RollbackRequest,
    ) -> Result<FleetActivation, ControlError> {
        let RollbackRequest {
            target_generation: target,
            expected_active_generation: expected,
            requested_by,
            reason,
            caller,
            approved_by,
        } = request;
        let client = self.client().await?;
        let found = within(client.get(self.keys.generation(target))).await?;
        let Some(kv) = found.kvs.first() else {
            return Err(ControlError::NotRetained(target));
        };
        let doc: GenerationDoc = serde_json::from_slice(&kv.value).map_err(|e| {
            ControlError::Internal(format!("fleet generation {target} is unreadable: {e}"))
        })?;
        let (active, _) = self.read_active(&client).await?;
        if active.as_ref().map(|a| a.generation) == Some(target) {
            return Err(ControlError::TargetActive(target));
        }
        self.publish(
            doc.config,
            crate::control::Expectation::optional(expected),
            Asked {
                requested_by,
                reason,
                caller,
                approved_by,
            },
            Some(target),
            None,
        )
        .await
    }

    /// The active record and its `mod_revision` (0 when absent).
    async fn read_active(
        &self,
        client: &Client,
    ) -> Result<(Option<ActiveRecord>, i64), FleetError> {
        let answer = within(client.get(self.keys.active())).await?;
        match answer.kvs.first() {
            None => Ok((None, 0)),
            Some(kv) => {
                let record = serde_json::from_slice(&kv.value).map_err(|e| {
                    FleetError::Refused(format!("{} is unreadable: {e}", self.keys.active()))
                })?;
                Ok((Some(record), kv.mod_revision))
            }
        }
    }

    /// The highest generation id ever written (ids are never reused, also
    /// after a lost race left a document that never became active).
    async fn highest_generation(&self, client: &Client) -> Result<GenerationId, FleetError> {
        let prefix = self.keys.generations().into_bytes();
        let request = etcd::wire::RangeRequest {
            range_end: etcd::prefix_end(&prefix),
            key: prefix,
            limit: 1,
            sort_order: etcd::wire::SortOrder::Descend as i32,
            sort_target: etcd::wire::SortTarget::Key as i32,
            keys_only: true,
        };
        let answer = within(client.range(request)).await?;
        Ok(answer
            .kvs
            .first()
            .and_then(|kv| std::str::from_utf8(&kv.key).ok())
            .and_then(|key| key.rsplit('/').next())
            .and_then(|id| id.parse().ok())
            .unwrap_or(GenerationId::NONE))
    }

    /// Writes `shared` as the next generation and makes it active (see
    /// `commit_generation`), then applies it here. With `probation`, the
    /// generation is pending until it is confirmed or rolled back
    /// (`probation.rs`).
    async fn publish(
        self: &Arc<Self>,
        shared: String,
        expected: crate::control::Expectation,
        asked: Asked,
        rolled_back_to: Option<GenerationId>,
        probation: Option<Probation>,
    ) -> Result<FleetActivation, ControlError> {
        let Asked {
            requested_by,
            reason,
            caller,
            approved_by,
        } = asked;
        let client = self.client().await?;
        let (active, revision) = self.read_active(&client).await?;
        let current = active.as_ref().map(|a| a.generation);
        // The same rules as on one instance; `0` expects a fleet with no
        // generation yet, and a pending generation is the active one.
        let pending = active.as_ref().and_then(|a| a.pending.as_ref());
        crate::control::admit_change(
            expected,
            current.unwrap_or(GenerationId::NONE),
            current.filter(|_| pending.is_some()),
        )?;
        let config_version = records::config_version(&shared);
        if let Some(active) = active
            .as_ref()
            .filter(|a| a.config_version == config_version && probation.is_none())
        {
            return Ok(FleetActivation {
                outcome: "unchanged".into(),
                generation: active.generation,
                previous_generation: active.previous,
                config_version,
                rolled_back_to: None,
                pending: active.pending.clone(),
                instance: self.outcome(Ok(None)),
                shadow: None,
            });
        }
        // The rollback target stays the last final generation.
        let rollback_to = pending.map(|p| p.rollback_to).or(current);
        let pending = match (probation, rollback_to) {
            (None, _) => None,
            (Some(p), Some(rollback_to)) => Some(p.record(rollback_to)),
            (Some(_), None) => {
                return Err(ControlError::FleetUnsupported(
                    "the fleet's first generation has nothing to roll back to: activate it without confirm_within, a guard or canary steps",
                ))
            }
        };
        let id = self
            .highest_generation(&client)
            .await?
            .max(current.unwrap_or(GenerationId::NONE))
            .next();
        let now = rfc3339(SystemTime::now());
        let doc = GenerationDoc {
            generation: id,
            config_version: config_version.clone(),
            config: shared,
            created_at: now.clone(),
            created_on: self.spec.instance.clone(),
            requested_by: requested_by.clone(),
            caller: caller.clone(),
            reason,
            rolled_back_to,
            approved_by,
        };
        let record = ActiveRecord {
            generation: id,
            config_version: config_version.clone(),
            previous: current,
            activated_at: now,
            requested_by,
            caller,
            pending,
            settlement: None,
            shadow: None,
        };
        if !self
            .commit_generation(&client, revision, &doc, &record)
            .await?
        {
            // Another activation won between our read and our write.
            let (now_active, _) = self.read_active(&client).await?;
            let active = now_active.map_or(GenerationId::NONE, |a| a.generation);
            return Err(ControlError::Conflict {
                expected: expected.named.or(current).unwrap_or(GenerationId::NONE),
                active,
            });
        }
        tracing::info!(generation = %id, previous = ?current, %config_version, pending = record.pending.is_some(), "fleet generation activated");
        let applied = self.apply(&record, Some(doc)).await;
        self.supervise(&record);
        Ok(FleetActivation {
            outcome: "activated".into(),
            generation: id,
            previous_generation: current,
            config_version,
            rolled_back_to,
            pending: record.pending,
            instance: self.outcome(applied),
            shadow: None,
        })
    }

    /// Puts `doc` (only if its key is new) and `record` as `active` (only
    /// if `active` is still at `revision`), in one transaction: whether
    /// it won.
    async fn commit_generation(
        &self,
        client: &Client,
        revision: i64,
        doc: &GenerationDoc,
        record: &ActiveRecord,
    ) -> Result<bool, ControlError> {
        let (doc_json, record_json) = match (serde_json::to_vec(doc), serde_json::to_vec(record)) {
            (Ok(d), Ok(r)) => (d, r),
            (Err(e), _) | (_, Err(e)) => return Err(ControlError::Internal(e.to_string())),
        };
        let key = self.keys.generation(doc.generation);
        let txn = etcd::wire::TxnRequest {
            compare: vec![
                etcd::modified_at(self.keys.active(), revision),
                etcd::created_at(key.clone(), 0),
            ],
            success: vec![
                etcd::put_op(key, doc_json),
                etcd::put_op(self.keys.active(), record_json),
            ],
            failure: Vec::new(),
        };
        Ok(within(client.txn(txn)).await?.succeeded)
    }

    fn outcome(&self, applied: Result<Option<Activation>, String>) -> InstanceOutcome {
        let instance = self.spec.instance.clone();
        match applied {
            Ok(Some(activation)) => InstanceOutcome::Applied {
                instance,
                activation: Box::new(activation),
            },
            Ok(None) => {
                let applied = self.applied();
                InstanceOutcome::Serving {
                    instance,
                    generation: applied.generation,
                    local_generation: applied.local_generation,
                }
            }
            Err(error) => InstanceOutcome::Refused { instance, error },
        }
    }

    /// Reloads the instance file: composes it again with the shared
    /// document served (a plain reload before any was applied).
    pub async fn reload(
        self: &Arc<Self>,
        candidate: Candidate,
    ) -> Result<Activation, ControlError> {
        let activation = self.reload_own(candidate).await?;
        // What the file lacked may be there now: a generation this
        // instance refused is tried again.
        let active = self
            .last_active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(active) = active.filter(|a| a.generation > self.applied().generation) {
            if let Err(error) = self.apply(&active, None).await {
                tracing::warn!(generation = %active.generation, %error, "fleet: still refused after the reload");
            }
        }
        Ok(activation)
    }

    async fn reload_own(
        self: &Arc<Self>,
        candidate: Candidate,
    ) -> Result<Activation, ControlError> {
        let _one = self.applying.lock().await;
        let applied = self.applied();
        let Some(shared) = applied.shared.clone() else {
            return self
                .control
                .activate(candidate, crate::runtime::OperationKind::Reload)
                .await;
        };
        let text = self.composed(&shared, "the instance file")?;
        let activation = self
            .control
            .activate(
                Candidate {
                    source: CandidateSource::Composed {
                        text,
                        origin: format!(
                            "{} with fleet generation {}",
                            self.control.config_file().display(),
                            applied.generation
                        ),
                    },
                    ..candidate
                },
                crate::runtime::OperationKind::Reload,
            )
            .await?;
        self.record_applied(Applied {
            local_generation: activation.generation,
            ..applied
        });
        self.report(Report::Ack, None, None, Vec::new()).await;
        Ok(activation)
    }

    /// Keeps what was applied, in memory and in `state_dir`.
    fn record_applied(&self, applied: Applied) {
        if let Some(dir) = &self.state_dir {
            let written = serde_json::to_vec(&applied)
                .map_err(std::io::Error::other)
                .and_then(|bytes| {
                    crate::files::write_atomically(dir, STATE_FILE, |out| {
                        std::io::Write::write_all(out, &bytes)
                    })
                });
            if let Err(error) = written {
                tracing::error!(%error, dir = %dir.display(), "fleet: cannot keep the applied generation");
            }
        }
        *self.applied.lock().unwrap_or_else(PoisonError::into_inner) = applied;
    }

    /// Leaves the fleet as the process drains: its status key goes with
    /// its lease at once, not a TTL later. A process that takes over (a
    /// drain-aware upgrade) has a lease of its own.
    pub async fn leave(&self) {
        let lease = self
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (Some(lease), Ok(client)) = (lease, self.client().await) {
            match within(client.lease_revoke(lease)).await {
                Ok(_) => tracing::info!("fleet: left (lease revoked)"),
                Err(error) => {
                    tracing::warn!(%error, "fleet: cannot revoke the lease; it expires by itself")
                }
            }
        }
    }

    /// Forgets a member that is gone (a scaled-down or renamed instance),
    /// so that status stops listing it. A live instance is not forgotten.
    pub async fn forget(&self, name: &str) -> Result<(), ForgetError> {
        let client = self.client().await.map_err(ControlError::from)?;
        let member = self.keys.member(name);
        // Only while the instance has no status key: one transaction.
        let txn = etcd::wire::TxnRequest {
            compare: vec![etcd::created_at(self.keys.instance(name), 0)],
            success: vec![etcd::delete_op(member)],
            failure: Vec::new(),
        };
        let answer = within(client.txn(txn)).await.map_err(ControlError::from)?;
        if !answer.succeeded {
            return Err(ForgetError::Live(name.to_owned()));
        }
        let deleted = answer.responses.iter().any(|op| {
            matches!(&op.response, Some(etcd::wire::Response::DeleteRange(d)) if d.deleted > 0)
        });
        if deleted {
            tracing::info!(instance = name, "fleet: member forgotten");
            Ok(())
        } else {
            Err(ForgetError::Unknown(name.to_owned()))
        }
    }

    /// Reads the fleet's state: the active generation and every member.
    pub async fn status(&self) -> Result<FleetStatus, ControlError> {
        let client = self.client().await?;
        let (active, _) = self.read_active(&client).await?;
        let members = within(client.get_prefix(self.keys.members(), true)).await?;
        let live = within(client.get_prefix(self.keys.instances(), false)).await?;
        let records: Vec<InstanceRecord> = live
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect();
        let mut names: Vec<String> = members
            .kvs
            .iter()
            .filter_map(|kv| std::str::from_utf8(&kv.key).ok())
            .filter_map(|key| key.rsplit('/').next())
            .map(str::to_owned)
            .collect();
        for record in &records {
            if !names.contains(&record.instance) {
                names.push(record.instance.clone());
            }
        }
        names.sort();
        let instances: Vec<MemberView> = names
            .into_iter()
            .map(|name| {
                let record = records.iter().find(|r| r.instance == name);
                member_view(name, record, active.as_ref())
            })
            .collect();
        Ok(FleetStatus {
            prefix: self.spec.prefix.clone(),
            synced: instances.iter().filter(|m| m.status == "synced").count(),
            total: instances.len(),
            active,
            instances,
        })
    }
}

/// Where one member stands against the active generation.
fn member_view(
    name: String,
    record: Option<&InstanceRecord>,
    active: Option<&ActiveRecord>,
) -> MemberView {
    let Some(record) = record else {
        return MemberView {
            instance: name,
            status: "gone".into(),
            generation: None,
            config_version: None,
            drift: false,
            target: None,
            error: None,
            diagnostics: Vec::new(),
            listeners: Vec::new(),
            updated_at: None,
            version: None,
        };
    };
    let active_generation = active.map(|a| a.generation);
    let status = match record.report {
        Report::Applying => "applying",
        Report::Nack if record.target == active_generation => "nacked",
        _ if record.generation == active_generation => "synced",
        _ => "stale",
    };
    MemberView {
        instance: name,
        status: status.into(),
        generation: record.generation,
        config_version: record.config_version.clone(),
        drift: active.is_some_and(|a| record.config_version.as_deref() != Some(&a.config_version)),
        target: record.target,
        error: record.error.clone(),
        diagnostics: record.diagnostics.clone(),
        listeners: record.listeners.clone(),
        updated_at: Some(record.updated_at.clone()),
        version: Some(record.version.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        report: Report,
        generation: Option<GenerationId>,
        target: Option<GenerationId>,
        version: &str,
    ) -> InstanceRecord {
        InstanceRecord {
            instance: "a".into(),
            report,
            generation,
            config_version: Some(version.into()),
            target,
            error: None,
            diagnostics: Vec::new(),
            local_generation: GenerationId(1),
            listeners: Vec::new(),
            updated_at: String::new(),
            version: String::new(),
            answers: None,
            shadow: None,
        }
    }

    #[test]
    fn members_are_synced_applying_nacked_stale_or_gone() {
        let active = ActiveRecord {
            generation: GenerationId(5),
            config_version: "v5".into(),
            previous: Some(GenerationId(4)),
            activated_at: String::new(),
            requested_by: None,
            caller: None,
            pending: None,
            settlement: None,
            shadow: None,
        };
        let view = |r: Option<&InstanceRecord>| member_view("a".into(), r, Some(&active));
        let synced = record(Report::Ack, Some(GenerationId(5)), None, "v5");
        assert_eq!(view(Some(&synced)).status, "synced");
        assert!(!view(Some(&synced)).drift);
        let applying = record(
            Report::Applying,
            Some(GenerationId(4)),
            Some(GenerationId(5)),
            "v4",
        );
        assert_eq!(view(Some(&applying)).status, "applying");
        let nacked = record(
            Report::Nack,
            Some(GenerationId(4)),
            Some(GenerationId(5)),
            "v4",
        );
        assert_eq!(view(Some(&nacked)).status, "nacked");
        assert!(view(Some(&nacked)).drift, "it serves another version");
        let stale = record(Report::Ack, Some(GenerationId(3)), None, "v3");
        assert_eq!(view(Some(&stale)).status, "stale");
        let old_nack = record(
            Report::Nack,
            Some(GenerationId(3)),
            Some(GenerationId(4)),
            "v3",
        );
        assert_eq!(view(Some(&old_nack)).status, "stale");
        assert_eq!(view(None).status, "gone");
    }
}

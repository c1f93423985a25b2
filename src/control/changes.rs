//! [`Changes`]: the owner of what a configuration change writes and of
//! the one path every change takes. It holds the operation lock, the
//! records, the configuration file, the pending generation, the shadow
//! stage and the process-shared handles a commit swaps (generation
//! store, listeners, certificates, log level). Its operations are in the
//! files of the path they belong to: `commit.rs` (activate, commit,
//! rollback, the failures they record), `guarded.rs` (supervising and
//! settling a pending generation), `shadow.rs` (the shadow stage).
//! `Control` (`local.rs`) is built around it and offers the writer's
//! verbs.

use std::path::PathBuf;
use std::sync::Arc;

use super::error::ControlError;
use super::file::ConfigFile;
use super::lock::OperationLock;
use super::pending::{PendingSlot, PendingView};
use super::records::Records;
use super::shadowing::ShadowSlot;
use crate::config::ConfigText;
use crate::generation::SharedState;
use crate::proxy::ListenerSet;
use crate::runtime::{GenerationStore, History, PhaseCell};
use crate::telemetry::LogLevel;
use crate::tls::CertStore;

/// What the control plane is built from.
pub struct ControlParts {
    pub store: Arc<GenerationStore>,
    pub shared: Arc<SharedState>,
    pub listeners: Arc<ListenerSet>,
    pub certificates: Arc<CertStore>,
    pub history: History,
    /// The configuration file the process was started with.
    pub config_file: PathBuf,
    pub log_level: LogLevel,
    pub phase: Arc<PhaseCell>,
    /// See `Options::release_memory`.
    pub release_memory: fn(),
}

/// What configuration changes write, and the one path they take.
pub(super) struct Changes {
    pub(super) store: Arc<GenerationStore>,
    pub(super) shared: Arc<SharedState>,
    pub(super) listeners: Arc<ListenerSet>,
    pub(super) certificates: Arc<CertStore>,
    pub(super) log_level: LogLevel,
    release_memory: fn(),
    /// One mutating operation at a time, none while draining.
    pub(super) lock: OperationLock,
    /// History: retained generations, the operation log, the pending record.
    pub(super) records: Arc<Records>,
    /// The configuration file the process was started with.
    pub(super) file: ConfigFile,
    /// The generation awaiting confirmation, if any (changed only under
    /// the operation lock).
    pub(super) pending: Arc<PendingSlot>,
    /// The shadow stage running, and the report of the last one.
    pub(super) shadowing: ShadowSlot,
}

impl Changes {
    pub(super) fn new(parts: ControlParts) -> Self {
        Self {
            store: parts.store,
            shared: parts.shared,
            listeners: parts.listeners,
            certificates: parts.certificates,
            log_level: parts.log_level,
            release_memory: parts.release_memory,
            lock: OperationLock::new(parts.phase),
            records: Arc::new(Records::new(parts.history)),
            file: ConfigFile::new(parts.config_file),
            pending: Arc::default(),
            shadowing: ShadowSlot::default(),
        }
    }

    /// The change events of this process (`GET /admin/events`, webhooks).
    pub(super) fn events(&self) -> &Arc<crate::runtime::events::Events> {
        self.records.events()
    }

    /// The pending generation, if there is one.
    pub(super) fn pending_view(&self) -> Option<PendingView> {
        self.pending.view(&self.store)
    }

    /// The configuration text of the active generation, as retained.
    pub(super) fn active_config(&self) -> Option<ConfigText> {
        self.records.config_of(self.store.active_id())
    }

    /// With the active generation's `runtime.write_back`, rewrites the
    /// configuration file with its text, so that a restart without a state
    /// dir comes up on what runs. Called once a change through the API is
    /// final (not while it pends).
    pub(super) fn write_back(&self) {
        if !self.store.load_full().spec.runtime.write_back {
            return;
        }
        if let Some(text) = self.active_config() {
            self.file.write(&text);
        }
    }

    /// Runs control-plane work (parsing, hashing files, building, fsync)
    /// on the blocking pool, so that an activation never stalls a worker
    /// thread that is serving requests; then returns what its transient
    /// allocations left free to the system.
    pub(super) async fn off_the_data_plane<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Changes) -> Result<T, ControlError> + Send + 'static,
    ) -> Result<T, ControlError> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let done = work(&this);
            (this.release_memory)();
            done
        })
        .await
        .map_err(|e| ControlError::Internal(e.to_string()))?
    }
}

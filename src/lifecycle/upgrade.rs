//! Drain and drain-aware restart (binary upgrade).
//!
//! An upgrade starts this process's own executable again, hands it every
//! listening socket (listeners, admin, metrics) and the history, and waits
//! for its ready line. Only then does this process stop accepting and
//! drain. If the new process exits or is not ready in time, this one keeps
//! serving and the operation is recorded as failed. The operation lock is
//! held throughout, so activations wait for the outcome (409) instead of
//! being lost in the hand-over.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;

use super::handover::{self, HandedSocket, SocketRole, UpgradeState};
use crate::config::ConfigText;
use crate::control::{Control, LifecycleError, ProcessControl, UpgradeRequest};
use crate::runtime::{OperationKind, Outcome, Phase};
use crate::telemetry::metrics as m;

/// How long a new process may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the process is stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM or `POST /admin/lifecycle/drain`.
    Drain,
    /// A new process took over the sockets.
    HandedOver,
}

/// The lifecycle side of the control plane.
pub struct Process {
    config_path: PathBuf,
    /// Duplicates of the admin and metrics sockets, kept for hand-over.
    control_sockets: Vec<(SocketRole, SocketAddr, std::net::TcpListener)>,
    /// Where the upgrade state file is written.
    scratch_dir: PathBuf,
    stop: watch::Sender<Option<Stop>>,
}

impl Process {
    pub fn new(
        config_path: PathBuf,
        control_sockets: Vec<(SocketRole, SocketAddr, std::net::TcpListener)>,
        scratch_dir: PathBuf,
    ) -> Arc<Self> {
        Arc::new(Self {
            config_path,
            control_sockets,
            scratch_dir,
            stop: watch::channel(None).0,
        })
    }

    pub fn stopping(&self) -> watch::Receiver<Option<Stop>> {
        self.stop.subscribe()
    }

    pub fn request_stop(&self, stop: Stop) {
        request_stop(&self.stop, stop);
    }

    fn start_upgrade(
        &self,
        control: &Arc<Control>,
        request: UpgradeRequest,
    ) -> Result<(String, tokio::process::Child), LifecycleError> {
        let base_dir = self
            .config_path
            .parent()
            .map(PathBuf::from)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        let text = match &request.config {
            Some(text) => {
                let candidate = ConfigText::inline(text.clone(), base_dir, "<upgrade>");
                let plan = crate::plan::plan(&candidate, None);
                if !plan.errors.is_empty() {
                    return Err(LifecycleError::Invalid(Box::new(plan)));
                }
                candidate
            }
            None => control.active_config().ok_or_else(|| {
                LifecycleError::Failed("the active configuration is not in history".into())
            })?,
        };
        // Descriptors without close-on-exec, closed here once the child has them.
        let mut inherited = Vec::new();
        let mut sockets = Vec::new();
        for listener in control.listeners().sockets() {
            let fd = handover::inheritable(std::os::fd::AsFd::as_fd(&*listener.socket))
                .map_err(|e| LifecycleError::Failed(e.to_string()))?;
            sockets.push(HandedSocket {
                role: SocketRole::Listener,
                name: listener.name.clone(),
                bind: listener.bind,
                fd: handover::raw(&fd),
            });
            inherited.push(fd);
        }
        for (role, bind, socket) in &self.control_sockets {
            let fd = handover::inheritable(std::os::fd::AsFd::as_fd(socket))
                .map_err(|e| LifecycleError::Failed(e.to_string()))?;
            sockets.push(HandedSocket {
                role: *role,
                name: format!("{role:?}").to_ascii_lowercase(),
                bind: *bind,
                fd: handover::raw(&fd),
            });
            inherited.push(fd);
        }
        // Recorded only once nothing before the spawn can fail.
        let operation_id = control.record_started(
            OperationKind::Upgrade,
            request.requested_by.clone(),
            request.reason.clone(),
            "starting the new process".into(),
        );
        let state = UpgradeState {
            parent_pid: std::process::id(),
            operation_id: operation_id.clone(),
            sockets,
            history: control.with_history(|h| {
                // From here on the new process owns the state dir.
                h.set_handed_over(true);
                h.snapshot()
            }),
            config: text.text,
            base_dir: text.base_dir,
            origin: text.origin,
            requested_by: request.requested_by,
            reason: request.reason,
        };
        let spawned = handover::write_state(&self.scratch_dir, &state).and_then(|path| {
            let exe = std::env::current_exe()?;
            tokio::process::Command::new(exe)
                .arg("run")
                .arg("-c")
                .arg(&self.config_path)
                .env(handover::STATE_ENV, &path)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
        });
        drop(inherited);
        match spawned {
            Ok(child) => Ok((operation_id, child)),
            Err(error) => {
                let message = format!(
                    "cannot start {}: {error}",
                    std::env::current_exe()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                );
                finish_failed(control, &operation_id, &message);
                Err(LifecycleError::Failed(message))
            }
        }
    }
}

/// The first stop request wins; later ones change nothing.
fn request_stop(sender: &watch::Sender<Option<Stop>>, stop: Stop) {
    sender.send_if_modified(|current| {
        let first = current.is_none();
        if first {
            *current = Some(stop);
        }
        first
    });
}

fn finish_failed(control: &Control, operation_id: &str, message: &str) {
    tracing::error!(
        operation = operation_id,
        error = message,
        "upgrade failed; this process keeps serving"
    );
    metrics::counter!(m::UPGRADES, m::LABEL_OUTCOME => "failed").increment(1);
    control.with_history(|h| {
        h.set_handed_over(false);
        h.update_operation(operation_id, |op| {
            op.outcome = Outcome::Failed;
            op.error = Some(message.to_owned());
            op.summary = "the new process did not become ready; the old one kept serving".into();
        });
    });
}

impl ProcessControl for Process {
    fn drain(&self, control: &Arc<Control>) -> Result<String, LifecycleError> {
        if control.phase().get() != Phase::Running || self.stop.borrow().is_some() {
            return Err(LifecycleError::AlreadyDraining);
        }
        let id = control.record_started(OperationKind::Drain, None, None, "draining".into());
        control.with_history(|h| h.update_operation(&id, |op| op.outcome = Outcome::Succeeded));
        self.request_stop(Stop::Drain);
        Ok(id)
    }

    fn upgrade(
        &self,
        control: &Arc<Control>,
        request: UpgradeRequest,
    ) -> Result<String, LifecycleError> {
        if control.phase().get() != Phase::Running || self.stop.borrow().is_some() {
            return Err(LifecycleError::Draining);
        }
        let guard = control
            .try_exclusive()
            .ok_or(LifecycleError::UpgradeRunning)?;
        let (operation_id, child) = self.start_upgrade(control, request)?;
        let control = Arc::clone(control);
        let id = operation_id.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            match wait_ready(child).await {
                Ok(pid) => {
                    tracing::info!(operation = %id, new_pid = pid, "the new process is ready; draining this one");
                    metrics::counter!(m::UPGRADES, m::LABEL_OUTCOME => "succeeded").increment(1);
                    control.with_history(|h| {
                        h.update_operation(&id, |op| {
                            op.outcome = Outcome::Succeeded;
                            op.pid = pid;
                            op.previous_pid = Some(std::process::id());
                            op.summary = format!(
                                "drain-aware restart: pid {} -> pid {pid}",
                                std::process::id()
                            );
                        })
                    });
                    // Keep the operation lock for good: no change may land
                    // in this process once the new one has taken over.
                    std::mem::forget(guard);
                    request_stop(&stop, Stop::HandedOver);
                }
                Err(message) => {
                    finish_failed(&control, &id, &message);
                    drop(guard);
                }
            }
        });
        Ok(operation_id)
    }
}

/// Waits for the child's ready line; kills it on timeout.
async fn wait_ready(mut child: tokio::process::Child) -> Result<u32, String> {
    let Some(stdout) = child.stdout.take() else {
        return Err("no pipe to the new process".into());
    };
    let mut lines = BufReader::new(stdout).lines();
    let ready = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
                if value["event"] == "ready" {
                    return value["pid"].as_u64().and_then(|p| u32::try_from(p).ok());
                }
            }
        }
        None
    };
    let outcome = tokio::select! {
        ready = tokio::time::timeout(READY_TIMEOUT, ready) => match ready {
            Ok(Some(pid)) => Ok(pid),
            Ok(None) => Err("the new process closed its output before it was ready".to_owned()),
            Err(_) => Err(format!("the new process was not ready within {READY_TIMEOUT:?}")),
        },
        status = child.wait() => Err(match status {
            Ok(status) => format!("the new process exited during start-up ({status})"),
            Err(error) => format!("cannot wait for the new process: {error}"),
        }),
    };
    if outcome.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    outcome
}

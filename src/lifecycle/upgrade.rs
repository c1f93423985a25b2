//! Drain and drain-aware restart (binary upgrade).
//!
//! An upgrade starts the executable at the path this process was started
//! from (resolved at start-up, so a package manager that replaced the file
//! gets its new code run; `/proc/self/exe` would name the deleted old
//! one), or another one the request names, hands it every
//! listening socket (listeners, admin, metrics) and the history, and waits
//! for its ready line. Only then does this process stop accepting and
//! drain. If the new process exits or is not ready in time, this one keeps
//! serving and the operation is recorded as failed. The operation lock is
//! held throughout, so activations wait for the outcome (409) instead of
//! being lost in the hand-over.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;

use super::control_server::Served;
use super::handover::{self, HandedSocket, HandedUdpGroup, SocketRole, UpgradeState};
use super::stop::Stop;
use crate::config::ConfigText;
use crate::control::{Control, LifecycleError, ProcessControl, Requester, UpgradeRequest};
use crate::runtime::{OperationKind, Outcome, Phase};
use crate::telemetry::metrics as m;

/// How long a new process may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the admin and metrics accept loops may take to stop once the
/// new process is ready.
const ACCEPT_STOP: Duration = Duration::from_secs(1);

/// The executable this process was started from.
#[derive(Debug)]
pub struct Binary {
    /// Resolved at start-up; `None` when the system would not say.
    path: Option<PathBuf>,
    /// `sha256:<hex>` of the running image, hashed from start-up on a
    /// thread of its own (never a serving thread); readiness waits for it,
    /// so status shows it from its first answer.
    sha256: Arc<std::sync::OnceLock<String>>,
    hasher: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Binary {
    /// The running executable's path, as the system gives it now, and its
    /// hash begun: call once, first thing at start-up.
    pub fn resolve() -> Self {
        let path = std::env::current_exe()
            .inspect_err(|error| tracing::warn!(%error, "cannot resolve this executable's path; upgrades will need --binary"))
            .ok();
        let sha256 = Arc::new(std::sync::OnceLock::new());
        let slot = Arc::clone(&sha256);
        // /proc/self/exe is the image this process runs, whatever happens
        // to the file at `path` later.
        let hasher = std::thread::Builder::new()
            .name("cutover-hash".into())
            .spawn(
                move || match hash_file(std::path::Path::new("/proc/self/exe")) {
                    Ok(digest) => {
                        let _ = slot.set(digest);
                    }
                    Err(error) => tracing::warn!(%error, "cannot hash the running executable"),
                },
            )
            .inspect_err(
                |error| tracing::warn!(%error, "cannot start hashing the running executable"),
            )
            .ok();
        Self {
            path,
            sha256,
            hasher: std::sync::Mutex::new(hasher),
        }
    }

    /// Resolves once the hash is known (or could not be had), waiting off
    /// the runtime's threads. Borrows nothing: take it before the binary
    /// moves, await it before announcing readiness.
    pub fn hashed(&self) -> impl std::future::Future<Output = ()> + use<> {
        let hasher = self
            .hasher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        async move {
            if let Some(hasher) = hasher {
                let _ = tokio::task::spawn_blocking(move || hasher.join()).await;
            }
        }
    }

    fn view(&self) -> Option<crate::control::BinaryView> {
        Some(crate::control::BinaryView {
            path: self.path.clone()?,
            sha256: self.sha256.get().cloned(),
        })
    }
}

fn hash_file(path: &std::path::Path) -> std::io::Result<String> {
    use sha2::Digest;
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(..n).unwrap_or(&[]));
    }
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

/// The executable an upgrade starts: the one named, which must be an
/// absolute path to an executable regular file, or this process's own.
fn upgrade_binary(
    named: Option<PathBuf>,
    own: Option<&PathBuf>,
) -> Result<PathBuf, LifecycleError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = named.or_else(|| own.cloned()) else {
        return Err(LifecycleError::Binary(
            "this process's executable path is unknown; name one with binary".into(),
        ));
    };
    if !path.is_absolute() {
        return Err(LifecycleError::Binary(format!(
            "binary {} is not an absolute path",
            path.display()
        )));
    }
    let metadata = std::fs::metadata(&path)
        .map_err(|error| LifecycleError::Binary(format!("binary {}: {error}", path.display())))?;
    if !metadata.is_file() || metadata.permissions().mode() & 0o111 == 0 {
        return Err(LifecycleError::Binary(format!(
            "binary {} is not an executable file",
            path.display()
        )));
    }
    Ok(path)
}

/// The lifecycle side of the control plane.
pub struct Process {
    config_path: PathBuf,
    /// Started with `--watch`: so is the new process.
    watch: bool,
    /// Started with `--gateway-api DIR`: so is the new process.
    gateway_api: Option<crate::gatewayapi::Source>,
    binary: Arc<Binary>,
    /// Duplicates of the admin and metrics sockets, kept for hand-over.
    control_sockets: Vec<(SocketRole, SocketAddr, std::net::TcpListener)>,
    /// Where the upgrade state file is written.
    scratch_dir: PathBuf,
    stop: watch::Sender<Option<Stop>>,
    /// The admin and metrics servers: a hand-over waits for their accept
    /// loops to stop, and the exit after it for their connections.
    served: Served,
}

impl Process {
    pub fn new(
        config_path: PathBuf,
        watch: bool,
        gateway_api: Option<crate::gatewayapi::Source>,
        binary: Binary,
        control_sockets: Vec<(SocketRole, SocketAddr, std::net::TcpListener)>,
        scratch_dir: PathBuf,
    ) -> Arc<Self> {
        Arc::new(Self {
            config_path,
            watch,
            gateway_api,
            binary: Arc::new(binary),
            control_sockets,
            scratch_dir,
            stop: watch::channel(None).0,
            served: Served::default(),
        })
    }

    pub fn served(&self) -> &Served {
        &self.served
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
    ) -> Result<(String, tokio::process::Child, OwnedFd), LifecycleError> {
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
        let exe = upgrade_binary(request.binary.clone(), self.binary.path.as_ref())?;
        // Descriptors without close-on-exec, closed here once the child has them.
        let mut inherited = Vec::new();
        let mut sockets = Vec::new();
        for listener in control.listeners().sockets() {
            let fd = handover::inheritable(std::os::fd::AsFd::as_fd(&listener.socket))
                .map_err(|e| LifecycleError::Failed(e.to_string()))?;
            sockets.push(HandedSocket {
                role: SocketRole::Listener,
                name: listener.name.clone(),
                bind: listener.bind,
                fd: handover::raw(&fd),
            });
            inherited.push(fd);
        }
        let mut quic = Vec::new();
        let groups = control
            .listeners()
            .hand_over_quic()
            .map_err(|e| LifecycleError::Failed(format!("cannot hand over a UDP group: {e}")))?;
        for handed in groups {
            let mut pass = |fds: &[OwnedFd]| -> Result<Vec<_>, LifecycleError> {
                fds.iter()
                    .map(|fd| {
                        let fd = handover::inheritable(std::os::fd::AsFd::as_fd(fd))
                            .map_err(|e| LifecycleError::Failed(e.to_string()))?;
                        let raw = handover::raw(&fd);
                        inherited.push(fd);
                        Ok(raw)
                    })
                    .collect()
            };
            quic.push(HandedUdpGroup {
                name: handed.name,
                address: handed.address,
                tag: handed.group.tag.value(),
                sockets: pass(&handed.group.sockets)?,
                relays: pass(&handed.group.relays)?,
            });
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
        // The new process accepts on the admin and metrics sockets only
        // once this one has stopped: it closes `stopped` then (or exits).
        let (gate, stopped) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| LifecycleError::Failed(format!("cannot make a pipe: {e}")))?;
        let gate = handover::inheritable(std::os::fd::AsFd::as_fd(&gate))
            .map_err(|e| LifecycleError::Failed(e.to_string()))?;
        let accept_after = Some(handover::raw(&gate));
        inherited.push(gate);
        // Recorded only once nothing before the spawn can fail.
        let operation_id = control.record_started(
            OperationKind::Upgrade,
            Requester {
                requested_by: request.requested_by.clone(),
                reason: request.reason.clone(),
                caller: request.caller.clone(),
                overrode_freeze: request.overrode_freeze.clone(),
                approved_by: request.approved_by.clone(),
            },
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
            caller: request.caller,
            accept_after,
            quic,
        };
        let spawned = handover::write_state(&self.scratch_dir, &state).and_then(|path| {
            tracing::info!(binary = %exe.display(), operation = %operation_id, "starting the new process");
            tokio::process::Command::new(&exe)
                .arg("run")
                .arg("-c")
                .arg(&self.config_path)
                .args(self.watch.then_some("--watch"))
                .args(self.gateway_api.iter().flat_map(|source| {
                    let mut args = vec![
                        std::ffi::OsString::from("--gateway-api"),
                        source.dir.clone().into_os_string(),
                        std::ffi::OsString::from("--gateway-api-address"),
                        std::ffi::OsString::from(&source.address),
                    ];
                    for (gateway, address) in &source.gateway_addresses {
                        args.push(format!("--gateway-address={gateway}={address}").into());
                    }
                    for service in &source.cluster_services {
                        args.push(format!("--cluster-service={service}").into());
                    }
                    args
                }))
                .env(handover::STATE_ENV, &path)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
        });
        drop(inherited);
        match spawned {
            Ok(child) => Ok((operation_id, child, stopped)),
            Err(error) => {
                let message = format!("cannot start {}: {error}", exe.display());
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
    fn binary(&self) -> Option<crate::control::BinaryView> {
        self.binary.view()
    }

    fn drain(
        &self,
        control: &Arc<Control>,
        requester: Requester,
    ) -> Result<String, LifecycleError> {
        // The phase is draining already (`Control::drain`); a stop asked
        // for before (a signal, an upgrade's end) is the drain under way.
        if self.stop.borrow().is_some() {
            return Err(LifecycleError::AlreadyDraining);
        }
        let id = control.record_started(OperationKind::Drain, requester, "draining".into());
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
        let (operation_id, child, stopped) = self.start_upgrade(control, request)?;
        let control = Arc::clone(control);
        let id = operation_id.clone();
        let stop = self.stop.clone();
        let accepting = self.served.accepting.clone();
        tokio::spawn(async move {
            match wait_ready(child).await {
                Ok((pid, generation)) => {
                    tracing::info!(operation = %id, new_pid = pid, "the new process is ready; draining this one");
                    metrics::counter!(m::UPGRADES, m::LABEL_OUTCOME => "succeeded").increment(1);
                    // Not one more admin connection here (control_server.rs):
                    // the accept loops stop before anyone can read of the
                    // success, so a client that has cannot reach this
                    // process on a new connection.
                    request_stop(&stop, Stop::HandedOver);
                    if tokio::time::timeout(ACCEPT_STOP, accepting.none())
                        .await
                        .is_err()
                    {
                        tracing::warn!(operation = %id, "the admin accept loops did not stop in time");
                    }
                    // Connections this process accepted are still answered
                    // (a poll of this operation among them): its record
                    // says what the new process's says.
                    control.with_history(|h| {
                        h.update_operation(&id, |op| {
                            op.outcome = Outcome::Succeeded;
                            op.generation = generation.or(op.generation);
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
                    // The new process accepts from now on.
                    drop(stopped);
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

/// Waits for the child's ready line; kills it on timeout. Returns the new
/// process's pid and the generation it started with.
async fn wait_ready(
    mut child: tokio::process::Child,
) -> Result<(u32, Option<crate::ids::GenerationId>), String> {
    let Some(stdout) = child.stdout.take() else {
        return Err("no pipe to the new process".into());
    };
    let mut lines = BufReader::new(stdout).lines();
    let ready = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
                if value["event"] == "ready" {
                    let pid = value["pid"].as_u64().and_then(|p| u32::try_from(p).ok())?;
                    let generation = value["generation"].as_u64().map(crate::ids::GenerationId);
                    return Some((pid, generation));
                }
            }
        }
        None
    };
    let outcome = tokio::select! {
        ready = tokio::time::timeout(READY_TIMEOUT, ready) => match ready {
            Ok(Some(ready)) => Ok(ready),
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

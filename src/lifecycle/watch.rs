//! `cutover run -c FILE --watch`: the configuration file, and every file
//! it references, activated when they change (DESIGN §15's file-watch
//! trigger, for single instances and Kubernetes ConfigMaps).
//!
//! What is watched is the folders, not the files: an editor's atomic
//! rename and a ConfigMap's `..data` symlink swap replace the file, and a
//! watch on the old one would see nothing after. A burst of events (a
//! rename is several) is one change once the folder has been quiet for
//! `QUIET`. Then the file is planned as `validate` plans it:
//!
//! - the same `config_version` as the active generation: nothing to do
//!   (something else in the folder changed);
//! - the same text, other referenced bytes (a rotated certificate):
//!   `reload-certs`;
//! - anything else, invalid included: activation through the normal path
//!   (`OperationKind::Reload`, `requested_by = "watch"`), so a refused
//!   write is recorded in history and leaves the active generation alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::control::{Candidate, Control, ControlError};
use crate::runtime::OperationKind;

/// A change is acted on once its folder has been quiet this long.
const QUIET: Duration = Duration::from_millis(300);
/// ... or this long after its first event, however busy the folder is.
const MOST: Duration = Duration::from_secs(3);

/// Who activations triggered by the watch are recorded as.
pub const REQUESTED_BY: &str = "watch";

/// Starts watching `config` and the files the active generation
/// references; runs as long as the process.
pub fn spawn(control: Arc<Control>, config: PathBuf) -> Result<(), notify::Error> {
    let (mut watcher, mut changed) = watcher()?;
    let mut watched = BTreeSet::new();
    rewatch(&mut watcher, &mut watched, &folders(&control, &config))?;
    tokio::spawn(async move {
        while changed.recv().await.is_some() {
            settle(&mut changed).await;
            act(&control).await;
            // What the file references may have changed with it.
            if let Err(error) = rewatch(&mut watcher, &mut watched, &folders(&control, &config)) {
                tracing::warn!(%error, "watch: cannot watch the folders the configuration references");
            }
        }
    });
    Ok(())
}

/// A watcher that says on the channel when what it watches changed.
fn watcher() -> Result<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>), notify::Error> {
    let (events, changed) = mpsc::unbounded_channel::<()>();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads and opens are not changes.
        let relevant = event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_)));
        if relevant {
            let _ = events.send(());
        }
    })?;
    Ok((watcher, changed))
}

/// Waits until no event came for `QUIET` (at most `MOST`).
async fn settle(changed: &mut mpsc::UnboundedReceiver<()>) {
    let deadline = tokio::time::Instant::now() + MOST;
    loop {
        let quiet = tokio::time::sleep(QUIET);
        tokio::select! {
            _ = quiet => return,
            _ = tokio::time::sleep_until(deadline) => return,
            more = changed.recv() => if more.is_none() { return },
        }
    }
}

/// The folders of the configuration file and of every file the active
/// generation references.
fn folders(control: &Control, config: &Path) -> BTreeSet<PathBuf> {
    let active = control.store().load_full();
    std::iter::once(config)
        .chain(active.spec.referenced_files.iter().map(PathBuf::as_path))
        .filter_map(|file| {
            let absolute = std::path::absolute(file).ok()?;
            absolute.parent().map(Path::to_path_buf)
        })
        .collect()
}

/// Watches exactly `wanted`.
fn rewatch(
    watcher: &mut notify::RecommendedWatcher,
    watched: &mut BTreeSet<PathBuf>,
    wanted: &BTreeSet<PathBuf>,
) -> Result<(), notify::Error> {
    for gone in watched.difference(wanted) {
        let _ = watcher.unwatch(gone);
    }
    for new in wanted.difference(watched) {
        watcher.watch(new, RecursiveMode::NonRecursive)?;
    }
    *watched = wanted.clone();
    Ok(())
}

/// Plans the file and applies what changed (see the module's comment).
async fn act(control: &Arc<Control>) {
    let planned = control.validate(Candidate::config_file()).await;
    let active = control.store().load_full();
    let unchanged = planned
        .as_ref()
        .is_ok_and(|plan| plan.is_unchanged(Some(&active.spec)));
    if unchanged {
        return;
    }
    let same_text = planned.is_ok()
        && control
            .active_config()
            .zip(crate::config::ConfigText::read(control.config_file()).ok())
            .is_some_and(|(active, file)| active.text == file.text);
    crate::admission::release(active);
    if same_text {
        match control
            .reload_certs(None, Some(REQUESTED_BY.to_owned()), None)
            .await
        {
            Ok(reload) => {
                tracing::info!(operation = %reload.operation_id, "watch: referenced files changed; certificates reloaded")
            }
            Err(error) => {
                tracing::error!(%error, "watch: certificate reload refused; the previous certificates stay")
            }
        }
        return;
    }
    // Another operation may hold the lock for a moment: tried again
    // while it does (about 15 s at most; an upgrade ends in draining).
    for _ in 0..50 {
        let mut candidate = Candidate::config_file();
        candidate.requested_by = Some(REQUESTED_BY.to_owned());
        candidate.reason = Some(format!("{} changed", control.config_file().display()));
        match control.activate(candidate, OperationKind::Reload).await {
            Ok(activation) => {
                tracing::info!(
                    outcome = %activation.outcome,
                    generation = %activation.generation,
                    "watch: configuration file activated"
                );
                return;
            }
            Err(ControlError::InProgress) => tokio::time::sleep(QUIET).await,
            Err(error) => {
                tracing::error!(%error, "watch: configuration file refused; the active generation is unchanged");
                return;
            }
        }
    }
    tracing::error!("watch: another operation held the lock for 15 s; the change is not applied (touch the file to try again)");
}

/// `--gateway-api DIR --watch`: DIR's resources imported again when the
/// folder changes; a changed result is written to the configuration file,
/// which the file watch then activates like any other write (planning,
/// impact, guards, history). An import that fails (a YAML error, a
/// folder gone) is logged and changes nothing.
pub fn spawn_gateway_api(
    source: crate::gatewayapi::Source,
    config: PathBuf,
) -> Result<(), notify::Error> {
    let (mut watcher, mut changed) = watcher()?;
    watcher.watch(&source.dir, RecursiveMode::NonRecursive)?;
    tokio::spawn(async move {
        // The watcher lives as long as this task.
        let _watcher = watcher;
        while changed.recv().await.is_some() {
            settle(&mut changed).await;
            let (source, config) = (source.clone(), config.clone());
            let imported = tokio::task::spawn_blocking(move || {
                crate::gatewayapi::compose_into(&source, &config)
            })
            .await;
            match imported {
                Ok(Ok(Some(imported))) => report_import(&imported),
                Ok(Ok(None)) => {}
                Ok(Err(error)) => {
                    tracing::error!(%error, "watch: the Gateway API resources cannot be imported; the active generation is unchanged")
                }
                Err(error) => tracing::error!(%error, "watch: the import stopped"),
            }
        }
    });
    Ok(())
}

/// Logs what an import made, and every condition that is not true.
pub fn report_import(imported: &crate::gatewayapi::Imported) {
    let c = imported.counts;
    tracing::info!(
        gateways = c.gateways,
        routes = c.routes,
        cutover_routes = c.cutover_routes,
        upstreams = c.upstreams,
        "Gateway API resources imported"
    );
    for ignored in &imported.ignored {
        tracing::warn!(resource = %ignored, "a Gateway API kind cutover does not read: not imported");
    }
    for route in &imported.routes {
        for parent in &route.parents {
            for condition in parent.conditions.iter().filter(|c| !c.status) {
                tracing::warn!(
                    kind = %route.kind,
                    route = %format!("{}/{}", route.namespace, route.name),
                    condition = condition.kind,
                    reason = %condition.reason,
                    message = %condition.message,
                    "Gateway API route condition"
                );
            }
        }
    }
    for gateway in &imported.gateways {
        for listener in &gateway.listeners {
            for condition in listener.conditions.iter().filter(|c| !c.status) {
                tracing::warn!(
                    gateway = %format!("{}/{}", gateway.namespace, gateway.name),
                    listener = %listener.name,
                    condition = condition.kind,
                    reason = %condition.reason,
                    message = %condition.message,
                    "Gateway API listener condition"
                );
            }
        }
    }
}

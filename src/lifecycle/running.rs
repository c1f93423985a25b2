//! The running process: the signals it serves (SIGHUP reload, SIGUSR1
//! log reopening, SIGUSR2 upgrade, SIGTERM drain, SIGINT stop), the
//! drain that ends it, and the gauges refreshed once a second.

use std::sync::Arc;

use tokio::signal::unix::{signal, Signal, SignalKind};

use super::stop::Stop;
use super::upgrade::Process;
use crate::control::{Candidate, Control, UpgradeRequest};
use crate::runtime::{GenerationLoad, Phase};
use crate::telemetry;
use crate::writer::Writer;

/// Once a second: the gauges, the console's timeline, the memory policy.
pub(super) async fn refresh_gauges(control: Arc<Control>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        publish_gauges(&control);
        control.sample_timeline();
        let huge_pages = control.store().load_full().spec.runtime.huge_pages;
        super::memory::note_load(crate::generation::answered_totals().0, huge_pages);
    }
}

/// Pushes the phase and the work pinned to each live generation to the
/// gauges telemetry keeps.
fn publish_gauges(control: &Control) {
    let loads: Vec<_> = control
        .store()
        .loads()
        .iter()
        .map(GenerationLoad::pinned)
        .collect();
    telemetry::refresh_gauges(control.phase().get().as_gauge(), &loads);
}

/// The signals the process reacts to. Installed before anything is
/// announced ready: a SIGHUP that arrived before its handler would
/// otherwise take the default action and kill the process.
pub(super) struct Signals {
    hangup: Signal,
    terminate: Signal,
    interrupt: Signal,
    user1: Signal,
    user2: Signal,
}

impl Signals {
    pub(super) fn install() -> std::io::Result<Self> {
        let install = signal;
        Ok(Self {
            hangup: install(SignalKind::hangup())?,
            terminate: install(SignalKind::terminate())?,
            interrupt: install(SignalKind::interrupt())?,
            user1: install(SignalKind::user_defined1())?,
            user2: install(SignalKind::user_defined2())?,
        })
    }
}

/// Serves the signals until the process is to stop, then drains it.
pub(super) async fn signal_loop(
    writer: Writer,
    process: Arc<Process>,
    signals: Signals,
    mut stopping: tokio::sync::watch::Receiver<Option<Stop>>,
) {
    let control = Arc::clone(writer.control());
    let Signals {
        mut hangup,
        mut terminate,
        mut interrupt,
        mut user1,
        mut user2,
    } = signals;
    let stop = loop {
        tokio::select! {
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading the configuration file");
                match writer.reload(Candidate::config_file()).await {
                    Ok(activation) => tracing::info!(outcome = %activation.outcome, generation = %activation.generation, "reload finished"),
                    Err(error) => log_refusal(&error),
                }
            }
            _ = user1.recv() => {
                tracing::info!("SIGUSR1: reopening the log files");
                telemetry::reopen_logs();
            }
            _ = user2.recv() => {
                tracing::info!("SIGUSR2: drain-aware restart");
                match control.upgrade(UpgradeRequest { requested_by: Some("SIGUSR2".into()), ..UpgradeRequest::default() }) {
                    Ok(operation) => tracing::info!(%operation, "upgrade started"),
                    Err(error) => tracing::error!(%error, "upgrade refused"),
                }
            }
            _ = terminate.recv() => {
                tracing::info!("SIGTERM: draining");
                process.request_stop(Stop::Drain);
            }
            _ = interrupt.recv() => {
                tracing::info!("SIGINT: stopping now");
                control.phase().advance(Phase::Stopped);
                return;
            }
            // `wait_for` also sees a stop requested before this loop
            // first ran (`changed` would wait for the next one).
            requested = stopping.wait_for(Option::is_some) => {
                break requested.ok().and_then(|stop| *stop).unwrap_or(Stop::Drain);
            }
        }
    };
    tokio::select! {
        _ = drain(&writer, &process, stop) => {}
        _ = interrupt.recv() => tracing::info!("SIGINT: stopping now"),
    }
    control.phase().advance(Phase::Stopped);
}

fn log_refusal(error: &crate::control::ControlError) {
    use crate::control::ControlError;
    match error {
        ControlError::Invalid(plan) | ControlError::RestartRequired(plan) => {
            for d in &plan.errors {
                tracing::error!(code = d.code.as_str(), line = d.line, column = d.column, path = %d.path, "{}", d.message);
            }
            for r in &plan.rejected {
                tracing::error!(path = %r.path, reason = %r.reason, "{}", r.action);
            }
            tracing::error!("reload refused; the active generation is unchanged");
        }
        other => {
            tracing::error!(error = %other, "reload refused; the active generation is unchanged")
        }
    }
}

/// Stops accepting, lets in-flight work finish until `drain_timeout`,
/// then returns so the process exits.
async fn drain(writer: &Writer, process: &Process, stop: Stop) {
    let control = writer.control();
    control.phase().advance(Phase::Draining);
    publish_gauges(control);
    let timeout = control.store().load_full().spec.runtime.drain_timeout;
    control.listeners().drain();
    // Out of the fleet at once (bounded, as etcd may be away).
    writer.leave().await;
    // Fleet quotas' unspent leases go back to the store: the instances
    // that stay get them now, not when the leases would have run out.
    let generation = control.store().load_full();
    let given = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        generation.give_back_leases(),
    )
    .await;
    if let Ok(tokens @ 1..) = given {
        tracing::info!(tokens, "gave unspent fleet-quota tokens back to the store");
    }
    drop(generation);
    tracing::info!(
        ?stop,
        ?timeout,
        "draining: listeners closed, waiting for connections to finish"
    );
    let started = std::time::Instant::now();
    let left = control.listeners().wait_closed(timeout).await;
    if left > 0 {
        tracing::warn!(
            connections = left,
            ?timeout,
            "drain timeout reached; closing the remaining connections"
        );
        // Tunnels and L4 relays end as their protocol allows (a
        // WebSocket's closing handshake), each with its access-log line.
        let grace = crate::proxy::TUNNEL_CLOSE_GRACE + std::time::Duration::from_millis(500);
        let still = control.listeners().cut(grace).await;
        if still > 0 {
            tracing::warn!(
                connections = still,
                "closing connections that did not finish at the drain deadline"
            );
        }
    } else {
        tracing::info!("drained");
    }
    // Event streams end here (their readers resume on the new process,
    // or learn that this one is gone).
    control.events().close();
    // Handed over: the admin and metrics connections this process
    // accepted are answered before it exits (control_server.rs), within
    // what is left of the drain timeout.
    if stop == Stop::HandedOver {
        let left = timeout.saturating_sub(started.elapsed());
        if tokio::time::timeout(left, process.served().open.none())
            .await
            .is_err()
        {
            tracing::warn!("drain timeout reached with admin connections open");
        }
    }
}
